/* Storage dtypes and scalar conversions (bf16, f16, f8 e4m3, fp4 e2m1 -> f32). */
#ifndef QD_BASE_DTYPE_H
#define QD_BASE_DTYPE_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "base/hostdev.h"

typedef enum qd_dtype {
    QD_DTYPE_F32 = 0,
    QD_DTYPE_BF16,
    QD_DTYPE_F16,
    QD_DTYPE_F8_E4M3,
    QD_DTYPE_I32,
    QD_DTYPE_I64,
    QD_DTYPE_U8,
    /* weight formats with no safetensors spelling of their own: two 4-bit values per byte
     * (base/weight.h gives their layouts); qd_dtype_size is 0, qd_weight_bytes sizes them */
    QD_DTYPE_NVFP4,
    QD_DTYPE_INT4,
    QD_DTYPE_COUNT
} qd_dtype;

size_t qd_dtype_size(qd_dtype t);
const char *qd_dtype_name(qd_dtype t);           /* safetensors spelling: "BF16" */
/* Parses a safetensors dtype string; returns -1 when unknown. */
int qd_dtype_parse(const char *s);

QD_HD float qd_bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* Round to nearest even; NaN stays NaN. */
QD_HD uint16_t qd_f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

float qd_f16_to_f32(uint16_t h);
uint16_t qd_f32_to_f16(float f);
/* OCP FP8 E4M3 (fn): bias 7, no infinities, 0x7f / 0xff are NaN. A normal code's exponent
 * and mantissa become an fp32's directly (exponent rebiased by 120); subnormals are
 * mant * 2^-9, exact in fp32. Inline: the CPU backend's FP8 products decode every weight
 * through here. */
QD_HD float qd_f8e4m3_to_f32(uint8_t v) {
    const uint32_t exp = (v >> 3) & 0xfu, mant = v & 0x7u;
    uint32_t bits;
    if (exp == 0xf && mant == 0x7) bits = 0x7fc00000u; /* NaN */
    else if (exp == 0) {
        const float f = (float)mant * 0x1p-9f;
        memcpy(&bits, &f, 4);
    } else {
        bits = ((exp + 120u) << 23) | (mant << 20);
    }
    bits |= (uint32_t)(v & 0x80) << 24;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}
/* FP4 E2M1 (the low 4 bits of v): sign, 2 exponent bits (bias 1), 1 mantissa bit; the
 * values 0, 0.5, 1, 1.5, 2, 3, 4, 6 and their negatives. */
float qd_e2m1_to_f32(uint8_t v);

/* The index of the first e4m3 NaN code (0x7f, 0xff) among the n bytes at p, or -1.
 * Checkpoint loaders refuse such weights: no quantizer writes one, and the tensor-core
 * kernels decode the codes as +-480 rather than NaN. */
int64_t qd_e4m3_first_nan(const uint8_t *p, int64_t n);

/* Converts n elements of `src` (dtype t) to float. */
void qd_convert_to_f32(qd_dtype t, const void *src, float *dst, size_t n);

#endif
