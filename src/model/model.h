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
    qd_backend_kind backend;
    struct qd_cuda_model *cuda; /* device weights (CUDA backend), else NULL */
    qd_safetensors *st;       /* NULL for dummy weights */
    qd_dtype dummy_dtype;     /* storage of dummy weights */
    qd_threadpool *pool;
    qd_weight embed;          /* [V][H] */
    qd_weight lm_head;        /* [V][H]; the embedding when tied */
    float *final_norm;        /* [H] zero-centred */
    qd_layer *layers;         /* [n_layers] */
    int n_gdn, n_attn;
    /* MoE experts [expert0, expert0 + n_local_experts) are bound: all of them, except on an
     * expert-parallel rank (src/parallel), whose other experts are zero-sized */
    int expert0, n_local_experts;
    /* tensor / expert parallel: the ranks' models (src/parallel/tp.h); this model then holds
     * the config and the checkpoint mapping, and no weights of its own */
    struct qd_tp_model *tp;
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
/* The slices of a sharding plan (src/parallel/shard.h) of the checkpoint whose config is c;
 * m->cfg is the plan's local config. */
struct qd_shard_plan;
qd_status qd_model_bind_checkpoint_plan(qd_model *m, const qd_config *c, const struct qd_shard_plan *p, qd_err *err);
/* Layer kinds and state indices from m->cfg (model.c). */
qd_status qd_model_init_layers(qd_model *m, qd_err *err);
qd_status qd_model_bind_dummy(qd_model *m, uint64_t seed, qd_dtype dtype, qd_err *err);
/* Parameter and byte counts from the bound weights. */
void qd_model_account(qd_model *m);

/* ---------------------------------------------------------------- context */

/* Per-sequence state. */
typedef struct qd_seq_state {
    int length;         /* tokens consumed */
    float *conv;        /* [n_gdn][conv_dim][Kc-1] pre-conv inputs, oldest first */
    float *ssm;         /* [n_gdn][hv][dk][dv] fp32 recurrent state */
    int32_t *blocks;    /* [max_blocks_per_seq] block table: position p lives in block blocks[p / block_size] */
    int n_blocks;       /* blocks held (covering at least `length` positions) */
} qd_seq_state;

/* Paged KV cache shared by the sequences of a context (kv_cache.c). A block holds
 * block_size positions of every attention layer: [n_attn][block_size][nkv][hd] keys
 * (post-norm, post-RoPE) in k, the values in v. Blocks are reference counted so that
 * two sequences may share a prefix (qd_seq_fork); a sequence about to write into a
 * shared, partly filled block gets a private copy first (copy on write). */
typedef struct qd_kv_pool {
    int block_size;           /* tokens per block */
    int n_blocks;             /* blocks in the pool (0 when the model has no attention layers) */
    int max_blocks_per_seq;   /* ceil(max_ctx / block_size) */
    size_t block_floats;      /* floats per block in k (and in v): n_attn * block_size * nkv * hd */
    float *k, *v;             /* [n_blocks][block_floats] */
    int32_t *ref;             /* [n_blocks] owners of each block; 0 = free */
    int32_t *free_ids;        /* [n_blocks] stack of free block ids */
    int n_free;
} qd_kv_pool;

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

/* What a forward hands back for its logit rows (qd_forward, qd_forward_greedy*,
 * qd_forward_mixed: one internal path for all of them, so that each backend has a
 * single place where rows leave the model). */
typedef struct qd_logit_out {
    float *logits;         /* [n_logit_rows][vocab_size], or NULL for none */
    const uint8_t *full;   /* the rows of `logits` wanted (NULL: all); the others may be written */
    int32_t *ids;          /* [n_logit_rows] argmax over [0, vocab_limit), or NULL */
    float *logprobs;       /* [n_logit_rows] that token's log-softmax over the same range, or NULL */
    int vocab_limit;       /* in [1, vocab_size] */
} qd_logit_out;

struct qd_context {
    qd_model *model;
    qd_context_params params;
    qd_err err;
    qd_seq_state *seqs;     /* [max_seqs] */
    qd_kv_pool kv;
    qd_span_rt *spans_rt;   /* [max_seqs] validated spans of the current forward */
    qd_gdn_span *gdn_spans; /* [max_seqs] a GDN layer's recurrent spans, run in one call */
    qd_scratch s;             /* CPU backend only */
    float *row_logits;        /* [vocab] one row of logits (qd_forward_greedy on the CPU) */
    void *scratch_block;
    float *snap_pool;         /* CPU backend: [n_snap_slots][conv | ssm] snapshot slots (snap_slots.c) */
    struct qd_cuda_ctx *cuda; /* device state and scratch (CUDA backend), else NULL */
    /* tensor parallel: the ranks' contexts (src/parallel/tp.h), which hold the state and the
     * KV contents; this context keeps the sequences' lengths and the one set of block tables */
    struct qd_tp_ctx *tp;
};

/* ------------------------------------------------------ KV blocks (kv_cache.c) */

qd_status qd_kv_pool_init(qd_context *ctx);  /* sizes the pool and block tables from ctx->params */
void qd_kv_pool_free(qd_context *ctx);
/* Blocks to take from the pool so that `seq` can append n_tokens (new blocks, plus
 * one copy when the partly filled last block is shared). 0 without attention layers. */
int qd_kv_blocks_needed(const qd_context *ctx, int seq, int n_tokens);
int qd_kv_free_blocks(const qd_context *ctx);
int qd_kv_total_blocks(const qd_context *ctx);
/* Blocks needed to hold n_tokens positions from scratch (admission planning). */
int qd_kv_blocks_for(const qd_context *ctx, int n_tokens);
/* Makes room for n_tokens more positions of `seq`: allocates blocks and un-shares the
 * last block if it is partly filled and shared. QD_ERR_CAPACITY when the pool lacks
 * blocks (nothing changes then). */
qd_status qd_kv_reserve(qd_context *ctx, int seq, int n_tokens);
/* Keeps the blocks covering the first n_tokens positions, returns the others. */
void qd_kv_truncate(qd_context *ctx, int seq, int n_tokens);
/* Where position p of attention layer `attn_index` of `seq` lives (keys; values at the
 * same offset in kv.v). The position must be covered by the seq's blocks. */
static inline size_t qd_kv_offset(const qd_context *ctx, int seq, int attn_index, int p, int kvd) {
    const qd_kv_pool *kv = &ctx->kv;
    int32_t b = ctx->seqs[seq].blocks[p / kv->block_size];
    return (size_t)b * kv->block_floats + ((size_t)attn_index * kv->block_size + (size_t)(p % kv->block_size)) * kvd;
}

/* y[n][rows] = x . W^T for the layers of a context's forward: in batch-invariant mode
 * every row is summed in one order whatever n (qd_matmul_item.fixed_order). */
static inline void qd_ctx_matmul(const qd_context *ctx, const qd_weight *w, const float *x, int64_t n, float *y) {
    qd_cpu_matmul_mode(ctx->model->pool, w, x, n, y, ctx->params.batch_invariant);
}

/* ------------------------------------------ sequence state snapshots (kv_cache.c) */

/* A host snapshot: int64 length, padding to QD_SNAP_HEADER bytes, conv floats, ssm floats. */
#define QD_SNAP_HEADER 64

/* GDN state (conv + recurrent, every GDN layer) and length of a sequence as a plain
 * copy: size in bytes of one snapshot. (A split model's snapshot holds each rank's
 * slice in rank order.) */
size_t qd_seq_state_size(const qd_context *ctx);
/* Sets a sequence's GDN state (conv [n_gdn][conv_dim][Kc-1], ssm [n_gdn][hv][dk][dv],
 * the snapshot layout) wherever the backend keeps it; NULL conv/ssm: zeros. A split
 * model's context takes only NULL (its state is per rank: use snapshots). */
qd_status qd_seq_state_write(qd_context *ctx, int seq, const float *conv, const float *ssm);
/* The same state read out, and copied from one sequence to another (a split model's
 * context: copy only). */
qd_status qd_seq_state_read(qd_context *ctx, int seq, float *conv, float *ssm);
qd_status qd_seq_state_copy(qd_context *ctx, int src, int dst);
/* Block dst's keys and values become a copy of block src's, wherever they live. */
qd_status qd_kv_copy_block(qd_context *ctx, int32_t dst, int32_t src);
qd_status qd_seq_state_save(qd_context *ctx, int seq, void *dst, size_t size);
/* Rolls `seq` back to a snapshot taken from it (or from a sequence it was forked
 * from) at a length <= its current length: the GDN state is copied back, the length
 * reset and the KV blocks past it returned. Attention KV is append-only, so the
 * positions before the snapshot's length are still those the snapshot saw. */
qd_status qd_seq_state_restore(qd_context *ctx, int seq, const void *src, size_t size);
/* dst becomes a copy of src: GDN state copied, KV blocks shared (reference counts
 * raised); dst's previous contents are released. */
qd_status qd_seq_fork(qd_context *ctx, int src, int dst);

/* Prefix cache support: take or drop one reference to a KV block (the cache holds
 * references to the blocks of the prefixes it keeps). */
void qd_kv_block_ref(qd_context *ctx, int32_t b);
void qd_kv_block_unref(qd_context *ctx, int32_t b);
/* `seq` (whatever it held is released) becomes the state of a snapshot taken from any
 * sequence, with that sequence's first n_blocks KV blocks shared (n_blocks must be
 * exactly the blocks covering the snapshot's length). */
qd_status qd_seq_state_attach(qd_context *ctx, int seq, const void *src, size_t size, const int32_t *blocks,
                              int n_blocks);
/* Floats of one sequence's conv state and recurrent state (every GDN layer): the
 * snapshot layout is conv then ssm, after a header on the host. */
size_t qd_state_conv_floats(const qd_context *ctx);
size_t qd_state_ssm_floats(const qd_context *ctx);
/* The block half of an attach: `seq` releases its blocks and takes a reference on
 * each of blocks[0..n_blocks) (exactly the blocks covering `length`), its length
 * becomes `length`. The GDN state is the caller's to set. */
qd_status qd_seq_attach_blocks(qd_context *ctx, int seq, int length, const int32_t *blocks, int n_blocks);

/* ------------------------------ snapshot slots in the backend's memory (snap_slots.c)
 *
 * The prefix cache's first tier: n_snap_slots GDN state snapshots held where the
 * state itself lives (device memory on a GPU, host memory on the CPU), so that taking
 * or restoring one is a copy inside that memory, queued on the context's stream with
 * no host synchronisation. Copies on the stream run in order, so a slot may be
 * overwritten right after a restore from it was queued. A slot holds conv then ssm
 * floats (the host snapshot layout without its header); its length is the caller's
 * to remember. */
int qd_snap_slots(const qd_context *ctx);
size_t qd_snap_slot_bytes(const qd_context *ctx);
/* Sizes and allocates the CPU backend's slots (a CUDA context carves them). */
qd_status qd_snap_pool_init(qd_context *ctx);
void qd_snap_pool_free(qd_context *ctx);
/* slot := the GDN state of seq. */
qd_status qd_snap_save(qd_context *ctx, int seq, int slot);
/* seq (whatever it held is released) := the slot's GDN state at `length` tokens, with
 * the KV blocks covering them shared as in qd_seq_state_attach. */
qd_status qd_snap_attach(qd_context *ctx, int seq, int slot, int length, const int32_t *blocks, int n_blocks);
/* The slot as a host snapshot of `length` tokens (qd_seq_state_size bytes, the format
 * of qd_seq_state_save, so qd_seq_state_attach restores it). Waits for the copy. */
qd_status qd_snap_to_host(qd_context *ctx, int slot, int length, void *dst, size_t size);
/* The state halves of attach and to_host, also what a split model's ranks run: seq's
 * GDN state := the slot's (blocks and length untouched); the slot's payload
 * (qd_snap_slot_bytes) to host memory. */
qd_status qd_snap_load_state(qd_context *ctx, int seq, int slot);
qd_status qd_snap_read_payload(qd_context *ctx, int slot, void *dst);

/* Layers: each runs over the packed rows of a ragged batch (src/layers). */
qd_status qd_layer_gdn_forward(qd_context *ctx, const qd_layer *L, const qd_span_rt *spans, int n_spans,
                               int n_rows, const float *x, float *y);
qd_status qd_layer_attn_forward(qd_context *ctx, const qd_layer *L, const qd_span_rt *spans, int n_spans,
                                int n_rows, const float *x, float *y);
qd_status qd_layer_mlp_forward(qd_context *ctx, const qd_mlp_weights *w, int n_rows, const float *x, float *y);
/* Top-k of one token's router logits [E] (fp32 softmax over all experts): sel [k] highest
 * first, ties to the lower index; wsel [k] their probabilities, renormalised to sum 1 when
 * renorm; prob [E] scratch. The reference the GPU routers are tested against. */
void qd_moe_route_token(const float *logits, int E, int k, int renorm, int32_t *sel, float *wsel, float *prob);
qd_status qd_layer_moe_forward(qd_context *ctx, const qd_moe_weights *w, int n_rows, const float *x, float *y);
/* The MoE block restricted to experts [e0, e1) (the shared expert included): an
 * expert-parallel rank's share of the block's output. */
qd_status qd_layer_moe_forward_experts(qd_context *ctx, const qd_moe_weights *w, int e0, int e1, int n_rows,
                                       const float *x, float *y);

/* qd_forward without its layer stack (forward.c), for the tensor-parallel forward: begin
 * validates the batch, reserves KV blocks, fills positions and embeds the tokens into
 * ctx->s.h; end advances the sequence lengths and writes the requested logits from
 * ctx->s.h (none when n_logit_rows is 0). */
qd_status qd_forward_begin(qd_context *ctx, const qd_span *spans, int n_spans, float *logits, int *n_rows,
                           int *n_logit_rows);
qd_status qd_forward_end(qd_context *ctx, const qd_span *spans, int n_spans, int n_logit_rows, float *logits);
/* The same for a rank of a split model's context (src/parallel/tp.c), which has validated
 * the batch and copied it (ctx->spans_rt) and the block tables in: begin fills positions
 * and embeddings, logits writes the requested logits / greedy ids from ctx->s.h; neither
 * touches the lengths. */
void qd_forward_rank_begin(qd_context *ctx, const qd_span *spans, int n_spans);
qd_status qd_forward_rank_logits(qd_context *ctx, const qd_span *spans, int n_spans, int n_logit_rows,
                                 const qd_logit_out *out);

#endif
