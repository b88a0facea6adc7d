/* Sizes and the exact dequantization of the canonical weight layouts (weight.h). */
#include "base/weight.h"

static int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

size_t qd_weight_data_bytes(const qd_weight *w) {
    const size_t n = (size_t)(w->rows * w->cols);
    if (w->dtype == QD_DTYPE_NVFP4 || w->dtype == QD_DTYPE_INT4) return n / 2;
    return n * qd_dtype_size(w->dtype);
}

size_t qd_weight_scale_bytes(const qd_weight *w) {
    const qd_weight_scales *s = &w->scales;
    if (s->block_rows < 1 || s->block_cols < 1) return 0;
    const size_t n = (size_t)(ceil_div(w->rows, s->block_rows) * ceil_div(w->cols, s->block_cols));
    size_t b = n * qd_dtype_size(s->dtype);
    if (s->zeros) b += n;
    if (s->g_idx) b += (size_t)w->cols * sizeof(int32_t);
    return b;
}

static float scale_at(const qd_weight_scales *s, int64_t i) {
    switch (s->dtype) {
    case QD_DTYPE_F32: return ((const float *)s->data)[i];
    case QD_DTYPE_BF16: return qd_bf16_to_f32(((const uint16_t *)s->data)[i]);
    case QD_DTYPE_F16: return qd_f16_to_f32(((const uint16_t *)s->data)[i]);
    case QD_DTYPE_F8_E4M3: return qd_f8e4m3_to_f32(((const uint8_t *)s->data)[i]);
    default: return 0.0f;
    }
}

/* Columns [c0, c0 + n) of row r, one scale block (or group) at a time, so the scale is read
 * once per block; each element is the same fp32 product as element by element. */
void qd_weight_dequant_span(const qd_weight *w, int64_t r, int64_t c0, int64_t n, float *o) {
    const int64_t C = w->cols, c_end = c0 + n;
    const qd_weight_scales *s = &w->scales;
    switch (w->dtype) {
    case QD_DTYPE_F8_E4M3: {
        const uint8_t *q = (const uint8_t *)w->data + (size_t)(r * C);
        const int64_t bc = s->block_cols, sc = ceil_div(C, bc), si = (r / s->block_rows) * sc;
        for (int64_t c = c0; c < c_end;) {
            const int64_t b = c / bc, e = (b + 1) * bc < c_end ? (b + 1) * bc : c_end;
            const float sv = scale_at(s, si + b);
            for (; c < e; c++) o[c - c0] = qd_f8e4m3_to_f32(q[c]) * sv;
        }
        break;
    }
    case QD_DTYPE_NVFP4: {
        const uint8_t *q = (const uint8_t *)w->data + (size_t)(r * C / 2);
        const int64_t sc = C / 16;
        for (int64_t c = c0; c < c_end;) {
            const int64_t b = c / 16, e = (b + 1) * 16 < c_end ? (b + 1) * 16 : c_end;
            const float sv = scale_at(s, r * sc + b);
            for (; c < e; c++) {
                const uint8_t v = q[c / 2];
                o[c - c0] = qd_e2m1_to_f32(c % 2 ? (uint8_t)(v >> 4) : (uint8_t)(v & 15)) * sv * s->global;
            }
        }
        break;
    }
    case QD_DTYPE_INT4: {
        const uint8_t *q = (const uint8_t *)w->data + (size_t)(r * C / 2);
        const int64_t sc = ceil_div(C, s->block_cols);
        if (s->g_idx) { /* act order: each column's group from g_idx */
            for (int64_t c = c0; c < c_end; c++) {
                const int64_t gi = s->g_idx[c] + r * sc;
                const uint8_t b = q[c / 2];
                const int v = c % 2 ? b >> 4 : b & 15;
                const int z = s->zeros ? s->zeros[gi] : 8;
                o[c - c0] = (float)(v - z) * scale_at(s, gi);
            }
            break;
        }
        for (int64_t c = c0; c < c_end;) {
            const int64_t g = c / s->block_cols, gi = g + r * sc;
            const int64_t e = (g + 1) * s->block_cols < c_end ? (g + 1) * s->block_cols : c_end;
            const float sv = scale_at(s, gi);
            const int z = s->zeros ? s->zeros[gi] : 8;
            for (; c < e; c++) {
                const uint8_t b = q[c / 2];
                o[c - c0] = (float)((c % 2 ? b >> 4 : b & 15) - z) * sv;
            }
        }
        break;
    }
    default:
        qd_convert_to_f32(w->dtype, (const unsigned char *)w->data + (size_t)(r * C + c0) * qd_dtype_size(w->dtype), o,
                          (size_t)n);
    }
}

void qd_weight_dequant_rows(const qd_weight *w, int64_t r0, int64_t n, float *out) {
    for (int64_t r = r0; r < r0 + n; r++) qd_weight_dequant_span(w, r, 0, w->cols, out + (size_t)(r - r0) * (size_t)w->cols);
}
