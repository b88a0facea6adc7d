/* Matcher states interned into a lazily built automaton (state_dfa.h). */
#include "runtime/grammar/state_dfa.h"

#include <stdlib.h>
#include <string.h>

#include "runtime/grammar/token_trie.h"

#define NOT_YET (-2)

void qd_state_dfa_init(qd_state_dfa *d, const qd_grammar *g, int max_states) {
    memset(d, 0, sizeof *d);
    d->g = g;
    d->max_states = max_states > 0 ? max_states : 1;
    d->char_rule = qd_match_char_rule_ok(g, g->char_rule) ? g->char_rule : -1;
    qd_mstate_init(&d->scratch);
}

void qd_state_dfa_free(qd_state_dfa *d) {
    for (int i = 0; i < d->cap; i++) qd_mstate_free(&d->states[i]);
    free(d->states);
    free(d->hash);
    free(d->next);
    free(d->dist);
    free(d->loop);
    free(d->cat_known);
    free(d->cat_loop);
    free(d->chr);
    free(d->alnum);
    free(d->atom);
    free(d->table);
    qd_mstate_free(&d->scratch);
    memset(d, 0, sizeof *d);
}

void qd_state_dfa_reset(qd_state_dfa *d) {
    d->n = 0;
    if (d->table) memset(d->table, 0, sizeof(int) * (size_t)d->table_cap);
}

/* Room for one more state: 0, or -1 (the limit, or memory). */
static int grow(qd_state_dfa *d) {
    if (d->n < d->cap) return 0;
    if (d->cap >= d->max_states) return -1;
    int nc = d->cap ? 2 * d->cap : 64;
    if (nc > d->max_states) nc = d->max_states;
    qd_mstate *st = realloc(d->states, sizeof *st * (size_t)nc);
    if (!st) return -1;
    d->states = st;
    for (int i = d->cap; i < nc; i++) qd_mstate_init(&st[i]);
    uint64_t *h = realloc(d->hash, sizeof *h * (size_t)nc);
    if (h) d->hash = h;
    int32_t *nx = realloc(d->next, sizeof *nx * 256 * (size_t)nc);
    if (nx) d->next = nx;
    int *ds = realloc(d->dist, sizeof *ds * (size_t)nc);
    if (ds) d->dist = ds;
    int8_t *lp = realloc(d->loop, sizeof *lp * (size_t)nc);
    if (lp) d->loop = lp;
    int32_t *ch = realloc(d->chr, sizeof *ch * (size_t)nc);
    if (ch) d->chr = ch;
    int32_t *an = realloc(d->alnum, sizeof *an * (size_t)nc);
    if (an) d->alnum = an;
    int32_t *am = realloc(d->atom, sizeof *am * (size_t)nc);
    if (am) d->atom = am;
    uint16_t *ck = realloc(d->cat_known, sizeof *ck * (size_t)nc);
    if (ck) d->cat_known = ck;
    uint16_t *cl = realloc(d->cat_loop, sizeof *cl * (size_t)nc);
    if (cl) d->cat_loop = cl;
    if (!h || !nx || !ds || !lp || !ch || !an || !am || !ck || !cl) {
        /* the arrays that moved are kept; cap stays where every array has room */
        return -1;
    }
    d->cap = nc;
    /* the hash table at most half full */
    if (2 * nc > d->table_cap) {
        int tc = d->table_cap ? d->table_cap : 128;
        while (tc < 2 * nc) tc *= 2;
        int *t = calloc((size_t)tc, sizeof *t);
        if (!t) return -1;
        for (int i = 0; i < d->n; i++)
            for (size_t k = (size_t)(d->hash[i] & (uint64_t)(tc - 1));; k = (k + 1) & (size_t)(tc - 1))
                if (!t[k]) {
                    t[k] = i + 1;
                    break;
                }
        free(d->table);
        d->table = t;
        d->table_cap = tc;
    }
    return 0;
}

int qd_state_dfa_intern(qd_state_dfa *d, const qd_mstate *s) {
    const uint64_t h = qd_mstate_hash(s);
    if (d->table_cap) {
        for (size_t k = (size_t)(h & (uint64_t)(d->table_cap - 1));; k = (k + 1) & (size_t)(d->table_cap - 1)) {
            int v = d->table[k];
            if (!v) break;
            if (d->hash[v - 1] == h && qd_mstate_equal(&d->states[v - 1], s)) return v - 1;
        }
    }
    if (grow(d)) return QD_DFA_FULL;
    const int id = d->n;
    if (qd_mstate_copy(&d->states[id], s)) return QD_DFA_FULL;
    d->hash[id] = h;
    for (int b = 0; b < 256; b++) d->next[(size_t)id * 256 + b] = NOT_YET;
    d->dist[id] = -1;
    d->loop[id] = -1;
    d->chr[id] = NOT_YET;
    d->alnum[id] = NOT_YET;
    d->atom[id] = NOT_YET;
    d->cat_known[id] = (uint16_t)~QD_CAT_PRINTABLE; /* never loops (token_trie.h) */
    d->cat_loop[id] = 0;
    for (size_t k = (size_t)(h & (uint64_t)(d->table_cap - 1));; k = (k + 1) & (size_t)(d->table_cap - 1))
        if (!d->table[k]) {
            d->table[k] = id + 1;
            break;
        }
    d->n++;
    return id;
}

int qd_state_dfa_step_slow(qd_state_dfa *d, int id, unsigned char b) {
    /* one matcher advance for every byte of b's group (grammar.h: byte_rep) */
    const unsigned char r = d->g->byte_rep[b];
    int32_t *row = d->next + (size_t)id * 256;
    int to = row[r];
    if (to == NOT_YET) {
        if (!qd_match_byte(d->g, &d->states[id], r, &d->scratch)) to = QD_DFA_DEAD;
        else if ((to = qd_state_dfa_intern(d, &d->scratch)) == QD_DFA_FULL) return QD_DFA_FULL; /* not remembered */
        row = d->next + (size_t)id * 256; /* interning may have moved the table */
        for (int x = r; x < 256; x++)
            if (d->g->byte_rep[x] == r) row[x] = to;
    }
    row[b] = to;
    return to;
}

int qd_state_dfa_dist(qd_state_dfa *d, int id) {
    if (d->dist[id] < 0) d->dist[id] = qd_match_dist(d->g, &d->states[id]);
    return d->dist[id];
}

int qd_state_dfa_loops_plain(qd_state_dfa *d, int id) {
    if (d->loop[id] < 0) {
        int loops = 1;
        for (int b = 0x20; b <= 0x7e && loops; b++)
            if (qd_json_plain_byte((unsigned char)b)) loops = qd_state_dfa_step(d, id, (unsigned char)b) == id;
        d->loop[id] = (int8_t)loops; /* a full automaton answers "no": the walk then steps byte by byte */
    }
    return d->loop[id];
}

int qd_state_dfa_loops_cats_slow(qd_state_dfa *d, int id, uint16_t cats) {
    if (cats & ~QD_CAT_PRINTABLE) return 0;
    const uint16_t unknown = cats & (uint16_t)~d->cat_known[id];
    for (int c = 0; c < QD_CAT_CONTROL; c++) {
        if (!((unknown >> c) & 1)) continue;
        int loops = 1;
        for (int b = 0x20; b <= 0x7e && loops; b++) {
            if (qd_byte_cat((unsigned char)b) != c) continue;
            const int to = qd_state_dfa_step(d, id, (unsigned char)b);
            if (to == QD_DFA_FULL) return 0; /* not remembered: asked again later */
            loops = to == id;
        }
        d->cat_known[id] |= (uint16_t)(1u << c);
        if (loops) d->cat_loop[id] |= (uint16_t)(1u << c);
        else return 0;
    }
    return (cats & (uint16_t)~d->cat_loop[id]) == 0;
}

/* The state every byte of lo..hi leads to from `from` (QD_DFA_DEAD passes through),
 * or QD_DFA_MIXED / QD_DFA_FULL. */
static int range_step(qd_state_dfa *d, int from, unsigned lo, unsigned hi) {
    if (from == QD_DFA_DEAD) return QD_DFA_DEAD;
    int to = NOT_YET;
    for (unsigned b = lo; b <= hi; b++) {
        const int x = qd_state_dfa_step(d, from, (unsigned char)b);
        if (x == QD_DFA_FULL) return QD_DFA_FULL;
        if (to == NOT_YET) to = x;
        else if (x != to) return QD_DFA_MIXED;
    }
    return to;
}

/* t merged with the next range's state x */
static int merge(int t, int x) {
    if (t == QD_DFA_FULL || x == QD_DFA_FULL) return QD_DFA_FULL;
    return t == x ? t : QD_DFA_MIXED;
}

int qd_state_dfa_alnum_step(qd_state_dfa *d, int id) {
    if (d->alnum[id] != NOT_YET) return d->alnum[id];
    int t = range_step(d, id, '0', '9');
    if (t != QD_DFA_MIXED && t != QD_DFA_FULL) t = merge(t, range_step(d, id, 'A', 'Z'));
    if (t != QD_DFA_MIXED && t != QD_DFA_FULL) t = merge(t, range_step(d, id, 'a', 'z'));
    if (t != QD_DFA_FULL) d->alnum[id] = t;
    return t;
}

int qd_state_dfa_atom_step(qd_state_dfa *d, int id) {
    if (d->atom[id] != NOT_YET) return d->atom[id];
    int t = qd_state_dfa_alnum_step(d, id);
    for (const char *p = "_%+-"; *p && t != QD_DFA_MIXED && t != QD_DFA_FULL; p++)
        t = merge(t, range_step(d, id, (unsigned char)*p, (unsigned char)*p));
    if (t != QD_DFA_FULL) d->atom[id] = t;
    return t;
}

/* qd_state_dfa_char_step by the step of 'a' (every character leads where it does):
 * NOT_YET when the state is not in character groups, or when the advance hit a
 * limit of the matcher (a stack cap or the work bound: the state after another
 * character could then hold other stacks). */
static int grouped_char_step(qd_state_dfa *d, int id) {
    if (d->char_rule < 0 || !qd_match_char_group(d->g, &d->states[id], d->char_rule)) return NOT_YET;
    const int alive = qd_match_byte(d->g, &d->states[id], 'a', &d->scratch);
    if (d->scratch.n >= QD_MATCH_MAX_STACKS || d->scratch.work >= QD_MATCH_MAX_WORK) return NOT_YET;
    d->char_grouped++;
    return alive ? qd_state_dfa_intern(d, &d->scratch) : QD_DFA_DEAD;
}

int qd_state_dfa_char_step(qd_state_dfa *d, int id) {
    if (d->chr[id] != NOT_YET) return d->chr[id];
    const int t = grouped_char_step(d, id);
    if (t == NOT_YET) return qd_state_dfa_char_step_full(d, id);
    if (t != QD_DFA_FULL) d->chr[id] = t;
    return t;
}

int qd_state_dfa_char_step_full(qd_state_dfa *d, int id) {
    /* plain bytes: 0x20..0x7e but '"' (0x22) and '\\' (0x5c) */
    int t = range_step(d, id, 0x20, 0x21);
    const int parts[2][2] = {{0x23, 0x5b}, {0x5d, 0x7e}};
    for (int k = 0; k < 2 && t != QD_DFA_MIXED && t != QD_DFA_FULL; k++) {
        const int x = range_step(d, id, (unsigned)parts[k][0], (unsigned)parts[k][1]);
        t = x == QD_DFA_FULL || x != t ? (x == QD_DFA_FULL ? QD_DFA_FULL : QD_DFA_MIXED) : t;
    }
    for (size_t q = 0; q < QD_UTF8_SEQS && t != QD_DFA_MIXED && t != QD_DFA_FULL; q++) {
        int s = id;
        for (int k = 0; k < 4 && qd_utf8_seqs[q][k][0] && s != QD_DFA_MIXED && s != QD_DFA_FULL; k++)
            s = range_step(d, s, qd_utf8_seqs[q][k][0], qd_utf8_seqs[q][k][1]);
        t = s == QD_DFA_FULL || s != t ? (s == QD_DFA_FULL ? QD_DFA_FULL : QD_DFA_MIXED) : t;
    }
    if (t != QD_DFA_FULL) d->chr[id] = t; /* a full automaton is asked again later */
    return t;
}
