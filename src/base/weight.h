/* A weight matrix and the format it is stored in. Every backend dispatches on the
 * format tag (dtype) to pick the kernel that multiplies it; nothing outside a backend
 * knows how a format is multiplied. Plain formats (F32, BF16, F16) use data alone; a
 * quantized format adds its tag to qd_dtype and fills `scales`. */
#ifndef QD_BASE_WEIGHT_H
#define QD_BASE_WEIGHT_H

#include <stdint.h>

#include "base/dtype.h"

/* Scales of a block- or group-quantized weight: scale (r, c) applies to the elements
 * [r * block_rows, +block_rows) x [c * block_cols, +block_cols) of the matrix. Unused
 * (data NULL) for plain formats. */
typedef struct qd_weight_scales {
    qd_dtype dtype;         /* storage of the scales (F32, BF16, F16, F8_E4M3) */
    const void *data;       /* [ceil(rows / block_rows)][ceil(cols / block_cols)] */
    int64_t block_rows, block_cols;
    float global;           /* a per-tensor factor on top of the blocks (1 when none) */
} qd_weight_scales;

/* nn.Linear convention: [rows = out features][cols = in features], row-major. */
typedef struct qd_weight {
    qd_dtype dtype;         /* the format tag: F32, BF16 or F16 today */
    int64_t rows;           /* output features */
    int64_t cols;           /* input features */
    const void *data;       /* rows * cols elements; NULL for dummy weights that a device
                             * backend draws itself from dummy_seed / dummy_scale */
    qd_weight_scales scales;
    uint64_t dummy_seed;
    float dummy_scale;
} qd_weight;

#endif
