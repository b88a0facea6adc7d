/* Quantized checkpoint tensors -> the canonical weight layouts of base/weight.h
 * (model-spec section 8). model_quant.c decides per module from the tensors present and
 * checks them against the config's quantization scheme; each family has its own parser
 * (model_quant_fp8.c, model_quant_fp4.c, model_quant_int4.c). */
#ifndef QD_MODEL_MODEL_QUANT_H
#define QD_MODEL_MODEL_QUANT_H

#include "model/model.h"

/* The linear `module` (a full tensor name without ".weight", e.g.
 * "model.layers.0.mlp.gate_proj") as a [rows][cols] weight: a view of a plain F32 / BF16 /
 * F16 weight, or the module's quantized tensors converted (scales, zeros and repacked
 * nibbles owned by m). Fails, naming the tensor, where a tensor is missing, of an unknown
 * dtype or shape, or where the tensors and q disagree. */
qd_status qd_quant_load_linear(qd_model *m, const qd_quant_config *q, const char *module, int64_t rows, int64_t cols,
                               qd_weight *out, qd_err *err);

/* Parsers, one per family; `module` as above, its quantized tensors known present. */
qd_status qd_quant_load_fp8(qd_model *m, const qd_quant_config *q, const char *module, int64_t rows, int64_t cols,
                            qd_weight *out, qd_err *err);
qd_status qd_quant_load_nvfp4(qd_model *m, const qd_quant_config *q, const char *module, int64_t rows, int64_t cols,
                              qd_weight *out, qd_err *err);
qd_status qd_quant_load_int4(qd_model *m, const qd_quant_config *q, const char *module, int64_t rows, int64_t cols,
                             qd_weight *out, qd_err *err);

/* Shared by the parsers: tensor `module``suffix`, NULL when absent. */
const qd_st_tensor *qd_quant_find(qd_model *m, const char *module, const char *suffix);
/* Checks t's shape (ndim dims); an error names the tensor. */
qd_status qd_quant_check_shape(const qd_st_tensor *t, int ndim, const int64_t *shape, qd_err *err);
/* The n elements of a F32 / BF16 / F16 tensor as owned fp32; an error names the tensor. */
qd_status qd_quant_f32(qd_model *m, const qd_st_tensor *t, float **out, qd_err *err);

/* The first quantized linear weight of w (NULL: none), named into `where` ("layer 3
 * mlp.down_proj"), so a backend that cannot multiply one refuses the model by name. */
const qd_weight *qd_weights_first_quantized(const qd_config *c, const qd_weights *w, char *where, size_t size);

/* Quantization at load (model_quant_online.c): a plain weight to F8_E4M3 with 128 x 128
 * block scales (amax / 448 per block), buffers owned by m; and every linear layer of m's
 * bound weights into `kind` (fp8 as above, nvfp4, int4 symmetric group 128). */
qd_status qd_quant_to_fp8_block(qd_model *m, const qd_weight *w, qd_weight *out, qd_err *err);
/* One weight converted to kind (fp8, nvfp4, int4) as --quantization converts a dense layer
 * (by rows over the model's pool), its buffers allocated from m; w stays as it is. */
qd_status qd_quant_to_format(qd_model *m, qd_quantization kind, const qd_weight *w, qd_weight *out, qd_err *err);
qd_status qd_model_quantize(qd_model *m, qd_quantization kind, qd_err *err);
/* The same for layer L alone: dummy weights are converted a layer at a time as they are
 * drawn, so a large model peaks at one layer in bf16 beside the quantized rest. */
qd_status qd_model_quantize_layer(qd_model *m, qd_quantization kind, int L, qd_err *err);

#endif
