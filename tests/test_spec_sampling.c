/* Sampled speculative decoding through the engine keeps the output distribution: on the
 * qwen3_5_dense_mtp fixture, N seeded requests (temperature 0.8, top_k 12, top_p 0.9, a
 * repetition penalty and a logit_bias, so every filter of the sampler is in the
 * distribution drafts are accepted against) generate 4 tokens each with K = 2, drafts
 * forced to fixed tokens of middling probability (so both the accept and the residual
 * draw happen at both draft positions). Given the most frequent first token t1, the
 * second token's frequencies must match the target distribution computed here from a
 * plain forward in double precision (chi-square, seeded so the verdict is fixed), and
 * the third token's given (t1, draft 0) too; a token the filters remove never appears.
 * The same statistical approach as test_spec_accept, here through the whole engine. */
#include <math.h>
#include <pthread.h>
#include <string.h>

#include "qd_fixtures.h"
#include "qd_test.h"
#include "runtime/engine_internal.h"

#define N_SAMPLES 3000
#define N_PROMPT 20
#define TEMP 0.8
#define TOP_K 12
#define TOP_P 0.9
#define REP 1.2
#define BIAS_TOKEN 7
#define BIAS 1.5f

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_cv = PTHREAD_COND_INITIALIZER;
static int g_done;

typedef struct out3 {
    int32_t t[3];
    int n;
} out3;

static int on_event(void *user, const qd_engine_event *ev) {
    out3 *o = user;
    pthread_mutex_lock(&g_mu);
    if (ev->has_token && o->n < 3) o->t[o->n++] = ev->sample.token;
    if (ev->finish != QD_FINISH_NONE) {
        g_done++;
        pthread_cond_broadcast(&g_cv);
    }
    pthread_mutex_unlock(&g_mu);
    return 0;
}

/* Drafts of the first verify step by the request's first token: d0[t1] the second most
 * likely second token, d1[t1] the second most likely third token after (t1, d0[t1]). */
static int32_t g_d0[512], g_d1[512];
static out3 *g_outs;
static int32_t fixed_draft(void *user, uint64_t id, int n_generated, int j) {
    (void)user;
    if (n_generated != 1 || j > 1) return -1; /* later steps: the MTP's own */
    const int32_t t1 = g_outs[id - 1].t[0];  /* reported on this (the engine) thread */
    return j == 0 ? g_d0[t1] : g_d1[t1];
}

/* The target distribution after prompt + gen [n_gen]: logit_bias, the repetition penalty
 * over every distinct token seen, temperature, top-k, then top-p, in double. */
static void reference(qd_model *m, const int32_t *prompt, const int32_t *gen, int n_gen, double *p) {
    const int V = qd_model_vocab_size(m);
    qd_context_params cp = qd_context_default_params();
    cp.max_seqs = 1;
    cp.max_ctx = 64;
    cp.max_batch = 64;
    qd_context *ctx = NULL;
    CHECK(qd_context_create(m, &cp, &ctx) == QD_OK);
    int32_t toks[64];
    memcpy(toks, prompt, sizeof(int32_t) * N_PROMPT);
    if (n_gen) memcpy(toks + N_PROMPT, gen, sizeof(int32_t) * (size_t)n_gen);
    float *row = malloc(sizeof(float) * V);
    qd_span s = {.seq = 0, .tokens = toks, .n_tokens = N_PROMPT + n_gen, .logits = QD_LOGITS_LAST};
    CHECK(qd_forward(ctx, &s, 1, row) == QD_OK);
    double *x = malloc(sizeof(double) * V);
    for (int i = 0; i < V; i++) x[i] = row[i];
    if (BIAS_TOKEN < V) x[BIAS_TOKEN] += BIAS;
    for (int i = 0; i < V; i++) {
        int seen = 0;
        for (int j = 0; j < N_PROMPT + n_gen && !seen; j++) seen = toks[j] == i;
        if (seen) x[i] = x[i] > 0 ? x[i] / REP : x[i] * REP;
    }
    double mx = -INFINITY, z = 0;
    for (int i = 0; i < V; i++) mx = fmax(mx, x[i]);
    for (int i = 0; i < V; i++) z += p[i] = exp((x[i] - mx) / TEMP);
    for (int i = 0; i < V; i++) p[i] /= z;
    /* top-k: the k largest (ties to the lower id) */
    int *order = malloc(sizeof(int) * V);
    for (int i = 0; i < V; i++) order[i] = i;
    for (int a = 0; a < V; a++) /* selection sort of the first TOP_K: V is 320 */
        for (int b = a + 1; b < V && a < TOP_K; b++)
            if (p[order[b]] > p[order[a]] || (p[order[b]] == p[order[a]] && order[b] < order[a])) {
                int t = order[a];
                order[a] = order[b];
                order[b] = t;
            }
    double kz = 0;
    for (int a = 0; a < TOP_K; a++) kz += p[order[a]];
    /* top-p over the renormalised k: the fewest most likely reaching TOP_P of the mass */
    double cum = 0;
    int keep = 0;
    while (keep < TOP_K && cum < TOP_P * kz) cum += p[order[keep++]];
    double *q = calloc((size_t)V, sizeof(double));
    for (int a = 0; a < keep; a++) q[order[a]] = p[order[a]] / cum;
    memcpy(p, q, sizeof(double) * V);
    free(q);
    free(order);
    free(x);
    free(row);
    qd_context_free(ctx);
}

/* Chi-square of counts [V] (n in all) against p, added to *chi and *df: categories
 * expected at least 5 times alone, the rest pooled (when the pool is); a token with
 * p = 0 must never be drawn. */
static int fit(const int *counts, int n, const double *p, int V, double *chi, int *df) {
    int zero_hits = 0, cats = 0, pool_c = 0;
    double pool_e = 0;
    for (int i = 0; i < V; i++) {
        if (p[i] <= 0) {
            zero_hits += counts[i];
            continue;
        }
        const double e = p[i] * n;
        if (e < 5) {
            pool_e += e;
            pool_c += counts[i];
            continue;
        }
        *chi += (counts[i] - e) * (counts[i] - e) / e;
        cats++;
    }
    if (pool_e >= 5) {
        *chi += (pool_c - pool_e) * (pool_c - pool_e) / pool_e;
        cats++;
    }
    if (cats > 1) *df += cats - 1;
    return zero_hits;
}

/* The 1e-4 upper quantile of chi-square(df) (Wilson-Hilferty). */
static double chi_crit(int df) {
    const double k = df, z = 3.719;
    return k * pow(1 - 2 / (9 * k) + z * sqrt(2 / (9 * k)), 3);
}

int main(void) {
    const char *dir = "tests/fixtures_mtp/qwen3_5_dense_mtp";
    char path[512], err[512];
    snprintf(path, sizeof path, "%s/prompt.ids", dir);
    char *t = qd_test_read_file(path, NULL);
    int32_t prompt[256];
    const int np = t ? qd_fixture_parse_ids(t, prompt, 256) : 0;
    free(t);
    qd_model_params mp = qd_model_default_params();
    mp.path = dir;
    mp.n_threads = 2;
    qd_model *m = NULL;
    CHECKF(np >= N_PROMPT && qd_model_load(&mp, &m, err, sizeof err) == QD_OK, "%s: %s", dir, err);
    if (!m) return qd_test_finish("test_spec_sampling");
    const int V = qd_model_vocab_size(m);

    qd_engine_params ep = qd_engine_default_params();
    ep.max_num_seqs = 16;
    ep.max_model_len = 32;
    ep.max_batch_tokens = 256;
    ep.max_waiting = N_SAMPLES;
    ep.speculative_tokens = 2;
    ep.speculative_always = 1; /* the forced drafts are verified at every step, kept or not */
    qd_engine *e = NULL;
    qd_err qerr = {0};
    CHECKF(qd_engine_create(m, &ep, &e, &qerr) == QD_OK, "%s", qerr.msg);
    if (!e) return qd_test_finish("test_spec_sampling");

    /* every first token the filters allow, its second-token distribution and drafts */
    double *p1 = malloc(sizeof(double) * V), *p2 = malloc(sizeof(double) * V * V), *p3 = malloc(sizeof(double) * V * V);
    reference(m, prompt, NULL, 0, p1);
    for (int t1 = 0; t1 < V; t1++) {
        if (p1[t1] <= 0) continue;
        double *q2 = p2 + (size_t)t1 * V, *q3 = p3 + (size_t)t1 * V;
        reference(m, prompt, &t1, 1, q2);
        int a = -1, b = -1;
        for (int i = 0; i < V; i++) {
            if (a < 0 || q2[i] > q2[a]) b = a, a = i;
            else if (b < 0 || q2[i] > q2[b]) b = i;
        }
        g_d0[t1] = b;
        const int32_t two[2] = {t1, b};
        reference(m, prompt, two, 2, q3);
        a = b = -1;
        for (int i = 0; i < V; i++) {
            if (a < 0 || q3[i] > q3[a]) b = a, a = i;
            else if (b < 0 || q3[i] > q3[b]) b = i;
        }
        g_d1[t1] = b;
    }
    out3 *outs = g_outs = calloc(N_SAMPLES, sizeof *outs);
    e->draft_override = fixed_draft;
    for (int i = 0; i < N_SAMPLES; i++) {
        qd_request_params rq = {0};
        rq.sampling = qd_sampling_default_params();
        rq.sampling.temperature = (float)TEMP;
        rq.sampling.top_k = TOP_K;
        rq.sampling.top_p = (float)TOP_P;
        rq.sampling.repetition_penalty = (float)REP;
        rq.sampling.seed = 1000 + (uint64_t)i;
        rq.n_logit_bias = 1;
        rq.logit_bias[0] = (qd_logit_bias){BIAS_TOKEN, BIAS};
        rq.max_tokens = 4; /* K = 2 drafts after the first token */
        rq.ignore_eos = true;
        uint64_t id;
        CHECK(qd_engine_submit(e, prompt, N_PROMPT, &rq, on_event, &outs[i], &id, &qerr) == QD_OK);
    }
    pthread_mutex_lock(&g_mu);
    while (g_done < N_SAMPLES) pthread_cond_wait(&g_cv, &g_mu);
    pthread_mutex_unlock(&g_mu);
    qd_engine_stats st;
    qd_engine_get_stats(e, &st);
    qd_engine_free(e);

    int *c1 = calloc((size_t)V, sizeof(int)), *c2 = calloc((size_t)V * V, sizeof(int)), *c3 = calloc((size_t)V * V, sizeof(int));
    int *n2 = calloc((size_t)V, sizeof(int)), *n3 = calloc((size_t)V, sizeof(int)), all3 = 1;
    for (int i = 0; i < N_SAMPLES; i++) {
        all3 &= outs[i].n == 3;
        if (outs[i].n < 3) continue;
        const int t1 = outs[i].t[0];
        c1[t1]++;
        c2[(size_t)t1 * V + outs[i].t[1]]++, n2[t1]++;
        if (outs[i].t[1] == g_d0[t1]) c3[(size_t)t1 * V + outs[i].t[2]]++, n3[t1]++;
    }
    CHECK(all3);
    const char *what[3] = {"first token (prefill)", "second token given the first (draft 0 verified)",
                           "third token given the first and a kept draft 0 (draft 1 verified)"};
    for (int w = 0; w < 3; w++) {
        double chi = 0;
        int df = 0, zero = 0, n = 0;
        if (w == 0) zero += fit(c1, N_SAMPLES, p1, V, &chi, &df), n = N_SAMPLES;
        for (int t1 = 0; w > 0 && t1 < V; t1++) {
            const int nn = w == 1 ? n2[t1] : n3[t1];
            if (!nn) continue;
            zero += fit((w == 1 ? c2 : c3) + (size_t)t1 * V, nn, (w == 1 ? p2 : p3) + (size_t)t1 * V, V, &chi, &df);
            n += nn;
        }
        printf("  %s: %d samples, chi-square %.1f on %d degrees of freedom (1e-4 bound %.1f), %d filtered-out tokens\n",
               what[w], n, chi, df, df > 0 ? chi_crit(df) : 0.0, zero);
        CHECKF(df >= 5 && zero == 0 && chi < chi_crit(df), "%s: chi-square %.1f on %d, %d filtered-out", what[w], chi, df,
               zero);
    }
    /* both draft positions were kept sometimes and rejected sometimes */
    printf("  %llu verify steps, %llu drafts, %llu kept (%llu at position 0, %llu at 1)\n",
           (unsigned long long)st.spec_verify_steps, (unsigned long long)st.spec_draft_tokens,
           (unsigned long long)st.spec_accepted_tokens, (unsigned long long)st.spec_accepted_at[0],
           (unsigned long long)st.spec_accepted_at[1]);
    CHECK(st.spec_verify_steps >= N_SAMPLES);
    CHECK(st.spec_accepted_at[0] > N_SAMPLES / 20 && st.spec_accepted_at[0] < st.spec_verify_steps);
    CHECK(st.spec_accepted_at[1] > 0 && st.spec_accepted_at[1] < st.spec_accepted_at[0]);
    free(c1);
    free(n2);
    free(n3);
    free(c2);
    free(c3);
    free(outs);
    free(p1);
    free(p2);
    free(p3);
    qd_model_free(m);
    return qd_test_finish("test_spec_sampling");
}
