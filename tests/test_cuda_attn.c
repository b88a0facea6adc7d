/* CUDA gated-attention kernels (qd_cuda_attn_prep + qd_cuda_attn) against the
 * CPU reference of src/backend/cpu/cpu_layer_attn.c: qd_cpu_rmsnorm (zero-centred, w
 * offset 1), qd_cpu_rope_neox, qd_cpu_attention, sigmoid gate. Fresh random
 * inputs from a printed seed; awkward ragged batches: spans of 1, 5, 16, 63,
 * 64, 65, 200 rows at aligned and unaligned start positions, decode-only,
 * prefill-only and mixed batches, block sizes 16 and 7 with shuffled block
 * ids, two layers sharing each block (this one second), GQA 16/2, 32/2, 24/1,
 * 8/8, 6/3, 4/2, 4/1, head dims 256, 128, 64, 40, 32, gated and not, partial
 * rotary. Outputs, query scratch and split-K scratch are poisoned (NaN) and
 * every element of the output, the queries and the whole cache is checked:
 * new cache rows against the CPU within bf16 rounding, every other cache
 * element bit-exact against its old contents. The attention reference reads
 * fp32 copies of the GPU's bf16 cache (checked first) and the CPU's fp32
 * queries, so the difference is the kernels' bf16 query, probabilities and
 * output rounding. Every case runs in the normal and the batch-invariant mode,
 * and twice (the second run bit-identical: deterministic combine). Then the
 * invariance check: rows of a few sequences computed as one span, alone, with
 * prompts cut over several calls and as decode rows in batches of 1..300 must
 * be memcmp-identical in invariant mode (the normal mode's differences are
 * printed as a control). Spans longer than QD_CUDA_ATTN_INV_SPAN_ROWS take the
 * span kernel, the decode rows (spans of at most that many rows, checked) the
 * decode kernel, so the check compares the two kernels bit for bit: GQA 8, 4,
 * 2, 16 and 6 (pairs of one row split over blocks), head dims 256, 128 and 40,
 * gated and not, block sizes 16, 7, 5, 13 and 3, one context slice and up to
 * 16, sequences of 1..3000 rows, several sequences in one block of the span
 * kernel, spans split over the scratch's row groups. Skips (77) without a GPU. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu_ops.h"
#include "base/threadpool.h"
#include "qd_test.h"
#ifdef QD_HAVE_CUDA
#include "backend/cuda/cuda_attn.h"
#include "backend/cuda/cuda_gdn.h"
#include "backend/cuda/cuda_device.h"
#include "qd_test_cuda.h"
#endif

#ifdef QD_HAVE_CUDA




/* got (bf16) against ref: every element finite and within atol * max|ref| +
 * rtol * |ref|, and the relative L2 error within l2_tol. */
static void compare(const char *what, const uint16_t *got, const float *ref, size_t n, double atol, double rtol,
                    double l2_tol) {
    double mx = 0, ss = 0, se = 0, maxe = 0;
    for (size_t i = 0; i < n; i++) {
        if (fabs(ref[i]) > mx) mx = fabs(ref[i]);
        ss += (double)ref[i] * ref[i];
    }
    size_t bad = 0, first = 0;
    for (size_t i = 0; i < n; i++) {
        const double g = qd_bf16_to_f32(got[i]), e = fabs(g - ref[i]);
        if (!isfinite(g) || !(e <= atol * mx + rtol * fabs(ref[i]))) {
            if (!bad) first = i;
            bad++;
        }
        if (isfinite(g)) {
            se += e * e;
            if (e > maxe) maxe = e;
        }
    }
    const double l2 = ss > 0 ? sqrt(se / ss) : sqrt(se);
    printf("  %-22s n=%-9zu max|ref|=%.3e max_err=%.3e (%.2e of max) rel_l2=%.2e bad=%zu\n", what, n, mx, maxe,
           mx > 0 ? maxe / mx : maxe, l2, bad);
    CHECKF(bad == 0, "%s: %zu bad elements, first %zu: got %g want %g", what, bad, first,
           bad ? qd_bf16_to_f32(got[first]) : 0.0, bad ? ref[first] : 0.0);
    CHECKF(l2 <= l2_tol, "%s: relative L2 error %.3e > %.1e", what, l2, l2_tol);
}

typedef struct {
    int T, pos0;
} span_def;

typedef struct {
    const char *name;
    int nq, nkv, hd, rope_dim, gated, bs, max_ctx;
    float theta;
} shape_def;

#define NLAY 2 /* attention layers sharing a cache block; the one under test is the second */

static void run_case(qd_threadpool *pool, qd_test_rng *rng, const shape_def *c, const span_def *sp, int n_spans,
                     int invariant) {
    const int nq = c->nq, nkv = c->nkv, hd = c->hd, bs = c->bs, kvd = nkv * hd;
    const int qw = (c->gated ? 2 : 1) * hd;
    const float eps = 1e-6f;
    int n_rows = 0, max_span = 0;
    for (int i = 0; i < n_spans; i++) {
        n_rows += sp[i].T;
        if (sp[i].T > max_span) max_span = sp[i].T;
        if (sp[i].pos0 + sp[i].T > c->max_ctx) {
            CHECKF(0, "%s: span %d exceeds max_ctx", c->name, i);
            return;
        }
    }
    const int n_slots = n_spans + 1, mbps = (c->max_ctx + bs - 1) / bs, n_blocks = n_slots * mbps;
    const int64_t stride = (int64_t)NLAY * bs * kvd, layer_off = (int64_t)bs * kvd;
    const size_t n_cache = (size_t)n_blocks * stride;
    printf("%s%s: nq=%d nkv=%d hd=%d rope=%d gated=%d bs=%d max_ctx=%d rows=%d spans=%d:", c->name,
           invariant ? " (invariant)" : "", nq, nkv, hd, c->rope_dim, c->gated, bs, c->max_ctx, n_rows, n_spans);
    for (int i = 0; i < n_spans && i < 12; i++) printf(" %d@%d", sp[i].T, sp[i].pos0);
    printf("%s\n", n_spans > 12 ? " ..." : "");

    /* slots: a shuffled assignment; block tables: a shuffled permutation of all blocks */
    int32_t *slot_of = malloc(sizeof(int32_t) * n_slots), *table = malloc(sizeof(int32_t) * n_blocks);
    int32_t *spans = malloc(sizeof(int32_t) * 4 * n_spans), *row_slot = malloc(sizeof(int32_t) * n_rows);
    int32_t *row_pos = malloc(sizeof(int32_t) * n_rows);
    float *qg = malloc(sizeof(float) * n_rows * nq * qw), *kin = malloc(sizeof(float) * n_rows * kvd);
    float *vin = malloc(sizeof(float) * n_rows * kvd), *qnw = malloc(sizeof(float) * hd);
    float *knw = malloc(sizeof(float) * hd), *qf = malloc(sizeof(float) * n_rows * nq * hd);
    float *gate = malloc(sizeof(float) * n_rows * nq * hd), *kn = malloc(sizeof(float) * n_rows * kvd);
    float *ref = malloc(sizeof(float) * n_rows * nq * hd), *qref = malloc(sizeof(float) * n_rows * nq * hd);
    uint16_t *kc0 = malloc(2 * n_cache), *vc0 = malloc(2 * n_cache), *kc1 = malloc(2 * n_cache);
    uint16_t *vc1 = malloc(2 * n_cache), *hq = malloc(2 * (size_t)n_rows * nq * hd);
    uint16_t *hout = malloc(2 * (size_t)n_rows * nq * hd), *hout2 = malloc(2 * (size_t)n_rows * nq * hd);
    uint8_t *is_new = calloc(n_cache, 1);
    float *kf = malloc(sizeof(float) * n_cache), *vf = malloc(sizeof(float) * n_cache);
    float *kexp = malloc(sizeof(float) * n_cache);
    CHECK(slot_of && table && spans && row_slot && row_pos && qg && kin && vin && qnw && knw && qf && gate && kn &&
          ref && qref && kc0 && vc0 && kc1 && vc1 && hq && hout && hout2 && is_new && kf && vf && kexp);
    if (!(slot_of && table && spans && row_slot && row_pos && qg && kin && vin && qnw && knw && qf && gate && kn &&
          ref && qref && kc0 && vc0 && kc1 && vc1 && hq && hout && hout2 && is_new && kf && vf && kexp))
        goto out;
    for (int i = 0; i < n_slots; i++) slot_of[i] = i;
    for (int i = n_slots - 1; i > 0; i--) {
        const int j = (int)(qd_test_next(rng) % (uint64_t)(i + 1));
        const int t = slot_of[i]; slot_of[i] = slot_of[j]; slot_of[j] = t;
    }
    for (int i = 0; i < n_blocks; i++) table[i] = i;
    for (int i = n_blocks - 1; i > 0; i--) {
        const int j = (int)(qd_test_next(rng) % (uint64_t)(i + 1));
        const int t = table[i]; table[i] = table[j]; table[j] = t;
    }
    /* cache: NaN everywhere (other layer, unused positions, rows this batch writes),
     * random bf16 for each sequence's earlier positions */
    memset(kc0, 0xff, 2 * n_cache);
    memset(vc0, 0xff, 2 * n_cache);
    for (int i = 0, r = 0; i < n_spans; i++) {
        const int s = slot_of[i];
        spans[4 * i] = r; spans[4 * i + 1] = sp[i].T; spans[4 * i + 2] = sp[i].pos0; spans[4 * i + 3] = s;
        for (int p = 0; p < sp[i].pos0; p++) {
            const size_t off = (size_t)table[s * mbps + p / bs] * stride + layer_off + (size_t)(p % bs) * kvd;
            for (int e = 0; e < kvd; e++) {
                kc0[off + e] = qd_f32_to_bf16(1.5f * qd_test_normal(rng));
                vc0[off + e] = qd_f32_to_bf16(qd_test_normal(rng));
            }
        }
        for (int t = 0; t < sp[i].T; t++, r++) {
            row_slot[r] = s;
            row_pos[r] = sp[i].pos0 + t;
        }
    }
    for (size_t i = 0; i < (size_t)n_rows * nq * qw; i++) qg[i] = qd_test_normal(rng);
    for (size_t i = 0; i < (size_t)n_rows * kvd; i++) {
        kin[i] = 2.0f * qd_test_normal(rng);
        vin[i] = qd_test_normal(rng);
    }
    for (int i = 0; i < hd; i++) {
        qnw[i] = 0.5f + 0.3f * qd_test_normal(rng);
        knw[i] = 0.5f + 0.3f * qd_test_normal(rng);
    }

    /* CPU reference: split, norms, rope (as src/backend/cpu/cpu_layer_attn.c) */
    for (int r = 0; r < n_rows; r++)
        for (int h = 0; h < nq; h++) {
            const float *src = qg + ((size_t)r * nq + h) * qw;
            memcpy(qf + ((size_t)r * nq + h) * hd, src, sizeof(float) * hd);
            if (c->gated) memcpy(gate + ((size_t)r * nq + h) * hd, src + hd, sizeof(float) * hd);
        }
    memcpy(kn, kin, sizeof(float) * n_rows * kvd);
    qd_cpu_rmsnorm(qf, (int64_t)n_rows * nq, hd, hd, qnw, 1.0f, eps, qf, hd);
    qd_cpu_rmsnorm(kn, (int64_t)n_rows * nkv, hd, hd, knw, 1.0f, eps, kn, hd);
    qd_cpu_rope_neox(qf, n_rows, nq, hd, (int64_t)nq * hd, c->rope_dim, c->theta, row_pos);
    qd_cpu_rope_neox(kn, n_rows, nkv, hd, kvd, c->rope_dim, c->theta, row_pos);
    const float scale = 1.0f / sqrtf((float)hd);
    for (size_t i = 0; i < (size_t)n_rows * nq * hd; i++) qref[i] = qf[i] * scale;

    /* GPU */
    {
        int32_t *d_table = qd_test_dev_upload(table, sizeof(int32_t) * n_blocks);
        int32_t *d_spans = qd_test_dev_upload(spans, sizeof(int32_t) * 4 * n_spans);
        int32_t *d_rs = qd_test_dev_upload(row_slot, sizeof(int32_t) * n_rows), *d_rp = qd_test_dev_upload(row_pos, sizeof(int32_t) * n_rows);
        float *d_qg = qd_test_dev_upload(qg, sizeof(float) * n_rows * nq * qw), *d_k = qd_test_dev_upload(kin, sizeof(float) * n_rows * kvd);
        float *d_v = qd_test_dev_upload(vin, sizeof(float) * n_rows * kvd), *d_qn = qd_test_dev_upload(qnw, sizeof(float) * hd);
        float *d_kn = qd_test_dev_upload(knw, sizeof(float) * hd);
        uint16_t *d_kc = qd_test_dev_upload(kc0, 2 * n_cache), *d_vc = qd_test_dev_upload(vc0, 2 * n_cache);
        uint16_t *d_q = qd_test_dev_upload(NULL, 2 * (size_t)n_rows * nq * hd), *d_out = qd_test_dev_upload(NULL, 2 * (size_t)n_rows * nq * hd);
        const size_t wb = qd_cuda_attn_work_bytes(n_rows, nq, hd, c->max_ctx, invariant);
        float *d_work = qd_test_dev_upload(NULL, wb ? wb : 4);
        const int ok = d_table && d_spans && d_rs && d_rp && d_qg && d_k && d_v && d_qn && d_kn && d_kc && d_vc &&
                       d_q && d_out && d_work;
        CHECK(ok);
        if (ok) {
            ST_OK(qd_cuda_memset(d_q, 0xff, 2 * (size_t)n_rows * nq * hd));
            ST_OK(qd_cuda_memset(d_out, 0xff, 2 * (size_t)n_rows * nq * hd));
            ST_OK(qd_cuda_memset(d_work, 0xff, wb ? wb : 4));
            qd_cuda_attn_args a;
            memset(&a, 0, sizeof a);
            a.n_rows = n_rows; a.nq = nq; a.nkv = nkv; a.hd = hd; a.rope_dim = c->rope_dim;
            a.rope_theta = c->theta; a.eps = eps; a.gated = c->gated;
            a.d_qg = d_qg; a.d_k = d_k; a.d_v = d_v; a.d_q_norm = d_qn; a.d_k_norm = d_kn;
            a.d_row_slot = d_rs; a.d_row_pos = d_rp; a.d_spans = d_spans; a.n_spans = n_spans;
            a.max_span_rows = max_span; a.max_ctx = c->max_ctx;
            a.d_block_tables = d_table; a.max_blocks_per_seq = mbps; a.block_size = bs; a.block_stride = stride;
            a.d_kcache = d_kc + layer_off; a.d_vcache = d_vc + layer_off;
            a.d_q = d_q; a.d_out = d_out; a.d_work = d_work; a.invariant = invariant;
            ST_OK(qd_cuda_attn_prep(&a, NULL));
            ST_OK(qd_cuda_attn(&a, NULL));
            ST_OK(qd_cuda_sync());
            ST_OK(qd_cuda_memcpy_d2h(hq, d_q, 2 * (size_t)n_rows * nq * hd));
            ST_OK(qd_cuda_memcpy_d2h(hout, d_out, 2 * (size_t)n_rows * nq * hd));
            /* a second run of the same batch over freshly poisoned outputs and scratch:
             * bit for bit the same (the combine's fixed summation order) */
            ST_OK(qd_cuda_memset(d_out, 0xff, 2 * (size_t)n_rows * nq * hd));
            ST_OK(qd_cuda_memset(d_work, 0xff, wb ? wb : 4));
            ST_OK(qd_cuda_attn(&a, NULL));
            ST_OK(qd_cuda_sync());
            ST_OK(qd_cuda_memcpy_d2h(hout2, d_out, 2 * (size_t)n_rows * nq * hd));
            CHECKF(memcmp(hout, hout2, 2 * (size_t)n_rows * nq * hd) == 0, "%s: a second run of the batch differs",
                   c->name);
            ST_OK(qd_cuda_memcpy_d2h(kc1, d_kc, 2 * n_cache));
            ST_OK(qd_cuda_memcpy_d2h(vc1, d_vc, 2 * n_cache));
        }
        qd_cuda_free(d_table); qd_cuda_free(d_spans); qd_cuda_free(d_rs); qd_cuda_free(d_rp);
        qd_cuda_free(d_qg); qd_cuda_free(d_k); qd_cuda_free(d_v); qd_cuda_free(d_qn); qd_cuda_free(d_kn);
        qd_cuda_free(d_kc); qd_cuda_free(d_vc); qd_cuda_free(d_q); qd_cuda_free(d_out); qd_cuda_free(d_work);
        if (!ok) goto out;
    }

    compare("queries (d_q)", hq, qref, (size_t)n_rows * nq * hd, 1e-3, 8e-3, 5e-3);

    /* cache: rows written by this batch against the CPU keys / exact bf16 values;
     * every other element unchanged bit for bit */
    for (size_t i = 0; i < n_cache; i++) kexp[i] = qd_bf16_to_f32(kc0[i]);
    for (int r = 0; r < n_rows; r++) {
        const int p = row_pos[r];
        const size_t off = (size_t)table[row_slot[r] * mbps + p / bs] * stride + layer_off + (size_t)(p % bs) * kvd;
        for (int e = 0; e < kvd; e++) {
            is_new[off + e] = 1;
            kexp[off + e] = kn[(size_t)r * kvd + e];
            vc0[off + e] = qd_f32_to_bf16(vin[(size_t)r * kvd + e]);
        }
    }
    {
        size_t bad_old = 0, bad_v = 0;
        for (size_t i = 0; i < n_cache; i++) {
            if (!is_new[i] && kc1[i] != kc0[i]) bad_old++;
            if (vc1[i] != vc0[i]) bad_v++;
        }
        CHECKF(bad_old == 0, "%s: %zu key cache elements outside this batch's rows changed", c->name, bad_old);
        CHECKF(bad_v == 0, "%s: %zu value cache elements differ (new rows: exact bf16 of v; others: unchanged)",
               c->name, bad_v);
        /* new keys: gather them to compare with the usual tolerance */
        size_t nn = (size_t)n_rows * kvd, j = 0;
        uint16_t *gk = malloc(2 * nn);
        float *rk = malloc(sizeof(float) * nn);
        CHECK(gk && rk);
        if (gk && rk) {
            for (size_t i = 0; i < n_cache; i++)
                if (is_new[i]) {
                    gk[j] = kc1[i];
                    rk[j++] = kexp[i];
                }
            CHECK(j == nn);
            compare("new cache keys", gk, rk, j, 1e-3, 8e-3, 5e-3);
        }
        free(gk);
        free(rk);
    }

    /* attention reference over fp32 copies of the GPU's cache */
    for (size_t i = 0; i < n_cache; i++) {
        kf[i] = qd_bf16_to_f32(kc1[i]);
        vf[i] = qd_bf16_to_f32(vc1[i]);
    }
    for (int i = 0; i < n_spans; i++) {
        const int r0 = spans[4 * i];
        qd_kv_view view = {kf + layer_off, vf + layer_off, table + (size_t)spans[4 * i + 3] * mbps, bs, stride};
        qd_cpu_attention(pool, qf + (size_t)r0 * nq * hd, (int64_t)nq * hd, &view, sp[i].T, sp[i].pos0, nq, nkv, hd,
                         scale, ref + (size_t)r0 * nq * hd);
    }
    if (c->gated)
        for (size_t i = 0; i < (size_t)n_rows * nq * hd; i++) ref[i] *= qd_sigmoid(gate[i]);
    compare("attention output", hout, ref, (size_t)n_rows * nq * hd, 2e-2, 0.0, 1e-2);

out:
    free(slot_of); free(table); free(spans); free(row_slot); free(row_pos); free(qg); free(kin); free(vin);
    free(qnw); free(knw); free(qf); free(gate); free(kn); free(ref); free(qref); free(kc0); free(vc0);
    free(kc1); free(vc1); free(hq); free(hout); free(hout2); free(is_new); free(kf); free(vf); free(kexp);
}

/* ---------------------------------------------------------------- (ii) batch invariance
 * A world of sequences with fixed inputs per (sequence, position) goes through the
 * kernels in several ways; in invariant mode each output row must be the same bits
 * in every way. Calls run on one persistent device cache (as the engine's): keys of
 * earlier calls are read from it. The normal mode runs the same ways as a control
 * (its differences are printed, not checked). */

typedef struct {
    const shape_def *c;
    int n_seq, total, mbps, n_blocks, qw, invariant;
    int max_span_seen;            /* largest span of the calls since it was reset */
    const int *len;
    int *first;                   /* [n_seq] global row id of position 0 */
    int32_t *slot_of, *table;     /* sequence -> slot; block tables [slot][mbps] */
    float *qg, *k, *v, *qn, *kn;  /* inputs per global row id */
    /* device */
    int32_t *d_table, *d_spans, *d_rs, *d_rp;
    float *d_qg, *d_k, *d_v, *d_qn, *d_kn, *d_work;
    uint16_t *d_kc, *d_vc, *d_q, *d_out;
    size_t n_cache, wb;
    /* host staging of one call */
    int32_t *spans, *rs, *rp;
    float *sqg, *sk, *sv;
    uint16_t *sout;
} inv_world;

/* One forward call over the rows gids[0..n-1] (global row ids): consecutive
 * positions of one sequence form a span. Output row gid goes to res + gid * nq * hd. */
static int inv_call(inv_world *w, const int *gids, int n, uint16_t *res) {
    const shape_def *c = w->c;
    const int nq = c->nq, kvd = c->nkv * c->hd, qo = nq * c->hd;
    int n_spans = 0, max_span = 0, seq = -1, prev = -2;
    for (int i = 0; i < n; i++) {
        int s = 0;
        while (s + 1 < w->n_seq && w->first[s + 1] <= gids[i]) s++;
        const int pos = gids[i] - w->first[s];
        if (s != seq || pos != prev + 1) {
            w->spans[4 * n_spans] = i; w->spans[4 * n_spans + 1] = 0; w->spans[4 * n_spans + 2] = pos;
            w->spans[4 * n_spans + 3] = w->slot_of[s];
            n_spans++;
        }
        const int cnt = ++w->spans[4 * (n_spans - 1) + 1];
        if (cnt > max_span) max_span = cnt;
        if (cnt > w->max_span_seen) w->max_span_seen = cnt;
        seq = s; prev = pos;
        w->rs[i] = w->slot_of[s];
        w->rp[i] = pos;
        memcpy(w->sqg + (size_t)i * nq * w->qw, w->qg + (size_t)gids[i] * nq * w->qw, sizeof(float) * nq * w->qw);
        memcpy(w->sk + (size_t)i * kvd, w->k + (size_t)gids[i] * kvd, sizeof(float) * kvd);
        memcpy(w->sv + (size_t)i * kvd, w->v + (size_t)gids[i] * kvd, sizeof(float) * kvd);
    }
    const int ok = qd_cuda_memcpy_h2d(w->d_spans, w->spans, sizeof(int32_t) * 4 * n_spans) == QD_OK &&
                   qd_cuda_memcpy_h2d(w->d_rs, w->rs, sizeof(int32_t) * n) == QD_OK &&
                   qd_cuda_memcpy_h2d(w->d_rp, w->rp, sizeof(int32_t) * n) == QD_OK &&
                   qd_cuda_memcpy_h2d(w->d_qg, w->sqg, sizeof(float) * n * nq * w->qw) == QD_OK &&
                   qd_cuda_memcpy_h2d(w->d_k, w->sk, sizeof(float) * n * kvd) == QD_OK &&
                   qd_cuda_memcpy_h2d(w->d_v, w->sv, sizeof(float) * n * kvd) == QD_OK &&
                   qd_cuda_memset(w->d_out, 0xff, 2 * (size_t)n * qo) == QD_OK &&
                   qd_cuda_memset(w->d_work, 0xff, w->wb) == QD_OK;
    CHECKF(ok, "invariance: uploads: %s", qd_cuda_last_error());
    if (!ok) return 0;
    qd_cuda_attn_args a;
    memset(&a, 0, sizeof a);
    a.n_rows = n; a.nq = nq; a.nkv = c->nkv; a.hd = c->hd; a.rope_dim = c->rope_dim; a.rope_theta = c->theta;
    a.eps = 1e-6f; a.gated = c->gated;
    a.d_qg = w->d_qg; a.d_k = w->d_k; a.d_v = w->d_v; a.d_q_norm = w->d_qn; a.d_k_norm = w->d_kn;
    a.d_row_slot = w->d_rs; a.d_row_pos = w->d_rp; a.d_spans = w->d_spans; a.n_spans = n_spans;
    a.max_span_rows = max_span; a.max_ctx = c->max_ctx;
    a.d_block_tables = w->d_table; a.max_blocks_per_seq = w->mbps; a.block_size = c->bs;
    a.block_stride = (int64_t)c->bs * kvd; a.d_kcache = w->d_kc; a.d_vcache = w->d_vc;
    a.d_q = w->d_q; a.d_out = w->d_out; a.d_work = w->d_work; a.invariant = w->invariant;
    qd_status st = qd_cuda_attn_prep(&a, NULL);
    if (st == QD_OK) st = qd_cuda_attn(&a, NULL);
    if (st == QD_OK) st = qd_cuda_sync();
    if (st == QD_OK) st = qd_cuda_memcpy_d2h(w->sout, w->d_out, 2 * (size_t)n * qo);
    CHECKF(st == QD_OK, "invariance: call of %d rows: %s: %s", n, qd_status_name(st), qd_cuda_last_error());
    if (st != QD_OK) return 0;
    for (int i = 0; i < n; i++) memcpy(res + (size_t)gids[i] * qo, w->sout + (size_t)i * qo, 2 * (size_t)qo);
    return 1;
}

/* Rows of res whose bits differ from ref; prints the first in invariant mode. */
static size_t inv_diff(const inv_world *w, const char *what, const uint16_t *ref, const uint16_t *res) {
    const size_t qo = (size_t)w->c->nq * w->c->hd;
    size_t bad = 0;
    for (int s = 0; s < w->n_seq; s++)
        for (int p = 0; p < w->len[s]; p++) {
            const size_t g = (size_t)w->first[s] + p;
            if (memcmp(ref + g * qo, res + g * qo, 2 * qo)) {
                if (!bad && w->invariant)
                    printf("    %s: first differing row: sequence %d (length %d) position %d\n", what, s, w->len[s], p);
                bad++;
            }
        }
    return bad;
}

#define INV_MAX_SEQ 16

static void shuffle_ints(qd_test_rng *rng, int *x, int n) {
    for (int i = n - 1; i > 0; i--) {
        const int j = (int)(qd_test_next(rng) % (uint64_t)(i + 1));
        const int t = x[i]; x[i] = x[j]; x[j] = t;
    }
}

static void invariance_case(qd_test_rng *rng, const shape_def *c, const int *len, int n_seq) {
    inv_world W, *w = &W;
    memset(w, 0, sizeof W);
    if (n_seq > INV_MAX_SEQ) n_seq = INV_MAX_SEQ;
    w->c = c; w->len = len; w->n_seq = n_seq; w->qw = (c->gated ? 2 : 1) * c->hd;
    const int nq = c->nq, kvd = c->nkv * c->hd, qo = nq * c->hd;
    int first[INV_MAX_SEQ];
    w->first = first;
    for (int s = 0; s < n_seq; s++) {
        w->first[s] = w->total;
        w->total += len[s];
    }
    const int T = w->total;
    printf("invariance %s: nq=%d nkv=%d hd=%d gated=%d bs=%d max_ctx=%d, %d rows, sequence lengths", c->name, nq,
           c->nkv, c->hd, c->gated, c->bs, c->max_ctx, T);
    for (int s = 0; s < n_seq; s++) printf(" %d", len[s]);
    printf("\n");
    w->mbps = (c->max_ctx + c->bs - 1) / c->bs;
    w->n_blocks = n_seq * w->mbps;
    w->n_cache = (size_t)w->n_blocks * c->bs * kvd;
    w->slot_of = malloc(sizeof(int32_t) * n_seq);
    w->table = malloc(sizeof(int32_t) * w->n_blocks);
    w->qg = malloc(sizeof(float) * T * nq * w->qw);
    w->k = malloc(sizeof(float) * T * kvd);
    w->v = malloc(sizeof(float) * T * kvd);
    w->qn = malloc(sizeof(float) * c->hd);
    w->kn = malloc(sizeof(float) * c->hd);
    w->spans = malloc(sizeof(int32_t) * 4 * T);
    w->rs = malloc(sizeof(int32_t) * T);
    w->rp = malloc(sizeof(int32_t) * T);
    w->sqg = malloc(sizeof(float) * T * nq * w->qw);
    w->sk = malloc(sizeof(float) * T * kvd);
    w->sv = malloc(sizeof(float) * T * kvd);
    w->sout = malloc(2 * (size_t)T * qo);
    enum { S_SPAN, S_ALONE, S_CUT, S_DECODE, S_N };
    static const char *const sname[S_N] = {"one call, a span per sequence", "each sequence alone, one span",
                                           "prompts cut over several calls", "decode rows, batches of 1..300"};
    uint16_t *res[S_N];
    for (int i = 0; i < S_N; i++) res[i] = malloc(2 * (size_t)T * qo);
    uint16_t *cache_a = malloc(2 * w->n_cache), *cache_b = malloc(2 * w->n_cache);
    int *gids = malloc(sizeof(int) * T), *piece = malloc(sizeof(int) * T);
    int ok = w->slot_of && w->table && w->qg && w->k && w->v && w->qn && w->kn && w->spans && w->rs && w->rp &&
             w->sqg && w->sk && w->sv && w->sout && cache_a && cache_b && gids && piece;
    for (int i = 0; i < S_N; i++) ok = ok && res[i];
    CHECK(ok);
    if (ok) {
        for (int i = 0; i < n_seq; i++) w->slot_of[i] = i;
        shuffle_ints(rng, w->slot_of, n_seq);
        for (int i = 0; i < w->n_blocks; i++) w->table[i] = i;
        shuffle_ints(rng, w->table, w->n_blocks);
        for (size_t i = 0; i < (size_t)T * nq * w->qw; i++) w->qg[i] = qd_test_normal(rng);
        for (size_t i = 0; i < (size_t)T * kvd; i++) {
            w->k[i] = 2.0f * qd_test_normal(rng);
            w->v[i] = qd_test_normal(rng);
        }
        for (int i = 0; i < c->hd; i++) {
            w->qn[i] = 0.5f + 0.3f * qd_test_normal(rng);
            w->kn[i] = 0.5f + 0.3f * qd_test_normal(rng);
        }
        const size_t wb0 = qd_cuda_attn_work_bytes(T, nq, c->hd, c->max_ctx, 0);
        const size_t wb1 = qd_cuda_attn_work_bytes(T, nq, c->hd, c->max_ctx, 1);
        w->wb = (wb0 > wb1 ? wb0 : wb1) + 16;
        w->d_table = qd_test_dev_upload(w->table, sizeof(int32_t) * w->n_blocks);
        w->d_spans = qd_test_dev_upload(NULL, sizeof(int32_t) * 4 * T);
        w->d_rs = qd_test_dev_upload(NULL, sizeof(int32_t) * T);
        w->d_rp = qd_test_dev_upload(NULL, sizeof(int32_t) * T);
        w->d_qg = qd_test_dev_upload(NULL, sizeof(float) * T * nq * w->qw);
        w->d_k = qd_test_dev_upload(NULL, sizeof(float) * T * kvd);
        w->d_v = qd_test_dev_upload(NULL, sizeof(float) * T * kvd);
        w->d_qn = qd_test_dev_upload(w->qn, sizeof(float) * c->hd);
        w->d_kn = qd_test_dev_upload(w->kn, sizeof(float) * c->hd);
        w->d_work = qd_test_dev_upload(NULL, w->wb);
        w->d_kc = qd_test_dev_upload(NULL, 2 * w->n_cache);
        w->d_vc = qd_test_dev_upload(NULL, 2 * w->n_cache);
        w->d_q = qd_test_dev_upload(NULL, 2 * (size_t)T * qo);
        w->d_out = qd_test_dev_upload(NULL, 2 * (size_t)T * qo);
        ok = w->d_table && w->d_spans && w->d_rs && w->d_rp && w->d_qg && w->d_k && w->d_v && w->d_qn && w->d_kn &&
             w->d_work && w->d_kc && w->d_vc && w->d_q && w->d_out;
        CHECK(ok);
    }
    for (int mode = 1; ok && mode >= 0; mode--) {
        w->invariant = mode;
        for (int i = 0; i < S_N; i++) memset(res[i], 0xff, 2 * (size_t)T * qo);
        /* one call, every sequence one span, over a fresh NaN cache */
        ok = qd_cuda_memset(w->d_kc, 0xff, 2 * w->n_cache) == QD_OK &&
             qd_cuda_memset(w->d_vc, 0xff, 2 * w->n_cache) == QD_OK;
        for (int g = 0; g < T; g++) gids[g] = g;
        w->max_span_seen = 0;
        ok = ok && inv_call(w, gids, T, res[S_SPAN]);
        const int span_one = w->max_span_seen;
        ok = ok && qd_cuda_memcpy_d2h(cache_a, w->d_kc, 2 * w->n_cache) == QD_OK;
        /* each sequence in a call of its own, over that cache */
        for (int s = 0; ok && s < n_seq; s++) ok = inv_call(w, gids + w->first[s], len[s], res[S_ALONE]);
        /* each prompt cut at up to 4 random positions; call j takes piece j of every
         * sequence that has one, sequences in shuffled order, over a fresh NaN cache */
        ok = ok && qd_cuda_memset(w->d_kc, 0xff, 2 * w->n_cache) == QD_OK &&
             qd_cuda_memset(w->d_vc, 0xff, 2 * w->n_cache) == QD_OK;
        int n_pieces = 0;
        for (int s = 0; s < n_seq; s++) {
            const int cuts = (int)(qd_test_next(rng) % 5);
            int *pc = piece + w->first[s];
            for (int p = 0; p < len[s]; p++) pc[p] = 0;
            for (int k = 0; k < cuts && len[s] > 1; k++) {
                const int at = 1 + (int)(qd_test_next(rng) % (uint64_t)(len[s] - 1));
                for (int p = at; p < len[s]; p++) pc[p]++;
            }
            if (len[s] > 0 && pc[len[s] - 1] + 1 > n_pieces) n_pieces = pc[len[s] - 1] + 1;
        }
        for (int j = 0; ok && j < n_pieces; j++) {
            int order[INV_MAX_SEQ], n = 0;
            for (int s = 0; s < n_seq; s++) order[s] = s;
            shuffle_ints(rng, order, n_seq);
            for (int i = 0; i < n_seq; i++)
                for (int p = 0; p < len[order[i]]; p++)
                    if (piece[w->first[order[i]] + p] == j) gids[n++] = w->first[order[i]] + p;
            if (n) ok = inv_call(w, gids, n, res[S_CUT]);
        }
        ok = ok && qd_cuda_memcpy_d2h(cache_b, w->d_kc, 2 * w->n_cache) == QD_OK;
        if (ok)
            CHECKF(memcmp(cache_a, cache_b, 2 * w->n_cache) == 0,
                   "invariance %s: the key caches of one call and of cut prompts differ", c->name);
        /* every (sequence, position) a row of its own, shuffled, in batches of
         * 1..300 rows over that cache (the first batch 1 row, the second 300) */
        for (int g = 0; g < T; g++) gids[g] = g;
        shuffle_ints(rng, gids, T);
        int n_calls = 0;
        w->max_span_seen = 0;
        for (int g = 0; ok && g < T; n_calls++) {
            int n = n_calls == 0 ? 1 : n_calls == 1 ? 300 : 1 + (int)(qd_test_next(rng) % 300);
            if (n > T - g) n = T - g;
            ok = inv_call(w, gids + g, n, res[S_DECODE]);
            g += n;
        }
        CHECK(ok);
        if (!ok) break;
        /* every row written and finite (two identical NaN poisons would compare equal) */
        size_t nonfinite = 0;
        for (int i = 0; i < S_N; i++)
            for (size_t e = 0; e < (size_t)T * qo; e++)
                if (!isfinite(qd_bf16_to_f32(res[i][e]))) nonfinite++;
        CHECKF(nonfinite == 0, "invariance %s: %zu output elements not finite", c->name, nonfinite);
        printf("  %s mode: %d cut pieces, %d decode calls; largest span: %d in one call, %d in the decode calls\n",
               mode ? "invariant" : "normal", n_pieces, n_calls, span_one, w->max_span_seen);
        /* the reference rows went through the decode kernel: no span of the decode calls is long */
        CHECKF(w->max_span_seen <= QD_CUDA_ATTN_INV_SPAN_ROWS, "invariance %s: a decode call had a span of %d rows",
               c->name, w->max_span_seen);
        for (int i = 1; i < S_N; i++) {
            const size_t bad = inv_diff(w, sname[i], res[S_SPAN], res[i]);
            printf("  %-9s %-31s vs one call: %4zu of %d rows differ%s\n", mode ? "invariant" : "normal", sname[i],
                   bad, T, mode ? "" : " (allowed)");
            if (mode) CHECKF(bad == 0, "invariance %s: %s: %zu rows differ", c->name, sname[i], bad);
        }
    }
    qd_cuda_free(w->d_table); qd_cuda_free(w->d_spans); qd_cuda_free(w->d_rs); qd_cuda_free(w->d_rp);
    qd_cuda_free(w->d_qg); qd_cuda_free(w->d_k); qd_cuda_free(w->d_v); qd_cuda_free(w->d_qn); qd_cuda_free(w->d_kn);
    qd_cuda_free(w->d_work); qd_cuda_free(w->d_kc); qd_cuda_free(w->d_vc); qd_cuda_free(w->d_q); qd_cuda_free(w->d_out);
    free(w->slot_of); free(w->table); free(w->qg); free(w->k); free(w->v); free(w->qn); free(w->kn);
    free(w->spans); free(w->rs); free(w->rp); free(w->sqg); free(w->sk); free(w->sv); free(w->sout);
    for (int i = 0; i < S_N; i++) free(res[i]);
    free(cache_a); free(cache_b); free(gids); free(piece);
}

int main(void) {
    if (qd_cuda_device_count() <= 0) return qd_test_skip("test_cuda_attn", "no CUDA device");
    char name[128];
    int sms = 0;
    if (qd_cuda_device_info(name, sizeof name, &sms) == QD_OK) printf("device: %s, %d SMs\n", name, sms);
    qd_test_rng rng = qd_test_rng_from_env();
    qd_threadpool *pool = qd_threadpool_create(0);

    /* (i) every shape in both modes against the CPU, each batch run twice (bitwise equal) */
    for (int inv = 0; inv <= 1; inv++) {
        /* Qwen3-Next shape, a mixed batch: decode rows, short and long prefill spans */
        const shape_def s1 = {"mixed", 16, 2, 256, 64, 1, 16, 4096, 1e7f};
        const span_def p1[] = {{1, 0}, {63, 0}, {64, 37}, {65, 128}, {200, 1000}, {1, 2500}, {5, 300}};
        run_case(pool, &rng, &s1, p1, 7, inv);
        /* decode only, many context slices, block size 7, no GQA, ungated, full rotary */
        const shape_def s2 = {"decode", 8, 8, 128, 128, 0, 7, 3200, 1e4f};
        const span_def p2[] = {{1, 0}, {1, 6}, {1, 7}, {1, 500}, {1, 3000}, {1, 3199}};
        run_case(pool, &rng, &s2, p2, 6, inv);
        /* one span: prefill only */
        const shape_def s3 = {"prefill", 6, 3, 64, 32, 1, 16, 256, 1e4f};
        const span_def p3[] = {{200, 0}};
        run_case(pool, &rng, &s3, p3, 1, inv);
        /* short multi-row spans (speculative-style) all through the decode kernels */
        const shape_def s4 = {"short spans", 16, 2, 256, 64, 1, 16, 1024, 1e7f};
        const span_def p4[] = {{3, 700}, {16, 0}, {1, 129}, {16, 1000}};
        run_case(pool, &rng, &s4, p4, 4, inv);
        /* two long spans, 16 query heads per kv head, block size 7 */
        const shape_def s5 = {"long spans", 32, 2, 256, 64, 1, 7, 256, 1e7f};
        const span_def p5[] = {{130, 0}, {64, 64}};
        run_case(pool, &rng, &s5, p5, 2, inv);
        /* small head dim, mixed, one context slice per row (direct decode output) */
        const shape_def s6 = {"hd32 mixed", 4, 2, 32, 32, 0, 16, 128, 1e4f};
        const span_def p6[] = {{1, 40}, {65, 0}, {2, 100}};
        run_case(pool, &rng, &s6, p6, 3, inv);
        /* head dim off the instantiations (padded to 64), rotary 20 of 40 */
        const shape_def s7 = {"hd40", 4, 1, 40, 20, 1, 16, 256, 1e4f};
        const span_def p7[] = {{70, 10}, {2, 100}};
        run_case(pool, &rng, &s7, p7, 2, inv);
        /* 24 query heads per kv head: two mma row groups */
        const shape_def s8 = {"group 24", 24, 1, 64, 64, 1, 16, 512, 1e7f};
        const span_def p8[] = {{1, 300}, {1, 0}, {7, 100}};
        run_case(pool, &rng, &s8, p8, 3, inv);
        /* Qwen3.5-style 32/2 decode at long contexts, rotary 64 of 256 */
        const shape_def s9 = {"decode g16", 32, 2, 256, 64, 1, 16, 4096, 1e7f};
        const span_def p9[] = {{1, 4000}, {1, 2047}, {2, 100}, {1, 4095}};
        run_case(pool, &rng, &s9, p9, 4, inv);
        /* many decode rows with max_ctx 128: a single slice, written directly */
        {
            const shape_def s10 = {"decode direct", 8, 2, 128, 32, 0, 16, 128, 1e7f};
            span_def p10[40];
            for (int i = 0; i < 40; i++) p10[i] = (span_def){1, (int)(qd_test_next(&rng) % 128)};
            run_case(pool, &rng, &s10, p10, 40, inv);
        }
    }

    /* (ii) bitwise invariance of a row over the ways to batch it, two shapes and contexts */
    {
        const shape_def w1 = {"qwen3-next", 16, 2, 256, 64, 1, 16, 2048, 1e7f};
        const int l1[] = {1, 63, 64, 65, 300, 1000};
        invariance_case(&rng, &w1, l1, 6);
        const shape_def w2 = {"g4 hd128 bs7", 8, 2, 128, 64, 0, 7, 5000, 1e7f};
        const int l2[] = {65, 1, 3000, 64, 1000, 63, 300};
        invariance_case(&rng, &w2, l2, 7);
        /* GQA 2, max_ctx 128: one context slice, written directly by both kernels */
        const shape_def w3 = {"g2 hd256 one slice", 8, 4, 256, 64, 1, 5, 128, 1e7f};
        const int l3[] = {1, 63, 64, 65, 128, 100, 17, 16};
        invariance_case(&rng, &w3, l3, 8);
        /* Qwen3.5-style 16 query heads per kv head, hd 128, block size 13, 12 slices */
        const shape_def w4 = {"g16 hd128 bs13", 32, 2, 128, 128, 1, 13, 1500, 1e7f};
        const int l4[] = {1000, 1, 65, 300, 17};
        invariance_case(&rng, &w4, l4, 5);
        /* GQA 6 (a row's heads split over two blocks), hd 40 padded to 64, block size 3 */
        const shape_def w5 = {"g6 hd40 bs3", 6, 1, 40, 20, 0, 3, 700, 1e4f};
        const int l5[] = {63, 64, 65, 300, 16, 17, 2};
        invariance_case(&rng, &w5, l5, 7);
    }

    qd_threadpool_free(pool);
    return qd_test_finish("test_cuda_attn");
}

#else /* no CUDA compiler: nothing to test */

int main(void) { return qd_test_skip("test_cuda_attn", "built without CUDA"); }

#endif
