/* The hybrid model behind the public API: config, the host weights it binds (backend.h
 * qd_weights), and its backend; a context's sequences (lengths, KV block tables) and the
 * block pool's reference counts, with the backend context that holds the state and the
 * blocks' contents. Weights point into the mmapped checkpoint where they are used as
 * stored, or into buffers the model owns (de-interleaved Qwen3-Next projections, dummy
 * weights, fp32 copies of small vectors). */
#ifndef QD_MODEL_MODEL_H
#define QD_MODEL_MODEL_H

#include <stdint.h>

#include "backend/backend.h"
#include "base/err.h"
#include "base/threadpool.h"
#include "io/config.h"
#include "io/generation_config.h"
#include "io/safetensors.h"
#include "qdelta.h"

struct qd_model {
    qd_config cfg;
    qd_generation_config gen;
    int32_t eos_ids[QD_MAX_EOS];  /* from gen, else cfg */
    int n_eos;
    qd_err err;
    qd_backend_kind backend;
    const qd_backend_ops *ops; /* the backend (a split model's: the split backend) */
    void *bm;                 /* its model */
    qd_safetensors *st;       /* NULL for dummy weights */
    /* the checkpoint's quantization exclusion list, its patterns compiled once a load
     * (qd_model_quant_matcher, model_quant.c): a rank's is its top model's, borrowed */
    const struct qd_quant_matcher *quant_match;
    struct qd_quant_matcher *quant_match_owned; /* what m frees; NULL when borrowed */
    qd_dtype dummy_dtype;     /* storage of dummy weights */
    qd_quantization quantization; /* quantized at load (model_quant_online.c); dummies drawn on the host */
    qd_threadpool *pool;
    qd_weights w;             /* none on a split model, whose ranks hold theirs */
    char mtp_missing[256];    /* why w.mtp is NULL (no head, an incomplete one), for the error
                               * of a context that asks for speculation */
    /* tensor / expert parallel (model_split.c): the ranks' models, each binding its slices;
     * this model then holds the config and the checkpoint mapping */
    struct qd_model_split *split;
    /* every buffer the model owns, freed with it */
    void **owned;
    int n_owned, cap_owned;
    int n_owned_layout;       /* of them, those owned before any weight was bound (the layer table) */
    int64_t n_params;
    int64_t weight_bytes;
    int64_t active_weight_bytes;
    int64_t expert_bytes;       /* one routed expert of one layer; 0 dense */
    int n_moe_layers;
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
/* Binding pieces model_mtp.c reuses (model_load.c): layer L named "<prefix>layers.L.*"
 * with the plan's slices; a matrix or a [n] vector (to fp32) by its absolute name. */
qd_status qd_model_bind_layer(qd_model *m, const qd_config *c, const struct qd_shard_plan *p, const char *prefix,
                              int L, qd_layer *ly, qd_err *err);
qd_status qd_model_bind_matrix(qd_model *m, const char *name, int64_t rows, int64_t cols, qd_weight *w, qd_err *err);
qd_status qd_model_bind_norm(qd_model *m, const char *name, int64_t n, float **out, qd_err *err);
/* The MTP head (model_mtp.c): bound into m->w.mtp when the checkpoint (config c) has a
 * complete one, with the slices of plan p (the whole model's, or a rank's); otherwise
 * m->w.mtp stays NULL and m->mtp_missing says why. Only running out of memory fails the
 * load. */
qd_status qd_model_bind_mtp(qd_model *m, const qd_config *c, const struct qd_shard_plan *p, qd_err *err);
/* An empty MTP head owned by m: its layer's kind, FFN kind (c's family) and KV layer index
 * (n_attn) set, every weight still to bind or draw; NULL when out of memory. */
qd_mtp_weights *qd_model_new_mtp(qd_model *m, const qd_config *c);
/* A rank's plan slices the kinds of block the main layers have (shard.h), and the head's
 * layer (full attention and the family's FFN) is sliced by the same plan: it needs a
 * main layer of each of its kinds. The reason it cannot be sliced, or NULL. */
const char *qd_mtp_plan_lacks(const qd_config *c, const struct qd_shard_plan *p);
/* Whether the model can run its MTP head: its own, or, split, every rank's slice of it
 * (model_backend.c); when not, m->mtp_missing says why. */
int qd_model_mtp_bound(const qd_model *m);
/* Layer kinds and state indices from m->cfg (model.c). */
qd_status qd_model_init_layers(qd_model *m, qd_err *err);
/* Dummy weights from m->cfg alone (model_dummy.c); with_mtp: also an MTP head when the
 * config has mtp_num_hidden_layers (an unsplit model; a split rank's head is not drawn). */
qd_status qd_model_bind_dummy(qd_model *m, uint64_t seed, qd_dtype dtype, int with_mtp, qd_err *err);
/* Parameter and byte counts from the bound weights. */
void qd_model_account(qd_model *m);

/* ---------------------------------------------------------------- context */

/* The paged KV cache's bookkeeping (kv_cache.c): a pool of reference-counted blocks
 * shared by the sequences of a context, each block holding block_size positions of
 * every attention layer (the backend keeps the contents). Reference counts let two
 * sequences share a prefix (qd_seq_fork); a sequence about to write into a shared,
 * partly filled block gets a private copy first (copy on write). */
typedef struct qd_kv_pool {
    int block_size;           /* tokens per block */
    int n_blocks;             /* blocks in the pool (0 when the model has no attention layers) */
    int max_blocks_per_seq;   /* ceil(max_ctx / block_size) */
    size_t block_elems;       /* elements per block of keys (and of values): n_attn * block_size * nkv * hd */
    int32_t *ref;             /* [n_blocks] owners of each block; 0 = free */
    int32_t *free_ids;        /* [n_blocks] stack of free block ids */
    int n_free;
} qd_kv_pool;

struct qd_context {
    qd_model *model;
    qd_context_params params;
    qd_err err;
    qd_seq_blocks *seqs;    /* [max_seqs] */
    qd_kv_pool kv;
    qd_span_rt *spans_rt;   /* [max_seqs] validated spans of the current forward */
    void *bc;               /* the backend's context: GDN state, KV contents, snapshot slots */
    uint8_t *experts_touched; /* [n_layers][n_experts] while counting (qd_context_count_experts), else NULL */
    int64_t routed_pairs;     /* distinct pairs of the last counted forward, -1 before one */
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
/* Shared blocks (held by another sequence or the prefix cache too) among those covering
 * positions [from, to) of seq; qd_kv_unshare gives seq a private copy of each (the MTP
 * head writes its KV at positions whose pairs depend on tokens the sharers need not have
 * in common). QD_ERR_CAPACITY when the pool lacks blocks (nothing changes then). */
int qd_kv_shared_in(const qd_context *ctx, int seq, int from, int to);
qd_status qd_kv_unshare(qd_context *ctx, int seq, int from, int to);
/* Keeps the blocks covering the first n_tokens positions, returns the others. */
void qd_kv_truncate(qd_context *ctx, int seq, int n_tokens);
/* ------------------------------------------ sequence state snapshots (kv_cache.c) */

/* A host snapshot: int64 length, padding to QD_SNAP_HEADER bytes, conv floats, ssm floats. */
#define QD_SNAP_HEADER 64

/* GDN state (conv + recurrent, every GDN layer) and length of a sequence as a plain
 * copy: size in bytes of one snapshot, a header and the backend's state payload (an
 * unsplit model's: conv [n_gdn][conv_dim][Kc-1] then ssm [n_gdn][hv][dk][dv] floats; a
 * split model's: each rank's slice in rank order). */
size_t qd_seq_state_size(const qd_context *ctx);
/* A sequence slot's payload to zeros (a fresh sequence). */
qd_status qd_seq_state_clear(qd_context *ctx, int seq);
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
 * overwritten right after a restore from it was queued. A slot holds the state payload
 * (the host snapshot layout without its header); its length is the caller's to
 * remember. */
int qd_snap_slots(const qd_context *ctx);
size_t qd_snap_slot_bytes(const qd_context *ctx);
/* slot := the GDN state of seq. */
qd_status qd_snap_save(qd_context *ctx, int seq, int slot);
/* seq (whatever it held is released) := the slot's GDN state at `length` tokens, with
 * the KV blocks covering them shared as in qd_seq_state_attach. */
qd_status qd_snap_attach(qd_context *ctx, int seq, int slot, int length, const int32_t *blocks, int n_blocks);
/* The slot as a host snapshot of `length` tokens (qd_seq_state_size bytes, the format
 * of qd_seq_state_save, so qd_seq_state_attach restores it). Waits for the copy. */
qd_status qd_snap_to_host(qd_context *ctx, int slot, int length, void *dst, size_t size);
/* The state halves of attach and to_host: seq's GDN state := the slot's (blocks and
 * length untouched); the slot's payload (qd_snap_slot_bytes) to host memory. */
qd_status qd_snap_load_state(qd_context *ctx, int seq, int slot);
qd_status qd_snap_read_payload(qd_context *ctx, int slot, void *dst);

/* A sequence's MTP KV length set to n (<= its length) without computing anything: the
 * caller knows positions [0, n) of its blocks already hold the MTP KV (a prefix restored
 * from the prefix cache, whose snapshots are taken where they do). forward_mtp.c. */
qd_status qd_mtp_adopt(qd_context *ctx, int seq, int n);

/* The backend model of a loaded model with its weights bound (model_backend.c): finds
 * the backend of m->backend (split when m->split) and makes its model. */
qd_status qd_model_backend_create(qd_model *m, const qd_model_params *params, qd_err *err);
void qd_model_backend_free(qd_model *m);

#endif
