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
#include <stdlib.h>
#include <string.h>

#include "base/arena.h"

#include "model/model_quant.h"

/* Round to the nearest e4m3 (ties to the even code), saturating at 448: normals by
 * rounding the fp32 mantissa to 3 bits (a carry moves to the exponent, as the code order
 * wants), subnormals (below 2^-6) as multiples of 2^-9. Bit for bit the nearest value of
 * the e4m3 table (checked over every code's midpoints and 2e8 random floats). */
static uint8_t f32_to_e4m3(float x) {
    uint32_t b;
    memcpy(&b, &x, 4);
    const uint8_t sign = (uint8_t)((b >> 24) & 0x80);
    b &= 0x7fffffffu;
    float a;
    memcpy(&a, &b, 4);
    if (!(a < 448.0f)) return sign | 126; /* saturate (NaN inputs never reach here: weights are finite) */
    if (a < 0.015625f) return sign | (uint8_t)lrintf(a * 512.0f);
    uint32_t code = ((b + 0x7ffffu + ((b >> 20) & 1u)) >> 20) - (120u << 3);
    if (code > 126) code = 126;
    return sign | (uint8_t)code;
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

/* One conversion, cut over the model's thread pool: tasks of rows (FP8: of 128-row block rows)
 * that each dequantize their rows into their own scratch. */
typedef struct qjob {
    const qd_weight *w;
    uint8_t *q;          /* the packed elements */
    void *s;             /* the scales */
    float *row_amax;     /* NVFP4's first pass: [rows] */
    float global;        /* NVFP4 */
    int64_t group;       /* INT4 */
    int failed;          /* a task could not allocate its scratch */
} qjob;

static float *scratch(qjob *j, int64_t n) {
    float *t = malloc((size_t)n * sizeof(float));
    if (!t) j->failed = 1;
    return t;
}

static void fp8_task(void *user, int64_t begin, int64_t end, int worker) {
    (void)worker;
    qjob *j = user;
    const qd_weight *w = j->w;
    const int64_t R = w->rows, C = w->cols, B = 128, sc = (C + B - 1) / B;
    float *s = j->s, *tmp = scratch(j, B * C);
    if (!tmp) return;
    for (int64_t br = begin; br < end; br++) {
        const int64_t r0 = br * B, n = R - r0 < B ? R - r0 : B;
        qd_weight_dequant_rows(w, r0, n, tmp);
        for (int64_t b = 0; b < sc; b++) s[br * sc + b] = 0;
        for (int64_t i = 0; i < n * C; i++) s[br * sc + (i % C) / B] = fmaxf(s[br * sc + (i % C) / B], fabsf(tmp[i]));
        for (int64_t b = 0; b < sc; b++) s[br * sc + b] = s[br * sc + b] > 0 ? s[br * sc + b] / 448.0f : 1.0f;
        for (int64_t i = 0; i < n * C; i++) j->q[r0 * C + i] = f32_to_e4m3(tmp[i] / s[br * sc + (i % C) / B]);
    }
    free(tmp);
}

static void amax_task(void *user, int64_t begin, int64_t end, int worker) {
    (void)worker;
    qjob *j = user;
    float *tmp = scratch(j, j->w->cols);
    if (!tmp) return;
    for (int64_t r = begin; r < end; r++) {
        qd_weight_dequant_rows(j->w, r, 1, tmp);
        float a = 0;
        for (int64_t c = 0; c < j->w->cols; c++) a = fmaxf(a, fabsf(tmp[c]));
        j->row_amax[r] = a;
    }
    free(tmp);
}

static void nvfp4_task(void *user, int64_t begin, int64_t end, int worker) {
    (void)worker;
    qjob *j = user;
    const int64_t C = j->w->cols;
    uint8_t *s = j->s;
    float *tmp = scratch(j, C);
    if (!tmp) return;
    for (int64_t r = begin; r < end; r++) {
        qd_weight_dequant_rows(j->w, r, 1, tmp);
        memset(j->q + r * C / 2, 0, (size_t)C / 2);
        for (int64_t b = 0; b < C / 16; b++) {
            float a = 0;
            for (int k = 0; k < 16; k++) a = fmaxf(a, fabsf(tmp[b * 16 + k]));
            uint8_t sc = f32_to_e4m3(a / 6.0f / j->global);
            if (sc == 0) sc = 1; /* the smallest e4m3 step: an all-zero block stays zero */
            s[r * (C / 16) + b] = sc;
            const float eff = qd_f8e4m3_to_f32(sc) * j->global;
            for (int k = 0; k < 16; k++) {
                const int64_t c = b * 16 + k;
                const uint8_t code = f32_to_e2m1(tmp[c] / eff);
                j->q[(r * C + c) / 2] |= (uint8_t)(c % 2 ? code << 4 : code);
            }
        }
    }
    free(tmp);
}

static void int4_task(void *user, int64_t begin, int64_t end, int worker) {
    (void)worker;
    qjob *j = user;
    const int64_t C = j->w->cols, g = j->group, G = C / g;
    float *s = j->s, *tmp = scratch(j, C);
    if (!tmp) return;
    for (int64_t r = begin; r < end; r++) {
        qd_weight_dequant_rows(j->w, r, 1, tmp);
        memset(j->q + r * C / 2, 0, (size_t)C / 2);
        for (int64_t gr = 0; gr < G; gr++) {
            float a = 0;
            for (int64_t k = 0; k < g; k++) a = fmaxf(a, fabsf(tmp[gr * g + k]));
            const float sc = a > 0 ? a / 7.0f : 1.0f;
            s[r * G + gr] = sc;
            for (int64_t k = 0; k < g; k++) {
                const int64_t c = gr * g + k;
                long v = lrintf(tmp[c] / sc) + 8;
                v = v < 0 ? 0 : v > 15 ? 15 : v;
                j->q[(r * C + c) / 2] |= (uint8_t)(c % 2 ? v << 4 : v);
            }
        }
    }
    free(tmp);
}

static qd_status run(qd_model *m, qjob *j, int64_t n, qd_parallel_fn fn, qd_err *err) {
    if (m->pool) qd_parallel_for(m->pool, n, 1, fn, j);
    else fn(j, 0, n, 0);
    return j->failed ? qd_seterr(err, QD_ERR_OOM, "out of memory for quantization scratch") : QD_OK;
}

qd_status qd_quant_to_fp8_block(qd_model *m, const qd_weight *w, qd_weight *out, qd_err *err) {
    const int64_t R = w->rows, C = w->cols, B = 128, sr = (R + B - 1) / B, sc = (C + B - 1) / B;
    qjob j = {.w = w, .q = qd_model_alloc(m, (size_t)(R * C)), .s = qd_model_alloc(m, (size_t)(sr * sc) * sizeof(float))};
    if (!j.q || !j.s)
        return qd_seterr(err, QD_ERR_OOM, "out of memory quantizing a %lldx%lld weight to FP8", (long long)R, (long long)C);
    QD_TRY(run(m, &j, sr, fp8_task, err));
    *out = (qd_weight){.dtype = QD_DTYPE_F8_E4M3, .rows = R, .cols = C, .data = j.q,
                       .scales = {.dtype = QD_DTYPE_F32, .data = j.s, .block_rows = B, .block_cols = B, .global = 1}};
    return QD_OK;
}

static qd_status to_nvfp4(qd_model *m, const qd_weight *w, qd_weight *out, qd_err *err) {
    const int64_t R = w->rows, C = w->cols;
    if (C % 16)
        return qd_seterr(err, QD_ERR_UNSUPPORTED, "--quantization nvfp4: a weight of %lld in-features (not a multiple "
                         "of 16)", (long long)C);
    qjob j = {.w = w, .q = qd_model_alloc(m, (size_t)(R * C / 2)), .s = qd_model_alloc(m, (size_t)(R * C / 16)),
              .row_amax = malloc((size_t)R * sizeof(float))};
    if (!j.q || !j.s || !j.row_amax) {
        free(j.row_amax);
        return qd_seterr(err, QD_ERR_OOM, "out of memory quantizing to NVFP4");
    }
    qd_status st = run(m, &j, R, amax_task, err);
    float amax = 0;
    for (int64_t r = 0; r < R; r++) amax = fmaxf(amax, j.row_amax[r]);
    free(j.row_amax);
    QD_TRY(st);
    j.global = amax > 0 ? amax / (448.0f * 6.0f) : 1.0f;
    QD_TRY(run(m, &j, R, nvfp4_task, err));
    *out = (qd_weight){.dtype = QD_DTYPE_NVFP4, .rows = R, .cols = C, .data = j.q,
                       .scales = {.dtype = QD_DTYPE_F8_E4M3, .data = j.s, .block_rows = 1, .block_cols = 16,
                                  .global = j.global}};
    return QD_OK;
}

static qd_status to_int4(qd_model *m, const qd_weight *w, qd_weight *out, qd_err *err) {
    const int64_t R = w->rows, C = w->cols, g = C % 128 ? C : 128, G = C / g;
    if (C % 2)
        return qd_seterr(err, QD_ERR_UNSUPPORTED, "--quantization int4: a weight of %lld in-features (odd)", (long long)C);
    qjob j = {.w = w, .q = qd_model_alloc(m, (size_t)(R * C / 2)), .s = qd_model_alloc(m, (size_t)(R * G) * sizeof(float)),
              .group = g};
    if (!j.q || !j.s) return qd_seterr(err, QD_ERR_OOM, "out of memory quantizing to INT4");
    QD_TRY(run(m, &j, R, int4_task, err));
    *out = (qd_weight){.dtype = QD_DTYPE_INT4, .rows = R, .cols = C, .data = j.q,
                       .scales = {.dtype = QD_DTYPE_F32, .data = j.s, .block_rows = 1, .block_cols = g, .global = 1}};
    return QD_OK;
}

/* A dummy weight's BF16 buffer is the model's own: freed once converted, so a large dummy
 * model peaks at one BF16 matrix beside its quantized weights (checkpoint weights are views
 * into the mapping and are not in the list). */
static void drop_owned(qd_model *m, const void *p) {
    for (int i = m->n_owned - 1; i >= m->n_owned_layout && i >= 0; i--)
        if (m->owned[i] == p) {
            qd_aligned_free(m->owned[i]);
            m->owned[i] = NULL;
            return;
        }
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
    drop_owned(m, w->data);
    *w = q;
    return QD_OK;
}

static qd_status convert_mlp(qd_model *m, qd_quantization k, qd_mlp_weights *w, qd_err *err) {
    QD_TRY(convert(m, k, &w->gate, err));
    QD_TRY(convert(m, k, &w->up, err));
    return convert(m, k, &w->down, err);
}

qd_status qd_model_quantize_layer(qd_model *m, qd_quantization kind, int L, qd_err *err) {
    const qd_config *c = &m->cfg;
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
    if (ly->ffn_kind == QD_FFN_DENSE) return convert_mlp(m, kind, &ly->mlp, err);
    for (int e = 0; e < c->n_experts; e++) QD_TRY(convert_mlp(m, kind, &ly->moe.experts[e], err));
    if (ly->moe.has_shared) QD_TRY(convert_mlp(m, kind, &ly->moe.shared, err));
    return QD_OK;
}

qd_status qd_model_quantize(qd_model *m, qd_quantization kind, qd_err *err) {
    for (int L = 0; L < m->cfg.n_layers; L++) QD_TRY(qd_model_quantize_layer(m, kind, L, err));
    return QD_OK;
}
