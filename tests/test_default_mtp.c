/* The default model's trained MTP head (models/qdelta-tiny, tools/train_mtp_head.py) in
 * greedy speculative decoding (runtime/spec_decode.h), CPU backend, on prompts of the
 * model's own kind of text: the five reference prompts (reference/prompt_*.ids: Bible,
 * Python docs, Jargon File, WordNet, a chat turn) and three snippets of the held-out text
 * (reference/heldout.ids, never trained on, by the main model or the head).
 *
 * For K = 1..4 drafts per step, on every prompt: the speculative output is plain greedy
 * decoding's id for id (a batch-invariant context, so verify spans and one-token decodes
 * round alike), and plain greedy's first 32 ids are transformers' greedy reference
 * (reference/greedy_*.ids). Then the acceptance at K = 2, printed with the acceptance per
 * K and per draft position (the model card, models/qdelta-tiny/README.md, quotes them).
 *
 * Issue 16 asks for at least 50% of drafts kept at K = 2, and this test asserts it: the
 * shipped head (trained on the main model's own greedy continuations, the text a greedy
 * draft is checked against) keeps 55.2% (202 of 366) here; a head that is untrained or
 * wired wrong keeps a few percent (one after 10 training steps kept 5%). */
#include <string.h>

#include "qd_fixtures.h"
#include "qd_test.h"
#include "qdelta.h"
#include "runtime/spec_decode.h"

#define MODEL "models/qdelta-tiny"
#define N_NEW 48          /* generated ids per prompt */
#define N_REF 32          /* ids in reference/greedy_*.ids */
#define N_PROMPTS 8
#define SNIPPET 24        /* ids of a held-out snippet */
#define MAX_PROMPT 64
#define ACCEPT_FLOOR_K2 0.5 /* issue 16's target */

static int argmax(const float *x, int n) {
    int b = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return b;
}

/* The ids of a file, at most max; -1 when it cannot be read. */
static int read_ids(const char *path, int32_t *out, int max) {
    char *t = qd_test_read_file(path, NULL);
    if (!t) return -1;
    const int n = qd_fixture_parse_ids(t, out, max);
    free(t);
    return n;
}

typedef struct prompt {
    char name[64];
    int32_t ids[MAX_PROMPT];
    int n;
    int32_t ref[N_REF]; /* transformers' greedy ids, when n_ref == N_REF */
    int n_ref;
} prompt;

/* The prompts: reference prompts 0..4, then held-out snippets at fixed offsets. */
static int load_prompts(prompt *p) {
    char path[256];
    int k = 0;
    for (int i = 0; i < 5; i++, k++) {
        snprintf(p[k].name, sizeof p[k].name, "reference prompt %d", i);
        snprintf(path, sizeof path, MODEL "/reference/prompt_%d.ids", i);
        p[k].n = read_ids(path, p[k].ids, MAX_PROMPT);
        snprintf(path, sizeof path, MODEL "/reference/greedy_%d.ids", i);
        p[k].n_ref = read_ids(path, p[k].ref, N_REF);
        CHECKF(p[k].n > 0 && p[k].n_ref == N_REF, "%s: %d prompt ids, %d reference ids", path, p[k].n, p[k].n_ref);
        if (p[k].n <= 0 || p[k].n_ref != N_REF) return 0;
    }
    static int32_t held[20000];
    const int nh = read_ids(MODEL "/reference/heldout.ids", held, 20000);
    CHECKF(nh == 16635, MODEL "/reference/heldout.ids: %d ids, expected 16635", nh);
    if (nh != 16635) return 0;
    const int offsets[3] = {2000, 8000, 14000};
    for (int i = 0; i < 3; i++, k++) {
        snprintf(p[k].name, sizeof p[k].name, "held-out ids [%d, %d)", offsets[i], offsets[i] + SNIPPET);
        memcpy(p[k].ids, held + offsets[i], sizeof(int32_t) * SNIPPET);
        p[k].n = SNIPPET;
        p[k].n_ref = 0;
    }
    return k;
}

int main(void) {
    prompt prompts[N_PROMPTS];
    const int np = load_prompts(prompts);
    if (np != N_PROMPTS) return qd_test_finish("test_default_mtp");
    qd_model_params mp = qd_model_default_params();
    mp.path = MODEL;
    mp.n_threads = 2;
    qd_model *m = NULL;
    char err[512];
    CHECKF(qd_model_load(&mp, &m, err, sizeof err) == QD_OK, "load " MODEL ": %s", err);
    if (!m) return qd_test_finish("test_default_mtp");
    const int V = qd_model_vocab_size(m);
    qd_context_params cp = qd_context_default_params();
    cp.max_seqs = 2;
    cp.max_ctx = MAX_PROMPT + N_NEW + 8;
    cp.max_batch = cp.max_ctx;
    cp.mtp = 1;
    cp.speculative_tokens = 4;
    cp.batch_invariant = 1;
    qd_context *ctx = NULL;
    CHECKF(qd_context_create(m, &cp, &ctx) == QD_OK, "context with the MTP head: %s", qd_model_errmsg(m));
    if (!ctx) {
        qd_model_free(m);
        return qd_test_finish("test_default_mtp");
    }
    float *row = malloc(sizeof(float) * (size_t)V);
    qd_spec_stats total[5]; /* [K], K = 1..4 */
    memset(total, 0, sizeof total);
    for (int pi = 0; pi < np; pi++) {
        const prompt *p = &prompts[pi];
        /* plain greedy on sequence 0: prefill, then one-token decodes */
        int32_t plain[N_NEW], spec[N_NEW];
        CHECK(qd_seq_reset(ctx, 0) == QD_OK);
        qd_span pre = {.seq = 0, .tokens = p->ids, .n_tokens = p->n, .logits = QD_LOGITS_LAST};
        CHECKF(qd_forward(ctx, &pre, 1, row) == QD_OK, "%s: %s", p->name, qd_context_errmsg(ctx));
        plain[0] = argmax(row, V);
        for (int i = 1; i < N_NEW; i++) {
            qd_span d = {.seq = 0, .tokens = &plain[i - 1], .n_tokens = 1, .logits = QD_LOGITS_LAST};
            CHECK(qd_forward(ctx, &d, 1, row) == QD_OK);
            plain[i] = argmax(row, V);
        }
        if (p->n_ref == N_REF)
            CHECKF(memcmp(plain, p->ref, sizeof p->ref) == 0, "%s: plain greedy differs from transformers' greedy ids",
                   p->name);
        printf("%-28s", p->name);
        for (int k = 1; k <= 4; k++) {
            qd_spec_stats s;
            CHECK(qd_seq_reset(ctx, 1) == QD_OK);
            const qd_spec_greedy_args a = {.model = m, .ctx = ctx, .seq = 1, .prompt = p->ids, .n_prompt = p->n,
                                           .n_new = N_NEW, .k = k};
            const qd_status st = qd_spec_generate_greedy(&a, spec, &s);
            CHECKF(st == QD_OK, "%s k=%d: %s", p->name, k, qd_context_errmsg(ctx));
            CHECKF(memcmp(spec, plain, sizeof plain) == 0, "%s k=%d: speculative greedy differs from plain greedy",
                   p->name, k);
            long at = 0;
            for (int i = 0; i < k; i++) at += s.accepted_at[i];
            CHECKF(s.drafted == s.steps * k && s.accepted == at, "%s k=%d: counters do not add up", p->name, k);
            total[k].steps += s.steps;
            total[k].drafted += s.drafted;
            total[k].accepted += s.accepted;
            for (int i = 0; i < k; i++) total[k].accepted_at[i] += s.accepted_at[i];
            printf("  k=%d %2ld/%2ld", k, s.accepted, s.drafted);
        }
        printf("  (drafts kept)\n");
    }
    printf("acceptance over %d prompts x %d new ids:\n", np, N_NEW);
    for (int k = 1; k <= 4; k++) {
        const qd_spec_stats *t = &total[k];
        printf("  K=%d: %4ld of %4ld drafts kept (%5.1f%%), %.2f ids per verify step; kept at position", k,
               t->accepted, t->drafted, 100.0 * (double)t->accepted / (double)(t->drafted ? t->drafted : 1),
               (double)(t->accepted + t->steps) / (double)(t->steps ? t->steps : 1));
        for (int i = 0; i < k; i++)
            printf(" %d: %5.1f%%", i + 1, 100.0 * (double)t->accepted_at[i] / (double)(t->steps ? t->steps : 1));
        printf("\n");
    }
    const double rate2 = (double)total[2].accepted / (double)(total[2].drafted ? total[2].drafted : 1);
    CHECKF(total[2].drafted > 0 && rate2 >= ACCEPT_FLOOR_K2, "K=2: %.1f%% of drafts kept, below issue 16's %.0f%%",
           100.0 * rate2, 100.0 * ACCEPT_FLOOR_K2);
    printf("K=2 acceptance %.1f%% (issue 16's target: %.0f%%)\n", 100.0 * rate2, 100.0 * ACCEPT_FLOOR_K2);
    free(row);
    qd_context_free(ctx);
    qd_model_free(m);
    return qd_test_finish("test_default_mtp");
}
