/* qdelta logits -m DIR --ids FILE -o OUT.f32
 * Writes the logits of every prompt position, from one prefill, as raw little-endian
 * float32 rows of vocab_size. */
#include <stdlib.h>
#include <string.h>

#include "cli/commands.h"
#include "cli/common.h"

static void usage(FILE *f) {
    fprintf(f, "usage: qdelta logits [-m DIR] --ids FILE -o OUT.f32 [options]\n"
               "  Runs one prefill over the token ids in FILE (whitespace-separated) and writes the\n"
               "  logits of every position to OUT.f32: n_ids x vocab_size little-endian float32.\n"
               CLI_MODEL_OPTS_HELP);
}

int qd_cmd_logits(int argc, char **argv) {
    cli_model_opts mo = {0};
    const char *ids_path = NULL, *out_path = NULL;
    for (int i = 1; i < argc; i++) {
        int r = cli_parse_model_opt(&mo, argc, argv, &i);
        if (r < 0) return 2;
        if (r > 0) continue;
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) { usage(stdout); return 0; }
        else if (!strcmp(argv[i], "--ids")) { if (!(ids_path = cli_value(argc, argv, &i))) return 2; }
        else if (!strcmp(argv[i], "-o") || !strcmp(argv[i], "--out")) { if (!(out_path = cli_value(argc, argv, &i))) return 2; }
        else { fprintf(stderr, "qdelta logits: unknown option '%s'\n", argv[i]); usage(stderr); return 2; }
    }
    if (!ids_path || !out_path) { usage(stderr); return 2; }
    if (!cli_default_model(&mo)) return 2;
    char *text = cli_read_file(ids_path, NULL);
    if (!text) return 1;
    int32_t *ids;
    int n;
    int rc = cli_parse_ids(text, ids_path, &ids, &n);
    free(text);
    if (rc) return 1;
    if (n == 0) { fprintf(stderr, "qdelta logits: %s holds no token ids\n", ids_path); free(ids); return 1; }

    qd_model *m = cli_load_model(&mo);
    if (!m) { free(ids); return 1; }
    int V = qd_model_vocab_size(m);
    qd_context_params cp = qd_context_default_params();
    cp.max_ctx = n;
    cp.max_batch = n;
    qd_context *ctx = NULL;
    float *logits = malloc(sizeof(float) * (size_t)n * V);
    FILE *f = NULL;
    rc = 1;
    if (!logits) { fprintf(stderr, "qdelta logits: out of memory for %d x %d logits\n", n, V); goto done; }
    if (qd_context_create(m, &cp, &ctx) != QD_OK) { fprintf(stderr, "qdelta logits: %s\n", qd_model_errmsg(m)); goto done; }
    qd_span span = {.seq = 0, .tokens = ids, .n_tokens = n, .logits = QD_LOGITS_ALL};
    if (qd_forward(ctx, &span, 1, logits) != QD_OK) { fprintf(stderr, "qdelta logits: %s\n", qd_context_errmsg(ctx)); goto done; }
    f = fopen(out_path, "wb");
    if (!f || fwrite(logits, sizeof(float), (size_t)n * V, f) != (size_t)n * V) {
        fprintf(stderr, "qdelta logits: cannot write %s\n", out_path);
        goto done;
    }
    rc = 0;
done:
    if (f && fclose(f) != 0 && rc == 0) { fprintf(stderr, "qdelta logits: cannot write %s\n", out_path); rc = 1; }
    free(logits);
    free(ids);
    qd_context_free(ctx);
    qd_model_free(m);
    return rc;
}
