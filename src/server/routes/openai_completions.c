/* POST /v1/completions: a raw prompt (a string, or token ids) continued as-is; several of
 * them at once in the batch form. */
#include <stdlib.h>
#include <string.h>

#include "server/server.h"
#include "server/structured.h"

/* One prompt as ids: a string, or a list of token ids. */
static int one_prompt(srv_server *s, json_t *p, int32_t **ids, size_t *n, srv_error *e) {
    qd_err err;
    qd_err_clear(&err);
    if (json_is_string(p)) {
        if (qd_tokenizer_encode(s->tok, json_string_value(p), json_string_length(p), 0, ids, n, &err) != QD_OK)
            return srv_fail(e, 400, "invalid_request_error", "prompt", "tokenizer: %s", err.msg);
        return 0;
    }
    if (!json_is_array(p))
        return srv_fail(e, 400, "invalid_request_error", "prompt", "'prompt' must be a string or a list of token ids");
    size_t k = json_array_size(p);
    *ids = malloc(sizeof(int32_t) * (k ? k : 1));
    if (!*ids) return srv_fail(e, 500, "internal_error", NULL, "out of memory");
    for (size_t i = 0; i < k; i++) {
        json_t *v = json_array_get(p, i);
        if (!json_is_integer(v))
            return srv_fail(e, 400, "invalid_request_error", "prompt", "'prompt' must be a string or a list of token ids");
        json_int_t x = json_integer_value(v);
        if (x < 0 || x >= s->vocab_limit)
            return srv_fail(e, 400, "invalid_request_error", "prompt", "token id %lld is out of range [0, %d)", (long long)x,
                            s->vocab_limit);
        (*ids)[i] = (int32_t)x;
    }
    *n = k;
    return 0;
}

/* The prompts: one (a string or a list of ids), or the batch form, a list of strings or
 * of id lists, each answered as if it came alone (its choices numbered after those of
 * the prompts before it). ids[k] / lens[k] for k < *count, malloc'd. */
static int prompt_list(srv_server *s, json_t *p, int32_t **ids, int *lens, int *count, srv_error *e) {
    *count = 0;
    if (!p) return srv_fail(e, 400, "invalid_request_error", "prompt", "'prompt' is required");
    const int batch = json_is_array(p) && json_array_size(p) > 0 &&
                      (json_is_string(json_array_get(p, 0)) || json_is_array(json_array_get(p, 0)));
    const size_t n = batch ? json_array_size(p) : 1;
    if (n > SRV_MAX_CHOICES)
        return srv_fail(e, 400, "invalid_request_error", "prompt", "'prompt' holds %zu prompts, at most %d", n,
                        SRV_MAX_CHOICES);
    for (size_t k = 0; k < n; k++) {
        json_t *q = batch ? json_array_get(p, k) : p;
        if (batch && !json_is_string(q) && !json_is_array(q))
            return srv_fail(e, 400, "invalid_request_error", "prompt",
                            "prompt %zu of the batch must be a string or a list of token ids", k);
        size_t len = 0;
        ids[k] = NULL;
        int rc = one_prompt(s, q, &ids[k], &len, e);
        (*count)++;
        if (rc) return rc;
        if (len > (size_t)1 << 30) len = (size_t)1 << 30;
        lens[k] = (int)len;
    }
    return 0;
}

void srv_route_completions(srv_server *s, json_t *req, srv_reply *r) {
    srv_error e;
    int32_t *ids[SRV_MAX_CHOICES];
    int lens[SRV_MAX_CHOICES], count = 0;
    srv_gen *g = srv_gen_new(s, SRV_COMPLETION);
    if (!g) { srv_fail(&e, 500, "internal_error", NULL, "out of memory"); goto fail; }
    if (srv_parse_opts(s, req, SRV_COMPLETION, &g->o, &e)) goto fail;
    if (prompt_list(s, json_object_get(req, "prompt"), ids, lens, &count, &e)) goto fail;
    for (int k = 0; k < count; k++)
        if (srv_check_length(s, lens[k], &g->o, &e)) {
            if (count > 1) snprintf(e.msg + strlen(e.msg), sizeof e.msg - strlen(e.msg),
                                    " (prompt %d of the batch)", k);
            goto fail;
        }
    if (srv_structured_setup(s, req, SRV_COMPLETION, NULL, 0, &g->o.rp.constraint, &e)) goto fail;
    if (srv_gen_submit_batch(g, (const int32_t *const *)ids, lens, count, &e)) goto fail;
    r->status = 200;
    r->gen = g;
    r->content_type = g->o.stream ? "text/event-stream" : "application/json";
    for (int k = 0; k < count; k++) free(ids[k]);
    return;
fail:
    srv_reply_error(r, &e);
    if (g) srv_gen_unref(g);
    for (int k = 0; k < count; k++) free(ids[k]);
}
