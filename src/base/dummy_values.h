/* The values of --load-format dummy and the roundings of quantization at load, defined once
 * for the host (model_dummy.c, model_quant_online.c) and the device (a CUDA backend draws
 * dummy weights in place, bf16 or quantized): the two must give the same bytes, so every
 * operation here is exactly rounded (no division approximations, no contraction that
 * changes a result).
 *
 * A dummy matrix of n elements is cut into blocks of 4096; block b has its own splitmix64
 * stream seeded from seed ^ (b * 0xd1b54a32d192ed03), and element i is the (i % 4096 + 1)-th
 * output of its block's stream: u in [-1, 1) from its top 24 bits, the value bf16(u * scale).
 * splitmix64's state advances by a constant, so any element is computed on its own. */
#ifndef QD_BASE_DUMMY_VALUES_H
#define QD_BASE_DUMMY_VALUES_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "base/dtype.h"
#include "base/hostdev.h"

#define QD_DUMMY_BLOCK 4096

QD_HD uint64_t qd_dummy_mix(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* u * scale rounded to bf16 (nearest even), as a float: the dummy element i. */
QD_HD float qd_dummy_value(uint64_t seed, float scale, int64_t i) {
    const uint64_t s = seed ^ ((uint64_t)(i / QD_DUMMY_BLOCK) * 0xd1b54a32d192ed03ull);
    const uint64_t z = s + (uint64_t)(i % QD_DUMMY_BLOCK + 1) * 0x9e3779b97f4a7c15ull;
    const float u = (float)((double)(qd_dummy_mix(z) >> 40) * (1.0 / 16777216.0)) * 2.0f - 1.0f;
    return qd_bf16_to_f32(qd_f32_to_bf16(u * scale));
}

/* The nearest e4m3 code (ties to the even code), saturating at 448: normals by rounding the
 * fp32 mantissa to 3 bits (a carry moves to the exponent, as the code order wants),
 * subnormals (below 2^-6) as multiples of 2^-9. Bit for bit the nearest value of the e4m3
 * table (checked over every code's midpoints and 2e8 random floats). x is finite. */
QD_HD uint8_t qd_round_e4m3(float x) {
    uint32_t b;
    memcpy(&b, &x, 4);
    const uint8_t sign = (uint8_t)((b >> 24) & 0x80);
    b &= 0x7fffffffu;
    float a;
    memcpy(&a, &b, 4);
    if (!(a < 448.0f)) return sign | 126;
    if (a < 0.015625f) return sign | (uint8_t)lrintf(a * 512.0f);
    uint32_t code = ((b + 0x7ffffu + ((b >> 20) & 1u)) >> 20) - (120u << 3);
    if (code > 126) code = 126;
    return sign | (uint8_t)code;
}

/* An FP8 block's scale from its amax (amax / 448; 1 for an all-zero block). */
QD_HD float qd_fp8_block_scale(float amax) { return amax > 0 ? amax / 448.0f : 1.0f; }

/* Symmetric INT4 (zero point 8): a group's scale from its amax, and a value's code. */
QD_HD float qd_int4_group_scale(float amax) { return amax > 0 ? amax / 7.0f : 1.0f; }
QD_HD uint8_t qd_round_int4(float v, float scale) {
    long q = lrintf(v / scale) + 8;
    return (uint8_t)(q < 0 ? 0 : q > 15 ? 15 : q);
}

/* NVFP4 (spec 8): a matrix's global factor from its amax (1 for an all-zero matrix), the
 * e4m3 scale code of a 16-column block from the block's amax (never 0: an all-zero block
 * stays zero with the smallest step), and the nearest e2m1 code of a value over its block's
 * effective scale (ties to the smaller magnitude; sign bit 8). */
QD_HD float qd_nvfp4_global(float amax) { return amax > 0 ? amax / (448.0f * 6.0f) : 1.0f; }
QD_HD uint8_t qd_nvfp4_block_code(float amax, float global) {
    const uint8_t sc = qd_round_e4m3(amax / 6.0f / global);
    return sc ? sc : 1;
}
QD_HD uint8_t qd_round_e2m1(float x) {
    const float grid[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
    const uint8_t sign = x < 0 ? 8 : 0;
    const float a = fabsf(x);
    int best = 0;
    for (int i = 1; i < 8; i++)
        if (fabsf(a - grid[i]) < fabsf(a - grid[best])) best = i;
    return sign | (uint8_t)best;
}

#endif
