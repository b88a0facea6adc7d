/* A rank's model cut from a loaded full model by a sharding plan (shard.h). Row ranges of
 * a row-major [rows][cols] weight are views; a column range, or rows gathered from
 * separate runs, is copied into a buffer the rank model owns. With tp_size 1 every range
 * is whole and every weight a view, so the rank model computes exactly as the full one. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/model_shard.h"

qd_weight qd_shard_rows_view(const qd_weight *w, qd_shard_range r) {
    const size_t esz = qd_dtype_size(w->dtype);
    return (qd_weight){.dtype = w->dtype, .rows = r.count, .cols = w->cols,
                       .data = (const unsigned char *)w->data + (size_t)(r.begin * w->cols) * esz};
}

static int runs_contiguous(const qd_shard_range *runs, int n) {
    for (int i = 1; i < n; i++)
        if (runs[i].begin != runs[i - 1].begin + runs[i - 1].count) return 0;
    return 1;
}

qd_status qd_shard_rows_gather(qd_model *m, const qd_weight *w, const qd_shard_range *runs, int n, qd_weight *out,
                             qd_err *err) {
    int64_t rows = 0;
    for (int i = 0; i < n; i++) rows += runs[i].count;
    if (runs_contiguous(runs, n)) {
        *out = qd_shard_rows_view(w, (qd_shard_range){runs[0].begin, rows});
        return QD_OK;
    }
    const size_t esz = qd_dtype_size(w->dtype), row_bytes = (size_t)w->cols * esz;
    unsigned char *dst = qd_model_alloc(m, (size_t)rows * row_bytes);
    if (!dst) return qd_seterr(err, QD_ERR_OOM, "out of memory slicing a %lld-row weight", (long long)rows);
    size_t off = 0;
    for (int i = 0; i < n; i++) {
        memcpy(dst + off, (const unsigned char *)w->data + (size_t)runs[i].begin * row_bytes,
               (size_t)runs[i].count * row_bytes);
        off += (size_t)runs[i].count * row_bytes;
    }
    *out = (qd_weight){.dtype = w->dtype, .rows = rows, .cols = w->cols, .data = dst};
    return QD_OK;
}

qd_status qd_shard_cols_copy(qd_model *m, const qd_weight *w, qd_shard_range c, qd_weight *out, qd_err *err) {
    if (c.begin == 0 && c.count == w->cols) {
        *out = *w;
        return QD_OK;
    }
    const size_t esz = qd_dtype_size(w->dtype);
    unsigned char *dst = qd_model_alloc(m, (size_t)(w->rows * c.count) * esz);
    if (!dst) return qd_seterr(err, QD_ERR_OOM, "out of memory slicing a %lld-column weight", (long long)c.count);
    for (int64_t r = 0; r < w->rows; r++)
        memcpy(dst + (size_t)(r * c.count) * esz, (const unsigned char *)w->data + (size_t)(r * w->cols + c.begin) * esz,
               (size_t)c.count * esz);
    *out = (qd_weight){.dtype = w->dtype, .rows = w->rows, .cols = c.count, .data = dst};
    return QD_OK;
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
    out->gate = qd_shard_rows_view(&w->gate, rows);
    out->up = qd_shard_rows_view(&w->up, rows);
    return qd_shard_cols_copy(m, &w->down, rows, &out->down, err);
}

static qd_status slice_gdn(qd_model *m, const qd_shard_plan *p, const qd_gdn_weights *w, qd_gdn_weights *g,
                           qd_err *err) {
    QD_TRY(qd_shard_rows_gather(m, &w->in_qkv, p->gdn_qkv_rows, 3, &g->in_qkv, err));
    g->in_z = qd_shard_rows_view(&w->in_z, p->gdn_z_rows);
    g->in_b = qd_shard_rows_view(&w->in_b, p->gdn_head_rows);
    g->in_a = qd_shard_rows_view(&w->in_a, p->gdn_head_rows);
    QD_TRY(conv_gather(m, w->conv_w, m->cfg.gdn_conv_kernel, p->gdn_qkv_rows, 3, &g->conv_w, err));
    g->A_log = w->A_log + p->gdn_head_rows.begin;
    g->dt_bias = w->dt_bias + p->gdn_head_rows.begin;
    g->norm_w = w->norm_w;
    return qd_shard_cols_copy(m, &w->out, p->gdn_z_rows, &g->out, err);
}

static qd_status slice_attn(qd_model *m, const qd_shard_plan *p, const qd_attn_weights *w, qd_attn_weights *a,
                            qd_err *err) {
    a->q = qd_shard_rows_view(&w->q, p->attn_q_rows);
    a->k = qd_shard_rows_view(&w->k, p->attn_kv_rows);
    a->v = qd_shard_rows_view(&w->v, p->attn_kv_rows);
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
