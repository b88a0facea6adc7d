/* Whether an engine step drafts (spec_policy.h). */
#include "runtime/spec_policy.h"

#include <math.h>

void qd_spec_policy_observe(qd_spec_policy *p, int verifies, const int *kept_at, int k, int drafting,
                            double draft_ms) {
    if (verifies > 0) {
        p->verifies = p->verifies * QD_STEP_COST_DECAY + verifies;
        p->verifies_seen += p->verifies_seen < QD_SPEC_POLICY_MIN_VERIFIES ? verifies : 0;
        for (int i = 0; i < QD_SPEC_POLICY_MAX_K; i++)
            p->kept[i] = p->kept[i] * QD_STEP_COST_DECAY + (i < k ? kept_at[i] : 0);
    }
    if (drafting > 0 && draft_ms >= 0 && isfinite(draft_ms)) {
        const double x[2] = {1.0, (double)drafting};
        qd_decayed_normal_add(&p->S[0][0], p->r, 2, x, draft_ms);
        p->draft_steps++;
    }
}

double qd_spec_policy_mean_tokens(const qd_spec_policy *p, int k) {
    if (!(p->verifies > 0)) return 0.0;
    double e = 1.0;
    for (int i = 0; i < k && i < QD_SPEC_POLICY_MAX_K; i++) e += p->kept[i] / p->verifies;
    return e;
}

double qd_spec_policy_draft_ms(const qd_spec_policy *p, int requests) {
    if (p->draft_steps < QD_SPEC_POLICY_MIN_STEPS || !(p->S[0][0] > 0)) return -1.0;
    const double w = p->S[0][0], mx = p->S[0][1] / w, my = p->r[0] / w;
    const double var = p->S[1][1] / w - mx * mx, cov = p->r[1] / w - mx * my;
    /* one batch size seen (a steady load): in proportion to the requests, which
     * overstates the draft phase's fixed part at larger batches and so errs toward not
     * drafting there; a cost that does not grow with the requests: the mean */
    if (var < 0.25) return mx > 0 ? my * requests / mx : my;
    if (cov <= 0) return my;
    const double slope = cov / var, ms = my + slope * (requests - mx);
    return ms > 0 ? ms : 0.0;
}

qd_spec_choice qd_spec_policy_decide(qd_spec_policy *p, const qd_step_cost *cost, int requests, int k) {
    if (requests <= 0 || k <= 0) return QD_SPEC_DRAFT;
    if (qd_step_cost_rows_known(cost)) {
        /* a fixed or per-row cost fitted below 0 is noise around a cost too small to see */
        p->a = fmax(cost->coef[0], 0.0);
        p->c = fmax(cost->coef[2], 0.0);
        p->costs_known = 1;
    } else if (!p->costs_known) {
        return ++p->explored % QD_SPEC_EXPLORE_EVERY != 0 ? QD_SPEC_DRAFT : QD_SPEC_PLAIN;
    }
    const double e = qd_spec_policy_mean_tokens(p, k), dms = qd_spec_policy_draft_ms(p, requests);
    if (p->verifies_seen < QD_SPEC_POLICY_MIN_VERIFIES || !(e > 0) || dms < 0) return QD_SPEC_DRAFT;
    const double plain = p->a + p->c * requests, spec = p->a + p->c * requests * (k + 1) + dms;
    if (e * plain >= spec) {
        p->since_draft = 0;
        if (++p->since_plain < QD_SPEC_PROBE_EVERY) return QD_SPEC_DRAFT;
        p->since_plain = 0;
        return QD_SPEC_PLAIN;
    }
    p->since_plain = 0;
    if (++p->since_draft < QD_SPEC_PROBE_EVERY) return QD_SPEC_PLAIN;
    p->since_draft = 0;
    return QD_SPEC_PROBE;
}
