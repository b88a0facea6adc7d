/* Chat-template filters (`x | f(...)`) and tests (`x is t`), with Jinja2's
 * behaviour and transformers' tojson (json.dumps with ensure_ascii=False,
 * key order kept, separators ", " / ": "). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/chat_template_int.h"

enum {
    F_ABS, F_ATTR, F_CAPITALIZE, F_COUNT, F_D, F_DEFAULT, F_E, F_ESCAPE, F_FIRST, F_FLOAT, F_INDENT,
    F_INT, F_ITEMS, F_JOIN, F_LAST, F_LENGTH, F_LIST, F_LOWER, F_MAP, F_MAX, F_MIN, F_REJECT,
    F_REJECTATTR, F_REPLACE, F_REVERSE, F_SAFE, F_SELECT, F_SELECTATTR, F_STRING, F_SUM, F_TITLE,
    F_TOJSON, F_TRIM, F_UPPER, F_N
};
static const char *const FILTERS[F_N] = {
    "abs", "attr", "capitalize", "count", "d", "default", "e", "escape", "first", "float", "indent",
    "int", "items", "join", "last", "length", "list", "lower", "map", "max", "min", "reject",
    "rejectattr", "replace", "reverse", "safe", "select", "selectattr", "string", "sum", "title",
    "tojson", "trim", "upper"};

enum {
    T_BOOLEAN, T_CALLABLE, T_DEFINED, T_DIVISIBLEBY, T_EQ, T_EQUALTO, T_ESCAPED, T_EVEN, T_FALSE,
    T_FLOAT, T_GE, T_GT, T_GREATERTHAN, T_IN, T_INTEGER, T_ITERABLE, T_LE, T_LESSTHAN, T_LOWER, T_LT,
    T_MAPPING, T_NE, T_NONE, T_NUMBER, T_ODD, T_SAMEAS, T_SEQUENCE, T_STRING, T_TRUE, T_UNDEFINED,
    T_UPPER, T_OPEQ, T_OPNE, T_OPLT, T_OPLE, T_OPGT, T_OPGE, T_N
};
static const char *const TESTS[T_N] = {
    "boolean", "callable", "defined", "divisibleby", "eq", "equalto", "escaped", "even", "false",
    "float", "ge", "gt", "greaterthan", "in", "integer", "iterable", "le", "lessthan", "lower", "lt",
    "mapping", "ne", "none", "number", "odd", "sameas", "sequence", "string", "true", "undefined",
    "upper", "==", "!=", "<", "<=", ">", ">="};

int ct_filter_id(const char *name) {
    for (int i = 0; i < F_N; i++)
        if (strcmp(name, FILTERS[i]) == 0) return i;
    return -1;
}

int ct_test_id(const char *name) {
    for (int i = 0; i < T_N; i++)
        if (strcmp(name, TESTS[i]) == 0) return i;
    return -1;
}

/* ------------------------------------------------------------------ arguments */

/* Binds positional and keyword arguments to a filter's parameter names;
 * unknown keywords and surplus positionals are errors, as in Python. */
static int bind(ct_ctx *c, const char *fname, const char *const *params, tv *vals, int *given, tv *args, int nargs,
                const char **kw, tv *kwv, int nkw) {
    int np = 0;
    while (params[np]) np++;
    for (int i = 0; i < np; i++) given[i] = 0;
    if (nargs > np) return ct_fail(c, QD_ERR_INVALID_ARG, "filter '%s' takes at most %d argument(s), %d given", fname, np, nargs);
    for (int i = 0; i < nargs; i++) { vals[i] = args[i]; given[i] = 1; }
    for (int k = 0; k < nkw; k++) {
        int i = 0;
        while (i < np && strcmp(params[i], kw[k]) != 0) i++;
        if (i == np) return ct_fail(c, QD_ERR_INVALID_ARG, "filter '%s' got an unexpected keyword argument '%s'", fname, kw[k]);
        vals[i] = kwv[k];
        given[i] = 1;
    }
    return 0;
}

static int need_str(ct_ctx *c, const char *what, tv v, tv *out) {
    if (v.t == TV_UNDEF) { *out = tv_strn("", 0); return 0; }
    (void)what;
    return ct_stringify(c, v, out);
}

static tv list_val(tlist *l) { tv v = {0}; v.t = TV_LIST; v.l = l; return v; }

/* Dotted attribute path as used by map/selectattr/join(attribute=...). */
static int attr_path(ct_ctx *c, tv obj, tv path, tv *out) {
    if (path.t == TV_INT) return ct_getitem(c, obj, path, out);
    if (path.t != TV_STR) return ct_fail(c, QD_ERR_INVALID_ARG, "attribute must be a string");
    const char *p = path.s.p, *e = p + path.s.n;
    *out = obj;
    while (p <= e) {
        const char *dot = memchr(p, '.', (size_t)(e - p));
        if (!dot) dot = e;
        tv key = tv_strn(p, (size_t)(dot - p)), next;
        if (out->t == TV_UNDEF) return 0;
        if (ct_getitem(c, *out, key, &next)) return -1;
        *out = next;
        p = dot + 1;
    }
    return 0;
}

/* select/reject/selectattr/rejectattr: args[first] names the test, the rest are its arguments. */
static int filter_select(ct_ctx *c, tv v, tv *args, int nargs, int by_attr, int keep, tv *out) {
    tlist *in, *res;
    if (ct_iter_list(c, v, &in) || !(res = ct_list_new(c, in->n))) return -1;
    res->n = 0;
    int ai = by_attr ? 1 : 0;
    if (by_attr && nargs < 1) return ct_fail(c, QD_ERR_INVALID_ARG, "selectattr/rejectattr need an attribute name");
    int tid = -1;
    /* Like Jinja, the test name is only resolved when there is an item to test. */
    if (nargs > ai && in->n) {
        if (args[ai].t != TV_STR) return ct_fail(c, QD_ERR_INVALID_ARG, "test name must be a string");
        char name[32];
        snprintf(name, sizeof name, "%.*s", (int)(args[ai].s.n > 31 ? 31 : args[ai].s.n), args[ai].s.p);
        if ((tid = ct_test_id(name)) < 0) return ct_fail(c, QD_ERR_UNSUPPORTED, "unsupported construct: no test named '%s'", name);
    }
    for (size_t i = 0; i < in->n; i++) {
        tv item = in->v[i];
        int r;
        if (by_attr && attr_path(c, in->v[i], args[0], &item)) return -1;
        if (tid < 0) r = ct_truthy(item);
        else if (ct_apply_test(c, tid, item, args + ai + 1, nargs - ai - 1, &r)) return -1;
        if (r == keep) res->v[res->n++] = in->v[i];
    }
    *out = list_val(res);
    return 0;
}

static int html_escape(ct_ctx *c, tv v, tv *out) {
    tv s;
    if (need_str(c, "escape", v, &s)) return -1;
    ct_buf b = {0};
    b.limit = c->out->limit;   /* temporaries obey the output bound too */
    for (size_t i = 0; i < s.s.n; i++) {
        switch (s.s.p[i]) {
        case '&': ct_buf_puts(&b, "&amp;"); break;
        case '<': ct_buf_puts(&b, "&lt;"); break;
        case '>': ct_buf_puts(&b, "&gt;"); break;
        case '"': ct_buf_puts(&b, "&#34;"); break;
        case '\'': ct_buf_puts(&b, "&#39;"); break;
        default: ct_buf_putc(&b, s.s.p[i]);
        }
    }
    int ok = !b.oom;
    if (ok) *out = ct_str_dup(c, b.p ? b.p : "", b.n, &ok);
    else ct_oom(c);
    ct_buf_free(&b);
    return ok ? 0 : -1;
}

static int filter_tojson(ct_ctx *c, tv v, tv *args, int nargs, const char **kw, tv *kwv, int nkw, tv *out) {
    /* transformers' signature: tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False) */
    static const char *const P[] = {"ensure_ascii", "indent", "separators", "sort_keys", NULL};
    tv a[4];
    int g[4];
    if (bind(c, "tojson", P, a, g, args, nargs, kw, kwv, nkw)) return -1;
    int ensure_ascii = g[0] && ct_truthy(a[0]), sort_keys = g[3] && ct_truthy(a[3]);
    char indent_buf[64];
    const char *indent = NULL;
    if (g[1] && a[1].t != TV_NONE) {
        if (a[1].t == TV_INT) {
            int64_t k = a[1].i < 0 ? 0 : a[1].i > 32 ? 32 : a[1].i;
            memset(indent_buf, ' ', (size_t)k);
            indent_buf[k] = 0;
        } else if (a[1].t == TV_STR) {
            snprintf(indent_buf, sizeof indent_buf, "%.*s", (int)(a[1].s.n > 63 ? 63 : a[1].s.n), a[1].s.p);
        } else return ct_fail(c, QD_ERR_INVALID_ARG, "tojson: indent must be an int or a string");
        indent = indent_buf;
    }
    char item_sep[32], key_sep[32];
    strcpy(item_sep, indent ? "," : ", ");
    strcpy(key_sep, ": ");
    if (g[2] && a[2].t != TV_NONE) {
        if (a[2].t != TV_LIST || a[2].l->n != 2 || a[2].l->v[0].t != TV_STR || a[2].l->v[1].t != TV_STR)
            return ct_fail(c, QD_ERR_INVALID_ARG, "tojson: separators must be a pair of strings");
        snprintf(item_sep, sizeof item_sep, "%.*s", (int)(a[2].l->v[0].s.n > 31 ? 31 : a[2].l->v[0].s.n), a[2].l->v[0].s.p);
        snprintf(key_sep, sizeof key_sep, "%.*s", (int)(a[2].l->v[1].s.n > 31 ? 31 : a[2].l->v[1].s.n), a[2].l->v[1].s.p);
    }
    ct_buf b = {0};
    b.limit = c->out->limit;   /* temporaries obey the output bound too */
    int rc = ct_tojson(c, &b, v, ensure_ascii, indent, item_sep, key_sep, sort_keys, 0);
    if (rc == 0 && b.oom) rc = ct_oom(c);
    int ok = 1;
    if (rc == 0) *out = ct_str_dup(c, b.p ? b.p : "", b.n, &ok);
    ct_buf_free(&b);
    return rc || !ok ? -1 : 0;
}

static int filter_indent(ct_ctx *c, tv v, tv *args, int nargs, const char **kw, tv *kwv, int nkw, tv *out) {
    static const char *const P[] = {"width", "first", "blank", NULL};
    tv a[3], s;
    int g[3];
    /* Jinja's indent does `s += "\n"`, so only strings are accepted. */
    if (v.t != TV_STR)
        return ct_fail(c, QD_ERR_INVALID_ARG, "filter 'indent': unsupported operand type(s) for +=: '%s' and 'str'", ct_type_name(v));
    if (bind(c, "indent", P, a, g, args, nargs, kw, kwv, nkw) || need_str(c, "indent", v, &s)) return -1;
    tv ind = tv_strn("    ", 4);
    if (g[0] && a[0].t == TV_STR) ind = a[0];
    else if (g[0] && a[0].t == TV_INT) {
        int64_t w = a[0].i < 0 ? 0 : a[0].i > 256 ? 256 : a[0].i;
        char *sp = ct_alloc(c->ar, (size_t)w + 1);
        if (!sp) return ct_oom(c);
        memset(sp, ' ', (size_t)w);
        ind = tv_strn(sp, (size_t)w);
    }
    int first = g[1] && ct_truthy(a[1]), blank = g[2] && ct_truthy(a[2]);
    ct_buf b = {0};
    b.limit = c->out->limit;   /* temporaries obey the output bound too */
    if (first) ct_buf_put(&b, ind.s.p, ind.s.n);
    /* Lines split at \n; a line gets the indent unless it is empty (or blank=True). */
    size_t st = 0;
    int line_no = 0;
    for (size_t i = 0; i <= s.s.n; i++) {
        if (i < s.s.n && s.s.p[i] != '\n') continue;
        if (line_no > 0) {
            ct_buf_putc(&b, '\n');
            if (blank || i > st) ct_buf_put(&b, ind.s.p, ind.s.n);
        }
        ct_buf_put(&b, s.s.p + st, i - st);
        st = i + 1;
        line_no++;
    }
    int ok = !b.oom;
    if (ok) *out = ct_str_dup(c, b.p ? b.p : "", b.n, &ok);
    else ct_oom(c);
    ct_buf_free(&b);
    return ok ? 0 : -1;
}

static int num_from_str(tv s, int want_float, tv *out) {
    char buf[128];
    tv t = ct_strip(s, NULL, 1, 1);
    if (t.s.n == 0 || t.s.n >= sizeof buf) return -1;
    size_t k = 0;
    for (size_t i = 0; i < t.s.n; i++)
        if (t.s.p[i] != '_') buf[k++] = t.s.p[i];
    buf[k] = 0;
    char *end;
    if (!want_float) {
        long long v = strtoll(buf, &end, 10);
        if (*end == 0) { *out = tv_int(v); return 0; }
    }
    double f = strtod(buf, &end);
    if (*end != 0) return -1;
    if (want_float) *out = tv_float(f);
    else {
        if (!isfinite(f) || fabs(f) > 9.2e18) return -1;
        *out = tv_int((int64_t)f);
    }
    return 0;
}

int ct_apply_filter(ct_ctx *c, int id, tv v, tv *args, int nargs, const char **kw, tv *kwv, int nkw, tv *out) {
    tv s;
    tlist *l;
    switch (id) {
    case F_TOJSON: return filter_tojson(c, v, args, nargs, kw, kwv, nkw, out);
    case F_INDENT: return filter_indent(c, v, args, nargs, kw, kwv, nkw, out);
    case F_SELECT: case F_REJECT: case F_SELECTATTR: case F_REJECTATTR:
        if (nkw) return ct_fail(c, QD_ERR_UNSUPPORTED, "filter '%s' takes no keyword arguments", FILTERS[id]);
        return filter_select(c, v, args, nargs, id == F_SELECTATTR || id == F_REJECTATTR, id == F_SELECT || id == F_SELECTATTR, out);
    case F_DEFAULT: case F_D: {
        static const char *const P[] = {"default_value", "boolean", NULL};
        tv a[2];
        int g[2];
        if (bind(c, FILTERS[id], P, a, g, args, nargs, kw, kwv, nkw)) return -1;
        int use = v.t == TV_UNDEF || (g[1] && ct_truthy(a[1]) && !ct_truthy(v));
        *out = use ? (g[0] ? a[0] : tv_strn("", 0)) : v;
        return 0;
    }
    case F_MAP: {
        if (ct_iter_list(c, v, &l)) return -1;
        tlist *res = ct_list_new(c, l->n);
        if (!res) return -1;
        if (l->n == 0) { *out = list_val(res); return 0; }   /* Jinja checks arguments lazily */
        tv attr = tv_undef(), dflt = tv_undef();
        for (int k = 0; k < nkw; k++) {
            if (strcmp(kw[k], "attribute") == 0) attr = kwv[k];
            else if (strcmp(kw[k], "default") == 0) dflt = kwv[k];
            else return ct_fail(c, QD_ERR_INVALID_ARG, "map: unexpected keyword argument '%s'", kw[k]);
        }
        int fid = -1;
        if (attr.t == TV_UNDEF) {
            if (nargs < 1 || args[0].t != TV_STR) return ct_fail(c, QD_ERR_INVALID_ARG, "map needs a filter name or attribute=");
            char name[32];
            snprintf(name, sizeof name, "%.*s", (int)(args[0].s.n > 31 ? 31 : args[0].s.n), args[0].s.p);
            if ((fid = ct_filter_id(name)) < 0) return ct_fail(c, QD_ERR_UNSUPPORTED, "unsupported construct: no filter named '%s'", name);
        }
        for (size_t i = 0; i < l->n; i++) {
            if (fid >= 0) {
                if (ct_apply_filter(c, fid, l->v[i], args + 1, nargs - 1, NULL, NULL, 0, &res->v[i])) return -1;
            } else {
                if (attr_path(c, l->v[i], attr, &res->v[i])) return -1;
                if (res->v[i].t == TV_UNDEF && dflt.t != TV_UNDEF) res->v[i] = dflt;
            }
        }
        *out = list_val(res);
        return 0;
    }
    case F_JOIN: {
        static const char *const P[] = {"d", "attribute", NULL};
        tv a[2];
        int g[2];
        if (bind(c, "join", P, a, g, args, nargs, kw, kwv, nkw) || ct_iter_list(c, v, &l)) return -1;
        tv sep = tv_strn("", 0);
        if (g[0] && ct_stringify(c, a[0], &sep)) return -1;
        ct_buf b = {0};
        b.limit = c->out->limit;   /* temporaries obey the output bound too */
        int rc = 0;
        for (size_t i = 0; i < l->n && rc == 0; i++) {
            tv it = l->v[i];
            if (g[1] && (rc = attr_path(c, it, a[1], &it))) break;
            if (i) ct_buf_put(&b, sep.s.p, sep.s.n);
            ct_to_str(&b, it);
        }
        int ok = 1;
        if (rc == 0 && b.oom) rc = ct_oom(c);
        if (rc == 0) *out = ct_str_dup(c, b.p ? b.p : "", b.n, &ok);
        ct_buf_free(&b);
        return rc || !ok ? -1 : 0;
    }
    case F_REPLACE: {
        static const char *const P[] = {"old", "new", "count", NULL};
        tv a[3], o, n;
        int g[3];
        if (bind(c, "replace", P, a, g, args, nargs, kw, kwv, nkw)) return -1;
        if (!g[0] || !g[1]) return ct_fail(c, QD_ERR_INVALID_ARG, "replace needs old and new");
        if (need_str(c, "replace", v, &s) || ct_stringify(c, a[0], &o) || ct_stringify(c, a[1], &n)) return -1;
        return ct_str_replace(c, s, o, n, g[2] && a[2].t == TV_INT ? a[2].i : -1, out);
    }
    case F_INT: case F_FLOAT: {
        static const char *const P[] = {"default", "base", NULL};
        tv a[2];
        int g[2];
        if (bind(c, FILTERS[id], P, a, g, args, nargs, kw, kwv, nkw)) return -1;
        /* int(Undefined) raises in Jinja rather than falling back to the default. */
        if (v.t == TV_UNDEF) return ct_fail(c, QD_ERR_INVALID_ARG, "filter '%s' applied to an undefined value", FILTERS[id]);
        tv dflt = g[0] ? a[0] : id == F_INT ? tv_int(0) : tv_float(0.0);
        if (v.t == TV_INT || v.t == TV_BOOL) *out = id == F_INT ? tv_int(v.t == TV_INT ? v.i : v.b) : tv_float(v.t == TV_INT ? (double)v.i : v.b);
        else if (v.t == TV_FLOAT) {
            if (id == F_FLOAT) *out = v;
            else *out = isfinite(v.f) && fabs(v.f) < 9.2e18 ? tv_int((int64_t)v.f) : dflt;
        } else if (v.t == TV_STR) {
            if (num_from_str(v, id == F_FLOAT, out)) *out = dflt;
        } else *out = dflt;
        return 0;
    }
    case F_ATTR:
        if (nargs != 1 || nkw || args[0].t != TV_STR) return ct_fail(c, QD_ERR_INVALID_ARG, "attr needs one string argument");
        return ct_getattr(c, v, args[0].s.p, args[0].s.n, out);
    case F_TRIM: {
        static const char *const P[] = {"chars", NULL};
        tv a[1];
        int g[1];
        if (bind(c, "trim", P, a, g, args, nargs, kw, kwv, nkw) || need_str(c, "trim", v, &s)) return -1;
        tv chars;
        if (g[0] && a[0].t != TV_NONE && ct_stringify(c, a[0], &chars)) return -1;
        *out = ct_strip(s, g[0] && a[0].t != TV_NONE ? &chars : NULL, 1, 1);
        return 0;
    }
    }
    if (nargs || nkw) {
        if (id != F_SUM && id != F_MAX && id != F_MIN)
            return ct_fail(c, QD_ERR_UNSUPPORTED, "filter '%s' arguments are not supported", FILTERS[id]);
    }
    switch (id) {
    case F_LENGTH: case F_COUNT:
        switch (v.t) {
        case TV_UNDEF: *out = tv_int(0); return 0;
        case TV_STR: *out = tv_int((int64_t)ct_utf8_len(v.s.p, v.s.n)); return 0;
        case TV_LIST: *out = tv_int((int64_t)v.l->n); return 0;
        case TV_DICT: *out = tv_int((int64_t)v.d->n); return 0;
        default: return ct_fail(c, QD_ERR_INVALID_ARG, "object of type '%s' has no len()", ct_type_name(v));
        }
    case F_STRING: return need_str(c, "string", v, out);
    case F_SAFE: return need_str(c, "safe", v, out);
    case F_E: case F_ESCAPE: return html_escape(c, v, out);
    case F_UPPER: case F_LOWER: case F_CAPITALIZE:
        if (need_str(c, FILTERS[id], v, &s)) return -1;
        return ct_case_map(c, s, id == F_UPPER ? CT_CASE_UPPER : id == F_LOWER ? CT_CASE_LOWER : CT_CASE_CAPITALIZE, out);
    case F_TITLE: {
        /* Jinja's title: words start after '-', whitespace or an opening bracket. */
        if (need_str(c, "title", v, &s)) return -1;
        tv low;
        if (ct_case_map(c, s, CT_CASE_LOWER, &low)) return -1;
        char *d = ct_alloc(c->ar, low.s.n * 3 + 4);
        if (!d) return ct_oom(c);
        size_t k = 0;
        int start = 1;
        for (size_t i = 0; i < low.s.n;) {
            size_t nx = ct_utf8_next(low.s.p, low.s.n, i);
            char ch = low.s.p[i];
            int sep = ch == '-' || ch == '(' || ch == '{' || ch == '[' || ch == '<' || ct_space_at(low.s.p, low.s.n, i);
            if (start && !sep) {
                tv up;
                if (ct_case_map(c, tv_strn(low.s.p + i, nx - i), CT_CASE_UPPER, &up)) return -1;
                memcpy(d + k, up.s.p, up.s.n);
                k += up.s.n;
            } else {
                memcpy(d + k, low.s.p + i, nx - i);
                k += nx - i;
            }
            start = sep;
            i = nx;
        }
        *out = tv_strn(d, k);
        return 0;
    }
    case F_FIRST: case F_LAST:
        if (ct_iter_list(c, v, &l)) return -1;
        *out = l->n ? l->v[id == F_FIRST ? 0 : l->n - 1] : tv_undef();
        return 0;
    case F_LIST: {
        if (ct_iter_list(c, v, &l)) return -1;
        tlist *cp = ct_list_new(c, l->n);
        if (!cp) return -1;
        if (l->n) memcpy(cp->v, l->v, l->n * sizeof(tv));
        *out = list_val(cp);
        return 0;
    }
    case F_REVERSE: {
        if (v.t == TV_STR) {
            if (ct_iter_list(c, v, &l)) return -1;
            char *d = ct_alloc(c->ar, v.s.n + 1);
            if (!d) return ct_oom(c);
            size_t k = 0;
            for (size_t i = l->n; i-- > 0;) { memcpy(d + k, l->v[i].s.p, l->v[i].s.n); k += l->v[i].s.n; }
            *out = tv_strn(d, k);
            return 0;
        }
        if (ct_iter_list(c, v, &l)) return -1;
        tlist *r = ct_list_new(c, l->n);
        if (!r) return -1;
        for (size_t i = 0; i < l->n; i++) r->v[i] = l->v[l->n - 1 - i];
        *out = list_val(r);
        return 0;
    }
    case F_ITEMS: {
        if (v.t == TV_UNDEF) { l = ct_list_new(c, 0); if (!l) return -1; *out = list_val(l); return 0; }
        if (v.t != TV_DICT) return ct_fail(c, QD_ERR_INVALID_ARG, "Can only get item pairs from a mapping.");
        return ct_call_method(c, v, "items", NULL, 0, NULL, NULL, 0, out);
    }
    case F_ABS:
        if (v.t == TV_INT) { if (v.i == INT64_MIN) return ct_fail(c, QD_ERR_UNSUPPORTED, "integer overflow"); *out = tv_int(v.i < 0 ? -v.i : v.i); }
        else if (v.t == TV_BOOL) *out = tv_int(v.b);
        else if (v.t == TV_FLOAT) *out = tv_float(fabs(v.f));
        else return ct_fail(c, QD_ERR_INVALID_ARG, "bad operand type for abs(): '%s'", ct_type_name(v));
        return 0;
    case F_SUM: case F_MAX: case F_MIN: {
        tv attr = tv_undef(), acc = tv_int(0);
        for (int k = 0; k < nkw; k++) {
            if (strcmp(kw[k], "attribute") == 0) attr = kwv[k];
            else if (strcmp(kw[k], "start") == 0 && id == F_SUM) acc = kwv[k];
            else return ct_fail(c, QD_ERR_UNSUPPORTED, "filter '%s': unsupported argument '%s'", FILTERS[id], kw[k]);
        }
        if (nargs) return ct_fail(c, QD_ERR_UNSUPPORTED, "filter '%s': positional arguments are not supported", FILTERS[id]);
        if (ct_iter_list(c, v, &l)) return -1;
        if (id != F_SUM) {
            if (!l->n) { *out = tv_undef(); return 0; }
            *out = l->v[0];
            for (size_t i = 1; i < l->n; i++) {
                int r;
                tv a0 = *out, a1 = l->v[i];
                if (attr.t != TV_UNDEF && (attr_path(c, *out, attr, &a0) || attr_path(c, l->v[i], attr, &a1))) return -1;
                if (ct_compare(c, id == F_MAX ? OP_GT : OP_LT, a1, a0, &r)) return -1;
                if (r) *out = l->v[i];
            }
            return 0;
        }
        for (size_t i = 0; i < l->n; i++) {
            tv it = l->v[i];
            if (attr.t != TV_UNDEF && attr_path(c, it, attr, &it)) return -1;
            if (!((it.t == TV_INT || it.t == TV_BOOL || it.t == TV_FLOAT) && (acc.t == TV_INT || acc.t == TV_BOOL || acc.t == TV_FLOAT)))
                return ct_fail(c, QD_ERR_UNSUPPORTED, "sum: only numbers are supported");
            if (it.t == TV_FLOAT || acc.t == TV_FLOAT)
                acc = tv_float((acc.t == TV_FLOAT ? acc.f : acc.t == TV_INT ? (double)acc.i : acc.b) +
                               (it.t == TV_FLOAT ? it.f : it.t == TV_INT ? (double)it.i : it.b));
            else {
                int64_t r;
                if (__builtin_add_overflow(acc.t == TV_INT ? acc.i : acc.b, it.t == TV_INT ? it.i : it.b, &r))
                    return ct_fail(c, QD_ERR_UNSUPPORTED, "integer overflow in sum");
                acc = tv_int(r);
            }
        }
        *out = acc;
        return 0;
    }
    }
    return ct_fail(c, QD_ERR_INTERNAL, "bad filter %d", id);
}

/* ------------------------------------------------------------------ tests */

int ct_apply_test(ct_ctx *c, int id, tv v, tv *args, int nargs, int *r) {
    int want = (id == T_DIVISIBLEBY || id == T_EQ || id == T_EQUALTO || id == T_GE || id == T_GT || id == T_GREATERTHAN ||
                id == T_IN || id == T_LE || id == T_LESSTHAN || id == T_LT || id == T_NE || id == T_SAMEAS || id >= T_OPEQ);
    if (nargs != want) return ct_fail(c, QD_ERR_INVALID_ARG, "test '%s' takes %d argument(s), %d given", TESTS[id], want, nargs);
    switch (id) {
    case T_DEFINED: *r = v.t != TV_UNDEF; return 0;
    case T_UNDEFINED: *r = v.t == TV_UNDEF; return 0;
    case T_NONE: *r = v.t == TV_NONE; return 0;
    case T_BOOLEAN: *r = v.t == TV_BOOL; return 0;
    case T_TRUE: *r = v.t == TV_BOOL && v.b; return 0;
    case T_FALSE: *r = v.t == TV_BOOL && !v.b; return 0;
    case T_STRING: *r = v.t == TV_STR; return 0;
    case T_MAPPING: *r = v.t == TV_DICT; return 0;
    case T_NUMBER: *r = v.t == TV_INT || v.t == TV_FLOAT || v.t == TV_BOOL; return 0;
    case T_INTEGER: *r = v.t == TV_INT; return 0;
    case T_FLOAT: *r = v.t == TV_FLOAT; return 0;
    /* Python: str, list, tuple and dict all have len() and []; so has Undefined (it
     * defines __len__ and __getitem__), which also makes it a "sequence" and iterable. */
    case T_SEQUENCE: *r = v.t == TV_STR || v.t == TV_LIST || v.t == TV_DICT || v.t == TV_UNDEF; return 0;
    case T_ITERABLE: *r = v.t == TV_STR || v.t == TV_LIST || v.t == TV_DICT || v.t == TV_UNDEF; return 0;
    /* Jinja's Undefined defines __call__ (to raise), so callable() says yes. */
    case T_CALLABLE: *r = v.t == TV_FUNC || v.t == TV_MACRO || v.t == TV_METHOD || v.t == TV_UNDEF; return 0;
    case T_ESCAPED: *r = 0; return 0;
    case T_LOWER: case T_UPPER: {
        /* Jinja: str(value).islower() / .isupper() (needs a cased character). */
        tv str;
        if (v.t == TV_UNDEF) str = tv_strn("", 0);
        else if (ct_stringify(c, v, &str)) return -1;
        *r = ct_str_pred(str, id == T_LOWER ? 4 : 5);
        return 0;
    }
    case T_EVEN: case T_ODD:
        /* Jinja: value % 2 == 1 / == 0 with Python's modulo, so floats work too. */
        if (v.t == TV_FLOAT) {
            double m = fmod(v.f, 2.0);
            if (m < 0) m += 2.0;
            *r = id == T_ODD ? m == 1.0 : m == 0.0;
            return 0;
        }
        if (v.t != TV_INT && v.t != TV_BOOL) return ct_fail(c, QD_ERR_INVALID_ARG, "test '%s' needs a number", TESTS[id]);
        *r = ((v.t == TV_INT ? v.i : v.b) % 2 != 0) == (id == T_ODD);
        return 0;
    case T_DIVISIBLEBY: {
        if ((v.t != TV_INT && v.t != TV_BOOL) || args[0].t != TV_INT || args[0].i == 0)
            return ct_fail(c, QD_ERR_INVALID_ARG, "test 'divisibleby' needs non-zero integers");
        *r = (v.t == TV_INT ? v.i : v.b) % args[0].i == 0;
        return 0;
    }
    case T_SAMEAS:
        /* Identity: singletons compare by value; containers by pointer. */
        if (v.t != args[0].t) { *r = 0; return 0; }
        if (v.t == TV_LIST) *r = v.l == args[0].l;
        else if (v.t == TV_DICT || v.t == TV_NS) *r = v.d == args[0].d;
        else *r = ct_equal(v, args[0]);
        return 0;
    case T_EQ: case T_EQUALTO: case T_OPEQ: return ct_compare(c, OP_EQ, v, args[0], r);
    case T_NE: case T_OPNE: return ct_compare(c, OP_NE, v, args[0], r);
    case T_LT: case T_LESSTHAN: case T_OPLT: return ct_compare(c, OP_LT, v, args[0], r);
    case T_LE: case T_OPLE: return ct_compare(c, OP_LE, v, args[0], r);
    case T_GT: case T_GREATERTHAN: case T_OPGT: return ct_compare(c, OP_GT, v, args[0], r);
    case T_GE: case T_OPGE: return ct_compare(c, OP_GE, v, args[0], r);
    case T_IN: return ct_compare(c, OP_IN, v, args[0], r);
    }
    return ct_fail(c, QD_ERR_INTERNAL, "bad test %d", id);
}
