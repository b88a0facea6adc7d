/* MoE router (spec 6.2): per token, softmax over the E logits in fp32, top-k
 * highest first with ties to the lower expert index, optional renormalisation.
 *
 * One warp per token: lane l holds the probabilities of experts l, l+32, ...
 * in registers (V of them, E <= 32 V). The top-k is k rounds of a warp argmax
 * whose comparison (higher value, then lower index) is a total order, so the
 * winner does not depend on the shuffle pattern. The selection compares the
 * normalised probabilities, as the CPU reference does, and the renormalising
 * sum adds them in slot order, as it does. */
#include <math.h>

#include "backend/cuda/cuda_util.h"
#include "backend/cuda/moe_internal.cuh"

#define RT_WARPS 4 /* tokens per block */

template <int V>
__global__ void __launch_bounds__(RT_WARPS * 32)
moe_route_kernel(const float *__restrict__ logits, int64_t ld, int n, int E, int k, int renorm, int32_t *__restrict__ sel,
                 float *__restrict__ w) {
    const int lane = threadIdx.x & 31;
    const int t = blockIdx.x * RT_WARPS + (threadIdx.x >> 5);
    if (t >= n) return;
    const float *l = logits + (size_t)t * ld;
    float v[V];
    float mx = -INFINITY;
#pragma unroll
    for (int i = 0; i < V; i++) {
        const int e = lane + 32 * i;
        v[i] = e < E ? l[e] : -INFINITY;
        mx = fmaxf(mx, v[i]);
    }
#pragma unroll
    for (int off = 16; off; off >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
    float sum = 0.0f;
#pragma unroll
    for (int i = 0; i < V; i++) {
        v[i] = lane + 32 * i < E ? expf(v[i] - mx) : 0.0f;
        sum += v[i];
    }
#pragma unroll
    for (int off = 16; off; off >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, off);
    /* Probabilities are >= 0, so -1 marks "not selectable" (padding, taken). */
#pragma unroll
    for (int i = 0; i < V; i++) v[i] = lane + 32 * i < E ? v[i] / sum : -1.0f;

    int my_sel = 0;
    float my_w = 0.0f, wsum = 0.0f;
    for (int j = 0; j < k; j++) {
        float bv = -2.0f;
        int bi = 0x7fffffff;
#pragma unroll
        for (int i = 0; i < V; i++) /* increasing index: strict > keeps the lower one on ties */
            if (v[i] > bv) {
                bv = v[i];
                bi = lane + 32 * i;
            }
#pragma unroll
        for (int off = 16; off; off >>= 1) {
            const float ov = __shfl_xor_sync(0xffffffffu, bv, off);
            const int oi = __shfl_xor_sync(0xffffffffu, bi, off);
            if (ov > bv || (ov == bv && oi < bi)) {
                bv = ov;
                bi = oi;
            }
        }
        /* Non-finite logits can leave nothing comparable: keep the id in range. */
        if (bi >= E) bi = 0;
#pragma unroll
        for (int i = 0; i < V; i++)
            if (lane + 32 * i == bi) v[i] = -1.0f;
        if (lane == j) {
            my_sel = bi;
            my_w = bv;
        }
        wsum += bv;
    }
    if (renorm) my_w /= wsum;
    if (lane < k) {
        sel[(size_t)t * k + lane] = my_sel;
        w[(size_t)t * k + lane] = my_w;
    }
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

extern "C" qd_status qd_cuda_moe_localize(int32_t *d_sel, int P, int e0, int E_local, void *stream) {
    if (P < 0 || e0 < 0 || E_local < 1) return qd_cuda_fail(QD_ERR_INVALID_ARG, "qd_cuda_moe_localize: bad range");
    if (P == 0) return QD_OK;
    moe_localize_kernel<<<(unsigned)((P + 255) / 256), 256, 0, (cudaStream_t)stream>>>(d_sel, P, e0, E_local);
    QD_CUDA_CHECK_LAUNCH("moe_localize");
    return QD_OK;
}
