/* qdelta bench -m DIR [--load-format dummy]: prefill tok/s at 512 and 4096 tokens,
 * decode tok/s, and decode weight-read bandwidth against a memcpy measured in the
 * same run. */
#include <stdlib.h>
#include <string.h>

#include "base/membw.h"
#include "cli/commands.h"
#include "cli/common.h"

static void usage(FILE *f) {
    fprintf(f, "usage: qdelta bench -m DIR [--load-format auto|dummy|dummy-f32] [-t N] [--prefill 512,4096] [--decode N]\n"
               "  Measures prefill tok/s for each prompt length, decode tok/s (batch 1) after a\n"
               "  512-token prompt, and the decode weight-read GB/s against memcpy bandwidth.\n");
}

static int parse_list(const char *s, int *out, int max) {
    int n = 0;
    while (*s && n < max) {
        char *end;
        long v = strtol(s, &end, 10);
        if (end == s || v < 1 || v > 1 << 20) return -1;
        out[n++] = (int)v;
        s = *end == ',' ? end + 1 : end;
        if (*end && *end != ',') return -1;
    }
    return n;
}

int qd_cmd_bench(int argc, char **argv) {
    cli_model_opts mo = {0};
    int prefill[8] = {512, 4096}, n_prefill = 2;
    long n_decode = 32;
    for (int i = 1; i < argc; i++) {
        int r = cli_parse_model_opt(&mo, argc, argv, &i);
        if (r < 0) return 2;
        if (r > 0) continue;
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) { usage(stdout); return 0; }
        else if (!strcmp(argv[i], "--prefill")) {
            const char *v = cli_value(argc, argv, &i);
            if (!v || (n_prefill = parse_list(v, prefill, 8)) <= 0) { fprintf(stderr, "qdelta bench: bad --prefill list\n"); return 2; }
        } else if (!strcmp(argv[i], "--decode")) {
            const char *v = cli_value(argc, argv, &i);
            if (!v || cli_int("--decode", v, 1, 100000, &n_decode)) return 2;
        } else { fprintf(stderr, "qdelta bench: unknown option '%s'\n", argv[i]); usage(stderr); return 2; }
    }
    if (!mo.model_dir) { usage(stderr); return 2; }
    double t0 = cli_now();
    qd_model *m = cli_load_model(&mo);
    if (!m) return 1;
    double t_load = cli_now() - t0;
    int max_prefill = 512;
    for (int i = 0; i < n_prefill; i++) if (prefill[i] > max_prefill) max_prefill = prefill[i];
    qd_context_params cp = qd_context_default_params();
    cp.max_ctx = max_prefill + (int)n_decode + 1;
    cp.max_batch = max_prefill;
    qd_context *ctx;
    if (qd_context_create(m, &cp, &ctx) != QD_OK) { fprintf(stderr, "qdelta bench: %s\n", qd_model_errmsg(m)); qd_model_free(m); return 1; }
    const int V = qd_model_vocab_size(m);
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)max_prefill);
    float *logits = malloc(sizeof(float) * (size_t)V);
    int rc = 1;
    if (!ids || !logits) goto done;
    uint64_t s = 12345;
    for (int i = 0; i < max_prefill; i++) { s = s * 6364136223846793005ull + 1442695040888963407ull; ids[i] = (int32_t)((s >> 33) % (uint64_t)V); }

    printf("model: %s\n", qd_model_describe(m));
    printf("weights: %.2f GB stored, %.3f GB read per decoded token; loaded in %.2f s\n",
           qd_model_weight_bytes(m) / 1e9, qd_model_active_weight_bytes(m) / 1e9, t_load);
    for (int i = 0; i < n_prefill; i++) {
        qd_seq_reset(ctx, 0);
        qd_span span = {0, ids, prefill[i], QD_LOGITS_LAST};
        double a = cli_now();
        if (qd_forward(ctx, &span, 1, logits) != QD_OK) { fprintf(stderr, "qdelta bench: %s\n", qd_context_errmsg(ctx)); goto done; }
        double dt = cli_now() - a;
        printf("prefill %5d tokens: %8.3f s  %9.1f tok/s\n", prefill[i], dt, prefill[i] / dt);
        fflush(stdout);
    }
    /* decode after a 512-token prompt */
    qd_seq_reset(ctx, 0);
    qd_span span = {0, ids, 512 < max_prefill ? 512 : max_prefill, QD_LOGITS_LAST};
    if (qd_forward(ctx, &span, 1, logits) != QD_OK) { fprintf(stderr, "qdelta bench: %s\n", qd_context_errmsg(ctx)); goto done; }
    int32_t tok = ids[0];
    double a = cli_now();
    for (long t = 0; t < n_decode; t++) {
        qd_span d = {0, &tok, 1, QD_LOGITS_LAST};
        if (qd_forward(ctx, &d, 1, logits) != QD_OK) { fprintf(stderr, "qdelta bench: %s\n", qd_context_errmsg(ctx)); goto done; }
        int best = 0;
        for (int v = 1; v < V; v++) if (logits[v] > logits[best]) best = v;
        tok = best;
    }
    double dt = cli_now() - a;
    double tps = n_decode / dt;
    double gbps = qd_model_active_weight_bytes(m) * tps / 1e9;
    double bw = qd_measure_memcpy_gbps((size_t)1 << 30, mo.threads);
    printf("decode  %5ld tokens: %8.3f s  %9.2f tok/s  weights %.1f GB/s = %.0f%% of memcpy %.1f GB/s\n", n_decode, dt,
           tps, gbps, 100.0 * gbps / bw, bw);
    rc = 0;
done:
    free(ids);
    free(logits);
    qd_context_free(ctx);
    qd_model_free(m);
    return rc;
}
