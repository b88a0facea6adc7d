/* Hopper warpgroup MMA (wgmma, sm_90a) for the FP8 GEMV: the A operand (64 weight rows x
 * 32 columns, e4m3) in registers, B (8 or 16 columns, e4m3) in shared memory, fp32 D.
 *
 * Fragments (per warp w of the warpgroup, g = lane / 4, t = lane % 4), as mma.m16n8k32:
 *   A a[0]: row 16w + g, columns 4t .. 4t + 3 (bytes low first); a[1]: row + 8, same
 *     columns; a[2]: row 16w + g, columns 16 + 4t ..; a[3]: row + 8, columns 16 + 4t ..
 *   D d[4h + i]: rows 16w + g (i < 2) or + 8 (i >= 2), column 8h + 2t + (i & 1).
 * B is K-major without swizzle: core matrices of 8 columns x 16 bytes of K, 128 bytes
 * each (column c's 16 K bytes at 16 c); the two core matrices along K at lbo bytes, the
 * next 8 columns at sbo bytes (qd_wgmma_desc).
 *
 * wgmma runs asynchronously: its registers are read and written after the instruction
 * issues, until the wait for its group. The compiler does not know that, so a kernel
 * passes the registers through qd_wgmma_keep after the wait: A stays live (not reused
 * for loads in flight) and D is read only after the wait. */
#ifndef QD_CUDA_WGMMA_CUH
#define QD_CUDA_WGMMA_CUH

#include <stdint.h>

__device__ __forceinline__ uint64_t qd_wgmma_desc(const void *smem, unsigned lbo, unsigned sbo) {
    const uint64_t a = (uint64_t)(((unsigned)__cvta_generic_to_shared(smem) & 0x3ffffu) >> 4);
    return a | ((uint64_t)(lbo >> 4) << 16) | ((uint64_t)(sbo >> 4) << 32);
}

__device__ __forceinline__ void qd_wgmma_fence(void) { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void qd_wgmma_commit(void) { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void qd_wgmma_wait0(void) { asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory"); }

__device__ __forceinline__ void qd_wgmma_keep(uint32_t &r) { asm volatile("" : "+r"(r)::"memory"); }
__device__ __forceinline__ void qd_wgmma_keep(float &r) { asm volatile("" : "+f"(r)::"memory"); }

/* d = A B (the previous d is not read: scale-d 0), m64 x n8 x k32, e4m3 x e4m3 -> f32 */
__device__ __forceinline__ void qd_wgmma_f8_n8(float (&d)[4], const uint32_t (&a)[4], uint64_t b) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 0, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n8k32.f32.e4m3.e4m3 {%0,%1,%2,%3}, {%4,%5,%6,%7}, %8, p, 1, 1;\n}"
                 : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b)
                 : "memory");
}

/* the same, n16 */
__device__ __forceinline__ void qd_wgmma_f8_n16(float (&d)[8], const uint32_t (&a)[4], uint64_t b) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 0, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n16k32.f32.e4m3.e4m3 {%0,%1,%2,%3,%4,%5,%6,%7}, "
                 "{%8,%9,%10,%11}, %12, p, 1, 1;\n}"
                 : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3]), "=f"(d[4]), "=f"(d[5]), "=f"(d[6]), "=f"(d[7])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b)
                 : "memory");
}

/* the same, n32 */
__device__ __forceinline__ void qd_wgmma_f8_n32(float (&d)[16], const uint32_t (&a)[4], uint64_t b) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 0, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n32k32.f32.e4m3.e4m3 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,"
                 "%12,%13,%14,%15}, {%16,%17,%18,%19}, %20, p, 1, 1;\n}"
                 : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3]), "=f"(d[4]), "=f"(d[5]), "=f"(d[6]), "=f"(d[7]),
                   "=f"(d[8]), "=f"(d[9]), "=f"(d[10]), "=f"(d[11]), "=f"(d[12]), "=f"(d[13]), "=f"(d[14]),
                   "=f"(d[15])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b)
                 : "memory");
}

template <int NG> struct qd_wgmma_f8;
template <> struct qd_wgmma_f8<1> {
    __device__ static __forceinline__ void run(float (&d)[4], const uint32_t (&a)[4], uint64_t b) { qd_wgmma_f8_n8(d, a, b); }
};
template <> struct qd_wgmma_f8<2> {
    __device__ static __forceinline__ void run(float (&d)[8], const uint32_t (&a)[4], uint64_t b) { qd_wgmma_f8_n16(d, a, b); }
};
template <> struct qd_wgmma_f8<4> {
    __device__ static __forceinline__ void run(float (&d)[16], const uint32_t (&a)[4], uint64_t b) { qd_wgmma_f8_n32(d, a, b); }
};

#endif
