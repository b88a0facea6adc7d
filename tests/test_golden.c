/* Golden tests against Hugging Face transformers (fp32 references made by
 * tools/make_fixtures.py): for every fixture model and every prompt, the logits of
 * every position from one prefill are within 5e-4 x max|ref| of the reference, and
 * the 16-token greedy continuation (prefill, then one decode step per token) is
 * identical. */
#include <string.h>

#include "qd_fixtures.h"
#include "qd_test.h"
#include "qdelta.h"

#define FIXTURES QD_FIXTURES


static int n_cases_total = 0;

static void check_case(qd_model *m, const char *dir, const char *prompt_file) {
    char path[1024];
    int L = atoi(prompt_file + strlen("prompt_"));
    snprintf(path, sizeof path, "%s/%s", dir, prompt_file);
    char *txt = qd_test_read_file(path, NULL);
    CHECKF(txt != NULL, "cannot read %s", path);
    if (!txt) return;
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)(L + 32));
    int n = qd_fixture_parse_ids(txt, ids, L + 32);
    free(txt);
    CHECKF(n == L, "%s: expected %d ids, read %d", path, L, n);
    const int V = qd_model_vocab_size(m);

    qd_context_params cp = qd_context_default_params();
    cp.max_ctx = L + 16;
    cp.max_batch = L;
    qd_context *ctx;
    CHECK(qd_context_create(m, &cp, &ctx) == QD_OK);
    float *logits = malloc(sizeof(float) * (size_t)L * V);
    qd_span span = {0, ids, L, QD_LOGITS_ALL};
    qd_status s = qd_forward(ctx, &span, 1, logits);
    CHECKF(s == QD_OK, "%s: forward failed: %s", path, qd_context_errmsg(ctx));

    snprintf(path, sizeof path, "%s/logits_%d.f32", dir, L);
    size_t len;
    float *ref = (float *)qd_test_read_file(path, &len);
    if (ref) {
        CHECKF(len == sizeof(float) * (size_t)L * V, "%s: size %zu, expected %zu", path, len, sizeof(float) * (size_t)L * V);
        double mx = 0, err = 0;
        int worst = -1;
        for (size_t i = 0; i < (size_t)L * V; i++) mx = fmax(mx, fabs(ref[i]));
        for (size_t i = 0; i < (size_t)L * V; i++) {
            double d = fabs((double)logits[i] - ref[i]);
            if (!(d <= err)) { err = d; worst = (int)(i / V); }
        }
        printf("  %-40s L=%-4d max|diff|/max|ref| = %.2e (worst position %d)\n", dir + strlen(FIXTURES) + 1, L, err / mx, worst);
        CHECKF(err <= 5e-4 * mx, "%s: logits differ: max |diff| %g vs 5e-4 x max|ref| = %g", path, err, 5e-4 * mx);
        free(ref);
    }

    /* greedy: the prefill's last row, then decode steps */
    snprintf(path, sizeof path, "%s/greedy_%d.ids", dir, L);
    txt = qd_test_read_file(path, NULL);
    if (txt) {
        int32_t want[64];
        int n_want = qd_fixture_parse_ids(txt, want, 64);
        free(txt);
        int32_t got[64];
        const float *row = logits + (size_t)(L - 1) * V;
        float *step = malloc(sizeof(float) * V);
        for (int t = 0; t < n_want; t++) {
            int best = 0;
            for (int v = 1; v < V; v++) if (row[v] > row[best]) best = v;
            got[t] = best;
            if (t + 1 == n_want) break;
            qd_span d = {0, &got[t], 1, QD_LOGITS_LAST};
            CHECK(qd_forward(ctx, &d, 1, step) == QD_OK);
            row = step;
        }
        int same = 1;
        for (int t = 0; t < n_want; t++) same &= got[t] == want[t];
        CHECKF(same, "%s: greedy continuation differs", path);
        if (!same) {
            fprintf(stderr, "    want:");
            for (int t = 0; t < n_want; t++) fprintf(stderr, " %d", want[t]);
            fprintf(stderr, "\n    got: ");
            for (int t = 0; t < n_want; t++) fprintf(stderr, " %d", got[t]);
            fprintf(stderr, "\n");
        }
        free(step);
    }
    n_cases_total++;
    free(logits);
    free(ids);
    qd_context_free(ctx);
}

static void check_fixture(const char *dir) {
    qd_model_params mp = qd_model_default_params();
    mp.path = dir;
    mp.n_threads = 2;
    qd_model *m;
    char err[1024];
    qd_status s = qd_model_load(&mp, &m, err, sizeof err);
    CHECKF(s == QD_OK, "%s: load failed: %s", dir, err);
    if (s != QD_OK) return;
    char *names[64];
    const int n = qd_fixture_prompts(dir, names, 64);
    CHECKF(n > 0, "%s: no prompt_*.ids cases", dir);
    for (int i = 0; i < n; i++) {
        check_case(m, dir, names[i]);
        free(names[i]);
    }
    qd_model_free(m);
}

int main(void) {
    char *dirs[64];
    const int n = qd_fixture_dirs("config.json", dirs, 64);
    CHECKF(n >= 0, "no %s directory (run from the repository root)", FIXTURES);
    if (n < 0) return qd_test_finish("test_golden");
    CHECKF(n >= 6, "expected at least 6 fixture models, found %d", n);
    for (int i = 0; i < n; i++) {
        printf("%s\n", dirs[i]);
        check_fixture(dirs[i]);
        free(dirs[i]);
    }
    printf("%d cases\n", n_cases_total);
    return qd_test_finish("test_golden");
}
