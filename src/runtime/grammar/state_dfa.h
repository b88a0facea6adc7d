/* The matcher's states as a lazily built automaton: each distinct state (matcher.h)
 * that a walk reaches is interned once and numbered, and its transition by a byte is
 * computed once and remembered. A token-mask walk over the trie (token_mask_dfa.c)
 * then costs one table lookup per trie node instead of one matcher advance, and a
 * state's completion distance and whether it loops on plain string bytes are computed
 * once per state instead of once per token.
 *
 * The automaton belongs to one constraint (one grammar, one thread). It holds at most
 * `max_states` states; when a new state does not fit, the step answers
 * QD_DFA_FULL and the caller falls back to the matcher (and may reset the automaton
 * to start over). */
#ifndef QD_RUNTIME_GRAMMAR_STATE_DFA_H
#define QD_RUNTIME_GRAMMAR_STATE_DFA_H

#include <stdint.h>

#include "runtime/grammar/grammar.h"
#include "runtime/grammar/matcher.h"

#define QD_DFA_DEAD (-1)    /* the byte kills every stack */
#define QD_DFA_FULL (-3)    /* the state reached could not be interned (max_states, or memory) */
#define QD_DFA_MIXED (-4)   /* qd_state_dfa_char_step: characters lead to different states */

typedef struct qd_state_dfa {
    const qd_grammar *g;
    int n, cap, max_states;
    qd_mstate *states;      /* [cap] the interned states */
    uint64_t *hash;         /* [cap] qd_mstate_hash of each */
    int32_t *next;          /* [cap * 256] the state after byte b, QD_DFA_DEAD, or -2: not computed yet */
    int *dist;              /* [cap] qd_match_dist, -1: not computed yet */
    int8_t *loop;           /* [cap] 1: every plain JSON string byte leads back to the state; -1: not computed */
    uint16_t *cat_known;    /* [cap] byte categories (token_trie.h qd_byte_cat) checked for a loop (the
                             * unprintable ones from the start: never a loop) */
    uint16_t *cat_loop;     /* [cap] those of them whose every byte leads back to the state */
    int32_t *chr;           /* [cap] qd_state_dfa_char_step, -2: not computed */
    int32_t *alnum;         /* [cap] qd_state_dfa_alnum_step, -2: not computed */
    int32_t *atom;          /* [cap] qd_state_dfa_atom_step, -2: not computed */
    int *table;             /* [table_cap] open addressing on hash: state id + 1, 0: empty */
    int table_cap;
    int char_rule;          /* the grammar's char_rule once checked (qd_match_char_rule_ok), else -1 */
    long char_grouped;      /* qd_state_dfa_char_step answers by one representative advance (tests) */
    long subtree_skips;     /* trie subtrees the walks allowed whole (token_mask_dfa.c; tests) */
    qd_mstate scratch;
} qd_state_dfa;

void qd_state_dfa_init(qd_state_dfa *d, const qd_grammar *g, int max_states);
void qd_state_dfa_free(qd_state_dfa *d);
/* Forgets every state (the memory is kept). */
void qd_state_dfa_reset(qd_state_dfa *d);
/* The id of state s (interned if new), or QD_DFA_FULL. */
int qd_state_dfa_intern(qd_state_dfa *d, const qd_mstate *s);
/* The state after byte b from state id: an id, QD_DFA_DEAD or QD_DFA_FULL. */
static inline int qd_state_dfa_step(qd_state_dfa *d, int id, unsigned char b);
int qd_state_dfa_step_slow(qd_state_dfa *d, int id, unsigned char b);
/* qd_match_dist of state id. */
int qd_state_dfa_dist(qd_state_dfa *d, int id);
/* 1 when every plain JSON string byte (qd_json_plain_byte) leads from id back to id. */
int qd_state_dfa_loops_plain(qd_state_dfa *d, int id);
/* 1 when every byte of each category in `cats` (bits of qd_byte_cat, printable ones
 * only) leads from id back to id; each category checked once per state, on demand. */
int qd_state_dfa_loops_cats_slow(qd_state_dfa *d, int id, uint16_t cats);
static inline int qd_state_dfa_loops_cats(qd_state_dfa *d, int id, uint16_t cats) {
    /* per trie node in every walk: answered from the state's known categories when it can be */
    if (cats & d->cat_known[id] & (uint16_t)~d->cat_loop[id]) return 0; /* a category known not to loop */
    if (!(cats & (uint16_t)~d->cat_loop[id])) return 1;
    return qd_state_dfa_loops_cats_slow(d, id, cats);
}

/* The state that every string character leads to from id: a plain JSON string byte
 * (qd_json_plain_byte) or the bytes of one strict UTF-8 character (no overlongs, no
 * surrogates, <= U+10FFFF). An id, QD_DFA_DEAD when every one of them kills every
 * stack, QD_DFA_MIXED when they do not all lead to one state (the bytes of a
 * character that dies part way count as leading to QD_DFA_DEAD), or QD_DFA_FULL.
 * Inside a JSON string it is the state one character later: a token made only of
 * such characters, n of them, leads n such steps on, whatever its bytes
 * (token_class.h). Computed once per state: when the state's stacks stand in groups
 * at the start of the grammar's character rule (matcher.h qd_match_char_group), by
 * one advance over a representative character; otherwise by stepping every byte
 * group of every character form (about 90 advances for a new state, the cost that
 * made the first mask of a length-bounded string, whose every position is a new
 * state, take hundreds of microseconds). */
int qd_state_dfa_char_step(qd_state_dfa *d, int id);
/* The same by stepping every byte group of every form, never by a representative
 * (the reference the tests compare the grouped answer with). */
int qd_state_dfa_char_step_full(qd_state_dfa *d, int id);
/* The same for the ASCII letters and digits alone (inside an e-mail address, a
 * pattern of words): the state that every one of [0-9A-Za-z] leads to from id. */
int qd_state_dfa_alnum_step(qd_state_dfa *d, int id);
/* The same for the bytes of an e-mail address's local part: [0-9A-Za-z_%+-]. */
int qd_state_dfa_atom_step(qd_state_dfa *d, int id);

static inline int qd_state_dfa_step(qd_state_dfa *d, int id, unsigned char b) {
    int32_t t = d->next[(size_t)id * 256 + b];
    return t != -2 ? t : qd_state_dfa_step_slow(d, id, b);
}

#endif
