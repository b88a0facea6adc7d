/* POST /v1/completions: a raw prompt (a string, or token ids) continued as-is. */
#include <stdlib.h>
#include <string.h>

#include "server/server.h"
#include "server/structured.h"

/* The prompt as ids: a string, [ids], or a one-element list of either (the batch form
 * with more than one prompt is n > 1 in disguise and refused). */
static int prompt_ids(srv_server *s, json_t *p, int32_t **ids, size_t *n, srv_error *e) {
    if (json_is_array(p) && json_array_size(p) == 1 &&
        (json_is_string(json_array_get(p, 0)) || json_is_array(json_array_get(p, 0))))
        p = json_array_get(p, 0);
    if (!p) return srv_fail(e, 400, "invalid_request_error", "prompt", "'prompt' is required");
    if (json_is_array(p) && json_array_size(p) > 1 &&
        (json_is_string(json_array_get(p, 0)) || json_is_array(json_array_get(p, 0))))
        return srv_fail(e, 400, "invalid_request_error", "prompt",
                        "'prompt' holds %zu prompts: the batch form is not supported, send one request per prompt "
                        "(they are batched on the server all the same)", json_array_size(p));
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

void srv_route_completions(srv_server *s, json_t *req, srv_reply *r) {
    srv_error e;
    int32_t *ids = NULL;
    size_t n = 0;
    srv_gen *g = srv_gen_new(s, SRV_COMPLETION);
    if (!g) { srv_fail(&e, 500, "internal_error", NULL, "out of memory"); goto fail; }
    if (srv_parse_opts(s, req, SRV_COMPLETION, &g->o, &e)) goto fail;
    if (prompt_ids(s, json_object_get(req, "prompt"), &ids, &n, &e)) goto fail;
    if (n > (size_t)1 << 30) n = (size_t)1 << 30;
    if (srv_check_length(s, (int)n, &g->o, &e)) goto fail;
    if (g->o.echo && srv_gen_echo(g, ids, n, &e)) goto fail;
    if (srv_structured_setup(s, req, SRV_COMPLETION, NULL, 0, &g->o.rp.constraint, &e)) goto fail;
    if (srv_gen_submit(g, ids, (int)n, &e)) goto fail;
    r->status = 200;
    r->gen = g;
    r->content_type = g->o.stream ? "text/event-stream" : "application/json";
    free(ids);
    return;
fail:
    srv_reply_error(r, &e);
    if (g) srv_gen_unref(g);
    free(ids);
}
