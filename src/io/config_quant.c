/* quantization_config (config.json) and ModelOpt's hf_quant_config.json -> qd_quant_config
 * (model-spec section 8). Only what the loader needs to check the tensors against is kept;
 * every method, format, bit width and layout this engine cannot load exactly is refused
 * here by name, before a tensor is read. */
#include <stdio.h>
#include <string.h>

#include "io/config.h"
#include "io/json_util.h"
#include "io/quant_match.h"

#define SUPPORTED_METHODS                                                                               \
    "fp8, compressed-tensors (float-quantized, nvfp4-pack-quantized, pack-quantized int4), modelopt (NVFP4, " \
    "FP8), gptq, awq, auto-round (int4)"

static const char *str_of(const json_t *o, const char *key) {
    const json_t *v = json_object_get(o, key);
    return json_is_string(v) ? json_string_value(v) : NULL;
}

static qd_status int_of(const json_t *o, const char *key, const char *what, int def, int *out, qd_err *err) {
    const json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v)) { *out = def; return QD_OK; }
    if (!json_is_integer(v))
        return qd_seterr(err, QD_ERR_FORMAT, "%s: quantization field '%s' must be an integer, got %s", what, key,
                         qd_json_type_name(v));
    *out = (int)json_integer_value(v);
    return QD_OK;
}

static bool bool_of(const json_t *o, const char *key, bool def) {
    const json_t *v = json_object_get(o, key);
    return json_is_boolean(v) ? json_is_true(v) : def;
}

/* One exclusion entry, appended; "re:" entries must be tame and compile as written and as
 * matched (quant_match.h), so every list accepted here makes a matcher. Whether the list
 * is complete (has_exclusions: every plain module must be on it) is the caller's call. */
static qd_status add_exclusion(const char *s, const char *key, size_t i, const char *what, qd_quant_config *q,
                               qd_err *err) {
    size_t used = 0;
    for (int k = 0; k < q->n_excluded; k++) used += strlen(q->excluded + used) + 1;
    const size_t n = strlen(s) + 1;
    if (used + n > sizeof q->excluded)
        return qd_seterr(err, QD_ERR_UNSUPPORTED, "%s: quantization list '%s' is longer than the supported %d bytes",
                         what, key, QD_QUANT_EXCLUDE_BYTES);
    if (!strncmp(s, "re:", 3)) {
        char entry[512];
        snprintf(entry, sizeof entry, "%.200s: %.64s[%zu] '%.200s'", what, key, i, s);
        QD_TRY(qd_quant_regex_error(qd_quant_regex_check(s + 3), entry, err));
    }
    memcpy(q->excluded + used, s, n);
    q->n_excluded++;
    return QD_OK;
}

static qd_status add_exclusions(const json_t *list, const char *key, const char *what, qd_quant_config *q,
                                qd_err *err) {
    if (!list || json_is_null(list)) return QD_OK;
    if (!json_is_array(list))
        return qd_seterr(err, QD_ERR_FORMAT, "%s: quantization field '%s' must be a list of module names, got %s",
                         what, key, qd_json_type_name(list));
    q->has_exclusions = true;
    size_t i;
    json_t *e;
    json_array_foreach(list, i, e) {
        if (!json_is_string(e))
            return qd_seterr(err, QD_ERR_FORMAT, "%s: %s[%zu] must be a string, got %s", what, key, i,
                             qd_json_type_name(e));
        QD_TRY(add_exclusion(json_string_value(e), key, i, what, q, err));
    }
    return QD_OK;
}

static qd_status unsupported(const char *what, const char *field, const char *value, const char *why, qd_err *err) {
    return qd_seterr(err, QD_ERR_UNSUPPORTED, "%s: quantization %s '%.64s' is not supported%s%s", what, field,
                     value ? value : "(not a string)", why ? ": " : "", why ? why : "");
}

static qd_status block_size(const json_t *v, const char *key, const char *what, qd_quant_config *q, qd_err *err) {
    if (!v || json_is_null(v)) return QD_OK;
    if (!json_is_array(v) || json_array_size(v) != 2 || !json_is_integer(json_array_get(v, 0)) ||
        !json_is_integer(json_array_get(v, 1)))
        return qd_seterr(err, QD_ERR_FORMAT, "%s: quantization field '%s' must be two integers", what, key);
    q->block_rows = (int)json_integer_value(json_array_get(v, 0));
    q->block_cols = (int)json_integer_value(json_array_get(v, 1));
    if (q->block_rows < 1 || q->block_cols < 1 || q->block_rows > 65536 || q->block_cols > 65536)
        return qd_seterr(err, QD_ERR_FORMAT, "%s: quantization %s [%d, %d] is out of range", what, key, q->block_rows,
                         q->block_cols);
    return QD_OK;
}

/* An int4 group size: an even number of columns, or -1 for one group a row. */
static qd_status check_group(const char *what, const qd_quant_config *q, qd_err *err) {
    if (q->group_size != -1 && (q->group_size < 2 || q->group_size % 2))
        return qd_seterr(err, QD_ERR_UNSUPPORTED, "%s: group_size %d is not supported (an even size or -1)", what,
                         q->group_size);
    return QD_OK;
}

/* compressed-tensors pack-quantized integer weights (llm-compressor's W4A16, GPTQ and AWQ
 * alike): 4 bits, per group or per output channel, symmetric or with zero points, act-order
 * as a g_idx; weight-only, since activations are computed in 16 bits here. */
static qd_status parse_ct_int(const json_t *g, const json_t *wq, int bits, const char *what, qd_quant_config *q,
                              qd_err *err) {
    const char *type = str_of(wq, "type"), *strategy = str_of(wq, "strategy");
    if (!type || strcmp(type, "int"))
        return unsupported(what, "weights type", type, "pack-quantized weights must be integers", err);
    if (bits != 4)
        return qd_seterr(err, QD_ERR_UNSUPPORTED, "%s: compressed-tensors pack-quantized num_bits %d is not supported "
                         "(4-bit integer weights only)", what, bits);
    const json_t *act = json_object_get(g, "input_activations");
    if (act && !json_is_null(act))
        return qd_seterr(err, QD_ERR_UNSUPPORTED, "%s: compressed-tensors pack-quantized with quantized "
                         "input_activations (W4A8) is not supported; weight-only W4A16 is", what);
    q->method = QD_QUANT_CT_INT4;
    q->bits = 4;
    if (!strategy) return qd_seterr(err, QD_ERR_NOT_FOUND, "%s: compressed-tensors weights without 'strategy'", what);
    if (!strcmp(strategy, "group")) {
        QD_TRY(int_of(wq, "group_size", what, 0, &q->group_size, err));
        QD_TRY(check_group(what, q, err));
    } else if (!strcmp(strategy, "channel")) {
        q->group_size = -1;
    } else {
        return unsupported(what, "int4 weight strategy", strategy, "expected group or channel", err);
    }
    q->sym = bool_of(wq, "symmetric", true);
    const json_t *order = json_object_get(wq, "actorder");
    const char *os = json_is_string(order) ? json_string_value(order) : NULL;
    if (json_is_true(order) || (os && !strcmp(os, "group"))) {
        q->desc_act = true; /* a weight_g_idx per module */
    } else if (order && !json_is_null(order) && !json_is_false(order) && !(os && (!strcmp(os, "weight") ||
                                                                                   !strcmp(os, "static")))) {
        return unsupported(what, "actorder", os, "expected group, weight, static or null", err);
    }
    return QD_OK;
}

static qd_status parse_fp8(const json_t *qc, const char *what, qd_quant_config *q, qd_err *err) {
    q->method = QD_QUANT_FP8;
    const char *fmt = str_of(qc, "fmt");
    if (fmt && strcmp(fmt, "e4m3"))
        return unsupported(what, "fmt", fmt, "FP8 weights are read as e4m3 only", err);
    QD_TRY(block_size(json_object_get(qc, "weight_block_size"), "weight_block_size", what, q, err));
    q->match = QD_QUANT_MATCH_SUBSTRING;
    return add_exclusions(json_object_get(qc, "modules_to_not_convert"), "modules_to_not_convert", what, q, err);
}

/* compressed-tensors: one config group of weights (its `targets` are Linear layers). */
static qd_status parse_ct(const json_t *qc, const char *what, qd_quant_config *q, qd_err *err) {
    const char *format = str_of(qc, "format");
    snprintf(q->method_name, sizeof q->method_name, "compressed-tensors %s", format ? format : "(no format)");
    const json_t *groups = json_object_get(qc, "config_groups");
    if (!json_is_object(groups) || json_object_size(groups) != 1)
        return qd_seterr(err, QD_ERR_UNSUPPORTED,
                         "%s: compressed-tensors config_groups must hold exactly one group (mixed schemes are not "
                         "supported)", what);
    const json_t *g = json_object_iter_value(json_object_iter((json_t *)groups));
    const json_t *wq = json_object_get(g, "weights");
    if (!json_is_object(wq)) return qd_seterr(err, QD_ERR_FORMAT, "%s: config_groups group has no 'weights'", what);
    int bits = 0;
    QD_TRY(int_of(wq, "num_bits", what, 0, &bits, err));
    const char *type = str_of(wq, "type"), *strategy = str_of(wq, "strategy");
    if (!format) return qd_seterr(err, QD_ERR_NOT_FOUND, "%s: compressed-tensors config without 'format'", what);
    if (!strcmp(format, "float-quantized") || !strcmp(format, "naive-quantized")) {
        if (bits != 8 || !type || strcmp(type, "float"))
            return unsupported(what, "weights type", type, "float-quantized weights must be 8-bit float (e4m3)", err);
        q->method = QD_QUANT_CT_FP8;
        if (!strategy) return qd_seterr(err, QD_ERR_NOT_FOUND, "%s: compressed-tensors weights without 'strategy'", what);
        if (!strcmp(strategy, "block"))
            QD_TRY(block_size(json_object_get(wq, "block_structure"), "block_structure", what, q, err));
        else if (strcmp(strategy, "channel") && strcmp(strategy, "tensor"))
            return unsupported(what, "FP8 weight strategy", strategy, "expected channel, tensor or block", err);
    } else if (!strcmp(format, "pack-quantized")) {
        QD_TRY(parse_ct_int(g, wq, bits, what, q, err));
    } else if (!strcmp(format, "nvfp4-pack-quantized")) {
        if (bits != 4 || !type || strcmp(type, "float"))
            return unsupported(what, "weights type", type, "nvfp4-pack-quantized weights must be 4-bit float", err);
        QD_TRY(int_of(wq, "group_size", what, 16, &q->group_size, err));
        if (q->group_size != 16) return qd_seterr(err, QD_ERR_UNSUPPORTED, "%s: NVFP4 group_size %d (must be 16)", what, q->group_size);
        q->method = QD_QUANT_CT_NVFP4;
    } else {
        return unsupported(what, "compressed-tensors format", format,
                           "supported are float-quantized, nvfp4-pack-quantized and pack-quantized", err);
    }
    q->match = QD_QUANT_MATCH_NAME;
    return add_exclusions(json_object_get(qc, "ignore"), "ignore", what, q, err);
}

static qd_status parse_modelopt(const json_t *qc, const char *what, qd_quant_config *q, qd_err *err) {
    const char *algo = str_of(qc, "quant_algo");
    if (!algo) return qd_seterr(err, QD_ERR_NOT_FOUND, "%s: modelopt quantization without 'quant_algo'", what);
    snprintf(q->method_name, sizeof q->method_name, "modelopt %s", algo);
    q->method = QD_QUANT_MODELOPT;
    if (!strcmp(algo, "NVFP4")) {
        QD_TRY(int_of(qc, "group_size", what, 16, &q->group_size, err));
        if (q->group_size != 16)
            return qd_seterr(err, QD_ERR_UNSUPPORTED, "%s: NVFP4 group_size %d (must be 16)", what, q->group_size);
    } else if (strcmp(algo, "FP8")) {
        return unsupported(what, "quant_algo", algo, "modelopt checkpoints load as NVFP4 or FP8", err);
    }
    const char *kv = str_of(qc, "kv_cache_quant_algo");
    if (kv && strcmp(kv, "none") && strcmp(kv, "None"))
        return unsupported(what, "kv_cache_quant_algo", kv, "the KV cache is kept in the engine's own precision", err);
    q->match = QD_QUANT_MATCH_WILDCARD;
    const json_t *ex = json_object_get(qc, "exclude_modules");
    if (!ex) ex = json_object_get(qc, "ignore");
    return add_exclusions(ex, "exclude_modules", what, q, err);
}

/* GPTQModel's `dynamic` rules, each a pattern matched from the start of a module's name:
 * "-:pattern" leaves the modules it matches unconverted (a partial list: modules it does not
 * name may be plain too, as in a GPTQ config without one); a positive rule ("+:pattern" or a
 * bare one) may restate the global scheme but not change it (mixed bit widths and groups
 * are refused). */
static qd_status parse_gptq_dynamic(const json_t *dyn, const char *what, qd_quant_config *q, qd_err *err) {
    if (!dyn || json_is_null(dyn)) return QD_OK;
    if (!json_is_object(dyn)) return qd_seterr(err, QD_ERR_FORMAT, "%s: gptq 'dynamic' must be an object", what);
    const char *key;
    const json_t *rule;
    size_t i = 0;
    json_object_foreach((json_t *)dyn, key, rule) {
        if (!json_is_object(rule))
            return qd_seterr(err, QD_ERR_FORMAT, "%s: gptq dynamic['%.200s'] must be an object", what, key);
        if (!strncmp(key, "-:", 2)) {
            char buf[1100];
            snprintf(buf, sizeof buf, "re:%.1000s", key + 2);
            QD_TRY(add_exclusion(buf, "dynamic", i++, what, q, err));
            continue;
        }
        int bits = q->bits, group = q->group_size;
        QD_TRY(int_of(rule, "bits", what, q->bits, &bits, err));
        QD_TRY(int_of(rule, "group_size", what, q->group_size, &group, err));
        if (bits != q->bits || group != q->group_size || bool_of(rule, "sym", q->sym) != q->sym ||
            bool_of(rule, "desc_act", q->desc_act) != q->desc_act)
            return qd_seterr(err, QD_ERR_UNSUPPORTED,
                             "%s: gptq dynamic rule '%.200s' gives its modules a scheme of their own (bits %d, "
                             "group_size %d): per-module schemes are not supported", what, key, bits, group);
        i++;
    }
    return QD_OK;
}

static qd_status parse_int4(const json_t *qc, const char *what, bool awq, qd_quant_config *q, qd_err *err) {
    q->method = awq ? QD_QUANT_AWQ : QD_QUANT_GPTQ;
    QD_TRY(int_of(qc, awq ? "w_bit" : "bits", what, 0, &q->bits, err));
    if (awq && q->bits == 0) QD_TRY(int_of(qc, "bits", what, 0, &q->bits, err));
    if (q->bits != 4)
        return qd_seterr(err, QD_ERR_UNSUPPORTED, "%s: %s bits %d is not supported (4-bit only)", what,
                         awq ? "awq" : "gptq", q->bits);
    QD_TRY(int_of(qc, awq ? "q_group_size" : "group_size", what, 0, &q->group_size, err));
    if (awq && q->group_size == 0) QD_TRY(int_of(qc, "group_size", what, 0, &q->group_size, err));
    QD_TRY(check_group(what, q, err));
    if (awq) {
        q->sym = !bool_of(qc, "zero_point", true);
        const char *ver = str_of(qc, "version");
        if (ver && strcmp(ver, "gemm") && strcmp(ver, "GEMM"))
            return unsupported(what, "awq version", ver, "only the GEMM packing is read", err);
    } else {
        q->sym = bool_of(qc, "sym", true);
        q->desc_act = bool_of(qc, "desc_act", false);
        const char *cf = str_of(qc, "checkpoint_format");
        if (!cf || !strcmp(cf, "gptq")) q->gptq_version = 1;
        else if (!strcmp(cf, "gptq_v2")) q->gptq_version = 2;
        else return unsupported(what, "gptq checkpoint_format", cf, "expected gptq or gptq_v2", err);
        QD_TRY(parse_gptq_dynamic(json_object_get(qc, "dynamic"), what, q, err));
    }
    q->match = QD_QUANT_MATCH_SUBSTRING;
    return add_exclusions(json_object_get(qc, "modules_to_not_convert"), "modules_to_not_convert", what, q, err);
}

/* A prefix of AutoRound's block_name_to_quantize, kept with its other spelling: AutoRound
 * names a composite Qwen3.5's layers "model.layers" in some fields and
 * "model.language_model.layers" in others. */
static qd_status add_block(const char *b, size_t n, const char *what, qd_quant_config *q, qd_err *err) {
    static const char text[] = "model.", composite[] = "model.language_model.";
    char names[2][256];
    int k = 0;
    if (n == 0 || n >= 200)
        return qd_seterr(err, QD_ERR_FORMAT, "%s: a block_name_to_quantize entry is empty or too long", what);
    snprintf(names[k++], sizeof names[0], "%.*s", (int)n, b);
    if (!strncmp(b, composite, sizeof composite - 1))
        snprintf(names[k++], sizeof names[0], "%s%.*s", text, (int)(n - (sizeof composite - 1)),
                 b + sizeof composite - 1);
    else if (!strncmp(b, text, sizeof text - 1))
        snprintf(names[k++], sizeof names[0], "%s%.*s", composite, (int)(n - (sizeof text - 1)),
                 b + sizeof text - 1);
    size_t used = 0;
    for (int i = 0; i < q->n_blocks; i++) used += strlen(q->blocks + used) + 1;
    for (int i = 0; i < k; i++) {
        const size_t len = strlen(names[i]) + 1;
        if (used + len > sizeof q->blocks)
            return qd_seterr(err, QD_ERR_UNSUPPORTED,
                             "%s: block_name_to_quantize is longer than the supported %d bytes", what,
                             QD_QUANT_BLOCK_BYTES);
        memcpy(q->blocks + used, names[i], len);
        used += len;
        q->n_blocks++;
    }
    return QD_OK;
}

/* AutoRound's extra_config entry `key` that leaves its modules unquantized: a module name
 * (also under the composite spelling) or, where it holds a regex character, a pattern
 * searched anywhere in the name (Python's re.search, as AutoRound and vLLM read it). */
static qd_status add_autoround_exclusion(const char *key, size_t i, const char *what, qd_quant_config *q,
                                         qd_err *err) {
    char buf[1100];
    if (strpbrk(key, "*+?^$()[]{}|\\")) {
        snprintf(buf, sizeof buf, "re:.*(%.1000s)", key);
        return add_exclusion(buf, "extra_config", i, what, q, err);
    }
    QD_TRY(add_exclusion(key, "extra_config", i, what, q, err));
    if (!strncmp(key, "model.layers.", 13)) {
        snprintf(buf, sizeof buf, "model.language_model.%.1000s", key + 6);
        QD_TRY(add_exclusion(buf, "extra_config", i, what, q, err));
    }
    return QD_OK;
}

/* AutoRound (quant_method auto-round): int4 in GPTQ's packing (auto_round:auto_gptq, zeros
 * stored minus one as GPTQ v1) or AWQ's (auto_round:auto_awq); its extra_config gives the
 * modules left in 16 bits, and modules outside block_name_to_quantize (where the config names
 * none, the decoder layers, as AutoRound's loader finds them) are not converted either. A
 * module given a scheme of its own (other bits or groups) is refused. */
static qd_status parse_autoround(const json_t *qc, const char *what, qd_quant_config *q, qd_err *err) {
    const char *pack = str_of(qc, "packing_format"), *dt = str_of(qc, "data_type");
    if (dt && strcmp(dt, "int")) return unsupported(what, "auto-round data_type", dt, "integer weights only", err);
    if (!pack) return qd_seterr(err, QD_ERR_NOT_FOUND, "%s: auto-round quantization without 'packing_format'", what);
    const bool awq = !strcmp(pack, "auto_round:auto_awq");
    if (!awq && strcmp(pack, "auto_round:auto_gptq"))
        return unsupported(what, "auto-round packing_format", pack,
                           "expected auto_round:auto_gptq or auto_round:auto_awq", err);
    snprintf(q->method_name, sizeof q->method_name, "auto-round %s", pack);
    q->method = awq ? QD_QUANT_AWQ : QD_QUANT_GPTQ;
    q->gptq_version = awq ? 0 : 1;
    QD_TRY(int_of(qc, "bits", what, 4, &q->bits, err));
    if (q->bits != 4)
        return qd_seterr(err, QD_ERR_UNSUPPORTED, "%s: auto-round bits %d is not supported (4-bit only)", what,
                         q->bits);
    QD_TRY(int_of(qc, "group_size", what, 128, &q->group_size, err));
    QD_TRY(check_group(what, q, err));
    q->sym = bool_of(qc, "sym", true);
    q->match = QD_QUANT_MATCH_NAME;
    q->has_exclusions = true;
    const json_t *blocks = json_object_get(qc, "block_name_to_quantize");
    if (!blocks) blocks = json_object_get(qc, "to_quant_block_names");
    if (json_is_string(blocks)) {
        for (const char *b = json_string_value(blocks); *b;) { /* comma-separated */
            const size_t n = strcspn(b, ",");
            QD_TRY(add_block(b, n, what, q, err));
            b += n + (b[n] == ',');
        }
    } else if (json_is_array(blocks)) {
        size_t i;
        json_t *b;
        json_array_foreach(blocks, i, b) {
            if (!json_is_string(b))
                return qd_seterr(err, QD_ERR_FORMAT, "%s: block_name_to_quantize[%zu] must be a string", what,
                                 i);
            QD_TRY(add_block(json_string_value(b), json_string_length(b), what, q, err));
        }
    } else if (blocks && !json_is_null(blocks)) {
        return qd_seterr(err, QD_ERR_FORMAT, "%s: block_name_to_quantize must be a string or a list of strings",
                         what);
    } else { /* none named: AutoRound quantizes the model's decoder layers (its get_block_names) */
        QD_TRY(add_block("model.layers", strlen("model.layers"), what, q, err));
    }
    if (!q->n_blocks) return qd_seterr(err, QD_ERR_FORMAT, "%s: block_name_to_quantize names no block", what);
    const json_t *extra = json_object_get(qc, "extra_config");
    if (extra && !json_is_null(extra) && !json_is_object(extra))
        return qd_seterr(err, QD_ERR_FORMAT, "%s: auto-round extra_config must be an object", what);
    const char *key;
    const json_t *e;
    size_t i = 0;
    json_object_foreach((json_t *)extra, key, e) {
        int bits = q->bits, group = q->group_size;
        if (!json_is_object(e))
            return qd_seterr(err, QD_ERR_FORMAT, "%s: extra_config['%.200s'] must be an object", what, key);
        QD_TRY(int_of(e, "bits", what, q->bits, &bits, err));
        QD_TRY(int_of(e, "group_size", what, q->group_size, &group, err));
        const char *edt = str_of(e, "data_type");
        const bool plain = bits >= 16 || (edt && (!strcmp(edt, "fp") || !strcmp(edt, "float")));
        if (plain) {
            QD_TRY(add_autoround_exclusion(key, i, what, q, err));
        } else if (bits != q->bits || group != q->group_size || bool_of(e, "sym", q->sym) != q->sym ||
                   (edt && strcmp(edt, "int"))) {
            return qd_seterr(err, QD_ERR_UNSUPPORTED,
                             "%s: auto-round extra_config gives '%.200s' a scheme of its own (bits %d, group_size %d): "
                             "per-module schemes are not supported", what, key, bits, group);
        }
        i++;
    }
    return QD_OK;
}

qd_status qd_quant_config_parse(const json_t *qc, const char *what, bool modelopt_file, qd_quant_config *q,
                                qd_err *err) {
    memset(q, 0, sizeof *q);
    if (!qc || json_is_null(qc)) return QD_OK;
    if (!json_is_object(qc))
        return qd_seterr(err, QD_ERR_FORMAT, "%s: quantization_config must be an object, got %s", what,
                         qd_json_type_name(qc));
    const char *m = modelopt_file ? "modelopt" : str_of(qc, "quant_method");
    if (!m) return qd_seterr(err, QD_ERR_NOT_FOUND, "%s: quantization_config without a 'quant_method'", what);
    snprintf(q->method_name, sizeof q->method_name, "%s", m);
    if (!strcmp(m, "fp8")) return parse_fp8(qc, what, q, err);
    if (!strcmp(m, "compressed-tensors")) return parse_ct(qc, what, q, err);
    if (!strcmp(m, "modelopt")) return parse_modelopt(qc, what, q, err);
    if (!strcmp(m, "gptq")) return parse_int4(qc, what, false, q, err);
    if (!strcmp(m, "awq")) return parse_int4(qc, what, true, q, err);
    if (!strcmp(m, "auto-round") || !strcmp(m, "intel/auto-round")) return parse_autoround(qc, what, q, err);
    return qd_seterr(err, QD_ERR_UNSUPPORTED, "%s: quant_method '%.64s' is not supported (supported: %s)", what, m,
                     SUPPORTED_METHODS);
}
