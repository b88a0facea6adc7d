/* Context: per-sequence state (GDN conv + recurrent state, KV block tables), the KV
 * block pool (kv_cache.c) and the scratch of one forward, all sized at creation so
 * that qd_forward never allocates. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/arena.h"
#include "model/model.h"
#include "parallel/tp.h"
#ifdef QD_HAVE_CUDA
#include "backend/cuda/cuda_model.h"
#endif

qd_context_params qd_context_default_params(void) {
    qd_context_params p = {.max_seqs = 1, .max_ctx = 4096, .max_batch = 512, .kv_block_size = 16, .n_kv_blocks = 0};
    return p;
}

static size_t max_sz(size_t a, size_t b) { return a > b ? a : b; }

/* Lays out (or, with base == NULL, measures) the scratch buffers for B tokens. */
static size_t plan_scratch(const qd_config *c, size_t B, unsigned char *base, qd_scratch *s) {
    const size_t H = (size_t)c->hidden_size, conv_dim = (size_t)qd_config_conv_dim(c);
    const size_t value_dim = (size_t)qd_config_value_dim(c), hv = (size_t)c->gdn_hv;
    const size_t qd = (size_t)c->attn_nq * (size_t)c->attn_head_dim, kvd = (size_t)c->attn_nkv * (size_t)c->attn_head_dim;
    const size_t q_rows = qd * (c->attn_output_gate ? 2 : 1);
    const size_t k_top = (size_t)(c->n_experts > 0 ? c->n_experts_per_tok : 0);
    size_t ffn = max_sz((size_t)c->intermediate_size, (size_t)c->shared_expert_intermediate_size);
    ffn = max_sz(ffn, k_top * (size_t)c->moe_intermediate_size);
    size_t off = 0;
#define CARVE(field, type, count)                                        \
    do {                                                                 \
        size_t bytes_ = ((count) * sizeof(type) + 63) / 64 * 64;         \
        if (base) s->field = (type *)(base + off);                       \
        off += bytes_;                                                   \
    } while (0)
    CARVE(h, float, B * H);
    CARVE(x, float, B * H);
    CARVE(y, float, B * H);
    CARVE(proj, float, B * max_sz(conv_dim, q_rows));
    CARVE(proj2, float, B * max_sz(value_dim, kvd));
    CARVE(proj3, float, B * max_sz(hv, kvd));
    CARVE(proj4, float, B * hv);
    CARVE(conv_out, float, B * conv_dim);
    CARVE(g, float, B * hv + B);
    CARVE(beta, float, B * hv);
    CARVE(o, float, B * max_sz(value_dim, qd));
    CARVE(u, float, B * max_sz(value_dim, qd));
    CARVE(gate, float, B * qd);
    CARVE(ffn_a, float, B * ffn);
    CARVE(ffn_b, float, B * ffn);
    CARVE(ffn_c, float, B * ffn);
    CARVE(moe_x, float, B * k_top * H);
    CARVE(moe_y, float, B * k_top * H);
    CARVE(router, float, B * (size_t)c->n_experts + 2 * (size_t)c->n_experts + 2);
    CARVE(moe_prob, float, (size_t)c->n_experts + 1);
    CARVE(moe_sel, int32_t, B * k_top);
    CARVE(moe_w, float, B * k_top);
    CARVE(moe_order, int32_t, B * k_top);
    CARVE(pos, int32_t, B);
#undef CARVE
    return off;
}

qd_status qd_context_create(qd_model *m, const qd_context_params *params, qd_context **out) {
    *out = NULL;
    if (!m) return QD_ERR_INVALID_ARG;
    qd_context_params p = params ? *params : qd_context_default_params();
    if (p.max_seqs < 1 || p.max_ctx < 1 || p.max_batch < 1)
        return qd_seterr(&m->err, QD_ERR_INVALID_ARG, "context params must be positive (max_seqs %d, max_ctx %d, max_batch %d)",
                         p.max_seqs, p.max_ctx, p.max_batch);
    /* a split model's all-reduces sum the ranks' partial rows in an order the
     * communicator picks by message size, i.e. by batch size */
    if (p.batch_invariant && m->tp)
        return qd_seterr(&m->err, QD_ERR_UNSUPPORTED,
                         "batch-invariant mode is not available for a tensor- or expert-parallel model");
    const qd_config *c = &m->cfg;
    qd_context *ctx = calloc(1, sizeof *ctx);
    if (!ctx) return qd_seterr(&m->err, QD_ERR_OOM, "out of memory for a context");
    ctx->model = m;
    ctx->params = p;
    /* the CPU forward's scratch; a CUDA context keeps its scratch and state on the device,
     * a split model's context in its ranks */
    const int on_gpu = m->backend == QD_BACKEND_CUDA || m->tp;
    size_t bytes = on_gpu ? 64 : plan_scratch(c, (size_t)p.max_batch, NULL, &ctx->s);
    ctx->scratch_block = qd_aligned_alloc(bytes);
    ctx->row_logits = on_gpu ? NULL : qd_aligned_alloc((size_t)c->vocab_size * sizeof(float));
    if (!on_gpu && !ctx->row_logits) goto oom;
    ctx->seqs = calloc((size_t)p.max_seqs, sizeof(qd_seq_state));
    ctx->spans_rt = calloc((size_t)p.max_seqs, sizeof(qd_span_rt));
    ctx->gdn_spans = calloc((size_t)p.max_seqs, sizeof(qd_gdn_span));
    if (!ctx->scratch_block || !ctx->seqs || !ctx->spans_rt || !ctx->gdn_spans) goto oom;
    if (!on_gpu) plan_scratch(c, (size_t)p.max_batch, ctx->scratch_block, &ctx->s);
    const size_t conv = (size_t)m->n_gdn * qd_config_conv_dim(c) * (size_t)(c->gdn_conv_kernel - 1);
    const size_t ssm = (size_t)m->n_gdn * c->gdn_hv * c->gdn_dk * c->gdn_dv;
    for (int i = 0; i < p.max_seqs && !on_gpu; i++) { /* on the GPU the state lives in the device pool */
        qd_seq_state *q = &ctx->seqs[i];
        q->conv = qd_aligned_calloc(conv * sizeof(float));
        q->ssm = qd_aligned_calloc(ssm * sizeof(float));
        if (!q->conv || !q->ssm) goto oom;
    }
    qd_status st = qd_kv_pool_init(ctx);
    if (st == QD_OK) st = qd_snap_pool_init(ctx);
    if (st == QD_ERR_OOM) goto oom;
    if (st != QD_OK) {
        qd_context_free(ctx);
        return st;
    }
    if (m->tp && (st = qd_tp_ctx_create(ctx)) != QD_OK) {
        qd_context_free(ctx);
        return st;
    }
#ifdef QD_HAVE_CUDA
    if (!m->tp && on_gpu && (st = qd_cuda_ctx_create(ctx)) != QD_OK) {
        qd_context_free(ctx);
        return st;
    }
#endif
    *out = ctx;
    return QD_OK;
oom:
    qd_context_free(ctx);
    return qd_seterr(&m->err, QD_ERR_OOM,
                     "out of memory creating a context (max_seqs %d, max_ctx %d, max_batch %d, n_kv_blocks %d, kv_block_size %d, "
                     "n_snap_slots %d of %zu bytes each)",
                     p.max_seqs, p.max_ctx, p.max_batch, p.n_kv_blocks, p.kv_block_size, p.n_snap_slots,
                     (size_t)qd_model_state_bytes(m));
}

void qd_context_free(qd_context *ctx) {
    if (!ctx) return;
    qd_tp_ctx_free(ctx);
#ifdef QD_HAVE_CUDA
    qd_cuda_ctx_free(ctx);
#endif
    qd_aligned_free(ctx->row_logits);
    if (ctx->seqs) {
        for (int i = 0; i < ctx->params.max_seqs; i++) {
            qd_aligned_free(ctx->seqs[i].conv);
            qd_aligned_free(ctx->seqs[i].ssm);
        }
    }
    qd_kv_pool_free(ctx);
    qd_snap_pool_free(ctx);
    free(ctx->seqs);
    free(ctx->spans_rt);
    free(ctx->gdn_spans);
    qd_aligned_free(ctx->scratch_block);
    free(ctx);
}

const char *qd_context_errmsg(const qd_context *ctx) { return ctx ? ctx->err.msg : "no context"; }

qd_status qd_seq_reset(qd_context *ctx, int seq) {
    if (seq < 0 || seq >= ctx->params.max_seqs)
        return qd_seterr(&ctx->err, QD_ERR_INVALID_ARG, "sequence %d out of range [0, %d)", seq, ctx->params.max_seqs);
    qd_seq_state *q = &ctx->seqs[seq];
    QD_TRY(qd_seq_state_write(ctx, seq, NULL, NULL));
    q->length = 0;
    qd_kv_truncate(ctx, seq, 0);
    return QD_OK;
}

qd_backend_kind qd_context_backend(const qd_context *ctx) { return ctx->model->backend; }

int qd_seq_length(const qd_context *ctx, int seq) {
    if (!ctx || seq < 0 || seq >= ctx->params.max_seqs) return -1;
    return ctx->seqs[seq].length;
}
