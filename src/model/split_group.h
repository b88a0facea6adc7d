/* A split CPU model cut from one loaded model (tests of the sharding math): every rank's
 * weights are sliced from the full model (model_shard.h), and the group is an ordinary
 * split model (the CPU split backend) with one context. Its rank contexts are the CPU
 * backend's (backend/cpu/cpu_backend.h), each with its slice of the GDN state and of
 * the KV cache. */
#ifndef QD_MODEL_SPLIT_GROUP_H
#define QD_MODEL_SPLIT_GROUP_H

#include "model/model_shard.h"

typedef struct qd_tp_cpu {
    int tp_size;
    bool expert_parallel;
    qd_shard_plan *plans;   /* [tp_size] */
    qd_model **models;      /* [tp_size] rank models (views into the full model, plus owned slices) */
    void **ctxs;            /* [tp_size] the ranks' backend contexts (qd_cpu_ctx) */
    qd_model *top;          /* the split model */
    qd_context *ctx;        /* its context: lengths and block tables for every rank */
    qd_err err;
} qd_tp_cpu;

/* Plans and cuts tp_size ranks of `full` (a CPU model) and makes their context with
 * params. The group borrows `full`, which must outlive it. Errors (a tp_size that does
 * not divide a dimension, ...) come back in err. */
qd_status qd_tp_cpu_create(qd_model *full, int tp_size, bool expert_parallel, const qd_context_params *params,
                           qd_tp_cpu **out, qd_err *err);
void qd_tp_cpu_free(qd_tp_cpu *g);

/* qd_forward over the group: logits come from rank 0 (the LM head is whole on every
 * rank). Messages in g->err. */
qd_status qd_tp_forward_cpu(qd_tp_cpu *g, const qd_span *spans, int n_spans, float *logits);

#endif
