/* Benchmark of the CUDA routed experts at the Qwen3.5-35B-A3B shape (H=2048,
 * E=256, k=8, I=512) for n = 1..64 (the decode path, and the grouped GEMMs beside it)
 * and 96 to 8192 (grouped GEMMs, each kernel of their table), plus a device-to-device copy for the bandwidth ceiling, all in one
 * process. Each timed call uses one of 16 pre-drawn random routings (k
 * distinct uniform experts per token), so the weights of a call are mostly
 * not in L2 from the call before, as in a real step where every layer has its
 * own weights. Times are CUDA-event medians over repeats after warm-up.
 * GBps counts the expert weights a call must read (3 I H bf16 per distinct
 * expert chosen, averaged over the routings); TFLOPS the expert matmuls
 * (6 I H per pair). Decode sizes are also timed as CUDA-graph replays on a
 * created stream ("moe_graph", how the engine runs a decode step). Also
 * times the router. The decode sizes run again with the experts in FP8 block-128, INT4
 * (128-column groups with zero points) and NVFP4 (random codes and scales: the bytes the
 * quantized kernels read, GBps counting the weights and scales per distinct expert;
 * "moe_fp8", "moe_int4", "moe_nvfp4" lines and their "_graph" ones), the grouped path
 * beside the decode kernels' as for bf16 (batch-invariant mode: W8A16 / W4A16, the weights
 * made bf16 in shared memory).
 * Arguments, if any, replace the list of n. Exits 77 without a GPU. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "backend/cuda/cuda_gdn.h"
#include "backend/cuda/cuda_device.h"
#include "backend/cuda/cuda_moe.h"
#include "backend/cuda/cuda_quant.h"

#define BENCH_NAME "moe_cuda_bench"
#include "cuda_bench_util.h"

#define H 2048
#define E 256
#define K 8
#define I 512
#define NROUTE 16


/* n bf16 values of scale s: a random pool repeated (filling 10^9 values one by one is slow). */
static uint16_t *bf16_fill(size_t n, float s) {
    uint16_t *b = malloc(n * 2);
    const size_t pool = (size_t)1 << 20;
    if (!b) exit(1);
    for (size_t i = 0; i < pool && i < n; i++) b[i] = qd_f32_to_bf16(s * urand());
    for (size_t i = pool; i < n; i += pool) memcpy(b + i, b, (n - i < pool ? n - i : pool) * 2);
    return b;
}



/* mats quantized matrices [rows][cols] on the device in the layout a checkpoint of the format
 * loads to, random codes from a repeated pool (filling 10^9 bytes one by one is slow):
 *   F8_E4M3: block-128 (e4m3 codes within +-1.875, no NaN code; f32 block scales);
 *   INT4: groups of 128 columns (f32 scales, a zero point byte a group: GPTQ / AWQ asymmetric);
 *   NVFP4: blocks of 16 columns (e4m3 scales 0.5 .. 0.9375, one global factor).
 * The weights' magnitude is about s, as the bf16 ones'. */
static qd_cuda_qmats quant_mats(int dtype, int mats, int64_t rows, int64_t cols, float s) {
    const int f8 = dtype == QD_DTYPE_F8_E4M3, fp4 = dtype == QD_DTYPE_NVFP4;
    const int64_t br = f8 ? 128 : 1, bc = f8 || dtype == QD_DTYPE_INT4 ? 128 : 16, row_bytes = f8 ? cols : cols / 2;
    const int64_t sr = (rows + br - 1) / br, nbc = (cols + bc - 1) / bc;
    const size_t bytes = (size_t)mats * (size_t)(rows * row_bytes), pool = (size_t)1 << 20;
    const size_t ns = (size_t)mats * (size_t)(sr * nbc), ss = fp4 ? 1 : 4;
    uint8_t *q = malloc(bytes), *sc = malloc(ns * ss), *z = dtype == QD_DTYPE_INT4 ? malloc(ns) : NULL;
    if (!q || !sc || (dtype == QD_DTYPE_INT4 && !z)) exit(1);
    for (size_t i = 0; i < pool && i < bytes; i++) q[i] = (uint8_t)(next_u64() & (f8 ? 0xbf : 0xff));
    for (size_t i = pool; i < bytes; i += pool) memcpy(q + i, q, bytes - i < pool ? bytes - i : pool);
    for (size_t i = 0; i < ns; i++) {
        if (fp4) {
            sc[i] = (uint8_t)(0x30 + next_u64() % 8);
        } else {
            const float v = s / (f8 ? 1.875f : 7.0f) * (0.5f + 0.25f * (urand() + 1.0f));
            memcpy(sc + i * 4, &v, 4);
        }
        if (z) z[i] = (uint8_t)(next_u64() % 16);
    }
    qd_cuda_qmats m = {.dtype = dtype, .n_mats = mats, .rows = rows, .cols = cols, .row_bytes = row_bytes,
                       .block_rows = br, .block_cols = bc, .global = fp4 ? s / 6.0f / 0.7f : 1.0f};
    qd_cuda_qmats_layout(&m);
    m.data = upload(q, bytes);
    m.scales = upload(sc, ns * ss);
    if (z) m.zeros = upload(z, ns);
    free(q);
    free(sc);
    free(z);
    return m;
}

static void free_mats(const qd_cuda_qmats *m) {
    qd_cuda_free((void *)m->data);
    qd_cuda_free((void *)m->scales);
    qd_cuda_free((void *)m->zeros);
}

/* Call i of a decode graph: the arguments with routing i of the NROUTE drawn ones. */
typedef struct route_call {
    qd_cuda_moe_args a;
    const int32_t *dsel;
    const float *dw;
    size_t P;
    void *stream;
} route_call;

static qd_status route_launch(void *ctx, int i) {
    route_call *c = ctx;
    c->a.d_sel = c->dsel + i * c->P;
    c->a.d_w = c->dw + i * c->P;
    return qd_cuda_moe_experts(&c->a, c->stream);
}

/* Decode as the engine runs it: the NROUTE calls captured in one CUDA graph on a created
 * stream and replayed (cuda_bench_util.h), so host launch costs are out of the picture.
 * Microseconds per call. */
static double graph_us(qd_cuda_moe_args a, const int32_t *dsel, const float *dw, size_t P) {
    route_call c = {a, dsel, dw, P, NULL};
    TRY(qd_cuda_stream_create(&c.stream));
    const double us = bench_graph_us(c.stream, route_launch, &c, NROUTE);
    qd_cuda_stream_destroy(c.stream);
    return us;
}

/* Median microseconds per call of the experts over the pre-drawn routings. */
static double time_experts(qd_cuda_moe_args *a, const int32_t *dsel, const float *dw, size_t P, int iters) {
    for (int i = 0; i < 8; i++) {
        a->d_sel = dsel + (i % NROUTE) * P;
        a->d_w = dw + (i % NROUTE) * P;
        TRY(qd_cuda_moe_experts(a, NULL));
    }
    qd_cuda_timer t;
    TRY(qd_cuda_timer_create(&t));
    float ms[7];
    for (int r = 0; r < 7; r++) {
        TRY(qd_cuda_timer_start(&t));
        for (int i = 0; i < iters; i++) {
            a->d_sel = dsel + (i % NROUTE) * P;
            a->d_w = dw + (i % NROUTE) * P;
            TRY(qd_cuda_moe_experts(a, NULL));
        }
        TRY(qd_cuda_timer_stop(&t, &ms[r]));
    }
    qd_cuda_timer_destroy(&t);
    return median(ms, 7) * 1e3 / iters;
}

/* The experts at n tokens: bf16 (dgu, ddn), or quantized (qgu, qdn non-NULL: the sizes of
 * the forward's CUDA graphs only, where the table picks between the decode kernels and the
 * grouped GEMMs on the stored bytes: W8A8, W4A16). */
static void bench_experts(int n, const uint16_t *dgu, const uint16_t *ddn, const qd_cuda_qmats *qgu,
                          const qd_cuda_qmats *qdn, double copy_gbs) {
    if (qgu && n > qd_cuda_moe_graph_max_tokens()) return;
    const size_t P = (size_t)n * K;
    int32_t *sel = malloc(NROUTE * P * 4);
    float *w = malloc(NROUTE * P * 4);
    if (!sel || !w) exit(1);
    double distinct = 0;
    for (int r = 0; r < NROUTE; r++) {
        unsigned char used[E] = {0};
        for (int t = 0; t < n; t++) {
            unsigned char mine[E] = {0};
            for (int j = 0; j < K; j++) {
                int e;
                do e = (int)(next_u64() % E);
                while (mine[e]);
                mine[e] = used[e] = 1;
                sel[r * P + (size_t)t * K + j] = e;
                w[r * P + (size_t)t * K + j] = 0.05f + 0.1f * (urand() + 1.0f);
            }
        }
        for (int e = 0; e < E; e++) distinct += used[e];
    }
    distinct /= NROUTE;
    uint16_t *x = bf16_fill((size_t)n * H, 1.0f);
    uint16_t *dx = upload(x, (size_t)n * H * 2);
    int32_t *dsel = upload(sel, NROUTE * P * 4);
    float *dw = upload(w, NROUTE * P * 4), *dy = upload(NULL, (size_t)n * H * 4);
    TRY(qd_cuda_memset(dy, 0, (size_t)n * H * 4));
    void *work = upload(NULL, qd_cuda_moe_work_bytes(n, H, I, E, K));
    /* H, I, E are macros here: positional */
    qd_cuda_moe_args a = {n, H, I, E, K, dx, dsel, dw, dgu, ddn, dy, work, NULL, 0, NULL, NULL, NULL, 0, NULL, NULL, 0};
    a.q_gate_up = qgu;
    a.q_down = qdn;
    const int quant = qgu != NULL, dt = quant ? qgu->dtype : QD_DTYPE_BF16, table_decode = qd_cuda_moe_decode_path(&a);
    const char *name = dt == QD_DTYPE_F8_E4M3 ? "moe_fp8"
                       : dt == QD_DTYPE_INT4  ? "moe_int4"
                       : dt == QD_DTYPE_NVFP4 ? "moe_nvfp4"
                                              : "moe";
    /* bytes a weight with its scales: FP8 a byte and an f32 a 128 x 128 block; INT4 half a byte
     * and an f32 and a zero byte a 128-column group; NVFP4 half a byte and an e4m3 a 16 */
    const double per_weight = dt == QD_DTYPE_F8_E4M3 ? 1.0 + 4.0 / (128 * 128)
                              : dt == QD_DTYPE_INT4  ? 0.5 + 5.0 / 128
                              : dt == QD_DTYPE_NVFP4 ? 0.5 + 1.0 / 16
                                                     : 2.0;
    const double bytes = distinct * 3.0 * I * H * per_weight;
    /* the table's path, then at decode sizes also the grouped GEMMs (what batch-invariant
     * mode takes at every n; FP8: W8A16): where they cross over is the table's bound; past
     * the decode bound each grouped-GEMM kernel forced, where its table starts */
    for (int grouped = 0; grouped <= table_decode; grouped++) {
        a.invariant = grouped;
        const double us = time_experts(&a, dsel, dw, P, n >= 512 ? 10 : 40);
        const double gbs = bytes / (us * 1e-6) / 1e9;
        const double tflops = 6.0 * I * H * (double)P / (us * 1e-6) / 1e12;
        printf("RESULT %s n=%d us=%.2f GBps=%.0f pct_copy=%.1f experts_read=%.1f TFLOPS=%.1f path=%s\n", name, n, us,
               gbs, 100.0 * gbs / copy_gbs, distinct, tflops, table_decode && !grouped ? "decode" : "grouped");
    }
    if (!table_decode && !quant) {
        const int kernels[2] = {QD_MOE_PREFILL_MMA, QD_MOE_PREFILL_WGMMA};
        const char *kname[2] = {"mma", "wgmma"};
        for (int q = 0; q < 2; q++) {
            a.prefill_kernel = kernels[q];
            const double us = time_experts(&a, dsel, dw, P, n >= 512 ? 10 : 40);
            printf("RESULT moe_kernel n=%d kernel=%s us=%.2f TFLOPS=%.1f\n", n, kname[q], us,
                   6.0 * I * H * (double)P / (us * 1e-6) / 1e12);
        }
        a.prefill_kernel = 0;
    }
    a.invariant = 0;
    if (table_decode) {
        const double gus = graph_us(a, dsel, dw, P);
        const double ggbs = bytes / (gus * 1e-6) / 1e9;
        if (gus > 0)
            printf("RESULT %s_graph n=%d us=%.2f GBps=%.0f pct_copy=%.1f\n", name, n, gus, ggbs,
                   100.0 * ggbs / copy_gbs);
    }
    qd_cuda_free(dx); qd_cuda_free(dsel); qd_cuda_free(dw); qd_cuda_free(dy); qd_cuda_free(work);
    free(sel); free(w); free(x);
}

static void bench_route(int n) {
    float *lg = malloc((size_t)n * E * 4);
    if (!lg) exit(1);
    for (size_t i = 0; i < (size_t)n * E; i++) lg[i] = 4.0f * urand();
    float *dlg = upload(lg, (size_t)n * E * 4), *dw = upload(NULL, (size_t)n * K * 4);
    int32_t *dsel = upload(NULL, (size_t)n * K * 4);
    for (int i = 0; i < 5; i++) TRY(qd_cuda_moe_route(dlg, E, n, E, K, 1, dsel, dw, NULL));
    qd_cuda_timer t;
    TRY(qd_cuda_timer_create(&t));
    float ms[7];
    for (int r = 0; r < 7; r++) {
        TRY(qd_cuda_timer_start(&t));
        for (int i = 0; i < 50; i++) TRY(qd_cuda_moe_route(dlg, E, n, E, K, 1, dsel, dw, NULL));
        TRY(qd_cuda_timer_stop(&t, &ms[r]));
    }
    qd_cuda_timer_destroy(&t);
    printf("RESULT route n=%d E=%d k=%d us=%.2f\n", n, E, K, median(ms, 7) * 1e3 / 50);
    qd_cuda_free(dlg); qd_cuda_free(dw); qd_cuda_free(dsel);
    free(lg);
}

int main(int argc, char **argv) {
    if (qd_cuda_device_count() <= 0) {
        printf("moe_cuda_bench: skipped: no CUDA device\n");
        return 77;
    }
    char name[128];
    int sms = 0;
    TRY(qd_cuda_device_info(name, sizeof name, &sms));
    printf("device: %s, %d SMs; H=%d E=%d k=%d I=%d (%.2f GB of expert weights)\n", name, sms, H, E, K, I,
           (double)E * 3 * I * H * 2 / 1e9);
    const double bw = copy_bw();
    printf("RESULT copy_GBps=%.0f\n", bw);
    uint16_t *gu = bf16_fill((size_t)E * 2 * I * H, sqrtf(3.0f / H));
    uint16_t *dn = bf16_fill((size_t)E * H * I, sqrtf(3.0f / I));
    uint16_t *dgu = upload(gu, (size_t)E * 2 * I * H * 2), *ddn = upload(dn, (size_t)E * H * I * 2);
    free(gu);
    free(dn);
    static const int ns_all[] = {1, 8, 16, 24, 32, 40, 48, 64, 96, 128, 256, 512, 1024, 2048, 4096, 8192};
    int ns[64], nn = 0; /* moe_cuda_bench n...: only these batch sizes (e.g. under a profiler) */
    for (int i = 1; i < argc && nn < 64; i++) ns[nn++] = atoi(argv[i]);
    for (size_t i = 0; argc <= 1 && i < sizeof ns_all / sizeof ns_all[0]; i++) ns[nn++] = ns_all[i];
    for (int i = 0; i < nn; i++) bench_experts(ns[i], dgu, ddn, NULL, NULL, bw);
    static const int formats[3] = {QD_DTYPE_F8_E4M3, QD_DTYPE_INT4, QD_DTYPE_NVFP4};
    for (int f = 0; f < 3; f++) {
        const qd_cuda_qmats qgu = quant_mats(formats[f], 2 * E, I, H, sqrtf(3.0f / H));
        const qd_cuda_qmats qdn = quant_mats(formats[f], E, H, I, sqrtf(3.0f / I));
        for (int i = 0; i < nn; i++) bench_experts(ns[i], dgu, ddn, &qgu, &qdn, bw);
        free_mats(&qgu);
        free_mats(&qdn);
    }
    if (argc <= 1) {
        bench_route(1);
        bench_route(4096);
    }
    qd_cuda_free(dgu);
    qd_cuda_free(ddn);
    return 0;
}
