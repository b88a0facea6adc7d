/* qdelta run: prefill a prompt, then decode a continuation. */
#include <stdlib.h>
#include <string.h>

#include "cli/commands.h"
#include "cli/common.h"

static void usage(FILE *f) {
    fprintf(f, "usage: qdelta run -m DIR --prompt-ids \"1 2 3\" [-n N] [--temperature 0] [--ids-out FILE]\n"
               "  -n N              tokens to generate (default 16)\n"
               "  --temperature T   0 = greedy (default)\n"
               "  --ids-out FILE    write the generated ids, space-separated\n"
               "  --ignore-eos      keep generating past end-of-sequence tokens\n"
               "  --load-format auto|dummy, -t N threads, -q quiet\n");
}

int qd_cmd_run(int argc, char **argv) {
    cli_model_opts mo = {0};
    const char *prompt_ids = NULL, *ids_out = NULL;
    long n_gen = 16;
    double temperature = 0.0;
    bool ignore_eos = false;
    for (int i = 1; i < argc; i++) {
        int r = cli_parse_model_opt(&mo, argc, argv, &i);
        if (r < 0) return 2;
        if (r > 0) continue;
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) { usage(stdout); return 0; }
        else if (!strcmp(a, "--prompt-ids")) { if (!(prompt_ids = cli_value(argc, argv, &i))) return 2; }
        else if (!strcmp(a, "--ids-out")) { if (!(ids_out = cli_value(argc, argv, &i))) return 2; }
        else if (!strcmp(a, "--ignore-eos")) ignore_eos = true;
        else if (!strcmp(a, "-n") || !strcmp(a, "--max-tokens")) {
            const char *v = cli_value(argc, argv, &i);
            if (!v || cli_int(a, v, 0, 1 << 24, &n_gen)) return 2;
        } else if (!strcmp(a, "--temperature")) {
            const char *v = cli_value(argc, argv, &i);
            if (!v || cli_double(a, v, &temperature)) return 2;
        } else { fprintf(stderr, "qdelta run: unknown option '%s'\n", a); usage(stderr); return 2; }
    }
    if (!mo.model_dir || !prompt_ids) { usage(stderr); return 2; }
    if (temperature != 0.0) { fprintf(stderr, "qdelta run: only --temperature 0 (greedy) is supported\n"); return 2; }
    int32_t *ids;
    int n_prompt;
    if (cli_parse_ids(prompt_ids, "--prompt-ids", &ids, &n_prompt)) return 2;
    if (n_prompt == 0) { fprintf(stderr, "qdelta run: empty prompt\n"); free(ids); return 2; }

    qd_model *m = cli_load_model(&mo);
    if (!m) { free(ids); return 1; }
    const int V = qd_model_vocab_size(m);
    qd_context_params cp = qd_context_default_params();
    cp.max_ctx = n_prompt + (int)n_gen;
    cp.max_batch = n_prompt < 512 ? n_prompt : 512;
    qd_context *ctx = NULL;
    float *logits = malloc(sizeof(float) * (size_t)V);
    int32_t *out = malloc(sizeof(int32_t) * (size_t)(n_gen + 1));
    int rc = 1, n_out = 0;
    if (!logits || !out) { fprintf(stderr, "qdelta run: out of memory\n"); goto done; }
    if (qd_context_create(m, &cp, &ctx) != QD_OK) { fprintf(stderr, "qdelta run: %s\n", qd_model_errmsg(m)); goto done; }

    double t0 = cli_now(), t_first = 0;
    for (int off = 0; off < n_prompt; off += cp.max_batch) { /* chunked prefill */
        int n = n_prompt - off < cp.max_batch ? n_prompt - off : cp.max_batch;
        qd_span span = {0, ids + off, n, off + n == n_prompt ? QD_LOGITS_LAST : QD_LOGITS_NONE};
        if (qd_forward(ctx, &span, 1, logits) != QD_OK) { fprintf(stderr, "qdelta run: %s\n", qd_context_errmsg(ctx)); goto done; }
    }
    double t_prefill = cli_now() - t0;
    for (long t = 0; t < n_gen; t++) {
        int best = 0;
        for (int v = 1; v < V; v++) if (logits[v] > logits[best]) best = v;
        out[n_out++] = best;
        printf("%s%d", t ? " " : "", best);
        fflush(stdout);
        if (t == 0) t_first = cli_now() - t0;
        if (t + 1 == n_gen) break;
        /* like transformers' generate: the end-of-sequence token is emitted, then we stop */
        const int32_t *eos;
        int n_eos = ignore_eos ? 0 : qd_model_eos_ids(m, &eos);
        bool stop = false;
        for (int e = 0; e < n_eos; e++) stop |= eos[e] == best;
        if (stop) break;
        qd_span span = {0, &out[n_out - 1], 1, QD_LOGITS_LAST};
        if (qd_forward(ctx, &span, 1, logits) != QD_OK) { fprintf(stderr, "\nqdelta run: %s\n", qd_context_errmsg(ctx)); goto done; }
    }
    printf("\n");
    double t_total = cli_now() - t0;
    if (!mo.quiet)
        fprintf(stderr, "prompt %d tokens %.1f tok/s | generated %d tokens %.1f tok/s | time to first token %.3f s\n",
                n_prompt, n_prompt / t_prefill, n_out, n_out > 1 ? (n_out - 1) / (t_total - t_first) : 0.0, t_first);
    if (ids_out) {
        FILE *f = fopen(ids_out, "w");
        if (!f) { fprintf(stderr, "qdelta run: cannot write %s\n", ids_out); goto done; }
        for (int i = 0; i < n_out; i++) fprintf(f, "%s%d", i ? " " : "", out[i]);
        fprintf(f, "\n");
        if (fclose(f) != 0) { fprintf(stderr, "qdelta run: cannot write %s\n", ids_out); goto done; }
    }
    rc = 0;
done:
    free(ids);
    free(logits);
    free(out);
    qd_context_free(ctx);
    qd_model_free(m);
    return rc;
}
