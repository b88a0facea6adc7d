/* Internal helpers shared by the CUDA sources: error translation from
 * cudaError_t to qd_status (with the message kept for qd_cuda_last_error). */
#ifndef QD_CUDA_UTIL_H
#define QD_CUDA_UTIL_H

#include <cuda_runtime.h>

#include "backend/cuda/cuda_gdn.h"
#include "backend/cuda/cuda_device.h"

/* Records "what: CUDA error text" and returns QD_ERR_BACKEND; QD_OK for cudaSuccess. */
qd_status qd_cuda_status(cudaError_t e, const char *what);
/* Records a message for a non-CUDA failure (bad argument) and returns s. */
qd_status qd_cuda_fail(qd_status s, const char *msg);

/* Evaluates a CUDA call and returns from the enclosing function on failure. */
#define QD_CUDA_TRY(call)                                                   \
    do {                                                                    \
        cudaError_t qd_e_ = (call);                                         \
        if (qd_e_ != cudaSuccess) return qd_cuda_status(qd_e_, #call);      \
    } while (0)

/* Multiprocessors of the current device (asked once; 132, the H200's, if the question
 * fails): for the kernels that size their grids to fill the GPU. */
int qd_cuda_sm_count(void);

/* After a launch: a launch-configuration error shows up in cudaGetLastError. */
#define QD_CUDA_CHECK_LAUNCH(name) QD_CUDA_TRY(cudaGetLastError())

#endif
