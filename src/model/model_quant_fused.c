/* Fused expert tensors -> per-expert canonical weights (weight.h).
 *
 * Qwen3.5-MoE checkpoints store a layer's routed experts as two 3-D tensors (spec 6.2):
 * experts.gate_up_proj [E][2I][H] (each expert's gate rows, then its up rows) and
 * experts.down_proj [E][H][I], with no ".weight" suffix. A plain one (F32 / BF16 / F16) is
 * read expert by expert as stored. A quantized one is ModelOpt NVFP4 with per-expert
 * scales (spec 8.2), each expert's rows laid out as a per-expert NVFP4 linear's:
 *   <w>                    U8 [E][parts * rows][cols / 2]    e2m1 codes, low nibble first
 *   <w>_weight_scale       F8_E4M3 [E][parts * rows][cols / 16]   block scales
 *   <w>_weight_scale_2     F32 globals (multipliers)
 *   <w>_input_scale        the activation global of W4A4 kernels
 * as ModelOpt names the scales of a fused parameter (transformers' NVFP4 loader, vLLM issue
 * 49638), or <w>_scale, <w>_scale_2 and <w>.input_scale (SGLang PR 18965). The global of
 * gate_up_proj is [E, 2] (column 0 the gate's, column 1 the up's: separately calibrated
 * halves) or one per expert for both ([E], [E, 1]); down_proj's is [E] or [E, 1]; either
 * may be one value for every expert. The activation scale is not read (the reference
 * multiplies W4A16, as for per-expert NVFP4), whatever its shape (a 0-D scalar shared by
 * all experts in SGLang's case).
 *
 * Every expert is then a view into the mapping with its own global, the weights the
 * per-expert layout (experts.{e}.gate_proj.weight ...) loads to. No FP8 or int4 fused
 * layout is published (the FP8 and GPTQ / AWQ releases store experts per expert), so
 * those dtypes are refused by name rather than guessed at. */
#include <stdio.h>
#include <string.h>

#include "model/model_quant.h"

/* The names a scale of a fused tensor is published under (and FP8's, should an exporter
 * write them), for the refusal of a plain tensor with scales beside it: a scale must never
 * be silently skipped. */
static const char *const FUSED_SCALE_SUFFIXES[] = {"_weight_scale", "_weight_scale_2", "_scale", "_scale_2",
                                                   "_input_scale", ".input_scale", "_weight_scale_inv",
                                                   "_scale_inv", ".weight_scale", ".weight_scale_2"};

static bool plain_dtype(qd_dtype t) { return t == QD_DTYPE_F32 || t == QD_DTYPE_BF16 || t == QD_DTYPE_F16; }

/* The scale of `name` published as name + `modelopt` or as name + `sglang`: NULL when
 * neither is there; both at once is two answers to one question, refused. */
static qd_status find_scale(qd_model *m, const char *name, const char *modelopt, const char *sglang,
                            const qd_st_tensor **out, qd_err *err) {
    const qd_st_tensor *a = qd_quant_find(m, name, modelopt), *b = qd_quant_find(m, name, sglang);
    if (a && b)
        return qd_seterr(err, QD_ERR_FORMAT, "tensors '%s' and '%s' are both present: two namings of one scale", a->name,
                         b->name);
    *out = a ? a : b;
    return QD_OK;
}

/* A plain fused tensor: no scale beside it, and the config leaves its module unquantized. */
static qd_status check_plain(qd_model *m, const qd_quant_config *q, const qd_quant_matcher *mt, const char *module,
                             const qd_st_tensor *w, qd_err *err) {
    QD_TRY(qd_quant_check_unscaled(m, w, w->name, FUSED_SCALE_SUFFIXES,
                                   sizeof FUSED_SCALE_SUFFIXES / sizeof *FUSED_SCALE_SUFFIXES, err));
    return qd_quant_check_module(q, mt, module, w->name, false, err);
}

/* The published global shapes, as the global of part p of expert e at [e * parts + p]:
 * one per part ([E, parts], parts > 1), one per expert ([E], [E, 1]) or one in all. */
static qd_status read_globals(qd_model *m, const qd_st_tensor *g, int64_t E, int parts, float **out, qd_err *err) {
    const bool one = g->n_elements == 1 && g->ndim <= 1;
    const bool per_expert = (g->ndim == 1 && g->shape[0] == E) || (g->ndim == 2 && g->shape[0] == E && g->shape[1] == 1);
    const bool per_part = parts > 1 && g->ndim == 2 && g->shape[0] == E && g->shape[1] == parts;
    if (!one && !per_expert && !per_part) {
        char got[96];
        qd_quant_shape_str(g->shape, g->ndim, got, sizeof got);
        return qd_seterr(err, QD_ERR_SHAPE,
                         "tensor '%s' has shape %s; the NVFP4 global scale of %lld fused experts is %s[%lld], "
                         "[%lld, 1] or one value", g->name, got, (long long)E, parts > 1 ? "[E, 2] (gate, up), " : "",
                         (long long)E, (long long)E);
    }
    float *v = NULL;
    QD_TRY(qd_quant_f32(m, g, &v, err));
    for (int64_t i = 0; i < g->n_elements; i++)
        if (!(v[i] > 0))
            return qd_seterr(err, QD_ERR_FORMAT, "tensor '%s': element %lld is %g; NVFP4 global scales must be positive",
                             g->name, (long long)i, (double)v[i]);
    float *all = qd_model_alloc(m, sizeof(float) * (size_t)(E * parts));
    if (!all) return qd_seterr(err, QD_ERR_OOM, "out of memory for the globals of '%s'", g->name);
    for (int64_t e = 0; e < E; e++)
        for (int p = 0; p < parts; p++) all[e * parts + p] = one ? v[0] : per_part ? v[e * parts + p] : v[e];
    *out = all;
    return QD_OK;
}

static qd_status load_nvfp4(qd_model *m, const qd_st_tensor *w, qd_fused_experts *f, qd_err *err) {
    const int64_t E = f->n_experts, R = f->parts * f->rows, C = f->cols;
    if (C % 16)
        return qd_seterr(err, QD_ERR_SHAPE, "tensor '%s': NVFP4 needs in-features divisible by 16, got %lld", w->name,
                         (long long)C);
    const int64_t ws[3] = {E, R, C / 2}, ss[3] = {E, R, C / 16};
    QD_TRY(qd_quant_check_shape(w, 3, ws, err));
    const qd_st_tensor *s = NULL, *g = NULL;
    QD_TRY(find_scale(m, w->name, "_weight_scale", "_scale", &s, err));
    if (!s)
        return qd_seterr(err, QD_ERR_NOT_FOUND, "tensor '%s' is NVFP4 (U8) but its block scale '%s_weight_scale' (or "
                         "'%s_scale') is missing", w->name, w->name, w->name);
    QD_TRY(qd_quant_check_nvfp4_scales(m, s, 3, ss, err));
    QD_TRY(find_scale(m, w->name, "_weight_scale_2", "_scale_2", &g, err));
    if (!g)
        return qd_seterr(err, QD_ERR_NOT_FOUND, "tensor '%s' is NVFP4 (U8) but its global scale '%s_weight_scale_2' (or "
                         "'%s_scale_2') is missing", w->name, w->name, w->name);
    float *globals = NULL;
    QD_TRY(read_globals(m, g, E, f->parts, &globals, err));
    f->dtype = QD_DTYPE_NVFP4;
    f->scales = s->data;
    f->globals = globals;
    return QD_OK;
}

qd_status qd_quant_load_fused(qd_model *m, const qd_quant_config *q, const char *module, const char *name,
                              int64_t n_experts, int parts, int64_t rows, int64_t cols, qd_fused_experts *out,
                              qd_err *err) {
    const qd_quant_matcher *mt;
    QD_TRY(qd_model_quant_matcher(m, q, &mt, err));
    const qd_st_tensor *w = qd_st_find(m->st, name);
    if (!w) return qd_seterr(err, QD_ERR_NOT_FOUND, "missing tensor '%s' in checkpoint", name);
    *out = (qd_fused_experts){.w = w, .dtype = w->dtype, .n_experts = n_experts, .parts = parts, .rows = rows,
                              .cols = cols};
    if (plain_dtype(w->dtype)) {
        const int64_t shape[3] = {n_experts, parts * rows, cols};
        QD_TRY(qd_quant_check_shape(w, 3, shape, err));
        return check_plain(m, q, mt, module, w, err);
    }
    if (w->dtype != QD_DTYPE_U8)
        return qd_seterr(err, QD_ERR_UNSUPPORTED,
                         "tensor '%s' has dtype %s: quantized fused-expert tensors load as ModelOpt NVFP4 (U8 with "
                         "block and global scales) only, no fused %s layout being published; per-expert experts "
                         "(experts.{e}.*_proj) load in every format", name, qd_dtype_name(w->dtype),
                         qd_dtype_name(w->dtype));
    QD_TRY(qd_quant_check_module(q, mt, module, name, true, err));
    if (q->method != QD_QUANT_MODELOPT)
        return qd_seterr(err, QD_ERR_FORMAT, "tensor '%s' is packed U8 (ModelOpt NVFP4 fused experts), but "
                         "quantization_config says '%s'", name, q->method_name);
    return load_nvfp4(m, w, out, err);
}

qd_weight qd_fused_expert(const qd_fused_experts *f, int64_t e, int part) {
    const int64_t row0 = (e * f->parts + part) * f->rows; /* the part's first row of the stored [E * parts * rows] */
    const unsigned char *data = f->w->data;
    if (f->dtype == QD_DTYPE_NVFP4)
        return qd_quant_nvfp4_weight(f->rows, f->cols, data + (size_t)(row0 * f->cols / 2),
                                     f->scales + (size_t)(row0 * f->cols / 16), f->globals[e * f->parts + part]);
    return (qd_weight){.dtype = f->dtype, .rows = f->rows, .cols = f->cols,
                       .data = data + (size_t)(row0 * f->cols) * qd_dtype_size(f->dtype)};
}
