/* Byte-level matching of a grammar (grammar.h): the set of parser stacks that the
 * input so far leaves alive.
 *
 * A stack is a list of frames (alternative, position); the top frame always stands at
 * a byte class (the state is kept expanded), or the stack is empty, which means the
 * input so far is a complete string of the language (`complete`). A byte advances
 * every stack whose top class holds it and re-expands; equal stacks are kept once, so
 * an ambiguous grammar (anyOf branches that share a prefix) costs a few stacks, not an
 * exponential number. Stacks deeper than QD_MATCH_MAX_DEPTH frames (nesting deeper
 * than the grammar's recursion can sensibly need) are dropped, and so are stacks
 * beyond QD_MATCH_MAX_STACKS: a bounded cost per byte whatever the grammar. A rule
 * entered twice with the same stack below it in one expansion is entered once. */
#ifndef QD_RUNTIME_GRAMMAR_MATCHER_H
#define QD_RUNTIME_GRAMMAR_MATCHER_H

#include <stdint.h>

#include "runtime/grammar/grammar.h"

#define QD_MATCH_MAX_DEPTH 96
#define QD_MATCH_MAX_STACKS 512

typedef struct qd_mstate {
    int n;                 /* live stacks */
    int complete;          /* the input so far is a string of the language */
    int *off, *depth;      /* [n] stack i: frames[2*off[i] ..], depth[i] frames, bottom first */
    uint64_t *hash;        /* [n] hash of each stack */
    int32_t *frames;       /* (alternative, position) pairs */
    int n_frames, cap, cap_frames;
    int oom;               /* memory ran out: the state is unusable */
    /* Scratch of the expansion that builds this state: the (stack, rule) pairs already
     * entered, so that a cycle of rules that consume nothing (a repeated group that can
     * be empty, "(a|)*") is entered once instead of for ever. */
    uint64_t *seen;
    uint32_t *seen_gen;    /* [seen_cap] a slot is used when its generation is seen_now */
    uint32_t seen_now;
    int seen_cap, seen_n;
    long work;             /* rule entries in this expansion, bounded by QD_MATCH_MAX_WORK */
} qd_mstate;

#define QD_MATCH_MAX_WORK 200000

void qd_mstate_init(qd_mstate *s);
void qd_mstate_free(qd_mstate *s);
void qd_mstate_clear(qd_mstate *s);
/* dst = src; 0, or -1 when memory runs out. */
int qd_mstate_copy(qd_mstate *dst, const qd_mstate *src);
/* Same stacks (in any order) and the same complete flag. */
int qd_mstate_equal(const qd_mstate *a, const qd_mstate *b);
/* Order-independent hash of the stacks and the complete flag. */
uint64_t qd_mstate_hash(const qd_mstate *s);
/* 1 when some continuation of the input can still be in the language. */
static inline int qd_mstate_alive(const qd_mstate *s) { return s->n > 0 || s->complete; }

/* The state before any input. */
void qd_match_start(const qd_grammar *g, qd_mstate *st);
/* to = from advanced by byte b (to != from). Returns qd_mstate_alive(to). */
int qd_match_byte(const qd_grammar *g, const qd_mstate *from, unsigned char b, qd_mstate *to);
/* The fewest bytes that complete the input (0 when complete); a large value when
 * the state is dead. */
int qd_match_dist(const qd_grammar *g, const qd_mstate *st);
/* Whole JSON string characters (the string tokens of token_class.h: a plain byte,
 * qd_json_plain_byte, or one strict UTF-8 character) stepped with one advance.
 *
 * qd_match_char_rule_ok: 1 when `rule` is a rule of class sequences that matches every
 * string character exactly: from the state holding each of its alternatives at
 * position 0 alone, each character leaves nothing but the complete flag, and none of
 * its proper prefixes completes (checked byte group by byte group, a few hundred
 * advances of a one-frame state).
 *
 * qd_match_char_group: 1 when every stack of st either stands at the start of such a
 * rule, with every alternative of the rule present on the same frames below, or
 * stands at a class holding no byte that begins a string character. Then every string
 * character leads from st to one state, the state after any one of them (each group
 * consumes the character through the rule and resumes below it; the other stacks die
 * at its first byte): the step of a representative character stands for all of them.
 * 0 when in doubt (too many stacks). */
int qd_match_char_rule_ok(const qd_grammar *g, int rule);
int qd_match_char_group(const qd_grammar *g, const qd_mstate *st, int rule);
/* The first bytes of string characters: the plain bytes and the strict UTF-8 leads. */
static inline int qd_string_char_first(unsigned char b) {
    return (b >= 0x20 && b <= 0x7e && b != '"' && b != '\\') || (b >= 0xc2 && b <= 0xf4);
}

/* The union of the bytes any stack accepts next. */
void qd_match_next_bytes(const qd_grammar *g, const qd_mstate *st, uint8_t bits[32]);

#endif
