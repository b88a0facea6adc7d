/* Tool calls streamed as deltas (src/server/tool_stream.c, compiled in here with
 * tool_calls.c and util.c): for captures in both forms fed in every piece size, the
 * first delta of each call carries its id and name, the argument fragments joined
 * parse to the same JSON as srv_parse_tool_calls gives for the whole capture (XML
 * values typed by the tool's schema, a value written as a JSON string decoded; calls
 * in shapes that do not stream piece by piece in one delta), and string values arrive
 * before the call ends. fuzz/fuzz_model_output.c checks the same on arbitrary text. */
#include <string.h>

#include "qd_test.h"
#include "server/tool_calls.c"
#include "server/tool_stream.c"
#include "server/util.c"

static const char TOOLS[] =
    "[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"parameters\":{\"type\":\"object\",\"properties\":"
    "{\"city\":{\"type\":\"string\"},\"days\":{\"type\":\"integer\"},\"opts\":{\"type\":\"object\"}}}}},"
    "{\"type\":\"function\",\"function\":{\"name\":\"now\",\"parameters\":{\"type\":\"object\"}}}]";

/* cap[0..n), which may hold NUL bytes */
static void check_capture_n(const char *cap, size_t n, const json_t *tools, int n_calls) {
    json_t *whole = srv_parse_tool_calls(cap, n, "x", tools);
    CHECKF(json_array_size(whole) == (size_t)n_calls, "whole parse of %s", cap);
    for (size_t step = 1; step <= n; step++) {
        srv_toolstream ts;
        memset(&ts, 0, sizeof ts);
        json_t *deltas = json_array();
        int early_string = 0;
        const char *first_close = strstr(cap, "</parameter>");
        for (size_t off = step < n ? step : n;; off = off + step < n ? off + step : n) {
            size_t before = json_array_size(deltas);
            srv_toolstream_feed(&ts, cap, off, tools, "x", deltas);
            /* a string argument's characters go out before its closing tag arrives */
            for (size_t k = before; k < json_array_size(deltas); k++) {
                const char *a = json_string_value(json_object_get(json_object_get(json_array_get(deltas, k), "function"), "arguments"));
                if (a && strchr(a, 'P') && first_close && off < (size_t)(first_close - cap)) early_string = 1;
            }
            if (off == n) break;
        }
        CHECKF(!ts.broken && ts.n_calls == n_calls, "step %zu: %d calls streamed, broken %d", step, ts.n_calls, ts.broken);
        for (int c = 0; c < n_calls; c++) {
            srv_buf args = {0};
            const char *id = NULL, *name = NULL;
            size_t i;
            json_t *d;
            json_array_foreach(deltas, i, d) {
                if (json_integer_value(json_object_get(d, "index")) != c) continue;
                if (!id) {
                    id = json_string_value(json_object_get(d, "id"));
                    name = json_string_value(json_object_get(json_object_get(d, "function"), "name"));
                }
                const char *a = json_string_value(json_object_get(json_object_get(d, "function"), "arguments"));
                if (a) srv_buf_append(&args, a, strlen(a));
            }
            json_t *want = json_object_get(json_array_get(whole, (size_t)c), "function");
            json_t *wargs = json_loads(json_string_value(json_object_get(want, "arguments")), 0, NULL);
            json_t *gargs = args.p ? json_loadb(args.p, args.n, 0, NULL) : NULL;
            CHECKF(id && !strcmp(id, json_string_value(json_object_get(json_array_get(whole, (size_t)c), "id"))),
                   "step %zu call %d: the id first", step, c);
            CHECKF(name && !strcmp(name, json_string_value(json_object_get(want, "name"))), "step %zu call %d: the name", step, c);
            CHECKF(gargs && json_equal(gargs, wargs), "step %zu call %d: streamed arguments '%.*s'", step, c, (int)args.n,
                   args.p ? args.p : "");
            json_decref(wargs);
            json_decref(gargs);
            srv_buf_free(&args);
        }
        if (strstr(cap, "<parameter=city>\nParis") && step <= 4) CHECKF(early_string, "step %zu: the string streamed early", step);
        json_decref(deltas);
    }
    json_decref(whole);
}

static void check_capture(const char *cap, const json_t *tools, int n_calls) {
    check_capture_n(cap, strlen(cap), tools, n_calls);
}

int main(void) {
    json_t *tools = json_loads(TOOLS, 0, NULL);
    /* a function name holding a NUL byte names no tool: its values are typed as the whole
     * parse types them (untyped: true stays a boolean), not by the name's first part
     * (fuzz_model_output's finding: the stream cut the name at the NUL and typed "city" as
     * get_weather's string) */
    {
        static const char cap[] = "<tool_call>\n<function=get_weather\0x>\n<parameter=city>\ntrue\n</parameter>\n"
                                  "</function>\n</tool_call>";
        check_capture_n(cap, sizeof cap - 1, tools, 1);
    }
    check_capture("<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris \\\"}\", \"days\": [1, {\"a\": 2}]}}\n</tool_call>",
                  tools, 1);
    check_capture("<tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_weather\", "
                  "\"arguments\": {\"city\": \"\xc3\xa9t\xc3\xa9\"}}\n</tool_call>",
                  tools, 2);
    check_capture("<tool_call>\n<function=get_weather>\n<parameter=city>\nParis \xe2\x82\xac \"x\" </par\n</parameter>\n"
                  "<parameter=days>\n3\n</parameter>\n<parameter=opts>\n{\"a\": [1]}\n</parameter>\n</function>\n</tool_call>\n"
                  "<tool_call>\n<function=now>\n</function>\n</tool_call>",
                  tools, 2);
    /* a string value written as a JSON string (as the grammar writes one with a length,
     * format or pattern): decoded, as the whole parse decodes it, not re-quoted; one
     * that only starts with a quote stays text */
    check_capture("<tool_call>\n<function=get_weather>\n<parameter=city>\n\"Oslo \\\"N\\\"\"\n</parameter>\n"
                  "<parameter=days>\n2\n</parameter>\n</function>\n</tool_call>",
                  tools, 1);
    check_capture("<tool_call>\n<function=get_weather>\n<parameter=city>\n\"Oslo\" and Bergen\n</parameter>\n"
                  "</function>\n</tool_call>",
                  tools, 1);
    /* shapes that do not stream piece by piece go out whole once their block is there,
     * after calls that did stream: a second call without arguments, arguments as a
     * string, the name after the arguments, members after the arguments, a head of
     * over 600 bytes */
    check_capture("<tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n</tool_call>\n<tool_call>\n{\"name\": \"now\"}\n"
                  "</tool_call>",
                  tools, 2);
    check_capture("<tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_weather\", "
                  "\"arguments\": \"{\\\"city\\\": \\\"Oslo\\\"}\"}\n</tool_call>",
                  tools, 2);
    check_capture("<tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n</tool_call>\n<tool_call>\n{\"arguments\": "
                  "{\"city\": \"Oslo\"}, \"name\": \"get_weather\"}\n</tool_call>",
                  tools, 2);
    check_capture("<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}, \"note\": {\"a\": \"}\"}}\n"
                  "</tool_call>\n<tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n</tool_call>",
                  tools, 2);
    {
        char cap[1200];
        snprintf(cap, sizeof cap,
                 "<tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n</tool_call>\n<tool_call>\n{\"name\": \"now\", "
                 "\"note\": \"%0700d\", \"arguments\": {}}\n</tool_call>",
                 0);
        check_capture(cap, tools, 2);
    }
    /* XML: a string value written with whitespace before its JSON string is decoded as
     * the whole parse decodes it; a parameter name whose JSON form is long */
    check_capture("<tool_call>\n<function=get_weather>\n<parameter=city>\n  \"Oslo\"\n</parameter>\n</function>\n"
                  "</tool_call>",
                  tools, 1);
    {
        char cap[800], key[200];
        for (int i = 0; i < 150; i++) key[i] = '\x01';
        key[150] = 0;
        snprintf(cap, sizeof cap, "<tool_call>\n<function=now>\n<parameter=%s>\n1\n</parameter>\n</function>\n</tool_call>",
                 key);
        check_capture(cap, tools, 1);
    }
    /* not a call: streaming stops, nothing is claimed */
    srv_toolstream ts;
    memset(&ts, 0, sizeof ts);
    json_t *deltas = json_array();
    const char *bad = "<tool_call>\nhello";
    srv_toolstream_feed(&ts, bad, strlen(bad), tools, "x", deltas);
    CHECK(ts.broken && ts.n_calls == 0 && json_array_size(deltas) == 0);
    json_decref(deltas);
    json_decref(tools);
    return qd_test_finish("test_tool_stream");
}
