/* MoE router (spec 6.2) over precomputed logits: one warp per token runs the
 * routing of moe_route.cuh (softmax in fp32, top-k with ties to the lower
 * expert index, optional renormalisation). */
#include "backend/cuda/cuda_util.h"
#include "backend/cuda/moe_internal.cuh"
#include "backend/cuda/moe_route.cuh"

#define RT_WARPS 4 /* tokens per block */

template <int V>
__global__ void __launch_bounds__(RT_WARPS * 32)
moe_route_kernel(const float *__restrict__ logits, int64_t ld, int n, int E, int k, int renorm, int32_t *__restrict__ sel,
                 float *__restrict__ w) {
    const int t = blockIdx.x * RT_WARPS + (threadIdx.x >> 5);
    if (t >= n) return;
    qd_moe_route_warp<V>(logits + (size_t)t * ld, E, k, renorm, sel + (size_t)t * k, w + (size_t)t * k);
}

extern "C" qd_status qd_cuda_moe_route(const float *d_logits, int64_t ld, int n, int E, int k, int renorm, int32_t *d_sel,
                                       float *d_w, void *stream) {
    if (n < 0 || E < 1 || E > QD_MOE_MAX_EXPERTS || k < 1 || k > 32 || k > E)
        return qd_cuda_fail(QD_ERR_INVALID_ARG, "qd_cuda_moe_route: need 1 <= k <= min(E, 32), E <= 1024");
    if (ld < E) return qd_cuda_fail(QD_ERR_INVALID_ARG, "qd_cuda_moe_route: row stride below E");
    if (n == 0) return QD_OK;
    if (!d_logits || !d_sel || !d_w) return qd_cuda_fail(QD_ERR_INVALID_ARG, "qd_cuda_moe_route: NULL pointer");
    const dim3 grid((unsigned)((n + RT_WARPS - 1) / RT_WARPS)), block(RT_WARPS * 32);
    cudaStream_t s = (cudaStream_t)stream;
    if (E <= 32) moe_route_kernel<1><<<grid, block, 0, s>>>(d_logits, ld, n, E, k, renorm, d_sel, d_w);
    else if (E <= 64) moe_route_kernel<2><<<grid, block, 0, s>>>(d_logits, ld, n, E, k, renorm, d_sel, d_w);
    else if (E <= 128) moe_route_kernel<4><<<grid, block, 0, s>>>(d_logits, ld, n, E, k, renorm, d_sel, d_w);
    else if (E <= 256) moe_route_kernel<8><<<grid, block, 0, s>>>(d_logits, ld, n, E, k, renorm, d_sel, d_w);
    else if (E <= 512) moe_route_kernel<16><<<grid, block, 0, s>>>(d_logits, ld, n, E, k, renorm, d_sel, d_w);
    else moe_route_kernel<32><<<grid, block, 0, s>>>(d_logits, ld, n, E, k, renorm, d_sel, d_w);
    QD_CUDA_CHECK_LAUNCH("moe_route");
    return QD_OK;
}

/* Expert parallel: a rank holds experts [e0, e0 + E_local). Routing chose global ids; the
 * rank's own become local ids and the others -1, which both expert paths turn into zeros
 * (the pair contributes nothing here; its expert's rank adds it in the all-reduce). */
__global__ void moe_localize_kernel(int32_t *__restrict__ sel, int P, int e0, int E_local) {
    const int p = blockIdx.x * blockDim.x + threadIdx.x;
    if (p >= P) return;
    const int e = sel[p] - e0;
    sel[p] = e >= 0 && e < E_local ? e : -1;
}

/* Routing statistics: touched[e] = 1 for each expert e chosen by one of the P pairs. */
__global__ void moe_mark_kernel(const int32_t *__restrict__ sel, int P, int E, uint8_t *__restrict__ touched) {
    const int p = blockIdx.x * blockDim.x + threadIdx.x;
    if (p >= P) return;
    const int e = sel[p];
    if (e >= 0 && e < E) touched[e] = 1;
}

extern "C" qd_status qd_cuda_moe_mark(const int32_t *d_sel, int P, int E, uint8_t *d_touched, void *stream) {
    if (P < 0 || E < 1) return qd_cuda_fail(QD_ERR_INVALID_ARG, "qd_cuda_moe_mark: bad range");
    if (P == 0) return QD_OK;
    moe_mark_kernel<<<(unsigned)((P + 255) / 256), 256, 0, (cudaStream_t)stream>>>(d_sel, P, E, d_touched);
    QD_CUDA_CHECK_LAUNCH("moe_mark");
    return QD_OK;
}

extern "C" qd_status qd_cuda_moe_localize(int32_t *d_sel, int P, int e0, int E_local, void *stream) {
    if (P < 0 || e0 < 0 || E_local < 1) return qd_cuda_fail(QD_ERR_INVALID_ARG, "qd_cuda_moe_localize: bad range");
    if (P == 0) return QD_OK;
    moe_localize_kernel<<<(unsigned)((P + 255) / 256), 256, 0, (cudaStream_t)stream>>>(d_sel, P, e0, E_local);
    QD_CUDA_CHECK_LAUNCH("moe_localize");
    return QD_OK;
}
