/* Quantized checkpoint tensors -> the canonical weight layouts of base/weight.h
 * (model-spec section 8). model_quant.c decides per module from the tensors present and
 * checks them against the config's quantization scheme; each family has its own parser
 * (model_quant_fp8.c, model_quant_fp4.c, model_quant_int4.c: GPTQ, AWQ and compressed-tensors
 * int4), and fused [E][..][..] expert tensors theirs (model_quant_fused.c). */
#ifndef QD_MODEL_MODEL_QUANT_H
#define QD_MODEL_MODEL_QUANT_H

#include "io/quant_match.h"
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
qd_status qd_quant_load_ct_int4(qd_model *m, const qd_quant_config *q, const char *module, int64_t rows, int64_t cols,
                                qd_weight *out, qd_err *err);

/* Shared by the parsers: tensor `module``suffix`, NULL when absent. */
const qd_st_tensor *qd_quant_find(qd_model *m, const char *module, const char *suffix);
/* "[2, 3]" into buf. */
void qd_quant_shape_str(const int64_t *shape, int ndim, char *buf, size_t size);
/* A plain (unquantized) weight w: none of `base` + suffixes[i] is present, so no scale is
 * ever silently skipped; an error names the scale and w. */
qd_status qd_quant_check_unscaled(qd_model *m, const qd_st_tensor *w, const char *base, const char *const *suffixes,
                                  size_t n, qd_err *err);
/* Checks t's shape (ndim dims); an error names the tensor. */
qd_status qd_quant_check_shape(const qd_st_tensor *t, int ndim, const int64_t *shape, qd_err *err);
/* The n elements of a F32 / BF16 / F16 tensor as owned fp32; an error names the tensor. */
qd_status qd_quant_f32(qd_model *m, const qd_st_tensor *t, float **out, qd_err *err);
/* The matcher of m's checkpoint's exclusion list (io/quant_match.h), made from q on first
 * use and kept with m, so a load compiles each pattern once however many modules it
 * checks. q is that checkpoint's config (or a copy: a rank's local config copies it); a
 * rank borrows its top model's. Fails naming a pattern that does not compile. */
qd_status qd_model_quant_matcher(qd_model *m, const qd_quant_config *q, const qd_quant_matcher **out, qd_err *err);
/* Whether `module`, stored in `tensor`, being quantized or not agrees with q (its method)
 * and its exclusion list (mt, made from q); an error names the tensor and the module. */
qd_status qd_quant_check_module(const qd_quant_config *q, const qd_quant_matcher *mt, const char *module,
                                const char *tensor, bool quantized, qd_err *err);
/* The first n e4m3 bytes of t hold no NaN code (no quantizer writes one: a damaged file,
 * on which the backends would not agree); an error names the tensor and the element. */
qd_status qd_quant_check_e4m3(qd_model *m, const qd_st_tensor *t, int64_t n, qd_err *err);
/* NVFP4 block scales: F8_E4M3 of `shape`, free of NaN codes; an error names the tensor. */
qd_status qd_quant_check_nvfp4_scales(qd_model *m, const qd_st_tensor *s, int ndim, const int64_t *shape, qd_err *err);
/* The canonical NVFP4 weight [rows][cols] on packed codes, their block scales (one e4m3 per
 * 16 columns of a row) and global (weight.h). */
qd_weight qd_quant_nvfp4_weight(int64_t rows, int64_t cols, const void *codes, const void *scales, float global);

/* Fused expert tensors (model_quant_fused.c): `name` (e.g.
 * "model.layers.0.mlp.experts.gate_up_proj") holds E experts, each `parts` stacked
 * [rows][cols] matrices (gate_up_proj: the gate's rows, then the up's), plain or ModelOpt
 * NVFP4 with per-expert scales. */
typedef struct qd_fused_experts {
    const qd_st_tensor *w;      /* the stored tensor */
    qd_dtype dtype;             /* the canonical format: w's plain dtype, or NVFP4 */
    int64_t n_experts;
    int parts;
    int64_t rows, cols;         /* of one part of one expert */
    const uint8_t *scales;      /* NVFP4: e4m3 block scales [E][parts * rows][cols / 16] */
    const float *globals;       /* NVFP4: [E][parts], owned by the model */
} qd_fused_experts;

/* Reads and checks `name` and its scales; `module` (".../mlp.experts") is the name the
 * config's exclusion list knows the experts by. Fails, naming the tensor, where it is
 * missing or of the wrong shape, where a plain tensor has scales beside it or a quantized
 * one lacks them, where a scale has a shape of no published layout or a non-positive
 * global, and for quantized formats of no published fused layout (FP8, int4). */
qd_status qd_quant_load_fused(qd_model *m, const qd_quant_config *q, const char *module, const char *name,
                              int64_t n_experts, int parts, int64_t rows, int64_t cols, qd_fused_experts *out,
                              qd_err *err);
/* Part `part` of expert e as a canonical [rows][cols] weight: a view into the mapping. */
qd_weight qd_fused_expert(const qd_fused_experts *f, int64_t e, int part);

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
