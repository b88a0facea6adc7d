/* Routing of one token by one warp (spec 6.2), shared by the router kernel
 * (moe_route.cu) and the fused decode MoE block (moe_block.cu): softmax over E
 * logits in fp32, top-k highest first with ties to the lower expert index,
 * optional renormalisation. Lane l holds the probabilities of experts l, l+32,
 * ... in registers (V of them, E <= 32 V). The top-k is k rounds of a warp
 * argmax whose comparison (higher value, then lower index) is a total order, so
 * the winner does not depend on the shuffle pattern. The selection compares the
 * normalised probabilities, as the CPU reference does, and the renormalising
 * sum adds them in slot order, as it does. Logits are read through L2 (ld.cg):
 * other blocks of the same grid may have just written them. */
#ifndef QD_CUDA_MOE_ROUTE_CUH
#define QD_CUDA_MOE_ROUTE_CUH

#include <math.h>
#include <stdint.h>

/* l: the token's E logits; sel, w: its k outputs. Every lane of the warp calls it. */
template <int V>
__device__ __forceinline__ void qd_moe_route_warp(const float *l, int E, int k, int renorm, int32_t *sel, float *w) {
    const int lane = threadIdx.x & 31;
    float v[V];
    float mx = -INFINITY;
#pragma unroll
    for (int i = 0; i < V; i++) {
        const int e = lane + 32 * i;
        v[i] = e < E ? __ldcg(l + e) : -INFINITY;
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
        sel[lane] = my_sel;
        w[lane] = my_w;
    }
}

#endif
