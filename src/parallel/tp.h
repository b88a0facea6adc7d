/* A model split over tensor-parallel ranks behind the public API (docs/parallel.md).
 *
 * qd_model_load with tensor_parallel_size > 1 gives a model that holds the config and the
 * checkpoint mapping, and a group of rank models each read from the checkpoint by its plan
 * (shard.h). A context of it keeps what the engine sees (sequence lengths, the one set of
 * KV block tables and the pool's reference counts) and one rank context per rank, which
 * holds the rank's slice of the GDN state and of every KV block. Forwards, state
 * snapshots, forks and KV copy-on-write go to every rank.
 *
 * Backends: on the CPU the ranks run one after another in the calling thread, the
 * all-reduce an in-memory sum in rank order (tp_cpu.h); on CUDA each rank has a host
 * thread and a GPU, and the all-reduce goes through a communicator (cuda/comm.h). */
#ifndef QD_PARALLEL_TP_H
#define QD_PARALLEL_TP_H

#include <stdbool.h>

#include "parallel/shard.h"

#define QD_TP_MAX 8 /* ranks: the GPUs of one node */

typedef struct qd_tp_model {
    int size;
    bool expert_parallel;
    qd_shard_plan *plans;        /* [size] */
    qd_model **ranks;            /* [size] */
    /* CUDA */
    int devices[QD_TP_MAX];      /* the GPU of each rank */
    bool one_device;             /* every rank on devices[0]: the single-device communicator */
    bool timing;                 /* contexts created from now on time their all-reduces */
    struct qd_tp_workers *workers; /* one host thread per rank */
} qd_tp_model;

typedef struct qd_tp_ctx {
    qd_context **ranks;          /* [size] */
    struct qd_tp_cuda_ctx *cuda; /* CUDA: communicators and all-reduce hooks (cuda/tp_cuda.c) */
} qd_tp_ctx;

/* A step run on one rank's context (on the rank's thread on CUDA). */
typedef qd_status (*qd_tp_rank_fn)(qd_context *rank_ctx, int rank, void *arg);

/* Splits m (config read, checkpoint mapped in m->st unless dummy) into
 * params->tensor_parallel_size ranks. Errors name the config field a size does not divide. */
qd_status qd_tp_model_load(qd_model *m, const qd_model_params *params, qd_err *err);
void qd_tp_model_free(qd_model *m);

/* Rank contexts for a context of a split model, created with ctx->params (whose KV pool
 * size is settled); messages in ctx->model->err. */
qd_status qd_tp_ctx_create(qd_context *ctx);
void qd_tp_ctx_free(qd_context *ctx);

/* The layers and logits of a batch that ctx has validated (ctx->spans_rt) and whose KV
 * blocks it has reserved; the caller advances the lengths. */
qd_status qd_tp_forward(qd_context *ctx, const qd_span *spans, int n_spans, int n_rows, int n_logit_rows,
                        const qd_logit_out *out);

/* A sequence's GDN state as one snapshot payload: each rank's [conv | recurrent] slice, in
 * rank order. NULL src in write: zeros. */
size_t qd_tp_state_bytes(const qd_context *ctx);
qd_status qd_tp_state_read(qd_context *ctx, int seq, void *dst);
qd_status qd_tp_state_write(qd_context *ctx, int seq, const void *src);
qd_status qd_tp_state_copy(qd_context *ctx, int src, int dst);
qd_status qd_tp_kv_copy_block(qd_context *ctx, int32_t dst, int32_t src);
/* Snapshot slots (model.h): every rank saves its slice of seq's state into its own slot,
 * loads it back, or reads it to dst + the rank's offset (the snapshot payload layout). */
qd_status qd_tp_snap_save(qd_context *ctx, int seq, int slot);
qd_status qd_tp_snap_load(qd_context *ctx, int seq, int slot);
qd_status qd_tp_snap_read(qd_context *ctx, int slot, void *dst);

/* All-reduce timing (CUDA, for `qdelta bench`): contexts created after qd_tp_set_timing(m,
 * true) record events around each all-reduce; qd_tp_allreduce_ms gives the device time the
 * last forward spent in them on rank 0 (waiting for the other ranks included) and how many
 * there were. QD_ERR_UNSUPPORTED when the context does not time them. */
void qd_tp_set_timing(qd_model *m, bool on);
qd_status qd_tp_allreduce_ms(qd_context *ctx, double *ms, int *count);

#endif
