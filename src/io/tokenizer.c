/* Loading a Hugging Face tokenizer.json into qd_tokenizer (see tokenizer.h).
 *
 * Regular tokens are stored twice: as spelled in the file (byte-level
 * alphabet, for token_to_id/id_to_token) and as the raw bytes they stand for.
 * BPE then runs directly on raw bytes: mapping every input byte to its
 * byte-level character and back is a bijection, so merging bytes gives the
 * same ids as HF merging characters, without building the mapped string. */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "io/tokenizer_impl.h"

/* GPT-2 byte <-> unicode table: printable Latin-1 bytes map to themselves, the
 * other 68 bytes to U+0100.. in byte order (so every byte gets a visible char). */
static void byte_to_cp_table(uint32_t cp_of[256]) {
    int n = 0;
    for (int b = 0; b < 256; b++) {
        int printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174);
        cp_of[b] = printable ? (uint32_t)b : (uint32_t)(256 + n++);
    }
}

uint64_t tk_hash_bytes(const void *p, size_t n) {
    /* FNV-1a then a final mix: short keys, must be cheap; the mix spreads
     * the low bits that the power-of-two tables index with. */
    const unsigned char *s = p;
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++) h = (h ^ s[i]) * 0x100000001b3ull;
    h ^= h >> 29;
    h *= 0xbf58476d1ce4e5b9ull;
    h ^= h >> 32;
    return h ? h : 1;
}

int32_t tk_lookup(const qd_tokenizer *tok, const char *s, size_t len) {
    if (!tok->str_hash) return -1;
    uint32_t i = (uint32_t)tk_hash_bytes(s, len) & tok->str_hash_mask;
    for (;;) {
        int32_t id = tok->str_hash[i];
        if (id < 0) return -1;
        const char *t = tok->str_pool + tok->str_off[id];
        if (strlen(t) == len && memcmp(t, s, len) == 0) return id;
        i = (i + 1) & tok->str_hash_mask;
    }
}

static void str_hash_put(qd_tokenizer *tok, int32_t id) {
    const char *s = tok->str_pool + tok->str_off[id];
    size_t len = strlen(s);
    uint32_t i = (uint32_t)tk_hash_bytes(s, len) & tok->str_hash_mask;
    for (;;) {
        int32_t cur = tok->str_hash[i];
        if (cur < 0) { tok->str_hash[i] = id; return; }
        const char *t = tok->str_pool + tok->str_off[cur];
        if (strcmp(t, s) == 0) { tok->str_hash[i] = id; return; }  /* added token overrides */
        i = (i + 1) & tok->str_hash_mask;
    }
}

static uint32_t pow2_at_least(size_t n) {
    uint32_t p = 16;
    while (p < n) p <<= 1;
    return p;
}

/* ------------------------------------------------------------ JSON helpers */

static const char *jstr(json_t *obj, const char *key) {
    json_t *v = json_object_get(obj, key);
    return json_is_string(v) ? json_string_value(v) : NULL;
}

static int jbool(json_t *obj, const char *key, int dflt) {
    json_t *v = json_object_get(obj, key);
    return json_is_boolean(v) ? json_is_true(v) : dflt;
}

/* ------------------------------------------------------------ components */

static qd_status parse_normalizer(qd_tokenizer *tok, json_t *n, qd_err *err) {
    if (!n || json_is_null(n)) return QD_OK;
    const char *type = jstr(n, "type");
    if (!type) return qd_seterr(err, QD_ERR_FORMAT, "normalizer has no \"type\"");
    if (strcmp(type, "Sequence") == 0) {
        json_t *list = json_object_get(n, "normalizers");
        if (!json_is_array(list)) return qd_seterr(err, QD_ERR_FORMAT, "normalizer Sequence has no \"normalizers\" array");
        size_t i;
        json_t *e;
        json_array_foreach(list, i, e) QD_TRY(parse_normalizer(tok, e, err));
        return QD_OK;
    }
    int opts;
    if (strcmp(type, "NFC") == 0) opts = UTF8PROC_STABLE | UTF8PROC_COMPOSE;
    else if (strcmp(type, "NFD") == 0) opts = UTF8PROC_STABLE | UTF8PROC_DECOMPOSE;
    else if (strcmp(type, "NFKC") == 0) opts = UTF8PROC_STABLE | UTF8PROC_COMPOSE | UTF8PROC_COMPAT;
    else if (strcmp(type, "NFKD") == 0) opts = UTF8PROC_STABLE | UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT;
    else return qd_seterr(err, QD_ERR_UNSUPPORTED, "normalizer type \"%s\" is not supported", type);
    if (tok->n_norm >= TK_MAX_STEPS) return qd_seterr(err, QD_ERR_UNSUPPORTED, "more than %d normalizers", TK_MAX_STEPS);
    tok->norm_opts[tok->n_norm++] = opts;
    return QD_OK;
}

/* HF compiles split patterns with Oniguruma, whose classes differ from
 * PCRE2's in two ways that change ids: \s is Unicode White_Space there (PCRE2
 * adds U+180E), and its Unicode tables are newer (letters, digits and marks
 * assigned since PCRE2's version are Cn to PCRE2). So \s, \S and \p{L},
 * \p{N}, \p{M} are spelled out as explicit classes before compiling. (\S
 * inside a bracket class has no union form and is left alone.) */
#define TK_WS "\\t-\\r\\x{20}\\x{85}\\x{a0}\\x{1680}\\x{2000}-\\x{200a}\\x{2028}\\x{2029}\\x{202f}\\x{205f}\\x{3000}"

static int sb_add(char **buf, size_t *n, size_t *cap, const char *s, size_t l) {
    if (*n + l + 1 > *cap) {
        size_t c = (*n + l + 1) * 2;
        char *p = realloc(*buf, c);
        if (!p) return -1;
        *buf = p;
        *cap = c;
    }
    memcpy(*buf + *n, s, l);
    *n += l;
    (*buf)[*n] = 0;
    return 0;
}

static char *rewrite_pattern(const char *pat, size_t len, size_t *out_len) {
    char *b = NULL;
    size_t n = 0, cap = 0;
    int in_class = 0, bad = 0;
#define ADD(s, l) (bad |= sb_add(&b, &n, &cap, (s), (l)))
#define ADDS(s) ADD((s), strlen(s))
    ADD("", 0);
    for (size_t i = 0; i < len; i++) {
        char c = pat[i];
        if (c == '\\' && i + 1 < len) {
            char d = pat[i + 1];
            const char *extra = NULL;
            if (d == 'p' && i + 4 < len && pat[i + 2] == '{' && pat[i + 4] == '}') {
                if (pat[i + 3] == 'L') extra = tk_unicode_extra_L;
                else if (pat[i + 3] == 'N') extra = tk_unicode_extra_N;
                else if (pat[i + 3] == 'M') extra = tk_unicode_extra_M;
            }
            if (extra) {
                if (!in_class) ADDS("[");
                ADD(pat + i, 5);
                ADDS(extra);
                if (!in_class) ADDS("]");
                i += 4;
            } else if (d == 's') {
                ADDS(in_class ? TK_WS : "[" TK_WS "]");
                i++;
            } else if (d == 'S' && !in_class) {
                ADDS("[^" TK_WS "]");
                i++;
            } else {
                ADD(pat + i, 2);
                i++;
            }
        } else if (!in_class && c == '[') {
            in_class = 1;
            ADD(pat + i, 1);
            if (i + 1 < len && pat[i + 1] == '^') ADD(pat + ++i, 1);
            if (i + 1 < len && pat[i + 1] == ']') ADD(pat + ++i, 1);  /* a leading ] is literal */
        } else if (in_class && c == '[' && i + 1 < len && pat[i + 1] == ':') {
            const char *end = strstr(pat + i, ":]");  /* POSIX [:name:] */
            size_t l = end ? (size_t)(end - (pat + i)) + 2 : 1;
            ADD(pat + i, l);
            i += l - 1;
        } else {
            if (in_class && c == ']') in_class = 0;
            ADD(pat + i, 1);
        }
    }
#undef ADD
#undef ADDS
    if (bad) { free(b); return NULL; }
    *out_len = n;
    return b;
}

static qd_status compile_re(const char *pat0, size_t len0, int literal, pcre2_code **out, qd_err *err) {
    int ec;
    PCRE2_SIZE eo;
    uint32_t opts = PCRE2_UTF | PCRE2_UCP | (literal ? PCRE2_LITERAL : 0);
    size_t len = len0;
    char *pat = literal ? NULL : rewrite_pattern(pat0, len0, &len);
    if (!literal && !pat) return qd_seterr(err, QD_ERR_OOM, "out of memory compiling the split pattern");
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)(literal ? pat0 : pat), len, opts, &ec, &eo, NULL);
    free(pat);
    if (!re) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(ec, msg, sizeof msg);
        return qd_seterr(err, QD_ERR_UNSUPPORTED, "pre_tokenizer Split pattern \"%.*s\" does not compile (offset %zu after rewriting): %s",
                         (int)len0, pat0, (size_t)eo, (const char *)msg);
    }
    /* JIT is several times faster; without it (unsupported CPU) the
     * interpreter gives the same matches. */
    (void)pcre2_jit_compile(re, PCRE2_JIT_COMPLETE);
    *out = re;
    return QD_OK;
}

/* The split regex GPT-2 used; ByteLevel applies it when use_regex is true. */
static const char GPT2_PATTERN[] = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

static qd_status parse_pretok(qd_tokenizer *tok, json_t *p, int *have_bytelevel, qd_err *err) {
    if (!p || json_is_null(p)) return QD_OK;
    const char *type = jstr(p, "type");
    if (!type) return qd_seterr(err, QD_ERR_FORMAT, "pre_tokenizer has no \"type\"");
    if (strcmp(type, "Sequence") == 0) {
        json_t *list = json_object_get(p, "pretokenizers");
        if (!json_is_array(list)) return qd_seterr(err, QD_ERR_FORMAT, "pre_tokenizer Sequence has no \"pretokenizers\" array");
        size_t i;
        json_t *e;
        json_array_foreach(list, i, e) QD_TRY(parse_pretok(tok, e, have_bytelevel, err));
        return QD_OK;
    }
    if (tok->n_pre >= TK_MAX_STEPS) return qd_seterr(err, QD_ERR_UNSUPPORTED, "more than %d pre_tokenizers", TK_MAX_STEPS);
    tk_pretok *st = &tok->pre[tok->n_pre];
    memset(st, 0, sizeof *st);
    if (strcmp(type, "Split") == 0) {
        json_t *pat = json_object_get(p, "pattern");
        const char *behavior = jstr(p, "behavior");
        if (jbool(p, "invert", 0)) return qd_seterr(err, QD_ERR_UNSUPPORTED, "pre_tokenizer Split with invert=true is not supported");
        if (!behavior) return qd_seterr(err, QD_ERR_FORMAT, "pre_tokenizer Split has no \"behavior\"");
        if (strcmp(behavior, "Removed") == 0) st->remove_matches = 1;
        else if (strcmp(behavior, "Isolated") != 0)
            return qd_seterr(err, QD_ERR_UNSUPPORTED, "pre_tokenizer Split behavior \"%s\" is not supported", behavior);
        json_t *re = json_object_get(pat, "Regex"), *lit = json_object_get(pat, "String");
        if (json_is_string(re)) QD_TRY(compile_re(json_string_value(re), json_string_length(re), 0, &st->re, err));
        else if (json_is_string(lit)) QD_TRY(compile_re(json_string_value(lit), json_string_length(lit), 1, &st->re, err));
        else return qd_seterr(err, QD_ERR_FORMAT, "pre_tokenizer Split has no \"pattern\" {\"Regex\"|\"String\": ...}");
        st->kind = TK_PRE_SPLIT;
    } else if (strcmp(type, "ByteLevel") == 0) {
        st->kind = TK_PRE_BYTELEVEL;
        st->add_prefix_space = jbool(p, "add_prefix_space", 1);
        if (jbool(p, "use_regex", 1)) QD_TRY(compile_re(GPT2_PATTERN, sizeof GPT2_PATTERN - 1, 0, &st->re, err));
        *have_bytelevel = 1;
    } else {
        return qd_seterr(err, QD_ERR_UNSUPPORTED, "pre_tokenizer type \"%s\" is not supported", type);
    }
    tok->n_pre++;
    return QD_OK;
}

static qd_status parse_decoder(json_t *d, qd_err *err) {
    if (!d || json_is_null(d)) return QD_OK;
    const char *type = jstr(d, "type");
    if (type && strcmp(type, "ByteLevel") == 0) return QD_OK;
    return qd_seterr(err, QD_ERR_UNSUPPORTED, "decoder type \"%s\" is not supported (only ByteLevel)",
                     type ? type : "(none)");
}

/* Decoded bytes of a spelling: each char through the byte-level table; a
 * spelling with a char outside that alphabet stands for its own UTF-8 bytes
 * (what HF's ByteLevel decoder does with e.g. added tokens). */
static size_t spelling_to_bytes(const char *s, const int16_t *byte_of_cp, unsigned char *dst) {
    size_t n = 0, len = strlen(s);
    const unsigned char *u = (const unsigned char *)s;
    for (size_t i = 0; i < len;) {
        utf8proc_int32_t cp;
        utf8proc_ssize_t k = utf8proc_iterate(u + i, (utf8proc_ssize_t)(len - i), &cp);
        if (k <= 0 || cp >= 512 || byte_of_cp[cp] < 0) {
            memcpy(dst, s, len);
            return len;
        }
        dst[n++] = (unsigned char)byte_of_cp[cp];
        i += (size_t)k;
    }
    return n;
}

/* ------------------------------------------------------------ model */

static qd_status add_merge(qd_tokenizer *tok, const char *a, size_t la, const char *b, size_t lb, uint32_t rank,
                           char **scratch, size_t *scratch_cap, qd_err *err) {
    int32_t ia = tk_lookup(tok, a, la), ib = tk_lookup(tok, b, lb);
    if (ia < 0 || ib < 0)
        return qd_seterr(err, QD_ERR_FORMAT, "model.merges[%u]: token \"%.*s\" is not in the vocab", rank,
                         (int)(ia < 0 ? la : lb), ia < 0 ? a : b);
    if (la + lb > *scratch_cap) {
        char *p = realloc(*scratch, la + lb);
        if (!p) return qd_seterr(err, QD_ERR_OOM, "out of memory reading merges");
        *scratch = p;
        *scratch_cap = la + lb;
    }
    memcpy(*scratch, a, la);
    memcpy(*scratch + la, b, lb);
    int32_t im = tk_lookup(tok, *scratch, la + lb);
    if (im < 0)
        return qd_seterr(err, QD_ERR_FORMAT, "model.merges[%u]: merged token \"%.*s\" is not in the vocab", rank,
                         (int)(la + lb), *scratch);
    uint64_t key = ((uint64_t)(uint32_t)ia << 32) | (uint32_t)ib;
    uint32_t i = (uint32_t)((key * 0x9e3779b97f4a7c15ull) >> 40) & tok->merges_mask;
    while (tok->merges[i].key != UINT64_MAX && tok->merges[i].key != key) i = (i + 1) & tok->merges_mask;
    if (tok->merges[i].key == UINT64_MAX) tok->n_merges++;
    /* A repeated pair keeps its last rank: HF collects merges into a map. */
    tok->merges[i].key = key;
    tok->merges[i].rank = rank;
    tok->merges[i].id = im;
    return QD_OK;
}

static qd_status parse_merges(qd_tokenizer *tok, json_t *merges, qd_err *err) {
    if (!json_is_array(merges)) return qd_seterr(err, QD_ERR_FORMAT, "model.merges is missing or not an array");
    size_t n = json_array_size(merges);
    tok->merges_mask = pow2_at_least(2 * n + 16) - 1;
    tok->merges = malloc((size_t)(tok->merges_mask + 1) * sizeof *tok->merges);
    if (!tok->merges) return qd_seterr(err, QD_ERR_OOM, "out of memory for %zu merges", n);
    for (size_t i = 0; i <= tok->merges_mask; i++) tok->merges[i].key = UINT64_MAX;
    char *scratch = NULL;
    size_t cap = 0;
    qd_status st = QD_OK;
    for (size_t r = 0; r < n && st == QD_OK; r++) {
        json_t *m = json_array_get(merges, r);
        if (json_is_string(m)) {
            const char *s = json_string_value(m);
            const char *sp = strchr(s, ' ');
            if (!sp || strchr(sp + 1, ' '))
                st = qd_seterr(err, QD_ERR_FORMAT, "model.merges[%zu] \"%s\" is not two tokens separated by one space", r, s);
            else
                st = add_merge(tok, s, (size_t)(sp - s), sp + 1, strlen(sp + 1), (uint32_t)r, &scratch, &cap, err);
        } else if (json_is_array(m) && json_array_size(m) == 2 && json_is_string(json_array_get(m, 0)) &&
                   json_is_string(json_array_get(m, 1))) {
            json_t *a = json_array_get(m, 0), *b = json_array_get(m, 1);
            st = add_merge(tok, json_string_value(a), json_string_length(a), json_string_value(b),
                           json_string_length(b), (uint32_t)r, &scratch, &cap, err);
        } else {
            st = qd_seterr(err, QD_ERR_FORMAT, "model.merges[%zu] is neither \"a b\" nor [\"a\", \"b\"]", r);
        }
    }
    free(scratch);
    return st;
}

/* Reads vocab + added_tokens into the per-id tables. */
static qd_status parse_vocab(qd_tokenizer *tok, json_t *vocab, json_t *added, qd_err *err) {
    if (!json_is_object(vocab)) return qd_seterr(err, QD_ERR_FORMAT, "model.vocab is missing or not an object");
    if (added && !json_is_array(added)) return qd_seterr(err, QD_ERR_FORMAT, "added_tokens is not an array");
    int64_t max_id = -1;
    size_t pool = 0;
    const char *key;
    json_t *val;
    json_object_foreach(vocab, key, val) {
        if (!json_is_integer(val) || json_integer_value(val) < 0 || json_integer_value(val) >= INT32_MAX / 2)
            return qd_seterr(err, QD_ERR_FORMAT, "model.vocab[\"%s\"] is not a valid id", key);
        if (json_integer_value(val) > max_id) max_id = json_integer_value(val);
        pool += strlen(key) + 1;
    }
    size_t i;
    json_t *a;
    json_array_foreach(added, i, a) {
        json_t *id = json_object_get(a, "id");
        const char *content = jstr(a, "content");
        if (!json_is_integer(id) || json_integer_value(id) < 0 || json_integer_value(id) >= INT32_MAX / 2 || !content)
            return qd_seterr(err, QD_ERR_FORMAT, "added_tokens[%zu] needs an integer \"id\" and a \"content\"", i);
        if (json_integer_value(id) > max_id) max_id = json_integer_value(id);
        pool += strlen(content) + 1;
    }
    tok->n_ids = (int32_t)(max_id + 1);
    size_t n = (size_t)tok->n_ids;
    tok->str_pool = malloc(pool + 1);
    tok->byte_pool = malloc(pool + 1);
    tok->str_off = malloc(n * sizeof *tok->str_off);
    tok->byte_off = calloc(n, sizeof *tok->byte_off);
    tok->byte_len = calloc(n, sizeof *tok->byte_len);
    tok->flags = calloc(n, 1);
    tok->str_hash_mask = pow2_at_least(2 * n + 16) - 1;
    tok->str_hash = malloc((size_t)(tok->str_hash_mask + 1) * sizeof *tok->str_hash);
    if (!tok->str_pool || !tok->byte_pool || !tok->str_off || !tok->byte_off || !tok->byte_len || !tok->flags ||
        !tok->str_hash)
        return qd_seterr(err, QD_ERR_OOM, "out of memory for a vocab of %zu tokens", n);
    memset(tok->str_off, 0xff, n * sizeof *tok->str_off);
    memset(tok->str_hash, 0xff, (size_t)(tok->str_hash_mask + 1) * sizeof *tok->str_hash);

    uint32_t cp_of[256];
    int16_t byte_of_cp[512];
    byte_to_cp_table(cp_of);
    memset(byte_of_cp, 0xff, sizeof byte_of_cp);
    for (int b = 0; b < 256; b++) byte_of_cp[cp_of[b]] = (int16_t)b;

    size_t sp = 0, bp = 0;
    json_object_foreach(vocab, key, val) {
        int32_t id = (int32_t)json_integer_value(val);
        if (tok->flags[id]) return qd_seterr(err, QD_ERR_FORMAT, "model.vocab: id %d is used twice", id);
        size_t l = strlen(key);
        memcpy(tok->str_pool + sp, key, l + 1);
        tok->str_off[id] = (uint32_t)sp;
        sp += l + 1;
        tok->byte_off[id] = (uint32_t)bp;
        tok->byte_len[id] = (uint32_t)spelling_to_bytes(key, byte_of_cp, tok->byte_pool + bp);
        bp += tok->byte_len[id];
        tok->flags[id] = TK_FLAG_PRESENT;
    }
    json_array_foreach(added, i, a) {
        int32_t id = (int32_t)json_integer_value(json_object_get(a, "id"));
        const char *content = jstr(a, "content");
        size_t l = strlen(content);
        memcpy(tok->str_pool + sp, content, l + 1);
        tok->str_off[id] = (uint32_t)sp;
        sp += l + 1;
        tok->byte_off[id] = (uint32_t)bp;
        tok->byte_len[id] = (uint32_t)spelling_to_bytes(content, byte_of_cp, tok->byte_pool + bp);
        bp += tok->byte_len[id];
        tok->flags[id] = TK_FLAG_PRESENT | TK_FLAG_ADDED | (jbool(a, "special", 0) ? TK_FLAG_SPECIAL : 0);
    }
    /* Vocab first, then added tokens, so an added token's spelling wins. */
    for (int32_t id = 0; id < tok->n_ids; id++)
        if (tok->flags[id] && !(tok->flags[id] & TK_FLAG_ADDED)) str_hash_put(tok, id);
    for (int32_t id = 0; id < tok->n_ids; id++)
        if (tok->flags[id] & TK_FLAG_ADDED) str_hash_put(tok, id);

    for (int b = 0; b < 256; b++) tok->byte_cp[b] = (uint16_t)cp_of[b];
    for (int b = 0; b < 256; b++) {
        unsigned char u[4];
        utf8proc_ssize_t l = utf8proc_encode_char((utf8proc_int32_t)cp_of[b], u);
        tok->byte_id[b] = tk_lookup(tok, (const char *)u, (size_t)l);
    }
    return QD_OK;
}

static qd_status parse_added(qd_tokenizer *tok, json_t *added, qd_err *err) {
    size_t n = json_array_size(added), pool = 0, i;
    json_t *a;
    tok->added = calloc(n ? n : 1, sizeof *tok->added);
    json_array_foreach(added, i, a) pool += 4 * strlen(jstr(a, "content")) + 16;
    tok->added_pool = malloc(pool + 1);
    if (!tok->added || !tok->added_pool) return qd_seterr(err, QD_ERR_OOM, "out of memory for added tokens");
    size_t off = 0;
    json_array_foreach(added, i, a) {
        tk_added *t = &tok->added[tok->n_added];
        const char *content = jstr(a, "content");
        t->id = (int32_t)json_integer_value(json_object_get(a, "id"));
        t->single_word = (uint8_t)jbool(a, "single_word", 0);
        t->lstrip = (uint8_t)jbool(a, "lstrip", 0);
        t->rstrip = (uint8_t)jbool(a, "rstrip", 0);
        t->special = (uint8_t)jbool(a, "special", 0);
        t->normalized = (uint8_t)jbool(a, "normalized", !t->special);
        if (t->single_word || t->lstrip || t->rstrip) tok->any_special_flags = 1;
        size_t l = strlen(content);
        if (l == 0) continue;  /* an empty pattern can never match */
        const unsigned char *pat = (const unsigned char *)content;
        unsigned char *norm = NULL;
        size_t nl = l;
        int owned = 0;
        /* Normalized tokens are searched for in normalized text, so their
         * pattern is the normalized content (as HF builds its second trie). */
        if (t->normalized) QD_TRY(tk_normalize(tok, pat, l, &norm, &nl, &owned, err));
        else norm = (unsigned char *)pat;
        if (off + nl + 1 > pool) {
            char *p = realloc(tok->added_pool, off + nl + 1);
            if (!p) { if (owned) free(norm); return qd_seterr(err, QD_ERR_OOM, "out of memory for added tokens"); }
            tok->added_pool = p;
            pool = off + nl + 1;
        }
        memcpy(tok->added_pool + off, norm, nl);
        if (owned) free(norm);
        t->off = (uint32_t)off;
        t->len = (uint32_t)nl;
        off += nl;
        tok->n_added++;
    }
    QD_TRY(tk_trie_build(&tok->trie_raw, tok->added, tok->n_added, tok->added_pool, 0, err));
    QD_TRY(tk_trie_build(&tok->trie_norm, tok->added, tok->n_added, tok->added_pool, 1, err));
    return QD_OK;
}

static qd_status parse_model(qd_tokenizer *tok, json_t *model, json_t *added, qd_err *err) {
    if (!json_is_object(model)) return qd_seterr(err, QD_ERR_FORMAT, "\"model\" is missing");
    const char *type = jstr(model, "type");
    if (type && strcmp(type, "BPE") != 0)
        return qd_seterr(err, QD_ERR_UNSUPPORTED, "model type \"%s\" is not supported (only BPE)", type);
    json_t *dropout = json_object_get(model, "dropout");
    if (json_is_number(dropout) && json_number_value(dropout) > 0.0)
        return qd_seterr(err, QD_ERR_UNSUPPORTED, "BPE dropout is not supported");
    const char *pre = jstr(model, "continuing_subword_prefix"), *suf = jstr(model, "end_of_word_suffix");
    if ((pre && *pre) || (suf && *suf))
        return qd_seterr(err, QD_ERR_UNSUPPORTED, "BPE continuing_subword_prefix/end_of_word_suffix are not supported");
    if (jbool(model, "byte_fallback", 0))
        return qd_seterr(err, QD_ERR_UNSUPPORTED, "BPE byte_fallback is not supported");
    QD_TRY(parse_vocab(tok, json_object_get(model, "vocab"), added, err));
    QD_TRY(parse_merges(tok, json_object_get(model, "merges"), err));
    tok->fuse_unk = jbool(model, "fuse_unk", 0);
    tok->ignore_merges = jbool(model, "ignore_merges", 0);
    const char *unk = jstr(model, "unk_token");
    tok->unk_id = unk ? tk_lookup(tok, unk, strlen(unk)) : -1;
    return QD_OK;
}

static qd_status load_json(qd_tokenizer *tok, json_t *root, qd_err *err) {
    json_t *added = json_object_get(root, "added_tokens");
    if (json_is_null(added)) added = NULL;
    QD_TRY(parse_normalizer(tok, json_object_get(root, "normalizer"), err));
    int have_bl = 0;
    QD_TRY(parse_pretok(tok, json_object_get(root, "pre_tokenizer"), &have_bl, err));
    if (!have_bl) return qd_seterr(err, QD_ERR_UNSUPPORTED, "pre_tokenizer has no ByteLevel step (only byte-level BPE is supported)");
    QD_TRY(parse_decoder(json_object_get(root, "decoder"), err));
    QD_TRY(parse_model(tok, json_object_get(root, "model"), added, err));
    QD_TRY(parse_added(tok, added, err));
    return QD_OK;
}

qd_status qd_tokenizer_load(const char *path, qd_tokenizer **out, qd_err *err) {
    if (!out) return qd_seterr(err, QD_ERR_INVALID_ARG, "qd_tokenizer_load: out is NULL");
    *out = NULL;
    if (!path) return qd_seterr(err, QD_ERR_INVALID_ARG, "qd_tokenizer_load: path is NULL");
    json_error_t je;
    json_t *root = json_load_file(path, 0, &je);
    if (!root) {
        /* jansson reports an unreadable file with line -1. */
        qd_status s = je.line < 0 ? QD_ERR_IO : QD_ERR_FORMAT;
        return qd_seterr(err, s, "%s: %s (line %d, column %d)", path, je.text, je.line, je.column);
    }
    qd_tokenizer *tok = calloc(1, sizeof *tok);
    if (!tok) { json_decref(root); return qd_seterr(err, QD_ERR_OOM, "out of memory"); }
    tok->eos_id = tok->pad_id = tok->unk_id = -1;
    pthread_mutex_init(&tok->cache_mu, NULL);
    qd_status st = json_is_object(root) ? load_json(tok, root, err)
                                        : qd_seterr(err, QD_ERR_FORMAT, "top level is not an object");
    json_decref(root);
    if (st != QD_OK) {
        qd_err_prefix(err, "%s", path);
        qd_tokenizer_free(tok);
        return st;
    }
    *out = tok;
    return QD_OK;
}

/* eos_token / pad_token in tokenizer_config.json: a string or {"content": ...}. */
static int32_t config_token(const qd_tokenizer *tok, json_t *cfg, const char *key) {
    json_t *v = json_object_get(cfg, key);
    const char *s = json_is_string(v) ? json_string_value(v) : json_is_object(v) ? jstr(v, "content") : NULL;
    return s ? tk_lookup(tok, s, strlen(s)) : -1;
}

qd_status qd_tokenizer_load_dir(const char *dir, qd_tokenizer **out, qd_err *err) {
    if (!out) return qd_seterr(err, QD_ERR_INVALID_ARG, "qd_tokenizer_load_dir: out is NULL");
    *out = NULL;
    if (!dir) return qd_seterr(err, QD_ERR_INVALID_ARG, "qd_tokenizer_load_dir: dir is NULL");
    size_t l = strlen(dir);
    char *path = malloc(l + 32);
    if (!path) return qd_seterr(err, QD_ERR_OOM, "out of memory");
    snprintf(path, l + 32, "%s/tokenizer.json", dir);
    qd_tokenizer *tok;
    qd_status st = qd_tokenizer_load(path, &tok, err);
    if (st == QD_OK) {
        snprintf(path, l + 32, "%s/tokenizer_config.json", dir);
        json_error_t je;
        json_t *cfg = json_load_file(path, 0, &je);
        if (cfg) {
            tok->eos_id = config_token(tok, cfg, "eos_token");
            tok->pad_id = config_token(tok, cfg, "pad_token");
            json_decref(cfg);
        } else if (je.line >= 0) {
            /* Present but malformed: say so rather than silently lose the eos. */
            st = qd_seterr(err, QD_ERR_FORMAT, "%s: %s (line %d)", path, je.text, je.line);
            qd_tokenizer_free(tok);
            tok = NULL;
        }
    }
    free(path);
    *out = tok;
    return st;
}

void qd_tokenizer_free(qd_tokenizer *tok) {
    if (!tok) return;
    free(tok->str_pool);
    free(tok->str_off);
    free(tok->byte_pool);
    free(tok->byte_off);
    free(tok->byte_len);
    free(tok->flags);
    free(tok->str_hash);
    free(tok->merges);
    for (int i = 0; i < tok->n_pre; i++) pcre2_code_free(tok->pre[i].re);
    free(tok->added);
    free(tok->added_pool);
    tk_trie_free(&tok->trie_raw);
    tk_trie_free(&tok->trie_norm);
    tk_cache_free(&tok->cache);
    pthread_mutex_destroy(&tok->cache_mu);
    free(tok);
}

/* ------------------------------------------------------------ accessors */

int32_t qd_tokenizer_vocab_size(const qd_tokenizer *tok) { return tok ? tok->n_ids : 0; }

int32_t qd_tokenizer_token_to_id(const qd_tokenizer *tok, const char *token) {
    return tok && token ? tk_lookup(tok, token, strlen(token)) : -1;
}

const char *qd_tokenizer_id_to_token(const qd_tokenizer *tok, int32_t id) {
    if (!tok || id < 0 || id >= tok->n_ids || !tok->flags[id]) return NULL;
    return tok->str_pool + tok->str_off[id];
}

int qd_tokenizer_is_special(const qd_tokenizer *tok, int32_t id) {
    return tok && id >= 0 && id < tok->n_ids && (tok->flags[id] & TK_FLAG_SPECIAL);
}

int qd_tokenizer_is_added(const qd_tokenizer *tok, int32_t id) {
    return tok && id >= 0 && id < tok->n_ids && (tok->flags[id] & TK_FLAG_ADDED);
}

int32_t qd_tokenizer_eos_id(const qd_tokenizer *tok) { return tok ? tok->eos_id : -1; }
int32_t qd_tokenizer_pad_id(const qd_tokenizer *tok) { return tok ? tok->pad_id : -1; }

const unsigned char *qd_tokenizer_token_bytes(const qd_tokenizer *tok, int32_t id, size_t *len) {
    if (!tok || id < 0 || id >= tok->n_ids || !tok->flags[id]) {
        if (len) *len = 0;
        return NULL;
    }
    if (len) *len = tok->byte_len[id];
    return tok->byte_pool + tok->byte_off[id];
}

/* ------------------------------------------------------------ added-token trie */

void tk_trie_free(tk_trie *t) {
    free(t->first_edge);
    free(t->n_edges);
    free(t->term);
    free(t->edge_byte);
    free(t->edge_to);
    memset(t, 0, sizeof *t);
}

/* Builds the trie from the patterns whose `normalized` flag equals `normalized`.
 * Built as a naive child-list trie first, then flattened so each node's edges
 * are contiguous and sorted (the matcher scans them linearly; tries here hold
 * tens to a few thousand short patterns). */
qd_status tk_trie_build(tk_trie *t, const tk_added *added, int n_added, const char *pool, int normalized,
                        qd_err *err) {
    memset(t, 0, sizeof *t);
    size_t max_nodes = 1;
    for (int i = 0; i < n_added; i++)
        if (added[i].normalized == normalized) max_nodes += added[i].len;
    /* Temporary dense child links: 256 per node would be large, so use a
     * (node, byte) -> child list scanned linearly during the build. */
    uint32_t *par = malloc(max_nodes * sizeof *par);
    uint8_t *byt = malloc(max_nodes);
    t->term = malloc(max_nodes * sizeof *t->term);
    t->first_edge = calloc(max_nodes, sizeof *t->first_edge);
    t->n_edges = calloc(max_nodes, sizeof *t->n_edges);
    t->edge_byte = malloc(max_nodes);
    t->edge_to = malloc(max_nodes * sizeof *t->edge_to);
    uint32_t *order = malloc(max_nodes * sizeof *order);
    if (!par || !byt || !t->term || !t->first_edge || !t->n_edges || !t->edge_byte || !t->edge_to || !order) {
        free(par); free(byt); free(order);
        tk_trie_free(t);
        return qd_seterr(err, QD_ERR_OOM, "out of memory building the added-token matcher");
    }
    t->n_nodes = 1;
    t->term[0] = -1;
    par[0] = UINT32_MAX;
    byt[0] = 0;
    t->empty = 1;
    for (int i = 0; i < n_added; i++) {
        if (added[i].normalized != normalized) continue;
        const unsigned char *p = (const unsigned char *)pool + added[i].off;
        uint32_t node = 0;
        for (uint32_t k = 0; k < added[i].len; k++) {
            uint32_t child = UINT32_MAX;
            for (uint32_t c = 1; c < t->n_nodes; c++)  /* O(nodes^2) build; fine for small sets */
                if (par[c] == node && byt[c] == p[k]) { child = c; break; }
            if (child == UINT32_MAX) {
                child = t->n_nodes++;
                par[child] = node;
                byt[child] = p[k];
                t->term[child] = -1;
            }
            node = child;
        }
        /* Two tokens with the same pattern: the later one wins, like HF's map. */
        t->term[node] = i;
        t->first[p[0]] = 1;
        t->empty = 0;
    }
    /* Edges sorted by (parent, byte): a counting pass per parent. */
    uint32_t ne = 0;
    for (uint32_t c = 1; c < t->n_nodes; c++) order[ne++] = c;
    for (uint32_t a = 1; a < ne; a++) {  /* insertion sort by (par, byte) */
        uint32_t x = order[a], b = a;
        while (b > 0 && (par[order[b - 1]] > par[x] || (par[order[b - 1]] == par[x] && byt[order[b - 1]] > byt[x]))) {
            order[b] = order[b - 1];
            b--;
        }
        order[b] = x;
    }
    for (uint32_t e = 0; e < ne; e++) {
        uint32_t c = order[e];
        if (t->n_edges[par[c]] == 0) t->first_edge[par[c]] = e;
        t->n_edges[par[c]]++;
        t->edge_byte[e] = byt[c];
        t->edge_to[e] = c;
    }
    free(par);
    free(byt);
    free(order);
    return QD_OK;
}
