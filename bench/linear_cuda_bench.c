/* Benchmark behind the decode kernel tables: for every distinct projection of the
 * Qwen3.5-35B-A3B, Qwen3-Next-80B-A3B, Qwen3.5-27B and Qwen3.5-9B-shape configs
 * (bench/configs) at n = 1, 2, 4, 8 rows, qd_cuda_linear's two paths
 * (cuda_linear.h): the fused GEMV (x built in the kernel) and the plain one (the
 * norm / activation kernel, then the GEMV of gemm.cu); at n = 16, 32 the
 * accumulating products through cuBLAS with beta = 1 (the table) and through
 * cuBLAS into a scratch, then an add kernel; and the MoE block (moe_block.cu, three
 * launches) against the older path of cuda_forward.c's moe_layer (norm, router,
 * shared expert through qd_cuda_linear, sigmoid scale, top-k, the expert
 * kernels) at n = 1 .. 64 for the 35B-A3B and 80B expert shapes.
 *
 * The batch-invariant path (QD_LIN_PATH_INVARIANT: x materialised, then
 * gemm_invariant.cu) beside the table's path for the models' projections at n = 1,
 * 8, 32 and 2048 (RESULT inv: time, ratio invariant / table, weight GBps and, at
 * n = 1, the share of the HBM peak). `linear_cuda_bench tiles` times every tile of
 * the invariant product on bf16 x beside qd_cuda_matmul (the GEMV up to n = 8,
 * cuBLAS above) over n = 1 .. 2048: the measurements behind
 * qd_cuda_matmul_invariant_choice; `linear_cuda_bench chains` times the chain counts
 * S = 1 .. 32 on every matrix of the models: the measurements behind
 * qd_cuda_matmul_invariant_chains (neither part of the default run). The router part
 * (`linear_cuda_bench router`, in the default run) times the MoE router's two routes at
 * n = 128 .. 8192 (RESULT router): the measurements behind QD_CUDA_ROUTER_SPLIT_MIN_N.
 * `linear_cuda_bench linear MODEL [SHAPE]` runs the linear part on those shapes only
 * (e.g. `linear 27b gate_up`).
 *
 * Every timing is a CUDA graph replay on a created stream, how the engine runs
 * a decode step (no host launch cost; the fused kernels are programmatic
 * dependents of the kernel before them). A graph rotates over copies of the
 * weights (at least 512 MiB in all, or layers of experts) so that each call
 * streams its weights from HBM, as one layer of a real step does; activations
 * are small and stay in L2, as they do. Times are medians of 5 samples of
 * whole replays. GBps counts the weights one call must read (for the MoE: the
 * router, the shared expert and 3 I H bf16 per distinct expert expected under
 * uniform routing). Prints one RESULT line per measurement with the table's
 * choice and the faster path. Exits 77 without a GPU. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "backend/cuda/cuda_gdn.h"
#include "backend/cuda/cuda_device.h"
#include "backend/cuda/cuda_linear.h"
#include "backend/cuda/cuda_moe.h"
#include "backend/cuda/cuda_ops.h"

#define BENCH_NAME "linear_cuda_bench"
#include "cuda_bench_util.h"

#define ROTATE_BYTES ((size_t)512 << 20)
#define MIN_CALLS 16
#define NMAX 32      /* rows of the decode measurements */
#define NPF 2048     /* the prefill size of the invariant measurements; activation buffers hold NPF rows */
#define PF_CALLS 4   /* calls per graph at NPF: compute-bound, no need to rotate through weights */
#define EPS 1e-6f
#define DV 128       /* GDN value head dim of every config */

static void *g_stream;
static qd_cuda_blas *g_blas;
static double g_copy, g_hbm;

/* ------------------------------------------------------------------ timing */

/* Microseconds per call of a graph of ncalls calls f(ctx, 0 .. ncalls - 1) on g_stream
 * (cuda_bench_util.h); -1 when the path does not take the shape. */
static double time_calls(bench_call_fn f, void *ctx, int ncalls) { return bench_graph_us(g_stream, f, ctx, ncalls); }

static float *upload_f32(size_t n, float scale, float offset) {
    float *h = malloc(n * 4);
    if (!h) exit(1);
    for (size_t i = 0; i < n; i++) h[i] = offset + scale * urand();
    float *d = upload(h, n * 4);
    free(h);
    return d;
}

static uint16_t *dummy_bf16(size_t n, float scale, uint64_t seed) {
    uint16_t *d = upload(NULL, n * 2);
    TRY(qd_cuda_fill_dummy_bf16(d, (int64_t)n, scale, seed, g_stream));
    return d;
}

/* ------------------------------------------------------------- projections */

typedef struct lin_shape {
    const char *model, *name;
    int kind;
    int64_t cols;
    int n_out;
    int64_t rows[QD_LIN_MAX_OUT];
    int acc; /* the forward adds it into the residual */
} lin_shape;

static const lin_shape SHAPES[] = {
    /* Qwen3.5-35B-A3B and Qwen3-Next-80B-A3B (H = 2048, same attention and GDN) */
    {"35b+80b", "in_proj", QD_LIN_RMSNORM, 2048, 1, {12352}, 0},
    {"35b+80b", "out_proj", QD_LIN_GATED, 4096, 1, {2048}, 1},
    {"35b+80b", "qkv", QD_LIN_RMSNORM, 2048, 3, {8192, 512, 512}, 0},
    {"35b+80b", "o_proj", QD_LIN_BF16, 4096, 1, {2048}, 1},
    {"35b+80b", "sh_gate_up", QD_LIN_BF16, 2048, 1, {1024}, 0}, /* shared expert on the older MoE path */
    {"35b+80b", "sh_down", QD_LIN_SILU, 512, 1, {2048}, 0},
    {"35b", "lm_head", QD_LIN_RMSNORM, 2048, 1, {248320}, 0},
    {"80b", "lm_head", QD_LIN_RMSNORM, 2048, 1, {151936}, 0},
    /* Qwen3.5-27B (H = 5120) */
    {"27b", "in_proj", QD_LIN_RMSNORM, 5120, 1, {16480}, 0},
    {"27b", "out_proj", QD_LIN_GATED, 6144, 1, {5120}, 1},
    {"27b", "qkv", QD_LIN_RMSNORM, 5120, 3, {12288, 1024, 1024}, 0},
    {"27b", "o_proj", QD_LIN_BF16, 6144, 1, {5120}, 1},
    {"27b", "gate_up", QD_LIN_RMSNORM, 5120, 1, {34816}, 0},
    {"27b", "down", QD_LIN_SILU, 17408, 1, {5120}, 1},
    {"27b", "lm_head", QD_LIN_RMSNORM, 5120, 1, {248320}, 0},
    /* Qwen3.5-9B shape (H = 4096) */
    {"9b", "in_proj", QD_LIN_RMSNORM, 4096, 1, {12352}, 0},
    {"9b", "out_proj", QD_LIN_GATED, 4096, 1, {4096}, 1},
    {"9b", "qkv", QD_LIN_RMSNORM, 4096, 3, {8192, 1024, 1024}, 0},
    {"9b", "o_proj", QD_LIN_BF16, 4096, 1, {4096}, 1},
    {"9b", "gate_up", QD_LIN_RMSNORM, 4096, 1, {24576}, 0},
    {"9b", "down", QD_LIN_SILU, 12288, 1, {4096}, 1},
    {"9b", "lm_head", QD_LIN_RMSNORM, 4096, 1, {151936}, 0},
    /* a sweep of sizes between the models' (cols 4096: 8 to 96 MiB) */
    {"sweep", "rms_8M", QD_LIN_RMSNORM, 4096, 1, {1024}, 0},
    {"sweep", "rms_16M", QD_LIN_RMSNORM, 4096, 1, {2048}, 0},
    {"sweep", "rms_24M", QD_LIN_RMSNORM, 4096, 1, {3072}, 0},
    {"sweep", "rms_48M", QD_LIN_RMSNORM, 4096, 1, {6144}, 0},
    {"sweep", "rms_64M", QD_LIN_RMSNORM, 4096, 1, {8192}, 0},
    {"sweep", "rms_96M", QD_LIN_RMSNORM, 4096, 1, {12288}, 0},
    {"sweep", "gated_8M", QD_LIN_GATED, 4096, 1, {1024}, 1},
    {"sweep", "gated_24M", QD_LIN_GATED, 4096, 1, {3072}, 1},
    {"sweep", "gated_48M", QD_LIN_GATED, 6144, 1, {4096}, 1},
    {"sweep", "bf16_24M", QD_LIN_BF16, 4096, 1, {3072}, 1},
    {"sweep", "bf16_48M", QD_LIN_BF16, 6144, 1, {4096}, 1},
};

/* Activations shared by every shape (sized for the largest), as in a context. */
static float *a_h, *a_w, *a_z, *a_gu, *a_y[QD_LIN_MAX_OUT], *a_sy;
static uint16_t *a_x, *a_o, *a_scratch;

typedef struct lin_run {
    const lin_shape *s;
    qd_cuda_lin_in in;
    uint16_t *W;       /* copies of the n_out matrices, back to back */
    int64_t wcount;    /* elements of one copy */
    int copies, n, path, beta1;
} lin_run;

static void lin_outs(const lin_run *r, int i, qd_cuda_lin_out *out) {
    const uint16_t *W = r->W + (size_t)(i % r->copies) * (size_t)r->wcount;
    for (int j = 0; j < r->s->n_out; j++) {
        out[j].W = W;
        out[j].rows = r->s->rows[j];
        out[j].y = a_y[j];
        out[j].ldy = r->s->rows[j];
        W += r->s->rows[j] * r->s->cols;
    }
}

static qd_status lin_call(void *ctx, int i) {
    const lin_run *r = ctx;
    qd_cuda_lin_out out[QD_LIN_MAX_OUT] = {{0}};
    lin_outs(r, i, out);
    return qd_cuda_linear_path(r->path, g_blas, &r->in, r->s->cols, r->n, out, r->s->n_out, r->s->acc, a_scratch,
                               g_stream);
}

/* The alternative to cuBLAS with beta = 1 above n = 8 (the table's path): the product
 * into a scratch, then an add kernel (x materialised first, as the table does). */
static qd_status lin_call_scratch_add(void *ctx, int i) {
    const lin_run *r = ctx;
    const int64_t cols = r->s->cols;
    const qd_cuda_lin_in *in = &r->in;
    const uint16_t *x = in->x;
    qd_status s = QD_OK;
    if (in->kind == QD_LIN_RMSNORM)
        s = qd_cuda_add_rmsnorm(a_h, NULL, in->w, EPS, r->n, (int)cols, NULL, a_scratch, NULL, g_stream);
    else if (in->kind == QD_LIN_GATED)
        s = qd_cuda_gated_rmsnorm(in->o, in->z, in->ldz, in->w, EPS, r->n, (int)(cols / DV), DV, a_scratch, g_stream);
    else if (in->kind == QD_LIN_SILU)
        s = qd_cuda_silu_mul(in->gu, r->n, (int)cols, a_scratch, g_stream);
    if (s) return s;
    if (in->kind != QD_LIN_BF16) x = a_scratch;
    qd_cuda_lin_out out[QD_LIN_MAX_OUT] = {{0}};
    lin_outs(r, i, out);
    for (int j = 0; j < r->s->n_out && !s; j++) {
        s = qd_cuda_matmul(g_blas, out[j].W, out[j].rows, cols, x, cols, r->n, a_sy, out[j].rows, 0);
        if (!s) s = qd_cuda_add_f32(out[j].y, out[j].ldy, a_sy, out[j].rows, out[j].rows, r->n, g_stream);
    }
    return s;
}

static const char *kind_name(int k) {
    return k == QD_LIN_BF16 ? "bf16" : k == QD_LIN_RMSNORM ? "rmsnorm" : k == QD_LIN_GATED ? "gated" : "silu";
}

/* The shape's weights (rotated copies) and inputs; returns the calls per graph. */
static int lin_setup(lin_run *r, const lin_shape *s) {
    memset(r, 0, sizeof *r);
    r->s = s;
    for (int j = 0; j < s->n_out; j++) r->wcount += s->rows[j] * s->cols;
    const size_t wbytes = (size_t)r->wcount * 2;
    r->copies = (int)((ROTATE_BYTES + wbytes - 1) / wbytes);
    if (r->copies < 1) r->copies = 1;
    r->W = dummy_bf16((size_t)r->copies * (size_t)r->wcount, sqrtf(3.0f / (float)s->cols), 0x5eed + (uint64_t)s->cols);
    r->in.kind = s->kind;
    r->in.x = a_x;
    r->in.ldx = s->cols;
    r->in.h = a_h;
    r->in.w = a_w;
    r->in.eps = EPS;
    r->in.o = a_o;
    r->in.z = a_z;
    r->in.ldz = 2 * s->cols; /* the gate z is a slice of the in_proj rows */
    r->in.dv = DV;
    r->in.gu = a_gu;
    TRY(qd_cuda_sync());
    return r->copies * ((MIN_CALLS + r->copies - 1) / r->copies);
}

static void bench_shape(const lin_shape *s) {
    lin_run r;
    const int ncalls = lin_setup(&r, s);
    const size_t wbytes = (size_t)r.wcount * 2;
    const double mib = (double)wbytes / (1 << 20);
    static const int ns[4] = {1, 2, 4, 8};
    for (int k = 0; k < 4; k++) {
        r.n = ns[k];
        qd_cuda_lin_out out[QD_LIN_MAX_OUT] = {{0}};
        lin_outs(&r, 0, out);
        const int table = qd_cuda_linear_choice(&r.in, s->cols, r.n, out, s->n_out);
        double us[3] = {-1, -1, -1}, gbs[3] = {0, 0, 0};
        for (int p = QD_LIN_PATH_FUSED; p <= QD_LIN_PATH_PLAIN; p++) {
            r.path = p;
            us[p] = time_calls(lin_call, &r, ncalls);
            gbs[p] = us[p] > 0 ? (double)wbytes / (us[p] * 1e3) : 0;
        }
        /* fused_us=-1: the fused kernel does not take the shape (x over its shared memory) */
        const int best = us[QD_LIN_PATH_FUSED] > 0 && us[QD_LIN_PATH_FUSED] <= us[QD_LIN_PATH_PLAIN]
                             ? QD_LIN_PATH_FUSED : QD_LIN_PATH_PLAIN;
        printf("RESULT lin model=%s shape=%s kind=%s rows=%lld cols=%lld MiB=%.1f n=%d fused_us=%.2f fused_GBps=%.0f "
               "plain_us=%.2f plain_GBps=%.0f fused/plain=%.3f best=%s table=%s%s\n",
               s->model, s->name, kind_name(s->kind), (long long)(r.wcount / s->cols), (long long)s->cols, mib, r.n,
               us[1], gbs[1], us[2], gbs[2], us[1] / us[2], best == QD_LIN_PATH_FUSED ? "fused" : "plain",
               table == QD_LIN_PATH_FUSED ? "fused" : "plain", best == table ? "" : " MISMATCH");
        fflush(stdout);
    }
    /* above the GEMV's n: the accumulating products, cuBLAS beta = 1 (the table) vs scratch + add */
    if (s->acc && strcmp(s->model, "sweep") != 0) {
        for (int n = 16; n <= 32; n *= 2) {
            r.n = n;
            r.path = QD_LIN_PATH_TABLE;
            const double t = time_calls(lin_call, &r, ncalls);
            const double a = time_calls(lin_call_scratch_add, &r, ncalls);
            printf("RESULT acc model=%s shape=%s n=%d beta1_us=%.2f scratch_add_us=%.2f beta1/scratch_add=%.3f\n",
                   s->model, s->name, n, t, a, t / a);
            fflush(stdout);
        }
    }
    TRY(qd_cuda_sync());
    qd_cuda_free(r.W);
}

/* ---------------------------------------------------- batch-invariant path */

/* The invariant path beside the table's on one projection at n = 1, 8, 32 (weights
 * rotated, as above) and NPF (PF_CALLS calls: compute-bound). */
static void bench_invariant(const lin_shape *s) {
    lin_run r;
    const int ncalls = lin_setup(&r, s);
    const size_t wbytes = (size_t)r.wcount * 2;
    static const int ns[4] = {1, 8, 32, NPF};
    for (int k = 0; k < 4; k++) {
        r.n = ns[k];
        const int calls = r.n == NPF ? PF_CALLS : ncalls;
        r.path = QD_LIN_PATH_TABLE;
        const double t = time_calls(lin_call, &r, calls);
        r.path = QD_LIN_PATH_INVARIANT;
        const double v = time_calls(lin_call, &r, calls);
        const double gbs = (double)wbytes / (v * 1e3);
        char hbm[48] = "";
        if (r.n == 1) snprintf(hbm, sizeof hbm, " inv_HBM=%.0f%%", 100.0 * gbs / g_hbm);
        printf("RESULT inv model=%s shape=%s kind=%s MiB=%.1f n=%d table_us=%.2f inv_us=%.2f inv/table=%.3f "
               "inv_GBps=%.0f%s tile=%s S=%d\n",
               s->model, s->name, kind_name(s->kind), (double)wbytes / (1 << 20), r.n, t, v, v / t, gbs, hbm,
               qd_cuda_matmul_invariant_tile_name(qd_cuda_matmul_invariant_choice(s->rows[0], s->cols, r.n)),
               qd_cuda_matmul_invariant_chains(s->rows[0], s->cols));
        fflush(stdout);
    }
    TRY(qd_cuda_sync());
    qd_cuda_free(r.W);
}

/* Every tile of the invariant product on bf16 x, beside qd_cuda_matmul (tile -2);
 * chains: the shape's count when 0. */
typedef struct tile_run {
    int64_t rows, cols, wcount;
    int n, tile, copies, chains;
    uint16_t *W;
} tile_run;

static qd_status tile_call(void *ctx, int i) {
    const tile_run *r = ctx;
    const uint16_t *W = r->W + (size_t)(i % r->copies) * (size_t)r->wcount;
    if (r->tile == -2) return qd_cuda_matmul(g_blas, W, r->rows, r->cols, a_x, r->cols, r->n, a_y[0], r->rows, 0);
    return qd_cuda_matmul_invariant_chained(r->tile, r->chains, W, r->rows, r->cols, a_x, r->cols, r->n, a_y[0],
                                            r->rows, 0, g_stream);
}

static void tile_alloc(tile_run *r, int64_t rows, int64_t cols, uint64_t seed) {
    r->rows = rows;
    r->cols = cols;
    r->wcount = rows * cols;
    const size_t wbytes = (size_t)r->wcount * 2;
    r->copies = (int)((ROTATE_BYTES + wbytes - 1) / wbytes);
    r->W = dummy_bf16((size_t)r->copies * wbytes / 2, sqrtf(3.0f / (float)cols), seed);
    TRY(qd_cuda_sync());
}

/* The measurements behind qd_cuda_matmul_invariant_chains: every distinct matrix of
 * the models' projections, chain counts S = 1 .. 32, the tiles that take them, at
 * n = 1, 8, 32 (the decode tiles) and NPF (the prefill tiles, matrices below 128 MiB:
 * the larger ones keep one chain). RESULT chain lines: time, share of the HBM peak
 * (n = 1), ratio to the same tile at S = 1; RESULT chainbest: the fastest per S. */
static void bench_chains(void) {
    int64_t shp[64][2];
    int ns_ = 0;
    for (size_t i = 0; i < sizeof SHAPES / sizeof SHAPES[0]; i++) {
        if (!strcmp(SHAPES[i].model, "sweep")) continue;
        for (int j = 0; j < SHAPES[i].n_out; j++) {
            int dup = 0;
            for (int q = 0; q < ns_; q++) dup |= shp[q][0] == SHAPES[i].rows[j] && shp[q][1] == SHAPES[i].cols;
            if (!dup && ns_ < 64) {
                shp[ns_][0] = SHAPES[i].rows[j];
                shp[ns_][1] = SHAPES[i].cols;
                ns_++;
            }
        }
    }
    static const int nsz[] = {1, 8, 32, NPF};
    static const int Ss[] = {1, 2, 4, 8, 16, 32};
    for (int q = 0; q < ns_; q++) {
        tile_run r = {0};
        tile_alloc(&r, shp[q][0], shp[q][1], 0x7117 + (uint64_t)q);
        const size_t wbytes = (size_t)r.wcount * 2;
        const double mib = (double)wbytes / (1 << 20);
        const int ncalls = r.copies * ((MIN_CALLS + r.copies - 1) / r.copies);
        for (size_t k = 0; k < sizeof nsz / sizeof nsz[0]; k++) {
            r.n = nsz[k];
            if (r.n == NPF && mib >= 128) continue;
            if (r.n > 1 && mib >= 300) continue;
            const int calls = r.n == NPF ? PF_CALLS : ncalls;
            double base[32];
            for (int t = 0; t < 32; t++) base[t] = 0;
            for (size_t si = 0; si < sizeof Ss / sizeof Ss[0]; si++) {
                r.chains = Ss[si];
                if (r.chains > 1 && mib >= 300 && r.chains > 2) continue;
                double best = 1e30;
                int bt = -1;
                for (int t = 0; t < qd_cuda_matmul_invariant_tiles(); t++) {
                    const char *nm = qd_cuda_matmul_invariant_tile_name(t);
                    const int kgroups = strchr(nm, 'c') != NULL, big = !strncmp(nm, "w128", 4);
                    /* the tiles each size would take (the tiles part measured the others slower) */
                    if (r.n == NPF ? !big : big) continue;
                    if (r.n == 1 && !kgroups && t != 1) continue;
                    if (r.n == 8 && (kgroups ? strcmp(nm, "w16xt16c4") && strcmp(nm, "w16xt16c8") &&
                                                   strcmp(nm, "w32xt16c4")
                                             : t != 1))
                        continue;
                    if (r.n == 32 && (kgroups ? strncmp(nm, "w32xt32", 7) && strncmp(nm, "w16xt32", 7)
                                              : t != 2 && t != 4 && t != 1))
                        continue;
                    if (r.n > 1 && r.chains > 16) continue;
                    r.tile = t;
                    const double us = time_calls(tile_call, &r, calls);
                    if (r.chains == 1) base[t] = us;
                    if (us < best) {
                        best = us;
                        bt = t;
                    }
                    char hbm[32] = "";
                    if (r.n == 1) snprintf(hbm, sizeof hbm, " HBM=%.0f%%", 100.0 * wbytes / (us * 1e3) / g_hbm);
                    printf("RESULT chain rows=%lld cols=%lld MiB=%.1f n=%d S=%d tile=%s us=%.2f%s vsS1=%.3f\n",
                           (long long)r.rows, (long long)r.cols, mib, r.n, r.chains, nm, us, hbm,
                           base[t] > 0 ? us / base[t] : 0.0);
                    fflush(stdout);
                }
                printf("RESULT chainbest rows=%lld cols=%lld n=%d S=%d best=%s us=%.2f rule_S=%d\n", (long long)r.rows,
                       (long long)r.cols, r.n, r.chains, qd_cuda_matmul_invariant_tile_name(bt), best,
                       qd_cuda_matmul_invariant_chains(r.rows, r.cols));
                fflush(stdout);
            }
        }
        TRY(qd_cuda_sync());
        qd_cuda_free(r.W);
    }
}

static void bench_tiles(void) {
    static const int64_t shp[][2] = {{2048, 4096}, {12352, 2048}, {5120, 17408}, {34816, 5120}, {248320, 2048}};
    static const int ns[] = {1, 8, 16, 32, 64, 128, 512, NPF};
    for (size_t q = 0; q < sizeof shp / sizeof shp[0]; q++) {
        tile_run r = {0};
        tile_alloc(&r, shp[q][0], shp[q][1], 0x7117 + (uint64_t)q);
        const size_t wbytes = (size_t)r.wcount * 2;
        const int ncalls = r.copies * ((MIN_CALLS + r.copies - 1) / r.copies);
        for (size_t k = 0; k < sizeof ns / sizeof ns[0]; k++) {
            r.n = ns[k];
            const int calls = r.n >= 512 ? PF_CALLS : ncalls;
            r.tile = -2;
            const double ref = time_calls(tile_call, &r, calls);
            const int pick = qd_cuda_matmul_invariant_choice(r.rows, r.cols, r.n);
            double best = 1e30;
            int bt = -1;
            for (int t = 0; t < qd_cuda_matmul_invariant_tiles(); t++) {
                /* the narrow tiles re-read W once per 16-64 tokens: not for prefill */
                const char *nm = qd_cuda_matmul_invariant_tile_name(t);
                if (r.n >= 512 && strncmp(nm, "w128", 4)) continue;
                r.tile = t;
                const double us = time_calls(tile_call, &r, calls);
                if (us < best) {
                    best = us;
                    bt = t;
                }
                printf("RESULT tile rows=%lld cols=%lld MiB=%.1f n=%d tile=%s us=%.2f GBps=%.0f TFLOPs=%.1f "
                       "ref_us=%.2f tile/ref=%.3f%s\n",
                       (long long)r.rows, (long long)r.cols, (double)wbytes / (1 << 20), r.n,
                       qd_cuda_matmul_invariant_tile_name(t), us, (double)wbytes / (us * 1e3),
                       2.0 * (double)r.wcount * r.n / (us * 1e6), ref, us / ref, t == pick ? " (table)" : "");
                fflush(stdout);
            }
            printf("RESULT tilebest rows=%lld cols=%lld n=%d best=%s best_us=%.2f table=%s ref=%s ref_us=%.2f\n",
                   (long long)r.rows, (long long)r.cols, r.n, qd_cuda_matmul_invariant_tile_name(bt), best,
                   qd_cuda_matmul_invariant_tile_name(pick), r.n <= 8 ? "gemv" : "cublas", ref);
            fflush(stdout);
        }
        TRY(qd_cuda_sync());
        qd_cuda_free(r.W);
    }
}

/* --------------------------------------------------------------- MoE block */

typedef struct moe_shape {
    const char *model;
    int H, I, E, k, Is;
} moe_shape;

#define MOE_LAYERS 8

typedef struct moe_run {
    const moe_shape *m;
    int n, block;
    uint16_t *router[MOE_LAYERS], *gu[MOE_LAYERS], *dn[MOE_LAYERS], *sgu[MOE_LAYERS], *sdn[MOE_LAYERS];
    float *norm, *h, *xf, *logits, *selw, *sh_act, *sh_out, *ffn, *ys;
    uint16_t *x, *act;
    int32_t *sel, *cnt;
    void *work;
} moe_run;

static qd_status moe_call(void *ctx, int i) {
    const moe_run *r = ctx;
    const moe_shape *m = r->m;
    const int L = i % MOE_LAYERS, n = r->n, H = m->H, E = m->E, k = m->k;
    if (r->block) {
        const qd_cuda_moe_block_args a = {
            .n = n, .H = H, .I = m->I, .E = E, .k = k, .renorm = 1, .d_h = r->h, .d_norm = r->norm, .eps = EPS,
            .d_router = r->router[L], .d_gate_up = r->gu[L], .d_down = r->dn[L], .d_sh_gate_up = r->sgu[L],
            .d_sh_down = r->sdn[L], .I_s = m->Is, .d_x = r->x, .d_logits = r->logits, .d_sel = r->sel,
            .d_w = r->selw, .d_route_cnt = r->cnt, .d_sh_act = r->sh_act, .d_sh_out = r->sh_out, .d_work = r->work,
        };
        return qd_cuda_moe_block(&a, g_stream);
    }
    /* cuda_forward.c moe_layer, unsplit model, the path before the block */
    qd_status s;
    if ((s = qd_cuda_add_rmsnorm(r->h, NULL, r->norm, EPS, n, H, NULL, r->x, r->xf, g_stream)) ||
        (s = qd_cuda_matmul_xf32(r->router[L], E + 1, H, r->xf, H, n, r->logits, E + 1, g_stream)))
        return s;
    qd_cuda_lin_in x = {0};
    x.kind = QD_LIN_BF16;
    x.x = r->x;
    x.ldx = H;
    const qd_cuda_lin_out gu = {.W = r->sgu[L], .rows = 2 * (int64_t)m->Is, .y = r->ffn, .ldy = 2 * (int64_t)m->Is};
    if ((s = qd_cuda_linear(g_blas, &x, H, n, &gu, 1, 0, NULL, g_stream))) return s;
    qd_cuda_lin_in act = {0};
    act.kind = QD_LIN_SILU;
    act.gu = r->ffn;
    const qd_cuda_lin_out dn = {.W = r->sdn[L], .rows = H, .y = r->ys, .ldy = H};
    if ((s = qd_cuda_linear(g_blas, &act, m->Is, n, &dn, 1, 0, r->act, g_stream)) ||
        (s = qd_cuda_sigmoid_scale(r->h, r->ys, r->logits + E, E + 1, n, H, g_stream)) ||
        (s = qd_cuda_moe_route(r->logits, E + 1, n, E, k, 1, r->sel, r->selw, g_stream)))
        return s;
    const qd_cuda_moe_args a = {.n = n, .H = H, .I = m->I, .E = E, .k = k, .d_x = r->x, .d_sel = r->sel, .d_w = r->selw, .d_gate_up = r->gu[L], .d_down = r->dn[L], .d_y = r->h, .d_work = r->work, .cublas = NULL, .invariant = 0};
    return qd_cuda_moe_experts(&a, g_stream);
}

static void bench_moe(const moe_shape *m) {
    moe_run r = {0};
    r.m = m;
    const int H = m->H, I = m->I, E = m->E, k = m->k, Is = m->Is;
    for (int L = 0; L < MOE_LAYERS; L++) {
        const uint64_t sd = 0x3000 + 16 * (uint64_t)L;
        r.router[L] = dummy_bf16((size_t)(E + 1) * H, sqrtf(3.0f / H), sd);
        r.gu[L] = dummy_bf16((size_t)E * 2 * I * H, sqrtf(3.0f / H), sd + 1);
        r.dn[L] = dummy_bf16((size_t)E * H * I, sqrtf(3.0f / I), sd + 2);
        r.sgu[L] = dummy_bf16((size_t)2 * Is * H, sqrtf(3.0f / H), sd + 3);
        r.sdn[L] = dummy_bf16((size_t)H * Is, sqrtf(3.0f / Is), sd + 4);
    }
    const int N = 64;
    r.norm = upload_f32((size_t)H, 0.2f, 0.f);
    r.h = upload_f32((size_t)N * H, 1.f, 0.f);
    r.xf = upload(NULL, (size_t)N * H * 4);
    r.logits = upload(NULL, (size_t)N * (E + 1) * 4);
    r.selw = upload(NULL, (size_t)N * k * 4);
    r.sel = upload(NULL, (size_t)N * k * 4);
    r.cnt = upload(NULL, (size_t)N * 4);
    TRY(qd_cuda_memset(r.cnt, 0, (size_t)N * 4));
    r.sh_act = upload(NULL, (size_t)N * Is * 4);
    r.sh_out = upload(NULL, (size_t)N * H * 4);
    r.ffn = upload(NULL, (size_t)N * 2 * Is * 4);
    r.ys = upload(NULL, (size_t)N * H * 4);
    r.x = upload(NULL, (size_t)N * H * 2);
    r.act = upload(NULL, (size_t)N * Is * 2);
    r.work = upload(NULL, qd_cuda_moe_work_bytes(N, H, I, E, k));
    TRY(qd_cuda_sync());
    static const int ns[6] = {1, 4, 8, 16, 32, 64};
    for (int q = 0; q < 6; q++) {
        r.n = ns[q];
        const double distinct = E * (1.0 - pow(1.0 - (double)k / E, r.n));
        const double bytes = (distinct * 3.0 * I * H + (double)(E + 1) * H + 3.0 * Is * H) * 2;
        double us[2];
        for (int b = 0; b < 2; b++) {
            r.block = b;
            us[b] = time_calls(moe_call, &r, 2 * MOE_LAYERS);
        }
        const int pref = qd_cuda_moe_block_preferred(r.n, H, I, Is, E, k);
        const int best = us[1] <= us[0];
        printf("RESULT moe model=%s E=%d k=%d n=%d block_us=%.2f block_GBps=%.0f older_us=%.2f older_GBps=%.0f "
               "block/older=%.3f best=%s table=%s%s\n",
               m->model, E, k, r.n, us[1], bytes / (us[1] * 1e3), us[0], bytes / (us[0] * 1e3), us[1] / us[0],
               best ? "block" : "older", pref ? "block" : "older", best == pref ? "" : " MISMATCH");
        fflush(stdout);
    }
    TRY(qd_cuda_sync());
    for (int L = 0; L < MOE_LAYERS; L++) {
        qd_cuda_free(r.router[L]); qd_cuda_free(r.gu[L]); qd_cuda_free(r.dn[L]);
        qd_cuda_free(r.sgu[L]); qd_cuda_free(r.sdn[L]);
    }
    void *bufs[] = {r.norm, r.h, r.xf, r.logits, r.selw, r.sel, r.cnt, r.sh_act, r.sh_out, r.ffn, r.ys, r.x,
                    r.act, r.work};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) qd_cuda_free(bufs[i]);
}

/* ----------------------------------------------------------------- router */

/* The MoE router at prefill sizes (cuda_layer_ffn.c's table): norm + matmul_xf32's fp32
 * kernels against norm + the row in three bf16 parts through the tensor cores
 * (qd_cuda_matmul_split3), E + 1 logits (the shared expert's gate among them). */
typedef struct router_run {
    int64_t rows, cols, ldy; /* ldy: the model's logits stride (QD_CUDA_ROUTER_LD), rows rounded up to 8 */
    int n, split;
    uint16_t *W, *x, *xr;
    float *h, *norm, *xf, *y;
} router_run;

static qd_status router_call(void *ctx, int i) {
    (void)i;
    const router_run *r = ctx;
    const int H = (int)r->cols;
    qd_status s;
    if (r->split) {
        if ((s = qd_cuda_add_rmsnorm_split(r->h, NULL, r->norm, EPS, r->n, H, r->x, r->xr, g_stream))) return s;
        /* the model's call: every row of the padded weights (cuda_layer_ffn.c) */
        return qd_cuda_matmul_split3(g_blas, r->W, r->ldy, r->cols, r->x, H, r->xr, 2 * r->cols, r->n, r->y, r->ldy);
    }
    if ((s = qd_cuda_add_rmsnorm(r->h, NULL, r->norm, EPS, r->n, H, NULL, r->x, r->xf, g_stream))) return s;
    return qd_cuda_matmul_xf32(r->W, r->rows, r->cols, r->xf, H, r->n, r->y, r->ldy, g_stream);
}

static void bench_router(void) {
    static const struct { const char *model; int64_t rows, cols; } shapes[] = {
        {"35b", 257, 2048}, {"80b", 513, 2048}, {"122b", 257, 3072}};
    static const int ns[] = {128, 256, 512, 1024, 2048, 8192};
    const int NR = 8192;
    for (size_t m = 0; m < sizeof shapes / sizeof shapes[0]; m++) {
        router_run r = {.rows = shapes[m].rows, .cols = shapes[m].cols, .ldy = (shapes[m].rows + 7) / 8 * 8};
        const size_t H = (size_t)r.cols;
        r.W = dummy_bf16((size_t)r.ldy * H, sqrtf(3.0f / (float)H), 0x5000 + m);
        r.h = upload_f32((size_t)NR * H, 1.f, 0.f);
        r.norm = upload_f32(H, 0.2f, 0.f);
        r.xf = upload(NULL, (size_t)NR * H * 4);
        r.xr = upload(NULL, (size_t)NR * H * 4);
        r.x = upload(NULL, (size_t)NR * H * 2);
        r.y = upload(NULL, (size_t)NR * r.ldy * 4);
        for (size_t q = 0; q < sizeof ns / sizeof ns[0]; q++) {
            r.n = ns[q];
            double us[2];
            for (int b = 0; b < 2; b++) {
                r.split = b;
                us[b] = time_calls(router_call, &r, 8);
            }
            const int pick = r.n >= QD_CUDA_ROUTER_SPLIT_MIN_N, best = us[1] < us[0];
            printf("RESULT router model=%s rows=%lld cols=%lld n=%d fp32_us=%.2f split3_us=%.2f split3/fp32=%.3f "
                   "best=%s table=%s%s\n",
                   shapes[m].model, (long long)r.rows, (long long)r.cols, r.n, us[0], us[1], us[1] / us[0],
                   best ? "split3" : "fp32", pick ? "split3" : "fp32", best == pick ? "" : " MISMATCH");
            fflush(stdout);
        }
        TRY(qd_cuda_sync());
        void *bufs[] = {r.W, r.h, r.norm, r.xf, r.xr, r.x, r.y};
        for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) qd_cuda_free(bufs[i]);
    }
}

int main(int argc, char **argv) {
    if (qd_cuda_device_count() <= 0) {
        printf(BENCH_NAME ": skipped: no CUDA device\n");
        return 77;
    }
    /* parts: linear (the table's paths), invariant, router, moe; default all four; tiles and chains only when named */
    const char *part = argc > 1 ? argv[1] : "";
    const int all = !*part, do_lin = all || !strcmp(part, "linear"), do_inv = all || !strcmp(part, "invariant"),
              do_moe = all || !strcmp(part, "moe"), do_router = all || !strcmp(part, "router"),
              do_tiles = !strcmp(part, "tiles"),
              do_chains = !strcmp(part, "chains");
    char name[128];
    int sms = 0;
    TRY(qd_cuda_device_info(name, sizeof name, &sms));
    TRY(qd_cuda_stream_create(&g_stream));
    TRY(qd_cuda_blas_create(&g_blas, g_stream));
    g_copy = copy_bw();
    {
        int dev = 0, clk = 0, bus = 0; /* peak HBM: kHz x 2 (double data rate) x bus bytes */
        cudaGetDevice(&dev);
        cudaDeviceGetAttribute(&clk, cudaDevAttrMemoryClockRate, dev);
        cudaDeviceGetAttribute(&bus, cudaDevAttrGlobalMemoryBusWidth, dev);
        g_hbm = clk > 0 && bus > 0 ? 2.0 * clk * 1e3 * (bus / 8) / 1e9 : 4800.0;
    }
    printf("device: %s, %d SMs\nRESULT copy_GBps=%.0f (read + write; a weight stream reads only) hbm_peak_GBps=%.0f\n",
           name, sms, g_copy, g_hbm);
    if (do_lin || do_inv || do_tiles || do_chains) {
        int64_t maxc = 0, maxr = 0;
        for (size_t i = 0; i < sizeof SHAPES / sizeof SHAPES[0]; i++) {
            maxc = SHAPES[i].cols > maxc ? SHAPES[i].cols : maxc;
            for (int j = 0; j < SHAPES[i].n_out; j++) maxr = SHAPES[i].rows[j] > maxr ? SHAPES[i].rows[j] : maxr;
        }
        const size_t N = do_inv || do_tiles || do_chains ? NPF : NMAX;
        a_h = upload_f32(N * maxc, 1.f, 0.f);
        a_w = upload_f32((size_t)maxc, 0.2f, 0.f);
        a_z = upload_f32(N * 2 * maxc, 2.f, 0.f);
        a_gu = upload_f32(N * 2 * maxc, 2.f, 0.f);
        a_x = dummy_bf16(N * maxc, 1.f, 11);
        a_o = dummy_bf16(N * maxc, 1.f, 12);
        a_scratch = upload(NULL, N * maxc * 2);
        for (int j = 0; j < QD_LIN_MAX_OUT; j++) {
            a_y[j] = upload(NULL, N * maxr * 4);
            TRY(qd_cuda_memset(a_y[j], 0, N * maxr * 4));
        }
        a_sy = upload(NULL, (size_t)NMAX * maxr * 4);
        if (do_lin) /* `linear MODEL [SHAPE]`: those shapes only */
            for (size_t i = 0; i < sizeof SHAPES / sizeof SHAPES[0]; i++)
                if ((argc < 3 || !strcmp(argv[2], SHAPES[i].model)) && (argc < 4 || !strcmp(argv[3], SHAPES[i].name)))
                    bench_shape(&SHAPES[i]);
        if (do_inv)
            for (size_t i = 0; i < sizeof SHAPES / sizeof SHAPES[0]; i++)
                if (strcmp(SHAPES[i].model, "sweep") != 0) bench_invariant(&SHAPES[i]);
        if (do_tiles) bench_tiles();
        if (do_chains) bench_chains();
        void *bufs[] = {a_h, a_w, a_z, a_gu, a_x, a_o, a_scratch, a_y[0], a_y[1], a_y[2], a_sy};
        for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) qd_cuda_free(bufs[i]);
    }
    if (do_router) bench_router();
    if (do_moe) {
        static const moe_shape moe[] = {{"35b", 2048, 512, 256, 8, 512}, {"80b", 2048, 512, 512, 10, 512}};
        for (int i = 0; i < 2; i++) bench_moe(&moe[i]);
    }
    qd_cuda_blas_destroy(g_blas);
    qd_cuda_stream_destroy(g_stream);
    return 0;
}
