/* Token sampling from one row of logits, one sampler per sequence.
 *
 * Order of operations in qd_sampler_sample (the same order vLLM uses):
 *
 *   0. raw logprobs: log_softmax of the unmodified logits over [0, vocab_limit)
 *      (vLLM's default "raw" logprobs), and the top-n alternatives from it;
 *   1. penalties: repetition (prompt + generated tokens), then frequency, then
 *      presence (generated tokens only);
 *   2. greedy (temperature < QD_SAMPLER_GREEDY_EPS): argmax of the penalised
 *      logits, ties to the lowest id; steps 3-5 are skipped;
 *   3. temperature: logits / temperature;
 *   4. filtering: min_p, then top_k, then top_p (each on what the previous kept);
 *   5. a draw from the renormalised distribution over the kept tokens.
 *
 * A sampler is one sequence's state (RNG, token history); different samplers are
 * independent and may be used from different threads.
 *
 * Ids at or above vocab_limit (padding rows of the LM head) are excluded from every
 * step, logprobs included: they are not tokens.
 *
 * Cost for a vocabulary of V: a few vectorised O(V) passes (max, exp-sum, weights);
 * nothing sorts the vocabulary. top_k <= 512 keeps a heap of the k best (one
 * comparison per token), larger k uses quickselect, O(V). top_p first bounds the
 * nucleus from below (a weight threshold such that the tokens above it already hold
 * top_p of the mass, from a vectorised cumulative histogram over powers of 1/4),
 * collects only tokens above it, then finds the nucleus exactly by a quickselect
 * guided by mass, expected O(n) in the collected count. About 1 ms per token at
 * V = 248k on one core of this project's CI machine (test_sampler prints timings).
 */
#ifndef QD_RUNTIME_SAMPLER_H
#define QD_RUNTIME_SAMPLER_H

#include <stdint.h>

#include "base/err.h"

#define QD_MAX_LOGPROBS 20
/* Temperatures below this are greedy (vLLM's _SAMPLING_EPS): dividing by a tiny
 * temperature overflows and the result is argmax anyway. */
#define QD_SAMPLER_GREEDY_EPS 1e-5f

typedef struct qd_sampling_params {
    float temperature;        /* >= 0; 0 = greedy */
    int top_k;                /* >= 0; 0 = off */
    float top_p;              /* (0, 1]; 1 = off */
    float min_p;              /* [0, 1]; 0 = off */
    /* > 0; 1 = off. HF/vLLM: logit > 0 ? logit / r : logit * r, once per distinct
     * token seen in the prompt (qd_sampler_accept_prompt) or the output. */
    float repetition_penalty;
    /* [-2, 2]; 0 = off. OpenAI/vLLM: logit -= presence * (count > 0) + frequency * count,
     * with count = times the token was generated (prompt tokens do not count). */
    float presence_penalty;
    float frequency_penalty;
    /* RNG seed: same seed + same logits -> same tokens. 0 is an ordinary seed; a caller
     * wanting fresh randomness per run passes one (e.g. from the clock). */
    uint64_t seed;
    int n_logprobs;           /* 0..QD_MAX_LOGPROBS: top-n alternatives to report */
    /* Real vocabulary size (the tokenizer's); ids >= vocab_limit are padding and never
     * sampled or reported. 0 = the whole logits row. */
    int vocab_limit;
} qd_sampling_params;

/* temperature 1, every filter and penalty off, seed 0, no logprobs, no vocab limit. */
qd_sampling_params qd_sampling_default_params(void);

/* Checks every field against its range (vocab_limit against vocab_size); the error
 * message names the offending field. */
qd_status qd_sampling_params_validate(const qd_sampling_params *p, int vocab_size, qd_err *err);

typedef struct qd_token_logprob {
    int32_t id;
    float logprob;
} qd_token_logprob;

typedef struct qd_sample_result {
    int32_t token;
    float logprob;          /* raw log_softmax of the chosen token (step 0 above) */
    int n_top;              /* = n_logprobs (fewer only when the vocabulary is smaller) */
    qd_token_logprob top[QD_MAX_LOGPROBS]; /* raw logprobs, descending; ties by lower id */
} qd_sample_result;

typedef struct qd_sampler qd_sampler;

/* vocab_size = length of one logits row. Validates params (see above). */
qd_status qd_sampler_create(const qd_sampling_params *params, int vocab_size, qd_sampler **out,
                            qd_err *err);
void qd_sampler_free(qd_sampler *s);
/* Forgets prompt/output history and reseeds the RNG from params.seed. */
void qd_sampler_reset(qd_sampler *s);
const qd_sampling_params *qd_sampler_params(const qd_sampler *s);

/* Records prompt tokens for the repetition penalty. Ids must be in [0, vocab_size). */
qd_status qd_sampler_accept_prompt(qd_sampler *s, const int32_t *ids, int n, qd_err *err);

/* Records a token appended to the sequence (for all three penalties). Sampling does NOT
 * record its own result: the caller accepts the token it actually keeps, which also
 * covers forced tokens and tokens a stop condition discards. */
qd_status qd_sampler_accept(qd_sampler *s, int32_t token, qd_err *err);

/* Picks the next token from one logits row of vocab_size floats. The row is used as
 * scratch for the penalised values and restored before returning, so the caller sees
 * it unchanged. Errors: NaN or +inf logits, or every logit in [0, vocab_limit) -inf
 * (QD_ERR_INVALID_ARG, naming the index). */
qd_status qd_sampler_sample(qd_sampler *s, float *logits, qd_sample_result *out, qd_err *err);

/* The distribution qd_sampler_sample draws the next token from, as probabilities over
 * the row: steps 1-4 applied, the tokens filtered out (and ids >= vocab_limit) 0, the
 * rest their renormalised weights; greedy: 1 at the argmax. probs [vocab_size]. The row
 * is restored as by qd_sampler_sample; the RNG is not touched. Speculative sampling
 * accepts drafts against this distribution, so its output is distributed exactly as
 * plain sampling's. */
qd_status qd_sampler_probs(qd_sampler *s, float *logits, float *probs, qd_err *err);
/* The result qd_sampler_sample would report had it picked `token` from this row: its raw
 * logprob and the top-n alternatives (step 0). */
qd_status qd_sampler_report(const qd_sampler *s, const float *logits, int32_t token, qd_sample_result *out,
                            qd_err *err);

/* Applies step 1 (penalties) to a logits row in place, over ids < vocab_limit. Exposed
 * so callers (and tests) can see exactly what the sampler samples from. */
void qd_sampler_apply_penalties(const qd_sampler *s, float *logits);

#endif
