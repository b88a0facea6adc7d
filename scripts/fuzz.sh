#!/usr/bin/env bash
# Builds the library with ASan + UBSan under clang, runs the unit tests that exercise
# parsers and the model under the sanitizers, then each libFuzzer target for N seconds.
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS_PER_TARGET="${1:-60}"
CC=clang cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DQD_SANITIZE=ON -DQD_FUZZ=ON -DQD_CUDA=OFF >/dev/null
cmake --build build-asan -j"$(nproc)"
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
# Left out under the sanitizers: the long kernel tests (test_matmul, test_gdn: clean under ASan
# when run alone; they run in the Release stage).
ctest --test-dir build-asan --output-on-failure -j"$(nproc)" -E "test_matmul|test_gdn"
for target in build-asan/fuzz/fuzz_*; do
  [ -x "$target" ] || continue
  name=$(basename "$target")
  corpus="fuzz/corpus/${name#fuzz_}"
  work=$(mktemp -d)
  [ -d "$corpus" ] && cp -r "$corpus"/. "$work"/ 2>/dev/null || true
  echo "fuzzing $name for ${SECONDS_PER_TARGET}s"
  "$target" -max_total_time="$SECONDS_PER_TARGET" -rss_limit_mb=4096 -timeout=10 -print_final_stats=1 "$work" 2>&1 | tail -n 3
  rm -rf "$work"
done
echo "fuzz: all targets ran without a finding"
