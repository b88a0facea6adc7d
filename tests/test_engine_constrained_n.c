/* n > 1 sequences of one prompt under a grammar constraint (qd_engine_submit_n with
 * params.constraint), on the default model with its own tokenizer's trie.
 *
 * Each of the N sequences gets its own copy of the constraint (qd_constraint_clone):
 * every sequence's tokens must be accepted by a fresh constraint of the same schema,
 * one after the other, and a sequence that ended by EOS must be a complete JSON text;
 * sequence i must equal a lone constrained run with seed + i (the forks sample their
 * first token from the row the first sequence's grammar masked, so this holds only if
 * that mask is the fork's own); the prompt is prefilled once when there are slots for
 * all, and the forks fall back to ordinary requests when there are not. A clone's
 * state is its source's at clone time and moves on alone. */
#include <pthread.h>
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

#define MAX_OUT 48
#define N 4

static const char *const SCHEMAS[] = {
    ("{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\",\"minimum\":0,\"maximum\":99},"
     "\"b\":{\"enum\":[\"x\",\"yy\",\"zzz\"]}},\"required\":[\"a\",\"b\"],\"additionalProperties\":false}"),
    "{\"type\":\"array\",\"items\":{\"type\":\"boolean\"},\"minItems\":1,\"maxItems\":3}",
    "{\"type\":\"string\",\"maxLength\":6}",
};

static qd_constraint *make(const qd_token_trie *trie, const char *schema_text, const int32_t *eos, int n_eos) {
    json_t *schema = json_loads(schema_text, 0, NULL);
    qd_grammar *g = NULL;
    qd_err err = {0};
    qd_constraint *c = NULL;
    if (schema && qd_json_schema_grammar(schema, &g, &err) == QD_OK) {
        qd_constraint_params cp = {.trie = trie, .grammar = g, .eos = eos, .n_eos = n_eos, .start_after = -1};
        if (qd_constraint_create(&cp, &c, &err) != QD_OK) c = NULL;
    }
    CHECKF(c != NULL, "constraint for %s: %s", schema_text, err.msg);
    json_decref(schema);
    return c;
}

static int is_eos(const int32_t *eos, int n_eos, int32_t t) {
    for (int i = 0; i < n_eos; i++)
        if (eos[i] == t) return 1;
    return 0;
}

/* The tokens pass a fresh constraint one by one; a run that ended by EOS is complete. */
static void check_valid(const qd_token_trie *trie, const char *schema, const int32_t *eos, int n_eos, const qd_run *r,
                        int seq) {
    qd_constraint *c = make(trie, schema, eos, n_eos);
    if (!c) return;
    qd_err err = {0};
    int ok = 1;
    for (int i = 0; i < r->n && ok; i++) {
        if (is_eos(eos, n_eos, r->toks[i])) {
            CHECKF(qd_constraint_complete(c), "sequence %d: EOS only after a complete value", seq);
            break;
        }
        ok = qd_constraint_accept(c, r->toks[i], &err) == QD_OK;
        CHECKF(ok, "sequence %d, token %d (id %d) keeps the output in the schema's language: %s", seq, i, r->toks[i],
               err.msg);
    }
    if (r->finish == QD_FINISH_EOS) CHECKF(qd_constraint_complete(c), "sequence %d ended by EOS complete", seq);
    qd_constraint_free(c);
}

/* Returns whether the sampled sequences of the group differ (the test means something
 * only if some do). */
static int check_schema(qd_model *m, const qd_token_trie *trie, const char *schema, int slots, qd_test_rng *rng) {
    qd_engine_params ep = qd_engine_default_params();
    ep.max_num_seqs = slots;
    ep.max_model_len = 128;
    qd_engine *e = NULL;
    qd_err err = {0};
    if (qd_engine_create(m, &ep, &e, &err) != QD_OK) {
        CHECKF(0, "engine: %s", err.msg);
        return 0;
    }
    const int32_t *eos;
    const int n_eos = qd_model_eos_ids(m, &eos);
    const int V = qd_model_vocab_size(m);
    int32_t prompt[40];
    const int n = 3 + (int)(qd_test_next(rng) % 30);
    for (int i = 0; i < n; i++) prompt[i] = (int32_t)(qd_test_next(rng) % (uint64_t)V);
    qd_request_params p;
    memset(&p, 0, sizeof p);
    p.sampling = qd_sampling_default_params();
    p.sampling.temperature = 1.5f; /* a flat distribution: the sequences take different paths */
    p.sampling.seed = qd_test_next(rng);
    p.max_tokens = MAX_OUT;
    qd_run alone[N], group[N];
    for (int i = 0; i < N; i++) {
        qd_request_params pi = p;
        pi.sampling.seed = p.sampling.seed + (uint64_t)i;
        pi.constraint = make(trie, schema, eos, n_eos);
        qd_run_init(&alone[i]);
        uint64_t id;
        CHECKF(qd_engine_submit(e, prompt, n, &pi, qd_run_on_event, &alone[i], &id, &err) == QD_OK, "submit: %s", err.msg);
        qd_run_wait(&alone[i]);
    }
    qd_engine_stats before, after;
    qd_engine_get_stats(e, &before);
    void *users[N];
    uint64_t ids[N];
    for (int i = 0; i < N; i++) {
        qd_run_init(&group[i]);
        users[i] = &group[i];
    }
    p.constraint = make(trie, schema, eos, n_eos);
    CHECKF(qd_engine_submit_n(e, prompt, n, &p, N, qd_run_on_event, users, ids, &err) == QD_OK, "submit_n: %s", err.msg);
    for (int i = 0; i < N; i++) qd_run_wait(&group[i]);
    qd_engine_get_stats(e, &after);
    int differ = 0;
    for (int i = 0; i < N; i++) {
        check_valid(trie, schema, eos, n_eos, &group[i], i);
        CHECKF(group[i].n == alone[i].n && !memcmp(group[i].toks, alone[i].toks, sizeof(int32_t) * (size_t)alone[i].n) &&
                   group[i].finish == alone[i].finish,
               "%s (%d slots): sequence %d (%d tokens) = a lone constrained run with seed + %d (%d tokens)", schema, slots,
               i, group[i].n, i, alone[i].n);
        differ |= group[i].n != group[0].n || memcmp(group[i].toks, group[0].toks, sizeof(int32_t) * (size_t)group[0].n);
    }
    const uint64_t prefilled = after.prefill_tokens_total - before.prefill_tokens_total;
    if (slots >= N)
        CHECKF(prefilled == (uint64_t)n, "%s: the prompt was prefilled once (%llu tokens for %d)", schema,
               (unsigned long long)prefilled, n);
    CHECK(after.slots_used == 0 && after.kv_blocks_used == 0 && after.waiting == 0);
    qd_engine_free(e);
    return differ;
}

/* A clone starts in its source's state and moves alone. */
static void check_clone(const qd_token_trie *trie, const qd_tokenizer *tok) {
    const int32_t eos = 0;
    qd_constraint *a = make(trie, "{\"enum\":[\"ab\",\"ac\"]}", &eos, 1);
    if (!a) return;
    qd_err err = {0};
    int32_t *ids = NULL;
    size_t n = 0;
    CHECK(qd_tokenizer_encode(tok, "\"a", 2, 0, &ids, &n, &err) == QD_OK && n >= 1);
    for (size_t i = 0; i < n; i++) CHECK(qd_constraint_accept(a, ids[i], &err) == QD_OK);
    free(ids);
    qd_constraint *b = NULL;
    CHECK(qd_constraint_clone(a, &b, &err) == QD_OK && b);
    int32_t *tb = NULL, *tc = NULL;
    size_t nb = 0, nc = 0;
    CHECK(qd_tokenizer_encode(tok, "b\"", 2, 0, &tb, &nb, &err) == QD_OK);
    CHECK(qd_tokenizer_encode(tok, "c\"", 2, 0, &tc, &nc, &err) == QD_OK);
    for (size_t i = 0; i < nb; i++) CHECK(qd_constraint_accept(a, tb[i], &err) == QD_OK);
    for (size_t i = 0; i < nc; i++) CHECK(qd_constraint_accept(b, tc[i], &err) == QD_OK);
    CHECK(qd_constraint_complete(a) && qd_constraint_complete(b));
    qd_constraint_free(a); /* the grammar is shared: b still works after a is gone */
    CHECK(qd_constraint_accept(b, tc[0], &err) == QD_ERR_INVALID_ARG);
    qd_constraint_free(b);
    free(tb);
    free(tc);
}

int main(void) {
    qd_test_rng rng = qd_test_rng_from_env();
    const char *dir = "models/qdelta-tiny";
    qd_model *m = qd_fixture_load(dir, QD_BACKEND_CPU, 1);
    CHECKF(m != NULL, "load %s", dir);
    qd_tokenizer *tok = NULL;
    qd_token_trie *trie = NULL;
    qd_err err = {0};
    CHECKF(qd_tokenizer_load_dir(dir, &tok, &err) == QD_OK, "tokenizer: %s", err.msg);
    if (tok) CHECKF(qd_token_trie_build(tok, &trie, &err) == QD_OK, "trie: %s", err.msg);
    if (m && trie) {
        check_clone(trie, tok);
        /* a short schema's few outputs (a boolean array of one to three items) can come out
         * the same in all N sequences of a draw: the groups of all schemas together must
         * show sequences that differ */
        int groups_differ = 0;
        for (size_t s = 0; s < sizeof SCHEMAS / sizeof SCHEMAS[0]; s++) {
            groups_differ += check_schema(m, trie, SCHEMAS[s], N, &rng);
            groups_differ += check_schema(m, trie, SCHEMAS[s], 2, &rng);
        }
        printf("groups whose sampled sequences differ: %d of %zu\n", groups_differ, 2 * sizeof SCHEMAS / sizeof SCHEMAS[0]);
        CHECKF(groups_differ >= 3, "sampled sequences differ in %d of the %zu groups", groups_differ,
               2 * sizeof SCHEMAS / sizeof SCHEMAS[0]);
    }
    qd_token_trie_free(trie);
    qd_tokenizer_free(tok);
    qd_model_free(m);
    return qd_test_finish("test_engine_constrained_n");
}
