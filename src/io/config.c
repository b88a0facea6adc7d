/* config.json -> qd_config. All JSON handling for the model configuration lives here
 * (model-spec section 1): which model types exist, where their fields live (flat or
 * under text_config), defaults that match transformers, and every derived quantity.
 * The input is untrusted: each field is type-checked and each dimension bounded so the
 * rest of the engine can multiply dims in `int` without overflow. */
#include "io/config.h"

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/json_util.h"

#define CFG_MAX_FILE (16u * 1024u * 1024u)
/* Larger than any real model by orders of magnitude, small enough that the products
 * the engine forms (conv_dim, 2*NQ*hd, ...) are checked below to fit in int. */
#define CFG_MAX_DIM (1 << 24)
#define SUPPORTED_TYPES "qwen3_next, qwen3_5, qwen3_5_moe, qwen3_5_text, qwen3_5_moe_text"

typedef struct cfg {
    const char *what;  /* file name for messages */
    json_t *top;
    json_t *text;      /* text_config of composite configs, else NULL */
    qd_err *err;
} cfg;

/* Fields of a composite config are read from text_config first, then the top level
 * (third-party exports put some, e.g. eos_token_id, at the top). JSON null counts as
 * absent, as transformers treats it as "use the default". */
static json_t *lookup(const cfg *c, const char *key, const char **where) {
    json_t *v;
    if (c->text && (v = json_object_get(c->text, key)) && !json_is_null(v)) {
        *where = "text_config.";
        return v;
    }
    *where = "";
    v = json_object_get(c->top, key);
    return v && !json_is_null(v) ? v : NULL;
}

static qd_status missing(const cfg *c, const char *key) {
    return qd_seterr(c->err, QD_ERR_NOT_FOUND, "%s: required field '%s' is missing%s", c->what, key,
                     c->text ? " (looked in text_config and at the top level)" : "");
}

static qd_status wrong_type(const cfg *c, const char *where, const char *key, const char *expected, const json_t *v) {
    return qd_seterr(c->err, QD_ERR_FORMAT, "%s: field '%s%s' must be %s, got %s", c->what, where, key, expected,
                     qd_json_type_name(v));
}

/* JSON integers, or reals with an integral value (some exporters write 2048.0). */
static qd_status as_int(const cfg *c, const char *where, const char *key, const json_t *v, int *out) {
    if (json_is_integer(v)) {
        json_int_t i = json_integer_value(v);
        if (i < INT_MIN || i > INT_MAX)
            return qd_seterr(c->err, QD_ERR_FORMAT, "%s: field '%s%s' = %lld is out of range", c->what, where, key,
                             (long long)i);
        *out = (int)i;
        return QD_OK;
    }
    if (json_is_real(v)) {
        double d = json_real_value(v);
        if (d == floor(d) && d >= INT_MIN && d <= INT_MAX) {
            *out = (int)d;
            return QD_OK;
        }
    }
    return wrong_type(c, where, key, "an integer", v);
}

static qd_status get_int(const cfg *c, const char *key, bool required, int def, int *out) {
    const char *where;
    const json_t *v = lookup(c, key, &where);
    if (!v) {
        if (required) return missing(c, key);
        *out = def;
        return QD_OK;
    }
    return as_int(c, where, key, v, out);
}

static qd_status get_num(const cfg *c, json_t *obj, const char *where, const char *key, double def, double *out) {
    const json_t *v = obj ? json_object_get(obj, key) : lookup(c, key, &where);
    if (!v || json_is_null(v)) {
        *out = def;
        return QD_OK;
    }
    if (!json_is_number(v)) return wrong_type(c, where, key, "a number", v);
    *out = json_number_value(v);
    return QD_OK;
}

static qd_status get_bool(const cfg *c, const char *key, bool def, bool *out) {
    const char *where;
    const json_t *v = lookup(c, key, &where);
    if (!v) {
        *out = def;
        return QD_OK;
    }
    if (!json_is_boolean(v)) return wrong_type(c, where, key, "true or false", v);
    *out = json_is_true(v);
    return QD_OK;
}

static qd_status check_dim(const cfg *c, const char *key, int v) {
    if (v <= 0 || v > CFG_MAX_DIM)
        return qd_seterr(c->err, QD_ERR_FORMAT, "%s: field '%s' = %d must be in [1, %d]", c->what, key, v, CFG_MAX_DIM);
    return QD_OK;
}

static qd_status req_dim(const cfg *c, const char *key, int *out) {
    QD_TRY(get_int(c, key, true, 0, out));
    return check_dim(c, key, *out);
}

/* Resolves the architecture from model_type; composite configs may name the real
 * variant only in text_config.model_type, which wins. */
static qd_status resolve_arch(cfg *c, qd_config *o) {
    const json_t *mt = json_object_get(c->top, "model_type");
    if (!mt) return qd_seterr(c->err, QD_ERR_NOT_FOUND, "%s: required field 'model_type' is missing", c->what);
    if (!json_is_string(mt)) return wrong_type(c, "", "model_type", "a string", mt);
    const char *t = json_string_value(mt);
    snprintf(o->model_type, sizeof o->model_type, "%s", t);
    if (strcmp(t, "qwen3_next") == 0) {
        o->arch = QD_ARCH_QWEN3_NEXT;
        return QD_OK;
    }
    if (strcmp(t, "qwen3_5_text") == 0 || strcmp(t, "qwen3_5_moe_text") == 0) {
        o->arch = strcmp(t, "qwen3_5_text") == 0 ? QD_ARCH_QWEN3_5 : QD_ARCH_QWEN3_5_MOE;
        return QD_OK;
    }
    if (strcmp(t, "qwen3_5") != 0 && strcmp(t, "qwen3_5_moe") != 0)
        return qd_seterr(c->err, QD_ERR_UNSUPPORTED, "%s: model_type '%.64s' is not supported (supported: %s)", c->what,
                         t, SUPPORTED_TYPES);
    o->arch = strcmp(t, "qwen3_5") == 0 ? QD_ARCH_QWEN3_5 : QD_ARCH_QWEN3_5_MOE;
    json_t *tc = json_object_get(c->top, "text_config");
    if (!tc || json_is_null(tc)) return QD_OK;  /* flat export under the composite name */
    if (!json_is_object(tc)) return wrong_type(c, "", "text_config", "an object", tc);
    c->text = tc;
    const json_t *tmt = json_object_get(tc, "model_type");
    if (!tmt || json_is_null(tmt)) return QD_OK;
    if (!json_is_string(tmt)) return wrong_type(c, "text_config.", "model_type", "a string", tmt);
    const char *tt = json_string_value(tmt);
    if (strcmp(tt, "qwen3_5_text") == 0) o->arch = QD_ARCH_QWEN3_5;
    else if (strcmp(tt, "qwen3_5_moe_text") == 0) o->arch = QD_ARCH_QWEN3_5_MOE;
    else
        return qd_seterr(c->err, QD_ERR_UNSUPPORTED,
                         "%s: text_config.model_type '%.64s' is not supported (expected qwen3_5_text or "
                         "qwen3_5_moe_text)", c->what, tt);
    return QD_OK;
}

static qd_status read_layer_plan(const cfg *c, qd_config *o) {
    const char *where;
    const json_t *lt = lookup(c, "layer_types", &where);
    if (lt) {
        if (!json_is_array(lt)) return wrong_type(c, where, "layer_types", "an array", lt);
        if (json_array_size(lt) != (size_t)o->n_layers)
            return qd_seterr(c->err, QD_ERR_FORMAT, "%s: '%slayer_types' has %zu entries but num_hidden_layers is %d",
                             c->what, where, json_array_size(lt), o->n_layers);
        for (int i = 0; i < o->n_layers; i++) {
            const char *s = json_string_value(json_array_get(lt, (size_t)i));
            if (s && strcmp(s, "linear_attention") == 0) o->layer_kind[i] = QD_LAYER_GDN;
            else if (s && strcmp(s, "full_attention") == 0) o->layer_kind[i] = QD_LAYER_ATTN;
            else
                return qd_seterr(c->err, QD_ERR_FORMAT,
                                 "%s: '%slayer_types[%d]' must be \"linear_attention\" or \"full_attention\"", c->what,
                                 where, i);
        }
        return QD_OK;
    }
    int interval;
    QD_TRY(get_int(c, "full_attention_interval", false, 4, &interval));
    if (interval <= 0)
        return qd_seterr(c->err, QD_ERR_FORMAT, "%s: field 'full_attention_interval' = %d must be positive", c->what,
                         interval);
    for (int i = 0; i < o->n_layers; i++) o->layer_kind[i] = (i + 1) % interval == 0 ? QD_LAYER_ATTN : QD_LAYER_GDN;
    return QD_OK;
}

/* A rope_type we would silently get wrong (yarn, linear, ...) must be refused. */
static qd_status check_rope_type(const cfg *c, const json_t *obj, const char *where) {
    const char *keys[] = {"rope_type", "type"};
    for (int k = 0; k < 2; k++) {
        const json_t *v = json_object_get(obj, keys[k]);
        if (!v || json_is_null(v)) continue;
        if (!json_is_string(v)) return wrong_type(c, where, keys[k], "a string", v);
        const char *s = json_string_value(v);
        /* mrope with text-only positions is plain RoPE (model-spec 10.16). */
        if (strcmp(s, "default") != 0 && strcmp(s, "mrope") != 0)
            return qd_seterr(c->err, QD_ERR_UNSUPPORTED, "%s: '%s%s' = '%.32s' is not supported (only default RoPE)",
                             c->what, where, keys[k], s);
    }
    return QD_OK;
}

static qd_status read_rope(const cfg *c, qd_config *o) {
    const char *where;
    json_t *rp = lookup(c, "rope_parameters", &where);
    char rwhere[64] = "";
    if (rp) {
        if (!json_is_object(rp)) return wrong_type(c, where, "rope_parameters", "an object", rp);
        snprintf(rwhere, sizeof rwhere, "%srope_parameters.", where);
        QD_TRY(check_rope_type(c, rp, rwhere));
    }
    const char *swhere;
    json_t *rs = lookup(c, "rope_scaling", &swhere);
    if (rs) {
        if (!json_is_object(rs)) return wrong_type(c, swhere, "rope_scaling", "an object or null", rs);
        char w[64];
        snprintf(w, sizeof w, "%srope_scaling.", swhere);
        QD_TRY(check_rope_type(c, rs, w));
    }
    /* rope_parameters wins; the top-level (legacy) fields are the fallback. */
    double theta, prf;
    QD_TRY(get_num(c, NULL, NULL, "rope_theta", 10000.0, &theta));
    QD_TRY(get_num(c, NULL, NULL, "partial_rotary_factor", 0.25, &prf));
    if (rp) {
        QD_TRY(get_num(c, rp, rwhere, "rope_theta", theta, &theta));
        QD_TRY(get_num(c, rp, rwhere, "partial_rotary_factor", prf, &prf));
    } else if (rs) {
        /* transformers 5 reads a `rope_scaling` object as an alias of `rope_parameters`
         * (configs written for both 4.x and 5.x put rope_theta there); without this the
         * theta inside it would be ignored silently. */
        char w[64];
        snprintf(w, sizeof w, "%srope_scaling.", swhere);
        QD_TRY(get_num(c, rs, w, "rope_theta", theta, &theta));
        QD_TRY(get_num(c, rs, w, "partial_rotary_factor", prf, &prf));
    }
    if (!(theta > 0) || !isfinite(theta))
        return qd_seterr(c->err, QD_ERR_FORMAT, "%s: rope_theta = %g must be positive", c->what, theta);
    if (!(prf > 0 && prf <= 1))
        return qd_seterr(c->err, QD_ERR_FORMAT, "%s: partial_rotary_factor = %g must be in (0, 1]", c->what, prf);
    o->rope_theta = theta;
    o->rope_dim = (int)(o->attn_head_dim * prf);  /* truncation, as transformers does */
    if (o->rope_dim <= 0 || o->rope_dim % 2 != 0 || o->rope_dim > o->attn_head_dim)
        return qd_seterr(c->err, QD_ERR_FORMAT,
                         "%s: rotary dims head_dim %d x partial_rotary_factor %g = %d must be even and positive",
                         c->what, o->attn_head_dim, prf, o->rope_dim);
    return QD_OK;
}

static qd_status read_ffn(const cfg *c, qd_config *o) {
    int n_moe = 0;
    if (o->arch == QD_ARCH_QWEN3_5) {
        for (int i = 0; i < o->n_layers; i++) o->ffn_kind[i] = QD_FFN_DENSE;
    } else if (o->arch == QD_ARCH_QWEN3_5_MOE) {
        for (int i = 0; i < o->n_layers; i++) o->ffn_kind[i] = QD_FFN_MOE;
        n_moe = o->n_layers;
    } else {
        /* Qwen3-Next: required, since transformers' default (512) would be a guess. */
        QD_TRY(get_int(c, "num_experts", true, 0, &o->n_experts));
        if (o->n_experts < 0)
            return qd_seterr(c->err, QD_ERR_FORMAT, "%s: num_experts = %d is negative", c->what, o->n_experts);
        int step;
        QD_TRY(get_int(c, "decoder_sparse_step", false, 1, &step));
        if (step <= 0)
            return qd_seterr(c->err, QD_ERR_FORMAT, "%s: decoder_sparse_step = %d must be positive", c->what, step);
        bool mlp_only[QD_MAX_LAYERS] = {0};
        const char *where;
        const json_t *mol = lookup(c, "mlp_only_layers", &where);
        if (mol) {
            if (!json_is_array(mol)) return wrong_type(c, where, "mlp_only_layers", "an array", mol);
            for (size_t k = 0; k < json_array_size(mol); k++) {
                int li;
                QD_TRY(as_int(c, where, "mlp_only_layers[]", json_array_get(mol, k), &li));
                if (li >= 0 && li < o->n_layers) mlp_only[li] = true;  /* others name no layer */
            }
        }
        for (int i = 0; i < o->n_layers; i++) {
            bool moe = o->n_experts > 0 && !mlp_only[i] && (i + 1) % step == 0;
            o->ffn_kind[i] = moe ? QD_FFN_MOE : QD_FFN_DENSE;
            n_moe += moe;
        }
    }
    if (n_moe < o->n_layers) QD_TRY(req_dim(c, "intermediate_size", &o->intermediate_size));
    else QD_TRY(get_int(c, "intermediate_size", false, 0, &o->intermediate_size));
    if (o->intermediate_size < 0 || o->intermediate_size > CFG_MAX_DIM)
        return qd_seterr(c->err, QD_ERR_FORMAT, "%s: intermediate_size = %d is out of range", c->what,
                         o->intermediate_size);
    if (n_moe > 0) {
        if (o->arch == QD_ARCH_QWEN3_5_MOE) QD_TRY(req_dim(c, "num_experts", &o->n_experts));
        QD_TRY(req_dim(c, "num_experts_per_tok", &o->n_experts_per_tok));
        QD_TRY(req_dim(c, "moe_intermediate_size", &o->moe_intermediate_size));
        QD_TRY(get_int(c, "shared_expert_intermediate_size", false, 0, &o->shared_expert_intermediate_size));
        if (o->shared_expert_intermediate_size < 0 || o->shared_expert_intermediate_size > CFG_MAX_DIM)
            return qd_seterr(c->err, QD_ERR_FORMAT, "%s: shared_expert_intermediate_size = %d is out of range",
                             c->what, o->shared_expert_intermediate_size);
        if (o->n_experts > 65536)
            return qd_seterr(c->err, QD_ERR_UNSUPPORTED, "%s: num_experts = %d is more than 65536", c->what,
                             o->n_experts);
        if (o->n_experts_per_tok > o->n_experts)
            return qd_seterr(c->err, QD_ERR_FORMAT, "%s: num_experts_per_tok = %d exceeds num_experts = %d", c->what,
                             o->n_experts_per_tok, o->n_experts);
    } else {
        o->n_experts = 0;
    }
    QD_TRY(get_int(c, "mtp_num_hidden_layers", false, 0, &o->mtp_layers));
    if (o->mtp_layers < 0 || o->mtp_layers > 64)
        return qd_seterr(c->err, QD_ERR_FORMAT, "%s: mtp_num_hidden_layers = %d is out of range", c->what,
                         o->mtp_layers);
    /* Qwen3.5-MoE has no such field and always renormalises (model-spec 1.2). */
    if (o->arch == QD_ARCH_QWEN3_5_MOE) o->norm_topk_prob = true;
    else QD_TRY(get_bool(c, "norm_topk_prob", true, &o->norm_topk_prob));
    return QD_OK;
}

static qd_status read_token_ids(const cfg *c, qd_config *o) {
    QD_TRY(get_int(c, "bos_token_id", false, -1, &o->bos_token_id));
    if (o->bos_token_id < -1)
        return qd_seterr(c->err, QD_ERR_FORMAT, "%s: bos_token_id = %d is negative", c->what, o->bos_token_id);
    const char *where;
    const json_t *e = lookup(c, "eos_token_id", &where);
    o->n_eos = 0;
    if (!e) return QD_OK;
    size_t n = json_is_array(e) ? json_array_size(e) : 1;
    if (n > QD_MAX_EOS)
        return qd_seterr(c->err, QD_ERR_UNSUPPORTED, "%s: %zu eos_token_id values, at most %d supported", c->what, n,
                         QD_MAX_EOS);
    for (size_t i = 0; i < n; i++) {
        const json_t *v = json_is_array(e) ? json_array_get(e, i) : e;
        int id = 0;
        QD_TRY(as_int(c, where, "eos_token_id", v, &id));
        if (id < 0) return qd_seterr(c->err, QD_ERR_FORMAT, "%s: eos_token_id %d is negative", c->what, id);
        o->eos_token_ids[o->n_eos++] = id;
    }
    return QD_OK;
}

/* The engine forms these products in int; refuse configs where they would overflow. */
static qd_status check_products(const cfg *c, const qd_config *o) {
    const struct { const char *what; int64_t v; } p[] = {
        {"conv_dim (2*HK*dk + HV*dv)", 2LL * o->gdn_hk * o->gdn_dk + (int64_t)o->gdn_hv * o->gdn_dv},
        {"2*num_attention_heads*head_dim", 2LL * o->attn_nq * o->attn_head_dim},
        {"num_key_value_heads*head_dim", (int64_t)o->attn_nkv * o->attn_head_dim},
        {"num_experts*moe_intermediate_size*2", 2LL * o->n_experts * o->moe_intermediate_size},
    };
    for (size_t i = 0; i < sizeof p / sizeof p[0]; i++)
        if (p[i].v > INT_MAX / 2)
            return qd_seterr(c->err, QD_ERR_FORMAT, "%s: %s = %lld is implausibly large", c->what, p[i].what,
                             (long long)p[i].v);
    return QD_OK;
}

static qd_status parse_root(cfg *c, qd_config *o) {
    if (!json_is_object(c->top))
        return qd_seterr(c->err, QD_ERR_FORMAT, "%s: config must be a JSON object, got %s", c->what,
                         qd_json_type_name(c->top));
    QD_TRY(resolve_arch(c, o));
    QD_TRY(req_dim(c, "hidden_size", &o->hidden_size));
    QD_TRY(get_int(c, "num_hidden_layers", true, 0, &o->n_layers));
    if (o->n_layers <= 0)
        return qd_seterr(c->err, QD_ERR_FORMAT, "%s: num_hidden_layers = %d must be positive", c->what, o->n_layers);
    if (o->n_layers > QD_MAX_LAYERS)
        return qd_seterr(c->err, QD_ERR_UNSUPPORTED, "%s: num_hidden_layers = %d exceeds the supported %d", c->what,
                         o->n_layers, QD_MAX_LAYERS);
    QD_TRY(req_dim(c, "vocab_size", &o->vocab_size));
    double eps;
    QD_TRY(get_num(c, NULL, NULL, "rms_norm_eps", 1e-6, &eps));
    if (!(eps > 0 && eps < 1))
        return qd_seterr(c->err, QD_ERR_FORMAT, "%s: rms_norm_eps = %g must be in (0, 1)", c->what, eps);
    o->rms_norm_eps = (float)eps;
    /* Composite configs: text_config first, then the top level (lookup order). */
    QD_TRY(get_bool(c, "tie_word_embeddings", false, &o->tie_word_embeddings));

    QD_TRY(read_layer_plan(c, o));

    QD_TRY(req_dim(c, "linear_num_key_heads", &o->gdn_hk));
    QD_TRY(req_dim(c, "linear_num_value_heads", &o->gdn_hv));
    QD_TRY(req_dim(c, "linear_key_head_dim", &o->gdn_dk));
    QD_TRY(req_dim(c, "linear_value_head_dim", &o->gdn_dv));
    QD_TRY(req_dim(c, "linear_conv_kernel_dim", &o->gdn_conv_kernel));
    if (o->gdn_hv % o->gdn_hk != 0)
        return qd_seterr(c->err, QD_ERR_FORMAT,
                         "%s: linear_num_value_heads %d is not a multiple of linear_num_key_heads %d", c->what,
                         o->gdn_hv, o->gdn_hk);

    QD_TRY(req_dim(c, "num_attention_heads", &o->attn_nq));
    QD_TRY(req_dim(c, "num_key_value_heads", &o->attn_nkv));
    if (o->attn_nq % o->attn_nkv != 0)
        return qd_seterr(c->err, QD_ERR_FORMAT,
                         "%s: num_attention_heads %d is not a multiple of num_key_value_heads %d", c->what, o->attn_nq,
                         o->attn_nkv);
    /* transformers' Qwen3NextConfig / Qwen3_5TextConfig default head_dim to 256 (not
     * hidden_size / num_attention_heads as in Llama-style configs); a config without the
     * field must mean what it means to transformers. */
    QD_TRY(get_int(c, "head_dim", false, 256, &o->attn_head_dim));
    QD_TRY(check_dim(c, "head_dim", o->attn_head_dim));
    QD_TRY(get_bool(c, "attn_output_gate", true, &o->attn_output_gate));
    QD_TRY(read_rope(c, o));

    QD_TRY(read_ffn(c, o));
    QD_TRY(get_int(c, "max_position_embeddings", false, 32768, &o->max_position_embeddings));
    if (o->max_position_embeddings <= 0)
        return qd_seterr(c->err, QD_ERR_FORMAT, "%s: max_position_embeddings = %d must be positive", c->what,
                         o->max_position_embeddings);
    QD_TRY(read_token_ids(c, o));
    const char *where;
    const json_t *qc = lookup(c, "quantization_config", &where);
    QD_TRY(qd_quant_config_parse(qc, c->what, false, &o->quant, c->err));
    return check_products(c, o);
}

qd_status qd_config_parse(const char *json_text, size_t len, const char *what, qd_config *out, qd_err *err) {
    if (!what) what = "config.json";
    if (!out || (!json_text && len)) return qd_seterr(err, QD_ERR_INVALID_ARG, "%s: NULL argument", what);
    memset(out, 0, sizeof *out);
    /* Parse into a local copy so *out is never left half-filled on failure. */
    qd_config *o = calloc(1, sizeof *o);
    if (!o) return qd_seterr(err, QD_ERR_OOM, "%s: out of memory", what);
    cfg c = {.what = what, .err = err};
    qd_status s = qd_json_parse(json_text ? json_text : "", len, what, &c.top, err);
    if (s == QD_OK) {
        s = parse_root(&c, o);
        json_decref(c.top);
    }
    if (s == QD_OK) *out = *o;
    free(o);
    return s;
}

/* ModelOpt exports keep their scheme in DIR/hf_quant_config.json ({"quantization": {...}});
 * where config.json names one too, the two must be the same method. */
static qd_status load_modelopt_file(const char *dir, qd_config *out, qd_err *err) {
    char path[4096];
    snprintf(path, sizeof path, "%s/hf_quant_config.json", dir);
    FILE *f = fopen(path, "rb");
    if (!f) return QD_OK;
    fclose(f);
    char *text;
    size_t len;
    QD_TRY(qd_read_file(path, CFG_MAX_FILE, &text, &len, err));
    json_t *top;
    qd_status s = qd_json_parse(text, len, path, &top, err);
    free(text);
    if (s != QD_OK) return s;
    const json_t *qc = json_object_get(top, "quantization");
    if (!json_is_object(qc)) {
        s = qd_seterr(err, QD_ERR_FORMAT, "%s: no 'quantization' object", path);
    } else if (out->quant.method != QD_QUANT_NONE && out->quant.method != QD_QUANT_MODELOPT) {
        s = qd_seterr(err, QD_ERR_FORMAT, "%s: modelopt quantization, but config.json says quant_method '%s'", path,
                      out->quant.method_name);
    } else {
        qd_quant_config q;
        s = qd_quant_config_parse(qc, path, true, &q, err);
        if (s == QD_OK) out->quant = q;
    }
    json_decref(top);
    return s;
}

qd_status qd_config_load(const char *dir, qd_config *out, qd_err *err) {
    size_t n = strlen(dir) + sizeof "/config.json";
    char *path = malloc(n);
    if (!path) return qd_seterr(err, QD_ERR_OOM, "out of memory");
    snprintf(path, n, "%s/config.json", dir);
    char *text;
    size_t len;
    qd_status s = qd_read_file(path, CFG_MAX_FILE, &text, &len, err);
    if (s == QD_OK) {
        s = qd_config_parse(text, len, path, out, err);
        free(text);
    }
    free(path);
    return s == QD_OK ? load_modelopt_file(dir, out, err) : s;
}

int qd_config_n_gdn_layers(const qd_config *c) {
    int n = 0;
    for (int i = 0; i < c->n_layers && i < QD_MAX_LAYERS; i++) n += c->layer_kind[i] == QD_LAYER_GDN;
    return n;
}

int qd_config_n_attn_layers(const qd_config *c) {
    int n = 0;
    for (int i = 0; i < c->n_layers && i < QD_MAX_LAYERS; i++) n += c->layer_kind[i] == QD_LAYER_ATTN;
    return n;
}
