/* Structured outputs and enforced tool calls: response_format and tool_choice turned
 * into a grammar constraint on the request's output (runtime/grammar). */
#ifndef QD_SERVER_STRUCTURED_H
#define QD_SERVER_STRUCTURED_H

#include <jansson.h>

#include "server/server.h"

/* Largest schema accepted, in bytes of its compact JSON: beyond it a 400. */
#define SRV_MAX_SCHEMA_BYTES (64 * 1024)

/* Validates `tools` (every entry {"type": "function", "function": {"name", "parameters"?}})
 * and `tool_choice`, and reads `response_format`; builds the constraint the request
 * needs, or none (*out = NULL): response_format json_object / json_schema; tool_choice
 * "required" or a named function (calls in the form the prompt asked for: Qwen3.5
 * XML when it shows <function=, else hermes JSON; one call unless
 * parallel_tool_calls). `prompt` is the rendered prompt (chat) or NULL; `in_think`:
 * the prompt opened a reasoning block, so the constraint starts after </think>.
 * 0, or -1 with e set (400 naming the field, the keyword and its path). */
int srv_structured_setup(srv_server *s, json_t *req, srv_kind kind, const char *prompt, int in_think,
                         qd_constraint **out, srv_error *e);
/* Checks `tools` and `tool_choice` alone; *enforced: tool_choice demands a call. */
int srv_check_tools(json_t *req, int *enforced, srv_error *e);

#endif
