/* Validation of the OpenAI request fields shared by /v1/chat/completions and
 * /v1/completions. Wrong types and out-of-range values are 400s naming the field;
 * unknown fields are ignored (as OpenAI and vLLM do), but a known field whose meaning
 * this server does not carry out is refused by name (unsupported_field), since
 * ignoring it would change the answer without a word. Unset sampling fields take the
 * checkpoint's generation_config.json defaults, the way vLLM serves by default. */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "runtime/sampler.h"
#include "server/server.h"

void srv_opts_free(srv_opts *o) {
    for (int i = 0; i < o->n_stops; i++) free(o->stops[i]);
    o->n_stops = 0;
}

/* 1 = set, 0 = absent or null, -1 = wrong type (e set). */
static int get_num(json_t *req, const char *key, double *out, srv_error *e) {
    json_t *v = json_object_get(req, key);
    if (!v || json_is_null(v)) return 0;
    if (!json_is_number(v)) return srv_fail(e, 400, "invalid_request_error", key, "'%s' must be a number", key);
    *out = json_number_value(v);
    return 1;
}

static int get_int(json_t *req, const char *key, long long *out, srv_error *e) {
    json_t *v = json_object_get(req, key);
    if (!v || json_is_null(v)) return 0;
    /* 3.0 is accepted as 3 (Python clients may send floats), 3.5 is not; a float past
     * the range of long long is no integer we could hold (and converting it is undefined) */
    if (json_is_real(v)) {
        const double d = json_real_value(v);
        if (d > -9e18 && d < 9e18 && d == (double)(long long)d) {
            *out = (long long)d;
            return 1;
        }
    }
    if (!json_is_integer(v)) return srv_fail(e, 400, "invalid_request_error", key, "'%s' must be an integer", key);
    *out = json_integer_value(v);
    return 1;
}

int srv_get_bool(json_t *req, const char *key, int *out, srv_error *e) {
    json_t *v = json_object_get(req, key);
    if (!v || json_is_null(v)) return 0;
    if (!json_is_boolean(v)) return srv_fail(e, 400, "invalid_request_error", key, "'%s' must be a boolean", key);
    *out = json_is_true(v);
    return 1;
}

static int add_stop(srv_opts *o, json_t *v, srv_error *e) {
    if (!json_is_string(v)) return srv_fail(e, 400, "invalid_request_error", "stop", "'stop' must be a string or a list of strings");
    size_t n = json_string_length(v);
    if (n == 0) return 0; /* an empty stop string can never be meant: ignore it */
    if (n > QD_STOP_MAX_LEN)
        return srv_fail(e, 400, "invalid_request_error", "stop", "stop strings are limited to %d bytes", QD_STOP_MAX_LEN);
    if (o->n_stops == QD_STOP_MAX_STRINGS)
        return srv_fail(e, 400, "invalid_request_error", "stop", "at most %d stop strings", QD_STOP_MAX_STRINGS);
    if (memchr(json_string_value(v), 0, n))
        return srv_fail(e, 400, "invalid_request_error", "stop", "stop strings must not contain NUL");
    o->stops[o->n_stops] = strdup(json_string_value(v));
    if (!o->stops[o->n_stops]) return srv_fail(e, 500, "internal_error", NULL, "out of memory");
    o->n_stops++;
    return 0;
}

/* logit_bias: {"token id": bias in [-100, 100]} (OpenAI's shape: keys are decimal ids). */
static int parse_logit_bias(srv_server *s, json_t *v, qd_request_params *rp, srv_error *e) {
    if (!json_is_object(v))
        return srv_fail(e, 400, "invalid_request_error", "logit_bias", "'logit_bias' must be an object of token id -> bias");
    if (json_object_size(v) > QD_MAX_LOGIT_BIAS)
        return srv_fail(e, 400, "invalid_request_error", "logit_bias", "'logit_bias' has %zu entries, at most %d",
                        json_object_size(v), QD_MAX_LOGIT_BIAS);
    const int vocab = s->vocab_limit > 0 ? s->vocab_limit : qd_model_vocab_size(s->model);
    const char *k;
    json_t *b;
    json_object_foreach(v, k, b) {
        char *end = NULL;
        long id = strtol(k, &end, 10);
        if (!*k || *end || id < 0 || id >= vocab)
            return srv_fail(e, 400, "invalid_request_error", "logit_bias",
                            "logit_bias key '%.40s' is not a token id in [0, %d)", k, vocab);
        if (!json_is_number(b) || !(json_number_value(b) >= -100 && json_number_value(b) <= 100))
            return srv_fail(e, 400, "invalid_request_error", "logit_bias",
                            "logit_bias of token %ld must be a number in [-100, 100]", id);
        rp->logit_bias[rp->n_logit_bias++] = (qd_logit_bias){.id = (int32_t)id, .bias = (float)json_number_value(b)};
    }
    return 0;
}

static int parse_stop_token_ids(srv_server *s, json_t *v, qd_request_params *rp, srv_error *e) {
    if (!json_is_array(v))
        return srv_fail(e, 400, "invalid_request_error", "stop_token_ids", "'stop_token_ids' must be an array of token ids");
    if (json_array_size(v) > QD_MAX_STOP_TOKEN_IDS)
        return srv_fail(e, 400, "invalid_request_error", "stop_token_ids", "'stop_token_ids' has %zu entries, at most %d",
                        json_array_size(v), QD_MAX_STOP_TOKEN_IDS);
    const int vocab = qd_model_vocab_size(s->model);
    size_t i;
    json_t *t;
    json_array_foreach(v, i, t) {
        if (!json_is_integer(t) || json_integer_value(t) < 0 || json_integer_value(t) >= vocab)
            return srv_fail(e, 400, "invalid_request_error", "stop_token_ids",
                            "stop_token_ids[%zu] must be a token id in [0, %d)", i, vocab);
        rp->stop_token_ids[rp->n_stop_token_ids++] = (int32_t)json_integer_value(t);
    }
    return 0;
}

/* The OpenAI fields that would change the answer and are not carried out here: 0, or
 * -1 with a 400 naming the field. `n` is the request's number of choices. */
static int unsupported_field(json_t *req, srv_kind kind, long long n, srv_error *e) {
    json_t *v;
    if (kind == SRV_COMPLETION) {
        v = json_object_get(req, "suffix");
        if (v && !json_is_null(v) && !(json_is_string(v) && json_string_length(v) == 0))
            return srv_fail(e, 400, "invalid_request_error", "suffix",
                            "'suffix' (text after the completion, fill-in-the-middle) is not supported");
        v = json_object_get(req, "best_of");
        if (v && !json_is_null(v) && !(json_is_integer(v) && json_integer_value(v) == n))
            return srv_fail(e, 400, "invalid_request_error", "best_of",
                            "'best_of' is not supported (choices are not ranked: ask for 'n' of them)");
    }
    if (kind == SRV_CHAT) {
        static const char *const legacy[] = {"functions", "function_call"};
        for (int i = 0; i < 2; i++)
            if ((v = json_object_get(req, legacy[i])) && !json_is_null(v))
                return srv_fail(e, 400, "invalid_request_error", legacy[i],
                                "'%s' is the deprecated form of 'tools' / 'tool_choice', which this server does not "
                                "read: send each function as a tool {\"type\": \"function\", \"function\": {...}}",
                                legacy[i]);
        size_t i;
        json_array_foreach(json_object_get(req, "modalities"), i, v) {
            if (!json_is_string(v) || strcmp(json_string_value(v), "text"))
                return srv_fail(e, 400, "invalid_request_error", "modalities",
                                "'modalities' may hold only \"text\": this server generates text only");
        }
        if ((v = json_object_get(req, "audio")) && !json_is_null(v))
            return srv_fail(e, 400, "invalid_request_error", "audio", "'audio' output is not supported (text only)");
    }
    return 0;
}

int srv_check_model(const srv_server *s, json_t *req, srv_error *e) {
    json_t *model = json_object_get(req, "model");
    if (!model || json_is_null(model)) return 0;
    if (!json_is_string(model)) return srv_fail(e, 400, "invalid_request_error", "model", "'model' must be a string");
    if (strcmp(json_string_value(model), s->cfg.model_name) != 0) {
        srv_fail(e, 404, "NotFoundError", "model", "The model `%.200s` does not exist; this server serves `%s`.",
                 json_string_value(model), s->cfg.model_name);
        e->code = "model_not_found";
        return -1;
    }
    return 0;
}

int srv_parse_opts(srv_server *s, json_t *req, srv_kind kind, srv_opts *o, srv_error *e) {
    memset(o, 0, sizeof *o);
    o->kind = kind;
    qd_sampling_params *sp = &o->rp.sampling;
    *sp = qd_sampling_default_params();
    const qd_generation_defaults *d = &s->gen_defaults;
    if (d->do_sample) {
        sp->temperature = d->temperature;
        if (d->top_p > 0) sp->top_p = d->top_p;
        if (d->top_k > 0) sp->top_k = d->top_k;
    } else {
        sp->temperature = 0.0f;
    }
    if (d->repetition_penalty > 0) sp->repetition_penalty = d->repetition_penalty;
    sp->vocab_limit = s->vocab_limit;

    if (srv_check_model(s, req, e)) return -1;
    double x = 0;
    long long n = 0;
    int r, b = 0;
    if ((r = get_int(req, "n", &n, e)) < 0) return -1;
    o->n = 1;
    if (r && kind == SRV_MESSAGES && n != 1)
        return srv_fail(e, 400, "invalid_request_error", "n", "'n' is not a field of the Messages API (one reply per request)");
    if (r && (n < 1 || n > SRV_MAX_N))
        return srv_fail(e, 400, "invalid_request_error", "n", "'n' must be in [1, %d], got %lld", SRV_MAX_N, n);
    if (r) o->n = (int)n;
    if (unsupported_field(req, kind, o->n, e)) return -1;
    if ((r = srv_get_bool(req, "stream", &b, e)) < 0) return -1;
    if (r) o->stream = b;
    json_t *so = json_object_get(req, "stream_options");
    if (so && !json_is_null(so)) {
        if (!json_is_object(so)) return srv_fail(e, 400, "invalid_request_error", "stream_options", "'stream_options' must be an object");
        if ((r = srv_get_bool(so, "include_usage", &b, e)) < 0) return -1;
        if (r) o->include_usage = b;
    }
    for (int k = 0; k < 2; k++) {
        const char *key = k ? "max_completion_tokens" : "max_tokens";
        if ((r = get_int(req, key, &n, e)) < 0) return -1;
        if (!r) continue;
        /* completions take 0 with echo (checked below): the prompt and its logprobs alone */
        if (n < (kind == SRV_COMPLETION ? 0 : 1))
            return srv_fail(e, 400, "invalid_request_error", key, "'%s' must be at least %d, got %lld", key,
                            kind == SRV_COMPLETION ? 0 : 1, n);
        o->rp.max_tokens = n > (1 << 30) ? (1 << 30) : (int)n;
        o->max_tokens_set = 1;
    }
    if ((r = get_num(req, "temperature", &x, e)) < 0) return -1;
    if (r) sp->temperature = (float)x;
    if ((r = get_num(req, "top_p", &x, e)) < 0) return -1;
    if (r) sp->top_p = (float)x;
    if ((r = get_int(req, "top_k", &n, e)) < 0) return -1;
    if (r) {
        /* vLLM: -1 (and 0) mean no top-k */
        if (n < -1 || n > (1 << 30)) return srv_fail(e, 400, "invalid_request_error", "top_k", "'top_k' must be -1, 0 or positive");
        sp->top_k = n <= 0 ? 0 : (int)n;
    }
    if ((r = get_num(req, "min_p", &x, e)) < 0) return -1;
    if (r) sp->min_p = (float)x;
    if ((r = get_num(req, "presence_penalty", &x, e)) < 0) return -1;
    if (r) sp->presence_penalty = (float)x;
    if ((r = get_num(req, "frequency_penalty", &x, e)) < 0) return -1;
    if (r) sp->frequency_penalty = (float)x;
    if ((r = get_num(req, "repetition_penalty", &x, e)) < 0) return -1;
    if (r) sp->repetition_penalty = (float)x;
    if ((r = get_int(req, "seed", &n, e)) < 0) return -1;
    if (r) {
        sp->seed = (uint64_t)n;
    } else {
        /* no seed: a different one per request so that sampling varies */
        uint64_t c = __atomic_add_fetch(&s->seed_counter, 1, __ATOMIC_RELAXED);
        sp->seed = ((uint64_t)time(NULL) << 20) ^ (c * 0x9E3779B97F4A7C15ull);
    }
    if ((r = srv_get_bool(req, "ignore_eos", &b, e)) < 0) return -1;
    if (r) o->rp.ignore_eos = b;

    json_t *lb = json_object_get(req, "logit_bias");
    if (lb && !json_is_null(lb) && parse_logit_bias(s, lb, &o->rp, e)) return -1;
    json_t *sti = json_object_get(req, "stop_token_ids");
    if (sti && !json_is_null(sti) && parse_stop_token_ids(s, sti, &o->rp, e)) return -1;
    if ((r = get_int(req, "min_tokens", &n, e)) < 0) return -1;
    if (r) {
        if (n < 0 || n > (1 << 30)) return srv_fail(e, 400, "invalid_request_error", "min_tokens", "'min_tokens' must be >= 0");
        o->rp.min_tokens = (int)n;
    }

    json_t *stop = json_object_get(req, "stop");
    if (stop && !json_is_null(stop)) {
        if (json_is_array(stop)) {
            size_t i;
            json_t *v;
            json_array_foreach(stop, i, v) if (add_stop(o, v, e)) return -1;
        } else if (add_stop(o, stop, e)) {
            return -1;
        }
    }

    if (kind == SRV_CHAT) {
        if ((r = srv_get_bool(req, "logprobs", &b, e)) < 0) return -1;
        if (r) o->logprobs = b;
        if ((r = get_int(req, "top_logprobs", &n, e)) < 0) return -1;
        if (r) {
            if (n < 0 || n > QD_MAX_LOGPROBS)
                return srv_fail(e, 400, "invalid_request_error", "top_logprobs", "'top_logprobs' must be in [0, %d]", QD_MAX_LOGPROBS);
            if (n > 0 && !o->logprobs)
                return srv_fail(e, 400, "invalid_request_error", "top_logprobs", "'top_logprobs' needs 'logprobs': true");
            o->top_logprobs = (int)n;
        }
    } else {
        if ((r = get_int(req, "logprobs", &n, e)) < 0) return -1;
        if (r) {
            if (n < 0 || n > QD_MAX_LOGPROBS)
                return srv_fail(e, 400, "invalid_request_error", "logprobs", "'logprobs' must be in [0, %d]", QD_MAX_LOGPROBS);
            o->logprobs = 1;
            o->top_logprobs = (int)n;
        }
        if ((r = srv_get_bool(req, "echo", &b, e)) < 0) return -1;
        if (r) o->echo = b;
        if (o->max_tokens_set && o->rp.max_tokens == 0 && !o->echo)
            return srv_fail(e, 400, "invalid_request_error", "max_tokens",
                            "'max_tokens' 0 returns nothing without 'echo': true (then the prompt, with its logprobs "
                            "when 'logprobs' is set)");
        /* echo with logprobs gives the prompt's own (OpenAI; how lm-evaluation-harness scores
         * text); a prompt-only request is one of them for the engine either way */
        o->rp.prompt_logprobs = o->echo && (o->logprobs || (o->max_tokens_set && o->rp.max_tokens == 0));
    }
    sp->n_logprobs = o->top_logprobs;
    /* vLLM's extension: tokens in logprobs as their ids, which text cannot always tell
     * apart (partial UTF-8 sequences); used by bench/invariance.py */
    if ((r = srv_get_bool(req, "return_tokens_as_token_ids", &b, e)) < 0) return -1;
    if (r) o->token_ids = b;
    qd_err err;
    qd_err_clear(&err);
    if (qd_sampling_params_validate(sp, qd_model_vocab_size(s->model), &err) != QD_OK)
        return srv_fail(e, 400, "invalid_request_error", NULL, "%s", err.msg);
    return 0;
}

/* Completions stop at 16 tokens unless told otherwise, as OpenAI's legacy API and vLLM do (a
 * raw continuation has no end of turn to stop at); a chat's reply ends itself, so it may
 * take the rest of the context. */
#define COMPLETIONS_DEFAULT_MAX_TOKENS 16

int srv_default_max_tokens(const srv_server *s, const srv_opts *o, int n_prompt) {
    const int rest = s->cfg.engine.max_model_len - n_prompt;
    return o->kind == SRV_COMPLETION && rest > COMPLETIONS_DEFAULT_MAX_TOKENS ? COMPLETIONS_DEFAULT_MAX_TOKENS : rest;
}

int srv_check_length(srv_server *s, int n_prompt, srv_opts *o, srv_error *e) {
    const int ctx = s->cfg.engine.max_model_len;
    if (n_prompt < 1) return srv_fail(e, 400, "invalid_request_error", "prompt", "the prompt is empty");
    if (n_prompt >= ctx)
        return srv_fail(e, 400, "invalid_request_error", "messages",
                        "This model's maximum context length is %d tokens. However, your request has %d input tokens. "
                        "Please reduce the length of the input.", ctx, n_prompt);
    if (o->max_tokens_set && o->rp.min_tokens > o->rp.max_tokens)
        return srv_fail(e, 400, "invalid_request_error", "min_tokens", "'min_tokens' (%d) is larger than 'max_tokens' (%d)",
                        o->rp.min_tokens, o->rp.max_tokens);
    if (!o->max_tokens_set) {
        o->rp.max_tokens = srv_default_max_tokens(s, o, n_prompt);
    } else if ((long long)n_prompt + o->rp.max_tokens > ctx) {
        return srv_fail(e, 400, "invalid_request_error", "max_tokens",
                        "This model's maximum context length is %d tokens. However, you requested %lld tokens "
                        "(%d in the prompt, %d in the completion). Please reduce the length of the input or the "
                        "completion.", ctx, (long long)n_prompt + o->rp.max_tokens, n_prompt, o->rp.max_tokens);
    }
    return 0;
}
