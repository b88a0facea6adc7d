/* Gated DeltaNet delta rule: recurrent and chunked CPU kernels against a
 * double-precision reference of the recurrence written here from the spec
 * (3.3 step 6), on awkward shapes with strided, NaN-poisoned inputs.
 * Ends with an informational throughput measurement (no timing assertion). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend/cpu/cpu_ops.h"
#include "base/clock.h"
#include "base/threadpool.h"
#include "qd_test.h"
#include "qd_test_gdn.h"

typedef struct {
    int hk, hv, dk, dv, T;
    int64_t qs, ks, vs; /* row strides, larger than the rows */
    float *q, *k, *v, *g, *beta, *S0;
} gdn_case;

static float *alloc_nan(size_t n) {
    float *p = malloc(n * sizeof(float));
    if (p)
        for (size_t i = 0; i < n; i++) p[i] = NAN;
    return p;
}

static int make_case(gdn_case *c, qd_test_rng *rng, int hk, int r, int dk, int dv, int T) {
    memset(c, 0, sizeof *c);
    c->hk = hk; c->hv = hk * r; c->dk = dk; c->dv = dv; c->T = T;
    c->qs = (int64_t)hk * dk + 3;
    c->ks = (int64_t)hk * dk + 5;
    c->vs = (int64_t)c->hv * dv + 7;
    c->q = alloc_nan((size_t)T * c->qs);
    c->k = alloc_nan((size_t)T * c->ks);
    c->v = alloc_nan((size_t)T * c->vs);
    c->g = alloc_nan((size_t)T * c->hv);
    c->beta = alloc_nan((size_t)T * c->hv);
    c->S0 = alloc_nan((size_t)c->hv * dk * dv);
    if (!c->q || !c->k || !c->v || !c->g || !c->beta || !c->S0) return 0;
    for (int t = 0; t < T; t++) {
        for (int j = 0; j < hk; j++) {
            qd_test_gdn_unit(rng, c->q + t * c->qs + (int64_t)j * dk, dk, 1.0f / sqrtf((float)dk));
            qd_test_gdn_unit(rng, c->k + t * c->ks + (int64_t)j * dk, dk, 1.0f);
        }
        for (int i = 0; i < c->hv * dv; i++) c->v[t * c->vs + i] = qd_test_normal(rng);
        for (int h = 0; h < c->hv; h++) {
            c->g[(int64_t)t * c->hv + h] = qd_test_gdn_log_decay(rng);
            c->beta[(int64_t)t * c->hv + h] = 0.5f * (qd_test_uniform(rng) + 1.0f) * 0.998f + 0.001f;
        }
    }
    for (size_t i = 0; i < (size_t)c->hv * dk * dv; i++) c->S0[i] = 0.5f * qd_test_normal(rng);
    return 1;
}

static void free_case(gdn_case *c) {
    free(c->q); free(c->k); free(c->v); free(c->g); free(c->beta); free(c->S0);
}

/* Tokens [t0, t0+T) of the case as a span, with its own state and output. */
static qd_gdn_span span_of(const gdn_case *c, int t0, int T, float *S, float *o) {
    qd_gdn_span s = {c->q + t0 * c->qs, c->qs, c->k + t0 * c->ks, c->ks, c->v + t0 * c->vs, c->vs,
                     c->g + (int64_t)t0 * c->hv, c->beta + (int64_t)t0 * c->hv, S,
                     o + (size_t)t0 * c->hv * c->dv, T};
    return s;
}

/* The recurrence in double, literally as in the spec: decay, predict, delta,
 * rank-1 write, read out with the updated state. */
static int reference(const gdn_case *c, double *S, double *o) {
    const int dk = c->dk, dv = c->dv, r = c->hv / c->hk;
    double *m = malloc((size_t)dv * sizeof(double));
    if (!m) return 0;
    for (int i = 0; i < c->hv * dk * dv; i++) S[i] = c->S0[i];
    for (int t = 0; t < c->T; t++) {
        for (int h = 0; h < c->hv; h++) {
            const float *q = c->q + t * c->qs + (int64_t)(h / r) * dk;
            const float *k = c->k + t * c->ks + (int64_t)(h / r) * dk;
            const float *v = c->v + t * c->vs + (int64_t)h * dv;
            const double a = exp((double)c->g[t * c->hv + h]), b = c->beta[t * c->hv + h];
            double *Sh = S + (size_t)h * dk * dv;
            for (int i = 0; i < dk * dv; i++) Sh[i] *= a;
            for (int e = 0; e < dv; e++) {
                double acc = 0;
                for (int i = 0; i < dk; i++) acc += Sh[i * dv + e] * k[i];
                m[e] = b * (v[e] - acc);
            }
            for (int i = 0; i < dk; i++)
                for (int e = 0; e < dv; e++) Sh[i * dv + e] += k[i] * m[e];
            for (int e = 0; e < dv; e++) {
                double acc = 0;
                for (int i = 0; i < dk; i++) acc += Sh[i * dv + e] * q[i];
                o[((size_t)t * c->hv + h) * dv + e] = acc;
            }
        }
    }
    free(m);
    return 1;
}

/* max |a - b| over n floats, +inf if any element is not finite (catches NaN poison). */
static double maxdiff_f(const float *a, const float *b, size_t n) {
    double md = 0;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(a[i]) || !isfinite(b[i])) return INFINITY;
        const double x = fabs((double)a[i] - b[i]);
        if (x > md) md = x;
    }
    return md;
}
static double maxabs_f(const float *a, size_t n) {
    double m = 0;
    for (size_t i = 0; i < n; i++) if (fabs(a[i]) > m) m = fabs(a[i]);
    return m;
}

static double worst_ref = 0, worst_chunk = 0, worst_pool = 0, worst_split = 0;

static void run_case(qd_test_rng *rng, qd_threadpool *pool2, int hk, int r, int dk, int dv, int T) {
    gdn_case c;
    const int ok = make_case(&c, rng, hk, r, dk, dv, T);
    CHECK(ok);
    if (!ok) { free_case(&c); return; }
    qd_gdn_dims d = {hk, c.hv, dk, dv};
    const size_t ns = (size_t)c.hv * dk * dv, no = (size_t)T * c.hv * dv;
    double *Sref = malloc(ns * sizeof(double)), *oref = malloc(no * sizeof(double));
    float *Sr = malloc(ns * 4), *Sc = malloc(ns * 4), *Sp = malloc(ns * 4), *Ss = malloc(ns * 4);
    float *orr = alloc_nan(no), *oc = alloc_nan(no), *op = alloc_nan(no), *os = alloc_nan(no);
    float *ref_o = malloc(no * 4), *ref_S = malloc(ns * 4);
    if (!Sref || !oref || !Sr || !Sc || !Sp || !Ss || !orr || !oc || !op || !os || !ref_o || !ref_S ||
        !reference(&c, Sref, oref)) {
        CHECK(!"out of memory");
        goto done;
    }
    for (size_t i = 0; i < no; i++) ref_o[i] = (float)oref[i];
    for (size_t i = 0; i < ns; i++) ref_S[i] = (float)Sref[i];
    memcpy(Sr, c.S0, ns * 4); memcpy(Sc, c.S0, ns * 4);
    memcpy(Sp, c.S0, ns * 4); memcpy(Ss, c.S0, ns * 4);

    qd_gdn_span s = span_of(&c, 0, T, Sr, orr);
    qd_cpu_gdn_recurrent(NULL, d, &s);
    s = span_of(&c, 0, T, Sc, oc);
    qd_cpu_gdn_chunked(NULL, d, &s);
    s = span_of(&c, 0, T, Sp, op);
    qd_cpu_gdn_chunked(pool2, d, &s);
    /* Split span: prefix then the rest with the state carried. Alternate the
     * kernel per case so that both are exercised; a non-chunk-aligned split
     * point moves every later chunk boundary. */
    const int t1 = T / 3 + (T > 1);
    const int use_chunked = (hk + r + T) & 1;
    for (int part = 0; part < 2; part++) {
        const int a = part ? t1 : 0, n = part ? T - t1 : t1;
        if (n <= 0) continue;
        s = span_of(&c, a, n, Ss, os);
        if (use_chunked) qd_cpu_gdn_chunked(pool2, d, &s);
        else qd_cpu_gdn_recurrent(pool2, d, &s);
    }

    /* 1) recurrent vs the double reference */
    const double so = fmax(1.0, maxabs_f(ref_o, no)), ss = fmax(1.0, maxabs_f(ref_S, ns));
    const double eo = maxdiff_f(orr, ref_o, no) / so, es = maxdiff_f(Sr, ref_S, ns) / ss;
    CHECKF(eo <= 1e-4 && es <= 1e-4, "recurrent vs ref hk=%d r=%d dk=%d dv=%d T=%d: o %.3g S %.3g",
           hk, r, dk, dv, T, eo, es);
    worst_ref = fmax(worst_ref, fmax(eo, es));
    /* 2) chunked vs recurrent */
    const double co = maxdiff_f(oc, orr, no) / so, cs = maxdiff_f(Sc, Sr, ns) / ss;
    CHECKF(co <= 1e-4 && cs <= 1e-4, "chunked vs recurrent hk=%d r=%d dk=%d dv=%d T=%d: o %.3g S %.3g",
           hk, r, dk, dv, T, co, cs);
    worst_chunk = fmax(worst_chunk, fmax(co, cs));
    /* chunked vs the reference too, so a shared bug cannot hide */
    const double cro = maxdiff_f(oc, ref_o, no) / so, crs = maxdiff_f(Sc, ref_S, ns) / ss;
    CHECKF(cro <= 1e-4 && crs <= 1e-4, "chunked vs ref hk=%d r=%d dk=%d dv=%d T=%d: o %.3g S %.3g",
           hk, r, dk, dv, T, cro, crs);
    /* 3) two threads vs inline: same per-head arithmetic, so identical */
    const double po = maxdiff_f(op, oc, no), ps = maxdiff_f(Sp, Sc, ns);
    CHECKF(po <= 1e-6 && ps <= 1e-6, "chunked pool vs inline hk=%d r=%d dk=%d dv=%d T=%d: o %.3g S %.3g",
           hk, r, dk, dv, T, po, ps);
    worst_pool = fmax(worst_pool, fmax(po, ps));
    /* 4) split span vs one call of the same kernel */
    const float *one_o = use_chunked ? oc : orr, *one_S = use_chunked ? Sc : Sr;
    const double xo = maxdiff_f(os, one_o, no) / so, xs = maxdiff_f(Ss, one_S, ns) / ss;
    CHECKF(xo <= 1e-4 && xs <= 1e-4, "split (%s at %d) hk=%d r=%d dk=%d dv=%d T=%d: o %.3g S %.3g",
           use_chunked ? "chunked" : "recurrent", t1, hk, r, dk, dv, T, xo, xs);
    worst_split = fmax(worst_split, fmax(xo, xs));
done:
    free(Sref); free(oref); free(Sr); free(Sc); free(Sp); free(Ss);
    free(orr); free(oc); free(op); free(os); free(ref_o); free(ref_S);
    free_case(&c);
}

/* Prefill-sized throughput, Qwen3-Next geometry (hk=16, hv=32, dk=dv=128). */
static void bench(qd_test_rng *rng, qd_threadpool *pool2) {
    const char *e = getenv("QD_GDN_BENCH_T");
    const int T = e ? atoi(e) : 4096;
    if (T <= 0) return;
    gdn_case c;
    if (!make_case(&c, rng, 16, 2, 128, 128, T)) { free_case(&c); return; }
    qd_gdn_dims d = {16, 32, 128, 128};
    const size_t ns = (size_t)32 * 128 * 128, no = (size_t)T * 32 * 128;
    float *S = malloc(ns * 4), *o = malloc(no * 4);
    if (S && o) {
        memset(o, 0, no * 4); /* fault the pages in before timing */
        for (int kind = 0; kind < 2; kind++) {
            for (int th = 1; th <= 2; th++) {
                memcpy(S, c.S0, ns * 4);
                qd_gdn_span s = span_of(&c, 0, T, S, o);
                const double t0 = qd_clock_seconds();
                const clock_t c0 = clock();
                if (kind) qd_cpu_gdn_chunked(th == 2 ? pool2 : NULL, d, &s);
                else qd_cpu_gdn_recurrent(th == 2 ? pool2 : NULL, d, &s);
                const double dt = qd_clock_seconds() - t0, cpu = (double)(clock() - c0) / CLOCKS_PER_SEC;
                /* CPU time is printed too: on a shared machine wall time varies with load */
                printf("bench gdn %-9s T=%d threads=%d: %.3f s wall (%.3f s cpu), %.0f tokens/s\n",
                       kind ? "chunked" : "recurrent", T, th, dt, cpu, T / dt);
            }
        }
    }
    free(S); free(o);
    free_case(&c);
}

/* Several spans of different lengths and states in one multi-span call == each alone,
 * bit for bit (the multi-sequence decode path). */
static void check_multi(qd_test_rng *rng, qd_threadpool *pool) {
    enum { N = 5 };
    static const int Ts[N] = {1, 1, 3, 15, 1};
    gdn_case c[N];
    qd_gdn_span one[N], many[N];
    float *S1[N], *S2[N], *o1[N], *o2[N];
    int ok = 1;
    for (int i = 0; i < N; i++) {
        ok &= make_case(&c[i], rng, 2, 2, 16, 24, Ts[i]);
        size_t ns = (size_t)c[i].hv * 16 * 24, no = (size_t)Ts[i] * c[i].hv * 24;
        S1[i] = malloc(ns * sizeof(float)); S2[i] = malloc(ns * sizeof(float));
        o1[i] = alloc_nan(no); o2[i] = alloc_nan(no);
        memcpy(S1[i], c[i].S0, ns * sizeof(float));
        memcpy(S2[i], c[i].S0, ns * sizeof(float));
        one[i] = span_of(&c[i], 0, Ts[i], S1[i], o1[i]);
        many[i] = span_of(&c[i], 0, Ts[i], S2[i], o2[i]);
    }
    CHECK(ok);
    const qd_gdn_dims d = {2, 4, 16, 24};
    for (int i = 0; i < N; i++) qd_cpu_gdn_recurrent(pool, d, &one[i]);
    qd_cpu_gdn_recurrent_multi(pool, d, many, N);
    int same = 1;
    for (int i = 0; i < N; i++) {
        same &= memcmp(S1[i], S2[i], sizeof(float) * 4 * 16 * 24) == 0;
        same &= memcmp(o1[i], o2[i], sizeof(float) * Ts[i] * 4 * 24) == 0;
        free(S1[i]); free(S2[i]); free(o1[i]); free(o2[i]);
        free_case(&c[i]);
    }
    CHECKF(same, "multi-span recurrent differs from per-span calls");
}

int main(void) {
    qd_test_rng rng = qd_test_rng_from_env();
    qd_threadpool *pool2 = qd_threadpool_create(2);
    CHECK(pool2 != NULL);
    static const int Ts[] = {1, 2, 63, 64, 65, 127, 128, 129, 200};
    static const int dims[][2] = {{16, 24}, {32, 8}, {8, 8}, {32, 48}, {128, 128}, {24, 16}};
    int n_cases = 0;
    for (int ti = 0; ti < (int)(sizeof Ts / sizeof Ts[0]); ti++)
        for (int hk = 1; hk <= 3; hk++)
            for (int r = 1; r <= 3; r++) {
                /* cycle the (dk, dv) pairs so every pair meets many T and head shapes */
                const int di = (ti + 3 * hk + r) % 6;
                run_case(&rng, pool2, hk, r, dims[di][0], dims[di][1], Ts[ti]);
                n_cases++;
            }
    printf("test_gdn: %d cases; max rel err: recurrent vs double ref %.3g, chunked vs recurrent %.3g, "
           "chunked 2 threads vs inline %.3g (abs), split vs one call %.3g\n",
           n_cases, worst_ref, worst_chunk, worst_pool, worst_split);
    check_multi(&rng, NULL);
    check_multi(&rng, pool2);
    bench(&rng, pool2);
    qd_threadpool_free(pool2);
    return qd_test_finish("test_gdn");
}
