/* Batch-invariant mode end to end through the serving engine (included by
 * test_batch_invariant.c on the CPU and test_cuda_batch_invariant.c on the GPU).
 *
 * With qd_engine_params.batch_invariant a request's tokens and their logprobs must be
 * bit-identical to its solo run whatever runs beside it. Reference: each request alone
 * on an engine whose step budget never cuts a prompt. Then, on other engines, all at
 * once:
 *   (a) a budget of 128 tokens per step: prompts cut into pieces, prefills mixed with
 *       decodes of other requests, batches of every size;
 *   (b) a KV pool far too small (and a fixed shape that must preempt): preemptions,
 *       whose recompute feeds prompt and generated tokens again;
 *   (c) the prefix cache on, prompts sharing a 130-token prefix, run twice: the second
 *       round restores cached states;
 * and the same requests alone again (run-to-run). Requests: prompt lengths around the
 * 64-token alignment (1, 2, 63..66, 127..129, 150) and random, greedy through the
 * forward's argmax, greedy through the sampler (top-2 logprobs reported) and seeded
 * temperature sampling: all compared token for token and logprob for logprob (bits).
 * Every fifth request also reports its prompt's logprobs (one of them nothing else),
 * compared bit for bit as well (a hash of every position's token, logprob and
 * alternatives, each position once and in order).
 * Also: an engine asking for batch-invariant mode with a step budget below two
 * alignments is refused with a message naming it. */
#include <pthread.h>
#include <string.h>
#include <unistd.h>

#include "qd_test.h"
#include "qd_fixtures.h"
#include "runtime/engine.h"

#define BI_REQ 20
#define BI_MAX_OUT 24
#define BI_MAX_PROMPT 200

static qd_test_rng rng;
/* The step cost model must be ready after the bounded run's steps: on the CPU a step's time
 * grows with its prompt tokens; a GPU may run these tiny models' steps in the same time
 * whatever their size, and then the model rightly stays not ready (no bound applies). */
static int bi_cost_model_expected = 1;
static pthread_mutex_t bi_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t bi_cv = PTHREAD_COND_INITIALIZER;
static int bi_gate_closed; /* under bi_mu: the gate request's callback waits while set */

typedef struct bi_out {
    int32_t toks[BI_MAX_OUT];
    float lps[BI_MAX_OUT];
    uint64_t plp_hash; /* prompt logprobs (FNV-1a over each position's result), their positions */
    int plp_n, plp_bad; /* plp_bad: a position out of order or after a token */
    int n, done, gate;
    qd_finish_reason finish;
    char error[256];
} bi_out;

typedef struct bi_req {
    int32_t prompt[BI_MAX_PROMPT];
    int n_prompt;
    qd_request_params rp;
} bi_req;

static uint64_t bi_fnv(uint64_t h, const void *p, size_t n) {
    for (size_t i = 0; i < n; i++) h = (h ^ ((const unsigned char *)p)[i]) * 0x100000001b3ull;
    return h;
}

static int bi_event(void *user, const qd_engine_event *ev) {
    bi_out *o = user;
    pthread_mutex_lock(&bi_mu);
    if (ev->n_prompt_lp > 0) {
        o->plp_bad |= ev->prompt_lp_at != o->plp_n + 1 || o->n > 0;
        if (!o->plp_n) o->plp_hash = 0xcbf29ce484222325ull;
        for (int i = 0; i < ev->n_prompt_lp; i++) {
            const qd_sample_result *r = &ev->prompt_lp[i];
            o->plp_hash = bi_fnv(o->plp_hash, &r->token, sizeof r->token);
            o->plp_hash = bi_fnv(o->plp_hash, &r->logprob, sizeof r->logprob);
            o->plp_hash = bi_fnv(o->plp_hash, r->top, sizeof r->top[0] * (size_t)r->n_top);
        }
        o->plp_n += ev->n_prompt_lp;
    }
    if (ev->has_token && o->n < BI_MAX_OUT) {
        o->toks[o->n] = ev->sample.token;
        o->lps[o->n++] = ev->sample.logprob;
    }
    if (ev->finish != QD_FINISH_NONE) {
        o->finish = ev->finish;
        if (ev->error) snprintf(o->error, sizeof o->error, "%s", ev->error);
        o->done = 1;
        pthread_cond_broadcast(&bi_cv);
    }
    /* the gate parks the reporting thread until every request of the batch is queued
     * (the engine, idle after the gate, waits for its callbacks before taking work) */
    while (o->gate && bi_gate_closed) pthread_cond_wait(&bi_cv, &bi_mu);
    pthread_mutex_unlock(&bi_mu);
    return 0;
}

/* max_step_ms: the engine's step time bound (0: off) */
static qd_engine *bi_engine_ex(qd_model *m, int batch_tokens, int kv_blocks, size_t prefix_bytes, double max_step_ms) {
    qd_engine_params p = qd_engine_default_params();
    p.max_step_ms = max_step_ms;
    p.max_num_seqs = 8;
    p.max_model_len = 256;
    p.max_batch_tokens = batch_tokens;
    p.kv_block_size = 16;
    p.n_kv_blocks = kv_blocks;
    p.prefix_cache_bytes = prefix_bytes;
    p.prefix_snapshot_interval = 64;
    p.batch_invariant = 1;
    qd_engine *e = NULL;
    qd_err err = {0};
    qd_status st = qd_engine_create(m, &p, &e, &err);
    CHECKF(st == QD_OK, "batch-invariant engine (budget %d, %d blocks): %s", batch_tokens, kv_blocks, err.msg);
    return st == QD_OK ? e : NULL;
}

static qd_engine *bi_engine(qd_model *m, int batch_tokens, int kv_blocks, size_t prefix_bytes) {
    return bi_engine_ex(m, batch_tokens, kv_blocks, prefix_bytes, 0);
}

static void bi_submit_ex(qd_engine *e, const bi_req *r, bi_out *o, int gate) {
    memset(o, 0, sizeof *o);
    o->gate = gate;
    qd_err err = {0};
    uint64_t id;
    qd_status st = qd_engine_submit(e, r->prompt, r->n_prompt, &r->rp, bi_event, o, &id, &err);
    CHECKF(st == QD_OK, "submit: %s", err.msg);
    if (st != QD_OK) o->done = 1;
}

static void bi_submit(qd_engine *e, const bi_req *r, bi_out *o) { bi_submit_ex(e, r, o, 0); }

static void bi_wait(bi_out *o, int n) {
    pthread_mutex_lock(&bi_mu);
    for (int i = 0; i < n; i++)
        while (!o[i].done) pthread_cond_wait(&bi_cv, &bi_mu);
    pthread_mutex_unlock(&bi_mu);
}

/* All n requests queued at one step boundary: a one-token gate request holds the
 * engine in its callback while they are submitted. */
static void bi_run_together(qd_engine *e, const bi_req *rs, int n, bi_out *os) {
    static bi_out gate;
    bi_req g = rs[0];
    g.rp.max_tokens = 1;
    pthread_mutex_lock(&bi_mu);
    bi_gate_closed = 1;
    pthread_mutex_unlock(&bi_mu);
    bi_submit_ex(e, &g, &gate, 1);
    for (int i = 0; i < n; i++) bi_submit(e, &rs[i], &os[i]);
    pthread_mutex_lock(&bi_mu);
    bi_gate_closed = 0;
    pthread_cond_broadcast(&bi_cv);
    pthread_mutex_unlock(&bi_mu);
    bi_wait(&gate, 1);
    bi_wait(os, n);
}

static void bi_run_alone(qd_engine *e, const bi_req *rs, int n, bi_out *os) {
    for (int i = 0; i < n; i++) {
        bi_submit(e, &rs[i], &os[i]);
        bi_wait(&os[i], 1);
    }
}

/* Requests of `got` identical to `ref` (tokens, finish reason and logprob bits). */
static int bi_compare(const char *dir, const char *what, const bi_out *got, const bi_out *ref, int n) {
    int same = 0;
    for (int i = 0; i < n; i++) {
        const bi_out *a = &got[i], *b = &ref[i];
        CHECKF(a->finish != QD_FINISH_ERROR && b->finish != QD_FINISH_ERROR, "%s: %s: request %d failed: %s%s", dir,
               what, i, a->error, b->error);
        int k = 0;
        while (k < a->n && k < b->n && a->toks[k] == b->toks[k] && memcmp(&a->lps[k], &b->lps[k], 4) == 0) k++;
        const int plp_same = a->plp_n == b->plp_n && a->plp_hash == b->plp_hash && !a->plp_bad && !b->plp_bad;
        if (!plp_same)
            fprintf(stderr, "%s: %s: request %d: prompt logprobs of %d positions%s vs %d alone%s\n", dir, what, i,
                    a->plp_n, a->plp_bad ? " (out of order)" : "", b->plp_n, b->plp_bad ? " (out of order)" : "");
        if (a->n == b->n && k == a->n && a->finish == b->finish && plp_same) {
            same++;
            continue;
        }
        fprintf(stderr, "%s: %s: request %d: %d tokens vs %d alone, first difference at %d", dir, what, i, a->n, b->n,
                k);
        if (k < a->n && k < b->n)
            fprintf(stderr, " (token %d logprob %.9g vs %d %.9g)", a->toks[k], (double)a->lps[k], b->toks[k],
                    (double)b->lps[k]);
        fputc('\n', stderr);
    }
    CHECKF(same == n, "%s: %s: %d of %d requests identical to their solo run", dir, what, same, n);
    return same;
}

/* rs run all at once on a fresh batch-invariant engine (step budget, KV blocks; 0: enough),
 * compared with their solo runs; the engine's stats (zeros if it could not be made). */
static qd_engine_stats bi_together(qd_model *m, const char *dir, const char *what, int budget, int blocks,
                                   const bi_req *rs, int n, bi_out *got, const bi_out *ref) {
    qd_engine_stats st = {0};
    qd_engine *e = bi_engine(m, budget, blocks, 0);
    if (!e) return st;
    bi_run_together(e, rs, n, got);
    qd_engine_get_stats(e, &st);
    bi_compare(dir, what, got, ref, n);
    qd_engine_free(e);
    return st;
}

static void bi_make_requests(bi_req *rs, int n, int V, const int32_t *shared, int n_shared) {
    static const int lens[] = {1, 2, 63, 64, 65, 66, 127, 128, 129, 150};
    for (int i = 0; i < n; i++) {
        bi_req *r = &rs[i];
        r->n_prompt = i < 10 ? lens[i] : 1 + (int)(qd_test_next(&rng) % BI_MAX_PROMPT);
        int t = 0;
        if (shared) {
            r->n_prompt = n_shared + 1 + (int)(qd_test_next(&rng) % (BI_MAX_PROMPT - n_shared));
            for (; t < n_shared; t++) r->prompt[t] = shared[t];
        }
        for (; t < r->n_prompt; t++) r->prompt[t] = (int32_t)(qd_test_next(&rng) % (uint64_t)V);
        r->rp = (qd_request_params){0};
        r->rp.sampling = qd_sampling_default_params();
        const int kind = i % 3; /* 0: argmax, 1: greedy through the sampler, 2: seeded sampling */
        r->rp.sampling.temperature = kind == 2 ? 0.8f : 0.0f;
        r->rp.sampling.n_logprobs = kind == 1 ? 2 : 0;
        r->rp.sampling.seed = 77 + (uint64_t)i;
        r->rp.max_tokens = 1 + (int)(qd_test_next(&rng) % BI_MAX_OUT);
        r->rp.ignore_eos = true;
        if (i % 5 == 4) { /* the prompt's logprobs too; request 9 (150 tokens) those alone */
            r->rp.prompt_logprobs = true;
            r->rp.sampling.n_logprobs = 2;
            if (i == 9) r->rp.max_tokens = 0;
        }
    }
}

static void bi_check_model(qd_model *m, const char *dir) {
    const int V = qd_model_vocab_size(m);
    static bi_req rs[BI_REQ], shared_rs[BI_REQ];
    static bi_out alone[BI_REQ], again[BI_REQ], got[BI_REQ], shared_alone[BI_REQ];
    bi_make_requests(rs, BI_REQ, V, NULL, 0);
    int32_t prefix[130];
    for (int t = 0; t < 130; t++) prefix[t] = (int32_t)(qd_test_next(&rng) % (uint64_t)V);
    bi_make_requests(shared_rs, BI_REQ, V, prefix, 130);

    /* reference: alone, with a budget that never cuts a prompt */
    qd_engine *e = bi_engine(m, 512, 0, 0);
    if (!e) return;
    bi_run_alone(e, rs, BI_REQ, alone);
    bi_run_alone(e, shared_rs, BI_REQ, shared_alone);
    bi_run_alone(e, rs, BI_REQ, again);
    bi_compare(dir, "alone, run again", again, alone, BI_REQ);
    for (int i = 0; i < BI_REQ; i++)
        CHECKF(alone[i].plp_n == (rs[i].rp.prompt_logprobs ? rs[i].n_prompt - 1 : 0) && !alone[i].plp_bad,
               "%s: request %d (%d prompt tokens) reported %d prompt positions", dir, i, rs[i].n_prompt, alone[i].plp_n);
    qd_engine_free(e);

    /* (a) together, prompts cut at 64-token boundaries into a 128-token budget */
    qd_engine_stats st = bi_together(m, dir, "together, budget 128", 128, 0, rs, BI_REQ, got, alone);
    printf("  %s: together, budget 128: %llu steps\n", dir, (unsigned long long)st.steps);
    /* (b) a pool of 16 blocks of 16 for 8 running requests of up to 224 tokens (14 blocks) */
    st = bi_together(m, dir, "together, small KV pool", 192, 16, rs, BI_REQ, got, alone);
    printf("  %s: small pool: %llu preemptions\n", dir, (unsigned long long)st.preemptions);
    /* (b') a random set need not overflow the pool, so also a shape that must: six requests
     * of 30 + 20 tokens at once into 14 blocks of 16; four fill the first step, a fifth the
     * next (2 blocks each, a block per running request held back keeps the sixth waiting),
     * and 32 tokens in, the five need a third block each: 15 > 14 */
    static bi_req pr[6];
    static bi_out palone[6], ptog[6];
    bi_make_requests(pr, 6, V, NULL, 0);
    for (int i = 0; i < 6; i++) {
        pr[i].n_prompt = 30;
        pr[i].rp.max_tokens = 20;
    }
    if ((e = bi_engine(m, 512, 0, 0))) {
        bi_run_alone(e, pr, 6, palone);
        qd_engine_free(e);
    }
    st = bi_together(m, dir, "together, preempted", 128, 14, pr, 6, ptog, palone);
    printf("  %s: pool of 14 blocks: %llu preemptions\n", dir, (unsigned long long)st.preemptions);
    CHECKF(st.preemptions > 0, "%s: six requests of 50 tokens in 14 blocks caused no preemption", dir);
    /* (d) a step time bound far below any step's: once the engine's cost model has its
     * steps, every step with decodes in it takes QD_STEP_MIN_PROMPT prompt tokens, so the
     * prompts admitted beside decodes are cut at 128 (aligned pieces, none starved); the
     * tokens are still the solo ones. Twice the requests, so that enough arrive after
     * the model is ready. */
    if ((e = bi_engine_ex(m, 512, 0, 0, 1e-3))) {
        bi_run_together(e, rs, BI_REQ, got);
        bi_compare(dir, "step time bound, first round", got, alone, BI_REQ);
        bi_run_together(e, rs, BI_REQ, got);
        bi_compare(dir, "step time bound, second round", got, alone, BI_REQ);
        qd_engine_get_stats(e, &st);
        printf("  %s: step time bound: %llu steps (%llu bounded), cost model %.3g ms + %.3g ms a prompt token + %.3g ms "
               "a decode row\n",
               dir, (unsigned long long)st.steps, (unsigned long long)st.bounded_steps, st.step_cost_ms[0],
               st.step_cost_ms[1], st.step_cost_ms[2]);
        CHECKF(st.step_cost_ready || !bi_cost_model_expected, "%s: the step cost model is not ready after %llu steps",
               dir, (unsigned long long)st.steps);
        CHECKF(!st.step_cost_ready || (st.step_cost_ms[1] > 0 && st.bounded_steps > 0),
               "%s: a ready cost model (%.3g ms a prompt token) never held a step's prompt tokens back", dir,
               st.step_cost_ms[1]);
        qd_engine_free(e);
    }
    /* (c) prefix cache: the shared-prefix requests twice, the second round from the cache */
    if ((e = bi_engine(m, 256, 0, (size_t)64 << 20))) {
        bi_run_together(e, shared_rs, BI_REQ, got);
        bi_compare(dir, "prefix cache, first round", got, shared_alone, BI_REQ);
        bi_run_together(e, shared_rs, BI_REQ, got);
        qd_engine_get_stats(e, &st);
        printf("  %s: prefix cache: %llu of %llu query tokens hit\n", dir, (unsigned long long)st.prefix_hit_tokens,
               (unsigned long long)st.prefix_query_tokens);
        CHECKF(st.prefix_hit_tokens > 0, "%s: the prefix cache never hit", dir);
        bi_compare(dir, "prefix cache, second round", got, shared_alone, BI_REQ);
        qd_engine_free(e);
    }
}

static void bi_check_params(qd_model *m) {
    qd_engine_params p = qd_engine_default_params();
    p.max_batch_tokens = 100;
    p.batch_invariant = 1;
    qd_engine *e = NULL;
    qd_err err = {0};
    CHECK(qd_engine_create(m, &p, &e, &err) == QD_ERR_INVALID_ARG && !e);
    CHECKF(strstr(err.msg, "batch-invariant") != NULL, "unclear error: %s", err.msg);
}

