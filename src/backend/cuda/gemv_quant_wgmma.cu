/* The FP8 GEMV on Hopper's FP8 tensor cores (wgmma): W8A16 without a per-weight decode.
 *
 * Why: the tensor-core GEMV of gemv_quant_mma.cu converts every e4m3 weight to bf16 for
 * mma.sync (on sm_90 an e4m3 mma.sync is lowered to conversions and f16 MMAs), and that
 * decode bounds it at 45-50% of copy bandwidth (RESULTS session 22). wgmma multiplies the
 * stored e4m3 bytes as they are; what needs converting is x, which is small.
 *
 * x in e4m3, exactly: per token and 128-column block, s = 2^E, the least power of two
 * with max |x| <= 448 s, and x / s = t1 + t2 / 16 with t1 = e4m3(x / s) and t2 =
 * e4m3(16 (x / s - t1)), both rounded to nearest even. A bf16 has 8 significant bits, t1
 * takes the top 4 and the remainder (a multiple of t1's ulp / 8, at most half an ulp)
 * fits t2's 4, so the split is exact for every element within 2^-15 of its block's
 * maximum (t1 normal); smaller ones keep an absolute error below 2^-19 s. t1 and t2 are
 * two columns of B, so a token is B columns 2 tok and 2 tok + 1, and y = s_w s (D1 +
 * D2 / 16) per block.
 *
 * The hardware's sum (MMA-Sim, arXiv:2511.10909): a k32 wgmma adds its 32 products in one
 * fused node, each truncated to 13 fractional bits below the largest product's exponent,
 * and truncates the result to 14 significant bits; an accumulator passed in joins that
 * node as one more term. So every wgmma here starts from zero (scale-d 0) and its result
 * is added to an fp32 sum by the threads: the error of a 32-column group is at most
 * 2^-13 (32 max |w x| + |sum|), without growing with the row's length (test_cuda_quant's
 * bound for this kernel).
 *
 * Layout: a block owns a 64-row tile and one K slice; lane (g, t) of warp w of a
 * warpgroup holds the 16-byte pieces of rows 16 w + g and + 8 at column 16 t of each
 * 64-column unit, which are the A fragments of two wgmmas (bytes 0-7 and 8-15: a dot
 * product does not care in which order its columns are summed, so B holds x in the
 * matching order). The block's WG warpgroups split its slice's 128-column blocks in runs,
 * and a cluster of KS blocks splits a row's blocks: each block builds B for its slice
 * only, and the partial sums meet in shared memory and then, through distributed shared
 * memory, in rank and warpgroup order. The bf16 products of a stack (GDN in_proj_a /
 * b beside an FP8 in_proj_qkvz) take the same tiles and slices with one warp a row and
 * fp32 FMAs. Whatever n is, a row's sums are the same operations in the same order. */
#include <stdint.h>

#include <cooperative_groups.h>
#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_pdl.cuh"
#include "backend/cuda/cuda_qformat.cuh"
#include "backend/cuda/cuda_quant.h"
#include "backend/cuda/cuda_util.h"
#include "backend/cuda/cuda_wgmma.cuh"
#include "backend/cuda/linear_input.cuh"

namespace cg = cooperative_groups;

#define QW_STAGES 3 /* 128-column blocks of weights in flight a thread (5 measured no faster: RESULTS session 23) */
#define QW_SMEM_MAX (160 * 1024)

typedef struct qw_call {
    int n_out;
    qd_cuda_qmats m[QD_CUDA_QGEMV_MULTI_MAX]; /* dtype QD_DTYPE_BF16: a plain weight */
    int shift[QD_CUDA_QGEMV_MULTI_MAX];      /* 128-column blocks per scale block as a shift; 31: one a row */
    int64_t tile_end[QD_CUDA_QGEMV_MULTI_MAX]; /* in 64-row tiles */
    float *y[QD_CUDA_QGEMV_MULTI_MAX];
    int64_t ldy[QD_CUDA_QGEMV_MULTI_MAX];
    const uint16_t *x;
    int64_t ldx;
    int n, ks, nblk, bpr; /* tokens, ranks of a cluster, 128-column blocks of a row, blocks a rank */
    int accumulate;
} qw_call;

/* The smallest E with a <= 448 2^E (a = 0: 0), kept where 2^-E is a normal float. */
__device__ __forceinline__ int qw_exp(float a) {
    if (!(a > 0.f)) return 0;
    int e;
    const float m = frexpf(a, &e); /* a = m 2^e, m in [0.5, 1); 448 = 0.875 2^9 */
    const int E = m <= 0.875f ? e - 9 : e - 8;
    return E < -100 ? -100 : E > 100 ? 100 : E;
}

__device__ __forceinline__ uint32_t qw_e4m3(float v) {
    return (uint32_t)__nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3);
}
__device__ __forceinline__ float qw_f32(uint32_t q) {
    const __half_raw h = __nv_cvt_fp8_to_halfraw((__nv_fp8_storage_t)q, __NV_E4M3);
    return __half2float(__half(h));
}

/* B's columns and the block scales zeroed (tokens from n to 4 NG stay so): shared memory
 * only, so before the wait. */
template <int WG, int NG>
__device__ __forceinline__ void qw_zero_b(int nb, uint8_t *B, float *sx) {
    uint4 *b4 = (uint4 *)B;
    for (int i = (int)threadIdx.x; i < nb * 4 * NG * 16; i += WG * 128) b4[i] = make_uint4(0, 0, 0, 0);
    for (int i = (int)threadIdx.x; i < nb * 4 * NG; i += WG * 128) sx[i] = 0.f;
}

#define QW_BUILD_UNROLL 4 /* x pieces a warp has in flight */

/* B and the block scales of the rank's nb blocks from x (after qw_zero_b): a warp per
 * (block, token) pair, its loads for QW_BUILD_UNROLL pairs issued before any is used; lane
 * l holds the block's columns 4 l .. 4 l + 3. B of local block lb is 4 k32 steps of NG x
 * 256 bytes; step 2 u + j holds the columns whose unit is u and whose byte within their
 * lane's 16-byte piece is 8 j .. 8 j + 7. */
template <int WG, int NG>
__device__ __forceinline__ void qw_build_b(const qw_call &p, int64_t cols, int b0, int nb, uint8_t *B, float *sx) {
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, pairs = nb * p.n;
    const int unit = lane / 16, tq = (lane % 16) / 4, j = (lane % 4) / 2, chunk = lane % 2;
    for (int pr0 = warp; pr0 < pairs; pr0 += 4 * WG * QW_BUILD_UNROLL) {
        uint2 raw[QW_BUILD_UNROLL];
#pragma unroll
        for (int i = 0; i < QW_BUILD_UNROLL; i++) {
            const int pr = pr0 + i * 4 * WG, lb = pr / p.n, tok = pr % p.n;
            const int64_t col = (int64_t)(b0 + lb) * 128 + 4 * lane;
            raw[i] = pr < pairs && col < cols ? __ldcg((const uint2 *)(p.x + tok * p.ldx + col)) : make_uint2(0, 0);
        }
#pragma unroll
        for (int i = 0; i < QW_BUILD_UNROLL; i++) {
            const int pr = pr0 + i * 4 * WG, lb = pr / p.n, tok = pr % p.n;
            if (pr >= pairs) break; /* warp-uniform */
            const float v[4] = {__uint_as_float(raw[i].x << 16), __uint_as_float(raw[i].x & 0xffff0000u),
                                __uint_as_float(raw[i].y << 16), __uint_as_float(raw[i].y & 0xffff0000u)};
            float a = fmaxf(fmaxf(fabsf(v[0]), fabsf(v[1])), fmaxf(fabsf(v[2]), fabsf(v[3])));
#pragma unroll
            for (int o = 16; o; o >>= 1) a = fmaxf(a, __shfl_xor_sync(0xffffffffu, a, o));
            const int E = qw_exp(a);
            const float inv = __uint_as_float((uint32_t)(127 - E) << 23);
            uint32_t w1 = 0, w2 = 0;
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const float u = v[e] * inv; /* exact: a power of two */
                const uint32_t q1 = qw_e4m3(u);
                const uint32_t q2 = qw_e4m3((u - qw_f32(q1)) * 16.f);
                w1 |= q1 << (8 * e);
                w2 |= q2 << (8 * e);
            }
            uint8_t *step = B + (size_t)(lb * 4 + 2 * unit + j) * (NG * 256) + chunk * 128 + 4 * tq;
            const int c1 = 2 * tok; /* B column of t1; t2 is the next */
            *(uint32_t *)(step + (c1 / 8) * 256 + (c1 % 8) * 16) = w1;
            *(uint32_t *)(step + (c1 / 8) * 256 + (c1 % 8 + 1) * 16) = w2;
            if (lane == 0) sx[lb * 4 * NG + tok] = __uint_as_float((uint32_t)(127 + E) << 23);
        }
    }
}

/* The tile's 64 rows of FP8 matrix m over warpgroup q's share of the rank's blocks b0 ..
 * b0 + nb - 1 (the q-th of WG runs of ceil(nb / WG)): acc[h][0 / 1] the sums of rows 16 w
 * + g / + 8 for token 4 h + t. */
template <int WG, int NG>
__device__ __forceinline__ void qw_fp8_rows(const qw_call &p, const qd_cuda_qmats &m, int shift, int64_t tile,
                                            int b0, int nb, uint8_t *B, float *sx, bool &built,
                                            float (&acc)[NG][2]) {
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, g = lane / 4, t = lane % 4;
    const int64_t ra = tile * 64 + (warp % 4) * 16 + g, rb = ra + 8;
    const int share = (nb + WG - 1) / WG, q0 = (warp / 4) * share, q1 = q0 + share < nb ? q0 + share : nb;
    const int live_a = ra < m.rows, live_b = rb < m.rows;
    const qf_row row_a = qf_row_of(m, 0, live_a ? ra : m.rows - 1), row_b = qf_row_of(m, 0, live_b ? rb : m.rows - 1);
    const int cols = (int)m.cols;
    const uint4 *pa = (const uint4 *)row_a.q + t, *pb = (const uint4 *)row_b.q + t;
    const float *sa = (const float *)row_a.s, *sb = (const float *)row_b.s;
    uint4 wa[QW_STAGES][2], wb[QW_STAGES][2];
    float swa[QW_STAGES], swb[QW_STAGES];
    /* local block lb into stage s (zeros past the share, the columns or the rows) */
    auto load = [&](int s, int lb) {
        const int b = b0 + lb;
#pragma unroll
        for (int u = 0; u < 2; u++) {
            const int in = lb < q1 && b * 128 + u * 64 + 16 * t < cols;
            wa[s][u] = in && live_a ? qd_ld_stream16(pa + b * 8 + u * 4) : make_uint4(0, 0, 0, 0);
            wb[s][u] = in && live_b ? qd_ld_stream16(pb + b * 8 + u * 4) : make_uint4(0, 0, 0, 0);
        }
        const int blk = lb < q1 ? b >> shift : 0;
        swa[s] = __ldg(sa + blk);
        swb[s] = __ldg(sb + blk);
    };
#pragma unroll
    for (int s = 0; s < QW_STAGES; s++) load(s, q0 + s);
    if (!built) { /* block-uniform: B serves every FP8 tile of the block (one K slice, one x) */
        qw_zero_b<WG, NG>(nb, B, sx);
        __syncthreads(); /* zeros before the build's stores */
        qd_pdl_wait(); /* x is the previous kernel's */
        qd_pdl_trigger();
        qw_build_b<WG, NG>(p, m.cols, b0, nb, B, sx);
        asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); /* B's stores, for wgmma's reads */
        __syncthreads();
        built = true;
    }
    constexpr int PASSES = NG == 4 ? 2 : 1, PER = 4 / PASSES; /* wgmmas a pass: D registers in flight */
    for (int lb0 = q0; lb0 < q1; lb0 += QW_STAGES) {
#pragma unroll
        for (int s = 0; s < QW_STAGES; s++) {
            const int lb = lb0 + s;
            if (lb >= q1) break; /* warpgroup-uniform */
            const uint8_t *bb = B + (size_t)lb * 4 * NG * 256;
            float ca[NG], cb[NG];
#pragma unroll
            for (int h = 0; h < NG; h++) ca[h] = cb[h] = 0.f;
#pragma unroll
            for (int pass = 0; pass < PASSES; pass++) {
                float d[PER][8 * NG / 2];
                uint32_t a[PER][4];
#pragma unroll
                for (int k = 0; k < PER; k++) {
                    const int step = pass * PER + k, u = step / 2, j = step % 2;
                    a[k][0] = j ? wa[s][u].z : wa[s][u].x;
                    a[k][1] = j ? wb[s][u].z : wb[s][u].x;
                    a[k][2] = j ? wa[s][u].w : wa[s][u].y;
                    a[k][3] = j ? wb[s][u].w : wb[s][u].y;
                }
                qd_wgmma_fence();
#pragma unroll
                for (int k = 0; k < PER; k++)
                    qd_wgmma_f8<NG>::run(d[k], a[k], qd_wgmma_desc(bb + (pass * PER + k) * NG * 256, 128, 256));
                qd_wgmma_commit();
                qd_wgmma_wait0();
#pragma unroll
                for (int k = 0; k < PER; k++) {
#pragma unroll
                    for (int i = 0; i < 4; i++) qd_wgmma_keep(a[k][i]);
#pragma unroll
                    for (int i = 0; i < 4 * NG; i++) qd_wgmma_keep(d[k][i]);
                }
#pragma unroll
                for (int k = 0; k < PER; k++)
#pragma unroll
                    for (int h = 0; h < NG; h++) {
                        ca[h] += fmaf(d[k][4 * h + 1], 0.0625f, d[k][4 * h]);
                        cb[h] += fmaf(d[k][4 * h + 3], 0.0625f, d[k][4 * h + 2]);
                    }
            }
#pragma unroll
            for (int h = 0; h < NG; h++) {
                const float s_x = sx[lb * 4 * NG + 4 * h + t];
                acc[h][0] = fmaf(ca[h], s_x * swa[s], acc[h][0]);
                acc[h][1] = fmaf(cb[h], s_x * swb[s], acc[h][1]);
            }
            load(s, lb + QW_STAGES);
        }
    }
}

/* The tile's 64 rows of bf16 matrix m over the rank's columns: a warp a row, fp32 FMAs in
 * a fixed order, into part[row][token]. */
template <int WG, int NG>
__device__ __forceinline__ void qw_bf16_rows(const qw_call &p, const qd_cuda_qmats &m, int64_t tile, int b0, int nb,
                                             float (*part)[4 * NG]) {
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    qd_pdl_wait();
    qd_pdl_trigger();
    const int64_t c0 = (int64_t)b0 * 128, c1 = (int64_t)(b0 + nb) * 128 < m.cols ? (int64_t)(b0 + nb) * 128 : m.cols;
    for (int rl = warp; rl < 64; rl += 4 * WG) {
        const int64_t row = tile * 64 + rl;
        float a[4 * NG];
#pragma unroll
        for (int k = 0; k < 4 * NG; k++) a[k] = 0.f;
        if (row < m.rows) {
            const uint16_t *W = (const uint16_t *)(m.data + row * m.row_bytes);
            for (int64_t c = c0 + 8 * lane; c < c1; c += 256) {
                const uint4 wv = qd_ld_stream16(W + c);
                float w[8];
                qf_bf16::decode8(wv, 0, 0, w);
#pragma unroll
                for (int k = 0; k < 4 * NG; k++) {
                    if (k >= p.n) break;
                    const uint4 xv = __ldcg((const uint4 *)(p.x + k * p.ldx + c));
                    float x[8];
                    qf_bf16::decode8(xv, 0, 0, x);
#pragma unroll
                    for (int e = 0; e < 8; e++) a[k] = fmaf(w[e], x[e], a[k]);
                }
            }
        }
#pragma unroll
        for (int k = 0; k < 4 * NG; k++) {
#pragma unroll
            for (int o = 16; o; o >>= 1) a[k] += __shfl_xor_sync(0xffffffffu, a[k], o);
        }
        if (lane == 0)
#pragma unroll
            for (int k = 0; k < 4 * NG; k++) part[rl][k] = a[k];
    }
}

/* Launched as a programmatic dependent (before its wait it reads only weights and
 * scales), in clusters of p.ks blocks along K when CLUSTER. The grid is at most the blocks
 * resident at once: a cluster walks the tiles cluster, cluster + clusters, ..., each block
 * keeping its K slice, so x is converted once a block. */
template <int WG, int NG, bool CLUSTER>
__global__ void __launch_bounds__(WG * 128, WG <= 4 ? 4 / WG : 1) qgemv_wgmma_kernel(const __grid_constant__ qw_call p) {
    extern __shared__ __align__(128) uint8_t qw_smem[]; /* B [bpr][4][NG][256], then sx [bpr][4 NG] */
    __shared__ float part[WG][64][4 * NG]; /* [warpgroup][row][token] */
    const int rank = CLUSTER ? (int)(blockIdx.x % (unsigned)p.ks) : 0;
    const int64_t cid = CLUSTER ? (int64_t)(blockIdx.x / (unsigned)p.ks) : (int64_t)blockIdx.x;
    const int64_t clusters = CLUSTER ? (int64_t)(gridDim.x / (unsigned)p.ks) : (int64_t)gridDim.x;
    const int b0 = rank * p.bpr, left = p.nblk - b0, nb = left < 0 ? 0 : left < p.bpr ? left : p.bpr;
    uint8_t *B = qw_smem;
    float *sx = (float *)(qw_smem + (size_t)p.bpr * 4 * NG * 256);
    bool built = false;
    for (int64_t tile_g = cid; tile_g < p.tile_end[p.n_out - 1]; tile_g += clusters) {
        int j = 0;
        while (j + 1 < p.n_out && tile_g >= p.tile_end[j]) j++;
        const int64_t tile = tile_g - (j ? p.tile_end[j - 1] : 0);
        const qd_cuda_qmats &m = p.m[j];
        if (m.dtype == QD_DTYPE_BF16) { /* block-uniform */
            qw_bf16_rows<WG, NG>(p, m, tile, b0, nb, part[0]);
        } else {
            float acc[NG][2];
#pragma unroll
            for (int h = 0; h < NG; h++) acc[h][0] = acc[h][1] = 0.f;
            qw_fp8_rows<WG, NG>(p, m, p.shift[j], tile, b0, nb, B, sx, built, acc);
            const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
            const int q = warp / 4, r = (warp % 4) * 16 + lane / 4, t = lane % 4;
#pragma unroll
            for (int h = 0; h < NG; h++) {
                part[q][r][4 * h + t] = acc[h][0];
                part[q][r + 8][4 * h + t] = acc[h][1];
            }
        }
        /* rank r sums rows r per .. (r + 1) per - 1 over the ranks and their warpgroups, in
         * that order (a bf16 tile has its sums in warpgroup 0's part) */
        const int per = 64 / p.ks, parts = m.dtype == QD_DTYPE_BF16 ? 1 : WG;
        if (CLUSTER) cg::this_cluster().sync();
        else __syncthreads();
        for (int i = (int)threadIdx.x; i < per * p.n; i += WG * 128) {
            const int rl = rank * per + i / p.n, tok = i % p.n;
            const int64_t row = tile * 64 + rl;
            if (row >= m.rows) continue;
            float v = 0.f;
            for (int r = 0; r < (CLUSTER ? p.ks : 1); r++)
                for (int q = 0; q < parts; q++)
                    v += CLUSTER ? cg::this_cluster().map_shared_rank(&part[q][rl][tok], r)[0] : part[q][rl][tok];
            float *out = p.y[j] + tok * p.ldy[j] + row;
            *out = p.accumulate ? *out + v : v;
        }
        /* the parts are read (by the other ranks too) before the next tile writes them */
        if (CLUSTER) cg::this_cluster().sync();
        else __syncthreads();
    }
}

template <int WG, int NG, bool CLUSTER>
static qd_status qw_launch_instance(const qw_call &c, size_t smem, cudaStream_t st) {
    void (*k)(const qw_call) = qgemv_wgmma_kernel<WG, NG, CLUSTER>;
    static int opted = 0;
    if (!opted) {
        qd_status s = qd_cuda_status(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, QW_SMEM_MAX),
                                     "cudaFuncSetAttribute");
        if (s) return s;
        opted = 1;
    }
    const int64_t tiles = c.tile_end[c.n_out - 1];
    static size_t asked_smem = (size_t)-1; /* the residency of the last size asked (calls repeat shapes) */
    static int per_sm = 1;
    if (smem != asked_smem) {
        if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, k, WG * 128, smem) != cudaSuccess || per_sm < 1)
            per_sm = 1;
        asked_smem = smem;
    }
    /* as many rounds of tiles as the resident clusters need, the same count for each */
    int64_t resident = (int64_t)per_sm * qd_cuda_sm_count() / c.ks;
    if (resident < 1) resident = 1;
    const int64_t rounds = (tiles + resident - 1) / resident, clusters = (tiles + rounds - 1) / rounds;
    return qd_launch_pdl_cluster(1, k, dim3((unsigned)(clusters * c.ks)), dim3(WG * 128),
                                 dim3(CLUSTER ? (unsigned)c.ks : 1u, 1, 1), smem, st, c);
}

template <int WG, int NG>
static qd_status qw_launch_ng(const qw_call &c, size_t smem, cudaStream_t st) {
    return c.ks > 1 ? qw_launch_instance<WG, NG, true>(c, smem, st) : qw_launch_instance<WG, NG, false>(c, smem, st);
}

template <int WG>
static qd_status qw_launch_wg(const qw_call &c, size_t smem, cudaStream_t st) {
    if (c.n <= 4) return qw_launch_ng<WG, 1>(c, smem, st);
    if (c.n <= 8) return qw_launch_ng<WG, 2>(c, smem, st);
    return qw_launch_ng<WG, 4>(c, smem, st);
}

static size_t qw_smem_bytes(int bpr, int n) {
    const int ng = n <= 4 ? 1 : n <= 8 ? 2 : 4;
    return (size_t)bpr * 4 * ng * 256 + (size_t)bpr * 4 * ng * 4;
}

/* 128-column blocks per scale block as a shift (31: one block a row), -1 for others. */
static int qw_block_shift(const qd_cuda_qmats &m) {
    if (m.nbc == 1) return 31;
    for (int sh = 0; sh < 31; sh++)
        if (((int64_t)128 << sh) == m.block_cols) return sh;
    return -1;
}

extern "C" int qd_cuda_qgemv_wgmma_takes(const qd_cuda_qgemv_out *out, int n_out, int64_t cols, const uint16_t *d_x,
                                         int64_t ldx) {
    if (n_out < 1 || n_out > QD_CUDA_QGEMV_MULTI_MAX || cols % 16 || cols > ((int64_t)1 << 30) || !d_x ||
        !qd_lin_al16(d_x) || ldx % 8 || ldx < cols)
        return 0;
    int fp8 = 0;
    for (int j = 0; j < n_out; j++) {
        if (out[j].qw) {
            qd_cuda_qmats m;
            if (out[j].qw->dtype != QD_DTYPE_F8_E4M3 || out[j].qw->cols != cols || out[j].qw->rows != out[j].rows ||
                !qd_cuda_qmats_of(out[j].qw, &m) || qw_block_shift(m) < 0 || !qd_lin_al16(m.data))
                return 0;
            fp8 = 1;
        } else if (!out[j].W || !qd_lin_al16(out[j].W)) {
            return 0;
        }
    }
    return fp8;
}

/* Warpgroups a block and ranks a cluster, from the shape alone (so a row's sums do not
 * depend on n). Measured on the H200 (bench/quant_cuda_bench's sweep, RESULTS session 23),
 * us at n = 1: where the 64-row tiles fill the multiprocessors, every tile in one round of
 * the most warpgroups that allows (4 for at most one tile a multiprocessor: attention q,
 * 128 tiles, 7.6 against 8.6 with 2; 2 for at most two: the GDN in_proj, 193 tiles, 9.9
 * against 11.8 with 4 and 13.8 with 1), else one warpgroup walking its tiles (the lm_head
 * shape: 137); with fewer tiles than multiprocessors, clusters of the fewest ranks that
 * reach them while a rank keeps at least 2 blocks of columns (GDN out, 32 tiles: 6.3 with
 * 8 ranks, 8.4 with 4 warpgroups alone); more ranks where a rank's B would not fit. */
static void qw_table(int64_t tiles, int nblk, int *wg, int *ks) {
    const int64_t sms = qd_cuda_sm_count();
    int k = 1;
    while (k < 8 && tiles * k < sms && (nblk + 2 * k - 1) / (2 * k) >= 2) k *= 2;
    while (k < 8 && qw_smem_bytes((nblk + k - 1) / k, 16) > QW_SMEM_MAX) k *= 2;
    *ks = k;
    *wg = k > 1 ? 1 : tiles <= sms ? 4 : tiles <= 2 * sms ? 2 : 1;
}

extern "C" qd_status qd_cuda_qgemv_wgmma(const qd_cuda_qgemv_out *out, int n_out, int64_t cols, const uint16_t *d_x,
                                         int64_t ldx, int n, int accumulate, int wg, int ks, void *stream) {
    if (n < 1 || n > QD_CUDA_QGEMV_MAX_N) return qd_cuda_fail(QD_ERR_INVALID_ARG, "qgemv (wgmma): n outside 1..16");
    if ((wg != 0 && wg != 1 && wg != 2 && wg != 4) || (ks != 0 && ks != 1 && ks != 2 && ks != 4 && ks != 8) ||
        (!wg != !ks))
        return qd_cuda_fail(QD_ERR_INVALID_ARG, "qgemv (wgmma): warpgroups 1, 2 or 4 and ranks 1, 2, 4 or 8 (or both "
                                                "0: the table's)");
    if (!qd_cuda_qgemv_wgmma_takes(out, n_out, cols, d_x, ldx))
        return qd_cuda_fail(QD_ERR_UNSUPPORTED, "qgemv (wgmma): needs FP8 weights with F32 scales of 128 * 2^k "
                                                "columns or one per row (bf16 beside them), 16-byte aligned weights "
                                                "and x, cols % 16 == 0, ldx % 8 == 0");
    qw_call c = {};
    c.n_out = n_out;
    c.x = d_x;
    c.ldx = ldx;
    c.n = n;
    c.accumulate = accumulate;
    c.nblk = (int)((cols + 127) / 128);
    int64_t tiles = 0; /* of 64 rows */
    for (int j = 0; j < n_out; j++) {
        if (!out[j].y || out[j].ldy < out[j].rows)
            return qd_cuda_fail(QD_ERR_INVALID_ARG, "qgemv (wgmma): no y or a short stride");
        if (out[j].qw) {
            qd_cuda_qmats_of(out[j].qw, &c.m[j]);
            c.shift[j] = qw_block_shift(c.m[j]);
        } else {
            c.m[j] = qd_cuda_qmats_bf16(out[j].W, out[j].rows, cols);
            c.shift[j] = 31;
        }
        tiles += (out[j].rows + 63) / 64;
        c.tile_end[j] = tiles;
        c.y[j] = out[j].y;
        c.ldy[j] = out[j].ldy;
    }
    if (!wg) qw_table(tiles, c.nblk, &wg, &ks);
    c.ks = ks;
    c.bpr = (c.nblk + ks - 1) / ks;
    const size_t smem = qw_smem_bytes(c.bpr, n);
    if (smem > QW_SMEM_MAX)
        return qd_cuda_fail(QD_ERR_UNSUPPORTED, "qgemv (wgmma): a rank's x would not fit its shared memory");
    if (tiles == 0) return QD_OK;
    if (tiles * ks > INT32_MAX) return qd_cuda_fail(QD_ERR_UNSUPPORTED, "qgemv (wgmma): too many rows");
    cudaStream_t st = (cudaStream_t)stream;
    return wg == 4 ? qw_launch_wg<4>(c, smem, st) : wg == 2 ? qw_launch_wg<2>(c, smem, st) : qw_launch_wg<1>(c, smem, st);
}
