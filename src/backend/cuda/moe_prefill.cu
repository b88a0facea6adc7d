/* Prefill path of the routed experts: many tokens, so grouped GEMMs on the
 * tensor cores over the (token, slot) pairs sorted by expert.
 *
 *   plan:    counting sort of the pairs by expert on the device (one block):
 *            per-expert segments, the list of 64-row tiles, each pair's row.
 *   gate_up: per tile, act[row][i] = silu(x[token] . gate_i) * (x[token] . up_i)
 *            (token rows gathered straight from x by the tile loader), bf16.
 *   down:    per tile, out[row][h] = act[row] . down_h, fp32.
 *   combine: y[t] += sum_j w[t][j] out[row of (t, j)], slots in order.
 *
 * Nothing is read back to the host: the GEMM grids are sized by the bound
 * qd_moe_max_tiles(P, E) and blocks past the planned tile count exit, so this
 * path is graph-capturable too. The order of rows within an expert comes from
 * shared-memory atomics and may change between runs, but a row's result does
 * not depend on its position in a tile (each output is the same sequence of
 * mma k-steps), and the combine adds the slots of a token in slot order: the
 * results are run-to-run identical and batch-invariant.
 *
 * GEMM tile: 64 rows x 128 weight rows (gate_up: 64 gate + the matching 64 up
 * rows, so silu(gate) * up is formed in registers), k-steps of 32 through a
 * 3-stage cp.async pipeline, 4 warps each 32 x 64, mma.sync m16n8k16 bf16
 * with fp32 accumulation; up to QD_MOE_SMALL_MAX_TOKENS tokens, 16 x 64 tiles
 * with the same sums (moe_gemm_small); from QD_MOE_WG_MIN_TOKENS, 128 x 256 tiles on
 * wgmma, persistent (moe_prefill_wgmma.cu), the same sums again. */
#include <math.h>

#include "backend/cuda/cuda_mma.cuh"
#include "backend/cuda/cuda_util.h"
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/moe_internal.cuh"

#define GM_BM QD_MOE_BM
#define GM_BN 128
#define GM_BK 32
#define GM_ST 3
#define GM_LD 40 /* smem row stride (bf16): 80 bytes keeps ldmatrix conflict-free and rows 16-byte aligned */
#define GM_NT 128
#define PL_NT 1024
#define PL_U 8 /* expert ids a plan thread loads before it counts or places them: in flight together
                * (one at a time, a single block took 77 us over the 65,536 pairs of an 8k prefill) */

__global__ void __launch_bounds__(PL_NT)
moe_plan(const int32_t *__restrict__ sel, int P, int E, int bm, int32_t *__restrict__ seg, int32_t *__restrict__ n_tiles,
         int2 *__restrict__ tiles, int32_t *__restrict__ sorted, int32_t *__restrict__ pos) {
    __shared__ int cnt[PL_NT], sa[PL_NT], sb[PL_NT], base[PL_NT];
    const int tid = threadIdx.x;
    cnt[tid] = 0;
    __syncthreads();
    for (int p0 = tid; p0 < P; p0 += PL_NT * PL_U) {
        int e[PL_U];
#pragma unroll
        for (int u = 0; u < PL_U; u++) e[u] = p0 + u * PL_NT < P ? __ldg(sel + p0 + u * PL_NT) : -1;
#pragma unroll
        for (int u = 0; u < PL_U; u++)
            if (e[u] >= 0 && e[u] < E) atomicAdd(&cnt[e[u]], 1);
    }
    __syncthreads();
    /* Inclusive scans of the pair counts and the tile counts (Hillis-Steele). */
    const int c = cnt[tid], tc = (c + bm - 1) / bm;
    sa[tid] = c;
    sb[tid] = tc;
    __syncthreads();
    for (int off = 1; off < PL_NT; off <<= 1) {
        const int va = tid >= off ? sa[tid - off] : 0, vb = tid >= off ? sb[tid - off] : 0;
        __syncthreads();
        sa[tid] += va;
        sb[tid] += vb;
        __syncthreads();
    }
    const int first = sa[tid] - c, tfirst = sb[tid] - tc;
    base[tid] = first;
    cnt[tid] = 0; /* now the per-expert cursor */
    if (tid < E) {
        seg[tid] = first;
        for (int q = 0; q < tc; q++) tiles[tfirst + q] = make_int2(tid, first + q * bm);
    }
    if (tid == 0) {
        seg[E] = sa[PL_NT - 1];
        *n_tiles = sb[PL_NT - 1];
    }
    __syncthreads();
    for (int p0 = tid; p0 < P; p0 += PL_NT * PL_U) {
        int e[PL_U];
#pragma unroll
        for (int u = 0; u < PL_U; u++) e[u] = p0 + u * PL_NT < P ? __ldg(sel + p0 + u * PL_NT) : -1;
#pragma unroll
        for (int u = 0; u < PL_U; u++) {
            const int p = p0 + u * PL_NT;
            if (p >= P) break;
            int r = -1;
            if (e[u] >= 0 && e[u] < E) {
                r = base[e[u]] + atomicAdd(&cnt[e[u]], 1);
                sorted[r] = p;
            }
            pos[p] = r;
        }
    }
}

/* MODE 0: gate_up (K = H, A rows gathered from x, bf16 act out);
 * MODE 1: down (K = I, A = act rows, fp32 out). */
template <int MODE>
__global__ void __launch_bounds__(GM_NT)
moe_gemm(const uint16_t *__restrict__ A, const uint16_t *__restrict__ W, const int32_t *__restrict__ seg,
         const int32_t *__restrict__ n_tiles, const int2 *__restrict__ tiles, const int32_t *__restrict__ sorted,
         uint16_t *__restrict__ act_out, float *__restrict__ out, int H, int I, int k) {
    __shared__ __align__(16) uint16_t As[GM_ST][GM_BM][GM_LD];
    __shared__ __align__(16) uint16_t Bs[GM_ST][GM_BN][GM_LD];
    if ((int)blockIdx.y >= *n_tiles) return;
    const int2 tl = tiles[blockIdx.y];
    const int e = tl.x, row0 = tl.y, rows = min(GM_BM, seg[e + 1] - row0);
    const int K = MODE == 0 ? H : I;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, wm = warp & 1, wn = warp >> 1;
    const int cc = (tid & 3) * 8; /* this thread's 16-byte column chunk in a k-step */

    const uint16_t *a_src[2];
    bool a_ok[2];
#pragma unroll
    for (int q = 0; q < 2; q++) {
        const int r = (tid >> 2) + 32 * q;
        a_ok[q] = r < rows;
        const int rr = a_ok[q] ? row0 + r : row0;
        a_src[q] = MODE == 0 ? A + (size_t)(sorted[rr] / k) * H : A + (size_t)rr * I;
    }
    const uint16_t *b_src[4];
    bool b_ok[4];
#pragma unroll
    for (int q = 0; q < 4; q++) {
        const int rb = (tid >> 2) + 32 * q;
        size_t wrow;
        if (MODE == 0) {
            const int i = blockIdx.x * (GM_BN / 2) + (rb & (GM_BN / 2 - 1));
            b_ok[q] = i < I;
            wrow = (size_t)e * 2 * I + (rb < GM_BN / 2 ? 0 : I) + (b_ok[q] ? i : 0);
        } else {
            const int h = blockIdx.x * GM_BN + rb;
            b_ok[q] = h < H;
            wrow = (size_t)e * H + (b_ok[q] ? h : 0);
        }
        b_src[q] = W + wrow * K;
    }

    const int KT = (K + GM_BK - 1) / GM_BK;
    auto load = [&](int st, int kt) {
        const int kc = kt * GM_BK + cc;
        const bool kin = kc < K; /* K % 8 == 0: a 16-byte chunk is all in or all out */
#pragma unroll
        for (int q = 0; q < 2; q++)
            qd_cp_async16(&As[st][(tid >> 2) + 32 * q][cc], a_src[q] + (kin ? kc : 0), a_ok[q] && kin);
#pragma unroll
        for (int q = 0; q < 4; q++)
            qd_cp_async16(&Bs[st][(tid >> 2) + 32 * q][cc], b_src[q] + (kin ? kc : 0), b_ok[q] && kin);
    };

    float acc[2][8][4];
    qd_mma_clear(acc);

    qd_cp_async_prologue<GM_ST>(load, KT);
    for (int kt = 0; kt < KT; kt++) {
        qd_cp_async_wait<GM_ST - 2>();
        __syncthreads(); /* stage kt landed for all; stage kt - 1 is free to refill */
        const int nk = kt + GM_ST - 1;
        if (nk < KT) load(nk % GM_ST, nk);
        qd_cp_async_commit();
        const int st = kt % GM_ST;
#pragma unroll
        for (int kk = 0; kk < GM_BK; kk += 16) {
            uint32_t af[2][4], bfr[8][2];
#pragma unroll
            for (int mi = 0; mi < 2; mi++)
                qd_ldsm_x4(af[mi], &As[st][wm * 32 + mi * 16 + (lane & 15)][kk + (lane >> 4) * 8]);
#pragma unroll
            for (int pr = 0; pr < 4; pr++) {
                /* gate_up: n8 tiles 0-3 are gate columns, 4-7 the same columns of up */
                const int nb = MODE == 0 ? (pr < 2 ? wn * 32 + 16 * pr : GM_BN / 2 + wn * 32 + 16 * (pr - 2))
                                         : wn * 64 + 16 * pr;
                uint32_t r[4];
                qd_ldsm_x4(r, &Bs[st][nb + (lane & 7) + (lane >> 4) * 8][kk + ((lane >> 3) & 1) * 8]);
                bfr[2 * pr][0] = r[0];
                bfr[2 * pr][1] = r[1];
                bfr[2 * pr + 1][0] = r[2];
                bfr[2 * pr + 1][1] = r[3];
            }
#pragma unroll
            for (int mi = 0; mi < 2; mi++)
#pragma unroll
                for (int t = 0; t < 8; t++) qd_mma_bf16(acc[mi][t], af[mi], bfr[t]);
        }
    }
    qd_cp_async_wait<0>();

#pragma unroll
    for (int mi = 0; mi < 2; mi++)
#pragma unroll
        for (int half = 0; half < 2; half++) {
            const int r = wm * 32 + mi * 16 + (lane >> 2) + half * 8;
            if (r >= rows) continue;
            const size_t grow = (size_t)row0 + r;
            if (MODE == 0) {
#pragma unroll
                for (int t = 0; t < 4; t++) {
                    const int i = blockIdx.x * (GM_BN / 2) + wn * 32 + 8 * t + 2 * (lane & 3);
                    if (i >= I) continue;
                    const float g0 = acc[mi][t][2 * half], g1 = acc[mi][t][2 * half + 1];
                    const float u0 = acc[mi][t + 4][2 * half], u1 = acc[mi][t + 4][2 * half + 1];
                    *(uint32_t *)(act_out + grow * I + i) =
                        qd_moe_swiglu2(g0, g1, u0, u1);
                }
            } else {
#pragma unroll
                for (int t = 0; t < 8; t++) {
                    const int h = blockIdx.x * GM_BN + wn * 64 + 8 * t + 2 * (lane & 3);
                    if (h >= H) continue;
                    *(float2 *)(out + grow * H + h) = make_float2(acc[mi][t][2 * half], acc[mi][t][2 * half + 1]);
                }
            }
        }
}

/* Few tokens (a batch-invariant decode step takes this path at every n): moe_gemm's
 * 128 weight rows per block leave a token's 8 experts on a few dozen blocks, each
 * streaming its weights alone. This variant takes 64 weight rows per block, k-stages of
 * 64 through a 4-stage ring, and the plan's tile in pieces of 16 sorted rows. Its sums
 * are moe_gemm's: every output is one mma chain over the same 2 * ceil(K / 32) k16 steps
 * (zero-filled past K) in the same order, and the same epilogue, so which kernel runs
 * never changes a bit (test_cuda_moe compares a token alone with it in a batch).
 *   MODE 0: smem rows 16w..16w+15 hold gate rows i = 8w..8w+7 of the block's 32, then
 *           the same up rows, so warp w forms silu(gate) * up of its 8 columns;
 *   MODE 1: warp w computes output columns 16w..16w+15 of the block's 64. */
#define SM_BM 16
#define SM_BN 64
#define SM_BK 64
#define SM_ST 4
#define SM_LD 72 /* 144-byte rows: 16-byte aligned, ldmatrix conflict-free */

template <int MODE>
__global__ void __launch_bounds__(GM_NT)
moe_gemm_small(const uint16_t *__restrict__ A, const uint16_t *__restrict__ W, const int32_t *__restrict__ seg,
               const int32_t *__restrict__ n_tiles, const int2 *__restrict__ tiles, const int32_t *__restrict__ sorted,
               uint16_t *__restrict__ act_out, float *__restrict__ out, int H, int I, int k) {
    __shared__ __align__(16) uint16_t As[SM_ST][SM_BM][SM_LD];
    __shared__ __align__(16) uint16_t Bs[SM_ST][SM_BN][SM_LD];
    if ((int)blockIdx.y >= *n_tiles) return;
    const int2 tl = tiles[blockIdx.y];
    const int e = tl.x, row0 = tl.y, rows = min(GM_BM, seg[e + 1] - row0);
    const int K = MODE == 0 ? H : I;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int cc = (tid & 7) * 8; /* this thread's 16-byte column chunk of a k-stage */
    const int nk16 = 2 * ((K + 31) / 32), nst = (nk16 + 3) / 4;

    /* weight rows of this block: 4 per thread (smem rows tid / 8 + 16 q) */
    const uint16_t *b_src[4];
    bool b_ok[4];
#pragma unroll
    for (int q = 0; q < 4; q++) {
        const int j = (tid >> 3) + 16 * q;
        size_t wrow;
        if (MODE == 0) {
            const int i = blockIdx.x * 32 + 8 * (j >> 4) + (j & 7);
            b_ok[q] = i < I;
            wrow = (size_t)e * 2 * I + ((j & 8) ? I : 0) + (b_ok[q] ? i : 0);
        } else {
            const int h = blockIdx.x * SM_BN + j;
            b_ok[q] = h < H;
            wrow = (size_t)e * H + (b_ok[q] ? h : 0);
        }
        b_src[q] = W + wrow * K;
    }

    for (int m0 = 0; m0 < rows; m0 += SM_BM) {
        const int ar = m0 + (tid >> 3); /* this thread's A row (16 rows x 8 chunks) */
        const bool a_ok = ar < rows;
        const int rr = a_ok ? row0 + ar : row0;
        const uint16_t *a_src = MODE == 0 ? A + (size_t)(sorted[rr] / k) * H : A + (size_t)rr * I;
        auto load = [&](int st, int s) {
            const int kc = s * SM_BK + cc;
            const bool kin = kc < K; /* K % 8 == 0: a chunk is all in or all out */
            qd_cp_async16(&As[st][tid >> 3][cc], a_src + (kin ? kc : 0), a_ok && kin);
#pragma unroll
            for (int q = 0; q < 4; q++)
                qd_cp_async16(&Bs[st][(tid >> 3) + 16 * q][cc], b_src[q] + (kin ? kc : 0), b_ok[q] && kin);
        };
        float acc[2][4];
#pragma unroll
        for (int t = 0; t < 2; t++) acc[t][0] = acc[t][1] = acc[t][2] = acc[t][3] = 0.0f;
        __syncthreads(); /* the previous piece's readers are done with the ring */
        qd_cp_async_prologue<SM_ST>(load, nst);
        for (int s = 0; s < nst; s++) {
            qd_cp_async_wait<SM_ST - 2>();
            __syncthreads();
            const int ns = s + SM_ST - 1;
            if (ns < nst) load(ns % SM_ST, ns);
            qd_cp_async_commit();
            const int st = s % SM_ST;
#pragma unroll
            for (int kk = 0; kk < 4; kk++) {
                if (s * 4 + kk >= nk16) break; /* the same k16 steps as moe_gemm, no more */
                uint32_t af[4], r[4];
                qd_ldsm_x4(af, &As[st][lane & 15][kk * 16 + (lane >> 4) * 8]);
                qd_ldsm_x4(r, &Bs[st][16 * warp + (lane & 7) + (lane >> 4) * 8][kk * 16 + ((lane >> 3) & 1) * 8]);
                const uint32_t b0[2] = {r[0], r[1]}, b1[2] = {r[2], r[3]};
                qd_mma_bf16(acc[0], af, b0);
                qd_mma_bf16(acc[1], af, b1);
            }
        }
        qd_cp_async_wait<0>();
#pragma unroll
        for (int half = 0; half < 2; half++) {
            const int r = m0 + (lane >> 2) + half * 8;
            if (r >= rows) continue;
            const size_t grow = (size_t)row0 + r;
            if (MODE == 0) {
                const int i = blockIdx.x * 32 + 8 * warp + 2 * (lane & 3);
                if (i >= I) continue;
                const float g0 = acc[0][2 * half], g1 = acc[0][2 * half + 1];
                const float u0 = acc[1][2 * half], u1 = acc[1][2 * half + 1];
                *(uint32_t *)(act_out + grow * I + i) =
                    qd_moe_swiglu2(g0, g1, u0, u1);
            } else {
#pragma unroll
                for (int t = 0; t < 2; t++) {
                    const int h = blockIdx.x * SM_BN + 16 * warp + 8 * t + 2 * (lane & 3);
                    if (h >= H) continue;
                    *(float2 *)(out + grow * H + h) = make_float2(acc[t][2 * half], acc[t][2 * half + 1]);
                }
            }
        }
    }
}

/* y[t][h..h+3] += sum_j w[t][j] out[pos[t][j]][h..h+3], j in order. */
__global__ void __launch_bounds__(256)
moe_combine(const int32_t *__restrict__ pos, const float *__restrict__ wts, const float *__restrict__ out,
            float *__restrict__ y, int H, int k, const float *__restrict__ sh_y, const float *__restrict__ sh_gate,
            int64_t sh_ld) {
    const size_t t = blockIdx.y;
    const int h = (blockIdx.x * 256 + threadIdx.x) * 4;
    if (h >= H) return;
    float4 s = make_float4(0.f, 0.f, 0.f, 0.f);
    for (int j = 0; j < k; j++) {
        const int r = pos[t * k + j];
        if (r < 0) continue;
        const float wj = wts[t * k + j];
        const float4 o = *(const float4 *)(out + (size_t)r * H + h);
        s.x = fmaf(wj, o.x, s.x);
        s.y = fmaf(wj, o.y, s.y);
        s.z = fmaf(wj, o.z, s.z);
        s.w = fmaf(wj, o.w, s.w);
    }
    float4 *yp = (float4 *)(y + t * H + h);
    float4 v = *yp;
    if (sh_y) { /* the shared expert first, as qd_cuda_sigmoid_scale would have added it */
        const float g = qd_sigmoidf(sh_gate[t * sh_ld]);
        const float4 u = *(const float4 *)(sh_y + t * H + h);
        v.x = fmaf(g, u.x, v.x);
        v.y = fmaf(g, u.y, v.y);
        v.z = fmaf(g, u.z, v.z);
        v.w = fmaf(g, u.w, v.w);
    }
    v.x += s.x;
    v.y += s.y;
    v.z += s.z;
    v.w += s.w;
    *yp = v;
}

/* The prefill path's kernel table (a->prefill_kernel forces one for tests and benchmarks).
 * bf16 experts: moe_gemm_small up to QD_MOE_SMALL_MAX_TOKENS, the wgmma kernel from
 * QD_MOE_WG_MIN_TOKENS (moe_internal.cuh), moe_gemm between. The three give the same bits
 * (test_cuda_moe: each forced, at every batch size it tries, on the H200), so the choice
 * never changes a result, batch-invariant mode included. Quantized experts, in this order:
 *  1. FP8 experts that the W8A8 kernel takes (128 x 128 blocks), from QD_MOE_W8A8_MIN_TOKENS
 *     (the decode kernels keep fewer; moe.cu), outside batch-invariant mode (its sums are not
 *     the dequantized copy's, and every n there must give one result): W8A8 on the FP8 tensor
 *     cores (on an H100, Qwen3.5-35B-A3B FP8 prefill at 8k 32,009 -> 38,719 tok/s against the
 *     dequantized copy, bf16 37,228 in the same run; RESULTS session 25; a decode step of 80
 *     sequences 51.7 ms on W8A16 -> 24.5, RESULTS session 38).
 *  2. Experts that the WA16 kernel takes (INT4 and NVFP4: W4A16; FP8 of any block shape the
 *     vectorised layouts have: W8A16), at every other n, batch-invariant mode included: it
 *     makes the dequantized copy's bf16 numbers in shared memory and multiplies them as the
 *     wgmma kernel does, whose bits every bf16 kernel gives, so at each n its result is the
 *     one the copy's kernel would give (test_cuda_quant_moe compares them bitwise at mma.sync
 *     and wgmma sizes). H100, 35B-A3B 8k prefill: INT4 33,114 -> 42,132 tok/s, NVFP4 35,087
 *     -> 40,657 (bf16 49,442; RESULTS session 37); the converter, not the copy's bytes, now
 *     sets the pace. FP8 (H100, RESULTS session 38): a batch-invariant decode step of one
 *     sequence 65.4 -> 10.1 ms, a step of 80 sequences 96.7 -> 51.7 ms (now W8A8's).
 *  3. Others, a forced bf16 kernel or QD_MOE_PREFILL_DEQUANT: the bf16 table on the
 *     dequantized copy. */
int qd_moe_prefill_kernel(const qd_cuda_moe_args *a) {
    const int w8a8 = a->q_gate_up && !a->invariant && qd_moe_fp8_takes(a);
    const int wa16 = a->q_gate_up && qd_moe_wa16_takes(a);
    if (a->prefill_kernel == QD_MOE_PREFILL_W8A8) return w8a8 ? QD_MOE_PREFILL_W8A8 : -1;
    if (a->prefill_kernel == QD_MOE_PREFILL_WA16) return wa16 ? QD_MOE_PREFILL_WA16 : -1;
    if (a->prefill_kernel != QD_MOE_PREFILL_DEQUANT && w8a8 && a->n >= QD_MOE_W8A8_MIN_TOKENS)
        return QD_MOE_PREFILL_W8A8;
    if (!a->prefill_kernel && wa16) return QD_MOE_PREFILL_WA16;
    /* QD_MOE_PREFILL_DEQUANT names the quantized experts' path; its bf16 kernel is the table's */
    const int forced = a->prefill_kernel == QD_MOE_PREFILL_DEQUANT ? 0 : a->prefill_kernel;
    if (forced >= QD_MOE_PREFILL_WGMMA && !qd_moe_wg_takes(a)) return -1;
    if (forced) return forced;
    if (a->n >= QD_MOE_WG_MIN_TOKENS && qd_moe_wg_takes(a)) return QD_MOE_PREFILL_WGMMA;
    return a->n <= QD_MOE_SMALL_MAX_TOKENS ? QD_MOE_PREFILL_MMA_SMALL : QD_MOE_PREFILL_MMA;
}

qd_status qd_moe_plan(const qd_cuda_moe_args *a, const qd_moe_work *w, int bm, cudaStream_t s) {
    const int64_t P = (int64_t)a->n * a->k;
    if (qd_moe_max_tiles(P, a->E) > 65535) return qd_cuda_fail(QD_ERR_INVALID_ARG, "qd_cuda_moe_experts: batch too large");
    moe_plan<<<1, PL_NT, 0, s>>>(a->d_sel, (int)P, a->E, bm, w->seg, w->n_tiles, w->tiles, w->sorted, w->pos);
    QD_CUDA_CHECK_LAUNCH("moe_plan");
    return QD_OK;
}

qd_status qd_moe_combine(const qd_cuda_moe_args *a, const qd_moe_work *w, cudaStream_t s) {
    moe_combine<<<dim3((unsigned)((a->H + 1023) / 1024), (unsigned)a->n), 256, 0, s>>>(
        w->pos, a->d_w, w->out, a->d_y, a->H, a->k, a->d_sh_y, a->d_sh_gate, a->sh_gate_ld);
    QD_CUDA_CHECK_LAUNCH("moe_combine");
    return QD_OK;
}

qd_status qd_moe_prefill(const qd_cuda_moe_args *a, const qd_moe_work *w, cudaStream_t s) {
    const int max_tiles = qd_moe_max_tiles((int64_t)a->n * a->k, a->E);
    const int kernel = qd_moe_prefill_kernel(a);
    if (kernel < QD_MOE_PREFILL_MMA_SMALL || kernel > QD_MOE_PREFILL_WGMMA)
        return qd_cuda_fail(QD_ERR_INVALID_ARG, "qd_cuda_moe_experts: prefill_kernel names no kernel that takes the call");
    uint16_t *act = (uint16_t *)w->act;
    const int wg = kernel >= QD_MOE_PREFILL_WGMMA;
    qd_status st = qd_moe_plan(a, w, wg ? QD_MOE_WG_BM : QD_MOE_BM, s);
    if (st) return st;
    if (wg) {
        st = qd_moe_wg_gemms(a, w, s);
        if (st) return st;
    } else if (kernel == QD_MOE_PREFILL_MMA_SMALL) {
        moe_gemm_small<0><<<dim3((unsigned)((a->I + 31) / 32), (unsigned)max_tiles), GM_NT, 0, s>>>(
            a->d_x, a->d_gate_up, w->seg, w->n_tiles, w->tiles, w->sorted, act, NULL, a->H, a->I, a->k);
        QD_CUDA_CHECK_LAUNCH("moe_gemm_small gate_up");
        moe_gemm_small<1><<<dim3((unsigned)((a->H + SM_BN - 1) / SM_BN), (unsigned)max_tiles), GM_NT, 0, s>>>(
            act, a->d_down, w->seg, w->n_tiles, w->tiles, w->sorted, NULL, w->out, a->H, a->I, a->k);
        QD_CUDA_CHECK_LAUNCH("moe_gemm_small down");
    } else {
        moe_gemm<0><<<dim3((unsigned)((a->I + GM_BN / 2 - 1) / (GM_BN / 2)), (unsigned)max_tiles), GM_NT, 0, s>>>(
            a->d_x, a->d_gate_up, w->seg, w->n_tiles, w->tiles, w->sorted, act, NULL, a->H, a->I, a->k);
        QD_CUDA_CHECK_LAUNCH("moe_gemm gate_up");
        moe_gemm<1><<<dim3((unsigned)((a->H + GM_BN - 1) / GM_BN), (unsigned)max_tiles), GM_NT, 0, s>>>(
            act, a->d_down, w->seg, w->n_tiles, w->tiles, w->sorted, NULL, w->out, a->H, a->I, a->k);
        QD_CUDA_CHECK_LAUNCH("moe_gemm down");
    }
    return qd_moe_combine(a, w, s);
}

qd_status qd_moe_prefill_quant(const qd_cuda_moe_args *a, const qd_moe_work *w, int kernel, cudaStream_t s) {
    qd_status st = qd_moe_plan(a, w, QD_MOE_WG_BM, s);
    if (!st) st = kernel == QD_MOE_PREFILL_W8A8 ? qd_moe_fp8_gemms(a, w, s) : qd_moe_wa16_gemms(a, w, s);
    if (!st) st = qd_moe_combine(a, w, s);
    return st;
}
