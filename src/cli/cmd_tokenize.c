/* qdelta tokenize | detokenize | render-chat: the text front end without a model. */
#include <stdlib.h>
#include <string.h>

#include "cli/chat_prompt.h"
#include "cli/commands.h"
#include "cli/common.h"

int qd_cmd_tokenize(int argc, char **argv) {
    const char *dir = NULL, *rev = NULL;
    int first_file = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            printf("usage: qdelta tokenize [-m DIR|ORG/NAME [--revision REV]] FILE...\n"
                   "  Encodes each file's whole content (no special tokens added; special tokens in\n"
                   "  the text are matched) and prints one line per file: the ids separated by spaces.\n");
            return 0;
        }
        if (!strcmp(argv[i], "-m") || !strcmp(argv[i], "--model")) {
            if (!(dir = cli_value(argc, argv, &i))) return 2;
        } else if (!strcmp(argv[i], "--revision")) {
            if (!(rev = cli_value(argc, argv, &i))) return 2;
        } else if (argv[i][0] == '-' && argv[i][1]) {
            fprintf(stderr, "qdelta tokenize: unknown option '%s'\n", argv[i]);
            return 2;
        } else if (!first_file) {
            first_file = i;
        }
    }
    cli_model_opts mo = {.model_dir = dir, .revision = rev};
    if (!cli_default_model(&mo)) return 2;
    if (!first_file) { fprintf(stderr, "qdelta tokenize: no input files\n"); return 2; }
    qd_tokenizer *tok;
    if (cli_load_tokenizer(mo.model_dir, &tok)) return 1;
    int rc = 0;
    for (int i = first_file; i < argc; i++) {
        if (!strcmp(argv[i], "-m") || !strcmp(argv[i], "--model") || !strcmp(argv[i], "--revision")) { i++; continue; }
        size_t len;
        char *text = cli_read_file(argv[i], &len);
        int32_t *ids = NULL;
        int n = 0;
        if (!text || cli_tokenize(tok, text, len, &ids, &n)) { rc = 1; free(text); break; }
        for (int k = 0; k < n; k++) printf("%s%d", k ? " " : "", ids[k]);
        printf("\n");
        free(ids);
        free(text);
    }
    qd_tokenizer_free(tok);
    return rc;
}

int qd_cmd_detokenize(int argc, char **argv) {
    const char *dir = NULL, *rev = NULL, *file = NULL;
    int skip_special = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            printf("usage: qdelta detokenize [-m DIR|ORG/NAME [--revision REV]] [--skip-special] [FILE]\n"
                   "  Reads token ids (whitespace-separated) from FILE or standard input and prints\n"
                   "  the decoded text exactly (no added newline).\n");
            return 0;
        }
        if (!strcmp(argv[i], "-m") || !strcmp(argv[i], "--model")) {
            if (!(dir = cli_value(argc, argv, &i))) return 2;
        } else if (!strcmp(argv[i], "--revision")) {
            if (!(rev = cli_value(argc, argv, &i))) return 2;
        } else if (!strcmp(argv[i], "--skip-special")) {
            skip_special = 1;
        } else if (argv[i][0] == '-' && argv[i][1]) {
            fprintf(stderr, "qdelta detokenize: unknown option '%s'\n", argv[i]);
            return 2;
        } else {
            file = argv[i];
        }
    }
    cli_model_opts mo = {.model_dir = dir, .revision = rev};
    if (!cli_default_model(&mo)) return 2;
    char *text = cli_read_file(file ? file : "/dev/stdin", NULL);
    if (!text) return 1;
    int32_t *ids;
    int n;
    if (cli_parse_ids(text, file ? file : "standard input", &ids, &n)) { free(text); return 1; }
    free(text);
    qd_tokenizer *tok;
    if (cli_load_tokenizer(mo.model_dir, &tok)) { free(ids); return 1; }
    qd_err err;
    qd_err_clear(&err);
    char *out = NULL;
    size_t len = 0;
    int rc = 0;
    if (qd_tokenizer_decode(tok, ids, (size_t)n, skip_special, &out, &len, &err) != QD_OK) {
        fprintf(stderr, "qdelta detokenize: %s\n", err.msg);
        rc = 1;
    } else {
        fwrite(out, 1, len, stdout);
    }
    free(out);
    free(ids);
    qd_tokenizer_free(tok);
    return rc;
}

int qd_cmd_render_chat(int argc, char **argv) {
    const char *dir = NULL, *rev = NULL, *req = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            printf("usage: qdelta render-chat [-m DIR|ORG/NAME [--revision REV]] --request REQ.json\n"
                   "  REQ.json holds `messages` and optionally `tools`, `add_generation_prompt`,\n"
                   "  `enable_thinking`; prints the prompt the model's chat template renders, exactly.\n");
            return 0;
        }
        if (!strcmp(argv[i], "-m") || !strcmp(argv[i], "--model")) {
            if (!(dir = cli_value(argc, argv, &i))) return 2;
        } else if (!strcmp(argv[i], "--revision")) {
            if (!(rev = cli_value(argc, argv, &i))) return 2;
        } else if (!strcmp(argv[i], "--request")) {
            if (!(req = cli_value(argc, argv, &i))) return 2;
        } else {
            fprintf(stderr, "qdelta render-chat: unknown option '%s'\n", argv[i]);
            return 2;
        }
    }
    cli_model_opts mo = {.model_dir = dir, .revision = rev};
    if (!cli_default_model(&mo)) return 2;
    if (!req) { fprintf(stderr, "qdelta render-chat: --request REQ.json is required\n"); return 2; }
    char *json = cli_read_file(req, NULL);
    if (!json) return 1;
    qd_chat_template *tpl;
    int rc = 1;
    if (!cli_load_chat_template(mo.model_dir, &tpl)) {
        char *out = NULL;
        size_t len = 0;
        if (!cli_render_chat(tpl, json, &out, &len)) {
            fwrite(out, 1, len, stdout);
            rc = 0;
        }
        free(out);
        qd_chat_template_free(tpl);
    }
    free(json);
    return rc;
}
