/* Helpers for the snapshot and prefix-cache tests (include after qd_test.h): a
 * sequence made to hold n tokens with a given GDN state without running the model
 * (KV blocks reserved, length set, state written wherever the backend keeps it),
 * and states drawn from a seed so that a restored state can be checked bit for bit
 * against the one its prefix should have. */
#ifndef QD_TEST_SNAP_H
#define QD_TEST_SNAP_H

#include <stdlib.h>
#include <string.h>

#include "model/model.h"

/* conv then ssm floats of one state, every one drawn from `seed`: no two prefixes
 * share a state, and a state that is all zeros or left over is caught. */
static inline void qd_test_state_fill(uint64_t seed, float *state, size_t n) {
    qd_test_rng r = {seed * 0x9e3779b97f4a7c15ull | 1};
    for (size_t i = 0; i < n; i++) state[i] = qd_test_uniform(&r);
}

/* Floats of one sequence's state payload (a split model's: every rank's slice). */
static inline size_t qd_test_state_floats(const qd_context *ctx) { return qd_snap_slot_bytes(ctx) / sizeof(float); }

/* seq := n tokens (blocks reserved for them, nothing computed) and this state, written
 * as a snapshot image so that a split model's ranks get their slices. */
static inline qd_status qd_test_fake_prefix(qd_context *ctx, int seq, int n, const float *state) {
    qd_status s = qd_seq_reset(ctx, seq);
    if (s == QD_OK) s = qd_kv_reserve(ctx, seq, n);
    if (s != QD_OK) return s;
    ctx->seqs[seq].length = n;
    const size_t size = qd_seq_state_size(ctx);
    unsigned char *img = calloc(1, size);
    if (!img) return QD_ERR_OOM;
    const int64_t len = n;
    memcpy(img, &len, sizeof len);
    memcpy(img + QD_SNAP_HEADER, state, qd_snap_slot_bytes(ctx));
    s = qd_seq_state_restore(ctx, seq, img, size);
    free(img);
    return s;
}

/* 1 when seq holds exactly `state` (bits) at length n; img is scratch of
 * qd_seq_state_size bytes. */
static inline int qd_test_state_is(qd_context *ctx, int seq, int n, const float *state, void *img) {
    if (qd_seq_state_save(ctx, seq, img, qd_seq_state_size(ctx)) != QD_OK) return 0;
    int64_t len;
    memcpy(&len, img, sizeof len);
    return len == n && ctx->seqs[seq].length == n &&
           !memcmp((const unsigned char *)img + QD_SNAP_HEADER, state, qd_snap_slot_bytes(ctx));
}

#endif
