/* Quantized-weight GEMV (cuda_quant.h) on the Qwen3.5-35B-A3B projection shapes: GB/s of
 * the weight bytes (data + scales) read per call, against the copy bandwidth of the same
 * run, and beside it the bf16 GEMV (qd_cuda_matmul at n <= 8) on the same shape. Weights
 * are rotated over copies beyond L2 (>= 200 MiB per format and shape) so that every call
 * reads HBM. Prints one RESULT line per format x shape x n, and where the table picks the
 * tensor-core kernel a qgemv_warps line: that kernel at 2, 4, 8 and 16 warps a block, the
 * figures its warp table (gemv_quant_mma.cu, qm_warps) follows; for FP8 a qgemv_wgmma line: the
 * kernel on the FP8 tensor cores (gemv_quant_wgmma.cu) at its table's block shape, against the
 * table's pick (vs_mma), and at each shape it can be given (warpgroups 1 / 2, clusters of 1-8
 * blocks along the columns; -1 where x would not fit a block's shared memory). */
#define BENCH_NAME "quant_cuda_bench"
#include <stdio.h>
#include <stdlib.h>

#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/cuda_quant.h"
#include "base/weight.h"
#include "cuda_bench_util.h"

typedef struct shape { const char *name; int64_t rows, cols; } shape;

static float time_ms(qd_cuda_timer *t, int iters, void (*fn)(void *, int), void *arg) {
    float v[5];
    for (int rep = 0; rep < 5; rep++) {
        fn(arg, 0);
        TRY(qd_cuda_timer_start(t));
        for (int i = 0; i < iters; i++) fn(arg, i);
        TRY(qd_cuda_timer_stop(t, &v[rep]));
    }
    return median(v, 5) / (float)iters;
}

typedef struct run {
    qd_weight w[256];
    const uint16_t *Wb[256];
    int copies, n;
    int64_t rows, cols;
    uint16_t *x;
    float *y;
    qd_cuda_blas *blas;
} run;

static void call_q(void *a, int i) {
    run *r = a;
    TRY(qd_cuda_qgemv(&r->w[i % r->copies], r->x, r->cols, r->n, r->y, r->rows, 0, NULL));
}
static void call_vec(void *a, int i) {
    run *r = a;
    TRY(qd_cuda_qgemv_path(QD_QGEMV_PATH_VEC, &r->w[i % r->copies], r->x, r->cols, r->n, r->y, r->rows, 0, NULL));
}
static int g_warps; /* call_w's warp count */
static void call_w(void *a, int i) {
    run *r = a;
    TRY(qd_cuda_qgemv_mma_warps(&r->w[i % r->copies], r->x, r->cols, r->n, r->y, r->rows, 0, g_warps, NULL));
}
static int g_wg, g_ks, g_refused; /* call_g's block shape (0, 0: the table's); set when it is refused */
static void call_g(void *a, int i) {
    run *r = a;
    const qd_cuda_qgemv_out o = {.qw = &r->w[i % r->copies], .rows = r->rows, .y = r->y, .ldy = r->rows};
    const qd_status s = qd_cuda_qgemv_wgmma(&o, 1, r->cols, r->x, r->cols, r->n, 0, g_wg, g_ks, NULL);
    if (s == QD_ERR_UNSUPPORTED) g_refused = 1; /* x of a rank past its shared memory at this shape */
    else TRY(s);
}
static void call_b(void *a, int i) {
    run *r = a;
    TRY(qd_cuda_matmul(r->blas, r->Wb[i % r->copies], r->rows, r->cols, r->x, r->cols, r->n, r->y, r->rows, 0));
}

int main(void) {
    if (qd_cuda_device_count() == 0) {
        printf(BENCH_NAME ": skipped: no CUDA device\n");
        return 0;
    }
    const double copy = copy_bw();
    printf("RESULT copy_GBps=%.0f\n", copy);
    qd_cuda_timer t;
    TRY(qd_cuda_timer_create(&t));
    run r = {0};
    TRY(qd_cuda_blas_create(&r.blas, NULL));
    static const shape shapes[] = {
        {"gdn_in_proj", 12288 + 64, 2048}, {"gdn_out", 2048, 4096}, {"attn_q", 8192, 2048},
        {"expert_gate_up", 1024, 2048},     {"expert_down", 2048, 512}, {"lm_head", 248320, 2048},
        {"27b_up", 17408, 5120},            {"27b_down", 5120, 17408},
    };
    static const qd_dtype fmts[] = {QD_DTYPE_F8_E4M3, QD_DTYPE_NVFP4, QD_DTYPE_INT4};
    static const int ns[] = {1, 4, 8, 16};
    r.x = upload(NULL, (size_t)16 * 17408 * 2);
    TRY(qd_cuda_memset(r.x, 0x3c, (size_t)16 * 17408 * 2));
    r.y = upload(NULL, (size_t)16 * 248320 * 4);
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        const shape *s = &shapes[si];
        r.rows = s->rows;
        r.cols = s->cols;
        const size_t bf = (size_t)(s->rows * s->cols) * 2;
        r.copies = (int)(((size_t)400 << 20) / bf + 1);
        if (r.copies > 256) r.copies = 256;
        for (int c = 0; c < r.copies; c++) {
            void *d = upload(NULL, bf);
            TRY(qd_cuda_memset(d, 0x3c, bf));
            r.Wb[c] = d;
        }
        for (size_t fi = 0; fi < sizeof fmts / sizeof fmts[0]; fi++) {
            qd_weight w = {.dtype = fmts[fi], .rows = s->rows, .cols = s->cols};
            w.scales.dtype = fmts[fi] == QD_DTYPE_NVFP4 ? QD_DTYPE_F8_E4M3 : QD_DTYPE_F32;
            w.scales.global = 1.0f;
            w.scales.block_rows = fmts[fi] == QD_DTYPE_F8_E4M3 ? 128 : 1;
            w.scales.block_cols = fmts[fi] == QD_DTYPE_F8_E4M3 ? 128 : fmts[fi] == QD_DTYPE_NVFP4 ? 16 : 128;
            w.scales.data = (void *)1; /* for the byte count */
            const size_t db = qd_weight_data_bytes(&w), sb = qd_weight_scale_bytes(&w);
            for (int c = 0; c < r.copies; c++) {
                r.w[c] = w;
                void *d = upload(NULL, db), *sc = upload(NULL, sb);
                TRY(qd_cuda_memset(d, 0x11, db));
                TRY(qd_cuda_memset(sc, 0x30, sb));
                r.w[c].data = d;
                r.w[c].scales.data = sc;
            }
            for (size_t ni = 0; ni < sizeof ns / sizeof ns[0]; ni++) {
                r.n = ns[ni];
                const int path = qd_cuda_qgemv_choice(&r.w[0], r.x, r.cols);
                const float qms = time_ms(&t, 20, call_q, &r), bms = time_ms(&t, 20, call_b, &r);
                /* the one-warp-per-row kernel beside the table's pick when that is the tensor-core one */
                const float vms = path == QD_QGEMV_PATH_MMA ? time_ms(&t, 20, call_vec, &r) : qms;
                const double qgb = (double)(db + sb) / (qms * 1e6), bgb = (double)bf / (bms * 1e6);
                printf("RESULT qgemv shape=%s rows=%lld cols=%lld fmt=%s n=%d path=%s us=%.1f GBps=%.0f pct_copy=%.0f "
                       "vec_us=%.1f vs_vec=%.2f bf16_us=%.1f bf16_GBps=%.0f speedup_vs_bf16=%.2f\n",
                       s->name, (long long)s->rows, (long long)s->cols, qd_dtype_name(fmts[fi]) ? qd_dtype_name(fmts[fi]) : "?",
                       r.n, path == QD_QGEMV_PATH_MMA ? "mma" : path == QD_QGEMV_PATH_VEC ? "vec" : "elem", qms * 1e3,
                       qgb, 100.0 * qgb / copy, vms * 1e3, vms / qms, bms * 1e3, bgb, bms / qms);
                if (fmts[fi] == QD_DTYPE_F8_E4M3) { /* the FP8 tensor cores: the table's shape, then each */
                    g_wg = g_ks = 0;
                    const float gms = time_ms(&t, 20, call_g, &r);
                    printf("RESULT qgemv_wgmma shape=%s n=%d us=%.1f pct_copy=%.0f vs_mma=%.2f", s->name, r.n, gms * 1e3,
                           100.0 * (double)(db + sb) / (gms * 1e6) / copy, qms / gms);
                    for (g_wg = 1; g_wg <= 4; g_wg *= 2)
                        for (g_ks = 1; g_ks <= 8; g_ks *= 2) {
                            g_refused = 0;
                            const float ms = time_ms(&t, 20, call_g, &r);
                            printf(" w%dk%d_us=%.1f", g_wg, g_ks, g_refused ? -1.0 : ms * 1e3);
                        }
                    printf("\n");
                }
                if (path == QD_QGEMV_PATH_MMA) { /* the tensor-core kernel at each warp count: the table's figures */
                    static const int ws[] = {2, 4, 8, 16};
                    printf("RESULT qgemv_warps shape=%s fmt=%s n=%d", s->name, qd_dtype_name(fmts[fi]), r.n);
                    for (int wi = 0; wi < 4; wi++) {
                        g_warps = ws[wi];
                        printf(" w%d_us=%.1f", ws[wi], time_ms(&t, 20, call_w, &r) * 1e3);
                    }
                    printf("\n");
                }
            }
            for (int c = 0; c < r.copies; c++) {
                qd_cuda_free((void *)r.w[c].data);
                qd_cuda_free((void *)r.w[c].scales.data);
            }
        }
        for (int c = 0; c < r.copies; c++) qd_cuda_free((void *)r.Wb[c]);
    }
    qd_cuda_blas_destroy(r.blas);
    qd_cuda_timer_destroy(&t);
    return 0;
}
