/* Sampler: distributions against an independent reference, greedy, seeds, penalties,
 * logprobs, vocab_limit, parameter validation. */
#include <float.h>
#include <string.h>

#include "qd_test.h"
#include "runtime/sampler.h"

/* ------------------------------------------------------------ reference */

/* The expected sampling distribution, computed the slow obvious way in double: full
 * sort, then min_p, top_k, top_p exactly as the header documents. */
static void reference_probs(const float *y, int n, const qd_sampling_params *p, double *prob) {
    int *order = malloc(sizeof(int) * (size_t)n);
    double t = p->temperature, m = -INFINITY;
    for (int i = 0; i < n; i++) {
        order[i] = i;
        if (y[i] > m) m = y[i];
    }
    /* insertion sort by (logit desc, id asc); n is small in these tests */
    for (int i = 1; i < n; i++) {
        int x = order[i], j = i - 1;
        while (j >= 0 && (y[order[j]] < y[x] || (y[order[j]] == y[x] && order[j] > x))) {
            order[j + 1] = order[j];
            j--;
        }
        order[j + 1] = x;
    }
    double *w = calloc((size_t)n, sizeof(double));
    int kept = 0;
    for (int r = 0; r < n; r++) {
        int i = order[r];
        double wi = exp(((double)y[i] - m) / t);
        if (p->min_p > 0 && wi < p->min_p) continue;
        if (p->top_k > 0 && kept >= p->top_k) continue;
        w[i] = wi;
        kept++;
    }
    double z = 0;
    for (int i = 0; i < n; i++) z += w[i];
    if (p->top_p < 1.0f) {
        double cum = 0;
        for (int r = 0; r < n; r++) {
            int i = order[r];
            if (w[i] == 0) continue;
            if (cum >= p->top_p * z) w[i] = 0;
            else cum += w[i];
        }
        z = cum;
    }
    for (int i = 0; i < n; i++) prob[i] = w[i] / z;
    free(w);
    free(order);
}

/* Draws `draws` tokens and compares frequencies with the reference: excluded tokens
 * must never appear; kept ones must pass a chi-square test at p = 0.001 and a
 * per-token 5-sigma bound. Seeds are fixed, so this is deterministic, not flaky. */
static void check_distribution(const char *what, const float *logits, int n, qd_sampling_params p,
                               int draws) {
    qd_err err = {0};
    qd_sampler *s = NULL;
    CHECKF(qd_sampler_create(&p, n, &s, &err) == QD_OK, "%s: %s", what, err.msg);
    if (!s) return;
    double *prob = malloc(sizeof(double) * (size_t)n);
    reference_probs(logits, n, &p, prob);
    long *count = calloc((size_t)n, sizeof(long));
    float *row = malloc(sizeof(float) * (size_t)n);
    memcpy(row, logits, sizeof(float) * (size_t)n);
    for (int d = 0; d < draws; d++) {
        qd_sample_result r;
        if (qd_sampler_sample(s, row, &r, &err) != QD_OK) {
            CHECKF(0, "%s: %s", what, err.msg);
            break;
        }
        count[r.token]++;
    }
    CHECKF(memcmp(row, logits, sizeof(float) * (size_t)n) == 0, "%s: logits row modified", what);
    double chi2 = 0;
    int df = -1, excluded_seen = 0, sigma_ok = 1;
    for (int i = 0; i < n; i++) {
        if (prob[i] == 0) {
            if (count[i]) excluded_seen++;
            continue;
        }
        double e = prob[i] * draws;
        chi2 += (count[i] - e) * (count[i] - e) / e;
        df++;
        double f = (double)count[i] / draws, sd = sqrt(prob[i] * (1 - prob[i]) / draws);
        if (fabs(f - prob[i]) > 5 * sd + 1e-12) sigma_ok = 0;
    }
    /* chi-square 0.999 quantiles for df = 0..10 */
    static const double crit[] = {0, 10.83, 13.82, 16.27, 18.47, 20.52, 22.46, 24.32, 26.12, 27.88, 29.59};
    double c = df <= 10 ? crit[df] : df + 4.0 * sqrt(2.0 * df) + 10; /* loose normal approx */
    CHECKF(excluded_seen == 0, "%s: %d excluded tokens were drawn", what, excluded_seen);
    CHECKF(df == 0 ? chi2 == 0 : chi2 < c, "%s: chi2 = %.2f with df %d (limit %.2f)", what, chi2, df, c);
    CHECKF(sigma_ok, "%s: a token frequency is > 5 sigma from its probability", what);
    printf("  %-34s kept %2d  chi2 %6.2f (df %d)\n", what, df + 1, chi2, df);
    free(row);
    free(count);
    free(prob);
    qd_sampler_free(s);
}

static const float L8[8] = {1.0f, 2.0f, 0.5f, -1.0f, 3.0f, 0.0f, 2.5f, -0.5f};

static void test_distributions(void) {
    const int N = 20000;
    qd_sampling_params p = qd_sampling_default_params();
    p.seed = 1;
    check_distribution("T=1", L8, 8, p, N);
    p.temperature = 0.7f; p.seed = 2;
    check_distribution("T=0.7", L8, 8, p, N);
    p.temperature = 1.5f; p.top_k = 3; p.seed = 3;
    check_distribution("T=1.5 top_k=3", L8, 8, p, N);
    p = qd_sampling_default_params(); p.top_p = 0.8f; p.seed = 4;
    check_distribution("top_p=0.8", L8, 8, p, N);
    p = qd_sampling_default_params(); p.min_p = 0.1f; p.seed = 5;
    check_distribution("min_p=0.1", L8, 8, p, N);
    p = qd_sampling_default_params(); p.min_p = 0.05f; p.top_k = 5; p.top_p = 0.9f;
    p.temperature = 0.8f; p.seed = 6;
    check_distribution("T=0.8 min_p=.05 top_k=5 top_p=.9", L8, 8, p, N);
    p = qd_sampling_default_params(); p.top_k = 1; p.seed = 7;
    check_distribution("top_k=1", L8, 8, p, 2000);
    p = qd_sampling_default_params(); p.top_p = 0.01f; p.seed = 8;
    check_distribution("top_p=0.01", L8, 8, p, 2000);
    /* Ties: equal logits share the mass; top_k=2 of three equal keeps the lower ids. */
    static const float tie[5] = {0.5f, 2.0f, 2.0f, 2.0f, -3.0f};
    p = qd_sampling_default_params(); p.top_k = 2; p.seed = 9;
    check_distribution("ties top_k=2", tie, 5, p, N);
    /* -inf logits (masked tokens) are never drawn. */
    static const float masked[6] = {-INFINITY, 1.0f, -INFINITY, 0.0f, 1.5f, -INFINITY};
    p = qd_sampling_default_params(); p.seed = 10;
    check_distribution("-inf masked", masked, 6, p, N);
    p.top_p = 0.95f; p.seed = 11;
    check_distribution("-inf masked top_p=.95", masked, 6, p, N);
}

/* A wider vocabulary, random logits: which tokens can appear must match the reference
 * set exactly, for top-k and for the incremental top-p (several chunks deep). */
static void test_random_support(qd_test_rng *rng) {
    enum { V = 3000 };
    static float y[V];
    static double prob[V];
    for (int i = 0; i < V; i++) y[i] = 2.0f * qd_test_normal(rng);
    struct { int k; float top_p, min_p, t; } cfg[] = {
        {50, 1.0f, 0.0f, 1.0f}, {0, 0.9f, 0.0f, 1.0f}, {0, 0.99f, 0.0f, 3.0f},
        {200, 0.95f, 0.0f, 2.0f}, {0, 1.0f, 0.2f, 1.0f}, {1000, 0.5f, 0.01f, 5.0f}};
    for (size_t c = 0; c < sizeof cfg / sizeof cfg[0]; c++) {
        qd_sampling_params p = qd_sampling_default_params();
        p.top_k = cfg[c].k; p.top_p = cfg[c].top_p; p.min_p = cfg[c].min_p;
        p.temperature = cfg[c].t; p.seed = 100 + c;
        reference_probs(y, V, &p, prob);
        qd_err err = {0};
        qd_sampler *s;
        if (qd_sampler_create(&p, V, &s, &err) != QD_OK) { CHECKF(0, "%s", err.msg); continue; }
        int bad = 0, n_kept = 0;
        for (int i = 0; i < V; i++) n_kept += prob[i] > 0;
        for (int d = 0; d < 3000; d++) {
            qd_sample_result r;
            CHECK(qd_sampler_sample(s, y, &r, &err) == QD_OK);
            if (prob[r.token] == 0) bad++;
        }
        CHECKF(bad == 0, "config %zu (kept %d): %d draws outside the reference support", c, n_kept, bad);
        qd_sampler_free(s);
    }
}

static void test_greedy(void) {
    qd_sampling_params p = qd_sampling_default_params();
    p.temperature = 0.0f;
    qd_err err = {0};
    qd_sampler *s;
    CHECK(qd_sampler_create(&p, 8, &s, &err) == QD_OK);
    qd_sample_result r;
    float row[8];
    memcpy(row, L8, sizeof row);
    for (int i = 0; i < 5; i++) {
        CHECK(qd_sampler_sample(s, row, &r, &err) == QD_OK);
        CHECK(r.token == 4);
    }
    static float tie[8] = {0.0f, 7.0f, -1.0f, 7.0f, 7.0f, 2.0f, 6.9f, 7.0f};
    CHECK(qd_sampler_sample(s, tie, &r, &err) == QD_OK);
    CHECKF(r.token == 1, "ties go to the lowest id, got %d", r.token);
    qd_sampler_free(s);
    /* Tiny temperatures are greedy too, whatever the seed, and filters don't matter. */
    p.temperature = 1e-7f; p.top_p = 0.5f; p.top_k = 3; p.seed = 12345;
    CHECK(qd_sampler_create(&p, 8, &s, &err) == QD_OK);
    for (int i = 0; i < 5; i++) {
        CHECK(qd_sampler_sample(s, row, &r, &err) == QD_OK);
        CHECK(r.token == 4);
    }
    qd_sampler_free(s);
}

static void draw_seq(uint64_t seed, int32_t *seq, int n) {
    qd_sampling_params p = qd_sampling_default_params();
    p.seed = seed; p.temperature = 1.3f; p.top_p = 0.95f;
    qd_err err = {0};
    qd_sampler *s;
    if (qd_sampler_create(&p, 8, &s, &err) != QD_OK) return;
    float row[8];
    memcpy(row, L8, sizeof row);
    for (int i = 0; i < n; i++) {
        qd_sample_result r;
        qd_sampler_sample(s, row, &r, &err);
        seq[i] = r.token;
    }
    qd_sampler_free(s);
}

static void test_seeds(void) {
    enum { N = 200 };
    int32_t a[N], b[N], c[N];
    draw_seq(42, a, N);
    draw_seq(42, b, N);
    draw_seq(43, c, N);
    CHECK(memcmp(a, b, sizeof a) == 0);
    CHECK(memcmp(a, c, sizeof a) != 0);
    /* reset reseeds: the sequence replays */
    qd_sampling_params p = qd_sampling_default_params();
    p.seed = 7;
    qd_err err = {0};
    qd_sampler *s;
    CHECK(qd_sampler_create(&p, 8, &s, &err) == QD_OK);
    float row[8];
    memcpy(row, L8, sizeof row);
    int32_t x[50], y2[50];
    qd_sample_result r;
    for (int i = 0; i < 50; i++) { qd_sampler_sample(s, row, &r, &err); x[i] = r.token; }
    qd_sampler_reset(s);
    for (int i = 0; i < 50; i++) { qd_sampler_sample(s, row, &r, &err); y2[i] = r.token; }
    CHECK(memcmp(x, y2, sizeof x) == 0);
    qd_sampler_free(s);
}

static int close_to(float a, float b) { return fabsf(a - b) <= 1e-6f * (1 + fabsf(b)); }

static void test_penalties(void) {
    enum { V = 10 };
    const float raw[V] = {2.0f, -1.5f, 0.0f, 3.0f, -0.5f, 1.25f, 4.0f, -2.0f, 0.5f, 1.0f};
    qd_sampling_params p = qd_sampling_default_params();
    p.repetition_penalty = 1.3f;
    p.presence_penalty = 0.6f;
    p.frequency_penalty = 0.25f;
    qd_err err = {0};
    qd_sampler *s;
    CHECK(qd_sampler_create(&p, V, &s, &err) == QD_OK);
    const int32_t prompt[] = {0, 1, 1, 2};
    CHECK(qd_sampler_accept_prompt(s, prompt, 4, &err) == QD_OK);
    /* generated: 3 three times, 1 once, 4 twice */
    const int32_t gen[] = {3, 1, 3, 4, 3, 4};
    for (int i = 0; i < 6; i++) CHECK(qd_sampler_accept(s, gen[i], &err) == QD_OK);
    int count[V] = {0};
    for (int i = 0; i < 6; i++) count[gen[i]]++;
    int in_prompt[V] = {0};
    for (int i = 0; i < 4; i++) in_prompt[prompt[i]] = 1;
    float y[V];
    memcpy(y, raw, sizeof y);
    qd_sampler_apply_penalties(s, y);
    for (int i = 0; i < V; i++) {
        double e = raw[i];
        if (in_prompt[i] || count[i]) e = e > 0 ? e / 1.3 : e * 1.3; /* once per token */
        e -= 0.25 * count[i] + (count[i] > 0 ? 0.6 : 0.0);        /* generated only */
        CHECKF(close_to(y[i], (float)e), "token %d: penalised %g, expected %g", i, y[i], e);
    }
    /* Specific values, spelled out: */
    CHECK(close_to(y[0], 2.0f / 1.3f));                         /* prompt only, positive */
    CHECK(close_to(y[2], 0.0f));                                /* 0 stays 0 */
    CHECK(close_to(y[3], 3.0f / 1.3f - 0.75f - 0.6f));          /* generated 3x */
    CHECK(close_to(y[4], -0.5f * 1.3f - 0.5f - 0.6f));          /* negative: multiplied */
    CHECK(close_to(y[6], 4.0f));                                /* never seen */
    /* Greedy sees the penalised logits: 6 stays best; penalise it and the next wins. */
    qd_sample_result r;
    float row[V];
    memcpy(row, raw, sizeof row);
    p.temperature = 0;
    qd_sampler *g;
    CHECK(qd_sampler_create(&p, V, &g, &err) == QD_OK);
    CHECK(qd_sampler_sample(g, row, &r, &err) == QD_OK && r.token == 6);
    CHECK(qd_sampler_accept(g, 6, &err) == QD_OK);
    CHECK(qd_sampler_accept(g, 6, &err) == QD_OK);
    /* 6: 4/1.3 - 0.5 - 0.6 = 1.977 < 3.0 -> token 3 wins */
    CHECK(qd_sampler_sample(g, row, &r, &err) == QD_OK && r.token == 3);
    CHECK(memcmp(row, raw, sizeof row) == 0); /* restored */
    /* Its logprob is still the raw one. */
    double z = 0;
    for (int i = 0; i < V; i++) z += exp(raw[i]);
    CHECK(fabs(r.logprob - (raw[3] - log(z))) < 1e-5);
    qd_sampler_free(g);
    /* Presence/frequency alone ignore the prompt. */
    p = qd_sampling_default_params();
    p.frequency_penalty = 1.0f;
    CHECK(qd_sampler_create(&p, V, &g, &err) == QD_OK);
    CHECK(qd_sampler_accept_prompt(g, prompt, 4, &err) == QD_OK);
    memcpy(y, raw, sizeof y);
    qd_sampler_apply_penalties(g, y);
    CHECK(memcmp(y, raw, sizeof y) == 0);
    CHECK(qd_sampler_accept(g, 5, &err) == QD_OK);
    qd_sampler_apply_penalties(g, y);
    CHECK(close_to(y[5], 0.25f) && close_to(y[0], 2.0f));
    /* Negative penalties encourage. */
    qd_sampler_free(g);
    p.frequency_penalty = 0; p.presence_penalty = -2.0f;
    CHECK(qd_sampler_create(&p, V, &g, &err) == QD_OK);
    CHECK(qd_sampler_accept(g, 7, &err) == QD_OK);
    memcpy(y, raw, sizeof y);
    qd_sampler_apply_penalties(g, y);
    CHECK(close_to(y[7], 0.0f));
    qd_sampler_reset(g); /* forgets history */
    memcpy(y, raw, sizeof y);
    qd_sampler_apply_penalties(g, y);
    CHECK(memcmp(y, raw, sizeof y) == 0);
    qd_sampler_free(g);
    /* out-of-range ids are errors */
    CHECK(qd_sampler_accept(s, V, &err) == QD_ERR_INVALID_ARG && strstr(err.msg, "token id"));
    const int32_t badp[] = {1, -3};
    CHECK(qd_sampler_accept_prompt(s, badp, 2, &err) == QD_ERR_INVALID_ARG && strstr(err.msg, "-3"));
    qd_sampler_free(s);
}

static void test_logprobs(qd_test_rng *rng) {
    enum { V = 1000 };
    static float y[V], yc[V];
    for (int i = 0; i < V; i++) y[i] = 3.0f * qd_test_normal(rng);
    y[17] = y[18] = 20.0f; /* a tie at the top: lower id first */
    double m = -INFINITY, z = 0;
    for (int i = 0; i < V; i++) if (y[i] > m) m = y[i];
    for (int i = 0; i < V; i++) z += exp(y[i] - m);
    double lse = m + log(z);
    qd_sampling_params p = qd_sampling_default_params();
    p.n_logprobs = 20; p.temperature = 0.6f; p.top_k = 40; p.repetition_penalty = 1.5f; p.seed = 3;
    qd_err err = {0};
    qd_sampler *s;
    CHECK(qd_sampler_create(&p, V, &s, &err) == QD_OK);
    CHECK(qd_sampler_accept(s, 17, &err) == QD_OK); /* penalties don't change logprobs */
    memcpy(yc, y, sizeof y);
    for (int t = 0; t < 20; t++) {
        qd_sample_result r;
        CHECK(qd_sampler_sample(s, yc, &r, &err) == QD_OK);
        CHECKF(fabs(r.logprob - (y[r.token] - lse)) < 1e-5, "token %d logprob %g vs %g", r.token,
               r.logprob, y[r.token] - lse);
        CHECK(r.n_top == 20);
        int sorted = 1, exact = 1;
        for (int i = 0; i < r.n_top; i++) {
            if (i && r.top[i].logprob > r.top[i - 1].logprob) sorted = 0;
            if (fabs(r.top[i].logprob - (y[r.top[i].id] - lse)) > 1e-5) exact = 0;
        }
        CHECK(sorted && exact);
        CHECK(r.top[0].id == 17 && r.top[1].id == 18);
        /* nothing outside the list beats its last entry */
        int beaten = 0;
        for (int i = 0; i < V; i++) {
            int listed = 0;
            for (int j = 0; j < r.n_top; j++) listed |= r.top[j].id == i;
            if (!listed && y[i] - lse > r.top[r.n_top - 1].logprob) beaten = 1;
        }
        CHECK(!beaten);
    }
    CHECK(memcmp(yc, y, sizeof y) == 0);
    qd_sampler_free(s);
    /* n_logprobs larger than the vocabulary: clipped. */
    p = qd_sampling_default_params();
    p.n_logprobs = 20;
    CHECK(qd_sampler_create(&p, 8, &s, &err) == QD_OK);
    qd_sample_result r;
    float row[8];
    memcpy(row, L8, sizeof row);
    CHECK(qd_sampler_sample(s, row, &r, &err) == QD_OK && r.n_top == 8 && r.top[0].id == 4);
    double sum = 0;
    for (int i = 0; i < 8; i++) sum += exp(r.top[i].logprob);
    CHECK(fabs(sum - 1.0) < 1e-5);
    qd_sampler_free(s);
}

static void test_vocab_limit(void) {
    /* 6 real tokens + 4 padding rows with large garbage logits */
    float row[10] = {0.1f, 1.0f, 0.3f, 2.0f, -1.0f, 0.5f, 50.0f, 60.0f, NAN, INFINITY};
    qd_sampling_params p = qd_sampling_default_params();
    p.vocab_limit = 6; p.n_logprobs = 10; p.seed = 99;
    qd_err err = {0};
    qd_sampler *s;
    CHECK(qd_sampler_create(&p, 10, &s, &err) == QD_OK);
    int bad = 0, n_top_ok = 1;
    double z = 0;
    for (int i = 0; i < 6; i++) z += exp(row[i]);
    for (int d = 0; d < 5000; d++) {
        qd_sample_result r;
        if (qd_sampler_sample(s, row, &r, &err) != QD_OK) { CHECKF(0, "%s", err.msg); break; }
        if (r.token >= 6) bad++;
        if (r.n_top != 6) n_top_ok = 0;
        for (int j = 0; j < r.n_top; j++) if (r.top[j].id >= 6) n_top_ok = 0;
        if (d == 0) CHECK(fabs(r.logprob - (row[r.token] - log(z))) < 1e-5);
    }
    CHECK(bad == 0 && n_top_ok);
    qd_sampler_free(s);
    p.temperature = 0; p.top_k = 2;
    CHECK(qd_sampler_create(&p, 10, &s, &err) == QD_OK);
    qd_sample_result r;
    CHECK(qd_sampler_sample(s, row, &r, &err) == QD_OK && r.token == 3);
    qd_sampler_free(s);
    /* the same row without a limit is rejected: the NaN is now a real logit */
    p.vocab_limit = 0;
    CHECK(qd_sampler_create(&p, 10, &s, &err) == QD_OK);
    CHECK(qd_sampler_sample(s, row, &r, &err) == QD_ERR_INVALID_ARG && strstr(err.msg, "logits[8]"));
    qd_sampler_free(s);
}

#define EXPECT_BAD(field_assign, name)                                                        \
    do {                                                                                      \
        qd_sampling_params bp = qd_sampling_default_params();                                 \
        bp.field_assign;                                                                      \
        qd_sampler *bs = (qd_sampler *)1;                                                     \
        qd_err be = {0};                                                                      \
        qd_status st = qd_sampler_create(&bp, 100, &bs, &be);                                 \
        CHECKF(st == QD_ERR_INVALID_ARG && strstr(be.msg, name) && bs == NULL,                \
               #field_assign ": status %s, message '%s'", qd_status_name(st), be.msg);        \
    } while (0)

static void test_bad_params(void) {
    EXPECT_BAD(temperature = -0.5f, "temperature");
    EXPECT_BAD(temperature = NAN, "temperature");
    EXPECT_BAD(top_p = 0.0f, "top_p");
    EXPECT_BAD(top_p = 1.01f, "top_p");
    EXPECT_BAD(top_p = -1.0f, "top_p");
    EXPECT_BAD(top_k = -1, "top_k");
    EXPECT_BAD(min_p = 1.5f, "min_p");
    EXPECT_BAD(min_p = -0.1f, "min_p");
    EXPECT_BAD(n_logprobs = 21, "n_logprobs");
    EXPECT_BAD(n_logprobs = -1, "n_logprobs");
    EXPECT_BAD(repetition_penalty = 0.0f, "repetition_penalty");
    EXPECT_BAD(presence_penalty = 2.5f, "presence_penalty");
    EXPECT_BAD(frequency_penalty = -3.0f, "frequency_penalty");
    EXPECT_BAD(vocab_limit = 101, "vocab_limit");
    qd_sampling_params p = qd_sampling_default_params();
    qd_err err = {0};
    qd_sampler *s;
    CHECK(qd_sampler_create(&p, 0, &s, &err) == QD_ERR_INVALID_ARG && strstr(err.msg, "vocab_size"));
    p.n_logprobs = 20; p.top_p = 1.0f; p.top_k = 100000; /* top_k above V is just "all" */
    CHECK(qd_sampler_create(&p, 100, &s, &err) == QD_OK);
    float row[100] = {0};
    row[3] = -INFINITY;
    qd_sample_result r;
    CHECK(qd_sampler_sample(s, row, &r, &err) == QD_OK && r.token != 3);
    for (int i = 0; i < 100; i++) row[i] = -INFINITY;
    CHECK(qd_sampler_sample(s, row, &r, &err) == QD_ERR_INVALID_ARG && strstr(err.msg, "-inf"));
    qd_sampler_free(s);
}

static int float_desc(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return x < y ? 1 : x > y ? -1 : 0;
}

static const float *nucleus_keys;
static int by_logit_desc(const void *a, const void *b) {
    int i = *(const int *)a, j = *(const int *)b;
    float x = nucleus_keys[i], y = nucleus_keys[j];
    if (x != y) return x < y ? 1 : -1;
    return i - j;
}

/* Speed and correctness at a real vocabulary size (Qwen: 151936 rows, 248320 for 3.5). */
static void test_large_vocab(qd_test_rng *rng) {
    enum { V = 248320, REAL = 248077 };
    float *y = malloc(sizeof(float) * V);
    for (int i = 0; i < V; i++) y[i] = 2.5f * qd_test_normal(rng);
    struct { const char *name; int k; float top_p, t; } cfg[] = {
        {"plain T=0.8", 0, 1.0f, 0.8f}, {"top_k=50", 50, 1.0f, 0.8f},
        {"top_p=0.9", 0, 0.9f, 0.8f}, {"top_p=0.95 T=1.5", 0, 0.95f, 1.5f},
        {"top_k=20 top_p=0.8", 20, 0.8f, 0.7f}};
    for (size_t c = 0; c < sizeof cfg / sizeof cfg[0]; c++) {
        qd_sampling_params p = qd_sampling_default_params();
        p.top_k = cfg[c].k; p.top_p = cfg[c].top_p; p.temperature = cfg[c].t;
        p.vocab_limit = REAL; p.n_logprobs = 5; p.repetition_penalty = 1.1f; p.seed = c;
        qd_err err = {0};
        qd_sampler *s;
        if (qd_sampler_create(&p, V, &s, &err) != QD_OK) { CHECKF(0, "%s", err.msg); continue; }
        for (int i = 0; i < 500; i++) qd_sampler_accept(s, (int32_t)(qd_test_next(rng) % REAL), &err);
        /* the k-th best penalised logit: every top_k draw must be at least that */
        float kth = -INFINITY;
        float *pen = malloc(sizeof(float) * V);
        memcpy(pen, y, sizeof(float) * V);
        qd_sampler_apply_penalties(s, pen);
        /* the nucleus by brute force (full sort), for the top_p-only configs */
        char *in_nucleus = calloc(V, 1);
        if (p.top_k == 0 && p.top_p < 1.0f) {
            int *order = malloc(sizeof(int) * REAL);
            for (int i = 0; i < REAL; i++) order[i] = i;
            nucleus_keys = pen;
            qsort(order, REAL, sizeof(int), by_logit_desc);
            double m = pen[order[0]], z = 0, cum = 0;
            for (int i = 0; i < REAL; i++) z += exp((pen[i] - m) / p.temperature);
            for (int r = 0; r < REAL && cum < p.top_p * z; r++) {
                in_nucleus[order[r]] = 1;
                cum += exp((pen[order[r]] - m) / p.temperature);
            }
            free(order);
        } else {
            memset(in_nucleus, 1, V);
        }
        if (p.top_k > 0) {
            float *sorted = malloc(sizeof(float) * REAL);
            memcpy(sorted, pen, sizeof(float) * REAL);
            qsort(sorted, REAL, sizeof(float), float_desc);
            kth = sorted[p.top_k - 1];
            free(sorted);
        }
        const int iters = 30;
        struct timespec t0, t1; /* CPU time: wall time is noise on a shared machine */
        clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t0);
        int ok = 1, in_top_k = 1;
        for (int i = 0; i < iters; i++) {
            qd_sample_result r;
            if (qd_sampler_sample(s, y, &r, &err) != QD_OK || r.token >= REAL) ok = 0;
            else if (pen[r.token] < kth) in_top_k = 0;
            else if (!in_nucleus[r.token]) in_top_k = 0;
        }
        clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t1);
        CHECK(ok);
        CHECKF(in_top_k, "%s: a draw outside the top %d / the nucleus", cfg[c].name, p.top_k);
        free(in_nucleus);
        free(pen);
        double ms = ((t1.tv_sec - t0.tv_sec) * 1e3 + (t1.tv_nsec - t0.tv_nsec) / 1e6) / iters;
        printf("  V=%d %-22s %.2f ms/sample (CPU time)\n", V, cfg[c].name, ms);
        qd_sampler_free(s);
    }
    free(y);
}

int main(void) {
    qd_test_rng rng = qd_test_rng_from_env();
    test_distributions();
    test_random_support(&rng);
    test_greedy();
    test_seeds();
    test_penalties();
    test_logprobs(&rng);
    test_vocab_limit();
    test_bad_params();
    test_large_vocab(&rng);
    return qd_test_finish("test_sampler");
}
