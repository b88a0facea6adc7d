/* The hybrid model: config, per-layer weights, and the per-sequence state a context holds.
 * Weights point into the mmapped checkpoint where they are used as stored, or into
 * buffers the model owns (de-interleaved Qwen3-Next projections, dummy weights,
 * fp32 copies of small vectors). */
#ifndef QD_MODEL_MODEL_H
#define QD_MODEL_MODEL_H

#include <stdint.h>

#include "backend/cpu/cpu_ops.h"
#include "base/err.h"
#include "base/threadpool.h"
#include "io/config.h"
#include "io/generation_config.h"
#include "io/safetensors.h"
#include "qdelta.h"

/* Gated DeltaNet layer weights, in the logical (de-interleaved) layout of spec 3.2. */
typedef struct qd_gdn_weights {
    qd_weight in_qkv;   /* [conv_dim][H]: rows [q_0..q_{hk-1} | k_0.. | v_0..v_{hv-1}] */
    qd_weight in_z;     /* [value_dim][H] */
    qd_weight in_b;     /* [hv][H] */
    qd_weight in_a;     /* [hv][H] */
    float *conv_w;      /* [conv_dim][Kc] */
    float *A_log;       /* [hv] */
    float *dt_bias;     /* [hv] */
    float *norm_w;      /* [dv] plain gated-norm weight (used as is, no +1) */
    qd_weight out;      /* [H][value_dim] */
} qd_gdn_weights;

/* Gated full attention. q_proj rows are per head [q (hd) | gate (hd)]. */
typedef struct qd_attn_weights {
    qd_weight q;        /* [nq*hd*(gate?2:1)][H] */
    qd_weight k;        /* [nkv*hd][H] */
    qd_weight v;        /* [nkv*hd][H] */
    qd_weight o;        /* [H][nq*hd] */
    float *q_norm;      /* [hd] zero-centred */
    float *k_norm;      /* [hd] zero-centred */
} qd_attn_weights;

typedef struct qd_mlp_weights { /* SwiGLU: down(silu(gate x) * up x) */
    qd_weight gate;     /* [I][H] */
    qd_weight up;       /* [I][H] */
    qd_weight down;     /* [H][I] */
} qd_mlp_weights;

typedef struct qd_moe_weights {
    qd_weight router;          /* [E][H] */
    qd_mlp_weights *experts;   /* [E] views (fused gate_up split into gate and up) */
    int has_shared;
    qd_mlp_weights shared;     /* I_s wide */
    qd_weight shared_gate;     /* [1][H] */
} qd_moe_weights;

typedef struct qd_layer {
    qd_layer_kind kind;
    qd_ffn_kind ffn_kind;
    float *input_norm;  /* [H] zero-centred */
    float *post_norm;   /* [H] zero-centred */
    qd_gdn_weights gdn;
    qd_attn_weights attn;
    qd_mlp_weights mlp;
    qd_moe_weights moe;
    int state_index;    /* index among GDN layers (conv/recurrent state) or attention layers (KV) */
} qd_layer;

struct qd_model {
    qd_config cfg;
    qd_generation_config gen;
    int32_t eos_ids[QD_MAX_EOS];  /* from gen, else cfg */
    int n_eos;
    qd_err err;
    qd_safetensors *st;       /* NULL for dummy weights */
    qd_dtype dummy_dtype;     /* storage of dummy weights */
    qd_threadpool *pool;
    qd_weight embed;          /* [V][H] */
    qd_weight lm_head;        /* [V][H]; the embedding when tied */
    float *final_norm;        /* [H] zero-centred */
    qd_layer *layers;         /* [n_layers] */
    int n_gdn, n_attn;
    /* every buffer the model owns, freed with it */
    void **owned;
    int n_owned, cap_owned;
    int64_t n_params;
    int64_t weight_bytes;
    int64_t active_weight_bytes;
    char describe[512];
};

/* Records a buffer to free with the model. Returns p, or NULL (and frees p) on OOM. */
void *qd_model_own(qd_model *m, void *p);
/* Allocates an owned, 64-byte aligned buffer; NULL on OOM. */
void *qd_model_alloc(qd_model *m, size_t bytes);

/* Fills the weights from the checkpoint (model_load.c) or at random (model_dummy.c). */
qd_status qd_model_bind_checkpoint(qd_model *m, qd_err *err);
qd_status qd_model_bind_dummy(qd_model *m, uint64_t seed, qd_dtype dtype, qd_err *err);
/* Parameter and byte counts from the bound weights. */
void qd_model_account(qd_model *m);

/* ---------------------------------------------------------------- context */

/* Per-sequence state. */
typedef struct qd_seq_state {
    int length;         /* tokens consumed */
    float *conv;        /* [n_gdn][conv_dim][Kc-1] pre-conv inputs, oldest first */
    float *ssm;         /* [n_gdn][hv][dk][dv] fp32 recurrent state */
    float *k_cache;     /* [n_attn][max_ctx][nkv][hd] post-norm, post-RoPE keys */
    float *v_cache;     /* [n_attn][max_ctx][nkv][hd] */
} qd_seq_state;

/* Scratch for one forward over at most max_batch tokens, planned at creation. */
typedef struct qd_scratch {
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
} qd_scratch;

/* One span after validation, with its offset in the packed token rows. */
typedef struct qd_span_rt {
    int seq;
    int row0;           /* first row in the packed batch */
    int T;
    int pos0;           /* sequence length before this span */
} qd_span_rt;

struct qd_context {
    qd_model *model;
    qd_context_params params;
    qd_err err;
    qd_seq_state *seqs;     /* [max_seqs] */
    qd_span_rt *spans_rt;   /* [max_seqs] validated spans of the current forward */
    qd_scratch s;
    void *scratch_block;
};

/* Layers: each runs over the packed rows of a ragged batch (src/layers). */
qd_status qd_layer_gdn_forward(qd_context *ctx, const qd_layer *L, const qd_span_rt *spans, int n_spans,
                               int n_rows, const float *x, float *y);
qd_status qd_layer_attn_forward(qd_context *ctx, const qd_layer *L, const qd_span_rt *spans, int n_spans,
                                int n_rows, const float *x, float *y);
qd_status qd_layer_mlp_forward(qd_context *ctx, const qd_mlp_weights *w, int n_rows, const float *x, float *y);
qd_status qd_layer_moe_forward(qd_context *ctx, const qd_moe_weights *w, int n_rows, const float *x, float *y);

#endif
