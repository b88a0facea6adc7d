/* Tool calls streamed as OpenAI deltas while they are generated: for each call, a
 * first delta with its index, id, type and function name as soon as the name is
 * complete, then argument fragments as they arrive. Reads the tool-call capture
 * (tool_calls.h) incrementally, in both forms:
 *   hermes JSON {"name": ..., "arguments": {...}}: the text of the arguments object
 *   is passed on byte for byte;
 *   Qwen3.5 XML: the parameters are written as a JSON object, string parameters
 *   (by the tool's schema) streamed character by character (escaped), other values
 *   once complete, typed by the schema (srv_tool_param_value).
 * A call in another shape that srv_parse_tool_calls reads (the name after the
 * arguments, arguments as a string, ...) goes out in one delta once its </tool_call>
 * has come. The rule: whenever the finished capture parses, the streamed calls are
 * the parsed ones (fuzz/fuzz_model_output.c checks it). Text that stops fitting either
 * form ends the streaming (`broken`); the caller then falls back to parsing the whole
 * capture at the end. */
#ifndef QD_SERVER_TOOL_STREAM_H
#define QD_SERVER_TOOL_STREAM_H

#include <jansson.h>
#include <stddef.h>

#include "server/tool_calls.h"

typedef struct srv_toolstream {
    size_t pos;          /* bytes of the capture consumed */
    size_t block;        /* TS_BLOCK: where the call's text starts (after <tool_call>) */
    int phase;           /* see tool_stream.c */
    int n_calls;         /* calls whose first delta went out */
    int broken;
    /* hermes: the arguments value being scanned */
    int depth, in_str, esc;
    /* XML: the current call and parameter */
    char fname[SRV_TOOL_NAME_MAX];
    size_t fname_len;    /* its length: a name may hold NUL bytes, which must not shorten it */
    char param[SRV_TOOL_NAME_MAX];
    int n_params, string_param;
    int value_started;   /* XML string value: its opening quote went out (raw text, not a JSON string) */
    size_t scan;         /* XML value: where the search for its </parameter> resumes (a typed value's
                          * bytes stay unconsumed until it ends, so each search starts past the last) */
} srv_toolstream;

/* Consumes what it can of cap[0..n) and appends the deltas it completes to `deltas`
 * (a JSON array). `tools` types XML values; `id_prefix` makes the ids, as
 * srv_parse_tool_calls does (so a call has the same id streamed or not). */
void srv_toolstream_feed(srv_toolstream *ts, const char *cap, size_t n, const json_t *tools, const char *id_prefix,
                         json_t *deltas);

#endif
