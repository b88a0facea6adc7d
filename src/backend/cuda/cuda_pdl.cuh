/* Programmatic dependent launch (PDL, sm_90): a kernel launched with
 * qd_launch_pdl may start while the previous kernel on the stream drains, so its
 * prologue (weight or state loads that no earlier kernel writes) overlaps the
 * previous tail and the launch gap; it then waits (qd_pdl_wait) before touching
 * anything an earlier kernel produces or consumes. Works inside CUDA graphs
 * (the edge becomes a programmatic one).
 *
 * The rule every PDL kernel here keeps: before qd_pdl_wait it only reads data
 * that no kernel of the current step writes (weights, or state last written a
 * step ago: each step starts with a plain launch), and it writes nothing. Then a
 * chain A -> B -> C is safe even though C may start before A ends: C's wait
 * returns only after B completed, and B completed only after its own wait saw A
 * complete. qd_pdl_trigger lets the next kernel launch; kernels call it after
 * their wait, so a dependent that reads something early (the MoE down kernel
 * reads the routing before its wait) sees it complete.
 *
 * After the wait, whatever an earlier kernel of the chain wrote is read through L2
 * (ld.cg, or staged into shared memory that way), never through the read-only path
 * (__ldg, ld.global.nc): that path assumes its data does not change while the kernel
 * runs, and a dependent runs before its inputs are written. Batched decodes read x
 * older than the previous kernel's writes when the plain GEMVs of gemm.cu first
 * became dependents with __ldg reads of x (test_cuda_model, RESULTS 2026-12-07). */
#ifndef QD_CUDA_PDL_CUH
#define QD_CUDA_PDL_CUH

#include <cuda_runtime.h>

#include "backend/cuda/cuda_timeline.h"
#include "backend/cuda/cuda_util.h"

/* A timeline build (cuda_timeline.h) has thread 0 of a block note the global timer on either
 * side of the wait; the switch is read before the wait, so that its round trip overlaps it. */
__device__ __forceinline__ void qd_pdl_wait(void) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#if QD_CUDA_TIMELINE_ON
    const bool first = threadIdx.x == 0 && threadIdx.y == 0 && threadIdx.z == 0;
    const unsigned long long on = first ? __ldcg((const unsigned long long *)QD_TL_BASE) : 0ull;
    unsigned long long t_wait, t_release;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t_wait));
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t_release));
    const unsigned long long block =
        blockIdx.x + (unsigned long long)gridDim.x * (blockIdx.y + (unsigned long long)gridDim.y * blockIdx.z);
    if (on && block < QD_TL_BLOCKS) {
        unsigned long long grid;
        unsigned sm;
        asm volatile("mov.u64 %0, %%gridid;" : "=l"(grid));
        asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
        const unsigned long long blocks = (unsigned long long)gridDim.x * gridDim.y * gridDim.z;
        const unsigned long long slot = ((grid * 0x9E3779B97F4A7C15ull) >> 47) * QD_TL_BLOCKS + block;
        unsigned long long *r = (unsigned long long *)(QD_TL_BASE + QD_TL_HEAD + slot * QD_TL_REC);
        r[0] = grid;
        r[1] = t_wait;
        r[2] = t_release;
        r[3] = (blocks << 32) | ((unsigned long long)sm << 20) | block;
    }
#else
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
#endif
}

__device__ __forceinline__ void qd_pdl_trigger(void) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

/* Launches kernel<<<grid, block, smem, s>>>(args...) in clusters of cluster.x * .y * .z
 * blocks (1: no clusters; past 8 the kernel needs cudaFuncAttributeNonPortableClusterSizeAllowed),
 * as a programmatic dependent of the stream's previous kernel when pdl is set; where the device
 * or driver refuses that attribute, as a plain launch (the kernel's wait is then a no-op). */
template <typename... KArgs, typename... Args>
static qd_status qd_launch_pdl_cluster(int pdl, void (*kernel)(KArgs...), dim3 grid, dim3 block, dim3 cluster,
                                       size_t smem, cudaStream_t s, Args... args) {
    if (QD_CUDA_TIMELINE_ON) qd_cuda_timeline_launch((const void *)kernel, grid.x, grid.y, grid.z, s);
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = s;
    cudaLaunchAttribute attr[2];
    unsigned n = 0;
    if (cluster.x * cluster.y * cluster.z > 1) {
        attr[n].id = cudaLaunchAttributeClusterDimension;
        attr[n].val.clusterDim.x = cluster.x;
        attr[n].val.clusterDim.y = cluster.y;
        attr[n].val.clusterDim.z = cluster.z;
        n++;
    }
    const unsigned n_plain = n;
    if (pdl) {
        attr[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        attr[n].val.programmaticStreamSerializationAllowed = 1;
        n++;
    }
    cfg.attrs = attr;
    cfg.numAttrs = n;
    cudaError_t e = cudaLaunchKernelEx(&cfg, kernel, static_cast<KArgs>(args)...);
    if (e != cudaSuccess && n > n_plain) {
        (void)cudaGetLastError();
        cfg.numAttrs = n_plain;
        e = cudaLaunchKernelEx(&cfg, kernel, static_cast<KArgs>(args)...);
    }
    return qd_cuda_status(e, "cudaLaunchKernelEx");
}

/* qd_launch_pdl_cluster without clusters */
template <typename... KArgs, typename... Args>
static qd_status qd_launch_pdl(int pdl, void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t s,
                               Args... args) {
    return qd_launch_pdl_cluster(pdl, kernel, grid, block, dim3(1, 1, 1), smem, s, args...);
}

#endif
