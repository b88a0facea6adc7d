/* The quantized formats' exact dequantization (base/weight.c) and the CPU multiply of them
 * (backend/cpu/matmul_quant.c), on fresh random weights of awkward shapes:
 *  - qd_weight_dequant_rows / _span against an independent scalar decoder written from the
 *    published rules (model-spec section 8): e4m3 and e2m1 decoded bit by bit here, block
 *    scales with partial edge blocks, NVFP4's global, INT4 zeros and act-order g_idx;
 *  - qd_cpu_matmul (the GEMV regime at n <= 32 and the GEMM regime above) against a double
 *    dot product with the decoded weights, within 1e-5 of the sum of |products|;
 *  - batch invariance: each x row's y is bit-identical whatever n it was multiplied with. */
#include <math.h>
#include <string.h>

#include "backend/cpu/cpu_ops.h"
#include "base/threadpool.h"
#include "base/weight.h"
#include "qd_test.h"

static qd_test_rng rng;

static uint32_t rnd(void) { return (uint32_t)(qd_test_next(&rng) >> 32); }

/* e4m3 (bias 7, no infinities, S.1111.111 NaN) decoded from its bits */
static double e4m3(uint8_t b) {
    const int s = b >> 7, e = (b >> 3) & 15, m = b & 7;
    const double v = e == 0 ? ldexp(m / 8.0, -6) : ldexp(1.0 + m / 8.0, e - 7);
    return s ? -v : v;
}

static double e2m1(int c) {
    const int s = c >> 3, e = (c >> 1) & 3, m = c & 1;
    const double v = e == 0 ? m * 0.5 : ldexp(1.0 + m / 2.0, e - 1);
    return s ? -v : v;
}

typedef struct qw {
    qd_weight w;
    void *data, *scales;
    uint8_t *zeros;
    int32_t *gidx;
} qw;

static uint8_t rand_e4m3_finite(void) {
    uint8_t b;
    do b = (uint8_t)rnd();
    while ((b & 0x7f) == 0x7f);
    return b;
}

static qw make(qd_dtype dt, int64_t R, int64_t C, int64_t br, int64_t bc, int zeros, int gidx) {
    qw q = {0};
    const int64_t sr = (R + br - 1) / br, sc = (C + bc - 1) / bc;
    const size_t nb = dt == QD_DTYPE_F8_E4M3 ? (size_t)(R * C) : (size_t)(R * C / 2);
    q.data = malloc(nb);
    for (size_t i = 0; i < nb; i++) ((uint8_t *)q.data)[i] = dt == QD_DTYPE_F8_E4M3 ? rand_e4m3_finite() : (uint8_t)rnd();
    if (dt == QD_DTYPE_NVFP4) {
        q.scales = malloc((size_t)(sr * sc));
        for (int64_t i = 0; i < sr * sc; i++) ((uint8_t *)q.scales)[i] = (uint8_t)(0x20 + rnd() % 0x30); /* positive */
    } else {
        q.scales = malloc(sizeof(float) * (size_t)(sr * sc));
        for (int64_t i = 0; i < sr * sc; i++) ((float *)q.scales)[i] = 0.001f + 0.01f * (float)(rnd() % 1000) / 1000.0f;
    }
    if (zeros) {
        q.zeros = malloc((size_t)(sr * sc));
        for (int64_t i = 0; i < sr * sc; i++) q.zeros[i] = (uint8_t)(rnd() % 16);
    }
    if (gidx) {
        q.gidx = malloc(sizeof(int32_t) * (size_t)C);
        for (int64_t c = 0; c < C; c++) q.gidx[c] = (int32_t)(rnd() % (uint32_t)sc);
    }
    q.w = (qd_weight){.dtype = dt, .rows = R, .cols = C, .data = q.data,
                      .scales = {.dtype = dt == QD_DTYPE_NVFP4 ? QD_DTYPE_F8_E4M3 : QD_DTYPE_F32, .data = q.scales,
                                 .block_rows = br, .block_cols = bc, .global = dt == QD_DTYPE_NVFP4 ? 0.37f : 1.0f,
                                 .zeros = q.zeros, .g_idx = q.gidx}};
    return q;
}

static void release(qw *q) { free(q->data); free(q->scales); free(q->zeros); free(q->gidx); }

static double ref_elem(const qd_weight *w, int64_t r, int64_t c) {
    const qd_weight_scales *s = &w->scales;
    const int64_t sc = (w->cols + s->block_cols - 1) / s->block_cols;
    const uint8_t *d = w->data;
    if (w->dtype == QD_DTYPE_F8_E4M3)
        return e4m3(d[r * w->cols + c]) * ((const float *)s->data)[(r / s->block_rows) * sc + c / s->block_cols];
    const uint8_t b = d[(r * w->cols + c) / 2];
    const int v = c % 2 ? b >> 4 : b & 15;
    if (w->dtype == QD_DTYPE_NVFP4)
        return e2m1(v) * e4m3(((const uint8_t *)s->data)[r * sc + c / 16]) * (double)s->global;
    const int64_t g = (s->g_idx ? s->g_idx[c] : c / s->block_cols) + r * sc;
    return (double)(v - (s->zeros ? s->zeros[g] : 8)) * ((const float *)s->data)[g];
}

static void check(const char *what, qd_dtype dt, int64_t R, int64_t C, int64_t br, int64_t bc, int zeros, int gidx,
                  qd_threadpool *pool) {
    qw q = make(dt, R, C, br, bc, zeros, gidx);
    const qd_weight *w = &q.w;
    float *deq = malloc(sizeof(float) * (size_t)(R * C));
    qd_weight_dequant_rows(w, 0, R, deq);
    long bad = 0;
    for (int64_t r = 0; r < R; r++)
        for (int64_t c = 0; c < C; c++) {
            const double want = ref_elem(w, r, c), got = deq[r * C + c];
            bad += fabs(got - want) > 1e-7 * fabs(want);
        }
    CHECKF(bad == 0, "%s: %ld of %lld dequantized elements differ from the bit-level decoder", what, bad,
           (long long)(R * C));
    float span[7];
    const int64_t c0 = C > 9 ? C - 9 : 0, nspan = C - c0 < 7 ? C - c0 : 7;
    qd_weight_dequant_span(w, R - 1, c0, nspan, span);
    for (int64_t k = 0; k < nspan; k++) CHECK(span[k] == deq[(R - 1) * C + c0 + k]);

    const int64_t NMAX = 45;
    float *x = malloc(sizeof(float) * (size_t)(NMAX * C)), *y = malloc(sizeof(float) * (size_t)(NMAX * R)),
          *y1 = malloc(sizeof(float) * (size_t)R);
    for (int64_t i = 0; i < NMAX * C; i++) x[i] = qd_test_uniform(&rng);
    const int64_t ns[] = {1, 3, 5, 33, NMAX};
    double worst = 0;
    int invariant = 1;
    for (size_t t = 0; t < sizeof ns / sizeof *ns; t++) {
        const int64_t n = ns[t];
        qd_cpu_matmul(pool, w, x, n, y);
        for (int64_t i = 0; i < n; i++)
            for (int64_t r = 0; r < R; r++) {
                double s = 0, a = 0;
                for (int64_t c = 0; c < C; c++) {
                    const double p = ref_elem(w, r, c) * x[i * C + c];
                    s += p, a += fabs(p);
                }
                worst = fmax(worst, fabs(y[i * R + r] - s) / (a > 0 ? a : 1));
            }
        qd_cpu_matmul(pool, w, x + (n - 1) * C, 1, y1); /* the last row alone */
        invariant &= !memcmp(y1, y + (n - 1) * R, sizeof(float) * (size_t)R);
    }
    printf("  %-34s [%lld x %lld]: worst |y - ref| / sum|products| = %.2e\n", what, (long long)R, (long long)C, worst);
    CHECKF(worst <= 1e-5, "%s: matmul off by %g of the products' magnitude", what, worst);
    CHECKF(invariant, "%s: a row's y depends on the batch it was multiplied in", what);
    free(x); free(y); free(y1); free(deq);
    release(&q);
}

int main(void) {
    rng = qd_test_rng_from_env();
    qd_threadpool *pool = qd_threadpool_create(2);
    check("fp8 block 128, partial edges", QD_DTYPE_F8_E4M3, 300, 200, 128, 128, 0, 0, pool);
    check("fp8 per-channel", QD_DTYPE_F8_E4M3, 37, 77, 1, 77, 0, 0, pool);
    check("fp8 block 64x32", QD_DTYPE_F8_E4M3, 70, 100, 64, 32, 0, 0, pool);
    check("nvfp4", QD_DTYPE_NVFP4, 41, 144, 1, 16, 0, 0, pool);
    check("int4 sym group 32, partial group", QD_DTYPE_INT4, 19, 90, 1, 32, 0, 0, pool);
    check("int4 asym group 16", QD_DTYPE_INT4, 24, 64, 1, 16, 1, 0, pool);
    check("int4 asym act-order g_idx", QD_DTYPE_INT4, 33, 96, 1, 32, 1, 1, pool);
    check("int4 one group per row", QD_DTYPE_INT4, 17, 130, 1, 130, 1, 0, pool);
    check("int4 wide rows (scratch tiles)", QD_DTYPE_INT4, 9, 40000, 1, 128, 1, 0, pool);
    qd_threadpool_free(pool);
    return qd_test_finish("test_quant_matmul");
}
