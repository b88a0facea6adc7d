/* NVFP4 weights -> NVFP4 (weight.h: packed e2m1, low nibble first; e4m3 scales per 16;
 * a global factor):
 *  - ModelOpt: weight U8 [N, K/2], weight_scale e4m3 [N, K/16], weight_scale_2 (the global,
 *    a multiplier);
 *  - compressed-tensors: weight_packed U8 [N, K/2], weight_scale e4m3 [N, K/16],
 *    weight_global_scale, stored as a divisor: global = 1 / weight_global_scale.
 * Both keep the nibble order and the scale layout of the canonical one: views. The
 * activation scales (input_scale / input_global_scale) are for W4A4 kernels; the
 * reference multiplies W4A16 and does not read them. */
#include <stdio.h>

#include "model/model_quant.h"

qd_weight qd_quant_nvfp4_weight(int64_t rows, int64_t cols, const void *codes, const void *scales, float global) {
    return (qd_weight){.dtype = QD_DTYPE_NVFP4, .rows = rows, .cols = cols, .data = codes,
                       .scales = {.dtype = QD_DTYPE_F8_E4M3, .data = scales, .block_rows = 1, .block_cols = 16,
                                  .global = global}};
}

qd_status qd_quant_check_nvfp4_scales(qd_model *m, const qd_st_tensor *s, int ndim, const int64_t *shape, qd_err *err) {
    if (s->dtype != QD_DTYPE_F8_E4M3)
        return qd_seterr(err, QD_ERR_UNSUPPORTED, "tensor '%s' has dtype %s; NVFP4 block scales are F8_E4M3", s->name,
                         qd_dtype_name(s->dtype));
    QD_TRY(qd_quant_check_shape(s, ndim, shape, err));
    return qd_quant_check_e4m3(m, s, s->n_elements, err);
}

qd_status qd_quant_load_nvfp4(qd_model *m, const qd_quant_config *q, const char *module, int64_t rows, int64_t cols,
                              qd_weight *out, qd_err *err) {
    const bool ct = q->method == QD_QUANT_CT_NVFP4;
    const qd_st_tensor *w = qd_quant_find(m, module, ct ? ".weight_packed" : ".weight");
    const qd_st_tensor *s = qd_quant_find(m, module, ".weight_scale");
    const qd_st_tensor *g = qd_quant_find(m, module, ct ? ".weight_global_scale" : ".weight_scale_2");
    if (cols % 16)
        return qd_seterr(err, QD_ERR_SHAPE, "tensor '%s': NVFP4 needs in-features divisible by 16, got %lld", w->name,
                         (long long)cols);
    if (w->dtype != QD_DTYPE_U8)
        return qd_seterr(err, QD_ERR_UNSUPPORTED, "tensor '%s' has dtype %s; packed NVFP4 is U8", w->name,
                         qd_dtype_name(w->dtype));
    int64_t ws[2] = {rows, cols / 2}, ss[2] = {rows, cols / 16};
    QD_TRY(qd_quant_check_shape(w, 2, ws, err));
    if (!s) return qd_seterr(err, QD_ERR_NOT_FOUND, "tensor '%s' is NVFP4 but '%s.weight_scale' is missing", w->name, module);
    QD_TRY(qd_quant_check_nvfp4_scales(m, s, 2, ss, err));
    if (!g)
        return qd_seterr(err, QD_ERR_NOT_FOUND, "tensor '%s' is NVFP4 but '%s%s' is missing", w->name, module,
                         ct ? ".weight_global_scale" : ".weight_scale_2");
    if (g->n_elements != 1)
        return qd_seterr(err, QD_ERR_SHAPE, "tensor '%s' has %lld elements; the NVFP4 global scale is one value", g->name,
                         (long long)g->n_elements);
    float *gv;
    QD_TRY(qd_quant_f32(m, g, &gv, err));
    if (!(gv[0] > 0))
        return qd_seterr(err, QD_ERR_FORMAT, "tensor '%s' = %g: the global scale must be positive", g->name, (double)gv[0]);
    *out = qd_quant_nvfp4_weight(rows, cols, w->data, s->data, ct ? 1.0f / gv[0] : gv[0]);
    return QD_OK;
}
