/* test_backend_ops's rows for the norms: RMSNorm, the residual add with RMSNorm, the gated
 * RMSNorm: each op's generator, naive reference and backend runners, its shape cases and its row
 * (backend_ops.h). */
#include "backend_ops.h"

/* ---------------------------------------------------------------- rmsnorm
 * n rows of dim = cols at row stride cols + 3, weight offset mode (0 plain, 1 zero-centred). */
enum { RN_X, RN_W };
static void rn_make(op_data *d, qd_test_rng *rng) {
    const op_case *c = d->c;
    in_rand(d, RN_X, (size_t)c->n * (c->cols + 3), 2.0f, 0, rng);
    in_rand(d, RN_W, (size_t)c->cols, 0.5f, 0, rng);
    d->n_out = (size_t)c->n * c->cols;
}
static void rn_naive(const op_data *d, double *out) {
    const op_case *c = d->c;
    for (int r = 0; r < c->n; r++)
        naive_rmsnorm(d->f[RN_X] + (size_t)r * (c->cols + 3), c->cols, d->f[RN_W], c->mode, RN_EPS, out + (size_t)r * c->cols);
}
static int rn_cpu(const op_data *d, float *out) {
    const op_case *c = d->c; /* y at a wider stride too, gathered back */
    float *y = nan_floats((size_t)c->n * (c->cols + 1));
    qd_cpu_rmsnorm(d->f[RN_X], c->n, c->cols, c->cols + 3, d->f[RN_W], (float)c->mode, RN_EPS, y, c->cols + 1);
    for (int r = 0; r < c->n; r++) memcpy(out + (size_t)r * c->cols, y + (size_t)r * (c->cols + 1), 4 * (size_t)c->cols);
    free(y);
    return OP_OK;
}
#ifdef QD_HAVE_CUDA
/* qd_cuda_add_rmsnorm without the add (d_y NULL): the bf16 output */
static int rn_cuda(const op_data *d, float *out) {
    const op_case *c = d->c;
    if (c->mode != 1) return OP_SKIP; /* the GPU norm is zero-centred only */
    const int H = c->cols;
    float *hc = xmalloc(4 * (size_t)c->n * H);
    for (int r = 0; r < c->n; r++) memcpy(hc + (size_t)r * H, d->f[RN_X] + (size_t)r * (H + 3), 4 * (size_t)H);
    dev_arena a = {.ok = 1};
    float *dh = da_f32(&a, hc, (size_t)c->n * H), *dw = da_f32(&a, d->f[RN_W], H);
    uint16_t *dx = da_alloc(&a, NULL, 2 * (size_t)c->n * H);
    if (a.ok) DA_ST(&a, qd_cuda_add_rmsnorm(dh, NULL, dw, RN_EPS, c->n, H, NULL, dx, NULL, NULL));
    da_get_bf16(&a, out, dx, (size_t)c->n * H);
    free(hc);
    return da_done(&a);
}
#endif

/* ------------------------------------------------------------ add_rmsnorm
 * The residual add and zero-centred norm of the decoder: n source rows of H = cols.
 * mode 0: h += y for every row, then x = norm(h): output [h | x];
 * mode 1: no add, output rows gather source rows (the last-row norm before logits):
 *         output x[i] = norm(h[rows[i]]) for `rows` output rows. */
enum { AR_H, AR_Y, AR_W };
static void ar_make(op_data *d, qd_test_rng *rng) {
    const op_case *c = d->c;
    in_rand(d, AR_H, (size_t)c->n * c->cols, 1.5f, 0, rng);
    in_rand(d, AR_Y, (size_t)c->n * c->cols, 2.0f, 0, rng);
    in_rand(d, AR_W, (size_t)c->cols, 0.3f, 0, rng);
    if (c->mode == 1) {
        int32_t *rows = in_idx(d, 0, (size_t)c->rows);
        for (int i = 0; i < c->rows; i++) rows[i] = (int32_t)(qd_test_next(rng) % (uint64_t)c->n);
        d->n_out = (size_t)c->rows * c->cols;
    } else {
        d->n_out = 2 * (size_t)c->n * c->cols;
    }
}
static void ar_naive(const op_data *d, double *out) {
    const op_case *c = d->c;
    const int H = c->cols;
    float *h = xmalloc(4 * (size_t)H);
    if (c->mode == 1) {
        for (int i = 0; i < c->rows; i++)
            naive_rmsnorm(d->f[AR_H] + (size_t)d->i[0][i] * H, H, d->f[AR_W], 1.0, RN_EPS, out + (size_t)i * H);
    } else {
        for (int r = 0; r < c->n; r++) {
            for (int e = 0; e < H; e++) {
                /* the sum is rounded to fp32: the residual stream is fp32 */
                h[e] = d->f[AR_H][(size_t)r * H + e] + d->f[AR_Y][(size_t)r * H + e];
                out[(size_t)r * H + e] = h[e];
            }
            naive_rmsnorm(h, H, d->f[AR_W], 1.0, RN_EPS, out + ((size_t)c->n + r) * H);
        }
    }
    free(h);
}
static int ar_cpu(const op_data *d, float *out) {
    const op_case *c = d->c;
    const int H = c->cols;
    if (c->mode == 1) {
        for (int i = 0; i < c->rows; i++)
            qd_cpu_rmsnorm(d->f[AR_H] + (size_t)d->i[0][i] * H, 1, H, H, d->f[AR_W], 1.0f, RN_EPS, out + (size_t)i * H, H);
    } else {
        for (size_t i = 0; i < (size_t)c->n * H; i++) out[i] = d->f[AR_H][i] + d->f[AR_Y][i];
        qd_cpu_rmsnorm(out, c->n, H, H, d->f[AR_W], 1.0f, RN_EPS, out + (size_t)c->n * H, H);
    }
    return OP_OK;
}
#ifdef QD_HAVE_CUDA
/* the fp32 copy (d_xf) and the updated residual; the bf16 x is the rmsnorm row's */
static int ar_cuda(const op_data *d, float *out) {
    const op_case *c = d->c;
    const int H = c->cols, nr = c->mode == 1 ? c->rows : c->n;
    dev_arena a = {.ok = 1};
    float *dh = da_f32(&a, d->f[AR_H], (size_t)c->n * H), *dw = da_f32(&a, d->f[AR_W], H);
    float *dy = c->mode == 1 ? NULL : da_f32(&a, d->f[AR_Y], (size_t)c->n * H);
    int32_t *drows = c->mode == 1 ? da_i32(&a, d->i[0], (size_t)c->rows) : NULL;
    uint16_t *dx = da_alloc(&a, NULL, 2 * (size_t)nr * H);
    float *dxf = da_alloc(&a, NULL, 4 * (size_t)nr * H);
    if (a.ok) DA_ST(&a, qd_cuda_add_rmsnorm(dh, dy, dw, RN_EPS, nr, H, drows, dx, dxf, NULL));
    if (c->mode == 1) {
        da_get_f32(&a, out, dxf, (size_t)nr * H);
    } else {
        da_get_f32(&a, out, dh, (size_t)c->n * H);
        da_get_f32(&a, out + (size_t)c->n * H, dxf, (size_t)c->n * H);
    }
    return da_done(&a);
}
#endif

/* ---------------------------------------------------------- gated_rmsnorm
 * u = rmsnorm(o) * w * silu(z) per value head: n tokens, heads = hv, dim = dv.
 * o bf16-representable (the GDN kernels' output). */
enum { GN_O, GN_Z, GN_W };
static void gn_make(op_data *d, qd_test_rng *rng) {
    const op_case *c = d->c;
    const size_t n = (size_t)c->n * c->heads * c->dim;
    in_rand(d, GN_O, n, 1.0f, 1, rng);
    in_rand(d, GN_Z, n, 2.0f, 0, rng);
    in_rand(d, GN_W, (size_t)c->dim, 1.0f, 0, rng);
    d->n_out = n;
}
static void gn_naive(const op_data *d, double *out) {
    const op_case *c = d->c;
    const int dv = c->dim;
    for (size_t r = 0; r < (size_t)c->n * c->heads; r++) {
        naive_rmsnorm(d->f[GN_O] + r * dv, dv, d->f[GN_W], 0.0, RN_EPS, out + r * dv);
        for (int e = 0; e < dv; e++) out[r * dv + e] *= naive_silu(d->f[GN_Z][r * dv + e]);
    }
}
static int gn_cpu(const op_data *d, float *out) {
    const op_case *c = d->c;
    qd_cpu_gated_rmsnorm(d->f[GN_O], d->f[GN_Z], d->f[GN_W], c->n, c->heads, c->dim, RN_EPS, out);
    return OP_OK;
}
#ifdef QD_HAVE_CUDA
static int gn_cuda(const op_data *d, float *out) {
    const op_case *c = d->c;
    const int W = c->heads * c->dim, zs = W + 7; /* z rows at a wider stride, as the layer reads them */
    float *zh = nan_floats((size_t)c->n * zs);
    for (int r = 0; r < c->n; r++) memcpy(zh + (size_t)r * zs, d->f[GN_Z] + (size_t)r * W, 4 * (size_t)W);
    dev_arena a = {.ok = 1};
    uint16_t *dob = da_bf16(&a, d->f[GN_O], d->nf[GN_O]);
    float *dz = da_f32(&a, zh, (size_t)c->n * zs), *dw = da_f32(&a, d->f[GN_W], c->dim);
    uint16_t *du = da_alloc(&a, NULL, 2 * d->n_out);
    if (a.ok) DA_ST(&a, qd_cuda_gated_rmsnorm(dob, dz, zs, dw, RN_EPS, c->n, c->heads, c->dim, du, NULL));
    da_get_bf16(&a, out, du, d->n_out);
    free(zh);
    return da_done(&a);
}
#endif

/* ============================================================== the rows ======= */

/* rmsnorm: n rows of cols, mode = weight offset */
static const op_case RN_CASES[] = {
    {.n = 5, .cols = 1, .mode = 0},  {.n = 5, .cols = 7, .mode = 1},    {.n = 1, .cols = 64, .mode = 1},
    {.n = 3, .cols = 129, .mode = 0}, {.n = 6, .cols = 333, .mode = 1}, {.n = 2, .cols = 2048, .mode = 1},
    {.n = 1, .cols = 5120, .mode = 1},
};

/* add_rmsnorm: n source rows of cols; mode 1 gathers `rows` output rows */
static const op_case AR_CASES[] = {
    {.n = 6, .cols = 333}, {.n = 1, .cols = 2048}, {.n = 4, .cols = 40},
    {.n = 9, .rows = 2, .cols = 333, .mode = 1}, {.n = 5, .rows = 5, .cols = 100, .mode = 1},
};

/* gated_rmsnorm: n tokens, heads x dim */
static const op_case GN_CASES[] = {
    {.n = 5, .heads = 3, .dim = 48}, {.n = 1, .heads = 32, .dim = 128}, {.n = 3, .heads = 5, .dim = 24},
    {.n = 2, .heads = 1, .dim = 7},  {.n = 4, .heads = 16, .dim = 129},
};

const op_row OP_RMSNORM = {
    "rmsnorm", RN_CASES, NCASES(RN_CASES), rn_make, rn_naive, {rn_cpu, CU(rn_cuda)},
    {T_CPU_EW, T_BF16}};

const op_row OP_ADD_RMSNORM = {
    "add_rmsnorm", AR_CASES, NCASES(AR_CASES), ar_make, ar_naive, {ar_cpu, CU(ar_cuda)},
    {T_CPU_EW, T_F32_EW}};

const op_row OP_GATED_RMSNORM = {
    "gated_rmsnorm", GN_CASES, NCASES(GN_CASES), gn_make, gn_naive, {gn_cpu, CU(gn_cuda)},
    {T_CPU_EW, T_BF16}};
