/* y[n][rows] = x[n][cols] . W^T with W stored as in the checkpoint (F32, BF16, F16).
 *
 * Two regimes, chosen per product by n:
 *  - decode and small batches (n <= QD_MM_GEMV_MAX_N): memory-bound. Each weight
 *    element is read from DRAM once; up to 4 x rows share each loaded weight, more x
 *    rows re-read a cache-sized block of W rows. Several W rows are streamed at once
 *    with independent accumulators so the loads, not FMA latency, are the limit, and
 *    the next rows are software-prefetched. bf16 -> f32 is a 16-bit shift, f16 uses F16C.
 *  - prefill (larger n): compute-bound. A panel of 16 W rows x KC columns is converted
 *    to f32 and transposed into per-task scratch once, then reused by a 6x16
 *    register-blocked micro-kernel for every x row (see matmul_gemm.c).
 *
 * Work is cut into tasks of (item, row range, x-row range) of roughly equal cost; each
 * pool thread takes a contiguous share of the cost, so MoE batches of many small
 * experts still use every core and a single product is split over rows (contiguous
 * rows per thread keep the hardware prefetchers streaming). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu_ops.h"
#include "backend/cpu/matmul_internal.h"

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define QD_MM_SIMD 1
#else
#define QD_MM_SIMD 0
#endif

#define QD_AI static inline __attribute__((always_inline))

/* ------------------------------------------------------------ decode GEMV */

#if QD_MM_SIMD
/* 8 weights at element index idx, as f32. dt is a compile-time constant after inlining. */
QD_AI __m256 load8(qd_dtype dt, const void *w, int64_t idx) {
    if (dt == QD_DTYPE_F32) return _mm256_loadu_ps((const float *)w + idx);
    __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)w + idx));
#ifdef __F16C__
    if (dt == QD_DTYPE_F16) return _mm256_cvtph_ps(h);
#endif
    /* bf16 is the top half of an f32: widen and shift into place. */
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

QD_AI float hsum8(__m256 v) {
    __m128 a = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    a = _mm_add_ps(a, _mm_movehl_ps(a, a));
    a = _mm_add_ss(a, _mm_movehdup_ps(a));
    return _mm_cvtss_f32(a);
}

/* NR rows of W against NX x rows; NR * NX accumulators + NX x vectors stay in the
 * 16 ymm registers. Column tail (cols % 8) is done in scalar. */
QD_AI void gemv_tile(qd_dtype dt, int NX, int NR, const void *w, int64_t cols, const float *x,
                     float *y, int64_t ldy, int64_t r, int pf) {
    __m256 acc[4][8];
    for (int i = 0; i < NX; i++)
        for (int j = 0; j < NR; j++) acc[i][j] = _mm256_setzero_ps();
    /* The hardware prefetchers lose track of NR interleaved row streams that cross
     * pages every few iterations, so fetch the next tile (the NR rows after these,
     * contiguous in memory) evenly spread over this tile's iterations. */
    const int es = dt == QD_DTYPE_F32 ? 4 : 2;
    const char *next = pf ? (const char *)w + (r + NR) * cols * es : (const char *)w;
    const int64_t pf_bytes = (int64_t)NR * 8 * es; /* next-tile bytes per iteration */
    int64_t k = 0;
    for (; k + 8 <= cols; k += 8) {
        if (pf)
            for (int64_t b = 0; b < pf_bytes; b += 64) _mm_prefetch(next + k * NR * es + b, _MM_HINT_T0);
        __m256 xv[4];
        for (int i = 0; i < NX; i++) xv[i] = _mm256_loadu_ps(x + i * cols + k);
        for (int j = 0; j < NR; j++) {
            __m256 wv = load8(dt, w, (r + j) * cols + k);
            for (int i = 0; i < NX; i++) acc[i][j] = _mm256_fmadd_ps(wv, xv[i], acc[i][j]);
        }
    }
    for (int i = 0; i < NX; i++) {
        for (int j = 0; j < NR; j++) {
            float s = hsum8(acc[i][j]);
            for (int64_t kk = k; kk < cols; kk++)
                s += qd_mm_wscalar(dt, w, (r + j) * cols + kk) * x[i * cols + kk];
            y[i * ldy + r + j] = s;
        }
    }
}

/* Rows [r0, r1) for NX x rows. Rows per tile shrink as NX grows to stay in registers. */
QD_AI void gemv_rows(qd_dtype dt, int NX, const void *w, int64_t cols, const float *x, float *y,
                     int64_t ldy, int64_t r0, int64_t r1, int64_t pf_end) {
    const int NR = NX == 1 ? 8 : NX == 2 ? 4 : NX == 3 ? 3 : 2;
    int64_t r = r0;
    for (; r + NR <= r1; r += NR) gemv_tile(dt, NX, NR, w, cols, x, y, ldy, r, r + 2 * NR <= pf_end);
    for (; r < r1; r++) gemv_tile(dt, NX, 1, w, cols, x, y, ldy, r, 0);
}

typedef void (*gemv_fn)(const void *w, int64_t cols, const float *x, float *y, int64_t ldy,
                        int64_t r0, int64_t r1, int64_t pf_end);
#define QD_GEMV_INST(name, dt, nx)                                                          \
    static void name(const void *w, int64_t cols, const float *x, float *y, int64_t ldy, \
                     int64_t r0, int64_t r1, int64_t pf_end) {                             \
        gemv_rows(dt, nx, w, cols, x, y, ldy, r0, r1, pf_end);                             \
    }
QD_GEMV_INST(gemv_f32_1, QD_DTYPE_F32, 1)
QD_GEMV_INST(gemv_f32_2, QD_DTYPE_F32, 2)
QD_GEMV_INST(gemv_f32_3, QD_DTYPE_F32, 3)
QD_GEMV_INST(gemv_f32_4, QD_DTYPE_F32, 4)
QD_GEMV_INST(gemv_bf16_1, QD_DTYPE_BF16, 1)
QD_GEMV_INST(gemv_bf16_2, QD_DTYPE_BF16, 2)
QD_GEMV_INST(gemv_bf16_3, QD_DTYPE_BF16, 3)
QD_GEMV_INST(gemv_bf16_4, QD_DTYPE_BF16, 4)
#ifdef __F16C__
QD_GEMV_INST(gemv_f16_1, QD_DTYPE_F16, 1)
QD_GEMV_INST(gemv_f16_2, QD_DTYPE_F16, 2)
QD_GEMV_INST(gemv_f16_3, QD_DTYPE_F16, 3)
QD_GEMV_INST(gemv_f16_4, QD_DTYPE_F16, 4)
#endif

static gemv_fn gemv_select(qd_dtype dt, int64_t n) {
    static const gemv_fn f32[4] = {gemv_f32_1, gemv_f32_2, gemv_f32_3, gemv_f32_4};
    static const gemv_fn bf16[4] = {gemv_bf16_1, gemv_bf16_2, gemv_bf16_3, gemv_bf16_4};
#ifdef __F16C__
    static const gemv_fn f16[4] = {gemv_f16_1, gemv_f16_2, gemv_f16_3, gemv_f16_4};
#endif
    if (n < 1 || n > 4) return NULL;
    switch (dt) {
    case QD_DTYPE_F32: return f32[n - 1];
    case QD_DTYPE_BF16: return bf16[n - 1];
#ifdef __F16C__
    case QD_DTYPE_F16: return f16[n - 1];
#endif
    default: return NULL;
    }
}
#else
typedef void (*gemv_fn)(const void *, int64_t, const float *, float *, int64_t, int64_t, int64_t, int64_t);
static gemv_fn gemv_select(qd_dtype dt, int64_t n) { (void)dt; (void)n; return NULL; }
#endif

/* n > 4: x rows in groups of 4 over a block of W rows small enough to stay in L1/L2,
 * so W comes from DRAM once and the later groups re-read it from cache. */
static void gemv_groups(const qd_weight *w, const float *x, int64_t n, float *y, int64_t r0, int64_t r1) {
    const int64_t cols = w->cols, rows = w->rows;
    gemv_fn f4 = gemv_select(w->dtype, n < 4 ? n : 4);
    if (n <= 4) {
        f4(w->data, cols, x, y, rows, r0, r1, r1);
        return;
    }
    gemv_fn ft = n % 4 ? gemv_select(w->dtype, n % 4) : NULL;
    int64_t rb = (int64_t)(16384 / ((size_t)cols * qd_dtype_size(w->dtype))) / 8 * 8;
    if (rb < 8) rb = 8;
    for (int64_t r = r0; r < r1; r += rb) {
        int64_t re = r + rb < r1 ? r + rb : r1;
        int64_t i = 0;
        for (; i + 4 <= n; i += 4) f4(w->data, cols, x + i * cols, y + i * rows, rows, r, re, r1);
        if (ft) ft(w->data, cols, x + i * cols, y + i * rows, rows, r, re, r1);
    }
}

/* Portable GEMV for any dtype and n: four partial sums per dot product so the
 * compiler can vectorise and the adds do not form one long dependency chain. */
static void gemv_scalar(qd_dtype dt, const void *w, int64_t cols, const float *x, int64_t n,
                        float *y, int64_t ldy, int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; r++) {
        for (int64_t i = 0; i < n; i++) {
            const float *xi = x + i * cols;
            float s0 = 0, s1 = 0, s2 = 0, s3 = 0;
            int64_t k = 0;
            for (; k + 4 <= cols; k += 4) {
                s0 += qd_mm_wscalar(dt, w, r * cols + k) * xi[k];
                s1 += qd_mm_wscalar(dt, w, r * cols + k + 1) * xi[k + 1];
                s2 += qd_mm_wscalar(dt, w, r * cols + k + 2) * xi[k + 2];
                s3 += qd_mm_wscalar(dt, w, r * cols + k + 3) * xi[k + 3];
            }
            for (; k < cols; k++) s0 += qd_mm_wscalar(dt, w, r * cols + k) * xi[k];
            y[i * ldy + r] = (s0 + s1) + (s2 + s3);
        }
    }
}

/* ------------------------------------------------------------ task split */

typedef struct mm_task {
    int item;
    int64_t r0, r1;     /* W rows */
    int64_t i0, i1;     /* x rows */
    double cost_end;    /* prefix sum of cost up to and including this task */
} mm_task;

typedef struct mm_job {
    const qd_matmul_item *items;
    const mm_task *tasks;
    int n_tasks;
    int n_parts;
    double total;
} mm_job;

/* The GEMV kernels sum a row the same way for every n (8 lanes over the columns, the
 * same horizontal sum, the same scalar tail; x rows only share the weight loads), so
 * fixed_order keeps them at any n. */
static int use_gemv(const qd_matmul_item *it) { return it->n <= QD_MM_GEMV_MAX_N || it->fixed_order; }

static void run_task(const qd_matmul_item *it, const mm_task *t) {
    const qd_weight *w = it->w;
    if (qd_weight_quantized(w)) {
        qd_mm_quant_range(w, it->x, it->y, t->r0, t->r1, t->i0, t->i1);
    } else if (use_gemv(it)) {
        if (gemv_select(w->dtype, 1)) gemv_groups(w, it->x, it->n, it->y, t->r0, t->r1);
        else gemv_scalar(w->dtype, w->data, w->cols, it->x, it->n, it->y, w->rows, t->r0, t->r1);
    } else {
        qd_mm_gemm_range(w, it->x, it->y, t->r0, t->r1, t->i0, t->i1);
    }
}

/* Part p of n_parts runs the tasks whose cost midpoint falls in its 1/n_parts share,
 * so parts get equal cost even when tasks of different items differ in size. */
static void run_parts(void *user, int64_t begin, int64_t end, int worker) {
    (void)worker;
    const mm_job *job = user;
    for (int64_t p = begin; p < end; p++) {
        double lo = job->total * (double)p / job->n_parts;
        double hi = job->total * (double)(p + 1) / job->n_parts;
        double prev = 0;
        for (int t = 0; t < job->n_tasks; t++) {
            const mm_task *tk = &job->tasks[t];
            double mid = 0.5 * (prev + tk->cost_end);
            prev = tk->cost_end;
            if (mid >= lo && (mid < hi || p == job->n_parts - 1)) run_task(&job->items[tk->item], tk);
        }
    }
}

static double item_cost(const qd_matmul_item *it) {
    const qd_weight *w = it->w;
    if (w->rows <= 0 || it->n <= 0) return 0;
    /* Time per weight element grows from "one DRAM read" at n = 1 to ~0.12 n at large
     * n (FMA bound); measured, good enough to balance mixed batches. */
    double n = 1.0 + 0.12 * (double)(it->n - 1);
    return (double)w->rows * (double)(w->cols > 0 ? w->cols : 1) * n;
}

/* Appends the tasks of one item, each worth about `target` cost. Returns the new count,
 * or -1 when `cap` would be exceeded. */
static int add_tasks(const qd_matmul_item *items, int item, double target, mm_task *tasks, int nt,
                     int cap, double *acc) {
    const qd_matmul_item *it = &items[item];
    int64_t rows = it->w->rows, n = it->n;
    double cost = item_cost(it);
    if (cost <= 0) return nt;
    double per_row = cost / (double)rows;
    if (use_gemv(it)) {
        int64_t rb = (int64_t)(target / per_row);
        rb = (rb + 7) / 8 * 8;
        if (rb < 8) rb = 8;
        for (int64_t r = 0; r < rows; r += rb) {
            if (nt >= cap) return -1;
            int64_t r1 = r + rb < rows ? r + rb : rows;
            *acc += per_row * (double)(r1 - r);
            tasks[nt++] = (mm_task){item, r, r1, 0, n, *acc};
        }
        return nt;
    }
    /* GEMM: whole panels of QD_MM_NR rows; if one panel is already much more than the
     * target (few rows, many x rows), split the x rows too, in multiples of QD_MM_MR. */
    int64_t panels = (rows + QD_MM_NR - 1) / QD_MM_NR;
    double per_panel = per_row * QD_MM_NR;
    int64_t pb = (int64_t)(target / per_panel);
    if (pb < 1) pb = 1;
    int64_t ib = n;
    if (per_panel > 2 * target) {
        ib = (int64_t)((double)n * target / per_panel);
        ib = (ib + QD_MM_MR - 1) / QD_MM_MR * QD_MM_MR;
        if (ib < 4 * QD_MM_MR) ib = 4 * QD_MM_MR;
    }
    for (int64_t p = 0; p < panels; p += pb) {
        int64_t r0 = p * QD_MM_NR, r1 = (p + pb) * QD_MM_NR;
        if (r1 > rows) r1 = rows;
        for (int64_t i = 0; i < n; i += ib) {
            if (nt >= cap) return -1;
            int64_t i1 = i + ib < n ? i + ib : n;
            *acc += per_row * (double)(r1 - r0) * (double)(i1 - i) / (double)n;
            tasks[nt++] = (mm_task){item, r0, r1, i, i1, *acc};
        }
    }
    return nt;
}

/* Below this many weight-element x row products a call runs on the calling thread:
 * waking the pool costs a few microseconds. */
#define QD_MM_SERIAL_COST 65536.0
#define QD_MM_TASKS_PER_THREAD 8
#define QD_MM_STACK_TASKS 256

static void zero_empty_k(const qd_matmul_item *it) {
    /* cols == 0: every dot product is empty; the kernels would not write y at all. */
    if (it->w->cols == 0 && it->n > 0 && it->w->rows > 0)
        memset(it->y, 0, sizeof(float) * (size_t)it->n * (size_t)it->w->rows);
}

void qd_cpu_matmul_batch(qd_threadpool *pool, const qd_matmul_item *items, int n_items) {
    if (!items || n_items <= 0) return;
    double total = 0;
    for (int i = 0; i < n_items; i++) {
        zero_empty_k(&items[i]);
        if (items[i].w->cols > 0) total += item_cost(&items[i]);
    }
    if (total <= 0) return;
    int threads = qd_threadpool_size(pool);
    if (total < QD_MM_SERIAL_COST) threads = 1;
    double target = total / (double)(threads * QD_MM_TASKS_PER_THREAD);

    mm_task stack_tasks[QD_MM_STACK_TASKS];
    mm_task *tasks = stack_tasks;
    int cap = QD_MM_STACK_TASKS;
    /* Every item contributes at least one task and at most ~2x its share, rounded. */
    int want = threads * QD_MM_TASKS_PER_THREAD * 3 + n_items * 2;
    if (want > cap) {
        mm_task *heap = malloc(sizeof(mm_task) * (size_t)want);
        if (heap) { tasks = heap; cap = want; }
    }
    int nt = 0;
    double acc = 0;
    for (int i = 0; i < n_items && nt >= 0; i++)
        if (items[i].w->cols > 0) nt = add_tasks(items, i, target, tasks, nt, cap, &acc);
    if (nt < 0) {
        /* Out of task slots (allocation failed): one item at a time, each still split. */
        if (tasks != stack_tasks) free(tasks);
        if (n_items == 1) { /* cannot split further: whole product on this thread */
            mm_task whole = {0, 0, items[0].w->rows, 0, items[0].n, 1.0};
            run_task(&items[0], &whole);
            return;
        }
        for (int i = 0; i < n_items; i++) qd_cpu_matmul_batch(pool, &items[i], 1);
        return;
    }
    mm_job job = {items, tasks, nt, threads, acc};
    if (threads > 1) qd_parallel_for(pool, threads, 1, run_parts, &job);
    else run_parts(&job, 0, 1, 0);
    if (tasks != stack_tasks) free(tasks);
}

void qd_cpu_matmul_mode(qd_threadpool *pool, const qd_weight *w, const float *x, int64_t n, float *y,
                        int fixed_order) {
    qd_matmul_item it = {w, x, n, y, fixed_order};
    qd_cpu_matmul_batch(pool, &it, 1);
}

void qd_cpu_matmul(qd_threadpool *pool, const qd_weight *w, const float *x, int64_t n, float *y) {
    qd_cpu_matmul_mode(pool, w, x, n, y, 0);
}
