/* CUDA kernels of the model's small ops (embedding, norms, conv, gates, SwiGLU,
 * argmax) and the cuBLAS matmul, with C-callable launchers. Conventions as in
 * cuda_gdn.h: d_* are device pointers, bf16 is passed as uint16_t, every
 * launcher returns a qd_status and records the CUDA error text.
 *
 * The batch is ragged: n rows packed from several sequences' spans. A span table
 * d_spans [n_spans][4] = {first row, row count, position of the first row, state
 * slot} and d_row_span [n] (the span of each row) describe it on the device. */
#ifndef QD_CUDA_OPS_H
#define QD_CUDA_OPS_H

#include <stddef.h>
#include <stdint.h>

#include "qdelta.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------- elementwise.cu */

/* y[i] = bf16(x[i]), round to nearest even. */
qd_status qd_cuda_f32_to_bf16(const float *d_x, uint16_t *d_y, int64_t n, void *stream);
/* Dummy weights on the device (dummy_fill.cu), the values of the CPU's --load-format dummy
 * (base/dummy_values.h). */
qd_status qd_cuda_fill_dummy_bf16(uint16_t *d, int64_t n, float scale, uint64_t seed, void *stream);

/* h[r] = embed[tokens[r]] widened to fp32. embed: [V][H] bf16. */
qd_status qd_cuda_embed(const uint16_t *d_embed, const int32_t *d_tokens, int n, int H, float *d_h, void *stream);

/* Residual add and RMSNorm: for each output row i with source row r = d_rows ? d_rows[i] : i:
 * if d_y, h[r] += y[r] (written back); x[i] = bf16(h[r] * rsqrt(mean(h[r]^2) + eps) * (1 + w)),
 * and the same row unrounded in d_xf when it is not NULL (the MoE router's fp32 input). */
qd_status qd_cuda_add_rmsnorm(float *d_h, const float *d_y, const float *d_w, float eps, int n, int H,
                              const int32_t *d_rows, uint16_t *d_x, float *d_xf, void *stream);

/* The same without row indices, the normed row carried for tensor-core products of
 * fp32 precision (the MoE router at prefill sizes): x[i] = bf16(row) as above and
 * xr[i] = [mid | lo] ([n][2 H] bf16), the bf16 parts of what x leaves, so that
 * x + mid + lo is the fp32 row exactly. */
qd_status qd_cuda_add_rmsnorm_split(float *d_h, const float *d_y, const float *d_w, float eps, int n, int H,
                                    uint16_t *d_x, uint16_t *d_xr, void *stream);

/* The GDN inputs of a ragged batch (gdn_inputs.cu): causal depthwise conv1d + SiLU of the
 * q|k|v channels with per-slot state, q and k L2-normalised per head (eps 1e-6), q scaled by
 * dk^-0.5, all to bf16 (q, k [n][hk*dk], v [n][hv*dv]); gates g = -exp(A_log) *
 * softplus(a + dt_bias), beta = sigmoid(b) ([n][hv]).
 *   d_x     [n] rows at stride x_stride (fp32 projection): the C = 2*hk*dk + hv*dv conv inputs
 *   d_a, d_b [n] rows of hv at stride ab_stride
 *   d_w     [C][K]
 *   d_state [slots][C][K-1] this layer's pool: the last K-1 inputs of each sequence, oldest first;
 *           updated to the last K-1 inputs after the span
 * dk <= 256, 1 <= K <= 17. */
typedef struct qd_cuda_gdn_in_args {
    int n, hk, hv, dk, dv, K, n_spans;
    const float *d_x;
    int64_t x_stride;
    const float *d_a, *d_b;
    int64_t ab_stride;
    const float *d_w, *d_A_log, *d_dt_bias;
    float *d_state;
    const int32_t *d_spans, *d_row_span;
    uint16_t *d_q, *d_k, *d_v;
    float *d_g, *d_beta;
    int decode_only;    /* every span has one row: the kernel shifts the state itself
                         * (one launch instead of two on the decode path) */
    /* verify spans of speculative decoding, [n_ver][4]: first row, rows T, main slot, first
     * verify slot: the conv state after each token t < T-1 also goes to slot (verify slot + t)
     * of the pool (the rollback of a rejected draft); NULL / 0: none */
    int n_ver;
    const int32_t *d_ver;
} qd_cuda_gdn_in_args;
qd_status qd_cuda_gdn_inputs(const qd_cuda_gdn_in_args *a, void *stream);

/* Gated RMSNorm per value head: u = bf16(rmsnorm(o) * w * silu(z)), o bf16 [n][hv][dv],
 * z fp32 rows at stride z_stride, w [dv] (plain weight, no +1). */
qd_status qd_cuda_gated_rmsnorm(const uint16_t *d_o, const float *d_z, int64_t z_stride, const float *d_w,
                                float eps, int n, int hv, int dv, uint16_t *d_u, void *stream);

/* y[t][c] += x[t][c] for n rows of cols (rows at strides ldy, ldx). */
qd_status qd_cuda_add_f32(float *d_y, int64_t ldy, const float *d_x, int64_t ldx, int64_t cols, int n, void *stream);

/* SwiGLU activation: gu [n][2I] fp32 (gate | up) -> out [n][I] bf16 = silu(gate) * up. */
qd_status qd_cuda_silu_mul(const float *d_gu, int n, int I, uint16_t *d_out, void *stream);

/* Shared expert added in: y[r] += sigmoid(sg[r * sg_stride]) * ys[r], rows of H. */
qd_status qd_cuda_sigmoid_scale(float *d_y, const float *d_ys, const float *d_sg, int64_t sg_stride, int n, int H,
                                void *stream);

/* ids[r] = argmax of logits row r over ids [0, limit) (limit <= 0: V; the lowest index
 * among equal maxima) and, when d_logprob is not NULL, its log-softmax over [0, limit).
 * With d_allow_row ([n], or NULL: no row masked), a row r with d_allow_row[r] = k >= 0
 * takes both over the ids its allow mask keeps, d_allow + k * ((V + 31) / 32) (bit i % 32
 * of word i / 32: id i allowed), as if the others were -inf; when none of those is above
 * -inf its id is -1 and its logprob -inf (qd_forward_args.allow). At most 65535 rows a call. */
qd_status qd_cuda_argmax(const float *d_logits, int n, int V, int limit, const uint32_t *d_allow,
                         const int32_t *d_allow_row, int32_t *d_ids, float *d_logprob, void *stream);

/* ------------------------------------------------------------------ gemm.cu */

/* A cuBLAS handle bound to a stream, with its workspace (graph capture needs a
 * preallocated workspace). */
typedef struct qd_cuda_blas qd_cuda_blas;
qd_status qd_cuda_blas_create(qd_cuda_blas **out, void *stream);
void qd_cuda_blas_destroy(qd_cuda_blas *b);
void *qd_cuda_blas_handle(qd_cuda_blas *b); /* cublasHandle_t */
/* The handle's workspace (graph-safe, shared by its cuBLAS and cuBLASLt calls, which run
 * in its stream) and the FP8 GEMM's per-shape plans it owns (gemm_fp8.cu). */
void *qd_cuda_blas_workspace(qd_cuda_blas *b, size_t *bytes);
struct qd_cuda_fp8_plans;
struct qd_cuda_fp8_plans **qd_cuda_blas_fp8_plans(qd_cuda_blas *b);
void qd_cuda_fp8_plans_free(struct qd_cuda_fp8_plans *p);

/* y[n][rows] = x[n][cols] . W^T with W [rows][cols] bf16 (nn.Linear), x bf16 rows at stride
 * ldx, fp32 accumulation; y fp32 (y_bf16 = 0) or bf16 rows at stride ldy. */
qd_status qd_cuda_matmul(qd_cuda_blas *b, const uint16_t *d_W, int64_t rows, int64_t cols, const uint16_t *d_x,
                         int64_t ldx, int n, void *d_y, int64_t ldy, int y_bf16);

/* y[n][rows] += x . W^T (fp32 y; the residual add folded into the product): the GEMV
 * up to its n, cuBLAS with beta = 1 above. */
qd_status qd_cuda_matmul_acc(qd_cuda_blas *b, const uint16_t *d_W, int64_t rows, int64_t cols, const uint16_t *d_x,
                             int64_t ldx, int n, float *d_y, int64_t ldy);

/* y[n][rows] = (x + mid + lo) . W^T, fp32 y: an fp32 x carried as three bf16 parts
 * (qd_cuda_add_rmsnorm_split: x [n][ldx], xr = [mid | lo] [n][ldxr]), three tensor-core
 * products added in fp32 in that order. The parts hold the row exactly, so the logits are
 * those of fp32 arithmetic up to the order of the sums (not matmul_xf32's order: rows of a
 * prefill may route differently from the same rows decoded only where two logits are tied
 * to within fp32 rounding). */
qd_status qd_cuda_matmul_split3(qd_cuda_blas *b, const uint16_t *d_W, int64_t rows, int64_t cols, const uint16_t *d_x,
                                int64_t ldx, const uint16_t *d_xr, int64_t ldxr, int n, float *d_y, int64_t ldy);

/* From this many rows the MoE router takes qd_cuda_matmul_split3 (cuda_layer_ffn.c). H100,
 * bench/linear_cuda_bench.c router part (RESULTS session 27), split / fp32 kernels with the
 * norm: 35B-A3B 1.10 at 128 rows, 0.78 at 256, 0.24 at 8,192 (122 vs 503 us); the 80B's 513
 * and the 122B's 257 x 3072 routers 0.54 and 0.70 at 256. */
#define QD_CUDA_ROUTER_SPLIT_MIN_N 256

/* The same product with fp32 activations (bf16 weights, fp32 arithmetic): for small
 * matrices whose outputs make discrete decisions, the MoE router (matmul_xf32.cu: a warp
 * per output below 16 rows of x, 32 x 8 tiles from 16, both in router_dot.cuh's order, so
 * the bits do not depend on n). */
qd_status qd_cuda_matmul_xf32(const uint16_t *d_W, int64_t rows, int64_t cols, const float *d_x, int64_t ldx, int n,
                              float *d_y, int64_t ldy, void *stream);

/* ---------------------------------------------------------- gemm_invariant.cu */

/* y[t][r] = (accumulate ? y[t][r] : 0) + sum_k x[t][k] W[r][k], batch-invariant: the bits
 * of a row of y depend only on that row of x (and W, and y's row when accumulating),
 * never on n or the row's place in the batch. The sum over k is cut into S chains of
 * whole k-steps of 16 (S = qd_cuda_matmul_invariant_chains: by the shape alone); each
 * chain is one fp32 accumulator from zero, one mma.sync m16n8k16 (bf16, fp32
 * accumulate) per k-step in increasing k; the chains are added in order
 * (((c0 + c1) + c2) + ...), then y + that. W bf16 [rows][cols] (nn.Linear), x bf16
 * rows at stride ldx, y fp32 rows at stride ldy. Needs cols % 8 == 0, ldx % 8 == 0,
 * ldx >= cols, ldy >= rows and 16-byte aligned W and x (else an error status, nothing
 * launched). No allocation, no host sync: graph-capturable. */
qd_status qd_cuda_matmul_invariant(const uint16_t *d_W, int64_t rows, int64_t cols, const uint16_t *d_x,
                                   int64_t ldx, int n, float *d_y, int64_t ldy, int accumulate, void *stream);

/* S, the chains of a rows x cols product, by measurement on the H200 (gemm_invariant.cu
 * inv_rule): 8 up to 2048 rows, 4 up to 4096 rows, 1 above or below 1024 columns
 * (few rows leave few warps per k-chain at n = 1); then cut as the kernel cuts K:
 * chains of L = ceil(ceil(cols / 16) / S) k-steps, ceil(cols / (16 L)) of them. */
int qd_cuda_matmul_invariant_chains(int64_t rows, int64_t cols);

/* The tile shapes behind it, for the tests (every tile gives the same bits) and the
 * benchmark (bench/linear_cuda_bench.c `tiles`, which measures the table): tiles
 * 0 .. qd_cuda_matmul_invariant_tiles() - 1, named "w<weight rows>xt<tokens>[c<k-groups>]";
 * tile -1 is the table's pick, qd_cuda_matmul_invariant_choice (by n and the shape
 * only: the chains of an output are the same on every tile). */
int qd_cuda_matmul_invariant_tiles(void);
const char *qd_cuda_matmul_invariant_tile_name(int tile);
int qd_cuda_matmul_invariant_choice(int64_t rows, int64_t cols, int n);
qd_status qd_cuda_matmul_invariant_tile(int tile, const uint16_t *d_W, int64_t rows, int64_t cols,
                                        const uint16_t *d_x, int64_t ldx, int n, float *d_y, int64_t ldy,
                                        int accumulate, void *stream);
/* The same with the chain count given (chains > 0, cut as above; 0 = the shape's): for
 * the tests (every tile agrees at every S) and the measurements behind the rule
 * (bench/linear_cuda_bench.c `chains`). Invariant for a fixed count, but only the
 * shape's count matches qd_cuda_matmul_invariant. */
qd_status qd_cuda_matmul_invariant_chained(int tile, int chains, const uint16_t *d_W, int64_t rows, int64_t cols,
                                           const uint16_t *d_x, int64_t ldx, int n, float *d_y, int64_t ldy,
                                           int accumulate, void *stream);

#ifdef __cplusplus
}
#endif

#endif
