/* Chat-template public API: compile, load from a checkpoint directory, render. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/chat_template_int.h"

struct qd_chat_template {
    ct_arena ar;   /* AST and literals */
    node *root;
    char *src;     /* the source it was compiled from (NUL-terminated), for clients that render it */
    size_t src_len;
};

qd_status qd_chat_template_compile(const char *src, size_t len, qd_chat_template **out, qd_err *err) {
    *out = NULL;
    if (!src) return qd_seterr(err, QD_ERR_INVALID_ARG, "chat template: NULL source");
    qd_chat_template *t = calloc(1, sizeof *t);
    if (!t) return qd_seterr(err, QD_ERR_OOM, "chat template: out of memory");
    ct_tokens toks = {0};
    qd_err local;
    qd_err *e = err ? err : &local;
    e->status = QD_OK;
    if (ct_lex(src, len, &t->ar, &toks, e) || ct_parse(&toks, &t->ar, &t->root, e)) {
        free(toks.v);
        qd_chat_template_free(t);
        return e->status != QD_OK ? e->status : QD_ERR_FORMAT;
    }
    free(toks.v);
    if (!(t->src = malloc(len + 1))) {
        qd_chat_template_free(t);
        return qd_seterr(err, QD_ERR_OOM, "chat template: out of memory");
    }
    memcpy(t->src, src, len);
    t->src[len] = 0;
    t->src_len = len;
    *out = t;
    return QD_OK;
}

const char *qd_chat_template_source(const qd_chat_template *tpl, size_t *len) {
    *len = tpl->src_len;
    return tpl->src;
}

void qd_chat_template_free(qd_chat_template *tpl) {
    if (!tpl) return;
    ct_arena_free(&tpl->ar);
    free(tpl->src);
    free(tpl);
}

qd_status qd_chat_template_render_json(const qd_chat_template *tpl, const void *vars,
                                       const qd_chat_template_limits *limits, char **out, size_t *out_len,
                                       qd_err *err) {
    *out = NULL;
    if (out_len) *out_len = 0;
    if (!tpl || !vars || !json_is_object((const json_t *)vars))
        return qd_seterr(err, QD_ERR_INVALID_ARG, "chat template: render variables must be a JSON object");
    qd_chat_template_limits lim = {64u << 20, 256u << 20, 50000000, 200};
    if (limits) {
        if (limits->max_output) lim.max_output = limits->max_output;
        if (limits->max_memory) lim.max_memory = limits->max_memory;
        if (limits->max_steps) lim.max_steps = limits->max_steps;
        if (limits->max_depth) lim.max_depth = limits->max_depth;
    }
    qd_err local;
    ct_arena ar = {NULL, 0, lim.max_memory};
    ct_buf buf = {0};
    buf.limit = lim.max_output;
    ct_ctx c = {0};
    c.ar = &ar;
    c.err = err ? err : &local;
    c.out = &buf;
    c.max_steps = lim.max_steps;
    c.max_depth = lim.max_depth;
    c.line = 0;
    tv v;
    int rc = ct_from_json(&c, vars, &v);
    if (rc == 0) {
        c.vars = v.d;
        c.root = c.sc = ct_scope_new(&c, NULL);
        rc = c.root ? ct_render_body(&c, tpl->root) : -1;
    }
    if (rc == 0 && buf.oom)
        rc = buf.oom == 2 ? ct_fail(&c, QD_ERR_CAPACITY, "output size limit (%zu bytes) exceeded", buf.limit)
                          : ct_fail(&c, QD_ERR_OOM, "out of memory");
    ct_arena_free(&ar);
    if (rc) {
        ct_buf_free(&buf);
        return c.err->status != QD_OK ? c.err->status : QD_ERR_INTERNAL;
    }
    if (!buf.p) {
        buf.p = malloc(1);
        if (!buf.p) return qd_seterr(err, QD_ERR_OOM, "chat template: out of memory");
        buf.p[0] = 0;
    }
    *out = buf.p;
    if (out_len) *out_len = buf.n;
    return QD_OK;
}

qd_status qd_chat_template_render(const qd_chat_template *tpl, const char *request_json, char **out,
                                  size_t *out_len, qd_err *err) {
    *out = NULL;
    if (out_len) *out_len = 0;
    if (!request_json) return qd_seterr(err, QD_ERR_INVALID_ARG, "chat template: NULL request");
    json_error_t je;
    json_t *j = json_loads(request_json, JSON_ALLOW_NUL, &je);
    if (!j) return qd_seterr(err, QD_ERR_FORMAT, "chat template request: bad JSON at line %d: %s", je.line, je.text);
    qd_status s = qd_chat_template_render_json(tpl, j, NULL, out, out_len, err);
    json_decref(j);
    return s;
}

int qd_chat_template_renders_content_parts(const qd_chat_template *tpl) {
    static const char probe[] = "qd-content-part-7f3a9";
    json_t *vars = json_pack("{s:[{s:s, s:[{s:s, s:s}]}], s:b}", "messages", "role", "user", "content", "type", "text",
                             "text", probe, "add_generation_prompt", 1);
    const qd_chat_template_limits lim = {.max_output = 1u << 20, .max_memory = 16u << 20, .max_steps = 1000000};
    char *out = NULL;
    qd_err err;
    qd_err_clear(&err);
    const int yes = vars && qd_chat_template_render_json(tpl, vars, &lim, &out, NULL, &err) == QD_OK && out &&
                    strstr(out, probe) != NULL;
    free(out);
    json_decref(vars);
    return yes;
}

static char *read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    char *p = NULL;
    size_t n = 0, cap = 0;
    for (;;) {
        if (n + 65536 > cap) {
            cap = cap ? cap * 2 : 65536;
            char *q = realloc(p, cap + 1);
            if (!q) { free(p); fclose(f); return NULL; }
            p = q;
        }
        size_t k = fread(p + n, 1, cap - n, f);
        n += k;
        if (k == 0) break;
    }
    fclose(f);
    p[n] = 0;
    *len = n;
    return p;
}

/* Takes the template from a JSON file's "chat_template": a string, or a list of
 * {name, template} entries of which "default" is used. Returns 1 when found,
 * 0 when the file or key is absent, -1 on a malformed value (err set). */
static int template_from_json(const char *path, char **src, size_t *len, qd_err *err) {
    json_error_t je;
    json_t *cfg = json_load_file(path, 0, &je);
    if (!cfg) return 0;
    json_t *ct = json_object_get(cfg, "chat_template"), *found = NULL;
    int rc = 0;
    if (json_is_string(ct)) found = ct;
    else if (json_is_array(ct)) {
        size_t i;
        json_t *e;
        json_array_foreach(ct, i, e) {
            const char *name = json_string_value(json_object_get(e, "name"));
            if (name && strcmp(name, "default") == 0 && json_is_string(json_object_get(e, "template")))
                found = json_object_get(e, "template");
        }
        if (!found) {
            qd_seterr(err, QD_ERR_NOT_FOUND, "%s: chat_template list has no \"default\" entry", path);
            rc = -1;
        }
    } else if (ct && !json_is_null(ct)) {
        qd_seterr(err, QD_ERR_FORMAT, "%s: chat_template must be a string or a list", path);
        rc = -1;
    }
    if (found) {
        *len = json_string_length(found);
        *src = malloc(*len + 1);
        if (*src) {
            memcpy(*src, json_string_value(found), *len + 1);
            rc = 1;
        } else {
            qd_seterr(err, QD_ERR_OOM, "%s: out of memory", path);
            rc = -1;
        }
    }
    json_decref(cfg);
    return rc;
}

/* Same precedence as transformers: a chat_template.jinja file overrides the
 * tokenizer_config.json entry; processor-style chat_template.json comes last. */
qd_status qd_chat_template_load_dir(const char *dir, qd_chat_template **out, qd_err *err) {
    *out = NULL;
    char path[4096];
    char *src = NULL;
    size_t len = 0;
    qd_err local;
    if (!err) err = &local;
    snprintf(path, sizeof path, "%s/chat_template.jinja", dir);
    src = read_file(path, &len);
    if (!src) {
        snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
        int r = template_from_json(path, &src, &len, err);
        if (r == 0) {
            snprintf(path, sizeof path, "%s/chat_template.json", dir);
            r = template_from_json(path, &src, &len, err);
        }
        if (r < 0) return err->status;
        if (r == 0)
            return qd_seterr(err, QD_ERR_NOT_FOUND,
                             "%s: no chat template (chat_template.jinja, tokenizer_config.json or chat_template.json)", dir);
    }
    qd_status s = qd_chat_template_compile(src, len, out, err);
    if (s != QD_OK) qd_err_prefix(err, "%s", path);
    free(src);
    return s;
}
