/* qdelta command-line entry point: dispatches to one function per command. */
#include <stdio.h>
#include <string.h>

#include "cli/commands.h"
#include "qdelta.h"
#include "qd_git_version.h" /* QD_GIT_COMMIT, generated in the build directory */

typedef struct {
    const char *name;
    int (*fn)(int argc, char **argv);
    const char *summary;
} command;

static const command k_commands[] = {
    {"logits", qd_cmd_logits, "write the logits of every prompt position (raw float32)"},
    {"perplexity", qd_cmd_perplexity, "score a text: perplexity, and KL / top-1 agreement against a base model"},
    {"run", qd_cmd_run, "generate a continuation of a prompt"},
    {"chat", qd_cmd_chat, "interactive chat with the model's chat template"},
    {"bench", qd_cmd_bench, "measure prefill and decode speed"},
    {"tokenize", qd_cmd_tokenize, "print the token ids of each file's text"},
    {"detokenize", qd_cmd_detokenize, "print the text of token ids"},
    {"render-chat", qd_cmd_render_chat, "print the prompt a chat request renders to"},
    {"serve", qd_cmd_serve, "OpenAI-compatible HTTP server (continuous batching)"},
};

static void usage(FILE *f) {
    fprintf(f, "qdelta %s: inference for hybrid Gated DeltaNet models (Qwen3-Next, Qwen3.5)\n\n", QDELTA_VERSION);
    fprintf(f, "usage: qdelta COMMAND [options]   (qdelta COMMAND --help for its options)\n\ncommands:\n");
    for (size_t i = 0; i < sizeof k_commands / sizeof k_commands[0]; i++)
        fprintf(f, "  %-12s %s\n", k_commands[i].name, k_commands[i].summary);
}

int main(int argc, char **argv) {
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        usage(stdout);
        return 0;
    }
    if (!strcmp(argv[1], "--version")) {
        printf("qdelta %s (commit %s)\n", QDELTA_VERSION, QD_GIT_COMMIT);
        return 0;
    }
    for (size_t i = 0; i < sizeof k_commands / sizeof k_commands[0]; i++)
        if (!strcmp(argv[1], k_commands[i].name)) return k_commands[i].fn(argc - 1, argv + 1);
    fprintf(stderr, "qdelta: unknown command '%s'\n\n", argv[1]);
    usage(stderr);
    return 2;
}
