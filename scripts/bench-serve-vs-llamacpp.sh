#!/usr/bin/env bash
# Side-by-side serving load on one GGUF file, in one run, measured by the same client
# (`pagewarden bench serve`: streaming chat, fixed output length with `ignore_eos`):
# llama-server in its best configuration for each load (one slot per client, continuous
# batching, the same threads for batch and decode), then pagewarden serve with its defaults.
# Prints one table: clients x (output tok/s, TTFT p50/p90, ITL p50/p99) for both, and ratios;
# then pagewarden's served rate against its own engine (`bench model`) doing the same work.
#
#   LLAMA_SERVER=/path/to/llama-server scripts/bench-serve-vs-llamacpp.sh [REQUESTS_PER_CLIENT] [MODEL]
#
# MODEL: a GGUF file or a packaged model's name (default: the default model). llama.cpp's fastest
# CPU format is Q4_0 (repacked at load); make one from the default Q4_1 file with
# `llama-quantize --allow-requantize <Q4_1 file> out.Q4_0.gguf Q4_0` (same tree as llama-server:
# scripts/bench-vs-llamacpp.sh says how to build it).
# Environment: CLIENTS (default 1,4,16,64), THREADS (2), MAX_TOKENS (64), ROUNDS (3), KEEP=DIR keeps
# the JSON.
set -euo pipefail
cd "$(dirname "$0")/.."
: "${LLAMA_SERVER:?set LLAMA_SERVER to a llama-server binary}"
n=${1:-4}
clients=${CLIENTS:-1,4,16,64}
threads=${THREADS:-2}
max_tokens=${MAX_TOKENS:-64}
rounds=${ROUNDS:-3}
cargo build -q --release -p pagewarden
pw=target/release/pagewarden
if [[ -f "${2:-}" ]]; then model=$2; else model=$("$pw" fetch-model ${2:+"$2"}); fi
work=${KEEP:-$(mktemp -d)}
mkdir -p "$work"
trap 'kill $(jobs -p) 2>/dev/null || true; [[ -n "${KEEP:-}" ]] || rm -rf "$work"' EXIT
echo "model: $model; threads: $threads; $n requests per client of $max_tokens tokens; $rounds rounds"

wait_for() { # URL PID: until the URL answers, or fail if the server died
  local t0=$SECONDS
  until curl -sf "$1" >/dev/null; do
    kill -0 "$2" 2>/dev/null || { echo "server exited; its log:" >&2; cat "$work"/*.log >&2; exit 1; }
    ((SECONDS - t0 < 300)) || { echo "no answer from $1 in 300 s" >&2; exit 1; }
    sleep 0.5
  done
}

# Each load runs on both servers back to back, llama-server then pagewarden, each started
# afresh for it and first given one unmeasured request per client (so both measure the steady
# state of a server under that load, prompt caches as warm as the clients make them, and
# neither has a cache the other lacks), and the whole sweep repeats ROUNDS times: this
# machine's speed drifts by a third over minutes, so a ratio is only taken between runs
# seconds apart, and the table shows the median round.
# llama-server gets one slot per client (each slot 512 tokens of context; a request here
# needs under 150).
printf 'model = "%s"\nthreads = %s\n' "$model" "$threads" >"$work/pw.toml"
key=$("$pw" tenant add bench --config "$work/pw.toml" | head -1)
printf 'max_concurrent = 64\nmax_queued = 64\n' >>"$work/pw.toml"
# measure PID READY_URL OUT [bench serve arguments]: once the server answers, one unmeasured
# request per client, then the measured load into OUT; then the server is stopped.
measure() {
  local pid=$1 ready=$2 out=$3
  shift 3
  wait_for "$ready" "$pid"
  "$pw" bench serve "$@" --concurrency "$c" --requests 1 --max-tokens "$max_tokens" >/dev/null
  "$pw" bench serve "$@" --concurrency "$c" --requests "$n" --max-tokens "$max_tokens" --json >"$out"
  kill "$pid"; wait "$pid" 2>/dev/null || true
}
for round in $(seq "$rounds"); do
  for c in ${clients//,/ }; do
    "$LLAMA_SERVER" -m "$model" -c $((c * 512)) --parallel "$c" --cont-batching -t "$threads" -tb "$threads" \
      --host 127.0.0.1 --port 18081 >"$work/llama.log" 2>&1 &
    measure $! http://127.0.0.1:18081/health "$work/llama-$c-$round.json" --url http://127.0.0.1:18081
    "$pw" serve --config "$work/pw.toml" --listen 127.0.0.1:18082 >"$work/pw.log" 2>&1 &
    measure $! http://127.0.0.1:18082/ready "$work/pw-$c-$round.json" --url http://127.0.0.1:18082 --key "$key"
  done
done

# The engine alone (`bench model`, no HTTP, no router, no sampling) doing the same work at the
# same batch: each client's prompt (as the server counted it) prefilled past the part its
# prefix cache served (already in the KV cache: `--depth`), then its answer decoded.
# Served / engine is what the serving path keeps of the engine's speed.
for c in ${clients//,/ }; do
  read -r cached uncached < <(python3 -c 'import json,sys
l = json.load(open(sys.argv[1]))["levels"][0]
p, k = round(l["mean_prompt_tokens"] or 1), round(l.get("mean_cached_tokens") or 0)
k = min(k, p - 1)
print(k, p - k)' "$work/pw-$c-1.json")
  "$pw" bench model --model "$model" --threads "$threads" --batch "$c" --depth "$cached" --prompt "$uncached" \
    --decode "$max_tokens" --reps 2 --json >"$work/engine-$c.json"
done

python3 - "$work" "$clients" "$rounds" <<'EOF'
import json, statistics, sys
work, clients, rounds = sys.argv[1], [int(c) for c in sys.argv[2].split(",")], int(sys.argv[3])
def level(name, c, r):
    return json.load(open(f"{work}/{name}-{c}-{r}.json"))["levels"][0]
def ratio(c, r):
    return level("pw", c, r)["output_tokens_per_s"] / level("llama", c, r)["output_tokens_per_s"]
def median_round(c):
    # The round whose throughput ratio is the median (the lower middle for an even count).
    by = sorted(range(1, rounds + 1), key=lambda r: ratio(c, r))
    return by[(len(by) - 1) // 2]
print()
print("Median round of each load:")
print()
print("| clients | server | output tok/s | TTFT p50 ms | TTFT p90 ms | ITL p50 ms | ITL p99 ms | errors |")
print("|---|---|---|---|---|---|---|---|")
for c in clients:
    r = median_round(c)
    for name, x in (("llama-server", level("llama", c, r)), ("pagewarden", level("pw", c, r))):
        print(f"| {c} | {name} | {x['output_tokens_per_s']:.1f} | {x['ttft_p50_ms']:.1f} | {x['ttft_p90_ms']:.1f} "
              f"| {x['itl_p50_ms']:.1f} | {x['itl_p99_ms']:.1f} | {x['errors']} |")
print()
print("Every round, pagewarden / llama-server (each pair run back to back):")
print()
print("| clients | tok/s per round | median | TTFT p50 per round | median |")
print("|---|---|---|---|---|")
for c in clients:
    tr = [ratio(c, r) for r in range(1, rounds + 1)]
    fr = [level("pw", c, r)["ttft_p50_ms"] / level("llama", c, r)["ttft_p50_ms"] for r in range(1, rounds + 1)]
    print(f"| {c} | {' '.join(f'x{v:.2f}' for v in tr)} | x{statistics.median(tr):.2f} "
          f"| {' '.join(f'{v:.2f}' for v in fr)} | {statistics.median(fr):.2f} |")
print()
print("| clients | prompt tokens to prefill (cached) | engine prefill tok/s | engine decode tok/s | engine, same work, output tok/s | served (median round) / same work | served / decode only |")
print("|---|---|---|---|---|---|---|")
for c in clients:
    e = json.load(open(f"{work}/engine-{c}.json"))
    row, served = e["rows"][0], level("pw", c, median_round(c))["output_tokens_per_s"]
    p, d = e["prompt_tokens"], e["decode_tokens"]
    pf, dc = row["prefill_tokens_per_s"], row["decode_tokens_per_s"]
    # Per request: its uncached prompt at the batch's prefill rate, then its answer at the
    # decode rate.
    same = d / (p / pf + d / dc)
    print(f"| {c} | {p} ({row.get('depth', 0)}) | {pf:.1f} | {dc:.1f} | {same:.1f} | {served / same:.0%} | {served / dc:.0%} |")
EOF
