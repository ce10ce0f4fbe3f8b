#!/usr/bin/env bash
# The documented audits of docs/audit.md ("llama-server beside pagewarden, measured"), side by
# side on one machine: llama-server with one API key per tenant (its prompt cache shared by
# every key), the same with `--cache-reuse 256` (chunks reused past a gap), and pagewarden
# `serve` with three tenants, each with one compute thread and a 1,024-token window. Writes the
# reports under OUT (default docs/audit-runs) and prints the audits' summaries.
#
#   scripts/audit-reference-runs.sh LLAMA_SERVER [OUT]
#
# LLAMA_SERVER: a llama-server binary (llama.cpp; docs/audit.md says how it was built).
# Environment: PAGEWARDEN (default target/release/pagewarden), REQUESTS (100), PROBE (300
# samples for pagewarden, LLAMA_PROBE 100 for llama-server: it fails on a clear channel long
# before, and each of its probe requests takes about a second).
set -euo pipefail

llama_server=${1:?usage: $0 LLAMA_SERVER [OUT]}
out=$(realpath -m "${2:-docs/audit-runs}")
pw=$(realpath "${PAGEWARDEN:-target/release/pagewarden}")
requests=${REQUESTS:-100}
probe=${PROBE:-300}
llama_probe=${LLAMA_PROBE:-100}
model=$("$pw" fetch-model | tail -n 1)
work=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$work"' EXIT
mkdir -p "$out"

# llama-server: three keys, one shared prompt cache; 4 slots of 1,024 tokens, one thread.
cat > "$work/llama-tenants.toml" <<EOF
[[tenants]]
name = "alice"
key = "key-alice-0001"
[[tenants]]
name = "bob"
key = "key-bob-0002"
[[tenants]]
name = "carol"
key = "key-carol-0003"
EOF
for port in 8181 8183; do
    reuse=()
    [ "$port" = 8183 ] && reuse=(--cache-reuse 256)
    (cd "$(dirname "$model")" && exec "$llama_server" -m "$(basename "$model")" --host 127.0.0.1 --port "$port" \
        -c 4096 -np 4 -t 1 --api-key key-alice-0001,key-bob-0002,key-carol-0003 --metrics "${reuse[@]}" \
        > "$work/llama-server-$port.log" 2>&1) &
done

# pagewarden serve: three tenants made with `tenant add`, the same window and one thread.
head -c 48 /dev/urandom | base64 > "$work/metrics-token"
chmod 600 "$work/metrics-token"
cat > "$work/pagewarden.toml" <<EOF
threads = 1
context_window = 1024
listen = "127.0.0.1:8182"
[pool]
tokens = 4096
[metrics]
token_file = "$work/metrics-token"
EOF
: > "$work/pw-tenants.toml"
for t in alice bob carol; do
    key=$("$pw" tenant add "$t" --config "$work/pagewarden.toml" | head -n 1)
    printf '[[tenants]]\nname = "%s"\nkey = "%s"\n' "$t" "$key" >> "$work/pw-tenants.toml"
done
"$pw" serve --config "$work/pagewarden.toml" > "$work/serve.log" 2>&1 &

for port in 8181 8182 8183; do
    for _ in $(seq 120); do curl -sf "http://127.0.0.1:$port/health" > /dev/null && break; sleep 1; done
done

"$pw" audit --url http://127.0.0.1:8181 --tenants "$work/llama-tenants.toml" --requests "$requests" \
    --concurrency 8 --seed 1 --timing-probe "$llama_probe" --metrics http://127.0.0.1:8181/metrics \
    --skip-check page-gauges --report "$out/llama-server" > "$out/llama-server.stdout" 2>&1 &
llama_audit=$!
"$pw" audit --url http://127.0.0.1:8183 --tenants "$work/llama-tenants.toml" --requests "$requests" \
    --concurrency 8 --seed 1 --timing-probe "$llama_probe" --metrics http://127.0.0.1:8183/metrics \
    --skip-check page-gauges --report "$out/llama-server-cache-reuse" > "$out/llama-server-cache-reuse.stdout" 2>&1 &
reuse_audit=$!
"$pw" audit --url http://127.0.0.1:8182 --tenants "$work/pw-tenants.toml" --requests "$requests" \
    --concurrency 8 --seed 1 --timing-probe "$probe" --metrics http://127.0.0.1:8182/metrics \
    --metrics-token-file "$work/metrics-token" --report "$out/pagewarden" > "$out/pagewarden.stdout" 2>&1 || true
wait "$llama_audit" || true
wait "$reuse_audit" || true
echo "== llama-server"; cat "$out/llama-server.stdout"
echo "== llama-server --cache-reuse 256"; cat "$out/llama-server-cache-reuse.stdout"
echo "== pagewarden serve"; cat "$out/pagewarden.stdout"
