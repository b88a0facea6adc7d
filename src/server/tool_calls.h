/* Tool calls in generated text, for requests that pass `tools`. Two formats, both
 * inside <tool_call>...</tool_call> blocks:
 *   Qwen3 / Hermes:   {"name": "f", "arguments": {...}}
 *   Qwen3.5 / Coder:  <function=f>\n<parameter=p>\nvalue\n</parameter>\n</function>
 * Content before the first <tool_call> stays content; from the tag on, the text is
 * captured (not streamed as content) and parsed when generation ends. Text that does
 * not parse is given back as content, so nothing the model wrote is lost. */
#ifndef QD_SERVER_TOOL_CALLS_H
#define QD_SERVER_TOOL_CALLS_H

#include <jansson.h>

#include "server/think.h"

/* Function and parameter names are shorter than this (OpenAI allows 64 characters):
 * a longer one is not a call, streamed or parsed whole. */
#define SRV_TOOL_NAME_MAX 256

typedef struct srv_toolcap {
    int enabled;
    int capturing;  /* a <tool_call> tag was seen: everything since is in `cap` */
    srv_buf hold;   /* bytes that may start the tag */
    srv_buf cap;
} srv_toolcap;

/* Content piece in; content that is certainly not a tool call goes to emit (with
 * reasoning = 0). final = 1 at the end. */
void srv_toolcap_push(srv_toolcap *t, const char *s, size_t n, int final, srv_think_emit emit, void *user);
void srv_toolcap_free(srv_toolcap *t);

/* Parses captured text into an array of OpenAI tool calls
 * [{"id", "type": "function", "function": {"name", "arguments": "<json string>"}}];
 * NULL when it holds no well-formed call. `id_prefix` makes the ids unique. `tools`
 * (the request's, may be NULL) types the XML form's values by each parameter's
 * schema. */
json_t *srv_parse_tool_calls(const char *text, size_t n, const char *id_prefix, const json_t *tools);
/* One block's text between <tool_call> and </tool_call>, as srv_parse_tool_calls reads
 * it: {"name", "arguments": "<json string>"} or NULL. */
json_t *srv_parse_tool_call_body(const char *body, size_t n, const json_t *tools);

/* The schema of parameter `key` of function name[0..nn) in `tools`; NULL: unknown. */
const json_t *srv_tool_param_schema(const json_t *tools, const char *name, size_t nn, const char *key);
/* A parameter's text typed by its schema (NULL: by its look): text that parses as JSON
 * of an allowed type keeps that type, text for a string parameter stays a string. */
json_t *srv_tool_param_value(const json_t *schema, const char *v, size_t vn);
/* 1 when a schema's "type" (a name or an array of names) allows type t. */
int srv_type_allows(const json_t *type, const char *t);

#endif
