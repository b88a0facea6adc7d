#include "server/tool_calls.h"

#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

static const char k_open[] = "<tool_call>", k_close[] = "</tool_call>";

void srv_toolcap_push(srv_toolcap *t, const char *s, size_t n, int final, srv_think_emit emit, void *user) {
    if (!t->enabled) {
        if (n) emit(user, 0, s, n);
        return;
    }
    if (t->capturing) {
        srv_buf_append(&t->cap, s, n);
        return;
    }
    if (srv_buf_append(&t->hold, s, n) || !t->hold.p) return;
    const size_t tl = sizeof k_open - 1;
    char *hit = memmem(t->hold.p, t->hold.n, k_open, tl);
    if (hit) {
        size_t pre = (size_t)(hit - t->hold.p);
        if (pre) emit(user, 0, t->hold.p, pre);
        srv_buf_append(&t->cap, hit, t->hold.n - pre);
        t->hold.n = 0;
        t->capturing = 1;
        return;
    }
    size_t keep = 0;
    if (!final)
        for (size_t k = tl - 1 < t->hold.n ? tl - 1 : t->hold.n; k > 0; k--)
            if (!memcmp(t->hold.p + t->hold.n - k, k_open, k)) {
                keep = k;
                break;
            }
    if (t->hold.n - keep) emit(user, 0, t->hold.p, t->hold.n - keep);
    memmove(t->hold.p, t->hold.p + t->hold.n - keep, keep);
    t->hold.n = keep;
}

void srv_toolcap_free(srv_toolcap *t) {
    srv_buf_free(&t->hold);
    srv_buf_free(&t->cap);
}

/* [*s, *s + *n) without surrounding whitespace. */
static void trim(const char **s, size_t *n) {
    while (*n && isspace((unsigned char)**s)) (*s)++, (*n)--;
    while (*n && isspace((unsigned char)(*s)[*n - 1])) (*n)--;
}

/* The schema of parameter `key` of function name[0..nn) in `tools`; NULL: unknown. */
const json_t *srv_tool_param_schema(const json_t *tools, const char *name, size_t nn, const char *key) {
    size_t i;
    const json_t *t;
    json_array_foreach(tools, i, t) {
        const json_t *f = json_object_get(t, "function");
        const char *fn = json_string_value(json_object_get(f, "name"));
        if (fn && strlen(fn) == nn && !memcmp(fn, name, nn))
            return json_object_get(json_object_get(json_object_get(f, "parameters"), "properties"), key);
    }
    return NULL;
}

int srv_type_allows(const json_t *type, const char *t) {
    if (json_is_string(type)) return !strcmp(json_string_value(type), t);
    size_t i;
    const json_t *v;
    json_array_foreach(type, i, v) if (json_is_string(v) && !strcmp(json_string_value(v), t)) return 1;
    return 0;
}

/* Whether a parsed JSON value has one of the schema's types. */
static int value_fits(const json_t *type, const json_t *v) {
    if (json_is_integer(v)) return srv_type_allows(type, "integer") || srv_type_allows(type, "number");
    if (json_is_real(v))
        return srv_type_allows(type, "number") ||
               (srv_type_allows(type, "integer") && fabs(json_real_value(v)) < 9e18 &&
                json_real_value(v) == (double)(long long)json_real_value(v));
    if (json_is_boolean(v)) return srv_type_allows(type, "boolean");
    if (json_is_null(v)) return srv_type_allows(type, "null");
    if (json_is_object(v)) return srv_type_allows(type, "object");
    if (json_is_array(v)) return srv_type_allows(type, "array");
    return srv_type_allows(type, "string");
}

/* A parameter value typed by its schema: text that parses as JSON of an allowed type
 * keeps that type; text for a string parameter stays a string ("123" against
 * {"type": "string"} is "123"); without a schema or a type, valid JSON keeps its type
 * and anything else is a string. */
json_t *srv_tool_param_value(const json_t *schema, const char *v, size_t vn) {
    json_t *parsed = json_loadb(v, vn, JSON_DECODE_ANY, NULL);
    const json_t *type = json_object_get(schema, "type");
    const json_t *en = json_object_get(schema, "enum");
    if (json_is_array(en)) {
        size_t i;
        const json_t *x;
        json_array_foreach(en, i, x) if (json_is_string(x) && json_string_length(x) == vn &&
                                         !memcmp(json_string_value(x), v, vn)) {
            json_decref(parsed);
            return json_stringn(v, vn);
        }
    }
    if (!type) return parsed ? parsed : json_stringn(v, vn);
    if (parsed && value_fits(type, parsed)) return parsed;
    if (srv_type_allows(type, "string") || !parsed) {
        json_decref(parsed);
        return json_stringn(v, vn);
    }
    return parsed;
}

/* 1 when s[0..n) starts with lit. */
static int has_prefix(const char *s, size_t n, const char *lit, size_t ln) { return n >= ln && !memcmp(s, lit, ln); }

/* Qwen3.5 / Coder format: <function=NAME> <parameter=P>VALUE</parameter>... </function>,
 * with only whitespace between the tags: text the format has no place for, or a
 * parameter without its closing tag, makes it no call (the streamed form, tool_stream.c,
 * gives up at the same text, so a client gets the same calls streamed or not).
 * Values are typed by the tool's parameter schema (srv_tool_param_value). */
static json_t *parse_xml_call(const char *s, size_t n, const json_t *tools) {
    const char *end = s + n;
    if (!has_prefix(s, n, "<function=", 10)) return NULL;
    const char *name = s + 10, *gt = memchr(name, '>', (size_t)(end - name));
    if (!gt || gt == name || gt - name >= SRV_TOOL_NAME_MAX) return NULL;
    json_t *args = json_object();
    const char *p = gt + 1;
    for (;;) {
        size_t rest = (size_t)(end - p);
        trim(&p, &rest);
        if (has_prefix(p, rest, "</function>", 11)) {
            p += 11;
            break;
        }
        if (!has_prefix(p, rest, "<parameter=", 11)) goto bad;
        const char *pn = p + 11, *pg = memchr(pn, '>', (size_t)(end - pn));
        if (!pg || pg == pn || pg - pn >= SRV_TOOL_NAME_MAX) goto bad;
        const char *v = pg + 1, *ve = memmem(v, (size_t)(end - v), "</parameter>", 12);
        if (!ve) goto bad;
        size_t vn = (size_t)(ve - v);
        /* one newline after the opening tag and before the closing one belong to the format */
        if (vn && *v == '\n') v++, vn--;
        if (vn && v[vn - 1] == '\n') vn--;
        char key[SRV_TOOL_NAME_MAX];
        snprintf(key, sizeof key, "%.*s", (int)(pg - pn), pn);
        json_t *val = srv_tool_param_value(srv_tool_param_schema(tools, name, (size_t)(gt - name), key), v, vn);
        if (!val || json_object_set_new(args, key, val)) goto bad;
        p = ve + 12;
    }
    if (p != end) goto bad; /* the block's text ends with </function> (trimmed by the caller) */
    char *a = json_dumps(args, JSON_COMPACT);
    json_decref(args);
    json_t *f = a ? json_pack("{s:s%, s:s}", "name", name, (size_t)(gt - name), "arguments", a) : NULL;
    free(a);
    return f;
bad:
    json_decref(args);
    return NULL;
}

/* A call's arguments text: its "arguments" as a JSON object (or array), or a JSON string
 * holding one's text (models that encode them so), which goes out as it is. Anything else
 * (a number, a string that is not such text) makes it no call, so that the arguments a
 * client receives always parse as an object; NULL then. No "arguments" at all: {}. */
static char *call_arguments(const json_t *args) {
    if (!args) return strdup("{}");
    if (json_is_object(args) || json_is_array(args)) return json_dumps(args, JSON_COMPACT);
    if (!json_is_string(args)) return NULL;
    json_t *inner = json_loadb(json_string_value(args), json_string_length(args), 0, NULL);
    char *a = inner ? strdup(json_string_value(args)) : NULL;
    json_decref(inner);
    return a;
}

/* Qwen3 / Hermes format: {"name": ..., "arguments": {...} or "..."}. A key given twice
 * makes it no call: which one counts would be a guess (and the streamed form streams
 * the first "arguments" it meets). */
static json_t *parse_json_call(const char *s, size_t n) {
    json_t *j = json_loadb(s, n, JSON_REJECT_DUPLICATES, NULL);
    json_t *name = j ? json_object_get(j, "name") : NULL;
    if (!json_is_string(name)) {
        json_decref(j);
        return NULL;
    }
    json_t *args = json_object_get(j, "arguments");
    if (!args) args = json_object_get(j, "parameters");
    char *a = call_arguments(args);
    json_t *f = a ? json_pack("{s:s, s:s}", "name", json_string_value(name), "arguments", a) : NULL;
    free(a);
    json_decref(j);
    return f;
}

json_t *srv_parse_tool_call_body(const char *body, size_t n, const json_t *tools) {
    trim(&body, &n);
    return n && *body == '{' ? parse_json_call(body, n) : parse_xml_call(body, n, tools);
}

json_t *srv_parse_tool_calls(const char *text, size_t n, const char *id_prefix, const json_t *tools) {
    json_t *calls = json_array();
    const char *p = text, *end = text + n;
    for (;;) {
        const char *trail = p;
        size_t tn = (size_t)(end - p);
        trim(&trail, &tn);
        if (!tn) break; /* only whitespace after the last call */
        if (tn < sizeof k_open - 1 || memcmp(trail, k_open, sizeof k_open - 1)) goto bad;
        const char *body = trail + sizeof k_open - 1;
        const char *close = memmem(body, (size_t)(end - body), k_close, sizeof k_close - 1);
        if (!close) goto bad;
        json_t *f = srv_parse_tool_call_body(body, (size_t)(close - body), tools);
        if (!f) goto bad;
        char id[96];
        snprintf(id, sizeof id, "call_%s_%zu", id_prefix, json_array_size(calls));
        json_array_append_new(calls, json_pack("{s:s, s:s, s:o}", "id", id, "type", "function", "function", f));
        p = close + sizeof k_close - 1;
    }
    if (json_array_size(calls)) return calls;
bad:
    json_decref(calls);
    return NULL;
}
