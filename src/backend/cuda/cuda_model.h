/* The CUDA backend of a model and a context: weights on the device (bf16 matrices,
 * fp32 vectors, laid out for the kernels), the state pool, the paged KV cache and
 * the scratch of one forward, all planned at creation so that a forward never
 * allocates. Host code in C; kernels behind cuda_ops.h, cuda_gdn.h, cuda_attn.h,
 * cuda_moe.h. */
#ifndef QD_CUDA_MODEL_H
#define QD_CUDA_MODEL_H

#include "backend/backend.h"
#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/cuda_gdn.h"
#include "backend/cuda/cuda_device.h"
#include "backend/cuda/cuda_quant.h"

/* Two-pass layout of one device allocation: with base NULL only the offset advances
 * (measuring); with base set, each take returns the next 256-byte aligned piece. */
typedef struct qd_cuda_carve {
    unsigned char *base;
    size_t off;
} qd_cuda_carve;

static inline void *qd_cuda_take(qd_cuda_carve *c, size_t bytes) {
    void *r = c->base ? c->base + c->off : NULL;
    c->off += (bytes + 255) / 256 * 256;
    return r;
}

/* A device matrix [rows][cols]: bf16 rows, or a quantized weight in its canonical layout
 * (cuda_quant.h: device pointers, F32 scales for F8_E4M3 / INT4) when q.data is set. */
typedef struct qd_cuda_mat {
    const uint16_t *bf16;
    qd_weight q;
    int64_t rows, cols;
} qd_cuda_mat;

static inline int qd_cuda_mat_quantized(const qd_cuda_mat *m) { return m->q.data != NULL; }

/* Several of the checkpoint's projections stacked by rows so that one call computes them
 * together: as one matrix when their formats allow (every part bf16, or one quantized
 * layout whose blocks do not straddle two parts), else up to QD_CUDA_MAX_PARTS parts,
 * part j giving rows [row0[j], row0[j] + part[j].rows) of the product. */
#define QD_CUDA_MAX_PARTS 4
typedef struct qd_cuda_stack {
    int n;
    qd_cuda_mat part[QD_CUDA_MAX_PARTS];
    int64_t row0[QD_CUDA_MAX_PARTS];
} qd_cuda_stack;

/* One layer's device weights. */
typedef struct qd_cuda_layer {
    float *input_norm, *post_norm;   /* [H] zero-centred */
    /* GDN */
    qd_cuda_stack gdn_in;            /* [conv_dim + value_dim + 2 hv][H]: in_qkv | in_z | in_b | in_a */
    float *conv_w;                   /* [conv_dim][K] */
    float *A_log, *dt_bias;          /* [hv] */
    float *gdn_norm;                 /* [dv] */
    qd_cuda_mat gdn_out;             /* [H][value_dim] */
    /* attention */
    qd_cuda_mat q, k, v, o;          /* q [nq*hd*(1+gate)][H], k/v [nkv*hd][H], o [H][nq*hd] */
    float *q_norm, *k_norm;          /* [hd] zero-centred */
    /* dense FFN, or the MoE's shared expert */
    qd_cuda_stack gate_up;           /* [2I][H]: gate rows then up rows */
    qd_cuda_mat down;                /* [H][I] */
    int I;
    /* the shared expert as the fused MoE block reads it when quantized (gate_up one part):
     * gate_proj, up_proj (2 matrices) and down_proj (1); n_mats 0 otherwise */
    qd_cuda_qmats sh_q_gate_up, sh_q_down;
    /* MoE */
    uint16_t *router;                /* [E (+1)][H] bf16: the router, then the shared expert's gate row
                                      * when there is one (one GEMV computes both) */
    int has_shared_gate;
    uint16_t *experts_gate_up;       /* [E][2 I_e][H] bf16 (an expert-parallel rank: its E_local experts) */
    uint16_t *experts_down;          /* [E][H][I_e] bf16 */
    /* or, quantized (experts_* NULL): 2E matrices [I_e][H] and E matrices [H][I_e] (cuda_quant.h) */
    qd_cuda_qmats q_experts_gate_up, q_experts_down;
} qd_cuda_layer;

/* The MTP head's device weights (backend.h qd_mtp_weights). */
typedef struct qd_cuda_mtp {
    float *pre_fc_norm_embedding;    /* [H] zero-centred */
    float *pre_fc_norm_hidden;       /* [H] zero-centred */
    qd_cuda_mat fc;                  /* [H][2H]: columns [0, H) the normed embedding, [H, 2H) the normed hidden */
    qd_cuda_layer layer;             /* full attention (KV layer n_attn) + the family's FFN */
    qd_ffn_kind ffn_kind;            /* of that layer (a split rank's host weights are dropped) */
    float *norm;                     /* [H] zero-centred, before the shared LM head */
} qd_cuda_mtp;

typedef struct qd_cuda_model {
    const qd_config *cfg;
    const qd_weights *w;             /* the host weights it was made from: the forward reads the
                                      * layers' kinds and state indices (weights may be dropped) */
    int device;
    uint16_t *embed;                 /* [V][H] */
    uint16_t *lm_head;               /* [V][H] (the embedding when tied) */
    float *final_norm;               /* [H] */
    qd_cuda_layer *layers;           /* [n_layers] host array of device pointers */
    qd_cuda_mtp *mtp;                /* the MTP head, or NULL when the weights have none */
    int expert0, n_experts_local;    /* the experts on the device: all, or an expert-parallel
                                      * rank's [expert0, expert0 + n_experts_local) */
    void *arena;                     /* one device allocation holding every weight */
    size_t bytes;
    int64_t max_dequant_elems;       /* the largest quantized dense matrix (rows x cols): the bf16
                                      * scratch its prefill products dequantize into */
    int quantized_experts;           /* some layer's experts are quantized (the prefill path may
                                      * dequantize a layer's experts into context scratch, where
                                      * its fused kernels do not take them) */
    char device_name[128];
} qd_cuda_model;

/* Uploads the bound weights (checkpoint, or dummy weights generated on the device) to
 * the calling thread's current device. */
qd_status qd_cuda_model_create(const qd_backend_model_desc *d, void **out, qd_err *err);
void qd_cuda_model_free(void *bm);
/* The prefill scratch a context of up to B rows a step needs for the model's quantized dense
 * matrices (a step of more rows than the quantized GEMV takes): the largest (rows x cols)
 * that is dequantized to bf16, and the most bytes a product of B rows on the FP8 GEMM takes
 * (qd_cuda_fp8_act_bytes, the maximum over the matrices: the bytes do not grow with rows
 * and cols alone, the staged output's share rounds with both). */
void qd_cuda_model_prefill_extents(const qd_cuda_model *cm, int64_t B, int64_t *dequant_elems,
                                   size_t *fp8_act_bytes);

/* Tokens of a verify span at most (params.speculative_tokens + 1 <= 5). */
#define QD_CUDA_MAX_VERIFY 8

/* Step metadata built on the host and copied to the device in one transfer. */
typedef struct qd_cuda_step {
    int n_rows, n_spans, n_pre_spans, n_pre_rows, n_dec, n_logit;
    int n_ver, n_ver_rows;           /* verify spans (after the prefill spans, before the decodes) and their rows */
    int ver_count[QD_CUDA_MAX_VERIFY]; /* host only: verify spans with more than t rows (they come first) */
    int n_hidden_all;                /* rows of all_rows (host only) */
    int32_t *tokens;      /* [max_batch] in internal row order (prefill spans, verify spans, then decodes) */
    int32_t *row_span;    /* [max_batch] span index of each row */
    int32_t *row_pos;     /* [max_batch] position of each row */
    int32_t *spans;       /* [max_seqs][4] first row, rows, first position, state slot */
    int32_t *attn_spans;  /* [max_seqs][4] the same with the slot replaced by the span index (block table row) */
    int32_t *dec_slots;   /* [max_seqs] state slots of the decode spans, in row order */
    int32_t *logit_rows;  /* [max_batch] internal row of each logit row, in the caller's order */
    int32_t *cu_seqlens;  /* [max_seqs + 1] prefill spans' token offsets (host only) */
    int32_t *pre_slots;   /* [max_seqs] state slots of the prefill spans */
    int32_t *ver;         /* [max_seqs][4] verify spans, longest first: first row, rows, main slot, first verify slot */
    int32_t *ver_rows;    /* [QD_CUDA_MAX_VERIFY][max_seqs] row of token t of each verify span with more than t rows */
    int32_t *ver_in;      /* [QD_CUDA_MAX_VERIFY][max_seqs] the state slot token t reads */
    int32_t *ver_out;     /* [QD_CUDA_MAX_VERIFY][max_seqs] the state slot it writes (the main one for the last token) */
    int32_t *caller_row;  /* [max_batch] the caller's row (span order) of each internal row */
    int32_t *all_rows;    /* [max_batch] internal rows whose final-normed hidden state a step hands back whole
                           * (qd_logit_out.hidden_all), in the caller's span order */
    int32_t *tables;      /* [max_seqs][max_blocks_per_seq] block tables of the spans, by span index */
} qd_cuda_step;

/* Rows of the router weights as uploaded (E experts, the shared expert's gate, then zero
 * rows) and the row stride of their logits: a multiple of 8, so that the split router's
 * cuBLAS products run aligned Hopper kernels. With 257 rows cuBLAS chose an sm_75 kernel of
 * 1-element alignment, 4.4x slower at 8,192 tokens (bench/RESULTS.md session 27). */
#define QD_CUDA_ROUTER_LD(E) (((E) + 1 + 7) / 8 * 8)

typedef struct qd_cuda_ctx {
    const qd_cuda_model *cm;
    const qd_config *cfg;
    qd_backend_ctx_desc d;           /* the limits it was planned for */
    qd_err *err;
    int n_gdn;
    void *stream;
    qd_cuda_blas *blas;
    /* state pool: layer-major so that one layer's states form a slot-indexed pool of
     * pool_slots slots: the sequences' own (slot = sequence), then with speculation
     * verify_states per sequence (slot max_seqs + seq * verify_states + t: the state after
     * token t of its last verify span, kept until verify_keep picks one) */
    float *conv;                     /* [n_gdn][pool_slots][conv_dim][K-1] */
    float *ssm;                      /* [n_gdn][pool_slots][hv][dk][dv] */
    size_t conv_slot, ssm_slot;      /* floats per slot of one layer */
    int pool_slots, verify_states;
    int32_t *ver_T;                  /* [max_seqs] host: rows of each sequence's last verify span (0: none) */
    uint16_t *mtp_cat;               /* [B][2H] the MTP fc's input (params.mtp), or NULL */
    float *snap;                     /* [n_snap_slots][n_gdn conv_slot | n_gdn ssm_slot] prefix-cache snapshots */
    uint16_t *kv_k, *kv_v;           /* [n_blocks][n_attn][block_size][nkv][hd] bf16 */
    /* scratch of one forward (max_batch rows) */
    float *h, *y, *ys;               /* [B][H] */
    uint16_t *x;                     /* [B][H] normed activations, bf16 */
    float *xf;                       /* [B][H] the same in fp32 (MoE router input), or in its room
                                        [B][2 H] bf16 the row's mid and low parts (add_rmsnorm_split) */
    float *proj;                     /* [B][max projection width] */
    float *proj2, *proj3;            /* [B][kvd] attention k and v */
    uint16_t *q, *k, *v;             /* [B][key_dim] / [B][value_dim] GDN inputs, or attention q */
    float *g, *beta;                 /* [B][hv] */
    uint16_t *o, *u;                 /* [B][max(value_dim, nq*hd)] */
    float *ffn;                      /* [B][2 max(I, I_s)] gate|up */
    uint16_t *wdq;                   /* bf16: a quantized matrix for a prefill product (every one in
                                      * batch-invariant mode, else those the FP8 GEMM does not take),
                                      * or NULL when none needs it */
    void *fp8_act;                   /* the FP8 GEMM's quantized activations (qd_cuda_fp8_act_bytes), or NULL */
    size_t fp8_act_bytes;
    uint16_t *moe_dq;                /* a layer's quantized experts as bf16 (qd_cuda_moe_dequant_bytes), or NULL
                                      * where no step dequantizes them (qd_cuda_moe_dequant_needed) */
    uint16_t *act;                   /* [B][max(I, I_s)] */
    float *router;                   /* [B][QD_CUDA_ROUTER_LD(E)] router logits | shared-expert gate logit */
    int32_t *sel;                    /* [B][k] */
    int32_t *route_cnt;              /* [B] the fused MoE router's per-token block counters, kept zero */
    float *selw;                     /* [B][k] */
    float *logits;                   /* [B][V] */
    int32_t *ids;                    /* [B] argmax */
    float *lp;                       /* [B] its log-softmax */
    void *attn_work, *moe_work;
    uint8_t *experts_touched;        /* [n_layers][E] the step's routing marks when it counts them
                                      * (qd_step.experts_touched), else unused; NULL for dense models */
    int count_experts;               /* this step marks them */
    /* metadata: one pinned host block mirrored by one device block */
    void *meta_host, *meta_dev;
    size_t meta_bytes;
    qd_cuda_step host, dev;          /* views into meta_host and meta_dev */
    int32_t *ids_host;               /* [B] pinned */
    float *lp_host;                  /* [B] pinned */
    struct qd_cuda_allow *allow;     /* the argmax's allow masks, one chunk of logit rows at a
                                      * time (cuda_allow.c) */
    /* a split model's rank (d.reduce, backend.h): the hook sums a block's partial output
     * over the ranks; a rank other than the first never computes logits, so its decode
     * steps are captured in graphs keyed by batch size alone, like rank 0's */
    qd_status (*reduce)(void *user, float *d_y, int n_rows, void *stream);
    void *reduce_user;
    int never_logits;
    int invariant;                   /* batch-invariant mode (qd_context_params.batch_invariant) */
    /* GDN chunk plan: scratch reserved at creation for max_batch tokens, set per prefill step */
    qd_cuda_gdn_plan plan;
    /* CUDA graphs of the steps whose launches depend on their shape alone (cuda_forward.c
     * step_graph), [kind][n_spans]: kind 0 decode steps of the main model, 1 the MTP head's
     * one-token steps, T (2 .. verify_states) uniform verify steps of T tokens a span */
    void **graphs;                   /* [n_graph_kinds][max_seqs + 1] */
    int mtp_graph_rows;              /* the LM head rows the MTP graphs compute (0: none captured) */
    int n_graph_kinds;               /* verify_states + 1, at least 2 */
    size_t bytes;                    /* device bytes held by the context */
} qd_cuda_ctx;

/* Kernel table for the prefill spans of a GDN layer: the chunked tensor-core
 * kernel takes head dims that are multiples of 16 up to 256 (every released
 * model: 128); other shapes (small test models) step the decode kernel through
 * each span token by token, which computes the same recurrence. */
static inline int qd_cuda_gdn_chunked_supported(const qd_config *c) {
    return c->gdn_dk % 16 == 0 && c->gdn_dv % 16 == 0 && c->gdn_dk <= 256 && c->gdn_dv <= 256;
}

qd_status qd_cuda_ctx_create(void *bm, const qd_backend_ctx_desc *d, void **out, qd_err *err);
void qd_cuda_ctx_free(void *bc);
/* Rows of logits computed per lm_head pass (bounds the [rows][V] fp32 scratch). */
int qd_cuda_logit_chunk(const qd_cuda_ctx *g);

/* The allow masks of the argmax (qd_logit_out.allow): device and pinned staging room for
 * one chunk of logit rows (qd_cuda_logit_chunk) with a mask each, made with the context
 * (8 MiB each for 256 rows of a 248k vocabulary: 1/32 of the logits chunk). */
qd_status qd_cuda_allow_create(qd_cuda_ctx *g, qd_err *err);
void qd_cuda_allow_free(qd_cuda_ctx *g);
/* Queues the upload of the masks of logit rows [r0, r0 + nr) (one chunk) on the stream
 * and points *d_masks / *d_rows at them for qd_cuda_argmax; both NULL when none of those
 * rows is masked (nothing travels). The staging block is reused by the next chunk, which
 * the forward uploads only after a stream sync. */
qd_status qd_cuda_allow_upload(qd_cuda_ctx *g, const qd_logit_out *out, int r0, int nr, const uint32_t **d_masks,
                               const int32_t **d_rows);

/* The forward of a validated batch (backend.h). Fills `out`: the argmax and its
 * log-softmax of every logit row on the device, and copies off it only the logits rows
 * asked for. */
qd_status qd_cuda_forward(void *bc, const qd_step *st, const qd_logit_out *out);

/* The state operations of backend.h: a sequence slot's payload (conv then ssm floats
 * of every GDN layer), copies between slots and of KV blocks; snapshot save and load
 * are device-to-device copies queued on the context's stream, without waiting; read
 * copies a slot to the host and waits for it. */
size_t qd_cuda_state_bytes(void *bc);
qd_status qd_cuda_state_read(void *bc, int seq, void *dst);
qd_status qd_cuda_state_write(void *bc, int seq, const void *src);
qd_status qd_cuda_state_copy(void *bc, int src, int dst);
qd_status qd_cuda_kv_copy_block(void *bc, int32_t dst, int32_t src);
qd_status qd_cuda_snap_save(void *bc, int seq, int slot);
qd_status qd_cuda_snap_load(void *bc, int seq, int slot);
qd_status qd_cuda_snap_read(void *bc, int slot, void *dst);
/* backend.h verify_keep: the verify slots' state after token `index` of the sequence's last
 * verify span becomes its own (queued on the stream). */
qd_status qd_cuda_verify_keep(void *bc, int seq, int index);
/* backend.h mtp_forward (cuda_forward.c). */
qd_status qd_cuda_mtp_forward(void *bc, const qd_step *st, const float *hidden, const qd_logit_out *out);

/* The CUDA backend's table (cuda_backend.c), which the CUDA split backend's ranks use. */
extern const qd_backend_ops qd_cuda_ops;

#endif
