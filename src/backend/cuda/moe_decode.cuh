/* Internal to the MoE decode kernels (moe_decode.cu, moe_decode_bf16.cu,
 * moe_decode_quant.cu): the blocks' shape, the device pieces both kernel families
 * share (routing ownership, a pass's inputs, the down kernel's combine into y) and
 * the two families' launchers. moe_decode.cu says how the kernels work. */
#ifndef QD_CUDA_MOE_DECODE_CUH
#define QD_CUDA_MOE_DECODE_CUH

#include <math.h>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_pdl.cuh"
#include "backend/cuda/cuda_qformat.cuh"
#include "backend/cuda/cuda_util.h"
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

/* 1 if an earlier pair chose the same expert (that pair's block owns it); never with
 * one-token passes (pairs_of_block).
 * The routing is read through L2 (ld.cg): the down kernel reads it before its
 * programmatic wait, from a grid that finished while it was launching. */
template <int TG>
__device__ __forceinline__ int not_owner(const int32_t *__restrict__ sel, int p, int e) {
    if (TG == 1) return 0;
    int dup = 0;
    for (int q = threadIdx.x; q < p; q += blockDim.x) dup |= __ldcg(sel + q) == e;
    return __syncthreads_or(dup);
}

/* The pairs q >= p that chose expert e, in increasing order, into list;
 * returns their count. wcnt: blockDim.x / 32 ints of shared scratch. */
static __device__ int pairs_of_expert(const int32_t *__restrict__ sel, int p, int P, int e, int *list, int *wcnt) {
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

/* A one-token pass (TG == 1) runs only at n = 1: its entry, pair p or the shared expert's
 * token 0, is known to every thread, and its token row is 0. */
static_assert(GU_TG > 1 && DN_TG > 1, "shape_of gives a pass one token only at n = 1");

/* The pairs a block runs: pair p alone where a pass is one token (TG == 1: one token's
 * experts are distinct, and should an id come twice each pair reads the weights
 * itself, with the same sums), no list to write (pass_entries knows it), else every
 * pair from p on that chose e (pairs_of_expert), p being their owner. */
template <int TG>
__device__ __forceinline__ int pairs_of_block(const int32_t *sel, int p, int P, int e, int *list, int *wcnt) {
    return TG > 1 ? pairs_of_expert(sel, p, P, e, list, wcnt) : 1;
}

/* gate_up after its programmatic wait: lets the down kernel launch (it reads only the
 * routing and its weights until it waits) and, in block 0 of each token's first pair,
 * resets the token's completion counters for the down kernel. */
__device__ __forceinline__ void gate_up_begin(int32_t *counters, int n_ctr, int p, int k, bool shared) {
    qd_pdl_wait();
    qd_pdl_trigger();
    if (blockIdx.x == 0 && !shared && p % k == 0)
        for (int c = threadIdx.x; c < n_ctr; c += blockDim.x) counters[(size_t)(p / k) * n_ctr + c] = 0;
}

/* The tokens of shared-expert block row g: SH_TG of the n, from g * SH_TG; their count,
 * and their list where a pass takes several (TG == 1: token 0, which pass_entries knows).
 * The count is computed at TG == 1 too, though it is 1 there: knowing it, ptxas spills in
 * the main loops of the one-token bf16 gate_up and quantized down. */
template <int TG>
__device__ __forceinline__ int group_tokens(int n, int g, int *list) {
    const int m = min(SH_TG, n - g * SH_TG);
    if (TG > 1) {
        if (threadIdx.x < m) list[threadIdx.x] = g * SH_TG + threadIdx.x;
        __syncthreads();
    }
    return m;
}

/* A block's list entries: shared-expert tokens, or pairs t * k + j (token row t). TG > 1:
 * in the shared list (pairs_of_block, group_tokens); TG == 1: the one entry itself, so
 * its pass reads no list and waits on no barrier to publish one. */
template <int TG> struct pass_entries {
    const int *list; /* TG > 1: the entries, in shared memory */
    int kd;          /* TG > 1: entries a token row: k, or 1 for the shared expert's tokens */
    int one;         /* TG == 1: the entry */
    __device__ pass_entries(const int *l, bool shared, int p, int k)
        : list(l), kd(shared ? 1 : k), one(shared ? 0 : p) {}
    __device__ int entry(int q) const { return TG > 1 ? list[q] : one; }
    __device__ int row(int q) const { return TG > 1 ? list[q] / kd : 0; }
};

/* A pass's token rows of x (bf16, H8 pieces of 8) into xs [gs][H8]: entries g0 .. g0 +
 * gs - 1; read through L2 (cuda_pdl.cuh). Piece b of a row lands at (b % PC) (H8 / PC) +
 * b / PC: a quantized kernel's lane multiplies PC consecutive pieces by one weight piece,
 * and this way the lanes of a warp read consecutive addresses (PC = 1: the row as it is).
 * Then the block's barrier. Several entries: one loop over the pass's pieces with a
 * division each, lean in registers, which the kernels' main loops need (a walk or a loop
 * per entry made the bf16 gate_up spill); one entry (TG == 1): its row, no division. */
template <int PC = 1, int TG>
__device__ __forceinline__ void load_pass_x(uint4 *xs, const uint16_t *x, const pass_entries<TG> &pe, int g0, int gs,
                                            int H8) {
    const uint4 *x4 = (const uint4 *)x;
    const int NP = H8 / PC;
    if (TG == 1) {
        const uint4 *xr = x4 + (size_t)pe.row(g0) * H8;
        for (int b = threadIdx.x; b < H8; b += blockDim.x) xs[(b % PC) * NP + b / PC] = __ldcg(xr + b);
    } else {
        for (int c = threadIdx.x; c < gs * H8; c += blockDim.x) {
            const int tt = c / H8, b = c - tt * H8;
            xs[tt * H8 + (b % PC) * NP + b / PC] = __ldcg(x4 + (size_t)pe.row(g0 + tt) * H8 + b);
        }
    }
    __syncthreads();
}

/* A pass's activations (fp32, rows of Ir) into as4 [gs][Ir / 4], as load_pass_x: float4
 * b of a row at (b % AF) (Ir / 4 / AF) + b / AF, a quantized lane's AF consecutive float4
 * apart (AF = 1: the row as it is). */
template <int AF = 1, int TG>
__device__ __forceinline__ void load_pass_act(float4 *as4, const float *ap, const pass_entries<TG> &pe, int g0, int gs,
                                              int Ir) {
    const int I4 = Ir >> 2, NP = I4 / AF;
    if (TG == 1) {
        const float4 *ar = (const float4 *)(ap + (size_t)pe.entry(g0) * Ir);
        for (int b = threadIdx.x; b < I4; b += blockDim.x) as4[(b % AF) * NP + b / AF] = __ldcg(ar + b);
    } else {
        for (int c = threadIdx.x; c < gs * I4; c += blockDim.x) {
            const int tt = c / I4, b = c - tt * I4;
            as4[tt * I4 + (b % AF) * NP + b / AF] = __ldcg((const float4 *)(ap + (size_t)pe.entry(g0 + tt) * Ir) + b);
        }
    }
    __syncthreads();
}

/* silu(gate) * up of a warp's row i for the pass's gs entries, from the lanes' partial sums,
 * into each entry's row (read by the lane that stores: read by every lane, it costs each a
 * load of the list). */
template <int TG>
__device__ __forceinline__ void store_act(const float (&ag)[TG], const float (&au)[TG], int gs,
                                          const pass_entries<TG> &pe, int g0, float *ap, int rows, int i) {
#pragma unroll
    for (int tt = 0; tt < TG; tt++) {
        if (tt < gs) {
            const float sg = warp_sum(ag[tt]), su = warp_sum(au[tt]);
            if ((threadIdx.x & 31) == 0) ap[(size_t)pe.entry(g0 + tt) * rows + i] = sg / (1.0f + expf(-sg)) * su;
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
__device__ __forceinline__ void finish_down_pass(const float (&acc)[DN_R][TG], int gs, const pass_entries<TG> &pe,
                                                 int g0, float *op, int h0, int *last, const dn_combine &cb) {
    const int tid = threadIdx.x, lane = tid & 31, H = cb.H;
#pragma unroll
    for (int tt = 0; tt < TG; tt++) {
        if (tt < gs) {
            const size_t q = (size_t)pe.entry(g0 + tt);
#pragma unroll
            for (int r = 0; r < DN_R; r++) {
                const float v = warp_sum(acc[r][tt]);
                if (lane == 0 && h0 + r < H) op[q * H + h0 + r] = v;
            }
        }
    }
    /* publish this pass's outputs and count them in (qd_count_in: after the barrier) */
    __syncthreads();
    if (tid < gs) {
        const int t = pe.row(g0 + tid);
        last[tid] = qd_count_in(&cb.counters[(size_t)t * cb.n_ctr + blockIdx.x]) == cb.nslot - 1;
    }
    __syncthreads();
    if (tid < gs * QD_MOE_DN_ROWS) {
        /* one entry (TG == 1): tid < QD_MOE_DN_ROWS, and last[0] a fixed address, not a
         * register held across the pass (it spilled) */
        const int tt = TG > 1 ? tid / QD_MOE_DN_ROWS : 0;
        const int h = blockIdx.x * QD_MOE_DN_ROWS + (TG > 1 ? tid % QD_MOE_DN_ROWS : tid);
        if (last[tt] && h < H) {
            const size_t t = (size_t)pe.row(g0 + tt);
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

/* ---- host side ---------------------------------------------------------------------- */

typedef struct decode_shape {
    int tg;              /* tokens (gate_up) or pairs (down) a pass */
    int gu_sb, gu_nst;   /* quantized: gate_up stages */
    int dn_sb, dn_nst;   /* quantized: down stages */
    size_t gu_smem, dn_smem; /* dynamic shared memory of a block */
} decode_shape;

/* A call's grids and the pieces both kernels take. */
typedef struct decode_call {
    int P, n_ctr, has_sh, Is;
    dim3 grid_gu, grid_dn;
    dn_combine cb;
} decode_call;

static inline decode_call decode_call_of(const qd_cuda_moe_args *a, const qd_moe_work *w, const qd_moe_shared *sh) {
    decode_call c;
    c.P = a->n * a->k;
    c.n_ctr = (a->H + QD_MOE_DN_ROWS - 1) / QD_MOE_DN_ROWS;
    c.has_sh = sh && (sh->gate_up || sh->q_gate_up);
    c.Is = c.has_sh ? sh->I : 0;
    const int Imax = a->I > c.Is ? a->I : c.Is, sh_rows = c.has_sh ? (a->n + SH_TG - 1) / SH_TG : 0;
    c.grid_gu = dim3((unsigned)(Imax / GU_WARPS), (unsigned)(c.P + sh_rows));
    c.grid_dn = dim3((unsigned)c.n_ctr, (unsigned)(c.P + sh_rows));
    c.cb.counters = w->counters;
    c.cb.n_ctr = c.n_ctr;
    c.cb.nslot = a->k + (c.has_sh ? 1 : 0);
    c.cb.k = a->k;
    c.cb.H = a->H;
    c.cb.wts = a->d_w;
    c.cb.out = w->out;
    c.cb.sh_out = c.has_sh ? sh->out : NULL;
    c.cb.sh_gate = c.has_sh ? sh->gate : NULL;
    c.cb.sh_gate_ld = c.has_sh ? sh->gate_ld : 0;
    c.cb.y = a->d_y;
    return c;
}

/* A bound on the kernels' static shared memory (the pair list, counts, barriers: 4.3 KiB). */
#define DECODE_STATIC_SMEM (5 * 1024)
/* Dynamic shared memory a block may take beside it (sm_90: 227 KiB a block in all). */
#define DECODE_MAX_DYN_SMEM (227 * 1024 - DECODE_STATIC_SMEM)
static_assert(QD_MOE_DECODE_MAX_PAIRS * 4 + 512 <= DECODE_STATIC_SMEM, "the pair list and the rest fit the bound");

/* Opts the kernel in to bytes of dynamic shared memory where static and dynamic together
 * pass the 48 KiB a launch has without; staged kernels also ask for the largest
 * shared-memory carveout, the stages standing in for L1 (the weights bypass it). */
template <class K> static cudaError_t set_smem(K kernel, size_t bytes, int staged) {
    cudaError_t e = cudaSuccess;
    if (staged) e = cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout, 100);
    if (e == cudaSuccess && bytes + DECODE_STATIC_SMEM > 48 * 1024)
        e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes);
    return e;
}

/* The two families: bf16 experts (and shared expert), or quantized ones in qd_moe_decode_takes's
 * formats, with the shape of the call (moe_decode.cu). */
qd_status qd_moe_decode_bf16(const qd_cuda_moe_args *a, const qd_moe_work *w, const qd_moe_shared *sh,
                             const decode_shape *d, int pdl, cudaStream_t s);
qd_status qd_moe_decode_quant(const qd_cuda_moe_args *a, const qd_moe_work *w, const qd_moe_shared *sh,
                              const decode_shape *d, int pdl, cudaStream_t s);

#endif
