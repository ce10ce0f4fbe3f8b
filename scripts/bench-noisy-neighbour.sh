#!/usr/bin/env bash
# What one tenant's load costs another (issue 38): a lone client of tenant `victim` streams
# while tenant `noisy` runs at its full limits (max_concurrent clients, default 8) with
#   alone   nothing,
#   plain   plain requests (ignore_eos, to max_tokens),
#   schema  the same requests held to the most expensive schema we know
#           (scripts/noisy-schema.json: a DFA blow-up regex, a 400-word enum and a nested
#           repetition per record, at least 1000 records so every answer runs to max_tokens),
# interleaved in rounds on one `serve`, all measured by `pagewarden bench serve`. Prints the
# victim's ITL p50 per mode and round and the median ratios schema/plain (target <= 1.25) and
# plain/alone (target <= 2).
#
#   [PW_BIN=target/debug/pagewarden] scripts/bench-noisy-neighbour.sh [ROUNDS] [MAX_TOKENS]
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}
max_tokens=${2:-64}
if [ -z "${PW_BIN:-}" ]; then
  cargo build -q --release -p pagewarden
  PW_BIN=target/release/pagewarden
fi
pw=$PW_BIN
"$pw" fetch-model >/dev/null
work=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$work"' EXIT
victim=$("$pw" tenant add victim --config "$work/pw.toml" 2>/dev/null | head -1)
noisy=$("$pw" tenant add noisy --config "$work/pw.toml" 2>/dev/null | head -1)
limit=$(awk -F' = ' '/^max_concurrent/ {print $2}' "$work/pw.toml" | tail -1)
limit=${limit:-8}

"$pw" serve --config "$work/pw.toml" --listen 127.0.0.1:0 >"$work/out" 2>"$work/err" &
for _ in $(seq 600); do grep -q '^listening on ' "$work/out" && break; sleep 0.5; done
url=$(sed -n 's/^listening on //p' "$work/out" | head -1)
[ -n "$url" ] || { echo "serve did not start:" >&2; tail -n 20 "$work/err" >&2; exit 1; }

itl() { # KEY ARGS...: the ITL p50 of a bench serve run
  local key=$1
  shift
  "$pw" bench serve --url "$url" --key "$key" --json --max-tokens "$max_tokens" "$@" |
    python3 -c 'import json,sys; print(json.load(sys.stdin)["levels"][0]["itl_p50_ms"])'
}
noise() { # MODE: tenant noisy's load in the background (its pid in $noise_pid), until killed
  noise_pid=
  case $1 in
    plain) "$pw" bench serve --url "$url" --key "$noisy" --concurrency "$limit" --requests 1000 \
      --max-tokens "$max_tokens" --json >/dev/null 2>&1 & noise_pid=$! ;;
    schema) "$pw" bench serve --url "$url" --key "$noisy" --concurrency "$limit" --requests 1000 \
      --max-tokens "$max_tokens" --schema scripts/noisy-schema.json --json >/dev/null 2>&1 & noise_pid=$! ;;
  esac
}

echo "CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores; noisy at $limit clients"
itl "$victim" --concurrency 1 --requests 1 >/dev/null # warm-up
: >"$work/rows"
for r in $(seq "$rounds"); do
  for mode in alone plain schema; do
    noise "$mode"
    [ "$mode" = alone ] || sleep 2
    v=$(itl "$victim" --concurrency 1 --requests 4)
    if [ -n "$noise_pid" ]; then
      kill "$noise_pid" 2>/dev/null || true
      wait "$noise_pid" 2>/dev/null || true
      sleep 1 # the server ends the noisy tenant's streams
    fi
    echo "round $r $mode itl_p50_ms $v" | tee -a "$work/rows"
  done
done
python3 - "$work/rows" <<'PY'
import statistics, sys
rows = {}
for line in open(sys.argv[1]):
    _, r, mode, _, v = line.split()
    rows.setdefault(int(r), {})[mode] = float(v)
sp = statistics.median(x["schema"] / x["plain"] for x in rows.values())
pa = statistics.median(x["plain"] / x["alone"] for x in rows.values())
print(f"median schema/plain {sp:.2f} (target <= 1.25); plain/alone {pa:.2f} (target <= 2)")
PY
