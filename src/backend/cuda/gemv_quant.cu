/* Quantized weights on the device (cuda_quant.h): the decode GEMV and the dequantization
 * into bf16 that the prefill products run on.
 *
 * GEMV, two kernels by layout (and the tensor-core one of gemv_quant_mma.cu, which the
 * table, qd_cuda_qgemv_choice, prefers where it takes the layout):
 *   vectorised (qd_cuda_qlayout_vectorised): one warp per weight row, each lane streaming
 *     16-byte pieces of the row (QV_U in flight), a piece decoded in registers
 *     (cuda_qformat.cuh), its partial sums with the n rows of x (read through L1: every
 *     warp of the grid reads the same x) scaled once per scale block, a shuffle tree per
 *     output;
 *   element loop: one element per lane and step, its block or group found per element
 *     (act-order g_idx, odd shapes, scales not yet widened): exact for every layout of
 *     base/weight.h, slower.
 * Dequantization: a thread per 16-byte piece (vectorised layouts) or per element. */
#include <math.h>
#include <stdint.h>

#include "backend/cuda/cuda_quant.h"
#include <cuda_fp16.h>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_qformat.cuh"
#include "backend/cuda/cuda_util.h"

#define QG_WARPS 8
#define QV_U 4 /* 16-byte pieces per lane in flight */

static int64_t qg_ceil(int64_t a, int64_t b) { return (a + b - 1) / b; }

/* ---- the element loop (every layout) ---- */

struct qg_params {
    int fmt, n, accumulate;
    int64_t rows, cols, ldx, ldy;
    const uint8_t *q;
    const void *scales;
    int scale_dtype;
    int64_t br, bc, nbc; /* block rows, block cols, blocks per row of scales */
    float global;
    const uint8_t *zeros;
    const int32_t *g_idx;
    const uint16_t *x;
    float *y;
};

/* e2m1: sign, 2 exponent bits (bias 1), 1 mantissa bit; e = 0: m * 0.5. */
__device__ __forceinline__ float qg_e2m1(uint32_t v) {
    const uint32_t e = (v >> 1) & 3, m = v & 1;
    const float mag = e ? __uint_as_float(((e + 126) << 23) | (m << 22)) : (float)m * 0.5f;
    return (v & 8) ? -mag : mag;
}

__device__ __forceinline__ float qg_scale(const qg_params &p, int64_t i) {
    switch (p.scale_dtype) {
    case QD_DTYPE_F32: return __ldg((const float *)p.scales + i);
    case QD_DTYPE_BF16: return qd_bf2f(__ldg((const unsigned short *)p.scales + i));
    case QD_DTYPE_F16: return __half2float(__ushort_as_half(__ldg((const unsigned short *)p.scales + i)));
    default: return qf_e4m3(__ldg((const unsigned char *)p.scales + i)); /* NVFP4: e4m3 */
    }
}

/* The dequantized element (r, c). */
__device__ __forceinline__ float qg_weight(const qg_params &p, int64_t r, int64_t c) {
    if (p.fmt == QD_DTYPE_F8_E4M3) {
        const float s = qg_scale(p, (r / p.br) * p.nbc + c / p.bc);
        return qf_e4m3(__ldcs(p.q + r * p.cols + c)) * s;
    }
    const uint32_t b = __ldcs(p.q + (r * p.cols + c) / 2);
    const uint32_t v = (c & 1) ? b >> 4 : b & 15;
    if (p.fmt == QD_DTYPE_NVFP4) return qg_e2m1(v) * qg_scale(p, r * (p.cols / 16) + c / 16) * p.global;
    const int64_t g = (p.g_idx ? (int64_t)__ldg(p.g_idx + c) : c / p.bc) + r * p.nbc;
    const int z = p.zeros ? (int)__ldg(p.zeros + g) : 8;
    return (float)((int)v - z) * qg_scale(p, g);
}

template <int N>
__global__ void __launch_bounds__(QG_WARPS * 32) qgemv_elem(const __grid_constant__ qg_params p) {
    const int lane = threadIdx.x & 31;
    const int64_t stride = (int64_t)gridDim.x * QG_WARPS;
    for (int64_t r = (int64_t)blockIdx.x * QG_WARPS + (threadIdx.x >> 5); r < p.rows; r += stride) {
        float acc[N];
#pragma unroll
        for (int t = 0; t < N; t++) acc[t] = 0.f;
        for (int64_t c = lane; c < p.cols; c += 32) {
            const float w = qg_weight(p, r, c);
#pragma unroll
            for (int t = 0; t < N; t++)
                if (t < p.n) acc[t] = fmaf(w, qd_bf2f(__ldg(p.x + t * p.ldx + c)), acc[t]);
        }
#pragma unroll
        for (int t = 0; t < N; t++) {
            float v = acc[t];
            for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
            if (lane == 0 && t < p.n) {
                float *yp = p.y + t * p.ldy + r;
                *yp = p.accumulate ? *yp + v : v;
            }
        }
    }
}

__global__ void dequant_elem(const __grid_constant__ qg_params p, uint16_t *out) {
    const int64_t n = p.rows * p.cols;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        out[i] = qd_f2bf(qg_weight(p, i / p.cols, i % p.cols));
}

/* ---- the vectorised kernels ---- */

/* The partial sums of one piece (raw, starting at column c0 of x) with n rows of x (bf16 at
 * x + t * ldx), scaled per sub-block, into acc; decoded 8 columns at a time. */
template <class F, int N>
__device__ __forceinline__ void qv_piece_dot(const uint4 &raw, int z, const float *s, const uint16_t *x, int64_t ldx,
                                             int n, float *acc) {
    constexpr int SUBC = F::COLS / F::NSUB;
    float d[N][F::NSUB];
#pragma unroll
    for (int t = 0; t < N; t++)
#pragma unroll
        for (int j = 0; j < F::NSUB; j++) d[t][j] = 0.f;
#pragma unroll
    for (int q8 = 0; q8 < F::COLS / 8; q8++) {
        float w[8];
        F::decode8(raw, q8, z, w);
#pragma unroll
        for (int t = 0; t < N; t++) {
            if (t < n) {
                const uint4 xv = __ldg((const uint4 *)(x + t * ldx) + q8);
                const uint32_t xu[4] = {xv.x, xv.y, xv.z, xv.w};
                float v = d[t][q8 * 8 / SUBC];
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    v = fmaf(w[2 * e], __uint_as_float(xu[e] << 16), v);
                    v = fmaf(w[2 * e + 1], __uint_as_float(xu[e] & 0xffff0000u), v);
                }
                d[t][q8 * 8 / SUBC] = v;
            }
        }
    }
#pragma unroll
    for (int t = 0; t < N; t++)
#pragma unroll
        for (int j = 0; j < F::NSUB; j++) acc[t] = fmaf(s[j], d[t][j], acc[t]);
}

/* ROWS rows per warp: a 4-bit row of 2048 columns is 64 pieces, two per lane, so a warp
 * takes two or four rows at once to keep QV_U pieces per lane in flight. With ROWS > 1 the
 * row's pieces are a multiple of 32 (qv_rows), so the 32 lanes of one load step share a row. */
template <class F, int N, int ROWS>
__global__ void __launch_bounds__(QG_WARPS * 32)
qgemv_vec(const __grid_constant__ qd_cuda_qmats m, const uint16_t *__restrict__ x, int64_t ldx, int n,
          float *__restrict__ y, int64_t ldy, int accumulate) {
    const int lane = threadIdx.x & 31;
    const int np = (int)(m.cols / F::COLS);
    const int64_t r0 = ((int64_t)blockIdx.x * QG_WARPS + (threadIdx.x >> 5)) * ROWS;
    if (r0 >= m.rows) return;
    const int nr = (int)(m.rows - r0 < ROWS ? m.rows - r0 : ROWS), total = nr * np;
    float acc[ROWS][N];
#pragma unroll
    for (int q = 0; q < ROWS; q++)
#pragma unroll
        for (int t = 0; t < N; t++) acc[q][t] = 0.f;
    for (int p0 = 0; p0 < total; p0 += 32 * QV_U) {
        uint4 raw[QV_U];
#pragma unroll
        for (int u = 0; u < QV_U; u++) {
            const int p = p0 + u * 32 + lane, q = ROWS > 1 ? p / np : 0, b = p - q * np;
            raw[u] = p < total ? qd_ld_stream16(m.data + (r0 + q) * m.row_bytes + (size_t)b * 16) : make_uint4(0, 0, 0, 0);
        }
#pragma unroll
        for (int u = 0; u < QV_U; u++) {
            const int p = p0 + u * 32 + lane, q = ROWS > 1 ? p / np : 0, b = p - q * np;
            if (p < total) {
                const qf_row row = qf_row_of(m, 0, r0 + q);
                const int c0 = b * F::COLS;
                float s[F::NSUB];
#pragma unroll
                for (int j = 0; j < F::NSUB; j++) s[j] = F::scale(row, c0, j) * F::post(row);
                if (ROWS == 1) {
                    qv_piece_dot<F, N>(raw[u], F::zero(row, c0), s, x + c0, ldx, n, acc[0]);
                } else {
#pragma unroll
                    for (int qq = 0; qq < ROWS; qq++) /* q is warp-uniform (np % 32 == 0) */
                        if (qq == q) qv_piece_dot<F, N>(raw[u], F::zero(row, c0), s, x + c0, ldx, n, acc[qq]);
                }
            }
        }
    }
#pragma unroll
    for (int q = 0; q < ROWS; q++)
#pragma unroll
        for (int t = 0; t < N; t++) {
            float v = acc[q][t];
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
            if (lane == 0 && t < n && q < nr) {
                float *yp = y + t * ldy + r0 + q;
                *yp = accumulate ? *yp + v : v;
            }
        }
}

/* One thread per piece of the n_mats * rows rows. */
template <class F>
__global__ void dequant_vec(const __grid_constant__ qd_cuda_qmats m, uint16_t *__restrict__ out) {
    const int64_t np = m.cols / F::COLS, total = (int64_t)m.n_mats * m.rows * np;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t R = i / np, b = i - R * np, mat = R / m.rows;
        const qf_row row = qf_row_of(m, mat, R - mat * m.rows);
        const int c0 = (int)b * F::COLS;
        const uint4 raw = __ldg((const uint4 *)(row.q + b * 16));
        const int z = F::zero(row, c0);
        uint4 *o = (uint4 *)(out + R * m.cols + c0);
        const float g = F::post(row); /* applied after the block scale, as the CPU reference does */
        constexpr int SUBC = F::COLS / F::NSUB;
#pragma unroll
        for (int q8 = 0; q8 < F::COLS / 8; q8++) {
            const float s = F::scale(row, c0, q8 * 8 / SUBC);
            float v[8];
            F::decode8(raw, q8, z, v);
#pragma unroll
            for (int e = 0; e < 8; e++) v[e] = v[e] * s * g;
            o[q8] = make_uint4(qd_pack_bf2(v[0], v[1]), qd_pack_bf2(v[2], v[3]), qd_pack_bf2(v[4], v[5]),
                               qd_pack_bf2(v[6], v[7]));
        }
    }
}

/* ---- host side ---- */

extern "C" int qd_cuda_qlayout_vectorised(const qd_weight *w) {
    const qd_weight_scales *s = &w->scales;
    switch (w->dtype) {
    case QD_DTYPE_F8_E4M3:
        return s->dtype == QD_DTYPE_F32 && w->cols % 16 == 0 && s->block_cols % 16 == 0 && s->block_rows >= 1;
    case QD_DTYPE_INT4:
        return s->dtype == QD_DTYPE_F32 && !s->g_idx && w->cols % 32 == 0 && s->block_cols % 32 == 0 &&
               s->block_rows == 1;
    case QD_DTYPE_NVFP4: return s->dtype == QD_DTYPE_F8_E4M3 && w->cols % 32 == 0;
    default: return 0;
    }
}

extern "C" int qd_cuda_qmats_of(const qd_weight *w, qd_cuda_qmats *m) {
    if (!qd_cuda_qlayout_vectorised(w)) return 0;
    const qd_weight_scales *s = &w->scales;
    const int fp4 = w->dtype == QD_DTYPE_NVFP4;
    *m = (qd_cuda_qmats){
        .dtype = w->dtype, .n_mats = 1, .rows = w->rows, .cols = w->cols, .data = (const uint8_t *)w->data,
        .row_bytes = w->dtype == QD_DTYPE_F8_E4M3 ? w->cols : w->cols / 2, .scales = s->data,
        .block_rows = fp4 ? 1 : s->block_rows, .block_cols = fp4 ? 16 : s->block_cols, .nbc = 0, .scale_rows = 0,
        .row_shift = 0, .col_shift = 0, .zeros = s->zeros, .globals = NULL, .global = fp4 ? s->global : 1.0f,
    }; /* the scale grid and shifts: below */
    qd_cuda_qmats_layout(m);
    return 1;
}

static qd_status qg_fill(const qd_weight *w, qg_params *p) {
    const qd_weight_scales *s = &w->scales;
    *p = (qg_params){};
    p->fmt = w->dtype;
    p->rows = w->rows;
    p->cols = w->cols;
    p->q = (const uint8_t *)w->data;
    p->scales = s->data;
    p->scale_dtype = s->dtype;
    p->br = s->block_rows;
    p->bc = s->block_cols;
    p->global = s->global;
    p->zeros = s->zeros;
    p->g_idx = s->g_idx;
    switch (w->dtype) {
    case QD_DTYPE_F8_E4M3:
        if (s->dtype != QD_DTYPE_F32 && s->dtype != QD_DTYPE_BF16 && s->dtype != QD_DTYPE_F16)
            return qd_cuda_fail(QD_ERR_UNSUPPORTED, "quantized weight: F8_E4M3 scales must be F32, BF16 or F16");
        if (p->br < 1 || p->bc < 1) return qd_cuda_fail(QD_ERR_INVALID_ARG, "quantized weight: F8_E4M3 block shape < 1");
        p->nbc = qg_ceil(p->cols, p->bc);
        return QD_OK;
    case QD_DTYPE_NVFP4:
        if (s->dtype != QD_DTYPE_F8_E4M3 || p->cols % 16)
            return qd_cuda_fail(QD_ERR_UNSUPPORTED, "quantized weight: NVFP4 needs F8_E4M3 scales and cols % 16 == 0");
        return QD_OK;
    case QD_DTYPE_INT4:
        if (s->dtype != QD_DTYPE_F32 && s->dtype != QD_DTYPE_BF16 && s->dtype != QD_DTYPE_F16)
            return qd_cuda_fail(QD_ERR_UNSUPPORTED, "quantized weight: INT4 group scales must be F32, BF16 or F16");
        if (p->bc < 1 || p->cols % 2)
            return qd_cuda_fail(QD_ERR_INVALID_ARG, "quantized weight: INT4 group size < 1 or odd cols");
        p->nbc = qg_ceil(p->cols, p->bc);
        return QD_OK;
    default: return qd_cuda_fail(QD_ERR_UNSUPPORTED, "quantized weight: not a quantized format");
    }
}

/* Rows per warp: enough rows for 32 QV_U pieces per warp step when a row's pieces are a
 * multiple of 32 (every released shape), else one. */
static int qv_rows(int64_t pieces) {
    if (pieces % 32) return 1;
    return pieces >= 32 * QV_U ? 1 : pieces >= 16 * QV_U ? 2 : 4;
}

template <class F, int ROWS>
static void qv_launch_rows(const qd_cuda_qmats &m, const uint16_t *x, int64_t ldx, int n, float *y, int64_t ldy,
                           int accumulate, cudaStream_t st) {
    const unsigned blocks = (unsigned)qg_ceil(m.rows, (int64_t)QG_WARPS * ROWS); /* one wave per row group: no tail loop */
    const dim3 b(QG_WARPS * 32);
    if (n <= 1) qgemv_vec<F, 1, ROWS><<<blocks, b, 0, st>>>(m, x, ldx, n, y, ldy, accumulate);
    else if (n <= 2) qgemv_vec<F, 2, ROWS><<<blocks, b, 0, st>>>(m, x, ldx, n, y, ldy, accumulate);
    else if (n <= 4) qgemv_vec<F, 4, ROWS><<<blocks, b, 0, st>>>(m, x, ldx, n, y, ldy, accumulate);
    else if (n <= 8) qgemv_vec<F, 8, ROWS><<<blocks, b, 0, st>>>(m, x, ldx, n, y, ldy, accumulate);
    else qgemv_vec<F, 16, ROWS><<<blocks, b, 0, st>>>(m, x, ldx, n, y, ldy, accumulate);
}

template <class F>
static void qv_launch(const qd_cuda_qmats &m, const uint16_t *x, int64_t ldx, int n, float *y, int64_t ldy,
                      int accumulate, cudaStream_t st) {
    switch (qv_rows(m.cols / F::COLS)) {
    case 1: qv_launch_rows<F, 1>(m, x, ldx, n, y, ldy, accumulate, st); break;
    case 2: qv_launch_rows<F, 2>(m, x, ldx, n, y, ldy, accumulate, st); break;
    default: qv_launch_rows<F, 4>(m, x, ldx, n, y, ldy, accumulate, st); break;
    }
}

static int qg_aligned(const qd_cuda_qmats *m, const uint16_t *d_x, int64_t ldx) {
    return ldx % 8 == 0 && ((uintptr_t)d_x & 15) == 0 && qd_cuda_qmats_aligned(m);
}

extern "C" int qd_cuda_qgemv_choice(const qd_weight *w, const uint16_t *d_x, int64_t ldx) {
    qd_cuda_qmats m;
    if (!qd_cuda_qmats_of(w, &m) || !qg_aligned(&m, d_x, ldx)) return QD_QGEMV_PATH_ELEM;
    return qd_cuda_qgemv_mma_takes(w) ? QD_QGEMV_PATH_MMA : QD_QGEMV_PATH_VEC;
}

extern "C" qd_status qd_cuda_qgemv_path(int path, const qd_weight *w, const uint16_t *d_x, int64_t ldx, int n,
                                        float *d_y, int64_t ldy, int accumulate, void *stream) {
    if (!w || n < 0 || n > QD_CUDA_QGEMV_MAX_N)
        return qd_cuda_fail(QD_ERR_INVALID_ARG, "qgemv: no weight or n outside 0..16");
    if (n == 0 || w->rows == 0) return QD_OK;
    if (!w->data || !w->scales.data || !d_x || !d_y || ldx < w->cols || ldy < w->rows)
        return qd_cuda_fail(QD_ERR_INVALID_ARG, "qgemv: missing weight data, scales, x or y, or a short stride");
    qg_params p;
    qd_status s = qg_fill(w, &p);
    if (s) return s;
    if (path == QD_QGEMV_PATH_TABLE) path = qd_cuda_qgemv_choice(w, d_x, ldx);
    cudaStream_t st = (cudaStream_t)stream;
    qd_cuda_qmats m;
    switch (path) {
    case QD_QGEMV_PATH_MMA: return qd_cuda_qgemv_mma(w, d_x, ldx, n, d_y, ldy, accumulate, stream);
    case QD_QGEMV_PATH_WGMMA: {
        const qd_cuda_qgemv_out o = {.qw = w, .W = NULL, .rows = w->rows, .y = d_y, .ldy = ldy};
        return qd_cuda_qgemv_wgmma(&o, 1, w->cols, d_x, ldx, n, accumulate, 0, 0, stream);
    }
    case QD_QGEMV_PATH_VEC:
        if (!qd_cuda_qmats_of(w, &m) || !qg_aligned(&m, d_x, ldx))
            return qd_cuda_fail(QD_ERR_UNSUPPORTED, "qgemv (pieces): the layout is not vectorised or a stride or "
                                                    "address is not 16-byte aligned");
        if (w->dtype == QD_DTYPE_F8_E4M3) qv_launch<qf_f8>(m, d_x, ldx, n, d_y, ldy, accumulate, st);
        else if (w->dtype == QD_DTYPE_INT4) qv_launch<qf_int4>(m, d_x, ldx, n, d_y, ldy, accumulate, st);
        else qv_launch<qf_nvfp4>(m, d_x, ldx, n, d_y, ldy, accumulate, st);
        QD_CUDA_CHECK_LAUNCH("qgemv");
        return QD_OK;
    case QD_QGEMV_PATH_ELEM: break;
    default: return qd_cuda_fail(QD_ERR_INVALID_ARG, "qgemv: unknown path");
    }
    const int64_t tiles = qg_ceil(w->rows, QG_WARPS), wave = (int64_t)qd_cuda_sm_count() * 8;
    const unsigned blocks = (unsigned)(tiles < wave ? tiles : wave);
    p.n = n;
    p.accumulate = accumulate;
    p.ldx = ldx;
    p.ldy = ldy;
    p.x = d_x;
    p.y = d_y;
    if (n <= 1) qgemv_elem<1><<<blocks, QG_WARPS * 32, 0, st>>>(p);
    else if (n <= 4) qgemv_elem<4><<<blocks, QG_WARPS * 32, 0, st>>>(p);
    else if (n <= 8) qgemv_elem<8><<<blocks, QG_WARPS * 32, 0, st>>>(p);
    else qgemv_elem<16><<<blocks, QG_WARPS * 32, 0, st>>>(p);
    QD_CUDA_CHECK_LAUNCH("qgemv");
    return QD_OK;
}

extern "C" qd_status qd_cuda_qgemv(const qd_weight *w, const uint16_t *d_x, int64_t ldx, int n, float *d_y,
                                   int64_t ldy, int accumulate, void *stream) {
    return qd_cuda_qgemv_path(QD_QGEMV_PATH_TABLE, w, d_x, ldx, n, d_y, ldy, accumulate, stream);
}

static unsigned dq_blocks(int64_t items) {
    const int64_t b = qg_ceil(items, 256), cap = (int64_t)qd_cuda_sm_count() * 16;
    return (unsigned)(b < 1 ? 1 : b < cap ? b : cap);
}

extern "C" qd_status qd_cuda_qmats_dequant_bf16(const qd_cuda_qmats *m, uint16_t *d_out, void *stream) {
    if (!m || !d_out || !m->data || !m->scales)
        return qd_cuda_fail(QD_ERR_INVALID_ARG, "dequant: missing matrices or output");
    const int64_t cols_per_piece = m->dtype == QD_DTYPE_F8_E4M3 ? 16 : 32;
    if (m->cols % cols_per_piece) return qd_cuda_fail(QD_ERR_INVALID_ARG, "dequant: cols outside the layout");
    if (!qd_cuda_qmats_laid_out(m))
        return qd_cuda_fail(QD_ERR_INVALID_ARG, "dequant: the view's scale grid and shifts were not set "
                                                "(qd_cuda_qmats_layout)");
    if (!qd_cuda_qmats_aligned(m))
        return qd_cuda_fail(QD_ERR_INVALID_ARG, "dequant: codes not 16-byte aligned or scales, zero points or "
                                                "factors not 4-byte aligned");
    const int64_t items = (int64_t)m->n_mats * m->rows * (m->cols / cols_per_piece);
    if (items == 0) return QD_OK;
    cudaStream_t st = (cudaStream_t)stream;
    const unsigned blocks = dq_blocks(items);
    switch (m->dtype) {
    case QD_DTYPE_F8_E4M3: dequant_vec<qf_f8><<<blocks, 256, 0, st>>>(*m, d_out); break;
    case QD_DTYPE_INT4: dequant_vec<qf_int4><<<blocks, 256, 0, st>>>(*m, d_out); break;
    case QD_DTYPE_NVFP4: dequant_vec<qf_nvfp4><<<blocks, 256, 0, st>>>(*m, d_out); break;
    default: return qd_cuda_fail(QD_ERR_UNSUPPORTED, "dequant: not a quantized format");
    }
    QD_CUDA_CHECK_LAUNCH("dequant");
    return QD_OK;
}

extern "C" qd_status qd_cuda_dequant_bf16(const qd_weight *w, uint16_t *d_out, void *stream) {
    if (!w || !d_out || !w->data || !w->scales.data)
        return qd_cuda_fail(QD_ERR_INVALID_ARG, "dequant: missing weight data, scales or output");
    qd_cuda_qmats m;
    if (qd_cuda_qmats_of(w, &m) && qd_cuda_qmats_aligned(&m) && ((uintptr_t)d_out & 15) == 0)
        return qd_cuda_qmats_dequant_bf16(&m, d_out, stream);
    qg_params p;
    qd_status s = qg_fill(w, &p);
    if (s) return s;
    if (w->rows * w->cols == 0) return QD_OK;
    dequant_elem<<<dq_blocks(w->rows * w->cols), 256, 0, (cudaStream_t)stream>>>(p, d_out);
    QD_CUDA_CHECK_LAUNCH("dequant");
    return QD_OK;
}
