/* qd_forward_args.hidden_all (the MTP head's inputs over a prefill chunk): the hidden
 * state of every row of the flagged spans equals, bit for bit, what qd_forward_hidden
 * gives for the same rows as logit rows (QD_LOGITS_ALL), in a ragged batch of three
 * spans of awkward lengths of which two are flagged, next to the logit rows the batch
 * asks for; bad arguments get errors naming them. On every MTP fixture. */
#include <string.h>

#include "qd_fixtures.h"
#include "model/model.h"
#include "qd_test.h"

static void check(const char *dir) {
    char err[512];
    qd_model_params mp = qd_model_default_params();
    mp.path = dir;
    mp.n_threads = 2;
    qd_model *m = NULL;
    CHECKF(qd_model_load(&mp, &m, err, sizeof err) == QD_OK, "%s: %s", dir, err);
    if (!m) return;
    const int V = qd_model_vocab_size(m), H = qd_model_hidden_size(m);
    qd_context_params cp = qd_context_default_params();
    cp.max_seqs = 6;
    cp.max_ctx = 64;
    cp.max_batch = 128;
    qd_context *ctx = NULL;
    CHECKF(qd_context_create(m, &cp, &ctx) == QD_OK, "%s", qd_model_errmsg(m));
    if (!ctx) {
        qd_model_free(m);
        return;
    }
    qd_test_rng rng = qd_test_rng_from_env(); /* fresh inputs each run, the seed printed */
    enum { A = 13, B = 1, C = 30 };
    int32_t ta[A], tb[B], tc[C];
    for (int i = 0; i < A; i++) ta[i] = (int32_t)(qd_test_next(&rng) % (uint64_t)V);
    for (int i = 0; i < B; i++) tb[i] = (int32_t)(qd_test_next(&rng) % (uint64_t)V);
    for (int i = 0; i < C; i++) tc[i] = (int32_t)(qd_test_next(&rng) % (uint64_t)V);
    /* sequences 0..2: the batch under test; 3..5 the same spans with every row a logit row */
    const qd_span spans[3] = {{0, ta, A, QD_LOGITS_LAST}, {1, tb, B, QD_LOGITS_LAST}, {2, tc, C, QD_LOGITS_NONE}};
    const uint8_t flags[3] = {1, 0, 1};
    float *all = malloc(sizeof(float) * (A + C) * H), *logits = malloc(sizeof(float) * 2 * V);
    float *ref = malloc(sizeof(float) * (A + B + C) * H);
    const qd_forward_args a = {.spans = spans, .n_spans = 3, .logits = logits, .hidden_all = flags, .all_hidden = all};
    CHECKF(qd_forward_ex(ctx, &a) == QD_OK, "%s: %s", dir, qd_context_errmsg(ctx));
    const qd_span refs[3] = {{3, ta, A, QD_LOGITS_ALL}, {4, tb, B, QD_LOGITS_ALL}, {5, tc, C, QD_LOGITS_ALL}};
    CHECK(qd_forward_hidden(ctx, refs, 3, NULL, ref) == QD_OK);
    CHECKF(!memcmp(all, ref, sizeof(float) * A * H), "%s: span 0's hidden states differ", dir);
    CHECKF(!memcmp(all + (size_t)A * H, ref + (size_t)(A + B) * H, sizeof(float) * C * H),
           "%s: span 2's hidden states differ", dir);
    /* errors */
    const qd_forward_args no_buf = {.spans = spans, .n_spans = 1, .logits = logits, .hidden_all = flags};
    CHECK(qd_forward_ex(ctx, &no_buf) == QD_ERR_INVALID_ARG && strstr(qd_context_errmsg(ctx), "all_hidden"));
    /* qd_mtp_adopt (the engine's prefix-cache restore): needs params.mtp, n <= length */
    CHECK(qd_mtp_adopt(ctx, 0, 1) == QD_ERR_UNSUPPORTED);
    qd_context *mc = NULL;
    cp.mtp = 1;
    CHECK(qd_context_create(m, &cp, &mc) == QD_OK);
    if (mc) {
        const qd_span s0 = {0, ta, A, QD_LOGITS_NONE};
        CHECK(qd_forward(mc, &s0, 1, NULL) == QD_OK);
        CHECK(qd_mtp_adopt(mc, 0, A + 1) == QD_ERR_INVALID_ARG && strstr(qd_context_errmsg(mc), "MTP length"));
        CHECK(qd_mtp_adopt(mc, 9, 1) == QD_ERR_INVALID_ARG);
        CHECK(qd_mtp_adopt(mc, 0, A) == QD_OK && qd_mtp_length(mc, 0) == A);
        qd_context_free(mc);
    }
    free(all);
    free(logits);
    free(ref);
    qd_context_free(ctx);
    qd_model_free(m);
}

int main(void) {
    const char *names[3] = {"qwen3_5_dense_mtp", "qwen3_5_moe_fused_mtp", "qwen3_next_moe_mtp"};
    for (int i = 0; i < 3; i++) {
        char dir[256];
        snprintf(dir, sizeof dir, "tests/fixtures_mtp/%s", names[i]);
        check(dir);
    }
    return qd_test_finish("test_hidden_all");
}
