/* Projections whose input is made on the fly: y (+)= W . x where the bf16 rows x
 * come from an RMSNorm of the residual, the GDN gated norm, or the SwiGLU of a
 * gate|up product. At decode sizes the fused GEMV builds x itself (each block
 * recomputes it into shared memory from inputs that are a few KiB per row), so a
 * norm or activation costs no launch of its own; but it streams W more slowly than
 * the plain GEMV, the more so the more rows of x, so larger matrices and larger n
 * materialise x into a scratch and run the plain product. The choice is a table
 * on the shape measured on the H200 (gemv_fused.cu, fg_prefer_fused), the same for
 * every caller. */
#ifndef QD_CUDA_LINEAR_H
#define QD_CUDA_LINEAR_H

#include <stdint.h>

#include "backend/cuda/cuda_ops.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum qd_cuda_lin_kind {
    QD_LIN_BF16 = 0,    /* x given: bf16 rows at stride ldx */
    QD_LIN_RMSNORM = 1, /* x = bf16(h * rsqrt(mean(h^2) + eps) * (1 + w)), h fp32 rows of cols (contiguous);
                         * row i of x reads h row rows[i] (rows NULL: i) */
    QD_LIN_GATED = 2,   /* per head of dv: x = bf16(rmsnorm(o) * w * silu(z)), o bf16 [n][cols] contiguous,
                         * z fp32 rows at stride ldz, w [dv] (plain weight, eps inside the norm) */
    QD_LIN_SILU = 3,    /* x = bf16(silu(gu[c]) * gu[cols + c]), gu fp32 rows of 2 cols (gate | up) */
} qd_cuda_lin_kind;

typedef struct qd_cuda_lin_in {
    int kind;
    const uint16_t *x;
    int64_t ldx;          /* BF16 */
    const float *h;
    const int32_t *rows;  /* RMSNORM */
    const float *w;
    float eps;            /* RMSNORM, GATED */
    const uint16_t *o;
    const float *z;
    int64_t ldz;
    int dv;               /* GATED */
    const float *gu;      /* SILU */
} qd_cuda_lin_in;

/* One product of the call: W [rows][cols] bf16 into y, n rows at stride ldy (fp32).
 * qw set (a quantized device weight, cuda_quant.h): W is unused; up to QD_CUDA_QGEMV_MAX_N
 * rows of x the product is the quantized GEMV (one launch for all the call's products where
 * the tensor-core GEMV takes them, its blocks building x in shared memory where it fits,
 * else on x materialised into scratch); above that an FP8 weight of a layout the FP8 GEMM
 * takes (qd_cuda_fp8_gemm_mode) runs W8A8 on the FP8 tensor cores with x quantized into
 * fp8_act; other formats, and every format on the invariant path, are first dequantized
 * into `dequant` (bf16, rows x cols; the products of one call run in stream order, so they
 * may share it, and fp8_act likewise) and the bf16 path runs on them. */
typedef struct qd_cuda_lin_out {
    const uint16_t *W;
    int64_t rows;
    float *y;
    int64_t ldy;
    const struct qd_weight *qw;
    uint16_t *dequant;
    void *fp8_act;
    size_t fp8_act_bytes;
} qd_cuda_lin_out;

#define QD_LIN_MAX_OUT 4

/* y_j = W_j . x (accumulate 0) or y_j += W_j . x (accumulate 1) for the n_out <= 4
 * products sharing the input x of n rows of cols. scratch: bf16 [n][cols], used when
 * the table materialises x (NULL only for QD_LIN_BF16). A call the table gives to
 * the fused GEMV (n <= 8 and small enough matrices, see fg_prefer_fused) is one
 * launch for all n_out products, a programmatic dependent of the previous kernel
 * (cuda_pdl.cuh): its first weight loads overlap that kernel's tail. */
qd_status qd_cuda_linear(qd_cuda_blas *b, const qd_cuda_lin_in *in, int64_t cols, int n, const qd_cuda_lin_out *out,
                         int n_out, int accumulate, uint16_t *scratch, void *stream);

/* The two paths of the table, named so that the kernel benchmark can time both on
 * one shape and the tests can check both (bench/linear_cuda_bench.c, test_cuda_fused):
 *   FUSED: x built inside the fused GEMV (gemv_fused.cu), one launch for the n_out products;
 *   PLAIN: x materialised into scratch by the elementwise kernels (not for QD_LIN_BF16),
 *          then the plain GEMV of gemm.cu per product (n <= 8) or cuBLAS.
 * qd_cuda_linear_choice is the table's pick for a call (what qd_cuda_linear runs);
 * qd_cuda_linear_path runs the given path (QD_LIN_PATH_TABLE: the table's pick), and
 * fails with QD_ERR_UNSUPPORTED when FUSED is asked for a shape the fused kernel
 * does not take (n > 8, cols % 8, misaligned operands, x over its shared memory).
 *
 * INVARIANT is never the table's pick; the batch-invariant mode (qd_cuda_ctx.invariant)
 * asks for it by name. x is materialised into scratch as on the plain path (the
 * elementwise kernels reduce each row on its own, the same way whatever n is; not
 * for QD_LIN_BF16), then qd_cuda_matmul_invariant (gemm_invariant.cu) runs each of
 * the n_out products: a row's results are the same bits whatever n is and wherever
 * the row sits in the batch. Needs cols % 8 == 0 and 16-byte aligned W and x (bf16 x:
 * ldx % 8 == 0), else QD_ERR_UNSUPPORTED / QD_ERR_INVALID_ARG; on the stream given
 * (the plain path's cuBLAS runs on the handle's stream). */
typedef enum qd_cuda_lin_path {
    QD_LIN_PATH_TABLE = 0,
    QD_LIN_PATH_FUSED = 1,
    QD_LIN_PATH_PLAIN = 2,
    QD_LIN_PATH_INVARIANT = 3,
} qd_cuda_lin_path;

int qd_cuda_linear_choice(const qd_cuda_lin_in *in, int64_t cols, int n, const qd_cuda_lin_out *out, int n_out);
qd_status qd_cuda_linear_path(int path, qd_cuda_blas *b, const qd_cuda_lin_in *in, int64_t cols, int n,
                              const qd_cuda_lin_out *out, int n_out, int accumulate, uint16_t *scratch,
                              void *stream);

#ifdef __cplusplus
}
#endif

#endif
