/* Chat-template lexer: splits template source into text and tag tokens, and the
 * inside of {{ }} / {% %} into expression tokens.
 *
 * Whitespace handling reproduces Jinja2's lexer with the options transformers
 * uses (trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=False):
 *   {%- / {{- / {#-  strip all whitespace before the tag;
 *   -%} / -}} / -#}  strip all whitespace after it;
 *   %} and #}        drop one newline right after (trim_blocks) unless +%};
 *   {% and {#        drop spaces/tabs between line start and the tag
 *                    (lstrip_blocks) unless {%+;
 * and one trailing newline of the whole template is dropped. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/chat_template_int.h"

typedef struct lexer {
    const char *s;
    size_t n, pos;
    int line;
    ct_arena *ar;
    ct_tokens *out;
    qd_err *err;
} lexer;

static int lex_fail(lexer *L, const char *msg) {
    qd_seterr(L->err, QD_ERR_FORMAT, "chat template line %d: %s", L->line, msg);
    return -1;
}

static ct_token *push(lexer *L, tk_type t, int line) {
    ct_tokens *o = L->out;
    if (o->n == o->cap) {
        size_t cap = o->cap ? o->cap * 2 : 256;
        ct_token *v = realloc(o->v, cap * sizeof *v);
        if (!v) return NULL;
        o->v = v;
        o->cap = cap;
    }
    ct_token *tk = &o->v[o->n++];
    memset(tk, 0, sizeof *tk);
    tk->t = t;
    tk->line = line;
    return tk;
}

/* Length of a Python-whitespace character (str.isspace) ending at p[end-1] or
 * starting at p[i]; 0 when there is none. Covers ASCII and the common Unicode
 * spaces. */
size_t ct_space_at(const char *p, size_t n, size_t i) {
    unsigned char c = (unsigned char)p[i];
    if (c == ' ' || (c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x1f)) return 1;
    if (c == 0xc2 && i + 1 < n && ((unsigned char)p[i + 1] == 0x85 || (unsigned char)p[i + 1] == 0xa0)) return 2;
    if (i + 2 < n) {
        unsigned char c1 = (unsigned char)p[i + 1], c2 = (unsigned char)p[i + 2];
        if (c == 0xe1 && c1 == 0x9a && c2 == 0x80) return 3;
        if (c == 0xe2 && c1 == 0x80 && (c2 <= 0x8a || c2 == 0xa8 || c2 == 0xa9 || c2 == 0xaf)) return 3;
        if (c == 0xe2 && c1 == 0x81 && c2 == 0x9f) return 3;
        if (c == 0xe3 && c1 == 0x80 && c2 == 0x80) return 3;
    }
    return 0;
}

static size_t rstrip_len(const char *p, size_t n) {
    while (n > 0) {
        size_t k = 0;
        for (size_t w = 1; w <= 3 && w <= n; w++)
            if (ct_space_at(p, n, n - w) == w) { k = w; break; }
        if (!k) break;
        n -= k;
    }
    return n;
}

static void count_lines(lexer *L, size_t from, size_t to) {
    for (size_t i = from; i < to; i++)
        if (L->s[i] == '\n') L->line++;
}

static size_t skip_space(lexer *L, size_t i) {
    size_t k;
    while (i < L->n && (k = ct_space_at(L->s, L->n, i)) > 0) i += k;
    return i;
}

/* Emits a text token with \r\n and \r normalised to \n, as Jinja does. */
static int emit_text(lexer *L, const char *p, size_t n, int line) {
    if (n == 0) return 0;
    char *d = ct_alloc(L->ar, n + 1);
    ct_token *tk = push(L, TK_TEXT, line);
    if (!d || !tk) return lex_fail(L, "out of memory");
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        if (p[i] == '\r') {
            d[k++] = '\n';
            if (i + 1 < n && p[i + 1] == '\n') i++;
        } else d[k++] = p[i];
    }
    tk->str = d;
    tk->str_n = k;
    return 0;
}

static void put_utf8(char *d, size_t *k, uint32_t cp) {
    if (cp < 0x80) d[(*k)++] = (char)cp;
    else if (cp < 0x800) {
        d[(*k)++] = (char)(0xC0 | (cp >> 6));
        d[(*k)++] = (char)(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
        d[(*k)++] = (char)(0xE0 | (cp >> 12));
        d[(*k)++] = (char)(0x80 | ((cp >> 6) & 0x3F));
        d[(*k)++] = (char)(0x80 | (cp & 0x3F));
    } else {
        d[(*k)++] = (char)(0xF0 | (cp >> 18));
        d[(*k)++] = (char)(0x80 | ((cp >> 12) & 0x3F));
        d[(*k)++] = (char)(0x80 | ((cp >> 6) & 0x3F));
        d[(*k)++] = (char)(0x80 | (cp & 0x3F));
    }
}

static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* A string literal, decoded like Python's unicode-escape (Jinja's rule). */
static int lex_string(lexer *L, ct_token *tk) {
    char q = L->s[L->pos];
    size_t i = L->pos + 1, start = i;
    while (i < L->n && L->s[i] != q) {
        if (L->s[i] == '\\' && i + 1 < L->n) i++;
        i++;
    }
    if (i >= L->n) return lex_fail(L, "unterminated string literal");
    size_t n = i - start;
    char *d = ct_alloc(L->ar, n * 2 + 8);
    if (!d) return lex_fail(L, "out of memory");
    size_t k = 0;
    const char *p = L->s + start;
    for (size_t j = 0; j < n; j++) {
        char c = p[j];
        if (c == '\r') { d[k++] = '\n'; if (j + 1 < n && p[j + 1] == '\n') j++; continue; }
        if (c != '\\' || j + 1 >= n) { d[k++] = c; continue; }
        char e = p[++j];
        int digits = 0;
        switch (e) {
        case '\n': break;
        case '\\': d[k++] = '\\'; break;
        case '\'': d[k++] = '\''; break;
        case '"': d[k++] = '"'; break;
        case 'a': d[k++] = '\a'; break;
        case 'b': d[k++] = '\b'; break;
        case 'f': d[k++] = '\f'; break;
        case 'n': d[k++] = '\n'; break;
        case 'r': d[k++] = '\r'; break;
        case 't': d[k++] = '\t'; break;
        case 'v': d[k++] = '\v'; break;
        case 'x': digits = 2; break;
        case 'u': digits = 4; break;
        case 'U': digits = 8; break;
        default:
            if (e >= '0' && e <= '7') {
                uint32_t v = (uint32_t)(e - '0');
                for (int m = 0; m < 2 && j + 1 < n && p[j + 1] >= '0' && p[j + 1] <= '7'; m++) v = v * 8 + (uint32_t)(p[++j] - '0');
                put_utf8(d, &k, v);
            } else if (e == 'N') {
                return lex_fail(L, "unsupported construct: \\N{...} escape in string literal");
            } else {
                d[k++] = '\\';
                d[k++] = e;
            }
        }
        if (digits) {
            uint32_t v = 0;
            for (int m = 0; m < digits; m++) {
                int h = j + 1 < n ? hexval(p[j + 1]) : -1;
                if (h < 0) return lex_fail(L, "truncated \\x/\\u escape in string literal");
                v = v * 16 + (uint32_t)h;
                j++;
            }
            if (v > 0x10FFFF) return lex_fail(L, "illegal Unicode character in string literal");
            put_utf8(d, &k, v);
        }
    }
    tk->str = d;
    tk->str_n = k;
    count_lines(L, L->pos, i + 1);
    L->pos = i + 1;
    return 0;
}

static int is_name_start(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
static int is_digit(char c) { return c >= '0' && c <= '9'; }

/* `(\d+_)*\d+` starting at i: end of the run, or i when there is none. */
static size_t digit_run(const char *p, size_t rem, size_t i) {
    if (i >= rem || !is_digit(p[i])) return i;
    size_t j = i;
    for (;;) {
        while (j < rem && is_digit(p[j])) j++;
        if (j + 1 < rem && p[j] == '_' && is_digit(p[j + 1])) { j++; continue; }
        return j;
    }
}

/* Numbers with Jinja's rules: a float needs a fraction or an exponent (and
 * cannot directly follow '.', so x.0.1 indexes twice); integers are 0, [1-9]...
 * or 0x / 0o / 0b forms, all with single '_' separators. "03" is 0 then 3, which
 * the parser rejects, as Jinja does. */
static int lex_number(lexer *L, const char *p, size_t rem) {
    char num[80];
    size_t k = 0, m = 0;
    int is_float = 0, base = 10;
    ct_tokens *o = L->out;
    int after_dot = o->n > 0 && o->v[o->n - 1].t == TK_OP && o->v[o->n - 1].n == 1 && o->v[o->n - 1].p[0] == '.';
    size_t e1 = digit_run(p, rem, 0);
    if (!after_dot) {
        size_t j = e1, jf = 0;
        if (j + 1 < rem && p[j] == '.' && (jf = digit_run(p, rem, j + 1)) > j + 1) j = jf;
        else jf = 0;
        if (j < rem && (p[j] == 'e' || p[j] == 'E')) {
            size_t q = j + 1;
            if (q < rem && (p[q] == '+' || p[q] == '-')) q++;
            size_t e2 = digit_run(p, rem, q);
            if (e2 > q) { k = e2; is_float = 1; }
        }
        if (!is_float && jf) { k = jf; is_float = 1; }
    }
    if (!is_float) {
        if (p[0] == '0' && rem > 2 && strchr("xXoObB", p[1]) && p[1]) {
            base = (p[1] == 'x' || p[1] == 'X') ? 16 : (p[1] == 'o' || p[1] == 'O') ? 8 : 2;
            k = 2;
            for (;;) {
                size_t q = k < rem && p[k] == '_' ? k + 1 : k;
                int d = q < rem ? hexval(p[q]) : -1;
                if (d < 0 || d >= base) break;
                k = q + 1;
            }
            if (k == 2) k = 1;   /* bare "0x": the integer 0, then a name */
        } else if (p[0] == '0') {
            k = 1;
            while (k < rem && (p[k] == '0' || (p[k] == '_' && k + 1 < rem && p[k + 1] == '0'))) k++;
        } else k = e1;
        if (k == 1 && base != 10) base = 10;
    }
    for (size_t i = (base == 10 ? 0 : 2); i < k; i++)
        if (p[i] != '_') {
            if (m >= sizeof num - 1) return lex_fail(L, "numeric literal too long");
            num[m++] = p[i];
        }
    num[m] = 0;
    ct_token *tk = push(L, is_float ? TK_FLOAT : TK_INT, L->line);
    if (!tk) return lex_fail(L, "out of memory");
    if (is_float) tk->fval = strtod(num, NULL);
    else {
        char *end;
        errno = 0;
        unsigned long long v = strtoull(num, &end, base);
        if (errno || v > (unsigned long long)INT64_MAX) return lex_fail(L, "integer literal too large (arbitrary precision is not supported)");
        tk->ival = (int64_t)v;
    }
    tk->p = p;
    tk->n = k;
    L->pos += k;
    return 0;
}

/* Lexes tokens inside a tag up to its end delimiter ("}}" or "%}"); returns
 * the strip sign found before the delimiter ('-', '+' or 0) in *sign. */
static int lex_tag(lexer *L, char endc, int *sign) {
    static const char *ops2[] = {"//", "**", "==", "!=", "<=", ">=", NULL};
    int depth = 0;
    for (;;) {
        size_t sp = skip_space(L, L->pos);
        count_lines(L, L->pos, sp);
        L->pos = sp;
        if (L->pos >= L->n) return lex_fail(L, endc == '}' ? "unexpected end of template, expected '}}'" : "unexpected end of template, expected '%}'");
        const char *p = L->s + L->pos;
        size_t rem = L->n - L->pos;
        /* End delimiters are only recognised outside brackets, like Jinja. */
        if (depth == 0) {
            if (rem >= 2 && p[0] == endc && p[1] == '}') { *sign = 0; L->pos += 2; return 0; }
            if (rem >= 3 && (p[0] == '-' || (p[0] == '+' && endc == '%')) && p[1] == endc && p[2] == '}') {
                *sign = p[0];
                L->pos += 3;
                return 0;
            }
        }
        ct_token *tk;
        if (is_name_start(*p)) {
            size_t k = 1;
            while (k < rem && (is_name_start(p[k]) || is_digit(p[k]))) k++;
            if (!(tk = push(L, TK_NAME, L->line))) return lex_fail(L, "out of memory");
            tk->p = p;
            tk->n = k;
            L->pos += k;
        } else if (is_digit(*p)) {
            if (lex_number(L, p, rem)) return -1;
        } else if (*p == '\'' || *p == '"') {
            if (!(tk = push(L, TK_STRING, L->line))) return lex_fail(L, "out of memory");
            if (lex_string(L, tk)) return -1;
        } else {
            size_t k = 0;
            for (int o = 0; ops2[o]; o++)
                if (rem >= 2 && p[0] == ops2[o][0] && p[1] == ops2[o][1]) k = 2;
            if (!k) {
                if (!strchr("+-*/%~()[]{},.:|=<>;", *p) || *p == 0) {
                    char msg[64];
                    snprintf(msg, sizeof msg, "unexpected character '%c' in tag", *p >= 32 && *p < 127 ? *p : '?');
                    return lex_fail(L, msg);
                }
                k = 1;
                if (*p == '(' || *p == '[' || *p == '{') depth++;
                if ((*p == ')' || *p == ']' || *p == '}') && depth > 0) depth--;
            }
            if (!(tk = push(L, TK_OP, L->line))) return lex_fail(L, "out of memory");
            tk->p = p;
            tk->n = k;
            L->pos += k;
        }
    }
}

/* After a tag: '-' strips all following whitespace; otherwise with trim_blocks
 * (block and comment tags only, not '+') one newline is dropped. */
static int after_tag(lexer *L, int sign, int trim) {
    if (sign == '-') {
        size_t e = skip_space(L, L->pos);
        count_lines(L, L->pos, e);
        int ls = e > L->pos && L->s[e - 1] == '\n';
        L->pos = e;
        return ls;
    }
    if (trim && sign != '+' && L->pos < L->n && L->s[L->pos] == '\n') {
        L->pos++;
        L->line++;
        return 1;
    }
    if (trim && sign != '+' && L->pos + 1 < L->n && L->s[L->pos] == '\r' && L->s[L->pos + 1] == '\n') {
        L->pos += 2;
        L->line++;
        return 1;
    }
    return 0;
}

/* {% raw %} ... {% endraw %}: the body is text, searched for the endraw tag. */
static int lex_raw(lexer *L, int *line_starting) {
    size_t i = L->pos;
    for (;;) {
        const char *f = i < L->n ? memmem(L->s + i, L->n - i, "{%", 2) : NULL;
        if (!f) return lex_fail(L, "missing {% endraw %}");
        size_t j = (size_t)(f - L->s) + 2;
        int lsign = 0;
        if (j < L->n && (L->s[j] == '-' || L->s[j] == '+')) lsign = L->s[j++];
        j = skip_space(L, j);
        if (j + 6 <= L->n && memcmp(L->s + j, "endraw", 6) == 0) {
            size_t e = skip_space(L, j + 6);
            int rsign = 0;
            if (e < L->n && (L->s[e] == '-' || L->s[e] == '+')) rsign = L->s[e++];
            if (e + 1 < L->n && L->s[e] == '%' && L->s[e + 1] == '}') {
                size_t tn = (size_t)(f - L->s) - L->pos;
                if (lsign == '-') tn = rstrip_len(L->s + L->pos, tn);
                if (emit_text(L, L->s + L->pos, tn, L->line)) return -1;
                count_lines(L, L->pos, e + 2);
                L->pos = e + 2;
                *line_starting = after_tag(L, rsign, 1);
                return 0;
            }
        }
        i = (size_t)(f - L->s) + 2;
    }
}

int ct_lex(const char *src, size_t len, ct_arena *ar, ct_tokens *out, qd_err *err) {
    lexer L = {src, len, 0, 1, ar, out, err};
    /* keep_trailing_newline=False */
    if (L.n && L.s[L.n - 1] == '\n') L.n--;
    if (L.n && L.s[L.n - 1] == '\r') L.n--;
    int line_starting = 1;
    while (L.pos < L.n) {
        const char *tag = NULL;
        for (size_t i = L.pos; i + 1 < L.n; i++) {
            if (src[i] == '{' && (src[i + 1] == '{' || src[i + 1] == '%' || src[i + 1] == '#')) {
                tag = src + i;
                break;
            }
        }
        size_t tn = tag ? (size_t)(tag - (src + L.pos)) : L.n - L.pos;
        const char *text = src + L.pos;
        int text_line = L.line;
        if (!tag) {
            if (emit_text(&L, text, tn, text_line)) return -1;
            break;
        }
        char kind = tag[1];
        char sign = (tag + 2 < src + L.n && (tag[2] == '-' || tag[2] == '+')) ? tag[2] : 0;
        size_t keep = tn;
        if (sign == '-') keep = rstrip_len(text, tn);
        else if (sign != '+' && kind != '{') {
            size_t l_pos = tn;
            while (l_pos > 0 && text[l_pos - 1] != '\n') l_pos--;
            if (l_pos > 0 || line_starting) {
                int ws = l_pos < tn;
                for (size_t i = l_pos; i < tn; i++)
                    if (text[i] != ' ' && text[i] != '\t' && text[i] != '\f' && text[i] != '\v' && text[i] != '\r') ws = 0;
                if (ws) keep = l_pos;
            }
        }
        if (emit_text(&L, text, keep, text_line)) return -1;
        count_lines(&L, L.pos, L.pos + tn);
        L.pos += tn + 2 + (sign ? 1 : 0);
        if (kind == '#') {
            size_t i = L.pos;
            const char *e = NULL;
            for (; i + 1 < L.n; i++)
                if (src[i] == '#' && src[i + 1] == '}') { e = src + i; break; }
            if (!e) return lex_fail(&L, "missing end of comment tag '#}'");
            int esign = (e > src + L.pos && (e[-1] == '-' || e[-1] == '+')) ? e[-1] : 0;
            count_lines(&L, L.pos, i + 2);
            L.pos = i + 2;
            line_starting = after_tag(&L, esign, 1);
            continue;
        }
        int tag_line = L.line;
        ct_token *tk = push(&L, kind == '{' ? TK_VAR_BEGIN : TK_BLOCK_BEGIN, tag_line);
        if (!tk) return lex_fail(&L, "out of memory");
        size_t first = out->n;
        int esign = 0;
        if (lex_tag(&L, kind == '{' ? '}' : '%', &esign)) return -1;
        if (!(tk = push(&L, kind == '{' ? TK_VAR_END : TK_BLOCK_END, L.line))) return lex_fail(&L, "out of memory");
        if (kind == '%' && out->n - first == 2 && out->v[first].t == TK_NAME && out->v[first].n == 3 &&
            memcmp(out->v[first].p, "raw", 3) == 0) {
            out->n -= 3;   /* the raw tag itself produces no tokens */
            after_tag(&L, esign, 0);
            if (lex_raw(&L, &line_starting)) return -1;
            continue;
        }
        line_starting = after_tag(&L, esign, kind == '%');
    }
    ct_token *eof = push(&L, TK_EOF, L.line);
    if (!eof) return lex_fail(&L, "out of memory");
    return 0;
}
