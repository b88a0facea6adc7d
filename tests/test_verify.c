/* K-token verify with rollback (spec 4.4) on the CPU backend, on every fixture checkpoint:
 * a verify span of the last accepted token and drafts, inside one ragged forward next to a
 * prefill chunk and a plain decode, then qd_seq_accept keeping a prefix, gives exactly what
 * feeding the kept tokens one at a time gives: the logit rows, the logits of the next
 * decode, and the whole GDN / conv state (bit for bit in batch-invariant mode; within 1e-5
 * of max|logit| with equal argmax otherwise). And the errors of misuse. */
#include <string.h>

#include "model/model.h" /* qd_seq_state_save: the state compared byte for byte */
#include "qd_fixtures.h"
#include "qd_test.h"
#include "qdelta.h"

#define N_PROMPT 64
#define N_DEC 6


/* Rows equal: bit for bit when exact, else within tol x max|ref| and the same argmax. */
static int rows_match(const float *got, const float *ref, int n_rows, int V, int exact) {
    if (exact) return qd_test_max_diff(got, ref, (size_t)n_rows * V) == 0;
    double mx = 1e-30;
    for (size_t i = 0; i < (size_t)n_rows * V; i++) mx = fmax(mx, fabs(ref[i]));
    if (qd_test_max_diff(got, ref, (size_t)n_rows * V) > 1e-5 * mx) return 0;
    for (int r = 0; r < n_rows; r++)
        if (qd_test_argmax(got + (size_t)r * V, V) != qd_test_argmax(ref + (size_t)r * V, V)) return 0;
    return 1;
}

static qd_status fwd_all(qd_context *ctx, const qd_span *sp, int n, const uint8_t *verify, float *logits) {
    const qd_forward_args a = {.spans = sp, .n_spans = n, .verify = verify, .logits = logits};
    return qd_forward_ex(ctx, &a);
}

static void check_model(const char *dir, qd_model *m, const int32_t *prompt, const int32_t *dec, int invariant) {
    const int V = qd_model_vocab_size(m);
    qd_context_params cp = qd_context_default_params();
    cp.max_seqs = 4;
    cp.max_ctx = 160;
    cp.max_batch = 4 * 160;
    cp.speculative_tokens = 4;
    cp.batch_invariant = invariant;
    qd_context *ctx = NULL;
    CHECKF(qd_context_create(m, &cp, &ctx) == QD_OK, "%s: %s", dir, qd_model_errmsg(m));
    if (!ctx) return;
    float *plain = malloc(sizeof(float) * N_DEC * V), *got = malloc(sizeof(float) * 8 * V);
    float *scratch = malloc(sizeof(float) * 8 * V);
    const size_t ssz = qd_seq_state_size(ctx);
    unsigned char *s0 = malloc(ssz), *s1 = malloc(ssz);

    /* plain: sequence 0, prompt then the decode tokens one at a time */
    qd_span p0 = {.seq = 0, .tokens = prompt, .n_tokens = N_PROMPT, .logits = QD_LOGITS_LAST};
    CHECK(fwd_all(ctx, &p0, 1, NULL, scratch) == QD_OK);
    for (int k = 0; k < N_DEC; k++) {
        qd_span d = {.seq = 0, .tokens = &dec[k], .n_tokens = 1, .logits = QD_LOGITS_LAST};
        CHECK(fwd_all(ctx, &d, 1, NULL, plain + (size_t)k * V) == QD_OK);
    }

    /* speculative: sequences 1 and 2 get the prompt */
    qd_span pp[2] = {{.seq = 1, .tokens = prompt, .n_tokens = N_PROMPT, .logits = QD_LOGITS_LAST},
                     {.seq = 2, .tokens = prompt, .n_tokens = N_PROMPT, .logits = QD_LOGITS_LAST}};
    CHECK(fwd_all(ctx, pp, 2, NULL, scratch) == QD_OK);
    /* one ragged step: sequence 1 verifies [dec0, dec1, dec2, wrong, wrong], sequence 2
     * decodes dec0, sequence 3 prefills a chunk */
    int32_t span1[5] = {dec[0], dec[1], dec[2], (dec[3] + 1) % V, (dec[4] + 7) % V};
    qd_span mix[3] = {{.seq = 3, .tokens = prompt, .n_tokens = N_PROMPT, .logits = QD_LOGITS_NONE},
                      {.seq = 1, .tokens = span1, .n_tokens = 5, .logits = QD_LOGITS_ALL},
                      {.seq = 2, .tokens = &dec[0], .n_tokens = 1, .logits = QD_LOGITS_LAST}};
    const uint8_t verify[3] = {0, 1, 0};
    CHECK(fwd_all(ctx, mix, 3, verify, got) == QD_OK);
    CHECKF(rows_match(got, plain, 3, V, invariant), "%s (invariant %d): verify rows differ from plain decode by %g",
           dir, invariant, qd_test_max_diff(got, plain, 3 * (size_t)V));
    CHECKF(rows_match(got + (size_t)5 * V, plain, 1, V, invariant), "%s: the plain decode beside the verify differs",
           dir);
    CHECK(qd_seq_length(ctx, 1) == N_PROMPT + 5);
    CHECK(qd_seq_accept(ctx, 1, 3) == QD_OK && qd_seq_length(ctx, 1) == N_PROMPT + 3);
    CHECK(qd_seq_accept(ctx, 1, 3) == QD_ERR_INVALID_ARG); /* accepted already */

    /* the next verify [dec3, dec4] is kept whole; then a plain decode of dec5 */
    qd_span v2 = {.seq = 1, .tokens = &dec[3], .n_tokens = 2, .logits = QD_LOGITS_ALL};
    const uint8_t one = 1;
    CHECK(fwd_all(ctx, &v2, 1, &one, got) == QD_OK);
    CHECKF(rows_match(got, plain + (size_t)3 * V, 2, V, invariant), "%s: second verify differs", dir);
    CHECK(qd_seq_accept(ctx, 1, 2) == QD_OK);
    qd_span d5 = {.seq = 1, .tokens = &dec[5], .n_tokens = 1, .logits = QD_LOGITS_LAST};
    CHECK(fwd_all(ctx, &d5, 1, NULL, got) == QD_OK);
    CHECKF(rows_match(got, plain + (size_t)5 * V, 1, V, invariant), "%s: decode after the rollback differs by %g", dir,
           qd_test_max_diff(got, plain + (size_t)5 * V, V));
    CHECK(qd_seq_length(ctx, 0) == qd_seq_length(ctx, 1));
    CHECK(qd_seq_state_save(ctx, 0, s0, ssz) == QD_OK && qd_seq_state_save(ctx, 1, s1, ssz) == QD_OK);
    if (invariant) CHECKF(memcmp(s0, s1, ssz) == 0, "%s: GDN state after verify + rollback differs from plain", dir);

    /* a reject of everything but the first token (the bonus-only case) */
    qd_span v3 = {.seq = 1, .tokens = span1, .n_tokens = 4, .logits = QD_LOGITS_ALL};
    CHECK(qd_seq_state_save(ctx, 1, s1, ssz) == QD_OK);
    CHECK(fwd_all(ctx, &v3, 1, &one, got) == QD_OK);
    CHECK(qd_seq_accept(ctx, 1, 1) == QD_OK && qd_seq_length(ctx, 0) + 1 == qd_seq_length(ctx, 1));

    /* misuse */
    int32_t five[6] = {1, 2, 3, 4, 5, 6};
    qd_span too_long = {.seq = 2, .tokens = five, .n_tokens = 6, .logits = QD_LOGITS_LAST};
    CHECK(fwd_all(ctx, &too_long, 1, &one, got) == QD_ERR_INVALID_ARG &&
          strstr(qd_context_errmsg(ctx), "speculative_tokens"));
    CHECK(qd_seq_accept(ctx, 2, 1) == QD_ERR_INVALID_ARG); /* its last forward was a plain decode */
    qd_span v4 = {.seq = 2, .tokens = five, .n_tokens = 3, .logits = QD_LOGITS_LAST};
    CHECK(fwd_all(ctx, &v4, 1, &one, got) == QD_OK);
    CHECK(qd_seq_accept(ctx, 2, 0) == QD_ERR_INVALID_ARG && qd_seq_accept(ctx, 2, 4) == QD_ERR_INVALID_ARG);
    CHECK(qd_seq_accept(ctx, 2, 3) == QD_OK);
    qd_context_free(ctx);

    /* a context without speculative_tokens refuses verify spans */
    cp.speculative_tokens = 0;
    CHECK(qd_context_create(m, &cp, &ctx) == QD_OK);
    if (ctx) {
        CHECK(fwd_all(ctx, &v4, 1, &one, got) == QD_ERR_INVALID_ARG);
        qd_context_free(ctx);
    }
    cp.speculative_tokens = 5;
    CHECK(qd_context_create(m, &cp, &ctx) == QD_ERR_INVALID_ARG);
    free(plain);
    free(got);
    free(scratch);
    free(s0);
    free(s1);
}

int main(void) {
    char *dirs[32];
    const int n = qd_fixture_dirs("prompt_64.ids", dirs, 32);
    CHECKF(n >= 4, "%d fixtures with prompt_64.ids", n);
    for (int i = 0; i < n; i++) {
        char path[1024], err[1024];
        int32_t prompt[N_PROMPT], dec[16];
        snprintf(path, sizeof path, "%s/prompt_64.ids", dirs[i]);
        char *t = qd_test_read_file(path, NULL);
        const int np = t ? qd_fixture_parse_ids(t, prompt, N_PROMPT) : 0;
        free(t);
        snprintf(path, sizeof path, "%s/greedy_64.ids", dirs[i]);
        t = qd_test_read_file(path, NULL);
        const int nd = t ? qd_fixture_parse_ids(t, dec, 16) : 0;
        free(t);
        CHECKF(np == N_PROMPT && nd >= N_DEC, "%s: prompt %d ids, greedy %d", dirs[i], np, nd);
        qd_model_params mp = qd_model_default_params();
        mp.path = dirs[i];
        mp.n_threads = 2;
        qd_model *m = NULL;
        if (np == N_PROMPT && nd >= N_DEC && qd_model_load(&mp, &m, err, sizeof err) == QD_OK) {
            check_model(dirs[i], m, prompt, dec, 1);
            check_model(dirs[i], m, prompt, dec, 0);
            printf("  %s: verify + rollback == plain decode\n", dirs[i]);
        } else {
            CHECKF(0, "%s: %s", dirs[i], err);
        }
        qd_model_free(m);
        free(dirs[i]);
    }
    return qd_test_finish("test_verify");
}
