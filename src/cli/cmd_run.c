/* qdelta run: prefill a prompt (text, chat message or token ids), then generate. */
#include <stdlib.h>
#include <string.h>

#include "cli/chat_prompt.h"
#include "cli/commands.h"
#include "cli/common.h"
#include "cli/generate.h"

static void usage(FILE *f) {
    fprintf(f, "usage: qdelta run [-m DIR] (-p TEXT | --prompt-file F | --prompt-ids \"1 2 3\") [options]\n"
               "  Streams a continuation of the prompt, then prints prompt tok/s, generation tok/s\n"
               "  and time to first token. Without -m it uses the embedded default model.\n"
               "  -p, --prompt TEXT         prompt text (tokenized with the model's tokenizer.json)\n"
               "  --prompt-file FILE        prompt text from a file\n"
               "  --prompt-ids \"1 2 3\"      prompt as token ids (no tokenizer needed); prints ids\n"
               "  --chat                    wrap the prompt as a user message in the chat template\n"
               "  --system TEXT             system message (with --chat)\n"
               "  --no-think                enable_thinking=false in the template (with --chat)\n"
               "  --ids-out FILE            write the generated ids, space-separated\n"
               "  --ctx-size N              context length (default: prompt + max tokens)\n"
               CLI_MODEL_OPTS_HELP);
    cli_print_gen_opts_help(f);
}

static int write_ids(const char *path, const int32_t *ids, int n) {
    FILE *f = fopen(path, "w");
    if (!f) { fprintf(stderr, "qdelta run: cannot write %s\n", path); return -1; }
    for (int i = 0; i < n; i++) fprintf(f, "%s%d", i ? " " : "", ids[i]);
    fprintf(f, "\n");
    if (fclose(f) != 0) { fprintf(stderr, "qdelta run: cannot write %s\n", path); return -1; }
    return 0;
}

int qd_cmd_run(int argc, char **argv) {
    cli_model_opts mo = {0};
    cli_gen_opts go = cli_gen_default_opts();
    go.max_tokens = 16;
    const char *prompt = NULL, *prompt_file = NULL, *prompt_ids = NULL, *ids_out = NULL, *system_msg = NULL;
    bool chat = false, no_think = false;
    long ctx_size = 0;
    for (int i = 1; i < argc; i++) {
        int r = cli_parse_model_opt(&mo, argc, argv, &i);
        if (r == 0) r = cli_parse_gen_opt(&go, argc, argv, &i);
        if (r < 0) return 2;
        if (r > 0) continue;
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) { usage(stdout); return 0; }
        else if (!strcmp(a, "-p") || !strcmp(a, "--prompt")) { if (!(prompt = cli_value(argc, argv, &i))) return 2; }
        else if (!strcmp(a, "--prompt-file")) { if (!(prompt_file = cli_value(argc, argv, &i))) return 2; }
        else if (!strcmp(a, "--prompt-ids")) { if (!(prompt_ids = cli_value(argc, argv, &i))) return 2; }
        else if (!strcmp(a, "--ids-out")) { if (!(ids_out = cli_value(argc, argv, &i))) return 2; }
        else if (!strcmp(a, "--system")) { if (!(system_msg = cli_value(argc, argv, &i))) return 2; }
        else if (!strcmp(a, "--chat")) chat = true;
        else if (!strcmp(a, "--no-think")) no_think = true;
        else if (!strcmp(a, "--ctx-size")) {
            const char *v = cli_value(argc, argv, &i);
            if (!v || cli_int(a, v, 1, 1 << 24, &ctx_size)) return 2;
        } else { fprintf(stderr, "qdelta run: unknown option '%s'\n", a); usage(stderr); return 2; }
    }
    if ((prompt != NULL) + (prompt_file != NULL) + (prompt_ids != NULL) != 1) {
        fprintf(stderr, "qdelta run: give exactly one of -p, --prompt-file, --prompt-ids\n");
        usage(stderr);
        return 2;
    }
    if (prompt_ids && chat) { fprintf(stderr, "qdelta run: --chat needs a text prompt\n"); return 2; }
    if (!cli_default_model(&mo)) return 2;

    int32_t *ids = NULL;
    int n_prompt = 0, rc = 1;
    char *file_text = NULL;
    qd_model *m = NULL;
    qd_tokenizer *tok = NULL;
    cli_session s;
    memset(&s, 0, sizeof s);
    cli_gen_result res;
    memset(&res, 0, sizeof res);
    if (prompt_ids && cli_parse_ids(prompt_ids, "--prompt-ids", &ids, &n_prompt)) return 2;
    if (prompt_file && !(prompt = file_text = cli_read_file(prompt_file, NULL))) return 1;

    if (!(m = cli_load_model(&mo))) goto done;
    if (!prompt_ids) {
        if (cli_load_tokenizer(mo.model_dir, &tok)) goto done;
        if (chat) {
            if (cli_chat_prompt_ids(mo.model_dir, tok, system_msg, prompt, !no_think, &ids, &n_prompt)) goto done;
        } else if (cli_tokenize(tok, prompt, strlen(prompt), &ids, &n_prompt)) {
            goto done;
        }
        cli_apply_generation_defaults(&go, m);
    }
    if (!go.temperature_set && prompt_ids) go.sampling.temperature = 0.0f; /* ids: greedy unless told */
    if (n_prompt == 0) { fprintf(stderr, "qdelta run: empty prompt\n"); goto done; }
    int max_ctx = ctx_size ? (int)ctx_size : n_prompt + go.max_tokens + 1;
    if (cli_session_open_spec(&s, m, tok, max_ctx, n_prompt < 512 ? n_prompt : 512, &go))
        goto done;

    FILE *stream = prompt_ids ? NULL : stdout;
    if (stream && !chat) { fputs(prompt, stdout); fflush(stdout); }
    if (cli_generate(&s, ids, n_prompt, &go, stream, NULL, &res)) goto done;
    if (prompt_ids)
        for (int i = 0; i < res.n_ids; i++) printf("%s%d", i ? " " : "", res.ids[i]);
    printf("\n");
    fflush(stdout);
    if (!mo.quiet)
        fprintf(stderr, "prompt %d tokens %.1f tok/s | generated %d tokens %.1f tok/s | time to first token %.3f s | finish: %s\n",
                n_prompt, res.n_prompt_fed / (res.t_prefill > 0 ? res.t_prefill : 1e-9), res.n_ids,
                res.n_ids > 1 ? (res.n_ids - 1) / (res.t_decode > 0 ? res.t_decode : 1e-9) : 0.0, res.t_first, res.finish);
    if (!mo.quiet) cli_print_spec_line(stderr, &res);
    if (ids_out && write_ids(ids_out, res.ids, res.n_ids)) goto done;
    rc = 0;
done:
    cli_gen_result_free(&res);
    cli_session_close(&s);
    free(ids);
    free(file_text);
    qd_tokenizer_free(tok);
    qd_model_free(m);
    return rc;
}
