/* Schema compiler: `pattern` as a regular-expression subset, compiled to the grammar
 * of the JSON string literals whose decoded text matches (json_schema.h).
 *
 * Supported: literals (ASCII and UTF-8), `.`, classes `[a-z0-9_]` and `[^...]` over
 * ASCII with \d \w \s inside, \d \w \s \D \W \S, escaped punctuation, groups `(...)`
 * and `(?:...)`, alternation `|`, quantifiers `* + ? {m} {m,} {m,n}`, `^` at the
 * start and `$` at the end (a pattern without them matches anywhere, as JSON Schema
 * says: any text may come before or after). Refused with QD_ERR_UNSUPPORTED, named:
 * lookarounds, backreferences, named groups, lazy or possessive quantifiers, word
 * boundaries, anchors elsewhere, non-ASCII characters in classes.
 * Generated characters are written plainly or with the short escapes (\" \\ \/ \b \f
 * \n \r \t), never as \u escapes, so what the grammar writes is what the regex sees. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/grammar/json_schema.h"
#include "runtime/grammar/json_schema_int.h"

typedef struct rx {
    sc_ctx *c;
    const char *p, *end;
    const char *path;
} rx;

typedef struct ascii_set {
    uint8_t b[16]; /* bit c: ASCII character c */
} ascii_set;

static void set_add(ascii_set *s, int c) { s->b[c >> 3] |= (uint8_t)(1u << (c & 7)); }
static int set_has(const ascii_set *s, int c) { return (s->b[c >> 3] >> (c & 7)) & 1; }

static int rx_fail(rx *r, const char *what) {
    return sc_fail(r->c, QD_ERR_UNSUPPORTED, "unsupported keyword 'pattern' at %s: %s is not in the supported subset", r->path,
                   what);
}

/* One JSON string character whose decoded value is an ASCII character in `allow`, or
 * (with nonascii) any non-ASCII character. */
static int char_rule(rx *r, const ascii_set *allow, int nonascii) {
    qd_grammar *g = r->c->g;
    int rule = qd_grammar_rule(g);
    uint8_t plain[32] = {0}, esc[32] = {0};
    int n_plain = 0, n_esc = 0;
    for (int c = 0; c < 128; c++) {
        if (!set_has(allow, c)) continue;
        const char *e = NULL;
        switch (c) {
        case '"': e = "\""; break;
        case '\\': e = "\\"; break;
        case '\b': e = "b"; break;
        case '\f': e = "f"; break;
        case '\n': e = "n"; break;
        case '\r': e = "r"; break;
        case '\t': e = "t"; break;
        default: break;
        }
        if (e) {
            esc[(unsigned char)*e >> 3] |= (uint8_t)(1u << (*e & 7));
            n_esc++;
        } else if (c >= 0x20) {
            plain[c >> 3] |= (uint8_t)(1u << (c & 7));
            n_plain++;
        }
    }
    if (n_plain) {
        int32_t s = qd_grammar_class(g, plain);
        qd_grammar_alt(g, rule, &s, 1);
    }
    if (n_esc) {
        int32_t s[2] = {qd_grammar_byte('\\'), qd_grammar_class(g, esc)};
        qd_grammar_alt(g, rule, s, 2);
    }
    if (nonascii) {
        int32_t C = qd_grammar_range(g, 0x80, 0xbf);
        int32_t m2[2] = {qd_grammar_range(g, 0xc2, 0xdf), C};
        int32_t m3a[3] = {qd_grammar_byte(0xe0), qd_grammar_range(g, 0xa0, 0xbf), C};
        int32_t m3b[3] = {qd_grammar_range(g, 0xe1, 0xec), C, C};
        int32_t m3c[3] = {qd_grammar_byte(0xed), qd_grammar_range(g, 0x80, 0x9f), C};
        int32_t m3d[3] = {qd_grammar_range(g, 0xee, 0xef), C, C};
        int32_t m4a[4] = {qd_grammar_byte(0xf0), qd_grammar_range(g, 0x90, 0xbf), C, C};
        int32_t m4b[4] = {qd_grammar_range(g, 0xf1, 0xf3), C, C, C};
        int32_t m4c[4] = {qd_grammar_byte(0xf4), qd_grammar_range(g, 0x80, 0x8f), C, C};
        qd_grammar_alt(g, rule, m2, 2);
        qd_grammar_alt(g, rule, m3a, 3);
        qd_grammar_alt(g, rule, m3b, 3);
        qd_grammar_alt(g, rule, m3c, 3);
        qd_grammar_alt(g, rule, m3d, 3);
        qd_grammar_alt(g, rule, m4a, 4);
        qd_grammar_alt(g, rule, m4b, 4);
        qd_grammar_alt(g, rule, m4c, 4);
    }
    if (!n_plain && !n_esc && !nonascii) return rx_fail(r, "a class that matches nothing");
    return rule;
}

/* \d \w \s and their negations into set; 1 when ch is one of them. */
static int class_escape(char ch, ascii_set *set, int *negated) {
    ascii_set s = {{0}};
    char lo = (char)(ch | 0x20);
    if (lo == 'd') for (int c = '0'; c <= '9'; c++) set_add(&s, c);
    else if (lo == 'w') {
        for (int c = 0; c < 128; c++)
            if ((c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_') set_add(&s, c);
    } else if (lo == 's') {
        const char *sp = " \t\n\r\f\v";
        for (; *sp; sp++) set_add(&s, *sp);
    } else return 0;
    *negated = ch != lo;
    for (int i = 0; i < 16; i++) set->b[i] |= *negated ? 0 : s.b[i];
    if (*negated)
        for (int c = 0; c < 128; c++)
            if (!set_has(&s, c)) set_add(set, c);
    return 1;
}

static int literal_escape_ok(char ch) { return ch && strchr(".^$|?*+()[]{}\\/-\"'#&~!%,:;<=>@`", ch) != NULL; }

static int rx_alt(rx *r);

static int rx_class(rx *r) {
    ascii_set set = {{0}};
    int neg = 0;
    if (r->p < r->end && *r->p == '^') neg = 1, r->p++;
    int first = 1;
    while (r->p < r->end && (*r->p != ']' || first)) {
        first = 0;
        int c = (unsigned char)*r->p++;
        if (c >= 0x80) return rx_fail(r, "a non-ASCII character in a class");
        if (c == '\\') {
            if (r->p >= r->end) return rx_fail(r, "a trailing backslash");
            char e = *r->p++;
            int n;
            if (class_escape(e, &set, &n)) continue;
            if (e == 'n') c = '\n';
            else if (e == 't') c = '\t';
            else if (e == 'r') c = '\r';
            else if (literal_escape_ok(e)) c = e;
            else return rx_fail(r, "this escape in a class");
        }
        if (r->p + 1 < r->end && *r->p == '-' && r->p[1] != ']') {
            int hi = (unsigned char)r->p[1];
            if (hi == '\\' || hi >= 0x80) return rx_fail(r, "this range in a class");
            r->p += 2;
            if (hi < c) return sc_fail(r->c, QD_ERR_INVALID_ARG, "'pattern' at %s: a class range runs backwards", r->path);
            for (int k = c; k <= hi; k++) set_add(&set, k);
        } else set_add(&set, c);
    }
    if (r->p >= r->end) return sc_fail(r->c, QD_ERR_INVALID_ARG, "'pattern' at %s: an unclosed '['", r->path);
    r->p++;
    if (!neg) return char_rule(r, &set, 0);
    ascii_set comp = {{0}};
    for (int c = 0; c < 128; c++)
        if (!set_has(&set, c)) set_add(&comp, c);
    return char_rule(r, &comp, 1);
}

static int rx_atom(rx *r) {
    char ch = *r->p;
    if (ch == '(') {
        r->p++;
        if (r->p < r->end && *r->p == '?') {
            if (r->p + 1 < r->end && r->p[1] == ':') r->p += 2;
            else return rx_fail(r, "a lookaround or named group '(?'");
        }
        int inner = rx_alt(r);
        if (inner < 0) return -1;
        if (r->p >= r->end || *r->p != ')') return sc_fail(r->c, QD_ERR_INVALID_ARG, "'pattern' at %s: an unclosed '('", r->path);
        r->p++;
        return inner;
    }
    if (ch == '[') {
        r->p++;
        return rx_class(r);
    }
    if (ch == '.') {
        r->p++;
        ascii_set all = {{0}};
        for (int c = 0; c < 128; c++)
            if (c != '\n') set_add(&all, c);
        return char_rule(r, &all, 1);
    }
    if (ch == '^' || ch == '$') return rx_fail(r, "an anchor inside the pattern");
    if (ch == '\\') {
        r->p++;
        if (r->p >= r->end) return sc_fail(r->c, QD_ERR_INVALID_ARG, "'pattern' at %s: a trailing backslash", r->path);
        char e = *r->p++;
        ascii_set set = {{0}};
        int neg;
        if (class_escape(e, &set, &neg)) return char_rule(r, &set, neg);
        int lit = e == 'n' ? '\n' : e == 't' ? '\t' : e == 'r' ? '\r' : literal_escape_ok(e) ? e : -1;
        if (lit < 0) return rx_fail(r, e >= '1' && e <= '9' ? "a backreference" : "this escape (\\b, \\B, \\p, ...)");
        ascii_set one = {{0}};
        set_add(&one, lit);
        return char_rule(r, &one, 0);
    }
    /* a literal character: ASCII, or the bytes of one UTF-8 character as they are */
    unsigned char u = (unsigned char)ch;
    if (u < 0x80) {
        r->p++;
        ascii_set one = {{0}};
        set_add(&one, u);
        return char_rule(r, &one, 0);
    }
    size_t len = u >= 0xf0 ? 4 : u >= 0xe0 ? 3 : 2;
    if ((size_t)(r->end - r->p) < len) return sc_fail(r->c, QD_ERR_INVALID_ARG, "'pattern' at %s: invalid UTF-8", r->path);
    int rule = qd_grammar_literal(r->c->g, r->p, len);
    r->p += len;
    return rule;
}

/* item{lo,hi} (hi < 0: unbounded) */
static int repeat(rx *r, int item, long lo, long hi) {
    qd_grammar *g = r->c->g;
    int tail;
    if (hi < 0) {
        tail = qd_grammar_rule(g);
        int32_t s[2] = {item, tail};
        qd_grammar_alt(g, tail, NULL, 0);
        qd_grammar_alt(g, tail, s, 2);
    } else {
        tail = sc_seq(r->c, NULL, 0);
        for (long k = lo; k < hi && !r->c->failed; k++) {
            int t = qd_grammar_rule(g);
            int32_t s[2] = {item, tail};
            qd_grammar_alt(g, t, NULL, 0);
            qd_grammar_alt(g, t, s, 2);
            tail = t;
        }
    }
    int32_t *seq = malloc(sizeof(int32_t) * (size_t)(lo + 1));
    if (!seq) return sc_fail(r->c, QD_ERR_OOM, "out of memory for a pattern");
    for (long k = 0; k < lo; k++) seq[k] = item;
    seq[lo] = tail;
    int rule = sc_seq(r->c, seq, (int)lo + 1);
    free(seq);
    return rule;
}

static int rx_quant(rx *r, int atom) {
    if (r->p >= r->end) return atom;
    long lo, hi;
    char q = *r->p;
    if (q == '*') lo = 0, hi = -1, r->p++;
    else if (q == '+') lo = 1, hi = -1, r->p++;
    else if (q == '?') lo = 0, hi = 1, r->p++;
    else if (q == '{') {
        char *e;
        lo = strtol(r->p + 1, &e, 10);
        if (e == r->p + 1) return atom; /* a literal '{' */
        hi = lo;
        if (*e == ',') {
            char *e2;
            hi = strtol(e + 1, &e2, 10);
            if (e2 == e + 1) hi = -1;
            e = e2;
        }
        if (*e != '}') return sc_fail(r->c, QD_ERR_INVALID_ARG, "'pattern' at %s: a malformed {m,n}", r->path);
        r->p = e + 1;
        if (lo < 0 || (hi >= 0 && hi < lo))
            return sc_fail(r->c, QD_ERR_INVALID_ARG, "'pattern' at %s: {%ld,%ld} runs backwards", r->path, lo, hi);
        if (lo > QD_SCHEMA_MAX_REPEAT || hi > QD_SCHEMA_MAX_REPEAT)
            return sc_fail(r->c, QD_ERR_CAPACITY, "'pattern' at %s: a repetition over %d", r->path, QD_SCHEMA_MAX_REPEAT);
    } else return atom;
    if (r->p < r->end && (*r->p == '?' || *r->p == '+')) return rx_fail(r, "a lazy or possessive quantifier");
    if (r->p < r->end && (*r->p == '*' || *r->p == '{')) return rx_fail(r, "a repeated quantifier");
    return repeat(r, atom, lo, hi);
}

static int rx_seq(rx *r) {
    int32_t parts[256];
    int n = 0;
    while (r->p < r->end && *r->p != '|' && *r->p != ')') {
        if (*r->p == '$' && r->p + 1 == r->end) break;
        if (*r->p == '*' || *r->p == '+' || *r->p == '?')
            return sc_fail(r->c, QD_ERR_INVALID_ARG, "'pattern' at %s: a quantifier with nothing to repeat", r->path);
        int a = rx_atom(r);
        if (a < 0) return -1;
        a = rx_quant(r, a);
        if (a < 0) return -1;
        if (n == 256) {
            int folded = sc_seq(r->c, parts, n);
            n = 0;
            parts[n++] = folded;
        }
        parts[n++] = a;
    }
    return sc_seq(r->c, parts, n);
}

static int rx_alt(rx *r) {
    int rule = qd_grammar_rule(r->c->g);
    for (;;) {
        int32_t s = rx_seq(r);
        if (s < 0) return -1;
        qd_grammar_alt(r->c->g, rule, &s, 1);
        if (r->p < r->end && *r->p == '|') {
            r->p++;
            continue;
        }
        return rule;
    }
}

int sc_pattern(sc_ctx *c, const char *pattern, size_t len, const char *path) {
    rx r = {.c = c, .p = pattern, .end = pattern + len, .path = path};
    int anchored_start = len && pattern[0] == '^';
    if (anchored_start) r.p++;
    int body = rx_alt(&r);
    if (body < 0) return -1;
    int anchored_end = r.p < r.end && *r.p == '$';
    if (anchored_end) r.p++;
    if (r.p != r.end) return sc_fail(c, QD_ERR_INVALID_ARG, "'pattern' at %s: an unmatched ')'", path);
    int32_t q = qd_grammar_byte('"');
    int any = -1;
    if (!anchored_start || !anchored_end) {
        ascii_set all = {{0}};
        for (int k = 0; k < 128; k++) set_add(&all, k);
        any = repeat(&r, char_rule(&r, &all, 1), 0, -1);
    }
    int32_t s[4];
    int n = 0;
    s[n++] = q;
    if (!anchored_start) s[n++] = any;
    s[n++] = body;
    if (!anchored_end) s[n++] = any;
    int32_t full[5];
    memcpy(full, s, sizeof(int32_t) * (size_t)n);
    full[n++] = q;
    return sc_seq(c, full, n);
}
