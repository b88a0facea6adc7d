/* The automaton's token mask (qd_token_trie_mask_dfa) equals the matcher's full trie
 * walk (qd_token_trie_mask) bit for bit, with the same largest completion distance, on
 * the Qwen3.5 vocabulary (tests/data/qwen35-tokenizer, 248k ids), at the grammar states
 * of random walks through each schema of the structured-output tests (and a few with
 * escapes, patterns and Unicode): unbudgeted and with a random budget, with one
 * automaton kept across the walk (as a constraint keeps it) and with a tiny one that
 * fills up (it must then say so, never return a wrong mask). The walks pick uniformly
 * among the allowed tokens, or a token holding a quote, a backslash or a non-ASCII
 * byte when one is allowed, so that escapes and multi-byte characters are crossed. */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "io/tokenizer.h"
#include "qd_test.h"
#include "qd_test_grammar.h"
#include "runtime/grammar/json_schema.h"
#include "runtime/grammar/matcher.h"
#include "runtime/grammar/state_dfa.h"
#include "runtime/grammar/token_trie.h"

static const char *const SCHEMAS[] = {
    "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"minLength\":1,\"maxLength\":12},"
    "\"age\":{\"type\":\"integer\",\"minimum\":0,\"maximum\":120},\"email\":{\"type\":\"string\",\"format\":\"email\"}},"
    "\"required\":[\"name\",\"age\"],\"additionalProperties\":false}",
    "{\"type\":\"array\",\"items\":{\"type\":\"number\",\"minimum\":-10,\"maximum\":10},\"minItems\":1,\"maxItems\":4}",
    "{\"type\":\"object\",\"properties\":{\"x\":{\"type\":[\"integer\",\"null\"],\"exclusiveMinimum\":0,"
    "\"exclusiveMaximum\":50},\"y\":{\"anyOf\":[{\"type\":\"string\",\"maxLength\":5},{\"type\":\"array\","
    "\"items\":{\"type\":\"boolean\"},\"maxItems\":2}]}},\"required\":[\"x\",\"y\"]}",
    "{\"type\":\"object\",\"properties\":{\"s\":{\"type\":\"string\",\"minLength\":3,\"maxLength\":8}},\"required\":[\"s\"]}",
    "{\"type\":\"object\",\"additionalProperties\":{\"type\":\"integer\",\"minimum\":-3,\"maximum\":3}}",
    "{\"type\":\"object\",\"properties\":{\"d\":{\"type\":\"string\",\"format\":\"date\"},\"u\":{\"type\":\"string\","
    "\"format\":\"uuid\"}},\"required\":[\"d\",\"u\"]}",
    "{\"type\":\"object\",\"properties\":{\"p\":{\"type\":\"string\",\"pattern\":\"^([a-z]|\\u00e9){2,5}-[0-9]+$\"},"
    "\"e\":{\"enum\":[\"caf\\u00e9\",\"\\u65e5\\u672c\",\"a\\\"b\"]}},\"required\":[\"p\",\"e\"]}",
    NULL, /* json_object: any JSON object */
};

static uint64_t rng = 0x2545F4914F6CDD1Dull;
static unsigned rnd(unsigned n) { return qd_test_xorshift(&rng, n); }

static int bit(const uint32_t *m, int i) { return qd_test_mask_bit(m, i); }

/* A token whose bytes hold a quote, a backslash or a non-ASCII byte. */
static int awkward(const qd_token_trie *t, int id) {
    const unsigned char *b = t->blob + t->tok_off[id];
    for (int i = 0; i < t->tok_len[id]; i++)
        if (b[i] == '"' || b[i] == '\\' || b[i] >= 0x80) return 1;
    return 0;
}

static int compare(const qd_token_trie *t, const qd_grammar *g, const qd_mstate *st, qd_state_dfa *d,
                   qd_trie_walk *w, int budget, uint32_t *ref, uint32_t *fast, const char *what, int step) {
    int dist_ref = -7, dist_fast = -9;
    CHECK(qd_token_trie_mask(t, g, st, w, budget, ref, &dist_ref) == 0);
    int start = qd_state_dfa_intern(d, st);
    if (start == QD_DFA_FULL) {
        qd_state_dfa_reset(d);
        start = qd_state_dfa_intern(d, st);
    }
    CHECKF(start >= 0, "%s step %d: the state is interned", what, step);
    if (start < 0) return 0;
    const int r = qd_token_trie_mask_dfa(t, d, start, w, budget, fast, &dist_fast);
    CHECKF(r == 0 || (r == 1 && d->n == d->max_states), "%s step %d: walk %d (%d of %d states)", what, step, r, d->n,
           d->max_states);
    if (r != 0) {
        qd_state_dfa_reset(d);
        return 1; /* filled up: said so */
    }
    int bad = 0;
    for (int i = 0; i < t->vocab_size; i++)
        if (bit(ref, i) != bit(fast, i) && bad++ < 3)
            fprintf(stderr, "%s step %d budget %d: token %d: automaton %d, matcher %d\n", what, step, budget, i,
                    bit(fast, i), bit(ref, i));
    CHECKF(bad == 0, "%s step %d budget %d: %d tokens differ", what, step, budget, bad);
    CHECKF(dist_ref == dist_fast, "%s step %d budget %d: max completion %d = %d", what, step, budget, dist_fast, dist_ref);
    return 0;
}

int main(void) {
    qd_err err = {0};
    qd_tokenizer *tok = NULL;
    if (qd_tokenizer_load("tests/data/qwen35-tokenizer/tokenizer.json", &tok, &err) != QD_OK) {
        CHECKF(0, "tokenizer: %s", err.msg);
        return qd_test_finish("test_grammar_mask_dfa");
    }
    qd_token_trie *t = NULL;
    CHECKF(qd_token_trie_build(tok, &t, &err) == QD_OK, "trie: %s", err.msg);
    const size_t words = ((size_t)t->vocab_size + 31) / 32;
    uint32_t *ref = malloc(words * 4), *fast = malloc(words * 4);
    int *allowed = malloc(sizeof(int) * (size_t)t->vocab_size);
    long compared = 0, filled = 0;
    for (size_t si = 0; si < sizeof SCHEMAS / sizeof SCHEMAS[0]; si++) {
        json_t *schema = SCHEMAS[si] ? json_loads(SCHEMAS[si], 0, NULL) : NULL;
        CHECKF(!SCHEMAS[si] || schema, "schema %zu parses", si);
        qd_grammar *g = NULL;
        if (qd_json_schema_grammar(schema, &g, &err) != QD_OK) {
            CHECKF(0, "schema %zu: %s", si, err.msg);
            json_decref(schema);
            continue;
        }
        json_decref(schema);
        char what[32];
        snprintf(what, sizeof what, "schema %zu", si);
        qd_mstate st, nx;
        qd_mstate_init(&st);
        qd_mstate_init(&nx);
        qd_match_start(g, &st);
        qd_state_dfa kept, tiny;
        qd_state_dfa_init(&kept, g, 4096);
        qd_state_dfa_init(&tiny, g, 6);
        qd_trie_walk w = {0};
        for (int step = 0; step < QD_TEST_ROUNDS(24); step++) {
            compare(t, g, &st, &kept, &w, -1, ref, fast, what, step);
            const int budget = (int)rnd(12);
            compare(t, g, &st, &kept, &w, budget, ref, fast, what, step);
            filled += compare(t, g, &st, &tiny, &w, -1, ref, fast, what, step);
            compared += 3;
            /* the next token, from the unbudgeted mask (the last compare left it in ref) */
            int n_allowed = 0, n_awk = 0;
            for (int i = 0; i < t->vocab_size; i++)
                if (bit(ref, i)) allowed[n_allowed++] = i;
            if (!n_allowed) break;
            const int uniform = allowed[rnd((unsigned)n_allowed)];
            for (int i = 0; i < n_allowed; i++)
                if (awkward(t, allowed[i])) allowed[n_awk++] = allowed[i];
            const int id = n_awk && rnd(2) ? allowed[rnd((unsigned)n_awk)] : uniform;
            const unsigned char *b = t->blob + t->tok_off[id];
            int alive = 1;
            for (int i = 0; i < t->tok_len[id] && alive; i++) {
                alive = qd_match_byte(g, &st, b[i], &nx);
                qd_mstate tmp = st;
                st = nx;
                nx = tmp;
            }
            CHECKF(alive, "%s step %d: an allowed token keeps the state alive", what, step);
            if (!alive || (st.complete && st.n == 0)) break;
        }
        qd_trie_walk_free(&w);
        qd_state_dfa_free(&kept);
        qd_state_dfa_free(&tiny);
        qd_mstate_free(&st);
        qd_mstate_free(&nx);
        qd_grammar_free(g);
    }
    printf("masks compared: %ld (%ld walks of the 6-state automaton filled it and said so)\n", compared, filled);
    CHECK(compared > QD_TEST_ROUNDS(100));
    free(ref);
    free(fast);
    free(allowed);
    qd_token_trie_free(t);
    qd_tokenizer_free(tok);
    return qd_test_finish("test_grammar_mask_dfa");
}
