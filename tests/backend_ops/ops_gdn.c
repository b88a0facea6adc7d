/* test_backend_ops's rows for the Gated DeltaNet ops: the causal conv, the heads' L2 norm, the
 * gates, the fused inputs, the delta rule (recurrent, batched, chunked): each op's generator,
 * naive reference and backend runners, its shape cases and its row (backend_ops.h). */
#include "backend_ops.h"
#include "qd_test_gdn.h"

/* -------------------------------------------------------------- conv1d_silu
 * Causal depthwise conv over n tokens of C = cols channels (rows at stride C + 5),
 * window K, with a state of the last K-1 inputs: output [y | new state]. */
enum { CV_X, CV_W, CV_S };
static void cv_make(op_data *d, qd_test_rng *rng) {
    const op_case *c = d->c;
    in_rand(d, CV_X, (size_t)c->n * (c->cols + 5), 1.0f, 0, rng);
    in_rand(d, CV_W, (size_t)c->cols * c->K, 0.5f, 0, rng);
    in_rand(d, CV_S, (size_t)c->cols * (c->K - 1), 1.0f, 0, rng);
    d->n_out = (size_t)c->n * c->cols + (size_t)c->cols * (c->K - 1);
}
/* The conv of one span over its state, in double: window t covers positions t..t+K-1
 * of [state (K-1) | x (T)]. Writes y rows at stride ys and the new state. Shared with
 * the gdn_inputs reference. */
static void naive_conv(const float *x, int T, int C, int64_t xs, const float *w, int K, const float *state,
                       double *y, int64_t ys, double *new_state) {
    for (int ch = 0; ch < C; ch++) {
        for (int t = 0; t < T; t++) {
            double acc = 0;
            for (int j = 0; j < K; j++) {
                const int p = t + j; /* index into [state | x] */
                const double v = p < K - 1 ? state[(size_t)ch * (K - 1) + p] : x[(size_t)(p - (K - 1)) * xs + ch];
                acc += (double)w[(size_t)ch * K + j] * v;
            }
            y[(size_t)t * ys + ch] = naive_silu(acc);
        }
        for (int j = 0; j < K - 1; j++) {
            const int p = T + j;
            new_state[(size_t)ch * (K - 1) + j] =
                p < K - 1 ? state[(size_t)ch * (K - 1) + p] : x[(size_t)(p - (K - 1)) * xs + ch];
        }
    }
}
static void cv_naive(const op_data *d, double *out) {
    const op_case *c = d->c;
    naive_conv(d->f[CV_X], c->n, c->cols, c->cols + 5, d->f[CV_W], c->K, d->f[CV_S], out, c->cols,
               out + (size_t)c->n * c->cols);
}
static int cv_cpu(const op_data *d, float *out) {
    const op_case *c = d->c;
    const size_t ns = (size_t)c->cols * (c->K - 1);
    float *st = out + (size_t)c->n * c->cols;
    memcpy(st, d->f[CV_S], 4 * ns); /* updated in place */
    qd_cpu_conv1d_silu(d->f[CV_X], c->n, c->cols, c->cols + 5, d->f[CV_W], c->K, st, out);
    return OP_OK;
}

/* -------------------------------------------------------------- l2norm_heads
 * n tokens of heads x dim at row stride heads*dim + 2; mode 1 scales by dim^-0.5 (q). */
enum { L2_X };
#define L2_EPS 1e-6f
static float l2_scale(const op_case *c) { return c->mode ? 1.0f / sqrtf((float)c->dim) : 1.0f; }
static void l2_make(op_data *d, qd_test_rng *rng) {
    const op_case *c = d->c;
    in_rand(d, L2_X, (size_t)c->n * (c->heads * c->dim + 2), 1.0f, 0, rng);
    d->n_out = (size_t)c->n * c->heads * c->dim;
}
static void naive_l2(const float *x, int dim, double eps, double scale, double *y) {
    double ss = 0;
    for (int i = 0; i < dim; i++) ss += (double)x[i] * x[i];
    const double f = scale / sqrt(ss + eps);
    for (int i = 0; i < dim; i++) y[i] = x[i] * f;
}
static void l2_naive(const op_data *d, double *out) {
    const op_case *c = d->c;
    const int W = c->heads * c->dim;
    for (int t = 0; t < c->n; t++)
        for (int h = 0; h < c->heads; h++)
            naive_l2(d->f[L2_X] + (size_t)t * (W + 2) + (size_t)h * c->dim, c->dim, L2_EPS, l2_scale(c),
                     out + (size_t)t * W + (size_t)h * c->dim);
}
static int l2_cpu(const op_data *d, float *out) {
    const op_case *c = d->c;
    const int W = c->heads * c->dim;
    float *x = xmalloc(4 * d->nf[L2_X]); /* in place: on a copy */
    memcpy(x, d->f[L2_X], 4 * d->nf[L2_X]);
    qd_cpu_l2norm_heads(x, c->n, c->heads, c->dim, W + 2, L2_EPS, l2_scale(c));
    for (int t = 0; t < c->n; t++) memcpy(out + (size_t)t * W, x + (size_t)t * (W + 2), 4 * (size_t)W);
    free(x);
    return OP_OK;
}

/* ---------------------------------------------------------------- gdn_gates
 * n tokens, heads = hv: g = -exp(A_log) softplus(a + dt_bias), beta = sigmoid(b);
 * a, b rows at stride hv + 3 (slices of the projection). Output [g | beta]. */
enum { GT_A, GT_B, GT_ALOG, GT_DT };
static void gt_make(op_data *d, qd_test_rng *rng) {
    const op_case *c = d->c;
    in_rand(d, GT_A, (size_t)c->n * (c->heads + 3), 3.0f, 0, rng); /* wide: both softplus branches */
    in_rand(d, GT_B, (size_t)c->n * (c->heads + 3), 3.0f, 0, rng);
    in_rand(d, GT_ALOG, (size_t)c->heads, 1.0f, 0, rng);
    in_rand(d, GT_DT, (size_t)c->heads, 1.0f, 0, rng);
    d->n_out = 2 * (size_t)c->n * c->heads;
}
static double naive_softplus(double x) { return x > 30 ? x : log1p(exp(x)); }
/* gates of n rows (a, b at strides), shared with the gdn_inputs reference */
static void naive_gates(const float *a, int64_t as, const float *b, int64_t bs, int n, int hv, const float *A_log,
                        const float *dt, double *g, double *beta) {
    for (int t = 0; t < n; t++)
        for (int h = 0; h < hv; h++) {
            g[(size_t)t * hv + h] = -exp((double)A_log[h]) * naive_softplus((double)a[t * as + h] + dt[h]);
            beta[(size_t)t * hv + h] = naive_sigmoid(b[t * bs + h]);
        }
}
static void gt_naive(const op_data *d, double *out) {
    const op_case *c = d->c;
    naive_gates(d->f[GT_A], c->heads + 3, d->f[GT_B], c->heads + 3, c->n, c->heads, d->f[GT_ALOG], d->f[GT_DT], out,
                out + (size_t)c->n * c->heads);
}
static int gt_cpu(const op_data *d, float *out) {
    const op_case *c = d->c;
    qd_cpu_gdn_gates(d->f[GT_A], c->heads + 3, d->f[GT_B], c->heads + 3, c->n, c->heads, d->f[GT_ALOG], d->f[GT_DT],
                     out, out + (size_t)c->n * c->heads);
    return OP_OK;
}

/* --------------------------------------------------------------- gdn_inputs
 * The GDN layer's inputs of a ragged batch (the CUDA kernel fuses conv + SiLU, the q/k
 * L2 norms and the gates; the CPU runner composes the CPU ops). kv_heads = hk,
 * heads = hv, dim = dk, dim2 = dv, K = conv window, spans = lens; each span's conv
 * state is a slot of a pool of n_spans + 2 (shuffled). The projection row holds the
 * C = 2 hk dk + hv dv conv inputs, then b, then a, then 3 spare floats.
 * Output [q | k | v | g | beta | state pool]. */
enum { GI_X, GI_W, GI_S, GI_ALOG, GI_DT };
typedef struct gi_dims {
    int hk, hv, dk, dv, K, C, W, n, slots, kd, vd;
} gi_dims;
static gi_dims gi_dims_of(const op_case *c) {
    gi_dims g = {c->kv_heads, c->heads, c->dim, c->dim2, c->K, 0, 0, span_total(c), c->n_spans + 2, 0, 0};
    g.kd = g.hk * g.dk;
    g.vd = g.hv * g.dv;
    g.C = 2 * g.kd + g.vd;
    g.W = g.C + 2 * g.hv + 3;
    return g;
}
static void gi_make(op_data *d, qd_test_rng *rng) {
    const gi_dims g = gi_dims_of(d->c);
    float *x = in_rand(d, GI_X, (size_t)g.n * g.W, 1.0f, 0, rng);
    for (int r = 0; r < g.n; r++) /* the gates' inputs at the scale of real projections */
        for (int i = g.C; i < g.W; i++) x[(size_t)r * g.W + i] *= 2.0f;
    in_rand(d, GI_W, (size_t)g.C * g.K, 0.5f, 0, rng);
    in_rand(d, GI_S, (size_t)g.slots * g.C * (g.K - 1), 1.0f, 0, rng);
    in_rand(d, GI_ALOG, (size_t)g.hv, 1.0f, 0, rng);
    in_rand(d, GI_DT, (size_t)g.hv, 1.0f, 0, rng);
    shuffle(in_idx(d, 0, (size_t)g.slots), g.slots, rng); /* span s uses slot i[0][s] */
    d->n_out = (size_t)g.n * (2 * g.kd + g.vd + 2 * g.hv) + (size_t)g.slots * g.C * (g.K - 1);
}
static void gi_naive(const op_data *d, double *out) {
    const op_case *c = d->c;
    const gi_dims g = gi_dims_of(c);
    const size_t per = (size_t)g.C * (g.K - 1);
    double *conv = xmalloc(8 * (size_t)g.n * g.C), *st = xmalloc(8 * per + 8);
    double *q = out, *k = q + (size_t)g.n * g.kd, *v = k + (size_t)g.n * g.kd, *gg = v + (size_t)g.n * g.vd;
    double *beta = gg + (size_t)g.n * g.hv, *pool_out = beta + (size_t)g.n * g.hv;
    for (size_t i = 0; i < (size_t)g.slots * per; i++) pool_out[i] = d->f[GI_S][i];
    for (int s = 0; s < c->n_spans; s++) {
        const int t0 = span_first(c, s), sl = d->i[0][s];
        naive_conv(d->f[GI_X] + (size_t)t0 * g.W, c->lens[s], g.C, g.W, d->f[GI_W], g.K, d->f[GI_S] + (size_t)sl * per,
                   conv + (size_t)t0 * g.C, g.C, st);
        for (size_t i = 0; i < per; i++) pool_out[(size_t)sl * per + i] = st[i];
    }
    for (int t = 0; t < g.n; t++) {
        for (int j = 0; j < 2 * g.hk; j++) { /* q heads then k heads: L2-normalised (q scaled) */
            double ss = 0;
            const double *x = conv + (size_t)t * g.C + (size_t)j * g.dk;
            for (int i = 0; i < g.dk; i++) ss += x[i] * x[i];
            const double f = (j < g.hk ? 1.0 / sqrt((double)g.dk) : 1.0) / sqrt(ss + L2_EPS);
            double *dst = j < g.hk ? q + (size_t)t * g.kd + (size_t)j * g.dk : k + (size_t)t * g.kd + (size_t)(j - g.hk) * g.dk;
            for (int i = 0; i < g.dk; i++) dst[i] = x[i] * f;
        }
        for (int i = 0; i < g.vd; i++) v[(size_t)t * g.vd + i] = conv[(size_t)t * g.C + 2 * g.kd + i];
    }
    naive_gates(d->f[GI_X] + g.C + g.hv, g.W, d->f[GI_X] + g.C, g.W, g.n, g.hv, d->f[GI_ALOG], d->f[GI_DT], gg, beta);
    free(conv); free(st);
}
static int gi_cpu(const op_data *d, float *out) {
    const op_case *c = d->c;
    const gi_dims g = gi_dims_of(c);
    const size_t per = (size_t)g.C * (g.K - 1);
    float *conv = xmalloc(4 * (size_t)g.n * g.C);
    float *q = out, *k = q + (size_t)g.n * g.kd, *v = k + (size_t)g.n * g.kd, *gg = v + (size_t)g.n * g.vd;
    float *beta = gg + (size_t)g.n * g.hv, *pool_out = beta + (size_t)g.n * g.hv;
    memcpy(pool_out, d->f[GI_S], 4 * (size_t)g.slots * per);
    for (int s = 0; s < c->n_spans; s++) {
        const int t0 = span_first(c, s);
        qd_cpu_conv1d_silu(d->f[GI_X] + (size_t)t0 * g.W, c->lens[s], g.C, g.W, d->f[GI_W], g.K,
                           pool_out + (size_t)d->i[0][s] * per, conv + (size_t)t0 * g.C);
    }
    qd_cpu_l2norm_heads(conv, g.n, g.hk, g.dk, g.C, L2_EPS, 1.0f / sqrtf((float)g.dk));
    qd_cpu_l2norm_heads(conv + g.kd, g.n, g.hk, g.dk, g.C, L2_EPS, 1.0f);
    for (int t = 0; t < g.n; t++) {
        memcpy(q + (size_t)t * g.kd, conv + (size_t)t * g.C, 4 * (size_t)g.kd);
        memcpy(k + (size_t)t * g.kd, conv + (size_t)t * g.C + g.kd, 4 * (size_t)g.kd);
        memcpy(v + (size_t)t * g.vd, conv + (size_t)t * g.C + 2 * g.kd, 4 * (size_t)g.vd);
    }
    qd_cpu_gdn_gates(d->f[GI_X] + g.C + g.hv, g.W, d->f[GI_X] + g.C, g.W, g.n, g.hv, d->f[GI_ALOG], d->f[GI_DT], gg, beta);
    free(conv);
    return OP_OK;
}
#ifdef QD_HAVE_CUDA
static int gi_cuda(const op_data *d, float *out) {
    const op_case *c = d->c;
    const gi_dims g = gi_dims_of(c);
    const size_t per = (size_t)g.C * (g.K - 1);
    int decode_only = 1;
    int32_t spans[4 * MAX_SPANS], *row_span = xmalloc(4 * (size_t)g.n);
    for (int s = 0, r = 0; s < c->n_spans; r += c->lens[s], s++) {
        spans[4 * s] = r;
        spans[4 * s + 1] = c->lens[s];
        spans[4 * s + 2] = 0;
        spans[4 * s + 3] = d->i[0][s];
        for (int t = 0; t < c->lens[s]; t++) row_span[r + t] = s;
        decode_only &= c->lens[s] == 1;
    }
    dev_arena a = {.ok = 1};
    float *dx = da_f32(&a, d->f[GI_X], d->nf[GI_X]), *dw = da_f32(&a, d->f[GI_W], d->nf[GI_W]);
    float *dst = da_f32(&a, d->f[GI_S], d->nf[GI_S] + 1), *dA = da_f32(&a, d->f[GI_ALOG], g.hv);
    float *ddt = da_f32(&a, d->f[GI_DT], g.hv);
    int32_t *dsp = da_i32(&a, spans, 4 * (size_t)c->n_spans), *drs = da_i32(&a, row_span, (size_t)g.n);
    uint16_t *dq = da_alloc(&a, NULL, 2 * (size_t)g.n * g.kd), *dk = da_alloc(&a, NULL, 2 * (size_t)g.n * g.kd);
    uint16_t *dv = da_alloc(&a, NULL, 2 * (size_t)g.n * g.vd);
    float *dg = da_alloc(&a, NULL, 4 * (size_t)g.n * g.hv), *db = da_alloc(&a, NULL, 4 * (size_t)g.n * g.hv);
    if (a.ok) {
        /* decode_only (every span one row) is the decode path's single launch */
        const qd_cuda_gdn_in_args ga = {g.n, g.hk, g.hv, g.dk, g.dv, g.K, c->n_spans, dx, g.W, dx + g.C + g.hv, dx + g.C,
                                        g.W, dw, dA, ddt, dst, dsp, drs, dq, dk, dv, dg, db, decode_only, 0, NULL};
        DA_ST(&a, qd_cuda_gdn_inputs(&ga, NULL));
    }
    float *o = out;
    da_get_bf16(&a, o, dq, (size_t)g.n * g.kd);
    da_get_bf16(&a, o += (size_t)g.n * g.kd, dk, (size_t)g.n * g.kd);
    da_get_bf16(&a, o += (size_t)g.n * g.kd, dv, (size_t)g.n * g.vd);
    da_get_f32(&a, o += (size_t)g.n * g.vd, dg, (size_t)g.n * g.hv);
    da_get_f32(&a, o += (size_t)g.n * g.hv, db, (size_t)g.n * g.hv);
    da_get_f32(&a, o + (size_t)g.n * g.hv, dst, (size_t)g.slots * per);
    free(row_span);
    return da_done(&a);
}
#endif

/* ---------------------------------------------------------------- GDN delta rule
 * kv_heads = hk, heads = hv (GQA ratio hv/hk), dim = dk, dim2 = dv; spans of lens
 * tokens packed in one batch, rows at strides wider than the rows (multiples of 8
 * elements past the row, so bf16 rows stay 16-byte aligned on the GPU). Span s
 * reads and writes state slot i[0][s] of a pool of n_spans + 2 (shuffled; the other
 * slots must survive). q, k unit per head (q times dk^-0.5), bf16-representable as
 * the GPU reads them; log-decays include ~0 and ~-20 (state wiped).
 * Output [o (T hv dv) | state pool]. */
enum { GD_Q, GD_K, GD_V, GD_G, GD_B, GD_S };
typedef struct gd_dims {
    int hk, hv, dk, dv, T, slots;
    int64_t qs, ks, vs;
    size_t per;
} gd_dims;
static gd_dims gd_dims_of(const op_case *c) {
    gd_dims g = {c->kv_heads, c->heads, c->dim, c->dim2, span_total(c), c->n_spans + 2, 0, 0, 0, 0};
    g.qs = (int64_t)g.hk * g.dk + 8;
    g.ks = (int64_t)g.hk * g.dk + 16;
    g.vs = (int64_t)g.hv * g.dv + 8;
    g.per = (size_t)g.hv * g.dk * g.dv;
    return g;
}
/* A random head vector of norm `scale`, bf16-representable (qd_test_gdn_unit, rounded). */
static void fill_unit_bf16(qd_test_rng *rng, float *x, int n, float scale) {
    qd_test_gdn_unit(rng, x, n, scale);
    for (int i = 0; i < n; i++) x[i] = bf16_round(x[i]);
}
static void gd_make(op_data *d, qd_test_rng *rng) {
    const gd_dims g = gd_dims_of(d->c);
    const int T = g.T ? g.T : 1;
    float *q = in_zero(d, GD_Q, (size_t)T * g.qs), *k = in_zero(d, GD_K, (size_t)T * g.ks);
    float *v = in_zero(d, GD_V, (size_t)T * g.vs), *gg = in_zero(d, GD_G, (size_t)T * g.hv);
    float *beta = in_zero(d, GD_B, (size_t)T * g.hv);
    for (int t = 0; t < g.T; t++) {
        for (int j = 0; j < g.hk; j++) {
            fill_unit_bf16(rng, q + t * g.qs + (int64_t)j * g.dk, g.dk, 1.0f / sqrtf((float)g.dk));
            fill_unit_bf16(rng, k + t * g.ks + (int64_t)j * g.dk, g.dk, 1.0f);
        }
        for (int i = 0; i < g.hv * g.dv; i++) v[t * g.vs + i] = bf16_round(qd_test_normal(rng));
        for (int h = 0; h < g.hv; h++) {
            gg[(int64_t)t * g.hv + h] = qd_test_gdn_log_decay(rng);
            beta[(int64_t)t * g.hv + h] = 0.5f * (qd_test_uniform(rng) + 1.0f) * 0.998f + 0.001f;
        }
    }
    in_rand(d, GD_S, (size_t)g.slots * g.per, 0.5f, 0, rng);
    shuffle(in_idx(d, 0, (size_t)g.slots), g.slots, rng);
    d->n_out = (size_t)g.T * g.hv * g.dv + (size_t)g.slots * g.per;
}
/* the recurrence in double, literally as the spec: decay, predict, delta, rank-1 write, read out */
static void gd_naive(const op_data *d, double *out) {
    const op_case *c = d->c;
    const gd_dims g = gd_dims_of(c);
    const int r = g.hv / g.hk;
    double *o = out, *P = out + (size_t)g.T * g.hv * g.dv, *m = xmalloc(8 * (size_t)g.dv);
    for (size_t i = 0; i < (size_t)g.slots * g.per; i++) P[i] = d->f[GD_S][i];
    for (int s = 0; s < c->n_spans; s++) {
        double *S = P + (size_t)d->i[0][s] * g.per;
        for (int t = span_first(c, s); t < span_first(c, s) + c->lens[s]; t++)
            for (int h = 0; h < g.hv; h++) {
                const float *q = d->f[GD_Q] + t * g.qs + (int64_t)(h / r) * g.dk;
                const float *k = d->f[GD_K] + t * g.ks + (int64_t)(h / r) * g.dk;
                const float *v = d->f[GD_V] + t * g.vs + (int64_t)h * g.dv;
                const double a = exp((double)d->f[GD_G][t * g.hv + h]), b = d->f[GD_B][t * g.hv + h];
                double *Sh = S + (size_t)h * g.dk * g.dv;
                for (int i = 0; i < g.dk * g.dv; i++) Sh[i] *= a;
                for (int e = 0; e < g.dv; e++) {
                    double acc = 0;
                    for (int i = 0; i < g.dk; i++) acc += Sh[i * g.dv + e] * k[i];
                    m[e] = b * (v[e] - acc);
                }
                for (int i = 0; i < g.dk; i++)
                    for (int e = 0; e < g.dv; e++) Sh[i * g.dv + e] += k[i] * m[e];
                for (int e = 0; e < g.dv; e++) {
                    double acc = 0;
                    for (int i = 0; i < g.dk; i++) acc += Sh[i * g.dv + e] * q[i];
                    o[((size_t)t * g.hv + h) * g.dv + e] = acc;
                }
            }
    }
    free(m);
}
static qd_gdn_span gd_span(const op_data *d, const gd_dims *g, int s, float *out) {
    const int t0 = span_first(d->c, s);
    float *P = out + (size_t)g->T * g->hv * g->dv;
    return (qd_gdn_span){d->f[GD_Q] + t0 * g->qs, g->qs, d->f[GD_K] + t0 * g->ks, g->ks, d->f[GD_V] + t0 * g->vs,
                         g->vs, d->f[GD_G] + (int64_t)t0 * g->hv, d->f[GD_B] + (int64_t)t0 * g->hv,
                         P + (size_t)d->i[0][s] * g->per, out + (size_t)t0 * g->hv * g->dv, d->c->lens[s]};
}
/* kind: 0 recurrent per span, 1 recurrent_multi (all spans in one call), 2 chunked per span */
static int gd_cpu_kind(const op_data *d, float *out, int kind) {
    const gd_dims g = gd_dims_of(d->c);
    const qd_gdn_dims dims = {g.hk, g.hv, g.dk, g.dv};
    memcpy(out + (size_t)g.T * g.hv * g.dv, d->f[GD_S], 4 * (size_t)g.slots * g.per);
    qd_gdn_span sp[MAX_SPANS];
    for (int s = 0; s < d->c->n_spans; s++) sp[s] = gd_span(d, &g, s, out);
    if (kind == 1) {
        qd_cpu_gdn_recurrent_multi(g_pool, dims, sp, d->c->n_spans);
    } else {
        for (int s = 0; s < d->c->n_spans; s++) {
            if (kind == 2) qd_cpu_gdn_chunked(g_pool, dims, &sp[s]);
            else qd_cpu_gdn_recurrent(g_pool, dims, &sp[s]);
        }
    }
    return OP_OK;
}
static int gd_cpu_rec(const op_data *d, float *out) { return gd_cpu_kind(d, out, 0); }
static int gd_cpu_multi(const op_data *d, float *out) { return gd_cpu_kind(d, out, 1); }
static int gd_cpu_chunked(const op_data *d, float *out) { return gd_cpu_kind(d, out, 2); }
#ifdef QD_HAVE_CUDA
/* kind: 0 the decode kernel stepped token by token over each span (the recurrence);
 * 1 one decode launch for all spans (each one token: a decode batch, slot map);
 * 2 the chunked kernels, all spans in one varlen batch, states in place in the pool */
static int gd_cuda_kind(const op_data *d, float *out, int kind) {
    const op_case *c = d->c;
    const gd_dims g = gd_dims_of(c);
    if (kind == 1)
        for (int s = 0; s < c->n_spans; s++)
            if (c->lens[s] != 1) return OP_SKIP; /* the decode kernel takes one token per sequence */
    if (kind == 2 && (g.dk % 16 || g.dv % 16 || g.dk > 256 || g.dv > 256)) return OP_SKIP;
    const int T = g.T ? g.T : 1;
    const size_t no = (size_t)T * g.hv * g.dv;
    dev_arena a = {.ok = 1};
    uint16_t *dq = da_bf16(&a, d->f[GD_Q], d->nf[GD_Q]), *dk = da_bf16(&a, d->f[GD_K], d->nf[GD_K]);
    uint16_t *dv = da_bf16(&a, d->f[GD_V], d->nf[GD_V]);
    float *dg = da_f32(&a, d->f[GD_G], d->nf[GD_G]), *db = da_f32(&a, d->f[GD_B], d->nf[GD_B]);
    float *dP = da_f32(&a, d->f[GD_S], d->nf[GD_S]);
    int32_t *dslot = da_i32(&a, d->i[0], (size_t)g.slots);
    uint16_t *dO = da_alloc(&a, NULL, 2 * no);
    if (a.ok && kind == 0) {
        for (int s = 0; s < c->n_spans && a.ok; s++)
            for (int t = span_first(c, s); t < span_first(c, s) + c->lens[s] && a.ok; t++) {
                qd_cuda_gdn_decode_args da = {g.hk, g.hv, g.dk, g.dv, 1, dq + t * g.qs, dk + t * g.ks, dv + t * g.vs,
                                              dg + (int64_t)t * g.hv, db + (int64_t)t * g.hv,
                                              dP + (size_t)d->i[0][s] * g.per, NULL, NULL, dO + (int64_t)t * g.hv * g.dv,
                                              NULL, 0, 0, NULL, 0};
                DA_ST(&a, qd_cuda_gdn_decode(&da, NULL));
            }
    } else if (a.ok && kind == 1) {
        /* one token per sequence: row s of q/k/v at the host strides is row s of the
         * batch only when the rows are contiguous, so pass d_row = NULL and packed copies */
        const int n = c->n_spans;
        float *pq = xmalloc(4 * (size_t)n * g.hk * g.dk), *pk = xmalloc(4 * (size_t)n * g.hk * g.dk);
        float *pv = xmalloc(4 * (size_t)n * g.hv * g.dv);
        for (int s = 0; s < n; s++) {
            memcpy(pq + (size_t)s * g.hk * g.dk, d->f[GD_Q] + s * g.qs, 4 * (size_t)g.hk * g.dk);
            memcpy(pk + (size_t)s * g.hk * g.dk, d->f[GD_K] + s * g.ks, 4 * (size_t)g.hk * g.dk);
            memcpy(pv + (size_t)s * g.hv * g.dv, d->f[GD_V] + s * g.vs, 4 * (size_t)g.hv * g.dv);
        }
        uint16_t *cq = da_bf16(&a, pq, (size_t)n * g.hk * g.dk), *ck = da_bf16(&a, pk, (size_t)n * g.hk * g.dk);
        uint16_t *cv = da_bf16(&a, pv, (size_t)n * g.hv * g.dv);
        free(pq); free(pk); free(pv);
        if (a.ok) {
            qd_cuda_gdn_decode_args da = {g.hk, g.hv, g.dk, g.dv, n, cq, ck, cv, dg, db,
                                          dP, dslot, NULL, dO, NULL, 0, 0, NULL, 0};
            DA_ST(&a, qd_cuda_gdn_decode(&da, NULL));
        }
    } else if (a.ok && kind == 2) {
        int32_t cu[MAX_SPANS + 1];
        cu[0] = 0;
        for (int s = 0; s < c->n_spans; s++) cu[s + 1] = cu[s] + c->lens[s];
        qd_cuda_gdn_plan plan;
        const qd_status st = qd_cuda_gdn_plan_create(&plan, g.hk, g.hv, g.dk, g.dv, cu, c->n_spans);
        DA_ST(&a, st);
        if (st == QD_OK) {
            qd_cuda_gdn_chunked_args ca = {dq, dk, dv, g.qs, g.ks, g.vs, dg, db, dP, dP, dslot, dO, 0};
            DA_ST(&a, qd_cuda_gdn_chunked(&plan, &ca, NULL));
            DA_ST(&a, qd_cuda_sync());
            qd_cuda_gdn_plan_destroy(&plan);
        }
    }
    da_get_bf16(&a, out, dO, (size_t)g.T * g.hv * g.dv);
    da_get_f32(&a, out + (size_t)g.T * g.hv * g.dv, dP, (size_t)g.slots * g.per);
    return da_done(&a);
}
static int gd_cuda_rec(const op_data *d, float *out) { return gd_cuda_kind(d, out, 0); }
static int gd_cuda_multi(const op_data *d, float *out) { return gd_cuda_kind(d, out, 1); }
static int gd_cuda_chunked(const op_data *d, float *out) { return gd_cuda_kind(d, out, 2); }
#endif

/* ============================================================== the rows ======= */

/* conv1d_silu: n tokens of cols channels, window K (n < K-1 and K = 1 included) */
static const op_case CV_CASES[] = {
    {.n = 1, .cols = 7, .K = 4},  {.n = 5, .cols = 64, .K = 4}, {.n = 70, .cols = 33, .K = 2},
    {.n = 3, .cols = 16, .K = 1}, {.n = 2, .cols = 9, .K = 5},
};

/* l2norm_heads: n tokens, heads x dim, mode 1 scales by dim^-0.5 */
static const op_case L2_CASES[] = {
    {.n = 1, .heads = 1, .dim = 1}, {.n = 3, .heads = 4, .dim = 128, .mode = 1}, {.n = 7, .heads = 3, .dim = 40},
    {.n = 2, .heads = 2, .dim = 257, .mode = 1},
};

/* gdn_gates: n tokens, heads */
static const op_case GT_CASES[] = {{.n = 1, .heads = 1}, {.n = 5, .heads = 32}, {.n = 33, .heads = 7}};

/* gdn_inputs: kv_heads hk, heads hv, dim dk, dim2 dv, window K, spans */
static const op_case GI_CASES[] = {
    {.kv_heads = 2, .heads = 4, .dim = 32, .dim2 = 24, .K = 4, .n_spans = 4, .lens = {1, 5, 2, 70}},
    {.kv_heads = 3, .heads = 3, .dim = 40, .dim2 = 16, .K = 2, .n_spans = 4, .lens = {1, 5, 2, 70}},
    {.kv_heads = 1, .heads = 2, .dim = 16, .dim2 = 8, .K = 1, .n_spans = 2, .lens = {3, 1}},
    {.kv_heads = 16, .heads = 32, .dim = 128, .dim2 = 128, .K = 4, .n_spans = 4, .lens = {1, 1, 1, 1}},
    {.kv_heads = 1, .heads = 1, .dim = 256, .dim2 = 32, .K = 3, .n_spans = 3, .lens = {1, 1, 1}},
    {.kv_heads = 2, .heads = 4, .dim = 32, .dim2 = 24, .K = 4, .n_spans = 2, .lens = {2, 1}},
};

/* GDN recurrent / chunked: kv_heads hk, heads hv, dim dk, dim2 dv, spans (0, 1, chunk
 * edges 63/64/65, 129, 200); fast-path dims and dims off every tile */
static const op_case GD_CASES[] = {
    {.kv_heads = 2, .heads = 4, .dim = 128, .dim2 = 128, .n_spans = 5, .lens = {1, 63, 64, 65, 200}},
    {.kv_heads = 1, .heads = 3, .dim = 64, .dim2 = 48, .n_spans = 3, .lens = {130, 0, 5}},
    {.kv_heads = 2, .heads = 2, .dim = 32, .dim2 = 16, .n_spans = 2, .lens = {17, 129}},
    {.kv_heads = 3, .heads = 3, .dim = 96, .dim2 = 64, .n_spans = 2, .lens = {33, 70}},
    {.kv_heads = 1, .heads = 1, .dim = 256, .dim2 = 256, .n_spans = 1, .lens = {66}},
    {.kv_heads = 1, .heads = 1, .dim = 5, .dim2 = 3, .n_spans = 2, .lens = {4, 1}},
};

/* GDN decode batches: one token per sequence (slot map), and one ragged batch (CPU only) */
static const op_case GDM_CASES[] = {
    {.kv_heads = 4, .heads = 8, .dim = 128, .dim2 = 128, .n_spans = 8, .lens = {1, 1, 1, 1, 1, 1, 1, 1}},
    {.kv_heads = 2, .heads = 6, .dim = 64, .dim2 = 96, .n_spans = 5, .lens = {1, 1, 1, 1, 1}},
    {.kv_heads = 1, .heads = 2, .dim = 256, .dim2 = 32, .n_spans = 3, .lens = {1, 1, 1}},
    {.kv_heads = 3, .heads = 3, .dim = 96, .dim2 = 80, .n_spans = 7, .lens = {1, 1, 1, 1, 1, 1, 1}},
    {.kv_heads = 1, .heads = 1, .dim = 5, .dim2 = 3, .n_spans = 2, .lens = {1, 1}},
    {.kv_heads = 2, .heads = 4, .dim = 32, .dim2 = 16, .n_spans = 4, .lens = {3, 1, 0, 9}},
};

/* conv, L2 norm and gates have no CUDA kernel of their own: gdn_inputs fuses them */
const op_row OP_CONV1D_SILU = {
    "conv1d_silu", CV_CASES, NCASES(CV_CASES), cv_make, cv_naive, {cv_cpu, NULL},
    {T_CPU_EW, T_BF16}};

const op_row OP_L2NORM_HEADS = {
    "l2norm_heads", L2_CASES, NCASES(L2_CASES), l2_make, l2_naive, {l2_cpu, NULL},
    {T_CPU_EW, T_BF16}};

const op_row OP_GDN_GATES = {
    "gdn_gates", GT_CASES, NCASES(GT_CASES), gt_make, gt_naive, {gt_cpu, NULL},
    {T_CPU_EW, T_BF16}};

const op_row OP_GDN_INPUTS = {
    "gdn_inputs", GI_CASES, NCASES(GI_CASES), gi_make, gi_naive, {gi_cpu, CU(gi_cuda)},
    {T_CPU_EW, T_BF16}};

const op_row OP_GDN_RECURRENT = {
    "gdn_recurrent", GD_CASES, NCASES(GD_CASES), gd_make, gd_naive, {gd_cpu_rec, CU(gd_cuda_rec)},
    {T_CPU_SUM, {1e-2, 1e-6, 1e-2, 0, 4e-3}}};

const op_row OP_GDN_RECURRENT_MULTI = {
    "gdn_recurrent_multi", GDM_CASES, NCASES(GDM_CASES), gd_make, gd_naive, {gd_cpu_multi, CU(gd_cuda_multi)},
    {T_CPU_SUM, {1e-2, 1e-6, 1e-2, 0, 4e-3}}};

const op_row OP_GDN_CHUNKED = {
    "gdn_chunked", GD_CASES, NCASES(GD_CASES), gd_make, gd_naive, {gd_cpu_chunked, CU(gd_cuda_chunked)},
    {{1e-4, 1e-6, 2e-4, 0, 0}, {3e-2, 1e-6, 0.2, 0, 1.5e-2}}};
