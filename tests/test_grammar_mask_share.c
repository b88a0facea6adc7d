/* Masks shared by a constraint and its clones (mask_share.h), masked from two threads
 * at once: each sequence's every mask equals the matcher's reference walk
 * (qd_token_trie_mask, EOS added once complete) bit for bit, on the Qwen3.5
 * vocabulary, along a walk through a schema of bounded strings, an e-mail address,
 * an integer and an any-string array. Two clones walk it concurrently, so that they
 * reach the same states together (both walk, both add, one finds the other's entry);
 * then a third clone walks it alone and must take masks from the share (the test
 * checks that it did), and a fourth runs with a budget (budgeted masks are never
 * shared: they must still be right). Built into the sanitizer build as well
 * (scripts/fuzz.sh); the shared state is under one mutex. */
#define _POSIX_C_SOURCE 200809L
#include <jansson.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "io/tokenizer.h"
#include "qd_test.h"
#include "qd_test_grammar.h"
#include "runtime/grammar/constraint.h"
#include "runtime/grammar/json_schema.h"
#include "runtime/grammar/matcher.h"
#include "runtime/grammar/token_trie.h"

#define STEPS 48
#define ROUNDS 3

static const char *const SCHEMA =
    "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"minLength\":1,\"maxLength\":12},"
    "\"email\":{\"type\":\"string\",\"format\":\"email\"},\"age\":{\"type\":\"integer\",\"minimum\":0,\"maximum\":120},"
    "\"tags\":{\"type\":\"array\",\"items\":{\"type\":\"string\"},\"maxItems\":3}},"
    "\"required\":[\"name\",\"email\",\"age\",\"tags\"],\"additionalProperties\":false}";

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static unsigned rnd(unsigned n) { return qd_test_xorshift(&rng, n); }

static int bit(const uint32_t *m, int i) { return qd_test_mask_bit(m, i); }

typedef struct walk_plan {
    const qd_token_trie *t;
    int n_steps;
    int32_t tokens[STEPS];
    uint32_t *ref[STEPS];  /* the reference mask before each token */
} walk_plan;

typedef struct job {
    pthread_barrier_t *start;  /* NULL: run at once */
    const walk_plan *plan;
    qd_constraint *c;
    int bad_masks, bad_accepts;
} job;

/* Masks and advances one sequence along the plan, comparing every mask. */
static void *run(void *arg) {
    job *j = arg;
    if (j->start) pthread_barrier_wait(j->start); /* both threads at the same states together */
    const size_t words = ((size_t)j->plan->t->vocab_size + 31) / 32;
    uint32_t *mask = malloc(sizeof(uint32_t) * words);
    qd_err err = {0};
    for (int s = 0; s < j->plan->n_steps; s++) {
        if (qd_constraint_fill_mask(j->c, -1, mask, &err) != QD_OK ||
            memcmp(mask, j->plan->ref[s], sizeof(uint32_t) * words))
            j->bad_masks++;
        if (qd_constraint_accept(j->c, j->plan->tokens[s], &err) != QD_OK) j->bad_accepts++;
    }
    free(mask);
    return NULL;
}

int main(void) {
    qd_err err = {0};
    qd_tokenizer *tok = NULL;
    if (qd_tokenizer_load("tests/data/qwen35-tokenizer/tokenizer.json", &tok, &err) != QD_OK) {
        CHECKF(0, "tokenizer: %s", err.msg);
        return qd_test_finish("test_grammar_mask_share");
    }
    qd_token_trie *t = NULL;
    CHECKF(qd_token_trie_build(tok, &t, &err) == QD_OK, "trie: %s", err.msg);
    const int32_t eos = qd_tokenizer_token_to_id(tok, "<|im_end|>");
    json_t *schema = json_loads(SCHEMA, 0, NULL);
    qd_grammar *g = NULL;
    CHECKF(qd_json_schema_grammar(schema, &g, &err) == QD_OK, "schema: %s", err.msg);
    json_decref(schema);
    if (!t || !g) return qd_test_finish("test_grammar_mask_share");
    const size_t words = ((size_t)t->vocab_size + 31) / 32;
    int *allowed = malloc(sizeof(int) * (size_t)t->vocab_size);
    for (int round = 0; round < ROUNDS; round++) {
        /* the plan: a random walk by the reference masks (the matcher's own walk) */
        walk_plan plan = {.t = t};
        qd_mstate st, nx;
        qd_mstate_init(&st);
        qd_mstate_init(&nx);
        qd_match_start(g, &st);
        qd_trie_walk w = {0};
        for (int s = 0; s < STEPS; s++) {
            uint32_t *ref = malloc(sizeof(uint32_t) * words);
            CHECK(qd_token_trie_mask(t, g, &st, &w, -1, ref, NULL) == 0);
            int n = 0;
            for (int i = 0; i < t->vocab_size; i++)
                if (bit(ref, i)) allowed[n++] = i;
            if (st.complete) ref[eos >> 5] |= 1u << (eos & 31);
            if (!n) {
                free(ref);
                break;
            }
            plan.ref[s] = ref;
            const int id = allowed[rnd((unsigned)n)];
            plan.tokens[s] = id;
            plan.n_steps = s + 1;
            const unsigned char *b = t->blob + t->tok_off[id];
            for (int i = 0; i < t->tok_len[id]; i++) {
                qd_match_byte(g, &st, b[i], &nx);
                qd_mstate tmp = st;
                st = nx;
                nx = tmp;
            }
        }
        qd_trie_walk_free(&w);
        qd_mstate_free(&st);
        qd_mstate_free(&nx);
        CHECKF(plan.n_steps > 10, "round %d: a walk of %d steps", round, plan.n_steps);

        /* a constraint and three clones from its start: one share */
        qd_constraint *c[4] = {0};
        qd_constraint_params p = {.trie = t, .grammar = qd_grammar_ref(g), .eos = &eos, .n_eos = 1, .start_after = -1};
        CHECKF(qd_constraint_create(&p, &c[0], &err) == QD_OK, "constraint: %s", err.msg);
        for (int k = 1; k < 4 && c[0]; k++)
            CHECKF(qd_constraint_clone(c[0], &c[k], &err) == QD_OK, "clone %d: %s", k, err.msg);
        if (!c[0] || !c[1] || !c[2] || !c[3]) return qd_test_finish("test_grammar_mask_share");
        pthread_barrier_t start;
        CHECK(pthread_barrier_init(&start, NULL, 2) == 0);
        job jobs[2] = {{.start = &start, .plan = &plan, .c = c[0]}, {.start = &start, .plan = &plan, .c = c[1]}};
        pthread_t th[2];
        for (int k = 0; k < 2; k++) CHECK(pthread_create(&th[k], NULL, run, &jobs[k]) == 0);
        for (int k = 0; k < 2; k++) pthread_join(th[k], NULL);
        pthread_barrier_destroy(&start);
        for (int k = 0; k < 2; k++)
            CHECKF(jobs[k].bad_masks == 0 && jobs[k].bad_accepts == 0,
                   "round %d thread %d: %d masks differ from the reference, %d tokens refused", round, k,
                   jobs[k].bad_masks, jobs[k].bad_accepts);
        long walks[2];
        for (int k = 0; k < 2; k++) qd_constraint_counts(c[k], &walks[k], NULL);
        printf("round %d: %d steps; concurrent: walks %ld + %ld, from the share %ld + %ld\n", round, plan.n_steps,
               walks[0], walks[1], qd_constraint_shared_hits(c[0]), qd_constraint_shared_hits(c[1]));
        /* alone after them: every state it reaches was masked and shared before */
        job alone = {.plan = &plan, .c = c[2]};
        run(&alone);
        long walks2;
        qd_constraint_counts(c[2], &walks2, NULL);
        CHECKF(alone.bad_masks == 0 && alone.bad_accepts == 0, "round %d: the third clone: %d masks differ", round,
               alone.bad_masks);
        CHECKF(qd_constraint_shared_hits(c[2]) > 0 && walks2 == 0,
               "round %d: the third clone took %ld masks from the share and walked %ld", round,
               qd_constraint_shared_hits(c[2]), walks2);
        /* budgeted masks (near max_tokens) are walked, never shared: a close still fits */
        uint32_t *mask = malloc(sizeof(uint32_t) * words);
        int budget_ok = 1;
        for (int s = 0; s < plan.n_steps; s++) {
            CHECK(qd_constraint_fill_mask(c[3], 40, mask, &err) == QD_OK);
            for (int i = 0; i < t->vocab_size; i++)
                if (bit(mask, i) && !bit(plan.ref[s], i)) budget_ok = 0; /* a budget only removes tokens */
            if (!bit(mask, plan.tokens[s])) break; /* the plan's token does not close in time */
            CHECK(qd_constraint_accept(c[3], plan.tokens[s], &err) == QD_OK);
        }
        CHECKF(budget_ok, "round %d: a budgeted mask allows a token the reference refuses", round);
        free(mask);
        for (int k = 0; k < 4; k++) qd_constraint_free(c[k]);
        for (int s = 0; s < plan.n_steps; s++) free(plan.ref[s]);
    }
    free(allowed);
    qd_grammar_free(g);
    qd_token_trie_free(t);
    qd_tokenizer_free(tok);
    return qd_test_finish("test_grammar_mask_share");
}
