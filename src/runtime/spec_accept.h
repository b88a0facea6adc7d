/* The accept step of speculative decoding (spec 7.2 step 2): which drafted tokens a verify
 * step keeps, and the token after them.
 *
 * Greedy: the longest prefix of the drafts equal to the target's argmax at each position,
 * then the target's argmax after it (the bonus token): the output is exactly plain greedy
 * decoding's.
 *
 * Sampled (Leviathan et al. / Chen et al. speculative sampling): draft i, drawn from the
 * draft distribution q_i, is kept with probability min(1, p_i(d) / q_i(d)) where p_i is the
 * target's distribution at that position; the first rejected position draws from the
 * residual norm(max(0, p_i - q_i)); when every draft is kept the bonus is drawn from
 * p_k. Each output token is then distributed exactly as plain sampling from the target
 * would give it. */
#ifndef QD_RUNTIME_SPEC_ACCEPT_H
#define QD_RUNTIME_SPEC_ACCEPT_H

#include <stdint.h>

/* xoshiro256** state of one sequence's accept draws, seeded like the sampler's. */
typedef struct qd_spec_rng {
    uint64_t s[4];
} qd_spec_rng;

void qd_spec_rng_seed(qd_spec_rng *r, uint64_t seed);
double qd_spec_rng_uniform(qd_spec_rng *r); /* [0, 1) */

/* draft [k], target [k + 1] (the argmax of each verify row). Writes the kept drafts and
 * the bonus to out [k + 1]; returns how many (1..k+1). */
int qd_spec_accept_greedy(const int32_t *draft, int k, const int32_t *target, int32_t *out);

/* Target probabilities from a logits row at temperature t > 0 over [0, n) (softmax(x / t),
 * in double): probs [n]. */
void qd_spec_probs(const float *logits, int n, float temperature, float *probs);

/* p [k + 1][n] the target's distributions at the verify rows, q [k][n] the draft's (the
 * distributions the drafts were drawn from), draft [k]. Writes the output tokens to out
 * [k + 1] and returns how many (1..k+1); resid [n] is scratch. */
int qd_spec_accept_sampled(const float *p, const float *q, const int32_t *draft, int k, int n, qd_spec_rng *rng,
                           double *resid, int32_t *out);

/* One position of qd_spec_accept_sampled: draft d drawn from qi [n], the target's pi [n].
 * Returns 1 with *out = d when kept, else 0 with *out drawn from the residual. */
int qd_spec_accept_one(const float *pi, const float *qi, int32_t d, int n, qd_spec_rng *rng, double *resid,
                       int32_t *out);
/* The same for a deterministic draft (the draft model's argmax: q is 1 at d): kept with
 * probability pi[d], else *out is drawn from pi without d, renormalised. The engine's
 * drafts are the MTP head's argmax, so no draft distribution is stored. */
int qd_spec_accept_greedy_draft(const float *pi, int32_t d, int n, qd_spec_rng *rng, double *resid, int32_t *out);

#endif
