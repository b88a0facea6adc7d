/* Greedy speculative decoding of one sequence with the checkpoint's MTP head (spec 7.2):
 * each step drafts K tokens with the MTP (its own KV cache, h' fed back), verifies
 * [next token, drafts] in one verify span, keeps the longest matching prefix plus the
 * target's token after it (spec_accept.h), rolls the rejected rest back (qd_seq_accept,
 * qd_mtp_truncate), and catches the MTP up on the kept positions with the target's hidden
 * states. The output is plain greedy decoding's (bit for bit in a batch-invariant
 * context). The reference loop the engine's speculative path is checked against. */
#ifndef QD_RUNTIME_SPEC_DECODE_H
#define QD_RUNTIME_SPEC_DECODE_H

#include <stdint.h>

#include "qdelta.h"

typedef struct qd_spec_stats {
    long steps;              /* verify steps */
    long drafted;            /* draft tokens proposed */
    long accepted;           /* of them, kept */
    long accepted_at[4];     /* kept at draft position 0..3 */
} qd_spec_stats;

typedef struct qd_spec_greedy_args {
    const qd_model *model;
    qd_context *ctx;          /* made with params.mtp, speculative_tokens >= k,
                               * max_batch >= n_prompt + 1 */
    int seq;                  /* an empty sequence */
    const int32_t *prompt;    /* [n_prompt] */
    int n_prompt;
    int n_new;                /* tokens to generate into out [n_new] */
    int k;                    /* drafts per step, 1..4 */
    /* [n_new] or NULL: draft j of the step that has emitted i tokens is forced_drafts[i + j]
     * (past n_new: the MTP's) instead of the MTP's argmax, which still runs (its KV stays
     * what it would be). Tests and other drafters. */
    const int32_t *forced_drafts;
} qd_spec_greedy_args;

/* Feeds the prompt and generates n_new tokens into out. */
qd_status qd_spec_generate_greedy(const qd_spec_greedy_args *a, int32_t *out, qd_spec_stats *stats);

#endif
