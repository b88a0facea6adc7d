/* Model-level equivalences on the fixture checkpoints:
 *   - prefill(n) then k decode steps == prefill(n+k) at the last k positions
 *   - token-by-token (recurrent GDN) == one prefill (chunked GDN)
 *   - a prompt prefilled in uneven chunks == one prefill
 *   - two sequences in one batch (also prefill mixed with decode) == each alone
 *   - a reset slot behaves like a fresh one */
#include <string.h>

#include "qd_fixtures.h"
#include "qd_test.h"
#include "qdelta.h"

/* fp32 end to end, each position relative to its max|logit|. Rounding differs between the
 * recurrent and chunked GDN forms, between chunkings and between the GEMV and GEMM products;
 * on the tied-embedding fixture (max logit 3.4) this reaches ~4e-4, as transformers' own fp32
 * paths differ by ~2e-4 absolute there. The op-level test (test_gdn) holds chunked ==
 * recurrent to 1e-4. A random prompt can also meet a position where the fixture's random
 * weights are ill-conditioned: seed 1796584416 puts one at position 32, where noise of 1e-7
 * relative (fp32 rounding) on the first GDN layer's q, k, v moves transformers' fp64 logits
 * by up to 7.6e-4 (six draws) against ~1.5e-6 at position 20, and our token-by-token and
 * prefill paths, each within rounding everywhere else, differ there by 2.4e-3 (either path's
 * distance from fp64 a draw of that lottery; transformers' fp32 prefill drew 1e-5). Such
 * spikes are single positions; real bugs (a wrong state handed on, a chunk boundary) show
 * 1e-2 and up or spread over the positions after them. So: every position within TOL_ANY,
 * and at most one position in SPIKE_EVERY (and at least one) beyond TOL.
 *
 * An MoE fixture has one more lottery: where a position's k-th and (k+1)-th router logits
 * are within rounding of each other, two correct paths can pick different experts there and
 * that position moves by 1e-2 to 1e-1 (seed 1796675490: 0.134 at one position of 150, the
 * rest within 1e-5; about one run in 200). A near-tie is a property of the prompt, a bug is
 * not: a failing draw on an MoE fixture is redrawn with fresh prompts, at most MOE_DRAWS in
 * all, and the fixture fails only if every draw fails. */
#define TOL 1e-3
#define TOL_ANY 1e-2
#define SPIKE_EVERY 64
#define MOE_DRAWS 3

static qd_test_rng rng;

static double rel_diff(const float *a, const float *b, size_t n) {
    double mx = 1e-30, err = 0;
    for (size_t i = 0; i < n; i++) mx = fmax(mx, fabs(b[i]));
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]);
        if (!(d <= err)) err = d;
    }
    return err / mx;
}

/* Positions compared so far: the largest difference and how many exceed TOL. */
typedef struct {
    double max;
    int rows, over;
} equiv;

/* rows positions of V logits each: a against the reference b */
static void equiv_add(equiv *q, const float *a, const float *b, int rows, int V) {
    for (int r = 0; r < rows; r++) {
        const double e = rel_diff(a + (size_t)r * V, b + (size_t)r * V, (size_t)V);
        if (!(e <= q->max)) q->max = e;
        q->over += !(e < TOL);
        q->rows++;
    }
}

static int equiv_ok(const equiv *q) { return q->max < TOL_ANY && q->over <= 1 + q->rows / SPIKE_EVERY; }

/* The comparisons of one draw of prompts, by name. */
#define DRAW_MAX 8
typedef struct {
    const char *what[DRAW_MAX];
    equiv q[DRAW_MAX];
    int n;
} draw;

static void draw_add(draw *d, const char *what, const equiv *q) {
    CHECKF(d->n < DRAW_MAX, "more than %d comparisons in a draw: %s not kept", DRAW_MAX, what);
    if (d->n < DRAW_MAX) {
        d->what[d->n] = what;
        d->q[d->n++] = *q;
    }
}

static int draw_ok(const draw *d) {
    for (int i = 0; i < d->n; i++)
        if (!equiv_ok(&d->q[i])) return 0;
    return 1;
}

static void draw_print(const char *dir, const draw *d) {
    for (int i = 0; i < d->n; i++)
        printf("  %s: %s rel %.2e (%d of %d positions over %.0e)\n", dir, d->what[i], d->q[i].max, d->q[i].over,
               d->q[i].rows, TOL);
}

static void draw_check(const char *dir, const draw *d) {
    draw_print(dir, d);
    for (int i = 0; i < d->n; i++) {
        const equiv *q = &d->q[i];
        CHECKF(equiv_ok(q), "%s: %s: max %g, %d of %d positions over %g", dir, d->what[i], q->max, q->over, q->rows,
               TOL);
    }
}

static qd_context *make_ctx(qd_model *m, int seqs, int ctx_len, int batch) {
    qd_context_params cp = {.max_seqs = seqs, .max_ctx = ctx_len, .max_batch = batch};
    qd_context *c = NULL;
    if (qd_context_create(m, &cp, &c) != QD_OK) fprintf(stderr, "context: %s\n", qd_model_errmsg(m));
    return c;
}

/* logits of every position of ids[0..n) from one prefill into a fresh context */
static float *prefill_all(qd_model *m, const int32_t *ids, int n) {
    int V = qd_model_vocab_size(m);
    qd_context *c = make_ctx(m, 1, n, n);
    float *out = malloc(sizeof(float) * (size_t)n * V);
    qd_span s = {0, ids, n, QD_LOGITS_ALL};
    CHECK(qd_forward(c, &s, 1, out) == QD_OK);
    qd_context_free(c);
    return out;
}

/* Every comparison on one fresh draw of two prompts into *d. */
static void run_draw(qd_model *m, draw *d) {
    const int V = qd_model_vocab_size(m);
    const int N = 150, K = 5;
    int32_t a[160], b[160];
    for (int i = 0; i < 160; i++) {
        a[i] = (int32_t)(qd_test_next(&rng) % (uint64_t)V);
        b[i] = (int32_t)(qd_test_next(&rng) % (uint64_t)V);
    }
    float *ref_a = prefill_all(m, a, N + K), *ref_b = prefill_all(m, b, N);
    float *row = malloc(sizeof(float) * (size_t)(N + K) * V * 2);

    /* prefill(N) + K decode steps == prefill(N+K) */
    qd_context *c = make_ctx(m, 2, N + K, N + K);
    qd_span s = {0, a, N, QD_LOGITS_LAST};
    CHECK(qd_forward(c, &s, 1, row) == QD_OK);
    equiv q = {0};
    equiv_add(&q, row, ref_a + (size_t)(N - 1) * V, 1, V);
    for (int k = 0; k < K; k++) {
        qd_span d = {0, &a[N + k], 1, QD_LOGITS_LAST};
        CHECK(qd_forward(c, &d, 1, row) == QD_OK);
        equiv_add(&q, row, ref_a + (size_t)(N + k) * V, 1, V);
    }
    draw_add(d, "prefill+decode vs prefill", &q);

    /* token by token == one prefill */
    CHECK(qd_seq_reset(c, 0) == QD_OK);
    q = (equiv){0};
    for (int t = 0; t < 70; t++) {
        qd_span d = {0, &a[t], 1, QD_LOGITS_LAST};
        CHECK(qd_forward(c, &d, 1, row) == QD_OK);
        equiv_add(&q, row, ref_a + (size_t)t * V, 1, V);
    }
    draw_add(d, "token-by-token vs prefill", &q);

    /* uneven chunks: 64 + 1 + 20 + 65 == one prefill of 150 (after a reset slot) */
    CHECK(qd_seq_reset(c, 0) == QD_OK);
    const int chunks[] = {64, 1, 20, 65};
    int off = 0;
    q = (equiv){0};
    for (int i = 0; i < 4; i++) {
        qd_span d = {0, a + off, chunks[i], QD_LOGITS_ALL};
        CHECK(qd_forward(c, &d, 1, row) == QD_OK);
        equiv_add(&q, row, ref_a + (size_t)off * V, chunks[i], V);
        off += chunks[i];
    }
    draw_add(d, "chunked prefill vs prefill", &q);
    qd_context_free(c);

    /* two sequences in one batch == each alone; then a mixed prefill + decode batch */
    c = make_ctx(m, 2, N + K, 2 * N + K);
    qd_span two[2] = {{1, b, N, QD_LOGITS_ALL}, {0, a, N, QD_LOGITS_ALL}};
    CHECK(qd_forward(c, two, 2, row) == QD_OK);
    equiv qb = {0}, qa = {0};
    equiv_add(&qb, row, ref_b, N, V);
    equiv_add(&qa, row + (size_t)N * V, ref_a, N, V);
    draw_add(d, "batched vs single (first)", &qb);
    draw_add(d, "batched vs single (second)", &qa);
    CHECK(qd_seq_reset(c, 1) == QD_OK);
    qd_span mixed[2] = {{0, &a[N], 1, QD_LOGITS_LAST}, {1, b, 40, QD_LOGITS_ALL}};
    CHECK(qd_forward(c, mixed, 2, row) == QD_OK);
    q = (equiv){0};
    equiv_add(&q, row, ref_a + (size_t)N * V, 1, V);
    equiv_add(&q, row + V, ref_b, 40, V);
    draw_add(d, "mixed decode+prefill vs single", &q);

    /* errors: out-of-range token, duplicate sequence, over-long span; state untouched */
    int32_t bad = V;
    qd_span sb = {0, &bad, 1, QD_LOGITS_LAST};
    CHECK(qd_forward(c, &sb, 1, row) == QD_ERR_INVALID_ARG);
    CHECK(strstr(qd_context_errmsg(c), "out of range") != NULL);
    qd_span dup[2] = {{0, a, 1, QD_LOGITS_NONE}, {0, b, 1, QD_LOGITS_NONE}};
    CHECK(qd_forward(c, dup, 2, row) == QD_ERR_INVALID_ARG);
    qd_span lng = {0, a, N + K, QD_LOGITS_NONE};
    CHECK(qd_forward(c, &lng, 1, row) == QD_ERR_CAPACITY);
    CHECK(qd_seq_length(c, 0) == N + 1);
    qd_context_free(c);

    free(ref_a);
    free(ref_b);
    free(row);
}

static void check_model(const char *dir) {
    qd_model *m = qd_fixture_load(dir, QD_BACKEND_CPU, 1);
    if (!m) return;
    const int draws = qd_model_experts(m) > 0 ? MOE_DRAWS : 1;
    draw d;
    for (int i = 0; i < draws; i++) {
        d = (draw){0};
        run_draw(m, &d);
        if (draw_ok(&d)) break;
        if (i + 1 < draws) {
            draw_print(dir, &d);
            printf("  %s: draw %d of the prompts failed above (a router near-tie?): drawing again\n", dir, i + 1);
        }
    }
    draw_check(dir, &d);
    qd_model_free(m);
}

int main(void) {
    rng = qd_test_rng_from_env();
    char *dirs[64];
    /* fp32 storage: the tightest comparisons */
    const int n = qd_fixture_dirs_named("_f32", "config.json", dirs, 64);
    CHECKF(n >= 0, "no tests/fixtures (run from the repository root)");
    CHECKF(n >= 3, "expected at least 3 f32 fixtures, found %d", n);
    for (int i = 0; i < n; i++) {
        check_model(dirs[i]);
        free(dirs[i]);
    }
    return qd_test_finish("test_equivalence");
}
