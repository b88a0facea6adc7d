/* The speculative part of qdelta bench (bench_spec.c). */
#ifndef QD_CLI_BENCH_SPEC_H
#define QD_CLI_BENCH_SPEC_H

#include "qdelta.h"
#include "runtime/engine.h"

typedef struct cli_bench_spec {
    int k;         /* drafts per step, 1..4 */
    int batch;     /* concurrent requests */
    int context;   /* prompt tokens of each */
    int n_decode;  /* tokens each generates */
    int draft_vocab; /* drafts among ids [0, draft_vocab) (0: all) */
    int always;      /* draft at every step (engine speculative_always), not by the policy */
    double verify_gb;  /* a verify step's bytes at the roofline (cli_bench_verify_bytes; 0: not known) */
    double copy_gbps;  /* the copy bandwidth measured in the run */
} cli_bench_spec;

/* A step's bytes at the roofline: the weights once, a MoE layer's experts as the `pairs`
 * distinct (layer, expert) pairs its routing touched (pairs < 0: one token's experts, a lower
 * bound), and each of the batch's sequences' GDN state moved state_passes times (read and
 * written: 2) and its KV read at mean_ctx tokens. */
double cli_bench_step_bytes(qd_model *m, int batch, double state_passes, double mean_ctx, double pairs);

/* A verify step's bytes at the roofline: the weights once, the experts its K + 1 tokens a
 * sequence touch (counted on one untimed forward of b->batch spans of K + 1 random ids in
 * ctx, whose sequences hold mean_ctx tokens and have room for K + 1 more), each sequence's
 * GDN state read once and written after each of its tokens (the per-token states that
 * rollback takes), its KV read. spans [b->batch] and next [b->batch] are scratch. Without
 * the count (a backend that does not count, or a dense model) the experts are one token's. */
double cli_bench_verify_bytes(qd_model *m, qd_context *ctx, const cli_bench_spec *b, double mean_ctx, qd_span *spans,
                              int32_t *next);

/* Prints engine decode tok/s without and with speculation and the acceptance; 0 or -1
 * (message printed: no MTP head, or the outputs differ). */
int cli_bench_spec_run(qd_model *m, const cli_bench_spec *b);

/* Random prompts, one of its own per request: prompts[batch * context]. */
void cli_bench_prompts(const cli_bench_spec *b, int vocab, int32_t *prompts);

/* One engine run of b->batch greedy requests of b->n_decode tokens (k drafts per step):
 * outs[i * n_decode ..] gets request i's tokens, n_out[i] (may be NULL) how many;
 * *tok_s the tokens after each request's first over the time from the last first
 * token to the end; *tok_s_full (may be NULL) the same over the time while every
 * request decodes (from the last first token to the first request's last token).
 * cons (NULL: unconstrained, EOS ignored) gives request i the
 * constraint cons[i] (ending at EOS as served); the engine takes those it accepts
 * (set to NULL), the caller frees the others. 0 or -1 (message printed). */
int cli_bench_engine_run(qd_model *m, const cli_bench_spec *b, int k, const int32_t *prompts, int32_t *outs,
                         qd_constraint **cons, int *n_out, double *tok_s, double *tok_s_full, qd_engine_stats *st);

/* qdelta bench --json-schema FILE (bench_schema.c): engine decode tok/s of b->batch
 * requests without and with the schema on each; the constrained outputs must parse as
 * JSON. Tokenizer from tok_dir (NULL: the model's directory). 0 or -1. */
int cli_bench_schema_run(qd_model *m, const char *model_dir, const char *tok_dir, const char *schema_path,
                         const cli_bench_spec *b);

#endif
