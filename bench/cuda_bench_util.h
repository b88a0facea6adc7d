/* Helpers shared by the CUDA kernel benchmarks (bench/<kernel>_cuda_bench.c): fail-fast
 * status checks, a fixed-seed xorshift RNG, device uploads, medians, and the copy
 * bandwidth every result is compared with. Define BENCH_NAME before including. */
#ifndef QD_CUDA_BENCH_UTIL_H
#define QD_CUDA_BENCH_UTIL_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include <cuda_runtime_api.h>

#include "backend/cuda/cuda_gdn.h"
#include "backend/cuda/cuda_device.h"
#include "base/dtype.h"

static inline int bench_failed(qd_status s, const char *what) {
    if (s == QD_OK) return 0;
    fprintf(stderr, BENCH_NAME ": %s: %s (%s)\n", what, qd_status_name(s), qd_cuda_last_error());
    return 1;
}
#define TRY(call)                                  \
    do {                                           \
        if (bench_failed((call), #call)) exit(1);  \
    } while (0)

static uint64_t rng_state = 0x2545f4914f6cdd1dull;
static inline uint64_t next_u64(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}
static inline float urand(void) { /* [-1, 1) */
    return (float)((next_u64() >> 40) * (1.0 / 16777216.0) * 2.0 - 1.0);
}

/* A device copy of h (uninitialised memory when h is NULL); exits on failure. */
static inline void *upload(const void *h, size_t bytes) {
    void *d;
    TRY(qd_cuda_malloc(&d, bytes));
    if (h) TRY(qd_cuda_memcpy_h2d(d, h, bytes));
    return d;
}

static inline int cmp_float(const void *a, const void *b) {
    const float x = *(const float *)a, y = *(const float *)b;
    return x < y ? -1 : x > y;
}
static inline float median(float *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_float);
    return v[n / 2];
}

/* Call i of a graph a benchmark times (its arguments in ctx, the stream too). */
typedef qd_status (*bench_call_fn)(void *ctx, int i);

/* Microseconds per call of a CUDA graph of ncalls calls f(ctx, 0 .. ncalls - 1) captured on
 * stream (a created one), how the engine runs a decode step: replayed in samples of at least
 * 2 ms, the median of 5 after warm-up. -1 when the path does not take the shape (a call
 * returned QD_ERR_UNSUPPORTED); any other failure exits. */
static inline double bench_graph_us(void *stream, bench_call_fn f, void *ctx, int ncalls) {
    cudaStream_t s = (cudaStream_t)stream;
    TRY(qd_cuda_graph_begin(stream));
    qd_status st = QD_OK;
    for (int i = 0; i < ncalls && !st; i++) st = f(ctx, i);
    void *exec = NULL;
    const qd_status se = qd_cuda_graph_end(stream, &exec);
    if (st == QD_ERR_UNSUPPORTED) {
        if (exec) qd_cuda_graph_destroy(exec);
        return -1;
    }
    TRY(st);
    TRY(se);
    cudaEvent_t e0, e1;
    if (cudaEventCreate(&e0) != cudaSuccess || cudaEventCreate(&e1) != cudaSuccess) exit(1);
    for (int i = 0; i < 2; i++) TRY(qd_cuda_graph_launch(exec, stream));
    float ms1 = 0;
    cudaEventRecord(e0, s);
    TRY(qd_cuda_graph_launch(exec, stream));
    cudaEventRecord(e1, s);
    cudaEventSynchronize(e1);
    cudaEventElapsedTime(&ms1, e0, e1);
    int reps = ms1 > 0 ? (int)(2.0 / ms1) + 1 : 50; /* a sample of >= 2 ms */
    if (reps > 200) reps = 200;
    float ms[5];
    for (int r = 0; r < 5; r++) {
        cudaEventRecord(e0, s);
        for (int i = 0; i < reps; i++) TRY(qd_cuda_graph_launch(exec, stream));
        cudaEventRecord(e1, s);
        if (cudaEventSynchronize(e1) != cudaSuccess) {
            fprintf(stderr, BENCH_NAME ": replay failed: %s\n", cudaGetErrorString(cudaGetLastError()));
            exit(1);
        }
        cudaEventElapsedTime(&ms[r], e0, e1);
    }
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    qd_cuda_graph_destroy(exec);
    return median(ms, 5) * 1e3 / ((double)reps * ncalls);
}

/* Device copy bandwidth (bytes read + written), as `qdelta bench` measures it. */
static inline double copy_bw(void) {
    double g = 0;
    TRY(qd_cuda_copy_gbps((size_t)1 << 30, &g));
    return g;
}

#endif
