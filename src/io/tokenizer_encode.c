/* Encoding: added-token split -> normalize -> pre-tokenize -> BPE, in the
 * order and with the piece boundaries HF `tokenizers` uses. */
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "io/tokenizer_impl.h"

/* ------------------------------------------------------------ NFC fast path */

/* A code point is "inert" when any string made only of inert code points is
 * already NFC: canonical combining class 0, not the second half of a
 * canonical composition (those could fuse with the previous char), not a
 * conjoining Hangul jamo (composed algorithmically, so utf8proc's tables do
 * not mark them), and NFC(c) == c. Most text (Latin, CJK, kana, emoji...)
 * is inert, so utf8proc's allocating normalizer only runs where it matters. */
#define TK_INERT_LIMIT 0x40000u
static uint8_t tk_inert[TK_INERT_LIMIT / 8];
static pthread_once_t tk_inert_once = PTHREAD_ONCE_INIT;

static void tk_inert_init(void) {
    for (uint32_t cp = 0; cp < TK_INERT_LIMIT; cp++) {
        int ok;
        if (cp < 0x300) ok = 1;  /* Latin-1 and friends: always NFC and never combine as second */
        else if ((cp >= 0xD800 && cp <= 0xDFFF) || (cp >= 0x1100 && cp <= 0x11FF) || (cp >= 0xA960 && cp <= 0xA97F) ||
                 (cp >= 0xD7B0 && cp <= 0xD7FF))
            ok = 0;
        else {
            const utf8proc_property_t *p = utf8proc_get_property((utf8proc_int32_t)cp);
            int second = p->comb_index != UINT16_MAX && (p->comb_index & 0x8000);
            ok = p->combining_class == 0 && !second;
            if (ok && p->decomp_seqindex != UINT16_MAX && p->decomp_type == 0) {
                /* Has a canonical decomposition: inert only if NFC recomposes it. */
                utf8proc_uint8_t u[4], *outp = NULL;
                utf8proc_ssize_t l = utf8proc_encode_char((utf8proc_int32_t)cp, u);
                utf8proc_ssize_t ol = utf8proc_map(u, l, &outp, UTF8PROC_STABLE | UTF8PROC_COMPOSE);
                ok = ol == l && outp && memcmp(outp, u, (size_t)l) == 0;
                free(outp);
            }
        }
        if (ok) tk_inert[cp >> 3] |= (uint8_t)(1u << (cp & 7));
    }
}

static int cp_inert(uint32_t cp) { return cp < TK_INERT_LIMIT && (tk_inert[cp >> 3] & (1u << (cp & 7))); }

static size_t cp_bytes(unsigned char b) { return b < 0x80 ? 1 : b < 0xE0 ? 2 : b < 0xF0 ? 3 : 4; }

/* Position of the first non-inert code point at or after i, or len. */
static size_t next_non_inert(const unsigned char *s, size_t len, size_t i) {
    while (i < len) {
        /* Skip ASCII quickly, 8 bytes at a time. */
        while (i + 8 <= len) {
            uint64_t w;
            memcpy(&w, s + i, 8);
            if (w & 0x8080808080808080ull) break;
            i += 8;
        }
        if (i >= len) break;
        if (s[i] < 0x80) { i++; continue; }
        size_t k = cp_bytes(s[i]);
        if (!cp_inert(tk_utf8_decode(s + i, len - i))) return i;
        i += k;
    }
    return len;
}

/* Stable sort of a run of combining marks by canonical combining class.
 * utf8proc's own reordering is a gnome sort, quadratic in the run length, so
 * a few hundred KB of alternating marks would take minutes; runs are sorted
 * here instead (insertion sort for the usual short runs, counting sort over
 * the 255 classes for long ones). */
static int order_marks(utf8proc_int32_t *cp, uint8_t *cc, size_t n) {
    if (n <= 16) {
        for (size_t i = 1; i < n; i++) {
            utf8proc_int32_t c = cp[i];
            uint8_t k = cc[i];
            size_t j = i;
            for (; j > 0 && cc[j - 1] > k; j--) {
                cp[j] = cp[j - 1];
                cc[j] = cc[j - 1];
            }
            cp[j] = c;
            cc[j] = k;
        }
        return 0;
    }
    size_t start[257] = {0};
    for (size_t i = 0; i < n; i++) start[cc[i] + 1]++;
    for (int k = 1; k < 257; k++) start[k] += start[k - 1];
    utf8proc_int32_t *tmp = malloc(n * sizeof *tmp);
    if (!tmp) return -1;
    for (size_t i = 0; i < n; i++) tmp[start[cc[i]]++] = cp[i];
    memcpy(cp, tmp, n * sizeof *tmp);
    free(tmp);
    for (size_t i = 0; i < n; i++) cc[i] = (uint8_t)utf8proc_get_property(cp[i])->combining_class;
    return 0;
}

/* One normalization form over valid UTF-8: decompose char by char (utf8proc),
 * reorder marks (above), compose and re-encode (utf8proc_reencode). */
static utf8proc_ssize_t norm_one(const unsigned char *s, size_t len, utf8proc_uint8_t **dst, int opts) {
    size_t cap = len + 16, n = 0;
    utf8proc_int32_t *buf = malloc((cap + 1) * sizeof *buf);
    if (!buf) return UTF8PROC_ERROR_NOMEM;
    utf8proc_option_t dopts = (utf8proc_option_t)(opts & (UTF8PROC_COMPAT | UTF8PROC_STABLE)) | UTF8PROC_DECOMPOSE;
    for (size_t i = 0; i < len;) {
        utf8proc_int32_t c;
        utf8proc_ssize_t k = utf8proc_iterate(s + i, (utf8proc_ssize_t)(len - i), &c);
        if (k <= 0) { free(buf); return UTF8PROC_ERROR_INVALIDUTF8; }
        i += (size_t)k;
        for (;;) {
            int boundclass = 0;
            utf8proc_ssize_t r = utf8proc_decompose_char(c, buf + n, (utf8proc_ssize_t)(cap - n), dopts, &boundclass);
            if (r < 0) { free(buf); return r; }
            if ((size_t)r <= cap - n) { n += (size_t)r; break; }
            size_t nc = 2 * cap + (size_t)r;
            utf8proc_int32_t *nb = realloc(buf, (nc + 1) * sizeof *buf);
            if (!nb) { free(buf); return UTF8PROC_ERROR_NOMEM; }
            buf = nb;
            cap = nc;
        }
    }
    uint8_t *cc = malloc(n + 1);
    if (!cc) { free(buf); return UTF8PROC_ERROR_NOMEM; }
    for (size_t i = 0; i < n; i++) cc[i] = (uint8_t)utf8proc_get_property(buf[i])->combining_class;
    for (size_t i = 0; i < n;) {
        if (!cc[i]) { i++; continue; }
        size_t j = i;
        while (j < n && cc[j]) j++;
        if (j - i > 1 && order_marks(buf + i, cc + i, j - i) < 0) { free(cc); free(buf); return UTF8PROC_ERROR_NOMEM; }
        i = j;
    }
    free(cc);
    /* reencode composes (with UTF8PROC_COMPOSE) and writes UTF-8 over the
     * code-point buffer, which has room for it plus a NUL. */
    utf8proc_ssize_t out = utf8proc_reencode(buf, (utf8proc_ssize_t)n, (utf8proc_option_t)(opts & (UTF8PROC_COMPOSE | UTF8PROC_STABLE)));
    if (out < 0) { free(buf); return out; }
    *dst = (utf8proc_uint8_t *)buf;
    return out;
}

/* utf8proc (2.8) composes an LV syllable with U+11A7, which is one below the
 * first trailing consonant and so not a T jamo: it swallows the U+11A7.
 * U+11A7 is a starter that composes with nothing, so normalizing the text on
 * either side of it separately gives the correct (HF, Python) result. */
static utf8proc_ssize_t norm_map(const unsigned char *s, size_t len, utf8proc_uint8_t **dst, int opts) {
    const unsigned char *cut = NULL;
    if (opts & UTF8PROC_COMPOSE)
        for (size_t i = 0; i + 2 < len; i++)
            if (s[i] == 0xE1 && s[i + 1] == 0x86 && s[i + 2] == 0xA7) { cut = s + i; break; }
    if (!cut) return norm_one(s, len, dst, opts);
    utf8proc_uint8_t *a = NULL, *b = NULL;
    size_t la = (size_t)(cut - s);
    utf8proc_ssize_t na = la ? norm_one(s, la, &a, opts) : 0;
    if (na < 0) return na;
    utf8proc_ssize_t nb = norm_map(cut + 3, len - la - 3, &b, opts);
    if (nb < 0) { free(a); return nb; }
    utf8proc_uint8_t *o = malloc((size_t)na + 3 + (size_t)nb + 1);
    if (!o) { free(a); free(b); return UTF8PROC_ERROR_NOMEM; }
    if (na) memcpy(o, a, (size_t)na);
    memcpy(o + na, cut, 3);
    if (nb) memcpy(o + na + 3, b, (size_t)nb);
    o[na + 3 + nb] = 0;
    free(a);
    free(b);
    *dst = o;
    return na + 3 + nb;
}

/* NFC touching only what can change. No composition or reordering crosses
 * the left edge of an inert code point (it has class 0 and is never the
 * second half of a pair), so NFC(x y) = NFC(x) NFC(y) whenever y starts with
 * one. Each run of non-inert code points is normalized together with the
 * inert code point before it (a possible base for its marks) up to the next
 * inert code point; everything else is copied. first = first non-inert. */
static utf8proc_ssize_t nfc_segments(const unsigned char *s, size_t len, size_t first, utf8proc_uint8_t **dst) {
    size_t cap = len + len / 2 + 16, o = 0, from = 0, i = first;
    unsigned char *out = malloc(cap);
    if (!out) return UTF8PROC_ERROR_NOMEM;
    while (i < len) {
        size_t seg = i;
        if (i > from) {  /* include the inert code point just before */
            seg = i - 1;
            while (seg > from && (s[seg] & 0xC0) == 0x80) seg--;
        }
        size_t j = i + cp_bytes(s[i]);
        while (j < len && !cp_inert(tk_utf8_decode(s + j, len - j))) j += cp_bytes(s[j]);
        utf8proc_uint8_t *n = NULL;
        utf8proc_ssize_t nl = norm_map(s + seg, j - seg, &n, UTF8PROC_STABLE | UTF8PROC_COMPOSE);
        if (nl < 0) { free(out); return nl; }
        if (o + (seg - from) + (size_t)nl + 1 > cap) {
            cap = 2 * (o + (seg - from) + (size_t)nl + 1) + len - j;
            unsigned char *p = realloc(out, cap);
            if (!p) { free(n); free(out); return UTF8PROC_ERROR_NOMEM; }
            out = p;
        }
        memcpy(out + o, s + from, seg - from);
        o += seg - from;
        memcpy(out + o, n, (size_t)nl);
        o += (size_t)nl;
        free(n);
        from = j;
        i = next_non_inert(s, len, j);
    }
    if (o + (len - from) + 1 > cap) {
        unsigned char *p = realloc(out, o + (len - from) + 1);
        if (!p) { free(out); return UTF8PROC_ERROR_NOMEM; }
        out = p;
    }
    memcpy(out + o, s + from, len - from);
    o += len - from;
    out[o] = 0;
    *dst = out;
    return (utf8proc_ssize_t)o;
}

qd_status tk_normalize(const qd_tokenizer *tok, const unsigned char *s, size_t len, unsigned char **out,
                       size_t *out_len, int *owned, qd_err *err) {
    *out = (unsigned char *)s;
    *out_len = len;
    *owned = 0;
    if (tok->n_norm == 0 || len == 0) return QD_OK;
    int ascii = 1;
    for (size_t i = 0; i < len; i++)
        if (s[i] & 0x80) { ascii = 0; break; }
    if (ascii) return QD_OK;  /* ASCII is invariant under NFC/NFD/NFKC/NFKD */
    pthread_once(&tk_inert_once, tk_inert_init);
    for (int k = 0; k < tok->n_norm; k++) {
        int opts = tok->norm_opts[k];
        utf8proc_uint8_t *dst = NULL;
        utf8proc_ssize_t n;
        if (opts == (UTF8PROC_STABLE | UTF8PROC_COMPOSE)) {
            size_t first = next_non_inert(*out, *out_len, 0);
            if (first == *out_len) continue;  /* already NFC: no copy */
            n = nfc_segments(*out, *out_len, first, &dst);
        } else {
            n = norm_map(*out, *out_len, &dst, opts);
        }
        if (n < 0) {
            if (*owned) free(*out);
            *owned = 0;
            return qd_seterr(err, n == UTF8PROC_ERROR_NOMEM ? QD_ERR_OOM : QD_ERR_INTERNAL, "normalizer: %s",
                             utf8proc_errmsg(n));
        }
        if (*owned) free(*out);
        *out = dst;
        *out_len = (size_t)n;
        *owned = 1;
    }
    return QD_OK;
}

/* ------------------------------------------------------------ word cache */

#define TK_CACHE_SLOTS (1u << 16)
#define TK_CACHE_POOL (8u << 20)
#define TK_CACHE_MAX_KEY 256

void tk_cache_free(tk_cache *c) {
    free(c->slots);
    free(c->pool);
    memset(c, 0, sizeof *c);
}

static const tk_cache_slot *cache_find(const tk_cache *c, const unsigned char *s, size_t len, uint64_t h) {
    if (!c->slots) return NULL;
    uint32_t i = (uint32_t)h & c->mask;
    for (;;) {
        const tk_cache_slot *sl = &c->slots[i];
        if (sl->hash == 0) return NULL;
        if (sl->hash == h && sl->key_len == len && memcmp(c->pool + sl->key_off, s, len) == 0) return sl;
        i = (i + 1) & c->mask;
    }
}

/* Best effort: on OOM or when full the cache is emptied, never an error. */
static void cache_put(tk_cache *c, const unsigned char *s, size_t len, uint64_t h, const int32_t *ids, size_t n) {
    if (!c->slots) {
        c->slots = calloc(TK_CACHE_SLOTS, sizeof *c->slots);
        c->pool = malloc(TK_CACHE_POOL);
        if (!c->slots || !c->pool) { tk_cache_free(c); return; }
        c->mask = TK_CACHE_SLOTS - 1;
        c->pool_cap = TK_CACHE_POOL;
    }
    size_t need = ((len + 3) & ~(size_t)3) + n * sizeof(int32_t);
    if (c->used * 4 >= TK_CACHE_SLOTS * 3 || c->pool_len + need > c->pool_cap) {
        memset(c->slots, 0, TK_CACHE_SLOTS * sizeof *c->slots);
        c->used = 0;
        c->pool_len = 0;
    }
    uint32_t i = (uint32_t)h & c->mask;
    while (c->slots[i].hash != 0) i = (i + 1) & c->mask;
    tk_cache_slot *sl = &c->slots[i];
    sl->hash = h;
    sl->key_off = (uint32_t)c->pool_len;
    sl->key_len = (uint32_t)len;
    memcpy(c->pool + c->pool_len, s, len);
    c->pool_len += (len + 3) & ~(size_t)3;
    sl->ids_off = (uint32_t)c->pool_len;
    sl->n_ids = (uint32_t)n;
    memcpy(c->pool + c->pool_len, ids, n * sizeof(int32_t));
    c->pool_len += n * sizeof(int32_t);
    c->used++;
}

/* ------------------------------------------------------------ encode state */

typedef struct enc {
    const qd_tokenizer *tok;
    qd_token_buf *buf;
    qd_err *err;
    tk_cache *cache;          /* NULL when another thread holds it */
    pcre2_match_data *md;
    /* BPE scratch, grown as needed */
    int32_t *sym_id;
    int32_t *sym_next, *sym_prev;
    uint32_t *rank_at;
    int32_t *merged_at;
    uint64_t *heap;
    size_t sym_cap;
} enc;

static qd_status push_id(enc *e, int32_t id) {
    qd_token_buf *b = e->buf;
    if (b->n == b->cap) {
        size_t cap = b->cap ? b->cap * 2 : 64;
        int32_t *p = realloc(b->ids, cap * sizeof *p);
        if (!p) return qd_seterr(e->err, QD_ERR_OOM, "out of memory growing the token buffer to %zu ids", cap);
        b->ids = p;
        b->cap = cap;
    }
    b->ids[b->n++] = id;
    return QD_OK;
}

static int merge_lookup(const qd_tokenizer *tok, int32_t a, int32_t b, uint32_t *rank, int32_t *id) {
    uint64_t key = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
    uint32_t i = (uint32_t)((key * 0x9e3779b97f4a7c15ull) >> 40) & tok->merges_mask;
    for (;;) {
        const tk_merge_slot *s = &tok->merges[i];
        if (s->key == key) { *rank = s->rank; *id = s->id; return 1; }
        if (s->key == UINT64_MAX) return 0;
        i = (i + 1) & tok->merges_mask;
    }
}

static qd_status grow_scratch(enc *e, size_t n) {
    if (n <= e->sym_cap) return QD_OK;
    size_t cap = n < 256 ? 256 : n;
    void *p[6];
    p[0] = realloc(e->sym_id, cap * sizeof(int32_t));
    if (p[0]) e->sym_id = p[0];
    p[1] = realloc(e->sym_next, cap * sizeof(int32_t));
    if (p[1]) e->sym_next = p[1];
    p[2] = realloc(e->sym_prev, cap * sizeof(int32_t));
    if (p[2]) e->sym_prev = p[2];
    p[3] = realloc(e->rank_at, cap * sizeof(uint32_t));
    if (p[3]) e->rank_at = p[3];
    p[4] = realloc(e->merged_at, cap * sizeof(int32_t));
    if (p[4]) e->merged_at = p[4];
    p[5] = realloc(e->heap, (3 * cap + 16) * sizeof(uint64_t));  /* n initial + <= 2 per merge */
    if (p[5]) e->heap = p[5];
    for (int i = 0; i < 6; i++)
        if (!p[i]) return qd_seterr(e->err, QD_ERR_OOM, "out of memory for a %zu-byte pre-token", n);
    e->sym_cap = cap;
    return QD_OK;
}

/* Rank of the pair starting at symbol i (UINT32_MAX when none). */
static void set_rank(enc *e, int32_t i) {
    int32_t j = e->sym_next[i];
    e->rank_at[i] = UINT32_MAX;
    if (j >= 0) {
        uint32_t r;
        int32_t m;
        if (merge_lookup(e->tok, e->sym_id[i], e->sym_id[j], &r, &m)) {
            e->rank_at[i] = r;
            e->merged_at[i] = m;
        }
    }
}

/* Min-heap of (rank << 32 | position): lowest rank first, leftmost on ties,
 * which is the order HF applies merges in. Stale entries are skipped when
 * rank_at no longer matches (a rank names exactly one pair). */
static void heap_push(uint64_t *h, size_t *n, uint64_t v) {
    size_t i = (*n)++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (h[p] <= v) break;
        h[i] = h[p];
        i = p;
    }
    h[i] = v;
}

static uint64_t heap_pop(uint64_t *h, size_t *n) {
    uint64_t top = h[0], v = h[--(*n)];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= *n) break;
        if (c + 1 < *n && h[c + 1] < h[c]) c++;
        if (v <= h[c]) break;
        h[i] = h[c];
        i = c;
    }
    if (*n) h[i] = v;
    return top;
}

/* Merges symbol i with its successor into merged_at[i]. */
static void merge_at(enc *e, int32_t i) {
    int32_t j = e->sym_next[i];
    e->sym_id[i] = e->merged_at[i];
    e->sym_next[i] = e->sym_next[j];
    if (e->sym_next[j] >= 0) e->sym_prev[e->sym_next[j]] = i;
    e->sym_id[j] = -1;  /* dead */
    e->rank_at[j] = UINT32_MAX;
}

/* BPE on one pre-token's raw bytes. */
static qd_status bpe_word(enc *e, const unsigned char *s, size_t len) {
    const qd_tokenizer *tok = e->tok;
    if (len == 1 && tok->byte_id[s[0]] >= 0) return push_id(e, tok->byte_id[s[0]]);
    uint64_t h = 0;
    if (e->cache && len <= TK_CACHE_MAX_KEY) {
        h = tk_hash_bytes(s, len);
        const tk_cache_slot *sl = cache_find(e->cache, s, len, h);
        if (sl) {
            const int32_t *ids = (const int32_t *)(e->cache->pool + sl->ids_off);
            for (uint32_t k = 0; k < sl->n_ids; k++) QD_TRY(push_id(e, ids[k]));
            return QD_OK;
        }
    }
    QD_TRY(grow_scratch(e, len));
    size_t start_n = e->buf->n;
    if (tok->ignore_merges) {
        /* The whole word as one vocab entry wins over merging (HF ignore_merges);
         * the vocab is keyed by byte-level spellings, so map the bytes. */
        unsigned char tmp[TK_CACHE_MAX_KEY * 2];
        if (len <= TK_CACHE_MAX_KEY) {
            size_t n = 0;
            for (size_t k = 0; k < len; k++) {
                uint32_t cp = tok->byte_cp[s[k]];  /* < 0x800: one or two UTF-8 bytes */
                if (cp < 0x80) tmp[n++] = (unsigned char)cp;
                else {
                    tmp[n++] = (unsigned char)(0xC0 | (cp >> 6));
                    tmp[n++] = (unsigned char)(0x80 | (cp & 0x3F));
                }
            }
            int32_t id = tk_lookup(tok, (const char *)tmp, n);
            if (id >= 0) {
                QD_TRY(push_id(e, id));
                goto done;
            }
        }
    }
    /* Symbols: one per byte; a byte missing from the vocab becomes unk
     * (consecutive ones fused when fuse_unk) or is dropped without unk. */
    int32_t n = 0;
    for (size_t k = 0; k < len; k++) {
        int32_t id = tok->byte_id[s[k]];
        if (id < 0) {
            if (tok->unk_id < 0) continue;
            if (tok->fuse_unk && n > 0 && e->sym_id[n - 1] == tok->unk_id) continue;
            id = tok->unk_id;
        }
        e->sym_id[n] = id;
        e->sym_prev[n] = n - 1;
        e->sym_next[n] = n + 1;
        n++;
    }
    if (n == 0) goto done;
    e->sym_next[n - 1] = -1;
    for (int32_t i = 0; i < n; i++) set_rank(e, i);
    if (n <= 64) {
        /* Short words: scanning the live list for the best pair is cheaper
         * than maintaining a heap. */
        for (;;) {
            uint32_t best = UINT32_MAX;
            int32_t bi = -1;
            for (int32_t i = 0; i >= 0; i = e->sym_next[i])
                if (e->rank_at[i] < best) { best = e->rank_at[i]; bi = i; }
            if (bi < 0) break;
            merge_at(e, bi);
            set_rank(e, bi);
            if (e->sym_prev[bi] >= 0) set_rank(e, e->sym_prev[bi]);
        }
    } else {
        size_t hn = 0;
        for (int32_t i = 0; i < n; i++)
            if (e->rank_at[i] != UINT32_MAX) heap_push(e->heap, &hn, ((uint64_t)e->rank_at[i] << 32) | (uint32_t)i);
        while (hn) {
            uint64_t top = heap_pop(e->heap, &hn);
            int32_t i = (int32_t)(uint32_t)top;
            if (e->sym_id[i] < 0 || e->rank_at[i] != (uint32_t)(top >> 32)) continue;
            merge_at(e, i);
            set_rank(e, i);
            if (e->rank_at[i] != UINT32_MAX) heap_push(e->heap, &hn, ((uint64_t)e->rank_at[i] << 32) | (uint32_t)i);
            int32_t p = e->sym_prev[i];
            if (p >= 0) {
                set_rank(e, p);
                if (e->rank_at[p] != UINT32_MAX) heap_push(e->heap, &hn, ((uint64_t)e->rank_at[p] << 32) | (uint32_t)p);
            }
        }
    }
    for (int32_t i = 0; i >= 0; i = e->sym_next[i]) QD_TRY(push_id(e, e->sym_id[i]));
done:
    if (e->cache && len <= TK_CACHE_MAX_KEY)
        cache_put(e->cache, s, len, h, e->buf->ids + start_n, e->buf->n - start_n);
    return QD_OK;
}

/* ------------------------------------------------------------ pre-tokenizers */

static qd_status pretok(enc *e, int step, const unsigned char *s, size_t len);

/* Next match of re in s at or after off; 1 with [*ms, *me), 0 when none. */
static int re_next(enc *e, pcre2_code *re, const unsigned char *s, size_t len, size_t off, size_t *ms, size_t *me,
                   qd_status *st) {
    int rc = pcre2_jit_match(re, s, len, off, 0, e->md, NULL);
    if (rc == PCRE2_ERROR_JIT_BADOPTION || rc == PCRE2_ERROR_JIT_STACKLIMIT)
        /* No JIT code, or its 32 KiB stack was too small for this input:
         * the interpreter (heap-backed) gives the same match. */
        rc = pcre2_match(re, s, len, off, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, e->md, NULL);
    if (rc == PCRE2_ERROR_NOMATCH) return 0;
    if (rc < 0) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(rc, msg, sizeof msg);
        *st = qd_seterr(e->err, QD_ERR_INTERNAL, "pre_tokenizer regex match failed: %s", (const char *)msg);
        return 0;
    }
    PCRE2_SIZE *ov = pcre2_get_ovector_pointer(e->md);
    *ms = ov[0];
    *me = ov[1];
    return 1;
}

/* Split by re, passing gaps and (unless remove) matches on to step+1. */
static qd_status split_regex(enc *e, int step, pcre2_code *re, int remove, const unsigned char *s, size_t len) {
    size_t off = 0, prev = 0, ms, me;
    qd_status st = QD_OK;
    while (off < len && re_next(e, re, s, len, off, &ms, &me, &st)) {
        if (me == ms) {
            /* Empty match: contributes no piece; step over one character. */
            off = ms + 1;
            while (off < len && (s[off] & 0xC0) == 0x80) off++;
            continue;
        }
        if (ms > prev) QD_TRY(pretok(e, step + 1, s + prev, ms - prev));
        if (!remove) QD_TRY(pretok(e, step + 1, s + ms, me - ms));
        prev = off = me;
    }
    if (st != QD_OK) return st;
    if (prev < len) QD_TRY(pretok(e, step + 1, s + prev, len - prev));
    return QD_OK;
}

static qd_status pretok(enc *e, int step, const unsigned char *s, size_t len) {
    if (len == 0) return QD_OK;  /* HF drops empty splits */
    const qd_tokenizer *tok = e->tok;
    if (step == tok->n_pre) return bpe_word(e, s, len);
    const tk_pretok *p = &tok->pre[step];
    if (p->kind == TK_PRE_BYTELEVEL) {
        if (p->add_prefix_space && s[0] != ' ') {
            unsigned char *t = malloc(len + 1);
            if (!t) return qd_seterr(e->err, QD_ERR_OOM, "out of memory");
            t[0] = ' ';
            memcpy(t + 1, s, len);
            qd_status st = p->re ? split_regex(e, step, p->re, 0, t, len + 1) : pretok(e, step + 1, t, len + 1);
            free(t);
            return st;
        }
        return p->re ? split_regex(e, step, p->re, 0, s, len) : pretok(e, step + 1, s, len);
    }
    return split_regex(e, step, p->re, p->remove_matches, s, len);
}

/* ------------------------------------------------------------ added tokens */

/* Unicode White_Space (what Rust's char::is_whitespace and regex \s use). */
static int is_ws(uint32_t c) {
    return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

/* Rust regex \w: alphabetic, marks, decimal digits, connector punctuation, joiners. */
static int is_word(uint32_t c) {
    if (c == 0x200C || c == 0x200D) return 1;
    switch (utf8proc_category((utf8proc_int32_t)c)) {
    case UTF8PROC_CATEGORY_LU: case UTF8PROC_CATEGORY_LL: case UTF8PROC_CATEGORY_LT: case UTF8PROC_CATEGORY_LM:
    case UTF8PROC_CATEGORY_LO: case UTF8PROC_CATEGORY_NL: case UTF8PROC_CATEGORY_MN: case UTF8PROC_CATEGORY_MC:
    case UTF8PROC_CATEGORY_ME: case UTF8PROC_CATEGORY_ND: case UTF8PROC_CATEGORY_PC:
        return 1;
    default:
        return 0;
    }
}

/* Start of the code point that ends at s[end-1]. */
static size_t prev_cp(const unsigned char *s, size_t end) {
    size_t i = end - 1;
    while (i > 0 && (s[i] & 0xC0) == 0x80) i--;
    return i;
}

static size_t cp_len(unsigned char b) { return b < 0x80 ? 1 : b < 0xE0 ? 2 : b < 0xF0 ? 3 : 4; }

/* Longest pattern of t starting at s[i]; returns its added[] index or -1. */
static int trie_match(const tk_trie *t, const unsigned char *s, size_t len, size_t i, size_t *mlen) {
    uint32_t node = 0;
    int best = -1;
    for (size_t k = i; k < len; k++) {
        uint32_t fe = t->first_edge[node], ne = t->n_edges[node], next = UINT32_MAX;
        for (uint32_t x = 0; x < ne; x++) {
            if (t->edge_byte[fe + x] == s[k]) { next = t->edge_to[fe + x]; break; }
            if (t->edge_byte[fe + x] > s[k]) break;
        }
        if (next == UINT32_MAX) break;
        node = next;
        if (t->term[node] >= 0) { best = t->term[node]; *mlen = k + 1 - i; }
    }
    return best;
}

static qd_status after_norm_split(enc *e, const unsigned char *s, size_t len);

/* Splits s on the added tokens of trie t (HF AddedVocabulary::find_matches:
 * non-overlapping leftmost-longest matches, single_word/lstrip/rstrip
 * applied per match); stage 0 = raw text, stage 1 = normalized text. */
static qd_status split_added(enc *e, const tk_trie *t, int stage, const unsigned char *s, size_t len) {
    const qd_tokenizer *tok = e->tok;
    size_t pos = 0, start_off = 0;
    while (!t->empty && pos < len) {
        size_t i = pos, mlen = 0;
        int hit = -1;
        for (; i < len; i++)
            if (t->first[s[i]] && (hit = trie_match(t, s, len, i, &mlen)) >= 0) break;
        if (hit < 0) break;
        const tk_added *a = &tok->added[hit];
        size_t start = i, stop = i + mlen;
        pos = stop;
        if (a->single_word) {
            size_t ps = start ? prev_cp(s, start) : 0;
            int start_ok = start == 0 || !is_word(tk_utf8_decode(s + ps, start - ps));
            int stop_ok = stop == len || !is_word(tk_utf8_decode(s + stop, len - stop));
            if (!start_ok || !stop_ok) continue;
        }
        if (a->lstrip) {
            size_t ns = start;
            while (ns > 0) {
                size_t p = prev_cp(s, ns);
                if (!is_ws(tk_utf8_decode(s + p, ns - p))) break;
                ns = p;
            }
            start = ns > start_off ? ns : start_off;
        }
        if (a->rstrip)
            while (stop < len && is_ws(tk_utf8_decode(s + stop, len - stop))) stop += cp_len(s[stop]);
        if (start_off < start) {
            if (stage == 0) QD_TRY(after_norm_split(e, s + start_off, start - start_off));
            else QD_TRY(pretok(e, 0, s + start_off, start - start_off));
        }
        QD_TRY(push_id(e, a->id));
        start_off = stop;
    }
    if (start_off < len) {
        if (stage == 0) return after_norm_split(e, s + start_off, len - start_off);
        return pretok(e, 0, s + start_off, len - start_off);
    }
    return QD_OK;
}

/* A piece of raw text between non-normalized added tokens: normalize it,
 * then split on the normalized added tokens. */
static qd_status after_norm_split(enc *e, const unsigned char *s, size_t len) {
    unsigned char *ns;
    size_t nl;
    int owned;
    QD_TRY(tk_normalize(e->tok, s, len, &ns, &nl, &owned, e->err));
    qd_status st = split_added(e, &e->tok->trie_norm, 1, ns, nl);
    if (owned) free(ns);
    return st;
}

qd_status qd_tokenizer_encode_append(const qd_tokenizer *tok, const char *text, size_t len, int add_special,
                                     qd_token_buf *buf, qd_err *err) {
    (void)add_special;
    if (!tok || !buf || (!text && len))
        return qd_seterr(err, QD_ERR_INVALID_ARG, "qd_tokenizer_encode: tokenizer, buffer or text is NULL");
    if (len == 0) return QD_OK;
    const unsigned char *s = (const unsigned char *)text;
    char *fixed = NULL;
    if (!qd_utf8_valid(s, len)) {
        size_t fl;
        fixed = qd_utf8_lossy(s, len, &fl);
        if (!fixed) return qd_seterr(err, QD_ERR_OOM, "out of memory repairing invalid UTF-8");
        s = (const unsigned char *)fixed;
        len = fl;
    }
    enc e;
    memset(&e, 0, sizeof e);
    e.tok = tok;
    e.buf = buf;
    e.err = err;
    e.md = pcre2_match_data_create(1, NULL);
    qd_tokenizer *mt = (qd_tokenizer *)tok;  /* the cache is the only mutable part, behind the mutex */
    int locked = pthread_mutex_trylock(&mt->cache_mu) == 0;
    if (locked) e.cache = &mt->cache;
    size_t n0 = buf->n;
    qd_status st = e.md ? split_added(&e, &tok->trie_raw, 0, s, len) : qd_seterr(err, QD_ERR_OOM, "out of memory");
    if (locked) pthread_mutex_unlock(&mt->cache_mu);
    if (st != QD_OK) buf->n = n0;
    pcre2_match_data_free(e.md);
    free(e.sym_id);
    free(e.sym_next);
    free(e.sym_prev);
    free(e.rank_at);
    free(e.merged_at);
    free(e.heap);
    free(fixed);
    return st;
}

qd_status qd_tokenizer_encode(const qd_tokenizer *tok, const char *text, size_t len, int add_special, int32_t **ids,
                              size_t *n, qd_err *err) {
    if (!ids || !n) return qd_seterr(err, QD_ERR_INVALID_ARG, "qd_tokenizer_encode: ids or n is NULL");
    *ids = NULL;
    *n = 0;
    qd_token_buf b = {0};
    qd_status st = qd_tokenizer_encode_append(tok, text, len, add_special, &b, err);
    if (st != QD_OK) {
        free(b.ids);
        return st;
    }
    if (b.n == 0) {
        free(b.ids);
        b.ids = NULL;
    }
    *ids = b.ids;
    *n = b.n;
    return QD_OK;
}
