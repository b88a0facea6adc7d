/* Token trie and masks (token_trie.h). */
#include "runtime/grammar/token_trie.h"

#include <stdlib.h>
#include <string.h>

#include "runtime/grammar/token_class.h"

typedef struct tok_ref {
    const unsigned char *b;
    int len, id;
} tok_ref;

static int cmp_tok(const void *x, const void *y) {
    const tok_ref *a = x, *b = y;
    int n = a->len < b->len ? a->len : b->len;
    int c = memcmp(a->b, b->b, (size_t)n);
    if (c) return c;
    if (a->len != b->len) return a->len - b->len;
    return a->id - b->id;
}

void qd_token_trie_free(qd_token_trie *t) {
    if (!t) return;
    free(t->byte);
    free(t->depth);
    free(t->end);
    free(t->tok_first);
    free(t->tok_next);
    free(t->blob);
    free(t->tok_off);
    free(t->tok_len);
    free(t->sub_plain);
    free(t->sub_cats);
    free(t->nodes);
    free(t->rank_begin);
    free(t->sorted_ids);
    qd_token_classes_free(t->classes);
    free(t);
}

qd_status qd_token_trie_build_bytes(const unsigned char *const *tokens, const int *lens, int vocab_size,
                                    qd_token_trie **out, qd_err *err) {
    QD_TRY(qd_token_trie_build_bare(tokens, lens, vocab_size, out, err));
    qd_status st = qd_token_classes_build(*out, &(*out)->classes, err);
    if (st != QD_OK) {
        qd_token_trie_free(*out);
        *out = NULL;
    }
    return st;
}

qd_status qd_token_trie_build_bare(const unsigned char *const *tokens, const int *lens, int vocab_size,
                                   qd_token_trie **out, qd_err *err) {
    *out = NULL;
    if (vocab_size <= 0) return qd_seterr(err, QD_ERR_INVALID_ARG, "token trie: vocab_size %d", vocab_size);
    tok_ref *refs = malloc(sizeof *refs * (size_t)vocab_size);
    qd_token_trie *t = calloc(1, sizeof *t);
    size_t total = 1;
    int n = 0;
    if (!refs || !t) goto oom;
    for (int i = 0; i < vocab_size; i++)
        if (lens[i] > 0) {
            refs[n++] = (tok_ref){tokens[i], lens[i], i};
            total += (size_t)lens[i];
        }
    t->blob = malloc(total);
    t->tok_off = calloc((size_t)vocab_size, sizeof(size_t));
    t->tok_len = malloc(sizeof(int) * (size_t)vocab_size);
    if (!t->blob || !t->tok_off || !t->tok_len) goto oom;
    for (int i = 0, off = 0; i < vocab_size; i++) {
        t->tok_len[i] = lens[i] > 0 ? lens[i] : -1;
        if (lens[i] > 0) {
            memcpy(t->blob + off, tokens[i], (size_t)lens[i]);
            t->tok_off[i] = (size_t)off;
            off += lens[i];
        }
    }
    qsort(refs, (size_t)n, sizeof *refs, cmp_tok);
    /* at most one node per token byte, plus the root */
    t->vocab_size = vocab_size;
    t->byte = malloc(total);
    t->depth = malloc(sizeof(int) * total);
    t->end = malloc(sizeof(int) * total);
    t->tok_first = malloc(sizeof(int) * total);
    t->tok_next = malloc(sizeof(int) * (size_t)vocab_size);
    int *path = malloc(sizeof(int) * total); /* node at each depth along the current token */
    if (!t->byte || !t->depth || !t->end || !t->tok_first || !t->tok_next || !path) {
        free(path);
        goto oom;
    }
    for (int i = 0; i < vocab_size; i++) t->tok_next[i] = -1;
    t->byte[0] = 0;
    t->depth[0] = 0;
    t->tok_first[0] = -1;
    path[0] = 0;
    int nn = 1, prev_len = 0;
    const unsigned char *prev = NULL;
    for (int k = 0; k < n; k++) {
        const tok_ref *r = &refs[k];
        int common = 0;
        if (prev)
            while (common < prev_len && common < r->len && prev[common] == r->b[common]) common++;
        /* close the subtrees of the previous token below the shared prefix */
        for (int d = prev_len; d > common; d--) t->end[path[d]] = nn;
        for (int d = common + 1; d <= r->len; d++) {
            t->byte[nn] = r->b[d - 1];
            t->depth[nn] = d;
            t->tok_first[nn] = -1;
            path[d] = nn++;
        }
        int node = path[r->len];
        /* same bytes as an earlier token: chain it (ids ascend thanks to the sort) */
        if (t->tok_first[node] < 0) t->tok_first[node] = r->id;
        else {
            int x = t->tok_first[node];
            while (t->tok_next[x] >= 0) x = t->tok_next[x];
            t->tok_next[x] = r->id;
        }
        if (r->len > t->max_depth) t->max_depth = r->len;
        prev = r->b;
        prev_len = r->len;
    }
    for (int d = prev_len; d >= 1; d--) t->end[path[d]] = nn;
    t->end[0] = nn;
    t->n_nodes = nn;
    free(path);
    t->sub_plain = malloc((size_t)nn);
    t->sub_cats = malloc(sizeof(uint16_t) * (size_t)nn);
    t->rank_begin = malloc(sizeof(int) * ((size_t)nn + 1));
    t->sorted_ids = malloc(sizeof(int) * ((size_t)n + 1));
    if (!t->sub_plain || !t->sub_cats || !t->rank_begin || !t->sorted_ids) goto oom;
    int rank = 0;
    for (int i = 0; i < nn; i++) {
        t->rank_begin[i] = rank;
        for (int id = t->tok_first[i]; id >= 0; id = t->tok_next[id]) t->sorted_ids[rank++] = id;
    }
    t->rank_begin[nn] = rank;
    /* bottom-up over preorder: a node's subtree follows it */
    for (int i = nn - 1; i >= 0; i--) {
        int plain = i == 0 || qd_json_plain_byte(t->byte[i]);
        for (int c = i + 1; c < t->end[i] && plain; c = t->end[c]) plain = t->sub_plain[c];
        t->sub_plain[i] = (uint8_t)plain;
        uint16_t cats = i == 0 ? 0 : (uint16_t)(1u << qd_byte_cat(t->byte[i]));
        for (int c = i + 1; c < t->end[i]; c = t->end[c]) cats |= t->sub_cats[c];
        t->sub_cats[i] = cats;
    }
    if (t->max_depth > UINT16_MAX) {
        free(refs);
        qd_token_trie_free(t);
        return qd_seterr(err, QD_ERR_INVALID_ARG, "token trie: a token of %d bytes (at most %d)", t->max_depth, UINT16_MAX);
    }
    t->nodes = calloc((size_t)nn + 1, sizeof *t->nodes);
    if (!t->nodes) goto oom;
    for (int i = 0; i < nn; i++)
        t->nodes[i] = (qd_trie_node){.end = t->end[i], .rank = t->rank_begin[i], .sub_cats = t->sub_cats[i],
                                     .depth = (uint16_t)t->depth[i], .byte = t->byte[i]};
    t->nodes[nn].rank = t->rank_begin[nn];
    free(refs);
    *out = t;
    return QD_OK;
oom:
    free(refs);
    qd_token_trie_free(t);
    return qd_seterr(err, QD_ERR_OOM, "out of memory building the token trie of %d tokens", vocab_size);
}

qd_status qd_token_trie_build(const qd_tokenizer *tok, qd_token_trie **out, qd_err *err) {
    int v = qd_tokenizer_vocab_size(tok);
    const unsigned char **bytes = malloc(sizeof *bytes * (size_t)(v > 0 ? v : 1));
    int *lens = malloc(sizeof(int) * (size_t)(v > 0 ? v : 1));
    if (!bytes || !lens) {
        free(bytes);
        free(lens);
        return qd_seterr(err, QD_ERR_OOM, "out of memory for the token trie");
    }
    for (int i = 0; i < v; i++) {
        size_t len = 0;
        bytes[i] = NULL;
        lens[i] = -1;
        if (qd_tokenizer_is_special(tok, i)) continue;
        const unsigned char *b = qd_tokenizer_token_bytes(tok, i, &len);
        if (b && len > 0 && len < (1u << 20)) {
            bytes[i] = b;
            lens[i] = (int)len;
        }
    }
    qd_status st = qd_token_trie_build_bytes(bytes, lens, v, out, err);
    free(bytes);
    free(lens);
    return st;
}

void qd_trie_walk_free(qd_trie_walk *w) {
    for (int i = 0; i < w->n_states; i++) qd_mstate_free(&w->states[i]);
    free(w->states);
    free(w->at);
    free(w->at_id);
    w->at_id = NULL;
    w->n_at_id = 0;
    w->at = NULL;
    w->states = NULL;
    w->n_states = 0;
}

static int walk_reserve(qd_trie_walk *w, int n) {
    if (w->n_states >= n) return 0;
    qd_mstate *s = realloc(w->states, sizeof *s * (size_t)n);
    if (!s) return -1;
    for (int i = w->n_states; i < n; i++) qd_mstate_init(&s[i]);
    w->states = s;
    const qd_mstate **at = realloc(w->at, sizeof *at * (size_t)n);
    if (!at) return -1;
    w->at = at;
    w->n_states = n;
    return 0;
}

/* 1 when st advanced by any plain byte is st again (a string's content loop). */
static int loops_on_plain(const qd_grammar *g, const qd_mstate *st, qd_mstate *tmp) {
    if (st->complete || st->n == 0) return 0;
    for (int b = 0x20; b <= 0x7e; b++) {
        if (!qd_json_plain_byte((unsigned char)b)) continue;
        if (!qd_match_byte(g, st, (unsigned char)b, tmp) || !qd_mstate_equal(tmp, st)) return 0;
    }
    return 1;
}

static void allow(uint32_t *mask, int id) { mask[id >> 5] |= 1u << (id & 31); }

int qd_token_trie_mask(const qd_token_trie *t, const qd_grammar *g, const qd_mstate *st, qd_trie_walk *w,
                       int budget, uint32_t *mask, int *max_dist_out) {
    memset(mask, 0, sizeof(uint32_t) * (((size_t)t->vocab_size + 31) / 32));
    int max_dist = 0;
    if (walk_reserve(w, t->max_depth + 1) || qd_mstate_copy(&w->states[0], st)) return -1;
    const qd_mstate *start = &w->states[0];
    w->at[0] = start;
    const int loop = t->max_depth >= 1 && loops_on_plain(g, start, &w->states[1]);
    const int want_dist = budget >= 0 || max_dist_out != NULL;
    const int start_dist = loop && want_dist ? qd_match_dist(g, start) : 0;
    const int start_ok = budget < 0 || start_dist <= budget;
    uint8_t first[32];
    qd_match_next_bytes(g, st, first);
    int i = 1;
    while (i < t->n_nodes) {
        int d = t->depth[i];
        const qd_mstate *from = w->at[d - 1];
        unsigned char b = t->byte[i];
        if (loop && from == start && qd_json_plain_byte(b)) {
            if (t->sub_plain[i]) {
                /* every token below stays in the loop: all allowed (or none, by budget) */
                if (start_ok) {
                    for (int r = t->rank_begin[i]; r < t->rank_begin[t->end[i]]; r++) allow(mask, t->sorted_ids[r]);
                    if (start_dist > max_dist) max_dist = start_dist;
                }
                i = t->end[i];
                continue;
            }
            w->at[d] = start;
        } else {
            /* the root's children are most of the skips: test them against the union of
             * next bytes before advancing anything */
            if ((d == 1 && !((first[b >> 3] >> (b & 7)) & 1)) || from->n == 0 ||
                !qd_match_byte(g, from, b, &w->states[d])) {
                if (w->states[d].oom) return -1;
                i = t->end[i];
                continue;
            }
            w->at[d] = &w->states[d];
        }
        if (t->tok_first[i] >= 0) {
            int ok = 1;
            if (want_dist) {
                int dist = w->at[d] == start ? start_dist : qd_match_dist(g, w->at[d]);
                if (budget >= 0 && dist > budget) ok = 0;
                else if (dist > max_dist) max_dist = dist;
            }
            if (ok)
                for (int id = t->tok_first[i]; id >= 0; id = t->tok_next[id]) allow(mask, id);
        }
        i++;
    }
    if (max_dist_out) *max_dist_out = max_dist;
    return 0;
}
