/* Prompt logprobs of the serving engine (qd_request_params.prompt_logprobs), on the
 * default model and an fp32 fixture, on fresh random prompts of awkward lengths, longer
 * than one step's QD_PROMPT_LP_ROWS so that they report in pieces.
 *
 * The reference is a whole-prompt forward with every logit row (qd_forward,
 * QD_LOGITS_ALL) and a log-softmax in double: each position 1..L-1 is reported once, in
 * order, before any token, with its own token, its logprob and the top alternatives of
 * the reference. In batch-invariant mode a request's report is bit for bit the same
 * alone, next to other requests, after a prefix-cache hit was possible, with speculative
 * decoding, and after a preemption in the middle of its prompt; its tokens are those of
 * the same request without prompt logprobs. max_tokens 0 ends the request after its
 * prompt; a callback's stop ends the reports; bad combinations are refused by name. */
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "qd_fixtures.h"
#include "qd_test.h"
#include "runtime/engine_internal.h"

#define MAX_PROMPT 800
#define MAX_OUT 32
#define N_TOP 3

typedef struct run {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    qd_sample_result lp[MAX_PROMPT]; /* by position */
    int n_lp_events, next_pos;       /* events seen; the position the next report must start at */
    int order_ok;                    /* every report started where the last ended, before any token */
    int32_t toks[MAX_OUT];
    int n, done, stop_after_lp;      /* stop_after_lp: return nonzero on the first prompt report */
    qd_finish_reason finish;
    int completion_tokens;
    char error[256];
} run;

static int on_event(void *user, const qd_engine_event *ev) {
    run *r = user;
    int stop = 0;
    pthread_mutex_lock(&r->mu);
    if (ev->n_prompt_lp > 0) {
        r->n_lp_events++;
        if (ev->has_token || r->n > 0 || ev->prompt_lp_at != r->next_pos ||
            ev->prompt_lp_at + ev->n_prompt_lp > MAX_PROMPT || !ev->prompt_lp)
            r->order_ok = 0;
        else
            memcpy(&r->lp[ev->prompt_lp_at], ev->prompt_lp, sizeof *ev->prompt_lp * (size_t)ev->n_prompt_lp);
        r->next_pos = ev->prompt_lp_at + ev->n_prompt_lp;
        stop = r->stop_after_lp;
    } else if (ev->prompt_lp) {
        r->order_ok = 0;
    }
    if (ev->has_token && r->n < MAX_OUT) r->toks[r->n++] = ev->sample.token;
    if (ev->finish != QD_FINISH_NONE) {
        r->finish = ev->finish;
        r->completion_tokens = ev->completion_tokens;
        if (ev->error) snprintf(r->error, sizeof r->error, "%s", ev->error);
        r->done = 1;
        pthread_cond_signal(&r->cv);
    }
    pthread_mutex_unlock(&r->mu);
    return stop;
}

static void run_init(run *r) {
    memset(r, 0, sizeof *r);
    pthread_mutex_init(&r->mu, NULL);
    pthread_cond_init(&r->cv, NULL);
    r->next_pos = 1;
    r->order_ok = 1;
}

static void run_wait(run *r) {
    pthread_mutex_lock(&r->mu);
    while (!r->done) pthread_cond_wait(&r->cv, &r->mu);
    pthread_mutex_unlock(&r->mu);
    pthread_mutex_destroy(&r->mu);
    pthread_cond_destroy(&r->cv);
}

static qd_request_params params(int max_tokens, int prompt_lp) {
    qd_request_params p;
    memset(&p, 0, sizeof p);
    p.sampling = qd_sampling_default_params();
    p.sampling.temperature = 0.0f;
    p.sampling.n_logprobs = N_TOP;
    p.max_tokens = max_tokens;
    p.ignore_eos = true;
    p.prompt_logprobs = prompt_lp;
    return p;
}

static qd_status submit(qd_engine *e, const int32_t *prompt, int n, const qd_request_params *p, run *r, qd_err *err) {
    run_init(r);
    uint64_t id;
    qd_status st = qd_engine_submit(e, prompt, n, p, on_event, r, &id, err);
    if (st != QD_OK) r->done = 1;
    return st;
}

static qd_status generate(qd_engine *e, const int32_t *prompt, int n, const qd_request_params *p, run *r, qd_err *err) {
    qd_status st = submit(e, prompt, n, p, r, err);
    run_wait(r);
    return st;
}

static qd_engine *engine(qd_model *m, int invariant, int prefix_cache, int spec, int n_kv_blocks, qd_err *err) {
    qd_engine_params ep = qd_engine_default_params();
    ep.max_num_seqs = 4;
    ep.max_model_len = 1024;
    ep.max_batch_tokens = 512;
    ep.batch_invariant = invariant;
    ep.prefix_cache_bytes = prefix_cache ? (size_t)64 << 20 : 0;
    ep.speculative_tokens = spec;
    ep.n_kv_blocks = n_kv_blocks;
    qd_engine *e = NULL;
    return qd_engine_create(m, &ep, &e, err) == QD_OK ? e : NULL;
}

/* The reference log-softmax rows of a whole prompt: ref[p][v] = log p(v | prompt[0..p]). */
static double *reference(qd_model *m, const int32_t *prompt, int n) {
    const int V = qd_model_vocab_size(m);
    qd_context_params cp = qd_context_default_params();
    cp.max_seqs = 1;
    cp.max_ctx = n + 1;
    cp.max_batch = n;
    qd_context *ctx = NULL;
    float *logits = malloc(sizeof(float) * (size_t)n * V);
    double *ref = malloc(sizeof(double) * (size_t)n * V);
    const qd_span s = {.seq = 0, .tokens = prompt, .n_tokens = n, .logits = QD_LOGITS_ALL};
    if (!logits || !ref || qd_context_create(m, &cp, &ctx) != QD_OK || qd_forward(ctx, &s, 1, logits) != QD_OK) {
        free(ref);
        ref = NULL;
    }
    for (int p = 0; ref && p < n; p++) {
        const float *x = logits + (size_t)p * V;
        double mx = -INFINITY, sum = 0;
        for (int v = 0; v < V; v++) mx = x[v] > mx ? x[v] : mx;
        for (int v = 0; v < V; v++) sum += exp((double)x[v] - mx);
        for (int v = 0; v < V; v++) ref[(size_t)p * V + v] = (double)x[v] - mx - log(sum);
    }
    qd_context_free(ctx);
    free(logits);
    return ref;
}

/* The report of positions 1..n-1 against the reference: the token, its logprob, and
 * the top alternatives (each the reference's value of its id, descending, none missed:
 * the k-th is at least the reference's k-th largest). Returns the positions that differ. */
static int check_against(const run *r, const int32_t *prompt, int n, const double *ref, int V) {
    const double tol = 2e-3;
    int bad = 0;
    for (int p = 1; p < n; p++) {
        const qd_sample_result *x = &r->lp[p];
        const double *row = ref + (size_t)(p - 1) * V;
        int ok = x->token == prompt[p] && fabs(x->logprob - row[prompt[p]]) < tol && x->n_top == N_TOP;
        double kth[N_TOP];
        for (int k = 0; k < N_TOP; k++) kth[k] = -INFINITY;
        for (int v = 0; v < V; v++) /* the reference's N_TOP largest, descending */
            for (int k = 0; k < N_TOP; k++)
                if (row[v] > kth[k]) {
                    memmove(&kth[k + 1], &kth[k], sizeof kth[0] * (size_t)(N_TOP - 1 - k));
                    kth[k] = row[v];
                    break;
                }
        for (int k = 0; ok && k < x->n_top; k++) {
            const qd_token_logprob *t = &x->top[k];
            ok = t->id >= 0 && t->id < V && fabs(t->logprob - row[t->id]) < tol && t->logprob > kth[k] - tol &&
                 (k == 0 || t->logprob <= x->top[k - 1].logprob);
        }
        if (!ok && bad++ < 3)
            fprintf(stderr, "position %d: token %d (want %d) logprob %g (want %g), %d alternatives\n", p, x->token,
                    prompt[p], (double)x->logprob, row[prompt[p]], x->n_top);
    }
    return bad;
}

static int same_report(const run *a, const run *b, int n) {
    for (int p = 1; p < n; p++) {
        const qd_sample_result *x = &a->lp[p], *y = &b->lp[p];
        if (x->token != y->token || memcmp(&x->logprob, &y->logprob, sizeof x->logprob) || x->n_top != y->n_top ||
            memcmp(x->top, y->top, sizeof x->top[0] * (size_t)x->n_top))
            return 0;
    }
    return 1;
}

/* A complete, ordered report of a run that ended as `want`. */
static int complete(const run *r, int n, qd_finish_reason want) {
    return r->order_ok && r->next_pos == n && r->finish == want && !r->error[0];
}

static void check_model(qd_model *m, const char *dir, qd_test_rng *rng) {
    const int V = qd_model_vocab_size(m);
    qd_err err = {0};
    static int32_t prompt[MAX_PROMPT], other[MAX_PROMPT];
    const int n = 300 + (int)(qd_test_next(rng) % 400); /* two or three pieces of QD_PROMPT_LP_ROWS */
    for (int i = 0; i < n; i++) prompt[i] = (int32_t)(qd_test_next(rng) % (uint64_t)V);
    for (int i = 0; i < MAX_PROMPT; i++) other[i] = (int32_t)(qd_test_next(rng) % (uint64_t)V);
    double *ref = reference(m, prompt, n);
    CHECKF(ref != NULL, "%s: reference forward", dir);
    if (!ref) return;

    /* alone, prompt only (max_tokens 0): every position once, against the reference */
    static run only, with_tokens, plain, busy[3], cached, spec, pre_a, pre_b, forks[2], stopped;
    qd_engine *e = engine(m, 1, 0, 0, 0, &err);
    CHECKF(e != NULL, "%s: engine: %s", dir, err.msg);
    if (!e) goto out;
    qd_request_params p0 = params(0, 1), p4 = params(4, 1), plain4 = params(4, 0);
    CHECK(generate(e, prompt, n, &p0, &only, &err) == QD_OK);
    CHECKF(complete(&only, n, QD_FINISH_LENGTH) && only.n == 0 && only.completion_tokens == 0,
           "%s: prompt only: reported to %d of %d, finish %d, %d tokens, %s", dir, only.next_pos, n, only.finish,
           only.n, only.error);
    CHECKF(only.n_lp_events >= 2, "%s: a %d-token prompt reports in pieces (%d events)", dir, n, only.n_lp_events);
    /* its steps, which return whole logits rows, stay out of the step cost model (read after the
     * request's last event, which the engine thread sends after the steps) */
    CHECKF(e->cost.n == 0, "%s: %d steps with prompt logprob rows in the step cost model", dir, e->cost.n);
    CHECKF(check_against(&only, prompt, n, ref, V) == 0, "%s: prompt logprobs = the reference", dir);

    /* with tokens: the same report, the tokens of a request without prompt logprobs */
    CHECK(generate(e, prompt, n, &p4, &with_tokens, &err) == QD_OK);
    CHECK(generate(e, prompt, n, &plain4, &plain, &err) == QD_OK);
    CHECKF(complete(&with_tokens, n, QD_FINISH_LENGTH) && same_report(&with_tokens, &only, n), "%s: with tokens", dir);
    CHECKF(e->cost.n > 0, "%s: the plain request's steps are in the step cost model", dir);
    CHECKF(with_tokens.n == 4 && plain.n == 4 && plain.n_lp_events == 0 &&
               !memcmp(with_tokens.toks, plain.toks, sizeof plain.toks[0] * 4),
           "%s: tokens as without prompt logprobs", dir);

    /* beside other requests (two more with prompt logprobs, one plain decode) */
    for (int i = 0; i < 3; i++) {
        qd_request_params pi = i == 1 ? plain4 : params(3 + i, 1);
        CHECK(submit(e, i == 0 ? prompt : other, i == 0 ? n : 100 + 150 * i, &pi, &busy[i], &err) == QD_OK);
    }
    qd_request_params p0b = p0;
    run beside;
    CHECK(submit(e, prompt, n, &p0b, &beside, &err) == QD_OK);
    for (int i = 0; i < 3; i++) run_wait(&busy[i]);
    run_wait(&beside);
    CHECKF(complete(&busy[0], n, QD_FINISH_LENGTH) && same_report(&busy[0], &only, n) &&
               complete(&beside, n, QD_FINISH_LENGTH) && same_report(&beside, &only, n),
           "%s: batched = alone, bit for bit", dir);
    CHECKF(busy[1].n_lp_events == 0 && busy[1].n == 4 && complete(&busy[2], 400, QD_FINISH_LENGTH),
           "%s: the requests beside it", dir);

    /* a callback that stops at the first report ends the request there */
    run_init(&stopped);
    stopped.stop_after_lp = 1;
    uint64_t sid;
    CHECK(qd_engine_submit(e, prompt, n, &p4, on_event, &stopped, &sid, &err) == QD_OK);
    run_wait(&stopped);
    CHECKF(stopped.n_lp_events == 1 && stopped.n == 0 && stopped.finish == QD_FINISH_STOP,
           "%s: stopped: %d reports, %d tokens, finish %d", dir, stopped.n_lp_events, stopped.n, stopped.finish);

    /* n = 2: the first sequence reports the prompt, the forked one does not */
    void *users[2] = {&forks[0], &forks[1]};
    run_init(&forks[0]);
    run_init(&forks[1]);
    uint64_t ids[2];
    CHECK(qd_engine_submit_n(e, prompt, n, &p4, 2, on_event, users, ids, &err) == QD_OK);
    run_wait(&forks[0]);
    run_wait(&forks[1]);
    CHECKF(complete(&forks[0], n, QD_FINISH_LENGTH) && same_report(&forks[0], &only, n) &&
               forks[1].n_lp_events == 0 && forks[1].n == 4 &&
               !memcmp(forks[1].toks, plain.toks, sizeof plain.toks[0] * 4),
           "%s: n = 2", dir);

    /* refused: max_tokens 0 without prompt logprobs, an id past the vocabulary limit */
    qd_request_params bad = params(0, 0);
    run r;
    CHECKF(generate(e, prompt, n, &bad, &r, &err) == QD_ERR_INVALID_ARG && strstr(err.msg, "max_tokens"), "%s: %s", dir,
           err.msg);
    bad = params(1, 1);
    bad.sampling.vocab_limit = V - 1;
    const int32_t high[3] = {1, V - 1, 2};
    CHECKF(generate(e, high, 3, &bad, &r, &err) == QD_ERR_INVALID_ARG && strstr(err.msg, "vocabulary limit"), "%s: %s",
           dir, err.msg);
    qd_engine_free(e);

    /* the prefix cache holds the prompt: it is computed again all the same */
    e = engine(m, 1, 1, 0, 0, &err);
    CHECKF(e != NULL, "%s: engine with a prefix cache: %s", dir, err.msg);
    if (e) {
        run warm;
        CHECK(generate(e, prompt, n, &plain4, &warm, &err) == QD_OK);
        CHECK(generate(e, prompt, n, &p0, &cached, &err) == QD_OK);
        qd_engine_stats st;
        qd_engine_get_stats(e, &st);
        CHECKF(complete(&cached, n, QD_FINISH_LENGTH) && same_report(&cached, &only, n),
               "%s: after a cached run of the prompt (%llu hit tokens)", dir, (unsigned long long)st.prefix_hit_tokens);
        qd_engine_free(e);
    }

    /* speculative decoding (where the model has an MTP head) */
    if (qd_model_has_mtp(m, NULL, 0)) {
        e = engine(m, 1, 0, 2, 0, &err);
        CHECKF(e != NULL, "%s: engine with speculation: %s", dir, err.msg);
        if (e) {
            CHECK(generate(e, prompt, n, &p4, &spec, &err) == QD_OK);
            CHECKF(complete(&spec, n, QD_FINISH_LENGTH) && same_report(&spec, &only, n) && spec.n == 4 &&
                       !memcmp(spec.toks, plain.toks, sizeof plain.toks[0] * 4),
                   "%s: with speculative decoding", dir);
            qd_engine_free(e);
        }
    }

    /* preempted in the middle of its prompt: a decode (a) whose prompt fills its blocks
     * takes a block at its first token while the 300-token prompt (b) is being computed,
     * and the pool (21 blocks of 16 tokens: a needs 16 at the end, b 19) leaves b no room
     * for its next piece, so b, the newer, gives way (more than once); readmitted, it
     * reports only the positions left. Against the reference of that prompt. */
    enum { NA = 48, MA = 200, NB = 300 };
    double *ref_b = reference(m, prompt, NB);
    e = ref_b ? engine(m, 1, 0, 0, 21, &err) : NULL;
    CHECKF(e != NULL, "%s: engine with 21 KV blocks: %s", dir, err.msg);
    if (e) {
        qd_request_params pa = params(MA, 0), pb = params(2, 1);
        CHECK(submit(e, other, NA, &pa, &pre_a, &err) == QD_OK);
        CHECK(submit(e, prompt, NB, &pb, &pre_b, &err) == QD_OK);
        run_wait(&pre_a);
        run_wait(&pre_b);
        qd_engine_stats st;
        qd_engine_get_stats(e, &st);
        CHECKF(st.preemptions >= 1, "%s: a preemption happened (%llu)", dir, (unsigned long long)st.preemptions);
        CHECKF(complete(&pre_b, NB, QD_FINISH_LENGTH) && pre_b.n == 2 && pre_a.completion_tokens == MA,
               "%s: preempted: reported to %d of %d in %d events, order %d, %d tokens", dir, pre_b.next_pos, NB,
               pre_b.n_lp_events, pre_b.order_ok, pre_b.n);
        CHECKF(check_against(&pre_b, prompt, NB, ref_b, V) == 0, "%s: preempted: = the reference", dir);
        qd_engine_free(e);
    }
    free(ref_b);
out:
    free(ref);
}

int main(void) {
    qd_test_rng rng = qd_test_rng_from_env();
    const char *dirs[] = {"models/qdelta-tiny", "tests/fixtures/qwen3_5_dense_f32"};
    for (size_t i = 0; i < sizeof dirs / sizeof dirs[0]; i++) {
        qd_model *m = qd_fixture_load(dirs[i], QD_BACKEND_CPU, 1);
        CHECKF(m != NULL, "load %s", dirs[i]);
        if (!m) continue;
        check_model(m, dirs[i], &rng);
        qd_model_free(m);
    }
    return qd_test_finish("test_engine_prompt_lp");
}
