/* Helpers shared by CLI commands: option parsing, model loading with a progress bar,
 * id lists. */
#ifndef QD_CLI_COMMON_H
#define QD_CLI_COMMON_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "base/clock.h"
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
    qd_quantization quantization; /* --quantization none|fp8|nvfp4|int4 */
    const char *revision;       /* --revision: branch, tag or commit of a model name (HF cache) */
    const char *model_name;     /* set by cli_default_model: the org/name given to -m when it was
                                 * found in the Hugging Face cache, else NULL */
    char resolved[4096];        /* storage for model_dir once resolved */
} cli_model_opts;

/* One help line for the options above beyond -m (every model-running command prints it). */
#define CLI_MODEL_OPTS_HELP                                                                          \
    "  -m DIR|ORG/NAME  a checkpoint directory, or a model name found in the local Hugging Face\n"   \
    "                   cache (HF_HUB_CACHE, else HF_HOME/hub, else ~/.cache/huggingface/hub;\n"     \
    "                   nothing is downloaded); --revision REV picks its branch, tag or commit\n"    \
    "                   (default main). Without -m: the embedded default model\n"                    \
    "  --load-format auto|dummy, --backend cpu|cuda, -t N threads, -q quiet\n"                      \
    "  --tensor-parallel-size N  split the model over N ranks (CUDA: N GPUs, or GPU 0 when only one\n" \
    "                            is visible; CPU: in process, for checks); --expert-parallel: MoE\n"   \
    "                            experts partitioned over the ranks instead of split\n"   \
    "  --quantization fp8|nvfp4|int4  quantize at load: a BF16 checkpoint to FP8 block-128 (fp8\n" \
    "                            only), dummy weights to any of them; quantized checkpoints\n"  \
    "                            (FP8, NVFP4, GPTQ, AWQ) load as stored without it\n"

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


/* Resolves -m: without it, the embedded default model (installed beside the executable,
 * in the build's source tree, or where it was compiled); a path that exists is used as
 * it is; an ORG/NAME that is not a path is looked up in the local Hugging Face cache at
 * o->revision (default main). Returns false (message printed) when there is no model. */
bool cli_default_model(cli_model_opts *o);

/* The Hugging Face hub cache directory, resolved as huggingface_hub does: HF_HUB_CACHE,
 * else HF_HOME/hub, else XDG_CACHE_HOME/huggingface/hub, else ~/.cache/huggingface/hub. */
void cli_hf_hub_cache(char *out, size_t n);

struct qd_tokenizer;
/* Loads DIR/tokenizer.json (and tokenizer_config.json). 0 or -1 (message printed). */
int cli_load_tokenizer(const char *dir, struct qd_tokenizer **out);
/* Encodes text (special tokens in it are matched). 0 or -1 (message printed). */
int cli_tokenize(const struct qd_tokenizer *tok, const char *text, size_t len, int32_t **ids, int *n);

#endif
