/* Chat-template evaluator: statements write to ctx->out, expressions produce
 * values. Semantics follow Python/Jinja2 where templates can observe them:
 * Python arithmetic and comparisons, Jinja's permissive Undefined (prints as
 * nothing, is falsy and iterable, but using it as an operand or reading an
 * attribute of it is an error), and Jinja scoping (a for-loop body is a new
 * scope per iteration, `if` is not; macros see the template's top level). */
#include <math.h>
#include <string.h>

#include "io/chat_template_int.h"

struct ct_scope { ct_scope *parent; tdict *vars; };

ct_scope *ct_scope_new(ct_ctx *c, ct_scope *parent) {
    ct_scope *s = ct_alloc(c->ar, sizeof *s);
    if (!s) { ct_oom(c); return NULL; }
    s->parent = parent;
    return s;
}

static int step(ct_ctx *c, const node *n) {
    c->line = n->line;
    if (++c->steps > c->max_steps)
        return ct_fail(c, QD_ERR_CAPACITY, "evaluation step limit (%lld) exceeded", c->max_steps);
    return 0;
}

static int set_var(ct_ctx *c, ct_scope *s, const char *name, tv v) {
    if (!s->vars && !(s->vars = ct_dict_new(c, 8))) return -1;
    return ct_dict_set(c, s->vars, tv_strn(name, strlen(name)), v);
}

static tv lookup(ct_ctx *c, const char *name) {
    size_t n = strlen(name);
    for (ct_scope *s = c->sc; s; s = s->parent) {
        if (!s->vars) continue;
        tv *v = ct_dict_get(s->vars, name, n);
        if (v) return *v;
    }
    tv *v = ct_dict_get(c->vars, name, n);
    if (v) return *v;
    static const struct { const char *name; int fn; } builtins[] = {
        {"range", CT_FN_RANGE}, {"namespace", CT_FN_NAMESPACE}, {"raise_exception", CT_FN_RAISE},
        {"strftime_now", CT_FN_STRFTIME}, {"dict", CT_FN_DICT}};
    for (size_t i = 0; i < sizeof builtins / sizeof builtins[0]; i++)
        if (strcmp(name, builtins[i].name) == 0) {
            tv f = {0};
            f.t = TV_FUNC;
            f.fn = builtins[i].fn;
            return f;
        }
    return tv_undef();
}

/* ------------------------------------------------------------------ access */

static int is_intlike(tv v) { return v.t == TV_INT || v.t == TV_BOOL; }
static int64_t as_int(tv v) { return v.t == TV_INT ? v.i : v.b; }

int ct_getattr(ct_ctx *c, tv obj, const char *name, size_t n, tv *out) {
    *out = tv_undef();
    switch (obj.t) {
    case TV_UNDEF:
        return ct_fail(c, QD_ERR_INVALID_ARG, "cannot read attribute '%.*s' of an undefined value", (int)n, name);
    case TV_DICT:
        if (ct_is_method(obj, name, n)) break;
        /* fallthrough */
    case TV_NS: {
        tv *v = ct_dict_get(obj.d, name, n);
        if (v) *out = *v;
        return 0;
    }
    case TV_LOOP: {
        tloop *L = obj.loop;
        int64_t len = (int64_t)L->items->n, i = (int64_t)L->i;
#define IS(s) (n == sizeof(s) - 1 && memcmp(name, s, n) == 0)
        if (IS("index")) *out = tv_int(i + 1);
        else if (IS("index0")) *out = tv_int(i);
        else if (IS("revindex")) *out = tv_int(len - i);
        else if (IS("revindex0")) *out = tv_int(len - i - 1);
        else if (IS("first")) *out = tv_bool(i == 0);
        else if (IS("last")) *out = tv_bool(i == len - 1);
        else if (IS("length")) *out = tv_int(len);
        else if (IS("depth")) *out = tv_int(1);
        else if (IS("depth0")) *out = tv_int(0);
        else if (IS("previtem")) { if (i > 0) *out = L->items->v[i - 1]; }
        else if (IS("nextitem")) { if (i + 1 < len) *out = L->items->v[i + 1]; }
        else if (IS("cycle")) break;
        else if (IS("changed")) return ct_fail(c, QD_ERR_UNSUPPORTED, "unsupported construct: loop.changed()");
#undef IS
        return 0;
    }
    case TV_STR:
        break;
    default:
        return 0;
    }
    if (!ct_is_method(obj, name, n)) return 0;
    tmethod *m = ct_alloc(c->ar, sizeof *m);
    char *nm = ct_alloc(c->ar, n + 1);
    if (!m || !nm) return ct_oom(c);
    memcpy(nm, name, n);
    m->self = obj;
    m->name = nm;
    out->t = TV_METHOD;
    out->meth = m;
    return 0;
}

/* Python index normalisation; returns -1 when out of range. */
static int64_t norm_index(int64_t i, int64_t len) {
    if (i < 0) i += len;
    return (i < 0 || i >= len) ? -1 : i;
}

int ct_getitem(ct_ctx *c, tv obj, tv key, tv *out) {
    *out = tv_undef();
    if (obj.t == TV_UNDEF) return ct_fail(c, QD_ERR_INVALID_ARG, "cannot index an undefined value");
    if (obj.t == TV_LIST && is_intlike(key)) {
        int64_t i = norm_index(as_int(key), (int64_t)obj.l->n);
        if (i >= 0) *out = obj.l->v[i];
        return 0;
    }
    if (obj.t == TV_STR && is_intlike(key)) {
        int64_t len = (int64_t)ct_utf8_len(obj.s.p, obj.s.n), i = norm_index(as_int(key), len);
        if (i < 0) return 0;
        size_t off = 0;
        for (int64_t k = 0; k < i; k++) off = ct_utf8_next(obj.s.p, obj.s.n, off);
        *out = tv_strn(obj.s.p + off, ct_utf8_next(obj.s.p, obj.s.n, off) - off);
        return 0;
    }
    if (obj.t == TV_DICT || obj.t == TV_NS) {
        tv *v = ct_dict_lookup(obj.d, key);
        if (v) { *out = *v; return 0; }
    }
    /* Jinja falls back to attribute lookup for string subscripts. */
    if (key.t == TV_STR && obj.t != TV_NS && obj.t != TV_DICT) return ct_getattr(c, obj, key.s.p, key.s.n, out);
    if (key.t == TV_STR && obj.t == TV_DICT && ct_is_method(obj, key.s.p, key.s.n))
        return ct_getattr(c, obj, key.s.p, key.s.n, out);
    return 0;
}

static int slice_arg(ct_ctx *c, const node *e, int64_t *v, int *present) {
    *present = 0;
    if (!e) return 0;
    tv x;
    if (ct_eval(c, e, &x)) return -1;
    if (x.t == TV_NONE || x.t == TV_UNDEF) return 0;
    if (!is_intlike(x)) return ct_fail(c, QD_ERR_INVALID_ARG, "slice indices must be integers, not %s", ct_type_name(x));
    *v = as_int(x);
    *present = 1;
    return 0;
}

/* Python slice semantics (including negative steps, [::-1]) over lists and
 * over the code points of strings. */
static int eval_slice(ct_ctx *c, const node *e, tv *out) {
    tv obj;
    int64_t start = 0, stop = 0, stepv = 1;
    int hs, he, hst;
    if (ct_eval(c, e->a, &obj) || slice_arg(c, e->b, &start, &hs) || slice_arg(c, e->c, &stop, &he) ||
        slice_arg(c, e->d, &stepv, &hst))
        return -1;
    if (!hst) stepv = 1;
    if (stepv == 0) return ct_fail(c, QD_ERR_INVALID_ARG, "slice step cannot be zero");
    if (obj.t == TV_UNDEF) return ct_fail(c, QD_ERR_INVALID_ARG, "cannot slice an undefined value");
    /* Jinja compiles slices to a plain Python subscription (no getitem
     * fallback to Undefined), so slicing anything else is an error. */
    if (obj.t == TV_DICT) return ct_fail(c, QD_ERR_INVALID_ARG, "unhashable type: 'slice'");
    if (obj.t != TV_LIST && obj.t != TV_STR)
        return ct_fail(c, QD_ERR_INVALID_ARG, "'%s' object is not subscriptable", ct_type_name(obj));
    size_t *offs = NULL;
    int64_t len;
    if (obj.t == TV_LIST) len = (int64_t)obj.l->n;
    else {
        len = (int64_t)ct_utf8_len(obj.s.p, obj.s.n);
        if (!(offs = ct_alloc(c->ar, ((size_t)len + 1) * sizeof *offs))) return ct_oom(c);
        size_t off = 0;
        for (int64_t k = 0; k < len; k++) { offs[k] = off; off = ct_utf8_next(obj.s.p, obj.s.n, off); }
        offs[len] = obj.s.n;
    }
    if (!hs) start = stepv < 0 ? len - 1 : 0;
    else if (start < 0) { start += len; if (start < 0) start = stepv < 0 ? -1 : 0; }
    else if (start >= len) start = stepv < 0 ? len - 1 : len;
    if (!he) stop = stepv < 0 ? -1 : len;
    else if (stop < 0) { stop += len; if (stop < 0) stop = stepv < 0 ? -1 : 0; }
    else if (stop >= len) stop = stepv < 0 ? len - 1 : len;
    int64_t count = 0;
    if (stepv < 0) { if (stop < start) count = (start - stop - 1) / (-stepv) + 1; }
    else if (start < stop) count = (stop - start - 1) / stepv + 1;
    if (obj.t == TV_LIST) {
        tlist *l = ct_list_new(c, (size_t)count);
        if (!l) return -1;
        l->tuple = obj.l->tuple;
        for (int64_t k = 0; k < count; k++) l->v[k] = obj.l->v[start + k * stepv];
        out->t = TV_LIST;
        out->l = l;
        return 0;
    }
    if (stepv == 1) { *out = tv_strn(obj.s.p + offs[start], count ? offs[start + count] - offs[start] : 0); return 0; }
    char *d = ct_alloc(c->ar, obj.s.n + 1);
    if (!d) return ct_oom(c);
    size_t k = 0;
    for (int64_t j = 0; j < count; j++) {
        int64_t idx = start + j * stepv;
        size_t w = offs[idx + 1] - offs[idx];
        memcpy(d + k, obj.s.p + offs[idx], w);
        k += w;
    }
    *out = tv_strn(d, k);
    return 0;
}

/* ------------------------------------------------------------------ operators */

static int undef_operand(ct_ctx *c, tv a, tv b) {
    if (a.t == TV_UNDEF || b.t == TV_UNDEF) return ct_fail(c, QD_ERR_INVALID_ARG, "undefined value used as an operand");
    return 0;
}

static int type_error(ct_ctx *c, const char *op, tv a, tv b) {
    return ct_fail(c, QD_ERR_INVALID_ARG, "unsupported operand type(s) for %s: '%s' and '%s'", op, ct_type_name(a),
                   ct_type_name(b));
}

static int is_number(tv v) { return v.t == TV_INT || v.t == TV_BOOL || v.t == TV_FLOAT; }
static double as_double(tv v) { return v.t == TV_FLOAT ? v.f : (double)as_int(v); }

static int concat_str(ct_ctx *c, const char *a, size_t an, const char *b, size_t bn, tv *out) {
    char *d = ct_alloc(c->ar, an + bn + 1);
    if (!d) return ct_oom(c);
    memcpy(d, a, an);
    memcpy(d + an, b, bn);
    *out = tv_strn(d, an + bn);
    return 0;
}

static int repeat(ct_ctx *c, tv seq, int64_t times, tv *out) {
    if (times < 0) times = 0;
    size_t unit = seq.t == TV_STR ? seq.s.n : seq.l->n;
    if (unit && (uint64_t)times > (c->ar->limit ? c->ar->limit : ((size_t)1 << 40)) / unit) return ct_oom(c);
    if (seq.t == TV_STR) {
        char *d = ct_alloc(c->ar, unit * (size_t)times + 1);
        if (!d) return ct_oom(c);
        for (int64_t k = 0; k < times; k++) memcpy(d + k * unit, seq.s.p, unit);
        *out = tv_strn(d, unit * (size_t)times);
        return 0;
    }
    tlist *l = ct_list_new(c, unit * (size_t)times);
    if (!l) return -1;
    l->tuple = seq.l->tuple;
    for (int64_t k = 0; k < times; k++) memcpy(l->v + k * unit, seq.l->v, unit * sizeof(tv));
    out->t = TV_LIST;
    out->l = l;
    return 0;
}

static const char *op_name(int op) {
    static const char *names[] = {"+", "-", "*", "/", "//", "%", "**", "~"};
    return op >= 0 && op < 8 ? names[op] : "?";
}

static int binop(ct_ctx *c, int op, tv a, tv b, tv *out) {
    if (op == OP_CONCAT) {
        tv sa, sb;
        if (ct_stringify(c, a, &sa) || ct_stringify(c, b, &sb)) return -1;
        return concat_str(c, sa.s.p, sa.s.n, sb.s.p, sb.s.n, out);
    }
    if (undef_operand(c, a, b)) return -1;
    if (is_number(a) && is_number(b)) {
        if (a.t != TV_FLOAT && b.t != TV_FLOAT && op != OP_DIV) {
            int64_t x = as_int(a), y = as_int(b), r;
            switch (op) {
            case OP_ADD: if (__builtin_add_overflow(x, y, &r)) goto overflow; break;
            case OP_SUB: if (__builtin_sub_overflow(x, y, &r)) goto overflow; break;
            case OP_MUL: if (__builtin_mul_overflow(x, y, &r)) goto overflow; break;
            case OP_FLOORDIV: case OP_MOD:
                if (y == 0) return ct_fail(c, QD_ERR_INVALID_ARG, "integer division or modulo by zero");
                if (x == INT64_MIN && y == -1) goto overflow;
                {
                    int64_t q = x / y, m = x % y;
                    if (m != 0 && ((m < 0) != (y < 0))) { q--; m += y; }
                    r = op == OP_FLOORDIV ? q : m;
                }
                break;
            case OP_POW:
                if (y < 0) { *out = tv_float(pow((double)x, (double)y)); return 0; }
                r = 1;
                for (int64_t base = x, e = y; e; e >>= 1) {
                    if ((e & 1) && __builtin_mul_overflow(r, base, &r)) goto overflow;
                    if ((e >> 1) && __builtin_mul_overflow(base, base, &base)) goto overflow;
                }
                break;
            default: return type_error(c, op_name(op), a, b);
            }
            *out = tv_int(r);
            return 0;
        }
        double x = as_double(a), y = as_double(b), r;
        switch (op) {
        case OP_ADD: r = x + y; break;
        case OP_SUB: r = x - y; break;
        case OP_MUL: r = x * y; break;
        case OP_DIV:
            if (y == 0) return ct_fail(c, QD_ERR_INVALID_ARG, "division by zero");
            r = x / y;
            break;
        case OP_FLOORDIV: case OP_MOD:
            if (y == 0) return ct_fail(c, QD_ERR_INVALID_ARG, "float division or modulo by zero");
            if (op == OP_MOD) {
                r = fmod(x, y);
                if (r != 0 && ((r < 0) != (y < 0))) r += y;   /* Python: sign of the divisor */
            } else r = floor(x / y);
            break;
        case OP_POW: r = pow(x, y); break;
        default: return type_error(c, op_name(op), a, b);
        }
        *out = tv_float(r);
        return 0;
    }
    if (op == OP_ADD && a.t == TV_STR && b.t == TV_STR) return concat_str(c, a.s.p, a.s.n, b.s.p, b.s.n, out);
    if (op == OP_ADD && a.t == TV_LIST && b.t == TV_LIST && a.l->tuple == b.l->tuple) {
        tlist *l = ct_list_new(c, a.l->n + b.l->n);
        if (!l) return -1;
        l->tuple = a.l->tuple;
        if (a.l->n) memcpy(l->v, a.l->v, a.l->n * sizeof(tv));
        if (b.l->n) memcpy(l->v + a.l->n, b.l->v, b.l->n * sizeof(tv));
        out->t = TV_LIST;
        out->l = l;
        return 0;
    }
    if (op == OP_MUL && (a.t == TV_STR || a.t == TV_LIST) && is_intlike(b)) return repeat(c, a, as_int(b), out);
    if (op == OP_MUL && (b.t == TV_STR || b.t == TV_LIST) && is_intlike(a)) return repeat(c, b, as_int(a), out);
    if (op == OP_MOD && a.t == TV_STR) return ct_str_percent(c, a, b, out);
    return type_error(c, op_name(op), a, b);
overflow:
    return ct_fail(c, QD_ERR_UNSUPPORTED, "integer overflow in '%s' (arbitrary precision is not supported)", op_name(op));
}

static int contains(ct_ctx *c, tv needle, tv hay, int *res) {
    *res = 0;
    switch (hay.t) {
    case TV_UNDEF: return 0;
    case TV_STR:
        if (needle.t != TV_STR)
            return ct_fail(c, QD_ERR_INVALID_ARG, "'in <string>' requires string as left operand, not %s", ct_type_name(needle));
        *res = needle.s.n == 0 || (needle.s.n <= hay.s.n && memmem(hay.s.p, hay.s.n, needle.s.p, needle.s.n) != NULL);
        return 0;
    case TV_LIST:
        for (size_t i = 0; i < hay.l->n; i++)
            if (ct_equal(needle, hay.l->v[i])) { *res = 1; break; }
        return 0;
    case TV_DICT:
        *res = ct_dict_lookup(hay.d, needle) != NULL;
        return 0;
    default:
        return ct_fail(c, QD_ERR_INVALID_ARG, "argument of type '%s' is not iterable", ct_type_name(hay));
    }
}

int ct_compare(ct_ctx *c, int op, tv a, tv b, int *r) {
    switch (op) {
    case OP_EQ: *r = ct_equal(a, b); return 0;
    case OP_NE: *r = !ct_equal(a, b); return 0;
    case OP_IN: return contains(c, a, b, r);
    case OP_NOTIN: if (contains(c, a, b, r)) return -1; *r = !*r; return 0;
    }
    int cmp;
    if (is_number(a) && is_number(b)) {
        if (a.t == TV_FLOAT || b.t == TV_FLOAT) {
            double x = as_double(a), y = as_double(b);
            if (isnan(x) || isnan(y)) { *r = 0; return 0; }
            cmp = (x > y) - (x < y);
        } else cmp = (as_int(a) > as_int(b)) - (as_int(a) < as_int(b));
    } else if (a.t == TV_STR && b.t == TV_STR) {
        size_t n = a.s.n < b.s.n ? a.s.n : b.s.n;
        cmp = memcmp(a.s.p, b.s.p, n);
        if (!cmp) cmp = (a.s.n > b.s.n) - (a.s.n < b.s.n);
        cmp = (cmp > 0) - (cmp < 0);
    } else if (a.t == TV_LIST && b.t == TV_LIST && a.l->tuple == b.l->tuple) {
        size_t i = 0;
        while (i < a.l->n && i < b.l->n && ct_equal(a.l->v[i], b.l->v[i])) i++;
        if (i < a.l->n && i < b.l->n) return ct_compare(c, op, a.l->v[i], b.l->v[i], r);
        cmp = (a.l->n > b.l->n) - (a.l->n < b.l->n);
    } else {
        static const char *names[] = {"<", "<=", ">", ">="};
        return ct_fail(c, QD_ERR_INVALID_ARG, "'%s' not supported between instances of '%s' and '%s'",
                       names[op - OP_LT], ct_type_name(a), ct_type_name(b));
    }
    *r = op == OP_LT ? cmp < 0 : op == OP_LE ? cmp <= 0 : op == OP_GT ? cmp > 0 : cmp >= 0;
    return 0;
}

/* ------------------------------------------------------------------ calls */

static int eval_args(ct_ctx *c, const node *n, tv **args, tv **kwv) {
    *args = n->nkids ? ct_alloc(c->ar, (size_t)n->nkids * sizeof(tv)) : NULL;
    *kwv = n->nkw ? ct_alloc(c->ar, (size_t)n->nkw * sizeof(tv)) : NULL;
    if ((n->nkids && !*args) || (n->nkw && !*kwv)) return ct_oom(c);
    for (int i = 0; i < n->nkids; i++)
        if (ct_eval(c, n->kids[i], &(*args)[i])) return -1;
    for (int i = 0; i < n->nkw; i++)
        if (ct_eval(c, n->kwv[i], &(*kwv)[i])) return -1;
    return 0;
}

static int call_macro(ct_ctx *c, const node *m, tv *args, int nargs, const char **kw, tv *kwv, int nkw, tv *out) {
    if (nargs > m->nkw)
        return ct_fail(c, QD_ERR_INVALID_ARG, "macro '%s' takes not more than %d argument(s)", m->name, m->nkw);
    if (c->depth >= c->max_depth) return ct_fail(c, QD_ERR_CAPACITY, "macro recursion depth limit (%d) exceeded", c->max_depth);
    ct_scope *scope = ct_alloc(c->ar, sizeof *scope);
    if (!scope) return ct_oom(c);
    scope->parent = c->root;
    ct_scope *saved_sc = c->sc;
    ct_buf *saved_out = c->out, buf = {0};
    buf.limit = saved_out->limit;
    int saved_ctl = c->loop_ctl, rc = 0;
    c->sc = scope;
    for (int k = 0; k < nkw && rc == 0; k++) {
        int found = 0;
        for (int p = 0; p < m->nkw; p++) found |= strcmp(kw[k], m->kw[p]) == 0;
        if (!found) rc = ct_fail(c, QD_ERR_INVALID_ARG, "macro '%s' takes no keyword argument '%s'", m->name, kw[k]);
    }
    for (int p = 0; p < m->nkw && rc == 0; p++) {
        tv v = tv_undef();
        int have = 0;
        if (p < nargs) { v = args[p]; have = 1; }
        for (int k = 0; k < nkw; k++)
            if (strcmp(kw[k], m->kw[p]) == 0) { v = kwv[k]; have = 1; }
        /* Defaults are evaluated at call time in the macro's scope, like Jinja. */
        if (!have && m->kwv[p]) rc = ct_eval(c, m->kwv[p], &v);
        if (rc == 0) rc = set_var(c, scope, m->kw[p], v);
    }
    c->depth++;
    c->out = &buf;
    c->loop_ctl = 0;
    if (rc == 0) rc = ct_render_body(c, m->a);
    c->depth--;
    c->out = saved_out;
    c->sc = saved_sc;
    c->loop_ctl = saved_ctl;
    if (rc == 0) {
        int ok;
        *out = ct_str_dup(c, buf.p ? buf.p : "", buf.n, &ok);
        if (!ok) rc = -1;
    }
    ct_buf_free(&buf);
    return rc;
}

int ct_call_value(ct_ctx *c, tv fn, tv *args, int nargs, const char **kw, tv *kwv, int nkw, tv *out) {
    switch (fn.t) {
    case TV_MACRO: return call_macro(c, fn.m, args, nargs, kw, kwv, nkw, out);
    case TV_FUNC: return ct_call_builtin(c, fn.fn, args, nargs, kw, kwv, nkw, out);
    case TV_METHOD: return ct_call_method(c, fn.meth->self, fn.meth->name, args, nargs, kw, kwv, nkw, out);
    case TV_UNDEF: return ct_fail(c, QD_ERR_INVALID_ARG, "undefined value is not callable");
    default: return ct_fail(c, QD_ERR_INVALID_ARG, "'%s' object is not callable", ct_type_name(fn));
    }
}

/* ------------------------------------------------------------------ expressions */

int ct_eval(ct_ctx *c, const node *e, tv *out) {
    if (step(c, e)) return -1;
    if (++c->depth > c->max_depth + 400) { c->depth--; return ct_fail(c, QD_ERR_CAPACITY, "evaluation nested too deeply"); }
    int rc = 0;
    tv a, b;
    switch (e->kind) {
    case N_LIT: *out = e->lit; break;
    case N_NAME: *out = lookup(c, e->name); break;
    case N_LIST: case N_TUPLE: {
        tlist *l = ct_list_new(c, (size_t)e->nkids);
        if (!l) { rc = -1; break; }
        l->tuple = e->kind == N_TUPLE;
        for (int i = 0; i < e->nkids && rc == 0; i++) rc = ct_eval(c, e->kids[i], &l->v[i]);
        out->t = TV_LIST;
        out->l = l;
        break;
    }
    case N_DICT: {
        tdict *d = ct_dict_new(c, (size_t)e->nkids);
        if (!d) { rc = -1; break; }
        for (int i = 0; i < e->nkids && rc == 0; i++)
            rc = ct_eval(c, e->kids[i], &a) || ct_eval(c, e->kwv[i], &b) || ct_dict_set(c, d, a, b) ? -1 : 0;
        out->t = TV_DICT;
        out->d = d;
        break;
    }
    case N_GETATTR:
        rc = ct_eval(c, e->a, &a) ? -1 : (c->line = e->line, ct_getattr(c, a, e->name, strlen(e->name), out));
        break;
    case N_GETITEM:
        rc = ct_eval(c, e->a, &a) || ct_eval(c, e->b, &b) ? -1 : (c->line = e->line, ct_getitem(c, a, b, out));
        break;
    case N_SLICE: rc = eval_slice(c, e, out); break;
    case N_CALL: {
        tv *args, *kwv;
        if (ct_eval(c, e->a, &a) || eval_args(c, e, &args, &kwv)) { rc = -1; break; }
        c->line = e->line;
        /* Name what cannot be called: an unknown global, or a method this
         * interpreter does not implement. */
        if (a.t == TV_UNDEF && e->a->kind == N_NAME) {
            rc = ct_fail(c, QD_ERR_UNSUPPORTED, "'%s' is undefined (unsupported global function?)", e->a->name);
            break;
        }
        if (a.t == TV_UNDEF && e->a->kind == N_GETATTR) {
            tv obj;
            if ((rc = ct_eval(c, e->a->a, &obj))) break;
            rc = ct_fail(c, QD_ERR_UNSUPPORTED, "'%s' object has no method '%s' (unsupported or undefined)",
                         ct_type_name(obj), e->a->name);
            break;
        }
        rc = ct_call_value(c, a, args, e->nkids, e->kw, kwv, e->nkw, out);
        break;
    }
    case N_FILTER: {
        tv *args, *kwv;
        if (ct_eval(c, e->a, &a) || eval_args(c, e, &args, &kwv)) { rc = -1; break; }
        c->line = e->line;
        rc = ct_apply_filter(c, e->filter_id, a, args, e->nkids, e->kw, kwv, e->nkw, out);
        break;
    }
    case N_TEST: {
        tv *args, *kwv;
        int r;
        if (ct_eval(c, e->a, &a) || eval_args(c, e, &args, &kwv)) { rc = -1; break; }
        c->line = e->line;
        if ((rc = ct_apply_test(c, e->test_id, a, args, e->nkids, &r)) == 0) *out = tv_bool(e->op ? !r : r);
        break;
    }
    case N_BINOP:
        rc = ct_eval(c, e->a, &a) || ct_eval(c, e->b, &b) ? -1 : (c->line = e->line, binop(c, e->op, a, b, out));
        break;
    case N_NEG: case N_POS:
        if ((rc = ct_eval(c, e->a, &a))) break;
        c->line = e->line;
        if (a.t == TV_INT || a.t == TV_BOOL) {
            int64_t v = as_int(a);
            if (e->kind == N_NEG && v == INT64_MIN) { rc = ct_fail(c, QD_ERR_UNSUPPORTED, "integer overflow"); break; }
            *out = tv_int(e->kind == N_NEG ? -v : v);
        } else if (a.t == TV_FLOAT) *out = tv_float(e->kind == N_NEG ? -a.f : a.f);
        else rc = ct_fail(c, QD_ERR_INVALID_ARG, "bad operand type for unary %c: '%s'", e->kind == N_NEG ? '-' : '+', ct_type_name(a));
        break;
    case N_NOT:
        if ((rc = ct_eval(c, e->a, &a)) == 0) *out = tv_bool(!ct_truthy(a));
        break;
    case N_AND: case N_OR:
        if ((rc = ct_eval(c, e->a, &a))) break;
        if (ct_truthy(a) == (e->kind == N_OR)) *out = a;
        else rc = ct_eval(c, e->b, out);
        break;
    case N_COMPARE: {
        if ((rc = ct_eval(c, e->a, &a))) break;
        int r = 1;
        for (int i = 0; i < e->nkids && r; i++) {
            if ((rc = ct_eval(c, e->kids[i], &b))) break;
            c->line = e->line;
            if ((rc = ct_compare(c, e->ops[i], a, b, &r))) break;
            a = b;
        }
        if (rc == 0) *out = tv_bool(r);
        break;
    }
    case N_CONDEXPR:
        if ((rc = ct_eval(c, e->b, &a))) break;
        if (ct_truthy(a)) rc = ct_eval(c, e->a, out);
        else if (e->c) rc = ct_eval(c, e->c, out);
        else *out = tv_undef();
        break;
    default:
        rc = ct_fail(c, QD_ERR_INTERNAL, "bad expression node %d", (int)e->kind);
    }
    c->depth--;
    return rc;
}

/* ------------------------------------------------------------------ statements */

static int bind_targets(ct_ctx *c, ct_scope *s, const node *f, tv item) {
    if (f->nkw == 1) return set_var(c, s, f->kw[0], item);
    tlist *parts;
    if (item.t == TV_DICT || item.t == TV_UNDEF) return ct_fail(c, QD_ERR_INVALID_ARG, "cannot unpack %s", ct_type_name(item));
    if (ct_iter_list(c, item, &parts)) return -1;
    if (parts->n != (size_t)f->nkw)
        return ct_fail(c, QD_ERR_INVALID_ARG, "cannot unpack %zu values into %d loop variables", parts->n, f->nkw);
    for (int i = 0; i < f->nkw; i++)
        if (set_var(c, s, f->kw[i], parts->v[i])) return -1;
    return 0;
}

static int render_for(ct_ctx *c, const node *f) {
    tv it;
    tlist *items;
    if (ct_eval(c, f->a, &it) || ct_iter_list(c, it, &items)) return -1;
    ct_scope *outer = c->sc;
    if (f->b) {
        /* `for x in xs if cond`: filter first, so loop.length/last see only kept items. */
        tlist *kept = ct_list_new(c, items->n);
        if (!kept) return -1;
        kept->n = 0;
        for (size_t i = 0; i < items->n; i++) {
            ct_scope tmp = {outer, NULL};
            tv cond;
            c->sc = &tmp;
            int rc = bind_targets(c, &tmp, f, items->v[i]) || ct_eval(c, f->b, &cond);
            c->sc = outer;
            if (rc) return -1;
            if (ct_truthy(cond)) kept->v[kept->n++] = items->v[i];
        }
        items = kept;
    }
    tloop *L = ct_alloc(c->ar, sizeof *L);
    if (!L) return ct_oom(c);
    L->items = items;
    tv loopv = {0};
    loopv.t = TV_LOOP;
    loopv.loop = L;
    /* One scope reused by every iteration (emptied each time): nothing can hold
     * on to a scope, and this keeps long loops from growing the arena. */
    ct_scope *s = ct_scope_new(c, outer);
    if (!s) return -1;
    for (size_t i = 0; i < items->n; i++) {
        if (step(c, f)) return -1;
        if (s->vars) s->vars->n = 0;
        L->i = i;
        if (set_var(c, s, "loop", loopv) || bind_targets(c, s, f, items->v[i])) return -1;
        c->sc = s;
        int rc = ct_render_body(c, f->c);
        c->sc = outer;
        if (rc) return -1;
        int ctl = c->loop_ctl;
        c->loop_ctl = 0;
        if (ctl == 1) break;
    }
    if (items->n == 0 && f->d) return ct_render_body(c, f->d);
    return 0;
}

static int render_capture(ct_ctx *c, const node *body, tv *out) {
    ct_buf *saved = c->out, buf = {0};
    buf.limit = saved->limit;
    c->out = &buf;
    int rc = ct_render_body(c, body), ok = 1;
    c->out = saved;
    if (rc == 0 && buf.oom) rc = buf.oom == 2 ? ct_fail(c, QD_ERR_CAPACITY, "output size limit exceeded") : ct_oom(c);
    if (rc == 0) *out = ct_str_dup(c, buf.p ? buf.p : "", buf.n, &ok);
    ct_buf_free(&buf);
    return rc || !ok ? -1 : 0;
}

static int render_stmt(ct_ctx *c, const node *s) {
    if (step(c, s)) return -1;
    tv v;
    switch (s->kind) {
    case N_TEXT: ct_buf_put(c->out, s->lit.s.p, s->lit.s.n); break;
    case N_OUTPUT:
        if (ct_eval(c, s->a, &v)) return -1;
        ct_to_str(c->out, v);
        break;
    case N_IF:
        if (ct_eval(c, s->a, &v)) return -1;
        if (ct_truthy(v)) return ct_render_body(c, s->c);
        if (s->b) return s->b->kind == N_IF ? render_stmt(c, s->b) : ct_render_body(c, s->b);
        break;
    case N_FOR: return render_for(c, s);
    case N_SET: case N_SET_BLOCK:
        if (s->kind == N_SET ? ct_eval(c, s->a, &v) : render_capture(c, s->a, &v)) return -1;
        c->line = s->line;
        if (s->name2) {
            tv ns = lookup(c, s->name);
            if (ns.t != TV_NS) return ct_fail(c, QD_ERR_INVALID_ARG, "cannot assign attribute on non-namespace object '%s'", s->name);
            return ct_dict_set(c, ns.d, tv_strn(s->name2, strlen(s->name2)), v);
        }
        return set_var(c, c->sc, s->name, v);
    case N_MACRO: {
        tv m = {0};
        m.t = TV_MACRO;
        m.m = s;
        return set_var(c, c->sc, s->name, m);
    }
    case N_BREAK: c->loop_ctl = 1; break;
    case N_CONTINUE: c->loop_ctl = 2; break;
    case N_FILTER_BLOCK: {
        tv *args, *kwv;
        if (render_capture(c, s->a, &v) || eval_args(c, s, &args, &kwv)) return -1;
        c->line = s->line;
        if (ct_apply_filter(c, s->filter_id, v, args, s->nkids, s->kw, kwv, s->nkw, &v)) return -1;
        ct_to_str(c->out, v);
        break;
    }
    default: return ct_fail(c, QD_ERR_INTERNAL, "bad statement node %d", (int)s->kind);
    }
    if (c->out->oom)
        return c->out->oom == 2 ? ct_fail(c, QD_ERR_CAPACITY, "output size limit (%zu bytes) exceeded", c->out->limit)
                                : ct_oom(c);
    return 0;
}

int ct_render_body(ct_ctx *c, const node *body) {
    for (int i = 0; i < body->nkids; i++) {
        if (render_stmt(c, body->kids[i])) return -1;
        if (c->loop_ctl) return 0;   /* break/continue: unwind to the enclosing loop */
    }
    return 0;
}
