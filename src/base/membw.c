#include "base/membw.h"
#include "base/clock.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#if defined(__AVX2__)
#include <immintrin.h>
#endif

typedef struct bw_job {
    const unsigned char *src;
    unsigned char *dst;
    size_t bytes;
    int parts;
    double sink[64]; /* per-part results, so the reads cannot be optimised away */
} bw_job;

static void part_range(const bw_job *j, int64_t p, size_t *b, size_t *e) {
    /* 4 KiB-aligned boundaries so no two threads share a page or cache line. */
    size_t pages = j->bytes / 4096;
    *b = pages * (size_t)p / (size_t)j->parts * 4096;
    *e = p == j->parts - 1 ? j->bytes : pages * (size_t)(p + 1) / (size_t)j->parts * 4096;
}

static void read_part(void *user, int64_t begin, int64_t end, int worker) {
    (void)worker;
    bw_job *j = user;
    for (int64_t p = begin; p < end; p++) {
        size_t b, e;
        part_range(j, p, &b, &e);
        double s = 0;
#if defined(__AVX2__)
        /* Four independent accumulators: the adds must not be the bottleneck. */
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        size_t i = b;
        for (; i + 128 <= e; i += 128) {
            a0 = _mm256_add_ps(a0, _mm256_load_ps((const float *)(j->src + i)));
            a1 = _mm256_add_ps(a1, _mm256_load_ps((const float *)(j->src + i + 32)));
            a2 = _mm256_add_ps(a2, _mm256_load_ps((const float *)(j->src + i + 64)));
            a3 = _mm256_add_ps(a3, _mm256_load_ps((const float *)(j->src + i + 96)));
        }
        _Alignas(32) float t[8];
        _mm256_store_ps(t, _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
        for (int k = 0; k < 8; k++) s += t[k];
        for (; i + 8 <= e; i += 8) {
            uint64_t v;
            memcpy(&v, j->src + i, 8);
            s += (double)v;
        }
#else
        uint64_t u0 = 0, u1 = 0, u2 = 0, u3 = 0;
        size_t i = b;
        for (; i + 32 <= e; i += 32) {
            uint64_t v[4];
            memcpy(v, j->src + i, 32);
            u0 += v[0]; u1 += v[1]; u2 += v[2]; u3 += v[3];
        }
        s = (double)(u0 + u1 + u2 + u3);
#endif
        j->sink[p & 63] += s;
    }
}

static void copy_part(void *user, int64_t begin, int64_t end, int worker) {
    (void)worker;
    bw_job *j = user;
    for (int64_t p = begin; p < end; p++) {
        size_t b, e;
        part_range(j, p, &b, &e);
        memcpy(j->dst + b, j->src + b, e - b);
    }
}

/* Pages are touched in parallel first so they are mapped (and, on NUMA machines,
 * local to the threads that read them) before timing. */
static void fill_part(void *user, int64_t begin, int64_t end, int worker) {
    (void)worker;
    bw_job *j = user;
    for (int64_t p = begin; p < end; p++) {
        size_t b, e;
        part_range(j, p, &b, &e);
        memset((unsigned char *)j->src + b, 1, e - b);
        if (j->dst) memset(j->dst + b, 0, e - b);
    }
}

static double measure(qd_threadpool *pool, size_t bytes, int copy) {
    if (bytes < (1u << 20)) bytes = 1u << 20;
    bytes &= ~(size_t)4095;
    unsigned char *src = aligned_alloc(4096, bytes);
    unsigned char *dst = copy ? aligned_alloc(4096, bytes) : NULL;
    if (!src || (copy && !dst)) {
        free(src);
        free(dst);
        return 0.0;
    }
    int parts = qd_threadpool_size(pool);
    if (parts > 64) parts = 64;
    bw_job job;
    memset(&job, 0, sizeof job);
    job.src = src;
    job.dst = dst;
    job.bytes = bytes;
    job.parts = parts;
    qd_parallel_for(pool, parts, 1, fill_part, &job);
    double best = 0;
    for (int rep = 0; rep < 5; rep++) {
        double t0 = qd_clock_seconds();
        qd_parallel_for(pool, parts, 1, copy ? copy_part : read_part, &job);
        double dt = qd_clock_seconds() - t0;
        if (dt > 0 && (double)bytes / dt > best) best = (double)bytes / dt;
    }
    free(src);
    free(dst);
    return best * 1e-9;
}

double qd_measure_read_gbps(qd_threadpool *pool, size_t bytes) { return measure(pool, bytes, 0); }
double qd_measure_copy_gbps(qd_threadpool *pool, size_t bytes) { return measure(pool, bytes, 1); }

double qd_measure_memcpy_gbps(size_t bytes, int n_threads) {
    qd_threadpool *pool = qd_threadpool_create(n_threads);
    /* Without a pool, measure on this thread alone rather than fail. */
    double g = qd_measure_read_gbps(pool, bytes);
    qd_threadpool_free(pool);
    return g;
}
