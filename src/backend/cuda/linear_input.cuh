/* The input x of a decode-sized projection built in shared memory by the block that
 * multiplies it (cuda_linear.h's kinds): an RMSNorm of the residual, the GDN gated norm,
 * SwiGLU of a gate|up product, or plain bf16 rows copied in. Shared by the fused bf16
 * GEMV (gemv_fused.cu) and the quantized tensor-core GEMV (gemv_quant_mma.cu), so that a
 * norm or activation costs neither a launch nor a round trip of x through memory.
 *
 * Each kind gives the bits its materialising kernel (elementwise.cu) writes, whatever the
 * block's NT threads (whole warps, at least QD_LIN_BUILD_MAX_N) and n: a product is the same
 * whether its x was built in place or materialised first, and a row of x the same for any
 * batch. Activations are read through L2 (ld.cg): the previous kernel may have run beside
 * this one (PDL). */
#ifndef QD_CUDA_LINEAR_INPUT_CUH
#define QD_CUDA_LINEAR_INPUT_CUH

#include <stdint.h>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_linear.h"

#define QD_LIN_BUILD_MAX_N 16
#define QD_LIN_NORM_NT 256 /* qd_cuda_add_rmsnorm's threads (elementwise.cu NORM_NT): its sums, emulated */

__device__ __forceinline__ uint4 qd_lin_pack8(const float *f) {
    return make_uint4(qd_pack_bf2(f[0], f[1]), qd_pack_bf2(f[2], f[3]), qd_pack_bf2(f[4], f[5]),
                      qd_pack_bf2(f[6], f[7]));
}

__device__ __forceinline__ float qd_lin_silu(float x) { return x / (1.f + expf(-x)); }

/* x[t] = bf16(h[t] * inv_t * (1 + w)), the bits qd_cuda_add_rmsnorm writes: its 256
 * threads' sums (thread j takes columns j, j + 256, ... in order, then a warp's xor tree,
 * then the 8 warps in order) are taken here by whichever warps the block has. */
template <int NT>
__device__ void qd_lin_rmsnorm(const qd_cuda_lin_in &p, int64_t cols, int n, uint4 *xs) {
    constexpr int VW = QD_LIN_NORM_NT / 32; /* the materialising kernel's warps */
    __shared__ float red[QD_LIN_BUILD_MAX_N][VW];
    __shared__ float inv[QD_LIN_BUILD_MAX_N];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, H = (int)cols;
    for (int t = 0; t < n; t++) {
        const float *hr = p.h + (size_t)(p.rows ? __ldcg(p.rows + t) : t) * cols;
        for (int vw = warp; vw < VW; vw += NT / 32) { /* warp-uniform */
            float ss = 0.f;
#pragma unroll 8
            for (int c = vw * 32 + lane; c < H; c += QD_LIN_NORM_NT) {
                const float v = __ldcg(hr + c);
                ss = fmaf(v, v, ss);
            }
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
            if (lane == 0) red[t][vw] = ss;
        }
    }
    __syncthreads();
    if (tid < n) {
        float s = 0.f;
        for (int w = 0; w < VW; w++) s += red[tid][w];
        inv[tid] = rsqrtf(s / (float)H + p.eps);
    }
    __syncthreads();
    const int C8 = (int)(cols / 8);
    for (qd_walk e(tid, C8); e.t < n; e.next(NT, C8)) {
        const int t = e.t, c8 = e.c;
        const float4 *hr = (const float4 *)(p.h + (size_t)(p.rows ? __ldcg(p.rows + t) : t) * cols) + 2 * c8;
        const float4 *wr = (const float4 *)p.w + 2 * c8;
        const float4 a = __ldcg(hr), b = __ldcg(hr + 1), wa = wr[0], wb = wr[1];
        const float it = inv[t];
        float f[8] = {a.x * it * (1.f + wa.x), a.y * it * (1.f + wa.y), a.z * it * (1.f + wa.z),
                      a.w * it * (1.f + wa.w), b.x * it * (1.f + wb.x), b.y * it * (1.f + wb.y),
                      b.z * it * (1.f + wb.z), b.w * it * (1.f + wb.w)};
        xs[t * C8 + c8] = qd_lin_pack8(f);
    }
}

/* x = bf16(o * inv_head * w * silu(z)), the bits qd_cuda_gated_rmsnorm writes: a warp per
 * (row, head) as there, lane l summing elements l, l + 32, ... of its head in order. A lane
 * keeps its first QD_LIN_GATED_HOLD / 32 o and z values (all of them at the models' dv = 128)
 * from the sum to the product, so a head costs one round trip to L2, not two; the elements
 * past those are loaded again for the product. */
#define QD_LIN_GATED_HOLD 128
template <int NT>
__device__ void qd_lin_gated(const qd_cuda_lin_in &p, int64_t cols, int n, uint4 *xs) {
    constexpr int PER = QD_LIN_GATED_HOLD / 32;
    const int dv = p.dv, hv = (int)cols >> (__ffs(dv) - 1), lane = threadIdx.x & 31; /* dv: a power of two */
    uint16_t *xh = (uint16_t *)xs;
    for (qd_walk e(threadIdx.x >> 5, hv); e.t < n; e.next(NT / 32, hv)) { /* warp-uniform */
        const int r = e.t, h = e.c;
        const uint16_t *oh = p.o + ((size_t)r * hv + h) * dv;
        const float *zh = p.z + (size_t)r * p.ldz + (size_t)h * dv;
        uint16_t *xr = xh + (size_t)r * cols + (size_t)h * dv;
        float xo[PER], zv[PER];
#pragma unroll
        for (int j = 0; j < PER; j++) {
            const int e = lane + 32 * j;
            xo[j] = e < dv ? __uint_as_float((uint32_t)__ldcg(oh + e) << 16) : 0.f;
            zv[j] = e < dv ? __ldcg(zh + e) : 0.f;
        }
        float ss = 0.f;
#pragma unroll
        for (int j = 0; j < PER; j++)
            if (lane + 32 * j < dv) ss = fmaf(xo[j], xo[j], ss);
        for (int e = lane + QD_LIN_GATED_HOLD; e < dv; e += 32) {
            const float x = __uint_as_float((uint32_t)__ldcg(oh + e) << 16);
            ss = fmaf(x, x, ss);
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
        const float inv = 1.f / sqrtf(ss / (float)dv + p.eps);
#pragma unroll
        for (int j = 0; j < PER; j++) {
            const int e = lane + 32 * j;
            if (e < dv) xr[e] = qd_f2bf(xo[j] * inv * p.w[e] * qd_lin_silu(zv[j]));
        }
#pragma unroll 1
        for (int e = lane + QD_LIN_GATED_HOLD; e < dv; e += 32) {
            const float x = __uint_as_float((uint32_t)__ldcg(oh + e) << 16);
            xr[e] = qd_f2bf(x * inv * p.w[e] * qd_lin_silu(__ldcg(zh + e)));
        }
    }
}

/* x = bf16(silu(gate) * up) from gate|up rows of 2 cols. */
template <int NT>
__device__ void qd_lin_silu_mul(const qd_cuda_lin_in &p, int64_t cols, int n, uint4 *xs) {
    const int C8 = (int)(cols / 8);
    for (qd_walk e(threadIdx.x, C8); e.t < n; e.next(NT, C8)) {
        const int t = e.t, c8 = e.c;
        const float4 *g = (const float4 *)(p.gu + (size_t)t * 2 * cols) + 2 * c8;
        const float4 *u = (const float4 *)(p.gu + (size_t)t * 2 * cols + cols) + 2 * c8;
        const float4 ga = __ldcg(g), gb = __ldcg(g + 1), ua = __ldcg(u), ub = __ldcg(u + 1);
        float f[8] = {qd_lin_silu(ga.x) * ua.x, qd_lin_silu(ga.y) * ua.y, qd_lin_silu(ga.z) * ua.z,
                      qd_lin_silu(ga.w) * ua.w, qd_lin_silu(gb.x) * ub.x, qd_lin_silu(gb.y) * ub.y,
                      qd_lin_silu(gb.z) * ub.z, qd_lin_silu(gb.w) * ub.w};
        xs[t * C8 + c8] = qd_lin_pack8(f);
    }
}

/* Plain bf16 x copied in (n rows at stride ldx). */
template <int NT>
__device__ void qd_lin_copy(const qd_cuda_lin_in &p, int64_t cols, int n, uint4 *xs) {
    const int C8 = (int)(cols / 8);
    for (qd_walk e(threadIdx.x, C8); e.t < n; e.next(NT, C8))
        xs[e.t * C8 + e.c] = __ldcg((const uint4 *)(p.x + (size_t)e.t * p.ldx) + e.c);
}

/* xs [n][cols / 8] (16-byte pieces of 8 bf16) from p; the caller synchronises after. */
template <int NT>
__device__ __forceinline__ void qd_lin_build_x(const qd_cuda_lin_in &p, int64_t cols, int n, uint4 *xs) {
    if (p.kind == QD_LIN_RMSNORM) qd_lin_rmsnorm<NT>(p, cols, n, xs);
    else if (p.kind == QD_LIN_GATED) qd_lin_gated<NT>(p, cols, n, xs);
    else if (p.kind == QD_LIN_SILU) qd_lin_silu_mul<NT>(p, cols, n, xs);
    else qd_lin_copy<NT>(p, cols, n, xs);
}

/* 16-byte alignment, which the vector loads of the GEMVs need. */
static inline int qd_lin_al16(const void *p) { return ((uintptr_t)p & 15) == 0; }

/* Whether a block can build x of kind in->kind for cols columns: cols % 8 == 0 and the
 * operands aligned for the 16-byte loads (host side; the caller bounds n and x's bytes). */
static inline int qd_lin_buildable(const qd_cuda_lin_in *in, int64_t cols) {
    if (cols % 8) return 0;
    switch (in->kind) {
    case QD_LIN_BF16: return in->ldx % 8 == 0 && qd_lin_al16(in->x);
    case QD_LIN_RMSNORM: return qd_lin_al16(in->h) && qd_lin_al16(in->w);
    case QD_LIN_GATED: {
        const int G = in->dv / 8;
        return in->dv > 0 && in->dv % 8 == 0 && G <= 32 && (G & (G - 1)) == 0 && cols % in->dv == 0 &&
               qd_lin_al16(in->o) && qd_lin_al16(in->z) && in->ldz % 4 == 0 && qd_lin_al16(in->w);
    }
    case QD_LIN_SILU: return qd_lin_al16(in->gu);
    default: return 0;
    }
}

#endif
