/* A context-free grammar over bytes, the target of the JSON Schema compiler and the
 * input of the matcher (matcher.h).
 *
 * A grammar is a set of rules; a rule is a list of alternatives; an alternative is a
 * sequence of symbols. A symbol is a rule (>= 0) or a byte class (< 0: class
 * -(sym + 1), a 256-bit set of bytes). Classes 0..255 are the single bytes, so a
 * literal byte b is the symbol -(b + 1).
 *
 * The matcher expands rules top-down, so a grammar must not be left-recursive (a rule
 * that can reach itself without consuming a byte); the schema compiler never builds
 * one, and the matcher bounds its expansion depth so that a bad grammar costs a dead
 * path, not a hang. Right recursion (R -> x R | empty) is how repetition is written:
 * a rule that is the last symbol of its alternative is entered as a tail call and does
 * not grow the matcher's stack.
 *
 * Building: qd_grammar_new, then rules and alternatives in any order, then
 * qd_grammar_finish (indexes the alternatives by rule and computes each rule's
 * shortest expansion, used to force a close before max_tokens). A builder call that
 * would exceed the limits below marks the grammar as too large; finish reports it. */
#ifndef QD_RUNTIME_GRAMMAR_GRAMMAR_H
#define QD_RUNTIME_GRAMMAR_GRAMMAR_H

#include <stddef.h>
#include <stdint.h>

#include "base/err.h"

/* Limits on one grammar: a schema that compiles to more is refused as oversized. */
#define QD_GRAMMAR_MAX_SYMS (1 << 20)
#define QD_GRAMMAR_MAX_RULES (1 << 18)

typedef struct qd_grammar {
    int n_rules;
    int *rule_alt0, *rule_nalt;   /* [n_rules] alternatives of rule r: alt_order[rule_alt0[r] ..] */
    int n_alts, cap_alts;
    int *alt_rule;                /* [n_alts] the rule an alternative belongs to */
    int *alt_sym0, *alt_len;      /* [n_alts] its symbols: syms[alt_sym0[a] .. + alt_len[a]) */
    int *alt_order;               /* [n_alts] alternatives sorted by rule (finish) */
    int n_syms, cap_syms;
    int32_t *syms;
    int n_classes, cap_classes;
    uint8_t (*classes)[32];       /* [n_classes] byte sets, bit b of byte b/8 */
    int *minlen;                  /* [n_rules] bytes of the shortest expansion (finish) */
    /* Bytes that every class the alternatives use either holds both or neither of are
     * the same to the matcher (it tests nothing but class membership): byte_rep[b] is
     * the smallest byte equivalent to b (finish). The state automaton (state_dfa.h)
     * advances the matcher once per such group, not once per byte. */
    uint8_t byte_rep[256];
    /* A rule whose alternatives are sequences of byte classes that together match one
     * JSON string character (the schema compiler's sc_char), or -1. A hint: the state
     * automaton checks it (qd_match_char_rule_ok) before relying on it to step a whole
     * character with one matcher advance (state_dfa.h). */
    int char_rule;
    int root;
    int too_large;                /* a limit was hit (or memory ran out) while building */
    int finished;
    int refs;                     /* owners (constraints cloned for n > 1 share one grammar) */
} qd_grammar;

qd_grammar *qd_grammar_new(void);
/* One more owner of a finished grammar (read-only from then on); returns g. */
qd_grammar *qd_grammar_ref(qd_grammar *g);
/* Drops one owner; the last frees it. */
void qd_grammar_free(qd_grammar *g);

/* A new rule with no alternatives yet; -1 when the grammar is too large. */
int qd_grammar_rule(qd_grammar *g);
/* Adds the alternative syms[0..n) to rule r (n = 0: the empty string). */
void qd_grammar_alt(qd_grammar *g, int r, const int32_t *syms, int n);
/* The symbol of a single byte. */
static inline int32_t qd_grammar_byte(unsigned char b) { return -(int32_t)b - 1; }
/* The symbol of a byte set (32 bytes, bit b of byte b/8). */
int32_t qd_grammar_class(qd_grammar *g, const uint8_t bits[32]);
/* The symbol of the bytes lo..hi. */
int32_t qd_grammar_range(qd_grammar *g, unsigned lo, unsigned hi);
/* A rule matching exactly s[0..n). */
int qd_grammar_literal(qd_grammar *g, const char *s, size_t n);

/* Indexes the grammar with `root` as its start rule, computes minimum lengths.
 * QD_ERR_CAPACITY when it grew too large, QD_ERR_INVALID_ARG when a rule derives no
 * finite string (e.g. R -> x R alone). */
qd_status qd_grammar_finish(qd_grammar *g, int root, qd_err *err);

static inline int qd_class_has(const qd_grammar *g, int cls, unsigned char b) {
    return (g->classes[cls][b >> 3] >> (b & 7)) & 1;
}

/* Strict UTF-8 as the schema compiler writes it (json_schema.c): per form, the lead byte
 * range, then the ranges of its continuation bytes ({0, 0} past the last). */
#define QD_UTF8_SEQS 8
extern const uint8_t qd_utf8_seqs[QD_UTF8_SEQS][4][2];

#endif
