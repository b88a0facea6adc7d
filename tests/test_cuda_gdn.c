/* CUDA GDN kernels against the CPU reference (qd_cpu_gdn_recurrent), on
 * fresh random inputs with awkward shapes: varlen spans of 0, 1, 63, 64, 65,
 * 200 tokens, GQA ratios, head dims off the fast paths, strided rows,
 * permuted state slots (decode and chunked). Outputs and states are poisoned (NaN) before each run
 * and every element is checked. Inputs are rounded to bf16 first, so the CPU
 * sees exactly what the GPU sees and the difference is the kernels' own
 * rounding (bf16 operands on the tensor cores in the chunked kernel).
 * Also checks chunked == recurrent on the GPU (the decode kernel stepped
 * token by token over a whole sequence). Skips (77) without a GPU. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu_ops.h"
#include "base/threadpool.h"
#include "qd_test.h"
#include "qd_test_gdn.h"
#ifdef QD_HAVE_CUDA
#include "backend/cuda/cuda_gdn.h"
#include "backend/cuda/cuda_device.h"
#include "backend/cuda/cuda_ops.h"
#include "qd_test_cuda.h"
#endif

#ifdef QD_HAVE_CUDA

/* Compares n values; got is bf16 bits (is_bf16) or floats. Every element must
 * be finite and within atol_rel * rms(ref) + rtol * |ref|; the whole tensor
 * within l2_tol in relative L2 norm. The chunked kernel multiplies bf16
 * operands (relative rounding 2^-9) in sums of up to ~200 terms whose sizes
 * exceed the result's, so its single-element error reaches ~0.1 rms on
 * H200 runs while the relative L2 error stays ~3e-3: the chunked checks use
 * atol 0.2 rms per element and 1.5e-2 in L2 (fp32 decode paths: far tighter). */
static void compare(const char *what, const void *got, int is_bf16, const float *ref, size_t n, double rtol,
                    double atol_rel, double l2_tol) {
    double ss = 0, se = 0, maxe = 0;
    for (size_t i = 0; i < n; i++) ss += (double)ref[i] * ref[i];
    const double rms = sqrt(ss / (double)(n ? n : 1));
    size_t bad = 0, first = (size_t)-1;
    for (size_t i = 0; i < n; i++) {
        const double g = is_bf16 ? qd_bf16_to_f32(((const uint16_t *)got)[i]) : ((const float *)got)[i];
        const double e = fabs(g - ref[i]);
        if (!isfinite(g) || !(e <= atol_rel * rms + rtol * fabs(ref[i]))) {
            if (!bad) first = i;
            bad++;
        }
        if (isfinite(g)) {
            se += e * e;
            if (e > maxe) maxe = e;
        }
    }
    const double l2 = ss > 0 ? sqrt(se / ss) : sqrt(se);
    printf("  %-34s n=%-9zu rms=%.3e max_err=%.3e (%.2e rms) rel_l2=%.2e bad=%zu\n", what, n, rms, maxe,
           rms > 0 ? maxe / rms : maxe, l2, bad);
    CHECKF(bad == 0, "%s: %zu bad elements, first %zu: got %g want %g", what, bad, first,
           bad ? (is_bf16 ? qd_bf16_to_f32(((const uint16_t *)got)[first]) : ((const float *)got)[first]) : 0.0,
           bad ? ref[first] : 0.0);
    CHECKF(l2 <= l2_tol, "%s: relative L2 error %.3e > %.1e", what, l2, l2_tol);
}



/* One chunked case: n_seq spans of the given lengths packed in one batch. */
static void chunked_case(qd_threadpool *pool, qd_test_rng *rng, int hk, int r, int dk, int dv, const int *lens,
                         int n_seq, int with_state0, int gpu_recurrent) {
    const int hv = hk * r;
    int32_t cu[16];
    cu[0] = 0;
    for (int s = 0; s < n_seq; s++) cu[s + 1] = cu[s] + lens[s];
    const int T = cu[n_seq];
    const int64_t qs = (int64_t)hk * dk + 8, ks = (int64_t)hk * dk + 16, vs = (int64_t)hv * dv + 8;
    const size_t nq = (size_t)(T ? T : 1) * qs, nk = (size_t)(T ? T : 1) * ks, nv = (size_t)(T ? T : 1) * vs;
    const size_t ng = (size_t)(T ? T : 1) * hv, no = (size_t)(T ? T : 1) * hv * dv;
    const size_t nst = (size_t)n_seq * hv * dk * dv;
    float *q = calloc(nq, 4), *k = calloc(nk, 4), *v = calloc(nv, 4), *g = calloc(ng, 4), *beta = calloc(ng, 4);
    float *S = malloc(nst * 4), *o = malloc(no * 4), *S0 = malloc(nst * 4);
    printf("chunked hk=%d hv=%d dk=%d dv=%d T=%d spans=%d state0=%d\n", hk, hv, dk, dv, T, n_seq, with_state0);
    CHECK(q && k && v && g && beta && S && o && S0);
    if (!q || !k || !v || !g || !beta || !S || !o || !S0) goto out_host;
    for (int t = 0; t < T; t++) {
        for (int jj = 0; jj < hk; jj++) {
            qd_test_gdn_unit(rng, q + t * qs + (int64_t)jj * dk, dk, 1.0f / sqrtf((float)dk));
            qd_test_gdn_unit(rng, k + t * ks + (int64_t)jj * dk, dk, 1.0f);
        }
        for (int i = 0; i < hv * dv; i++) v[t * vs + i] = qd_test_normal(rng);
        for (int h = 0; h < hv; h++) {
            g[(int64_t)t * hv + h] = qd_test_gdn_log_decay(rng);
            beta[(int64_t)t * hv + h] = 0.5f * (qd_test_uniform(rng) + 1.0f) * 0.998f + 0.001f;
        }
    }
    for (size_t i = 0; i < nst; i++) S0[i] = with_state0 ? 0.5f * qd_test_normal(rng) : 0.0f;
    uint16_t *qb = qd_test_round_bf16(q, nq), *kb = qd_test_round_bf16(k, nk), *vb = qd_test_round_bf16(v, nv);
    CHECK(qb && kb && vb);
    /* CPU reference, per span. */
    memcpy(S, S0, nst * 4);
    for (int s = 0; s < n_seq; s++) {
        const int t0 = cu[s];
        qd_gdn_dims d = {hk, hv, dk, dv};
        qd_gdn_span sp = {q + t0 * qs, qs, k + t0 * ks, ks, v + t0 * vs, vs, g + (int64_t)t0 * hv,
                          beta + (int64_t)t0 * hv, S + (size_t)s * hv * dk * dv, o + (int64_t)t0 * hv * dv,
                          lens[s]};
        qd_cpu_gdn_recurrent(pool, d, &sp);
    }
    /* GPU. */
    uint16_t *dq = qd_test_dev_upload(qb, nq * 2), *dk_ = qd_test_dev_upload(kb, nk * 2), *dvv = qd_test_dev_upload(vb, nv * 2);
    float *dg = qd_test_dev_upload(g, ng * 4), *dbeta = qd_test_dev_upload(beta, ng * 4);
    float *dS0 = qd_test_dev_upload(S0, nst * 4), *dS1 = qd_test_dev_upload(NULL, nst * 4);
    uint16_t *dO = qd_test_dev_upload(NULL, no * 2);
    uint16_t *ho = malloc(no * 2);
    float *hS = malloc(nst * 4);
    CHECK(dq && dk_ && dvv && dg && dbeta && dS0 && dS1 && dO && ho && hS);
    if (dq && dk_ && dvv && dg && dbeta && dS0 && dS1 && dO && ho && hS) {
        qd_cuda_gdn_plan plan;
        ST_OK(qd_cuda_gdn_plan_create(&plan, hk, hv, dk, dv, cu, n_seq));
        ST_OK(qd_cuda_memset(dO, 0xff, no * 2)); /* NaN poison */
        ST_OK(qd_cuda_memset(dS1, 0xff, nst * 4));
        qd_cuda_gdn_chunked_args a = {dq, dk_, dvv, qs, ks, vs, dg, dbeta, with_state0 ? dS0 : NULL, dS1, NULL, dO, 0};
        ST_OK(qd_cuda_gdn_chunked(&plan, &a, NULL));
        ST_OK(qd_cuda_sync());
        ST_OK(qd_cuda_memcpy_d2h(ho, dO, no * 2));
        ST_OK(qd_cuda_memcpy_d2h(hS, dS1, nst * 4));
        if (T) compare("chunked output vs CPU", ho, 1, o, (size_t)T * hv * dv, 3e-2, 0.2, 1.5e-2);
        compare("chunked final state vs CPU", hS, 0, S, nst, 3e-2, 0.2, 1.5e-2);
        /* In place (state1 == state0) must give the same. */
        if (with_state0) {
            ST_OK(qd_cuda_memcpy_h2d(dS1, S0, nst * 4));
            qd_cuda_gdn_chunked_args b = a;
            b.d_state0 = dS1;
            ST_OK(qd_cuda_gdn_chunked(&plan, &b, NULL));
            ST_OK(qd_cuda_memcpy_d2h(hS, dS1, nst * 4));
            compare("chunked in-place state vs CPU", hS, 0, S, nst, 3e-2, 0.2, 1.5e-2);
        }
        /* Every walk block shape the table may pick gives the table's bits: tiles per
         * block change which SM runs a tile, not its arithmetic. */
        if (T) {
            ST_OK(qd_cuda_memcpy_d2h(ho, dO, no * 2));
            ST_OK(qd_cuda_gdn_chunked(&plan, &a, NULL)); /* hS: the table's final state again */
            ST_OK(qd_cuda_memcpy_d2h(hS, dS1, nst * 4));
            uint16_t *fo = malloc(no * 2);
            float *fS = malloc(nst * 4);
            CHECK(fo && fS);
            const int forced[3] = {2, 4, 8};
            for (int f = 0; f < 3 && fo && fS; f++) {
                qd_cuda_gdn_chunked_args b = a;
                b.walk_tiles = forced[f];
                ST_OK(qd_cuda_memset(dO, 0xff, no * 2));
                ST_OK(qd_cuda_memset(dS1, 0xff, nst * 4));
                ST_OK(qd_cuda_gdn_chunked(&plan, &b, NULL));
                ST_OK(qd_cuda_memcpy_d2h(fo, dO, no * 2));
                ST_OK(qd_cuda_memcpy_d2h(fS, dS1, nst * 4));
                CHECKF(memcmp(fo, ho, (size_t)T * hv * dv * 2) == 0 && memcmp(fS, hS, nst * 4) == 0,
                       "chunked walk of %d tiles a block differs from the table's (%d)", forced[f],
                       qd_cuda_gdn_walk_tiles(&plan));
            }
            qd_cuda_gdn_chunked_args bad = a;
            bad.walk_tiles = 3;
            CHECK(qd_cuda_gdn_chunked(&plan, &bad, NULL) == QD_ERR_INVALID_ARG);
            free(fo);
            free(fS);
        }
        qd_cuda_gdn_plan_destroy(&plan);
        /* Recurrent on the GPU: the decode kernel stepped over each span. */
        if (gpu_recurrent) {
            uint16_t *dOr = qd_test_dev_upload(NULL, no * 2);
            uint16_t *hor = malloc(no * 2);
            CHECK(dOr && hor);
            if (dOr && hor) {
                ST_OK(qd_cuda_memset(dOr, 0xff, no * 2));
                ST_OK(qd_cuda_memcpy_h2d(dS1, S0, nst * 4));
                for (int s = 0; s < n_seq; s++)
                    for (int t = cu[s]; t < cu[s + 1]; t++) {
                        qd_cuda_gdn_decode_args da = {hk, hv, dk, dv, 1, dq + t * qs, dk_ + t * ks, dvv + t * vs,
                                                      dg + (int64_t)t * hv, dbeta + (int64_t)t * hv,
                                                      dS1 + (size_t)s * hv * dk * dv, NULL, NULL,
                                                      dOr + (int64_t)t * hv * dv, NULL, 0, 0, NULL, 0};
                        ST_OK(qd_cuda_gdn_decode(&da, NULL));
                    }
                ST_OK(qd_cuda_sync());
                ST_OK(qd_cuda_memcpy_d2h(hor, dOr, no * 2));
                ST_OK(qd_cuda_memcpy_d2h(hS, dS1, nst * 4));
                float *of = malloc(no * 4);
                if (of) {
                    for (size_t i = 0; i < (size_t)T * hv * dv; i++) of[i] = qd_bf16_to_f32(hor[i]);
                    compare("GPU recurrent output vs CPU", hor, 1, o, (size_t)T * hv * dv, 1e-2, 1e-2, 4e-3);
                    compare("GPU recurrent state vs CPU", hS, 0, S, nst, 1e-4, 1e-4, 1e-5);
                    compare("GPU chunked vs GPU recurrent output", ho, 1, of, (size_t)T * hv * dv, 3e-2, 0.2,
                            1.5e-2);
                    free(of);
                }
            }
            qd_cuda_free(dOr);
            free(hor);
        }
    }
    qd_cuda_free(dq); qd_cuda_free(dk_); qd_cuda_free(dvv); qd_cuda_free(dg); qd_cuda_free(dbeta);
    qd_cuda_free(dS0); qd_cuda_free(dS1); qd_cuda_free(dO);
    free(ho); free(hS); free(qb); free(kb); free(vb);
out_host:
    free(q); free(k); free(v); free(g); free(beta); free(S); free(o); free(S0);
}

/* Chunked with pooled states: sequence s reads and writes slot slot[s] of a
 * pool of n_slots states (a permuted subset), in place; every other slot
 * must come back bit for bit. */
static void chunked_slots_case(qd_threadpool *pool, qd_test_rng *rng, int hk, int r, int dk, int dv, const int *lens,
                               int n_seq, int n_slots) {
    const int hv = hk * r;
    int32_t cu[16];
    cu[0] = 0;
    for (int s = 0; s < n_seq; s++) cu[s + 1] = cu[s] + lens[s];
    const int T = cu[n_seq];
    const int64_t qs = (int64_t)hk * dk, vs = (int64_t)hv * dv;
    const size_t nq = (size_t)(T ? T : 1) * qs, nv = (size_t)(T ? T : 1) * vs, ng = (size_t)(T ? T : 1) * hv;
    const size_t per = (size_t)hv * dk * dv, npool = (size_t)n_slots * per;
    printf("chunked slots hk=%d hv=%d dk=%d dv=%d T=%d spans=%d slots=%d\n", hk, hv, dk, dv, T, n_seq, n_slots);
    float *q = calloc(nq, 4), *k = calloc(nq, 4), *v = calloc(nv, 4), *g = calloc(ng, 4), *beta = calloc(ng, 4);
    float *P0 = malloc(npool * 4), *Pref = malloc(npool * 4), *hP = malloc(npool * 4), *o = malloc(nv * 4);
    int32_t *slot = malloc((size_t)n_slots * 4);
    uint16_t *ho = malloc(nv * 2);
    CHECK(q && k && v && g && beta && P0 && Pref && hP && o && slot && ho);
    if (!q || !k || !v || !g || !beta || !P0 || !Pref || !hP || !o || !slot || !ho) goto out;
    for (int i = 0; i < n_slots; i++) slot[i] = i;
    for (int i = n_slots - 1; i > 0; i--) {
        const int jj = (int)(qd_test_next(rng) % (uint64_t)(i + 1));
        const int t = slot[i]; slot[i] = slot[jj]; slot[jj] = t;
    }
    for (int t = 0; t < T; t++) {
        for (int jj = 0; jj < hk; jj++) {
            qd_test_gdn_unit(rng, q + t * qs + (int64_t)jj * dk, dk, 1.0f / sqrtf((float)dk));
            qd_test_gdn_unit(rng, k + t * qs + (int64_t)jj * dk, dk, 1.0f);
        }
        for (int i = 0; i < hv * dv; i++) v[t * vs + i] = qd_test_normal(rng);
        for (int h = 0; h < hv; h++) {
            g[(int64_t)t * hv + h] = qd_test_gdn_log_decay(rng);
            beta[(int64_t)t * hv + h] = 0.5f * (qd_test_uniform(rng) + 1.0f) * 0.998f + 0.001f;
        }
    }
    for (size_t i = 0; i < npool; i++) P0[i] = 0.5f * qd_test_normal(rng);
    uint16_t *qb = qd_test_round_bf16(q, nq), *kb = qd_test_round_bf16(k, nq), *vb = qd_test_round_bf16(v, nv);
    CHECK(qb && kb && vb);
    memcpy(Pref, P0, npool * 4);
    for (int s = 0; s < n_seq; s++) {
        const int t0 = cu[s];
        qd_gdn_dims d = {hk, hv, dk, dv};
        qd_gdn_span sp = {q + t0 * qs, qs, k + t0 * qs, qs, v + t0 * vs, vs, g + (int64_t)t0 * hv,
                          beta + (int64_t)t0 * hv, Pref + (size_t)slot[s] * per, o + (int64_t)t0 * hv * dv, lens[s]};
        qd_cpu_gdn_recurrent(pool, d, &sp);
    }
    uint16_t *dq = qd_test_dev_upload(qb, nq * 2), *dk_ = qd_test_dev_upload(kb, nq * 2), *dvv = qd_test_dev_upload(vb, nv * 2);
    float *dg = qd_test_dev_upload(g, ng * 4), *dbeta = qd_test_dev_upload(beta, ng * 4), *dP = qd_test_dev_upload(P0, npool * 4);
    int32_t *dslot = qd_test_dev_upload(slot, (size_t)n_seq * 4);
    uint16_t *dO = qd_test_dev_upload(NULL, nv * 2);
    CHECK(dq && dk_ && dvv && dg && dbeta && dP && dslot && dO);
    if (dq && dk_ && dvv && dg && dbeta && dP && dslot && dO && qb && kb && vb) {
        qd_cuda_gdn_plan plan;
        ST_OK(qd_cuda_gdn_plan_create(&plan, hk, hv, dk, dv, cu, n_seq));
        ST_OK(qd_cuda_memset(dO, 0xff, nv * 2));
        qd_cuda_gdn_chunked_args a = {dq, dk_, dvv, qs, qs, vs, dg, dbeta, dP, dP, dslot, dO, 0};
        ST_OK(qd_cuda_gdn_chunked(&plan, &a, NULL));
        ST_OK(qd_cuda_sync());
        ST_OK(qd_cuda_memcpy_d2h(ho, dO, nv * 2));
        ST_OK(qd_cuda_memcpy_d2h(hP, dP, npool * 4));
        if (T) compare("chunked (slots) output vs CPU", ho, 1, o, (size_t)T * hv * dv, 3e-2, 0.2, 1.5e-2);
        compare("chunked (slots) state pool vs CPU", hP, 0, Pref, npool, 3e-2, 0.2, 1.5e-2);
        size_t changed = 0;
        for (int sl = 0; sl < n_slots; sl++) {
            int used = 0;
            for (int s = 0; s < n_seq; s++) used |= slot[s] == sl;
            if (!used) changed += memcmp(hP + (size_t)sl * per, P0 + (size_t)sl * per, per * 4) != 0;
        }
        CHECKF(changed == 0, "chunked (slots): %zu slots outside the map were modified", changed);
        qd_cuda_gdn_plan_destroy(&plan);
    }
    qd_cuda_free(dq); qd_cuda_free(dk_); qd_cuda_free(dvv); qd_cuda_free(dg); qd_cuda_free(dbeta);
    qd_cuda_free(dP); qd_cuda_free(dslot); qd_cuda_free(dO);
    free(qb); free(kb); free(vb);
out:
    free(q); free(k); free(v); free(g); free(beta); free(P0); free(Pref); free(hP); free(o); free(slot); free(ho);
}

/* The same decode writing each new state to its own slot (d_slot_out: n_slots + b of a pool
 * twice as large, as a verify span's per-token states): the outputs and new states equal
 * the in-place run's bit for bit (ho, hS), and every slot read stays as it was (S0). */
static void decode_slot_out(const qd_cuda_gdn_decode_args *in_place, const float *S0, const float *hS,
                            const uint16_t *ho, const int32_t *slot, int n_slots, size_t per, size_t nv) {
    const int n_seq = in_place->n_seq;
    const size_t nst = (size_t)n_slots * per;
    float *dS2 = qd_test_dev_upload(NULL, 2 * nst * 4), *hS2 = malloc(2 * nst * 4);
    int32_t *outs = malloc((size_t)n_seq * 4);
    uint16_t *dO2 = qd_test_dev_upload(NULL, nv * 2), *ho2 = malloc(nv * 2);
    CHECK(dS2 && hS2 && outs && dO2 && ho2);
    if (dS2 && hS2 && outs && dO2 && ho2) {
        for (int b = 0; b < n_seq; b++) outs[b] = n_slots + b;
        int32_t *douts = qd_test_dev_upload(outs, (size_t)n_seq * 4);
        ST_OK(qd_cuda_memcpy_h2d(dS2, S0, nst * 4));
        qd_cuda_gdn_decode_args a = *in_place;
        a.d_state = dS2;
        a.d_slot_out = douts;
        a.d_o = dO2;
        ST_OK(qd_cuda_gdn_decode(&a, NULL));
        ST_OK(qd_cuda_sync());
        ST_OK(qd_cuda_memcpy_d2h(hS2, dS2, 2 * nst * 4));
        ST_OK(qd_cuda_memcpy_d2h(ho2, dO2, nv * 2));
        int bad_new = 0, bad_old = 0;
        for (int b = 0; b < n_seq; b++) {
            bad_new += memcmp(hS2 + (size_t)(n_slots + b) * per, hS + (size_t)slot[b] * per, per * 4) != 0;
            bad_old += memcmp(hS2 + (size_t)slot[b] * per, S0 + (size_t)slot[b] * per, per * 4) != 0;
        }
        CHECKF(bad_new == 0 && bad_old == 0 && !memcmp(ho2, ho, nv * 2),
               "decode with d_slot_out: %d new states and %d read slots off, outputs %s", bad_new, bad_old,
               memcmp(ho2, ho, nv * 2) ? "differ" : "equal");
        qd_cuda_free(douts);
    }
    qd_cuda_free(dS2);
    qd_cuda_free(dO2);
    free(hS2); free(outs); free(ho2);
}

/* Decode: n_seq sequences, one token each, states in a pool of n_slots with a
 * permuted slot map; slots not in the map must stay untouched. */
static void decode_case(qd_threadpool *pool, qd_test_rng *rng, int hk, int r, int dk, int dv, int n_seq,
                        int n_slots) {
    const int hv = hk * r;
    const size_t nq = (size_t)n_seq * hk * dk, nv = (size_t)n_seq * hv * dv, ng = (size_t)n_seq * hv;
    const size_t per = (size_t)hv * dk * dv, nst = (size_t)n_slots * per;
    printf("decode hk=%d hv=%d dk=%d dv=%d seqs=%d slots=%d\n", hk, hv, dk, dv, n_seq, n_slots);
    float *q = malloc(nq * 4), *k = malloc(nq * 4), *v = malloc(nv * 4), *g = malloc(ng * 4);
    float *beta = malloc(ng * 4), *S = malloc(nst * 4), *o = malloc(nv * 4), *hS = malloc(nst * 4);
    int32_t *slot = malloc((size_t)n_slots * 4);
    uint16_t *ho = malloc(nv * 2);
    CHECK(q && k && v && g && beta && S && o && hS && slot && ho);
    if (!q || !k || !v || !g || !beta || !S || !o || !hS || !slot || !ho) goto out;
    for (int i = 0; i < n_slots; i++) slot[i] = i;
    for (int i = n_slots - 1; i > 0; i--) { /* Fisher-Yates */
        const int jj = (int)(qd_test_next(rng) % (uint64_t)(i + 1));
        const int t = slot[i]; slot[i] = slot[jj]; slot[jj] = t;
    }
    for (int b = 0; b < n_seq; b++) {
        for (int jj = 0; jj < hk; jj++) {
            qd_test_gdn_unit(rng, q + ((size_t)b * hk + jj) * dk, dk, 1.0f / sqrtf((float)dk));
            qd_test_gdn_unit(rng, k + ((size_t)b * hk + jj) * dk, dk, 1.0f);
        }
        for (int i = 0; i < hv * dv; i++) v[(size_t)b * hv * dv + i] = qd_test_normal(rng);
        for (int h = 0; h < hv; h++) {
            g[(size_t)b * hv + h] = qd_test_gdn_log_decay(rng);
            beta[(size_t)b * hv + h] = 0.5f * (qd_test_uniform(rng) + 1.0f) * 0.998f + 0.001f;
        }
    }
    for (size_t i = 0; i < nst; i++) S[i] = 0.5f * qd_test_normal(rng);
    uint16_t *qb = qd_test_round_bf16(q, nq), *kb = qd_test_round_bf16(k, nq), *vb = qd_test_round_bf16(v, nv);
    CHECK(qb && kb && vb);
    uint16_t *dq = qd_test_dev_upload(qb, nq * 2), *dk_ = qd_test_dev_upload(kb, nq * 2), *dvv = qd_test_dev_upload(vb, nv * 2);
    float *dg = qd_test_dev_upload(g, ng * 4), *dbeta = qd_test_dev_upload(beta, ng * 4), *dS = qd_test_dev_upload(S, nst * 4);
    int32_t *dslot = qd_test_dev_upload(slot, (size_t)n_seq * 4);
    uint16_t *dO = qd_test_dev_upload(NULL, nv * 2);
    CHECK(dq && dk_ && dvv && dg && dbeta && dS && dslot && dO);
    if (dq && dk_ && dvv && dg && dbeta && dS && dslot && dO) {
        ST_OK(qd_cuda_memset(dO, 0xff, nv * 2));
        qd_cuda_gdn_decode_args a = {hk, hv, dk, dv, n_seq, dq, dk_, dvv, dg, dbeta, dS, dslot, NULL, dO, NULL, 0, 0, NULL, 0};
        ST_OK(qd_cuda_gdn_decode(&a, NULL));
        ST_OK(qd_cuda_sync());
        ST_OK(qd_cuda_memcpy_d2h(ho, dO, nv * 2));
        ST_OK(qd_cuda_memcpy_d2h(hS, dS, nst * 4));
        decode_slot_out(&a, S, hS, ho, slot, n_slots, per, nv);
        qd_gdn_dims d = {hk, hv, dk, dv};
        for (int b = 0; b < n_seq; b++) {
            qd_gdn_span sp = {q + (size_t)b * hk * dk, hk * dk, k + (size_t)b * hk * dk, hk * dk,
                              v + (size_t)b * hv * dv, hv * dv, g + (size_t)b * hv, beta + (size_t)b * hv,
                              S + (size_t)slot[b] * per, o + (size_t)b * hv * dv, 1};
            qd_cpu_gdn_recurrent(pool, d, &sp);
        }
        compare("decode output vs CPU", ho, 1, o, nv, 1e-2, 1e-2, 4e-3);
        compare("decode state pool vs CPU (all slots)", hS, 0, S, nst, 1e-4, 1e-4, 1e-5);
    }
    qd_cuda_free(dq); qd_cuda_free(dk_); qd_cuda_free(dvv); qd_cuda_free(dg); qd_cuda_free(dbeta);
    qd_cuda_free(dS); qd_cuda_free(dslot); qd_cuda_free(dO);
    free(qb); free(kb); free(vb);
out:
    free(q); free(k); free(v); free(g); free(beta); free(S); free(o); free(hS); free(slot); free(ho);
}

/* Verify spans: n_seq sequences of lens[b] tokens (non-increasing, the longest first),
 * token t of sequence b at a scattered row, reading the state of slot in[b] first and
 * writing the state after each token to its own slot (at a stride of more than n_seq),
 * in one launch (n_tok > 1) against a one-token launch per position (each reading the
 * slot the previous one wrote): every state slot and every output bit for bit. */
static void decode_spans_case(qd_test_rng *rng, int hk, int r, int dk, int dv, const int *lens, int n_seq) {
    const int hv = hk * r, T = lens[0], stride = n_seq + 3;
    int count[QD_GDN_MAX_TOKENS] = {0}, n_rows = 0;
    for (int b = 0; b < n_seq; b++) {
        n_rows += lens[b];
        for (int t = 0; t < lens[b]; t++) count[t]++;
    }
    const int rows_cap = n_rows + 5; /* rows the tokens do not use stay as they were */
    const size_t nq = (size_t)rows_cap * hk * dk, nv = (size_t)rows_cap * hv * dv, ng = (size_t)rows_cap * hv;
    const size_t per = (size_t)hv * dk * dv;
    const int n_slots = n_seq + T * stride;
    const size_t nst = (size_t)n_slots * per;
    printf("decode spans hk=%d hv=%d dk=%d dv=%d seqs=%d longest=%d\n", hk, hv, dk, dv, n_seq, T);
    float *q = malloc(nq * 4), *k = malloc(nq * 4), *v = malloc(nv * 4), *g = malloc(ng * 4), *beta = malloc(ng * 4);
    float *S = malloc(nst * 4), *hA = malloc(nst * 4), *hB = malloc(nst * 4);
    uint16_t *oA = malloc(nv * 2), *oB = malloc(nv * 2);
    int32_t in[QD_GDN_MAX_TOKENS * 8], rows[QD_GDN_MAX_TOKENS * 16], outs[QD_GDN_MAX_TOKENS * 16];
    CHECK(q && k && v && g && beta && S && hA && hB && oA && oB && n_seq <= 8);
    if (!q || !k || !v || !g || !beta || !S || !hA || !hB || !oA || !oB || n_seq > 8) goto out;
    for (int i = 0; i < rows_cap * hk; i++) {
        qd_test_gdn_unit(rng, q + (size_t)i * dk, dk, 1.0f / sqrtf((float)dk));
        qd_test_gdn_unit(rng, k + (size_t)i * dk, dk, 1.0f);
    }
    for (size_t i = 0; i < nv; i++) v[i] = qd_test_normal(rng);
    for (size_t i = 0; i < ng; i++) {
        g[i] = qd_test_gdn_log_decay(rng);
        beta[i] = 0.5f * (qd_test_uniform(rng) + 1.0f) * 0.998f + 0.001f;
    }
    for (size_t i = 0; i < nst; i++) S[i] = 0.5f * qd_test_normal(rng);
    /* rows: the spans' tokens at descending rows from the batch's end (rows 0..4 unused) */
    int next = rows_cap - 1;
    for (int b = 0; b < n_seq; b++) {
        in[b] = n_seq - 1 - b;
        for (int t = 0; t < lens[b]; t++) {
            rows[t * stride + b] = next--;
            outs[t * stride + b] = n_seq + t * stride + b;
        }
    }
    uint16_t *qb = qd_test_round_bf16(q, nq), *kb = qd_test_round_bf16(k, nq), *vb = qd_test_round_bf16(v, nv);
    uint16_t *dq = qd_test_dev_upload(qb, nq * 2), *dk_ = qd_test_dev_upload(kb, nq * 2), *dvv = qd_test_dev_upload(vb, nv * 2);
    float *dg = qd_test_dev_upload(g, ng * 4), *dbeta = qd_test_dev_upload(beta, ng * 4);
    float *dSA = qd_test_dev_upload(S, nst * 4), *dSB = qd_test_dev_upload(S, nst * 4);
    int32_t *din = qd_test_dev_upload(in, sizeof in), *drows = qd_test_dev_upload(rows, sizeof rows);
    int32_t *douts = qd_test_dev_upload(outs, sizeof outs);
    uint16_t *dOA = qd_test_dev_upload(NULL, nv * 2), *dOB = qd_test_dev_upload(NULL, nv * 2);
    CHECK(dq && dk_ && dvv && dg && dbeta && dSA && dSB && din && drows && douts && dOA && dOB);
    if (dq && dk_ && dvv && dg && dbeta && dSA && dSB && din && drows && douts && dOA && dOB) {
        ST_OK(qd_cuda_memset(dOA, 0x5a, nv * 2));
        ST_OK(qd_cuda_memset(dOB, 0x5a, nv * 2));
        const qd_cuda_gdn_decode_args span = {
            .hk = hk, .hv = hv, .dk = dk, .dv = dv, .n_seq = n_seq, .d_q = dq, .d_k = dk_, .d_v = dvv, .d_g = dg,
            .d_beta = dbeta, .d_state = dSA, .d_slot = din, .d_row = drows, .d_o = dOA, .d_slot_out = douts,
            .n_tok = T, .tok_stride = stride, .tok_count = count,
        };
        ST_OK(qd_cuda_gdn_decode(&span, NULL));
        for (int t = 0; t < T; t++) {
            const qd_cuda_gdn_decode_args one = {
                .hk = hk, .hv = hv, .dk = dk, .dv = dv, .n_seq = count[t], .d_q = dq, .d_k = dk_, .d_v = dvv,
                .d_g = dg, .d_beta = dbeta, .d_state = dSB, .d_slot = t == 0 ? din : douts + (t - 1) * stride,
                .d_row = drows + t * stride, .d_o = dOB, .d_slot_out = douts + t * stride,
            };
            ST_OK(qd_cuda_gdn_decode(&one, NULL));
        }
        ST_OK(qd_cuda_sync());
        ST_OK(qd_cuda_memcpy_d2h(hA, dSA, nst * 4));
        ST_OK(qd_cuda_memcpy_d2h(hB, dSB, nst * 4));
        ST_OK(qd_cuda_memcpy_d2h(oA, dOA, nv * 2));
        ST_OK(qd_cuda_memcpy_d2h(oB, dOB, nv * 2));
        int moved = 0;
        for (int b = 0; b < n_seq; b++)
            moved += memcmp(hA + (size_t)outs[(lens[b] - 1) * stride + b] * per,
                            S + (size_t)outs[(lens[b] - 1) * stride + b] * per, per * 4) != 0;
        CHECKF(!memcmp(hA, hB, nst * 4) && !memcmp(oA, oB, nv * 2) && moved == n_seq,
               "spans in one launch: states %s, outputs %s vs a launch per token (%d of %d final states written)",
               memcmp(hA, hB, nst * 4) ? "differ" : "equal", memcmp(oA, oB, nv * 2) ? "differ" : "equal", moved,
               n_seq);
    }
    /* misuse: counts that rise, or a span without its output slots */
    int bad[QD_GDN_MAX_TOKENS] = {1, 2};
    qd_cuda_gdn_decode_args m = {.hk = hk, .hv = hv, .dk = dk, .dv = dv, .n_seq = 2, .d_q = dq, .d_k = dk_, .d_v = dvv,
                                 .d_g = dg, .d_beta = dbeta, .d_state = dSA, .d_slot = din, .d_row = drows, .d_o = dOA,
                                 .d_slot_out = douts, .n_tok = 2, .tok_stride = stride, .tok_count = bad};
    CHECK(qd_cuda_gdn_decode(&m, NULL) == QD_ERR_INVALID_ARG);
    m.tok_count = count;
    m.d_slot_out = NULL;
    CHECK(qd_cuda_gdn_decode(&m, NULL) == QD_ERR_INVALID_ARG);
    m.d_slot_out = douts;
    m.n_tok = QD_GDN_MAX_TOKENS + 1;
    CHECK(qd_cuda_gdn_decode(&m, NULL) == QD_ERR_INVALID_ARG);
    qd_cuda_free(dq); qd_cuda_free(dk_); qd_cuda_free(dvv); qd_cuda_free(dg); qd_cuda_free(dbeta);
    qd_cuda_free(dSA); qd_cuda_free(dSB); qd_cuda_free(din); qd_cuda_free(drows); qd_cuda_free(douts);
    qd_cuda_free(dOA); qd_cuda_free(dOB);
    free(qb); free(kb); free(vb);
out:
    free(q); free(k); free(v); free(g); free(beta); free(S); free(hA); free(hB); free(oA); free(oB);
}

/* A decode-only step's inputs and delta rule in one launch (qd_cuda_gdn_decode_inputs) against
 * gdn_inputs then gdn_decode on the same projection: the outputs, the state pool and the conv
 * state pool bit for bit. hk key heads, r value heads each, n_seq one-row spans whose conv and
 * delta-rule slots are permuted apart; slot_out: the new states into other slots. rounds: fresh
 * projections and conv states each round, the counts summed (a difference in how the two paths
 * round shows as a flipped bf16 q, k or v only every few ten thousand values). */
static void decode_inputs_case(qd_test_rng *rng, int hk, int r, int dk, int dv, int n_seq, int slot_out, int rounds) {
    const int hv = hk * r, K = 4, n_slots = n_seq + 3, key_dim = hk * dk, value_dim = hv * dv;
    const int C = 2 * key_dim + value_dim, W = C + 2 * hv + 3;
    const size_t per = (size_t)hv * dk * dv, nst = (size_t)2 * n_slots * per, ncv = (size_t)n_slots * C * (K - 1);
    const size_t nv = (size_t)n_seq * value_dim;
    printf("decode with its inputs hk=%d hv=%d dk=%d dv=%d seqs=%d%s, %d round%s\n", hk, hv, dk, dv, n_seq,
           slot_out ? " slot_out" : "", rounds, rounds > 1 ? "s" : "");
    float *x = qd_test_rnd(rng, (size_t)n_seq * W, 1.0f), *w = qd_test_rnd(rng, (size_t)C * K, 0.5f);
    float *cv = qd_test_rnd(rng, ncv, 1.0f), *S = qd_test_rnd(rng, nst, 0.5f);
    float *A = qd_test_rnd(rng, hv, 1.0f), *dtb = qd_test_rnd(rng, hv, 1.0f);
    int32_t *spans = malloc(sizeof(int32_t) * 4 * n_seq), *row_span = malloc(sizeof(int32_t) * n_seq);
    int32_t *slot = malloc(sizeof(int32_t) * n_slots), *cslot = malloc(sizeof(int32_t) * n_slots);
    int32_t *outs = malloc(sizeof(int32_t) * n_seq);
    float *hS[2] = {malloc(nst * 4), malloc(nst * 4)}, *hc[2] = {malloc(ncv * 4), malloc(ncv * 4)};
    uint16_t *ho[2] = {malloc(nv * 2), malloc(nv * 2)};
    CHECK(spans && row_span && slot && cslot && outs && hS[0] && hS[1] && hc[0] && hc[1] && ho[0] && ho[1]);
    if (!spans || !row_span || !slot || !cslot || !outs || !hS[0] || !hS[1] || !hc[0] || !hc[1] || !ho[0] || !ho[1])
        goto out;
    for (int i = 0; i < n_slots; i++) slot[i] = cslot[i] = i;
    for (int i = n_slots - 1; i > 0; i--) { /* two Fisher-Yates permutations */
        int jj = (int)(qd_test_next(rng) % (uint64_t)(i + 1)), t = slot[i];
        slot[i] = slot[jj]; slot[jj] = t;
        jj = (int)(qd_test_next(rng) % (uint64_t)(i + 1)); t = cslot[i];
        cslot[i] = cslot[jj]; cslot[jj] = t;
    }
    for (int b = 0; b < n_seq; b++) {
        spans[4 * b] = b; spans[4 * b + 1] = 1; spans[4 * b + 2] = 0; spans[4 * b + 3] = cslot[b];
        row_span[b] = b;
        outs[b] = n_slots + b;
    }
    float *dx = qd_test_dev(x, (size_t)n_seq * W * 4), *dw = qd_test_dev(w, (size_t)C * K * 4);
    float *dA = qd_test_dev(A, hv * 4), *dd = qd_test_dev(dtb, hv * 4), *dcv = qd_test_dev(cv, ncv * 4);
    float *dS = qd_test_dev(S, nst * 4);
    int32_t *dsp = qd_test_dev(spans, sizeof(int32_t) * 4 * n_seq);
    int32_t *drs = qd_test_dev(row_span, sizeof(int32_t) * n_seq);
    int32_t *dslot = qd_test_dev(slot, sizeof(int32_t) * n_seq), *douts = qd_test_dev(outs, sizeof(int32_t) * n_seq);
    uint16_t *dq = qd_test_dev(NULL, (size_t)n_seq * key_dim * 2);
    uint16_t *dk_ = qd_test_dev(NULL, (size_t)n_seq * key_dim * 2);
    uint16_t *dvv = qd_test_dev(NULL, nv * 2), *dO = qd_test_dev(NULL, nv * 2);
    float *dg = qd_test_dev(NULL, (size_t)n_seq * hv * 4), *db = qd_test_dev(NULL, (size_t)n_seq * hv * 4);
    if (!dx || !dw || !dA || !dd || !dcv || !dS || !dsp || !drs || !dslot || !douts || !dq || !dk_ || !dvv || !dO ||
        !dg || !db)
        goto free_dev;
    const qd_cuda_gdn_in_args in = {n_seq, hk, hv, dk, dv, K, n_seq, dx, W, dx + C + hv, dx + C, W, dw, dA, dd,
                                    dcv, dsp, drs, dq, dk_, dvv, dg, db, 1, 0, NULL};
    qd_cuda_gdn_decode_args dec = {hk, hv, dk, dv, n_seq, dq, dk_, dvv, dg, db, dS, dslot, NULL, dO,
                                   slot_out ? douts : NULL, 0, 0, NULL, 1};
    CHECKF(qd_cuda_gdn_decode_inputs_supported(&in, &dec), "decode with its inputs: hk=%d hv=%d dk=%d dv=%d refused",
           hk, hv, dk, dv);
    size_t bad_o = 0, bad_s = 0, bad_c = 0, nan_o = 0, moved = 0;
    for (int round = 0; round < rounds; round++) {
        if (round > 0) { /* fresh projections and conv states (the inputs' arithmetic) */
            for (size_t i = 0; i < (size_t)n_seq * W; i++) x[i] = qd_test_normal(rng);
            for (size_t i = 0; i < ncv; i++) cv[i] = qd_test_normal(rng);
        }
        for (int i = 0; i < n_seq; i++)
            for (int j = C; j < W; j++) x[(size_t)i * W + j] *= 2.0f; /* the gates' inputs at real scale */
        ST_OK(qd_cuda_memcpy_h2d(dx, x, (size_t)n_seq * W * 4));
        for (int path = 0; path < 2; path++) { /* 0: two kernels, 1: one */
            ST_OK(qd_cuda_memcpy_h2d(dS, S, nst * 4));
            ST_OK(qd_cuda_memcpy_h2d(dcv, cv, ncv * 4));
            ST_OK(qd_cuda_memset(dO, 0xff, nv * 2));
            if (path == 0) {
                ST_OK(qd_cuda_gdn_inputs(&in, NULL));
                ST_OK(qd_cuda_gdn_decode(&dec, NULL));
            } else {
                ST_OK(qd_cuda_gdn_decode_inputs(&in, &dec, NULL));
            }
            ST_OK(qd_cuda_sync());
            ST_OK(qd_cuda_memcpy_d2h(ho[path], dO, nv * 2));
            ST_OK(qd_cuda_memcpy_d2h(hS[path], dS, nst * 4));
            ST_OK(qd_cuda_memcpy_d2h(hc[path], dcv, ncv * 4));
        }
        for (size_t i = 0; i < nv; i++) {
            bad_o += ho[0][i] != ho[1][i];
            nan_o += isnan(qd_bf16_to_f32(ho[1][i]));
        }
        for (size_t i = 0; i < nst; i++) bad_s += memcmp(&hS[0][i], &hS[1][i], 4) != 0;
        for (size_t i = 0; i < ncv; i++) bad_c += memcmp(&hc[0][i], &hc[1][i], 4) != 0;
        for (int b = 0; b < n_seq; b++) { /* the two-kernel path itself moved every state it owns */
            const int so = slot_out ? outs[b] : slot[b];
            moved += memcmp(hS[0] + (size_t)so * per, S + (size_t)so * per, per * 4) != 0;
            moved += memcmp(hc[0] + (size_t)cslot[b] * C * (K - 1), cv + (size_t)cslot[b] * C * (K - 1),
                            (size_t)C * (K - 1) * 4) != 0;
        }
    }
    printf("  one launch vs two: outputs %zu/%zu differ, states %zu/%zu, conv states %zu/%zu\n", bad_o,
           nv * rounds, bad_s, nst * rounds, bad_c, ncv * rounds);
    CHECKF(bad_o == 0 && bad_s == 0 && bad_c == 0 && nan_o == 0,
           "decode with its inputs hk=%d hv=%d dk=%d dv=%d seqs=%d: %zu outputs (%zu NaN), %zu states, %zu conv states "
           "differ from gdn_inputs + gdn_decode",
           hk, hv, dk, dv, n_seq, bad_o, nan_o, bad_s, bad_c);
    CHECKF(moved == (size_t)2 * n_seq * rounds,
           "decode with its inputs: the reference path left %zu of %d states unchanged",
           (size_t)2 * n_seq * rounds - moved, 2 * n_seq * rounds);
free_dev:
    qd_cuda_free(dx); qd_cuda_free(dw); qd_cuda_free(dA); qd_cuda_free(dd); qd_cuda_free(dcv); qd_cuda_free(dS);
    qd_cuda_free(dsp); qd_cuda_free(drs); qd_cuda_free(dslot); qd_cuda_free(douts); qd_cuda_free(dq);
    qd_cuda_free(dk_); qd_cuda_free(dvv); qd_cuda_free(dO); qd_cuda_free(dg); qd_cuda_free(db);
out:
    free(x); free(w); free(cv); free(S); free(A); free(dtb); free(spans); free(row_span); free(slot); free(cslot);
    free(outs); free(hS[0]); free(hS[1]); free(hc[0]); free(hc[1]); free(ho[0]); free(ho[1]);
}

/* Shapes the one-launch decode refuses (the layer then runs the two kernels), and its
 * launcher's answer when called with them anyway. */
static void decode_inputs_refused(void) {
    qd_cuda_gdn_in_args in = {1, 4, 4, 128, 32, 4, 1, NULL, 0, NULL, NULL, 0, NULL, NULL, NULL,
                              NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, 1, 0, NULL};
    qd_cuda_gdn_decode_args dec = {4, 4, 128, 32, 1, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, 0, 0,
                                   NULL, 1};
    CHECKF(!qd_cuda_gdn_decode_inputs_supported(&in, &dec), "one block a key head makes 256 q/k channels: refused");
    in.hv = dec.hv = 8; /* 2 value heads: 2 blocks, 128 channels each */
    CHECKF(qd_cuda_gdn_decode_inputs_supported(&in, &dec), "2-block clusters: taken");
    in.K = 3;
    CHECKF(!qd_cuda_gdn_decode_inputs_supported(&in, &dec), "conv width 3: refused");
    in.K = 4;
    in.decode_only = 0;
    CHECKF(!qd_cuda_gdn_decode_inputs_supported(&in, &dec), "spans of several rows: refused");
    in.decode_only = 1;
    in.dv = dec.dv = 48;
    CHECKF(!qd_cuda_gdn_decode_inputs_supported(&in, &dec), "dv 48: refused");
    in.dv = dec.dv = 32;
    in.n = dec.n_seq = 17;
    CHECKF(!qd_cuda_gdn_decode_inputs_supported(&in, &dec), "17 sequences: refused");
    in.n = dec.n_seq = 1;
    in.hv = dec.hv = 4 * 17;
    CHECKF(!qd_cuda_gdn_decode_inputs_supported(&in, &dec), "clusters of 17 blocks: refused");
    CHECK(qd_cuda_gdn_decode_inputs(&in, &dec, NULL) == QD_ERR_INVALID_ARG);
    in.hv = dec.hv = 8;
    CHECK(qd_cuda_gdn_decode_inputs(&in, &dec, NULL) == QD_ERR_INVALID_ARG); /* null pointers */
}

int main(void) {
    if (qd_cuda_device_count() <= 0) return qd_test_skip("test_cuda_gdn", "no CUDA device");
    char name[128];
    int sms = 0;
    if (qd_cuda_device_info(name, sizeof name, &sms) == QD_OK) printf("device: %s, %d SMs\n", name, sms);
    qd_test_rng rng = qd_test_rng_from_env();
    qd_threadpool *pool = qd_threadpool_create(0);

    /* Decode: fast path (dk 128/64/256, dv % 32 == 0) and the generic kernel. */
    decode_case(pool, &rng, 4, 2, 128, 128, 37, 50);
    decode_case(pool, &rng, 2, 3, 64, 96, 5, 9);
    decode_case(pool, &rng, 1, 2, 256, 32, 3, 3);
    decode_case(pool, &rng, 3, 1, 96, 80, 7, 8);
    decode_case(pool, &rng, 1, 1, 5, 3, 2, 2);
    /* Verify spans in one launch: the fast path at each head size, the generic kernel */
    const int s1[] = {4, 4, 2, 1};
    decode_spans_case(&rng, 4, 2, 128, 128, s1, 4);
    const int s2[] = {8, 3, 3};
    decode_spans_case(&rng, 2, 3, 64, 96, s2, 3);
    const int s3[] = {2, 2};
    decode_spans_case(&rng, 1, 2, 256, 32, s3, 2);
    const int s4[] = {3, 1};
    decode_spans_case(&rng, 3, 1, 96, 80, s4, 2);

    /* Decode with its inputs in one launch: the 35B-A3B's heads (clusters of 8), the 27B's (12),
     * small and large head dims, as many sequences as it takes */
    decode_inputs_case(&rng, 16, 2, 128, 128, 1, 0, 1);
    decode_inputs_case(&rng, 16, 3, 128, 128, 3, 0, 1);
    decode_inputs_case(&rng, 2, 2, 64, 64, 5, 1, 1);
    decode_inputs_case(&rng, 1, 1, 256, 128, 2, 0, 1);
    decode_inputs_case(&rng, 2, 4, 128, 32, 16, 1, 1);
    /* the 35B-A3B's GDN shape at 16 sequences, 48 rounds: 3.1M q / k values, 3.1M v, through both paths */
    decode_inputs_case(&rng, 16, 2, 128, 128, 16, 0, 48);
    decode_inputs_refused();

    /* Chunked: the spans named in the issue, GQA 2, with an initial state,
     * plus the recurrent decode kernel stepped over the same batch. */
    const int l1[] = {1, 63, 64, 65, 200};
    chunked_case(pool, &rng, 2, 2, 128, 128, l1, 5, 1, 1);
    const int l2[] = {130, 0, 5};
    chunked_case(pool, &rng, 1, 3, 64, 48, l2, 3, 0, 0); /* dv % 32 != 0: 16-column state tiles */
    const int l3[] = {70};
    chunked_case(pool, &rng, 1, 1, 256, 256, l3, 1, 1, 0); /* largest head dims */
    const int l4[] = {17, 129};
    chunked_case(pool, &rng, 2, 1, 32, 16, l4, 2, 1, 1);
    const int l5[] = {1000};
    chunked_case(pool, &rng, 1, 2, 128, 128, l5, 1, 1, 0); /* long span: error growth over 16 chunks */
    const int l6[] = {100, 64, 1};
    chunked_case(pool, &rng, 2, 2, 128, 48, l6, 3, 1, 0); /* 3 state tiles: a walk block with an idle warp */
    const int l7[] = {33, 190};
    chunked_case(pool, &rng, 3, 1, 96, 64, l7, 2, 1, 0); /* dk padded to 128 inside the kernels */
    /* Pooled states: 4 sequences (one empty) over 7 permuted slots, in place. */
    const int l8[] = {65, 0, 130, 7};
    chunked_slots_case(pool, &rng, 2, 2, 128, 128, l8, 4, 7);
    const int l9[] = {20, 64};
    chunked_slots_case(pool, &rng, 1, 3, 64, 32, l9, 2, 5);

    qd_threadpool_free(pool);
    return qd_test_finish("test_cuda_gdn");
}

#else /* no CUDA compiler: nothing to test */

int main(void) { return qd_test_skip("test_cuda_gdn", "built without CUDA"); }

#endif
