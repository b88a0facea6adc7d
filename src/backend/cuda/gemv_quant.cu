/* The decode GEMV of quantized weights (cuda_quant.h): one warp per weight row, the
 * row's stored bytes read once (coalesced across the warp), each element dequantized
 * in registers with its block or group scale, multiplied with the n rows of x (read
 * through L1: every warp of the grid reads the same x), fp32 accumulation, a warp
 * shuffle tree per output. The element loop is generic over the layout so that every
 * shape the canonical layouts allow works (partial blocks, odd cols); it is the
 * correct first version, not yet the vectorised 16-byte-piece loop of gemv_fused.cu. */
#include <math.h>
#include <stdint.h>

#include "backend/cuda/cuda_quant.h"
#include <cuda_fp16.h>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_util.h"

#define QG_WARPS 8

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

/* e4m3: sign, 4 exponent bits (bias 7), 3 mantissa bits; subnormals m * 2^-9; S.1111.111 NaN. */
__device__ __forceinline__ float qg_e4m3(uint32_t v) {
    const uint32_t e = (v >> 3) & 15, m = v & 7;
    float mag = e ? __uint_as_float(((e + 120) << 23) | (m << 20)) : (float)m * 0.001953125f;
    if (e == 15 && m == 7) mag = __uint_as_float(0x7fc00000u);
    return (v & 0x80) ? -mag : mag;
}

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
    default: return qg_e4m3(__ldg((const unsigned char *)p.scales + i)); /* NVFP4: e4m3 */
    }
}

/* The dequantized element (r, c). */
__device__ __forceinline__ float qg_weight(const qg_params &p, int64_t r, int64_t c) {
    if (p.fmt == QD_DTYPE_F8_E4M3) {
        const float s = qg_scale(p, (r / p.br) * p.nbc + c / p.bc);
        return qg_e4m3(__ldcs(p.q + r * p.cols + c)) * s;
    }
    const uint32_t b = __ldcs(p.q + (r * p.cols + c) / 2);
    const uint32_t v = (c & 1) ? b >> 4 : b & 15;
    if (p.fmt == QD_DTYPE_NVFP4) return qg_e2m1(v) * qg_scale(p, r * (p.cols / 16) + c / 16) * p.global;
    const int64_t g = (p.g_idx ? (int64_t)__ldg(p.g_idx + c) : c / p.bc) + r * p.nbc;
    const int z = p.zeros ? (int)__ldg(p.zeros + g) : 8;
    return (float)((int)v - z) * qg_scale(p, g);
}

template <int N>
__global__ void __launch_bounds__(QG_WARPS * 32) qgemv_kernel(const __grid_constant__ qg_params p) {
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

static int64_t qg_ceil(int64_t a, int64_t b) { return (a + b - 1) / b; }

extern "C" qd_status qd_cuda_qgemv(const qd_weight *w, const uint16_t *d_x, int64_t ldx, int n, float *d_y,
                                   int64_t ldy, int accumulate, void *stream) {
    if (!w || n < 0 || n > QD_CUDA_QGEMV_MAX_N)
        return qd_cuda_fail(QD_ERR_INVALID_ARG, "qgemv: no weight or n outside 0..16");
    if (n == 0 || w->rows == 0) return QD_OK;
    if (!w->data || !w->scales.data || !d_x || !d_y || ldx < w->cols || ldy < w->rows)
        return qd_cuda_fail(QD_ERR_INVALID_ARG, "qgemv: missing weight data, scales, x or y, or a short stride");
    const qd_weight_scales *s = &w->scales;
    qg_params p = {};
    p.fmt = w->dtype;
    p.n = n;
    p.accumulate = accumulate;
    p.rows = w->rows;
    p.cols = w->cols;
    p.ldx = ldx;
    p.ldy = ldy;
    p.q = (const uint8_t *)w->data;
    p.scales = s->data;
    p.scale_dtype = s->dtype;
    p.br = s->block_rows;
    p.bc = s->block_cols;
    p.global = s->global;
    p.zeros = s->zeros;
    p.g_idx = s->g_idx;
    p.x = d_x;
    p.y = d_y;
    switch (w->dtype) {
    case QD_DTYPE_F8_E4M3:
        if (s->dtype != QD_DTYPE_F32 && s->dtype != QD_DTYPE_BF16 && s->dtype != QD_DTYPE_F16)
            return qd_cuda_fail(QD_ERR_UNSUPPORTED, "qgemv: F8_E4M3 weight scales must be F32, BF16 or F16");
        if (p.br < 1 || p.bc < 1) return qd_cuda_fail(QD_ERR_INVALID_ARG, "qgemv: F8_E4M3 block shape < 1");
        p.nbc = qg_ceil(p.cols, p.bc);
        break;
    case QD_DTYPE_NVFP4:
        if (s->dtype != QD_DTYPE_F8_E4M3 || p.cols % 16)
            return qd_cuda_fail(QD_ERR_UNSUPPORTED, "qgemv: NVFP4 needs F8_E4M3 scales and cols % 16 == 0");
        break;
    case QD_DTYPE_INT4:
        if (s->dtype != QD_DTYPE_F32 && s->dtype != QD_DTYPE_BF16 && s->dtype != QD_DTYPE_F16)
            return qd_cuda_fail(QD_ERR_UNSUPPORTED, "qgemv: INT4 group scales must be F32, BF16 or F16");
        if (p.bc < 1 || p.cols % 2) return qd_cuda_fail(QD_ERR_INVALID_ARG, "qgemv: INT4 group size < 1 or odd cols");
        p.nbc = qg_ceil(p.cols, p.bc);
        break;
    default: return qd_cuda_fail(QD_ERR_UNSUPPORTED, "qgemv: the weight is not a quantized format");
    }
    static int sms = 0; /* one wave of 8 blocks per SM; the count asked once */
    if (!sms) {
        int dev = 0, v = 0;
        sms = cudaGetDevice(&dev) == cudaSuccess &&
                      cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, dev) == cudaSuccess && v > 0
                  ? v
                  : 132;
    }
    const int64_t tiles = qg_ceil(p.rows, QG_WARPS), wave = (int64_t)sms * 8;
    const unsigned blocks = (unsigned)(tiles < wave ? tiles : wave);
    cudaStream_t st = (cudaStream_t)stream;
    if (n <= 1) qgemv_kernel<1><<<blocks, QG_WARPS * 32, 0, st>>>(p);
    else if (n <= 4) qgemv_kernel<4><<<blocks, QG_WARPS * 32, 0, st>>>(p);
    else if (n <= 8) qgemv_kernel<8><<<blocks, QG_WARPS * 32, 0, st>>>(p);
    else qgemv_kernel<16><<<blocks, QG_WARPS * 32, 0, st>>>(p);
    QD_CUDA_CHECK_LAUNCH("qgemv");
    return QD_OK;
}
