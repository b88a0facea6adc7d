/* Internals of the chat-template interpreter, shared by its source files:
 *   chat_template_value.c   values, arena, strings, JSON conversion, repr/tojson
 *   chat_template_lex.c     template text -> tokens (whitespace control)
 *   chat_template_parse.c   tokens -> AST
 *   chat_template_eval.c    AST evaluation (statements, expressions, scopes)
 *   chat_template_filters.c filters, tests, methods of str/dict, globals
 *   chat_template.c         public API
 * Values are immutable (except namespaces) and live in a per-render arena, so
 * they are shared freely without reference counting and freed all at once. */
#ifndef QD_IO_CHAT_TEMPLATE_INT_H
#define QD_IO_CHAT_TEMPLATE_INT_H

#include <stddef.h>
#include <stdint.h>

#include "base/err.h"
#include "io/chat_template.h"

/* ------------------------------------------------------------------ arena */

typedef struct ct_chunk ct_chunk;
typedef struct ct_arena {
    ct_chunk *head;
    size_t total;   /* bytes handed out */
    size_t limit;   /* 0 = unlimited */
} ct_arena;

void *ct_alloc(ct_arena *a, size_t n);   /* zeroed; NULL when over limit or OOM */
void ct_arena_free(ct_arena *a);

/* ------------------------------------------------------------------ values */

typedef enum {
    TV_UNDEF = 0, TV_NONE, TV_BOOL, TV_INT, TV_FLOAT, TV_STR,
    TV_LIST, TV_DICT, TV_NS, TV_FUNC, TV_MACRO, TV_METHOD, TV_LOOP
} tv_type;

typedef struct tlist tlist;
typedef struct tdict tdict;
typedef struct tmethod tmethod;
typedef struct tloop tloop;
typedef struct node node;

typedef struct tv {
    tv_type t;
    union {
        int b;
        int64_t i;
        double f;
        struct { const char *p; size_t n; } s;
        tlist *l;
        tdict *d;     /* TV_DICT and TV_NS */
        int fn;       /* TV_FUNC: a ct_builtin */
        const node *m; /* TV_MACRO */
        tmethod *meth;
        tloop *loop;
    };
} tv;

struct tlist { size_t n; tv *v; int tuple; };
struct tdict { size_t n, cap; tv *k; tv *v; };
struct tmethod { tv self; const char *name; };
struct tloop {
    tlist *items;   /* the (filtered) sequence being iterated */
    size_t i;       /* index0 */
};

enum ct_builtin { CT_FN_RANGE, CT_FN_NAMESPACE, CT_FN_RAISE, CT_FN_STRFTIME, CT_FN_DICT, CT_FN_CYCLE };

static inline tv tv_undef(void) { tv v = {0}; return v; }
static inline tv tv_none(void) { tv v = {0}; v.t = TV_NONE; return v; }
static inline tv tv_bool(int b) { tv v = {0}; v.t = TV_BOOL; v.b = !!b; return v; }
static inline tv tv_int(int64_t i) { tv v = {0}; v.t = TV_INT; v.i = i; return v; }
static inline tv tv_float(double f) { tv v = {0}; v.t = TV_FLOAT; v.f = f; return v; }
static inline tv tv_strn(const char *p, size_t n) { tv v = {0}; v.t = TV_STR; v.s.p = p; v.s.n = n; return v; }

/* Growable byte buffer; allocation failure is sticky (oom = 1). */
typedef struct ct_buf { char *p; size_t n, cap; int oom; size_t limit; } ct_buf;
void ct_buf_put(ct_buf *b, const char *s, size_t n);
static inline void ct_buf_puts(ct_buf *b, const char *s) { size_t n = 0; while (s[n]) n++; ct_buf_put(b, s, n); }
void ct_buf_putc(ct_buf *b, char c);
void ct_buf_free(ct_buf *b);

/* Render state: everything evaluation needs, passed explicitly (no globals). */
typedef struct ct_scope ct_scope;
typedef struct ct_ctx {
    ct_arena *ar;
    qd_err *err;
    ct_buf *out;              /* current output (macro calls redirect it) */
    ct_scope *root;           /* template top level; macros resolve names here */
    ct_scope *sc;             /* innermost scope */
    tdict *vars;              /* the render variables (messages, tools, ...) */
    long long steps, max_steps;
    int depth, max_depth;
    int loop_ctl;             /* 1 = break, 2 = continue pending */
    int line;                 /* line of the node being evaluated, for errors */
} ct_ctx;

/* Sets ctx->err as "chat template line N: ..." and returns -1. */
int ct_fail(ct_ctx *c, qd_status st, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
int ct_oom(ct_ctx *c);

tv ct_str_dup(ct_ctx *c, const char *p, size_t n, int *ok);
tlist *ct_list_new(ct_ctx *c, size_t n);
/* The items a for loop or a list filter iterates over: a list itself, a dict's keys, a
 * string's characters (codepoints), nothing for undefined; anything else fails. */
int ct_iter_list(ct_ctx *c, tv v, tlist **out);
tdict *ct_dict_new(ct_ctx *c, size_t cap);
int ct_dict_set(ct_ctx *c, tdict *d, tv k, tv v);
tv *ct_dict_get(const tdict *d, const char *key, size_t n);
tv *ct_dict_lookup(const tdict *d, tv key);

int ct_truthy(tv v);
int ct_equal(tv a, tv b);
const char *ct_type_name(tv v);
int ct_from_json(ct_ctx *c, const void *json, tv *out);   /* json_t * */
/* str(v) and repr(v) as Python would print them, appended to b. */
void ct_to_str(ct_buf *b, tv v);
void ct_repr(ct_buf *b, tv v);
/* json.dumps(v, ensure_ascii, indent (<0 = none, or indent string), separators, sort_keys). */
int ct_tojson(ct_ctx *c, ct_buf *b, tv v, int ensure_ascii, const char *indent, const char *item_sep,
              const char *key_sep, int sort_keys, int level);
/* Value to string value (str()); for strings returns them unchanged. */
int ct_stringify(ct_ctx *c, tv v, tv *out);
/* UTF-8 helpers (codepoint semantics for len/index/slice). */
size_t ct_utf8_len(const char *p, size_t n);
size_t ct_utf8_next(const char *p, size_t n, size_t i);
/* Byte length of a Python whitespace character (str.isspace) at p[i], or 0. */
size_t ct_space_at(const char *p, size_t n, size_t i);

/* ------------------------------------------------------------------ lexer */

typedef enum {
    TK_EOF = 0, TK_TEXT, TK_VAR_BEGIN, TK_VAR_END, TK_BLOCK_BEGIN, TK_BLOCK_END,
    TK_NAME, TK_INT, TK_FLOAT, TK_STRING, TK_OP
} tk_type;

typedef struct ct_token {
    tk_type t;
    int line;
    const char *p;  /* TEXT: raw text (already whitespace-processed); NAME/OP: source */
    size_t n;
    char *str;      /* STRING/TEXT: decoded, owned by the arena */
    size_t str_n;
    int64_t ival;
    double fval;
} ct_token;

typedef struct ct_tokens { ct_token *v; size_t n, cap; } ct_tokens;

int ct_lex(const char *src, size_t len, ct_arena *ar, ct_tokens *out, qd_err *err);

/* ------------------------------------------------------------------ AST */

typedef enum {
    /* statements */
    N_BODY, N_TEXT, N_OUTPUT, N_IF, N_FOR, N_SET, N_SET_BLOCK, N_MACRO, N_BREAK, N_CONTINUE,
    N_FILTER_BLOCK,
    /* expressions */
    N_LIT, N_NAME, N_LIST, N_TUPLE, N_DICT, N_GETATTR, N_GETITEM, N_SLICE, N_CALL, N_FILTER,
    N_TEST, N_BINOP, N_NEG, N_POS, N_NOT, N_AND, N_OR, N_COMPARE, N_CONDEXPR
} node_kind;

/* Binary and comparison operators. */
enum { OP_ADD, OP_SUB, OP_MUL, OP_DIV, OP_FLOORDIV, OP_MOD, OP_POW, OP_CONCAT,
       OP_EQ, OP_NE, OP_LT, OP_LE, OP_GT, OP_GE, OP_IN, OP_NOTIN };

struct node {
    node_kind kind;
    int line;
    int op;             /* BINOP op; TEST negated; FOR has-else; SET target is attr */
    tv lit;             /* LIT value; TEXT text */
    const char *name;   /* NAME/GETATTR attr/FILTER/TEST/MACRO name/SET target */
    const char *name2;  /* SET ns.attr: attribute */
    node *a, *b, *c, *d;
    node **kids;        /* BODY statements, LIST items, CALL positional args,
                           COMPARE operands (after a), FOR target names, MACRO params */
    int nkids;
    int *ops;           /* COMPARE operators */
    const char **kw;    /* CALL/FILTER/TEST keyword names; MACRO param names */
    node **kwv;         /* their values; MACRO defaults (NULL = required) */
    int nkw;
    int filter_id, test_id;  /* resolved at compile time */
};

int ct_parse(ct_tokens *toks, ct_arena *ar, node **out, qd_err *err);

/* ------------------------------------------------------------------ eval */

ct_scope *ct_scope_new(ct_ctx *c, ct_scope *parent);
int ct_render_body(ct_ctx *c, const node *body);
int ct_eval(ct_ctx *c, const node *e, tv *out);
/* Calls a callable value with evaluated arguments. */
int ct_call_value(ct_ctx *c, tv fn, tv *args, int nargs, const char **kw, tv *kwv, int nkw, tv *out);
int ct_getattr(ct_ctx *c, tv obj, const char *name, size_t n, tv *out);
int ct_getitem(ct_ctx *c, tv obj, tv key, tv *out);

/* ------------------------------------------------------------------ filters/tests */

int ct_filter_id(const char *name);   /* -1 if unknown */
int ct_test_id(const char *name);     /* -1 if unknown */
int ct_apply_filter(ct_ctx *c, int id, tv v, tv *args, int nargs, const char **kw, tv *kwv, int nkw, tv *out);
int ct_apply_test(ct_ctx *c, int id, tv v, tv *args, int nargs, int *result);
int ct_call_method(ct_ctx *c, tv self, const char *name, tv *args, int nargs, const char **kw, tv *kwv,
                   int nkw, tv *out);
int ct_is_method(tv self, const char *name, size_t n);
int ct_call_builtin(ct_ctx *c, int fn, tv *args, int nargs, const char **kw, tv *kwv, int nkw, tv *out);
int ct_compare(ct_ctx *c, int op, tv a, tv b, int *result);
/* str.strip family (chars NULL = whitespace), case mapping, str.replace. */
tv ct_strip(tv s, const tv *chars, int left, int right);
enum { CT_CASE_UPPER, CT_CASE_LOWER, CT_CASE_TITLE, CT_CASE_CAPITALIZE, CT_CASE_SWAP };
int ct_case_map(ct_ctx *c, tv s, int mode, tv *out);
/* str.isdigit/isalpha/isalnum/isspace/islower/isupper for kind 0..5. */
int ct_str_pred(tv s, int kind);
int ct_str_percent(ct_ctx *c, tv fmt, tv arg, tv *out);
int ct_str_replace(ct_ctx *c, tv s, tv old, tv new_, int64_t count, tv *out);

#endif
