/* What the split backends share (split.h): rank descriptions and the state fan-out. */
#include <string.h>

#include "parallel/split.h"

qd_backend_ctx_desc qd_split_rank_desc(const qd_split_ctx *sc, const qd_backend_ctx_desc *top, int r) {
    const qd_backend_model_desc *rd = &sc->sm->ranks[r];
    qd_backend_ctx_desc d = *top;
    /* with params.mtp the MTP head's attention is one more layer of every block, as in
     * the top context's (kv_cache.c), sharded like the others: the rank's KV heads */
    const size_t n_kv_layers = (size_t)rd->w->n_attn + (top->params.mtp ? 1 : 0);
    d.kv_block_elems = n_kv_layers * (size_t)top->params.kv_block_size * (size_t)rd->cfg->attn_nkv *
                       (size_t)rd->cfg->attn_head_dim;
    d.err = (qd_err *)&sc->rank_err[r];
    d.reduce = NULL;
    d.reduce_user = NULL;
    d.never_logits = false;
    return d;
}

void qd_split_ctx_ready(qd_split_ctx *sc) {
    sc->state_off[0] = 0;
    for (int r = 0; r < sc->sm->n; r++)
        sc->state_off[r + 1] = sc->state_off[r] + sc->sm->rank_ops->state_bytes(sc->ranks[r]);
}

qd_status qd_split_check_params(const qd_backend_ctx_desc *d, qd_err *err) {
    if (d->params.batch_invariant)
        return qd_seterr(err, QD_ERR_UNSUPPORTED,
                         "batch-invariant mode is not available for a tensor- or expert-parallel model");
    return QD_OK;
}

typedef struct state_job {
    int a, b;
    unsigned char *dst;
    const unsigned char *src;
} state_job;

size_t qd_split_state_bytes(void *bc) {
    const qd_split_ctx *sc = bc;
    return sc->state_off[sc->sm->n];
}

static qd_status read_rank(qd_split_ctx *sc, int r, void *arg) {
    const state_job *j = arg;
    return sc->sm->rank_ops->state_read(sc->ranks[r], j->a, j->dst + sc->state_off[r]);
}

static qd_status write_rank(qd_split_ctx *sc, int r, void *arg) {
    const state_job *j = arg;
    return sc->sm->rank_ops->state_write(sc->ranks[r], j->a, j->src ? j->src + sc->state_off[r] : NULL);
}

static qd_status copy_rank(qd_split_ctx *sc, int r, void *arg) {
    const state_job *j = arg;
    return sc->sm->rank_ops->state_copy(sc->ranks[r], j->a, j->b);
}

static qd_status kv_copy_rank(qd_split_ctx *sc, int r, void *arg) {
    const state_job *j = arg;
    return sc->sm->rank_ops->kv_copy_block(sc->ranks[r], j->a, j->b);
}

static qd_status snap_save_rank(qd_split_ctx *sc, int r, void *arg) {
    const state_job *j = arg;
    return sc->sm->rank_ops->snap_save(sc->ranks[r], j->a, j->b);
}

static qd_status snap_load_rank(qd_split_ctx *sc, int r, void *arg) {
    const state_job *j = arg;
    return sc->sm->rank_ops->snap_load(sc->ranks[r], j->a, j->b);
}

static qd_status snap_read_rank(qd_split_ctx *sc, int r, void *arg) {
    const state_job *j = arg;
    return sc->sm->rank_ops->snap_read(sc->ranks[r], j->b, j->dst + sc->state_off[r]);
}

static qd_status verify_keep_rank(qd_split_ctx *sc, int r, void *arg) {
    const state_job *j = arg;
    if (!sc->sm->rank_ops->verify_keep)
        return qd_seterr(&sc->rank_err[r], QD_ERR_UNSUPPORTED, "the %s rank backend has no verify spans",
                         sc->sm->rank_ops->name);
    return sc->sm->rank_ops->verify_keep(sc->ranks[r], j->a, j->b);
}

static qd_status fan(void *bc, qd_split_rank_fn fn, state_job j) {
    qd_split_ctx *sc = bc;
    return sc->each(sc, fn, &j);
}

qd_status qd_split_state_read(void *bc, int seq, void *dst) {
    return fan(bc, read_rank, (state_job){.a = seq, .dst = dst});
}
qd_status qd_split_state_write(void *bc, int seq, const void *src) {
    return fan(bc, write_rank, (state_job){.a = seq, .src = src});
}
qd_status qd_split_state_copy(void *bc, int src, int dst) { return fan(bc, copy_rank, (state_job){.a = src, .b = dst}); }
qd_status qd_split_kv_copy_block(void *bc, int32_t dst, int32_t src) {
    return fan(bc, kv_copy_rank, (state_job){.a = dst, .b = src});
}
qd_status qd_split_snap_save(void *bc, int seq, int slot) {
    return fan(bc, snap_save_rank, (state_job){.a = seq, .b = slot});
}
qd_status qd_split_snap_load(void *bc, int seq, int slot) {
    return fan(bc, snap_load_rank, (state_job){.a = seq, .b = slot});
}
qd_status qd_split_snap_read(void *bc, int slot, void *dst) {
    return fan(bc, snap_read_rank, (state_job){.b = slot, .dst = dst});
}
qd_status qd_split_verify_keep(void *bc, int seq, int index) {
    return fan(bc, verify_keep_rank, (state_job){.a = seq, .b = index});
}
