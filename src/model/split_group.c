/* A split CPU model cut from a loaded model (split_group.h). */
#include <stdlib.h>
#include <string.h>

#include "model/model_split.h"
#include "model/split_group.h"
#include "parallel/split.h"

void qd_tp_cpu_free(qd_tp_cpu *g) {
    if (!g) return;
    qd_context_free(g->ctx);
    if (g->top) {
        g->top->pool = NULL; /* the full model's */
        qd_model_free(g->top); /* the split backend, then the rank models */
    }
    free(g->ctxs);
    free(g);
}

static qd_status make(qd_tp_cpu *g, qd_model *full, int n, bool ep, const qd_context_params *params, qd_err *err) {
    if (n < 1) return qd_seterr(err, QD_ERR_INVALID_ARG, "tensor parallel size %d must be at least 1", n);
    if (n > QD_SPLIT_MAX)
        return qd_seterr(err, QD_ERR_INVALID_ARG, "tensor parallel size %d: at most %d ranks", n, QD_SPLIT_MAX);
    if (full->backend != QD_BACKEND_CPU || full->split)
        return qd_seterr(err, QD_ERR_UNSUPPORTED, "the in-process tensor-parallel group slices an unsplit CPU model");
    qd_model *top = calloc(1, sizeof *top);
    if (!top) return qd_seterr(err, QD_ERR_OOM, "out of memory");
    g->top = top;
    top->cfg = full->cfg;
    top->gen = full->gen;
    memcpy(top->eos_ids, full->eos_ids, sizeof top->eos_ids);
    top->n_eos = full->n_eos;
    top->backend = QD_BACKEND_CPU;
    top->pool = full->pool;
    QD_TRY(qd_model_init_layers(top, err));
    qd_model_split *t = calloc(1, sizeof *t);
    if (!t) return qd_seterr(err, QD_ERR_OOM, "out of memory");
    top->split = t;
    t->size = n;
    t->expert_parallel = ep;
    t->plans = calloc((size_t)n, sizeof *t->plans);
    t->ranks = calloc((size_t)n, sizeof *t->ranks);
    t->descs = calloc((size_t)n, sizeof *t->descs);
    g->ctxs = calloc((size_t)n, sizeof *g->ctxs);
    if (!t->plans || !t->ranks || !t->descs || !g->ctxs) return qd_seterr(err, QD_ERR_OOM, "out of memory");
    for (int r = 0; r < n; r++) {
        QD_TRY(qd_shard_plan_make(&full->cfg, n, r, ep, &t->plans[r], err));
        QD_TRY(qd_shard_model_slice(full, &t->plans[r], &t->ranks[r], err));
        t->descs[r] = (qd_backend_model_desc){.cfg = &t->ranks[r]->cfg, .w = &t->ranks[r]->w, .pool = full->pool};
    }
    qd_model_split_mtp(top);
    const qd_backend_ops *cpu = qd_backend_find(QD_BACKEND_CPU, false, err);
    if (!(top->ops = qd_backend_find(QD_BACKEND_CPU, true, err)) || !cpu) return err->status;
    const qd_backend_model_desc d = {.cfg = &top->cfg, .w = &top->w, .pool = full->pool, .n_ranks = n,
                                     .ranks = t->descs, .rank_ops = cpu, .expert_parallel = ep};
    QD_TRY(top->ops->model_create(&d, &top->bm, err));
    qd_status s = qd_context_create(top, params, &g->ctx);
    if (s != QD_OK) return qd_seterr(err, s, "%s", qd_model_errmsg(top));
    for (int r = 0; r < n; r++) g->ctxs[r] = qd_split_rank_ctx(g->ctx->bc, r);
    g->tp_size = n;
    g->expert_parallel = ep;
    g->plans = t->plans;
    g->models = t->ranks;
    return QD_OK;
}

qd_status qd_tp_cpu_create(qd_model *full, int tp_size, bool expert_parallel, const qd_context_params *params,
                           qd_tp_cpu **out, qd_err *err) {
    *out = NULL;
    qd_tp_cpu *g = calloc(1, sizeof *g);
    if (!g) return qd_seterr(err, QD_ERR_OOM, "out of memory for a tensor-parallel group");
    qd_status s = make(g, full, tp_size, expert_parallel, params, err);
    if (s != QD_OK) {
        qd_tp_cpu_free(g);
        return s;
    }
    *out = g;
    return QD_OK;
}

qd_status qd_tp_forward_cpu(qd_tp_cpu *g, const qd_span *spans, int n_spans, float *logits) {
    qd_status s = qd_forward(g->ctx, spans, n_spans, logits);
    if (s != QD_OK) return qd_seterr(&g->err, s, "%s", qd_context_errmsg(g->ctx));
    return QD_OK;
}
