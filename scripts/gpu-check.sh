#!/usr/bin/env bash
# GPU check for the CUDA backend, run on a machine with an NVIDIA Hopper GPU:
# builds with -gencode=arch=compute_90a,code=sm_90a, runs the CUDA tests and
# the benchmarks, writes logs under $LOGDIR (default $OUT, else build-gpu/logs)
# and prints a short table last.
#   scripts/gpu-check.sh            build, test, bench
#   PEER_BENCH=path/to/script.py    also run a reference timing script (e.g. FLA), if given
# Without the library's system dependencies (jansson, pcre2, utf8proc) the
# full CMake build cannot configure; then only the GDN pieces are built
# directly with nvcc and gcc, which is all the CUDA tests and benchmark need.
set -uo pipefail
cd "$(dirname "$0")/.."
LOGDIR=${LOGDIR:-${OUT:-$PWD/build-gpu/logs}}
BUILD=${BUILD:-build-gpu}
mkdir -p "$LOGDIR" "$BUILD"
GENCODE="-gencode=arch=compute_90a,code=sm_90a"
status=0

nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv >"$LOGDIR/gpu.txt" 2>&1
echo "commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown), $(date -u '+%Y-%m-%d %H:%M UTC')" >>"$LOGDIR/gpu.txt"

if [ -z "${QD_DIRECT_BUILD:-}" ] && cmake -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DQD_NATIVE=OFF -DCMAKE_CUDA_ARCHITECTURES=OFF \
      "-DCMAKE_CUDA_FLAGS=$GENCODE" >"$LOGDIR/configure.log" 2>&1; then
    cmake --build "$BUILD" -j"$(nproc)" >"$LOGDIR/build.log" 2>&1 || { echo "build failed"; tail -30 "$LOGDIR/build.log"; exit 1; }
    TEST_BIN="$BUILD/tests/test_cuda_gdn"
    BENCH_BIN="$BUILD/gdn_cuda_bench"
else
    echo "full CMake configure failed (see configure.log); building the GDN pieces directly"
    set -e
    objs=()
    for f in src/backend/cuda/*.cu; do
        o="$BUILD/$(basename "$f" .cu).o"
        nvcc $GENCODE -O3 -std=c++17 -Isrc -Iinclude -Xcompiler=-Wall,-Wextra -c "$f" -o "$o" 2>>"$LOGDIR/build.log"
        objs+=("$o")
    done
    for f in src/backend/cpu/gdn.c src/base/threadpool.c src/base/err.c; do
        o="$BUILD/$(basename "$f" .c).o"
        gcc -std=c11 -O2 -march=native -D_GNU_SOURCE -DQD_HAVE_CUDA=1 -Isrc -Iinclude -Wall -Wextra -Wno-unused-parameter \
            -c "$f" -o "$o" 2>>"$LOGDIR/build.log"
        objs+=("$o")
    done
    CUDA_LIB=$(dirname "$(command -v nvcc)")/../lib64
    for t in tests/test_cuda_gdn.c bench/gdn_cuda_bench.c; do
        gcc -std=c11 -O2 -D_GNU_SOURCE -DQD_HAVE_CUDA=1 -Isrc -Iinclude -Itests -Wall -Wextra -Wno-unused-parameter \
            "$t" "${objs[@]}" -L"$CUDA_LIB" -lcudart -lstdc++ -lpthread -lm -o "$BUILD/$(basename "$t" .c)" \
            2>>"$LOGDIR/build.log"
    done
    set +e
    TEST_BIN="$BUILD/test_cuda_gdn"
    BENCH_BIN="$BUILD/gdn_cuda_bench"
fi
grep -i "warning" "$LOGDIR/build.log" | head -5

echo "== tests"
QD_TEST_SEED=${QD_TEST_SEED:-$(date +%s)} "$TEST_BIN" >"$LOGDIR/test_cuda_gdn.log" 2>&1
trc=$?
tail -4 "$LOGDIR/test_cuda_gdn.log"
[ $trc -eq 0 ] || { status=1; grep -m5 "CHECK failed" "$LOGDIR/test_cuda_gdn.log"; }

echo "== benchmark"
"$BENCH_BIN" >"$LOGDIR/bench.log" 2>&1 || status=1
if [ -n "${PEER_BENCH:-}" ]; then
    PYTHONUNBUFFERED=1 python3 "$PEER_BENCH" >"$LOGDIR/peer_bench.log" 2>&1 || { status=1; tail -5 "$LOGDIR/peer_bench.log"; }
fi

echo "== summary: $(sed -n 2p "$LOGDIR/gpu.txt" | cut -d, -f1), $(tail -1 "$LOGDIR/gpu.txt")"
echo "test_cuda_gdn: $( [ $trc -eq 0 ] && echo PASS || echo "FAIL (rc $trc)")"
grep -h -E "^(RESULT|FLA) " "$LOGDIR/bench.log" "$LOGDIR/peer_bench.log" 2>/dev/null | sed 's/^RESULT /qdelta /'
exit $status
