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
# Left out under the sanitizers (each runs in the Release stage): the long kernel tests
# (test_matmul, test_gdn: clean under ASan when run alone), the statistical test of
# speculative sampling (test_spec_accept: thousands of seeded draws, six minutes under ASan;
# test_spec_sampling and test_spec_engine run the same code here), and the numeric checks of
# whole models against their references (test_batch_invariant, test_default_model,
# test_default_mtp: two to four minutes each under ASan; the same forward, loader and MTP
# code runs here in test_golden, test_equivalence, test_mtp and the engine tests). The
# randomized differential tests run a quarter of their rounds here (QD_TEST_ROUNDS).
ctest --test-dir build-asan --output-on-failure -j"$(nproc)" \
    -E "test_matmul|test_gdn|test_spec_accept|test_batch_invariant|test_default_model|test_default_mtp"
# A harness finds its data in the repository from any working directory, and one that
# cannot load it fails rather than fuzzing nothing.
# (Loading nothing, fuzz_tokenizer used to cover 3 edges; with the tokenizer, 20 runs
# reach over a hundred.)
root=$PWD
cov=$(cd / && "$root/build-asan/fuzz/fuzz_tokenizer" -runs=20 2>&1 | sed -n 's/.*DONE *cov: \([0-9]*\).*/\1/p' || true)
if [ -z "$cov" ] || [ "$cov" -lt 50 ]; then
  echo "fuzz: fuzz_tokenizer run from / covers ${cov:-no} edges: it did not load its tokenizer" >&2; exit 1
fi
if QD_TOKENIZER=/nonexistent/tokenizer.json build-asan/fuzz/fuzz_tokenizer -runs=1 >/dev/null 2>&1; then
  echo "fuzz: fuzz_tokenizer exits 0 without its tokenizer" >&2; exit 1
fi
for target in build-asan/fuzz/fuzz_*; do
  [ -x "$target" ] || continue
  name=$(basename "$target")
  corpus="fuzz/corpus/${name#fuzz_}"
  work=$(mktemp -d)
  [ -d "$corpus" ] && cp -r "$corpus"/. "$work"/ 2>/dev/null || true
  echo "fuzzing $name for ${SECONDS_PER_TARGET}s"
  # a finding's report and its input go to the log (the checkout may be a temporary copy)
  rc=0
  "$target" -max_total_time="$SECONDS_PER_TARGET" -rss_limit_mb=4096 -timeout=10 -print_final_stats=1 \
    -artifact_prefix="$work/" "$work" >"$work.log" 2>&1 || rc=$?
  if [ "$rc" != 0 ]; then
    grep -v -E '^#[0-9]+' "$work.log" | tail -n 60
    for a in "$work"/crash-* "$work"/leak-* "$work"/oom-* "$work"/timeout-*; do
      [ -f "$a" ] && { echo "input $(basename "$a") (base64):"; base64 -w 0 "$a"; echo; }
    done
    echo "fuzz: $name exited $rc" >&2
    exit "$rc"
  fi
  tail -n 3 "$work.log"
  rm -rf "$work" "$work.log"
done
echo "fuzz: all targets ran without a finding"
