/* Incremental tool-call deltas (tool_stream.h). */
#include "server/tool_stream.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/tool_calls.h"

enum {
    TS_SEEK = 0,      /* before a <tool_call> (or between calls) */
    TS_HERMES_ARGS,   /* inside the "arguments" object */
    TS_HERMES_END,    /* after it: the call object's end or more members */
    TS_HERMES_REST,   /* members after "arguments", up to the call object's end */
    TS_TAIL,          /* after a call's content, before </tool_call> */
    TS_XML_BODY,      /* inside <function=...>, between parameters */
    TS_XML_VALUE,     /* inside a parameter's value */
    TS_BLOCK,         /* a call not streamed piece by piece: waiting for its </tool_call> */
};

static const char ts_open[] = "<tool_call>", ts_close[] = "</tool_call>";

static size_t skip_ws(const char *s, size_t i, size_t n) {
    while (i < n && isspace((unsigned char)s[i])) i++;
    return i;
}

/* 1: s[i..) starts with lit; 0: cannot (yet: -1 means it may, once more bytes come). */
static int starts(const char *s, size_t i, size_t n, const char *lit) {
    size_t l = strlen(lit), have = n - i < l ? n - i : l;
    if (memcmp(s + i, lit, have)) return 0;
    return have == l ? 1 : -1;
}

static json_t *call_delta(srv_toolstream *ts, const char *name, size_t nn, const char *id_prefix) {
    char id[96];
    snprintf(id, sizeof id, "call_%s_%d", id_prefix, ts->n_calls);
    json_t *d = json_pack("{s:i, s:s, s:s, s:{s:s%, s:s}}", "index", ts->n_calls, "id", id, "type", "function", "function",
                          "name", name, nn, "arguments", "");
    ts->n_calls++;
    return d;
}

static void args_delta(srv_toolstream *ts, json_t *deltas, const char *a, size_t n) {
    if (!n) return;
    json_array_append_new(deltas, json_pack("{s:i, s:{s:s%}}", "index", ts->n_calls - 1, "function", "arguments", a, n));
}

static void args_str(srv_toolstream *ts, json_t *deltas, const char *a) { args_delta(ts, deltas, a, strlen(a)); }

/* The call whose text starts at `body` goes out whole once its </tool_call> has come
 * (block_call); returns where the scan goes on. */
static size_t as_block(srv_toolstream *ts, size_t body) {
    ts->block = body;
    ts->phase = TS_BLOCK;
    return body;
}

/* A <tool_call> and what follows up to the call's name: returns the bytes consumed,
 * 0 when more are needed; sets ts->broken when it is not a call. Only the forms below
 * stream piece by piece, and only where srv_parse_tool_calls reads the same call from
 * the finished text (or none at all); any other block goes out whole (TS_BLOCK). */
static size_t seek_call(srv_toolstream *ts, const char *s, size_t n, const char *id_prefix, json_t *deltas) {
    size_t i = skip_ws(s, ts->pos, n);
    if (i == n) return 0;
    int k = starts(s, i, n, ts_open);
    if (k <= 0) {
        if (k == 0) ts->broken = 1;
        return 0;
    }
    const size_t body = i + sizeof ts_open - 1;
    i = skip_ws(s, body, n);
    if (i == n) return 0;
    if (s[i] == '{') {
        /* {"name": "NAME", ..., "arguments": { -- complete the head and read the name.
         * The key is looked for in the head's first 600 bytes before the block's end
         * only, so that the choice does not depend on how the text arrived. */
        const char *a = NULL, *close = memmem(s + i, n - i, ts_close, sizeof ts_close - 1);
        const size_t window = i + 600 + 11;
        size_t to = close ? (size_t)(close - s) : n;
        if (to > window) to = window;
        for (size_t j = i; j + 11 <= to; j++)
            if (!memcmp(s + j, "\"arguments\"", 11)) {
                a = s + j;
                break;
            }
        if (!a) return (close || n >= window) ? as_block(ts, body) : 0;
        size_t j = skip_ws(s, (size_t)(a - s) + 11, n);
        if (j == n) return 0;
        if (s[j] != ':') return as_block(ts, body);
        j = skip_ws(s, j + 1, n);
        if (j == n) return 0;
        if (s[j] != '{') return as_block(ts, body); /* arguments as a string: decoded once whole */
        size_t hl = (size_t)(a - s) - i;
        char *head = malloc(hl + 8);
        if (!head) return ts->broken = 1, 0;
        memcpy(head, s + i, hl);
        memcpy(head + hl, "\"x\":0}", 7);
        json_t *h = json_loadb(head, hl + 6, JSON_REJECT_DUPLICATES, NULL);
        free(head);
        const json_t *name = json_object_get(h, "name");
        if (!json_is_string(name)) { /* the name after the arguments, say */
            json_decref(h);
            return as_block(ts, body);
        }
        json_array_append_new(deltas, call_delta(ts, json_string_value(name), json_string_length(name), id_prefix));
        json_decref(h);
        ts->depth = ts->in_str = ts->esc = 0;
        ts->phase = TS_HERMES_ARGS;
        return j;
    }
    int f = starts(s, i, n, "<function=");
    if (f <= 0) {
        if (f == 0) ts->broken = 1;
        return 0;
    }
    const char *gt = memchr(s + i + 10, '>', n - i - 10);
    if (!gt) return n - i - 10 >= SRV_TOOL_NAME_MAX ? (ts->broken = 1, 0) : 0;
    size_t nn = (size_t)(gt - (s + i + 10));
    if (nn == 0 || nn >= SRV_TOOL_NAME_MAX) return ts->broken = 1, 0;
    memcpy(ts->fname, s + i + 10, nn);
    ts->fname[nn] = 0;
    ts->fname_len = nn;
    json_array_append_new(deltas, call_delta(ts, ts->fname, nn, id_prefix));
    ts->n_params = 0;
    ts->phase = TS_XML_BODY;
    return (size_t)(gt - s) + 1;
}

/* The end of s[from..n) without an incomplete UTF-8 character at its end (a delta
 * is a JSON string: it must hold whole characters). */
static size_t utf8_cut(const char *s, size_t from, size_t n) {
    for (size_t b = 1; b <= 3 && n >= from + b; b++) {
        unsigned char c = (unsigned char)s[n - b];
        if ((c & 0xc0) == 0x80) continue;
        size_t need = c >= 0xf0 ? 4 : c >= 0xe0 ? 3 : c >= 0xc0 ? 2 : 1;
        return need > b ? n - b : n;
    }
    return n;
}

/* A block that does not stream piece by piece, parsed as srv_parse_tool_calls parses
 * it once its </tool_call> is there, and sent in one delta. */
static void block_call(srv_toolstream *ts, const char *s, size_t n, const json_t *tools, const char *id_prefix,
                       json_t *deltas) {
    const size_t cl = sizeof ts_close - 1;
    const char *close = memmem(s + ts->pos, n - ts->pos, ts_close, cl);
    if (!close) {
        if (n >= cl && n - (cl - 1) > ts->pos) ts->pos = n - (cl - 1); /* the tag may still start there */
        return;
    }
    json_t *f = srv_parse_tool_call_body(s + ts->block, (size_t)(close - (s + ts->block)), tools);
    const json_t *name = json_object_get(f, "name");
    if (!json_is_string(name)) {
        json_decref(f);
        ts->broken = 1;
        return;
    }
    json_t *d = call_delta(ts, json_string_value(name), json_string_length(name), id_prefix);
    json_object_set(json_object_get(d, "function"), "arguments", json_object_get(f, "arguments"));
    json_array_append_new(deltas, d);
    json_decref(f);
    ts->pos = (size_t)(close - s) + cl;
    ts->phase = TS_SEEK;
}

/* The JSON scan (strings, escapes, nesting in ts) over s[*i..n), *i advanced: 1 when it
 * closed the value it was in (*i just past that byte), 0 when it reached n. */
static int json_close(srv_toolstream *ts, const char *s, size_t *i, size_t n) {
    for (; *i < n; (*i)++) {
        const char c = s[*i];
        if (ts->in_str) {
            if (ts->esc) ts->esc = 0;
            else if (c == '\\') ts->esc = 1;
            else if (c == '"') ts->in_str = 0;
        } else if (c == '"') ts->in_str = 1;
        else if (c == '{' || c == '[') ts->depth++;
        else if ((c == '}' || c == ']') && --ts->depth == 0) {
            (*i)++;
            return 1;
        }
    }
    return 0;
}

/* Hermes arguments (an object: seek_call starts here at its '{'): bytes passed on until
 * it closes. */
static void hermes_args(srv_toolstream *ts, const char *s, size_t n, json_t *deltas) {
    size_t e = ts->pos;
    const int closed = json_close(ts, s, &e, utf8_cut(s, ts->pos, n));
    args_delta(ts, deltas, s + ts->pos, e - ts->pos);
    ts->pos = e;
    if (closed) ts->phase = TS_HERMES_END;
}

/* After the arguments: the call object's closing brace, or more members first. */
static void hermes_end(srv_toolstream *ts, const char *s, size_t n) {
    size_t i = skip_ws(s, ts->pos, n);
    if (i == n) return;
    if (s[i] == '}') ts->phase = TS_TAIL;
    else if (s[i] == ',') {
        ts->phase = TS_HERMES_REST;
        ts->depth = 1;
        ts->in_str = ts->esc = 0;
    } else {
        ts->broken = 1;
        return;
    }
    ts->pos = i + 1;
}

/* Members after the arguments: skipped up to the call object's closing brace (the
 * parse of the finished text checks them). */
static void hermes_rest(srv_toolstream *ts, const char *s, size_t n) {
    if (json_close(ts, s, &ts->pos, n)) ts->phase = TS_TAIL;
}

static void json_key(srv_toolstream *ts, json_t *deltas, const char *key) {
    json_t *k = json_string(key);
    char *q = k ? json_dumps(k, JSON_ENCODE_ANY) : NULL;
    json_decref(k);
    srv_buf b = {0}; /* one delta: ", " or "{", the key as a JSON string (any length), ": " */
    const char *pre = ts->n_params ? ", " : "{";
    if (!srv_buf_append(&b, pre, strlen(pre)) && !srv_buf_append(&b, q ? q : "\"\"", q ? strlen(q) : 2) &&
        !srv_buf_append(&b, ": ", 2))
        args_delta(ts, deltas, b.p, b.n);
    srv_buf_free(&b);
    free(q);
    ts->n_params++;
}

/* XML between parameters: a new <parameter=P>, or </function>. */
static void xml_body(srv_toolstream *ts, const char *s, size_t n, const json_t *tools, json_t *deltas) {
    size_t i = skip_ws(s, ts->pos, n);
    if (i == n) return;
    int p = starts(s, i, n, "<parameter=");
    if (p == 1) {
        const char *gt = memchr(s + i + 11, '>', n - i - 11);
        if (!gt) return;
        size_t kn = (size_t)(gt - (s + i + 11));
        if (kn == 0 || kn >= sizeof ts->param) {
            ts->broken = 1;
            return;
        }
        size_t v = (size_t)(gt - s) + 1;
        if (v == n) return; /* the newline after the tag may follow */
        if (s[v] == '\n') v++;
        memcpy(ts->param, s + i + 11, kn);
        ts->param[kn] = 0;
        const json_t *schema = srv_tool_param_schema(tools, ts->fname, ts->fname_len, ts->param);
        const json_t *type = json_object_get(schema, "type");
        ts->string_param = json_is_string(type) && !strcmp(json_string_value(type), "string") &&
                           !json_object_get(schema, "enum");
        json_key(ts, deltas, ts->param);
        ts->value_started = 0;
        ts->pos = ts->scan = v;
        ts->phase = TS_XML_VALUE;
        return;
    }
    int f = starts(s, i, n, "</function>");
    if (f == 1) {
        args_str(ts, deltas, ts->n_params ? "}" : "{}");
        ts->pos = i + 11;
        ts->phase = TS_TAIL;
        return;
    }
    if (p == 0 && f == 0) ts->broken = 1;
}

static void xml_value(srv_toolstream *ts, const char *s, size_t n, const json_t *tools, json_t *deltas) {
    static const char end_tag[] = "</parameter>";
    const size_t from = ts->scan > ts->pos ? ts->scan : ts->pos, tl = sizeof end_tag - 1;
    const char *e = memmem(s + from, n - from, end_tag, tl);
    if (!e && n - from >= tl) ts->scan = n - (tl - 1); /* the tag may still start there */
    if (ts->string_param && !ts->value_started) {
        /* the value's first byte past any whitespace decides: a value written as a JSON
         * string ("...", as the grammar writes a string with a length, format or
         * pattern) goes out whole at its end, typed as srv_parse_tool_calls types it
         * (decoded when it is one JSON string); any other text is the string itself */
        const size_t i = skip_ws(s, ts->pos, e ? (size_t)(e - s) : n);
        if (!e && i == n) return;
        if (s[i] == '"') ts->string_param = 0;
        else args_str(ts, deltas, "\"");
        ts->value_started = 1;
    }
    size_t stop = e ? (size_t)(e - s) : n;
    size_t vend = stop;
    if (e && vend > ts->pos && s[vend - 1] == '\n') vend--; /* the format's newline */
    if (!ts->string_param) {
        if (!e) return; /* typed values go out whole */
        json_t *v = srv_tool_param_value(srv_tool_param_schema(tools, ts->fname, ts->fname_len, ts->param),
                                         s + ts->pos, vend - ts->pos);
        char *txt = v ? json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT) : NULL;
        json_decref(v);
        if (txt) args_str(ts, deltas, txt);
        free(txt);
    } else {
        if (!e) {
            /* hold back what may start "\n</parameter>" and an incomplete UTF-8 character */
            size_t hold = 0;
            for (size_t k = 1; k <= sizeof end_tag && k <= n - ts->pos; k++) {
                const char *tail = s + n - k;
                if (!memcmp(tail, "\n</parameter>", k) || !memcmp(tail, end_tag, k)) hold = k;
            }
            size_t cut = utf8_cut(s, ts->pos, n - hold);
            vend = cut;
        }
        if (vend > ts->pos) {
            json_t *str = json_stringn(s + ts->pos, vend - ts->pos);
            char *q = str ? json_dumps(str, JSON_ENCODE_ANY) : NULL;
            json_decref(str);
            if (q) args_delta(ts, deltas, q + 1, strlen(q) - 2); /* without its quotes */
            free(q);
        }
        if (!e) {
            ts->pos = vend;
            return;
        }
        args_str(ts, deltas, "\"");
    }
    ts->pos = stop + sizeof end_tag - 1;
    ts->phase = TS_XML_BODY;
}

void srv_toolstream_feed(srv_toolstream *ts, const char *cap, size_t n, const json_t *tools, const char *id_prefix,
                         json_t *deltas) {
    for (int guard = 0; !ts->broken && ts->pos < n && guard < 1000; guard++) {
        size_t before = ts->pos;
        int phase = ts->phase;
        switch (ts->phase) {
        case TS_SEEK: {
            size_t to = seek_call(ts, cap, n, id_prefix, deltas);
            if (to) ts->pos = to;
            break;
        }
        case TS_HERMES_ARGS: hermes_args(ts, cap, n, deltas); break;
        case TS_HERMES_END: hermes_end(ts, cap, n); break;
        case TS_HERMES_REST: hermes_rest(ts, cap, n); break;
        case TS_BLOCK: block_call(ts, cap, n, tools, id_prefix, deltas); break;
        case TS_XML_BODY: xml_body(ts, cap, n, tools, deltas); break;
        case TS_XML_VALUE: xml_value(ts, cap, n, tools, deltas); break;
        case TS_TAIL: {
            size_t i = skip_ws(cap, ts->pos, n);
            if (i == n) break;
            int k = starts(cap, i, n, ts_close);
            if (k == 0) ts->broken = 1;
            if (k == 1) {
                ts->pos = i + sizeof ts_close - 1;
                ts->phase = TS_SEEK;
            }
            break;
        }
        }
        if (ts->pos == before && ts->phase == phase) break; /* needs more bytes */
    }
}
