/* FP8 e4m3 weights -> F8_E4M3 with F32 block scales (weight.h):
 *  - fp8 (official Qwen): weight_scale_inv [ceil(N/br), ceil(K/bc)], a multiplier despite
 *    its name, in F32, BF16 or F16;
 *  - compressed-tensors float-quantized: weight_scale [N, 1] (channel), [1] (tensor) or the
 *    block grid (block strategy);
 *  - ModelOpt FP8: weight_scale a scalar (per tensor).
 * A per-tensor scale is folded into per-channel scales (block_rows 1, block_cols K). The
 * e4m3 bytes are used as stored (a view into the mapping). */
#include <stdio.h>

#include "model/model_quant.h"

static int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

qd_status qd_quant_load_fp8(qd_model *m, const qd_quant_config *q, const char *module, int64_t rows, int64_t cols,
                            qd_weight *out, qd_err *err) {
    const qd_st_tensor *w = qd_quant_find(m, module, ".weight");
    int64_t shape[2] = {rows, cols};
    QD_TRY(qd_quant_check_shape(w, 2, shape, err));
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
