/* qdelta chat: interactive multi-turn chat through the model's own chat template.
 * Ctrl-C stops the reply being generated and returns to the prompt; Ctrl-D (end of
 * input) or /exit leaves. Turns that extend the previous prompt reuse the sequence's
 * state, so only the new tokens are computed. */
#include <errno.h>
#include <jansson.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/chat_prompt.h"
#include "cli/commands.h"
#include "cli/common.h"
#include "cli/generate.h"

static volatile sig_atomic_t g_interrupted = 0;

static void on_sigint(int sig) {
    (void)sig;
    g_interrupted = 1;
}

static void usage(FILE *f) {
    fprintf(f, "usage: qdelta chat [-m DIR] [--system TEXT] [--think | --no-think] [options]\n"
               "  Interactive chat with the model's chat template. Without -m it uses the embedded\n"
               "  default model. Ctrl-C interrupts a reply; Ctrl-D or /exit quits; /reset forgets\n"
               "  the conversation; /think on|off switches thinking.\n"
               "  --system TEXT             system message\n"
               "  --think, --no-think       enable_thinking in the template (default: on)\n"
               "  --ctx-size N              tokens of conversation kept (default 4096)\n"
               CLI_MODEL_OPTS_HELP);
    cli_print_gen_opts_help(f);
}

/* Reads one line (without the newline) into a growing buffer. Returns -1 at end of
 * input, 1 when interrupted by Ctrl-C, 0 otherwise. */
static int read_line(char **buf, size_t *cap) {
    size_t n = 0;
    for (;;) {
        if (n + 2 > *cap) {
            size_t nc = *cap ? *cap * 2 : 256;
            char *nb = realloc(*buf, nc);
            if (!nb) return -1;
            *buf = nb;
            *cap = nc;
        }
        int c = fgetc(stdin);
        if (c == EOF) {
            if (ferror(stdin) && errno == EINTR) {
                clearerr(stdin);
                return 1;
            }
            if (n == 0) return -1;
            break;
        }
        if (c == '\n') break;
        (*buf)[n++] = (char)c;
    }
    (*buf)[n] = '\0';
    return 0;
}

int qd_cmd_chat(int argc, char **argv) {
    cli_model_opts mo = {0};
    cli_gen_opts go = cli_gen_default_opts();
    go.max_tokens = 512;
    const char *system_msg = NULL;
    bool think = true;
    long ctx_size = 4096;
    for (int i = 1; i < argc; i++) {
        int r = cli_parse_model_opt(&mo, argc, argv, &i);
        if (r == 0) r = cli_parse_gen_opt(&go, argc, argv, &i);
        if (r < 0) return 2;
        if (r > 0) continue;
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) { usage(stdout); return 0; }
        else if (!strcmp(a, "--system")) { if (!(system_msg = cli_value(argc, argv, &i))) return 2; }
        else if (!strcmp(a, "--think")) think = true;
        else if (!strcmp(a, "--no-think")) think = false;
        else if (!strcmp(a, "--ctx-size")) {
            const char *v = cli_value(argc, argv, &i);
            if (!v || cli_int(a, v, 16, 1 << 24, &ctx_size)) return 2;
        } else { fprintf(stderr, "qdelta chat: unknown option '%s'\n", a); usage(stderr); return 2; }
    }
    if (!cli_default_model(&mo)) return 2;
    qd_model *m = cli_load_model(&mo);
    if (!m) return 1;
    qd_tokenizer *tok = NULL;
    qd_chat_template *tpl = NULL;
    cli_session s;
    memset(&s, 0, sizeof s);
    json_t *msgs = json_array();
    char *line = NULL;
    size_t line_cap = 0;
    int rc = 1;
    if (cli_load_tokenizer(mo.model_dir, &tok) || cli_load_chat_template(mo.model_dir, &tpl)) goto done;
    cli_apply_generation_defaults(&go, m);
    if (cli_session_open_spec(&s, m, tok, (int)ctx_size, 512, &go))
        goto done;
    if (system_msg) json_array_append_new(msgs, json_pack("{s:s, s:s}", "role", "system", "content", system_msg));

    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_sigint; /* no SA_RESTART: a blocked read returns so the prompt can be redrawn */
    sigaction(SIGINT, &sa, NULL);
    const bool tty = isatty(STDIN_FILENO);
    if (tty) fprintf(stderr, "%s\nCtrl-C interrupts a reply, Ctrl-D quits, /reset forgets, /think on|off.\n", qd_model_describe(m));
    for (;;) {
        if (tty) { fputs("\n> ", stdout); fflush(stdout); }
        g_interrupted = 0;
        int r = read_line(&line, &line_cap);
        if (r < 0) break;
        if (r > 0) { fputs("\n(use Ctrl-D or /exit to quit)", stdout); continue; }
        if (!strcmp(line, "/exit") || !strcmp(line, "/quit")) break;
        if (!strcmp(line, "/reset")) { json_array_clear(msgs); if (system_msg) json_array_append_new(msgs, json_pack("{s:s, s:s}", "role", "system", "content", system_msg)); continue; }
        if (!strcmp(line, "/think on")) { think = true; continue; }
        if (!strcmp(line, "/think off")) { think = false; continue; }
        if (!line[0]) continue;
        json_array_append_new(msgs, json_pack("{s:s, s:s}", "role", "user", "content", line));
        json_t *req = json_pack("{s:O, s:b, s:b}", "messages", msgs, "add_generation_prompt", 1, "enable_thinking", think);
        char *req_text = json_dumps(req, JSON_COMPACT);
        json_decref(req);
        char *text = NULL;
        size_t len = 0;
        int32_t *ids = NULL;
        int n = 0;
        int ok = req_text && !cli_render_chat(tpl, req_text, &text, &len) && !cli_tokenize(tok, text, len, &ids, &n);
        free(req_text);
        free(text);
        cli_gen_result res;
        memset(&res, 0, sizeof res);
        if (ok && !cli_generate(&s, ids, n, &go, stdout, &g_interrupted, &res)) {
            json_array_append_new(msgs, json_pack("{s:s, s:s%}", "role", "assistant", "content", res.text ? res.text : "", res.text_len));
            if (!strcmp(res.finish, "interrupted")) fputs(" [interrupted]", stdout);
            fputs("\n", stdout);
            if (!mo.quiet)
                fprintf(stderr, "[%d prompt tokens computed, %d generated, %.1f tok/s, first token %.3f s]\n",
                        res.n_prompt_fed, res.n_ids, res.n_ids > 1 ? (res.n_ids - 1) / (res.t_decode > 0 ? res.t_decode : 1e-9) : 0.0,
                        res.t_first);
            if (!mo.quiet) cli_print_spec_line(stderr, &res);
        } else {
            json_array_remove(msgs, json_array_size(msgs) - 1); /* the turn failed: forget its message */
        }
        cli_gen_result_free(&res);
        free(ids);
        fflush(stdout);
    }
    rc = 0;
done:
    free(line);
    json_decref(msgs);
    cli_session_close(&s);
    qd_chat_template_free(tpl);
    qd_tokenizer_free(tok);
    qd_model_free(m);
    return rc;
}
