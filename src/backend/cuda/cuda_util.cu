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
    /* The runtime also keeps a failed call's error as the thread's "last error" until
     * cudaGetLastError reads it. Reported here, it must not be reported again by the
     * next launch check (QD_CUDA_CHECK_LAUNCH), which would fail an unrelated later
     * forward: a non-sticky failure in one step then failed every other step of the
     * server. Sticky errors (a broken context) are not cleared by this and keep failing. */
    (void)cudaGetLastError();
    return QD_ERR_BACKEND;
}

qd_status qd_cuda_fail(qd_status s, const char *msg) {
    snprintf(g_err, sizeof g_err, "%s", msg);
    return s;
}

int qd_cuda_sm_count(void) {
    static int sms = 0; /* a benign race: every thread asks the same device */
    if (!sms) {
        int dev = 0, v = 0;
        sms = cudaGetDevice(&dev) == cudaSuccess &&
                      cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, dev) == cudaSuccess && v > 0
                  ? v
                  : 132;
    }
    return sms;
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

/* An allocation's result: out of memory as QD_ERR_OOM (the message names the call), other
 * failures as qd_cuda_status maps them. */
static qd_status alloc_status(cudaError_t e, const char *what) {
    const qd_status st = qd_cuda_status(e, what);
    return e == cudaErrorMemoryAllocation ? QD_ERR_OOM : st;
}

extern "C" qd_status qd_cuda_malloc(void **p, size_t bytes) {
    *p = NULL;
    return alloc_status(cudaMalloc(p, bytes ? bytes : 1), "cudaMalloc");
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

/* ------------------------------------------------ streams, pinned memory, graphs */

extern "C" qd_status qd_cuda_stream_create(void **stream) {
    cudaStream_t s = NULL;
    *stream = NULL;
    QD_CUDA_TRY(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    *stream = s;
    return QD_OK;
}

extern "C" void qd_cuda_stream_destroy(void *stream) {
    if (stream) (void)cudaStreamDestroy((cudaStream_t)stream);
}

extern "C" qd_status qd_cuda_stream_sync(void *stream) {
    return qd_cuda_status(cudaStreamSynchronize((cudaStream_t)stream), "cudaStreamSynchronize");
}

extern "C" qd_status qd_cuda_malloc_host(void **p, size_t bytes) {
    *p = NULL;
    return alloc_status(cudaMallocHost(p, bytes ? bytes : 1), "cudaMallocHost");
}

extern "C" void qd_cuda_free_host(void *p) {
    if (p) (void)cudaFreeHost(p);
}

extern "C" qd_status qd_cuda_memcpy_h2d_async(void *dst, const void *src, size_t bytes, void *stream) {
    return qd_cuda_status(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, (cudaStream_t)stream),
                          "cudaMemcpyAsync H2D");
}

extern "C" qd_status qd_cuda_memcpy_d2h_async(void *dst, const void *src, size_t bytes, void *stream) {
    return qd_cuda_status(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, (cudaStream_t)stream),
                          "cudaMemcpyAsync D2H");
}

extern "C" qd_status qd_cuda_memcpy2d(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
                                      size_t height, void *stream) {
    return qd_cuda_status(cudaMemcpy2DAsync(dst, dpitch, src, spitch, width, height, cudaMemcpyDefault,
                                            (cudaStream_t)stream),
                          "cudaMemcpy2DAsync");
}

extern "C" qd_status qd_cuda_memset_async(void *p, int value, size_t bytes, void *stream) {
    return qd_cuda_status(cudaMemsetAsync(p, value, bytes, (cudaStream_t)stream), "cudaMemsetAsync");
}

extern "C" qd_status qd_cuda_mem_info(size_t *free_bytes, size_t *total_bytes) {
    return qd_cuda_status(cudaMemGetInfo(free_bytes, total_bytes), "cudaMemGetInfo");
}

extern "C" qd_status qd_cuda_graph_begin(void *stream) {
    return qd_cuda_status(cudaStreamBeginCapture((cudaStream_t)stream, cudaStreamCaptureModeThreadLocal),
                          "cudaStreamBeginCapture");
}

extern "C" qd_status qd_cuda_graph_end(void *stream, void **exec) {
    cudaGraph_t g = NULL;
    *exec = NULL;
    QD_CUDA_TRY(cudaStreamEndCapture((cudaStream_t)stream, &g));
    cudaGraphExec_t x = NULL;
    cudaError_t e = cudaGraphInstantiate(&x, g, 0);
    cudaGraphDestroy(g);
    if (e != cudaSuccess) return qd_cuda_status(e, "cudaGraphInstantiate");
    *exec = x;
    return QD_OK;
}

extern "C" qd_status qd_cuda_graph_launch(void *exec, void *stream) {
    return qd_cuda_status(cudaGraphLaunch((cudaGraphExec_t)exec, (cudaStream_t)stream), "cudaGraphLaunch");
}

extern "C" void qd_cuda_graph_destroy(void *exec) {
    if (exec) (void)cudaGraphExecDestroy((cudaGraphExec_t)exec);
}

/* Device-to-device copy bandwidth (bytes read + written per second), the median of
 * 10 copies of `bytes` after 3 warm-ups: the roofline that decode and the kernel
 * benchmarks are measured against (one definition for all of them). */
extern "C" qd_status qd_cuda_copy_gbps(size_t bytes, double *gbps) {
    *gbps = 0;
    void *a = NULL, *b = NULL;
    qd_status s = qd_cuda_malloc(&a, bytes);
    if (!s) s = qd_cuda_malloc(&b, bytes);
    if (!s) s = qd_cuda_memset(a, 1, bytes);
    cudaEvent_t e0 = NULL, e1 = NULL;
    if (!s) s = qd_cuda_status(cudaEventCreate(&e0), "cudaEventCreate");
    if (!s) s = qd_cuda_status(cudaEventCreate(&e1), "cudaEventCreate");
    float ms_all[13];
    for (int i = 0; i < 13 && !s; i++) {
        cudaEventRecord(e0, 0);
        s = qd_cuda_status(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, 0), "cudaMemcpyAsync");
        cudaEventRecord(e1, 0);
        if (!s) s = qd_cuda_status(cudaEventSynchronize(e1), "cudaEventSynchronize");
        float ms = 0;
        if (!s) s = qd_cuda_status(cudaEventElapsedTime(&ms, e0, e1), "cudaEventElapsedTime");
        ms_all[i] = ms;
    }
    if (!s) {
        float *m = ms_all + 3; /* after the warm-ups: insertion sort of 10, take the middle */
        for (int i = 1; i < 10; i++)
            for (int j = i; j > 0 && m[j - 1] > m[j]; j--) {
                const float t = m[j];
                m[j] = m[j - 1];
                m[j - 1] = t;
            }
        *gbps = 2.0 * (double)bytes / (m[5] * 1e-3) / 1e9;
    }
    if (e0) cudaEventDestroy(e0);
    if (e1) cudaEventDestroy(e1);
    qd_cuda_free(a);
    qd_cuda_free(b);
    return s;
}
