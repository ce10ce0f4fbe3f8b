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
# Environment: CLIENTS (default 1,4,16,64), THREADS (2), MAX_TOKENS (64), KEEP=DIR keeps the JSON.
set -euo pipefail
cd "$(dirname "$0")/.."
: "${LLAMA_SERVER:?set LLAMA_SERVER to a llama-server binary}"
n=${1:-4}
clients=${CLIENTS:-1,4,16,64}
threads=${THREADS:-2}
max_tokens=${MAX_TOKENS:-64}
cargo build -q --release -p pagewarden
pw=target/release/pagewarden
if [[ -f "${2:-}" ]]; then model=$2; else model=$("$pw" fetch-model ${2:+"$2"}); fi
work=${KEEP:-$(mktemp -d)}
mkdir -p "$work"
trap 'kill $(jobs -p) 2>/dev/null || true; [[ -n "${KEEP:-}" ]] || rm -rf "$work"' EXIT
echo "model: $model; threads: $threads; $n requests per client of $max_tokens tokens"

wait_for() { # URL PID: until the URL answers, or fail if the server died
  local t0=$SECONDS
  until curl -sf "$1" >/dev/null; do
    kill -0 "$2" 2>/dev/null || { echo "server exited; its log:" >&2; cat "$work"/*.log >&2; exit 1; }
    ((SECONDS - t0 < 300)) || { echo "no answer from $1 in 300 s" >&2; exit 1; }
    sleep 0.5
  done
}

# llama-server: restarted per load so its slots equal the clients (each slot gets 512 tokens
# of context; a request here needs under 150).
for c in ${clients//,/ }; do
  "$LLAMA_SERVER" -m "$model" -c $((c * 512)) --parallel "$c" --cont-batching -t "$threads" -tb "$threads" \
    --host 127.0.0.1 --port 18081 >"$work/llama.log" 2>&1 &
  pid=$!
  wait_for http://127.0.0.1:18081/health $pid
  "$pw" bench serve --url http://127.0.0.1:18081 --concurrency "$c" --requests "$n" --max-tokens "$max_tokens" \
    --json >"$work/llama-$c.json"
  kill $pid; wait $pid 2>/dev/null || true
done

printf 'model = "%s"\nthreads = %s\n' "$model" "$threads" >"$work/pw.toml"
key=$("$pw" tenant add bench --config "$work/pw.toml" | head -1)
printf 'max_concurrent = 64\nmax_queued = 64\n' >>"$work/pw.toml"
"$pw" serve --config "$work/pw.toml" --listen 127.0.0.1:18082 >"$work/pw.log" 2>&1 &
pid=$!
wait_for http://127.0.0.1:18082/ready $pid
for c in ${clients//,/ }; do
  "$pw" bench serve --url http://127.0.0.1:18082 --key "$key" --concurrency "$c" --requests "$n" \
    --max-tokens "$max_tokens" --json >"$work/pw-$c.json"
done
kill $pid; wait $pid 2>/dev/null || true

# The engine alone (`bench model`, no HTTP, no router, no sampling) doing the same work at the
# same batch: each client's prompt (as the server counted it) prefilled, then its answer
# decoded. Served / engine is what the serving path keeps of the engine's speed.
for c in ${clients//,/ }; do
  prompt=$(python3 -c 'import json,sys; print(round(json.load(open(sys.argv[1]))["levels"][0]["mean_prompt_tokens"] or 0))' "$work/pw-$c.json")
  "$pw" bench model --model "$model" --threads "$threads" --batch "$c" --prompt "$prompt" --decode "$max_tokens" \
    --reps 2 --json >"$work/engine-$c.json"
done

python3 - "$work" "$clients" <<'EOF'
import json, sys
work, clients = sys.argv[1], [int(c) for c in sys.argv[2].split(",")]
def level(name, c):
    return json.load(open(f"{work}/{name}-{c}.json"))["levels"][0]
print()
print("| clients | server | output tok/s | TTFT p50 ms | TTFT p90 ms | ITL p50 ms | ITL p99 ms | errors |")
print("|---|---|---|---|---|---|---|---|")
ratios = []
for c in clients:
    l, p = level("llama", c), level("pw", c)
    for name, x in (("llama-server", l), ("pagewarden", p)):
        print(f"| {c} | {name} | {x['output_tokens_per_s']:.1f} | {x['ttft_p50_ms']:.1f} | {x['ttft_p90_ms']:.1f} "
              f"| {x['itl_p50_ms']:.1f} | {x['itl_p99_ms']:.1f} | {x['errors']} |")
    ratios.append((c, p["output_tokens_per_s"] / l["output_tokens_per_s"], p["ttft_p50_ms"] / l["ttft_p50_ms"]))
print()
print("| clients | tok/s pagewarden / llama-server | TTFT p50 pagewarden / llama-server |")
print("|---|---|---|")
for c, r, t in ratios:
    print(f"| {c} | x{r:.2f} | {t:.2f} |")
print()
print("| clients | prompt tokens | engine prefill tok/s | engine decode tok/s | engine, same work, output tok/s | served / same work | served / decode only |")
print("|---|---|---|---|---|---|---|")
for c in clients:
    e = json.load(open(f"{work}/engine-{c}.json"))
    row, served = e["rows"][0], level("pw", c)["output_tokens_per_s"]
    p, d = e["prompt_tokens"], e["decode_tokens"]
    pf, dc = row["prefill_tokens_per_s"], row["decode_tokens_per_s"]
    # Per request: its prompt at the batch's prefill rate, then its answer at the decode rate.
    same = d / (p / pf + d / dc)
    print(f"| {c} | {p} | {pf:.1f} | {dc:.1f} | {same:.1f} | {served / same:.0%} | {served / dc:.0%} |")
EOF
