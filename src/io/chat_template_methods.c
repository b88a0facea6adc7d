/* Chat-template methods and globals: Python str methods (startswith, split,
 * strip, replace, ...), dict methods (items, keys, values, get), loop.cycle,
 * and the globals transformers provides (range, namespace, dict,
 * raise_exception, strftime_now). Results match CPython for valid UTF-8. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <utf8proc.h>

#include "io/chat_template_int.h"

static const char *const STR_METHODS[] = {
    "startswith", "endswith", "split", "rsplit", "strip", "lstrip", "rstrip", "replace", "upper",
    "lower", "title", "capitalize", "find", "rfind", "count", "join", "splitlines", "isdigit",
    "isalpha", "isalnum", "isspace", "islower", "isupper", "format", "index", "swapcase", NULL};
static const char *const DICT_METHODS[] = {"items", "keys", "values", "get", NULL};

static int in_list(const char *const *list, const char *name, size_t n) {
    for (int i = 0; list[i]; i++)
        if (strlen(list[i]) == n && memcmp(list[i], name, n) == 0) return 1;
    return 0;
}

int ct_is_method(tv self, const char *name, size_t n) {
    if (self.t == TV_STR) return in_list(STR_METHODS, name, n);
    if (self.t == TV_DICT) return in_list(DICT_METHODS, name, n);
    if (self.t == TV_LOOP) return n == 5 && memcmp(name, "cycle", 5) == 0;
    return 0;
}

static int want_args(ct_ctx *c, const char *name, int nargs, int lo, int hi, int nkw) {
    if (nkw) return ct_fail(c, QD_ERR_UNSUPPORTED, "%s() does not take keyword arguments here", name);
    if (nargs < lo || nargs > hi) return ct_fail(c, QD_ERR_INVALID_ARG, "%s() takes %d to %d arguments (%d given)", name, lo, hi, nargs);
    return 0;
}

static int want_str(ct_ctx *c, const char *name, tv v) {
    if (v.t != TV_STR) return ct_fail(c, QD_ERR_INVALID_ARG, "%s() argument must be str, not %s", name, ct_type_name(v));
    return 0;
}

/* ------------------------------------------------------------------ strip/split */

static size_t char_len_back(const char *p, size_t end) {
    size_t i = end - 1;
    while (i > 0 && ((unsigned char)p[i] & 0xC0) == 0x80) i--;
    return end - i;
}

/* Is the character at p[i] (length w) in `chars`, or whitespace when chars is NULL? */
static int strip_match(const char *p, size_t n, size_t i, size_t w, const tv *chars) {
    if (!chars) return ct_space_at(p, n, i) == w;
    const char *set = chars->s.p;
    size_t sn = chars->s.n;
    for (size_t k = 0; k + w <= sn; k = ct_utf8_next(set, sn, k))
        if (memcmp(set + k, p + i, w) == 0 && (k + w == sn || ((unsigned char)set[k + w] & 0xC0) != 0x80)) return 1;
    return 0;
}

tv ct_strip(tv s, const tv *chars, int left, int right) {
    size_t b = 0, e = s.s.n;
    if (left)
        while (b < e) {
            size_t w = ct_utf8_next(s.s.p, e, b) - b;
            if (!strip_match(s.s.p, e, b, w, chars)) break;
            b += w;
        }
    if (right)
        while (e > b) {
            size_t w = char_len_back(s.s.p, e);
            if (!strip_match(s.s.p, e, e - w, w, chars)) break;
            e -= w;
        }
    return tv_strn(s.s.p + b, e - b);
}

typedef struct svec { tv *v; size_t n, cap; } svec;
static int svec_push(ct_ctx *c, svec *a, tv x) {
    if (a->n == a->cap) {
        size_t cap = a->cap ? a->cap * 2 : 8;
        tv *v = ct_alloc(c->ar, cap * sizeof(tv));
        if (!v) return ct_oom(c);
        if (a->n) memcpy(v, a->v, a->n * sizeof(tv));
        a->v = v;
        a->cap = cap;
    }
    a->v[a->n++] = x;
    return 0;
}

static int svec_list(ct_ctx *c, svec *a, int reverse, tv *out) {
    tlist *l = ct_list_new(c, a->n);
    if (!l) return -1;
    for (size_t i = 0; i < a->n; i++) l->v[i] = a->v[reverse ? a->n - 1 - i : i];
    out->t = TV_LIST;
    out->l = l;
    return 0;
}

/* str.split / str.rsplit with Python's two modes: a separator, or runs of
 * whitespace with empty pieces dropped. */
static int do_split(ct_ctx *c, tv s, const tv *sep, int64_t maxsplit, int from_right, tv *out) {
    svec parts = {0};
    const char *p = s.s.p;
    size_t n = s.s.n;
    if (sep) {
        if (sep->s.n == 0) return ct_fail(c, QD_ERR_INVALID_ARG, "empty separator");
        size_t m = sep->s.n;
        if (!from_right) {
            size_t start = 0;
            for (size_t i = 0; i + m <= n && (maxsplit < 0 || (int64_t)parts.n < maxsplit);) {
                if (memcmp(p + i, sep->s.p, m) == 0) {
                    if (svec_push(c, &parts, tv_strn(p + start, i - start))) return -1;
                    i += m;
                    start = i;
                } else i++;
            }
            if (svec_push(c, &parts, tv_strn(p + start, n - start))) return -1;
            return svec_list(c, &parts, 0, out);
        }
        size_t end = n;
        for (size_t i = n; i >= m && (maxsplit < 0 || (int64_t)parts.n < maxsplit);) {
            if (memcmp(p + i - m, sep->s.p, m) == 0) {
                if (svec_push(c, &parts, tv_strn(p + i, end - i))) return -1;
                i -= m;
                end = i;
            } else i--;
        }
        if (svec_push(c, &parts, tv_strn(p, end))) return -1;
        return svec_list(c, &parts, 1, out);
    }
    if (!from_right) {
        size_t i = 0, w;
        for (;;) {
            while (i < n && (w = ct_space_at(p, n, i))) i += w;
            if (i >= n) break;
            if (maxsplit >= 0 && (int64_t)parts.n == maxsplit) {
                tv rest = ct_strip(tv_strn(p + i, n - i), NULL, 0, 1);
                if (svec_push(c, &parts, rest)) return -1;
                break;
            }
            size_t st = i;
            while (i < n && !ct_space_at(p, n, i)) i = ct_utf8_next(p, n, i);
            if (svec_push(c, &parts, tv_strn(p + st, i - st))) return -1;
        }
        return svec_list(c, &parts, 0, out);
    }
    size_t e = n;
    for (;;) {
        while (e > 0 && ct_space_at(p, n, e - char_len_back(p, e)) == char_len_back(p, e)) e -= char_len_back(p, e);
        if (e == 0) break;
        if (maxsplit >= 0 && (int64_t)parts.n == maxsplit) {
            if (svec_push(c, &parts, ct_strip(tv_strn(p, e), NULL, 1, 0))) return -1;
            break;
        }
        size_t st = e;
        while (st > 0 && ct_space_at(p, n, st - char_len_back(p, st)) != char_len_back(p, st)) st -= char_len_back(p, st);
        if (svec_push(c, &parts, tv_strn(p + st, e - st))) return -1;
        e = st;
    }
    return svec_list(c, &parts, 1, out);
}

/* ------------------------------------------------------------------ case mapping */



static int is_cased(utf8proc_int32_t cp) {
    utf8proc_category_t k = utf8proc_category(cp);
    return k == UTF8PROC_CATEGORY_LU || k == UTF8PROC_CATEGORY_LL || k == UTF8PROC_CATEGORY_LT;
}

int ct_case_map(ct_ctx *c, tv s, int mode, tv *out) {
    char *d = ct_alloc(c->ar, s.s.n * 3 + 4);
    if (!d) return ct_oom(c);
    size_t k = 0;
    int prev_cased = 0, first = 1;
    for (size_t i = 0; i < s.s.n;) {
        utf8proc_int32_t cp;
        utf8proc_ssize_t w = utf8proc_iterate((const utf8proc_uint8_t *)s.s.p + i, (utf8proc_ssize_t)(s.s.n - i), &cp);
        if (w <= 0) { d[k++] = s.s.p[i++]; prev_cased = 0; first = 0; continue; }
        utf8proc_int32_t m = cp;
        /* ß has no single-character uppercase; Python's full case mapping gives "SS"/"Ss". */
        if (cp == 0xDF && (mode == CT_CASE_UPPER || mode == CT_CASE_SWAP ||
                           ((mode == CT_CASE_TITLE && !prev_cased) || (mode == CT_CASE_CAPITALIZE && first)))) {
            d[k++] = 'S';
            d[k++] = mode == CT_CASE_UPPER || mode == CT_CASE_SWAP ? 'S' : 's';
            prev_cased = 1;
            first = 0;
            i += (size_t)w;
            continue;
        }
        switch (mode) {
        case CT_CASE_UPPER: m = utf8proc_toupper(cp); break;
        case CT_CASE_LOWER: m = utf8proc_tolower(cp); break;
        case CT_CASE_TITLE: m = prev_cased ? utf8proc_tolower(cp) : utf8proc_totitle(cp); break;
        case CT_CASE_CAPITALIZE: m = first ? utf8proc_totitle(cp) : utf8proc_tolower(cp); break;
        case CT_CASE_SWAP: m = utf8proc_isupper(cp) ? utf8proc_tolower(cp) : utf8proc_islower(cp) ? utf8proc_toupper(cp) : cp; break;
        }
        prev_cased = is_cased(cp);
        first = 0;
        k += (size_t)utf8proc_encode_char(m, (utf8proc_uint8_t *)d + k);
        i += (size_t)w;
    }
    *out = tv_strn(d, k);
    return 0;
}

/* ------------------------------------------------------------------ helpers */

static int64_t cp_index(const char *p, size_t byte_off) { return (int64_t)ct_utf8_len(p, byte_off); }

static const char *find_sub(const char *h, size_t hn, const char *nd, size_t nn, int last) {
    if (nn > hn) return NULL;
    if (!last) return nn ? memmem(h, hn, nd, nn) : h;
    for (size_t i = hn - nn + 1; i-- > 0;)
        if (memcmp(h + i, nd, nn) == 0) return h + i;
    return NULL;
}

static int str_format(ct_ctx *c, tv fmt, tv *args, int nargs, const char **kw, tv *kwv, int nkw, tv *out) {
    ct_buf b = {0};
    b.limit = c->out->limit;   /* temporaries obey the output bound too */
    int auto_idx = 0, rc = 0;
    const char *p = fmt.s.p;
    size_t n = fmt.s.n;
    for (size_t i = 0; i < n && rc == 0; i++) {
        if (p[i] == '{' && i + 1 < n && p[i + 1] == '{') { ct_buf_putc(&b, '{'); i++; continue; }
        if (p[i] == '}' && i + 1 < n && p[i + 1] == '}') { ct_buf_putc(&b, '}'); i++; continue; }
        if (p[i] != '{') { ct_buf_putc(&b, p[i]); continue; }
        size_t j = i + 1;
        while (j < n && p[j] != '}' && p[j] != ':' && p[j] != '!' && p[j] != '{') j++;
        if (j >= n || p[j] != '}') { rc = ct_fail(c, QD_ERR_UNSUPPORTED, "unsupported construct: str.format with format specs"); break; }
        tv v = tv_undef();
        int found = 0;
        if (j == i + 1) {
            if (auto_idx < nargs) { v = args[auto_idx]; found = 1; }
            auto_idx++;
        } else if (p[i + 1] >= '0' && p[i + 1] <= '9') {
            int idx = atoi(p + i + 1);
            if (idx < nargs) { v = args[idx]; found = 1; }
        } else {
            for (int k = 0; k < nkw; k++)
                if (strlen(kw[k]) == j - i - 1 && memcmp(kw[k], p + i + 1, j - i - 1) == 0) { v = kwv[k]; found = 1; }
        }
        if (!found) { rc = ct_fail(c, QD_ERR_INVALID_ARG, "str.format: missing argument for '%.*s'", (int)(j - i + 1), p + i); break; }
        ct_to_str(&b, v);
        i = j;
    }
    if (rc == 0 && b.oom) rc = ct_oom(c);
    int ok = 1;
    if (rc == 0) *out = ct_str_dup(c, b.p ? b.p : "", b.n, &ok);
    ct_buf_free(&b);
    return rc || !ok ? -1 : 0;
}

int ct_str_replace(ct_ctx *c, tv s, tv old, tv new_, int64_t count, tv *out) {
    ct_buf b = {0};
    b.limit = c->out->limit;   /* temporaries obey the output bound too */
    int64_t done = 0;
    if (old.s.n == 0) {
        /* Python inserts `new` before every character and at the end. */
        for (size_t i = 0; i <= s.s.n; i = ct_utf8_next(s.s.p, s.s.n, i)) {
            if (count < 0 || done < count) { ct_buf_put(&b, new_.s.p, new_.s.n); done++; }
            if (i < s.s.n) ct_buf_put(&b, s.s.p + i, ct_utf8_next(s.s.p, s.s.n, i) - i);
            if (i >= s.s.n) break;
        }
    } else {
        size_t i = 0;
        while (i < s.s.n) {
            const char *f = (count < 0 || done < count) ? find_sub(s.s.p + i, s.s.n - i, old.s.p, old.s.n, 0) : NULL;
            if (!f) { ct_buf_put(&b, s.s.p + i, s.s.n - i); break; }
            ct_buf_put(&b, s.s.p + i, (size_t)(f - (s.s.p + i)));
            ct_buf_put(&b, new_.s.p, new_.s.n);
            i = (size_t)(f - s.s.p) + old.s.n;
            done++;
        }
    }
    if (b.oom) { ct_buf_free(&b); return ct_oom(c); }
    int ok;
    *out = ct_str_dup(c, b.p ? b.p : "", b.n, &ok);
    ct_buf_free(&b);
    return ok ? 0 : -1;
}

int ct_str_pred(tv s, int kind) {
    if (s.s.n == 0) return 0;
    int has_cased = 0;
    for (size_t i = 0; i < s.s.n;) {
        utf8proc_int32_t cp;
        utf8proc_ssize_t w = utf8proc_iterate((const utf8proc_uint8_t *)s.s.p + i, (utf8proc_ssize_t)(s.s.n - i), &cp);
        if (w <= 0) return 0;
        utf8proc_category_t k = utf8proc_category(cp);
        int letter = k >= UTF8PROC_CATEGORY_LU && k <= UTF8PROC_CATEGORY_LO;
        int digit = k == UTF8PROC_CATEGORY_ND;
        switch (kind) {
        case 0: if (!digit) return 0; break;
        case 1: if (!letter) return 0; break;
        case 2: if (!letter && !digit && k != UTF8PROC_CATEGORY_NL && k != UTF8PROC_CATEGORY_NO) return 0; break;
        case 3: if (ct_space_at(s.s.p, s.s.n, i) != (size_t)w) return 0; break;
        case 4: if (utf8proc_isupper(cp) || k == UTF8PROC_CATEGORY_LT) return 0; if (utf8proc_islower(cp)) has_cased = 1; break;
        case 5: if (utf8proc_islower(cp) || k == UTF8PROC_CATEGORY_LT) return 0; if (utf8proc_isupper(cp)) has_cased = 1; break;
        }
        i += (size_t)w;
    }
    return kind >= 4 ? has_cased : 1;
}

static int affix(ct_ctx *c, tv s, tv arg, int end, int *r) {
    *r = 0;
    if (arg.t == TV_LIST && arg.l->tuple) {
        for (size_t i = 0; i < arg.l->n && !*r; i++)
            if (affix(c, s, arg.l->v[i], end, r)) return -1;
        return 0;
    }
    if (arg.t != TV_STR)
        return ct_fail(c, QD_ERR_INVALID_ARG, "%swith first arg must be str or a tuple of str, not %s", end ? "ends" : "starts",
                       ct_type_name(arg));
    *r = arg.s.n <= s.s.n && memcmp(s.s.p + (end ? s.s.n - arg.s.n : 0), arg.s.p, arg.s.n) == 0;
    return 0;
}

static int str_method(ct_ctx *c, tv s, const char *m, tv *args, int nargs, const char **kw, tv *kwv, int nkw, tv *out) {
#define IS(x) (strcmp(m, x) == 0)
    if (IS("format")) return str_format(c, s, args, nargs, kw, kwv, nkw, out);
    if (IS("split") || IS("rsplit")) {
        tv *sep = NULL;
        int64_t maxsplit = -1;
        for (int k = 0; k < nkw; k++) {
            if (strcmp(kw[k], "sep") == 0) { if (kwv[k].t == TV_STR) sep = &kwv[k]; }
            else if (strcmp(kw[k], "maxsplit") == 0 && kwv[k].t == TV_INT) maxsplit = kwv[k].i;
            else return ct_fail(c, QD_ERR_INVALID_ARG, "%s() got an unexpected keyword argument '%s'", m, kw[k]);
        }
        if (want_args(c, m, nargs, 0, 2, 0)) return -1;
        if (nargs >= 1 && args[0].t != TV_NONE) { if (want_str(c, m, args[0])) return -1; sep = &args[0]; }
        if (nargs >= 2) {
            if (args[1].t != TV_INT) return ct_fail(c, QD_ERR_INVALID_ARG, "maxsplit must be an integer");
            maxsplit = args[1].i;
        }
        return do_split(c, s, sep, maxsplit, IS("rsplit"), out);
    }
    if (want_args(c, m, nargs, 0, 3, nkw)) return -1;
    if (IS("startswith") || IS("endswith")) {
        int r;
        if (want_args(c, m, nargs, 1, 1, 0) || affix(c, s, args[0], IS("endswith"), &r)) return -1;
        *out = tv_bool(r);
        return 0;
    }
    if (IS("strip") || IS("lstrip") || IS("rstrip")) {
        if (want_args(c, m, nargs, 0, 1, 0)) return -1;
        const tv *chars = nargs && args[0].t != TV_NONE ? &args[0] : NULL;
        if (chars && want_str(c, m, *chars)) return -1;
        *out = ct_strip(s, chars, !IS("rstrip"), !IS("lstrip"));
        return 0;
    }
    if (IS("replace")) {
        if (want_args(c, m, nargs, 2, 3, 0) || want_str(c, m, args[0]) || want_str(c, m, args[1])) return -1;
        int64_t count = nargs == 3 && args[2].t == TV_INT ? args[2].i : -1;
        return ct_str_replace(c, s, args[0], args[1], count, out);
    }
    if (IS("upper")) return ct_case_map(c, s, CT_CASE_UPPER, out);
    if (IS("lower")) return ct_case_map(c, s, CT_CASE_LOWER, out);
    if (IS("title")) return ct_case_map(c, s, CT_CASE_TITLE, out);
    if (IS("capitalize")) return ct_case_map(c, s, CT_CASE_CAPITALIZE, out);
    if (IS("swapcase")) return ct_case_map(c, s, CT_CASE_SWAP, out);
    if (IS("find") || IS("rfind") || IS("index")) {
        if (want_args(c, m, nargs, 1, 1, 0) || want_str(c, m, args[0])) return -1;
        const char *f = find_sub(s.s.p, s.s.n, args[0].s.p, args[0].s.n, IS("rfind"));
        if (!f && IS("index")) return ct_fail(c, QD_ERR_INVALID_ARG, "substring not found");
        *out = tv_int(f ? cp_index(s.s.p, (size_t)(f - s.s.p)) : -1);
        return 0;
    }
    if (IS("count")) {
        if (want_args(c, m, nargs, 1, 1, 0) || want_str(c, m, args[0])) return -1;
        if (args[0].s.n == 0) { *out = tv_int((int64_t)ct_utf8_len(s.s.p, s.s.n) + 1); return 0; }
        int64_t k = 0;
        for (const char *p = s.s.p, *e = s.s.p + s.s.n; (p = find_sub(p, (size_t)(e - p), args[0].s.p, args[0].s.n, 0));
             p += args[0].s.n)
            k++;
        *out = tv_int(k);
        return 0;
    }
    if (IS("join")) {
        if (want_args(c, m, nargs, 1, 1, 0)) return -1;
        if (args[0].t != TV_LIST) return ct_fail(c, QD_ERR_UNSUPPORTED, "str.join() needs a list");
        ct_buf b = {0};
        b.limit = c->out->limit;   /* temporaries obey the output bound too */
        for (size_t i = 0; i < args[0].l->n; i++) {
            tv it = args[0].l->v[i];
            if (it.t != TV_STR) { ct_buf_free(&b); return ct_fail(c, QD_ERR_INVALID_ARG, "sequence item %zu: expected str instance, %s found", i, ct_type_name(it)); }
            if (i) ct_buf_put(&b, s.s.p, s.s.n);
            ct_buf_put(&b, it.s.p, it.s.n);
        }
        int ok = !b.oom;
        if (ok) *out = ct_str_dup(c, b.p ? b.p : "", b.n, &ok);
        else ct_oom(c);
        ct_buf_free(&b);
        return ok ? 0 : -1;
    }
    if (IS("splitlines")) {
        svec parts = {0};
        size_t st = 0, i = 0;
        while (i < s.s.n) {
            char ch = s.s.p[i];
            size_t brk = (ch == '\n' || ch == '\r' || ch == '\v' || ch == '\f' || (ch >= 0x1c && ch <= 0x1e)) ? 1 : 0;
            if (!brk && ct_space_at(s.s.p, s.s.n, i) > 1) {
                const unsigned char *u = (const unsigned char *)s.s.p + i;
                if ((u[0] == 0xc2 && u[1] == 0x85)) brk = 2;
                else if (u[0] == 0xe2 && u[1] == 0x80 && (u[2] == 0xa8 || u[2] == 0xa9)) brk = 3;
            }
            if (!brk) { i++; continue; }
            if (svec_push(c, &parts, tv_strn(s.s.p + st, i - st))) return -1;
            i += (ch == '\r' && i + 1 < s.s.n && s.s.p[i + 1] == '\n') ? 2 : brk;
            st = i;
        }
        if (st < s.s.n && svec_push(c, &parts, tv_strn(s.s.p + st, s.s.n - st))) return -1;
        return svec_list(c, &parts, 0, out);
    }
    static const char *const preds[] = {"isdigit", "isalpha", "isalnum", "isspace", "islower", "isupper"};
    for (int k = 0; k < 6; k++)
        if (IS(preds[k])) { *out = tv_bool(ct_str_pred(s, k)); return 0; }
#undef IS
    return ct_fail(c, QD_ERR_UNSUPPORTED, "unsupported construct: str.%s()", m);
}

int ct_call_method(ct_ctx *c, tv self, const char *name, tv *args, int nargs, const char **kw, tv *kwv, int nkw, tv *out) {
    if (self.t == TV_STR) return str_method(c, self, name, args, nargs, kw, kwv, nkw, out);
    if (self.t == TV_LOOP) {
        if (nargs == 0) return ct_fail(c, QD_ERR_INVALID_ARG, "no items for cycling given");
        *out = args[self.loop->i % (size_t)nargs];
        return 0;
    }
    if (self.t == TV_DICT) {
        tdict *d = self.d;
        if (strcmp(name, "get") == 0) {
            if (want_args(c, "get", nargs, 1, 2, nkw)) return -1;
            tv *v = ct_dict_lookup(d, args[0]);
            *out = v ? *v : nargs == 2 ? args[1] : tv_none();
            return 0;
        }
        if (want_args(c, name, nargs, 0, 0, nkw)) return -1;
        tlist *l = ct_list_new(c, d->n);
        if (!l) return -1;
        for (size_t i = 0; i < d->n; i++) {
            if (name[0] == 'k') l->v[i] = d->k[i];
            else if (name[0] == 'v') l->v[i] = d->v[i];
            else {
                tlist *pair = ct_list_new(c, 2);
                if (!pair) return -1;
                pair->tuple = 1;
                pair->v[0] = d->k[i];
                pair->v[1] = d->v[i];
                l->v[i].t = TV_LIST;
                l->v[i].l = pair;
            }
        }
        out->t = TV_LIST;
        out->l = l;
        return 0;
    }
    return ct_fail(c, QD_ERR_UNSUPPORTED, "unsupported construct: method %s() of %s", name, ct_type_name(self));
}

/* ------------------------------------------------------------------ printf-style */

/* `fmt % args` as Python does it for the common conversions (s r d i x X o
 * e E f F g G c %), with flags, width and precision; `%(name)s` with a dict. */
int ct_str_percent(ct_ctx *c, tv fmt, tv arg, tv *out) {
    tv *args = &arg;
    size_t nargs = 1, ai = 0;
    int mapping = arg.t == TV_DICT;
    if (arg.t == TV_LIST && arg.l->tuple) { args = arg.l->v; nargs = arg.l->n; }
    ct_buf b = {0};
    b.limit = c->out->limit;   /* temporaries obey the output bound too */
    const char *p = fmt.s.p, *e = p + fmt.s.n;
    int rc = 0;
    while (p < e && rc == 0) {
        if (*p != '%') { ct_buf_putc(&b, *p++); continue; }
        if (++p >= e) { rc = ct_fail(c, QD_ERR_INVALID_ARG, "incomplete format"); break; }
        tv v = tv_undef();
        int have = 0;
        if (*p == '(') {
            const char *q = memchr(p, ')', (size_t)(e - p));
            if (!q || !mapping) { rc = ct_fail(c, QD_ERR_INVALID_ARG, "format requires a mapping"); break; }
            tv *x = ct_dict_get(arg.d, p + 1, (size_t)(q - p - 1));
            if (!x) { rc = ct_fail(c, QD_ERR_INVALID_ARG, "format key '%.*s' not found", (int)(q - p - 1), p + 1); break; }
            v = *x;
            have = 1;
            p = q + 1;
        }
        char spec[48];
        size_t k = 0;
        spec[k++] = '%';
        while (p < e && strchr("-+ 0#", *p) && k < 8) spec[k++] = *p++;
        while (p < e && *p >= '0' && *p <= '9' && k < 16) spec[k++] = *p++;
        if (p < e && *p == '.') {
            spec[k++] = *p++;
            while (p < e && *p >= '0' && *p <= '9' && k < 24) spec[k++] = *p++;
        }
        if (p >= e) { rc = ct_fail(c, QD_ERR_INVALID_ARG, "incomplete format"); break; }
        char conv = *p++;
        if (conv == '%') { ct_buf_putc(&b, '%'); continue; }
        if (!have) {
            if (mapping && nargs == 1 && !(arg.t == TV_LIST)) v = arg;
            else if (ai < nargs) v = args[ai];
            else { rc = ct_fail(c, QD_ERR_INVALID_ARG, "not enough arguments for format string"); break; }
            ai++;
        }
        char tmp[512];
        if (conv == 's' || conv == 'r' || conv == 'a') {
            ct_buf sb = {0};
            sb.limit = c->out->limit;
            if (conv == 's') ct_to_str(&sb, v); else ct_repr(&sb, v);
            /* width/precision count code points in Python; apply them on bytes for ASCII only. */
            spec[k++] = 's';
            spec[k] = 0;
            if (k == 2 || sb.oom) ct_buf_put(&b, sb.p ? sb.p : "", sb.n);
            else {
                int n = snprintf(tmp, sizeof tmp, spec, sb.p ? sb.p : "");
                if (n >= (int)sizeof tmp) ct_buf_put(&b, sb.p, sb.n); else ct_buf_put(&b, tmp, (size_t)n);
            }
            ct_buf_free(&sb);
            continue;
        }
        int is_num = v.t == TV_INT || v.t == TV_BOOL || v.t == TV_FLOAT;
        if (!is_num) { rc = ct_fail(c, QD_ERR_INVALID_ARG, "%%%c format: a real number is required, not %s", conv, ct_type_name(v)); break; }
        double dv = v.t == TV_FLOAT ? v.f : v.t == TV_INT ? (double)v.i : v.b;
        long long iv = v.t == TV_FLOAT ? (long long)v.f : v.t == TV_INT ? v.i : v.b;
        if (strchr("diu", conv)) { spec[k++] = 'l'; spec[k++] = 'l'; spec[k++] = 'd'; spec[k] = 0; snprintf(tmp, sizeof tmp, spec, iv); }
        else if (strchr("xXo", conv)) {
            if (v.t == TV_FLOAT) { rc = ct_fail(c, QD_ERR_INVALID_ARG, "%%%c format: an integer is required", conv); break; }
            spec[k++] = 'l'; spec[k++] = 'l'; spec[k++] = conv; spec[k] = 0;
            if (iv < 0) { ct_buf_putc(&b, '-'); iv = -iv; }
            snprintf(tmp, sizeof tmp, spec, (unsigned long long)iv);
        } else if (strchr("eEfFgG", conv)) { spec[k++] = conv; spec[k] = 0; snprintf(tmp, sizeof tmp, spec, dv); }
        else if (conv == 'c' && v.t == TV_INT && v.i >= 0 && v.i < 0x110000) {
            char u[5];
            ct_buf_put(&b, u, (size_t)utf8proc_encode_char((utf8proc_int32_t)v.i, (utf8proc_uint8_t *)u));
            continue;
        } else { rc = ct_fail(c, QD_ERR_UNSUPPORTED, "unsupported format character '%c'", conv); break; }
        ct_buf_puts(&b, tmp);
    }
    /* Python: leftover tuple items, or a scalar never consumed, are an error; a
     * dict or list argument (mapping-like) may go unused. */
    int leftover = arg.t == TV_LIST && arg.l->tuple ? ai < nargs : (arg.t != TV_DICT && arg.t != TV_LIST && ai == 0);
    if (rc == 0 && leftover) rc = ct_fail(c, QD_ERR_INVALID_ARG, "not all arguments converted during string formatting");
    if (rc == 0 && b.oom) rc = ct_oom(c);
    int ok = 1;
    if (rc == 0) *out = ct_str_dup(c, b.p ? b.p : "", b.n, &ok);
    ct_buf_free(&b);
    return rc || !ok ? -1 : 0;
}

/* ------------------------------------------------------------------ globals */

static int make_ns(ct_ctx *c, tv *args, int nargs, const char **kw, tv *kwv, int nkw, tv *out, tv_type t) {
    tdict *d = ct_dict_new(c, (size_t)nkw + 4);
    if (!d) return -1;
    if (nargs > 1) return ct_fail(c, QD_ERR_INVALID_ARG, "expected at most 1 positional argument, got %d", nargs);
    if (nargs == 1) {
        if (args[0].t != TV_DICT) return ct_fail(c, QD_ERR_UNSUPPORTED, "positional argument must be a dict");
        for (size_t i = 0; i < args[0].d->n; i++)
            if (ct_dict_set(c, d, args[0].d->k[i], args[0].d->v[i])) return -1;
    }
    for (int k = 0; k < nkw; k++)
        if (ct_dict_set(c, d, tv_strn(kw[k], strlen(kw[k])), kwv[k])) return -1;
    out->t = t;
    out->d = d;
    return 0;
}

int ct_call_builtin(ct_ctx *c, int fn, tv *args, int nargs, const char **kw, tv *kwv, int nkw, tv *out) {
    switch (fn) {
    case CT_FN_NAMESPACE: return make_ns(c, args, nargs, kw, kwv, nkw, out, TV_NS);
    case CT_FN_DICT: return make_ns(c, args, nargs, kw, kwv, nkw, out, TV_DICT);
    case CT_FN_RAISE: {
        tv msg = nargs ? args[0] : tv_strn("", 0);
        if (ct_stringify(c, msg, &msg)) return -1;
        return ct_fail(c, QD_ERR_INVALID_ARG, "%.*s", (int)(msg.s.n > 900 ? 900 : msg.s.n), msg.s.p);
    }
    case CT_FN_STRFTIME: {
        if (want_args(c, "strftime_now", nargs, 1, 1, nkw) || want_str(c, "strftime_now", args[0])) return -1;
        char fmt[256], buf[512];
        snprintf(fmt, sizeof fmt, "%.*s", (int)(args[0].s.n > 255 ? 255 : args[0].s.n), args[0].s.p);
        time_t now = time(NULL);
        struct tm tmv;
        localtime_r(&now, &tmv);
        size_t n = strftime(buf, sizeof buf, fmt, &tmv);
        int ok;
        *out = ct_str_dup(c, buf, n, &ok);
        return ok ? 0 : -1;
    }
    case CT_FN_RANGE: {
        if (want_args(c, "range", nargs, 1, 3, nkw)) return -1;
        for (int i = 0; i < nargs; i++)
            if (args[i].t != TV_INT && args[i].t != TV_BOOL)
                return ct_fail(c, QD_ERR_INVALID_ARG, "range() arguments must be integers, not %s", ct_type_name(args[i]));
        int64_t a = 0, b, st = 1;
        if (nargs == 1) b = args[0].t == TV_INT ? args[0].i : args[0].b;
        else {
            a = args[0].t == TV_INT ? args[0].i : args[0].b;
            b = args[1].t == TV_INT ? args[1].i : args[1].b;
            if (nargs == 3) st = args[2].t == TV_INT ? args[2].i : args[2].b;
        }
        if (st == 0) return ct_fail(c, QD_ERR_INVALID_ARG, "range() arg 3 must not be zero");
        /* 128-bit arithmetic so hostile bounds cannot overflow the count. */
        __int128 span = st > 0 ? (__int128)b - a : (__int128)a - b, stp = st > 0 ? (__int128)st : -(__int128)st;
        __int128 n128 = span <= 0 ? 0 : (span + stp - 1) / stp;
        if (n128 > 10000000) return ct_fail(c, QD_ERR_CAPACITY, "range() exceeds the limit of 10000000 items");
        int64_t n = (int64_t)n128;
        tlist *l = ct_list_new(c, (size_t)n);
        if (!l) return -1;
        for (int64_t i = 0; i < n; i++) l->v[i] = tv_int(a + i * st);
        out->t = TV_LIST;
        out->l = l;
        return 0;
    }
    }
    return ct_fail(c, QD_ERR_INTERNAL, "bad builtin %d", fn);
}
