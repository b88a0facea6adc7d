/* A split model on CUDA (split.h, docs/parallel.md): one host thread per rank, which
 * selects the rank's GPU once and then does every CUDA call of the rank (uploading its
 * weights, creating its context, its forwards, its state copies). The rank contexts are
 * ordinary CUDA backend contexts with a reduce hook: at every all-reduce point of the
 * forward the hook hands the block's partial output to the communicator (comm.h). Rank 0
 * computes the logits; the others skip the LM head. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_device.h"
#include "base/log.h"
#include "parallel/cuda/comm.h"
#include "parallel/cuda/tp_cuda_rt.h"
#include "parallel/split.h"
#include "parallel/tp_workers.h"

typedef struct cuda_split_model {
    qd_split_model base;          /* first: the shared split code sees a qd_split_model */
    int devices[QD_SPLIT_MAX];    /* the GPU of each rank */
    bool one_device;              /* every rank on devices[0]: the single-device communicator */
    bool timing;                  /* contexts created from now on time their all-reduces */
    qd_tp_workers *workers;       /* one host thread per rank */
} cuda_split_model;

/* One rank's side of a context. */
typedef struct tp_rank {
    struct cuda_split_ctx *group;
    int rank;
    int calls;        /* all-reduces issued since the forward began (recorded ones, in a capture) */
    int n_pairs;      /* timing events: ev[2 i], ev[2 i + 1] around the i-th all-reduce of a step */
    void **ev;
} tp_rank;

typedef struct cuda_split_ctx {
    qd_split_ctx base;            /* first: the shared state fan-out sees a qd_split_ctx */
    const cuda_split_model *m;
    qd_comm_group *comm;
    tp_rank ranks[QD_SPLIT_MAX];
    int H;
    pthread_mutex_t mu;
    bool mu_ready;
    int failed_rank;  /* the first rank that failed in a forward (-1: none); the group is then broken */
    char failure[QD_ERRMSG_SIZE];
} cuda_split_ctx;

/* ---------------------------------------------------------------- the model */

typedef struct rank_job {
    cuda_split_model *m;
    const qd_backend_ctx_desc *desc;  /* contexts */
    cuda_split_ctx *ctx;
    qd_err errs[QD_SPLIT_MAX];
} rank_job;

static qd_status init_rank_thread(void *arg, int r) {
    rank_job *j = arg;
    qd_status s = qd_tp_set_device(j->m->devices[r]);
    if (s != QD_OK) qd_seterr(&j->errs[r], s, "%s", qd_cuda_last_error());
    return s;
}

static qd_status create_rank_model(void *arg, int r) {
    rank_job *j = arg;
    qd_split_model *sm = &j->m->base;
    return sm->rank_ops->model_create(&sm->ranks[r], &sm->rank_bm[r], &j->errs[r]);
}

static qd_status free_rank_model(void *arg, int r) {
    cuda_split_model *m = arg;
    if (m->base.rank_bm[r]) m->base.rank_ops->model_free(m->base.rank_bm[r]); /* on its device */
    m->base.rank_bm[r] = NULL;
    return QD_OK;
}

/* One GPU per rank when as many are visible (or asked for), else every rank on GPU 0. */
static qd_status pick_devices(cuda_split_model *m, int asked, qd_err *err) {
    const int visible = qd_cuda_device_count(), n = m->base.n;
    if (asked == 1 || (asked == 0 && visible < n)) {
        m->one_device = true;
        for (int r = 0; r < n; r++) m->devices[r] = 0;
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
    for (int r = 0; r < n; r++) m->devices[r] = r;
    return QD_OK;
}

static void model_free(void *bm) {
    cuda_split_model *m = bm;
    if (!m) return;
    if (m->workers) {
        int bad;
        (void)qd_tp_workers_run(m->workers, free_rank_model, m, false, &bad);
        qd_tp_workers_stop(m->workers);
    }
    free(m);
}

static qd_status load(cuda_split_model *m, const qd_backend_model_desc *d, qd_err *err) {
    QD_TRY(pick_devices(m, d->tp_devices, err));
    /* fail before loading anything when the build cannot reduce across GPUs */
    if (!m->one_device && !qd_comm_nccl_available())
        return qd_comm_nccl_create(m->base.n, m->devices, &(qd_comm_group *){NULL}, err);
    rank_job *j = calloc(1, sizeof *j);
    if (!j) return qd_seterr(err, QD_ERR_OOM, "out of memory");
    j->m = m;
    for (int r = 0; r < m->base.n; r++) {
        qd_err_clear(&j->errs[r]);
        m->base.ranks[r].device = m->devices[r];
    }
    int bad = -1;
    qd_status s = qd_tp_workers_start(m->base.n, init_rank_thread, j, &m->workers, &bad);
    if (s != QD_OK) {
        qd_seterr(err, s, "starting the rank threads: %s", bad >= 0 ? j->errs[bad].msg : "could not create a thread");
    } else {
        /* ranks sharing a GPU load one after another: each sees the memory the others took */
        s = qd_tp_workers_run(m->workers, create_rank_model, j, m->one_device, &bad);
        if (s != QD_OK) qd_seterr(err, s, "rank %d (GPU %d): %s", bad, m->devices[bad], j->errs[bad].msg);
    }
    free(j);
    return s;
}

static qd_status model_create(const qd_backend_model_desc *d, void **out, qd_err *err) {
    cuda_split_model *m = calloc(1, sizeof *m);
    if (!m) return qd_seterr(err, QD_ERR_OOM, "out of memory");
    m->base.rank_ops = d->rank_ops;
    m->base.n = d->n_ranks;
    m->base.expert_parallel = d->expert_parallel;
    for (int r = 0; r < d->n_ranks; r++) m->base.ranks[r] = d->ranks[r];
    qd_status s = load(m, d, err);
    if (s != QD_OK) {
        model_free(m);
        return s;
    }
    *out = m;
    return QD_OK;
}

static void set_timing(void *bm, bool on) { ((cuda_split_model *)bm)->timing = on; }

/* ---------------------------------------------------------- the reduce hook */

static qd_status reduce_hook(void *user, float *d_y, int n_rows, void *stream) {
    tp_rank *rk = user;
    cuda_split_ctx *g = rk->group;
    const int i = rk->calls++;
    const bool timed = i < rk->n_pairs;
    if (timed) QD_TRY(qd_tp_event_record(rk->ev[2 * i], stream, true));
    QD_TRY(qd_comm_all_reduce(g->comm, rk->rank, d_y, (size_t)n_rows * (size_t)g->H, stream));
    if (timed) QD_TRY(qd_tp_event_record(rk->ev[2 * i + 1], stream, true));
    return QD_OK;
}

/* --------------------------------------------------------------- contexts */

static qd_status create_rank_ctx(void *arg, int r) {
    rank_job *j = arg;
    cuda_split_ctx *g = j->ctx;
    const qd_split_model *sm = &j->m->base;
    qd_backend_ctx_desc d = qd_split_rank_desc(&g->base, j->desc, r);
    /* the one-device all-reduce waits on other streams' events: not capturable */
    if (!g->comm->graph_safe) d.params.eager = 1;
    tp_rank *rk = &g->ranks[r];
    rk->group = g;
    rk->rank = r;
    d.reduce = reduce_hook;
    d.reduce_user = rk;
    d.never_logits = r > 0;
    qd_status s = sm->rank_ops->ctx_create(sm->rank_bm[r], &d, &g->base.ranks[r], &j->errs[r]);
    if (s != QD_OK) return s;
    if (j->m->timing) {
        const int n = 2 * sm->ranks[r].cfg->n_layers; /* all-reduces per step */
        rk->ev = calloc((size_t)(2 * n), sizeof(void *));
        if (!rk->ev) return qd_seterr(&j->errs[r], QD_ERR_OOM, "out of memory");
        for (int i = 0; i < 2 * n; i++)
            if ((s = qd_tp_event_create(&rk->ev[i], true)) != QD_OK)
                return qd_seterr(&j->errs[r], s, "timing events: %s", qd_cuda_last_error());
        rk->n_pairs = n;
    }
    return QD_OK;
}

static qd_status free_rank_ctx(void *arg, int r) {
    cuda_split_ctx *g = arg;
    if (g->base.ranks[r]) g->m->base.rank_ops->ctx_free(g->base.ranks[r]);
    g->base.ranks[r] = NULL;
    tp_rank *rk = &g->ranks[r];
    for (int i = 0; rk->ev && i < 2 * rk->n_pairs; i++) qd_tp_event_destroy(rk->ev[i]);
    free(rk->ev);
    rk->ev = NULL;
    return QD_OK;
}

static void ctx_free(void *bc) {
    cuda_split_ctx *g = bc;
    if (!g) return;
    int bad;
    (void)qd_tp_workers_run(g->m->workers, free_rank_ctx, g, false, &bad);
    qd_comm_destroy(g->comm);
    if (g->mu_ready) pthread_mutex_destroy(&g->mu);
    free(g);
}

typedef struct each_job {
    cuda_split_ctx *g;
    qd_split_rank_fn fn;
    void *arg;
} each_job;

static qd_status each_rank(void *arg, int r) {
    const each_job *j = arg;
    return j->fn(&j->g->base, r, j->arg);
}

/* fn on every rank's context, each on its rank's thread. */
static qd_status each_on_threads(qd_split_ctx *sc, qd_split_rank_fn fn, void *arg) {
    cuda_split_ctx *g = (cuda_split_ctx *)sc;
    each_job j = {g, fn, arg};
    int bad;
    qd_status s = qd_tp_workers_run(g->m->workers, each_rank, &j, false, &bad);
    if (s != QD_OK) return qd_seterr(sc->err, s, "rank %d: %s", bad, sc->rank_err[bad].msg);
    return QD_OK;
}

static qd_status ctx_create(void *bm, const qd_backend_ctx_desc *d, void **out, qd_err *err) {
    QD_TRY(qd_split_check_params(d, err));
    cuda_split_model *m = bm;
    cuda_split_ctx *g = calloc(1, sizeof *g);
    if (!g) return qd_seterr(err, QD_ERR_OOM, "out of memory");
    g->base.sm = &m->base;
    g->base.err = d->err;
    g->base.each = each_on_threads;
    g->m = m;
    g->H = m->base.ranks[0].cfg->hidden_size;
    g->failed_rank = -1;
    pthread_mutex_init(&g->mu, NULL);
    g->mu_ready = true;
    const int n = m->base.n;
    qd_status s = m->one_device
                      ? qd_comm_local_create(n, m->devices[0], (size_t)d->params.max_batch * (size_t)g->H, &g->comm, err)
                      : qd_comm_nccl_create(n, m->devices, &g->comm, err);
    rank_job *j = s == QD_OK ? calloc(1, sizeof *j) : NULL;
    if (s == QD_OK && !j) s = qd_seterr(err, QD_ERR_OOM, "out of memory");
    if (s == QD_OK) {
        j->m = m;
        j->desc = d;
        j->ctx = g;
        for (int r = 0; r < n; r++) qd_err_clear(&j->errs[r]);
        int bad;
        s = qd_tp_workers_run(m->workers, create_rank_ctx, j, m->one_device, &bad);
        if (s != QD_OK) qd_seterr(err, s, "rank %d (GPU %d): %s", bad, m->devices[bad], j->errs[bad].msg);
        else
            QD_LOGI("tensor parallel: %d ranks, all-reduce over %s%s", n, g->comm->kind,
                    g->comm->graph_safe && !d->params.eager ? " (captured in the decode graphs)" : "");
    }
    free(j);
    if (s != QD_OK) {
        ctx_free(g);
        return s;
    }
    qd_split_ctx_ready(&g->base);
    *out = g;
    return QD_OK;
}

/* ----------------------------------------------------------------- forward */

typedef struct fwd_job {
    cuda_split_ctx *g;
    const qd_step *st;
    const qd_logit_out *out;
    bool mtp;            /* the MTP head's forward, of these hidden inputs (every rank gets them whole) */
    const float *hidden;
} fwd_job;

/* A forward of the main model or (j->mtp) of the MTP head on rank r. */
static qd_status forward_rank(void *arg, int r) {
    const fwd_job *j = arg;
    cuda_split_ctx *g = j->g;
    g->ranks[r].calls = 0;
    qd_step st = *j->st;
    const qd_logit_out none = {.vocab_limit = j->out->vocab_limit};
    if (r > 0) {
        /* every rank takes the graph path exactly when rank 0 does (one whose spans all
         * want their last logits), so that captured and eager collectives never meet */
        st.no_graph = st.n_logit_rows != st.n_spans;
        st.n_logit_rows = 0;
    }
    const qd_logit_out *out = r == 0 ? j->out : &none;
    void *rc = g->base.ranks[r];
    const qd_backend_ops *ops = g->m->base.rank_ops;
    const qd_status s = j->mtp ? ops->mtp_forward(rc, &st, j->hidden, out) : ops->forward(rc, &st, out);
    if (s != QD_OK) {
        /* the first failure is the cause; the others fail because the group is broken */
        pthread_mutex_lock(&g->mu);
        if (g->failed_rank < 0) {
            g->failed_rank = r;
            snprintf(g->failure, sizeof g->failure, "%s", g->base.rank_err[r].msg);
        }
        pthread_mutex_unlock(&g->mu);
        qd_comm_break(g->comm);
    }
    return s;
}

static qd_status run_forward(cuda_split_ctx *g, const qd_step *st, const qd_logit_out *out, bool mtp,
                             const float *hidden) {
    if (g->failed_rank >= 0)
        return qd_seterr(g->base.err, QD_ERR_BACKEND,
                         "the tensor-parallel group stopped after rank %d failed (%s); create a new context",
                         g->failed_rank, g->failure);
    fwd_job j = {g, st, out, mtp, hidden};
    int bad;
    qd_status s = qd_tp_workers_run(g->m->workers, forward_rank, &j, false, &bad);
    if (s != QD_OK)
        return qd_seterr(g->base.err, s, "rank %d (GPU %d): %s", g->failed_rank, g->m->devices[g->failed_rank],
                         g->failure);
    return QD_OK;
}

static qd_status forward(void *bc, const qd_step *st, const qd_logit_out *out) {
    return run_forward(bc, st, out, false, NULL);
}

/* The MTP head: its layer is sharded like the main layers (its fc and norms whole on every
 * rank), all-reduced at the same two points; rank 0 computes the logits. */
static qd_status mtp_forward(void *bc, const qd_step *st, const float *hidden, const qd_logit_out *out) {
    return run_forward(bc, st, out, true, hidden);
}

/* ------------------------------------------------------------------ timing */

typedef struct timing_job {
    cuda_split_ctx *g;
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

static qd_status comm_time(void *bc, double *ms, int *count) {
    cuda_split_ctx *g = bc;
    if (!g->ranks[0].n_pairs)
        return qd_seterr(g->base.err, QD_ERR_UNSUPPORTED, "all-reduce timing was off when the context was created");
    timing_job j = {g, 0, {0}};
    int bad;
    qd_status s = qd_tp_workers_run(g->m->workers, read_timing, &j, false, &bad);
    if (s != QD_OK) return qd_seterr(g->base.err, s, "reading the all-reduce timing: %s", j.err.msg);
    *ms = j.ms;
    *count = g->ranks[0].n_pairs;
    return QD_OK;
}

static const qd_backend_ops split_cuda_ops = {
    .name = "CUDA",
    .kv_elem_bytes = 2,
    .copies_weights = true,
    .draws_dummy_weights = true,
    .quantized_weights = true, /* the ranks' backend multiplies them; shards keep block boundaries */
    .model_create = model_create,
    .model_free = model_free,
    .set_comm_timing = set_timing,
    .ctx_create = ctx_create,
    .ctx_free = ctx_free,
    .forward = forward,
    .mtp_forward = mtp_forward,
    .verify_keep = qd_split_verify_keep, /* every rank keeps its slice of the verify span's GDN states */
    QD_SPLIT_STATE_OPS,
    .comm_time = comm_time,
};

const qd_backend_ops *qd_backend_split_cuda(qd_err *err) {
    /* the ranks' backend must be there (a device found) */
    return qd_backend_cuda(err) ? &split_cuda_ops : NULL;
}
