/* Decode path of the routed experts: a few tokens, so two GEMV kernels bound
 * by reading the expert weights (3 I H bf16 per active expert).
 *
 *   gate_up: block (8 rows i, pair p). act[q][i] = silu(gate_i . x) * (up_i . x)
 *   down:    block (32 rows h, pair p). out[q][h] = down_h . act[q], then
 *            y[t][h] += sum_j w[t][j] out[t k + j][h] once all k slots are in.
 *
 * Weights are read once per step even when several tokens chose the same
 * expert: the block of the first pair (in pair order) that chose expert e
 * owns e and runs every pair that chose it, GU_TG / DN_TG tokens per pass
 * over the weights; blocks of the other pairs exit at once. The grid depends
 * only on n, nothing is read back, nothing allocated: graph-capturable.
 *
 * Batch invariance: one dot product is always summed the same way (lane l
 * takes the same 8-element blocks in the same order, then a fixed xor-shuffle
 * tree), whatever pass or group the token lands in, so a token's result is
 * bit-identical for any batch. The k slots of a token are added into y in slot
 * order by whichever down block completes the token's row tile last (a
 * completion counter per (token, row tile), reset by the gate_up kernel), so
 * no atomics touch y and runs repeat exactly.
 *
 * The down kernel is launched as a programmatic dependent of gate_up: its
 * blocks start while gate_up drains and load their down_proj weights (which
 * do not depend on gate_up), then wait (griddepcontrol.wait) for the
 * activations. gate_up waits for its own predecessor before reading the
 * routing and only then lets down launch, so down may read the routing early
 * (cuda_pdl.cuh); gate_up itself may be a programmatic dependent (the fused
 * MoE block launches it right after the router).
 *
 * Shared expert (optional, the fused decode block): block rows after the P
 * pairs run it, one row of blocks per SH_TG tokens (one pass over the weights
 * each, the rows in parallel: a single row would make n / SH_TG passes in
 * sequence and become the tail of the kernel); its down blocks count as one
 * more slot of each (token, row tile), and the block completing a tile adds
 * sigmoid(gate) * shared + the routed sum. Its weights are known before the
 * routing, so its blocks load them before waiting. */
#include <math.h>

#include "backend/cuda/cuda_pdl.cuh"
#include "backend/cuda/cuda_util.h"
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_qformat.cuh"
#include "backend/cuda/moe_internal.cuh"

#define GU_NT 256        /* threads of a gate_up block: 8 warps, one row i (gate and up) each */
#define GU_WARPS (GU_NT / 32)
#define GU_TG 4          /* tokens per pass over the weights */
#define GU_U 4           /* 16-byte weight loads per row per lane in flight: 1024 columns a chunk */
#define DN_NT 256        /* threads of a down block: 8 warps */
#define DN_R (QD_MOE_DN_ROWS / (DN_NT / 32)) /* rows h per warp */
#define DN_TG 4
#define DN_U 2           /* 16-byte loads per row per lane: 512 columns a chunk */
#define SH_TG 4          /* tokens per block row of the shared expert: one pass of either kernel */
static_assert(SH_TG <= GU_TG && SH_TG <= DN_TG, "a shared-expert block row is one pass");

/* Weights are streamed once per step (qd_ld_stream16, cuda_common.cuh). */
__device__ __forceinline__ uint4 ld_weights(const uint4 *p) { return qd_ld_stream16(p); }

__device__ __forceinline__ void bf16x8(const uint4 v, float f[8]) { qf_bf16::decode8(v, 0, 0, f); }

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int off = 16; off; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
    return v;
}

/* 1 if an earlier pair chose the same expert (that pair's block owns it).
 * The routing is read through L2 (ld.cg): the down kernel reads it before its
 * programmatic wait, from a grid that finished while it was launching. */
__device__ __forceinline__ int not_owner(const int32_t *__restrict__ sel, int p, int e) {
    int dup = 0;
    for (int q = threadIdx.x; q < p; q += blockDim.x) dup |= __ldcg(sel + q) == e;
    return __syncthreads_or(dup);
}

/* The pairs q >= p that chose expert e, in increasing order, into list;
 * returns their count. wcnt: blockDim.x / 32 ints of shared scratch. */
__device__ int pairs_of_expert(const int32_t *__restrict__ sel, int p, int P, int e, int *list, int *wcnt) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nw = blockDim.x >> 5;
    int m = 0;
    for (int base = p; base < P; base += blockDim.x) {
        const int q = base + threadIdx.x;
        const bool hit = q < P && __ldcg(sel + q) == e;
        const unsigned bal = __ballot_sync(0xffffffffu, hit);
        if (lane == 0) wcnt[warp] = __popc(bal);
        __syncthreads();
        int off = m, tot = 0;
        for (int w = 0; w < nw; w++) {
            off += w < warp ? wcnt[w] : 0;
            tot += wcnt[w];
        }
        if (hit) list[off + __popc(bal & ((1u << lane) - 1u))] = q;
        __syncthreads();
        m += tot;
    }
    return m;
}

/* The tokens of shared-expert block row g: SH_TG of the n, from g * SH_TG. */
__device__ __forceinline__ int group_tokens(int n, int g, int *list) {
    const int m = min(SH_TG, n - g * SH_TG);
    if (threadIdx.x < m) list[threadIdx.x] = g * SH_TG + threadIdx.x;
    __syncthreads();
    return m;
}

/* bf16: 4 blocks per SM (64 registers); a quantized piece decodes into more registers,
 * so 3 blocks of more loads each */
template <class WF>
__global__ void __launch_bounds__(GU_NT, WF::DTYPE == QD_DTYPE_BF16 ? 4 : 3)
moe_gate_up_decode(const __grid_constant__ qd_moe_qw qw, const uint16_t *__restrict__ x, const int32_t *sel, const uint16_t *__restrict__ gate_up,
                   float *__restrict__ act, int32_t *__restrict__ counters, int n_ctr, int P, int H, int I, int E,
                   int k, const uint16_t *__restrict__ sh_gate_up, int Is, float *__restrict__ sh_act) {
    extern __shared__ uint4 xs[]; /* [GU_TG][H / 8] the pass's token rows, bf16 */
    __shared__ int list[QD_MOE_DECODE_MAX_PAIRS];
    __shared__ int wcnt[GU_WARPS];
    const int p = blockIdx.y, tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int i = blockIdx.x * GU_WARPS + warp; /* I, Is % 8 == 0: a block's warps all have rows or none */
    const bool shared = p >= P;                 /* the block rows after the pairs (only with sh_gate_up) */
    const int rows = shared ? Is : I;
    constexpr bool BF = WF::DTYPE == QD_DTYPE_BF16;
    constexpr int U = BF ? GU_U : WF::COLS == 16 ? 4 : 2; /* pieces per lane in flight: a 2048-column row of FP8 at once */
    constexpr int PC = WF::COLS / 8;        /* x's 16-byte pieces (8 bf16) per weight piece */
    constexpr int SUBC = WF::COLS / WF::NSUB;
    const int H8 = H >> 3, NP = H / WF::COLS; /* H % WF::COLS == 0 for the quantized layouts (moe.cu) */
    const int nch = (NP + 32 * U - 1) / (32 * U);
    const uint4 *wg = NULL, *wu = NULL;
    qf_row rg = {}, ru = {};
    bool ok = false;
    uint4 g[U], u[U];
#pragma unroll
    for (int uu = 0; uu < U; uu++) g[uu] = u[uu] = make_uint4(0, 0, 0, 0);
    /* The first chunk of weights before anything else: the long-latency traffic.
     * The shared expert's are known before the routing, so before the wait. */
    if (shared && blockIdx.x * GU_WARPS < Is) {
        ok = true;
        if constexpr (BF) {
            wg = (const uint4 *)(sh_gate_up + (size_t)i * H);
            wu = wg + (size_t)Is * H8;
        } else {
            rg = qf_row_of(qw.sh_gate_up, 0, i);
            ru = qf_row_of(qw.sh_gate_up, 1, i);
            wg = (const uint4 *)rg.q;
            wu = (const uint4 *)ru.q;
        }
#pragma unroll
        for (int uu = 0; uu < U; uu++) {
            const int b = uu * 32 + lane;
            if (b < NP) {
                g[uu] = ld_weights(wg + b);
                u[uu] = ld_weights(wu + b);
            }
        }
    }
    qd_pdl_wait();
    /* The down kernel may start now: it only reads the routing and its weights until it waits. */
    qd_pdl_trigger();
    if (blockIdx.x == 0 && !shared && p % k == 0)
        for (int c = tid; c < n_ctr; c += GU_NT) counters[(size_t)(p / k) * n_ctr + c] = 0;
    if (blockIdx.x * GU_WARPS >= rows) return; /* the grid covers the wider of I and Is */
    int m;
    if (shared) {
        m = group_tokens(P / k, p - P, list);
    } else {
        const int e = __ldcg(sel + p);
        if (not_owner(sel, p, e)) return;
        ok = e >= 0 && e < E; /* an id out of range gives zeros */
        if constexpr (BF) {
            wg = (const uint4 *)(gate_up + ((size_t)(ok ? e : 0) * 2 * I + i) * H);
            wu = wg + (size_t)I * H8;
        } else {
            rg = qf_row_of(qw.gate_up, 2 * (ok ? e : 0), i);
            ru = qf_row_of(qw.gate_up, 2 * (ok ? e : 0) + 1, i);
            wg = (const uint4 *)rg.q;
            wu = (const uint4 *)ru.q;
        }
#pragma unroll
        for (int uu = 0; uu < U; uu++) {
            const int b = uu * 32 + lane;
            const bool in = ok && b < NP;
            g[uu] = in ? ld_weights(wg + b) : make_uint4(0, 0, 0, 0);
            u[uu] = in ? ld_weights(wu + b) : make_uint4(0, 0, 0, 0);
        }
        m = pairs_of_expert(sel, p, P, e, list, wcnt);
    }
    const int kd = shared ? 1 : k;              /* list entries: tokens, or pairs t * k + j */
    float *const ap = shared ? sh_act : act;    /* [list entry][rows] */
    const uint4 *x4 = (const uint4 *)x;
    for (int g0 = 0; g0 < m; g0 += GU_TG) {
        const int gs = min(GU_TG, m - g0);
        if (g0) __syncthreads(); /* the previous pass is done with xs */
        for (int c = tid; c < gs * H8; c += GU_NT) {
            const int tt = c / H8, b = c - tt * H8;
            xs[c] = __ldcg(x4 + (size_t)(list[g0 + tt] / kd) * H8 + b); /* L2: see cuda_pdl.cuh */
        }
        __syncthreads();
        float ag[GU_TG], au[GU_TG];
#pragma unroll
        for (int tt = 0; tt < GU_TG; tt++) ag[tt] = au[tt] = 0.0f;
        for (int c = 0; c < nch; c++) {
            if (c || g0) {
#pragma unroll
                for (int uu = 0; uu < U; uu++) {
                    const int b = (c * U + uu) * 32 + lane;
                    const bool in = ok && b < NP;
                    g[uu] = in ? ld_weights(wg + b) : make_uint4(0, 0, 0, 0);
                    u[uu] = in ? ld_weights(wu + b) : make_uint4(0, 0, 0, 0);
                }
            }
#pragma unroll
            for (int uu = 0; uu < U; uu++) {
                const int b = (c * U + uu) * 32 + lane;
                if (!BF && b < NP) { /* a quantized piece: partial sums per scale block, then the scale */
                    const int c0 = b * WF::COLS, zg = WF::zero(rg, c0), zu = WF::zero(ru, c0);
#pragma unroll
                    for (int j = 0; j < WF::NSUB; j++) {
                        float dg[GU_TG], du[GU_TG];
#pragma unroll
                        for (int tt = 0; tt < GU_TG; tt++) dg[tt] = du[tt] = 0.0f;
#pragma unroll
                        for (int q8 = j * (SUBC / 8); q8 < (j + 1) * (SUBC / 8); q8++) {
                            float gf[8], uf[8];
                            WF::decode8(g[uu], q8, zg, gf);
                            WF::decode8(u[uu], q8, zu, uf);
#pragma unroll
                            for (int tt = 0; tt < GU_TG; tt++) {
                                if (tt < gs) {
                                    float xf[8];
                                    bf16x8(xs[tt * H8 + b * PC + q8], xf);
#pragma unroll
                                    for (int q = 0; q < 8; q++) {
                                        dg[tt] = fmaf(gf[q], xf[q], dg[tt]);
                                        du[tt] = fmaf(uf[q], xf[q], du[tt]);
                                    }
                                }
                            }
                        }
                        const float sg = WF::scale(rg, c0, j) * WF::post(rg), su = WF::scale(ru, c0, j) * WF::post(ru);
#pragma unroll
                        for (int tt = 0; tt < GU_TG; tt++) {
                            ag[tt] = fmaf(sg, dg[tt], ag[tt]);
                            au[tt] = fmaf(su, du[tt], au[tt]);
                        }
                    }
                } else if (BF && b < H8) {
                    float gf[8], uf[8];
                    bf16x8(g[uu], gf);
                    bf16x8(u[uu], uf);
#pragma unroll
                    for (int tt = 0; tt < GU_TG; tt++) {
                        if (tt < gs) {
                            float xf[8];
                            bf16x8(xs[tt * H8 + b], xf);
#pragma unroll
                            for (int q = 0; q < 8; q++) {
                                ag[tt] = fmaf(gf[q], xf[q], ag[tt]);
                                au[tt] = fmaf(uf[q], xf[q], au[tt]);
                            }
                        }
                    }
                }
            }
        }
#pragma unroll
        for (int tt = 0; tt < GU_TG; tt++) {
            if (tt < gs) {
                const float sg = warp_sum(ag[tt]), su = warp_sum(au[tt]);
                if (lane == 0) ap[(size_t)list[g0 + tt] * rows + i] = sg / (1.0f + expf(-sg)) * su;
            }
        }
    }
}

template <class WF>
__global__ void __launch_bounds__(DN_NT, WF::DTYPE == QD_DTYPE_BF16 ? 4 : 3)
moe_down_decode(const __grid_constant__ qd_moe_qw qw, const int32_t *sel, const float *wts, const uint16_t *__restrict__ down,
                const float *act, float *out, int32_t *counters, float *__restrict__ y, int n_ctr, int P, int H,
                int I, int E, int k, const uint16_t *__restrict__ sh_down, int Is, const float *sh_act,
                float *sh_out, const float *sh_gate, int64_t sh_gate_ld) {
    extern __shared__ float4 as4[]; /* [DN_TG][max(I, Is) / 4] the pass's activations */
    __shared__ int list[QD_MOE_DECODE_MAX_PAIRS];
    __shared__ int wcnt[DN_NT / 32];
    __shared__ int last[DN_TG];
    const int p = blockIdx.y, tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const bool shared = p >= P;             /* only with sh_down */
    const int nslot = k + (sh_down ? 1 : 0); /* completions per (token, row tile) */
    int e = 0;
    if (!shared) {
        e = __ldcg(sel + p);
        if (not_owner(sel, p, e)) return;
    }
    const bool ok = shared || (e >= 0 && e < E);
    constexpr bool BF = WF::DTYPE == QD_DTYPE_BF16;
    constexpr int U = BF ? DN_U : 1;        /* a quantized piece holds 2x or 4x the columns */
    constexpr int SUBC = WF::COLS / WF::NSUB;
    const int Ir = shared ? Is : I;
    const int I4 = Ir >> 2, NP = Ir / WF::COLS; /* pieces per row */
    const int h0 = blockIdx.x * QD_MOE_DN_ROWS + warp * DN_R;
    const qd_cuda_qmats &qm = shared ? qw.sh_down : qw.down;
    const int64_t qmat = shared ? 0 : (ok ? e : 0);
    const int64_t rstride = BF ? (int64_t)Ir * 2 : qm.row_bytes; /* bytes from one row to the next */
    const uint8_t *wd = BF ? (shared ? (const uint8_t *)(sh_down + (size_t)h0 * Is)
                                     : (const uint8_t *)(down + ((size_t)(ok ? e : 0) * H + h0) * I))
                           : qm.data + (qmat * qm.rows + h0) * qm.row_bytes;
    const int nch = (NP + 32 * U - 1) / (32 * U);
    uint4 w[DN_R][U];
#pragma unroll
    for (int r = 0; r < DN_R; r++)
#pragma unroll
        for (int uu = 0; uu < U; uu++) {
            const int b = uu * 32 + lane;
            const bool in = ok && h0 + r < H && b < NP;
            w[r][uu] = in ? ld_weights((const uint4 *)(wd + r * rstride) + b) : make_uint4(0, 0, 0, 0);
        }
    const int m = shared ? group_tokens(P / k, p - P, list) : pairs_of_expert(sel, p, P, e, list, wcnt);
    /* From here on the activations of gate_up are needed (and the counters it reset). */
    qd_pdl_wait();
    const int kd = shared ? 1 : k;           /* list entries: tokens, or pairs t * k + j */
    const float *const ap = shared ? sh_act : act;
    float *const op = shared ? sh_out : out;
    for (int g0 = 0; g0 < m; g0 += DN_TG) {
        const int gs = min(DN_TG, m - g0);
        if (g0) __syncthreads();
        for (int c = tid; c < gs * I4; c += DN_NT) {
            const int tt = c / I4, b = c - tt * I4;
            as4[c] = __ldcg((const float4 *)(ap + (size_t)list[g0 + tt] * Ir) + b);
        }
        __syncthreads();
        float acc[DN_R][DN_TG];
#pragma unroll
        for (int r = 0; r < DN_R; r++)
#pragma unroll
            for (int tt = 0; tt < DN_TG; tt++) acc[r][tt] = 0.0f;
        for (int c = 0; c < nch; c++) {
            if (c || g0) {
#pragma unroll
                for (int r = 0; r < DN_R; r++)
#pragma unroll
                    for (int uu = 0; uu < U; uu++) {
                        const int b = (c * U + uu) * 32 + lane;
                        const bool in = ok && h0 + r < H && b < NP;
                        w[r][uu] = in ? ld_weights((const uint4 *)(wd + r * rstride) + b) : make_uint4(0, 0, 0, 0);
                    }
            }
#pragma unroll
            for (int uu = 0; uu < U; uu++) {
                const int b = (c * U + uu) * 32 + lane;
                if (!BF && b < NP) { /* a quantized piece: partial sums per scale block, then the scale */
                    const int c0 = b * WF::COLS;
#pragma unroll
                    for (int r = 0; r < DN_R; r++) {
                        const qf_row row = qf_row_of(qm, qmat, h0 + r < H ? h0 + r : 0);
                        const int z = WF::zero(row, c0);
#pragma unroll
                        for (int j = 0; j < WF::NSUB; j++) {
                            float d[DN_TG];
#pragma unroll
                            for (int tt = 0; tt < DN_TG; tt++) d[tt] = 0.0f;
#pragma unroll
                            for (int q8 = j * (SUBC / 8); q8 < (j + 1) * (SUBC / 8); q8++) {
                                float wf[8];
                                WF::decode8(w[r][uu], q8, z, wf);
#pragma unroll
                                for (int tt = 0; tt < DN_TG; tt++) {
                                    if (tt < gs) {
                                        const float4 a0 = as4[tt * I4 + (c0 >> 2) + 2 * q8];
                                        const float4 a1 = as4[tt * I4 + (c0 >> 2) + 2 * q8 + 1];
                                        const float af[8] = {a0.x, a0.y, a0.z, a0.w, a1.x, a1.y, a1.z, a1.w};
#pragma unroll
                                        for (int q = 0; q < 8; q++) d[tt] = fmaf(wf[q], af[q], d[tt]);
                                    }
                                }
                            }
                            const float sc = WF::scale(row, c0, j) * WF::post(row);
#pragma unroll
                            for (int tt = 0; tt < DN_TG; tt++) acc[r][tt] = fmaf(sc, d[tt], acc[r][tt]);
                        }
                    }
                } else if (BF && b < (Ir >> 3)) {
#pragma unroll
                    for (int tt = 0; tt < DN_TG; tt++) {
                        if (tt < gs) {
                            const float4 a0 = as4[tt * I4 + 2 * b], a1 = as4[tt * I4 + 2 * b + 1];
                            const float af[8] = {a0.x, a0.y, a0.z, a0.w, a1.x, a1.y, a1.z, a1.w};
#pragma unroll
                            for (int r = 0; r < DN_R; r++) {
                                float wf[8];
                                bf16x8(w[r][uu], wf);
#pragma unroll
                                for (int q = 0; q < 8; q++) acc[r][tt] = fmaf(wf[q], af[q], acc[r][tt]);
                            }
                        }
                    }
                }
            }
        }
#pragma unroll
        for (int tt = 0; tt < DN_TG; tt++) {
            if (tt < gs) {
                const size_t q = (size_t)list[g0 + tt];
#pragma unroll
                for (int r = 0; r < DN_R; r++) {
                    const float v = warp_sum(acc[r][tt]);
                    if (lane == 0 && h0 + r < H) op[q * H + h0 + r] = v;
                }
            }
        }
        /* Publish this pass's outputs, then count them in; the block that
         * brings a (token, row tile) to nslot adds the token's slots into y. */
        __threadfence();
        __syncthreads();
        if (tid < gs) {
            const int t = list[g0 + tid] / kd;
            last[tid] = atomicAdd(&counters[(size_t)t * n_ctr + blockIdx.x], 1) == nslot - 1;
        }
        __syncthreads();
        if (tid < gs * QD_MOE_DN_ROWS) {
            const int tt = tid / QD_MOE_DN_ROWS, h = blockIdx.x * QD_MOE_DN_ROWS + tid % QD_MOE_DN_ROWS;
            if (last[tt] && h < H) {
                __threadfence();
                const size_t t = (size_t)(list[g0 + tt] / kd);
                float s = 0.0f;
                for (int j = 0; j < k; j++) s = fmaf(__ldcg(wts + t * k + j), __ldcg(out + (t * k + j) * H + h), s);
                if (sh_down) { /* as the unfused path: sigmoid(gate) * shared, then the routed sum */
                    const float sg = __ldcg(sh_gate + t * sh_gate_ld);
                    s = __fmul_rn(1.0f / (1.0f + expf(-sg)), __ldcg(sh_out + t * H + h)) + s;
                }
                y[t * H + h] = __ldcg(y + t * H + h) + s;
            }
        }
    }
}

template <class WF>
static qd_status moe_decode_launch(const qd_cuda_moe_args *a, const qd_moe_work *w, const qd_moe_shared *sh,
                                   const qd_moe_qw &qw, int pdl, cudaStream_t s) {
    const int P = a->n * a->k;
    const int n_ctr = (a->H + QD_MOE_DN_ROWS - 1) / QD_MOE_DN_ROWS;
    const int has_sh = sh && (sh->gate_up || sh->q_gate_up);
    const int Is = has_sh ? sh->I : 0, Imax = a->I > Is ? a->I : Is;
    const int tg = P < GU_TG ? P : GU_TG, dg = P < DN_TG ? P : DN_TG;
    const size_t gu_smem = (size_t)tg * a->H * 2, dn_smem = (size_t)dg * Imax * 4;
    if (gu_smem > 48 * 1024)
        QD_CUDA_TRY(cudaFuncSetAttribute(moe_gate_up_decode<WF>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         (int)gu_smem));
    if (dn_smem > 48 * 1024)
        QD_CUDA_TRY(cudaFuncSetAttribute(moe_down_decode<WF>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         (int)dn_smem));
    const int sh_rows = has_sh ? (a->n + SH_TG - 1) / SH_TG : 0;
    const dim3 grid_gu((unsigned)(Imax / GU_WARPS), (unsigned)(P + sh_rows)), grid_dn((unsigned)n_ctr, (unsigned)(P + sh_rows));
    /* a non-NULL marker of the shared expert for the kernels' tests (its weights are in qw) */
    const uint16_t *sh_gu = has_sh ? (sh->gate_up ? sh->gate_up : (const uint16_t *)sh->q_gate_up->data) : NULL;
    const uint16_t *sh_dn = has_sh ? (sh->down ? sh->down : (const uint16_t *)sh->q_down->data) : NULL;
    qd_status st = qd_launch_pdl(pdl, moe_gate_up_decode<WF>, grid_gu, dim3(GU_NT), gu_smem, s, qw, a->d_x, a->d_sel,
                                 a->d_gate_up, w->act, w->counters, n_ctr, P, a->H, a->I, a->E, a->k, sh_gu, Is,
                                 has_sh ? sh->act : (float *)NULL);
    if (st) return st;
    return qd_launch_pdl(1, moe_down_decode<WF>, grid_dn, dim3(DN_NT), dn_smem, s, qw, a->d_sel, a->d_w, a->d_down,
                         (const float *)w->act, w->out, w->counters, a->d_y, n_ctr, P, a->H, a->I, a->E, a->k, sh_dn,
                         Is, has_sh ? (const float *)sh->act : (const float *)NULL, has_sh ? sh->out : (float *)NULL,
                         has_sh ? sh->gate : (const float *)NULL, has_sh ? sh->gate_ld : (int64_t)0);
}

int qd_moe_decode_takes(const qd_cuda_moe_args *a, const qd_moe_shared *sh) {
    const int has_sh = sh && (sh->gate_up || sh->q_gate_up);
    if (!a->q_gate_up != !a->q_down) return 0;
    if (!a->q_gate_up) return !has_sh || (sh->gate_up && sh->down && !sh->q_gate_up);
    const int dt = a->q_gate_up->dtype, cols = dt == QD_DTYPE_F8_E4M3 ? 16 : 32;
    if (a->q_down->dtype != dt || a->H % cols || a->I % cols) return 0;
    if (has_sh && (!sh->q_gate_up || !sh->q_down || sh->q_gate_up->dtype != dt || sh->q_down->dtype != dt ||
                   sh->I % cols))
        return 0;
    return dt == QD_DTYPE_F8_E4M3 || dt == QD_DTYPE_INT4 || dt == QD_DTYPE_NVFP4;
}

qd_status qd_moe_decode(const qd_cuda_moe_args *a, const qd_moe_work *w, const qd_moe_shared *sh, int pdl,
                        cudaStream_t s) {
    if (!qd_moe_decode_takes(a, sh))
        return qd_cuda_fail(QD_ERR_INVALID_ARG, "MoE decode: the routed and shared experts' formats or shapes "
                                                "differ from what the kernels take");
    qd_moe_qw qw = {};
    if (a->q_gate_up) {
        qw.gate_up = *a->q_gate_up;
        qw.down = *a->q_down;
    }
    if (sh && sh->q_gate_up) {
        qw.sh_gate_up = *sh->q_gate_up;
        qw.sh_down = *sh->q_down;
    }
    switch (a->q_gate_up ? a->q_gate_up->dtype : QD_DTYPE_BF16) {
    case QD_DTYPE_F8_E4M3: return moe_decode_launch<qf_f8>(a, w, sh, qw, pdl, s);
    case QD_DTYPE_INT4: return moe_decode_launch<qf_int4>(a, w, sh, qw, pdl, s);
    case QD_DTYPE_NVFP4: return moe_decode_launch<qf_nvfp4>(a, w, sh, qw, pdl, s);
    default: return moe_decode_launch<qf_bf16>(a, w, sh, qw, pdl, s);
    }
}
