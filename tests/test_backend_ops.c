/* One op-conformance test (in the manner of ggml's test-backend-ops): a table of
 * ops, each with awkward shape cases, a generator of fresh random inputs, a naive
 * double-precision reference written plainly here, and one runner per backend.
 * For every (op, case) the inputs are drawn from a seed made of a fixed base (or
 * QD_TEST_SEED) and the row and case indices, then
 *   cpu:  the CPU backend op (the project's reference) against the naive reference,
 *         with fp32 tolerances;
 *   cuda: when built with CUDA and a device is present, the CUDA launcher against the
 *         CPU backend op's output on the same inputs, with bf16 tolerances.
 * Tensors a GPU kernel reads as bf16 are drawn bf16-representable, so every backend
 * sees the same values and a difference is the backend's own arithmetic. Outputs are
 * poisoned (NaN) before each run and every element is checked. Where a CUDA kernel
 * fuses several ops (the GDN inputs, attention prep, the fused linear), its row's CPU
 * runner is the composition of the CPU ops.
 *
 * Adding an op = a row in one of tests/backend_ops/ops_*.c (a make, a naive reference,
 * runners, backend_ops.h) and its place in OPS below; adding a backend = one entry of
 * BACKENDS and a runner slot per row. The per-op tests stay:
 * they check more (invariance, graphs, paging corners); this one checks that every
 * backend computes every op, on the same footing.
 *
 * One line per (op, backend, case): the shape, the largest error, the per-element limit
 * at |ref| = rms(ref), the worst error as a fraction of its own limit, the relative L2
 * error; then `test_backend_ops: N passed, N failed`. A failure names the case's seed
 * and the QD_TEST_SEED that replays it.
 *
 * CUDA ops without a row (no CPU backend counterpart): embedding, dummy weights,
 * f32->bf16, add_f32, sigmoid_scale, argmax/logprob (the CPU's is inside the forward),
 * moe_localize and the fused MoE block (its reference has to follow the GPU's own
 * routing: test_cuda_fused).
 *
 * Usage: test_backend_ops [op-name-substring]. */
#include "backend_ops/backend_ops.h"

/* The rows in a fixed order: a case's seed derives from its row's index here. */
static const op_row *const OPS[] = {
    &OP_MATMUL,
    &OP_MATMUL_FIXED_ORDER,
    &OP_MATMUL_XF32,
    &OP_RMSNORM,
    &OP_ADD_RMSNORM,
    &OP_GATED_RMSNORM,
    &OP_CONV1D_SILU,
    &OP_L2NORM_HEADS,
    &OP_GDN_GATES,
    &OP_GDN_INPUTS,
    &OP_ROPE_NEOX,
    &OP_SILU_MUL,
    &OP_GDN_RECURRENT,
    &OP_GDN_RECURRENT_MULTI,
    &OP_GDN_CHUNKED,
    &OP_ATTENTION,
    &OP_ATTN_BLOCK,
    &OP_MOE_ROUTE,
    &OP_MOE_EXPERTS,
    &OP_LINEAR,
};

/* ============================================================== the driver ===== */

typedef struct backend {
    const char *name;
    int present;
} backend;
static backend BACKENDS[N_BACKENDS] = {{"cpu", 1}, {"cuda", 0}};

static int n_pass, n_fail, n_skip;
static uint64_t seed_base; /* QD_TEST_SEED, or a fixed default: every case's seed derives from it */

static void describe(const op_case *c, char *buf, size_t sz) {
    size_t o = 0;
#define DF(f)                                                                              \
    if (c->f && o < sz) o += (size_t)snprintf(buf + o, sz - o, "%s=%d ", #f, c->f);
    DF(n) DF(rows) DF(cols) DF(heads) DF(kv_heads) DF(dim) DF(dim2) DF(K) DF(mode)
#undef DF
    if (c->n_spans && o < sz) {
        o += (size_t)snprintf(buf + o, sz - o, "spans=");
        for (int s = 0; s < c->n_spans && o < sz; s++)
            o += (size_t)snprintf(buf + o, sz - o, c->pos[s] ? "%s%d@%d" : "%s%d", s ? "," : "", c->lens[s], c->pos[s]);
    }
    if (o && o < sz && buf[o - 1] == ' ') buf[o - 1] = 0;
}

/* Compares got with ref under t; prints the line; counts. */
static void judge(const op_row *row, int bk, int ci, const char *desc, uint64_t seed, const float *got,
                  const double *ref, size_t n) {
    const tol t = row->tol[bk];
    double ss = 0, mx = 0;
    for (size_t i = 0; i < n; i++) {
        ss += ref[i] * ref[i];
        mx = fmax(mx, fabs(ref[i]));
    }
    const double rms = n ? sqrt(ss / (double)n) : 0;
    const double base = t.atol + t.arms * rms + t.amax * mx;
    double maxe = 0, worst = 0, se = 0;
    size_t bad = 0, first = 0;
    for (size_t i = 0; i < n; i++) {
        const double e = fabs((double)got[i] - ref[i]), lim = base + t.rtol * fabs(ref[i]);
        if (!(e <= lim)) { /* NaN: unwritten or broken */
            if (!bad) first = i;
            bad++;
        }
        if (isfinite(e)) {
            maxe = fmax(maxe, e);
            se += e * e;
            if (lim > 0) worst = fmax(worst, e / lim);
        }
    }
    const double l2 = ss > 0 ? sqrt(se / ss) : sqrt(se);
    const int ok = bad == 0 && (t.l2 <= 0 || l2 <= t.l2);
    printf("  %-20s %-4s %2d  %-58s max_err=%.2e limit=%.2e (worst %.2f of it) l2=%.1e%s %s\n", row->name,
           BACKENDS[bk].name, ci, desc, maxe, base + t.rtol * (rms > 0 ? rms : 0), worst, l2,
           t.l2 > 0 ? (l2 <= t.l2 ? "" : " (over l2 limit)") : "", ok ? "ok" : "FAIL");
    if (ok) {
        n_pass++;
    } else {
        n_fail++;
            fprintf(stderr, "FAIL %s/%s case %d (%s): %zu of %zu elements off, first %zu: got %g want %g; case seed "
                        "0x%016llx (replay: QD_TEST_SEED=0x%016llx test_backend_ops %s)\n",
                row->name, BACKENDS[bk].name, ci, desc, bad, n, first, bad ? got[first] : 0.0, bad ? ref[first] : 0.0,
                (unsigned long long)seed, (unsigned long long)seed_base, row->name);
    }
}

static uint64_t splitmix(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

static void run_case(const op_row *row, int ri, int ci) {
    const op_case *c = &row->cases[ci];
    /* fresh inputs per (row, case), reproducible from the base */
    const uint64_t seed = seed_base ^ ((uint64_t)(ri + 1) << 32) ^ (uint64_t)(ci + 1);
    qd_test_rng rng = {splitmix(seed) | 1};
    op_data d;
    memset(&d, 0, sizeof d);
    d.c = c;
    row->make(&d, &rng);
    char desc[160] = "";
    describe(c, desc, sizeof desc);
    double *ref = xmalloc(sizeof(double) * d.n_out);
    row->naive(&d, ref);
    float *cpu = nan_floats(d.n_out);
    for (int bk = 0; bk < N_BACKENDS; bk++) {
        if (!BACKENDS[bk].present || !row->run[bk]) continue;
        float *got = bk == BK_CPU ? cpu : nan_floats(d.n_out);
        const int st = row->run[bk](&d, got);
        if (st == OP_SKIP) {
            printf("  %-20s %-4s %2d  %-58s skipped (shape or dtype not taken)\n", row->name, BACKENDS[bk].name, ci, desc);
            n_skip++;
        } else if (st != OP_OK) {
            printf("  %-20s %-4s %2d  %-58s FAIL (launch)\n", row->name, BACKENDS[bk].name, ci, desc);
            fprintf(stderr, "FAIL %s/%s case %d: the runner failed; case seed 0x%016llx (QD_TEST_SEED=0x%016llx)\n",
                    row->name, BACKENDS[bk].name, ci, (unsigned long long)seed, (unsigned long long)seed_base);
            n_fail++;
        } else if (bk == BK_CPU) {
            judge(row, bk, ci, desc, seed, got, ref, d.n_out);
        } else {
            /* other backends against the CPU backend's output: the project's reference */
            double *cref = xmalloc(sizeof(double) * d.n_out);
            for (size_t i = 0; i < d.n_out; i++) cref[i] = cpu[i];
            judge(row, bk, ci, desc, seed, got, cref, d.n_out);
            free(cref);
        }
        if (got != cpu) free(got);
    }
    free(cpu);
    free(ref);
    free_data(&d);
}

int main(int argc, char **argv) {
    const char *filter = argc > 1 ? argv[1] : NULL;
    const char *e = getenv("QD_TEST_SEED");
    seed_base = e ? strtoull(e, NULL, 0) : 0x0b5e55edc0ffee11ull;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    g_pool = qd_threadpool_create(0);
#ifdef QD_HAVE_CUDA
    if (qd_cuda_device_count() > 0) {
        BACKENDS[BK_CUDA].present = qd_cuda_blas_create(&g_blas, NULL) == QD_OK;
        if (!BACKENDS[BK_CUDA].present) {
            fprintf(stderr, "cuda: cuBLAS handle failed: %s\n", qd_cuda_last_error());
            n_fail++;
        }
    } else {
        printf("cuda backend skipped: no CUDA device\n");
    }
#else
    printf("cuda backend skipped: built without CUDA\n");
#endif
    const int n_ops = NCASES(OPS);
    printf("ops: %d, backends:", n_ops);
    for (int b = 0; b < N_BACKENDS; b++)
        if (BACKENDS[b].present) printf(" %s", BACKENDS[b].name);
    printf(", seed base 0x%016llx\n", (unsigned long long)seed_base);
    for (int r = 0; r < n_ops; r++) {
        if (filter && !strstr(OPS[r]->name, filter)) continue;
        for (int ci = 0; ci < OPS[r]->n_cases; ci++) run_case(OPS[r], r, ci);
    }
#ifdef QD_HAVE_CUDA
    if (g_blas) qd_cuda_blas_destroy(g_blas);
#endif
    qd_threadpool_free(g_pool);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    printf("(%d skipped, %.1f s)\n", n_skip, (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec));
    /* the shared CHECK helpers (qd_test_cuda.h) count their own failures */
    n_fail += qd_test_failed;
    printf("test_backend_ops: %d passed, %d failed\n", n_pass, n_fail);
    return n_fail ? 1 : 0;
}
