/* The Anthropic Messages API's response shapes (src/server/anthropic_out.c, compiled
 * in here with the tool-call parser and util.c since the server's sources belong to
 * the executable): the stream's event sequence for a reply with reasoning, text and a
 * tool call (thinking / text / tool_use blocks, indices, input_json_delta, message_delta
 * with stop_reason and usage, message_stop), the same reply as a body, stop_sequence,
 * and the error shape. The end-to-end test with the official client is
 * tests/test_anthropic.py; this one covers the tool_use path, which the default model
 * does not produce by itself. */
#include <string.h>

#include "qd_test.h"
#include "server/anthropic_out.c"
#include "server/tool_calls.c"
#include "server/util.c"

/* The stream's events: names[i] and data[i] (parsed). */
typedef struct events {
    int n;
    char names[32][32];
    json_t *data[32];
} events;

static void parse_events(const srv_buf *out, events *ev) {
    memset(ev, 0, sizeof *ev);
    const char *p = out->p, *end = out->p + out->n;
    while (p < end && ev->n < 32) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        CHECK(nl && !strncmp(p, "event: ", 7));
        if (!nl || strncmp(p, "event: ", 7)) return;
        snprintf(ev->names[ev->n], sizeof ev->names[0], "%.*s", (int)(nl - p - 7), p + 7);
        p = nl + 1;
        const char *dl = memchr(p, '\n', (size_t)(end - p));
        CHECK(dl && !strncmp(p, "data: ", 6) && dl + 1 < end && dl[1] == '\n');
        if (!dl) return;
        ev->data[ev->n] = json_loadb(p + 6, (size_t)(dl - p - 6), 0, NULL);
        CHECKF(json_is_object(ev->data[ev->n]), "event %d's data is a JSON object", ev->n);
        CHECKF(!strcmp(json_string_value(json_object_get(ev->data[ev->n], "type")), ev->names[ev->n]),
               "event %s: data.type names it", ev->names[ev->n]);
        ev->n++;
        p = dl + 2;
    }
}

static void events_free(events *ev) {
    for (int i = 0; i < ev->n; i++) json_decref(ev->data[i]);
}

static const char *str_at(json_t *o, const char *a, const char *b) {
    json_t *v = json_object_get(o, a);
    if (b) v = json_object_get(v, b);
    return json_string_value(v);
}

static long long int_at(json_t *o, const char *a, const char *b) {
    json_t *v = json_object_get(o, a);
    if (b) v = json_object_get(v, b);
    return json_is_integer(v) ? json_integer_value(v) : -1;
}

static const char k_call[] = "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>";

static void setup(srv_server *s, srv_gen *g, int stream) {
    memset(s, 0, sizeof *s);
    s->cfg.model_name = "tiny";
    memset(g, 0, sizeof *g);
    g->srv = s;
    g->kind = SRV_MESSAGES;
    g->o.stream = stream;
    g->stop_index = -1;
    snprintf(g->id, sizeof g->id, "msg_test");
    g->prompt_tokens = 17;
}

static void free_gen(srv_gen *g) {
    srv_buf_free(&g->out);
    srv_buf_free(&g->dcontent);
    srv_buf_free(&g->dreasoning);
    srv_buf_free(&g->content);
    srv_buf_free(&g->reasoning);
    json_decref(g->tool_calls);
    free(g->body);
}

static void test_stream(void) {
    srv_server s;
    srv_gen g;
    setup(&s, &g, 1);
    srv_buf_append(&g.dreasoning, "Let me think.", 13);
    srv_anthropic_stream(&g, NULL);
    srv_buf_append(&g.dreasoning, " More.", 6);
    srv_anthropic_stream(&g, NULL);
    srv_buf_append(&g.dcontent, "Checking ", 9);
    srv_anthropic_stream(&g, NULL);
    srv_buf_append(&g.dcontent, "now.", 4);
    g.tool_calls = srv_parse_tool_calls(k_call, strlen(k_call), g.id, NULL);
    CHECK(json_array_size(g.tool_calls) == 1);
    g.completion_tokens = 30;
    srv_anthropic_stream(&g, "tool_calls");
    events ev;
    parse_events(&g.out, &ev);
    static const char *want[] = {"message_start", "ping", "content_block_start", "content_block_delta",
                                 "content_block_delta", "content_block_stop", "content_block_start",
                                 "content_block_delta", "content_block_delta", "content_block_stop",
                                 "content_block_start", "content_block_delta", "content_block_stop",
                                 "message_delta", "message_stop"};
    const int nw = (int)(sizeof want / sizeof want[0]);
    CHECKF(ev.n == nw, "%d events, want %d", ev.n, nw);
    for (int i = 0; i < ev.n && i < nw; i++) CHECKF(!strcmp(ev.names[i], want[i]), "event %d is %s, want %s", i, ev.names[i], want[i]);
    if (ev.n == nw) {
        json_t *m = json_object_get(ev.data[0], "message");
        CHECK(!strcmp(str_at(m, "id", NULL), "msg_test") && !strcmp(str_at(m, "model", NULL), "tiny"));
        CHECK(json_array_size(json_object_get(m, "content")) == 0 && int_at(m, "usage", "input_tokens") == 17 &&
              int_at(m, "usage", "output_tokens") == 0);
        CHECK(!strcmp(str_at(ev.data[2], "content_block", "type"), "thinking") && int_at(ev.data[2], "index", NULL) == 0);
        CHECK(!strcmp(str_at(ev.data[3], "delta", "type"), "thinking_delta") &&
              !strcmp(str_at(ev.data[3], "delta", "thinking"), "Let me think."));
        CHECK(!strcmp(str_at(ev.data[4], "delta", "thinking"), " More."));
        CHECK(int_at(ev.data[5], "index", NULL) == 0);
        CHECK(!strcmp(str_at(ev.data[6], "content_block", "type"), "text") && int_at(ev.data[6], "index", NULL) == 1);
        CHECK(!strcmp(str_at(ev.data[7], "delta", "type"), "text_delta") &&
              !strcmp(str_at(ev.data[7], "delta", "text"), "Checking "));
        CHECK(!strcmp(str_at(ev.data[8], "delta", "text"), "now.") && int_at(ev.data[9], "index", NULL) == 1);
        json_t *tb = json_object_get(ev.data[10], "content_block");
        CHECK(!strcmp(str_at(tb, "type", NULL), "tool_use") && !strcmp(str_at(tb, "name", NULL), "get_weather") &&
              str_at(tb, "id", NULL) && json_object_size(json_object_get(tb, "input")) == 0 &&
              int_at(ev.data[10], "index", NULL) == 2);
        CHECK(!strcmp(str_at(ev.data[11], "delta", "type"), "input_json_delta"));
        json_t *in = json_loads(str_at(ev.data[11], "delta", "partial_json"), 0, NULL);
        CHECKF(in && !strcmp(str_at(in, "city", NULL), "Paris"), "tool input {\"city\": \"Paris\"}");
        json_decref(in);
        CHECK(int_at(ev.data[12], "index", NULL) == 2);
        CHECK(!strcmp(str_at(ev.data[13], "delta", "stop_reason"), "tool_use") &&
              json_is_null(json_object_get(json_object_get(ev.data[13], "delta"), "stop_sequence")) &&
              int_at(ev.data[13], "usage", "output_tokens") == 30);
    }
    events_free(&ev);
    free_gen(&g);
}

static void test_body(void) {
    srv_server s;
    srv_gen g;
    setup(&s, &g, 0);
    srv_buf_append(&g.reasoning, "hmm", 3);
    srv_buf_append(&g.content, "Checking.", 9);
    g.tool_calls = srv_parse_tool_calls(k_call, strlen(k_call), g.id, NULL);
    g.completion_tokens = 9;
    srv_anthropic_body(&g, "tool_calls");
    json_t *b = json_loads(g.body, 0, NULL);
    CHECK(b && !strcmp(str_at(b, "type", NULL), "message") && !strcmp(str_at(b, "role", NULL), "assistant"));
    json_t *c = json_object_get(b, "content");
    CHECK(json_array_size(c) == 3);
    CHECK(!strcmp(str_at(json_array_get(c, 0), "type", NULL), "thinking") &&
          !strcmp(str_at(json_array_get(c, 0), "thinking", NULL), "hmm"));
    CHECK(!strcmp(str_at(json_array_get(c, 1), "text", NULL), "Checking."));
    CHECK(!strcmp(str_at(json_array_get(c, 2), "type", NULL), "tool_use") &&
          !strcmp(str_at(json_object_get(json_array_get(c, 2), "input"), "city", NULL), "Paris"));
    CHECK(!strcmp(str_at(b, "stop_reason", NULL), "tool_use") && int_at(b, "usage", "input_tokens") == 17 &&
          int_at(b, "usage", "output_tokens") == 9);
    json_decref(b);
    free_gen(&g);

    /* a stop string: stop_reason stop_sequence naming it; no tool call: one text block */
    setup(&s, &g, 0);
    char *stops[2] = {"END", "zz"};
    g.o.stops[0] = stops[0];
    g.o.stops[1] = stops[1];
    g.o.n_stops = 2;
    g.stopped = 1;
    g.stop_index = 1;
    srv_anthropic_body(&g, "stop");
    b = json_loads(g.body, 0, NULL);
    CHECK(!strcmp(str_at(b, "stop_reason", NULL), "stop_sequence") && !strcmp(str_at(b, "stop_sequence", NULL), "zz"));
    c = json_object_get(b, "content");
    CHECK(json_array_size(c) == 1 && !strcmp(str_at(json_array_get(c, 0), "text", NULL), ""));
    json_decref(b);
    free_gen(&g);
    setup(&s, &g, 0);
    srv_anthropic_body(&g, "length");
    b = json_loads(g.body, 0, NULL);
    CHECK(!strcmp(str_at(b, "stop_reason", NULL), "max_tokens") && json_is_null(json_object_get(b, "stop_sequence")));
    json_decref(b);
    free_gen(&g);
    setup(&s, &g, 0);
    srv_anthropic_body(&g, "stop");
    b = json_loads(g.body, 0, NULL);
    CHECK(!strcmp(str_at(b, "stop_reason", NULL), "end_turn"));
    json_decref(b);
    free_gen(&g);
}

static void test_errors(void) {
    static const struct { int status; const char *type; } k[] = {
        {400, "invalid_request_error"}, {401, "authentication_error"}, {404, "not_found_error"},
        {413, "request_too_large"},     {500, "api_error"},            {503, "overloaded_error"},
    };
    for (size_t i = 0; i < sizeof k / sizeof k[0]; i++) {
        srv_error e;
        srv_fail(&e, k[i].status, "whatever", NULL, "bad %s", "thing");
        srv_reply r = {0};
        srv_reply_error_anthropic(&r, &e);
        json_t *b = json_loads(r.body, 0, NULL);
        CHECKF(r.status == k[i].status && !strcmp(str_at(b, "type", NULL), "error") &&
                   !strcmp(str_at(b, "error", "type"), k[i].type) && !strcmp(str_at(b, "error", "message"), "bad thing"),
               "status %d -> %s", k[i].status, k[i].type);
        json_decref(b);
        free(r.body);
    }
}

int main(void) {
    test_stream();
    test_body();
    test_errors();
    return qd_test_finish("test_server_anthropic");
}
