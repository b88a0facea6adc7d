/* qd_forward_greedy_logprobs and qd_forward_mixed against qd_forward: the argmax of
 * each logit row over [0, vocab_limit) (padding ids past the limit never win) and its
 * log-softmax over that range equal what the full logits give, and the rows
 * qd_forward_mixed is asked for equal qd_forward's bit for bit, for a prefill and a
 * batch of decodes; bad arguments are refused with a message. CPU backend, embedded
 * default model (test_cuda_model checks the same on the GPU). */
#include <string.h>

#include "qd_test.h"
#include "qdelta.h"

static int argmax_upto(const float *x, int n) {
    int b = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return b;
}

int main(void) {
    qd_model_params mp = qd_model_default_params();
    mp.path = "models/qdelta-tiny";
    mp.n_threads = 2;
    qd_model *m = NULL;
    char err[512];
    CHECKF(qd_model_load(&mp, &m, err, sizeof err) == QD_OK, "load: %s", err);
    if (!m) return qd_test_finish("test_greedy");
    const int V = qd_model_vocab_size(m);
    qd_context_params cp = qd_context_default_params();
    cp.max_seqs = 6;
    cp.max_ctx = 128;
    cp.max_batch = 64;
    qd_context *a = NULL, *b = NULL, *c = NULL;
    CHECK(qd_context_create(m, &cp, &a) == QD_OK);
    CHECK(qd_context_create(m, &cp, &b) == QD_OK);
    CHECK(qd_context_create(m, &cp, &c) == QD_OK);
    qd_test_rng rng = qd_test_rng_from_env();
    int32_t prompt[3][20];
    for (int s = 0; s < 3; s++)
        for (int i = 0; i < 20; i++) prompt[s][i] = (int32_t)(qd_test_next(&rng) % (uint64_t)V);
    float *logits = malloc(sizeof(float) * 3 * (size_t)V), *mixed = malloc(sizeof(float) * 3 * (size_t)V);
    int32_t ids[3], mids[3];
    float lps[3], mlps[3];
    for (int round = 0; round < 2; round++) {
        const int limit = round == 0 ? V : V - 1000; /* the second round bounds the vocabulary */
        qd_span sp[3];
        for (int s = 0; s < 3; s++)
            sp[s] = round == 0 ? (qd_span){s, prompt[s], 20 - s, QD_LOGITS_LAST}
                               : (qd_span){s, &prompt[s][19 - s], 1, QD_LOGITS_LAST};
        CHECK(qd_forward(a, sp, 3, logits) == QD_OK);
        CHECK(qd_forward_greedy_logprobs(b, sp, 3, round == 0 ? 0 : limit, ids, lps) == QD_OK);
        /* the engine's step: rows 0 and 2 (round 0) or row 1 (round 1) wanted whole */
        const uint8_t full[2][3] = {{1, 0, 1}, {0, 1, 0}};
        memset(mixed, 0, sizeof(float) * 3 * (size_t)V);
        CHECK(qd_forward_mixed(c, sp, 3, round == 0 ? 0 : limit, full[round], mixed, mids, mlps) == QD_OK);
        for (int s = 0; s < 3; s++) {
            const float *row = logits + (size_t)s * V;
            const int want = argmax_upto(row, limit);
            double se = 0;
            for (int i = 0; i < limit; i++) se += exp((double)row[i] - row[want]);
            CHECKF(ids[s] == want, "round %d seq %d: argmax %d, want %d", round, s, ids[s], want);
            CHECKF(fabs(lps[s] + log(se)) <= 1e-5, "round %d seq %d: logprob %g, want %g", round, s, lps[s], -log(se));
            CHECKF(mids[s] == want && fabs(mlps[s] + log(se)) <= 1e-5, "round %d seq %d: mixed step: argmax %d (%g)",
                   round, s, mids[s], mlps[s]);
            if (full[round][s])
                CHECKF(!memcmp(mixed + (size_t)s * V, row, sizeof(float) * (size_t)V),
                       "round %d seq %d: mixed step's logits row differs from qd_forward's", round, s);
        }
    }
    /* logits NULL: argmax only, rows asked for without a buffer are refused */
    qd_span d0 = {0, prompt[0], 1, QD_LOGITS_LAST};
    const uint8_t one_full = 1;
    CHECK(qd_forward_mixed(c, &d0, 1, 0, &one_full, NULL, mids, NULL) == QD_ERR_INVALID_ARG);
    CHECKF(strstr(qd_context_errmsg(c), "logits buffer") != NULL, "message: %s", qd_context_errmsg(c));
    CHECK(qd_forward_mixed(c, &d0, 1, 0, NULL, NULL, mids, NULL) == QD_OK);
    CHECK(qd_forward_greedy_logprobs(b, NULL, 0, 0, ids, lps) == QD_ERR_INVALID_ARG);
    qd_span one = {0, prompt[0], 1, QD_LOGITS_LAST};
    CHECK(qd_forward_greedy_logprobs(b, &one, 1, V + 1, ids, lps) == QD_ERR_INVALID_ARG);
    CHECKF(strstr(qd_context_errmsg(b), "vocab_limit") != NULL, "message: %s", qd_context_errmsg(b));
    CHECK(qd_forward_greedy(b, &one, 1, NULL) == QD_ERR_INVALID_ARG);
    CHECK(qd_context_backend(b) == QD_BACKEND_CPU);
    free(logits);
    free(mixed);
    qd_context_free(a);
    qd_context_free(b);
    qd_context_free(c);
    qd_model_free(m);
    return qd_test_finish("test_greedy");
}
