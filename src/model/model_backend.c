/* A loaded model's backend: the registry's table for m->backend (the split backend when
 * the model is split over ranks) and its model made from the bound weights; the
 * backend-wide queries of the public API. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/model_quant.h"
#include "model/model_split.h"

/* A backend that cannot multiply a quantized format refuses the model by name, never
 * reading the quantized bytes as plain values. */
static qd_status check_formats(const qd_backend_ops *ops, const qd_config *c, const qd_weights *w, qd_err *err) {
    char where[96];
    const qd_weight *q = qd_weights_first_quantized(c, w, where, sizeof where);
    if (q && !ops->quantized_weights)
        return qd_seterr(err, QD_ERR_UNSUPPORTED, "the %s backend does not multiply quantized weights yet (%s is %s)",
                         ops->name, where, qd_dtype_name(q->dtype));
    return QD_OK;
}

static qd_status make_backend(qd_model *m, const qd_backend_model_desc *d, qd_err *err) {
    QD_TRY(m->ops->model_create(d, &m->bm, err));
    return QD_OK;
}

/* The ranks' plans and models, each reading its slices (or drawing its dummy weights). */
static qd_status load_ranks(qd_model *m, const qd_model_params *params, qd_err *err) {
    const int n = params->tensor_parallel_size;
    if (n < 2 || n > QD_SPLIT_MAX)
        return qd_seterr(err, QD_ERR_INVALID_ARG, "tensor parallel size %d: supported are 1 to %d (the GPUs of one node)",
                         n, QD_SPLIT_MAX);
    qd_model_split *t = calloc(1, sizeof *t);
    if (!t) return qd_seterr(err, QD_ERR_OOM, "out of memory");
    m->split = t;
    t->size = n;
    t->expert_parallel = params->expert_parallel != 0;
    t->plans = calloc((size_t)n, sizeof *t->plans);
    t->ranks = calloc((size_t)n, sizeof *t->ranks);
    t->descs = calloc((size_t)n, sizeof *t->descs);
    if (!t->plans || !t->ranks || !t->descs) return qd_seterr(err, QD_ERR_OOM, "out of memory");
    if (t->expert_parallel && m->cfg.n_experts == 0)
        return qd_seterr(err, QD_ERR_INVALID_ARG, "--expert-parallel: %s has no MoE layers", m->cfg.model_type);
    /* every plan first: a size that does not divide fails before anything is read */
    for (int r = 0; r < n; r++) QD_TRY(qd_shard_plan_make(&m->cfg, n, r, t->expert_parallel, &t->plans[r], err));
    const qd_dtype dtype = params->load_format == QD_LOAD_DUMMY_F32 ? QD_DTYPE_F32 : QD_DTYPE_BF16;
    for (int r = 0; r < n; r++) {
        qd_status s = qd_shard_model_load(m, &t->plans[r], params->seed, dtype, &t->ranks[r], err);
        if (s != QD_OK) {
            qd_err_prefix(err, "rank %d: ", r);
            return s;
        }
        t->descs[r] = (qd_backend_model_desc){
            .cfg = &t->ranks[r]->cfg, .w = &t->ranks[r]->w, .pool = m->pool, .device = 0};
    }
    return QD_OK;
}

void qd_model_split_mtp(qd_model *top) {
    qd_model_split *t = top->split;
    t->mtp = true;
    for (int r = 0; r < t->size && t->mtp; r++) {
        if (t->ranks[r]->w.mtp) continue;
        t->mtp = false;
        snprintf(top->mtp_missing, sizeof top->mtp_missing, "%s", t->ranks[r]->mtp_missing);
    }
    if (t->mtp) top->mtp_missing[0] = 0;
}

int qd_model_mtp_bound(const qd_model *m) { return m->split ? m->split->mtp : m->w.mtp != NULL; }

static void account_split(qd_model *m, const char *backend_name) {
    const qd_model_split *t = m->split;
    m->n_params = m->weight_bytes = m->active_weight_bytes = 0;
    for (int r = 0; r < t->size; r++) {
        m->n_params += t->ranks[r]->n_params;
        m->weight_bytes += t->ranks[r]->weight_bytes;
        m->active_weight_bytes += t->ranks[r]->active_weight_bytes;
    }
    /* a rank's experts are slices of every expert (tensor parallel) or whole experts of
     * its own (expert parallel) */
    m->expert_bytes = 0;
    for (int r = 0; r < (t->expert_parallel ? 1 : t->size); r++) m->expert_bytes += t->ranks[r]->expert_bytes;
    m->n_moe_layers = t->ranks[0]->n_moe_layers;
    const qd_config *c = &m->cfg;
    snprintf(m->describe, sizeof m->describe,
             "%s: %d layers (%d GDN, %d attention), hidden %d, GDN heads %d/%d, attention heads %d/%d, %s, vocab "
             "%d; split over %d %s ranks%s (weights summed over the ranks: %.3f B params)",
             c->model_type, c->n_layers, m->w.n_gdn, m->w.n_attn, c->hidden_size, c->gdn_hk, c->gdn_hv, c->attn_nq,
             c->attn_nkv, c->n_experts > 0 ? "MoE" : "dense FFN", c->vocab_size, t->size, backend_name,
             t->expert_parallel ? ", experts partitioned" : "", (double)m->n_params / 1e9);
}

qd_status qd_model_backend_create(qd_model *m, const qd_model_params *params, qd_err *err) {
    const bool split = params && params->tensor_parallel_size > 1;
    if (!m->ops && !(m->ops = qd_backend_find(m->backend, split, err))) return err->status;
    if (!split) {
        QD_TRY(check_formats(m->ops, &m->cfg, &m->w, err));
        return make_backend(m, &(qd_backend_model_desc){.cfg = &m->cfg, .w = &m->w, .pool = m->pool}, err);
    }
    const qd_backend_ops *rank_ops = qd_backend_find(m->backend, false, err);
    if (!rank_ops) return err->status;
    QD_TRY(load_ranks(m, params, err));
    qd_model_split_mtp(m);
    const qd_model_split *t = m->split;
    for (int r = 0; r < t->size; r++) QD_TRY(check_formats(rank_ops, &t->ranks[r]->cfg, &t->ranks[r]->w, err));
    const qd_backend_model_desc d = {.cfg = &m->cfg, .w = &m->w, .pool = m->pool, .n_ranks = t->size,
                                     .ranks = t->descs, .rank_ops = rank_ops,
                                     .expert_parallel = t->expert_parallel, .tp_devices = params->tp_devices};
    QD_TRY(make_backend(m, &d, err));
    /* nothing reads a copying backend's host weights again */
    if (rank_ops->copies_weights)
        for (int r = 0; r < t->size; r++) qd_shard_model_drop_host(t->ranks[r]);
    account_split(m, m->ops->name);
    return QD_OK;
}

void qd_model_backend_free(qd_model *m) {
    if (m->bm) m->ops->model_free(m->bm);
    m->bm = NULL;
    qd_model_split *t = m->split;
    if (!t) return;
    if (t->ranks)
        for (int r = 0; r < t->size; r++) qd_shard_model_free(t->ranks[r]);
    free(t->ranks);
    free(t->plans);
    free(t->descs);
    free(t);
    m->split = NULL;
}

/* ----------------------------------------------------------- public queries */

qd_status qd_backend_copy_gbps(qd_backend_kind kind, size_t bytes, int n_threads, double *gbps, char *errbuf,
                               size_t err_size) {
    qd_err err;
    qd_err_clear(&err);
    *gbps = 0;
    const qd_backend_ops *ops = qd_backend_find(kind, false, &err);
    qd_status s = ops ? ops->copy_gbps(bytes, n_threads, gbps, &err) : err.status;
    if (s != QD_OK && errbuf && err_size) snprintf(errbuf, err_size, "%s", err.msg);
    return s;
}

qd_status qd_backend_device_info(qd_backend_kind kind, qd_device_info *out, char *errbuf, size_t err_size) {
    qd_err err;
    qd_err_clear(&err);
    memset(out, 0, sizeof *out);
    const qd_backend_ops *ops = qd_backend_find(kind, false, &err);
    qd_status s = ops ? ops->device_info(out, &err) : err.status;
    if (s != QD_OK && errbuf && err_size) snprintf(errbuf, err_size, "%s", err.msg);
    return s;
}

qd_status qd_model_set_comm_timing(qd_model *m, int on) {
    if (!m->ops->set_comm_timing)
        return qd_seterr(&m->err, QD_ERR_UNSUPPORTED, "all-reduce timing: the %s backend has no all-reduces",
                         m->ops->name);
    m->ops->set_comm_timing(m->bm, on != 0);
    return QD_OK;
}

qd_status qd_context_count_experts(qd_context *ctx, int on) {
    if (!ctx) return QD_ERR_INVALID_ARG;
    const qd_config *c = &ctx->model->cfg;
    if (!on) {
        free(ctx->experts_touched);
        ctx->experts_touched = NULL;
        return QD_OK;
    }
    if (c->n_experts == 0)
        return qd_seterr(&ctx->err, QD_ERR_UNSUPPORTED, "expert counts: the model has no MoE layers");
    if (!ctx->model->ops->counts_experts)
        return qd_seterr(&ctx->err, QD_ERR_UNSUPPORTED, "expert counts: the %s backend%s does not count its routing",
                         ctx->model->ops->name, ctx->model->split ? " split over ranks" : "");
    if (!ctx->experts_touched) {
        ctx->experts_touched = calloc((size_t)c->n_layers * (size_t)c->n_experts, 1);
        if (!ctx->experts_touched) return qd_seterr(&ctx->err, QD_ERR_OOM, "out of memory for the expert counts");
        ctx->routed_pairs = -1;
    }
    return QD_OK;
}

qd_status qd_context_routed_experts(const qd_context *ctx, int64_t *pairs) {
    *pairs = 0;
    if (!ctx || !ctx->experts_touched || ctx->routed_pairs < 0) return QD_ERR_INVALID_ARG;
    *pairs = ctx->routed_pairs;
    return QD_OK;
}

qd_status qd_context_comm_time(qd_context *ctx, double *ms, int *count) {
    *ms = 0;
    *count = 0;
    if (!ctx->model->ops->comm_time)
        return qd_seterr(&ctx->err, QD_ERR_UNSUPPORTED, "all-reduce timing: the %s backend has no all-reduces",
                         ctx->model->ops->name);
    return ctx->model->ops->comm_time(ctx->bc, ms, count);
}
