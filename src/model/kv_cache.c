/* The context's paged KV cache (a pool of reference-counted blocks, one block table
 * per sequence; the backend holds the blocks' contents) and plain-copy snapshots of a
 * sequence's GDN state.
 *
 * Why blocks: the attention layers are one in four, but their cache grows with the
 * context while the GDN state does not; a pool of fixed-size blocks lets sequences of
 * very different lengths share one budget instead of each reserving max_ctx.
 * Reference counts make prefix sharing a matter of copying a block table. */
#include <stdlib.h>
#include <string.h>

#include "model/model.h"

static int ceil_div(int a, int b) { return (a + b - 1) / b; }

qd_status qd_kv_pool_init(qd_context *ctx) {
    const qd_model *m = ctx->model;
    const qd_config *c = &m->cfg;
    const int n_attn = m->w.n_attn;
    qd_context_params *p = &ctx->params;
    qd_kv_pool *kv = &ctx->kv;
    if (p->kv_block_size == 0) p->kv_block_size = 16;
    if (p->kv_block_size < 1 || p->n_kv_blocks < 0)
        return qd_seterr(&ctx->model->err, QD_ERR_INVALID_ARG, "kv_block_size %d and n_kv_blocks %d must not be negative",
                         p->kv_block_size, p->n_kv_blocks);
    kv->block_size = p->kv_block_size;
    kv->max_blocks_per_seq = ceil_div(p->max_ctx, kv->block_size);
    if (p->n_kv_blocks == 0) {
        int64_t all = (int64_t)p->max_seqs * kv->max_blocks_per_seq;
        if (all > (1 << 30))
            return qd_seterr(&ctx->model->err, QD_ERR_INVALID_ARG,
                             "max_seqs %d x max_ctx %d is too large for a KV pool; set n_kv_blocks", p->max_seqs, p->max_ctx);
        p->n_kv_blocks = (int)all;
    }
    /* with params.mtp the MTP head's attention is one more layer of every block */
    const int n_kv_layers = n_attn + (p->mtp ? 1 : 0);
    kv->n_blocks = n_kv_layers > 0 ? p->n_kv_blocks : 0;
    kv->block_elems = (size_t)n_kv_layers * kv->block_size * c->attn_nkv * c->attn_head_dim;
    for (int i = 0; i < p->max_seqs; i++) {
        ctx->seqs[i].blocks = calloc((size_t)kv->max_blocks_per_seq, sizeof(int32_t));
        if (!ctx->seqs[i].blocks) return QD_ERR_OOM;
    }
    if (kv->n_blocks == 0) return QD_OK;
    kv->ref = calloc((size_t)kv->n_blocks, sizeof(int32_t));
    kv->free_ids = malloc((size_t)kv->n_blocks * sizeof(int32_t));
    if (!kv->ref || !kv->free_ids) return QD_ERR_OOM;
    /* stack with block 0 on top, so a fresh context hands out blocks in order */
    for (int i = 0; i < kv->n_blocks; i++) kv->free_ids[i] = kv->n_blocks - 1 - i;
    kv->n_free = kv->n_blocks;
    return QD_OK;
}

void qd_kv_pool_free(qd_context *ctx) {
    qd_kv_pool *kv = &ctx->kv;
    if (ctx->seqs)
        for (int i = 0; i < ctx->params.max_seqs; i++) free(ctx->seqs[i].blocks);
    free(kv->ref);
    free(kv->free_ids);
    memset(kv, 0, sizeof *kv);
}

int qd_kv_free_blocks(const qd_context *ctx) { return ctx->kv.n_free; }
int qd_kv_total_blocks(const qd_context *ctx) { return ctx->kv.n_blocks; }

int qd_kv_blocks_for(const qd_context *ctx, int n_tokens) {
    return ctx->kv.n_blocks > 0 ? ceil_div(n_tokens, ctx->kv.block_size) : 0;
}

/* Would appending write into a partly filled block another sequence also holds? */
static int last_block_shared(const qd_context *ctx, const qd_seq_blocks *q) {
    const qd_kv_pool *kv = &ctx->kv;
    return q->length % kv->block_size != 0 && q->n_blocks * kv->block_size > q->length &&
           kv->ref[q->blocks[q->length / kv->block_size]] > 1;
}

int qd_kv_blocks_needed(const qd_context *ctx, int seq, int n_tokens) {
    if (ctx->kv.n_blocks == 0 || n_tokens <= 0) return 0;
    const qd_seq_blocks *q = &ctx->seqs[seq];
    int need = ceil_div(q->length + n_tokens, ctx->kv.block_size) - q->n_blocks;
    if (need < 0) need = 0;
    return need + last_block_shared(ctx, q);
}

static void unref(qd_kv_pool *kv, int32_t b) {
    if (--kv->ref[b] == 0) kv->free_ids[kv->n_free++] = b;
}

qd_status qd_kv_copy_block(qd_context *ctx, int32_t dst, int32_t src) {
    return ctx->model->ops->kv_copy_block(ctx->bc, dst, src);
}

qd_status qd_kv_reserve(qd_context *ctx, int seq, int n_tokens) {
    const int need = qd_kv_blocks_needed(ctx, seq, n_tokens);
    if (need == 0) return QD_OK;
    qd_kv_pool *kv = &ctx->kv;
    qd_seq_blocks *q = &ctx->seqs[seq];
    if (need > kv->n_free)
        return qd_seterr(&ctx->err, QD_ERR_CAPACITY,
                         "KV cache pool exhausted: sequence %d needs %d more blocks of %d tokens, %d of %d free", seq,
                         need, kv->block_size, kv->n_free, kv->n_blocks);
    if (ceil_div(q->length + n_tokens, kv->block_size) > kv->max_blocks_per_seq)
        return qd_seterr(&ctx->err, QD_ERR_CAPACITY, "sequence %d: %d + %d tokens exceed the context length %d", seq,
                         q->length, n_tokens, ctx->params.max_ctx);
    if (last_block_shared(ctx, q)) { /* copy on write: the copy replaces our reference */
        int i = q->length / kv->block_size;
        int32_t old = q->blocks[i], nb = kv->free_ids[--kv->n_free];
        kv->ref[nb] = 1;
        qd_status st = qd_kv_copy_block(ctx, nb, old);
        if (st != QD_OK) {
            kv->free_ids[kv->n_free++] = nb;
            kv->ref[nb] = 0;
            return st;
        }
        q->blocks[i] = nb;
        unref(kv, old);
    }
    const int want = ceil_div(q->length + n_tokens, kv->block_size);
    while (q->n_blocks < want) {
        int32_t b = kv->free_ids[--kv->n_free];
        kv->ref[b] = 1;
        q->blocks[q->n_blocks++] = b;
    }
    return QD_OK;
}

int qd_kv_shared_in(const qd_context *ctx, int seq, int from, int to) {
    const qd_kv_pool *kv = &ctx->kv;
    const qd_seq_blocks *q = &ctx->seqs[seq];
    if (kv->n_blocks == 0 || to <= from) return 0;
    int n = 0;
    for (int b = from / kv->block_size; b < q->n_blocks && b * kv->block_size < to; b++) n += kv->ref[q->blocks[b]] > 1;
    return n;
}

qd_status qd_kv_unshare(qd_context *ctx, int seq, int from, int to) {
    qd_kv_pool *kv = &ctx->kv;
    qd_seq_blocks *q = &ctx->seqs[seq];
    if (kv->n_blocks == 0 || to <= from) return QD_OK;
    if (qd_kv_shared_in(ctx, seq, from, to) > kv->n_free)
        return qd_seterr(&ctx->err, QD_ERR_CAPACITY, "KV cache pool exhausted: sequence %d needs private copies of %d "
                         "shared blocks, %d free", seq, qd_kv_shared_in(ctx, seq, from, to), kv->n_free);
    for (int b = from / kv->block_size; b < q->n_blocks && b * kv->block_size < to; b++) {
        const int32_t old = q->blocks[b];
        if (kv->ref[old] <= 1) continue;
        const int32_t nb = kv->free_ids[--kv->n_free];
        kv->ref[nb] = 1;
        qd_status st = qd_kv_copy_block(ctx, nb, old);
        if (st != QD_OK) {
            kv->free_ids[kv->n_free++] = nb;
            kv->ref[nb] = 0;
            return st;
        }
        q->blocks[b] = nb;
        unref(kv, old);
    }
    return QD_OK;
}

void qd_kv_truncate(qd_context *ctx, int seq, int n_tokens) {
    qd_seq_blocks *q = &ctx->seqs[seq];
    const int keep = qd_kv_blocks_for(ctx, n_tokens);
    if (q->mtp_length > n_tokens) q->mtp_length = n_tokens; /* the MTP KV past it went with the blocks */
    if (q->verify_pos0 + q->verify_T > n_tokens) q->verify_T = 0; /* a rollback ends an unaccepted verify */
    while (q->n_blocks > keep) unref(&ctx->kv, q->blocks[--q->n_blocks]);
}

/* ------------------------------------------------------------------ snapshots */

static qd_status payload_read(qd_context *ctx, int seq, unsigned char *dst) {
    return ctx->model->ops->state_read(ctx->bc, seq, dst);
}

static qd_status payload_write(qd_context *ctx, int seq, const unsigned char *src) {
    return ctx->model->ops->state_write(ctx->bc, seq, src);
}

qd_status qd_seq_state_clear(qd_context *ctx, int seq) { return payload_write(ctx, seq, NULL); }

qd_status qd_seq_state_copy(qd_context *ctx, int src, int dst) {
    return ctx->model->ops->state_copy(ctx->bc, src, dst);
}

size_t qd_seq_state_size(const qd_context *ctx) { return QD_SNAP_HEADER + ctx->model->ops->state_bytes(ctx->bc); }

static qd_status check_seq(qd_context *ctx, int seq) {
    if (seq < 0 || seq >= ctx->params.max_seqs)
        return qd_seterr(&ctx->err, QD_ERR_INVALID_ARG, "sequence %d out of range [0, %d)", seq, ctx->params.max_seqs);
    return QD_OK;
}

qd_status qd_seq_state_save(qd_context *ctx, int seq, void *dst, size_t size) {
    QD_TRY(check_seq(ctx, seq));
    if (!dst || size < qd_seq_state_size(ctx))
        return qd_seterr(&ctx->err, QD_ERR_INVALID_ARG, "state snapshot buffer of %zu bytes, need %zu", size,
                         qd_seq_state_size(ctx));
    const qd_seq_blocks *q = &ctx->seqs[seq];
    unsigned char *d = dst;
    int64_t len = q->length;
    memset(d, 0, QD_SNAP_HEADER);
    memcpy(d, &len, sizeof len);
    return payload_read(ctx, seq, d + QD_SNAP_HEADER);
}

qd_status qd_seq_state_restore(qd_context *ctx, int seq, const void *src, size_t size) {
    QD_TRY(check_seq(ctx, seq));
    if (!src || size < qd_seq_state_size(ctx))
        return qd_seterr(&ctx->err, QD_ERR_INVALID_ARG, "state snapshot of %zu bytes, need %zu", size,
                         qd_seq_state_size(ctx));
    qd_seq_blocks *q = &ctx->seqs[seq];
    const unsigned char *s = src;
    int64_t len;
    memcpy(&len, s, sizeof len);
    if (len < 0 || len > q->length)
        return qd_seterr(&ctx->err, QD_ERR_INVALID_ARG,
                         "snapshot of %lld tokens cannot be restored into sequence %d holding %d (KV would be missing)",
                         (long long)len, seq, q->length);
    QD_TRY(payload_write(ctx, seq, s + QD_SNAP_HEADER));
    q->length = (int)len;
    qd_kv_truncate(ctx, seq, q->length);
    return QD_OK;
}

qd_status qd_seq_fork(qd_context *ctx, int src, int dst) {
    QD_TRY(check_seq(ctx, src));
    QD_TRY(check_seq(ctx, dst));
    if (src == dst) return QD_OK;
    QD_TRY(qd_seq_reset(ctx, dst));
    qd_seq_blocks *a = &ctx->seqs[src], *b = &ctx->seqs[dst];
    QD_TRY(qd_seq_state_copy(ctx, src, dst));
    for (int i = 0; i < a->n_blocks; i++) {
        b->blocks[i] = a->blocks[i];
        ctx->kv.ref[a->blocks[i]]++;
    }
    b->n_blocks = a->n_blocks;
    b->length = a->length;
    b->mtp_length = a->mtp_length;
    return QD_OK;
}

/* ------------------------------------------------- prefix cache support */

void qd_kv_block_ref(qd_context *ctx, int32_t b) { ctx->kv.ref[b]++; }
void qd_kv_block_unref(qd_context *ctx, int32_t b) { unref(&ctx->kv, b); }

qd_status qd_seq_attach_blocks(qd_context *ctx, int seq, int length, const int32_t *blocks, int n_blocks) {
    QD_TRY(check_seq(ctx, seq));
    if (length < 0 || length > ctx->params.max_ctx || n_blocks != qd_kv_blocks_for(ctx, length) ||
        n_blocks > ctx->kv.max_blocks_per_seq)
        return qd_seterr(&ctx->err, QD_ERR_INVALID_ARG,
                         "snapshot of %d tokens comes with %d KV blocks, needs %d (context length %d)", length, n_blocks,
                         qd_kv_blocks_for(ctx, length < 0 ? 0 : length), ctx->params.max_ctx);
    qd_seq_blocks *q = &ctx->seqs[seq];
    /* shared, not copied: a partly filled last block is copied by qd_kv_reserve before
     * this sequence writes into it, because the cache still holds a reference. The new
     * references come first, so that a block the sequence already held alone is not
     * freed in between. */
    for (int i = 0; i < n_blocks; i++) ctx->kv.ref[blocks[i]]++;
    qd_kv_truncate(ctx, seq, 0);
    memcpy(q->blocks, blocks, sizeof(int32_t) * (size_t)n_blocks);
    q->n_blocks = n_blocks;
    q->length = length;
    return QD_OK;
}

qd_status qd_seq_state_attach(qd_context *ctx, int seq, const void *src, size_t size, const int32_t *blocks,
                              int n_blocks) {
    QD_TRY(check_seq(ctx, seq));
    if (!src || size < qd_seq_state_size(ctx))
        return qd_seterr(&ctx->err, QD_ERR_INVALID_ARG, "state snapshot of %zu bytes, need %zu", size,
                         qd_seq_state_size(ctx));
    int64_t len;
    memcpy(&len, src, sizeof len);
    if (len < 0 || len > ctx->params.max_ctx)
        return qd_seterr(&ctx->err, QD_ERR_INVALID_ARG, "snapshot of %lld tokens, context length %d", (long long)len,
                         ctx->params.max_ctx);
    QD_TRY(qd_seq_attach_blocks(ctx, seq, (int)len, blocks, n_blocks));
    const unsigned char *s = src;
    return payload_write(ctx, seq, s + QD_SNAP_HEADER);
}
