/* Quantized experts on the CUDA backend (cuda_quant.h: qd_cuda_qmats; moe_decode.cu,
 * moe.cu, moe_block.cu) against a double reference over the exactly dequantized weights
 * (qd_weight_dequant_rows, base/weight.c), on fresh random inputs (seed printed;
 * QD_TEST_SEED replays it). Formats: FP8 block 128 x 128 (intermediate sizes that leave a
 * partial block row), 128 x 192, 96 x 48 and per-channel, INT4 with group 32, 64, 96 or 128
 * and zeros (a partial last group) and symmetric one-group, NVFP4 with per-matrix global
 * factors. Random stored codes and scales.
 *
 *  - qd_cuda_moe_experts at n = 1, 5, 16, 24, 48 (the decode kernels reading the quantized
 *    bytes; FP8 in 128 x 128 blocks at 24 and 48: W8A8, INT4 and NVFP4 at 48: W4A16, the path each n
 *    takes being the library's answer, qd_cuda_moe_decode_path), at prefill sizes, n = 70 and
 *    256 or 300, and with k = E (every expert in every token's list) at 300 and 600, experts
 *    of several 128-row WA16 tiles and a partial last one: the WA16 kernels (W4A16, W8A16)
 *    bit for bit equal to the dequantized path (or refusing the call with a status outside
 *    their layouts, and on codes not 16-byte aligned whichever path the size takes), the
 *    table's pick and batch-invariant mode too, the whole batch and its
 *    last token alone;
 *    FP8 in 128 x 128 blocks past the decode kernels also through the W8A8 kernels against
 *    a reference that quantizes the activations as they do, the table's pick equal to
 *    W8A8's or the dequantized path's result; y accumulated onto a nonzero start, every
 *    element checked; decode results bit-identical run to run and per token whatever else
 *    is in the batch;
 *  - the dequantization kernel: bf16 of the reference's fp32 values, bit for bit;
 *  - qd_cuda_moe_block with a quantized shared expert: the routing it chose (read back:
 *    the router is tested in test_cuda_moe) applied in the reference, h += routed +
 *    sigmoid(gate) * shared.
 * Tolerances: decode as the bf16 decode path's (fp32 sums of exact products of the same
 * floats); prefill as the bf16 prefill path's (bf16 weights and activations). Skips (77)
 * without a GPU. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "qd_test.h"
#ifdef QD_HAVE_CUDA
#include "backend/cpu/cpu_backend.h"
#include "backend/cuda/cuda_device.h"
#include "backend/cuda/cuda_moe.h"
#include "backend/cuda/cuda_quant.h"
#include "base/weight.h"
#include "qd_test_cuda.h"
#include "qd_test_fp8.h"

static qd_test_rng rng;

static int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }
static uint8_t rbyte(void) { return (uint8_t)(qd_test_next(&rng) >> 56); }
static float runit(void) { return 0.5f + 0.25f * (qd_test_uniform(&rng) + 1.0f); } /* [0.5, 1) */

/* n matrices [rows][cols] in one format, on the host (for the reference, dequantized into
 * deq [n][rows][cols]) and on the device (d): FP8 in blocks of br0 (0: 128) rows and bc
 * columns, INT4 in groups of bc columns, NVFP4 in its 16-column blocks. */
typedef struct qm {
    qd_cuda_qmats d;
    float *deq;
    void *dev[4];
} qm;

static int make_qm(qd_dtype fmt, int n, int64_t rows, int64_t cols, int64_t bc, int64_t br0, int zeros, float mag,
                   qm *out) {
    memset(out, 0, sizeof *out);
    const int fp4 = fmt == QD_DTYPE_NVFP4, f8 = fmt == QD_DTYPE_F8_E4M3;
    /* FP8: blocks of br0 rows (0: 128); bc = cols: one block a row (per-channel with br0 1) */
    const int64_t br = f8 ? (br0 ? br0 : 128) : 1, bcol = fp4 ? 16 : bc, nbc = cdiv(cols, bcol), sr = cdiv(rows, br);
    const int64_t row_bytes = f8 ? cols : cols / 2, sn = sr * nbc;
    const size_t db = (size_t)(n * rows * row_bytes), ss = fp4 ? 1 : 4;
    uint8_t *q = malloc(db), *z = zeros ? malloc((size_t)(n * sn)) : NULL;
    unsigned char *s = malloc((size_t)(n * sn) * ss);
    float *glob = fp4 ? malloc(sizeof(float) * (size_t)n) : NULL;
    out->deq = malloc(sizeof(float) * (size_t)(n * rows * cols));
    if (!q || !s || (zeros && !z) || (fp4 && !glob) || !out->deq) return 0;
    for (size_t i = 0; i < db; i++) q[i] = f8 ? (uint8_t)(rbyte() & 0xbf) : rbyte(); /* e4m3 within +-1.875 */
    for (int64_t i = 0; i < n * sn; i++) {
        if (fp4) s[i] = (uint8_t)(0x30 + rbyte() % 8); /* e4m3 0.5 .. 0.9375 */
        else {
            const float v = mag / (f8 ? 1.875f : 7.0f) * runit();
            memcpy(s + i * 4, &v, 4);
        }
        if (z) z[i] = (uint8_t)(rbyte() % 16);
    }
    for (int m = 0; fp4 && m < n; m++) glob[m] = mag / 6.0f / 0.7f * runit();
    for (int m = 0; m < n; m++) {
        qd_weight w = {.dtype = fmt, .rows = rows, .cols = cols, .data = q + (size_t)(m * rows * row_bytes)};
        w.scales = (qd_weight_scales){.dtype = fp4 ? QD_DTYPE_F8_E4M3 : QD_DTYPE_F32, .data = s + (size_t)(m * sn) * ss,
                                      .block_rows = br, .block_cols = bcol, .global = fp4 ? glob[m] : 1.0f,
                                      .zeros = z ? z + m * sn : NULL};
        qd_weight_dequant_rows(&w, 0, rows, out->deq + (size_t)(m * rows * cols));
    }
    out->d = (qd_cuda_qmats){.dtype = fmt, .n_mats = n, .rows = rows, .cols = cols, .row_bytes = row_bytes,
                             .block_rows = br, .block_cols = bcol, .global = 1.0f};
    qd_cuda_qmats_layout(&out->d);
    out->d.data = out->dev[0] = qd_test_dev(q, db);
    out->d.scales = out->dev[1] = qd_test_dev(s, (size_t)(n * sn) * ss);
    if (z) out->d.zeros = out->dev[2] = qd_test_dev(z, (size_t)(n * sn));
    if (glob) out->d.globals = out->dev[3] = qd_test_dev(glob, sizeof(float) * (size_t)n);
    free(q); free(s); free(z); free(glob);
    return out->d.data && out->d.scales;
}

static void free_qm(qm *m) {
    for (int i = 0; i < 4; i++) qd_cuda_free(m->dev[i]);
    free(m->deq);
}

/* The dequantization kernel: bf16 of the reference's values, bit for bit. */
static void check_dequant(const char *name, const qm *m) {
    const size_t n = (size_t)(m->d.n_mats * m->d.rows * m->d.cols);
    uint16_t *d = qd_test_dev(NULL, n * 2);
    ST_OK(qd_cuda_qmats_dequant_bf16(&m->d, d, NULL));
    uint16_t *h = qd_test_host(d, n * 2);
    size_t bad = 0;
    for (size_t i = 0; h && i < n; i++) bad += h[i] != qd_f32_to_bf16(m->deq[i]);
    CHECKF(h && bad == 0, "%s: dequantized bf16 differs from the reference at %zu of %zu", name, bad, n);
    free(h);
    qd_cuda_free(d);
}

/* The W8A8 room of one activation row (token_ref_f): a (double), af its bf16 rounding and aq
 * that quantized (1 x 128 blocks); for each activation within win[i] of the midpoint between
 * af[i] and its other bf16 neighbour, move[t] += |the change of aq[t]| with that neighbour
 * instead. Where the activation neither is its block's largest nor becomes larger than it,
 * the block's scale stays and only its own value can move (qd_test_quant_row's arithmetic
 * on that one value); else the whole block is quantized again. af2, aq2: scratch of I.
 * Returns the number of such activations. */
static int tie_moves(const double *a, const double *win, const float *af, const float *aq, int I, double *move,
                     float *af2, float *aq2) {
    int at_tie = 0;
    for (int b0 = 0; b0 < I; b0 += 128) {
        const int b1 = b0 + 128 < I ? b0 + 128 : I;
        float amax = 0;
        for (int t = b0; t < b1; t++) amax = fmaxf(amax, fabsf(af[t]));
        const float sb = amax > 0 ? amax / 448.0f : 1.0f;
        for (int i = b0; i < b1; i++) {
            /* the bf16 neighbour on a's other side, where a lies within win of their midpoint */
            const uint16_t b = qd_f32_to_bf16((float)a[i]);
            const int up = ((double)af[i] < a[i]) == (af[i] >= 0);
            const uint16_t o = up ? (uint16_t)(b + 1) : (uint16_t)(b - 1);
            const float other = qd_bf16_to_f32(o);
            const double mid = 0.5 * ((double)af[i] + other);
            if (!isfinite(mid) || !(fabs(a[i] - mid) <= win[i])) continue;
            at_tie++;
            if (fabsf(af[i]) < amax && fabsf(other) <= amax) {
                move[i] += fabs((double)(qd_f8e4m3_to_f32(qd_test_e4m3(other / sb)) * sb) - aq[i]);
                continue;
            }
            memcpy(af2 + b0, af + b0, sizeof(float) * (size_t)(b1 - b0));
            af2[i] = other;
            qd_test_quant_row(af2 + b0, b1 - b0, 128, NULL, NULL, aq2 + b0);
            for (int t = b0; t < b1; t++) move[t] += fabs((double)aq2[t] - aq[t]);
        }
    }
    return at_tie;
}

/* One token's experts in double: c[h] = sum_j w_j down_e(silu(gate_e x) * up_e x), x given as
 * floats. w8a8: what the FP8 W8A8 prefill multiplies (moe_prefill_fp8.cu): x already through
 * its 1 x 128 quantization (the caller's), and the activation rounded to bf16 and quantized
 * likewise before down.
 * mag (not NULL): the room element h has beyond the shared bound.
 *  - Without w8a8: sum_j w_j sum_i |down_e[h][i] act_i|, the scale of the error that rounding
 *    the activation to bf16 puts into element h (the caller scales it).
 *  - With w8a8: what the activations at a bf16 rounding tie can move it by. The kernel's fp32
 *    activation may round to the other bf16 neighbour; e4m3 then moves by a step where a
 *    quantization boundary lies between the two, and the whole 128-block requantizes where
 *    that activation is its block's largest. For each such activation the block is quantized
 *    both ways, and mag[h] = sum_j w_j sum_i |down_e[h][i]| |the moves of act_i|.
 * Returns the number of such activations (0 without w8a8). */
static int token_ref_f(const qm *gu, const qm *dn, int H, int I, const float *xf, const int32_t *sel, const float *wt,
                       int k, int w8a8, double *c, double *mag) {
    double *a = malloc(sizeof(double) * (size_t)I), *win = malloc(sizeof(double) * (size_t)I);
    double *move = malloc(sizeof(double) * (size_t)I);
    float *af = malloc(sizeof(float) * (size_t)I), *aq = malloc(sizeof(float) * (size_t)I);
    float *af2 = malloc(sizeof(float) * (size_t)I), *aq2 = malloc(sizeof(float) * (size_t)I);
    int at_tie = 0;
    for (int h = 0; h < H; h++) c[h] = 0;
    if (mag)
        for (int h = 0; h < H; h++) mag[h] = 0;
    for (int j = 0; j < k && a && win && move && af && aq && af2 && aq2; j++) {
        const int e = sel[j];
        const float *g = gu->deq + (size_t)(2 * e) * I * H, *u = g + (size_t)I * H, *d = dn->deq + (size_t)e * H * I;
        const int ties = w8a8 && mag; /* the room at bf16 ties is asked for */
        for (int i = 0; i < I; i++) {
            double sg = 0, su = 0, mg = 0, mu = 0;
            for (int h = 0; h < H; h++) {
                sg += (double)g[(size_t)i * H + h] * xf[h];
                su += (double)u[(size_t)i * H + h] * xf[h];
            }
            for (int h = 0; ties && h < H; h++) {
                mg += fabs((double)g[(size_t)i * H + h] * xf[h]);
                mu += fabs((double)u[(size_t)i * H + h] * xf[h]);
            }
            const double silu = sg / (1.0 + exp(-sg));
            a[i] = silu * su;
            /* how far the kernel's activation may lie from a before its bf16 rounding: its sums'
             * error, relative to their sums of |products| (the FP8 tensor cores keep about 14
             * bits while they sum a 128-block, so 2^-13 and more), through silu' (below 1.1),
             * and its fast exp */
            win[i] = 1.5e-4 * (fabs(a[i]) + 1.1 * mg * fabs(su) + fabs(silu) * mu);
        }
        for (int i = 0; i < I; i++) move[i] = 0;
        if (w8a8) {
            for (int i = 0; i < I; i++) af[i] = qd_bf16_to_f32(qd_f32_to_bf16((float)a[i]));
            qd_test_quant_row(af, I, 128, NULL, NULL, aq);
            if (ties) at_tie += tie_moves(a, win, af, aq, I, move, af2, aq2);
            for (int i = 0; i < I; i++) a[i] = aq[i];
        }
        for (int h = 0; h < H; h++) {
            double o = 0, m = 0;
            for (int i = 0; i < I; i++) {
                o += (double)d[(size_t)h * I + i] * a[i];
                m += fabs((double)d[(size_t)h * I + i]) * (w8a8 ? move[i] : fabs(a[i]));
            }
            c[h] += (double)wt[j] * o;
            if (mag) mag[h] += (double)wt[j] * m;
        }
    }
    free(a);
    free(win);
    free(move);
    free(af);
    free(aq);
    free(af2);
    free(aq2);
    return at_tie;
}

static void token_ref(const qm *gu, const qm *dn, int H, int I, const uint16_t *x, const int32_t *sel,
                      const float *wt, int k, double *c, double *mag) {
    float *xf = malloc(sizeof(float) * (size_t)H);
    if (!xf) return;
    for (int h = 0; h < H; h++) xf[h] = qd_bf16_to_f32(x[h]);
    token_ref_f(gu, dn, H, I, xf, sel, wt, k, 0, c, mag);
    free(xf);
}

/* Every element within atol * rms(contribution) + rtol * |ref| (+ mtol * mag where mag is given:
 * a bound that follows each element's own products), relative L2 within l2. */
static void compare_mag(const char *what, const float *got, const double *ref, const double *contrib,
                        const double *mag, double mtol, size_t n, double atol, double rtol, double l2tol) {
    double ss = 0, se = 0;
    for (size_t i = 0; i < n; i++) ss += contrib[i] * contrib[i];
    const double rms = sqrt(ss / (double)n);
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) {
        const double e = fabs((double)got[i] - ref[i]);
        if (!isfinite(got[i]) || !(e <= atol * rms + rtol * fabs(ref[i]) + (mag ? mtol * mag[i] : 0.0))) bad++;
        if (isfinite(got[i])) se += e * e;
    }
    const double l2 = ss > 0 ? sqrt(se / ss) : sqrt(se);
    printf("  %-40s rms=%.3e rel_l2=%.2e bad=%zu\n", what, rms, l2, bad);
    CHECKF(bad == 0 && l2 <= l2tol, "%s: %zu elements off, relative L2 %.2e", what, bad, l2);
}
static void compare(const char *what, const float *got, const double *ref, const double *contrib, size_t n,
                    double atol, double rtol, double l2tol) {
    compare_mag(what, got, ref, contrib, NULL, 0, n, atol, rtol, l2tol);
}
/* The prefill paths round the activation, and the dequantized path the weights too, to bf16
 * (unit roundoff 2^-8 each): an element may then be off by up to 2^-7 of its own sum of
 * |products|, beyond the shared bound (session 24 saw one element of int4 n = 70 cross the
 * shared bound alone). */
#define QD_BF16_ACT_MTOL (1.0 / 128)

typedef struct fcase {
    const char *name;
    qd_dtype fmt;
    int H, I, E, k;
    int64_t bc_gu, bc_dn; /* group columns (INT4) or block columns (FP8) of gate/up and down */
    int zeros;
    int max_n; /* largest batch tried: the big shapes stop short of the CPU-costly prefill size */
    int only_n; /* nonzero: this batch size alone (and no fused block) */
    int wa;     /* the WA16 prefill kernels (W4A16, W8A16) take these experts */
    int64_t br; /* FP8: block rows (0: 128) */
} fcase;

/* Runs qd_cuda_moe_experts over tokens [t0, t0 + n) into y (host) with the prefill kernel
 * `kernel` (0: the table's) and batch-invariant mode inv; returns its status (y untouched on
 * an error). The dequantization scratch is given only where the call may use it, as a
 * context sizes it (qd_cuda_moe_dequant_needed), or to the forced dequantized path: a path
 * that reached for it otherwise fails. */
static qd_status run_st(const fcase *c, const qm *gu, const qm *dn, const uint16_t *x, const int32_t *sel,
                        const float *wt, const float *y0, int t0, int n, float *y, int kernel, int inv) {
    const int H = c->H, k = c->k;
    const size_t wb = qd_cuda_moe_work_bytes(n, H, c->I, c->E, k);
    uint16_t *dx = qd_test_dev(x + (size_t)t0 * H, (size_t)n * H * 2);
    int32_t *ds = qd_test_dev(sel + (size_t)t0 * k, (size_t)n * k * 4);
    float *dw = qd_test_dev(wt + (size_t)t0 * k, (size_t)n * k * 4);
    float *dy = qd_test_dev(y0 + (size_t)t0 * H, (size_t)n * H * 4);
    void *work = qd_test_dev(NULL, wb);
    ST_OK(qd_cuda_memset(work, 0xff, wb));
    qd_cuda_moe_args a = {.n = n, .H = H, .I = c->I, .E = c->E, .k = k, .d_x = dx, .d_sel = ds, .d_w = dw, .d_y = dy,
                          .d_work = work, .invariant = inv, .q_gate_up = &gu->d, .q_down = &dn->d,
                          .prefill_kernel = kernel};
    uint16_t *dq = NULL;
    if (kernel == QD_MOE_PREFILL_DEQUANT || (kernel != QD_MOE_PREFILL_WA16 && qd_cuda_moe_dequant_needed(&a)))
        a.d_dequant = dq = qd_test_dev(NULL, qd_cuda_moe_dequant_bytes(H, c->I, c->E));
    qd_status st = qd_cuda_moe_experts(&a, NULL);
    if (!st) {
        ST_OK(qd_cuda_sync());
        ST_OK(qd_cuda_memcpy_d2h(y, dy, (size_t)n * H * 4));
    }
    qd_cuda_free(dx); qd_cuda_free(ds); qd_cuda_free(dw); qd_cuda_free(dy); qd_cuda_free(work); qd_cuda_free(dq);
    return st;
}

static void run_kernel(const fcase *c, const qm *gu, const qm *dn, const uint16_t *x, const int32_t *sel,
                       const float *wt, const float *y0, int t0, int n, float *y, int kernel) {
    ST_OK(run_st(c, gu, dn, x, sel, wt, y0, t0, n, y, kernel, 0));
}

/* Runs qd_cuda_moe_experts over tokens [t0, t0 + n) into y (host), the table's kernels. */
static void run(const fcase *c, const qm *gu, const qm *dn, const uint16_t *x, const int32_t *sel, const float *wt,
                const float *y0, int t0, int n, float *y) {
    run_kernel(c, gu, dn, x, sel, wt, y0, t0, n, y, 0);
}

/* FP8 experts of a prefill-sized batch: the W8A8 kernels (forced) against the reference that
 * quantizes the activations as they do (the differences left: fp32 sums, and an activation
 * whose bf16 rounding differs moving its block's quantization) and, loosely, against the
 * W8A16 reference (the quantization error of e4m3 activations, a few percent); the
 * dequantized path (forced) as the bf16 prefill path; the table's pick is one of the two,
 * bit for bit. */
static void w8a8_case(const fcase *c, const qm *gu, const qm *dn, int n, const uint16_t *x, const int32_t *sel,
                      const float *wt, const float *y0, const double *ref16, const double *con16,
                      const double *mag16) {
    const int H = c->H, k = c->k;
    const size_t ny = (size_t)n * H;
    double *ref = malloc(ny * 8), *con = malloc(ny * 8), *tie = malloc(ny * 8);
    float *xf = malloc((size_t)H * 4), *xq = malloc((size_t)H * 4);
    float *y8 = malloc(ny * 4), *yd = malloc(ny * 4), *yt = malloc(ny * 4);
    long at_tie = 0; /* activations */
    if (!ref || !con || !tie || !xf || !xq || !y8 || !yd || !yt) {
        CHECK(0);
        goto out;
    }
    for (int t = 0; t < n; t++) {
        for (int h = 0; h < H; h++) xf[h] = qd_bf16_to_f32(x[(size_t)t * H + h]);
        qd_test_quant_row(xf, H, 128, NULL, NULL, xq);
        at_tie += token_ref_f(gu, dn, H, c->I, xq, sel + t * k, wt + t * k, k, 1, con + (size_t)t * H,
                              tie + (size_t)t * H);
        for (int h = 0; h < H; h++) ref[(size_t)t * H + h] = y0[(size_t)t * H + h] + con[(size_t)t * H + h];
    }
    char what[96];
    run_kernel(c, gu, dn, x, sel, wt, y0, 0, n, y8, QD_MOE_PREFILL_W8A8);
    snprintf(what, sizeof what, "%s n=%d (W8A8, %ld at a tie)", c->name, n, at_tie);
    compare_mag(what, y8, ref, con, tie, 1.0, ny, 1e-1, 1e-3, 1e-2);
    snprintf(what, sizeof what, "%s n=%d (W8A8 vs W8A16)", c->name, n);
    compare(what, y8, ref16, con16, ny, 1.0, 1e-1, 8e-2);
    run_kernel(c, gu, dn, x, sel, wt, y0, 0, n, yd, QD_MOE_PREFILL_DEQUANT);
    snprintf(what, sizeof what, "%s n=%d (dequantized)", c->name, n);
    compare_mag(what, yd, ref16, con16, mag16, QD_BF16_ACT_MTOL, ny, 3e-2, 1e-3, 5e-3);
    run(c, gu, dn, x, sel, wt, y0, 0, n, yt);
    CHECKF(!memcmp(yt, y8, ny * 4) || !memcmp(yt, yd, ny * 4), "%s n=%d: the table's result is neither path's",
           c->name, n);
out:
    free(ref); free(con); free(tie); free(xf); free(xq); free(y8); free(yd); free(yt);
}

/* Quantized experts of a prefill-sized batch: the dequantized path (forced) against the bf16
 * prefill reference, and where the WA16 kernels take the experts (c->wa: W4A16 for INT4 and
 * NVFP4, W8A16 for FP8), those kernels (forced, without the dequantization scratch) bit for
 * bit equal to it: the same bf16 weights in the same sums. Elsewhere, and on a view of the
 * same experts whose codes are not 16-byte aligned, forcing them fails with a status. The
 * table's pick (unless it is W8A8: table_w8a8, checked by w8a8_case), and batch-invariant
 * mode on the whole batch and on its last token alone, give those bits too (every kernel
 * either path runs gives the same bits at every n). */
static void wa_case(const fcase *c, const qm *gu, const qm *dn, int n, const uint16_t *x, const int32_t *sel,
                    const float *wt, const float *y0, const double *ref, const double *con, const double *mag,
                    int table_w8a8) {
    const int H = c->H;
    const size_t ny = (size_t)n * H;
    float *yd = malloc(ny * 4), *yw = malloc(ny * 4), *yt = malloc(ny * 4);
    char what[96];
    if (!yd || !yw || !yt) {
        CHECK(0);
        goto out;
    }
    run_kernel(c, gu, dn, x, sel, wt, y0, 0, n, yd, QD_MOE_PREFILL_DEQUANT);
    snprintf(what, sizeof what, "%s n=%d (dequantized)", c->name, n);
    compare_mag(what, yd, ref, con, mag, QD_BF16_ACT_MTOL, ny, 3e-2, 1e-3, 5e-3);
    for (int inv = 0; inv < 2; inv++) {
        const qd_cuda_moe_args a = {.n = n, .H = H, .I = c->I, .E = c->E, .k = c->k, .invariant = inv,
                                    .q_gate_up = &gu->d, .q_down = &dn->d};
        CHECKF(qd_cuda_moe_dequant_needed(&a) == !c->wa, "%s n=%d%s: the dequantization scratch is%s asked for",
               c->name, n, inv ? " (batch-invariant)" : "", c->wa ? "" : " not");
    }
    const qd_status st = run_st(c, gu, dn, x, sel, wt, y0, 0, n, yw, QD_MOE_PREFILL_WA16, 0);
    if (c->wa) {
        CHECKF(st == QD_OK && !memcmp(yw, yd, ny * 4), "%s n=%d: WA16 differs bitwise from the dequantized path",
               c->name, n);
        qm odd = *gu; /* the same experts, their codes read from 8 bytes on: not the kernel's alignment */
        odd.d.data += 8;
        CHECKF(run_st(c, &odd, dn, x, sel, wt, y0, 0, n, yt, QD_MOE_PREFILL_WA16, 0) != QD_OK,
               "%s n=%d: WA16 forced on codes not 16-byte aligned did not fail", c->name, n);
    } else {
        CHECKF(st != QD_OK, "%s n=%d: WA16 forced on experts outside its layouts did not fail", c->name, n);
    }
    if (!table_w8a8) {
        run(c, gu, dn, x, sel, wt, y0, 0, n, yt);
        CHECKF(!memcmp(yt, yd, ny * 4), "%s n=%d: the table's result differs bitwise from the dequantized path",
               c->name, n);
    }
    ST_OK(run_st(c, gu, dn, x, sel, wt, y0, 0, n, yt, 0, 1));
    CHECKF(!memcmp(yt, yd, ny * 4), "%s n=%d: batch-invariant mode differs bitwise from the dequantized path",
           c->name, n);
    ST_OK(run_st(c, gu, dn, x, sel, wt, y0, n - 1, 1, yt, 0, 1));
    CHECKF(!memcmp(yt, yd + (size_t)(n - 1) * H, (size_t)H * 4),
           "%s n=%d: the last token alone (batch-invariant) differs bitwise", c->name, n);
out:
    free(yd); free(yw); free(yt);
}

static void experts_case(const fcase *c, const qm *gu, const qm *dn, int n) {
    const int H = c->H, k = c->k;
    const qd_cuda_moe_args probe = {.n = n, .H = H, .I = c->I, .E = c->E, .k = k, .q_gate_up = &gu->d,
                                    .q_down = &dn->d};
    const int decode = qd_cuda_moe_decode_path(&probe);
    uint16_t *x = malloc((size_t)n * H * 2);
    int32_t *sel = malloc((size_t)n * k * 4);
    float *wt = malloc((size_t)n * k * 4), *y0 = malloc((size_t)n * H * 4), *y = malloc((size_t)n * H * 4);
    float *y2 = malloc((size_t)n * H * 4);
    double *ref = malloc((size_t)n * H * 8), *con = malloc((size_t)n * H * 8), *mag = malloc((size_t)n * H * 8);
    for (int i = 0; i < n * H; i++) x[i] = qd_f32_to_bf16(qd_test_normal(&rng));
    for (int i = 0; i < n * H; i++) y0[i] = qd_test_normal(&rng);
    for (int t = 0; t < n; t++) /* k distinct experts, a third of the tokens on expert 0 (shared weights) */
        for (int j = 0; j < k; j++) {
            int e;
            int fresh;
            do {
                e = (j == 0 && t % 3 == 0) ? 0 : (int)(qd_test_next(&rng) % (uint64_t)c->E);
                fresh = 1;
                for (int q = 0; q < j; q++) fresh &= sel[t * k + q] != e;
            } while (!fresh);
            sel[t * k + j] = e;
            wt[t * k + j] = 0.1f + 0.4f * runit();
        }
    for (int t = 0; t < n; t++) {
        token_ref(gu, dn, H, c->I, x + (size_t)t * H, sel + t * k, wt + t * k, k, con + (size_t)t * H,
                  mag + (size_t)t * H);
        for (int h = 0; h < H; h++) ref[(size_t)t * H + h] = y0[(size_t)t * H + h] + con[(size_t)t * H + h];
    }
    char what[96];
    snprintf(what, sizeof what, "%s n=%d (%s)", c->name, n, decode ? "decode" : "prefill");
    /* FP8 in 128 x 128 blocks past the decode kernels: W8A8 (the table's pick there outside
     * batch-invariant mode) against its own reference */
    const int w8a8 = c->fmt == QD_DTYPE_F8_E4M3 && c->bc_gu == 128 && c->bc_dn == 128 && (!c->br || c->br == 128) &&
                     !decode;
    if (w8a8) w8a8_case(c, gu, dn, n, x, sel, wt, y0, ref, con, mag);
    if (!decode) { /* WA16 and the dequantized path */
        wa_case(c, gu, dn, n, x, sel, wt, y0, ref, con, mag, w8a8);
    } else {
        run(c, gu, dn, x, sel, wt, y0, 0, n, y);
        compare(what, y, ref, con, (size_t)n * H, 2e-4, 1e-5, 2e-5);
        qm odd = *gu; /* the decode kernels read codes in 16-byte pieces: a view 8 bytes on is refused */
        odd.d.data += 8;
        CHECKF(run_st(c, &odd, dn, x, sel, wt, y0, 0, n, y2, 0, 0) == QD_ERR_INVALID_ARG,
               "%s: codes not 16-byte aligned were not refused", what);
    }
    if (decode) {
        run(c, gu, dn, x, sel, wt, y0, 0, n, y2);
        CHECKF(!memcmp(y, y2, (size_t)n * H * 4), "%s: a second run differs bitwise", what);
        if (n > 1) {
            run(c, gu, dn, x, sel, wt, y0, n - 1, 1, y2);
            CHECKF(!memcmp(y + (size_t)(n - 1) * H, y2, (size_t)H * 4), "%s: the last token alone differs bitwise",
                   what);
        }
    }
    free(x); free(sel); free(wt); free(y0); free(y); free(y2); free(ref); free(con); free(mag);
}

/* The fused decode block with the shared expert quantized in the routed experts' format. */
static void block_case(const fcase *c, const qm *gu, const qm *dn, int n) {
    const int H = c->H, I = c->I, E = c->E, k = c->k, Is = 2 * c->I;
    qm sgu, sdn;
    if (!make_qm(c->fmt, 2, Is, H, c->bc_gu, c->br, c->zeros, sqrtf(3.0f / H), &sgu) ||
        !make_qm(c->fmt, 1, H, Is, c->bc_dn, c->br, c->zeros, sqrtf(3.0f / Is), &sdn)) {
        CHECK(0);
        return;
    }
    float *h0 = malloc((size_t)n * H * 4), *nw = malloc((size_t)H * 4);
    uint16_t *router = malloc((size_t)(E + 1) * H * 2);
    for (int i = 0; i < n * H; i++) h0[i] = qd_test_normal(&rng);
    for (int i = 0; i < H; i++) nw[i] = 0.1f * qd_test_uniform(&rng);
    for (int i = 0; i < (E + 1) * H; i++) router[i] = qd_f32_to_bf16(qd_test_normal(&rng) * 0.2f);
    float *dh = qd_test_dev(h0, (size_t)n * H * 4), *dnw = qd_test_dev(nw, (size_t)H * 4);
    uint16_t *drt = qd_test_dev(router, (size_t)(E + 1) * H * 2), *dx = qd_test_dev(NULL, (size_t)n * H * 2);
    float *dl = qd_test_dev(NULL, (size_t)n * (E + 1) * 4), *dw = qd_test_dev(NULL, (size_t)n * k * 4);
    int32_t *ds = qd_test_dev(NULL, (size_t)n * k * 4), *dc = qd_test_dev(NULL, (size_t)n * 4);
    float *dsa = qd_test_dev(NULL, (size_t)n * Is * 4), *dso = qd_test_dev(NULL, (size_t)n * H * 4);
    const size_t wb = qd_cuda_moe_work_bytes(n, H, I, E, k);
    void *work = qd_test_dev(NULL, wb);
    ST_OK(qd_cuda_memset(dc, 0, (size_t)n * 4));
    const qd_cuda_moe_block_args a = {
        .n = n, .H = H, .I = I, .E = E, .k = k, .renorm = 1, .d_h = dh, .d_norm = dnw, .eps = 1e-6f, .d_router = drt,
        .I_s = Is, .d_x = dx, .d_logits = dl, .d_sel = ds, .d_w = dw, .d_route_cnt = dc, .d_sh_act = dsa,
        .d_sh_out = dso, .d_work = work, .q_gate_up = &gu->d, .q_down = &dn->d, .q_sh_gate_up = &sgu.d,
        .q_sh_down = &sdn.d,
    };
    CHECK(qd_cuda_moe_block_supported(n, H, I, Is, E, k));
    ST_OK(qd_cuda_moe_block(&a, NULL));
    ST_OK(qd_cuda_sync());
    float *h1 = qd_test_host(dh, (size_t)n * H * 4), *lg = qd_test_host(dl, (size_t)n * (E + 1) * 4);
    float *wt = qd_test_host(dw, (size_t)n * k * 4);
    uint16_t *x = qd_test_host(dx, (size_t)n * H * 2);
    int32_t *sel = qd_test_host(ds, (size_t)n * k * 4);
    double *ref = malloc((size_t)n * H * 8), *con = malloc((size_t)n * H * 8), *sh = malloc((size_t)H * 8);
    if (h1 && lg && wt && x && sel && ref && con && sh) {
        const int32_t one = 0;
        const float unit = 1.0f;
        for (int t = 0; t < n; t++) {
            double *ct = con + (size_t)t * H;
            token_ref(gu, dn, H, I, x + (size_t)t * H, sel + t * k, wt + t * k, k, ct, NULL);
            token_ref(&sgu, &sdn, H, Is, x + (size_t)t * H, &one, &unit, 1, sh, NULL);
            const double sg = 1.0 / (1.0 + exp(-(double)lg[(size_t)t * (E + 1) + E]));
            for (int hh = 0; hh < H; hh++) {
                ct[hh] += sg * sh[hh];
                ref[(size_t)t * H + hh] = h0[(size_t)t * H + hh] + ct[hh];
            }
        }
        char what[96];
        snprintf(what, sizeof what, "%s block n=%d, shared I=%d", c->name, n, Is);
        compare(what, h1, ref, con, (size_t)n * H, 2e-4, 1e-5, 2e-5);
    } else {
        CHECK(0);
    }
    void *dev[] = {dh, dnw, drt, dx, dl, dw, ds, dc, dsa, dso, work};
    for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++) qd_cuda_free(dev[i]);
    free(h0); free(nw); free(router); free(h1); free(lg); free(wt); free(x); free(sel); free(ref); free(con); free(sh);
    free_qm(&sgu);
    free_qm(&sdn);
}

int main(void) {
    if (qd_cuda_device_count() == 0) return qd_test_skip("test_cuda_quant_moe", "no CUDA device");
    rng = qd_test_rng_from_env();
    static const fcase cases[] = {
        /* FP8 at n = 24, 70 and 300 (the table: W8A8), W8A16 forced and in
         * batch-invariant mode bit for bit the dequantized path's */
        {"fp8 block128", QD_DTYPE_F8_E4M3, 256, 192, 12, 4, 128, 128, 0, 300, 0, 1, 0},
        /* 4-bit at n = 70 and 300 (the dequantized path on the wgmma kernel):
         * W4A16 bit for bit. K % 64 == 32 leaves a 32-column tail k-step (down: I = 96, 160;
         * gate_up: H = 288), H = 320 a partial block of down's output columns, I = 64 and 96
         * gate_up rows past the matrix */
        {"int4 g64 zeros", QD_DTYPE_INT4, 320, 96, 9, 3, 64, 64, 1, 300, 0, 1, 0},
        {"int4 one group sym", QD_DTYPE_INT4, 256, 64, 8, 2, 256, 64, 0, 300, 0, 1, 0},
        /* I % 64 != 0: outside the WA16 kernels (an NVFP4 k-step's scales are one word) */
        {"nvfp4", QD_DTYPE_NVFP4, 256, 160, 10, 4, 16, 16, 0, 70, 0, 0, 0},
        {"nvfp4 k64", QD_DTYPE_NVFP4, 320, 192, 10, 4, 16, 16, 0, 300, 0, 1, 0},
        /* groups and blocks whose columns are no power of two: the kernels' divided index (a
         * shift for the others), partial last groups */
        {"int4 g96 zeros", QD_DTYPE_INT4, 320, 160, 9, 3, 96, 96, 1, 300, 0, 1, 0},
        /* 32-column groups: a group a WA16 half k-step, an odd group count a row (H / 32 = 9)
         * placing zero points at every byte of their words */
        {"int4 g32 zeros", QD_DTYPE_INT4, 288, 128, 6, 2, 32, 32, 1, 300, 0, 1, 0},
        /* k = E: every token on every expert, so n pairs an expert, several of W4A16's 128-row
         * tiles: at n = 600, 4 x 128 + 88 (the last: warpgroup 0's 64 rows whole, warpgroup
         * 1's partial); at 300, 128 + 128 + 44 (warpgroup 0 partial, warpgroup 1 none). Column
         * blocks past I and H, a 32-column tail k-step of down (I = 160) */
        {"int4 g64 zeros, k = E = 2", QD_DTYPE_INT4, 320, 160, 2, 2, 64, 32, 1, 600, 600, 1, 0},
        {"nvfp4 k64, k = E = 3", QD_DTYPE_NVFP4, 256, 128, 3, 3, 16, 16, 0, 300, 300, 1, 0},
        /* FP8 layouts outside W8A8, W8A16 at every prefill size: 192-column blocks (a divided
         * block index), a 16-column tail k-step of down (I = 208) and a partial block row */
        {"fp8 block 128x192", QD_DTYPE_F8_E4M3, 384, 208, 6, 2, 192, 192, 0, 300, 0, 1, 0},
        /* per-channel (one scale a row): tail k-steps of 48 columns (gate_up, H = 304) and 32
         * (down, I = 160) */
        {"fp8 per-channel", QD_DTYPE_F8_E4M3, 304, 160, 8, 3, 304, 160, 0, 300, 0, 1, 1},
        /* 96 x 48 blocks: block rows no power of two, a block change inside a k-step's 64
         * columns (two scales a step a row, found by division), a 16-column tail (I = 144) */
        {"fp8 block 96x48", QD_DTYPE_F8_E4M3, 256, 144, 6, 2, 48, 48, 0, 300, 0, 1, 96},
        /* Qwen3.5-35B-A3B's expert shape: the staged kernels' shared memory at its real size
         * (x and stages together past the 48 KiB a launch has without opting in) */
        {"fp8 35B-A3B shape", QD_DTYPE_F8_E4M3, 2048, 512, 16, 8, 128, 128, 0, 16, 0, 1, 0},
        /* ... at a prefill size: the W8A8 kernels over several tiles an expert and every
         * column block of both GEMMs; W8A16 over 32 k-steps of gate_up */
        {"fp8 35B-A3B shape, prefill", QD_DTYPE_F8_E4M3, 2048, 512, 16, 8, 128, 128, 0, 256, 256, 1, 0},
        /* ... INT4 with 128-column groups and zero points: W4A16 over 32 k-steps of gate_up */
        {"int4 35B-A3B shape, prefill", QD_DTYPE_INT4, 2048, 512, 16, 8, 128, 128, 1, 256, 256, 1, 0},
        /* rows longer than the two shared-memory stages, so stages are refilled while read:
         * gate_up rows of 3 stages, down rows of 3 (fp8: 2 KiB and 1 KiB a stage) */
        {"fp8 streamed stages", QD_DTYPE_F8_E4M3, 4224, 2176, 3, 2, 128, 128, 0, 16, 0, 1, 0},
        {"int4 streamed stages", QD_DTYPE_INT4, 4224, 2176, 3, 2, 128, 128, 1, 16, 0, 1, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const fcase *c = &cases[i];
        qm gu, dn;
        if (!make_qm(c->fmt, 2 * c->E, c->I, c->H, c->bc_gu, c->br, c->zeros, sqrtf(3.0f / c->H), &gu) ||
            !make_qm(c->fmt, c->E, c->H, c->I, c->bc_dn, c->br, c->zeros, sqrtf(3.0f / c->I), &dn)) {
            CHECK(0);
            continue;
        }
        check_dequant(c->name, &gu);
        check_dequant(c->name, &dn);
        const int ns[7] = {1, 5, 16, 24, 48, 70, 300};
        for (int j = 0; j < 7 && !c->only_n; j++)
            if (ns[j] <= c->max_n) experts_case(c, &gu, &dn, ns[j]);
        if (c->only_n) {
            experts_case(c, &gu, &dn, c->only_n);
        } else {
            block_case(c, &gu, &dn, 1);
            block_case(c, &gu, &dn, 3);
        }
        free_qm(&gu);
        free_qm(&dn);
    }
    return qd_test_finish("test_cuda_quant_moe");
}

#else

int main(void) { return qd_test_skip("test_cuda_quant_moe", "built without CUDA"); }

#endif
