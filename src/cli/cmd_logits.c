/* qdelta logits -m DIR --ids FILE [--mtp] -o OUT.f32
 * Writes the logits of every prompt position, from one prefill, as raw little-endian
 * float32 rows of vocab_size; with --mtp the MTP head's instead (n - 1 rows: row p from
 * the final-normed hidden state at p and the token at p + 1, predicting token p + 2). */
#include <stdlib.h>
#include <string.h>

#include "cli/commands.h"
#include "cli/common.h"

static void usage(FILE *f) {
    fprintf(f, "usage: qdelta logits [-m DIR] --ids FILE -o OUT.f32 [options]\n"
               "  Runs one prefill over the token ids in FILE (whitespace-separated) and writes the\n"
               "  logits of every position to OUT.f32: n_ids x vocab_size little-endian float32.\n"
               "  --mtp   the checkpoint's MTP head's logits instead: (n_ids - 1) x vocab_size, row p\n"
               "          from the hidden state at p and token p + 1 (the draft of token p + 2)\n"
               CLI_MODEL_OPTS_HELP);
}

int qd_cmd_logits(int argc, char **argv) {
    cli_model_opts mo = {0};
    const char *ids_path = NULL, *out_path = NULL;
    int mtp = 0;
    for (int i = 1; i < argc; i++) {
        int r = cli_parse_model_opt(&mo, argc, argv, &i);
        if (r < 0) return 2;
        if (r > 0) continue;
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) { usage(stdout); return 0; }
        else if (!strcmp(argv[i], "--mtp")) mtp = 1;
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
    if (mtp && n < 2) {
        fprintf(stderr, "qdelta logits: --mtp needs at least 2 token ids (%s holds %d)\n", ids_path, n);
        free(ids);
        return 1;
    }

    qd_model *m = cli_load_model(&mo);
    if (!m) { free(ids); return 1; }
    int V = qd_model_vocab_size(m);
    qd_context_params cp = qd_context_default_params();
    cp.max_ctx = n;
    cp.max_batch = n;
    cp.mtp = mtp;
    qd_context *ctx = NULL;
    const size_t H = (size_t)qd_model_hidden_size(m);
    float *logits = malloc(sizeof(float) * (size_t)n * V), *hidden = mtp ? malloc(sizeof(float) * (size_t)n * H) : NULL;
    FILE *f = NULL;
    rc = 1;
    if (!logits || (mtp && !hidden)) { fprintf(stderr, "qdelta logits: out of memory for %d x %d logits\n", n, V); goto done; }
    if (qd_context_create(m, &cp, &ctx) != QD_OK) { fprintf(stderr, "qdelta logits: %s\n", qd_model_errmsg(m)); goto done; }
    qd_span span = {.seq = 0, .tokens = ids, .n_tokens = n, .logits = QD_LOGITS_ALL};
    const qd_status fs = mtp ? qd_forward_hidden(ctx, &span, 1, logits, hidden) : qd_forward(ctx, &span, 1, logits);
    if (fs != QD_OK) {
        fprintf(stderr, "qdelta logits: %s\n", qd_context_errmsg(ctx));
        goto done;
    }
    const int rows = mtp ? n - 1 : n;
    if (mtp) { /* pairs (hidden_p, token_{p+1}) for p in [0, n - 1) */
        qd_span ms = {.seq = 0, .tokens = ids + 1, .n_tokens = n - 1, .logits = QD_LOGITS_ALL};
        if (qd_mtp_forward(ctx, &ms, 1, hidden, logits, NULL) != QD_OK) {
            fprintf(stderr, "qdelta logits: %s\n", qd_context_errmsg(ctx));
            goto done;
        }
    }
    f = fopen(out_path, "wb");
    if (!f || fwrite(logits, sizeof(float), (size_t)rows * V, f) != (size_t)rows * V) {
        fprintf(stderr, "qdelta logits: cannot write %s\n", out_path);
        goto done;
    }
    rc = 0;
done:
    if (f && fclose(f) != 0 && rc == 0) { fprintf(stderr, "qdelta logits: cannot write %s\n", out_path); rc = 1; }
    free(logits);
    free(hidden);
    free(ids);
    qd_context_free(ctx);
    qd_model_free(m);
    return rc;
}
