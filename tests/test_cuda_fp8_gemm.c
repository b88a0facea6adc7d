/* The W8A8 FP8 GEMM of the CUDA backend (cuda_quant.h, gemm_fp8.cu: cuBLASLt's
 * block-scaled FP8 GEMM with per-token dynamic activation scales) against a CPU reference
 * on fresh random inputs (seed printed; QD_TEST_SEED replays it), awkward shapes: rows not
 * a multiple of 128 (partial scale blocks), cols with a partial last 128-block and with
 * ceil(cols / 128) not a multiple of 4 (the weight's scales are then repacked for
 * cuBLASLt), n not a multiple of 4 (the last n % 4 rows take the W8A16 GEMV), x rows at a
 * stride, y stored or accumulated, 128 x 128 block and per-channel weights.
 *
 *  - The activation quantization must give the reference's bytes and scales exactly: the
 *    reference takes the same correctly rounded fp32 steps (s = amax / 448, x / s) and
 *    rounds to the nearest e4m3 code (ties to the even code, saturating at 448) by search.
 *  - The GEMM against the double sum over blocks of s_x s_w sum(q_x q_w) on those bytes:
 *    the products of two e4m3 values are exact, what differs is the tensor cores' in-block
 *    accumulation (narrower than fp32 on Hopper's FP8 path) and the fp32 sum of the
 *    scaled block results, so each element is held to 2^-10 of the sum of |terms|.
 *    The GEMV rows (n % 4) are held to the W8A16 bound of test_cuda_quant.
 *  - The scheme's error against the exact W8A16 product is printed and bounded (rms error
 *    below 8% of the rms value on normal random data: e4m3 has 3 mantissa bits).
 *  - Through the kernel table (qd_cuda_linear at n > 16 with FP8 scratch) the same bits as
 *    the direct call; without the scratch it dequantizes as before.
 *  - Refusals: layouts the GEMM does not take, scratch too small. Skips (77) without a GPU. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/dtype.h"
#include "base/weight.h"
#include "qd_test.h"
#ifdef QD_HAVE_CUDA
#include "backend/cuda/cuda_device.h"
#include "backend/cuda/cuda_linear.h"
#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/cuda_quant.h"
#include "qd_test_cuda.h"
#include "qd_test_fp8.h"

static qd_test_rng rng;

static int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

typedef struct act_ref {
    uint8_t *q;   /* [n][C] */
    float *s;     /* block: [n][L]; channel: [n] */
} act_ref;

static act_ref quant_ref(const float *x, int64_t ldx, int n, int64_t C, int mode) {
    const int64_t bw = mode == QD_FP8_GEMM_BLOCK ? 128 : C, nb = cdiv(C, bw);
    act_ref r = {malloc((size_t)(n * C)), malloc(sizeof(float) * (size_t)(n * nb))};
    for (int t = 0; t < n; t++) qd_test_quant_row(x + t * ldx, C, bw, r.q + t * C, r.s + t * nb, NULL);
    return r;
}

typedef struct gcase {
    int64_t R, C;
    int n, mode, acc;
    int yoff; /* y starts this many floats into its buffer, rows at an odd stride (a stacked part's columns) */
} gcase;

static void make_weight(const gcase *g, qd_weight *w, uint8_t **q, float **sc, int64_t *ns) {
    const int64_t R = g->R, C = g->C;
    *q = malloc((size_t)(R * C));
    for (int64_t i = 0; i < R * C; i++) {
        uint8_t b = (uint8_t)(qd_test_next(&rng) >> 56);
        if ((b & 0x7f) == 0x7f) b ^= 1; /* no NaN codes */
        (*q)[i] = b;
    }
    *ns = g->mode == QD_FP8_GEMM_BLOCK ? cdiv(R, 128) * cdiv(C, 128) : R;
    *sc = malloc(sizeof(float) * (size_t)*ns);
    for (int64_t i = 0; i < *ns; i++) (*sc)[i] = 0.002f + 0.01f * (qd_test_uniform(&rng) + 1.0f);
    *w = (qd_weight){.dtype = QD_DTYPE_F8_E4M3, .rows = R, .cols = C, .data = *q};
    w->scales = (qd_weight_scales){.dtype = QD_DTYPE_F32, .data = *sc, .global = 1.0f,
                                   .block_rows = g->mode == QD_FP8_GEMM_BLOCK ? 128 : 1,
                                   .block_cols = g->mode == QD_FP8_GEMM_BLOCK ? 128 : C};
}

static void run_case(qd_cuda_blas *blas, const gcase *g) {
    const int64_t R = g->R, C = g->C, L = cdiv(C, 128), ldx = C + 24, ldy = R + (g->yoff ? 5 : 4);
    const int n = g->n, n4 = n & ~3;
    const int block = g->mode == QD_FP8_GEMM_BLOCK;
    qd_weight w;
    uint8_t *q;
    float *sc;
    int64_t ns;
    make_weight(g, &w, &q, &sc, &ns);
    float *wf = malloc(sizeof(float) * (size_t)(R * C));
    qd_weight_dequant_rows(&w, 0, R, wf);
    float *xf = qd_test_rnd(&rng, (size_t)(n * ldx), 1.0f);
    for (int t = 0; t < n; t++) /* rows of different magnitudes, one block all zero */
        for (int64_t c = 0; c < C; c++) xf[t * ldx + c] *= (t == 1 && c < 128) ? 0.0f : (float)(1 + t % 7) * 0.5f;
    uint16_t *xb = qd_test_round_bf16(xf, (size_t)(n * ldx));
    float *y0 = qd_test_rnd(&rng, (size_t)(n * ldy), 1.0f);
    qd_weight dw = w;
    dw.data = qd_test_dev(q, (size_t)(R * C));
    dw.scales.data = qd_test_dev(sc, sizeof(float) * (size_t)ns);
    CHECKF(qd_cuda_fp8_gemm_mode(&dw) == g->mode, "%lld x %lld: mode %d, want %d", (long long)R, (long long)C,
           qd_cuda_fp8_gemm_mode(&dw), g->mode);
    uint16_t *dx = qd_test_dev(xb, (size_t)(n * ldx) * 2);
    float *dbuf = qd_test_dev(NULL, sizeof(float) * (size_t)(n * ldy + g->yoff)), *dy = dbuf + g->yoff;
    CHECK(qd_cuda_memcpy_h2d(dy, y0, sizeof(float) * (size_t)(n * ldy)) == QD_OK);
    const size_t sbytes = qd_cuda_fp8_act_bytes(n, R, C);
    void *scratch = qd_test_dev(NULL, sbytes);
    ST_OK(qd_cuda_fp8_gemm(blas, &dw, dx, ldx, n, dy, ldy, g->acc, scratch, sbytes, NULL));
    float *y = qd_test_host(dy, sizeof(float) * (size_t)(n * ldy));

    /* the quantized activations of the GEMM's rows, as the scratch holds them */
    act_ref ar = quant_ref(xf, ldx, n, C, g->mode);
    uint8_t *hq = qd_test_host(scratch, (size_t)(n4 * C));
    const size_t qoff = ((size_t)(((n + 3) & ~3) * C) + 255) & ~(size_t)255;
    float *hs = qd_test_host((uint8_t *)scratch + qoff, sizeof(float) * (size_t)(block ? L * n4 : n4));
    int64_t qbad = 0, sbad = 0;
    for (int64_t i = 0; hq && i < n4 * C; i++) qbad += hq[i] != ar.q[i];
    for (int t = 0; hs && t < n4; t++)
        for (int64_t b = 0; b < (block ? L : 1); b++) sbad += hs[b * n4 + t] != ar.s[t * (block ? L : 1) + b];
    CHECKF(hq && hs && qbad == 0 && sbad == 0, "%s %lld x %lld n=%d: activation bytes off %lld, scales off %lld",
           block ? "block" : "channel", (long long)R, (long long)C, n, (long long)qbad, (long long)sbad);

    int bad = 0;
    double se = 0, sv = 0, worst = 0;
    for (int t = 0; t < n && y; t++)
        for (int64_t r = 0; r < R; r++) {
            const double base = g->acc ? (double)y0[t * ldy + r] : 0.0;
            double ref = 0, mag = 0, exact = 0;
            for (int64_t c = 0; c < C; c++) exact += (double)wf[r * C + c] * (double)xf[t * ldx + c];
            if (t < n4) {
                const int64_t nb = block ? L : 1, bw = block ? 128 : C;
                for (int64_t b = 0; b < nb; b++) {
                    double part = 0, pm = 0;
                    for (int64_t c = b * bw; c < (b + 1) * bw && c < C; c++) {
                        const double p = (double)qd_f8e4m3_to_f32(q[r * C + c]) * qd_f8e4m3_to_f32(ar.q[t * C + c]);
                        part += p;
                        pm += fabs(p);
                    }
                    const double s = (double)ar.s[t * nb + b] * (block ? sc[(r / 128) * L + b] : sc[r]);
                    ref += s * part;
                    mag += s * pm;
                }
            } else { /* the GEMV rows: W8A16 */
                for (int64_t c = 0; c < C; c++) mag += fabs((double)wf[r * C + c] * (double)xf[t * ldx + c]);
                ref = exact;
            }
            const double tol = (t < n4 ? ldexp(1.0, -10) * mag : 2.0 * ((double)C / 32 + 40) * ldexp(1.0, -24) * mag) +
                               ldexp(1.0, -22) * fabs(base) + 1e-30;
            const double got = y[t * ldy + r], err = fabs(got - (ref + base));
            if (!(err <= tol) && bad++ < 3)
                fprintf(stderr, "row %d col %lld: %.9g, reference %.9g (tol %.3g)\n", t, (long long)r, got, ref + base,
                        tol);
            if (tol > 0 && err / tol > worst) worst = err / tol;
            if (t < n4) {
                se += (got - base - exact) * (got - base - exact);
                sv += exact * exact;
            }
        }
    const double rel = sv > 0 ? sqrt(se / sv) : 0;
    CHECKF(y && bad == 0, "%s %lld x %lld n=%d %s: %d elements off", block ? "block" : "channel", (long long)R,
           (long long)C, n, g->acc ? "acc" : "set", bad);
    CHECKF(rel < 0.08, "%s %lld x %lld n=%d: W8A8 rms error %.4f of the exact product", block ? "block" : "channel",
           (long long)R, (long long)C, n, rel);
    printf("fp8 gemm %-7s %5lld x %-5lld n=%-3d %s worst err/tol %.3f, W8A8 vs exact rms %.4f\n",
           block ? "block" : "channel", (long long)R, (long long)C, n, g->acc ? "acc" : "set", worst, rel);

    /* the kernel table takes the same path at n > 16 given the scratch */
    if (n > QD_CUDA_QGEMV_MAX_N) {
        float *dy2 = qd_test_dev(y0, sizeof(float) * (size_t)(n * ldy));
        const qd_cuda_lin_in in = {.kind = QD_LIN_BF16, .x = dx, .ldx = ldx};
        const qd_cuda_lin_out out = {.rows = R, .y = dy2, .ldy = ldy, .qw = &dw, .fp8_act = scratch,
                                     .fp8_act_bytes = sbytes};
        ST_OK(qd_cuda_linear(blas, &in, C, n, &out, 1, g->acc, NULL, NULL));
        float *y2 = qd_test_host(dy2, sizeof(float) * (size_t)(n * ldy));
        CHECKF(y && y2 && !memcmp(y, y2, sizeof(float) * (size_t)(n * ldy)), "linear table: not the FP8 GEMM's bits");
        free(y2);
        qd_cuda_free(dy2);
    }
    void *dev[] = {(void *)dw.data, (void *)dw.scales.data, dx, dbuf, scratch};
    for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++) qd_cuda_free(dev[i]);
    free(q); free(sc); free(wf); free(xf); free(xb); free(y0); free(y); free(ar.q); free(ar.s); free(hq); free(hs);
}

static void test_refusals(qd_cuda_blas *blas) {
    void *d = qd_test_dev(NULL, 1 << 20);
    qd_weight w = {.dtype = QD_DTYPE_F8_E4M3, .rows = 256, .cols = 256, .data = d};
    w.scales = (qd_weight_scales){.dtype = QD_DTYPE_F32, .data = d, .block_rows = 128, .block_cols = 128, .global = 1};
    CHECK(qd_cuda_fp8_gemm_mode(&w) == QD_FP8_GEMM_BLOCK);
    qd_weight v = w;
    v.rows = 258; /* M % 4 */
    CHECK(qd_cuda_fp8_gemm_mode(&v) == 0);
    v = w;
    v.cols = 264; /* K % 16 */
    CHECK(qd_cuda_fp8_gemm_mode(&v) == 0);
    v = w;
    v.scales.block_rows = v.scales.block_cols = 64;
    CHECK(qd_cuda_fp8_gemm_mode(&v) == 0);
    v = w;
    v.scales.dtype = QD_DTYPE_BF16;
    CHECK(qd_cuda_fp8_gemm_mode(&v) == 0);
    v = w;
    v.dtype = QD_DTYPE_INT4;
    CHECK(qd_cuda_fp8_gemm_mode(&v) == 0);
    v = w;
    v.scales.block_rows = 1;
    v.scales.block_cols = 256;
    CHECK(qd_cuda_fp8_gemm_mode(&v) == QD_FP8_GEMM_CHANNEL);
    CHECK(qd_cuda_fp8_gemm(blas, &w, d, 256, 32, d, 256, 0, d, 100, NULL) == QD_ERR_INVALID_ARG);
    v = w;
    v.rows = 258;
    CHECK(qd_cuda_fp8_gemm(blas, &v, d, 256, 32, d, 256, 0, d, 1 << 20, NULL) == QD_ERR_UNSUPPORTED);
    qd_cuda_free(d);
}

int main(void) {
    if (qd_cuda_device_count() == 0) return qd_test_skip("test_cuda_fp8_gemm", "no CUDA device");
    rng = qd_test_rng_from_env();
    qd_cuda_blas *blas = NULL;
    CHECK(qd_cuda_blas_create(&blas, NULL) == QD_OK);
    static const gcase cases[] = {
        {256, 2048, 64, QD_FP8_GEMM_BLOCK, 0, 0},   /* L = 16 */
        {300, 400, 37, QD_FP8_GEMM_BLOCK, 1, 1}, /* partial row and column blocks, n % 4 = 1, y unaligned */
        {132, 272, 22, QD_FP8_GEMM_BLOCK, 0, 0},   /* L = 3: scales repacked; n % 4 = 2 */
        {516, 1040, 131, QD_FP8_GEMM_BLOCK, 1, 0}, /* L = 9 */
        {4, 128, 4, QD_FP8_GEMM_BLOCK, 0, 0},       /* the smallest shape */
        {260, 1008, 50, QD_FP8_GEMM_CHANNEL, 0, 0},
        {64, 4096, 19, QD_FP8_GEMM_CHANNEL, 1, 3},
    };
    for (size_t i = 0; blas && i < sizeof cases / sizeof cases[0]; i++) run_case(blas, &cases[i]);
    if (blas) test_refusals(blas);
    qd_cuda_blas_destroy(blas);
    return qd_test_finish("test_cuda_fp8_gemm");
}

#else

int main(void) { return qd_test_skip("test_cuda_fp8_gemm", "built without CUDA"); }

#endif
