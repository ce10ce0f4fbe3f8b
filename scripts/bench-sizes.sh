#!/usr/bin/env bash
# Speed, memory and load time at the sizes people run, pagewarden beside llama.cpp in one run
# on one machine (the machines are noisy: compare the ratios, not figures across runs).
#
#   LLAMA_BIN=/path/to/llama.cpp/build/bin [SHAPES="1.7b 8b"] [TYPES="Q4_0 Q4_K_M Q6_K Q8_0"] \
#     [THREADS=2] [REPS=3] [WORK=/tmp/pw-sizes] [Q6K_LAYOUT=packed|wide] [BATCH=16] \
#     scripts/bench-sizes.sh
#
# Q6K_LAYOUT passes `--q6k-layout` to `bench model` (the speed columns; `generate`, which
# gives the memory and load columns, always loads the default, packed).
#
# Files: a llama-architecture GGUF of each shape with random weights and SmolLM2's tokenizer
# (scripts/synth-model.py, F16), quantized to each type by llama.cpp's llama-quantize; kept in
# WORK for the next run (the F16 source is removed once quantized: 8B in F16 is 16 GB).
# Per file it prints: batch-1 prefill and decode as ratios of llama-bench's in the same run
# (`bench model --llama-bench`), each engine's decode read rate as a share of the read
# bandwidth `bench model` measures, and peak resident memory and wall time from process start
# to the 4th generated token, warm page cache: `pagewarden generate --max-tokens 4` beside
# `llama-bench -p 0 -n 4 -r 1` (which also runs one warm-up pass), both under /usr/bin/time,
# alternated REPS times (the median time, the largest memory). Then decode at BATCH sequences
# (0: skip) after 128 prompt tokens each, 32 tokens each: `bench model --batch BATCH --depth 128
# --decode 32` (its 32-token prefill figure unused) beside `llama-batched-bench -npp 128 -ntg 32
# -npl BATCH` (its TG speed).
#
# llama.cpp is not part of this project: scripts/bench-vs-llamacpp.sh says how to build it from
# the llama-cpp-python sdist on PyPI (targets llama-bench, llama-quantize and llama-batched-bench).
set -euo pipefail
cd "$(dirname "$0")/.."
: "${LLAMA_BIN:?set LLAMA_BIN to the build/bin folder of llama.cpp (llama-bench, llama-quantize, llama-batched-bench)}"
work=${WORK:-/tmp/pw-sizes}
threads=${THREADS:-2}
reps=${REPS:-3}
batch=${BATCH:-16}
mkdir -p "$work"
cargo build -q --release -p pagewarden
pw=target/release/pagewarden
prompt="The capital of France is"
rows=()
for shape in ${SHAPES:-1.7b}; do
  f16="$work/$shape.F16.gguf"
  for ty in ${TYPES:-Q4_0 Q4_K_M Q6_K Q8_0}; do
    q="$work/$shape.$ty.gguf"
    if [[ ! -f $q ]]; then
      [[ -f $f16 ]] || python3 scripts/synth-model.py --shape "$shape" --type f16 --out "$f16"
      "$LLAMA_BIN/llama-quantize" "$f16" "$q.part" "$ty" > "$work/quantize.log" 2>&1
      mv "$q.part" "$q"
    fi
  done
  rm -f "$f16"
  for ty in ${TYPES:-Q4_0 Q4_K_M Q6_K Q8_0}; do
    q="$work/$shape.$ty.gguf"
    echo "== $shape $ty ($q)" >&2
    cat "$q" > /dev/null
    rm -f "$work/pw.time" "$work/ll.time"
    for _ in $(seq "$reps"); do
      /usr/bin/time -a -f "%e %M" -o "$work/pw.time" "$pw" generate --model "$q" --threads "$threads" --max-tokens 4 "$prompt" > /dev/null 2>&1
      /usr/bin/time -a -f "%e %M" -o "$work/ll.time" "$LLAMA_BIN/llama-bench" -m "$q" -p 0 -n 4 -r 1 -t "$threads" > /dev/null 2>&1
    done
    "$pw" bench model --model "$q" --threads "$threads" --batch 1 --reps "$reps" --json \
      ${Q6K_LAYOUT:+--q6k-layout "$Q6K_LAYOUT"} \
      --llama-bench "$LLAMA_BIN/llama-bench" > "$work/bench.json"
    rm -f "$work/batch.json" "$work/batch.jsonl"
    if (( batch > 0 )); then
      "$pw" bench model --model "$q" --threads "$threads" --batch "$batch" --prompt 32 --depth 128 --decode 32 \
        --reps "$reps" --json ${Q6K_LAYOUT:+--q6k-layout "$Q6K_LAYOUT"} > "$work/batch.json"
      "$LLAMA_BIN/llama-batched-bench" -m "$q" -c $((batch * 160)) -npp 128 -ntg 32 -npl "$batch" -t "$threads" \
        --output-format jsonl 2> /dev/null | grep '^{' > "$work/batch.jsonl"
    fi
    rows+=("$(python3 scripts/bench_sizes_row.py "$q" "$work")")
  done
done
echo
echo "$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) CPUs, $threads threads, batch 1 unless said"
echo "| file | prefill | decode | decode read rate, pagewarden / llama.cpp | peak memory, pagewarden / llama.cpp | load + 4 tokens (median) | decode at batch $batch |"
echo "|---|---|---|---|---|---|---|"
printf '%s\n' "${rows[@]}"
