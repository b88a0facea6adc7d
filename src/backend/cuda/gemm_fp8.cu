/* W8A8 products of FP8 weights on the Hopper FP8 tensor cores, through cuBLASLt's
 * block-scaled FP8 GEMM (the scheme DeepGEMM uses): the activations are quantized per
 * token to e4m3 with a dynamic scale per 1 x 128 block of columns (per token and whole row
 * for a per-channel weight), and the GEMM applies the weight's 128 x 128 block scales (or
 * its per-channel ones) and the activation scales to each block's fp32 partial sums.
 *
 * In cuBLAS's column-major terms, with the weight W [rows][cols] row-major seen as a
 * [cols][rows] matrix: D [rows][n] (y rows at stride ldy) = op(A) B with A = W (op T),
 * B = the quantized x ([cols][n], ld cols), M = rows, N = n, K = cols.
 * Scale layouts cuBLASLt reads (cuBLAS docs, "128-element 1D and 128x128 2D block scaling"):
 *   A, BLK128x128_32F: K-major [ceil(M / 128)][L4] with L = ceil(K / 128) rounded up to a
 *     multiple of 4 (L4): the weight's scales [ceil(rows / 128)][L] are used as they are
 *     when L % 4 == 0 (and 16-byte aligned), else repacked into the scratch per call;
 *   B, VEC128_32F: N-major [L][N]: scale of token t, column block kb at kb * N + t;
 *   OUTER_VEC_32F: a vector of M (A: the weight's per-channel scales) or N (B) floats.
 * M and N must be multiples of 4: the GEMM takes the first n & ~3 tokens and the last
 * n % 4 go through the W8A16 GEMV (qd_cuda_qgemv) on the same weight. D must be 16-byte
 * aligned: a y that is not is written through a staging buffer in the scratch. */
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/cuda_quant.h"
#include "backend/cuda/cuda_util.h"
#include "base/err.h"

#define FP8_MAX 448.0f
#define BLK 128

static int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }
static size_t up256(size_t x) { return (x + 255) & ~(size_t)255; }

/* ------------------------------------------------------------ which weights */

static int mode_of(const qd_weight *w) {
    if (w->dtype != QD_DTYPE_F8_E4M3 || w->scales.dtype != QD_DTYPE_F32 || !w->data || !w->scales.data) return 0;
    if (w->rows % 4 || w->cols % 16 || w->rows > INT32_MAX || w->cols > INT32_MAX) return 0;
    if (((uintptr_t)w->data & 15) != 0) return 0;
    if (w->scales.block_rows == BLK && w->scales.block_cols == BLK) return QD_FP8_GEMM_BLOCK;
    if (w->scales.block_rows == 1 && w->scales.block_cols == w->cols && ((uintptr_t)w->scales.data & 15) == 0)
        return QD_FP8_GEMM_CHANNEL;
    return 0;
}

extern "C" int qd_cuda_fp8_gemm_mode(const qd_weight *dw) { return mode_of(dw); }

/* cuBLASLt's block-scaled FP8 GEMM needs D 16-byte aligned (address and row stride); a
 * stacked projection's part can start at any column of y (odd head sizes), so such a y is
 * written through a staging buffer of at most this many bytes, some tokens at a time. */
#define STAGE_BYTES ((int64_t)8 << 20)

/* Tokens per staged pass for an output of `rows` (a multiple of 4). */
static int64_t stage_tokens(int64_t n4, int64_t rows) {
    int64_t c = (STAGE_BYTES / (rows * 4)) & ~(int64_t)3;
    if (c < 4) c = 4;
    return c < n4 ? c : n4;
}

/* Scratch layout: q [n4][cols] e4m3 | x scales (block: [L][n4], channel: [n4]) | the
 * weight's block scales repacked to [ceil(rows / 128)][L4] | the staged output
 * [stage_tokens][rows] fp32. */
extern "C" size_t qd_cuda_fp8_act_bytes(int64_t n, int64_t rows, int64_t cols) {
    if (n <= 0 || rows <= 0 || cols <= 0) return 0;
    const int64_t n4 = (n + 3) & ~(int64_t)3, L = cdiv(cols, BLK), L4 = (L + 3) & ~(int64_t)3;
    const int64_t r4 = (rows + 3) & ~(int64_t)3;
    return up256((size_t)(n4 * cols)) + up256((size_t)(L * n4) * 4) + up256((size_t)(cdiv(rows, BLK) * L4) * 4) +
           up256((size_t)(stage_tokens(n4, r4) * r4) * 4);
}

/* ------------------------------------------------------------ kernels */

/* One warp per (token, 128-column block): amax of the block's bf16 values, scale
 * s = amax / 448 (1 for an all-zero block), q = e4m3(x / s) rounded to nearest even,
 * saturating. Every step is a correctly rounded fp32 operation, so the CPU reference
 * (test_cuda_quant) reproduces the bytes exactly. */
__global__ void quant_blocks_kernel(const uint16_t *__restrict__ x, int64_t ldx, int n, int cols, int n4,
                                    uint8_t *__restrict__ q, float *__restrict__ sc) {
    const int lane = threadIdx.x % 32;
    const int64_t w = (int64_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    const int L = (cols + BLK - 1) / BLK;
    if (w >= (int64_t)n * L) return;
    const int t = (int)(w / L), kb = (int)(w % L);
    const uint16_t *xr = x + (int64_t)t * ldx + (int64_t)kb * BLK;
    const int c0 = kb * BLK + lane * 4;
    float v[4];
#pragma unroll
    for (int i = 0; i < 4; i++) v[i] = c0 + i < cols ? __uint_as_float((uint32_t)xr[lane * 4 + i] << 16) : 0.f;
    float a = fmaxf(fmaxf(fabsf(v[0]), fabsf(v[1])), fmaxf(fabsf(v[2]), fabsf(v[3])));
    for (int o = 16; o > 0; o >>= 1) a = fmaxf(a, __shfl_xor_sync(0xffffffffu, a, o));
    const float s = a > 0.f ? __fdiv_rn(a, FP8_MAX) : 1.f;
    uint8_t *qr = q + (int64_t)t * cols + (int64_t)kb * BLK;
#pragma unroll
    for (int i = 0; i < 4; i++)
        if (c0 + i < cols)
            qr[lane * 4 + i] = (uint8_t)__nv_cvt_float_to_fp8(__fdiv_rn(v[i], s), __NV_SATFINITE, __NV_E4M3);
    if (lane == 0) sc[(int64_t)kb * n4 + t] = s;
}

/* Per-channel weights: one scale per token over its whole row (a block per token). */
__global__ void quant_rows_kernel(const uint16_t *__restrict__ x, int64_t ldx, int cols, uint8_t *__restrict__ q,
                                  float *__restrict__ sc) {
    const int t = blockIdx.x;
    const uint16_t *xr = x + (int64_t)t * ldx;
    float a = 0.f;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) a = fmaxf(a, fabsf(__uint_as_float((uint32_t)xr[c] << 16)));
    __shared__ float part[32];
    for (int o = 16; o > 0; o >>= 1) a = fmaxf(a, __shfl_xor_sync(0xffffffffu, a, o));
    if (threadIdx.x % 32 == 0) part[threadIdx.x / 32] = a;
    __syncthreads();
    if (threadIdx.x < 32) {
        a = threadIdx.x < blockDim.x / 32 ? part[threadIdx.x] : 0.f;
        for (int o = 16; o > 0; o >>= 1) a = fmaxf(a, __shfl_xor_sync(0xffffffffu, a, o));
        if (threadIdx.x == 0) part[0] = a;
    }
    __syncthreads();
    const float s = part[0] > 0.f ? __fdiv_rn(part[0], FP8_MAX) : 1.f;
    uint8_t *qr = q + (int64_t)t * cols;
    for (int c = threadIdx.x; c < cols; c += blockDim.x)
        qr[c] = (uint8_t)__nv_cvt_float_to_fp8(__fdiv_rn(__uint_as_float((uint32_t)xr[c] << 16), s), __NV_SATFINITE,
                                               __NV_E4M3);
    if (threadIdx.x == 0) sc[t] = s;
}

/* y[t][r] = (acc ? y[t][r] : 0) + stage[t][r] for t < n, r < rows. */
__global__ void unstage_kernel(const float *__restrict__ stage, int64_t rows, int n, float *__restrict__ y,
                               int64_t ldy, int acc) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= rows * n) return;
    const int64_t t = i / rows, r = i % rows;
    float *d = y + t * ldy + r;
    *d = acc ? *d + stage[i] : stage[i];
}

/* [rb][L] -> [rb][L4], the padding zero. */
__global__ void repack_scales_kernel(const float *__restrict__ s, int64_t rb, int L, int L4, float *__restrict__ out) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= rb * L4) return;
    const int64_t r = i / L4, c = i % L4;
    out[i] = c < L ? s[r * L + c] : 0.f;
}

extern "C" qd_status qd_cuda_fp8_quant_act(const uint16_t *d_x, int64_t ldx, int n, int64_t cols, int mode, int n4,
                                           uint8_t *d_q, float *d_scales, void *stream) {
    if (n <= 0) return QD_OK;
    if (cols <= 0 || cols > INT32_MAX || n4 < n) return qd_cuda_fail(QD_ERR_INVALID_ARG, "fp8 activations: bad shape");
    cudaStream_t st = (cudaStream_t)stream;
    if (mode == QD_FP8_GEMM_BLOCK) {
        const int64_t warps = (int64_t)n * cdiv(cols, BLK);
        quant_blocks_kernel<<<(unsigned)cdiv(warps, 8), 256, 0, st>>>(d_x, ldx, n, (int)cols, n4, d_q, d_scales);
    } else if (mode == QD_FP8_GEMM_CHANNEL) {
        quant_rows_kernel<<<(unsigned)n, 256, 0, st>>>(d_x, ldx, (int)cols, d_q, d_scales);
    } else {
        return qd_cuda_fail(QD_ERR_INVALID_ARG, "fp8 activations: unknown scale mode");
    }
    QD_CUDA_CHECK_LAUNCH("fp8 activations");
    return QD_OK;
}

/* ------------------------------------------------------------ cuBLASLt plans */

/* The heuristic's pick per shape, asked once (it costs tens of microseconds of host time). */
typedef struct fp8_plan {
    int64_t m, n, k, ldy;
    int mode, acc;
    uint32_t d_align;  /* the output's alignment the algorithm was chosen for */
    cublasLtMatmulAlgo_t algo;
} fp8_plan;

/* The largest power of two (<= 256) dividing the address and the row stride's bytes: the
 * heuristic assumes 256-byte aligned operands unless told, and a stacked projection writes
 * its part at a column offset of y. */
static uint32_t align_of(const void *p, int64_t ld_bytes) {
    uint32_t a = 256;
    while (a > 4 && (((uintptr_t)p | (uintptr_t)ld_bytes) & (a - 1))) a >>= 1;
    return a;
}

#define FP8_PLANS 64
struct qd_cuda_fp8_plans {
    fp8_plan p[FP8_PLANS];
    int count, next;
};

extern "C" void qd_cuda_fp8_plans_free(struct qd_cuda_fp8_plans *p) { free(p); }

static qd_status lt_status(cublasStatus_t s, const char *what) {
    if (s == CUBLAS_STATUS_SUCCESS) return QD_OK;
    char msg[192];
    snprintf(msg, sizeof msg, "fp8 GEMM: %s: %s", what, cublasGetStatusString(s));
    return qd_cuda_fail(QD_ERR_BACKEND, msg);
}

#define LT_TRY(call, what)                             \
    do {                                               \
        qd_status s_ = lt_status((call), what);        \
        if (s_ != QD_OK) goto done;                    \
    } while (0)

/* The descriptors of one product D [M][N] (ld ldd, fp32) = s_A s_B A^T B over K, A and B
 * e4m3 (A column-major K x M, B K x N), with the scale modes and pointers given. */
typedef struct lt_op {
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t a, b, d;
} lt_op;

static void lt_op_destroy(lt_op *o) {
    if (o->d) cublasLtMatrixLayoutDestroy(o->d);
    if (o->b) cublasLtMatrixLayoutDestroy(o->b);
    if (o->a) cublasLtMatrixLayoutDestroy(o->a);
    if (o->desc) cublasLtMatmulDescDestroy(o->desc);
}

static qd_status lt_op_create(lt_op *o, int64_t M, int64_t N, int64_t K, int64_t ldd, cublasLtMatmulMatrixScale_t ma,
                              cublasLtMatmulMatrixScale_t mb, const float *sa, const float *sb) {
    *o = (lt_op){};
    qd_status s = QD_ERR_BACKEND;
    const cublasOperation_t opT = CUBLAS_OP_T, opN = CUBLAS_OP_N;
    LT_TRY(cublasLtMatmulDescCreate(&o->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), "descriptor");
    LT_TRY(cublasLtMatmulDescSetAttribute(o->desc, CUBLASLT_MATMUL_DESC_TRANSA, &opT, sizeof opT), "transa");
    LT_TRY(cublasLtMatmulDescSetAttribute(o->desc, CUBLASLT_MATMUL_DESC_TRANSB, &opN, sizeof opN), "transb");
    LT_TRY(cublasLtMatmulDescSetAttribute(o->desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &ma, sizeof ma), "A scale mode");
    LT_TRY(cublasLtMatmulDescSetAttribute(o->desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &mb, sizeof mb), "B scale mode");
    LT_TRY(cublasLtMatmulDescSetAttribute(o->desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &sa, sizeof sa), "A scales");
    LT_TRY(cublasLtMatmulDescSetAttribute(o->desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &sb, sizeof sb), "B scales");
    LT_TRY(cublasLtMatrixLayoutCreate(&o->a, CUDA_R_8F_E4M3, (uint64_t)K, (uint64_t)M, K), "A layout");
    LT_TRY(cublasLtMatrixLayoutCreate(&o->b, CUDA_R_8F_E4M3, (uint64_t)K, (uint64_t)N, K), "B layout");
    LT_TRY(cublasLtMatrixLayoutCreate(&o->d, CUDA_R_32F, (uint64_t)M, (uint64_t)N, ldd), "D layout");
    s = QD_OK;
done:
    if (s != QD_OK) lt_op_destroy(o);
    return s;
}

/* The heuristic's first algorithm for op with the handle's workspace, for C and D aligned
 * to d_align bytes. */
static qd_status lt_algo(cublasLtHandle_t lt, const lt_op *o, size_t ws_bytes, uint32_t d_align, int64_t M, int64_t N,
                         int64_t K, cublasLtMatmulAlgo_t *algo) {
    cublasLtMatmulPreference_t pref = NULL;
    cublasLtMatmulHeuristicResult_t h;
    int found = 0;
    qd_status s = QD_ERR_BACKEND;
    LT_TRY(cublasLtMatmulPreferenceCreate(&pref), "preference");
    LT_TRY(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes,
                                                sizeof ws_bytes),
           "workspace preference");
    LT_TRY(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &d_align,
                                                sizeof d_align),
           "C alignment preference");
    LT_TRY(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &d_align,
                                                sizeof d_align),
           "D alignment preference");
    LT_TRY(cublasLtMatmulAlgoGetHeuristic(lt, o->desc, o->a, o->b, o->d, o->d, pref, 1, &h, &found), "heuristic");
    if (found < 1) {
        char msg[160];
        snprintf(msg, sizeof msg, "fp8 GEMM: cuBLASLt has no algorithm for %lld x %lld x %lld", (long long)M,
                 (long long)N, (long long)K);
        s = qd_cuda_fail(QD_ERR_UNSUPPORTED, msg);
        goto done;
    }
    *algo = h.algo;
    s = QD_OK;
done:
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    return s;
}

/* One block-scaled (or per-channel) product, D = s_a s_b (A^T B) (+ D when acc), with the
 * heuristic's pick cached per shape. */
static qd_status lt_matmul(qd_cuda_blas *b, int mode, int64_t M, int64_t N, int64_t K, const void *A,
                           const float *sa, const void *B, const float *sb, float *D, int64_t ldd, int acc,
                           cudaStream_t st) {
    cublasLtHandle_t lt = (cublasLtHandle_t)qd_cuda_blas_handle(b);
    size_t ws_bytes = 0;
    void *ws = qd_cuda_blas_workspace(b, &ws_bytes);
    struct qd_cuda_fp8_plans **slot = qd_cuda_blas_fp8_plans(b);
    if (!*slot && !(*slot = (struct qd_cuda_fp8_plans *)calloc(1, sizeof **slot)))
        return qd_cuda_fail(QD_ERR_OOM, "fp8 GEMM: host allocation");
    struct qd_cuda_fp8_plans *plans = *slot;
    const cublasLtMatmulMatrixScale_t ma = mode == QD_FP8_GEMM_BLOCK ? CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F
                                                                     : CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F;
    const cublasLtMatmulMatrixScale_t mb = mode == QD_FP8_GEMM_BLOCK ? CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F
                                                                     : CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F;
    const float one = 1.f, beta = acc ? 1.f : 0.f;
    const uint32_t d_align = align_of(D, ldd * 4);
    lt_op o;
    QD_TRY(lt_op_create(&o, M, N, K, ldd, ma, mb, sa, sb));
    const fp8_plan *plan = NULL;
    for (int i = 0; i < plans->count && !plan; i++) {
        const fp8_plan *p = &plans->p[i];
        if (p->m == M && p->n == N && p->k == K && p->ldy == ldd && p->mode == mode && p->acc == acc &&
            p->d_align == d_align)
            plan = p;
    }
    qd_status s = QD_OK;
    if (!plan) {
        cublasLtMatmulAlgo_t algo;
        s = lt_algo(lt, &o, ws_bytes, d_align, M, N, K, &algo);
        if (s == QD_OK) {
            fp8_plan *p = &plans->p[plans->count < FP8_PLANS ? plans->count++ : plans->next++ % FP8_PLANS];
            *p = (fp8_plan){.m = M, .n = N, .k = K, .ldy = ldd, .mode = mode, .acc = acc, .d_align = d_align,
                            .algo = algo};
            plan = p;
        }
    }
    if (s == QD_OK)
        s = lt_status(cublasLtMatmul(lt, o.desc, &one, A, o.a, B, o.b, &beta, D, o.d, D, o.d, &plan->algo, ws,
                                     ws_bytes, st),
                      "matmul");
    lt_op_destroy(&o);
    return s;
}

/* ------------------------------------------------------------ the product */

extern "C" qd_status qd_cuda_fp8_gemm(qd_cuda_blas *b, const qd_weight *dw, const uint16_t *d_x, int64_t ldx, int n,
                                      float *d_y, int64_t ldy, int accumulate, void *d_scratch, size_t scratch_bytes,
                                      void *stream) {
    if (n <= 0) return QD_OK;
    const int mode = mode_of(dw);
    if (!mode) return qd_cuda_fail(QD_ERR_UNSUPPORTED, "fp8 GEMM: the weight's layout is not one the FP8 GEMM takes");
    if (!b || !d_x || !d_y || !d_scratch) return qd_cuda_fail(QD_ERR_INVALID_ARG, "fp8 GEMM: missing operand");
    if (scratch_bytes < qd_cuda_fp8_act_bytes(n, dw->rows, dw->cols))
        return qd_cuda_fail(QD_ERR_INVALID_ARG, "fp8 GEMM: scratch too small");
    if (((uintptr_t)d_scratch & 255) != 0) return qd_cuda_fail(QD_ERR_INVALID_ARG, "fp8 GEMM: scratch not aligned");
    const int64_t M = dw->rows, K = dw->cols, n4 = n & ~3, L = cdiv(K, BLK), L4 = (L + 3) & ~(int64_t)3;
    cudaStream_t st = (cudaStream_t)stream;
    if (n4 > 0) {
        uint8_t *q = (uint8_t *)d_scratch;
        float *sx = (float *)(q + up256((size_t)(((n + 3) & ~3) * K)));
        float *sw_pack = (float *)((uint8_t *)sx + up256((size_t)(L * ((n + 3) & ~3)) * 4));
        float *stage = (float *)((uint8_t *)sw_pack + up256((size_t)(cdiv(M, BLK) * L4) * 4));
        const float *sw = (const float *)dw->scales.data;
        if (mode == QD_FP8_GEMM_BLOCK && (L % 4 || ((uintptr_t)sw & 15))) {
            const int64_t cnt = cdiv(M, BLK) * L4;
            repack_scales_kernel<<<(unsigned)cdiv(cnt, 256), 256, 0, st>>>(sw, cdiv(M, BLK), (int)L, (int)L4, sw_pack);
            QD_CUDA_CHECK_LAUNCH("fp8 scale repack");
            sw = sw_pack;
        }
        if (align_of(d_y, ldy * 4) >= 16) {
            QD_TRY(qd_cuda_fp8_quant_act(d_x, ldx, (int)n4, K, mode, (int)n4, q, sx, stream));
            QD_TRY(lt_matmul(b, mode, M, n4, K, dw->data, sw, q, sx, d_y, ldy, accumulate, st));
        } else { /* staged: each pass quantizes its tokens, multiplies into the stage, adds to y */
            const int64_t c = stage_tokens(n4, M);
            for (int64_t t0 = 0; t0 < n4; t0 += c) {
                const int64_t cn = n4 - t0 < c ? n4 - t0 : c;
                QD_TRY(qd_cuda_fp8_quant_act(d_x + t0 * ldx, ldx, (int)cn, K, mode, (int)cn, q, sx, stream));
                QD_TRY(lt_matmul(b, mode, M, cn, K, dw->data, sw, q, sx, stage, M, 0, st));
                unstage_kernel<<<(unsigned)cdiv(M * cn, 256), 256, 0, st>>>(stage, M, (int)cn, d_y + t0 * ldy, ldy,
                                                                            accumulate);
                QD_CUDA_CHECK_LAUNCH("fp8 unstage");
            }
        }
    }
    if (n4 < n) /* the last n % 4 tokens: the W8A16 GEMV on the same weight */
        return qd_cuda_qgemv(dw, d_x + n4 * ldx, ldx, (int)(n - n4), d_y + n4 * ldy, ldy, accumulate, stream);
    return QD_OK;
}

/* The same GEMM on e4m3 operands with one scale per tensor (cuBLASLt's per-tensor FP8
 * GEMM): the benchmark's peer for the block-scaled one, same shapes, same run. */
extern "C" qd_status qd_cuda_fp8_gemm_tensor(qd_cuda_blas *b, const uint8_t *d_w, int64_t rows, int64_t cols,
                                             const float *d_sw, const uint8_t *d_xq, int n, const float *d_sx,
                                             float *d_y, int64_t ldy, void *stream) {
    cublasLtHandle_t lt = (cublasLtHandle_t)qd_cuda_blas_handle(b);
    size_t ws_bytes = 0;
    void *ws = qd_cuda_blas_workspace(b, &ws_bytes);
    const float one = 1.f, zero = 0.f;
    lt_op o;
    QD_TRY(lt_op_create(&o, rows, n, cols, ldy, CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F,
                        CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F, d_sw, d_sx));
    cublasLtMatmulAlgo_t algo;
    qd_status s = lt_algo(lt, &o, ws_bytes, align_of(d_y, ldy * 4), rows, n, cols, &algo);
    if (s == QD_OK)
        s = lt_status(cublasLtMatmul(lt, o.desc, &one, d_w, o.a, d_xq, o.b, &zero, d_y, o.d, d_y, o.d, &algo, ws,
                                     ws_bytes, (cudaStream_t)stream),
                      "matmul");
    lt_op_destroy(&o);
    return s;
}
