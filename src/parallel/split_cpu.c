/* A split model on the CPU (split.h): the ranks run one after another in the calling
 * thread through the CPU backend's own layer loop (qd_cpu_forward_ranks), which sums
 * the ranks' partial block outputs in rank order between blocks. It is the reference
 * the multi-GPU backend is checked against, and the check of the sharding math
 * without GPUs. Speculative decoding runs here too: verify spans and their rollback on
 * every rank, the MTP head with its layer sharded like the main ones. */
#include <stdlib.h>

#include "backend/cpu/cpu_backend.h"
#include "parallel/split.h"

static qd_status each_in_turn(qd_split_ctx *sc, qd_split_rank_fn fn, void *arg) {
    for (int r = 0; r < sc->sm->n; r++) {
        qd_status s = fn(sc, r, arg);
        if (s != QD_OK) return qd_seterr(sc->err, s, "rank %d: %s", r, sc->rank_err[r].msg);
    }
    return QD_OK;
}

static void model_free(void *bm) {
    qd_split_model *sm = bm;
    if (!sm) return;
    for (int r = 0; r < sm->n; r++)
        if (sm->rank_bm[r]) sm->rank_ops->model_free(sm->rank_bm[r]);
    free(sm);
}

static qd_status model_create(const qd_backend_model_desc *d, void **out, qd_err *err) {
    qd_split_model *sm = calloc(1, sizeof *sm);
    if (!sm) return qd_seterr(err, QD_ERR_OOM, "out of memory");
    sm->rank_ops = d->rank_ops;
    sm->n = d->n_ranks;
    sm->expert_parallel = d->expert_parallel;
    for (int r = 0; r < sm->n; r++) {
        sm->ranks[r] = d->ranks[r];
        qd_status s = sm->rank_ops->model_create(&sm->ranks[r], &sm->rank_bm[r], err);
        if (s != QD_OK) {
            qd_err_prefix(err, "rank %d: ", r);
            model_free(sm);
            return s;
        }
    }
    *out = sm;
    return QD_OK;
}

static void ctx_free(void *bc) {
    qd_split_ctx *sc = bc;
    if (!sc) return;
    for (int r = 0; r < sc->sm->n; r++)
        if (sc->ranks[r]) sc->sm->rank_ops->ctx_free(sc->ranks[r]);
    free(sc);
}

static qd_status ctx_create(void *bm, const qd_backend_ctx_desc *d, void **out, qd_err *err) {
    QD_TRY(qd_split_check_params(d, err));
    const qd_split_model *sm = bm;
    qd_split_ctx *sc = calloc(1, sizeof *sc);
    if (!sc) return qd_seterr(err, QD_ERR_OOM, "out of memory");
    sc->sm = sm;
    sc->err = d->err;
    sc->each = each_in_turn;
    for (int r = 0; r < sm->n; r++) {
        const qd_backend_ctx_desc rd = qd_split_rank_desc(sc, d, r);
        qd_status s = sm->rank_ops->ctx_create(sm->rank_bm[r], &rd, &sc->ranks[r], err);
        if (s != QD_OK) {
            qd_err_prefix(err, "rank %d: ", r);
            ctx_free(sc);
            return s;
        }
    }
    qd_split_ctx_ready(sc);
    *out = sc;
    return QD_OK;
}

/* A failed step's message: the first rank that reported one. */
static qd_status rank_failure(qd_split_ctx *sc, qd_status s, const char *what) {
    for (int r = 0; r < sc->sm->n; r++)
        if (sc->rank_err[r].status != QD_OK) return qd_seterr(sc->err, s, "%s", sc->rank_err[r].msg);
    return qd_seterr(sc->err, s, "split %s failed", what);
}

static qd_status forward(void *bc, const qd_step *st, const qd_logit_out *out) {
    qd_split_ctx *sc = bc;
    qd_status s = qd_cpu_forward_ranks((qd_cpu_ctx *const *)sc->ranks, sc->sm->n, st, out);
    return s == QD_OK ? QD_OK : rank_failure(sc, s, "forward");
}

/* The MTP head over the ranks, its layer sharded like the main ones (cpu_forward.c). */
static qd_status mtp_forward(void *bc, const qd_step *st, const float *hidden, const qd_logit_out *out) {
    qd_split_ctx *sc = bc;
    qd_status s = qd_cpu_mtp_forward_ranks((qd_cpu_ctx *const *)sc->ranks, sc->sm->n, st, hidden, out);
    return s == QD_OK ? QD_OK : rank_failure(sc, s, "MTP forward");
}

static const qd_backend_ops split_cpu_ops = {
    .name = "CPU",
    .kv_elem_bytes = 4,
    .quantized_weights = true, /* the ranks' backend multiplies them; shards keep block boundaries */
    .model_create = model_create,
    .model_free = model_free,
    .ctx_create = ctx_create,
    .ctx_free = ctx_free,
    .forward = forward,
    /* every rank keeps its slice of a verify span's per-token GDN states (its rank
     * context is made with the same speculative_tokens), so a rollback is each rank's */
    .verify_keep = qd_split_verify_keep,
    .mtp_forward = mtp_forward,
    QD_SPLIT_STATE_OPS,
};

const qd_backend_ops *qd_backend_split_cpu(qd_err *err) {
    (void)err;
    return &split_cpu_ops;
}
