/* One forward pass over a ragged batch: prefill spans, decode spans and mixes of
 * both go through the same code. Here the batch is validated and its KV blocks taken;
 * the backend runs the layers over the packed rows and the span boundaries. */
#include <string.h>

#include "model/model.h"

/* The allow masks of a batch of n_logit_rows logit rows (qd_forward_args.allow). */
static qd_status check_allow(qd_context *ctx, const qd_logit_out *out, int n_logit_rows) {
    if (!out->allow_row) return QD_OK;
    if (!out->ids) return qd_seterr(&ctx->err, QD_ERR_INVALID_ARG, "allow masks given without an ids buffer");
    if (out->n_allow < 0) return qd_seterr(&ctx->err, QD_ERR_INVALID_ARG, "n_allow %d is negative", out->n_allow);
    if (out->n_allow > 0 && !out->allow)
        return qd_seterr(&ctx->err, QD_ERR_INVALID_ARG, "n_allow %d but no allow masks (allow is NULL)", out->n_allow);
    for (int r = 0; r < n_logit_rows; r++)
        if (out->allow_row[r] < -1 || out->allow_row[r] >= out->n_allow)
            return qd_seterr(&ctx->err, QD_ERR_INVALID_ARG,
                             "allow_row[%d] = %d is neither -1 (unmasked) nor a mask index in [0, %d)", r,
                             out->allow_row[r], out->n_allow);
    return QD_OK;
}

static qd_status validate(qd_context *ctx, const qd_span *spans, int n_spans, const uint8_t *verify,
                          const qd_logit_out *out, qd_span_rt *rt, int *n_rows, int *n_logit_rows) {
    const qd_model *m = ctx->model;
    const qd_context_params *p = &ctx->params;
    if (n_spans < 1) return qd_seterr(&ctx->err, QD_ERR_INVALID_ARG, "empty batch");
    if (n_spans > p->max_seqs)
        return qd_seterr(&ctx->err, QD_ERR_CAPACITY, "%d spans but the context has %d sequence slots", n_spans, p->max_seqs);
    int rows = 0, logit_rows = 0, blocks = 0;
    for (int i = 0; i < n_spans; i++) {
        const qd_span *s = &spans[i];
        if (s->seq < 0 || s->seq >= p->max_seqs)
            return qd_seterr(&ctx->err, QD_ERR_INVALID_ARG, "span %d: sequence %d out of range [0, %d)", i, s->seq, p->max_seqs);
        for (int j = 0; j < i; j++)
            if (spans[j].seq == s->seq)
                return qd_seterr(&ctx->err, QD_ERR_INVALID_ARG, "sequence %d appears twice in one batch", s->seq);
        if (s->n_tokens < 1 || !s->tokens)
            return qd_seterr(&ctx->err, QD_ERR_INVALID_ARG, "span %d (sequence %d) has no tokens", i, s->seq);
        for (int t = 0; t < s->n_tokens; t++)
            if (s->tokens[t] < 0 || s->tokens[t] >= m->cfg.vocab_size)
                return qd_seterr(&ctx->err, QD_ERR_INVALID_ARG, "token id %d at position %d of span %d is out of range [0, %d)",
                                 s->tokens[t], t, i, m->cfg.vocab_size);
        int len = ctx->seqs[s->seq].length;
        if (s->n_tokens > p->max_ctx - len)
            return qd_seterr(&ctx->err, QD_ERR_CAPACITY, "sequence %d: %d + %d tokens exceed the context length %d",
                             s->seq, len, s->n_tokens, p->max_ctx);
        if (s->n_tokens > p->max_batch - rows)
            return qd_seterr(&ctx->err, QD_ERR_CAPACITY, "batch of more than %d tokens (max_batch)", p->max_batch);
        if (verify && verify[i]) {
            if (p->speculative_tokens < 1)
                return qd_seterr(&ctx->err, QD_ERR_INVALID_ARG,
                                 "span %d is a verify span but the context has speculative_tokens 0", i);
            if (!m->ops->verify_keep)
                return qd_seterr(&ctx->err, QD_ERR_UNSUPPORTED, "the %s backend has no verify spans yet",
                                 m->ops->name);
            if (s->n_tokens > p->speculative_tokens + 1)
                return qd_seterr(&ctx->err, QD_ERR_INVALID_ARG,
                                 "verify span %d has %d tokens, more than speculative_tokens %d + 1", i, s->n_tokens,
                                 p->speculative_tokens);
        }
        blocks += qd_kv_blocks_needed(ctx, s->seq, s->n_tokens);
        rt[i] = (qd_span_rt){s->seq, rows, s->n_tokens, len};
        rows += s->n_tokens;
        if (s->logits == QD_LOGITS_ALL) logit_rows += s->n_tokens;
        else if (s->logits == QD_LOGITS_LAST) logit_rows += 1;
        else if (s->logits != QD_LOGITS_NONE)
            return qd_seterr(&ctx->err, QD_ERR_INVALID_ARG, "span %d: unknown logits mode %d", i, (int)s->logits);
    }
    QD_TRY(check_allow(ctx, out, logit_rows));
    if (blocks > qd_kv_free_blocks(ctx))
        return qd_seterr(&ctx->err, QD_ERR_CAPACITY,
                         "KV cache pool exhausted: the batch needs %d more blocks of %d tokens, %d of %d are free "
                         "(raise n_kv_blocks or free sequences)",
                         blocks, ctx->kv.block_size, qd_kv_free_blocks(ctx), qd_kv_total_blocks(ctx));
    /* all checks passed: take the blocks now, so a failed batch changes nothing */
    for (int i = 0; i < n_spans; i++) QD_TRY(qd_kv_reserve(ctx, spans[i].seq, spans[i].n_tokens));
    *n_rows = rows;
    *n_logit_rows = logit_rows;
    return QD_OK;
}

static qd_status forward_v(qd_context *ctx, const qd_span *spans, int n_spans, const uint8_t *verify,
                           const qd_logit_out *out) {
    qd_step st = {.spans = spans, .rt = ctx->spans_rt, .n_spans = n_spans, .seqs = ctx->seqs, .verify = verify};
    QD_TRY(validate(ctx, spans, n_spans, verify, out, ctx->spans_rt, &st.n_rows, &st.n_logit_rows));
    if (st.n_logit_rows > 0 && !out->logits && !out->ids && !out->hidden)
        return qd_seterr(&ctx->err, QD_ERR_INVALID_ARG, "logits requested but no output buffer");
    const size_t touched = (size_t)ctx->model->cfg.n_layers * (size_t)ctx->model->cfg.n_experts;
    if (ctx->experts_touched) {
        memset(ctx->experts_touched, 0, touched);
        st.experts_touched = ctx->experts_touched;
    }
    /* the state has advanced in the backend unless the failure came first; a failed
     * device step leaves the context unusable for those sequences, as its message says */
    QD_TRY(ctx->model->ops->forward(ctx->bc, &st, out));
    for (int i = 0; i < n_spans; i++) {
        qd_seq_blocks *q = &ctx->seqs[st.rt[i].seq];
        q->verify_pos0 = q->length;
        q->verify_T = verify && verify[i] ? st.rt[i].T : 0;
        q->length += st.rt[i].T;
    }
    if (ctx->experts_touched) {
        int64_t pairs = 0;
        for (size_t i = 0; i < touched; i++) pairs += ctx->experts_touched[i];
        ctx->routed_pairs = pairs;
    }
    return QD_OK;
}

static qd_status forward(qd_context *ctx, const qd_span *spans, int n_spans, const qd_logit_out *out) {
    return forward_v(ctx, spans, n_spans, NULL, out);
}

qd_status qd_forward_ex(qd_context *ctx, const qd_forward_args *a) {
    if (!ctx) return QD_ERR_INVALID_ARG;
    if (!a) return qd_seterr(&ctx->err, QD_ERR_INVALID_ARG, "no forward arguments");
    const int V = ctx->model->cfg.vocab_size;
    if (a->vocab_limit < 0 || a->vocab_limit > V)
        return qd_seterr(&ctx->err, QD_ERR_INVALID_ARG, "vocab_limit %d outside [0, %d]", a->vocab_limit, V);
    if (a->full && !a->logits)
        return qd_seterr(&ctx->err, QD_ERR_INVALID_ARG, "rows of logits asked for but no logits buffer");
    if (a->logprobs && !a->ids)
        return qd_seterr(&ctx->err, QD_ERR_INVALID_ARG, "log-probabilities asked for without an ids buffer");
    if (a->hidden_all && !a->all_hidden)
        return qd_seterr(&ctx->err, QD_ERR_INVALID_ARG, "hidden states of every row asked for but no all_hidden buffer");
    if (a->hidden_all && !ctx->model->ops->mtp_forward)
        return qd_seterr(&ctx->err, QD_ERR_UNSUPPORTED, "the %s backend has no MTP forward (hidden states of every row)",
                         ctx->model->ops->name);
    const qd_logit_out out = {.logits = a->logits, .full = a->full, .ids = a->ids, .logprobs = a->logprobs,
                              .vocab_limit = a->vocab_limit ? a->vocab_limit : V, .hidden = a->hidden,
                              .hidden_all = a->hidden_all, .all_hidden = a->all_hidden, .allow = a->allow,
                              .n_allow = a->n_allow, .allow_row = a->allow_row};
    return forward_v(ctx, a->spans, a->n_spans, a->verify, &out);
}

qd_status qd_seq_accept(qd_context *ctx, int seq, int n_keep) {
    if (!ctx) return QD_ERR_INVALID_ARG;
    if (seq < 0 || seq >= ctx->params.max_seqs)
        return qd_seterr(&ctx->err, QD_ERR_INVALID_ARG, "sequence %d out of range [0, %d)", seq, ctx->params.max_seqs);
    qd_seq_blocks *q = &ctx->seqs[seq];
    if (q->verify_T == 0 || q->length != q->verify_pos0 + q->verify_T)
        return qd_seterr(&ctx->err, QD_ERR_INVALID_ARG,
                         "sequence %d: the last forward that fed it was not a verify span (nothing to accept)", seq);
    if (n_keep < 1 || n_keep > q->verify_T)
        return qd_seterr(&ctx->err, QD_ERR_INVALID_ARG, "sequence %d: keep %d of a verify span of %d tokens", seq,
                         n_keep, q->verify_T);
    if (n_keep < q->verify_T) {
        QD_TRY(ctx->model->ops->verify_keep(ctx->bc, seq, n_keep - 1));
        q->length = q->verify_pos0 + n_keep;
        qd_kv_truncate(ctx, seq, q->length);
    }
    q->verify_T = 0;
    return QD_OK;
}

qd_status qd_forward(qd_context *ctx, const qd_span *spans, int n_spans, float *logits) {
    if (!ctx) return QD_ERR_INVALID_ARG;
    const qd_logit_out out = {.logits = logits, .vocab_limit = ctx->model->cfg.vocab_size};
    return forward(ctx, spans, n_spans, &out);
}

qd_status qd_forward_hidden(qd_context *ctx, const qd_span *spans, int n_spans, float *logits, float *hidden) {
    if (!ctx) return QD_ERR_INVALID_ARG;
    if (!hidden) return qd_seterr(&ctx->err, QD_ERR_INVALID_ARG, "no output buffer for the hidden states");
    const qd_logit_out out = {.logits = logits, .vocab_limit = ctx->model->cfg.vocab_size, .hidden = hidden};
    return forward(ctx, spans, n_spans, &out);
}

qd_status qd_forward_mixed(qd_context *ctx, const qd_span *spans, int n_spans, int vocab_limit, const uint8_t *full,
                           float *logits, int32_t *ids, float *logprobs) {
    if (!ctx) return QD_ERR_INVALID_ARG;
    if (!ids) return qd_seterr(&ctx->err, QD_ERR_INVALID_ARG, "no output buffer for token ids");
    const int V = ctx->model->cfg.vocab_size;
    if (vocab_limit < 0 || vocab_limit > V)
        return qd_seterr(&ctx->err, QD_ERR_INVALID_ARG, "vocab_limit %d outside [0, %d]", vocab_limit, V);
    if (full && !logits)
        return qd_seterr(&ctx->err, QD_ERR_INVALID_ARG, "rows of logits asked for but no logits buffer");
    const qd_logit_out out = {.logits = logits, .full = full, .ids = ids, .logprobs = logprobs,
                             .vocab_limit = vocab_limit ? vocab_limit : V};
    return forward(ctx, spans, n_spans, &out);
}

qd_status qd_forward_greedy_logprobs(qd_context *ctx, const qd_span *spans, int n_spans, int vocab_limit,
                                     int32_t *ids, float *logprobs) {
    return qd_forward_mixed(ctx, spans, n_spans, vocab_limit, NULL, NULL, ids, logprobs);
}

qd_status qd_forward_greedy(qd_context *ctx, const qd_span *spans, int n_spans, int32_t *ids) {
    return qd_forward_greedy_logprobs(ctx, spans, n_spans, 0, ids, NULL);
}
