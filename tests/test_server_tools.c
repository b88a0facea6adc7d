/* Tool-call capture and parsing of the server (src/server/tool_calls.c, compiled in
 * here with util.c since the server's sources belong to the executable): both
 * formats, several calls, text before a call, malformed calls given back as content,
 * and the capture over every split of the text into pieces; and error messages
 * (srv_fail) that stay UTF-8 where a client's text is cut inside a character. */
#include <string.h>

#include "qd_test.h"
#include "server/tool_calls.c"
#include "server/util.c"

static void call_is(json_t *calls, size_t i, const char *name, const char *args) {
    json_t *c = json_array_get(calls, i);
    json_t *f = json_object_get(c, "function");
    CHECKF(c && !strcmp(json_string_value(json_object_get(c, "type")), "function"), "call %zu type", i);
    CHECKF(json_string_value(json_object_get(c, "id")) != NULL, "call %zu id", i);
    const char *n = json_string_value(json_object_get(f, "name"));
    const char *a = json_string_value(json_object_get(f, "arguments"));
    CHECKF(n && !strcmp(n, name), "call %zu name '%s' != '%s'", i, n ? n : "(null)", name);
    CHECKF(a && !strcmp(a, args), "call %zu arguments '%s' != '%s'", i, a ? a : "(null)", args);
}

static json_t *parse(const char *s) { return srv_parse_tool_calls(s, strlen(s), "t", NULL); }

typedef struct sink {
    char out[1024];
    size_t n;
} sink;

static void emit(void *user, int r, const char *t, size_t n) {
    sink *s = user;
    (void)r;
    memcpy(s->out + s->n, t, n);
    s->n += n;
    s->out[s->n] = '\0';
}

int main(void) {
    json_t *c = parse("<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>");
    CHECK(json_array_size(c) == 1);
    if (c) call_is(c, 0, "get_weather", "{\"city\":\"Paris\"}");
    json_decref(c);

    c = parse("<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=days>\n3\n"
              "</parameter>\n</function>\n</tool_call>\n<tool_call>\n<function=now>\n</function>\n</tool_call>\n");
    CHECK(json_array_size(c) == 2);
    if (c) {
        call_is(c, 0, "get_weather", "{\"city\":\"Paris\",\"days\":3}");
        call_is(c, 1, "now", "{}");
    }
    json_decref(c);

    /* XML values typed by the tool's parameter schema, not by their look */
    json_t *tools = json_loads("[{\"type\":\"function\",\"function\":{\"name\":\"g\",\"parameters\":{\"type\":\"object\","
                               "\"properties\":{\"zip\":{\"type\":\"string\"},\"n\":{\"type\":\"integer\"},"
                               "\"flag\":{\"type\":[\"boolean\",\"string\"]},\"code\":{\"enum\":[\"007\",7]},"
                               "\"x\":{\"type\":\"number\"}}}}}]", 0, NULL);
    const char *xml = "<tool_call>\n<function=g>\n<parameter=zip>\n123\n</parameter>\n<parameter=n>\n4\n</parameter>\n"
                      "<parameter=flag>\ntrue\n</parameter>\n<parameter=code>\n007\n</parameter>\n"
                      "<parameter=x>\nabc\n</parameter>\n<parameter=free>\n[1]\n</parameter>\n</function>\n</tool_call>";
    c = srv_parse_tool_calls(xml, strlen(xml), "t", tools);
    CHECK(json_array_size(c) == 1);
    if (c) call_is(c, 0, "g", "{\"zip\":\"123\",\"n\":4,\"flag\":true,\"code\":\"007\",\"x\":\"abc\",\"free\":[1]}");
    json_decref(c);
    json_decref(tools);

    c = parse("<tool_call>{\"name\": \"f\", \"arguments\": \"{\\\"x\\\": 1}\"}</tool_call>");
    CHECK(c != NULL);
    if (c) call_is(c, 0, "f", "{\"x\": 1}");
    json_decref(c);
    /* arguments that would not parse as an object or array make it no call */
    CHECK(parse("<tool_call>{\"name\": \"f\", \"arguments\": \"get_weather\"}</tool_call>") == NULL);
    CHECK(parse("<tool_call>{\"name\": \"f\", \"arguments\": \"42\"}</tool_call>") == NULL);
    CHECK(parse("<tool_call>{\"name\": \"f\", \"arguments\": 42}</tool_call>") == NULL);
    c = parse("<tool_call>{\"name\": \"f\", \"arguments\": [1, 2]}</tool_call>");
    CHECK(c != NULL);
    if (c) call_is(c, 0, "f", "[1,2]");
    json_decref(c);

    CHECK(parse("<tool_call>\n{\"name\": \"f\", \"arguments\": {}") == NULL);          /* unterminated */
    CHECK(parse("<tool_call>not json</tool_call>") == NULL);
    CHECK(parse("<tool_call>{\"arguments\": {}}</tool_call>") == NULL);               /* no name */
    CHECK(parse("<tool_call>{\"name\":\"f\"}</tool_call> trailing words") == NULL);   /* text after a call */
    CHECK(parse("<tool_call>{\"name\":\"f\",\"arguments\":{},\"arguments\":{\"a\":1}}</tool_call>") == NULL);
    /* XML: only whitespace between the tags, every parameter closed, short names: what the
     * format has no place for makes it no call (given back as content), never a call with
     * a parameter quietly left out */
    CHECK(parse("<tool_call>\n<function=f>\n<parameter=a>\n1\n</parameter>\nso\n<parameter=b>\n2\n</parameter>\n"
                "</function>\n</tool_call>") == NULL);
    CHECK(parse("<tool_call>\n<function=f>\n<parameter=a>\n1\n</parameter>\n<parameter=b>\n{\"x\": 1\n</function>\n"
                "</tool_call>") == NULL);
    CHECK(parse("<tool_call>\n<function=f>\n<parameter=a>\n1\n</parameter>\n</function>\nok\n</tool_call>") == NULL);
    CHECK(parse("<tool_call>\n<function=f>\n<parameter=>\n1\n</parameter>\n</function>\n</tool_call>") == NULL);
    {
        char longname[600];
        snprintf(longname, sizeof longname, "<tool_call>\n<function=%0300d>\n</function>\n</tool_call>", 7);
        CHECK(parse(longname) == NULL);
    }

    /* capture: content before the tag is emitted, the rest held, over any split */
    const char *text = "Let me check. <tool_call>\n{\"name\": \"f\"}\n</tool_call>";
    for (size_t step = 1; step <= strlen(text); step++) {
        srv_toolcap t = {.enabled = 1};
        sink s = {{0}, 0};
        for (size_t off = 0; off < strlen(text); off += step) {
            size_t k = strlen(text) - off < step ? strlen(text) - off : step;
            srv_toolcap_push(&t, text + off, k, 0, emit, &s);
        }
        srv_toolcap_push(&t, "", 0, 1, emit, &s);
        CHECKF(!strcmp(s.out, "Let me check. "), "step %zu: content '%s'", step, s.out);
        CHECKF(t.capturing && t.cap.n == strlen(text) - 14, "step %zu: captured %zu", step, t.cap.n);
        srv_toolcap_free(&t);
    }
    /* near-tags are content; a disabled capture passes everything */
    srv_toolcap t = {.enabled = 1};
    sink s = {{0}, 0};
    srv_toolcap_push(&t, "a <tool_c", 9, 0, emit, &s);
    srv_toolcap_push(&t, "all me", 6, 0, emit, &s);
    srv_toolcap_push(&t, "", 0, 1, emit, &s);
    CHECK(!strcmp(s.out, "a <tool_call me") && !t.capturing);
    srv_toolcap_free(&t);
    /* an error message is a JSON string: a client's text cut by a precision or by the
     * buffer's end inside a character still gives UTF-8 (before: no body, a 500) */
    srv_error e;
    srv_fail(&e, 404, "x", NULL, "model `%.5s` not found", "ab\xc3\xa9\xc3\xa9");
    json_t *js = json_string(e.msg);
    CHECKF(js && !strcmp(e.msg, "model `ab\xc3\xa9\xef\xbf\xbd` not found"), "cut character: '%s'", e.msg);
    json_decref(js);
    char big[3001];
    for (int i = 0; i < 1500; i++) memcpy(big + 2 * i, "\xc3\xa9", 2);
    big[3000] = 0;
    srv_fail(&e, 400, "x", NULL, "%s", big); /* 511 characters and a cut one: the U+FFFD does not fit */
    js = json_string(e.msg);
    CHECKF(js && strlen(e.msg) == 1023 - 1, "long message cut between characters: %zu bytes", strlen(e.msg));
    json_decref(js);
    return qd_test_finish("test_server_tools");
}
