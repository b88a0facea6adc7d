/* qd_constraint_mask_logits (constraint.h) leaves exactly the allowed logits as they
 * were and sets every other one to -inf: checked id by id against
 * qd_constraint_fill_mask's bits on the Qwen3.5 vocabulary (248,077 ids: the last
 * word of the mask is partial) with a row longer than the vocabulary (the ids past it
 * are refused once the grammar applies, untouched before), along random walks through
 * schemas whose masks hold the three kinds of words the loop treats apart: all
 * allowed (inside a string), all refused (between values), mixed (e-mail states, where
 * about half of the tokens are allowed). The test checks that each kind was met.
 * qd_constraint_fill_allow must give the very set mask_logits leaves, as bits, for that
 * row and for one shorter than the vocabulary. */
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "io/tokenizer.h"
#include "qd_test.h"
#include "qd_test_grammar.h"
#include "runtime/grammar/constraint.h"
#include "runtime/grammar/json_schema.h"
#include "runtime/grammar/token_trie.h"

static uint64_t rng = 0x2545F4914F6CDD1Dull;
static unsigned rnd(unsigned n) { return qd_test_xorshift(&rng, n); }

static int bit(const uint32_t *m, int i) { return qd_test_mask_bit(m, i); }

typedef struct kinds {
    long ones, zeros, mixed, rows;
} kinds;

/* qd_constraint_fill_allow for a row of n ids: exactly the ids mask_logits left as they
 * were (row against orig), or for a row shorter than the vocabulary (the trie's mask
 * through the constraint's scratch) the mask's first n bits; clear bits past n, and not
 * a word written past the row's. */
static void check_allow(qd_constraint *c, int remaining, int n, const float *row, const float *orig,
                        const uint32_t *mask, const char *what, int step) {
    const size_t words = ((size_t)n + 31) / 32;
    uint32_t *allow = malloc(sizeof(uint32_t) * (words + 1));
    if (!allow) return;
    memset(allow, 0xa5, sizeof(uint32_t) * (words + 1));
    qd_err err = {0};
    CHECKF(qd_constraint_fill_allow(c, remaining, n, allow, &err) == QD_OK, "%s step %d: allow: %s", what, step,
           err.msg);
    int bad = 0;
    for (int i = 0; i < (int)(32 * words); i++) {
        const int want = i < n && (mask ? bit(mask, i) : row[i] == orig[i]);
        if (bit(allow, i) != want && bad++ < 3)
            fprintf(stderr, "%s step %d: allow of %d ids: id %d is %d, want %d\n", what, step, n, i, bit(allow, i), want);
    }
    CHECKF(bad == 0, "%s step %d: %d ids of the allow mask of a %d-id row disagree", what, step, bad, n);
    CHECKF(allow[words] == 0xa5a5a5a5u, "%s step %d: the allow mask of %d ids wrote past its words", what, step, n);
    free(allow);
}

/* One row: the masked logits against the mask, id by id. */
static void check_row(qd_constraint *c, int V, int remaining, uint32_t *mask, float *row, float *orig, kinds *k,
                      const char *what, int step) {
    const int n = V + 5;
    for (int i = 0; i < n; i++) orig[i] = row[i] = (float)((int)rnd(2001) - 1000) / 100.0f;
    qd_err err = {0};
    CHECKF(qd_constraint_fill_mask(c, remaining, mask, &err) == QD_OK, "%s step %d: mask: %s", what, step, err.msg);
    CHECKF(qd_constraint_mask_logits(c, row, n, remaining, &err) == QD_OK, "%s step %d: logits: %s", what, step,
           err.msg);
    int bad = 0;
    for (int i = 0; i < V; i++) {
        const int ok = bit(mask, i) ? row[i] == orig[i] : isinf(row[i]) && row[i] < 0;
        if (!ok && bad++ < 3) fprintf(stderr, "%s step %d: id %d: mask %d, logit %g (was %g)\n", what, step, i,
                                      bit(mask, i), row[i], orig[i]);
    }
    CHECKF(bad == 0, "%s step %d: %d logits disagree with the mask", what, step, bad);
    const int active = qd_constraint_active(c);
    for (int i = V; i < n; i++)
        CHECKF(active ? isinf(row[i]) && row[i] < 0 : row[i] == orig[i], "%s step %d: id %d past the vocabulary", what,
               step, i);
    check_allow(c, remaining, n, row, orig, NULL, what, step);
    check_allow(c, remaining, V - 7, NULL, NULL, mask, what, step);
    for (int w = 0; w < V / 32; w++) {
        if (mask[w] == 0xffffffffu) k->ones++;
        else if (mask[w] == 0) k->zeros++;
        else k->mixed++;
    }
    k->rows++;
}

static void walk(const qd_token_trie *t, const char *schema_text, int32_t eos, int32_t start_after, int steps,
                 uint32_t *mask, float *row, float *orig, kinds *k, const char *what) {
    qd_err err = {0};
    json_t *schema = schema_text ? json_loads(schema_text, 0, NULL) : NULL;
    qd_grammar *g = NULL;
    CHECKF(qd_json_schema_grammar(schema, &g, &err) == QD_OK, "%s: schema: %s", what, err.msg);
    json_decref(schema);
    if (!g) return;
    qd_constraint *c = NULL;
    qd_constraint_params p = {.trie = t, .grammar = g, .eos = &eos, .n_eos = 1, .start_after = start_after};
    CHECKF(qd_constraint_create(&p, &c, &err) == QD_OK, "%s: constraint: %s", what, err.msg);
    if (!c) return;
    const int V = t->vocab_size;
    for (int s = 0; s < steps; s++) {
        check_row(c, V, steps - s + 8, mask, row, orig, k, what, s);
        int n_allowed = 0;
        for (int i = 0; i < V; i++) n_allowed += bit(mask, i);
        if (!n_allowed) break;
        int tok;
        if (!qd_constraint_active(c) && s >= 2) tok = start_after;
        else {
            int pick = (int)rnd((unsigned)n_allowed);
            for (tok = 0;; tok++)
                if (bit(mask, tok) && pick-- == 0) break;
        }
        if (tok == eos) break;
        CHECKF(qd_constraint_accept(c, tok, &err) == QD_OK, "%s step %d: accept %d: %s", what, s, tok, err.msg);
    }
    qd_constraint_free(c);
}

int main(void) {
    qd_err err = {0};
    qd_tokenizer *tok = NULL;
    if (qd_tokenizer_load("tests/data/qwen35-tokenizer/tokenizer.json", &tok, &err) != QD_OK) {
        CHECKF(0, "tokenizer: %s", err.msg);
        return qd_test_finish("test_grammar_mask_logits");
    }
    qd_token_trie *t = NULL;
    CHECKF(qd_token_trie_build(tok, &t, &err) == QD_OK, "trie: %s", err.msg);
    if (!t) return qd_test_finish("test_grammar_mask_logits");
    CHECK(t->vocab_size % 32 != 0); /* the partial last word is covered */
    const int32_t eos = qd_tokenizer_token_to_id(tok, "<|im_end|>");
    const int32_t think_end = qd_tokenizer_token_to_id(tok, "</think>");
    CHECK(eos >= 0 && think_end >= 0);
    uint32_t *mask = malloc(sizeof(uint32_t) * (((size_t)t->vocab_size + 31) / 32));
    float *row = malloc(sizeof(float) * ((size_t)t->vocab_size + 5));
    float *orig = malloc(sizeof(float) * ((size_t)t->vocab_size + 5));
    kinds k = {0};
    walk(t,
         "{\"type\":\"object\",\"properties\":{\"email\":{\"type\":\"string\",\"format\":\"email\"},"
         "\"n\":{\"type\":\"integer\"}},\"required\":[\"email\",\"n\"]}",
         eos, -1, 24, mask, row, orig, &k, "email");
    walk(t, "{\"type\":\"array\",\"items\":{\"type\":\"string\"},\"maxItems\":3}", eos, -1, 24, mask, row, orig, &k,
         "strings");
    walk(t, NULL, eos, think_end, 12, mask, row, orig, &k, "json_object after </think>");
    printf("rows %ld; words all allowed %ld, all refused %ld, mixed %ld\n", k.rows, k.ones, k.zeros, k.mixed);
    CHECK(k.rows > 20);
    CHECK(k.ones > 1000);
    CHECK(k.zeros > 1000);
    CHECK(k.mixed > 1000);
    free(mask);
    free(row);
    free(orig);
    qd_token_trie_free(t);
    qd_tokenizer_free(tok);
    return qd_test_finish("test_grammar_mask_logits");
}
