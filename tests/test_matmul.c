/* qd_cpu_matmul / qd_cpu_matmul_batch against a double-precision reference on
 * awkward shapes, all weight dtypes, with and without a thread pool; then
 * informational throughput numbers (no timing assertions). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend/cpu/cpu_ops.h"
#include "base/dtype.h"
#include "base/membw.h"
#include "base/clock.h"
#include "base/threadpool.h"
#include "qd_test.h"

static qd_test_rng rng;

/* A random weight of the given dtype plus its exact f32 values (after rounding),
 * which is what the reference must use. */
typedef struct test_w {
    qd_weight w;
    void *data;
    float *f;
} test_w;

static int make_weight(test_w *t, qd_dtype dt, int64_t rows, int64_t cols) {
    size_t n = (size_t)(rows * cols);
    t->f = malloc(sizeof(float) * (n ? n : 1));
    t->data = malloc(qd_dtype_size(dt) * (n ? n : 1));
    if (!t->f || !t->data) return 0;
    for (size_t i = 0; i < n; i++) {
        float v = qd_test_normal(&rng);
        if (dt == QD_DTYPE_BF16) {
            uint16_t h = qd_f32_to_bf16(v);
            ((uint16_t *)t->data)[i] = h;
            t->f[i] = qd_bf16_to_f32(h);
        } else if (dt == QD_DTYPE_F16) {
            uint16_t h = qd_f32_to_f16(v);
            ((uint16_t *)t->data)[i] = h;
            t->f[i] = qd_f16_to_f32(h);
        } else {
            ((float *)t->data)[i] = v;
            t->f[i] = v;
        }
    }
    t->w = (qd_weight){.dtype = dt, .rows = rows, .cols = cols, .data = t->data};
    return 1;
}

static void free_weight(test_w *t) {
    free(t->f);
    free(t->data);
}

static float *rand_floats(size_t n) {
    float *p = malloc(sizeof(float) * (n ? n : 1));
    if (p)
        for (size_t i = 0; i < n; i++) p[i] = qd_test_uniform(&rng);
    return p;
}

static float *nan_floats(size_t n) {
    float *p = malloc(sizeof(float) * (n ? n : 1));
    if (p)
        for (size_t i = 0; i < n; i++) p[i] = NAN;
    return p;
}

/* Checks every y element against the double reference; returns the number of bad ones
 * and reports the first. */
static int check_result(const test_w *t, const float *x, int64_t n, const float *y, const char *what) {
    int64_t rows = t->w.rows, cols = t->w.cols;
    int bad = 0;
    for (int64_t i = 0; i < n; i++) {
        for (int64_t r = 0; r < rows; r++) {
            double s = 0, mag = 0;
            for (int64_t k = 0; k < cols; k++) {
                double p = (double)x[i * cols + k] * (double)t->f[r * cols + k];
                s += p;
                mag += fabs(p);
            }
            double got = y[i * rows + r];
            double tol = 1e-5 * mag + 1e-30;
            if (!(fabs(got - s) <= tol)) {
                if (!bad)
                    fprintf(stderr, "%s %s %lldx%lld n=%lld: y[%lld][%lld] = %.9g, want %.9g (tol %.3g)\n",
                            what, qd_dtype_name(t->w.dtype), (long long)rows, (long long)cols,
                            (long long)n, (long long)i, (long long)r, got, s, tol);
                bad++;
            }
        }
    }
    return bad;
}

static void test_shape(qd_threadpool *pool, qd_dtype dt, int64_t rows, int64_t cols, int64_t n) {
    test_w t;
    float *x = rand_floats((size_t)(n * cols));
    float *y = nan_floats((size_t)(n * rows));
    if (!make_weight(&t, dt, rows, cols) || !x || !y) {
        CHECKF(0, "out of memory");
        return;
    }
    qd_cpu_matmul(pool, &t.w, x, n, y);
    int bad = check_result(&t, x, n, y, pool ? "pool" : "serial");
    CHECKF(bad == 0, "%d wrong of %lld", bad, (long long)(n * rows));
    free_weight(&t);
    free(x);
    free(y);
}

static const int64_t dims[] = {1, 3, 7, 17, 33, 64, 100, 257, 1000};
static const int64_t ns[] = {1, 2, 3, 5, 16, 33, 130};
#define NDIMS (int)(sizeof dims / sizeof dims[0])
#define NNS (int)(sizeof ns / sizeof ns[0])

static void test_shapes(qd_threadpool *pool) {
    const qd_dtype dts[] = {QD_DTYPE_F32, QD_DTYPE_BF16, QD_DTYPE_F16};
    for (int d = 0; d < 3; d++) {
        /* every rows x cols pair, n cycling through the list (smaller n for big shapes
         * to keep the double reference quick) */
        for (int a = 0; a < NDIMS; a++)
            for (int b = 0; b < NDIMS; b++) {
                int64_t n = ns[(a + 2 * b + d) % NNS];
                while (n > 1 && dims[a] * dims[b] * n > 4000000) n = n / 4 + 1;
                test_shape(pool, dts[d], dims[a], dims[b], n);
            }
        /* every n on a few shapes that exercise row/column tails of both kernels */
        for (int k = 0; k < NNS; k++) {
            test_shape(pool, dts[d], 33, 100, ns[k]);
            test_shape(pool, dts[d], 257, 17, ns[k]);
            test_shape(pool, dts[d], 7, 1000, ns[k]);
            test_shape(pool, dts[d], 64, 300, ns[k]); /* > KC: accumulation across panels */
        }
    }
    /* n = 0 and cols = 0 edge cases */
    test_shape(pool, QD_DTYPE_BF16, 17, 33, 0);
    test_shape(pool, QD_DTYPE_BF16, 17, 0, 3);
    test_shape(pool, QD_DTYPE_F32, 5, 0, 20);
}

/* A batch of mixed experts must give exactly what the individual calls give (each
 * output element is computed by the same code path whatever the split). Large
 * batches exercise the heap-allocated task list. */
static void test_batch(qd_threadpool *pool, int n_items) {
    test_w *t = calloc((size_t)n_items, sizeof *t);
    qd_matmul_item *items = calloc((size_t)n_items, sizeof *items);
    float **xs = calloc((size_t)n_items, sizeof *xs), **ya = calloc((size_t)n_items, sizeof *ya),
          **yb = calloc((size_t)n_items, sizeof *yb);
    if (!t || !items || !xs || !ya || !yb) {
        CHECKF(0, "out of memory");
        return;
    }
    const qd_dtype dts[] = {QD_DTYPE_F32, QD_DTYPE_BF16, QD_DTYPE_F16};
    const int64_t bn[] = {1, 3, 5, 16, 0, 2, 33, 1, 7, 4, 130, 1, 40};
    for (int i = 0; i < n_items; i++) {
        int64_t rows = dims[(i * 5 + 2) % NDIMS], cols = dims[(i * 7 + 3) % NDIMS];
        if (rows * cols > 100000) rows = 64;
        int64_t n = bn[i % (int)(sizeof bn / sizeof bn[0])];
        xs[i] = rand_floats((size_t)(n * cols));
        ya[i] = nan_floats((size_t)(n * rows));
        yb[i] = nan_floats((size_t)(n * rows));
        if (!make_weight(&t[i], dts[i % 3], rows, cols) || !xs[i] || !ya[i] || !yb[i]) {
            CHECKF(0, "out of memory");
            return;
        }
        items[i] = (qd_matmul_item){&t[i].w, xs[i], n, yb[i], 0};
        qd_cpu_matmul(pool, &t[i].w, xs[i], n, ya[i]);
    }
    qd_cpu_matmul_batch(pool, items, n_items);
    int differ = 0, wrong = 0;
    for (int i = 0; i < n_items; i++) {
        size_t cnt = (size_t)(items[i].n * t[i].w.rows);
        if (memcmp(ya[i], yb[i], sizeof(float) * cnt) != 0) differ++;
        if (check_result(&t[i], xs[i], items[i].n, yb[i], "batch") != 0) wrong++;
        free_weight(&t[i]);
        free(xs[i]);
        free(ya[i]);
        free(yb[i]);
    }
    CHECKF(differ == 0, "%d of %d batch items differ from single calls", differ, n_items);
    CHECKF(wrong == 0, "%d of %d batch items wrong", wrong, n_items);
    free(t);
    free(items);
    free(xs);
    free(ya);
    free(yb);
}

/* ------------------------------------------------------------ throughput */

/* fixed_order (batch-invariant mode): each x row's outputs are bit-identical whatever n
 * and wherever the row sits in the batch, and correct; without it the GEMM of larger n
 * may round differently (not checked: allowed). Every dtype, odd column counts. */
static void test_fixed_order(qd_threadpool *pool) {
    static const int64_t shapes[][2] = {{37, 64}, {130, 200}, {9, 1000}, {64, 13}};
    static const int64_t batch[] = {1, 2, 4, 5, 33, 64, 130};
    static const qd_dtype dts[] = {QD_DTYPE_BF16, QD_DTYPE_F16, QD_DTYPE_F32};
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        const int64_t rows = shapes[si][0], cols = shapes[si][1], nmax = 130;
        test_w t;
        const qd_dtype dt = dts[si % 3];
        float *x = rand_floats((size_t)(nmax * cols)), *y1 = nan_floats((size_t)rows);
        float *xb = malloc(sizeof(float) * (size_t)(nmax * cols)), *yb = nan_floats((size_t)(nmax * rows));
        if (!make_weight(&t, dt, rows, cols) || !x || !y1 || !xb || !yb) {
            CHECKF(0, "out of memory");
            return;
        }
        int differ = 0, wrong = 0;
        for (size_t bi = 0; bi < sizeof batch / sizeof batch[0]; bi++) {
            const int64_t n = batch[bi];
            /* the rows of x in a rotated order: row j of the batch is x row (j + shift) % n */
            const int64_t shift = (int64_t)(qd_test_uniform(&rng) * 0.5 * (double)n + 0.5 * (double)n) % n;
            for (int64_t j = 0; j < n; j++)
                memcpy(xb + j * cols, x + ((j + shift) % n) * cols, sizeof(float) * (size_t)cols);
            qd_cpu_matmul_mode(pool, &t.w, xb, n, yb, 1);
            wrong += check_result(&t, xb, n, yb, "fixed order");
            for (int64_t j = 0; j < n; j++) {
                qd_cpu_matmul_mode(pool, &t.w, xb + j * cols, 1, y1, 1);
                if (memcmp(y1, yb + j * rows, sizeof(float) * (size_t)rows) != 0) differ++;
            }
        }
        CHECKF(wrong == 0, "fixed order %s %lldx%lld: %d wrong", qd_dtype_name(dt), (long long)rows, (long long)cols,
               wrong);
        CHECKF(differ == 0, "fixed order %s %lldx%lld: %d batched rows differ from the same row alone",
               qd_dtype_name(dt), (long long)rows, (long long)cols, differ);
        free_weight(&t);
        free(x);
        free(xb);
        free(y1);
        free(yb);
    }
}

/* Best time of `reps` calls (after one warm-up). */
static double time_matmul(qd_threadpool *pool, const qd_weight *w, const float *x, int64_t n, float *y,
                          int reps) {
    qd_cpu_matmul(pool, w, x, n, y);
    double best = 1e30;
    for (int r = 0; r < reps; r++) {
        double t0 = qd_clock_seconds();
        qd_cpu_matmul(pool, w, x, n, y);
        double dt = qd_clock_seconds() - t0;
        if (dt < best) best = dt;
    }
    return best;
}

static void bench_gemv(qd_threadpool *pool, qd_dtype dt, int64_t rows, int64_t cols, int64_t n, int reps,
                       double mem_gbps) {
    size_t bytes = (size_t)(rows * cols) * qd_dtype_size(dt);
    void *data = malloc(bytes);
    float *x = rand_floats((size_t)(n * cols));
    float *y = malloc(sizeof(float) * (size_t)(n * rows));
    if (!data || !x || !y) {
        printf("bench: out of memory\n");
        free(data); free(x); free(y);
        return;
    }
    /* Small random weights; the bit pattern only has to be finite. */
    for (size_t i = 0; i < bytes / 2; i++) ((uint16_t *)data)[i] = (uint16_t)(0x3c00 | (qd_test_next(&rng) & 0xff));
    qd_weight w = {.dtype = dt, .rows = rows, .cols = cols, .data = data};
    double t = time_matmul(pool, &w, x, n, y, reps);
    double gbps = (double)bytes / t * 1e-9;
    printf("  GEMV %-4s %6lldx%-5lld n=%lld threads=%d: %8.3f ms  %6.2f GB/s  (%3.0f%% of read bw%s)%s\n",
           qd_dtype_name(dt), (long long)rows, (long long)cols, (long long)n, qd_threadpool_size(pool),
           t * 1e3, gbps, 100.0 * gbps / mem_gbps, pool ? "" : ", 1 thread", bytes < (32u << 20) ? "  [fits in L3]" : "");
    free(data);
    free(x);
    free(y);
}

static void bench_gemm(qd_threadpool *pool, qd_dtype dt, int64_t rows, int64_t cols, int64_t n, int reps) {
    size_t bytes = (size_t)(rows * cols) * qd_dtype_size(dt);
    void *data = malloc(bytes);
    float *x = rand_floats((size_t)(n * cols));
    float *y = malloc(sizeof(float) * (size_t)(n * rows));
    if (!data || !x || !y) {
        printf("bench: out of memory\n");
        free(data); free(x); free(y);
        return;
    }
    for (size_t i = 0; i < bytes / 2; i++) ((uint16_t *)data)[i] = (uint16_t)(0x3c00 | (qd_test_next(&rng) & 0xff));
    qd_weight w = {.dtype = dt, .rows = rows, .cols = cols, .data = data};
    double t = time_matmul(pool, &w, x, n, y, reps);
    printf("  GEMM %-4s %6lldx%-5lld n=%lld threads=%d: %8.3f ms  %6.1f GFLOP/s\n", qd_dtype_name(dt),
           (long long)rows, (long long)cols, (long long)n, qd_threadpool_size(pool), t * 1e3,
           2.0 * (double)n * (double)rows * (double)cols / t * 1e-9);
    free(data);
    free(x);
    free(y);
}

int main(void) {
    rng = qd_test_rng_from_env();
    qd_threadpool *pool = qd_threadpool_create(2);
    CHECK(pool != NULL);
    if (!pool) return qd_test_finish("test_matmul");

    if (!getenv("QD_TEST_BENCH_ONLY")) {
        test_shapes(NULL);
        test_shapes(pool);
        test_batch(NULL, 13);
        test_batch(pool, 13);
        test_batch(pool, 300);
        test_fixed_order(NULL);
        test_fixed_order(pool);
    }

    if (!getenv("QD_TEST_NO_BENCH")) {
        printf("throughput (informational):\n");
        /* The cores are shared with other work, so take the best of read-bandwidth
         * measurements taken before and after the GEMV runs. */
        double rd = qd_measure_read_gbps(pool, (size_t)512 << 20);
        double cp = qd_measure_copy_gbps(pool, (size_t)256 << 20);
        double rd1 = qd_measure_read_gbps(NULL, (size_t)512 << 20);
        printf("  memory (before): read %.2f GB/s (2 threads), %.2f GB/s (1 thread); memcpy %.2f GB/s read\n",
               rd, rd1, cp);
        bench_gemv(pool, QD_DTYPE_BF16, 4096, 1024, 1, 200, rd);
        bench_gemv(pool, QD_DTYPE_BF16, 151936, 1024, 1, 10, rd);
        bench_gemv(NULL, QD_DTYPE_BF16, 151936, 1024, 1, 5, rd1);
        bench_gemv(pool, QD_DTYPE_BF16, 151936, 1024, 4, 5, rd);
        bench_gemv(pool, QD_DTYPE_BF16, 151936, 1024, 8, 3, rd);
        bench_gemv(pool, QD_DTYPE_F16, 151936, 1024, 1, 5, rd);
        bench_gemv(pool, QD_DTYPE_F32, 151936, 1024, 1, 5, rd);
        double rd_after = qd_measure_read_gbps(pool, (size_t)512 << 20);
        printf("  memory (after): read %.2f GB/s (2 threads); percentages above use the 'before' value\n", rd_after);
        bench_gemm(pool, QD_DTYPE_BF16, 3584, 1024, 512, 3);
        bench_gemm(NULL, QD_DTYPE_BF16, 3584, 1024, 512, 2);
    }
    qd_threadpool_free(pool);
    return qd_test_finish("test_matmul");
}
