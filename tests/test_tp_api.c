/* A split model behind the public API on the CPU (src/parallel/tp.c): qd_model_load with
 * tensor_parallel_size > 1 (each rank read from the checkpoint by its plan), contexts whose
 * ranks hold the state and KV contents, and every state operation fanned out to the ranks.
 *
 * The same script runs on the unsplit model and on each split (TP=2, TP=4, EP=2 where the
 * fixture's heads allow): a ragged prefill of two sequences, decode steps, a snapshot and
 * its restore (the replayed steps must repeat bit for bit), a fork into a third sequence
 * that then appends into the shared, partly filled KV block (copy on write), a reset and
 * re-prefill (bit for bit again), and a greedy step with log-probabilities. Every logit row
 * of a split must stay within TOL x max|ref| of the unsplit run (reordered fp32 sums, as in
 * test_tp_cpu) with the same argmax; greedy ids equal the argmax of the unsplit logits.
 * Snapshots of a split hold every rank's slice: their size is the sum of the ranks'. */
#include <string.h>

#include "model/model.h"
#include "model/model_split.h"
#include "qd_fixtures.h"
#include "qd_test.h"

#define TOL 5e-5
#define MAX_ROWS 160

typedef struct trace {
    float *rows;   /* [n][V] every logit row the script produced */
    int n, V;
    int32_t greedy[2];
    float greedy_lp[2];
    int repeat_ok; /* restored and reset replays repeated bit for bit */
} trace;

static float *next_rows(trace *t, int k) {
    CHECK(t->n + k <= MAX_ROWS);
    float *p = t->rows + (size_t)t->n * t->V;
    t->n += k;
    return p;
}

static int argmax(const float *x, int n) {
    int b = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return b;
}

static int fwd(qd_context *ctx, trace *t, const qd_span *sp, int n, int rows) {
    qd_status s = qd_forward(ctx, sp, n, next_rows(t, rows));
    CHECKF(s == QD_OK, "forward: %s", qd_context_errmsg(ctx));
    return s == QD_OK;
}

static int script(qd_model *m, const int32_t *p0, int n0, const int32_t *p1, int n1, trace *t) {
    const int V = qd_model_vocab_size(m);
    t->V = V;
    t->n = 0;
    t->rows = malloc(sizeof(float) * (size_t)MAX_ROWS * V);
    qd_context_params cp = qd_context_default_params();
    cp.max_seqs = 3;
    cp.max_ctx = 128;
    cp.max_batch = 96;
    qd_context *ctx = NULL;
    qd_status s = qd_context_create(m, &cp, &ctx);
    CHECKF(s == QD_OK, "context: %s", qd_model_errmsg(m));
    if (s != QD_OK || !t->rows) return 0;
    int ok = 1;
    qd_span pre[2] = {{0, p0, n0, QD_LOGITS_ALL}, {1, p1, n1, QD_LOGITS_LAST}};
    ok &= fwd(ctx, t, pre, 2, n0 + 1);
    /* snapshot seq 0, three decode steps, restore, the same steps again (one sequence per
     * batch both times: a replay repeats bit for bit for the same batch) */
    const size_t snap_bytes = qd_seq_state_size(ctx);
    void *snap = malloc(snap_bytes);
    ok &= snap && qd_seq_state_save(ctx, 0, snap, snap_bytes) == QD_OK;
    const int32_t dec[3][2] = {{p0[3], p1[2]}, {p0[5], p1[7]}, {p0[11], p1[1]}};
    const int before = t->n;
    for (int i = 0; i < 3 && ok; i++) {
        qd_span d = {0, &dec[i][0], 1, QD_LOGITS_LAST};
        ok &= fwd(ctx, t, &d, 1, 1);
    }
    ok &= qd_seq_state_restore(ctx, 0, snap, snap_bytes) == QD_OK && qd_seq_length(ctx, 0) == n0;
    const int after = t->n;
    for (int i = 0; i < 3 && ok; i++) {
        qd_span d = {0, &dec[i][0], 1, QD_LOGITS_LAST};
        ok &= fwd(ctx, t, &d, 1, 1);
    }
    int repeat = ok && !memcmp(t->rows + (size_t)after * V, t->rows + (size_t)before * V, sizeof(float) * V * 3);
    /* fork seq 0 (68 tokens: its last KV block is partly filled and now shared) into seq 2,
     * then both append different tokens, with seq 1 decoding alongside */
    ok &= qd_seq_fork(ctx, 0, 2) == QD_OK && qd_seq_length(ctx, 2) == n0 + 3;
    for (int i = 0; i < 2 && ok; i++) {
        qd_span d[3] = {{2, &dec[i][1], 1, QD_LOGITS_LAST}, {1, &dec[i][0], 1, QD_LOGITS_LAST},
                        {0, &dec[2 - i][0], 1, QD_LOGITS_LAST}};
        ok &= fwd(ctx, t, d, 3, 3);
    }
    /* reset seq 1 and prefill it alone, twice: the same last row */
    for (int i = 0; i < 2 && ok; i++) {
        ok &= qd_seq_reset(ctx, 1) == QD_OK;
        ok &= fwd(ctx, t, &pre[1], 1, 1);
    }
    repeat &= ok && !memcmp(t->rows + (size_t)(t->n - 1) * V, t->rows + (size_t)(t->n - 2) * V, sizeof(float) * V);
    /* a greedy step with log-probabilities on seqs 0 and 2 */
    qd_span g[2] = {{0, &dec[0][0], 1, QD_LOGITS_LAST}, {2, &dec[1][0], 1, QD_LOGITS_LAST}};
    s = qd_forward_greedy_logprobs(ctx, g, 2, 0, t->greedy, t->greedy_lp);
    CHECKF(s == QD_OK, "greedy: %s", qd_context_errmsg(ctx));
    ok &= s == QD_OK;
    t->repeat_ok = repeat;
    if (m->split) {
        size_t sum = 64;  /* the snapshot header */
        for (int r = 0; r < m->split->size; r++) sum += (size_t)qd_model_state_bytes(m->split->ranks[r]);
        CHECKF(snap_bytes == sum, "snapshot of %zu bytes, the ranks' slices need %zu", snap_bytes, sum);
    }
    free(snap);
    qd_context_free(ctx);
    return ok;
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

static void check_fixture(const char *dir) {
    int32_t p0[96], p1[96];
    char path[512], msg[1024];
    snprintf(path, sizeof path, "%s/prompt_65.ids", dir);
    char *txt = qd_test_read_file(path, NULL);
    const int n0 = txt ? qd_fixture_parse_ids(txt, p0, 96) : 0;
    free(txt);
    snprintf(path, sizeof path, "%s/prompt_64.ids", dir);
    txt = qd_test_read_file(path, NULL);
    const int n1 = txt ? qd_fixture_parse_ids(txt, p1, 13) : 0;
    free(txt);
    CHECKF(n0 == 65 && n1 == 13, "%s: prompts", dir);
    qd_model *ref_m = load(dir, 1, 0, msg, sizeof msg);
    CHECKF(ref_m != NULL, "%s: %s", dir, msg);
    if (!ref_m || n0 != 65 || n1 != 13) {
        qd_model_free(ref_m);
        return;
    }
    trace ref = {0};
    const int ran = script(ref_m, p0, n0, p1, n1, &ref);
    CHECKF(ran && ref.repeat_ok, "%s: unsplit script", dir);
    const int modes[3][2] = {{2, 0}, {4, 0}, {2, 1}};
    for (int i = 0; ran && i < 3; i++) {
        char what[160];
        snprintf(what, sizeof what, "%s %s=%d", dir + strlen(QD_FIXTURES) + 1, modes[i][1] ? "EP" : "TP", modes[i][0]);
        qd_model *m = load(dir, modes[i][0], modes[i][1], msg, sizeof msg);
        if (!m) {
            /* a size the heads do not divide, or EP without experts: refused with the reason */
            printf("  %-44s not split: %s\n", what, msg);
            CHECKF(strstr(msg, "tensor parallel size") || strstr(msg, "no MoE layers"), "%s: %s", what, msg);
            continue;
        }
        trace got = {0};
        if (script(m, p0, n0, p1, n1, &got) && got.n == ref.n) {
            double diff = 0, mx = 0;
            int same = 1;
            for (int r = 0; r < ref.n; r++) {
                const float *a = got.rows + (size_t)r * ref.V, *b = ref.rows + (size_t)r * ref.V;
                for (int v = 0; v < ref.V; v++) {
                    const double d = fabs((double)a[v] - b[v]);
                    diff = d > diff || d != d ? d : diff;
                    mx = fmax(mx, fabs(b[v]));
                }
                same &= argmax(a, ref.V) == argmax(b, ref.V);
            }
            printf("  %-44s %d rows: max|diff|/max|ref| = %.2e, argmax %s, replays %s\n", what, ref.n, diff / mx,
                   same ? "same" : "DIFFERENT", got.repeat_ok ? "exact" : "DIFFER");
            CHECKF(diff <= TOL * mx, "%s: logits differ by %g x max|ref|", what, diff / mx);
            CHECKF(same, "%s: an argmax differs", what);
            CHECKF(got.repeat_ok, "%s: a restored or reset replay differs", what);
            CHECKF(got.greedy[0] == ref.greedy[0] && got.greedy[1] == ref.greedy[1] &&
                       fabsf(got.greedy_lp[0] - ref.greedy_lp[0]) < 1e-3f,
                   "%s: greedy ids %d %d vs %d %d", what, got.greedy[0], got.greedy[1], ref.greedy[0], ref.greedy[1]);
        } else {
            CHECKF(0, "%s: script failed", what);
        }
        free(got.rows);
        qd_model_free(m);
    }
    free(ref.rows);
    qd_model_free(ref_m);
}

int main(void) {
    char *dirs[64];
    int n = qd_fixture_dirs("prompt_65.ids", dirs, 64);
    CHECKF(n >= 6, "expected at least 6 fixture models, found %d (run from the repository root)", n);
    for (int i = 0; i < n; i++) {
        printf("%s\n", dirs[i]);
        check_fixture(dirs[i]);
        free(dirs[i]);
    }
    /* a bad size fails at load with the field named, before any rank is read */
    char msg[1024];
    qd_model *m = load(QD_FIXTURES "/qwen3_5_moe_fused_f32", 3, 0, msg, sizeof msg);
    CHECKF(!m && strstr(msg, "linear_num_key_heads"), "TP=3: %s", m ? "accepted" : msg);
    qd_model_free(m);
    m = load(QD_FIXTURES "/qwen3_5_dense_f32", 2, 1, msg, sizeof msg);
    CHECKF(!m && strstr(msg, "no MoE layers"), "EP on a dense model: %s", m ? "accepted" : msg);
    qd_model_free(m);
    m = load(QD_FIXTURES "/qwen3_5_dense_f32", 9, 0, msg, sizeof msg);
    CHECKF(!m && strstr(msg, "supported are 1 to 8"), "TP=9: %s", m ? "accepted" : msg);
    qd_model_free(m);
    return qd_test_finish("test_tp_api");
}
