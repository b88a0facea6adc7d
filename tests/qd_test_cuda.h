/* Helpers shared by the CUDA tests (include after qd_test.h, only under QD_HAVE_CUDA):
 * device uploads, a CHECK for launcher statuses that prints the CUDA error, and bf16
 * rounding of host inputs (so the CPU reference sees exactly what the GPU reads). */
#ifndef QD_TEST_CUDA_H
#define QD_TEST_CUDA_H

#include <stdint.h>
#include <stdlib.h>

#include "backend/cuda/cuda_gdn.h"
#include "backend/cuda/cuda_device.h"
#include "base/dtype.h"

/* A device copy of h (bytes), or uninitialised device memory when h is NULL; NULL on failure. */
static inline void *qd_test_dev_upload(const void *h, size_t bytes) {
    void *d = NULL;
    if (qd_cuda_malloc(&d, bytes)) return NULL;
    if (h && qd_cuda_memcpy_h2d(d, h, bytes)) {
        qd_cuda_free(d);
        return NULL;
    }
    return d;
}

/* CHECK that a qd_status call succeeded, naming the call and the CUDA error. */
#define ST_OK(call)                                                                             \
    do {                                                                                        \
        qd_status s_ = (call);                                                                  \
        CHECKF(s_ == QD_OK, "%s -> %s: %s", #call, qd_status_name(s_), qd_cuda_last_error());   \
    } while (0)

/* Rounds x to bf16 in place and returns the bit patterns (malloc'd; NULL on OOM). */
static inline uint16_t *qd_test_round_bf16(float *x, size_t n) {
    uint16_t *b = (uint16_t *)malloc(n * sizeof *b + 2);
    if (!b) return NULL;
    for (size_t i = 0; i < n; i++) {
        b[i] = qd_f32_to_bf16(x[i]);
        x[i] = qd_bf16_to_f32(b[i]);
    }
    return b;
}

/* n normal random floats times scale (4 spare bytes past the end, for vector reads). */
static inline float *qd_test_rnd(qd_test_rng *rng, size_t n, float scale) {
    float *x = malloc(n * sizeof(float) + 4);
    if (x)
        for (size_t i = 0; i < n; i++) x[i] = qd_test_normal(rng) * scale;
    CHECK(x != NULL);
    return x;
}

/* A device copy of h, or poisoned device memory when h is NULL (0xff: NaN as fp32 and
 * bf16, -1 as int32), so that an element a kernel fails to write shows. */
static inline void *qd_test_dev(const void *h, size_t bytes) {
    void *d = qd_test_dev_upload(h, bytes);
    CHECK(d != NULL);
    if (d && !h) CHECK(qd_cuda_memset(d, 0xff, bytes) == QD_OK);
    return d;
}

/* A host copy of device memory, after the device is idle (4 spare bytes). */
static inline void *qd_test_host(const void *d, size_t bytes) {
    void *h = malloc(bytes + 4);
    CHECK(h != NULL && qd_cuda_sync() == QD_OK);
    CHECK(h != NULL && qd_cuda_memcpy_d2h(h, d, bytes) == QD_OK);
    return h;
}

#endif
