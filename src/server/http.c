/* libmicrohttpd glue: routing, request bodies and their limit, auth, and the two ways
 * a generation is answered.
 *
 * MHD runs its own epoll thread(s). A request that waits for the engine does not
 * hold a thread: its connection is suspended (MHD_suspend_connection) and the
 * engine callback resumes it when bytes are ready.
 *   - streams: the response is an SSE body produced by a content-reader callback,
 *     which formats the deltas the engine callback gathered (srv_gen_flush); when it
 *     finds nothing to send it suspends the connection and returns 0, and the next
 *     engine event resumes it;
 *   - non-streaming: the access handler suspends the connection after submitting;
 *     when the finishing event resumes it, MHD calls the handler again, which queues
 *     the finished JSON body.
 * A client that disconnects shows up as a failed write after the next resume; MHD
 * then reports the request completed and the generation is cancelled. */
#include <arpa/inet.h>
#include <microhttpd.h>
#include <netdb.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "server/server.h"

typedef struct conn_state {
    srv_buf body;
    int too_large;
    srv_gen *gen;    /* set once a generation answers this request */
} conn_state;

static enum MHD_Result send_text(srv_server *s, struct MHD_Connection *c, int status, const char *ctype, char *body) {
    const char *b = body ? body : "{\"error\":{\"message\":\"out of memory\",\"type\":\"internal_error\",\"param\":null,\"code\":null}}";
    if (!body) status = 500;
    struct MHD_Response *r = MHD_create_response_from_buffer(strlen(b), (void *)b, body ? MHD_RESPMEM_MUST_FREE : MHD_RESPMEM_PERSISTENT);
    if (!r) {
        free(body);
        return MHD_NO;
    }
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, ctype ? ctype : "application/json");
    if (status == 405) MHD_add_response_header(r, MHD_HTTP_HEADER_ALLOW, "GET, POST");
    if (status == 401) MHD_add_response_header(r, MHD_HTTP_HEADER_WWW_AUTHENTICATE, "Bearer");
    if (status == 503) MHD_add_response_header(r, MHD_HTTP_HEADER_RETRY_AFTER, "1");
    enum MHD_Result ret = MHD_queue_response(c, (unsigned)status, r);
    MHD_destroy_response(r);
    srv_metrics_status(&s->metrics, status);
    return ret;
}

/* The Anthropic routes answer errors in Anthropic's shape, the rest in OpenAI's. */
static int is_anthropic_url(const char *url) { return url && !strncmp(url, "/v1/messages", 12); }

static enum MHD_Result send_error(srv_server *s, struct MHD_Connection *c, const char *url, int status, const char *type,
                                  const char *fmt, ...) __attribute__((format(printf, 6, 7)));
static enum MHD_Result send_error(srv_server *s, struct MHD_Connection *c, const char *url, int status, const char *type,
                                  const char *fmt, ...) {
    srv_error e;
    va_list ap;
    va_start(ap, fmt);
    srv_failv(&e, status, type, NULL, fmt, ap);
    va_end(ap);
    srv_reply r = {0};
    if (is_anthropic_url(url)) srv_reply_error_anthropic(&r, &e);
    else srv_reply_error(&r, &e);
    return send_text(s, c, status, "application/json", r.body);
}

/* The SSE body: what the engine callback has appended, or a suspension until it has. */
static ssize_t sse_reader(void *cls, uint64_t pos, char *buf, size_t max) {
    srv_gen *g = cls;
    (void)pos;
    ssize_t ret;
    pthread_mutex_lock(&g->mu);
    if (g->out.n == g->out_off && g->n_pend > 0) srv_gen_flush(g); /* the deltas gathered since */
    if (g->out.n > g->out_off) {
        size_t k = g->out.n - g->out_off;
        if (k > max) k = max;
        memcpy(buf, g->out.p + g->out_off, k);
        g->out_off += k;
        if (g->out_off == g->out.n) g->out.n = g->out_off = 0; /* reuse the buffer */
        ret = (ssize_t)k;
    } else if (g->done) {
        ret = MHD_CONTENT_READER_END_OF_STREAM;
    } else {
        g->suspended = 1;
        MHD_suspend_connection(g->conn);
        ret = 0;
    }
    pthread_mutex_unlock(&g->mu);
    return ret;
}

static enum MHD_Result start_stream(srv_server *s, struct MHD_Connection *c, srv_gen *g) {
    struct MHD_Response *r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, sse_reader, g, NULL);
    if (!r) return MHD_NO;
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "text/event-stream; charset=utf-8");
    MHD_add_response_header(r, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
    enum MHD_Result ret = MHD_queue_response(c, MHD_HTTP_OK, r);
    MHD_destroy_response(r);
    srv_metrics_status(&s->metrics, 200);
    return ret;
}

/* Non-streaming: the body when it is ready, else suspend until the engine resumes us. */
static enum MHD_Result deferred_body(srv_server *s, struct MHD_Connection *c, srv_gen *g) {
    pthread_mutex_lock(&g->mu);
    if (!g->done) {
        g->suspended = 1;
        MHD_suspend_connection(c);
        pthread_mutex_unlock(&g->mu);
        return MHD_YES;
    }
    char *body = g->body;
    g->body = NULL;
    int status = g->http_status;
    pthread_mutex_unlock(&g->mu);
    return send_text(s, c, status, "application/json", body);
}

typedef enum route_id {
    R_NONE, R_CHAT, R_COMPLETIONS, R_MODELS, R_HEALTH, R_METRICS, R_MESSAGES, R_COUNT_TOKENS, R_TOKENIZE, R_DETOKENIZE,
    R_TOKENIZER_INFO, R_PAGE
} route_id;

static route_id find_route(const char *url, int *want_post) {
    static const struct { const char *path; route_id id; int post; } k[] = {
        {"/v1/chat/completions", R_CHAT, 1}, {"/v1/completions", R_COMPLETIONS, 1}, {"/v1/models", R_MODELS, 0},
        {"/health", R_HEALTH, 0},            {"/metrics", R_METRICS, 0},
        {"/v1/messages", R_MESSAGES, 1},     {"/v1/messages/count_tokens", R_COUNT_TOKENS, 1},
        {"/tokenize", R_TOKENIZE, 1},        {"/detokenize", R_DETOKENIZE, 1},
        {"/tokenizer_info", R_TOKENIZER_INFO, 0},
        {"/", R_PAGE, 0},
    };
    size_t n = strlen(url);
    while (n > 1 && url[n - 1] == '/') n--; /* "/v1/models/" is "/v1/models" */
    for (size_t i = 0; i < sizeof k / sizeof k[0]; i++)
        if (strlen(k[i].path) == n && !strncmp(k[i].path, url, n)) {
            *want_post = k[i].post;
            return k[i].id;
        }
    return R_NONE;
}

static enum MHD_Result handler(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                               const char *version, const char *upload_data, size_t *upload_size, void **con_cls) {
    srv_server *s = cls;
    (void)version;
    conn_state *cs = *con_cls;
    if (!cs) {
        cs = calloc(1, sizeof *cs);
        if (!cs) return MHD_NO;
        *con_cls = cs;
        /* A body somewhat over the limit is read and dropped, then answered 413 on a
         * clean connection (a client still sending when the server closes may get a
         * reset instead of the reply); a grossly oversized one is refused at once. */
        const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
        if (cl && strtoull(cl, NULL, 10) / 16 > s->cfg.max_body) {
            cs->too_large = 1;
            return send_error(s, c, url, 413, "invalid_request_error", "request body larger than %zu bytes", s->cfg.max_body);
        }
        return MHD_YES;
    }
    if (cs->gen) return deferred_body(s, c, cs->gen);
    if (*upload_size) {
        if (!cs->too_large && cs->body.n + *upload_size <= s->cfg.max_body) {
            if (srv_buf_append(&cs->body, upload_data, *upload_size)) cs->too_large = 1;
        } else {
            cs->too_large = 1; /* keep reading (and dropping) so the 413 can be sent */
        }
        *upload_size = 0;
        return MHD_YES;
    }
    if (cs->too_large) return send_error(s, c, url, 413, "invalid_request_error", "request body larger than %zu bytes", s->cfg.max_body);

    int want_post = 0;
    route_id id = find_route(url, &want_post);
    if (id == R_NONE) return send_error(s, c, url, 404, "NotFoundError", "no route %s", url);
    int is_post = !strcmp(method, "POST");
    int is_get = !strcmp(method, "GET") || !strcmp(method, "HEAD");
    if ((want_post && !is_post) || (!want_post && !is_get))
        return send_error(s, c, url, 405, "invalid_request_error", "method %s not allowed here", method);
    /* the key as OpenAI clients send it (Authorization: Bearer) or as Anthropic's do (x-api-key) */
    const char *xkey = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "x-api-key");
    if ((!strncmp(url, "/v1/", 4) || id == R_TOKENIZE || id == R_DETOKENIZE || id == R_TOKENIZER_INFO) &&
        !(xkey ? srv_auth_key_ok(s, xkey)
               : srv_auth_ok(s, MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION))))
        return send_error(s, c, url, 401, "authentication_error", "%s",
                          "invalid or missing API key (Authorization: Bearer KEY, or x-api-key: KEY)");

    srv_reply r = {0};
    if (id == R_MODELS) srv_route_models(s, &r);
    else if (id == R_HEALTH) srv_route_health(s, &r);
    else if (id == R_METRICS) srv_route_metrics(s, &r);
    else if (id == R_PAGE) srv_route_page(s, &r);
    else if (id == R_TOKENIZER_INFO) srv_route_tokenizer_info(s, &r);
    else {
        json_error_t je;
        json_t *req = cs->body.n ? json_loadb(cs->body.p, cs->body.n, 0, &je) : NULL;
        if (!req) {
            char msg[300];
            snprintf(msg, sizeof msg, "%s", cs->body.n ? je.text : "empty body");
            return send_error(s, c, url, 400, "invalid_request_error", "malformed JSON body: %s", msg);
        }
        if (!json_is_object(req)) {
            json_decref(req);
            return send_error(s, c, url, 400, "invalid_request_error", "%s", "the request body must be a JSON object");
        }
        if (id == R_CHAT) srv_route_chat(s, req, &r);
        else if (id == R_MESSAGES) srv_route_messages(s, req, &r);
        else if (id == R_COUNT_TOKENS) srv_route_count_tokens(s, req, &r);
        else if (id == R_TOKENIZE) srv_route_tokenize(s, req, &r);
        else if (id == R_DETOKENIZE) srv_route_detokenize(s, req, &r);
        else srv_route_completions(s, req, &r);
        json_decref(req);
    }
    srv_buf_free(&cs->body);
    if (!r.gen) return send_text(s, c, r.status, r.content_type, r.body);
    srv_gen *g = r.gen;
    cs->gen = g;
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    pthread_mutex_lock(&g->mu);
    g->conn = c;
    if (!g->o.stream && ci) g->fd = ci->connect_fd;
    pthread_mutex_unlock(&g->mu);
    if (g->o.stream) return start_stream(s, c, g);
    return deferred_body(s, c, g);
}

static void completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode toe) {
    (void)cls;
    (void)c;
    (void)toe;
    conn_state *cs = *con_cls;
    if (!cs) return;
    if (cs->gen) srv_gen_conn_done(cs->gen);
    srv_buf_free(&cs->body);
    free(cs);
    *con_cls = NULL;
}

int srv_start(srv_server *s) {
    qd_err terr;
    qd_err_clear(&terr);
    if (!s->trie && qd_token_trie_build(s->tok, &s->trie, &terr) != QD_OK) {
        fprintf(stderr, "qdelta serve: token trie: %s\n", terr.msg);
        return -1;
    }
    struct addrinfo hints, *ai = NULL;
    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
    char port[16];
    snprintf(port, sizeof port, "%d", s->cfg.port);
    int gai = getaddrinfo(s->cfg.host, port, &hints, &ai);
    if (gai || !ai) {
        fprintf(stderr, "qdelta serve: cannot resolve --host %s: %s\n", s->cfg.host, gai_strerror(gai));
        return -1;
    }
    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_EPOLL | MHD_ALLOW_SUSPEND_RESUME | MHD_USE_ERROR_LOG;
    if (ai->ai_family == AF_INET6) flags |= MHD_USE_IPv6;
    /* the thread-pool option only when asked for: MHD warns about a pool of size 0/1 */
    struct MHD_OptionItem opts[] = {
        {MHD_OPTION_SOCK_ADDR, 0, ai->ai_addr},
        {MHD_OPTION_NOTIFY_COMPLETED, (intptr_t)completed, s},
        {MHD_OPTION_CONNECTION_LIMIT, s->cfg.max_connections, NULL},
        {MHD_OPTION_CONNECTION_TIMEOUT, 300, NULL},
        {MHD_OPTION_LISTENING_ADDRESS_REUSE, 1, NULL},
        {s->cfg.http_threads > 1 ? MHD_OPTION_THREAD_POOL_SIZE : MHD_OPTION_END, s->cfg.http_threads, NULL},
        {MHD_OPTION_END, 0, NULL},
    };
    s->daemon = MHD_start_daemon(flags, 0, NULL, NULL, handler, s, MHD_OPTION_ARRAY, opts, MHD_OPTION_END);
    freeaddrinfo(ai);
    if (!s->daemon) {
        fprintf(stderr, "qdelta serve: cannot listen on %s:%d (port in use?)\n", s->cfg.host, s->cfg.port);
        return -1;
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(s->daemon, MHD_DAEMON_INFO_BIND_PORT);
    if (di) s->cfg.port = di->port;
    return 0;
}

void srv_stop(srv_server *s) {
    if (!s->daemon) {
        qd_token_trie_free(s->trie); /* no request ever ran */
        s->trie = NULL;
        return;
    }
    /* 1. stop accepting: the listening socket closes, open connections stay */
    MHD_socket ls = MHD_quiesce_daemon(s->daemon);
    if (ls != MHD_INVALID_SOCKET) close(ls);
    /* 2. the engine goes: every generation gets its CANCELLED event, which ends its
     *    stream (finish_reason "abort", [DONE]) or body and resumes its connection;
     *    new submissions see shutting_down and get 503 */
    pthread_rwlock_wrlock(&s->engine_lock);
    __atomic_store_n(&s->shutting_down, 1, __ATOMIC_RELAXED);
    qd_engine *e = s->engine;
    s->engine = NULL;
    pthread_rwlock_unlock(&s->engine_lock);
    qd_engine_free(e);
    /* 3. let MHD send those last bytes (bounded: a client that stopped reading cannot
     *    hold the shutdown) */
    for (int i = 0; i < 200 && __atomic_load_n(&s->n_gens, __ATOMIC_RELAXED) > 0; i++) usleep(10000);
    MHD_stop_daemon(s->daemon);
    s->daemon = NULL;
    qd_token_trie_free(s->trie); /* after the engine: its constraints walk it */
    s->trie = NULL;
}
