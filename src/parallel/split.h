/* A split model as a backend (docs/parallel.md): it wraps one rank backend per rank,
 * each holding its slice of the weights, of every sequence's GDN state and of every KV
 * block, and sums the ranks' partial block outputs between blocks. What the CPU and the
 * CUDA split backends share: the rank contexts' descriptions and the state fan-out (a
 * sequence's state payload is each rank's payload in rank order). How a step runs on
 * every rank is each backend's: one after another on the calling thread (CPU), or on
 * the ranks' own threads (CUDA). */
#ifndef QD_PARALLEL_SPLIT_H
#define QD_PARALLEL_SPLIT_H

#include "backend/backend.h"

typedef struct qd_split_ctx qd_split_ctx;

/* A step on rank r's backend context. */
typedef qd_status (*qd_split_rank_fn)(qd_split_ctx *sc, int r, void *arg);

/* The model: the rank backends' models, made by the split backend's model_create. */
typedef struct qd_split_model {
    const qd_backend_ops *rank_ops;
    int n;
    bool expert_parallel;
    qd_backend_model_desc ranks[QD_SPLIT_MAX];
    void *rank_bm[QD_SPLIT_MAX];
} qd_split_model;

struct qd_split_ctx {
    const qd_split_model *sm;
    qd_err *err;
    void *ranks[QD_SPLIT_MAX];            /* the rank backends' contexts */
    qd_err rank_err[QD_SPLIT_MAX];        /* where each rank context reports */
    size_t state_off[QD_SPLIT_MAX + 1];   /* rank r's payload at [state_off[r], state_off[r + 1]) */
    /* fn on every rank, each rank's failure named in err */
    qd_status (*each)(qd_split_ctx *sc, qd_split_rank_fn fn, void *arg);
};

/* Rank r's context description: the top context's limits with the rank's KV block size
 * (its local KV heads) and the rank's error slot. */
qd_backend_ctx_desc qd_split_rank_desc(const qd_split_ctx *sc, const qd_backend_ctx_desc *top, int r);
/* After the rank contexts exist: the payload offsets. */
void qd_split_ctx_ready(qd_split_ctx *sc);
/* Refuses what a split context cannot do (batch-invariant mode: the all-reduces sum in
 * an order a communicator picks by message size). */
qd_status qd_split_check_params(const qd_backend_ctx_desc *d, qd_err *err);

/* The state operations of backend.h over the ranks (bc is a qd_split_ctx, or a struct
 * that begins with one). */
size_t qd_split_state_bytes(void *bc);
qd_status qd_split_state_read(void *bc, int seq, void *dst);
qd_status qd_split_state_write(void *bc, int seq, const void *src);
qd_status qd_split_state_copy(void *bc, int src, int dst);
qd_status qd_split_kv_copy_block(void *bc, int32_t dst, int32_t src);
qd_status qd_split_snap_save(void *bc, int seq, int slot);
qd_status qd_split_snap_load(void *bc, int seq, int slot);
qd_status qd_split_snap_read(void *bc, int slot, void *dst);
/* verify_keep on every rank (a split backend whose rank backend has verify spans). */
qd_status qd_split_verify_keep(void *bc, int seq, int index);

/* The state entries of a split backend's table. */
#define QD_SPLIT_STATE_OPS                                                                                    \
    .state_bytes = qd_split_state_bytes, .state_read = qd_split_state_read, .state_write = qd_split_state_write, \
    .state_copy = qd_split_state_copy, .kv_copy_block = qd_split_kv_copy_block, .snap_save = qd_split_snap_save,  \
    .snap_load = qd_split_snap_load, .snap_read = qd_split_snap_read

/* The rank backend contexts of a split context (tests look into them). */
static inline void *qd_split_rank_ctx(void *bc, int r) { return ((qd_split_ctx *)bc)->ranks[r]; }

#endif
