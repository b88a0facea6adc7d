/* JSON Schema compiler: keywords, types, objects, arrays, combinators, $ref
 * (json_schema.h). */
#include "runtime/grammar/json_schema.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/grammar/json_schema_int.h"

/* ------------------------------------------------------------ helpers */

int sc_fail(sc_ctx *c, qd_status st, const char *fmt, ...) {
    if (!c->failed) {
        char msg[QD_ERRMSG_SIZE];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(msg, sizeof msg, fmt, ap);
        va_end(ap);
        qd_seterr(c->err, st, "%s", msg);
        c->failed = 1;
    }
    return -1;
}

int sc_seq(sc_ctx *c, const int32_t *syms, int n) {
    int r = qd_grammar_rule(c->g);
    if (r >= 0) qd_grammar_alt(c->g, r, syms, n);
    return r;
}

int sc_alts(sc_ctx *c, const int *rules, int n) {
    int r = qd_grammar_rule(c->g);
    for (int i = 0; i < n && r >= 0; i++) {
        int32_t s = rules[i];
        qd_grammar_alt(c->g, r, &s, 1);
    }
    return r;
}

int sc_lit(sc_ctx *c, const char *s) { return qd_grammar_literal(c->g, s, strlen(s)); }

int sc_ws(sc_ctx *c) {
    if (c->r_ws < 0) {
        int r = qd_grammar_rule(c->g);
        int32_t sp = qd_grammar_byte(' ');
        qd_grammar_alt(c->g, r, NULL, 0);
        qd_grammar_alt(c->g, r, &sp, 1);
        c->r_ws = r;
    }
    return c->r_ws;
}

int sc_char(sc_ctx *c) {
    if (c->r_char >= 0) return c->r_char;
    qd_grammar *g = c->g;
    int r = qd_grammar_rule(g);
    uint8_t plain[32] = {0};
    for (int b = 0x20; b <= 0x7f; b++)
        if (b != '"' && b != '\\') plain[b >> 3] |= (uint8_t)(1u << (b & 7));
    int32_t s1 = qd_grammar_class(g, plain);
    qd_grammar_alt(g, r, &s1, 1);
    /* escapes: \" \\ \/ \b \f \n \r \t, \uXXXX outside the surrogates */
    uint8_t esc[32] = {0};
    for (const char *p = "\"\\/bfnrt"; *p; p++) esc[(unsigned char)*p >> 3] |= (uint8_t)(1u << (*p & 7));
    int32_t bs = qd_grammar_byte('\\');
    int32_t e1[2] = {bs, qd_grammar_class(g, esc)};
    qd_grammar_alt(g, r, e1, 2);
    uint8_t hex[32] = {0}, hex_nod[32] = {0}, d07[32] = {0};
    for (const char *p = "0123456789abcdefABCDEF"; *p; p++) {
        hex[(unsigned char)*p >> 3] |= (uint8_t)(1u << (*p & 7));
        if (*p != 'd' && *p != 'D') hex_nod[(unsigned char)*p >> 3] |= (uint8_t)(1u << (*p & 7));
    }
    for (int b = '0'; b <= '7'; b++) d07[b >> 3] |= (uint8_t)(1u << (b & 7));
    int32_t H = qd_grammar_class(g, hex), HN = qd_grammar_class(g, hex_nod), D07 = qd_grammar_class(g, d07);
    int32_t u = qd_grammar_byte('u');
    int32_t e2[6] = {bs, u, HN, H, H, H};
    qd_grammar_alt(g, r, e2, 6);
    uint8_t dd[32] = {0};
    dd['d' >> 3] |= (uint8_t)(1u << ('d' & 7));
    dd['D' >> 3] |= (uint8_t)(1u << ('D' & 7));
    int32_t e3[6] = {bs, u, qd_grammar_class(g, dd), D07, H, H};
    qd_grammar_alt(g, r, e3, 6);
    /* UTF-8 of one code point, no overlongs, no surrogates, <= U+10FFFF */
    int32_t C = qd_grammar_range(g, 0x80, 0xbf);
    int32_t m2[2] = {qd_grammar_range(g, 0xc2, 0xdf), C};
    qd_grammar_alt(g, r, m2, 2);
    int32_t m3a[3] = {qd_grammar_byte(0xe0), qd_grammar_range(g, 0xa0, 0xbf), C};
    int32_t m3b[3] = {qd_grammar_range(g, 0xe1, 0xec), C, C};
    int32_t m3c[3] = {qd_grammar_byte(0xed), qd_grammar_range(g, 0x80, 0x9f), C};
    int32_t m3d[3] = {qd_grammar_range(g, 0xee, 0xef), C, C};
    qd_grammar_alt(g, r, m3a, 3);
    qd_grammar_alt(g, r, m3b, 3);
    qd_grammar_alt(g, r, m3c, 3);
    qd_grammar_alt(g, r, m3d, 3);
    int32_t m4a[4] = {qd_grammar_byte(0xf0), qd_grammar_range(g, 0x90, 0xbf), C, C};
    int32_t m4b[4] = {qd_grammar_range(g, 0xf1, 0xf3), C, C, C};
    int32_t m4c[4] = {qd_grammar_byte(0xf4), qd_grammar_range(g, 0x80, 0x8f), C, C};
    qd_grammar_alt(g, r, m4a, 4);
    qd_grammar_alt(g, r, m4b, 4);
    qd_grammar_alt(g, r, m4c, 4);
    g->char_rule = r;
    return c->r_char = r;
}

int sc_upto(sc_ctx *c, int item, long long n) {
    if (n < 0) { /* r := "" | item r */
        int r = qd_grammar_rule(c->g);
        int32_t s[2] = {item, r};
        qd_grammar_alt(c->g, r, NULL, 0);
        qd_grammar_alt(c->g, r, s, 2);
        return r;
    }
    int tail = sc_seq(c, NULL, 0); /* r_k := "" | item r_(k-1), r_0 := "" */
    for (long long k = 0; k < n && !c->failed; k++) {
        int r = qd_grammar_rule(c->g);
        int32_t s[2] = {item, tail};
        qd_grammar_alt(c->g, r, NULL, 0);
        qd_grammar_alt(c->g, r, s, 2);
        tail = r;
    }
    return tail;
}

int sc_any_string(sc_ctx *c) {
    if (c->r_string < 0) {
        int32_t q = qd_grammar_byte('"');
        int32_t s[3] = {q, sc_upto(c, sc_char(c), -1), q};
        c->r_string = sc_seq(c, s, 3);
    }
    return c->r_string;
}

int sc_digits(sc_ctx *c, int k) {
    if (c->r_digits[k] < 0) {
        int32_t s[16];
        for (int i = 0; i < k; i++) s[i] = qd_grammar_range(c->g, '0', '9');
        c->r_digits[k] = sc_seq(c, s, k);
    }
    return c->r_digits[k];
}

int sc_upto_digits(sc_ctx *c, int k) {
    if (c->r_upto_digits[k] < 0) {
        int r = qd_grammar_rule(c->g);
        qd_grammar_alt(c->g, r, NULL, 0);
        if (k > 0) {
            int32_t s[2] = {qd_grammar_range(c->g, '0', '9'), sc_upto_digits(c, k - 1)};
            qd_grammar_alt(c->g, r, s, 2);
        }
        c->r_upto_digits[k] = r;
    }
    return c->r_upto_digits[k];
}

/* "[" (item ("," ws item)*)? "]"  /  "{" (kv ("," ws kv)*)? "}" */
static int delimited_list(sc_ctx *c, char open, int item, char close) {
    int tail = qd_grammar_rule(c->g);
    int32_t t[4] = {qd_grammar_byte(','), sc_ws(c), item, tail};
    qd_grammar_alt(c->g, tail, NULL, 0);
    qd_grammar_alt(c->g, tail, t, 4);
    int r = qd_grammar_rule(c->g);
    int32_t empty[2] = {qd_grammar_byte((unsigned char)open), qd_grammar_byte((unsigned char)close)};
    int32_t full[4] = {qd_grammar_byte((unsigned char)open), item, tail, qd_grammar_byte((unsigned char)close)};
    qd_grammar_alt(c->g, r, empty, 2);
    qd_grammar_alt(c->g, r, full, 4);
    return r;
}

static int key_value(sc_ctx *c, int key, int value) {
    int32_t s[4] = {key, qd_grammar_byte(':'), sc_ws(c), value};
    return sc_seq(c, s, 4);
}

int sc_any_value(sc_ctx *c) {
    if (c->r_value >= 0) return c->r_value;
    /* the rule exists before its members so that objects and arrays can nest */
    int v = c->r_value = qd_grammar_rule(c->g);
    int arr = delimited_list(c, '[', v, ']');
    int obj = sc_any_object(c);
    int members[7] = {obj, arr, sc_any_string(c), sc_numeric(c, NULL, "#", 0), sc_lit(c, "true"),
                      sc_lit(c, "false"), sc_lit(c, "null")};
    for (int i = 0; i < 7; i++) {
        int32_t s = members[i];
        qd_grammar_alt(c->g, v, &s, 1);
    }
    return v;
}

int sc_any_object(sc_ctx *c) {
    if (c->r_object < 0) c->r_object = delimited_list(c, '{', key_value(c, sc_any_string(c), sc_any_value(c)), '}');
    return c->r_object;
}

long long sc_count(sc_ctx *c, const json_t *s, const char *key, const char *path) {
    const json_t *v = json_object_get(s, key);
    if (!v) return -1;
    if (!json_is_integer(v) || json_integer_value(v) < 0) {
        sc_fail(c, QD_ERR_INVALID_ARG, "'%s' at %s must be a non-negative integer", key, path);
        return -2;
    }
    if (json_integer_value(v) > QD_SCHEMA_MAX_REPEAT) {
        sc_fail(c, QD_ERR_CAPACITY, "'%s' %lld at %s is over the limit of %d", key, (long long)json_integer_value(v),
                path, QD_SCHEMA_MAX_REPEAT);
        return -2;
    }
    return json_integer_value(v);
}

/* ------------------------------------------------------------ keywords */

static const char *const ANNOTATIONS[] = {"title", "description", "default", "examples", "$schema", "$id",
                                          "$comment", "deprecated", "readOnly", "writeOnly", "$defs",
                                          "definitions", NULL};
static const char *const SUPPORTED[] = {"type", "enum", "const", "anyOf", "oneOf", "allOf", "$ref",
                                        "properties", "required", "additionalProperties", "items",
                                        "minItems", "maxItems", "minLength", "maxLength", "format", "pattern",
                                        "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum",
                                        "uniqueItems", NULL};

static int in_list(const char *const *list, const char *k) {
    for (int i = 0; list[i]; i++)
        if (!strcmp(list[i], k)) return 1;
    return 0;
}

static int compile(sc_ctx *c, const json_t *s, const char *path);

static void subpath(char *out, size_t n, const char *path, const char *a, const char *b) {
    if (b) snprintf(out, n, "%s/%s/%s", path, a, b);
    else snprintf(out, n, "%s/%s", path, a);
}

static int compile_literal_value(sc_ctx *c, const json_t *v) {
    char *txt = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY | JSON_ENSURE_ASCII);
    if (!txt) return sc_fail(c, QD_ERR_OOM, "out of memory serialising a const/enum value");
    int r = sc_lit(c, txt);
    free(txt);
    return r;
}

static int compile_enum(sc_ctx *c, const json_t *e, const char *path) {
    if (!json_is_array(e) || json_array_size(e) == 0)
        return sc_fail(c, QD_ERR_INVALID_ARG, "'enum' at %s must be a non-empty array", path);
    int r = qd_grammar_rule(c->g);
    size_t i;
    const json_t *v;
    json_array_foreach(e, i, v) {
        int32_t s = compile_literal_value(c, v);
        if (c->failed) return -1;
        qd_grammar_alt(c->g, r, &s, 1);
    }
    return r;
}

static int compile_alternatives(sc_ctx *c, const json_t *list, const char *kw, const char *path) {
    if (!json_is_array(list) || json_array_size(list) == 0)
        return sc_fail(c, QD_ERR_INVALID_ARG, "'%s' at %s must be a non-empty array of schemas", kw, path);
    int r = qd_grammar_rule(c->g);
    size_t i;
    const json_t *v;
    json_array_foreach(list, i, v) {
        char p[512], idx[24];
        snprintf(idx, sizeof idx, "%zu", i);
        subpath(p, sizeof p, path, kw, idx);
        int32_t s = compile(c, v, p);
        if (s < 0) return -1;
        qd_grammar_alt(c->g, r, &s, 1);
    }
    return r;
}

/* A JSON pointer into the root: "#", "#/a/b" with ~0 ~1 escapes. */
const json_t *sc_resolve_ref(sc_ctx *c, const char *ref) {
    if (ref[0] != '#') return NULL;
    const json_t *cur = c->root;
    const char *p = ref + 1;
    while (*p == '/') {
        p++;
        char tok[256];
        size_t n = 0;
        while (*p && *p != '/' && n + 1 < sizeof tok) {
            if (p[0] == '~' && p[1] == '0') tok[n++] = '~', p += 2;
            else if (p[0] == '~' && p[1] == '1') tok[n++] = '/', p += 2;
            else tok[n++] = *p++;
        }
        tok[n] = 0;
        if (json_is_object(cur)) cur = json_object_get(cur, tok);
        else if (json_is_array(cur)) {
            char *end;
            long k = strtol(tok, &end, 10);
            cur = (*tok && !*end && k >= 0) ? json_array_get(cur, (size_t)k) : NULL;
        } else cur = NULL;
        if (!cur) return NULL;
    }
    return *p ? NULL : cur;
}

static int compile_ref(sc_ctx *c, const json_t *ref, const char *path) {
    if (!json_is_string(ref)) return sc_fail(c, QD_ERR_INVALID_ARG, "'$ref' at %s must be a string", path);
    const json_t *t = sc_resolve_ref(c, json_string_value(ref));
    if (!t)
        return sc_fail(c, QD_ERR_INVALID_ARG, "'$ref' \"%s\" at %s does not point into this schema",
                       json_string_value(ref), path);
    for (int i = 0; i < c->n_refs; i++)
        if (c->refs[i].target == t) return c->refs[i].rule;
    if (c->n_refs == c->cap_refs) {
        int nc = c->cap_refs ? 2 * c->cap_refs : 8;
        sc_ref *nr = realloc(c->refs, sizeof *nr * (size_t)nc);
        if (!nr) return sc_fail(c, QD_ERR_OOM, "out of memory resolving $ref");
        c->refs = nr;
        c->cap_refs = nc;
    }
    int r = qd_grammar_rule(c->g);
    c->refs[c->n_refs++] = (sc_ref){t, r};
    int32_t body = compile(c, t, json_string_value(ref));
    if (body < 0) return -1;
    qd_grammar_alt(c->g, r, &body, 1);
    return r;
}

/* One property of an object schema, in order. */
typedef struct sc_prop {
    const char *name;
    const json_t *schema;  /* NULL: any value (a required name without a schema) */
    int required;
} sc_prop;

static int compile_object(sc_ctx *c, const json_t *s, const char *path) {
    const json_t *props = json_object_get(s, "properties"), *req = json_object_get(s, "required");
    const json_t *addl = json_object_get(s, "additionalProperties");
    if (props && !json_is_object(props))
        return sc_fail(c, QD_ERR_INVALID_ARG, "'properties' at %s must be an object", path);
    if (req && !json_is_array(req)) return sc_fail(c, QD_ERR_INVALID_ARG, "'required' at %s must be an array", path);
    if (addl && !json_is_boolean(addl) && !json_is_object(addl))
        return sc_fail(c, QD_ERR_INVALID_ARG, "'additionalProperties' at %s must be a boolean or a schema", path);
    size_t n_props = props ? json_object_size(props) : 0, n_req = req ? json_array_size(req) : 0;
    sc_prop *list = calloc(n_props + n_req + 1, sizeof *list);
    if (!list) return sc_fail(c, QD_ERR_OOM, "out of memory for the properties at %s", path);
    int n = 0;
    const char *k;
    const json_t *v;
    json_object_foreach((json_t *)props, k, v) list[n++] = (sc_prop){k, v, 0};
    size_t i;
    json_array_foreach(req, i, v) {
        if (!json_is_string(v)) {
            free(list);
            return sc_fail(c, QD_ERR_INVALID_ARG, "'required' at %s must hold strings (item %zu)", path, i);
        }
        int found = 0;
        for (int j = 0; j < n; j++)
            if (!strcmp(list[j].name, json_string_value(v))) list[j].required = found = 1;
        if (!found) list[n++] = (sc_prop){json_string_value(v), NULL, 1};
    }
    int result;
    if (n == 0) {
        /* no listed properties: a map whose values follow additionalProperties */
        if (json_is_false(addl)) result = sc_lit(c, "{}");
        else {
            char p[512];
            subpath(p, sizeof p, path, "additionalProperties", NULL);
            int val = json_is_object(addl) ? compile(c, addl, p) : sc_any_value(c);
            result = val < 0 ? -1 : delimited_list(c, '{', key_value(c, sc_any_string(c), val), '}');
        }
        free(list);
        return result;
    }
    /* rest[i][comma]: the properties from i on, `comma` when one was already written */
    int (*rest)[2] = malloc(sizeof *rest * (size_t)(n + 1));
    if (!rest) {
        free(list);
        return sc_fail(c, QD_ERR_OOM, "out of memory for the properties at %s", path);
    }
    rest[n][0] = rest[n][1] = sc_seq(c, NULL, 0);
    for (int j = n - 1; j >= 0 && !c->failed; j--) {
        json_t *kj = json_string(list[j].name);
        char *key = kj ? json_dumps(kj, JSON_COMPACT | JSON_ENCODE_ANY | JSON_ENSURE_ASCII) : NULL;
        json_decref(kj);
        char p[512];
        subpath(p, sizeof p, path, "properties", list[j].name);
        int val = list[j].schema ? compile(c, list[j].schema, p) : sc_any_value(c);
        int kv = key ? key_value(c, sc_lit(c, key), val) : sc_fail(c, QD_ERR_OOM, "out of memory for a key");
        free(key);
        if (val < 0 || kv < 0) break;
        for (int comma = 0; comma < 2; comma++) {
            int r = qd_grammar_rule(c->g);
            if (comma) {
                int32_t seq[4] = {qd_grammar_byte(','), sc_ws(c), kv, rest[j + 1][1]};
                qd_grammar_alt(c->g, r, seq, 4);
            } else {
                int32_t seq[2] = {kv, rest[j + 1][1]};
                qd_grammar_alt(c->g, r, seq, 2);
            }
            if (!list[j].required) {
                int32_t skip = rest[j + 1][comma];
                qd_grammar_alt(c->g, r, &skip, 1);
            }
            rest[j][comma] = r;
        }
    }
    result = -1;
    if (!c->failed) {
        int32_t seq[3] = {qd_grammar_byte('{'), rest[0][0], qd_grammar_byte('}')};
        result = sc_seq(c, seq, 3);
    }
    free(rest);
    free(list);
    return result;
}

static int compile_array(sc_ctx *c, const json_t *s, const char *path) {
    const json_t *items = json_object_get(s, "items"), *uniq = json_object_get(s, "uniqueItems");
    if (uniq && !json_is_boolean(uniq))
        return sc_fail(c, QD_ERR_INVALID_ARG, "'uniqueItems' at %s must be a boolean", path);
    if (json_is_true(uniq)) return sc_fail(c, QD_ERR_UNSUPPORTED, "unsupported keyword 'uniqueItems' (true) at %s", path);
    if (items && json_is_array(items))
        return sc_fail(c, QD_ERR_UNSUPPORTED, "unsupported keyword 'items' as an array (tuples) at %s", path);
    long long lo = sc_count(c, s, "minItems", path), hi = sc_count(c, s, "maxItems", path);
    if (lo == -2 || hi == -2) return -1;
    if (lo < 0) lo = 0;
    if (hi >= 0 && hi < lo)
        return sc_fail(c, QD_ERR_INVALID_ARG, "'maxItems' %lld < 'minItems' %lld at %s", hi, lo, path);
    char p[512];
    subpath(p, sizeof p, path, "items", NULL);
    int item = items ? compile(c, items, p) : sc_any_value(c);
    if (item < 0) return -1;
    if (hi == 0) return sc_lit(c, "[]");
    int32_t sep_item[3] = {qd_grammar_byte(','), sc_ws(c), item};
    int next = sc_seq(c, sep_item, 3);
    /* tail: the optional items after the first max(lo, 1) */
    long long first = lo > 0 ? lo : 1;
    int tail = sc_upto(c, next, hi < 0 ? -1 : hi - first);
    int32_t *seq = malloc(sizeof(int32_t) * (size_t)(first + 3));
    if (!seq) return sc_fail(c, QD_ERR_OOM, "out of memory for the array at %s", path);
    int m = 0;
    seq[m++] = qd_grammar_byte('[');
    seq[m++] = item;
    for (long long k = 1; k < first; k++) seq[m++] = next;
    seq[m++] = tail;
    int body = sc_seq(c, seq + 1, m - 1);
    free(seq);
    int32_t full[3] = {qd_grammar_byte('['), body, qd_grammar_byte(']')};
    int r = qd_grammar_rule(c->g);
    qd_grammar_alt(c->g, r, full, 3);
    if (lo == 0) {
        int32_t empty[2] = {qd_grammar_byte('['), qd_grammar_byte(']')};
        qd_grammar_alt(c->g, r, empty, 2);
    }
    return r;
}

static int compile_type(sc_ctx *c, const json_t *s, const char *type, const char *path) {
    if (!strcmp(type, "string")) return sc_string(c, s, path);
    if (!strcmp(type, "integer")) return sc_numeric(c, s, path, 1);
    if (!strcmp(type, "number")) return sc_numeric(c, s, path, 0);
    if (!strcmp(type, "boolean")) {
        int alts[2] = {sc_lit(c, "true"), sc_lit(c, "false")};
        return sc_alts(c, alts, 2);
    }
    if (!strcmp(type, "null")) return sc_lit(c, "null");
    if (!strcmp(type, "object")) return compile_object(c, s, path);
    if (!strcmp(type, "array")) return compile_array(c, s, path);
    return sc_fail(c, QD_ERR_INVALID_ARG, "unknown type \"%s\" at %s", type, path);
}

/* The type a schema without `type` is about, from its keywords; NULL: any value. */
static const char *implied_type(const json_t *s) {
    static const char *const obj[] = {"properties", "required", "additionalProperties", NULL};
    static const char *const arr[] = {"items", "minItems", "maxItems", "uniqueItems", NULL};
    static const char *const str[] = {"minLength", "maxLength", "format", "pattern", NULL};
    static const char *const num[] = {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", NULL};
    for (int i = 0; obj[i]; i++)
        if (json_object_get(s, obj[i])) return "object";
    for (int i = 0; arr[i]; i++)
        if (json_object_get(s, arr[i])) return "array";
    for (int i = 0; str[i]; i++)
        if (json_object_get(s, str[i])) return "string";
    for (int i = 0; num[i]; i++)
        if (json_object_get(s, num[i])) return "number";
    return NULL;
}

static int compile(sc_ctx *c, const json_t *s, const char *path) {
    if (c->failed) return -1;
    if (json_is_true(s)) return sc_any_value(c);
    if (json_is_false(s)) return sc_fail(c, QD_ERR_INVALID_ARG, "the schema at %s is false: no value is valid", path);
    if (!json_is_object(s)) return sc_fail(c, QD_ERR_INVALID_ARG, "the schema at %s is not an object or a boolean", path);
    if (c->nesting >= QD_SCHEMA_MAX_NESTING)
        return sc_fail(c, QD_ERR_CAPACITY, "the schema nests deeper than %d levels at %s", QD_SCHEMA_MAX_NESTING, path);
    const char *k;
    const json_t *v;
    int n_struct = 0; /* keywords that constrain beside a combinator */
    json_object_foreach((json_t *)s, k, v) {
        if (in_list(ANNOTATIONS, k)) continue;
        if (!in_list(SUPPORTED, k)) return sc_fail(c, QD_ERR_UNSUPPORTED, "unsupported keyword '%s' at %s", k, path);
        if (strcmp(k, "anyOf") && strcmp(k, "oneOf") && strcmp(k, "allOf") && strcmp(k, "$ref") &&
            strcmp(k, "enum") && strcmp(k, "const"))
            n_struct++;
    }
    c->nesting++;
    int r = -1;
    const json_t *any = json_object_get(s, "anyOf"), *one = json_object_get(s, "oneOf");
    const json_t *all = json_object_get(s, "allOf"), *ref = json_object_get(s, "$ref");
    int n_comb = !!any + !!one + !!all + !!ref + !!json_object_get(s, "enum") + !!json_object_get(s, "const");
    if (n_comb > 1 || (n_comb && n_struct)) {
        const char *first = any ? "anyOf" : one ? "oneOf" : all ? "allOf" : ref ? "$ref" : json_object_get(s, "enum") ? "enum" : "const";
        r = sc_fail(c, QD_ERR_UNSUPPORTED, "unsupported combination at %s: '%s' together with other constraining keywords",
                    path, first);
    } else if (any) r = compile_alternatives(c, any, "anyOf", path);
    else if (one) {
        /* the union of the branches, which is oneOf only when they cannot overlap */
        r = compile_alternatives(c, one, "oneOf", path);
        if (r >= 0 && sc_oneof_exclusive(c, one, path)) r = -1;
    }
    else if (all) {
        if (!json_is_array(all) || json_array_size(all) != 1)
            r = sc_fail(c, QD_ERR_UNSUPPORTED, "unsupported keyword 'allOf' with other than one member at %s", path);
        else {
            char p[512];
            subpath(p, sizeof p, path, "allOf", "0");
            r = compile(c, json_array_get(all, 0), p);
        }
    } else if (ref) r = compile_ref(c, ref, path);
    else if (json_object_get(s, "enum")) r = compile_enum(c, json_object_get(s, "enum"), path);
    else if (json_object_get(s, "const")) r = compile_literal_value(c, json_object_get(s, "const"));
    else {
        const json_t *type = json_object_get(s, "type");
        if (!type) {
            const char *t = implied_type(s);
            r = t ? compile_type(c, s, t, path) : sc_any_value(c);
        } else if (json_is_string(type)) r = compile_type(c, s, json_string_value(type), path);
        else if (json_is_array(type) && json_array_size(type) > 0) {
            r = qd_grammar_rule(c->g);
            size_t i;
            json_array_foreach(type, i, v) {
                if (!json_is_string(v)) {
                    r = sc_fail(c, QD_ERR_INVALID_ARG, "'type' at %s must hold type names (item %zu)", path, i);
                    break;
                }
                int32_t t = compile_type(c, s, json_string_value(v), path);
                if (t < 0) {
                    r = -1;
                    break;
                }
                qd_grammar_alt(c->g, r, &t, 1);
            }
        } else r = sc_fail(c, QD_ERR_INVALID_ARG, "'type' at %s must be a type name or a non-empty array of them", path);
    }
    c->nesting--;
    if (c->g->too_large && !c->failed)
        return sc_fail(c, QD_ERR_CAPACITY, "the schema is too large: its grammar exceeds %d symbols", QD_GRAMMAR_MAX_SYMS);
    return c->failed ? -1 : r;
}

static void ctx_init(sc_ctx *c, qd_grammar *g, const json_t *root, qd_err *err) {
    memset(c, 0, sizeof *c);
    c->g = g;
    c->root = root;
    c->err = err;
    c->r_ws = c->r_char = c->r_string = c->r_value = c->r_object = c->r_number = c->r_integer = -1;
    for (int i = 0; i < 16; i++) c->r_digits[i] = c->r_upto_digits[i] = -1;
}

int qd_json_schema_rule(qd_grammar *g, const json_t *schema, qd_err *err) {
    sc_ctx c;
    ctx_init(&c, g, schema, err);
    int r = compile(&c, schema, "#");
    free(c.refs);
    return r;
}

int qd_json_any_value_rule(qd_grammar *g) {
    sc_ctx c;
    ctx_init(&c, g, NULL, NULL);
    return sc_any_value(&c);
}

int qd_json_any_object_rule(qd_grammar *g) {
    sc_ctx c;
    ctx_init(&c, g, NULL, NULL);
    return sc_any_object(&c);
}

qd_status qd_json_schema_grammar(const json_t *schema, qd_grammar **out, qd_err *err) {
    *out = NULL;
    qd_grammar *g = qd_grammar_new();
    if (!g) return qd_seterr(err, QD_ERR_OOM, "out of memory for a grammar");
    int r = schema ? qd_json_schema_rule(g, schema, err) : qd_json_any_object_rule(g);
    qd_status st = r < 0 ? (err && err->status ? err->status : QD_ERR_INVALID_ARG) : qd_grammar_finish(g, r, err);
    if (st != QD_OK) {
        qd_grammar_free(g);
        return st;
    }
    *out = g;
    return QD_OK;
}
