/* libFuzzer: arbitrary bytes as the JSON body of a request to one of the server's
 * JSON routes (byte 0 picks it: OpenAI chat, completions, Anthropic messages,
 * count_tokens, tokenize, detokenize), on the default model with no engine behind the
 * server: everything a request goes through before it would be queued runs (validation
 * of every field, the Anthropic translation, the chat template, tokenization,
 * response_format and tool_choice compiled to grammars). Nothing may crash, hang or leak;
 * a refusal is a 4xx whose JSON body carries a message; a request that passes reaches
 * submission and gets the 503 of a server that is shutting down (count_tokens, tokenize
 * and detokenize: a 200 with their answer).
 * The server's sources belong to the qdelta executable; the fuzz build links them in. */
#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "qdelta.h"
#include "server/server.h"

static srv_server srv;

static void die(const char *what, const char *msg) {
    fprintf(stderr, "fuzz_server_request: %s: %s\n", what, msg);
    exit(1);
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    static const char dir[] = QD_SOURCE_DIR "/models/qdelta-tiny";
    char msg[512];
    qd_err err;
    qd_err_clear(&err);
    qd_model_params mp = qd_model_default_params();
    mp.path = dir;
    mp.n_threads = 1;
    if (qd_model_load(&mp, &srv.model, msg, sizeof msg) != QD_OK) die(dir, msg);
    if (qd_tokenizer_load_dir(dir, &srv.tok, &err) != QD_OK) die("tokenizer", err.msg);
    if (qd_chat_template_load_dir(dir, &srv.tpl, &err) != QD_OK) die("chat template", err.msg);
    if (qd_token_trie_build(srv.tok, &srv.trie, &err) != QD_OK) die("token trie", err.msg);
    srv_bind_model(&srv);
    srv.cfg.model_name = "qdelta-tiny";
    srv.cfg.engine = qd_engine_default_params();
    srv.cfg.engine.max_model_len = 2048;
    pthread_rwlock_init(&srv.engine_lock, NULL);
    srv_metrics_init(&srv.metrics);
    srv.shutting_down = 1; /* no engine: a request that passes every check gets a 503 */
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1 || size > 16384) return 0;
    json_t *req = json_loadb((const char *)data + 1, size - 1, 0, NULL);
    if (!json_is_object(req)) { /* the HTTP layer answers those itself */
        json_decref(req);
        return 0;
    }
    srv_reply r = {0};
    const int route = data[0] % 6;
    switch (route) {
    case 0: srv_route_chat(&srv, req, &r); break;
    case 1: srv_route_completions(&srv, req, &r); break;
    case 2: srv_route_messages(&srv, req, &r); break;
    case 3: srv_route_count_tokens(&srv, req, &r); break;
    case 4: srv_route_tokenize(&srv, req, &r); break;
    default: srv_route_detokenize(&srv, req, &r); break;
    }
    if (r.gen) abort(); /* nothing can be submitted to a server without an engine */
    if (!r.body) abort();
    json_t *body = json_loads(r.body, JSON_ALLOW_NUL, NULL); /* text may hold U+0000 (a detokenized NUL byte) */
    if (!json_is_object(body)) abort();
    if (route == 3 && r.status == 200) {
        if (!json_is_integer(json_object_get(body, "input_tokens"))) abort();
    } else if (route == 4 && r.status == 200) {
        const json_t *t = json_object_get(body, "tokens");
        if (!json_is_array(t) || json_integer_value(json_object_get(body, "count")) != (json_int_t)json_array_size(t))
            abort();
    } else if (route == 5 && r.status == 200) {
        if (!json_is_string(json_object_get(body, "prompt"))) abort();
    } else {
        if (r.status != 503 && (r.status < 400 || r.status >= 500)) abort();
        /* OpenAI's {"error": {"message"}} or Anthropic's {"type": "error", "error": {"message"}} */
        const char *m = json_string_value(json_object_get(json_object_get(body, "error"), "message"));
        if (!m || !m[0]) abort();
    }
    json_decref(body);
    free(r.body);
    json_decref(req);
    return 0;
}
