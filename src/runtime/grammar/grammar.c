/* Grammar building and indexing (grammar.h). */
#include "runtime/grammar/grammar.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>

const uint8_t qd_utf8_seqs[QD_UTF8_SEQS][4][2] = {
    {{0xc2, 0xdf}, {0x80, 0xbf}, {0, 0}, {0, 0}},
    {{0xe0, 0xe0}, {0xa0, 0xbf}, {0x80, 0xbf}, {0, 0}},
    {{0xe1, 0xec}, {0x80, 0xbf}, {0x80, 0xbf}, {0, 0}},
    {{0xed, 0xed}, {0x80, 0x9f}, {0x80, 0xbf}, {0, 0}},
    {{0xee, 0xef}, {0x80, 0xbf}, {0x80, 0xbf}, {0, 0}},
    {{0xf0, 0xf0}, {0x90, 0xbf}, {0x80, 0xbf}, {0x80, 0xbf}},
    {{0xf1, 0xf3}, {0x80, 0xbf}, {0x80, 0xbf}, {0x80, 0xbf}},
    {{0xf4, 0xf4}, {0x80, 0x8f}, {0x80, 0xbf}, {0x80, 0xbf}},
};

#define MINLEN_INF (INT_MAX / 4)

static int grow(void **p, int *cap, int need, size_t elem) {
    if (need <= *cap) return 0;
    int nc = *cap ? *cap : 64;
    while (nc < need) nc *= 2;
    void *q = realloc(*p, (size_t)nc * elem);
    if (!q) return -1;
    *p = q;
    *cap = nc;
    return 0;
}

qd_grammar *qd_grammar_new(void) {
    qd_grammar *g = calloc(1, sizeof *g);
    if (!g) return NULL;
    if (grow((void **)&g->classes, &g->cap_classes, 256, 32)) {
        free(g);
        return NULL;
    }
    memset(g->classes, 0, 256 * 32);
    for (int b = 0; b < 256; b++) g->classes[b][b >> 3] = (uint8_t)(1u << (b & 7));
    g->n_classes = 256;
    g->root = -1;
    g->char_rule = -1;
    g->refs = 1;
    return g;
}

qd_grammar *qd_grammar_ref(qd_grammar *g) {
    if (g) __atomic_add_fetch(&g->refs, 1, __ATOMIC_RELAXED);
    return g;
}

void qd_grammar_free(qd_grammar *g) {
    if (!g || __atomic_sub_fetch(&g->refs, 1, __ATOMIC_ACQ_REL) > 0) return;
    free(g->rule_alt0);
    free(g->rule_nalt);
    free(g->alt_rule);
    free(g->alt_sym0);
    free(g->alt_len);
    free(g->alt_order);
    free(g->syms);
    free(g->classes);
    free(g->minlen);
    free(g);
}

int qd_grammar_rule(qd_grammar *g) {
    if (g->too_large || g->n_rules >= QD_GRAMMAR_MAX_RULES) {
        g->too_large = 1;
        return -1;
    }
    return g->n_rules++;
}

void qd_grammar_alt(qd_grammar *g, int r, const int32_t *syms, int n) {
    if (g->too_large || r < 0 || r >= g->n_rules) {
        g->too_large = 1;
        return;
    }
    for (int i = 0; i < n; i++)
        if (syms[i] >= g->n_rules || (syms[i] < 0 && -syms[i] - 1 >= g->n_classes)) {
            g->too_large = 1;
            return;
        }
    if (g->n_syms + n > QD_GRAMMAR_MAX_SYMS) {
        g->too_large = 1;
        return;
    }
    int cap_alt = g->cap_alts, cap2 = g->cap_alts, cap3 = g->cap_alts;
    if (grow((void **)&g->alt_rule, &cap_alt, g->n_alts + 1, sizeof(int)) ||
        grow((void **)&g->alt_sym0, &cap2, g->n_alts + 1, sizeof(int)) ||
        grow((void **)&g->alt_len, &cap3, g->n_alts + 1, sizeof(int)) ||
        grow((void **)&g->syms, &g->cap_syms, g->n_syms + n + 1, sizeof(int32_t))) {
        g->too_large = 1;
        return;
    }
    g->cap_alts = cap_alt;
    g->alt_rule[g->n_alts] = r;
    g->alt_sym0[g->n_alts] = g->n_syms;
    g->alt_len[g->n_alts] = n;
    g->n_alts++;
    if (n) memcpy(g->syms + g->n_syms, syms, sizeof(int32_t) * (size_t)n);
    g->n_syms += n;
}

int32_t qd_grammar_class(qd_grammar *g, const uint8_t bits[32]) {
    int single = -1, count = 0;
    for (int b = 0; b < 256; b++)
        if ((bits[b >> 3] >> (b & 7)) & 1) {
            single = b;
            count++;
        }
    if (count == 1) return qd_grammar_byte((unsigned char)single);
    for (int c = 256; c < g->n_classes; c++)
        if (!memcmp(g->classes[c], bits, 32)) return -(int32_t)c - 1;
    if (g->n_classes >= QD_GRAMMAR_MAX_RULES || grow((void **)&g->classes, &g->cap_classes, g->n_classes + 1, 32)) {
        g->too_large = 1;
        return qd_grammar_byte(0);
    }
    memcpy(g->classes[g->n_classes], bits, 32);
    return -(int32_t)(g->n_classes++) - 1;
}

int32_t qd_grammar_range(qd_grammar *g, unsigned lo, unsigned hi) {
    uint8_t bits[32] = {0};
    for (unsigned b = lo; b <= hi && b < 256; b++) bits[b >> 3] |= (uint8_t)(1u << (b & 7));
    return qd_grammar_class(g, bits);
}

int qd_grammar_literal(qd_grammar *g, const char *s, size_t n) {
    int r = qd_grammar_rule(g);
    if (r < 0) return -1;
    if (n > QD_GRAMMAR_MAX_SYMS) {
        g->too_large = 1;
        return -1;
    }
    int32_t *syms = malloc(sizeof(int32_t) * (n ? n : 1));
    if (!syms) {
        g->too_large = 1;
        return -1;
    }
    for (size_t i = 0; i < n; i++) syms[i] = qd_grammar_byte((unsigned char)s[i]);
    qd_grammar_alt(g, r, syms, (int)n);
    free(syms);
    return r;
}

/* byte_rep (grammar.h): the partition of the bytes refined by every class a symbol
 * uses, one class at a time. 0, or -1 when memory ran out. */
static int byte_groups(qd_grammar *g) {
    uint8_t *used = calloc((size_t)g->n_classes, 1);
    if (!used) return -1;
    for (int i = 0; i < g->n_syms; i++)
        if (g->syms[i] < 0) used[-g->syms[i] - 1] = 1;
    int part[256] = {0}, n_part = 1;
    for (int c = 0; c < g->n_classes && n_part < 256; c++) {
        if (!used[c]) continue;
        /* (group, in c) -> new group */
        int remap[512];
        for (int k = 0; k < 2 * n_part; k++) remap[k] = -1;
        int n_new = 0;
        for (int b = 0; b < 256; b++) {
            int key = 2 * part[b] + qd_class_has(g, c, (unsigned char)b);
            if (remap[key] < 0) remap[key] = n_new++;
            part[b] = remap[key];
        }
        n_part = n_new;
    }
    free(used);
    int rep[256];
    for (int k = 0; k < 256; k++) rep[k] = -1;
    for (int b = 0; b < 256; b++) {
        if (rep[part[b]] < 0) rep[part[b]] = b;
        g->byte_rep[b] = (uint8_t)rep[part[b]];
    }
    return 0;
}

qd_status qd_grammar_finish(qd_grammar *g, int root, qd_err *err) {
    if (g->too_large)
        return qd_seterr(err, QD_ERR_CAPACITY, "the grammar is too large (more than %d symbols or %d rules)",
                         QD_GRAMMAR_MAX_SYMS, QD_GRAMMAR_MAX_RULES);
    if (root < 0 || root >= g->n_rules) return qd_seterr(err, QD_ERR_INVALID_ARG, "grammar: no root rule");
    size_t nr = (size_t)g->n_rules;
    g->rule_alt0 = calloc(nr + 1, sizeof(int));
    g->rule_nalt = calloc(nr + 1, sizeof(int));
    g->alt_order = malloc(sizeof(int) * ((size_t)g->n_alts + 1));
    g->minlen = malloc(sizeof(int) * (nr + 1));
    if (!g->rule_alt0 || !g->rule_nalt || !g->alt_order || !g->minlen)
        return qd_seterr(err, QD_ERR_OOM, "out of memory indexing a grammar of %d rules", g->n_rules);
    for (int a = 0; a < g->n_alts; a++) g->rule_nalt[g->alt_rule[a]]++;
    for (int r = 1; r < g->n_rules; r++) g->rule_alt0[r] = g->rule_alt0[r - 1] + g->rule_nalt[r - 1];
    int *fill = calloc(nr + 1, sizeof(int));
    if (!fill) return qd_seterr(err, QD_ERR_OOM, "out of memory indexing a grammar");
    for (int a = 0; a < g->n_alts; a++) {
        int r = g->alt_rule[a];
        g->alt_order[g->rule_alt0[r] + fill[r]++] = a;
    }
    free(fill);
    /* shortest expansions: a fixed point from "infinite" down */
    for (int r = 0; r < g->n_rules; r++) g->minlen[r] = MINLEN_INF;
    for (int changed = 1; changed;) {
        changed = 0;
        for (int a = 0; a < g->n_alts; a++) {
            long len = 0;
            for (int i = 0; i < g->alt_len[a] && len < MINLEN_INF; i++) {
                int32_t s = g->syms[g->alt_sym0[a] + i];
                len += s < 0 ? 1 : g->minlen[s];
            }
            int r = g->alt_rule[a];
            if (len < g->minlen[r]) {
                g->minlen[r] = (int)len;
                changed = 1;
            }
        }
    }
    if (byte_groups(g)) return qd_seterr(err, QD_ERR_OOM, "out of memory indexing a grammar");
    if (g->minlen[root] >= MINLEN_INF)
        return qd_seterr(err, QD_ERR_INVALID_ARG, "grammar: the schema admits no finite value");
    g->root = root;
    g->finished = 1;
    return QD_OK;
}
