/* A generation's logprobs (gen_logprobs.c): the pieces gen.c's output pipeline calls. */
#ifndef QD_SERVER_GEN_LOGPROBS_H
#define QD_SERVER_GEN_LOGPROBS_H

#include "server/server.h"

/* The first choice of g's prompt, which holds its echo. */
static inline srv_gen *srv_gen_head(srv_gen *g) { return g->head ? g->head : g; }

/* A sampled token's logprobs, its text starting where the output is now. */
void srv_gen_take_logprobs(srv_gen *g, const qd_sample_result *r);
/* Streaming: the kept tokens' logprobs formatted into the next chunk's. */
void srv_gen_format_logprobs(srv_gen *g);
/* An event's prompt logprobs, kept until the choice's logprobs begin. */
void srv_gen_keep_prompt_logprobs(srv_gen *g, const qd_engine_event *ev);
/* Before the choice's first token (or its end): the prompt's logprobs, once. */
void srv_gen_take_prompt_logprobs(srv_gen *g);
/* Completions echo: the prompt's text into g->echo_text, and with logprobs where each token
 * of it starts. Returns 0, or -1 with e set. */
int srv_gen_echo(srv_gen *g, const int32_t *ids, size_t n, srv_error *e);

#endif
