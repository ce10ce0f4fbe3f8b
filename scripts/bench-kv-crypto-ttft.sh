#!/usr/bin/env bash
# What encrypting and verifying the KV transfer costs a request's time to first token, through
# gateway + prefill + decode processes on loopback TCP (1 thread per worker): N completions of
# a ~512-token prompt (a fresh cache salt each, so no prefix-cache hit), one token each, one at
# a time. Prints the gateway's mean TTFT, the workers' KV crypto time per request (prefill: KV
# link handshake and sealing; decode: opening and the transfer checks; from
# pagewarden_kv_crypto_seconds_total) and its share of the TTFT.
#
#   scripts/bench-kv-crypto-ttft.sh [REQUESTS] [PROMPT_TOKENS]
set -euo pipefail
cd "$(dirname "$0")/.."
n=${1:-20}
tokens=${2:-512}
cargo build -q --release -p pagewarden
pw=target/release/pagewarden
"$pw" fetch-model >/dev/null
work=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$work"' EXIT

key=$("$pw" tenant add bench --config "$work/pw.toml" | head -1)
(umask 077; head -c 48 /dev/urandom | base64 >"$work/secret")
# Each node its own key, all pinned.
trusted=""
for n in gateway prefill-a decode-a; do trusted="$trusted\"$n:$("$pw" node keygen --out "$work/$n.key")\", "; done
{ printf 'threads = 1\n[metrics]\nlisten = "127.0.0.1:18284"\n[cluster]\nsecret_file = "%s"\nlisten = "127.0.0.1:18290"\ngateway = "127.0.0.1:18290"\ntrusted_nodes = [%s]\n' "$work/secret" "${trusted%, }"
  cat "$work/pw.toml"; } >"$work/disagg.toml"
"$pw" gateway --config "$work/disagg.toml" --node-key "$work/gateway.key" --listen 127.0.0.1:18283 >"$work/gw.log" 2>&1 &
"$pw" prefill --config "$work/disagg.toml" --node-key "$work/prefill-a.key" --name prefill-a --metrics-listen 127.0.0.1:18291 >"$work/prefill.log" 2>&1 &
"$pw" decode --config "$work/disagg.toml" --node-key "$work/decode-a.key" --name decode-a --metrics-listen 127.0.0.1:18292 >"$work/decode.log" 2>&1 &
until curl -sf http://127.0.0.1:18283/ready >/dev/null; do sleep 0.5; done

metric() { # url name -> sum of its samples
  curl -sf "$1/metrics" | awk -v n="$2" '$1 ~ "^"n"({|$)" {s += $2} END {printf "%.9f\n", s}'
}
# A sentence of 12 tokens with the default model's tokenizer, repeated.
text=$(for _ in $(seq 1 $(( tokens / 12 ))); do printf '%s ' "the lighthouse keeper counted ships that passed the harbour at night."; done)
req() { # salt max_tokens
  printf '{"model":"SmolLM2-135M-Instruct","prompt":"%s","max_tokens":%s,"temperature":0,"cache_salt":"%s"}' "$text" "$2" "$1" |
    curl -sf http://127.0.0.1:18283/v1/completions -H "Authorization: Bearer $key" -H 'Content-Type: application/json' -d @-
}
prompt_tokens=$(req warm 1 | sed 's/.*"prompt_tokens":\([0-9]*\).*/\1/')
t0=$(metric http://127.0.0.1:18284 pagewarden_time_to_first_token_seconds_sum)
c0=$(metric http://127.0.0.1:18284 pagewarden_time_to_first_token_seconds_count)
p0=$(metric http://127.0.0.1:18291 pagewarden_kv_crypto_seconds_total)
d0=$(metric http://127.0.0.1:18292 pagewarden_kv_crypto_seconds_total)
for i in $(seq 1 "$n"); do req "run-$i-$RANDOM" 1 >/dev/null; done
sleep 1
t1=$(metric http://127.0.0.1:18284 pagewarden_time_to_first_token_seconds_sum)
c1=$(metric http://127.0.0.1:18284 pagewarden_time_to_first_token_seconds_count)
p1=$(metric http://127.0.0.1:18291 pagewarden_kv_crypto_seconds_total)
d1=$(metric http://127.0.0.1:18292 pagewarden_kv_crypto_seconds_total)
awk -v n="$n" -v pt="$prompt_tokens" -v t0="$t0" -v t1="$t1" -v c0="$c0" -v c1="$c1" \
    -v p0="$p0" -v p1="$p1" -v d0="$d0" -v d1="$d1" 'BEGIN {
  c = c1 - c0; ttft = (t1 - t0) / c * 1000; pc = (p1 - p0) / n * 1000; dc = (d1 - d0) / n * 1000
  printf "%d requests of %d prompt tokens: mean TTFT %.1f ms\n", c, pt, ttft
  printf "KV crypto per request: prefill %.2f ms (KV link handshake + sealing), decode %.2f ms (opening + checks)\n", pc, dc
  printf "encryption + verification = %.2f%% of TTFT (target <= 1%%)\n", 100 * (pc + dc) / ttft
}'
