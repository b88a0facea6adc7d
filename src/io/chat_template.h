/* Chat-template renderer: a Jinja2 subset interpreter sufficient for Hugging Face
 * chat templates (Qwen3, Qwen3-Next, Qwen3.5), configured the way transformers'
 * apply_chat_template configures Jinja2: trim_blocks, lstrip_blocks, the
 * loopcontrols extension, permissive Undefined, autoescape off, and a tojson
 * filter that matches json.dumps(ensure_ascii=False).
 *
 * A template is compiled once (parse errors and unknown filters/tests are
 * reported there, with the template line) and may be rendered any number of
 * times; rendering does not modify the compiled template, so one template can be
 * rendered from several threads at once.
 *
 * Hostile templates cannot hang or exhaust memory: rendering is bounded by the
 * limits below and fails with a message saying which limit was hit. */
#ifndef QD_IO_CHAT_TEMPLATE_H
#define QD_IO_CHAT_TEMPLATE_H

#include <stddef.h>

#include "base/err.h"

typedef struct qd_chat_template qd_chat_template;

/* Bounds applied while rendering. Zero fields take the defaults. */
typedef struct qd_chat_template_limits {
    size_t max_output;      /* bytes of rendered text (default 64 MiB) */
    size_t max_memory;      /* bytes allocated for intermediate values (default 256 MiB) */
    long long max_steps;    /* evaluation steps, roughly nodes visited (default 50M) */
    int max_depth;          /* nested macro calls / evaluation recursion (default 200) */
} qd_chat_template_limits;

/* Compiles `len` bytes of template source. On failure *out is NULL and err names
 * the problem and the line. */
qd_status qd_chat_template_compile(const char *src, size_t len, qd_chat_template **out, qd_err *err);

/* Reads the template of a Hugging Face checkpoint or tokenizer directory:
 * DIR/chat_template.jinja if present (it overrides the config, as in
 * transformers), else the `chat_template` of DIR/tokenizer_config.json (a
 * string, or a list of {name, template} entries from which "default" is
 * taken), else that of DIR/chat_template.json. */
qd_status qd_chat_template_load_dir(const char *dir, qd_chat_template **out, qd_err *err);

void qd_chat_template_free(qd_chat_template *tpl);
/* The source the template was compiled from (NUL-terminated; len bytes, which may hold
 * NUL bytes), valid while tpl lives. */
const char *qd_chat_template_source(const qd_chat_template *tpl, size_t *len);

/* Renders with the variables of a JSON object: `messages`, optional `tools`,
 * `add_generation_prompt`, `enable_thinking`, and any other key (bos_token,
 * eos_token, ...) passed through as a template variable. *out is a malloc'd,
 * NUL-terminated string (free() it); *out_len (if non-NULL) its length.
 * A template's raise_exception("msg") fails the render with that message. */
qd_status qd_chat_template_render(const qd_chat_template *tpl, const char *request_json,
                                  char **out, size_t *out_len, qd_err *err);

/* Same, with the variables as a jansson object (json_t *; declared void * so
 * that this header does not require jansson.h) and explicit limits (may be NULL). */
qd_status qd_chat_template_render_json(const qd_chat_template *tpl, const void *vars,
                                       const qd_chat_template_limits *limits,
                                       char **out, size_t *out_len, qd_err *err);

/* 1 when the template renders a message whose content is a list of text parts
 * ([{"type": "text", "text": ...}], the OpenAI form) with the parts' text in it, as
 * Qwen3.5's does; 0 when it takes string content only (Qwen3's adds the list to a
 * string and fails), so that a caller hands such a template the parts' text joined
 * instead, as vLLM does. Found by rendering one such message. */
int qd_chat_template_renders_content_parts(const qd_chat_template *tpl);

#endif
