/* Dummy weights drawn in place on the device (--load-format dummy): the bf16 values of
 * base/dummy_values.h, and for FP8 / INT4 / NVFP4 those values quantized as the host's
 * conversion does (model_quant_online.c), so a CUDA model holds the bytes the CPU backend
 * computes, with no host copy: a 122B-parameter dummy loads in seconds. */
#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/cuda_quant.h"
#include "backend/cuda/cuda_util.h"
#include "backend/cuda/cuda_common.cuh"
#include "base/dummy_values.h"

__global__ void fill_dummy_kernel(uint16_t *__restrict__ d, int64_t n, float scale, uint64_t seed) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        d[i] = qd_f2bf(qd_dummy_value(seed, scale, i)); /* exact: the value is a bf16 */
}

extern "C" qd_status qd_cuda_fill_dummy_bf16(uint16_t *d, int64_t n, float scale, uint64_t seed, void *stream) {
    if (n <= 0) return QD_OK;
    const int64_t blocks = (n + 255) / 256;
    fill_dummy_kernel<<<(unsigned)(blocks < 65535 * 8 ? blocks : 65535 * 8), 256, 0, (cudaStream_t)stream>>>(
        d, n, scale, seed);
    QD_CUDA_CHECK_LAUNCH("fill_dummy");
    return QD_OK;
}

/* FP8, 128 x 128 blocks: a block of 128 threads per scale block, a thread per row of it
 * (the amax, then the codes: each value is drawn twice rather than held). */
__global__ void __launch_bounds__(128)
fill_dummy_fp8_kernel(uint8_t *__restrict__ q, float *__restrict__ s, int64_t R, int64_t C, float scale,
                      uint64_t seed) {
    __shared__ float red[4];
    const int64_t br = blockIdx.y, bc = blockIdx.x, r = br * 128 + threadIdx.x;
    const int64_t c0 = bc * 128, c1 = C - c0 < 128 ? C : c0 + 128;
    float a = 0;
    if (r < R)
        for (int64_t c = c0; c < c1; c++) a = fmaxf(a, fabsf(qd_dummy_value(seed, scale, r * C + c)));
    for (int o = 16; o > 0; o >>= 1) a = fmaxf(a, __shfl_xor_sync(0xffffffffu, a, o));
    if (threadIdx.x % 32 == 0) red[threadIdx.x / 32] = a;
    __syncthreads();
    const float sv = qd_fp8_block_scale(fmaxf(fmaxf(red[0], red[1]), fmaxf(red[2], red[3])));
    if (threadIdx.x == 0) s[br * gridDim.x + bc] = sv;
    if (r < R)
        for (int64_t c = c0; c < c1; c++) q[r * C + c] = qd_round_e4m3(qd_dummy_value(seed, scale, r * C + c) / sv);
}

/* INT4, groups of g (even) along a row, symmetric: a thread per (row, group). */
__global__ void fill_dummy_int4_kernel(uint8_t *__restrict__ q, float *__restrict__ s, int64_t R, int64_t C,
                                       int64_t g, float scale, uint64_t seed) {
    const int64_t G = C / g, t = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (t >= R * G) return;
    const int64_t r = t / G, c0 = (t % G) * g;
    float a = 0;
    for (int64_t c = c0; c < c0 + g; c++) a = fmaxf(a, fabsf(qd_dummy_value(seed, scale, r * C + c)));
    const float sc = qd_int4_group_scale(a);
    s[t] = sc;
    for (int64_t c = c0; c < c0 + g; c += 2) {
        const uint8_t lo = qd_round_int4(qd_dummy_value(seed, scale, r * C + c), sc);
        const uint8_t hi = qd_round_int4(qd_dummy_value(seed, scale, r * C + c + 1), sc);
        q[(r * C + c) / 2] = (uint8_t)(lo | hi << 4);
    }
}

/* NVFP4's global factor, in the device float that will hold it: first the matrix's amax as
 * its bits (non-negative floats order as their bits, so the blocks meet with an integer
 * max; the max is exact in any order), then qd_nvfp4_global of it, in place. */
__global__ void __launch_bounds__(256)
dummy_amax_kernel(unsigned *__restrict__ amax_bits, int64_t n, float scale, uint64_t seed) {
    __shared__ float red[8];
    float a = 0;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        a = fmaxf(a, fabsf(qd_dummy_value(seed, scale, i)));
    for (int o = 16; o > 0; o >>= 1) a = fmaxf(a, __shfl_xor_sync(0xffffffffu, a, o));
    if (threadIdx.x % 32 == 0) red[threadIdx.x / 32] = a;
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < 8; w++) a = fmaxf(a, red[w]);
        atomicMax(amax_bits, __float_as_uint(a));
    }
}

__global__ void dummy_global_kernel(float *global) { *global = qd_nvfp4_global(*global); }

/* NVFP4, blocks of 16 along a row: a thread per (row, block); scales [rows][cols / 16]. */
__global__ void fill_dummy_nvfp4_kernel(uint8_t *__restrict__ q, uint8_t *__restrict__ s, int64_t R, int64_t C,
                                        const float *__restrict__ global, float scale, uint64_t seed) {
    const int64_t B = C / 16, t = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (t >= R * B) return;
    const int64_t i0 = t / B * C + t % B * 16; /* the block's first element */
    const float g = *global;
    float v[16], a = 0;
#pragma unroll
    for (int k = 0; k < 16; k++) {
        v[k] = qd_dummy_value(seed, scale, i0 + k);
        a = fmaxf(a, fabsf(v[k]));
    }
    const uint8_t sc = qd_nvfp4_block_code(a, g);
    s[t] = sc;
    const float eff = qd_f8e4m3_to_f32(sc) * g;
#pragma unroll
    for (int k = 0; k < 16; k += 2)
        q[(i0 + k) / 2] = (uint8_t)(qd_round_e2m1(v[k] / eff) | qd_round_e2m1(v[k + 1] / eff) << 4);
}

static qd_status draw_nvfp4(const qd_weight *w, uint8_t *d_data, uint8_t *d_scales, float *d_global,
                            cudaStream_t st) {
    const int64_t R = w->rows, C = w->cols, n = R * C, blocks = R * (C / 16), grid = (n + 255) / 256;
    QD_CUDA_TRY(cudaMemsetAsync(d_global, 0, sizeof *d_global, st)); /* amax bits of 0.0f */
    dummy_amax_kernel<<<(unsigned)(grid < 4096 ? grid : 4096), 256, 0, st>>>((unsigned *)d_global, n,
                                                                             w->dummy_scale, w->dummy_seed);
    dummy_global_kernel<<<1, 1, 0, st>>>(d_global);
    fill_dummy_nvfp4_kernel<<<(unsigned)((blocks + 127) / 128), 128, 0, st>>>(d_data, d_scales, R, C, d_global,
                                                                              w->dummy_scale, w->dummy_seed);
    QD_CUDA_CHECK_LAUNCH("fill_dummy_nvfp4");
    return QD_OK;
}

extern "C" qd_status qd_cuda_fill_dummy_quant(const qd_weight *w, uint8_t *d_data, void *d_scales, float *d_global,
                                              void *stream) {
    const int64_t R = w->rows, C = w->cols;
    const qd_weight_scales *sc = &w->scales;
    if (R <= 0 || C <= 0) return QD_OK;
    if (w->dtype == QD_DTYPE_F8_E4M3 && sc->block_rows == 128 && sc->block_cols == 128) {
        const dim3 grid((unsigned)((C + 127) / 128), (unsigned)((R + 127) / 128));
        fill_dummy_fp8_kernel<<<grid, 128, 0, (cudaStream_t)stream>>>(d_data, (float *)d_scales, R, C,
                                                                       w->dummy_scale, w->dummy_seed);
    } else if (w->dtype == QD_DTYPE_INT4 && sc->block_rows == 1 && sc->block_cols % 2 == 0 &&
               C % sc->block_cols == 0 && !sc->zeros && !sc->g_idx) {
        const int64_t n = R * (C / sc->block_cols);
        fill_dummy_int4_kernel<<<(unsigned)((n + 127) / 128), 128, 0, (cudaStream_t)stream>>>(
            d_data, (float *)d_scales, R, C, sc->block_cols, w->dummy_scale, w->dummy_seed);
    } else if (w->dtype == QD_DTYPE_NVFP4 && sc->block_rows == 1 && sc->block_cols == 16 && C % 16 == 0 &&
               d_global) {
        return draw_nvfp4(w, d_data, (uint8_t *)d_scales, d_global, (cudaStream_t)stream);
    } else {
        return qd_cuda_fail(QD_ERR_UNSUPPORTED, "fill_dummy_quant: a layout the device does not draw (FP8 in "
                            "128 x 128 blocks, symmetric INT4 in row groups, NVFP4 with a global factor's place)");
    }
    QD_CUDA_CHECK_LAUNCH("fill_dummy_quant");
    return QD_OK;
}
