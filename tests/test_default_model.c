/* The embedded default model (models/qdelta-tiny) as a regression guard for the whole
 * stack, against transformers' outputs recorded when it was trained
 * (models/qdelta-tiny/reference, made by tools/train_default_model.py):
 *   - the tokenizer encodes the held-out text to exactly transformers' ids;
 *   - held-out perplexity (64 windows of 256 tokens, fresh state each, natural-log NLL
 *     of tokens 1..255 of each window) equals transformers' within 1e-3 relative;
 *   - greedy continuations (32 tokens, no EOS stop) equal transformers' for 5 prompts. */
#include <string.h>

#include "io/tokenizer.h"
#include "qd_test.h"
#include "qdelta.h"

#define DIR "models/qdelta-tiny"
#define REF DIR "/reference"

static int read_ids(const char *path, int32_t **ids) {
    char *t = qd_test_read_file(path, NULL);
    if (!t) return -1;
    int cap = 1024, n = 0;
    int32_t *v = malloc(sizeof(int32_t) * cap);
    char *p = t, *end;
    for (;;) {
        long x = strtol(p, &end, 10);
        if (end == p) break;
        if (n == cap) v = realloc(v, sizeof(int32_t) * (cap *= 2));
        v[n++] = (int32_t)x;
        p = end;
    }
    free(t);
    *ids = v;
    return n;
}

int main(void) {
    qd_model_params mp = qd_model_default_params();
    mp.path = DIR;
    mp.n_threads = 2;
    qd_model *m;
    char err[1024];
    if (qd_model_load(&mp, &m, err, sizeof err) != QD_OK) {
        CHECKF(0, "load %s: %s", DIR, err);
        return qd_test_finish("test_default_model");
    }
    const int V = qd_model_vocab_size(m);

    /* tokenizer: held-out text -> transformers' ids */
    qd_tokenizer *tok;
    qd_err e;
    qd_err_clear(&e);
    CHECK(qd_tokenizer_load_dir(DIR, &tok, &e) == QD_OK);
    size_t text_len;
    char *text = qd_test_read_file(REF "/heldout.txt", &text_len);
    int32_t *ref_ids, *ids = NULL;
    int n_ref = read_ids(REF "/heldout.ids", &ref_ids);
    size_t n_ids = 0;
    CHECK(text && n_ref > 0);
    CHECK(qd_tokenizer_encode(tok, text, text_len, 0, &ids, &n_ids, &e) == QD_OK);
    int same = n_ids == (size_t)n_ref;
    for (size_t i = 0; same && i < n_ids; i++) same = ids[i] == ref_ids[i];
    CHECKF(same, "held-out text encodes to %zu ids, transformers %d (or ids differ)", n_ids, n_ref);

    /* perplexity, the protocol of the model card */
    const int W = 256, n_win = n_ref / W;
    qd_context_params cp = {.max_seqs = 1, .max_ctx = W, .max_batch = W};
    qd_context *ctx;
    CHECK(qd_context_create(m, &cp, &ctx) == QD_OK);
    float *logits = malloc(sizeof(float) * (size_t)W * V);
    double nll = 0;
    long count = 0;
    for (int w = 0; w < n_win; w++) {
        qd_seq_reset(ctx, 0);
        qd_span s = {0, ref_ids + (size_t)w * W, W, QD_LOGITS_ALL};
        CHECK(qd_forward(ctx, &s, 1, logits) == QD_OK);
        for (int t = 0; t + 1 < W; t++) {
            const float *row = logits + (size_t)t * V;
            double mx = row[0], sum = 0;
            for (int v = 1; v < V; v++) mx = row[v] > mx ? row[v] : mx;
            for (int v = 0; v < V; v++) sum += exp(row[v] - mx);
            nll -= row[ref_ids[(size_t)w * W + t + 1]] - mx - log(sum);
            count++;
        }
    }
    double ppl = exp(nll / count);
    char *ref_txt = qd_test_read_file(REF "/heldout_ppl.txt", NULL);
    double ref_ppl = ref_txt ? strtod(ref_txt, NULL) : 0;
    printf("held-out perplexity over %ld tokens: qdelta %.6f, transformers %.6f, rel %.2e\n", count, ppl, ref_ppl,
           fabs(ppl - ref_ppl) / ref_ppl);
    CHECKF(fabs(ppl - ref_ppl) <= 1e-3 * ref_ppl, "perplexity %.6f vs transformers %.6f", ppl, ref_ppl);
    qd_context_free(ctx);

    /* greedy continuations */
    cp = (qd_context_params){.max_seqs = 1, .max_ctx = 1024, .max_batch = 512};
    CHECK(qd_context_create(m, &cp, &ctx) == QD_OK);
    for (int i = 0; i < 5; i++) {
        char path[256];
        int32_t *prompt, *want;
        snprintf(path, sizeof path, REF "/prompt_%d.ids", i);
        int np = read_ids(path, &prompt);
        snprintf(path, sizeof path, REF "/greedy_%d.ids", i);
        int nw = read_ids(path, &want);
        CHECK(np > 0 && nw > 0);
        qd_seq_reset(ctx, 0);
        qd_span s = {0, prompt, np, QD_LOGITS_LAST};
        CHECK(qd_forward(ctx, &s, 1, logits) == QD_OK);
        int ok = 1;
        for (int t = 0; t < nw; t++) {
            int32_t best = 0;
            for (int v = 1; v < V; v++) if (logits[v] > logits[best]) best = v;
            ok &= best == want[t];
            qd_span d = {0, &best, 1, QD_LOGITS_LAST};
            CHECK(qd_forward(ctx, &d, 1, logits) == QD_OK);
        }
        CHECKF(ok, "prompt %d: greedy continuation differs from transformers", i);
        free(prompt);
        free(want);
    }
    qd_context_free(ctx);
    free(logits);
    free(text);
    free(ids);
    free(ref_ids);
    free(ref_txt);
    qd_tokenizer_free(tok);
    qd_model_free(m);
    return qd_test_finish("test_default_model");
}
