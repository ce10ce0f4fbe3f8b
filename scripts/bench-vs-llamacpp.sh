#!/usr/bin/env bash
# Side-by-side speed of pagewarden and llama.cpp on a packaged model (default: the default
# model), in one run on one machine (the machines are noisy: compare the ratios, not the
# absolute figures across runs).
#
#   LLAMA_BENCH=/path/to/llama-bench [DEPTH=0,2048] scripts/bench-vs-llamacpp.sh [ROUNDS] [MODEL]
#   e.g. MODEL = gemma-3-270m (the names `pagewarden fetch-model` knows); DEPTH: context depths
#   (tokens already in the cache before the timed prefill and decode; default 0)
#
# llama-bench is not part of this project; one way to get it with only package registries:
# `pip download --no-deps --no-binary llama-cpp-python llama-cpp-python==0.3.36`, then build
# vendor/llama.cpp (cmake from `pip install cmake`), target llama-bench (llama-server for the
# serving script). GGML_NATIVE=ON dies with SIGILL on these VMs (AMX is advertised but not
# enabled), so configure with: -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON
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
model=$(cargo run -q --release -p pagewarden -- fetch-model ${2:+"$2"})
pw=target/release/pagewarden
# `bench model --llama-bench` runs llama-bench itself, after its own figures, on the same model
# with the same lengths, threads and repetitions, and prints the ratios of that run only.
for r in $(seq "$rounds"); do
  echo "== round $r"
  "$pw" bench model --model "$model" --threads 1,2 --batch 1 --depth "${DEPTH:-0}" --reps 3 --llama-bench "$LLAMA_BENCH"
done
