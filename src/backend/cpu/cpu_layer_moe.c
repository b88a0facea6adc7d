/* Mixture of experts (spec 6.2): softmax router over all experts in fp32, top-k,
 * optional renormalisation, routed SwiGLU experts, plus the shared expert scaled by
 * a per-token sigmoid gate. Tokens are grouped by expert so each active expert runs
 * one matmul over its tokens, and all experts of a step share the thread pool. */
#include <math.h>
#include <string.h>

#include "backend/cpu/cpu_backend.h"

void qd_moe_route_token(const float *logits, int E, int k, int renorm, int32_t *sel, float *wsel, float *prob) {
    float mx = -INFINITY;
    for (int e = 0; e < E; e++) mx = logits[e] > mx ? logits[e] : mx;
    float sum = 0.0f;
    for (int e = 0; e < E; e++) {
        prob[e] = expf(logits[e] - mx);
        sum += prob[e];
    }
    for (int e = 0; e < E; e++) prob[e] /= sum;
    for (int j = 0; j < k; j++) {
        int best = -1;
        for (int e = 0; e < E; e++) {
            int taken = 0;
            for (int q = 0; q < j; q++) taken |= sel[q] == e;
            if (!taken && (best < 0 || prob[e] > prob[best])) best = e;
        }
        sel[j] = best;
        wsel[j] = prob[best];
    }
    if (renorm) {
        float s = 0.0f;
        for (int j = 0; j < k; j++) s += wsel[j];
        for (int j = 0; j < k; j++) wsel[j] /= s;
    }
}

/* Only the pairs routed to the bound experts [e0, e1) are gathered, computed and added,
 * so an expert-parallel rank runs its own experts and the others contribute 0. */
qd_status qd_cpu_layer_moe(qd_cpu_ctx *ctx, const qd_moe_weights *w, int n_rows, const float *x, float *y,
                          uint8_t *touched) {
    const qd_config *c = ctx->m->cfg;
    qd_threadpool *pool = ctx->m->pool;
    const int e0 = ctx->m->w->expert0, e1 = e0 + ctx->m->w->n_local_experts;
    const int inv = ctx->d.params.batch_invariant; /* experts sum rows in one order */
    qd_cpu_scratch *s = &ctx->s;
    const int H = c->hidden_size, E = c->n_experts, k = c->n_experts_per_tok, I = c->moe_intermediate_size;

    /* shared expert first, straight into y */
    if (w->has_shared) {
        QD_TRY(qd_cpu_layer_mlp(ctx, &w->shared, n_rows, x, y));
        qd_cpu_ctx_matmul(ctx, &w->shared_gate, x, n_rows, s->g); /* [n][1] */
        for (int r = 0; r < n_rows; r++) {
            float gsig = qd_sigmoid(s->g[r]);
            for (int i = 0; i < H; i++) y[(size_t)r * H + i] *= gsig;
        }
    } else {
        memset(y, 0, sizeof(float) * (size_t)n_rows * H);
    }

    /* route: router logits, then per token softmax + top-k */
    qd_cpu_ctx_matmul(ctx, &w->router, x, n_rows, s->router);
    for (int r = 0; r < n_rows; r++)
        qd_moe_route_token(s->router + (size_t)r * E, E, k, c->norm_topk_prob, s->moe_sel + (size_t)r * k,
                    s->moe_w + (size_t)r * k, s->moe_prob);
    if (touched)
        for (int i = 0; i < n_rows * k; i++) touched[s->moe_sel[i]] = 1;

    /* group (token, slot) pairs by expert with a counting sort */
    int32_t *count = (int32_t *)s->router; /* router logits are consumed: reuse the space */
    memset(count, 0, sizeof(int32_t) * (size_t)(E + 1));
    for (int i = 0; i < n_rows * k; i++) count[s->moe_sel[i] + 1]++;
    for (int e = 0; e < E; e++) count[e + 1] += count[e];  /* count[e] = first slot of expert e */
    int32_t *cursor = count + E + 1;
    memcpy(cursor, count, sizeof(int32_t) * (size_t)E);
    for (int i = 0; i < n_rows * k; i++) s->moe_order[cursor[s->moe_sel[i]]++] = i;
    for (int j = count[e0]; j < count[e1]; j++)
        memcpy(s->moe_x + (size_t)j * H, x + (size_t)(s->moe_order[j] / k) * H, sizeof(float) * H);

    /* gate and up products for every active expert in one batch, then down */
    qd_matmul_item items[2 * 1024];
    int n_items = 0, base_e = e0;
    while (base_e < e1) {
        n_items = 0;
        int e = base_e;
        for (; e < e1 && n_items + 2 <= (int)(sizeof items / sizeof items[0]); e++) {
            int n = count[e + 1] - count[e];
            if (!n) continue;
            size_t off = (size_t)count[e];
            items[n_items++] = (qd_matmul_item){&w->experts[e].gate, s->moe_x + off * H, n, s->ffn_a + off * I, inv};
            items[n_items++] = (qd_matmul_item){&w->experts[e].up, s->moe_x + off * H, n, s->ffn_b + off * I, inv};
        }
        qd_cpu_matmul_batch(pool, items, n_items);
        base_e = e;
    }
    qd_cpu_silu_mul(s->ffn_a + (size_t)count[e0] * I, s->ffn_b + (size_t)count[e0] * I,
                    (int64_t)(count[e1] - count[e0]) * I, s->ffn_a + (size_t)count[e0] * I);
    base_e = e0;
    while (base_e < e1) {
        n_items = 0;
        int e = base_e;
        for (; e < e1 && n_items + 1 <= (int)(sizeof items / sizeof items[0]); e++) {
            int n = count[e + 1] - count[e];
            if (!n) continue;
            size_t off = (size_t)count[e];
            items[n_items++] = (qd_matmul_item){&w->experts[e].down, s->ffn_a + off * I, n, s->moe_y + off * H, inv};
        }
        qd_cpu_matmul_batch(pool, items, n_items);
        base_e = e;
    }
    /* weighted scatter-add back to tokens */
    for (int j = count[e0]; j < count[e1]; j++) {
        int pair = s->moe_order[j];
        float wgt = s->moe_w[pair];
        float *yr = y + (size_t)(pair / k) * H;
        const float *src = s->moe_y + (size_t)j * H;
        for (int i = 0; i < H; i++) yr[i] += wgt * src[i];
    }
    return QD_OK;
}
