/* Helpers shared by the CUDA tests (include after qd_test.h, only under QD_HAVE_CUDA):
 * device uploads, a CHECK for launcher statuses that prints the CUDA error, and bf16
 * rounding of host inputs (so the CPU reference sees exactly what the GPU reads). */
#ifndef QD_TEST_CUDA_H
#define QD_TEST_CUDA_H

#include <stdint.h>
#include <stdlib.h>

#include "backend/cuda/cuda_gdn.h"
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

#endif
