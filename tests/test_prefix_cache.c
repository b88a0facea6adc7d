/* The prefix cache (src/runtime/prefix_cache.h) alone and inside the engine:
 *   (a) isolation, property test on the tree alone: random token sequences over a tiny
 *       alphabet (so prefixes are shared and edges split), snapshots whose payload is
 *       a hash of exactly the tokens they cover; every lookup must return a snapshot
 *       whose payload matches the query's prefix of that length (never one of other
 *       tokens), the longest present one when nothing was evicted, and the tree's
 *       invariants hold throughout, also under a tiny budget (evictions);
 *   (b) exactness in the engine, greedy on fp32 fixtures: requests sharing prefixes of
 *       every length class (< 1 block, a block boundary exactly, the whole prompt, a
 *       random one) give exactly the tokens of an engine without the cache, solo and
 *       interleaved (all submitted together), with a large budget and with a tiny one
 *       (evictions); blocks are never lost (idle: blocks used = blocks the cache holds);
 *   (c) multi-turn conversations: turn k+1's prompt = turn k's prompt + reply + new
 *       tokens; every turn after the first hits at least the previous prompt and reply
 *       (minus the last token) and the replies equal those without the cache. */
#include <pthread.h>
#include <string.h>
#include <unistd.h>

#include "qd_test.h"
#include "runtime/engine.h"
#include "runtime/prefix_cache.h"

static qd_test_rng rng;

/* ------------------------------------------------------------ (a) property */

static uint64_t hash_tokens(const int32_t *t, int n) {
    uint64_t h = 1469598103934665603ull ^ (uint64_t)n;
    for (int i = 0; i < n; i++) h = (h ^ (uint64_t)(uint32_t)t[i]) * 1099511628211ull;
    return h;
}

#define P_SEQS 200
#define P_LEN 40

static void property(size_t budget, int check_longest) {
    const size_t snap = 64;
    qd_prefix_cache *pc = NULL;
    qd_err err = {0};
    CHECKF(qd_prefix_cache_create(NULL, budget, snap, 0, &pc, &err) == QD_OK, "create: %s", err.msg);
    if (!pc) return;
    static int32_t seqs[P_SEQS][P_LEN];
    static int lens[P_SEQS];
    int n_ins = 0;
    for (int it = 0; it < 3000; it++) {
        int32_t q[P_LEN];
        int n = 1 + (int)(qd_test_next(&rng) % P_LEN);
        /* often start from an inserted sequence so that lookups hit */
        if (n_ins > 0 && qd_test_next(&rng) % 4 != 0) {
            int j = (int)(qd_test_next(&rng) % (uint64_t)n_ins);
            memcpy(q, seqs[j], sizeof q);
            for (int k = (int)(qd_test_next(&rng) % P_LEN); k < P_LEN; k++)
                if (qd_test_next(&rng) % 3 == 0) q[k] = (int32_t)(qd_test_next(&rng) % 3);
        } else {
            for (int k = 0; k < P_LEN; k++) q[k] = (int32_t)(qd_test_next(&rng) % 3);
        }
        const uint64_t key = qd_test_next(&rng) % 2; /* two model identities */
        if (qd_test_next(&rng) % 2 == 0 && n_ins < P_SEQS) {
            void *buf = qd_prefix_cache_insert(pc, key, q, n, NULL, 0);
            if (buf) {
                uint64_t h = hash_tokens(q, n) ^ key;
                memset(buf, 0, snap);
                memcpy(buf, &h, sizeof h);
                qd_prefix_cache_enforce_budget(pc);
                memcpy(seqs[n_ins], q, sizeof q);
                lens[n_ins++] = n | (int)(key << 16);
            }
        } else {
            qd_prefix_hit hit;
            qd_prefix_cache_lookup(pc, key, q, n, &hit);
            CHECKF(hit.n_tokens >= 0 && hit.n_tokens <= n && hit.n_matched >= hit.n_tokens && hit.n_matched <= n,
                   "hit %d matched %d of %d", hit.n_tokens, hit.n_matched, n);
            if (hit.n_tokens > 0) {
                uint64_t h;
                memcpy(&h, hit.snapshot, sizeof h);
                CHECKF(h == (hash_tokens(q, hit.n_tokens) ^ key),
                       "iteration %d: a snapshot of other tokens was returned for a %d-token prefix", it, hit.n_tokens);
            }
            if (check_longest) { /* brute force: the longest inserted prefix of q under key */
                int best = 0;
                for (int j = 0; j < n_ins; j++) {
                    int l = lens[j] & 0xffff;
                    if ((uint64_t)(lens[j] >> 16) == key && l <= n && l > best &&
                        memcmp(seqs[j], q, sizeof(int32_t) * (size_t)l) == 0)
                        best = l;
                }
                CHECKF(hit.n_tokens == best, "iteration %d: hit %d, longest cached prefix %d", it, hit.n_tokens, best);
            }
        }
        if (it % 97 == 0) {
            int depths[P_LEN];
            int k = qd_prefix_cache_check(pc, key, q, n, depths, P_LEN);
            CHECKF(k >= 0, "iteration %d: tree invariants broken", it);
        }
    }
    qd_prefix_cache_stats st;
    qd_prefix_cache_get_stats(pc, &st);
    CHECK(st.bytes <= budget);
    if (budget < 64 * 10) CHECKF(st.evictions > 0, "tiny budget: %llu evictions", (unsigned long long)st.evictions);
    qd_prefix_cache_free(pc);
}

/* ------------------------------------------------------------ (b), (c) engine */

#define MAX_OUT 32
#define MAX_PROMPT 240

typedef struct collector {
    int32_t toks[MAX_OUT];
    int n;
    qd_finish_reason finish;
    int done;
} collector;

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_cv = PTHREAD_COND_INITIALIZER;

static int on_event(void *user, const qd_engine_event *ev) {
    collector *c = user;
    pthread_mutex_lock(&g_mu);
    if (ev->has_token && c->n < MAX_OUT) c->toks[c->n++] = ev->sample.token;
    if (ev->finish != QD_FINISH_NONE) {
        c->finish = ev->finish;
        c->done = 1;
        pthread_cond_broadcast(&g_cv);
    }
    pthread_mutex_unlock(&g_mu);
    return 0;
}

typedef struct req {
    int32_t prompt[MAX_PROMPT];
    int n_prompt, max_tokens;
} req;

static qd_engine *make_engine_blocks(qd_model *m, size_t cache_bytes, int interval, int n_kv_blocks) {
    qd_engine_params p = qd_engine_default_params();
    p.n_kv_blocks = n_kv_blocks;
    p.max_num_seqs = 4;
    p.max_model_len = 320;
    p.max_batch_tokens = 48;
    p.kv_block_size = 16;
    p.prefix_cache_bytes = cache_bytes;
    p.prefix_snapshot_interval = interval;
    qd_engine *e = NULL;
    qd_err err = {0};
    CHECKF(qd_engine_create(m, &p, &e, &err) == QD_OK, "engine: %s", err.msg);
    return e;
}

static qd_engine *make_engine(qd_model *m, size_t cache_bytes, int interval) {
    return make_engine_blocks(m, cache_bytes, interval, 0);
}

static void run(qd_engine *e, const req *rs, int n, collector *cs) {
    for (int i = 0; i < n; i++) {
        memset(&cs[i], 0, sizeof cs[i]);
        qd_request_params rp = {.sampling = qd_sampling_default_params(), .max_tokens = rs[i].max_tokens,
                                .ignore_eos = true};
        rp.sampling.temperature = 0.0f;
        uint64_t id;
        qd_err err = {0};
        if (qd_engine_submit(e, rs[i].prompt, rs[i].n_prompt, &rp, on_event, &cs[i], &id, &err) != QD_OK) {
            CHECKF(0, "submit: %s", err.msg);
            cs[i].done = 1;
        }
    }
    pthread_mutex_lock(&g_mu);
    for (int i = 0; i < n; i++)
        while (!cs[i].done) pthread_cond_wait(&g_cv, &g_mu);
    pthread_mutex_unlock(&g_mu);
}

static void stats_idle(qd_engine *e, qd_engine_stats *s) {
    for (int tries = 0; tries < 500; tries++) { /* published at the next boundary */
        qd_engine_get_stats(e, s);
        if (s->running == 0 && s->waiting == 0 && s->slots_used == 0) break;
        usleep(1000);
    }
}

static int same(const collector *a, const collector *b) {
    return a->n == b->n && a->finish == b->finish && memcmp(a->toks, b->toks, sizeof(int32_t) * (size_t)a->n) == 0;
}

#define N_REQ 14

/* Prompts sharing a base prefix of every length class with each other. */
static void make_requests(req *rs, int V) {
    int32_t base[MAX_PROMPT];
    for (int t = 0; t < MAX_PROMPT; t++) base[t] = (int32_t)(qd_test_next(&rng) % (uint64_t)V);
    const int shared[N_REQ] = {0, 5, 16, 32, 15, 17, 60, -1, -1, 100, 3, 48, 1, 0};
    for (int i = 0; i < N_REQ; i++) {
        req *r = &rs[i];
        int s = shared[i];
        if (s < 0) { /* the whole prompt of an earlier request, or of a prefix-only request */
            *r = rs[i == 7 ? 2 : 6];
            r->max_tokens = 1 + (int)(qd_test_next(&rng) % 12);
            continue;
        }
        r->n_prompt = s + 1 + (int)(qd_test_next(&rng) % 70);
        memcpy(r->prompt, base, sizeof(int32_t) * (size_t)s);
        for (int t = s; t < r->n_prompt; t++) r->prompt[t] = (int32_t)(qd_test_next(&rng) % (uint64_t)V);
        if (i == 12) r->n_prompt = 1; /* a one-token prompt: nothing to hit */
        r->max_tokens = 1 + (int)(qd_test_next(&rng) % 12);
    }
}

static void exactness(qd_model *m, const char *dir) {
    const int V = qd_model_vocab_size(m);
    static req rs[N_REQ];
    static collector ref[N_REQ], got[N_REQ];
    make_requests(rs, V);
    qd_engine *e = make_engine(m, 0, 0);
    if (!e) return;
    for (int i = 0; i < N_REQ; i++) run(e, &rs[i], 1, &ref[i]);
    qd_engine_free(e);

    const size_t budgets[2] = {(size_t)1 << 30, 1}; /* 1 byte: everything evicted at once */
    const size_t small = 3; /* snapshots, in units of one snapshot + its blocks (set below) */
    for (int b = 0; b < 4; b++) {
        size_t budget = b < 2 ? budgets[b] : b == 3 ? budgets[0] : 0;
        if (b == 2) { /* a few snapshots: evictions of live and dead prefixes mid-run */
            e = make_engine(m, (size_t)1 << 30, 16);
            if (!e) return;
            run(e, &rs[1], 1, &got[1]);
            qd_engine_stats s;
            stats_idle(e, &s);
            budget = small * (s.prefix_snapshots ? s.prefix_bytes / (size_t)s.prefix_snapshots : 4096);
            qd_engine_free(e);
        }
        /* b == 3: a KV pool of 14 blocks (224 tokens) for 4 sequences of up to ~190 tokens:
         * the cache must give its blocks back (evictions before preemptions), and
         * preempted requests are readmitted through the cache */
        e = make_engine_blocks(m, budget, 16, b == 3 ? 14 : 0);
        if (!e) return;
        /* solo, in order: each later request can hit what earlier ones left */
        for (int i = 0; i < N_REQ; i++) {
            run(e, &rs[i], 1, &got[i]);
            CHECKF(same(&got[i], &ref[i]), "%s: budget %zu: solo request %d (prompt %d) differs with the cache", dir,
                   budget, i, rs[i].n_prompt);
        }
        /* interleaved: all at once, against a warm cache */
        run(e, rs, N_REQ, got);
        for (int i = 0; i < N_REQ; i++)
            CHECKF(same(&got[i], &ref[i]), "%s: budget %zu: interleaved request %d differs with the cache", dir, budget,
                   i);
        qd_engine_stats s;
        stats_idle(e, &s);
        printf("  %s: budget %zu: hit %llu of %llu tokens, %d snapshots (%zu bytes), %llu evictions\n", dir, budget,
               (unsigned long long)s.prefix_hit_tokens, (unsigned long long)s.prefix_query_tokens, s.prefix_snapshots,
               s.prefix_bytes, (unsigned long long)s.prefix_evictions);
        CHECKF(s.kv_blocks_used == s.prefix_blocks, "%s: idle engine holds %d blocks, the cache %d", dir,
               s.kv_blocks_used, s.prefix_blocks);
        CHECK(s.prefix_bytes <= budget);
        if (b == 0) CHECKF(s.prefix_hit_tokens > 0, "%s: no hits", dir);
        if (b == 1) CHECK(s.prefix_hit_tokens == 0 && s.prefix_snapshots == 0);
        /* hits under these budgets depend on the order of evictions: only exactness is required */
        if (b >= 2) CHECKF(s.prefix_evictions > 0, "%s: small budget or pool: %llu evictions", dir,
                           (unsigned long long)s.prefix_evictions);
        if (b == 3) printf("  %s: small KV pool: %llu preemptions\n", dir, (unsigned long long)s.preemptions);
        qd_engine_free(e);
    }
}

#define TURNS 5

static void multi_turn(qd_model *m, const char *dir) {
    const int V = qd_model_vocab_size(m);
    static req turns[TURNS];
    static collector ref[TURNS], got[TURNS];
    qd_engine *plain = make_engine(m, 0, 0), *cached = make_engine(m, (size_t)1 << 30, 0);
    if (!plain || !cached) return;
    int n = 0;
    int32_t conv[MAX_PROMPT];
    for (int k = 0; k < TURNS; k++) {
        int user = 3 + (int)(qd_test_next(&rng) % 20);
        for (int t = 0; t < user && n < MAX_PROMPT - MAX_OUT; t++) conv[n++] = (int32_t)(qd_test_next(&rng) % (uint64_t)V);
        req *r = &turns[k];
        memcpy(r->prompt, conv, sizeof(int32_t) * (size_t)n);
        r->n_prompt = n;
        r->max_tokens = 4 + (int)(qd_test_next(&rng) % 12);
        run(plain, r, 1, &ref[k]);
        qd_engine_stats before, after;
        stats_idle(cached, &before);
        run(cached, r, 1, &got[k]);
        stats_idle(cached, &after);
        CHECKF(same(&got[k], &ref[k]), "%s: turn %d differs with the cache", dir, k);
        const int hit = (int)(after.prefix_hit_tokens - before.prefix_hit_tokens);
        if (k > 0) {
            /* the previous turn's prompt + reply, less its last token (never fed) */
            const int want = turns[k - 1].n_prompt + ref[k - 1].n - 1;
            CHECKF(hit >= want, "%s: turn %d hit %d tokens, expected at least %d", dir, k, hit, want);
        }
        for (int t = 0; t < ref[k].n && n < MAX_PROMPT; t++) conv[n++] = ref[k].toks[t];
    }
    qd_engine_free(plain);
    qd_engine_free(cached);
}

static qd_model *load(const char *dir) {
    qd_model_params mp = qd_model_default_params();
    mp.path = dir;
    mp.n_threads = 2;
    qd_model *m;
    char err[1024];
    if (qd_model_load(&mp, &m, err, sizeof err) != QD_OK) {
        CHECKF(0, "%s: %s", dir, err);
        return NULL;
    }
    return m;
}

int main(void) {
    rng = qd_test_rng_from_env();
    property((size_t)1 << 30, 1);
    property(64 * 5, 0);
    const char *dirs[] = {"tests/fixtures/qwen3_5_dense_f32", "tests/fixtures/qwen3_next_moe_f32", "models/qdelta-tiny"};
    for (size_t i = 0; i < sizeof dirs / sizeof dirs[0]; i++) {
        qd_model *m = load(dirs[i]);
        if (!m) continue;
        exactness(m, dirs[i]);
        multi_turn(m, dirs[i]);
        qd_model_free(m);
    }
    return qd_test_finish("test_prefix_cache");
}
