/* The MTP head's forward (spec 7.2) over a ragged batch: validated here like a main
 * forward, its KV positions reserved in the sequences' own blocks (the MTP layer is
 * attention layer n_attn of every block, backend.h qd_mtp_weights), then run by the
 * backend. A sequence's MTP KV covers positions [0, mtp_length); a draft step may run it
 * past the sequence's length, and those positions go when the sequence is rolled back
 * or the caller truncates them. */
#include <stdio.h>

#include "model/model.h"

int qd_model_has_mtp(const qd_model *m, char *why, size_t why_size) {
    if (!m) return 0;
    if (qd_model_mtp_bound(m)) return 1;
    if (why && why_size) snprintf(why, why_size, "%s", m->mtp_missing[0] ? m->mtp_missing : "the model has no MTP head");
    return 0;
}

int qd_model_hidden_size(const qd_model *m) { return m ? m->cfg.hidden_size : 0; }

int qd_mtp_length(const qd_context *ctx, int seq) {
    if (!ctx || seq < 0 || seq >= ctx->params.max_seqs) return -1;
    return ctx->seqs[seq].mtp_length;
}

qd_status qd_mtp_truncate(qd_context *ctx, int seq, int n) {
    if (!ctx) return QD_ERR_INVALID_ARG;
    if (seq < 0 || seq >= ctx->params.max_seqs)
        return qd_seterr(&ctx->err, QD_ERR_INVALID_ARG, "sequence %d out of range [0, %d)", seq, ctx->params.max_seqs);
    if (n < 0) return qd_seterr(&ctx->err, QD_ERR_INVALID_ARG, "MTP length %d is negative", n);
    qd_seq_blocks *q = &ctx->seqs[seq];
    if (q->mtp_length > n) q->mtp_length = n;
    /* blocks past the sequence's length that only draft positions used go back */
    qd_kv_truncate(ctx, seq, q->length > q->mtp_length ? q->length : q->mtp_length);
    return QD_OK;
}

qd_status qd_mtp_adopt(qd_context *ctx, int seq, int n) {
    if (!ctx) return QD_ERR_INVALID_ARG;
    if (seq < 0 || seq >= ctx->params.max_seqs)
        return qd_seterr(&ctx->err, QD_ERR_INVALID_ARG, "sequence %d out of range [0, %d)", seq, ctx->params.max_seqs);
    if (!ctx->params.mtp) return qd_seterr(&ctx->err, QD_ERR_UNSUPPORTED, "the context has no MTP KV (params.mtp)");
    if (n < 0 || n > ctx->seqs[seq].length)
        return qd_seterr(&ctx->err, QD_ERR_INVALID_ARG, "MTP length %d outside [0, %d] (the sequence's length)", n,
                         ctx->seqs[seq].length);
    ctx->seqs[seq].mtp_length = n;
    return QD_OK;
}

static qd_status validate(qd_context *ctx, const qd_span *spans, int n_spans, qd_span_rt *rt, int *n_rows,
                          int *n_logit_rows) {
    const qd_model *m = ctx->model;
    const qd_context_params *p = &ctx->params;
    if (!p->mtp)
        return qd_seterr(&ctx->err, QD_ERR_UNSUPPORTED, "the MTP head needs a context created with params.mtp");
    if (n_spans < 1 || !spans) return qd_seterr(&ctx->err, QD_ERR_INVALID_ARG, "empty MTP batch");
    if (n_spans > p->max_seqs)
        return qd_seterr(&ctx->err, QD_ERR_CAPACITY, "%d MTP spans but the context has %d sequence slots", n_spans,
                         p->max_seqs);
    int rows = 0, logit_rows = 0, blocks = 0;
    for (int i = 0; i < n_spans; i++) {
        const qd_span *s = &spans[i];
        if (s->seq < 0 || s->seq >= p->max_seqs)
            return qd_seterr(&ctx->err, QD_ERR_INVALID_ARG, "MTP span %d: sequence %d out of range [0, %d)", i, s->seq,
                             p->max_seqs);
        for (int j = 0; j < i; j++)
            if (spans[j].seq == s->seq)
                return qd_seterr(&ctx->err, QD_ERR_INVALID_ARG, "sequence %d appears twice in one MTP batch", s->seq);
        if (s->n_tokens < 1 || !s->tokens)
            return qd_seterr(&ctx->err, QD_ERR_INVALID_ARG, "MTP span %d (sequence %d) has no tokens", i, s->seq);
        for (int t = 0; t < s->n_tokens; t++)
            if (s->tokens[t] < 0 || s->tokens[t] >= m->cfg.vocab_size)
                return qd_seterr(&ctx->err, QD_ERR_INVALID_ARG,
                                 "token id %d at position %d of MTP span %d is out of range [0, %d)", s->tokens[t], t,
                                 i, m->cfg.vocab_size);
        const qd_seq_blocks *q = &ctx->seqs[s->seq];
        if (s->n_tokens > p->max_ctx - q->mtp_length)
            return qd_seterr(&ctx->err, QD_ERR_CAPACITY, "sequence %d: MTP positions %d + %d exceed the context length %d",
                             s->seq, q->mtp_length, s->n_tokens, p->max_ctx);
        if (s->n_tokens > p->max_batch - rows)
            return qd_seterr(&ctx->err, QD_ERR_CAPACITY, "MTP batch of more than %d tokens (max_batch)", p->max_batch);
        const int past = q->mtp_length + s->n_tokens - q->length; /* positions beyond the sequence's blocks */
        if (past > 0) blocks += qd_kv_blocks_needed(ctx, s->seq, past);
        blocks += qd_kv_shared_in(ctx, s->seq, q->mtp_length, q->mtp_length + s->n_tokens);
        rt[i] = (qd_span_rt){s->seq, rows, s->n_tokens, q->mtp_length};
        rows += s->n_tokens;
        if (s->logits == QD_LOGITS_ALL) logit_rows += s->n_tokens;
        else if (s->logits == QD_LOGITS_LAST) logit_rows += 1;
        else if (s->logits != QD_LOGITS_NONE)
            return qd_seterr(&ctx->err, QD_ERR_INVALID_ARG, "MTP span %d: unknown logits mode %d", i, (int)s->logits);
    }
    if (blocks > qd_kv_free_blocks(ctx))
        return qd_seterr(&ctx->err, QD_ERR_CAPACITY,
                         "KV cache pool exhausted: the MTP batch needs %d more blocks of %d tokens, %d of %d are free",
                         blocks, ctx->kv.block_size, qd_kv_free_blocks(ctx), qd_kv_total_blocks(ctx));
    for (int i = 0; i < n_spans; i++) {
        const qd_seq_blocks *q = &ctx->seqs[spans[i].seq];
        const int past = q->mtp_length + spans[i].n_tokens - q->length;
        if (past > 0) QD_TRY(qd_kv_reserve(ctx, spans[i].seq, past));
        /* a pair (h_p, token p+1) at the edge of a shared prefix differs between sharers */
        QD_TRY(qd_kv_unshare(ctx, spans[i].seq, q->mtp_length, q->mtp_length + spans[i].n_tokens));
    }
    *n_rows = rows;
    *n_logit_rows = logit_rows;
    return QD_OK;
}

/* Validates, runs the backend's MTP forward with the outputs `out` asks for, advances the
 * spans' MTP lengths. */
static qd_status mtp_run(qd_context *ctx, const qd_span *spans, int n_spans, const float *hidden, int wants_rows,
                         const qd_logit_out *out) {
    if (!ctx) return QD_ERR_INVALID_ARG;
    if (!hidden) return qd_seterr(&ctx->err, QD_ERR_INVALID_ARG, "MTP forward without hidden states");
    qd_step st = {.spans = spans, .rt = ctx->spans_rt, .n_spans = n_spans, .seqs = ctx->seqs};
    QD_TRY(validate(ctx, spans, n_spans, ctx->spans_rt, &st.n_rows, &st.n_logit_rows));
    if (st.n_logit_rows > 0 && !wants_rows)
        return qd_seterr(&ctx->err, QD_ERR_INVALID_ARG, "MTP logits requested but no output buffer");
    QD_TRY(ctx->model->ops->mtp_forward(ctx->bc, &st, hidden, out));
    for (int i = 0; i < n_spans; i++) ctx->seqs[st.rt[i].seq].mtp_length += st.rt[i].T;
    return QD_OK;
}

qd_status qd_mtp_forward(qd_context *ctx, const qd_span *spans, int n_spans, const float *hidden, float *logits,
                         float *hidden_out) {
    if (!ctx) return QD_ERR_INVALID_ARG;
    const qd_logit_out out = {.logits = logits, .vocab_limit = ctx->model->cfg.vocab_size, .hidden = hidden_out};
    return mtp_run(ctx, spans, n_spans, hidden, logits || hidden_out, &out);
}

qd_status qd_mtp_forward_ids(qd_context *ctx, const qd_span *spans, int n_spans, const float *hidden, int vocab_limit,
                             int32_t *ids, float *hidden_out) {
    if (!ctx) return QD_ERR_INVALID_ARG;
    const int V = ctx->model->cfg.vocab_size;
    if (vocab_limit < 0 || vocab_limit > V)
        return qd_seterr(&ctx->err, QD_ERR_INVALID_ARG, "MTP forward: vocab_limit %d outside [0, %d]", vocab_limit, V);
    const qd_logit_out out = {.ids = ids, .vocab_limit = vocab_limit > 0 ? vocab_limit : V, .hidden = hidden_out};
    return mtp_run(ctx, spans, n_spans, hidden, ids || hidden_out, &out);
}
