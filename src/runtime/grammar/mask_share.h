/* Token masks shared by the constraints of one grammar (the n sequences of an n > 1
 * request, clones of one constraint).
 *
 * Each constraint keeps its own automaton and a few masks by state (constraint.h);
 * without sharing, every sequence of a request computed the same masks again (the
 * first mask of a length-bounded string, an e-mail address) as it reached the same
 * states. A share holds unbudgeted masks by matcher state: a constraint that misses
 * its own cache looks there before walking, and adds what it walked.
 *
 * Thread safety: the engine prepares the sampled rows of different requests on a
 * thread pool (scheduler.c prepare_rows), so two constraints of one share may ask at
 * once. Every access holds the share's mutex; an entry is a private copy (state and
 * mask), copied out under the lock, so a writer replacing it never races a reader.
 * The masks are deterministic functions of the state: whichever of two concurrent
 * walks of one state adds first, the other finds it there and adds nothing. */
#ifndef QD_RUNTIME_GRAMMAR_MASK_SHARE_H
#define QD_RUNTIME_GRAMMAR_MASK_SHARE_H

#include <stddef.h>
#include <stdint.h>

#include "runtime/grammar/matcher.h"

typedef struct qd_mask_share qd_mask_share;

/* A share of masks of n_words words, at most max_entries of them (the oldest
 * replaced); NULL when memory ran out. */
qd_mask_share *qd_mask_share_new(size_t n_words, int max_entries);
/* One more owner; returns s. */
qd_mask_share *qd_mask_share_ref(qd_mask_share *s);
/* Drops one owner; the last frees it. */
void qd_mask_share_free(qd_mask_share *s);

/* 1 when more than one constraint holds s (a lone constraint neither looks in its
 * share nor adds to it: copying each new mask there would cost it a few
 * microseconds a mask for nothing). */
int qd_mask_share_shared(const qd_mask_share *s);
/* Copies the mask of state st (hash: qd_mstate_hash) and its largest completion into
 * mask / *max_dist: 1, or 0 when the share does not hold it. */
int qd_mask_share_get(qd_mask_share *s, const qd_mstate *st, uint64_t hash, uint32_t *mask, int *max_dist);
/* Adds a copy of st's mask unless the share holds it already; 0, or -1 when memory
 * ran out (the share is then left as it was). */
int qd_mask_share_put(qd_mask_share *s, const qd_mstate *st, uint64_t hash, const uint32_t *mask, int max_dist);

#endif
