/* The Anthropic Messages API's response shapes.
 *
 * Non-streaming: {"id": "msg_...", "type": "message", "role": "assistant", "model",
 * "content": [thinking?, text?, tool_use*], "stop_reason", "stop_sequence", "usage"}.
 *
 * Streaming (server-sent events with an `event:` line each):
 *   message_start {message with empty content, usage.input_tokens}, ping,
 *   then per content block: content_block_start, content_block_delta*, content_block_stop
 *   (thinking_delta / text_delta / input_json_delta), then message_delta {stop_reason,
 *   stop_sequence, usage.output_tokens} and message_stop.
 * Reasoning and text arrive interleaved from the <think> splitter; a change of kind
 * closes the open block and opens the next. Tool calls stream as they are generated
 * (server/tool_stream.c): a call's id and name open its tool_use block, and each piece
 * of its arguments is one input_json_delta, so the partial_json pieces concatenate to
 * the input. A call the incremental parser gave up on is parsed when generation ends
 * (srv_parse_tool_calls) and sent whole in one input_json_delta. */
#include <stdlib.h>
#include <string.h>

#include "server/anthropic_out.h"

enum { BLOCK_NONE = 0, BLOCK_THINKING, BLOCK_TEXT, BLOCK_TOOL };

/* Anthropic's stop_reason for gen.c's finish reason. */
static const char *stop_reason(const srv_gen *g, const char *finish) {
    if (!strcmp(finish, "length")) return "max_tokens";
    if (!strcmp(finish, "tool_calls")) return "tool_use";
    if (g->stopped && g->stop_index >= 0) return "stop_sequence";
    return "end_turn";
}

static json_t *stop_sequence(const srv_gen *g, const char *finish) {
    if (strcmp(stop_reason(g, finish), "stop_sequence")) return json_null();
    return json_string(g->o.stops[g->stop_index]);
}

static void send_event(srv_gen *g, const char *name, json_t *data) {
    char *t = data ? json_dumps(data, JSON_COMPACT) : NULL;
    json_decref(data);
    if (!t) return;
    srv_buf_append(&g->out, "event: ", 7);
    srv_buf_append(&g->out, name, strlen(name));
    srv_buf_append(&g->out, "\ndata: ", 7);
    srv_buf_append(&g->out, t, strlen(t));
    srv_buf_append(&g->out, "\n\n", 2);
    free(t);
}

static json_t *message_head(const srv_gen *g) {
    return json_pack("{s:s, s:s, s:s, s:s}", "id", g->id, "type", "message", "role", "assistant", "model",
                     g->srv->cfg.model_name);
}

static void close_block(srv_gen *g) {
    if (!g->msg_block.open) return;
    send_event(g, "content_block_stop", json_pack("{s:s, s:i}", "type", "content_block_stop", "index", g->msg_block.index - 1));
    g->msg_block.open = BLOCK_NONE;
}

/* Makes a block of `type` the open one (closing another), returns its index. */
static int open_block(srv_gen *g, int type) {
    if (g->msg_block.open == type) return g->msg_block.index - 1;
    close_block(g);
    json_t *cb = type == BLOCK_THINKING ? json_pack("{s:s, s:s, s:s}", "type", "thinking", "thinking", "", "signature", "")
                                        : json_pack("{s:s, s:s}", "type", "text", "text", "");
    send_event(g, "content_block_start",
               json_pack("{s:s, s:i, s:o}", "type", "content_block_start", "index", g->msg_block.index, "content_block", cb));
    g->msg_block.open = type;
    return g->msg_block.index++;
}

static void delta(srv_gen *g, int type, const srv_buf *b) {
    int idx = open_block(g, type);
    json_t *d = type == BLOCK_THINKING ? json_pack("{s:s, s:s%}", "type", "thinking_delta", "thinking", b->p, b->n)
                                       : json_pack("{s:s, s:s%}", "type", "text_delta", "text", b->p, b->n);
    send_event(g, "content_block_delta", json_pack("{s:s, s:i, s:o}", "type", "content_block_delta", "index", idx, "delta", d));
}

/* A tool call's arguments (a JSON text) as an object; a call whose arguments do not
 * parse to an object keeps them under "arguments" as text rather than lose them. */
static json_t *tool_input(json_t *tc) {
    json_t *fn = json_object_get(tc, "function");
    const char *args = json_string_value(json_object_get(fn, "arguments"));
    json_t *in = args ? json_loads(args, 0, NULL) : NULL;
    if (json_is_object(in)) return in;
    json_decref(in);
    return json_pack("{s:s}", "arguments", args ? args : "");
}

static json_t *tool_use_block(json_t *tc, json_t *input) {
    json_t *fn = json_object_get(tc, "function");
    return json_pack("{s:s, s:O, s:O, s:o}", "type", "tool_use", "id", json_object_get(tc, "id"), "name",
                     json_object_get(fn, "name"), "input", input);
}

static void stream_tool_calls(srv_gen *g) {
    size_t i;
    json_t *tc;
    json_array_foreach(g->tool_calls, i, tc) {
        close_block(g);
        json_t *input = tool_input(tc);
        char *js = json_dumps(input, JSON_COMPACT);
        send_event(g, "content_block_start",
                   json_pack("{s:s, s:i, s:o}", "type", "content_block_start", "index", g->msg_block.index, "content_block",
                             tool_use_block(tc, json_object())));
        send_event(g, "content_block_delta",
                   json_pack("{s:s, s:i, s:{s:s, s:s}}", "type", "content_block_delta", "index", g->msg_block.index,
                             "delta", "type", "input_json_delta", "partial_json", js ? js : "{}"));
        free(js);
        json_decref(input);
        g->msg_block.index++;
        g->msg_block.open = BLOCK_TEXT; /* any kind: close_block sends its stop */
        close_block(g);
    }
    json_decref(g->tool_calls);
    g->tool_calls = NULL;
}

/* The tool-call deltas of this event (OpenAI's shape, tool_stream.c) as tool_use
 * blocks: a delta with an id opens the call's block, its arguments pieces are
 * input_json_delta events. */
static void stream_tool_deltas(srv_gen *g) {
    size_t i;
    json_t *d;
    json_array_foreach(g->dtools, i, d) {
        json_t *fn = json_object_get(d, "function"), *id = json_object_get(d, "id");
        if (json_is_string(id)) {
            close_block(g);
            json_t *cb = json_pack("{s:s, s:O, s:O, s:{}}", "type", "tool_use", "id", id, "name", json_object_get(fn, "name"),
                                   "input");
            send_event(g, "content_block_start",
                       json_pack("{s:s, s:i, s:o}", "type", "content_block_start", "index", g->msg_block.index,
                                 "content_block", cb));
            g->msg_block.open = BLOCK_TOOL;
            g->msg_block.index++;
        }
        json_t *args = json_object_get(fn, "arguments");
        if (g->msg_block.open == BLOCK_TOOL && json_is_string(args) && json_string_length(args) > 0)
            send_event(g, "content_block_delta",
                       json_pack("{s:s, s:i, s:{s:s, s:O}}", "type", "content_block_delta", "index", g->msg_block.index - 1,
                                 "delta", "type", "input_json_delta", "partial_json", args));
    }
    json_array_clear(g->dtools);
}

void srv_anthropic_stream(srv_gen *g, const char *finish) {
    if (!g->sent_role) {
        json_t *m = message_head(g);
        json_object_set_new(m, "content", json_array());
        json_object_set_new(m, "stop_reason", json_null());
        json_object_set_new(m, "stop_sequence", json_null());
        json_object_set_new(m, "usage", json_pack("{s:i, s:i}", "input_tokens", g->prompt_tokens, "output_tokens", 0));
        send_event(g, "message_start", json_pack("{s:s, s:o}", "type", "message_start", "message", m));
        send_event(g, "ping", json_pack("{s:s}", "type", "ping"));
        g->sent_role = 1;
    }
    if (g->dreasoning.n) delta(g, BLOCK_THINKING, &g->dreasoning);
    if (g->dcontent.n) delta(g, BLOCK_TEXT, &g->dcontent);
    g->dreasoning.n = g->dcontent.n = 0;
    if (json_array_size(g->dtools)) stream_tool_deltas(g);
    json_decref(g->dlp); /* the Messages API has no logprobs */
    g->dlp = NULL;
    if (!finish) return;
    if (g->tool_calls) stream_tool_calls(g);
    close_block(g);
    send_event(g, "message_delta",
               json_pack("{s:s, s:{s:s, s:o}, s:{s:i, s:i}}", "type", "message_delta", "delta", "stop_reason",
                         stop_reason(g, finish), "stop_sequence", stop_sequence(g, finish), "usage", "input_tokens",
                         g->prompt_tokens, "output_tokens", g->completion_tokens));
    send_event(g, "message_stop", json_pack("{s:s}", "type", "message_stop"));
}

void srv_anthropic_body(srv_gen *g, const char *finish) {
    json_t *o = message_head(g), *content = json_array();
    if (g->reasoning.n)
        json_array_append_new(content, json_pack("{s:s, s:s%, s:s}", "type", "thinking", "thinking", g->reasoning.p,
                                                 g->reasoning.n, "signature", ""));
    if (g->content.n || !g->tool_calls)
        json_array_append_new(content,
                              json_pack("{s:s, s:s%}", "type", "text", "text", g->content.p ? g->content.p : "", g->content.n));
    size_t i;
    json_t *tc;
    json_array_foreach(g->tool_calls, i, tc) json_array_append_new(content, tool_use_block(tc, tool_input(tc)));
    json_object_set_new(o, "content", content);
    json_object_set_new(o, "stop_reason", json_string(stop_reason(g, finish)));
    json_object_set_new(o, "stop_sequence", stop_sequence(g, finish));
    json_object_set_new(o, "usage",
                        json_pack("{s:i, s:i}", "input_tokens", g->prompt_tokens, "output_tokens", g->completion_tokens));
    g->body = json_dumps(o, JSON_COMPACT);
    json_decref(o);
}

void srv_anthropic_stream_error(srv_gen *g, const srv_error *e) {
    srv_reply r = {0};
    srv_reply_error_anthropic(&r, e);
    json_t *j = r.body ? json_loads(r.body, 0, NULL) : NULL;
    free(r.body);
    if (j) send_event(g, "error", j);
}

/* Anthropic's error types by HTTP status. */
static const char *error_type(int status) {
    switch (status) {
    case 401: return "authentication_error";
    case 403: return "permission_error";
    case 404: return "not_found_error";
    case 413: return "request_too_large";
    case 429: return "rate_limit_error";
    case 503: return "overloaded_error";
    default: return status >= 500 ? "api_error" : "invalid_request_error";
    }
}

void srv_reply_error_anthropic(srv_reply *r, const srv_error *e) {
    json_t *o = json_pack("{s:s, s:{s:s, s:s}}", "type", "error", "error", "type", error_type(e->status), "message", e->msg);
    r->status = e->status;
    r->body = o ? json_dumps(o, JSON_COMPACT) : NULL;
    r->content_type = "application/json";
    json_decref(o);
}
