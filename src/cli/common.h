/* Helpers shared by CLI commands: option parsing, model loading with a progress bar,
 * id lists. */
#ifndef QD_CLI_COMMON_H
#define QD_CLI_COMMON_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "qdelta.h"

/* Options every model-running command accepts. */
typedef struct cli_model_opts {
    const char *model_dir;      /* -m / --model */
    qd_load_format load_format; /* --load-format auto|dummy */
    qd_backend_kind backend;    /* --backend cpu|cuda */
    int threads;                /* -t / --threads */
    bool quiet;                 /* no progress bar */
    int tensor_parallel_size;   /* --tensor-parallel-size N (0/1: not split) */
    bool expert_parallel;       /* --expert-parallel */
} cli_model_opts;

/* One help line for the options above beyond -m (every model-running command prints it). */
#define CLI_MODEL_OPTS_HELP                                                                          \
    "  --load-format auto|dummy, --backend cpu|cuda, -t N threads, -q quiet\n"                      \
    "  --tensor-parallel-size N  split the model over N ranks (CUDA: N GPUs, or GPU 0 when only one\n" \
    "                            is visible; CPU: in process, for checks); --expert-parallel: MoE\n"   \
    "                            experts partitioned over the ranks instead of split\n"

/* If argv[*i] is a model option, consumes it (and its value) and returns 1;
 * returns -1 with a message on a bad value, 0 when not a model option. */
int cli_parse_model_opt(cli_model_opts *o, int argc, char **argv, int *i);
/* The value of option argv[*i]; advances *i. NULL (with a message) when missing. */
const char *cli_value(int argc, char **argv, int *i);
/* Parses a non-negative int option value; -1 on error (with a message naming the option). */
int cli_int(const char *opt, const char *v, long min, long max, long *out);
int cli_double(const char *opt, const char *v, double *out);

/* Loads the model (prints the error and returns NULL on failure). */
qd_model *cli_load_model(const cli_model_opts *o);

/* Parses whitespace-separated token ids. Returns 0 or -1 (message printed). *ids malloc'd. */
int cli_parse_ids(const char *text, const char *what, int32_t **ids, int *n);
/* Reads a whole file into a NUL-terminated malloc'd buffer. NULL on error (message printed). */
char *cli_read_file(const char *path, size_t *len);

double cli_now(void);

/* Fills o->model_dir with the embedded default model when -m was not given.
 * Returns false (message printed) when there is none. */
bool cli_default_model(cli_model_opts *o);

struct qd_tokenizer;
/* Loads DIR/tokenizer.json (and tokenizer_config.json). 0 or -1 (message printed). */
int cli_load_tokenizer(const char *dir, struct qd_tokenizer **out);
/* Encodes text (special tokens in it are matched). 0 or -1 (message printed). */
int cli_tokenize(const struct qd_tokenizer *tok, const char *text, size_t len, int32_t **ids, int *n);

#endif
