#!/usr/bin/env bash
# Reference log-probabilities from llama.cpp for the synthetic models of each architecture
# (model::tiny::Variant), committed as crates/model/tests/data/arch/<variant>.json and compared
# with our forward pass by crates/model/tests/arch_vs_llamacpp.rs. CI never runs this: it needs
# a llama.cpp build. Run it again only when the generator or the token sequence changes (the
# test pins each file's SHA-256 and says so when they drift).
#
#   LLAMA_CPP=/path/to/llama.cpp scripts/arch-references.sh [VARIANT...]
#
# LLAMA_CPP: a llama.cpp source tree with libllama built in build/bin (default: the tree of the
# llama-cpp-python 0.3.36 sdist, vendor/llama.cpp, commit 0c1e570, the one the project's other
# references come from; `cmake -B build && cmake --build build --target llama -j2` builds
# enough). The program is compiled against it with:
#
#   g++ -O2 -std=c++17 -I$LLAMA_CPP/include -I$LLAMA_CPP/ggml/include \
#       scripts/llama-cpp-logits.cpp -o $OUT/llama-cpp-logits \
#       -L$LLAMA_CPP/build/bin -lllama -lggml -lggml-base -Wl,-rpath,$LLAMA_CPP/build/bin
#
# Each file is written by `cargo run -p model --example synth_arch -- --arch V --out F`, then
# `llama-cpp-logits F SEED 256 8 0.8` decodes 8 random token ids then samples 248 more from the
# model itself at temperature 0.8, and prints the teacher-forced top-1, next-token log-prob and
# top 5 per position (log-probs rounded to 4 decimals). With NOISE_FLOOR=1 it also prints, on
# stderr, how far llama.cpp drifts from itself on the file with other numerics (no flash
# attention, F32 K/V cache): the room the test's thresholds must leave.
set -euo pipefail
cd "$(dirname "$0")/.."
LLAMA_CPP=${LLAMA_CPP:-/work/llama/llama_cpp_python-0.3.36/vendor/llama.cpp}
SEED=${SEED:-20261206}
POSITIONS=256
PROMPT=8
TEMPERATURE=${TEMPERATURE:-0.8}
variants=("${@:-}")
[[ -n "${variants[0]}" ]] || variants=(llama llama3-rope qwen2 qwen3 gemma2 phi3 phi3-long)

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
g++ -O2 -std=c++17 -I"$LLAMA_CPP/include" -I"$LLAMA_CPP/ggml/include" \
    scripts/llama-cpp-logits.cpp -o "$work/llama-cpp-logits" \
    -L"$LLAMA_CPP/build/bin" -lllama -lggml -lggml-base -Wl,-rpath,"$LLAMA_CPP/build/bin"
commit=$(git -C "$LLAMA_CPP" rev-parse HEAD 2>/dev/null || echo unknown)
cargo build -q -p model --example synth_arch
synth=${CARGO_TARGET_DIR:-target}/debug/examples/synth_arch

out=crates/model/tests/data/arch
mkdir -p "$out"
for v in "${variants[@]}"; do
  "$synth" --arch "$v" --out "$work/$v.gguf"
  sha=$(sha256sum "$work/$v.gguf" | cut -d' ' -f1)
  "$work/llama-cpp-logits" "$work/$v.gguf" "$SEED" "$POSITIONS" "$PROMPT" "$TEMPERATURE" \
    "variant=$v" "sha256=$sha" "llama_cpp_commit=$commit" \
    "generated_by=scripts/arch-references.sh (model::tiny::arch_gguf, Variant::spec)" >"$out/$v.json"
  python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print(sys.argv[2], "perplexity", d["perplexity"], "of", d["n_vocab"], "tokens")' "$out/$v.json" "$v"
done
