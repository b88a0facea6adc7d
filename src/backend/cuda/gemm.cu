/* Matmuls through cuBLAS: bf16 weights and activations on the tensor cores with
 * fp32 accumulation. Weights are nn.Linear [out][in] row-major, which cuBLAS (column
 * major) sees as an [in][out] matrix: y^T = W x^T is GEMM(op(A) = T, op(B) = N). */
#include <cublas_v2.h>
#include <stdio.h>
#include <stdlib.h>

#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/cuda_util.h"

struct qd_cuda_blas {
    cublasHandle_t h;
    void *workspace;
    struct qd_cuda_fp8_plans *fp8; /* created by the first FP8 GEMM */
};

/* cuBLAS advises a user workspace for graph capture; 32 MiB covers Hopper's kernels. */
#define QD_BLAS_WORKSPACE (32u << 20)

static qd_status blas_status(cublasStatus_t s, const char *what) {
    if (s == CUBLAS_STATUS_SUCCESS) return QD_OK;
    char msg[160];
    snprintf(msg, sizeof msg, "%s: %s", what, cublasGetStatusString(s));
    return qd_cuda_fail(QD_ERR_BACKEND, msg);
}

extern "C" qd_status qd_cuda_blas_create(qd_cuda_blas **out, void *stream) {
    *out = NULL;
    qd_cuda_blas *b = (qd_cuda_blas *)calloc(1, sizeof *b);
    if (!b) return qd_cuda_fail(QD_ERR_OOM, "cublas: host allocation");
    qd_status s = blas_status(cublasCreate(&b->h), "cublasCreate");
    if (!s) s = blas_status(cublasSetStream(b->h, (cudaStream_t)stream), "cublasSetStream");
    if (!s) s = qd_cuda_malloc(&b->workspace, QD_BLAS_WORKSPACE);
    if (!s) s = blas_status(cublasSetWorkspace(b->h, b->workspace, QD_BLAS_WORKSPACE), "cublasSetWorkspace");
    if (s) {
        qd_cuda_blas_destroy(b);
        return s;
    }
    *out = b;
    return QD_OK;
}

extern "C" void qd_cuda_blas_destroy(qd_cuda_blas *b) {
    if (!b) return;
    if (b->h) cublasDestroy(b->h);
    qd_cuda_free(b->workspace);
    qd_cuda_fp8_plans_free(b->fp8);
    free(b);
}

extern "C" void *qd_cuda_blas_handle(qd_cuda_blas *b) { return b ? (void *)b->h : NULL; }

extern "C" void *qd_cuda_blas_workspace(qd_cuda_blas *b, size_t *bytes) {
    *bytes = QD_BLAS_WORKSPACE;
    return b->workspace;
}

extern "C" struct qd_cuda_fp8_plans **qd_cuda_blas_fp8_plans(qd_cuda_blas *b) { return &b->fp8; }

/* Decode-sized products (a few rows of x) are bound by reading W once: a warp per
 * output row streams the row in 16-byte pieces (4 in flight per lane) and keeps one
 * sum per row of x; x is small and stays in L1/L2. cuBLAS picks GEMM tiles made for
 * larger n, so below this bound the GEMV kernel reads W faster. This plain kernel
 * (36 registers at n = 1, many blocks resident per SM) streams large matrices
 * faster than the fused one of gemv_fused.cu, which builds x in every block and
 * holds more registers; qd_cuda_linear's table picks between them. */
#define GEMV_MAX_N 8
#define GEMV_WARPS 8

__device__ __forceinline__ void bf16x8_to_f32(uint4 v, float *f) {
    const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; i++) {
        f[2 * i] = __uint_as_float(w[i] << 16);
        f[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
    }
}

template <int N>
__global__ void __launch_bounds__(GEMV_WARPS * 32)
gemv_kernel(const uint16_t *__restrict__ W, int64_t rows, int64_t cols, const uint16_t *__restrict__ x, int64_t ldx,
            float *__restrict__ y, int64_t ldy, int accumulate) {
    const int lane = threadIdx.x % 32;
    const int64_t row = (int64_t)blockIdx.x * GEMV_WARPS + threadIdx.x / 32;
    if (row >= rows) return;
    const uint4 *w = (const uint4 *)(W + row * cols);
    const int64_t chunks = cols / 8;
    float acc[N];
#pragma unroll
    for (int t = 0; t < N; t++) acc[t] = 0.f;
    int64_t c = lane;
    for (; c + 96 < chunks; c += 128) { /* four independent 16-byte loads per lane in flight */
        uint4 wv[4];
#pragma unroll
        for (int u = 0; u < 4; u++) wv[u] = __ldcs(w + c + 32 * u);
#pragma unroll
        for (int u = 0; u < 4; u++) {
            float wf[8];
            bf16x8_to_f32(wv[u], wf);
#pragma unroll
            for (int t = 0; t < N; t++) {
                float xf[8];
                bf16x8_to_f32(__ldg((const uint4 *)(x + t * ldx) + c + 32 * u), xf);
#pragma unroll
                for (int i = 0; i < 8; i++) acc[t] = fmaf(wf[i], xf[i], acc[t]);
            }
        }
    }
    for (; c < chunks; c += 32) {
        float wf[8];
        bf16x8_to_f32(__ldcs(w + c), wf);
#pragma unroll
        for (int t = 0; t < N; t++) {
            float xf[8];
            bf16x8_to_f32(__ldg((const uint4 *)(x + t * ldx) + c), xf);
#pragma unroll
            for (int i = 0; i < 8; i++) acc[t] = fmaf(wf[i], xf[i], acc[t]);
        }
    }
#pragma unroll
    for (int t = 0; t < N; t++) {
        float v = acc[t];
        for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
        if (lane == 0) y[t * ldy + row] = accumulate ? y[t * ldy + row] + v : v;
    }
}

static qd_status gemv(const uint16_t *W, int64_t rows, int64_t cols, const uint16_t *x, int64_t ldx, int n, float *y,
                      int64_t ldy, int accumulate, cudaStream_t st) {
    const dim3 grid((unsigned)((rows + GEMV_WARPS - 1) / GEMV_WARPS));
    switch (n) {
#define QD_GEMV_CASE(N) \
    case N: gemv_kernel<N><<<grid, GEMV_WARPS * 32, 0, st>>>(W, rows, cols, x, ldx, y, ldy, accumulate); break;
        QD_GEMV_CASE(1) QD_GEMV_CASE(2) QD_GEMV_CASE(3) QD_GEMV_CASE(4)
        QD_GEMV_CASE(5) QD_GEMV_CASE(6) QD_GEMV_CASE(7) QD_GEMV_CASE(8)
#undef QD_GEMV_CASE
    default: return qd_cuda_fail(QD_ERR_INTERNAL, "gemv: n out of range");
    }
    QD_CUDA_CHECK_LAUNCH("gemv");
    return QD_OK;
}

/* fp32 activations: a warp per (output row, token); W rows are re-read from L2 for
 * each token, which is cheap at the router's size (E x H). Rows of a multiple of 8
 * are read in 16-byte pieces of W (and 32 of x), others element by element. */
__global__ void __launch_bounds__(GEMV_WARPS * 32)
matmul_xf32_kernel(const uint16_t *__restrict__ W, int64_t rows, int64_t cols, const float *__restrict__ x,
                   int64_t ldx, float *__restrict__ y, int64_t ldy, int vec) {
    const int lane = threadIdx.x % 32;
    const int64_t row = (int64_t)blockIdx.x * GEMV_WARPS + threadIdx.x / 32;
    const int64_t t = blockIdx.y;
    if (row >= rows) return;
    const uint16_t *w = W + row * cols;
    const float *xr = x + t * ldx;
    float acc = 0.f;
    if (vec) {
        for (int64_t c = (int64_t)lane * 8; c < cols; c += 256) {
            float wf[8];
            bf16x8_to_f32(__ldg((const uint4 *)(w + c)), wf);
            const float4 a = __ldg((const float4 *)(xr + c)), b = __ldg((const float4 *)(xr + c + 4));
            acc = fmaf(wf[0], a.x, acc); acc = fmaf(wf[1], a.y, acc); acc = fmaf(wf[2], a.z, acc); acc = fmaf(wf[3], a.w, acc);
            acc = fmaf(wf[4], b.x, acc); acc = fmaf(wf[5], b.y, acc); acc = fmaf(wf[6], b.z, acc); acc = fmaf(wf[7], b.w, acc);
        }
    } else {
        for (int64_t c = lane; c < cols; c += 32) acc = fmaf(__uint_as_float((uint32_t)w[c] << 16), xr[c], acc);
    }
    for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
    if (lane == 0) y[t * ldy + row] = acc;
}

extern "C" qd_status qd_cuda_matmul_xf32(const uint16_t *d_W, int64_t rows, int64_t cols, const float *d_x,
                                         int64_t ldx, int n, float *d_y, int64_t ldy, void *stream) {
    if (n <= 0 || rows <= 0) return QD_OK;
    if (n > 65535) return qd_cuda_fail(QD_ERR_UNSUPPORTED, "matmul_xf32: more than 65535 rows of x");
    const dim3 grid((unsigned)((rows + GEMV_WARPS - 1) / GEMV_WARPS), (unsigned)n);
    const int vec = cols % 8 == 0 && ldx % 4 == 0 && ((uintptr_t)d_W & 15) == 0 && ((uintptr_t)d_x & 15) == 0;
    matmul_xf32_kernel<<<grid, GEMV_WARPS * 32, 0, (cudaStream_t)stream>>>(d_W, rows, cols, d_x, ldx, d_y, ldy, vec);
    QD_CUDA_CHECK_LAUNCH("matmul_xf32");
    return QD_OK;
}

static int aligned16(const void *p) { return ((uintptr_t)p & 15) == 0; }

extern "C" qd_status qd_cuda_matmul(qd_cuda_blas *b, const uint16_t *d_W, int64_t rows, int64_t cols,
                                    const uint16_t *d_x, int64_t ldx, int n, void *d_y, int64_t ldy, int y_bf16) {
    if (n <= 0 || rows <= 0) return QD_OK;
    if (rows > INT32_MAX || cols > INT32_MAX || ldx > INT32_MAX || ldy > INT32_MAX)
        return qd_cuda_fail(QD_ERR_UNSUPPORTED, "matmul: dimension beyond 2^31");
    /* kernel table: small n with fp32 output and 16-byte rows -> GEMV, else cuBLAS */
    if (n <= GEMV_MAX_N && !y_bf16 && cols % 8 == 0 && ldx % 8 == 0 && aligned16(d_W) && aligned16(d_x)) {
        cudaStream_t st = NULL;
        cublasGetStream(b->h, &st);
        return gemv(d_W, rows, cols, d_x, ldx, n, (float *)d_y, ldy, 0, st);
    }
    const float one = 1.f, zero = 0.f;
    return blas_status(cublasGemmEx(b->h, CUBLAS_OP_T, CUBLAS_OP_N, (int)rows, n, (int)cols, &one, d_W, CUDA_R_16BF,
                                    (int)cols, d_x, CUDA_R_16BF, (int)ldx, &zero, d_y,
                                    y_bf16 ? CUDA_R_16BF : CUDA_R_32F, (int)ldy, CUBLAS_COMPUTE_32F,
                                    CUBLAS_GEMM_DEFAULT),
                       "cublasGemmEx");
}

extern "C" qd_status qd_cuda_matmul_acc(qd_cuda_blas *b, const uint16_t *d_W, int64_t rows, int64_t cols,
                                        const uint16_t *d_x, int64_t ldx, int n, float *d_y, int64_t ldy) {
    if (n <= 0 || rows <= 0) return QD_OK;
    if (rows > INT32_MAX || cols > INT32_MAX || ldx > INT32_MAX || ldy > INT32_MAX)
        return qd_cuda_fail(QD_ERR_UNSUPPORTED, "matmul: dimension beyond 2^31");
    cudaStream_t st = NULL;
    cublasGetStream(b->h, &st);
    if (n <= GEMV_MAX_N && cols % 8 == 0 && ldx % 8 == 0 && aligned16(d_W) && aligned16(d_x))
        return gemv(d_W, rows, cols, d_x, ldx, n, d_y, ldy, 1, st);
    /* cuBLAS with beta = 1 adds into y itself. H200, bench/linear_cuda_bench.c (RESULTS
     * session 11): at n = 16 and 32 it took 86-97% of the time of a product into a
     * scratch followed by an add kernel, on every accumulating projection of the
     * 35B-A3B, 27B and 9B (1.3-3 us less each) */
    const float one = 1.f;
    return blas_status(cublasGemmEx(b->h, CUBLAS_OP_T, CUBLAS_OP_N, (int)rows, n, (int)cols, &one, d_W, CUDA_R_16BF,
                                    (int)cols, d_x, CUDA_R_16BF, (int)ldx, &one, d_y, CUDA_R_32F, (int)ldy,
                                    CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                       "cublasGemmEx");
}
