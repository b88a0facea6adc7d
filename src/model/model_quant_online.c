/* Quantization at load (--quantization, qd_model_params.quantization): the linear layers of
 * a plain model converted into a canonical quantized layout (base/weight.h), as vLLM's
 * online FP8 does:
 *   fp8    F8_E4M3, 128 x 128 blocks, scale = amax / 448 (the official Qwen FP8 layout)
 *   nvfp4  NVFP4, global = amax / (448 * 6), e4m3 scale per 16 = amax16 / 6 / global
 *   int4   INT4 symmetric (z = 8), group 128 (the whole row when cols % 128), scale = amax / 7
 * Values are rounded to nearest (ties to the even code) and saturate at the format's range.
 * As in the official FP8 checkpoints, the embedding, lm_head, routers, shared-expert gates and
 * GDN in_proj_a / in_proj_b stay as they are. A dummy weight that its backend draws (CUDA)
 * only takes its layout here: the backend draws the bf16 values and quantizes them in place
 * with the same roundings (base/dummy_values.h), the bytes this file's conversion gives on
 * the host; an NVFP4 one's global factor is the backend's to compute (it is 0 here). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/arena.h"
#include "base/dummy_values.h"

#include "model/model_quant.h"

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
        float *srow = s + br * sc; /* this block row's scales */
        qd_weight_dequant_rows(w, r0, n, tmp);
        for (int64_t b = 0; b < sc; b++) srow[b] = 0;
        /* block by block within each row: no division per element (they cost most of the
         * conversion of a large dummy model) */
        for (int64_t r = 0; r < n; r++)
            for (int64_t b = 0, c0 = 0; b < sc; b++, c0 += B) {
                const float *t = tmp + r * C;
                const int64_t c1 = C - c0 < B ? C : c0 + B;
                float a = srow[b];
                for (int64_t c = c0; c < c1; c++) a = fmaxf(a, fabsf(t[c]));
                srow[b] = a;
            }
        for (int64_t b = 0; b < sc; b++) srow[b] = qd_fp8_block_scale(srow[b]);
        for (int64_t r = 0; r < n; r++)
            for (int64_t b = 0, c0 = 0; b < sc; b++, c0 += B) {
                const float *t = tmp + r * C, sv = srow[b];
                uint8_t *q = j->q + (r0 + r) * C;
                const int64_t c1 = C - c0 < B ? C : c0 + B;
                for (int64_t c = c0; c < c1; c++) q[c] = qd_round_e4m3(t[c] / sv);
            }
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
            const uint8_t sc = qd_nvfp4_block_code(a, j->global);
            s[r * (C / 16) + b] = sc;
            const float eff = qd_f8e4m3_to_f32(sc) * j->global;
            for (int k = 0; k < 16; k++) {
                const int64_t c = b * 16 + k;
                const uint8_t code = qd_round_e2m1(tmp[c] / eff);
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
            const float sc = qd_int4_group_scale(a);
            s[r * G + gr] = sc;
            for (int64_t k = 0; k < g; k++) {
                const int64_t c = gr * g + k;
                const uint8_t v = qd_round_int4(tmp[c], sc);
                j->q[(r * C + c) / 2] |= (uint8_t)(c % 2 ? v << 4 : v);
            }
        }
    }
    free(tmp);
}

/* One conversion: conv_prepare checks the weight and allocates its outputs from the model
 * (on the loading thread: the model's allocator is not thread-safe); conv_fill computes them,
 * over the pool by rows, or on the calling thread when pool is NULL (a worker converting a
 * whole matrix). */
typedef struct qconv {
    qjob j;
    qd_weight out;
    int64_t tasks;           /* FP8: 128-row block rows; NVFP4, INT4: rows */
    qd_parallel_fn task;     /* fp8_task, nvfp4_task or int4_task */
} qconv;

/* The layout w takes in a format (base/weight.h), without its values: FP8 in 128 x 128
 * blocks, NVFP4 in blocks of 16 (its global factor comes with the values), INT4 in groups
 * of 128 (the whole row when cols % 128). A dummy keeps its seed and scale. */
static qd_status quant_layout(qd_quantization kind, const qd_weight *w, qd_weight *out, qd_err *err) {
    const int64_t R = w->rows, C = w->cols;
    *out = (qd_weight){.rows = R, .cols = C, .dummy_seed = w->dummy_seed, .dummy_scale = w->dummy_scale};
    switch (kind) {
    case QD_QUANTIZATION_FP8:
        out->dtype = QD_DTYPE_F8_E4M3;
        out->scales = (qd_weight_scales){.dtype = QD_DTYPE_F32, .block_rows = 128, .block_cols = 128, .global = 1};
        return QD_OK;
    case QD_QUANTIZATION_NVFP4:
        if (C % 16)
            return qd_seterr(err, QD_ERR_UNSUPPORTED, "--quantization nvfp4: a weight of %lld in-features (not a "
                             "multiple of 16)", (long long)C);
        out->dtype = QD_DTYPE_NVFP4;
        out->scales = (qd_weight_scales){.dtype = QD_DTYPE_F8_E4M3, .block_rows = 1, .block_cols = 16};
        return QD_OK;
    case QD_QUANTIZATION_INT4:
        if (C % 2)
            return qd_seterr(err, QD_ERR_UNSUPPORTED, "--quantization int4: a weight of %lld in-features (odd)",
                             (long long)C);
        out->dtype = QD_DTYPE_INT4;
        out->scales = (qd_weight_scales){.dtype = QD_DTYPE_F32, .block_rows = 1, .block_cols = C % 128 ? C : 128,
                                         .global = 1};
        return QD_OK;
    default: return qd_seterr(err, QD_ERR_INVALID_ARG, "quantization %d is not a format", (int)kind);
    }
}

static qd_status conv_prepare(qd_model *m, qd_quantization kind, const qd_weight *w, qconv *c, qd_err *err) {
    *c = (qconv){.j = {.w = w}};
    QD_TRY(quant_layout(kind, w, &c->out, err));
    c->out.dummy_seed = 0;
    c->out.dummy_scale = 0;
    const size_t data_b = qd_weight_data_bytes(&c->out), scale_b = qd_weight_scale_bytes(&c->out);
    c->j.q = qd_model_alloc(m, data_b);
    c->j.s = qd_model_alloc(m, scale_b);
    if (!c->j.q || !c->j.s)
        return qd_seterr(err, QD_ERR_OOM, "out of memory quantizing a %lldx%lld weight to %s", (long long)w->rows,
                         (long long)w->cols, qd_dtype_name(c->out.dtype));
    c->out.data = c->j.q;
    c->out.scales.data = c->j.s;
    switch (kind) {
    case QD_QUANTIZATION_FP8: c->tasks = (w->rows + 127) / 128, c->task = fp8_task; break;
    case QD_QUANTIZATION_NVFP4: c->tasks = w->rows, c->task = nvfp4_task; break;
    default: c->tasks = w->rows, c->j.group = c->out.scales.block_cols, c->task = int4_task; break;
    }
    return QD_OK;
}

static void conv_run(qd_threadpool *pool, qconv *c, int64_t n, qd_parallel_fn fn) {
    if (pool) qd_parallel_for(pool, n, 1, fn, &c->j);
    else fn(&c->j, 0, n, 0);
}

/* NVFP4 first takes the matrix's amax (its global factor), then the blocks. Sets
 * c->j.failed when a task could not allocate its scratch. */
static void conv_fill(qd_threadpool *pool, qconv *c) {
    if (c->task == nvfp4_task) {
        const int64_t R = c->j.w->rows;
        c->j.row_amax = malloc((size_t)R * sizeof(float));
        if (!c->j.row_amax) {
            c->j.failed = 1;
            return;
        }
        conv_run(pool, c, R, amax_task);
        float amax = 0;
        for (int64_t r = 0; r < R; r++) amax = fmaxf(amax, c->j.row_amax[r]);
        free(c->j.row_amax);
        c->j.row_amax = NULL;
        if (c->j.failed) return;
        c->j.global = qd_nvfp4_global(amax);
        c->out.scales.global = c->j.global;
    }
    conv_run(pool, c, c->tasks, c->task);
}

static qd_status conv_status(const qconv *c, qd_err *err) {
    return c->j.failed ? qd_seterr(err, QD_ERR_OOM, "out of memory for quantization scratch") : QD_OK;
}

qd_status qd_quant_to_format(qd_model *m, qd_quantization kind, const qd_weight *w, qd_weight *out, qd_err *err) {
    qconv c;
    QD_TRY(conv_prepare(m, kind, w, &c, err));
    conv_fill(m->pool, &c);
    QD_TRY(conv_status(&c, err));
    *out = c.out;
    return QD_OK;
}

qd_status qd_quant_to_fp8_block(qd_model *m, const qd_weight *w, qd_weight *out, qd_err *err) {
    return qd_quant_to_format(m, QD_QUANTIZATION_FP8, w, out, err);
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

static qd_status convertible(const qd_weight *w, qd_err *err) {
    if (qd_weight_quantized(w))
        return qd_seterr(err, QD_ERR_INVALID_ARG, "--quantization: the checkpoint is already quantized (%s); it loads "
                         "as stored without the option", qd_dtype_name(w->dtype));
    if (!w->data && !qd_weight_backend_drawn(w))
        return qd_seterr(err, QD_ERR_INVALID_ARG, "--quantization: a weight without values");
    return QD_OK;
}

/* A dummy its backend draws (model_dummy.c) only takes the format's layout: the backend
 * draws the bf16 values and quantizes them in place, as conv_fill would (NVFP4 takes the
 * matrix's amax there first, so its global factor is left 0 here). */
static qd_status convert_drawn(qd_quantization kind, qd_weight *w, qd_err *err) {
    qd_weight q;
    QD_TRY(quant_layout(kind, w, &q, err));
    *w = q;
    return QD_OK;
}

/* The converted weight replaces the plain one, whose own buffer (a dummy's) is freed. */
static void conv_finish(qd_model *m, qd_weight *w, const qconv *c) {
    drop_owned(m, w->data);
    *w = c->out;
}

static qd_status convert(qd_model *m, qd_quantization kind, qd_weight *w, qd_err *err) {
    if (w->rows == 0 || w->cols == 0) return QD_OK; /* another rank's expert */
    QD_TRY(convertible(w, err));
    if (!w->data) return convert_drawn(kind, w, err);
    qd_weight q;
    QD_TRY(qd_quant_to_format(m, kind, w, &q, err));
    drop_owned(m, w->data);
    *w = q;
    return QD_OK;
}

/* A MoE layer's experts are many small matrices (the 35B-A3B: 768 of 512 x 2048 or 2048 x
 * 512 a layer), each only 4-16 row tasks: converted by rows, the pool ran mostly idle (a
 * dummy 35B-A3B took 92 s to quantize on 16 cores). Here the pool takes whole matrices,
 * each converted by one worker, the same values as by rows. */
typedef struct experts_job {
    qconv *c;
} experts_job;

static void experts_worker(void *user, int64_t begin, int64_t end, int worker) {
    (void)worker;
    experts_job *e = user;
    for (int64_t i = begin; i < end; i++) conv_fill(NULL, &e->c[i]);
}

static qd_status convert_experts(qd_model *m, qd_quantization kind, qd_moe_weights *moe, int n_experts, qd_err *err) {
    qconv *c = calloc((size_t)n_experts * 3, sizeof *c);
    qd_weight **w = calloc((size_t)n_experts * 3, sizeof *w);
    qd_status st = c && w ? QD_OK : qd_seterr(err, QD_ERR_OOM, "out of memory quantizing the experts");
    int64_t n = 0;
    for (int e = 0; e < n_experts && !st; e++) {
        qd_weight *mats[3] = {&moe->experts[e].gate, &moe->experts[e].up, &moe->experts[e].down};
        for (int k = 0; k < 3 && !st; k++) {
            if (mats[k]->rows == 0 || mats[k]->cols == 0) continue; /* another rank's expert */
            if ((st = convertible(mats[k], err))) break;
            if (!mats[k]->data) {
                st = convert_drawn(kind, mats[k], err);
                continue;
            }
            st = conv_prepare(m, kind, mats[k], &c[n], err);
            if (!st) w[n++] = mats[k];
        }
    }
    if (!st) {
        experts_job job = {.c = c};
        if (m->pool) qd_parallel_for(m->pool, n, 1, experts_worker, &job);
        else experts_worker(&job, 0, n, 0);
        for (int64_t i = 0; i < n && !st; i++) st = conv_status(&c[i], err);
        for (int64_t i = 0; i < n && !st; i++) conv_finish(m, w[i], &c[i]);
    }
    free(c);
    free(w);
    return st;
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
    QD_TRY(convert_experts(m, kind, &ly->moe, c->n_experts, err));
    if (ly->moe.has_shared) QD_TRY(convert_mlp(m, kind, &ly->moe.shared, err));
    return QD_OK;
}

qd_status qd_model_quantize(qd_model *m, qd_quantization kind, qd_err *err) {
    for (int L = 0; L < m->cfg.n_layers; L++) QD_TRY(qd_model_quantize_layer(m, kind, L, err));
    return QD_OK;
}
