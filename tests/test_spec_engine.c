/* Speculative decoding through the serving engine (runtime/spec_step.c) on the MTP
 * fixtures (tests/fixtures_mtp), K = 1..4 drafts per step:
 *   (a) greedy: several concurrent requests of different prompt lengths and budgets give
 *       exactly the tokens of the same engine without speculation, bit for bit in
 *       batch-invariant mode and in the default mode; with the fixtures' random MTP
 *       heads (drafts mostly rejected) and with perfect drafts (a drafter replaying the
 *       plain output: every draft kept, so tokens come in runs of K + 1);
 *   (b) a KV pool too small for all of them at once forces preemptions: unchanged;
 *   (c) a request cancelled from its callback ends there, the others are unaffected;
 *   (d) a run of kept drafts cut by max_tokens, by a stop token id and by a callback
 *       asking to stop (a stop string) ends exactly at that token;
 *   (e) the prefix cache on: a second identical request hits the cache and gives the
 *       same tokens;
 *   (f) the counters: drafted = K per verify step (less near the end), accepted by
 *       position adds up, perfect drafts are all accepted;
 *   (g) a model without an MTP head, bad K: engine creation fails, naming why;
 *   (h) a grammar-constrained request does not speculate (no verify step of its own) and
 *       gives what it gives without speculation, beside an unconstrained one that does.
 *   (i) n = 3 sequences of one prompt (qd_engine_submit_n: forked after the prefill,
 *       sharing its blocks and MTP KV) and, in batch-invariant mode, a 100-token prompt
 *       through the prefix cache twice (snapshots at 64-token boundaries only): the
 *       tokens of K = 0, and the second pass hits.
 *   (j) the drafting policy: drafts never kept stop being drafted in the default mode (most
 *       steps plain), every step drafts with speculative_always; the tokens are plain
 *       greedy's either way.
 * Batch-invariant runs also compare the reported logprobs bit for bit.
 * The sampled path's distribution is test_spec_sampling. */
#include <pthread.h>
#include <string.h>

#include "qd_fixtures.h"
#include "qd_test.h"
#include "runtime/engine_internal.h"
#include "runtime/grammar/constraint.h"

#define N_REQ 4
#define MAX_OUT 40

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_cv = PTHREAD_COND_INITIALIZER;

typedef struct collector {
    qd_engine *e;
    uint64_t id;
    int32_t toks[MAX_OUT];
    float lps[MAX_OUT]; /* the reported logprobs: bit for bit in batch-invariant mode */
    int n;
    qd_finish_reason finish;
    int finish_events, bad_counts;
    int cancel_at, stop_at; /* cancel itself / return nonzero after this many tokens (0: no) */
} collector;

static int on_event(void *user, const qd_engine_event *ev) {
    collector *c = user;
    int ret = 0;
    pthread_mutex_lock(&g_mu);
    if (ev->has_token && c->n < MAX_OUT) {
        c->lps[c->n] = ev->sample.logprob;
        c->toks[c->n++] = ev->sample.token;
    }
    if (ev->completion_tokens != c->n) c->bad_counts++;
    if (c->cancel_at && c->n == c->cancel_at && ev->finish == QD_FINISH_NONE) qd_engine_cancel(c->e, c->id);
    if (c->stop_at && c->n == c->stop_at) ret = 1;
    if (ev->finish != QD_FINISH_NONE) {
        c->finish = ev->finish;
        c->finish_events++;
        pthread_cond_broadcast(&g_cv);
    }
    pthread_mutex_unlock(&g_mu);
    return ret;
}

static void wait_done(collector *cs, int n) {
    pthread_mutex_lock(&g_mu);
    for (int i = 0; i < n; i++)
        while (!cs[i].finish_events) pthread_cond_wait(&g_cv, &g_mu);
    pthread_mutex_unlock(&g_mu);
}

/* The perfect drafter: the plain run's tokens of each request (by submission index). */
typedef struct replay {
    uint64_t first_id;
    const int32_t (*plain)[MAX_OUT];
    const int *n_plain;
    int n_req;
    int wrong, vocab; /* wrong: each draft one id past the plain token, never kept */
} replay;

static int32_t replay_draft(void *user, uint64_t id, int n_generated, int j) {
    const replay *r = user;
    const int i = (int)(id - r->first_id);
    if (i < 0 || i >= r->n_req || n_generated + j >= r->n_plain[i]) return -1;
    return r->wrong ? (r->plain[i][n_generated + j] + 1) % r->vocab : r->plain[i][n_generated + j];
}

typedef struct fixture {
    const char *dir;
    qd_model *m;
    int32_t prompt[256];
    int n_prompt;
} fixture;

typedef struct run_opts {
    int k, invariant, n_kv_blocks, prefix_cache, perfect, always;
    int cancel_req, cancel_at;  /* request index and token count, -1: none */
    int stop_req, stop_at;
    int max_tokens[N_REQ];
    int32_t stop_token[N_REQ];  /* -1: none */
} run_opts;

static const int g_lens[N_REQ] = {45, 30, 17, 5};

/* Submits N_REQ requests (prompt prefixes of g_lens, the opts' budgets) at once and
 * collects them; the stats after. */
static int run(fixture *f, const run_opts *o, collector *cs, const replay *rp, qd_engine_stats *stats) {
    qd_engine_params ep = qd_engine_default_params();
    ep.max_num_seqs = N_REQ;
    ep.max_model_len = 128;
    ep.max_batch_tokens = 128;
    ep.batch_invariant = o->invariant;
    ep.n_kv_blocks = o->n_kv_blocks;
    ep.speculative_tokens = o->k;
    ep.speculative_always = o->always;
    if (o->prefix_cache) ep.prefix_cache_bytes = 64 << 20;
    qd_engine *e = NULL;
    qd_err err = {0};
    if (qd_engine_create(f->m, &ep, &e, &err) != QD_OK) {
        CHECKF(0, "%s k=%d: engine: %s", f->dir, o->k, err.msg);
        return -1;
    }
    if (rp) {
        e->draft_override = replay_draft;
        e->draft_user = (void *)rp;
    }
    memset(cs, 0, sizeof(collector) * N_REQ);
    for (int i = 0; i < N_REQ; i++) {
        qd_request_params rq = {0};
        rq.sampling = qd_sampling_default_params();
        rq.sampling.temperature = 0.0f;
        rq.max_tokens = o->max_tokens[i];
        rq.ignore_eos = true;
        if (o->stop_token[i] >= 0) {
            rq.n_stop_token_ids = 1;
            rq.stop_token_ids[0] = o->stop_token[i];
        }
        cs[i].e = e;
        if (i == o->cancel_req) cs[i].cancel_at = o->cancel_at;
        if (i == o->stop_req) cs[i].stop_at = o->stop_at;
        if (qd_engine_submit(e, f->prompt, g_lens[i], &rq, on_event, &cs[i], &cs[i].id, &err) != QD_OK) {
            CHECKF(0, "%s: submit: %s", f->dir, err.msg);
            cs[i].finish_events = 1;
        }
    }
    wait_done(cs, N_REQ);
    qd_engine_get_stats(e, stats);
    qd_engine_free(e);
    for (int i = 0; i < N_REQ; i++) CHECKF(cs[i].bad_counts == 0 && cs[i].finish_events == 1, "%s: events", f->dir);
    return 0;
}

static run_opts base_opts(int k, int invariant) {
    run_opts o = {.k = k, .invariant = invariant, .cancel_req = -1, .stop_req = -1};
    const int budgets[N_REQ] = {MAX_OUT, 23, 31, 12};
    for (int i = 0; i < N_REQ; i++) {
        o.max_tokens[i] = budgets[i];
        o.stop_token[i] = -1;
    }
    return o;
}

static int same(const collector *a, const int32_t *b, int n) { return a->n == n && !memcmp(a->toks, b, sizeof(int32_t) * n); }

/* The counters of a speculative run: consistent, and perfect drafts all kept. */
static void check_stats(const fixture *f, const qd_engine_stats *s, int k, int perfect, const char *what) {
    uint64_t at = 0;
    for (int i = 0; i < 4; i++) at += s->spec_accepted_at[i];
    CHECKF(s->spec_verify_steps > 0 && s->spec_draft_tokens <= s->spec_verify_steps * (uint64_t)k &&
               s->spec_accepted_tokens == at && s->spec_accepted_tokens <= s->spec_draft_tokens,
           "%s k=%d %s: %llu steps, %llu drafted, %llu accepted", f->dir, k, what,
           (unsigned long long)s->spec_verify_steps, (unsigned long long)s->spec_draft_tokens,
           (unsigned long long)s->spec_accepted_tokens);
    for (int i = k; i < 4; i++) CHECK(s->spec_accepted_at[i] == 0);
    /* the decode-only steps are a share of the steps and of their forwards' time (the
     * prompts took steps of their own) */
    CHECKF(s->decode_steps > 0 && s->decode_steps < s->steps && s->decode_forward_seconds > 0 &&
               s->decode_forward_seconds <= s->forward_seconds && s->decode_mtp_seconds <= s->mtp_seconds,
           "%s k=%d %s: %llu of %llu steps without a prompt token, %.6f of %.6f s forward, %.6f of %.6f s MTP",
           f->dir, k, what, (unsigned long long)s->decode_steps, (unsigned long long)s->steps,
           s->decode_forward_seconds, s->forward_seconds, s->decode_mtp_seconds, s->mtp_seconds);
    if (perfect)
        CHECKF(s->spec_accepted_tokens == s->spec_draft_tokens, "%s k=%d %s: perfect drafts, %llu of %llu kept", f->dir,
               k, what, (unsigned long long)s->spec_accepted_tokens, (unsigned long long)s->spec_draft_tokens);
}

static void check_fixture(fixture *f) {
    collector plain[2][N_REQ], cs[N_REQ];
    int32_t ptoks[2][N_REQ][MAX_OUT];
    int pn[2][N_REQ];
    qd_engine_stats st;
    for (int inv = 0; inv < 2; inv++) {
        const run_opts o = base_opts(0, inv);
        if (run(f, &o, plain[inv], NULL, &st)) return;
        CHECK(st.spec_verify_steps == 0 && st.spec_draft_tokens == 0);
        for (int i = 0; i < N_REQ; i++) {
            CHECK(plain[inv][i].n == o.max_tokens[i] && plain[inv][i].finish == QD_FINISH_LENGTH);
            memcpy(ptoks[inv][i], plain[inv][i].toks, sizeof ptoks[inv][i]);
            pn[inv][i] = plain[inv][i].n;
        }
    }
    for (int k = 1; k <= 4; k++) {
        for (int inv = 0; inv < 2; inv++) {
            for (int perfect = 0; perfect < 2; perfect++) {
                const run_opts o = base_opts(k, inv);
                replay rp = {.first_id = 1, .plain = (const int32_t(*)[MAX_OUT])ptoks[inv], .n_plain = pn[inv], .n_req = N_REQ};
                if (run(f, &o, cs, perfect ? &rp : NULL, &st)) return;
                int ok = 1, bits = 1;
                for (int i = 0; i < N_REQ; i++) {
                    ok &= same(&cs[i], ptoks[inv][i], pn[inv][i]);
                    bits &= !memcmp(cs[i].lps, plain[inv][i].lps, sizeof(float) * (size_t)pn[inv][i]);
                }
                CHECKF(ok, "%s k=%d %s %s: speculative greedy differs from plain greedy", f->dir, k,
                       inv ? "batch-invariant" : "default mode", perfect ? "perfect drafts" : "MTP drafts");
                /* batch-invariant: the verify rows are the decode rows bit for bit */
                if (inv) CHECKF(bits, "%s k=%d %s: logprobs not bit-identical to plain greedy's", f->dir, k,
                                perfect ? "perfect drafts" : "MTP drafts");
                check_stats(f, &st, k, perfect, perfect ? "perfect" : "MTP");
                if (perfect) /* every step but the last of each request emits k + 1 tokens */
                    CHECKF(st.spec_verify_steps <= (uint64_t)(MAX_OUT + 23 + 31 + 12) / (k + 1) + 4 * N_REQ,
                           "%s k=%d: %llu verify steps with perfect drafts", f->dir, k,
                           (unsigned long long)st.spec_verify_steps);
                printf("  %-22s k=%d %-15s %-7s: %3llu verify steps, %3llu of %3llu drafts kept, == plain\n",
                       f->dir + strlen("tests/fixtures_mtp/"), k, inv ? "batch-invariant" : "default",
                       perfect ? "perfect" : "MTP", (unsigned long long)st.spec_verify_steps,
                       (unsigned long long)st.spec_accepted_tokens, (unsigned long long)st.spec_draft_tokens);
            }
        }
        /* the drafting policy: drafts that are never kept stop being drafted once the costs
         * are measured (a probe step now and then), unless every step must draft; the output
         * is plain greedy's either way */
        for (int always = 0; always < 2; always++) {
            run_opts o = base_opts(k, 0);
            o.always = always;
            replay rp = {.first_id = 1, .plain = (const int32_t(*)[MAX_OUT])ptoks[0], .n_plain = pn[0], .n_req = N_REQ,
                         .wrong = 1, .vocab = qd_model_vocab_size(f->m)};
            if (run(f, &o, cs, &rp, &st)) return;
            int ok = 1;
            for (int i = 0; i < N_REQ; i++) ok &= same(&cs[i], ptoks[0][i], pn[0][i]);
            CHECKF(ok, "%s k=%d wrong drafts%s: output differs from plain greedy", f->dir, k, always ? ", always" : "");
            CHECKF(st.spec_accepted_tokens == 0, "%s k=%d: %llu wrong drafts kept", f->dir, k,
                   (unsigned long long)st.spec_accepted_tokens);
            if (always)
                CHECKF(st.spec_plain_steps == 0, "%s k=%d: %llu plain steps with speculative_always", f->dir, k,
                       (unsigned long long)st.spec_plain_steps);
            else
                CHECKF(st.spec_plain_steps > 0 && st.spec_plain_steps * 4 > st.steps,
                       "%s k=%d wrong drafts: %llu of %llu steps kept plain by the policy", f->dir, k,
                       (unsigned long long)st.spec_plain_steps, (unsigned long long)st.steps);
            if (!always) printf("  %-22s k=%d wrong drafts: %llu of %llu steps plain by the policy, == plain\n",
                                f->dir + strlen("tests/fixtures_mtp/"), k, (unsigned long long)st.spec_plain_steps,
                                (unsigned long long)st.steps);
        }
        /* (b) preemption: 8 blocks of 16 cannot hold the four (up to 85 tokens each) */
        for (int perfect = 0; perfect < 2; perfect++) {
            run_opts o = base_opts(k, 1);
            o.n_kv_blocks = 8;
            replay rp = {.first_id = 1, .plain = (const int32_t(*)[MAX_OUT])ptoks[1], .n_plain = pn[1], .n_req = N_REQ};
            if (run(f, &o, cs, perfect ? &rp : NULL, &st)) return;
            int ok = 1;
            for (int i = 0; i < N_REQ; i++) ok &= same(&cs[i], ptoks[1][i], pn[1][i]);
            CHECKF(st.preemptions > 0, "%s k=%d: no preemption with 8 blocks", f->dir, k);
            CHECKF(ok, "%s k=%d %s: output changed by preemption", f->dir, k, perfect ? "perfect" : "MTP");
            check_stats(f, &st, k, perfect, "preempted");
        }
        /* (c) cancel request 1 after 7 tokens, (d) request 0 asks to stop after 9, request 2
         * stops at a stop token in the middle of a kept run, request 3's max_tokens falls
         * inside a run (perfect drafts, so runs are k + 1 long) */
        {
            run_opts o = base_opts(k, 1);
            o.cancel_req = 1;
            o.cancel_at = 7;
            o.stop_req = 0;
            o.stop_at = 9;
            const int32_t stop_tok = ptoks[1][2][10];
            int first = 0;
            while (ptoks[1][2][first] != stop_tok) first++;
            o.stop_token[2] = stop_tok;
            o.max_tokens[3] = 6;
            replay rp = {.first_id = 1, .plain = (const int32_t(*)[MAX_OUT])ptoks[1], .n_plain = pn[1], .n_req = N_REQ};
            if (run(f, &o, cs, &rp, &st)) return;
            CHECKF(cs[0].finish == QD_FINISH_STOP && same(&cs[0], ptoks[1][0], 9), "%s k=%d: stop at 9: %d tokens",
                   f->dir, k, cs[0].n);
            CHECKF(cs[1].finish == QD_FINISH_CANCELLED && cs[1].n >= 7 && same(&cs[1], ptoks[1][1], cs[1].n),
                   "%s k=%d: cancelled after %d tokens", f->dir, k, cs[1].n);
            CHECKF(cs[2].finish == QD_FINISH_EOS && same(&cs[2], ptoks[1][2], first + 1),
                   "%s k=%d: stop token %d first at %d: %d tokens", f->dir, k, stop_tok, first, cs[2].n);
            CHECKF(cs[3].finish == QD_FINISH_LENGTH && same(&cs[3], ptoks[1][3], 6), "%s k=%d: max_tokens 6: %d tokens",
                   f->dir, k, cs[3].n);
        }
        /* (e) the prefix cache: run the same four twice on one engine (the default mode:
         * batch-invariant mode snapshots only at multiples of 64 prompt tokens) */
        {
            qd_engine_params ep = qd_engine_default_params();
            ep.max_num_seqs = N_REQ;
            ep.max_model_len = 128;
            ep.max_batch_tokens = 128;
            ep.speculative_tokens = k;
            ep.prefix_cache_bytes = 64 << 20;
            qd_engine *e = NULL;
            qd_err err = {0};
            CHECKF(qd_engine_create(f->m, &ep, &e, &err) == QD_OK, "%s: %s", f->dir, err.msg);
            if (!e) return;
            const run_opts o = base_opts(k, 0);
            for (int pass = 0; pass < 2; pass++) {
                memset(cs, 0, sizeof cs);
                for (int i = 0; i < N_REQ; i++) {
                    qd_request_params rq = {0};
                    rq.sampling = qd_sampling_default_params();
                    rq.sampling.temperature = 0.0f;
                    rq.max_tokens = o.max_tokens[i];
                    rq.ignore_eos = true;
                    cs[i].e = e;
                    CHECK(qd_engine_submit(e, f->prompt, g_lens[i], &rq, on_event, &cs[i], &cs[i].id, &err) == QD_OK);
                    wait_done(&cs[i], 1); /* one at a time: the second pass finds each cached */
                }
                int ok = 1;
                for (int i = 0; i < N_REQ; i++) ok &= same(&cs[i], ptoks[0][i], pn[0][i]);
                qd_engine_get_stats(e, &st);
                CHECKF(ok, "%s k=%d prefix cache pass %d: output differs from plain greedy", f->dir, k, pass);
                if (pass == 1)
                    CHECKF(st.prefix_hit_tokens > 0, "%s k=%d: the second pass hit no cached prefix", f->dir, k);
            }
            qd_engine_free(e);
        }
    }
}

static int load(fixture *f, const char *name) {
    static char dirs[3][256];
    static int n_dirs;
    char *dir = dirs[n_dirs++ % 3];
    snprintf(dir, 256, "tests/fixtures_mtp/%s", name);
    f->dir = dir;
    char path[512], err[512];
    snprintf(path, sizeof path, "%s/prompt.ids", dir);
    char *t = qd_test_read_file(path, NULL);
    f->n_prompt = t ? qd_fixture_parse_ids(t, f->prompt, 256) : 0;
    free(t);
    qd_model_params mp = qd_model_default_params();
    mp.path = dir;
    mp.n_threads = 2;
    f->m = NULL;
    CHECKF(f->n_prompt >= 45 && qd_model_load(&mp, &f->m, err, sizeof err) == QD_OK, "%s: %s", dir, err);
    return f->m ? 0 : -1;
}

/* (g) the errors engine creation gives */
static void check_errors(fixture *f) {
    qd_engine_params ep = qd_engine_default_params();
    ep.max_num_seqs = 2;
    ep.max_model_len = 64;
    qd_engine *e = NULL;
    qd_err err = {0};
    ep.speculative_tokens = 5;
    CHECK(qd_engine_create(f->m, &ep, &e, &err) == QD_ERR_INVALID_ARG && strstr(err.msg, "speculative_tokens 5"));
    ep.speculative_tokens = -1;
    CHECK(qd_engine_create(f->m, &ep, &e, &err) == QD_ERR_INVALID_ARG && strstr(err.msg, "speculative_tokens"));
    /* a model without an MTP head: the fp32 golden fixtures have none */
    char *dirs[32];
    const int n = qd_fixture_dirs("config.json", dirs, 32);
    CHECK(n > 0);
    for (int i = 0; i < n; i++) {
        qd_model_params mp = qd_model_default_params();
        mp.path = dirs[i];
        mp.n_threads = 1;
        qd_model *m = NULL;
        char lerr[512];
        if (i == 0 && qd_model_load(&mp, &m, lerr, sizeof lerr) == QD_OK) {
            CHECK(!qd_model_has_mtp(m, NULL, 0));
            ep.speculative_tokens = 2;
            qd_err e2 = {0};
            CHECK(qd_engine_create(m, &ep, &e, &e2) == QD_ERR_UNSUPPORTED && e == NULL);
            CHECKF(strstr(e2.msg, "speculative decoding") && strstr(e2.msg, "MTP"), "no-MTP error: %s", e2.msg);
            printf("  no MTP head: %s\n", e2.msg);
            qd_model_free(m);
        }
        free(dirs[i]);
    }
}

/* (h): tokens are single bytes (ids < 256; the rest left out of the trie), the grammar
 * one or more of 'a'..'p'. */
static void check_constrained(fixture *f) {
    const int V = qd_model_vocab_size(f->m);
    unsigned char bytes[256];
    const unsigned char *toks[512];
    int lens[512];
    for (int i = 0; i < V && i < 512; i++) {
        if (i < 256) bytes[i] = (unsigned char)i;
        toks[i] = i < 256 ? &bytes[i] : NULL;
        lens[i] = i < 256 ? 1 : -1;
    }
    qd_token_trie *trie = NULL;
    qd_err err = {0};
    CHECKF(qd_token_trie_build_bytes(toks, lens, V, &trie, &err) == QD_OK, "trie: %s", err.msg);
    if (!trie) return;
    int32_t out[2][2][MAX_OUT], n_out[2][2];
    uint64_t steps[2];
    for (int k = 0; k <= 2; k += 2) {
        qd_engine_params ep = qd_engine_default_params();
        ep.max_num_seqs = 2;
        ep.max_model_len = 128;
        ep.speculative_tokens = k;
        qd_engine *e = NULL;
        CHECKF(qd_engine_create(f->m, &ep, &e, &err) == QD_OK, "%s", err.msg);
        if (!e) break;
        collector cs[2];
        memset(cs, 0, sizeof cs);
        for (int i = 0; i < 2; i++) {
            qd_request_params rq = {0};
            rq.sampling = qd_sampling_default_params();
            rq.sampling.temperature = 0.0f;
            rq.max_tokens = 16;
            rq.ignore_eos = true;
            if (i == 0) {
                qd_grammar *g = qd_grammar_new();
                const int root = qd_grammar_rule(g);
                const int32_t letter = qd_grammar_range(g, 'a', 'p'), more[2] = {letter, root};
                qd_grammar_alt(g, root, more, 2);
                qd_grammar_alt(g, root, &letter, 1);
                CHECK(qd_grammar_finish(g, root, &err) == QD_OK);
                const int32_t *eos;
                const int n_eos = qd_model_eos_ids(f->m, &eos);
                const qd_constraint_params cp = {.trie = trie, .grammar = g, .eos = eos, .n_eos = n_eos, .start_after = -1};
                CHECKF(qd_constraint_create(&cp, &rq.constraint, &err) == QD_OK, "constraint: %s", err.msg);
            }
            cs[i].e = e;
            CHECKF(qd_engine_submit(e, f->prompt, g_lens[i], &rq, on_event, &cs[i], &cs[i].id, &err) == QD_OK, "%s",
                   err.msg);
        }
        wait_done(cs, 2);
        qd_engine_stats st;
        qd_engine_get_stats(e, &st);
        qd_engine_free(e);
        steps[k / 2] = st.spec_verify_steps;
        for (int i = 0; i < 2; i++) {
            memcpy(out[k / 2][i], cs[i].toks, sizeof(int32_t) * MAX_OUT);
            n_out[k / 2][i] = cs[i].n;
        }
        int in_grammar = cs[0].n > 0;
        for (int t = 0; t < cs[0].n; t++) in_grammar &= cs[0].toks[t] >= 'a' && cs[0].toks[t] <= 'p';
        CHECKF(in_grammar, "K=%d: the constrained output leaves the grammar", k);
    }
    /* the unconstrained request alone decodes 16 tokens: at most 15 verify steps, all its own */
    CHECKF(steps[0] == 0 && steps[1] > 0 && steps[1] <= 15, "verify steps %llu / %llu", (unsigned long long)steps[0],
           (unsigned long long)steps[1]);
    for (int i = 0; i < 2; i++)
        CHECKF(n_out[0][i] == n_out[1][i] && !memcmp(out[0][i], out[1][i], sizeof(int32_t) * (size_t)n_out[0][i]),
               "request %d (%s): K=2 differs from K=0", i, i ? "unconstrained" : "constrained");
    printf("  constrained request beside an unconstrained one: %llu verify steps (the unconstrained one's), outputs == K=0\n",
           (unsigned long long)steps[1]);
    qd_token_trie_free(trie);
}

/* (i): one engine per K in {0, k}; n forks of a 45-token prompt, then a 100-token prompt
 * twice (invariant mode, cache on). Returns via out [2][n + 2][MAX_OUT]. */
static void forks_and_cache(fixture *f, int k, int32_t out[5][MAX_OUT], int n_out[5], uint64_t *hits,
                            uint64_t *verify) {
    qd_engine_params ep = qd_engine_default_params();
    ep.max_num_seqs = 4;
    ep.max_model_len = 160;
    ep.max_batch_tokens = 128;
    ep.batch_invariant = 1;
    ep.speculative_tokens = k;
    ep.prefix_cache_bytes = 64 << 20;
    qd_engine *e = NULL;
    qd_err err = {0};
    CHECKF(qd_engine_create(f->m, &ep, &e, &err) == QD_OK, "%s", err.msg);
    if (!e) return;
    collector cs[5];
    memset(cs, 0, sizeof cs);
    qd_request_params rq = {0};
    rq.sampling = qd_sampling_default_params();
    rq.sampling.temperature = 0.0f;
    rq.max_tokens = 20;
    rq.ignore_eos = true;
    void *users[3] = {&cs[0], &cs[1], &cs[2]};
    uint64_t ids[3];
    for (int i = 0; i < 5; i++) cs[i].e = e;
    CHECKF(qd_engine_submit_n(e, f->prompt, 45, &rq, 3, on_event, users, ids, &err) == QD_OK, "%s", err.msg);
    wait_done(cs, 3);
    int32_t longp[100];
    for (int i = 0; i < 100; i++) longp[i] = f->prompt[i % 45];
    for (int pass = 0; pass < 2; pass++) {
        CHECK(qd_engine_submit(e, longp, 100, &rq, on_event, &cs[3 + pass], &cs[3 + pass].id, &err) == QD_OK);
        wait_done(&cs[3 + pass], 1);
    }
    qd_engine_stats st;
    qd_engine_get_stats(e, &st);
    qd_engine_free(e);
    for (int i = 0; i < 5; i++) {
        memcpy(out[i], cs[i].toks, sizeof(int32_t) * MAX_OUT);
        n_out[i] = cs[i].n;
    }
    *hits = st.prefix_hit_tokens;
    *verify = st.spec_verify_steps;
}

static void check_forks_and_cache(fixture *f) {
    int32_t ref[5][MAX_OUT], got[5][MAX_OUT];
    int n_ref[5], n_got[5];
    uint64_t hits, verify;
    forks_and_cache(f, 0, ref, n_ref, &hits, &verify);
    for (int k = 1; k <= 4; k += 3) {
        forks_and_cache(f, k, got, n_got, &hits, &verify);
        for (int i = 0; i < 5; i++)
            CHECKF(n_got[i] == 20 && n_got[i] == n_ref[i] && !memcmp(got[i], ref[i], sizeof(int32_t) * 20),
                   "%s k=%d: %s %d differs from K=0", f->dir, k, i < 3 ? "fork" : "cached prompt pass", i < 3 ? i : i - 3);
        CHECKF(hits >= 64 && verify > 0, "%s k=%d: %llu prefix hit tokens, %llu verify steps", f->dir, k,
               (unsigned long long)hits, (unsigned long long)verify);
    }
}

int main(void) {
    const char *names[3] = {"qwen3_5_dense_mtp", "qwen3_5_moe_fused_mtp", "qwen3_next_moe_mtp"};
    for (int i = 0; i < 3; i++) {
        fixture f;
        if (load(&f, names[i])) continue;
        if (i == 0) check_errors(&f);
        if (i == 0) check_constrained(&f);
        check_forks_and_cache(&f);
        check_fixture(&f);
        qd_model_free(f.m);
    }
    return qd_test_finish("test_spec_engine");
}
