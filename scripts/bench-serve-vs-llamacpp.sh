#!/usr/bin/env bash
# Side-by-side serving load: llama-server and pagewarden serve on the default model, one after
# the other in one run, measured by the same client (`pagewarden bench serve`).
#
#   LLAMA_SERVER=/path/to/llama-server scripts/bench-serve-vs-llamacpp.sh [REQUESTS_PER_CLIENT]
#
# llama-server settings are those of ../shared/reference/server_bench_*.json.
set -euo pipefail
cd "$(dirname "$0")/.."
: "${LLAMA_SERVER:?set LLAMA_SERVER to a llama-server binary}"
n=${1:-4}
cargo build -q --release -p pagewarden
pw=target/release/pagewarden
model=$("$pw" fetch-model)
work=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$work"' EXIT

"$LLAMA_SERVER" -m "$model" -c 8192 --parallel 4 --cont-batching -t 2 --host 127.0.0.1 --port 18081 \
  >"$work/llama.log" 2>&1 &
until curl -sf http://127.0.0.1:18081/health >/dev/null; do sleep 0.5; done
echo "== llama-server (-c 8192 --parallel 4 --cont-batching -t 2)"
"$pw" bench serve --url http://127.0.0.1:18081 --concurrency 1,4,16 --requests "$n"
kill %1; wait %1 2>/dev/null || true

key=$("$pw" tenant add bench --config "$work/pw.toml" | head -1)
printf 'max_concurrent = 64\nmax_queued = 64\n' >>"$work/pw.toml"
"$pw" serve --config "$work/pw.toml" --listen 127.0.0.1:18082 >"$work/pw.log" 2>&1 &
until curl -sf http://127.0.0.1:18082/ready >/dev/null; do sleep 0.5; done
echo "== pagewarden serve (2 threads, defaults)"
"$pw" bench serve --url http://127.0.0.1:18082 --key "$key" --concurrency 1,4,16 --requests "$n"
