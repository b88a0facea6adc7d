/* Decoding ids to text, the streaming detokenizer, and the UTF-8 checks
 * shared with the encoder (invalid-input policy, see tokenizer.h). */
#include <stdlib.h>
#include <string.h>

#include "io/tokenizer_impl.h"

/* Classifies the sequence at s: 1 = valid (*n = its length), 0 = invalid
 * (*n = length of the maximal subpart, the unit Unicode's "substitution of
 * maximal subparts" replaces with one U+FFFD, as Rust and Python do),
 * 2 = a valid but truncated prefix running to the end of s (*n = len). */
static int utf8_check(const unsigned char *s, size_t len, size_t *n) {
    unsigned char b = s[0];
    size_t need;
    unsigned char lo = 0x80, hi = 0xBF;  /* range of the second byte */
    if (b < 0x80) { *n = 1; return 1; }
    if (b < 0xC2 || b > 0xF4) { *n = 1; return 0; }
    if (b < 0xE0) need = 1;
    else if (b < 0xF0) {
        need = 2;
        if (b == 0xE0) lo = 0xA0;        /* no overlongs */
        else if (b == 0xED) hi = 0x9F;   /* no surrogates */
    } else {
        need = 3;
        if (b == 0xF0) lo = 0x90;
        else if (b == 0xF4) hi = 0x8F;   /* <= U+10FFFF */
    }
    for (size_t k = 1; k <= need; k++) {
        if (k >= len) { *n = len; return 2; }
        unsigned char c = s[k];
        if (k == 1 ? (c < lo || c > hi) : (c < 0x80 || c > 0xBF)) { *n = k; return 0; }
    }
    *n = need + 1;
    return 1;
}

size_t tk_utf8_seq(const unsigned char *s, size_t len, size_t *sub) {
    size_t n;
    int r = utf8_check(s, len, &n);
    if (r == 1) return n;
    *sub = n;
    return 0;
}

uint32_t tk_utf8_decode(const unsigned char *s, size_t n) {
    if (n == 0) return 0;
    unsigned char b = s[0];
    if (b < 0x80) return b;
    if (b < 0xE0 && n >= 2) return ((uint32_t)(b & 0x1F) << 6) | (s[1] & 0x3F);
    if (b < 0xF0 && n >= 3) return ((uint32_t)(b & 0x0F) << 12) | ((uint32_t)(s[1] & 0x3F) << 6) | (s[2] & 0x3F);
    if (n >= 4)
        return ((uint32_t)(b & 0x07) << 18) | ((uint32_t)(s[1] & 0x3F) << 12) | ((uint32_t)(s[2] & 0x3F) << 6) |
               (s[3] & 0x3F);
    return 0xFFFD;
}

int qd_utf8_valid(const unsigned char *s, size_t len) {
    size_t i = 0;
    while (i < len) {
        if (s[i] < 0x80) { i++; continue; }
        size_t n;
        if (utf8_check(s + i, len - i, &n) != 1) return 0;
        i += n;
    }
    return 1;
}

/* Appends the lossy form of s to dst (which has room for 3 * len bytes:
 * every input byte yields at most one U+FFFD). Returns bytes written.
 * With hold_tail, a truncated valid prefix at the end is not written but
 * its length is returned in *held. */
static size_t lossy_into(const unsigned char *s, size_t len, unsigned char *dst, int hold_tail, size_t *held) {
    size_t i = 0, o = 0;
    if (held) *held = 0;
    while (i < len) {
        if (s[i] < 0x80) { dst[o++] = s[i++]; continue; }
        size_t n;
        int r = utf8_check(s + i, len - i, &n);
        if (r == 1) {
            memcpy(dst + o, s + i, n);
            o += n;
        } else if (r == 2 && hold_tail) {
            *held = n;
            return o;
        } else {
            dst[o++] = 0xEF; dst[o++] = 0xBF; dst[o++] = 0xBD;  /* U+FFFD */
        }
        i += n;
    }
    return o;
}

char *qd_utf8_lossy(const unsigned char *s, size_t len, size_t *out_len) {
    unsigned char *d = malloc(3 * len + 1);
    if (!d) return NULL;
    size_t o = lossy_into(s, len, d, 0, NULL);
    d[o] = 0;
    if (out_len) *out_len = o;
    return (char *)d;
}

qd_status qd_tokenizer_decode(const qd_tokenizer *tok, const int32_t *ids, size_t n, int skip_special, char **out,
                              size_t *len, qd_err *err) {
    if (!tok || !out || (!ids && n)) return qd_seterr(err, QD_ERR_INVALID_ARG, "qd_tokenizer_decode: NULL argument");
    *out = NULL;
    if (len) *len = 0;
    size_t total = 0;
    for (size_t i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= tok->n_ids)
            return qd_seterr(err, QD_ERR_INVALID_ARG, "qd_tokenizer_decode: id %d at position %zu is outside [0, %d)",
                             ids[i], i, tok->n_ids);
        if (skip_special && (tok->flags[ids[i]] & TK_FLAG_SPECIAL)) continue;
        total += tok->byte_len[ids[i]];
    }
    unsigned char *raw = malloc(total + 1);
    if (!raw) return qd_seterr(err, QD_ERR_OOM, "out of memory decoding %zu ids", n);
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        if (skip_special && (tok->flags[ids[i]] & TK_FLAG_SPECIAL)) continue;
        memcpy(raw + o, tok->byte_pool + tok->byte_off[ids[i]], tok->byte_len[ids[i]]);
        o += tok->byte_len[ids[i]];
    }
    /* HF ends decoding in String::from_utf8_lossy; valid output (the usual
     * case) is returned as is. */
    if (qd_utf8_valid(raw, o)) {
        raw[o] = 0;
        *out = (char *)raw;
        if (len) *len = o;
        return QD_OK;
    }
    size_t l;
    char *fixed = qd_utf8_lossy(raw, o, &l);
    free(raw);
    if (!fixed) return qd_seterr(err, QD_ERR_OOM, "out of memory decoding %zu ids", n);
    *out = fixed;
    if (len) *len = l;
    return QD_OK;
}

/* ------------------------------------------------------------ streaming */

void qd_detok_init(qd_detok *d, const qd_tokenizer *tok, int skip_special) {
    memset(d, 0, sizeof *d);
    d->tok = tok;
    d->skip_special = skip_special;
}

void qd_detok_free(qd_detok *d) {
    free(d->out);
    d->out = NULL;
    d->out_cap = 0;
    d->n_pend = 0;
}

static qd_status detok_reserve(qd_detok *d, size_t n, qd_err *err) {
    if (n <= d->out_cap) return QD_OK;
    size_t cap = n < 64 ? 64 : n * 2;
    char *p = realloc(d->out, cap);
    if (!p) return qd_seterr(err, QD_ERR_OOM, "out of memory in the streaming detokenizer");
    d->out = p;
    d->out_cap = cap;
    return QD_OK;
}

qd_status qd_detok_push(qd_detok *d, int32_t id, const char **text, size_t *len, qd_err *err) {
    if (!d || !d->tok || !text || !len) return qd_seterr(err, QD_ERR_INVALID_ARG, "qd_detok_push: NULL argument");
    const qd_tokenizer *tok = d->tok;
    *text = "";
    *len = 0;
    if (id < 0 || id >= tok->n_ids)
        return qd_seterr(err, QD_ERR_INVALID_ARG, "qd_detok_push: id %d is outside [0, %d)", id, tok->n_ids);
    if (d->skip_special && (tok->flags[id] & TK_FLAG_SPECIAL)) return QD_OK;
    size_t bl = tok->byte_len[id];
    size_t n = d->n_pend + bl;
    /* Work area: the held bytes then the token's bytes; output after it. */
    QD_TRY(detok_reserve(d, n + 3 * n + 1, err));
    unsigned char *work = (unsigned char *)d->out + 3 * n + 1;
    memcpy(work, d->pend, d->n_pend);
    memcpy(work + d->n_pend, tok->byte_pool + tok->byte_off[id], bl);
    size_t held;
    size_t o = lossy_into(work, n, (unsigned char *)d->out, 1, &held);
    /* A held tail is a valid prefix of at most 3 bytes (a 4th byte would
     * complete or break it). */
    memcpy(d->pend, work + n - held, held);
    d->n_pend = held;
    d->out[o] = 0;
    *text = d->out;
    *len = o;
    return QD_OK;
}

qd_status qd_detok_flush(qd_detok *d, const char **text, size_t *len, qd_err *err) {
    if (!d || !text || !len) return qd_seterr(err, QD_ERR_INVALID_ARG, "qd_detok_flush: NULL argument");
    *text = "";
    *len = 0;
    if (d->n_pend == 0) return QD_OK;
    QD_TRY(detok_reserve(d, 4, err));
    /* Whatever is held is a truncated sequence: one maximal subpart. */
    memcpy(d->out, "\xEF\xBF\xBD", 4);
    d->n_pend = 0;
    *text = d->out;
    *len = 3;
    return QD_OK;
}
