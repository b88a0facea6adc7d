/* Whether an engine step drafts (speculative decoding), from what drafting has been
 * measured to cost and to gain on this machine and model.
 *
 * A verify span of K + 1 rows yields E tokens on average (1 plus the drafts kept), so a
 * step pays off when E times the plain step's time exceeds the verify step's time plus
 * the drafts': forward ms a + c B (K + 1) + drafts(B) against E (a + c B) for B
 * speculating decodes, a and c from the engine's step cost model (step_cost.h), E and
 * drafts(B) from the recent steps that drafted, weighted as that model weights its
 * steps. Where a step's rows are nearly free (a
 * GPU at small batch: the weights' bytes dominate) drafting pays at any acceptance worth
 * the drafts; where rows cost in proportion (a busy GPU, a CPU) it stops. A step that
 * does not draft runs no MTP forward: its requests keep their pending pairs for the next
 * step that does (the engine's QD_SPEC_PEND_MAX), so drafting can resume at any step.
 * Every QD_SPEC_PROBE_EVERY steps of one choice, one step makes the other, so that E,
 * drafts(B) and the cost of a plain step's rows against a verify step's stay measured: a
 * plain step among drafting ones, or among plain ones a probe, where one request drafts
 * (E stays measured for K rows, not K rows a request). Once a and c have been told apart,
 * the policy keeps the last such a and c while a steady batch of plain steps and probes
 * no longer varies the rows enough to tell them apart again.
 * While the step cost model cannot tell a from c (qd_step_cost_rows_known: a steady
 * decode-only batch that always drafts has one row count), every QD_SPEC_EXPLORE_EVERY-th
 * step does not draft, which gives it two. The output does not depend on the choice
 * (verify + accept yields what plain decoding does), only the speed does. */
#ifndef QD_RUNTIME_SPEC_POLICY_H
#define QD_RUNTIME_SPEC_POLICY_H

#include "runtime/step_cost.h"

#define QD_SPEC_POLICY_MAX_K 4   /* draft positions tracked (QD_SPEC_MAX) */
#define QD_SPEC_PROBE_EVERY 32    /* a step in this many makes the other choice than the model's */
#define QD_SPEC_EXPLORE_EVERY 4   /* ... and in this many does not draft while a and c are not apart */
#define QD_SPEC_POLICY_MIN_STEPS 4 /* drafting steps measured before the model decides */
#define QD_SPEC_POLICY_MIN_VERIFIES 32 /* ... and verify spans, for the acceptance */

typedef struct qd_spec_policy {
    double verifies;                     /* verify spans of the recent steps (decayed) */
    int verifies_seen;                   /* verify spans seen (not decayed, capped) */
    double kept[QD_SPEC_POLICY_MAX_K];   /* ... and of them, drafts kept at position i */
    double S[2][2], r[2];                /* weighted sums of x x^T and x ms, x = (1, requests), of the drafting steps */
    int draft_steps;                     /* drafting steps seen */
    int since_draft;                     /* steps the model said not to draft since one drafted */
    int since_plain;                     /* steps the model said to draft since one did not */
    int explored;                        /* steps decided while a and c were not apart */
    int costs_known;                     /* a and c below were fitted apart once */
    double a, c;                         /* the step cost model's last fixed and per-row ms told apart */
} qd_spec_policy;

/* What a step does (qd_spec_policy_decide). */
typedef enum qd_spec_choice {
    QD_SPEC_PLAIN = 0, /* no request drafts */
    QD_SPEC_DRAFT = 1, /* every speculating decode drafts */
    QD_SPEC_PROBE = 2, /* one speculating decode drafts (the model says plain) */
} qd_spec_choice;

/* One step's outcome: `verifies` verify spans, of which kept_at[i] kept draft i (i < k),
 * and, when it drafted, its draft phase: `drafting` requests in `draft_ms`. */
void qd_spec_policy_observe(qd_spec_policy *p, int verifies, const int *kept_at, int k, int drafting,
                            double draft_ms);

/* Tokens a verify span of k drafts yields on average by the recent steps (1 + drafts
 * kept), or 0 before any. */
double qd_spec_policy_mean_tokens(const qd_spec_policy *p, int k);

/* The draft phase's predicted milliseconds for `requests` drafting requests (-1 before
 * QD_SPEC_POLICY_MIN_STEPS drafting steps). */
double qd_spec_policy_draft_ms(const qd_spec_policy *p, int requests);

/* What the next step, with `requests` speculating decodes and k drafts each, does: while
 * the step cost model has never told a from c, QD_SPEC_DRAFT but QD_SPEC_PLAIN every
 * QD_SPEC_EXPLORE_EVERY-th step; while the drafts are not measured yet (fewer than
 * QD_SPEC_POLICY_MIN_STEPS drafting steps or QD_SPEC_POLICY_MIN_VERIFIES verify spans),
 * QD_SPEC_DRAFT; else what the model says, but every QD_SPEC_PROBE_EVERY-th step the other
 * choice (QD_SPEC_PLAIN among drafting steps, QD_SPEC_PROBE among plain ones). Counts the
 * step. */
qd_spec_choice qd_spec_policy_decide(qd_spec_policy *p, const qd_step_cost *cost, int requests, int k);

#endif
