#!/usr/bin/env bash
# Runs every fuzz target for SECONDS each (default 30), one after the other, and fails on the
# first crash (libFuzzer's exit status). Usage:
#
#   fuzz/run.sh [SECONDS] [TARGET...]
#
# Stable Rust is enough: libFuzzer's instrumentation is plain `-C` codegen flags (what
# cargo-fuzz passes). FUZZ_ASAN=1 adds AddressSanitizer, which needs `-Zsanitizer` and so
# RUSTC_BOOTSTRAP=1 on a stable toolchain (the decoders are safe Rust: coverage alone finds
# their panics). FUZZ_WRITE_CORPUS=1 keeps what a run finds in fuzz/corpus/TARGET (for the
# recorded runs); otherwise new inputs go to a temporary directory and the committed corpus is
# only read. Crashing inputs land in fuzz/artifacts/TARGET/.
set -euo pipefail
cd "$(dirname "$0")"

secs=${1:-30}
shift || true
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  targets=(frame hello request target)
fi

triple=$(rustc -vV | sed -n 's/^host: //p')
flags="-Cpasses=sancov-module -Cllvm-args=-sanitizer-coverage-level=4"
flags+=" -Cllvm-args=-sanitizer-coverage-inline-8bit-counters"
flags+=" -Cllvm-args=-sanitizer-coverage-pc-table"
flags+=" -Cllvm-args=-sanitizer-coverage-trace-compares"
flags+=" --cfg fuzzing -Cdebug-assertions -Coverflow-checks"
if [ "${FUZZ_ASAN:-0}" = 1 ]; then
  export RUSTC_BOOTSTRAP=1
  flags+=" -Zsanitizer=address"
fi
# --target keeps the flags off build scripts and proc macros (as cargo-fuzz does).
RUSTFLAGS="$flags" cargo build --release --locked --target "$triple" --bins \
  ${targets[@]/#/--bin }
bin="target/$triple/release"

scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
for t in "${targets[@]}"; do
  mkdir -p "corpus/$t" "artifacts/$t"
  if [ "${FUZZ_WRITE_CORPUS:-0}" = 1 ]; then
    dirs=("corpus/$t")
  else
    mkdir -p "$scratch/$t"
    dirs=("$scratch/$t" "corpus/$t")
  fi
  echo "==> fuzzing $t for ${secs}s"
  TIMEFORMAT="cpu::$t: %R s wall, %U s user, %S s system"
  rc=0
  time "$bin/$t" -max_total_time="$secs" -max_len=4096 -timeout=10 -rss_limit_mb=1024 \
    -print_final_stats=1 -artifact_prefix="artifacts/$t/" "${dirs[@]}" 2>"$scratch/$t.log" || rc=$?
  if [ "$rc" != 0 ]; then
    tail -40 "$scratch/$t.log"
    echo "fuzz target $t FAILED: the crashing input is in fuzz/artifacts/$t/" >&2
    exit 1
  fi
  grep -E '^stat::number_of_executed_units|^stat::new_units_added|^#[0-9]+.*DONE' "$scratch/$t.log" || true
  echo "corpus/$t: $(find "corpus/$t" -type f | wc -l) inputs"
done
echo "fuzzing: ${#targets[@]} targets, ${secs}s each, no crash"
