/* Snapshot slots (src/model/snap_slots.c) and the prefix cache's two tiers on every
 * backend present: the CPU always, CUDA when a GPU is (the device tier is then GPU
 * memory and its copies are queued on the context's stream). Every check is bit for
 * bit, on states drawn at random (seed in the log), with the target poisoned first:
 *   (a) qd_snap_save then qd_snap_attach into another sequence gives the saved state,
 *       length and blocks; qd_snap_to_host gives exactly qd_seq_state_save's image,
 *       which qd_seq_state_attach restores; a slot refilled right after a restore from
 *       it was queued leaves the restored state intact (the stream keeps the order);
 *       bad slot and sequence indices are refused;
 *   (b) the cache with a device tier of 2 snapshots over a host tier of 3: stores of
 *       12 prefixes move snapshots down and drop some; each one still held restores
 *       its own state from whichever tier holds it, and a dropped one is not found;
 *   (c) after all of it, every KV block is back in the pool.
 * Each also with the model split over two tensor-parallel ranks (the state and the slots
 * are then per rank, the operations fan out). Without a GPU the CUDA part is skipped
 * (the CPU part still runs). */
#include <string.h>

#include "qd_test.h"
#include "qd_test_snap.h"
#include "runtime/prefix_cache.h"
#ifdef QD_HAVE_CUDA
#include "backend/cuda/cuda_gdn.h"
#include "backend/cuda/cuda_device.h"
#endif

static qd_test_rng rng;

#define SEQS 3
#define SLOTS 4

static void slots(qd_context *ctx, const char *be, float **st, size_t n_state, void *img) {
    const int lens[SEQS] = {5, 16, 33}; /* inside a block, a block boundary, past two */
    for (int i = 0; i < SEQS; i++) {
        for (size_t k = 0; k < n_state; k++) st[i][k] = qd_test_uniform(&rng);
        CHECK(qd_test_fake_prefix(ctx, i, lens[i], st[i]) == QD_OK);
        CHECK(qd_snap_save(ctx, i, i) == QD_OK);
    }
    /* every sequence poisoned, then each slot attached into the next sequence */
    for (int i = 0; i < SEQS; i++) {
        qd_test_state_fill(qd_test_next(&rng), st[SEQS], n_state);
        CHECK(qd_test_fake_prefix(ctx, i, 7, st[SEQS]) == QD_OK);
    }
    for (int i = 0; i < SEQS; i++) {
        const int dst = (i + 1) % SEQS;
        /* the blocks to share: held by the spare sequence, as a cache node would hold them */
        CHECK(qd_test_fake_prefix(ctx, SEQS, lens[i], st[SEQS]) == QD_OK);
        int32_t blocks[8];
        const int nb = qd_kv_blocks_for(ctx, lens[i]);
        memcpy(blocks, ctx->seqs[SEQS].blocks, sizeof(int32_t) * (size_t)nb);
        CHECK(qd_snap_attach(ctx, dst, i, lens[i], blocks, nb) == QD_OK);
        CHECKF(qd_test_state_is(ctx, dst, lens[i], st[i], img), "%s: slot %d restored into %d", be, i, dst);
        CHECK(ctx->seqs[dst].n_blocks == nb && !memcmp(ctx->seqs[dst].blocks, blocks, sizeof(int32_t) * (size_t)nb));
        /* the host image of the slot is qd_seq_state_save's image of that state */
        unsigned char *host = malloc(qd_seq_state_size(ctx));
        CHECK(host && qd_snap_to_host(ctx, i, lens[i], host, qd_seq_state_size(ctx)) == QD_OK);
        CHECKF(host && !memcmp(host, img, qd_seq_state_size(ctx)), "%s: slot %d's host image", be, i);
        qd_test_state_fill(qd_test_next(&rng), st[SEQS], n_state);
        CHECK(qd_test_fake_prefix(ctx, dst, 2, st[SEQS]) == QD_OK);
        CHECK(host && qd_seq_state_attach(ctx, dst, host, qd_seq_state_size(ctx), blocks, nb) == QD_OK);
        CHECKF(qd_test_state_is(ctx, dst, lens[i], st[i], img), "%s: slot %d's host image restored", be, i);
        free(host);
    }
    /* restore from slot 3, then refill slot 3 at once: the restore still sees the old state */
    CHECK(qd_test_fake_prefix(ctx, 0, 5, st[0]) == QD_OK && qd_snap_save(ctx, 0, 3) == QD_OK);
    CHECK(qd_test_fake_prefix(ctx, 1, 5, st[1]) == QD_OK);
    int32_t b0 = ctx->seqs[0].blocks[0];
    CHECK(qd_snap_attach(ctx, 2, 3, 5, &b0, 1) == QD_OK && qd_snap_save(ctx, 1, 3) == QD_OK);
    CHECKF(qd_test_state_is(ctx, 2, 5, st[0], img), "%s: a restore queued before its slot was refilled", be);
    CHECK(qd_snap_attach(ctx, 0, 3, 5, &b0, 1) == QD_OK && qd_test_state_is(ctx, 0, 5, st[1], img));
    /* refused */
    CHECK(qd_snap_save(ctx, 0, SLOTS) != QD_OK && qd_snap_save(ctx, SEQS + 1, 0) != QD_OK);
    CHECK(qd_snap_save(ctx, 0, -1) != QD_OK && qd_snap_attach(ctx, 0, 0, 40, &b0, 1) != QD_OK);
}

static uint64_t prefix_seed(const int32_t *t, int n) {
    uint64_t h = 0x243f6a8885a308d3ull;
    for (int i = 0; i < n; i++) h = (h ^ (uint64_t)(uint32_t)t[i]) * 0x100000001b3ull;
    return h;
}

static void tiers(qd_context *ctx, const char *be, float **st, size_t n_state, void *img) {
    const size_t block_bytes = (size_t)qd_model_kv_bytes_per_token(ctx->model) * ctx->kv.block_size;
    enum { N = 12, L = 24 };
    /* two snapshots and every block the stores below can hold (the context has SLOTS slots) */
    qd_prefix_cache_params pp = {.device_bytes = 2 * qd_snap_slot_bytes(ctx) + N * block_bytes,
                                 .host_bytes = 3 * qd_seq_state_size(ctx), .block_bytes = block_bytes};
    qd_prefix_cache *pc = NULL;
    qd_err err = {0};
    CHECKF(qd_prefix_cache_create(ctx, &pp, &pc, &err) == QD_OK, "%s: cache: %s", be, err.msg);
    if (!pc) return;
    int32_t toks[N][L];
    for (int i = 0; i < N; i++) {
        for (int t = 0; t < L; t++) toks[i][t] = (int32_t)(qd_test_next(&rng) % 50);
        toks[i][0] = i; /* distinct prefixes */
        const int n = 3 + i;
        qd_test_state_fill(prefix_seed(toks[i], n), st[0], n_state);
        CHECK(qd_test_fake_prefix(ctx, 0, n, st[0]) == QD_OK);
        CHECK(qd_prefix_cache_store(pc, 0, toks[i], n, 0) == 1);
        int depths[4];
        CHECK(qd_prefix_cache_check(pc, 0, toks[i], n, depths, NULL, 4) >= 0);
    }
    qd_prefix_cache_stats s;
    qd_prefix_cache_get_stats(pc, &s);
    const int held = s.device_snapshots + s.host_snapshots;
    CHECKF(s.device_snapshots >= 2 && s.device_snapshots < SLOTS && s.host_snapshots == 3 && s.spills >= 3 &&
               s.evictions == (uint64_t)(N - held) && s.device_bytes <= pp.device_bytes,
           "%s: %d device + %d host snapshots, %llu spills, %llu dropped", be, s.device_snapshots, s.host_snapshots,
           (unsigned long long)s.spills, (unsigned long long)s.evictions);
    int found = 0;
    for (int i = 0; i < N; i++) {
        const int n = 3 + i;
        qd_prefix_hit hit;
        qd_prefix_cache_lookup(pc, 0, toks[i], L, &hit);
        if (hit.n_tokens == 0) continue;
        found++;
        CHECK(hit.n_tokens == n);
        qd_test_state_fill(qd_test_next(&rng), st[1], n_state);
        CHECK(qd_test_fake_prefix(ctx, 1, 9, st[1]) == QD_OK);
        CHECK(qd_prefix_cache_restore(pc, &hit, 1) == QD_OK);
        qd_test_state_fill(prefix_seed(toks[i], n), st[0], n_state);
        CHECKF(qd_test_state_is(ctx, 1, n, st[0], img), "%s: prefix %d restored from tier %d", be, i, (int)hit.tier);
    }
    CHECKF(found == held, "%s: %d prefixes found, %d held", be, found, held);
    qd_prefix_cache_get_stats(pc, &s);
    CHECK(s.host_restores >= 1);
    printf("  %s: tiers: %d + %d snapshots held, %llu spills, %llu dropped, %llu host restores\n", be, s.device_snapshots,
           s.host_snapshots, (unsigned long long)s.spills, (unsigned long long)s.evictions,
           (unsigned long long)s.host_restores);
    qd_prefix_cache_free(pc);
}

static void run(const char *dir, qd_backend_kind kind, int tp, const char *be) {
    qd_model_params mp = qd_model_default_params();
    mp.path = dir;
    mp.backend = kind;
    mp.n_threads = 2;
    mp.tensor_parallel_size = tp;
    qd_model *m = NULL;
    char e[1024];
    if (qd_model_load(&mp, &m, e, sizeof e) != QD_OK) {
        CHECKF(0, "%s: %s: %s", be, dir, e);
        return;
    }
    qd_context_params cp = qd_context_default_params();
    cp.max_seqs = SEQS + 1;
    cp.max_ctx = 64;
    cp.max_batch = 16;
    cp.kv_block_size = 16;
    cp.n_kv_blocks = 96;
    cp.n_snap_slots = SLOTS;
    qd_context *ctx = NULL;
    CHECKF(qd_context_create(m, &cp, &ctx) == QD_OK, "%s: context: %s", be, qd_model_errmsg(m));
    if (ctx) {
        const size_t n_state = qd_test_state_floats(ctx);
        float *st[SEQS + 1];
        for (int i = 0; i <= SEQS; i++) st[i] = malloc(n_state * sizeof(float));
        void *img = malloc(qd_seq_state_size(ctx));
        slots(ctx, be, st, n_state, img);
        tiers(ctx, be, st, n_state, img);
        for (int i = 0; i <= SEQS; i++) CHECK(qd_seq_reset(ctx, i) == QD_OK);
        CHECKF(qd_kv_free_blocks(ctx) == qd_kv_total_blocks(ctx), "%s: %d of %d KV blocks free at the end", be,
               qd_kv_free_blocks(ctx), qd_kv_total_blocks(ctx));
        for (int i = 0; i <= SEQS; i++) free(st[i]);
        free(img);
        qd_context_free(ctx);
    }
    qd_model_free(m);
}

int main(void) {
    rng = qd_test_rng_from_env();
    const char *dir = "tests/fixtures/qwen3_5_dense_f32";
    run(dir, QD_BACKEND_CPU, 1, "cpu");
    run(dir, QD_BACKEND_CPU, 2, "cpu tp=2"); /* every rank keeps its slice in its own slots */
#ifdef QD_HAVE_CUDA
    if (qd_cuda_device_count() > 0) {
        run(dir, QD_BACKEND_CUDA, 1, "cuda");
        run(dir, QD_BACKEND_CUDA, 2, "cuda tp=2"); /* on one GPU: ranks share it */
    } else {
        printf("test_snap_tier: no CUDA device, CUDA part skipped\n");
    }
#endif
    return qd_test_finish("test_snap_tier");
}
