/* The quantized GEMV on the tensor cores: FP8 (block or per-channel scales), INT4 (groups
 * of 2^k x 128 columns or one group) and NVFP4 weights, 1-16 rows of x, with the bf16
 * parts of a stack beside them in the same launch.
 *
 * Why: the one-warp-per-row kernel of gemv_quant.cu multiplies each decoded weight with
 * fp32 FMAs, and every lane reads the matching x (2 bytes of x per byte of FP8 weight)
 * from L1 and widens it: per byte of weight it issues more instructions than the H200's
 * bandwidth leaves time for (RESULTS session 14: 45% of copy bandwidth at n = 1 for FP8,
 * 22% for 4-bit). Here a block owns 16 output rows and mma.m16n8k16 does the products:
 * a weight element is converted once to bf16 with integer and bf16 ops (exactly: every
 * e4m3 value, every INT4 q - z and every NVFP4 e2m1 times its e4m3 scale is a bf16
 * value) and x is read only by the lanes whose token exists (lanes g < n), as the bf16
 * tensor-core GEMV of gemm.cu does.
 *
 * Layout of a step (g = lane / 4, t = lane % 4): lane (g, t) loads the 16-byte piece of
 * weight rows g and g + 8 at column M::COLS t of a unit of 4 M::COLS columns (FP8: 64,
 * INT4 and NVFP4: 128, bf16: 32), so the 4 lanes of a row read 64 contiguous bytes. Its
 * COLS / 2 bf16 words of a row go to COLS / 4 products, two words each; a dot product
 * does not care in which order its columns are summed, so each format pairs columns where
 * its decoding is cheapest (FP8: bytes e and e + 2 of a word, INT4 and NVFP4: nibbles e
 * and e + 4) and x is paired the same way. One scale (and zero point) per row and unit: block / group columns a
 * power-of-two multiple of the unit (every released layout: 128) or one block per row, so
 * the unit's partial sums are scaled once per row, as the CPU reference scales the
 * dequantized weight (NVFP4's 16-column blocks scale the weights as they are decoded, its
 * global factor the tile's sums). The warps of a block split the units; their
 * sums meet in shared memory in a fixed order. The warp count depends on the shape only,
 * so a row's result is the same bits whatever n is. Rows past `rows`, columns past
 * `cols` and tokens past n read as zeros. x is bf16 rows read in place, or (BUILD) made
 * by each block in shared memory from the projection's input (linear_input.cuh: the bits
 * the materialising kernels write) where qm_build_fits says that pays. */
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
#include "backend/cuda/linear_input.cuh"

#define QM_UNROLL 4 /* units per warp in flight */

/* FP8: word i of a row's piece pairs columns 4q + p and 4q + 2 + p (q = i / 2, p = i % 2:
 * bytes p and p + 2 of stored word q), decoded with integer ops and one bf16 multiply
 * rather than the hardware conversions (e4m3 -> f16 -> f32 -> bf16, two F2FP a pair, a
 * quarter-rate instruction: H200, RESULTS session 19, the 27B down projection at n = 1
 * took 44.1 us with them, 34.6 with these ops): the byte's exponent and mantissa bits
 * shifted into a bf16's (bits 10..4) and its sign into bit 15 give the e4m3 value times
 * 2^-120 for every code, subnormals included (then bf16 subnormals), and one bf16 multiply
 * by 2^120 makes it the exact value (test_cuda_quant draws every code but NaN). The NaN codes (0x7f, 0xff) read as +-480 here where
 * the CPU reference gives NaN; quantizers never emit them. */
struct qm_f8 {
    static constexpr int COLS = 16, XU4 = 2; /* x: 16 bf16 = 2 uint4 */
    static constexpr bool SCALED = true, POST = false;
    __device__ static __forceinline__ uint32_t word(const uint4 &raw, int i, const uint2 &uc) {
        (void)uc;
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
    __device__ static __forceinline__ uint2 unit_consts(const qf_row &r, int64_t b, int col, bool in) {
        (void)r; (void)b; (void)col; (void)in;
        return make_uint2(0, 0);
    }
};

/* INT4: word i of a row's piece is nibbles k and k + 4 (k = i % 4) of stored word i / 4,
 * columns 8 (i / 4) + k and + 4: (code | 0x4300) as bf16 is 128 + code, and subtracting
 * the pair (128 + z, 128 + z) leaves q - z exactly. */
struct qm_int4 {
    static constexpr int COLS = 32, XU4 = 4; /* x: 32 bf16 = 4 uint4 */
    static constexpr bool SCALED = true, POST = false;
    __device__ static __forceinline__ uint32_t word(const uint4 &raw, int i, const uint2 &uc) {
        const uint32_t v = ((qf_word(raw, i / 4) >> (4 * (i % 4))) & 0x000f000fu) | 0x43004300u;
        const __nv_bfloat162 d = __hsub2(*reinterpret_cast<const __nv_bfloat162 *>(&v),
                                         *reinterpret_cast<const __nv_bfloat162 *>(&uc.x));
        return *reinterpret_cast<const uint32_t *>(&d);
    }
    /* x columns 8w + k and 8w + k + 4 of the piece: x uint4 w holds columns 8w .. 8w + 7
     * as bf16 pairs (01)(23)(45)(67) */
    __device__ static __forceinline__ uint32_t xword(const uint4 (&xv)[XU4], int i) {
        const int w = i / 4, k = i % 4;
        const uint32_t lo = qf_word(xv[w], k / 2), hi = qf_word(xv[w], 2 + k / 2);
        return __byte_perm(lo, hi, (k & 1) ? 0x7632 : 0x5410);
    }
    /* the pair (128 + z, 128 + z); b: the group index in the row */
    __device__ static __forceinline__ uint2 unit_consts(const qf_row &r, int64_t b, int col, bool in) {
        (void)col; (void)in;
        const float z = 128.0f + (r.z ? (float)__ldg(r.z + b) : 8.0f);
        return make_uint2(qd_bf2_pack(z, z), 0);
    }
};

/* NVFP4: word i of a row's piece is nibbles k and k + 4 (k = i % 4) of stored word i / 4,
 * columns 8 (i / 4) + k and + 4 as for INT4, both in the piece's 16-column scale block
 * i / 8. A nibble's exponent and mantissa bits in a bf16's bits 8..6 and its sign in bit
 * 15 give the e2m1 value times 2^-126 for every code (the one subnormal, 0.5, a bf16
 * subnormal); a bf16 multiply by 2^126 makes it the value and a second by the block's
 * e4m3 scale the dequantized weight over the matrix's global factor, both exactly (2 and
 * 4 significant bits fit a bf16's 8). The tensor cores need the scale before they sum: a
 * k-step adds columns of the four lanes' pieces, which lie in different scale blocks. The
 * global factor scales the tile's sums once (post). */
struct qm_nvfp4 {
    static constexpr int COLS = 32, XU4 = 4;
    static constexpr bool SCALED = false, POST = true;
    __device__ static __forceinline__ uint32_t word(const uint4 &raw, int i, const uint2 &uc) {
        const uint32_t u = qf_word(raw, i / 4) >> (4 * (i % 4));
        const uint32_t v = ((u & 0x00070007u) << 6) | ((u & 0x00080008u) << 12);
        const __nv_bfloat162 d = __hmul2(*reinterpret_cast<const __nv_bfloat162 *>(&v),
                                         __nv_bfloat162(__ushort_as_bfloat16(0x7e80), __ushort_as_bfloat16(0x7e80)));
        const __nv_bfloat162 w = __hmul2(d, *reinterpret_cast<const __nv_bfloat162 *>(i < 8 ? &uc.x : &uc.y));
        return *reinterpret_cast<const uint32_t *>(&w);
    }
    __device__ static __forceinline__ uint32_t xword(const uint4 (&xv)[XU4], int i) { return qm_int4::xword(xv, i); }
    /* the scale pairs of the piece's two blocks, from column col (the piece's first; in:
     * col < cols, else none: past the row's scales) */
    __device__ static __forceinline__ uint2 unit_consts(const qf_row &r, int64_t b, int col, bool in) {
        (void)b;
        const float2 sc = qf_e4m3x2(in ? __ldg((const unsigned short *)((const uint8_t *)r.s + col / 16)) : 0);
        return make_uint2(qd_bf2_pack(sc.x, sc.x), qd_bf2_pack(sc.y, sc.y));
    }
    /* the matrix's global factor, applied to a tile's sums */
    __device__ static __forceinline__ float post(const qd_cuda_qmats &m) {
        return qf_global_of(m, 0);
    }
};

/* bf16 weights (the unquantized parts of a stack, GDN in_proj_a / b beside an FP8
 * in_proj_qkvz): 8 columns a piece, word i is columns 2i, 2i + 1 as stored, no scale. */
struct qm_bf16 {
    static constexpr int COLS = 8, XU4 = 1;
    static constexpr bool SCALED = false, POST = false;
    __device__ static __forceinline__ uint32_t word(const uint4 &raw, int i, const uint2 &uc) {
        (void)uc;
        return qf_word(raw, i);
    }
    __device__ static __forceinline__ uint32_t xword(const uint4 (&xv)[XU4], int i) { return qf_word(xv[0], i); }
    __device__ static __forceinline__ uint2 unit_consts(const qf_row &r, int64_t b, int col, bool in) {
        (void)r; (void)b; (void)col; (void)in;
        return make_uint2(0, 0);
    }
};

/* Units u0 + j WARPS (j < QM_UNROLL) of the lane's two rows: pa / pb point at the lane's
 * piece of unit 0 (a unit is 4 pieces); zeros past the units, the columns (tcol: the lane's
 * first column in a unit) or a row. */
template <class M, int WARPS>
__device__ __forceinline__ void qm_load_units(const uint4 *pa, const uint4 *pb, int live_a, int live_b, int cols,
                                              int units, int tcol, int u0, uint4 (&wa)[QM_UNROLL],
                                              uint4 (&wb)[QM_UNROLL]) {
#pragma unroll
    for (int j = 0; j < QM_UNROLL; j++) {
        const int u = u0 + j * WARPS;
        const int in = u < units && u * (4 * M::COLS) + tcol < cols;
        wa[j] = in && live_a ? qd_ld_stream16(pa + 4 * u) : make_uint4(0, 0, 0, 0);
        wb[j] = in && live_b ? qd_ld_stream16(pb + 4 * u) : make_uint4(0, 0, 0, 0);
    }
}

/* One call: up to QD_CUDA_QGEMV_MULTI_MAX products sharing x, their 16-row tiles
 * concatenated over the grid (product j owns blocks tile_end[j - 1] .. tile_end[j] - 1). */
struct qm_call {
    qd_cuda_lin_in in;   /* the input: bf16 x read in place (QD_LIN_BF16), or built by each block */
    int n_out;
    qd_cuda_qmats m[QD_CUDA_QGEMV_MULTI_MAX]; /* dtype QD_DTYPE_BF16: a plain weight, no scales */
    int shift[QD_CUDA_QGEMV_MULTI_MAX];      /* units per scale block as a shift (qm_block_shift) */
    int64_t tile_end[QD_CUDA_QGEMV_MULTI_MAX];
    float *y[QD_CUDA_QGEMV_MULTI_MAX];
    int64_t ldy[QD_CUDA_QGEMV_MULTI_MAX];
};

/* The lane's sums c of 16-row tile `tile` of m: rows tile 16 + g and + 8, tokens of its
 * C fragment (see the top). Offsets within a row are 32-bit (the host keeps cols below
 * 2^31) and every pointer is formed once, outside the loop over units: the per-unit work
 * is the loads, the decode and the products. */
template <class M, int NT, int WARPS, bool BUILD>
__device__ __forceinline__ void qm_tile(const qd_cuda_qmats &m, int block_shift, int64_t tile,
                                        const uint16_t *__restrict__ x, int64_t ldx, const qd_cuda_lin_in &in,
                                        uint4 *xs, int n, bool first, float (&c)[NT][4]) {
    constexpr int UNIT = 4 * M::COLS, KSTEPS = M::COLS / 4;
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, g = lane / 4, t = lane % 4;
    const int64_t ra = tile * 16 + g, rb = ra + 8;
    const int live_a = ra < m.rows, live_b = rb < m.rows;
    const qf_row row_a = qf_row_of(m, 0, live_a ? ra : m.rows - 1), row_b = qf_row_of(m, 0, live_b ? rb : m.rows - 1);
    const int cols = (int)m.cols, units = (cols + UNIT - 1) / UNIT, tcol = M::COLS * t;
    const uint4 *pa = (const uint4 *)row_a.q + t, *pb = (const uint4 *)row_b.q + t;
    const float *sa = (const float *)row_a.s, *sb = (const float *)row_b.s;
    uint4 wa[QM_UNROLL], wb[QM_UNROLL];
    /* the first units' weights are in flight before the wait for the previous kernel (x),
     * in the block's first tile */
    qm_load_units<M, WARPS>(pa, pb, live_a, live_b, cols, units, tcol, warp, wa, wb);
    if (first) { /* block-uniform */
        qd_pdl_wait();
        qd_pdl_trigger();
        if (BUILD) { /* x made here (a norm or activation) once a block, for all its tiles */
            qd_lin_build_x<WARPS * 32>(in, m.cols, n, xs);
            __syncthreads();
        }
    }
    if (BUILD) ldx = m.cols;
    /* the lane's x: token nt 8 + g from column tcol of unit 0, or none */
    const uint4 *xp[NT];
    bool xtok[NT];
#pragma unroll
    for (int nt = 0; nt < NT; nt++) {
        const int tok = nt * 8 + g;
        xtok[nt] = tok < n;
        xp[nt] = (BUILD ? (const uint4 *)xs : (const uint4 *)x) + ((xtok[nt] ? tok : 0) * ldx + tcol) / 8;
    }
    for (int u0 = warp; u0 < units; u0 += WARPS * QM_UNROLL) {
        if (u0 != warp) qm_load_units<M, WARPS>(pa, pb, live_a, live_b, cols, units, tcol, u0, wa, wb);
#pragma unroll
        for (int j = 0; j < QM_UNROLL; j++) {
            const int u = u0 + j * WARPS;
            if (u >= units) break; /* warp-uniform */
            const int col = u * UNIT + tcol, blk = u >> block_shift; /* the unit's scale block */
            const float s_a = M::SCALED ? __ldg(sa + blk) : 1.f;
            const float s_b = M::SCALED ? __ldg(sb + blk) : 1.f;
            const uint2 za = M::unit_consts(row_a, blk, col, col < cols);
            const uint2 zb = M::unit_consts(row_b, blk, col, col < cols);
            const bool cin = col < cols;
            float d[NT][4];
#pragma unroll
            for (int nt = 0; nt < NT; nt++) {
                uint4 xv[M::XU4];
                const bool xin = xtok[nt] && cin;
#pragma unroll
                for (int q = 0; q < M::XU4; q++)
                    xv[q] = !xin    ? make_uint4(0, 0, 0, 0)
                            : BUILD ? xp[nt][u * (UNIT / 8) + q]
                                    : __ldcg(xp[nt] + u * (UNIT / 8) + q);
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
                c[nt][0] = fmaf(s_a, d[nt][0], c[nt][0]);
                c[nt][1] = fmaf(s_a, d[nt][1], c[nt][1]);
                c[nt][2] = fmaf(s_b, d[nt][2], c[nt][2]);
                c[nt][3] = fmaf(s_b, d[nt][3], c[nt][3]);
            }
        }
    }
    if constexpr (M::POST) { /* a factor of the whole matrix */
        const float f = M::post(m);
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
#pragma unroll
            for (int i = 0; i < 4; i++) c[nt][i] *= f;
    }
}

/* Launched as a programmatic dependent (cuda_pdl.cuh): before its wait it reads only
 * weights. Q: the quantized format of the call's quantized products (its others are bf16).
 * A block takes tiles blockIdx.x, + gridDim.x, ...: one where x is read in place (the grid
 * is every tile), several where the blocks build x (the grid is what is resident at once,
 * qm_build_blocks), so that x is built once a block. A tile's result is the same bits
 * either way. */
template <class Q, int NT, int WARPS, bool BUILD>
__global__ void __launch_bounds__(WARPS * 32)
qgemv_mma_kernel(const __grid_constant__ qm_call p, const uint16_t *__restrict__ x, int64_t ldx, int n,
                 int accumulate) {
    extern __shared__ uint4 qm_xs[]; /* [n][cols / 8] x when the block builds it */
    __shared__ float part[WARPS][32][4 * NT];
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const int64_t tiles = p.tile_end[p.n_out - 1];
    /* a block's tiles: blockIdx.x, + gridDim.x, ... (one where the grid covers them all) */
    for (int64_t bt = blockIdx.x; bt < tiles; bt += gridDim.x) {
        const bool first = bt == (int64_t)blockIdx.x;
        if (!first) __syncthreads(); /* the previous tile's outputs have read `part` */
        int j = 0;
        while (j + 1 < p.n_out && bt >= p.tile_end[j]) j++;
        const int64_t tile = bt - (j ? p.tile_end[j - 1] : 0);
        const qd_cuda_qmats &m = p.m[j];
        float c[NT][4];
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
#pragma unroll
            for (int i = 0; i < 4; i++) c[nt][i] = 0.f;
        if (m.dtype == QD_DTYPE_BF16) /* block-uniform */
            qm_tile<qm_bf16, NT, WARPS, BUILD>(m, 31, tile, x, ldx, p.in, qm_xs, n, first, c);
        else qm_tile<Q, NT, WARPS, BUILD>(m, p.shift[j], tile, x, ldx, p.in, qm_xs, n, first, c);
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
            const int64_t row = tile * 16 + ol / 4 + (oi >= 2 ? 8 : 0);
            const int tok = nt * 8 + 2 * (ol % 4) + (oi & 1);
            if (tok >= n || row >= m.rows) continue;
            float *out = p.y[j] + tok * p.ldy[j] + row;
            *out = accumulate ? *out + v : v;
        }
    }
}

/* Blocks of an instance resident at once per SM without dynamic shared memory (the
 * occupancy calculator, asked once per instance). */
template <class Q, int WARPS, bool BUILD>
static int qm_per_sm(void) {
    static int per_sm = 0;
    if (!per_sm && (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, qgemv_mma_kernel<Q, 1, WARPS, BUILD>,
                                                                  WARPS * 32, 0) != cudaSuccess ||
                    per_sm < 1))
        per_sm = 1;
    return per_sm;
}

/* Blocks of the x-in-place instance resident at once on the GPU: the wave the warp count
 * is planned with. */
template <class Q, int WARPS>
static int64_t qm_wave(void) {
    return (int64_t)qm_per_sm<Q, WARPS, false>() * qd_cuda_sm_count();
}

/* Warps a block, from the shape alone (the one-token-tile instance's residency; the same
 * count for two tiles, so that the choice does not depend on n). Measured on the H200
 * (bench/quant_cuda_bench's warp sweep, RESULTS session 22), FP8 and INT4 alike:
 *   - a grid of at most one block per multiprocessor: 16 (the GDN out projection and an
 *     expert's matrices: 5.5 against 7.5 us with 8 for the 35B-A3B's GDN out in FP8);
 *   - else 8 where the grid fills whole waves of 8-warp blocks: at most one, or about two
 *     or three (a partial second wave is a tail with too few loads in flight: the
 *     35B-A3B's attention q, 512 blocks over 396 resident, took 10.0 us with 8 and 8.3
 *     with 4; its GDN in_proj, 772 over 396, 12.1 with 8 and 13.3 with 2);
 *   - else 4 where the grid is one wave of those, else 2 (the lm_head shape, 15,520 blocks:
 *     127 us with 2, 164 with 8). */
template <class Q>
static int qm_warps(int64_t blocks) {
    if (blocks <= qd_cuda_sm_count()) return 16;
    const int64_t w8 = qm_wave<Q, 8>();
    if (blocks <= w8 || (blocks * 10 >= w8 * 18 && blocks <= w8 * 3)) return 8;
    if (blocks <= qm_wave<Q, 4>()) return 4;
    return 2;
}

template <class Q, int NT, bool BUILD>
static qd_status qm_launch_tiles(const qm_call &c, int warps, int64_t blocks, size_t smem, int n, int accumulate,
                                 cudaStream_t st) {
    const dim3 grid((unsigned)blocks);
    void (*k)(const qm_call, const uint16_t *, int64_t, int, int);
    switch (warps) {
    case 16: k = qgemv_mma_kernel<Q, NT, 16, BUILD>; break;
    case 8: k = qgemv_mma_kernel<Q, NT, 8, BUILD>; break;
    case 2: k = qgemv_mma_kernel<Q, NT, 2, BUILD>; break;
    default: k = qgemv_mma_kernel<Q, NT, 4, BUILD>, warps = 4; break;
    }
    return qd_launch_pdl(1, k, grid, dim3(warps * 32), smem, st, c, c.in.x, c.in.ldx, n, accumulate);
}

/* Units per scale block as a shift: block columns a power-of-two multiple of the unit, or
 * one block per row (every unit reads block 0); -1 for other layouts. NVFP4's 16-column
 * blocks are applied in the decode (qm_nvfp4), its pieces whole (qd_cuda_qmats_of: cols %
 * 32 == 0): no unit scale. */
static int qm_block_shift(const qd_cuda_qmats &m, int64_t unit) {
    if (m.nbc == 1 || m.dtype == QD_DTYPE_NVFP4) return 31;
    const int us = qd_cuda_shift_of(unit);
    return us >= 0 && m.col_shift >= us && m.col_shift != 31 ? m.col_shift - us : -1;
}

static int64_t qm_unit(int dtype) {
    return dtype == QD_DTYPE_F8_E4M3 ? 64 : dtype == QD_DTYPE_INT4 || dtype == QD_DTYPE_NVFP4 ? 128 : 0;
}

template <class Q> static int64_t qm_build_blocks(int64_t tiles, int64_t cols, int n, int warps);

/* warps: the table's (qm_warps) when 0 */
template <class Q>
static qd_status qm_launch(const qm_call &c, int64_t cols, int n, int accumulate, int warps, cudaStream_t st) {
    const int64_t tiles = c.tile_end[c.n_out - 1];
    if (!warps) warps = qm_warps<Q>(tiles);
    if (c.in.kind == QD_LIN_BF16) {
        if (n <= 8) return qm_launch_tiles<Q, 1, false>(c, warps, tiles, 0, n, accumulate, st);
        return qm_launch_tiles<Q, 2, false>(c, warps, tiles, 0, n, accumulate, st);
    }
    const int64_t blocks = qm_build_blocks<Q>(tiles, cols, n, warps);
    if (blocks < 1) return qd_cuda_fail(QD_ERR_UNSUPPORTED, "qgemv (tensor cores): x does not fit a block to build");
    const size_t smem = (size_t)n * (size_t)cols * 2;
    if (n <= 8) return qm_launch_tiles<Q, 1, true>(c, warps, blocks, smem, n, accumulate, st);
    return qm_launch_tiles<Q, 2, true>(c, warps, blocks, smem, n, accumulate, st);
}

/* Shared memory of one multiprocessor (asked once). */
static size_t qm_sm_smem(void) {
    static int bytes = 0;
    if (!bytes && (cudaDeviceGetAttribute(&bytes, cudaDevAttrMaxSharedMemoryPerMultiprocessor, 0) != cudaSuccess ||
                   bytes < 1))
        bytes = 1;
    return (size_t)bytes;
}

/* The blocks of a call whose blocks build x themselves (else x is materialised first: the
 * same bits), or 0 where they may not. Every block builds the whole x before its products,
 * so this pays only where a block has at least 4 warps for the norm's sums and x is short:
 * measured on the H200 (RESULTS 2026-12-03), the built x saved 1.3 us on the
 * Qwen3.5-35B-A3B's attention q (4-warp blocks, 2048 columns) and 0.5 us on its GDN out
 * projection (16 warps, 4096 columns), and cost 3-5% of the 27B's decode (5120 columns and
 * more, SwiGLU inputs of 17408). x must fit the 48 KiB a launch has without opting in,
 * beside the kernel's own shared memory (1 KiB of each block's is the system's). The grid
 * is at most what is resident at once: a block takes several tiles rather than a second
 * wave building x again (the GDN in_proj's 772 tiles, two waves of 8-warp blocks, cost
 * 1.5 us more built than materialised when each tile was a block). */
template <class Q> static int64_t qm_build_blocks(int64_t tiles, int64_t cols, int n, int warps) {
    if (warps < 4 || cols > 4096) return 0;
    const size_t x_bytes = (size_t)n * (size_t)cols * 2;
    const size_t statics = (size_t)warps * 32 * 4 * 4 * (n <= 8 ? 1 : 2) /* `part` */ +
                           (QD_LIN_BUILD_MAX_N * (QD_LIN_NORM_NT / 32 + 1)) * 4 /* the norm's */;
    if (x_bytes + statics > 48 * 1024) return 0;
    const int build = warps == 16 ? qm_per_sm<Q, 16, true>() : warps == 8 ? qm_per_sm<Q, 8, true>()
                                                                        : qm_per_sm<Q, 4, true>();
    const int by_smem = (int)(qm_sm_smem() / (x_bytes + statics + 1024)), resident = build < by_smem ? build : by_smem;
    const int64_t wave = (int64_t)resident * qd_cuda_sm_count();
    return tiles < wave ? tiles : wave;
}

template <class Q> static int qm_build_fits(int64_t tiles, int64_t cols, int n) {
    return qm_build_blocks<Q>(tiles, cols, n, qm_warps<Q>(tiles)) > 0;
}

extern "C" int qd_cuda_qgemv_mma_takes(const qd_weight *w) {
    qd_cuda_qmats m;
    if (!qd_cuda_qmats_of(w, &m)) return 0;
    const int64_t unit = qm_unit(m.dtype);
    return unit && qm_block_shift(m, unit) >= 0;
}

/* The call's products alone (their formats, shapes and alignment), whatever builds x. */
static int qm_outs_take(const qd_cuda_qgemv_out *out, int n_out, int64_t cols) {
    /* the kernel's offsets within a row are 32-bit */
    if (n_out < 1 || n_out > QD_CUDA_QGEMV_MULTI_MAX || cols < 8 || cols % 8 || cols > ((int64_t)1 << 30)) return 0;
    int fmt = 0;
    for (int j = 0; j < n_out; j++) {
        if (out[j].qw) {
            if (out[j].qw->cols != cols || out[j].qw->rows != out[j].rows || !qd_cuda_qgemv_mma_takes(out[j].qw) ||
                !qd_lin_al16(out[j].qw->data) || (fmt && fmt != out[j].qw->dtype))
                return 0;
            fmt = out[j].qw->dtype;
        } else if (!out[j].W || !qd_lin_al16(out[j].W)) {
            return 0;
        }
    }
    return fmt; /* at least one quantized product: the warps follow its format */
}

static int64_t qm_tiles(const qd_cuda_qgemv_out *out, int n_out) {
    int64_t tiles = 0;
    for (int j = 0; j < n_out; j++) tiles += (out[j].rows + 15) / 16;
    return tiles;
}

extern "C" int qd_cuda_qgemv_multi_in_takes(const qd_cuda_qgemv_out *out, int n_out, int64_t cols,
                                            const qd_cuda_lin_in *in, int n) {
    const int fmt = qm_outs_take(out, n_out, cols);
    if (!fmt || !in || !qd_lin_buildable(in, cols) || n < 1 || n > QD_CUDA_QGEMV_MAX_N) return 0;
    if (in->kind == QD_LIN_BF16) return 1;
    const int64_t tiles = qm_tiles(out, n_out);
    switch (fmt) {
    case QD_DTYPE_F8_E4M3: return qm_build_fits<qm_f8>(tiles, cols, n);
    case QD_DTYPE_NVFP4: return qm_build_fits<qm_nvfp4>(tiles, cols, n);
    default: return qm_build_fits<qm_int4>(tiles, cols, n);
    }
}

/* x as bf16 rows read in place. */
static qd_cuda_lin_in qm_in_bf16(const uint16_t *d_x, int64_t ldx) {
    qd_cuda_lin_in in = {};
    in.kind = QD_LIN_BF16;
    in.x = d_x;
    in.ldx = ldx;
    return in;
}

extern "C" int qd_cuda_qgemv_multi_takes(const qd_cuda_qgemv_out *out, int n_out, int64_t cols, const uint16_t *d_x,
                                         int64_t ldx) {
    const qd_cuda_lin_in in = qm_in_bf16(d_x, ldx);
    return qm_outs_take(out, n_out, cols) && qd_lin_buildable(&in, cols);
}

static qd_status qm_multi(const qd_cuda_qgemv_out *out, int n_out, int64_t cols, const qd_cuda_lin_in *in, int n,
                          int accumulate, int warps, void *stream) {
    if (n < 1 || n > QD_CUDA_QGEMV_MAX_N) return qd_cuda_fail(QD_ERR_INVALID_ARG, "qgemv (tensor cores): n outside 1..16");
    if (!qd_cuda_qgemv_multi_in_takes(out, n_out, cols, in, n))
        return qd_cuda_fail(QD_ERR_UNSUPPORTED, "qgemv (tensor cores): needs FP8 / INT4 scale blocks of 2^k x 64 / "
                                                "128 columns or one per row, or NVFP4 with cols % 32 == 0 (one "
                                                "format a call, bf16 beside it), "
                                                "16-byte aligned weights and inputs, cols and ldx % 8 == 0, and an "
                                                "input built in shared memory within its limits");
    qm_call c = {};
    c.in = *in;
    c.n_out = n_out;
    int fmt = 0;
    int64_t tiles = 0;
    for (int j = 0; j < n_out; j++) {
        if (out[j].qw) {
            qd_cuda_qmats_of(out[j].qw, &c.m[j]);
            c.shift[j] = qm_block_shift(c.m[j], qm_unit(c.m[j].dtype));
            fmt = out[j].qw->dtype;
        } else {
            c.m[j] = qd_cuda_qmats_bf16(out[j].W, out[j].rows, cols);
            c.shift[j] = 31;
        }
        if (!out[j].y || out[j].ldy < out[j].rows)
            return qd_cuda_fail(QD_ERR_INVALID_ARG, "qgemv (tensor cores): no y or a short stride");
        tiles += (out[j].rows + 15) / 16;
        c.tile_end[j] = tiles;
        c.y[j] = out[j].y;
        c.ldy[j] = out[j].ldy;
    }
    if (tiles == 0) return QD_OK;
    if (tiles > INT32_MAX) return qd_cuda_fail(QD_ERR_UNSUPPORTED, "qgemv (tensor cores): too many rows");
    cudaStream_t st = (cudaStream_t)stream;
    switch (fmt) {
    case QD_DTYPE_F8_E4M3: return qm_launch<qm_f8>(c, cols, n, accumulate, warps, st);
    case QD_DTYPE_NVFP4: return qm_launch<qm_nvfp4>(c, cols, n, accumulate, warps, st);
    default: return qm_launch<qm_int4>(c, cols, n, accumulate, warps, st);
    }
}

extern "C" qd_status qd_cuda_qgemv_multi_in(const qd_cuda_qgemv_out *out, int n_out, int64_t cols,
                                            const qd_cuda_lin_in *in, int n, int accumulate, void *stream) {
    return qm_multi(out, n_out, cols, in, n, accumulate, 0, stream);
}

extern "C" qd_status qd_cuda_qgemv_multi(const qd_cuda_qgemv_out *out, int n_out, int64_t cols, const uint16_t *d_x,
                                         int64_t ldx, int n, int accumulate, void *stream) {
    const qd_cuda_lin_in in = qm_in_bf16(d_x, ldx);
    return qd_cuda_qgemv_multi_in(out, n_out, cols, &in, n, accumulate, stream);
}

extern "C" qd_status qd_cuda_qgemv_mma(const qd_weight *w, const uint16_t *d_x, int64_t ldx, int n, float *d_y,
                                       int64_t ldy, int accumulate, void *stream) {
    return qd_cuda_qgemv_mma_warps(w, d_x, ldx, n, d_y, ldy, accumulate, 0, stream);
}

extern "C" qd_status qd_cuda_qgemv_mma_warps(const qd_weight *w, const uint16_t *d_x, int64_t ldx, int n, float *d_y,
                                             int64_t ldy, int accumulate, int warps, void *stream) {
    if (!w) return qd_cuda_fail(QD_ERR_INVALID_ARG, "qgemv (tensor cores): no weight");
    if (warps != 0 && warps != 2 && warps != 4 && warps != 8 && warps != 16)
        return qd_cuda_fail(QD_ERR_INVALID_ARG, "qgemv (tensor cores): warps must be 0 (the table's), 2, 4, 8 or 16");
    const qd_cuda_qgemv_out o = {.qw = w, .W = NULL, .rows = w->rows, .y = d_y, .ldy = ldy};
    const qd_cuda_lin_in in = qm_in_bf16(d_x, ldx);
    return qm_multi(&o, 1, w->cols, &in, n, accumulate, warps, stream);
}
