/* Products with quantized weights on the device (gemv_quant.cu, the MoE kernels).
 *
 * A dense weight is a qd_weight (base/weight.h) in its canonical layout whose pointers
 * (data, scales.data, scales.zeros, scales.g_idx) are device addresses: the same
 * description the CPU reference dequantizes, so one struct names a weight on either side.
 * The upload (cuda_model.c) widens BF16 / F16 scales to F32 (exact), so on the device
 * F8_E4M3 and INT4 scales are F32 and NVFP4 scales e4m3.
 *
 * A MoE layer's experts are a qd_cuda_qmats: n_mats matrices of one layout stored back
 * to back (gate_up: matrix 2e is expert e's gate_proj, 2e + 1 its up_proj; down: matrix
 * e), each with its own scales, so the decode kernels find expert e's bytes by a stride
 * whatever its block shape. */
#ifndef QD_CUDA_QUANT_H
#define QD_CUDA_QUANT_H

#include <stdint.h>

#include "backend/cuda/cuda_linear.h"
#include "backend/cuda/cuda_ops.h"
#include "base/weight.h"
#include "qdelta.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A dummy weight drawn in place in its quantized layout (dummy_fill.cu): the bf16 values of
 * w's dummy_seed / dummy_scale (base/dummy_values.h) quantized as the host's conversion does
 * (model_quant_online.c), the same bytes: F8_E4M3 in 128 x 128 blocks or symmetric INT4 in
 * groups along a row (d_scales F32), NVFP4 in blocks of 16 (d_scales e4m3 [rows][cols / 16];
 * the matrix's global factor, from its amax, written to the device float d_global, which
 * the other formats leave alone and may be NULL). */
qd_status qd_cuda_fill_dummy_quant(const qd_weight *w, uint8_t *d_data, void *d_scales, float *d_global,
                                   void *stream);

#define QD_CUDA_QGEMV_MAX_N 16

typedef struct qd_cuda_qmats {
    int dtype;               /* QD_DTYPE_F8_E4M3, QD_DTYPE_NVFP4 or QD_DTYPE_INT4 */
    int n_mats;
    int64_t rows, cols;      /* of one matrix */
    const uint8_t *data;     /* [n_mats][rows][row_bytes]: e4m3 bytes, or two 4-bit codes per byte */
    int64_t row_bytes;       /* cols (F8_E4M3), cols / 2 (4-bit) */
    const void *scales;      /* [n_mats][scale_rows][nbc]: F32 (F8_E4M3, INT4) or e4m3 (NVFP4) */
    int64_t block_rows, block_cols, nbc, scale_rows;
    int row_shift;           /* block_rows as a shift where it is a power of two, else -1 */
    int col_shift;           /* block_cols as a shift; 31 where one block spans a row; else -1 */
    const uint8_t *zeros;    /* INT4 zero points shaped as the scales, or NULL (z = 8) */
    const float *globals;    /* NVFP4: [n_mats] the per-matrix factor; NULL: global for every matrix */
    float global;
} qd_cuda_qmats;

/* log2(v) where v is a power of two, else -1 */
static inline int qd_cuda_shift_of(int64_t v) {
    for (int s = 0; s < 62; s++)
        if (((int64_t)1 << s) == v) return s;
    return -1;
}

/* Sets m's scale grid (nbc, scale_rows) and the shifts the kernels find a row's and a
 * column's scale block by, from rows, cols, block_rows and block_cols: worked out once
 * where a view is made rather than in every block (a 64-bit division or a bit scan a
 * row on a decode kernel's chain). Every view is made through it. */
static inline void qd_cuda_qmats_layout(qd_cuda_qmats *m) {
    m->nbc = (m->cols + m->block_cols - 1) / m->block_cols;
    m->scale_rows = (m->rows + m->block_rows - 1) / m->block_rows;
    m->row_shift = qd_cuda_shift_of(m->block_rows);
    m->col_shift = m->block_cols >= m->cols ? 31 : qd_cuda_shift_of(m->block_cols);
}

/* Whether m's derived fields are what qd_cuda_qmats_layout sets: a launcher's check that
 * a view was made through it. */
static inline int qd_cuda_qmats_laid_out(const qd_cuda_qmats *m) {
    qd_cuda_qmats l = *m;
    if (m->block_rows < 1 || m->block_cols < 1) return 0;
    qd_cuda_qmats_layout(&l);
    return l.nbc == m->nbc && l.scale_rows == m->scale_rows && l.row_shift == m->row_shift &&
           l.col_shift == m->col_shift;
}

/* A plain bf16 weight [rows][cols] as one unscaled matrix (dtype QD_DTYPE_BF16): the
 * unquantized parts of a stack beside its quantized ones in the tensor-core GEMVs. */
static inline qd_cuda_qmats qd_cuda_qmats_bf16(const uint16_t *W, int64_t rows, int64_t cols) {
    qd_cuda_qmats m = {.dtype = QD_DTYPE_BF16, .n_mats = 1, .rows = rows, .cols = cols,
                       .data = (const uint8_t *)W, .row_bytes = cols * 2, .scales = NULL,
                       .block_rows = 1, .block_cols = cols, .nbc = 0, .scale_rows = 0, .row_shift = 0,
                       .col_shift = 0, .zeros = NULL, .globals = NULL, .global = 1.0f}; /* the grid: below */
    qd_cuda_qmats_layout(&m);
    return m;
}

/* Whether m's addresses allow the vectorised kernels' accesses: codes read in 16-byte pieces
 * from a 16-byte aligned base (rows a multiple of 16 bytes), scales, zero points and the
 * per-matrix factors in 4-byte words. A view offset inside a buffer can break this, and a
 * misaligned access faults the whole context, so launchers check before they launch. */
static inline int qd_cuda_qmats_aligned(const qd_cuda_qmats *m) {
    return !((uintptr_t)m->data & 15) && m->row_bytes % 16 == 0 && !((uintptr_t)m->scales & 3) &&
           !((uintptr_t)m->zeros & 3) && !((uintptr_t)m->globals & 3);
}

/* Whether the vectorised kernels take matrices of this layout (one 16-byte piece of a row
 * lies in one scale block): F8_E4M3 with F32 scales, cols % 16 == 0 and block_cols % 16 == 0;
 * INT4 with F32 scales, cols % 32 == 0, group size % 32 == 0, no g_idx; NVFP4 with cols % 32 == 0.
 * Layouts outside it still multiply (qd_cuda_qgemv's element loop) but a MoE layer's experts
 * in such a layout are uploaded as bf16 (cuda_model.c says so in its log). */
int qd_cuda_qlayout_vectorised(const qd_weight *w);
/* The one-matrix view of a dense device weight (n_mats 1); 0 when the layout is not
 * vectorised (then *m is untouched). */
int qd_cuda_qmats_of(const qd_weight *dw, qd_cuda_qmats *m);

/* y[t][r] (+)= sum_c W[r][c] x[t][c] for t < n <= QD_CUDA_QGEMV_MAX_N, W quantized (any
 * layout of base/weight.h: F8_E4M3 with F32 / BF16 / F16 scales of any block shape; NVFP4;
 * INT4 with group scales, U8 zeros or none, g_idx act-order groups or contiguous ones).
 * x bf16 rows at stride ldx, y fp32 rows at stride ldy; fp32 accumulation. Vectorised
 * layouts read the weight in 16-byte pieces, each dequantized in registers (FP8 and INT4
 * with 64- / 128-column scale units: to exact bf16 for the tensor cores) and its block
 * scale applied to the partial sums; others (act order, odd shapes) take an element
 * loop that reads the group of each column from g_idx (exact, slower). A row's sums are
 * taken in the same order whatever n is (the kernels below: qd_cuda_qgemv_path). Errors (status and message): an unsupported
 * format or scale dtype, n out of range, missing data. */
qd_status qd_cuda_qgemv(const qd_weight *dw, const uint16_t *d_x, int64_t ldx, int n, float *d_y, int64_t ldy,
                        int accumulate, void *stream);

/* The kernels behind qd_cuda_qgemv, named so that the benchmark can time each on one shape
 * and the tests can check each (bench/quant_cuda_bench.c, test_cuda_quant):
 *   ELEM: the element loop, every layout;
 *   VEC:  one warp per row over 16-byte pieces (qd_cuda_qlayout_vectorised layouts, 16-byte
 *         aligned weight and x, ldx % 8 == 0);
 *   MMA:  the tensor-core GEMV (gemv_quant_mma.cu): FP8 and INT4 vectorised layouts whose
 *         scales are uniform over units of 64 (FP8) / 128 (INT4) columns (block / group
 *         columns a multiple of it, or one block per row), same alignment;
 *   WGMMA: the FP8 GEMV on the FP8 tensor cores (gemv_quant_wgmma.cu, qd_cuda_qgemv_wgmma):
 *         FP8 with F32 scales of 128 * 2^k columns or one per row, cols % 16 == 0, same
 *         alignment.
 * qd_cuda_qgemv_choice is the table's pick for a call (QD_QGEMV_PATH_MMA where it takes the
 * layout, else VEC, else ELEM; the table does not pick WGMMA yet: RESULTS session 23); qd_cuda_qgemv_path runs the given path and fails with
 * QD_ERR_UNSUPPORTED when that kernel does not take the call. */
typedef enum qd_cuda_qgemv_path_id {
    QD_QGEMV_PATH_TABLE = 0,
    QD_QGEMV_PATH_ELEM = 1,
    QD_QGEMV_PATH_VEC = 2,
    QD_QGEMV_PATH_MMA = 3,
    QD_QGEMV_PATH_WGMMA = 4,
} qd_cuda_qgemv_path_id;

int qd_cuda_qgemv_choice(const qd_weight *dw, const uint16_t *d_x, int64_t ldx);
qd_status qd_cuda_qgemv_path(int path, const qd_weight *dw, const uint16_t *d_x, int64_t ldx, int n, float *d_y,
                             int64_t ldy, int accumulate, void *stream);
/* The MMA kernel's layout test (format and scale blocks only) and its launcher. */
int qd_cuda_qgemv_mma_takes(const qd_weight *dw);
qd_status qd_cuda_qgemv_mma(const qd_weight *dw, const uint16_t *d_x, int64_t ldx, int n, float *d_y, int64_t ldy,
                            int accumulate, void *stream);
/* The same with a given warp count a block (2, 4, 8 or 16; 0: the table's), for the
 * benchmark whose figures the table follows (bench/quant_cuda_bench.c). */
qd_status qd_cuda_qgemv_mma_warps(const qd_weight *dw, const uint16_t *d_x, int64_t ldx, int n, float *d_y,
                                  int64_t ldy, int accumulate, int warps, void *stream);

/* Up to QD_CUDA_QGEMV_MULTI_MAX products sharing x (rows of a stack: GDN in_proj parts,
 * attention q / k / v) in one launch of the MMA kernel: the quantized ones of one format
 * the kernel takes, the others bf16 (qw NULL: W bf16 [rows][cols], 16-byte aligned).
 * qd_cuda_qgemv_multi_takes says whether a call qualifies (cols % 8 == 0, x aligned,
 * ldx % 8 == 0, at least one quantized product); a call that does not is refused with
 * QD_ERR_UNSUPPORTED. A product's results do not depend on n, and its warps on the
 * call's shapes only. */
#define QD_CUDA_QGEMV_MULTI_MAX 4
typedef struct qd_cuda_qgemv_out {
    const qd_weight *qw;  /* a quantized device weight, or NULL */
    const uint16_t *W;    /* bf16 weight when qw is NULL */
    int64_t rows;
    float *y;             /* fp32 rows at stride ldy */
    int64_t ldy;
} qd_cuda_qgemv_out;
int qd_cuda_qgemv_multi_takes(const qd_cuda_qgemv_out *out, int n_out, int64_t cols, const uint16_t *d_x,
                              int64_t ldx);
qd_status qd_cuda_qgemv_multi(const qd_cuda_qgemv_out *out, int n_out, int64_t cols, const uint16_t *d_x,
                              int64_t ldx, int n, int accumulate, void *stream);
/* The same with the input of a projection (cuda_linear.h): bf16 x read in place, or made
 * by each block in shared memory (an RMSNorm, the GDN gated norm, SwiGLU) where it fits
 * without lowering the blocks resident per SM (_takes says; otherwise the caller
 * materialises x and calls the bf16 form). Each row of x is built the same way whatever n
 * is, and the products' results do not depend on n. */
int qd_cuda_qgemv_multi_in_takes(const qd_cuda_qgemv_out *out, int n_out, int64_t cols, const qd_cuda_lin_in *in,
                                 int n);
qd_status qd_cuda_qgemv_multi_in(const qd_cuda_qgemv_out *out, int n_out, int64_t cols, const qd_cuda_lin_in *in,
                                 int n, int accumulate, void *stream);

/* The FP8 GEMV on the FP8 tensor cores (gemv_quant_wgmma.cu): wgmma on the stored e4m3
 * bytes, x split per token and 128-column block into two e4m3 terms with a power-of-two
 * scale (exact for every element within 2^-15 of its block's maximum), each 32-column
 * group of products summed by the tensor core (13 fractional bits below its largest
 * product, a 14-bit result) and the groups in fp32. The same products as
 * qd_cuda_qgemv_multi: FP8 weights with F32 scales of 128 * 2^k columns or one per row,
 * bf16 ones beside them, bf16 x read in place (16-byte aligned, ldx % 8 == 0, cols % 16 ==
 * 0), n <= 16. wg (warpgroups of a block splitting its columns: 1, 2 or 4) and ks
 * (blocks of a cluster splitting a row's columns: 1, 2, 4 or 8) are the table's when both
 * are 0; the bench sweeps them. A row's sums do not depend on n. */
int qd_cuda_qgemv_wgmma_takes(const qd_cuda_qgemv_out *out, int n_out, int64_t cols, const uint16_t *d_x,
                              int64_t ldx);
qd_status qd_cuda_qgemv_wgmma(const qd_cuda_qgemv_out *out, int n_out, int64_t cols, const uint16_t *d_x,
                              int64_t ldx, int n, int accumulate, int wg, int ks, void *stream);

/* The exact dequantization into bf16 rows (rounded to nearest even from the fp32 value the
 * CPU reference computes): a dense weight into d_out [rows][cols], or every matrix of m into
 * d_out [n_mats][rows][cols]. The prefill products run on these (cuBLAS, the grouped GEMMs). */
qd_status qd_cuda_dequant_bf16(const qd_weight *dw, uint16_t *d_out, void *stream);
qd_status qd_cuda_qmats_dequant_bf16(const qd_cuda_qmats *m, uint16_t *d_out, void *stream);

/* W8A8 prefill products of FP8 weights on the FP8 tensor cores (gemm_fp8.cu, cuBLASLt's
 * block-scaled FP8 GEMM). x is quantized per token to e4m3 with dynamic scales: one per
 * 1 x 128 block of columns for a 128 x 128 block weight (DeepGEMM's scheme), one per token
 * for a per-channel weight; s = amax / 448 (1 for an all-zero block), q = e4m3(x / s) to
 * nearest even, saturating (qd_cuda_fp8_quant_act, exact fp32 steps). The GEMM sums each
 * block's products in fp32 and applies s_x * s_w to it.
 * qd_cuda_fp8_gemm_mode: which of the two layouts a device weight is (F8_E4M3 with F32
 * scales, rows % 4 == 0, cols % 16 == 0, 16-byte aligned data), 0 for others (they take
 * the dequantized bf16 path). qd_cuda_fp8_act_bytes: the scratch a call of n rows of x on
 * a rows x cols weight needs. The product takes n & ~3 rows on the GEMM (cuBLASLt needs N %
 * 4 == 0) and the last n % 4 on the W8A16 GEMV (qd_cuda_qgemv). y fp32 rows at stride ldy,
 * stored or accumulated. On stream, which must be the handle's. */
enum { QD_FP8_GEMM_BLOCK = 1, QD_FP8_GEMM_CHANNEL = 2 };
int qd_cuda_fp8_gemm_mode(const qd_weight *dw);
size_t qd_cuda_fp8_act_bytes(int64_t n, int64_t rows, int64_t cols);
qd_status qd_cuda_fp8_gemm(qd_cuda_blas *b, const qd_weight *dw, const uint16_t *d_x, int64_t ldx, int n,
                           float *d_y, int64_t ldy, int accumulate, void *d_scratch, size_t scratch_bytes,
                           void *stream);
/* The activation quantization alone: q [n][cols] e4m3, scales [L][n4] (block mode, L =
 * ceil(cols / 128), n4 >= n the GEMM's N) or [n] (channel mode). */
qd_status qd_cuda_fp8_quant_act(const uint16_t *d_x, int64_t ldx, int n, int64_t cols, int mode, int n4,
                                uint8_t *d_q, float *d_scales, void *stream);
/* cuBLASLt's FP8 GEMM with one scale per operand (device floats), y = s_w s_x W xq^T into
 * fp32 rows at stride ldy: the benchmark's peer for the block-scaled GEMM. */
qd_status qd_cuda_fp8_gemm_tensor(qd_cuda_blas *b, const uint8_t *d_w, int64_t rows, int64_t cols,
                                  const float *d_sw, const uint8_t *d_xq, int n, const float *d_sx, float *d_y,
                                  int64_t ldy, void *stream);

#ifdef __cplusplus
}
#endif

#endif
