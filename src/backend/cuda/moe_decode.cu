/* Decode path of the routed experts: a few tokens, so two GEMV kernels bound
 * by reading the expert weights (3 I H bf16 per active expert).
 *
 *   gate_up: block (8 rows i, pair p). act[q][i] = silu(gate_i . x) * (up_i . x)
 *   down:    block (32 rows h, pair p). out[q][h] = down_h . act[q], then
 *            y[t][h] += sum_j w[t][j] out[t k + j][h] once all k slots are in.
 *
 * Weights are read once per step even when several tokens chose the same
 * expert: the block of the first pair (in pair order) that chose expert e
 * owns e and runs every pair that chose it, up to 4 tokens per pass
 * over the weights; blocks of the other pairs exit at once. The grid depends
 * only on n, nothing is read back, nothing allocated: graph-capturable.
 *
 * Two families of the same two kernels, which differ in how the weights arrive:
 *   bf16: each lane streams its pieces into registers (a row's first chunk in
 *     flight before the routing is known where it can be), 4 blocks per SM.
 *   quantized (FP8, INT4, NVFP4): the weights land in shared memory by bulk
 *     asynchronous copies (cuda_bulk.cuh), one per row and stage, so the bytes in
 *     flight cost no registers; a warp's rows of one stage (gate_up: 2 rows of up
 *     to 2 KiB, down: 4 of up to 1 KiB, 4-bit formats half) are one wait, up to two
 *     stages in flight. A decoded piece needs more registers than a bf16 one, so in
 *     registers these ran 3 blocks per SM: the 576 blocks of a 35B-A3B layer at
 *     batch 1 took 1.45 waves. Staged and built for one token a pass, 5 blocks
 *     per SM hold them in one wave. Staging bf16 (64 KiB a gate_up block, 2-3 blocks
 *     per SM) was measured slower at every batch (bench/RESULTS.md, session 21).
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

#include "backend/cuda/cuda_bulk.cuh"
#include "backend/cuda/cuda_pdl.cuh"
#include "backend/cuda/cuda_util.h"
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_qformat.cuh"
#include "backend/cuda/moe_internal.cuh"

#define GU_NT 256        /* threads of a gate_up block: 8 warps, one row i (gate and up) each */
#define GU_WARPS (GU_NT / 32)
#define GU_TG 4          /* tokens per pass over the weights */
#define GU_U 4           /* bf16: 16-byte loads per row per lane in flight, 1024 columns a chunk */
#define GU_SB 2048       /* bytes of a row in one shared-memory stage: 128 pieces, 4 a lane (4-bit: half) */
#define GU_NST 2         /* stages a warp has in flight */
#define DN_NT 256        /* threads of a down block: 8 warps */
#define DN_WARPS (DN_NT / 32)
#define DN_R (QD_MOE_DN_ROWS / DN_WARPS) /* rows h per warp */
#define DN_TG 4
#define DN_U 2           /* bf16: 16-byte loads per row per lane, 512 columns a chunk */
#define DN_SB 1024       /* bytes of a row in one stage: 64 pieces, 2 a lane (4-bit: half) */
#define DN_NST 2
#define SH_TG 4          /* tokens per block row of the shared expert: one pass of either kernel */
static_assert(SH_TG <= GU_TG && SH_TG <= DN_TG, "a shared-expert block row is one pass");
static_assert(GU_SB % 1024 == 0 && DN_SB % 1024 == 0, "a stage is whole 16-byte pieces for every lane");

/* A stage's bytes a row: 4-bit rows hold twice the columns a byte, so half the bytes
 * keep a stage's columns and a lane's scales the same. */
__host__ __device__ constexpr int stage_bytes(int full, int dtype) {
    return dtype == QD_DTYPE_INT4 || dtype == QD_DTYPE_NVFP4 ? full / 2 : full;
}

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


/* A pass's token rows of x (bf16, H8 pieces of 8) into xs: list entries g0 .. g0 + gs - 1,
 * entry q being row q / kd; read through L2 (cuda_pdl.cuh). Then the block's barrier. */
__device__ __forceinline__ void load_pass_x(uint4 *xs, const uint16_t *x, const int *list, int g0, int gs, int kd,
                                            int H8) {
    const uint4 *x4 = (const uint4 *)x;
    for (int c = threadIdx.x; c < gs * H8; c += blockDim.x) {
        const int tt = c / H8, b = c - tt * H8;
        xs[c] = __ldcg(x4 + (size_t)(list[g0 + tt] / kd) * H8 + b);
    }
    __syncthreads();
}

/* A pass's activations (fp32, rows of Ir) into as4, as load_pass_x. */
__device__ __forceinline__ void load_pass_act(float4 *as4, const float *ap, const int *list, int g0, int gs, int Ir) {
    const int I4 = Ir >> 2;
    for (int c = threadIdx.x; c < gs * I4; c += blockDim.x) {
        const int tt = c / I4, b = c - tt * I4;
        as4[c] = __ldcg((const float4 *)(ap + (size_t)list[g0 + tt] * Ir) + b);
    }
    __syncthreads();
}

/* silu(gate) * up of a warp's row i for the pass's gs entries, from the lanes' partial sums. */
template <int TG>
__device__ __forceinline__ void store_act(const float (&ag)[TG], const float (&au)[TG], int gs, const int *list,
                                          int g0, float *ap, int rows, int i) {
#pragma unroll
    for (int tt = 0; tt < TG; tt++) {
        if (tt < gs) {
            const float sg = warp_sum(ag[tt]), su = warp_sum(au[tt]);
            if ((threadIdx.x & 31) == 0) ap[(size_t)list[g0 + tt] * rows + i] = sg / (1.0f + expf(-sg)) * su;
        }
    }
}

/* What a down block adds into y once a (token, row tile) has all its slots. */
typedef struct dn_combine {
    int32_t *counters;  /* [n][n_ctr] slots done per (token, row tile) */
    int n_ctr, nslot;   /* row tiles; completions per (token, row tile): k, + 1 with the shared expert */
    int k, H;
    const float *wts;   /* [n][k] routing weights */
    const float *out;   /* [n k][H] pair outputs */
    const float *sh_out, *sh_gate; /* the shared expert's [n][H] output and gate logits, or NULL */
    int64_t sh_gate_ld;
    float *y;           /* [n][H] += */
} dn_combine;

/* The end of a down pass: the warp's DN_R rows from h0 for the pass's gs entries into op
 * (the pair's or the shared expert's output), then counted in; the block that brings a
 * (token, row tile) to nslot adds the token's slots into y in slot order. last: DN_TG
 * ints of shared scratch. */
template <int TG>
__device__ __forceinline__ void finish_down_pass(const float (&acc)[DN_R][TG], int gs, const int *list, int g0,
                                                 int kd, float *op, int h0, int *last, const dn_combine &cb) {
    const int tid = threadIdx.x, lane = tid & 31, H = cb.H;
#pragma unroll
    for (int tt = 0; tt < TG; tt++) {
        if (tt < gs) {
            const size_t q = (size_t)list[g0 + tt];
#pragma unroll
            for (int r = 0; r < DN_R; r++) {
                const float v = warp_sum(acc[r][tt]);
                if (lane == 0 && h0 + r < H) op[q * H + h0 + r] = v;
            }
        }
    }
    /* publish this pass's outputs, then count them in */
    __threadfence();
    __syncthreads();
    if (tid < gs) {
        const int t = list[g0 + tid] / kd;
        last[tid] = atomicAdd(&cb.counters[(size_t)t * cb.n_ctr + blockIdx.x], 1) == cb.nslot - 1;
    }
    __syncthreads();
    if (tid < gs * QD_MOE_DN_ROWS) {
        const int tt = tid / QD_MOE_DN_ROWS, h = blockIdx.x * QD_MOE_DN_ROWS + tid % QD_MOE_DN_ROWS;
        if (last[tt] && h < H) {
            __threadfence();
            const size_t t = (size_t)(list[g0 + tt] / kd);
            float s = 0.0f;
            for (int j = 0; j < cb.k; j++)
                s = fmaf(__ldcg(cb.wts + t * cb.k + j), __ldcg(cb.out + (t * cb.k + j) * H + h), s);
            if (cb.sh_out) { /* as the unfused path: sigmoid(gate) * shared, then the routed sum */
                const float sg = __ldcg(cb.sh_gate + t * cb.sh_gate_ld);
                s = __fmul_rn(1.0f / (1.0f + expf(-sg)), __ldcg(cb.sh_out + t * H + h)) + s;
            }
            cb.y[t * H + h] = __ldcg(cb.y + t * H + h) + s;
        }
    }
}

/* ---- bf16: the weights streamed through registers ---------------------------------- */

/* Weights are streamed once per step (qd_ld_stream16, cuda_common.cuh). */
__device__ __forceinline__ uint4 ld_weights(const uint4 *p) { return qd_ld_stream16(p); }

__global__ void __launch_bounds__(GU_NT, 4)
moe_gate_up_bf16(const uint16_t *__restrict__ x, const int32_t *sel, const uint16_t *__restrict__ gate_up,
                 float *__restrict__ act, int32_t *__restrict__ counters, int n_ctr, int P, int H, int I, int E,
                 int k, const uint16_t *__restrict__ sh_gate_up, int Is, float *__restrict__ sh_act) {
    extern __shared__ uint4 xs[]; /* [GU_TG][H / 8] the pass's token rows, bf16 */
    __shared__ int list[QD_MOE_DECODE_MAX_PAIRS];
    __shared__ int wcnt[GU_WARPS];
    const int p = blockIdx.y, tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int i = blockIdx.x * GU_WARPS + warp; /* I, Is % 8 == 0: a block's warps all have rows or none */
    const bool shared = p >= P;                 /* the block rows after the pairs (only with sh_gate_up) */
    const int rows = shared ? Is : I;
    const int H8 = H >> 3;
    const int nch = (H8 + 32 * GU_U - 1) / (32 * GU_U);
    const uint4 *wg = NULL, *wu = NULL;
    bool ok = false;
    uint4 g[GU_U], u[GU_U];
#pragma unroll
    for (int uu = 0; uu < GU_U; uu++) g[uu] = u[uu] = make_uint4(0, 0, 0, 0);
    /* The first chunk of weights before anything else: the long-latency traffic.
     * The shared expert's are known before the routing, so before the wait. */
    if (shared && blockIdx.x * GU_WARPS < Is) {
        ok = true;
        wg = (const uint4 *)(sh_gate_up + (size_t)i * H);
        wu = wg + (size_t)Is * H8;
#pragma unroll
        for (int uu = 0; uu < GU_U; uu++) {
            const int b = uu * 32 + lane;
            if (b < H8) {
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
        wg = (const uint4 *)(gate_up + ((size_t)(ok ? e : 0) * 2 * I + i) * H);
        wu = wg + (size_t)I * H8;
#pragma unroll
        for (int uu = 0; uu < GU_U; uu++) {
            const int b = uu * 32 + lane;
            const bool in = ok && b < H8;
            g[uu] = in ? ld_weights(wg + b) : make_uint4(0, 0, 0, 0);
            u[uu] = in ? ld_weights(wu + b) : make_uint4(0, 0, 0, 0);
        }
        m = pairs_of_expert(sel, p, P, e, list, wcnt);
    }
    const int kd = shared ? 1 : k;              /* list entries: tokens, or pairs t * k + j */
    float *const ap = shared ? sh_act : act;    /* [list entry][rows] */
    for (int g0 = 0; g0 < m; g0 += GU_TG) {
        const int gs = min(GU_TG, m - g0);
        if (g0) __syncthreads(); /* the previous pass is done with xs */
        load_pass_x(xs, x, list, g0, gs, kd, H8);
        float ag[GU_TG], au[GU_TG];
#pragma unroll
        for (int tt = 0; tt < GU_TG; tt++) ag[tt] = au[tt] = 0.0f;
        for (int c = 0; c < nch; c++) {
            if (c || g0) {
#pragma unroll
                for (int uu = 0; uu < GU_U; uu++) {
                    const int b = (c * GU_U + uu) * 32 + lane;
                    const bool in = ok && b < H8;
                    g[uu] = in ? ld_weights(wg + b) : make_uint4(0, 0, 0, 0);
                    u[uu] = in ? ld_weights(wu + b) : make_uint4(0, 0, 0, 0);
                }
            }
#pragma unroll
            for (int uu = 0; uu < GU_U; uu++) {
                const int b = (c * GU_U + uu) * 32 + lane;
                if (b >= H8) continue;
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
        store_act<GU_TG>(ag, au, gs, list, g0, ap, rows, i);
    }
}

__global__ void __launch_bounds__(DN_NT, 4)
moe_down_bf16(const int32_t *sel, const uint16_t *__restrict__ down, const float *act, float *out, int P, int I,
              int E, const uint16_t *__restrict__ sh_down, int Is, const float *sh_act, float *sh_out,
              const __grid_constant__ dn_combine cb) {
    extern __shared__ float4 as4[]; /* [DN_TG][max(I, Is) / 4] the pass's activations */
    __shared__ int list[QD_MOE_DECODE_MAX_PAIRS];
    __shared__ int wcnt[DN_WARPS];
    __shared__ int last[DN_TG];
    const int p = blockIdx.y, tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const bool shared = p >= P; /* only with sh_down */
    const int H = cb.H, k = cb.k;
    int e = 0;
    if (!shared) {
        e = __ldcg(sel + p);
        if (not_owner(sel, p, e)) return;
    }
    const bool ok = shared || (e >= 0 && e < E);
    const int Ir = shared ? Is : I;
    const int I4 = Ir >> 2, I8 = Ir >> 3; /* pieces per row */
    const int h0 = blockIdx.x * QD_MOE_DN_ROWS + warp * DN_R;
    const uint8_t *wd = shared ? (const uint8_t *)(sh_down + (size_t)h0 * Is)
                               : (const uint8_t *)(down + ((size_t)(ok ? e : 0) * H + h0) * I);
    const int64_t rstride = (int64_t)Ir * 2;
    const int nch = (I8 + 32 * DN_U - 1) / (32 * DN_U);
    uint4 w[DN_R][DN_U];
#pragma unroll
    for (int r = 0; r < DN_R; r++)
#pragma unroll
        for (int uu = 0; uu < DN_U; uu++) {
            const int b = uu * 32 + lane;
            const bool in = ok && h0 + r < H && b < I8;
            w[r][uu] = in ? ld_weights((const uint4 *)(wd + r * rstride) + b) : make_uint4(0, 0, 0, 0);
        }
    const int m = shared ? group_tokens(P / k, p - P, list) : pairs_of_expert(sel, p, P, e, list, wcnt);
    /* From here on the activations of gate_up are needed (and the counters it reset). */
    qd_pdl_wait();
    const int kd = shared ? 1 : k; /* list entries: tokens, or pairs t * k + j */
    const float *const ap = shared ? sh_act : act;
    float *const op = shared ? sh_out : out;
    for (int g0 = 0; g0 < m; g0 += DN_TG) {
        const int gs = min(DN_TG, m - g0);
        if (g0) __syncthreads();
        load_pass_act(as4, ap, list, g0, gs, Ir);
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
                    for (int uu = 0; uu < DN_U; uu++) {
                        const int b = (c * DN_U + uu) * 32 + lane;
                        const bool in = ok && h0 + r < H && b < I8;
                        w[r][uu] = in ? ld_weights((const uint4 *)(wd + r * rstride) + b) : make_uint4(0, 0, 0, 0);
                    }
            }
#pragma unroll
            for (int uu = 0; uu < DN_U; uu++) {
                const int b = (c * DN_U + uu) * 32 + lane;
                if (b >= I8) continue;
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
        finish_down_pass<DN_TG>(acc, gs, list, g0, kd, op, h0, last, cb);
    }
}

/* ---- quantized: the weights staged in shared memory by bulk copies ------------------ */

/* A warp's weight stream: R rows of rb bytes each (row r at src[r]) cut into chunks
 * of sb bytes, through nst shared stages of R x sb bytes (stage s, row r at
 * buf + (s R + r) sb) with one mbarrier each. Use j of the stream is chunk j % nch
 * of pass j / nch; with nch <= nst every chunk stays resident and later passes read
 * them again without a copy. Lane 0 issues; bytes of rows with src NULL are not
 * copied (their products are not used). */
template <int R> struct wstream {
    const uint8_t *src[R];
    uint8_t *buf;
    uint64_t *bar;
    int rb, sb, nch, nst;
    __device__ bool resident() const { return nch <= nst; }
    __device__ void init() {
        if ((threadIdx.x & 31) == 0) {
            for (int s = 0; s < nst; s++) qd_mbar_init(bar + s, 1);
            qd_mbar_fence_init();
        }
        __syncwarp();
    }
    __device__ void issue(int j, uint64_t policy) {
        if ((threadIdx.x & 31) != 0) return;
        const int c = j % nch, s = j % nst;
        const unsigned bytes = (unsigned)min(sb, rb - c * sb);
        unsigned tot = 0;
#pragma unroll
        for (int r = 0; r < R; r++) tot += src[r] ? bytes : 0u;
        if (j >= nst) qd_fence_proxy_async(); /* the warp's reads of the stage's last use come first */
        qd_mbar_expect(bar + s, tot);
#pragma unroll
        for (int r = 0; r < R; r++)
            if (src[r]) qd_bulk_load(buf + (size_t)(s * R + r) * sb, src[r] + (size_t)c * sb, bytes, bar + s, policy);
    }
    /* The first uses of the stream (pass 0). */
    __device__ void start(uint64_t policy) {
        for (int j = 0; j < min(nst, nch); j++) issue(j, policy);
    }
    /* Row r of use j once it has landed. */
    __device__ const uint4 *wait(int j) {
        const int s = resident() ? j % nch : j % nst;
        qd_mbar_wait(bar + s, resident() ? 0u : (unsigned)((j / nst) & 1));
        return (const uint4 *)(buf + (size_t)s * R * sb);
    }
    /* After the warp has read use j: refill its stage with use j + nst when the stream has it. */
    __device__ void done(int j, int uses, uint64_t policy) {
        if (resident() || j + nst >= uses) return;
        __syncwarp();
        issue(j + nst, policy);
    }
};

/* Blocks per SM each instance is built for: with one token a pass (batch 1, the
 * latency case) few accumulators, so 5 blocks: the whole grid of a 35B-A3B layer in
 * one wave; with 4 tokens a pass 3 (gate_up) and 4 (down), as registers allow. */
template <int TG> constexpr int gu_min_blocks() { return TG == 1 ? 5 : 3; }
template <int TG> constexpr int dn_min_blocks() { return TG == 1 ? 5 : 4; }

/* TG: tokens a pass at most (1 or GU_TG); tg: the call's, min(n, TG) */
template <class WF, int TG>
__global__ void __launch_bounds__(GU_NT, gu_min_blocks<TG>())
moe_gate_up_quant(const __grid_constant__ qd_moe_qw qw, const uint16_t *__restrict__ x, const int32_t *sel,
                  float *__restrict__ act, int32_t *__restrict__ counters, int n_ctr, int P, int H, int I, int E,
                  int k, int Is, float *__restrict__ sh_act, int tg, int sb, int nst) {
    /* [GU_WARPS][nst][2][sb] each warp's weight stages (gate row, up row), then
     * [tg][H / 8] the pass's token rows, bf16 (no expert of a token's own choosing
     * comes twice, so passes of min(n, TG) are rarely cut short) */
    extern __shared__ __align__(128) uint8_t gsm[];
    __shared__ uint64_t bars[GU_WARPS][GU_NST];
    __shared__ int list[QD_MOE_DECODE_MAX_PAIRS];
    __shared__ int wcnt[GU_WARPS];
    const int p = blockIdx.y, tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int i = blockIdx.x * GU_WARPS + warp; /* I, Is % 8 == 0: a block's warps all have rows or none */
    const bool shared = p >= P;                 /* the block rows after the pairs (with a shared expert) */
    const int rows = shared ? Is : I;
    constexpr int U = stage_bytes(GU_SB, WF::DTYPE) / 16 / 32; /* pieces a lane takes from a full stage */
    constexpr int PC = WF::COLS / 8;        /* x's 16-byte pieces (8 bf16) per weight piece */
    constexpr int SUBC = WF::COLS / WF::NSUB;
    const int H8 = H >> 3, NP = H / WF::COLS; /* H % WF::COLS == 0 for the quantized layouts (moe.cu) */
    const int PPS = sb >> 4;                  /* pieces of a row in one stage */
    wstream<2> ws;
    ws.buf = gsm + (size_t)warp * nst * 2 * sb;
    ws.bar = bars[warp];
    ws.rb = NP * 16;
    ws.sb = sb;
    ws.nch = (ws.rb + sb - 1) / sb;
    ws.nst = nst;
    ws.init();
    const uint64_t policy = qd_l2_evict_first();
    qf_row rg = {}, ru = {};
    bool ok = false;
    /* The weights before anything else: the long-latency traffic. The shared
     * expert's are known before the routing, so before the wait. */
    if (shared && blockIdx.x * GU_WARPS < Is) {
        ok = true;
        rg = qf_row_of(qw.sh_gate_up, 0, i);
        ru = qf_row_of(qw.sh_gate_up, 1, i);
        ws.src[0] = rg.q;
        ws.src[1] = ru.q;
        ws.start(policy);
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
        if (ok) {
            rg = qf_row_of(qw.gate_up, 2 * e, i);
            ru = qf_row_of(qw.gate_up, 2 * e + 1, i);
            ws.src[0] = rg.q;
            ws.src[1] = ru.q;
            ws.start(policy);
        }
        m = pairs_of_expert(sel, p, P, e, list, wcnt);
    }
    const int kd = shared ? 1 : k;              /* list entries: tokens, or pairs t * k + j */
    float *const ap = shared ? sh_act : act;    /* [list entry][rows] */
    uint4 *xs = (uint4 *)(gsm + (size_t)GU_WARPS * nst * 2 * sb);
    const int uses = ((m + tg - 1) / tg) * ws.nch;
    for (int g0 = 0; g0 < m; g0 += tg) {
        const int gs = min(tg, m - g0);
        if (g0) __syncthreads(); /* the previous pass is done with xs */
        load_pass_x(xs, x, list, g0, gs, kd, H8);
        float ag[TG], au[TG];
#pragma unroll
        for (int tt = 0; tt < TG; tt++) ag[tt] = au[tt] = 0.0f;
        for (int c = 0; ok && c < ws.nch; c++) {
            const int j = (g0 / tg) * ws.nch + c;
            /* the chunk's scales are read while its weights land */
            float sg[U][WF::NSUB], su[U][WF::NSUB];
            int zg[U], zu[U];
#pragma unroll
            for (int uu = 0; uu < U; uu++) {
                const int b = c * PPS + uu * 32 + lane, c0 = b * WF::COLS;
                const bool in = uu * 32 + lane < PPS && b < NP;
                zg[uu] = in ? WF::zero(rg, c0) : 0;
                zu[uu] = in ? WF::zero(ru, c0) : 0;
#pragma unroll
                for (int s = 0; s < WF::NSUB; s++) {
                    sg[uu][s] = in ? WF::scale(rg, c0, s) * WF::post(rg) : 0.0f;
                    su[uu][s] = in ? WF::scale(ru, c0, s) * WF::post(ru) : 0.0f;
                }
            }
            const uint4 *wgs = ws.wait(j), *wus = wgs + PPS;
#pragma unroll
            for (int uu = 0; uu < U; uu++) {
                const int bl = uu * 32 + lane, b = c * PPS + bl;
                if (bl >= PPS || b >= NP) continue;
                const uint4 gv = wgs[bl], uv = wus[bl];
                /* partial sums per scale block, then the scale */
#pragma unroll
                for (int s = 0; s < WF::NSUB; s++) {
                    float dg[TG], du[TG];
#pragma unroll
                    for (int tt = 0; tt < TG; tt++) dg[tt] = du[tt] = 0.0f;
#pragma unroll
                    for (int q8 = s * (SUBC / 8); q8 < (s + 1) * (SUBC / 8); q8++) {
                        float gf[8], uf[8];
                        WF::decode8(gv, q8, zg[uu], gf);
                        WF::decode8(uv, q8, zu[uu], uf);
#pragma unroll
                        for (int tt = 0; tt < TG; tt++) {
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
#pragma unroll
                    for (int tt = 0; tt < TG; tt++) {
                        ag[tt] = fmaf(sg[uu][s], dg[tt], ag[tt]);
                        au[tt] = fmaf(su[uu][s], du[tt], au[tt]);
                    }
                }
            }
            ws.done(j, uses, policy);
        }
        store_act<TG>(ag, au, gs, list, g0, ap, rows, i);
    }
}

template <class WF, int TG>
__global__ void __launch_bounds__(DN_NT, dn_min_blocks<TG>())
moe_down_quant(const __grid_constant__ qd_moe_qw qw, const int32_t *sel, const float *act, float *out, int P, int I,
               int E, int Is, const float *sh_act, float *sh_out, const __grid_constant__ dn_combine cb, int tg,
               int sb, int nst) {
    /* [DN_WARPS][nst][DN_R][sb] each warp's weight stages, then [tg][max(I, Is) / 4]
     * the pass's activations */
    extern __shared__ __align__(128) uint8_t dsm[];
    __shared__ uint64_t bars[DN_WARPS][DN_NST];
    __shared__ int list[QD_MOE_DECODE_MAX_PAIRS];
    __shared__ int wcnt[DN_WARPS];
    __shared__ int last[DN_TG];
    const int p = blockIdx.y, tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const bool shared = p >= P; /* only with the shared expert */
    const int H = cb.H, k = cb.k;
    int e = 0;
    if (!shared) {
        e = __ldcg(sel + p);
        if (not_owner(sel, p, e)) return;
    }
    const bool ok = shared || (e >= 0 && e < E);
    constexpr int U = stage_bytes(DN_SB, WF::DTYPE) / 16 / 32; /* pieces a lane takes from a full stage */
    constexpr int SUBC = WF::COLS / WF::NSUB;
    const int Ir = shared ? Is : I;
    const int I4 = Ir >> 2, NP = Ir / WF::COLS; /* pieces per row */
    const int PPS = sb >> 4;
    const int h0 = blockIdx.x * QD_MOE_DN_ROWS + warp * DN_R;
    const qd_cuda_qmats &qm = shared ? qw.sh_down : qw.down;
    const int64_t qmat = shared ? 0 : (ok ? e : 0);
    const uint8_t *wd = qm.data + (qmat * qm.rows + h0) * qm.row_bytes;
    wstream<DN_R> ws;
    ws.buf = dsm + (size_t)warp * nst * DN_R * sb;
    ws.bar = bars[warp];
    ws.rb = NP * 16;
    ws.sb = sb;
    ws.nch = (ws.rb + sb - 1) / sb;
    ws.nst = nst;
#pragma unroll
    for (int r = 0; r < DN_R; r++) ws.src[r] = ok && h0 + r < H ? wd + r * qm.row_bytes : (const uint8_t *)0;
    ws.init();
    const uint64_t policy = qd_l2_evict_first();
    ws.start(policy);
    const int m = shared ? group_tokens(P / k, p - P, list) : pairs_of_expert(sel, p, P, e, list, wcnt);
    /* From here on the activations of gate_up are needed (and the counters it reset). */
    qd_pdl_wait();
    const int kd = shared ? 1 : k; /* list entries: tokens, or pairs t * k + j */
    const float *const ap = shared ? sh_act : act;
    float *const op = shared ? sh_out : out;
    float4 *as4 = (float4 *)(dsm + (size_t)DN_WARPS * nst * DN_R * sb);
    const int uses = ((m + tg - 1) / tg) * ws.nch;
    for (int g0 = 0; g0 < m; g0 += tg) {
        const int gs = min(tg, m - g0);
        if (g0) __syncthreads();
        load_pass_act(as4, ap, list, g0, gs, Ir);
        float acc[DN_R][TG];
#pragma unroll
        for (int r = 0; r < DN_R; r++)
#pragma unroll
            for (int tt = 0; tt < TG; tt++) acc[r][tt] = 0.0f;
        for (int c = 0; ok && c < ws.nch; c++) {
            const int j = (g0 / tg) * ws.nch + c;
            const uint4 *wsm = ws.wait(j);
#pragma unroll
            for (int uu = 0; uu < U; uu++) {
                const int bl = uu * 32 + lane, b = c * PPS + bl;
                if (bl >= PPS || b >= NP) continue;
                const int c0 = b * WF::COLS;
#pragma unroll
                for (int r = 0; r < DN_R; r++) { /* partial sums per scale block, then the scale */
                    const qf_row row = qf_row_of(qm, qmat, h0 + r < H ? h0 + r : 0);
                    const int z = WF::zero(row, c0);
                    const uint4 wv = wsm[r * PPS + bl];
#pragma unroll
                    for (int s = 0; s < WF::NSUB; s++) {
                        float d[TG];
#pragma unroll
                        for (int tt = 0; tt < TG; tt++) d[tt] = 0.0f;
#pragma unroll
                        for (int q8 = s * (SUBC / 8); q8 < (s + 1) * (SUBC / 8); q8++) {
                            float wf[8];
                            WF::decode8(wv, q8, z, wf);
#pragma unroll
                            for (int tt = 0; tt < TG; tt++) {
                                if (tt < gs) {
                                    const float4 a0 = as4[tt * I4 + (c0 >> 2) + 2 * q8];
                                    const float4 a1 = as4[tt * I4 + (c0 >> 2) + 2 * q8 + 1];
                                    const float af[8] = {a0.x, a0.y, a0.z, a0.w, a1.x, a1.y, a1.z, a1.w};
#pragma unroll
                                    for (int q = 0; q < 8; q++) d[tt] = fmaf(wf[q], af[q], d[tt]);
                                }
                            }
                        }
                        const float sc = WF::scale(row, c0, s) * WF::post(row);
#pragma unroll
                        for (int tt = 0; tt < TG; tt++) acc[r][tt] = fmaf(sc, d[tt], acc[r][tt]);
                    }
                }
            }
            ws.done(j, uses, policy);
        }
        finish_down_pass<TG>(acc, gs, list, g0, kd, op, h0, last, cb);
    }
}

/* The stages of a stream of rows of rb bytes: sb bytes a row a stage, nst stages. */
static void stage_shape(int rb, int max_sb, int max_nst, int *sb, int *nst) {
    *sb = rb < max_sb ? rb : max_sb;
    const int nch = (rb + *sb - 1) / *sb;
    *nst = nch < max_nst ? nch : max_nst;
}

/* 16-byte pieces of a row of cols columns in dtype. */
static int row_pieces(int dtype, int cols) {
    return cols / (dtype == QD_DTYPE_F8_E4M3 ? 16 : dtype == QD_DTYPE_BF16 ? 8 : 32);
}

typedef struct decode_shape {
    int tg;              /* tokens (gate_up) or pairs (down) a pass */
    int gu_sb, gu_nst;   /* quantized: gate_up stages */
    int dn_sb, dn_nst;   /* quantized: down stages */
    size_t gu_smem, dn_smem; /* dynamic shared memory of a block */
} decode_shape;

/* bf16 passes take GU_TG tokens (min(P, GU_TG) of x in shared memory); quantized ones
 * min(n, GU_TG) beside their stages. */
static decode_shape shape_of(int n, int P, int H, int I, int Is, int dtype) {
    decode_shape d = {};
    const int Imax = I > Is ? I : Is;
    if (dtype == QD_DTYPE_BF16) {
        d.tg = P < GU_TG ? P : GU_TG;
        d.gu_smem = (size_t)d.tg * H * 2;
        d.dn_smem = (size_t)d.tg * Imax * 4;
        return d;
    }
    d.tg = n < GU_TG ? n : GU_TG;
    stage_shape(row_pieces(dtype, H) * 16, stage_bytes(GU_SB, dtype), GU_NST, &d.gu_sb, &d.gu_nst);
    stage_shape(row_pieces(dtype, Imax) * 16, stage_bytes(DN_SB, dtype), DN_NST, &d.dn_sb, &d.dn_nst);
    d.gu_smem = (size_t)GU_WARPS * d.gu_nst * 2 * d.gu_sb + (size_t)d.tg * H * 2;
    d.dn_smem = (size_t)DN_WARPS * d.dn_nst * DN_R * d.dn_sb + (size_t)d.tg * Imax * 4;
    return d;
}

/* Dynamic shared memory a block may take on sm_90 beside these kernels' 4.3 KiB of static (227 KiB in all). */
#define MAX_DYN_SMEM (222 * 1024)

/* Opts the kernel in to bytes of dynamic shared memory (static and dynamic together
 * past 48 KiB need it); staged kernels also ask for the largest shared-memory carveout,
 * the stages standing in for L1 (the weights bypass it). */
template <class K> static cudaError_t set_smem(K kernel, size_t bytes, int staged) {
    cudaError_t e = cudaSuccess;
    if (staged) e = cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout, 100);
    if (e == cudaSuccess) e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes);
    return e;
}

static dn_combine combine_of(const qd_cuda_moe_args *a, const qd_moe_work *w, const qd_moe_shared *sh, int has_sh,
                             int n_ctr) {
    dn_combine cb;
    cb.counters = w->counters;
    cb.n_ctr = n_ctr;
    cb.nslot = a->k + (has_sh ? 1 : 0);
    cb.k = a->k;
    cb.H = a->H;
    cb.wts = a->d_w;
    cb.out = w->out;
    cb.sh_out = has_sh ? sh->out : NULL;
    cb.sh_gate = has_sh ? sh->gate : NULL;
    cb.sh_gate_ld = has_sh ? sh->gate_ld : 0;
    cb.y = a->d_y;
    return cb;
}

static qd_status launch_bf16(const qd_cuda_moe_args *a, const qd_moe_work *w, const qd_moe_shared *sh,
                             const decode_shape &d, int pdl, cudaStream_t s) {
    const int P = a->n * a->k, n_ctr = (a->H + QD_MOE_DN_ROWS - 1) / QD_MOE_DN_ROWS;
    const int has_sh = sh && sh->gate_up;
    const int Is = has_sh ? sh->I : 0, Imax = a->I > Is ? a->I : Is;
    QD_CUDA_TRY(set_smem(moe_gate_up_bf16, d.gu_smem, 0));
    QD_CUDA_TRY(set_smem(moe_down_bf16, d.dn_smem, 0));
    const int sh_rows = has_sh ? (a->n + SH_TG - 1) / SH_TG : 0;
    const dim3 grid_gu((unsigned)(Imax / GU_WARPS), (unsigned)(P + sh_rows)),
        grid_dn((unsigned)n_ctr, (unsigned)(P + sh_rows));
    qd_status st = qd_launch_pdl(pdl, moe_gate_up_bf16, grid_gu, dim3(GU_NT), d.gu_smem, s, a->d_x, a->d_sel,
                                 a->d_gate_up, w->act, w->counters, n_ctr, P, a->H, a->I, a->E, a->k,
                                 has_sh ? sh->gate_up : (const uint16_t *)NULL, Is, has_sh ? sh->act : (float *)NULL);
    if (st) return st;
    return qd_launch_pdl(1, moe_down_bf16, grid_dn, dim3(DN_NT), d.dn_smem, s, a->d_sel, a->d_down,
                         (const float *)w->act, w->out, P, a->I, a->E, has_sh ? sh->down : (const uint16_t *)NULL, Is,
                         has_sh ? (const float *)sh->act : (const float *)NULL, has_sh ? sh->out : (float *)NULL,
                         combine_of(a, w, sh, has_sh, n_ctr));
}

template <class WF, int TG>
static qd_status launch_quant(const qd_cuda_moe_args *a, const qd_moe_work *w, const qd_moe_shared *sh,
                              const qd_moe_qw &qw, const decode_shape &d, int pdl, cudaStream_t s) {
    const int P = a->n * a->k, n_ctr = (a->H + QD_MOE_DN_ROWS - 1) / QD_MOE_DN_ROWS;
    const int has_sh = sh && sh->q_gate_up;
    const int Is = has_sh ? sh->I : 0, Imax = a->I > Is ? a->I : Is;
    QD_CUDA_TRY(set_smem(moe_gate_up_quant<WF, TG>, d.gu_smem, 1));
    QD_CUDA_TRY(set_smem(moe_down_quant<WF, TG>, d.dn_smem, 1));
    const int sh_rows = has_sh ? (a->n + SH_TG - 1) / SH_TG : 0;
    const dim3 grid_gu((unsigned)(Imax / GU_WARPS), (unsigned)(P + sh_rows)),
        grid_dn((unsigned)n_ctr, (unsigned)(P + sh_rows));
    qd_status st = qd_launch_pdl(pdl, moe_gate_up_quant<WF, TG>, grid_gu, dim3(GU_NT), d.gu_smem, s, qw, a->d_x,
                                 a->d_sel, w->act, w->counters, n_ctr, P, a->H, a->I, a->E, a->k, Is,
                                 has_sh ? sh->act : (float *)NULL, d.tg, d.gu_sb, d.gu_nst);
    if (st) return st;
    return qd_launch_pdl(1, moe_down_quant<WF, TG>, grid_dn, dim3(DN_NT), d.dn_smem, s, qw, a->d_sel,
                         (const float *)w->act, w->out, P, a->I, a->E, Is,
                         has_sh ? (const float *)sh->act : (const float *)NULL, has_sh ? sh->out : (float *)NULL,
                         combine_of(a, w, sh, has_sh, n_ctr), d.tg, d.dn_sb, d.dn_nst);
}

/* The instance for the call's pass size. */
template <class WF>
static qd_status moe_decode_launch(const qd_cuda_moe_args *a, const qd_moe_work *w, const qd_moe_shared *sh,
                                   const qd_moe_qw &qw, int pdl, cudaStream_t s) {
    const int has_sh = sh && sh->q_gate_up;
    const decode_shape d = shape_of(a->n, a->n * a->k, a->H, a->I, has_sh ? sh->I : 0, WF::DTYPE);
    return d.tg == 1 ? launch_quant<WF, 1>(a, w, sh, qw, d, pdl, s) : launch_quant<WF, GU_TG>(a, w, sh, qw, d, pdl, s);
}

int qd_moe_decode_takes(const qd_cuda_moe_args *a, const qd_moe_shared *sh) {
    const int has_sh = sh && (sh->gate_up || sh->q_gate_up);
    if (!a->q_gate_up != !a->q_down) return 0;
    const int dt = a->q_gate_up ? a->q_gate_up->dtype : QD_DTYPE_BF16;
    /* the largest pass (GU_TG tokens) must fit a block's shared memory */
    const decode_shape d = shape_of(GU_TG, GU_TG, a->H, a->I, has_sh ? sh->I : 0, dt);
    if (d.gu_smem > MAX_DYN_SMEM || d.dn_smem > MAX_DYN_SMEM) return 0;
    if (!a->q_gate_up) return !has_sh || (sh->gate_up && sh->down && !sh->q_gate_up);
    const int cols = dt == QD_DTYPE_F8_E4M3 ? 16 : 32;
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
    if (!a->q_gate_up) {
        const int has_sh = sh && sh->gate_up;
        return launch_bf16(a, w, sh, shape_of(a->n, a->n * a->k, a->H, a->I, has_sh ? sh->I : 0, QD_DTYPE_BF16),
                           pdl, s);
    }
    qd_moe_qw qw = {};
    qw.gate_up = *a->q_gate_up;
    qw.down = *a->q_down;
    if (sh && sh->q_gate_up) {
        qw.sh_gate_up = *sh->q_gate_up;
        qw.sh_down = *sh->q_down;
    }
    switch (a->q_gate_up->dtype) {
    case QD_DTYPE_F8_E4M3: return moe_decode_launch<qf_f8>(a, w, sh, qw, pdl, s);
    case QD_DTYPE_INT4: return moe_decode_launch<qf_int4>(a, w, sh, qw, pdl, s);
    default: return moe_decode_launch<qf_nvfp4>(a, w, sh, qw, pdl, s);
    }
}
