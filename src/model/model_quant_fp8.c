/* FP8 e4m3 weights -> F8_E4M3 with F32 block scales (weight.h):
 *  - fp8 (official Qwen): weight_scale_inv [ceil(N/br), ceil(K/bc)], a multiplier despite
 *    its name, in F32, BF16 or F16;
 *  - compressed-tensors float-quantized: weight_scale [N, 1] (channel), [1] (tensor) or the
 *    block grid (block strategy);
 *  - ModelOpt FP8: weight_scale a scalar (per tensor).
 * A per-tensor scale is folded into per-channel scales (block_rows 1, block_cols K). The
 * e4m3 bytes are used as stored (a view into the mapping), once checked for NaN codes. */
#include <stdio.h>
#include <stdlib.h>

#include "model/model_quant.h"

static int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

/* The e4m3 bytes scanned for NaN codes over the pool, 1 MiB a task. */
#define NAN_CHUNK ((int64_t)1 << 20)
typedef struct nan_scan {
    const uint8_t *p;
    int64_t n;
    int64_t *first; /* [chunks] the chunk's first NaN code, or -1 */
} nan_scan;

static void nan_task(void *user, int64_t begin, int64_t end, int worker) {
    (void)worker;
    const nan_scan *j = user;
    for (int64_t c = begin; c < end; c++) {
        const int64_t lo = c * NAN_CHUNK, len = j->n - lo < NAN_CHUNK ? j->n - lo : NAN_CHUNK;
        const int64_t at = qd_e4m3_first_nan(j->p + lo, len);
        j->first[c] = at < 0 ? -1 : lo + at;
    }
}

/* A weight or scale with an e4m3 NaN code is refused by name: no quantizer writes one, so
 * the file is damaged, and the backends would not agree on it (the CPU computes NaN, the
 * CUDA tensor-core kernels +-480). */
qd_status qd_quant_check_e4m3(qd_model *m, const qd_st_tensor *w, int64_t n, qd_err *err) {
    const int64_t chunks = (n + NAN_CHUNK - 1) / NAN_CHUNK;
    int64_t one = -1, *first = chunks > 1 ? malloc((size_t)chunks * sizeof(int64_t)) : &one;
    if (!first) return qd_seterr(err, QD_ERR_OOM, "out of memory checking '%s'", w->name);
    nan_scan j = {(const uint8_t *)w->data, n, first};
    if (chunks > 1) qd_parallel_for(m->pool, chunks, 1, nan_task, &j);
    else nan_task(&j, 0, chunks, 0);
    int64_t at = -1;
    for (int64_t c = 0; c < chunks && at < 0; c++) at = first[c];
    if (first != &one) free(first);
    if (at >= 0)
        return qd_seterr(err, QD_ERR_FORMAT, "tensor '%s': element %lld is an e4m3 NaN code (0x%02x), which no "
                         "quantizer writes: the file is damaged", w->name, (long long)at,
                         (unsigned)((const uint8_t *)w->data)[at]);
    return QD_OK;
}

qd_status qd_quant_load_fp8(qd_model *m, const qd_quant_config *q, const char *module, int64_t rows, int64_t cols,
                            qd_weight *out, qd_err *err) {
    const qd_st_tensor *w = qd_quant_find(m, module, ".weight");
    int64_t shape[2] = {rows, cols};
    QD_TRY(qd_quant_check_shape(w, 2, shape, err));
    QD_TRY(qd_quant_check_e4m3(m, w, rows * cols, err));
    const qd_st_tensor *inv = qd_quant_find(m, module, ".weight_scale_inv"), *sc = qd_quant_find(m, module, ".weight_scale");
    if (inv && sc)
        return qd_seterr(err, QD_ERR_FORMAT, "module '%s' has both weight_scale_inv and weight_scale", module);
    const qd_st_tensor *s = inv ? inv : sc;
    if (!s)
        return qd_seterr(err, QD_ERR_NOT_FOUND, "tensor '%s' is FP8 e4m3 but has no '%s.weight_scale_inv' or "
                         "'%s.weight_scale'", w->name, module, module);
    float *v;
    QD_TRY(qd_quant_f32(m, s, &v, err));
    for (int64_t i = 0; i < s->n_elements; i++)
        if (!(v[i] > 0))
            return qd_seterr(err, QD_ERR_FORMAT, "tensor '%s': scale %lld is %g (scales must be positive)", s->name,
                             (long long)i, (double)v[i]);
    int64_t br, bc;
    if (q->block_rows > 0) {
        /* block-quantized: the scale grid of the config's block size, partial blocks at the edges */
        br = q->block_rows, bc = q->block_cols;
        int64_t grid[2] = {ceil_div(rows, br), ceil_div(cols, bc)};
        QD_TRY(qd_quant_check_shape(s, 2, grid, err));
    } else if (s->n_elements == rows && (s->ndim == 1 || (s->ndim == 2 && s->shape[1] == 1))) {
        br = 1, bc = cols; /* per channel */
    } else if (s->n_elements == 1 && s->ndim <= 1) {
        /* per tensor, folded into one scale per row */
        float *rowv = qd_model_alloc(m, (size_t)rows * sizeof(float));
        if (!rowv) return qd_seterr(err, QD_ERR_OOM, "out of memory for the scales of '%s'", w->name);
        for (int64_t r = 0; r < rows; r++) rowv[r] = v[0];
        v = rowv, br = 1, bc = cols;
    } else {
        return qd_seterr(err, QD_ERR_SHAPE,
                         "tensor '%s' has %lld elements in %d dims: not a per-tensor, per-channel [%lld, 1] or "
                         "(with weight_block_size) block scale layout", s->name, (long long)s->n_elements, s->ndim,
                         (long long)rows);
    }
    if (inv && q->block_rows == 0)
        return qd_seterr(err, QD_ERR_FORMAT, "tensor '%s' is a block scale, but quantization_config has no "
                         "weight_block_size", inv->name);
    *out = (qd_weight){.dtype = QD_DTYPE_F8_E4M3, .rows = rows, .cols = cols, .data = w->data,
                       .scales = {.dtype = QD_DTYPE_F32, .data = v, .block_rows = br, .block_cols = bc, .global = 1}};
    return QD_OK;
}
