/*
 * qdelta: inference engine for hybrid Gated DeltaNet models
 * (Qwen3-Next `qwen3_next`, Qwen3.5/3.6 `qwen3_5`, `qwen3_5_moe`).
 *
 * Usage (greedy continuation of a prompt, one sequence):
 *
 *     qd_model_params mp = qd_model_default_params();
 *     mp.path = "/models/Qwen3.5-0.8B";
 *     char err[512];
 *     qd_model *model;
 *     if (qd_model_load(&mp, &model, err, sizeof err) != QD_OK) { fprintf(stderr, "%s\n", err); ... }
 *
 *     qd_context_params cp = qd_context_default_params();
 *     qd_context *ctx;
 *     if (qd_context_create(model, &cp, &ctx) != QD_OK) { fprintf(stderr, "%s\n", qd_model_errmsg(model)); ... }
 *
 *     int32_t prompt[] = {1, 2, 3};
 *     float *logits = malloc(sizeof(float) * qd_model_vocab_size(model));
 *     qd_span span = { .seq = 0, .tokens = prompt, .n_tokens = 3, .logits = QD_LOGITS_LAST };
 *     if (qd_forward(ctx, &span, 1, logits) != QD_OK) fprintf(stderr, "%s\n", qd_context_errmsg(ctx));
 *     ... pick a token, feed it back as a span of one token ...
 *
 *     qd_context_free(ctx);
 *     qd_model_free(model);
 *
 * The model (weights, config) is immutable after load and may be shared by several
 * contexts. A context holds per-sequence state: the GDN conv and recurrent state of
 * every linear-attention layer and the KV cache of every full-attention layer.
 *
 * Errors are values: every function returns a qd_status, and the handle keeps a
 * message naming what was wrong (file, tensor, field, argument). Nothing aborts.
 */
#ifndef QDELTA_H
#define QDELTA_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define QDELTA_VERSION "0.1.0"

typedef enum qd_status {
    QD_OK = 0,
    QD_ERR_INVALID_ARG,  /* a caller-supplied argument is out of range or inconsistent */
    QD_ERR_IO,           /* a file could not be opened, read or mapped */
    QD_ERR_FORMAT,       /* a file is malformed: bad JSON, bad safetensors header, ... */
    QD_ERR_UNSUPPORTED,  /* a valid input this build does not support (model_type, dtype, ...) */
    QD_ERR_NOT_FOUND,    /* a required tensor, field or file is missing */
    QD_ERR_SHAPE,        /* a tensor has the wrong shape or dtype */
    QD_ERR_OOM,          /* memory could not be allocated */
    QD_ERR_CAPACITY,     /* a context limit (sequences, context length) is exceeded */
    QD_ERR_BACKEND,      /* the compute backend failed (e.g. a CUDA error) */
    QD_ERR_INTERNAL      /* a bug in qdelta */
} qd_status;

/* A short constant name for a status ("QD_ERR_FORMAT"). */
const char *qd_status_name(qd_status s);

/* ---------------------------------------------------------------- model */

typedef struct qd_model qd_model;

typedef enum qd_load_format {
    QD_LOAD_AUTO = 0,  /* read safetensors from the checkpoint directory */
    QD_LOAD_DUMMY = 1,     /* draw random BF16 weights from config.json alone (benchmarks) */
    QD_LOAD_DUMMY_F32 = 2  /* the same in F32: measures weights converted to fp32 at load */
} qd_load_format;

typedef enum qd_backend_kind {
    QD_BACKEND_CPU = 0,
    QD_BACKEND_CUDA = 1
} qd_backend_kind;

/* "cpu" / "cuda"; NULL for an unknown kind. */
const char *qd_backend_name(qd_backend_kind kind);
/* The kind named so (as qd_backend_name spells it); QD_ERR_INVALID_ARG when none is. */
qd_status qd_backend_parse(const char *name, qd_backend_kind *kind);

/* Quantization at load (qd_model_params.quantization): the linear layers of a plain
 * checkpoint, or of dummy weights, converted into a quantized format (README "Quantized
 * checkpoints"). A quantized checkpoint loads in its own format with QD_QUANTIZATION_NONE. */
typedef enum qd_quantization {
    QD_QUANTIZATION_NONE = 0,  /* weights as stored */
    QD_QUANTIZATION_FP8 = 1,   /* FP8 e4m3, 128 x 128 block scales (checkpoints and dummy weights) */
    QD_QUANTIZATION_NVFP4 = 2, /* NVFP4 (dummy weights only) */
    QD_QUANTIZATION_INT4 = 3   /* int4 symmetric, group 128 (dummy weights only) */
} qd_quantization;

typedef struct qd_model_params {
    const char *path;             /* checkpoint directory (config.json, *.safetensors) */
    qd_load_format load_format;
    qd_backend_kind backend;
    int n_threads;                /* CPU threads; 0 = all online cores */
    uint64_t seed;                /* for QD_LOAD_DUMMY */
    /* Called with fraction done in [0,1] while loading; may be NULL. */
    void (*progress)(float fraction, void *user);
    void *progress_user;
    /* Tensor parallelism (docs/parallel.md): the model split over this many ranks (0 or 1:
     * not split), each reading only its slices of the checkpoint. CUDA: one host thread and
     * one GPU per rank, the all-reduces through NCCL; CPU: the ranks run one after another
     * in the calling thread (a check of the split, not a speed-up). */
    int tensor_parallel_size;
    int expert_parallel;  /* MoE experts partitioned across the ranks instead of each split */
    int tp_devices;       /* CUDA: GPUs the ranks use; 0 = one per rank when that many are visible,
                           * else GPU 0 alone; 1 = every rank on GPU 0 (no NCCL: the ranks add
                           * their partial sums on the device, for tests and one-GPU runs) */
    qd_quantization quantization; /* --quantization: NONE loads the weights as stored */
} qd_model_params;

qd_model_params qd_model_default_params(void);

/* Loads a model. On failure *out is NULL and err (if non-NULL) holds the message. */
qd_status qd_model_load(const qd_model_params *params, qd_model **out, char *err, size_t err_size);
void qd_model_free(qd_model *model);
const char *qd_model_errmsg(const qd_model *model);

int qd_model_vocab_size(const qd_model *model);
int qd_model_n_layers(const qd_model *model);
const char *qd_model_type(const qd_model *model);   /* "qwen3_next", "qwen3_5", "qwen3_5_moe" */
int64_t qd_model_n_params(const qd_model *model);
int64_t qd_model_weight_bytes(const qd_model *model); /* bytes of weights as stored */
/* Bytes of weights read per decoded token (MoE: only the active experts). */
int64_t qd_model_active_weight_bytes(const qd_model *model);
/* Bytes of one routed expert of one layer (gate, up and down in their format, with
 * scales); 0 for a dense model. active_weight_bytes counts n_experts_per_tok of them per
 * MoE layer: a batch whose routing touches P distinct (layer, expert) pairs reads
 * active - n_moe_layers * k * expert_bytes + P * expert_bytes of weights. */
int64_t qd_model_expert_bytes(const qd_model *model);
int qd_model_moe_layers(const qd_model *model);
int qd_model_experts(const qd_model *model);            /* routed experts per MoE layer (0: dense) */
int qd_model_experts_per_token(const qd_model *model);  /* k (0: dense) */
/* Bytes of one sequence's GDN state (conv + recurrent, fp32, every GDN layer): read
 * and written once per decoded token. */
int64_t qd_model_state_bytes(const qd_model *model);
/* Bytes of KV cache per token of one sequence (every attention layer, keys and
 * values, in the backend's cache dtype: fp32 on the CPU, bf16 on CUDA). */
int64_t qd_model_kv_bytes_per_token(const qd_model *model);
/* Copy bandwidth (GB/s, read + write) of the memory a backend streams weights from, the
 * best of several copies of `bytes` (n_threads: the CPU's copy threads; 0 = all cores):
 * the denominator of a decode roofline. */
qd_status qd_backend_copy_gbps(qd_backend_kind kind, size_t bytes, int n_threads, double *gbps, char *err,
                               size_t err_size);
/* The device a backend's contexts take their memory from, as it is now. */
typedef struct qd_device_info {
    char name[128];           /* "NVIDIA H200", "host memory" */
    size_t free_bytes, total_bytes;
    int commits_lazily;       /* memory a context asks for is committed only as it is first
                               * written (host pages): a large budget costs address space */
} qd_device_info;
qd_status qd_backend_device_info(qd_backend_kind kind, qd_device_info *out, char *err, size_t err_size);
/* All-reduce timing of a split model (benchmarks): contexts created after this with on
 * record the device time of each all-reduce; QD_ERR_UNSUPPORTED for a model whose backend
 * has no all-reduces (an unsplit model, a split model on the CPU). */
qd_status qd_model_set_comm_timing(qd_model *model, int on);
/* End-of-sequence token ids: generation_config.json's eos_token_id if given, else
 * config.json's. Returns the count; *ids stays valid for the model's lifetime. */
int qd_model_eos_ids(const qd_model *model, const int32_t **ids);
/* The checkpoint's default sampling (generation_config.json); do_sample 0 = greedy. */
typedef struct qd_generation_defaults {
    int do_sample;
    float temperature, top_p, repetition_penalty;
    int top_k;
} qd_generation_defaults;
qd_generation_defaults qd_model_generation_defaults(const qd_model *model);
/* A one-paragraph human-readable description of the architecture. */
const char *qd_model_describe(const qd_model *model);

/* -------------------------------------------------------------- context */

typedef struct qd_context qd_context;

typedef struct qd_context_params {
    int max_seqs;      /* sequence slots (0..max_seqs-1) */
    int max_ctx;       /* tokens per sequence (KV cache capacity) */
    int max_batch;     /* tokens per qd_forward call */
    /* Paged KV cache of the attention layers (fields added after the first three so
     * that positional initialisers of those keep working; 0 = default). */
    int kv_block_size; /* tokens per KV block; 0 = 16 */
    int n_kv_blocks;   /* blocks in the pool shared by all sequences; 0 = enough for
                        * every sequence at max_ctx. With fewer, a forward whose spans
                        * need more blocks than are free fails with QD_ERR_CAPACITY. */
    int eager;         /* CUDA: 1 = never capture or replay CUDA graphs (debugging; graphs
                        * change no result, only launch overhead) */
    int n_snap_slots;  /* GDN state snapshot slots kept in the backend's memory (device
                        * memory on a GPU), planned with the rest of the context; the
                        * prefix cache's first tier. 0 = none. */
    int batch_invariant; /* 1 = batch-invariant mode: a sequence's logits are bit-identical
                          * whatever else shares its forward calls (batch size, other
                          * sequences), on the CPU and CUDA: every row is reduced in one
                          * fixed order (docs/batch-invariance.md). A span of one token takes
                          * the GDN recurrence, a longer one the chunked form in chunks of
                          * QD_INVARIANT_ALIGN from its first token, so a caller that also
                          * wants the same bits however a prompt is cut starts every prompt
                          * span at a multiple of QD_INVARIANT_ALIGN and never leaves a
                          * one-token prompt tail (the engine does). Costs speed. Not for
                          * split models (QD_ERR_UNSUPPORTED). */
    int speculative_tokens; /* K in 0..4: spans marked verify (K + 1 tokens at most) keep the
                             * GDN state after each of their tokens, for qd_seq_accept; 0 = none */
    int mtp;           /* 1 = plan the MTP head's KV cache (one more attention layer in every
                        * KV block) for speculative decoding and qd_mtp_forward; context
                        * creation fails with QD_ERR_UNSUPPORTED, saying why, when the
                        * checkpoint has no usable MTP head or the backend has no MTP forward */
} qd_context_params;

/* Batch-invariant mode: prompt pieces and prefix-cache restores start at multiples of
 * this (the GDN chunk length of the chunked prefill on every backend). */
#define QD_INVARIANT_ALIGN 64

qd_context_params qd_context_default_params(void);

qd_status qd_context_create(qd_model *model, const qd_context_params *params, qd_context **out);
void qd_context_free(qd_context *ctx);
const char *qd_context_errmsg(const qd_context *ctx);

/* Forgets a sequence: zero GDN state, empty KV cache (its blocks go back to the pool). */
qd_status qd_seq_reset(qd_context *ctx, int seq);
/* The backend the context's model runs on. */
qd_backend_kind qd_context_backend(const qd_context *ctx);
/* Number of tokens a sequence has consumed. */
int qd_seq_length(const qd_context *ctx, int seq);
/* The device time the context's last forward spent in all-reduces (rank 0, waiting for
 * the other ranks included) and how many there were; see qd_model_set_comm_timing. */
qd_status qd_context_comm_time(qd_context *ctx, double *ms, int *count);
/* Routing statistics of a MoE model, for rooflines that count the experts a step really
 * reads: with on, each later forward records which (layer, expert) pairs its routing
 * selected for some row, and qd_context_routed_experts gives the number of distinct pairs
 * of the last such forward. QD_ERR_UNSUPPORTED on a dense model or a backend that cannot
 * count (split models). Counting costs a little speed (on CUDA the steps run without
 * graphs), so a benchmark counts on steps it does not time. */
qd_status qd_context_count_experts(qd_context *ctx, int on);
qd_status qd_context_routed_experts(const qd_context *ctx, int64_t *pairs);

typedef enum qd_logits_mode {
    QD_LOGITS_NONE = 0,
    QD_LOGITS_LAST = 1,  /* one row: the span's last token */
    QD_LOGITS_ALL = 2    /* one row per token of the span */
} qd_logits_mode;

/* One span of a ragged batch: tokens appended to a sequence. A batch may mix
 * prefill spans (many tokens) and decode spans (one token); each sequence may
 * appear at most once per batch. */
typedef struct qd_span {
    int seq;
    const int32_t *tokens;
    int n_tokens;
    qd_logits_mode logits;
} qd_span;

/* Runs one forward pass over a ragged batch. Logit rows are written to `logits`
 * (vocab_size floats each) in span order; it may be NULL if no span wants logits. */
qd_status qd_forward(qd_context *ctx, const qd_span *spans, int n_spans, float *logits);

/* The same forward, returning for each logit row only the id of its largest logit
 * (the lowest id among equals): greedy decoding without moving logits off the
 * device. ids holds one int32 per logit row. */
qd_status qd_forward_greedy(qd_context *ctx, const qd_span *spans, int n_spans, int32_t *ids);
/* The same with the argmax taken over ids [0, vocab_limit) (0: the whole vocabulary;
 * ids past a tokenizer's vocabulary are padding) and, when logprobs is not NULL, the
 * chosen token's log-softmax over that range (one float per logit row). */
qd_status qd_forward_greedy_logprobs(qd_context *ctx, const qd_span *spans, int n_spans, int vocab_limit,
                                     int32_t *ids, float *logprobs);
/* A step whose logit rows are used two ways (a server's greedy requests next to
 * sampled ones): every logit row gets its argmax and log-softmax as in
 * qd_forward_greedy_logprobs, and the rows r with full[r] != 0 also their whole row of
 * vocab_size logits at logits + r * vocab_size, as qd_forward writes them. full NULL:
 * every row (then this is qd_forward plus the argmax). logits NULL: no row (full must
 * be NULL too). The other rows of `logits` may or may not be written: the CPU backend
 * computes every row there in one matmul, the CUDA backend copies only the rows asked
 * for off the device, so a step of greedy rows moves a few bytes per row, not a row. */
qd_status qd_forward_mixed(qd_context *ctx, const qd_span *spans, int n_spans, int vocab_limit, const uint8_t *full,
                           float *logits, int32_t *ids, float *logprobs);

/* Every output and option of a forward at once (designated initialisers; zero fields are
 * off). verify[i] = 1 marks span i a speculative verify span (the last accepted token and
 * the drafts, at most params.speculative_tokens + 1 tokens): the forward keeps the state
 * after each of its tokens, for qd_seq_accept. ids / logprobs / full / logits as in
 * qd_forward_mixed (ids NULL: no argmax), hidden as in qd_forward_hidden. */
typedef struct qd_forward_args {
    const qd_span *spans;
    int n_spans;
    const uint8_t *verify;     /* [n_spans], or NULL: no verify span */
    int vocab_limit;           /* 0: the whole vocabulary */
    const uint8_t *full;       /* [n_logit_rows] rows of logits wanted, or NULL: all */
    float *logits;             /* [n_logit_rows][vocab_size], or NULL */
    int32_t *ids;              /* [n_logit_rows], or NULL */
    float *logprobs;           /* [n_logit_rows], or NULL */
    float *hidden;             /* [n_logit_rows][hidden_size], or NULL */
    /* [n_spans], or NULL: spans i with hidden_all[i] write the final-normed hidden state of
     * every token (not only their logit rows) to all_hidden [sum of their n_tokens]
     * [hidden_size], in span order: the MTP head's inputs over a prefill chunk. Needs a
     * backend with the MTP forward. */
    const uint8_t *hidden_all;
    float *all_hidden;
    /* Allow masks for the argmax (constrained greedy decoding decided where the logits
     * are, with no row copied off a GPU): allow [n_allow][(vocab_size + 31) / 32] words,
     * bit i % 32 of word i / 32 set when id i is allowed, and allow_row [n_logit_rows]
     * each logit row's mask (an index into allow) or -1 for an unmasked row. A masked
     * row's id is the argmax over the ids of [0, vocab_limit) its mask allows (the lowest
     * among equals) and its logprob the log-softmax over those ids alone: what an
     * unmasked row gives after its refused logits are set to -inf. A masked row with no
     * allowed id whose logit is above -inf gets id -1 and logprob -INFINITY. Needs ids;
     * allow_row NULL: no row is masked. */
    const uint32_t *allow;
    int n_allow;
    const int32_t *allow_row;
} qd_forward_args;
qd_status qd_forward_ex(qd_context *ctx, const qd_forward_args *args);

/* After a forward whose span for `seq` was a verify span of T tokens: keep its first
 * n_keep (1..T) as if only they had been fed. The GDN and conv states become those after
 * token n_keep, the length drops to the span's start + n_keep, the KV positions past it
 * are dropped (and the MTP KV past it). n_keep == T keeps everything. */
qd_status qd_seq_accept(qd_context *ctx, int seq, int n_keep);

/* ------------------------------------------------ MTP head (speculative decoding) */

/* 1 when the checkpoint's MTP head is bound; otherwise 0, and why (no mtp.* tensors, an
 * incomplete head) goes into why[0..why_size) when why is not NULL. */
int qd_model_has_mtp(const qd_model *model, char *why, size_t why_size);
/* Width of the hidden states of qd_forward_hidden and qd_mtp_forward. */
int qd_model_hidden_size(const qd_model *model);
/* qd_forward that also writes each logit row's hidden state after the final norm (the
 * MTP head's input) to hidden [n_logit_rows][hidden_size]. logits may be NULL. */
qd_status qd_forward_hidden(qd_context *ctx, const qd_span *spans, int n_spans, float *logits, float *hidden);
/* The MTP head (a context created with params.mtp) over a ragged batch: span i's token t
 * is the embedding input and hidden row (row0 + t) of hidden [n_rows][hidden_size] the
 * hidden input (a main forward's final-normed state, or h' of a previous MTP step), at
 * MTP positions mtp_length, mtp_length + 1, ... of the span's sequence, whose MTP KV the
 * step appends to (mtp_length advances; it may run up to max_ctx past the sequence's
 * length, for draft steps). Logit rows as in qd_forward (the draft logits of the token
 * two places on); hidden_out [n_logit_rows][hidden_size] h' after the MTP norm, or NULL. */
qd_status qd_mtp_forward(qd_context *ctx, const qd_span *spans, int n_spans, const float *hidden, float *logits,
                         float *hidden_out);
/* qd_mtp_forward handing back each logit row's argmax instead of its logits: ids
 * [n_logit_rows] over ids [0, vocab_limit) (0: the whole vocabulary; the lowest among
 * equal maxima), taken where the logits are, so a GPU copies 4 bytes per draft, not a
 * vocabulary row. hidden_out as in qd_mtp_forward. */
qd_status qd_mtp_forward_ids(qd_context *ctx, const qd_span *spans, int n_spans, const float *hidden, int vocab_limit,
                             int32_t *ids, float *hidden_out);
/* Positions of a sequence's MTP KV cache, or -1 for a bad sequence; qd_mtp_truncate drops
 * those past n (draft positions, whose hidden inputs were the MTP's own). A rollback of
 * the sequence (qd_seq_state_restore, qd_seq_reset) truncates it to the new length. */
int qd_mtp_length(const qd_context *ctx, int seq);
qd_status qd_mtp_truncate(qd_context *ctx, int seq, int n);

#ifdef __cplusplus
}
#endif
#endif /* QDELTA_H */
