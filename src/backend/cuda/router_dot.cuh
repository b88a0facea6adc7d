/* The summation order of every fp32-activation product of the MoE router (the
 * router and shared-expert gate logits): every kernel that computes a logit
 * follows it, so a token routes to the same experts whether its logits came from
 * the decode router (moe_block.cu) or a prefill-sized product (matmul_xf32.cu),
 * in a batch of any size. For one (row, token), lane l of a warp takes the 8
 * columns c = 8 l + 256 j, j = 0, 1, ... in column order, one fmaf each into its
 * own accumulator, and the 32 accumulators meet in the xor butterfly of
 * qd_router_warp_sum (which leaves the same bits in every lane). */
#ifndef QD_ROUTER_DOT_CUH
#define QD_ROUTER_DOT_CUH

#include <stdint.h>

#include "backend/cuda/cuda_common.cuh"

/* acc + the 8 bf16 weights of w times a[0..4) b[0..4), in column order */
__device__ __forceinline__ float qd_router_dot8(const uint4 w, const float4 a, const float4 b, float acc) {
    float wf[8];
    qd_bf16x8_f32(w, wf);
    acc = fmaf(wf[0], a.x, acc); acc = fmaf(wf[1], a.y, acc); acc = fmaf(wf[2], a.z, acc);
    acc = fmaf(wf[3], a.w, acc); acc = fmaf(wf[4], b.x, acc); acc = fmaf(wf[5], b.y, acc);
    acc = fmaf(wf[6], b.z, acc); acc = fmaf(wf[7], b.w, acc);
    return acc;
}

__device__ __forceinline__ float qd_router_warp_sum(float acc) {
    for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
    return acc;
}

#endif
