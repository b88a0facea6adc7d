/* The batch-invariant product (qd_cuda_matmul_invariant, gemm_invariant.cu) and the
 * linear path that uses it (QD_LIN_PATH_INVARIANT, cuda_linear.h), on fresh random
 * inputs (seed printed; QD_TEST_SEED replays it), outputs poisoned (NaN) first:
 *
 *  (a) accuracy against a double-precision CPU product on awkward shapes (rows 1 to
 *      4099 and the 248320 of an lm_head, cols 8 to 4096, n 1 to 1100 and 5000),
 *      stored and accumulated, x rows at ldx > cols (the gap holds NaN, which must not
 *      be read) and y rows at ldy > rows (the gap must keep its bits), every element
 *      within a bound derived from sum |x| |w|; each with the shape's chain count S
 *      (qd_cuda_matmul_invariant_chains: 1 to 8 here, K often not a multiple of
 *      16 S) and with S = 3 and 16 given (cut short where K has fewer k-steps); and
 *      for every S every tile shape gives the bits of the table's pick;
 *  (b) invariance: fixed x rows placed at different positions in batches of n = 1 to
 *      1024 (the other rows random) give the bits they give alone, on every tile,
 *      stored and accumulated, at the shape's S (1, 8) and at S = 1 and 5 given;
 *  (c) qd_cuda_linear_path(QD_LIN_PATH_INVARIANT) for the four input kinds and one or
 *      three products: within the bound of the plain path, and a token alone gives
 *      the bits it has in the batch;
 *  (d) bad arguments give an error status and leave y alone.
 * Skips (77) without a GPU. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/dtype.h"
#include "qd_test.h"
#ifdef QD_HAVE_CUDA
#include "backend/cuda/cuda_gdn.h"
#include "backend/cuda/cuda_device.h"
#include "backend/cuda/cuda_linear.h"
#include "backend/cuda/cuda_ops.h"
#include "qd_test_cuda.h"
#endif

#ifdef QD_HAVE_CUDA

static qd_test_rng rng;

/* random bf16 rows of cols at stride ld (the gap NaN), and their values widened */
static uint16_t *rnd_rows_bf16(int n, int64_t cols, int64_t ld, float scale, float **wide) {
    uint16_t *b = malloc((size_t)n * (size_t)ld * 2 + 4);
    float *f = malloc((size_t)n * (size_t)ld * 4 + 4);
    for (int t = 0; t < n; t++)
        for (int64_t c = 0; c < ld; c++) {
            const size_t i = (size_t)t * (size_t)ld + (size_t)c;
            b[i] = c < cols ? qd_f32_to_bf16(qd_test_normal(&rng) * scale) : 0xffff;
            f[i] = qd_bf16_to_f32(b[i]);
        }
    *wide = f;
    return b;
}

/* The bound of one output: ceil(cols / 16) k-steps and the S - 1 additions of the
 * chains, each allowed 2^-21 of the row's sum |x| |w| (+ |y0|: the final add),
 * generous for the tensor cores' truncating alignment, yet far below a missing or
 * misplaced term. */
static double bound(int64_t cols, double mag) { return ((double)((cols + 15) / 16) + 17.0) * ldexp(mag, -21) + 1e-30; }

/* the chain count the kernel uses for a given count (0: the shape's), as it cuts K */
static int chains_used(int64_t rows, int64_t cols, int given) {
    if (!given) return qd_cuda_matmul_invariant_chains(rows, cols);
    const int64_t ks = (cols + 15) / 16, s = given < ks ? given : ks, L = (ks + s - 1) / s;
    return (int)((ks + L - 1) / L);
}

/* ------------------------------------------------------------ (a) accuracy */

typedef struct acc_case {
    int64_t rows, cols;
    int n, acc;
    int64_t xpad, ypad;
} acc_case;

static void test_accuracy(const acc_case *ac, int given) {
    const int64_t R = ac->rows, C = ac->cols, ldx = C + ac->xpad, ldy = R + ac->ypad;
    const int S = chains_used(R, C, given);
    const int n = ac->n;
    const size_t ny = (size_t)n * (size_t)ldy;
    float *xf, *wf;
    uint16_t *xb = rnd_rows_bf16(n, C, ldx, 1.0f, &xf), *wb = rnd_rows_bf16((int)R, C, C, 0.5f, &wf);
    float *y0 = ac->acc ? qd_test_rnd(&rng, ny, 1.0f) : NULL;
    uint16_t *dW = qd_test_dev(wb, (size_t)R * (size_t)C * 2), *dx = qd_test_dev(xb, (size_t)n * (size_t)ldx * 2);
    float *dy = qd_test_dev(y0, ny * 4);
    if (given) ST_OK(qd_cuda_matmul_invariant_chained(-1, given, dW, R, C, dx, ldx, n, dy, ldy, ac->acc, NULL));
    else ST_OK(qd_cuda_matmul_invariant(dW, R, C, dx, ldx, n, dy, ldy, ac->acc, NULL));
    float *y = qd_test_host(dy, ny * 4);
    size_t bad = 0, bad_pad = 0;
    double worst = 0;
    for (int t = 0; t < n; t++) {
        for (int64_t r = 0; r < R; r++) {
            const float *xr = xf + (size_t)t * (size_t)ldx, *wr = wf + (size_t)r * (size_t)C;
            double s = 0, mag = 0;
            for (int64_t c = 0; c < C; c++) {
                const double term = (double)xr[c] * wr[c];
                s += term;
                mag += fabs(term);
            }
            const double yy = y0 ? y0[(size_t)t * ldy + r] : 0.0, ref = yy + s, lim = bound(C, mag + fabs(yy));
            const double d = fabs((double)y[(size_t)t * ldy + r] - ref);
            if (!(d <= lim)) {
                if (!bad)
                    fprintf(stderr, "  rows=%lld cols=%lld n=%d t %d row %lld: got %.9g want %.9g (limit %g)\n",
                            (long long)R, (long long)C, n, t, (long long)r, y[(size_t)t * ldy + r], ref, lim);
                bad++;
            }
            if (d / lim > worst) worst = d / lim;
        }
        for (int64_t r = R; r < ldy; r++) {
            uint32_t a, b = 0xffffffffu;
            memcpy(&a, &y[(size_t)t * ldy + r], 4);
            if (y0) memcpy(&b, &y0[(size_t)t * ldy + r], 4);
            bad_pad += a != b;
        }
    }
    CHECKF(bad == 0, "accuracy rows=%lld cols=%lld n=%d acc=%d S=%d: %zu of %lld elements off", (long long)R,
           (long long)C, n, ac->acc, S, bad, (long long)n * R);
    CHECKF(bad_pad == 0, "accuracy rows=%lld n=%d: %zu padding elements written", (long long)R, n, bad_pad);
    /* every tile: the bits of the table's pick */
    const int table = qd_cuda_matmul_invariant_choice(R, C, n);
    int same = 0;
    for (int tile = 0; tile < qd_cuda_matmul_invariant_tiles(); tile++) {
        if (y0) CHECK(qd_cuda_memcpy_h2d(dy, y0, ny * 4) == QD_OK);
        else CHECK(qd_cuda_memset(dy, 0xff, ny * 4) == QD_OK);
        if (given) ST_OK(qd_cuda_matmul_invariant_chained(tile, given, dW, R, C, dx, ldx, n, dy, ldy, ac->acc, NULL));
        else ST_OK(qd_cuda_matmul_invariant_tile(tile, dW, R, C, dx, ldx, n, dy, ldy, ac->acc, NULL));
        float *yt = qd_test_host(dy, ny * 4);
        const int eq = !memcmp(yt, y, ny * 4);
        CHECKF(eq, "accuracy rows=%lld cols=%lld n=%d acc=%d S=%d: tile %s differs from the table's %s", (long long)R,
               (long long)C, n, ac->acc, S, qd_cuda_matmul_invariant_tile_name(tile),
               qd_cuda_matmul_invariant_tile_name(table));
        same += eq;
        free(yt);
    }
    printf("  rows=%-6lld cols=%-5lld n=%-4d acc=%d ldx=+%lld ldy=+%lld S=%-2d%s table=%-11s worst/limit %.3f, "
           "%d/%d tiles bitwise equal\n",
           (long long)R, (long long)C, n, ac->acc, (long long)ac->xpad, (long long)ac->ypad, S,
           given ? " (given)" : "        ", qd_cuda_matmul_invariant_tile_name(table), worst, same,
           qd_cuda_matmul_invariant_tiles());
    free(xf); free(wf); free(xb); free(wb); free(y0); free(y);
    qd_cuda_free(dW); qd_cuda_free(dx); qd_cuda_free(dy);
}

/* ---------------------------------------------------------- (b) invariance */

#define PROBES 3

static void test_invariance(int64_t R, int64_t C, int acc, int given) {
    static const int ns[] = {1, 5, 16, 17, 64, 100, 333, 1024};
    const int NMAX = 1024;
    const int64_t ldx = C + 8, ldy = R + 1;
    float *wf, *pf, *bf;
    uint16_t *wb = rnd_rows_bf16((int)R, C, C, 0.5f, &wf);
    uint16_t *pb = rnd_rows_bf16(PROBES, C, ldx, 1.0f, &pf); /* the probe rows */
    float *py0 = qd_test_rnd(&rng, (size_t)PROBES * ldy, 1.0f);
    uint16_t *dW = qd_test_dev(wb, (size_t)R * C * 2), *dx = qd_test_dev(NULL, (size_t)NMAX * ldx * 2);
    float *dy = qd_test_dev(NULL, (size_t)NMAX * ldy * 4);
    /* each probe alone, table's tile */
    float *ref = malloc(sizeof(float) * (size_t)PROBES * R);
    for (int k = 0; k < PROBES; k++) {
        CHECK(qd_cuda_memcpy_h2d(dx, pb + (size_t)k * ldx, (size_t)ldx * 2) == QD_OK);
        if (acc) CHECK(qd_cuda_memcpy_h2d(dy, py0 + (size_t)k * ldy, (size_t)ldy * 4) == QD_OK);
        ST_OK(qd_cuda_matmul_invariant_chained(-1, given, dW, R, C, dx, ldx, 1, dy, ldy, acc, NULL));
        float *y = qd_test_host(dy, (size_t)R * 4);
        memcpy(ref + (size_t)k * R, y, sizeof(float) * (size_t)R);
        free(y);
    }
    size_t runs = 0, bad = 0;
    for (size_t q = 0; q < sizeof ns / sizeof ns[0]; q++) {
        const int n = ns[q];
        uint16_t *xb = rnd_rows_bf16(n, C, ldx, 1.0f, &bf);
        float *y0 = qd_test_rnd(&rng, (size_t)n * ldy, 1.0f);
        int pos[PROBES] = {n - 1, n / 2, 0};
        const int np = n >= 3 ? PROBES : 1;
        for (int k = 0; k < np; k++) {
            memcpy(xb + (size_t)pos[k] * ldx, pb + (size_t)k * ldx, (size_t)ldx * 2);
            memcpy(y0 + (size_t)pos[k] * ldy, py0 + (size_t)k * ldy, (size_t)ldy * 4);
        }
        CHECK(qd_cuda_memcpy_h2d(dx, xb, (size_t)n * ldx * 2) == QD_OK);
        for (int tile = -1; tile < qd_cuda_matmul_invariant_tiles(); tile++) {
            if (acc) CHECK(qd_cuda_memcpy_h2d(dy, y0, (size_t)n * ldy * 4) == QD_OK);
            else CHECK(qd_cuda_memset(dy, 0xff, (size_t)n * ldy * 4) == QD_OK);
            ST_OK(qd_cuda_matmul_invariant_chained(tile, given, dW, R, C, dx, ldx, n, dy, ldy, acc, NULL));
            float *y = qd_test_host(dy, (size_t)n * ldy * 4);
            for (int k = 0; k < np; k++) {
                const int ok = !memcmp(y + (size_t)pos[k] * ldy, ref + (size_t)k * R, sizeof(float) * (size_t)R);
                CHECKF(ok, "invariance rows=%lld cols=%lld acc=%d S=%d n=%d tile %s: probe %d at row %d differs from alone",
                       (long long)R, (long long)C, acc, chains_used(R, C, given), n,
                       tile < 0 ? "table" : qd_cuda_matmul_invariant_tile_name(tile), k, pos[k]);
                bad += !ok;
                runs++;
            }
            free(y);
        }
        free(xb); free(bf); free(y0);
    }
    printf("  invariance rows=%lld cols=%lld acc=%d S=%d%s: %zu probe rows over n = 1..1024 and every tile, %zu differ\n",
           (long long)R, (long long)C, acc, chains_used(R, C, given), given ? " (given)" : "", runs, bad);
    free(wf); free(wb); free(pf); free(pb); free(py0); free(ref);
    qd_cuda_free(dW); qd_cuda_free(dx); qd_cuda_free(dy);
}

/* ------------------------------------------------------- (c) linear path */

static const char *kind_name(int k) {
    return k == QD_LIN_BF16 ? "bf16" : k == QD_LIN_RMSNORM ? "rmsnorm" : k == QD_LIN_GATED ? "gated" : "silu";
}

/* The input of tokens [t0, t0 + n) of a batch whose buffers are in *in. */
static qd_cuda_lin_in lin_slice(const qd_cuda_lin_in *in, int64_t cols, int t0) {
    qd_cuda_lin_in s = *in;
    switch (in->kind) {
    case QD_LIN_BF16: s.x = in->x + (size_t)t0 * in->ldx; break;
    case QD_LIN_RMSNORM: s.rows = in->rows + t0; break;
    case QD_LIN_GATED:
        s.o = in->o + (size_t)t0 * cols;
        s.z = in->z + (size_t)t0 * in->ldz;
        break;
    default: s.gu = in->gu + (size_t)t0 * 2 * cols; break;
    }
    return s;
}

static void test_linear(qd_cuda_blas *blas, int kind, int n_out, int acc) {
    const int64_t cols = 1024, ldx = cols + 8, ldz = cols + 4;
    const int dv = 128, NMAX = 300, n_src = NMAX + 3;
    static const int64_t rows3[QD_LIN_MAX_OUT] = {300, 64, 17};
    qd_cuda_lin_in in = {0};
    in.kind = kind;
    in.eps = 1e-6f;
    void *bufs[4] = {0};
    float *xf_host = NULL;
    if (kind == QD_LIN_BF16) {
        uint16_t *xb = rnd_rows_bf16(NMAX, cols, ldx, 1.0f, &xf_host);
        bufs[0] = qd_test_dev(xb, (size_t)NMAX * ldx * 2);
        in.x = bufs[0];
        in.ldx = ldx;
        free(xb);
    } else if (kind == QD_LIN_RMSNORM) {
        float *h = qd_test_rnd(&rng, (size_t)n_src * cols, 1.5f), *w = qd_test_rnd(&rng, (size_t)cols, 0.3f);
        int32_t *map = malloc(sizeof(int32_t) * NMAX);
        for (int i = 0; i < NMAX; i++) map[i] = (7 * i + 2) % n_src; /* 7 and 303 coprime: a gather, no repeats */
        bufs[0] = qd_test_dev(h, (size_t)n_src * cols * 4);
        bufs[1] = qd_test_dev(w, (size_t)cols * 4);
        bufs[2] = qd_test_dev(map, sizeof(int32_t) * NMAX);
        in.h = bufs[0];
        in.w = bufs[1];
        in.rows = bufs[2];
        free(h); free(w); free(map);
    } else if (kind == QD_LIN_GATED) {
        float *of, *z = qd_test_rnd(&rng, (size_t)NMAX * ldz, 2.0f), *w = qd_test_rnd(&rng, (size_t)dv, 1.0f);
        uint16_t *ob = rnd_rows_bf16(NMAX, cols, cols, 1.0f, &of);
        bufs[0] = qd_test_dev(ob, (size_t)NMAX * cols * 2);
        bufs[1] = qd_test_dev(z, (size_t)NMAX * ldz * 4);
        bufs[2] = qd_test_dev(w, (size_t)dv * 4);
        in.o = bufs[0];
        in.z = bufs[1];
        in.ldz = ldz;
        in.dv = dv;
        in.w = bufs[2];
        free(of); free(ob); free(z); free(w);
    } else {
        float *gu = qd_test_rnd(&rng, (size_t)NMAX * 2 * cols, 2.0f);
        bufs[0] = qd_test_dev(gu, (size_t)NMAX * 2 * cols * 4);
        in.gu = bufs[0];
        free(gu);
    }
    qd_cuda_lin_out out[QD_LIN_MAX_OUT], one[QD_LIN_MAX_OUT];
    float *W[QD_LIN_MAX_OUT], *y0[QD_LIN_MAX_OUT], *yone[QD_LIN_MAX_OUT];
    for (int j = 0; j < n_out; j++) {
        const int64_t R = rows3[j], ldy = R + 3;
        uint16_t *wb = rnd_rows_bf16((int)R, cols, cols, 0.5f, &W[j]);
        y0[j] = qd_test_rnd(&rng, (size_t)NMAX * ldy, 1.0f);
        out[j] = (qd_cuda_lin_out){.W = qd_test_dev(wb, (size_t)R * cols * 2), .rows = R, .y = qd_test_dev(NULL, (size_t)NMAX * ldy * 4), .ldy = ldy};
        yone[j] = qd_test_dev(NULL, (size_t)ldy * 4);
        one[j] = (qd_cuda_lin_out){.W = out[j].W, .rows = R, .y = yone[j], .ldy = ldy};
        free(wb);
    }
    uint16_t *scratch = qd_test_dev(NULL, (size_t)NMAX * cols * 2), *scratch1 = qd_test_dev(NULL, (size_t)cols * 2);
    static const int ns[] = {1, 7, 40, 300};
    size_t bad = 0, bad_bits = 0;
    double worst = 0;
    for (size_t q = 0; q < sizeof ns / sizeof ns[0]; q++) {
        const int n = ns[q];
        float *yp[QD_LIN_MAX_OUT], *yi[QD_LIN_MAX_OUT];
        for (int path = QD_LIN_PATH_PLAIN; path <= QD_LIN_PATH_INVARIANT; path++) {
            for (int j = 0; j < n_out; j++) {
                const size_t bytes = (size_t)n * out[j].ldy * 4;
                if (acc) CHECK(qd_cuda_memcpy_h2d(out[j].y, y0[j], bytes) == QD_OK);
                else CHECK(qd_cuda_memset(out[j].y, 0xff, bytes) == QD_OK);
            }
            ST_OK(qd_cuda_linear_path(path, blas, &in, cols, n, out, n_out, acc, scratch, NULL));
            for (int j = 0; j < n_out; j++)
                (path == QD_LIN_PATH_PLAIN ? yp : yi)[j] = qd_test_host(out[j].y, (size_t)n * out[j].ldy * 4);
        }
        /* x as the GPU made it (the same kernels on both paths) */
        float *x = xf_host;
        int64_t lx = ldx;
        if (kind != QD_LIN_BF16) {
            uint16_t *xb = qd_test_host(scratch, (size_t)n * cols * 2);
            x = malloc(sizeof(float) * (size_t)n * cols);
            for (size_t i = 0; i < (size_t)n * cols; i++) x[i] = qd_bf16_to_f32(xb[i]);
            lx = cols;
            free(xb);
        }
        for (int j = 0; j < n_out; j++) {
            const int64_t R = rows3[j], ldy = out[j].ldy;
            for (int t = 0; t < n; t++)
                for (int64_t r = 0; r < R; r++) {
                    double mag = acc ? fabs(y0[j][(size_t)t * ldy + r]) : 0.0;
                    for (int64_t c = 0; c < cols; c++) mag += fabs((double)x[(size_t)t * lx + c] * W[j][r * cols + c]);
                    const double a = yi[j][(size_t)t * ldy + r], b = yp[j][(size_t)t * ldy + r];
                    const double lim = 2.0 * bound(cols, mag), d = fabs(a - b);
                    if (!(d <= lim)) {
                        if (!bad)
                            fprintf(stderr, "  linear %s n=%d out %d t %d row %lld: invariant %.9g plain %.9g\n",
                                    kind_name(kind), n, j, t, (long long)r, a, b);
                        bad++;
                    }
                    if (d / lim > worst) worst = d / lim;
                }
        }
        if (x != xf_host) free(x);
        /* tokens alone: the bits they have in the batch */
        const int probe[3] = {0, n / 2, n - 1};
        for (int k = 0; k < 3; k++) {
            const int t = probe[k];
            const qd_cuda_lin_in s = lin_slice(&in, cols, t);
            for (int j = 0; j < n_out; j++) {
                if (acc) CHECK(qd_cuda_memcpy_h2d(yone[j], y0[j] + (size_t)t * out[j].ldy, (size_t)out[j].ldy * 4) == QD_OK);
                else CHECK(qd_cuda_memset(yone[j], 0xff, (size_t)out[j].ldy * 4) == QD_OK);
            }
            ST_OK(qd_cuda_linear_path(QD_LIN_PATH_INVARIANT, blas, &s, cols, 1, one, n_out, acc, scratch1, NULL));
            for (int j = 0; j < n_out; j++) {
                float *y1 = qd_test_host(yone[j], (size_t)rows3[j] * 4);
                const int ok = !memcmp(y1, yi[j] + (size_t)t * out[j].ldy, sizeof(float) * (size_t)rows3[j]);
                CHECKF(ok, "linear %s n=%d outs=%d acc=%d out %d: token %d alone differs from in the batch",
                       kind_name(kind), n, n_out, acc, j, t);
                bad_bits += !ok;
                free(y1);
            }
        }
        for (int j = 0; j < n_out; j++) {
            free(yp[j]);
            free(yi[j]);
        }
    }
    CHECKF(bad == 0, "linear %s outs=%d acc=%d: %zu elements of the invariant path off the plain path's bound",
           kind_name(kind), n_out, acc, bad);
    printf("  linear %-7s outs=%d acc=%d n=1,7,40,300: vs plain worst/limit %.3f, tokens alone bitwise: %s\n",
           kind_name(kind), n_out, acc, worst, bad_bits ? "NO" : "yes");
    for (int j = 0; j < n_out; j++) {
        free(W[j]);
        free(y0[j]);
        qd_cuda_free((void *)out[j].W);
        qd_cuda_free(out[j].y);
        qd_cuda_free(yone[j]);
    }
    for (int i = 0; i < 4; i++) qd_cuda_free(bufs[i]);
    qd_cuda_free(scratch);
    qd_cuda_free(scratch1);
    free(xf_host);
}

/* ------------------------------------------------------ (d) bad arguments */

static void test_bad_args(qd_cuda_blas *blas) {
    const int64_t R = 32, C = 64;
    uint16_t *dW = qd_test_dev(NULL, (size_t)R * C * 2 + 64), *dx = qd_test_dev(NULL, (size_t)4 * C * 2 + 64);
    CHECK(qd_cuda_memset(dW, 0, (size_t)R * C * 2 + 64) == QD_OK);
    CHECK(qd_cuda_memset(dx, 0, (size_t)4 * C * 2 + 64) == QD_OK);
    float *dy = qd_test_dev(NULL, (size_t)4 * R * 4);
    const struct {
        const char *what;
        const uint16_t *W, *x;
        int64_t rows, cols, ldx, ldy;
        int n, tile;
    } bad[] = {
        {"cols % 8", dW, dx, R, 60, C, R, 2, -1},
        {"cols 0", dW, dx, R, 0, C, R, 2, -1},
        {"W misaligned", dW + 1, dx, R, C, C, R, 2, -1},
        {"x misaligned", dW, dx + 4, R, C, C, R, 2, -1},
        {"ldx % 8", dW, dx, R, C, C + 4, R, 2, -1},
        {"ldx < cols", dW, dx, R, C, C - 8, R, 2, -1},
        {"ldy < rows", dW, dx, R, C, C, R - 1, 2, -1},
        {"n < 0", dW, dx, R, C, C, R, -1, -1},
        {"rows < 0", dW, dx, -5, C, C, R, 2, -1},
        {"W NULL", NULL, dx, R, C, C, R, 2, -1},
        {"x NULL", dW, NULL, R, C, C, R, 2, -1},
        {"no such tile", dW, dx, R, C, C, R, 2, 99},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        const qd_status s = qd_cuda_matmul_invariant_tile(bad[i].tile, bad[i].W, bad[i].rows, bad[i].cols, bad[i].x,
                                                          bad[i].ldx, bad[i].n, dy, bad[i].ldy, 0, NULL);
        CHECKF(s == QD_ERR_INVALID_ARG || s == QD_ERR_UNSUPPORTED, "bad args (%s): status %s", bad[i].what,
               qd_status_name(s));
        CHECKF(strlen(qd_cuda_last_error()) > 0, "bad args (%s): no message", bad[i].what);
    }
    CHECK(qd_cuda_matmul_invariant(dW, R, C, dx, C, 2, NULL, R, 0, NULL) == QD_ERR_INVALID_ARG);
    CHECK(qd_cuda_matmul_invariant_chained(-1, -2, dW, R, C, dx, C, 2, dy, R, 0, NULL) == QD_ERR_INVALID_ARG);
    /* nothing to do is fine */
    CHECK(qd_cuda_matmul_invariant(dW, R, C, dx, C, 0, dy, R, 0, NULL) == QD_OK);
    CHECK(qd_cuda_matmul_invariant(dW, 0, C, dx, C, 2, dy, R, 0, NULL) == QD_OK);
    /* y untouched (still the 0xff poison) */
    uint32_t *y = qd_test_host(dy, (size_t)4 * R * 4);
    size_t touched = 0;
    for (size_t i = 0; i < (size_t)4 * R; i++) touched += y[i] != 0xffffffffu;
    CHECKF(touched == 0, "bad args: %zu elements of y written", touched);
    free(y);
    /* the linear path */
    qd_cuda_lin_in in = {0};
    in.kind = QD_LIN_BF16;
    in.x = dx;
    in.ldx = C;
    qd_cuda_lin_out o = {.W = dW, .rows = R, .y = dy, .ldy = R};
    CHECK(qd_cuda_linear_path(4, blas, &in, C, 2, &o, 1, 0, NULL, NULL) == QD_ERR_INVALID_ARG);
    CHECK(qd_cuda_linear_path(QD_LIN_PATH_INVARIANT, blas, &in, 60, 2, &o, 1, 0, NULL, NULL) != QD_OK);
    in.ldx = C + 4;
    CHECK(qd_cuda_linear_path(QD_LIN_PATH_INVARIANT, blas, &in, C, 2, &o, 1, 0, NULL, NULL) != QD_OK);
    in.ldx = C;
    o.W = dW + 1;
    CHECK(qd_cuda_linear_path(QD_LIN_PATH_INVARIANT, blas, &in, C, 2, &o, 1, 0, NULL, NULL) != QD_OK);
    o.W = dW;
    qd_cuda_lin_in rms = {0};
    rms.kind = QD_LIN_RMSNORM;
    rms.h = (const float *)dx;
    rms.w = (const float *)dx;
    CHECK(qd_cuda_linear_path(QD_LIN_PATH_INVARIANT, blas, &rms, C, 2, &o, 1, 0, NULL, NULL) == QD_ERR_INVALID_ARG);
    /* and the device still works: zeros in, zeros out */
    ST_OK(qd_cuda_linear_path(QD_LIN_PATH_INVARIANT, blas, &in, C, 2, &o, 1, 0, NULL, NULL));
    float *yz = qd_test_host(dy, (size_t)2 * R * 4);
    size_t nonzero = 0;
    for (size_t i = 0; i < (size_t)2 * R; i++) nonzero += yz[i] != 0.0f;
    CHECKF(nonzero == 0, "bad args: the good call after them gave %zu nonzero outputs", nonzero);
    free(yz);
    printf("  bad arguments: %zu refused with a status, y untouched\n", sizeof bad / sizeof bad[0] + 2);
    qd_cuda_free(dW); qd_cuda_free(dx); qd_cuda_free(dy);
}

int main(void) {
    if (qd_cuda_device_count() == 0) return qd_test_skip("test_cuda_gemm_invariant", "no CUDA device");
    rng = qd_test_rng_from_env();
    qd_cuda_blas *blas = NULL;
    CHECK(qd_cuda_blas_create(&blas, NULL) == QD_OK);
    /* rows, cols, n, accumulate, ldx - cols, ldy - rows */
    static const acc_case ac[] = {
        {1, 8, 1, 0, 0, 0},        {7, 24, 2, 1, 8, 3},        {129, 520, 3, 0, 8, 5},
        {1000, 2056, 15, 1, 0, 1}, {4099, 520, 16, 0, 16, 3},  {4099, 24, 17, 1, 8, 0},
        {129, 2056, 63, 0, 8, 7},  {1000, 520, 64, 1, 0, 3},   {7, 2056, 65, 0, 24, 1},
        {1000, 8, 200, 1, 8, 5},   {129, 24, 513, 0, 0, 3},    {1, 520, 1100, 1, 8, 2},
        {4099, 8, 1100, 0, 8, 1},  {129, 520, 1100, 1, 0, 4},  {7, 8, 513, 1, 8, 0},
        {4099, 2056, 3, 1, 8, 3},  {1000, 24, 1, 0, 8, 0},     {129, 8, 16, 1, 0, 0},
        {1, 2056, 64, 0, 8, 3},    {7, 520, 200, 0, 16, 9},    {129, 2056, 200, 1, 8, 1},
        {4099, 24, 65, 0, 0, 0},   {1, 24, 15, 1, 0, 0},       {7, 2056, 2, 0, 0, 0},
        {248320, 64, 3, 1, 0, 1},  /* an lm_head's rows: 15520 tiles of 16 */
        {40, 32, 5000, 0, 8, 2},   /* thousands of tokens */
        {2048, 4096, 1, 1, 0, 0},  /* o_proj: the most chains */
        {2048, 4096, 40, 0, 8, 1},
        {520, 1544, 9, 1, 0, 2},   /* 97 k-steps (the last half one): the last chain shorter */
        {3000, 1032, 33, 0, 8, 3}, /* 65 k-steps */
    };
    /* the rule: one chain for an lm_head, 8 for the 16 MiB projections, cut to K */
    CHECK(qd_cuda_matmul_invariant_chains(248320, 2048) == 1);
    CHECK(qd_cuda_matmul_invariant_chains(2048, 4096) == 8);
    CHECK(qd_cuda_matmul_invariant_chains(4096, 4096) == 4);
    CHECK(qd_cuda_matmul_invariant_chains(8192, 2048) == 1);
    CHECK(qd_cuda_matmul_invariant_chains(1000, 2056) == 8);
    CHECK(qd_cuda_matmul_invariant_chains(7, 24) <= 2);
    static const int given[] = {0, 3, 16};
    for (size_t i = 0; i < sizeof ac / sizeof ac[0]; i++)
        for (size_t g = 0; g < sizeof given / sizeof given[0]; g++)
            if (!given[g] || (ac[i].n <= 1100 && ac[i].rows < 100000)) test_accuracy(&ac[i], given[g]);
    for (int acc = 0; acc <= 1; acc++) {
        test_invariance(1000, 2056, acc, 0);
        test_invariance(4099, 520, acc, 0);
        test_invariance(2048, 4096, acc, 0);
        test_invariance(1000, 2056, acc, 1);
        test_invariance(129, 1032, acc, 5);
    }
    for (int kind = QD_LIN_BF16; kind <= QD_LIN_SILU; kind++)
        for (int n_out = 1; n_out <= 3; n_out += 2) test_linear(blas, kind, n_out, n_out == 3 || kind == QD_LIN_GATED);
    test_linear(blas, QD_LIN_BF16, 1, 1);
    test_linear(blas, QD_LIN_SILU, 3, 0);
    test_bad_args(blas);
    qd_cuda_blas_destroy(blas);
    return qd_test_finish("test_cuda_gemm_invariant");
}

#else /* no CUDA compiler: nothing to test */

int main(void) { return qd_test_skip("test_cuda_gemm_invariant", "built without CUDA"); }

#endif
