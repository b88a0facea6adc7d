/* Per-token CPU ops: norms, causal conv, gates, RoPE, activations. fp32 throughout. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu_ops.h"

void qd_cpu_rmsnorm(const float *x, int64_t n_rows, int dim, int64_t x_stride, const float *w,
                    float w_offset, float eps, float *y, int64_t y_stride) {
    for (int64_t r = 0; r < n_rows; r++) {
        const float *xr = x + r * x_stride;
        float *yr = y + r * y_stride;
        float ss = 0.0f;
#pragma omp simd reduction(+ : ss)
        for (int i = 0; i < dim; i++) ss += xr[i] * xr[i];
        float inv = 1.0f / sqrtf(ss / (float)dim + eps);
        for (int i = 0; i < dim; i++) yr[i] = xr[i] * inv * (w_offset + w[i]);
    }
}

void qd_cpu_gated_rmsnorm(const float *o, const float *z, const float *w, int64_t T, int hv, int dv,
                          float eps, float *u) {
    for (int64_t t = 0; t < T; t++) {
        for (int h = 0; h < hv; h++) {
            const float *oh = o + (t * hv + h) * dv;
            const float *zh = z + (t * hv + h) * dv;
            float *uh = u + (t * hv + h) * dv;
            float ss = 0.0f;
#pragma omp simd reduction(+ : ss)
            for (int e = 0; e < dv; e++) ss += oh[e] * oh[e];
            float inv = 1.0f / sqrtf(ss / (float)dv + eps);
            for (int e = 0; e < dv; e++) uh[e] = oh[e] * inv * w[e] * qd_silu(zh[e]);
        }
    }
}

/* Scalar per-channel form: used when the scratch for the vectorised form cannot be had. */
static void conv1d_silu_scalar(const float *x, int64_t T, int C, int64_t x_stride, const float *w, int K,
                               float *state, float *y) {
    const int H = K - 1; /* history columns kept in the state */
    for (int c = 0; c < C; c++) {
        const float *wc = w + (int64_t)c * K;
        float *sc = state + (int64_t)c * H;
        float window[16]; /* window[0..H-1] = history (oldest first), window[H] = current input */
        for (int i = 0; i < H; i++) window[i] = sc[i];
        for (int64_t t = 0; t < T; t++) {
            window[H] = x[t * x_stride + c];
            float acc = 0.0f;
            for (int i = 0; i < K; i++) acc += wc[i] * window[i];
            y[t * C + c] = qd_silu(acc);
            for (int i = 0; i < H; i++) window[i] = window[i + 1];
        }
        for (int i = 0; i < H; i++) sc[i] = window[i];
    }
}

void qd_cpu_conv1d_silu(const float *x, int64_t T, int C, int64_t x_stride, const float *w, int K,
                        float *state, float *y) {
    const int H = K - 1;
    /* Token-major with the channel loop innermost, so rows of x are read once and the
     * loop vectorises; taps and history are transposed to [tap][C] for that. */
    float *wT = malloc(sizeof(float) * (size_t)K * C);
    float *hist = malloc(sizeof(float) * (size_t)(H > 0 ? H : 1) * C);
    if (!wT || !hist) {
        free(wT);
        free(hist);
        conv1d_silu_scalar(x, T, C, x_stride, w, K, state, y);
        return;
    }
    for (int c = 0; c < C; c++) {
        for (int i = 0; i < K; i++) wT[(size_t)i * C + c] = w[(size_t)c * K + i];
        for (int i = 0; i < H; i++) hist[(size_t)i * C + c] = state[(size_t)c * H + i];
    }
    for (int64_t t = 0; t < T; t++) {
        float *yt = y + t * C;
        for (int i = 0; i < K; i++) {
            int64_t j = t - H + i; /* input row of tap i; negative rows come from the history */
            const float *src = j >= 0 ? x + j * x_stride : hist + (size_t)(j + H) * C;
            const float *wi = wT + (size_t)i * C;
            if (i == 0)
                for (int c = 0; c < C; c++) yt[c] = wi[c] * src[c];
            else
                for (int c = 0; c < C; c++) yt[c] += wi[c] * src[c];
        }
        for (int c = 0; c < C; c++) yt[c] = qd_silu(yt[c]);
    }
    /* new state: the last H inputs of [history | x] */
    for (int r = 0; r < H; r++) {
        int64_t j = T - H + r;
        const float *src = j >= 0 ? x + j * x_stride : hist + (size_t)(j + H) * C;
        for (int c = 0; c < C; c++) state[(size_t)c * H + r] = src[c];
    }
    free(wT);
    free(hist);
}

void qd_cpu_l2norm_heads(float *x, int64_t T, int heads, int dim, int64_t x_stride, float eps, float scale) {
    for (int64_t t = 0; t < T; t++) {
        for (int h = 0; h < heads; h++) {
            float *v = x + t * x_stride + (int64_t)h * dim;
            float ss = 0.0f;
#pragma omp simd reduction(+ : ss)
            for (int i = 0; i < dim; i++) ss += v[i] * v[i];
            float f = scale / sqrtf(ss + eps);
            for (int i = 0; i < dim; i++) v[i] *= f;
        }
    }
}

static float softplus(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

void qd_cpu_gdn_gates(const float *a, int64_t a_stride, const float *b, int64_t b_stride, int64_t T,
                      int hv, const float *A_log, const float *dt_bias, float *g, float *beta) {
    for (int64_t t = 0; t < T; t++) {
        for (int h = 0; h < hv; h++) {
            g[t * hv + h] = -expf(A_log[h]) * softplus(a[t * a_stride + h] + dt_bias[h]);
            beta[t * hv + h] = qd_sigmoid(b[t * b_stride + h]);
        }
    }
}

void qd_cpu_rope_neox(float *x, int64_t T, int heads, int head_dim, int64_t x_stride, int rot_dim,
                      double theta, const int32_t *pos) {
    const int half = rot_dim / 2;
    for (int64_t t = 0; t < T; t++) {
        for (int i = 0; i < half; i++) {
            /* inv_freq computed as HF does: theta^(-2i/rot_dim) in fp32, angle p*inv_freq in fp32 */
            float inv_freq = (float)(1.0 / pow(theta, (double)(2 * i) / (double)rot_dim));
            float ang = (float)pos[t] * inv_freq;
            float c = cosf(ang), s = sinf(ang);
            for (int h = 0; h < heads; h++) {
                float *v = x + t * x_stride + (int64_t)h * head_dim;
                float x0 = v[i], x1 = v[i + half];
                v[i] = x0 * c - x1 * s;
                v[i + half] = x1 * c + x0 * s;
            }
        }
    }
}

void qd_cpu_silu_mul(const float *g, const float *u, int64_t n, float *y) {
    for (int64_t i = 0; i < n; i++) y[i] = qd_silu(g[i]) * u[i];
}
