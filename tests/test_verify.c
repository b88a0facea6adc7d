/* K-token verify with rollback (spec 4.4) on the CPU backend, on every fixture checkpoint:
 * a verify span of the last accepted token and drafts, inside one ragged forward next to a
 * prefill chunk and a plain decode, then qd_seq_accept keeping a prefix, gives exactly what
 * feeding the kept tokens one at a time gives: the logit rows, the logits of the next
 * decode, and the whole GDN / conv state (bit for bit in batch-invariant mode; within 1e-5
 * of max|logit| with equal argmax otherwise). And the errors of misuse. */
#include "qd_fixtures.h"
#include "qd_verify_check.h"

#define N_PROMPT QD_VERIFY_PROMPT
#define N_DEC QD_VERIFY_DEC

/* The shared check (within 1e-5 of max|logit| with equal argmax outside invariant mode),
 * then the errors of misuse. */
static void check_model(const char *dir, qd_model *m, const int32_t *prompt, const int32_t *dec, int invariant) {
    double e, mx;
    qd_context *ctx = qd_verify_rollback(dir, m, prompt, dec, invariant, (qd_verify_tol){1e-5, 1}, &e, &mx);
    if (!ctx) return;
    float *got = malloc(sizeof(float) * 8 * (size_t)qd_model_vocab_size(m));
    const uint8_t one = 1;
    int32_t five[6] = {1, 2, 3, 4, 5, 6};
    qd_span too_long = {.seq = 2, .tokens = five, .n_tokens = 6, .logits = QD_LOGITS_LAST};
    CHECK(qd_verify_forward(ctx, &too_long, 1, &one, got) == QD_ERR_INVALID_ARG &&
          strstr(qd_context_errmsg(ctx), "speculative_tokens"));
    CHECK(qd_seq_accept(ctx, 2, 1) == QD_ERR_INVALID_ARG); /* its last forward was a plain decode */
    qd_span v4 = {.seq = 2, .tokens = five, .n_tokens = 3, .logits = QD_LOGITS_LAST};
    CHECK(qd_verify_forward(ctx, &v4, 1, &one, got) == QD_OK);
    CHECK(qd_seq_accept(ctx, 2, 0) == QD_ERR_INVALID_ARG && qd_seq_accept(ctx, 2, 4) == QD_ERR_INVALID_ARG);
    CHECK(qd_seq_accept(ctx, 2, 3) == QD_OK);
    qd_context_free(ctx);
    free(got);
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
