/* Gated full attention (spec 5.2): q (+ per-head sigmoid gate), k, v projections,
 * zero-centred q/k norms, partial NeoX RoPE, KV cache append, causal GQA attention,
 * output gate, o_proj. The KV cache is paged (backend.h, qd_seq_blocks). */
#include <math.h>
#include <string.h>

#include "backend/cpu/cpu_backend.h"

qd_status qd_cpu_layer_attn(qd_cpu_ctx *ctx, const qd_layer *L, const qd_step *st, const float *x, float *y) {
    const qd_config *c = ctx->m->cfg;
    const qd_attn_weights *w = &L->attn;
    const qd_span_rt *spans = st->rt;
    const int n_spans = st->n_spans, n_rows = st->n_rows;
    qd_cpu_scratch *s = &ctx->s;
    const int nq = c->attn_nq, nkv = c->attn_nkv, hd = c->attn_head_dim;
    const int qd = nq * hd, kvd = nkv * hd, gated = c->attn_output_gate;
    const int q_rows = qd * (gated ? 2 : 1);

    qd_cpu_ctx_matmul(ctx, &w->q, x, n_rows, s->proj);   /* [n][nq][(q|gate)] */
    qd_cpu_ctx_matmul(ctx, &w->k, x, n_rows, s->proj2);  /* [n][nkv][hd] */
    qd_cpu_ctx_matmul(ctx, &w->v, x, n_rows, s->proj3);  /* [n][nkv][hd] */

    /* split per head [q | gate] into contiguous q (s->u) and gate (s->gate) */
    for (int r = 0; r < n_rows; r++) {
        for (int h = 0; h < nq; h++) {
            const float *src = s->proj + (size_t)r * q_rows + (size_t)h * hd * (gated ? 2 : 1);
            memcpy(s->u + (size_t)r * qd + (size_t)h * hd, src, sizeof(float) * hd);
            if (gated) memcpy(s->gate + (size_t)r * qd + (size_t)h * hd, src + hd, sizeof(float) * hd);
        }
    }
    qd_cpu_rmsnorm(s->u, (int64_t)n_rows * nq, hd, hd, w->q_norm, 1.0f, c->rms_norm_eps, s->u, hd);
    qd_cpu_rmsnorm(s->proj2, (int64_t)n_rows * nkv, hd, hd, w->k_norm, 1.0f, c->rms_norm_eps, s->proj2, hd);
    qd_cpu_rope_neox(s->u, n_rows, nq, hd, qd, c->rope_dim, c->rope_theta, s->pos);
    qd_cpu_rope_neox(s->proj2, n_rows, nkv, hd, kvd, c->rope_dim, c->rope_theta, s->pos);

    /* append this span's keys and values through the block table (qd_forward reserved
     * the blocks), then attend over the sequence's whole paged cache */
    const int block_size = ctx->d.params.kv_block_size;
    for (int i = 0; i < n_spans; i++) {
        const int32_t *blocks = st->seqs[spans[i].seq].blocks;
        const size_t r0 = (size_t)spans[i].row0;
        for (int t = 0; t < spans[i].T; t++) {
            size_t off = qd_cpu_kv_offset(ctx, blocks, L->state_index, spans[i].pos0 + t, kvd);
            memcpy(ctx->kv_k + off, s->proj2 + (r0 + t) * kvd, sizeof(float) * kvd);
            memcpy(ctx->kv_v + off, s->proj3 + (r0 + t) * kvd, sizeof(float) * kvd);
        }
        const size_t layer_off = (size_t)L->state_index * block_size * kvd;
        qd_kv_view view = {ctx->kv_k + layer_off, ctx->kv_v + layer_off, blocks, block_size,
                           (int64_t)ctx->d.kv_block_elems};
        qd_cpu_attention(ctx->m->pool, s->u + r0 * qd, qd, &view, spans[i].T, spans[i].pos0, nq, nkv, hd,
                         1.0f / sqrtf((float)hd), s->o + r0 * qd);
    }
    if (gated)
        for (size_t i = 0; i < (size_t)n_rows * qd; i++) s->o[i] *= qd_sigmoid(s->gate[i]);
    qd_cpu_ctx_matmul(ctx, &w->o, s->o, n_rows, y);
    return QD_OK;
}
