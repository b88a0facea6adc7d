/* The device runtime of the CUDA backend (cuda_util.cu): devices, memory, copies,
 * streams, pinned host memory, graphs and timers, behind C functions so that C callers
 * need no CUDA headers (a stream is a cudaStream_t passed as void *). Every function
 * returns a qd_status and never aborts; the CUDA error text of the last failure is in
 * qd_cuda_last_error(). */
#ifndef QD_CUDA_DEVICE_H
#define QD_CUDA_DEVICE_H

#include <stddef.h>
#include <stdint.h>

#include "qdelta.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Text of the last CUDA failure seen by any qd_cuda_* call (thread-local). */
const char *qd_cuda_last_error(void);
/* Number of usable CUDA devices; 0 when there is no driver or no GPU. */
int qd_cuda_device_count(void);
/* Name and multiprocessor count of the current device. */
qd_status qd_cuda_device_info(char *name, size_t name_size, int *sm_count);

qd_status qd_cuda_malloc(void **p, size_t bytes);
void qd_cuda_free(void *p);
qd_status qd_cuda_memcpy_h2d(void *dst, const void *src, size_t bytes);
qd_status qd_cuda_memcpy_d2h(void *dst, const void *src, size_t bytes);
qd_status qd_cuda_memcpy_d2d(void *dst, const void *src, size_t bytes, void *stream);
/* Fills bytes with the byte value (poisoning outputs in tests). */
qd_status qd_cuda_memset(void *p, int value, size_t bytes);
qd_status qd_cuda_sync(void);
qd_status qd_cuda_mem_info(size_t *free_bytes, size_t *total_bytes);
/* Device copy bandwidth in GB/s (read + write), best of 10 copies of `bytes`. */
qd_status qd_cuda_copy_gbps(size_t bytes, double *gbps);

/* Streams (non-blocking), pinned host memory, async copies, CUDA graphs. */
qd_status qd_cuda_stream_create(void **stream);
void qd_cuda_stream_destroy(void *stream);
qd_status qd_cuda_stream_sync(void *stream);
qd_status qd_cuda_malloc_host(void **p, size_t bytes);
void qd_cuda_free_host(void *p);
qd_status qd_cuda_memcpy_h2d_async(void *dst, const void *src, size_t bytes, void *stream);
qd_status qd_cuda_memcpy_d2h_async(void *dst, const void *src, size_t bytes, void *stream);
/* 2-D copy in any direction (cudaMemcpyDefault: unified addressing tells host from device). */
qd_status qd_cuda_memcpy2d(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width, size_t height,
                           void *stream);
qd_status qd_cuda_memset_async(void *p, int value, size_t bytes, void *stream);
/* Stream capture into an instantiated graph; launch replays it on a stream. */
qd_status qd_cuda_graph_begin(void *stream);
qd_status qd_cuda_graph_end(void *stream, void **exec);
qd_status qd_cuda_graph_launch(void *exec, void *stream);
void qd_cuda_graph_destroy(void *exec);

/* Event timer on the default stream: start, then stop returns milliseconds. */
typedef struct qd_cuda_timer { void *start, *stop; } qd_cuda_timer;
qd_status qd_cuda_timer_create(qd_cuda_timer *t);
qd_status qd_cuda_timer_start(qd_cuda_timer *t);
qd_status qd_cuda_timer_stop(qd_cuda_timer *t, float *ms);
void qd_cuda_timer_destroy(qd_cuda_timer *t);

#ifdef __cplusplus
}
#endif

#endif
