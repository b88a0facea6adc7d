/* Byte-level grammar matching (matcher.h). */
#include "runtime/grammar/matcher.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>

/* qd_json_plain_byte of token_trie.h (not included: the matcher stands below it) */
static int qd_json_plain_byte_(int b) { return b >= 0x20 && b <= 0x7e && b != '"' && b != '\\'; }

/* Bounds the rule expansions of one closure: a grammar with a cycle of rules that
 * consume nothing would otherwise expand for ever. */
#define MAX_EXPAND_RECURSION 200

void qd_mstate_init(qd_mstate *s) { memset(s, 0, sizeof *s); }

void qd_mstate_free(qd_mstate *s) {
    free(s->off);
    free(s->depth);
    free(s->hash);
    free(s->frames);
    free(s->seen);
    free(s->seen_gen);
    memset(s, 0, sizeof *s);
}

void qd_mstate_clear(qd_mstate *s) {
    s->n = 0;
    s->complete = 0;
    s->n_frames = 0;
    s->oom = 0;
    if (s->seen_n) {
        /* a new generation empties the table without touching it */
        if (++s->seen_now == 0) {
            memset(s->seen_gen, 0, sizeof(uint32_t) * (size_t)s->seen_cap);
            s->seen_now = 1;
        }
    }
    s->seen_n = 0;
    s->work = 0;
}

/* 1 when (stack, rule) was entered before in this expansion; records it otherwise.
 * Keys are 64-bit hashes of the stack and the rule. */
static int seen_before(qd_mstate *s, uint64_t key) {
    if (s->seen_now == 0) s->seen_now = 1;
    if (2 * (s->seen_n + 1) > s->seen_cap) {
        int nc = s->seen_cap ? 2 * s->seen_cap : 256;
        uint64_t *t = malloc(sizeof *t * (size_t)nc);
        uint32_t *tg = calloc((size_t)nc, sizeof *tg);
        if (!t || !tg) {
            free(t);
            free(tg);
            return 0;
        }
        for (int i = 0; i < s->seen_cap; i++)
            if (s->seen_gen[i] == s->seen_now)
                for (size_t h = (size_t)(s->seen[i] & (uint64_t)(nc - 1));; h = (h + 1) & (size_t)(nc - 1))
                    if (tg[h] != s->seen_now) {
                        t[h] = s->seen[i];
                        tg[h] = s->seen_now;
                        break;
                    }
        free(s->seen);
        free(s->seen_gen);
        s->seen = t;
        s->seen_gen = tg;
        s->seen_cap = nc;
    }
    for (size_t h = (size_t)(key & (uint64_t)(s->seen_cap - 1));; h = (h + 1) & (size_t)(s->seen_cap - 1)) {
        if (s->seen_gen[h] != s->seen_now) {
            s->seen[h] = key;
            s->seen_gen[h] = s->seen_now;
            s->seen_n++;
            return 0;
        }
        if (s->seen[h] == key) return 1;
    }
}

static int reserve(qd_mstate *s, int stacks, int frames) {
    if (stacks > s->cap) {
        int nc = s->cap ? s->cap * 2 : 8;
        while (nc < stacks) nc *= 2;
        int *o = realloc(s->off, sizeof(int) * (size_t)nc);
        if (o) s->off = o;
        int *d = realloc(s->depth, sizeof(int) * (size_t)nc);
        if (d) s->depth = d;
        uint64_t *h = realloc(s->hash, sizeof(uint64_t) * (size_t)nc);
        if (h) s->hash = h;
        if (!o || !d || !h) return -1;
        s->cap = nc;
    }
    if (frames > s->cap_frames) {
        int nc = s->cap_frames ? s->cap_frames * 2 : 64;
        while (nc < frames) nc *= 2;
        int32_t *f = realloc(s->frames, sizeof(int32_t) * 2 * (size_t)nc);
        if (!f) return -1;
        s->frames = f;
        s->cap_frames = nc;
    }
    return 0;
}

int qd_mstate_copy(qd_mstate *dst, const qd_mstate *src) {
    qd_mstate_clear(dst);
    if (reserve(dst, src->n, src->n_frames)) return dst->oom = 1, -1;
    dst->n = src->n;
    dst->complete = src->complete;
    dst->n_frames = src->n_frames;
    if (src->n) {
        memcpy(dst->off, src->off, sizeof(int) * (size_t)src->n);
        memcpy(dst->depth, src->depth, sizeof(int) * (size_t)src->n);
        memcpy(dst->hash, src->hash, sizeof(uint64_t) * (size_t)src->n);
    }
    if (src->n_frames) memcpy(dst->frames, src->frames, sizeof(int32_t) * 2 * (size_t)src->n_frames);
    return 0;
}

static uint64_t hash_frames(const int32_t *f, int d) {
    uint64_t h = 1469598103934665603ull ^ (uint64_t)d;
    for (int i = 0; i < 2 * d; i++) {
        h ^= (uint32_t)f[i];
        h *= 1099511628211ull;
        h ^= h >> 29;
    }
    return h;
}

static int find_stack(const qd_mstate *s, const int32_t *f, int d, uint64_t h) {
    for (int i = 0; i < s->n; i++)
        if (s->hash[i] == h && s->depth[i] == d &&
            !memcmp(s->frames + 2 * (size_t)s->off[i], f, sizeof(int32_t) * 2 * (size_t)d))
            return i;
    return -1;
}

int qd_mstate_equal(const qd_mstate *a, const qd_mstate *b) {
    if (a->n != b->n || a->complete != b->complete) return 0;
    for (int i = 0; i < a->n; i++)
        if (find_stack(b, a->frames + 2 * (size_t)a->off[i], a->depth[i], a->hash[i]) < 0) return 0;
    return 1;
}

uint64_t qd_mstate_hash(const qd_mstate *s) {
    uint64_t h = (uint64_t)s->complete * 0x9e3779b97f4a7c15ull;
    for (int i = 0; i < s->n; i++) h += s->hash[i] * 0xff51afd7ed558ccdull + (s->hash[i] >> 31);
    return h;
}

static void add_stack(qd_mstate *s, const int32_t *f, int d) {
    uint64_t h = hash_frames(f, d);
    if (find_stack(s, f, d, h) >= 0) return;
    if (s->n >= QD_MATCH_MAX_STACKS) return;
    if (reserve(s, s->n + 1, s->n_frames + d)) {
        s->oom = 1;
        return;
    }
    s->off[s->n] = s->n_frames;
    s->depth[s->n] = d;
    s->hash[s->n] = h;
    memcpy(s->frames + 2 * (size_t)s->n_frames, f, sizeof(int32_t) * 2 * (size_t)d);
    s->n_frames += d;
    s->n++;
}

/* Expands the stack f[0..d) (its top frame may stand at a rule or at the end of its
 * alternative) until every resulting stack stands at a byte class; adds those to s.
 * f is scratch: it may be overwritten. */
static void expand(const qd_grammar *g, qd_mstate *s, int32_t *f, int d, int guard) {
    if (guard > MAX_EXPAND_RECURSION) return;
    for (;;) {
        if (d == 0) {
            s->complete = 1;
            return;
        }
        int a = f[2 * (d - 1)], p = f[2 * (d - 1) + 1];
        if (p >= g->alt_len[a]) {
            d--;
            continue;
        }
        int32_t sym = g->syms[g->alt_sym0[a] + p];
        if (sym < 0) {
            add_stack(s, f, d);
            return;
        }
        /* enter rule `sym`: the caller resumes after it; a tail call pops the caller */
        f[2 * (d - 1) + 1] = p + 1;
        if (p + 1 >= g->alt_len[a]) d--;
        while (d > 0 && f[2 * (d - 1) + 1] >= g->alt_len[f[2 * (d - 1)]]) d--;
        if (d >= QD_MATCH_MAX_DEPTH || ++s->work > QD_MATCH_MAX_WORK) return;
        if (seen_before(s, hash_frames(f, d) * 0x9e3779b97f4a7c15ull + (uint64_t)sym + 1)) return;
        int n_alt = g->rule_nalt[sym], a0 = g->rule_alt0[sym];
        if (n_alt == 1) {
            f[2 * d] = g->alt_order[a0];
            f[2 * d + 1] = 0;
            d++;
            guard++;
            if (guard > MAX_EXPAND_RECURSION) return;
            continue;
        }
        int32_t tmp[2 * QD_MATCH_MAX_DEPTH];
        for (int k = 0; k < n_alt; k++) {
            memcpy(tmp, f, sizeof(int32_t) * 2 * (size_t)d);
            tmp[2 * d] = g->alt_order[a0 + k];
            tmp[2 * d + 1] = 0;
            expand(g, s, tmp, d + 1, guard + 1);
        }
        return;
    }
}

void qd_match_start(const qd_grammar *g, qd_mstate *st) {
    qd_mstate_clear(st);
    int32_t f[2 * QD_MATCH_MAX_DEPTH];
    int n_alt = g->rule_nalt[g->root], a0 = g->rule_alt0[g->root];
    for (int k = 0; k < n_alt; k++) {
        f[0] = g->alt_order[a0 + k];
        f[1] = 0;
        expand(g, st, f, 1, 0);
    }
}

int qd_match_byte(const qd_grammar *g, const qd_mstate *from, unsigned char b, qd_mstate *to) {
    qd_mstate_clear(to);
    int32_t f[2 * QD_MATCH_MAX_DEPTH];
    for (int i = 0; i < from->n; i++) {
        const int32_t *sf = from->frames + 2 * (size_t)from->off[i];
        int d = from->depth[i];
        int a = sf[2 * (d - 1)], p = sf[2 * (d - 1) + 1];
        int cls = -g->syms[g->alt_sym0[a] + p] - 1;
        if (!qd_class_has(g, cls, b)) continue;
        memcpy(f, sf, sizeof(int32_t) * 2 * (size_t)d);
        f[2 * (d - 1) + 1] = p + 1;
        expand(g, to, f, d, 0);
    }
    if (to->oom) qd_mstate_clear(to);
    return qd_mstate_alive(to);
}

int qd_match_dist(const qd_grammar *g, const qd_mstate *st) {
    if (st->complete) return 0;
    long best = INT_MAX / 2;
    for (int i = 0; i < st->n; i++) {
        const int32_t *sf = st->frames + 2 * (size_t)st->off[i];
        long len = 0;
        for (int k = 0; k < st->depth[i] && len < best; k++) {
            int a = sf[2 * k];
            for (int p = sf[2 * k + 1]; p < g->alt_len[a]; p++) {
                int32_t s = g->syms[g->alt_sym0[a] + p];
                len += s < 0 ? 1 : g->minlen[s];
            }
        }
        if (len < best) best = len;
    }
    return (int)best;
}

void qd_match_next_bytes(const qd_grammar *g, const qd_mstate *st, uint8_t bits[32]) {
    memset(bits, 0, 32);
    for (int i = 0; i < st->n; i++) {
        const int32_t *sf = st->frames + 2 * (size_t)st->off[i];
        int d = st->depth[i];
        int cls = -g->syms[g->alt_sym0[sf[2 * (d - 1)]] + sf[2 * (d - 1) + 1]] - 1;
        for (int k = 0; k < 32; k++) bits[k] |= g->classes[cls][k];
    }
}

/* A state with more stacks is not checked for groups (the check is quadratic). */
#define CHAR_GROUP_MAX_STACKS 64

/* Every byte sequence of seq q from position k on, one byte per byte group, leads
 * from st to the complete flag alone, and no proper prefix completes. */
static int utf8_exact(const qd_grammar *g, const qd_mstate *st, int q, int k, qd_mstate *tmp, int n_tmp) {
    const int len = qd_utf8_seqs[q][1][0] ? (qd_utf8_seqs[q][2][0] ? (qd_utf8_seqs[q][3][0] ? 4 : 3) : 2) : 1;
    if (k >= n_tmp) return 0;
    uint8_t seen[256] = {0};
    for (unsigned b = qd_utf8_seqs[q][k][0]; b <= qd_utf8_seqs[q][k][1]; b++) {
        const unsigned char r = g->byte_rep[b];
        if (seen[r]) continue;
        seen[r] = 1;
        qd_match_byte(g, st, r, &tmp[k]);
        if (tmp[k].oom) return 0;
        if (k + 1 == len) {
            if (!tmp[k].complete || tmp[k].n != 0) return 0;
        } else if (tmp[k].complete || !utf8_exact(g, &tmp[k], q, k + 1, tmp, n_tmp)) return 0;
    }
    return 1;
}

int qd_match_char_rule_ok(const qd_grammar *g, int rule) {
    if (rule < 0 || rule >= g->n_rules || g->rule_nalt[rule] < 1) return 0;
    const int a0 = g->rule_alt0[rule], na = g->rule_nalt[rule];
    for (int k = 0; k < na; k++) {
        const int a = g->alt_order[a0 + k];
        if (g->alt_len[a] < 1) return 0;
        for (int p = 0; p < g->alt_len[a]; p++)
            if (g->syms[g->alt_sym0[a] + p] >= 0) return 0;
    }
    qd_mstate st, tmp[4];
    qd_mstate_init(&st);
    for (int i = 0; i < 4; i++) qd_mstate_init(&tmp[i]);
    for (int k = 0; k < na; k++) {
        int32_t f[2] = {g->alt_order[a0 + k], 0};
        add_stack(&st, f, 1);
    }
    int ok = !st.oom && st.n == na;
    uint8_t seen[256] = {0};
    for (int b = 0x20; b <= 0x7e && ok; b++) {
        const unsigned char r = g->byte_rep[b];
        if (!qd_json_plain_byte_(b) || seen[r]) continue;
        seen[r] = 1;
        qd_match_byte(g, &st, r, &tmp[0]);
        ok = !tmp[0].oom && tmp[0].complete && tmp[0].n == 0;
    }
    for (size_t q = 0; q < QD_UTF8_SEQS && ok; q++) ok = utf8_exact(g, &st, (int)q, 0, tmp, 4);
    qd_mstate_free(&st);
    for (int i = 0; i < 4; i++) qd_mstate_free(&tmp[i]);
    return ok;
}

int qd_match_char_group(const qd_grammar *g, const qd_mstate *st, int rule) {
    if (st->n > CHAR_GROUP_MAX_STACKS || st->oom) return 0;
    const int a0 = g->rule_alt0[rule], na = g->rule_nalt[rule], first = g->alt_order[a0];
    int32_t f[2 * QD_MATCH_MAX_DEPTH];
    for (int i = 0; i < st->n; i++) {
        const int32_t *sf = st->frames + 2 * (size_t)st->off[i];
        const int d = st->depth[i];
        const int a = sf[2 * (d - 1)], p = sf[2 * (d - 1) + 1];
        if (g->alt_rule[a] != rule) {
            const int cls = -g->syms[g->alt_sym0[a] + p] - 1;
            for (int b = 0x20; b <= 0xf4; b++)
                if (qd_string_char_first((unsigned char)b) && qd_class_has(g, cls, (unsigned char)b)) return 0;
            continue;
        }
        if (p != 0) return 0; /* inside a character */
        /* the group of these frames below: the first alternative stands for it, and
         * the first alternative's stack checks that every other one is there */
        memcpy(f, sf, sizeof(int32_t) * 2 * (size_t)d);
        for (int k = a == first ? 1 : 0; k < (a == first ? na : 1); k++) {
            f[2 * (d - 1)] = g->alt_order[a0 + k];
            if (find_stack(st, f, d, hash_frames(f, d)) < 0) return 0;
        }
    }
    return 1;
}
