/* Greedy speculative decoding with the MTP head (runtime/spec_decode.h) on the MTP
 * fixtures (tests/fixtures_mtp): for K = 1..4 the generated ids are exactly plain greedy
 * decoding's (prefill, then one-token decodes) in a batch-invariant context, whatever the
 * drafts (the fixtures' heads are random, so most are rejected; test_verify covers kept
 * prefixes); the counters add up. */
#include <dirent.h>
#include <string.h>
#include <sys/stat.h>

#include "qd_fixtures.h"
#include "qd_test.h"
#include "qdelta.h"
#include "runtime/spec_decode.h"

#define N_NEW 24

static int argmax(const float *x, int n) {
    int b = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return b;
}

/* The MTP KV that speculation left in sequence 1 (positions [0, M)) is the one a single
 * MTP pass over the same tokens with prefill hidden states gives: one more MTP row at M,
 * on both, within 1e-4 of max|logit| (prefill and decode hidden states differ by rounding). */
static void check_mtp_kv(qd_model *m, qd_context *ctx, const int32_t *prompt, int n, const int32_t *out,
                         const char *dir, int k) {
    const int V = qd_model_vocab_size(m), H = qd_model_hidden_size(m), L = qd_seq_length(ctx, 1);
    const int M = qd_mtp_length(ctx, 1);
    CHECKF(M >= n - 1 && M < L, "%s k=%d: MTP length %d, sequence length %d", dir, k, M, L);
    if (!(M >= n - 1 && M < L)) return;
    int32_t *toks = malloc(sizeof(int32_t) * (size_t)L);
    memcpy(toks, prompt, sizeof(int32_t) * (size_t)n);
    memcpy(toks + n, out, sizeof(int32_t) * (size_t)(L - n));
    float *hid = malloc(sizeof(float) * (size_t)L * H), *a = malloc(sizeof(float) * V), *b = malloc(sizeof(float) * V);
    CHECK(qd_seq_reset(ctx, 0) == QD_OK);
    qd_span all = {.seq = 0, .tokens = toks, .n_tokens = L, .logits = QD_LOGITS_ALL};
    CHECK(qd_forward_hidden(ctx, &all, 1, NULL, hid) == QD_OK);
    qd_span pairs = {.seq = 0, .tokens = toks + 1, .n_tokens = M, .logits = QD_LOGITS_NONE};
    CHECK(qd_mtp_forward(ctx, &pairs, 1, hid, NULL, NULL) == QD_OK);
    const int32_t tok = M + 1 < L ? toks[M + 1] : out[L - n];
    qd_span one0 = {.seq = 0, .tokens = &tok, .n_tokens = 1, .logits = QD_LOGITS_LAST};
    qd_span one1 = {.seq = 1, .tokens = &tok, .n_tokens = 1, .logits = QD_LOGITS_LAST};
    CHECK(qd_mtp_forward(ctx, &one0, 1, hid + (size_t)M * H, a, NULL) == QD_OK);
    CHECK(qd_mtp_forward(ctx, &one1, 1, hid + (size_t)M * H, b, NULL) == QD_OK);
    double mx = 1e-30, e = 0;
    for (int i = 0; i < V; i++) mx = fmax(mx, fabs(a[i])), e = fmax(e, fabs((double)a[i] - b[i]));
    CHECKF(e <= 1e-4 * mx, "%s k=%d: MTP KV after speculation differs: %g of max %g", dir, k, e, mx);
    free(toks);
    free(hid);
    free(a);
    free(b);
}

static void check(const char *dir) {
    char path[1024], err[1024];
    snprintf(path, sizeof path, "%s/prompt.ids", dir);
    char *t = qd_test_read_file(path, NULL);
    int32_t prompt[256];
    const int n = t ? qd_fixture_parse_ids(t, prompt, 256) : 0;
    free(t);
    qd_model_params mp = qd_model_default_params();
    mp.path = dir;
    mp.n_threads = 2;
    qd_model *m = NULL;
    CHECKF(n > 1 && qd_model_load(&mp, &m, err, sizeof err) == QD_OK, "%s: %s", dir, err);
    if (!m) return;
    const int V = qd_model_vocab_size(m);
    qd_context_params cp = qd_context_default_params();
    cp.max_seqs = 2;
    cp.max_ctx = n + N_NEW + 8;
    cp.max_batch = cp.max_ctx;
    cp.mtp = 1;
    cp.speculative_tokens = 4;
    cp.batch_invariant = 1;
    qd_context *ctx = NULL;
    CHECKF(qd_context_create(m, &cp, &ctx) == QD_OK, "%s: %s", dir, qd_model_errmsg(m));
    if (!ctx) {
        qd_model_free(m);
        return;
    }
    /* plain greedy on sequence 0 */
    int32_t plain[N_NEW], spec[N_NEW];
    float *row = malloc(sizeof(float) * V);
    qd_span pre = {.seq = 0, .tokens = prompt, .n_tokens = n, .logits = QD_LOGITS_LAST};
    CHECK(qd_forward(ctx, &pre, 1, row) == QD_OK);
    plain[0] = argmax(row, V);
    for (int i = 1; i < N_NEW; i++) {
        qd_span d = {.seq = 0, .tokens = &plain[i - 1], .n_tokens = 1, .logits = QD_LOGITS_LAST};
        CHECK(qd_forward(ctx, &d, 1, row) == QD_OK);
        plain[i] = argmax(row, V);
    }
    /* drafts: the MTP's own; perfect ones (plain greedy's future); perfect but wrong at
     * every third output position */
    int32_t wrong[N_NEW];
    for (int i = 0; i < N_NEW; i++) wrong[i] = i % 3 == 2 ? (plain[i] + 1) % V : plain[i];
    const int32_t *forced[3] = {NULL, plain, wrong};
    const char *label[3] = {"MTP drafts", "perfect drafts", "every 3rd draft wrong"};
    for (int f = 0; f < 3; f++) {
        for (int k = 1; k <= 4; k++) {
            qd_spec_stats s;
            CHECK(qd_seq_reset(ctx, 1) == QD_OK);
            const qd_spec_greedy_args a = {.model = m, .ctx = ctx, .seq = 1, .prompt = prompt, .n_prompt = n,
                                           .n_new = N_NEW, .k = k, .forced_drafts = forced[f]};
            const qd_status st = qd_spec_generate_greedy(&a, spec, &s);
            CHECKF(st == QD_OK, "%s k=%d: %s", dir, k, qd_context_errmsg(ctx));
            CHECKF(memcmp(spec, plain, sizeof plain) == 0, "%s k=%d %s: speculative greedy differs from plain greedy",
                   dir, k, label[f]);
            long at = 0;
            for (int i = 0; i < k; i++) at += s.accepted_at[i];
            CHECK(s.drafted == s.steps * k && s.accepted == at && s.accepted <= s.drafted);
            /* every step emits its kept drafts and a bonus: N_NEW - 1 tokens after the first */
            CHECK(s.steps + s.accepted >= N_NEW - 1 && s.steps + s.accepted <= N_NEW - 1 + k);
            if (f == 1) CHECKF(s.steps <= (N_NEW - 1 + k) / (k + 1) + 1, "perfect drafts: %ld steps", s.steps);
            if (f == 2 && k >= 2) CHECK(s.accepted > 0 && s.accepted < s.drafted);
            if (f == 0) check_mtp_kv(m, ctx, prompt, n, spec, dir, k);
            printf("  %-24s k=%d %-22s: %2ld steps, %2ld of %2ld drafts kept, output == plain greedy\n",
                   dir + strlen("tests/fixtures_mtp/"), k, label[f], s.steps, s.accepted, s.drafted);
        }
    }
    free(row);
    qd_context_free(ctx);
    qd_model_free(m);
}

int main(void) {
    const char *names[3] = {"qwen3_5_dense_mtp", "qwen3_5_moe_fused_mtp", "qwen3_next_moe_mtp"};
    for (int i = 0; i < 3; i++) {
        char dir[256];
        snprintf(dir, sizeof dir, "tests/fixtures_mtp/%s", names[i]);
        check(dir);
    }
    return qd_test_finish("test_spec_decode");
}
