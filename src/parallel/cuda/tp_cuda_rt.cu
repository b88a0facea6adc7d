/* CUDA runtime wrappers and the rank-order sum of the single-device all-reduce
 * (tp_cuda_rt.h). */
#include <stdint.h>

#include "backend/cuda/cuda_util.h"
#include "parallel/cuda/tp_cuda_rt.h"

#define TP_SUM_MAX 8

extern "C" qd_status qd_tp_set_device(int dev) { return qd_cuda_status(cudaSetDevice(dev), "cudaSetDevice"); }

extern "C" qd_status qd_tp_fail(qd_status s, const char *msg) { return qd_cuda_fail(s, msg); }

extern "C" qd_status qd_tp_event_create(void **ev, bool timing) {
    cudaEvent_t e = NULL;
    *ev = NULL;
    QD_CUDA_TRY(cudaEventCreateWithFlags(&e, timing ? cudaEventDefault : cudaEventDisableTiming));
    *ev = e;
    return QD_OK;
}

extern "C" void qd_tp_event_destroy(void *ev) {
    if (ev) (void)cudaEventDestroy((cudaEvent_t)ev);
}

extern "C" qd_status qd_tp_event_record(void *ev, void *stream, bool external) {
    cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    if (external) QD_CUDA_TRY(cudaStreamIsCapturing((cudaStream_t)stream, &cs));
    if (cs == cudaStreamCaptureStatusActive)
        return qd_cuda_status(cudaEventRecordWithFlags((cudaEvent_t)ev, (cudaStream_t)stream, cudaEventRecordExternal),
                              "cudaEventRecordWithFlags");
    return qd_cuda_status(cudaEventRecord((cudaEvent_t)ev, (cudaStream_t)stream), "cudaEventRecord");
}

extern "C" qd_status qd_tp_stream_wait(void *stream, void *ev) {
    return qd_cuda_status(cudaStreamWaitEvent((cudaStream_t)stream, (cudaEvent_t)ev, 0), "cudaStreamWaitEvent");
}

extern "C" qd_status qd_tp_event_ms(void *start, void *stop, float *ms) {
    return qd_cuda_status(cudaEventElapsedTime(ms, (cudaEvent_t)start, (cudaEvent_t)stop), "cudaEventElapsedTime");
}

struct rank_ptrs {
    const float *p[TP_SUM_MAX];
};

/* One thread per 4 floats when every buffer is 16-byte aligned and count % 4 == 0. */
__global__ void sum_ranks4(float4 *__restrict__ out, rank_ptrs in, int n, size_t count4) {
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= count4) return;
    float4 s = ((const float4 *)in.p[0])[i];
    for (int r = 1; r < n; r++) {
        const float4 v = ((const float4 *)in.p[r])[i];
        s.x += v.x;
        s.y += v.y;
        s.z += v.z;
        s.w += v.w;
    }
    out[i] = s;
}

__global__ void sum_ranks1(float *__restrict__ out, rank_ptrs in, int n, size_t count) {
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= count) return;
    float s = in.p[0][i];
    for (int r = 1; r < n; r++) s += in.p[r][i];
    out[i] = s;
}

extern "C" qd_status qd_tp_sum_ranks(float *d_out, const float *const *d_in, int n, size_t count, void *stream) {
    if (n < 1 || n > TP_SUM_MAX) return qd_cuda_fail(QD_ERR_INVALID_ARG, "qd_tp_sum_ranks: 1 to 8 ranks");
    if (count == 0) return QD_OK;
    rank_ptrs in = {};
    bool v4 = count % 4 == 0 && ((uintptr_t)d_out & 15) == 0;
    for (int r = 0; r < n; r++) {
        in.p[r] = d_in[r];
        v4 = v4 && ((uintptr_t)d_in[r] & 15) == 0;
    }
    cudaStream_t s = (cudaStream_t)stream;
    if (v4) {
        const size_t c4 = count / 4;
        sum_ranks4<<<(unsigned)((c4 + 255) / 256), 256, 0, s>>>((float4 *)d_out, in, n, c4);
    } else {
        sum_ranks1<<<(unsigned)((count + 255) / 256), 256, 0, s>>>(d_out, in, n, count);
    }
    QD_CUDA_CHECK_LAUNCH("sum_ranks");
    return QD_OK;
}
