/* The quantized-weight GEMV of the CUDA backend (cuda_quant.h, gemv_quant.cu) against
 * the CPU reference: qd_weight_dequant_rows (base/weight.c, the exact dequantization)
 * and a double-accumulated product, on fresh random inputs (seed printed; QD_TEST_SEED
 * replays it): random stored bytes, random scales, bf16 x, awkward shapes (rows and
 * cols not multiples of the block, partial blocks and groups at the edges), every
 * format of base/weight.h: FP8 block 128 x 128 (F32 and BF16 scales) and per-channel,
 * NVFP4 (e4m3 scales of 1 x 16, global factor), INT4 with group sizes 32 / 64 / 128 /
 * -1 (one group), with and without zeros, and GPTQ act-order (g_idx); n = 1..16, y
 * stored or accumulated, every element of y checked, the padding between y rows must
 * keep its bits. Also the refusals (n out of range, a plain format, NVFP4 with cols
 * % 16), and the kernel table (qd_cuda_linear with quantized outputs: bf16 x and an
 * RMSNorm input, an FP8 and an INT4 product in one call) against qd_cuda_qgemv on the
 * same x, bit for bit (the table materialises x, then runs the same kernel), its refusal
 * of the fused path and of n > 16 without dequantization scratch, and with it the prefill
 * and invariant products on the dequantized weight.
 *
 * Tolerance: the GPU dequantizes each element with the same fp32 operations in the same
 * order as the reference (e4m3 * scale; e2m1 * scale * global; (q - z) * scale), so the
 * weights are the same floats (the tensor-core kernel's NVFP4 weights are e2m1 * scale,
 * exact in bf16, and the global factor multiplies their sum: one rounding of the sum for
 * one of each weight, within the slack below); what differs is the summation. The element loop: each lane
 * adds cols / 32 terms in fp32 (each fma rounds once), then a 5-level shuffle tree. The
 * vectorised kernel (layouts qd_cuda_qlayout_vectorised takes: the cases with cols % 16 or
 * % 32 and F32 scales) sums a piece's <= 32 unscaled terms, scales that partial sum (one
 * rounding) and adds it to the lane's total (cols / 512 or fewer pieces per lane). Recursive
 * summation of k terms errs by at most (k - 1) u sum |terms| (u = 2^-24), so
 * |y - ref| <= (cols / 32 + 40) 2^-24 sum |w x| bounds both; the check uses twice it plus
 * 1e-30. The dequantization kernel must give bf16 of the reference's fp32 values, bit for
 * bit. Skips (77) without a GPU. */
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

static qd_test_rng rng;

typedef struct qcase {
    const char *name;
    qd_dtype fmt;
    int64_t rows, cols, br, bc; /* bc -1: one group over cols (INT4) */
    qd_dtype scale_dtype;
    int zeros, act_order, n, acc;
    int odd_ldx; /* x rows at an odd stride: only the element loop takes them */
} qcase;

static int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

static uint8_t rnd_byte(void) { return (uint8_t)(qd_test_next(&rng) >> 56); }

/* sum_c w[c] x[c] in double, and sum_c |w[c] x[c]| into *mag (the scale of its rounding). */
static double ref_dot(const float *w, const float *x, int64_t C, double *mag) {
    double ref = 0, m = 0;
    for (int64_t c = 0; c < C; c++) {
        const double p = (double)w[c] * (double)x[c];
        ref += p;
        m += fabs(p);
    }
    *mag = m;
    return ref;
}

/* The FP8 tensor cores' share of a row's error (the wgmma GEMV, cuda_quant.h): per 32-column
 * group the hardware truncates each product to 13 fractional bits below the group's largest
 * and its sum to 14 significant bits, so a group errs by less than 2^-13 (32 max |p| + |sum|);
 * x is split into two e4m3 terms with |t1| <= (1 + 2^-4) |x| and |t2 / 16| <= 2^-4 |x| (a
 * factor 1.125 on both), exact except for elements below 2^-15 of their 128-column block's
 * maximum, whose error is under 2^-21 of it. The groups lie inside the row's 64-column
 * units, so a unit bounds its two groups by its own max and sum: 2^-13 1.125 (64.4 max_u |w x|
 * + sum_u |w x|) a unit, plus 2^-21 amax_b sum_b |w| a block. */
static double wgmma_tol(const float *w, const float *x, int64_t C) {
    double tol = 0;
    for (int64_t u = 0; u < C; u += 64) {
        double mx = 0, sum = 0;
        for (int64_t c = u; c < C && c < u + 64; c++) {
            const double p = fabs((double)w[c] * (double)x[c]);
            mx = p > mx ? p : mx;
            sum += p;
        }
        tol += ldexp(1.0, -13) * 1.125 * (64.4 * mx + sum);
    }
    for (int64_t b = 0; b < C; b += 128) {
        double amax = 0, wsum = 0;
        for (int64_t c = b; c < C && c < b + 128; c++) {
            amax = fabs(x[c]) > amax ? fabs(x[c]) : amax;
            wsum += fabs(w[c]);
        }
        tol += ldexp(1.0, -21) * amax * wsum;
    }
    return tol;
}

/* y (n x ldy, after the kernel) against the double reference of the dequantized weights wf
 * (R x C) and x (bf16 values xf at stride ldx), plus y0 where the case accumulates; the
 * padding rows past R keep y0's bits. wgmma: the kernel on the FP8 tensor cores, whose
 * bound adds wgmma_tol. */
static void check_y_kind(const qcase *qc, const char *kernel, const float *y, const float *y0, const float *wf,
                         const float *xf, int64_t ldx, int64_t ldy, int wgmma) {
    const int64_t R = qc->rows, C = qc->cols;
    const int n = qc->n;
    int bad = 0;
    double worst = 0;
    for (int t = 0; t < n && y; t++) {
        for (int64_t r = 0; r < R; r++) {
            double mag;
            const double ref = ref_dot(wf + r * C, xf + t * ldx, C, &mag);
            const double base = qc->acc ? (double)y0[t * ldy + r] : 0.0;
            const double got = y[t * ldy + r], err = fabs(got - (ref + base));
            const double tol = 2.0 * ((double)C / 32 + 40) * ldexp(1.0, -24) * (mag + fabs(base)) + 1e-30 +
                               (wgmma ? 2.0 * wgmma_tol(wf + r * C, xf + t * ldx, C) : 0.0);
            if (!(err <= tol)) {
                if (bad++ < 3)
                    fprintf(stderr, "%s %s n=%d: y[%d][%lld] = %.9g, reference %.9g (tol %.3g)\n", qc->name, kernel,
                            n, t, (long long)r, got, ref + base, tol);
            }
            if (tol > 0 && err / tol > worst) worst = err / tol;
        }
        for (int64_t r = R; r < ldy; r++) /* padding keeps its bits */
            if (memcmp(&y[t * ldy + r], &y0[t * ldy + r], 4)) bad++;
    }
    CHECKF(y && bad == 0, "%s %s (%lld x %lld, n = %d): %d elements off", qc->name, kernel, (long long)R,
           (long long)C, n, bad);
    printf("%-28s %-7s %5lld x %-5lld n=%-2d %s worst err/tol %.3f\n", qc->name, kernel, (long long)R, (long long)C,
           n, qc->acc ? "acc" : "set", worst);
}

static void check_y(const qcase *qc, const char *kernel, const float *y, const float *y0, const float *wf,
                    const float *xf, int64_t ldx, int64_t ldy) {
    check_y_kind(qc, kernel, y, y0, wf, xf, ldx, ldy, 0);
}

static void run_case(const qcase *qc) {
    const int64_t R = qc->rows, C = qc->cols, bc = qc->bc < 0 ? C : qc->bc;
    const int n = qc->n;
    qd_weight w = {.dtype = qc->fmt, .rows = R, .cols = C};
    w.scales.dtype = qc->scale_dtype;
    w.scales.global = 1.0f;
    size_t dbytes = qc->fmt == QD_DTYPE_F8_E4M3 ? (size_t)(R * C) : (size_t)(R * C / 2);
    uint8_t *q = malloc(dbytes);
    for (size_t i = 0; i < dbytes; i++) {
        q[i] = rnd_byte();
        if (qc->fmt == QD_DTYPE_F8_E4M3 && (q[i] & 0x7f) == 0x7f) q[i] = 0x7e; /* no NaN patterns */
    }
    w.data = q;
    int64_t ns;
    if (qc->fmt == QD_DTYPE_F8_E4M3) {
        w.scales.block_rows = qc->br;
        w.scales.block_cols = bc;
        ns = cdiv(R, qc->br) * cdiv(C, bc);
    } else if (qc->fmt == QD_DTYPE_NVFP4) {
        w.scales.block_rows = 1;
        w.scales.block_cols = 16;
        w.scales.global = 0.37f;
        ns = R * (C / 16);
    } else {
        w.scales.block_rows = 1;
        w.scales.block_cols = bc;
        ns = R * cdiv(C, bc);
    }
    const size_t ssz = qd_dtype_size(qc->scale_dtype);
    unsigned char *sc = malloc((size_t)ns * ssz);
    for (int64_t i = 0; i < ns; i++) {
        const float v = 0.01f + 0.05f * (qd_test_uniform(&rng) + 1.0f);
        if (qc->scale_dtype == QD_DTYPE_F32) memcpy(sc + i * 4, &v, 4);
        else if (qc->scale_dtype == QD_DTYPE_BF16) ((uint16_t *)sc)[i] = qd_f32_to_bf16(v);
        else if (qc->scale_dtype == QD_DTYPE_F16) ((uint16_t *)sc)[i] = qd_f32_to_f16(v);
        else sc[i] = (uint8_t)(0x28 + (rnd_byte() % 0x30)); /* e4m3 in [2^-4, 2^2) */
    }
    w.scales.data = sc;
    uint8_t *zeros = NULL;
    int32_t *g_idx = NULL;
    if (qc->zeros) {
        zeros = malloc((size_t)ns);
        for (int64_t i = 0; i < ns; i++) zeros[i] = (uint8_t)(rnd_byte() % 16);
        w.scales.zeros = zeros;
    }
    if (qc->act_order) { /* GPTQ desc_act: g_idx[c] = (position of c in a random order) / group size */
        int32_t *perm = malloc(sizeof(int32_t) * (size_t)C);
        for (int64_t c = 0; c < C; c++) perm[c] = (int32_t)c;
        for (int64_t c = C - 1; c > 0; c--) {
            const int64_t j = (int64_t)(qd_test_next(&rng) % (uint64_t)(c + 1));
            const int32_t t = perm[c];
            perm[c] = perm[j];
            perm[j] = t;
        }
        g_idx = malloc(sizeof(int32_t) * (size_t)C);
        for (int64_t i = 0; i < C; i++) g_idx[perm[i]] = (int32_t)(i / bc);
        free(perm);
        w.scales.g_idx = g_idx;
    }
    /* the reference */
    float *wf = malloc(sizeof(float) * (size_t)(R * C));
    qd_weight_dequant_rows(&w, 0, R, wf);
    const int64_t ldx = qc->odd_ldx ? C + 3 : (C + 7) / 8 * 8 + 8, ldy = R + 5;
    float *xf = qd_test_rnd(&rng, (size_t)(n * ldx), 1.0f);
    uint16_t *xb = qd_test_round_bf16(xf, (size_t)(n * ldx));
    float *y0 = qd_test_rnd(&rng, (size_t)(n * ldy), 1.0f);
    /* the device copy of the weight: the same struct with device pointers */
    qd_weight dw = w;
    dw.data = qd_test_dev(q, dbytes);
    dw.scales.data = qd_test_dev(sc, (size_t)ns * ssz);
    dw.scales.zeros = zeros ? qd_test_dev(zeros, (size_t)ns) : NULL;
    dw.scales.g_idx = g_idx ? qd_test_dev(g_idx, sizeof(int32_t) * (size_t)C) : NULL;
    uint16_t *dx = qd_test_dev(xb, (size_t)(n * ldx) * 2);
    float *dy = qd_test_dev(NULL, sizeof(float) * (size_t)(n * ldy));
    /* every kernel that takes the call, and the table's pick: which kernels take it is
     * asserted, so a kernel refusing a layout it should take fails here */
    const int aligned = !qc->odd_ldx && ((uintptr_t)dw.data & 15) == 0;
    const qd_cuda_qgemv_out one = {.qw = &dw, .rows = R, .y = dy, .ldy = ldy};
    const int takes[5] = {1, 1, aligned && qd_cuda_qlayout_vectorised(&dw),
                          aligned && qd_cuda_qlayout_vectorised(&dw) && qd_cuda_qgemv_mma_takes(&dw),
                          aligned && qd_cuda_qgemv_wgmma_takes(&one, 1, C, dx, ldx)};
    static const char *path_name[5] = {"table", "elem", "vec", "mma", "wgmma"};
    /* the FP8 tensor cores take FP8 with scale blocks of 128 * 2^k columns or one a row */
    CHECKF(takes[4] == (aligned && qc->fmt == QD_DTYPE_F8_E4M3 && C % 16 == 0 && qc->scale_dtype == QD_DTYPE_F32 &&
                        (bc == C || bc == 128 || bc == 256 || bc == 512 || bc == 1024)),
           "%s: the wgmma GEMV takes it: %d", qc->name, takes[4]);
    const int choice = qd_cuda_qgemv_choice(&dw, dx, ldx);
    CHECKF(choice == (takes[3] ? QD_QGEMV_PATH_MMA : takes[2] ? QD_QGEMV_PATH_VEC : QD_QGEMV_PATH_ELEM),
           "%s: the table picks kernel %d", qc->name, choice);
    float *y_by_path[5] = {0};
    for (int path = 0; path < 5; path++) {
        ST_OK(qd_cuda_memcpy_h2d(dy, y0, sizeof(float) * (size_t)(n * ldy)));
        const qd_status st = qd_cuda_qgemv_path(path, &dw, dx, ldx, n, dy, ldy, qc->acc, NULL);
        CHECKF(st == (takes[path] ? QD_OK : QD_ERR_UNSUPPORTED), "%s: kernel %s returned %d", qc->name,
               path_name[path], (int)st);
        if (st) continue;
        float *y = qd_test_host(dy, sizeof(float) * (size_t)(n * ldy));
        y_by_path[path] = y;
        check_y_kind(qc, path_name[path], y, y0, wf, xf, ldx, ldy,
                     path == QD_QGEMV_PATH_WGMMA || (path == 0 && choice == QD_QGEMV_PATH_WGMMA));
    }
    /* the wgmma kernel at every block shape it can be given: warpgroups 1 or 2 a block, a
     * cluster of 1, 2, 4 or 8 blocks along the columns; others refused */
    if (takes[4]) {
        for (int wg = 1; wg <= 4; wg *= 2)
            for (int ks = 1; ks <= 8; ks *= 2) {
                char label[40];
                snprintf(label, sizeof label, "wgmma/%dx%d", wg, ks);
                ST_OK(qd_cuda_memcpy_h2d(dy, y0, sizeof(float) * (size_t)(n * ldy)));
                /* refused exactly where a rank's B and scales pass its 160 KiB */
                const int64_t ng = n <= 4 ? 1 : n <= 8 ? 2 : 4, bpr = cdiv(cdiv(C, 128), ks);
                const int fits = bpr * 4 * ng * 256 + bpr * 4 * ng * 4 <= 160 * 1024;
                const qd_status st = qd_cuda_qgemv_wgmma(&one, 1, C, dx, ldx, n, qc->acc, wg, ks, NULL);
                CHECKF(st == (fits ? QD_OK : QD_ERR_UNSUPPORTED), "%s %s: status %d", qc->name, label, (int)st);
                if (st) continue;
                float *y = qd_test_host(dy, sizeof(float) * (size_t)(n * ldy));
                check_y_kind(qc, label, y, y0, wf, xf, ldx, ldy, 1);
                free(y);
            }
        CHECK(qd_cuda_qgemv_wgmma(&one, 1, C, dx, ldx, n, qc->acc, 3, 1, NULL) == QD_ERR_INVALID_ARG);
        CHECK(qd_cuda_qgemv_wgmma(&one, 1, C, dx, ldx, n, qc->acc, 1, 16, NULL) == QD_ERR_INVALID_ARG);
        CHECK(qd_cuda_qgemv_wgmma(&one, 1, C, dx, ldx, n, qc->acc, 1, 0, NULL) == QD_ERR_INVALID_ARG);
    }
    /* the tensor-core kernel at every warp count a block it can be given (the table's is
     * one of them): each within the reference's bounds; another count is refused */
    if (takes[3]) {
        static const int warps[] = {2, 4, 8, 16};
        for (int i = 0; i < 4; i++) {
            char label[16];
            snprintf(label, sizeof label, "mma/%d", warps[i]);
            ST_OK(qd_cuda_memcpy_h2d(dy, y0, sizeof(float) * (size_t)(n * ldy)));
            ST_OK(qd_cuda_qgemv_mma_warps(&dw, dx, ldx, n, dy, ldy, qc->acc, warps[i], NULL));
            float *y = qd_test_host(dy, sizeof(float) * (size_t)(n * ldy));
            check_y(qc, label, y, y0, wf, xf, ldx, ldy);
            free(y);
        }
        CHECKF(qd_cuda_qgemv_mma_warps(&dw, dx, ldx, n, dy, ldy, qc->acc, 3, NULL) == QD_ERR_INVALID_ARG,
               "%s: a block of 3 warps is not refused", qc->name);
    }
    /* the table runs its pick: the same bits */
    CHECKF(y_by_path[0] && y_by_path[choice] &&
               !memcmp(y_by_path[0], y_by_path[choice], sizeof(float) * (size_t)(n * ldy)),
           "%s: the table's output differs from kernel %s", qc->name, path_name[choice]);
    /* a row's sums do not depend on n: the first token alone gives the same bits */
    if (n > 1) {
        for (int path = 1; path < 5; path++) {
            if (!takes[path]) continue;
            ST_OK(qd_cuda_memcpy_h2d(dy, y0, sizeof(float) * (size_t)ldy));
            ST_OK(qd_cuda_qgemv_path(path, &dw, dx, ldx, 1, dy, ldy, qc->acc, NULL));
            float *y1 = qd_test_host(dy, sizeof(float) * (size_t)ldy);
            CHECKF(y1 && y_by_path[path] && !memcmp(y1, y_by_path[path], sizeof(float) * (size_t)R),
                   "%s %s: token 0 alone differs from token 0 of %d", qc->name, path_name[path], n);
            free(y1);
        }
    }
    for (int path = 0; path < 5; path++) free(y_by_path[path]);
    /* the dequantization the prefill products run on: bf16 of the reference, bit for bit */
    uint16_t *dq = qd_test_dev(NULL, (size_t)(R * C) * 2);
    ST_OK(qd_cuda_dequant_bf16(&dw, dq, NULL));
    uint16_t *hq = qd_test_host(dq, (size_t)(R * C) * 2);
    int64_t dbad = 0;
    for (int64_t i = 0; hq && i < R * C; i++) dbad += hq[i] != qd_f32_to_bf16(wf[i]);
    CHECKF(hq && dbad == 0, "%s: dequantized bf16 differs from the reference at %lld elements", qc->name,
           (long long)dbad);
    free(hq);
    qd_cuda_free(dq);
    qd_cuda_free((void *)dw.data);
    qd_cuda_free((void *)dw.scales.data);
    qd_cuda_free((void *)dw.scales.zeros);
    qd_cuda_free((void *)dw.scales.g_idx);
    qd_cuda_free(dx);
    qd_cuda_free(dy);
    free(q); free(sc); free(zeros); free(g_idx); free(wf); free(xf); free(xb); free(y0);
}

static void test_refusals(void) {
    qd_weight w = {.dtype = QD_DTYPE_F8_E4M3, .rows = 4, .cols = 32};
    void *d = qd_test_dev(NULL, 4096);
    w.data = d;
    w.scales = (qd_weight_scales){.dtype = QD_DTYPE_F32, .data = d, .block_rows = 128, .block_cols = 128};
    CHECK(qd_cuda_qgemv(&w, d, 32, 17, d, 4, 0, NULL) == QD_ERR_INVALID_ARG);
    CHECK(qd_cuda_qgemv(&w, d, 16, 1, d, 4, 0, NULL) == QD_ERR_INVALID_ARG); /* ldx < cols */
    w.dtype = QD_DTYPE_BF16;
    CHECK(qd_cuda_qgemv(&w, d, 32, 1, d, 4, 0, NULL) == QD_ERR_UNSUPPORTED);
    w.dtype = QD_DTYPE_NVFP4;
    w.cols = 24;
    w.scales.dtype = QD_DTYPE_F8_E4M3;
    CHECK(qd_cuda_qgemv(&w, d, 32, 1, d, 4, 0, NULL) == QD_ERR_UNSUPPORTED);
    w.dtype = QD_DTYPE_INT4;
    w.cols = 32;
    w.scales.dtype = QD_DTYPE_F8_E4M3;
    CHECK(qd_cuda_qgemv(&w, d, 32, 1, d, 4, 0, NULL) == QD_ERR_UNSUPPORTED);
    w.scales.data = NULL;
    CHECK(qd_cuda_qgemv(&w, d, 32, 1, d, 4, 0, NULL) == QD_ERR_INVALID_ARG);
    qd_cuda_free(d);
}

/* qd_cuda_linear with quantized products: the same bits as qd_cuda_qgemv on the x the
 * table materialises (RMSNORM through qd_cuda_add_rmsnorm, as the plain path does). */
static void test_linear_table(qd_cuda_blas *blas) {
    const int64_t C = 1000, R0 = 300, R1 = 77;
    const int n = 3;
    uint8_t *q8 = malloc((size_t)(R0 * C)), *q4 = malloc((size_t)(R1 * C / 2));
    for (int64_t i = 0; i < R0 * C; i++) q8[i] = (uint8_t)(rnd_byte() & 0x77); /* finite e4m3 */
    for (int64_t i = 0; i < R1 * C / 2; i++) q4[i] = rnd_byte();
    float *s8 = qd_test_rnd(&rng, (size_t)(cdiv(R0, 128) * cdiv(C, 128)), 0.05f);
    float *s4 = qd_test_rnd(&rng, (size_t)(R1 * cdiv(C, 64)), 0.05f);
    qd_weight w8 = {.dtype = QD_DTYPE_F8_E4M3, .rows = R0, .cols = C};
    w8.data = qd_test_dev(q8, (size_t)(R0 * C));
    w8.scales = (qd_weight_scales){.dtype = QD_DTYPE_F32, .block_rows = 128, .block_cols = 128, .global = 1.0f};
    w8.scales.data = qd_test_dev(s8, sizeof(float) * (size_t)(cdiv(R0, 128) * cdiv(C, 128)));
    qd_weight w4 = {.dtype = QD_DTYPE_INT4, .rows = R1, .cols = C};
    w4.data = qd_test_dev(q4, (size_t)(R1 * C / 2));
    w4.scales = (qd_weight_scales){.dtype = QD_DTYPE_F32, .block_rows = 1, .block_cols = 64, .global = 1.0f};
    w4.scales.data = qd_test_dev(s4, sizeof(float) * (size_t)(R1 * cdiv(C, 64)));
    float *hf = qd_test_rnd(&rng, (size_t)(n * C), 1.0f), *nw = qd_test_rnd(&rng, (size_t)C, 0.1f);
    uint16_t *xb = qd_test_round_bf16(hf, (size_t)(n * C));
    float *dh = qd_test_dev(hf, sizeof(float) * (size_t)(n * C)), *dnw = qd_test_dev(nw, sizeof(float) * (size_t)C);
    uint16_t *dx = qd_test_dev(xb, (size_t)(n * C) * 2), *scratch = qd_test_dev(NULL, (size_t)(n * C) * 2);
    uint16_t *xm = qd_test_dev(NULL, (size_t)(n * C) * 2);
    float *y[4];
    for (int i = 0; i < 4; i++) y[i] = qd_test_dev(NULL, sizeof(float) * (size_t)(n * R0));
    for (int kind = 0; kind < 2; kind++) {
        qd_cuda_lin_in in = {.kind = kind ? QD_LIN_RMSNORM : QD_LIN_BF16, .x = dx, .ldx = C, .h = dh, .w = dnw,
                             .eps = 1e-6f};
        const qd_cuda_lin_out out[2] = {{.rows = R0, .y = y[0], .ldy = R0, .qw = &w8},
                                        {.rows = R1, .y = y[1], .ldy = R1, .qw = &w4}};
        CHECK(qd_cuda_linear_choice(&in, C, n, out, 2) == QD_LIN_PATH_PLAIN);
        ST_OK(qd_cuda_linear(blas, &in, C, n, out, 2, 0, scratch, NULL));
        const uint16_t *x = dx;
        if (kind) {
            ST_OK(qd_cuda_add_rmsnorm(dh, NULL, dnw, 1e-6f, n, (int)C, NULL, xm, NULL, NULL));
            x = xm;
        }
        ST_OK(qd_cuda_qgemv(&w8, x, C, n, y[2], R0, 0, NULL));
        ST_OK(qd_cuda_qgemv(&w4, x, C, n, y[3], R1, 0, NULL));
        float *a = qd_test_host(y[0], sizeof(float) * (size_t)(n * R0)), *b = qd_test_host(y[2], sizeof(float) * (size_t)(n * R0));
        float *c = qd_test_host(y[1], sizeof(float) * (size_t)(n * R1)), *d = qd_test_host(y[3], sizeof(float) * (size_t)(n * R1));
        CHECKF(a && b && !memcmp(a, b, sizeof(float) * (size_t)(n * R0)), "linear table, fp8 product, kind %d", kind);
        CHECKF(c && d && !memcmp(c, d, sizeof(float) * (size_t)(n * R1)), "linear table, int4 product, kind %d", kind);
        free(a); free(b); free(c); free(d);
        CHECK(qd_cuda_linear(blas, &in, C, 17, out, 2, 0, scratch, NULL) == QD_ERR_INVALID_ARG); /* no dequant */
        CHECK(qd_cuda_linear_path(QD_LIN_PATH_FUSED, blas, &in, C, n, out, 2, 0, scratch, NULL) == QD_ERR_UNSUPPORTED);
    }
    void *dev[] = {(void *)w8.data, (void *)w8.scales.data, (void *)w4.data, (void *)w4.scales.data, dh, dnw, dx,
                   scratch, xm, y[0], y[1], y[2], y[3]};
    for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++) qd_cuda_free(dev[i]);
    free(q8); free(q4); free(s8); free(s4); free(hf); free(nw); free(xb);
}

/* A call of three products sharing an RMSNorm input (an FP8 block-128 and an INT4-free stack:
 * FP8, bf16, FP8 as a GDN in_proj with its bf16 a / b parts) through the table: one launch of
 * the tensor-core GEMV, its blocks building x once each over several tiles (n = 1, 3; at
 * n = 11 x and the kernel's own shared memory are over 48 KiB, x is materialised); each
 * product against the double reference on the x qd_cuda_add_rmsnorm materialises, bit for
 * bit equal to the products on that x, and token 0 of n = 1 and of n = 3 / 11 bit for bit. */
static void test_linear_multi(qd_cuda_blas *blas) {
    /* 508 tiles of 16 rows: more than the building blocks resident at once, so a block takes
     * several (qm_build_blocks) */
    const int64_t C = 2048, R[3] = {7997, 77, 40};
    uint8_t *q[2];
    float *s[2];
    qd_weight w[2];
    for (int i = 0; i < 2; i++) {
        const int64_t rows = R[2 * i];
        q[i] = malloc((size_t)(rows * C));
        for (int64_t e = 0; e < rows * C; e++) q[i][e] = (uint8_t)(rnd_byte() & 0xf7); /* no NaN codes */
        const int64_t ns = cdiv(rows, 128) * cdiv(C, 128);
        s[i] = qd_test_rnd(&rng, (size_t)ns, 0.05f);
        w[i] = (qd_weight){.dtype = QD_DTYPE_F8_E4M3, .rows = rows, .cols = C, .data = q[i]};
        w[i].scales = (qd_weight_scales){.dtype = QD_DTYPE_F32, .data = s[i], .block_rows = 128, .block_cols = 128,
                                         .global = 1.0f};
    }
    float *wf[3];
    for (int i = 0; i < 2; i++) {
        wf[2 * i] = malloc(sizeof(float) * (size_t)(R[2 * i] * C));
        qd_weight_dequant_rows(&w[i], 0, R[2 * i], wf[2 * i]);
    }
    float *bf = qd_test_rnd(&rng, (size_t)(R[1] * C), 0.05f);
    uint16_t *bb = qd_test_round_bf16(bf, (size_t)(R[1] * C));
    wf[1] = malloc(sizeof(float) * (size_t)(R[1] * C));
    for (int64_t e = 0; e < R[1] * C; e++) wf[1][e] = qd_bf16_to_f32(bb[e]);
    qd_weight dw[2];
    for (int i = 0; i < 2; i++) {
        dw[i] = w[i];
        dw[i].data = qd_test_dev(q[i], (size_t)(R[2 * i] * C));
        dw[i].scales.data = qd_test_dev(s[i], sizeof(float) * (size_t)(cdiv(R[2 * i], 128) * cdiv(C, 128)));
    }
    uint16_t *dbw = qd_test_dev(bb, (size_t)(R[1] * C) * 2);
    const int nmax = 11;
    float *hf = qd_test_rnd(&rng, (size_t)(nmax * C), 1.0f), *nw = qd_test_rnd(&rng, (size_t)C, 0.1f);
    float *dh = qd_test_dev(hf, sizeof(float) * (size_t)(nmax * C)), *dnw = qd_test_dev(nw, sizeof(float) * (size_t)C);
    uint16_t *scratch = qd_test_dev(NULL, (size_t)(nmax * C) * 2);
    float *dy[3];
    for (int i = 0; i < 3; i++) dy[i] = qd_test_dev(NULL, sizeof(float) * (size_t)(nmax * R[i]));
    const qd_cuda_lin_in in = {.kind = QD_LIN_RMSNORM, .h = dh, .w = dnw, .eps = 1e-6f};
    const qd_cuda_lin_out out[3] = {{.rows = R[0], .y = dy[0], .ldy = R[0], .qw = &dw[0]},
                                    {.W = dbw, .rows = R[1], .y = dy[1], .ldy = R[1]},
                                    {.rows = R[2], .y = dy[2], .ldy = R[2], .qw = &dw[1]}};
    const qd_cuda_qgemv_out qo[3] = {{.qw = &dw[0], .rows = R[0], .y = dy[0], .ldy = R[0]},
                                     {.W = dbw, .rows = R[1], .y = dy[1], .ldy = R[1]},
                                     {.qw = &dw[1], .rows = R[2], .y = dy[2], .ldy = R[2]}};
    CHECK(qd_cuda_qgemv_multi_takes(qo, 3, C, scratch, C));
    uint16_t *xm = qd_test_dev(NULL, (size_t)(nmax * C) * 2);
    float *dz[3];
    for (int i = 0; i < 3; i++) dz[i] = qd_test_dev(NULL, sizeof(float) * (size_t)(nmax * R[i]));
    const qd_cuda_qgemv_out qz[3] = {{.qw = &dw[0], .rows = R[0], .y = dz[0], .ldy = R[0]},
                                     {.W = dbw, .rows = R[1], .y = dz[1], .ldy = R[1]},
                                     {.qw = &dw[1], .rows = R[2], .y = dz[2], .ldy = R[2]}};
    float *first[3] = {0}, *wg_first[3] = {0};
    static const int ns[3] = {1, 3, nmax};
    for (int k = 0; k < 3; k++) {
        const int n = ns[k];
        CHECKF(qd_cuda_qgemv_multi_in_takes(qo, 3, C, &in, n) == (n < nmax),
               "linear multi: x built in the GEMV at n = %d (not at %d: over 48 KiB with the kernel's own)", n, nmax);
        ST_OK(qd_cuda_linear(blas, &in, C, n, out, 3, 0, scratch, NULL));
        ST_OK(qd_cuda_add_rmsnorm(dh, NULL, dnw, 1e-6f, n, (int)C, NULL, xm, NULL, NULL));
        ST_OK(qd_cuda_qgemv_multi(qz, 3, C, xm, C, n, 0, NULL));
        uint16_t *xb = qd_test_host(xm, (size_t)(n * C) * 2);
        for (int i = 0; i < 3 && xb; i++) {
            float *y = qd_test_host(dy[i], sizeof(float) * (size_t)(n * R[i]));
            float *z = qd_test_host(dz[i], sizeof(float) * (size_t)(n * R[i]));
            CHECKF(y && z && !memcmp(y, z, sizeof(float) * (size_t)(n * R[i])),
                   "linear multi: product %d, n = %d: not the bits of the product on the materialised x", i, n);
            free(z);
            int bad = 0;
            for (int t = 0; t < n && y; t++)
                for (int64_t r = 0; r < R[i]; r++) {
                    double ref = 0, mag = 0;
                    for (int64_t c = 0; c < C; c++) {
                        const double p = (double)wf[i][r * C + c] * (double)qd_bf16_to_f32(xb[t * C + c]);
                        ref += p;
                        mag += fabs(p);
                    }
                    const double tol = 2.0 * ((double)C / 32 + 40) * ldexp(1.0, -24) * mag + 1e-30;
                    if (!(fabs(y[t * R[i] + r] - ref) <= tol)) bad++;
                }
            CHECKF(y && bad == 0, "linear multi: product %d, n = %d: %d elements off", i, n, bad);
            if (k == 0) first[i] = y;
            else {
                CHECKF(y && first[i] && !memcmp(y, first[i], sizeof(float) * (size_t)R[i]),
                       "linear multi: product %d, token 0 of n = %d differs from n = 1", i, n);
                free(y);
            }
        }
        /* the same stack through the FP8 tensor cores in one launch: each product within
         * its bound (the bf16 one within the fp32 bound), token 0 as at n = 1 */
        ST_OK(qd_cuda_qgemv_wgmma(qz, 3, C, xm, C, n, 0, 0, 0, NULL));
        for (int i = 0; i < 3 && xb; i++) {
            float *z = qd_test_host(dz[i], sizeof(float) * (size_t)(n * R[i]));
            int bad = 0;
            for (int t = 0; t < n && z; t++)
                for (int64_t r = 0; r < R[i]; r++) {
                    double ref = 0, mag = 0;
                    float *xr = malloc(sizeof(float) * (size_t)C);
                    for (int64_t c = 0; c < C; c++) {
                        xr[c] = qd_bf16_to_f32(xb[t * C + c]);
                        const double p = (double)wf[i][r * C + c] * (double)xr[c];
                        ref += p;
                        mag += fabs(p);
                    }
                    const double tol = 2.0 * ((double)C / 32 + 40) * ldexp(1.0, -24) * mag + 1e-30 +
                                       (i != 1 ? 2.0 * wgmma_tol(wf[i] + r * C, xr, C) : 0.0);
                    free(xr);
                    if (!(fabs(z[t * R[i] + r] - ref) <= tol)) bad++;
                }
            CHECKF(z && bad == 0, "wgmma multi: product %d, n = %d: %d elements off", i, n, bad);
            if (k == 0) {
                free(wg_first[i]);
                wg_first[i] = z;
            } else {
                CHECKF(z && wg_first[i] && !memcmp(z, wg_first[i], sizeof(float) * (size_t)R[i]),
                       "wgmma multi: product %d, token 0 of n = %d differs from n = 1", i, n);
                free(z);
            }
        }
        printf("linear multi fp8 + bf16 + fp8, n=%d: checked\n", n);
        free(xb);
    }
    for (int i = 0; i < 3; i++) free(first[i]);
    for (int i = 0; i < 3; i++) free(wg_first[i]);
    /* a call mixing two quantized formats is not one launch */
    qd_cuda_qgemv_out mixed[2] = {qo[0], qo[2]};
    qd_weight w4 = dw[1];
    w4.dtype = QD_DTYPE_INT4;
    mixed[1].qw = &w4;
    CHECK(!qd_cuda_qgemv_multi_takes(mixed, 2, C, scratch, C));
    CHECK(qd_cuda_qgemv_multi(mixed, 2, C, scratch, C, 1, 0, NULL) == QD_ERR_UNSUPPORTED);
    void *dev[] = {(void *)dw[0].data, (void *)dw[0].scales.data, (void *)dw[1].data, (void *)dw[1].scales.data,
                   dbw, dh, dnw, scratch, dy[0], dy[1], dy[2], xm, dz[0], dz[1], dz[2]};
    for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++) qd_cuda_free(dev[i]);
    for (int i = 0; i < 2; i++) { free(q[i]); free(s[i]); }
    for (int i = 0; i < 3; i++) free(wf[i]);
    free(bf); free(bb); free(hf); free(nw);
}

/* Prefill sizes (n > 16) and the invariant path: the weight dequantized into the call's
 * scratch, then the bf16 product; against the double reference over the exact weights,
 * within the error of bf16 weights (2^-9 relative each) and fp32 sums. */
/* x built by the tensor-core GEMV's blocks (qd_cuda_qgemv_multi_in) for each input kind
 * (an RMSNorm of residual rows picked by `rows`, the GDN gated norm, SwiGLU) in FP8 and INT4:
 * the bits of the same products on x materialised by the elementwise kernels. */
static void test_built_inputs(void) {
    const int64_t C = 2048, R = 200, ldz = C + 64;
    const int dv = 128, nmax = 5;
    const int32_t rows_host[5] = {2, 0, 4, 1, 3};
    float *hf = qd_test_rnd(&rng, (size_t)(nmax * C), 1.0f), *nw = qd_test_rnd(&rng, (size_t)C, 0.1f);
    float *gw = qd_test_rnd(&rng, (size_t)dv, 1.0f), *zf = qd_test_rnd(&rng, (size_t)(nmax * ldz), 2.0f);
    float *guf = qd_test_rnd(&rng, (size_t)(nmax * 2 * C), 2.0f), *of = qd_test_rnd(&rng, (size_t)(nmax * C), 1.0f);
    uint16_t *ob = qd_test_round_bf16(of, (size_t)(nmax * C));
    float *dh = qd_test_dev(hf, sizeof(float) * (size_t)(nmax * C)), *dnw = qd_test_dev(nw, sizeof(float) * (size_t)C);
    float *dgw = qd_test_dev(gw, sizeof(float) * (size_t)dv), *dz = qd_test_dev(zf, sizeof(float) * (size_t)(nmax * ldz));
    float *dgu = qd_test_dev(guf, sizeof(float) * (size_t)(nmax * 2 * C));
    uint16_t *dob = qd_test_dev(ob, (size_t)(nmax * C) * 2), *xm = qd_test_dev(NULL, (size_t)(nmax * C) * 2);
    int32_t *drows = qd_test_dev(rows_host, sizeof rows_host);
    float *y1 = qd_test_dev(NULL, sizeof(float) * (size_t)(nmax * R)), *y2 = qd_test_dev(NULL, sizeof(float) * (size_t)(nmax * R));
    for (int f = 0; f < 2; f++) {
        const int fp8 = f == 0;
        const int64_t qb = fp8 ? R * C : R * C / 2, ns = fp8 ? cdiv(R, 128) * cdiv(C, 128) : R * (C / 128);
        uint8_t *q = malloc((size_t)qb);
        for (int64_t e = 0; e < qb; e++) q[e] = (uint8_t)(rnd_byte() & (fp8 ? 0xf7 : 0xff));
        float *sc = qd_test_rnd(&rng, (size_t)ns, 0.05f);
        qd_weight w = {.dtype = fp8 ? QD_DTYPE_F8_E4M3 : QD_DTYPE_INT4, .rows = R, .cols = C};
        w.data = qd_test_dev(q, (size_t)qb);
        w.scales = (qd_weight_scales){.dtype = QD_DTYPE_F32, .block_rows = fp8 ? 128 : 1, .block_cols = 128,
                                      .global = 1.0f};
        w.scales.data = qd_test_dev(sc, sizeof(float) * (size_t)ns);
        const qd_cuda_qgemv_out o1 = {.qw = &w, .rows = R, .y = y1, .ldy = R}, o2 = {.qw = &w, .rows = R, .y = y2, .ldy = R};
        static const char *kn[4] = {"", "rmsnorm", "gated", "silu"};
        for (int kind = QD_LIN_RMSNORM; kind <= QD_LIN_SILU; kind++)
            for (int n = 1; n <= nmax; n += 2) {
                qd_cuda_lin_in in = {.kind = kind, .h = dh, .rows = drows, .w = kind == QD_LIN_GATED ? dgw : dnw,
                                     .eps = 1e-6f, .o = dob, .z = dz, .ldz = ldz, .dv = dv, .gu = dgu};
                CHECKF(qd_cuda_qgemv_multi_in_takes(&o1, 1, C, &in, n), "built %s %s n=%d: not taken",
                       fp8 ? "fp8" : "int4", kn[kind], n);
                ST_OK(qd_cuda_qgemv_multi_in(&o1, 1, C, &in, n, 0, NULL));
                if (kind == QD_LIN_RMSNORM) ST_OK(qd_cuda_add_rmsnorm(dh, NULL, dnw, 1e-6f, n, (int)C, drows, xm, NULL, NULL));
                else if (kind == QD_LIN_GATED) ST_OK(qd_cuda_gated_rmsnorm(dob, dz, ldz, dgw, 1e-6f, n, (int)(C / dv), dv, xm, NULL));
                else ST_OK(qd_cuda_silu_mul(dgu, n, (int)C, xm, NULL));
                ST_OK(qd_cuda_qgemv_multi(&o2, 1, C, xm, C, n, 0, NULL));
                float *a = qd_test_host(y1, sizeof(float) * (size_t)(n * R)), *b = qd_test_host(y2, sizeof(float) * (size_t)(n * R));
                int nonzero = 0;
                for (int64_t e = 0; a && e < n * R; e++) nonzero += a[e] != 0.0f;
                CHECKF(a && b && nonzero > 0 && !memcmp(a, b, sizeof(float) * (size_t)(n * R)),
                       "built %s %s n=%d: differs from the product on the materialised x", fp8 ? "fp8" : "int4",
                       kn[kind], n);
                free(a);
                free(b);
            }
        printf("x built in the tensor-core GEMV (%s): rmsnorm, gated, silu == materialised, n = 1, 3, 5\n",
               fp8 ? "fp8" : "int4");
        qd_cuda_free((void *)w.data);
        qd_cuda_free((void *)w.scales.data);
        free(q);
        free(sc);
    }
    void *dev[] = {dh, dnw, dgw, dz, dgu, dob, xm, drows, y1, y2};
    for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++) qd_cuda_free(dev[i]);
    free(hf); free(nw); free(gw); free(zf); free(guf); free(of); free(ob);
}

static void test_linear_prefill(qd_cuda_blas *blas) {
    const int64_t C = 384, R = 200;
    const int n = 40;
    uint8_t *q = malloc((size_t)(R * C));
    for (int64_t i = 0; i < R * C; i++) q[i] = (uint8_t)(rnd_byte() & 0xbf);
    const int64_t ns = cdiv(R, 128) * cdiv(C, 128);
    float *sc = qd_test_rnd(&rng, (size_t)ns, 0.05f);
    for (int64_t i = 0; i < ns; i++) sc[i] = fabsf(sc[i]) + 0.01f;
    qd_weight w = {.dtype = QD_DTYPE_F8_E4M3, .rows = R, .cols = C, .data = q};
    w.scales = (qd_weight_scales){.dtype = QD_DTYPE_F32, .data = sc, .block_rows = 128, .block_cols = 128, .global = 1};
    float *wf = malloc(sizeof(float) * (size_t)(R * C));
    qd_weight_dequant_rows(&w, 0, R, wf);
    qd_weight dw = w;
    dw.data = qd_test_dev(q, (size_t)(R * C));
    dw.scales.data = qd_test_dev(sc, sizeof(float) * (size_t)ns);
    float *xf = qd_test_rnd(&rng, (size_t)(n * C), 1.0f);
    uint16_t *xb = qd_test_round_bf16(xf, (size_t)(n * C));
    uint16_t *dx = qd_test_dev(xb, (size_t)(n * C) * 2), *dq = qd_test_dev(NULL, (size_t)(R * C) * 2);
    float *dy = qd_test_dev(NULL, sizeof(float) * (size_t)(n * R));
    for (int path = 0; path < 2; path++) {
        const qd_cuda_lin_in in = {.kind = QD_LIN_BF16, .x = dx, .ldx = C};
        const qd_cuda_lin_out out = {.rows = R, .y = dy, .ldy = R, .qw = &dw, .dequant = dq};
        const int pn = path ? 5 : n; /* the invariant path dequantizes at every n */
        ST_OK(qd_cuda_linear_path(path ? QD_LIN_PATH_INVARIANT : QD_LIN_PATH_TABLE, blas, &in, C, pn, &out, 1, 0,
                                  NULL, NULL));
        float *y = qd_test_host(dy, sizeof(float) * (size_t)(pn * R));
        int bad = 0;
        for (int t = 0; t < pn && y; t++)
            for (int64_t r = 0; r < R; r++) {
                double mag;
                const double ref = ref_dot(wf + r * C, xf + t * C, C, &mag);
                if (!(fabs(y[t * R + r] - ref) <= ldexp(1.0, -8) * mag + 1e-30)) bad++;
            }
        CHECKF(y && bad == 0, "linear %s, fp8 weight dequantized: %d of %lld elements off",
               path ? "invariant" : "prefill", bad, (long long)(pn * R));
        printf("linear %-9s fp8 %lld x %lld n=%d dequantized into scratch: %s\n", path ? "invariant" : "prefill",
               (long long)R, (long long)C, pn, bad ? "FAIL" : "ok");
        free(y);
    }
    void *dev[] = {(void *)dw.data, (void *)dw.scales.data, dx, dq, dy};
    for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++) qd_cuda_free(dev[i]);
    free(q); free(sc); free(wf); free(xf); free(xb);
}

int main(void) {
    if (qd_cuda_device_count() == 0) return qd_test_skip("test_cuda_quant", "no CUDA device");
    rng = qd_test_rng_from_env();
    static const qcase cases[] = {
        {"fp8 block128", QD_DTYPE_F8_E4M3, 300, 520, 128, 128, QD_DTYPE_F32, 0, 0, 1, 0, 0},
        {"fp8 block128", QD_DTYPE_F8_E4M3, 300, 520, 128, 128, QD_DTYPE_F32, 0, 0, 3, 1, 0},
        {"fp8 block128", QD_DTYPE_F8_E4M3, 129, 2048, 128, 128, QD_DTYPE_F32, 0, 0, 16, 0, 0},
        {"fp8 block128 bf16 scales", QD_DTYPE_F8_E4M3, 77, 333, 128, 128, QD_DTYPE_BF16, 0, 0, 5, 1, 0},
        {"fp8 per-channel", QD_DTYPE_F8_E4M3, 257, 1000, 1, 1000, QD_DTYPE_F32, 0, 0, 8, 0, 0},
        {"fp8 per-channel", QD_DTYPE_F8_E4M3, 1, 7, 1, 7, QD_DTYPE_F32, 0, 0, 2, 0, 0},
        {"nvfp4", QD_DTYPE_NVFP4, 129, 2064, 1, 16, QD_DTYPE_F8_E4M3, 0, 0, 1, 0, 0},
        {"nvfp4", QD_DTYPE_NVFP4, 70, 48, 1, 16, QD_DTYPE_F8_E4M3, 0, 0, 11, 1, 0},
        {"int4 g32 zeros", QD_DTYPE_INT4, 100, 200, 1, 32, QD_DTYPE_F32, 1, 0, 4, 0, 0},
        {"int4 g64 sym", QD_DTYPE_INT4, 65, 640, 1, 64, QD_DTYPE_F32, 0, 0, 7, 1, 0},
        {"int4 g128 zeros", QD_DTYPE_INT4, 513, 4096, 1, 128, QD_DTYPE_F32, 1, 0, 16, 0, 0},
        {"int4 one group", QD_DTYPE_INT4, 33, 1002, 1, -1, QD_DTYPE_F32, 1, 0, 1, 0, 0},
        {"int4 g64 act-order zeros", QD_DTYPE_INT4, 90, 384, 1, 64, QD_DTYPE_F32, 1, 1, 6, 0, 0},
        {"int4 g128 act-order sym", QD_DTYPE_INT4, 40, 300, 1, 128, QD_DTYPE_F16, 0, 1, 9, 1, 0},
        /* the vectorised layouts */
        {"fp8 block128 (vec)", QD_DTYPE_F8_E4M3, 300, 528, 128, 128, QD_DTYPE_F32, 0, 0, 2, 1, 0},
        {"fp8 per-channel (vec)", QD_DTYPE_F8_E4M3, 257, 1024, 1, 1024, QD_DTYPE_F32, 0, 0, 1, 0, 0},
        {"fp8 block128 (vec)", QD_DTYPE_F8_E4M3, 1000, 4096, 128, 128, QD_DTYPE_F32, 0, 0, 13, 0, 0},
        {"nvfp4 (vec)", QD_DTYPE_NVFP4, 129, 2048, 1, 16, QD_DTYPE_F8_E4M3, 0, 0, 1, 0, 0},
        {"nvfp4 (vec)", QD_DTYPE_NVFP4, 70, 96, 1, 16, QD_DTYPE_F8_E4M3, 0, 0, 11, 1, 0},
        {"int4 g32 zeros (vec)", QD_DTYPE_INT4, 100, 256, 1, 32, QD_DTYPE_F32, 1, 0, 4, 0, 0},
        {"int4 g128 sym (vec)", QD_DTYPE_INT4, 77, 2080, 1, 128, QD_DTYPE_F32, 0, 0, 16, 1, 0},
        {"int4 one group (vec)", QD_DTYPE_INT4, 33, 1024, 1, -1, QD_DTYPE_F32, 1, 0, 3, 0, 0},
        /* the tensor-core layouts: FP8 scale blocks of 2^k x 64 columns or one per row, INT4 groups
         * of 2^k x 128 or one; partial units and 16-row tiles at the edges, both token tiles */
        {"fp8 block128 (mma)", QD_DTYPE_F8_E4M3, 1001, 2064, 128, 128, QD_DTYPE_F32, 0, 0, 1, 0, 0},
        {"fp8 block128 (mma)", QD_DTYPE_F8_E4M3, 37, 4112, 128, 128, QD_DTYPE_F32, 0, 0, 7, 1, 0},
        {"fp8 block128 (mma)", QD_DTYPE_F8_E4M3, 130, 17408, 128, 128, QD_DTYPE_F32, 0, 0, 16, 0, 0},
        {"fp8 block 16x64 (mma)", QD_DTYPE_F8_E4M3, 95, 1216, 16, 64, QD_DTYPE_F32, 0, 0, 9, 1, 0},
        {"fp8 block 128x192 (vec)", QD_DTYPE_F8_E4M3, 200, 1152, 128, 192, QD_DTYPE_F32, 0, 0, 6, 0, 0},
        {"fp8 per-channel (mma)", QD_DTYPE_F8_E4M3, 259, 1040, 1, 1040, QD_DTYPE_F32, 0, 0, 4, 0, 0},
        /* the FP8 tensor cores: 64-row tiles and 128-column blocks partial at the edges, 1 and
         * 2 column groups of B, scale blocks of 256 columns */
        {"fp8 block128 (wgmma)", QD_DTYPE_F8_E4M3, 4100, 2048, 128, 128, QD_DTYPE_F32, 0, 0, 5, 0, 0},
        {"fp8 block 128x256 (wgmma)", QD_DTYPE_F8_E4M3, 200, 1504, 128, 256, QD_DTYPE_F32, 0, 0, 8, 1, 0},
        {"fp8 block128 (wgmma)", QD_DTYPE_F8_E4M3, 65, 272, 128, 128, QD_DTYPE_F32, 0, 0, 3, 0, 0},
        {"int4 g128 zeros (mma)", QD_DTYPE_INT4, 515, 2080, 1, 128, QD_DTYPE_F32, 1, 0, 1, 0, 0},
        {"int4 g256 sym (mma)", QD_DTYPE_INT4, 17, 4096, 1, 256, QD_DTYPE_F32, 0, 0, 12, 1, 0},
        {"int4 one group (mma)", QD_DTYPE_INT4, 64, 1056, 1, -1, QD_DTYPE_F32, 1, 0, 5, 0, 0},
        /* NVFP4: whole 32-column pieces, a partial unit (2080 = 16 x 128 + 32), both token tiles */
        {"nvfp4 (mma)", QD_DTYPE_NVFP4, 1001, 2080, 1, 16, QD_DTYPE_F8_E4M3, 0, 0, 16, 0, 0},
        {"nvfp4 (mma)", QD_DTYPE_NVFP4, 37, 4096, 1, 16, QD_DTYPE_F8_E4M3, 0, 0, 5, 1, 0},
        /* x at an odd stride */
        {"fp8 block128 odd ldx", QD_DTYPE_F8_E4M3, 300, 528, 128, 128, QD_DTYPE_F32, 0, 0, 2, 1, 1},
        {"int4 g128 odd ldx", QD_DTYPE_INT4, 77, 2080, 1, 128, QD_DTYPE_F32, 0, 0, 3, 0, 1},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) run_case(&cases[i]);
    test_refusals();
    qd_cuda_blas *blas = NULL;
    CHECK(qd_cuda_blas_create(&blas, NULL) == QD_OK);
    if (blas) test_linear_table(blas);
    if (blas) test_linear_prefill(blas);
    test_built_inputs();
    if (blas) test_linear_multi(blas);
    qd_cuda_blas_destroy(blas);
    return qd_test_finish("test_cuda_quant");
}

#else

int main(void) { return qd_test_skip("test_cuda_quant", "built without CUDA"); }

#endif
