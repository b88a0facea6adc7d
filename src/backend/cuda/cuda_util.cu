/* Small CUDA runtime wrappers with C linkage, so that host code in C (tests,
 * benchmarks, the engine) can allocate, copy and time without CUDA headers,
 * and so that every CUDA failure becomes a qd_status plus a message instead
 * of an abort. */
#include <stdio.h>
#include <string.h>

#include "backend/cuda/cuda_util.h"

/* One message per host thread: launchers may be called from several threads. */
static thread_local char g_err[256];

qd_status qd_cuda_status(cudaError_t e, const char *what) {
    if (e == cudaSuccess) return QD_OK;
    snprintf(g_err, sizeof g_err, "%s: %s (%s)", what, cudaGetErrorString(e), cudaGetErrorName(e));
    return QD_ERR_BACKEND;
}

qd_status qd_cuda_fail(qd_status s, const char *msg) {
    snprintf(g_err, sizeof g_err, "%s", msg);
    return s;
}

extern "C" const char *qd_cuda_last_error(void) { return g_err; }

extern "C" int qd_cuda_device_count(void) {
    int n = 0;
    /* No driver, no device or a driver too old all mean "no usable GPU" here. */
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        (void)cudaGetLastError(); /* not a sticky error: clear it so a later launch check does not report it */
        return 0;
    }
    return n;
}

extern "C" qd_status qd_cuda_device_info(char *name, size_t name_size, int *sm_count) {
    int dev = 0;
    QD_CUDA_TRY(cudaGetDevice(&dev));
    cudaDeviceProp prop;
    QD_CUDA_TRY(cudaGetDeviceProperties(&prop, dev));
    if (name && name_size) snprintf(name, name_size, "%s", prop.name);
    if (sm_count) *sm_count = prop.multiProcessorCount;
    return QD_OK;
}

extern "C" qd_status qd_cuda_malloc(void **p, size_t bytes) {
    *p = NULL;
    cudaError_t e = cudaMalloc(p, bytes ? bytes : 1);
    if (e == cudaErrorMemoryAllocation) {
        qd_cuda_status(e, "cudaMalloc");
        return QD_ERR_OOM;
    }
    return qd_cuda_status(e, "cudaMalloc");
}

extern "C" void qd_cuda_free(void *p) {
    if (p) (void)cudaFree(p);
}

extern "C" qd_status qd_cuda_memcpy_h2d(void *dst, const void *src, size_t bytes) {
    return qd_cuda_status(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice), "cudaMemcpy H2D");
}

extern "C" qd_status qd_cuda_memcpy_d2h(void *dst, const void *src, size_t bytes) {
    return qd_cuda_status(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy D2H");
}

extern "C" qd_status qd_cuda_memcpy_d2d(void *dst, const void *src, size_t bytes, void *stream) {
    return qd_cuda_status(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, (cudaStream_t)stream),
                          "cudaMemcpyAsync D2D");
}

extern "C" qd_status qd_cuda_memset(void *p, int value, size_t bytes) {
    return qd_cuda_status(cudaMemset(p, value, bytes), "cudaMemset");
}

extern "C" qd_status qd_cuda_sync(void) {
    return qd_cuda_status(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
}

extern "C" qd_status qd_cuda_timer_create(qd_cuda_timer *t) {
    cudaEvent_t a = NULL, b = NULL;
    t->start = t->stop = NULL;
    QD_CUDA_TRY(cudaEventCreate(&a));
    cudaError_t e = cudaEventCreate(&b);
    if (e != cudaSuccess) {
        cudaEventDestroy(a);
        return qd_cuda_status(e, "cudaEventCreate");
    }
    t->start = a;
    t->stop = b;
    return QD_OK;
}

extern "C" qd_status qd_cuda_timer_start(qd_cuda_timer *t) {
    return qd_cuda_status(cudaEventRecord((cudaEvent_t)t->start, 0), "cudaEventRecord");
}

extern "C" qd_status qd_cuda_timer_stop(qd_cuda_timer *t, float *ms) {
    QD_CUDA_TRY(cudaEventRecord((cudaEvent_t)t->stop, 0));
    QD_CUDA_TRY(cudaEventSynchronize((cudaEvent_t)t->stop));
    return qd_cuda_status(cudaEventElapsedTime(ms, (cudaEvent_t)t->start, (cudaEvent_t)t->stop),
                          "cudaEventElapsedTime");
}

extern "C" void qd_cuda_timer_destroy(qd_cuda_timer *t) {
    if (t->start) cudaEventDestroy((cudaEvent_t)t->start);
    if (t->stop) cudaEventDestroy((cudaEvent_t)t->stop);
    t->start = t->stop = NULL;
}
