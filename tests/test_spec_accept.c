/* The accept step of speculative decoding (runtime/spec_accept.h).
 *   - greedy: the longest matching prefix plus the target's token after it;
 *   - sampled: the output tokens are distributed as the target's own distribution,
 *     whatever the draft distribution. Checked by chi-square on many seeded draws, on
 *     random distributions (first and second output token), and end to end on the default
 *     model (models/qdelta-tiny): draft tokens drawn from a flatter distribution, a verify
 *     span of [last token, d0, d1] through the real forward, accept, rollback; the first
 *     output token's frequencies against plain sampling with qd_sampler at the same
 *     temperature (a two-sample chi-square). The bound is the chi-square's mean plus 6
 *     standard deviations (a false alarm about once in 10^8 runs; a wrong accept rule,
 *     e.g. keeping every draft or sampling the residual from p, exceeds it by far). */
#include <string.h>

#include "model/model.h" /* qd_seq_state_save / restore: one prompt state, many draws */
#include "qd_test.h"
#include "qdelta.h"
#include "runtime/sampler.h"
#include "runtime/spec_accept.h"

static qd_test_rng trng;

static int draw_from(const float *q, int n, qd_spec_rng *r) {
    const double u = qd_spec_rng_uniform(r);
    double cum = 0;
    for (int i = 0; i < n; i++) {
        cum += q[i];
        if (u < cum) return i;
    }
    return n - 1;
}

static double chi2_bound(int df) { return df + 6.0 * sqrt(2.0 * df); }

/* sum (obs - N p)^2 / (N p) over tokens, bins with N p < 5 lumped together. */
static double chi2_vs(const long *obs, const float *p, int n, long N, int *df) {
    double x = 0, lump_o = 0, lump_e = 0;
    int bins = 0;
    for (int i = 0; i < n; i++) {
        const double e = (double)N * p[i];
        if (e < 5) {
            lump_o += obs[i];
            lump_e += e;
            continue;
        }
        x += (obs[i] - e) * (obs[i] - e) / e;
        bins++;
    }
    if (lump_e >= 5) {
        x += (lump_o - lump_e) * (lump_o - lump_e) / lump_e;
        bins++;
    }
    *df = bins - 1;
    return x;
}

static void random_dist(float *p, int n, float sharp) {
    double z = 0;
    for (int i = 0; i < n; i++) z += p[i] = expf(sharp * qd_test_normal(&trng));
    for (int i = 0; i < n; i++) p[i] = (float)(p[i] / z);
}

static void check_greedy(void) {
    int32_t out[5];
    const int32_t d[4] = {5, 6, 7, 8};
    const int32_t all[5] = {5, 6, 7, 8, 9}, none[5] = {1, 6, 7, 8, 9}, two[5] = {5, 6, 0, 8, 9};
    CHECK(qd_spec_accept_greedy(d, 4, all, out) == 5 && out[3] == 8 && out[4] == 9);
    CHECK(qd_spec_accept_greedy(d, 4, none, out) == 1 && out[0] == 1);
    CHECK(qd_spec_accept_greedy(d, 4, two, out) == 3 && out[0] == 5 && out[1] == 6 && out[2] == 0);
    CHECK(qd_spec_accept_greedy(d, 0, all, out) == 1 && out[0] == 5);
}

/* Random target p [k+1][n] and draft q [k][n]; N steps with fresh drafts from q. */
static void check_sampled_random(int n, int k, long N) {
    float *p = malloc(sizeof(float) * (size_t)(k + 1) * n), *q = malloc(sizeof(float) * (size_t)k * n);
    double *resid = malloc(sizeof(double) * (size_t)n);
    long *first = calloc((size_t)n, sizeof(long)), *second = calloc((size_t)n, sizeof(long));
    for (int i = 0; i <= k; i++) random_dist(p + (size_t)i * n, n, 1.5f);
    for (int i = 0; i < k; i++) random_dist(q + (size_t)i * n, n, 1.5f);
    qd_spec_rng r;
    qd_spec_rng_seed(&r, qd_test_next(&trng));
    long n_second = 0, kept = 0;
    for (long t = 0; t < N; t++) {
        int32_t draft[4], out[5];
        for (int i = 0; i < k; i++) draft[i] = draw_from(q + (size_t)i * n, n, &r);
        const int m = qd_spec_accept_sampled(p, q, draft, k, n, &r, resid, out);
        first[out[0]]++;
        if (m >= 2) second[out[1]]++, n_second++;
        kept += m - 1;
    }
    int df1, df2;
    const double x1 = chi2_vs(first, p, n, N, &df1), x2 = chi2_vs(second, p + n, n, n_second, &df2);
    printf("  random n=%d k=%d: %ld steps, mean kept %.3f; chi2 first %.1f (df %d, bound %.1f), second %.1f (df %d)\n",
           n, k, N, (double)kept / N, x1, df1, chi2_bound(df1), x2, df2);
    CHECKF(x1 < chi2_bound(df1), "first token: chi2 %.1f, df %d", x1, df1);
    CHECKF(x2 < chi2_bound(df2), "second token: chi2 %.1f, df %d", x2, df2);
    /* the rule is not trivial: with q != p some drafts are rejected, some kept */
    CHECK(kept > 0 && kept < N * k);
    /* q == p keeps every draft */
    long all_kept = 0;
    for (long t = 0; t < 2000; t++) {
        int32_t draft[4], out[5];
        for (int i = 0; i < k; i++) draft[i] = draw_from(p + (size_t)i * n, n, &r);
        all_kept += qd_spec_accept_sampled(p, p, draft, k, n, &r, resid, out) == k + 1;
    }
    CHECK(all_kept == 2000);
    free(p);
    free(q);
    free(resid);
    free(first);
    free(second);
}

/* End to end on the default model. */
static void check_default_model(long N) {
    qd_model_params mp = qd_model_default_params();
    mp.path = "models/qdelta-tiny";
    mp.n_threads = 2;
    qd_model *m = NULL;
    char err[1024];
    if (qd_model_load(&mp, &m, err, sizeof err) != QD_OK) {
        CHECKF(0, "load models/qdelta-tiny: %s", err);
        return;
    }
    const int V = qd_model_vocab_size(m), K = 2;
    const float T = 0.8f, Tq = 1.6f;
    qd_context_params cp = qd_context_default_params();
    cp.max_ctx = 64;
    cp.max_batch = 64;
    cp.speculative_tokens = K;
    cp.batch_invariant = 1;
    qd_context *ctx = NULL;
    CHECKF(qd_context_create(m, &cp, &ctx) == QD_OK, "%s", qd_model_errmsg(m));
    /* a prompt of ordinary ids; the last one is fed by the verify span */
    const int32_t prompt[12] = {12, 400, 33, 901, 77, 1500, 8, 250, 61, 3000, 19, 640};
    qd_span pre = {.seq = 0, .tokens = prompt, .n_tokens = 11, .logits = QD_LOGITS_NONE};
    CHECK(ctx && qd_forward(ctx, &pre, 1, NULL) == QD_OK);
    const size_t ssz = qd_seq_state_size(ctx);
    void *snap = malloc(ssz);
    CHECK(qd_seq_state_save(ctx, 0, snap, ssz) == QD_OK);
    /* the target's row after the prompt, for the draft distribution and plain sampling */
    float *row = malloc(sizeof(float) * V), *q = malloc(sizeof(float) * (size_t)K * V);
    float *lg = malloc(sizeof(float) * (size_t)(K + 1) * V), *p = malloc(sizeof(float) * (size_t)(K + 1) * V);
    double *resid = malloc(sizeof(double) * V);
    long *spec = calloc((size_t)V, sizeof(long)), *plain = calloc((size_t)V, sizeof(long));
    qd_span last = {.seq = 0, .tokens = prompt + 11, .n_tokens = 1, .logits = QD_LOGITS_LAST};
    CHECK(qd_forward(ctx, &last, 1, row) == QD_OK);
    CHECK(qd_seq_state_restore(ctx, 0, snap, ssz) == QD_OK);
    /* drafts: d0 from the row at temperature Tq (close to, not equal to, the target), d1
     * likewise from the same row (a poor draft for position 1) */
    qd_spec_probs(row, V, Tq, q);
    memcpy(q + V, q, sizeof(float) * V);
    qd_spec_rng r;
    qd_spec_rng_seed(&r, qd_test_next(&trng));
    long kept = 0;
    const uint8_t verify = 1;
    for (long t = 0; t < N; t++) {
        int32_t span[3] = {prompt[11], draw_from(q, V, &r), draw_from(q + V, V, &r)}, out[3];
        qd_span vs = {.seq = 0, .tokens = span, .n_tokens = 3, .logits = QD_LOGITS_ALL};
        const qd_forward_args a = {.spans = &vs, .n_spans = 1, .verify = &verify, .logits = lg};
        if (qd_forward_ex(ctx, &a) != QD_OK) {
            CHECKF(0, "verify forward: %s", qd_context_errmsg(ctx));
            break;
        }
        for (int i = 0; i <= K; i++) qd_spec_probs(lg + (size_t)i * V, V, T, p + (size_t)i * V);
        const int n_out = qd_spec_accept_sampled(p, q, span + 1, K, V, &r, resid, out);
        spec[out[0]]++;
        kept += n_out - 1;
        CHECK(qd_seq_accept(ctx, 0, n_out) == QD_OK);
        if (qd_seq_state_restore(ctx, 0, snap, ssz) != QD_OK) {
            CHECKF(0, "restore: %s", qd_context_errmsg(ctx));
            break;
        }
    }
    /* without speculation: the project's sampler at temperature T on the same row */
    qd_sampling_params sp = qd_sampling_default_params();
    sp.temperature = T;
    sp.seed = qd_test_next(&trng);
    qd_sampler *s = NULL;
    qd_err e;
    qd_err_clear(&e);
    CHECK(qd_sampler_create(&sp, V, &s, &e) == QD_OK);
    for (long t = 0; s && t < N; t++) {
        qd_sample_result res;
        if (qd_sampler_sample(s, row, &res, &e) != QD_OK) break;
        plain[res.token]++;
    }
    qd_sampler_free(s);
    /* two-sample chi-square over tokens seen >= 10 times in both runs together */
    double x = 0, lump_a = 0, lump_b = 0;
    int bins = 0;
    for (int i = 0; i < V; i++) {
        const double a = spec[i], b = plain[i];
        if (a + b < 10) {
            lump_a += a, lump_b += b;
            continue;
        }
        x += (a - b) * (a - b) / (a + b);
        bins++;
    }
    if (lump_a + lump_b >= 10) x += (lump_a - lump_b) * (lump_a - lump_b) / (lump_a + lump_b), bins++;
    printf("  default model, K=%d, T=%.1f, draft T=%.1f: %ld steps, mean drafts kept %.3f; two-sample chi2 %.1f "
           "(df %d, bound %.1f)\n",
           K, T, Tq, N, (double)kept / N, x, bins - 1, chi2_bound(bins - 1));
    CHECK(bins >= 5);
    CHECKF(x < chi2_bound(bins - 1), "speculative vs plain first-token frequencies: chi2 %.1f, df %d", x, bins - 1);
    CHECK(kept > 0 && kept < N * K);
    free(snap);
    free(row);
    free(q);
    free(lg);
    free(p);
    free(resid);
    free(spec);
    free(plain);
    qd_context_free(ctx);
    qd_model_free(m);
}

int main(void) {
    const char *env = getenv("QD_TEST_SEED");
    trng.s = env ? strtoull(env, NULL, 10) : (uint64_t)time(NULL);
    if (!trng.s) trng.s = 1;
    printf("test_spec_accept: QD_TEST_SEED=%llu\n", (unsigned long long)trng.s);
    check_greedy();
    check_sampled_random(7, 3, 200000);
    check_sampled_random(40, 2, 200000);
    check_default_model(15000);
    return qd_test_finish("test_spec_accept");
}
