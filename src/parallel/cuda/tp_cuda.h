/* The CUDA side of a split model (tp.h): rank threads, each rank's device weights and
 * context on its GPU, the communicators and the all-reduce hooks of the forward. */
#ifndef QD_PARALLEL_TP_CUDA_H
#define QD_PARALLEL_TP_CUDA_H

#include "parallel/tp.h"

/* Picks the ranks' GPUs, starts their threads and loads each rank's model on its GPU. */
qd_status qd_tp_cuda_model_load(qd_model *m, const qd_model_params *params, qd_err *err);
void qd_tp_cuda_model_free(qd_model *m);
qd_status qd_tp_cuda_ctx_create(qd_context *ctx);
void qd_tp_cuda_ctx_free(qd_context *ctx);
/* Every rank's forward on its thread, rank 0 writing the logits / ids. */
qd_status qd_tp_cuda_forward(qd_context *ctx, const qd_span *spans, int n_spans, int n_rows, int n_logit_rows,
                             const qd_logit_out *out);
/* fn on every rank's context, each on its rank's thread; messages in ctx->err. */
qd_status qd_tp_cuda_each(qd_context *ctx, qd_tp_rank_fn fn, void *arg);
qd_status qd_tp_cuda_allreduce_ms(qd_context *ctx, double *ms, int *count);

#endif
