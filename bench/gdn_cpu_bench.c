/* Throughput of the CPU GDN kernels at Qwen3-Next geometry (hk=16, hv=32,
 * dk=dv=128). Not part of the build; compile against the library:
 *   cc -O3 -march=native -std=c11 -D_GNU_SOURCE -Isrc -Iinclude bench/gdn_cpu_bench.c \
 *      build/libqdelta.a -lm -lpthread -o /tmp/gdn_bench
 * usage: gdn_bench [T=4096] [threads=1] [reps=3] [kind: both|rec|chunk] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend/cpu/cpu_ops.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
    const int T = argc > 1 ? atoi(argv[1]) : 4096;
    const int th = argc > 2 ? atoi(argv[2]) : 1;
    const int reps = argc > 3 ? atoi(argv[3]) : 3;
    const char *kind = argc > 4 ? argv[4] : "both";
    const qd_gdn_dims d = {16, 32, 128, 128};
    const size_t nq = (size_t)T * 16 * 128, nv = (size_t)T * 32 * 128, ns = (size_t)32 * 128 * 128;
    float *q = malloc(nq * 4), *k = malloc(nq * 4), *v = malloc(nv * 4), *o = malloc(nv * 4);
    float *g = malloc((size_t)T * 32 * 4), *beta = malloc((size_t)T * 32 * 4), *S = malloc(ns * 4);
    if (!q || !k || !v || !o || !g || !beta || !S) return 1;
    srand(1);
    /* unit-norm-ish q/k rows (scale 1/sqrt(128)), moderate decays */
    for (size_t i = 0; i < nq; i++) {
        q[i] = ((float)rand() / RAND_MAX - 0.5f) * 0.15f;
        k[i] = ((float)rand() / RAND_MAX - 0.5f) * 0.15f;
    }
    for (size_t i = 0; i < nv; i++) v[i] = (float)rand() / RAND_MAX - 0.5f;
    for (int i = 0; i < T * 32; i++) {
        g[i] = -0.5f * (float)rand() / RAND_MAX;
        beta[i] = (float)rand() / RAND_MAX;
    }
    memset(o, 0, nv * 4);
    qd_threadpool *pool = th > 1 ? qd_threadpool_create(th) : NULL;
    for (int kd = 0; kd < 2; kd++) {
        if ((kd == 0 && !strcmp(kind, "chunk")) || (kd == 1 && !strcmp(kind, "rec"))) continue;
        double best = 1e30, best_cpu = 1e30;
        for (int r = 0; r < reps; r++) {
            memset(S, 0, ns * 4);
            qd_gdn_span s = {q, 16 * 128, k, 16 * 128, v, 32 * 128, g, beta, S, o, T};
            const double t0 = now_s();
            const clock_t c0 = clock();
            if (kd) qd_cpu_gdn_chunked(pool, d, &s);
            else qd_cpu_gdn_recurrent(pool, d, &s);
            const double dt = now_s() - t0, cpu = (double)(clock() - c0) / CLOCKS_PER_SEC;
            if (dt < best) best = dt;
            if (cpu < best_cpu) best_cpu = cpu; /* all threads; steadier than wall on a loaded machine */
        }
        printf("%-9s T=%d threads=%d: best of %d %.3f s wall (%.3f s cpu), %.0f tokens/s\n",
               kd ? "chunked" : "recurrent", T, th, reps, best, best_cpu, T / best);
    }
    qd_threadpool_free(pool);
    free(q); free(k); free(v); free(o); free(g); free(beta); free(S);
    return 0;
}
