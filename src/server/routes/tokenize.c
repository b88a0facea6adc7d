/* POST /tokenize, /detokenize and GET /tokenizer_info, in vLLM's shape: what a client needs
 * to count, cut or build prompts with the server's own tokenizer and chat template
 * (lm-evaluation-harness's remote tokenizer uses all three instead of loading a tokenizer
 * of its own). */
#include <stdlib.h>
#include <string.h>

#include "server/server.h"

static void reply_json(srv_reply *r, json_t *o) {
    r->status = 200;
    r->body = o ? json_dumps(o, JSON_COMPACT) : NULL;
    r->content_type = "application/json";
    json_decref(o);
    if (!r->body) {
        srv_error e;
        srv_fail(&e, 500, "internal_error", NULL, "out of memory");
        srv_reply_error(r, &e);
    }
}

/* {"prompt": text} or {"messages": [...], "add_generation_prompt": true, "tools": ...,
 * "chat_template_kwargs": ...} -> {"count", "max_model_len", "tokens"} (with
 * "return_token_strs": each token's text too). */
void srv_route_tokenize(srv_server *s, json_t *req, srv_reply *r) {
    srv_error e;
    int32_t *ids = NULL;
    size_t n = 0;
    int gen_prompt = 1, strs = 0, special = 1;
    json_t *prompt = json_object_get(req, "prompt"), *msgs = json_object_get(req, "messages");
    qd_err err;
    qd_err_clear(&err);
    if (srv_check_model(s, req, &e) || srv_get_bool(req, "add_generation_prompt", &gen_prompt, &e) < 0 ||
        srv_get_bool(req, "return_token_strs", &strs, &e) < 0 ||
        srv_get_bool(req, "add_special_tokens", &special, &e) < 0)
        goto fail;
    if (!prompt == !msgs) {
        srv_fail(&e, 400, "invalid_request_error", prompt ? "prompt" : "messages",
                 "give either 'prompt' (a string) or 'messages' (a chat), not %s", prompt ? "both" : "neither");
        goto fail;
    }
    if (msgs) {
        if (srv_chat_tokens(s, req, gen_prompt, &ids, &n, &e)) goto fail;
    } else if (!json_is_string(prompt)) {
        srv_fail(&e, 400, "invalid_request_error", "prompt", "'prompt' must be a string");
        goto fail;
    } else if (qd_tokenizer_encode(s->tok, json_string_value(prompt), json_string_length(prompt), special, &ids, &n,
                                   &err) != QD_OK) {
        srv_fail(&e, 400, "invalid_request_error", "prompt", "tokenizer: %s", err.msg);
        goto fail;
    }
    json_t *toks = json_array(), *texts = strs ? json_array() : json_null();
    for (size_t i = 0; i < n; i++) {
        json_array_append_new(toks, json_integer(ids[i]));
        if (strs) json_array_append_new(texts, srv_token_json(s, ids[i], NULL));
    }
    reply_json(r, json_pack("{s:I, s:i, s:o, s:o}", "count", (json_int_t)n, "max_model_len",
                            s->cfg.engine.max_model_len, "tokens", toks, "token_strs", texts));
    free(ids);
    return;
fail:
    srv_reply_error(r, &e);
    free(ids);
}

/* {"tokens": [ids]} -> {"prompt": text}. */
void srv_route_detokenize(srv_server *s, json_t *req, srv_reply *r) {
    srv_error e;
    json_t *t = json_object_get(req, "tokens");
    int32_t *ids = NULL;
    char *text = NULL;
    size_t len = 0;
    qd_err err;
    qd_err_clear(&err);
    if (srv_check_model(s, req, &e)) goto fail;
    if (!json_is_array(t)) {
        srv_fail(&e, 400, "invalid_request_error", "tokens", "'tokens' must be a list of token ids");
        goto fail;
    }
    const size_t n = json_array_size(t);
    if (!(ids = malloc(sizeof *ids * (n ? n : 1)))) {
        srv_fail(&e, 500, "internal_error", NULL, "out of memory");
        goto fail;
    }
    for (size_t i = 0; i < n; i++) {
        json_t *v = json_array_get(t, i);
        const json_int_t x = json_is_integer(v) ? json_integer_value(v) : -1;
        if (x < 0 || x >= s->vocab_limit) {
            srv_fail(&e, 400, "invalid_request_error", "tokens", "tokens[%zu] is not a token id in [0, %d)", i,
                     s->vocab_limit);
            goto fail;
        }
        ids[i] = (int32_t)x;
    }
    if (qd_tokenizer_decode(s->tok, ids, n, 0, &text, &len, &err) != QD_OK) {
        srv_fail(&e, 400, "invalid_request_error", "tokens", "tokenizer: %s", err.msg);
        goto fail;
    }
    /* bytes that are not UTF-8 (a character cut between tokens) as U+FFFD, as the JSON needs */
    size_t vn = 0;
    char *valid = qd_utf8_lossy((const unsigned char *)text, len, &vn);
    json_t *str = valid ? json_stringn(valid, vn) : NULL;
    reply_json(r, str ? json_pack("{s:o}", "prompt", str) : NULL);
    free(valid);
    free(text);
    free(ids);
    return;
fail:
    srv_reply_error(r, &e);
    free(text);
    free(ids);
}

/* A special token's text as JSON (null when there is none). */
static json_t *token_text(const srv_server *s, int32_t id) {
    size_t n = 0;
    return id >= 0 && qd_tokenizer_token_bytes(s->tok, id, &n) ? srv_token_json(s, id, NULL) : json_null();
}

/* {"eos_token", "pad_token", "bos_token", "chat_template", "model_max_length", "vocab_size"}:
 * the end-of-text token is the tokenizer's own (tokenizer_config.json), else the model's
 * first EOS id. */
void srv_route_tokenizer_info(srv_server *s, srv_reply *r) {
    const int32_t eos = qd_tokenizer_eos_id(s->tok) >= 0 ? qd_tokenizer_eos_id(s->tok) : s->n_eos > 0 ? s->eos[0] : -1;
    size_t tl = 0;
    const char *tpl = s->tpl ? qd_chat_template_source(s->tpl, &tl) : NULL;
    reply_json(r, json_pack("{s:o, s:o, s:n, s:o, s:i, s:i}", "eos_token", token_text(s, eos), "pad_token",
                            token_text(s, qd_tokenizer_pad_id(s->tok)), "bos_token", "chat_template",
                            tpl ? json_stringn(tpl, tl) : json_null(), "model_max_length",
                            s->cfg.engine.max_model_len, "vocab_size", s->vocab_limit));
}
