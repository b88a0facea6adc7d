/* The quantized GEMV on the tensor cores: FP8 (block or per-channel scales) and INT4
 * (groups of a multiple of 128 columns or one group) weights, 1-16 rows of x.
 *
 * Why: the one-warp-per-row kernel of gemv_quant.cu multiplies each decoded weight with
 * fp32 FMAs, and every lane reads the matching x (2 bytes of x per byte of FP8 weight)
 * from L1 and widens it: per byte of weight it issues more instructions than the H200's
 * bandwidth leaves time for (RESULTS session 14: 45% of copy bandwidth at n = 1 for FP8,
 * 22% for 4-bit). Here a block owns 16 output rows and mma.m16n8k16 does the products:
 * a weight element is converted once to bf16 with integer and bf16 ops (exactly: every
 * e4m3 value and every INT4 q - z is a bf16 value) and x is read only by the lanes whose
 * token exists (lanes g < n), as the bf16 tensor-core GEMV of gemm.cu does.
 *
 * Layout of a step (g = lane / 4, t = lane % 4): lane (g, t) loads the 16-byte piece of
 * weight rows g and g + 8 at column F::COLS t of a unit of 4 F::COLS columns (FP8: 64,
 * INT4: 128), so the 4 lanes of a row read 64 contiguous bytes. Its COLS / 2 bf16 words
 * of a row go to COLS / 4 products, two words each; a dot product does not care in which
 * order its columns are summed, so each format pairs columns where its decoding is
 * cheapest (FP8: bytes e and e + 2 of a word, INT4: nibbles e and e + 4) and x is paired
 * the same way. One scale (and zero point) per row and unit: block / group columns a
 * power-of-two multiple of the unit (every released layout: 128) or one block per row, so
 * the unit's partial sums are scaled once per row, as the CPU reference scales the
 * dequantized weight. The warps of a block split the units; their
 * sums meet in shared memory in a fixed order. The warp count depends on the shape only,
 * so a row's result is the same bits whatever n is. Rows past `rows`, columns past
 * `cols` and tokens past n read as zeros. */
#include <stdint.h>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_mma.cuh"
#include "backend/cuda/cuda_pdl.cuh"
#include "backend/cuda/cuda_qformat.cuh"
#include "backend/cuda/cuda_quant.h"
#include "backend/cuda/cuda_util.h"

#define QM_UNROLL 4 /* units per warp in flight */

/* FP8: word i of a row's piece pairs columns 4q + p and 4q + 2 + p (q = i / 2, p = i % 2:
 * bytes p and p + 2 of stored word q), decoded with full-rate integer ops rather than the
 * hardware conversions (e4m3 -> f16 -> f32 -> bf16: F2FP runs at a quarter of the issue
 * rate, and at 2 per pair it bounded the kernel): the byte's exponent and mantissa bits
 * shifted into a bf16's (bits 10..4) and its sign into bit 15 give the e4m3 value times
 * 2^-120 for every code, subnormals included (then bf16 subnormals), and one bf16 multiply
 * by 2^120 makes it the exact value. The NaN codes (0x7f, 0xff) read as +-480 here where
 * the CPU reference gives NaN; quantizers never emit them. */
struct qm_f8 {
    static constexpr int COLS = 16, XU4 = 2; /* x: 16 bf16 = 2 uint4 */
    __device__ static __forceinline__ uint32_t word(const uint4 &raw, int i, uint32_t zz) {
        (void)zz;
        const uint32_t u = qf_word(raw, i / 2), sgn = u & 0x80808080u, mag = 0x07f007f0u;
        /* (a & mag) | (b & ~mag): the signs outside mag are exactly bits 15 and 31 */
        const uint32_t v = (i & 1) ? ((u >> 4) & mag) | (sgn & ~mag) : ((u << 4) & mag) | ((sgn << 8) & ~mag);
        const __nv_bfloat162 r = __hmul2(*reinterpret_cast<const __nv_bfloat162 *>(&v),
                                         __nv_bfloat162(__ushort_as_bfloat16(0x7b80), __ushort_as_bfloat16(0x7b80)));
        return *reinterpret_cast<const uint32_t *>(&r);
    }
    /* x columns 4q + p and 4q + 2 + p: x words 2q (columns 4q, 4q + 1) and 2q + 1 */
    __device__ static __forceinline__ uint32_t xword(const uint4 (&xv)[XU4], int i) {
        const int q = i / 2;
        const uint32_t a = qf_word(xv[q / 2], (q % 2) * 2), b = qf_word(xv[q / 2], (q % 2) * 2 + 1);
        return __byte_perm(a, b, (i & 1) ? 0x7632 : 0x5410);
    }
    __device__ static __forceinline__ uint32_t zero_pair(const qf_row &r, int64_t b) { (void)r; (void)b; return 0; }
};

/* INT4: word i of a row's piece is nibbles k and k + 4 (k = i % 4) of stored word i / 4,
 * columns 8 (i / 4) + k and + 4: (code | 0x4300) as bf16 is 128 + code, and subtracting
 * the pair (128 + z, 128 + z) leaves q - z exactly. */
struct qm_int4 {
    static constexpr int COLS = 32, XU4 = 4; /* x: 32 bf16 = 4 uint4 */
    __device__ static __forceinline__ uint32_t word(const uint4 &raw, int i, uint32_t zz) {
        const uint32_t v = ((qf_word(raw, i / 4) >> (4 * (i % 4))) & 0x000f000fu) | 0x43004300u;
        const __nv_bfloat162 d = __hsub2(*reinterpret_cast<const __nv_bfloat162 *>(&v),
                                         *reinterpret_cast<const __nv_bfloat162 *>(&zz));
        return *reinterpret_cast<const uint32_t *>(&d);
    }
    /* x columns 8w + k and 8w + k + 4 of the piece: x uint4 w holds columns 8w .. 8w + 7
     * as bf16 pairs (01)(23)(45)(67) */
    __device__ static __forceinline__ uint32_t xword(const uint4 (&xv)[XU4], int i) {
        const int w = i / 4, k = i % 4;
        const uint32_t lo = qf_word(xv[w], k / 2), hi = qf_word(xv[w], 2 + k / 2);
        return __byte_perm(lo, hi, (k & 1) ? 0x7632 : 0x5410);
    }
    /* b: the group index in the row */
    __device__ static __forceinline__ uint32_t zero_pair(const qf_row &r, int64_t b) {
        const float z = 128.0f + (r.z ? (float)__ldg(r.z + b) : 8.0f);
        return qd_bf2_pack(z, z);
    }
};

template <class M>
__device__ __forceinline__ uint4 qm_load(const qf_row &r, int live, int64_t col) {
    return live ? qd_ld_stream16(r.q + col / M::COLS * 16) : make_uint4(0, 0, 0, 0);
}

/* Units u0 + j WARPS (j < QM_UNROLL) of rows a and b, zeros past the rows, units or columns. */
template <class M, int WARPS>
__device__ __forceinline__ void qm_load_units(const qf_row &row_a, const qf_row &row_b, int live_a, int live_b,
                                              int64_t cols, int64_t units, int64_t u0, int t, uint4 (&wa)[QM_UNROLL],
                                              uint4 (&wb)[QM_UNROLL]) {
#pragma unroll
    for (int j = 0; j < QM_UNROLL; j++) {
        const int64_t col = (u0 + (int64_t)j * WARPS) * (4 * M::COLS) + M::COLS * t;
        const int in = u0 + (int64_t)j * WARPS < units && col < cols;
        wa[j] = qm_load<M>(row_a, in && live_a, col);
        wb[j] = qm_load<M>(row_b, in && live_b, col);
    }
}

/* Launched as a programmatic dependent (cuda_pdl.cuh): before its wait it reads only weights. */
template <class M, int NT, int WARPS>
__global__ void __launch_bounds__(WARPS * 32)
qgemv_mma_kernel(const __grid_constant__ qd_cuda_qmats m, int block_shift, const uint16_t *__restrict__ x,
                 int64_t ldx, int n, float *__restrict__ y, int64_t ldy, int accumulate) {
    constexpr int UNIT = 4 * M::COLS, KSTEPS = M::COLS / 4;
    __shared__ float part[WARPS][32][4 * NT];
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, g = lane / 4, t = lane % 4;
    const int64_t ra = (int64_t)blockIdx.x * 16 + g, rb = ra + 8;
    const int live_a = ra < m.rows, live_b = rb < m.rows;
    const qf_row row_a = qf_row_of(m, 0, live_a ? ra : m.rows - 1), row_b = qf_row_of(m, 0, live_b ? rb : m.rows - 1);
    const int64_t units = (m.cols + UNIT - 1) / UNIT;
    float c[NT][4];
#pragma unroll
    for (int nt = 0; nt < NT; nt++)
#pragma unroll
        for (int i = 0; i < 4; i++) c[nt][i] = 0.f;
    uint4 wa[QM_UNROLL], wb[QM_UNROLL];
    /* the first units' weights are in flight before the wait for the previous kernel (x) */
    qm_load_units<M, WARPS>(row_a, row_b, live_a, live_b, m.cols, units, warp, t, wa, wb);
    qd_pdl_wait();
    qd_pdl_trigger();
    for (int64_t u0 = warp; u0 < units; u0 += WARPS * QM_UNROLL) {
        if (u0 != warp) qm_load_units<M, WARPS>(row_a, row_b, live_a, live_b, m.cols, units, u0, t, wa, wb);
#pragma unroll
        for (int j = 0; j < QM_UNROLL; j++) {
            const int64_t u = u0 + (int64_t)j * WARPS;
            if (u >= units) break; /* warp-uniform */
            const int64_t col = u * UNIT + M::COLS * t, blk = u >> block_shift; /* the unit's scale block */
            const float sa = __ldg((const float *)row_a.s + blk), sb = __ldg((const float *)row_b.s + blk);
            const uint32_t za = M::zero_pair(row_a, blk), zb = M::zero_pair(row_b, blk);
            float d[NT][4];
#pragma unroll
            for (int nt = 0; nt < NT; nt++) {
                uint4 xv[M::XU4];
                const int tok = nt * 8 + g, xin = tok < n && col < m.cols;
#pragma unroll
                for (int q = 0; q < M::XU4; q++)
                    xv[q] = xin ? __ldg((const uint4 *)(x + tok * ldx + col) + q) : make_uint4(0, 0, 0, 0);
#pragma unroll
                for (int i = 0; i < 4; i++) d[nt][i] = 0.f;
#pragma unroll
                for (int k = 0; k < KSTEPS; k++) {
                    const uint32_t a[4] = {M::word(wa[j], 2 * k, za), M::word(wb[j], 2 * k, zb),
                                           M::word(wa[j], 2 * k + 1, za), M::word(wb[j], 2 * k + 1, zb)};
                    qd_mma16816(d[nt], a, M::xword(xv, 2 * k), M::xword(xv, 2 * k + 1));
                }
            }
#pragma unroll
            for (int nt = 0; nt < NT; nt++) {
                c[nt][0] = fmaf(sa, d[nt][0], c[nt][0]);
                c[nt][1] = fmaf(sa, d[nt][1], c[nt][1]);
                c[nt][2] = fmaf(sb, d[nt][2], c[nt][2]);
                c[nt][3] = fmaf(sb, d[nt][3], c[nt][3]);
            }
        }
    }
#pragma unroll
    for (int nt = 0; nt < NT; nt++)
#pragma unroll
        for (int i = 0; i < 4; i++) part[warp][lane][4 * nt + i] = c[nt][i];
    __syncthreads();
    /* output i of tile nt: accumulator i % 4 of lane i / 4 (C fragment: rows g, g + 8; tokens 2t, 2t + 1) */
    for (int i = (int)threadIdx.x; i < 128 * NT; i += WARPS * 32) {
        const int nt = i / 128, o = i % 128, ol = o / 4, oi = o % 4;
        float v = 0.f;
#pragma unroll
        for (int w = 0; w < WARPS; w++) v += part[w][ol][4 * nt + oi];
        const int64_t row = (int64_t)blockIdx.x * 16 + ol / 4 + (oi >= 2 ? 8 : 0);
        const int tok = nt * 8 + 2 * (ol % 4) + (oi & 1);
        if (tok >= n || row >= m.rows) continue;
        float *out = y + tok * ldy + row;
        *out = accumulate ? *out + v : v;
    }
}

/* Blocks of an instance resident at once on the GPU (the occupancy calculator, asked
 * once per instance). */
template <class M, int WARPS>
static int64_t qm_wave(void) {
    static int per_sm = 0;
    if (!per_sm && (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, qgemv_mma_kernel<M, 1, WARPS>, WARPS * 32,
                                                                  0) != cudaSuccess ||
                    per_sm < 1))
        per_sm = 1;
    return (int64_t)per_sm * qd_cuda_sm_count();
}

/* Warps a block: the most of 16, 8, 4, 2 that keeps every warp's QM_UNROLL units busy and
 * the grid in one wave of the one-token-tile instance (n <= 8: decode; the same count
 * for two tiles, so that the choice does not depend on n); 4 when none does. A grid past
 * one wave ends in a tail of a few blocks per multiprocessor, too few loads in flight to
 * keep the bandwidth busy (H200, bench/quant_cuda_bench, RESULTS session 19: the 27B up
 * projection in FP8, 1,088 blocks, 924 of 4 warps resident, 61% of copy bandwidth; in one
 * wave of 2-warp blocks 63%). */
template <class M>
static int qm_warps(int64_t blocks, int64_t units) {
    if (units >= 16 * QM_UNROLL && blocks <= qm_wave<M, 16>()) return 16;
    if (units >= 8 * QM_UNROLL && blocks <= qm_wave<M, 8>()) return 8;
    if (blocks <= qm_wave<M, 4>()) return 4;
    if (blocks <= qm_wave<M, 2>()) return 2;
    return 4;
}

template <class M, int NT>
static qd_status qm_launch_tiles(const qd_cuda_qmats &m, int shift, int warps, const uint16_t *x, int64_t ldx, int n,
                            float *y, int64_t ldy, int accumulate, cudaStream_t st) {
    const dim3 grid((unsigned)((m.rows + 15) / 16));
    switch (warps) {
    case 16: return qd_launch_pdl(1, qgemv_mma_kernel<M, NT, 16>, grid, dim3(16 * 32), 0, st, m, shift, x, ldx, n, y, ldy, accumulate);
    case 8: return qd_launch_pdl(1, qgemv_mma_kernel<M, NT, 8>, grid, dim3(8 * 32), 0, st, m, shift, x, ldx, n, y, ldy, accumulate);
    case 2: return qd_launch_pdl(1, qgemv_mma_kernel<M, NT, 2>, grid, dim3(2 * 32), 0, st, m, shift, x, ldx, n, y, ldy, accumulate);
    default: return qd_launch_pdl(1, qgemv_mma_kernel<M, NT, 4>, grid, dim3(4 * 32), 0, st, m, shift, x, ldx, n, y, ldy, accumulate);
    }
}

/* Units per scale block as a shift: block columns a power-of-two multiple of the unit, or
 * one block per row (every unit reads block 0); -1 for other layouts. */
static int qm_block_shift(const qd_cuda_qmats &m, int64_t unit) {
    if (m.nbc == 1) return 31;
    if (m.block_cols % unit) return -1;
    for (int sh = 0; sh < 31; sh++)
        if ((unit << sh) == m.block_cols) return sh;
    return -1;
}

static int64_t qm_unit(int dtype) { return dtype == QD_DTYPE_F8_E4M3 ? 64 : dtype == QD_DTYPE_INT4 ? 128 : 0; }

template <class M>
static qd_status qm_launch(const qd_cuda_qmats &m, const uint16_t *x, int64_t ldx, int n, float *y, int64_t ldy,
                           int accumulate, cudaStream_t st) {
    const int64_t units = (m.cols + 4 * M::COLS - 1) / (4 * M::COLS);
    const int warps = qm_warps<M>((m.rows + 15) / 16, units), shift = qm_block_shift(m, 4 * M::COLS);
    if (n <= 8) return qm_launch_tiles<M, 1>(m, shift, warps, x, ldx, n, y, ldy, accumulate, st);
    return qm_launch_tiles<M, 2>(m, shift, warps, x, ldx, n, y, ldy, accumulate, st);
}

extern "C" int qd_cuda_qgemv_mma_takes(const qd_weight *w) {
    qd_cuda_qmats m;
    if (!qd_cuda_qmats_of(w, &m)) return 0;
    const int64_t unit = qm_unit(m.dtype);
    return unit && qm_block_shift(m, unit) >= 0;
}

extern "C" qd_status qd_cuda_qgemv_mma(const qd_weight *w, const uint16_t *d_x, int64_t ldx, int n, float *d_y,
                                       int64_t ldy, int accumulate, void *stream) {
    qd_cuda_qmats m;
    if (!qd_cuda_qgemv_mma_takes(w) || !qd_cuda_qmats_of(w, &m) || ldx % 8 || ((uintptr_t)d_x & 15) ||
        ((uintptr_t)w->data & 15))
        return qd_cuda_fail(QD_ERR_UNSUPPORTED, "qgemv (tensor cores): needs FP8 / INT4 scale blocks of 2^k x 64 / "
                                                "128 columns or one per row, 16-byte aligned weight and x, ldx % 8 == 0");
    if (n < 1 || n > QD_CUDA_QGEMV_MAX_N) return qd_cuda_fail(QD_ERR_INVALID_ARG, "qgemv (tensor cores): n outside 1..16");
    cudaStream_t st = (cudaStream_t)stream;
    if (m.dtype == QD_DTYPE_F8_E4M3) return qm_launch<qm_f8>(m, d_x, ldx, n, d_y, ldy, accumulate, st);
    return qm_launch<qm_int4>(m, d_x, ldx, n, d_y, ldy, accumulate, st);
}
