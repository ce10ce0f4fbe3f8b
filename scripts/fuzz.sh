#!/usr/bin/env bash
# Every fuzz target under libFuzzer, built with the instrumentation `cargo fuzz` uses but with
# plain cargo and the machine's one stable toolchain (nothing to install).
#
#   scripts/fuzz.sh [--time SECONDS | --runs N] [--asan] [--jobs J] [TARGET ...]
#
#   --time S   each target runs S seconds (default 30: the short budget CI runs)
#   --runs N   each target runs N executions (the long run: --runs 10000000)
#   --asan     AddressSanitizer too (RUSTC_BOOTSTRAP=1 unlocks -Zsanitizer on stable)
#   --jobs J   run J targets at once (default 1)
#
# Each target starts from its seeds (fuzz/seeds/TARGET) and the corpus it grew before
# (fuzz/corpus/TARGET, not committed). A crash stops that target with exit 1 and leaves its
# input under fuzz/artifacts/TARGET; the script exits non-zero if any target failed. The last
# line of each target's log says how many executions it ran: "Done N runs in S second(s)".
set -euo pipefail
cd "$(dirname "$0")/../fuzz"

time_s=30 runs="" asan=0 jobs=1 targets=()
while [ $# -gt 0 ]; do
  case "$1" in
    --time) time_s=$2; shift 2 ;;
    --runs) runs=$2; shift 2 ;;
    --asan) asan=1; shift ;;
    --jobs) jobs=$2; shift 2 ;;
    -h|--help) sed -n '2,16p' "$0"; exit 0 ;;
    -*) echo "unknown option $1" >&2; exit 2 ;;
    *) targets+=("$1"); shift ;;
  esac
done
all=$(sed -n 's/^name = "\(.*\)"$/\1/p' Cargo.toml | grep -v '^pagewarden-fuzz$')
[ ${#targets[@]} -gt 0 ] || mapfile -t targets <<<"$all"
for t in "${targets[@]}"; do
  grep -qx "$t" <<<"$all" || { echo "no fuzz target named $t (have: $(echo $all))" >&2; exit 2; }
done

# The flags of cargo-fuzz's build: coverage counters, comparison tracing, `cfg(fuzzing)`,
# debug assertions and overflow checks on in an optimised build.
flags="-Cpasses=sancov-module -Cllvm-args=-sanitizer-coverage-level=4"
flags+=" -Cllvm-args=-sanitizer-coverage-inline-8bit-counters -Cllvm-args=-sanitizer-coverage-pc-table"
flags+=" -Cllvm-args=-sanitizer-coverage-trace-compares --cfg fuzzing -Cdebug-assertions -Coverflow-checks"
target_dir=target/plain
if [ "$asan" = 1 ]; then
  flags+=" -Zsanitizer=address"
  export RUSTC_BOOTSTRAP=1
  target_dir=target/asan
fi
triple=$(rustc -vV | sed -n 's/^host: //p')
# --target keeps build scripts and proc macros uninstrumented, as cargo-fuzz does.
RUSTFLAGS="$flags" cargo build --release --locked --target "$triple" --target-dir "$target_dir" \
  $(printf -- '--bin %s ' "${targets[@]}")
bin=$target_dir/$triple/release

limit=(-max_total_time="$time_s")
[ -n "$runs" ] && limit=(-runs="$runs")
mkdir -p logs
run_one() {
  local t=$1
  mkdir -p "corpus/$t" "artifacts/$t" "seeds/$t"
  local log=logs/$t.log
  if "$bin/$t" "${limit[@]}" -rss_limit_mb=4096 -max_len=65536 -print_final_stats=1 \
      -artifact_prefix="artifacts/$t/" "corpus/$t" "seeds/$t" >"$log" 2>&1; then
    echo "$t: ok, $(grep -o 'Done [0-9]* runs in [0-9]* second(s)' "$log" | tail -1)"
  else
    echo "$t: FAILED (log: fuzz/$log)"; tail -40 "$log"; return 1
  fi
}
failed=0 pids=()
for t in "${targets[@]}"; do
  if [ "$jobs" -le 1 ]; then
    run_one "$t" || failed=1
  else
    run_one "$t" & pids+=($!)
    while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do sleep 1; done
  fi
done
for p in "${pids[@]}"; do wait "$p" || failed=1; done
exit $failed
