/* One generation: submission to the engine and the engine callback that turns tokens
 * into OpenAI responses. The callback runs on the engine's reporting thread: it detokenizes,
 * applies stop strings, splits <think> reasoning from content, and gathers a stream's
 * deltas (formatted into SSE chunks by the connection's reader, srv_gen_flush) or
 * accumulates the message (non-streaming); then it resumes the suspended HTTP
 * connection so that MHD sends what is ready. */
#include <microhttpd.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <string.h>
#include <time.h>

#include "server/anthropic_out.h"
#include "server/gen_logprobs.h"
#include "runtime/grammar/constraint.h"
#include "server/server.h"

srv_gen *srv_gen_new(srv_server *s, srv_kind kind) {
    srv_gen *g = calloc(1, sizeof *g);
    if (!g) return NULL;
    g->srv = s;
    pthread_mutex_init(&g->mu, NULL);
    g->refs = 1;
    g->kind = kind;
    g->created = (long)time(NULL);
    g->http_status = 200;
    g->fd = -1;
    g->n_choices = 1;
    static uint64_t counter;
    uint64_t c = __atomic_add_fetch(&counter, 1, __ATOMIC_RELAXED);
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    g->stop_index = -1;
    snprintf(g->id, sizeof g->id, "%s%08llx%08llx",
             kind == SRV_CHAT ? "chatcmpl-" : kind == SRV_MESSAGES ? "msg_" : "cmpl-",
             (unsigned long long)(ts.tv_nsec ^ (ts.tv_sec << 20)) & 0xffffffffull, (unsigned long long)c);
    __atomic_add_fetch(&s->n_gens, 1, __ATOMIC_RELAXED);
    return g;
}

/* The lock of g's response: the lead's for every choice. */
static pthread_mutex_t *gen_mu(srv_gen *g) { return g->lead ? &g->lead->mu : &g->mu; }
static srv_gen *gen_lead(srv_gen *g) { return g->lead ? g->lead : g; }

/* The last reference is gone. */
static void gen_free(srv_gen *g) {
    srv_server *s = g->srv;
    srv_gen *lead = g->lead, *head = g->holds_head ? g->head : NULL;
    if (g->dt.tok) qd_detok_free(&g->dt);
    qd_stop_matcher_free(g->stop);
    qd_constraint_free(g->o.rp.constraint); /* NULL unless a route failed before submit */
    srv_opts_free(&g->o);
    srv_think_free(&g->think);
    srv_toolcap_free(&g->toolcap);
    json_decref(g->tool_calls);
    json_decref(g->tools);
    json_decref(g->dtools);
    srv_buf_free(&g->content);
    srv_buf_free(&g->reasoning);
    srv_buf_free(&g->echo_text);
    srv_buf_free(&g->out);
    srv_buf_free(&g->dcontent);
    srv_buf_free(&g->dreasoning);
    json_decref(g->lp);
    json_decref(g->dlp);
    free(g->plp);
    free(g->plr);
    free(g->echo_off);
    free(g->body);
    free(g->error_body);
    json_decref(g->choices);
    pthread_mutex_destroy(&g->mu);
    free(g);
    __atomic_sub_fetch(&s->n_gens, 1, __ATOMIC_RELAXED);
    if (head) srv_gen_unref(head); /* ... and the head of its prompt (which keeps the lead) */
    if (lead) srv_gen_unref(lead); /* a choice keeps its lead alive */
}

void srv_gen_unref(srv_gen *g) {
    pthread_mutex_t *mu = gen_mu(g);
    pthread_mutex_lock(mu);
    int left = --g->refs;
    pthread_mutex_unlock(mu);
    if (left == 0) gen_free(g);
}

/* Choice `index` of the lead's request (n > 1, or a later prompt's): the lead's options
 * and output pipeline settings, its own state, the echo of its prompt's head (NULL: it
 * is one). The constraint stays with the lead (the engine gives each sequence its copy).
 * NULL when memory runs out. */
static srv_gen *choice_new(srv_gen *lead, int index, srv_gen *head) {
    srv_gen *g = srv_gen_new(lead->srv, lead->kind);
    if (!g) return NULL;
    g->lead = lead;
    g->index = index;
    g->created = lead->created;
    g->o = lead->o;
    g->o.rp.constraint = NULL;
    g->o.n_stops = 0;
    for (int i = 0; i < lead->o.n_stops; i++)
        if ((g->o.stops[g->o.n_stops] = strdup(lead->o.stops[i])) != NULL) g->o.n_stops++;
    g->think.enabled = lead->think.enabled;
    g->think.in_think = lead->think.in_think;
    g->think.saw_tag = lead->think.saw_tag;
    g->toolcap.enabled = lead->toolcap.enabled;
    g->tools = json_incref(lead->tools);
    if (head && head->echo_text.n) srv_buf_append(&g->echo_text, head->echo_text.p, head->echo_text.n);
    pthread_mutex_lock(&lead->mu);
    lead->refs++;
    g->head = head;
    g->holds_head = head && head != lead; /* its echo and prompt logprobs are read to the end */
    if (g->holds_head) head->refs++;
    pthread_mutex_unlock(&lead->mu);
    if (g->o.n_stops != lead->o.n_stops) {
        srv_gen_unref(g);
        return NULL;
    }
    return g;
}

/* ---------------------------------------------------------------- text */

/* A piece of output text: into the per-event delta (streaming) or the message. */
static void out_text(srv_gen *g, int reasoning, const char *t, size_t n) {
    if (!n) return;
    if (g->o.stream) srv_buf_append(reasoning ? &g->dreasoning : &g->dcontent, t, n);
    else srv_buf_append(reasoning ? &g->reasoning : &g->content, t, n);
}

static void out_cb(void *user, int reasoning, const char *t, size_t n) { out_text(user, reasoning, t, n); }

/* Streaming: the deltas of the tool calls captured so far. */
static void stream_tool_deltas(srv_gen *g) {
    if (!g->o.stream || !g->toolcap.capturing || g->tstream.broken) return;
    if (!g->dtools && !(g->dtools = json_array())) return;
    srv_toolstream_feed(&g->tstream, g->toolcap.cap.p, g->toolcap.cap.n, g->tools, g->id, g->dtools);
}

/* Reasoning goes out as is; content passes the tool-call capture first. */
static void emit_cb(void *user, int reasoning, const char *t, size_t n) {
    srv_gen *g = user;
    if (reasoning) out_text(g, 1, t, n);
    else {
        srv_toolcap_push(&g->toolcap, t, n, 0, out_cb, g);
        stream_tool_deltas(g);
    }
}

static void split_push(srv_gen *g, const char *t, size_t n, int final) {
    srv_think_push(&g->think, t, n, final, emit_cb, g);
}

/* Detokenized text -> stop strings -> splitter. */
static void text_push(srv_gen *g, const char *t, size_t n) {
    qd_stop_result sr;
    qd_err err;
    if (g->stopped) return;
    /* before min_tokens stop strings do not apply (vLLM): the text passes the matcher by */
    if (g->completion_tokens < g->o.rp.min_tokens) {
        split_push(g, t, n, 0);
        return;
    }
    if (qd_stop_matcher_push(g->stop, t, n, &sr, &err) != QD_OK) return;
    split_push(g, sr.text, sr.len, 0);
    if (sr.stopped) {
        g->stopped = 1;
        g->stop_index = sr.stop_index;
    }
}

void srv_gen_seed_output(srv_gen *g, const char *text, size_t n) { split_push(g, text, n, 0); }

static int is_eos(const srv_server *s, int32_t id) {
    for (int i = 0; i < s->n_eos; i++)
        if (s->eos[i] == id) return 1;
    return 0;
}

/* A token of the request's stop_token_ids that ended it: like EOS, not part of the text. */
static int is_stop_token(const srv_gen *g, const qd_engine_event *ev) {
    if (ev->finish != QD_FINISH_EOS) return 0;
    for (int i = 0; i < g->o.rp.n_stop_token_ids; i++)
        if (g->o.rp.stop_token_ids[i] == ev->sample.token) return 1;
    return 0;
}

/* ---------------------------------------------------------------- output */

/* The response's usage (of the lead, once every choice finished): each prompt counted
 * once, the completion tokens of every choice summed, as OpenAI counts n > 1. */
static json_t *usage_json(const srv_gen *lead) {
    return json_pack("{s:i, s:i, s:i}", "prompt_tokens", lead->prompt_sum, "completion_tokens", lead->completion_sum,
                     "total_tokens", lead->prompt_sum + lead->completion_sum);
}

static void sse_send(srv_gen *g, json_t *chunk) {
    char *t = chunk ? json_dumps(chunk, JSON_COMPACT) : NULL;
    json_decref(chunk);
    if (!t) return;
    srv_buf *out = &gen_lead(g)->out;
    srv_buf_append(out, "data: ", 6);
    srv_buf_append(out, t, strlen(t));
    srv_buf_append(out, "\n\n", 2);
    free(t);
}

/* The response's id is the lead's for every choice (a choice's own id names its tool calls). */
static json_t *chunk_base(srv_gen *g) {
    g = gen_lead(g);
    return json_pack("{s:s, s:s, s:i, s:s}", "id", g->id, "object",
                     g->kind == SRV_CHAT ? "chat.completion.chunk" : "text_completion", "created", (json_int_t)g->created,
                     "model", g->srv->cfg.model_name);
}

/* Sends the text and logprobs gathered since the last chunk as one chunk (if any), with
 * the finish reason when given. */
static void stream_chunk(srv_gen *g, const char *finish) {
    srv_gen_format_logprobs(g);
    if (g->kind == SRV_MESSAGES) {
        srv_anthropic_stream(g, finish);
        return;
    }
    int have = g->dcontent.n || g->dreasoning.n || g->dlp || g->tool_calls || json_array_size(g->dtools) ||
               (g->kind == SRV_CHAT && !g->sent_role) ||
               (g->kind == SRV_COMPLETION && g->echo_text.n && !g->sent_role);
    if (!have && !finish) return;
    json_t *c = chunk_base(g), *choice;
    if (g->kind == SRV_CHAT) {
        json_t *delta = json_object();
        if (!g->sent_role) json_object_set_new(delta, "role", json_string("assistant"));
        if (g->dreasoning.n) json_object_set_new(delta, "reasoning_content", json_stringn(g->dreasoning.p, g->dreasoning.n));
        if (g->dcontent.n || !g->sent_role) json_object_set_new(delta, "content", json_stringn(g->dcontent.p ? g->dcontent.p : "", g->dcontent.n));
        if (g->tool_calls) {
            /* streamed whole, once parsed at the end; deltas carry an index */
            size_t i;
            json_t *tc;
            json_array_foreach(g->tool_calls, i, tc) json_object_set_new(tc, "index", json_integer((json_int_t)i));
            json_object_set_new(delta, "tool_calls", g->tool_calls);
            g->tool_calls = NULL;
        } else if (json_array_size(g->dtools)) {
            json_object_set_new(delta, "tool_calls", g->dtools);
            g->dtools = NULL;
        }
        choice = json_pack("{s:i, s:o}", "index", g->index, "delta", delta);
    } else {
        srv_buf text = {0};
        if (!g->sent_role) srv_buf_append(&text, g->echo_text.p, g->echo_text.n);
        srv_buf_append(&text, g->dcontent.p, g->dcontent.n);
        choice = json_pack("{s:i, s:s%}", "index", g->index, "text", text.p ? text.p : "", text.n);
        g->text_offset += text.n;
        srv_buf_free(&text);
    }
    g->sent_role = 1;
    json_object_set_new(choice, "logprobs", g->dlp ? g->dlp : json_null());
    g->dlp = NULL;
    json_object_set_new(choice, "finish_reason", finish ? json_string(finish) : json_null());
    json_object_set_new(c, "choices", json_pack("[o]", choice));
    if (g->o.include_usage) json_object_set_new(c, "usage", json_null());
    sse_send(g, c);
    g->dcontent.n = g->dreasoning.n = 0;
}

/* A token's deltas wait for the reader (srv_gen_flush). Requests with tools format at once:
 * their tool-call deltas stay one event a chunk. A choice is listed once, and a lead has at
 * most SRV_MAX_N choices, so the list never fills. */
static void defer_chunk(srv_gen *g) {
    if (g->tools) {
        stream_chunk(g, NULL);
    } else if (!g->pending) {
        srv_gen *lead = gen_lead(g);
        g->pending = 1;
        lead->pend[lead->n_pend++] = g;
    }
}

/* g leaves its lead's pending list (its deltas go out with what comes next). */
static void unpend(srv_gen *g) {
    if (!g->pending) return;
    srv_gen *lead = gen_lead(g);
    int j = 0;
    for (int i = 0; i < lead->n_pend; i++)
        if (lead->pend[i] != g) lead->pend[j++] = lead->pend[i];
    lead->n_pend = j;
    g->pending = 0;
}

void srv_gen_flush(srv_gen *lead) {
    for (int i = 0; i < lead->n_pend; i++) {
        srv_gen *g = lead->pend[i];
        g->pending = 0;
        stream_chunk(g, NULL);
    }
    lead->n_pend = 0;
}

/* Non-streaming: this choice's object, into the lead's choices[index]. */
static void add_choice(srv_gen *g, const char *finish) {
    json_t *choice;
    if (g->kind == SRV_CHAT) {
        json_t *msg = json_pack("{s:s, s:s%}", "role", "assistant", "content", g->content.p ? g->content.p : "", g->content.n);
        if (g->tool_calls && !g->content.n) json_object_set_new(msg, "content", json_null()); /* as OpenAI */
        if (g->think.enabled && (g->reasoning.n || g->think.saw_tag))
            json_object_set_new(msg, "reasoning_content", json_stringn(g->reasoning.p ? g->reasoning.p : "", g->reasoning.n));
        json_object_set_new(msg, "tool_calls", g->tool_calls ? g->tool_calls : json_array());
        g->tool_calls = NULL;
        choice = json_pack("{s:i, s:o}", "index", g->index, "message", msg);
    } else {
        srv_buf text = {0};
        srv_buf_append(&text, g->echo_text.p, g->echo_text.n);
        srv_buf_append(&text, g->content.p, g->content.n);
        choice = json_pack("{s:i, s:s%}", "index", g->index, "text", text.p ? text.p : "", text.n);
        srv_buf_free(&text);
    }
    json_object_set_new(choice, "logprobs", g->lp ? json_incref(g->lp) : json_null());
    json_object_set_new(choice, "finish_reason", json_string(finish));
    srv_gen *lead = gen_lead(g);
    if (!lead->choices) {
        lead->choices = json_array();
        for (int i = 0; i < lead->n_choices; i++) json_array_append_new(lead->choices, json_null());
    }
    json_array_set_new(lead->choices, (size_t)g->index, choice);
}

static void build_body(srv_gen *lead) {
    json_t *o = json_pack("{s:s, s:s, s:i, s:s}", "id", lead->id, "object", lead->kind == SRV_CHAT ? "chat.completion" : "text_completion",
                          "created", (json_int_t)lead->created, "model", lead->srv->cfg.model_name);
    json_object_set_new(o, "choices", lead->choices ? lead->choices : json_array());
    lead->choices = NULL;
    json_object_set_new(o, "usage", usage_json(lead));
    lead->body = json_dumps(o, JSON_COMPACT);
    json_decref(o);
}

/* One choice's output is complete: when it is the last, the response ends (the
 * usage chunk and [DONE], or the body). */
static void finish_choice(srv_gen *g) {
    srv_gen *lead = gen_lead(g);
    g->choice_done = 1;
    lead->n_finished++;
    lead->completion_sum += g->completion_tokens;
    if (lead->n_finished < lead->n_choices) return;
    if (lead->o.stream) {
        if (lead->kind != SRV_MESSAGES && lead->o.include_usage && !lead->failed) {
            json_t *c = chunk_base(lead);
            json_object_set_new(c, "choices", json_array());
            json_object_set_new(c, "usage", usage_json(lead));
            sse_send(lead, c);
        }
        if (lead->kind != SRV_MESSAGES) srv_buf_append(&lead->out, "data: [DONE]\n\n", 14); /* OpenAI's end marker */
    } else if (lead->error_body) {
        lead->http_status = 500;
        free(lead->body);
        lead->body = lead->error_body;
        lead->error_body = NULL;
    } else if (lead->kind != SRV_MESSAGES) {
        build_body(lead);
    }
    lead->done = 1;
}

/* Ends a choice's output: flushes held-back text, sends its final chunk / builds its
 * part of the body. */
static void finalize(srv_gen *g, const char *finish, const char *error) {
    if (g->choice_done) return;
    srv_gen *lead = gen_lead(g);
    srv_gen_take_prompt_logprobs(g); /* a request that ends before its first token still echoes them */
    /* its gathered deltas go out in the chunks below (before an error, on their own) */
    if (g->pending) {
        unpend(g);
        if (error) stream_chunk(g, NULL);
    }
    if (!g->stopped) {
        const char *t;
        size_t n;
        qd_err err;
        if (g->dt.tok && qd_detok_flush(&g->dt, &t, &n, &err) == QD_OK && n) text_push(g, t, n);
        if (!g->stopped) {
            qd_stop_result sr;
            qd_stop_matcher_flush(g->stop, &sr);
            split_push(g, sr.text, sr.len, 0);
        }
    }
    if (g->stopped && finish && !strcmp(finish, "length")) finish = "stop";
    split_push(g, "", 0, 1);
    srv_toolcap_push(&g->toolcap, "", 0, 1, out_cb, g);
    stream_tool_deltas(g);
    if (g->toolcap.capturing) {
        g->tool_calls = srv_parse_tool_calls(g->toolcap.cap.p, g->toolcap.cap.n, g->id, g->tools);
        if (!g->tool_calls) out_text(g, 0, g->toolcap.cap.p, g->toolcap.cap.n); /* not a call after all */
        else if (finish && strcmp(finish, "abort") != 0) finish = "tool_calls";
        /* calls already streamed as deltas are not sent again whole */
        if (g->o.stream && g->tstream.n_calls > 0) {
            json_decref(g->tool_calls);
            g->tool_calls = NULL;
        }
    }
    if (error) {
        srv_error e;
        srv_fail(&e, 500, "internal_error", NULL, "generation failed: %s", error);
        srv_reply r = {0};
        if (g->kind == SRV_MESSAGES) srv_reply_error_anthropic(&r, &e);
        else srv_reply_error(&r, &e);
        lead->failed = 1;
        if (g->o.stream && g->kind == SRV_MESSAGES) {
            free(r.body);
            srv_anthropic_stream_error(g, &e);
        } else if (g->o.stream) {
            /* the error in place of the choice's end; [DONE] follows with the last choice */
            srv_buf_append(&lead->out, "data: ", 6);
            if (r.body) srv_buf_append(&lead->out, r.body, strlen(r.body));
            srv_buf_append(&lead->out, "\n\n", 2);
            free(r.body);
        } else if (!lead->error_body) {
            lead->error_body = r.body;
        } else {
            free(r.body);
        }
    } else if (g->o.stream) {
        stream_chunk(g, NULL);
        stream_chunk(g, finish);
    } else if (g->kind == SRV_MESSAGES) {
        srv_anthropic_body(g, finish);
    } else {
        add_choice(g, finish);
    }
    finish_choice(g);
}

static const char *finish_name(qd_finish_reason f) {
    switch (f) {
    case QD_FINISH_LENGTH: return "length";
    case QD_FINISH_EOS: return "stop";
    case QD_FINISH_STOP: return "stop";
    case QD_FINISH_CANCELLED: return "abort";
    default: return "stop";
    }
}

/* ------------------------------------------------------------ the callback */

/* A suspended connection is not polled by MHD, so a client that gives up on a
 * non-streaming request would only be noticed when the body is written, after all
 * max_tokens. Peeking at the socket every few tokens finds the end-of-file it left
 * (a stream finds it sooner, on the next write). */
static int client_closed(srv_gen *lead, int n_events) {
    if (lead->fd < 0 || lead->conn_gone || (n_events & 7) != 0) return 0;
    char c;
    ssize_t k = recv(lead->fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
    return k == 0;
}

static int on_event(void *user, const qd_engine_event *ev) {
    srv_gen *g = user, *lead = gen_lead(g);
    srv_server *s = g->srv;
    const double now = qd_clock_seconds();
    const int last = ev->finish != QD_FINISH_NONE;
    struct MHD_Connection *resume = NULL;
    pthread_mutex_lock(&lead->mu);
    if (ev->prompt_tokens > 0) g->prompt_tokens = ev->prompt_tokens;
    if (ev->n_prompt_lp > 0 && !g->choice_done) {
        srv_gen_keep_prompt_logprobs(g, ev);
        /* a long prompt-only request has no token events to probe the client on */
        if (client_closed(lead, 0)) {
            lead->client_gone = 1;
            finalize(g, "abort", NULL);
        }
    }
    if (ev->has_token) {
        if (g->n_events++ == 0) srv_metrics_ttft(&s->metrics, now - g->t_submit);
        else srv_metrics_itl(&s->metrics, now - g->t_last);
        g->t_last = now;
        g->completion_tokens = ev->completion_tokens > 0 ? ev->completion_tokens : g->completion_tokens + 1;
        if (!g->choice_done && !g->stopped) {
            const qd_sample_result *r = &ev->sample;
            srv_gen_take_prompt_logprobs(g);
            if (g->o.logprobs) srv_gen_take_logprobs(g, r);
            int32_t id = r->token;
            int special = qd_tokenizer_is_special(s->tok, id) && id != s->think_start && id != s->think_end;
            if (!(is_eos(s, id) && !g->o.rp.ignore_eos) && !special && !is_stop_token(g, ev)) {
                const char *t;
                size_t n;
                qd_err err;
                if (qd_detok_push(&g->dt, id, &t, &n, &err) == QD_OK) text_push(g, t, n);
            }
            if (g->stopped) finalize(g, "stop", NULL);
            else if (g->o.stream) defer_chunk(g);
        }
        if (!g->choice_done && client_closed(lead, g->n_events)) {
            lead->client_gone = 1;
            finalize(g, "abort", NULL);
        }
    }
    if (last) {
        g->engine_done = 1;
        lead->n_engine_done++;
        /* the client is gone (our nonzero return may have ended it as STOP before the
         * cancel arrived): count it as cancelled either way */
        const int aborted = ev->finish == QD_FINISH_CANCELLED || lead->client_gone || (lead->conn_gone && !g->choice_done);
        if (!g->choice_done) finalize(g, finish_name(ev->finish), ev->finish == QD_FINISH_ERROR ? (ev->error ? ev->error : "error") : NULL);
        /* n > 1: a prompt is counted with its first choice only (it was prefilled once) */
        srv_metrics_finished(&s->metrics, g->head ? 0 : g->prompt_tokens, g->completion_tokens, now - g->t_submit,
                             aborted);
    }
    int want_stop = g->stopped || lead->conn_gone || lead->client_gone;
    if (lead->suspended && !lead->conn_gone && (lead->done || lead->out.n > lead->out_off || lead->n_pend > 0)) {
        /* whoever clears `suspended` owns the resume; a suspended connection cannot
         * complete, so conn stays valid after the unlock */
        lead->suspended = 0;
        resume = lead->conn;
    }
    /* The engine's reference goes in this critical section, not after the resume:
     * the connection sends the end of the response only after seeing `done` under
     * the lead's mutex, so once a client has a complete response only the connection's
     * reference is left, and MHD drops that (srv_gen_conn_done) in the same pass as
     * the last write, before its thread serves another request. Dropped after the
     * resume, a slow reporting thread (ASan) left the generation counted in
     * qdelta_open_generations after the client had its answer. If the connection
     * still holds its reference g outlives the unlock; if not, no resume is due and
     * g is freed here. A choice of n > 1 also drops its reference to the lead here
     * (g->lead is then cleared, so that gen_free does not drop it again). */
    const int free_now = last && --g->refs == 0;
    int free_lead = 0;
    if (free_now && g->lead) {
        free_lead = --lead->refs == 0;
        g->lead = NULL;
    }
    pthread_mutex_unlock(&lead->mu);
    if (resume) MHD_resume_connection(resume);
    if (free_now) gen_free(g);
    if (free_lead) gen_free(lead);
    return want_stop && !last;
}

/* The engine owns the request's constraint once it accepts the request; until then
 * (and when it refuses it) the generation does. */
static int gen_submit(srv_gen *g, const int32_t *const *prompts, const int *lens, int n_prompts, srv_error *e);
int srv_gen_submit_batch(srv_gen *g, const int32_t *const *prompts, const int *lens, int n_prompts, srv_error *e) {
    int rc = gen_submit(g, prompts, lens, n_prompts, e);
    if (rc) qd_constraint_free(g->o.rp.constraint);
    g->o.rp.constraint = NULL;
    return rc;
}

int srv_gen_submit(srv_gen *g, const int32_t *prompt, int n_prompt, srv_error *e) {
    return srv_gen_submit_batch(g, &prompt, &n_prompt, 1, e);
}

/* The text pipeline of one choice. */
static int pipeline_init(srv_gen *g, int n_prompt, srv_error *e) {
    qd_err err;
    qd_err_clear(&err);
    qd_detok_init(&g->dt, g->srv->tok, 0); /* specials are filtered in on_event (except <think> tags) */
    if (qd_stop_matcher_create((const char *const *)g->o.stops, g->o.n_stops, &g->stop, &err) != QD_OK)
        return srv_fail(e, 400, "invalid_request_error", "stop", "%s", err.msg);
    g->prompt_tokens = n_prompt;
    g->t_submit = qd_clock_seconds();
    return 0;
}

/* The choices of every prompt: choice 0 is g, the others are made here, each holding one
 * reference (the engine's once submitted); the first of each prompt holds its echo. */
static int make_choices(srv_gen *g, const int32_t *const *prompts, const int *lens, int n, int total, srv_gen **gens,
                        int *made, srv_error *e) {
    gens[0] = g;
    *made = 1;
    if (g->o.echo && srv_gen_echo(g, prompts[0], (size_t)lens[0], e)) return -1;
    for (; *made < total; ++*made) {
        const int k = *made / n;
        srv_gen *head = *made % n ? gens[k * n] : NULL;
        if (!(gens[*made] = choice_new(g, *made, head)))
            return srv_fail(e, 500, "internal_error", NULL, "out of memory for %d choices", total);
        if (!head && g->o.echo && srv_gen_echo(gens[*made], prompts[k], (size_t)lens[k], e)) {
            ++*made;
            return -1;
        }
    }
    for (int i = 0; i < total; i++)
        if (pipeline_init(gens[i], lens[i / n], e)) return -1;
    return 0;
}

static int submit_failed(qd_status st, const qd_err *err, srv_error *e) {
    if (st == QD_ERR_CAPACITY) {
        srv_fail(e, 503, "service_unavailable", NULL, "the server is at capacity, retry later (%s)", err->msg);
        e->code = "server_busy";
        return -1;
    }
    if (st == QD_ERR_INVALID_ARG) return srv_fail(e, 400, "invalid_request_error", NULL, "%s", err->msg);
    return srv_fail(e, 500, "internal_error", NULL, "%s", err->msg);
}

static int gen_submit(srv_gen *g, const int32_t *const *prompts, const int *lens, int n_prompts, srv_error *e) {
    srv_server *s = g->srv;
    qd_err err;
    qd_err_clear(&err);
    const int n = g->o.n > 1 ? (g->o.n > SRV_MAX_N ? SRV_MAX_N : g->o.n) : 1;
    if (n_prompts < 1 || n_prompts > SRV_MAX_CHOICES / n)
        return srv_fail(e, 400, "invalid_request_error", "prompt", "%d prompts of %d choices each: at most %d choices",
                        n_prompts, n, SRV_MAX_CHOICES);
    const int total = n_prompts * n;
    srv_gen *gens[SRV_MAX_CHOICES];
    /* each prompt's sequences get their own grammar (the caller's goes to the first), copied
     * before any is submitted: the engine advances a submitted one on its own thread */
    qd_constraint *con[SRV_MAX_CHOICES] = {g->o.rp.constraint};
    int made = 0, n_con = 1, rc = make_choices(g, prompts, lens, n, total, gens, &made, e);
    for (; !rc && g->o.rp.constraint && n_con < n_prompts; n_con++)
        if (qd_constraint_clone(g->o.rp.constraint, &con[n_con], &err) != QD_OK)
            rc = srv_fail(e, 500, "internal_error", NULL, "copying the grammar for prompt %d: %s", n_con, err.msg);
    g->n_choices = total;
    g->prompt_sum = 0;
    for (int k = 0; k < n_prompts; k++) g->prompt_sum += lens[k];
    int sent = 0; /* prompts the engine accepted */
    qd_status st = QD_OK;
    if (!rc) {
        pthread_rwlock_rdlock(&s->engine_lock);
        if (s->shutting_down || !s->engine) {
            rc = srv_fail(e, 503, "service_unavailable", NULL, "the server is shutting down");
        } else {
            pthread_mutex_lock(&g->mu);
            g->refs++; /* the engine's reference, before the callback can run */
            pthread_mutex_unlock(&g->mu);
            for (; sent < n_prompts && st == QD_OK; sent += st == QD_OK) {
                qd_request_params rp = g->o.rp;
                rp.constraint = g->o.rp.constraint ? con[sent] : NULL;
                if (!g->o.max_tokens_set) rp.max_tokens = srv_default_max_tokens(s, &g->o, lens[sent]);
                st = qd_engine_submit_n(s->engine, prompts[sent], lens[sent], &rp, n, on_event,
                                        (void *const *)(gens + sent * n), g->request_ids + sent * n, &err);
            }
            if (st != QD_OK && sent == 0) {
                pthread_mutex_lock(&g->mu);
                g->refs--;
                pthread_mutex_unlock(&g->mu);
            }
            /* a later prompt refused (a full queue): the earlier ones end, cancelled, unanswered */
            for (int i = 0; st != QD_OK && i < sent * n; i++) qd_engine_cancel(s->engine, g->request_ids[i]);
        }
        pthread_rwlock_unlock(&s->engine_lock);
    }
    if (!rc && st == QD_OK) {
        pthread_mutex_lock(&g->mu);
        g->request_id = g->request_ids[0];
        g->submitted = 1;
        pthread_mutex_unlock(&g->mu);
        return 0;
    }
    /* what the engine did not take: the copies of the grammar (the caller frees its own)
     * and the choices (choice 0 is the caller's) */
    for (int k = sent > 1 ? sent : 1; k < n_con; k++) qd_constraint_free(con[k]);
    if (sent > 0) g->o.rp.constraint = NULL; /* the engine's */
    pthread_mutex_lock(&g->mu);
    g->n_choices = sent > 0 ? sent * n : 1;
    pthread_mutex_unlock(&g->mu);
    for (int i = sent > 0 ? sent * n : 1; i < made; i++) srv_gen_unref(gens[i]);
    return rc ? rc : submit_failed(st, &err, e);
}

void srv_gen_conn_done(srv_gen *g) {
    srv_server *s = g->srv;
    pthread_mutex_lock(&g->mu);
    g->conn_gone = 1;
    g->conn = NULL;
    int cancel = g->submitted && g->n_engine_done < g->n_choices, n = g->n_choices;
    uint64_t ids[SRV_MAX_CHOICES];
    memcpy(ids, g->request_ids, sizeof ids);
    pthread_mutex_unlock(&g->mu);
    if (cancel) {
        /* the client went away (or the stream ended on a stop string): free the
         * sequences' slots and blocks now rather than at max_tokens (the ids of
         * choices already ended are unknown to the engine and ignored) */
        pthread_rwlock_rdlock(&s->engine_lock);
        if (s->engine)
            for (int i = 0; i < n; i++) qd_engine_cancel(s->engine, ids[i]);
        pthread_rwlock_unlock(&s->engine_lock);
    }
    srv_gen_unref(g);
}
