/* Snapshot slots: GDN state snapshots kept in the memory the state lives in (see
 * model.h). On the CPU backend the slots are one host allocation made at context
 * creation; its pages are only committed as slots are first written, so a large
 * prefix-cache budget costs address space, not memory, until it is used. A CUDA
 * context carves its slots from the context's device block (cuda_context.c), and the
 * copies below are device-to-device copies queued on the context's stream. A split
 * model's context holds no state: each rank context has its own slots for its slice,
 * and the operations go to every rank (parallel/tp.c). */
#include <string.h>

#include "base/arena.h"
#include "model/model.h"
#include "parallel/tp.h"
#ifdef QD_HAVE_CUDA
#include "backend/cuda/cuda_model.h"
#endif

int qd_snap_slots(const qd_context *ctx) { return ctx->params.n_snap_slots; }

size_t qd_snap_slot_bytes(const qd_context *ctx) { return qd_seq_state_size(ctx) - QD_SNAP_HEADER; }

qd_status qd_snap_pool_init(qd_context *ctx) {
    const int n = ctx->params.n_snap_slots;
    if (n < 0)
        return qd_seterr(&ctx->model->err, QD_ERR_INVALID_ARG, "n_snap_slots %d must not be negative", n);
    if (n == 0 || ctx->model->backend != QD_BACKEND_CPU || ctx->model->tp) return QD_OK;
    ctx->snap_pool = qd_aligned_alloc((size_t)n * qd_snap_slot_bytes(ctx));
    return ctx->snap_pool ? QD_OK : QD_ERR_OOM;
}

void qd_snap_pool_free(qd_context *ctx) {
    qd_aligned_free(ctx->snap_pool);
    ctx->snap_pool = NULL;
}

static qd_status check(qd_context *ctx, int seq, int slot) {
    if (seq < 0 || seq >= ctx->params.max_seqs)
        return qd_seterr(&ctx->err, QD_ERR_INVALID_ARG, "sequence %d out of range [0, %d)", seq, ctx->params.max_seqs);
    if (slot < 0 || slot >= ctx->params.n_snap_slots)
        return qd_seterr(&ctx->err, QD_ERR_INVALID_ARG, "snapshot slot %d out of range [0, %d)", slot,
                         ctx->params.n_snap_slots);
    return QD_OK;
}

static float *cpu_slot(const qd_context *ctx, int slot) {
    return ctx->snap_pool + (size_t)slot * (qd_state_conv_floats(ctx) + qd_state_ssm_floats(ctx));
}

qd_status qd_snap_save(qd_context *ctx, int seq, int slot) {
    QD_TRY(check(ctx, seq, slot));
    if (ctx->tp) return qd_tp_snap_save(ctx, seq, slot);
#ifdef QD_HAVE_CUDA
    if (ctx->cuda) return qd_cuda_snap_save(ctx, seq, slot);
#endif
    float *d = cpu_slot(ctx, slot);
    const size_t nc = qd_state_conv_floats(ctx);
    memcpy(d, ctx->seqs[seq].conv, nc * sizeof(float));
    memcpy(d + nc, ctx->seqs[seq].ssm, qd_state_ssm_floats(ctx) * sizeof(float));
    return QD_OK;
}

qd_status qd_snap_attach(qd_context *ctx, int seq, int slot, int length, const int32_t *blocks, int n_blocks) {
    QD_TRY(check(ctx, seq, slot));
    QD_TRY(qd_seq_attach_blocks(ctx, seq, length, blocks, n_blocks));
    return qd_snap_load_state(ctx, seq, slot);
}

qd_status qd_snap_load_state(qd_context *ctx, int seq, int slot) {
    QD_TRY(check(ctx, seq, slot));
    if (ctx->tp) return qd_tp_snap_load(ctx, seq, slot);
#ifdef QD_HAVE_CUDA
    if (ctx->cuda) return qd_cuda_snap_load(ctx, seq, slot);
#endif
    const float *s = cpu_slot(ctx, slot);
    const size_t nc = qd_state_conv_floats(ctx);
    memcpy(ctx->seqs[seq].conv, s, nc * sizeof(float));
    memcpy(ctx->seqs[seq].ssm, s + nc, qd_state_ssm_floats(ctx) * sizeof(float));
    return QD_OK;
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
    if (ctx->tp) return qd_tp_snap_read(ctx, slot, dst);
#ifdef QD_HAVE_CUDA
    if (ctx->cuda) return qd_cuda_snap_read(ctx, slot, dst);
#endif
    memcpy(dst, cpu_slot(ctx, slot), qd_snap_slot_bytes(ctx));
    return QD_OK;
}
