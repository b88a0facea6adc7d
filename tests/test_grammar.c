/* Constrained decoding (src/runtime/grammar): schemas compile to grammars that accept
 * the valid texts and refuse the invalid ones; token masks from the trie equal a slow
 * reference (a backtracking recognizer over the grammar's symbols, sharing no code
 * with the matcher) on random token sequences over a random vocabulary; walks that
 * follow the masks end in JSON that parses and meets the schema; closing before a
 * token budget; unsupported keywords and invalid schemas are refused by name. */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "qd_test.h"
#include "qd_test_grammar.h"
#include "runtime/grammar/constraint.h"
#include "runtime/grammar/json_schema.h"
#include "runtime/grammar/matcher.h"
#include "runtime/grammar/token_trie.h"

/* ---------------------------------------------------------------- reference */

/* Can the symbol list stack[0..n) (top last) derive a string that starts with
 * s[0..len)? (want_full: derive exactly s.) Plain backtracking, depth-bounded. */
static int ref_derive(const qd_grammar *g, int32_t *stack, int n, const unsigned char *s, size_t len, int want_full,
                      int depth) {
    if (depth > 20000) return 0;
    if (len == 0 && !want_full) return 1;
    if (n == 0) return len == 0;
    int32_t top = stack[n - 1];
    if (top < 0) {
        if (len == 0) return 0;
        if (!qd_class_has(g, -top - 1, s[0])) return 0;
        return ref_derive(g, stack, n - 1, s + 1, len - 1, want_full, depth + 1);
    }
    for (int k = 0; k < g->n_alts; k++) {
        if (g->alt_rule[k] != top) continue;
        int m = g->alt_len[k];
        int32_t *ns = malloc(sizeof(int32_t) * (size_t)(n - 1 + m + 1));
        memcpy(ns, stack, sizeof(int32_t) * (size_t)(n - 1));
        for (int i = 0; i < m; i++) ns[n - 1 + i] = g->syms[g->alt_sym0[k] + m - 1 - i];
        int ok = ref_derive(g, ns, n - 1 + m, s, len, want_full, depth + 1);
        free(ns);
        if (ok) return 1;
    }
    return 0;
}

static int ref_prefix(const qd_grammar *g, const unsigned char *s, size_t len, int full) {
    int32_t root = g->root;
    return ref_derive(g, &root, 1, s, len, full, 0);
}

/* ---------------------------------------------------------------- helpers */

static qd_grammar *compile_text(const char *schema_text, qd_err *err) {
    json_error_t je;
    json_t *s = json_loads(schema_text, JSON_DECODE_ANY, &je);
    if (!s) {
        fprintf(stderr, "bad test schema: %s\n", je.text);
        return NULL;
    }
    qd_grammar *g = NULL;
    qd_json_schema_grammar(s, &g, err);
    json_decref(s);
    return g;
}

static int matches(const qd_grammar *g, const char *text, int *complete) {
    qd_mstate a, b;
    qd_mstate_init(&a);
    qd_mstate_init(&b);
    qd_match_start(g, &a);
    int alive = 1;
    for (const char *p = text; *p && alive; p++) {
        alive = qd_match_byte(g, &a, (unsigned char)*p, &b);
        qd_mstate t = a;
        a = b;
        b = t;
    }
    *complete = alive && a.complete;
    qd_mstate_free(&a);
    qd_mstate_free(&b);
    return alive;
}

typedef struct schema_case {
    const char *schema;
    const char *valid[6];
    const char *invalid[6];
} schema_case;

static const schema_case CASES[] = {
    {"{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"},\"age\":{\"type\":\"integer\",\"minimum\":0,\"maximum\":120}},\"required\":[\"name\"]}",
     {"{\"name\":\"Bo\"}", "{\"name\": \"x\", \"age\": 7}", "{\"name\":\"\\u00e9\\n\",\"age\":120}", "{\"name\":\"\xc3\xa9\"}", NULL},
     {"{}", "{\"age\":3}", "{\"name\":\"x\",\"age\":121}", "{\"name\":\"x\",\"age\":-1}", "{\"name\":\"\\ud800\"}", NULL}},
    {"{\"type\":[\"integer\",\"null\"],\"exclusiveMinimum\":-5,\"exclusiveMaximum\":10}",
     {"null", "-4", "9", "0", NULL},
     {"-5", "10", "1.5", "01", NULL}},
    {"{\"type\":\"number\",\"minimum\":-2.5,\"maximum\":3}",
     {"-2", "3", "2.999", "-1.5", "0.25", NULL},
     {"4", "3.5", "-3", NULL}},
    {"{\"enum\":[\"red\",\"green\",1,null,{\"a\":[true]}]}",
     {"\"red\"", "1", "null", "{\"a\":[true]}", NULL},
     {"\"blue\"", "2", NULL}},
    {"{\"type\":\"array\",\"items\":{\"type\":\"boolean\"},\"minItems\":1,\"maxItems\":3}",
     {"[true]", "[true, false,true]", NULL},
     {"[]", "[true,true,true,true]", "[1]", NULL}},
    {"{\"type\":\"string\",\"minLength\":2,\"maxLength\":3}",
     {"\"ab\"", "\"a\\\"c\"", "\"\xe2\x82\xac\xe2\x82\xac\"", NULL},
     {"\"a\"", "\"abcd\"", NULL}},
    {"{\"$defs\":{\"node\":{\"type\":\"object\",\"properties\":{\"v\":{\"type\":\"integer\"},\"next\":{\"anyOf\":[{\"$ref\":\"#/$defs/node\"},{\"type\":\"null\"}]}},\"required\":[\"v\",\"next\"]}},\"$ref\":\"#/$defs/node\"}",
     {"{\"v\":1,\"next\":null}", "{\"v\":1,\"next\":{\"v\":-2,\"next\":null}}", NULL},
     {"{\"v\":1}", "{\"v\":1,\"next\":{}}", NULL}},
    {"{\"type\":\"object\",\"properties\":{\"d\":{\"type\":\"string\",\"format\":\"date\"},\"t\":{\"type\":\"string\",\"format\":\"date-time\"},\"u\":{\"type\":\"string\",\"format\":\"uuid\"},\"e\":{\"type\":\"string\",\"format\":\"email\"}}}",
     {"{\"d\":\"2024-02-29\"}", "{\"t\":\"2024-01-01T23:59:59.5+05:30\"}", "{\"u\":\"123e4567-e89b-12d3-a456-426614174000\"}", "{\"e\":\"a.b@c.org\"}", "{}", NULL},
     {"{\"d\":\"2024-13-01\"}", "{\"t\":\"2024-01-01T24:00:00Z\"}", "{\"e\":\"a@b\"}", NULL}},
    {"{\"type\":\"object\",\"additionalProperties\":{\"type\":\"integer\"}}",
     {"{}", "{\"x\":1,\"y\":2}", NULL},
     {"{\"x\":\"s\"}", NULL}},
    {"{\"type\":\"string\",\"pattern\":\"^[A-Z]{2}-\\\\d{3}$\"}",
     {"\"AB-123\"", "\"ZZ-000\"", NULL},
     {"\"ab-123\"", "\"AB-1234\"", "\"AB-12\"", NULL}},
    {"{\"type\":\"string\",\"pattern\":\"(cat|dog)s?\"}",
     {"\"dogs\"", "\"a cat!\"", "\"\\\"dog\"", NULL},
     {"\"cow\"", "\"\"", NULL}},
    {"{\"type\":\"string\",\"pattern\":\"^a\\\"[^b\\\\s]*.$\"}",
     {"\"a\\\"x\"", "\"a\\\"\xc3\xa9zz\\\\\"", NULL},
     {"\"a\\\"bb\"", "\"a\\\"\\nq\"", "\"a\\\"x\\n\"", NULL}},
    {"true", {"{\"a\":[1,2.5,\"s\",null,{}]}", "-0.5", "\"x\"", NULL}, {"01", "[1,]", NULL}},
    /* oneOf whose branches cannot overlap (json_schema_oneof.c): a discriminator const,
     * different types and literals, required keys another branch forbids, $refs */
    {"{\"oneOf\":[{\"type\":\"object\",\"properties\":{\"kind\":{\"const\":\"a\"},\"x\":{\"type\":\"integer\"}},\"required\":[\"kind\",\"x\"]},"
     "{\"type\":\"object\",\"properties\":{\"kind\":{\"const\":\"b\"},\"y\":{\"type\":\"string\"}},\"required\":[\"kind\"]}]}",
     {"{\"kind\":\"a\",\"x\":1}", "{\"kind\":\"b\"}", "{\"kind\":\"b\",\"y\":\"s\"}", NULL},
     {"{\"kind\":\"c\"}", "{\"kind\":\"a\"}", "{\"x\":1}", NULL}},
    {"{\"oneOf\":[{\"type\":\"string\",\"maxLength\":3},{\"type\":\"integer\"},{\"enum\":[true,null]}]}",
     {"\"ab\"", "5", "null", "true", NULL},
     {"false", "\"abcd\"", "1.5", NULL}},
    {"{\"oneOf\":[{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"}},\"required\":[\"a\"],\"additionalProperties\":false},"
     "{\"type\":\"object\",\"properties\":{\"b\":{\"type\":\"integer\"}},\"required\":[\"b\"],\"additionalProperties\":false}]}",
     {"{\"a\":1}", "{\"b\":2}", NULL},
     {"{}", "{\"a\":1,\"b\":2}", NULL}},
    {"{\"$defs\":{\"A\":{\"enum\":[1,2]},\"B\":{\"enum\":[3,\"x\"]},\"U\":{\"oneOf\":[{\"$ref\":\"#/$defs/A\"},{\"$ref\":\"#/$defs/B\"}]}},"
     "\"$ref\":\"#/$defs/U\"}",
     {"1", "3", "\"x\"", NULL},
     {"4", "\"y\"", NULL}},
};

static void test_schemas(void) {
    for (size_t i = 0; i < sizeof CASES / sizeof CASES[0]; i++) {
        qd_err err = {0};
        qd_grammar *g = compile_text(CASES[i].schema, &err);
        CHECKF(g != NULL, "schema %zu: %s", i, err.msg);
        if (!g) continue;
        for (int k = 0; CASES[i].valid[k]; k++) {
            int complete = 0;
            matches(g, CASES[i].valid[k], &complete);
            CHECKF(complete, "schema %zu must accept %s", i, CASES[i].valid[k]);
            size_t len = strlen(CASES[i].valid[k]);
            CHECKF(ref_prefix(g, (const unsigned char *)CASES[i].valid[k], len, 1), "reference: schema %zu accepts %s", i,
                   CASES[i].valid[k]);
        }
        for (int k = 0; CASES[i].invalid[k]; k++) {
            int complete = 0;
            matches(g, CASES[i].invalid[k], &complete);
            CHECKF(!complete, "schema %zu must refuse %s", i, CASES[i].invalid[k]);
        }
        qd_grammar_free(g);
    }
}

/* A repeated group that can be empty is a cycle of rules that consume nothing: the
 * matcher enters each (stack, rule) once per expansion, so this is fast and exact.
 * (Matcher only: the backtracking reference explodes on such cycles.) */
static void test_empty_cycles(void) {
    qd_err err = {0};
    qd_grammar *g = compile_text("{\"type\":\"string\",\"pattern\":\"^(|a|(b?)*)+c$\"}", &err);
    CHECKF(g != NULL, "%s", err.msg);
    if (!g) return;
    static const char *const ok[] = {"\"c\"", "\"aabc\"", "\"bbbac\"", NULL}, *const bad[] = {"\"\"", "\"ca\"", "\"d\"", NULL};
    for (int i = 0; ok[i]; i++) {
        int complete = 0;
        matches(g, ok[i], &complete);
        CHECKF(complete, "accepts %s", ok[i]);
    }
    for (int i = 0; bad[i]; i++) {
        int complete = 0;
        matches(g, bad[i], &complete);
        CHECKF(!complete, "refuses %s", bad[i]);
    }
    qd_grammar_free(g);
}

static void test_errors(void) {
    static const struct {
        const char *schema;
        qd_status st;
        const char *needle;
    } BAD[] = {
        {"{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"string\",\"pattern\":\"^(?=a)a+$\"}}}", QD_ERR_UNSUPPORTED,
         "'pattern' at #/properties/a: a lookaround"},
        {"{\"type\":\"string\",\"pattern\":\"(a)\\\\1\"}", QD_ERR_UNSUPPORTED, "a backreference"},
        {"{\"type\":\"string\",\"pattern\":\"a+?\"}", QD_ERR_UNSUPPORTED, "lazy"},
        {"{\"type\":\"string\",\"pattern\":\"[z-a]\"}", QD_ERR_INVALID_ARG, "backwards"},
        {"{\"type\":\"string\",\"pattern\":\"(ab\"}", QD_ERR_INVALID_ARG, "unclosed '('"},
        {"{\"type\":\"object\",\"minProperties\":1}", QD_ERR_UNSUPPORTED, "'minProperties' at #"},
        {"{\"type\":\"strin\"}", QD_ERR_INVALID_ARG, "unknown type \"strin\""},
        {"{\"type\":\"array\",\"minItems\":-1}", QD_ERR_INVALID_ARG, "'minItems'"},
        {"{\"$ref\":\"#/$defs/missing\"}", QD_ERR_INVALID_ARG, "#/$defs/missing"},
        {"{\"type\":\"integer\",\"minimum\":5,\"maximum\":4}", QD_ERR_INVALID_ARG, "bounds"},
        {"{\"type\":\"string\",\"maxLength\":100000}", QD_ERR_CAPACITY, "maxLength"},
        {"{\"properties\":[]}", QD_ERR_INVALID_ARG, "'properties'"},
        {"false", QD_ERR_INVALID_ARG, "false"},
        {"{\"enum\":[]}", QD_ERR_INVALID_ARG, "'enum'"},
        /* oneOf whose branches may overlap: refused, never compiled as anyOf */
        {"{\"oneOf\":[{\"type\":\"string\",\"maxLength\":5},{\"type\":\"string\",\"minLength\":2}]}", QD_ERR_UNSUPPORTED,
         "'oneOf' at #: branches 0 and 1 may both match"},
        {"{\"oneOf\":[{\"type\":\"boolean\"},{\"type\":\"integer\"},{\"type\":\"number\"}]}", QD_ERR_UNSUPPORTED,
         "'oneOf' at #: branches 1 and 2"},
        {"{\"oneOf\":[{\"enum\":[1,2]},{\"enum\":[2.0,3]}]}", QD_ERR_UNSUPPORTED, "'oneOf' at #: branches 0 and 1"},
        {"{\"oneOf\":[{\"const\":\"a\"},{\"type\":\"string\"}]}", QD_ERR_UNSUPPORTED, "'oneOf' at #: branches 0 and 1"},
        {"{\"type\":\"object\",\"properties\":{\"p\":{\"oneOf\":[{\"type\":\"object\",\"properties\":{\"k\":{\"type\":\"string\"}}},"
         "{\"type\":\"object\",\"properties\":{\"k\":{\"type\":\"integer\"}}}]}}}",
         QD_ERR_UNSUPPORTED, "'oneOf' at #/properties/p: branches 0 and 1"},
        {"{\"oneOf\":[{\"properties\":{\"k\":{\"const\":1}},\"required\":[\"k\"]},{\"type\":\"integer\"}]}", QD_ERR_UNSUPPORTED,
         "'oneOf' at #: branches 0 and 1"},
    };
    for (size_t i = 0; i < sizeof BAD / sizeof BAD[0]; i++) {
        qd_err err = {0};
        qd_grammar *g = compile_text(BAD[i].schema, &err);
        CHECKF(!g && err.status == BAD[i].st && strstr(err.msg, BAD[i].needle), "bad schema %zu: status %s, message '%s'", i,
               qd_status_name(err.status), err.msg);
        qd_grammar_free(g);
    }
    /* a schema whose grammar is too large: many wide strings */
    char *big = malloc(1 << 20);
    size_t n = (size_t)sprintf(big, "{\"type\":\"object\",\"properties\":{");
    for (int i = 0; i < 800; i++)
        n += (size_t)sprintf(big + n, "%s\"p%d\":{\"type\":\"string\",\"maxLength\":2000}", i ? "," : "", i);
    sprintf(big + n, "}}");
    qd_err err = {0};
    qd_grammar *g = compile_text(big, &err);
    CHECKF(!g && err.status == QD_ERR_CAPACITY, "an oversized schema is refused: %s", err.msg);
    qd_grammar_free(g);
    free(big);
}

/* ---------------------------------------------------------------- masks */

static uint64_t rng = 88172645463325252ull;
static unsigned rnd(unsigned n) { return qd_test_xorshift(&rng, n); }

static void test_masks(void) {
    /* a vocabulary: every single byte, then random pieces over JSON-ish characters */
    enum { V = 1200, EOS = V - 1 };
    static unsigned char store[V][8];
    const unsigned char *toks[V];
    int lens[V];
    const char alpha[] = "{}[]\":, 0123456789.-eEtrufalsn\\abcxyz\xc3\xa9";
    for (int i = 0; i < V; i++) {
        toks[i] = store[i];
        if (i < 256) {
            store[i][0] = (unsigned char)i;
            lens[i] = 1;
        } else {
            lens[i] = 2 + (int)rnd(5);
            for (int k = 0; k < lens[i]; k++) store[i][k] = (unsigned char)alpha[rnd(sizeof alpha - 1)];
        }
    }
    lens[EOS] = -1; /* not text */
    qd_err err = {0};
    qd_token_trie *trie = NULL;
    CHECK(qd_token_trie_build_bytes(toks, lens, V, &trie, &err) == QD_OK);
    uint32_t mask[(V + 31) / 32];
    int checked = 0, walks_done = 0;
    for (size_t ci = 0; ci < sizeof CASES / sizeof CASES[0]; ci++) {
        for (int w = 0; w < QD_TEST_ROUNDS(4); w++) {
            qd_grammar *g = compile_text(CASES[ci].schema, &err);
            if (!g) continue;
            const qd_grammar *gv = g;
            int32_t eos = EOS;
            qd_constraint *c = NULL;
            qd_constraint_params cp = {.trie = trie, .grammar = g, .eos = &eos, .n_eos = 1, .start_after = -1};
            CHECK(qd_constraint_create(&cp, &c, &err) == QD_OK);
            unsigned char text[512];
            size_t len = 0;
            int ended = 0;
            for (int step = 0; step < 48 && !ended; step++) {
                CHECK(qd_constraint_fill_mask(c, -1, mask, &err) == QD_OK);
                int n_allowed = 0, bad = 0;
                for (int t = 0; t < V; t++) {
                    int got = (mask[t >> 5] >> (t & 31)) & 1;
                    int want;
                    if (t == EOS) want = ref_prefix(gv, text, len, 1);
                    else {
                        memcpy(text + len, toks[t], (size_t)lens[t]);
                        want = ref_prefix(gv, text, len + (size_t)lens[t], 0);
                    }
                    if (got != want && bad++ < 3)
                        fprintf(stderr, "schema %zu step %d token %d: mask %d, reference %d\n", ci, step, t, got, want);
                    n_allowed += got;
                }
                CHECKF(bad == 0, "schema %zu step %d: %d tokens differ from the reference", ci, step, bad);
                checked++;
                if (n_allowed == 0) break;
                int pick = (int)rnd((unsigned)n_allowed), t = 0;
                for (;; t++)
                    if (((mask[t >> 5] >> (t & 31)) & 1) && pick-- == 0) break;
                /* near the step limit, prefer EOS when allowed */
                if (step > 30 && ((mask[EOS >> 5] >> (EOS & 31)) & 1)) t = EOS;
                CHECK(qd_constraint_accept(c, t, &err) == QD_OK);
                if (t == EOS) ended = 1;
                else {
                    memcpy(text + len, toks[t], (size_t)lens[t]);
                    len += (size_t)lens[t];
                }
            }
            if (ended) {
                text[len] = 0;
                json_error_t je;
                json_t *v = json_loadb((const char *)text, len, JSON_DECODE_ANY, &je);
                CHECKF(v != NULL, "schema %zu: a completed walk parses: %s (%s)", ci, text, je.text);
                json_decref(v);
                walks_done++;
            }
            qd_constraint_free(c);
        }
    }
    printf("masks checked against the reference: %d steps, %d completed walks\n", checked, walks_done);
    CHECK(checked > QD_TEST_ROUNDS(200));
    CHECK(walks_done > QD_TEST_ROUNDS(5));
    /* an accepted token outside the mask is refused */
    qd_grammar *g = compile_text("{\"type\":\"boolean\"}", &err);
    int32_t eos = EOS;
    qd_constraint *c = NULL;
    qd_constraint_params cp = {.trie = trie, .grammar = g, .eos = &eos, .n_eos = 1, .start_after = -1};
    CHECK(qd_constraint_create(&cp, &c, &err) == QD_OK);
    CHECK(qd_constraint_accept(c, 'x', &err) == QD_ERR_INVALID_ARG);
    CHECK(qd_constraint_accept(c, EOS, &err) == QD_ERR_INVALID_ARG);
    qd_constraint_free(c);
    /* closing before the budget: with few tokens left only closing tokens remain */
    g = compile_text("{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"array\",\"items\":{\"type\":\"integer\"}}},\"required\":[\"a\"]}", &err);
    cp.grammar = g;
    CHECK(qd_constraint_create(&cp, &c, &err) == QD_OK);
    const char *pre = "{\"a\":[1,2";
    for (const char *p = pre; *p; p++) CHECK(qd_constraint_accept(c, (unsigned char)*p, &err) == QD_OK);
    /* "]}" then EOS: 3 tokens; with 3 left, a digit or ',' would not fit */
    CHECK(qd_constraint_fill_mask(c, 3, mask, &err) == QD_OK);
    int digit_ok = (mask['3' >> 5] >> ('3' & 31)) & 1, close_ok = (mask[']' >> 5] >> (']' & 31)) & 1;
    int comma_ok = (mask[',' >> 5] >> (',' & 31)) & 1;
    CHECKF(close_ok && !digit_ok && !comma_ok, "budget 3: ']' %d, '3' %d, ',' %d", close_ok, digit_ok, comma_ok);
    CHECK(qd_constraint_fill_mask(c, -1, mask, &err) == QD_OK);
    CHECK(((mask['3' >> 5] >> ('3' & 31)) & 1) && ((mask[',' >> 5] >> (',' & 31)) & 1));
    qd_constraint_free(c);
    /* start_after: nothing is constrained until that token */
    g = compile_text("{\"type\":\"null\"}", &err);
    cp.grammar = g;
    cp.start_after = 'Z';
    CHECK(qd_constraint_create(&cp, &c, &err) == QD_OK);
    CHECK(!qd_constraint_active(c));
    /* before it: anything but EOS; with 3 tokens left ("null" needs 4 + EOS) only 'Z' */
    CHECK(qd_constraint_fill_mask(c, -1, mask, &err) == QD_OK);
    CHECK(((mask['q' >> 5] >> ('q' & 31)) & 1) && !((mask[EOS >> 5] >> (EOS & 31)) & 1));
    CHECK(qd_constraint_fill_mask(c, 6, mask, &err) == QD_OK);
    CHECK(((mask['Z' >> 5] >> ('Z' & 31)) & 1) && !((mask['q' >> 5] >> ('q' & 31)) & 1));
    CHECK(qd_constraint_accept(c, 'q', &err) == QD_OK && qd_constraint_accept(c, 'Z', &err) == QD_OK);
    CHECK(qd_constraint_active(c));
    CHECK(qd_constraint_fill_mask(c, -1, mask, &err) == QD_OK);
    CHECK(((mask['n' >> 5] >> ('n' & 31)) & 1) && !((mask['q' >> 5] >> ('q' & 31)) & 1));
    qd_constraint_free(c);
    qd_token_trie_free(trie);
}

int main(void) {
    test_schemas();
    test_errors();
    test_empty_cycles();
    test_masks();
    return qd_test_finish("test_grammar");
}
