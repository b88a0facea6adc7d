/* Products with quantized weights on the device (gemv_quant.cu). The weight is a
 * qd_weight (base/weight.h) in its canonical layout whose pointers (data,
 * scales.data, scales.zeros, scales.g_idx) are device addresses: the same
 * description the CPU reference dequantizes, so one struct names a weight on
 * either side. */
#ifndef QD_CUDA_QUANT_H
#define QD_CUDA_QUANT_H

#include <stdint.h>

#include "base/weight.h"
#include "qdelta.h"

#ifdef __cplusplus
extern "C" {
#endif

#define QD_CUDA_QGEMV_MAX_N 16

/* y[t][r] (+)= sum_c W[r][c] x[t][c] for t < n <= QD_CUDA_QGEMV_MAX_N, W quantized
 * (F8_E4M3 with F32 scales of any block shape: block 128 x 128 or per-channel; NVFP4
 * with e4m3 scales of 1 x 16 and the global factor; INT4 with F32 group scales, U8
 * zeros or none (z = 8), and g_idx act-order groups or contiguous groups). x bf16
 * rows at stride ldx, y fp32 rows at stride ldy; fp32 accumulation. The weight's
 * bytes are read once per call and the scales applied in registers; act-order reads
 * the group of each column from g_idx (no reordering: exact, slower). Any rows and
 * cols the layout allows (partial blocks, cols not a multiple of the block).
 * Errors (status and message): an unsupported format or scale dtype, n out of range,
 * missing data. */
qd_status qd_cuda_qgemv(const qd_weight *dw, const uint16_t *d_x, int64_t ldx, int n, float *d_y, int64_t ldy,
                        int accumulate, void *stream);

#ifdef __cplusplus
}
#endif

#endif
