/* Hopper warpgroup MMA (wgmma, sm_90a). For the FP8 GEMV: the A operand (64 weight rows x
 * 32 columns, e4m3) in registers, B (8 or 16 columns, e4m3) in shared memory, fp32 D. For
 * the MoE prefill GEMM: bf16 A and B both in shared memory (the end of this file).
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
__device__ __forceinline__ void qd_wgmma_wait1(void) { asm volatile("wgmma.wait_group.sync.aligned 1;" ::: "memory"); }

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

/* ------------------------------------------------ bf16, both operands in shared memory
 * (the MoE prefill GEMM). Operands K-major in the 128-byte swizzle: rows of 64 bf16 (128
 * bytes), 16-byte chunk c of row r stored at chunk c ^ (r & 7), 8-row atoms of 1024 bytes
 * (1024-byte aligned) stacked along M or N; the k16 slice j of a row set starts 32 j bytes
 * past the set's first row (the hardware applies the swizzle to the whole address). */
__device__ __forceinline__ uint64_t qd_wgmma_desc_sw128(const void *smem) {
    const uint64_t a = (uint64_t)(((unsigned)__cvta_generic_to_shared(smem) & 0x3ffffu) >> 4);
    return a | (1ull << 16) | ((uint64_t)(1024 >> 4) << 32) | (1ull << 62);
}

/* d += A B, m64 x n128 x k16, bf16 x bf16 -> f32: A 64 rows, B 128 rows of K (both K-major,
 * qd_wgmma_desc_sw128). D as in the header comment (h < 16). */
__device__ __forceinline__ void qd_wgmma_bf16_n128(float (&d)[64], uint64_t a, uint64_t b) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {"
                 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,"
                 "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31,"
                 "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47,"
                 "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
                 "%64, %65, p, 1, 1, 0, 0;\n}"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
                   "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
                   "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
                   "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
                   "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
                   "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
                   "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
                   "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
                 : "l"(a), "l"(b)
                 : "memory");
}

/* d (acc ? d + : overwrite) A B, m64 x n64 x k32, e4m3 x e4m3 -> f32, both operands in
 * shared memory as above (a k32 slice j starts 32 j bytes in). Each k32 group is summed
 * by the hardware with truncation (MMA-Sim, arXiv:2511.10909), so a kernel keeps such
 * partial sums short: one 128-column block, then promoted to its fp32 accumulator. */
__device__ __forceinline__ void qd_wgmma_e4m3_n64(float (&d)[32], uint64_t a, uint64_t b, int acc) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e4m3 {"
                 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,"
                 "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
                 "%32, %33, p, 1, 1;\n}"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
                   "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
                   "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
                   "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
                 : "l"(a), "l"(b), "r"(acc)
                 : "memory");
}

#endif
