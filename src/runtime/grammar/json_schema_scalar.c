/* Schema compiler: strings (lengths, formats) and numbers (integer ranges as digit
 * grammars) (json_schema.h). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/grammar/json_schema.h"
#include "runtime/grammar/json_schema_int.h"

/* Integers are generated with at most this many digits: an unbounded side is
 * clamped to +-(10^15 - 1), which keeps every value exact in a double. */
#define MAX_DIGITS 15
static const double LIMIT = 999999999999999.0;

/* ------------------------------------------------------------ formats */

static int cls(sc_ctx *c, const char *chars) {
    uint8_t bits[32] = {0};
    for (const char *p = chars; *p; p++) {
        if (p[1] == '-' && p[2]) {
            for (int b = (unsigned char)p[0]; b <= (unsigned char)p[2]; b++) bits[b >> 3] |= (uint8_t)(1u << (b & 7));
            p += 2;
        } else bits[(unsigned char)*p >> 3] |= (uint8_t)(1u << (*p & 7));
    }
    return qd_grammar_class(c->g, bits);
}

/* One or more of a class, right-recursive. */
static int plus(sc_ctx *c, int32_t item) {
    int r = qd_grammar_rule(c->g);
    int32_t s[2] = {item, r};
    qd_grammar_alt(c->g, r, &item, 1);
    qd_grammar_alt(c->g, r, s, 2);
    return r;
}

static int two_digits(sc_ctx *c, const char *first_a, const char *second_a, const char *first_b,
                      const char *second_b) {
    int r = qd_grammar_rule(c->g);
    int32_t a[2] = {cls(c, first_a), cls(c, second_a)};
    qd_grammar_alt(c->g, r, a, 2);
    if (first_b) {
        int32_t b[2] = {cls(c, first_b), cls(c, second_b)};
        qd_grammar_alt(c->g, r, b, 2);
    }
    return r;
}

static int date_rule(sc_ctx *c) {
    int month = two_digits(c, "0", "1-9", "1", "0-2");
    int day = qd_grammar_rule(c->g);
    int32_t d1[2] = {cls(c, "0"), cls(c, "1-9")}, d2[2] = {cls(c, "1-2"), cls(c, "0-9")}, d3[2] = {cls(c, "3"), cls(c, "0-1")};
    qd_grammar_alt(c->g, day, d1, 2);
    qd_grammar_alt(c->g, day, d2, 2);
    qd_grammar_alt(c->g, day, d3, 2);
    int32_t s[5] = {sc_digits(c, 4), qd_grammar_byte('-'), month, qd_grammar_byte('-'), day};
    return sc_seq(c, s, 5);
}

static int time_rule(sc_ctx *c) {
    int hour = two_digits(c, "0-1", "0-9", "2", "0-3");
    int minute = two_digits(c, "0-5", "0-9", NULL, NULL);
    int frac = qd_grammar_rule(c->g);
    int32_t f[3] = {qd_grammar_byte('.'), qd_grammar_range(c->g, '0', '9'), sc_upto_digits(c, 5)};
    qd_grammar_alt(c->g, frac, NULL, 0);
    qd_grammar_alt(c->g, frac, f, 3);
    int tz = qd_grammar_rule(c->g);
    int32_t z = qd_grammar_byte('Z');
    int32_t off[4] = {cls(c, "+-"), hour, qd_grammar_byte(':'), minute};
    qd_grammar_alt(c->g, tz, &z, 1);
    qd_grammar_alt(c->g, tz, off, 4);
    int32_t s[7] = {hour, qd_grammar_byte(':'), minute, qd_grammar_byte(':'), minute, frac, tz};
    return sc_seq(c, s, 7);
}

static int uuid_rule(sc_ctx *c) {
    int32_t h = cls(c, "0-9a-f"), s[36];
    int n = 0;
    const int groups[5] = {8, 4, 4, 4, 12};
    for (int gi = 0; gi < 5; gi++) {
        if (gi) s[n++] = qd_grammar_byte('-');
        for (int k = 0; k < groups[gi]; k++) s[n++] = h;
    }
    return sc_seq(c, s, n);
}

static int email_rule(sc_ctx *c) {
    /* atom ("." atom)* "@" label ("." label)+, labels alphanumeric with inner hyphens */
    int atom = plus(c, cls(c, "A-Za-z0-9_%+-"));
    int label = plus(c, cls(c, "A-Za-z0-9"));
    int32_t dot_atom[2] = {qd_grammar_byte('.'), atom}, dot_label[2] = {qd_grammar_byte('.'), label};
    int more_atoms = qd_grammar_rule(c->g);
    int32_t ma[2] = {sc_seq(c, dot_atom, 2), more_atoms};
    qd_grammar_alt(c->g, more_atoms, NULL, 0);
    qd_grammar_alt(c->g, more_atoms, ma, 2);
    int labels = qd_grammar_rule(c->g); /* ("." label)+ */
    int32_t one = sc_seq(c, dot_label, 2), ml[2] = {one, labels};
    qd_grammar_alt(c->g, labels, &one, 1);
    qd_grammar_alt(c->g, labels, ml, 2);
    int32_t s[5] = {atom, more_atoms, qd_grammar_byte('@'), label, labels};
    return sc_seq(c, s, 5);
}

int sc_string(sc_ctx *c, const json_t *s, const char *path) {
    const json_t *fmt = json_object_get(s, "format");
    long long lo = sc_count(c, s, "minLength", path), hi = sc_count(c, s, "maxLength", path);
    if (lo == -2 || hi == -2) return -1;
    int32_t q = qd_grammar_byte('"');
    const json_t *pat = json_object_get(s, "pattern");
    if (pat) {
        if (!json_is_string(pat)) return sc_fail(c, QD_ERR_INVALID_ARG, "'pattern' at %s must be a string", path);
        if (fmt || lo >= 0 || hi >= 0)
            return sc_fail(c, QD_ERR_UNSUPPORTED, "unsupported combination at %s: 'pattern' with 'format' or a length bound", path);
        return sc_pattern(c, json_string_value(pat), json_string_length(pat), path);
    }
    if (fmt) {
        if (!json_is_string(fmt)) return sc_fail(c, QD_ERR_INVALID_ARG, "'format' at %s must be a string", path);
        if (lo >= 0 || hi >= 0)
            return sc_fail(c, QD_ERR_UNSUPPORTED, "unsupported combination at %s: 'format' with a length bound", path);
        const char *f = json_string_value(fmt);
        int body;
        if (!strcmp(f, "date")) body = date_rule(c);
        else if (!strcmp(f, "time")) body = time_rule(c);
        else if (!strcmp(f, "date-time")) {
            int32_t dt[3] = {date_rule(c), qd_grammar_byte('T'), time_rule(c)};
            body = sc_seq(c, dt, 3);
        } else if (!strcmp(f, "uuid")) body = uuid_rule(c);
        else if (!strcmp(f, "email")) body = email_rule(c);
        else return sc_fail(c, QD_ERR_UNSUPPORTED, "unsupported keyword 'format' value \"%s\" at %s", f, path);
        int32_t seq[3] = {q, body, q};
        return sc_seq(c, seq, 3);
    }
    if (lo < 0 && hi < 0) return sc_any_string(c);
    if (lo < 0) lo = 0;
    if (hi >= 0 && hi < lo)
        return sc_fail(c, QD_ERR_INVALID_ARG, "'maxLength' %lld < 'minLength' %lld at %s", hi, lo, path);
    int ch = sc_char(c);
    int tail = sc_upto(c, ch, hi < 0 ? -1 : hi - lo);
    int32_t *seq = malloc(sizeof(int32_t) * (size_t)(lo + 3));
    if (!seq) return sc_fail(c, QD_ERR_OOM, "out of memory for the string at %s", path);
    int n = 0;
    seq[n++] = q;
    for (long long k = 0; k < lo; k++) seq[n++] = ch;
    seq[n++] = tail;
    seq[n++] = q;
    int r = sc_seq(c, seq, n);
    free(seq);
    return r;
}

/* ------------------------------------------------------------ numbers */

/* The decimal strings of one length n between a and b (digit strings of length n,
 * a <= b); leading zeros are the caller's business. */
static int range_same(sc_ctx *c, const char *a, const char *b, int n) {
    if (n == 0) return sc_seq(c, NULL, 0);
    int all09 = 1;
    for (int i = 0; i < n; i++)
        if (a[i] != '0' || b[i] != '9') all09 = 0;
    if (all09) return sc_digits(c, n);
    int r = qd_grammar_rule(c->g);
    if (a[0] == b[0]) {
        int32_t s[2] = {qd_grammar_byte((unsigned char)a[0]), range_same(c, a + 1, b + 1, n - 1)};
        qd_grammar_alt(c->g, r, s, 2);
        return r;
    }
    char nines[MAX_DIGITS + 2], zeros[MAX_DIGITS + 2];
    memset(nines, '9', sizeof nines);
    memset(zeros, '0', sizeof zeros);
    int32_t lo[2] = {qd_grammar_byte((unsigned char)a[0]), range_same(c, a + 1, nines, n - 1)};
    qd_grammar_alt(c->g, r, lo, 2);
    if (b[0] - a[0] >= 2) {
        int32_t mid[2] = {qd_grammar_range(c->g, (unsigned)a[0] + 1, (unsigned)b[0] - 1), sc_digits(c, n - 1)};
        qd_grammar_alt(c->g, r, mid, 2);
    }
    int32_t hi[2] = {qd_grammar_byte((unsigned char)b[0]), range_same(c, zeros, b + 1, n - 1)};
    qd_grammar_alt(c->g, r, hi, 2);
    return r;
}

static int n_digits(long long v) {
    int n = 1;
    while (v >= 10) v /= 10, n++;
    return n;
}

/* Non-negative integers lo..hi written without leading zeros; -1 when the range is empty. */
static int range_nonneg(sc_ctx *c, long long lo, long long hi) {
    if (lo > hi) return -1;
    int r = qd_grammar_rule(c->g);
    long long p10 = 1;
    for (int d = 1; d <= n_digits(hi); d++, p10 *= 10) {
        long long a = d == 1 ? 0 : p10, b = p10 * 10 - 1;
        if (a < lo) a = lo;
        if (b > hi) b = hi;
        if (a > b) continue;
        char sa[24], sb[24];
        snprintf(sa, sizeof sa, "%lld", a);
        snprintf(sb, sizeof sb, "%lld", b);
        int32_t s = range_same(c, sa, sb, d);
        qd_grammar_alt(c->g, r, &s, 1);
    }
    return r;
}

static int fraction(sc_ctx *c) {
    int32_t s[3] = {qd_grammar_byte('.'), qd_grammar_range(c->g, '0', '9'), sc_upto_digits(c, MAX_DIGITS - 1)};
    return sc_seq(c, s, 3);
}

static void add_alt2(sc_ctx *c, int r, int32_t a, int32_t b) {
    int32_t s[2] = {a, b};
    qd_grammar_alt(c->g, r, s, b == INT32_MIN ? 1 : 2);
}

/* Integers lo..hi, and with `frac` also the decimals k.ddd whose whole interval
 * [k, k + 1) (or (-(m + 1), -m] for -m.ddd) lies in [flo, fhi]. */
static int signed_values(sc_ctx *c, long long lo, long long hi, int frac, double flo, double fhi) {
    int r = qd_grammar_rule(c->g);
    int32_t minus = qd_grammar_byte('-');
    if (hi >= 0) {
        int nn = range_nonneg(c, lo > 0 ? lo : 0, hi);
        if (nn >= 0) add_alt2(c, r, nn, INT32_MIN);
    }
    if (lo < 0) {
        int neg = range_nonneg(c, hi < -1 ? -hi : 1, -lo);
        if (neg >= 0) add_alt2(c, r, minus, neg);
    }
    if (frac) {
        /* k >= 0: k >= lo (then k.ddd >= k is valid) and k + 1 <= fhi */
        long long kmax = (long long)floor(fhi) - 1, kmin = lo > 0 ? lo : 0;
        if (kmax > hi) kmax = hi;
        int pos = range_nonneg(c, kmin, kmax);
        if (pos >= 0) add_alt2(c, r, pos, fraction(c));
        /* -m.ddd in (-(m + 1), -m]: -m <= hi and -(m + 1) >= flo; m = 0 gives -0.ddd */
        long long mmin = hi < 0 ? -hi : 0, mmax = (long long)floor(-flo) - 1;
        if (mmax > -lo) mmax = -lo;
        int negf = range_nonneg(c, mmin, mmax);
        if (negf >= 0) {
            int32_t s[3] = {minus, negf, fraction(c)};
            qd_grammar_alt(c->g, r, s, 3);
        }
    }
    return r;
}

static int bound(sc_ctx *c, const json_t *s, const char *key, const char *path, double *out) {
    const json_t *v = json_object_get(s, key);
    if (!v) return 0;
    if (!json_is_number(v)) {
        sc_fail(c, QD_ERR_INVALID_ARG, "'%s' at %s must be a number", key, path);
        return -1;
    }
    *out = json_number_value(v);
    if (!isfinite(*out)) {
        sc_fail(c, QD_ERR_INVALID_ARG, "'%s' at %s is not finite", key, path);
        return -1;
    }
    return 1;
}

int sc_numeric(sc_ctx *c, const json_t *s, const char *path, int integer) {
    double mn = -LIMIT, mx = LIMIT, emn = 0, emx = 0;
    int has_mn = 0, has_mx = 0, has_emn = 0, has_emx = 0;
    if (s) {
        has_mn = bound(c, s, "minimum", path, &mn);
        has_mx = bound(c, s, "maximum", path, &mx);
        has_emn = bound(c, s, "exclusiveMinimum", path, &emn);
        has_emx = bound(c, s, "exclusiveMaximum", path, &emx);
        if (has_mn < 0 || has_mx < 0 || has_emn < 0 || has_emx < 0) return -1;
    }
    int bounded = has_mn || has_mx || has_emn || has_emx;
    int *memo = integer ? &c->r_integer : &c->r_number;
    if (!bounded && *memo >= 0) return *memo;
    /* the integers in range: ceil/floor of the bounds, exclusive ones one step in */
    double lo_d = has_mn ? ceil(mn) : -LIMIT, hi_d = has_mx ? floor(mx) : LIMIT;
    if (has_emn && floor(emn) + 1 > lo_d) lo_d = floor(emn) + 1;
    if (has_emx && ceil(emx) - 1 < hi_d) hi_d = ceil(emx) - 1;
    if (lo_d < -LIMIT) lo_d = -LIMIT;
    if (hi_d > LIMIT) hi_d = LIMIT;
    /* the real bounds for fractions: an exclusive bound is never reached by k.ddd or
     * -m.ddd intervals ending at it (both are half-open on that side) */
    double flo = has_mn ? mn : -LIMIT, fhi = has_mx ? mx : LIMIT;
    if (has_emn && emn > flo) flo = emn;
    if (has_emx && emx < fhi) fhi = emx;
    if (flo < -LIMIT) flo = -LIMIT;
    if (fhi > LIMIT) fhi = LIMIT;
    if (lo_d > hi_d) {
        if (integer || (has_emn && has_emx))
            return sc_fail(c, QD_ERR_INVALID_ARG, "no %s at %s meets its bounds", integer ? "integer" : "number", path);
        return sc_fail(c, QD_ERR_UNSUPPORTED,
                       "unsupported bounds at %s: no integer lies between them (only integral and k.ddd values are generated)",
                       path);
    }
    int r = signed_values(c, (long long)lo_d, (long long)hi_d, !integer, flo, fhi);
    if (!bounded) *memo = r;
    return r;
}
