/* qdelta perplexity -m DIR (--file TEXT | --ids FILE) [--ctx N] [--stride S] [--base DIR]
 * Scores a text with the model: each token's negative log-likelihood given the tokens
 * before it, in windows of N tokens that start every S < N tokens, each token scored once,
 * in the first window that holds it past its first N - S tokens (Hugging Face's strided
 * perplexity); or, with S = N, in disjoint whole windows whose first token is context only
 * and where a shorter last window is dropped (llama.cpp's perplexity, and the protocol of
 * the default model's reference, models/qdelta-tiny/README.md). With --base, a second checkpoint of the same
 * vocabulary (the BF16 original of a quantized one) runs on the same windows, and the
 * two are compared token by token: KL(base || model) of the next-token distributions and
 * how often their most likely next tokens agree. All sums in double. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cli/commands.h"
#include "base/threadpool.h"
#include "cli/common.h"
#include "io/tokenizer.h"

static void usage(FILE *f) {
    fprintf(f, "usage: qdelta perplexity [-m DIR] (--file TEXT | --ids FILE) [options]\n"
               "  Scores a text with the model: the mean negative log-likelihood (NLL) of each token given\n"
               "  those before it, and the perplexity exp(mean NLL). Windows of --ctx tokens start every\n"
               "  --stride tokens; each token is scored once, with at least ctx - stride tokens of context\n"
               "  where the text has them (Hugging Face's strided perplexity). With --stride = --ctx the\n"
               "  windows are disjoint: each scores all but its first token, and a shorter last window is\n"
               "  dropped (llama.cpp's perplexity)\n"
               "  --file TEXT   the text, tokenized with the model's tokenizer\n"
               "  --ids FILE    whitespace-separated token ids instead\n"
               "  --ctx N       window length in tokens (default 512)\n"
               "  --stride S    tokens between window starts, 1..ctx (default ctx / 2)\n"
               "  --base DIR    also score with the checkpoint in DIR (same vocabulary; e.g. the BF16\n"
               "                original of a quantized model, loaded as stored) and compare: its\n"
               "                perplexity, the mean and largest KL(base || model) per token, and top-1\n"
               "                agreement\n"
               "  --json        print one JSON object instead of the summary\n"
               "  -t N also sets the threads of the host's pass over each logits row (default: every core)\n"
               CLI_MODEL_OPTS_HELP);
}

/* One model on a window: its context and the logits of the window's rows. */
typedef struct scorer {
    qd_model *m;
    qd_context *ctx;
    float *logits; /* [ctx][vocab] */
} scorer;

static int scorer_open(scorer *s, const cli_model_opts *mo, int n_ctx) {
    if (!(s->m = cli_load_model(mo))) return -1;
    qd_context_params cp = qd_context_default_params();
    cp.max_seqs = 1;
    cp.max_ctx = n_ctx;
    cp.max_batch = n_ctx;
    if (qd_context_create(s->m, &cp, &s->ctx) != QD_OK) {
        fprintf(stderr, "qdelta perplexity: %s: %s\n", mo->model_dir, qd_model_errmsg(s->m));
        return -1;
    }
    const size_t n = (size_t)n_ctx * (size_t)qd_model_vocab_size(s->m);
    if (!(s->logits = malloc(sizeof(float) * n))) {
        fprintf(stderr, "qdelta perplexity: out of memory for %d x %d logits\n", n_ctx, qd_model_vocab_size(s->m));
        return -1;
    }
    return 0;
}

static void scorer_close(scorer *s) {
    free(s->logits);
    qd_context_free(s->ctx);
    qd_model_free(s->m);
}

/* The window's logits (one prefill from an empty sequence). */
static int scorer_run(scorer *s, const int32_t *ids, int n) {
    const qd_span span = {.seq = 0, .tokens = ids, .n_tokens = n, .logits = QD_LOGITS_ALL};
    if (qd_seq_reset(s->ctx, 0) != QD_OK || qd_forward(s->ctx, &span, 1, s->logits) != QD_OK) {
        fprintf(stderr, "qdelta perplexity: %s\n", qd_context_errmsg(s->ctx));
        return -1;
    }
    return 0;
}

/* log-sum-exp of a row and its argmax (lowest id among equals); -1 when it holds a NaN or
 * an infinity, which no distribution has. */
static int row_stats(const float *x, int V, double *lse, int *arg) {
    double mx = -INFINITY;
    int a = 0;
    for (int v = 0; v < V; v++) {
        if (!isfinite(x[v])) return -1;
        if (x[v] > mx) {
            mx = x[v];
            a = v;
        }
    }
    double sum = 0;
    for (int v = 0; v < V; v++) sum += exp((double)x[v] - mx);
    *lse = mx + log(sum);
    *arg = a;
    return 0;
}

/* KL(p || q) of two rows given their log-sum-exps: sum_v p_v (log p_v - log q_v). */
static double row_kl(const float *p, double lse_p, const float *q, double lse_q, int V) {
    double kl = 0;
    for (int v = 0; v < V; v++) {
        const double lp = (double)p[v] - lse_p;
        kl += exp(lp) * (lp - ((double)q[v] - lse_q));
    }
    return kl > 0 ? kl : 0; /* rounding below zero where the rows agree */
}

typedef struct totals {
    long long tokens, agree;
    int windows;
    double nll, base_nll, kl, kl_max;
} totals;

/* One scored position's figures. */
typedef struct row_score {
    double nll, base_nll, kl;
    int agree, bad; /* bad: a logit that is not finite */
} row_score;

/* The rows of one window, scored on the thread pool: a row's host pass is a few
 * exponentials per vocabulary entry, which at a 248k vocabulary outweighs a GPU's
 * forward. Each row's figures land in its own slot and are summed in order, so the
 * totals do not depend on the number of threads. */
typedef struct row_pass {
    const scorer *m, *b;
    const int32_t *ids;
    int begin, from, end, V;
    row_score *out; /* [end - from] */
} row_pass;

static void score_row(const row_pass *j, int p, row_score *r) {
    const size_t row = (size_t)(p - j->begin - 1) * (size_t)j->V;
    double lse, blse = 0;
    int arg, barg = -1;
    if (row_stats(j->m->logits + row, j->V, &lse, &arg) ||
        (j->b && row_stats(j->b->logits + row, j->V, &blse, &barg))) {
        r->bad = 1;
        return;
    }
    r->nll = lse - (double)j->m->logits[row + (size_t)j->ids[p]];
    if (j->b) {
        r->base_nll = blse - (double)j->b->logits[row + (size_t)j->ids[p]];
        r->kl = row_kl(j->b->logits + row, blse, j->m->logits + row, lse, j->V);
        r->agree = arg == barg;
    }
}

static void score_rows(void *user, int64_t begin, int64_t end, int worker) {
    (void)worker;
    const row_pass *j = user;
    for (int64_t i = begin; i < end; i++) score_row(j, j->from + (int)i, &j->out[i]);
}

/* Scores positions [from, end) of the window ids[begin, end): row t - begin - 1 predicts token t. */
static int score_window(scorer *m, scorer *b, const int32_t *ids, int begin, int end, int from, int V,
                        qd_threadpool *pool, totals *t) {
    if (scorer_run(m, ids + begin, end - begin) || (b && scorer_run(b, ids + begin, end - begin))) return -1;
    row_pass j = {.m = m, .b = b, .ids = ids, .begin = begin, .from = from, .end = end, .V = V};
    if (!(j.out = calloc((size_t)(end - from), sizeof *j.out))) {
        fprintf(stderr, "qdelta perplexity: out of memory for %d rows' scores\n", end - from);
        return -1;
    }
    qd_parallel_for(pool, end - from, 1, score_rows, &j);
    int rc = 0;
    for (int p = from; p < end; p++) {
        const row_score *r = &j.out[p - from];
        if (r->bad) {
            fprintf(stderr, "qdelta perplexity: the %s logits before token %d are not finite\n",
                    b ? "model's or base's" : "model's", p);
            rc = -1;
            break;
        }
        t->nll += r->nll;
        if (b) {
            t->base_nll += r->base_nll;
            t->kl += r->kl;
            if (r->kl > t->kl_max) t->kl_max = r->kl;
            t->agree += r->agree;
        }
        t->tokens++;
    }
    free(j.out);
    if (!rc) t->windows++;
    return rc;
}

/* The text's ids: --ids, or --file through the model's tokenizer. */
static int text_ids(const cli_model_opts *mo, const char *file, const char *ids_path, int32_t **ids, int *n) {
    size_t len = 0;
    char *text = cli_read_file(file ? file : ids_path, &len);
    if (!text) return -1;
    int rc;
    if (ids_path) {
        rc = cli_parse_ids(text, ids_path, ids, n);
    } else {
        struct qd_tokenizer *tok = NULL;
        rc = cli_load_tokenizer(mo->model_dir, &tok) || cli_tokenize(tok, text, len, ids, n) ? -1 : 0;
        qd_tokenizer_free(tok);
    }
    free(text);
    return rc;
}

int qd_cmd_perplexity(int argc, char **argv) {
    cli_model_opts mo = {0};
    const char *file = NULL, *ids_path = NULL, *base_dir = NULL;
    long n_ctx = 512, stride = 0;
    int json = 0;
    for (int i = 1; i < argc; i++) {
        int r = cli_parse_model_opt(&mo, argc, argv, &i);
        if (r < 0) return 2;
        if (r > 0) continue;
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) { usage(stdout); return 0; }
        else if (!strcmp(argv[i], "--file")) { if (!(file = cli_value(argc, argv, &i))) return 2; }
        else if (!strcmp(argv[i], "--ids")) { if (!(ids_path = cli_value(argc, argv, &i))) return 2; }
        else if (!strcmp(argv[i], "--base")) { if (!(base_dir = cli_value(argc, argv, &i))) return 2; }
        else if (!strcmp(argv[i], "--json")) json = 1;
        else if (!strcmp(argv[i], "--ctx")) {
            const char *v = cli_value(argc, argv, &i);
            if (!v || cli_int("--ctx", v, 2, 1 << 20, &n_ctx)) return 2;
        } else if (!strcmp(argv[i], "--stride")) {
            const char *v = cli_value(argc, argv, &i);
            if (!v || cli_int("--stride", v, 1, 1 << 20, &stride)) return 2;
        } else { fprintf(stderr, "qdelta perplexity: unknown option '%s'\n", argv[i]); usage(stderr); return 2; }
    }
    if (!file == !ids_path) {
        fprintf(stderr, "qdelta perplexity: give the text with --file or its ids with --ids (one of them)\n");
        usage(stderr);
        return 2;
    }
    if (!stride) stride = n_ctx / 2;
    if (stride > n_ctx) {
        fprintf(stderr, "qdelta perplexity: --stride %ld is longer than --ctx %ld (tokens between windows would be "
                "skipped)\n", stride, n_ctx);
        return 2;
    }
    if (!cli_default_model(&mo)) return 2;
    cli_model_opts bo = mo; /* the base loads as stored: --quantization is the model's */
    bo.model_dir = base_dir;
    bo.model_name = NULL;
    bo.quantization = QD_QUANTIZATION_NONE;
    if (base_dir && !cli_default_model(&bo)) return 2;
    int32_t *ids = NULL;
    int n = 0;
    if (text_ids(&mo, file, ids_path, &ids, &n)) return 1;
    if (n < 2) {
        fprintf(stderr, "qdelta perplexity: %s holds %d token%s: nothing to score\n", file ? file : ids_path, n,
                n == 1 ? "" : "s");
        free(ids);
        return 1;
    }
    scorer m = {0}, b = {0};
    qd_threadpool *pool = NULL;
    totals t = {0};
    int rc = 1;
    if (scorer_open(&m, &mo, (int)n_ctx) || (base_dir && scorer_open(&b, &bo, (int)n_ctx))) goto done;
    const int V = qd_model_vocab_size(m.m);
    if (base_dir && qd_model_vocab_size(b.m) != V) {
        fprintf(stderr, "qdelta perplexity: the base %s has %d token ids, the model %s %d: not one vocabulary\n",
                base_dir, qd_model_vocab_size(b.m), mo.model_dir, V);
        goto done;
    }
    for (int i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= V) {
            fprintf(stderr, "qdelta perplexity: token id %d at position %d is outside the vocabulary [0, %d)\n", ids[i],
                    i, V);
            goto done;
        }
    /* window starts 0, S, 2S, ... while the last scored token is not the text's last; a
     * window's first token is context only (with S < N an earlier window scored it) */
    const int disjoint = stride == n_ctx;
    if (!(pool = qd_threadpool_create(mo.threads))) { /* -t, else every core */
        fprintf(stderr, "qdelta perplexity: cannot start the threads of the rows' pass\n");
        goto done;
    }
    for (int begin = 0, scored = 1; scored < n; begin += (int)stride) {
        const int end = begin + (int)n_ctx < n ? begin + (int)n_ctx : n;
        if (disjoint && end - begin < n_ctx) break;
        if (end <= scored) continue;
        const int from = scored > begin + 1 ? scored : begin + 1;
        if (score_window(&m, base_dir ? &b : NULL, ids, begin, end, from, V, pool, &t)) goto done;
        scored = end;
    }
    if (t.tokens == 0) {
        fprintf(stderr, "qdelta perplexity: %d tokens fill no window of %ld: nothing scored\n", n, n_ctx);
        goto done;
    }
    const double nll = t.nll / (double)t.tokens, base_nll = t.base_nll / (double)t.tokens;
    if (json) {
        printf("{\"tokens\": %lld, \"windows\": %d, \"ctx\": %ld, \"stride\": %ld, \"nll\": %.9g, "
               "\"perplexity\": %.9g",
               t.tokens, t.windows, n_ctx, stride, nll, exp(nll));
        if (base_dir)
            printf(", \"base_nll\": %.9g, \"base_perplexity\": %.9g, \"kl_mean\": %.9g, \"kl_max\": %.9g, "
                   "\"top1_agreement\": %.9g",
                   base_nll, exp(base_nll), t.kl / (double)t.tokens, t.kl_max, (double)t.agree / (double)t.tokens);
        printf("}\n");
    } else {
        printf("%lld tokens scored in %d windows of %ld (stride %ld)\n", t.tokens, t.windows, n_ctx, stride);
        printf("model %s: perplexity %.4f, mean NLL %.6f\n", mo.model_dir, exp(nll), nll);
        if (base_dir) {
            printf("base  %s: perplexity %.4f, mean NLL %.6f\n", base_dir, exp(base_nll), base_nll);
            printf("KL(base || model) per token: mean %.6g, max %.6g; top-1 agreement %.2f%%\n",
                   t.kl / (double)t.tokens, t.kl_max, 100.0 * (double)t.agree / (double)t.tokens);
        }
    }
    rc = 0;
done:
    qd_threadpool_free(pool);
    if (base_dir) scorer_close(&b);
    scorer_close(&m);
    free(ids);
    return rc;
}
