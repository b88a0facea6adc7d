/* A measured cost model of the engine's steps, so that a step mixing prefill chunks
 * with decodes can be sized to a time instead of a fixed token count: the forward of a
 * step with P prompt tokens (prefill chunks) and D decode rows (one per decoding
 * sequence, plus its drafts) takes about a + b P + c D milliseconds. The engine feeds
 * every step's measured forward time; the fit is least squares over the recent steps
 * (each older step weighted QD_STEP_COST_DECAY times less), so it follows what the
 * steps cost on this machine and model now, not a table of numbers. */
#ifndef QD_RUNTIME_STEP_COST_H
#define QD_RUNTIME_STEP_COST_H

#define QD_STEP_COST_DECAY 0.97 /* weight of a step one step older: about the last 30 steps count */
#define QD_STEP_COST_MIN_STEPS 8
#define QD_STEP_COST_ROWS_SPREAD 0.05 /* decode rows varied: weighted std / mean at least this */

typedef struct qd_step_cost {
    double S[3][3], r[3]; /* weighted sums of x x^T and x ms, x = (1, P, D) */
    int n;                /* steps seen */
    double coef[3];       /* a (ms), b (ms a prompt token), c (ms a decode row) of the last fit */
    int ready;            /* the fit is usable: enough steps, P and D varied, b > 0 */
} qd_step_cost;

/* One observation y at x added to exponentially weighted normal equations in n unknowns
 * (S: n x n row-major sums of x x^T, r: of x y), the earlier ones weighted
 * QD_STEP_COST_DECAY less: the step cost model's fit, and the drafting policy's
 * (spec_policy.h). */
void qd_decayed_normal_add(double *S, double *r, int n, const double *x, double y);

/* One step's measured forward time. */
void qd_step_cost_add(qd_step_cost *c, int prompt_tokens, int decode_rows, double ms);

/* Whether the fit tells a step's fixed cost (a) apart from its cost a decode row (c):
 * QD_STEP_COST_MIN_STEPS steps and their decode rows varied apart from their prompt tokens
 * (the weighted standard deviation of the rows not explained by the prompt tokens at least
 * QD_STEP_COST_ROWS_SPREAD of the rows' weighted mean). The prompt-token cost need not be
 * known: a decode-only load whose batch or draft rows change tells a and c apart, one
 * whose steps all have the same rows does not, nor does one prefill step beside them. */
int qd_step_cost_rows_known(const qd_step_cost *c);

/* The most prompt tokens a step with decode_rows decode rows may take for its forward to
 * fit in target_ms by the model (0 when even the decodes alone do not), or -1 while the
 * model cannot tell (not ready). */
int qd_step_cost_prefill_budget(const qd_step_cost *c, int decode_rows, double target_ms);

#endif
