/* Benchmark of the CUDA GDN kernels at the shapes of issue 4 (HK=16, HV=32,
 * dk=dv=128): chunked prefill at 1x8192, 1x32768, 8x4096 and decode at
 * B = 1, 32, 128, 512, plus a device-to-device copy for the bandwidth
 * ceiling, all in one process. Times are CUDA-event medians over repeats,
 * after warm-up. Decode rotates over a state pool larger than L2 so that
 * every call reads its states from memory, as one layer of a real decode
 * step would; each decode size is timed as plain launches, replayed from a
 * CUDA graph (how a decode step runs it, and how a peer's kernel is timed)
 * and from a graph with programmatic dependent launches (how the model
 * launches it). Chunked parts: wy (the parallel kernel) and state (the walk,
 * which also writes the outputs), the walk also with each block shape forced.
 * Prints one line per measurement ("key value" pairs); exits 77 without a
 * GPU. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_gdn.h"
#include "backend/cuda/cuda_device.h"

#define BENCH_NAME "gdn_cuda_bench"
#include "cuda_bench_util.h"

#define HK 16
#define HV 32
#define DK 128
#define DV 128



/* n_vec vectors of length dim, unit L2 norm times scale, as bf16. */
static uint16_t *unit_rows(size_t n_vec, int dim, float scale) {
    uint16_t *b = malloc(n_vec * dim * 2);
    float *x = malloc((size_t)dim * 4);
    if (!b || !x) exit(1);
    for (size_t r = 0; r < n_vec; r++) {
        double ss = 0;
        for (int i = 0; i < dim; i++) {
            x[i] = urand();
            ss += (double)x[i] * x[i];
        }
        const float f = (float)(scale / sqrt(ss + 1e-6));
        for (int i = 0; i < dim; i++) b[r * dim + i] = qd_f32_to_bf16(x[i] * f);
    }
    free(x);
    return b;
}
static float *gates(size_t n, int is_beta) {
    float *g = malloc(n * 4);
    if (!g) exit(1);
    for (size_t i = 0; i < n; i++) g[i] = is_beta ? 0.5f + 0.45f * urand() : -0.05f - 0.5f * (urand() + 1.0f);
    return g;
}



/* Decode launch i of a graph: the arguments with state i % nrot of the pool. */
typedef struct decode_call {
    qd_cuda_gdn_decode_args a;
    float *dS;
    size_t per_state;
    int nrot;
    void *stream;
} decode_call;

static qd_status decode_launch(void *ctx, int i) {
    decode_call *c = ctx;
    c->a.d_state = c->dS + (size_t)(i % c->nrot) * c->per_state;
    return qd_cuda_gdn_decode(&c->a, c->stream);
}

static void bench_decode(int B, double copy_gbs) {
    const size_t per = (size_t)HV * DK * DV; /* floats per sequence state */
    /* Enough distinct states to exceed L2 (60 MB) by a wide margin. */
    const size_t min_states = (size_t)(512u << 20) / (per * 4);
    const int nrot = B >= (int)min_states ? 1 : (int)((min_states + B - 1) / B);
    const size_t nst = (size_t)nrot * B * per;
    uint16_t *q = unit_rows((size_t)B * HK, DK, 1.0f / sqrtf((float)DK)), *k = unit_rows((size_t)B * HK, DK, 1.0f);
    uint16_t *v = unit_rows((size_t)B * HV, DV, 8.0f);
    float *g = gates((size_t)B * HV, 0), *beta = gates((size_t)B * HV, 1);
    float *S = malloc(nst * 4);
    if (!S) exit(1);
    for (size_t i = 0; i < nst; i++) S[i] = 0.1f * urand();
    uint16_t *dq = upload(q, (size_t)B * HK * DK * 2), *dk = upload(k, (size_t)B * HK * DK * 2);
    uint16_t *dv = upload(v, (size_t)B * HV * DV * 2), *dO = upload(NULL, (size_t)B * HV * DV * 2);
    float *dg = upload(g, (size_t)B * HV * 4), *db = upload(beta, (size_t)B * HV * 4), *dS = upload(S, nst * 4);
    qd_cuda_gdn_decode_args a = {HK, HV, DK, DV, B, dq, dk, dv, dg, db, dS, NULL, NULL, dO, NULL, 0, 0, NULL, 0};
    const int iters = 200;
    for (int i = 0; i < 20; i++) {
        a.d_state = dS + (size_t)(i % nrot) * B * per;
        TRY(qd_cuda_gdn_decode(&a, NULL));
    }
    qd_cuda_timer t;
    TRY(qd_cuda_timer_create(&t));
    float ms[7];
    for (int r = 0; r < 7; r++) {
        TRY(qd_cuda_timer_start(&t));
        for (int i = 0; i < iters; i++) {
            a.d_state = dS + (size_t)(i % nrot) * B * per;
            TRY(qd_cuda_gdn_decode(&a, NULL));
        }
        TRY(qd_cuda_timer_stop(&t, &ms[r]));
    }
    qd_cuda_timer_destroy(&t);
    const double us = median(ms, 7) * 1e3 / iters;
    const double bytes = 2.0 * B * per * 4; /* state read + written */
    const double gbs = bytes / (us * 1e-6) / 1e9;
    /* graph: the launches replayed from a CUDA graph, as a decode step runs them (and as a
     * peer's kernel is timed); graph_pdl: each launch also a programmatic dependent of the one
     * before, as the model launches it (its state loads overlap the previous kernel's tail) */
    decode_call dc = {a, dS, B * per, nrot, NULL};
    TRY(qd_cuda_stream_create(&dc.stream));
    const double ug = bench_graph_us(dc.stream, decode_launch, &dc, 200);
    dc.a.early_state = 1;
    const double ugp = bench_graph_us(dc.stream, decode_launch, &dc, 200);
    qd_cuda_stream_destroy(dc.stream);
    printf("RESULT decode B=%d us=%.2f state_GBps=%.0f pct_copy=%.1f graph_us=%.2f graph_pdl_us=%.2f\n", B, us, gbs,
           100.0 * gbs / copy_gbs, ug, ugp);
    qd_cuda_free(dq); qd_cuda_free(dk); qd_cuda_free(dv); qd_cuda_free(dO);
    qd_cuda_free(dg); qd_cuda_free(db); qd_cuda_free(dS);
    free(q); free(k); free(v); free(g); free(beta); free(S);
}

static void bench_chunked(int B, int T) {
    const size_t N = (size_t)B * T;
    int32_t *cu = malloc(sizeof(int32_t) * (B + 1));
    if (!cu) exit(1);
    for (int b = 0; b <= B; b++) cu[b] = b * T;
    uint16_t *q = unit_rows(N * HK, DK, 1.0f / sqrtf((float)DK)), *k = unit_rows(N * HK, DK, 1.0f);
    uint16_t *v = unit_rows(N * HV, DV, 8.0f);
    float *g = gates(N * HV, 0), *beta = gates(N * HV, 1);
    uint16_t *dq = upload(q, N * HK * DK * 2), *dk = upload(k, N * HK * DK * 2), *dv = upload(v, N * HV * DV * 2);
    float *dg = upload(g, N * HV * 4), *db = upload(beta, N * HV * 4);
    const size_t nst = (size_t)B * HV * DK * DV;
    float *dS0 = upload(NULL, nst * 4), *dS1 = upload(NULL, nst * 4);
    TRY(qd_cuda_memset(dS0, 0, nst * 4));
    uint16_t *dO = upload(NULL, N * HV * DV * 2);
    qd_cuda_gdn_plan plan;
    TRY(qd_cuda_gdn_plan_create(&plan, HK, HV, DK, DV, cu, B));
    qd_cuda_gdn_chunked_args a = {dq, dk, dv, HK * DK, HK * DK, HV * DV, dg, db, dS0, dS1, NULL, dO, 0};
    qd_cuda_timer t;
    TRY(qd_cuda_timer_create(&t));
    /* The walk (mask 2) also writes the outputs: there is no separate output pass. */
    const int masks[3] = {7, 1, 2};
    const char *names[3] = {"total", "wy", "state"};
    double total = 0;
    for (int m = 0; m < 3; m++) {
        for (int i = 0; i < 3; i++) TRY(qd_cuda_gdn_chunked_stages(&plan, &a, NULL, masks[m]));
        float ms[15];
        for (int r = 0; r < 15; r++) {
            TRY(qd_cuda_timer_start(&t));
            TRY(qd_cuda_gdn_chunked_stages(&plan, &a, NULL, masks[m]));
            TRY(qd_cuda_timer_stop(&t, &ms[r]));
        }
        const double med = median(ms, 15);
        if (m == 0) total = med;
        printf("RESULT chunked B=%d T=%d part=%s ms=%.4f\n", B, T, names[m], med);
    }
    printf("RESULT chunked B=%d T=%d Mtok_per_s=%.1f scratch_MiB=%.0f walk_tiles=%d\n", B, T,
           N / (total * 1e-3) / 1e6, plan.bytes / 1048576.0, qd_cuda_gdn_walk_tiles(&plan));
    /* the walk with each block shape forced (the table's row for this batch) */
    for (int f = 2; f <= 8; f *= 2) {
        qd_cuda_gdn_chunked_args b = a;
        b.walk_tiles = f;
        float ms[15];
        for (int r = 0; r < 15; r++) {
            TRY(qd_cuda_timer_start(&t));
            TRY(qd_cuda_gdn_chunked_stages(&plan, &b, NULL, 2));
            TRY(qd_cuda_timer_stop(&t, &ms[r]));
        }
        printf("RESULT chunked B=%d T=%d part=state_tiles%d ms=%.4f\n", B, T, f, median(ms, 15));
    }
    qd_cuda_timer_destroy(&t);
    qd_cuda_gdn_plan_destroy(&plan);
    qd_cuda_free(dq); qd_cuda_free(dk); qd_cuda_free(dv); qd_cuda_free(dg); qd_cuda_free(db);
    qd_cuda_free(dS0); qd_cuda_free(dS1); qd_cuda_free(dO);
    free(q); free(k); free(v); free(g); free(beta); free(cu);
}

int main(int argc, char **argv) {
    /* --chunked-only: one chunked shape (1x8192), e.g. under a profiler;
     * --chunked: all chunked shapes, no decode */
    const int chunked_only = argc > 1 && strcmp(argv[1], "--chunked-only") == 0;
    if (qd_cuda_device_count() <= 0) {
        printf("gdn_cuda_bench: skipped: no CUDA device\n");
        return 77;
    }
    char name[128];
    int sms = 0;
    TRY(qd_cuda_device_info(name, sizeof name, &sms));
    printf("device: %s, %d SMs; HK=%d HV=%d dk=%d dv=%d\n", name, sms, HK, HV, DK, DV);
    if (chunked_only) {
        bench_chunked(1, 8192);
        return 0;
    }
    const double bw = copy_bw();
    printf("RESULT copy_GBps=%.0f\n", bw);
    const int Bs[4] = {1, 32, 128, 512};
    if (!(argc > 1 && strcmp(argv[1], "--chunked") == 0))
        for (int i = 0; i < 4; i++) bench_decode(Bs[i], bw);
    bench_chunked(1, 8192);
    bench_chunked(1, 32768);
    bench_chunked(8, 4096);
    return 0;
}
