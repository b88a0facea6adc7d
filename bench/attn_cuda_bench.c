/* Benchmark of the CUDA gated-attention kernels at the Qwen3-Next shape (nq=16,
 * nkv=2, hd=256, rotary 64, gated, bf16 paged cache with 16-position blocks):
 * prefill of one sequence (T = 2048, 8192, 16384) and decode of B rows at
 * context ctx. Times are CUDA-event medians after warm-up, of qd_cuda_attn
 * alone (the prep kernel is timed separately). Prefill TFLOP/s count the
 * causal attention FLOPs 4 * T * T/2 * hd * nq; decode GB/s count the K and V
 * bytes read, B * ctx * nkv * hd * 2 * 2 (contexts of a few MB stay in L2).
 * Batch-invariant mode (args.invariant: every row with the split-K decode
 * kernel's arithmetic, slice plan from max_ctx) beside the normal one: decode
 * of 1 and 32 rows at 4k context and of 1 at 32k, prefills of 4096 and 8192
 * rows; RESULT attn_invariant lines with both times and their ratio. For the
 * prefills also the same rows described as one-row spans, which sends them
 * through the decode kernel instead of the span kernel (the same bits): the
 * invariant mode before the span kernel (decode_path_us). --invariant-only:
 * those alone.
 * Exits 77 without a GPU. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_attn.h"
#include "backend/cuda/cuda_gdn.h"
#include "backend/cuda/cuda_device.h"

#define BENCH_NAME "attn_cuda_bench"
#include "cuda_bench_util.h"

#define NQ 16
#define NKV 2
#define HD 256
#define BS 16


static float *rand_floats(size_t n, float scale) {
    float *x = malloc(n * sizeof *x);
    if (!x) exit(1);
    for (size_t i = 0; i < n; i++) x[i] = scale * urand();
    return x;
}

/* Median milliseconds per call of fn over reps of iters calls. */
typedef qd_status (*attn_fn)(const qd_cuda_attn_args *, void *);
static double time_ms(attn_fn fn, const qd_cuda_attn_args *a, int iters, int reps) {
    for (int i = 0; i < 2; i++) TRY(fn(a, NULL));
    qd_cuda_timer t;
    TRY(qd_cuda_timer_create(&t));
    float ms[15];
    if (reps > 15) reps = 15;
    for (int r = 0; r < reps; r++) {
        TRY(qd_cuda_timer_start(&t));
        for (int i = 0; i < iters; i++) TRY(fn(a, NULL));
        TRY(qd_cuda_timer_stop(&t, &ms[r]));
    }
    qd_cuda_timer_destroy(&t);
    return median(ms, reps) / iters;
}

/* B sequences (slots 0..B-1) of ctx positions each; rows: T per sequence at
 * positions ctx-T..ctx-1. Block ids shuffled. Fills *a and returns the buffers
 * to free in bufs[]. */
static int setup(qd_cuda_attn_args *a, int B, int T, int ctx, void **bufs) {
    const int n_rows = B * T, mbps = (ctx + BS - 1) / BS, n_blocks = B * mbps;
    const int64_t stride = (int64_t)BS * NKV * HD;
    int32_t *table = malloc(sizeof(int32_t) * n_blocks), *spans = malloc(sizeof(int32_t) * 4 * B);
    int32_t *rs = malloc(sizeof(int32_t) * n_rows), *rp = malloc(sizeof(int32_t) * n_rows);
    if (!table || !spans || !rs || !rp) exit(1);
    for (int i = 0; i < n_blocks; i++) table[i] = i;
    for (int i = n_blocks - 1; i > 0; i--) {
        const int j = (int)((urand() + 1.0f) * 0.5f * (float)(i + 1)) % (i + 1);
        const int t = table[i]; table[i] = table[j]; table[j] = t;
    }
    for (int b = 0; b < B; b++) {
        spans[4 * b] = b * T; spans[4 * b + 1] = T; spans[4 * b + 2] = ctx - T; spans[4 * b + 3] = b;
        for (int t = 0; t < T; t++) {
            rs[b * T + t] = b;
            rp[b * T + t] = ctx - T + t;
        }
    }
    float *qg = rand_floats((size_t)n_rows * NQ * 2 * HD, 2.0f), *kv = rand_floats((size_t)n_rows * NKV * HD, 2.0f);
    float *nw = rand_floats(HD, 0.2f);
    const size_t cache_bytes = (size_t)n_blocks * stride * 2;
    int n = 0;
    memset(a, 0, sizeof *a);
    a->n_rows = n_rows; a->nq = NQ; a->nkv = NKV; a->hd = HD; a->rope_dim = 64; a->rope_theta = 1e7f;
    a->eps = 1e-6f; a->gated = 1;
    a->d_qg = bufs[n++] = upload(qg, sizeof(float) * n_rows * NQ * 2 * HD);
    a->d_k = bufs[n++] = upload(kv, sizeof(float) * n_rows * NKV * HD);
    a->d_v = bufs[n++] = upload(kv, sizeof(float) * n_rows * NKV * HD);
    a->d_q_norm = a->d_k_norm = bufs[n++] = upload(nw, sizeof(float) * HD);
    a->d_row_slot = bufs[n++] = upload(rs, sizeof(int32_t) * n_rows);
    a->d_row_pos = bufs[n++] = upload(rp, sizeof(int32_t) * n_rows);
    a->d_spans = bufs[n++] = upload(spans, sizeof(int32_t) * 4 * B);
    a->n_spans = B; a->max_span_rows = T; a->max_ctx = ctx;
    a->d_block_tables = bufs[n++] = upload(table, sizeof(int32_t) * n_blocks);
    a->max_blocks_per_seq = mbps; a->block_size = BS; a->block_stride = stride;
    a->d_kcache = bufs[n++] = upload(NULL, cache_bytes);
    a->d_vcache = bufs[n++] = upload(NULL, cache_bytes);
    /* earlier context: small bf16 values (0x3c3c ~ 0.0115); the prep below writes the new rows */
    TRY(qd_cuda_memset(a->d_kcache, 0x3c, cache_bytes));
    TRY(qd_cuda_memset(a->d_vcache, 0x3c, cache_bytes));
    a->d_q = bufs[n++] = upload(NULL, (size_t)n_rows * NQ * HD * 2);
    a->d_out = bufs[n++] = upload(NULL, (size_t)n_rows * NQ * HD * 2);
    /* scratch for either mode, so that one setup times both */
    const size_t wb0 = qd_cuda_attn_work_bytes(n_rows, NQ, HD, ctx, 0);
    const size_t wb1 = qd_cuda_attn_work_bytes(n_rows, NQ, HD, ctx, 1);
    const size_t wb = wb0 > wb1 ? wb0 : wb1;
    a->d_work = bufs[n++] = upload(NULL, wb ? wb : 4);
    free(table); free(spans); free(rs); free(rp); free(qg); free(kv); free(nw);
    TRY(qd_cuda_attn_prep(a, NULL));
    TRY(qd_cuda_sync());
    return n;
}

static void bench_prefill(int T) {
    qd_cuda_attn_args a;
    void *bufs[16];
    const int n = setup(&a, 1, T, T, bufs);
    const double prep = time_ms(qd_cuda_attn_prep, &a, 5, 7);
    const double ms = time_ms(qd_cuda_attn, &a, T >= 8192 ? 3 : 10, 9);
    const double flops = 4.0 * T * (T / 2.0) * HD * NQ;
    printf("RESULT attn_prefill T=%d ms=%.3f tflops=%.1f prep_ms=%.3f\n", T, ms, flops / (ms * 1e-3) / 1e12, prep);
    for (int i = 0; i < n; i++) qd_cuda_free(bufs[i]);
}

static void bench_decode(int B, int ctx) {
    qd_cuda_attn_args a;
    void *bufs[16];
    const int n = setup(&a, B, 1, ctx, bufs);
    const double ms = time_ms(qd_cuda_attn, &a, 20, 7);
    const double bytes = (double)B * ctx * NKV * HD * 2 * 2;
    printf("RESULT attn_decode B=%d ctx=%d us=%.2f GBps=%.0f\n", B, ctx, ms * 1e3, bytes / (ms * 1e-3) / 1e9);
    for (int i = 0; i < n; i++) qd_cuda_free(bufs[i]);
}

/* Normal against invariant mode: B sequences of T rows each ending at ctx. */
static void bench_invariant(const char *what, int B, int T, int ctx, int iters, int reps) {
    qd_cuda_attn_args a;
    void *bufs[16];
    const int n = setup(&a, B, T, ctx, bufs);
    a.invariant = 0;
    const double ms0 = time_ms(qd_cuda_attn, &a, iters, reps);
    a.invariant = 1;
    const double ms1 = time_ms(qd_cuda_attn, &a, iters, reps);
    double ms2 = 0;
    if (T > QD_CUDA_ATTN_INV_SPAN_ROWS) {
        /* every row a span of its own: the decode kernel */
        int32_t *sp1 = malloc(sizeof(int32_t) * 4 * B * T);
        if (!sp1) exit(1);
        for (int r = 0; r < B * T; r++) {
            sp1[4 * r] = r; sp1[4 * r + 1] = 1; sp1[4 * r + 2] = ctx - T + r % T; sp1[4 * r + 3] = r / T;
        }
        qd_cuda_attn_args a1 = a;
        a1.d_spans = upload(sp1, sizeof(int32_t) * 4 * B * T);
        a1.n_spans = B * T;
        a1.max_span_rows = 1;
        ms2 = time_ms(qd_cuda_attn, &a1, iters, reps);
        qd_cuda_free((void *)a1.d_spans);
        free(sp1);
    }
    printf("RESULT attn_invariant %s B=%d T=%d ctx=%d normal_us=%.2f invariant_us=%.2f ratio=%.2f", what, B, T, ctx,
           ms0 * 1e3, ms1 * 1e3, ms1 / ms0);
    if (ms2 > 0) printf(" decode_path_us=%.2f decode_path_ratio=%.2f", ms2 * 1e3, ms2 / ms0);
    printf("\n");
    for (int i = 0; i < n; i++) qd_cuda_free(bufs[i]);
}

static void bench_invariant_all(void) {
    bench_invariant("decode", 1, 1, 4096, 20, 7);
    bench_invariant("decode", 32, 1, 4096, 20, 7);
    bench_invariant("decode", 1, 1, 32768, 20, 7);
    bench_invariant("prefill", 1, 4096, 4096, 3, 5);
    bench_invariant("prefill", 1, 8192, 8192, 2, 3);
}

int main(int argc, char **argv) {
    /* --prefill-only: the T=8192 prefill alone, e.g. under a profiler */
    const int prefill_only = argc > 1 && strcmp(argv[1], "--prefill-only") == 0;
    const int invariant_only = argc > 1 && strcmp(argv[1], "--invariant-only") == 0;
    if (qd_cuda_device_count() <= 0) {
        printf("attn_cuda_bench: skipped: no CUDA device\n");
        return 77;
    }
    char name[128];
    int sms = 0;
    TRY(qd_cuda_device_info(name, sizeof name, &sms));
    printf("device: %s, %d SMs; nq=%d nkv=%d hd=%d block=%d\n", name, sms, NQ, NKV, HD, BS);
    if (prefill_only) {
        bench_prefill(8192);
        return 0;
    }
    if (invariant_only) {
        bench_invariant_all();
        return 0;
    }
    const int Ts[3] = {2048, 8192, 16384};
    for (int i = 0; i < 3; i++) bench_prefill(Ts[i]);
    const int Bs[3] = {1, 32, 128}, ctxs[2] = {4096, 32768};
    for (int i = 0; i < 3; i++)
        for (int j = 0; j < 2; j++) bench_decode(Bs[i], ctxs[j]);
    bench_invariant_all();
    return 0;
}
