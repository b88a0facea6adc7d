/* Private to matmul.c / matmul_gemm.c: block sizes and the shared scalar weight read. */
#ifndef QD_BACKEND_CPU_MATMUL_INTERNAL_H
#define QD_BACKEND_CPU_MATMUL_INTERNAL_H

#include <stdint.h>

#include "backend/cpu/cpu_ops.h"
#include "base/dtype.h"

/* n up to this uses the streaming GEMV (x rows in groups of 4 over cache-sized W
 * blocks); larger n packs W panels (GEMM). Measured on Zen 3 with cols = 1024: the
 * grouped GEMV beats the packed GEMM clearly at n <= 16 and ties around n = 64, where
 * packing and the y read-modify-write are no longer amortised away. */
#ifndef QD_MM_GEMV_MAX_N
#define QD_MM_GEMV_MAX_N 32
/* The same for a quantized w (F8_E4M3, NVFP4, INT4; matmul_quant.c): rows [r0, r1) dequantized
 * exactly, in tiles, and dotted in fp32; any r0. */
void qd_mm_quant_range(const qd_weight *w, const float *x, float *y, int64_t r0, int64_t r1,
                       int64_t i0, int64_t i1);

#endif
/* GEMM micro-kernel tile: MR x rows by NR W rows. K is cut into equal blocks of at
 * most QD_MM_KC columns; a packed panel (NR x block floats, 64 KiB at most) is heap
 * scratch per task. Large blocks matter: every block boundary costs a
 * read-modify-write pass over y (measured on Zen 3, n = 512, cols = 1024:
 * KC 256 -> ~69, 512 -> ~77, 1024 -> ~82 GFLOP/s per core). If the scratch cannot be
 * allocated, a QD_MM_KC_STACK-column panel on the stack is used instead. */
#define QD_MM_MR 6
#define QD_MM_NR 16
#ifndef QD_MM_KC
#define QD_MM_KC 1024
/* The same for a quantized w (F8_E4M3, NVFP4, INT4; matmul_quant.c): rows [r0, r1) dequantized
 * exactly, in tiles, and dotted in fp32; any r0. */
void qd_mm_quant_range(const qd_weight *w, const float *x, float *y, int64_t r0, int64_t r1,
                       int64_t i0, int64_t i1);

#endif
#define QD_MM_KC_STACK 256

/* One weight element as f32; used for column tails, packing and the portable path. */
static inline float qd_mm_wscalar(qd_dtype dt, const void *w, int64_t idx) {
    switch (dt) {
    case QD_DTYPE_F32: return ((const float *)w)[idx];
    case QD_DTYPE_BF16: return qd_bf16_to_f32(((const uint16_t *)w)[idx]);
    case QD_DTYPE_F16: return qd_f16_to_f32(((const uint16_t *)w)[idx]);
    case QD_DTYPE_F8_E4M3: return qd_f8e4m3_to_f32(((const uint8_t *)w)[idx]);
    case QD_DTYPE_I32: return (float)((const int32_t *)w)[idx];
    case QD_DTYPE_I64: return (float)((const int64_t *)w)[idx];
    case QD_DTYPE_U8: return (float)((const uint8_t *)w)[idx];
    default: return 0.0f;
    }
}

/* y[i][r] for W rows [r0, r1) (r0 a multiple of QD_MM_NR) and x rows [i0, i1);
 * ldx = cols, ldy = rows. Needs no heap memory. */
void qd_mm_gemm_range(const qd_weight *w, const float *x, float *y, int64_t r0, int64_t r1,
                      int64_t i0, int64_t i1);

/* The same for a quantized w (F8_E4M3, NVFP4, INT4; matmul_quant.c): rows [r0, r1) dequantized
 * exactly, in tiles, and dotted in fp32; any r0. */
void qd_mm_quant_range(const qd_weight *w, const float *x, float *y, int64_t r0, int64_t r1,
                       int64_t i0, int64_t i1);

#endif
