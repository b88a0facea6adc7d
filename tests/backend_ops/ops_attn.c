/* test_backend_ops's rows for RoPE and attention (alone, and the block with its prep): each op's
 * generator, naive reference and backend runners, its shape cases and its row (backend_ops.h). */
#include "backend_ops.h"

/* ---------------------------------------------------------------- rope_neox
 * n tokens of heads x dim (head_dim) at row stride heads*dim + 4, the first dim2 dims
 * rotated; positions random in [0, 5000); mode: theta 1e4 (0) or 1e7 (1). */
enum { RP_X };
static double rp_theta(const op_case *c) { return c->mode ? 1e7 : 1e4; }
static void rp_make(op_data *d, qd_test_rng *rng) {
    const op_case *c = d->c;
    in_rand(d, RP_X, (size_t)c->n * (c->heads * c->dim + 4), 1.0f, 0, rng);
    int32_t *pos = in_idx(d, 0, (size_t)c->n);
    for (int t = 0; t < c->n; t++) pos[t] = t == 0 ? 0 : (int32_t)(qd_test_next(rng) % 5000);
    d->n_out = (size_t)c->n * c->heads * c->dim;
}
static void rp_naive(const op_data *d, double *out) {
    const op_case *c = d->c;
    const int W = c->heads * c->dim;
    for (int t = 0; t < c->n; t++)
        for (int h = 0; h < c->heads; h++) {
            double *v = out + (size_t)t * W + (size_t)h * c->dim;
            for (int e = 0; e < c->dim; e++) v[e] = d->f[RP_X][(size_t)t * (W + 4) + (size_t)h * c->dim + e];
            naive_rope(v, c->dim2, rp_theta(c), d->i[0][t]);
        }
}
static int rp_cpu(const op_data *d, float *out) {
    const op_case *c = d->c;
    const int W = c->heads * c->dim;
    float *x = xmalloc(4 * d->nf[RP_X]);
    memcpy(x, d->f[RP_X], 4 * d->nf[RP_X]);
    qd_cpu_rope_neox(x, c->n, c->heads, c->dim, W + 4, c->dim2, rp_theta(c), d->i[0]);
    for (int t = 0; t < c->n; t++) memcpy(out + (size_t)t * W, x + (size_t)t * (W + 4), 4 * (size_t)W);
    free(x);
    return OP_OK;
}

/* ---------------------------------------------------------------- attention
 * Causal GQA attention of ragged spans over a paged cache. heads = nq, kv_heads = nkv,
 * dim = hd, K = block size; span s has lens[s] query rows at positions pos[s]...
 * Block tables: a shuffled permutation of all blocks. Two rows:
 *   attention:  the attention alone. q (already normed, rotated and scaled: the
 *               kernels' input) and the cache of every position 0..pos+len-1 are
 *               bf16-representable inputs; the CPU op runs with scale 1 on them.
 *               mode 1: the CUDA batch-invariant mode.
 *   attn_block: the layer's prep and attention: q|gate and k, v projections (fp32),
 *               zero-centred q/k RMSNorm, partial NeoX RoPE on dim2 dims (theta 1e7),
 *               scale hd^-0.5, new keys/values appended to a cache that holds
 *               positions < pos (bf16-representable), attention, sigmoid gate.
 *               mode bit 0: gated; bit 1: CUDA batch-invariant mode.
 * Output [rows][nq][hd]. */
enum { AT_Q, AT_KH, AT_VH, AT_K, AT_V, AT_QN, AT_KN };
#define AT_EPS 1e-6f
#define AT_THETA 1e7f
typedef struct at_dims {
    int nq, nkv, hd, bs, kvd, n, mbps, n_blocks, max_ctx, qw;
    int64_t stride;
} at_dims;
static at_dims at_dims_of(const op_case *c, int block_row) {
    at_dims a = {c->heads, c->kv_heads, c->dim, c->K, c->kv_heads * c->dim, span_total(c), 0, 0, 0, c->dim, 0};
    for (int s = 0; s < c->n_spans; s++)
        if (c->pos[s] + c->lens[s] > a.max_ctx) a.max_ctx = c->pos[s] + c->lens[s];
    a.mbps = (a.max_ctx + a.bs - 1) / a.bs;
    a.n_blocks = c->n_spans * a.mbps;
    a.stride = (int64_t)a.bs * a.kvd;
    if (block_row && (c->mode & 1)) a.qw = 2 * c->dim;
    return a;
}
/* history of span s: positions [0, hist) of the cache input, [seq][pos][nkv][hd] */
static int at_hist(const op_case *c, int s, int block_row) { return c->pos[s] + (block_row ? 0 : c->lens[s]); }
static size_t at_hist_off(const op_case *c, int s, int kvd, int block_row) {
    size_t off = 0;
    for (int j = 0; j < s; j++) off += (size_t)at_hist(c, j, block_row) * kvd;
    return off;
}
static void at_make_common(op_data *d, qd_test_rng *rng, int block_row) {
    const op_case *c = d->c;
    const at_dims g = at_dims_of(c, block_row);
    size_t nh = 0;
    for (int s = 0; s < c->n_spans; s++) nh += (size_t)at_hist(c, s, block_row) * g.kvd;
    in_rand(d, AT_KH, nh, 1.5f, 1, rng);
    in_rand(d, AT_VH, nh, 1.0f, 1, rng);
    if (block_row) {
        in_rand(d, AT_Q, (size_t)g.n * g.nq * g.qw, 1.0f, 0, rng);
        in_rand(d, AT_K, (size_t)g.n * g.kvd, 2.0f, 0, rng);
        in_rand(d, AT_V, (size_t)g.n * g.kvd, 1.0f, 0, rng);
        float *qn = in_rand(d, AT_QN, (size_t)g.hd, 0.3f, 0, rng), *kn = in_rand(d, AT_KN, (size_t)g.hd, 0.3f, 0, rng);
        for (int i = 0; i < g.hd; i++) {
            qn[i] += 0.5f;
            kn[i] += 0.5f;
        }
    } else {
        /* scaled queries: |q.k| of a few units, as after the norms and hd^-0.5 */
        in_rand(d, AT_Q, (size_t)g.n * g.nq * g.hd, 1.0f / sqrtf((float)g.hd), 1, rng);
    }
    shuffle(in_idx(d, 0, (size_t)g.n_blocks), g.n_blocks, rng);
    d->n_out = (size_t)g.n * g.nq * g.hd;
}
static void at_make(op_data *d, qd_test_rng *rng) { at_make_common(d, rng, 0); }
static void ab_make(op_data *d, qd_test_rng *rng) { at_make_common(d, rng, 1); }

/* softmax attention of one query row over keys/values kk/vv [ctx][kvd] of its sequence, in double */
static void naive_attn_row(const double *q, const double *kk, const double *vv, int ctx, int kvd, int hd, int kvh,
                           double scale, double *out) {
    double mx = -INFINITY, den = 0;
    double *sc = xmalloc(8 * (size_t)ctx);
    for (int p = 0; p < ctx; p++) {
        double s = 0;
        for (int e = 0; e < hd; e++) s += q[e] * kk[(size_t)p * kvd + (size_t)kvh * hd + e];
        sc[p] = s * scale;
        if (sc[p] > mx) mx = sc[p];
    }
    for (int e = 0; e < hd; e++) out[e] = 0;
    for (int p = 0; p < ctx; p++) {
        const double w = exp(sc[p] - mx);
        den += w;
        for (int e = 0; e < hd; e++) out[e] += w * vv[(size_t)p * kvd + (size_t)kvh * hd + e];
    }
    for (int e = 0; e < hd; e++) out[e] /= den;
    free(sc);
}
static void at_naive_common(const op_data *d, double *out, int block_row) {
    const op_case *c = d->c;
    const at_dims g = at_dims_of(c, block_row);
    const int grp = g.nq / g.nkv;
    const double scale = block_row ? 1.0 / sqrt((double)g.hd) : 1.0;
    double *kk = xmalloc(8 * (size_t)g.max_ctx * g.kvd), *vv = xmalloc(8 * (size_t)g.max_ctx * g.kvd);
    double *q = xmalloc(8 * (size_t)g.hd);
    for (int s = 0; s < c->n_spans; s++) {
        const int hist = at_hist(c, s, block_row), r0 = span_first(c, s);
        const size_t ho = at_hist_off(c, s, g.kvd, block_row);
        for (size_t i = 0; i < (size_t)hist * g.kvd; i++) {
            kk[i] = d->f[AT_KH][ho + i];
            vv[i] = d->f[AT_VH][ho + i];
        }
        if (block_row) /* the span's own keys: normed, rotated; values as given */
            for (int t = 0; t < c->lens[s]; t++) {
                const int p = c->pos[s] + t;
                for (int j = 0; j < g.nkv; j++) {
                    double *kr = kk + (size_t)p * g.kvd + (size_t)j * g.hd;
                    naive_rmsnorm(d->f[AT_K] + (size_t)(r0 + t) * g.kvd + (size_t)j * g.hd, g.hd, d->f[AT_KN], 1.0,
                                  AT_EPS, kr);
                    naive_rope(kr, c->dim2, AT_THETA, p);
                }
                for (int e = 0; e < g.kvd; e++) vv[(size_t)p * g.kvd + e] = d->f[AT_V][(size_t)(r0 + t) * g.kvd + e];
            }
        for (int t = 0; t < c->lens[s]; t++)
            for (int h = 0; h < g.nq; h++) {
                const size_t row = (size_t)(r0 + t) * g.nq + h;
                if (block_row) {
                    naive_rmsnorm(d->f[AT_Q] + row * g.qw, g.hd, d->f[AT_QN], 1.0, AT_EPS, q);
                    naive_rope(q, c->dim2, AT_THETA, c->pos[s] + t);
                } else {
                    for (int e = 0; e < g.hd; e++) q[e] = d->f[AT_Q][row * g.hd + e];
                }
                naive_attn_row(q, kk, vv, c->pos[s] + t + 1, g.kvd, g.hd, h / grp, scale, out + row * g.hd);
                if (block_row && (c->mode & 1))
                    for (int e = 0; e < g.hd; e++) out[row * g.hd + e] *= naive_sigmoid(d->f[AT_Q][row * g.qw + g.hd + e]);
            }
    }
    free(kk); free(vv); free(q);
}
static void at_naive(const op_data *d, double *out) { at_naive_common(d, out, 0); }
static void ab_naive(const op_data *d, double *out) { at_naive_common(d, out, 1); }

/* The history of every span written into a paged fp32 cache (NaN elsewhere):
 * position p of span s at block table[s * mbps + p / bs], row p % bs. */
static void at_paged(const op_data *d, const at_dims *g, int block_row, float *kc, float *vc) {
    const op_case *c = d->c;
    for (size_t i = 0; i < (size_t)g->n_blocks * g->stride; i++) kc[i] = vc[i] = NAN;
    for (int s = 0; s < c->n_spans; s++) {
        const size_t ho = at_hist_off(c, s, g->kvd, block_row);
        for (int p = 0; p < at_hist(c, s, block_row); p++) {
            const size_t off = (size_t)d->i[0][s * g->mbps + p / g->bs] * g->stride + (size_t)(p % g->bs) * g->kvd;
            memcpy(kc + off, d->f[AT_KH] + ho + (size_t)p * g->kvd, 4 * (size_t)g->kvd);
            memcpy(vc + off, d->f[AT_VH] + ho + (size_t)p * g->kvd, 4 * (size_t)g->kvd);
        }
    }
}
static int at_cpu_common(const op_data *d, float *out, int block_row) {
    const op_case *c = d->c;
    const at_dims g = at_dims_of(c, block_row);
    const size_t nc = (size_t)g.n_blocks * g.stride;
    float *kc = xmalloc(4 * nc), *vc = xmalloc(4 * nc), *q = NULL, *gate = NULL;
    at_paged(d, &g, block_row, kc, vc);
    float scale = 1.0f;
    if (block_row) { /* the layer's prep as src/backend/cpu/cpu_layer_attn.c composes the CPU ops */
        q = xmalloc(4 * (size_t)g.n * g.nq * g.hd);
        gate = xmalloc(4 * (size_t)g.n * g.nq * g.hd);
        for (size_t r = 0; r < (size_t)g.n * g.nq; r++) {
            memcpy(q + r * g.hd, d->f[AT_Q] + r * g.qw, 4 * (size_t)g.hd);
            if (c->mode & 1) memcpy(gate + r * g.hd, d->f[AT_Q] + r * g.qw + g.hd, 4 * (size_t)g.hd);
        }
        float *kn = xmalloc(4 * (size_t)g.n * g.kvd);
        int32_t *pos = xmalloc(4 * (size_t)g.n);
        for (int s = 0; s < c->n_spans; s++)
            for (int t = 0; t < c->lens[s]; t++) pos[span_first(c, s) + t] = c->pos[s] + t;
        qd_cpu_rmsnorm(q, (int64_t)g.n * g.nq, g.hd, g.hd, d->f[AT_QN], 1.0f, AT_EPS, q, g.hd);
        qd_cpu_rmsnorm(d->f[AT_K], (int64_t)g.n * g.nkv, g.hd, g.hd, d->f[AT_KN], 1.0f, AT_EPS, kn, g.hd);
        qd_cpu_rope_neox(q, g.n, g.nq, g.hd, (int64_t)g.nq * g.hd, c->dim2, AT_THETA, pos);
        qd_cpu_rope_neox(kn, g.n, g.nkv, g.hd, g.kvd, c->dim2, AT_THETA, pos);
        for (int s = 0; s < c->n_spans; s++)
            for (int t = 0; t < c->lens[s]; t++) {
                const int p = c->pos[s] + t, r = span_first(c, s) + t;
                const size_t off = (size_t)d->i[0][s * g.mbps + p / g.bs] * g.stride + (size_t)(p % g.bs) * g.kvd;
                memcpy(kc + off, kn + (size_t)r * g.kvd, 4 * (size_t)g.kvd);
                memcpy(vc + off, d->f[AT_V] + (size_t)r * g.kvd, 4 * (size_t)g.kvd);
            }
        free(kn);
        free(pos);
        scale = 1.0f / sqrtf((float)g.hd);
    }
    const float *qq = block_row ? q : d->f[AT_Q];
    for (int s = 0; s < c->n_spans; s++) {
        const int r0 = span_first(c, s);
        const qd_kv_view view = {kc, vc, d->i[0] + (size_t)s * g.mbps, g.bs, g.stride};
        qd_cpu_attention(g_pool, qq + (size_t)r0 * g.nq * g.hd, (int64_t)g.nq * g.hd, &view, c->lens[s], c->pos[s], g.nq,
                         g.nkv, g.hd, scale, out + (size_t)r0 * g.nq * g.hd);
    }
    if (block_row && (c->mode & 1))
        for (size_t i = 0; i < d->n_out; i++) out[i] *= qd_sigmoid(gate[i]);
    free(kc); free(vc); free(q); free(gate);
    return OP_OK;
}
static int at_cpu(const op_data *d, float *out) { return at_cpu_common(d, out, 0); }
static int ab_cpu(const op_data *d, float *out) { return at_cpu_common(d, out, 1); }
#ifdef QD_HAVE_CUDA
static int at_cuda_common(const op_data *d, float *out, int block_row) {
    const op_case *c = d->c;
    const at_dims g = at_dims_of(c, block_row);
    const size_t nc = (size_t)g.n_blocks * g.stride, nqo = (size_t)g.n * g.nq * g.hd;
    const int invariant = block_row ? (c->mode >> 1) & 1 : c->mode & 1;
    float *kc = xmalloc(4 * nc), *vc = xmalloc(4 * nc);
    at_paged(d, &g, block_row, kc, vc);
    int32_t spans[4 * MAX_SPANS], *row_slot = xmalloc(4 * (size_t)g.n), *row_pos = xmalloc(4 * (size_t)g.n);
    int max_span = 0;
    for (int s = 0; s < c->n_spans; s++) {
        const int r0 = span_first(c, s);
        spans[4 * s] = r0;
        spans[4 * s + 1] = c->lens[s];
        spans[4 * s + 2] = c->pos[s];
        spans[4 * s + 3] = s; /* slot s: block table row s */
        if (c->lens[s] > max_span) max_span = c->lens[s];
        for (int t = 0; t < c->lens[s]; t++) {
            row_slot[r0 + t] = s;
            row_pos[r0 + t] = c->pos[s] + t;
        }
    }
    dev_arena a = {.ok = 1};
    uint16_t *dkc = da_bf16(&a, kc, nc), *dvc = da_bf16(&a, vc, nc);
    int32_t *dtab = da_i32(&a, d->i[0], (size_t)g.n_blocks), *dsp = da_i32(&a, spans, 4 * (size_t)c->n_spans);
    int32_t *drs = da_i32(&a, row_slot, (size_t)g.n), *drp = da_i32(&a, row_pos, (size_t)g.n);
    uint16_t *dq = block_row ? da_alloc(&a, NULL, 2 * nqo) : da_bf16(&a, d->f[AT_Q], nqo);
    uint16_t *dout = da_alloc(&a, NULL, 2 * nqo);
    const size_t wb = qd_cuda_attn_work_bytes(g.n, g.nq, g.hd, g.max_ctx, invariant);
    float *dwork = da_alloc(&a, NULL, wb);
    qd_cuda_attn_args aa;
    memset(&aa, 0, sizeof aa);
    aa.n_rows = g.n; aa.nq = g.nq; aa.nkv = g.nkv; aa.hd = g.hd;
    aa.rope_dim = block_row ? c->dim2 : 0; aa.rope_theta = AT_THETA; aa.eps = AT_EPS;
    aa.gated = block_row && (c->mode & 1);
    if (block_row) {
        aa.d_qg = da_f32(&a, d->f[AT_Q], d->nf[AT_Q]);
        aa.d_k = da_f32(&a, d->f[AT_K], d->nf[AT_K]);
        aa.d_v = da_f32(&a, d->f[AT_V], d->nf[AT_V]);
        aa.d_q_norm = da_f32(&a, d->f[AT_QN], g.hd);
        aa.d_k_norm = da_f32(&a, d->f[AT_KN], g.hd);
    } else {
        aa.d_qg = da_alloc(&a, NULL, 16); /* required by the launcher, read only when gated */
    }
    aa.d_row_slot = drs; aa.d_row_pos = drp; aa.d_spans = dsp; aa.n_spans = c->n_spans;
    aa.max_span_rows = max_span; aa.max_ctx = g.max_ctx;
    aa.d_block_tables = dtab; aa.max_blocks_per_seq = g.mbps; aa.block_size = g.bs; aa.block_stride = g.stride;
    aa.d_kcache = dkc; aa.d_vcache = dvc; aa.d_q = dq; aa.d_out = dout; aa.d_work = dwork; aa.invariant = invariant;
    if (a.ok && block_row) DA_ST(&a, qd_cuda_attn_prep(&aa, NULL));
    if (a.ok) DA_ST(&a, qd_cuda_attn(&aa, NULL));
    da_get_bf16(&a, out, dout, nqo);
    free(kc); free(vc); free(row_slot); free(row_pos);
    return da_done(&a);
}
static int at_cuda(const op_data *d, float *out) { return at_cuda_common(d, out, 0); }
static int ab_cuda(const op_data *d, float *out) { return at_cuda_common(d, out, 1); }
#endif

/* ============================================================== the rows ======= */

/* rope_neox: n tokens, heads x dim, dim2 rotated, mode theta */
static const op_case RP_CASES[] = {
    {.n = 6, .heads = 2, .dim = 8, .dim2 = 8},     {.n = 3, .heads = 4, .dim = 256, .dim2 = 64, .mode = 1},
    {.n = 5, .heads = 3, .dim = 40, .dim2 = 20},   {.n = 1, .heads = 1, .dim = 2, .dim2 = 2},
    {.n = 17, .heads = 2, .dim = 128, .dim2 = 128, .mode = 1},
};

/* attention alone: heads nq, kv_heads nkv, dim hd, K block size, spans lens at pos;
 * decode rows at block edges, prefill spans at aligned and unaligned starts; mode 1 invariant */
static const op_case AT_CASES[] = {
    {.heads = 8, .kv_heads = 8, .dim = 128, .K = 7, .n_spans = 5, .lens = {1, 1, 1, 1, 1}, .pos = {0, 6, 7, 500, 3000}},
    {.heads = 16, .kv_heads = 2, .dim = 256, .K = 16, .n_spans = 5, .lens = {1, 63, 64, 65, 1}, .pos = {0, 0, 37, 128, 700}},
    {.heads = 6, .kv_heads = 3, .dim = 64, .K = 16, .n_spans = 1, .lens = {200}, .pos = {0}},
    {.heads = 4, .kv_heads = 1, .dim = 40, .K = 16, .n_spans = 2, .lens = {70, 2}, .pos = {10, 100}},
    {.heads = 24, .kv_heads = 1, .dim = 64, .K = 16, .n_spans = 3, .lens = {1, 1, 7}, .pos = {300, 0, 100}},
    {.heads = 4, .kv_heads = 2, .dim = 32, .K = 5, .n_spans = 3, .lens = {1, 65, 2}, .pos = {40, 0, 100}},
    {.heads = 16, .kv_heads = 2, .dim = 256, .K = 16, .n_spans = 4, .lens = {3, 16, 1, 17}, .pos = {700, 0, 129, 300}, .mode = 1},
    {.heads = 8, .kv_heads = 2, .dim = 128, .K = 13, .n_spans = 3, .lens = {1, 30, 1}, .pos = {1000, 5, 64}, .mode = 1},
};

/* attn_block: as above plus dim2 rotated dims; mode bit 0 gated, bit 1 invariant */
static const op_case AB_CASES[] = {
    {.heads = 16, .kv_heads = 2, .dim = 256, .dim2 = 64, .K = 16, .n_spans = 4, .lens = {1, 63, 65, 5}, .pos = {0, 0, 128, 300}, .mode = 1},
    {.heads = 8, .kv_heads = 8, .dim = 128, .dim2 = 128, .K = 7, .n_spans = 4, .lens = {1, 1, 1, 1}, .pos = {0, 6, 7, 900}},
    {.heads = 6, .kv_heads = 3, .dim = 64, .dim2 = 32, .K = 16, .n_spans = 1, .lens = {100}, .pos = {0}, .mode = 1},
    {.heads = 4, .kv_heads = 1, .dim = 40, .dim2 = 20, .K = 16, .n_spans = 2, .lens = {30, 2}, .pos = {10, 100}, .mode = 1},
    {.heads = 32, .kv_heads = 2, .dim = 128, .dim2 = 64, .K = 13, .n_spans = 3, .lens = {1, 20, 1}, .pos = {1000, 64, 5}, .mode = 3},
};

/* RoPE has no CUDA kernel of its own: attn_block covers the GPU's (in its prep) */
const op_row OP_ROPE_NEOX = {
    "rope_neox", RP_CASES, NCASES(RP_CASES), rp_make, rp_naive, {rp_cpu, NULL},
    {T_CPU_EW, T_BF16}};

const op_row OP_ATTENTION = {
    "attention", AT_CASES, NCASES(AT_CASES), at_make, at_naive, {at_cpu, CU(at_cuda)},
    {T_CPU_SUM, {0, 1e-6, 0, 2e-2, 1e-2}}};

const op_row OP_ATTN_BLOCK = {
    "attn_block", AB_CASES, NCASES(AB_CASES), ab_make, ab_naive, {ab_cpu, CU(ab_cuda)},
    {T_CPU_SUM, {0, 1e-6, 0, 2e-2, 1e-2}}};
