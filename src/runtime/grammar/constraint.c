/* A request's grammar constraint (constraint.h). */
#include "runtime/grammar/constraint.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/grammar/mask_share.h"
#include "runtime/grammar/matcher.h"
#include "runtime/grammar/state_dfa.h"
#include "runtime/grammar/token_class.h"

#define CACHE_ENTRIES 8
/* States of a constraint's automaton (state_dfa.h, 1 KiB of transitions each, grown
 * as needed): far more than the states one JSON value's masks visit; when a grammar
 * reaches more (long bounded strings), the automaton starts over. */
#define DFA_MAX_STATES 4096
/* Masks shared by a constraint and its clones (mask_share.h): a few times the states
 * one value's masks revisit, 31 KiB each on a 248k vocabulary. */
#define SHARE_ENTRIES 64

typedef struct mask_entry {
    int valid;
    uint64_t hash;
    qd_mstate state;
    uint32_t *mask;
    int max_dist;   /* the longest completion among the allowed tokens */
} mask_entry;

struct qd_constraint {
    const qd_token_trie *trie;
    qd_grammar *g;
    int32_t *eos;
    int n_eos;
    int32_t start_after;
    int active;
    qd_mstate cur, next;
    qd_trie_walk walk;
    qd_state_dfa dfa;
    long dfa_fallbacks;  /* walks the automaton could not finish (it filled up) */
    size_t n_words;
    uint32_t *scratch;  /* [n_words] */
    mask_entry cache[CACHE_ENTRIES];
    int cache_next;
    qd_mask_share *share;  /* with the clones of this constraint (or of the one it is a clone of) */
    long walks, hits, shared_hits;
};

qd_status qd_constraint_create(const qd_constraint_params *p, qd_constraint **out, qd_err *err) {
    *out = NULL;
    if (!p->grammar || !p->grammar->finished || !p->trie) {
        qd_grammar_free(p->grammar);
        return qd_seterr(err, QD_ERR_INVALID_ARG, "constraint: a finished grammar and a token trie are needed");
    }
    qd_constraint *c = calloc(1, sizeof *c);
    if (!c) {
        qd_grammar_free(p->grammar);
        return qd_seterr(err, QD_ERR_OOM, "out of memory for a constraint");
    }
    c->trie = p->trie;
    c->g = p->grammar;
    c->n_words = ((size_t)p->trie->vocab_size + 31) / 32;
    c->share = qd_mask_share_new(c->n_words, SHARE_ENTRIES);
    qd_state_dfa_init(&c->dfa, c->g, DFA_MAX_STATES);
    c->start_after = p->start_after;
    c->active = p->start_after < 0;
    c->scratch = malloc(sizeof(uint32_t) * c->n_words);
    c->eos = malloc(sizeof(int32_t) * (size_t)(p->n_eos > 0 ? p->n_eos : 1));
    if (!c->scratch || !c->eos || !c->share) {
        qd_constraint_free(c);
        return qd_seterr(err, QD_ERR_OOM, "out of memory for a constraint");
    }
    for (int i = 0; i < p->n_eos; i++)
        if (p->eos[i] >= 0 && p->eos[i] < p->trie->vocab_size) c->eos[c->n_eos++] = p->eos[i];
    qd_mstate_init(&c->cur);
    qd_mstate_init(&c->next);
    qd_match_start(c->g, &c->cur);
    if (c->cur.oom) {
        qd_constraint_free(c);
        return qd_seterr(err, QD_ERR_OOM, "out of memory starting a grammar");
    }
    *out = c;
    return QD_OK;
}

qd_status qd_constraint_clone(const qd_constraint *src, qd_constraint **out, qd_err *err) {
    *out = NULL;
    qd_constraint_params p = {
        .trie = src->trie,
        .grammar = qd_grammar_ref(src->g),
        .eos = src->eos,
        .n_eos = src->n_eos,
        .start_after = src->start_after,
    };
    qd_constraint *c;
    QD_TRY(qd_constraint_create(&p, &c, err));
    c->active = src->active;
    /* the clone's masks are its source's (same grammar, same trie): one share */
    qd_mask_share_free(c->share);
    c->share = qd_mask_share_ref(src->share);
    if (qd_mstate_copy(&c->cur, &src->cur)) {
        qd_constraint_free(c);
        return qd_seterr(err, QD_ERR_OOM, "out of memory cloning a constraint");
    }
    *out = c;
    return QD_OK;
}

void qd_constraint_free(qd_constraint *c) {
    if (!c) return;
    for (int i = 0; i < CACHE_ENTRIES; i++) {
        qd_mstate_free(&c->cache[i].state);
        free(c->cache[i].mask);
    }
    qd_trie_walk_free(&c->walk);
    qd_state_dfa_free(&c->dfa);
    qd_mstate_free(&c->cur);
    qd_mstate_free(&c->next);
    qd_grammar_free(c->g);
    qd_mask_share_free(c->share);
    free(c->scratch);
    free(c->eos);
    free(c);
}

int qd_constraint_active(const qd_constraint *c) { return c->active; }
int qd_constraint_complete(const qd_constraint *c) { return c->active && c->cur.complete; }

void qd_constraint_counts(const qd_constraint *c, long *walks, long *hits) {
    if (walks) *walks = c->walks;
    if (hits) *hits = c->hits;
}

long qd_constraint_dfa_fallbacks(const qd_constraint *c) { return c->dfa_fallbacks; }

long qd_constraint_shared_hits(const qd_constraint *c) { return c->shared_hits; }

static void allow_eos(const qd_constraint *c, uint32_t *mask) {
    if (!c->cur.complete) return;
    for (int i = 0; i < c->n_eos; i++) mask[c->eos[i] >> 5] |= 1u << (c->eos[i] & 31);
}

/* The mask of the current state (token_trie.h: budget, max_dist) by a walk over the
 * automaton, or by the matcher's walk when the automaton fills up (it then starts over
 * for the next mask). 0, or -1 when memory ran out. */
static int walk_mask(qd_constraint *c, int budget, uint32_t *mask, int *max_dist) {
    int start = qd_state_dfa_intern(&c->dfa, &c->cur);
    if (start == QD_DFA_FULL) {
        qd_state_dfa_reset(&c->dfa);
        start = qd_state_dfa_intern(&c->dfa, &c->cur);
    }
    if (start >= 0) {
        int r = qd_token_trie_mask_fast(c->trie, &c->dfa, start, &c->walk, budget, mask, max_dist);
        if (r <= 0) return r;
        qd_state_dfa_reset(&c->dfa);
    }
    c->dfa_fallbacks++;
    return qd_token_trie_mask(c->trie, c->g, &c->cur, &c->walk, budget, mask, max_dist);
}

/* The unrestricted mask of the current state, from the cache or a walk. */
static const mask_entry *cached_mask(qd_constraint *c, qd_err *err) {
    uint64_t h = qd_mstate_hash(&c->cur);
    for (int i = 0; i < CACHE_ENTRIES; i++) {
        mask_entry *e = &c->cache[i];
        if (e->valid && e->hash == h && qd_mstate_equal(&e->state, &c->cur)) {
            c->hits++;
            return e;
        }
    }
    mask_entry *e = &c->cache[c->cache_next];
    c->cache_next = (c->cache_next + 1) % CACHE_ENTRIES;
    e->valid = 0;
    if (!e->mask && !(e->mask = malloc(sizeof(uint32_t) * c->n_words))) goto oom;
    const int shared = qd_mask_share_shared(c->share);
    if (shared && qd_mask_share_get(c->share, &c->cur, h, e->mask, &e->max_dist)) c->shared_hits++;
    else {
        if (walk_mask(c, -1, e->mask, &e->max_dist)) goto oom;
        c->walks++;
        /* memory running out here costs the other constraints a walk, nothing else */
        if (shared) (void)qd_mask_share_put(c->share, &c->cur, h, e->mask, e->max_dist);
    }
    if (qd_mstate_copy(&e->state, &c->cur)) goto oom;
    e->hash = h;
    e->valid = 1;
    return e;
oom:
    qd_seterr(err, QD_ERR_OOM, "out of memory computing a token mask");
    return NULL;
}

qd_status qd_constraint_fill_mask(qd_constraint *c, int remaining, uint32_t *mask, qd_err *err) {
    if (!c->active) {
        /* reasoning: anything but EOS (the answer must follow), and </think> alone
         * once only the shortest answer still fits */
        const int32_t t = c->start_after;
        if (remaining >= 0 && remaining <= qd_match_dist(c->g, &c->cur) + 2 && t < c->trie->vocab_size) {
            memset(mask, 0, sizeof(uint32_t) * c->n_words);
            mask[t >> 5] |= 1u << (t & 31);
            return QD_OK;
        }
        memset(mask, 0xff, sizeof(uint32_t) * c->n_words);
        for (int i = 0; i < c->n_eos; i++) mask[c->eos[i] >> 5] &= ~(1u << (c->eos[i] & 31));
        return QD_OK;
    }
    const mask_entry *e = cached_mask(c, err);
    if (!e) return err ? err->status : QD_ERR_OOM;
    /* after this token: remaining - 1 tokens, the last of them EOS */
    int budget = remaining - 2;
    if (remaining < 0 || e->max_dist <= budget) {
        memcpy(mask, e->mask, sizeof(uint32_t) * c->n_words);
        allow_eos(c, mask);
        return QD_OK;
    }
    c->walks++;
    int any = 0;
    if (budget >= 0) {
        if (walk_mask(c, budget, mask, NULL))
            return qd_seterr(err, QD_ERR_OOM, "out of memory computing a token mask");
        for (size_t i = 0; i < c->n_words && !any; i++) any = mask[i] != 0;
    }
    if (!any) {
        /* nothing closes in time: EOS if complete, else the full mask (ends by length) */
        if (c->cur.complete) memset(mask, 0, sizeof(uint32_t) * c->n_words);
        else memcpy(mask, e->mask, sizeof(uint32_t) * c->n_words);
    }
    allow_eos(c, mask);
    return QD_OK;
}

qd_status qd_constraint_mask_logits(qd_constraint *c, float *logits, int n_logits, int remaining, qd_err *err) {
    QD_TRY(qd_constraint_fill_mask(c, remaining, c->scratch, err));
    const int v = c->trie->vocab_size < n_logits ? c->trie->vocab_size : n_logits;
    /* a word at a time: inside a string most words are all allowed (skipped), elsewhere
     * most are all refused (32 stores the compiler turns into a few vector stores);
     * a mixed word is a select per lane (vectorised too: a loop over the refused bits
     * cost more when about half of a word is refused, as in e-mail states) */
    const int full = v / 32;
    for (int w = 0; w < full; w++) {
        const uint32_t m = c->scratch[w];
        if (m == 0xffffffffu) continue;
        float *row = logits + 32 * (size_t)w;
        if (m == 0) {
            for (int k = 0; k < 32; k++) row[k] = -INFINITY;
            continue;
        }
        for (int k = 0; k < 32; k++) row[k] = (m >> k) & 1 ? row[k] : -INFINITY;
    }
    for (int i = 32 * full; i < v; i++)
        if (!((c->scratch[i >> 5] >> (i & 31)) & 1)) logits[i] = -INFINITY;
    if (c->active)
        for (int i = v; i < n_logits; i++) logits[i] = -INFINITY;
    return QD_OK;
}

/* Bits [a, b) of a mask set to on. */
static void set_bits(uint32_t *m, int a, int b, int on) {
    for (int i = a; i < b;) {
        const int w = i >> 5, lo = i & 31, hi = b - 32 * w < 32 ? b - 32 * w : 32;
        const uint32_t bits = (hi == 32 ? 0xffffffffu : (1u << hi) - 1) & ~((1u << lo) - 1);
        m[w] = on ? m[w] | bits : m[w] & ~bits;
        i = 32 * w + hi;
    }
}

qd_status qd_constraint_fill_allow(qd_constraint *c, int remaining, int n_logits, uint32_t *allow, qd_err *err) {
    const size_t words = ((size_t)n_logits + 31) / 32;
    /* the trie's mask in place when it fits, else through the scratch (a trie wider than
     * the row: its ids past the row are not tokens of this model) */
    uint32_t *m = c->n_words <= words ? allow : c->scratch;
    QD_TRY(qd_constraint_fill_mask(c, remaining, m, err));
    if (m != allow) memcpy(allow, m, sizeof(uint32_t) * words);
    const int v = c->trie->vocab_size < n_logits ? c->trie->vocab_size : n_logits;
    /* as mask_logits: ids past the trie are refused once active and kept before */
    set_bits(allow, v, (int)(32 * words), 0);
    if (!c->active) set_bits(allow, v, n_logits, 1);
    return QD_OK;
}

qd_status qd_constraint_accept(qd_constraint *c, int32_t token, qd_err *err) {
    if (!c->active) {
        if (token == c->start_after) c->active = 1;
        return QD_OK;
    }
    for (int i = 0; i < c->n_eos; i++)
        if (token == c->eos[i]) {
            if (c->cur.complete) return QD_OK;
            return qd_seterr(err, QD_ERR_INVALID_ARG, "constraint: end of sequence before the output is complete");
        }
    if (token < 0 || token >= c->trie->vocab_size || c->trie->tok_len[token] < 0)
        return qd_seterr(err, QD_ERR_INVALID_ARG, "constraint: token %d is not text the grammar can match", token);
    const unsigned char *b = c->trie->blob + c->trie->tok_off[token];
    for (int i = 0; i < c->trie->tok_len[token]; i++) {
        if (!qd_match_byte(c->g, &c->cur, b[i], &c->next))
            return qd_seterr(err, QD_ERR_INVALID_ARG, "constraint: token %d does not continue the grammar (byte %d)",
                             token, i);
        qd_mstate tmp = c->cur;
        c->cur = c->next;
        c->next = tmp;
    }
    return QD_OK;
}
