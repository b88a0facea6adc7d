/* A rank's model cut from a loaded full model by a sharding plan (shard.h). Row ranges of
 * a row-major [rows][cols] weight are views; a column range, or rows gathered from
 * separate runs, is copied into a buffer the rank model owns. With tp_size 1 every range
 * is whole and every weight a view, so the rank model computes exactly as the full one. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/model_shard.h"

/* Bytes of one stored row (the packed 4-bit formats hold two elements a byte). */
static size_t row_bytes(const qd_weight *w) {
    if (w->dtype == QD_DTYPE_NVFP4 || w->dtype == QD_DTYPE_INT4) return (size_t)w->cols / 2;
    return (size_t)w->cols * qd_dtype_size(w->dtype);
}

static int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

/* Scale (and zero) grid columns of a quantized weight. */
static int64_t scale_cols(const qd_weight *w) { return ceil_div(w->cols, w->scales.block_cols); }

/* A quantized weight's rows starting at `begin` can be a view when its scale rows start
 * there too. */
static int view_aligned(const qd_weight *w, int64_t begin) {
    return !qd_weight_quantized(w) || begin % w->scales.block_rows == 0;
}

qd_weight qd_shard_rows_view(const qd_weight *w, qd_shard_range r) {
    qd_weight v = *w;
    v.rows = r.count;
    v.data = w->data ? (const unsigned char *)w->data + (size_t)r.begin * row_bytes(w) : NULL;
    if (qd_weight_quantized(w) && w->scales.data) {
        /* callers view quantized weights at scale-row boundaries only (view_aligned) */
        const int64_t sr = r.begin / w->scales.block_rows, sc = scale_cols(w);
        v.scales.data = (const unsigned char *)w->scales.data + (size_t)(sr * sc) * qd_dtype_size(w->scales.dtype);
        if (w->scales.zeros) v.scales.zeros = w->scales.zeros + sr * sc;
    }
    return v;
}

static int runs_contiguous(const qd_shard_range *runs, int n) {
    for (int i = 1; i < n; i++)
        if (runs[i].begin != runs[i - 1].begin + runs[i - 1].count) return 0;
    return 1;
}

/* The scales (and zeros) of gathered rows, one scale row per weight row (block_rows 1): a
 * row keeps the scales of its stored index, wherever a block of rows was cut. */
static qd_status gather_scales(qd_model *m, const qd_weight *w, const qd_shard_range *runs, int n, int64_t rows,
                               qd_weight *out, qd_err *err) {
    const qd_weight_scales *s = &w->scales;
    const int64_t sc = scale_cols(w);
    const size_t esz = qd_dtype_size(s->dtype);
    unsigned char *dst = qd_model_alloc(m, (size_t)(rows * sc) * esz);
    uint8_t *z = s->zeros ? qd_model_alloc(m, (size_t)(rows * sc)) : NULL;
    if (!dst || (s->zeros && !z)) return qd_seterr(err, QD_ERR_OOM, "out of memory slicing the scales of a weight");
    int64_t o = 0;
    for (int i = 0; i < n; i++)
        for (int64_t r = runs[i].begin; r < runs[i].begin + runs[i].count; r++, o++) {
            const int64_t sr = r / s->block_rows;
            memcpy(dst + (size_t)(o * sc) * esz, (const unsigned char *)s->data + (size_t)(sr * sc) * esz, (size_t)sc * esz);
            if (z) memcpy(z + o * sc, s->zeros + sr * sc, (size_t)sc);
        }
    out->scales.data = dst;
    out->scales.zeros = z;
    out->scales.block_rows = 1;
    return QD_OK;
}

qd_status qd_shard_rows_gather(qd_model *m, const qd_weight *w, const qd_shard_range *runs, int n, qd_weight *out,
                             qd_err *err) {
    int64_t rows = 0;
    for (int i = 0; i < n; i++) rows += runs[i].count;
    if (runs_contiguous(runs, n) && view_aligned(w, runs[0].begin)) {
        *out = qd_shard_rows_view(w, (qd_shard_range){runs[0].begin, rows});
        return QD_OK;
    }
    const size_t rb = row_bytes(w);
    *out = *w;
    out->rows = rows;
    if (w->data) {
        unsigned char *dst = qd_model_alloc(m, (size_t)rows * rb);
        if (!dst) return qd_seterr(err, QD_ERR_OOM, "out of memory slicing a %lld-row weight", (long long)rows);
        size_t off = 0;
        for (int i = 0; i < n; i++) {
            memcpy(dst + off, (const unsigned char *)w->data + (size_t)runs[i].begin * rb, (size_t)runs[i].count * rb);
            off += (size_t)runs[i].count * rb;
        }
        out->data = dst;
    }
    if (qd_weight_quantized(w) && w->scales.data) QD_TRY(gather_scales(m, w, runs, n, rows, out, err));
    return QD_OK;
}

/* Columns [c.begin, c.begin + c.count) of a quantized weight: the cut must fall on block
 * (group) boundaries, or at the last column, so that each kept block keeps its scale. */
static qd_status quant_cols_copy(qd_model *m, const qd_weight *w, qd_shard_range c, qd_weight *out, qd_err *err) {
    const qd_weight_scales *s = &w->scales;
    const int64_t bc = s->block_cols, end = c.begin + c.count;
    const int packed = w->dtype != QD_DTYPE_F8_E4M3;
    if (bc >= w->cols && !s->g_idx && (!packed || (c.begin % 2 == 0 && c.count % 2 == 0))) {
        /* one scale per row (per-channel FP8, INT4 group -1): any cut keeps it */
        const size_t in_rb = row_bytes(w), out_rb = packed ? (size_t)c.count / 2 : (size_t)c.count,
                     off = packed ? (size_t)c.begin / 2 : (size_t)c.begin;
        unsigned char *dst = w->data ? qd_model_alloc(m, (size_t)w->rows * out_rb) : NULL;
        if (w->data && !dst) return qd_seterr(err, QD_ERR_OOM, "out of memory slicing a %lld-column weight", (long long)c.count);
        for (int64_t r = 0; dst && r < w->rows; r++)
            memcpy(dst + (size_t)r * out_rb, (const unsigned char *)w->data + (size_t)r * in_rb + off, out_rb);
        *out = *w;
        out->cols = c.count;
        out->data = dst;
        out->scales.block_cols = c.count;
        return QD_OK;
    }
    if (c.begin % bc || (end % bc && end != w->cols) || s->g_idx || (packed && (c.begin % 2 || c.count % 2)))
        return qd_seterr(err, QD_ERR_SHAPE,
                         "a tensor-parallel split of a %s weight [%lld, %lld] at columns [%lld, %lld) cuts its %lld-column "
                         "scale blocks%s", qd_dtype_name(w->dtype), (long long)w->rows, (long long)w->cols,
                         (long long)c.begin, (long long)end, (long long)bc,
                         s->g_idx ? " (act-order g_idx groups cannot be split)" : "");
    const int64_t sc = scale_cols(w), sr = ceil_div(w->rows, s->block_rows), b0 = c.begin / bc, nb = ceil_div(c.count, bc);
    const size_t esz = qd_dtype_size(s->dtype);
    const size_t in_rb = row_bytes(w), out_rb = packed ? (size_t)c.count / 2 : (size_t)c.count,
                 off = packed ? (size_t)c.begin / 2 : (size_t)c.begin;
    unsigned char *dst = w->data ? qd_model_alloc(m, (size_t)w->rows * out_rb) : NULL;
    unsigned char *sd = qd_model_alloc(m, (size_t)(sr * nb) * esz);
    uint8_t *z = s->zeros ? qd_model_alloc(m, (size_t)(sr * nb)) : NULL;
    if ((w->data && !dst) || !sd || (s->zeros && !z))
        return qd_seterr(err, QD_ERR_OOM, "out of memory slicing a %lld-column weight", (long long)c.count);
    for (int64_t r = 0; dst && r < w->rows; r++)
        memcpy(dst + (size_t)r * out_rb, (const unsigned char *)w->data + (size_t)r * in_rb + off, out_rb);
    for (int64_t r = 0; r < sr; r++) {
        memcpy(sd + (size_t)(r * nb) * esz, (const unsigned char *)s->data + (size_t)(r * sc + b0) * esz, (size_t)nb * esz);
        if (z) memcpy(z + r * nb, s->zeros + r * sc + b0, (size_t)nb);
    }
    *out = *w;
    out->cols = c.count;
    out->data = dst;
    out->scales.data = sd;
    out->scales.zeros = z;
    return QD_OK;
}

qd_status qd_shard_cols_copy(qd_model *m, const qd_weight *w, qd_shard_range c, qd_weight *out, qd_err *err) {
    if (c.begin == 0 && c.count == w->cols) {
        *out = *w;
        return QD_OK;
    }
    if (qd_weight_quantized(w)) return quant_cols_copy(m, w, c, out, err);
    const size_t esz = qd_dtype_size(w->dtype);
    unsigned char *dst = qd_model_alloc(m, (size_t)(w->rows * c.count) * esz);
    if (!dst) return qd_seterr(err, QD_ERR_OOM, "out of memory slicing a %lld-column weight", (long long)c.count);
    for (int64_t r = 0; r < w->rows; r++)
        memcpy(dst + (size_t)(r * c.count) * esz, (const unsigned char *)w->data + (size_t)(r * w->cols + c.begin) * esz,
               (size_t)c.count * esz);
    *out = (qd_weight){.dtype = w->dtype, .rows = w->rows, .cols = c.count, .data = dst};
    return QD_OK;
}

/* Rows r of w: a view, or a copy where a quantized weight's scale blocks are cut. */
static qd_status rows_of(qd_model *m, const qd_weight *w, qd_shard_range r, qd_weight *out, qd_err *err) {
    return qd_shard_rows_gather(m, w, &r, 1, out, err);
}

/* conv1d taps [C][K] of the channels in `runs` */
static qd_status conv_gather(qd_model *m, const float *src, int K, const qd_shard_range *runs, int n, float **out,
                             qd_err *err) {
    const qd_weight w = {.dtype = QD_DTYPE_F32, .rows = runs[n - 1].begin + runs[n - 1].count, .cols = K, .data = src};
    qd_weight g;
    QD_TRY(qd_shard_rows_gather(m, &w, runs, n, &g, err));
    *out = (float *)g.data;  /* a view into the full model's own fp32 buffer, or a fresh copy */
    return QD_OK;
}

static qd_status slice_mlp(qd_model *m, const qd_mlp_weights *w, qd_shard_range rows, qd_mlp_weights *out,
                           qd_err *err) {
    QD_TRY(rows_of(m, &w->gate, rows, &out->gate, err));
    QD_TRY(rows_of(m, &w->up, rows, &out->up, err));
    return qd_shard_cols_copy(m, &w->down, rows, &out->down, err);
}

static qd_status slice_gdn(qd_model *m, const qd_shard_plan *p, const qd_gdn_weights *w, qd_gdn_weights *g,
                           qd_err *err) {
    QD_TRY(qd_shard_rows_gather(m, &w->in_qkv, p->gdn_qkv_rows, 3, &g->in_qkv, err));
    QD_TRY(rows_of(m, &w->in_z, p->gdn_z_rows, &g->in_z, err));
    QD_TRY(rows_of(m, &w->in_b, p->gdn_head_rows, &g->in_b, err));
    QD_TRY(rows_of(m, &w->in_a, p->gdn_head_rows, &g->in_a, err));
    QD_TRY(conv_gather(m, w->conv_w, m->cfg.gdn_conv_kernel, p->gdn_qkv_rows, 3, &g->conv_w, err));
    g->A_log = w->A_log + p->gdn_head_rows.begin;
    g->dt_bias = w->dt_bias + p->gdn_head_rows.begin;
    g->norm_w = w->norm_w;
    return qd_shard_cols_copy(m, &w->out, p->gdn_z_rows, &g->out, err);
}

static qd_status slice_attn(qd_model *m, const qd_shard_plan *p, const qd_attn_weights *w, qd_attn_weights *a,
                            qd_err *err) {
    QD_TRY(rows_of(m, &w->q, p->attn_q_rows, &a->q, err));
    QD_TRY(rows_of(m, &w->k, p->attn_kv_rows, &a->k, err));
    QD_TRY(rows_of(m, &w->v, p->attn_kv_rows, &a->v, err));
    a->q_norm = w->q_norm;
    a->k_norm = w->k_norm;
    return qd_shard_cols_copy(m, &w->o, p->attn_o_cols, &a->o, err);
}

/* Experts outside the rank's partition stay zero-sized: the expert-parallel MoE forward
 * never reads them. */
static qd_status slice_moe(qd_model *m, const qd_shard_plan *p, const qd_moe_weights *w, qd_moe_weights *o,
                           qd_err *err) {
    const int E = m->cfg.n_experts;
    o->router = w->router;
    o->experts = qd_model_alloc(m, sizeof(qd_mlp_weights) * (size_t)E);
    if (!o->experts) return qd_seterr(err, QD_ERR_OOM, "out of memory for %d experts", E);
    memset(o->experts, 0, sizeof(qd_mlp_weights) * (size_t)E);
    for (int e = p->expert0; e < p->expert0 + p->n_local_experts; e++)
        QD_TRY(slice_mlp(m, &w->experts[e], p->expert_rows, &o->experts[e], err));
    o->has_shared = w->has_shared;
    if (o->has_shared) {
        QD_TRY(slice_mlp(m, &w->shared, p->shared_rows, &o->shared, err));
        o->shared_gate = w->shared_gate;
    }
    return QD_OK;
}

static qd_status slice_layers(qd_model *full, const qd_shard_plan *p, qd_model *m, qd_err *err) {
    const int n = full->cfg.n_layers;
    m->w.layers = qd_model_alloc(m, sizeof(qd_layer) * (size_t)n);
    if (!m->w.layers) return qd_seterr(err, QD_ERR_OOM, "out of memory for %d layers", n);
    memset(m->w.layers, 0, sizeof(qd_layer) * (size_t)n);
    for (int L = 0; L < n; L++) {
        const qd_layer *src = &full->w.layers[L];
        qd_layer *dst = &m->w.layers[L];
        dst->kind = src->kind;
        dst->ffn_kind = src->ffn_kind;
        dst->state_index = src->state_index;
        dst->input_norm = src->input_norm;
        dst->post_norm = src->post_norm;
        if (src->kind == QD_LAYER_GDN) QD_TRY(slice_gdn(m, p, &src->gdn, &dst->gdn, err));
        else QD_TRY(slice_attn(m, p, &src->attn, &dst->attn, err));
        if (src->ffn_kind == QD_FFN_MOE) QD_TRY(slice_moe(m, p, &src->moe, &dst->moe, err));
        else QD_TRY(slice_mlp(m, &src->mlp, p->mlp_rows, &dst->mlp, err));
    }
    return QD_OK;
}

/* The MTP head: its decoder layer sliced like a main layer of its kinds (a plan slices
 * the kinds the main layers have: qd_mtp_plan_lacks); fc and the norms are whole. */
static qd_status slice_mtp(qd_model *full, const qd_shard_plan *p, qd_model *m, qd_err *err) {
    const qd_mtp_weights *src = full->w.mtp;
    if (!src) {
        snprintf(m->mtp_missing, sizeof m->mtp_missing, "%s", full->mtp_missing);
        return QD_OK;
    }
    const char *lacks = qd_mtp_plan_lacks(&full->cfg, p);
    if (lacks) {
        snprintf(m->mtp_missing, sizeof m->mtp_missing, "the checkpoint's MTP head is unusable: %s", lacks);
        return QD_OK;
    }
    qd_mtp_weights *w = qd_model_alloc(m, sizeof *w);
    if (!w) return qd_seterr(err, QD_ERR_OOM, "out of memory for the MTP head");
    *w = *src;
    memset(&w->layer.attn, 0, sizeof w->layer.attn);
    memset(&w->layer.mlp, 0, sizeof w->layer.mlp);
    memset(&w->layer.moe, 0, sizeof w->layer.moe);
    QD_TRY(slice_attn(m, p, &src->layer.attn, &w->layer.attn, err));
    if (src->layer.ffn_kind == QD_FFN_MOE) QD_TRY(slice_moe(m, p, &src->layer.moe, &w->layer.moe, err));
    else QD_TRY(slice_mlp(m, &src->layer.mlp, p->mlp_rows, &w->layer.mlp, err));
    m->w.mtp = w;
    return QD_OK;
}

qd_status qd_shard_model_slice(qd_model *full, const qd_shard_plan *p, qd_model **out, qd_err *err) {
    *out = NULL;
    qd_model *m = calloc(1, sizeof *m);
    if (!m) return qd_seterr(err, QD_ERR_OOM, "out of memory for a rank model");
    m->cfg = p->local;
    m->backend = QD_BACKEND_CPU;  /* host slices; no device weights */
    m->gen = full->gen;
    memcpy(m->eos_ids, full->eos_ids, sizeof m->eos_ids);
    m->n_eos = full->n_eos;
    m->dummy_dtype = full->dummy_dtype;
    m->pool = full->pool;  /* borrowed: the ranks of the in-process group run one after another */
    m->w.embed = full->w.embed;
    m->w.lm_head = full->w.lm_head;
    m->w.final_norm = full->w.final_norm;
    m->w.n_gdn = full->w.n_gdn;
    m->w.n_attn = full->w.n_attn;
    m->w.expert0 = p->expert0;
    m->w.n_local_experts = p->n_local_experts;
    qd_status s = slice_layers(full, p, m, err);
    if (s == QD_OK) s = slice_mtp(full, p, m, err);
    if (s != QD_OK) {
        qd_shard_model_free(m);
        return s;
    }
    snprintf(m->describe, sizeof m->describe, "%s: rank %d of %d%s", full->cfg.model_type, p->rank, p->tp_size,
             p->expert_parallel ? " (expert parallel)" : "");
    *out = m;
    return QD_OK;
}

void qd_shard_model_free(qd_model *m) {
    if (!m) return;
    m->pool = NULL;  /* the full model's */
    m->st = NULL;
    qd_model_free(m);
}
