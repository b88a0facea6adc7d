/* Per-request token controls of the serving engine (qd_request_params): logit_bias,
 * stop_token_ids and min_tokens, on the default model and an fp32 fixture, greedy on
 * fresh random prompts. Every expectation comes from a plain greedy run of the same
 * prompt: a +100 bias makes its token the first; a bias of 0 (which sends the row
 * through the sampler instead of the forward's argmax) changes nothing; a stop token
 * ends the run on its first occurrence; min_tokens holds EOS (forced by a bias) and the
 * stop tokens off until that many tokens are out; bad values are refused naming them. */
#include <pthread.h>
#include <string.h>

#include "qd_fixtures.h"
#include "qd_test.h"
#include "runtime/engine.h"

#define MAX_OUT 32

typedef struct run {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int32_t toks[MAX_OUT];
    int n, done;
    qd_finish_reason finish;
} run;

static int on_event(void *user, const qd_engine_event *ev) {
    run *r = user;
    pthread_mutex_lock(&r->mu);
    if (ev->has_token && r->n < MAX_OUT) r->toks[r->n++] = ev->sample.token;
    if (ev->finish != QD_FINISH_NONE) {
        r->finish = ev->finish;
        r->done = 1;
        pthread_cond_signal(&r->cv);
    }
    pthread_mutex_unlock(&r->mu);
    return 0;
}

static qd_request_params greedy(int max_tokens) {
    qd_request_params p;
    memset(&p, 0, sizeof p);
    p.sampling = qd_sampling_default_params();
    p.sampling.temperature = 0.0f;
    p.max_tokens = max_tokens;
    p.ignore_eos = true;
    return p;
}

/* One request to its end; QD_OK or the submit's status (err set). */
static qd_status generate(qd_engine *e, const int32_t *prompt, int n, const qd_request_params *p, run *r, qd_err *err) {
    memset(r, 0, sizeof *r);
    pthread_mutex_init(&r->mu, NULL);
    pthread_cond_init(&r->cv, NULL);
    uint64_t id;
    qd_status st = qd_engine_submit(e, prompt, n, p, on_event, r, &id, err);
    if (st == QD_OK) {
        pthread_mutex_lock(&r->mu);
        while (!r->done) pthread_cond_wait(&r->cv, &r->mu);
        pthread_mutex_unlock(&r->mu);
    }
    pthread_mutex_destroy(&r->mu);
    pthread_cond_destroy(&r->cv);
    return st;
}

static int first_index(const int32_t *t, int n, int32_t id) {
    for (int i = 0; i < n; i++)
        if (t[i] == id) return i;
    return -1;
}

static void check_model(qd_model *m, const char *dir, qd_test_rng *rng) {
    qd_engine_params ep = qd_engine_default_params();
    ep.max_num_seqs = 2;
    ep.max_model_len = 128;
    qd_engine *e = NULL;
    qd_err err = {0};
    if (qd_engine_create(m, &ep, &e, &err) != QD_OK) {
        CHECKF(0, "%s: engine: %s", dir, err.msg);
        return;
    }
    const int V = qd_model_vocab_size(m);
    for (int trial = 0; trial < 3; trial++) {
        int32_t prompt[40];
        const int n = 3 + (int)(qd_test_next(rng) % 37); /* awkward lengths 3..39 */
        for (int i = 0; i < n; i++) prompt[i] = (int32_t)(qd_test_next(rng) % (uint64_t)V);
        run ref, r;
        qd_request_params p = greedy(16);
        CHECK(generate(e, prompt, n, &p, &ref, &err) == QD_OK && ref.n == 16 && ref.finish == QD_FINISH_LENGTH);

        /* logit_bias +100 on a token the greedy run does not start with */
        const int32_t x = (ref.toks[0] + 1 + (int32_t)(qd_test_next(rng) % (uint64_t)(V - 1))) % V;
        p = greedy(4);
        p.n_logit_bias = 1;
        p.logit_bias[0] = (qd_logit_bias){.id = x, .bias = 100.0f};
        CHECK(generate(e, prompt, n, &p, &r, &err) == QD_OK);
        CHECKF(r.n == 4 && r.toks[0] == x, "%s: +100 bias: first token %d, want %d", dir, r.toks[0], x);
        /* -100 on the greedy first token bans it */
        p.logit_bias[0] = (qd_logit_bias){.id = ref.toks[0], .bias = -100.0f};
        CHECK(generate(e, prompt, n, &p, &r, &err) == QD_OK && r.toks[0] != ref.toks[0]);
        /* bias 0: through the sampler, the same tokens as the argmax path */
        p = greedy(16);
        p.n_logit_bias = 1;
        p.logit_bias[0] = (qd_logit_bias){.id = x, .bias = 0.0f};
        CHECK(generate(e, prompt, n, &p, &r, &err) == QD_OK);
        CHECKF(r.n == 16 && !memcmp(r.toks, ref.toks, sizeof ref.toks[0] * 16), "%s: bias 0 changes nothing", dir);

        /* a stop token ends the run on its first occurrence (reported, finish EOS) */
        const int k = 2 + (int)(qd_test_next(rng) % 10);
        const int32_t stop = ref.toks[k];
        const int at = first_index(ref.toks, 16, stop);
        p = greedy(16);
        p.n_stop_token_ids = 2;
        p.stop_token_ids[0] = V - 1 == stop ? 0 : V - 1; /* another id that may never come */
        p.stop_token_ids[1] = stop;
        const int other_at = first_index(ref.toks, 16, p.stop_token_ids[0]);
        const int end = other_at >= 0 && other_at < at ? other_at : at;
        CHECK(generate(e, prompt, n, &p, &r, &err) == QD_OK);
        CHECKF(r.n == end + 1 && !memcmp(r.toks, ref.toks, sizeof r.toks[0] * (size_t)r.n) && r.finish == QD_FINISH_EOS,
               "%s: stop token %d: %d tokens (want %d), finish %d", dir, stop, r.n, end + 1, r.finish);
        /* ... held off by min_tokens: never sampled before 16 tokens */
        p.min_tokens = 16;
        CHECK(generate(e, prompt, n, &p, &r, &err) == QD_OK);
        CHECKF(r.n == 16 && r.finish == QD_FINISH_LENGTH && first_index(r.toks, 16, stop) < 0 &&
                   first_index(r.toks, 16, p.stop_token_ids[0]) < 0,
               "%s: min_tokens 16 masks the stop tokens (%d tokens)", dir, r.n);
        CHECK(!memcmp(r.toks, ref.toks, sizeof r.toks[0] * (size_t)end)); /* the same up to there */

        /* EOS forced by a bias: the first token without min_tokens, after 5 with it */
        const int32_t *eos;
        if (qd_model_eos_ids(m, &eos) > 0) {
            p = greedy(16);
            p.ignore_eos = false;
            p.n_logit_bias = 1;
            p.logit_bias[0] = (qd_logit_bias){.id = eos[0], .bias = 100.0f};
            CHECK(generate(e, prompt, n, &p, &r, &err) == QD_OK && r.n == 1 && r.toks[0] == eos[0] &&
                  r.finish == QD_FINISH_EOS);
            p.min_tokens = 5;
            CHECK(generate(e, prompt, n, &p, &r, &err) == QD_OK);
            CHECKF(r.n == 6 && r.toks[5] == eos[0] && first_index(r.toks, 5, eos[0]) < 0 && r.finish == QD_FINISH_EOS,
                   "%s: min_tokens 5: EOS as the 6th token (%d tokens)", dir, r.n);
            /* with ignore_eos EOS is an ordinary token: min_tokens does not mask it */
            p.ignore_eos = true;
            p.max_tokens = 5;
            CHECK(generate(e, prompt, n, &p, &r, &err) == QD_OK);
            CHECKF(r.n == 5 && r.toks[0] == eos[0] && r.toks[4] == eos[0] && r.finish == QD_FINISH_LENGTH,
                   "%s: ignore_eos + min_tokens: EOS stays sampleable (%d tokens, first %d)", dir, r.n, r.toks[0]);
        }
    }

    /* refused, naming the field */
    struct { const char *word; qd_request_params p; } bad[6];
    for (int i = 0; i < 6; i++) bad[i].p = greedy(8);
    bad[0].word = "min_tokens", bad[0].p.min_tokens = 9;
    bad[1].word = "min_tokens", bad[1].p.min_tokens = -1;
    bad[2].word = "logit_bias", bad[2].p.n_logit_bias = 1, bad[2].p.logit_bias[0] = (qd_logit_bias){.id = V, .bias = 1};
    bad[3].word = "logit_bias", bad[3].p.n_logit_bias = 1, bad[3].p.logit_bias[0] = (qd_logit_bias){.id = 1, .bias = 101};
    bad[4].word = "stop token", bad[4].p.n_stop_token_ids = 1, bad[4].p.stop_token_ids[0] = -3;
    bad[5].word = "stop token", bad[5].p.n_stop_token_ids = QD_MAX_STOP_TOKEN_IDS + 1;
    const int32_t one[1] = {1};
    for (int i = 0; i < 6; i++) {
        run r;
        qd_err e2 = {0};
        qd_status st = generate(e, one, 1, &bad[i].p, &r, &e2);
        CHECKF(st == QD_ERR_INVALID_ARG && strstr(e2.msg, bad[i].word), "%s: bad %d refused naming %s: %s", dir, i,
               bad[i].word, e2.msg);
    }
    qd_engine_free(e);
}

/* n sequences of one prompt: prefilled once (prefill_tokens_total grows by the prompt
 * alone when slots are free), sequence i = a lone run with seed + i, greedy ones all
 * the same; with fewer slots than sequences the rest queue as ordinary requests and
 * still give the same tokens. Batch-invariant, so "the same" is exact. */
static void check_forks(qd_model *m, const char *dir, qd_test_rng *rng, int slots) {
    qd_engine_params ep = qd_engine_default_params();
    ep.max_num_seqs = slots;
    ep.max_model_len = 128;
    ep.batch_invariant = 1;
    ep.prefix_cache_bytes = 0;
    qd_engine *e = NULL;
    qd_err err = {0};
    if (qd_engine_create(m, &ep, &e, &err) != QD_OK) {
        CHECKF(0, "%s: engine: %s", dir, err.msg);
        return;
    }
    const int V = qd_model_vocab_size(m);
    int32_t prompt[40];
    const int n = 5 + (int)(qd_test_next(rng) % 30);
    for (int i = 0; i < n; i++) prompt[i] = (int32_t)(qd_test_next(rng) % (uint64_t)V);
    enum { N = 4 };
    for (int sampled = 0; sampled < 2; sampled++) {
        qd_request_params p = greedy(12);
        if (sampled) {
            p.sampling.temperature = 1.0f;
            p.sampling.seed = qd_test_next(rng);
        }
        run alone[N], group[N];
        for (int i = 0; i < N; i++) {
            qd_request_params pi = p;
            pi.sampling.seed = p.sampling.seed + (uint64_t)i;
            CHECK(generate(e, prompt, n, &pi, &alone[i], &err) == QD_OK);
        }
        qd_engine_stats before, after;
        qd_engine_get_stats(e, &before);
        void *users[N];
        uint64_t ids[N];
        for (int i = 0; i < N; i++) {
            memset(&group[i], 0, sizeof group[i]);
            pthread_mutex_init(&group[i].mu, NULL);
            pthread_cond_init(&group[i].cv, NULL);
            users[i] = &group[i];
        }
        CHECKF(qd_engine_submit_n(e, prompt, n, &p, N, on_event, users, ids, &err) == QD_OK, "submit_n: %s", err.msg);
        for (int i = 0; i < N; i++) {
            pthread_mutex_lock(&group[i].mu);
            while (!group[i].done) pthread_cond_wait(&group[i].cv, &group[i].mu);
            pthread_mutex_unlock(&group[i].mu);
        }
        qd_engine_get_stats(e, &after);
        for (int i = 0; i < N; i++) {
            CHECKF(group[i].n == 12 && !memcmp(group[i].toks, alone[i].toks, sizeof alone[i].toks[0] * 12),
                   "%s (%d slots, %s): sequence %d = a lone run with seed + %d", dir, slots, sampled ? "sampled" : "greedy",
                   i, i);
            if (!sampled) CHECK(!memcmp(group[i].toks, group[0].toks, sizeof group[0].toks[0] * 12));
            pthread_mutex_destroy(&group[i].mu);
            pthread_cond_destroy(&group[i].cv);
        }
        if (sampled) {
            int differ = 0;
            for (int i = 1; i < N; i++) differ |= memcmp(group[i].toks, group[0].toks, sizeof group[0].toks[0] * 12) != 0;
            CHECKF(differ, "%s: sampled sequences with different seeds differ", dir);
        }
        const uint64_t prefilled = after.prefill_tokens_total - before.prefill_tokens_total;
        if (slots >= N)
            CHECKF(prefilled == (uint64_t)n, "%s: the prompt was prefilled once (%llu tokens for a %d-token prompt)", dir,
                   (unsigned long long)prefilled, n);
        else
            CHECKF(prefilled > (uint64_t)n && prefilled <= (uint64_t)(N * n), "%s: %d slots: %llu prefill tokens", dir,
                   slots, (unsigned long long)prefilled);
        CHECK(after.slots_used == 0 && after.kv_blocks_used == 0 && after.waiting == 0);
    }
    qd_request_params p = greedy(4);
    CHECK(qd_engine_submit_n(e, prompt, n, &p, 0, on_event, NULL, NULL, &err) == QD_ERR_INVALID_ARG && strstr(err.msg, "n = 0"));
    CHECK(qd_engine_submit_n(e, prompt, n, &p, QD_MAX_FORKS + 1, on_event, NULL, NULL, &err) == QD_ERR_INVALID_ARG);
    qd_engine_free(e);
}

int main(void) {
    qd_test_rng rng = qd_test_rng_from_env();
    const char *dirs[] = {"models/qdelta-tiny", "tests/fixtures/qwen3_5_dense_f32"};
    for (size_t i = 0; i < sizeof dirs / sizeof dirs[0]; i++) {
        qd_model *m = qd_fixture_load(dirs[i], QD_BACKEND_CPU, 1);
        CHECKF(m != NULL, "load %s", dirs[i]);
        if (!m) continue;
        check_model(m, dirs[i], &rng);
        check_forks(m, dirs[i], &rng, 4);
        check_forks(m, dirs[i], &rng, 2);
        qd_model_free(m);
    }
    return qd_test_finish("test_engine_fields");
}
