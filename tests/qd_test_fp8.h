/* FP8 e4m3 on the host for the CUDA tests' references: the nearest code and the 1 x 128
 * activation quantization of the W8A8 kernels (qd_cuda_fp8_quant_act), bit for bit. */
#ifndef QD_TEST_FP8_H
#define QD_TEST_FP8_H

#include <math.h>
#include <stdint.h>

#include "base/dtype.h"

/* The nearest e4m3 code of v (ties to the even code), saturating at +-448. */
static inline uint8_t qd_test_e4m3(float v) {
    const uint8_t sign = signbit(v) ? 0x80 : 0;
    const float a = fabsf(v);
    int best = 0;
    double bd = INFINITY;
    for (int c = 0; c <= 0x7e; c++) {
        const double d = fabs((double)qd_f8e4m3_to_f32((uint8_t)c) - (double)a);
        if (d < bd || (d == bd && (c & 1) == 0)) {
            bd = d;
            best = c;
        }
    }
    return (uint8_t)(sign | best);
}

/* One row of C values in blocks of bw columns: s = amax / 448 (1 for an all-zero block),
 * q = e4m3(x / s), each step a correctly rounded fp32 operation as on the device; deq[c]
 * (when not NULL) = e4m3(q) * s, the value the GEMM multiplies. */
static inline void qd_test_quant_row(const float *x, int64_t C, int64_t bw, uint8_t *q, float *s, float *deq) {
    for (int64_t b = 0; b * bw < C; b++) {
        float a = 0;
        for (int64_t c = b * bw; c < (b + 1) * bw && c < C; c++) a = fmaxf(a, fabsf(x[c]));
        const float sb = a > 0 ? a / 448.0f : 1.0f;
        if (s) s[b] = sb;
        for (int64_t c = b * bw; c < (b + 1) * bw && c < C; c++) {
            const uint8_t code = qd_test_e4m3(x[c] / sb);
            if (q) q[c] = code;
            if (deq) deq[c] = qd_f8e4m3_to_f32(code) * sb;
        }
    }
}

#endif
