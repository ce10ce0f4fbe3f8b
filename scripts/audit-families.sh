#!/usr/bin/env bash
# Two model families served side by side by one `serve` through `[[models]]`, and the isolation
# audit across both: a Qwen2.5-0.5B-shaped file (architecture qwen2, the `qwen2` vocabulary of
# 151,936 tokens) and a Llama-3.2-1B-shaped one (llama with rope_freqs, the `llama-bpe`
# vocabulary of 128,256 tokens), random weights, Q4_0. One tenant may use both models, the
# other only Llama; the audit gives each tenant a model it may use, sizes and counts each
# model's prompts with that model's own tokenizer, and pairs the tenants in its timing probe.
#
#   LLAMA_BIN=/path/to/llama.cpp/build/bin [WORK=/tmp/pw-families] [REQUESTS=60] \
#     scripts/audit-families.sh
#
# Files: scripts/synth-model.py (F16; its tokenizers come from llama.cpp's vocab test files,
# which `cargo test -p text --test llama_cpp_vocabs` fetches), quantized by llama-quantize
# (LLAMA_BIN: llama.cpp's build/bin; scripts/bench-vs-llamacpp.sh says how to build it from the
# llama-cpp-python sdist on PyPI); kept in WORK for the next run. Prints the audit's summary;
# the report is in WORK/audit (report.md, report.json). Exits as the audit does (0: passed).
set -euo pipefail
cd "$(dirname "$0")/.."
: "${LLAMA_BIN:?set LLAMA_BIN to the build/bin folder of llama.cpp (llama-quantize)}"
work=${WORK:-/tmp/pw-families}
mkdir -p "$work"
cargo build -q -p pagewarden
pw=target/debug/pagewarden
for shape in qwen2.5-0.5b llama3.2-1b; do
  q="$work/$shape.Q4_0.gguf"
  if [[ ! -f $q ]]; then
    python3 scripts/synth-model.py --shape "$shape" --type f16 --out "$work/$shape.F16.gguf"
    "$LLAMA_BIN/llama-quantize" "$work/$shape.F16.gguf" "$q" Q4_0 > "$work/quantize.log" 2>&1
    rm -f "$work/$shape.F16.gguf"
  fi
done

run=$(mktemp -d "$work/run.XXXX")
config="$run/pagewarden.toml"
printf '%s' "metrics-token-of-the-families-audit-0123456789" > "$run/metrics-token"
chmod 600 "$run/metrics-token"
cat > "$config" <<EOF
[engine]
queue_timeout_ms = 20000

[[models]]
name = "qwen2.5-0.5b-synthetic"
file = "$work/qwen2.5-0.5b.Q4_0.gguf"
context_window = 2048
pool = { tokens = 8192 }

[[models]]
name = "llama3.2-1b-synthetic"
file = "$work/llama3.2-1b.Q4_0.gguf"
context_window = 2048
pool = { tokens = 8192 }

[metrics]
token_file = "$run/metrics-token"
EOF
key_all=$("$pw" tenant add everything --config "$config" | head -1)
key_llama=$("$pw" tenant add llama-only --config "$config" | head -1)
# The last tenant table in the file is llama-only's.
echo 'models = ["llama3.2-1b-synthetic"]' >> "$config"
cat > "$run/tenants.toml" <<EOF
[[tenants]]
name = "everything"
key = "$key_all"

[[tenants]]
name = "llama-only"
key = "$key_llama"
EOF

"$pw" serve --listen 127.0.0.1:0 --config "$config" > "$run/serve.out" 2> "$run/serve.err" &
server=$!
trap 'kill $server 2>/dev/null || true' EXIT
url=
for _ in $(seq 600); do
  url=$(cat "$run/serve.out" "$run/serve.err" | grep -o "listening on http://127.0.0.1:[0-9]*" | head -1 | sed "s/listening on //" || true)
  [[ -n $url ]] && break
  kill -0 $server 2>/dev/null || { cat "$run/serve.err" >&2; exit 1; }
  sleep 0.5
done
[[ -n $url ]] || { echo "serve did not start" >&2; exit 1; }
echo "serving both models at $url" >&2
# Each model's prompts counted with its own tokenizer and template (the files served).
"$pw" audit --url "$url" --tenants "$run/tenants.toml" --metrics-token-file "$run/metrics-token" \
  --tokenizer "qwen2.5-0.5b-synthetic=$work/qwen2.5-0.5b.Q4_0.gguf" \
  --tokenizer "llama3.2-1b-synthetic=$work/llama3.2-1b.Q4_0.gguf" \
  --requests "${REQUESTS:-60}" --concurrency 4 --seed 20261207 --timing-probe 6 \
  --skip-check probe-power --report "$work/audit"
