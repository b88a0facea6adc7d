/* CUDA runtime calls the tensor-parallel host code needs, with C linkage and qd_status
 * results (the message through qd_cuda_last_error, per host thread), plus the kernel of
 * the single-device all-reduce. Pointers named d_* are device memory; events and streams
 * are passed as void *. */
#ifndef QD_PARALLEL_TP_CUDA_RT_H
#define QD_PARALLEL_TP_CUDA_RT_H

#include <stdbool.h>
#include <stddef.h>

#include "qdelta.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Makes dev the calling thread's current GPU. */
qd_status qd_tp_set_device(int dev);
/* Records a message for qd_cuda_last_error and returns s (a failure outside CUDA). */
qd_status qd_tp_fail(qd_status s, const char *msg);

/* Events: `timing` ones can be timed (cudaEventElapsedTime), the others only ordered. */
qd_status qd_tp_event_create(void **ev, bool timing);
void qd_tp_event_destroy(void *ev);
/* Records ev on the stream. `external`: inside a stream capture the record becomes a node
 * of the graph, so that every replay records it again (timing graphs); outside a capture
 * it is a plain record. */
qd_status qd_tp_event_record(void *ev, void *stream, bool external);
/* Work queued on the stream after this waits for ev's last record. */
qd_status qd_tp_stream_wait(void *stream, void *ev);
qd_status qd_tp_event_ms(void *start, void *stop, float *ms);

/* d_out[i] = d_in[0][i] + d_in[1][i] + ... + d_in[n - 1][i], added in that order (the CPU
 * group's rank order, so the result does not depend on which rank computes it); n <= 8. */
qd_status qd_tp_sum_ranks(float *d_out, const float *const *d_in, int n, size_t count, void *stream);

#ifdef __cplusplus
}
#endif

#endif
