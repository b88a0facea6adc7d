/* CUDA MoE kernels (router and routed experts) against a CPU reference, on
 * fresh random inputs (seed printed; QD_TEST_SEED replays it).
 *
 * Router: the CPU router of src/backend/cpu/cpu_layer_moe.c (qd_moe_route_token), in fp32;
 * logits are multiples of 1/64, so distinct logits give clearly distinct
 * probabilities and equal logits give bit-equal ones: the selection must
 * match exactly, ties included (many copied logits, one all-equal row).
 *
 * Experts: bf16 x and weights, the reference in double over the same bf16
 * values: y = y0 + sum_j w_j down_e(silu(gate_e x) * up_e x). Batch sizes
 * 1, 3, 17, 39 take the decode path, 40, 64 and 300 the prefill path (the path
 * each n takes is the library's answer, qd_cuda_moe_decode_path; both are
 * checked against the reference either way); shapes
 * include odd sizes (H=200, I=48), k = E, k = 10, the real hidden and
 * intermediate sizes, and skewed routing where most tokens share an expert.
 * y starts nonzero (accumulation), the scratch is poisoned (0xff: NaN and -1)
 * before every call, a guard after y must stay untouched, and every element
 * is checked. Also: results are bit-identical run to run, per token
 * bit-identical whatever else is in the batch (a token alone vs in the batch;
 * the first 65 tokens alone vs 300), and a CUDA-graph capture of both paths
 * replays to the same bits; each grouped-GEMM kernel of the prefill path (mma.sync small,
 * mma.sync, wgmma), forced, gives the table's bits. Skips (77) without a GPU. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "qd_test.h"
#ifdef QD_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "backend/cuda/cuda_gdn.h"
#include "backend/cuda/cuda_device.h"
#include "backend/cuda/cuda_moe.h"
#include "backend/cpu/cpu_backend.h"
#include "qd_test_cuda.h"
#endif

#ifdef QD_HAVE_CUDA

#define GUARD 256 /* floats after y that must not change */
#define GUARD_VAL 12345.5f




/* Router logits: multiples of 1/64 in [-4, 4), a quarter of them copies of
 * another logit of the same token (ties); skew > 0 adds +skew to experts 0
 * and 1 so that most tokens share them. Row 0 is all equal when all_equal. */
static void make_logits(qd_test_rng *rng, float *lg, int n, int E, float skew, int all_equal) {
    for (int t = 0; t < n; t++) {
        float *l = lg + (size_t)t * E;
        for (int e = 0; e < E; e++) l[e] = (float)floor(qd_test_uniform(rng) * 256.0) / 64.0f;
        for (int e = 0; e < E; e++)
            if (qd_test_uniform(rng) < -0.5f) l[e] = l[qd_test_next(rng) % (uint64_t)E];
        if (skew > 0 && E > 2) {
            l[0] += skew;
            l[1] += skew;
        }
    }
    if (all_equal)
        for (int e = 0; e < E; e++) lg[e] = 0.5f;
}

static void route_case(qd_test_rng *rng, int n, int E, int k, int renorm) {
    printf("route n=%d E=%d k=%d renorm=%d\n", n, E, k, renorm);
    float *lg = malloc((size_t)n * E * 4), *w = malloc((size_t)n * k * 4), *hw = malloc((size_t)n * k * 4);
    float *prob = malloc((size_t)E * 4);
    int32_t *sel = malloc((size_t)n * k * 4), *hsel = malloc((size_t)n * k * 4);
    CHECK(lg && w && hw && prob && sel && hsel);
    if (!lg || !w || !hw || !prob || !sel || !hsel) goto out;
    make_logits(rng, lg, n, E, 0.0f, 1);
    for (int t = 0; t < n; t++) qd_moe_route_token(lg + (size_t)t * E, E, k, renorm, sel + (size_t)t * k, w + (size_t)t * k, prob);
    float *dlg = qd_test_dev_upload(lg, (size_t)n * E * 4), *dw = qd_test_dev_upload(NULL, (size_t)n * k * 4);
    int32_t *dsel = qd_test_dev_upload(NULL, (size_t)n * k * 4);
    CHECK(dlg && dw && dsel);
    if (dlg && dw && dsel) {
        ST_OK(qd_cuda_memset(dw, 0xff, (size_t)n * k * 4));
        ST_OK(qd_cuda_memset(dsel, 0xff, (size_t)n * k * 4));
        ST_OK(qd_cuda_moe_route(dlg, E, n, E, k, renorm, dsel, dw, NULL));
        ST_OK(qd_cuda_sync());
        ST_OK(qd_cuda_memcpy_d2h(hsel, dsel, (size_t)n * k * 4));
        ST_OK(qd_cuda_memcpy_d2h(hw, dw, (size_t)n * k * 4));
        size_t bad_sel = 0, bad_w = 0, first = 0;
        double maxe = 0;
        for (size_t i = 0; i < (size_t)n * k; i++) {
            if (hsel[i] != sel[i] && !bad_sel++) first = i;
            const double e = fabs((double)hw[i] - w[i]);
            if (e > maxe) maxe = e;
            if (!(e <= 1e-5 * fabs(w[i]) + 1e-8)) bad_w++;
        }
        printf("  selection mismatches=%zu weight max_err=%.2e bad=%zu\n", bad_sel, maxe, bad_w);
        CHECKF(bad_sel == 0, "route: %zu selections differ, first at %zu: got %d want %d", bad_sel, first,
               hsel[first], sel[first]);
        CHECKF(bad_w == 0, "route: %zu weights off (max err %.3e)", bad_w, maxe);
    }
    qd_cuda_free(dlg);
    qd_cuda_free(dw);
    qd_cuda_free(dsel);
out:
    free(lg); free(w); free(hw); free(prob); free(sel); free(hsel);
}

/* Every element within atol * rms(contribution) + rtol * |ref|; relative L2 of the
 * error over the contribution within l2_tol. */
static void compare(const char *what, const float *got, const double *ref, const double *contrib, size_t n,
                    double atol, double rtol, double l2_tol) {
    double ss = 0, se = 0, maxe = 0;
    for (size_t i = 0; i < n; i++) ss += contrib[i] * contrib[i];
    const double rms = sqrt(ss / (double)n);
    size_t bad = 0, first = 0;
    for (size_t i = 0; i < n; i++) {
        const double e = fabs((double)got[i] - ref[i]);
        if (!isfinite(got[i]) || !(e <= atol * rms + rtol * fabs(ref[i]))) {
            if (!bad) first = i;
            bad++;
        }
        if (isfinite(got[i])) {
            se += e * e;
            if (e > maxe) maxe = e;
        }
    }
    const double l2 = ss > 0 ? sqrt(se / ss) : sqrt(se);
    printf("  %-26s n=%-8zu rms=%.3e max_err=%.3e (%.2e rms) rel_l2=%.2e bad=%zu\n", what, n, rms, maxe,
           rms > 0 ? maxe / rms : maxe, l2, bad);
    CHECKF(bad == 0, "%s: %zu bad elements, first %zu: got %g want %g", what, bad, first, bad ? got[first] : 0.0,
           bad ? ref[first] : 0.0);
    CHECKF(l2 <= l2_tol, "%s: relative L2 error %.3e > %.1e", what, l2, l2_tol);
}

typedef struct {
    int H, I, E, k;
    uint16_t *gu, *dn;     /* host bf16 weights */
    uint16_t *dgu, *ddn;   /* device copies */
} experts_t;

typedef struct {
    int n;
    uint16_t *x;  /* [n][H] */
    int32_t *sel; /* [n][k] */
    float *w;     /* [n][k] */
    float *y0;    /* [n][H] */
} batch_t;

static int make_experts(qd_test_rng *rng, experts_t *ex, int H, int I, int E, int k) {
    ex->H = H; ex->I = I; ex->E = E; ex->k = k;
    const size_t ngu = (size_t)E * 2 * I * H, ndn = (size_t)E * H * I;
    ex->gu = malloc(ngu * 2);
    ex->dn = malloc(ndn * 2);
    ex->dgu = ex->ddn = NULL;
    if (!ex->gu || !ex->dn) return 0;
    /* uniform with unit variance per output: gate/up . x ~ N(0, 1), down . act ~ O(1) */
    const float sg = sqrtf(3.0f / (float)H), sd = sqrtf(3.0f / (float)I);
    for (size_t i = 0; i < ngu; i++) ex->gu[i] = qd_f32_to_bf16(sg * qd_test_uniform(rng));
    for (size_t i = 0; i < ndn; i++) ex->dn[i] = qd_f32_to_bf16(sd * qd_test_uniform(rng));
    ex->dgu = qd_test_dev_upload(ex->gu, ngu * 2);
    ex->ddn = qd_test_dev_upload(ex->dn, ndn * 2);
    return ex->dgu && ex->ddn;
}
static void free_experts(experts_t *ex) {
    free(ex->gu); free(ex->dn);
    qd_cuda_free(ex->dgu); qd_cuda_free(ex->ddn);
}

static int make_batch(qd_test_rng *rng, const experts_t *ex, batch_t *b, int n, int renorm, float skew) {
    const int H = ex->H, E = ex->E, k = ex->k;
    b->n = n;
    b->x = malloc((size_t)n * H * 2);
    b->sel = malloc((size_t)n * k * 4);
    b->w = malloc((size_t)n * k * 4);
    b->y0 = malloc((size_t)n * H * 4);
    float *lg = malloc((size_t)n * E * 4), *prob = malloc((size_t)E * 4);
    if (!b->x || !b->sel || !b->w || !b->y0 || !lg || !prob) {
        free(lg); free(prob);
        return 0;
    }
    for (size_t i = 0; i < (size_t)n * H; i++) b->x[i] = qd_f32_to_bf16(qd_test_normal(rng));
    for (size_t i = 0; i < (size_t)n * H; i++) b->y0[i] = qd_test_normal(rng);
    make_logits(rng, lg, n, E, skew, 0);
    for (int t = 0; t < n; t++)
        qd_moe_route_token(lg + (size_t)t * E, E, k, renorm, b->sel + (size_t)t * k, b->w + (size_t)t * k, prob);
    free(lg); free(prob);
    return 1;
}
static void free_batch(batch_t *b) { free(b->x); free(b->sel); free(b->w); free(b->y0); }

/* Reference in double: ref = y0 + contrib. */
static void experts_ref(const experts_t *ex, const batch_t *b, double *ref, double *contrib) {
    const int H = ex->H, I = ex->I, k = ex->k;
    double *a = malloc((size_t)I * 8), *xd = malloc((size_t)H * 8);
    if (!a || !xd) {
        free(a); free(xd);
        return;
    }
    for (int t = 0; t < b->n; t++) {
        double *c = contrib + (size_t)t * H;
        for (int h = 0; h < H; h++) c[h] = 0;
        for (int h = 0; h < H; h++) xd[h] = (double)qd_bf16_to_f32(b->x[(size_t)t * H + h]);
        for (int j = 0; j < k; j++) {
            const int e = b->sel[(size_t)t * k + j];
            const uint16_t *gu = ex->gu + (size_t)e * 2 * I * H, *dn = ex->dn + (size_t)e * H * I;
            for (int i = 0; i < I; i++) {
                double g = 0, u = 0;
                for (int h = 0; h < H; h++) {
                    g += (double)qd_bf16_to_f32(gu[(size_t)i * H + h]) * xd[h];
                    u += (double)qd_bf16_to_f32(gu[(size_t)(I + i) * H + h]) * xd[h];
                }
                a[i] = g / (1.0 + exp(-g)) * u;
            }
            const double wj = b->w[(size_t)t * k + j];
            for (int h = 0; h < H; h++) {
                double o = 0;
                for (int i = 0; i < I; i++) o += (double)qd_bf16_to_f32(dn[(size_t)h * I + i]) * a[i];
                c[h] += wj * o;
            }
        }
        for (int h = 0; h < H; h++) ref[(size_t)t * H + h] = b->y0[(size_t)t * H + h] + c[h];
    }
    free(a); free(xd);
}

/* Runs the experts over tokens [t0, t0 + n) of b into host y (n * H floats),
 * poisoning the scratch first and checking the guard after y. With graph,
 * captures the call on a fresh stream and replays it. kernel: the prefill path's
 * grouped-GEMM kernel (QD_MOE_PREFILL_*), 0 for the table's. */
static int run_experts_kernel(const experts_t *ex, const batch_t *b, int t0, int n, float *y, int graph, int invariant,
                              int kernel) {
    const int H = ex->H, k = ex->k;
    const size_t wb = qd_cuda_moe_work_bytes(n, H, ex->I, ex->E, k);
    uint16_t *dx = qd_test_dev_upload(b->x + (size_t)t0 * H, (size_t)n * H * 2);
    int32_t *dsel = qd_test_dev_upload(b->sel + (size_t)t0 * k, (size_t)n * k * 4);
    float *dw = qd_test_dev_upload(b->w + (size_t)t0 * k, (size_t)n * k * 4);
    float *dy = qd_test_dev_upload(NULL, ((size_t)n * H + GUARD) * 4);
    void *work = qd_test_dev_upload(NULL, wb);
    float guard[GUARD];
    int ok = dx && dsel && dw && dy && work && wb > 0;
    CHECK(ok);
    if (ok) {
        for (int i = 0; i < GUARD; i++) guard[i] = GUARD_VAL;
        ST_OK(qd_cuda_memcpy_h2d(dy, b->y0 + (size_t)t0 * H, (size_t)n * H * 4));
        ST_OK(qd_cuda_memcpy_h2d(dy + (size_t)n * H, guard, sizeof guard));
        ST_OK(qd_cuda_memset(work, 0xff, wb));
        qd_cuda_moe_args a = {.n = n, .H = H, .I = ex->I, .E = ex->E, .k = k, .d_x = dx, .d_sel = dsel, .d_w = dw, .d_gate_up = ex->dgu, .d_down = ex->ddn, .d_y = dy, .d_work = work, .cublas = NULL, .invariant = invariant, .prefill_kernel = kernel};
        if (!graph) {
            ST_OK(qd_cuda_moe_experts(&a, NULL));
        } else {
            cudaStream_t s = NULL;
            cudaGraph_t g = NULL;
            cudaGraphExec_t ge = NULL;
            ST_OK(qd_cuda_sync()); /* the uploads and the poison are on the legacy stream */
            int gok = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess;
            gok = gok && cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal) == cudaSuccess;
            if (gok) {
                ST_OK(qd_cuda_moe_experts(&a, s));
                gok = cudaStreamEndCapture(s, &g) == cudaSuccess;
            }
            gok = gok && cudaGraphInstantiate(&ge, g, 0) == cudaSuccess;
            gok = gok && cudaGraphLaunch(ge, s) == cudaSuccess && cudaStreamSynchronize(s) == cudaSuccess;
            CHECKF(gok, "graph capture/replay failed: %s", cudaGetErrorString(cudaGetLastError()));
            if (ge) cudaGraphExecDestroy(ge);
            if (g) cudaGraphDestroy(g);
            if (s) cudaStreamDestroy(s);
        }
        ST_OK(qd_cuda_sync());
        ST_OK(qd_cuda_memcpy_d2h(y, dy, (size_t)n * H * 4));
        ST_OK(qd_cuda_memcpy_d2h(guard, dy + (size_t)n * H, sizeof guard));
        int gbad = 0;
        for (int i = 0; i < GUARD; i++) gbad += guard[i] != GUARD_VAL;
        CHECKF(gbad == 0, "%d guard floats after y were written", gbad);
    }
    qd_cuda_free(dx); qd_cuda_free(dsel); qd_cuda_free(dw); qd_cuda_free(dy); qd_cuda_free(work);
    return ok;
}

static int run_experts_mode(const experts_t *ex, const batch_t *b, int t0, int n, float *y, int graph, int invariant) {
    return run_experts_kernel(ex, b, t0, n, y, graph, invariant, 0);
}

static int run_experts(const experts_t *ex, const batch_t *b, int t0, int n, float *y, int graph) {
    return run_experts_mode(ex, b, t0, n, y, graph, 0);
}

static void experts_case(qd_test_rng *rng, const experts_t *ex, int n, int renorm, float skew, int graph) {
    const int H = ex->H;
    const qd_cuda_moe_args probe = {.n = n, .H = H, .I = ex->I, .E = ex->E, .k = ex->k};
    const int decode = qd_cuda_moe_decode_path(&probe);
    printf("experts H=%d I=%d E=%d k=%d n=%d renorm=%d skew=%.0f (%s path)\n", H, ex->I, ex->E, ex->k, n, renorm,
           skew, decode ? "decode" : "prefill");
    batch_t b;
    const size_t ny = (size_t)n * H;
    double *ref = malloc(ny * 8), *contrib = malloc(ny * 8);
    float *y = malloc(ny * 4), *y2 = malloc(ny * 4);
    int ok = ref && contrib && y && y2 && make_batch(rng, ex, &b, n, renorm, skew);
    CHECK(ok);
    if (!ok) goto out;
    experts_ref(ex, &b, ref, contrib);
    if (run_experts(ex, &b, 0, n, y, 0)) {
        if (decode) compare("y vs CPU", y, ref, contrib, ny, 2e-4, 1e-5, 2e-5);
        else compare("y vs CPU", y, ref, contrib, ny, 3e-2, 1e-3, 5e-3); /* bf16 activations */
        /* run to run */
        if (run_experts(ex, &b, 0, n, y2, 0))
            CHECKF(memcmp(y, y2, ny * 4) == 0, "second run differs bitwise");
        /* batch invariance: a few tokens alone (decode), or the first 65 (prefill) */
        if (decode) {
            const int ts[3] = {0, n / 2, n - 1};
            int same = 1;
            for (int q = 0; q < 3 && n > 1; q++)
                if (run_experts(ex, &b, ts[q], 1, y2, 0)) same &= memcmp(y + (size_t)ts[q] * H, y2, (size_t)H * 4) == 0;
            CHECKF(same, "decode: a token alone differs bitwise from the same token in the batch of %d", n);
        } else if (n > 65) {
            if (run_experts(ex, &b, 0, 65, y2, 0))
                CHECKF(memcmp(y, y2, (size_t)65 * H * 4) == 0,
                       "prefill: the first 65 tokens alone differ bitwise from the batch of %d", n);
        }
        if (graph && run_experts(ex, &b, 0, n, y2, 1))
            CHECKF(memcmp(y, y2, ny * 4) == 0, "graph replay differs bitwise from the direct call");
        /* batch-invariant mode: the grouped GEMMs at every n (the batch's own path when n
         * is past the decode bound); a few tokens alone equal the same tokens in the batch */
        float *yi = malloc(ny * 4);
        if (yi && run_experts_mode(ex, &b, 0, n, yi, 0, 1)) {
            if (!decode) CHECKF(memcmp(y, yi, ny * 4) == 0, "invariant mode changed the prefill path's result");
            else compare("invariant y vs CPU", yi, ref, contrib, ny, 3e-2, 1e-3, 5e-3);
            const int ts[3] = {0, n / 2, n - 1};
            int same = 1;
            for (int q = 0; q < 3; q++)
                if (run_experts_mode(ex, &b, ts[q], 1, y2, 0, 1))
                    same &= memcmp(yi + (size_t)ts[q] * H, y2, (size_t)H * 4) == 0;
            CHECKF(same, "invariant mode: a token alone differs bitwise from the same token in the batch of %d", n);
        }
        /* every grouped-GEMM kernel of the prefill path gives the same bits (the table may pick
         * any of them for a batch, batch-invariant mode included), the wgmma one in a graph too */
        const int kernels[3] = {QD_MOE_PREFILL_MMA_SMALL, QD_MOE_PREFILL_MMA, QD_MOE_PREFILL_WGMMA};
        const char *kname[3] = {"mma small", "mma", "wgmma"};
        const float *base = decode ? yi : y; /* the grouped GEMMs' result at this n */
        for (int q = 0; q < 3 && base; q++) {
            if (!run_experts_kernel(ex, &b, 0, n, y2, q == 2 && graph, 1, kernels[q])) continue;
            compare(kname[q], y2, ref, contrib, ny, 3e-2, 1e-3, 5e-3);
            size_t diff = 0;
            for (size_t i = 0; i < ny; i++) diff += memcmp(&y2[i], &base[i], 4) != 0;
            CHECKF(diff == 0, "prefill kernel %s: %zu of %zu outputs differ bitwise from the table's", kname[q], diff,
                   ny);
        }
        free(yi);
    }
    free_batch(&b);
out:
    free(ref); free(contrib); free(y); free(y2);
}

/* The shared expert given to qd_cuda_moe_experts (d_sh_y, d_sh_gate) against
 * qd_cuda_sigmoid_scale before a call without it: the same bits on the decode path (which
 * runs that kernel itself) and on the prefill path (whose combine folds it in), plain and
 * batch-invariant. */
static void shared_case(qd_test_rng *rng, const experts_t *ex, int n, int invariant) {
    const int H = ex->H, k = ex->k, gld = 3;
    batch_t b;
    if (!make_batch(rng, ex, &b, n, 1, 0.0f)) {
        CHECK(0);
        return;
    }
    float *ys = malloc((size_t)n * H * 4), *gate = malloc((size_t)n * gld * 4);
    float *y1 = malloc((size_t)n * H * 4), *y2 = malloc((size_t)n * H * 4);
    CHECK(ys && gate && y1 && y2);
    for (size_t i = 0; ys && i < (size_t)n * H; i++) ys[i] = qd_test_normal(rng);
    for (size_t i = 0; gate && i < (size_t)n * gld; i++) gate[i] = 2.0f * qd_test_normal(rng);
    const size_t wb = qd_cuda_moe_work_bytes(n, H, ex->I, ex->E, k);
    uint16_t *dx = qd_test_dev_upload(b.x, (size_t)n * H * 2);
    int32_t *dsel = qd_test_dev_upload(b.sel, (size_t)n * k * 4);
    float *dw = qd_test_dev_upload(b.w, (size_t)n * k * 4), *dy = qd_test_dev_upload(b.y0, (size_t)n * H * 4);
    float *dys = ys ? qd_test_dev_upload(ys, (size_t)n * H * 4) : NULL;
    float *dg = gate ? qd_test_dev_upload(gate, (size_t)n * gld * 4) : NULL;
    void *work = qd_test_dev_upload(NULL, wb);
    if (dx && dsel && dw && dy && dys && dg && work && y1 && y2) {
        qd_cuda_moe_args a = {.n = n, .H = H, .I = ex->I, .E = ex->E, .k = k, .d_x = dx, .d_sel = dsel, .d_w = dw,
                              .d_gate_up = ex->dgu, .d_down = ex->ddn, .d_y = dy, .d_work = work,
                              .invariant = invariant};
        ST_OK(qd_cuda_sigmoid_scale(dy, dys, dg, gld, n, H, NULL));
        ST_OK(qd_cuda_moe_experts(&a, NULL));
        ST_OK(qd_cuda_sync());
        ST_OK(qd_cuda_memcpy_d2h(y1, dy, (size_t)n * H * 4));
        ST_OK(qd_cuda_memcpy_h2d(dy, b.y0, (size_t)n * H * 4));
        a.d_sh_y = dys;
        a.d_sh_gate = dg;
        a.sh_gate_ld = gld;
        ST_OK(qd_cuda_moe_experts(&a, NULL));
        ST_OK(qd_cuda_sync());
        ST_OK(qd_cuda_memcpy_d2h(y2, dy, (size_t)n * H * 4));
        CHECKF(!memcmp(y1, y2, (size_t)n * H * 4),
               "H=%d n=%d invariant %d: the shared expert given to the call differs from sigmoid_scale before it", H, n,
               invariant);
        a.sh_gate_ld = 0;
        CHECK(qd_cuda_moe_experts(&a, NULL) == QD_ERR_INVALID_ARG); /* a shared output without a gate stride */
    } else {
        CHECK(0);
    }
    free_batch(&b);
    free(ys); free(gate); free(y1); free(y2);
    qd_cuda_free(dx); qd_cuda_free(dsel); qd_cuda_free(dw); qd_cuda_free(dy); qd_cuda_free(dys); qd_cuda_free(dg);
    qd_cuda_free(work);
}

int main(void) {
    if (qd_cuda_device_count() <= 0) return qd_test_skip("test_cuda_moe", "no CUDA device");
    char name[128];
    int sms = 0;
    if (qd_cuda_device_info(name, sizeof name, &sms) == QD_OK) printf("device: %s, %d SMs\n", name, sms);
    qd_test_rng rng = qd_test_rng_from_env();

    route_case(&rng, 37, 256, 8, 1);
    route_case(&rng, 21, 512, 10, 0);
    route_case(&rng, 9, 16, 4, 1);
    route_case(&rng, 5, 4, 4, 0);    /* k = E */
    route_case(&rng, 13, 100, 7, 1); /* E off the powers of two */
    route_case(&rng, 6, 1000, 32, 1);
    route_case(&rng, 3, 33, 1, 0);

    /* the bf16 decode kernels' last batch, the grouped GEMMs' first (a CUDA graph captures
     * steps of up to 64 tokens: both paths) */
    const int ns[7] = {1, 3, 17, 39, 40, 64, 300};
    experts_t ex;
    /* odd sizes */
    if (make_experts(&rng, &ex, 200, 48, 16, 4))
        for (int i = 0; i < 7; i++)
            experts_case(&rng, &ex, ns[i], i & 1, 0.0f, ns[i] == 17 || ns[i] == 64 || ns[i] == 300);
    else CHECK(0);
    free_experts(&ex);
    /* few experts: big groups (every expert shared by many tokens) */
    if (make_experts(&rng, &ex, 64, 32, 4, 2))
        for (int i = 0; i < 7; i++) experts_case(&rng, &ex, ns[i], !(i & 1), 0.0f, 0);
    else CHECK(0);
    free_experts(&ex);
    /* k = E: every token takes every expert */
    if (make_experts(&rng, &ex, 320, 96, 8, 8)) {
        experts_case(&rng, &ex, 17, 1, 0.0f, 0);
        experts_case(&rng, &ex, 65, 0, 0.0f, 0);
    } else CHECK(0);
    free_experts(&ex);
    /* k = 10 (Qwen3-Next), skewed routing: most tokens share experts 0 and 1 */
    if (make_experts(&rng, &ex, 256, 64, 16, 10)) {
        experts_case(&rng, &ex, 64, 1, 6.0f, 1);
        experts_case(&rng, &ex, 300, 1, 6.0f, 0);
        experts_case(&rng, &ex, 3, 0, 0.0f, 0);
    } else CHECK(0);
    free_experts(&ex);
    /* the hidden and intermediate sizes of Qwen3.5-35B-A3B, fewer experts */
    if (make_experts(&rng, &ex, 2048, 512, 16, 8)) {
        experts_case(&rng, &ex, 1, 1, 0.0f, 1);
        experts_case(&rng, &ex, 17, 1, 0.0f, 0);
        experts_case(&rng, &ex, 65, 1, 0.0f, 1);
        experts_case(&rng, &ex, 600, 1, 0.0f, 1); /* 300 rows an expert: full and partial wgmma tiles */
    } else CHECK(0);
    free_experts(&ex);
    /* the shared expert folded into the call: decode path, prefill paths, invariant mode */
    if (make_experts(&rng, &ex, 2048, 512, 16, 8)) {
        const int sn[4] = {1, 17, 130, 600};
        for (int i = 0; i < 4; i++) {
            shared_case(&rng, &ex, sn[i], 0);
            shared_case(&rng, &ex, sn[i], 1);
        }
    } else CHECK(0);
    free_experts(&ex);
    /* ... and of Qwen3.5-122B-A10B */
    if (make_experts(&rng, &ex, 3072, 1024, 8, 2)) {
        experts_case(&rng, &ex, 3, 1, 0.0f, 0);
        experts_case(&rng, &ex, 66, 1, 0.0f, 0);
        experts_case(&rng, &ex, 400, 0, 0.0f, 0); /* 8 gate_up and 12 down column blocks */
    } else CHECK(0);
    free_experts(&ex);

    /* argument checks */
    qd_cuda_moe_args bad = {.n = 1, .H = 100, .I = 64, .E = 8, .k = 2, .d_x = NULL, .d_sel = NULL, .d_w = NULL, .d_gate_up = NULL, .d_down = NULL, .d_y = NULL, .d_work = NULL, .cublas = NULL, .invariant = 0};
    CHECK(qd_cuda_moe_experts(&bad, NULL) == QD_ERR_INVALID_ARG); /* H % 8 != 0 */
    CHECK(qd_cuda_moe_route(NULL, 8, 1, 8, 9, 0, NULL, NULL, NULL) == QD_ERR_INVALID_ARG);
    return qd_test_finish("test_cuda_moe");
}

#else /* no CUDA compiler: nothing to test */

int main(void) { return qd_test_skip("test_cuda_moe", "built without CUDA"); }

#endif
