/* Speculative decoding on the CUDA backend (skipped without a GPU):
 *  - K-token verify with rollback: a verify span inside one ragged forward beside a prefill
 *    chunk and a plain decode, then qd_seq_accept keeping a prefix, against feeding the kept
 *    tokens one at a time, on the gpu_* fixtures and the default model: in batch-invariant
 *    mode bit for bit (the logit rows, the next decode, the whole GDN / conv state); otherwise
 *    within the bf16 tolerance of test_cuda_model (2e-2 x max|logit|);
 *  - the MTP head of the default model: its draft logits over held-out text, CUDA against
 *    the CPU backend (same weights), top-1 agreement on the decidable rows; its drafts over a
 *    bound (only those rows of the LM head computed) against the whole rows' argmax;
 *  - the CUDA graphs of verify steps and MTP one-token steps, replayed, against eager runs;
 *  - greedy speculative generation (qd_spec_generate_greedy, K = 1..3) on the default model:
 *    in batch-invariant mode exactly the plain greedy ids, with the acceptance printed beside
 *    the CPU's (tests/test_default_mtp); outside it the equality is printed, not asserted
 *    (a verify step's rows and a one-row decode go through different GEMV kernels);
 *  - split at TP = 2 (ranks sharing GPU 0): verify + rollback on the gpu_* fixtures, and on
 *    the default model the head's draft logits against the unsplit model's and greedy
 *    speculation keeping drafts. */
#include <math.h>
#include <string.h>

#include "qd_fixtures.h"
#include "qd_test.h"
#include "qd_verify_check.h"
#include "qdelta.h"
#include "runtime/spec_decode.h"
#ifdef QD_HAVE_CUDA
#include "backend/cuda/cuda_device.h"
#endif

#ifdef QD_HAVE_CUDA

#define MODEL "models/qdelta-tiny"
#define N_PROMPT QD_VERIFY_PROMPT
#define N_DEC QD_VERIFY_DEC

/* tp > 1: split for tensor parallelism, the ranks sharing GPU 0 (the one-device all-reduce) */
static qd_model *load_tp(const char *dir, qd_backend_kind be, int tp) {
    qd_model_params mp = qd_model_default_params();
    mp.path = dir;
    mp.backend = be;
    mp.n_threads = 2;
    mp.tensor_parallel_size = tp;
    if (tp > 1) mp.tp_devices = 1;
    qd_model *m = NULL;
    char err[1024];
    CHECKF(qd_model_load(&mp, &m, err, sizeof err) == QD_OK, "%s (%s, TP=%d): %s", dir,
           be == QD_BACKEND_CUDA ? "CUDA" : "CPU", tp, err);
    return m;
}
static qd_model *load(const char *dir, qd_backend_kind be) { return load_tp(dir, be, 1); }

/* The shared verify + rollback check (outside invariant mode within the bf16 tolerance of
 * test_cuda_model, 2e-2 x max|logit|), then a span longer than the context keeps. */
static void check_verify(const char *dir, qd_model *m, const int32_t *prompt, const int32_t *dec, int invariant) {
    double e5, mx;
    qd_context *ctx = qd_verify_rollback(dir, m, prompt, dec, invariant, (qd_verify_tol){2e-2, 0}, &e5, &mx);
    if (!ctx) return;
    printf("  %-44s invariant %d: verify + rollback vs plain decode, next logits off by %.3g of max %.3g\n", dir,
           invariant, e5, mx);
    float *got = malloc(sizeof(float) * 8 * (size_t)qd_model_vocab_size(m));
    int32_t six[6] = {1, 2, 3, 4, 5, 6};
    const uint8_t one = 1;
    qd_span too_long = {.seq = 2, .tokens = six, .n_tokens = 6, .logits = QD_LOGITS_LAST};
    CHECK(qd_verify_forward(ctx, &too_long, 1, &one, got) == QD_ERR_INVALID_ARG);
    qd_context_free(ctx);
    free(got);
}

static int read_ids(const char *path, int32_t *out, int max) {
    char *t = qd_test_read_file(path, NULL);
    const int n = t ? qd_fixture_parse_ids(t, out, max) : -1;
    free(t);
    return n;
}

/* tp 1: in and outside batch-invariant mode; tp 2 (the ranks sharing GPU 0): outside it
 * (the split backend refuses the mode) */
static void verify_fixture(const char *dir, int tp) {
    char path[1024], what[600];
    int32_t prompt[N_PROMPT], dec[16];
    snprintf(path, sizeof path, "%s/prompt_64.ids", dir);
    const int np = read_ids(path, prompt, N_PROMPT);
    snprintf(path, sizeof path, "%s/greedy_64.ids", dir);
    const int nd = read_ids(path, dec, 16);
    CHECKF(np == N_PROMPT && nd >= N_DEC, "%s: prompt %d ids, greedy %d", dir, np, nd);
    qd_model *m = np == N_PROMPT && nd >= N_DEC ? load_tp(dir, QD_BACKEND_CUDA, tp) : NULL;
    snprintf(what, sizeof what, "%s%s", dir, tp > 1 ? " TP=2" : "");
    if (m && tp == 1) check_verify(what, m, prompt, dec, 1);
    if (m) check_verify(what, m, prompt, dec, 0);
    qd_model_free(m);
}

/* The MTP head's draft logits over n held-out ids on a backend: the main forward's hidden
 * states of every row, then one MTP pass over rows 0..n-2 (token p+1 with hidden p).
 * draft_ids (may be NULL) gets the same pass's drafts over ids [0, limit), run again after
 * the head's KV is rolled back (qd_mtp_forward_ids, which on CUDA computes only those
 * rows of the LM head). */
static float *mtp_logits_ids(qd_model *m, const int32_t *ids, int n, int limit, int32_t *draft_ids) {
    const int V = qd_model_vocab_size(m), H = qd_model_hidden_size(m);
    qd_context_params cp = qd_context_default_params();
    cp.max_seqs = 1;
    cp.max_ctx = n + 8;
    cp.max_batch = n;
    cp.mtp = 1;
    cp.speculative_tokens = 2;
    qd_context *ctx = NULL;
    CHECKF(qd_context_create(m, &cp, &ctx) == QD_OK, "MTP context: %s", qd_model_errmsg(m));
    if (!ctx) return NULL;
    float *hidden = malloc(sizeof(float) * (size_t)n * H), *lg = malloc(sizeof(float) * (size_t)n * V);
    qd_span sp = {.seq = 0, .tokens = ids, .n_tokens = n, .logits = QD_LOGITS_ALL};
    int ok = hidden && lg && qd_forward_hidden(ctx, &sp, 1, lg, hidden) == QD_OK;
    CHECKF(ok, "forward with hidden states: %s", qd_context_errmsg(ctx));
    qd_span ms = {.seq = 0, .tokens = ids + 1, .n_tokens = n - 1, .logits = QD_LOGITS_ALL};
    ok = ok && qd_mtp_forward(ctx, &ms, 1, hidden, lg, NULL) == QD_OK;
    CHECKF(ok, "MTP forward: %s", qd_context_errmsg(ctx));
    if (ok && draft_ids) { /* the same pass again over the head's KV rolled back, drafts only */
        ok = qd_mtp_truncate(ctx, 0, 0) == QD_OK &&
             qd_mtp_forward_ids(ctx, &ms, 1, hidden, limit, draft_ids, NULL) == QD_OK;
        CHECKF(ok, "MTP drafts below %d: %s", limit, qd_context_errmsg(ctx));
    }
    qd_context_free(ctx);
    free(hidden);
    if (!ok) {
        free(lg);
        return NULL;
    }
    return lg;
}
static float *mtp_logits(qd_model *m, const int32_t *ids, int n) { return mtp_logits_ids(m, ids, n, 0, NULL); }

/* Drafts over ids [0, limit) (qd_mtp_forward_ids, the LM head's first `limit` rows only)
 * against the argmax over [0, limit) of the whole draft logits rows: equal wherever that
 * argmax is decidable (the two products round differently). */
static void check_mtp_draft_vocab(qd_model *m, const int32_t *ids, int n, int limit) {
    const int V = qd_model_vocab_size(m);
    int32_t *d = malloc(sizeof(int32_t) * (size_t)n);
    float *lg = d ? mtp_logits_ids(m, ids, n, limit, d) : NULL;
    if (lg) {
        const int L = n - 1;
        const double mx = qd_verify_max_abs(lg, (size_t)L * V);
        int dec = 0, agree_dec = 0, below = 1;
        for (int r = 0; r < L; r++) {
            const float *row = lg + (size_t)r * V;
            const int a = qd_test_argmax(row, limit);
            below &= d[r] >= 0 && d[r] < limit;
            if (qd_test_top_gap(row, limit) > 1e-2 * mx) {
                dec++;
                agree_dec += d[r] == a;
            }
        }
        printf("  %s MTP drafts among the first %d of %d ids: %d/%d decidable rows agree with the whole rows' argmax\n",
               MODEL, limit, V, agree_dec, dec);
        CHECKF(below, "drafts below %d", limit);
        CHECKF(dec > L / 2 && agree_dec == dec, "drafts below %d: %d of %d decidable rows agree", limit, agree_dec, dec);
    }
    free(lg);
    free(d);
}

/* The MTP head's draft logits of model m against those of ref over n held-out ids: top-1
 * agreement on 98% of the rows whose top-1 / top-2 gap exceeds 4e-2 x max|ref|, every logit
 * within 0.1 x max|ref|. */
static void compare_mtp_logits(qd_model *m, qd_model *ref, const int32_t *ids, int n, const char *what) {
    const int V = qd_model_vocab_size(m);
    float *g = mtp_logits(m, ids, n), *c = mtp_logits(ref, ids, n);
    if (g && c) {
        const int L = n - 1;
        const double mx = qd_verify_max_abs(c, (size_t)L * V);
        int agree = 0, dec = 0, agree_dec = 0;
        for (int r = 0; r < L; r++) {
            const float *cr = c + (size_t)r * V;
            const int same = qd_test_argmax(g + (size_t)r * V, V) == qd_test_argmax(cr, V);
            agree += same;
            if (qd_test_top_gap(cr, V) > 4e-2 * mx) {
                dec++;
                agree_dec += same;
            }
        }
        const double err = qd_test_max_diff(g, c, (size_t)L * V) / mx;
        printf("  %s MTP draft logits, %s: max err %.3g of max|ref|, top-1 %d/%d (decidable %d/%d)\n", MODEL, what,
               err, agree, L, agree_dec, dec);
        CHECKF(agree_dec * 100 >= dec * 98, "%s: MTP draft top-1 on decidable rows %d/%d below 98%%", what,
               agree_dec, dec);
        CHECKF(err < 0.1, "%s: MTP draft logits off by %.3g of max|ref|", what, err);
    }
    free(g);
    free(c);
}

static void check_mtp_logits(void) {
    static int32_t held[20000];
    const int nh = read_ids(MODEL "/reference/heldout.ids", held, 20000), n = 200;
    CHECKF(nh >= 4000 + n, MODEL "/reference/heldout.ids: %d ids", nh);
    if (nh < 4000 + n) return;
    qd_model *gm = load(MODEL, QD_BACKEND_CUDA), *cm = load(MODEL, QD_BACKEND_CPU);
    if (gm) check_mtp_draft_vocab(gm, held + 4000, n, qd_model_vocab_size(gm) / 3 + 7);
    if (gm && cm) compare_mtp_logits(gm, cm, held + 4000, n, "CUDA vs CPU");
    qd_model_free(gm);
    qd_model_free(cm);
}

static void check_spec_greedy_on(qd_model *m, int invariant, const char *what) {
    const int V = qd_model_vocab_size(m), N_NEW = 48;
    qd_context_params cp = qd_context_default_params();
    cp.max_seqs = 2;
    cp.max_ctx = 128;
    cp.max_batch = 128;
    cp.mtp = 1;
    cp.speculative_tokens = 4;
    cp.batch_invariant = invariant;
    qd_context *ctx = NULL;
    CHECKF(qd_context_create(m, &cp, &ctx) == QD_OK, "context: %s", qd_model_errmsg(m));
    float *row = malloc(sizeof(float) * (size_t)V);
    long drafted[4] = {0}, accepted[4] = {0};
    int same_all = 1;
    for (int pi = 0; ctx && pi < 5; pi++) {
        char path[256];
        int32_t ids[64], plain[48], spec[48];
        snprintf(path, sizeof path, MODEL "/reference/prompt_%d.ids", pi);
        const int n = read_ids(path, ids, 64);
        CHECKF(n > 0, "%s", path);
        if (n <= 0) break;
        CHECK(qd_seq_reset(ctx, 0) == QD_OK);
        qd_span pre = {.seq = 0, .tokens = ids, .n_tokens = n, .logits = QD_LOGITS_LAST};
        CHECK(qd_forward(ctx, &pre, 1, row) == QD_OK);
        plain[0] = qd_test_argmax(row, V);
        for (int i = 1; i < N_NEW; i++) {
            qd_span d = {.seq = 0, .tokens = &plain[i - 1], .n_tokens = 1, .logits = QD_LOGITS_LAST};
            CHECK(qd_forward(ctx, &d, 1, row) == QD_OK);
            plain[i] = qd_test_argmax(row, V);
        }
        for (int k = 1; k <= 3; k++) {
            qd_spec_stats s;
            CHECK(qd_seq_reset(ctx, 1) == QD_OK);
            const qd_spec_greedy_args a = {.model = m, .ctx = ctx, .seq = 1, .prompt = ids, .n_prompt = n,
                                           .n_new = N_NEW, .k = k};
            CHECKF(qd_spec_generate_greedy(&a, spec, &s) == QD_OK, "prompt %d k=%d: %s", pi, k,
                   qd_context_errmsg(ctx));
            const int same = !memcmp(spec, plain, sizeof plain);
            same_all &= same;
            if (invariant)
                CHECKF(same, "prompt %d k=%d: speculative greedy differs from plain greedy (batch-invariant)", pi, k);
            drafted[k] += s.drafted;
            accepted[k] += s.accepted;
        }
    }
    printf("  %s greedy speculative on CUDA%s (invariant %d): output %s plain greedy; drafts kept K=1 %ld/%ld, K=2 "
           "%ld/%ld (%.1f%%), K=3 %ld/%ld\n",
           MODEL, what, invariant, same_all ? "==" : "!=", accepted[1], drafted[1], accepted[2], drafted[2],
           100.0 * (double)accepted[2] / (double)(drafted[2] ? drafted[2] : 1), accepted[3], drafted[3]);
    CHECKF(drafted[2] > 0 && accepted[2] * 100 >= drafted[2] * 40, "%s K=2: %ld of %ld drafts kept", what,
           accepted[2], drafted[2]);
    free(row);
    qd_context_free(ctx);
}

static void check_spec_greedy(int invariant) {
    qd_model *m = load(MODEL, QD_BACKEND_CUDA);
    if (m) check_spec_greedy_on(m, invariant, "");
    qd_model_free(m);
}

/* Split at TP = 2 (the ranks sharing GPU 0; the MTP layer sharded like the main layers):
 * verify + rollback against plain decoding on the gpu_* fixtures (where bf16 rounding
 * stays within test_cuda_model's tolerance outside batch-invariant mode, which the split
 * backend refuses; the default model's verify rows differ from one-token decodes by about
 * 3% of max|logit| split or not), then on the default model the head's draft logits
 * against the unsplit model's and greedy speculation keeping drafts. */
static void check_split(const char *const *gpu, int n_gpu) {
    for (int i = 0; i < n_gpu; i++) {
        char dir[512];
        snprintf(dir, sizeof dir, "%s/%s", QD_FIXTURES, gpu[i]);
        verify_fixture(dir, 2);
    }
    static int32_t held[20000];
    const int nh = read_ids(MODEL "/reference/heldout.ids", held, 20000), n = 200;
    CHECKF(nh >= 4000 + n, MODEL "/reference/heldout.ids: %d ids", nh);
    qd_model *um = load(MODEL, QD_BACKEND_CUDA), *sm = load_tp(MODEL, QD_BACKEND_CUDA, 2);
    if (um && sm && nh >= 4000 + n) compare_mtp_logits(sm, um, held + 4000, n, "TP=2 vs unsplit");
    if (sm) check_spec_greedy_on(sm, 0, " TP=2");
    qd_model_free(um);
    qd_model_free(sm);
}

/* One run of verify steps and MTP one-token steps over two sequences of the default
 * model, every output appended to out (4 rounds: a uniform verify step of 3 tokens a
 * sequence, a rollback that keeps a different prefix of each, two MTP steps of one
 * token a sequence, the first handing back its argmax (over half the vocabulary in odd
 * rounds), the second its logits). Returns
 * the floats written, 0 on a failure. */
#define GRAPH_ROUNDS 4
static size_t graph_run(qd_model *m, int eager, const int32_t *ids, int n, float *out) {
    const int V = qd_model_vocab_size(m), H = qd_model_hidden_size(m);
    qd_context_params cp = qd_context_default_params();
    cp.max_seqs = 2;
    cp.max_ctx = 128;
    cp.max_batch = 128;
    cp.mtp = 1;
    cp.speculative_tokens = 2;
    cp.batch_invariant = 1;
    cp.eager = eager;
    qd_context *ctx = NULL;
    CHECKF(qd_context_create(m, &cp, &ctx) == QD_OK, "context (eager %d): %s", eager, qd_model_errmsg(m));
    if (!ctx) return 0;
    size_t w = 0;
    int ok = 1;
    qd_span pre[2] = {{.seq = 0, .tokens = ids, .n_tokens = n, .logits = QD_LOGITS_LAST},
                      {.seq = 1, .tokens = ids + 3, .n_tokens = n - 3, .logits = QD_LOGITS_LAST}};
    ok &= qd_forward(ctx, pre, 2, out) == QD_OK;
    w += 2 * (size_t)V;
    float hid[2 * 1024];
    for (int r = 0; ok && r < GRAPH_ROUNDS; r++) {
        const int32_t *t0 = ids + 5 * r, *t1 = ids + 40 + 3 * r;
        qd_span ver[2] = {{.seq = 0, .tokens = t0, .n_tokens = 3, .logits = QD_LOGITS_ALL},
                          {.seq = 1, .tokens = t1, .n_tokens = 3, .logits = QD_LOGITS_ALL}};
        const uint8_t verify[2] = {1, 1};
        ok &= qd_verify_forward(ctx, ver, 2, verify, out + w) == QD_OK;
        w += 6 * (size_t)V;
        ok &= qd_seq_accept(ctx, 0, 1 + r % 3) == QD_OK && qd_seq_accept(ctx, 1, 3 - r % 3) == QD_OK;
        for (int i = 0; i < 2 * H; i++) hid[i] = sinf(0.37f * (float)(i + 101 * r)) * 3.0f;
        qd_span md[2] = {{.seq = 0, .tokens = t0 + 1, .n_tokens = 1, .logits = QD_LOGITS_LAST},
                         {.seq = 1, .tokens = t1 + 2, .n_tokens = 1, .logits = QD_LOGITS_LAST}};
        int32_t dids[2];
        float hout[2 * 1024];
        /* odd rounds draft below a bound: the MTP graphs are captured again for it */
        ok &= qd_mtp_forward_ids(ctx, md, 2, hid, r % 2 ? V / 2 + 3 : 0, dids, hout) == QD_OK;
        out[w++] = (float)dids[0];
        out[w++] = (float)dids[1];
        memcpy(out + w, hout, sizeof(float) * 2 * (size_t)H);
        w += 2 * (size_t)H;
        ok &= qd_mtp_forward(ctx, md, 2, hout, out + w, NULL) == QD_OK;
        w += 2 * (size_t)V;
    }
    CHECKF(ok, "graph run (eager %d): %s", eager, qd_context_errmsg(ctx));
    qd_context_free(ctx);
    return ok ? w : 0;
}

/* The CUDA graphs of uniform verify steps and of the MTP head's one-token steps, captured
 * once and replayed with each step's new positions, tokens and slots, against the same
 * steps run eagerly: bit for bit in batch-invariant mode. */
static void check_graphs(void) {
    qd_model *m = load(MODEL, QD_BACKEND_CUDA);
    if (!m) return;
    const int V = qd_model_vocab_size(m), H = qd_model_hidden_size(m);
    /* 64 tokens spread over the vocabulary (the reference prompts are a few tokens):
     * a 48-token prompt, then the verify steps' tokens after it */
    int32_t ids[64];
    const int n = 48;
    for (int i = 0; i < 64; i++) ids[i] = (int32_t)((7919u * (unsigned)i + 11u) % (unsigned)V);
    CHECKF(H <= 1024, "hidden size %d", H);
    const size_t cap = 2 * (size_t)V + GRAPH_ROUNDS * (8 * (size_t)V + 2 + 2 * (size_t)H);
    float *a = malloc(sizeof(float) * cap), *b = malloc(sizeof(float) * cap);
    if (H <= 1024 && a && b) {
        const size_t na = graph_run(m, 1, ids, n, a), nb = graph_run(m, 0, ids, n, b);
        CHECKF(na == cap && nb == cap, "graph runs wrote %zu and %zu of %zu floats", na, nb, cap);
        const int same = na == cap && nb == cap && !memcmp(a, b, sizeof(float) * cap);
        CHECKF(same, "verify / MTP steps from graphs differ from eager ones by %g",
               na == nb ? qd_test_max_diff(a, b, na) : -1.0);
        printf("  %s %d rounds of verify (2 x 3 tokens) and MTP steps (2 x 1): graphs %s eager\n", MODEL,
               GRAPH_ROUNDS, same ? "==" : "!=");
    }
    free(a);
    free(b);
    qd_model_free(m);
}

int main(void) {
    if (qd_cuda_device_count() == 0) return qd_test_skip("test_cuda_spec", "no CUDA device");
    printf("verify + rollback on the GPU\n");
    static const char *gpu[] = {"gpu_qwen3_5_dense_bf16", "gpu_qwen3_5_moe_bf16", "gpu_qwen3_next_moe_bf16"};
    for (size_t i = 0; i < sizeof gpu / sizeof gpu[0]; i++) {
        char dir[512];
        snprintf(dir, sizeof dir, "%s/%s", QD_FIXTURES, gpu[i]);
        verify_fixture(dir, 1);
    }
    printf("the MTP head on the GPU\n");
    check_mtp_logits();
    check_graphs();
    check_spec_greedy(1);
    check_spec_greedy(0);
    printf("speculation on a split model\n");
    check_split(gpu, (int)(sizeof gpu / sizeof gpu[0]));
    return qd_test_finish("test_cuda_spec");
}

#else

int main(void) { return qd_test_skip("test_cuda_spec", "built without CUDA"); }

#endif
