/* Helpers shared by the CUDA kernel benchmarks (bench/<kernel>_cuda_bench.c): fail-fast
 * status checks, a fixed-seed xorshift RNG, device uploads, medians, and the copy
 * bandwidth every result is compared with. Define BENCH_NAME before including. */
#ifndef QD_CUDA_BENCH_UTIL_H
#define QD_CUDA_BENCH_UTIL_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

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

/* Device copy bandwidth (bytes read + written), as `qdelta bench` measures it. */
static inline double copy_bw(void) {
    double g = 0;
    TRY(qd_cuda_copy_gbps((size_t)1 << 30, &g));
    return g;
}

#endif
