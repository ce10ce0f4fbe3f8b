#!/usr/bin/env bash
# Serving load, side by side in one run, measured by the same client (`pagewarden bench serve`):
#   1. BASELINE `serve` (optional: another pagewarden binary, e.g. a build of an older commit),
#   2. `serve` (gateway, prefill and decode in one process over in-memory links),
#   3. `gateway` + `prefill` + `decode` as three processes over loopback TCP (1 thread each
#      worker, so the two workers share the machine's cores like serve's one engine does).
#
#   [BASELINE=/path/to/pagewarden] scripts/bench-serve-disagg.sh [REQUESTS_PER_CLIENT] [CONCURRENCY]
set -euo pipefail
cd "$(dirname "$0")/.."
n=${1:-4}
conc=${2:-1,4,16}
cargo build -q --release -p pagewarden
pw=target/release/pagewarden
"$pw" fetch-model >/dev/null
work=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$work"' EXIT

key=$("$pw" tenant add bench --config "$work/pw.toml" | head -1)
printf 'max_concurrent = 64\nmax_queued = 64\n' >>"$work/pw.toml"
(umask 077; head -c 48 /dev/urandom | base64 >"$work/secret")
# Each node its own key, all pinned.
trusted=""
for n in gateway prefill-a decode-a; do trusted="$trusted\"$n:$("$pw" node keygen --out "$work/$n.key")\", "; done
# Top-level keys first (the tenant file's own included), then its tenant tables, then [cluster].
{ printf 'threads = 1\n'
  cat "$work/pw.toml"
  printf '\n[cluster]\nsecret_file = "%s"\nlisten = "127.0.0.1:18190"\ngateway = "127.0.0.1:18190"\ntrusted_nodes = [%s]\n' "$work/secret" "${trusted%, }"
} >"$work/disagg.toml"

ready() { # URL "PID..." LOG...: until the URL answers; fail with the logs if one of the
  # processes exited or after 300 s
  local url=$1 pids=$2 t0=$SECONDS p
  shift 2
  until curl -sf "$url" >/dev/null; do
    for p in $pids; do
      kill -0 "$p" 2>/dev/null || { echo "process $p exited; logs:" >&2; tail -n 20 "$@" >&2; exit 1; }
    done
    ((SECONDS - t0 < 300)) || { echo "no answer from $url in 300 s; logs:" >&2; tail -n 20 "$@" >&2; exit 1; }
    sleep 0.5
  done
}

run_serve() { # binary label
  "$1" serve --config "$work/pw.toml" --listen 127.0.0.1:18182 >"$work/serve.log" 2>&1 &
  local pid=$!
  ready http://127.0.0.1:18182/ready "$pid" "$work/serve.log"
  echo "== $2"
  "$pw" bench serve --url http://127.0.0.1:18182 --key "$key" --concurrency "$conc" --requests "$n"
  kill $pid; wait $pid 2>/dev/null || true
}

if [ -n "${BASELINE:-}" ]; then run_serve "$BASELINE" "baseline serve ($BASELINE)"; fi
run_serve "$pw" "serve (one process, in-memory links)"

"$pw" gateway --config "$work/disagg.toml" --node-key "$work/gateway.key" --listen 127.0.0.1:18183 >"$work/gw.log" 2>&1 &
pids=$!
"$pw" prefill --config "$work/disagg.toml" --node-key "$work/prefill-a.key" --name prefill-a >"$work/prefill.log" 2>&1 &
pids="$pids $!"
"$pw" decode --config "$work/disagg.toml" --node-key "$work/decode-a.key" --name decode-a >"$work/decode.log" 2>&1 &
pids="$pids $!"
ready http://127.0.0.1:18183/ready "$pids" "$work/gw.log" "$work/prefill.log" "$work/decode.log"
echo "== gateway + prefill + decode (three processes, loopback TCP, 1 thread per worker)"
"$pw" bench serve --url http://127.0.0.1:18183 --key "$key" --concurrency "$conc" --requests "$n"
