/* Context: the sequences (lengths, KV block tables) and the block pool's bookkeeping
 * (kv_cache.c), with the backend's context holding the GDN state, the blocks' contents,
 * the snapshot slots and the scratch of one forward, all sized at creation so that
 * qd_forward never allocates. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/model.h"

qd_context_params qd_context_default_params(void) {
    qd_context_params p = {.max_seqs = 1, .max_ctx = 4096, .max_batch = 512, .kv_block_size = 16, .n_kv_blocks = 0};
    return p;
}

qd_status qd_context_create(qd_model *m, const qd_context_params *params, qd_context **out) {
    *out = NULL;
    if (!m) return QD_ERR_INVALID_ARG;
    qd_context_params p = params ? *params : qd_context_default_params();
    if (p.max_seqs < 1 || p.max_ctx < 1 || p.max_batch < 1)
        return qd_seterr(&m->err, QD_ERR_INVALID_ARG, "context params must be positive (max_seqs %d, max_ctx %d, max_batch %d)",
                         p.max_seqs, p.max_ctx, p.max_batch);
    if (p.n_snap_slots < 0)
        return qd_seterr(&m->err, QD_ERR_INVALID_ARG, "n_snap_slots %d must not be negative", p.n_snap_slots);
    if (p.speculative_tokens < 0 || p.speculative_tokens > 4)
        return qd_seterr(&m->err, QD_ERR_INVALID_ARG, "speculative_tokens %d outside 0..4", p.speculative_tokens);
    if (p.mtp) {
        if (!m->ops->mtp_forward)
            return qd_seterr(&m->err, QD_ERR_UNSUPPORTED, "speculative decoding: the %s backend%s has no MTP forward yet",
                             m->ops->name, m->split ? " split for tensor parallelism" : "");
        if (!qd_model_mtp_bound(m))
            return qd_seterr(&m->err, QD_ERR_UNSUPPORTED, "speculative decoding: %s",
                             m->mtp_missing[0] ? m->mtp_missing : "the model has no MTP head");
    }
    qd_context *ctx = calloc(1, sizeof *ctx);
    if (!ctx) return qd_seterr(&m->err, QD_ERR_OOM, "out of memory for a context");
    ctx->model = m;
    ctx->params = p;
    ctx->seqs = calloc((size_t)p.max_seqs, sizeof(qd_seq_blocks));
    ctx->spans_rt = calloc((size_t)p.max_seqs, sizeof(qd_span_rt));
    qd_status st = ctx->seqs && ctx->spans_rt ? qd_kv_pool_init(ctx) : QD_ERR_OOM;
    if (st == QD_ERR_OOM) {
        qd_context_free(ctx);
        return qd_seterr(&m->err, QD_ERR_OOM, "out of memory for the block tables of %d sequences of %d tokens",
                         p.max_seqs, p.max_ctx);
    }
    if (st != QD_OK) {
        qd_context_free(ctx);
        return st;
    }
    const qd_backend_ctx_desc d = {
        .params = ctx->params,
        .max_blocks_per_seq = ctx->kv.max_blocks_per_seq,
        .n_kv_blocks = ctx->kv.n_blocks,
        .kv_block_elems = ctx->kv.block_elems,
        .err = &ctx->err,
    };
    if ((st = m->ops->ctx_create(m->bm, &d, &ctx->bc, &m->err)) != QD_OK) {
        qd_context_free(ctx);
        return st;
    }
    *out = ctx;
    return QD_OK;
}

void qd_context_free(qd_context *ctx) {
    if (!ctx) return;
    if (ctx->bc) ctx->model->ops->ctx_free(ctx->bc);
    qd_kv_pool_free(ctx);
    free(ctx->seqs);
    free(ctx->spans_rt);
    free(ctx->experts_touched);
    free(ctx);
}

const char *qd_context_errmsg(const qd_context *ctx) { return ctx ? ctx->err.msg : "no context"; }

qd_status qd_seq_reset(qd_context *ctx, int seq) {
    if (seq < 0 || seq >= ctx->params.max_seqs)
        return qd_seterr(&ctx->err, QD_ERR_INVALID_ARG, "sequence %d out of range [0, %d)", seq, ctx->params.max_seqs);
    QD_TRY(qd_seq_state_clear(ctx, seq));
    ctx->seqs[seq].length = 0;
    ctx->seqs[seq].verify_T = 0;
    qd_kv_truncate(ctx, seq, 0);
    return QD_OK;
}

qd_backend_kind qd_context_backend(const qd_context *ctx) { return ctx->model->backend; }

int qd_seq_length(const qd_context *ctx, int seq) {
    if (!ctx || seq < 0 || seq >= ctx->params.max_seqs) return -1;
    return ctx->seqs[seq].length;
}
