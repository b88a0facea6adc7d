/* generation_config.json: end-of-sequence ids and the checkpoint's default sampling
 * parameters. The file is optional; absent fields keep their defaults. */
#ifndef QD_IO_GENERATION_CONFIG_H
#define QD_IO_GENERATION_CONFIG_H

#include <stdbool.h>

#include "base/err.h"
#include "io/config.h"

typedef struct qd_generation_config {
    int eos_token_ids[QD_MAX_EOS];
    int n_eos;                 /* 0 when the file gives none */
    bool has_sampling;         /* do_sample / temperature / top_p / top_k present */
    bool do_sample;
    float temperature;         /* 1.0 if absent */
    float top_p;               /* 1.0 if absent */
    int top_k;                 /* 0 (off) if absent */
    float repetition_penalty;  /* 1.0 if absent */
} qd_generation_config;

/* Reads DIR/generation_config.json if it exists (a missing file is not an error). */
qd_status qd_generation_config_load(const char *dir, qd_generation_config *out, qd_err *err);

#endif
