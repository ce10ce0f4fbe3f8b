#!/usr/bin/env bash
# The isolation audit against a disaggregated deployment of any shape: a gateway and PREFILL
# prefill and DECODE decode processes on loopback (cache-aware routing unless
# PAGEWARDEN_EXTRA_CONFIG says otherwise), TENANTS tenants, then `pagewarden audit --url` with
# every page gauge, and the remaining arguments passed to the audit. Unlike `audit --spawn`
# (two of each role, faults injected) it injects no fault: it is for the shape itself, such
# as the timing probe through several prefill workers that each cache their tenants' prompts.
#
#   scripts/audit-cluster.sh [BIN] [PREFILL] [DECODE] [TENANTS] [-- AUDIT ARGS...]
#
# e.g. scripts/audit-cluster.sh target/release/pagewarden 4 2 3 -- --requests 200 --timing-probe 300
# BIN defaults to target/release/pagewarden; the model is the fetched default model, served
# with a context window of 1,024 tokens (CONTEXT) so near-window prompts stay cheap on a CPU.
set -euo pipefail
BIN=${1:-target/release/pagewarden}
PREFILL=${2:-4}
DECODE=${3:-2}
TENANTS=${4:-3}
shift $(($# < 4 ? $# : 4))
[ "${1:-}" = "--" ] && shift
CONTEXT=${CONTEXT:-1024}
BIN=$(realpath "$BIN")
dir=$(mktemp -d /tmp/pw-audit-cluster.XXXX)
pids=()
cleanup() {
  kill "${pids[@]}" 2> /dev/null || true
  wait 2> /dev/null || true
  rm -rf "$dir"
}
trap cleanup EXIT

(umask 077; head -c 48 /dev/urandom | base64 > "$dir/secret"; head -c 32 /dev/urandom | base64 > "$dir/metrics-token")
ids=()
for i in $(seq 0 $((PREFILL + DECODE))); do
  ids+=("\"n$i:$("$BIN" node keygen --out "$dir/n$i.key" 2> /dev/null | head -1)\"")
done
api=$((20000 + RANDOM % 20000)) cl=$((40000 + RANDOM % 20000))
cat > "$dir/pw.toml" << EOF
threads = 1
context_window = $CONTEXT
[pool]
tokens = $((2 * CONTEXT))
[engine]
queue_timeout_ms = 20000
[limits]
request_timeout_s = 120
[metrics]
token_file = "$dir/metrics-token"
[cluster]
secret_file = "$dir/secret"
trusted_nodes = [$(IFS=,; echo "${ids[*]}")]
gateway = "127.0.0.1:$cl"
${PAGEWARDEN_EXTRA_CONFIG:-}
EOF
: > "$dir/tenants.toml"
for t in $(seq "$TENANTS"); do
  key=$("$BIN" tenant add "tenant-$t" --config "$dir/pw.toml" 2> /dev/null | head -1)
  printf '[[tenants]]\nname = "tenant-%s"\nkey = "%s"\n' "$t" "$key" >> "$dir/tenants.toml"
done
# Every tenant may keep the audit's requests in flight (the [[tenants]] tables come last).
sed -i 's/^\[\[tenants\]\]$/[[tenants]]\nmax_concurrent = 64\nmax_queued = 128\ntokens_per_minute = 0/' "$dir/pw.toml"
metrics=("--metrics" "http://127.0.0.1:$api/metrics")
"$BIN" gateway --config "$dir/pw.toml" --listen "127.0.0.1:$api" --cluster-listen "127.0.0.1:$cl" \
  --node-key "$dir/n0.key" > "$dir/gateway.log" 2>&1 & pids+=($!)
n=1
for role in $(printf 'prefill %.0s' $(seq "$PREFILL")) $(printf 'decode %.0s' $(seq "$DECODE")); do
  m=$((30000 + RANDOM % 10000 + n))
  metrics+=("--metrics" "http://127.0.0.1:$m/metrics")
  extra=()
  [ "$role" = decode ] && extra=(--kv-listen 127.0.0.1:0)
  "$BIN" "$role" --config "$dir/pw.toml" --name "$role-$n" --node-key "$dir/n$n.key" \
    --metrics-listen "127.0.0.1:$m" "${extra[@]}" > "$dir/$role-$n.log" 2>&1 & pids+=($!)
  n=$((n + 1))
done
for _ in $(seq 600); do
  have=$(curl -sf -H "Authorization: Bearer $(cat "$dir/metrics-token")" "http://127.0.0.1:$api/metrics" || true)
  if echo "$have" | grep -q "^pagewarden_cluster_workers{role=\"prefill\"} $PREFILL\$" &&
    echo "$have" | grep -q "^pagewarden_cluster_workers{role=\"decode\"} $DECODE\$"; then break; fi
  sleep 0.2
done
echo "# $BIN: gateway, $PREFILL prefill + $DECODE decode, $TENANTS tenants, CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2)"
"$BIN" audit --url "http://127.0.0.1:$api" --tenants "$dir/tenants.toml" --context-window "$CONTEXT" \
  --metrics-token-file "$dir/metrics-token" "${metrics[@]}" "$@"
