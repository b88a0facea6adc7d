/* The backend interface: the one set of operations every backend implements (the CPU
 * reference, CUDA, and a split model that wraps rank backends), and the data a backend
 * is handed. src/model and src/runtime reach backends only through this header; a new
 * backend is a new folder with one qd_backend_ops and a line in registry.c.
 *
 * A backend never sees the model or context objects of the public API: it gets the
 * config and the bound host weights when its model is made, the context's limits when
 * its context is made, and per forward the validated batch with the sequences' block
 * tables (the model layer owns the tables and the block pool's reference counts; a
 * backend owns the contents of the blocks and the GDN state of every sequence slot). */
#ifndef QD_BACKEND_BACKEND_H
#define QD_BACKEND_BACKEND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/err.h"
#include "base/threadpool.h"
#include "base/weight.h"
#include "io/config.h"
#include "qdelta.h"

/* ------------------------------------------------------------------ weights */

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

/* The MTP head (spec 7.2): one extra decoder layer that drafts token p+2 from the main
 * model's final-normed hidden state at p and the token at p+1. It shares the main
 * model's embedding and LM head. Its attention keeps its own keys and values in the
 * main KV blocks, as attention layer n_attn (the layer's state_index), so the model
 * layer's block tables, prefix sharing and rollback cover it with no bookkeeping of its
 * own; a context reserves that extra layer only when created with params.mtp. */
typedef struct qd_mtp_weights {
    float *pre_fc_norm_embedding; /* [H] zero-centred */
    float *pre_fc_norm_hidden;    /* [H] zero-centred */
    qd_weight fc;                 /* [H][2H]: columns [0, H) take the normed embedding, [H, 2H) the normed hidden */
    qd_layer layer;               /* full attention + the family's FFN; state_index = n_attn */
    float *norm;                  /* [H] zero-centred, before the shared LM head */
} qd_mtp_weights;

/* Every weight of a model (or of one rank of a split model), as bound on the host. */
typedef struct qd_weights {
    qd_weight embed;          /* [V][H] */
    qd_weight lm_head;        /* [V][H]; the embedding when tied */
    float *final_norm;        /* [H] zero-centred */
    qd_layer *layers;         /* [n_layers] */
    int n_gdn, n_attn;
    /* MoE experts [expert0, expert0 + n_local_experts) are bound: all of them, except on an
     * expert-parallel rank, whose other experts are zero-sized */
    int expert0, n_local_experts;
    qd_mtp_weights *mtp;      /* NULL: no (complete) MTP head in the checkpoint */
} qd_weights;

/* Floats of one sequence's GDN state: conv [n_gdn][conv_dim][Kc-1] then recurrent
 * [n_gdn][hv][dk][dv] (the snapshot payload of an unsplit backend). */
static inline size_t qd_state_conv_floats(const qd_config *c, int n_gdn) {
    return (size_t)n_gdn * (size_t)qd_config_conv_dim(c) * (size_t)(c->gdn_conv_kernel - 1);
}
static inline size_t qd_state_ssm_floats(const qd_config *c, int n_gdn) {
    return (size_t)n_gdn * (size_t)c->gdn_hv * (size_t)c->gdn_dk * (size_t)c->gdn_dv;
}

/* ------------------------------------------------------------ the batch */

/* One span after validation, with its offset in the packed token rows. */
typedef struct qd_span_rt {
    int seq;
    int row0;           /* first row in the packed batch */
    int T;
    int pos0;           /* sequence length before this span */
} qd_span_rt;

/* A sequence as the model layer keeps it: length and KV block table. Position p of
 * attention layer a lives in block blocks[p / block_size], at row (a * block_size +
 * p % block_size) of that block. */
typedef struct qd_seq_blocks {
    int length;         /* tokens consumed */
    int32_t *blocks;    /* [max_blocks_per_seq] */
    int n_blocks;       /* blocks held (covering at least `length` positions) */
    int verify_pos0, verify_T; /* the last forward's verify span of this sequence (T 0: none,
                                * or accepted since) */
    int mtp_length;     /* positions of the MTP layer's KV written (<= length; the MTP
                         * layer at position p reads the main hidden state at p) */
} qd_seq_blocks;

/* One forward's batch: validated, its KV blocks reserved. */
typedef struct qd_step {
    const qd_span *spans;        /* [n_spans] the caller's spans (tokens, logit modes) */
    const qd_span_rt *rt;        /* [n_spans] */
    int n_spans, n_rows, n_logit_rows;
    const qd_seq_blocks *seqs;   /* [max_seqs] lengths before the step, block tables */
    const uint8_t *verify;       /* [n_spans] 1 = a verify span (keeps per-token states), or NULL */
    bool no_graph;               /* run this step eagerly (a split rank follows rank 0's choice) */
    /* [n_layers][n_experts] host bytes, or NULL: the backend sets [L][e] = 1 for every
     * expert e that MoE layer L's routing selected for some row of the step (a backend
     * with counts_experts; the model layer clears it before the step) */
    uint8_t *experts_touched;
} qd_step;

/* What a forward hands back for its logit rows (in the spans' order: every row of a
 * QD_LOGITS_ALL span, the last of a QD_LOGITS_LAST one). */
typedef struct qd_logit_out {
    float *logits;         /* [n_logit_rows][vocab_size], or NULL for none */
    const uint8_t *full;   /* the rows of `logits` wanted (NULL: all); the others may be written */
    int32_t *ids;          /* [n_logit_rows] argmax over [0, vocab_limit), or NULL */
    float *logprobs;       /* [n_logit_rows] that token's log-softmax over the same range, or NULL */
    int vocab_limit;       /* in [1, vocab_size] */
    float *hidden;         /* [n_logit_rows][H] each logit row's hidden state after the final
                            * norm (the MTP head's input), or NULL */
    /* [n_spans] or NULL: spans i with hidden_all[i] write the final-normed hidden state of
     * every one of their rows, in span order, to all_hidden [sum of their T][H] (the MTP
     * head's inputs over a prefill chunk, without that chunk's logit rows). A backend
     * without mtp_forward never gets it (the model layer refuses). */
    const uint8_t *hidden_all;
    float *all_hidden;
    /* Validated allow masks (qd_forward_args): allow_row [n_logit_rows] an index into
     * allow [n_allow][qd_allow_words(vocab_size)] or -1, or allow_row NULL for none. A
     * masked row's ids and logprobs are taken over the ids below vocab_limit its mask
     * allows; with none above -inf its id is -1 and its logprob -inf. Only with ids. */
    const uint32_t *allow;
    int n_allow;
    const int32_t *allow_row;
} qd_logit_out;

/* Words of one allow mask over a vocabulary of V ids. */
static inline size_t qd_allow_words(int V) { return ((size_t)V + 31) / 32; }
/* Logit row r's allow mask, or NULL when it has none. */
static inline const uint32_t *qd_logit_allow(const qd_logit_out *out, int r, int V) {
    if (!out->allow_row || out->allow_row[r] < 0) return NULL;
    return out->allow + (size_t)out->allow_row[r] * qd_allow_words(V);
}

/* --------------------------------------------------------- descriptions */

typedef struct qd_backend_ops qd_backend_ops;

#define QD_SPLIT_MAX 8 /* ranks of a split model: the GPUs of one node */

/* What a backend model is made from. The weights, config and pool outlive it. */
typedef struct qd_backend_model_desc qd_backend_model_desc;
struct qd_backend_model_desc {
    const qd_config *cfg;        /* the model's (for a split rank: the rank's local) config */
    const qd_weights *w;
    qd_threadpool *pool;
    int device;                  /* the GPU (a split rank's); ignored by the CPU */
    /* a split model: n_ranks rank models of rank_ops, ranks[r] describing rank r */
    int n_ranks;
    const qd_backend_model_desc *ranks;
    const qd_backend_ops *rank_ops;
    bool expert_parallel;
    int tp_devices;              /* qd_model_params.tp_devices */
};

/* The limits a backend context is planned for (memory planned at creation; an error
 * naming the sizes when it does not fit). */
typedef struct qd_backend_ctx_desc {
    qd_context_params params;    /* settled: kv_block_size and n_kv_blocks filled in */
    int max_blocks_per_seq;
    int n_kv_blocks;             /* blocks of the pool; 0 without attention layers */
    size_t kv_block_elems;       /* elements of one block's keys (and of its values):
                                  * n_attn * block_size * nkv * hd */
    qd_err *err;                 /* where the context's operations report */
    /* A split model's rank: after out_proj, o_proj, down_proj and the MoE block the
     * block's partial output y [n_rows][H] (in the backend's memory) is summed over the
     * ranks in place by reduce(reduce_user, y, n_rows, stream), then joins the residual;
     * a rank other than the first never computes logits. NULL reduce: unsplit. */
    qd_status (*reduce)(void *user, float *y, int n_rows, void *stream);
    void *reduce_user;
    bool never_logits;
} qd_backend_ctx_desc;

/* ------------------------------------------------------------- operations */

struct qd_backend_ops {
    const char *name;
    int kv_elem_bytes;           /* bytes of one cached key or value element */
    bool copies_weights;         /* model_create copies the weights into the backend's own
                                  * memory: the host weights may be dropped afterwards */
    bool draws_dummy_weights;    /* dummy weights are drawn by model_create from each weight's
                                  * dummy_seed / dummy_scale: bind them without data */
    bool quantized_weights;      /* model_create takes F8_E4M3 / NVFP4 / INT4 weights (weight.h);
                                  * a model holding one is refused by a backend without it */
    bool counts_experts;         /* forward fills qd_step.experts_touched */

    /* Copy bandwidth of the memory weights stream from (GB/s, read + write), best of
     * several copies of `bytes`. */
    qd_status (*copy_gbps)(size_t bytes, int n_threads, double *gbps, qd_err *err);
    /* The device the contexts take memory from: its name, free and total bytes. */
    qd_status (*device_info)(qd_device_info *out, qd_err *err);

    qd_status (*model_create)(const qd_backend_model_desc *d, void **out, qd_err *err);
    void (*model_free)(void *bm);
    /* Contexts made after this time their all-reduces (split models; NULL elsewhere). */
    void (*set_comm_timing)(void *bm, bool on);

    qd_status (*ctx_create)(void *bm, const qd_backend_ctx_desc *d, void **out, qd_err *err);
    void (*ctx_free)(void *bc);

    /* The layers and the logit rows of a validated batch. The sequences' lengths are the
     * caller's to advance. */
    qd_status (*forward)(void *bc, const qd_step *st, const qd_logit_out *out);

    /* One sequence slot's GDN state as a flat payload of state_bytes bytes (an unsplit
     * backend: conv then recurrent floats; a split one: each rank's in rank order);
     * write with src NULL sets zeros. */
    size_t (*state_bytes)(void *bc);
    qd_status (*state_read)(void *bc, int seq, void *dst);
    qd_status (*state_write)(void *bc, int seq, const void *src);
    qd_status (*state_copy)(void *bc, int src, int dst);
    /* KV block dst := block src (copy on write of a shared block). */
    qd_status (*kv_copy_block)(void *bc, int32_t dst, int32_t src);
    /* Snapshot slots (params.n_snap_slots of state_bytes each) in the memory the state
     * lives in: save and load are copies queued in order with the forwards, read copies
     * a slot's payload to host memory and waits for it. */
    qd_status (*snap_save)(void *bc, int seq, int slot);
    qd_status (*snap_load)(void *bc, int seq, int slot);
    qd_status (*snap_read)(void *bc, int slot, void *dst);
    /* A span with st->verify[i] (at most params.speculative_tokens + 1 tokens) keeps the
     * GDN conv and recurrent state after each of its tokens; verify_keep makes the state
     * after token `index` of the sequence's last verify span its state (the rollback of a
     * rejected draft). Each row's outputs equal those of feeding the tokens one at a time (bit for bit
     * in batch-invariant mode).
     * NULL: the backend has no verify spans (the model layer refuses them). */
    qd_status (*verify_keep)(void *bc, int seq, int index);
    /* The MTP head over a validated batch (NULL: this backend has none, and the model
     * layer refuses speculation). Row r of the step takes the embedding of its token and
     * hidden[r] ([n_rows][H], a main forward's qd_logit_out.hidden or a previous MTP
     * step's), at the positions of st->rt (pos0 = the sequence's mtp_length), writing
     * and attending over the MTP layer's KV (attention layer n_attn of the blocks). The
     * logit rows are the MTP's draft logits; out->hidden gets h' after the MTP norm (the
     * next draft step's hidden input). */
    qd_status (*mtp_forward)(void *bc, const qd_step *st, const float *hidden, const qd_logit_out *out);
    /* Device time the last forward spent in all-reduces (split models; NULL elsewhere). */
    qd_status (*comm_time)(void *bc, double *ms, int *count);
};

/* ------------------------------------------------------------- registry */

/* The backend of a kind, unsplit or split over ranks; NULL with a message in err when
 * this build or machine has none (no CUDA compiler at build time, no GPU). */
const qd_backend_ops *qd_backend_find(qd_backend_kind kind, bool split, qd_err *err);

/* Each backend's table, defined in its folder (registry.c picks among them). A backend
 * that is not compiled in defines its entry to return NULL with the reason. */
const qd_backend_ops *qd_backend_cpu(qd_err *err);
const qd_backend_ops *qd_backend_cuda(qd_err *err);
const qd_backend_ops *qd_backend_split_cpu(qd_err *err);
const qd_backend_ops *qd_backend_split_cuda(qd_err *err);

#endif
