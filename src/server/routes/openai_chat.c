/* POST /v1/chat/completions: messages (and tools) rendered through the model's chat
 * template with add_generation_prompt, tokenized, and generated; reasoning between
 * <think> and </think> is returned as reasoning_content. */
#include <ctype.h>
#include <stdlib.h>
#include <string.h>

#include "server/server.h"
#include "server/structured.h"

/* Bounds for rendering a client-supplied conversation: generous for real chats, but a
 * request cannot make the template run away with the server's memory or time. */
static const qd_chat_template_limits k_limits = {.max_output = 16u << 20, .max_memory = 64u << 20, .max_steps = 20000000, .max_depth = 100};

/* Content parts: text only. This server serves text models, so an image, audio or
 * file part has nothing to be rendered into (templates would emit pad tokens with no
 * pixels behind them: a silently wrong answer); it is refused naming its type. */
static int check_parts(json_t *c, size_t i, srv_error *e) {
    size_t j;
    json_t *p;
    json_array_foreach(c, j, p) {
        json_t *t = json_is_object(p) ? json_object_get(p, "type") : NULL;
        if (!json_is_string(t))
            return srv_fail(e, 400, "invalid_request_error", "messages",
                            "messages[%zu].content[%zu] must be an object with a string 'type'", i, j);
        const char *ty = json_string_value(t);
        if (!strcmp(ty, "text")) {
            if (!json_is_string(json_object_get(p, "text")))
                return srv_fail(e, 400, "invalid_request_error", "messages",
                                "messages[%zu].content[%zu].text must be a string", i, j);
            continue;
        }
        if (!strcmp(ty, "image_url") || !strcmp(ty, "input_audio") || !strcmp(ty, "file") || !strcmp(ty, "image") ||
            !strcmp(ty, "audio") || !strcmp(ty, "video") || !strcmp(ty, "video_url") || !strcmp(ty, "audio_url"))
            return srv_fail(e, 400, "invalid_request_error", "messages",
                            "messages[%zu].content[%zu] is a '%s' part: this server serves text only "
                            "(image, audio, video and file inputs are not supported)", i, j, ty);
        return srv_fail(e, 400, "invalid_request_error", "messages",
                        "messages[%zu].content[%zu] has an unknown part type '%.64s' (only 'text' is supported)", i, j, ty);
    }
    return 0;
}

static int check_messages(json_t *msgs, srv_error *e) {
    if (!msgs) return srv_fail(e, 400, "invalid_request_error", "messages", "'messages' is required");
    if (!json_is_array(msgs)) return srv_fail(e, 400, "invalid_request_error", "messages", "'messages' must be an array");
    if (json_array_size(msgs) == 0) return srv_fail(e, 400, "invalid_request_error", "messages", "'messages' must not be empty");
    size_t i;
    json_t *m;
    json_array_foreach(msgs, i, m) {
        if (!json_is_object(m)) return srv_fail(e, 400, "invalid_request_error", "messages", "messages[%zu] must be an object", i);
        json_t *role = json_object_get(m, "role");
        if (!json_is_string(role))
            return srv_fail(e, 400, "invalid_request_error", "messages", "messages[%zu].role must be a string", i);
        /* The roles of the OpenAI API. Templates pass an unknown role through as text
         * ("<|im_start|>wizard"), which the model never saw in training: refuse it. */
        const char *r = json_string_value(role);
        if (strcmp(r, "system") && strcmp(r, "developer") && strcmp(r, "user") && strcmp(r, "assistant") &&
            strcmp(r, "tool"))
            return srv_fail(e, 400, "invalid_request_error", "messages",
                            "messages[%zu].role '%.64s' is not one of system, developer, user, assistant, tool", i, r);
        json_t *c = json_object_get(m, "content");
        if (c && !json_is_null(c) && !json_is_string(c) && !json_is_array(c))
            return srv_fail(e, 400, "invalid_request_error", "messages",
                            "messages[%zu].content must be a string, an array of parts or null", i);
        if (json_is_array(c) && check_parts(c, i, e)) return -1;
    }
    return 0;
}

/* A tool call's function of an assistant message in the history, or NULL. */
static json_t *call_function(json_t *call) {
    json_t *f = json_object_get(call, "function");
    return json_is_object(f) ? f : NULL;
}

/* 1 when an assistant message's tool calls hold arguments as a JSON string (OpenAI's form,
 * which every client sends back). */
static int has_string_arguments(json_t *m) {
    size_t i;
    json_t *call;
    json_array_foreach(json_object_get(m, "tool_calls"), i, call) {
        if (json_is_string(json_object_get(call_function(call), "arguments"))) return 1;
    }
    return 0;
}

/* The string arguments of the tool calls in m (a deep copy) as the objects they hold:
 * Qwen3.5's template writes a call's parameters only from an object (from a string it
 * writes none, so the model would see its earlier calls without arguments); Qwen3's
 * writes either. Text that is not a JSON object stays as it is. */
static void parse_string_arguments(json_t *m) {
    size_t i;
    json_t *call;
    json_array_foreach(json_object_get(m, "tool_calls"), i, call) {
        json_t *f = call_function(call), *a = json_object_get(f, "arguments");
        if (!json_is_string(a)) continue;
        json_t *v = json_loadb(json_string_value(a), json_string_length(a), 0, NULL);
        if (json_is_object(v)) json_object_set(f, "arguments", v);
        json_decref(v);
    }
}

/* The messages as the template sees them (vLLM hands HF templates the same):
 * - a "developer" message (OpenAI's newer name for system instructions) as a system
 *   one: Qwen templates know no developer role (Qwen3's would drop the message without
 *   a word, Qwen3.5's fails);
 * - tool calls' arguments given as JSON strings as objects (parse_string_arguments);
 * - for a template that takes string content only (string_content), each list of
 *   text parts (checked by check_messages) replaced by the parts' text joined with
 *   newlines, and no content (null or absent, as in an assistant message that holds
 *   tool calls) as "": Qwen3's template fails on a null.
 * NULL: out of memory. */
static json_t *template_messages(json_t *msgs, int string_content) {
    json_t *out = json_array();
    size_t i;
    json_t *m;
    json_array_foreach(msgs, i, m) {
        json_t *c = json_object_get(m, "content");
        const int developer = !strcmp(json_string_value(json_object_get(m, "role")), "developer");
        const int join = string_content && json_is_array(c), args = has_string_arguments(m);
        const int empty = string_content && (!c || json_is_null(c));
        if (!developer && !join && !args && !empty) {
            if (json_array_append(out, m)) goto oom;
            continue;
        }
        json_t *mc = args ? json_deep_copy(m) : json_copy(m);
        if (!mc || json_array_append_new(out, mc)) goto oom; /* takes mc's reference, failing or not */
        if (args) parse_string_arguments(mc);
        if (developer && json_object_set_new(mc, "role", json_string("system"))) goto oom;
        if (empty && json_object_set_new(mc, "content", json_string(""))) goto oom;
        if (!join) continue;
        srv_buf b = {0};
        size_t j;
        json_t *p;
        int bad = 0;
        json_array_foreach(c, j, p) {
            json_t *t = json_object_get(p, "text");
            bad |= (j && srv_buf_append(&b, "\n", 1)) || srv_buf_append(&b, json_string_value(t), json_string_length(t));
        }
        json_t *text = bad ? NULL : json_stringn(b.p ? b.p : "", b.n);
        srv_buf_free(&b);
        if (!text || json_object_set_new(mc, "content", text)) goto oom;
    }
    return out;
oom:
    json_decref(out);
    return NULL;
}

/* The template opened a thinking block in the generation prompt (Qwen3.5 style):
 * everything generated is reasoning until </think>. */
static int prompt_opens_think(const char *t, size_t n) {
    while (n && isspace((unsigned char)t[n - 1])) n--;
    return n >= 7 && !memcmp(t + n - 7, "<think>", 7);
}

/* With the prefix cache on: the conversation's length in tokens without the
 * generation prompt, if it is a token prefix of the prompt (ids[0..n)), else 0. The
 * engine snapshots there, because that is where the next turn will part from this
 * prompt: templates render an earlier reply differently from the generation prompt
 * that opened it (Qwen3.5 drops the <think> opener), so the snapshot one token before
 * this prompt's end lies past the point the next turn shares. */
static int history_tokens(srv_server *s, json_t *vars, const char *text, size_t len, const int32_t *ids, size_t n) {
    if (s->cfg.engine.prefix_cache_bytes == 0) return 0;
    json_object_set_new(vars, "add_generation_prompt", json_false());
    char *h = NULL;
    size_t hl = 0;
    int32_t *hids = NULL;
    size_t hn = 0;
    qd_err err;
    qd_err_clear(&err);
    int at = 0;
    if (qd_chat_template_render_json(s->tpl, vars, &k_limits, &h, &hl, &err) == QD_OK && hl > 0 && hl < len &&
        !memcmp(h, text, hl) && qd_tokenizer_encode(s->tok, h, hl, 0, &hids, &hn, &err) == QD_OK && hn > 0 &&
        hn < n && !memcmp(hids, ids, hn * sizeof(int32_t)))
        at = (int)hn;
    json_object_set_new(vars, "add_generation_prompt", json_true());
    free(h);
    free(hids);
    return at;
}

/* The request's conversation as the model's chat template renders it (messages, tools,
 * chat_template_kwargs, enable_thinking), with or without the generation prompt: the
 * template's variables (*vars, the caller's) and the text (*text, malloc'd). 0, or -1
 * with e set. */
static int render_chat(srv_server *s, json_t *req, int add_generation_prompt, json_t **vars, char **text, size_t *len,
                       srv_error *e) {
    json_t *msgs = json_object_get(req, "messages");
    if (check_messages(msgs, e)) return -1;
    *vars = json_object();
    json_t *shown = template_messages(msgs, !s->tpl_content_parts);
    const int oom = !*vars || !shown || json_object_set(*vars, "messages", shown);
    json_decref(shown);
    if (oom) return srv_fail(e, 500, "internal_error", NULL, "out of memory");
    json_t *tools = json_object_get(req, "tools");
    if (tools && !json_is_null(tools)) {
        if (!json_is_array(tools))
            return srv_fail(e, 400, "invalid_request_error", "tools", "'tools' must be an array");
        if (json_array_size(tools)) json_object_set(*vars, "tools", tools);
    }
    json_object_set_new(*vars, "add_generation_prompt", json_boolean(add_generation_prompt));
    json_t *kw = json_object_get(req, "chat_template_kwargs");
    if (kw && !json_is_null(kw)) {
        if (!json_is_object(kw))
            return srv_fail(e, 400, "invalid_request_error", "chat_template_kwargs",
                            "'chat_template_kwargs' must be an object");
        const char *k;
        json_t *v;
        json_object_foreach(kw, k, v) if (strcmp(k, "messages") && strcmp(k, "tools")) json_object_set(*vars, k, v);
    }
    json_t *think = json_object_get(req, "enable_thinking");
    if (think && !json_is_null(think)) {
        if (!json_is_boolean(think))
            return srv_fail(e, 400, "invalid_request_error", "enable_thinking", "'enable_thinking' must be a boolean");
        if (!json_object_get(*vars, "enable_thinking")) json_object_set(*vars, "enable_thinking", think);
    }
    qd_err err;
    qd_err_clear(&err);
    if (qd_chat_template_render_json(s->tpl, *vars, &k_limits, text, len, &err) != QD_OK)
        return srv_fail(e, 400, "invalid_request_error", "messages", "chat template: %s", err.msg);
    return 0;
}

int srv_chat_tokens(srv_server *s, json_t *req, int add_generation_prompt, int32_t **ids, size_t *n, srv_error *e) {
    json_t *vars = NULL;
    char *text = NULL;
    size_t len = 0;
    qd_err err;
    qd_err_clear(&err);
    int rc = render_chat(s, req, add_generation_prompt, &vars, &text, &len, e);
    if (!rc && qd_tokenizer_encode(s->tok, text, len, 0, ids, n, &err) != QD_OK)
        rc = srv_fail(e, 400, "invalid_request_error", "messages", "tokenizer: %s", err.msg);
    json_decref(vars);
    free(text);
    return rc;
}

void srv_route_chat(srv_server *s, json_t *req, srv_reply *r) {
    srv_error e;
    json_t *vars = NULL;
    char *text = NULL;
    size_t len = 0;
    int32_t *ids = NULL;
    srv_gen *g = srv_gen_new(s, SRV_CHAT);
    if (!g) { srv_fail(&e, 500, "internal_error", NULL, "out of memory"); goto fail; }
    if (srv_parse_opts(s, req, SRV_CHAT, &g->o, &e)) goto fail;
    if (render_chat(s, req, 1, &vars, &text, &len, &e)) goto fail;
    json_t *tools = json_object_get(req, "tools");
    if (tools && !json_is_null(tools)) {
        g->tools = json_incref(tools);
        json_t *choice = json_object_get(req, "tool_choice");
        /* tool_choice "none": the tools are shown but calls are not parsed */
        g->toolcap.enabled =
            json_array_size(tools) > 0 && !(json_is_string(choice) && !strcmp(json_string_value(choice), "none"));
    }
    qd_err err;
    qd_err_clear(&err);
    g->think.enabled = 1;
    if (prompt_opens_think(text, len)) g->think.in_think = g->think.saw_tag = 1;
    size_t n = 0;
    if (qd_tokenizer_encode(s->tok, text, len, 0, &ids, &n, &err) != QD_OK) {
        srv_fail(&e, 400, "invalid_request_error", "messages", "tokenizer: %s", err.msg);
        goto fail;
    }
    if (n > (size_t)1 << 30) n = (size_t)1 << 30;
    if (srv_check_length(s, (int)n, &g->o, &e)) goto fail;
    g->o.rp.snapshot_at = history_tokens(s, vars, text, len, ids, n);
    /* response_format / tool_choice: a grammar on the output, after the reasoning */
    if (srv_structured_setup(s, req, SRV_CHAT, text, g->think.in_think, &g->o.rp.constraint, &e)) goto fail;
    if (srv_gen_submit(g, ids, (int)n, &e)) goto fail;
    r->status = 200;
    r->gen = g;
    r->content_type = g->o.stream ? "text/event-stream" : "application/json";
    json_decref(vars);
    free(text);
    free(ids);
    return;
fail:
    srv_reply_error(r, &e);
    if (g) srv_gen_unref(g);
    json_decref(vars);
    free(text);
    free(ids);
}
