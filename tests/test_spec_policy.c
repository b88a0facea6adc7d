/* The speculative drafting policy (src/runtime/spec_policy.h) on synthetic steps:
 *   - the mean tokens of a verify span from the kept drafts by position, recent steps
 *     weighing most;
 *   - the draft phase's cost: a linear fit over varied batch sizes recovers it; one batch
 *     size scales in proportion; unknown before QD_SPEC_POLICY_MIN_STEPS drafting steps;
 *   - the decision: a GPU-like cost (rows nearly free beside a large fixed step cost)
 *     drafts at batch 1 and 32 with a good acceptance; a CPU-like cost (rows cost in
 *     proportion) does not at batch 16; drafts never kept never pay; before the drafts are
 *     measured it drafts; every QD_SPEC_PROBE_EVERY-th step makes the other choice than
 *     the model's, either way (among plain steps a probe: one request drafts); while the
 *     step cost model has never told the fixed cost from a row's, every
 *     QD_SPEC_EXPLORE_EVERY-th step does not draft, and once it has, the last costs it told
 *     apart stand while it cannot;
 *   - the closed loop of a batch's prefill step, then decode steps (the engine's steps fed
 *     back into a fresh step cost model: one batch size, so past the prefill only the
 *     policy's own choices vary the rows): it learns the costs, then drafts on a GPU-like
 *     cost at batch 1 and does not on a CPU-like cost at batch 16. */
#include <math.h>
#include <string.h>

#include "qd_test.h"
#include "runtime/spec_policy.h"

/* A step cost model fitted on steps of a + b P + c D ms. */
static qd_step_cost fitted(double a, double b, double c) {
    qd_step_cost m;
    memset(&m, 0, sizeof m);
    for (int i = 0; i < 40; i++) {
        const int P = (i % 3) * 700, D = 1 + (i * 7) % 64;
        qd_step_cost_add(&m, P, D, a + b * P + c * D);
    }
    return m;
}

/* k = 2 drafts; each step `requests` verifies keeping fractions f0, f1, its drafts
 * costing m0 + m1 x requests ms. */
static void feed(qd_spec_policy *p, int steps, int requests, double f0, double f1, double m0, double m1) {
    for (int s = 0; s < steps; s++) {
        const int kept[2] = {(int)lround(f0 * requests), (int)lround(f1 * requests)};
        qd_spec_policy_observe(p, requests, kept, 2, requests, m0 + m1 * requests);
    }
}

/* A prefill step of 64 B prompt tokens (a + 0.01 ms a token), then `steps` decode-only
 * engine steps: B requests, k = 2 drafts kept at fractions 0.7 and 0.5 (a probe's one
 * request: the first kept), forwards of a + c D ms (D: B, B (k + 1) when all draft, B + k
 * on a probe) and drafts of 0.3 + 0.02 x drafting ms. Returns the steps among the last
 * `last` where any request drafted. */
static int closed_loop(double a, double c, int B, int steps, int last, int *costs_known) {
    qd_spec_policy p;
    qd_step_cost cost;
    memset(&p, 0, sizeof p);
    memset(&cost, 0, sizeof cost);
    int drafted = 0;
    qd_step_cost_add(&cost, 64 * B, 0, a + 0.01 * 64 * B);
    for (int s = 0; s < steps; s++) {
        const qd_spec_choice d = qd_spec_policy_decide(&p, &cost, B, 2);
        const int n_draft = d == QD_SPEC_DRAFT ? B : d == QD_SPEC_PROBE ? 1 : 0;
        const int D = B + 2 * n_draft;
        qd_step_cost_add(&cost, 0, D, a + c * D);
        const int all = d == QD_SPEC_DRAFT;
        const int kept[2] = {all ? (int)lround(0.7 * B) : n_draft, all ? (int)lround(0.5 * B) : 0};
        qd_spec_policy_observe(&p, n_draft, kept, 2, n_draft, 0.3 + 0.02 * n_draft);
        drafted += n_draft > 0 && s >= steps - last;
    }
    *costs_known = p.costs_known;
    return drafted;
}

int main(void) {
    /* mean tokens */
    qd_spec_policy p;
    memset(&p, 0, sizeof p);
    CHECK(qd_spec_policy_mean_tokens(&p, 2) == 0.0);
    CHECK(qd_spec_policy_draft_ms(&p, 4) < 0);
    feed(&p, 50, 10, 0.7, 0.5, 1.0, 0.0);
    CHECKF(fabs(qd_spec_policy_mean_tokens(&p, 2) - 2.2) < 1e-9, "mean tokens %.6f, want 2.2",
           qd_spec_policy_mean_tokens(&p, 2));
    feed(&p, 200, 10, 0.2, 0.0, 1.0, 0.0); /* the text changed: the old steps fade */
    CHECKF(fabs(qd_spec_policy_mean_tokens(&p, 2) - 1.2) < 0.01, "mean tokens after a change %.4f, want ~1.2",
           qd_spec_policy_mean_tokens(&p, 2));

    /* draft cost: linear over varied batches, proportional over one */
    memset(&p, 0, sizeof p);
    for (int s = 0; s < 3; s++) qd_spec_policy_observe(&p, 4, (const int[2]){2, 1}, 2, 4, 1.0);
    CHECK(qd_spec_policy_draft_ms(&p, 4) < 0); /* fewer than QD_SPEC_POLICY_MIN_STEPS */
    memset(&p, 0, sizeof p);
    for (int s = 0; s < 40; s++) {
        const int B = 1 + (s * 5) % 48;
        qd_spec_policy_observe(&p, B, (const int[2]){0, 0}, 2, B, 0.8 + 0.05 * B);
    }
    CHECKF(fabs(qd_spec_policy_draft_ms(&p, 100) - 5.8) < 1e-6, "draft ms at 100: %.6f, want 5.8",
           qd_spec_policy_draft_ms(&p, 100));
    memset(&p, 0, sizeof p);
    feed(&p, 20, 8, 0.5, 0.2, 2.0, 0.0);
    CHECKF(fabs(qd_spec_policy_draft_ms(&p, 8) - 2.0) < 1e-9 && fabs(qd_spec_policy_draft_ms(&p, 16) - 4.0) < 1e-9,
           "one batch size: %.4f at 8, %.4f at 16", qd_spec_policy_draft_ms(&p, 8), qd_spec_policy_draft_ms(&p, 16));

    /* decisions */
    const qd_step_cost gpu = fitted(3.2, 0.02, 0.004), cpu = fitted(0.8, 0.05, 0.6);
    qd_step_cost unready;
    memset(&unready, 0, sizeof unready);
    CHECK(gpu.ready && cpu.ready);
    qd_spec_policy good, never;
    memset(&good, 0, sizeof good);
    memset(&never, 0, sizeof never);
    CHECK(qd_spec_policy_decide(&good, &gpu, 1, 2) == QD_SPEC_DRAFT); /* nothing measured yet */
    for (int s = 0; s < 20; s++) {
        const int B = s % 2 ? 1 : 32;
        qd_spec_policy_observe(&good, B, (const int[2]){(int)(0.7 * B), (int)(0.5 * B)}, 2, B, 0.3 + 0.02 * B);
        qd_spec_policy_observe(&never, B, (const int[2]){0, 0}, 2, B, 0.3 + 0.02 * B);
    }
    CHECK(qd_spec_policy_decide(&good, &gpu, 1, 2) == QD_SPEC_DRAFT);
    CHECK(qd_spec_policy_decide(&good, &gpu, 32, 2) == QD_SPEC_DRAFT);
    /* the model says draft: a plain step every QD_SPEC_PROBE_EVERY-th, the first after the two above */
    int drafted = 0, plain = 0, calls = 3 * QD_SPEC_PROBE_EVERY;
    for (int s = 0; s < calls; s++) {
        const qd_spec_choice d = qd_spec_policy_decide(&good, &gpu, 1, 2);
        drafted += d == QD_SPEC_DRAFT;
        plain += d == QD_SPEC_PLAIN;
    }
    CHECKF(drafted == calls - calls / QD_SPEC_PROBE_EVERY && plain == calls / QD_SPEC_PROBE_EVERY,
           "GPU-like costs, 1 request: drafted %d and plain %d of %d steps, want %d", drafted, plain, calls,
           calls - calls / QD_SPEC_PROBE_EVERY);
    /* a step cost model that has never told a from c: every QD_SPEC_EXPLORE_EVERY-th step plain */
    qd_spec_policy fresh = good;
    fresh.costs_known = 0;
    drafted = 0;
    for (int s = 0; s < 5 * QD_SPEC_EXPLORE_EVERY; s++) drafted += qd_spec_policy_decide(&fresh, &unready, 16, 2) != 0;
    CHECKF(drafted == 5 * (QD_SPEC_EXPLORE_EVERY - 1), "step costs never apart: drafted %d of %d steps", drafted,
           5 * QD_SPEC_EXPLORE_EVERY);
    /* ... one that told them apart before keeps deciding by the costs it told apart (the
     * GPU-like ones: 1 request drafts but for its plain probes) */
    drafted = 0;
    for (int s = 0; s < calls; s++) drafted += qd_spec_policy_decide(&good, &unready, 1, 2) == QD_SPEC_DRAFT;
    CHECKF(drafted == calls - calls / QD_SPEC_PROBE_EVERY, "step costs apart before: drafted %d of %d steps", drafted,
           calls);
    /* CPU-like, 16 requests: a + 3 c 16 + drafts = 30.2 ms against 2.15 x (a + 16 c) = 22.4;
     * every QD_SPEC_PROBE_EVERY-th step a probe, no step where all draft */
    int probes = 0;
    drafted = 0;
    for (int s = 0; s < calls; s++) {
        const qd_spec_choice d = qd_spec_policy_decide(&good, &cpu, 16, 2);
        drafted += d == QD_SPEC_DRAFT;
        probes += d == QD_SPEC_PROBE;
    }
    CHECKF(drafted == 0 && probes == calls / QD_SPEC_PROBE_EVERY,
           "CPU-like costs, 16 requests: %d drafting steps and %d probes of %d steps, want 0 and %d", drafted, probes,
           calls, calls / QD_SPEC_PROBE_EVERY);
    /* drafts that are never kept never pay, even where rows are nearly free */
    probes = drafted = 0;
    for (int s = 0; s < calls; s++) {
        const qd_spec_choice d = qd_spec_policy_decide(&never, &gpu, 1, 2);
        drafted += d == QD_SPEC_DRAFT;
        probes += d == QD_SPEC_PROBE;
    }
    CHECKF(drafted == 0 && probes == calls / QD_SPEC_PROBE_EVERY, "drafts never kept: %d drafting steps, %d probes",
           drafted, probes);

    /* the closed loop: a GPU-like cost at batch 1 drafts (3.2 x 2.2 = 7.05 ms of plain steps
     * against 3.21 + 0.32 of a verify step and its drafts), a CPU-like one at batch 16 does
     * not (10.4 x 2.2 = 22.9 against 29.6 + 0.62), each but for its probes */
    int known = 0;
    const int loop = 400, last = 4 * QD_SPEC_PROBE_EVERY;
    drafted = closed_loop(3.2, 0.004, 1, loop, last, &known);
    CHECKF(known && drafted >= last - last / QD_SPEC_PROBE_EVERY - 1,
           "closed loop, GPU-like, 1 request: costs known %d, drafted %d of the last %d steps", known, drafted, last);
    drafted = closed_loop(0.8, 0.6, 16, loop, last, &known);
    CHECKF(known && drafted <= last / QD_SPEC_PROBE_EVERY + 1,
           "closed loop, CPU-like, 16 requests: costs known %d, drafted %d of the last %d steps", known, drafted, last);
    return qd_test_finish("test_spec_policy");
}
