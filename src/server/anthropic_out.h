/* Output of the Anthropic Messages API (POST /v1/messages): the message body and the
 * stream's events, built from what a generation gathered (server/gen.c calls these
 * for SRV_MESSAGES generations, under the generation's lock). */
#ifndef QD_SERVER_ANTHROPIC_OUT_H
#define QD_SERVER_ANTHROPIC_OUT_H

#include "server/server.h"

/* `finish` is gen.c's OpenAI-style finish reason ("stop", "length", "tool_calls",
 * "abort"), NULL while the stream goes on. */
void srv_anthropic_stream(srv_gen *g, const char *finish);
void srv_anthropic_body(srv_gen *g, const char *finish);
/* An error after the stream started: an `error` event. */
void srv_anthropic_stream_error(srv_gen *g, const srv_error *e);

#endif
