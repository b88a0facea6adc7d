/* The tokenizer's vocabulary as a trie over token bytes, flattened in preorder, and
 * the token mask of a grammar state computed by one walk over it.
 *
 * A walk advances the matcher byte by byte down the trie, keeping one state per
 * depth, and skips a whole subtree (every token sharing that prefix) as soon as its
 * prefix is dead, so the work is proportional to the prefixes the grammar allows,
 * not to the vocabulary. Tokens that are not text are left out: special added tokens
 * (<|im_end|>, <think> ...) and holes; the constraint (constraint.h) decides about
 * EOS itself. Non-special added tokens (e.g. <tool_call> in Qwen's vocabularies)
 * are in the trie with their content as bytes.
 *
 * A trie is read-only once built: any number of constraints may share one. */
#ifndef QD_RUNTIME_GRAMMAR_TOKEN_TRIE_H
#define QD_RUNTIME_GRAMMAR_TOKEN_TRIE_H

#include <stdint.h>

#include "base/err.h"
#include "io/tokenizer.h"
#include "runtime/grammar/matcher.h"

/* One node as the automaton's walk reads it (token_mask_dfa.c): what it needs of a
 * node in one 16-byte record instead of five arrays, so that a walk whose trie was
 * evicted between two masks (the logits row alone is 1 MB) misses about once per
 * few nodes, not once per array per node. */
typedef struct qd_trie_node {
    int32_t end;             /* one past the last node of its subtree */
    int32_t rank;            /* rank_begin: its tokens are sorted_ids[rank .. next node's rank) */
    uint16_t sub_cats;       /* sub_cats */
    uint16_t depth;          /* depth (tokens are at most 65,535 bytes: build checks) */
    uint8_t byte;
} qd_trie_node;

typedef struct qd_token_trie {
    int vocab_size;          /* ids [0, vocab_size) */
    int n_nodes;             /* node 0 is the root (the empty prefix) */
    uint8_t *byte;           /* [n_nodes] the byte that leads to the node */
    int *depth;              /* [n_nodes] its prefix length */
    int *end;                /* [n_nodes] one past the last node of its subtree */
    int *tok_first;          /* [n_nodes] first token whose bytes end here, -1: none */
    int *tok_next;           /* [vocab_size] next token with the same bytes, -1: none */
    int max_depth;           /* longest token in bytes */
    unsigned char *blob;     /* every token's bytes */
    size_t *tok_off;         /* [vocab_size] token i: blob[tok_off[i] .. + tok_len[i]) */
    int *tok_len;            /* [vocab_size] -1: not in the trie */
    /* Subtree skipping (see qd_token_trie_mask): */
    uint8_t *sub_plain;      /* [n_nodes] the node's byte and every byte below it are plain JSON string bytes */
    uint16_t *sub_cats;      /* [n_nodes] the byte categories (qd_byte_cat) of the node's byte and every byte
                              * below it: the automaton's walk allows the subtree whole from a state that
                              * loops on each of them (state_dfa.h qd_state_dfa_loops_cats) */
    int *rank_begin;         /* [n_nodes + 1] tokens at nodes before i in preorder: the subtree of i holds
                              * the tokens sorted_ids[rank_begin[i] .. rank_begin[end[i]]) */
    int *sorted_ids;         /* [tokens in the trie] ids in preorder */
    qd_trie_node *nodes;     /* [n_nodes + 1] the same, packed (the last one: rank only) */
    struct qd_token_classes *classes; /* string tokens by character count (token_class.h); NULL in a bare trie */
} qd_token_trie;

qd_status qd_token_trie_build(const qd_tokenizer *tok, qd_token_trie **out, qd_err *err);
/* From explicit token byte strings (tests, benchmarks): tokens[i] of lens[i] bytes;
 * lens[i] < 0 leaves id i out. */
qd_status qd_token_trie_build_bytes(const unsigned char *const *tokens, const int *lens, int vocab_size,
                                    qd_token_trie **out, qd_err *err);
/* The same without the class table (the table's own trie of the other tokens). */
qd_status qd_token_trie_build_bare(const unsigned char *const *tokens, const int *lens, int vocab_size,
                                   qd_token_trie **out, qd_err *err);
void qd_token_trie_free(qd_token_trie *t);

/* Scratch of a walk: one matcher state per trie depth. */
typedef struct qd_trie_walk {
    qd_mstate *states;       /* [max_depth + 1] */
    const qd_mstate **at;    /* [max_depth + 1] the state at each depth (states[d], or the walk's start) */
    int n_states;
    int *at_id;              /* [max_depth + 1] the automaton's walk (qd_token_trie_mask_dfa): state id per depth */
    int n_at_id;
} qd_trie_walk;

void qd_trie_walk_free(qd_trie_walk *w);

/* Plain JSON string bytes: printable ASCII but '"' and '\\'. When the start state
 * loops on every one of them (inside a string: the state after any of these bytes is
 * the state before), a subtree of plain bytes below a node reached in that state is
 * allowed whole without advancing the matcher, and a plain byte from that state
 * costs no advance either; only quotes, escapes and non-ASCII bytes are walked. */
static inline int qd_json_plain_byte(unsigned char b) { return b >= 0x20 && b <= 0x7e && b != '"' && b != '\\'; }

/* Byte categories for subtree skipping, chosen so that the byte sets a JSON grammar
 * loops on are unions of them: any string character, words and identifiers,
 * e-mail atoms (letters, digits, _ % + -), digits alone. Categories below
 * QD_CAT_CONTROL are printable ASCII; the last three (controls, UTF-8 continuation
 * and lead bytes) are never taken as loops (one byte of a character alone does not
 * bring a string back to its state). */
enum {
    QD_CAT_DIGIT, QD_CAT_UPPER, QD_CAT_LOWER, QD_CAT_UNDERSCORE, QD_CAT_MINUS, QD_CAT_DOT, QD_CAT_PLUS_PERCENT,
    QD_CAT_AT, QD_CAT_SPACE, QD_CAT_PUNCT, QD_CAT_QUOTE, QD_CAT_BACKSLASH, QD_CAT_CONTROL, QD_CAT_CONT, QD_CAT_LEAD
};
#define QD_CAT_PRINTABLE ((uint16_t)((1u << QD_CAT_CONTROL) - 1))
static inline int qd_byte_cat(unsigned char b) {
    if (b >= '0' && b <= '9') return QD_CAT_DIGIT;
    if (b >= 'A' && b <= 'Z') return QD_CAT_UPPER;
    if (b >= 'a' && b <= 'z') return QD_CAT_LOWER;
    if (b >= 0x80) return b < 0xc0 ? QD_CAT_CONT : QD_CAT_LEAD;
    if (b < 0x20 || b == 0x7f) return QD_CAT_CONTROL;
    switch (b) {
    case '_': return QD_CAT_UNDERSCORE;
    case '-': return QD_CAT_MINUS;
    case '.': return QD_CAT_DOT;
    case '+': case '%': return QD_CAT_PLUS_PERCENT;
    case '@': return QD_CAT_AT;
    case ' ': return QD_CAT_SPACE;
    case '"': return QD_CAT_QUOTE;
    case '\\': return QD_CAT_BACKSLASH;
    default: return QD_CAT_PUNCT;
    }
}

/* Sets bit id of mask (vocab_size bits, 32 per word) for every token whose bytes can
 * follow `st` (the state after them is alive); clears the others. With budget >= 0,
 * a token is allowed only if the fewest bytes that then complete the input are at
 * most `budget`. *max_dist_out (may be NULL) gets the largest such completion
 * distance among the allowed tokens. 0, or -1 when memory ran out. */
int qd_token_trie_mask(const qd_token_trie *t, const qd_grammar *g, const qd_mstate *st, qd_trie_walk *w,
                       int budget, uint32_t *mask, int *max_dist_out);

/* The same mask (bit for bit, the same *max_dist_out) from automaton state `start` of
 * d (state_dfa.h): a walk that looks each node's byte up in the automaton, and allows
 * a subtree of plain bytes whole from any state that loops on them (inside a string,
 * also after an escape or a multi-byte character has brought the walk back to the
 * string's state). 0; 1 when the automaton filled up (the mask is then incomplete:
 * use qd_token_trie_mask); -1 when memory ran out. */
typedef struct qd_state_dfa qd_state_dfa;
int qd_token_trie_mask_dfa(const qd_token_trie *t, qd_state_dfa *d, int start, qd_trie_walk *w, int budget,
                           uint32_t *mask, int *max_dist_out);
/* The same, adding the trie's allowed tokens to mask instead of clearing it first
 * (*max_dist_out: over this trie's tokens). */
int qd_token_trie_mask_dfa_add(const qd_token_trie *t, qd_state_dfa *d, int start, qd_trie_walk *w, int budget,
                               uint32_t *mask, int *max_dist_out);
/* The same over a trie whose first byte is a start, not a byte: the tokens below
 * first byte k are walked from state root_at[k] (k < n_root; QD_DFA_DEAD: none of
 * them), and none ends at depth 1 (token_class.h: the rest of each token after a
 * prefix of k characters). */
int qd_token_trie_mask_dfa_rooted(const qd_token_trie *t, qd_state_dfa *d, const int *root_at, int n_root,
                                  qd_trie_walk *w, int budget, uint32_t *mask, int *max_dist_out);

#endif
