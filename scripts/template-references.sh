#!/usr/bin/env bash
# llama.cpp's own renderings of chat templates, as references for text::ChatTemplate
# (crates/text/tests/templates_vs_llamacpp.rs). For each template below, starts llama-server with
# `--jinja --chat-template-file T` on a loopback port, posts a fixed set of conversations to
# `POST /apply-template` and writes crates/text/tests/data/templates/<name>.json: the request
# bodies, llama.cpp's prompt for each (or its error, when the template rejects the conversation),
# the BOS/EOS texts the model gave the template and the pinned clock. The template files are
# copied beside the JSON, so the test needs no llama.cpp.
#
#   scripts/template-references.sh [LLAMA_CPP_DIR] [MODEL.gguf]
#
# LLAMA_CPP_DIR: a llama.cpp tree with build/bin/llama-server built (default: the one vendored by
# llama-cpp-python under /work/llama). MODEL: any small GGUF; its own template is overridden, only
# its BOS/EOS texts reach the templates (default: SmolLM2-135M, the project's default model).
#
# The date is pinned, not normalised. llama.cpp reads the clock in two places: `date_string`
# and `datetime` (common/chat.cpp, common_chat_extra_context: std::chrono::system_clock::now(),
# formatted with localtime) and `strftime_now(fmt)` (common/jinja/value.cpp: std::time(nullptr),
# localtime). Both go through libc (`clock_gettime`, `time`), so a preloaded shim that answers
# every CLOCK_REALTIME read with PINNED_EPOCH, plus TZ=UTC, fixes every date a template prints.
# The pinned day, 14 Mar 2025, is deliberately not Llama 3.1's built-in default (26 Jul 2024), so
# a reference that shows it proves the pin reached the template. The Rust side renders with the
# same instant (ChatTemplate's clock set to PINNED_EPOCH), recorded in each JSON as
# "pinned_epoch". (chat_template_kwargs could override date_string but not strftime_now, which
# Granite 3.3 and Llama 3.2 call.)
set -euo pipefail
cd "$(dirname "$0")/.."

llama=${1:-/work/llama/llama_cpp_python-0.3.36/vendor/llama.cpp}
model=${2:-$HOME/.cache/pagewarden/SmolLM2-135M-Instruct.Q4_1.gguf}
server="$llama/build/bin/llama-server"
src="$llama/models/templates"
out=crates/text/tests/data/templates
port=${PORT:-18731}
pinned_epoch=1741953600 # 2025-03-14T12:00:00Z

templates=(
  meta-llama-Llama-3.1-8B-Instruct
  meta-llama-Llama-3.2-3B-Instruct
  meta-llama-Llama-3.3-70B-Instruct
  Qwen-Qwen2.5-7B-Instruct
  Qwen-Qwen3-0.6B
  microsoft-Phi-3.5-mini-instruct
  mistralai-Mistral-Nemo-Instruct-2407
  google-gemma-2-2b-it
  HuggingFaceTB-SmolLM3-3B
  deepseek-ai-DeepSeek-R1-Distill-Qwen-32B
  deepseek-ai-DeepSeek-R1-Distill-Llama-8B
  ibm-granite-granite-3.3-2B-Instruct
  NousResearch-Hermes-3-Llama-3.1-8B-tool_use
)

work=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$work"' EXIT

# The clock shim: time() and clock_gettime(CLOCK_REALTIME) answer the pinned instant; every
# other clock (the server's steady timers) is passed through to libc.
cat >"$work/pinclock.c" <<EOF
#define _GNU_SOURCE
#include <dlfcn.h>
#include <time.h>
time_t time(time_t *t) { if (t) *t = ${pinned_epoch}; return ${pinned_epoch}; }
int clock_gettime(clockid_t id, struct timespec *ts) {
    static int (*real)(clockid_t, struct timespec *);
    if (id == CLOCK_REALTIME || id == CLOCK_REALTIME_COARSE) {
        ts->tv_sec = ${pinned_epoch}; ts->tv_nsec = 0; return 0;
    }
    if (!real) real = (int (*)(clockid_t, struct timespec *))dlsym(RTLD_NEXT, "clock_gettime");
    return real(id, ts);
}
EOF
cc -shared -fPIC -O2 -o "$work/pinclock.so" "$work/pinclock.c" -ldl

# The conversations, one request body each (OpenAI chat shape). The tool-call id is nine
# alphanumerics because Mistral Nemo's template refuses any other.
cat >"$work/cases.json" <<'EOF'
{
  "plain": {
    "messages": [{"role": "user", "content": "Hello! How are you?"}]
  },
  "system": {
    "messages": [
      {"role": "system", "content": "You are a terse assistant."},
      {"role": "user", "content": "Name a prime number."}
    ]
  },
  "multi_turn": {
    "messages": [
      {"role": "system", "content": "You are a terse assistant."},
      {"role": "user", "content": "Name a prime number."},
      {"role": "assistant", "content": "7"},
      {"role": "user", "content": "Another one?"}
    ]
  },
  "tools": {
    "messages": [{"role": "user", "content": "What is the weather in Paris?"}],
    "tools": [{
      "type": "function",
      "function": {
        "name": "get_weather",
        "description": "Current weather for a city.",
        "parameters": {
          "type": "object",
          "properties": {
            "city": {"type": "string", "description": "City name"},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}
          },
          "required": ["city"]
        }
      }
    }]
  },
  "parallel_calls": {
    "messages": [
      {"role": "user", "content": "Weather in Paris and in Zürich? «Merci» 😀"},
      {"role": "assistant", "content": "", "tool_calls": [
        {"id": "abc123XYZ", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}},
        {"id": "def456UVW", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Zürich\", \"unit\": \"celsius\", \"days\": 2, \"ratio\": 0.5, \"note\": \"a \\\"quoted\\\"\\nline\"}"}}
      ]},
      {"role": "tool", "tool_call_id": "abc123XYZ", "content": "{\"temperature\": 18}"},
      {"role": "tool", "tool_call_id": "def456UVW", "content": "{\"temperature\": 11.5}"}
    ],
    "tools": [{
      "type": "function",
      "function": {
        "name": "get_weather",
        "description": "Current weather for a city.",
        "parameters": {
          "type": "object",
          "properties": {
            "city": {"type": "string", "description": "City name"},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            "days": {"type": "integer", "minimum": 1},
            "ratio": {"type": "number"},
            "note": {"type": ["string", "null"]}
          },
          "required": ["city"]
        }
      }
    }]
  },
  "tool_result": {
    "messages": [
      {"role": "system", "content": "You are a terse assistant."},
      {"role": "user", "content": "What is the weather in Paris?"},
      {"role": "assistant", "content": null, "tool_calls": [{
        "id": "abc123XYZ",
        "type": "function",
        "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\", \"unit\": \"celsius\"}"}
      }]},
      {"role": "tool", "tool_call_id": "abc123XYZ", "name": "get_weather", "content": "{\"temperature\": 18, \"sky\": \"clear\"}"}
    ],
    "tools": [{
      "type": "function",
      "function": {
        "name": "get_weather",
        "description": "Current weather for a city.",
        "parameters": {
          "type": "object",
          "properties": {
            "city": {"type": "string", "description": "City name"},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}
          },
          "required": ["city"]
        }
      }
    }]
  }
}
EOF

mkdir -p "$out"
for name in "${templates[@]}"; do
  cp "$src/$name.jinja" "$out/$name.jinja"
  TZ=UTC LD_PRELOAD="$work/pinclock.so" LD_LIBRARY_PATH="$(dirname "$server")" \
    "$server" -m "$model" --jinja --chat-template-file "$src/$name.jinja" \
    --host 127.0.0.1 --port "$port" -c 512 -t 1 -tb 1 -ngl 0 --no-warmup \
    >"$work/$name.log" 2>&1 &
  pid=$!
  for _ in $(seq 100); do
    curl -sf "http://127.0.0.1:$port/health" >/dev/null && break
    kill -0 "$pid" 2>/dev/null || { cat "$work/$name.log" >&2; exit 1; }
    sleep 0.2
  done
  python3 - "$work/cases.json" "http://127.0.0.1:$port" "$name" "$pinned_epoch" >"$out/$name.json" <<'EOF'
import json, sys, urllib.request, urllib.error

cases_path, base, name, epoch = sys.argv[1:]
cases = json.load(open(cases_path))
props = json.load(urllib.request.urlopen(base + "/props"))
out = {
    "template": name + ".jinja",
    "source": "llama.cpp llama-server --jinja POST /apply-template (scripts/template-references.sh)",
    "pinned_epoch": int(epoch),
    "bos_token": props.get("bos_token", ""),
    "eos_token": props.get("eos_token", ""),
    "caps": props.get("chat_template_caps", {}),
    "cases": [],
}
for case, body in cases.items():
    body = dict(body, add_generation_prompt=True)
    req = urllib.request.Request(base + "/apply-template", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    entry = {"name": case, "request": body}
    try:
        entry["prompt"] = json.load(urllib.request.urlopen(req))["prompt"]
    except urllib.error.HTTPError as e:
        entry["error"] = json.load(e).get("error", {}).get("message", "")
    out["cases"].append(entry)
json.dump(out, sys.stdout, indent=1, ensure_ascii=False)
print()
EOF
  kill "$pid"; wait "$pid" 2>/dev/null || true
  echo "$name: $(jq '[.cases[] | select(.prompt)] | length' "$out/$name.json") prompts, $(jq '[.cases[] | select(.error)] | length' "$out/$name.json") errors"
done
