/* test_backend_ops's shared helpers (backend_ops.h): inputs, naive pieces, the device arena. */
#include "backend_ops.h"

qd_threadpool *g_pool;

/* Allocation failure ends the test: every size here is small, so it is a bug. */
void *xmalloc(size_t n) {
    void *p = malloc(n ? n : 1);
    if (!p) {
        fprintf(stderr, "test_backend_ops: out of memory (%zu bytes)\n", n);
        exit(1);
    }
    return p;
}
float *nan_floats(size_t n) {
    float *p = xmalloc(sizeof(float) * n);
    for (size_t i = 0; i < n; i++) p[i] = NAN;
    return p;
}
float bf16_round(float x) { return qd_bf16_to_f32(qd_f32_to_bf16(x)); }

/* A float input of n elements, normal * scale, bf16-representable when bf16. */
float *in_rand(op_data *d, int slot, size_t n, float scale, int bf16, qd_test_rng *rng) {
    float *p = xmalloc(sizeof(float) * n + 4);
    for (size_t i = 0; i < n; i++) {
        p[i] = qd_test_normal(rng) * scale;
        if (bf16) p[i] = bf16_round(p[i]);
    }
    d->f[slot] = p;
    d->nf[slot] = n;
    return p;
}
float *in_zero(op_data *d, int slot, size_t n) {
    float *p = calloc(n + 1, sizeof(float));
    if (!p) exit(1);
    d->f[slot] = p;
    d->nf[slot] = n;
    return p;
}
int32_t *in_idx(op_data *d, int slot, size_t n) {
    d->i[slot] = xmalloc(sizeof(int32_t) * n + 4);
    d->ni[slot] = n;
    return d->i[slot];
}
/* A random permutation of 0..n-1 (Fisher-Yates): shuffled slots and block tables. */
void shuffle(int32_t *p, int n, qd_test_rng *rng) {
    for (int i = 0; i < n; i++) p[i] = i;
    for (int i = n - 1; i > 0; i--) {
        const int j = (int)(qd_test_next(rng) % (uint64_t)(i + 1));
        const int32_t t = p[i];
        p[i] = p[j];
        p[j] = t;
    }
}
void free_data(op_data *d) {
    for (int i = 0; i < MAX_IN; i++) free(d->f[i]);
    for (int i = 0; i < 4; i++) free(d->i[i]);
}
int span_total(const op_case *c) {
    int t = 0;
    for (int s = 0; s < c->n_spans; s++) t += c->lens[s];
    return t;
}
int span_first(const op_case *c, int s) {
    int t = 0;
    for (int j = 0; j < s; j++) t += c->lens[j];
    return t;
}
double naive_silu(double x) { return x / (1.0 + exp(-x)); }
double naive_sigmoid(double x) { return 1.0 / (1.0 + exp(-x)); }

/* y = x * (sum x^2 / dim + eps)^-1/2 * (off + w), in double */
void naive_rmsnorm(const float *x, int dim, const float *w, double off, double eps, double *y) {
    double ss = 0;
    for (int i = 0; i < dim; i++) ss += (double)x[i] * x[i];
    const double inv = 1.0 / sqrt(ss / dim + eps);
    for (int i = 0; i < dim; i++) y[i] = x[i] * inv * (off + w[i]);
}

/* NeoX rotate-half on the first rot dims of one head. The angle is the spec's (HF's):
 * inv_freq = theta^(-2i/rot) rounded to fp32 and pos * inv_freq in fp32 (at position
 * 4000 that fp32 angle is what the model was trained with, 4e-4 rad from the exact
 * one); its sine and cosine and the rotation in double. */
void naive_rope(double *v, int rot, double theta, int pos) {
    const int half = rot / 2;
    for (int i = 0; i < half; i++) {
        const float inv = (float)(1.0 / pow(theta, (double)(2 * i) / (double)rot));
        const double ang = (double)((float)pos * inv);
        const double c = cos(ang), s = sin(ang), x0 = v[i], x1 = v[i + half];
        v[i] = x0 * c - x1 * s;
        v[i + half] = x1 * c + x0 * s;
    }
}

/* -------------------------------------------------------------- CUDA helpers */
#ifdef QD_HAVE_CUDA

void *da_alloc(dev_arena *a, const void *h, size_t bytes) {
    void *d = qd_test_dev_upload(h, bytes ? bytes : 4);
    if (!d || a->n == 48) {
        fprintf(stderr, "  cuda: device allocation of %zu bytes failed: %s\n", bytes, qd_cuda_last_error());
        a->ok = 0;
        if (d) qd_cuda_free(d);
        return NULL;
    }
    /* no host data: poison (NaN as fp32 and bf16, -1 as int32) so unwritten outputs show */
    if (!h && qd_cuda_memset(d, 0xff, bytes ? bytes : 4) != QD_OK) a->ok = 0;
    a->p[a->n++] = d;
    return d;
}
/* A device bf16 copy of n floats (already bf16-representable: exact). */
uint16_t *da_bf16(dev_arena *a, const float *x, size_t n) {
    uint16_t *b = xmalloc(2 * n + 2);
    for (size_t i = 0; i < n; i++) b[i] = qd_f32_to_bf16(x[i]);
    uint16_t *d = da_alloc(a, b, 2 * n);
    free(b);
    return d;
}
float *da_f32(dev_arena *a, const float *x, size_t n) { return da_alloc(a, x, 4 * n); }
int32_t *da_i32(dev_arena *a, const int32_t *x, size_t n) { return da_alloc(a, x, 4 * n); }
void da_st(dev_arena *a, qd_status st, const char *what) {
    if (st != QD_OK) {
        fprintf(stderr, "  cuda: %s -> %s: %s\n", what, qd_status_name(st), qd_cuda_last_error());
        a->ok = 0;
    }
}
/* n device floats into out (after the device is idle) */
void da_get_f32(dev_arena *a, float *out, const float *d, size_t n) {
    if (!a->ok) return;
    DA_ST(a, qd_cuda_sync());
    if (a->ok) DA_ST(a, qd_cuda_memcpy_d2h(out, d, 4 * n));
}
/* n device bf16 values widened into out */
void da_get_bf16(dev_arena *a, float *out, const uint16_t *d, size_t n) {
    if (!a->ok) return;
    uint16_t *b = xmalloc(2 * n + 2);
    DA_ST(a, qd_cuda_sync());
    if (a->ok) DA_ST(a, qd_cuda_memcpy_d2h(b, d, 2 * n));
    if (a->ok)
        for (size_t i = 0; i < n; i++) out[i] = qd_bf16_to_f32(b[i]);
    free(b);
}
int da_done(dev_arena *a) {
    for (int i = 0; i < a->n; i++) qd_cuda_free(a->p[i]);
    return a->ok ? OP_OK : OP_FAIL;
}
qd_cuda_blas *g_blas;
#endif

/* ============================================================== the ops ======== */
