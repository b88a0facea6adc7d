/* The CUDA backend's small ops and matmul (cuda_ops.h) against the CPU reference
 * on fresh random inputs with awkward shapes: outputs poisoned (NaN) before each
 * launch, every element checked. Inputs that the GPU reads as bf16 are rounded to
 * bf16 first, so the comparison measures the kernel's own arithmetic. Skips (77)
 * without a GPU. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu_ops.h"
#include "base/dtype.h"
#include "qd_test.h"
#ifdef QD_HAVE_CUDA
#include "backend/cuda/cuda_gdn.h"
#include "backend/cuda/cuda_device.h"
#include "backend/cuda/cuda_ops.h"
#include "qd_test_cuda.h"
#endif

#ifdef QD_HAVE_CUDA

static qd_test_rng rng;


/* |got - ref| <= atol + rtol |ref| for every element (NaN fails); returns the worst ratio */
static double compare(const char *what, const float *got, const float *ref, size_t n, double rtol, double atol) {
    double worst = 0;
    size_t bad = 0, first = 0;
    for (size_t i = 0; i < n; i++) {
        const double lim = atol + rtol * fabs(ref[i]), d = fabs((double)got[i] - ref[i]);
        if (!(d <= lim)) {
            if (!bad) first = i;
            bad++;
        }
        if (lim > 0 && d / lim > worst) worst = d / lim;
    }
    CHECKF(bad == 0, "%s: %zu of %zu elements off (first %zu: got %g want %g)", what, bad, n, first,
           bad ? got[first] : 0, bad ? ref[first] : 0);
    return worst;
}
static float *widen(const uint16_t *b, size_t n) {
    float *f = malloc(n * sizeof(float) + 4);
    for (size_t i = 0; i < n; i++) f[i] = qd_bf16_to_f32(b[i]);
    return f;
}

/* y = W x (y_bf16: into bf16), or with acc y += W x (qd_cuda_matmul_acc, fp32 y holding
 * random values first) */
static void test_matmul_mode(qd_cuda_blas *blas, int64_t rows, int64_t cols, int n, int64_t ldx, int64_t ldy, int y_bf16,
                             int acc) {
    float *w = qd_test_rnd(&rng, (size_t)(rows * cols), 0.5f), *x = qd_test_rnd(&rng, (size_t)(n * ldx), 1.0f);
    uint16_t *wb = qd_test_round_bf16(w, (size_t)(rows * cols)), *xb = qd_test_round_bf16(x, (size_t)(n * ldx));
    const size_t ysz = (size_t)n * ldy * (y_bf16 ? 2 : 4);
    float *y0 = acc ? qd_test_rnd(&rng, (size_t)n * ldy, 4.0f) : NULL;
    void *dW = qd_test_dev(wb, (size_t)(rows * cols) * 2), *dx = qd_test_dev(xb, (size_t)(n * ldx) * 2), *dy = qd_test_dev(y0, ysz);
    if (acc) CHECK(qd_cuda_matmul_acc(blas, dW, rows, cols, dx, ldx, n, dy, ldy) == QD_OK);
    else CHECK(qd_cuda_matmul(blas, dW, rows, cols, dx, ldx, n, dy, ldy, y_bf16) == QD_OK);
    void *yh = qd_test_host(dy, ysz);
    float *got = malloc(sizeof(float) * (size_t)(n * rows)), *ref = malloc(sizeof(float) * (size_t)(n * rows));
    double worst_bound = 0;
    for (int t = 0; t < n; t++)
        for (int64_t r = 0; r < rows; r++) {
            double acc = 0, mag = 0;
            for (int64_t c = 0; c < cols; c++) {
                acc += (double)w[r * cols + c] * x[t * ldx + c];
                mag += fabs((double)w[r * cols + c] * x[t * ldx + c]);
            }
            ref[t * rows + r] = (float)(acc + (y0 ? y0[t * ldy + r] : 0.0));
            got[t * rows + r] = y_bf16 ? qd_bf16_to_f32(((uint16_t *)yh)[t * ldy + r]) : ((float *)yh)[t * ldy + r];
            worst_bound = fmax(worst_bound, mag + (y0 ? fabs(y0[t * ldy + r]) : 0.0));
        }
    char what[96];
    snprintf(what, sizeof what, "matmul %lldx%lld n=%d ldx=%lld %s", (long long)rows, (long long)cols, n, (long long)ldx,
             acc ? "fp32 +=" : y_bf16 ? "bf16" : "fp32");
    /* fp32 accumulation: error far below 1e-5 of the sum of |terms|; bf16 output: its rounding */
    const double w_ = compare(what, got, ref, (size_t)(n * rows), y_bf16 ? 8e-3 : 0, 1e-5 * worst_bound + 1e-6);
    printf("  %-44s worst/limit %.2f\n", what, w_);
    free(w); free(x); free(wb); free(xb); free(yh); free(got); free(ref); free(y0);
    qd_cuda_free(dW); qd_cuda_free(dx); qd_cuda_free(dy);
}
static void test_matmul(qd_cuda_blas *blas, int64_t rows, int64_t cols, int n, int64_t ldx, int64_t ldy, int y_bf16) {
    test_matmul_mode(blas, rows, cols, n, ldx, ldy, y_bf16, 0);
}

static void test_matmul_xf32(int64_t rows, int64_t cols, int n, int64_t ldx, int64_t ldy) {
    float *w = qd_test_rnd(&rng, (size_t)(rows * cols), 0.5f), *x = qd_test_rnd(&rng, (size_t)(n * ldx), 1.0f);
    uint16_t *wb = qd_test_round_bf16(w, (size_t)(rows * cols));
    void *dW = qd_test_dev(wb, (size_t)(rows * cols) * 2), *dx = qd_test_dev(x, (size_t)(n * ldx) * 4), *dy = qd_test_dev(NULL, (size_t)n * ldy * 4);
    CHECK(qd_cuda_matmul_xf32(dW, rows, cols, dx, ldx, n, dy, ldy, NULL) == QD_OK);
    float *yh = qd_test_host(dy, (size_t)n * ldy * 4);
    float *got = malloc(sizeof(float) * (size_t)(n * rows)), *ref = malloc(sizeof(float) * (size_t)(n * rows));
    double worst = 0;
    for (int t = 0; t < n; t++)
        for (int64_t r = 0; r < rows; r++) {
            double acc = 0, mag = 0;
            for (int64_t c = 0; c < cols; c++) {
                acc += (double)w[r * cols + c] * x[t * ldx + c];
                mag += fabs((double)w[r * cols + c] * x[t * ldx + c]);
            }
            ref[t * rows + r] = (float)acc;
            got[t * rows + r] = yh[t * ldy + r];
            worst = fmax(worst, mag);
        }
    compare("matmul_xf32", got, ref, (size_t)(n * rows), 0, 1e-5 * worst + 1e-6);
    if (cols % 8 == 0 && ldx % 4 == 0) { /* router_dot.cuh's order, emulated: the same bits at every n */
        float *wf = widen(wb, (size_t)(rows * cols));
        size_t off = 0;
        for (int t = 0; t < n; t++)
            for (int64_t r = 0; r < rows; r++) {
                float lanes[32], next[32];
                for (int l = 0; l < 32; l++) {
                    float a = 0.f;
                    for (int64_t c = 8 * l; c < cols; c += 256)
                        for (int q = 0; q < 8; q++) a = fmaf(wf[r * cols + c + q], x[t * ldx + c + q], a);
                    lanes[l] = a;
                }
                for (int o = 16; o > 0; o >>= 1) {
                    for (int l = 0; l < 32; l++) next[l] = lanes[l] + lanes[l ^ o];
                    memcpy(lanes, next, sizeof lanes);
                }
                off += memcmp(&lanes[0], &yh[t * ldy + r], sizeof(float)) != 0;
            }
        CHECKF(off == 0, "matmul_xf32 %lldx%lld n=%d: %zu logits differ from the router order's bits", (long long)rows,
               (long long)cols, n, off);
        free(wf);
    }
    free(w); free(x); free(wb); free(yh); free(got); free(ref);
    qd_cuda_free(dW); qd_cuda_free(dx); qd_cuda_free(dy);
}

/* The router at prefill sizes: the normed row as three bf16 parts (add_rmsnorm_split)
 * that sum exactly to the fp32 row of add_rmsnorm, its hi part that add_rmsnorm's bf16 x,
 * and the three tensor-core products within fp32 rounding of the fp64 product of that row
 * (dropping the mid part would be ~4e-5 of the magnitude off, past the 4e-6 allowed) and
 * of matmul_xf32's logits. Rows of x scaled by 2^-6 .. 2^6. */
static void test_router_split(qd_cuda_blas *blas, int64_t rows, int64_t cols, int n, int64_t ldy) {
    const int H = (int)cols;
    float *h = qd_test_rnd(&rng, (size_t)n * H, 1.0f), *nw = qd_test_rnd(&rng, (size_t)H, 0.3f);
    for (int t = 0; t < n; t++)
        for (int c = 0; c < H; c++) h[(size_t)t * H + c] *= ldexpf(1.0f, t % 13 - 6);
    float *w = qd_test_rnd(&rng, (size_t)(rows * cols), 0.5f);
    uint16_t *wb = qd_test_round_bf16(w, (size_t)(rows * cols));
    float *wf = widen(wb, (size_t)(rows * cols));
    void *dh1 = qd_test_dev(h, (size_t)n * H * 4), *dh2 = qd_test_dev(h, (size_t)n * H * 4),
         *dnw = qd_test_dev(nw, (size_t)H * 4), *dW = qd_test_dev(wb, (size_t)(rows * cols) * 2);
    void *dx1 = qd_test_dev(NULL, (size_t)n * H * 2), *dxf = qd_test_dev(NULL, (size_t)n * H * 4),
         *dx2 = qd_test_dev(NULL, (size_t)n * H * 2), *dxr = qd_test_dev(NULL, (size_t)n * 2 * H * 2);
    void *dy = qd_test_dev(NULL, (size_t)n * ldy * 4), *dyf = qd_test_dev(NULL, (size_t)n * ldy * 4);
    CHECK(qd_cuda_add_rmsnorm(dh1, NULL, dnw, 1e-6f, n, H, NULL, dx1, dxf, NULL) == QD_OK);
    CHECK(qd_cuda_add_rmsnorm_split(dh2, NULL, dnw, 1e-6f, n, H, dx2, dxr, NULL) == QD_OK);
    CHECK(qd_cuda_matmul_split3(blas, dW, rows, cols, dx2, H, dxr, 2 * cols, n, dy, ldy) == QD_OK);
    CHECK(qd_cuda_matmul_xf32(dW, rows, cols, dxf, H, n, dyf, ldy, NULL) == QD_OK);
    uint16_t *x1 = qd_test_host(dx1, (size_t)n * H * 2), *x2 = qd_test_host(dx2, (size_t)n * H * 2),
             *xr = qd_test_host(dxr, (size_t)n * 2 * H * 2);
    float *xf = qd_test_host(dxf, (size_t)n * H * 4), *y = qd_test_host(dy, (size_t)n * ldy * 4),
          *yf = qd_test_host(dyf, (size_t)n * ldy * 4);
    CHECKF(!memcmp(x1, x2, (size_t)n * H * 2), "add_rmsnorm_split: its bf16 x differs from add_rmsnorm's");
    size_t inexact = 0;
    for (int t = 0; t < n; t++)
        for (int c = 0; c < H; c++) {
            const size_t i = (size_t)t * H + c, r = (size_t)t * 2 * H + c;
            const double sum = (double)qd_bf16_to_f32(x2[i]) + qd_bf16_to_f32(xr[r]) + qd_bf16_to_f32(xr[r + H]);
            inexact += sum != (double)xf[i];
        }
    CHECKF(inexact == 0, "add_rmsnorm_split %dx%d: %zu rows' parts do not sum to the fp32 row", n, H, inexact);
    float *got = malloc(sizeof(float) * (size_t)n * rows), *ref = malloc(sizeof(float) * (size_t)n * rows),
          *gotf = malloc(sizeof(float) * (size_t)n * rows);
    double worst = 0;
    for (int t = 0; t < n; t++) {
        double row_mag = 0;
        for (int64_t r = 0; r < rows; r++) {
            double acc = 0, mag = 0;
            for (int64_t c = 0; c < cols; c++) {
                const double term = (double)wf[r * cols + c] * xf[(size_t)t * H + c];
                acc += term;
                mag += fabs(term);
            }
            ref[t * rows + r] = (float)acc;
            got[t * rows + r] = y[t * ldy + r];
            gotf[t * rows + r] = yf[t * ldy + r];
            row_mag = fmax(row_mag, mag);
        }
        /* rows differ in scale by 2^12: each compared against its own magnitude */
        char what[96];
        snprintf(what, sizeof what, "matmul_split3 %lldx%lld n=%d token %d", (long long)rows, (long long)cols, n, t);
        worst = fmax(worst, compare(what, got + t * rows, ref + t * rows, (size_t)rows, 0, 4e-6 * row_mag + 1e-30));
        compare("matmul_split3 vs matmul_xf32", got + t * rows, gotf + t * rows, (size_t)rows, 0, 8e-6 * row_mag + 1e-30);
    }
    printf("  router split %lldx%lld n=%-4d worst/limit %.2f\n", (long long)rows, (long long)cols, n, worst);
    free(h); free(nw); free(w); free(wb); free(wf); free(x1); free(x2); free(xr); free(xf); free(y); free(yf);
    free(got); free(ref); free(gotf);
    void *bufs[] = {dh1, dh2, dnw, dW, dx1, dxf, dx2, dxr, dy, dyf};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) qd_cuda_free(bufs[i]);
}

/* H: every width class of add_rmsnorm (rows held in 8, 16 or 24 values a thread, or a loop) */
static void test_embed_norm(int H) {
    const int V = 37, n = 6;
    float *tab = qd_test_rnd(&rng, (size_t)V * H, 1.0f);
    uint16_t *tb = qd_test_round_bf16(tab, (size_t)V * H);
    int32_t tok[6] = {0, 36, 5, 5, 17, 2};
    void *dt = qd_test_dev(tb, (size_t)V * H * 2), *dtok = qd_test_dev(tok, sizeof tok), *dh = qd_test_dev(NULL, (size_t)n * H * 4);
    CHECK(qd_cuda_embed(dt, dtok, n, H, dh, NULL) == QD_OK);
    float *h = qd_test_host(dh, (size_t)n * H * 4);
    int same = 1;
    for (int r = 0; r < n; r++) same &= !memcmp(h + r * H, tab + tok[r] * H, sizeof(float) * H);
    CHECKF(same, "embedding rows differ");
    /* residual add + norm, all rows; then a gather of rows 4, 1 without add */
    float *y = qd_test_rnd(&rng, (size_t)n * H, 2.0f), *w = qd_test_rnd(&rng, H, 0.3f);
    void *dy = qd_test_dev(y, (size_t)n * H * 4), *dw = qd_test_dev(w, (size_t)H * 4), *dx = qd_test_dev(NULL, (size_t)n * H * 2),
         *dxf = qd_test_dev(NULL, (size_t)n * H * 4);
    CHECK(qd_cuda_add_rmsnorm(dh, dy, dw, 1e-6f, n, H, NULL, dx, dxf, NULL) == QD_OK);
    float *h2 = qd_test_host(dh, (size_t)n * H * 4);
    uint16_t *xb = qd_test_host(dx, (size_t)n * H * 2);
    float *sum = malloc(sizeof(float) * n * H), *ref = malloc(sizeof(float) * n * H);
    for (int i = 0; i < n * H; i++) sum[i] = h[i] + y[i];
    compare("residual add", h2, sum, (size_t)n * H, 0, 0);
    qd_cpu_rmsnorm(sum, n, H, H, w, 1.0f, 1e-6f, ref, H);
    float *x = widen(xb, (size_t)n * H), *xf = qd_test_host(dxf, (size_t)n * H * 4);
    compare("add_rmsnorm", x, ref, (size_t)n * H, 8e-3, 1e-6);
    compare("add_rmsnorm fp32 copy", xf, ref, (size_t)n * H, 1e-5, 1e-7);
    free(xf);
    qd_cuda_free(dxf);
    int32_t rows[2] = {4, 1};
    void *drows = qd_test_dev(rows, sizeof rows), *dx2 = qd_test_dev(NULL, (size_t)2 * H * 2);
    CHECK(qd_cuda_add_rmsnorm(dh, NULL, dw, 1e-6f, 2, H, drows, dx2, NULL, NULL) == QD_OK);
    uint16_t *x2b = qd_test_host(dx2, (size_t)2 * H * 2);
    float *x2 = widen(x2b, (size_t)2 * H), *ref2 = malloc(sizeof(float) * 2 * H);
    memcpy(ref2, ref + 4 * H, sizeof(float) * H);
    memcpy(ref2 + H, ref + 1 * H, sizeof(float) * H);
    compare("rmsnorm row gather", x2, ref2, (size_t)2 * H, 8e-3, 1e-6);
    free(tab); free(tb); free(h); free(y); free(w); free(h2); free(xb); free(sum); free(ref); free(x); free(x2b); free(x2);
    free(ref2);
    qd_cuda_free(dt); qd_cuda_free(dtok); qd_cuda_free(dh); qd_cuda_free(dy); qd_cuda_free(dw); qd_cuda_free(dx);
    qd_cuda_free(drows); qd_cuda_free(dx2);
}

/* GDN inputs (conv + SiLU, L2 norms, gates in one kernel) over a ragged batch with
 * permuted state slots == the CPU's conv per span, then its norms and gates. The
 * projection row holds the conv inputs, then b, then a (the layer's layout), at a
 * stride wider than that. */
static void test_gdn_inputs(int hk, int hv, int dk, int dv, int K, int decode_only) {
    enum { NS = 4, SLOTS = 6 };
    const int T[NS] = {1, decode_only ? 1 : 5, decode_only ? 1 : 2, decode_only ? 1 : 70}, slot[NS] = {3, 0, 5, 2};
    int n = 0;
    for (int i = 0; i < NS; i++) n += T[i];
    const int key_dim = hk * dk, value_dim = hv * dv, C = 2 * key_dim + value_dim, W = C + 2 * hv + 3;
    const size_t stn = (size_t)SLOTS * C * (K - 1) + 1;
    float *x = qd_test_rnd(&rng, (size_t)n * W, 1.0f), *w = qd_test_rnd(&rng, (size_t)C * K, 0.5f), *st = qd_test_rnd(&rng, stn, 1.0f);
    float *A = qd_test_rnd(&rng, hv, 1.0f), *dtb = qd_test_rnd(&rng, hv, 1.0f);
    for (int r = 0; r < n; r++) /* the gates' inputs at the scale of real projections */
        for (int i = C; i < W; i++) x[(size_t)r * W + i] *= 2.0f;
    int32_t spans[4 * NS], row_span[128];
    for (int i = 0, r = 0; i < NS; r += T[i], i++) {
        spans[4 * i] = r; spans[4 * i + 1] = T[i]; spans[4 * i + 2] = 0; spans[4 * i + 3] = slot[i];
        for (int t = 0; t < T[i]; t++) row_span[r + t] = i;
    }
    void *dx = qd_test_dev(x, (size_t)n * W * 4), *dw = qd_test_dev(w, (size_t)C * K * 4), *dst = qd_test_dev(st, stn * 4),
         *dsp = qd_test_dev(spans, sizeof spans), *drs = qd_test_dev(row_span, sizeof(int32_t) * n), *dA = qd_test_dev(A, hv * 4),
         *dd = qd_test_dev(dtb, hv * 4);
    void *dq = qd_test_dev(NULL, (size_t)n * key_dim * 2), *dk_ = qd_test_dev(NULL, (size_t)n * key_dim * 2),
         *dvv = qd_test_dev(NULL, (size_t)n * value_dim * 2), *dg = qd_test_dev(NULL, (size_t)n * hv * 4), *db = qd_test_dev(NULL, (size_t)n * hv * 4);
    const qd_cuda_gdn_in_args a = {n, hk, hv, dk, dv, K, NS, dx, W, (float *)dx + C + hv, (float *)dx + C, W, dw, dA, dd,
                                   dst, dsp, drs, dq, dk_, dvv, dg, db, decode_only, 0, NULL};
    ST_OK(qd_cuda_gdn_inputs(&a, NULL));
    uint16_t *q = qd_test_host(dq, (size_t)n * key_dim * 2), *k = qd_test_host(dk_, (size_t)n * key_dim * 2),
             *v = qd_test_host(dvv, (size_t)n * value_dim * 2);
    float *g = qd_test_host(dg, (size_t)n * hv * 4), *beta = qd_test_host(db, (size_t)n * hv * 4), *st2 = qd_test_host(dst, stn * 4);
    float *st0 = malloc(stn * 4);
    memcpy(st0, st, stn * 4);
    /* reference: conv per span (updating st), then the norms and the gates */
    float *ref = malloc(sizeof(float) * (size_t)n * C);
    for (int i = 0; i < NS; i++)
        qd_cpu_conv1d_silu(x + (size_t)spans[4 * i] * W, T[i], C, W, w, K, st + (size_t)slot[i] * C * (K - 1),
                           ref + (size_t)spans[4 * i] * C);
    qd_cpu_l2norm_heads(ref, n, hk, dk, C, 1e-6f, 1.0f / sqrtf((float)dk));
    qd_cpu_l2norm_heads(ref + key_dim, n, hk, dk, C, 1e-6f, 1.0f);
    float *rq = malloc(sizeof(float) * (size_t)n * key_dim), *rk = malloc(sizeof(float) * (size_t)n * key_dim),
          *rv = malloc(sizeof(float) * (size_t)n * value_dim);
    for (int r = 0; r < n; r++) {
        memcpy(rq + (size_t)r * key_dim, ref + (size_t)r * C, sizeof(float) * key_dim);
        memcpy(rk + (size_t)r * key_dim, ref + (size_t)r * C + key_dim, sizeof(float) * key_dim);
        memcpy(rv + (size_t)r * value_dim, ref + (size_t)r * C + 2 * key_dim, sizeof(float) * value_dim);
    }
    float *rg = malloc(sizeof(float) * (size_t)n * hv), *rb = malloc(sizeof(float) * (size_t)n * hv);
    qd_cpu_gdn_gates(x + C + hv, W, x + C, W, n, hv, A, dtb, rg, rb);
    float *fq = widen(q, (size_t)n * key_dim), *fk = widen(k, (size_t)n * key_dim), *fv = widen(v, (size_t)n * value_dim);
    char what[96];
#define QD_GI_CMP(name, got, want, cnt, rt, at)                                                                     \
    do {                                                                                                            \
        snprintf(what, sizeof what, "gdn_inputs hk=%d hv=%d dk=%d dv=%d K=%d%s %s", hk, hv, dk, dv, K,              \
                 decode_only ? " decode" : "", name);                                                               \
        compare(what, got, want, cnt, rt, at);                                                                      \
    } while (0)
    QD_GI_CMP("q", fq, rq, (size_t)n * key_dim, 8e-3, 1e-6);
    QD_GI_CMP("k", fk, rk, (size_t)n * key_dim, 8e-3, 1e-6);
    QD_GI_CMP("v", fv, rv, (size_t)n * value_dim, 8e-3, 1e-6);
    QD_GI_CMP("g", g, rg, (size_t)n * hv, 1e-5, 1e-7);
    QD_GI_CMP("beta", beta, rb, (size_t)n * hv, 1e-5, 1e-7);
    QD_GI_CMP("states", st2, st, (size_t)SLOTS * C * (K - 1), 0, 0);
#undef QD_GI_CMP
    if (!decode_only) { /* the first 28 rows again in a batch of their own: the same bits */
        const int n2 = 28;
        qd_cuda_gdn_in_args a2 = a;
        a2.n = n2;
        ST_OK(qd_cuda_memcpy_h2d(dst, st0, stn * 4));
        ST_OK(qd_cuda_gdn_inputs(&a2, NULL));
        uint16_t *q2 = qd_test_host(dq, (size_t)n2 * key_dim * 2), *k2 = qd_test_host(dk_, (size_t)n2 * key_dim * 2),
                 *v2 = qd_test_host(dvv, (size_t)n2 * value_dim * 2);
        float *g2 = qd_test_host(dg, (size_t)n2 * hv * 4), *b2 = qd_test_host(db, (size_t)n2 * hv * 4);
        CHECKF(!memcmp(q2, q, (size_t)n2 * key_dim * 2) && !memcmp(k2, k, (size_t)n2 * key_dim * 2) &&
                   !memcmp(v2, v, (size_t)n2 * value_dim * 2) && !memcmp(g2, g, (size_t)n2 * hv * 4) &&
                   !memcmp(b2, beta, (size_t)n2 * hv * 4),
               "gdn_inputs hk=%d hv=%d dk=%d dv=%d K=%d: rows 0..%d of %d differ from the same rows in a batch of %d",
               hk, hv, dk, dv, K, n2 - 1, n, n2);
        free(q2); free(k2); free(v2); free(g2); free(b2);
    }
    free(st0);
    free(x); free(w); free(st); free(A); free(dtb); free(q); free(k); free(v); free(g); free(beta); free(st2);
    free(ref); free(rq); free(rk); free(rv); free(rg); free(rb); free(fq); free(fk); free(fv);
    qd_cuda_free(dx); qd_cuda_free(dw); qd_cuda_free(dst); qd_cuda_free(dsp); qd_cuda_free(drs); qd_cuda_free(dA);
    qd_cuda_free(dd); qd_cuda_free(dq); qd_cuda_free(dk_); qd_cuda_free(dvv); qd_cuda_free(dg); qd_cuda_free(db);
}

static void test_gated_norm_and_ffn(int n, int hv, int dv, int I, int H) {
    const size_t no = (size_t)n * hv * dv;
    const int zs = hv * dv + 7;
    float *o = qd_test_rnd(&rng, no, 1.0f), *z = qd_test_rnd(&rng, (size_t)n * zs, 2.0f), *w = qd_test_rnd(&rng, dv, 1.0f);
    uint16_t *ob = qd_test_round_bf16(o, no);
    void *dob = qd_test_dev(ob, no * 2), *dz = qd_test_dev(z, (size_t)n * zs * 4), *dw = qd_test_dev(w, dv * 4), *du = qd_test_dev(NULL, no * 2);
    CHECK(qd_cuda_gated_rmsnorm(dob, dz, zs, dw, 1e-6f, n, hv, dv, du, NULL) == QD_OK);
    uint16_t *ub = qd_test_host(du, no * 2);
    float *zc = malloc(sizeof(float) * no), *ref = malloc(sizeof(float) * no);
    for (int r = 0; r < n; r++) memcpy(zc + (size_t)r * hv * dv, z + (size_t)r * zs, sizeof(float) * hv * dv);
    qd_cpu_gated_rmsnorm(o, zc, w, n, hv, dv, 1e-6f, ref);
    float *u = widen(ub, no);
    compare("gated_rmsnorm", u, ref, no, 8e-3, 1e-6);
    /* SwiGLU and the shared-expert sigmoid scale */
    float *gu = qd_test_rnd(&rng, (size_t)n * 2 * I, 2.0f);
    void *dgu = qd_test_dev(gu, (size_t)n * 2 * I * 4), *dact = qd_test_dev(NULL, (size_t)n * I * 2);
    CHECK(qd_cuda_silu_mul(dgu, n, I, dact, NULL) == QD_OK);
    uint16_t *actb = qd_test_host(dact, (size_t)n * I * 2);
    float *act = widen(actb, (size_t)n * I), *aref = malloc(sizeof(float) * (size_t)n * I);
    for (int r = 0; r < n; r++) qd_cpu_silu_mul(gu + (size_t)r * 2 * I, gu + (size_t)r * 2 * I + I, I, aref + (size_t)r * I);
    compare("silu_mul", act, aref, (size_t)n * I, 8e-3, 1e-6);
    float *ys = qd_test_rnd(&rng, (size_t)n * H, 1.0f), *sg = qd_test_rnd(&rng, (size_t)n * 3, 2.0f), *y0 = qd_test_rnd(&rng, (size_t)n * H, 1.0f);
    void *dys = qd_test_dev(ys, (size_t)n * H * 4), *dsg = qd_test_dev(sg, (size_t)n * 3 * 4), *dy = qd_test_dev(y0, (size_t)n * H * 4);
    CHECK(qd_cuda_sigmoid_scale(dy, dys, dsg, 3, n, H, NULL) == QD_OK);
    float *y = qd_test_host(dy, (size_t)n * H * 4), *yref = malloc(sizeof(float) * (size_t)n * H);
    for (int r = 0; r < n; r++) /* added into y */
        for (int i = 0; i < H; i++) yref[r * H + i] = y0[r * H + i] + qd_sigmoid(sg[r * 3]) * ys[r * H + i];
    compare("sigmoid_scale", y, yref, (size_t)n * H, 1e-6, 1e-6);
    free(o); free(z); free(w); free(ob); free(ub); free(zc); free(ref); free(u); free(gu); free(actb); free(act); free(aref);
    free(ys); free(sg); free(y0); free(y); free(yref);
    qd_cuda_free(dob); qd_cuda_free(dz); qd_cuda_free(dw); qd_cuda_free(du); qd_cuda_free(dgu); qd_cuda_free(dact);
    qd_cuda_free(dys); qd_cuda_free(dsg); qd_cuda_free(dy);
}

static void test_argmax(int n, int V, int limit) {
    float *x = qd_test_rnd(&rng, (size_t)n * V, 1.0f);
    int32_t want[16];
    float wlp[16];
    for (int r = 0; r < n; r++) {
        float *row = x + (size_t)r * V;
        if (r % 2 == 0) { /* a tie: the maximum at two places, the first must win */
            int a = (int)(qd_test_next(&rng) % (uint64_t)V), b = (int)(qd_test_next(&rng) % (uint64_t)V);
            row[a] = row[b] = 100.0f;
        }
        if (limit < V) row[limit + (r % (V - limit))] = 1000.0f; /* a padding id must never win */
        want[r] = 0;
        for (int i = 1; i < limit; i++)
            if (row[i] > row[want[r]]) want[r] = i;
        double se = 0;
        for (int i = 0; i < limit; i++) se += exp((double)row[i] - row[want[r]]);
        wlp[r] = (float)-log(se);
    }
    void *dx = qd_test_dev(x, (size_t)n * V * 4), *di = qd_test_dev(NULL, (size_t)n * 4), *dl = qd_test_dev(NULL, (size_t)n * 4);
    CHECK(qd_cuda_argmax(dx, n, V, limit, NULL, NULL, di, dl, NULL) == QD_OK);
    int32_t *got = qd_test_host(di, (size_t)n * 4);
    float *lp = qd_test_host(dl, (size_t)n * 4);
    CHECKF(!memcmp(got, want, sizeof(int32_t) * n), "argmax V=%d limit=%d differs", V, limit);
    compare("argmax logprob", lp, wlp, (size_t)n, 1e-5, 1e-6);
    free(x); free(got); free(lp);
    qd_cuda_free(dx); qd_cuda_free(di); qd_cuda_free(dl);
}

static int mask_has(const uint32_t *m, int i) { return (m[i >> 5] >> (i & 31)) & 1; }
static void mask_set(uint32_t *m, int i, int on) {
    if (on) m[i >> 5] |= 1u << (i & 31);
    else m[i >> 5] &= ~(1u << (i & 31));
}

/* The masked argmax (qd_forward_args.allow) against a naive reference: the lowest
 * allowed id of the largest allowed logit below limit, its log-softmax over the
 * allowed ids; -1 and -inf when none is allowed. Row kinds by r % 6: a random half
 * with a tie between allowed ids and a refused id far above; all but one refused; none
 * allowed; unmasked (allow_row -1) with a tie; only padding ids (>= limit) allowed;
 * everything allowed and a padding id far above. The masks are shared and out of row
 * order, and their bits past V are set, which nothing may read. */
static void test_argmax_masked(int n, int V, int limit) {
    const size_t W = ((size_t)V + 31) / 32;
    float *x = qd_test_rnd(&rng, (size_t)n * V, 1.0f);
    uint32_t *masks = calloc((size_t)n * W, 4);
    int32_t rows[16], want[16];
    float wlp[16];
    int n_masks = 0;
    for (int r = 0; r < n; r++) {
        float *row = x + (size_t)r * V;
        const int kind = r % 6;
        if (kind == 3) {
            rows[r] = -1;
        } else {
            rows[r] = n - 1 - n_masks; /* out of order: the last mask for the first masked row */
            n_masks++;
        }
        uint32_t *m = rows[r] >= 0 ? masks + (size_t)rows[r] * W : NULL;
        const int a = (int)(qd_test_next(&rng) % (uint64_t)limit), b = (int)(qd_test_next(&rng) % (uint64_t)limit);
        if (kind == 0) {
            for (int i = 0; i < V; i++) mask_set(m, i, qd_test_next(&rng) & 1);
            mask_set(m, a, 1);
            mask_set(m, b, 1);
            row[a] = row[b] = 100.0f; /* a tie of allowed ids: the lower wins */
            int c = (a + 1) % limit;
            if (c != b) {
                mask_set(m, c, 0);
                row[c] = 1000.0f; /* refused: never wins */
            }
        } else if (kind == 1) {
            mask_set(m, a, 1);
            row[(a + 1) % limit] = 1000.0f;
        } else if (kind == 3) {
            row[a] = row[b] = 100.0f;
        } else if (kind == 4) {
            for (int i = limit; i < V; i++) mask_set(m, i, 1);
            if (limit < V) row[limit] = 1000.0f;
        } else if (kind == 5) {
            for (int i = 0; i < V; i++) mask_set(m, i, 1);
            if (limit < V) row[V - 1] = 1000.0f;
        } /* kind 2: nothing allowed */
        if (m)
            for (size_t i = (size_t)V; i < W * 32; i++) m[i >> 5] |= 1u << (i & 31);
        int best = -1;
        for (int i = 0; i < limit; i++)
            if ((!m || mask_has(m, i)) && (best < 0 || row[i] > row[best])) best = i;
        want[r] = best;
        double se = 0;
        for (int i = 0; i < limit && best >= 0; i++)
            if (!m || mask_has(m, i)) se += exp((double)row[i] - row[best]);
        wlp[r] = best >= 0 ? (float)-log(se) : -INFINITY;
    }
    /* a mask shared by two rows: the second masked row reads the first one's */
    if (n > 6) rows[6] = rows[0];
    if (n > 6) {
        want[6] = want[0];
        wlp[6] = wlp[0];
        memcpy(x + (size_t)6 * V, x, (size_t)V * 4);
    }
    void *dx = qd_test_dev(x, (size_t)n * V * 4), *dm = qd_test_dev(masks, (size_t)n * W * 4);
    void *dr = qd_test_dev(rows, (size_t)n * 4), *di = qd_test_dev(NULL, (size_t)n * 4), *dl = qd_test_dev(NULL, (size_t)n * 4);
    CHECK(qd_cuda_argmax(dx, n, V, limit, dm, dr, di, dl, NULL) == QD_OK);
    int32_t *got = qd_test_host(di, (size_t)n * 4);
    float *lp = qd_test_host(dl, (size_t)n * 4);
    for (int r = 0; r < n; r++) {
        CHECKF(got[r] == want[r], "masked argmax V=%d limit=%d row %d (kind %d): got %d want %d", V, limit, r, r % 6,
               got[r], want[r]);
        if (want[r] < 0)
            CHECKF(isinf(lp[r]) && lp[r] < 0, "masked argmax V=%d row %d: no id allowed, logprob %g", V, r, lp[r]);
        else
            CHECKF(fabs((double)lp[r] - wlp[r]) <= 1e-6 + 1e-5 * fabs(wlp[r]),
                   "masked argmax V=%d limit=%d row %d: logprob %.9g want %.9g", V, limit, r, lp[r], wlp[r]);
    }
    /* without logprobs: the same ids */
    CHECK(qd_cuda_argmax(dx, n, V, limit, dm, dr, di, NULL, NULL) == QD_OK);
    int32_t *got2 = qd_test_host(di, (size_t)n * 4);
    CHECKF(!memcmp(got2, want, sizeof(int32_t) * (size_t)n), "masked argmax V=%d without logprobs differs", V);
    free(x); free(masks); free(got); free(got2); free(lp);
    qd_cuda_free(dx); qd_cuda_free(dm); qd_cuda_free(dr); qd_cuda_free(di); qd_cuda_free(dl);
}

/* the device's dummy weights are the CPU's (model_dummy.c): same splitmix streams */
static uint64_t splitmix(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
static void test_dummy(void) {
    const int64_t n = 3 * 4096 + 77;
    const float scale = 0.0371f;
    const uint64_t seed = qd_test_next(&rng);
    uint16_t *want = malloc(sizeof(uint16_t) * (size_t)n);
    for (int64_t blk = 0; blk * 4096 < n; blk++) {
        uint64_t s = seed ^ ((uint64_t)blk * 0xd1b54a32d192ed03ull);
        for (int64_t i = blk * 4096; i < n && i < (blk + 1) * 4096; i++) {
            float u = (float)((splitmix(&s) >> 40) * (1.0 / 16777216.0)) * 2.0f - 1.0f;
            want[i] = qd_f32_to_bf16(u * scale);
        }
    }
    void *d = qd_test_dev(NULL, (size_t)n * 2);
    CHECK(qd_cuda_fill_dummy_bf16(d, n, scale, seed, NULL) == QD_OK);
    uint16_t *got = qd_test_host(d, (size_t)n * 2);
    CHECKF(!memcmp(got, want, (size_t)n * 2), "dummy weights differ from the CPU's");
    free(want); free(got);
    qd_cuda_free(d);
}

int main(void) {
    if (qd_cuda_device_count() == 0) return qd_test_skip("test_cuda_ops", "no CUDA device");
    rng = qd_test_rng_from_env();
    void *stream = NULL;
    qd_cuda_blas *blas = NULL;
    CHECK(qd_cuda_blas_create(&blas, stream) == QD_OK);
    /* GEMV path (n <= 8, 16-byte rows) and cuBLAS path; strided x and y; bf16 output */
    test_matmul(blas, 1, 8, 1, 8, 1, 0);
    test_matmul(blas, 37, 200, 1, 200, 37, 0);
    test_matmul(blas, 513, 1000, 3, 1008, 520, 0);
    test_matmul(blas, 96, 2048, 8, 2048, 96, 0);
    test_matmul(blas, 1000, 264, 9, 264, 1000, 0);
    test_matmul(blas, 77, 130, 17, 136, 77, 0);
    test_matmul(blas, 77, 130, 2, 130, 80, 0); /* cols % 8 != 0: cuBLAS even at small n */
    test_matmul(blas, 300, 512, 65, 512, 300, 1);
    /* the tensor-core GEMV of 2..8 rows: output rows past a multiple of 16, columns a
     * multiple of 8 but not of 32, padded x and y rows, and long rows (many units a warp) */
    test_matmul(blas, 45, 1352, 2, 1360, 48, 0);
    test_matmul(blas, 17, 72, 5, 72, 17, 0);
    test_matmul(blas, 16, 256, 6, 256, 16, 0);
    test_matmul(blas, 130, 4104, 4, 4104, 131, 0);
    test_matmul(blas, 257, 3000, 7, 3008, 260, 0);
    test_matmul(blas, 1, 40, 8, 48, 1, 0);
    test_matmul(blas, 2051, 9000, 3, 9000, 2051, 0);
    /* y += W x: GEMV at n = 1, tensor-core GEMV at 2..8, cuBLAS (beta = 1) above */
    test_matmul_mode(blas, 37, 200, 1, 200, 37, 0, 1);
    test_matmul_mode(blas, 333, 1032, 4, 1032, 340, 0, 1);
    test_matmul_mode(blas, 95, 2048, 8, 2056, 95, 0, 1);
    test_matmul_mode(blas, 77, 136, 17, 136, 77, 0, 1);
    /* the router products: per-pair kernel below 16 tokens, tiled from 16 (same bits) */
    test_matmul_xf32(257, 2048, 1, 2048, 257);
    test_matmul_xf32(257, 2048, 15, 2048, 257);
    test_matmul_xf32(257, 2048, 70, 2048, 257);   /* a partial token tile and row block */
    test_matmul_xf32(513, 2048, 33, 2056, 520);   /* Qwen3-Next's 512 + 1, padded strides */
    test_matmul_xf32(257, 3072, 20, 3072, 257);   /* the 122B-A10B's hidden size */
    test_matmul_xf32(40, 264, 17, 268, 41);       /* the last 256 columns cover one lane */
    test_matmul_xf32(33, 5120, 16, 5120, 33);     /* the largest x tile in shared memory */
    test_matmul_xf32(33, 5128, 16, 5128, 33);     /* beyond it: per pair */
    test_matmul_xf32(9, 100, 70, 104, 10);        /* rows not of 8 columns: per pair, element by element */
    /* the router's tensor-core route: cuBLAS at prefill sizes, the GEMVs at a few rows */
    test_router_split(blas, 257, 2048, 520, 264); /* the model's padded logits stride */
    test_router_split(blas, 513, 2048, 33, 520);
    test_router_split(blas, 257, 3072, 5, 260);
    test_router_split(blas, 9, 100, 70, 10);
    test_router_split(blas, 257, 2048, 1100, 257); /* an unaligned stride: cuBLAS's slower kernels, same result */
    static const int norm_widths[] = {333, 2048, 2049, 4096, 5120, 6170};
    for (size_t i = 0; i < sizeof norm_widths / sizeof norm_widths[0]; i++) test_embed_norm(norm_widths[i]);
    test_gdn_inputs(2, 4, 32, 24, 4, 0);   /* test models' head dims, mixed prefill and decode */
    test_gdn_inputs(16, 32, 128, 128, 4, 0); /* the released models' heads, a prefill batch */
    test_gdn_inputs(3, 3, 40, 16, 2, 0);   /* dk not a multiple of 32 */
    test_gdn_inputs(1, 2, 16, 8, 1, 0);    /* no window */
    test_gdn_inputs(16, 32, 128, 128, 4, 1); /* the released models, decode (the kernel shifts the state) */
    test_gdn_inputs(1, 1, 256, 32, 3, 1);  /* the largest key head */
    test_gdn_inputs(2, 4, 32, 24, 4, 1);
    test_gated_norm_and_ffn(5, 3, 48, 70, 200);
    test_gated_norm_and_ffn(1, 32, 128, 512, 2048);
    test_gated_norm_and_ffn(3, 2, 200, 70, 200); /* a head past 128: the gated norm's loop */
    test_argmax(5, 1000, 1000);
    test_argmax(3, 151936, 151936);
    test_argmax(4, 248320, 248077); /* padding ids past the tokenizer's vocabulary */
    test_argmax(3, 7, 7);           /* fewer ids than the cluster's ranks: some slices empty */
    test_argmax_masked(12, 1000, 1000); /* V not a multiple of 32 */
    test_argmax_masked(7, 77, 50);      /* vocab_limit < V inside the last words */
    test_argmax_masked(13, 248320, 248077);
    test_argmax_masked(7, 9, 5); /* empty slices beside masked ones */
    test_dummy();
    qd_cuda_blas_destroy(blas);
    return qd_test_finish("test_cuda_ops");
}

#else /* no CUDA compiler: nothing to test */

int main(void) { return qd_test_skip("test_cuda_ops", "built without CUDA"); }

#endif
