/* Internals shared by the schema compiler's files: the compile context and the
 * grammar helpers (json_schema.c: structure; json_schema_scalar.c: strings, numbers,
 * formats). */
#ifndef QD_RUNTIME_GRAMMAR_JSON_SCHEMA_INT_H
#define QD_RUNTIME_GRAMMAR_JSON_SCHEMA_INT_H

#include <jansson.h>

#include "base/err.h"
#include "runtime/grammar/grammar.h"

typedef struct sc_ref {
    const json_t *target;
    int rule;
} sc_ref;

typedef struct sc_ctx {
    qd_grammar *g;
    const json_t *root;
    qd_err *err;
    int failed;
    int nesting;
    sc_ref *refs;          /* compiled $ref targets (recursion ends here) */
    int n_refs, cap_refs;
    /* shared rules, -1 until made */
    int r_ws, r_char, r_string, r_value, r_object, r_number, r_integer;
    int r_digits[16];      /* r_digits[k]: exactly k digits */
    int r_upto_digits[16]; /* r_upto_digits[k]: 0..k digits */
} sc_ctx;

/* A rule of one alternative: syms[0..n). */
int sc_seq(sc_ctx *c, const int32_t *syms, int n);
/* A rule for a|b|... over rules (n >= 1). */
int sc_alts(sc_ctx *c, const int *rules, int n);
int sc_lit(sc_ctx *c, const char *s);
/* A rule for 0 to n copies of item in a row; n < 0: any number. */
int sc_upto(sc_ctx *c, int item, long long n);
int sc_fail(sc_ctx *c, qd_status st, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

int sc_ws(sc_ctx *c);            /* "" | " " */
int sc_char(sc_ctx *c);          /* one JSON string character (an escape or one UTF-8 code point) */
int sc_any_string(sc_ctx *c);
int sc_any_value(sc_ctx *c);
int sc_any_object(sc_ctx *c);
int sc_digits(sc_ctx *c, int k);
int sc_upto_digits(sc_ctx *c, int k);

/* string / integer / number schemas (json_schema_scalar.c) */
int sc_string(sc_ctx *c, const json_t *s, const char *path);
int sc_numeric(sc_ctx *c, const json_t *s, const char *path, int integer);
/* a string matching a regular-expression subset (json_schema_pattern.c) */
int sc_pattern(sc_ctx *c, const char *pattern, size_t len, const char *path);

/* The schema a "#..." JSON pointer names in the root, or NULL. */
const json_t *sc_resolve_ref(sc_ctx *c, const char *ref);
/* oneOf: 0 when its branches provably cannot both match a value (json_schema_oneof.c),
 * else -1 with the error naming the path and the two branches. */
int sc_oneof_exclusive(sc_ctx *c, const json_t *list, const char *path);

/* A non-negative integer keyword (minLength ...): value, -1 when absent, -2 on error. */
long long sc_count(sc_ctx *c, const json_t *s, const char *key, const char *path);

#endif
