/* Speculative decoding under CPU tensor parallelism (the split CPU backend): on the default
 * model (models/qdelta-tiny, a trained MTP head) and on the MTP fixtures
 * (tests/fixtures_mtp), each loaded split by qd_model_load at TP=2, TP=4 and EP=2 where
 * the heads allow (each rank reads its slices of the checkpoint, its slice of the MTP
 * head's layer included), against the unsplit model:
 *   - the MTP head: its logits and h' over every (hidden_p, token_{p+1}) pair of a prompt,
 *     the prompt's final-normed hidden states (qd_forward_hidden, and hidden_all of
 *     qd_forward_ex) within TOL x max|ref| (reordered fp32 sums, as in test_tp_api);
 *   - verify + rollback: a verify span of three right and two wrong tokens beside a plain
 *     decode, accepted to three, a second verify kept whole and a decode after it give
 *     plain one-token decoding's rows (of the split and of the unsplit model), and the
 *     rolled-back GDN state is the plainly decoded one's;
 *   - greedy speculation (runtime/spec_decode.h) at K = 1..3 with the MTP's drafts,
 *     perfect drafts and drafts wrong at every third position: exactly the unsplit
 *     model's plain greedy ids.
 * Also a split group cut from a loaded model (split_group.h, the slicing path) runs the
 * head like the unsplit one, plain and with fp8 weights (main layers and head), and a
 * split checkpoint without an MTP head is refused with the reason. The split backend refuses batch-invariant mode, so every context here is
 * an ordinary one (verify spans and one-token decodes agree within rounding). */
#include <string.h>

#include "model/model.h"
#include "model/model_quant.h"
#include "model/split_group.h"
#include "qd_fixtures.h"
#include "qd_test.h"
#include "runtime/spec_decode.h"

#define TOL 5e-5
#define N_NEW 24
#define MAX_PROMPT 96
#define N_DEC 6

static int argmax(const float *x, int n) {
    int b = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return b;
}

/* max|a - b| / max|ref| over n values (NaN counts as a difference). */
static double rel_diff(const float *a, const float *ref, size_t n) {
    double d = 0, mx = 1e-30;
    for (size_t i = 0; i < n; i++) {
        const double e = fabs((double)a[i] - ref[i]);
        if (!(e <= d)) d = e;
        mx = fmax(mx, fabs(ref[i]));
    }
    return d / mx;
}

/* Rows within TOL of the reference, with the same argmax. */
static int rows_close(const float *got, const float *ref, int n_rows, int V, double *rel) {
    *rel = rel_diff(got, ref, (size_t)n_rows * V);
    if (!(*rel <= TOL)) return 0;
    for (int r = 0; r < n_rows; r++)
        if (argmax(got + (size_t)r * V, V) != argmax(ref + (size_t)r * V, V)) return 0;
    return 1;
}

static qd_model *load(const char *dir, int tp, int ep, char *msg, size_t n) {
    qd_model_params mp = qd_model_default_params();
    mp.path = dir;
    mp.n_threads = 2;
    mp.tensor_parallel_size = tp;
    mp.expert_parallel = ep;
    qd_model *m = NULL;
    if (qd_model_load(&mp, &m, msg, n) != QD_OK) return NULL;
    return m;
}

/* The contexts of every check: three sequences, the MTP head's KV, verify spans of up to 4 drafts. */
static qd_context_params spec_params(int n_prompt) {
    qd_context_params cp = qd_context_default_params();
    cp.max_seqs = 3;
    cp.max_ctx = n_prompt + N_NEW + 16;
    cp.max_batch = 2 * cp.max_ctx;
    cp.mtp = 1;
    cp.speculative_tokens = 4;
    return cp;
}

static qd_context *make_ctx(qd_model *m, int n_prompt) {
    qd_context_params cp = spec_params(n_prompt);
    qd_context *ctx = NULL;
    qd_status s = qd_context_create(m, &cp, &ctx);
    CHECKF(s == QD_OK, "context: %s", qd_model_errmsg(m));
    return ctx;
}

/* What one model gives on the prompt: hidden states, the MTP head's logits and h' over
 * its pairs. */
typedef struct mtp_out {
    float *hidden;   /* [n][H] qd_forward_hidden, every row */
    float *all;      /* [n][H] hidden_all of qd_forward_ex */
    float *logits;   /* [n - 1][V] MTP */
    float *hnext;    /* [n - 1][H] MTP h' */
} mtp_out;

static void mtp_out_free(mtp_out *o) {
    free(o->hidden);
    free(o->all);
    free(o->logits);
    free(o->hnext);
}

static int run_mtp(qd_context *ctx, const qd_model *m, const int32_t *prompt, int n, mtp_out *o) {
    const int V = qd_model_vocab_size(m), H = qd_model_hidden_size(m);
    o->hidden = malloc(sizeof(float) * (size_t)n * H);
    o->all = malloc(sizeof(float) * (size_t)n * H);
    o->logits = malloc(sizeof(float) * (size_t)n * V);
    o->hnext = malloc(sizeof(float) * (size_t)n * H);
    if (!o->hidden || !o->all || !o->logits || !o->hnext) return 0;
    int ok = qd_seq_reset(ctx, 0) == QD_OK && qd_seq_reset(ctx, 1) == QD_OK;
    qd_span all = {.seq = 0, .tokens = prompt, .n_tokens = n, .logits = QD_LOGITS_ALL};
    ok &= qd_forward_hidden(ctx, &all, 1, NULL, o->hidden) == QD_OK;
    qd_span none = {.seq = 1, .tokens = prompt, .n_tokens = n, .logits = QD_LOGITS_NONE};
    const uint8_t yes = 1;
    const qd_forward_args fa = {.spans = &none, .n_spans = 1, .hidden_all = &yes, .all_hidden = o->all};
    ok &= qd_forward_ex(ctx, &fa) == QD_OK;
    qd_span pairs = {.seq = 0, .tokens = prompt + 1, .n_tokens = n - 1, .logits = QD_LOGITS_ALL};
    ok &= qd_mtp_forward(ctx, &pairs, 1, o->hidden, o->logits, o->hnext) == QD_OK;
    CHECKF(ok, "MTP script: %s", qd_context_errmsg(ctx));
    return ok;
}

static void compare_mtp(const mtp_out *got, const mtp_out *ref, int n, int V, int H, const char *what) {
    double rh = rel_diff(got->hidden, ref->hidden, (size_t)n * H), ra = rel_diff(got->all, ref->hidden, (size_t)n * H);
    double rn = rel_diff(got->hnext, ref->hnext, (size_t)(n - 1) * H), rl;
    const int close = rows_close(got->logits, ref->logits, n - 1, V, &rl);
    printf("  %-40s MTP logits %.2e, h' %.2e, hidden %.2e, hidden_all %.2e (of max|ref|)\n", what, rl, rn, rh, ra);
    CHECKF(close, "%s: MTP logits differ by %g x max|ref| (or an argmax)", what, rl);
    CHECKF(rn <= TOL && rh <= TOL && ra <= TOL, "%s: h' %g, hidden %g, hidden_all %g x max|ref|", what, rn, rh, ra);
}

/* Plain one-token decoding of seq 0 after the prompt: the rows of dec[0..N_DEC). */
static int plain_rows(qd_context *ctx, const int32_t *prompt, int n, const int32_t *dec, int V, float *rows) {
    float *scratch = malloc(sizeof(float) * V);
    qd_span p = {.seq = 0, .tokens = prompt, .n_tokens = n, .logits = QD_LOGITS_LAST};
    int ok = scratch && qd_seq_reset(ctx, 0) == QD_OK && qd_forward(ctx, &p, 1, scratch) == QD_OK;
    for (int k = 0; ok && k < N_DEC; k++) {
        qd_span d = {.seq = 0, .tokens = &dec[k], .n_tokens = 1, .logits = QD_LOGITS_LAST};
        ok &= qd_forward(ctx, &d, 1, rows + (size_t)k * V) == QD_OK;
    }
    free(scratch);
    return ok;
}

/* test_verify's script on seq 1 (seq 2 decodes beside it), against plain rows `plain` of
 * this model and `ref` of the unsplit one; the state after the rollbacks against seq 0's
 * after plain decoding (plain_rows ran there last). */
static void check_verify(qd_context *ctx, const qd_model *m, const int32_t *prompt, int n, const int32_t *dec,
                         const float *plain, const float *ref, const char *what) {
    const int V = qd_model_vocab_size(m);
    float *got = malloc(sizeof(float) * 8 * V);
    const size_t ssz = qd_seq_state_size(ctx);
    unsigned char *s0 = malloc(ssz), *s1 = malloc(ssz);
    CHECK(got && s0 && s1);
    if (!got || !s0 || !s1) goto done;
    CHECK(qd_seq_reset(ctx, 1) == QD_OK && qd_seq_reset(ctx, 2) == QD_OK);
    qd_span pp[2] = {{.seq = 1, .tokens = prompt, .n_tokens = n, .logits = QD_LOGITS_LAST},
                     {.seq = 2, .tokens = prompt, .n_tokens = n, .logits = QD_LOGITS_LAST}};
    CHECK(qd_forward(ctx, pp, 2, got) == QD_OK);
    int32_t span1[5] = {dec[0], dec[1], dec[2], (dec[3] + 1) % V, (dec[4] + 7) % V};
    qd_span mix[2] = {{.seq = 1, .tokens = span1, .n_tokens = 5, .logits = QD_LOGITS_ALL},
                      {.seq = 2, .tokens = &dec[0], .n_tokens = 1, .logits = QD_LOGITS_LAST}};
    const uint8_t verify[2] = {1, 0}, one = 1;
    const qd_forward_args a1 = {.spans = mix, .n_spans = 2, .verify = verify, .logits = got};
    double r1, r2, r3, rs, rr;
    CHECKF(qd_forward_ex(ctx, &a1) == QD_OK, "%s: verify: %s", what, qd_context_errmsg(ctx));
    const int ok1 = rows_close(got, plain, 3, V, &r1) && rows_close(got + (size_t)5 * V, plain, 1, V, &rs);
    const int okr = rows_close(got, ref, 3, V, &rr);
    CHECK(qd_seq_accept(ctx, 1, 3) == QD_OK && qd_seq_length(ctx, 1) == n + 3);
    qd_span v2 = {.seq = 1, .tokens = &dec[3], .n_tokens = 2, .logits = QD_LOGITS_ALL};
    const qd_forward_args a2 = {.spans = &v2, .n_spans = 1, .verify = &one, .logits = got};
    CHECK(qd_forward_ex(ctx, &a2) == QD_OK && qd_seq_accept(ctx, 1, 2) == QD_OK);
    const int ok2 = rows_close(got, plain + (size_t)3 * V, 2, V, &r2);
    qd_span d5 = {.seq = 1, .tokens = &dec[5], .n_tokens = 1, .logits = QD_LOGITS_LAST};
    CHECK(qd_forward(ctx, &d5, 1, got) == QD_OK);
    const int ok3 = rows_close(got, plain + (size_t)5 * V, 1, V, &r3);
    CHECK(qd_seq_length(ctx, 0) == qd_seq_length(ctx, 1));
    /* the GDN state payload (every rank's slice) after verify + rollback vs plain */
    CHECK(qd_seq_state_save(ctx, 0, s0, ssz) == QD_OK && qd_seq_state_save(ctx, 1, s1, ssz) == QD_OK);
    const size_t hdr = 64, nf = (ssz - hdr) / sizeof(float);
    const double rst = rel_diff((const float *)(s1 + hdr), (const float *)(s0 + hdr), nf);
    printf("  %-40s verify rows %.2e (vs unsplit %.2e), after accept %.2e, decode %.2e, state %.2e\n", what, r1, rr,
           r2, r3, rst);
    CHECKF(ok1 && okr, "%s: verify rows differ from plain decoding (%g; unsplit %g)", what, r1, rr);
    CHECKF(ok2 && ok3, "%s: rows after the rollback differ (%g, %g)", what, r2, r3);
    CHECKF(rst <= 1e-4, "%s: GDN state after verify + rollback differs from plain by %g x max", what, rst);
done:
    free(got);
    free(s0);
    free(s1);
}

/* Greedy speculation on seq 1 equals `plain` (the unsplit model's greedy ids). */
static void check_spec(qd_context *ctx, const qd_model *m, const int32_t *prompt, int n, const int32_t *plain,
                       const char *what) {
    const int V = qd_model_vocab_size(m);
    int32_t wrong[N_NEW], spec[N_NEW];
    for (int i = 0; i < N_NEW; i++) wrong[i] = i % 3 == 2 ? (plain[i] + 1) % V : plain[i];
    const int32_t *forced[3] = {NULL, plain, wrong};
    const char *label[3] = {"MTP drafts", "perfect drafts", "every 3rd wrong"};
    for (int f = 0; f < 3; f++)
        for (int k = 1; k <= 3; k++) {
            qd_spec_stats s;
            CHECK(qd_seq_reset(ctx, 1) == QD_OK);
            const qd_spec_greedy_args a = {.model = m, .ctx = ctx, .seq = 1, .prompt = prompt, .n_prompt = n,
                                           .n_new = N_NEW, .k = k, .forced_drafts = forced[f]};
            const qd_status st = qd_spec_generate_greedy(&a, spec, &s);
            CHECKF(st == QD_OK, "%s k=%d: %s", what, k, qd_context_errmsg(ctx));
            const int same = st == QD_OK && !memcmp(spec, plain, sizeof spec);
            CHECKF(same, "%s k=%d %s: speculative greedy differs from the unsplit model's plain greedy", what, k,
                   label[f]);
            if (f == 1) CHECKF(s.accepted > 0, "%s k=%d: perfect drafts, none kept", what, k);
            if (f == 0)
                printf("  %-40s k=%d MTP drafts: %2ld of %2ld kept, output %s\n", what, k, s.accepted, s.drafted,
                       same ? "== unsplit plain greedy" : "DIFFERS");
        }
}

/* The slicing path: a group cut from the loaded unsplit model runs the head alike. */
static void check_group(qd_model *full, const int32_t *prompt, int n, const mtp_out *ref, const char *name) {
    qd_context_params cp = spec_params(n);
    qd_tp_cpu *g = NULL;
    qd_err err;
    qd_err_clear(&err);
    CHECKF(qd_tp_cpu_create(full, 2, false, &cp, &g, &err) == QD_OK, "%s: group: %s", name, err.msg);
    if (!g) return;
    mtp_out got = {0};
    char what[160];
    snprintf(what, sizeof what, "%s sliced TP=2", name);
    if (run_mtp(g->ctx, g->top, prompt, n, &got))
        compare_mtp(&got, ref, n, qd_model_vocab_size(full), qd_model_hidden_size(full), what);
    mtp_out_free(&got);
    qd_tp_cpu_free(g);
}

/* fp8 (128 x 128 block scales) of every linear weight of the MTP head, as a quantized
 * checkpoint would hold it (online quantization converts the main layers only). */
static qd_status fp8(qd_model *m, qd_weight *w, qd_err *err) {
    if (w->rows == 0) return QD_OK;
    qd_weight q;
    QD_TRY(qd_quant_to_fp8_block(m, w, &q, err));
    *w = q;
    return QD_OK;
}

static qd_status fp8_mlp(qd_model *m, qd_mlp_weights *w, qd_err *err) {
    QD_TRY(fp8(m, &w->gate, err));
    QD_TRY(fp8(m, &w->up, err));
    return fp8(m, &w->down, err);
}

static qd_status fp8_mtp(qd_model *m, qd_err *err) {
    qd_mtp_weights *w = m->w.mtp;
    qd_layer *ly = &w->layer;
    QD_TRY(fp8(m, &w->fc, err));
    QD_TRY(fp8(m, &ly->attn.q, err));
    QD_TRY(fp8(m, &ly->attn.k, err));
    QD_TRY(fp8(m, &ly->attn.v, err));
    QD_TRY(fp8(m, &ly->attn.o, err));
    if (ly->ffn_kind == QD_FFN_DENSE) return fp8_mlp(m, &ly->mlp, err);
    for (int e = 0; e < m->cfg.n_experts; e++) QD_TRY(fp8_mlp(m, &ly->moe.experts[e], err));
    return ly->moe.has_shared ? fp8_mlp(m, &ly->moe.shared, err) : QD_OK;
}

/* A quantized model (an fp8 MTP head, and fp8 main layers when with_main (a split of the
 * dense fixture's fp8 out_proj would cut its 128-column scale blocks, which the sharding
 * refuses)) cut into TP=2 ranks: the ranks' slices of the quantized head (column cuts of
 * o_proj / down_proj keep their scale blocks) run the head as the unsplit quantized model
 * does, and greedy speculation at K=2 gives its plain greedy ids. */
static void check_quantized(const char *dir, int with_main) {
    char path[512], msg[1024];
    int32_t prompt[MAX_PROMPT];
    snprintf(path, sizeof path, "%s/prompt.ids", dir);
    char *txt = qd_test_read_file(path, NULL);
    const int n = txt ? qd_fixture_parse_ids(txt, prompt, MAX_PROMPT) : 0;
    free(txt);
    qd_model *m = load(dir, 1, 0, msg, sizeof msg);
    CHECKF(m && n > 1, "%s: %s", dir, msg);
    if (!m || n <= 1) {
        qd_model_free(m);
        return;
    }
    qd_err err;
    qd_err_clear(&err);
    qd_status s = with_main ? qd_model_quantize(m, QD_QUANTIZATION_FP8, &err) : QD_OK;
    if (s == QD_OK) s = fp8_mtp(m, &err);
    CHECKF(s == QD_OK, "%s: fp8: %s", dir, err.msg);
    CHECK(m->w.mtp && qd_weight_quantized(&m->w.mtp->layer.attn.o));
    const int V = qd_model_vocab_size(m), H = qd_model_hidden_size(m);
    qd_context *rc = s == QD_OK ? make_ctx(m, n) : NULL;
    mtp_out ref = {0}, got = {0};
    float *row = malloc(sizeof(float) * V);
    int32_t plain[N_NEW], spec[N_NEW];
    int ok = rc && row && run_mtp(rc, m, prompt, n, &ref);
    qd_span pre = {.seq = 2, .tokens = prompt, .n_tokens = n, .logits = QD_LOGITS_LAST};
    ok = ok && qd_forward(rc, &pre, 1, row) == QD_OK;
    if (ok) plain[0] = argmax(row, V);
    for (int i = 1; ok && i < N_NEW; i++) {
        qd_span d = {.seq = 2, .tokens = &plain[i - 1], .n_tokens = 1, .logits = QD_LOGITS_LAST};
        ok &= qd_forward(rc, &d, 1, row) == QD_OK;
        plain[i] = argmax(row, V);
    }
    CHECKF(ok, "%s fp8: unsplit references", dir);
    qd_context_free(rc);
    qd_context_params cp = spec_params(n);
    qd_tp_cpu *g = NULL;
    CHECKF(!ok || qd_tp_cpu_create(m, 2, false, &cp, &g, &err) == QD_OK, "%s fp8: group: %s", dir, err.msg);
    if (g) {
        CHECK(g->models[1]->w.mtp && qd_weight_quantized(&g->models[1]->w.mtp->layer.attn.o));
        char what[160];
        snprintf(what, sizeof what, "%s fp8%s sliced TP=2", strrchr(dir, '/') + 1, with_main ? "" : " head");
        if (run_mtp(g->ctx, g->top, prompt, n, &got)) compare_mtp(&got, &ref, n, V, H, what);
        qd_spec_stats st;
        CHECK(qd_seq_reset(g->ctx, 1) == QD_OK);
        const qd_spec_greedy_args a = {.model = g->top, .ctx = g->ctx, .seq = 1, .prompt = prompt, .n_prompt = n,
                                       .n_new = N_NEW, .k = 2};
        CHECKF(qd_spec_generate_greedy(&a, spec, &st) == QD_OK, "%s: %s", what, qd_context_errmsg(g->ctx));
        CHECKF(!memcmp(spec, plain, sizeof spec), "%s k=2: speculative greedy differs from unsplit plain greedy", what);
        qd_tp_cpu_free(g);
    }
    mtp_out_free(&ref);
    mtp_out_free(&got);
    free(row);
    qd_model_free(m);
}

static void check_model(const char *dir, const char *prompt_file, int max_prompt) {
    char path[512], msg[1024];
    int32_t prompt[MAX_PROMPT];
    snprintf(path, sizeof path, "%s/%s", dir, prompt_file);
    char *txt = qd_test_read_file(path, NULL);
    int n = txt ? qd_fixture_parse_ids(txt, prompt, max_prompt) : 0;
    free(txt);
    CHECKF(n > N_DEC, "%s: prompt of %d ids", path, n);
    qd_model *ref_m = load(dir, 1, 0, msg, sizeof msg);
    CHECKF(ref_m != NULL, "%s: %s", dir, msg);
    if (!ref_m || n <= N_DEC) {
        qd_model_free(ref_m);
        return;
    }
    const char *name = strrchr(dir, '/') ? strrchr(dir, '/') + 1 : dir;
    const int V = qd_model_vocab_size(ref_m), H = qd_model_hidden_size(ref_m);
    /* the unsplit references: the head's outputs, plain rows, plain greedy */
    qd_context *rc = make_ctx(ref_m, n);
    mtp_out ref = {0};
    float *ref_rows = malloc(sizeof(float) * N_DEC * V), *row = malloc(sizeof(float) * V);
    int32_t plain[N_NEW];
    int ok = rc && ref_rows && row && run_mtp(rc, ref_m, prompt, n, &ref);
    qd_span pre = {.seq = 2, .tokens = prompt, .n_tokens = n, .logits = QD_LOGITS_LAST};
    ok = ok && qd_forward(rc, &pre, 1, row) == QD_OK;
    if (ok) plain[0] = argmax(row, V);
    for (int i = 1; ok && i < N_NEW; i++) {
        qd_span d = {.seq = 2, .tokens = &plain[i - 1], .n_tokens = 1, .logits = QD_LOGITS_LAST};
        ok &= qd_forward(rc, &d, 1, row) == QD_OK;
        plain[i] = argmax(row, V);
    }
    /* the decode tokens of the verify script: plain greedy's, so the drafts are right */
    ok = ok && plain_rows(rc, prompt, n, plain, V, ref_rows);
    CHECKF(ok, "%s: unsplit references: %s", dir, rc ? qd_context_errmsg(rc) : "no context");
    qd_context_free(rc);
    if (ok) check_group(ref_m, prompt, n, &ref, name);
    const int modes[3][2] = {{2, 0}, {4, 0}, {2, 1}};
    for (int i = 0; ok && i < 3; i++) {
        char what[160];
        snprintf(what, sizeof what, "%s %s=%d", name, modes[i][1] ? "EP" : "TP", modes[i][0]);
        qd_model *m = load(dir, modes[i][0], modes[i][1], msg, sizeof msg);
        if (!m) {
            /* a size the heads do not divide, or EP without experts: refused with the reason */
            printf("  %-40s not split: %s\n", what, msg);
            CHECKF(strstr(msg, "tensor parallel size") || strstr(msg, "no MoE layers"), "%s: %s", what, msg);
            continue;
        }
        CHECKF(qd_model_has_mtp(m, msg, sizeof msg), "%s: no MTP head: %s", what, msg);
        qd_context *ctx = make_ctx(m, n);
        mtp_out got = {0};
        float *rows = malloc(sizeof(float) * N_DEC * V);
        if (ctx && rows && run_mtp(ctx, m, prompt, n, &got)) compare_mtp(&got, &ref, n, V, H, what);
        if (ctx && rows && plain_rows(ctx, prompt, n, plain, V, rows))
            check_verify(ctx, m, prompt, n, plain, rows, ref_rows, what);
        if (ctx) check_spec(ctx, m, prompt, n, plain, what);
        mtp_out_free(&got);
        free(rows);
        qd_context_free(ctx);
        qd_model_free(m);
    }
    mtp_out_free(&ref);
    free(ref_rows);
    free(row);
    qd_model_free(ref_m);
}

int main(void) {
    printf("models/qdelta-tiny\n");
    /* the head's kind of text: the start of the held-out text (its drafts are often kept) */
    check_model("models/qdelta-tiny", "reference/heldout.ids", 40);
    const char *names[3] = {"qwen3_5_dense_mtp", "qwen3_5_moe_fused_mtp", "qwen3_next_moe_mtp"};
    for (int i = 0; i < 3; i++) {
        char dir[256];
        snprintf(dir, sizeof dir, "tests/fixtures_mtp/%s", names[i]);
        printf("%s\n", dir);
        check_model(dir, "prompt.ids", MAX_PROMPT);
    }
    check_quantized("tests/fixtures_mtp/qwen3_5_dense_mtp", 0);
    check_quantized("tests/fixtures_mtp/qwen3_next_moe_mtp", 1);
    /* a split checkpoint without an MTP head: the context refuses speculation and says why */
    char msg[1024];
    qd_model *m = load(QD_FIXTURES "/qwen3_5_dense_f32", 2, 0, msg, sizeof msg);
    CHECKF(m != NULL, "TP=2 without a head: %s", msg);
    if (m) {
        CHECK(!qd_model_has_mtp(m, msg, sizeof msg) && strstr(msg, "no MTP head"));
        qd_context_params cp = qd_context_default_params();
        cp.mtp = 1;
        cp.speculative_tokens = 2;
        qd_context *ctx = NULL;
        CHECK(qd_context_create(m, &cp, &ctx) == QD_ERR_UNSUPPORTED && !ctx);
        CHECKF(strstr(qd_model_errmsg(m), "speculative decoding: the checkpoint has no MTP head"), "refusal: %s",
               qd_model_errmsg(m));
        qd_model_free(m);
    }
    return qd_test_finish("test_spec_tp");
}
