/* One request's constraint: a grammar applied to its sampled tokens.
 *
 * Per step the engine asks for the token mask of the current state (tokens whose
 * bytes keep the output a prefix of some string of the language; the EOS ids only
 * once the output is complete) and applies it to the logits before sampling, then
 * advances the state by the token it keeps.
 *
 * Masks are cached by state (a few entries per sequence, and a share of 64 with the
 * other sequences of an n > 1 request: mask_share.h): inside a string or between
 * values the state repeats from token to token, so most steps copy a cached mask
 * instead of walking the trie. A walk goes over the constraint's state automaton
 * (state_dfa.h), kept for the request's life: a trie node costs a table lookup, and a
 * subtree of plain string bytes is allowed whole from any state that loops on them.
 * Inside a string the mask comes from the trie's class table (token_class.h): the
 * tokens of plain characters allowed by character count a bitmap at a time, and only
 * the few thousand others walked.
 *
 * Closing before max_tokens: each cached mask remembers the longest completion any of
 * its tokens leaves. When the tokens still allowed would not fit that completion plus
 * EOS, the mask is recomputed keeping only tokens after which the fewest bytes that
 * complete the output fit (each byte is one token at worst: byte-level vocabularies
 * hold every byte). When no token can close in time the full mask is used and the
 * request ends by length.
 *
 * With `start_after` (the id of </think> for a model that reasons), the grammar
 * applies once that token has been generated; before it every token but EOS is
 * allowed (an answer must follow the reasoning), and when only the shortest answer
 * still fits in the budget, that token alone. */
#ifndef QD_RUNTIME_GRAMMAR_CONSTRAINT_H
#define QD_RUNTIME_GRAMMAR_CONSTRAINT_H

#include <stdint.h>

#include "base/err.h"
#include "runtime/grammar/grammar.h"
#include "runtime/grammar/token_trie.h"

typedef struct qd_constraint qd_constraint;

typedef struct qd_constraint_params {
    const qd_token_trie *trie;  /* shared, must outlive the constraint */
    qd_grammar *grammar;        /* finished; owned by the constraint from create on, also on failure */
    const int32_t *eos;         /* [n_eos] ids allowed once the output is complete (copied) */
    int n_eos;
    int32_t start_after;        /* -1: constrained from the first token */
} qd_constraint_params;

qd_status qd_constraint_create(const qd_constraint_params *p, qd_constraint **out, qd_err *err);
/* A constraint in the same state on the same grammar (shared, reference counted) and
 * trie, with its own state and caches: one per sequence of an n > 1 request. */
qd_status qd_constraint_clone(const qd_constraint *src, qd_constraint **out, qd_err *err);
void qd_constraint_free(qd_constraint *c);

/* 1 once the constraint applies (start_after seen, or none). */
int qd_constraint_active(const qd_constraint *c);
/* 1 when the output so far is a complete string of the language. */
int qd_constraint_complete(const qd_constraint *c);

/* The allowed tokens now (trie vocab_size bits), given `remaining` tokens that may
 * still be generated counting this one (< 0: no limit). */
qd_status qd_constraint_fill_mask(qd_constraint *c, int remaining, uint32_t *mask, qd_err *err);
/* Sets every disallowed logit of a row of n_logits to -inf (ids past the
 * vocabulary too, once active). */
qd_status qd_constraint_mask_logits(qd_constraint *c, float *logits, int n_logits, int remaining, qd_err *err);
/* The ids of a row of n_logits that qd_constraint_mask_logits would leave as they are,
 * as (n_logits + 31) / 32 words (bit i % 32 of word i / 32: id i allowed, bits past
 * n_logits clear): the mask's bits below the trie's vocabulary, and the ids past it
 * while the constraint is not active. The mask for an argmax taken where the logits are
 * (qd_forward_args.allow), the same set without touching the row. */
qd_status qd_constraint_fill_allow(qd_constraint *c, int remaining, int n_logits, uint32_t *allow, qd_err *err);
/* Advances by a kept token; QD_ERR_INVALID_ARG when the token is not allowed. */
qd_status qd_constraint_accept(qd_constraint *c, int32_t token, qd_err *err);

/* Mask computations since create: trie walks and cache hits (benchmarks, tests). */
void qd_constraint_counts(const qd_constraint *c, long *walks, long *hits);
/* Masks copied from the share with the constraint's clones instead of walked (tests). */
long qd_constraint_shared_hits(const qd_constraint *c);
/* Walks done by the matcher because the state automaton filled up (tests). */
long qd_constraint_dfa_fallbacks(const qd_constraint *c);

#endif
