/* A weight matrix and the format it is stored in. Every backend dispatches on the
 * format tag (dtype) to pick the kernel that multiplies it; nothing outside a backend
 * knows how a format is multiplied. The loaders (src/model) turn every published
 * quantized layout into one of the canonical layouts below, so a backend supports a
 * format once, whatever checkpoint it came from.
 *
 * Canonical layouts ([rows = out features][cols = in features], row-major):
 *   F32, BF16, F16   data [rows][cols]; no scales
 *   F8_E4M3          data [rows][cols] e4m3 bytes; scales F32
 *                    [ceil(rows / block_rows)][ceil(cols / block_cols)]: w = e4m3 * scale.
 *                    Block FP8 is 128 x 128 (partial blocks at the edges); per-channel FP8 is
 *                    block_rows 1, block_cols cols; a per-tensor scale is folded into them.
 *   NVFP4            data [rows][cols / 2], two e2m1 values per byte, element 2j in the low
 *                    nibble; scales F8_E4M3 [rows][cols / 16] (block 1 x 16); w = e2m1 * scale
 *                    * global (the checkpoint's weight_scale_2). cols % 16 == 0.
 *   INT4             data [rows][cols / 2], element 2j in the low nibble, unsigned q in [0, 16);
 *                    scales F32 [rows][ceil(cols / block_cols)] (block_rows 1, block_cols the
 *                    group size; cols for a single group); zeros NULL (symmetric: z = 8) or U8
 *                    [rows][ceil(cols / block_cols)]; g_idx NULL, or [cols] the group of each
 *                    column (GPTQ act-order) instead of c / block_cols; w = (q - z) * scale.
 *                    cols % 2 == 0. */
#ifndef QD_BASE_WEIGHT_H
#define QD_BASE_WEIGHT_H

#include <stddef.h>
#include <stdint.h>

#include "base/dtype.h"

/* Scales of a block- or group-quantized weight (unused, data NULL, for plain formats). */
typedef struct qd_weight_scales {
    qd_dtype dtype;         /* storage of the scales */
    const void *data;
    int64_t block_rows, block_cols;
    float global;           /* NVFP4's per-tensor factor (1 elsewhere) */
    const uint8_t *zeros;   /* INT4 zero points, or NULL */
    const int32_t *g_idx;   /* INT4 act-order groups, or NULL */
} qd_weight_scales;

typedef struct qd_weight {
    qd_dtype dtype;         /* the format tag (see above) */
    int64_t rows;           /* output features */
    int64_t cols;           /* input features */
    const void *data;       /* the stored elements; NULL for dummy weights that a backend draws
                             * itself from dummy_seed / dummy_scale */
    qd_weight_scales scales;
    uint64_t dummy_seed;
    float dummy_scale;
} qd_weight;

/* Whether dtype is a quantized format (F8_E4M3, NVFP4, INT4: data alone is not the value). */
static inline int qd_weight_quantized(const qd_weight *w) {
    return w->dtype == QD_DTYPE_F8_E4M3 || w->dtype == QD_DTYPE_NVFP4 || w->dtype == QD_DTYPE_INT4;
}

/* Whether w is a dummy that its backend draws in place (no host values): bf16, or in its
 * quantized layout from the same bf16 values (base/dummy_values.h). */
static inline int qd_weight_backend_drawn(const qd_weight *w) { return !w->data && w->dummy_scale > 0; }

/* Bytes of the stored elements (data) and of the scales (with zeros and g_idx). */
size_t qd_weight_data_bytes(const qd_weight *w);
size_t qd_weight_scale_bytes(const qd_weight *w);

/* Rows [r0, r0 + n) of w exactly dequantized to fp32 into out [n][cols] (for plain formats
 * the conversion of the stored values): the reference every multiply of a quantized format
 * is tested against. */
void qd_weight_dequant_rows(const qd_weight *w, int64_t r0, int64_t n, float *out);
/* Columns [c0, c0 + n) of row r, the same values. */
void qd_weight_dequant_span(const qd_weight *w, int64_t r, int64_t c0, int64_t n, float *out);

#endif
