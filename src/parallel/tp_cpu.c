/* In-process tensor-parallel forward (tp_cpu.h). The ranks run one after another over
 * the same layer code as qd_forward, each on its own rank model and context; between
 * the blocks their partial outputs are summed in rank order, which is what an NCCL
 * all-reduce does across GPUs (up to its summation order). */
#include <stdlib.h>
#include <string.h>

#include "parallel/tp_cpu.h"

void qd_tp_cpu_free(qd_tp_cpu *g) {
    if (!g) return;
    for (int r = 0; r < g->tp_size; r++) {
        if (g->ctxs) qd_context_free(g->ctxs[r]);
        if (g->models) qd_shard_model_free(g->models[r]);
    }
    free(g->ctxs);
    free(g->models);
    free(g->plans);
    free(g);
}

qd_status qd_tp_cpu_create(qd_model *full, int tp_size, bool expert_parallel, const qd_context_params *params,
                           qd_tp_cpu **out, qd_err *err) {
    *out = NULL;
    if (tp_size < 1) return qd_seterr(err, QD_ERR_INVALID_ARG, "tensor parallel size %d must be at least 1", tp_size);
    if (full->backend != QD_BACKEND_CPU)
        return qd_seterr(err, QD_ERR_UNSUPPORTED, "the in-process tensor-parallel group slices a CPU-backend model");
    qd_tp_cpu *g = calloc(1, sizeof *g);
    if (!g) return qd_seterr(err, QD_ERR_OOM, "out of memory for a tensor-parallel group");
    g->tp_size = tp_size;
    g->expert_parallel = expert_parallel;
    g->plans = calloc((size_t)tp_size, sizeof *g->plans);
    g->models = calloc((size_t)tp_size, sizeof *g->models);
    g->ctxs = calloc((size_t)tp_size, sizeof *g->ctxs);
    qd_status s = QD_OK;
    if (!g->plans || !g->models || !g->ctxs) {
        s = qd_seterr(err, QD_ERR_OOM, "out of memory for a tensor-parallel group");
        goto fail;
    }
    for (int r = 0; r < tp_size; r++) {
        if ((s = qd_shard_plan_make(&full->cfg, tp_size, r, expert_parallel, &g->plans[r], err)) != QD_OK) goto fail;
        if ((s = qd_shard_model_slice(full, &g->plans[r], &g->models[r], err)) != QD_OK) goto fail;
        if ((s = qd_context_create(g->models[r], params, &g->ctxs[r])) != QD_OK) {
            qd_seterr(err, s, "rank %d: %s", r, qd_model_errmsg(g->models[r]));
            goto fail;
        }
    }
    *out = g;
    return QD_OK;
fail:
    qd_tp_cpu_free(g);
    return s;
}

/* The all-reduce: every rank's y becomes y_0 + y_1 + ... in rank order. */
static void all_reduce_y(qd_context *const *ctxs, int tp, size_t n) {
    float *acc = ctxs[0]->s.y;
    for (int r = 1; r < tp; r++) {
        const float *y = ctxs[r]->s.y;
        for (size_t i = 0; i < n; i++) acc[i] += y[i];
    }
    for (int r = 1; r < tp; r++) memcpy(ctxs[r]->s.y, acc, n * sizeof(float));
}

static void add_residual(qd_context *const *ctxs, int tp, size_t n) {
    for (int r = 0; r < tp; r++) {
        float *h = ctxs[r]->s.h;
        const float *y = ctxs[r]->s.y;
        for (size_t i = 0; i < n; i++) h[i] += y[i];
    }
}

/* One block (mixer or FFN) of layer L on one rank: normed input, partial output in s.y. */
static qd_status rank_block(qd_context *ctx, const qd_shard_plan *p, int L, int ffn, int n_spans, int n_rows) {
    const qd_config *c = &ctx->model->cfg;
    const qd_layer *ly = &ctx->model->layers[L];
    qd_scratch *s = &ctx->s;
    const int H = c->hidden_size;
    qd_cpu_rmsnorm(s->h, n_rows, H, H, ffn ? ly->post_norm : ly->input_norm, 1.0f, c->rms_norm_eps, s->x, H);
    if (!ffn) {
        if (ly->kind == QD_LAYER_GDN) return qd_layer_gdn_forward(ctx, ly, ctx->spans_rt, n_spans, n_rows, s->x, s->y);
        return qd_layer_attn_forward(ctx, ly, ctx->spans_rt, n_spans, n_rows, s->x, s->y);
    }
    if (ly->ffn_kind == QD_FFN_DENSE) return qd_layer_mlp_forward(ctx, &ly->mlp, n_rows, s->x, s->y);
    return qd_layer_moe_forward_experts(ctx, &ly->moe, p->expert0, p->expert0 + p->n_local_experts, n_rows, s->x, s->y);
}

qd_status qd_tp_cpu_layers(qd_context *const *ctxs, const qd_shard_plan *plans, int tp, int n_spans, int n_rows,
                           qd_err *err) {
    const qd_config *c = &ctxs[0]->model->cfg;
    const size_t n = (size_t)n_rows * (size_t)c->hidden_size;
    for (int L = 0; L < c->n_layers; L++) {
        for (int ffn = 0; ffn < 2; ffn++) {
            for (int r = 0; r < tp; r++) {
                qd_status s = rank_block(ctxs[r], &plans[r], L, ffn, n_spans, n_rows);
                if (s != QD_OK) return qd_seterr(err, s, "rank %d, layer %d: %s", r, L, ctxs[r]->err.msg);
            }
            all_reduce_y(ctxs, tp, n);
            add_residual(ctxs, tp, n);
        }
    }
    return QD_OK;
}

qd_status qd_tp_forward_cpu(qd_tp_cpu *g, const qd_span *spans, int n_spans, float *logits) {
    int n_rows = 0, n_logit_rows = 0;
    /* batch checks depend only on sequence lengths and block tables, which every rank
     * holds alike: rank 0 refusing a batch means no rank has reserved anything */
    for (int r = 0; r < g->tp_size; r++) {
        qd_status s = qd_forward_begin(g->ctxs[r], spans, n_spans, logits, &n_rows, &n_logit_rows);
        if (s != QD_OK) {
            if (r > 0)
                return qd_seterr(&g->err, QD_ERR_INTERNAL, "rank %d diverged from rank 0: %s", r, g->ctxs[r]->err.msg);
            return qd_seterr(&g->err, s, "%s", g->ctxs[0]->err.msg);
        }
    }
    QD_TRY(qd_tp_cpu_layers(g->ctxs, g->plans, g->tp_size, n_spans, n_rows, &g->err));
    for (int r = 0; r < g->tp_size; r++) {
        qd_status s = qd_forward_end(g->ctxs[r], spans, n_spans, r == 0 ? n_logit_rows : 0, r == 0 ? logits : NULL);
        if (s != QD_OK) return qd_seterr(&g->err, s, "rank %d: %s", r, g->ctxs[r]->err.msg);
    }
    return QD_OK;
}
