#!/usr/bin/env bash
# Speculative decoding (prompt lookup) against none, side by side in one run on one machine:
# batch-1 decode tokens/s of `pagewarden generate --json` with `--speculative-draft 0` and
# `--speculative-draft $DRAFT`, alternating, ROUNDS times each (median reported), on
# workloads where guesses are kept (copying a passage of the prompt) and where they are not
# (free text, greedy and sampled), with the guesses fed and kept. Each pair's tokens must be
# equal (the script stops otherwise): speculation changes speed only.
#
#   [DRAFT=8] [ROUNDS=3] [THREADS=2] [MAX_TOKENS=128] scripts/bench-speculative.sh [MODEL...]
#   MODEL: a GGUF file or a packaged model's name (default: the default model and gemma-3-270m)
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build -q --release -p pagewarden
pw=target/release/pagewarden
draft=${DRAFT:-8}
rounds=${ROUNDS:-3}
threads=${THREADS:-2}
max=${MAX_TOKENS:-128}
passage="The harbour town woke slowly. Fishermen carried nets down the stone steps, gulls circled \
the masts, and the baker on the corner opened his shutters to let the smell of bread into the \
street. By eight the market was full: crates of mackerel, baskets of lemons, coils of rope and \
a man selling brass compasses that all pointed somewhere slightly different."
copy_prompt="Copy the following paragraph exactly, word for word.

Paragraph: $passage

Copy: "
story_prompt="Write a short story about a lighthouse keeper who finds a message in a bottle."
models=("$@")
[[ ${#models[@]} -gt 0 ]] || models=("" gemma-3-270m)
echo "$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) CPUs, $threads threads"
echo "| model | workload | decode tok/s, no drafts | with up to $draft | ratio | guesses kept / fed |"
echo "|---|---|---|---|---|---|"
for m in "${models[@]}"; do
  file=$("$pw" fetch-model ${m:+"$m"})
  for workload in copy story sampled; do
    case $workload in
      copy) args=("$copy_prompt" --chat) ;;
      story) args=("$story_prompt" --chat) ;;
      sampled) args=("$story_prompt" --chat --temperature 0.8 --seed 7) ;;
    esac
    : > /tmp/pw-spec.$$
    for r in $(seq "$rounds"); do
      for d in 0 "$draft"; do
        "$pw" generate --model "$file" --threads "$threads" --max-tokens "$max" --json \
          --speculative-draft "$d" "${args[@]}" | python3 -c '
import json, sys
o = json.load(sys.stdin)
print(sys.argv[1], o["decode_tokens_per_s"], o["draft_tokens"], o["draft_tokens_accepted"], ",".join(map(str, o["tokens"])))
' "$d" >> /tmp/pw-spec.$$
      done
    done
    python3 - "$(basename "$file")" "$workload" "$draft" /tmp/pw-spec.$$ <<'PY'
import statistics, sys
name, workload, draft, path = sys.argv[1:5]
runs = [line.split() for line in open(path)]
base = [r for r in runs if r[0] == "0"]
spec = [r for r in runs if r[0] == draft]
if {r[4] for r in base} != {r[4] for r in spec} or len({r[4] for r in base}) != 1:
    sys.exit(f"{name} {workload}: the tokens differ between runs")
b = statistics.median(float(r[1]) for r in base)
s = statistics.median(float(r[1]) for r in spec)
fed = sum(int(r[2]) for r in spec) // len(spec)
kept = sum(int(r[3]) for r in spec) // len(spec)
print(f"| {name} | {workload} ({len(base[0][4].split(','))} tokens) | {b:.1f} | {s:.1f} | {s / b:.2f}x | {kept} / {fed} |")
PY
  done
done
rm -f /tmp/pw-spec.$$
