/* The CPU backend's forward: embeddings, the layer loop, the logit rows. One loop for
 * an unsplit model and for the ranks of a split one: the ranks' blocks run one after
 * another, and between blocks their partial outputs are summed in rank order, which is
 * what an all-reduce does across devices (up to its summation order). */
#include <math.h>
#include <string.h>

#include "backend/cpu/cpu_backend.h"

static void embed_rows(const qd_cpu_ctx *c, const qd_step *st, float *h) {
    const qd_weight *e = &c->m->w->embed;
    const int H = c->m->cfg->hidden_size;
    const size_t esz = qd_dtype_size(e->dtype);
    int r = 0;
    for (int i = 0; i < st->n_spans; i++)
        for (int t = 0; t < st->spans[i].n_tokens; t++, r++)
            qd_convert_to_f32(e->dtype, (const unsigned char *)e->data + (size_t)st->spans[i].tokens[t] * H * esz,
                              h + (size_t)r * H, (size_t)H);
}

/* Positions and embeddings of a validated batch. */
static void begin_rows(qd_cpu_ctx *c, const qd_step *st) {
    for (int i = 0; i < st->n_spans; i++)
        for (int t = 0; t < st->rt[i].T; t++) c->s.pos[st->rt[i].row0 + t] = st->rt[i].pos0 + t;
    embed_rows(c, st, c->s.h);
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

static int allowed(const uint32_t *allow, int i) { return (allow[i >> 5] >> (i & 31)) & 1; }

/* argmax_row over the ids its allow mask keeps: the row with its refused logits at
 * -inf, except that a row with no allowed logit above -inf gives -1 (logprob -inf)
 * rather than an arbitrary id. */
static int32_t argmax_row_allowed(const float *x, int n, const uint32_t *allow, float *lp) {
    int32_t best = -1;
    for (int i = 0; i < n; i++)
        if (allowed(allow, i) && x[i] > (best < 0 ? -INFINITY : x[best])) best = i;
    if (best < 0) {
        if (lp) *lp = -INFINITY;
        return -1;
    }
    if (lp) {
        double se = 0;
        for (int i = 0; i < n; i++)
            if (allowed(allow, i)) se += expf(x[i] - x[best]);
        *lp = (float)-log(se);
    }
    return best;
}

/* Logit row r's id and logprob (qd_logit_out) from its logits x. */
static void take_id(const qd_logit_out *out, int r, int V, const float *x) {
    const uint32_t *allow = qd_logit_allow(out, r, V);
    float *lp = out->logprobs ? out->logprobs + r : NULL;
    out->ids[r] = allow ? argmax_row_allowed(x, out->vocab_limit, allow, lp) : argmax_row(x, out->vocab_limit, lp);
}

/* After the layer stack: what the rows that want logits hand back (see qd_logit_out).
 * Into a caller's logits buffer every row is computed in one matmul (the LM head is read
 * once); ids alone go one row at a time through the context's row buffer, and for the
 * MTP head's drafts (head_prefix) over the LM head's first vocab_limit rows only, all
 * that their argmax reads (plain formats; a quantized head is multiplied whole). The
 * main forward's greedy rows keep the whole product, so that their logits are those of
 * a row asked for in full. */
static qd_status logits_out(qd_cpu_ctx *ctx, const qd_step *st, const float *final_norm, const qd_logit_out *out,
                            int head_prefix) {
    const qd_config *c = ctx->m->cfg;
    const qd_weights *w = ctx->m->w;
    const int H = c->hidden_size, n_logit_rows = st->n_logit_rows;
    qd_cpu_scratch *s = &ctx->s;
    if (out->hidden_all) {
        float *dst = out->all_hidden;
        for (int i = 0; i < st->n_spans; i++) {
            if (!out->hidden_all[i]) continue;
            const qd_span_rt *rt = &st->rt[i];
            qd_cpu_rmsnorm(s->h + (size_t)rt->row0 * H, rt->T, H, H, final_norm, 1.0f, c->rms_norm_eps, dst, H);
            dst += (size_t)rt->T * H;
        }
    }
    if (n_logit_rows == 0) return QD_OK;
    /* gather the rows that want logits, final norm, LM head */
    int lr = 0;
    for (int i = 0; i < st->n_spans; i++) {
        const qd_span_rt *rt = &st->rt[i];
        if (st->spans[i].logits == QD_LOGITS_NONE) continue;
        int first = st->spans[i].logits == QD_LOGITS_ALL ? 0 : rt->T - 1;
        for (int t = first; t < rt->T; t++, lr++)
            qd_cpu_rmsnorm(s->h + (size_t)(rt->row0 + t) * H, 1, H, H, final_norm, 1.0f, c->rms_norm_eps,
                           s->x + (size_t)lr * H, H);
    }
    if (out->hidden) memcpy(out->hidden, s->x, sizeof(float) * (size_t)n_logit_rows * H);
    if (!out->logits && !out->ids) return QD_OK; /* the hidden states alone */
    if (out->logits) {
        qd_cpu_ctx_matmul(ctx, &w->lm_head, s->x, n_logit_rows, out->logits);
        if (out->ids)
            for (int r = 0; r < n_logit_rows; r++) take_id(out, r, c->vocab_size, out->logits + (size_t)r * c->vocab_size);
        return QD_OK;
    }
    qd_weight head = w->lm_head;
    if (head_prefix && out->vocab_limit > 0 && out->vocab_limit < head.rows && !qd_weight_quantized(&head) && head.data)
        head.rows = out->vocab_limit;
    for (int r = 0; r < n_logit_rows; r++) {
        qd_cpu_ctx_matmul(ctx, &head, s->x + (size_t)r * H, 1, ctx->row_logits);
        take_id(out, r, c->vocab_size, ctx->row_logits);
    }
    return QD_OK;
}

/* One block (mixer, or FFN when ffn) of layer L on one rank: normed input, the block's
 * (partial) output in s.y. */
static qd_status run_block(qd_cpu_ctx *ctx, const qd_layer *ly, int ffn, const qd_step *st) {
    const qd_config *c = ctx->m->cfg;
    qd_cpu_scratch *s = &ctx->s;
    const int H = c->hidden_size;
    qd_cpu_rmsnorm(s->h, st->n_rows, H, H, ffn ? ly->post_norm : ly->input_norm, 1.0f, c->rms_norm_eps, s->x, H);
    if (!ffn) {
        if (ly->kind == QD_LAYER_GDN) return qd_cpu_layer_gdn(ctx, ly, st, s->x, s->y);
        return qd_cpu_layer_attn(ctx, ly, st, s->x, s->y);
    }
    if (ly->ffn_kind == QD_FFN_MOE) {
        const qd_weights *w = ctx->m->w;
        uint8_t *touched = NULL; /* this layer's row of the step's expert counts */
        if (st->experts_touched && ly >= w->layers && ly < w->layers + c->n_layers)
            touched = st->experts_touched + (size_t)(ly - w->layers) * (size_t)c->n_experts;
        return qd_cpu_layer_moe(ctx, &ly->moe, st->n_rows, s->x, s->y, touched);
    }
    return qd_cpu_layer_mlp(ctx, &ly->mlp, st->n_rows, s->x, s->y);
}

/* The all-reduce: every rank's y becomes y_0 + y_1 + ... in rank order. */
static void sum_ranks(qd_cpu_ctx *const *ranks, int n, size_t len) {
    float *acc = ranks[0]->s.y;
    for (int r = 1; r < n; r++) {
        const float *y = ranks[r]->s.y;
        for (size_t i = 0; i < len; i++) acc[i] += y[i];
    }
    for (int r = 1; r < n; r++) memcpy(ranks[r]->s.y, acc, len * sizeof(float));
}

/* One block of a layer on every rank: each rank's partial output, summed over the ranks,
 * joins each rank's residual. L is a main layer, or -1 for the MTP head's layer (each
 * rank runs its own slice of it). */
static qd_status run_block_ranks(qd_cpu_ctx *const *ranks, int n, int L, int ffn, const qd_step *st) {
    const size_t len = (size_t)st->n_rows * (size_t)ranks[0]->m->cfg->hidden_size;
    for (int r = 0; r < n; r++) {
        const qd_weights *w = ranks[r]->m->w;
        qd_status s = run_block(ranks[r], L >= 0 ? &w->layers[L] : &w->mtp->layer, ffn, st);
        if (s != QD_OK) {
            if (L >= 0 && n > 1) qd_err_prefix(ranks[r]->err, "rank %d, layer %d: ", r, L);
            else if (L < 0 && n > 1) qd_err_prefix(ranks[r]->err, "rank %d, MTP layer: ", r);
            else if (L < 0) qd_err_prefix(ranks[r]->err, "MTP layer: ");
            return s;
        }
    }
    if (n > 1) sum_ranks(ranks, n, len);
    for (int r = 0; r < n; r++) {
        float *h = ranks[r]->s.h;
        const float *y = ranks[r]->s.y;
        for (size_t i = 0; i < len; i++) h[i] += y[i];
    }
    return QD_OK;
}

qd_status qd_cpu_forward_ranks(qd_cpu_ctx *const *ranks, int n, const qd_step *st, const qd_logit_out *out) {
    const qd_config *c = ranks[0]->m->cfg;
    for (int r = 0; r < n; r++) begin_rows(ranks[r], st);
    for (int L = 0; L < c->n_layers; L++)
        for (int ffn = 0; ffn < 2; ffn++) QD_TRY(run_block_ranks(ranks, n, L, ffn, st));
    return logits_out(ranks[0], st, ranks[0]->m->w->final_norm, out, 0);
}

/* spec 7.2: h = fc([PreFcNormEmb(embed(token)) | PreFcNormHid(hidden)]), one decoder
 * layer over the MTP layer's own KV (attention layer n_attn of the blocks), then the
 * MTP norm and the shared LM head.
 *
 * Over the ranks of a split model the head's decoder layer is sharded like the main
 * attention layers (by the same plan: the rank's KV heads and query heads, its slice of
 * the FFN or of every expert), its partial block outputs summed as the main layers'
 * are. Sharded rather than replicated because a rank's KV blocks hold only its own KV
 * heads (the block layout of every attention layer, the MTP's included): a replicated
 * layer would need every head's keys on every rank. The norms, fc ([H][2H], whole on
 * every rank) and the embedding run on every rank alike, as the embedding of a main
 * forward does, so that every rank enters the layer with the whole h and no broadcast
 * is needed; rank 0 writes the logit rows. */
static qd_status mtp_check(qd_cpu_ctx *ctx) {
    const qd_config *c = ctx->m->cfg;
    if (!ctx->m->w->mtp) return qd_seterr(ctx->err, QD_ERR_UNSUPPORTED, "the model has no MTP head bound");
    const size_t need = (size_t)(ctx->m->w->n_attn + 1) * ctx->d.params.kv_block_size * c->attn_nkv * c->attn_head_dim;
    if (ctx->d.kv_block_elems < need)
        return qd_seterr(ctx->err, QD_ERR_UNSUPPORTED, "the context was created without the MTP layer's KV (params.mtp)");
    return QD_OK;
}

/* fc's input and output on one rank: h = fc([normed embedding | normed hidden]). */
static void mtp_begin(qd_cpu_ctx *ctx, const qd_step *st, const float *hidden) {
    const qd_config *c = ctx->m->cfg;
    const qd_mtp_weights *w = ctx->m->w->mtp;
    qd_cpu_scratch *s = &ctx->s;
    const int H = c->hidden_size, n = st->n_rows;
    begin_rows(ctx, st); /* positions; the embeddings land in s.h */
    qd_cpu_rmsnorm(s->h, n, H, H, w->pre_fc_norm_embedding, 1.0f, c->rms_norm_eps, s->mtp_cat, 2 * H);
    qd_cpu_rmsnorm(hidden, n, H, H, w->pre_fc_norm_hidden, 1.0f, c->rms_norm_eps, s->mtp_cat + H, 2 * H);
    qd_cpu_ctx_matmul(ctx, &w->fc, s->mtp_cat, n, s->h);
}

qd_status qd_cpu_mtp_forward_ranks(qd_cpu_ctx *const *ranks, int n, const qd_step *st, const float *hidden,
                                   const qd_logit_out *out) {
    for (int r = 0; r < n; r++) {
        qd_status s = mtp_check(ranks[r]);
        if (s != QD_OK) {
            if (n > 1) qd_err_prefix(ranks[r]->err, "rank %d: ", r);
            return s;
        }
    }
    for (int r = 0; r < n; r++) mtp_begin(ranks[r], st, hidden);
    for (int ffn = 0; ffn < 2; ffn++) QD_TRY(run_block_ranks(ranks, n, -1, ffn, st));
    return logits_out(ranks[0], st, ranks[0]->m->w->mtp->norm, out, 1);
}

qd_status qd_cpu_mtp_forward(void *bc, const qd_step *st, const float *hidden, const qd_logit_out *out) {
    qd_cpu_ctx *ctx = bc;
    return qd_cpu_mtp_forward_ranks(&ctx, 1, st, hidden, out);
}
