/* Paged KV cache and GDN state snapshots on the fp32 fixture checkpoints:
 *   - small blocks (4 tokens) give the same logits as one big block per sequence
 *   - snapshot, decode, restore, decode again == the first decode, bit for bit
 *   - a forked sequence shares its blocks; writing into the shared partial block
 *     copies it (copy on write) and neither sequence sees the other's tokens
 *   - an exhausted pool fails with QD_ERR_CAPACITY and changes nothing; reset frees */
#include <string.h>

#include "model/model.h"
#include "qd_fixtures.h"
#include "qd_test.h"

#define TOL 1e-3

static qd_test_rng rng;

static double rel_diff(const float *a, const float *b, size_t n) {
    double mx = 1e-30, err = 0;
    for (size_t i = 0; i < n; i++) mx = fmax(mx, fabs(b[i]));
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]);
        if (!(d <= err)) err = d;
    }
    return err / mx;
}

static qd_context *make_ctx(qd_model *m, int seqs, int max_ctx, int batch, int bs, int n_blocks) {
    qd_context_params cp = qd_context_default_params();
    cp.max_seqs = seqs;
    cp.max_ctx = max_ctx;
    cp.max_batch = batch;
    cp.kv_block_size = bs;
    cp.n_kv_blocks = n_blocks;
    qd_context *c = NULL;
    if (qd_context_create(m, &cp, &c) != QD_OK) fprintf(stderr, "context: %s\n", qd_model_errmsg(m));
    return c;
}

/* logits of the last position after prefilling ids[0..n) into a fresh context with one
 * block covering everything (the unpaged layout) */
static void ref_last(qd_model *m, const int32_t *ids, int n, float *out) {
    qd_context *c = make_ctx(m, 1, n, n, n, 1);
    qd_span s = {0, ids, n, QD_LOGITS_LAST};
    CHECK(c && qd_forward(c, &s, 1, out) == QD_OK);
    qd_context_free(c);
}

static void check_model(const char *dir) {
    qd_model *m = qd_fixture_load(dir, QD_BACKEND_CPU, 1);
    if (!m) return;
    const int V = qd_model_vocab_size(m);
    int32_t a[64], b[64];
    for (int i = 0; i < 64; i++) {
        a[i] = (int32_t)(qd_test_next(&rng) % (uint64_t)V);
        b[i] = (int32_t)(qd_test_next(&rng) % (uint64_t)V);
    }
    float *row = malloc(sizeof(float) * V * 2), *ref = malloc(sizeof(float) * V);
    float *first = malloc(sizeof(float) * V * 5);

    qd_context *c = make_ctx(m, 3, 40, 64, 4, 24);
    CHECK(qd_kv_total_blocks(c) == 24 && qd_kv_free_blocks(c) == 24);
    qd_span s = {0, a, 18, QD_LOGITS_LAST};
    CHECK(qd_forward(c, &s, 1, row) == QD_OK);
    ref_last(m, a, 18, ref);
    double e = rel_diff(row, ref, V);
    CHECKF(e < TOL, "%s: paged prefill != unpaged: %g", dir, e);
    CHECK(qd_kv_free_blocks(c) == 24 - 5);

    /* snapshot at 18, decode 5, restore, decode the same 5: identical */
    size_t sz = qd_seq_state_size(c);
    void *snap = malloc(sz);
    CHECK(qd_seq_state_save(c, 0, snap, sz) == QD_OK);
    for (int k = 0; k < 5; k++) {
        qd_span d = {0, &a[18 + k], 1, QD_LOGITS_LAST};
        CHECK(qd_forward(c, &d, 1, first + (size_t)k * V) == QD_OK);
    }
    CHECK(qd_seq_length(c, 0) == 23 && qd_kv_free_blocks(c) == 24 - 6);
    CHECK(qd_seq_state_restore(c, 0, snap, sz) == QD_OK);
    CHECK(qd_seq_length(c, 0) == 18 && qd_kv_free_blocks(c) == 24 - 5);
    int same = 1;
    for (int k = 0; k < 5; k++) {
        qd_span d = {0, &a[18 + k], 1, QD_LOGITS_LAST};
        CHECK(qd_forward(c, &d, 1, row) == QD_OK);
        same &= memcmp(row, first + (size_t)k * V, sizeof(float) * V) == 0;
    }
    CHECKF(same, "%s: restore + decode differs from the decode after the snapshot", dir);
    CHECK(qd_seq_state_restore(c, 0, snap, sz - 1) == QD_ERR_INVALID_ARG);

    /* fork at 21 tokens (a partly filled, now shared block) */
    CHECK(qd_seq_state_restore(c, 0, snap, sz) == QD_OK);
    qd_span d3 = {0, &a[18], 3, QD_LOGITS_NONE};
    CHECK(qd_forward(c, &d3, 1, NULL) == QD_OK);
    int free_before = qd_kv_free_blocks(c);
    CHECK(qd_seq_fork(c, 0, 1) == QD_OK);
    CHECK(qd_kv_free_blocks(c) == free_before && qd_seq_length(c, 1) == 21);
    CHECK(qd_kv_blocks_needed(c, 1, 1) == 1); /* the copy of the shared last block */
    qd_span two[2] = {{0, &a[21], 1, QD_LOGITS_LAST}, {1, &b[0], 1, QD_LOGITS_LAST}};
    CHECK(qd_forward(c, two, 2, row) == QD_OK);
    CHECK(qd_kv_free_blocks(c) == free_before - 1);
    ref_last(m, a, 22, ref);
    double e0 = rel_diff(row, ref, V);
    int32_t ab[22];
    memcpy(ab, a, sizeof(int32_t) * 21);
    ab[21] = b[0];
    ref_last(m, ab, 22, ref);
    double e1 = rel_diff(row + V, ref, V);
    /* the original keeps going on its own tokens, unaffected by the fork's write */
    qd_span d = {0, &a[22], 1, QD_LOGITS_LAST};
    CHECK(qd_forward(c, &d, 1, row) == QD_OK);
    ref_last(m, a, 23, ref);
    double e2 = rel_diff(row, ref, V);
    printf("  %s: paged %.2e, fork: original %.2e %.2e, fork %.2e\n", dir, e, e0, e2, e1);
    CHECKF(e0 < TOL && e1 < TOL && e2 < TOL, "%s: forked sequences differ from each alone: %g %g %g", dir, e0, e1, e2);
    CHECK(qd_seq_reset(c, 1) == QD_OK && qd_seq_reset(c, 0) == QD_OK);
    CHECK(qd_kv_free_blocks(c) == 24);
    qd_context_free(c);

    /* exhaustion: 3 blocks of 4 tokens hold 12 */
    c = make_ctx(m, 2, 40, 64, 4, 3);
    qd_span p12 = {0, a, 12, QD_LOGITS_NONE}, p1 = {1, b, 1, QD_LOGITS_LAST};
    CHECK(qd_forward(c, &p12, 1, NULL) == QD_OK);
    CHECK(qd_forward(c, &p1, 1, row) == QD_ERR_CAPACITY);
    CHECKF(strstr(qd_context_errmsg(c), "KV cache pool exhausted") != NULL, "message: %s", qd_context_errmsg(c));
    CHECK(qd_seq_length(c, 1) == 0 && qd_seq_length(c, 0) == 12);
    CHECK(qd_seq_reset(c, 0) == QD_OK && qd_kv_free_blocks(c) == 3);
    CHECK(qd_forward(c, &p1, 1, row) == QD_OK);
    qd_context_free(c);

    free(snap);
    free(row);
    free(ref);
    free(first);
    qd_model_free(m);
}

int main(void) {
    rng = qd_test_rng_from_env();
    char *dirs[64];
    /* fp32 storage: the tightest comparisons */
    const int n = qd_fixture_dirs_named("_f32", "config.json", dirs, 64);
    CHECKF(n >= 0, "no tests/fixtures (run from the repository root)");
    CHECKF(n >= 3, "expected at least 3 f32 fixtures, found %d", n);
    for (int i = 0; i < n; i++) {
        check_model(dirs[i]);
        free(dirs[i]);
    }
    return qd_test_finish("test_kv_cache");
}
