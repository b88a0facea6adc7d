/* Matmuls through cuBLAS: bf16 weights and activations on the tensor cores with
 * fp32 accumulation. Weights are nn.Linear [out][in] row-major, which cuBLAS (column
 * major) sees as an [in][out] matrix: y^T = W x^T is GEMM(op(A) = T, op(B) = N). */
#include <cublas_v2.h>
#include <stdio.h>
#include <stdlib.h>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_mma.cuh"
#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/cuda_pdl.cuh"
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

/* Decode-sized products (a few rows of x) are bound by reading W once. One row of x:
 * a warp per output row streams the row in 16-byte pieces (4 in flight per lane); x is
 * small and stays close. cuBLAS picks GEMM tiles made for
 * larger n, so below this bound the GEMV kernel reads W faster. This plain kernel
 * (36 registers at n = 1, many blocks resident per SM) streams large matrices
 * faster than the fused one of gemv_fused.cu, which builds x in every block and
 * holds more registers; qd_cuda_linear's table picks between them.
 *
 * STAGED: a programmatic dependent (cuda_pdl.cuh): the first pieces of W are in flight
 * before the wait, and x, the previous kernel's, is copied through L2 into shared memory
 * once a block (a read through L1 could see lines older than that kernel's writes).
 * Otherwise a plain launch that reads x through the read-only cache (x too large for the
 * block's shared memory). The same products in the same order either way. */
#define GEMV_MAX_N 8
#define GEMV_WARPS 8
#define GEMV_STAGE_MAX (48 * 1024) /* bytes of x a block stages */

template <bool STAGED>
__global__ void __launch_bounds__(GEMV_WARPS * 32)
gemv_kernel(const uint16_t *__restrict__ W, int64_t rows, int64_t cols, const uint16_t *__restrict__ x,
            float *__restrict__ y, int accumulate) {
    extern __shared__ uint4 gemv_xs[]; /* STAGED: x [cols / 8] */
    const int lane = threadIdx.x % 32;
    const int64_t row = (int64_t)blockIdx.x * GEMV_WARPS + threadIdx.x / 32;
    const bool live = row < rows;
    const uint4 *w = (const uint4 *)(W + (live ? row : 0) * cols);
    const int64_t chunks = cols / 8;
    const uint4 *xv = STAGED ? gemv_xs : (const uint4 *)x;
    float acc = 0.f;
    int64_t c = lane;
    uint4 wv[4];
    if (live && c + 96 < chunks)
#pragma unroll
        for (int u = 0; u < 4; u++) wv[u] = __ldcs(w + c + 32 * u);
    if (STAGED) {
        qd_pdl_wait();
        qd_pdl_trigger();
        for (int64_t i = threadIdx.x; i < chunks; i += GEMV_WARPS * 32) gemv_xs[i] = __ldcg((const uint4 *)x + i);
        __syncthreads();
    }
    if (!live) return;
    for (; c + 96 < chunks; c += 128) { /* four independent 16-byte loads per lane in flight */
        if (c != lane)
#pragma unroll
            for (int u = 0; u < 4; u++) wv[u] = __ldcs(w + c + 32 * u);
#pragma unroll
        for (int u = 0; u < 4; u++) {
            float wf[8], xf[8];
            qd_bf16x8_f32(wv[u], wf);
            qd_bf16x8_f32(STAGED ? xv[c + 32 * u] : __ldg(xv + c + 32 * u), xf);
#pragma unroll
            for (int i = 0; i < 8; i++) acc = fmaf(wf[i], xf[i], acc);
        }
    }
    for (; c < chunks; c += 32) {
        float wf[8], xf[8];
        qd_bf16x8_f32(__ldcs(w + c), wf);
        qd_bf16x8_f32(STAGED ? xv[c] : __ldg(xv + c), xf);
#pragma unroll
        for (int i = 0; i < 8; i++) acc = fmaf(wf[i], xf[i], acc);
    }
    for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
    if (lane == 0) y[row] = accumulate ? __ldcg(y + row) + acc : acc;
}

/* Two to eight rows of x: the kernel above runs out of instruction issue, not of
 * bandwidth (per 16 bytes of W, n 16-byte loads of x, their conversion and 8n FMAs;
 * H200, RESULTS session 11: 1.36-1.46x the n = 1 time at n = 4 on the 27B), so here the
 * tensor cores take the products. A block owns 16 output rows; its WARPS warps split
 * the columns in units of 32. In a unit, lane (g, t) = (lane / 4, lane % 4) loads 16
 * bytes of W rows g and g + 8 and of x row g at column 8t, and two mma.m16n8k16 consume
 * them: a dot product does not care in which order its columns are summed, so the
 * fragments' column order (2t, 2t+1, 2t+8, 2t+9 for a thread) may stand for the
 * columns 8t..8t+3 and 8t+4..8t+7 of the unit, as long as A and B agree. No shuffles
 * and no shared memory on the way in; the warps' 16x8 sums meet in shared memory at
 * the end, in a fixed order. Rows of W past `rows`, columns past `cols` (a multiple
 * of 8) and rows of x past n read as zeros.
 *
 * A programmatic dependent (cuda_pdl.cuh): the first round of W is in flight before the
 * wait, and x, the previous kernel's, is read through L2.
 *
 * Bandwidth needs bytes in flight, and a grid that does not fit the GPU at once waits
 * for a tail wave: gemv_mma_warps gives a block the most warps (4 to 32) at which
 * the whole grid is resident together, so that a matrix of few rows (5120 on the 27B:
 * 320 blocks) is streamed by as many warps as one of many. */
#define GEMV_MMA_UNROLL 4

__device__ __forceinline__ uint4 gemv_ld_w(const uint16_t *__restrict__ W, int64_t row, int64_t rows, int64_t cols,
                                           int64_t col) {
    if (row >= rows || col >= cols) return make_uint4(0, 0, 0, 0);
    return __ldcs((const uint4 *)(W + row * cols + col));
}

template <int N, int WARPS>
__global__ void __launch_bounds__(WARPS * 32)
gemv_mma_kernel(const uint16_t *__restrict__ W, int64_t rows, int64_t cols, const uint16_t *__restrict__ x,
                int64_t ldx, float *__restrict__ y, int64_t ldy, int accumulate) {
    __shared__ float part[WARPS][32][4];
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, g = lane / 4, t = lane % 4;
    const int64_t r0 = (int64_t)blockIdx.x * 16 + g, r1 = r0 + 8;
    const int64_t units = (cols + 31) / 32;
    float c[4] = {0.f, 0.f, 0.f, 0.f};
    bool waited = false; /* the first round of W is in flight before the wait for the previous kernel (x) */
    for (int64_t u0 = warp; u0 < units; u0 += WARPS * GEMV_MMA_UNROLL) {
        uint4 wa[GEMV_MMA_UNROLL], wb[GEMV_MMA_UNROLL], xv[GEMV_MMA_UNROLL];
#pragma unroll
        for (int j = 0; j < GEMV_MMA_UNROLL; j++) {
            const int64_t col = (u0 + (int64_t)j * WARPS) * 32 + 8 * t;
            const int live = u0 + (int64_t)j * WARPS < units;
            wa[j] = live ? gemv_ld_w(W, r0, rows, cols, col) : make_uint4(0, 0, 0, 0);
            wb[j] = live ? gemv_ld_w(W, r1, rows, cols, col) : make_uint4(0, 0, 0, 0);
        }
        if (!waited) {
            qd_pdl_wait();
            qd_pdl_trigger();
            waited = true;
        }
#pragma unroll
        for (int j = 0; j < GEMV_MMA_UNROLL; j++) {
            const int64_t col = (u0 + (int64_t)j * WARPS) * 32 + 8 * t;
            const int live = u0 + (int64_t)j * WARPS < units;
            xv[j] = live && g < N && col < cols ? __ldcg((const uint4 *)(x + g * ldx + col)) : make_uint4(0, 0, 0, 0);
        }
#pragma unroll
        for (int j = 0; j < GEMV_MMA_UNROLL; j++) {
            const uint32_t a0[4] = {wa[j].x, wb[j].x, wa[j].y, wb[j].y};
            const uint32_t a1[4] = {wa[j].z, wb[j].z, wa[j].w, wb[j].w};
            qd_mma16816(c, a0, xv[j].x, xv[j].y);
            qd_mma16816(c, a1, xv[j].z, xv[j].w);
        }
    }
    if (!waited) { /* a warp without units still writes its part: the wait comes first */
        qd_pdl_wait();
        qd_pdl_trigger();
    }
#pragma unroll
    for (int i = 0; i < 4; i++) part[warp][lane][i] = c[i];
    __syncthreads();
    if (threadIdx.x >= 128) return;
    /* output i: the accumulator i % 4 of lane i / 4 (C fragment: rows g, g + 8; tokens 2t, 2t+1) */
    const int ol = (int)threadIdx.x / 4, oi = (int)threadIdx.x % 4;
    float v = 0.f;
#pragma unroll
    for (int w = 0; w < WARPS; w++) v += part[w][ol][oi];
    const int64_t row = (int64_t)blockIdx.x * 16 + ol / 4 + (oi >= 2 ? 8 : 0);
    const int tok = 2 * (ol % 4) + (oi & 1);
    if (tok >= N || row >= rows) return;
    float *o = y + tok * ldy + row;
    *o = accumulate ? __ldcg(o) + v : v; /* activations through L2 (cuda_pdl.cuh) */
}

/* Blocks of gemv_mma_kernel<N, WARPS> resident at once on the GPU (the occupancy
 * calculator's answer, asked once per instance). */
template <int N, int WARPS>
static int64_t gemv_mma_wave(void) {
    static int per_sm = 0;
    if (!per_sm && (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, gemv_mma_kernel<N, WARPS>, WARPS * 32, 0) !=
                        cudaSuccess ||
                    per_sm < 1))
        per_sm = 1;
    return (int64_t)per_sm * qd_cuda_sm_count();
}

/* Warps a block: the most of 32, 16, 8, 4 at which the grid of `blocks` is one wave,
 * and 8 for larger grids. H200, bench/linear_cuda_bench.c (RESULTS session 18): 32 warps
 * on a 5120-row matrix (320 blocks, 1 resident a multiprocessor) took 1.1x the time of
 * 8; 4 warps on the 27B gate_up (2176 blocks, just past one wave of them) 1.07x. */
template <int N>
static int gemv_mma_warps(int64_t blocks) {
    if (blocks <= gemv_mma_wave<N, 32>()) return 32;
    if (blocks <= gemv_mma_wave<N, 16>()) return 16;
    if (blocks <= gemv_mma_wave<N, 8>()) return 8;
    if (blocks <= gemv_mma_wave<N, 4>()) return 4;
    return 8;
}

template <int N>
static qd_status gemv_mma(const uint16_t *W, int64_t rows, int64_t cols, const uint16_t *x, int64_t ldx, float *y,
                     int64_t ldy, int accumulate, cudaStream_t st) {
    const dim3 grid((unsigned)((rows + 15) / 16));
    const int warps = gemv_mma_warps<N>((int64_t)grid.x);
    void (*k)(const uint16_t *, int64_t, int64_t, const uint16_t *, int64_t, float *, int64_t, int) =
        warps == 4 ? gemv_mma_kernel<N, 4> : warps == 8 ? gemv_mma_kernel<N, 8>
                                         : warps == 16 ? gemv_mma_kernel<N, 16> : gemv_mma_kernel<N, 32>;
    return qd_launch_pdl(1, k, grid, dim3(warps * 32), 0, st, W, rows, cols, x, ldx, y, ldy, accumulate);
}

static qd_status gemv(const uint16_t *W, int64_t rows, int64_t cols, const uint16_t *x, int64_t ldx, int n, float *y,
                      int64_t ldy, int accumulate, cudaStream_t st) {
    const dim3 grid((unsigned)((rows + GEMV_WARPS - 1) / GEMV_WARPS));
    switch (n) {
    case 1:
        if (cols * 2 <= GEMV_STAGE_MAX)
            return qd_launch_pdl(1, gemv_kernel<true>, grid, dim3(GEMV_WARPS * 32), (size_t)cols * 2, st, W, rows, cols,
                                 x, y, accumulate);
        return qd_launch_pdl(0, gemv_kernel<false>, grid, dim3(GEMV_WARPS * 32), 0, st, W, rows, cols, x, y,
                             accumulate);
#define QD_GEMV_MMA_CASE(N) \
    case N: return gemv_mma<N>(W, rows, cols, x, ldx, y, ldy, accumulate, st);
        QD_GEMV_MMA_CASE(2) QD_GEMV_MMA_CASE(3) QD_GEMV_MMA_CASE(4)
        QD_GEMV_MMA_CASE(5) QD_GEMV_MMA_CASE(6) QD_GEMV_MMA_CASE(7) QD_GEMV_MMA_CASE(8)
#undef QD_GEMV_MMA_CASE
    default: return qd_cuda_fail(QD_ERR_INTERNAL, "gemv: n out of range");
    }
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

extern "C" qd_status qd_cuda_matmul_split3(qd_cuda_blas *b, const uint16_t *d_W, int64_t rows, int64_t cols,
                                           const uint16_t *d_x, int64_t ldx, const uint16_t *d_xr, int64_t ldxr, int n,
                                           float *d_y, int64_t ldy) {
    if (ldxr < 2 * cols)
        return qd_cuda_fail(QD_ERR_INVALID_ARG, "matmul_split3: the mid and low parts need ldxr >= 2 cols");
    qd_status st = qd_cuda_matmul(b, d_W, rows, cols, d_x, ldx, n, d_y, ldy, 0);
    if (st == QD_OK) st = qd_cuda_matmul_acc(b, d_W, rows, cols, d_xr, ldxr, n, d_y, ldy);
    if (st == QD_OK) st = qd_cuda_matmul_acc(b, d_W, rows, cols, d_xr + cols, ldxr, n, d_y, ldy);
    return st;
}
