/* String tokens by character count, and masks through them (token_class.h). */
#include "runtime/grammar/token_class.h"

#include <stdlib.h>
#include <string.h>

#include "runtime/grammar/state_dfa.h"
#include "runtime/grammar/token_trie.h"

/* The bytes of the string character at b[i..n): 1..4, or 0 when none starts there. */
static int string_char_len(const unsigned char *b, int i, int n) {
    const unsigned char x = b[i];
    if (qd_json_plain_byte(x)) return 1;
    /* the second byte's range depends on the lead (no overlongs, no surrogates) */
    int len;
    unsigned lo = 0x80, hi = 0xbf;
    if (x >= 0xc2 && x <= 0xdf) len = 2;
    else if (x == 0xe0) len = 3, lo = 0xa0;
    else if (x == 0xed) len = 3, hi = 0x9f;
    else if (x >= 0xe1 && x <= 0xef) len = 3;
    else if (x == 0xf0) len = 4, lo = 0x90;
    else if (x >= 0xf1 && x <= 0xf3) len = 4;
    else if (x == 0xf4) len = 4, hi = 0x8f;
    else return 0;
    if (i + len > n || b[i + 1] < lo || b[i + 1] > hi) return 0;
    for (int k = 2; k < len; k++)
        if (b[i + k] < 0x80 || b[i + k] > 0xbf) return 0;
    return len;
}

static int is_alnum(unsigned char x) { return (x >= '0' && x <= '9') || (x >= 'A' && x <= 'Z') || (x >= 'a' && x <= 'z'); }
static int is_atom(unsigned char x) { return is_alnum(x) || x == '_' || x == '%' || x == '+' || x == '-'; }

int qd_token_string_chars(const unsigned char *b, int n) {
    int i = 0, chars = 0;
    while (i < n) {
        const int len = string_char_len(b, i, n);
        if (!len) return -1;
        i += len;
        chars++;
    }
    return chars;
}

/* The bytes of the longest prefix of b[0..n) made of at most QD_TC_MAX_CHARS of level
 * l's characters; *chars gets their count. */
static int class_prefix(int l, const unsigned char *b, int n, int *chars) {
    int i = 0, c = 0;
    while (i < n && c < QD_TC_MAX_CHARS) {
        const int len = l == QD_TC_STRING ? string_char_len(b, i, n) : l == QD_TC_ATOM ? is_atom(b[i]) : is_alnum(b[i]);
        if (!len) break;
        i += len;
        c++;
    }
    *chars = c;
    return i;
}

int qd_token_alnum_chars(const unsigned char *b, int n) {
    for (int i = 0; i < n; i++)
        if (!is_alnum(b[i])) return -1;
    return n;
}

int qd_token_atom_chars(const unsigned char *b, int n) {
    for (int i = 0; i < n; i++)
        if (!is_atom(b[i])) return -1;
    return n;
}

void qd_token_classes_free(qd_token_classes *c) {
    if (!c) return;
    for (int l = 0; l < QD_TC_LEVELS; l++) {
        free(c->level[l].upto);
        qd_token_trie_free(c->level[l].rest);
    }
    free(c);
}

/* Level l of c: its bitmaps and the trie of the other tokens, each as the count k of
 * the level's characters it starts with (a byte, k <= QD_TC_MAX_CHARS) followed by
 * its remaining bytes. */
static qd_status build_level(const qd_token_trie *t, qd_token_classes *c, int l, const unsigned char **bytes,
                             int *lens, qd_err *err) {
    qd_token_level *lv = &c->level[l];
    const int V = t->vocab_size;
    lv->upto = calloc((QD_TC_MAX_CHARS + 1) * c->n_words, sizeof(uint32_t));
    size_t total = 0;
    for (int i = 0; i < V; i++) total += t->tok_len[i] > 0 ? (size_t)t->tok_len[i] + 1 : 0;
    unsigned char *blob = malloc(total ? total : 1);
    const unsigned char **rest = malloc(sizeof *rest * (size_t)V);
    if (!lv->upto || !blob || !rest) {
        free(blob);
        free(rest);
        return qd_seterr(err, QD_ERR_OOM, "out of memory for the token class table");
    }
    size_t off = 0;
    for (int i = 0; i < V; i++) {
        lens[i] = -1;
        rest[i] = blob;
        if (t->tok_len[i] <= 0) continue; /* an empty token is never allowed (token_trie.h) */
        const int n = l == QD_TC_STRING ? qd_token_string_chars(bytes[i], t->tok_len[i])
                      : l == QD_TC_ATOM ? qd_token_atom_chars(bytes[i], t->tok_len[i])
                                        : qd_token_alnum_chars(bytes[i], t->tok_len[i]);
        if (n >= 1 && n <= QD_TC_MAX_CHARS) {
            lv->count[n]++;
            lv->upto[(size_t)n * c->n_words + (size_t)(i >> 5)] |= 1u << (i & 31);
            continue;
        }
        int k;
        const int used = class_prefix(l, bytes[i], t->tok_len[i], &k);
        blob[off] = (unsigned char)k;
        memcpy(blob + off + 1, bytes[i] + used, (size_t)(t->tok_len[i] - used));
        rest[i] = blob + off;
        lens[i] = t->tok_len[i] - used + 1;
        off += (size_t)lens[i];
    }
    /* exactly n characters -> 1..n */
    for (int n = 1; n <= QD_TC_MAX_CHARS; n++)
        for (size_t k = 0; k < c->n_words; k++)
            lv->upto[(size_t)n * c->n_words + k] |= lv->upto[(size_t)(n - 1) * c->n_words + k];
    const qd_status st = qd_token_trie_build_bare(rest, lens, V, &lv->rest, err);
    free(blob);
    free(rest);
    return st;
}

qd_status qd_token_classes_build(const qd_token_trie *t, qd_token_classes **out, qd_err *err) {
    *out = NULL;
    const int V = t->vocab_size;
    qd_token_classes *c = calloc(1, sizeof *c);
    const unsigned char **bytes = malloc(sizeof *bytes * (size_t)V);
    int *lens = malloc(sizeof(int) * (size_t)V);
    qd_status st = QD_OK;
    if (!c || !bytes || !lens) st = qd_seterr(err, QD_ERR_OOM, "out of memory for the token class table of %d tokens", V);
    if (st == QD_OK) {
        c->n_words = ((size_t)V + 31) / 32;
        for (int i = 0; i < V; i++) bytes[i] = t->blob + t->tok_off[i];
        for (int l = 0; l < QD_TC_LEVELS && st == QD_OK; l++) st = build_level(t, c, l, bytes, lens, err);
    }
    free(bytes);
    free(lens);
    if (st != QD_OK) {
        qd_token_classes_free(c);
        return st;
    }
    *out = c;
    return QD_OK;
}

/* mask |= the level's tokens of lo..hi characters. */
static void add_run(const qd_token_classes *c, const qd_token_level *lv, int lo, int hi, uint32_t *mask) {
    const uint32_t *a = lv->upto + (size_t)hi * c->n_words, *b = lv->upto + (size_t)(lo - 1) * c->n_words;
    for (size_t k = 0; k < c->n_words; k++) mask[k] |= a[k] & ~b[k];
}

/* The mask through level l: 0, 1 (the automaton filled up), -1 (memory), or 2 when
 * the level's characters do not all lead from start to one state. */
static int level_mask(const qd_token_classes *c, int l, qd_state_dfa *d, int start, qd_trie_walk *w, int budget,
                      uint32_t *mask, int *max_dist_out) {
    const qd_token_level *lv = &c->level[l];
    /* at[n]: the state n characters on (QD_DFA_DEAD once they die) */
    int at[QD_TC_MAX_CHARS + 1];
    at[0] = start;
    for (int n = 1; n <= QD_TC_MAX_CHARS; n++) {
        if (at[n - 1] == QD_DFA_DEAD) {
            at[n] = QD_DFA_DEAD;
            continue;
        }
        const int x = l == QD_TC_STRING ? qd_state_dfa_char_step(d, at[n - 1])
                      : l == QD_TC_ATOM ? qd_state_dfa_atom_step(d, at[n - 1])
                                        : qd_state_dfa_alnum_step(d, at[n - 1]);
        if (x == QD_DFA_FULL) return 1;
        if (x == QD_DFA_MIXED) return 2;
        at[n] = x;
    }
    const int want_dist = budget >= 0 || max_dist_out != NULL;
    int max_dist = 0;
    memset(mask, 0, sizeof(uint32_t) * c->n_words);
    /* runs of allowed character counts, each one pass over the bitmaps */
    for (int n = 1; n <= QD_TC_MAX_CHARS;) {
        int hi = n - 1;
        while (hi < QD_TC_MAX_CHARS && at[hi + 1] != QD_DFA_DEAD) {
            if (want_dist) {
                const int dist = qd_state_dfa_dist(d, at[hi + 1]);
                if (budget >= 0 && dist > budget) break;
                if (lv->count[hi + 1] && dist > max_dist) max_dist = dist;
            }
            hi++;
        }
        if (hi >= n) add_run(c, lv, n, hi, mask);
        n = hi + 2; /* hi + 1 is refused */
    }
    int rest_dist = 0;
    const int r = qd_token_trie_mask_dfa_rooted(lv->rest, d, at, QD_TC_MAX_CHARS + 1, w, budget, mask, &rest_dist);
    if (r) return r;
    if (rest_dist > max_dist) max_dist = rest_dist;
    if (max_dist_out) *max_dist_out = max_dist;
    return 0;
}

int qd_token_trie_mask_fast(const qd_token_trie *t, qd_state_dfa *d, int start, qd_trie_walk *w, int budget,
                            uint32_t *mask, int *max_dist_out) {
    const qd_token_classes *c = t->classes;
    for (int l = 0; c && l < QD_TC_LEVELS; l++) {
        const int r = level_mask(c, l, d, start, w, budget, mask, max_dist_out);
        if (r != 2) return r;
    }
    return qd_token_trie_mask_dfa(t, d, start, w, budget, mask, max_dist_out);
}
