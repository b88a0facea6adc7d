/* libFuzzer target for the chat-template renderer (target name: fuzz_chat_template).
 *
 * Input layout: the first two bytes (little endian) give the template length
 * (modulo the remaining size); the template follows, and the rest is the
 * render-variables JSON. When that JSON is not an object, a fixed conversation
 * is used instead so that mutated templates still see realistic variables.
 * Compile and render must return an error or output, never crash or hang;
 * tight limits keep each run fast.
 *
 * Build by hand:
 *   clang -g -O1 -fsanitize=fuzzer,address,undefined -D_GNU_SOURCE -Isrc -Iinclude \
 *     fuzz/fuzz_chat_template.c src/io/chat_template*.c src/base/err.c -ljansson -lutf8proc -lm
 */
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "io/chat_template.h"

static const char DEFAULT_VARS[] =
    "{\"messages\": [{\"role\": \"system\", \"content\": \"sys\"},"
    " {\"role\": \"user\", \"content\": \"hi <tool_response>x</tool_response>\"},"
    " {\"role\": \"assistant\", \"content\": \"<think>r</think>a\", \"reasoning_content\": \"why\","
    "  \"tool_calls\": [{\"type\": \"function\", \"function\": {\"name\": \"f\", \"arguments\": {\"a\": [1, 2.5, null, true, {\"b\": \"\\u00fc\"}]}}},"
    "                  {\"name\": \"g\", \"arguments\": \"{\\\"x\\\": 1}\"}]},"
    " {\"role\": \"tool\", \"content\": \"r1\"}, {\"role\": \"tool\", \"content\": \"r2\"},"
    " {\"role\": \"user\", \"content\": [{\"type\": \"text\", \"text\": \"t\"}, {\"type\": \"image\"}]}],"
    " \"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\", \"parameters\": {\"type\": \"object\"}}}],"
    " \"add_generation_prompt\": true, \"enable_thinking\": false, \"bos_token\": \"<s>\", \"n\": 3, \"s\": \"abc\"}";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 2) return 0;
    size_t rest = size - 2;
    size_t tlen = rest ? ((size_t)data[0] | ((size_t)data[1] << 8)) % (rest + 1) : 0;
    const char *tpl_src = (const char *)data + 2;
    const char *json_src = tpl_src + tlen;
    size_t json_len = rest - tlen;

    qd_chat_template *tpl = NULL;
    qd_err err;
    if (qd_chat_template_compile(tpl_src, tlen, &tpl, &err) != QD_OK) return 0;

    json_t *vars = json_loadb(json_src, json_len, JSON_ALLOW_NUL, NULL);
    if (!json_is_object(vars)) {
        json_decref(vars);
        vars = json_loads(DEFAULT_VARS, 0, NULL);
    }
    qd_chat_template_limits lim = {1u << 20, 64u << 20, 200000, 64};
    char *out = NULL;
    size_t out_len = 0;
    if (qd_chat_template_render_json(tpl, vars, &lim, &out, &out_len, &err) == QD_OK) {
        /* The output must be a NUL-terminated string of the reported length. */
        if (out[out_len] != 0) __builtin_trap();
    } else if (out != NULL) {
        __builtin_trap();
    }
    free(out);
    json_decref(vars);
    qd_chat_template_free(tpl);
    return 0;
}
