/* y = W x with bf16 W [rows][cols] and fp32 x: the MoE router and shared-expert
 * gate logits (spec 6.2), computed from the fp32 normed residual so that routing
 * does not hinge on a bf16 rounding of x. Both kernels add in router_dot.cuh's
 * order, so their logits are the decode router's bit for bit at any n and the
 * table below can pick either without changing a routing decision.
 *
 * - per pair: a warp per (output row, token), W's row re-read from L2 for every
 *   token. Fine at a few tokens; at a prefill of 8,192 tokens it reads 12 bytes
 *   per multiply-add from L2 (1.39 ms a layer on the 35B-A3B's 257 x 2048 router,
 *   more than that layer's expert GEMMs).
 * - tiled: a block takes 32 rows x 8 tokens, the tokens' x in shared memory; each
 *   lane keeps the partial sums of its 4 rows x 8 tokens in registers, so a 16-byte
 *   piece of W feeds 64 multiply-adds and an x piece 32.
 *
 * From QD_CUDA_ROUTER_SPLIT_MIN_N rows outside batch-invariant mode the forward routes
 * through qd_cuda_matmul_split3 instead (the same fp32 row as three bf16 parts on the
 * tensor cores, 4x faster at 8,192 rows); batch-invariant mode keeps these kernels at
 * every n, since their bits do not depend on it. */
#include <stdint.h>

#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/cuda_util.h"
#include "backend/cuda/router_dot.cuh"

#define XF_WARPS 8 /* per-pair kernel: (row, token) pairs per block */

/* Rows of a multiple of 8 (vec) in 16-byte pieces of W (32 bytes of x); others element
 * by element, in column order (no other kernel computes those: the decode router and the
 * tiled kernel take vec rows only). */
__global__ void __launch_bounds__(XF_WARPS * 32)
matmul_xf32_pair_kernel(const uint16_t *__restrict__ W, int64_t rows, int64_t cols, const float *__restrict__ x,
                        int64_t ldx, float *__restrict__ y, int64_t ldy, int vec) {
    const int lane = threadIdx.x % 32;
    const int64_t row = (int64_t)blockIdx.x * XF_WARPS + threadIdx.x / 32;
    const int64_t t = blockIdx.y;
    if (row >= rows) return;
    const uint16_t *w = W + row * cols;
    const float *xr = x + t * ldx;
    float acc = 0.f;
    if (vec) {
        for (int64_t c = (int64_t)lane * 8; c < cols; c += 256)
            acc = qd_router_dot8(__ldg((const uint4 *)(w + c)), __ldg((const float4 *)(xr + c)),
                                 __ldg((const float4 *)(xr + c + 4)), acc);
    } else {
        for (int64_t c = lane; c < cols; c += 32) acc = fmaf(__uint_as_float((uint32_t)w[c] << 16), xr[c], acc);
    }
    acc = qd_router_warp_sum(acc);
    if (lane == 0) y[t * ldy + row] = acc;
}

#define XT_WARPS 8                   /* tiled kernel: warps a block */
#define XT_ROWS 4                    /* rows a warp */
#define XT_TOK 8                     /* tokens a block */
#define XT_BROWS (XT_WARPS * XT_ROWS) /* rows a block */
#define XT_SMEM_MAX (160 << 10)      /* x of a block's tokens in shared memory: cols <= 5,120 */
/* From this many tokens the tiled kernel: below, its 8-token tiles are mostly empty and
 * the per-pair kernel's grid is small anyway. */
#define XT_MIN_N 16

/* Shared memory holds x of the block's XT_TOK tokens as float4 pieces, ordered so that
 * the 32 lanes of a warp read 32 consecutive ones: token t's column c = 8 (32 j + l) + 4 h + q
 * sits at float4 [t][2 j + h][l], q. */
__device__ __forceinline__ int xt_piece(int t, int J, int j, int h, int lane) {
    return (t * 2 * J + 2 * j + h) * 32 + lane;
}

__global__ void __launch_bounds__(XT_WARPS * 32)
matmul_xf32_tiled_kernel(const uint16_t *__restrict__ W, int rows, int cols, const float *__restrict__ x, int64_t ldx,
                         int n, float *__restrict__ y, int64_t ldy) {
    extern __shared__ float4 xs[]; /* [XT_TOK][2 J][32] */
    const int J = (cols + 255) / 256, lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const int t0 = blockIdx.y * XT_TOK;
    /* x: consecutive threads take consecutive 16-byte pieces of a token's row */
    for (int i = threadIdx.x; i < XT_TOK * 64 * J; i += XT_WARPS * 32) {
        const int t = i / (64 * J), r = i % (64 * J), p = r / 2, h = r % 2, c = 8 * p + 4 * h;
        float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
        if (t0 + t < n && c < cols) v = __ldg((const float4 *)(x + (int64_t)(t0 + t) * ldx + c));
        xs[xt_piece(t, J, p / 32, h, p % 32)] = v;
    }
    __syncthreads();
    const int r0 = blockIdx.x * XT_BROWS + warp * XT_ROWS;
    const uint16_t *w[XT_ROWS];
#pragma unroll
    for (int i = 0; i < XT_ROWS; i++) w[i] = W + (int64_t)(r0 + i < rows ? r0 + i : 0) * cols;
    float acc[XT_ROWS][XT_TOK];
#pragma unroll
    for (int i = 0; i < XT_ROWS; i++)
#pragma unroll
        for (int t = 0; t < XT_TOK; t++) acc[i][t] = 0.f;
    for (int j = 0; j < J; j++) {
        const int c = lane * 8 + 256 * j;
        if (c >= cols) break; /* this lane's columns end here, as in the per-pair kernel */
        uint4 wv[XT_ROWS];
#pragma unroll
        for (int i = 0; i < XT_ROWS; i++) wv[i] = __ldg((const uint4 *)(w[i] + c));
#pragma unroll
        for (int t = 0; t < XT_TOK; t++) {
            const float4 a = xs[xt_piece(t, J, j, 0, lane)], b = xs[xt_piece(t, J, j, 1, lane)];
#pragma unroll
            for (int i = 0; i < XT_ROWS; i++) acc[i][t] = qd_router_dot8(wv[i], a, b, acc[i][t]);
        }
    }
    /* every lane ends with every sum; lane XT_TOK i + t stores (row i, token t) */
    float mine = 0.f;
#pragma unroll
    for (int i = 0; i < XT_ROWS; i++)
#pragma unroll
        for (int t = 0; t < XT_TOK; t++) {
            const float s = qd_router_warp_sum(acc[i][t]);
            if (lane == i * XT_TOK + t) mine = s;
        }
    const int i = lane / XT_TOK, t = lane % XT_TOK;
    if (r0 + i < rows && t0 + t < n) y[(int64_t)(t0 + t) * ldy + r0 + i] = mine;
}

static size_t xt_smem(int64_t cols) { return (size_t)XT_TOK * 64 * ((cols + 255) / 256) * 16; }

extern "C" qd_status qd_cuda_matmul_xf32(const uint16_t *d_W, int64_t rows, int64_t cols, const float *d_x,
                                         int64_t ldx, int n, float *d_y, int64_t ldy, void *stream) {
    if (n <= 0 || rows <= 0) return QD_OK;
    if (cols <= 0 || ldx < cols || ldy < rows)
        return qd_cuda_fail(QD_ERR_INVALID_ARG, "matmul_xf32: cols must be positive, ldx >= cols, ldy >= rows");
    const int vec = cols % 8 == 0 && ldx % 4 == 0 && ((uintptr_t)d_W & 15) == 0 && ((uintptr_t)d_x & 15) == 0;
    cudaStream_t s = (cudaStream_t)stream;
    /* kernel table: vec rows of a prefill-sized batch whose x tile fits -> tiled, else per pair */
    if (vec && n >= XT_MIN_N && rows <= INT32_MAX && (n + XT_TOK - 1) / XT_TOK <= 65535 && xt_smem(cols) <= XT_SMEM_MAX) {
        const size_t smem = xt_smem(cols);
        QD_CUDA_TRY(cudaFuncSetAttribute(matmul_xf32_tiled_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         (int)smem));
        /* rows fastest: the row blocks of one token tile run together and share its x in L2 */
        const dim3 grid((unsigned)((rows + XT_BROWS - 1) / XT_BROWS), (unsigned)((n + XT_TOK - 1) / XT_TOK));
        matmul_xf32_tiled_kernel<<<grid, XT_WARPS * 32, smem, s>>>(d_W, (int)rows, (int)cols, d_x, ldx, n, d_y, ldy);
        QD_CUDA_CHECK_LAUNCH("matmul_xf32 (tiled)");
        return QD_OK;
    }
    if (n > 65535) return qd_cuda_fail(QD_ERR_UNSUPPORTED, "matmul_xf32: more than 65535 rows of x");
    const dim3 grid((unsigned)((rows + XF_WARPS - 1) / XF_WARPS), (unsigned)n);
    matmul_xf32_pair_kernel<<<grid, XF_WARPS * 32, 0, s>>>(d_W, rows, cols, d_x, ldx, d_y, ldy, vec);
    QD_CUDA_CHECK_LAUNCH("matmul_xf32");
    return QD_OK;
}
