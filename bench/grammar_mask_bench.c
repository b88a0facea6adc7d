/* Token-mask time per token for constrained decoding on a real vocabulary.
 *
 *   build/grammar_mask_bench [tokenizer.json] [steps]
 *
 * Default: the Qwen3.5 vocabulary in tests/data/qwen35-tokenizer (248,077 ids). For
 * each schema (those of tests/test_structured.py), 4 random walks that pick uniformly
 * among the allowed tokens (EOS once allowed and past half the steps) until EOS or
 * `steps` tokens; times every qd_constraint_fill_mask (the trie walk or a cached mask)
 * and every qd_constraint_mask_logits (the mask applied to a logits row of the
 * vocabulary's size, what the engine does per token). Prints per schema: mean, p50,
 * p99 and max mask time, the share of cached masks, the mean time of a trie walk, and
 * the mean and p99 time of applying the mask to logits (the mask included); then the
 * p99 and max of the thread's CPU time per mask (CLOCK_THREAD_CPUTIME_ID), which
 * leaves out the time the thread was not running: on a shared machine the wall-clock
 * max is often a preemption, not the mask. */
#define _POSIX_C_SOURCE 200809L
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "io/tokenizer.h"
#include "runtime/grammar/constraint.h"
#include "runtime/grammar/json_schema.h"
#include "runtime/grammar/token_trie.h"

static double now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

static const char *const SCHEMAS[][2] = {
    {"person", "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"minLength\":1,\"maxLength\":12},"
               "\"age\":{\"type\":\"integer\",\"minimum\":0,\"maximum\":120},\"email\":{\"type\":\"string\",\"format\":\"email\"}},"
               "\"required\":[\"name\",\"age\"],\"additionalProperties\":false}"},
    {"list", "{\"type\":\"array\",\"items\":{\"type\":\"number\",\"minimum\":-10,\"maximum\":10},\"minItems\":1,\"maxItems\":4}"},
    {"enum_const", "{\"type\":\"object\",\"properties\":{\"color\":{\"enum\":[\"red\",\"green\",\"blue\"]},\"v\":{\"const\":2},"
                   "\"ok\":{\"type\":\"boolean\"}},\"required\":[\"color\",\"v\",\"ok\"]}"},
    {"nullable_anyof", "{\"type\":\"object\",\"properties\":{\"x\":{\"type\":[\"integer\",\"null\"],\"exclusiveMinimum\":0,"
                       "\"exclusiveMaximum\":50},\"y\":{\"anyOf\":[{\"type\":\"string\",\"maxLength\":5},{\"type\":\"array\","
                       "\"items\":{\"type\":\"boolean\"},\"maxItems\":2}]}},\"required\":[\"x\",\"y\"]}"},
    {"recursive", "{\"$defs\":{\"node\":{\"type\":\"object\",\"properties\":{\"v\":{\"type\":\"integer\",\"minimum\":0,\"maximum\":9},"
                  "\"kids\":{\"type\":\"array\",\"items\":{\"$ref\":\"#/$defs/node\"},\"maxItems\":2}},\"required\":[\"v\",\"kids\"]}},"
                  "\"$ref\":\"#/$defs/node\"}"},
    {"formats", "{\"type\":\"object\",\"properties\":{\"d\":{\"type\":\"string\",\"format\":\"date\"},\"t\":{\"type\":\"string\","
                "\"format\":\"date-time\"},\"u\":{\"type\":\"string\",\"format\":\"uuid\"}},\"required\":[\"d\",\"t\",\"u\"]}"},
    {"unicode_str", "{\"type\":\"object\",\"properties\":{\"s\":{\"type\":\"string\",\"minLength\":3,\"maxLength\":8}},\"required\":[\"s\"]}"},
    {"map", "{\"type\":\"object\",\"additionalProperties\":{\"type\":\"integer\",\"minimum\":-3,\"maximum\":3}}"},
    {"json_object", NULL},
};

static double cpu_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The q-quantile (0..1) of v[0..n), sorted in place. */
static double quantile(double *v, long n, double q) {
    if (n <= 0) return 0;
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    long i = (long)(q * (double)(n - 1) + 0.5);
    return v[i];
}

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static unsigned rnd(unsigned n) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (unsigned)(rng % n);
}

int main(int argc, char **argv) {
    const char *path = argc > 1 ? argv[1] : "tests/data/qwen35-tokenizer/tokenizer.json";
    int steps = argc > 2 ? atoi(argv[2]) : 200;
    qd_err err = {0};
    qd_tokenizer *tok = NULL;
    if (qd_tokenizer_load(path, &tok, &err) != QD_OK) {
        fprintf(stderr, "grammar_mask_bench: %s\n", err.msg);
        return 1;
    }
    double t0 = now_us();
    qd_token_trie *trie = NULL;
    if (qd_token_trie_build(tok, &trie, &err) != QD_OK) {
        fprintf(stderr, "grammar_mask_bench: %s\n", err.msg);
        return 1;
    }
    const int V = trie->vocab_size;
    const int32_t eos = qd_tokenizer_token_to_id(tok, "<|im_end|>");
    printf("vocabulary %s: %d ids, trie of %d nodes built in %.1f ms; eos %d\n", path, V, trie->n_nodes,
           (now_us() - t0) / 1e3, eos);
    printf("%-15s %7s %9s %8s %9s %9s %7s %9s %10s %10s %8s %8s\n", "schema", "tokens", "mean us", "p50 us", "p99 us",
           "max us", "cached", "walk us", "logits us", "logits p99", "cpu p99", "cpu max");
    enum { MAX_SAMPLES = 4 * 4096 };
    double *times = malloc(sizeof(double) * MAX_SAMPLES), *ltimes = malloc(sizeof(double) * MAX_SAMPLES);
    double *ctimes = malloc(sizeof(double) * MAX_SAMPLES);
    uint32_t *mask = malloc(sizeof(uint32_t) * ((size_t)V + 31) / 32 * 1 + 64);
    float *logits = malloc(sizeof(float) * (size_t)V);
    for (size_t si = 0; si < sizeof SCHEMAS / sizeof SCHEMAS[0]; si++) {
        double total = 0, worst = 0, logit_total = 0, cpu_worst = 0;
        long n_tok = 0, walks = 0, hits = 0;
        double walk_time = 0;
        for (int w = 0; w < 4; w++) {
            json_t *schema = SCHEMAS[si][1] ? json_loads(SCHEMAS[si][1], 0, NULL) : NULL;
            qd_grammar *g = NULL;
            if (qd_json_schema_grammar(schema, &g, &err) != QD_OK) {
                fprintf(stderr, "%s: %s\n", SCHEMAS[si][0], err.msg);
                return 1;
            }
            json_decref(schema);
            qd_constraint *c = NULL;
            qd_constraint_params cp = {.trie = trie, .grammar = g, .eos = &eos, .n_eos = 1, .start_after = -1};
            if (qd_constraint_create(&cp, &c, &err) != QD_OK) return 1;
            for (int s = 0; s < steps; s++) {
                long w0, h0;
                qd_constraint_counts(c, &w0, &h0);
                const double ca = cpu_us();
                double a = now_us();
                if (qd_constraint_fill_mask(c, steps - s, mask, &err) != QD_OK) return 1;
                double dt = now_us() - a;
                const double cdt = cpu_us() - ca;
                if (cdt > cpu_worst) cpu_worst = cdt;
                if (n_tok < MAX_SAMPLES) ctimes[n_tok] = cdt;
                long w1, h1;
                qd_constraint_counts(c, &w1, &h1);
                if (w1 > w0) walk_time += dt;
                walks += w1 - w0;
                hits += h1 - h0;
                total += dt;
                if (dt > worst) worst = dt;
                if (n_tok < MAX_SAMPLES) times[n_tok] = dt;
                for (int i = 0; i < V; i++) logits[i] = 0.0f;
                a = now_us();
                if (qd_constraint_mask_logits(c, logits, V, steps - s, &err) != QD_OK) return 1;
                const double lt = now_us() - a;
                logit_total += lt;
                if (n_tok < MAX_SAMPLES) ltimes[n_tok] = lt;
                n_tok++;
                int n_allowed = 0;
                for (int i = 0; i < V; i++) n_allowed += (mask[i >> 5] >> (i & 31)) & 1;
                if (!n_allowed) break;
                int t;
                if (((mask[eos >> 5] >> (eos & 31)) & 1) && (s > steps / 2 || rnd(4) == 0)) t = eos;
                else {
                    int pick = (int)rnd((unsigned)n_allowed);
                    for (t = 0;; t++)
                        if (((mask[t >> 5] >> (t & 31)) & 1) && pick-- == 0) break;
                }
                if (qd_constraint_accept(c, t, &err) != QD_OK) {
                    fprintf(stderr, "%s: %s\n", SCHEMAS[si][0], err.msg);
                    return 1;
                }
                if (t == eos) break;
            }
            qd_constraint_free(c);
        }
        const long ns = n_tok < MAX_SAMPLES ? n_tok : MAX_SAMPLES;
        const double p50 = quantile(times, ns, 0.5), p99 = quantile(times, ns, 0.99), lp99 = quantile(ltimes, ns, 0.99);
        const double cp99 = quantile(ctimes, ns, 0.99);
        printf("%-15s %7ld %9.1f %8.1f %9.1f %9.1f %6.0f%% %9.1f %10.1f %10.1f %8.1f %8.1f\n", SCHEMAS[si][0], n_tok,
               total / (double)n_tok, p50, p99, worst, 100.0 * (double)hits / (double)(hits + walks > 0 ? hits + walks : 1),
               walks ? walk_time / (double)walks : 0.0, logit_total / (double)n_tok, lp99, cp99, cpu_worst);
    }
    free(mask);
    free(logits);
    free(times);
    free(ltimes);
    free(ctimes);
    qd_token_trie_free(trie);
    qd_tokenizer_free(tok);
    return 0;
}
