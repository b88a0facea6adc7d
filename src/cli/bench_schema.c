/* qdelta bench --json-schema FILE: decode tok/s through the serving engine for B
 * concurrent greedy requests, without a constraint and with the schema's grammar on
 * every request (the token mask put on each logits row and the kept token advancing
 * the grammar, as the server does), and a check that every constrained output is
 * JSON. Any model will do, dummy weights included: the mask decides which tokens
 * the argmax may pick, so the output follows the grammar whatever the logits. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/bench_spec.h"
#include "cli/common.h"
#include "io/tokenizer.h"
#include "runtime/grammar/constraint.h"
#include "runtime/grammar/json_schema.h"
#include "runtime/grammar/token_trie.h"

/* 1 when request i's tokens (EOS left out) are one JSON value. */
static int output_parses(const qd_token_trie *t, const int32_t *ids, int n, const int32_t *eos, int n_eos) {
    size_t len = 0, cap = 256;
    char *text = malloc(cap);
    if (!text) return 0;
    for (int k = 0; k < n; k++) {
        int skip = ids[k] < 0 || ids[k] >= t->vocab_size || t->tok_len[ids[k]] < 0;
        for (int e = 0; e < n_eos; e++) skip |= ids[k] == eos[e];
        if (skip) continue;
        const size_t l = (size_t)t->tok_len[ids[k]];
        if (len + l + 1 > cap) {
            while (len + l + 1 > cap) cap *= 2;
            char *p = realloc(text, cap);
            if (!p) {
                free(text);
                return 0;
            }
            text = p;
        }
        memcpy(text + len, t->blob + t->tok_off[ids[k]], l);
        len += l;
    }
    json_t *v = json_loadb(text, len, JSON_DECODE_ANY, NULL);
    free(text);
    const int ok = v != NULL;
    json_decref(v);
    return ok;
}

int cli_bench_schema_run(qd_model *m, const char *model_dir, const char *tok_dir, const char *schema_path,
                         const cli_bench_spec *b) {
    const int V = qd_model_vocab_size(m);
    qd_err err = {0};
    json_error_t jerr;
    json_t *schema = json_load_file(schema_path, 0, &jerr);
    if (!schema) {
        fprintf(stderr, "qdelta bench: --json-schema %s: %s (line %d)\n", schema_path, jerr.text, jerr.line);
        return -1;
    }
    const char *path = tok_dir ? tok_dir : model_dir;
    qd_tokenizer *tok = NULL;
    qd_token_trie *trie = NULL;
    qd_constraint **cons = calloc((size_t)b->batch, sizeof *cons);
    int32_t *prompts = malloc(sizeof(int32_t) * (size_t)b->batch * (size_t)b->context);
    int32_t *outs = malloc(sizeof(int32_t) * (size_t)b->batch * (size_t)b->n_decode);
    int *n_out = calloc((size_t)b->batch, sizeof(int));
    int rc = -1;
    if (!cons || !prompts || !outs || !n_out) {
        fprintf(stderr, "qdelta bench: out of memory\n");
        goto done;
    }
    if (qd_tokenizer_load_dir(path, &tok, &err) != QD_OK) {
        fprintf(stderr, "qdelta bench: --json-schema needs the model's tokenizer: %s%s\n", err.msg,
                tok_dir ? "" : " (a directory of config.json alone, e.g. bench/configs/*: give --tokenizer DIR)");
        goto done;
    }
    if (qd_token_trie_build(tok, &trie, &err) != QD_OK) {
        fprintf(stderr, "qdelta bench: %s\n", err.msg);
        goto done;
    }
    if (trie->vocab_size > V) {
        fprintf(stderr, "qdelta bench: the tokenizer %s has %d ids, more than the model's %d logits\n", path,
                trie->vocab_size, V);
        goto done;
    }
    const int32_t *eos = NULL;
    const int n_eos = qd_model_eos_ids(m, &eos);
    for (int i = 0; i < b->batch; i++) {
        qd_grammar *g = NULL;
        if (qd_json_schema_grammar(schema, &g, &err) != QD_OK) {
            fprintf(stderr, "qdelta bench: --json-schema %s: %s\n", schema_path, err.msg);
            goto done;
        }
        qd_constraint_params cp = {.trie = trie, .grammar = g, .eos = eos, .n_eos = n_eos, .start_after = -1};
        if (qd_constraint_create(&cp, &cons[i], &err) != QD_OK) {
            fprintf(stderr, "qdelta bench: %s\n", err.msg);
            goto done;
        }
    }
    cli_bench_prompts(b, V, prompts);
    double t_plain = 0, t_schema = 0, f_plain = 0, f_schema = 0;
    qd_engine_stats st;
    if (cli_bench_engine_run(m, b, 0, prompts, outs, NULL, NULL, &t_plain, &f_plain, &st) ||
        cli_bench_engine_run(m, b, 0, prompts, outs, cons, n_out, &t_schema, &f_schema, &st))
        goto done;
    int parsed = 0;
    long tokens = 0;
    for (int i = 0; i < b->batch; i++) {
        parsed += output_parses(trie, outs + (size_t)i * b->n_decode, n_out[i], eos, n_eos);
        tokens += n_out[i];
    }
    printf("engine decode batch %d, up to %d tokens after %d-token prompts: %.1f tok/s without a schema, %.1f tok/s "
           "with %s (x%.2f); constrained outputs: %ld tokens, %d of %d parse as JSON\n",
           b->batch, b->n_decode, b->context, t_plain, t_schema, schema_path, t_plain > 0 ? t_schema / t_plain : 0,
           tokens, parsed, b->batch);
    /* the constrained requests end when their JSON is complete, each at its own step: the
     * rate while all B decode compares steps of the same batch size */
    printf("  while all %d requests decode: %.1f tok/s without a schema, %.1f tok/s with it (x%.2f)\n", b->batch, f_plain,
           f_schema, f_plain > 0 ? f_schema / f_plain : 0);
    printf("RESULT schema_decode B=%d ctx=%d tok_s_plain=%.2f tok_s_schema=%.2f tokens_schema=%ld parsed=%d "
           "tok_s_plain_all=%.2f tok_s_schema_all=%.2f\n",
           b->batch, b->context, t_plain, t_schema, tokens, parsed, f_plain, f_schema);
    rc = parsed == b->batch ? 0 : -1;
    if (rc) fprintf(stderr, "qdelta bench: %d constrained outputs are not JSON\n", b->batch - parsed);
done:
    for (int i = 0; cons && i < b->batch; i++) qd_constraint_free(cons[i]);
    free(cons);
    free(prompts);
    free(outs);
    free(n_out);
    qd_token_trie_free(trie);
    qd_tokenizer_free(tok);
    json_decref(schema);
    return rc;
}
