/* qd_forward_ex's allow masks (qd_forward_args.allow: constrained greedy decoding decided
 * where the logits are). In one call that also returns every logits row, each masked
 * row's id and logprob must equal a naive reference on that row with its refused logits
 * at -inf (the lowest id of the largest allowed logit below vocab_limit, the log-softmax
 * over the allowed ids), an unmasked row's the plain argmax's, and a row with no allowed
 * id below vocab_limit must get -1 and -inf. A second context fed the same steps with no
 * logits buffer (the CPU's one-row path; on a GPU the serving engine's, no row copied)
 * must give the same ids. The steps: a prefill span whose 260 rows all want logits (more
 * than a CUDA context's logit chunk of 256, so the masks travel chunk by chunk) beside a
 * short one, then decodes, under vocab_limit = V and V - 100 (allowed padding ids must
 * never win). On the CPU, the CPU model split over 2 ranks (rank 0 computes the logits)
 * and the CUDA backend when a GPU is present. Bad masks are refused with a message and
 * change nothing. Default model (models/qdelta-tiny). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "qd_fixtures.h"
#include "qd_test.h"
#include "qdelta.h"

#define PREFILL 260
#define MAX_ROWS (PREFILL + 1)
#define DECODES 4

static qd_test_rng rng;

static int has(const uint32_t *m, int i) { return (m[i >> 5] >> (i & 31)) & 1; }
static void put(uint32_t *m, int i) { m[i >> 5] |= 1u << (i & 31); }

/* Mask k of a step by kind: a random third of the ids, the row's plain argmax refused
 * (so that the mask changes the answer), one id alone, nothing, only padding ids (>=
 * limit), or everything. */
static void make_mask(uint32_t *m, size_t W, int V, int limit, int kind, const float *row) {
    memset(m, 0, W * 4);
    int best = 0;
    for (int i = 1; i < limit; i++)
        if (row[i] > row[best]) best = i;
    if (kind == 0) {
        for (int i = 0; i < V; i++)
            if (qd_test_next(&rng) % 3 == 0) put(m, i);
        m[best >> 5] &= ~(1u << (best & 31));
    } else if (kind == 1) {
        put(m, (int)(qd_test_next(&rng) % (uint64_t)limit));
    } else if (kind == 3) {
        for (int i = limit; i < V; i++) put(m, i);
    } else if (kind == 4) {
        for (int i = 0; i < V; i++) put(m, i);
    } /* kind 2: nothing */
}

/* The reference of one row: id and logprob over the ids of [0, limit) that m allows
 * (all when m is NULL); -1 and -inf when none is. */
static int reference(const float *row, const uint32_t *m, int limit, double *lp) {
    int best = -1;
    for (int i = 0; i < limit; i++)
        if ((!m || has(m, i)) && (best < 0 || row[i] > row[best])) best = i;
    double se = 0;
    for (int i = 0; i < limit && best >= 0; i++)
        if (!m || has(m, i)) se += exp((double)row[i] - row[best]);
    *lp = best >= 0 ? -log(se) : -INFINITY;
    return best;
}

typedef struct step_buf {
    float *logits;      /* [MAX_ROWS][V] */
    uint32_t *masks;    /* [MAX_ROWS][W] */
    int32_t allow_row[MAX_ROWS], ids[MAX_ROWS], ids2[MAX_ROWS];
    float lps[MAX_ROWS], lps2[MAX_ROWS];
} step_buf;

/* One step of spans on both contexts: a with logits and masks, b with masks alone. The
 * masks are drawn against the step's logits, which a third context (probe, fed the
 * same steps) gives first. */
static void check_step(qd_context *a, qd_context *b, qd_context *probe, const qd_span *sp, int n_spans, int n_rows,
                       int V, int limit, step_buf *s, const char *what) {
    const size_t W = ((size_t)V + 31) / 32;
    /* the logits the masks are drawn against (the same step on a third context) */
    CHECKF(qd_forward(probe, sp, n_spans, s->logits) == QD_OK, "%s: probe forward: %s", what, qd_context_errmsg(probe));
    int n_allow = 0;
    for (int r = 0; r < n_rows; r++) {
        const int kind = (int)(qd_test_next(&rng) % 6);
        if (kind == 5) { /* unmasked */
            s->allow_row[r] = -1;
            continue;
        }
        if (r > 0 && kind == 0 && s->allow_row[r - 1] >= 0 && qd_test_next(&rng) % 4 == 0) {
            s->allow_row[r] = s->allow_row[r - 1]; /* a mask shared with the row before */
            continue;
        }
        make_mask(s->masks + (size_t)n_allow * W, W, V, limit, kind, s->logits + (size_t)r * V);
        s->allow_row[r] = n_allow++;
    }
    /* masks stored out of row order: reverse them and the indices */
    for (int k = 0; k < n_allow / 2; k++)
        for (size_t w = 0; w < W; w++) {
            uint32_t t = s->masks[(size_t)k * W + w];
            s->masks[(size_t)k * W + w] = s->masks[(size_t)(n_allow - 1 - k) * W + w];
            s->masks[(size_t)(n_allow - 1 - k) * W + w] = t;
        }
    for (int r = 0; r < n_rows; r++)
        if (s->allow_row[r] >= 0) s->allow_row[r] = n_allow - 1 - s->allow_row[r];
    memset(s->logits, 0, sizeof(float) * (size_t)n_rows * V);
    const qd_forward_args fa = {.spans = sp, .n_spans = n_spans, .vocab_limit = limit, .logits = s->logits,
                                .ids = s->ids, .logprobs = s->lps, .allow = s->masks, .n_allow = n_allow,
                                .allow_row = s->allow_row};
    CHECKF(qd_forward_ex(a, &fa) == QD_OK, "%s: forward with masks: %s", what, qd_context_errmsg(a));
    qd_forward_args fb = fa;
    fb.logits = NULL;
    fb.ids = s->ids2;
    fb.logprobs = s->lps2;
    CHECKF(qd_forward_ex(b, &fb) == QD_OK, "%s: forward with masks, no logits: %s", what, qd_context_errmsg(b));
    int masked = 0;
    for (int r = 0; r < n_rows; r++) {
        const uint32_t *m = s->allow_row[r] >= 0 ? s->masks + (size_t)s->allow_row[r] * W : NULL;
        double lp;
        const int want = reference(s->logits + (size_t)r * V, m, limit, &lp);
        masked += m != NULL;
        CHECKF(s->ids[r] == want, "%s row %d (mask %d): id %d, want %d", what, r, s->allow_row[r], s->ids[r], want);
        if (want < 0)
            CHECKF(isinf(s->lps[r]) && s->lps[r] < 0, "%s row %d: nothing allowed, logprob %g", what, r, s->lps[r]);
        else
            CHECKF(fabs(s->lps[r] - lp) <= 1e-5 + 1e-5 * fabs(lp), "%s row %d: logprob %.8g, want %.8g", what, r,
                   s->lps[r], lp);
        CHECKF(s->ids2[r] == s->ids[r], "%s row %d: id %d without the logits buffer, %d with", what, r, s->ids2[r],
               s->ids[r]);
        if (want >= 0)
            CHECKF(fabs(s->lps2[r] - s->lps[r]) <= 1e-5 + 1e-5 * fabs(lp), "%s row %d: logprob %.8g / %.8g", what, r,
                   s->lps2[r], s->lps[r]);
    }
    if (n_rows > 10) CHECKF(masked > 0 && masked < n_rows, "%s: %d of %d rows masked", what, masked, n_rows);
}

/* The prefill and decode script on three contexts of m. */
static void check_model(qd_model *m, const char *what) {
    const int V = qd_model_vocab_size(m);
    qd_context_params cp = qd_context_default_params();
    cp.max_seqs = 3;
    cp.max_ctx = PREFILL + DECODES + 8;
    cp.max_batch = PREFILL + 8;
    qd_context *a = NULL, *b = NULL, *probe = NULL;
    CHECKF(qd_context_create(m, &cp, &a) == QD_OK && qd_context_create(m, &cp, &b) == QD_OK &&
               qd_context_create(m, &cp, &probe) == QD_OK,
           "%s: contexts", what);
    step_buf s;
    s.logits = malloc(sizeof(float) * MAX_ROWS * (size_t)V);
    s.masks = malloc(sizeof(uint32_t) * MAX_ROWS * (((size_t)V + 31) / 32));
    int32_t toks[3][PREFILL + DECODES];
    for (int q = 0; q < 3; q++)
        for (int i = 0; i < PREFILL + DECODES; i++) toks[q][i] = (int32_t)(qd_test_next(&rng) % (uint64_t)V);
    if (a && b && probe && s.logits && s.masks) {
        char label[128];
        const qd_span pre[2] = {{0, toks[0], PREFILL, QD_LOGITS_ALL}, {1, toks[1], 7, QD_LOGITS_LAST}};
        snprintf(label, sizeof label, "%s prefill", what);
        check_step(a, b, probe, pre, 2, PREFILL + 1, V, V, &s, label);
        for (int d = 0; d < DECODES; d++) {
            const qd_span dec[3] = {{0, &toks[0][PREFILL + d], 1, QD_LOGITS_LAST},
                                    {1, &toks[1][7 + d], 1, QD_LOGITS_LAST},
                                    {2, &toks[2][d], 1, QD_LOGITS_LAST}};
            snprintf(label, sizeof label, "%s decode %d", what, d);
            check_step(a, b, probe, dec, 3, 3, V, d % 2 ? V - 100 : V, &s, label);
        }
    }
    free(s.logits);
    free(s.masks);
    qd_context_free(a);
    qd_context_free(b);
    qd_context_free(probe);
}

/* Masks that do not fit the batch are refused before anything runs. */
static void check_refusals(qd_model *m) {
    const int V = qd_model_vocab_size(m);
    qd_context_params cp = qd_context_default_params();
    cp.max_seqs = 2;
    cp.max_ctx = 32;
    cp.max_batch = 16;
    qd_context *c = NULL;
    CHECK(qd_context_create(m, &cp, &c) == QD_OK);
    if (!c) return;
    uint32_t *mask = calloc(((size_t)V + 31) / 32, 4);
    int32_t tok[2] = {1, 2}, ids[2];
    float lps[2];
    const qd_span sp[2] = {{0, tok, 1, QD_LOGITS_LAST}, {1, tok + 1, 1, QD_LOGITS_LAST}};
    struct {
        int32_t rows[2];
        int n_allow, null_allow, null_ids;
        const char *says;
    } bad[] = {
        {{0, 1}, 1, 0, 0, "allow_row[1] = 1"},
        {{-2, -1}, 1, 0, 0, "allow_row[0] = -2"},
        {{0, -1}, 0, 0, 0, "allow_row[0] = 0"},
        {{-1, -1}, -1, 0, 0, "n_allow -1"},
        {{0, -1}, 1, 1, 0, "allow is NULL"},
        {{0, -1}, 1, 0, 1, "without an ids buffer"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        const qd_forward_args fa = {.spans = sp, .n_spans = 2, .ids = bad[i].null_ids ? NULL : ids, .logprobs = NULL,
                                    .allow = bad[i].null_allow ? NULL : mask, .n_allow = bad[i].n_allow,
                                    .allow_row = bad[i].rows};
        CHECKF(qd_forward_ex(c, &fa) == QD_ERR_INVALID_ARG, "bad mask %zu accepted", i);
        CHECKF(strstr(qd_context_errmsg(c), bad[i].says) != NULL, "bad mask %zu: message '%s' names '%s'", i,
               qd_context_errmsg(c), bad[i].says);
        CHECKF(qd_seq_length(c, 0) == 0 && qd_seq_length(c, 1) == 0, "bad mask %zu: the sequences did not move", i);
    }
    /* the empty mask is no error: its row reports that nothing is allowed */
    const int32_t rows[2] = {0, -1};
    const qd_forward_args ok = {.spans = sp, .n_spans = 2, .ids = ids, .logprobs = lps, .allow = mask, .n_allow = 1,
                                .allow_row = rows};
    CHECKF(qd_forward_ex(c, &ok) == QD_OK, "empty mask: %s", qd_context_errmsg(c));
    CHECKF(ids[0] == -1 && isinf(lps[0]) && lps[0] < 0, "empty mask: id %d logprob %g", ids[0], lps[0]);
    CHECKF(ids[1] >= 0 && ids[1] < V && isfinite(lps[1]), "unmasked row beside it: id %d logprob %g", ids[1], lps[1]);
    free(mask);
    qd_context_free(c);
}

int main(void) {
    rng = qd_test_rng_from_env();
    const char *dir = "models/qdelta-tiny";
    qd_model *m = qd_fixture_load(dir, QD_BACKEND_CPU, 1);
    if (m) {
        check_model(m, "cpu");
        check_refusals(m);
    }
    qd_model_free(m);
    m = qd_fixture_load(dir, QD_BACKEND_CPU, 2);
    if (m) check_model(m, "cpu tp=2");
    qd_model_free(m);
    qd_device_info info;
    char err[256];
    if (qd_backend_device_info(QD_BACKEND_CUDA, &info, err, sizeof err) == QD_OK) {
        m = qd_fixture_load(dir, QD_BACKEND_CUDA, 1);
        if (m) check_model(m, "cuda");
        qd_model_free(m);
    }
    return qd_test_finish("test_forward_allow");
}
