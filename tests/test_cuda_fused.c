/* The CUDA backend's fused decode kernels against the CPU reference, on fresh
 * random inputs (seed printed; QD_TEST_SEED replays it) with awkward shapes,
 * outputs and scratch poisoned (NaN) before each call, every element checked:
 *
 *  - qd_cuda_linear (cuda_linear.h): products whose input x is made in the kernel
 *    (plain bf16, RMSNorm of residual rows with a row gather, the GDN gated norm,
 *    SwiGLU), one to three products per call, stored or added into y; shapes that
 *    take every row of the kernel table (fused GEMV, x in place when too large for
 *    shared memory; x materialised with the plain GEMV past the table's size
 *    limits or the fused kernel's shared memory; cuBLAS above n = 8, beta = 1 when
 *    accumulating), each run through the table and then through each path by
 *    name (qd_cuda_linear_path: fused where it takes the shape, and plain). The
 *    padding between y rows must keep its bits. The table's pick for every
 *    projection of the benchmark configs matches what bench/linear_cuda_bench.c
 *    measured faster. The MoE table (qd_cuda_moe_block_preferred) likewise.
 *  - qd_cuda_moe_block (cuda_moe.h): norm, router, routing, routed and shared
 *    experts and the residual add in three launches, against the CPU: x and the
 *    logits directly; the routing against the CPU's routing of the GPU's logits;
 *    the new residual against a double-precision reference built from the GPU's x,
 *    routing and gate logit (so that one rounding flip upstream cannot fail it).
 *    Also: the counters come back zero, two runs give the same bits, and a token
 *    alone gives the bits it has inside the batch.
 *
 * Where the GPU builds x itself, its bf16 rounding may land one step away from
 * the CPU's for a few elements; the product tolerance allows that (2^-8 of the
 * l2 norm of the row's terms, times four) on top of fp32 accumulation error.
 * Skips (77) without a GPU. */
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
#include "backend/cuda/cuda_linear.h"
#include "backend/cuda/cuda_moe.h"
#include "backend/cpu/cpu_backend.h"
#include "qd_test_cuda.h"
#endif

#ifdef QD_HAVE_CUDA

static qd_test_rng rng;

static float *widen(const uint16_t *b, size_t n) {
    float *f = malloc(n * sizeof(float) + 4);
    for (size_t i = 0; i < n; i++) f[i] = qd_bf16_to_f32(b[i]);
    return f;
}
static void round_bf16_inplace(float *x, size_t n) {
    for (size_t i = 0; i < n; i++) x[i] = qd_bf16_to_f32(qd_f32_to_bf16(x[i]));
}

/* ------------------------------------------------------------- qd_cuda_linear */

typedef struct lin_case {
    int kind, n, n_out, acc, gather, dv; /* dv: GATED head dim */
    int64_t cols, rows[QD_LIN_MAX_OUT];
} lin_case;

static const char *kind_name(int k) {
    return k == QD_LIN_BF16 ? "bf16" : k == QD_LIN_RMSNORM ? "rmsnorm" : k == QD_LIN_GATED ? "gated" : "silu";
}

static void test_linear(qd_cuda_blas *blas, const lin_case *lc) {
    const int n = lc->n;
    const int64_t cols = lc->cols;
    const float eps = 1e-6f;
    float *xref = malloc(sizeof(float) * (size_t)(n * cols)); /* the x the GPU should multiply */
    qd_cuda_lin_in in = {0};
    in.kind = lc->kind;
    void *bufs[4] = {0};
    float *hin[4] = {0};
    int32_t rows[16];
    if (lc->kind == QD_LIN_BF16) {
        const int64_t ldx = cols + 8;
        float *x = qd_test_rnd(&rng, (size_t)(n * ldx), 1.0f);
        uint16_t *xb = qd_test_round_bf16(x, (size_t)(n * ldx));
        bufs[0] = qd_test_dev(xb, (size_t)(n * ldx) * 2);
        in.x = bufs[0];
        in.ldx = ldx;
        for (int t = 0; t < n; t++) memcpy(xref + t * cols, x + t * ldx, sizeof(float) * (size_t)cols);
        free(xb);
        hin[0] = x;
    } else if (lc->kind == QD_LIN_RMSNORM) {
        const int n_src = n + 3;
        float *h = qd_test_rnd(&rng, (size_t)(n_src * cols), 1.5f), *w = qd_test_rnd(&rng, (size_t)cols, 0.3f);
        for (int i = 0; i < n; i++) rows[i] = lc->gather ? (n_src - 1 - 2 * i + 2 * n_src) % n_src : i;
        bufs[0] = qd_test_dev(h, (size_t)(n_src * cols) * 4);
        bufs[1] = qd_test_dev(w, (size_t)cols * 4);
        bufs[2] = qd_test_dev(rows, sizeof(int32_t) * (size_t)n);
        in.h = bufs[0];
        in.w = bufs[1];
        in.rows = lc->gather ? bufs[2] : NULL;
        in.eps = eps;
        for (int i = 0; i < n; i++) qd_cpu_rmsnorm(h + rows[i] * cols, 1, (int)cols, cols, w, 1.0f, eps, xref + i * cols, cols);
        hin[0] = h;
        hin[1] = w;
    } else if (lc->kind == QD_LIN_GATED) {
        const int dv = lc->dv, hv = (int)(cols / dv);
        const int64_t ldz = cols + 4;
        float *o = qd_test_rnd(&rng, (size_t)(n * cols), 1.0f), *z = qd_test_rnd(&rng, (size_t)(n * ldz), 2.0f), *w = qd_test_rnd(&rng, (size_t)dv, 1.0f);
        uint16_t *ob = qd_test_round_bf16(o, (size_t)(n * cols));
        float *zc = malloc(sizeof(float) * (size_t)(n * cols));
        for (int t = 0; t < n; t++) memcpy(zc + t * cols, z + t * ldz, sizeof(float) * (size_t)cols);
        bufs[0] = qd_test_dev(ob, (size_t)(n * cols) * 2);
        bufs[1] = qd_test_dev(z, (size_t)(n * ldz) * 4);
        bufs[2] = qd_test_dev(w, (size_t)dv * 4);
        in.o = bufs[0];
        in.z = bufs[1];
        in.ldz = ldz;
        in.dv = dv;
        in.w = bufs[2];
        in.eps = eps;
        qd_cpu_gated_rmsnorm(o, zc, w, n, hv, dv, eps, xref);
        free(ob);
        hin[0] = o;
        hin[1] = z;
        hin[2] = w;
        hin[3] = zc;
    } else {
        float *gu = qd_test_rnd(&rng, (size_t)(n * 2 * cols), 2.0f);
        bufs[0] = qd_test_dev(gu, (size_t)(n * 2 * cols) * 4);
        in.gu = bufs[0];
        for (int t = 0; t < n; t++) qd_cpu_silu_mul(gu + t * 2 * cols, gu + t * 2 * cols + cols, cols, xref + t * cols);
        hin[0] = gu;
    }
    if (lc->kind != QD_LIN_BF16) round_bf16_inplace(xref, (size_t)(n * cols));
    /* the products; y rows padded by 3 elements that must keep their bits */
    qd_cuda_lin_out out[QD_LIN_MAX_OUT] = {{0}};
    float *W[QD_LIN_MAX_OUT], *y0[QD_LIN_MAX_OUT];
    double *acc_ref[QD_LIN_MAX_OUT], *mag_ref[QD_LIN_MAX_OUT], *l2_ref[QD_LIN_MAX_OUT];
    for (int j = 0; j < lc->n_out; j++) {
        const int64_t R = lc->rows[j], ldy = R + 3;
        W[j] = qd_test_rnd(&rng, (size_t)(R * cols), 0.5f);
        uint16_t *wb = qd_test_round_bf16(W[j], (size_t)(R * cols));
        y0[j] = lc->acc ? qd_test_rnd(&rng, (size_t)(n * ldy), 1.0f) : NULL;
        out[j].W = qd_test_dev(wb, (size_t)(R * cols) * 2);
        out[j].rows = R;
        out[j].y = qd_test_dev(y0[j], (size_t)(n * ldy) * 4);
        out[j].ldy = ldy;
        free(wb);
        /* the product in double, with the magnitudes the tolerance scales with */
        acc_ref[j] = malloc(sizeof(double) * (size_t)(n * R));
        mag_ref[j] = malloc(sizeof(double) * (size_t)(n * R));
        l2_ref[j] = malloc(sizeof(double) * (size_t)(n * R));
        for (int t = 0; t < n; t++)
            for (int64_t r = 0; r < R; r++) {
                double acc = 0, mag = 0, l2 = 0;
                for (int64_t c = 0; c < cols; c++) {
                    const double term = (double)W[j][r * cols + c] * xref[t * cols + c];
                    acc += term;
                    mag += fabs(term);
                    l2 += term * term;
                }
                acc_ref[j][t * R + r] = acc;
                mag_ref[j][t * R + r] = mag;
                l2_ref[j][t * R + r] = l2;
            }
    }
    uint16_t *scratch = qd_test_dev(NULL, (size_t)(n * cols) * 2);
    const int table = qd_cuda_linear_choice(&in, cols, n, out, lc->n_out);
    /* the table's pick through qd_cuda_linear, then each path by name (the fused
     * one where it takes the shape) */
    static const char *const path_name[3] = {"table", "fused", "plain"};
    char ran[64] = "";
    double worst = 0;
    for (int path = QD_LIN_PATH_TABLE; path <= QD_LIN_PATH_PLAIN; path++) {
        for (int j = 0; j < lc->n_out; j++) {
            const int64_t ldy = lc->rows[j] + 3;
            if (y0[j]) CHECK(qd_cuda_memcpy_h2d(out[j].y, y0[j], (size_t)(n * ldy) * 4) == QD_OK);
            else CHECK(qd_cuda_memset(out[j].y, 0xff, (size_t)(n * ldy) * 4) == QD_OK);
        }
        CHECK(qd_cuda_memset(scratch, 0xff, (size_t)(n * cols) * 2) == QD_OK);
        if (path == QD_LIN_PATH_TABLE) {
            ST_OK(qd_cuda_linear(blas, &in, cols, n, out, lc->n_out, lc->acc, scratch, NULL));
        } else {
            const qd_status st = qd_cuda_linear_path(path, blas, &in, cols, n, out, lc->n_out, lc->acc, scratch, NULL);
            if (path == QD_LIN_PATH_FUSED && st == QD_ERR_UNSUPPORTED) {
                CHECKF(table != QD_LIN_PATH_FUSED, "linear %s n=%d: the table picks a fused path that refuses it",
                       kind_name(lc->kind), n);
                continue;
            }
            ST_OK(st);
        }
        strcat(ran, ran[0] ? "+" : "");
        strcat(ran, path_name[path]);
        for (int j = 0; j < lc->n_out; j++) {
            const int64_t R = lc->rows[j], ldy = R + 3;
            float *y = qd_test_host(out[j].y, (size_t)(n * ldy) * 4);
            size_t bad = 0, bad_pad = 0;
            for (int t = 0; t < n; t++) {
                for (int64_t r = 0; r < R; r++) {
                    const double y00 = y0[j] ? y0[j][t * ldy + r] : 0.0, ref = y00 + acc_ref[j][t * R + r];
                    const double lim = 2e-5 * (mag_ref[j][t * R + r] + fabs(y00)) + 1e-6 +
                                       (lc->kind == QD_LIN_BF16 ? 0.0 : 4.0 / 256.0 * sqrt(l2_ref[j][t * R + r]));
                    const double d = fabs((double)y[t * ldy + r] - ref);
                    if (!(d <= lim)) {
                        if (!bad)
                            fprintf(stderr, "  linear %s (%s) out %d t %d row %lld: got %g want %g (limit %g)\n",
                                    kind_name(lc->kind), path_name[path], j, t, (long long)r, y[t * ldy + r], ref,
                                    lim);
                        bad++;
                    }
                    if (d / lim > worst) worst = d / lim;
                }
                for (int64_t r = R; r < ldy; r++) { /* padding: untouched */
                    uint32_t a, b;
                    memcpy(&a, &y[t * ldy + r], 4);
                    if (y0[j]) memcpy(&b, &y0[j][t * ldy + r], 4);
                    else b = 0xffffffffu;
                    bad_pad += a != b;
                }
            }
            CHECKF(bad == 0, "linear %s (%s) n=%d cols=%lld out %d (%lld rows, acc %d): %zu of %lld elements off",
                   kind_name(lc->kind), path_name[path], n, (long long)cols, j, (long long)R, lc->acc, bad,
                   (long long)(n * R));
            CHECKF(bad_pad == 0, "linear %s (%s) n=%d out %d: %zu padding elements written", kind_name(lc->kind),
                   path_name[path], n, j, bad_pad);
            free(y);
        }
    }
    printf("  linear %-7s n=%-2d cols=%-6lld outs=%d acc=%d%s table=%s ran %s, worst/limit %.3f\n",
           kind_name(lc->kind), n, (long long)cols, lc->n_out, lc->acc, lc->gather ? " gather" : "",
           table == QD_LIN_PATH_FUSED ? "fused" : n > 8 ? "cublas" : "plain", ran, worst);
    for (int j = 0; j < lc->n_out; j++) {
        free(W[j]);
        free(y0[j]);
        free(acc_ref[j]);
        free(mag_ref[j]);
        free(l2_ref[j]);
        qd_cuda_free((void *)out[j].W);
        qd_cuda_free(out[j].y);
    }
    for (int i = 0; i < 4; i++) {
        qd_cuda_free(bufs[i]);
        free(hin[i]);
    }
    qd_cuda_free(scratch);
    free(xref);
}

/* The table's pick for the projections of the configs in bench/configs, as measured
 * by bench/linear_cuda_bench.c (the faster path; the 9B out_proj at n = 2 measured a
 * tie, 0.99, and takes the rule of its kind; the pick looks at the shape and the pointers'
 * alignment only, so no device memory is needed). */
typedef struct rule_case {
    const char *what;
    int kind;
    int64_t cols;
    int n_out;
    int64_t rows[QD_LIN_MAX_OUT];
    int fused_n[4]; /* expected at n = 1, 2, 4, 8: 1 fused, 0 plain */
} rule_case;

static void test_table_rules(void) {
    static const rule_case rc[] = {
        {"35B in_proj", QD_LIN_RMSNORM, 2048, 1, {12352}, {1, 1, 0, 0}},
        {"35B out_proj", QD_LIN_GATED, 4096, 1, {2048}, {1, 0, 0, 0}},
        {"35B q,k,v", QD_LIN_RMSNORM, 2048, 3, {8192, 512, 512}, {1, 1, 0, 0}},
        {"35B o_proj", QD_LIN_BF16, 4096, 1, {2048}, {1, 0, 0, 0}},
        {"35B shared gate_up", QD_LIN_BF16, 2048, 1, {1024}, {1, 1, 1, 0}},
        {"35B shared down", QD_LIN_SILU, 512, 1, {2048}, {1, 1, 1, 1}},
        {"35B lm_head", QD_LIN_RMSNORM, 2048, 1, {248320}, {0, 1, 0, 0}},
        {"27B in_proj", QD_LIN_RMSNORM, 5120, 1, {16480}, {1, 1, 0, 0}},
        {"27B out_proj", QD_LIN_GATED, 6144, 1, {5120}, {0, 0, 0, 0}},
        {"27B q,k,v", QD_LIN_RMSNORM, 5120, 3, {12288, 1024, 1024}, {1, 1, 0, 0}},
        {"27B o_proj", QD_LIN_BF16, 6144, 1, {5120}, {0, 0, 0, 0}},
        {"27B gate_up", QD_LIN_RMSNORM, 5120, 1, {34816}, {0, 0, 0, 0}},
        {"27B down", QD_LIN_SILU, 17408, 1, {5120}, {0, 0, 0, 0}},
        {"9B in_proj", QD_LIN_RMSNORM, 4096, 1, {12352}, {1, 1, 0, 0}},
        {"9B out_proj", QD_LIN_GATED, 4096, 1, {4096}, {1, 0, 0, 0}},
        {"9B q,k,v", QD_LIN_RMSNORM, 4096, 3, {8192, 1024, 1024}, {1, 1, 0, 0}},
        {"9B o_proj", QD_LIN_BF16, 4096, 1, {4096}, {0, 0, 0, 0}},
        {"9B gate_up", QD_LIN_RMSNORM, 4096, 1, {24576}, {1, 1, 0, 0}},
        {"9B down", QD_LIN_SILU, 12288, 1, {4096}, {0, 0, 0, 0}},
    };
    /* stand-ins for device pointers: only their 16-byte alignment is looked at */
    static _Alignas(16) float fake[4];
    for (size_t i = 0; i < sizeof rc / sizeof rc[0]; i++) {
        qd_cuda_lin_in in = {0};
        in.kind = rc[i].kind;
        in.x = (const uint16_t *)fake;
        in.ldx = rc[i].cols;
        in.h = in.w = in.z = in.gu = fake;
        in.o = (const uint16_t *)fake;
        in.ldz = 2 * rc[i].cols;
        in.dv = 128;
        qd_cuda_lin_out out[QD_LIN_MAX_OUT] = {{0}};
        for (int j = 0; j < rc[i].n_out; j++) {
            out[j].W = (const uint16_t *)fake;
            out[j].rows = rc[i].rows[j];
            out[j].y = fake;
            out[j].ldy = rc[i].rows[j];
        }
        static const int ns[4] = {1, 2, 4, 8};
        for (int k = 0; k < 4; k++) {
            const int got = qd_cuda_linear_choice(&in, rc[i].cols, ns[k], out, rc[i].n_out) == QD_LIN_PATH_FUSED;
            CHECKF(got == rc[i].fused_n[k], "table: %s at n = %d: %s, measured faster: %s", rc[i].what, ns[k],
                   got ? "fused" : "plain", rc[i].fused_n[k] ? "fused" : "plain");
        }
    }
    /* above n = 8 the fused kernel does not exist */
    CHECK(qd_cuda_linear_choice(&(qd_cuda_lin_in){.kind = QD_LIN_BF16, .x = (const uint16_t *)fake, .ldx = 64}, 64, 9,
                                &(qd_cuda_lin_out){.W = (const uint16_t *)fake, .rows = 8, .y = fake, .ldy = 8}, 1) == QD_LIN_PATH_PLAIN);
    printf("  linear table: %zu projection shapes x 4 sizes as measured\n", sizeof rc / sizeof rc[0]);
}

/* ----------------------------------------------------------- qd_cuda_moe_block */

typedef struct moe_case {
    int n, H, I, E, k, Is, renorm;
} moe_case;

typedef struct moe_dev {
    void *h, *norm, *router, *gu, *dn, *sgu, *sdn, *x, *logits, *sel, *w, *cnt, *sact, *sout, *work;
} moe_dev;

/* Runs the block on n tokens whose residual rows are h (host), scratch poisoned first. */
static float *run_block(const moe_case *mc, moe_dev *d, const float *h, int n) {
    const size_t H = (size_t)mc->H;
    CHECK(qd_cuda_memcpy_h2d(d->h, h, (size_t)n * H * 4) == QD_OK);
    CHECK(qd_cuda_memset(d->x, 0xff, (size_t)mc->n * H * 2) == QD_OK);
    CHECK(qd_cuda_memset(d->logits, 0xff, (size_t)mc->n * (mc->E + 1) * 4) == QD_OK);
    CHECK(qd_cuda_memset(d->sel, 0xff, (size_t)mc->n * mc->k * 4) == QD_OK);
    CHECK(qd_cuda_memset(d->w, 0xff, (size_t)mc->n * mc->k * 4) == QD_OK);
    CHECK(qd_cuda_memset(d->work, 0xff, qd_cuda_moe_work_bytes(mc->n, mc->H, mc->I, mc->E, mc->k)) == QD_OK);
    if (mc->Is) {
        CHECK(qd_cuda_memset(d->sact, 0xff, (size_t)mc->n * mc->Is * 4) == QD_OK);
        CHECK(qd_cuda_memset(d->sout, 0xff, (size_t)mc->n * H * 4) == QD_OK);
    }
    const qd_cuda_moe_block_args a = {
        .n = n, .H = mc->H, .I = mc->I, .E = mc->E, .k = mc->k, .renorm = mc->renorm,
        .d_h = d->h, .d_norm = d->norm, .eps = 1e-6f, .d_router = d->router,
        .d_gate_up = d->gu, .d_down = d->dn, .d_sh_gate_up = mc->Is ? d->sgu : NULL, .d_sh_down = d->sdn,
        .I_s = mc->Is, .d_x = d->x, .d_logits = d->logits, .d_sel = d->sel, .d_w = d->w, .d_route_cnt = d->cnt,
        .d_sh_act = d->sact, .d_sh_out = d->sout, .d_work = d->work,
    };
    ST_OK(qd_cuda_moe_block(&a, NULL));
    return qd_test_host(d->h, (size_t)n * H * 4);
}

/* one expert (SwiGLU) on bf16 x in double: out[H] = down(silu(gate x) * up x) */
static void expert_ref(const float *gu, const float *dn, int H, int I, const float *x, double *out, double *mag) {
    double *act = malloc(sizeof(double) * (size_t)I);
    for (int i = 0; i < I; i++) {
        double g = 0, u = 0;
        for (int c = 0; c < H; c++) {
            g += (double)gu[(size_t)i * H + c] * x[c];
            u += (double)gu[(size_t)(I + i) * H + c] * x[c];
        }
        act[i] = g / (1.0 + exp(-g)) * u;
    }
    for (int r = 0; r < H; r++) {
        double s = 0, m = 0;
        for (int i = 0; i < I; i++) {
            s += (double)dn[(size_t)r * I + i] * act[i];
            m += fabs((double)dn[(size_t)r * I + i] * act[i]);
        }
        out[r] = s;
        mag[r] = m;
    }
    free(act);
}

static void test_moe_block(const moe_case *mc) {
    const int n = mc->n, H = mc->H, I = mc->I, E = mc->E, k = mc->k, Is = mc->Is, has_sh = Is > 0;
    const int Er = E + has_sh;
    char what[128];
    snprintf(what, sizeof what, "moe_block n=%d H=%d I=%d E=%d k=%d I_s=%d renorm=%d", n, H, I, E, k, Is, mc->renorm);
    float *h = qd_test_rnd(&rng, (size_t)n * H, 1.0f), *nw = qd_test_rnd(&rng, (size_t)H, 0.3f);
    float *wr = qd_test_rnd(&rng, (size_t)Er * H, 1.0f / sqrtf((float)H));
    float *gu = qd_test_rnd(&rng, (size_t)E * 2 * I * H, 1.0f / sqrtf((float)H)), *dn = qd_test_rnd(&rng, (size_t)E * H * I, 1.0f / sqrtf((float)I));
    float *sgu = has_sh ? qd_test_rnd(&rng, (size_t)2 * Is * H, 1.0f / sqrtf((float)H)) : NULL;
    float *sdn = has_sh ? qd_test_rnd(&rng, (size_t)H * Is, 1.0f / sqrtf((float)Is)) : NULL;
    uint16_t *wrb = qd_test_round_bf16(wr, (size_t)Er * H), *gub = qd_test_round_bf16(gu, (size_t)E * 2 * I * H),
             *dnb = qd_test_round_bf16(dn, (size_t)E * H * I);
    uint16_t *sgub = has_sh ? qd_test_round_bf16(sgu, (size_t)2 * Is * H) : NULL,
             *sdnb = has_sh ? qd_test_round_bf16(sdn, (size_t)H * Is) : NULL;
    int32_t *zeros = calloc((size_t)n, sizeof(int32_t));
    moe_dev d = {0};
    d.h = qd_test_dev(h, (size_t)n * H * 4);
    d.norm = qd_test_dev(nw, (size_t)H * 4);
    d.router = qd_test_dev(wrb, (size_t)Er * H * 2);
    d.gu = qd_test_dev(gub, (size_t)E * 2 * I * H * 2);
    d.dn = qd_test_dev(dnb, (size_t)E * H * I * 2);
    d.sgu = has_sh ? qd_test_dev(sgub, (size_t)2 * Is * H * 2) : NULL;
    d.sdn = has_sh ? qd_test_dev(sdnb, (size_t)H * Is * 2) : NULL;
    d.x = qd_test_dev(NULL, (size_t)n * H * 2);
    d.logits = qd_test_dev(NULL, (size_t)n * (E + 1) * 4);
    d.sel = qd_test_dev(NULL, (size_t)n * k * 4);
    d.w = qd_test_dev(NULL, (size_t)n * k * 4);
    d.cnt = qd_test_dev(zeros, (size_t)n * 4);
    d.sact = has_sh ? qd_test_dev(NULL, (size_t)n * Is * 4) : NULL;
    d.sout = has_sh ? qd_test_dev(NULL, (size_t)n * H * 4) : NULL;
    d.work = qd_test_dev(NULL, qd_cuda_moe_work_bytes(n, H, I, E, k));

    float *hout = run_block(mc, &d, h, n);
    uint16_t *xb = qd_test_host(d.x, (size_t)n * H * 2);
    float *lg = qd_test_host(d.logits, (size_t)n * (E + 1) * 4), *gw = qd_test_host(d.w, (size_t)n * k * 4);
    int32_t *gsel = qd_test_host(d.sel, (size_t)n * k * 4), *cnt = qd_test_host(d.cnt, (size_t)n * 4);
    /* x and the logits */
    float *xf = malloc(sizeof(float) * (size_t)n * H), *xr = malloc(sizeof(float) * (size_t)n * H);
    qd_cpu_rmsnorm(h, n, H, H, nw, 1.0f, 1e-6f, xf, H);
    memcpy(xr, xf, sizeof(float) * (size_t)n * H);
    round_bf16_inplace(xr, (size_t)n * H);
    float *xg = widen(xb, (size_t)n * H);
    size_t bad_x = 0, bad_l = 0, bad_r = 0, bad_h = 0;
    for (size_t i = 0; i < (size_t)n * H; i++) bad_x += !(fabs(xg[i] - xr[i]) <= 8e-3 * fabs(xr[i]) + 1e-6);
    for (int t = 0; t < n; t++)
        for (int e = 0; e < Er; e++) {
            double acc = 0, mag = 0;
            for (int c = 0; c < H; c++) {
                acc += (double)wr[(size_t)e * H + c] * xf[(size_t)t * H + c];
                mag += fabs((double)wr[(size_t)e * H + c] * xf[(size_t)t * H + c]);
            }
            bad_l += !(fabs(lg[(size_t)t * (E + 1) + e] - acc) <= 1e-5 * mag + 1e-6);
        }
    /* routing of the GPU's logits */
    int32_t rs[32];
    float rw[32], *prob = malloc(sizeof(float) * (size_t)E);
    for (int t = 0; t < n; t++) {
        qd_moe_route_token(lg + (size_t)t * (E + 1), E, k, mc->renorm, rs, rw, prob);
        for (int j = 0; j < k; j++)
            bad_r += gsel[t * k + j] != rs[j] || !(fabs(gw[t * k + j] - rw[j]) <= 1e-5 * fabs(rw[j]) + 1e-7);
    }
    free(prob);
    /* the residual, from the GPU's x, routing and gate logit */
    double *o = malloc(sizeof(double) * H), *m = malloc(sizeof(double) * H), *ref = malloc(sizeof(double) * H),
           *mag = malloc(sizeof(double) * H);
    double worst = 0;
    for (int t = 0; t < n; t++) {
        const float *x = xg + (size_t)t * H;
        for (int r = 0; r < H; r++) {
            ref[r] = h[(size_t)t * H + r];
            mag[r] = fabs(ref[r]);
        }
        if (has_sh) {
            const double sg = 1.0 / (1.0 + exp(-(double)lg[(size_t)t * (E + 1) + E]));
            expert_ref(sgu, sdn, H, Is, x, o, m);
            for (int r = 0; r < H; r++) {
                ref[r] += sg * o[r];
                mag[r] += sg * m[r];
            }
        }
        for (int j = 0; j < k; j++) {
            const int e = gsel[t * k + j];
            if (e < 0 || e >= E) continue; /* counted as a routing error above */
            expert_ref(gu + (size_t)e * 2 * I * H, dn + (size_t)e * H * I, H, I, x, o, m);
            for (int r = 0; r < H; r++) {
                ref[r] += gw[t * k + j] * o[r];
                mag[r] += fabs(gw[t * k + j]) * m[r];
            }
        }
        for (int r = 0; r < H; r++) {
            const double lim = 2e-5 * mag[r] + 1e-6, dd = fabs(hout[(size_t)t * H + r] - ref[r]);
            if (!(dd <= lim)) {
                if (!bad_h)
                    fprintf(stderr, "  %s: token %d row %d got %g want %g\n", what, t, r, hout[(size_t)t * H + r], ref[r]);
                bad_h++;
            }
            if (dd / lim > worst) worst = dd / lim;
        }
    }
    CHECKF(bad_x == 0, "%s: %zu of %d x elements off", what, bad_x, n * H);
    CHECKF(bad_l == 0, "%s: %zu of %d logits off", what, bad_l, n * Er);
    CHECKF(bad_r == 0, "%s: %zu of %d routing slots differ from the CPU's", what, bad_r, n * k);
    CHECKF(bad_h == 0, "%s: %zu of %d residual elements off", what, bad_h, n * H);
    int cnt_ok = 1;
    for (int t = 0; t < n; t++) cnt_ok &= cnt[t] == 0;
    CHECKF(cnt_ok, "%s: router counters not back to zero", what);
    /* run to run, and a token alone, bit for bit */
    float *again = run_block(mc, &d, h, n);
    CHECKF(!memcmp(again, hout, sizeof(float) * (size_t)n * H), "%s: two runs differ", what);
    const int t1 = n / 2;
    float *alone = run_block(mc, &d, h + (size_t)t1 * H, 1);
    CHECKF(!memcmp(alone, hout + (size_t)t1 * H, sizeof(float) * H), "%s: token %d alone differs from in the batch",
           what, t1);
    printf("  %-58s worst/limit %.3f\n", what, worst);
    free(h); free(nw); free(wr); free(gu); free(dn); free(sgu); free(sdn); free(wrb); free(gub); free(dnb);
    free(sgub); free(sdnb); free(zeros); free(hout); free(xb); free(lg); free(gw); free(gsel); free(cnt);
    free(xf); free(xr); free(xg); free(o); free(m); free(ref); free(mag); free(again); free(alone);
    void **all = (void **)&d;
    for (size_t i = 0; i < sizeof d / sizeof(void *); i++) qd_cuda_free(all[i]);
}

int main(void) {
    if (qd_cuda_device_count() == 0) return qd_test_skip("test_cuda_fused", "no CUDA device");
    rng = qd_test_rng_from_env();
    qd_cuda_blas *blas = NULL;
    CHECK(qd_cuda_blas_create(&blas, NULL) == QD_OK);
    /* kind, n, n_out, acc, gather, dv, cols, rows */
    static const lin_case lin[] = {
        {QD_LIN_BF16, 1, 1, 0, 0, 0, 2048, {1000}},            /* fused, x copied in */
        {QD_LIN_BF16, 3, 3, 1, 0, 0, 520, {37, 5, 300}},       /* three products, 65 pieces a row */
        {QD_LIN_BF16, 9, 2, 1, 0, 0, 256, {100, 60}},          /* cuBLAS, beta = 1 */
        {QD_LIN_BF16, 2, 1, 1, 0, 0, 56000, {40}},             /* x too large for shared memory: read in place */
        {QD_LIN_RMSNORM, 1, 1, 0, 1, 0, 2048, {3000}},
        {QD_LIN_RMSNORM, 5, 3, 0, 1, 0, 1000, {100, 17, 64}},
        {QD_LIN_RMSNORM, 8, 1, 1, 0, 0, 4096, {200}},
        {QD_LIN_RMSNORM, 11, 2, 1, 1, 0, 256, {50, 30}},       /* materialised, cuBLAS */
        {QD_LIN_RMSNORM, 3, 1, 0, 0, 0, 20000, {64}},          /* x over the fused kernel's shared memory: plain */
        {QD_LIN_RMSNORM, 2, 1, 1, 0, 0, 100, {10}},            /* cols % 8 != 0: cuBLAS */
        {QD_LIN_GATED, 1, 1, 1, 0, 128, 4096, {2048}},         /* the GDN out_proj at batch 1: fused */
        {QD_LIN_GATED, 4, 1, 0, 0, 64, 192, {77}},             /* gated at n > 2: plain */
        {QD_LIN_GATED, 2, 1, 1, 0, 24, 120, {33}},             /* 3 lanes a head: materialised */
        {QD_LIN_GATED, 12, 1, 0, 0, 32, 128, {40}},            /* cuBLAS */
        {QD_LIN_GATED, 1, 1, 0, 0, 256, 1024, {300}},          /* dv past the values a lane holds: reloaded */
        {QD_LIN_SILU, 1, 1, 1, 0, 0, 512, {2048}},
        {QD_LIN_SILU, 7, 1, 0, 0, 0, 1000, {300}},
        {QD_LIN_SILU, 3, 1, 1, 0, 0, 17408, {48}},             /* x over shared memory: plain */
        {QD_LIN_SILU, 20, 1, 0, 0, 0, 64, {30}},               /* cuBLAS */
        /* the table's size limits (fg_prefer_fused) from either side */
        {QD_LIN_RMSNORM, 1, 1, 1, 1, 0, 2048, {16384}},        /* 64 MiB, rmsnorm at n = 1: fused */
        {QD_LIN_RMSNORM, 4, 1, 0, 0, 0, 2048, {2048}},         /* 8 MiB, one product at n = 4: plain */
        {QD_LIN_RMSNORM, 4, 3, 0, 0, 0, 2048, {4096, 256, 256}}, /* q, k, v at n = 4: fused */
        {QD_LIN_GATED, 1, 1, 1, 0, 128, 4096, {4352}},         /* 34 MiB gated: plain */
        {QD_LIN_SILU, 2, 1, 1, 0, 0, 4096, {8192}},            /* 64 MiB: plain */
        {QD_LIN_BF16, 1, 1, 1, 0, 0, 2048, {4608}},            /* 18 MiB bf16: plain */
        {QD_LIN_BF16, 4, 2, 0, 0, 0, 2048, {12000, 4384}},     /* 64 MiB: plain */
    };
    for (size_t i = 0; i < sizeof lin / sizeof lin[0]; i++) test_linear(blas, &lin[i]);
    test_table_rules();
    /* n, H, I, E, k, I_s, renorm */
    static const moe_case moe[] = {
        {1, 2048, 512, 16, 8, 512, 1},  /* the 35B-A3B's hidden and expert sizes, fewer experts */
        {3, 2048, 512, 16, 8, 512, 1},
        {5, 64, 32, 256, 8, 32, 1},     /* 256 experts: eight logits a lane */
        {17, 200, 48, 10, 3, 24, 0},    /* a partial row tile, shared expert narrower */
        {4, 200, 48, 10, 3, 0, 1},      /* no shared expert */
        {2, 128, 16, 40, 4, 64, 1},     /* shared expert wider than the routed ones */
    };
    for (size_t i = 0; i < sizeof moe / sizeof moe[0]; i++) test_moe_block(&moe[i]);
    CHECK(qd_cuda_moe_block_supported(65, 2048, 512, 512, 256, 8) == 0);
    CHECK(qd_cuda_moe_block_supported(64, 2048, 512, 512, 256, 8) == 1);
    /* the MoE table: the block up to 16 tokens (measured, cuda_moe.h) */
    CHECK(qd_cuda_moe_block_preferred(16, 2048, 512, 512, 256, 8) == 1);
    CHECK(qd_cuda_moe_block_preferred(17, 2048, 512, 512, 256, 8) == 0);
    CHECK(qd_cuda_moe_block_preferred(1, 2048, 512, 512, 512, 10) == 1);
    qd_cuda_blas_destroy(blas);
    return qd_test_finish("test_cuda_fused");
}

#else /* no CUDA compiler: nothing to test */

int main(void) { return qd_test_skip("test_cuda_fused", "built without CUDA"); }

#endif
