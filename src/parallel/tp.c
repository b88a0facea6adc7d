/* A split model behind the public API (tp.h): what every backend shares (plans, the
 * rank contexts' block tables, the state fan-out) and the CPU backend's in-process
 * group; the CUDA group is in cuda/tp_cuda.c. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "parallel/tp.h"
#include "parallel/tp_cpu.h"
#ifdef QD_HAVE_CUDA
#include "parallel/cuda/tp_cuda.h"
#endif

static bool on_cuda(const qd_model *m) { return m->backend == QD_BACKEND_CUDA; }

static void account(qd_model *m) {
    const qd_tp_model *t = m->tp;
    m->n_params = m->weight_bytes = m->active_weight_bytes = 0;
    for (int r = 0; r < t->size; r++) {
        m->n_params += t->ranks[r]->n_params;
        m->weight_bytes += t->ranks[r]->weight_bytes;
        m->active_weight_bytes += t->ranks[r]->active_weight_bytes;
    }
    const qd_config *c = &m->cfg;
    snprintf(m->describe, sizeof m->describe,
             "%s: %d layers (%d GDN, %d attention), hidden %d, GDN heads %d/%d, attention heads %d/%d, %s, vocab "
             "%d; split over %d %s ranks%s (weights summed over the ranks: %.3f B params)",
             c->model_type, c->n_layers, m->n_gdn, m->n_attn, c->hidden_size, c->gdn_hk, c->gdn_hv, c->attn_nq,
             c->attn_nkv, c->n_experts > 0 ? "MoE" : "dense FFN", c->vocab_size, t->size,
             on_cuda(m) ? (t->one_device ? "CUDA (one GPU)" : "CUDA") : "CPU",
             t->expert_parallel ? ", experts partitioned" : "", (double)m->n_params / 1e9);
}

qd_status qd_tp_model_load(qd_model *m, const qd_model_params *params, qd_err *err) {
    const int tp = params->tensor_parallel_size;
    if (tp < 2 || tp > QD_TP_MAX)
        return qd_seterr(err, QD_ERR_INVALID_ARG, "tensor parallel size %d: supported are 1 to %d (the GPUs of one node)",
                         tp, QD_TP_MAX);
    qd_tp_model *t = calloc(1, sizeof *t);
    if (!t) return qd_seterr(err, QD_ERR_OOM, "out of memory");
    m->tp = t;
    t->size = tp;
    t->expert_parallel = params->expert_parallel != 0;
    t->plans = calloc((size_t)tp, sizeof *t->plans);
    t->ranks = calloc((size_t)tp, sizeof *t->ranks);
    if (!t->plans || !t->ranks) return qd_seterr(err, QD_ERR_OOM, "out of memory");
    if (t->expert_parallel && m->cfg.n_experts == 0)
        return qd_seterr(err, QD_ERR_INVALID_ARG, "--expert-parallel: %s has no MoE layers", m->cfg.model_type);
    /* every plan first: a size that does not divide fails before anything is read */
    for (int r = 0; r < tp; r++) QD_TRY(qd_shard_plan_make(&m->cfg, tp, r, t->expert_parallel, &t->plans[r], err));
    if (on_cuda(m)) {
#ifdef QD_HAVE_CUDA
        QD_TRY(qd_tp_cuda_model_load(m, params, err));
#else
        return qd_seterr(err, QD_ERR_UNSUPPORTED, "this build of qdelta has no CUDA backend");
#endif
    } else {
        const qd_dtype dtype = params->load_format == QD_LOAD_DUMMY_F32 ? QD_DTYPE_F32 : QD_DTYPE_BF16;
        for (int r = 0; r < tp; r++) {
            qd_status s = qd_shard_model_load(m, &t->plans[r], params->seed, dtype, &t->ranks[r], err);
            if (s != QD_OK) {
                qd_err_prefix(err, "rank %d: ", r);
                return s;
            }
        }
    }
    account(m);
    return QD_OK;
}

void qd_tp_model_free(qd_model *m) {
    qd_tp_model *t = m->tp;
    if (!t) return;
#ifdef QD_HAVE_CUDA
    if (on_cuda(m)) qd_tp_cuda_model_free(m); /* frees the rank models on their threads */
#endif
    if (t->ranks)
        for (int r = 0; r < t->size; r++) qd_shard_model_free(t->ranks[r]);
    free(t->ranks);
    free(t->plans);
    free(t);
    m->tp = NULL;
}

void qd_tp_set_timing(qd_model *m, bool on) {
    if (m && m->tp) m->tp->timing = on;
}

/* ------------------------------------------------------------------ contexts */

qd_status qd_tp_ctx_create(qd_context *ctx) {
    qd_model *m = ctx->model;
    const qd_tp_model *t = m->tp;
    qd_tp_ctx *tc = calloc(1, sizeof *tc);
    if (!tc) return qd_seterr(&m->err, QD_ERR_OOM, "out of memory");
    ctx->tp = tc;
    tc->ranks = calloc((size_t)t->size, sizeof *tc->ranks);
    if (!tc->ranks) return qd_seterr(&m->err, QD_ERR_OOM, "out of memory");
#ifdef QD_HAVE_CUDA
    if (on_cuda(m)) return qd_tp_cuda_ctx_create(ctx);
#endif
    for (int r = 0; r < t->size; r++) {
        qd_status s = qd_context_create(t->ranks[r], &ctx->params, &tc->ranks[r]);
        if (s != QD_OK) return qd_seterr(&m->err, s, "rank %d: %s", r, qd_model_errmsg(t->ranks[r]));
    }
    return QD_OK;
}

void qd_tp_ctx_free(qd_context *ctx) {
    qd_tp_ctx *tc = ctx->tp;
    if (!tc) return;
#ifdef QD_HAVE_CUDA
    if (on_cuda(ctx->model)) qd_tp_cuda_ctx_free(ctx); /* frees the rank contexts on their threads */
#endif
    if (tc->ranks)
        for (int r = 0; r < ctx->model->tp->size; r++) qd_context_free(tc->ranks[r]);
    free(tc->ranks);
    free(tc);
    ctx->tp = NULL;
}

/* ------------------------------------------------------------------- forward */

/* The batch's sequences as ctx holds them: lengths and block tables (ranks never take
 * blocks themselves; their pools hold the contents of the blocks ctx hands out). */
static void sync_tables(const qd_context *ctx, qd_context *rank, int n_spans) {
    for (int i = 0; i < n_spans; i++) {
        const int seq = ctx->spans_rt[i].seq;
        const qd_seq_state *a = &ctx->seqs[seq];
        qd_seq_state *b = &rank->seqs[seq];
        b->length = a->length;
        b->n_blocks = a->n_blocks;
        if (a->n_blocks) memcpy(b->blocks, a->blocks, sizeof(int32_t) * (size_t)a->n_blocks);
        rank->spans_rt[i] = ctx->spans_rt[i];
    }
}

qd_status qd_tp_forward(qd_context *ctx, const qd_span *spans, int n_spans, int n_rows, int n_logit_rows,
                        const qd_logit_out *out) {
    const qd_tp_model *t = ctx->model->tp;
    qd_tp_ctx *tc = ctx->tp;
    for (int r = 0; r < t->size; r++) sync_tables(ctx, tc->ranks[r], n_spans);
#ifdef QD_HAVE_CUDA
    if (on_cuda(ctx->model))
        return qd_tp_cuda_forward(ctx, spans, n_spans, n_rows, n_logit_rows, out);
#endif
    for (int r = 0; r < t->size; r++) qd_forward_rank_begin(tc->ranks[r], spans, n_spans);
    QD_TRY(qd_tp_cpu_layers(tc->ranks, t->plans, t->size, n_spans, n_rows, &ctx->err));
    qd_status s = qd_forward_rank_logits(tc->ranks[0], spans, n_spans, n_logit_rows, out);
    if (s != QD_OK) return qd_seterr(&ctx->err, s, "rank 0: %s", tc->ranks[0]->err.msg);
    return QD_OK;
}

/* --------------------------------------------------------- state fan-out */

static qd_status each(qd_context *ctx, qd_tp_rank_fn fn, void *arg) {
#ifdef QD_HAVE_CUDA
    if (on_cuda(ctx->model)) return qd_tp_cuda_each(ctx, fn, arg);
#endif
    for (int r = 0; r < ctx->model->tp->size; r++) {
        qd_status s = fn(ctx->tp->ranks[r], r, arg);
        if (s != QD_OK) return qd_seterr(&ctx->err, s, "rank %d: %s", r, ctx->tp->ranks[r]->err.msg);
    }
    return QD_OK;
}

/* Rank r's [conv | recurrent] slice starts at the sum of the slices before it. */
static size_t rank_offset(const qd_context *ctx, int r) {
    size_t off = 0;
    for (int i = 0; i < r; i++) off += (size_t)qd_model_state_bytes(ctx->model->tp->ranks[i]);
    return off;
}

static size_t conv_bytes(const qd_model *m) {
    const qd_config *c = &m->cfg;
    return (size_t)m->n_gdn * (size_t)qd_config_conv_dim(c) * (size_t)(c->gdn_conv_kernel - 1) * sizeof(float);
}

size_t qd_tp_state_bytes(const qd_context *ctx) { return rank_offset(ctx, ctx->model->tp->size); }

typedef struct state_job {
    const qd_context *ctx;
    int seq, seq2;
    unsigned char *dst;
    const unsigned char *src;
} state_job;

static qd_status read_rank(qd_context *rc, int r, void *arg) {
    const state_job *j = arg;
    unsigned char *p = j->dst + rank_offset(j->ctx, r);
    return qd_seq_state_read(rc, j->seq, (float *)p, (float *)(p + conv_bytes(rc->model)));
}

static qd_status write_rank(qd_context *rc, int r, void *arg) {
    const state_job *j = arg;
    if (!j->src) return qd_seq_state_write(rc, j->seq, NULL, NULL);
    const unsigned char *p = j->src + rank_offset(j->ctx, r);
    return qd_seq_state_write(rc, j->seq, (const float *)p, (const float *)(p + conv_bytes(rc->model)));
}

static qd_status copy_rank(qd_context *rc, int r, void *arg) {
    const state_job *j = arg;
    (void)r;
    return qd_seq_state_copy(rc, j->seq, j->seq2);
}

static qd_status kv_copy_rank(qd_context *rc, int r, void *arg) {
    const state_job *j = arg;
    (void)r;
    return qd_kv_copy_block(rc, j->seq, j->seq2);
}

static qd_status snap_save_rank(qd_context *rc, int r, void *arg) {
    const state_job *j = arg;
    (void)r;
    return qd_snap_save(rc, j->seq, j->seq2);
}

static qd_status snap_load_rank(qd_context *rc, int r, void *arg) {
    const state_job *j = arg;
    (void)r;
    return qd_snap_load_state(rc, j->seq, j->seq2);
}

static qd_status snap_read_rank(qd_context *rc, int r, void *arg) {
    const state_job *j = arg;
    return qd_snap_read_payload(rc, j->seq2, j->dst + rank_offset(j->ctx, r));
}

qd_status qd_tp_snap_save(qd_context *ctx, int seq, int slot) {
    state_job j = {.ctx = ctx, .seq = seq, .seq2 = slot};
    return each(ctx, snap_save_rank, &j);
}

qd_status qd_tp_snap_load(qd_context *ctx, int seq, int slot) {
    state_job j = {.ctx = ctx, .seq = seq, .seq2 = slot};
    return each(ctx, snap_load_rank, &j);
}

qd_status qd_tp_snap_read(qd_context *ctx, int slot, void *dst) {
    state_job j = {.ctx = ctx, .seq2 = slot, .dst = dst};
    return each(ctx, snap_read_rank, &j);
}

qd_status qd_tp_state_read(qd_context *ctx, int seq, void *dst) {
    state_job j = {.ctx = ctx, .seq = seq, .dst = dst};
    return each(ctx, read_rank, &j);
}

qd_status qd_tp_state_write(qd_context *ctx, int seq, const void *src) {
    state_job j = {.ctx = ctx, .seq = seq, .src = src};
    return each(ctx, write_rank, &j);
}

qd_status qd_tp_state_copy(qd_context *ctx, int src, int dst) {
    state_job j = {.ctx = ctx, .seq = src, .seq2 = dst};
    return each(ctx, copy_rank, &j);
}

qd_status qd_tp_kv_copy_block(qd_context *ctx, int32_t dst, int32_t src) {
    state_job j = {.ctx = ctx, .seq = dst, .seq2 = src};
    return each(ctx, kv_copy_rank, &j);
}

qd_status qd_tp_allreduce_ms(qd_context *ctx, double *ms, int *count) {
    *ms = 0;
    *count = 0;
#ifdef QD_HAVE_CUDA
    if (ctx->tp && on_cuda(ctx->model)) return qd_tp_cuda_allreduce_ms(ctx, ms, count);
#endif
    return qd_seterr(&ctx->err, QD_ERR_UNSUPPORTED, "all-reduce timing: only a split model on CUDA times them");
}
