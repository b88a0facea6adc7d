/* The W8A8 FP8 GEMM (cuda_quant.h: 128 x 128 block weight scales, per-token 1 x 128
 * activation scales, cuBLASLt's block-scaled FP8 GEMM) on prefill shapes, in one run beside
 *   bf16:    our BF16 product (qd_cuda_matmul: cuBLAS, bf16 weights and activations);
 *   tensor:  cuBLASLt's FP8 GEMM with one scale per operand (the per-tensor scheme: the
 *            ceiling of an FP8 GEMM on this device), on the same e4m3 operands;
 *   dequant: the path FP8 prefill took before, the weight dequantized to bf16 then the bf16
 *            product.
 * fp8 is the whole call the forward makes (activation quantization + GEMM); fp8_quant the
 * activation quantization alone. Shapes: M x K weights (rows x cols) times N tokens, the
 * 4096 x 4096 x 8192 class of the issue and the Qwen3.5-35B-A3B / 27B projections at an
 * 8192-token prefill. TFLOPS = 2 M N K / time. Prints one RESULT line per shape. */
#define BENCH_NAME "fp8_gemm_cuda_bench"
#include <stdio.h>
#include <stdlib.h>

#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/cuda_quant.h"
#include "base/weight.h"
#include "cuda_bench_util.h"

typedef struct shape { const char *name; int64_t M, K; int N; } shape;

typedef struct run {
    qd_cuda_blas *blas;
    qd_weight w;          /* device FP8 weight, block scales */
    uint16_t *wb, *x, *dq;
    uint8_t *xq;
    float *y, *sw1, *sx1, *xs;
    void *scratch;
    size_t sbytes;
    shape s;
} run;

static void call_bf16(run *r) { TRY(qd_cuda_matmul(r->blas, r->wb, r->s.M, r->s.K, r->x, r->s.K, r->s.N, r->y, r->s.M, 0)); }
static void call_fp8(run *r) {
    TRY(qd_cuda_fp8_gemm(r->blas, &r->w, r->x, r->s.K, r->s.N, r->y, r->s.M, 0, r->scratch, r->sbytes, NULL));
}
static void call_quant(run *r) {
    TRY(qd_cuda_fp8_quant_act(r->x, r->s.K, r->s.N, r->s.K, QD_FP8_GEMM_BLOCK, r->s.N, r->xq, r->xs, NULL));
}
static void call_tensor(run *r) {
    TRY(qd_cuda_fp8_gemm_tensor(r->blas, r->w.data, r->s.M, r->s.K, r->sw1, r->xq, r->s.N, r->sx1, r->y, r->s.M, NULL));
}
static void call_dequant(run *r) {
    TRY(qd_cuda_dequant_bf16(&r->w, r->dq, NULL));
    TRY(qd_cuda_matmul(r->blas, r->dq, r->s.M, r->s.K, r->x, r->s.K, r->s.N, r->y, r->s.M, 0));
}

static float time_ms(qd_cuda_timer *t, void (*fn)(run *), run *r) {
    float v[5];
    for (int rep = 0; rep < 5; rep++) {
        fn(r);
        TRY(qd_cuda_timer_start(t));
        for (int i = 0; i < 10; i++) fn(r);
        TRY(qd_cuda_timer_stop(t, &v[rep]));
    }
    return median(v, 5) / 10.0f;
}

int main(void) {
    if (qd_cuda_device_count() == 0) {
        printf(BENCH_NAME ": skipped: no CUDA device\n");
        return 0;
    }
    qd_cuda_timer t;
    TRY(qd_cuda_timer_create(&t));
    run r = {0};
    TRY(qd_cuda_blas_create(&r.blas, NULL));
    static const shape shapes[] = {
        {"square", 4096, 4096, 8192},          {"square_n4096", 4096, 4096, 4096},
        {"a3b_gdn_in", 12352, 2048, 8192},     {"a3b_attn_q", 8192, 2048, 8192},
        {"a3b_gdn_out", 2048, 4096, 8192},     {"27b_up", 17408, 5120, 8192},
        {"27b_down", 5120, 17408, 8192},
    };
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        r.s = shapes[si];
        const int64_t M = r.s.M, K = r.s.K, N = r.s.N, L = (K + 127) / 128;
        uint8_t *hq = malloc((size_t)(M * K));
        uint16_t *hb = malloc((size_t)(M * K) * 2), *hx = malloc((size_t)(N * K) * 2);
        for (int64_t i = 0; i < M * K; i++) {
            hq[i] = (uint8_t)(next_u64() >> 56) & 0x77; /* finite e4m3 up to 240 */
            hb[i] = qd_f32_to_bf16(urand() * 0.05f);
        }
        for (int64_t i = 0; i < N * K; i++) hx[i] = qd_f32_to_bf16(urand());
        const int64_t ns = ((M + 127) / 128) * L;
        float *hs = malloc(sizeof(float) * (size_t)ns);
        for (int64_t i = 0; i < ns; i++) hs[i] = 1e-3f * (1.5f + urand());
        r.w = (qd_weight){.dtype = QD_DTYPE_F8_E4M3, .rows = M, .cols = K};
        r.w.data = upload(hq, (size_t)(M * K));
        r.w.scales = (qd_weight_scales){.dtype = QD_DTYPE_F32, .data = upload(hs, sizeof(float) * (size_t)ns),
                                        .block_rows = 128, .block_cols = 128, .global = 1.0f};
        r.wb = upload(hb, (size_t)(M * K) * 2);
        r.x = upload(hx, (size_t)(N * K) * 2);
        r.dq = upload(NULL, (size_t)(M * K) * 2);
        r.y = upload(NULL, sizeof(float) * (size_t)(M * N));
        r.xq = upload(NULL, (size_t)(N * K));
        r.xs = upload(NULL, sizeof(float) * (size_t)(L * N));
        const float one = 1e-3f;
        r.sw1 = upload(&one, 4);
        r.sx1 = upload(&one, 4);
        r.sbytes = qd_cuda_fp8_act_bytes(N, M, K);
        r.scratch = upload(NULL, r.sbytes);
        call_quant(&r); /* the per-tensor GEMM's operand */
        const float bms = time_ms(&t, call_bf16, &r), fms = time_ms(&t, call_fp8, &r),
                    qms = time_ms(&t, call_quant, &r), tms = time_ms(&t, call_tensor, &r),
                    dms = time_ms(&t, call_dequant, &r);
        const double fl = 2.0 * (double)M * (double)N * (double)K * 1e-9;
        printf("RESULT fp8_gemm shape=%s M=%lld K=%lld N=%lld bf16_us=%.1f fp8_us=%.1f fp8_quant_us=%.1f "
               "tensor_us=%.1f dequant_us=%.1f bf16_TFLOPS=%.0f fp8_TFLOPS=%.0f tensor_TFLOPS=%.0f "
               "fp8_vs_bf16=%.2f fp8_vs_tensor=%.2f fp8_vs_dequant=%.2f\n",
               r.s.name, (long long)M, (long long)K, (long long)N, bms * 1e3, fms * 1e3, qms * 1e3, tms * 1e3,
               dms * 1e3, fl / bms, fl / fms, fl / tms, bms / fms, tms / fms, dms / fms);
        void *dev[] = {(void *)r.w.data, (void *)r.w.scales.data, r.wb, r.x, r.dq, r.y, r.xq, r.xs, r.sw1, r.sx1,
                       r.scratch};
        for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++) qd_cuda_free(dev[i]);
        free(hq); free(hb); free(hx); free(hs);
    }
    qd_cuda_blas_destroy(r.blas);
    qd_cuda_timer_destroy(&t);
    return 0;
}
