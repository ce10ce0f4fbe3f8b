#!/usr/bin/env bash
# A cluster whose nodes are separate network hosts: etcd, two gateways, prefill and decode
# workers, each in its own network namespace with its own address, joined by veth pairs to a
# bridge, so every control, KV and etcd link crosses a real network interface. `tc netem`
# adds delay and loss on every node's interface; on a kernel without netem, scripts/wire.py
# joins TUN interfaces instead and delays and drops packets itself (WIRE=tun forces it).
# Then, from the host:
#   1. `pagewarden bench serve` through the first gateway: tok/s, time to first token, ITL;
#   2. `pagewarden audit` through the first gateway (its /metrics and every worker's checked),
#      which must pass;
#   3. the same bench through the second gateway;
# after each, the KV transfers the decode workers completed and their mean time.
# CHURN=1: members come and go during the audit (two workers join, a decode worker drains on
# SIGTERM and returns, etcd and a prefill worker are killed -9 and restarted, the second
# gateway is killed -9 under its own load); the audit must still pass and every surviving
# worker's pages return to zero. Exits non-zero when either fails.
# Run as root (namespaces, veth or TUN, netem); everything is removed on exit.
#
#   scripts/netns-cluster.sh [DELAY_MS] [LOSS] [AUDIT_REQUESTS] [BENCH_REQUESTS_PER_CLIENT]
#   e.g. scripts/netns-cluster.sh 0.5 1% 200 4     (0.5 ms each way: 1 ms RTT between nodes)
#   env: PW=path/to/pagewarden (default: a release build), PREFILL=1 DECODE=1 CONCURRENCY=1,4,16,
#        WIRE=tun (the userspace wire even where netem exists), REPORT=DIR (keep the audit report),
#        CHURN=1 (see above)
set -euo pipefail
cd "$(dirname "$0")/.."
delay=${1:-0.5}
loss=${2:-1%}
audit_requests=${3:-200}
bench_requests=${4:-4}
prefill=${PREFILL:-1}
decode=${DECODE:-1}
conc=${CONCURRENCY:-1,4,16}
[ "$(id -u)" = 0 ] || { echo "run as root (network namespaces)"; exit 2; }
command -v etcd >/dev/null || apt-get install -y -qq etcd-server >/dev/null
if [ -z "${PW:-}" ]; then
  cargo build -q --release -p pagewarden
  PW=target/release/pagewarden
fi
pw=$(realpath "$PW")
"$pw" fetch-model >/dev/null

work=$(mktemp -d)
tag=pw$$
bridge=${tag}br
nodes=()
wire_pid=
cleanup() {
  for ns in "${nodes[@]}"; do
    ip netns pids "$ns" 2>/dev/null | xargs -r kill -9 2>/dev/null || true
    ip netns del "$ns" 2>/dev/null || true
  done
  ip link del "$bridge" 2>/dev/null || true
  if [ -n "$wire_pid" ]; then
    kill "$wire_pid" 2>/dev/null && wait "$wire_pid" 2>/dev/null
    tail -n 1 "$work/wire.log"
    ip link del "${tag}t${#nodes[@]}" 2>/dev/null || true
  fi
  rm -rf "$work"
}
trap cleanup EXIT

# Delay and loss: the kernel's netem qdisc on each node's veth when it has one (sch_netem);
# otherwise scripts/wire.py, a userspace wire between TUN interfaces that delays and drops
# packets the same way (per packet, per direction). WIRE=tun forces the latter.
wire=${WIRE:-}
if [ -z "$wire" ]; then
  if [ "$delay" = 0 ] && { [ "$loss" = 0 ] || [ "$loss" = 0% ]; }; then
    wire=veth
  elif tc qdisc add dev lo root netem delay 0ms 2>/dev/null; then
    tc qdisc del dev lo root
    wire=netem
  else
    wire=tun
  fi
fi
names=(etcd gw1 gw2)
octets=(2 11 12)
for i in $(seq 1 "$prefill"); do names+=("p$i"); octets+=($((20 + i))); done
for i in $(seq 1 "$decode"); do names+=("d$i"); octets+=($((30 + i))); done
# CHURN=1: one more prefill and decode host, for the workers that join during the audit.
if [ "${CHURN:-0}" = 1 ]; then names+=(p9 d9); octets+=(29 39); fi
wire_nodes=()
for k in "${!names[@]}"; do
  ns=$tag-${names[$k]}
  ip netns add "$ns"
  nodes+=("$ns")
  ip -n "$ns" link set lo up
  wire_nodes+=("$ns=10.77.0.${octets[$k]}")
done
if [ "$wire" = tun ]; then
  loss_fraction=$(python3 -c "import sys; v=sys.argv[1]; print(float(v[:-1])/100 if v.endswith('%') else float(v))" "$loss")
  python3 scripts/wire.py --delay-ms "$delay" --loss "$loss_fraction" --tag "$tag" \
    "${wire_nodes[@]}" host=10.77.0.1 >"$work/wire.log" 2>&1 &
  wire_pid=$!
  for _ in $(seq 100); do grep -q "wire ready" "$work/wire.log" && break; sleep 0.1; done
  grep -q "wire ready" "$work/wire.log" || { cat "$work/wire.log"; exit 1; }
else
  ip link add "$bridge" type bridge
  ip addr add 10.77.0.1/24 dev "$bridge"
  ip link set "$bridge" up
  for k in "${!names[@]}"; do
    ns=$tag-${names[$k]}
    ip link add "$tag-${octets[$k]}" type veth peer name eth0 netns "$ns"
    ip link set "$tag-${octets[$k]}" master "$bridge" up
    ip -n "$ns" addr add "10.77.0.${octets[$k]}/24" dev eth0
    ip -n "$ns" link set eth0 up
    if [ "$wire" = netem ]; then
      ip netns exec "$ns" tc qdisc add dev eth0 root netem delay "${delay}ms" loss "$loss"
    fi
  done
fi
in_ns() { local ns=$tag-$1; shift; ip netns exec "$ns" "$@"; }
# spawn NS CMD... &: as in_ns, but the background job *becomes* the command (exec), so `$!` is
# the process itself and kill -9 / SIGTERM reach it, not a shell that would leave it running.
spawn() { local ns=$tag-$1; shift; exec ip netns exec "$ns" "$@"; }

declare -A pid
start_etcd() {
  spawn etcd etcd --data-dir "$work/etcd" --listen-client-urls http://10.77.0.2:2379 \
    --advertise-client-urls http://10.77.0.2:2379 --listen-peer-urls http://127.0.0.1:2380 \
    >>"$work/etcd.log" 2>&1 &
  pid[etcd]=$!
}
start_etcd

key_a=$("$pw" tenant add alice --config "$work/pw.toml" | head -1)
printf 'max_concurrent = 64\nmax_queued = 256\n' >>"$work/pw.toml"
key_b=$("$pw" tenant add bob --config "$work/pw.toml" | head -1)
printf 'max_concurrent = 64\nmax_queued = 256\n' >>"$work/pw.toml"
(umask 077; head -c 48 /dev/urandom | base64 >"$work/secret"; head -c 48 /dev/urandom | base64 >"$work/metrics-token")
# Each node its own key, all pinned (prefill-9 and decode-9 join under CHURN=1).
trusted=""
for n in gw1 gw2 $(seq -f 'prefill-%g' 1 "$prefill") $(seq -f 'decode-%g' 1 "$decode") prefill-9 decode-9; do
  trusted="$trusted\"$n:$("$pw" node keygen --out "$work/$n.key")\", "
done
{ printf 'threads = 1\n'
  cat "$work/pw.toml"  # top-level keys and [[tenants]]: before the other tables
  printf '[pool]\ntokens = 32768\n[cluster]\nsecret_file = "%s"\ntrusted_nodes = [%s]\n' "$work/secret" "${trusted%, }"
  printf '[metrics]\ntoken_file = "%s"\n' "$work/metrics-token"
  # A drained worker finishes what it carries: long audit answers on one shared CPU can take
  # minutes, more than the 30 s default.
  printf '[limits]\ndrain_timeout_s = 300\n'
  printf '[membership]\netcd = ["10.77.0.2:2379"]\nprefix = "/pagewarden/netns"\nlease_ttl_s = 5\n'
} >"$work/cluster.toml"
printf '[[tenants]]\nname = "alice"\nkey = "%s"\n[[tenants]]\nname = "bob"\nkey = "%s"\n' "$key_a" "$key_b" >"$work/tenants.toml"

gateways=()
for i in 1 2; do
  spawn "gw$i" "$pw" gateway --config "$work/cluster.toml" --node-key "$work/gw$i.key" --listen "10.77.0.$((10 + i)):8080" \
    --cluster-listen "10.77.0.$((10 + i)):7100" >"$work/gw$i.log" 2>&1 &
  gateways+=("http://10.77.0.$((10 + i)):8080")
done
pid[gw2]=$!
# start_worker prefill|decode I: worker I in its namespace (p$I or d$I, 10.77.0.2I or .3I).
start_worker() {
  local role=$1 i=$2 ns octet kv=()
  if [ "$role" = prefill ]; then ns=p$i octet=$((20 + i)); else ns=d$i octet=$((30 + i)); fi
  [ "$role" = decode ] && kv=(--kv-listen "10.77.0.$octet:7200")
  spawn "$ns" "$pw" "$role" --config "$work/cluster.toml" --node-key "$work/$role-$i.key" --name "$role-$i" "${kv[@]}" \
    --metrics-listen "10.77.0.$octet:9100" >>"$work/$ns.log" 2>&1 &
  pid[$ns]=$!
}
metrics=()
worker_metrics=()
for i in $(seq 1 "$prefill"); do
  start_worker prefill "$i"
  worker_metrics+=("http://10.77.0.$((20 + i)):9100/metrics")
done
for i in $(seq 1 "$decode"); do
  start_worker decode "$i"
  worker_metrics+=("http://10.77.0.$((30 + i)):9100/metrics")
done
for m in "${worker_metrics[@]}"; do metrics+=(--metrics "$m"); done
for g in "${gateways[@]}"; do
  for _ in $(seq 600); do curl -sf "$g/ready" >/dev/null && break; sleep 0.2; done
  curl -sf "$g/ready" >/dev/null || { echo "$g not ready"; tail -n 5 "$work"/*.log; exit 1; }
done
case $wire in
  veth) how="veth pairs to a bridge, no delay or loss" ;;
  netem) how="veth pairs to a bridge, netem on each: delay ${delay} ms, loss ${loss} per direction" ;;
  tun) how="TUN interfaces joined by scripts/wire.py: delay ${delay} ms, loss ${loss} per direction" ;;
esac
echo "== nodes in ${#nodes[@]} namespaces; $how"
command -v ping >/dev/null || apt-get install -y -qq iputils-ping >/dev/null
echo "   ping gw1 -> decode-1: $(in_ns gw1 ping -c 20 -i 0.05 -q 10.77.0.31 | tail -2 | tr '\n' ' ')"
echo "   ping prefill-1 -> decode-1: $(in_ns p1 ping -c 20 -i 0.05 -q 10.77.0.31 | tail -2 | tr '\n' ' ')"

# KV transfers the decode workers completed and their mean time (first frame to verified end).
transfers() {
  local n=0 s=0 t
  for i in $(seq 1 "$decode"); do
    t=$(curl -sf "http://10.77.0.$((30 + i)):9100/metrics")
    n=$(awk -v n="$n" '/^pagewarden_kv_transfers_completed_total/ {n += $2} END {print n}' <<<"$t")
    s=$(awk -v s="$s" '/^pagewarden_kv_transfer_seconds_total/ {s += $2} END {print s}' <<<"$t")
  done
  awk -v n="$n" -v s="$s" 'BEGIN {printf "   KV transfers so far: %d, mean %.2f ms from first frame to verified end\n", n, n ? 1000 * s / n : 0}'
}

echo "== bench serve through gateway 1 (${gateways[0]})"
"$pw" bench serve --url "${gateways[0]}" --key "$key_a" --concurrency "$conc" --requests "$bench_requests"
transfers
# CHURN=1: while the audit runs through gateway 1 (and a load through gateway 2), members come
# and go: two workers join, decode-1 drains on SIGTERM and comes back, etcd is killed -9 and
# restarted, prefill-1 is killed -9 and restarted, and gateway 2 is killed -9.
say() { echo "   [churn $(date +%T)] $*"; }
churn() {
  sleep 20; say "prefill-9 and decode-9 join"; start_worker prefill 9; start_worker decode 9
  sleep 30; say "SIGTERM to decode-1 (drain)"; kill -TERM "${pid[d1]}"
  for _ in $(seq 1650); do ps -o stat= -p "${pid[d1]}" | grep -qv Z || break; sleep 0.2; done
  say "decode-1 exited ($(grep -c . "$work/d1.log") log lines; last: $(tail -n 1 "$work/d1.log" | cut -c 1-160)); it starts again"
  start_worker decode 1
  sleep 30; say "kill -9 etcd"; kill -9 "${pid[etcd]}"
  sleep 15; say "etcd starts again"; start_etcd
  sleep 30; say "kill -9 prefill-1"; kill -9 "${pid[p1]}"
  sleep 5; say "prefill-1 starts again"; start_worker prefill 1
  sleep 30; say "kill -9 gateway 2 (its load's streams end; gateway 1 carries on)"; kill -9 "${pid[gw2]}"
}
if [ "${CHURN:-0}" = 1 ]; then
  "$pw" bench serve --url "${gateways[1]}" --key "$key_b" --concurrency 2 --requests 300 --max-tokens 64 \
    >"$work/gw2-load.log" 2>&1 &
  load_pid=$!
  churn &
  churn_pid=$!
fi
echo "== audit through gateway 1: $audit_requests requests, two tenants, every worker's /metrics"
audit_status=0
"$pw" audit --url "${gateways[0]}" --tenants "$work/tenants.toml" --requests "$audit_requests" \
  --metrics-token-file "$work/metrics-token" --metrics "${gateways[0]}/metrics" "${metrics[@]}" \
  --timing-probe 0 --report "${REPORT:-$work/report}" || audit_status=$?
transfers
if [ "${CHURN:-0}" = 1 ]; then
  wait "$churn_pid" || true
  wait "$load_pid" || true
  echo "== the load through gateway 2 (killed during it):"
  tail -n 3 "$work/gw2-load.log"
  worker_metrics+=("http://10.77.0.29:9100/metrics" "http://10.77.0.39:9100/metrics")
  for m in "${worker_metrics[@]}"; do
    used=unreachable
    for _ in $(seq 60); do
      used=$(curl -sf "$m" | awk '/^pagewarden_kv_pages_used/ {s += $2} END {print s + 0}') || used=unreachable
      [ "$used" = 0 ] && break
      sleep 0.5
    done
    echo "   pages in use on ${m%/metrics}: $used"
    [ "$used" = 0 ] || leaked=1
  done
fi
[ "$audit_status" = 0 ] || { echo "the audit failed ($audit_status)"; exit 1; }
[ "${leaked:-0}" = 0 ] || { echo "a surviving worker kept pages in use"; exit 1; }
[ "${CHURN:-0}" = 1 ] && exit 0  # gateway 2 is gone
echo "== bench serve through gateway 2 (${gateways[1]})"
"$pw" bench serve --url "${gateways[1]}" --key "$key_b" --concurrency "$conc" --requests "$bench_requests"
transfers
