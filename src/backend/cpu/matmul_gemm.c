/* Prefill GEMM: y[i][r] = sum_k x[i][k] * W[r][k] for many x rows.
 *
 * W is converted and transposed panel by panel into per-task scratch
 * panel[k][QD_MM_NR] (QD_MM_NR consecutive W rows interleaved per column), so the
 * micro-kernel reads two aligned 8-wide vectors per k and broadcasts one x value
 * per x row: a QD_MM_MR x 16 tile of y lives in 12 ymm accumulators and each
 * loaded weight feeds QD_MM_MR FMAs. The conversion cost (one pass over W per
 * x-row chunk) is amortised over all x rows of the chunk. */
#include <stdlib.h>
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

#if QD_MM_SIMD
/* 8 weights at element idx as f32, or 0 when the dtype has no vector conversion here. */
static inline int load8(qd_dtype dt, const void *w, int64_t idx, __m256 *out) {
    if (dt == QD_DTYPE_F32) { *out = _mm256_loadu_ps((const float *)w + idx); return 1; }
    if (dt == QD_DTYPE_BF16) {
        __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)w + idx));
        *out = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
        return 1;
    }
#ifdef __F16C__
    if (dt == QD_DTYPE_F16) {
        *out = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)w + idx)));
        return 1;
    }
#endif
    return 0;
}

/* Full panels: 8x8 blocks converted and transposed in registers, because the scalar
 * scatter costs more than the micro-kernel itself when there are only a few x rows.
 * Returns how many columns were packed (a multiple of 8), 0 if not applicable. */
static int64_t pack_panel_simd(const qd_weight *w, int64_t r0, int64_t k0, int64_t kc, float *panel) {
    __m256 probe;
    if (!load8(w->dtype, w->data, 0, &probe)) return 0;
    int64_t kk = 0;
    for (; kk + 8 <= kc; kk += 8) {
        for (int h = 0; h < QD_MM_NR; h += 8) {
            __m256 r[8];
            for (int j = 0; j < 8; j++) load8(w->dtype, w->data, (r0 + h + j) * w->cols + k0 + kk, &r[j]);
            __m256 t0 = _mm256_unpacklo_ps(r[0], r[1]), t1 = _mm256_unpackhi_ps(r[0], r[1]);
            __m256 t2 = _mm256_unpacklo_ps(r[2], r[3]), t3 = _mm256_unpackhi_ps(r[2], r[3]);
            __m256 t4 = _mm256_unpacklo_ps(r[4], r[5]), t5 = _mm256_unpackhi_ps(r[4], r[5]);
            __m256 t6 = _mm256_unpacklo_ps(r[6], r[7]), t7 = _mm256_unpackhi_ps(r[6], r[7]);
            __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xEE);
            __m256 u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xEE);
            __m256 u4 = _mm256_shuffle_ps(t4, t6, 0x44), u5 = _mm256_shuffle_ps(t4, t6, 0xEE);
            __m256 u6 = _mm256_shuffle_ps(t5, t7, 0x44), u7 = _mm256_shuffle_ps(t5, t7, 0xEE);
            float *d = panel + kk * QD_MM_NR + h;
            _mm256_store_ps(d + 0 * QD_MM_NR, _mm256_permute2f128_ps(u0, u4, 0x20));
            _mm256_store_ps(d + 1 * QD_MM_NR, _mm256_permute2f128_ps(u1, u5, 0x20));
            _mm256_store_ps(d + 2 * QD_MM_NR, _mm256_permute2f128_ps(u2, u6, 0x20));
            _mm256_store_ps(d + 3 * QD_MM_NR, _mm256_permute2f128_ps(u3, u7, 0x20));
            _mm256_store_ps(d + 4 * QD_MM_NR, _mm256_permute2f128_ps(u0, u4, 0x31));
            _mm256_store_ps(d + 5 * QD_MM_NR, _mm256_permute2f128_ps(u1, u5, 0x31));
            _mm256_store_ps(d + 6 * QD_MM_NR, _mm256_permute2f128_ps(u2, u6, 0x31));
            _mm256_store_ps(d + 7 * QD_MM_NR, _mm256_permute2f128_ps(u3, u7, 0x31));
        }
    }
    return kk;
}
#endif

/* panel[kk][j] = W[r0 + j][k0 + kk] for j < nr, zero for nr <= j < QD_MM_NR (the
 * padded lanes then contribute nothing and are simply not stored). */
static void pack_panel(const qd_weight *w, int64_t r0, int nr, int64_t k0, int64_t kc, float *panel) {
#if QD_MM_SIMD
    if (nr == QD_MM_NR) {
        int64_t done = pack_panel_simd(w, r0, k0, kc, panel);
        for (int j = 0; j < nr; j++)
            for (int64_t kk = done; kk < kc; kk++)
                panel[kk * QD_MM_NR + j] = qd_mm_wscalar(w->dtype, w->data, (r0 + j) * w->cols + k0 + kk);
        return;
    }
#endif
    float row[QD_MM_KC > QD_MM_KC_STACK ? QD_MM_KC : QD_MM_KC_STACK];
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

/* Asks for the W block that will be packed after this one: packing reads 16 short
 * row segments, too short for the hardware prefetchers, and with few x rows the
 * kernel work between two packings would not hide the DRAM latency. */
static void prefetch_next(const qd_weight *w, int64_t r, int64_t r1, int64_t k0, int64_t kb) {
    int64_t nr0 = r, nk0 = k0 + kb;
    if (nk0 >= w->cols) { nr0 = r + QD_MM_NR; nk0 = 0; }
    if (nr0 >= r1) return;
    int64_t nr = r1 - nr0 < QD_MM_NR ? r1 - nr0 : QD_MM_NR;
    int64_t kc = w->cols - nk0 < kb ? w->cols - nk0 : kb;
    size_t es = qd_dtype_size(w->dtype);
    const char *base = (const char *)w->data;
    for (int64_t j = 0; j < nr; j++) {
        const char *p = base + ((nr0 + j) * w->cols + nk0) * (int64_t)es;
        for (size_t b = 0; b < (size_t)kc * es; b += 64) __builtin_prefetch(p + b, 0, 3);
    }
}

void qd_mm_gemm_range(const qd_weight *w, const float *x, float *y, int64_t r0, int64_t r1,
                      int64_t i0, int64_t i1) {
    const int64_t cols = w->cols, rows = w->rows;
    /* Equal K blocks (rounded up to 8 for the SIMD packer) rather than KC + a short tail. */
    int64_t nkb = (cols + QD_MM_KC - 1) / QD_MM_KC;
    int64_t kb = ((cols + nkb - 1) / nkb + 7) / 8 * 8;
    if (kb > QD_MM_KC) kb = QD_MM_KC;
    _Alignas(64) float stack_panel[QD_MM_KC_STACK * QD_MM_NR];
    float *heap = aligned_alloc(64, sizeof(float) * (size_t)(kb * QD_MM_NR));
    float *panel = heap;
    if (!panel) {
        panel = stack_panel;
        kb = QD_MM_KC_STACK;
    }
    for (int64_t r = r0; r < r1; r += QD_MM_NR) {
        int nr = r1 - r < QD_MM_NR ? (int)(r1 - r) : QD_MM_NR;
        for (int64_t k0 = 0; k0 < cols; k0 += kb) {
            int64_t kc = cols - k0 < kb ? cols - k0 : kb;
            prefetch_next(w, r, r1, k0, kb);
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
    free(heap);
}
