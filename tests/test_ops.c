/* CPU elementwise and attention ops against naive double-precision references written
 * here from the spec, on fresh random inputs with awkward shapes. Outputs are
 * poisoned with NaN first and every element is checked. */
#include <math.h>
#include <string.h>

#include "backend/cpu/cpu_ops.h"
#include "qd_test.h"

static qd_test_rng rng;

static float *rand_buf(size_t n, float scale) {
    float *p = malloc(sizeof(float) * (n ? n : 1));
    for (size_t i = 0; i < n; i++) p[i] = qd_test_normal(&rng) * scale;
    return p;
}
static float *nan_buf(size_t n) {
    float *p = malloc(sizeof(float) * (n ? n : 1));
    for (size_t i = 0; i < n; i++) p[i] = NAN;
    return p;
}
/* max |a-b| / max(1, max|b|) over n elements; NaN counts as infinite error */
static double rel_err(const float *a, const double *b, size_t n) {
    double mx = 1.0, err = 0.0;
    for (size_t i = 0; i < n; i++) mx = fmax(mx, fabs(b[i]));
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]);
        if (isnan(a[i]) || isnan(d)) return INFINITY;
        err = fmax(err, d);
    }
    return err / mx;
}

static void test_rmsnorm(void) {
    const int dims[] = {1, 7, 64, 129};
    for (int di = 0; di < 4; di++) {
        int dim = dims[di], rows = 5, xs = dim + 3, ys = dim + 1;
        float *x = rand_buf((size_t)rows * xs, 2.0f), *w = rand_buf(dim, 0.5f), *y = nan_buf((size_t)rows * ys);
        double *ref = calloc((size_t)rows * ys, sizeof(double));
        for (int off = 0; off < 2; off++) {
            float w_off = (float)off;
            qd_cpu_rmsnorm(x, rows, dim, xs, w, w_off, 1e-6f, y, ys);
            for (int r = 0; r < rows; r++) {
                double ss = 0;
                for (int i = 0; i < dim; i++) ss += (double)x[r * xs + i] * x[r * xs + i];
                double inv = 1.0 / sqrt(ss / dim + 1e-6);
                for (int i = 0; i < dim; i++) ref[r * ys + i] = x[r * xs + i] * inv * (w_off + w[i]);
                for (int i = dim; i < ys; i++) ref[r * ys + i] = NAN;
            }
            for (int r = 0; r < rows; r++) {
                double e = rel_err(y + r * ys, ref + r * ys, (size_t)dim);
                CHECKF(e < 1e-5, "rmsnorm dim %d offset %d row %d err %g", dim, off, r, e);
                if (ys > dim) CHECKF(isnan(y[r * ys + dim]), "rmsnorm wrote past the row (dim %d)", dim);
            }
        }
        free(x); free(w); free(y); free(ref);
    }
}

static void test_gated_rmsnorm(void) {
    int T = 3, hv = 5, dv = 24;
    size_t n = (size_t)T * hv * dv;
    float *o = rand_buf(n, 1.5f), *z = rand_buf(n, 2.0f), *w = rand_buf(dv, 1.0f), *u = nan_buf(n);
    double *ref = malloc(sizeof(double) * n);
    qd_cpu_gated_rmsnorm(o, z, w, T, hv, dv, 1e-6f, u);
    for (int t = 0; t < T * hv; t++) {
        double ss = 0;
        for (int e = 0; e < dv; e++) ss += (double)o[t * dv + e] * o[t * dv + e];
        double inv = 1.0 / sqrt(ss / dv + 1e-6);
        for (int e = 0; e < dv; e++) {
            double zz = z[t * dv + e];
            ref[t * dv + e] = o[t * dv + e] * inv * w[e] * (zz / (1.0 + exp(-zz)));
        }
    }
    double e = rel_err(u, ref, n);
    CHECKF(e < 1e-5, "gated rmsnorm err %g", e);
    free(o); free(z); free(w); free(u); free(ref);
}

static void test_conv1d(void) {
    const int Ts[] = {1, 2, 3, 5, 17};
    for (int ti = 0; ti < 5; ti++) {
        int T = Ts[ti], C = 13, K = 4, xs = C + 2;
        float *x = rand_buf((size_t)T * xs, 1.0f), *w = rand_buf((size_t)C * K, 0.7f);
        float *state = rand_buf((size_t)C * (K - 1), 1.0f), *y = nan_buf((size_t)T * C);
        double *hist = malloc(sizeof(double) * (size_t)(K - 1 + T));
        double *ref = malloc(sizeof(double) * (size_t)T * C), *ref_state = malloc(sizeof(double) * (size_t)C * (K - 1));
        for (int c = 0; c < C; c++) {
            for (int i = 0; i < K - 1; i++) hist[i] = state[c * (K - 1) + i];
            for (int t = 0; t < T; t++) hist[K - 1 + t] = x[t * xs + c];
            for (int t = 0; t < T; t++) {
                double acc = 0;
                for (int i = 0; i < K; i++) acc += (double)w[c * K + i] * hist[t + i];
                ref[t * C + c] = acc / (1.0 + exp(-acc));
            }
            for (int i = 0; i < K - 1; i++) ref_state[c * (K - 1) + i] = hist[T + i];
        }
        qd_cpu_conv1d_silu(x, T, C, xs, w, K, state, y);
        double e1 = rel_err(y, ref, (size_t)T * C), e2 = rel_err(state, ref_state, (size_t)C * (K - 1));
        CHECKF(e1 < 1e-5 && e2 == 0.0, "conv1d T=%d err %g state err %g", T, e1, e2);
        free(x); free(w); free(state); free(y); free(hist); free(ref); free(ref_state);
    }
}

static void test_l2norm_gates(void) {
    int T = 4, heads = 3, dim = 19, xs = heads * dim + 5;
    float *x = rand_buf((size_t)T * xs, 1.0f);
    double *ref = malloc(sizeof(double) * (size_t)T * xs);
    for (int t = 0; t < T; t++)
        for (int h = 0; h < heads; h++) {
            double ss = 0;
            for (int i = 0; i < dim; i++) ss += (double)x[t * xs + h * dim + i] * x[t * xs + h * dim + i];
            for (int i = 0; i < dim; i++) ref[t * xs + h * dim + i] = x[t * xs + h * dim + i] / sqrt(ss + 1e-6) * 0.25;
        }
    qd_cpu_l2norm_heads(x, T, heads, dim, xs, 1e-6f, 0.25f);
    double e = 0;
    for (int t = 0; t < T; t++) e = fmax(e, rel_err(x + t * xs, ref + t * xs, (size_t)heads * dim));
    CHECKF(e < 1e-6, "l2norm err %g", e);

    int hv = 6;
    float *a = rand_buf((size_t)T * (hv + 1), 8.0f), *b = rand_buf((size_t)T * (hv + 2), 3.0f);
    float *A_log = rand_buf(hv, 1.0f), *dt = rand_buf(hv, 1.0f);
    a[0] = 30.0f; /* softplus shortcut region */
    a[1] = -30.0f;
    float *g = nan_buf((size_t)T * hv), *beta = nan_buf((size_t)T * hv);
    double *rg = malloc(sizeof(double) * T * hv), *rb = malloc(sizeof(double) * T * hv);
    for (int t = 0; t < T; t++)
        for (int h = 0; h < hv; h++) {
            double z = (double)a[t * (hv + 1) + h] + dt[h];
            double sp = z > 20 ? z : log1p(exp(z));
            rg[t * hv + h] = -exp((double)A_log[h]) * sp;
            rb[t * hv + h] = 1.0 / (1.0 + exp(-(double)b[t * (hv + 2) + h]));
        }
    qd_cpu_gdn_gates(a, hv + 1, b, hv + 2, T, hv, A_log, dt, g, beta);
    double eg = rel_err(g, rg, (size_t)T * hv), eb = rel_err(beta, rb, (size_t)T * hv);
    CHECKF(eg < 1e-5 && eb < 1e-6, "gates err g %g beta %g", eg, eb);
    free(x); free(ref); free(a); free(b); free(A_log); free(dt); free(g); free(beta); free(rg); free(rb);
}

static void test_rope(void) {
    int T = 6, heads = 3, hd = 32, rot = 8, xs = heads * hd + 4;
    float *x = rand_buf((size_t)T * xs, 1.0f);
    int32_t pos[6] = {0, 1, 7, 100, 1000, 4095};
    double *ref = malloc(sizeof(double) * (size_t)T * xs);
    double theta = 1e6;
    for (int t = 0; t < T; t++)
        for (int h = 0; h < heads; h++) {
            const float *v = x + t * xs + h * hd;
            double *r = ref + t * xs + h * hd;
            for (int i = 0; i < hd; i++) r[i] = v[i];
            for (int i = 0; i < rot / 2; i++) {
                double ang = pos[t] * pow(theta, -2.0 * i / rot);
                r[i] = v[i] * cos(ang) - v[i + rot / 2] * sin(ang);
                r[i + rot / 2] = v[i + rot / 2] * cos(ang) + v[i] * sin(ang);
            }
        }
    qd_cpu_rope_neox(x, T, heads, hd, xs, rot, theta, pos);
    double e = 0;
    for (int t = 0; t < T; t++) e = fmax(e, rel_err(x + t * xs, ref + t * xs, (size_t)heads * hd));
    /* fp32 angles at position 4095 carry ~4e-4 rad of rounding, as in the fp32 reference */
    CHECKF(e < 2e-3, "rope err %g", e);
    free(x); free(ref);
}

static void test_attention(qd_threadpool *pool) {
    const int cases[][4] = {{1, 0, 4, 2}, {5, 0, 4, 1}, {3, 7, 6, 3}, {17, 2, 2, 2}}; /* T, pos0, nq, nkv */
    for (int ci = 0; ci < 4; ci++) {
        int T = cases[ci][0], pos0 = cases[ci][1], nq = cases[ci][2], nkv = cases[ci][3], hd = 24;
        int ctx = pos0 + T, qs = nq * hd + 3;
        float *q = rand_buf((size_t)T * qs, 1.0f), *kc = rand_buf((size_t)ctx * nkv * hd, 1.0f);
        float *vc = rand_buf((size_t)ctx * nkv * hd, 1.0f), *out = nan_buf((size_t)T * nq * hd);
        double *ref = calloc((size_t)T * nq * hd, sizeof(double));
        double scale = 1.0 / sqrt(hd);
        for (int t = 0; t < T; t++)
            for (int n = 0; n < nq; n++) {
                int kv = n / (nq / nkv), np = pos0 + t + 1;
                double *sc = malloc(sizeof(double) * np), mx = -INFINITY, sum = 0;
                for (int p = 0; p < np; p++) {
                    double s = 0;
                    for (int e = 0; e < hd; e++) s += (double)q[t * qs + n * hd + e] * kc[(p * nkv + kv) * hd + e];
                    sc[p] = s * scale;
                    mx = fmax(mx, sc[p]);
                }
                for (int p = 0; p < np; p++) sum += (sc[p] = exp(sc[p] - mx));
                for (int p = 0; p < np; p++)
                    for (int e = 0; e < hd; e++) ref[(t * nq + n) * hd + e] += sc[p] / sum * vc[(p * nkv + kv) * hd + e];
                free(sc);
            }
        /* contiguous cache = one block table {0, 1, ...} */
        int32_t ident[64];
        for (int i = 0; i < 64; i++) ident[i] = i;
        qd_kv_view flat = {kc, vc, ident, 1, (int64_t)nkv * hd};
        qd_cpu_attention(pool, q, qs, &flat, T, pos0, nq, nkv, hd, (float)scale, out);
        double e = rel_err(out, ref, (size_t)T * nq * hd);
        CHECKF(e < 1e-5, "attention T=%d pos0=%d nq=%d nkv=%d err %g", T, pos0, nq, nkv, e);
        /* the same cache scattered over a pool of blocks of 3 positions in reverse order,
         * with an unrelated layer's data in between (block stride > block size) */
        const int bs = 3, nb = (ctx + bs - 1) / bs;
        const int64_t row = (int64_t)nkv * hd, stride = 2 * bs * row;
        float *pk = nan_buf((size_t)nb * stride), *pv = nan_buf((size_t)nb * stride);
        int32_t table[64];
        for (int b = 0; b < nb; b++) table[b] = nb - 1 - b;
        for (int p = 0; p < ctx; p++) {
            memcpy(pk + table[p / bs] * stride + (p % bs) * row, kc + p * row, sizeof(float) * row);
            memcpy(pv + table[p / bs] * stride + (p % bs) * row, vc + p * row, sizeof(float) * row);
        }
        qd_kv_view paged = {pk, pv, table, bs, stride};
        float *out2 = nan_buf((size_t)T * nq * hd);
        qd_cpu_attention(pool, q, qs, &paged, T, pos0, nq, nkv, hd, (float)scale, out2);
        CHECKF(memcmp(out, out2, sizeof(float) * T * nq * hd) == 0, "paged attention T=%d pos0=%d differs from contiguous", T, pos0);
        free(pk); free(pv); free(out2);
        free(q); free(kc); free(vc); free(out); free(ref);
    }
}

int main(void) {
    rng = qd_test_rng_from_env();
    qd_threadpool *pool = qd_threadpool_create(2);
    test_rmsnorm();
    test_gated_rmsnorm();
    test_conv1d();
    test_l2norm_gates();
    test_rope();
    test_attention(NULL);
    test_attention(pool);
    qd_threadpool_free(pool);
    return qd_test_finish("test_ops");
}
