/* Internal to the MoE kernels (moe.cu, moe_decode.cu, moe_prefill.cu): the
 * carving of the caller's scratch into arrays, and the two expert paths that
 * qd_cuda_moe_experts chooses between. */
#ifndef QD_CUDA_MOE_INTERNAL_CUH
#define QD_CUDA_MOE_INTERNAL_CUH

#include <cuda_runtime.h>
#include <stdint.h>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_moe.h"
#include "backend/cuda/cuda_quant.h"

/* The decode path (GEMV kernels) takes batches of at most this many tokens, the bound of the
 * forward's CUDA graphs; experts that a grouped kernel on the tensor cores takes leave it
 * earlier (below: bf16, INT4, NVFP4, W8A8-able FP8). */
#define QD_MOE_GRAPH_MAX_TOKENS 64
/* The decode kernels keep one block's list of (token, slot) pairs in shared memory. */
#define QD_MOE_DECODE_MAX_PAIRS 1024
/* The router holds a token's logits in one warp's registers and the prefill
 * planner one expert per thread of a 1024-thread block. */
#define QD_MOE_MAX_EXPERTS 1024
/* Rows of down_proj per block of the decode down kernel: the unit of the
 * per-token completion counters. */
#define QD_MOE_DN_ROWS 32
/* Rows (sorted pairs) per tile of the prefill grouped GEMMs: the mma.sync kernels', the
 * wgmma kernel's. */
#define QD_MOE_BM 64
#define QD_MOE_WG_BM 128
/* Batches up to this many tokens run the grouped GEMMs with narrow weight tiles
 * (moe_gemm_small: more blocks for a few experts' weights; the same sums). */
#define QD_MOE_SMALL_MAX_TOKENS 16
/* Batches from this many tokens run the wgmma grouped GEMMs (moe_prefill_wgmma.cu) rather than
 * moe_gemm (the same bits): H200, bench/moe_cuda_bench.c at the 35B-A3B shape, 1.36-1.40x from 96
 * to 1,024 tokens, 1.69x at 8,192 (RESULTS session 24); H100, qdelta bench of the 35B-A3B dummy,
 * the decode step of 24 / 32 / 48 / 64 tokens on the grouped path 22.7 / 26.6 / 31.6 / 35.6 ms
 * -> 18.9 / 21.5 / 25.9 / 28.4 (RESULTS session 38; below 24 not measured). */
#define QD_MOE_WG_MIN_TOKENS 24
/* Batches from this many tokens take bf16 experts off the decode kernels onto the grouped
 * GEMMs where the wgmma kernel takes them, and INT4 experts where W4A16 does: H100, the
 * 35B-A3B dummy's decode step, bf16 GEMV -> wgmma at 32 tokens 21.0 -> 21.5 ms, 48 26.8 ->
 * 25.9, 64 32.0 -> 28.4; INT4 GEMV -> W4A16 at 32 25.3 -> 25.3, 48 32.8 -> 30.2, 64 39.1 ->
 * 32.4 (RESULTS session 38; both cross between 32 and 48). */
#define QD_MOE_GROUPED_MIN_TOKENS 40
/* ... and NVFP4 experts where W4A16 takes them from this many: H100, bench/moe_cuda_bench.c at
 * the 35B-A3B shape, decode kernels vs W4A16 at 32 tokens 486 / 556 us, 40 576 / 603, 48 659 /
 * 661, 64 798 / 714 (RESULTS session 39: they cross at 48). */
#define QD_MOE_NVFP4_WA16_MIN_TOKENS 48
/* ... and FP8 experts that the W8A8 kernels take, outside batch-invariant mode, from this many
 * (the fused decode block keeps batches up to QD_MOE_BLOCK_MAX_TOKENS = 16): H100, the 35B-A3B
 * dummy in FP8, GEMV -> W8A8 at 17 tokens 15.5 -> 13.4 ms, 24 17.6 -> 14.4, 64 33.3 -> 21.7
 * (RESULTS session 38). The prefill path's table takes W8A8 from here too. */
#define QD_MOE_W8A8_MIN_TOKENS 17

/* Views into d_work for one call of n tokens (P = n * k pairs). Every size
 * grows with n, so a scratch laid out for n_max holds any n <= n_max. */
typedef struct qd_moe_work {
    float *act;         /* decode: [P][I] fp32 silu(gate) * up; prefill: the same as bf16 */
    float *out;         /* [P][H] fp32 down_proj output of each pair (before the routing weight) */
    int32_t *counters;  /* decode: [n][ceil(H / QD_MOE_DN_ROWS)] finished slots per (token, row tile) */
    int32_t *seg;       /* prefill: [E + 1] first sorted row of each expert */
    int32_t *n_tiles;   /* prefill: [1] tiles of QD_MOE_BM sorted rows in use */
    int2 *tiles;        /* prefill: [max_tiles] {expert, first sorted row} */
    int32_t *sorted;    /* prefill: [P] pair (t * k + j) at each sorted row */
    int32_t *pos;       /* prefill: [P] sorted row of each pair, -1 for an expert id out of range */
} qd_moe_work;

/* Upper bound of the prefill tiles of bm rows: each expert's last tile may be partial. */
static inline int qd_moe_max_tiles_of(int64_t P, int E, int bm) {
    return (int)((P + bm - 1) / bm + (P < E ? P : E));
}
/* ... of the smallest tiles, which bounds them all (the scratch's tile list). */
static inline int qd_moe_max_tiles(int64_t P, int E) { return qd_moe_max_tiles_of(P, E, QD_MOE_BM); }

/* Bytes of the layout for n tokens; fills *w from base when w is not NULL. */
size_t qd_moe_layout(int n, int H, int I, int E, int k, char *base, qd_moe_work *w);

/* The shared expert run by the decode kernels (the fused MoE block): gate_up NULL
 * for none. y += sigmoid(gate[t * gate_ld]) * down(silu(gate_up x)) with the
 * routed experts. */
typedef struct qd_moe_shared {
    const uint16_t *gate_up; /* [2 I][H] bf16, or NULL when quantized */
    const uint16_t *down;    /* [H][I] bf16, or NULL when quantized */
    const qd_cuda_qmats *q_gate_up; /* quantized: gate_proj, up_proj (2 matrices), in the routed experts' format */
    const qd_cuda_qmats *q_down;    /* quantized: 1 matrix */
    int I;                   /* multiple of 8 */
    float *act;              /* [n][I] scratch */
    float *out;              /* [n][H] scratch */
    const float *gate;       /* the gate logit of token t at gate[t * gate_ld] */
    int64_t gate_ld;
} qd_moe_shared;

/* The quantized weights of one decode call, by value in the kernels' parameters (zeros for bf16). */
typedef struct qd_moe_qw {
    qd_cuda_qmats gate_up, down;       /* routed experts: 2E and E matrices */
    qd_cuda_qmats sh_gate_up, sh_down; /* the shared expert: 2 and 1 */
} qd_moe_qw;

/* Whether the decode kernels take these experts: bf16 throughout, or the routed experts (and
 * the shared one, when given) quantized in one format of the vectorised layouts with H, I and
 * the shared I multiples of the format's piece (16 columns for F8_E4M3, 32 for 4-bit). */
int qd_moe_decode_takes(const qd_cuda_moe_args *a, const qd_moe_shared *sh);
/* pdl: launch gate_up as a programmatic dependent of the previous kernel (it
 * waits before reading the routing). */
qd_status qd_moe_decode(const qd_cuda_moe_args *a, const qd_moe_work *w, const qd_moe_shared *sh, int pdl,
                        cudaStream_t s);
qd_status qd_moe_prefill(const qd_cuda_moe_args *a, const qd_moe_work *w, cudaStream_t s);
/* The prefill path's kernel for a call (QD_MOE_PREFILL_*, moe_prefill.cu), -1 where the forced
 * one (a->prefill_kernel) does not take it. Quantized experts that neither W8A8 nor WA16 (W4A16
 * / W8A16) takes are dequantized first: for them it names the bf16 kernel of that copy. */
int qd_moe_prefill_kernel(const qd_cuda_moe_args *a);

/* The wgmma grouped GEMMs (moe_prefill_wgmma.cu) over a plan of QD_MOE_WG_BM-row tiles:
 * gate_up into w->act (bf16), down into w->out. takes: every operand's elements are
 * addressable in 32 bits. */
int qd_moe_wg_takes(const qd_cuda_moe_args *a);
qd_status qd_moe_wg_gemms(const qd_cuda_moe_args *a, const qd_moe_work *w, cudaStream_t s);

/* W8A8 prefill of FP8 experts (moe_prefill_fp8.cu): the FP8 grouped GEMMs over a plan of
 * QD_MOE_WG_BM-row tiles. takes: 128 x 128 block-scaled e4m3 experts of the call's shapes,
 * H and I multiples of 16, offsets in 32 bits, the quantized activations within the scratch. */
int qd_moe_fp8_takes(const qd_cuda_moe_args *a);
qd_status qd_moe_fp8_gemms(const qd_cuda_moe_args *a, const qd_moe_work *w, cudaStream_t s);
/* W4A16 / W8A16 prefill of quantized experts (moe_prefill_wa16.cu): the bf16 wgmma grouped
 * GEMMs over a plan of QD_MOE_WG_BM-row tiles with the weights made bf16 in shared memory,
 * the bits of the dequantized copy's kernels. takes: INT4 (f32 scales, one a row and group
 * of 32k columns or one group a row; zero points 4-byte aligned or none), NVFP4, or FP8
 * (f32 scales, any block rows, block columns a multiple of 16 or one block a row) experts of
 * the call's shapes, H and I multiples of 32 (INT4), 64 (NVFP4) or 16 (FP8), offsets in 32
 * bits (qd_moe_wg_takes). */
int qd_moe_wa16_takes(const qd_cuda_moe_args *a);
qd_status qd_moe_wa16_gemms(const qd_cuda_moe_args *a, const qd_moe_work *w, cudaStream_t s);
/* plan, the grouped GEMMs on the stored weights (kernel: QD_MOE_PREFILL_W8A8 or _WA16), combine */
qd_status qd_moe_prefill_quant(const qd_cuda_moe_args *a, const qd_moe_work *w, int kernel, cudaStream_t s);
/* The prefill path's first and last launches: the pairs sorted by expert into tiles of bm
 * rows (w->seg, tiles, sorted, pos), and y += the routing-weighted outputs in slot order. */
qd_status qd_moe_plan(const qd_cuda_moe_args *a, const qd_moe_work *w, int bm, cudaStream_t s);
qd_status qd_moe_combine(const qd_cuda_moe_args *a, const qd_moe_work *w, cudaStream_t s);

/* Two columns of the gate_up epilogue, silu(gate) * up as a bf16 pair: one definition for
 * every grouped GEMM kernel, whose outputs must be the same bits. */
__device__ __forceinline__ uint32_t qd_moe_swiglu2(float g0, float g1, float u0, float u1) {
    return qd_pack_bf2(g0 / (1.0f + expf(-g0)) * u0, g1 / (1.0f + expf(-g1)) * u1);
}

#endif
