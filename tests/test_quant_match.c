/* The quantization exclusion matcher (io/quant_match.h):
 *  - it answers as the per-call check it replaced (kept below, verbatim, as the oracle) for
 *    every fixture's config and hand-written ones of each matching kind (substring, name,
 *    wildcard, "re:", AutoRound blocks, GPTQModel's "-:" rules) over a table of module names;
 *  - a pattern that cannot compile is refused, naming it, by the matcher and by the config
 *    parser (the old check answered "not excluded" for every name instead);
 *  - it compiles each pattern once: regcomp is counted (this file defines it and forwards
 *    to the C library's), over 20,000 names and over whole loads, split over ranks too,
 *    whose every module is checked against the one matcher of the load. */
#include <dlfcn.h> /* RTLD_NEXT: the build defines _GNU_SOURCE */
#include <fnmatch.h>
#include <jansson.h>
#include <regex.h>
#include <string.h>

#include "io/config.h"
#include "io/quant_match.h"
#include "model/model.h"
#include "model/model_split.h"
#include "qd_test.h"
#include "qdelta.h"

/* ------------------------------------------------------------------ regcomp, counted */

static long regcomp_calls;

int regcomp(regex_t *restrict re, const char *restrict pattern, int flags) {
    static int (*real)(regex_t *, const char *, int);
    if (!real) {
        void *sym = dlsym(RTLD_NEXT, "regcomp");
        memcpy(&real, &sym, sizeof real);
    }
    regcomp_calls++;
    return real ? real(re, pattern, flags) : REG_ESPACE;
}

/* ------------------------------------------------------------------ the oracle */

/* qd_quant_excluded as it was before the matcher (src/io/config_quant.c at 83b8101): each
 * "re:" entry compiled for every name it was asked about. */
static bool old_match_entry(const char *pat, qd_quant_match how, const char *name) {
    if (!strncmp(pat, "re:", 3)) {
        /* Python's re.match: anchored at the start only */
        char anchored[1024];
        snprintf(anchored, sizeof anchored, "^(%s)", pat + 3);
        regex_t re;
        if (regcomp(&re, anchored, REG_EXTENDED | REG_NOSUB) != 0) return false;
        const bool hit = regexec(&re, name, 0, NULL, 0) == 0;
        regfree(&re);
        return hit;
    }
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

static bool old_under_block(const qd_quant_config *q, const char *name) {
    const char *p = q->blocks;
    for (int i = 0; i < q->n_blocks; i++, p += strlen(p) + 1) {
        const size_t n = strlen(p);
        if (!strncmp(name, p, n) && name[n] == '.') return true;
    }
    return false;
}

static bool old_excluded(const qd_quant_config *q, const char *name) {
    if (q->n_blocks && !old_under_block(q, name)) return true;
    const char *p = q->excluded;
    for (int i = 0; i < q->n_excluded; i++, p += strlen(p) + 1)
        if (old_match_entry(p, q->match, name)) return true;
    return false;
}

/* ------------------------------------------------------------------ helpers */

static int count_regex(const qd_quant_config *q) {
    int n = 0;
    const char *p = q->excluded;
    for (int i = 0; i < q->n_excluded; i++, p += strlen(p) + 1) n += !strncmp(p, "re:", 3);
    return n;
}

/* A config written by hand: `how`, entries and blocks NULL-terminated, as the parser lays
 * them out (no pattern checked). */
static void hand_config(qd_quant_config *q, qd_quant_match how, const char *const *entries, const char *const *blocks) {
    memset(q, 0, sizeof *q);
    q->method = QD_QUANT_FP8;
    snprintf(q->method_name, sizeof q->method_name, "hand");
    q->match = how;
    q->has_exclusions = true;
    size_t at = 0;
    for (; entries && entries[q->n_excluded]; q->n_excluded++) {
        const size_t n = strlen(entries[q->n_excluded]) + 1;
        memcpy(q->excluded + at, entries[q->n_excluded], n);
        at += n;
    }
    at = 0;
    for (; blocks && blocks[q->n_blocks]; q->n_blocks++) {
        const size_t n = strlen(blocks[q->n_blocks]) + 1;
        memcpy(q->blocks + at, blocks[q->n_blocks], n);
        at += n;
    }
}

static qd_status parse_quant(const char *json, qd_quant_config *q, qd_err *err) {
    json_error_t je;
    json_t *v = json_loads(json, 0, &je);
    if (!v) return qd_seterr(err, QD_ERR_FORMAT, "test json: %s", je.text);
    const qd_status s = qd_quant_config_parse(v, "test.json", false, q, err);
    json_decref(v);
    return s;
}

/* ------------------------------------------------------------------ names x configs */

#define MAX_NAMES 256
static const char *names[MAX_NAMES];
static char name_store[MAX_NAMES][128];
static int n_names;

static void add_name(const char *s) {
    if (n_names == MAX_NAMES) return;
    snprintf(name_store[n_names], sizeof name_store[0], "%s", s);
    names[n_names] = name_store[n_names];
    n_names++;
}

static void make_names(void) {
    static const char *const prefixes[] = {"model.layers", "model.language_model.layers", "mtp.layers"};
    static const int layers[] = {0, 1, 3, 12};
    static const char *const modules[] = {
        "linear_attn.in_proj_qkvz", "linear_attn.in_proj_qkv", "linear_attn.in_proj_a", "linear_attn.in_proj_b",
        "linear_attn.in_proj_ba", "linear_attn.out_proj", "self_attn.q_proj", "self_attn.o_proj", "mlp.gate",
        "mlp.shared_expert_gate", "mlp.shared_expert.up_proj", "mlp.experts.0.gate_proj", "mlp.experts.7.down_proj",
        "mlp.experts", "mlp.down_proj"};
    char buf[128];
    for (size_t p = 0; p < sizeof prefixes / sizeof *prefixes; p++)
        for (size_t l = 0; l < sizeof layers / sizeof *layers; l++)
            for (size_t k = 0; k < sizeof modules / sizeof *modules; k++) {
                snprintf(buf, sizeof buf, "%s.%d.%s", prefixes[p], layers[l], modules[k]);
                add_name(buf);
            }
    static const char *const odd[] = {"lm_head", "model.lm_head", "xlm_head", "lm_head_extra", "", "mtp.fc",
                                      "model.visual.blocks.0.attn.qkv", "mlp.gate", "gate", "model.layers",
                                      "model.layers.", "aa", "ab", "b"};
    for (size_t i = 0; i < sizeof odd / sizeof *odd; i++) add_name(odd[i]);
}

/* The matcher of q against the oracle on every name; unless `all` (a list that takes every
 * name), both answers must occur (a table that never excludes, or always does, says little). */
static void agree_on(const char *label, const qd_quant_config *q, bool all) {
    qd_quant_matcher *mt = NULL;
    qd_err err;
    qd_err_clear(&err);
    CHECKF(qd_quant_matcher_create(q, &mt, &err) == QD_OK, "%s: %s", label, err.msg);
    if (!mt) return;
    int excluded = 0;
    for (int i = 0; i < n_names; i++) {
        const bool got = qd_quant_matcher_excluded(mt, names[i]), want = old_excluded(q, names[i]);
        CHECKF(got == want, "%s: '%s': matcher says %d, the per-call check %d", label, names[i], got, want);
        excluded += got;
    }
    CHECKF(all ? excluded == n_names : excluded > 0 && excluded < n_names, "%s: %d of %d names excluded", label,
           excluded, n_names);
    printf("  %-28s %3d entries (%d re:), %d blocks: %3d of %d names excluded, as before\n", label, q->n_excluded,
           count_regex(q), q->n_blocks, excluded, n_names);
    qd_quant_matcher_free(mt);
}

static void agree(const char *label, const qd_quant_config *q) { agree_on(label, q, false); }

static void fixtures_agree(void) {
    static const char *const fixtures[] = {"fp8_next_moe", "fp8_35_dense_bf16s", "fp8_35_moe_f16s", "ctfp8_35_dense",
                                           "nvfp4mo_next_moe", "nvfp4ct_35_dense", "nvfp4mo_35_moe_fused",
                                           "ctint4_35_dense", "ctint4_next_moe", "ctint4c_35_moe", "llmc_next_asym16",
                                           "llmc_35moe_sym_ch", "ar_next_gptq", "ar_35moe_awq"};
    for (size_t i = 0; i < sizeof fixtures / sizeof *fixtures; i++) {
        char dir[256];
        snprintf(dir, sizeof dir, "tests/fixtures/quant/%s", fixtures[i]);
        qd_config c;
        qd_err err;
        qd_err_clear(&err);
        CHECKF(qd_config_load(dir, &c, &err) == QD_OK, "%s: %s", dir, err.msg);
        if (err.status == QD_OK) agree(fixtures[i], &c.quant);
    }
}

static void hand_configs_agree(void) {
    qd_quant_config q;
    qd_err err;
    /* every kind of matching, with "re:" entries beside plain ones */
    static const char *const mixed[] = {"lm_head", "mlp.gate", "re:.*linear_attn\\.in_proj_[ab]$", "re:a|b",
                                        "*.self_attn.*", "re:mtp\\.", "shared_expert", NULL};
    static const char *const kinds[] = {"substring", "name", "wildcard"};
    for (int how = QD_QUANT_MATCH_SUBSTRING; how <= QD_QUANT_MATCH_WILDCARD; how++) {
        char label[64];
        snprintf(label, sizeof label, "hand: %s + re:", kinds[how]);
        hand_config(&q, (qd_quant_match)how, mixed, NULL);
        agree(label, &q);
    }
    /* blocks alone (outside both: excluded), then with entries */
    static const char *const blocks[] = {"model.layers", "model.language_model.layers", NULL};
    static const char *const few[] = {"re:.*\\.mlp\\.gate$", "model.layers.0.linear_attn.in_proj_a", NULL};
    hand_config(&q, QD_QUANT_MATCH_NAME, NULL, blocks);
    agree("hand: blocks only", &q);
    hand_config(&q, QD_QUANT_MATCH_NAME, few, blocks);
    agree("hand: blocks + entries", &q);
    /* an empty pattern matches every name, as "^()" did */
    static const char *const empty[] = {"re:", NULL};
    hand_config(&q, QD_QUANT_MATCH_NAME, empty, blocks);
    agree_on("hand: empty re: + blocks", &q, true);

    /* parsed: GPTQModel's "-:" rules and an AutoRound list of names, patterns and blocks */
    qd_err_clear(&err);
    CHECKF(parse_quant("{\"quant_method\":\"gptq\",\"bits\":4,\"group_size\":128,\"sym\":true,"
                       "\"modules_to_not_convert\":[\"mlp.gate\"],\"dynamic\":{\"-:.*in_proj_[ab]$\":{},"
                       "\"-:lm_head$\":{},\"+:.*mlp\\\\..*\":{\"bits\":4}}}", &q, &err) == QD_OK, "gptq: %s", err.msg);
    if (err.status == QD_OK) agree("gptq dynamic -: rules", &q);
    qd_err_clear(&err);
    CHECKF(parse_quant("{\"quant_method\":\"auto-round\",\"packing_format\":\"auto_round:auto_gptq\",\"bits\":4,"
                       "\"group_size\":128,\"sym\":true,\"block_name_to_quantize\":\"model.language_model.layers,"
                       "mtp.layers\",\"extra_config\":{\"model.layers.0.linear_attn.in_proj_a\":{\"bits\":16},"
                       "\".*shared_expert.*\":{\"bits\":16},\"mlp\\\\.gate$\":{\"bits\":16,\"data_type\":\"fp\"}}}",
                       &q, &err) == QD_OK, "auto-round: %s", err.msg);
    if (err.status == QD_OK) agree("auto-round extra_config", &q);
}

/* ------------------------------------------------------------------ refusals */

static void refused(const char *label, const char *entry, qd_status want) {
    const char *entries[] = {"lm_head", entry, NULL};
    qd_quant_config q;
    hand_config(&q, QD_QUANT_MATCH_NAME, entries, NULL);
    qd_quant_matcher *mt = NULL;
    qd_err err;
    qd_err_clear(&err);
    const qd_status s = qd_quant_matcher_create(&q, &mt, &err);
    CHECKF(s == want && mt == NULL && strstr(err.msg, entry), "%s: status %d, '%s'", label, (int)s, err.msg);
    printf("  refused %-34s %s\n", label, err.msg);
    if (s == QD_OK) qd_quant_matcher_free(mt);
}

static void refusals(void) {
    refused("an unbalanced parenthesis", "re:model\\.(layers", QD_ERR_FORMAT);
    refused("stacked repetitions", "re:.*gate_p+++++roj", QD_ERR_UNSUPPORTED);
    refused("more than two intervals", "re:a{1}b{1}c{1}", QD_ERR_UNSUPPORTED);
    /* a back-reference compiles alone but not anchored, where \1 names the wrapping group:
     * the per-call check then answered "not excluded" for every name, silently */
    refused("a back-reference", "re:(a)\\1", QD_ERR_FORMAT);
    const char *const backref[] = {"re:(a)\\1", NULL};
    qd_quant_config q;
    hand_config(&q, QD_QUANT_MATCH_NAME, backref, NULL);
    CHECK(!old_excluded(&q, "aa"));

    /* the parser refuses what the matcher would, naming the entry */
    qd_err err;
    qd_err_clear(&err);
    const qd_status s = parse_quant("{\"quant_method\":\"compressed-tensors\",\"format\":\"float-quantized\","
                                    "\"config_groups\":{\"g\":{\"weights\":{\"num_bits\":8,\"type\":\"float\","
                                    "\"strategy\":\"channel\"}}},\"ignore\":[\"lm_head\",\"re:(a)\\\\1\"]}", &q, &err);
    CHECKF(s == QD_ERR_FORMAT && strstr(err.msg, "ignore[1]") && strstr(err.msg, "re:(a)\\1"),
           "parser, back-reference: status %d, '%s'", (int)s, err.msg);
    printf("  refused %-34s %s\n", "by the parser: a back-reference", err.msg);

    /* entries that run past their buffer (a config not made by the parser) */
    memset(&q, 0, sizeof q);
    q.match = QD_QUANT_MATCH_NAME;
    q.n_excluded = 1;
    memset(q.excluded, 'a', sizeof q.excluded);
    qd_quant_matcher *mt = NULL;
    qd_err_clear(&err);
    CHECKF(qd_quant_matcher_create(&q, &mt, &err) == QD_ERR_INVALID_ARG && !mt, "unterminated list: '%s'", err.msg);
}

/* ------------------------------------------------------------------ compiled once */

/* 20 patterns, one per layer of a set, over 20,000 expert modules: each answer is known
 * from the name's numbers, and regcomp runs when the matcher is made, never per name. */
static void many_names(void) {
    enum { N_PATTERNS = 20, N_LAYERS = 52, N_EXPERTS = 128 };
    static const char *const projs[] = {"gate_proj", "up_proj", "down_proj"};
    char store[N_PATTERNS][96];
    const char *entries[N_PATTERNS + 1];
    for (int i = 0; i < N_PATTERNS; i++) { /* layers 0, 2, 5, 7, 10, ...: every 2.5th */
        snprintf(store[i], sizeof store[i], "re:.*layers\\.%d\\.mlp\\.experts\\.[0-9]+\\.(gate|up)_proj$", i * 5 / 2);
        entries[i] = store[i];
    }
    entries[N_PATTERNS] = NULL;
    qd_quant_config q;
    hand_config(&q, QD_QUANT_MATCH_NAME, entries, NULL);
    qd_quant_matcher *mt = NULL;
    qd_err err;
    qd_err_clear(&err);
    long before = regcomp_calls;
    CHECKF(qd_quant_matcher_create(&q, &mt, &err) == QD_OK, "%s", err.msg);
    const long at_create = regcomp_calls - before;
    CHECKF(at_create >= N_PATTERNS && at_create <= 2 * N_PATTERNS, "%ld regcomp calls making the matcher of %d "
           "patterns", at_create, N_PATTERNS);
    if (!mt) return;
    int n = 0, wrong = 0, excluded = 0, sampled = 0, sample_wrong = 0;
    before = regcomp_calls;
    char name[128];
    for (int L = 0; L < N_LAYERS; L++)
        for (int e = 0; e < N_EXPERTS; e++)
            for (int p = 0; p < 3; p++) {
                snprintf(name, sizeof name, "model.language_model.layers.%d.mlp.experts.%d.%s", L, e, projs[p]);
                bool want = false;
                for (int i = 0; i < N_PATTERNS; i++) want |= L == i * 5 / 2;
                want &= p < 2;
                const bool got = qd_quant_matcher_excluded(mt, name);
                wrong += got != want;
                excluded += got;
                n++;
            }
    for (; n < 20000; n++) { /* the rest: names no pattern takes */
        snprintf(name, sizeof name, "model.layers.%d.linear_attn.in_proj_qkv", n);
        wrong += qd_quant_matcher_excluded(mt, name);
    }
    const long at_match = regcomp_calls - before;
    CHECKF(wrong == 0, "%d of %d answers wrong", wrong, n);
    CHECKF(excluded == N_PATTERNS * N_EXPERTS * 2, "%d excluded, expected %d", excluded, N_PATTERNS * N_EXPERTS * 2);
    CHECKF(at_match == 0, "%ld regcomp calls while answering %d names", at_match, n);
    /* and the oracle agrees on a sample (each of its answers compiles 20 patterns) */
    for (int L = 0; L < N_LAYERS; L += 3)
        for (int p = 0; p < 3; p++, sampled++) {
            snprintf(name, sizeof name, "model.layers.%d.mlp.experts.%d.%s", L, (L * 7) % N_EXPERTS, projs[p]);
            sample_wrong += qd_quant_matcher_excluded(mt, name) != old_excluded(&q, name);
        }
    CHECKF(sample_wrong == 0, "%d of %d sampled names answered otherwise by the per-call check", sample_wrong,
           sampled);
    printf("  %d names x %d patterns: %d excluded, regcomp %ld times making the matcher, %ld answering\n", n,
           N_PATTERNS, excluded, at_create, at_match);
    qd_quant_matcher_free(mt);
}

/* A whole load compiles each pattern a bounded number of times (the parser's check, the
 * matcher), not once per module and entry; a split load's ranks use top's matcher. */
static void loads(void) {
    static const struct {
        const char *fixture;
        int tp;
    } cases[] = {{"ctint4c_35_moe", 1}, {"ctint4c_35_moe", 2}, {"ar_35moe_awq", 1}, {"ar_next_gptq", 1},
                 {"ctfp8_35_dense", 2}};
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char dir[256], err[1024] = "";
        snprintf(dir, sizeof dir, "tests/fixtures/quant/%s", cases[i].fixture);
        qd_model_params mp = qd_model_default_params();
        mp.path = dir;
        mp.n_threads = 2;
        mp.backend = QD_BACKEND_CPU;
        mp.tensor_parallel_size = cases[i].tp;
        qd_model *m = NULL;
        const long before = regcomp_calls;
        CHECKF(qd_model_load(&mp, &m, err, sizeof err) == QD_OK, "%s tp=%d: %s", dir, cases[i].tp, err);
        const long calls = regcomp_calls - before;
        if (!m) continue;
        const int n_regex = count_regex(&m->cfg.quant);
        CHECKF(n_regex > 0, "%s: no re: entries to count", dir);
        /* the parser checks each pattern twice (as written, anchored), the matcher compiles
         * it twice (the same check, then the kept one) */
        CHECKF(calls <= 4 * n_regex, "%s tp=%d: regcomp ran %ld times for %d patterns", dir, cases[i].tp, calls,
               n_regex);
        CHECKF(m->quant_match != NULL && m->quant_match == m->quant_match_owned, "%s: the model's own matcher", dir);
        for (int r = 0; m->split && r < m->split->size; r++) {
            const qd_model *rank = m->split->ranks[r];
            CHECKF(rank->quant_match == m->quant_match && !rank->quant_match_owned,
                   "%s tp=%d: rank %d checks against a matcher of its own", dir, cases[i].tp, r);
        }
        CHECKF(!m->split == (cases[i].tp == 1), "%s tp=%d: split", dir, cases[i].tp);
        printf("  load %-22s tp=%d: %d patterns, regcomp %ld times\n", cases[i].fixture, cases[i].tp, n_regex, calls);
        qd_model_free(m);
    }
}

int main(void) {
    make_names();
    fixtures_agree();
    hand_configs_agree();
    refusals();
    many_names();
    loads();
    return qd_test_finish("test_quant_match");
}
