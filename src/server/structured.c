/* response_format and tool_choice as grammar constraints (structured.h). */
#include "server/structured.h"

#include <stdlib.h>
#include <string.h>

#include "runtime/grammar/constraint.h"
#include "runtime/grammar/json_schema.h"

static const char *choice_mode(json_t *choice) {
    if (!choice || json_is_null(choice)) return "auto";
    if (json_is_string(choice)) return json_string_value(choice);
    return "named";
}

int srv_check_tools(json_t *req, int *enforced, srv_error *e) {
    json_t *tools = json_object_get(req, "tools"), *choice = json_object_get(req, "tool_choice");
    *enforced = 0;
    size_t n = tools && json_is_array(tools) ? json_array_size(tools) : 0;
    size_t i;
    json_t *t;
    json_array_foreach(tools, i, t) {
        json_t *f = json_object_get(t, "function");
        json_t *type = json_object_get(t, "type");
        if (!json_is_object(t) || (type && !(json_is_string(type) && !strcmp(json_string_value(type), "function"))))
            return srv_fail(e, 400, "invalid_request_error", "tools", "tools[%zu] must be an object of type \"function\"", i);
        if (!json_is_object(f) || !json_is_string(json_object_get(f, "name")) ||
            json_string_length(json_object_get(f, "name")) == 0)
            return srv_fail(e, 400, "invalid_request_error", "tools", "tools[%zu].function.name must be a non-empty string", i);
        json_t *p = json_object_get(f, "parameters");
        if (p && !json_is_null(p) && !json_is_object(p))
            return srv_fail(e, 400, "invalid_request_error", "tools", "tools[%zu].function.parameters must be a JSON Schema object", i);
    }
    json_t *ptc = json_object_get(req, "parallel_tool_calls");
    if (ptc && !json_is_null(ptc) && !json_is_boolean(ptc))
        return srv_fail(e, 400, "invalid_request_error", "parallel_tool_calls", "'parallel_tool_calls' must be a boolean");
    const char *mode = choice_mode(choice);
    if (json_is_string(choice) && strcmp(mode, "none") && strcmp(mode, "auto") && strcmp(mode, "required"))
        return srv_fail(e, 400, "invalid_request_error", "tool_choice",
                        "'tool_choice' \"%.64s\" is not one of none, auto, required or {\"type\": \"function\", ...}", mode);
    if (!strcmp(mode, "named")) {
        json_t *f = json_object_get(choice, "function");
        if (!json_is_object(choice) || !json_is_string(json_object_get(f, "name")))
            return srv_fail(e, 400, "invalid_request_error", "tool_choice",
                            "'tool_choice' must name a function: {\"type\": \"function\", \"function\": {\"name\": ...}}");
    }
    if (!strcmp(mode, "required") || !strcmp(mode, "named")) {
        if (n == 0)
            return srv_fail(e, 400, "invalid_request_error", "tool_choice", "'tool_choice' %s needs a non-empty 'tools'", mode);
        *enforced = 1;
    }
    return 0;
}

static int schema_error(srv_error *e, const char *param, const char *where, const qd_err *err) {
    int status = 400;
    return srv_fail(e, status, "invalid_request_error", param, "%s: %s", where, err->msg);
}

static int check_size(const json_t *schema, const char *param, const char *where, srv_error *e) {
    char *txt = json_dumps(schema, JSON_COMPACT);
    size_t n = txt ? strlen(txt) : 0;
    free(txt);
    if (n > SRV_MAX_SCHEMA_BYTES)
        return srv_fail(e, 400, "invalid_request_error", param, "%s: the schema is %zu bytes, over the limit of %d", where, n,
                        SRV_MAX_SCHEMA_BYTES);
    return 0;
}

/* A rule for one string value in the XML form: raw text up to "\n</parameter>",
 * written without '<' and newlines so the closing tag cannot be forged. */
static int xml_text_rule(qd_grammar *g) {
    uint8_t bits[32] = {0};
    for (int b = 0x20; b < 256; b++)
        if (b != '<' && b != 0x7f) bits[b >> 3] |= (uint8_t)(1u << (b & 7));
    int32_t ch = qd_grammar_class(g, bits);
    int r = qd_grammar_rule(g);
    int32_t s[2] = {ch, r};
    qd_grammar_alt(g, r, &ch, 1);
    qd_grammar_alt(g, r, s, 2);
    return r;
}

static int is_plain_string(const json_t *schema) {
    const json_t *t = json_object_get(schema, "type");
    return json_is_string(t) && !strcmp(json_string_value(t), "string") && !json_object_get(schema, "enum") &&
           !json_object_get(schema, "format") && !json_object_get(schema, "minLength") && !json_object_get(schema, "maxLength");
}

static int lit(qd_grammar *g, const char *s) { return qd_grammar_literal(g, s, strlen(s)); }

static int seq(qd_grammar *g, const int32_t *syms, int n) {
    int r = qd_grammar_rule(g);
    if (r >= 0) qd_grammar_alt(g, r, syms, n);
    return r;
}

/* <function=NAME>\n then each property as <parameter=P>\nVALUE\n</parameter>\n (in
 * the schema's order, the optional ones optional), then </function> */
static int xml_call(qd_grammar *g, const char *name, const json_t *params, qd_err *err, char *where, size_t wn) {
    char head[600];
    snprintf(head, sizeof head, "<tool_call>\n<function=%s>\n", name);
    int parts = qd_grammar_rule(g), tail = lit(g, "</function>\n</tool_call>");
    const json_t *props = json_object_get(params, "properties"), *req = json_object_get(params, "required");
    int n = props && json_is_object(props) ? (int)json_object_size(props) : 0;
    const char **names = calloc((size_t)n + 1, sizeof *names);
    int *rules = calloc((size_t)n + 1, sizeof *rules), *required = calloc((size_t)n + 1, sizeof *required);
    int k = 0, ok = names && rules && required;
    const char *key;
    const json_t *v;
    json_object_foreach((json_t *)props, key, v) {
        if (!ok) break;
        names[k] = key;
        size_t i;
        const json_t *rq;
        json_array_foreach(req, i, rq) if (json_is_string(rq) && !strcmp(json_string_value(rq), key)) required[k] = 1;
        int val = is_plain_string(v) ? xml_text_rule(g) : qd_json_schema_rule(g, v, err);
        if (val < 0) {
            snprintf(where, wn, "tools: function '%s' parameter '%s'", name, key);
            ok = 0;
            break;
        }
        char open[600];
        snprintf(open, sizeof open, "<parameter=%s>\n", key);
        int32_t s[3] = {lit(g, open), val, lit(g, "\n</parameter>\n")};
        rules[k++] = seq(g, s, 3);
    }
    int r = -1;
    if (ok) {
        /* chain from the last parameter back */
        int next = seq(g, NULL, 0);
        for (int i = k - 1; i >= 0; i--) {
            int c = qd_grammar_rule(g);
            int32_t s[2] = {rules[i], next};
            qd_grammar_alt(g, c, s, 2);
            if (!required[i]) qd_grammar_alt(g, c, &next, 1);
            next = c;
        }
        int32_t s[3] = {lit(g, head), next, tail};
        qd_grammar_alt(g, parts, s, 3);
        r = parts;
    }
    free(names);
    free(rules);
    free(required);
    return r;
}

static int hermes_call(qd_grammar *g, const char *name, const json_t *params, qd_err *err, char *where, size_t wn) {
    json_t *nj = json_string(name);
    char *qname = nj ? json_dumps(nj, JSON_ENCODE_ANY | JSON_COMPACT) : NULL;
    json_decref(nj);
    if (!qname) return -1;
    char head[700];
    snprintf(head, sizeof head, "<tool_call>\n{\"name\": %s, \"arguments\": ", qname);
    free(qname);
    int args = params ? qd_json_schema_rule(g, params, err) : qd_json_any_object_rule(g);
    if (args < 0) {
        snprintf(where, wn, "tools: function '%s' parameters", name);
        return -1;
    }
    int32_t s[3] = {lit(g, head), args, lit(g, "}\n</tool_call>")};
    return seq(g, s, 3);
}

static int tool_grammar(srv_server *s, json_t *req, const char *prompt, qd_grammar **out, srv_error *e) {
    json_t *tools = json_object_get(req, "tools"), *choice = json_object_get(req, "tool_choice");
    const char *only = NULL;
    if (json_is_object(choice)) only = json_string_value(json_object_get(json_object_get(choice, "function"), "name"));
    json_t *ptc = json_object_get(req, "parallel_tool_calls");
    int parallel = !json_is_false(ptc) && !only;
    int xml = prompt && strstr(prompt, "<function=") != NULL;
    (void)s;
    qd_grammar *g = qd_grammar_new();
    if (!g) return srv_fail(e, 500, "internal_error", NULL, "out of memory");
    int one = qd_grammar_rule(g), found = 0;
    size_t i;
    json_t *t;
    qd_err err;
    qd_err_clear(&err);
    char where[800] = "tools";
    json_array_foreach(tools, i, t) {
        json_t *f = json_object_get(t, "function");
        const char *name = json_string_value(json_object_get(f, "name"));
        if (only && strcmp(only, name)) continue;
        json_t *params = json_object_get(f, "parameters");
        if (params && json_is_null(params)) params = NULL;
        if (params && check_size(params, "tools", "tools", e)) {
            qd_grammar_free(g);
            return -1;
        }
        if (strlen(name) > 256) {
            qd_grammar_free(g);
            return srv_fail(e, 400, "invalid_request_error", "tools", "tools[%zu].function.name is over 256 bytes", i);
        }
        int32_t call = xml ? xml_call(g, name, params, &err, where, sizeof where)
                           : hermes_call(g, name, params, &err, where, sizeof where);
        if (call < 0) {
            qd_grammar_free(g);
            return schema_error(e, "tools", where, &err);
        }
        qd_grammar_alt(g, one, &call, 1);
        found++;
    }
    if (!found) {
        qd_grammar_free(g);
        return srv_fail(e, 400, "invalid_request_error", "tool_choice", "'tool_choice' names function '%.128s', which is not in 'tools'",
                        only ? only : "");
    }
    int root = one;
    if (parallel) {
        root = qd_grammar_rule(g);
        int32_t more[3] = {one, qd_grammar_byte('\n'), root};
        qd_grammar_alt(g, root, more, 3);
        qd_grammar_alt(g, root, (int32_t[]){one}, 1);
    }
    if (qd_grammar_finish(g, root, &err) != QD_OK) {
        qd_grammar_free(g);
        return schema_error(e, "tools", "tools", &err);
    }
    *out = g;
    return 0;
}

static int format_grammar(json_t *rf, qd_grammar **out, srv_error *e) {
    *out = NULL;
    if (!rf || json_is_null(rf)) return 0;
    json_t *type = json_object_get(rf, "type");
    if (!json_is_object(rf) || !json_is_string(type))
        return srv_fail(e, 400, "invalid_request_error", "response_format",
                        "'response_format' must be an object with a 'type' (text, json_object or json_schema)");
    const char *t = json_string_value(type);
    qd_err err;
    qd_err_clear(&err);
    if (!strcmp(t, "text")) return 0;
    if (!strcmp(t, "json_object")) {
        if (qd_json_schema_grammar(NULL, out, &err) != QD_OK)
            return srv_fail(e, 500, "internal_error", "response_format", "%s", err.msg);
        return 0;
    }
    if (strcmp(t, "json_schema"))
        return srv_fail(e, 400, "invalid_request_error", "response_format",
                        "'response_format.type' \"%.64s\" is not one of text, json_object, json_schema", t);
    json_t *js = json_object_get(rf, "json_schema");
    if (!json_is_object(js))
        return srv_fail(e, 400, "invalid_request_error", "response_format", "'response_format.json_schema' must be an object");
    json_t *strict = json_object_get(js, "strict");
    if (strict && !json_is_null(strict) && !json_is_boolean(strict))
        return srv_fail(e, 400, "invalid_request_error", "response_format", "'response_format.json_schema.strict' must be a boolean");
    json_t *schema = json_object_get(js, "schema");
    if (!schema) schema = json_object_get(js, "json_schema"); /* some clients nest it once more */
    if (!schema || (!json_is_object(schema) && !json_is_boolean(schema)))
        return srv_fail(e, 400, "invalid_request_error", "response_format",
                        "'response_format.json_schema.schema' must be a JSON Schema object");
    if (check_size(schema, "response_format", "response_format.json_schema.schema", e)) return -1;
    if (qd_json_schema_grammar(schema, out, &err) != QD_OK)
        return schema_error(e, "response_format", "response_format.json_schema.schema", &err);
    return 0;
}

int srv_structured_setup(srv_server *s, json_t *req, srv_kind kind, const char *prompt, int in_think,
                         qd_constraint **out, srv_error *e) {
    *out = NULL;
    int enforced = 0;
    if (kind == SRV_CHAT && srv_check_tools(req, &enforced, e)) return -1;
    json_t *rf = json_object_get(req, "response_format");
    qd_grammar *g = NULL;
    if (enforced) {
        if (rf && !json_is_null(rf) && !(json_is_object(rf) && json_is_string(json_object_get(rf, "type")) &&
                                         !strcmp(json_string_value(json_object_get(rf, "type")), "text")))
            return srv_fail(e, 400, "invalid_request_error", "response_format",
                            "'response_format' cannot be combined with a 'tool_choice' that requires a call");
        if (tool_grammar(s, req, prompt, &g, e)) return -1;
    } else if (format_grammar(rf, &g, e)) return -1;
    if (!g) return 0;
    if (!s->trie) {
        qd_grammar_free(g);
        return srv_fail(e, 500, "internal_error", NULL, "constrained decoding is not set up (no token trie)");
    }
    qd_err err;
    qd_err_clear(&err);
    qd_constraint_params cp = {
        .trie = s->trie,
        .grammar = g,
        .eos = s->eos,
        .n_eos = s->n_eos,
        .start_after = in_think ? s->think_end : -1,
    };
    if (qd_constraint_create(&cp, out, &err) != QD_OK)
        return srv_fail(e, 500, "internal_error", NULL, "constraint: %s", err.msg);
    return 0;
}
