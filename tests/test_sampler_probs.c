/* qd_sampler_probs (the distribution qd_sampler_sample draws from, which speculative
 * sampling accepts drafts against) and qd_sampler_report, on fresh random logits over an
 * awkward vocabulary (997 ids, 911 of them real) for each filter path: plain temperature,
 * min_p, top_k through the heap and through quickselect, top_p alone, all of them with
 * the three penalties, greedy:
 *   - probs equal a naive double-precision computation of the documented steps within
 *     2e-6, zero exactly where the filters remove a token and past vocab_limit;
 *   - 40000 draws of qd_sampler_sample follow probs (chi-square at 1e-4, cells expected < 20 pooled);
 *   - qd_sampler_report of a drawn token is the result sample reported for it. */
#include <math.h>
#include <string.h>

#include "qd_test.h"
#include "runtime/sampler.h"

#define V 997
#define LIMIT 911
#define DRAWS 40000

static int cmp_desc(const void *a, const void *b, const double *x) {
    const int i = *(const int *)a, j = *(const int *)b;
    if (x[i] != x[j]) return x[i] > x[j] ? -1 : 1;
    return i - j;
}
static const double *g_x;
static int by_value(const void *a, const void *b) { return cmp_desc(a, b, g_x); }

/* The documented steps in double: penalties, greedy or temperature, min_p, top_k, top_p. */
static void naive(const qd_sampling_params *p, const float *logits, const int *seen_prompt, int n_prompt,
                  const int *gen, int n_gen, double *out) {
    double x[V];
    int count[V] = {0}, seen[V] = {0};
    for (int i = 0; i < n_prompt; i++) seen[seen_prompt[i]] = 1;
    for (int i = 0; i < n_gen; i++) seen[gen[i]] = 1, count[gen[i]]++;
    for (int i = 0; i < LIMIT; i++) {
        double v = logits[i];
        if (seen[i] && p->repetition_penalty != 1.0f) v = v > 0 ? v / p->repetition_penalty : v * p->repetition_penalty;
        v -= (double)p->frequency_penalty * count[i];
        if (count[i] > 0) v -= p->presence_penalty;
        x[i] = (float)v; /* the sampler keeps penalised logits in float */
    }
    memset(out, 0, sizeof(double) * V);
    int arg = 0;
    for (int i = 1; i < LIMIT; i++)
        if (x[i] > x[arg]) arg = i;
    if (p->temperature < QD_SAMPLER_GREEDY_EPS) {
        out[arg] = 1;
        return;
    }
    double w[V];
    for (int i = 0; i < LIMIT; i++) {
        w[i] = exp((x[i] - x[arg]) / p->temperature);
        if (w[i] < p->min_p) w[i] = 0;
    }
    int idx[V], n = 0;
    for (int i = 0; i < LIMIT; i++)
        if (w[i] > 0) idx[n++] = i;
    g_x = x;
    qsort(idx, (size_t)n, sizeof(int), by_value);
    if (p->top_k > 0 && p->top_k < n) n = p->top_k;
    double z = 0;
    for (int i = 0; i < n; i++) z += w[idx[i]];
    if (p->top_p < 1.0f) {
        double cum = 0;
        int keep = 0;
        while (keep < n && cum < p->top_p * z) cum += w[idx[keep++]];
        n = keep;
        z = cum;
    }
    for (int i = 0; i < n; i++) out[idx[i]] = w[idx[i]] / z;
}

int main(void) {
    qd_test_rng rng = qd_test_rng_from_env();
    struct { const char *name; float t, min_p, top_p, rep, pres, freq; int top_k; } cases[] = {
        {"temperature", 0.9f, 0, 1, 1, 0, 0, 0},
        {"min_p", 1.1f, 0.05f, 1, 1, 0, 0, 0},
        {"top_k heap", 0.8f, 0, 1, 1, 0, 0, 9},
        {"top_k quickselect", 1.0f, 0, 1, 1, 0, 0, 700},
        {"top_p", 0.7f, 0, 0.85f, 1, 0, 0, 0},
        {"everything + penalties", 0.8f, 0.01f, 0.9f, 1.3f, 0.4f, 0.2f, 40},
        {"greedy + penalties", 0.0f, 0, 1, 1.5f, 0.5f, 0.3f, 0},
    };
    float logits[V];
    double ref[V];
    float probs[V];
    int counts[V];
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        for (int i = 0; i < V; i++) logits[i] = 2.5f * qd_test_normal(&rng);
        int prompt[12], gen[6];
        for (int i = 0; i < 12; i++) prompt[i] = (int)(qd_test_next(&rng) % LIMIT);
        for (int i = 0; i < 6; i++) gen[i] = i < 3 ? prompt[i] : (int)(qd_test_next(&rng) % LIMIT);
        qd_sampling_params sp = qd_sampling_default_params();
        sp.temperature = cases[c].t;
        sp.min_p = cases[c].min_p;
        sp.top_p = cases[c].top_p;
        sp.top_k = cases[c].top_k;
        sp.repetition_penalty = cases[c].rep;
        sp.presence_penalty = cases[c].pres;
        sp.frequency_penalty = cases[c].freq;
        sp.vocab_limit = LIMIT;
        sp.n_logprobs = 5;
        sp.seed = qd_test_next(&rng);
        qd_sampler *s = NULL;
        qd_err err = {0};
        CHECKF(qd_sampler_create(&sp, V, &s, &err) == QD_OK, "%s", err.msg);
        if (!s) continue;
        int32_t p32[12];
        for (int i = 0; i < 12; i++) p32[i] = prompt[i];
        CHECK(qd_sampler_accept_prompt(s, p32, 12, &err) == QD_OK);
        for (int i = 0; i < 6; i++) CHECK(qd_sampler_accept(s, gen[i], &err) == QD_OK);
        float before[V];
        memcpy(before, logits, sizeof before);
        CHECK(qd_sampler_probs(s, logits, probs, &err) == QD_OK);
        CHECKF(!memcmp(before, logits, sizeof before), "%s: the row was not restored", cases[c].name);
        naive(&sp, logits, prompt, 12, gen, 6, ref);
        double worst = 0, sum = 0;
        int zero_mismatch = 0;
        for (int i = 0; i < V; i++) {
            worst = fmax(worst, fabs(probs[i] - ref[i]));
            zero_mismatch += (probs[i] == 0) != (ref[i] == 0);
            sum += probs[i];
        }
        CHECKF(worst < 2e-6 && zero_mismatch == 0 && fabs(sum - 1) < 1e-5, "%s: |probs - naive| %.3g, %d zero mismatches, sum %.7f",
               cases[c].name, worst, zero_mismatch, sum);
        /* draws follow probs; report reproduces what sample reported */
        memset(counts, 0, sizeof counts);
        int report_ok = 1;
        for (int d = 0; d < DRAWS; d++) {
            qd_sample_result a, b;
            CHECK(qd_sampler_sample(s, logits, &a, &err) == QD_OK);
            counts[a.token]++;
            if (d < 50) {
                CHECK(qd_sampler_report(s, logits, a.token, &b, &err) == QD_OK);
                report_ok &= a.token == b.token && a.logprob == b.logprob && a.n_top == b.n_top &&
                             !memcmp(a.top, b.top, sizeof(a.top[0]) * (size_t)a.n_top);
            }
        }
        CHECKF(report_ok, "%s: qd_sampler_report differs from the sample's report", cases[c].name);
        double chi = 0, pool_e = 0;
        int df = -1, pool_c = 0, outside = 0;
        for (int i = 0; i < V; i++) {
            if (probs[i] == 0) {
                outside += counts[i];
                continue;
            }
            const double e = probs[i] * DRAWS;
            if (e < 20) { /* the chi-square approximation wants well-filled cells */
                pool_e += e, pool_c += counts[i];
                continue;
            }
            chi += (counts[i] - e) * (counts[i] - e) / e, df++;
        }
        if (pool_e >= 20) chi += (pool_c - pool_e) * (pool_c - pool_e) / pool_e, df++;
        const double crit = df > 0 ? df * pow(1 - 2.0 / (9 * df) + 3.719 * sqrt(2.0 / (9 * df)), 3) : 0;
        printf("  %-24s |probs - naive| %.2g; %d draws: chi-square %.1f on %d (bound %.1f), %d outside the support\n",
               cases[c].name, worst, DRAWS, chi, df, crit, outside);
        CHECKF(outside == 0 && (df <= 0 || chi < crit), "%s: chi-square %.1f on %d, %d draws outside", cases[c].name, chi,
               df, outside);
        qd_sampler_free(s);
    }
    /* bad arguments */
    qd_sampler *s = NULL;
    qd_err err = {0};
    qd_sampling_params sp = qd_sampling_default_params();
    CHECK(qd_sampler_create(&sp, V, &s, &err) == QD_OK);
    CHECK(qd_sampler_probs(s, NULL, probs, &err) == QD_ERR_INVALID_ARG);
    logits[3] = NAN;
    CHECK(qd_sampler_probs(s, logits, probs, &err) == QD_ERR_INVALID_ARG && strstr(err.msg, "NaN"));
    logits[3] = 0;
    qd_sample_result r;
    CHECK(qd_sampler_report(s, logits, V, &r, &err) == QD_ERR_INVALID_ARG && strstr(err.msg, "token id"));
    qd_sampler_free(s);
    return qd_test_finish("test_sampler_probs");
}
