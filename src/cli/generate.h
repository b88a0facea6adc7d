/* The generation loop the text commands (run, chat) share: prefill a prompt (reusing
 * the tokens the sequence already holds when the new prompt extends them), then
 * sample, detokenize and stream until max tokens, an end-of-sequence token, a stop
 * string or an interrupt. */
#ifndef QD_CLI_GENERATE_H
#define QD_CLI_GENERATE_H

#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "io/tokenizer.h"
#include "qdelta.h"
#include "runtime/engine.h"
#include "runtime/sampler.h"
#include "runtime/stop.h"

typedef struct cli_session {
    qd_model *model;
    qd_context *ctx;          /* one sequence: slot 0 (NULL when speculating) */
    /* Speculative decoding (--speculative-tokens K): the generation runs through an
     * engine of one sequence, whose speculative path (runtime/spec_step.c) drafts with
     * the MTP head; its prefix cache keeps a conversation's earlier turns. NULL: off. */
    qd_engine *engine;
    int spec_k;
    qd_tokenizer *tok;        /* NULL when the checkpoint has none (id-only commands) */
    int max_ctx, max_batch;
    int32_t *fed;             /* [max_ctx] tokens the sequence has consumed */
    int n_fed;
    float *logits;            /* [vocab] */
} cli_session;

typedef struct cli_gen_opts {
    qd_sampling_params sampling;
    bool temperature_set;     /* --temperature given (else the command picks a default) */
    int max_tokens;
    const char *stops[QD_STOP_MAX_STRINGS];
    int n_stops;
    bool ignore_eos;
    bool skip_special;        /* leave special tokens out of the streamed text */
    int print_logprobs;       /* >0: print each token's logprob and top alternatives to stderr */
    int speculative_tokens;   /* --speculative-tokens K: MTP drafts per step, 0 = off */
    int speculative_draft_vocab; /* --speculative-draft-vocab N: drafts among ids [0, N), 0 = all */
    int speculative_always;   /* --speculative-always: draft at every step (engine param of that name) */
} cli_gen_opts;

typedef struct cli_gen_result {
    int32_t *ids;             /* generated ids (malloc'd) */
    int n_ids;
    char *text;               /* the emitted text (malloc'd, stop string excluded) */
    size_t text_len;
    int n_prompt_fed;         /* prompt tokens actually computed (after prefix reuse) */
    double t_prefill, t_first, t_decode;
    const char *finish;       /* "length", "stop", "eos", "interrupted" */
    /* speculative decoding (zeros when off): verify steps, drafts, accepted, by position */
    int spec_k;
    uint64_t spec_steps, spec_drafted, spec_accepted, spec_accepted_at[4];
} cli_gen_result;

cli_gen_opts cli_gen_default_opts(void);
/* Without --temperature: the checkpoint's generation_config.json sampling (do_sample,
 * temperature, top_p, top_k, repetition_penalty), as transformers' generate would use. */
void cli_apply_generation_defaults(cli_gen_opts *o, const qd_model *m);
int cli_session_open(cli_session *s, qd_model *m, qd_tokenizer *tok, int max_ctx, int max_batch);
/* The same with spec's speculative_tokens drafts per step (NULL or 0: cli_session_open),
 * its draft vocabulary and policy. A model without an MTP head, or a backend without the
 * MTP forward, fails here with the engine's message. */
int cli_session_open_spec(cli_session *s, qd_model *m, qd_tokenizer *tok, int max_ctx, int max_batch,
                          const cli_gen_opts *spec);
/* The generation of cli_generate through the session's engine (generate_engine.c). */
int cli_generate_engine(cli_session *s, const int32_t *prompt, int n_prompt, const cli_gen_opts *o, FILE *out,
                        volatile sig_atomic_t *interrupted, cli_gen_result *r);
/* "speculative: ..." on f: acceptance rate and mean accepted length of a result. */
void cli_print_spec_line(FILE *f, const cli_gen_result *r);
void cli_session_close(cli_session *s);
/* Streams text to `out` (may be NULL). Returns 0, or -1 with a message printed. */
int cli_generate(cli_session *s, const int32_t *prompt, int n_prompt, const cli_gen_opts *o, FILE *out,
                 volatile sig_atomic_t *interrupted, cli_gen_result *r);
void cli_gen_result_free(cli_gen_result *r);
/* Adds the sampling options (--temperature, --top-k, --top-p, --min-p, --seed,
 * --repetition-penalty, --presence-penalty, --frequency-penalty, --stop, -n,
 * --ignore-eos, --logprobs) to o. Returns 1 if consumed, 0 if not, -1 on error. */
int cli_parse_gen_opt(cli_gen_opts *o, int argc, char **argv, int *i);
void cli_print_gen_opts_help(FILE *f);

#endif
