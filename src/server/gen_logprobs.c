/* A generation's logprobs in the endpoints' shapes (gen.c calls these under the lead's
 * lock): each token's as it comes (a stream's formatted when its chunk is built), and the
 * completions echo's prompt, its text and the logprobs of its tokens. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/gen_logprobs.h"

/* A token as logprobs name it: its text, or "token_id:N" when the request asked so. */
static json_t *lp_token(const srv_gen *g, int32_t id, json_t **bytes) {
    json_t *t = srv_token_json(g->srv, id, bytes);
    if (!g->o.token_ids) return t;
    json_decref(t);
    char buf[32];
    snprintf(buf, sizeof buf, "token_id:%d", (int)id);
    return json_string(buf);
}

static json_t *chat_lp_entry(const srv_gen *g, int32_t id, float lp) {
    json_t *bytes;
    json_t *tok = lp_token(g, id, &bytes);
    return json_pack("{s:o, s:f, s:o}", "token", tok, "logprob", (double)lp, "bytes", bytes);
}

/* Records one token's logprobs into `*dst` (created on first use) in the endpoint's shape:
 * chat: {"content": [{token, logprob, bytes, top_logprobs}]};
 * completions: {tokens, token_logprobs, top_logprobs, text_offset}, where the prompt's
 * first token (none) has null for its logprob and alternatives, as OpenAI gives it. */
static void add_logprobs(srv_gen *g, json_t **dst, const qd_sample_result *r, size_t at, int none) {
    if (g->kind == SRV_CHAT) {
        if (!*dst) *dst = json_pack("{s:[]}", "content");
        json_t *e = chat_lp_entry(g, r->token, r->logprob);
        json_t *top = json_array();
        for (int i = 0; i < r->n_top && i < g->o.top_logprobs; i++)
            json_array_append_new(top, chat_lp_entry(g, r->top[i].id, r->top[i].logprob));
        json_object_set_new(e, "top_logprobs", top);
        json_array_append_new(json_object_get(*dst, "content"), e);
    } else {
        if (!*dst) *dst = json_pack("{s:[], s:[], s:[], s:[]}", "tokens", "token_logprobs", "top_logprobs", "text_offset");
        json_array_append_new(json_object_get(*dst, "tokens"), lp_token(g, r->token, NULL));
        json_array_append_new(json_object_get(*dst, "token_logprobs"), none ? json_null() : json_real(r->logprob));
        json_t *top = none ? json_null() : json_object();
        for (int i = 0; i < r->n_top && i < g->o.top_logprobs; i++) {
            json_t *t = lp_token(g, r->top[i].id, NULL);
            json_object_set_new(top, json_string_value(t), json_real(r->top[i].logprob));
            json_decref(t);
        }
        json_array_append_new(json_object_get(*dst, "top_logprobs"), top);
        json_array_append_new(json_object_get(*dst, "text_offset"), json_integer((json_int_t)at));
    }
}

/* Where the next token's text starts (completions' text_offset): the echoed prompt, then
 * the completion; for a stream, the bytes sent so far and those gathered for its next chunk. */
static size_t text_at(const srv_gen *g) {
    return g->o.stream ? (g->sent_role ? 0 : g->echo_text.n) + g->text_offset + g->dcontent.n
                       : g->echo_text.n + g->content.n;
}

/* A token's logprobs, its text starting at `at`: a stream keeps the sample for the chunk
 * that carries it (formatted off the engine's threads, srv_gen_format_logprobs), a whole response
 * adds them at once. */
static void take_logprobs_at(srv_gen *g, const qd_sample_result *r, size_t at, int none) {
    if (!g->o.stream) {
        add_logprobs(g, &g->lp, r, at, none);
        return;
    }
    if (g->n_plp == g->cap_plp) {
        const int cap = g->cap_plp ? 2 * g->cap_plp : 8;
        srv_lp_pending *p = realloc(g->plp, sizeof *p * (size_t)cap);
        if (!p) { /* out of memory: format it now instead */
            add_logprobs(g, &g->dlp, r, at, none);
            return;
        }
        g->plp = p;
        g->cap_plp = cap;
    }
    g->plp[g->n_plp++] = (srv_lp_pending){.r = *r, .at = at, .none = none};
}

void srv_gen_take_logprobs(srv_gen *g, const qd_sample_result *r) { take_logprobs_at(g, r, text_at(g), 0); }

void srv_gen_format_logprobs(srv_gen *g) {
    for (int i = 0; i < g->n_plp; i++) add_logprobs(g, &g->dlp, &g->plp[i].r, g->plp[i].at, g->plp[i].none);
    g->n_plp = 0;
}

/* An event's prompt logprobs, kept until the choice's logprobs begin (srv_gen_take_prompt_logprobs).
 * Without memory for them the prompt's entries end where they were lost. */
void srv_gen_keep_prompt_logprobs(srv_gen *g, const qd_engine_event *ev) {
    if (!srv_gen_head(g)->echo_off || g->plr_taken || ev->prompt_lp_at != g->n_plr + 1) return;
    if (!g->plr && g->prompt_tokens > 1 && !(g->plr = malloc(sizeof *g->plr * (size_t)(g->prompt_tokens - 1)))) return;
    const int n = ev->n_prompt_lp < g->prompt_tokens - 1 - g->n_plr ? ev->n_prompt_lp : g->prompt_tokens - 1 - g->n_plr;
    if (n > 0) memcpy(g->plr + g->n_plr, ev->prompt_lp, sizeof *g->plr * (size_t)n);
    g->n_plr += n;
}

/* Before the choice's first token (or its end): the prompt's logprobs, the first token's
 * null entry then those the engine reported, to this choice or, for a choice forked from
 * its head's prefill, to the head (whose events all came before any of the choice's). */
void srv_gen_take_prompt_logprobs(srv_gen *g) {
    const srv_gen *head = srv_gen_head(g), *src = g->n_plr == 0 ? head : g;
    if (!head->echo_off || g->plr_taken) return;
    g->plr_taken = 1;
    take_logprobs_at(g, &(qd_sample_result){.token = head->echo_first}, 0, 1);
    for (int i = 0; i < src->n_plr && i + 1 < g->prompt_tokens; i++)
        take_logprobs_at(g, &src->plr[i], head->echo_off[i + 1], 0);
}

/* Completions echo: the prompt's text into g->echo_text, and with logprobs where each
 * token of it starts (for the prompt's logprobs). Returns 0, or -1 with e set. */
int srv_gen_echo(srv_gen *g, const int32_t *ids, size_t n, srv_error *e) {
    qd_err err;
    qd_err_clear(&err);
    const int offsets = g->o.logprobs && n > 0;
    if (offsets && !(g->echo_off = malloc(sizeof *g->echo_off * n)))
        return srv_fail(e, 500, "internal_error", NULL, "out of memory for the echo of %zu tokens", n);
    qd_detok d;
    qd_detok_init(&d, g->srv->tok, 0);
    const char *t;
    size_t tl;
    qd_status st = QD_OK;
    for (size_t i = 0; i < n && st == QD_OK; i++) {
        if (offsets) g->echo_off[i] = g->echo_text.n;
        if ((st = qd_detok_push(&d, ids[i], &t, &tl, &err)) == QD_OK) srv_buf_append(&g->echo_text, t, tl);
    }
    if (st == QD_OK && (st = qd_detok_flush(&d, &t, &tl, &err)) == QD_OK) srv_buf_append(&g->echo_text, t, tl);
    qd_detok_free(&d);
    if (st != QD_OK) return srv_fail(e, 400, "invalid_request_error", "prompt", "echo: %s", err.msg);
    if (offsets) g->echo_first = ids[0];
    return 0;
}

