/* The all-reduce between tensor-parallel ranks on CUDA (docs/parallel.md), one interface
 * with two implementations:
 *
 *   NCCL (comm_nccl.c): one communicator per rank, each rank on its own GPU; ncclAllReduce
 *     on the rank's stream. NVLink multicast (NVLS) stays off: NCCL_NVLS_ENABLE is set to 0
 *     at creation unless the environment already sets it (a launcher's choice wins).
 *   one device (comm_local.c): every rank on the same GPU, each with its own stream and host
 *     thread (NCCL refuses two ranks on one device); the ranks order their streams with
 *     events and each adds all partial sums on the device in rank order, so the result is
 *     the CPU group's bit for bit given the same partial sums. For tests and one-GPU runs.
 *
 * Every rank calls qd_comm_all_reduce from its own thread, the same number of times in the
 * same order, each on its own stream: the call only enqueues work (the one-device one also
 * meets the other ranks' threads at a barrier), and the buffer holds the sum once the
 * stream reaches that point. */
#ifndef QD_PARALLEL_COMM_H
#define QD_PARALLEL_COMM_H

#include <stdbool.h>
#include <stddef.h>

#include "base/err.h"

typedef struct qd_comm_group qd_comm_group;

typedef struct qd_comm_ops {
    /* rank r's buf [count] fp32 becomes the sum over the ranks, in place */
    qd_status (*all_reduce)(qd_comm_group *g, int rank, float *d_buf, size_t count, void *stream);
    /* releases every rank waiting in (or later entering) an all-reduce with an error */
    void (*break_group)(qd_comm_group *g);
    void (*destroy)(qd_comm_group *g);
} qd_comm_ops;

struct qd_comm_group {
    const qd_comm_ops *ops;
    int size;
    bool graph_safe;   /* the all-reduce can be captured in a CUDA graph */
    const char *kind;  /* "nccl", "one device" */
    void *impl;
};

/* Whether this build has NCCL (CMake found nccl.h and libnccl). */
bool qd_comm_nccl_available(void);
/* size ranks, rank r on GPU devices[r] (distinct). QD_ERR_UNSUPPORTED with the reason in a
 * build without NCCL. Callable from any thread. */
qd_status qd_comm_nccl_create(int size, const int *devices, qd_comm_group **out, qd_err *err);
/* size ranks on GPU `device`, reducing at most max_count floats per call. Callable from any
 * thread (it makes `device` current). */
qd_status qd_comm_local_create(int size, int device, size_t max_count, qd_comm_group **out, qd_err *err);

/* On rank `rank`'s thread and stream; the failure message through qd_cuda_last_error. */
static inline qd_status qd_comm_all_reduce(qd_comm_group *g, int rank, float *d_buf, size_t count, void *stream) {
    return g->ops->all_reduce(g, rank, d_buf, count, stream);
}
/* After a failure on one rank: the others' all-reduces fail instead of waiting forever;
 * the group cannot be used again. */
static inline void qd_comm_break(qd_comm_group *g) { g->ops->break_group(g); }
static inline void qd_comm_destroy(qd_comm_group *g) {
    if (g) g->ops->destroy(g);
}

#endif
