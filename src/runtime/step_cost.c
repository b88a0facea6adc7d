/* The step cost model (step_cost.h): exponentially weighted least squares in three
 * unknowns, its normal equations solved after each step. */
#include "runtime/step_cost.h"

#include <math.h>
#include <string.h>

/* Solves A x = y (3 x 3, A symmetric positive definite: the damped normal equations
 * below), A and y overwritten. Positive definite, so elimination needs no pivoting. */
static void solve3(double A[3][3], double y[3], double x[3]) {
    for (int col = 0; col < 3; col++)
        for (int i = col + 1; i < 3; i++) {
            const double f = A[i][col] / A[col][col];
            for (int j = col; j < 3; j++) A[i][j] -= f * A[col][j];
            y[i] -= f * y[col];
        }
    for (int i = 2; i >= 0; i--) {
        double s = y[i];
        for (int j = i + 1; j < 3; j++) s -= A[i][j] * x[j];
        x[i] = s / A[i][i];
    }
}

void qd_decayed_normal_add(double *S, double *r, int n, const double *x, double y) {
    for (int i = 0; i < n; i++) {
        for (int j = 0; j < n; j++) S[i * n + j] = QD_STEP_COST_DECAY * S[i * n + j] + x[i] * x[j];
        r[i] = QD_STEP_COST_DECAY * r[i] + x[i] * y;
    }
}

void qd_step_cost_add(qd_step_cost *c, int prompt_tokens, int decode_rows, double ms) {
    if (!(ms >= 0) || !isfinite(ms) || prompt_tokens < 0 || decode_rows < 0) return;
    const double x[3] = {1.0, (double)prompt_tokens, (double)decode_rows};
    qd_decayed_normal_add(&c->S[0][0], c->r, 3, x, ms);
    c->n++;
    double A[3][3], y[3], coef[3];
    memcpy(A, c->S, sizeof A);
    memcpy(y, c->r, sizeof y);
    /* A little damping of the diagonal: where the steps did not vary a term apart from
     * another (every step with the same number of decodes, as under a steady load) the
     * two share its cost, which predicts those steps right; a term never seen (no decode
     * in any step) gets 0. A prompt-token cost not above 0 (no step had prompt tokens)
     * leaves the model not ready. */
    for (int i = 0; i < 3; i++) A[i][i] = A[i][i] > 0 ? A[i][i] * (1 + 1e-9) : 1.0;
    c->ready = 0;
    if (c->n < QD_STEP_COST_MIN_STEPS) return;
    solve3(A, y, coef);
    memcpy(c->coef, coef, sizeof coef);
    c->ready = coef[1] > 0 && isfinite(coef[0]) && isfinite(coef[1]) && isfinite(coef[2]);
}

int qd_step_cost_rows_known(const qd_step_cost *c) {
    const double w = c->S[0][0];
    if (c->n < QD_STEP_COST_MIN_STEPS || !(w > 0)) return 0;
    if (!isfinite(c->coef[0]) || !isfinite(c->coef[2])) return 0;
    const double mP = c->S[0][1] / w, mD = c->S[0][2] / w;
    const double vP = c->S[1][1] / w - mP * mP, vD = c->S[2][2] / w - mD * mD, cPD = c->S[1][2] / w - mP * mD;
    /* what the decode rows varied apart from the prompt tokens: a prefill step (P, 0) beside
     * decode steps (0, D) of one size varies D only with P, which tells a, b and c apart no
     * better than the decode steps alone */
    const double spread = vP > 1e-9 * (mP * mP + 1.0) ? vD - cPD * cPD / vP : vD;
    return mD > 0 && spread >= QD_STEP_COST_ROWS_SPREAD * QD_STEP_COST_ROWS_SPREAD * mD * mD;
}

int qd_step_cost_prefill_budget(const qd_step_cost *c, int decode_rows, double target_ms) {
    if (!c->ready) return -1;
    const double left = target_ms - c->coef[0] - c->coef[2] * (double)decode_rows;
    if (!(left > 0)) return 0;
    const double p = left / c->coef[1];
    return p >= (double)(1 << 30) ? 1 << 30 : (int)p;
}
