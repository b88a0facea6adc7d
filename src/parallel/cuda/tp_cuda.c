/* A split model on CUDA (tp_cuda.h, docs/parallel.md): one host thread per rank, which
 * selects the rank's GPU once and then does every CUDA call of the rank (loading and
 * uploading its weights, creating its context, its forwards, its state copies). The rank
 * contexts are ordinary CUDA contexts of the rank models with a reduce hook installed: at
 * every all-reduce point of the forward the hook hands the block's partial output to the
 * communicator (comm.h). Rank 0 computes the logits; the others skip the LM head. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_model.h"
#include "base/log.h"
#include "parallel/cuda/comm.h"
#include "parallel/cuda/tp_cuda.h"
#include "parallel/cuda/tp_cuda_rt.h"
#include "parallel/tp_workers.h"

/* One rank's side of a context. */
typedef struct tp_rank {
    struct qd_tp_cuda_ctx *group;
    int rank;
    int calls;        /* all-reduces issued since the forward began (recorded ones, in a capture) */
    int eager;        /* the rank context's own setting (no CUDA graphs at all) */
    int n_pairs;      /* timing events: ev[2 i], ev[2 i + 1] around the i-th all-reduce of a step */
    void **ev;
} tp_rank;

struct qd_tp_cuda_ctx {
    qd_comm_group *comm;
    tp_rank ranks[QD_TP_MAX];
    int H;
    pthread_mutex_t mu;
    int failed_rank;  /* the first rank that failed in a forward (-1: none); the group is then broken */
    char failure[QD_ERRMSG_SIZE];
};

/* ---------------------------------------------------------------- the model */

typedef struct init_job {
    const qd_tp_model *t;
    qd_err errs[QD_TP_MAX];
} init_job;

static qd_status init_rank_thread(void *arg, int r) {
    init_job *j = arg;
    qd_status s = qd_tp_set_device(j->t->devices[r]);
    if (s != QD_OK) qd_seterr(&j->errs[r], s, "%s", qd_cuda_last_error());
    return s;
}

typedef struct load_job {
    qd_model *m;
    uint64_t seed;
    qd_dtype dtype;
    qd_err errs[QD_TP_MAX];
} load_job;

static qd_status load_rank(void *arg, int r) {
    load_job *j = arg;
    qd_tp_model *t = j->m->tp;
    return qd_shard_model_load(j->m, &t->plans[r], j->seed, j->dtype, &t->ranks[r], &j->errs[r]);
}

static qd_status free_rank_model(void *arg, int r) {
    qd_tp_model *t = arg;
    qd_shard_model_free(t->ranks[r]); /* its device weights, on its device */
    t->ranks[r] = NULL;
    return QD_OK;
}

/* One GPU per rank when as many are visible (or asked for), else every rank on GPU 0. */
static qd_status pick_devices(qd_tp_model *t, int asked, qd_err *err) {
    const int visible = qd_cuda_device_count(), n = t->size;
    if (asked == 1 || (asked == 0 && visible < n)) {
        t->one_device = true;
        for (int r = 0; r < n; r++) t->devices[r] = 0;
        if (asked == 0)
            QD_LOGI("tensor parallel: %d ranks share GPU 0 (%d GPU%s visible): the split runs, without a speed-up", n,
                    visible, visible == 1 ? "" : "s");
        return QD_OK;
    }
    if (asked != 0 && asked != n)
        return qd_seterr(err, QD_ERR_INVALID_ARG,
                         "tp_devices %d: use 1 (every rank on GPU 0) or %d (one GPU per rank; NCCL takes one rank per "
                         "GPU)", asked, n);
    if (visible < n)
        return qd_seterr(err, QD_ERR_INVALID_ARG, "tensor parallel size %d needs %d GPUs, %d visible", n, n, visible);
    for (int r = 0; r < n; r++) t->devices[r] = r;
    return QD_OK;
}

qd_status qd_tp_cuda_model_load(qd_model *m, const qd_model_params *params, qd_err *err) {
    qd_tp_model *t = m->tp;
    QD_TRY(pick_devices(t, params->tp_devices, err));
    /* fail before loading anything when the build cannot reduce across GPUs */
    if (!t->one_device && !qd_comm_nccl_available())
        return qd_comm_nccl_create(t->size, t->devices, &(qd_comm_group *){NULL}, err);
    int bad = -1;
    init_job *ij = calloc(1, sizeof *ij);
    if (!ij) return qd_seterr(err, QD_ERR_OOM, "out of memory");
    ij->t = t;
    qd_status s = qd_tp_workers_start(t->size, init_rank_thread, ij, &t->workers, &bad);
    if (s != QD_OK)
        qd_seterr(err, s, "starting the rank threads: %s", bad >= 0 ? ij->errs[bad].msg : "could not create a thread");
    free(ij);
    if (s != QD_OK) return s;
    load_job *j = calloc(1, sizeof *j);
    if (!j) return qd_seterr(err, QD_ERR_OOM, "out of memory");
    j->m = m;
    j->seed = params->seed;
    j->dtype = params->load_format == QD_LOAD_DUMMY_F32 ? QD_DTYPE_F32 : QD_DTYPE_BF16;
    for (int r = 0; r < t->size; r++) qd_err_clear(&j->errs[r]);
    /* ranks sharing a GPU load one after another: each sees the memory the others took */
    s = qd_tp_workers_run(t->workers, load_rank, j, t->one_device, &bad);
    if (s != QD_OK) qd_seterr(err, s, "rank %d (GPU %d): %s", bad, t->devices[bad], j->errs[bad].msg);
    free(j);
    return s;
}

void qd_tp_cuda_model_free(qd_model *m) {
    qd_tp_model *t = m->tp;
    if (!t->workers) return;
    int bad;
    (void)qd_tp_workers_run(t->workers, free_rank_model, t, false, &bad);
    qd_tp_workers_stop(t->workers);
    t->workers = NULL;
}

/* ---------------------------------------------------------- the reduce hook */

static qd_status reduce_hook(void *user, float *d_y, int n_rows, void *stream) {
    tp_rank *rk = user;
    struct qd_tp_cuda_ctx *g = rk->group;
    const int i = rk->calls++;
    const bool timed = i < rk->n_pairs;
    if (timed) QD_TRY(qd_tp_event_record(rk->ev[2 * i], stream, true));
    QD_TRY(qd_comm_all_reduce(g->comm, rk->rank, d_y, (size_t)n_rows * (size_t)g->H, stream));
    if (timed) QD_TRY(qd_tp_event_record(rk->ev[2 * i + 1], stream, true));
    return QD_OK;
}

/* --------------------------------------------------------------- contexts */

typedef struct ctx_job {
    qd_context *ctx;
    qd_err errs[QD_TP_MAX];
} ctx_job;

static qd_status create_rank_ctx(void *arg, int r) {
    ctx_job *j = arg;
    qd_context *ctx = j->ctx;
    const qd_tp_model *t = ctx->model->tp;
    struct qd_tp_cuda_ctx *g = ctx->tp->cuda;
    qd_context_params p = ctx->params;
    /* the one-device all-reduce waits on other streams' events: not capturable */
    if (!g->comm->graph_safe) p.eager = 1;
    qd_status s = qd_context_create(t->ranks[r], &p, &ctx->tp->ranks[r]);
    if (s != QD_OK) return qd_seterr(&j->errs[r], s, "%s", qd_model_errmsg(t->ranks[r]));
    tp_rank *rk = &g->ranks[r];
    rk->group = g;
    rk->rank = r;
    rk->eager = p.eager;
    if (t->timing) {
        const int n = 2 * ctx->model->cfg.n_layers; /* all-reduces per step */
        rk->ev = calloc((size_t)(2 * n), sizeof(void *));
        if (!rk->ev) return qd_seterr(&j->errs[r], QD_ERR_OOM, "out of memory");
        for (int i = 0; i < 2 * n; i++)
            if ((s = qd_tp_event_create(&rk->ev[i], true)) != QD_OK)
                return qd_seterr(&j->errs[r], s, "timing events: %s", qd_cuda_last_error());
        rk->n_pairs = n;
    }
    qd_cuda_ctx *cc = ctx->tp->ranks[r]->cuda;
    cc->reduce = reduce_hook;
    cc->reduce_user = rk;
    cc->never_logits = r > 0;
    return QD_OK;
}

static qd_status free_rank_ctx(void *arg, int r) {
    qd_context *ctx = arg;
    struct qd_tp_cuda_ctx *g = ctx->tp->cuda;
    qd_context_free(ctx->tp->ranks[r]);
    ctx->tp->ranks[r] = NULL;
    if (g) {
        tp_rank *rk = &g->ranks[r];
        for (int i = 0; rk->ev && i < 2 * rk->n_pairs; i++) qd_tp_event_destroy(rk->ev[i]);
        free(rk->ev);
        rk->ev = NULL;
    }
    return QD_OK;
}

qd_status qd_tp_cuda_ctx_create(qd_context *ctx) {
    qd_model *m = ctx->model;
    const qd_tp_model *t = m->tp;
    struct qd_tp_cuda_ctx *g = calloc(1, sizeof *g);
    if (!g) return qd_seterr(&m->err, QD_ERR_OOM, "out of memory");
    ctx->tp->cuda = g;
    g->H = m->cfg.hidden_size;
    g->failed_rank = -1;
    pthread_mutex_init(&g->mu, NULL);
    qd_err err;
    qd_err_clear(&err);
    qd_status s = t->one_device
                      ? qd_comm_local_create(t->size, t->devices[0],
                                             (size_t)ctx->params.max_batch * (size_t)m->cfg.hidden_size, &g->comm, &err)
                      : qd_comm_nccl_create(t->size, t->devices, &g->comm, &err);
    if (s != QD_OK) return qd_seterr(&m->err, s, "%s", err.msg);
    ctx_job *j = calloc(1, sizeof *j);
    if (!j) return qd_seterr(&m->err, QD_ERR_OOM, "out of memory");
    j->ctx = ctx;
    for (int r = 0; r < t->size; r++) qd_err_clear(&j->errs[r]);
    int bad;
    s = qd_tp_workers_run(t->workers, create_rank_ctx, j, t->one_device, &bad);
    if (s != QD_OK) qd_seterr(&m->err, s, "rank %d (GPU %d): %s", bad, t->devices[bad], j->errs[bad].msg);
    else
        QD_LOGI("tensor parallel: %d ranks, all-reduce over %s%s", t->size, g->comm->kind,
                g->comm->graph_safe && !ctx->params.eager ? " (captured in the decode graphs)" : "");
    free(j);
    return s;
}

void qd_tp_cuda_ctx_free(qd_context *ctx) {
    const qd_tp_model *t = ctx->model->tp;
    struct qd_tp_cuda_ctx *g = ctx->tp->cuda;
    int bad;
    if (t->workers) (void)qd_tp_workers_run(t->workers, free_rank_ctx, ctx, false, &bad);
    if (!g) return;
    qd_comm_destroy(g->comm);
    pthread_mutex_destroy(&g->mu);
    free(g);
    ctx->tp->cuda = NULL;
}

/* ----------------------------------------------------------------- forward */

typedef struct fwd_job {
    qd_context *ctx;
    const qd_span *spans;
    int n_spans, n_rows, n_logit_rows;
    const qd_logit_out *out;
} fwd_job;

static qd_status forward_rank(void *arg, int r) {
    const fwd_job *j = arg;
    qd_context *rc = j->ctx->tp->ranks[r];
    struct qd_tp_cuda_ctx *g = j->ctx->tp->cuda;
    g->ranks[r].calls = 0;
    const bool first = r == 0;
    /* every rank takes the graph path exactly when rank 0 does (one whose spans all want
     * their last logits), so that captured and eager collectives never meet */
    if (!first) rc->params.eager = g->ranks[r].eager || j->n_logit_rows != j->n_spans;
    const qd_logit_out none = {.vocab_limit = j->out->vocab_limit};
    const qd_status s = qd_cuda_forward(rc, j->spans, j->n_spans, rc->spans_rt, j->n_rows, first ? j->n_logit_rows : 0,
                                        first ? j->out : &none);
    if (s != QD_OK) {
        /* the first failure is the cause; the others fail because the group is broken */
        pthread_mutex_lock(&g->mu);
        if (g->failed_rank < 0) {
            g->failed_rank = r;
            snprintf(g->failure, sizeof g->failure, "%s", rc->err.msg);
        }
        pthread_mutex_unlock(&g->mu);
        qd_comm_break(g->comm);
    }
    return s;
}

qd_status qd_tp_cuda_forward(qd_context *ctx, const qd_span *spans, int n_spans, int n_rows, int n_logit_rows,
                             const qd_logit_out *out) {
    const qd_tp_model *t = ctx->model->tp;
    struct qd_tp_cuda_ctx *g = ctx->tp->cuda;
    if (g->failed_rank >= 0)
        return qd_seterr(&ctx->err, QD_ERR_BACKEND,
                         "the tensor-parallel group stopped after rank %d failed (%s); create a new context",
                         g->failed_rank, g->failure);
    fwd_job j = {ctx, spans, n_spans, n_rows, n_logit_rows, out};
    int bad;
    qd_status s = qd_tp_workers_run(t->workers, forward_rank, &j, false, &bad);
    if (s != QD_OK)
        return qd_seterr(&ctx->err, s, "rank %d (GPU %d): %s", g->failed_rank, t->devices[g->failed_rank], g->failure);
    return QD_OK;
}

/* ---------------------------------------------------------- state fan-out */

typedef struct each_job {
    qd_context *ctx;
    qd_tp_rank_fn fn;
    void *arg;
} each_job;

static qd_status each_rank(void *arg, int r) {
    const each_job *j = arg;
    return j->fn(j->ctx->tp->ranks[r], r, j->arg);
}

qd_status qd_tp_cuda_each(qd_context *ctx, qd_tp_rank_fn fn, void *arg) {
    each_job j = {ctx, fn, arg};
    int bad;
    qd_status s = qd_tp_workers_run(ctx->model->tp->workers, each_rank, &j, false, &bad);
    if (s != QD_OK) return qd_seterr(&ctx->err, s, "rank %d: %s", bad, ctx->tp->ranks[bad]->err.msg);
    return QD_OK;
}

typedef struct timing_job {
    struct qd_tp_cuda_ctx *g;
    double ms;
    qd_err err;
} timing_job;

static qd_status read_timing(void *arg, int r) {
    timing_job *j = arg;
    if (r != 0) return QD_OK;
    const tp_rank *rk = &j->g->ranks[0];
    j->ms = 0;
    for (int i = 0; i < rk->n_pairs; i++) {
        float ms = 0;
        qd_status s = qd_tp_event_ms(rk->ev[2 * i], rk->ev[2 * i + 1], &ms);
        if (s != QD_OK) return qd_seterr(&j->err, s, "%s", qd_cuda_last_error());
        j->ms += ms;
    }
    return QD_OK;
}

qd_status qd_tp_cuda_allreduce_ms(qd_context *ctx, double *ms, int *count) {
    struct qd_tp_cuda_ctx *g = ctx->tp->cuda;
    if (!g->ranks[0].n_pairs)
        return qd_seterr(&ctx->err, QD_ERR_UNSUPPORTED, "all-reduce timing was off when the context was created");
    timing_job j = {g, 0, {0}};
    int bad;
    qd_status s = qd_tp_workers_run(ctx->model->tp->workers, read_timing, &j, false, &bad);
    if (s != QD_OK) return qd_seterr(&ctx->err, s, "reading the all-reduce timing: %s", j.err.msg);
    *ms = j.ms;
    *count = g->ranks[0].n_pairs;
    return QD_OK;
}
