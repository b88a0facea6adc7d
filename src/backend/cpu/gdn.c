/* Gated DeltaNet delta rule on the CPU: the token-by-token recurrence (decode,
 * and the reference for everything else) and the chunked WY form (prefill).
 *
 * Per value head h with key head j = h / (hv/hk), state S [dk][dv]:
 *   S = exp(g) S;  m = S^T k;  d = beta (v - m);  S += k d^T;  o = S^T q.
 *
 * Both kernels parallelise over value heads: every head's state is independent.
 * All arithmetic is fp32. Hot loops work on register tiles of 16 contiguous
 * dv (or chunk) columns, written with vector extensions (see v8 below).
 * The chunked kernel computes Vnew by forward substitution on the right-hand
 * side instead of forming T = (I+L)^-1 and W (see gdn_chunk). */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#if defined(__FMA__) && defined(__AVX__)
#include <immintrin.h>
#endif

#include "backend/cpu/cpu_ops.h"
#include "qdelta.h"

#define GDN_CHUNK 64 /* chunk length C of the WY form (spec 4.1) */
/* batch-invariant mode starts prompt pieces on chunk boundaries */
_Static_assert(GDN_CHUNK == QD_INVARIANT_ALIGN, "the invariant alignment must be the GDN chunk");
#define GDN_VT 16    /* dv columns per register tile (two AVX2 vectors) */
#define GDN_RECUR_MAXDK 256 /* largest dk whose recurrent tile is copied (16 KiB of stack) */
#define GDN_RECUR_TB 64     /* tokens per block of the recurrence */

/* Explicit fused multiply-add: the build is ISO C11, where GCC does not
 * contract a*b+c by itself, and the fmaf form is also what lets GCC vectorise
 * the register-tile accumulations below (with a*b+c it fell back to scalar
 * code). Without hardware FMA, fmaf would be a slow library call, so the plain
 * expression is used there. */
#if defined(__FMA__) || defined(__aarch64__) || defined(__ARM_FEATURE_FMA)
#define FMA(a, b, c) fmaf((a), (b), (c))
#else
#define FMA(a, b, c) ((a) * (b) + (c))
#endif

/* Register tiles use GCC/Clang vector extensions: with plain loops GCC 12
 * vectorised the 4x16 GEMM tile over the wrong loop and spilled every
 * accumulator to the stack. A v8 lowers to one AVX register, to two SSE/NEON
 * registers, or to scalars, so this stays portable. */
typedef float v8 __attribute__((vector_size(32)));
#if defined(__GNUC__) && !defined(__clang__) && !defined(__AVX__)
/* Without AVX GCC warns that passing v8 by value has a different ABI; these
 * helpers are static and inlined, so no ABI boundary is crossed. */
#pragma GCC diagnostic ignored "-Wpsabi"
#endif
static inline v8 ld8(const float *p) { v8 r; memcpy(&r, p, sizeof r); return r; }
static inline void st8(float *p, v8 x) { memcpy(p, &x, sizeof x); }
static inline v8 splat8(float x) { return (v8){x, x, x, x, x, x, x, x}; }
static inline v8 fma8(v8 a, v8 b, v8 c) {
#if defined(__FMA__) && defined(__AVX__)
    return (v8)_mm256_fmadd_ps((__m256)a, (__m256)b, (__m256)c);
#else
    return a * b + c; /* ISO mode does not contract this; on AMD the split form is as fast */
#endif
}

/* exp for decay factors, with factors below e^-60 flushed to zero. Long or
 * strong decays drive cumulative log-decays far below -87, where expf returns
 * subnormals; subnormal operands cost a microcode assist per FMA on Intel
 * cores (the chunked kernel ran 6x slower on a Xeon). A dropped factor
 * multiplies a term that is at most ~1e-26 of the terms kept beside it (every
 * sum here also has a weight-1 term), far below fp32 resolution. */
#define GDN_EXP_FLOOR (-60.0f)
static inline float gdn_exp(float x) { return x < GDN_EXP_FLOOR ? 0.0f : expf(x); }

typedef struct gdn_job {
    qd_gdn_dims d;
    const qd_gdn_span *s;
} gdn_job;

/* --------------------------------------------------------------- recurrence */

/* One value head over the whole span. The dv columns of S are independent of
 * each other (column e of S only meets v[e], d[e], o[e]), so the state is
 * walked one tile of GDN_VT columns at a time through a block of tokens: the tile
 * (dk x 16 floats, 8 KiB at dk = 128) stays in L1 across tokens, where the
 * naive order would stream the whole 64 KiB state through L2 four times per
 * token. The decay is folded into the two passes (m = a S^T k, then
 * S = a S + k d^T with the readout fused) so S is read twice per token. */
static void gdn_recurrent_head(const qd_gdn_dims *d, const qd_gdn_span *s, int h, int ta, int tz) {
    const int dk = d->dk, dv = d->dv, hv = d->hv;
    const int j = h / (d->hv / d->hk);
    float *restrict S = s->S + (size_t)h * dk * dv;
    /* A full tile is worked on in a contiguous copy when there are several
     * tokens: in place its rows are dv floats apart, and at dv = 128 (512 B)
     * they all map to 8 of the 64 L1 sets, so the tile would not stay in L1. */
    float buf[GDN_RECUR_MAXDK * GDN_VT];
    /* Tokens go in blocks: within a block every tile sees all its tokens, so
     * the block's q/k/v rows are fetched from memory once and then hit in L2
     * for the other tiles (walking all T tokens per tile re-read them dv/16
     * times and took a TLB miss per token, rows being KiBs apart). */
    for (int tb0 = ta; tb0 < tz; tb0 += GDN_RECUR_TB) {
        const int tb1 = tz - tb0 < GDN_RECUR_TB ? tz : tb0 + GDN_RECUR_TB;
        const int use_buf = tb1 - tb0 > 1 && dk <= GDN_RECUR_MAXDK;
        for (int e0 = 0; e0 < dv; e0 += GDN_VT) {
            const int w = dv - e0 < GDN_VT ? dv - e0 : GDN_VT;
            float *tb = S + e0; /* the tile's row 0 */
            int ld = dv;
            if (w == GDN_VT && use_buf) {
                for (int i = 0; i < dk; i++)
                    memcpy(buf + i * GDN_VT, S + (size_t)i * dv + e0, sizeof(float) * GDN_VT);
                tb = buf;
                ld = GDN_VT;
            }
            for (int t = tb0; t < tb1; t++) {
                const float *restrict k = s->k + t * s->k_stride + (int64_t)j * dk;
                const float *restrict q = s->q + t * s->q_stride + (int64_t)j * dk;
                const float *restrict v = s->v + t * s->v_stride + (int64_t)h * dv + e0;
                float *restrict o = s->o + ((int64_t)t * hv + h) * dv + e0;
                const float a = gdn_exp(s->g[(int64_t)t * hv + h]);
                const float b = s->beta[(int64_t)t * hv + h];
                if (w == GDN_VT) {
                    /* Full tile in registers. Rows are taken two at a time into
                     * separate accumulators so the FMA latency chains overlap. */
                    const v8 va = splat8(a);
                    v8 m0 = splat8(0.0f), m1 = m0, m2 = m0, m3 = m0;
                    int i = 0;
                    for (; i + 2 <= dk; i += 2) {
                        const float *row = tb + (size_t)i * ld;
                        const v8 k0 = splat8(k[i]), k1 = splat8(k[i + 1]);
                        m0 = fma8(ld8(row), k0, m0);
                        m1 = fma8(ld8(row + 8), k0, m1);
                        m2 = fma8(ld8(row + ld), k1, m2);
                        m3 = fma8(ld8(row + ld + 8), k1, m3);
                    }
                    if (i < dk) {
                        const float *row = tb + (size_t)i * ld;
                        m0 = fma8(ld8(row), splat8(k[i]), m0);
                        m1 = fma8(ld8(row + 8), splat8(k[i]), m1);
                    }
                    /* d = beta (v - a m): the prediction uses the decayed state a S. */
                    const v8 d0 = splat8(b) * fma8(-va, m0 + m2, ld8(v));
                    const v8 d1 = splat8(b) * fma8(-va, m1 + m3, ld8(v + 8));
                    v8 o0 = splat8(0.0f), o1 = o0, o2 = o0, o3 = o0;
                    for (i = 0; i + 2 <= dk; i += 2) {
                        float *row = tb + (size_t)i * ld;
                        const v8 k0 = splat8(k[i]), k1 = splat8(k[i + 1]);
                        const v8 q0 = splat8(q[i]), q1 = splat8(q[i + 1]);
                        const v8 x0 = fma8(k0, d0, va * ld8(row));
                        const v8 x1 = fma8(k0, d1, va * ld8(row + 8));
                        const v8 x2 = fma8(k1, d0, va * ld8(row + ld));
                        const v8 x3 = fma8(k1, d1, va * ld8(row + ld + 8));
                        st8(row, x0);
                        st8(row + 8, x1);
                        st8(row + ld, x2);
                        st8(row + ld + 8, x3);
                        o0 = fma8(x0, q0, o0);
                        o1 = fma8(x1, q0, o1);
                        o2 = fma8(x2, q1, o2);
                        o3 = fma8(x3, q1, o3);
                    }
                    if (i < dk) {
                        float *row = tb + (size_t)i * ld;
                        const v8 x0 = fma8(splat8(k[i]), d0, va * ld8(row));
                        const v8 x1 = fma8(splat8(k[i]), d1, va * ld8(row + 8));
                        st8(row, x0);
                        st8(row + 8, x1);
                        o0 = fma8(x0, splat8(q[i]), o0);
                        o1 = fma8(x1, splat8(q[i]), o1);
                    }
                    st8(o, o0 + o2);
                    st8(o + 8, o1 + o3);
                } else {
                    float m[GDN_VT], dd[GDN_VT], acc[GDN_VT];
                    for (int c = 0; c < w; c++) m[c] = 0.0f;
                    for (int i = 0; i < dk; i++) {
                        const float *restrict row = S + (size_t)i * dv + e0;
                        for (int c = 0; c < w; c++) m[c] = FMA(row[c], k[i], m[c]);
                    }
                    for (int c = 0; c < w; c++) dd[c] = b * FMA(-a, m[c], v[c]);
                    for (int c = 0; c < w; c++) acc[c] = 0.0f;
                    for (int i = 0; i < dk; i++) {
                        float *restrict row = S + (size_t)i * dv + e0;
                        for (int c = 0; c < w; c++) {
                            const float x = FMA(k[i], dd[c], a * row[c]);
                            row[c] = x;
                            acc[c] = FMA(x, q[i], acc[c]);
                        }
                    }
                    for (int c = 0; c < w; c++) o[c] = acc[c];
                }
            }
            if (tb == buf)
                for (int i = 0; i < dk; i++)
                    memcpy(S + (size_t)i * dv + e0, buf + i * GDN_VT, sizeof(float) * GDN_VT);
        }
    }
}

static void gdn_recurrent_range(void *user, int64_t begin, int64_t end, int worker) {
    (void)worker;
    const gdn_job *job = user;
    /* Token blocks outermost, heads inside: the heads of one worker then read
     * neighbouring slices of the same token rows (same pages, same lines for
     * value heads sharing a key head) instead of one head striding over all
     * tokens, which missed the TLB on every row. */
    for (int t0 = 0; t0 < job->s->T; t0 += GDN_RECUR_TB) {
        const int t1 = job->s->T - t0 < GDN_RECUR_TB ? job->s->T : t0 + GDN_RECUR_TB;
        for (int64_t h = begin; h < end; h++) gdn_recurrent_head(&job->d, job->s, (int)h, t0, t1);
    }
}

void qd_cpu_gdn_recurrent(qd_threadpool *pool, qd_gdn_dims d, const qd_gdn_span *s) {
    if (s->T <= 0 || d.hv <= 0) return;
    gdn_job job = {d, s};
    qd_parallel_for(pool, d.hv, 1, gdn_recurrent_range, &job);
}

/* Many short spans (decode: one token for each of many sequences) in one parallel
 * loop over (span, head) items, instead of one loop per span: with a handful of
 * heads per layer, a loop per span leaves threads idle and pays the pool's wake-up
 * once per sequence per layer. Each item runs exactly what qd_cpu_gdn_recurrent runs
 * for that head, so results are bit-identical to per-span calls. */
typedef struct {
    qd_gdn_dims d;
    const qd_gdn_span *spans;
} gdn_multi_job;

static void gdn_multi_range(void *user, int64_t begin, int64_t end, int worker) {
    (void)worker;
    const gdn_multi_job *job = user;
    for (int64_t it = begin; it < end; it++) {
        const qd_gdn_span *s = &job->spans[it / job->d.hv];
        const int h = (int)(it % job->d.hv);
        for (int t0 = 0; t0 < s->T; t0 += GDN_RECUR_TB) {
            const int t1 = s->T - t0 < GDN_RECUR_TB ? s->T : t0 + GDN_RECUR_TB;
            gdn_recurrent_head(&job->d, s, h, t0, t1);
        }
    }
}

void qd_cpu_gdn_recurrent_multi(qd_threadpool *pool, qd_gdn_dims d, const qd_gdn_span *spans, int n_spans) {
    if (n_spans <= 0 || d.hv <= 0) return;
    gdn_multi_job job = {d, spans};
    qd_parallel_for(pool, (int64_t)n_spans * d.hv, 1, gdn_multi_range, &job);
}

/* ------------------------------------------------------------ small GEMM */

/* C[M][N] = cs * C + A[M][K] . B[K][N], all row-major with leading dimensions.
 * cs == 0 overwrites C without reading it (scratch may hold garbage, and a
 * decayed-to-zero state must not turn stale inf/NaN into NaN).
 * If tri is set, row i only needs columns m <= i (causal): column tiles wholly
 * to the right of a row block are skipped and left unwritten.
 * The 4 x 16 register tile (8 AVX2 accumulators) keeps one B load per 4 FMAs. */
/* C[i][jb..je) = cs * C + A[i][:] . B[:][jb..je) for one row: the edge cases. */
static void gemm_row(int i, int jb, int je, int K, const float *restrict A, int lda,
                     const float *restrict B, int ldb, float *restrict C, int ldc, float cs) {
    float *restrict cr = C + (size_t)i * ldc;
    for (int c = jb; c < je; c++) cr[c] = cs == 0.0f ? 0.0f : cs * cr[c];
    for (int p = 0; p < K; p++) {
        const float a = A[(size_t)i * lda + p];
        const float *restrict b = B + (size_t)p * ldb;
        for (int c = jb; c < je; c++) cr[c] = FMA(a, b[c], cr[c]);
    }
}

static void gemm(int M, int N, int K, const float *restrict A, int lda, const float *restrict B,
                 int ldb, float *restrict C, int ldc, float cs, int tri) {
    enum { MR = 4, NR = GDN_VT };
    const int Mf = M / MR * MR, Nf = N / NR * NR;
    /* Column panel outermost: the K x 16 panel of B (8 KiB at K = 128) stays
     * in L1 while all row blocks pass over it; A is read once per panel. */
    for (int j = 0; j < Nf; j += NR) {
        for (int i = 0; i < Mf; i += MR) {
            if (tri && j >= i + MR) continue; /* wholly above the diagonal */
            const float *a0 = A + (size_t)i * lda, *a1 = a0 + lda, *a2 = a1 + lda, *a3 = a2 + lda;
            v8 c00 = splat8(0.0f), c01 = c00, c10 = c00, c11 = c00;
            v8 c20 = c00, c21 = c00, c30 = c00, c31 = c00;
            for (int p = 0; p < K; p++) {
                const float *b = B + (size_t)p * ldb + j;
                const v8 b0 = ld8(b), b1 = ld8(b + 8);
                v8 x = splat8(a0[p]);
                c00 = fma8(x, b0, c00); c01 = fma8(x, b1, c01);
                x = splat8(a1[p]);
                c10 = fma8(x, b0, c10); c11 = fma8(x, b1, c11);
                x = splat8(a2[p]);
                c20 = fma8(x, b0, c20); c21 = fma8(x, b1, c21);
                x = splat8(a3[p]);
                c30 = fma8(x, b0, c30); c31 = fma8(x, b1, c31);
            }
            const v8 acc[MR][2] = {{c00, c01}, {c10, c11}, {c20, c21}, {c30, c31}};
            for (int r = 0; r < MR; r++) {
                float *cr = C + (size_t)(i + r) * ldc + j;
                if (cs == 0.0f) {
                    st8(cr, acc[r][0]);
                    st8(cr + 8, acc[r][1]);
                } else {
                    st8(cr, fma8(splat8(cs), ld8(cr), acc[r][0]));
                    st8(cr + 8, fma8(splat8(cs), ld8(cr + 8), acc[r][1]));
                }
            }
        }
    }
    /* Column tail (< 16 wide) of the full row blocks, then the row tail (< 4
     * rows) over all columns. With tri, row i needs columns up to i only. */
    for (int i = 0; i < M; i++) {
        const int nl = tri && i + 1 < N ? i + 1 : N;
        const int jb = i < Mf ? Nf : 0;
        if (jb < nl) gemm_row(i, jb, nl, K, A, lda, B, ldb, C, ldc, cs);
    }
}

/* acc[0..dv) = x[0..dv) + sum_{m < cnt} coef[m] * R[m][0..dv), written to y.
 * Tiled over dv so that the running sum stays in registers while the rows of
 * R stream past (the naive in-memory accumulate would be store-bound).
 * y may alias x (each element is read before it is written). */
static void lincomb(int dv, int cnt, const float *coef, const float *R, int ldr, const float *x,
                    float *y) {
    int e0 = 0;
    for (; e0 + GDN_VT <= dv; e0 += GDN_VT) {
        /* two accumulator pairs (even/odd m) so the FMA chains overlap */
        v8 a0 = ld8(x + e0), a1 = ld8(x + e0 + 8), a2 = splat8(0.0f), a3 = a2;
        int m = 0;
        for (; m + 2 <= cnt; m += 2) {
            const float *r = R + (size_t)m * ldr + e0;
            const v8 f0 = splat8(coef[m]), f1 = splat8(coef[m + 1]);
            a0 = fma8(f0, ld8(r), a0);
            a1 = fma8(f0, ld8(r + 8), a1);
            a2 = fma8(f1, ld8(r + ldr), a2);
            a3 = fma8(f1, ld8(r + ldr + 8), a3);
        }
        if (m < cnt) {
            const float *r = R + (size_t)m * ldr + e0;
            a0 = fma8(splat8(coef[m]), ld8(r), a0);
            a1 = fma8(splat8(coef[m]), ld8(r + 8), a1);
        }
        st8(y + e0, a0 + a2);
        st8(y + e0 + 8, a1 + a3);
    }
    if (e0 < dv) {
        float acc[GDN_VT];
        const int w = dv - e0;
        for (int c = 0; c < w; c++) acc[c] = x[e0 + c];
        for (int m = 0; m < cnt; m++) {
            const float f = coef[m];
            const float *restrict r = R + (size_t)m * ldr + e0;
            for (int c = 0; c < w; c++) acc[c] = FMA(f, r[c], acc[c]);
        }
        for (int c = 0; c < w; c++) y[e0 + c] = acc[c];
    }
}

/* -------------------------------------------------------------- chunked WY */

/* Per-worker scratch for one head, carved from one allocation. Every matrix
 * has a padded leading dimension (see padded_ld). */
typedef struct gdn_scratch {
    int ldk, ldv, ldc; /* leading dimensions for dk-, dv- and C-wide rows */
    float *Sw;    /* [dk][ldv]: the head's state, padded copy kept across chunks */
    float *KQ;    /* [2C][ldk]: rows 0..n-1 keys, rows n..2n-1 queries of the chunk */
    float *Kt;    /* [dk][ldc]: keys transposed, so K K^T and the state update are plain GEMMs */
    float *P;     /* [2C][ldv]: K S (rows 0..n-1) and Q S (rows n..2n-1) with the entry state */
    float *KK;    /* [C][ldc]:  k_i . k_m, lower triangle incl. diagonal */
    float *QK;    /* [C][ldc]:  q_i . k_m, lower triangle incl. diagonal */
    float *X;     /* [C][ldv]:  right-hand side, then Vnew, then decay-weighted Vnew */
    float *G;     /* [C] inclusive cumsum of g in the chunk */
    float *coef;  /* [C] one row of coefficients */
    float *e;     /* [C] one row of decay factors e^{G_i - G_m} */
} gdn_scratch;

static size_t round16(size_t n) { return (n + 15) & ~(size_t)15; }

/* Row length rounded to whole 64-byte lines, made an odd number of lines.
 * With a power-of-two row stride (dv = 128 floats = 512 B) the rows of a
 * 16-column GEMM panel all fall into 8 of the 64 L1 sets, so a 128-row panel
 * cannot stay in L1 and every row block re-streams it from L2. An odd line
 * count per row spreads consecutive rows over all sets. */
static int padded_ld(int n) {
    int ld = (int)round16((size_t)n);
    if ((ld / 16) % 2 == 0) ld += 16;
    return ld;
}

static float *carve(float **p, size_t n) {
    float *r = *p;
    *p += round16(n); /* keeps every piece 64-byte aligned */
    return r;
}

/* Lays the scratch out in mem (or, with mem == NULL, only counts); returns floats used. */
static size_t scratch_layout(gdn_scratch *w, int dk, int dv, float *mem) {
    const size_t C = GDN_CHUNK;
    float *p = mem;
    size_t total = 0;
    w->ldk = padded_ld(dk);
    w->ldv = padded_ld(dv);
    w->ldc = padded_ld(GDN_CHUNK);
    const size_t sizes[10] = {(size_t)dk * w->ldv, 2 * C * w->ldk, (size_t)dk * w->ldc, 2 * C * w->ldv,
                             C * w->ldc,          C * w->ldc,     C * w->ldv,          C,
                             C,                   C};
    float **dst[10] = {&w->Sw, &w->KQ, &w->Kt, &w->P, &w->KK, &w->QK, &w->X, &w->G, &w->coef, &w->e};
    for (int i = 0; i < 10; i++) {
        total += round16(sizes[i]);
        *dst[i] = mem ? carve(&p, sizes[i]) : NULL;
    }
    return total;
}

/* One chunk of n tokens starting at t0 for value head h; w->Sw holds the
 * state entering the chunk and is updated to the state leaving it.
 *
 * The spec's WY form is U = T(beta V), W = T(beta e^G K), Vnew = U - W S with
 * T = (I+L)^-1. Since T is linear, Vnew = T (beta (V - e^G K S)) = (I+L)^-1 X:
 * one forward substitution on the dv-wide right-hand side X gives Vnew
 * directly, so neither T nor W is formed (saves n^2 dk + n^3/6 multiply-adds
 * per chunk; same result up to rounding). */
static void gdn_chunk(const qd_gdn_dims *d, const qd_gdn_span *s, int h, int t0, int n,
                      const gdn_scratch *w) {
    const int dk = d->dk, dv = d->dv, hv = d->hv;
    const int ldk = w->ldk, ldv = w->ldv, ldc = w->ldc;
    const int j = h / (d->hv / d->hk);
    float *restrict Sw = w->Sw, *restrict KQ = w->KQ, *restrict Kt = w->Kt, *restrict P = w->P;
    float *restrict KK = w->KK, *restrict QK = w->QK, *restrict X = w->X;
    float *restrict G = w->G, *restrict coef = w->coef, *restrict e = w->e;

    /* Gather the chunk's keys and queries into contiguous rows (the inputs are
     * strided slices of the projection output) and transpose the keys. */
    for (int i = 0; i < n; i++) {
        const float *k = s->k + (int64_t)(t0 + i) * s->k_stride + (int64_t)j * dk;
        const float *q = s->q + (int64_t)(t0 + i) * s->q_stride + (int64_t)j * dk;
        memcpy(KQ + (size_t)i * ldk, k, (size_t)dk * sizeof(float));
        memcpy(KQ + (size_t)(n + i) * ldk, q, (size_t)dk * sizeof(float));
        for (int p = 0; p < dk; p++) Kt[(size_t)p * ldc + i] = k[p];
    }
    /* Input rows of one head are KiBs apart, so the hardware prefetcher does
     * not follow them and the v loads and o stores below stalled on memory.
     * Request this chunk's v and o rows now; the GEMMs give them time to arrive. */
    for (int i = 0; i < n; i++) {
        const float *v = s->v + (int64_t)(t0 + i) * s->v_stride + (int64_t)h * dv;
        const float *o = s->o + ((int64_t)(t0 + i) * hv + h) * dv;
        for (int c = 0; c < dv; c += 16) {
            __builtin_prefetch(v + c, 0, 2);
            __builtin_prefetch(o + c, 1, 2);
        }
    }
    /* Chunk-local inclusive cumsum of the log-decay. */
    float acc = 0.0f;
    for (int i = 0; i < n; i++) {
        acc += s->g[(int64_t)(t0 + i) * hv + h];
        G[i] = acc;
    }

    /* [K; Q] S with the entry state, and the causal K K^T, Q K^T products. */
    gemm(2 * n, dv, dk, KQ, ldk, Sw, ldv, P, ldv, 0.0f, 0);
    gemm(n, n, dk, KQ, ldk, Kt, ldc, KK, ldc, 0.0f, 1);
    gemm(n, n, dk, KQ + (size_t)n * ldk, ldk, Kt, ldc, QK, ldc, 0.0f, 1);

    /* Row by row, sharing one row of decay factors e[m] = e^{G_i-G_m}:
     * (a) X_i = beta_i (v_i - e^{G_i} (S^T k_i)), then forward substitution
     *     Vnew_i = X_i - sum_{m<i} L[i][m] Vnew_m, L[i][m] = beta_i (k_i.k_m) e[m].
     *     Row i reads only rows m < i, already final, so Vnew overwrites X in place.
     * (b) O_i = e^{G_i} (q_i^T S) + sum_{m<=i} (q_i.k_m) e[m] Vnew_m, which needs
     *     Vnew up to row i only, so it can follow (a) in the same pass.
     * exp is evaluated only for m <= i, where G_i - G_m <= 0 cannot overflow. */
    for (int i = 0; i < n; i++) {
        const float b = s->beta[(int64_t)(t0 + i) * hv + h];
        const float eg = gdn_exp(G[i]);
        const float *restrict v = s->v + (int64_t)(t0 + i) * s->v_stride + (int64_t)h * dv;
        const float *restrict pk = P + (size_t)i * ldv;
        const float *restrict pq = P + (size_t)(n + i) * ldv;
        const float *restrict kk = KK + (size_t)i * ldc;
        const float *restrict qk = QK + (size_t)i * ldc;
        float *restrict x = X + (size_t)i * ldv;
        float *restrict o = s->o + ((int64_t)(t0 + i) * hv + h) * dv;
        for (int m = 0; m < i; m++) e[m] = gdn_exp(G[i] - G[m]);
        e[i] = 1.0f;
        for (int ee = 0; ee < dv; ee++) x[ee] = b * FMA(-eg, pk[ee], v[ee]);
        for (int m = 0; m < i; m++) coef[m] = -b * kk[m] * e[m];
        lincomb(dv, i, coef, X, ldv, x, x);
        for (int ee = 0; ee < dv; ee++) o[ee] = eg * pq[ee];
        for (int m = 0; m <= i; m++) coef[m] = qk[m] * e[m];
        lincomb(dv, i + 1, coef, X, ldv, o, o);
    }

    /* S' = e^{G_last} S + sum_m e^{G_last-G_m} k_m Vnew_m^T: scale the rows of
     * Vnew, then one GEMM K^T Vnew' accumulated onto the decayed state. */
    const float gl = G[n - 1];
    for (int m = 0; m < n; m++) {
        float *restrict x = X + (size_t)m * ldv;
        const float f = gdn_exp(gl - G[m]);
        for (int c = 0; c < dv; c++) x[c] *= f;
    }
    gemm(dk, dv, n, Kt, ldc, X, ldv, Sw, ldv, gdn_exp(gl), 0);
}

static void gdn_chunked_range(void *user, int64_t begin, int64_t end, int worker) {
    (void)worker; /* scratch is allocated per call of this function, not per worker id */
    const gdn_job *job = user;
    const qd_gdn_dims *d = &job->d;
    const qd_gdn_span *s = job->s;
    const int dk = d->dk, dv = d->dv;
    gdn_scratch w;
    const size_t bytes = scratch_layout(&w, dk, dv, NULL) * sizeof(float);
    float *mem = aligned_alloc(64, bytes); /* bytes is a multiple of 64 (round16) */
    if (!mem) {
        /* No scratch: the recurrence needs none and gives the same result. */
        for (int64_t h = begin; h < end; h++) gdn_recurrent_head(d, s, (int)h, 0, s->T);
        return;
    }
    scratch_layout(&w, dk, dv, mem);
    /* Chunks outermost, heads inside, for the same page locality as in the
     * recurrence. Each head's state is copied into the padded scratch per
     * chunk: 2 x 64 KiB of copying against ~4M multiply-adds of chunk work. */
    for (int t0 = 0; t0 < s->T; t0 += GDN_CHUNK) {
        const int n = s->T - t0 < GDN_CHUNK ? s->T - t0 : GDN_CHUNK;
        for (int64_t h = begin; h < end; h++) {
            float *S = s->S + (size_t)h * dk * dv;
            for (int i = 0; i < dk; i++)
                memcpy(w.Sw + (size_t)i * w.ldv, S + (size_t)i * dv, (size_t)dv * sizeof(float));
            gdn_chunk(d, s, (int)h, t0, n, &w);
            for (int i = 0; i < dk; i++)
                memcpy(S + (size_t)i * dv, w.Sw + (size_t)i * w.ldv, (size_t)dv * sizeof(float));
        }
    }
    free(mem);
}

void qd_cpu_gdn_chunked(qd_threadpool *pool, qd_gdn_dims d, const qd_gdn_span *s) {
    if (s->T <= 0 || d.hv <= 0) return;
    gdn_job job = {d, s};
    qd_parallel_for(pool, d.hv, 1, gdn_chunked_range, &job);
}
