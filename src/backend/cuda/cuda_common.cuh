/* Device helpers shared by every kernel family: bf16 <-> fp32 on raw bit
 * patterns (the public API passes bf16 as uint16_t so C callers need no CUDA
 * types), and cp.async for the software pipeline of the state kernel. */
#ifndef QD_CUDA_COMMON_CUH
#define QD_CUDA_COMMON_CUH

#include <cuda_bf16.h>
#include <stdint.h>

/* bf16 is the top half of an fp32: widening is a shift. */
__device__ __forceinline__ float qd_bf2f(uint16_t x) { return __uint_as_float((uint32_t)x << 16); }

/* Round to nearest even, as the CPU side and the tensor cores expect. */
__device__ __forceinline__ uint16_t qd_f2bf(float x) { return __bfloat16_as_ushort(__float2bfloat16_rn(x)); }

/* The 8 bf16 numbers of a 16-byte piece, widened in column order. */
__device__ __forceinline__ void qd_bf16x8_f32(const uint4 v, float f[8]) {
    f[0] = __uint_as_float(v.x << 16); f[1] = __uint_as_float(v.x & 0xffff0000u);
    f[2] = __uint_as_float(v.y << 16); f[3] = __uint_as_float(v.y & 0xffff0000u);
    f[4] = __uint_as_float(v.z << 16); f[5] = __uint_as_float(v.z & 0xffff0000u);
    f[6] = __uint_as_float(v.w << 16); f[7] = __uint_as_float(v.w & 0xffff0000u);
}

/* The logistic function as every fp32 gate of the model computes it. */
__device__ __forceinline__ float qd_sigmoidf(float x) { return 1.f / (1.f + expf(-x)); }

/* A thread's walk over the elements i = first, first + step, ... of rows of `per`
 * elements as (row t, element c), without a division a step: a division by a runtime
 * value is about 20 instructions, on the chain before a decode block's first product
 * (the walks start with c < per at the models' shapes, so the constructor loops rarely). */
struct qd_walk {
    int t, c;
    __device__ qd_walk(int first, int per) : t(0), c(first) {
        if (per <= 0) t = 1 << 30; /* no elements: past every row */
        else while (c >= per) { c -= per; t++; }
    }
    __device__ void next(int step, int per) {
        c += step;
        while (c >= per) { c -= per; t++; }
    }
};

__device__ __forceinline__ uint32_t qd_pack_bf2(float a, float b) {
    return (uint32_t)qd_f2bf(a) | ((uint32_t)qd_f2bf(b) << 16);
}

/* Weights streamed once: a 16-byte read-only load that does not allocate in L1, with a
 * 256-byte L2 prefetch of the rest of the line pair (the GEMV and MoE decode kernels). */
__device__ __forceinline__ uint4 qd_ld_stream16(const void *p) {
    uint4 r;
    asm("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];"
        : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
        : "l"(p));
    return r;
}

/* 16-byte global -> shared copy that bypasses registers; with valid == false
 * the 16 bytes are zero-filled (rows past the end of a short chunk), and the
 * source address is not read. */
__device__ __forceinline__ void qd_cp_async16(void *smem, const void *gmem, bool valid) {
    const unsigned s = (unsigned)__cvta_generic_to_shared(smem);
    const int n = valid ? 16 : 0;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(n) : "memory");
}
/* A last-block count: adds 1 to a device-wide counter with acquire-release order and
 * returns the old value. Called by one thread after a block barrier, its release covers
 * the block's earlier writes (the barrier orders them before it, as a grid barrier's
 * arrival does), and its acquire, with a barrier after it, the block's later reads: one
 * fence a block instead of one a thread. */
__device__ __forceinline__ int qd_count_in(int *ctr) {
    int old;
    asm volatile("atom.add.acq_rel.gpu.s32 %0, [%1], 1;" : "=r"(old) : "l"(ctr) : "memory");
    return old;
}
/* 4-byte global -> shared copy of which the first `bytes` (0 to 4) are read and the rest
 * zero-filled (per-row scales beside a tile's rows; 0: the source is not read). */
__device__ __forceinline__ void qd_cp_async4(void *smem, const void *gmem, int bytes) {
    const unsigned s = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(s), "l"(gmem), "r"(bytes) : "memory");
}
__device__ __forceinline__ void qd_cp_async_commit(void) { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N> __device__ __forceinline__ void qd_cp_async_wait(void) {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}
/* An ST-stage cp.async pipeline's first ST - 1 stages: load(s, s) for s < steps, and a commit
 * group for each of them even where empty, so that step s always waits for group s
 * (qd_cp_async_wait<ST - 2> at step s, which then commits the load of step s + ST - 1). */
template <int ST, class Load> __device__ __forceinline__ void qd_cp_async_prologue(Load &load, int steps) {
#pragma unroll
    for (int s = 0; s < ST - 1; s++) {
        if (s < steps) load(s, s);
        qd_cp_async_commit();
    }
}

#endif
