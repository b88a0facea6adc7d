/* qdelta bench -m DIR [--backend cpu|cuda] [--load-format dummy]: prefill tok/s
 * for each prompt length, then decode tok/s for a batch of sequences after a
 * prompt, with the decode roofline: the bytes a step must move (active weights
 * once, plus each sequence's GDN state read and written and its KV cache read)
 * over the copy bandwidth measured in the same run. Machine-readable RESULT lines
 * follow the human-readable ones. */
#include <stdlib.h>
#include <string.h>

#include "cli/bench_spec.h"
#include "cli/commands.h"
#include "cli/common.h"

#define QD_BENCH_PREFILL_ROWS 8192 /* tokens a forward of the decode run's prompts */

static void usage(FILE *f) {
    fprintf(f, "usage: qdelta bench [-m DIR] [--backend cpu|cuda] [--load-format auto|dummy|dummy-f32] [-t N]\n"
               "                    [--tensor-parallel-size N] [--expert-parallel]\n"
               "                    [--prefill 512,4096] [--decode N] [--batch B] [--context T] [--mixed P]\n"
               "                    [--batch-invariant]\n"
               "                    [--speculative-tokens K [--speculative-draft-vocab N] [--speculative-always]]\n"
               "                    [--json-schema FILE [--tokenizer DIR]]\n"
               "  Measures prefill tok/s for each prompt length (one sequence), then decode tok/s for\n"
               "  B sequences (default 1) after a T-token prompt each (default 512), against the decode\n"
               "  roofline: weights + GDN state + KV bytes per step over the measured copy bandwidth.\n"
               "  --mixed P makes every decode step also prefill P prompt tokens (fresh sequences of up to\n"
               "  T tokens each, dropped after the step), the shape of a serving step under load; it\n"
               "  reports the step time and its tokens/s instead of the roofline.\n"
               "  With --tensor-parallel-size N on CUDA it also reports the device time of the last\n"
               "  step's all-reduces (rank 0, waiting for the other ranks included).\n"
               "  --batch-invariant measures the batch-invariant mode (docs/batch-invariance.md).\n"
               "  --json-schema FILE also measures decode through the serving engine for the B requests\n"
               "  without and with the schema's grammar on each (the mask put on every logits row, as served;\n"
               "  the constrained outputs must parse as JSON). The grammar needs the model's tokenizer\n"
               "  (--tokenizer DIR, default the model's directory: e.g. tests/data/qwen35-tokenizer for\n"
               "  the bench/configs shapes).\n"
               "  --speculative-tokens K (1..4) also measures decode through the serving engine for the B\n"
               "  requests without and with speculative decoding (K MTP drafts per step; the model needs\n"
               "  an MTP head), with the acceptance by draft position; the greedy outputs must agree; and\n"
               "  a verify step's forward against its roofline (the weights, the experts its K + 1 tokens a\n"
               "  sequence touch, counted on one untimed step, per-token states, KV).\n"
               "  --speculative-draft-vocab N drafts among ids [0, N) only (engine param of that name).\n"
               "  --speculative-always drafts at every step (what a verify step costs) instead of only\n"
               "  while the measured costs say drafting is faster (what serving gets).\n"
               "  Without -m it measures the embedded default model.\n"
               CLI_MODEL_OPTS_HELP);
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

/* Copy bandwidth of the memory the backend streams weights from (GB/s, read + write). */
static double measure_bandwidth(const cli_model_opts *mo) {
    double g = 0;
    char err[256];
    if (qd_backend_copy_gbps(mo->backend, (size_t)1 << 30, mo->threads, &g, err, sizeof err) != QD_OK)
        fprintf(stderr, "qdelta bench: %s\n", err);
    return g;
}

/* The last step's all-reduce time of a split model on CUDA, as " (N all-reduces: X ms)";
 * returns 0 (buf empty) otherwise. */
static int allreduce_note(qd_context *ctx, bool split, char *buf, size_t n) {
    double ms = 0;
    int count = 0;
    buf[0] = 0;
    if (!split || qd_context_comm_time(ctx, &ms, &count) != QD_OK) return 0;
    snprintf(buf, n, " (%d all-reduces: %.3f ms)", count, ms);
    return 1;
}

/* The same as RESULT fields " allreduce_ms=X allreduce_n=N". */
static const char *allreduce_field(qd_context *ctx, bool split, char *buf, size_t n) {
    double ms = 0;
    int count = 0;
    buf[0] = 0;
    if (split && qd_context_comm_time(ctx, &ms, &count) == QD_OK)
        snprintf(buf, n, " allreduce_ms=%.4f allreduce_n=%d", ms, count);
    return buf;
}

static int fail(qd_context *ctx) {
    fprintf(stderr, "qdelta bench: %s\n", qd_context_errmsg(ctx));
    return 1;
}

int qd_cmd_bench(int argc, char **argv) {
    cli_model_opts mo = {0};
    int prefill[8] = {512, 4096}, n_prefill = 2;
    long n_decode = 32, batch = 1, context = 512, mixed = 0;
    int batch_invariant = 0;
    const char *schema_path = NULL, *tok_dir = NULL;
    long spec_k = 0, draft_vocab = 0;
    int spec_always = 0;
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
        } else if (!strcmp(argv[i], "--batch")) {
            const char *v = cli_value(argc, argv, &i);
            if (!v || cli_int("--batch", v, 1, 4096, &batch)) return 2;
        } else if (!strcmp(argv[i], "--mixed")) {
            const char *v = cli_value(argc, argv, &i);
            if (!v || cli_int("--mixed", v, 0, 1 << 20, &mixed)) return 2;
        } else if (!strcmp(argv[i], "--context")) {
            const char *v = cli_value(argc, argv, &i);
            if (!v || cli_int("--context", v, 1, 1 << 20, &context)) return 2;
        } else if (!strcmp(argv[i], "--speculative-tokens")) {
            const char *v = cli_value(argc, argv, &i);
            if (!v || cli_int("--speculative-tokens", v, 0, 4, &spec_k)) return 2;
        } else if (!strcmp(argv[i], "--speculative-draft-vocab")) {
            const char *v = cli_value(argc, argv, &i);
            if (!v || cli_int("--speculative-draft-vocab", v, 0, 1 << 30, &draft_vocab)) return 2;
        } else if (!strcmp(argv[i], "--speculative-always")) {
            spec_always = 1;
        } else if (!strcmp(argv[i], "--json-schema")) {
            if (!(schema_path = cli_value(argc, argv, &i))) return 2;
        } else if (!strcmp(argv[i], "--tokenizer")) {
            if (!(tok_dir = cli_value(argc, argv, &i))) return 2;
        } else if (!strcmp(argv[i], "--batch-invariant")) {
            batch_invariant = 1;
        } else { fprintf(stderr, "qdelta bench: unknown option '%s'\n", argv[i]); usage(stderr); return 2; }
    }
    if (!cli_default_model(&mo)) return 2;
    double t0 = qd_clock_seconds();
    qd_model *m = cli_load_model(&mo);
    if (!m) return 1;
    double t_load = qd_clock_seconds() - t0;
    /* before the context: its graphs record the timing events (split models on GPUs) */
    const bool split = mo.tensor_parallel_size > 1 && qd_model_set_comm_timing(m, 1) == QD_OK;
    int max_prefill = (int)context;
    for (int i = 0; i < n_prefill; i++) if (prefill[i] > max_prefill) max_prefill = prefill[i];
    qd_context_params cp = qd_context_default_params();
    cp.batch_invariant = batch_invariant;
    /* --mixed: the prefill sequences of a mixed step, `context` tokens each (the last shorter) */
    const int n_mix = (int)((mixed + context - 1) / context);
    cp.max_seqs = (int)batch + n_mix;
    /* past the decode run: its 4 warm-up and 4 counted steps, and a counted verify step of
     * K + 1 tokens a sequence with --speculative-tokens K */
    const int tail = 8 + (spec_k > 0 ? (int)spec_k + 1 : 0);
    cp.max_ctx = max_prefill + (int)n_decode + tail;
    cp.max_batch = max_prefill > batch + mixed ? max_prefill : (int)(batch + mixed);
    if (spec_k > 0 && batch * (spec_k + 1) > cp.max_batch) cp.max_batch = (int)(batch * (spec_k + 1));
    /* the decode run's prompts go in groups of up to QD_BENCH_PREFILL_ROWS tokens a forward
     * (hundreds of sequences one at a time would take longer than the measurement, and under
     * a profiler much longer) */
    const long group_rows = batch * context < QD_BENCH_PREFILL_ROWS ? batch * context : QD_BENCH_PREFILL_ROWS;
    if (group_rows > cp.max_batch) cp.max_batch = (int)group_rows;
    const int group = context <= cp.max_batch ? (int)(cp.max_batch / context) : 1;
    /* the prefill runs use one sequence, the decode run `batch` sequences at `context` */
    const int kv_block = 16;
    cp.kv_block_size = kv_block;
    cp.n_kv_blocks = (cp.max_ctx + kv_block - 1) / kv_block +
                     ((int)batch + n_mix) * (int)((context + n_decode + tail + kv_block - 1) / kv_block);
    qd_context *ctx;
    if (qd_context_create(m, &cp, &ctx) != QD_OK) { fprintf(stderr, "qdelta bench: %s\n", qd_model_errmsg(m)); qd_model_free(m); return 1; }
    const int V = qd_model_vocab_size(m);
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)(max_prefill > group * context ? max_prefill : group * context));
    int32_t *next = malloc(sizeof(int32_t) * (size_t)batch);
    qd_span *spans = malloc(sizeof(qd_span) * (size_t)(batch + n_mix));
    int32_t *mix_ids = malloc(sizeof(int32_t) * (size_t)(mixed > 0 ? mixed : 1));
    int rc = 1;
    if (!ids || !next || !spans || !mix_ids) goto done;
    uint64_t s = 12345;
    for (int i = 0; i < max_prefill; i++) { s = s * 6364136223846793005ull + 1442695040888963407ull; ids[i] = (int32_t)((s >> 33) % (uint64_t)V); }

    const char *backend = qd_backend_name(mo.backend);
    printf("model: %s\n", qd_model_describe(m));
    printf("backend %s; weights: %.2f GB stored, %.3f GB read per decode step at batch 1; loaded in %.2f s\n", backend,
           qd_model_weight_bytes(m) / 1e9, qd_model_active_weight_bytes(m) / 1e9, t_load);
    /* warm-up: first calls pick kernels and (CUDA) capture graphs */
    {
        qd_span w = {0, ids, prefill[0] < 64 ? prefill[0] : 64, QD_LOGITS_LAST};
        int32_t tok;
        if (qd_forward_greedy(ctx, &w, 1, &tok) != QD_OK) { rc = fail(ctx); goto done; }
        qd_seq_reset(ctx, 0);
    }
    for (int i = 0; i < n_prefill; i++) {
        double best = 1e30;
        for (int rep = 0; rep < 2; rep++) { /* the second run reuses the chunk plan: steady state */
            qd_seq_reset(ctx, 0);
            qd_span span = {0, ids, prefill[i], QD_LOGITS_LAST};
            int32_t tok;
            double a = qd_clock_seconds();
            if (qd_forward_greedy(ctx, &span, 1, &tok) != QD_OK) { rc = fail(ctx); goto done; }
            double dt = qd_clock_seconds() - a;
            best = dt < best ? dt : best;
        }
        char ar[96] = "";
        allreduce_note(ctx, split, ar, sizeof ar);
        printf("prefill %5d tokens: %8.4f s  %10.1f tok/s%s\n", prefill[i], best, prefill[i] / best, ar);
        printf("RESULT prefill backend=%s T=%d s=%.5f tok_s=%.1f%s\n", backend, prefill[i], best, prefill[i] / best,
               allreduce_field(ctx, split, ar, sizeof ar));
        fflush(stdout);
    }
    qd_seq_reset(ctx, 0);
    /* decode: `batch` sequences each after a `context`-token prompt of its own: with one
     * prompt for all, every sequence would route its tokens to the same experts, which
     * is not what a batch of different requests does (a MoE step would read 8 experts
     * per layer where different requests read up to k x batch) */
    for (int b0 = 0; b0 < batch; b0 += group) {
        const int nb = batch - b0 < group ? (int)(batch - b0) : group;
        for (int j = 0; j < nb; j++) {
            uint64_t sb = 0x9e3779b97f4a7c15ull * (uint64_t)(b0 + j + 1);
            for (long i = 0; i < context; i++) {
                sb = sb * 6364136223846793005ull + 1442695040888963407ull;
                ids[j * context + i] = (int32_t)((sb >> 33) % (uint64_t)V);
            }
            spans[j] = (qd_span){b0 + j, ids + j * context, (int)context, QD_LOGITS_LAST};
        }
        if (qd_forward_greedy(ctx, spans, nb, next + b0) != QD_OK) { rc = fail(ctx); goto done; }
    }
    for (long i = 0; i < mixed; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        mix_ids[i] = (int32_t)((s >> 33) % (uint64_t)V);
    }
    const int warm = 4;
    double a = 0;
    for (long t = 0; t < n_decode + warm; t++) {
        if (t == warm) a = qd_clock_seconds();
        for (int b = 0; b < batch; b++) spans[b] = (qd_span){b, &next[b], 1, QD_LOGITS_LAST};
        /* --mixed: prompts beside the decodes, without logits (as a serving step's
         * prefill chunks that do not end their prompt) */
        for (int j = 0; j < n_mix; j++) {
            const long off = (long)j * context, len = mixed - off < context ? mixed - off : context;
            spans[batch + j] = (qd_span){(int)batch + j, mix_ids + off, (int)len, QD_LOGITS_NONE};
        }
        if (qd_forward_greedy(ctx, spans, (int)batch + n_mix, next) != QD_OK) { rc = fail(ctx); goto done; }
        for (int j = 0; j < n_mix; j++) qd_seq_reset(ctx, (int)batch + j);
    }
    double dt = qd_clock_seconds() - a;
    double steps = n_decode / dt;
    char ar[96] = "";
    if (split) allreduce_note(ctx, split, ar, sizeof ar); /* of the last timed step */
    if (mixed > 0) {
        printf("mixed steps: %ld decodes at %ld-token contexts + %ld prompt tokens (%d sequences), %ld steps: %8.4f s"
               "  %.3f ms a step  %9.1f tok/s%s\n",
               batch, context, mixed, n_mix, n_decode, dt, 1e3 / steps, steps * (double)(batch + mixed), ar);
        printf("RESULT mixed backend=%s B=%ld ctx=%ld prefill=%ld step_ms=%.4f tok_s=%.1f%s\n", backend, batch, context,
               mixed, 1e3 / steps, steps * (double)(batch + mixed), split ? allreduce_field(ctx, split, ar, sizeof ar) : "");
        rc = 0;
        goto done;
    }
    /* the distinct (layer, expert) pairs the steps' routing touches, counted on a few more
     * steps that are not timed (counting costs speed: no CUDA graphs) */
    double pairs = -1;
    const int moe_layers = qd_model_moe_layers(m), k_tok = moe_layers > 0 ? qd_model_experts_per_token(m) : 0;
    if (moe_layers > 0 && qd_context_count_experts(ctx, 1) == QD_OK) {
        const int counted = 4;
        double sum = 0;
        for (int t = 0; t < counted && sum >= 0; t++) {
            int64_t p = 0;
            for (int b = 0; b < batch; b++) spans[b] = (qd_span){b, &next[b], 1, QD_LOGITS_LAST};
            if (qd_forward_greedy(ctx, spans, (int)batch, next) != QD_OK || qd_context_routed_experts(ctx, &p) != QD_OK)
                sum = -1;
            else
                sum += (double)p;
        }
        qd_context_count_experts(ctx, 0);
        if (sum >= 0) pairs = sum / counted;
    }
    /* bytes per step: weights once, each sequence's state read + written, its KV read at
     * the mean context; a MoE layer's experts as the routing touched them (without the
     * count: one token's k, a lower bound for larger batches) */
    const double mean_ctx = (double)context + warm + n_decode / 2.0;
    const double one_tok = cli_bench_step_bytes(m, (int)batch, 2.0, mean_ctx, -1);
    const double bytes = cli_bench_step_bytes(m, (int)batch, 2.0, mean_ctx, pairs);
    double bw = measure_bandwidth(&mo);
    double roof_steps = bw > 0 ? bw * 1e9 / bytes : 0, roof_one = bw > 0 ? bw * 1e9 / one_tok : 0;
    printf("decode batch %ld, %ld steps after %ld-token prompts: %8.4f s  %9.2f steps/s  %9.1f tok/s\n", batch, n_decode,
           context, dt, steps, steps * batch);
    if (pairs >= 0)
        printf("  routing: %.1f distinct experts per MoE layer per step (of %d; one token takes %d)\n",
               pairs / moe_layers, qd_model_experts(m), k_tok);
    printf("  roofline: %.3f GB per step over copy bandwidth %.0f GB/s = %.1f steps/s; reached %.1f%%%s\n", bytes / 1e9,
           bw, roof_steps, roof_steps > 0 ? 100.0 * steps / roof_steps : 0.0,
           pairs >= 0 ? " (the experts the routing touched)" : moe_layers > 0 ? " (one token's experts: a lower bound)" : "");
    if (split && ar[0]) printf("  all-reduce:%s\n", ar);
    char routed[96] = "";
    if (pairs >= 0)
        snprintf(routed, sizeof routed, " experts_per_layer=%.2f pct_roofline_1tok=%.1f", pairs / moe_layers,
                 roof_one > 0 ? 100.0 * steps / roof_one : 0.0);
    printf("RESULT decode backend=%s B=%ld ctx=%ld tok_s=%.2f step_ms=%.4f GB_per_step=%.4f copy_GBps=%.0f pct_roofline=%.1f%s%s\n",
           backend, batch, context, steps * batch, 1e3 / steps, bytes / 1e9, bw,
           roof_steps > 0 ? 100.0 * steps / roof_steps : 0.0, routed, split ? allreduce_field(ctx, split, ar, sizeof ar) : "");
    fflush(stdout);
    cli_bench_spec bs = {.k = (int)spec_k,
                         .batch = (int)batch,
                         .context = (int)context,
                         .n_decode = (int)n_decode,
                         .draft_vocab = (int)draft_vocab,
                         .always = spec_always,
                         .copy_gbps = bw};
    if (spec_k > 0) bs.verify_gb = cli_bench_verify_bytes(m, ctx, &bs, mean_ctx, spans, next) / 1e9;
    if (schema_path) {
        qd_context_free(ctx); /* the engines plan their own */
        ctx = NULL;
        const cli_bench_spec sb = {.batch = (int)batch, .context = (int)context, .n_decode = (int)n_decode};
        if (cli_bench_schema_run(m, mo.model_dir, tok_dir, schema_path, &sb)) goto done;
    }
    if (spec_k > 0) {
        qd_context_free(ctx); /* the engines plan their own */
        ctx = NULL;
        if (cli_bench_spec_run(m, &bs)) goto done;
    }
    rc = 0;
done:
    free(ids);
    free(next);
    free(spans);
    free(mix_ids);
    qd_context_free(ctx);
    qd_model_free(m);
    return rc;
}
