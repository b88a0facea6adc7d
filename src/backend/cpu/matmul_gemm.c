/* Prefill GEMM: y[i][r] = sum_k x[i][k] * W[r][k] for many x rows.
 *
 * W is converted and transposed panel by panel into a stack buffer
 * panel[k][QD_MM_NR] (QD_MM_NR consecutive W rows interleaved per column), so the
 * micro-kernel reads two aligned 8-wide vectors per k and broadcasts one x value
 * per x row: a QD_MM_MR x 16 tile of y lives in 12 ymm accumulators and each
 * loaded weight feeds QD_MM_MR FMAs. The conversion cost (one pass over W per
 * x-row chunk) is amortised over all x rows of the chunk. */
#include <string.h>

#include "backend/cpu/matmul_internal.h"

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define QD_MM_SIMD 1
#else
#define QD_MM_SIMD 0
#endif

/* Converts n weights starting at element idx into dst (f32). */
static void convert_row(qd_dtype dt, const void *w, int64_t idx, int64_t n, float *dst) {
    int64_t k = 0;
#if QD_MM_SIMD
    if (dt == QD_DTYPE_F32) {
        memcpy(dst, (const float *)w + idx, sizeof(float) * (size_t)n);
        return;
    }
    if (dt == QD_DTYPE_BF16) {
        const uint16_t *s = (const uint16_t *)w + idx;
        for (; k + 8 <= n; k += 8) {
            __m128i h = _mm_loadu_si128((const __m128i *)(s + k));
            _mm256_storeu_ps(dst + k, _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16)));
        }
    }
#ifdef __F16C__
    if (dt == QD_DTYPE_F16) {
        const uint16_t *s = (const uint16_t *)w + idx;
        for (; k + 8 <= n; k += 8)
            _mm256_storeu_ps(dst + k, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(s + k))));
    }
#endif
#endif
    for (; k < n; k++) dst[k] = qd_mm_wscalar(dt, w, idx + k);
}

/* panel[kk][j] = W[r0 + j][k0 + kk] for j < nr, zero for nr <= j < QD_MM_NR (the
 * padded lanes then contribute nothing and are simply not stored). */
static void pack_panel(const qd_weight *w, int64_t r0, int nr, int64_t k0, int64_t kc, float *panel) {
    float row[QD_MM_KC];
    for (int j = 0; j < nr; j++) {
        convert_row(w->dtype, w->data, (r0 + j) * w->cols + k0, kc, row);
        for (int64_t kk = 0; kk < kc; kk++) panel[kk * QD_MM_NR + j] = row[kk];
    }
    for (int j = nr; j < QD_MM_NR; j++)
        for (int64_t kk = 0; kk < kc; kk++) panel[kk * QD_MM_NR + j] = 0.0f;
}

/* One MR x NR tile over kc columns. xp[i] points at x[i][k0]; rows beyond the valid
 * ones repeat a valid pointer (their results are discarded: yp[i] == NULL).
 * accumulate = 0 for the first column block, so y may hold garbage (NaN) before. */
static void kernel_tile(int64_t kc, const float *panel, const float *const xp[QD_MM_MR],
                        float *const yp[QD_MM_MR], int nr, int accumulate) {
#if QD_MM_SIMD
    __m256 c00 = _mm256_setzero_ps(), c01 = _mm256_setzero_ps();
    __m256 c10 = _mm256_setzero_ps(), c11 = _mm256_setzero_ps();
    __m256 c20 = _mm256_setzero_ps(), c21 = _mm256_setzero_ps();
    __m256 c30 = _mm256_setzero_ps(), c31 = _mm256_setzero_ps();
    __m256 c40 = _mm256_setzero_ps(), c41 = _mm256_setzero_ps();
    __m256 c50 = _mm256_setzero_ps(), c51 = _mm256_setzero_ps();
    const float *x0 = xp[0], *x1 = xp[1], *x2 = xp[2], *x3 = xp[3], *x4 = xp[4], *x5 = xp[5];
#pragma GCC unroll 4
    for (int64_t k = 0; k < kc; k++) {
        __m256 b0 = _mm256_load_ps(panel + k * QD_MM_NR);
        __m256 b1 = _mm256_load_ps(panel + k * QD_MM_NR + 8);
        __m256 a;
        a = _mm256_broadcast_ss(x0 + k); c00 = _mm256_fmadd_ps(a, b0, c00); c01 = _mm256_fmadd_ps(a, b1, c01);
        a = _mm256_broadcast_ss(x1 + k); c10 = _mm256_fmadd_ps(a, b0, c10); c11 = _mm256_fmadd_ps(a, b1, c11);
        a = _mm256_broadcast_ss(x2 + k); c20 = _mm256_fmadd_ps(a, b0, c20); c21 = _mm256_fmadd_ps(a, b1, c21);
        a = _mm256_broadcast_ss(x3 + k); c30 = _mm256_fmadd_ps(a, b0, c30); c31 = _mm256_fmadd_ps(a, b1, c31);
        a = _mm256_broadcast_ss(x4 + k); c40 = _mm256_fmadd_ps(a, b0, c40); c41 = _mm256_fmadd_ps(a, b1, c41);
        a = _mm256_broadcast_ss(x5 + k); c50 = _mm256_fmadd_ps(a, b0, c50); c51 = _mm256_fmadd_ps(a, b1, c51);
    }
    _Alignas(32) float c[QD_MM_MR][QD_MM_NR];
    _mm256_store_ps(c[0], c00); _mm256_store_ps(c[0] + 8, c01);
    _mm256_store_ps(c[1], c10); _mm256_store_ps(c[1] + 8, c11);
    _mm256_store_ps(c[2], c20); _mm256_store_ps(c[2] + 8, c21);
    _mm256_store_ps(c[3], c30); _mm256_store_ps(c[3] + 8, c31);
    _mm256_store_ps(c[4], c40); _mm256_store_ps(c[4] + 8, c41);
    _mm256_store_ps(c[5], c50); _mm256_store_ps(c[5] + 8, c51);
#else
    /* Portable: the same tile with plain loops (auto-vectorised where possible). */
    float c[QD_MM_MR][QD_MM_NR];
    memset(c, 0, sizeof c);
    for (int64_t k = 0; k < kc; k++) {
        const float *b = panel + k * QD_MM_NR;
        for (int i = 0; i < QD_MM_MR; i++) {
            float a = xp[i][k];
            for (int j = 0; j < QD_MM_NR; j++) c[i][j] += a * b[j];
        }
    }
#endif
    for (int i = 0; i < QD_MM_MR; i++) {
        float *y = yp[i];
        if (!y) continue;
        if (accumulate)
            for (int j = 0; j < nr; j++) y[j] += c[i][j];
        else
            for (int j = 0; j < nr; j++) y[j] = c[i][j];
    }
}

void qd_mm_gemm_range(const qd_weight *w, const float *x, float *y, int64_t r0, int64_t r1,
                      int64_t i0, int64_t i1) {
    _Alignas(64) float panel[QD_MM_KC * QD_MM_NR];
    const int64_t cols = w->cols, rows = w->rows;
    for (int64_t r = r0; r < r1; r += QD_MM_NR) {
        int nr = r1 - r < QD_MM_NR ? (int)(r1 - r) : QD_MM_NR;
        for (int64_t k0 = 0; k0 < cols; k0 += QD_MM_KC) {
            int64_t kc = cols - k0 < QD_MM_KC ? cols - k0 : QD_MM_KC;
            pack_panel(w, r, nr, k0, kc, panel);
            for (int64_t i = i0; i < i1; i += QD_MM_MR) {
                const float *xp[QD_MM_MR];
                float *yp[QD_MM_MR];
                for (int m = 0; m < QD_MM_MR; m++) {
                    int64_t ii = i + m < i1 ? i + m : i;
                    xp[m] = x + ii * cols + k0;
                    yp[m] = i + m < i1 ? y + ii * rows + r : NULL;
                }
                kernel_tile(kc, panel, xp, yp, nr, k0 > 0);
            }
        }
    }
}
