/* Chat prompts: render the checkpoint's own chat template over a message list and
 * tokenize the result (special tokens in the rendered text are matched as added
 * tokens, exactly as transformers' apply_chat_template(tokenize=True) does). */
#ifndef QD_CLI_CHAT_PROMPT_H
#define QD_CLI_CHAT_PROMPT_H

#include <stdbool.h>
#include <stdint.h>

#include "io/chat_template.h"
#include "io/tokenizer.h"

/* Renders `request_json` (messages, tools, add_generation_prompt, enable_thinking)
 * with DIR's template; prints errors. *text is malloc'd. */
int cli_render_chat(const qd_chat_template *tpl, const char *request_json, char **text, size_t *len);
/* One user message (and an optional system message) -> prompt ids. */
int cli_chat_prompt_ids(const char *dir, const qd_tokenizer *tok, const char *system_msg, const char *user_msg,
                        bool enable_thinking, int32_t **ids, int *n);
int cli_load_chat_template(const char *dir, qd_chat_template **out);

#endif
