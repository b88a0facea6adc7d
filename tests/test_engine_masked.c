/* Constrained greedy requests decided by the forward's argmax under their grammar's mask
 * (scheduler.c: greedy_masked; qd_forward_args.allow) against the host path (the logits
 * row masked by qd_constraint_mask_logits, then the sampler), on the default model with
 * its own tokenizer's trie (8005 ids of 8192 logits: the ids past the trie are refused
 * once the grammar applies, allowed before).
 *
 * The host path is forced by asking for one top logprob, which only the sampler
 * reports; everything else about the request is the same. For each schema and prompt,
 * token for token and logprob for logprob (within the two log-sum-exp formulas' 1e-5),
 * the device path's output must equal the host path's, and every token of the one (none
 * of the other) must have gone through the masked argmax (stats masked_rows_total).
 * Covered: several schemas, small budgets (the masks that close the value in time), a
 * grammar that starts after </think> (the budget forces it), a tokenizer vocab_limit,
 * a step mixing masked rows with plain greedy and sampled requests, min_tokens (host
 * path until it is reached), n > 1 (the first token from the host path, to fork from),
 * and a grammar with nothing left to allow (no EOS given): both paths end the request
 * with an error, the device path saying that the grammar allows no token. */
#include <pthread.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include <jansson.h>

#include "io/tokenizer.h"
#include "qd_fixtures.h"
#include "qd_engine_run.h"
#include "qd_test.h"
#include "runtime/engine.h"
#include "runtime/grammar/constraint.h"
#include "runtime/grammar/json_schema.h"
#include "runtime/grammar/token_trie.h"

#define MAX_OUT 64
#define MAX_REQ 8

typedef struct env {
    qd_model *m;
    const qd_token_trie *trie;
    qd_engine *e;
    const int32_t *eos;
    int n_eos, V;
    int32_t think_end;
    qd_test_rng rng;
} env;

static qd_constraint *make(const env *v, const char *schema_text, int with_eos, int32_t start_after) {
    json_t *schema = json_loads(schema_text, 0, NULL);
    qd_grammar *g = NULL;
    qd_err err = {0};
    qd_constraint *c = NULL;
    if (schema && qd_json_schema_grammar(schema, &g, &err) == QD_OK) {
        qd_constraint_params cp = {.trie = v->trie, .grammar = g, .eos = v->eos, .n_eos = with_eos ? v->n_eos : 0,
                                   .start_after = start_after};
        if (qd_constraint_create(&cp, &c, &err) != QD_OK) c = NULL;
    }
    CHECKF(c != NULL, "constraint for %s: %s", schema_text, err.msg);
    json_decref(schema);
    return c;
}

/* One constrained request's parameters; host: one top logprob, which sends its rows the
 * host path. */
typedef struct req {
    const char *schema;
    int max_tokens, min_tokens, vocab_limit, with_eos;
    int32_t start_after;
} req;

static qd_request_params params_of(const env *v, const req *q, int host) {
    qd_request_params p;
    memset(&p, 0, sizeof p);
    p.sampling = qd_sampling_default_params();
    p.sampling.temperature = 0.0f;
    p.sampling.n_logprobs = host ? 1 : 0;
    p.sampling.vocab_limit = q->vocab_limit;
    p.max_tokens = q->max_tokens;
    p.min_tokens = q->min_tokens;
    p.constraint = make(v, q->schema, q->with_eos, q->start_after);
    return p;
}

static uint64_t masked_rows(qd_engine *e) {
    qd_engine_stats st;
    qd_engine_get_stats(e, &st);
    return st.masked_rows_total;
}

/* The two runs of one request agree token for token. */
static void compare(const qd_run *dev, const qd_run *host, const char *what) {
    CHECKF(dev->finish == host->finish, "%s: finish %d on the device path, %d on the host's", what, dev->finish,
           host->finish);
    CHECKF(dev->n == host->n, "%s: %d tokens on the device path, %d on the host's", what, dev->n, host->n);
    for (int i = 0; i < dev->n && i < host->n; i++) {
        CHECKF(dev->toks[i] == host->toks[i], "%s: token %d: %d on the device path, %d on the host's", what, i,
               dev->toks[i], host->toks[i]);
        CHECKF(fabsf(dev->lps[i] - host->lps[i]) <= 1e-5f + 1e-5f * fabsf(host->lps[i]),
               "%s: token %d: logprob %.8g on the device path, %.8g on the host's", what, i, dev->lps[i], host->lps[i]);
    }
}

/* n constrained requests at once (plus, with mix, a plain greedy and a sampled request
 * in the same steps), once per path: the same outputs, and the device path's tokens
 * all masked on the device but those under min_tokens. */
static void check_batch(env *v, const req *qs, int n, int mix, const char *what) {
    int32_t prompts[MAX_REQ][24];
    int lens[MAX_REQ];
    for (int i = 0; i < n; i++) {
        lens[i] = 2 + (int)(qd_test_next(&v->rng) % 22);
        for (int t = 0; t < lens[i]; t++) prompts[i][t] = (int32_t)(qd_test_next(&v->rng) % (uint64_t)v->V);
    }
    qd_run out[2][MAX_REQ], extra[2][2];
    uint64_t rows[2];
    for (int host = 0; host < 2; host++) {
        const uint64_t before = masked_rows(v->e);
        qd_err err = {0};
        uint64_t id;
        for (int i = 0; i < n; i++) {
            qd_request_params p = params_of(v, &qs[i], host);
            qd_run_init(&out[host][i]);
            CHECKF(qd_engine_submit(v->e, prompts[i], lens[i], &p, qd_run_on_event, &out[host][i], &id, &err) == QD_OK,
                   "%s: submit: %s", what, err.msg);
        }
        if (mix) {
            qd_request_params p;
            memset(&p, 0, sizeof p);
            p.sampling = qd_sampling_default_params();
            p.max_tokens = 20;
            p.sampling.vocab_limit = qs[0].vocab_limit; /* one bound for the step's greedy rows, as a server's */
            for (int k = 0; k < 2; k++) {
                p.sampling.temperature = k ? 0.8f : 0.0f; /* a plain greedy row, a sampled one */
                p.sampling.seed = 7;
                qd_run_init(&extra[host][k]);
                CHECKF(qd_engine_submit(v->e, prompts[0], lens[0], &p, qd_run_on_event, &extra[host][k], &id, &err) == QD_OK,
                       "%s: submit: %s", what, err.msg);
            }
        }
        for (int i = 0; i < n; i++) qd_run_wait(&out[host][i]);
        for (int k = 0; mix && k < 2; k++) qd_run_wait(&extra[host][k]);
        rows[host] = masked_rows(v->e) - before;
    }
    uint64_t generated = 0, min_tok = 0;
    for (int i = 0; i < n; i++) {
        char label[160];
        snprintf(label, sizeof label, "%s, request %d (%s)", what, i, qs[i].schema);
        compare(&out[0][i], &out[1][i], label);
        CHECKF(out[0][i].n >= 1 && out[0][i].finish != QD_FINISH_ERROR, "%s: %d tokens, finish %d (%s)", label,
               out[0][i].n, out[0][i].finish, out[0][i].error);
        generated += (uint64_t)out[0][i].n;
        min_tok += (uint64_t)(qs[i].min_tokens < out[0][i].n ? qs[i].min_tokens : out[0][i].n);
    }
    for (int k = 0; mix && k < 2; k++) compare(&extra[0][k], &extra[1][k], "the unconstrained requests beside them");
    /* every token of the device run but those under min_tokens went through the mask */
    CHECKF(rows[0] == generated - min_tok, "%s: %llu rows masked on the device path for %llu tokens (%llu under "
           "min_tokens)", what, (unsigned long long)rows[0], (unsigned long long)generated,
           (unsigned long long)min_tok);
    CHECKF(rows[1] == 0, "%s: %llu rows masked on the host path", what, (unsigned long long)rows[1]);
}

static const char *const SCHEMAS[] = {
    "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\",\"minimum\":0,\"maximum\":99},"
    "\"b\":{\"enum\":[\"x\",\"yy\",\"zzz\"]}},\"required\":[\"a\",\"b\"],\"additionalProperties\":false}",
    "{\"type\":\"array\",\"items\":{\"type\":\"boolean\"},\"minItems\":1,\"maxItems\":3}",
    "{\"type\":\"string\",\"maxLength\":6}",
    "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"minLength\":3,\"maxLength\":40},"
    "\"tags\":{\"type\":\"array\",\"items\":{\"type\":\"string\",\"maxLength\":12},\"minItems\":1,\"maxItems\":5},"
    "\"score\":{\"anyOf\":[{\"type\":\"number\"},{\"type\":\"null\"}]}},\"required\":[\"name\",\"tags\",\"score\"],"
    "\"additionalProperties\":false}",
};
#define N_SCHEMAS (int)(sizeof SCHEMAS / sizeof SCHEMAS[0])

/* n > 1 greedy sequences of one constrained prompt: all equal, and equal to the host
 * path's lone run; only the first token, which the forks sample from the first
 * sequence's row, takes the host path. */
static void check_forks(env *v) {
    const req q = {.schema = SCHEMAS[0], .max_tokens = 40, .with_eos = 1, .start_after = -1};
    int32_t prompt[9];
    for (int t = 0; t < 9; t++) prompt[t] = (int32_t)(qd_test_next(&v->rng) % (uint64_t)v->V);
    qd_run host, seqs[3];
    qd_err err = {0};
    uint64_t id, ids[3];
    qd_request_params p = params_of(v, &q, 1);
    qd_run_init(&host);
    CHECKF(qd_engine_submit(v->e, prompt, 9, &p, qd_run_on_event, &host, &id, &err) == QD_OK, "submit: %s", err.msg);
    qd_run_wait(&host);
    const uint64_t before = masked_rows(v->e);
    p = params_of(v, &q, 0);
    void *users[3];
    for (int i = 0; i < 3; i++) {
        qd_run_init(&seqs[i]);
        users[i] = &seqs[i];
    }
    CHECKF(qd_engine_submit_n(v->e, prompt, 9, &p, 3, qd_run_on_event, users, ids, &err) == QD_OK, "submit_n: %s", err.msg);
    uint64_t generated = 0;
    for (int i = 0; i < 3; i++) {
        qd_run_wait(&seqs[i]);
        char label[64];
        snprintf(label, sizeof label, "n = 3, sequence %d", i);
        compare(&seqs[i], &host, label);
        generated += (uint64_t)seqs[i].n;
    }
    const uint64_t rows = masked_rows(v->e) - before;
    CHECKF(rows == generated - 3, "n = 3: %llu rows masked for %llu tokens (all but each first)",
           (unsigned long long)rows, (unsigned long long)generated);
}

/* A grammar whose value is complete and that has no EOS to allow: nothing is allowed
 * after it, and both paths end the request with an error instead of a token. */
static void check_nothing_allowed(env *v) {
    const req q = {.schema = "{\"enum\":[\"ab\"]}", .max_tokens = 20, .with_eos = 0, .start_after = -1};
    const int32_t prompt[3] = {5, 6, 7};
    qd_run r[2];
    for (int host = 0; host < 2; host++) {
        qd_err err = {0};
        uint64_t id;
        qd_request_params p = params_of(v, &q, host);
        qd_run_init(&r[host]);
        CHECKF(qd_engine_submit(v->e, prompt, 3, &p, qd_run_on_event, &r[host], &id, &err) == QD_OK, "submit: %s", err.msg);
        qd_run_wait(&r[host]);
        CHECKF(r[host].finish == QD_FINISH_ERROR && r[host].n >= 1 && r[host].n < 20,
               "nothing allowed (%s path): finish %d after %d tokens", host ? "host" : "device", r[host].finish,
               r[host].n);
    }
    CHECKF(r[0].n == r[1].n && !memcmp(r[0].toks, r[1].toks, sizeof(int32_t) * (size_t)r[0].n),
           "nothing allowed: the same %d tokens before the error on both paths (%d)", r[0].n, r[1].n);
    CHECKF(strstr(r[0].error, "grammar allows no token") != NULL, "nothing allowed: device path's error '%s'",
           r[0].error);
    CHECKF(strstr(r[1].error, "-inf") != NULL, "nothing allowed: host path's error '%s'", r[1].error);
}

int main(void) {
    const char *dir = "models/qdelta-tiny";
    env v = {.rng = qd_test_rng_from_env()};
    v.m = qd_fixture_load(dir, QD_BACKEND_CPU, 1);
    qd_tokenizer *tok = NULL;
    qd_token_trie *trie = NULL;
    qd_err err = {0};
    CHECKF(qd_tokenizer_load_dir(dir, &tok, &err) == QD_OK, "tokenizer: %s", err.msg);
    if (tok) CHECKF(qd_token_trie_build(tok, &trie, &err) == QD_OK, "trie: %s", err.msg);
    v.trie = trie;
    qd_engine_params ep = qd_engine_default_params();
    ep.max_num_seqs = MAX_REQ;
    ep.max_model_len = 128;
    if (v.m && trie && qd_engine_create(v.m, &ep, &v.e, &err) != QD_OK) CHECKF(0, "engine: %s", err.msg);
    if (v.e) {
        v.V = qd_model_vocab_size(v.m);
        v.n_eos = qd_model_eos_ids(v.m, &v.eos);
        v.think_end = qd_tokenizer_token_to_id(tok, "</think>");
        CHECK(trie->vocab_size < v.V && v.think_end >= 0);
        char what[64];
        for (int s = 0; s < N_SCHEMAS; s++) {
            /* alone, roomy; then a budget the value must close in */
            const req roomy = {.schema = SCHEMAS[s], .max_tokens = MAX_OUT - 4, .with_eos = 1, .start_after = -1};
            const req tight = {.schema = SCHEMAS[s], .max_tokens = 9 + s, .with_eos = 1, .start_after = -1};
            snprintf(what, sizeof what, "schema %d alone", s);
            check_batch(&v, &roomy, 1, 0, what);
            snprintf(what, sizeof what, "schema %d, %d tokens", s, tight.max_tokens);
            check_batch(&v, &tight, 1, 0, what);
        }
        /* a batch of every kind at once, with unconstrained requests in the same steps, all
         * bounded by the tokenizer's vocabulary (a greedy row with another bound than the
         * step's first one would take the host path) */
        const int L = trie->vocab_size;
        const req batch[6] = {
            {.schema = SCHEMAS[0], .max_tokens = 40, .with_eos = 1, .start_after = -1, .vocab_limit = L},
            {.schema = SCHEMAS[1], .max_tokens = 12, .with_eos = 1, .start_after = -1, .vocab_limit = L},
            {.schema = SCHEMAS[2], .max_tokens = 30, .with_eos = 1, .start_after = -1, .vocab_limit = L},
            {.schema = SCHEMAS[3], .max_tokens = 50, .with_eos = 1, .start_after = -1, .vocab_limit = L, .min_tokens = 5},
            {.schema = SCHEMAS[0], .max_tokens = 24, .with_eos = 1, .start_after = v.think_end, .vocab_limit = L},
            {.schema = SCHEMAS[3], .max_tokens = 30, .with_eos = 1, .start_after = v.think_end, .vocab_limit = L},
        };
        check_batch(&v, batch, 6, 1, "mixed batch");
        check_forks(&v);
        check_nothing_allowed(&v);
        qd_engine_free(v.e);
    }
    qd_token_trie_free(trie);
    qd_tokenizer_free(tok);
    qd_model_free(v.m);
    return qd_test_finish("test_engine_masked");
}
