#!/usr/bin/env bash
# Multi-turn conversations through a gateway with several prefill workers, once per routing
# policy (`cache_aware`, then `least_loaded`, alternating for ROUNDS), printing per turn the
# cached fraction of the prompt against the ideal (every token of the previous turn's prompt
# but its last page), the KV bytes the decode workers received against the turn's new pages,
# how the requests split over the decode workers, and the median time to first token. Same
# binary, same model, same run.
#
#   scripts/bench-routing.sh [BIN] [PREFILL] [DECODE] [CONVERSATIONS] [TURNS] [ROUNDS] [SYSTEM_TOKENS]
#
# BIN defaults to target/release/pagewarden; the model is the fetched default model.
# PAGEWARDEN_EXTRA_CONFIG (TOML lines) is appended to the nodes' config.
set -euo pipefail
BIN=${1:-target/release/pagewarden}
PREFILL=${2:-2}
DECODE=${3:-1}
CONVS=${4:-8}
TURNS=${5:-4}
ROUNDS=${6:-1}
SYSTEM_TOKENS=${7:-1000}
BIN=$(realpath "$BIN")
SCRIPTS=$(dirname "$(realpath "$0")")

run_policy() {
  local policy=$1 dir
  dir=$(mktemp -d /tmp/pw-routing.XXXX)
  (umask 077; head -c 48 /dev/urandom | base64 > "$dir/secret")
  local ids=()
  for i in $(seq 0 $((PREFILL + DECODE))); do
    ids+=("\"n$i:$("$BIN" node keygen --out "$dir/n$i.key" 2>/dev/null | head -1)\"")
  done
  local trusted
  trusted=$(IFS=,; echo "${ids[*]}")
  local api=$((20000 + RANDOM % 20000)) cl=$((40000 + RANDOM % 20000))
  cat > "$dir/pw.toml" <<EOF
threads = 1
[pool]
tokens = 32768
[cluster]
secret_file = "$dir/secret"
trusted_nodes = [$trusted]
gateway = "127.0.0.1:$cl"
routing = "$policy"
${PAGEWARDEN_EXTRA_CONFIG:-}
EOF
  local key
  key=$("$BIN" tenant add bench --config "$dir/pw.toml" 2> /dev/null | head -1)
  # The tenant is the file's last table: every conversation may run at once.
  printf 'max_concurrent = 256\nmax_queued = 512\n' >> "$dir/pw.toml"
  local pids=()
  "$BIN" gateway --config "$dir/pw.toml" --listen "127.0.0.1:$api" --cluster-listen "127.0.0.1:$cl" \
    --node-key "$dir/n0.key" > "$dir/gateway.log" 2>&1 & pids+=($!)
  local n=1
  for _ in $(seq "$PREFILL"); do
    "$BIN" prefill --config "$dir/pw.toml" --name "prefill-$n" --node-key "$dir/n$n.key" > "$dir/p$n.log" 2>&1 & pids+=($!)
    n=$((n + 1))
  done
  local metrics=()
  for _ in $(seq "$DECODE"); do
    local m=$((30000 + RANDOM % 10000))
    metrics+=("http://127.0.0.1:$m/metrics")
    "$BIN" decode --config "$dir/pw.toml" --name "decode-$n" --node-key "$dir/n$n.key" --kv-listen 127.0.0.1:0 \
      --metrics-listen "127.0.0.1:$m" > "$dir/d$n.log" 2>&1 & pids+=($!)
    n=$((n + 1))
  done
  for _ in $(seq 600); do
    if curl -sf "http://127.0.0.1:$api/ready" > /dev/null; then break; fi
    sleep 0.2
  done
  python3 "$SCRIPTS/bench_routing_client.py" "http://127.0.0.1:$api" "$key" "$CONVS" "$TURNS" "$policy" \
    "$(IFS=,; echo "${metrics[*]}")" "$SYSTEM_TOKENS" || true
  kill "${pids[@]}" 2> /dev/null || true
  wait 2> /dev/null || true
  rm -rf "$dir"
}

echo "# $BIN, $PREFILL prefill + $DECODE decode, $CONVS conversations x $TURNS turns, CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2)"
for _ in $(seq "$ROUNDS"); do
  run_policy cache_aware
  run_policy least_loaded
done
