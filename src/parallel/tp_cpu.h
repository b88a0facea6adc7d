/* A tensor-parallel group run in one process on the CPU backend: every rank's model is
 * cut from one loaded model (shard.h), every rank has its own context (its slice of the
 * GDN state and of the KV cache), and the all-reduce after out_proj / o_proj / down_proj
 * / the MoE block is an in-memory sum in rank order. It is the reference the multi-GPU
 * backend is checked against, and the check of the sharding math without GPUs. */
#ifndef QD_PARALLEL_TP_CPU_H
#define QD_PARALLEL_TP_CPU_H

#include "parallel/shard.h"

typedef struct qd_tp_cpu {
    int tp_size;
    bool expert_parallel;
    qd_shard_plan *plans;   /* [tp_size] */
    qd_model **models;      /* [tp_size] rank models (views into the full model, plus owned slices) */
    qd_context **ctxs;      /* [tp_size] one context per rank, created with the same params */
    qd_err err;
} qd_tp_cpu;

/* Plans and cuts tp_size ranks of `full` and gives each a context. The group borrows
 * `full`, which must outlive it. Errors (a tp_size that does not divide a dimension, ...)
 * come back in err. */
qd_status qd_tp_cpu_create(qd_model *full, int tp_size, bool expert_parallel, const qd_context_params *params,
                           qd_tp_cpu **out, qd_err *err);
void qd_tp_cpu_free(qd_tp_cpu *g);

/* The layer stack of every rank, block by block, with the partial outputs summed in rank
 * order between blocks: each ctxs[r]->s.h holds the embedded rows (and ctxs[r]->spans_rt
 * the batch) before, the residual stream after. */
qd_status qd_tp_cpu_layers(qd_context *const *ctxs, const qd_shard_plan *plans, int tp, int n_spans, int n_rows,
                           qd_err *err);

/* qd_forward over the group: the same spans go to every rank, logits come from rank 0
 * (the LM head is whole on every rank). Messages in g->err. */
qd_status qd_tp_forward_cpu(qd_tp_cpu *g, const qd_span *spans, int n_spans, float *logits);

#endif
