/* y = x . W^T for the quantized formats (F8_E4M3, NVFP4, INT4; base/weight.h): W8A16 /
 * W4A16 in fp32 from the exactly dequantized weights. A tile of W rows is dequantized
 * once into per-task scratch (qd_weight_dequant_rows, the reference itself) and dotted
 * with every x row of the task, so the result is exactly the fp32 product with the
 * dequantized matrix. Each dot product sums the same way whatever n is (8 lanes over
 * the columns, one horizontal sum, the scalar tail), so batch-invariant mode needs
 * nothing more. */
#include <stdlib.h>

#include "backend/cpu/matmul_internal.h"

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
static float dot(const float *a, const float *b, int64_t n) {
    __m256 acc = _mm256_setzero_ps();
    int64_t k = 0;
    for (; k + 8 <= n; k += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + k), _mm256_loadu_ps(b + k), acc);
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    float r = _mm_cvtss_f32(s);
    for (; k < n; k++) r += a[k] * b[k];
    return r;
}
#else
static float dot(const float *a, const float *b, int64_t n) {
    float s[8] = {0};
    int64_t k = 0;
    for (; k + 8 <= n; k += 8)
        for (int j = 0; j < 8; j++) s[j] += a[k + j] * b[k + j];
    float r = ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
    for (; k < n; k++) r += a[k] * b[k];
    return r;
}
#endif

/* W rows per dequantized tile: the tile stays in L2 while every x row passes over it. */
#define QD_MMQ_TILE_BYTES (128 * 1024)

void qd_mm_quant_range(const qd_weight *w, const float *x, float *y, int64_t r0, int64_t r1, int64_t i0, int64_t i1) {
    const int64_t C = w->cols, R = w->rows;
    int64_t tile = (int64_t)(QD_MMQ_TILE_BYTES / ((size_t)C * sizeof(float)));
    if (tile < 1) tile = 1;
    if (tile > r1 - r0) tile = r1 - r0;
    float *scratch = malloc((size_t)(tile * C) * sizeof(float));
    if (!scratch) tile = 0; /* no heap: each row in 1024-column pieces from the stack */
    for (int64_t r = r0; r < r1; r += tile ? tile : 1) {
        if (!tile) {
            float piece[1024];
            for (int64_t i = i0; i < i1; i++) y[i * R + r] = 0.0f;
            for (int64_t c = 0; c < C; c += 1024) {
                const int64_t m = C - c < 1024 ? C - c : 1024;
                qd_weight_dequant_span(w, r, c, m, piece);
                for (int64_t i = i0; i < i1; i++) y[i * R + r] += dot(piece, x + i * C + c, m);
            }
            continue;
        }
        const int64_t n = r + tile < r1 ? tile : r1 - r;
        qd_weight_dequant_rows(w, r, n, scratch);
        for (int64_t i = i0; i < i1; i++)
            for (int64_t j = 0; j < n; j++) y[i * R + r + j] = dot(scratch + j * C, x + i * C, C);
    }
    free(scratch);
}
