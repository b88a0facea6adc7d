/* The exclusion list of a quantization config, its "re:" entries compiled once
 * (quant_match.h). */
#include "io/quant_match.h"

#include <fnmatch.h>
#include <regex.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define REGEX_MAX_BYTES 1000

typedef struct quant_entry {
    const char *text;  /* as listed, "re:" included; points into the matcher's copy */
    bool is_regex;
    bool compiled;     /* re holds a compiled pattern to regfree */
    regex_t re;        /* "^(pattern)": anchored at the start only, as Python's re.match */
} quant_entry;

struct qd_quant_matcher {
    qd_quant_match how;
    int n_entries, n_blocks;
    quant_entry *entries;
    const char **blocks;  /* name prefixes, pointing into `strings` */
    char *strings;        /* the config's entries and blocks, back to back, NUL-terminated */
};

/* Whether glibc's regcomp builds the pattern in bounded memory: it copies a subtree once per
 * interval bound and again for each stacked repetition, so "a++++..." or
 * "((a{99}){99}){99}" takes gigabytes. Published exclusion lists use no stacked repetitions
 * and few, small intervals. */
static bool regex_is_tame(const char *p) {
    if (strlen(p) > REGEX_MAX_BYTES) return false;
    int intervals = 0;
    bool after_rep = false;
    for (const char *c = p; *c; c++) {
        if (*c == '\\' && c[1]) {
            c++;
            after_rep = false;
            continue;
        }
        const bool rep = *c == '*' || *c == '+' || *c == '?' || *c == '{';
        if (rep && after_rep) return false;
        if (*c == '{') {
            if (++intervals > 2) return false;
            long bound = 0;
            for (c++; *c && *c != '}'; c++) {
                if (*c >= '0' && *c <= '9') {
                    if ((bound = bound * 10 + (*c - '0')) > 16) return false;
                } else {
                    bound = 0;
                }
            }
            if (!*c) return false;
        }
        after_rep = rep;
    }
    return true;
}

/* The verdict on `pattern`; when it is OK and `keep` is not NULL, *keep holds the pattern
 * compiled as it is matched, "^(pattern)" (anchored at the start only, as Python's
 * re.match), for the caller to regfree. */
static qd_quant_regex_verdict compile_pattern(const char *pattern, regex_t *keep) {
    if (!regex_is_tame(pattern)) return QD_QUANT_REGEX_UNTAME;
    /* valid as written (a pattern only the wrapping balances, "a)(b", is none Python reads)
     * and as matched (a back-reference that compiles alone may not once wrapped, its \1
     * then naming the wrapping group) */
    regex_t scratch, *re = keep ? keep : &scratch; /* compiled in place: a regex_t is not moved */
    int rc = regcomp(re, pattern, REG_EXTENDED | REG_NOSUB);
    if (rc == 0) {
        regfree(re);
        char anchored[REGEX_MAX_BYTES + 8]; /* "^(" + pattern + ")": a tame pattern fits */
        snprintf(anchored, sizeof anchored, "^(%s)", pattern);
        rc = regcomp(re, anchored, REG_EXTENDED | REG_NOSUB);
    }
    if (rc != 0) return rc == REG_ESPACE ? QD_QUANT_REGEX_NO_MEMORY : QD_QUANT_REGEX_INVALID;
    if (!keep) regfree(re);
    return QD_QUANT_REGEX_OK;
}

qd_quant_regex_verdict qd_quant_regex_check(const char *pattern) { return compile_pattern(pattern, NULL); }

qd_status qd_quant_regex_error(qd_quant_regex_verdict v, const char *entry, qd_err *err) {
    switch (v) {
    case QD_QUANT_REGEX_OK: return QD_OK;
    case QD_QUANT_REGEX_UNTAME:
        return qd_seterr(err, QD_ERR_UNSUPPORTED, "%s is a regular expression of stacked repetitions or large "
                         "intervals, which this build does not compile", entry);
    case QD_QUANT_REGEX_NO_MEMORY: return qd_seterr(err, QD_ERR_OOM, "out of memory compiling %s", entry);
    case QD_QUANT_REGEX_INVALID: break;
    }
    return qd_seterr(err, QD_ERR_FORMAT, "%s is not a regular expression this build reads", entry);
}

/* The bytes the first n NUL-terminated strings of buf take, or size + 1 where they run past
 * the buffer (a config not made by the parser). */
static size_t strings_bytes(const char *buf, size_t size, int n) {
    size_t used = 0;
    for (int i = 0; i < n; i++) {
        const char *end = used < size ? memchr(buf + used, '\0', size - used) : NULL;
        if (!end) return size + 1;
        used = (size_t)(end - buf) + 1;
    }
    return used;
}

static qd_status compile_entry(quant_entry *e, qd_err *err) {
    const qd_quant_regex_verdict v = compile_pattern(e->text + 3, &e->re);
    e->compiled = v == QD_QUANT_REGEX_OK;
    char entry[256];
    snprintf(entry, sizeof entry, "quantization exclusion '%.200s'", e->text);
    return qd_quant_regex_error(v, entry, err);
}

static qd_status build(const qd_quant_config *q, qd_quant_matcher *mt, qd_err *err) {
    if (q->n_excluded < 0 || q->n_blocks < 0)
        return qd_seterr(err, QD_ERR_INVALID_ARG, "quantization config with a negative number of exclusions");
    const size_t excluded = strings_bytes(q->excluded, sizeof q->excluded, q->n_excluded),
                 blocks = strings_bytes(q->blocks, sizeof q->blocks, q->n_blocks);
    if (excluded > sizeof q->excluded || blocks > sizeof q->blocks)
        return qd_seterr(err, QD_ERR_INVALID_ARG, "quantization config whose exclusion or block list runs past its "
                         "buffer");
    mt->how = q->match;
    mt->strings = malloc(excluded + blocks + 1);
    mt->entries = calloc((size_t)q->n_excluded + 1, sizeof *mt->entries);
    mt->blocks = calloc((size_t)q->n_blocks + 1, sizeof *mt->blocks);
    if (!mt->strings || !mt->entries || !mt->blocks)
        return qd_seterr(err, QD_ERR_OOM, "out of memory for the quantization exclusion list");
    memcpy(mt->strings, q->excluded, excluded);
    memcpy(mt->strings + excluded, q->blocks, blocks);
    const char *p = mt->strings;
    for (int i = 0; i < q->n_excluded; i++, p += strlen(p) + 1) {
        quant_entry *e = &mt->entries[mt->n_entries++];
        e->text = p;
        e->is_regex = !strncmp(p, "re:", 3);
        if (e->is_regex) QD_TRY(compile_entry(e, err));
    }
    for (int i = 0; i < q->n_blocks; i++, p += strlen(p) + 1) mt->blocks[mt->n_blocks++] = p;
    return QD_OK;
}

qd_status qd_quant_matcher_create(const qd_quant_config *q, qd_quant_matcher **out, qd_err *err) {
    *out = NULL;
    qd_quant_matcher *mt = calloc(1, sizeof *mt);
    if (!mt) return qd_seterr(err, QD_ERR_OOM, "out of memory for the quantization exclusion list");
    const qd_status s = build(q, mt, err);
    if (s != QD_OK) {
        qd_quant_matcher_free(mt);
        return s;
    }
    *out = mt;
    return QD_OK;
}

void qd_quant_matcher_free(qd_quant_matcher *mt) {
    if (!mt) return;
    for (int i = 0; mt->entries && i < mt->n_entries; i++)
        if (mt->entries[i].compiled) regfree(&mt->entries[i].re);
    free(mt->entries);
    free(mt->blocks);
    free(mt->strings);
    free(mt);
}

static bool match_entry(const quant_entry *e, qd_quant_match how, const char *name) {
    if (e->is_regex) return regexec(&e->re, name, 0, NULL, 0) == 0;
    const char *pat = e->text;
    switch (how) {
    case QD_QUANT_MATCH_SUBSTRING: return strstr(name, pat) != NULL;
    case QD_QUANT_MATCH_WILDCARD:
        if (fnmatch(pat, name, 0) == 0) return true;
        /* "lm_head" or "*.mlp.gate" also name the module under a composite prefix */
        break;
    case QD_QUANT_MATCH_NAME: break;
    }
    const size_t n = strlen(name), m = strlen(pat);
    if (!strcmp(name, pat)) return true;
    return n > m && name[n - m - 1] == '.' && !strcmp(name + n - m, pat);
}

/* Whether `name` lies under one of the blocks (a prefix ending at a dot). */
static bool under_block(const qd_quant_matcher *mt, const char *name) {
    for (int i = 0; i < mt->n_blocks; i++) {
        const size_t n = strlen(mt->blocks[i]);
        if (!strncmp(name, mt->blocks[i], n) && name[n] == '.') return true;
    }
    return false;
}

bool qd_quant_matcher_excluded(const qd_quant_matcher *mt, const char *name) {
    if (mt->n_blocks && !under_block(mt, name)) return true;
    for (int i = 0; i < mt->n_entries; i++)
        if (match_entry(&mt->entries[i], mt->how, name)) return true;
    return false;
}
