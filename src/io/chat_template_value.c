/* Chat-template values: arena, buffers, strings, lists, dicts, JSON input
 * conversion, and the Python text forms the output must match byte for byte
 * (str(), repr(), json.dumps). */
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "io/chat_template_int.h"

/* ------------------------------------------------------------------ arena */

struct ct_chunk { ct_chunk *next; size_t cap, used; max_align_t data[]; };

void *ct_alloc(ct_arena *a, size_t n) {
    n = (n + 15) & ~(size_t)15;
    if (n == 0) n = 16;
    if (a->limit && (a->total + n > a->limit || n > a->limit)) return NULL;
    ct_chunk *h = a->head;
    if (!h || h->cap - h->used < n) {
        size_t cap = n > 65536 ? n : 65536;
        h = malloc(sizeof(ct_chunk) + cap);
        if (!h) return NULL;
        h->cap = cap;
        h->used = 0;
        /* A big block goes behind the current head so the head keeps its free space. */
        if (a->head && cap == n) {
            h->next = a->head->next;
            a->head->next = h;
        } else {
            h->next = a->head;
            a->head = h;
        }
    }
    void *p = (char *)h->data + h->used;
    h->used += n;
    a->total += n;
    memset(p, 0, n);
    return p;
}

void ct_arena_free(ct_arena *a) {
    ct_chunk *h = a->head;
    while (h) {
        ct_chunk *nx = h->next;
        free(h);
        h = nx;
    }
    a->head = NULL;
    a->total = 0;
}

/* ------------------------------------------------------------------ buffer */

void ct_buf_put(ct_buf *b, const char *s, size_t n) {
    if (b->oom || n == 0) return;
    if (b->limit && b->n + n > b->limit) { b->oom = 2; return; }
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->n + n + 1) cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) { b->oom = 1; return; }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}

void ct_buf_putc(ct_buf *b, char c) { ct_buf_put(b, &c, 1); }

void ct_buf_free(ct_buf *b) {
    free(b->p);
    memset(b, 0, sizeof *b);
}

/* ------------------------------------------------------------------ errors */

int ct_fail(ct_ctx *c, qd_status st, const char *fmt, ...) {
    char msg[QD_ERRMSG_SIZE - 64];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    qd_seterr(c->err, st, "chat template line %d: %s", c->line, msg);
    return -1;
}

int ct_oom(ct_ctx *c) {
    return ct_fail(c, QD_ERR_CAPACITY, "memory limit exceeded while rendering (%zu bytes)", c->ar->total);
}

/* ------------------------------------------------------------------ containers */

tv ct_str_dup(ct_ctx *c, const char *p, size_t n, int *ok) {
    char *d = ct_alloc(c->ar, n + 1);
    if (!d) { *ok = 0; ct_oom(c); return tv_undef(); }
    if (n) memcpy(d, p, n);
    *ok = 1;
    return tv_strn(d, n);
}

tlist *ct_list_new(ct_ctx *c, size_t n) {
    if (n > ((size_t)1 << 40) / sizeof(tv)) { ct_oom(c); return NULL; }
    tlist *l = ct_alloc(c->ar, sizeof *l);
    /* Never NULL, even when empty, so memcpy of zero items stays well-defined. */
    tv *v = ct_alloc(c->ar, (n ? n : 1) * sizeof(tv));
    if (!l || !v) { ct_oom(c); return NULL; }
    l->n = n;
    l->v = v;
    return l;
}

int ct_iter_list(ct_ctx *c, tv v, tlist **out) {
    switch (v.t) {
    case TV_UNDEF: return (*out = ct_list_new(c, 0)) ? 0 : -1;
    case TV_LIST: *out = v.l; return 0;
    case TV_DICT: /* its keys */
        if (!(*out = ct_list_new(c, v.d->n))) return -1;
        memcpy((*out)->v, v.d->k, v.d->n * sizeof(tv));
        return 0;
    case TV_STR: {
        size_t n = ct_utf8_len(v.s.p, v.s.n), off = 0;
        if (!(*out = ct_list_new(c, n))) return -1;
        for (size_t i = 0; i < n; i++) {
            size_t nx = ct_utf8_next(v.s.p, v.s.n, off);
            (*out)->v[i] = tv_strn(v.s.p + off, nx - off);
            off = nx;
        }
        return 0;
    }
    default: return ct_fail(c, QD_ERR_INVALID_ARG, "'%s' object is not iterable", ct_type_name(v));
    }
}

tdict *ct_dict_new(ct_ctx *c, size_t cap) {
    if (cap < 4) cap = 4;
    tdict *d = ct_alloc(c->ar, sizeof *d);
    tv *k = ct_alloc(c->ar, cap * sizeof(tv)), *v = ct_alloc(c->ar, cap * sizeof(tv));
    if (!d || !k || !v) { ct_oom(c); return NULL; }
    d->cap = cap;
    d->k = k;
    d->v = v;
    return d;
}

tv *ct_dict_lookup(const tdict *d, tv key) {
    for (size_t i = 0; i < d->n; i++)
        if (ct_equal(d->k[i], key)) return &d->v[i];
    return NULL;
}

tv *ct_dict_get(const tdict *d, const char *key, size_t n) {
    for (size_t i = 0; i < d->n; i++)
        if (d->k[i].t == TV_STR && d->k[i].s.n == n && memcmp(d->k[i].s.p, key, n) == 0) return &d->v[i];
    return NULL;
}

/* Insert or replace; a replaced key keeps its position, as in a Python dict. */
int ct_dict_set(ct_ctx *c, tdict *d, tv k, tv v) {
    tv *slot = ct_dict_lookup(d, k);
    if (slot) { *slot = v; return 0; }
    if (d->n == d->cap) {
        size_t cap = d->cap * 2;
        tv *nk = ct_alloc(c->ar, cap * sizeof(tv)), *nv = ct_alloc(c->ar, cap * sizeof(tv));
        if (!nk || !nv) return ct_oom(c);
        memcpy(nk, d->k, d->n * sizeof(tv));
        memcpy(nv, d->v, d->n * sizeof(tv));
        d->k = nk;
        d->v = nv;
        d->cap = cap;
    }
    d->k[d->n] = k;
    d->v[d->n] = v;
    d->n++;
    return 0;
}

/* ------------------------------------------------------------------ semantics */

int ct_truthy(tv v) {
    switch (v.t) {
    case TV_UNDEF: case TV_NONE: return 0;
    case TV_BOOL: return v.b;
    case TV_INT: return v.i != 0;
    case TV_FLOAT: return v.f != 0.0;
    case TV_STR: return v.s.n != 0;
    case TV_LIST: return v.l->n != 0;
    case TV_DICT: return v.d->n != 0;
    default: return 1;
    }
}

static int is_num(tv v) { return v.t == TV_BOOL || v.t == TV_INT || v.t == TV_FLOAT; }

/* Python ==: numbers compare by value across bool/int/float; a tuple never
 * equals a list; Undefined equals only Undefined. */
int ct_equal(tv a, tv b) {
    if (is_num(a) && is_num(b)) {
        if (a.t == TV_FLOAT || b.t == TV_FLOAT) {
            double x = a.t == TV_FLOAT ? a.f : a.t == TV_INT ? (double)a.i : a.b;
            double y = b.t == TV_FLOAT ? b.f : b.t == TV_INT ? (double)b.i : b.b;
            return x == y;
        }
        int64_t x = a.t == TV_INT ? a.i : a.b, y = b.t == TV_INT ? b.i : b.b;
        return x == y;
    }
    if (a.t != b.t) return 0;
    switch (a.t) {
    case TV_UNDEF: case TV_NONE: return 1;
    case TV_STR: return a.s.n == b.s.n && memcmp(a.s.p, b.s.p, a.s.n) == 0;
    case TV_LIST:
        if (a.l->tuple != b.l->tuple || a.l->n != b.l->n) return 0;
        for (size_t i = 0; i < a.l->n; i++)
            if (!ct_equal(a.l->v[i], b.l->v[i])) return 0;
        return 1;
    case TV_DICT:
        if (a.d->n != b.d->n) return 0;
        for (size_t i = 0; i < a.d->n; i++) {
            tv *o = ct_dict_lookup(b.d, a.d->k[i]);
            if (!o || !ct_equal(a.d->v[i], *o)) return 0;
        }
        return 1;
    case TV_NS: return a.d == b.d;
    case TV_FUNC: return a.fn == b.fn;
    case TV_MACRO: return a.m == b.m;
    default: return 0;
    }
}

const char *ct_type_name(tv v) {
    static const char *names[] = {"Undefined", "NoneType", "bool", "int", "float", "str", "list",
                                  "dict", "Namespace", "function", "Macro", "method", "LoopContext"};
    if (v.t == TV_LIST && v.l->tuple) return "tuple";
    return names[v.t];
}

/* ------------------------------------------------------------------ UTF-8 */

size_t ct_utf8_next(const char *p, size_t n, size_t i) {
    i++;
    while (i < n && ((unsigned char)p[i] & 0xC0) == 0x80) i++;
    return i;
}

size_t ct_utf8_len(const char *p, size_t n) {
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        if (((unsigned char)p[i] & 0xC0) != 0x80) k++;
    return k;
}

/* ------------------------------------------------------------------ JSON input */

int ct_from_json(ct_ctx *c, const void *jv, tv *out) {
    const json_t *j = jv;
    if (++c->depth > c->max_depth + 800) {
        c->depth--;
        return ct_fail(c, QD_ERR_CAPACITY, "input JSON nested too deeply");
    }
    int rc = 0;
    switch (json_typeof(j)) {
    case JSON_NULL: *out = tv_none(); break;
    case JSON_TRUE: *out = tv_bool(1); break;
    case JSON_FALSE: *out = tv_bool(0); break;
    case JSON_INTEGER: *out = tv_int(json_integer_value(j)); break;
    case JSON_REAL: *out = tv_float(json_real_value(j)); break;
    case JSON_STRING: {
        int ok;
        *out = ct_str_dup(c, json_string_value(j), json_string_length(j), &ok);
        if (!ok) rc = -1;
        break;
    }
    case JSON_ARRAY: {
        size_t n = json_array_size(j);
        tlist *l = ct_list_new(c, n);
        if (!l) { rc = -1; break; }
        for (size_t i = 0; i < n && rc == 0; i++) rc = ct_from_json(c, json_array_get(j, i), &l->v[i]);
        out->t = TV_LIST;
        out->l = l;
        break;
    }
    case JSON_OBJECT: {
        tdict *d = ct_dict_new(c, json_object_size(j));
        if (!d) { rc = -1; break; }
        const char *key;
        json_t *val;
        /* jansson iterates objects in insertion order, which is the order
         * Python's json.loads keeps and tojson must reproduce. */
        json_object_foreach((json_t *)j, key, val) {
            int ok;
            tv k = ct_str_dup(c, key, strlen(key), &ok), v;
            if (!ok || ct_from_json(c, val, &v) || ct_dict_set(c, d, k, v)) { rc = -1; break; }
        }
        out->t = TV_DICT;
        out->d = d;
        break;
    }
    }
    c->depth--;
    return rc;
}

/* ------------------------------------------------------------------ text forms */

/* Python's repr(float): the shortest digits that round-trip, fixed notation for
 * exponents in [-4, 16), otherwise d.ddde+XX. */
static void put_float(ct_buf *b, double f, int json) {
    char tmp[64];
    if (isnan(f)) { ct_buf_puts(b, json ? "NaN" : "nan"); return; }
    if (isinf(f)) { ct_buf_puts(b, f < 0 ? (json ? "-Infinity" : "-inf") : (json ? "Infinity" : "inf")); return; }
    if (f == 0) { ct_buf_puts(b, signbit(f) ? "-0.0" : "0.0"); return; }
    int prec;
    for (prec = 1; prec <= 17; prec++) {
        snprintf(tmp, sizeof tmp, "%.*e", prec - 1, f);
        if (strtod(tmp, NULL) == f) break;
    }
    char digits[32];
    int nd = 0, neg = 0;
    const char *q = tmp;
    if (*q == '-') { neg = 1; q++; }
    for (; *q && *q != 'e'; q++)
        if (*q >= '0' && *q <= '9') digits[nd++] = *q;
    int exp = atoi(q + 1);
    while (nd > 1 && digits[nd - 1] == '0') nd--;
    digits[nd] = 0;
    if (neg) ct_buf_putc(b, '-');
    if (exp >= -4 && exp < 16) {
        int decpt = exp + 1;
        if (decpt <= 0) {
            ct_buf_puts(b, "0.");
            for (int i = 0; i < -decpt; i++) ct_buf_putc(b, '0');
            ct_buf_put(b, digits, (size_t)nd);
        } else if (decpt >= nd) {
            ct_buf_put(b, digits, (size_t)nd);
            for (int i = nd; i < decpt; i++) ct_buf_putc(b, '0');
            ct_buf_puts(b, ".0");
        } else {
            ct_buf_put(b, digits, (size_t)decpt);
            ct_buf_putc(b, '.');
            ct_buf_put(b, digits + decpt, (size_t)(nd - decpt));
        }
    } else {
        ct_buf_putc(b, digits[0]);
        if (nd > 1) {
            ct_buf_putc(b, '.');
            ct_buf_put(b, digits + 1, (size_t)(nd - 1));
        }
        snprintf(tmp, sizeof tmp, "e%c%02d", exp < 0 ? '-' : '+', exp < 0 ? -exp : exp);
        ct_buf_puts(b, tmp);
    }
}

static void put_int(ct_buf *b, int64_t i) {
    char tmp[32];
    snprintf(tmp, sizeof tmp, "%lld", (long long)i);
    ct_buf_puts(b, tmp);
}

/* Decodes one UTF-8 sequence; invalid bytes come back as themselves (as U+DCxx
 * would in Python's surrogateescape) so output stays byte-faithful. */
static int32_t decode_cp(const char *p, size_t n, size_t *adv) {
    utf8proc_int32_t cp;
    utf8proc_ssize_t k = utf8proc_iterate((const utf8proc_uint8_t *)p, (utf8proc_ssize_t)n, &cp);
    if (k <= 0) { *adv = 1; return -1; }
    *adv = (size_t)k;
    return cp;
}

static void put_repr_str(ct_buf *b, const char *p, size_t n) {
    int has_sq = memchr(p, '\'', n) != NULL, has_dq = memchr(p, '"', n) != NULL;
    char quote = (has_sq && !has_dq) ? '"' : '\'';
    char tmp[16];
    ct_buf_putc(b, quote);
    for (size_t i = 0; i < n;) {
        size_t adv;
        int32_t cp = decode_cp(p + i, n - i, &adv);
        if (cp < 0) {
            snprintf(tmp, sizeof tmp, "\\udc%02x", (unsigned char)p[i]);
            ct_buf_puts(b, tmp);
        } else if (cp == '\\' || cp == quote) {
            ct_buf_putc(b, '\\');
            ct_buf_putc(b, (char)cp);
        } else if (cp == '\n') ct_buf_puts(b, "\\n");
        else if (cp == '\r') ct_buf_puts(b, "\\r");
        else if (cp == '\t') ct_buf_puts(b, "\\t");
        else if (cp < 0x20 || cp == 0x7f) {
            snprintf(tmp, sizeof tmp, "\\x%02x", (unsigned)cp);
            ct_buf_puts(b, tmp);
        } else if (cp < 0x7f) ct_buf_putc(b, (char)cp);
        else {
            /* str.isprintable(): not in categories Cc Cf Cs Co Cn Zl Zp Zs. */
            utf8proc_category_t cat = utf8proc_category(cp);
            int np = cat == UTF8PROC_CATEGORY_CC || cat == UTF8PROC_CATEGORY_CF ||
                     cat == UTF8PROC_CATEGORY_CS || cat == UTF8PROC_CATEGORY_CO ||
                     cat == UTF8PROC_CATEGORY_CN || cat == UTF8PROC_CATEGORY_ZL ||
                     cat == UTF8PROC_CATEGORY_ZP || cat == UTF8PROC_CATEGORY_ZS;
            if (!np) ct_buf_put(b, p + i, adv);
            else {
                if (cp <= 0xff) snprintf(tmp, sizeof tmp, "\\x%02x", (unsigned)cp);
                else if (cp <= 0xffff) snprintf(tmp, sizeof tmp, "\\u%04x", (unsigned)cp);
                else snprintf(tmp, sizeof tmp, "\\U%08x", (unsigned)cp);
                ct_buf_puts(b, tmp);
            }
        }
        i += adv;
    }
    ct_buf_putc(b, quote);
}

/* Containers print through repr. Namespaces can contain themselves, so the
 * walk is depth-capped ("...") and stops once the buffer hit its limit. */
static void repr_d(ct_buf *b, tv v, int depth);

static void repr_items(ct_buf *b, const tdict *d, int depth) {
    for (size_t i = 0; i < d->n && !b->oom; i++) {
        if (i) ct_buf_puts(b, ", ");
        repr_d(b, d->k[i], depth + 1);
        ct_buf_puts(b, ": ");
        repr_d(b, d->v[i], depth + 1);
    }
}

static void repr_d(ct_buf *b, tv v, int depth) {
    if (b->oom) return;
    if (depth > 100) { ct_buf_puts(b, "..."); return; }
    switch (v.t) {
    case TV_UNDEF: ct_buf_puts(b, "Undefined"); return;
    case TV_STR: put_repr_str(b, v.s.p, v.s.n); return;
    case TV_LIST:
        ct_buf_putc(b, v.l->tuple ? '(' : '[');
        for (size_t i = 0; i < v.l->n && !b->oom; i++) {
            if (i) ct_buf_puts(b, ", ");
            repr_d(b, v.l->v[i], depth + 1);
        }
        if (v.l->tuple && v.l->n == 1) ct_buf_putc(b, ',');
        ct_buf_putc(b, v.l->tuple ? ')' : ']');
        return;
    case TV_DICT:
        ct_buf_putc(b, '{');
        repr_items(b, v.d, depth);
        ct_buf_putc(b, '}');
        return;
    case TV_NS:
        ct_buf_puts(b, "<Namespace {");
        repr_items(b, v.d, depth);
        ct_buf_puts(b, "}>");
        return;
    default: ct_to_str(b, v);
    }
}

void ct_repr(ct_buf *b, tv v) { repr_d(b, v, 0); }

void ct_to_str(ct_buf *b, tv v) {
    switch (v.t) {
    case TV_UNDEF: return;
    case TV_NONE: ct_buf_puts(b, "None"); return;
    case TV_BOOL: ct_buf_puts(b, v.b ? "True" : "False"); return;
    case TV_INT: put_int(b, v.i); return;
    case TV_FLOAT: put_float(b, v.f, 0); return;
    case TV_STR: ct_buf_put(b, v.s.p, v.s.n); return;
    case TV_LIST: case TV_DICT: case TV_NS: repr_d(b, v, 0); return;
    case TV_FUNC: ct_buf_puts(b, "<function>"); return;
    case TV_MACRO: ct_buf_puts(b, "<Macro>"); return;
    case TV_METHOD: ct_buf_puts(b, "<built-in method>"); return;
    case TV_LOOP: ct_buf_puts(b, "<LoopContext>"); return;
    }
}

int ct_stringify(ct_ctx *c, tv v, tv *out) {
    if (v.t == TV_STR) { *out = v; return 0; }
    ct_buf b = {0};
    b.limit = c->out->limit;   /* temporaries obey the output bound too */
    ct_to_str(&b, v);
    if (b.oom) { ct_buf_free(&b); return ct_oom(c); }
    int ok;
    *out = ct_str_dup(c, b.p ? b.p : "", b.n, &ok);
    ct_buf_free(&b);
    return ok ? 0 : -1;
}

/* json.dumps string escaping: ", \, \n \r \t \b \f, other controls as \u00xx;
 * with ensure_ascii also every non-ASCII code point (surrogate pairs above BMP). */
static void put_json_str(ct_buf *b, const char *p, size_t n, int ensure_ascii) {
    char tmp[16];
    ct_buf_putc(b, '"');
    size_t run = 0;
    for (size_t i = 0; i < n;) {
        unsigned char ch = (unsigned char)p[i];
        const char *esc = NULL;
        switch (ch) {
        case '"': esc = "\\\""; break;
        case '\\': esc = "\\\\"; break;
        case '\n': esc = "\\n"; break;
        case '\r': esc = "\\r"; break;
        case '\t': esc = "\\t"; break;
        case '\b': esc = "\\b"; break;
        case '\f': esc = "\\f"; break;
        }
        if (!esc && ch >= 0x20 && (ch < 0x80 || !ensure_ascii)) { i++; continue; }
        ct_buf_put(b, p + run, i - run);
        if (esc) { ct_buf_puts(b, esc); i++; }
        else if (ch < 0x20) { snprintf(tmp, sizeof tmp, "\\u%04x", ch); ct_buf_puts(b, tmp); i++; }
        else {
            size_t adv;
            int32_t cp = decode_cp(p + i, n - i, &adv);
            if (cp < 0) cp = 0xDC00 + ch;
            if (cp >= 0x10000) {
                cp -= 0x10000;
                snprintf(tmp, sizeof tmp, "\\u%04x\\u%04x", 0xD800 + (cp >> 10), 0xDC00 + (cp & 0x3FF));
            } else snprintf(tmp, sizeof tmp, "\\u%04x", (unsigned)cp);
            ct_buf_puts(b, tmp);
            i += adv;
        }
        run = i;
    }
    ct_buf_put(b, p + run, n - run);
    ct_buf_putc(b, '"');
}

static void put_indent(ct_buf *b, const char *indent, int level) {
    ct_buf_putc(b, '\n');
    for (int i = 0; i < level; i++) ct_buf_puts(b, indent);
}

static int key_cmp(const void *x, const void *y) {
    const tv *a = *(const tv *const *)x, *b = *(const tv *const *)y;
    size_t n = a->s.n < b->s.n ? a->s.n : b->s.n;
    int r = memcmp(a->s.p, b->s.p, n);
    return r ? r : (a->s.n > b->s.n) - (a->s.n < b->s.n);
}

int ct_tojson(ct_ctx *c, ct_buf *b, tv v, int ensure_ascii, const char *indent, const char *item_sep,
              const char *key_sep, int sort_keys, int level) {
    if (level > c->max_depth + 800) return ct_fail(c, QD_ERR_CAPACITY, "tojson: value nested too deeply");
    if (++c->steps > c->max_steps) return ct_fail(c, QD_ERR_CAPACITY, "step limit exceeded");
    switch (v.t) {
    case TV_NONE: ct_buf_puts(b, "null"); return 0;
    case TV_BOOL: ct_buf_puts(b, v.b ? "true" : "false"); return 0;
    case TV_INT: put_int(b, v.i); return 0;
    case TV_FLOAT: put_float(b, v.f, 1); return 0;
    case TV_STR: put_json_str(b, v.s.p, v.s.n, ensure_ascii); return 0;
    case TV_LIST:
        if (v.l->n == 0) { ct_buf_puts(b, "[]"); return 0; }
        ct_buf_putc(b, '[');
        for (size_t i = 0; i < v.l->n; i++) {
            if (i) ct_buf_puts(b, item_sep);
            if (indent) put_indent(b, indent, level + 1);
            if (ct_tojson(c, b, v.l->v[i], ensure_ascii, indent, item_sep, key_sep, sort_keys, level + 1))
                return -1;
        }
        if (indent) put_indent(b, indent, level);
        ct_buf_putc(b, ']');
        return 0;
    case TV_DICT: {
        if (v.d->n == 0) { ct_buf_puts(b, "{}"); return 0; }
        size_t n = v.d->n;
        const tv **order = ct_alloc(c->ar, n * sizeof *order);
        if (!order) return ct_oom(c);
        for (size_t i = 0; i < n; i++) {
            tv k = v.d->k[i];
            if (k.t != TV_STR && k.t != TV_INT && k.t != TV_FLOAT && k.t != TV_BOOL && k.t != TV_NONE)
                return ct_fail(c, QD_ERR_INVALID_ARG, "tojson: keys must be str, int, float, bool or None, not %s",
                               ct_type_name(k));
            order[i] = &v.d->k[i];
        }
        if (sort_keys) {
            for (size_t i = 0; i < n; i++)
                if (order[i]->t != TV_STR) return ct_fail(c, QD_ERR_UNSUPPORTED, "tojson: sort_keys needs str keys");
            qsort(order, n, sizeof *order, key_cmp);
        }
        ct_buf_putc(b, '{');
        for (size_t i = 0; i < n; i++) {
            const tv *k = order[i];
            const tv *val = &v.d->v[k - v.d->k];
            if (i) ct_buf_puts(b, item_sep);
            if (indent) put_indent(b, indent, level + 1);
            if (k->t == TV_STR) put_json_str(b, k->s.p, k->s.n, ensure_ascii);
            else {
                /* Python converts non-str keys with their JSON spelling. */
                ct_buf_putc(b, '"');
                if (k->t == TV_FLOAT) put_float(b, k->f, 1);
                else if (ct_tojson(c, b, *k, ensure_ascii, indent, item_sep, key_sep, 0, level + 1)) return -1;
                ct_buf_putc(b, '"');
            }
            ct_buf_puts(b, key_sep);
            if (ct_tojson(c, b, *val, ensure_ascii, indent, item_sep, key_sep, sort_keys, level + 1)) return -1;
        }
        if (indent) put_indent(b, indent, level);
        ct_buf_putc(b, '}');
        return 0;
    }
    default:
        return ct_fail(c, QD_ERR_INVALID_ARG, "tojson: Object of type %s is not JSON serializable", ct_type_name(v));
    }
}
