/* Routing statistics (qd_context_count_experts / qd_context_routed_experts, what `qdelta
 * bench` counts its MoE roofline by) on the CPU backend, default model (qwen3_next, 8
 * experts, top-2): a one-token step touches exactly k distinct experts in every MoE layer;
 * a batch of copies of one sequence touches what one of them does (batch-invariant mode, so
 * that the copies' rows are the same bits and near-tied experts cannot flip between them); a batch of different
 * sequences at least that and at most min(E, B k) per layer, and the count is recomputed
 * for every forward (a later one-token step falls back to k per layer); prefill counts
 * too. Turned off, or before a counted forward, there is no count; a dense model and a
 * tensor-parallel split refuse, naming why. */
#include <string.h>

#include "qd_fixtures.h"
#include "qd_test.h"
#include "qdelta.h"

#define MODEL "models/qdelta-tiny"

static int64_t step_pairs(qd_context *ctx, const int32_t *toks, int B) {
    qd_span sp[8];
    int32_t next[8];
    for (int b = 0; b < B; b++) sp[b] = (qd_span){b, &toks[b], 1, QD_LOGITS_LAST};
    CHECK(qd_forward_greedy(ctx, sp, B, next) == QD_OK);
    int64_t p = -1;
    CHECK(qd_context_routed_experts(ctx, &p) == QD_OK);
    return p;
}

static void check_moe(qd_test_rng *rng) {
    qd_model *m = qd_fixture_load(MODEL, QD_BACKEND_CPU, 1);
    if (!m) return;
    const int L = qd_model_moe_layers(m), E = qd_model_experts(m), k = qd_model_experts_per_token(m);
    CHECKF(L > 0 && E == 8 && k == 2, "%s: %d MoE layers, %d experts, k %d", MODEL, L, E, k);
    CHECK(qd_model_expert_bytes(m) > 0);
    qd_context_params cp = qd_context_default_params();
    cp.max_seqs = 8;
    cp.max_ctx = 128;
    cp.max_batch = 128;
    cp.batch_invariant = 1; /* rows of equal content route alike whatever the batch */
    qd_context *ctx = NULL;
    CHECK(qd_context_create(m, &cp, &ctx) == QD_OK);
    if (!ctx) {
        qd_model_free(m);
        return;
    }
    const int V = qd_model_vocab_size(m);
    int32_t toks[8];
    int64_t p;
    CHECK(qd_context_routed_experts(ctx, &p) == QD_ERR_INVALID_ARG); /* not counting */
    CHECK(qd_context_count_experts(ctx, 1) == QD_OK);
    CHECK(qd_context_routed_experts(ctx, &p) == QD_ERR_INVALID_ARG); /* no counted forward yet */
    /* prefill: sequences 0..3 one fixed prompt, 4..7 fresh random ones */
    int32_t prompt[24];
    for (int b = 0; b < 8; b++) {
        for (int i = 0; i < 24; i++)
            prompt[i] = b < 4 ? (int32_t)((i * 7919 + 13) % V) : (int32_t)(qd_test_next(rng) % (uint64_t)V);
        qd_span sp = {b, prompt, 24, QD_LOGITS_LAST};
        int32_t t;
        CHECK(qd_forward_greedy(ctx, &sp, 1, &t) == QD_OK);
        toks[b] = t;
        CHECK(qd_context_routed_experts(ctx, &p) == QD_OK);
        CHECKF(p >= (int64_t)L * k && p <= (int64_t)L * E, "prefill of 24 tokens: %lld pairs", (long long)p);
    }
    /* sequences 0..3 hold the same prompt: the same token routes alike */
    int32_t same[4] = {toks[0], toks[0], toks[0], toks[0]};
    CHECK(toks[1] == toks[0] && toks[2] == toks[0] && toks[3] == toks[0]);
    p = step_pairs(ctx, same, 4);
    CHECKF(p == (int64_t)L * k, "four copies of one sequence: %lld pairs, want %d", (long long)p, L * k);
    /* one token: k per layer exactly */
    p = step_pairs(ctx, same, 1);
    CHECKF(p == (int64_t)L * k, "one token: %lld pairs, want %d", (long long)p, L * k);
    /* eight different sequences */
    p = step_pairs(ctx, toks, 8);
    CHECKF(p >= (int64_t)L * k && p <= (int64_t)L * E, "eight sequences: %lld pairs", (long long)p);
    printf("eight sequences: %.2f distinct experts per layer (of %d)\n", (double)p / L, E);
    CHECK(step_pairs(ctx, toks, 1) == (int64_t)L * k); /* recounted */
    CHECK(qd_context_count_experts(ctx, 0) == QD_OK);
    CHECK(qd_context_routed_experts(ctx, &p) == QD_ERR_INVALID_ARG);
    qd_context_free(ctx);
    qd_model_free(m);
}

static void check_refusals(void) {
    qd_model *d = qd_fixture_load("tests/fixtures/qwen3_5_dense_f32", QD_BACKEND_CPU, 1);
    if (d) {
        qd_context *ctx = NULL;
        CHECK(qd_context_create(d, NULL, &ctx) == QD_OK);
        if (ctx) {
            CHECK(qd_model_moe_layers(d) == 0 && qd_model_expert_bytes(d) == 0 && qd_model_experts(d) == 0);
            CHECK(qd_context_count_experts(ctx, 1) == QD_ERR_UNSUPPORTED);
            CHECKF(strstr(qd_context_errmsg(ctx), "no MoE layers") != NULL, "dense: %s", qd_context_errmsg(ctx));
            qd_context_free(ctx);
        }
        qd_model_free(d);
    }
    qd_model *s = qd_fixture_load(MODEL, QD_BACKEND_CPU, 2);
    if (s) {
        qd_context *ctx = NULL;
        CHECK(qd_context_create(s, NULL, &ctx) == QD_OK);
        if (ctx) {
            CHECK(qd_context_count_experts(ctx, 1) == QD_ERR_UNSUPPORTED);
            CHECKF(strstr(qd_context_errmsg(ctx), "split") != NULL, "split: %s", qd_context_errmsg(ctx));
            qd_context_free(ctx);
        }
        qd_model_free(s);
    }
}

int main(void) {
    qd_test_rng rng = qd_test_rng_from_env();
    check_moe(&rng);
    check_refusals();
    return qd_test_finish("test_expert_counts");
}
