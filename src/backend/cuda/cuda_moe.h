/* CUDA kernels of the routed experts of a MoE block (spec 6.2), C-callable.
 * The router logits come from a cuBLAS GEMM (fp32); the shared expert is a dense
 * SwiGLU run by the caller. Expert weights are bf16, stacked per layer:
 *   gate_up [E][2 * I][H]   rows 0..I-1 are gate_proj, rows I..2I-1 up_proj
 *   down    [E][H][I]
 * Everything a step reads is in device memory: neither path syncs with the
 * host or allocates, so both are graph-capturable (the prefill path sorts the
 * pairs by expert on the device and sizes its grids by an upper bound).
 * Shapes: H and I multiples of 8, 1 <= E <= 1024, 1 <= k (route: k <= min(E, 32); the expert
 * paths take any k, and E may be an expert-parallel rank's share, smaller than k);
 * d_x, d_gate_up, d_down, d_y and d_work 16-byte aligned (cudaMalloc is). */
#ifndef QD_CUDA_MOE_H
#define QD_CUDA_MOE_H

#include <stddef.h>
#include <stdint.h>

#include "backend/cuda/cuda_quant.h"
#include "qdelta.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Softmax over E logits in fp32, top-k (highest first, ties to the lower expert
 * index), optionally renormalised to sum 1 (norm_topk_prob).
 *   d_logits [n][E] fp32 rows at stride ld (>= E) -> d_sel [n][k] int32, d_w [n][k] fp32. */
qd_status qd_cuda_moe_route(const float *d_logits, int64_t ld, int n, int E, int k, int renorm, int32_t *d_sel, float *d_w,
                            void *stream);

/* Expert parallel: the P = n * k selected ids in [e0, e0 + E_local) become ids of the
 * rank's own experts (minus e0), every other id -1 (a pair that contributes zero). */
qd_status qd_cuda_moe_localize(int32_t *d_sel, int P, int e0, int E_local, void *stream);
/* d_touched[e] = 1 for every expert e in [0, E) among the P routed pairs d_sel (routing
 * statistics, qd_step.experts_touched). */
qd_status qd_cuda_moe_mark(const int32_t *d_sel, int P, int E, uint8_t *d_touched, void *stream);

typedef struct qd_cuda_moe_args {
    int n;                    /* tokens */
    int H, I, E, k;           /* hidden, expert intermediate, experts, experts per token */
    const uint16_t *d_x;      /* [n][H] bf16 input (post-attention norm) */
    const int32_t *d_sel;     /* [n][k] */
    const float *d_w;         /* [n][k] routing weights */
    const uint16_t *d_gate_up; /* [E][2I][H] bf16 */
    const uint16_t *d_down;   /* [E][H][I] bf16 */
    float *d_y;               /* [n][H] fp32: y += sum_j w[t][j] * expert_sel(x[t]) (accumulates) */
    void *d_work;             /* scratch of qd_cuda_moe_work_bytes(n_max, ...) bytes */
    void *cublas;             /* cublasHandle_t; unused (the grouped GEMMs are our own), may be NULL */
    int invariant;            /* batch-invariant mode: the grouped-GEMM path at every n, so that a
                               * token's sums never change with the batch (1: on) */
    /* Quantized experts (cuda_quant.h), NULL for bf16 (then d_gate_up / d_down): gate_up 2E
     * matrices [I][H] (expert e's gate_proj 2e, up_proj 2e + 1), down E matrices [H][I], one
     * vectorised layout (qd_moe_decode_takes). The decode path reads them as stored, and so
     * does the prefill path where its W8A8 (FP8) or WA16 (W4A16: INT4, NVFP4; W8A16: FP8)
     * kernels take the call; otherwise it dequantizes every expert into d_dequant
     * (qd_cuda_moe_dequant_bytes) and runs the bf16 grouped GEMMs on it. d_dequant may be
     * NULL where no call would (qd_cuda_moe_dequant_needed). */
    const qd_cuda_qmats *q_gate_up;
    const qd_cuda_qmats *q_down;
    uint16_t *d_dequant;
    /* The grouped-GEMM kernel of the prefill path: 0 for the table's choice (moe_prefill.cu),
     * or one of QD_MOE_PREFILL_* to force it (tests and benchmarks; the bf16 kernels give the
     * same bits). It picks among the prefill kernels only: a call that the decode path takes
     * (qd_cuda_moe_decode_path: outside batch-invariant mode, up to the format's bound) runs
     * the decode kernels whatever it says. */
    int prefill_kernel;
    /* The shared expert, added first when given (d_sh_y NULL: none): y += sigmoid(d_sh_gate[t *
     * sh_gate_ld]) * d_sh_y[t], the bits of qd_cuda_sigmoid_scale before this call; the prefill
     * path folds it into its combine pass (one read and write of y less). */
    const float *d_sh_y;      /* [n][H] fp32: the shared expert's output */
    const float *d_sh_gate;   /* its gate logits, one a token at stride sh_gate_ld */
    int64_t sh_gate_ld;
} qd_cuda_moe_args;

enum {
    QD_MOE_PREFILL_MMA_SMALL = 1, /* mma.sync, 16-row pieces of 64 weight rows: a few tokens */
    QD_MOE_PREFILL_MMA,           /* mma.sync, 64 x 128 tiles */
    QD_MOE_PREFILL_WGMMA,         /* wgmma, persistent, 128 x 256 tiles (sm_90a) */
    QD_MOE_PREFILL_DEQUANT,       /* quantized experts: dequantized to bf16, then the table's bf16
                                   * kernel (the path of the layouts neither W8A8 nor WA16 takes),
                                   * never W8A8 or WA16 */
    QD_MOE_PREFILL_W8A8,          /* FP8 experts (128 x 128 blocks): W8A8 on the FP8 tensor cores */
    QD_MOE_PREFILL_WA16           /* INT4 / NVFP4 (W4A16) and FP8 (W8A16) experts: bf16 wgmma on the
                                   * weights made bf16 in shared memory, the dequantized path's
                                   * bits (sm_90a) */
};

/* Bytes of the bf16 copy of E experts that the prefill path of quantized experts works on. */
size_t qd_cuda_moe_dequant_bytes(int H, int I, int E);
/* Whether the prefill path may dequantize these experts into d_dequant on some call of up to
 * a->n tokens with a->invariant, the kernels the table picks (prefill_kernel ignored): 0 for
 * bf16 experts and for quantized ones that the WA16 kernels take. Reads only the shapes, the
 * layouts and the pointers' alignment (a context sizes its scratch by it). */
int qd_cuda_moe_dequant_needed(const qd_cuda_moe_args *a);

/* Scratch bytes for up to n_max tokens: about n_max * k * (I + H) * 4 (the
 * per-pair activations and expert outputs; 335 MB for 35B-A3B at 4096 tokens).
 * Calls that may run concurrently need separate scratch. */
size_t qd_cuda_moe_work_bytes(int n_max, int H, int I, int E, int k);
/* The forward captures steps of up to this many tokens in CUDA graphs; both expert paths are
 * graph-safe (no host sync), and the decode path takes no more tokens than this. */
int qd_cuda_moe_graph_max_tokens(void);
/* Whether qd_cuda_moe_experts runs this call on the decode path's GEMV kernels (else the
 * grouped GEMMs): not batch-invariant, n * k <= 1024, a layout they take, and n below the
 * batch where the tensor-core GEMMs overtake them for these experts (table in moe.cu; at
 * most qd_cuda_moe_graph_max_tokens()). Reads only the shapes, layouts and flags. */
int qd_cuda_moe_decode_path(const qd_cuda_moe_args *a);
/* Routed experts of n tokens, added into d_y. Chooses the path by n and the experts
 * (qd_cuda_moe_decode_path): GEMV kernels for small batches, tensor-core grouped GEMMs
 * above (always, with args->invariant). A token's result is bit-identical whatever else is
 * in the batch (on one path) and from run to run: the k slots are summed in slot
 * order, no float atomics. */
qd_status qd_cuda_moe_experts(const qd_cuda_moe_args *a, void *stream);

/* The whole MoE block of a decode-sized batch in three launches (moe_block.cu):
 *   router: x = rmsnorm(h) (zero-centred weight) per token, built by each block; the
 *           router (and shared-gate) logits in fp32 from x unrounded; the last block
 *           of a token routes it (top-k as qd_cuda_moe_route);
 *   gate_up and down of the routed experts and the shared expert, the block that
 *           completes a token's row tile adding sigmoid(gate) * shared + routed into h.
 * h += moe(rmsnorm(h)): the residual add is part of the block. Every launch is a
 * programmatic dependent of the one before (cuda_pdl.cuh). For
 * qd_cuda_moe_block_supported shapes; graph-capturable, no host sync. */
typedef struct qd_cuda_moe_block_args {
    int n, H, I, E, k, renorm;
    float *d_h;                   /* [n][H] fp32 residual, updated */
    const float *d_norm;          /* [H] post-attention RMSNorm weight (zero-centred) */
    float eps;
    const uint16_t *d_router;     /* [E (+1)][H]: router rows, then the shared gate row when there is a shared expert */
    const uint16_t *d_gate_up;    /* [E][2I][H], or NULL with q_gate_up */
    const uint16_t *d_down;       /* [E][H][I], or NULL with q_down */
    const uint16_t *d_sh_gate_up; /* [2 I_s][H] shared expert, or NULL for none (or quantized) */
    const uint16_t *d_sh_down;    /* [H][I_s] */
    const qd_cuda_qmats *q_gate_up, *q_down;       /* quantized routed experts (qd_cuda_moe_args) or NULL */
    const qd_cuda_qmats *q_sh_gate_up, *q_sh_down; /* the shared expert in their format, or NULL */
    int I_s;
    uint16_t *d_x;                /* [n][H] scratch: the normed input, bf16 */
    float *d_logits;              /* [n][E + 1] scratch */
    int32_t *d_sel;               /* [n][k] scratch */
    float *d_w;                   /* [n][k] scratch */
    int32_t *d_route_cnt;         /* [n] zeros on entry, left zero: blocks done per token */
    float *d_sh_act;              /* [n][I_s] scratch */
    float *d_sh_out;              /* [n][H] scratch */
    void *d_work;                 /* qd_cuda_moe_work_bytes(n_max, H, I, E, k) bytes */
} qd_cuda_moe_block_args;

/* Whether qd_cuda_moe_block takes this shape: n <= qd_cuda_moe_graph_max_tokens(),
 * n * k <= 1024, H, I, I_s multiples of 8, H <= 12288, 1 <= k <= min(E, 32), E <= 1024. */
int qd_cuda_moe_block_supported(int n, int H, int I, int I_s, int E, int k);
/* Whether the block is also the faster path for this shape (the MoE kernel table):
 * a supported shape of at most QD_MOE_BLOCK_MAX_TOKENS tokens. H200,
 * bench/linear_cuda_bench.c (RESULTS session 11), block time / older path's
 * (norm, router, shared expert, sigmoid scale, top-k, expert kernels):
 *   35B-A3B (E 256, k 8):  n = 1 0.88, 4 0.92, 8 0.94, 16 0.96, 32 1.02, 64 1.03
 *   80B-A3B (E 512, k 10): n = 1 0.80, 4 0.92, 8 0.94, 16 0.995, 32 1.01, 64 1.04
 * the launches it saves matter less as the expert weights read grow with n, and
 * its shared-expert block rows (one per 4 tokens) then cost more than cuBLAS. */
#define QD_MOE_BLOCK_MAX_TOKENS 16
int qd_cuda_moe_block_preferred(int n, int H, int I, int I_s, int E, int k);
qd_status qd_cuda_moe_block(const qd_cuda_moe_block_args *a, void *stream);

#ifdef __cplusplus
}
#endif

#endif
