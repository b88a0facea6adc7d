/* Which format a linear module is stored in, decided from its tensors alone, then
 * checked against the config: a module is quantized exactly when its quantized tensors
 * are present. Quantized tensors in a plain checkpoint, a quantized module the config
 * excludes, or a plain one it does not exclude (when it lists exclusions) fail by name:
 * never a silently skipped scale. */
#include <stdio.h>
#include <string.h>

#include "model/model_quant.h"

const qd_st_tensor *qd_quant_find(qd_model *m, const char *module, const char *suffix) {
    char name[320];
    snprintf(name, sizeof name, "%s%s", module, suffix);
    return qd_st_find(m->st, name);
}

void qd_quant_shape_str(const int64_t *shape, int ndim, char *buf, size_t size) {
    snprintf(buf, size, "[");
    for (int i = 0; i < ndim; i++)
        snprintf(buf + strlen(buf), size - strlen(buf), "%s%lld", i ? ", " : "", (long long)shape[i]);
    snprintf(buf + strlen(buf), size - strlen(buf), "]");
}

qd_status qd_quant_check_unscaled(qd_model *m, const qd_st_tensor *w, const char *base, const char *const *suffixes,
                                  size_t n, qd_err *err) {
    for (size_t i = 0; i < n; i++) {
        const qd_st_tensor *s = qd_quant_find(m, base, suffixes[i]);
        if (s)
            return qd_seterr(err, QD_ERR_FORMAT, "tensor '%s' is a quantization scale, but '%s' is stored as plain %s",
                             s->name, w->name, qd_dtype_name(w->dtype));
    }
    return QD_OK;
}

qd_status qd_quant_check_shape(const qd_st_tensor *t, int ndim, const int64_t *shape, qd_err *err) {
    int ok = t->ndim == ndim;
    for (int i = 0; ok && i < ndim; i++) ok = t->shape[i] == shape[i];
    if (ok) return QD_OK;
    char want[96], got[96];
    qd_quant_shape_str(shape, ndim, want, sizeof want);
    qd_quant_shape_str(t->shape, t->ndim, got, sizeof got);
    return qd_seterr(err, QD_ERR_SHAPE, "tensor '%s': expected shape %s, got %s", t->name, want, got);
}

qd_status qd_quant_f32(qd_model *m, const qd_st_tensor *t, float **out, qd_err *err) {
    if (t->dtype != QD_DTYPE_F32 && t->dtype != QD_DTYPE_BF16 && t->dtype != QD_DTYPE_F16)
        return qd_seterr(err, QD_ERR_UNSUPPORTED, "tensor '%s' has dtype %s; scales are read as F32, BF16 or F16",
                         t->name, qd_dtype_name(t->dtype));
    float *v = qd_model_alloc(m, (size_t)(t->n_elements > 0 ? t->n_elements : 1) * sizeof(float));
    if (!v) return qd_seterr(err, QD_ERR_OOM, "out of memory converting '%s'", t->name);
    qd_convert_to_f32(t->dtype, t->data, v, (size_t)t->n_elements);
    for (int64_t i = 0; i < t->n_elements; i++)
        if (!(v[i] == v[i]) || v[i] - v[i] != 0)
            return qd_seterr(err, QD_ERR_FORMAT, "tensor '%s': element %lld is not finite", t->name, (long long)i);
    *out = v;
    return QD_OK;
}

static const char *const QUANT_SUFFIXES[] = {".weight_scale_inv", ".weight_scale", ".weight_scale_2", ".weight_packed",
                                             ".weight_global_scale", ".weight_zero_point", ".weight_g_idx",
                                             ".weight_shape", ".qweight", ".qzeros", ".scales", ".g_idx"};

qd_status qd_model_quant_matcher(qd_model *m, const qd_quant_config *q, const qd_quant_matcher **out, qd_err *err) {
    if (!m->quant_match) {
        const qd_status s = qd_quant_matcher_create(q, &m->quant_match_owned, err);
        m->quant_match = m->quant_match_owned;
        if (s != QD_OK) {
            *out = NULL;
            return s;
        }
    }
    *out = m->quant_match;
    return QD_OK;
}

qd_status qd_quant_check_module(const qd_quant_config *q, const qd_quant_matcher *mt, const char *module,
                                const char *tensor, bool quantized, qd_err *err) {
    if (quantized && q->method == QD_QUANT_NONE)
        return qd_seterr(err, QD_ERR_FORMAT,
                         "tensor '%s' is quantized, but config.json has no quantization_config (nor is there an "
                         "hf_quant_config.json)", tensor);
    if (q->method == QD_QUANT_NONE) return QD_OK;
    const bool excluded = qd_quant_matcher_excluded(mt, module);
    if (quantized && excluded)
        return qd_seterr(err, QD_ERR_FORMAT,
                         "tensor '%s' is quantized, but the %s quantization_config lists module '%s' as not converted",
                         tensor, q->method_name, module);
    if (!quantized && q->has_exclusions && !excluded)
        return qd_seterr(err, QD_ERR_FORMAT,
                         "module '%s' is stored unquantized (tensor '%s'), but the %s quantization_config does not "
                         "exclude it", module, tensor, q->method_name);
    return QD_OK;
}

static qd_status wrong_method(const qd_quant_config *q, const char *tensor, const char *format, qd_err *err) {
    return qd_seterr(err, QD_ERR_FORMAT, "tensor '%s' is %s, but quantization_config says '%s'", tensor, format,
                     q->method_name);
}

qd_status qd_quant_load_linear(qd_model *m, const qd_quant_config *q, const char *module, int64_t rows, int64_t cols,
                               qd_weight *out, qd_err *err) {
    char name[320];
    const qd_quant_matcher *mt;
    QD_TRY(qd_model_quant_matcher(m, q, &mt, err));
    const qd_st_tensor *w = qd_quant_find(m, module, ".weight"), *packed = qd_quant_find(m, module, ".weight_packed"),
                       *qweight = qd_quant_find(m, module, ".qweight");
    if (qweight) {
        QD_TRY(qd_quant_check_module(q, mt, module, qweight->name, true, err));
        if (q->method != QD_QUANT_GPTQ && q->method != QD_QUANT_AWQ) return wrong_method(q, qweight->name, "GPTQ/AWQ int4", err);
        return qd_quant_load_int4(m, q, module, rows, cols, out, err);
    }
    if (packed) {
        QD_TRY(qd_quant_check_module(q, mt, module, packed->name, true, err));
        if (q->method == QD_QUANT_CT_INT4) return qd_quant_load_ct_int4(m, q, module, rows, cols, out, err);
        if (q->method != QD_QUANT_CT_NVFP4)
            return wrong_method(q, packed->name, "compressed-tensors packed (NVFP4 or int4)", err);
        return qd_quant_load_nvfp4(m, q, module, rows, cols, out, err);
    }
    snprintf(name, sizeof name, "%s.weight", module);
    if (!w) return qd_seterr(err, QD_ERR_NOT_FOUND, "missing tensor '%s' in checkpoint", name);
    if (w->dtype == QD_DTYPE_F8_E4M3) {
        QD_TRY(qd_quant_check_module(q, mt, module, w->name, true, err));
        if (q->method != QD_QUANT_FP8 && q->method != QD_QUANT_CT_FP8 && q->method != QD_QUANT_MODELOPT)
            return wrong_method(q, w->name, "FP8 e4m3", err);
        return qd_quant_load_fp8(m, q, module, rows, cols, out, err);
    }
    if (w->dtype == QD_DTYPE_U8) {
        QD_TRY(qd_quant_check_module(q, mt, module, w->name, true, err));
        if (q->method != QD_QUANT_MODELOPT) return wrong_method(q, w->name, "packed U8 (ModelOpt NVFP4)", err);
        return qd_quant_load_nvfp4(m, q, module, rows, cols, out, err);
    }
    if (w->dtype != QD_DTYPE_F32 && w->dtype != QD_DTYPE_BF16 && w->dtype != QD_DTYPE_F16)
        return qd_seterr(err, QD_ERR_UNSUPPORTED,
                         "tensor '%s' has dtype %s; weights load as F32, BF16, F16 or the quantized formats (FP8 "
                         "e4m3, NVFP4, GPTQ/AWQ int4)", w->name, qd_dtype_name(w->dtype));
    QD_TRY(qd_quant_check_unscaled(m, w, module, QUANT_SUFFIXES, sizeof QUANT_SUFFIXES / sizeof *QUANT_SUFFIXES, err));
    QD_TRY(qd_quant_check_module(q, mt, module, w->name, false, err));
    int64_t shape[2] = {rows, cols};
    QD_TRY(qd_quant_check_shape(w, 2, shape, err));
    *out = (qd_weight){.dtype = w->dtype, .rows = rows, .cols = cols, .data = w->data};
    return QD_OK;
}

const qd_weight *qd_weights_first_quantized(const qd_config *c, const qd_weights *w, char *where, size_t size) {
#define QD_PROBE(wt, label)                                              \
    do {                                                                 \
        if (qd_weight_quantized(wt)) {                                   \
            snprintf(where, size, "layer %d %s", L, label);              \
            return (wt);                                                 \
        }                                                                \
    } while (0)
    for (int L = 0; w->layers && L < c->n_layers; L++) {
        const qd_layer *ly = &w->layers[L];
        if (ly->kind == QD_LAYER_GDN) {
            QD_PROBE(&ly->gdn.in_qkv, "linear_attn in_proj_qkv(z)");
            QD_PROBE(&ly->gdn.in_z, "linear_attn in_proj_z");
            QD_PROBE(&ly->gdn.in_a, "linear_attn in_proj_a");
            QD_PROBE(&ly->gdn.in_b, "linear_attn in_proj_b");
            QD_PROBE(&ly->gdn.out, "linear_attn.out_proj");
        } else {
            QD_PROBE(&ly->attn.q, "self_attn.q_proj");
            QD_PROBE(&ly->attn.k, "self_attn.k_proj");
            QD_PROBE(&ly->attn.v, "self_attn.v_proj");
            QD_PROBE(&ly->attn.o, "self_attn.o_proj");
        }
        const qd_mlp_weights *mlps[2] = {&ly->mlp, NULL};
        int n = 1;
        if (ly->ffn_kind == QD_FFN_MOE) {
            QD_PROBE(&ly->moe.router, "mlp.gate");
            n = 0;
            for (int e = 0; ly->moe.experts && e < c->n_experts; e++) {
                QD_PROBE(&ly->moe.experts[e].gate, "mlp.experts.*.gate_proj");
                QD_PROBE(&ly->moe.experts[e].up, "mlp.experts.*.up_proj");
                QD_PROBE(&ly->moe.experts[e].down, "mlp.experts.*.down_proj");
            }
            if (ly->moe.has_shared) mlps[n++] = &ly->moe.shared;
        }
        for (int i = 0; i < n; i++) {
            QD_PROBE(&mlps[i]->gate, "mlp gate_proj");
            QD_PROBE(&mlps[i]->up, "mlp up_proj");
            QD_PROBE(&mlps[i]->down, "mlp down_proj");
        }
    }
#undef QD_PROBE
    return NULL;
}
