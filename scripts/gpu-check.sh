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
# One table from the "RESULT ..." lines of the benchmark and, if run, the
# "FLA ..." lines of the reference script (key=value fields).
cat "$LOGDIR/bench.log" "$LOGDIR/peer_bench.log" 2>/dev/null | awk '
function kv(line, key,    i, n, f, p) {
    n = split(line, f, " ")
    for (i = 1; i <= n; i++) { split(f[i], p, "="); if (p[1] == key) return p[2] }
    return ""
}
/^RESULT copy_GBps/ { qcopy = kv($0, "copy_GBps") }
/^FLA copy_GBps/    { fcopy = kv($0, "copy_GBps") }
/^RESULT decode/    { b = kv($0, "B"); qd[b] = kv($0, "us"); qp[b] = kv($0, "pct_copy"); if (!(b in seen)) { seen[b] = 1; order[++nb] = b } }
/^FLA decode/       { b = kv($0, "B"); fd[b] = kv($0, "graph_us"); fp[b] = kv($0, "pct_copy") }
/^RESULT chunked/ && /part=total/ { s = kv($0, "B") "x" kv($0, "T"); qc[s] = kv($0, "ms"); corder[++nc] = s }
/^RESULT chunked/ && /part=(wy|state|out)/ { s = kv($0, "B") "x" kv($0, "T"); parts[s] = parts[s] " " kv($0, "part") "=" kv($0, "ms") }
/^FLA chunked/      { s = kv($0, "B") "x" kv($0, "T"); fc[s] = kv($0, "ms") }
END {
    printf "copy bandwidth GB/s: qdelta run %s, FLA run %s\n", qcopy, fcopy
    printf "%-22s %10s %10s %8s   %s\n", "GDN prefill (BxT)", "qdelta ms", "FLA ms", "ratio", "qdelta parts (ms)"
    for (i = 1; i <= nc; i++) { s = corder[i]
        printf "%-22s %10s %10s %8s  %s\n", s, qc[s], (s in fc) ? fc[s] : "-", (s in fc && fc[s] > 0) ? sprintf("%.2fx", fc[s] / qc[s]) : "-", parts[s] }
    printf "%-22s %10s %10s %8s %8s\n", "GDN decode (B)", "qdelta us", "FLA us", "qd %copy", "FLA %copy"
    for (i = 1; i <= nb; i++) { b = order[i]
        printf "%-22s %10s %10s %8s %8s\n", b, qd[b], (b in fd) ? fd[b] : "-", qp[b], (b in fp) ? fp[b] : "-" }
    print "ratio = FLA time / qdelta time (> 1: qdelta faster); qdelta decode: back-to-back launches, FLA: CUDA-graph replays"
}'
exit $status
