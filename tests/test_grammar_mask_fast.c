/* The class-table mask (qd_token_trie_mask_fast, token_class.h) equals the matcher's
 * full trie walk (qd_token_trie_mask, the slow reference) bit for bit, with the same
 * largest completion distance, on the Qwen3.5 vocabulary (tests/data/qwen35-tokenizer),
 * at the states of random walks through random schemas (objects of bounded and
 * unbounded strings, formats, patterns, enums, numbers, arrays, anyOf, nesting) and
 * through fixed ones that reach escapes and multi-byte characters; unbudgeted and
 * with a random budget; with an automaton kept across the walk and with a tiny one
 * that fills up (it must say so). Also: the pieces it rests on — byte groups
 * (grammar.h byte_rep) advance the matcher alike, and string tokens are counted in
 * characters of strict UTF-8. The test checks that the class table was actually used
 * (string states and word states both reached), so that it does not pass vacuously,
 * and likewise for the paths under it: the character step by one representative
 * advance (state_dfa.h; each such step is also compared with the step by every byte
 * group), the other tokens walked from the state their leading characters lead to
 * (token_class.h), and subtrees allowed whole by byte category from word states. */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "io/tokenizer.h"
#include "qd_test.h"
#include "qd_test_grammar.h"
#include "runtime/grammar/json_schema.h"
#include "runtime/grammar/matcher.h"
#include "runtime/grammar/state_dfa.h"
#include "runtime/grammar/token_class.h"
#include "runtime/grammar/token_trie.h"

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static unsigned rnd(unsigned n) { return qd_test_xorshift(&rng, n); }

static int bit(const uint32_t *m, int i) { return qd_test_mask_bit(m, i); }

/* A random schema value of nesting depth at most `depth`. */
static json_t *random_schema(int depth) {
    json_t *s = json_object();
    unsigned kind = rnd(depth > 0 ? 9 : 6);
    switch (kind) {
    case 0: /* string, maybe bounded */
    case 1:
        json_object_set_new(s, "type", json_string("string"));
        if (rnd(2)) {
            int lo = (int)rnd(4);
            json_object_set_new(s, "minLength", json_integer(lo));
            json_object_set_new(s, "maxLength", json_integer(lo + (int)rnd(10)));
        }
        break;
    case 2: { /* a format or a pattern */
        static const char *const fmts[] = {"email", "date", "uuid", "date-time"};
        json_object_set_new(s, "type", json_string("string"));
        if (rnd(3)) json_object_set_new(s, "format", json_string(fmts[rnd(4)]));
        else json_object_set_new(s, "pattern", json_string(rnd(2) ? "^[a-z0-9]+(-[a-z0-9]+)*$" : "^([A-Z]|\xc3\xa9){1,4}_[0-9]{2}$"));
        break;
    }
    case 3: {
        json_object_set_new(s, "type", json_string("integer"));
        int lo = (int)rnd(100) - 50;
        json_object_set_new(s, "minimum", json_integer(lo));
        json_object_set_new(s, "maximum", json_integer(lo + (int)rnd(1000)));
        break;
    }
    case 4:
        json_object_set_new(s, "type", json_string(rnd(2) ? "number" : "boolean"));
        break;
    case 5: {
        json_t *e = json_array();
        json_array_append_new(e, json_string("caf\xc3\xa9"));
        json_array_append_new(e, json_string("a\"b"));
        json_array_append_new(e, json_integer((int)rnd(9)));
        json_object_set_new(s, "enum", e);
        break;
    }
    case 6: /* array */
        json_object_set_new(s, "type", json_string("array"));
        json_object_set_new(s, "items", random_schema(depth - 1));
        json_object_set_new(s, "maxItems", json_integer(1 + (int)rnd(4)));
        break;
    case 7: { /* anyOf */
        json_t *a = json_array();
        json_array_append_new(a, random_schema(depth - 1));
        json_array_append_new(a, random_schema(depth - 1));
        json_object_set_new(s, "anyOf", a);
        break;
    }
    default: { /* object */
        json_t *props = json_object(), *req = json_array();
        const int n = 1 + (int)rnd(3);
        for (int i = 0; i < n; i++) {
            char name[16];
            snprintf(name, sizeof name, "%c%d", 'a' + (int)rnd(26), i);
            json_object_set_new(props, name, random_schema(depth - 1));
            if (rnd(2)) json_array_append_new(req, json_string(name));
        }
        json_object_set_new(s, "type", json_string("object"));
        json_object_set_new(s, "properties", props);
        json_object_set_new(s, "required", req);
        if (rnd(2)) json_object_set_new(s, "additionalProperties", json_false());
        break;
    }
    }
    return s;
}

typedef struct counts {
    long compared, filled, string_level, word_level, grouped, chr_checked, word_skips, rest_prefixed, atom_level;
} counts;

/* Compares the fast mask with the reference at st; 0 or 1 (the automaton filled up). */
static void compare(const qd_token_trie *t, const qd_grammar *g, const qd_mstate *st, qd_state_dfa *d,
                    qd_trie_walk *w, int budget, uint32_t *ref, uint32_t *fast, const char *what, int step,
                    counts *n) {
    int dist_ref = -7, dist_fast = -9;
    CHECK(qd_token_trie_mask(t, g, st, w, budget, ref, &dist_ref) == 0);
    int start = qd_state_dfa_intern(d, st);
    if (start == QD_DFA_FULL) {
        qd_state_dfa_reset(d);
        start = qd_state_dfa_intern(d, st);
    }
    CHECKF(start >= 0, "%s step %d: the state is interned", what, step);
    if (start < 0) return;
    const long g0 = d->char_grouped, k0 = d->subtree_skips;
    const int r = qd_token_trie_mask_fast(t, d, start, w, budget, fast, &dist_fast);
    CHECKF(r == 0 || (r == 1 && d->n == d->max_states), "%s step %d: walk %d (%d of %d states)", what, step, r, d->n,
           d->max_states);
    if (r != 0) {
        qd_state_dfa_reset(d);
        n->filled++;
        return;
    }
    n->compared++;
    /* the character step by a representative (grouped states) = by every byte group */
    const int cs = qd_state_dfa_char_step(d, start);
    if (cs != QD_DFA_FULL) {
        const int full = qd_state_dfa_char_step_full(d, start);
        CHECKF(full == QD_DFA_FULL || full == cs, "%s step %d: character step %d, by every byte %d", what, step, cs,
               full);
    }
    n->grouped += d->char_grouped - g0;
    if (cs != QD_DFA_MIXED && cs != QD_DFA_FULL) {
        n->string_level++;
        /* allowed tokens of the level's other trie that begin with string characters
         * ('abc"', 'x\\n', 'ab\xe6'): walked from the state those characters on */
        for (int i = 0; i < t->vocab_size; i++) {
            if (!bit(fast, i) || t->tok_len[i] < 2) continue;
            const unsigned char *b = t->blob + t->tok_off[i];
            const int whole = qd_token_string_chars(b, t->tok_len[i]);
            if ((whole < 0 || whole > QD_TC_MAX_CHARS) && qd_token_string_chars(b, 1) == 1) n->rest_prefixed++;
        }
    } else if (qd_state_dfa_atom_step(d, start) >= QD_DFA_DEAD) {
        n->atom_level++;
        n->word_skips += d->subtree_skips - k0;
    } else if (qd_state_dfa_alnum_step(d, start) >= QD_DFA_DEAD) {
        n->word_level++;
        /* subtrees allowed whole from a state that does not loop on every plain byte */
        n->word_skips += d->subtree_skips - k0;
    }
    int bad = 0;
    for (int i = 0; i < t->vocab_size; i++)
        if (bit(ref, i) != bit(fast, i) && bad++ < 3)
            fprintf(stderr, "%s step %d budget %d: token %d: fast %d, matcher %d\n", what, step, budget, i, bit(fast, i),
                    bit(ref, i));
    CHECKF(bad == 0, "%s step %d budget %d: %d tokens differ", what, step, budget, bad);
    CHECKF(dist_ref == dist_fast, "%s step %d budget %d: max completion %d = %d", what, step, budget, dist_fast, dist_ref);
}

/* Byte groups: every byte advances the matcher as its group's representative does. */
static void check_byte_groups(const qd_grammar *g, const qd_mstate *st, const char *what) {
    qd_mstate a, b;
    qd_mstate_init(&a);
    qd_mstate_init(&b);
    int bad = 0;
    for (int x = 0; x < 256; x++) {
        const int ra = qd_match_byte(g, st, (unsigned char)x, &a), rb = qd_match_byte(g, st, g->byte_rep[x], &b);
        if (ra != rb || (ra && !qd_mstate_equal(&a, &b))) bad++;
        if (g->byte_rep[x] > x) bad++;
    }
    CHECKF(bad == 0, "%s: %d bytes advance unlike their group", what, bad);
    qd_mstate_free(&a);
    qd_mstate_free(&b);
}

/* A token holding a quote, a backslash or a non-ASCII byte. */
static int awkward(const qd_token_trie *t, int id) {
    const unsigned char *b = t->blob + t->tok_off[id];
    for (int i = 0; i < t->tok_len[id]; i++)
        if (b[i] == '"' || b[i] == '\\' || b[i] >= 0x80) return 1;
    return 0;
}

static void walk_schema(const qd_token_trie *t, json_t *schema, const char *what, int steps, uint32_t *ref,
                        uint32_t *fast, int *allowed, counts *n) {
    qd_err err = {0};
    qd_grammar *g = NULL;
    if (qd_json_schema_grammar(schema, &g, &err) != QD_OK) {
        /* a random schema the compiler refuses (an unsupported combination) is no failure */
        fprintf(stderr, "%s: skipped: %s\n", what, err.msg);
        return;
    }
    qd_mstate st, nx;
    qd_mstate_init(&st);
    qd_mstate_init(&nx);
    qd_match_start(g, &st);
    qd_state_dfa kept, tiny;
    qd_state_dfa_init(&kept, g, 4096);
    qd_state_dfa_init(&tiny, g, 6);
    qd_trie_walk w = {0};
    for (int step = 0; step < steps; step++) {
        if (step % 4 == 0) check_byte_groups(g, &st, what);
        compare(t, g, &st, &tiny, &w, -1, ref, fast, what, step, n);
        compare(t, g, &st, &kept, &w, (int)rnd(16), ref, fast, what, step, n);
        compare(t, g, &st, &kept, &w, -1, ref, fast, what, step, n);
        /* the next token, from the unbudgeted reference mask (left in ref) */
        int n_allowed = 0, n_awk = 0;
        for (int i = 0; i < t->vocab_size; i++)
            if (bit(ref, i)) allowed[n_allowed++] = i;
        if (!n_allowed) break;
        const int uniform = allowed[rnd((unsigned)n_allowed)];
        for (int i = 0; i < n_allowed; i++)
            if (awkward(t, allowed[i])) allowed[n_awk++] = allowed[i];
        const int id = n_awk && rnd(3) == 0 ? allowed[rnd((unsigned)n_awk)] : uniform;
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
    /* every character step the kept automaton answered (most by a representative
     * inside the masks' walks) = the step by every byte group */
    const int n_kept = kept.n;
    for (int id = 0; id < n_kept; id++) {
        const int cs = kept.chr[id];
        if (cs == -2 || cs == QD_DFA_FULL) continue;
        const int full = qd_state_dfa_char_step_full(&kept, id);
        CHECKF(full == QD_DFA_FULL || full == cs, "%s: state %d: character step %d, by every byte %d", what, id, cs, full);
        n->chr_checked++;
    }
    qd_trie_walk_free(&w);
    qd_state_dfa_free(&kept);
    qd_state_dfa_free(&tiny);
    qd_mstate_free(&st);
    qd_mstate_free(&nx);
    qd_grammar_free(g);
}

static void check_string_chars(void) {
    static const struct {
        const char *b;
        int chars;
    } cases[] = {
        {"abc", 3},          {" x~", 3},           {"caf\xc3\xa9", 4},     {"\xe6\x97\xa5\xe6\x9c\xac", 2},
        {"\xf0\x9f\x98\x80", 1}, {"a\"b", -1},       {"a\\", -1},            {"\x7f", -1},
        {"\n", -1},          {"\xc3", -1},          {"\xa9x", -1},          {"\xc0\x80", -1} /* overlong */,
        {"\xe0\x80\x80", -1} /* overlong */, {"\xed\xa0\x80", -1} /* surrogate */, {"\xf4\x90\x80\x80", -1},
        {"\xed\x9f\xbf", 1}, {"\xf4\x8f\xbf\xbf", 1}, {"\xe0\xa0\x80", 1},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const int got = qd_token_string_chars((const unsigned char *)cases[i].b, (int)strlen(cases[i].b));
        CHECKF(got == cases[i].chars, "string chars of case %zu: %d, want %d", i, got, cases[i].chars);
    }
    CHECK(qd_token_alnum_chars((const unsigned char *)"aZ09", 4) == 4);
    CHECK(qd_token_alnum_chars((const unsigned char *)"a_b", 3) == -1);
    CHECK(qd_token_atom_chars((const unsigned char *)"a_b-c+d%9", 9) == 9);
    CHECK(qd_token_atom_chars((const unsigned char *)"a.b", 3) == -1);
}

int main(void) {
    check_string_chars();
    qd_err err = {0};
    qd_tokenizer *tok = NULL;
    if (qd_tokenizer_load("tests/data/qwen35-tokenizer/tokenizer.json", &tok, &err) != QD_OK) {
        CHECKF(0, "tokenizer: %s", err.msg);
        return qd_test_finish("test_grammar_mask_fast");
    }
    qd_token_trie *t = NULL;
    CHECKF(qd_token_trie_build(tok, &t, &err) == QD_OK, "trie: %s", err.msg);
    CHECK(t->classes != NULL);
    const size_t words = ((size_t)t->vocab_size + 31) / 32;
    uint32_t *ref = malloc(words * 4), *fast = malloc(words * 4);
    int *allowed = malloc(sizeof(int) * (size_t)t->vocab_size);
    counts n = {0};
    static const char *const FIXED[] = {
        ("{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"minLength\":1,\"maxLength\":12},"
         "\"email\":{\"type\":\"string\",\"format\":\"email\"}},\"required\":[\"name\",\"email\"]}"),
        "{\"type\":\"object\",\"properties\":{\"s\":{\"type\":\"string\",\"minLength\":3,\"maxLength\":8}},\"required\":[\"s\"]}",
        "{\"type\":\"array\",\"items\":{\"type\":\"string\"},\"minItems\":2}",
    };
    for (size_t i = 0; i < sizeof FIXED / sizeof FIXED[0]; i++) {
        json_t *s = json_loads(FIXED[i], 0, NULL);
        CHECKF(s != NULL, "fixed schema %zu parses", i);
        char what[32];
        snprintf(what, sizeof what, "fixed schema %zu", i);
        walk_schema(t, s, what, 20, ref, fast, allowed, &n);
        json_decref(s);
    }
    walk_schema(t, NULL, "json_object", 16, ref, fast, allowed, &n);
    for (int k = 0; k < 10; k++) {
        json_t *s = random_schema(3);
        char *text = json_dumps(s, JSON_COMPACT);
        char what[48];
        snprintf(what, sizeof what, "random schema %d", k);
        fprintf(stderr, "%s: %s\n", what, text);
        walk_schema(t, s, what, 16, ref, fast, allowed, &n);
        free(text);
        json_decref(s);
    }
    printf("masks compared: %ld (string level %ld, e-mail atom level %ld, word level %ld; %ld walks filled the tiny automaton); "
           "%ld character steps by a representative, %ld checked by every byte group; %ld subtrees allowed whole in "
           "e-mail and word states; %ld allowed tokens after a prefix of string characters\n",
           n.compared, n.string_level, n.atom_level, n.word_level, n.filled, n.grouped, n.chr_checked, n.word_skips, n.rest_prefixed);
    CHECK(n.compared > 100);
    CHECK(n.string_level > 10);
    CHECK(n.word_level > 3);
    CHECK(n.atom_level > 3);
    CHECK(n.grouped > 10);
    CHECK(n.chr_checked > n.grouped / 2);
    CHECK(n.word_skips > 10);
    CHECK(n.rest_prefixed > 10);
    free(ref);
    free(fast);
    free(allowed);
    qd_token_trie_free(t);
    qd_tokenizer_free(tok);
    return qd_test_finish("test_grammar_mask_fast");
}
