#include "base/dtype.h"

#include <math.h>

static const struct { const char *name; size_t size; } k_dtypes[QD_DTYPE_COUNT] = {
    [QD_DTYPE_F32] = {"F32", 4},     [QD_DTYPE_BF16] = {"BF16", 2}, [QD_DTYPE_F16] = {"F16", 2},
    [QD_DTYPE_F8_E4M3] = {"F8_E4M3", 1}, [QD_DTYPE_I32] = {"I32", 4}, [QD_DTYPE_I64] = {"I64", 8},
    [QD_DTYPE_U8] = {"U8", 1}, [QD_DTYPE_NVFP4] = {"NVFP4", 0}, [QD_DTYPE_INT4] = {"INT4", 0},
};

size_t qd_dtype_size(qd_dtype t) { return (unsigned)t < QD_DTYPE_COUNT ? k_dtypes[t].size : 0; }
const char *qd_dtype_name(qd_dtype t) { return (unsigned)t < QD_DTYPE_COUNT ? k_dtypes[t].name : "?"; }

int qd_dtype_parse(const char *s) {
    for (int i = 0; i < QD_DTYPE_COUNT; i++) /* size 0: weight formats, not safetensors dtypes */
        if (k_dtypes[i].size > 0 && strcmp(s, k_dtypes[i].name) == 0) return i;
    return -1;
}

float qd_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h >> 15) << 31;
    int exp = (h >> 10) & 0x1f;
    uint32_t mant = h & 0x3ff;
    float f;
    if (exp == 0) {
        f = ldexpf((float)mant, -24);
        return sign ? -f : f;
    }
    uint32_t u;
    if (exp == 31) u = sign | 0x7f800000u | (mant << 13);
    else u = sign | ((uint32_t)(exp - 15 + 127) << 23) | (mant << 13);
    memcpy(&f, &u, 4);
    return f;
}

uint16_t qd_f32_to_f16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000);
    float a = fabsf(f);
    if (isnan(f)) return sign | 0x7e00;
    if (a >= 65520.0f) return sign | 0x7c00;
    if (a < 6.103515625e-05f) { /* subnormal: round to multiple of 2^-24 */
        return sign | (uint16_t)lrintf(a * 16777216.0f);
    }
    int e;
    float m = frexpf(a, &e); /* a = m * 2^e, m in [0.5,1) */
    uint32_t mant = (uint32_t)lrintf((m * 2.0f - 1.0f) * 1024.0f);
    int exp = e - 1 + 15;
    if (mant == 1024) { mant = 0; exp++; }
    if (exp >= 31) return sign | 0x7c00;
    return sign | (uint16_t)(exp << 10) | (uint16_t)mant;
}

void qd_convert_to_f32(qd_dtype t, const void *src, float *dst, size_t n) {
    switch (t) {
    case QD_DTYPE_F32: memcpy(dst, src, n * 4); break;
    case QD_DTYPE_BF16: {
        const uint16_t *s = src;
        for (size_t i = 0; i < n; i++) dst[i] = qd_bf16_to_f32(s[i]);
    } break;
    case QD_DTYPE_F16: {
        const uint16_t *s = src;
        for (size_t i = 0; i < n; i++) dst[i] = qd_f16_to_f32(s[i]);
    } break;
    case QD_DTYPE_F8_E4M3: {
        const uint8_t *s = src;
        for (size_t i = 0; i < n; i++) dst[i] = qd_f8e4m3_to_f32(s[i]);
    } break;
    case QD_DTYPE_I32: {
        const int32_t *s = src;
        for (size_t i = 0; i < n; i++) dst[i] = (float)s[i];
    } break;
    case QD_DTYPE_I64: {
        const int64_t *s = src;
        for (size_t i = 0; i < n; i++) dst[i] = (float)s[i];
    } break;
    case QD_DTYPE_U8: {
        const uint8_t *s = src;
        for (size_t i = 0; i < n; i++) dst[i] = (float)s[i];
    } break;
    default: break;
    }
}

float qd_e2m1_to_f32(uint8_t v) {
    static const float mag[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
    const float m = mag[v & 7];
    return (v & 8) ? -m : m;
}

int64_t qd_e4m3_first_nan(const uint8_t *p, int64_t n) {
    int64_t i = 0;
    /* eight bytes at a time: a byte whose low 7 bits are all set carries into its top bit
     * when 1 is added, and no other byte does (at most 0x7f + 1) */
    for (; i + 8 <= n; i += 8) {
        uint64_t v;
        memcpy(&v, p + i, 8);
        if (((v & 0x7f7f7f7f7f7f7f7full) + 0x0101010101010101ull) & 0x8080808080808080ull) break;
    }
    for (; i < n; i++)
        if ((p[i] & 0x7f) == 0x7f) return i;
    return -1;
}
