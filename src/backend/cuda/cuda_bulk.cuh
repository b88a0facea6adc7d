/* Bulk asynchronous copies global -> shared (sm_90's cp.async.bulk, the 1-D form of
 * the tensor memory accelerator) completed through a shared-memory mbarrier. A
 * kernel that streams weights once uses them to put a whole tile's bytes in
 * flight with one instruction a row, without holding them in registers: a block's
 * register count then no longer bounds the bytes it has in flight.
 *
 * Protocol, per barrier: one thread inits it with count 1 (qd_mbar_init, then
 * qd_mbar_fence_init before any copy names it); per use, one thread announces
 * the bytes (qd_mbar_expect, which is that use's one arrival) and issues the
 * copies; readers wait for the use's parity (0, 1, 0, ...). Before a buffer is
 * refilled, its readers are done (a barrier of theirs) and the issuing thread
 * orders their generic reads before the async writes (qd_fence_proxy_async).
 * A block never exits with a copy into its shared memory still in flight. */
#ifndef QD_CUDA_BULK_CUH
#define QD_CUDA_BULK_CUH

#include <stdint.h>

__device__ __forceinline__ unsigned qd_smem_addr(const void *p) { return (unsigned)__cvta_generic_to_shared(p); }

__device__ __forceinline__ void qd_mbar_init(uint64_t *bar, unsigned count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(qd_smem_addr(bar)), "r"(count) : "memory");
}

/* Makes the inits visible to the async proxy (the copies' completions). */
__device__ __forceinline__ void qd_mbar_fence_init(void) {
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}

/* The calling thread's arrival for this use, announcing bytes still to land. */
__device__ __forceinline__ void qd_mbar_expect(uint64_t *bar, unsigned bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(qd_smem_addr(bar)), "r"(bytes)
                 : "memory");
}

__device__ __forceinline__ void qd_mbar_wait(uint64_t *bar, unsigned parity) {
    const unsigned a = qd_smem_addr(bar);
    unsigned done;
    do {
        asm volatile("{\n\t.reg .pred p;\n\t"
                     "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n\t"
                     "selp.u32 %0, 1, 0, p;\n\t}"
                     : "=r"(done)
                     : "r"(a), "r"(parity)
                     : "memory");
    } while (!done);
}

/* An L2 policy for data read once per step: evicted first, so the activations and
 * routing of the step stay. */
__device__ __forceinline__ uint64_t qd_l2_evict_first(void) {
    uint64_t p;
    asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(p));
    return p;
}

/* bytes (a multiple of 16, both addresses 16-byte aligned) from src to dst, counted
 * against bar's current use. */
__device__ __forceinline__ void qd_bulk_load(void *dst, const void *src, unsigned bytes, uint64_t *bar,
                                             uint64_t policy) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint"
                 " [%0], [%1], %2, [%3], %4;" ::"r"(qd_smem_addr(dst)),
                 "l"(src), "r"(bytes), "r"(qd_smem_addr(bar)), "l"(policy)
                 : "memory");
}

/* Orders this thread's (and, after a barrier, its group's) generic accesses to shared
 * memory before its later async-proxy copies into it. */
__device__ __forceinline__ void qd_fence_proxy_async(void) {
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}

#endif
