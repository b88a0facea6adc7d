/* libFuzzer: arbitrary bytes as a model's generated text, through the server's output
 * path as gen.c drives it: the reasoning split (think.c), the tool-call capture
 * (tool_calls.c), the streamed tool-call deltas (tool_stream.c) and the parse of the
 * whole capture at the end. The text goes through twice, once as one piece and once
 * cut into pieces of 1-16 bytes picked from the input. Nothing may crash, hang or
 * leak, and the cut must not matter: the same reasoning, content and capture, the
 * same streamed calls (names, ids, joined arguments) and the same point where
 * streaming gave up. And a streaming client must get the calls a non-streaming one
 * gets: where the whole capture parses and some call was streamed, streaming did not
 * give up and streamed exactly the parsed calls (gen.c sends the parsed calls at the
 * end only when none was streamed).
 * The text is made valid UTF-8 first and cut only between characters, as the
 * detokenizer hands it on (tokenizer.h: invalid bytes become U+FFFD, a character is
 * held until whole).
 * Input: byte 0 = options (bit 0 thinking on, bit 1 the prompt opened <think>, bit 2
 * no tools in the request, bits 3-7 seed the cuts), then the text. The server's
 * sources belong to the qdelta executable, not the library, so they are compiled in. */
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "server/think.c"
#include "server/tool_calls.c"
#include "server/tool_stream.c"
#include "server/util.c"
#include "io/tokenizer.h"

static const char TOOLS[] =
    "[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"parameters\":{\"type\":\"object\",\"properties\":"
    "{\"city\":{\"type\":\"string\"},\"days\":{\"type\":\"integer\"},\"opts\":{\"type\":\"object\"},"
    "\"when\":{\"type\":[\"string\",\"null\"]}}}}},"
    "{\"type\":\"function\",\"function\":{\"name\":\"now\",\"parameters\":{\"type\":\"object\"}}}]";

typedef struct run_out {
    srv_think think;
    srv_toolcap cap;
    srv_toolstream ts;
    const json_t *tools;
    srv_buf text[2]; /* content, reasoning */
    json_t *deltas;
} run_out;

static void out_cb(void *user, int reasoning, const char *t, size_t n) {
    run_out *r = user;
    if (srv_buf_append(&r->text[reasoning ? 1 : 0], t, n)) abort();
}

static void stream_deltas(run_out *r) {
    if (!r->cap.capturing || r->ts.broken) return;
    srv_toolstream_feed(&r->ts, r->cap.cap.p, r->cap.cap.n, r->tools, "f", r->deltas);
}

static void emit_cb(void *user, int reasoning, const char *t, size_t n) {
    run_out *r = user;
    if (reasoning) {
        out_cb(r, 1, t, n);
        return;
    }
    srv_toolcap_push(&r->cap, t, n, 0, out_cb, r);
    stream_deltas(r);
}

/* cut = 0: one piece; else pieces of 1-16 bytes from an LCG seeded by cut */
static void run(run_out *r, uint8_t opts, const json_t *tools, const char *text, size_t n, unsigned cut) {
    memset(r, 0, sizeof *r);
    r->think.enabled = opts & 1;
    r->think.in_think = r->think.saw_tag = (opts & 1) && (opts & 2);
    r->cap.enabled = 1;
    r->tools = tools;
    r->deltas = json_array();
    uint32_t s = cut * 2654435761u + 1;
    for (size_t off = 0; off < n;) {
        size_t piece = n - off;
        if (cut) {
            s = s * 1664525u + 1013904223u;
            size_t want = 1 + (s >> 28);
            while (want < piece && (text[off + want] & 0xC0) == 0x80) want++; /* whole characters */
            if (want < piece) piece = want;
        }
        srv_think_push(&r->think, text + off, piece, 0, emit_cb, r);
        off += piece;
    }
    srv_think_push(&r->think, "", 0, 1, emit_cb, r);
    srv_toolcap_push(&r->cap, "", 0, 1, out_cb, r);
    stream_deltas(r);
}

static void run_free(run_out *r) {
    srv_think_free(&r->think);
    srv_toolcap_free(&r->cap);
    srv_buf_free(&r->text[0]);
    srv_buf_free(&r->text[1]);
    json_decref(r->deltas);
}

static int same_buf(const srv_buf *a, const srv_buf *b) { return a->n == b->n && (!a->n || !memcmp(a->p, b->p, a->n)); }

/* Call c of a delta stream joined: its first delta's id and name, its arguments. */
static void joined(const json_t *deltas, int c, const char **id, const char **name, srv_buf *args) {
    size_t i;
    json_t *d;
    *id = *name = NULL;
    json_array_foreach(deltas, i, d) {
        if (json_integer_value(json_object_get(d, "index")) != c) continue;
        const json_t *f = json_object_get(d, "function");
        if (!*id) {
            *id = json_string_value(json_object_get(d, "id"));
            *name = json_string_value(json_object_get(f, "name"));
            if (!*id || !*name) abort(); /* a call's first delta names it */
        }
        const json_t *a = json_object_get(f, "arguments"); /* text may hold NUL bytes: by length */
        if (a && srv_buf_append(args, json_string_value(a), json_string_length(a))) abort();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1 || size > 4096) return 0;
    const uint8_t opts = data[0];
    size_t n;
    char *text = qd_utf8_lossy(data + 1, size - 1, &n);
    if (!text) return 0;
    json_t *tools = (opts & 4) ? NULL : json_loads(TOOLS, 0, NULL);
    run_out a, b;
    run(&a, opts, tools, text, n, 0);
    run(&b, opts, tools, text, n, 1u + (opts >> 3));
    if (!same_buf(&a.text[0], &b.text[0]) || !same_buf(&a.text[1], &b.text[1])) abort();
    if (a.cap.capturing != b.cap.capturing || !same_buf(&a.cap.cap, &b.cap.cap)) abort();
    if (a.ts.broken != b.ts.broken || a.ts.n_calls != b.ts.n_calls) abort();
    json_t *whole = a.cap.capturing ? srv_parse_tool_calls(a.cap.cap.p, a.cap.cap.n, "f", tools) : NULL;
    for (int c = 0; c < a.ts.n_calls; c++) {
        const char *ia, *na, *ib, *nb;
        srv_buf aa = {0}, ab = {0};
        joined(a.deltas, c, &ia, &na, &aa);
        joined(b.deltas, c, &ib, &nb, &ab);
        if (!ia || !ib || strcmp(ia, ib) || strcmp(na, nb) || !same_buf(&aa, &ab)) abort();
        if (whole) {
            /* streamed and parsed whole: the same call */
            const json_t *wc = json_array_get(whole, (size_t)c), *wf = json_object_get(wc, "function");
            if (!wc || strcmp(ia, json_string_value(json_object_get(wc, "id"))) ||
                strcmp(na, json_string_value(json_object_get(wf, "name"))))
                abort();
            const json_t *wa = json_object_get(wf, "arguments");
            json_t *want = json_loadb(json_string_value(wa), json_string_length(wa), JSON_ALLOW_NUL, NULL);
            json_t *got = aa.p ? json_loadb(aa.p, aa.n, JSON_ALLOW_NUL, NULL) : NULL;
            if (!want || !got || !json_equal(want, got)) abort();
            json_decref(want);
            json_decref(got);
        }
        srv_buf_free(&aa);
        srv_buf_free(&ab);
    }
    if (whole && a.ts.n_calls && (a.ts.broken || json_array_size(whole) != (size_t)a.ts.n_calls)) abort();
    json_decref(whole);
    run_free(&a);
    run_free(&b);
    json_decref(tools);
    free(text);
    return 0;
}
