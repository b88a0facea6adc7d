/* test_backend_ops's rows for the matmuls (bf16, f16 and f32 weights, fixed-order, fp32
 * activations), silu_mul, the MoE routing and experts, the linear table: each op's generator,
 * naive reference and backend runners, its shape cases and its row (backend_ops.h). */
#include "backend_ops.h"

/* ---------------------------------------------------------------- matmul
 * y[n][rows] = x[n][cols] . W^T. mode: weight dtype (0 F32, 1 BF16, 2 F16).
 * x is bf16-representable (the GPU's activations are bf16). */
enum { MM_W, MM_X };
static void mm_make_common(op_data *d, qd_test_rng *rng, int x_bf16) {
    const op_case *c = d->c;
    float *w = in_rand(d, MM_W, (size_t)c->rows * c->cols, 0.5f, 0, rng);
    for (size_t i = 0; i < d->nf[MM_W]; i++)
        w[i] = c->mode == 1 ? bf16_round(w[i]) : c->mode == 2 ? qd_f16_to_f32(qd_f32_to_f16(w[i])) : w[i];
    in_rand(d, MM_X, (size_t)c->n * c->cols, 1.0f, x_bf16, rng);
    d->n_out = (size_t)c->n * c->rows;
}
static void mm_make(op_data *d, qd_test_rng *rng) { mm_make_common(d, rng, 1); }
static void mm_make_xf32(op_data *d, qd_test_rng *rng) { mm_make_common(d, rng, 0); }
static void mm_naive(const op_data *d, double *out) {
    const op_case *c = d->c;
    for (int t = 0; t < c->n; t++)
        for (int r = 0; r < c->rows; r++) {
            double s = 0;
            for (int k = 0; k < c->cols; k++) s += (double)d->f[MM_W][(size_t)r * c->cols + k] * d->f[MM_X][(size_t)t * c->cols + k];
            out[(size_t)t * c->rows + r] = s;
        }
}
/* the weight in its storage dtype (exact: the values are representable) */
static qd_weight mm_weight(const op_data *d, void **store) {
    const op_case *c = d->c;
    const size_t n = d->nf[MM_W];
    const qd_dtype dt = c->mode == 1 ? QD_DTYPE_BF16 : c->mode == 2 ? QD_DTYPE_F16 : QD_DTYPE_F32;
    if (dt == QD_DTYPE_F32) {
        *store = NULL;
        return (qd_weight){.dtype = dt, .rows = c->rows, .cols = c->cols, .data = d->f[MM_W]};
    }
    uint16_t *h = xmalloc(2 * n);
    for (size_t i = 0; i < n; i++) h[i] = dt == QD_DTYPE_BF16 ? qd_f32_to_bf16(d->f[MM_W][i]) : qd_f32_to_f16(d->f[MM_W][i]);
    *store = h;
    return (qd_weight){.dtype = dt, .rows = c->rows, .cols = c->cols, .data = h};
}
static int mm_cpu_mode(const op_data *d, float *out, int fixed_order) {
    void *store;
    const qd_weight w = mm_weight(d, &store);
    qd_cpu_matmul_mode(g_pool, &w, d->f[MM_X], d->c->n, out, fixed_order);
    free(store);
    return OP_OK;
}
static int mm_cpu(const op_data *d, float *out) {
    void *store;
    const qd_weight w = mm_weight(d, &store);
    qd_cpu_matmul(g_pool, &w, d->f[MM_X], d->c->n, out);
    free(store);
    return OP_OK;
}
static int mm_cpu_fixed(const op_data *d, float *out) { return mm_cpu_mode(d, out, 1); }

#ifdef QD_HAVE_CUDA
/* which: 0 qd_cuda_matmul (GEMV / cuBLAS), 1 qd_cuda_matmul_invariant, 2 qd_cuda_matmul_xf32 */
static int mm_cuda_any(const op_data *d, float *out, int which) {
    const op_case *c = d->c;
    if (c->mode != 1) return OP_SKIP;                  /* the GPU takes bf16 weights only */
    if (which == 1 && c->cols % 8) return OP_SKIP;     /* the invariant GEMM needs cols % 8 == 0 */
    dev_arena a = {.ok = 1};
    const int64_t ldy = c->rows + 3;                   /* padded output rows */
    uint16_t *W = da_bf16(&a, d->f[MM_W], d->nf[MM_W]);
    float *y = da_alloc(&a, NULL, 4 * (size_t)c->n * ldy);
    if (a.ok) {
        if (which == 2) {
            float *x = da_f32(&a, d->f[MM_X], d->nf[MM_X]);
            if (a.ok) DA_ST(&a, qd_cuda_matmul_xf32(W, c->rows, c->cols, x, c->cols, c->n, y, ldy, NULL));
        } else {
            uint16_t *x = da_bf16(&a, d->f[MM_X], d->nf[MM_X]);
            if (a.ok && which == 0) DA_ST(&a, qd_cuda_matmul(g_blas, W, c->rows, c->cols, x, c->cols, c->n, y, ldy, 0));
            if (a.ok && which == 1)
                DA_ST(&a, qd_cuda_matmul_invariant(W, c->rows, c->cols, x, c->cols, c->n, y, ldy, 0, NULL));
        }
    }
    float *yh = xmalloc(4 * (size_t)c->n * ldy);
    da_get_f32(&a, yh, y, (size_t)c->n * ldy);
    if (a.ok)
        for (int t = 0; t < c->n; t++) memcpy(out + (size_t)t * c->rows, yh + (size_t)t * ldy, 4 * (size_t)c->rows);
    free(yh);
    return da_done(&a);
}
static int mm_cuda(const op_data *d, float *out) { return mm_cuda_any(d, out, 0); }
static int mm_cuda_fixed(const op_data *d, float *out) { return mm_cuda_any(d, out, 1); }
static int mm_cuda_xf32(const op_data *d, float *out) { return mm_cuda_any(d, out, 2); }
#endif

/* ---------------------------------------------------------------- silu_mul
 * SwiGLU: n rows of gate|up (2 cols) -> silu(gate) * up. */
enum { SM_GU };
static void sm_make(op_data *d, qd_test_rng *rng) {
    in_rand(d, SM_GU, 2 * (size_t)d->c->n * d->c->cols, 2.0f, 0, rng);
    d->n_out = (size_t)d->c->n * d->c->cols;
}
static void sm_naive(const op_data *d, double *out) {
    const int I = d->c->cols;
    for (int r = 0; r < d->c->n; r++)
        for (int i = 0; i < I; i++) {
            const float *gu = d->f[SM_GU] + (size_t)r * 2 * I;
            out[(size_t)r * I + i] = naive_silu(gu[i]) * gu[I + i];
        }
}
static int sm_cpu(const op_data *d, float *out) {
    const int I = d->c->cols;
    for (int r = 0; r < d->c->n; r++)
        qd_cpu_silu_mul(d->f[SM_GU] + (size_t)r * 2 * I, d->f[SM_GU] + (size_t)r * 2 * I + I, I, out + (size_t)r * I);
    return OP_OK;
}
#ifdef QD_HAVE_CUDA
static int sm_cuda(const op_data *d, float *out) {
    dev_arena a = {.ok = 1};
    float *dgu = da_f32(&a, d->f[SM_GU], d->nf[SM_GU]);
    uint16_t *dact = da_alloc(&a, NULL, 2 * d->n_out);
    if (a.ok) DA_ST(&a, qd_cuda_silu_mul(dgu, d->c->n, d->c->cols, dact, NULL));
    da_get_bf16(&a, out, dact, d->n_out);
    return da_done(&a);
}
#endif

/* ---------------------------------------------------------------- moe_route
 * Softmax over E = cols logits and top-k (k = K), ties to the lower expert;
 * mode 1 renormalises. n tokens. Logits are multiples of 1/64 with a quarter copied
 * from another expert (exact ties), row 0 all equal: distinct logits give clearly
 * distinct probabilities, so the selection must match exactly.
 * Output [selected ids (as floats) | weights]. */
enum { MR_L };
static void mr_make(op_data *d, qd_test_rng *rng) {
    const op_case *c = d->c;
    const int E = c->cols;
    float *l = in_zero(d, MR_L, (size_t)c->n * E);
    for (int t = 0; t < c->n; t++) {
        float *r = l + (size_t)t * E;
        for (int e = 0; e < E; e++) r[e] = (float)floor(qd_test_uniform(rng) * 256.0) / 64.0f;
        for (int e = 0; e < E; e++)
            if (qd_test_uniform(rng) < -0.5f) r[e] = r[qd_test_next(rng) % (uint64_t)E];
    }
    for (int e = 0; e < E; e++) l[e] = 0.5f;
    d->n_out = 2 * (size_t)c->n * c->K;
}
static void mr_naive(const op_data *d, double *out) {
    const op_case *c = d->c;
    const int E = c->cols, k = c->K;
    int *taken = xmalloc(sizeof(int) * (size_t)E);
    for (int t = 0; t < c->n; t++) {
        const float *l = d->f[MR_L] + (size_t)t * E;
        double mx = -INFINITY, den = 0, sum = 0;
        for (int e = 0; e < E; e++) mx = fmax(mx, l[e]);
        for (int e = 0; e < E; e++) den += exp((double)l[e] - mx);
        for (int e = 0; e < E; e++) taken[e] = 0;
        for (int j = 0; j < k; j++) { /* the largest logit not taken, the lowest index among equals */
            int best = -1;
            for (int e = 0; e < E; e++)
                if (!taken[e] && (best < 0 || l[e] > l[best])) best = e;
            taken[best] = 1;
            out[(size_t)t * k + j] = best;
            out[(size_t)(c->n + t) * k + j] = exp((double)l[best] - mx) / den;
            sum += out[(size_t)(c->n + t) * k + j];
        }
        if (c->mode)
            for (int j = 0; j < k; j++) out[(size_t)(c->n + t) * k + j] /= sum;
    }
    free(taken);
}
static int mr_cpu(const op_data *d, float *out) {
    const op_case *c = d->c;
    const int E = c->cols, k = c->K;
    float *prob = xmalloc(4 * (size_t)E);
    int32_t *sel = xmalloc(4 * (size_t)k);
    for (int t = 0; t < c->n; t++) {
        qd_moe_route_token(d->f[MR_L] + (size_t)t * E, E, k, c->mode, sel, out + (size_t)(c->n + t) * k, prob);
        for (int j = 0; j < k; j++) out[(size_t)t * k + j] = (float)sel[j];
    }
    free(prob);
    free(sel);
    return OP_OK;
}
#ifdef QD_HAVE_CUDA
static int mr_cuda(const op_data *d, float *out) {
    const op_case *c = d->c;
    const int E = c->cols, k = c->K, ld = E + 5; /* logits rows at a wider stride */
    float *lh = nan_floats((size_t)c->n * ld);
    for (int t = 0; t < c->n; t++) memcpy(lh + (size_t)t * ld, d->f[MR_L] + (size_t)t * E, 4 * (size_t)E);
    dev_arena a = {.ok = 1};
    float *dl = da_f32(&a, lh, (size_t)c->n * ld), *dw = da_alloc(&a, NULL, 4 * (size_t)c->n * k);
    int32_t *dsel = da_alloc(&a, NULL, 4 * (size_t)c->n * k);
    if (a.ok) DA_ST(&a, qd_cuda_moe_route(dl, ld, c->n, E, k, c->mode, dsel, dw, NULL));
    int32_t *sel = xmalloc(4 * (size_t)c->n * k);
    if (a.ok) DA_ST(&a, qd_cuda_sync());
    if (a.ok) DA_ST(&a, qd_cuda_memcpy_d2h(sel, dsel, 4 * (size_t)c->n * k));
    if (a.ok)
        for (size_t i = 0; i < (size_t)c->n * k; i++) out[i] = (float)sel[i];
    da_get_f32(&a, out + (size_t)c->n * k, dw, (size_t)c->n * k);
    free(lh);
    free(sel);
    return da_done(&a);
}
#endif

/* ---------------------------------------------------------------- moe_experts
 * The routed experts of n tokens added into y: y += sum_j w_j down_e(silu(gate_e x) * up_e x).
 * cols = H, dim = I, heads = E, K = k; mode 1: the CUDA batch-invariant mode.
 * x and the stacked weights ([E][2I][H] gate|up, [E][H][I] down) bf16-representable;
 * routing from random logits through the CPU router. Output y [n][H]. */
enum { ME_X, ME_GU, ME_DN, ME_W, ME_Y0 };
static void me_make(op_data *d, qd_test_rng *rng) {
    const op_case *c = d->c;
    const int H = c->cols, I = c->dim, E = c->heads, k = c->K;
    in_rand(d, ME_X, (size_t)c->n * H, 1.0f, 1, rng);
    /* unit variance per output: gate/up . x ~ N(0, 1), down . act ~ O(1) */
    in_rand(d, ME_GU, (size_t)E * 2 * I * H, 1.0f / sqrtf((float)H), 1, rng);
    in_rand(d, ME_DN, (size_t)E * H * I, 1.0f / sqrtf((float)I), 1, rng);
    in_rand(d, ME_Y0, (size_t)c->n * H, 0.5f, 0, rng);
    float *w = in_zero(d, ME_W, (size_t)c->n * k), *lg = xmalloc(4 * (size_t)E), *prob = xmalloc(4 * (size_t)E);
    int32_t *sel = in_idx(d, 0, (size_t)c->n * k);
    for (int t = 0; t < c->n; t++) {
        for (int e = 0; e < E; e++) lg[e] = qd_test_normal(rng) + (e < 2 ? 2.0f : 0.0f); /* skew: shared experts */
        qd_moe_route_token(lg, E, k, 1, sel + (size_t)t * k, w + (size_t)t * k, prob);
    }
    free(lg);
    free(prob);
    d->n_out = (size_t)c->n * H;
}
static void me_naive(const op_data *d, double *out) {
    const op_case *c = d->c;
    const int H = c->cols, I = c->dim, k = c->K;
    double *act = xmalloc(8 * (size_t)I);
    for (int t = 0; t < c->n; t++) {
        const float *x = d->f[ME_X] + (size_t)t * H;
        for (int h = 0; h < H; h++) out[(size_t)t * H + h] = d->f[ME_Y0][(size_t)t * H + h];
        for (int j = 0; j < k; j++) {
            const int e = d->i[0][(size_t)t * k + j];
            const float *gu = d->f[ME_GU] + (size_t)e * 2 * I * H, *dn = d->f[ME_DN] + (size_t)e * H * I;
            for (int i = 0; i < I; i++) {
                double g = 0, u = 0;
                for (int h = 0; h < H; h++) {
                    g += (double)gu[(size_t)i * H + h] * x[h];
                    u += (double)gu[(size_t)(I + i) * H + h] * x[h];
                }
                act[i] = naive_silu(g) * u;
            }
            for (int h = 0; h < H; h++) {
                double o = 0;
                for (int i = 0; i < I; i++) o += (double)dn[(size_t)h * I + i] * act[i];
                out[(size_t)t * H + h] += d->f[ME_W][(size_t)t * k + j] * o;
            }
        }
    }
    free(act);
}
/* the composition of CPU ops: per (token, slot) gate|up product, SwiGLU, down product */
static int me_cpu(const op_data *d, float *out) {
    const op_case *c = d->c;
    const int H = c->cols, I = c->dim, E = c->heads, k = c->K;
    uint16_t *gub = xmalloc(2 * d->nf[ME_GU]), *dnb = xmalloc(2 * d->nf[ME_DN]);
    for (size_t i = 0; i < d->nf[ME_GU]; i++) gub[i] = qd_f32_to_bf16(d->f[ME_GU][i]);
    for (size_t i = 0; i < d->nf[ME_DN]; i++) dnb[i] = qd_f32_to_bf16(d->f[ME_DN][i]);
    float *gu = xmalloc(8 * (size_t)I), *act = xmalloc(4 * (size_t)I), *y = xmalloc(4 * (size_t)H);
    memcpy(out, d->f[ME_Y0], 4 * (size_t)c->n * H);
    (void)E;
    for (int t = 0; t < c->n; t++)
        for (int j = 0; j < k; j++) {
            const int e = d->i[0][(size_t)t * k + j];
            const qd_weight wgu = {.dtype = QD_DTYPE_BF16, .rows = 2 * I, .cols = H, .data = gub + (size_t)e * 2 * I * H};
            const qd_weight wdn = {.dtype = QD_DTYPE_BF16, .rows = H, .cols = I, .data = dnb + (size_t)e * H * I};
            qd_cpu_matmul(g_pool, &wgu, d->f[ME_X] + (size_t)t * H, 1, gu);
            qd_cpu_silu_mul(gu, gu + I, I, act);
            qd_cpu_matmul(g_pool, &wdn, act, 1, y);
            const float w = d->f[ME_W][(size_t)t * k + j];
            for (int h = 0; h < H; h++) out[(size_t)t * H + h] += w * y[h];
        }
    free(gub); free(dnb); free(gu); free(act); free(y);
    return OP_OK;
}
#ifdef QD_HAVE_CUDA
static int me_cuda(const op_data *d, float *out) {
    const op_case *c = d->c;
    const int H = c->cols, I = c->dim, E = c->heads, k = c->K;
    dev_arena a = {.ok = 1};
    uint16_t *dx = da_bf16(&a, d->f[ME_X], d->nf[ME_X]), *dgu = da_bf16(&a, d->f[ME_GU], d->nf[ME_GU]);
    uint16_t *ddn = da_bf16(&a, d->f[ME_DN], d->nf[ME_DN]);
    int32_t *dsel = da_i32(&a, d->i[0], d->ni[0]);
    float *dw = da_f32(&a, d->f[ME_W], d->nf[ME_W]), *dy = da_f32(&a, d->f[ME_Y0], d->nf[ME_Y0]);
    const size_t wb = qd_cuda_moe_work_bytes(c->n, H, I, E, k);
    void *work = da_alloc(&a, NULL, wb);
    if (a.ok) {
        qd_cuda_moe_args ma = {.n = c->n, .H = H, .I = I, .E = E, .k = k, .d_x = dx, .d_sel = dsel, .d_w = dw, .d_gate_up = dgu, .d_down = ddn, .d_y = dy, .d_work = work, .cublas = NULL, .invariant = c->mode & 1};
        DA_ST(&a, qd_cuda_moe_experts(&ma, NULL));
    }
    da_get_f32(&a, out, dy, d->n_out);
    return da_done(&a);
}
#endif

/* ---------------------------------------------------------------- linear
 * A product whose input is made on the fly (the CUDA fused GEMV / materialise + GEMM
 * table, qd_cuda_linear): y[n][rows] = W . x with W bf16 [rows][cols] and x by mode & 3:
 *   0 (BF16)    x given (bf16-representable);
 *   1 (RMSNORM) x = zero-centred rmsnorm(h) of fp32 rows;
 *   2 (GATED)   x = gated rmsnorm(o, z) per head of dim (o bf16-representable);
 *   3 (SILU)    x = silu(gate) * up of fp32 gate|up rows.
 * mode >> 2 picks the CUDA path: 0 the table's (qd_cuda_linear), 1 fused, 2 plain,
 * 3 batch-invariant (qd_cuda_linear_path; a path that refuses the shape is a skip).
 * The CPU runner composes the CPU ops (unrounded fp32 x); the GPU rounds x to bf16,
 * which its tolerance allows. */
enum { LN_W, LN_A, LN_B, LN_NW };
static void ln_make(op_data *d, qd_test_rng *rng) {
    const op_case *c = d->c;
    const size_t nx = (size_t)c->n * c->cols;
    in_rand(d, LN_W, (size_t)c->rows * c->cols, 0.5f, 1, rng);
    switch (c->mode & 3) {
    case 0: in_rand(d, LN_A, nx, 1.0f, 1, rng); break;
    case 1: in_rand(d, LN_A, nx, 1.5f, 0, rng); in_rand(d, LN_NW, (size_t)c->cols, 0.3f, 0, rng); break;
    case 2:
        in_rand(d, LN_A, nx, 1.0f, 1, rng);
        in_rand(d, LN_B, nx, 2.0f, 0, rng);
        in_rand(d, LN_NW, (size_t)c->dim, 1.0f, 0, rng);
        break;
    default: in_rand(d, LN_A, 2 * nx, 2.0f, 0, rng); break;
    }
    d->n_out = (size_t)c->n * c->rows;
}
static void ln_x_naive(const op_data *d, int t, double *x) {
    const op_case *c = d->c;
    const int C = c->cols;
    const float *a = d->f[LN_A];
    switch (c->mode & 3) {
    case 0: for (int i = 0; i < C; i++) x[i] = a[(size_t)t * C + i]; break;
    case 1: naive_rmsnorm(a + (size_t)t * C, C, d->f[LN_NW], 1.0, RN_EPS, x); break;
    case 2:
        for (int h = 0; h < C / c->dim; h++) {
            const size_t o = (size_t)t * C + (size_t)h * c->dim;
            naive_rmsnorm(a + o, c->dim, d->f[LN_NW], 0.0, RN_EPS, x + (size_t)h * c->dim);
            for (int e = 0; e < c->dim; e++) x[(size_t)h * c->dim + e] *= naive_silu(d->f[LN_B][o + e]);
        }
        break;
    default:
        for (int i = 0; i < C; i++) x[i] = naive_silu(a[(size_t)t * 2 * C + i]) * a[(size_t)t * 2 * C + C + i];
    }
}
static void ln_naive(const op_data *d, double *out) {
    const op_case *c = d->c;
    double *x = xmalloc(8 * (size_t)c->cols);
    for (int t = 0; t < c->n; t++) {
        ln_x_naive(d, t, x);
        for (int r = 0; r < c->rows; r++) {
            double s = 0;
            for (int i = 0; i < c->cols; i++) s += (double)d->f[LN_W][(size_t)r * c->cols + i] * x[i];
            out[(size_t)t * c->rows + r] = s;
        }
    }
    free(x);
}
static int ln_cpu(const op_data *d, float *out) {
    const op_case *c = d->c;
    const int C = c->cols;
    float *x = xmalloc(4 * (size_t)c->n * C);
    const float *a = d->f[LN_A];
    switch (c->mode & 3) {
    case 0: memcpy(x, a, 4 * (size_t)c->n * C); break;
    case 1: qd_cpu_rmsnorm(a, c->n, C, C, d->f[LN_NW], 1.0f, RN_EPS, x, C); break;
    case 2: qd_cpu_gated_rmsnorm(a, d->f[LN_B], d->f[LN_NW], c->n, C / c->dim, c->dim, RN_EPS, x); break;
    default:
        for (int t = 0; t < c->n; t++) qd_cpu_silu_mul(a + (size_t)t * 2 * C, a + (size_t)t * 2 * C + C, C, x + (size_t)t * C);
    }
    uint16_t *wb = xmalloc(2 * d->nf[LN_W]);
    for (size_t i = 0; i < d->nf[LN_W]; i++) wb[i] = qd_f32_to_bf16(d->f[LN_W][i]);
    const qd_weight w = {.dtype = QD_DTYPE_BF16, .rows = c->rows, .cols = C, .data = wb};
    qd_cpu_matmul(g_pool, &w, x, c->n, out);
    free(x);
    free(wb);
    return OP_OK;
}
#ifdef QD_HAVE_CUDA
static int ln_cuda(const op_data *d, float *out) {
    const op_case *c = d->c;
    const int C = c->cols;
    const int64_t ldy = c->rows + 3;
    dev_arena a = {.ok = 1};
    qd_cuda_lin_in in;
    memset(&in, 0, sizeof in);
    const int kind = c->mode & 3, path = c->mode >> 2;
    in.kind = kind == 0 ? QD_LIN_BF16 : kind == 1 ? QD_LIN_RMSNORM : kind == 2 ? QD_LIN_GATED : QD_LIN_SILU;
    in.eps = RN_EPS;
    switch (c->mode & 3) {
    case 0: in.x = da_bf16(&a, d->f[LN_A], d->nf[LN_A]); in.ldx = C; break;
    case 1: in.h = da_f32(&a, d->f[LN_A], d->nf[LN_A]); in.w = da_f32(&a, d->f[LN_NW], (size_t)C); break;
    case 2:
        in.o = da_bf16(&a, d->f[LN_A], d->nf[LN_A]);
        in.z = da_f32(&a, d->f[LN_B], d->nf[LN_B]);
        in.ldz = C;
        in.dv = c->dim;
        in.w = da_f32(&a, d->f[LN_NW], (size_t)c->dim);
        break;
    default: in.gu = da_f32(&a, d->f[LN_A], d->nf[LN_A]);
    }
    qd_cuda_lin_out o = {.W = da_bf16(&a, d->f[LN_W], d->nf[LN_W]), .rows = c->rows, .y = da_alloc(&a, NULL, 4 * (size_t)c->n * ldy), .ldy = ldy};
    uint16_t *scratch = da_alloc(&a, NULL, 2 * (size_t)c->n * C);
    if (a.ok && path == 0) DA_ST(&a, qd_cuda_linear(g_blas, &in, C, c->n, &o, 1, 0, scratch, NULL));
    if (a.ok && path != 0) {
        const qd_status st = qd_cuda_linear_path(path, g_blas, &in, C, c->n, &o, 1, 0, scratch, NULL);
        if (st == QD_ERR_UNSUPPORTED) { /* the named path does not take this shape */
            da_done(&a);
            return OP_SKIP;
        }
        DA_ST(&a, st);
    }
    float *yh = xmalloc(4 * (size_t)c->n * ldy);
    da_get_f32(&a, yh, o.y, (size_t)c->n * ldy);
    if (a.ok)
        for (int t = 0; t < c->n; t++) memcpy(out + (size_t)t * c->rows, yh + (size_t)t * ldy, 4 * (size_t)c->rows);
    free(yh);
    return da_done(&a);
}
#endif

/* ============================================================== the rows ======= */

/* matmul: n, rows x cols, mode dtype (0 F32, 1 BF16, 2 F16): GEMV (n 1), GEMV up to 8,
 * GEMM above; sizes off 8/16/32/64, 1-row and 1-column products */
static const op_case MM_CASES[] = {
    {.n = 1, .rows = 1, .cols = 8, .mode = 1},      {.n = 1, .rows = 1, .cols = 1, .mode = 0},
    {.n = 1, .rows = 37, .cols = 200, .mode = 1},   {.n = 1, .rows = 64, .cols = 63, .mode = 2},
    {.n = 2, .rows = 77, .cols = 130, .mode = 1},   {.n = 3, .rows = 513, .cols = 1000, .mode = 1},
    {.n = 8, .rows = 96, .cols = 2048, .mode = 1},  {.n = 9, .rows = 100, .cols = 264, .mode = 1},
    {.n = 9, .rows = 33, .cols = 129, .mode = 2},   {.n = 17, .rows = 77, .cols = 136, .mode = 1},
    {.n = 33, .rows = 65, .cols = 31, .mode = 0},   {.n = 65, .rows = 300, .cols = 512, .mode = 1},
    {.n = 130, .rows = 17, .cols = 257, .mode = 2},
};

/* fixed_order (batch-invariant): the same sums at every n */
static const op_case MMF_CASES[] = {
    {.n = 1, .rows = 37, .cols = 64, .mode = 1},   {.n = 2, .rows = 130, .cols = 200, .mode = 1},
    {.n = 5, .rows = 9, .cols = 1000, .mode = 1},  {.n = 33, .rows = 64, .cols = 13, .mode = 1},
    {.n = 130, .rows = 40, .cols = 200, .mode = 1}, {.n = 7, .rows = 50, .cols = 96, .mode = 2},
    {.n = 64, .rows = 129, .cols = 2056, .mode = 1}, {.n = 3, .rows = 31, .cols = 65, .mode = 0},
};

/* fp32 activations on bf16 weights (the MoE router) */
static const op_case MMX_CASES[] = {
    {.n = 1, .rows = 257, .cols = 2048, .mode = 1}, {.n = 70, .rows = 9, .cols = 100, .mode = 1},
    {.n = 4, .rows = 512, .cols = 33, .mode = 1},   {.n = 1, .rows = 1, .cols = 7, .mode = 1},
};

/* silu_mul: n rows of cols */
static const op_case SM_CASES[] = {{.n = 5, .cols = 70}, {.n = 1, .cols = 512}, {.n = 3, .cols = 1}, {.n = 2, .cols = 1023}};

/* moe_route: n tokens, cols = E, K = k, mode renorm (k = E, k = 32, E off powers of two) */
static const op_case MR_CASES[] = {
    {.n = 5, .cols = 8, .K = 2},        {.n = 3, .cols = 256, .K = 8, .mode = 1}, {.n = 7, .cols = 512, .K = 10, .mode = 1},
    {.n = 2, .cols = 4, .K = 4},        {.n = 33, .cols = 60, .K = 4},            {.n = 2, .cols = 1000, .K = 32, .mode = 1},
};

/* moe_experts: n tokens, cols = H, dim = I, heads = E, K = k; mode 1 invariant.
 * n up to 64 takes the CUDA decode path, above it the grouped GEMMs */
static const op_case ME_CASES[] = {
    {.n = 1, .cols = 200, .dim = 48, .heads = 8, .K = 2},   {.n = 3, .cols = 256, .dim = 64, .heads = 16, .K = 16},
    {.n = 17, .cols = 128, .dim = 96, .heads = 32, .K = 10}, {.n = 65, .cols = 64, .dim = 32, .heads = 4, .K = 3},
    {.n = 130, .cols = 72, .dim = 40, .heads = 6, .K = 2},   {.n = 5, .cols = 128, .dim = 64, .heads = 8, .K = 4, .mode = 1},
};

/* linear: n rows, rows x cols, mode = kind + 4 * CUDA path, dim the gated head dim;
 * n <= 8 may take the fused GEMV, above cuBLAS */
static const op_case LN_CASES[] = {
    {.n = 1, .rows = 512, .cols = 2048, .mode = 1}, {.n = 4, .rows = 37, .cols = 1000, .mode = 1},
    {.n = 12, .rows = 64, .cols = 128, .mode = 1},  {.n = 2, .rows = 256, .cols = 1024, .dim = 128, .mode = 2},
    {.n = 3, .rows = 200, .cols = 512, .mode = 3},  {.n = 9, .rows = 100, .cols = 264, .mode = 0},
    {.n = 1, .rows = 40, .cols = 72, .dim = 24, .mode = 2},
    {.n = 2, .rows = 96, .cols = 512, .mode = 1 + 4},   {.n = 2, .rows = 96, .cols = 512, .mode = 1 + 8},
    {.n = 5, .rows = 70, .cols = 256, .mode = 3 + 4},   {.n = 5, .rows = 70, .cols = 256, .mode = 3 + 12},
    {.n = 3, .rows = 64, .cols = 384, .dim = 128, .mode = 2 + 12}, {.n = 20, .rows = 33, .cols = 136, .mode = 1 + 12},
};

const op_row OP_MATMUL = {
    "matmul", MM_CASES, NCASES(MM_CASES), mm_make, mm_naive, {mm_cpu, CU(mm_cuda)},
    {T_CPU_SUM, {1e-5, 1e-6, 3e-4, 0, 0}}};

const op_row OP_MATMUL_FIXED_ORDER = {
    "matmul_fixed_order", MMF_CASES, NCASES(MMF_CASES), mm_make, mm_naive, {mm_cpu_fixed, CU(mm_cuda_fixed)},
    {T_CPU_SUM, {1e-5, 1e-6, 3e-4, 0, 0}}};

const op_row OP_MATMUL_XF32 = {
    "matmul_xf32", MMX_CASES, NCASES(MMX_CASES), mm_make_xf32, mm_naive, {mm_cpu, CU(mm_cuda_xf32)},
    {T_CPU_SUM, {1e-5, 1e-6, 3e-4, 0, 0}}};

const op_row OP_SILU_MUL = {
    "silu_mul", SM_CASES, NCASES(SM_CASES), sm_make, sm_naive, {sm_cpu, CU(sm_cuda)},
    {T_CPU_EW, T_BF16}};

const op_row OP_MOE_ROUTE = {
    "moe_route", MR_CASES, NCASES(MR_CASES), mr_make, mr_naive, {mr_cpu, CU(mr_cuda)},
    {{1e-5, 1e-8, 0, 0, 0}, {1e-5, 1e-8, 0, 0, 0}}};

const op_row OP_MOE_EXPERTS = {
    "moe_experts", ME_CASES, NCASES(ME_CASES), me_make, me_naive, {me_cpu, CU(me_cuda)},
    {T_CPU_SUM, {1e-3, 1e-6, 3e-2, 0, 5e-3}}};

const op_row OP_LINEAR = {
    "linear", LN_CASES, NCASES(LN_CASES), ln_make, ln_naive, {ln_cpu, CU(ln_cuda)},
    {T_CPU_SUM, {1e-5, 1e-6, 2e-2, 0, 1e-2}}};
