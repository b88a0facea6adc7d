/* Matmuls through cuBLAS: bf16 weights and activations on the tensor cores with
 * fp32 accumulation. Weights are nn.Linear [out][in] row-major, which cuBLAS (column
 * major) sees as an [in][out] matrix: y^T = W x^T is GEMM(op(A) = T, op(B) = N). */
#include <cublas_v2.h>
#include <stdio.h>
#include <stdlib.h>

#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/cuda_util.h"

struct qd_cuda_blas {
    cublasHandle_t h;
    void *workspace;
};

/* cuBLAS advises a user workspace for graph capture; 32 MiB covers Hopper's kernels. */
#define QD_BLAS_WORKSPACE (32u << 20)

static qd_status blas_status(cublasStatus_t s, const char *what) {
    if (s == CUBLAS_STATUS_SUCCESS) return QD_OK;
    char msg[160];
    snprintf(msg, sizeof msg, "%s: %s", what, cublasGetStatusString(s));
    return qd_cuda_fail(QD_ERR_BACKEND, msg);
}

extern "C" qd_status qd_cuda_blas_create(qd_cuda_blas **out, void *stream) {
    *out = NULL;
    qd_cuda_blas *b = (qd_cuda_blas *)calloc(1, sizeof *b);
    if (!b) return qd_cuda_fail(QD_ERR_OOM, "cublas: host allocation");
    qd_status s = blas_status(cublasCreate(&b->h), "cublasCreate");
    if (!s) s = blas_status(cublasSetStream(b->h, (cudaStream_t)stream), "cublasSetStream");
    if (!s) s = qd_cuda_malloc(&b->workspace, QD_BLAS_WORKSPACE);
    if (!s) s = blas_status(cublasSetWorkspace(b->h, b->workspace, QD_BLAS_WORKSPACE), "cublasSetWorkspace");
    if (s) {
        qd_cuda_blas_destroy(b);
        return s;
    }
    *out = b;
    return QD_OK;
}

extern "C" void qd_cuda_blas_destroy(qd_cuda_blas *b) {
    if (!b) return;
    if (b->h) cublasDestroy(b->h);
    qd_cuda_free(b->workspace);
    free(b);
}

extern "C" void *qd_cuda_blas_handle(qd_cuda_blas *b) { return b ? (void *)b->h : NULL; }

extern "C" qd_status qd_cuda_matmul(qd_cuda_blas *b, const uint16_t *d_W, int64_t rows, int64_t cols,
                                    const uint16_t *d_x, int64_t ldx, int n, void *d_y, int64_t ldy, int y_bf16) {
    if (n <= 0 || rows <= 0) return QD_OK;
    if (rows > INT32_MAX || cols > INT32_MAX || ldx > INT32_MAX || ldy > INT32_MAX)
        return qd_cuda_fail(QD_ERR_UNSUPPORTED, "matmul: dimension beyond 2^31");
    const float one = 1.f, zero = 0.f;
    return blas_status(cublasGemmEx(b->h, CUBLAS_OP_T, CUBLAS_OP_N, (int)rows, n, (int)cols, &one, d_W, CUDA_R_16BF,
                                    (int)cols, d_x, CUDA_R_16BF, (int)ldx, &zero, d_y,
                                    y_bf16 ? CUDA_R_16BF : CUDA_R_32F, (int)ldy, CUBLAS_COMPUTE_32F,
                                    CUBLAS_GEMM_DEFAULT),
                       "cublasGemmEx");
}
