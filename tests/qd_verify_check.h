/* The K-token verify + rollback check of spec 4.4, one sequence of steps for any backend
 * (tests/test_verify.c on the CPU, tests/test_cuda_spec.c on CUDA): a verify span of the
 * last accepted token and drafts inside one ragged forward beside a prefill chunk and a
 * plain decode, qd_seq_accept keeping a prefix, a verify kept whole, a decode after the
 * rollback, a reject of all but the bonus token; against feeding the kept tokens one at a
 * time: the logit rows, the next decode's logits, and in batch-invariant mode the whole
 * GDN / conv state byte for byte. */
#ifndef QD_VERIFY_CHECK_H
#define QD_VERIFY_CHECK_H

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "model/model.h" /* qd_seq_state_save: the state compared byte for byte */
#include "qd_test.h"
#include "qdelta.h"

#define QD_VERIFY_PROMPT 64 /* prompt ids */
#define QD_VERIFY_DEC 6     /* greedy continuation ids used */

/* How close a backend's rows must be outside batch-invariant mode (where they must be
 * equal bit for bit): within rel x max|ref|, and with the same argmax when same_argmax. */
typedef struct qd_verify_tol {
    double rel;
    int same_argmax;
} qd_verify_tol;

static inline double qd_verify_max_abs(const float *x, size_t n) {
    double m = 1e-30;
    for (size_t i = 0; i < n; i++) m = fmax(m, fabs(x[i]));
    return m;
}

static inline int qd_verify_rows_match(const float *got, const float *ref, int n_rows, int V, int exact,
                                       qd_verify_tol tol) {
    const size_t n = (size_t)n_rows * V;
    if (exact) return qd_test_max_diff(got, ref, n) == 0;
    if (qd_test_max_diff(got, ref, n) > tol.rel * qd_verify_max_abs(ref, n)) return 0;
    for (int r = 0; tol.same_argmax && r < n_rows; r++)
        if (qd_test_argmax(got + (size_t)r * V, V) != qd_test_argmax(ref + (size_t)r * V, V)) return 0;
    return 1;
}

static inline qd_status qd_verify_forward(qd_context *ctx, const qd_span *sp, int n, const uint8_t *verify,
                                          float *logits) {
    const qd_forward_args a = {.spans = sp, .n_spans = n, .verify = verify, .logits = logits};
    return qd_forward_ex(ctx, &a);
}

/* Runs the check on m (a context of 4 sequences with speculative_tokens 4) and returns
 * the context for the caller's own cases (sequence 2's last forward was a plain decode),
 * or NULL when it could not be made; *next_err / *next_max: the decode after the
 * rollback, its largest difference from plain decoding and max|logit|. */
static inline qd_context *qd_verify_rollback(const char *dir, qd_model *m, const int32_t *prompt, const int32_t *dec,
                                             int invariant, qd_verify_tol tol, double *next_err, double *next_max) {
    const int V = qd_model_vocab_size(m), NP = QD_VERIFY_PROMPT;
    qd_context_params cp = qd_context_default_params();
    cp.max_seqs = 4;
    cp.max_ctx = 160;
    cp.max_batch = 4 * 160;
    cp.speculative_tokens = 4;
    cp.batch_invariant = invariant;
    qd_context *ctx = NULL;
    CHECKF(qd_context_create(m, &cp, &ctx) == QD_OK, "%s: %s", dir, qd_model_errmsg(m));
    if (!ctx) return NULL;
    float *plain = malloc(sizeof(float) * QD_VERIFY_DEC * V), *got = malloc(sizeof(float) * 8 * V);
    float *scratch = malloc(sizeof(float) * 8 * V);
    const size_t ssz = qd_seq_state_size(ctx);
    unsigned char *s0 = malloc(ssz), *s1 = malloc(ssz);

    /* plain: sequence 0, prompt then the decode tokens one at a time */
    qd_span p0 = {.seq = 0, .tokens = prompt, .n_tokens = NP, .logits = QD_LOGITS_LAST};
    CHECK(qd_verify_forward(ctx, &p0, 1, NULL, scratch) == QD_OK);
    for (int k = 0; k < QD_VERIFY_DEC; k++) {
        qd_span d = {.seq = 0, .tokens = &dec[k], .n_tokens = 1, .logits = QD_LOGITS_LAST};
        CHECK(qd_verify_forward(ctx, &d, 1, NULL, plain + (size_t)k * V) == QD_OK);
    }
    /* speculative: sequences 1 and 2 get the prompt */
    qd_span pp[2] = {{.seq = 1, .tokens = prompt, .n_tokens = NP, .logits = QD_LOGITS_LAST},
                     {.seq = 2, .tokens = prompt, .n_tokens = NP, .logits = QD_LOGITS_LAST}};
    CHECK(qd_verify_forward(ctx, pp, 2, NULL, scratch) == QD_OK);
    /* one ragged step: sequence 1 verifies [dec0, dec1, dec2, wrong, wrong], sequence 2
     * decodes dec0, sequence 3 prefills a chunk */
    int32_t span1[5] = {dec[0], dec[1], dec[2], (dec[3] + 1) % V, (dec[4] + 7) % V};
    qd_span mix[3] = {{.seq = 3, .tokens = prompt, .n_tokens = NP, .logits = QD_LOGITS_NONE},
                      {.seq = 1, .tokens = span1, .n_tokens = 5, .logits = QD_LOGITS_ALL},
                      {.seq = 2, .tokens = &dec[0], .n_tokens = 1, .logits = QD_LOGITS_LAST}};
    const uint8_t verify[3] = {0, 1, 0};
    CHECKF(qd_verify_forward(ctx, mix, 3, verify, got) == QD_OK, "%s: %s", dir, qd_context_errmsg(ctx));
    CHECKF(qd_verify_rows_match(got, plain, 3, V, invariant, tol),
           "%s (invariant %d): verify rows differ from plain decode by %g of %g", dir, invariant,
           qd_test_max_diff(got, plain, 3 * (size_t)V), qd_verify_max_abs(plain, 3 * (size_t)V));
    CHECKF(qd_verify_rows_match(got + (size_t)5 * V, plain, 1, V, invariant, tol),
           "%s (invariant %d): the plain decode beside the verify differs", dir, invariant);
    CHECK(qd_seq_length(ctx, 1) == NP + 5);
    CHECK(qd_seq_accept(ctx, 1, 3) == QD_OK && qd_seq_length(ctx, 1) == NP + 3);
    CHECK(qd_seq_accept(ctx, 1, 3) == QD_ERR_INVALID_ARG); /* accepted already */

    /* the next verify [dec3, dec4] is kept whole; then a plain decode of dec5 */
    qd_span v2 = {.seq = 1, .tokens = &dec[3], .n_tokens = 2, .logits = QD_LOGITS_ALL};
    const uint8_t one = 1;
    CHECK(qd_verify_forward(ctx, &v2, 1, &one, got) == QD_OK);
    CHECKF(qd_verify_rows_match(got, plain + (size_t)3 * V, 2, V, invariant, tol),
           "%s (invariant %d): second verify differs by %g", dir, invariant,
           qd_test_max_diff(got, plain + (size_t)3 * V, 2 * (size_t)V));
    CHECK(qd_seq_accept(ctx, 1, 2) == QD_OK);
    qd_span d5 = {.seq = 1, .tokens = &dec[5], .n_tokens = 1, .logits = QD_LOGITS_LAST};
    CHECK(qd_verify_forward(ctx, &d5, 1, NULL, got) == QD_OK);
    *next_err = qd_test_max_diff(got, plain + (size_t)5 * V, V);
    *next_max = qd_verify_max_abs(plain + (size_t)5 * V, V);
    CHECKF(qd_verify_rows_match(got, plain + (size_t)5 * V, 1, V, invariant, tol),
           "%s (invariant %d): decode after the rollback differs by %g of %g", dir, invariant, *next_err, *next_max);
    CHECK(qd_seq_length(ctx, 0) == qd_seq_length(ctx, 1));
    CHECK(qd_seq_state_save(ctx, 0, s0, ssz) == QD_OK && qd_seq_state_save(ctx, 1, s1, ssz) == QD_OK);
    if (invariant) CHECKF(memcmp(s0, s1, ssz) == 0, "%s: GDN state after verify + rollback differs from plain", dir);

    /* a reject of everything but the first token (the bonus-only case) */
    qd_span v3 = {.seq = 1, .tokens = span1, .n_tokens = 4, .logits = QD_LOGITS_ALL};
    CHECK(qd_verify_forward(ctx, &v3, 1, &one, got) == QD_OK);
    CHECK(qd_seq_accept(ctx, 1, 1) == QD_OK && qd_seq_length(ctx, 0) + 1 == qd_seq_length(ctx, 1));
    free(plain);
    free(got);
    free(scratch);
    free(s0);
    free(s1);
    return ctx;
}

#endif
