/* Quantization at load (--quantization, qd_model_params.quantization): the linear layers of
 * a plain model converted into a canonical quantized layout (base/weight.h), as vLLM's
 * online FP8 does:
 *   fp8    F8_E4M3, 128 x 128 blocks, scale = amax / 448 (the official Qwen FP8 layout)
 *   nvfp4  NVFP4, global = amax / (448 * 6), e4m3 scale per 16 = amax16 / 6 / global
 *   int4   INT4 symmetric (z = 8), group 128 (the whole row when cols % 128), scale = amax / 7
 * Values are rounded to nearest (ties to the even code) and saturate at the format's range.
 * As in the official FP8 checkpoints, the embedding, lm_head, routers, shared-expert gates and
 * GDN in_proj_a / in_proj_b stay as they are. */
#include <math.h>
#include <string.h>

#include "model/model_quant.h"

/* the 127 finite non-negative e4m3 values, ascending (code = index) */
static float e4m3_pos[127];

static void init_tables(void) {
    if (e4m3_pos[1] != 0) return;
    for (int c = 0; c < 127; c++) e4m3_pos[c] = qd_f8e4m3_to_f32((uint8_t)c);
}

static uint8_t f32_to_e4m3(float x) {
    const uint8_t sign = x < 0 ? 0x80 : 0;
    const float a = fabsf(x);
    if (!(a < 448.0f)) return sign | 126; /* saturate (NaN inputs never reach here: weights are finite) */
    int lo = 0, hi = 126;
    while (hi - lo > 1) {
        const int mid = (lo + hi) / 2;
        if (e4m3_pos[mid] <= a) lo = mid;
        else hi = mid;
    }
    const float dl = a - e4m3_pos[lo], dh = e4m3_pos[hi] - a;
    const int c = dl < dh ? lo : dh < dl ? hi : (lo % 2 == 0 ? lo : hi);
    return sign | (uint8_t)c;
}

static const float E2M1[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};

static uint8_t f32_to_e2m1(float x) {
    const uint8_t sign = x < 0 ? 8 : 0;
    const float a = fabsf(x);
    int best = 0;
    for (int i = 1; i < 8; i++)
        if (fabsf(a - E2M1[i]) < fabsf(a - E2M1[best])) best = i;
    return sign | (uint8_t)best;
}

static qd_status row_f32(qd_model *m, const qd_weight *w, float **row, qd_err *err) {
    *row = qd_model_alloc(m, (size_t)w->cols * sizeof(float));
    return *row ? QD_OK : qd_seterr(err, QD_ERR_OOM, "out of memory quantizing a %lld-column weight", (long long)w->cols);
}

qd_status qd_quant_to_fp8_block(qd_model *m, const qd_weight *w, qd_weight *out, qd_err *err) {
    init_tables();
    const int64_t R = w->rows, C = w->cols, B = 128, sr = (R + B - 1) / B, sc = (C + B - 1) / B;
    uint8_t *q = qd_model_alloc(m, (size_t)(R * C));
    float *s = qd_model_alloc(m, (size_t)(sr * sc) * sizeof(float)), *tmp;
    if (!q || !s) return qd_seterr(err, QD_ERR_OOM, "out of memory quantizing a %lldx%lld weight to FP8", (long long)R,
                                   (long long)C);
    QD_TRY(row_f32(m, w, &tmp, err));
    for (int64_t i = 0; i < sr * sc; i++) s[i] = 0;
    for (int64_t r = 0; r < R; r++) { /* block amax */
        qd_weight_dequant_rows(w, r, 1, tmp);
        for (int64_t c = 0; c < C; c++) s[(r / B) * sc + c / B] = fmaxf(s[(r / B) * sc + c / B], fabsf(tmp[c]));
    }
    for (int64_t i = 0; i < sr * sc; i++) s[i] = s[i] > 0 ? s[i] / 448.0f : 1.0f;
    for (int64_t r = 0; r < R; r++) {
        qd_weight_dequant_rows(w, r, 1, tmp);
        for (int64_t c = 0; c < C; c++) q[r * C + c] = f32_to_e4m3(tmp[c] / s[(r / B) * sc + c / B]);
    }
    *out = (qd_weight){.dtype = QD_DTYPE_F8_E4M3, .rows = R, .cols = C, .data = q,
                       .scales = {.dtype = QD_DTYPE_F32, .data = s, .block_rows = B, .block_cols = B, .global = 1}};
    return QD_OK;
}

static qd_status to_nvfp4(qd_model *m, const qd_weight *w, qd_weight *out, qd_err *err) {
    init_tables();
    const int64_t R = w->rows, C = w->cols;
    if (C % 16)
        return qd_seterr(err, QD_ERR_UNSUPPORTED, "--quantization nvfp4: a weight of %lld in-features (not a multiple "
                         "of 16)", (long long)C);
    uint8_t *q = qd_model_alloc(m, (size_t)(R * C / 2)), *s = qd_model_alloc(m, (size_t)(R * C / 16));
    float *tmp;
    if (!q || !s) return qd_seterr(err, QD_ERR_OOM, "out of memory quantizing to NVFP4");
    QD_TRY(row_f32(m, w, &tmp, err));
    float amax = 0;
    for (int64_t r = 0; r < R; r++) {
        qd_weight_dequant_rows(w, r, 1, tmp);
        for (int64_t c = 0; c < C; c++) amax = fmaxf(amax, fabsf(tmp[c]));
    }
    const float g = amax > 0 ? amax / (448.0f * 6.0f) : 1.0f;
    memset(q, 0, (size_t)(R * C / 2));
    for (int64_t r = 0; r < R; r++) {
        qd_weight_dequant_rows(w, r, 1, tmp);
        for (int64_t b = 0; b < C / 16; b++) {
            float a = 0;
            for (int k = 0; k < 16; k++) a = fmaxf(a, fabsf(tmp[b * 16 + k]));
            uint8_t sc = f32_to_e4m3(a / 6.0f / g);
            if (sc == 0) sc = 1; /* the smallest e4m3 step: an all-zero block stays zero */
            s[r * (C / 16) + b] = sc;
            const float eff = qd_f8e4m3_to_f32(sc) * g;
            for (int k = 0; k < 16; k++) {
                const int64_t c = b * 16 + k;
                const uint8_t code = f32_to_e2m1(tmp[c] / eff);
                q[(r * C + c) / 2] |= (uint8_t)(c % 2 ? code << 4 : code);
            }
        }
    }
    *out = (qd_weight){.dtype = QD_DTYPE_NVFP4, .rows = R, .cols = C, .data = q,
                       .scales = {.dtype = QD_DTYPE_F8_E4M3, .data = s, .block_rows = 1, .block_cols = 16, .global = g}};
    return QD_OK;
}

static qd_status to_int4(qd_model *m, const qd_weight *w, qd_weight *out, qd_err *err) {
    const int64_t R = w->rows, C = w->cols, g = C % 128 ? C : 128, G = C / g;
    if (C % 2)
        return qd_seterr(err, QD_ERR_UNSUPPORTED, "--quantization int4: a weight of %lld in-features (odd)", (long long)C);
    uint8_t *q = qd_model_alloc(m, (size_t)(R * C / 2));
    float *s = qd_model_alloc(m, (size_t)(R * G) * sizeof(float)), *tmp;
    if (!q || !s) return qd_seterr(err, QD_ERR_OOM, "out of memory quantizing to INT4");
    QD_TRY(row_f32(m, w, &tmp, err));
    memset(q, 0, (size_t)(R * C / 2));
    for (int64_t r = 0; r < R; r++) {
        qd_weight_dequant_rows(w, r, 1, tmp);
        for (int64_t gr = 0; gr < G; gr++) {
            float a = 0;
            for (int64_t k = 0; k < g; k++) a = fmaxf(a, fabsf(tmp[gr * g + k]));
            const float sc = a > 0 ? a / 7.0f : 1.0f;
            s[r * G + gr] = sc;
            for (int64_t k = 0; k < g; k++) {
                const int64_t c = gr * g + k;
                long v = lrintf(tmp[c] / sc) + 8;
                v = v < 0 ? 0 : v > 15 ? 15 : v;
                q[(r * C + c) / 2] |= (uint8_t)(c % 2 ? v << 4 : v);
            }
        }
    }
    *out = (qd_weight){.dtype = QD_DTYPE_INT4, .rows = R, .cols = C, .data = q,
                       .scales = {.dtype = QD_DTYPE_F32, .data = s, .block_rows = 1, .block_cols = g, .global = 1}};
    return QD_OK;
}

static qd_status convert(qd_model *m, qd_quantization kind, qd_weight *w, qd_err *err) {
    if (w->rows == 0 || w->cols == 0) return QD_OK; /* another rank's expert */
    if (qd_weight_quantized(w))
        return qd_seterr(err, QD_ERR_INVALID_ARG, "--quantization: the checkpoint is already quantized (%s); it loads "
                         "as stored without the option", qd_dtype_name(w->dtype));
    if (!w->data)
        return qd_seterr(err, QD_ERR_UNSUPPORTED, "--quantization: a weight drawn by the backend has no host values");
    qd_weight q;
    switch (kind) {
    case QD_QUANTIZATION_FP8: QD_TRY(qd_quant_to_fp8_block(m, w, &q, err)); break;
    case QD_QUANTIZATION_NVFP4: QD_TRY(to_nvfp4(m, w, &q, err)); break;
    case QD_QUANTIZATION_INT4: QD_TRY(to_int4(m, w, &q, err)); break;
    default: return qd_seterr(err, QD_ERR_INVALID_ARG, "quantization %d is not a format", (int)kind);
    }
    *w = q;
    return QD_OK;
}

static qd_status convert_mlp(qd_model *m, qd_quantization k, qd_mlp_weights *w, qd_err *err) {
    QD_TRY(convert(m, k, &w->gate, err));
    QD_TRY(convert(m, k, &w->up, err));
    return convert(m, k, &w->down, err);
}

qd_status qd_model_quantize(qd_model *m, qd_quantization kind, qd_err *err) {
    const qd_config *c = &m->cfg;
    for (int L = 0; L < c->n_layers; L++) {
        qd_layer *ly = &m->w.layers[L];
        if (ly->kind == QD_LAYER_GDN) {
            QD_TRY(convert(m, kind, &ly->gdn.in_qkv, err));
            QD_TRY(convert(m, kind, &ly->gdn.in_z, err));
            QD_TRY(convert(m, kind, &ly->gdn.out, err));
        } else {
            QD_TRY(convert(m, kind, &ly->attn.q, err));
            QD_TRY(convert(m, kind, &ly->attn.k, err));
            QD_TRY(convert(m, kind, &ly->attn.v, err));
            QD_TRY(convert(m, kind, &ly->attn.o, err));
        }
        if (ly->ffn_kind == QD_FFN_DENSE) {
            QD_TRY(convert_mlp(m, kind, &ly->mlp, err));
        } else {
            for (int e = 0; e < c->n_experts; e++) QD_TRY(convert_mlp(m, kind, &ly->moe.experts[e], err));
            if (ly->moe.has_shared) QD_TRY(convert_mlp(m, kind, &ly->moe.shared, err));
        }
    }
    return QD_OK;
}
