/* Snapshot slots: GDN state snapshots kept in the memory the state lives in (see
 * model.h); the backend holds them (params.n_snap_slots of them, planned with its
 * context) and copies between them and its sequence slots. Here the checks, the KV
 * block half of an attach and the host snapshot header. */
#include <string.h>

#include "model/model.h"

int qd_snap_slots(const qd_context *ctx) { return ctx->params.n_snap_slots; }

size_t qd_snap_slot_bytes(const qd_context *ctx) { return qd_seq_state_size(ctx) - QD_SNAP_HEADER; }

static qd_status check(qd_context *ctx, int seq, int slot) {
    if (seq < 0 || seq >= ctx->params.max_seqs)
        return qd_seterr(&ctx->err, QD_ERR_INVALID_ARG, "sequence %d out of range [0, %d)", seq, ctx->params.max_seqs);
    if (slot < 0 || slot >= ctx->params.n_snap_slots)
        return qd_seterr(&ctx->err, QD_ERR_INVALID_ARG, "snapshot slot %d out of range [0, %d)", slot,
                         ctx->params.n_snap_slots);
    return QD_OK;
}

qd_status qd_snap_save(qd_context *ctx, int seq, int slot) {
    QD_TRY(check(ctx, seq, slot));
    return ctx->model->ops->snap_save(ctx->bc, seq, slot);
}

qd_status qd_snap_attach(qd_context *ctx, int seq, int slot, int length, const int32_t *blocks, int n_blocks) {
    QD_TRY(check(ctx, seq, slot));
    QD_TRY(qd_seq_attach_blocks(ctx, seq, length, blocks, n_blocks));
    return qd_snap_load_state(ctx, seq, slot);
}

qd_status qd_snap_load_state(qd_context *ctx, int seq, int slot) {
    QD_TRY(check(ctx, seq, slot));
    return ctx->model->ops->snap_load(ctx->bc, seq, slot);
}

qd_status qd_snap_to_host(qd_context *ctx, int slot, int length, void *dst, size_t size) {
    QD_TRY(check(ctx, 0, slot));
    if (!dst || size < qd_seq_state_size(ctx))
        return qd_seterr(&ctx->err, QD_ERR_INVALID_ARG, "state snapshot buffer of %zu bytes, need %zu", size,
                         qd_seq_state_size(ctx));
    unsigned char *d = dst;
    const int64_t len = length;
    memset(d, 0, QD_SNAP_HEADER);
    memcpy(d, &len, sizeof len);
    return qd_snap_read_payload(ctx, slot, d + QD_SNAP_HEADER);
}

qd_status qd_snap_read_payload(qd_context *ctx, int slot, void *dst) {
    QD_TRY(check(ctx, 0, slot));
    return ctx->model->ops->snap_read(ctx->bc, slot, dst);
}
