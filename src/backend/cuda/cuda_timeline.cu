/* The timeline recorder's host side (cuda_timeline.h): the table at QD_TL_BASE, the captured
 * launches, arming and writing out. Only a timeline build (QD_CUDA_TIMELINE) does anything. Its
 * problems are reported on stderr; where the table cannot be mapped, that build's kernels fault
 * at their first wait, which reads the switch in it. */
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>

#include "backend/cuda/cuda_timeline.h"

#define TL_MAX_LAUNCHES (QD_CUDA_TIMELINE_ON ? 1 << 16 : 1) /* other builds keep no list */

typedef struct {
    const char *name;
    unsigned long long capture;
    unsigned gx, gy, gz;
} tl_launch;

static tl_launch tl_launches[TL_MAX_LAUNCHES];
static int tl_n_launches;
static int tl_mapped = -1; /* -1 not tried, 0 failed, 1 mapped */
static int tl_forwards;

/* The driver's virtual-memory calls through the runtime's entry points (no link to libcuda). */
static void *tl_entry(const char *name) {
    void *f = NULL;
    cudaDriverEntryPointQueryResult q;
    if (cudaGetDriverEntryPointByVersion(name, &f, 12000, cudaEnableDefault, &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess)
        f = NULL;
    return f;
}

static size_t tl_size(void) {
    const size_t gran = (size_t)2 << 20;
    return (QD_TL_BYTES + gran - 1) / gran * gran;
}

static int tl_map(void) {
    if (tl_mapped >= 0) return tl_mapped;
    tl_mapped = 0;
    typedef CUresult (*reserve_f)(CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long);
    typedef CUresult (*create_f)(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *,
                                 unsigned long long);
    typedef CUresult (*map_f)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long);
    typedef CUresult (*access_f)(CUdeviceptr, size_t, const CUmemAccessDesc *, size_t);
    reserve_f reserve = (reserve_f)tl_entry("cuMemAddressReserve");
    create_f create = (create_f)tl_entry("cuMemCreate");
    map_f map = (map_f)tl_entry("cuMemMap");
    access_f access = (access_f)tl_entry("cuMemSetAccess");
    int dev = 0;
    if (!reserve || !create || !map || !access || cudaGetDevice(&dev) != cudaSuccess) {
        fprintf(stderr, "timeline: the driver's virtual-memory calls are not available\n");
        return 0;
    }
    CUmemAllocationProp prop = {};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = dev;
    const size_t size = tl_size();
    CUdeviceptr p = 0;
    CUresult r = reserve(&p, size, (size_t)2 << 20, (CUdeviceptr)QD_TL_BASE, 0);
    if (r != CUDA_SUCCESS || p != (CUdeviceptr)QD_TL_BASE) {
        fprintf(stderr, "timeline: could not reserve %zu bytes at %#llx (error %d, got %#llx): kernels of this "
                        "build will fault\n", size, QD_TL_BASE, (int)r, (unsigned long long)p);
        return 0;
    }
    CUmemGenericAllocationHandle h;
    CUmemAccessDesc ad = {};
    ad.location = prop.location;
    ad.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    if ((r = create(&h, size, &prop, 0)) != CUDA_SUCCESS || (r = map(p, size, 0, h, 0)) != CUDA_SUCCESS ||
        (r = access(p, size, &ad, 1)) != CUDA_SUCCESS) {
        fprintf(stderr, "timeline: could not map the table (error %d): kernels of this build will fault\n", (int)r);
        return 0;
    }
    if (cudaMemset((void *)QD_TL_BASE, 0, size) != cudaSuccess || cudaDeviceSynchronize() != cudaSuccess) {
        fprintf(stderr, "timeline: could not clear the table\n");
        return 0;
    }
    tl_mapped = 1;
    return 1;
}

extern "C" void qd_cuda_timeline_launch(const void *kernel, unsigned gx, unsigned gy, unsigned gz, void *stream) {
    if (!QD_CUDA_TIMELINE_ON || !tl_map()) return;
    cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    unsigned long long id = 0;
    if (cudaStreamGetCaptureInfo((cudaStream_t)stream, &cs, &id) != cudaSuccess) {
        (void)cudaGetLastError();
        return;
    }
    if (cs != cudaStreamCaptureStatusActive || tl_n_launches >= TL_MAX_LAUNCHES) return;
    const char *name = NULL;
    if (cudaFuncGetName(&name, kernel) != cudaSuccess || !name) {
        (void)cudaGetLastError();
        name = "?";
    }
    tl_launches[tl_n_launches++] = (tl_launch){name, id, gx, gy, gz};
}

static void tl_write(void) {
    const size_t n = QD_TL_GRIDS * QD_TL_BLOCKS;
    unsigned long long *rec = (unsigned long long *)malloc(n * QD_TL_REC);
    FILE *f = fopen("qdelta-timeline.txt", "w");
    if (!rec || !f ||
        cudaMemcpy(rec, (const void *)(QD_TL_BASE + QD_TL_HEAD), n * QD_TL_REC, cudaMemcpyDeviceToHost) !=
            cudaSuccess) {
        fprintf(stderr, "timeline: could not write qdelta-timeline.txt\n");
        free(rec);
        if (f) fclose(f);
        return;
    }
    fprintf(f, "# qdelta timeline of forward %d: L capture name gx gy gz; T grid t_wait_ns t_release_ns blocks sm "
               "block\n", QD_CUDA_TIMELINE_STEP);
    for (int i = 0; i < tl_n_launches; i++)
        fprintf(f, "L %llu %s %u %u %u\n", tl_launches[i].capture, tl_launches[i].name, tl_launches[i].gx,
                tl_launches[i].gy, tl_launches[i].gz);
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        const unsigned long long *r = rec + 4 * i;
        if (!r[0]) continue;
        fprintf(f, "T %llu %llu %llu %llu %llu %llu\n", r[0], r[1], r[2], r[3] >> 32, (r[3] >> 20) & 0xfff,
                r[3] & 0xfffff);
        k++;
    }
    fclose(f);
    free(rec);
    fprintf(stderr, "timeline: %zu block records of forward %d in qdelta-timeline.txt\n", k, QD_CUDA_TIMELINE_STEP);
}

extern "C" void qd_cuda_timeline_forward(void *stream) {
    if (!QD_CUDA_TIMELINE_ON || !tl_map()) return;
    const int step = ++tl_forwards;
    cudaStream_t s = (cudaStream_t)stream;
    if (step == QD_CUDA_TIMELINE_STEP) { /* clear, then switch on, ahead of this forward's kernels */
        if (cudaMemsetAsync((void *)QD_TL_BASE, 0, QD_TL_BYTES, s) != cudaSuccess ||
            cudaMemsetAsync((void *)QD_TL_BASE, 1, 1, s) != cudaSuccess)
            fprintf(stderr, "timeline: could not arm the recording\n");
    } else if (step == QD_CUDA_TIMELINE_STEP + 1) { /* the recorded forward has been waited for */
        if (cudaStreamSynchronize(s) != cudaSuccess || cudaMemset((void *)QD_TL_BASE, 0, 8) != cudaSuccess) {
            fprintf(stderr, "timeline: the recorded forward failed\n");
            return;
        }
        tl_write();
    }
}
