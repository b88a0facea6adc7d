/* The speculative part of qdelta bench (bench_spec.c). */
#ifndef QD_CLI_BENCH_SPEC_H
#define QD_CLI_BENCH_SPEC_H

#include "qdelta.h"

typedef struct cli_bench_spec {
    int k;         /* drafts per step, 1..4 */
    int batch;     /* concurrent requests */
    int context;   /* prompt tokens of each */
    int n_decode;  /* tokens each generates */
} cli_bench_spec;

/* Prints engine decode tok/s without and with speculation and the acceptance; 0 or -1
 * (message printed: no MTP head, or the outputs differ). */
int cli_bench_spec_run(qd_model *m, const cli_bench_spec *b);

#endif
