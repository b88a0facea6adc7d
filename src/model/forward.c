/* One forward pass over a ragged batch: prefill spans, decode spans and mixes of
 * both go through the same code; layers see packed rows plus span boundaries. */
#include <math.h>
#include <string.h>

#include "model/model.h"
#include "parallel/tp.h"
#ifdef QD_HAVE_CUDA
#include "backend/cuda/cuda_model.h"
#endif

static qd_status validate(qd_context *ctx, const qd_span *spans, int n_spans, qd_span_rt *rt, int *n_rows,
                          int *n_logit_rows) {
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
        blocks += qd_kv_blocks_needed(ctx, s->seq, s->n_tokens);
        rt[i] = (qd_span_rt){s->seq, rows, s->n_tokens, len};
        rows += s->n_tokens;
        if (s->logits == QD_LOGITS_ALL) logit_rows += s->n_tokens;
        else if (s->logits == QD_LOGITS_LAST) logit_rows += 1;
        else if (s->logits != QD_LOGITS_NONE)
            return qd_seterr(&ctx->err, QD_ERR_INVALID_ARG, "span %d: unknown logits mode %d", i, (int)s->logits);
    }
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

static void embed_rows(const qd_model *m, const qd_span *spans, int n_spans, float *h) {
    const int H = m->cfg.hidden_size;
    const size_t esz = qd_dtype_size(m->embed.dtype);
    int r = 0;
    for (int i = 0; i < n_spans; i++)
        for (int t = 0; t < spans[i].n_tokens; t++, r++)
            qd_convert_to_f32(m->embed.dtype, (const unsigned char *)m->embed.data + (size_t)spans[i].tokens[t] * H * esz,
                              h + (size_t)r * H, (size_t)H);
}

static void add_rows(float *h, const float *y, int64_t n) {
    for (int64_t i = 0; i < n; i++) h[i] += y[i];
}

/* Index of the largest logit, the lowest among equals (as the CUDA argmax), and its
 * log-softmax when lp is not NULL. */
static int32_t argmax_row(const float *x, int n, float *lp) {
    int32_t best = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    if (lp) {
        double se = 0;
        /* float terms (this is a pass over the whole vocabulary), a double sum */
        for (int i = 0; i < n; i++) se += expf(x[i] - x[best]);
        *lp = (float)-log(se);
    }
    return best;
}

/* Positions and embeddings of a validated batch (CPU forward). */
static void begin_rows(qd_context *ctx, const qd_span *spans, int n_spans) {
    const qd_span_rt *rt = ctx->spans_rt;
    for (int i = 0; i < n_spans; i++)
        for (int t = 0; t < rt[i].T; t++) ctx->s.pos[rt[i].row0 + t] = rt[i].pos0 + t;
    embed_rows(ctx->model, spans, n_spans, ctx->s.h);
}

/* The spans' tokens are consumed: their sequences grow by them. */
static void advance_lengths(qd_context *ctx, int n_spans) {
    const qd_span_rt *rt = ctx->spans_rt;
    for (int i = 0; i < n_spans; i++) ctx->seqs[rt[i].seq].length += rt[i].T;
}

/* After the layer stack: what the rows that want logits hand back (see qd_logit_out).
 * Into a caller's logits buffer every row is computed in one matmul (the LM head is read
 * once); ids alone go one row at a time through the context's row buffer. */
static qd_status logits_out(qd_context *ctx, const qd_span *spans, int n_spans, int n_logit_rows,
                            const qd_logit_out *out) {
    const qd_model *m = ctx->model;
    const qd_config *c = &m->cfg;
    const int H = c->hidden_size;
    qd_scratch *s = &ctx->s;
    const qd_span_rt *rt = ctx->spans_rt;
    if (n_logit_rows == 0) return QD_OK;
    /* gather the rows that want logits, final norm, LM head */
    int lr = 0;
    for (int i = 0; i < n_spans; i++) {
        int first = spans[i].logits == QD_LOGITS_ALL ? 0 : rt[i].T - 1;
        if (spans[i].logits == QD_LOGITS_NONE) continue;
        for (int t = first; t < rt[i].T; t++, lr++)
            qd_cpu_rmsnorm(s->h + (size_t)(rt[i].row0 + t) * H, 1, H, H, m->final_norm, 1.0f, c->rms_norm_eps,
                           s->x + (size_t)lr * H, H);
    }
    if (out->logits) {
        qd_ctx_matmul(ctx, &m->lm_head, s->x, n_logit_rows, out->logits);
        if (out->ids)
            for (int r = 0; r < n_logit_rows; r++)
                out->ids[r] = argmax_row(out->logits + (size_t)r * c->vocab_size, out->vocab_limit,
                                         out->logprobs ? out->logprobs + r : NULL);
        return QD_OK;
    }
    for (int r = 0; r < n_logit_rows; r++) {
        qd_ctx_matmul(ctx, &m->lm_head, s->x + (size_t)r * H, 1, ctx->row_logits);
        out->ids[r] = argmax_row(ctx->row_logits, out->vocab_limit, out->logprobs ? out->logprobs + r : NULL);
    }
    return QD_OK;
}

/* After the layer stack: sequence lengths, then the logit rows. */
static qd_status finish(qd_context *ctx, const qd_span *spans, int n_spans, int n_logit_rows, const qd_logit_out *out) {
    advance_lengths(ctx, n_spans);
    return logits_out(ctx, spans, n_spans, n_logit_rows, out);
}

static qd_status forward(qd_context *ctx, const qd_span *spans, int n_spans, const qd_logit_out *out) {
    qd_model *m = ctx->model;
    const qd_config *c = &m->cfg;
    qd_scratch *s = &ctx->s;
    qd_span_rt *rt = ctx->spans_rt;
    int n_rows = 0, n_logit_rows = 0;
    QD_TRY(validate(ctx, spans, n_spans, rt, &n_rows, &n_logit_rows));
    if (n_logit_rows > 0 && !out->logits && !out->ids)
        return qd_seterr(&ctx->err, QD_ERR_INVALID_ARG, "logits requested but no output buffer");
    if (ctx->tp) { /* split model: the ranks run the layers; lengths advance as below */
        qd_status st = qd_tp_forward(ctx, spans, n_spans, n_rows, n_logit_rows, out);
        if (st == QD_OK) advance_lengths(ctx, n_spans);
        return st;
    }
#ifdef QD_HAVE_CUDA
    if (ctx->cuda) {
        qd_status st = qd_cuda_forward(ctx, spans, n_spans, rt, n_rows, n_logit_rows, out);
        /* the state has advanced on the device unless the failure came first; a failed
         * CUDA step leaves the context unusable for those sequences, as the message says */
        if (st == QD_OK) advance_lengths(ctx, n_spans);
        return st;
    }
#endif

    const int H = c->hidden_size;
    begin_rows(ctx, spans, n_spans);
    for (int L = 0; L < c->n_layers; L++) {
        const qd_layer *ly = &m->layers[L];
        qd_cpu_rmsnorm(s->h, n_rows, H, H, ly->input_norm, 1.0f, c->rms_norm_eps, s->x, H);
        if (ly->kind == QD_LAYER_GDN) QD_TRY(qd_layer_gdn_forward(ctx, ly, rt, n_spans, n_rows, s->x, s->y));
        else QD_TRY(qd_layer_attn_forward(ctx, ly, rt, n_spans, n_rows, s->x, s->y));
        add_rows(s->h, s->y, (int64_t)n_rows * H);
        qd_cpu_rmsnorm(s->h, n_rows, H, H, ly->post_norm, 1.0f, c->rms_norm_eps, s->x, H);
        if (ly->ffn_kind == QD_FFN_MOE) QD_TRY(qd_layer_moe_forward(ctx, &ly->moe, n_rows, s->x, s->y));
        else QD_TRY(qd_layer_mlp_forward(ctx, &ly->mlp, n_rows, s->x, s->y));
        add_rows(s->h, s->y, (int64_t)n_rows * H);
    }
    return finish(ctx, spans, n_spans, n_logit_rows, out);
}

/* The CPU steps around the layer stack, for the in-process tensor-parallel forward
 * (src/parallel/tp_cpu.c), which runs the stack of every rank in between. */
qd_status qd_forward_begin(qd_context *ctx, const qd_span *spans, int n_spans, float *logits, int *n_rows,
                           int *n_logit_rows) {
    QD_TRY(validate(ctx, spans, n_spans, ctx->spans_rt, n_rows, n_logit_rows));
    if (*n_logit_rows > 0 && !logits) return qd_seterr(&ctx->err, QD_ERR_INVALID_ARG, "logits requested but no output buffer");
    begin_rows(ctx, spans, n_spans);
    return QD_OK;
}

qd_status qd_forward_end(qd_context *ctx, const qd_span *spans, int n_spans, int n_logit_rows, float *logits) {
    const qd_logit_out out = {.logits = logits, .vocab_limit = ctx->model->cfg.vocab_size};
    return finish(ctx, spans, n_spans, n_logit_rows, &out);
}

void qd_forward_rank_begin(qd_context *ctx, const qd_span *spans, int n_spans) { begin_rows(ctx, spans, n_spans); }

qd_status qd_forward_rank_logits(qd_context *ctx, const qd_span *spans, int n_spans, int n_logit_rows,
                                 const qd_logit_out *out) {
    return logits_out(ctx, spans, n_spans, n_logit_rows, out);
}

qd_status qd_forward(qd_context *ctx, const qd_span *spans, int n_spans, float *logits) {
    if (!ctx) return QD_ERR_INVALID_ARG;
    const qd_logit_out out = {.logits = logits, .vocab_limit = ctx->model->cfg.vocab_size};
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
    const qd_logit_out out = {logits, full, ids, logprobs, vocab_limit ? vocab_limit : V};
    return forward(ctx, spans, n_spans, &out);
}

qd_status qd_forward_greedy_logprobs(qd_context *ctx, const qd_span *spans, int n_spans, int vocab_limit,
                                     int32_t *ids, float *logprobs) {
    return qd_forward_mixed(ctx, spans, n_spans, vocab_limit, NULL, NULL, ids, logprobs);
}

qd_status qd_forward_greedy(qd_context *ctx, const qd_span *spans, int n_spans, int32_t *ids) {
    return qd_forward_greedy_logprobs(ctx, spans, n_spans, 0, ids, NULL);
}
