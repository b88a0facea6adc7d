#include "io/generation_config.h"

#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "io/json_util.h"

static qd_status read_number(json_t *root, const char *key, const char *path, double *out, bool *present, qd_err *err) {
    json_t *v = json_object_get(root, key);
    if (!v || json_is_null(v)) return QD_OK;
    if (!json_is_number(v))
        return qd_seterr(err, QD_ERR_FORMAT, "%s: field '%s' must be a number, got %s", path, key, qd_json_type_name(v));
    *out = json_number_value(v);
    *present = true;
    return QD_OK;
}

qd_status qd_generation_config_load(const char *dir, qd_generation_config *out, qd_err *err) {
    memset(out, 0, sizeof *out);
    out->temperature = 1.0f;
    out->top_p = 1.0f;
    out->repetition_penalty = 1.0f;
    char path[4096];
    snprintf(path, sizeof path, "%s/generation_config.json", dir);
    struct stat st;
    if (stat(path, &st) != 0) return QD_OK;
    char *text;
    size_t len;
    QD_TRY(qd_read_file(path, 1 << 20, &text, &len, err));
    json_t *root;
    qd_status s = qd_json_parse(text, len, path, &root, err);
    free(text);
    if (s != QD_OK) return s;
    if (!json_is_object(root)) {
        json_decref(root);
        return qd_seterr(err, QD_ERR_FORMAT, "%s: expected a JSON object", path);
    }
    json_t *eos = json_object_get(root, "eos_token_id");
    if (json_is_integer(eos)) {
        out->eos_token_ids[out->n_eos++] = (int)json_integer_value(eos);
    } else if (json_is_array(eos)) {
        size_t i;
        json_t *e;
        json_array_foreach(eos, i, e) {
            if (!json_is_integer(e) || out->n_eos == QD_MAX_EOS) {
                json_decref(root);
                return qd_seterr(err, QD_ERR_FORMAT, "%s: eos_token_id must be an integer or a list of at most %d integers",
                                 path, QD_MAX_EOS);
            }
            out->eos_token_ids[out->n_eos++] = (int)json_integer_value(e);
        }
    } else if (eos && !json_is_null(eos)) {
        json_decref(root);
        return qd_seterr(err, QD_ERR_FORMAT, "%s: eos_token_id must be an integer or a list, got %s", path,
                         qd_json_type_name(eos));
    }
    double v;
    bool present = false;
    json_t *ds = json_object_get(root, "do_sample");
    if (json_is_boolean(ds)) {
        out->do_sample = json_is_true(ds);
        out->has_sampling = true;
    }
    if ((s = read_number(root, "temperature", path, &v, &present, err)) == QD_OK && present) out->temperature = (float)v;
    if (s == QD_OK) {
        present = false;
        if ((s = read_number(root, "top_p", path, &v, &present, err)) == QD_OK && present) out->top_p = (float)v;
    }
    if (s == QD_OK) {
        present = false;
        if ((s = read_number(root, "top_k", path, &v, &present, err)) == QD_OK && present) out->top_k = (int)v;
    }
    if (s == QD_OK) {
        bool rp = false;
        if ((s = read_number(root, "repetition_penalty", path, &v, &rp, err)) == QD_OK && rp)
            out->repetition_penalty = (float)v;
    }
    out->has_sampling = out->has_sampling || present;
    json_decref(root);
    return s;
}
