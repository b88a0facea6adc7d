/* Small helpers shared by the server's parts. */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "server/server.h"

int srv_buf_append(srv_buf *b, const char *s, size_t n) {
    if (b->n + n + 1 > b->cap) {
        size_t nc = (b->cap ? b->cap * 2 : 256) + n;
        char *np = realloc(b->p, nc);
        if (!np) return -1;
        b->p = np;
        b->cap = nc;
    }
    if (n) memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = '\0';
    return 0;
}

void srv_buf_free(srv_buf *b) {
    free(b->p);
    memset(b, 0, sizeof *b);
}

int srv_fail(srv_error *e, int status, const char *type, const char *param, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    srv_failv(e, status, type, param, fmt, ap);
    va_end(ap);
    return -1;
}

int srv_failv(srv_error *e, int status, const char *type, const char *param, const char *fmt, va_list ap) {
    e->status = status;
    e->type = type;
    e->param = param;
    e->code = NULL;
    char raw[sizeof e->msg];
    vsnprintf(raw, sizeof raw, fmt, ap);
    /* The message goes into a JSON string, which must be UTF-8: a client's text cut by a
     * precision (%.200s) or by the buffer's end can end inside a character, which then
     * becomes U+FFFD (and the message is cut again between characters if that made it
     * longer). */
    size_t n = 0;
    char *ok = qd_utf8_lossy((const unsigned char *)raw, strlen(raw), &n);
    const char *src = ok ? ok : "(out of memory formatting the error)";
    n = ok ? n : strlen(src);
    if (n >= sizeof e->msg) {
        n = sizeof e->msg - 1;
        while (n && ((unsigned char)src[n] & 0xC0) == 0x80) n--; /* src[n] starts the first character left out */
    }
    memcpy(e->msg, src, n);
    e->msg[n] = '\0';
    free(ok);
    return -1;
}

void srv_reply_error(srv_reply *r, const srv_error *e) {
    json_t *err = json_pack("{s:s, s:s, s:o, s:o}", "message", e->msg, "type", e->type ? e->type : "invalid_request_error",
                            "param", e->param ? json_string(e->param) : json_null(), "code",
                            e->code ? json_string(e->code) : json_null());
    json_t *o = json_pack("{s:o}", "error", err);
    r->status = e->status;
    r->body = o ? json_dumps(o, JSON_COMPACT) : NULL;
    r->content_type = "application/json";
    json_decref(o);
}

void srv_bind_model(srv_server *s) {
    s->tpl_content_parts = qd_chat_template_renders_content_parts(s->tpl);
    const int V = qd_model_vocab_size(s->model), TV = qd_tokenizer_vocab_size(s->tok);
    s->vocab_limit = TV < V ? TV : V;
    s->think_start = qd_tokenizer_token_to_id(s->tok, "<think>");
    s->think_end = qd_tokenizer_token_to_id(s->tok, "</think>");
    s->n_eos = qd_model_eos_ids(s->model, &s->eos);
    s->gen_defaults = qd_model_generation_defaults(s->model);
}

json_t *srv_token_json(const srv_server *s, int32_t id, json_t **bytes) {
    size_t n = 0;
    const unsigned char *b = qd_tokenizer_token_bytes(s->tok, id, &n);
    if (!b) n = 0;
    if (bytes) {
        *bytes = json_array();
        for (size_t i = 0; i < n; i++) json_array_append_new(*bytes, json_integer(b[i]));
    }
    size_t ln = 0;
    char *t = qd_utf8_lossy(b ? b : (const unsigned char *)"", n, &ln);
    json_t *j = t ? json_stringn(t, ln) : json_string("");
    free(t);
    return j;
}
