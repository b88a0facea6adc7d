/* The OpenAI-compatible HTTP server (internal interface between its parts).
 *
 * Threads: libmicrohttpd runs its own polling thread(s) (epoll); the engine runs its
 * own thread. No thread per connection and none per stream: a request waiting for
 * tokens has its connection *suspended* in MHD, and the engine callback resumes it
 * when it has appended bytes to the request's output buffer. Request parsing,
 * template rendering and tokenization happen on the MHD thread; detokenization, stop
 * strings and JSON chunk building happen in the engine callback.
 *
 * Lifetime of one generation (srv_gen): two references, one held by the engine (until
 * its finishing event, which drops it before the connection can finish the response)
 * and one by the HTTP connection (until MHD reports the request completed, or the
 * client went away). Whichever drops the last one frees it; a connection that goes
 * first cancels the engine request. */
#ifndef QD_SERVER_SERVER_H
#define QD_SERVER_SERVER_H

#include <jansson.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>

#include "base/clock.h"
#include "io/chat_template.h"
#include "io/tokenizer.h"
#include "qdelta.h"
#include "runtime/engine.h"
#include "runtime/grammar/token_trie.h"
#include "runtime/stop.h"
#include "server/metrics.h"
#include "server/think.h"
#include "server/tool_calls.h"
#include "server/tool_stream.h"

struct MHD_Connection;
struct MHD_Daemon;


typedef struct srv_config {
    const char *host;
    int port;
    const char *model_dir;
    const char *model_name;     /* served name (default: the directory's last component) */
    const char *api_key;        /* NULL: no auth */
    const char *chat_template;  /* template file overriding the checkpoint's; may be NULL */
    int http_threads;
    size_t max_body;            /* bytes of request body */
    int max_connections;
    qd_engine_params engine;
} srv_config;

typedef struct srv_server {
    srv_config cfg;
    qd_model *model;
    qd_tokenizer *tok;
    qd_chat_template *tpl;
    int tpl_content_parts;           /* tpl renders lists of content parts (else they are joined first) */
    qd_engine *engine;
    qd_token_trie *trie;             /* the vocabulary for constrained decoding (structured.c) */
    struct MHD_Daemon *daemon;
    int vocab_limit;
    int32_t think_start, think_end;  /* ids of <think> / </think>; -1 when absent */
    const int32_t *eos;
    int n_eos;
    qd_generation_defaults gen_defaults;
    long created;                    /* server start time, for /v1/models */
    /* Readers: submit and cancel. Writer: shutdown, which frees the engine. */
    pthread_rwlock_t engine_lock;
    int shutting_down;
    srv_metrics metrics;
    int n_gens;                      /* live srv_gen objects (atomic) */
    uint64_t seed_counter;           /* requests without a seed get distinct ones (atomic) */
} srv_server;

/* ------------------------------------------------------------- requests */

/* SRV_MESSAGES: the Anthropic Messages API (routes/anthropic_messages.c), a chat whose
 * output is shaped by server/anthropic_out.c. */
typedef enum srv_kind { SRV_CHAT, SRV_COMPLETION, SRV_MESSAGES } srv_kind;

/* Most choices one request may ask for (OpenAI's n); above it a 400 naming `n`. */
#define SRV_MAX_N 16
/* Most choices in one response: a completions request's prompts (the batch form) times n. */
#define SRV_MAX_CHOICES 128

/* Everything a request asked for, validated. */
typedef struct srv_opts {
    srv_kind kind;     /* the route's */
    qd_request_params rp;
    int n;             /* choices: [1, SRV_MAX_N] (the prompt is prefilled once, the sequences forked) */
    int max_tokens_set;
    char *stops[QD_STOP_MAX_STRINGS];
    int n_stops;
    int stream, include_usage;
    int logprobs;      /* 0/1: report logprobs */
    int top_logprobs;  /* alternatives per token */
    int echo;          /* completions: prepend the prompt to the text */
    int token_ids;     /* vLLM's return_tokens_as_token_ids: logprobs name tokens "token_id:N" */
} srv_opts;
void srv_opts_free(srv_opts *o);

/* An error to send: HTTP status and OpenAI error fields. */
typedef struct srv_error {
    int status;
    const char *type;  /* "invalid_request_error", ... */
    const char *param; /* may be NULL */
    const char *code;  /* may be NULL */
    char msg[1024];    /* valid UTF-8 (it goes into a JSON string), cut between characters */
} srv_error;
/* Fills e; returns -1. */
int srv_fail(srv_error *e, int status, const char *type, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
int srv_failv(srv_error *e, int status, const char *type, const char *param, const char *fmt, va_list ap)
    __attribute__((format(printf, 5, 0)));

/* An optional boolean field: 1 with *out set, 0 when absent or null, -1 (e set, naming it)
 * when it is not a boolean. */
int srv_get_bool(json_t *req, const char *key, int *out, srv_error *e);
/* The request's "model", when it names one: this server's (else a 404 naming it). */
int srv_check_model(const srv_server *s, json_t *req, srv_error *e);
/* Parses the sampling/stream/stop fields shared by both endpoints. 0 or -1 (e set). */
int srv_parse_opts(srv_server *s, json_t *req, srv_kind kind, srv_opts *o, srv_error *e);
/* Checks prompt + max_tokens against the context and fills in max_tokens. */
int srv_check_length(srv_server *s, int n_prompt, srv_opts *o, srv_error *e);
/* max_tokens of a request that does not set it: the rest of the context (completions:
 * 16 at most). */
int srv_default_max_tokens(const srv_server *s, const srv_opts *o, int n_prompt);

/* A streamed token's logprobs as sampled, and where its text starts in the output;
 * none: the prompt's first token, which has no logprob (null in the response). */
typedef struct srv_lp_pending {
    qd_sample_result r;
    size_t at;
    int none;
} srv_lp_pending;

/* One generation in flight. */
typedef struct srv_gen {
    srv_server *srv;
    pthread_mutex_t mu;
    int refs;
    struct MHD_Connection *conn;
    int suspended;        /* MHD connection suspended waiting for us */
    int conn_gone;        /* connection finished or closed: never touch conn again */
    int done;             /* the final bytes / body are ready */
    int submitted;
    uint64_t request_id;
    srv_kind kind;
    srv_opts o;
    char id[48];
    long created;
    int prompt_tokens, completion_tokens;
    /* text pipeline: token -> detok -> stop strings -> <think> splitter */
    qd_detok dt;
    qd_stop_matcher *stop;
    int stopped;          /* a stop string matched */
    srv_think think;      /* reasoning / content split (chat only) */
    srv_toolcap toolcap;  /* tool calls held out of the content (chat with tools) */
    json_t *tool_calls;   /* parsed at the end */
    json_t *tools;        /* the request's tools (a reference), to type call arguments */
    srv_toolstream tstream; /* streaming: tool calls as deltas while they are generated */
    json_t *dtools;       /* streaming: tool-call deltas of the current event */
    srv_buf dcontent, dreasoning; /* streaming: text gathered for the next chunk */
    json_t *dlp;          /* streaming: logprobs formatted for the next chunk */
    struct srv_lp_pending *plp; /* streaming: tokens whose logprobs wait to be formatted */
    int n_plp, cap_plp;
    size_t text_offset;   /* streaming completions: bytes of text sent so far */
    int n_events;         /* token events seen (TTFT vs inter-token latency) */
    int engine_done;      /* the engine's finishing event arrived */
    int fd;               /* the client socket, for the liveness probe (-1: none) */
    int client_gone;      /* the probe saw the client close its end */
    /* non-streaming accumulation */
    srv_buf content, reasoning;
    json_t *lp;           /* logprobs content array / completions logprobs object */
    srv_buf echo_text;    /* completions echo */
    /* completions echo with logprobs: where each prompt token's text starts in echo_text
     * ([n_prompt]) and the first token (on the prompt's head); the prompt logprobs
     * the engine reported (plr[p - 1] for position p; a choice forked from its head's
     * prefill gets none and takes the head's); plr_taken: they went into the logprobs,
     * before the first token */
    size_t *echo_off;
    int32_t echo_first;
    qd_sample_result *plr;
    int n_plr, plr_taken;
    /* streaming output: bytes ready to send */
    srv_buf out;
    size_t out_off;
    /* streaming: choices whose token deltas wait to be formatted (lead only; `pending` on
     * each such choice). The engine's callback only gathers a token's text and logprobs;
     * the connection's reader formats them (srv_gen_flush) when it has sent the bytes
     * before, so SSE chunks are built off the engine's threads, several tokens a chunk when the
     * client lags. A choice leaves the list when it is formatted or finalized. */
    struct srv_gen *pend[SRV_MAX_CHOICES];
    int n_pend, pending;
    int sent_role;
    const char *finish_reason;
    int http_status;      /* for a non-streaming body or an error after submit */
    char *body;           /* non-streaming response body */
    double t_submit, t_last;
    int stop_index;       /* which stop string matched (-1: none) */
    /* n > 1 or several prompts: one srv_gen per choice. The lead (choice 0, lead == NULL)
     * owns the connection, the output buffer `out`, the body and `done` (the whole
     * response is ready); every other choice writes into the lead's buffer, holds a
     * reference to the lead and is guarded by the lead's mutex. `choice_done`: this
     * choice's output is complete. Prompt k's choices are k * n .. k * n + n - 1; the
     * first of them is their `head` (NULL: g is one), which holds the prompt's echo. */
    struct srv_gen *lead;
    struct srv_gen *head;
    int holds_head;       /* g holds a reference to its head (one that is not the lead) */
    int index;            /* choices[index] */
    int choice_done;
    int n_choices;        /* lead: choices in the response (1 unless n > 1) */
    int n_finished;       /* lead: choices whose output is complete */
    int n_engine_done;    /* lead: choices whose engine request has ended */
    int completion_sum;   /* lead: completion tokens over the finished choices (usage) */
    int prompt_sum;       /* lead: tokens of every prompt (usage) */
    uint64_t request_ids[SRV_MAX_CHOICES]; /* lead: the engine request of each choice */
    json_t *choices;      /* lead, non-streaming: the choice objects by index */
    char *error_body;     /* lead, non-streaming: the reply of the first choice that failed */
    int failed;           /* lead: a choice failed */
    /* Anthropic streams: the content block open now (index, type) */
    struct {
        int index;        /* blocks started so far */
        int open;         /* 0: none, else the type of the open block (anthropic_out.c) */
    } msg_block;
} srv_gen;

srv_gen *srv_gen_new(srv_server *s, srv_kind kind);
void srv_gen_unref(srv_gen *g);
/* Submits to the engine; 0, or -1 with e set (queue full, shutting down, ...). */
int srv_gen_submit(srv_gen *g, const int32_t *prompt, int n_prompt, srv_error *e);
/* Several prompts in one response (the completions batch form): prompt k's n choices are
 * k * n .. k * n + n - 1, each prompt as if it came alone. With o.echo each choice's text
 * starts with its prompt's. n_prompts * n <= SRV_MAX_CHOICES. */
int srv_gen_submit_batch(srv_gen *g, const int32_t *const *prompts, const int *lens, int n_prompts, srv_error *e);
/* Feeds text through the output pipeline as if generated (think split, tool-call
 * capture), before submission: the part of a forced reply the prompt already holds. */
void srv_gen_seed_output(srv_gen *g, const char *text, size_t n);

/* The connection went away or finished: cancel if still running, drop its reference. */
void srv_gen_conn_done(srv_gen *g);
/* Streaming, with the lead's mutex held: formats the pending choices' deltas into `out`. */
void srv_gen_flush(srv_gen *lead);

/* --------------------------------------------------------------- routes */

/* A route returns the HTTP status and sets *body (malloc'd JSON) and, for streams,
 * *gen (the response is then an SSE stream fed by the generation). */
typedef struct srv_reply {
    int status;
    char *body;
    const char *content_type;
    srv_gen *gen;  /* stream or deferred body */
} srv_reply;

void srv_reply_error(srv_reply *r, const srv_error *e);
void srv_route_chat(srv_server *s, json_t *req, srv_reply *r);
void srv_route_completions(srv_server *s, json_t *req, srv_reply *r);
void srv_route_messages(srv_server *s, json_t *req, srv_reply *r);
void srv_route_count_tokens(srv_server *s, json_t *req, srv_reply *r);
/* POST /tokenize and /detokenize (vLLM's): a prompt or a chat conversation to the ids the
 * generation routes would feed the model, and ids back to text. */
void srv_route_tokenize(srv_server *s, json_t *req, srv_reply *r);
void srv_route_detokenize(srv_server *s, json_t *req, srv_reply *r);
/* GET /tokenizer_info: the end-of-text and padding tokens, the chat template's source. */
void srv_route_tokenizer_info(srv_server *s, srv_reply *r);
/* The ids of a chat request's conversation as /v1/chat/completions renders it (with the
 * generation prompt or without). 0, or -1 with e set. */
int srv_chat_tokens(srv_server *s, json_t *req, int add_generation_prompt, int32_t **ids, size_t *n, srv_error *e);
/* An error in Anthropic's shape {"type":"error","error":{"type","message"}}. */
void srv_reply_error_anthropic(srv_reply *r, const srv_error *e);
/* GET /: the chat page compiled into the binary (server/web/chat.html). */
void srv_route_page(srv_server *s, srv_reply *r);
void srv_route_models(srv_server *s, srv_reply *r);
void srv_route_health(srv_server *s, srv_reply *r);
void srv_route_metrics(srv_server *s, srv_reply *r);

/* -------------------------------------------------------------- helpers */
int srv_auth_ok(const srv_server *s, const char *authorization_header);
/* The same key from Anthropic's "x-api-key: KEY" header. */
int srv_auth_key_ok(const srv_server *s, const char *x_api_key);
/* JSON value of one token's text (lossy UTF-8) and its bytes. */
json_t *srv_token_json(const srv_server *s, int32_t id, json_t **bytes);

/* ------------------------------------------------------------ lifecycle */
/* Fills the fields that follow from s->model, s->tok and s->tpl (set first): the vocabulary
 * limit, the <think> tag ids, EOS ids, generation defaults, whether the template renders
 * content parts. */
void srv_bind_model(srv_server *s);
int srv_start(srv_server *s);   /* 0 or -1 (message printed) */
void srv_stop(srv_server *s);   /* graceful: stop accepting, cancel streams, free */

#endif
