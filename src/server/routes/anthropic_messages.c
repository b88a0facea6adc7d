/* POST /v1/messages and POST /v1/messages/count_tokens: the Anthropic Messages API.
 *
 * The request is translated into the OpenAI form the chat templates are written for
 * (system message, user / assistant / tool messages, tool_calls with their arguments
 * as objects, reasoning_content for thinking blocks, function tools), rendered
 * through the model's template with the generation prompt, and generated like a chat;
 * server/anthropic_out.c shapes the reply. Sampling fields are handed to the shared
 * OpenAI parser under their OpenAI names, so both APIs validate them the same way.
 *
 * Thinking follows Anthropic: off unless `thinking: {"type": "enabled"}` (the
 * template's enable_thinking); the reasoning between <think> and </think> comes back
 * as a thinking block. `budget_tokens` is checked but not enforced: generation is
 * bounded by max_tokens only.
 *
 * tool_choice: auto (calls parsed), none (tools shown, calls not parsed: text), any
 * and tool: enforced by the grammar of OpenAI's tool_choice "required" / a named
 * function (server/structured.c), so the reply is one or more calls (one with
 * disable_parallel_tool_use, or for `tool`) whose input validates against the tool's
 * input_schema. */
#include <ctype.h>
#include <stdlib.h>
#include <string.h>

#include "server/server.h"
#include "server/structured.h"

static const qd_chat_template_limits k_limits = {.max_output = 16u << 20, .max_memory = 64u << 20, .max_steps = 20000000, .max_depth = 100};

#define BAD(e, param, ...) srv_fail(e, 400, "invalid_request_error", param, __VA_ARGS__)

/* Text of a block list (system, tool_result content): the text blocks joined. */
static int blocks_text(json_t *c, const char *what, srv_buf *out, srv_error *e) {
    if (json_is_string(c)) return srv_buf_append(out, json_string_value(c), json_string_length(c)) ? srv_fail(e, 500, "api_error", NULL, "out of memory") : 0;
    if (!json_is_array(c)) return BAD(e, what, "%s must be a string or an array of text blocks", what);
    size_t i;
    json_t *b;
    json_array_foreach(c, i, b) {
        const char *ty = json_string_value(json_object_get(b, "type"));
        if (!ty) return BAD(e, what, "%s[%zu] must be a block with a string 'type'", what, i);
        if (strcmp(ty, "text"))
            return BAD(e, what, "%s[%zu] is a '%.40s' block: only text blocks are supported here%s", what, i, ty,
                       !strcmp(ty, "image") || !strcmp(ty, "document") ? " (this server serves text only)" : "");
        json_t *t = json_object_get(b, "text");
        if (!json_is_string(t)) return BAD(e, what, "%s[%zu].text must be a string", what, i);
        if (out->n) srv_buf_append(out, "\n", 1);
        srv_buf_append(out, json_string_value(t), json_string_length(t));
    }
    return 0;
}

static json_t *text_message(const char *role, const srv_buf *b) {
    return json_pack("{s:s, s:s%}", "role", role, "content", b->p ? b->p : "", b->n);
}

/* One user message: its tool_result blocks become tool messages (in order, first,
 * as they answer the assistant's calls), its text blocks one user message. */
static int user_message(json_t *m, size_t i, json_t *out, srv_error *e) {
    json_t *c = json_object_get(m, "content");
    if (json_is_string(c)) {
        json_array_append_new(out, json_pack("{s:s, s:O}", "role", "user", "content", c));
        return 0;
    }
    srv_buf text = {0};
    size_t j;
    json_t *b;
    int rc = 0;
    json_array_foreach(c, j, b) {
        const char *ty = json_string_value(json_object_get(b, "type"));
        char where[64];
        snprintf(where, sizeof where, "messages[%zu].content[%zu]", i, j);
        if (!ty) { rc = BAD(e, "messages", "%s must be a block with a string 'type'", where); break; }
        if (!strcmp(ty, "text")) {
            json_t *t = json_object_get(b, "text");
            if (!json_is_string(t)) { rc = BAD(e, "messages", "%s.text must be a string", where); break; }
            if (text.n) srv_buf_append(&text, "\n", 1);
            srv_buf_append(&text, json_string_value(t), json_string_length(t));
        } else if (!strcmp(ty, "tool_result")) {
            json_t *id = json_object_get(b, "tool_use_id");
            if (!json_is_string(id)) { rc = BAD(e, "messages", "%s.tool_use_id must be a string", where); break; }
            srv_buf res = {0};
            json_t *rcont = json_object_get(b, "content");
            if (rcont && !json_is_null(rcont) && blocks_text(rcont, "tool_result.content", &res, e)) {
                srv_buf_free(&res);
                rc = -1;
                break;
            }
            json_t *tm = text_message("tool", &res);
            json_object_set(tm, "tool_call_id", id);
            json_array_append_new(out, tm);
            srv_buf_free(&res);
        } else if (!strcmp(ty, "image") || !strcmp(ty, "document") || !strcmp(ty, "audio") || !strcmp(ty, "video")) {
            rc = BAD(e, "messages", "%s is an '%s' block: this server serves text only (image, audio, video and document "
                     "inputs are not supported)", where, ty);
            break;
        } else {
            rc = BAD(e, "messages", "%s has block type '%.40s', which a user message cannot hold (text, tool_result)", where, ty);
            break;
        }
    }
    if (!rc && (text.n || json_array_size(c) == 0)) json_array_append_new(out, text_message("user", &text));
    srv_buf_free(&text);
    return rc;
}

/* One assistant message: text -> content, thinking -> reasoning_content, tool_use ->
 * tool_calls with the input object as arguments (the Qwen templates iterate it). */
static int assistant_message(json_t *m, size_t i, json_t *out, srv_error *e) {
    json_t *c = json_object_get(m, "content");
    if (json_is_string(c)) {
        json_array_append_new(out, json_pack("{s:s, s:O}", "role", "assistant", "content", c));
        return 0;
    }
    srv_buf text = {0}, thinking = {0};
    json_t *calls = json_array();
    size_t j;
    json_t *b;
    int rc = 0;
    json_array_foreach(c, j, b) {
        const char *ty = json_string_value(json_object_get(b, "type"));
        char where[64];
        snprintf(where, sizeof where, "messages[%zu].content[%zu]", i, j);
        if (!ty) { rc = BAD(e, "messages", "%s must be a block with a string 'type'", where); break; }
        if (!strcmp(ty, "text") || !strcmp(ty, "thinking")) {
            json_t *t = json_object_get(b, ty);
            if (!json_is_string(t)) { rc = BAD(e, "messages", "%s.%s must be a string", where, ty); break; }
            srv_buf *dst = ty[1] == 'e' ? &text : &thinking;
            srv_buf_append(dst, json_string_value(t), json_string_length(t));
        } else if (!strcmp(ty, "redacted_thinking")) {
            continue; /* opaque to us: nothing to render */
        } else if (!strcmp(ty, "tool_use")) {
            json_t *id = json_object_get(b, "id"), *name = json_object_get(b, "name"), *input = json_object_get(b, "input");
            if (!json_is_string(id) || !json_is_string(name) || !json_is_object(input)) {
                rc = BAD(e, "messages", "%s (tool_use) needs a string 'id', a string 'name' and an object 'input'", where);
                break;
            }
            json_array_append_new(calls, json_pack("{s:O, s:s, s:{s:O, s:O}}", "id", id, "type", "function", "function",
                                                   "name", name, "arguments", input));
        } else {
            rc = BAD(e, "messages", "%s has block type '%.40s', which an assistant message cannot hold "
                     "(text, thinking, redacted_thinking, tool_use)", where, ty);
            break;
        }
    }
    if (!rc) {
        json_t *am = text_message("assistant", &text);
        if (thinking.n) json_object_set_new(am, "reasoning_content", json_stringn(thinking.p, thinking.n));
        if (json_array_size(calls)) json_object_set(am, "tool_calls", calls);
        json_array_append_new(out, am);
    }
    json_decref(calls);
    srv_buf_free(&text);
    srv_buf_free(&thinking);
    return rc;
}

static json_t *convert_messages(json_t *req, srv_error *e) {
    json_t *msgs = json_object_get(req, "messages");
    if (!msgs) { BAD(e, "messages", "messages: Field required"); return NULL; }
    if (!json_is_array(msgs) || json_array_size(msgs) == 0) { BAD(e, "messages", "'messages' must be a non-empty array"); return NULL; }
    json_t *out = json_array();
    json_t *sys = json_object_get(req, "system");
    if (sys && !json_is_null(sys)) {
        srv_buf b = {0};
        if (blocks_text(sys, "system", &b, e)) {
            srv_buf_free(&b);
            json_decref(out);
            return NULL;
        }
        json_array_append_new(out, text_message("system", &b));
        srv_buf_free(&b);
    }
    size_t i;
    json_t *m;
    json_array_foreach(msgs, i, m) {
        const char *role = json_is_object(m) ? json_string_value(json_object_get(m, "role")) : NULL;
        json_t *c = json_is_object(m) ? json_object_get(m, "content") : NULL;
        int rc;
        if (!role) rc = BAD(e, "messages", "messages[%zu] must be an object with a string 'role'", i);
        else if (!json_is_string(c) && !json_is_array(c))
            rc = BAD(e, "messages", "messages[%zu].content must be a string or an array of content blocks", i);
        else if (!strcmp(role, "user")) rc = user_message(m, i, out, e);
        else if (!strcmp(role, "assistant")) rc = assistant_message(m, i, out, e);
        else rc = BAD(e, "messages", "messages[%zu].role '%.64s' is not one of user, assistant (the system prompt goes in "
                      "'system')", i, role);
        if (rc) {
            json_decref(out);
            return NULL;
        }
    }
    return out;
}

/* Anthropic's rule for tool names. */
static int valid_tool_name(json_t *name) {
    const char *s = json_string_value(name);
    size_t n = s ? strlen(s) : 0;
    if (n < 1 || n > 128) return 0;
    for (size_t i = 0; i < n; i++)
        if (!isalnum((unsigned char)s[i]) && s[i] != '_' && s[i] != '-') return 0;
    return 1;
}

/* tools [{name, description, input_schema}] -> OpenAI function tools. */
static json_t *convert_tools(json_t *tools, srv_error *e) {
    if (!json_is_array(tools)) { BAD(e, "tools", "'tools' must be an array"); return NULL; }
    json_t *out = json_array();
    size_t i;
    json_t *t;
    json_array_foreach(tools, i, t) {
        const char *ty = json_string_value(json_object_get(t, "type"));
        json_t *name = json_object_get(t, "name"), *desc = json_object_get(t, "description"),
               *schema = json_object_get(t, "input_schema");
        const char *err = NULL;
        if (!json_is_object(t)) err = "must be an object";
        else if (ty && strcmp(ty, "custom")) err = "is a server tool type this server does not run (only custom tools)";
        else if (!valid_tool_name(name)) err = "needs a 'name' of 1 to 128 letters, digits, '_' or '-'";
        else if (desc && !json_is_string(desc)) err = "has a 'description' that is not a string";
        else if (!json_is_object(schema)) err = "needs an object 'input_schema'";
        if (err) {
            BAD(e, "tools", "tools[%zu]%s%.40s%s %s", i, ty ? " (type '" : "", ty ? ty : "", ty ? "')" : "", err);
            json_decref(out);
            return NULL;
        }
        /* keys in OpenAI's order: templates print the tools as JSON */
        json_t *fn = json_pack("{s:O}", "name", name);
        if (desc) json_object_set(fn, "description", desc);
        json_object_set(fn, "parameters", schema);
        json_array_append_new(out, json_pack("{s:s, s:o}", "type", "function", "function", fn));
    }
    return out;
}

typedef enum { CHOICE_AUTO, CHOICE_NONE, CHOICE_ANY, CHOICE_TOOL } tool_choice;

static int parse_tool_choice(json_t *req, json_t *tools, tool_choice *out, const char **name, srv_error *e) {
    json_t *tc = json_object_get(req, "tool_choice");
    *out = CHOICE_AUTO;
    *name = NULL;
    if (!tc || json_is_null(tc)) return 0;
    const char *ty = json_is_object(tc) ? json_string_value(json_object_get(tc, "type")) : NULL;
    if (!ty) return BAD(e, "tool_choice", "'tool_choice' must be an object with a string 'type' (auto, any, tool, none)");
    if (!strcmp(ty, "auto")) *out = CHOICE_AUTO;
    else if (!strcmp(ty, "none")) *out = CHOICE_NONE;
    else if (!strcmp(ty, "any")) *out = CHOICE_ANY;
    else if (!strcmp(ty, "tool")) *out = CHOICE_TOOL;
    else return BAD(e, "tool_choice", "tool_choice.type '%.40s' is not one of auto, any, tool, none", ty);
    if (*out >= CHOICE_ANY && json_array_size(tools) == 0)
        return BAD(e, "tool_choice", "tool_choice '%s' needs 'tools'", ty);
    if (*out == CHOICE_TOOL) {
        *name = json_string_value(json_object_get(tc, "name"));
        if (!*name) return BAD(e, "tool_choice", "tool_choice 'tool' needs a string 'name'");
        size_t i;
        json_t *t;
        int found = 0;
        json_array_foreach(tools, i, t) found |= !strcmp(json_string_value(json_object_get(t, "name")), *name);
        if (!found) return BAD(e, "tool_choice", "tool_choice names '%.64s', which is not in 'tools'", *name);
    }
    return 0;
}

/* thinking: {"type": "enabled", "budget_tokens": N} | {"type": "disabled"}; 1 = on. */
static int parse_thinking(json_t *req, int *on, srv_error *e) {
    json_t *t = json_object_get(req, "thinking");
    *on = 0;
    if (!t || json_is_null(t)) return 0;
    const char *ty = json_is_object(t) ? json_string_value(json_object_get(t, "type")) : NULL;
    if (!ty || (strcmp(ty, "enabled") && strcmp(ty, "disabled")))
        return BAD(e, "thinking", "'thinking' must be {\"type\": \"enabled\", \"budget_tokens\": N} or {\"type\": \"disabled\"}");
    *on = !strcmp(ty, "enabled");
    json_t *bt = json_object_get(t, "budget_tokens");
    if (*on && (!json_is_integer(bt) || json_integer_value(bt) < 1))
        return BAD(e, "thinking", "thinking.budget_tokens must be a positive integer");
    return 0;
}

/* The request's sampling fields under their OpenAI names, for srv_parse_opts. */
static json_t *openai_opts(json_t *req, int need_max_tokens, srv_error *e) {
    json_t *o = json_object();
    static const char *same[] = {"model", "max_tokens", "temperature", "top_p", "top_k", "stream"};
    for (size_t i = 0; i < sizeof same / sizeof same[0]; i++) {
        json_t *v = json_object_get(req, same[i]);
        if (v) json_object_set(o, same[i], v);
    }
    json_t *mt = json_object_get(req, "max_tokens");
    if (need_max_tokens && (!mt || json_is_null(mt))) {
        json_decref(o);
        BAD(e, "max_tokens", "max_tokens: Field required");
        return NULL;
    }
    if (!need_max_tokens) {
        json_object_del(o, "max_tokens");
        json_object_del(o, "stream");
    }
    json_t *ss = json_object_get(req, "stop_sequences");
    if (ss && !json_is_null(ss)) {
        size_t i;
        json_t *v;
        int ok = json_is_array(ss);
        if (ok) json_array_foreach(ss, i, v) ok &= json_is_string(v);
        if (!ok) {
            json_decref(o);
            BAD(e, "stop_sequences", "'stop_sequences' must be an array of strings");
            return NULL;
        }
        json_object_set(o, "stop", ss);
    }
    return o;
}

/* tool_choice any / tool as the OpenAI request fields srv_structured_setup reads:
 * tools (OpenAI form), tool_choice "required" or the named function, and
 * parallel_tool_calls (false with `tool`, and with disable_parallel_tool_use). */
static json_t *forced_tools_request(json_t *req, json_t *tools, tool_choice c, const char *name, srv_error *e) {
    json_t *tc = json_object_get(req, "tool_choice"), *dp = json_object_get(tc, "disable_parallel_tool_use");
    if (dp && !json_is_null(dp) && !json_is_boolean(dp)) {
        BAD(e, "tool_choice", "tool_choice.disable_parallel_tool_use must be a boolean");
        return NULL;
    }
    json_t *o = json_pack("{s:O, s:b}", "tools", tools, "parallel_tool_calls", !(c == CHOICE_TOOL || json_is_true(dp)));
    if (!o) return NULL;
    json_object_set_new(o, "tool_choice", c == CHOICE_ANY ? json_string("required")
                                                          : json_pack("{s:s, s:{s:s}}", "type", "function", "function", "name", name));
    return o;
}

typedef struct rendered {
    char *text;
    size_t len;
    int32_t *ids;
    size_t n;
    int opens_think;
    json_t *forced;  /* tool_choice any / tool: the OpenAI fields of the enforced call (else NULL) */
} rendered;

/* The request translated, rendered and tokenized; `g` (may be NULL: count_tokens)
 * gets the tool-call and thinking settings. */
static int render(srv_server *s, json_t *req, srv_gen *g, rendered *out, srv_error *e) {
    memset(out, 0, sizeof *out);
    json_t *vars = json_object(), *tools = NULL;
    int rc = -1, think = 0;
    json_t *msgs = convert_messages(req, e);
    if (!msgs) goto done;
    json_object_set_new(vars, "messages", msgs);
    json_t *rt = json_object_get(req, "tools");
    if (rt && !json_is_null(rt) && !(tools = convert_tools(rt, e))) goto done;
    tool_choice choice;
    const char *tool_name;
    if (parse_tool_choice(req, rt, &choice, &tool_name, e) || parse_thinking(req, &think, e)) goto done;
    if (think && choice >= CHOICE_ANY) {
        BAD(e, "tool_choice", "tool_choice 'any' and 'tool' cannot be combined with thinking (as in Anthropic's API)");
        goto done;
    }
    if (json_array_size(tools)) json_object_set(vars, "tools", tools);
    json_object_set_new(vars, "add_generation_prompt", json_true());
    json_object_set_new(vars, "enable_thinking", json_boolean(think));
    qd_err err;
    qd_err_clear(&err);
    if (qd_chat_template_render_json(s->tpl, vars, &k_limits, &out->text, &out->len, &err) != QD_OK) {
        BAD(e, "messages", "chat template: %s", err.msg);
        goto done;
    }
    size_t n = out->len;
    while (n && isspace((unsigned char)out->text[n - 1])) n--;
    out->opens_think = n >= 7 && !memcmp(out->text + n - 7, "<think>", 7);
    if (choice >= CHOICE_ANY && !(out->forced = forced_tools_request(req, tools, choice, tool_name, e))) goto done;
    if (qd_tokenizer_encode(s->tok, out->text, out->len, 0, &out->ids, &out->n, &err) != QD_OK) {
        BAD(e, "messages", "tokenizer: %s", err.msg);
        goto done;
    }
    if (g) {
        g->toolcap.enabled = json_array_size(tools) > 0 && choice != CHOICE_NONE;
        g->think.enabled = 1;
        if (out->opens_think) g->think.in_think = g->think.saw_tag = 1;
        g->tools = json_incref(tools); /* to type the calls' XML values by input_schema */
    }
    rc = 0;
done:
    json_decref(vars);
    json_decref(tools);
    return rc;
}

static void rendered_free(rendered *r) {
    free(r->text);
    free(r->ids);
    json_decref(r->forced);
}

void srv_route_messages(srv_server *s, json_t *req, srv_reply *r) {
    srv_error e;
    rendered rd = {0};
    json_t *oo = NULL;
    srv_gen *g = srv_gen_new(s, SRV_MESSAGES);
    if (!g) { srv_fail(&e, 500, "api_error", NULL, "out of memory"); goto fail; }
    if (!(oo = openai_opts(req, 1, &e))) goto fail;
    if (srv_parse_opts(s, oo, SRV_MESSAGES, &g->o, &e)) goto fail;
    if (render(s, req, g, &rd, &e)) goto fail;
    size_t n = rd.n > (size_t)1 << 30 ? (size_t)1 << 30 : rd.n;
    if (srv_check_length(s, (int)n, &g->o, &e)) goto fail;
    /* tool_choice any / tool: the grammar of the call (thinking is refused with them,
     * so it applies from the first token) */
    if (rd.forced && srv_structured_setup(s, rd.forced, SRV_CHAT, rd.text, 0, &g->o.rp.constraint, &e)) goto fail;
    if (srv_gen_submit(g, rd.ids, (int)n, &e)) goto fail;
    r->status = 200;
    r->gen = g;
    r->content_type = g->o.stream ? "text/event-stream" : "application/json";
    json_decref(oo);
    rendered_free(&rd);
    return;
fail:
    srv_reply_error_anthropic(r, &e);
    if (g) srv_gen_unref(g);
    json_decref(oo);
    rendered_free(&rd);
}

void srv_route_count_tokens(srv_server *s, json_t *req, srv_reply *r) {
    srv_error e;
    rendered rd = {0};
    srv_opts o;
    json_t *oo = openai_opts(req, 0, &e);
    int bad = !oo || srv_parse_opts(s, oo, SRV_MESSAGES, &o, &e) || render(s, req, NULL, &rd, &e);
    if (oo) srv_opts_free(&o);
    json_decref(oo);
    if (bad) {
        srv_reply_error_anthropic(r, &e);
    } else {
        json_t *j = json_pack("{s:i}", "input_tokens", (json_int_t)rd.n);
        r->status = 200;
        r->body = json_dumps(j, JSON_COMPACT);
        r->content_type = "application/json";
        json_decref(j);
    }
    rendered_free(&rd);
}
