/* The GDN decode kernels' one-token step on a state tile held in registers, shared by the
 * decode kernel (gdn_decode.cu) and the one that also makes its inputs (gdn_decode_inputs.cu).
 * Every multiply-add is either an explicit fmaf or rounded step by step (__fmul_rn, ...), so
 * the compiler cannot contract it differently in the two kernels. */
#ifndef QD_GDN_DECODE_CUH
#define QD_GDN_DECODE_CUH

#include <cuda_runtime.h>
#include <stdint.h>

#include "backend/cuda/cuda_common.cuh"

#define DEC_NT 256 /* threads per block of the fast path */
#define DEC_BV 32  /* state columns per block: 8 lanes x float4 = one 128-byte line per row */
#define DEC_LPR (DEC_BV / 4)       /* lanes per state row */
#define DEC_RPP (DEC_NT / DEC_LPR) /* rows covered by the block in one pass */

/* The sum over a warp's 32 / DEC_LPR row groups (lanes DEC_LPR apart) of each lane's four columns. */
__device__ __forceinline__ float4 dec_warp_rows_sum(float4 v) {
#pragma unroll
    for (int off = DEC_LPR; off < 32; off *= 2) {
        v.x += __shfl_xor_sync(0xffffffffu, v.x, off); v.y += __shfl_xor_sync(0xffffffffu, v.y, off);
        v.z += __shfl_xor_sync(0xffffffffu, v.z, off); v.w += __shfl_xor_sync(0xffffffffu, v.w, off);
    }
    return v;
}

/* One token on the state tile a block holds: thread (rg, cg) has rows rg + DEC_RPP p of the
 * tile's columns cg*4..cg*4+3 in s; ks, qs [DK] (shared) are the token's k and q, a = exp(g),
 * bt = beta, vv the token's v at the thread's four columns. Writes the new state to Sout (the
 * thread's column base in the output slot) and keeps it in s; the block's output tile (DEC_BV
 * values from o_tile) in bf16. Its last barrier comes after every read of ks / qs, so a caller may
 * refill them for another token after it. */
template <int DK>
__device__ __forceinline__ void dec_token(float4 (&s)[DK / DEC_RPP], const float *ks, const float *qs, float a,
                                          float bt, float4 vv, float *Sout, int dv, uint16_t *o_tile,
                                          float4 (&red_m)[DEC_NT / 32][DEC_LPR],
                                          float4 (&red_o)[DEC_NT / 32][DEC_LPR]) {
    constexpr int RPT = DK / DEC_RPP;
    const int tid = threadIdx.x, cg = tid % DEC_LPR, rg = tid / DEC_LPR;
    const int warp = tid / 32, lane = tid % 32;
    /* m = a S^T k: partial over this thread's rows, then over the 4 row groups
     * of the warp (lanes 8 apart), then over the warps through shared memory. */
    float4 m = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
    for (int p = 0; p < RPT; p++) {
        const float kk = ks[rg + DEC_RPP * p];
        m.x = fmaf(s[p].x, kk, m.x); m.y = fmaf(s[p].y, kk, m.y);
        m.z = fmaf(s[p].z, kk, m.z); m.w = fmaf(s[p].w, kk, m.w);
    }
    m = dec_warp_rows_sum(m);
    if (lane < DEC_LPR) red_m[warp][cg] = m;
    __syncthreads();
    m = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
    for (int w = 0; w < DEC_NT / 32; w++) {
        const float4 rr = red_m[w][cg];
        m.x += rr.x; m.y += rr.y; m.z += rr.z; m.w += rr.w;
    }
    /* d = beta (v - a m); the decay of S is folded into the update below. */
    float4 d;
    d.x = __fmul_rn(bt, __fsub_rn(vv.x, __fmul_rn(a, m.x)));
    d.y = __fmul_rn(bt, __fsub_rn(vv.y, __fmul_rn(a, m.y)));
    d.z = __fmul_rn(bt, __fsub_rn(vv.z, __fmul_rn(a, m.z)));
    d.w = __fmul_rn(bt, __fsub_rn(vv.w, __fmul_rn(a, m.w)));

    /* S' = a S + k d^T, written back at once (and kept for the next token); o = S'^T q
     * from the new values. */
    float4 oa = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
    for (int p = 0; p < RPT; p++) {
        const int rr = rg + DEC_RPP * p;
        const float kk = ks[rr], qq = qs[rr];
        float4 n;
        n.x = fmaf(kk, d.x, __fmul_rn(a, s[p].x)); n.y = fmaf(kk, d.y, __fmul_rn(a, s[p].y));
        n.z = fmaf(kk, d.z, __fmul_rn(a, s[p].z)); n.w = fmaf(kk, d.w, __fmul_rn(a, s[p].w));
        __stcs((float4 *)(Sout + (size_t)rr * dv), n);
        s[p] = n;
        oa.x = fmaf(n.x, qq, oa.x); oa.y = fmaf(n.y, qq, oa.y);
        oa.z = fmaf(n.z, qq, oa.z); oa.w = fmaf(n.w, qq, oa.w);
    }
    oa = dec_warp_rows_sum(oa);
    if (lane < DEC_LPR) red_o[warp][cg] = oa;
    __syncthreads();
    if (tid < DEC_LPR) {
        float4 tt = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
        for (int w = 0; w < DEC_NT / 32; w++) {
            const float4 rr = red_o[w][tid];
            tt.x += rr.x; tt.y += rr.y; tt.z += rr.z; tt.w += rr.w;
        }
        uint2 ob;
        ob.x = qd_pack_bf2(tt.x, tt.y);
        ob.y = qd_pack_bf2(tt.z, tt.w);
        *(uint2 *)(o_tile + tid * 4) = ob;
    }
}

#endif
