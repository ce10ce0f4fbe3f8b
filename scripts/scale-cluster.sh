#!/usr/bin/env bash
# How far one gateway carries: etcd, one gateway and PREFILL x DECODE worker processes (found
# through etcd) on this machine, streaming load through `pagewarden bench serve`, then from
# the gateway's own counters and its CPU time:
#   * routing balance: routes per worker of each role (min / max / coefficient of variation);
#   * gateway CPU per request (user + system time of the gateway process over the load);
#   * control messages per second and per request (both directions, every worker link);
#   * an estimate of the requests per second and workers one gateway core can carry.
# Workers run one thread each with a small context window and pool, so that many fit here;
# the model is the default one (its tokenizer is what the gateway needs).
#
#   scripts/scale-cluster.sh [PREFILL] [DECODE] [REQUESTS_PER_CLIENT] [CONCURRENCY] [MAX_TOKENS]
#   e.g. scripts/scale-cluster.sh 8 8 8 64 8
#   env: PW=path/to/pagewarden (default: a release build)
set -euo pipefail
cd "$(dirname "$0")/.."
np=${1:-8}
nd=${2:-8}
per_client=${3:-8}
conc=${4:-64}
max_tokens=${5:-8}
command -v etcd >/dev/null || { echo "needs etcd (Debian: apt-get install etcd-server)"; exit 2; }
if [ -z "${PW:-}" ]; then
  cargo build -q --release -p pagewarden
  PW=target/release/pagewarden
fi
pw=$(realpath "$PW")
"$pw" fetch-model >/dev/null
work=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$work"' EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
ep=127.0.0.1:$(free_port)
etcd --data-dir "$work/etcd" --listen-client-urls "http://$ep" --advertise-client-urls "http://$ep" \
  --listen-peer-urls "http://127.0.0.1:$(free_port)" >"$work/etcd.log" 2>&1 &
key=$("$pw" tenant add bench --config "$work/pw.toml" | head -1)
printf 'max_concurrent = 512\nmax_queued = 1024\n' >>"$work/pw.toml"
(umask 077; head -c 48 /dev/urandom | base64 >"$work/secret"; head -c 48 /dev/urandom | base64 >"$work/token")
# Each node its own key, all pinned.
trusted=""
for n in gateway $(seq -f 'prefill-%g' 1 "$np") $(seq -f 'decode-%g' 1 "$nd"); do
  trusted="$trusted\"$n:$("$pw" node keygen --out "$work/$n.key")\", "
done
{ printf 'threads = 1\ncontext_window = 1024\n'
  cat "$work/pw.toml"
  printf '[pool]\ntokens = 2048\n[engine]\nmax_running = 64\n[cluster]\nsecret_file = "%s"\ntrusted_nodes = [%s]\n' "$work/secret" "${trusted%, }"
  printf '[metrics]\ntoken_file = "%s"\n[membership]\netcd = ["%s"]\nprefix = "/pagewarden/scale"\n' "$work/token" "$ep"
} >"$work/cluster.toml"
gw_port=$(free_port)
"$pw" gateway --config "$work/cluster.toml" --node-key "$work/gateway.key" --listen "127.0.0.1:$gw_port" --cluster-listen 127.0.0.1:0 >"$work/gw.log" 2>&1 &
gw_pid=$!
for i in $(seq 1 "$np"); do "$pw" prefill --config "$work/cluster.toml" --node-key "$work/prefill-$i.key" --name "prefill-$i" >"$work/p$i.log" 2>&1 & done
for i in $(seq 1 "$nd"); do "$pw" decode --config "$work/cluster.toml" --node-key "$work/decode-$i.key" --name "decode-$i" >"$work/d$i.log" 2>&1 & done
url=http://127.0.0.1:$gw_port
scrape() { curl -sf -H "Authorization: Bearer $(cat "$work/token")" "$url/metrics"; }
for _ in $(seq 1200); do
  n=$(scrape 2>/dev/null | awk '/^pagewarden_cluster_workers\{/ {s += $2} END {print s + 0}' || true)
  [ "$n" = $((np + nd)) ] && break
  sleep 0.25
done
[ "$n" = $((np + nd)) ] || { echo "only $n of $((np + nd)) workers registered"; tail -n 3 "$work"/*.log; exit 1; }
echo "== ${np} prefill x ${nd} decode workers registered through etcd; load: ${conc} clients x ${per_client} requests, max_tokens ${max_tokens}"
cpu() { awk '{print $14 + $15}' "/proc/$gw_pid/stat"; }
scrape >"$work/before.txt"
c0=$(cpu)
t0=$(date +%s.%N)
"$pw" bench serve --url "$url" --key "$key" --concurrency "$conc" --requests "$per_client" --max-tokens "$max_tokens"
t1=$(date +%s.%N)
c1=$(cpu)
scrape >"$work/after.txt"
python3 - "$work/before.txt" "$work/after.txt" "$c0" "$c1" "$t0" "$t1" "$(getconf CLK_TCK)" "$((conc * per_client))" <<'PY'
import re, statistics, sys
before, after, c0, c1, t0, t1, tck, requests = sys.argv[1:]
def parse(path):
    out = {}
    for line in open(path):
        m = re.match(r'(pagewarden_worker_(routes|control_messages)_total)\{([^}]*)\} (\S+)', line)
        if m:
            labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(3)))
            out[(m.group(1), labels.get("worker"), labels.get("role"), labels.get("direction"))] = float(m.group(4))
    return out
b, a = parse(before), parse(after)
delta = {k: v - b.get(k, 0.0) for k, v in a.items()}
wall = float(t1) - float(t0)
cpu_s = (int(c1) - int(c0)) / int(tck)
requests = int(requests)
for role in ("prefill", "decode"):
    routes = [v for (n, w, r, d), v in delta.items() if n.endswith("routes_total") and r == role]
    if routes:
        mean = statistics.mean(routes)
        cv = statistics.pstdev(routes) / mean if mean else 0.0
        print(f"routing balance, {role}: {len(routes)} workers, routes per worker min {min(routes):.0f} max {max(routes):.0f} mean {mean:.1f}, coefficient of variation {cv:.3f}")
msgs = sum(v for (n, w, r, d), v in delta.items() if n.endswith("control_messages_total"))
to_w = sum(v for (n, w, r, d), v in delta.items() if n.endswith("control_messages_total") and d == "to_worker")
print(f"control messages: {msgs:.0f} in {wall:.1f} s = {msgs / wall:.0f}/s ({to_w:.0f} to workers), {msgs / requests:.1f} per request")
print(f"gateway CPU: {cpu_s:.2f} s for {requests} requests = {cpu_s / requests * 1000:.2f} ms per request ({cpu_s / wall * 100:.0f}% of one core at {requests / wall:.1f} requests/s)")
if cpu_s > 0:
    print(f"estimate: one gateway core carries about {requests / cpu_s:.0f} requests/s of this shape; each worker adds 4 stats messages/s per gateway")
PY
