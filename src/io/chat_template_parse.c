/* Chat-template parser: tokens -> AST. The expression grammar and operator
 * precedence follow Jinja2's parser (lowest first): inline if, or, and, not,
 * comparisons (chainable, in / not in), + -, ~, * / // %, **, unary - +, then
 * primaries with postfix .attr / [index] / (call) and filter |f / test `is t`.
 * Filters and tests are resolved here so an unknown one is a compile error. */
#include <stdio.h>
#include <string.h>

#include "io/chat_template_int.h"

#define MAX_NEST 200   /* expression / block nesting; deeper is rejected, not a crash */

typedef struct parser {
    ct_token *t;
    size_t i;
    ct_arena *ar;
    qd_err *err;
    int nest;
} parser;

static ct_token *cur(parser *P) { return &P->t[P->i]; }
/* The token k ahead, never past the final EOF token. */
static ct_token *peek(parser *P, size_t k) {
    size_t j = P->i;
    while (k-- && P->t[j].t != TK_EOF) j++;
    return &P->t[j];
}

static int tok_is(const ct_token *t, tk_type type, const char *s) {
    if (t->t != type) return 0;
    size_t n = strlen(s);
    return t->n == n && memcmp(t->p, s, n) == 0;
}
static int is_op(parser *P, const char *s) { return tok_is(cur(P), TK_OP, s); }
static int is_name(parser *P, const char *s) { return tok_is(cur(P), TK_NAME, s); }

static int perr(parser *P, const char *fmt, const char *arg) {
    char msg[512];
    snprintf(msg, sizeof msg, fmt, arg);
    qd_seterr(P->err, QD_ERR_FORMAT, "chat template line %d: %s", cur(P)->line, msg);
    return -1;
}

static const char *tok_desc(parser *P) {
    static _Thread_local char buf[80];
    ct_token *t = cur(P);
    switch (t->t) {
    case TK_EOF: return "end of template";
    case TK_TEXT: return "template text";
    case TK_VAR_BEGIN: return "'{{'";
    case TK_VAR_END: return "end of print statement '}}'";
    case TK_BLOCK_BEGIN: return "'{%'";
    case TK_BLOCK_END: return "end of statement '%}'";
    case TK_STRING: return "string literal";
    default:
        snprintf(buf, sizeof buf, "'%.*s'", (int)(t->n > 40 ? 40 : t->n), t->p);
        return buf;
    }
}

static int expect_op(parser *P, const char *s) {
    if (!is_op(P, s)) {
        char what[64];
        snprintf(what, sizeof what, "expected '%s', got %%s", s);
        return perr(P, what, tok_desc(P));
    }
    P->i++;
    return 0;
}

static node *mk(parser *P, node_kind k, int line) {
    node *n = ct_alloc(P->ar, sizeof *n);
    if (!n) { perr(P, "%s", "out of memory"); return NULL; }
    n->kind = k;
    n->line = line;
    return n;
}

static char *tok_name(parser *P, ct_token *t) {
    char *s = ct_alloc(P->ar, t->n + 1);
    if (!s) { perr(P, "%s", "out of memory"); return NULL; }
    memcpy(s, t->p, t->n);
    return s;
}

/* Dynamic node arrays during parsing: grown by doubling within the arena. */
typedef struct nvec { node **v; const char **names; int n, cap; } nvec;
static int nvec_push(parser *P, nvec *a, node *x, const char *name) {
    if (a->n == a->cap) {
        int cap = a->cap ? a->cap * 2 : 4;
        node **v = ct_alloc(P->ar, (size_t)cap * sizeof *v);
        const char **nm = ct_alloc(P->ar, (size_t)cap * sizeof *nm);
        if (!v || !nm) return perr(P, "%s", "out of memory");
        if (a->n) {
            memcpy(v, a->v, (size_t)a->n * sizeof *v);
            memcpy(nm, a->names, (size_t)a->n * sizeof *nm);
        }
        a->v = v;
        a->names = nm;
        a->cap = cap;
    }
    a->v[a->n] = x;
    a->names[a->n] = name;
    a->n++;
    return 0;
}

static node *parse_expr(parser *P, int condexpr);
static node *parse_unary(parser *P, int with_filter);

/* ( args ) for calls, filters and tests: positional then name=value. */
static int parse_args(parser *P, node *n) {
    nvec pos = {0}, kw = {0};
    if (expect_op(P, "(")) return -1;
    while (!is_op(P, ")")) {
        if (pos.n || kw.n) {
            if (expect_op(P, ",")) return -1;
            if (is_op(P, ")")) break;
        }
        if (is_op(P, "*") || is_op(P, "**")) return perr(P, "unsupported construct: %s in call arguments", "*args/**kwargs");
        if (cur(P)->t == TK_NAME && tok_is(peek(P, 1), TK_OP, "=")) {
            char *name = tok_name(P, cur(P));
            if (!name) return -1;
            P->i += 2;
            node *v = parse_expr(P, 1);
            if (!v || nvec_push(P, &kw, v, name)) return -1;
        } else {
            if (kw.n) return perr(P, "%s", "positional argument follows keyword argument");
            node *v = parse_expr(P, 1);
            if (!v || nvec_push(P, &pos, v, NULL)) return -1;
        }
    }
    P->i++;
    n->kids = pos.v;
    n->nkids = pos.n;
    n->kw = kw.names;
    n->kwv = kw.v;
    n->nkw = kw.n;
    return 0;
}

static node *parse_primary(parser *P) {
    ct_token *t = cur(P);
    node *n;
    if (t->t == TK_NAME) {
        P->i++;
        if (tok_is(t, TK_NAME, "true") || tok_is(t, TK_NAME, "True")) { if ((n = mk(P, N_LIT, t->line))) n->lit = tv_bool(1); return n; }
        if (tok_is(t, TK_NAME, "false") || tok_is(t, TK_NAME, "False")) { if ((n = mk(P, N_LIT, t->line))) n->lit = tv_bool(0); return n; }
        if (tok_is(t, TK_NAME, "none") || tok_is(t, TK_NAME, "None")) { if ((n = mk(P, N_LIT, t->line))) n->lit = tv_none(); return n; }
        if (!(n = mk(P, N_NAME, t->line)) || !(n->name = tok_name(P, t))) return NULL;
        return n;
    }
    if (t->t == TK_STRING) {
        /* Adjacent literals concatenate, as in Python. */
        size_t total = 0, j = P->i;
        while (P->t[j].t == TK_STRING) total += P->t[j++].str_n;
        char *s = ct_alloc(P->ar, total + 1);
        if (!s || !(n = mk(P, N_LIT, t->line))) return NULL;
        size_t k = 0;
        while (cur(P)->t == TK_STRING) {
            memcpy(s + k, cur(P)->str, cur(P)->str_n);
            k += cur(P)->str_n;
            P->i++;
        }
        n->lit = tv_strn(s, k);
        return n;
    }
    if (t->t == TK_INT || t->t == TK_FLOAT) {
        P->i++;
        if (!(n = mk(P, N_LIT, t->line))) return NULL;
        n->lit = t->t == TK_INT ? tv_int(t->ival) : tv_float(t->fval);
        return n;
    }
    if (tok_is(t, TK_OP, "(")) {
        P->i++;
        if (is_op(P, ")")) { P->i++; return mk(P, N_TUPLE, t->line); }
        node *e = parse_expr(P, 1);
        if (!e) return NULL;
        if (is_op(P, ")")) { P->i++; return e; }
        nvec items = {0};
        if (nvec_push(P, &items, e, NULL)) return NULL;
        while (is_op(P, ",")) {
            P->i++;
            if (is_op(P, ")")) break;
            node *x = parse_expr(P, 1);
            if (!x || nvec_push(P, &items, x, NULL)) return NULL;
        }
        if (expect_op(P, ")") || !(n = mk(P, N_TUPLE, t->line))) return NULL;
        n->kids = items.v;
        n->nkids = items.n;
        return n;
    }
    if (tok_is(t, TK_OP, "[")) {
        P->i++;
        nvec items = {0};
        while (!is_op(P, "]")) {
            if (items.n && expect_op(P, ",")) return NULL;
            if (is_op(P, "]")) break;
            node *x = parse_expr(P, 1);
            if (!x || nvec_push(P, &items, x, NULL)) return NULL;
        }
        P->i++;
        if (!(n = mk(P, N_LIST, t->line))) return NULL;
        n->kids = items.v;
        n->nkids = items.n;
        return n;
    }
    if (tok_is(t, TK_OP, "{")) {
        P->i++;
        nvec keys = {0}, vals = {0};
        while (!is_op(P, "}")) {
            if (keys.n && expect_op(P, ",")) return NULL;
            if (is_op(P, "}")) break;
            node *k = parse_expr(P, 1);
            if (!k || expect_op(P, ":")) return NULL;
            node *v = parse_expr(P, 1);
            if (!v || nvec_push(P, &keys, k, NULL) || nvec_push(P, &vals, v, NULL)) return NULL;
        }
        P->i++;
        if (!(n = mk(P, N_DICT, t->line))) return NULL;
        n->kids = keys.v;
        n->kwv = vals.v;
        n->nkids = keys.n;
        return n;
    }
    perr(P, "unexpected %s in expression", tok_desc(P));
    return NULL;
}

static node *parse_subscript(parser *P, node *obj, int line) {
    node *parts[3] = {NULL, NULL, NULL};
    int is_slice = 0, k = 0;
    for (;;) {
        if (is_op(P, ":")) {
            if (++k > 2) { perr(P, "%s", "too many ':' in slice"); return NULL; }
            is_slice = 1;
            P->i++;
            continue;
        }
        if (is_op(P, "]")) break;
        if (parts[k]) { perr(P, "expected ']', got %s", tok_desc(P)); return NULL; }
        if (!(parts[k] = parse_expr(P, 1))) return NULL;
    }
    P->i++;
    node *n = mk(P, is_slice ? N_SLICE : N_GETITEM, line);
    if (!n) return NULL;
    n->a = obj;
    if (is_slice) { n->b = parts[0]; n->c = parts[1]; n->d = parts[2]; }
    else {
        if (!parts[0]) { perr(P, "%s", "empty subscript"); return NULL; }
        n->b = parts[0];
    }
    return n;
}

static node *parse_postfix(parser *P, node *n) {
    for (;;) {
        ct_token *t = cur(P);
        if (tok_is(t, TK_OP, ".")) {
            P->i++;
            ct_token *a = cur(P);
            node *g;
            if (a->t == TK_NAME) {
                if (!(g = mk(P, N_GETATTR, a->line)) || !(g->name = tok_name(P, a))) return NULL;
                g->a = n;
            } else if (a->t == TK_INT) {
                node *lit = mk(P, N_LIT, a->line);
                if (!lit || !(g = mk(P, N_GETITEM, a->line))) return NULL;
                lit->lit = tv_int(a->ival);
                g->a = n;
                g->b = lit;
            } else { perr(P, "expected attribute name after '.', got %s", tok_desc(P)); return NULL; }
            P->i++;
            n = g;
        } else if (tok_is(t, TK_OP, "[")) {
            P->i++;
            if (!(n = parse_subscript(P, n, t->line))) return NULL;
        } else if (tok_is(t, TK_OP, "(")) {
            node *c = mk(P, N_CALL, t->line);
            if (!c) return NULL;
            c->a = n;
            if (parse_args(P, c)) return NULL;
            n = c;
        } else return n;
    }
}

static node *parse_filter_expr(parser *P, node *n) {
    for (;;) {
        ct_token *t = cur(P);
        if (tok_is(t, TK_OP, "|")) {
            P->i++;
            ct_token *f = cur(P);
            if (f->t != TK_NAME) { perr(P, "expected filter name, got %s", tok_desc(P)); return NULL; }
            node *fn = mk(P, N_FILTER, f->line);
            if (!fn || !(fn->name = tok_name(P, f))) return NULL;
            fn->filter_id = ct_filter_id(fn->name);
            if (fn->filter_id < 0) { perr(P, "unsupported construct: no filter named '%s'", fn->name); return NULL; }
            P->i++;
            fn->a = n;
            if (is_op(P, "(") && parse_args(P, fn)) return NULL;
            n = fn;
        } else if (tok_is(t, TK_NAME, "is")) {
            P->i++;
            node *tn = mk(P, N_TEST, t->line);
            if (!tn) return NULL;
            if (is_name(P, "not")) { tn->op = 1; P->i++; }
            ct_token *nm = cur(P);
            if (nm->t != TK_NAME) { perr(P, "expected test name, got %s", tok_desc(P)); return NULL; }
            if (!(tn->name = tok_name(P, nm))) return NULL;
            tn->test_id = ct_test_id(tn->name);
            if (tn->test_id < 0) { perr(P, "unsupported construct: no test named '%s'", tn->name); return NULL; }
            P->i++;
            tn->a = n;
            ct_token *x = cur(P);
            if (tok_is(x, TK_OP, "(")) {
                if (parse_args(P, tn)) return NULL;
            } else if ((x->t == TK_NAME || x->t == TK_STRING || x->t == TK_INT || x->t == TK_FLOAT ||
                        tok_is(x, TK_OP, "[") || tok_is(x, TK_OP, "{")) &&
                       !tok_is(x, TK_NAME, "else") && !tok_is(x, TK_NAME, "or") && !tok_is(x, TK_NAME, "and")) {
                /* `x is divisibleby 3`: one argument without parentheses. */
                node *arg = parse_primary(P);
                if (!arg || !(arg = parse_postfix(P, arg))) return NULL;
                if (!(tn->kids = ct_alloc(P->ar, sizeof(node *)))) return NULL;
                tn->kids[0] = arg;
                tn->nkids = 1;
            }
            n = tn;
        } else if (tok_is(t, TK_OP, "(")) {
            node *c = mk(P, N_CALL, t->line);
            if (!c) return NULL;
            c->a = n;
            if (parse_args(P, c)) return NULL;
            n = c;
        } else return n;
    }
}

static node *parse_unary(parser *P, int with_filter) {
    if (++P->nest > MAX_NEST) { perr(P, "%s", "expression nested too deeply"); return NULL; }
    ct_token *t = cur(P);
    node *n;
    if (tok_is(t, TK_OP, "-") || tok_is(t, TK_OP, "+")) {
        P->i++;
        node *x = parse_unary(P, 0);
        if (!x || !(n = mk(P, tok_is(t, TK_OP, "-") ? N_NEG : N_POS, t->line))) return NULL;
        n->a = x;
    } else if (!(n = parse_primary(P))) return NULL;
    if (!(n = parse_postfix(P, n))) return NULL;
    if (with_filter && !(n = parse_filter_expr(P, n))) return NULL;
    P->nest--;
    return n;
}

static node *binop(parser *P, int op, node *a, node *b, int line) {
    node *n = mk(P, N_BINOP, line);
    if (!n) return NULL;
    n->op = op;
    n->a = a;
    n->b = b;
    return n;
}

/* The left-associative binary operators by level, tightest first: ** (0), then * / // % (1),
 * then ~ (2), then + - (3); comparisons, not, and, or sit above them. */
static const struct {
    const char *tok;
    int op, level;
} binops[] = {
    {"**", OP_POW, 0}, {"*", OP_MUL, 1},    {"/", OP_DIV, 1}, {"//", OP_FLOORDIV, 1},
    {"%", OP_MOD, 1},  {"~", OP_CONCAT, 2}, {"+", OP_ADD, 3}, {"-", OP_SUB, 3},
};
#define BINOP_TOP 3

/* The operator of the level at the current token, or -1. */
static int binop_here(parser *P, int level) {
    for (size_t i = 0; i < sizeof binops / sizeof binops[0]; i++)
        if (binops[i].level == level && is_op(P, binops[i].tok)) return binops[i].op;
    return -1;
}

static node *parse_binary(parser *P, int level) {
    node *n = level ? parse_binary(P, level - 1) : parse_unary(P, 1);
    for (int op; n && (op = binop_here(P, level)) >= 0;) {
        int line = cur(P)->line;
        P->i++;
        node *r = level ? parse_binary(P, level - 1) : parse_unary(P, 1);
        n = r ? binop(P, op, n, r, line) : NULL;
    }
    return n;
}

static node *parse_compare(parser *P) {
    node *first = parse_binary(P, BINOP_TOP);
    if (!first) return NULL;
    nvec operands = {0};
    int ops[64], nops = 0, line = cur(P)->line;
    for (;;) {
        int op;
        if (is_op(P, "==")) op = OP_EQ;
        else if (is_op(P, "!=")) op = OP_NE;
        else if (is_op(P, "<")) op = OP_LT;
        else if (is_op(P, "<=")) op = OP_LE;
        else if (is_op(P, ">")) op = OP_GT;
        else if (is_op(P, ">=")) op = OP_GE;
        else if (is_name(P, "in")) op = OP_IN;
        else if (is_name(P, "not") && tok_is(peek(P, 1), TK_NAME, "in")) { op = OP_NOTIN; P->i++; }
        else break;
        P->i++;
        if (nops == 64) { perr(P, "%s", "comparison chain too long"); return NULL; }
        node *r = parse_binary(P, BINOP_TOP);
        if (!r || nvec_push(P, &operands, r, NULL)) return NULL;
        ops[nops++] = op;
    }
    if (!nops) return first;
    node *n = mk(P, N_COMPARE, line);
    int *o = ct_alloc(P->ar, sizeof(int) * (size_t)nops);
    if (!n || !o) return NULL;
    memcpy(o, ops, sizeof(int) * (size_t)nops);
    n->a = first;
    n->kids = operands.v;
    n->nkids = nops;
    n->ops = o;
    return n;
}

static node *parse_not(parser *P) {
    if (is_name(P, "not")) {
        int line = cur(P)->line;
        P->i++;
        if (++P->nest > MAX_NEST) { perr(P, "%s", "expression nested too deeply"); return NULL; }
        node *x = parse_not(P);
        P->nest--;
        node *n = x ? mk(P, N_NOT, line) : NULL;
        if (n) n->a = x;
        return n;
    }
    return parse_compare(P);
}

/* `and` (is_or 0, binding tighter) and `or` (1): left-associative chains of the level below */
static node *parse_logic(parser *P, int is_or) {
    node *n = is_or ? parse_logic(P, 0) : parse_not(P);
    while (n && is_name(P, is_or ? "or" : "and")) {
        int line = cur(P)->line;
        P->i++;
        node *r = is_or ? parse_logic(P, 0) : parse_not(P), *x = r ? mk(P, is_or ? N_OR : N_AND, line) : NULL;
        if (x) { x->a = n; x->b = r; }
        n = x;
    }
    return n;
}

static node *parse_expr(parser *P, int condexpr) {
    if (++P->nest > MAX_NEST) { perr(P, "%s", "expression nested too deeply"); return NULL; }
    node *n = parse_logic(P, 1);
    while (n && condexpr && is_name(P, "if")) {
        int line = cur(P)->line;
        P->i++;
        node *cond = parse_logic(P, 1), *els = NULL;
        if (!cond) return NULL;
        if (is_name(P, "else")) {
            P->i++;
            if (!(els = parse_expr(P, 1))) return NULL;
        }
        node *x = mk(P, N_CONDEXPR, line);
        if (!x) return NULL;
        x->a = n;
        x->b = cond;
        x->c = els;
        n = x;
    }
    P->nest--;
    return n;
}

/* ------------------------------------------------------------------ statements */

static node *parse_body(parser *P, const char *const *ends);

static int expect_block_end(parser *P) {
    if (cur(P)->t != TK_BLOCK_END) return perr(P, "expected end of statement '%%}', got %s", tok_desc(P));
    P->i++;
    return 0;
}

/* Consumes `{% name %}` (the end tag found by parse_body). */
static int end_tag(parser *P) {
    P->i += 2;
    return expect_block_end(P);
}

static const char *const END_IF[] = {"elif", "else", "endif", NULL};

static node *parse_if(parser *P, int line) {
    node *n = mk(P, N_IF, line);
    if (!n || !(n->a = parse_expr(P, 1)) || expect_block_end(P) || !(n->c = parse_body(P, END_IF)))
        return NULL;
    ct_token *kw = peek(P, 1);
    if (tok_is(kw, TK_NAME, "elif")) {
        P->i += 2;
        if (!(n->b = parse_if(P, kw->line))) return NULL;
        return n;
    }
    if (tok_is(kw, TK_NAME, "else")) {
        static const char *const END[] = {"endif", NULL};
        if (end_tag(P) || !(n->b = parse_body(P, END))) return NULL;
    }
    return end_tag(P) ? NULL : n;
}

static node *parse_for(parser *P, int line) {
    static const char *const END_FOR[] = {"else", "endfor", NULL};
    static const char *const END[] = {"endfor", NULL};
    node *n = mk(P, N_FOR, line);
    nvec targets = {0};
    if (!n) return NULL;
    int paren = is_op(P, "(");
    if (paren) P->i++;
    for (;;) {
        if (cur(P)->t != TK_NAME) { perr(P, "expected loop variable name, got %s", tok_desc(P)); return NULL; }
        if (nvec_push(P, &targets, NULL, tok_name(P, cur(P)))) return NULL;
        P->i++;
        if (!is_op(P, ",")) break;
        P->i++;
    }
    if (paren && expect_op(P, ")")) return NULL;
    n->kw = targets.names;
    n->nkw = targets.n;
    if (!is_name(P, "in")) { perr(P, "expected 'in', got %s", tok_desc(P)); return NULL; }
    P->i++;
    if (!(n->a = parse_expr(P, 0))) return NULL;
    if (is_name(P, "if")) {
        P->i++;
        if (!(n->b = parse_expr(P, 0))) return NULL;
    }
    if (is_name(P, "recursive")) { perr(P, "unsupported construct: '%s' for loop", "recursive"); return NULL; }
    if (expect_block_end(P) || !(n->c = parse_body(P, END_FOR))) return NULL;
    if (tok_is(peek(P, 1), TK_NAME, "else")) {
        if (end_tag(P) || !(n->d = parse_body(P, END))) return NULL;
    }
    return end_tag(P) ? NULL : n;
}

static node *parse_set(parser *P, int line) {
    static const char *const END[] = {"endset", NULL};
    if (cur(P)->t != TK_NAME) { perr(P, "expected variable name after 'set', got %s", tok_desc(P)); return NULL; }
    node *n = mk(P, N_SET, line);
    if (!n || !(n->name = tok_name(P, cur(P)))) return NULL;
    P->i++;
    if (is_op(P, ".")) {
        P->i++;
        if (cur(P)->t != TK_NAME) { perr(P, "expected attribute name, got %s", tok_desc(P)); return NULL; }
        if (!(n->name2 = tok_name(P, cur(P)))) return NULL;
        P->i++;
    }
    if (is_op(P, ",")) { perr(P, "unsupported construct: %s", "tuple unpacking in 'set'"); return NULL; }
    if (cur(P)->t == TK_BLOCK_END) {
        if (n->name2) { perr(P, "%s", "block set cannot assign an attribute"); return NULL; }
        n->kind = N_SET_BLOCK;
        P->i++;
        if (!(n->a = parse_body(P, END)) || end_tag(P)) return NULL;
        return n;
    }
    if (expect_op(P, "=") || !(n->a = parse_expr(P, 1))) return NULL;
    if (is_op(P, ",")) {
        /* `set x = a, b` makes a tuple */
        nvec items = {0};
        if (nvec_push(P, &items, n->a, NULL)) return NULL;
        while (is_op(P, ",")) {
            P->i++;
            if (cur(P)->t == TK_BLOCK_END) break;
            node *x = parse_expr(P, 1);
            if (!x || nvec_push(P, &items, x, NULL)) return NULL;
        }
        node *t = mk(P, N_TUPLE, line);
        if (!t) return NULL;
        t->kids = items.v;
        t->nkids = items.n;
        n->a = t;
    }
    return expect_block_end(P) ? NULL : n;
}

static node *parse_macro(parser *P, int line) {
    static const char *const END[] = {"endmacro", NULL};
    if (cur(P)->t != TK_NAME) { perr(P, "expected macro name, got %s", tok_desc(P)); return NULL; }
    node *n = mk(P, N_MACRO, line);
    nvec params = {0};
    if (!n || !(n->name = tok_name(P, cur(P)))) return NULL;
    P->i++;
    if (expect_op(P, "(")) return NULL;
    while (!is_op(P, ")")) {
        if (params.n && expect_op(P, ",")) return NULL;
        if (cur(P)->t != TK_NAME) { perr(P, "expected parameter name, got %s", tok_desc(P)); return NULL; }
        char *pn = tok_name(P, cur(P));
        node *def = NULL;
        P->i++;
        if (is_op(P, "=")) {
            P->i++;
            if (!(def = parse_expr(P, 1))) return NULL;
        } else if (params.n && params.v[params.n - 1]) {
            perr(P, "%s", "non-default macro parameter follows default parameter");
            return NULL;
        }
        if (nvec_push(P, &params, def, pn)) return NULL;
    }
    P->i++;
    n->kw = params.names;
    n->kwv = params.v;
    n->nkw = params.n;
    if (expect_block_end(P) || !(n->a = parse_body(P, END)) || end_tag(P)) return NULL;
    return n;
}

static node *parse_statement(parser *P) {
    ct_token *kw = cur(P);
    int line = kw->line;
    if (kw->t != TK_NAME) { perr(P, "expected statement name, got %s", tok_desc(P)); return NULL; }
    P->i++;
    if (tok_is(kw, TK_NAME, "if")) return parse_if(P, line);
    if (tok_is(kw, TK_NAME, "for")) return parse_for(P, line);
    if (tok_is(kw, TK_NAME, "set")) return parse_set(P, line);
    if (tok_is(kw, TK_NAME, "macro")) return parse_macro(P, line);
    if (tok_is(kw, TK_NAME, "break") || tok_is(kw, TK_NAME, "continue")) {
        node *n = mk(P, tok_is(kw, TK_NAME, "break") ? N_BREAK : N_CONTINUE, line);
        return n && !expect_block_end(P) ? n : NULL;
    }
    if (tok_is(kw, TK_NAME, "filter")) {
        static const char *const END[] = {"endfilter", NULL};
        node *n = mk(P, N_FILTER_BLOCK, line);
        if (!n || cur(P)->t != TK_NAME) { perr(P, "expected filter name, got %s", tok_desc(P)); return NULL; }
        if (!(n->name = tok_name(P, cur(P)))) return NULL;
        if ((n->filter_id = ct_filter_id(n->name)) < 0) { perr(P, "unsupported construct: no filter named '%s'", n->name); return NULL; }
        P->i++;
        if (is_op(P, "(") && parse_args(P, n)) return NULL;
        if (expect_block_end(P) || !(n->a = parse_body(P, END)) || end_tag(P)) return NULL;
        return n;
    }
    char name[48];
    snprintf(name, sizeof name, "%.*s", (int)(kw->n > 40 ? 40 : kw->n), kw->p);
    P->i--;
    static const char *const known[] = {"include", "import", "from", "extends", "block", "call", "with",
                                        "autoescape", "do", "trans", "raw", "endraw", NULL};
    for (int k = 0; known[k]; k++)
        if (strcmp(name, known[k]) == 0) {
            char what[80];
            snprintf(what, sizeof what, "{%% %s %%}", name);
            perr(P, "unsupported construct '%s'", what);
            return NULL;
        }
    perr(P, "unknown statement '%s' (unexpected tag or missing start tag)", name);
    return NULL;
}

/* Parses statements until `{% <one of ends> ...` and stops before it (at '{%');
 * with ends == NULL, until end of input. */
static node *parse_body(parser *P, const char *const *ends) {
    if (++P->nest > MAX_NEST) { perr(P, "%s", "blocks nested too deeply"); return NULL; }
    node *body = mk(P, N_BODY, cur(P)->line);
    nvec kids = {0};
    if (!body) return NULL;
    for (;;) {
        ct_token *t = cur(P);
        if (t->t == TK_EOF) {
            if (ends) {
                char what[64];
                snprintf(what, sizeof what, "'{%% %s %%}'", ends[0] && ends[1] ? ends[1] : ends[0]);
                for (int k = 0; ends[k]; k++)
                    if (strncmp(ends[k], "end", 3) == 0) snprintf(what, sizeof what, "'{%% %s %%}'", ends[k]);
                perr(P, "unexpected end of template, missing %s", what);
                return NULL;
            }
            break;
        }
        node *s = NULL;
        if (t->t == TK_TEXT) {
            if (!(s = mk(P, N_TEXT, t->line))) return NULL;
            s->lit = tv_strn(t->str, t->str_n);
            P->i++;
        } else if (t->t == TK_VAR_BEGIN) {
            P->i++;
            if (!(s = mk(P, N_OUTPUT, t->line)) || !(s->a = parse_expr(P, 1))) return NULL;
            if (cur(P)->t != TK_VAR_END) { perr(P, "expected end of print statement '}}', got %s", tok_desc(P)); return NULL; }
            P->i++;
        } else if (t->t == TK_BLOCK_BEGIN) {
            ct_token *kw = peek(P, 1);
            if (ends && kw->t == TK_NAME)
                for (int k = 0; ends[k]; k++)
                    if (tok_is(kw, TK_NAME, ends[k])) goto done;
            if (kw->t == TK_NAME && kw->n >= 3 && (memcmp(kw->p, "end", 3) == 0 || tok_is(kw, TK_NAME, "else") ||
                                                   tok_is(kw, TK_NAME, "elif"))) {
                char name[48];
                snprintf(name, sizeof name, "%.*s", (int)(kw->n > 40 ? 40 : kw->n), kw->p);
                P->i++;
                perr(P, "unexpected '{%% %s %%}' with no matching start tag", name);
                return NULL;
            }
            P->i++;
            if (!(s = parse_statement(P))) return NULL;
        } else {
            perr(P, "unexpected %s", tok_desc(P));
            return NULL;
        }
        if (nvec_push(P, &kids, s, NULL)) return NULL;
    }
done:
    body->kids = kids.v;
    body->nkids = kids.n;
    P->nest--;
    return body;
}

int ct_parse(ct_tokens *toks, ct_arena *ar, node **out, qd_err *err) {
    parser P = {toks->v, 0, ar, err, 0};
    node *b = parse_body(&P, NULL);
    if (!b) return -1;
    *out = b;
    return 0;
}
