/* The NCCL all-reduce (comm.h): one communicator per rank, made together with
 * ncclCommInitAll; ncclAllReduce in place on each rank's stream (capturable in CUDA
 * graphs). Built only where CMake found nccl.h and libnccl (QD_HAVE_NCCL); elsewhere
 * creating it fails with the reason. */
#include <stdio.h>
#include <stdlib.h>

#include "parallel/cuda/comm.h"
#include "parallel/cuda/tp_cuda_rt.h"

#ifdef QD_HAVE_NCCL
#include <nccl.h>

bool qd_comm_nccl_available(void) { return true; }

typedef struct nccl_comm {
    ncclComm_t comms[8];
    bool broken;
} nccl_comm;

static qd_status nccl_all_reduce(qd_comm_group *g, int r, float *d_buf, size_t count, void *stream) {
    nccl_comm *c = g->impl;
    const ncclResult_t e = ncclAllReduce(d_buf, d_buf, count, ncclFloat32, ncclSum, c->comms[r], (cudaStream_t)stream);
    if (e == ncclSuccess) return QD_OK;
    char msg[256];
    snprintf(msg, sizeof msg, "ncclAllReduce on rank %d: %s", r, ncclGetErrorString(e));
    return qd_tp_fail(QD_ERR_BACKEND, msg);
}

/* Breaking the group aborts every rank's NCCL communicator (ncclCommAbort): the NCCL
 * kernels of the others return instead of waiting for a peer that will never come. */
static void nccl_break(qd_comm_group *g) {
    nccl_comm *c = g->impl;
    if (c->broken) return;
    c->broken = true;
    for (int r = 0; r < g->size; r++)
        if (c->comms[r]) (void)ncclCommAbort(c->comms[r]);
}

static void nccl_destroy(qd_comm_group *g) {
    nccl_comm *c = g->impl;
    if (c && !c->broken)
        for (int r = 0; r < g->size; r++)
            if (c->comms[r]) (void)ncclCommDestroy(c->comms[r]);
    free(c);
    free(g);
}

static const qd_comm_ops k_nccl_ops = {nccl_all_reduce, nccl_break, nccl_destroy};

qd_status qd_comm_nccl_create(int size, const int *devices, qd_comm_group **out, qd_err *err) {
    *out = NULL;
    if (size < 1 || size > 8) return qd_seterr(err, QD_ERR_INVALID_ARG, "NCCL all-reduce: 1 to 8 ranks, not %d", size);
    /* NVLink multicast stays off on the shared machines; a value the launcher set wins */
    setenv("NCCL_NVLS_ENABLE", "0", 0);
    qd_comm_group *g = calloc(1, sizeof *g);
    nccl_comm *c = calloc(1, sizeof *c);
    if (!g || !c) {
        free(g);
        free(c);
        return qd_seterr(err, QD_ERR_OOM, "out of memory");
    }
    *g = (qd_comm_group){&k_nccl_ops, size, true, "nccl", c};
    const ncclResult_t e = ncclCommInitAll(c->comms, size, devices);
    if (e != ncclSuccess) {
        for (int r = 0; r < size; r++) c->comms[r] = NULL;
        nccl_destroy(g);
        return qd_seterr(err, QD_ERR_BACKEND, "ncclCommInitAll over %d GPUs: %s", size, ncclGetErrorString(e));
    }
    *out = g;
    return QD_OK;
}

#else

bool qd_comm_nccl_available(void) { return false; }

qd_status qd_comm_nccl_create(int size, const int *devices, qd_comm_group **out, qd_err *err) {
    (void)devices;
    *out = NULL;
    return qd_seterr(err, QD_ERR_UNSUPPORTED,
                     "tensor parallelism over %d GPUs needs NCCL, and this build of qdelta has none (no nccl.h / "
                     "libnccl at build time): rebuild with NCCL, or run every rank on one GPU (tp_devices = 1)",
                     size);
}

#endif
