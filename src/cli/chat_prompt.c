#include "cli/chat_prompt.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>

#include "cli/common.h"

int cli_load_chat_template(const char *dir, qd_chat_template **out) {
    qd_err err;
    qd_err_clear(&err);
    if (qd_chat_template_load_dir(dir, out, &err) != QD_OK) {
        fprintf(stderr, "qdelta: chat template of %s: %s\n", dir, err.msg);
        return -1;
    }
    return 0;
}

int cli_render_chat(const qd_chat_template *tpl, const char *request_json, char **text, size_t *len) {
    qd_err err;
    qd_err_clear(&err);
    if (qd_chat_template_render(tpl, request_json, text, len, &err) != QD_OK) {
        fprintf(stderr, "qdelta: chat template: %s\n", err.msg);
        return -1;
    }
    return 0;
}

int cli_chat_prompt_ids(const char *dir, const qd_tokenizer *tok, const char *system_msg, const char *user_msg,
                        bool enable_thinking, int32_t **ids, int *n) {
    qd_chat_template *tpl;
    if (cli_load_chat_template(dir, &tpl)) return -1;
    json_t *req = json_object(), *msgs = json_array();
    if (system_msg) json_array_append_new(msgs, json_pack("{s:s, s:s}", "role", "system", "content", system_msg));
    json_array_append_new(msgs, json_pack("{s:s, s:s}", "role", "user", "content", user_msg));
    json_object_set_new(req, "messages", msgs);
    json_object_set_new(req, "add_generation_prompt", json_true());
    json_object_set_new(req, "enable_thinking", json_boolean(enable_thinking));
    char *req_text = json_dumps(req, JSON_COMPACT);
    json_decref(req);
    char *text = NULL;
    size_t len = 0;
    int rc = -1;
    if (req_text && !cli_render_chat(tpl, req_text, &text, &len)) rc = cli_tokenize(tok, text, len, ids, n);
    free(req_text);
    free(text);
    qd_chat_template_free(tpl);
    return rc;
}
