/* The vocabulary split by what a token's bytes are, for masks inside JSON strings.
 *
 * Most tokens of a byte-level vocabulary (244k of Qwen3.5's 248k) are "string
 * tokens": nothing but plain JSON string bytes (qd_json_plain_byte) and whole strict
 * UTF-8 characters. From a state where every such character leads to one state
 * (qd_state_dfa_char_step: inside a string, the state one character later), a string
 * token of n characters leads exactly n such steps on, whatever its bytes; so
 * whether it is allowed depends on n alone. The table keeps, per character count
 * n <= QD_TC_MAX_CHARS, the bitmap of the string tokens of 1..n characters, and a
 * trie of the other tokens (quotes, escapes, control bytes, partial characters,
 * longer tokens). A mask from such a state is then a few bitmap copies plus a walk
 * of the small trie (9k nodes instead of 592k): microseconds, also for a state the
 * automaton has not seen before. States where characters do not all lead to one
 * state (outside strings, patterns, formats) take the whole trie's walk, where the
 * grammar kills most subtrees at their first byte.
 *
 * A second level does the same for the tokens made of ASCII letters and digits
 * alone (n bytes: n characters), from states where every one of those leads to one
 * state: e-mail addresses and patterns over words, where a string character in
 * general does not. Its trie of the other tokens is larger (the walk there is over
 * punctuation and spaces, which such states mostly refuse at once). Before it, a
 * level of the bytes of an e-mail address's local part ([0-9A-Za-z_%+-]), tried
 * first: there the state loops on all of them, and without it the walk allowed the
 * ten thousand tokens such as "_name" or "-based" one by one.
 *
 * The other tokens of a level are kept by the characters of the level they start
 * with: a token that begins with k of them (k <= QD_TC_MAX_CHARS) then a byte that
 * does not continue one ("abc.", "name\"", "x\xe6") sits in the level's trie as
 * the byte k followed by its remaining bytes, and its walk starts from the state k
 * characters on. The prefixes cost nothing to walk: before, every word a token
 * such as "abc." began with was walked byte by byte (the e-mail states walked tens
 * of thousands of such nodes, up to 1.5 ms a mask).
 *
 * Built with the trie (token_trie.h), read-only afterwards, shared like it. */
#ifndef QD_RUNTIME_GRAMMAR_TOKEN_CLASS_H
#define QD_RUNTIME_GRAMMAR_TOKEN_CLASS_H

#include <stddef.h>
#include <stdint.h>

#include "base/err.h"

#define QD_TC_MAX_CHARS 32

typedef struct qd_token_trie qd_token_trie;
typedef struct qd_state_dfa qd_state_dfa;
typedef struct qd_trie_walk qd_trie_walk;

enum { QD_TC_STRING, QD_TC_ATOM, QD_TC_ALNUM, QD_TC_LEVELS };

typedef struct qd_token_level {
    uint32_t *upto;          /* [(QD_TC_MAX_CHARS + 1) * n_words] bitmap n: the level's tokens of 1..n characters */
    int count[QD_TC_MAX_CHARS + 1]; /* the level's tokens of exactly n characters */
    qd_token_trie *rest;     /* every other token of the trie, same ids, as (k, the bytes after its
                              * first k of the level's characters): see below */
} qd_token_level;

typedef struct qd_token_classes {
    size_t n_words;          /* words of one bitmap (vocab_size bits) */
    qd_token_level level[QD_TC_LEVELS];
} qd_token_classes;

/* The table of trie t (its tokens' bytes). */
qd_status qd_token_classes_build(const qd_token_trie *t, qd_token_classes **out, qd_err *err);
void qd_token_classes_free(qd_token_classes *c);

/* The characters of a string token of bytes b[0..n), or -1 when it is not one. */
int qd_token_string_chars(const unsigned char *b, int n);
/* n when b[0..n) is ASCII letters and digits alone, else -1. */
int qd_token_alnum_chars(const unsigned char *b, int n);
/* n when b[0..n) is bytes of [0-9A-Za-z_%+-] alone, else -1. */
int qd_token_atom_chars(const unsigned char *b, int n);

/* The mask of qd_token_trie_mask_dfa (bit for bit, the same *max_dist_out), through
 * the first level of the class table of t whose characters all lead from start to
 * one state, the whole trie's walk when none does. 0; 1 when the automaton filled up; -1 when memory ran out. */
int qd_token_trie_mask_fast(const qd_token_trie *t, qd_state_dfa *d, int start, qd_trie_walk *w, int budget,
                            uint32_t *mask, int *max_dist_out);

#endif
