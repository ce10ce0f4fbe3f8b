#!/usr/bin/env bash
# Side-by-side speed of pagewarden and llama.cpp on the default model, in one run on one machine
# (the machines are noisy: compare the ratios, not the absolute figures across runs).
#
#   LLAMA_BENCH=/path/to/llama-bench scripts/bench-vs-llamacpp.sh [ROUNDS]
#
# llama-bench is not part of this project; one way to get it with only package registries:
# `pip download --no-deps --no-binary llama-cpp-python llama-cpp-python==0.3.36`, then build
# vendor/llama.cpp (cmake from `pip install cmake`) with -DGGML_NATIVE=ON, target llama-bench.
set -euo pipefail
cd "$(dirname "$0")/.."
: "${LLAMA_BENCH:?set LLAMA_BENCH to a llama-bench binary}"
rounds=${1:-2}
model=$(cargo run -q --release -p pagewarden -- fetch-model)
pw=target/release/pagewarden
for r in $(seq "$rounds"); do
  echo "== round $r: llama.cpp"
  "$LLAMA_BENCH" -m "$model" -t 1,2 -p 512 -n 128 -r 3 -o json 2>/dev/null |
    python3 -c 'import json,sys
for t in json.load(sys.stdin):
    kind = "pp%d" % t["n_prompt"] if t["n_prompt"] else "tg%d" % t["n_gen"]
    print("llama.cpp threads %d %s %.1f tok/s" % (t["n_threads"], kind, t["avg_ts"]))'
  echo "== round $r: pagewarden"
  "$pw" bench model --threads 1,2 --batch 1 --reps 3
done
