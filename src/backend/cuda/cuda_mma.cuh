/* Warp-level tensor-core and copy primitives of the CUDA kernels (sm_90): mma.sync
 * m16n8k16 bf16 -> fp32, ldmatrix/stmatrix, mbarriers and bulk (TMA, non-tensor)
 * global -> shared copies. One definition of each, for the chunked GDN, attention,
 * MoE and batch-invariant GEMM kernels.
 *
 * Fragment layouts of mma.m16n8k16 (g = lane / 4, t = lane % 4), each 32-bit
 * register holding two bf16 (lower half first):
 *   A 16x16: a0 = A[g][2t..2t+1], a1 = A[g+8][2t..], a2 = A[g][2t+8..], a3 = A[g+8][2t+8..]
 *   B 16x8:  b0 = B[2t..2t+1][g], b1 = B[2t+8..2t+9][g]
 *   C 16x8:  c0 = C[g][2t], c1 = C[g][2t+1], c2 = C[g+8][2t], c3 = C[g+8][2t+1]
 * so the accumulators of two adjacent 16x8 tiles, packed to bf16 pairs, are
 * directly the A operand of the next product (C -> A reuse, no shuffles). */
#ifndef QD_CUDA_MMA_CUH
#define QD_CUDA_MMA_CUH

#include <cuda_bf16.h>
#include <stdint.h>

__device__ __forceinline__ uint32_t qd_smem_u32(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }

/* Two floats to a bf16 pair (round to nearest even), first in the low half. */
__device__ __forceinline__ uint32_t qd_bf2_pack(float lo, float hi) {
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const uint32_t *>(&v);
}
__device__ __forceinline__ float qd_bf2_lo(uint32_t x) { return __uint_as_float(x << 16); }
__device__ __forceinline__ float qd_bf2_hi(uint32_t x) { return __uint_as_float(x & 0xffff0000u); }

/* D += A B on the tensor cores. */
__device__ __forceinline__ void qd_mma16816(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* Four 8x8 bf16 matrices; lanes 8i..8i+7 give the row addresses of matrix i.
 * Plain: thread T gets M_i[T/4][2(T%4)..+1]; .trans: M_i[2(T%4)..+1][T/4].
 * volatile keeps them after the barrier waits that make the data valid. */
__device__ __forceinline__ void qd_ldsm4(uint32_t addr, uint32_t &r0, uint32_t &r1, uint32_t &r2, uint32_t &r3) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(addr));
}
__device__ __forceinline__ void qd_ldsm4t(uint32_t addr, uint32_t &r0, uint32_t &r1, uint32_t &r2, uint32_t &r3) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(addr));
}
/* The same on fragment arrays, from a shared-memory pointer: r[i] of matrix i. */
__device__ __forceinline__ void qd_ldsm_x4(uint32_t (&r)[4], const void *p) {
    qd_ldsm4(qd_smem_u32(p), r[0], r[1], r[2], r[3]);
}
__device__ __forceinline__ void qd_ldsm_x4_t(uint32_t (&r)[4], const void *p) {
    qd_ldsm4t(qd_smem_u32(p), r[0], r[1], r[2], r[3]);
}
/* c += a b on fragment arrays (b as two registers or as a pair). Not volatile: a
 * register-only op the compiler may schedule among the ldmatrix (which stay volatile,
 * ordered against the barriers); the mma of one accumulator still run in program
 * order, each reading the previous one's result. */
__device__ __forceinline__ void qd_mma_bf16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    qd_mma16816(c, a, b0, b1);
}
__device__ __forceinline__ void qd_mma_bf16(float (&c)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
    qd_mma16816(c, a, b[0], b[1]);
}

/* A warp's MI x NI grid of m16n8 accumulators set to zero. */
template <int MI, int NI> __device__ __forceinline__ void qd_mma_clear(float (&acc)[MI][NI][4]) {
#pragma unroll
    for (int mi = 0; mi < MI; mi++)
#pragma unroll
        for (int ni = 0; ni < NI; ni++)
#pragma unroll
            for (int c = 0; c < 4; c++) acc[mi][ni][c] = 0.0f;
}

/* Transposed store of four 8x8 matrices: the element a thread holds at
 * fragment position (T/4, 2(T%4)+e) lands in row 2(T%4)+e, column T/4. */
__device__ __forceinline__ void qd_stsm4t(uint32_t addr, uint32_t r0, uint32_t r1, uint32_t r2, uint32_t r3) {
    asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1,%2,%3,%4};\n" ::"r"(addr), "r"(r0),
                 "r"(r1), "r"(r2), "r"(r3)
                 : "memory");
}

/* ------------------------------------------------ mbarrier + bulk copies */

__device__ __forceinline__ void qd_mbar_init(uint32_t bar, uint32_t count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
/* Makes barrier initialisation and earlier ordinary shared-memory writes
 * visible to the copy engine (the async proxy). */
__device__ __forceinline__ void qd_fence_async_smem(void) {
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
/* One arrival that also announces `bytes` of copies completing on the barrier. */
__device__ __forceinline__ void qd_mbar_expect_tx(uint32_t bar, uint32_t bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void qd_mbar_wait(uint32_t bar, uint32_t parity) {
    asm volatile(
        "{\n"
        ".reg .pred P1;\n"
        "QD_WAIT:\n"
        "mbarrier.try_wait.parity.shared::cta.b64 P1, [%0], %1;\n"
        "@!P1 bra QD_WAIT;\n"
        "}\n" ::"r"(bar),
        "r"(parity)
        : "memory");
}
/* bytes (a multiple of 16, both addresses 16-byte aligned) global -> shared,
 * completing on barrier bar. */
__device__ __forceinline__ void qd_bulk_g2s(uint32_t dst, const void *src, uint32_t bytes, uint32_t bar) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
                     dst),
                 "l"(src), "r"(bytes), "r"(bar)
                 : "memory");
}

#endif
