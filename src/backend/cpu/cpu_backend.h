/* The CPU backend (backend.h): a model is the host weights as bound (no copy), a
 * context holds the GDN state of every sequence slot, the contents of the KV blocks,
 * the snapshot slots and the scratch of one forward, all sized at creation so that a
 * forward never allocates. Its layers (cpu_layer_*.c) run over the packed rows of a
 * ragged batch; its layer loop (cpu_forward.c) serves an unsplit model and the ranks of
 * a split one alike. */
#ifndef QD_BACKEND_CPU_BACKEND_H
#define QD_BACKEND_CPU_BACKEND_H

#include "backend/backend.h"
#include "backend/cpu/cpu_ops.h"

typedef struct qd_cpu_model {
    const qd_config *cfg;
    const qd_weights *w;
    qd_threadpool *pool;
} qd_cpu_model;

/* Scratch for one forward over at most max_batch tokens, planned at creation. */
typedef struct qd_cpu_scratch {
    float *h;           /* [B][H] residual stream */
    float *x;           /* [B][H] normed input of a block */
    float *y;           /* [B][H] block output */
    float *proj;        /* [B][max projection width] */
    float *proj2;       /* [B][...] second projection (z / k) */
    float *proj3;       /* [B][...] (b / v) */
    float *proj4;       /* [B][...] (a) */
    float *conv_out;    /* [B][conv_dim] */
    float *g, *beta;    /* [B][hv] */
    float *o;           /* [B][value_dim or nq*hd] */
    float *u;           /* [B][value_dim or nq*hd] */
    float *gate;        /* [B][nq*hd] attention output gate */
    float *ffn_a;       /* [B][max(I, I_s, k_top*I_e)] */
    float *ffn_b;       /* [B][...] */
    float *ffn_c;       /* [B][...] */
    float *moe_x;       /* [B*k_top][H] tokens gathered per expert */
    float *moe_y;       /* [B*k_top][H] */
    float *router;      /* [B][E] router logits, then reused for 2E+1 expert counters */
    float *moe_prob;    /* [E] one token's router probabilities */
    int32_t *moe_sel;   /* [B][k_top] */
    float *moe_w;       /* [B][k_top] */
    int32_t *moe_order; /* [B*k_top] */
    int32_t *pos;       /* [B] positions */
    float *mtp_cat;     /* [B][2H] the MTP head's fc input: [normed embedding | normed hidden] */
} qd_cpu_scratch;

typedef struct qd_cpu_ctx {
    const qd_cpu_model *m;
    qd_backend_ctx_desc d;
    qd_err *err;
    qd_cpu_scratch s;
    void *scratch_block;
    float *row_logits;        /* [vocab] one row of logits (greedy ids without a logits buffer) */
    qd_gdn_span *gdn_spans;   /* [max_seqs] a GDN layer's recurrent spans, run in one call */
    size_t conv_floats, ssm_floats; /* per sequence slot, every GDN layer */
    float *conv;              /* [max_seqs][n_gdn][conv_dim][Kc-1] pre-conv inputs, oldest first */
    float *ssm;               /* [max_seqs][n_gdn][hv][dk][dv] fp32 recurrent state */
    float *kv_k, *kv_v;       /* [n_kv_blocks][n_attn][block_size][nkv][hd] keys (post-norm,
                               * post-RoPE) and values */
    int verify_states;        /* params.speculative_tokens + 1, or 0 */
    float *verify_conv;       /* [max_seqs][verify_states][conv_floats] state after each verify token */
    float *verify_ssm;        /* [max_seqs][verify_states][ssm_floats] */
    float *snap_pool;         /* [n_snap_slots][conv | ssm] snapshot slots; pages committed as
                               * slots are first written */
} qd_cpu_ctx;

static inline float *qd_cpu_seq_conv(const qd_cpu_ctx *c, int seq) { return c->conv + (size_t)seq * c->conv_floats; }
static inline float *qd_cpu_seq_ssm(const qd_cpu_ctx *c, int seq) { return c->ssm + (size_t)seq * c->ssm_floats; }
/* The state of every GDN layer after token i of seq's verify span. */
static inline float *qd_cpu_verify_conv(const qd_cpu_ctx *c, int seq, int i) {
    return c->verify_conv + ((size_t)seq * c->verify_states + i) * c->conv_floats;
}
static inline float *qd_cpu_verify_ssm(const qd_cpu_ctx *c, int seq, int i) {
    return c->verify_ssm + ((size_t)seq * c->verify_states + i) * c->ssm_floats;
}

/* Where position p of attention layer `attn_index` of a sequence with block table
 * `blocks` lives in kv_k (values at the same offset in kv_v); kvd = nkv * hd. */
static inline size_t qd_cpu_kv_offset(const qd_cpu_ctx *c, const int32_t *blocks, int attn_index, int p, int kvd) {
    const int bs = c->d.params.kv_block_size;
    return (size_t)blocks[p / bs] * c->d.kv_block_elems + ((size_t)attn_index * bs + (size_t)(p % bs)) * kvd;
}

/* y[n][rows] = x . W^T for the layers: in batch-invariant mode every row is summed in
 * one order whatever n (qd_matmul_item.fixed_order). */
static inline void qd_cpu_ctx_matmul(const qd_cpu_ctx *c, const qd_weight *w, const float *x, int64_t n, float *y) {
    qd_cpu_matmul_mode(c->m->pool, w, x, n, y, c->d.params.batch_invariant);
}

/* Layers over the packed rows of a ragged batch (x [n_rows][H] normed input, y the
 * block's output). */
qd_status qd_cpu_layer_gdn(qd_cpu_ctx *c, const qd_layer *L, const qd_step *st, const float *x, float *y);
qd_status qd_cpu_layer_attn(qd_cpu_ctx *c, const qd_layer *L, const qd_step *st, const float *x, float *y);
qd_status qd_cpu_layer_mlp(qd_cpu_ctx *c, const qd_mlp_weights *w, int n_rows, const float *x, float *y);
/* The MoE block restricted to the bound experts [w->expert0, +n_local_experts) (the
 * shared expert included): all of them unsplit, an expert-parallel rank's share of the
 * block's output otherwise. */
/* touched: the layer's row of qd_step.experts_touched, or NULL */
qd_status qd_cpu_layer_moe(qd_cpu_ctx *c, const qd_moe_weights *w, int n_rows, const float *x, float *y,
                           uint8_t *touched);
/* Top-k of one token's router logits [E] (fp32 softmax over all experts): sel [k] highest
 * first, ties to the lower index; wsel [k] their probabilities, renormalised to sum 1 when
 * renorm; prob [E] scratch. The reference the GPU routers are tested against. */
void qd_moe_route_token(const float *logits, int E, int k, int renorm, int32_t *sel, float *wsel, float *prob);

/* The forward of ranks[0..n) over one batch: the ranks' blocks run one after another,
 * and between blocks their partial outputs are summed in rank order (what an all-reduce
 * does across devices). n == 1 is the unsplit forward; rank 0 writes the logit rows. */
qd_status qd_cpu_forward_ranks(qd_cpu_ctx *const *ranks, int n, const qd_step *st, const qd_logit_out *out);

/* The MTP head over one batch (backend.h, qd_backend_ops.mtp_forward) on ranks[0..n):
 * its decoder layer sharded like the main layers, partial outputs summed in rank order
 * (cpu_forward.c says why sharded); n == 1 is the unsplit head, qd_cpu_mtp_forward. */
qd_status qd_cpu_mtp_forward_ranks(qd_cpu_ctx *const *ranks, int n, const qd_step *st, const float *hidden,
                                   const qd_logit_out *out);
qd_status qd_cpu_mtp_forward(void *bc, const qd_step *st, const float *hidden, const qd_logit_out *out);

/* The CPU backend's operations (cpu_backend.c), also used directly by the CPU split
 * backend on its ranks. */
extern const qd_backend_ops qd_cpu_ops;

#endif
