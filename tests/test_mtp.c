/* The MTP head (spec 7.2) on the CPU backend against tools/make_mtp_fixtures.py's reference
 * (transformers' own decoder layer and norms, tests/fixtures_mtp/): its logits from one
 * MTP pass over a prompt; the same when the MTP runs in pieces over its paged KV cache
 * (prefill chunk, single draft steps), after a rollback of its KV, and with two sequences
 * in one ragged MTP batch; draft steps past the sequence's length; and the errors: no
 * head, an incomplete head, a context without params.mtp, bad spans. */
#include <math.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "model/model.h" /* qd_seq_state_save / restore: the rollback the runtime uses */
#include "qd_fixtures.h"
#include "qd_test.h"
#include "qdelta.h"

#define MTP_FIXTURES "tests/fixtures_mtp"
#define MAX_IDS 256

static qd_model *load(const char *dir, char *err, size_t n) {
    qd_model_params mp = qd_model_default_params();
    mp.path = dir;
    mp.n_threads = 2;
    qd_model *m = NULL;
    if (qd_model_load(&mp, &m, err, n) != QD_OK) return NULL;
    return m;
}

static qd_context *mtp_context(qd_model *m, int max_seqs, int max_ctx, int invariant) {
    qd_context_params cp = qd_context_default_params();
    cp.max_seqs = max_seqs;
    cp.max_ctx = max_ctx;
    cp.max_batch = max_seqs * max_ctx;
    cp.mtp = 1;
    cp.batch_invariant = invariant;
    qd_context *ctx = NULL;
    qd_status s = qd_context_create(m, &cp, &ctx);
    CHECKF(s == QD_OK, "context with mtp: %s", qd_model_errmsg(m));
    return s == QD_OK ? ctx : NULL;
}


/* Main prefill of ids into seq (hidden [n][H]) and the MTP over pieces of the pairs
 * (hidden_p, id_{p+1}): cuts[] are the pieces' lengths, summing to n - 1; logits [n-1][V]. */
static int mtp_in_pieces(qd_context *ctx, int seq, const int32_t *ids, int n, const int *cuts, int n_cuts,
                         float *hidden, float *logits, int V, int H) {
    qd_span sp = {.seq = seq, .tokens = ids, .n_tokens = n, .logits = QD_LOGITS_ALL};
    if (qd_forward_hidden(ctx, &sp, 1, NULL, hidden) != QD_OK) {
        fprintf(stderr, "main forward: %s\n", qd_context_errmsg(ctx));
        return -1;
    }
    int p = 0;
    for (int c = 0; c < n_cuts; c++) {
        qd_span ms = {.seq = seq, .tokens = ids + 1 + p, .n_tokens = cuts[c], .logits = QD_LOGITS_ALL};
        if (qd_mtp_forward(ctx, &ms, 1, hidden + (size_t)p * H, logits + (size_t)p * V, NULL) != QD_OK) {
            fprintf(stderr, "mtp forward: %s\n", qd_context_errmsg(ctx));
            return -1;
        }
        p += cuts[c];
    }
    return p == n - 1 ? 0 : -1;
}

static void check_fixture(const char *dir) {
    char path[1024], err[1024];
    qd_model *m = load(dir, err, sizeof err);
    CHECKF(m != NULL, "%s: load failed: %s", dir, err);
    if (!m) return;
    CHECKF(qd_model_has_mtp(m, err, sizeof err), "%s: no MTP head bound: %s", dir, err);
    const int V = qd_model_vocab_size(m), H = qd_model_hidden_size(m);
    snprintf(path, sizeof path, "%s/prompt.ids", dir);
    char *txt = qd_test_read_file(path, NULL);
    int32_t ids[MAX_IDS];
    const int n = txt ? qd_fixture_parse_ids(txt, ids, MAX_IDS) : 0;
    free(txt);
    snprintf(path, sizeof path, "%s/mtp_logits.f32", dir);
    size_t len = 0;
    float *ref = (float *)qd_test_read_file(path, &len);
    CHECKF(n >= 20 && ref && len == sizeof(float) * (size_t)(n - 1) * V, "%s: prompt of %d ids, reference of %zu bytes",
           dir, n, len);
    if (n < 20 || !ref || len != sizeof(float) * (size_t)(n - 1) * V) {
        free(ref);
        qd_model_free(m);
        return;
    }
    const size_t rows = (size_t)(n - 1);
    float *hidden = malloc(sizeof(float) * (size_t)n * H), *one = malloc(sizeof(float) * rows * V);
    float *piece = malloc(sizeof(float) * rows * V), *hout = malloc(sizeof(float) * rows * H);

    /* 1. one MTP pass over every pair, against the reference */
    qd_context *ctx = mtp_context(m, 2, n + 8, 1);
    if (!ctx) goto done;
    const int all[1] = {n - 1};
    CHECK(mtp_in_pieces(ctx, 0, ids, n, all, 1, hidden, one, V, H) == 0);
    double mx = 0;
    for (size_t i = 0; i < rows * V; i++) mx = fmax(mx, fabs(ref[i]));
    const double e = qd_test_max_diff(one, ref, rows * V);
    int same_argmax = 0;
    for (size_t r = 0; r < rows; r++) same_argmax += qd_test_argmax(one + r * V, V) == qd_test_argmax(ref + r * V, V);
    printf("  %-28s n=%d  MTP logits max|diff|/max|ref| = %.2e, argmax equal %d/%zu\n", dir + strlen(MTP_FIXTURES) + 1,
           n, e / mx, same_argmax, rows);
    CHECKF(e <= 5e-5 * mx, "%s: MTP logits differ: max |diff| %g vs 5e-5 x max|ref| = %g", dir, e, 5e-5 * mx);
    CHECKF(same_argmax == (int)rows, "%s: argmax differs on %zu rows", dir, rows - same_argmax);
    CHECK(qd_mtp_length(ctx, 0) == n - 1);

    /* 1b. the same pass again as drafts (qd_mtp_forward_ids): the whole vocabulary's and
     * a bound's argmax (only those rows of the LM head multiplied) are the argmax of the
     * logits above over the same ids on every row whose top two are apart; h' is the
     * logits pass's; a bound past the vocabulary is refused and changes nothing */
    {
        int32_t *d = malloc(sizeof(int32_t) * rows);
        float *h2 = malloc(sizeof(float) * rows * H), *h1 = malloc(sizeof(float) * rows * H);
        qd_span ms = {.seq = 0, .tokens = ids + 1, .n_tokens = n - 1, .logits = QD_LOGITS_ALL};
        const int limits[2] = {0, V / 2 + 5};
        CHECK(d && h2 && h1 && qd_mtp_truncate(ctx, 0, 0) == QD_OK &&
              qd_mtp_forward(ctx, &ms, 1, hidden, piece, h1) == QD_OK);
        for (int li = 0; li < 2 && d && h2 && h1; li++) {
            const int lim = limits[li] ? limits[li] : V;
            CHECK(qd_mtp_truncate(ctx, 0, 0) == QD_OK);
            CHECK(qd_mtp_forward_ids(ctx, &ms, 1, hidden, limits[li], d, h2) == QD_OK && qd_mtp_length(ctx, 0) == n - 1);
            int dec = 0, agree = 0, below = 1;
            for (size_t r = 0; r < rows; r++) {
                const float *row = one + r * V;
                const int a = qd_test_argmax(row, lim);
                below &= d[r] >= 0 && d[r] < lim;
                if (qd_test_top_gap(row, lim) > 1e-5 * mx) {
                    dec++;
                    agree += d[r] == a;
                }
            }
            CHECKF(below && dec >= (int)rows / 2 && agree == dec, "%s: drafts below %d: %d of %d decidable rows agree",
                   dir, lim, agree, dec);
            CHECKF(qd_test_max_diff(h2, h1, rows * H) == 0, "%s: drafts' h' differs from the logits pass's by %g", dir,
                   qd_test_max_diff(h2, h1, rows * H));
        }
        CHECK(d && qd_mtp_forward_ids(ctx, &ms, 1, hidden, V + 1, d, NULL) == QD_ERR_INVALID_ARG);
        CHECK(d && qd_mtp_forward_ids(ctx, &ms, 1, hidden, -1, d, NULL) == QD_ERR_INVALID_ARG);
        CHECK(qd_mtp_length(ctx, 0) == n - 1);
        free(d);
        free(h2);
        free(h1);
    }

    /* 2. the same pairs in pieces (a chunk, single rows as draft steps are, a chunk) on
     * sequence 1: the MTP KV cache carries the context across calls; batch-invariant
     * mode makes every row's sums the same whatever the piece, so the bits agree */
    const int cuts[5] = {17, 1, 1, 1, n - 1 - 20};
    CHECK(mtp_in_pieces(ctx, 1, ids, n, cuts, 5, hidden, piece, V, H) == 0);
    CHECKF(qd_test_max_diff(piece, one, rows * V) == 0, "%s: MTP in pieces differs by %g", dir, qd_test_max_diff(piece, one, rows * V));

    /* 3. rollback: drop the MTP KV past 11, run those rows again: the same bits; and
     * h' (hidden_out) is the MTP norm's output, finite */
    CHECK(qd_mtp_truncate(ctx, 1, 11) == QD_OK && qd_mtp_length(ctx, 1) == 11);
    {
        qd_span ms = {.seq = 1, .tokens = ids + 12, .n_tokens = n - 12, .logits = QD_LOGITS_ALL};
        CHECK(qd_mtp_forward(ctx, &ms, 1, hidden + (size_t)11 * H, piece + (size_t)11 * V, hout) == QD_OK);
        CHECKF(qd_test_max_diff(piece, one, rows * V) == 0, "%s: MTP after rollback differs by %g", dir,
               qd_test_max_diff(piece, one, rows * V));
        int finite = 1;
        for (size_t i = 0; i < (size_t)(n - 12) * H; i++) finite &= isfinite(hout[i]);
        CHECK(finite);
    }

    /* 4. a rollback of the sequence itself (restore to a shorter snapshot) truncates its
     * MTP KV with it; the MTP rows run again from there give the same bits */
    {
        qd_seq_reset(ctx, 1);
        CHECK(qd_mtp_length(ctx, 1) == 0);
        qd_span sp = {.seq = 1, .tokens = ids, .n_tokens = 10, .logits = QD_LOGITS_ALL};
        CHECK(qd_forward_hidden(ctx, &sp, 1, NULL, hidden) == QD_OK);
        const size_t sz = qd_seq_state_size(ctx);
        void *snap = malloc(sz);
        CHECK(qd_seq_state_save(ctx, 1, snap, sz) == QD_OK);
        qd_span rest = {.seq = 1, .tokens = ids + 10, .n_tokens = n - 10, .logits = QD_LOGITS_ALL};
        CHECK(qd_forward_hidden(ctx, &rest, 1, NULL, hidden + (size_t)10 * H) == QD_OK);
        qd_span ms = {.seq = 1, .tokens = ids + 1, .n_tokens = n - 1, .logits = QD_LOGITS_ALL};
        CHECK(qd_mtp_forward(ctx, &ms, 1, hidden, piece, NULL) == QD_OK && qd_mtp_length(ctx, 1) == n - 1);
        CHECK(qd_seq_state_restore(ctx, 1, snap, sz) == QD_OK);
        CHECK(qd_seq_length(ctx, 1) == 10 && qd_mtp_length(ctx, 1) == 10);
        float *h2 = malloc(sizeof(float) * (size_t)n * H), *again = malloc(sizeof(float) * rows * V);
        memcpy(h2, hidden, sizeof(float) * 10 * (size_t)H);
        CHECK(qd_forward_hidden(ctx, &rest, 1, NULL, h2 + (size_t)10 * H) == QD_OK);
        CHECKF(qd_test_max_diff(h2, hidden, (size_t)n * H) == 0, "%s: main hidden after a rollback differs", dir);
        qd_span tail = {.seq = 1, .tokens = ids + 11, .n_tokens = n - 11, .logits = QD_LOGITS_ALL};
        CHECK(qd_mtp_forward(ctx, &tail, 1, h2 + (size_t)10 * H, again, NULL) == QD_OK);
        CHECKF(qd_test_max_diff(again, piece + (size_t)10 * V, (rows - 10) * V) == 0,
               "%s: MTP after a sequence rollback differs by %g", dir, qd_test_max_diff(again, piece + (size_t)10 * V, (rows - 10) * V));
        free(h2);
        free(again);
        free(snap);
    }

    /* 5. two sequences in one ragged MTP batch: the first's last 5 pairs next to the
     * second's first 9 give the rows of one pass */
    qd_seq_reset(ctx, 0);
    qd_seq_reset(ctx, 1);
    {
        qd_span sp[2] = {{.seq = 0, .tokens = ids, .n_tokens = n, .logits = QD_LOGITS_ALL},
                         {.seq = 1, .tokens = ids, .n_tokens = n, .logits = QD_LOGITS_ALL}};
        float *h2 = malloc(sizeof(float) * 2 * (size_t)n * H);
        CHECK(qd_forward_hidden(ctx, sp, 2, NULL, h2) == QD_OK);
        CHECKF(qd_test_max_diff(h2, h2 + (size_t)n * H, (size_t)n * H) == 0, "%s: two equal prompts, different hidden", dir);
        qd_span a = {.seq = 0, .tokens = ids + 1, .n_tokens = n - 6, .logits = QD_LOGITS_NONE};
        CHECK(qd_mtp_forward(ctx, &a, 1, h2, NULL, NULL) == QD_OK);
        qd_span mix[2] = {{.seq = 0, .tokens = ids + n - 5, .n_tokens = 5, .logits = QD_LOGITS_ALL},
                          {.seq = 1, .tokens = ids + 1, .n_tokens = 9, .logits = QD_LOGITS_ALL}};
        float *hin = malloc(sizeof(float) * 14 * (size_t)H), *lg = malloc(sizeof(float) * 14 * (size_t)V);
        memcpy(hin, h2 + (size_t)(n - 6) * H, sizeof(float) * 5 * H);
        memcpy(hin + (size_t)5 * H, h2 + (size_t)n * H, sizeof(float) * 9 * H);
        CHECK(qd_mtp_forward(ctx, mix, 2, hin, lg, NULL) == QD_OK);
        CHECKF(qd_test_max_diff(lg, one + (size_t)(n - 6) * V, 5 * (size_t)V) == 0, "%s: ragged MTP batch, sequence 0", dir);
        CHECKF(qd_test_max_diff(lg + (size_t)5 * V, one, 9 * (size_t)V) == 0, "%s: ragged MTP batch, sequence 1", dir);
        free(hin);
        free(lg);
        free(h2);
    }

    /* 6. draft steps past the sequence's length (h' fed back, the drafted token as input)
     * take KV positions beyond it; max_ctx bounds them */
    {
        qd_seq_reset(ctx, 1);
        qd_span sp = {.seq = 1, .tokens = ids, .n_tokens = 5, .logits = QD_LOGITS_ALL};
        CHECK(qd_forward_hidden(ctx, &sp, 1, NULL, hidden) == QD_OK);
        qd_span ms = {.seq = 1, .tokens = ids + 1, .n_tokens = 5, .logits = QD_LOGITS_LAST};
        float hp[1024];
        CHECK(H <= 1024 && qd_mtp_forward(ctx, &ms, 1, hidden, piece, hp) == QD_OK);
        int32_t tok = qd_test_argmax(piece, V);
        for (int k = 0; k < 4; k++) {
            qd_span d = {.seq = 1, .tokens = &tok, .n_tokens = 1, .logits = QD_LOGITS_LAST};
            CHECK(qd_mtp_forward(ctx, &d, 1, hp, piece, hp) == QD_OK);
            tok = qd_test_argmax(piece, V);
        }
        CHECK(qd_mtp_length(ctx, 1) == 9 && qd_seq_length(ctx, 1) == 5);
        CHECK(qd_mtp_truncate(ctx, 1, 5) == QD_OK && qd_mtp_length(ctx, 1) == 5);
        qd_span big = {.seq = 1, .tokens = ids, .n_tokens = n + 4, .logits = QD_LOGITS_NONE};
        qd_status s = qd_mtp_forward(ctx, &big, 1, hidden, NULL, NULL);
        CHECKF(s == QD_ERR_CAPACITY && strstr(qd_context_errmsg(ctx), "context length"), "past max_ctx: %s",
               qd_context_errmsg(ctx));
    }

    /* 6b. prefix sharing: a fork's MTP write at the shared block's edge (the pair of the
     * last shared position and a token the two sequences do not share) goes to a private
     * copy; the parent's MTP rows are those of a run without the fork */
    {
        float *h = malloc(sizeof(float) * (size_t)n * H), *ref_rows = malloc(sizeof(float) * rows * V);
        float *rows2 = malloc(sizeof(float) * rows * V);
        for (int pass = 0; pass < 2; pass++) {
            qd_seq_reset(ctx, 0);
            qd_seq_reset(ctx, 1);
            qd_span a = {.seq = 0, .tokens = ids, .n_tokens = 21, .logits = QD_LOGITS_ALL};
            CHECK(qd_forward_hidden(ctx, &a, 1, NULL, h) == QD_OK);
            qd_span ma = {.seq = 0, .tokens = ids + 1, .n_tokens = 20, .logits = QD_LOGITS_NONE};
            CHECK(qd_mtp_forward(ctx, &ma, 1, h, NULL, NULL) == QD_OK);
            if (pass == 1) { /* the child redoes position 19 with another token 20 */
                CHECK(qd_seq_fork(ctx, 0, 1) == QD_OK && qd_mtp_length(ctx, 1) == 20);
                CHECK(qd_mtp_truncate(ctx, 1, 19) == QD_OK);
                int32_t other = (ids[20] + 5) % V;
                qd_span mb = {.seq = 1, .tokens = &other, .n_tokens = 1, .logits = QD_LOGITS_NONE};
                CHECK(qd_mtp_forward(ctx, &mb, 1, h + (size_t)19 * H, NULL, NULL) == QD_OK);
            }
            qd_span b = {.seq = 0, .tokens = ids + 21, .n_tokens = n - 21, .logits = QD_LOGITS_ALL};
            CHECK(qd_forward_hidden(ctx, &b, 1, NULL, h + (size_t)21 * H) == QD_OK);
            qd_span mc = {.seq = 0, .tokens = ids + 21, .n_tokens = n - 21, .logits = QD_LOGITS_ALL};
            CHECK(qd_mtp_forward(ctx, &mc, 1, h + (size_t)20 * H, pass ? rows2 : ref_rows, NULL) == QD_OK);
        }
        CHECKF(qd_test_max_diff(rows2, ref_rows, (size_t)(n - 21) * V) == 0, "%s: a fork's MTP write reached the parent (%g)",
               dir, qd_test_max_diff(rows2, ref_rows, (size_t)(n - 21) * V));
        free(h);
        free(ref_rows);
        free(rows2);
    }

    /* 7. bad spans */
    {
        int32_t bad = V;
        qd_span ms = {.seq = 0, .tokens = &bad, .n_tokens = 1, .logits = QD_LOGITS_LAST};
        CHECK(qd_mtp_forward(ctx, &ms, 1, hidden, piece, NULL) == QD_ERR_INVALID_ARG &&
              strstr(qd_context_errmsg(ctx), "out of range"));
        qd_span ok = {.seq = 0, .tokens = ids, .n_tokens = 1, .logits = QD_LOGITS_LAST};
        CHECK(qd_mtp_forward(ctx, &ok, 1, NULL, piece, NULL) == QD_ERR_INVALID_ARG);
        qd_span twice[2] = {ok, ok};
        CHECK(qd_mtp_forward(ctx, twice, 2, hidden, piece, NULL) == QD_ERR_INVALID_ARG);
    }
    qd_context_free(ctx);

    /* 8. a context without params.mtp refuses the MTP forward */
    {
        qd_context_params cp = qd_context_default_params();
        cp.max_ctx = n;
        cp.max_batch = n;
        qd_context *plain = NULL;
        CHECK(qd_context_create(m, &cp, &plain) == QD_OK);
        if (plain) {
            qd_span sp = {.seq = 0, .tokens = ids, .n_tokens = 4, .logits = QD_LOGITS_ALL};
            CHECK(qd_forward_hidden(plain, &sp, 1, NULL, hidden) == QD_OK);
            qd_span ms = {.seq = 0, .tokens = ids + 1, .n_tokens = 3, .logits = QD_LOGITS_ALL};
            qd_status s = qd_mtp_forward(plain, &ms, 1, hidden, piece, NULL);
            CHECKF(s == QD_ERR_UNSUPPORTED && strstr(qd_context_errmsg(plain), "params.mtp"), "%s",
                   qd_context_errmsg(plain));
            qd_context_free(plain);
        }
    }
done:
    free(hidden);
    free(one);
    free(piece);
    free(hout);
    free(ref);
    qd_model_free(m);
}

/* A checkpoint without a (complete) head loads, and a context asking for speculation
 * gets QD_ERR_UNSUPPORTED saying why. */
static void check_refused(const char *dir, const char *why) {
    char err[1024];
    qd_model *m = load(dir, err, sizeof err);
    CHECKF(m != NULL, "%s: load failed: %s", dir, err);
    if (!m) return;
    CHECK(!qd_model_has_mtp(m, err, sizeof err) && strstr(err, why));
    qd_context_params cp = qd_context_default_params();
    cp.max_ctx = 64;
    cp.mtp = 1;
    qd_context *ctx = NULL;
    qd_status s = qd_context_create(m, &cp, &ctx);
    CHECKF(s == QD_ERR_UNSUPPORTED && !ctx && strstr(qd_model_errmsg(m), why), "%s: %s (%s)", dir,
           qd_status_name(s), qd_model_errmsg(m));
    qd_context_free(ctx);
    qd_model_free(m);
}

/* tests/fixtures_mtp/<name> holding mtp_logits.f32, sorted (at most max). */
static int mtp_fixture_dirs(char **dirs, int max) {
    DIR *d = opendir(MTP_FIXTURES);
    if (!d) return 0;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) && n < max) {
        char path[1024];
        struct stat st;
        if (e->d_name[0] == '.') continue;
        snprintf(path, sizeof path, "%s/%s/mtp_logits.f32", MTP_FIXTURES, e->d_name);
        if (stat(path, &st) != 0) continue;
        snprintf(path, sizeof path, "%s/%s", MTP_FIXTURES, e->d_name);
        dirs[n++] = strdup(path);
    }
    closedir(d);
    qsort(dirs, (size_t)n, sizeof(char *), qd_fixture_cmp_str);
    return n;
}

/* `qdelta logits --mtp` writes the same rows as the API (the binary from ctest's
 * QDELTA_BIN), and refuses a checkpoint without a head with exit status 1. */
static void check_cli(const char *dir) {
    const char *bin = getenv("QDELTA_BIN");
    if (!bin) {
        printf("  QDELTA_BIN unset: the CLI check runs under ctest only\n");
        return;
    }
    char cmd[2048], path[1024];
    snprintf(cmd, sizeof cmd, "%s logits -m %s --ids %s/prompt.ids --mtp -o /tmp/qd_test_mtp_%d.f32", bin, dir, dir,
             (int)getpid());
    CHECKF(system(cmd) == 0, "%s failed", cmd);
    snprintf(path, sizeof path, "/tmp/qd_test_mtp_%d.f32", (int)getpid());
    size_t len = 0, rlen = 0;
    float *got = (float *)qd_test_read_file(path, &len);
    remove(path);
    snprintf(path, sizeof path, "%s/mtp_logits.f32", dir);
    float *ref = (float *)qd_test_read_file(path, &rlen);
    CHECKF(got && ref && len == rlen, "CLI wrote %zu bytes, reference %zu", len, rlen);
    if (got && ref && len == rlen) {
        double mx = 0;
        for (size_t i = 0; i < len / 4; i++) mx = fmax(mx, fabs(ref[i]));
        CHECKF(qd_test_max_diff(got, ref, len / 4) <= 5e-5 * mx, "CLI MTP logits differ by %g", qd_test_max_diff(got, ref, len / 4));
    }
    free(got);
    free(ref);
    snprintf(cmd, sizeof cmd, "%s logits -m %s --ids %s/prompt.ids --mtp -o /dev/null 2>/dev/null", bin,
             QD_FIXTURES "/qwen3_5_dense_f32", dir);
    const int rc = system(cmd);
    CHECKF(WIFEXITED(rc) && WEXITSTATUS(rc) == 1, "--mtp on a model without a head: status %d", rc);
}

/* Dummy weights of a config with mtp_num_hidden_layers draw a head too (benchmarks of the
 * draft steps at real shapes): it runs and gives finite draft logits; a config without the
 * field has none, and says so. */
static void check_dummy(const char *dir, int has_mtp) {
    qd_model_params mp = qd_model_default_params();
    mp.path = dir;
    mp.load_format = QD_LOAD_DUMMY;
    mp.n_threads = 2;
    qd_model *m = NULL;
    char err[512], why[256] = "";
    CHECKF(qd_model_load(&mp, &m, err, sizeof err) == QD_OK, "%s dummy: %s", dir, err);
    if (!m) return;
    CHECKF(qd_model_has_mtp(m, why, sizeof why) == has_mtp, "%s dummy: MTP head %d, want %d (%s)", dir, !has_mtp,
           has_mtp, why);
    if (!has_mtp) CHECKF(strstr(why, "mtp_num_hidden_layers") != NULL, "%s dummy: why no head: %s", dir, why);
    qd_context *ctx = has_mtp ? mtp_context(m, 1, 32, 0) : NULL;
    if (ctx) {
        const int V = qd_model_vocab_size(m), H = qd_model_hidden_size(m);
        int32_t ids[9] = {1, 5, 9, 2, 7, 3, 8, 4, 6};
        float *lg = malloc(sizeof(float) * 9 * (size_t)V), *hid = malloc(sizeof(float) * 9 * (size_t)H);
        qd_span sp = {.seq = 0, .tokens = ids, .n_tokens = 9, .logits = QD_LOGITS_ALL};
        CHECK(qd_forward_hidden(ctx, &sp, 1, lg, hid) == QD_OK);
        qd_span ms = {.seq = 0, .tokens = ids + 1, .n_tokens = 8, .logits = QD_LOGITS_ALL};
        CHECKF(qd_mtp_forward(ctx, &ms, 1, hid, lg, NULL) == QD_OK, "%s dummy MTP: %s", dir, qd_context_errmsg(ctx));
        int finite = 1;
        for (size_t i = 0; i < 8 * (size_t)V; i++) finite &= isfinite(lg[i]) != 0;
        CHECKF(finite, "%s dummy MTP: non-finite draft logits", dir);
        free(lg);
        free(hid);
        qd_context_free(ctx);
    }
    qd_model_free(m);
}

int main(void) {
    char *dirs[16];
    const int n = mtp_fixture_dirs(dirs, 16);
    CHECKF(n >= 3, "%d MTP fixtures in %s (expected 3)", n, MTP_FIXTURES);
    for (int i = 0; i < n; i++) {
        check_fixture(dirs[i]);
        free(dirs[i]);
    }
    /* a stray mtp.fc.weight alone (tools/make_fixtures.py's qwen3_next_moe) */
    check_refused(QD_FIXTURES "/qwen3_next_moe_f32", "mtp.pre_fc_norm_embedding.weight");
    check_refused(QD_FIXTURES "/qwen3_5_dense_f32", "no MTP head");
    check_cli(MTP_FIXTURES "/qwen3_next_moe_mtp");
    check_dummy(QD_FIXTURES "/gpu_qwen3_5_moe_bf16", 1);
    check_dummy(QD_FIXTURES "/gpu_qwen3_next_moe_bf16", 0);
    return qd_test_finish("test_mtp");
}
