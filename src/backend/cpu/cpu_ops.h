/* CPU backend ops: fp32 arithmetic on weights as stored (F32, BF16, F16).
 * This backend is the reference every other backend is tested against, so each
 * op is written for clarity first, then for speed (threads, AVX2 via the compiler).
 *
 * Conventions: activations are row-major float arrays; "[T][C]" means T rows of C
 * floats. Row strides are given in floats where an op reads a slice of a wider row. */
#ifndef QD_BACKEND_CPU_OPS_H
#define QD_BACKEND_CPU_OPS_H

#include <stdint.h>

#include "base/dtype.h"
#include "base/threadpool.h"
#include "base/weight.h"


/* ---------------------------------------------------------------- matmul.c */

/* y[n][rows] = x[n][cols] . W^T   (fp32 accumulation). n = 1 is the decode GEMV. */
void qd_cpu_matmul(qd_threadpool *pool, const qd_weight *w, const float *x, int64_t n, float *y);

/* The same for a batch of independent products that share nothing but the pool:
 * y_i[n_i][rows_i] = x_i[n_i][cols_i] . W_i^T. Used for MoE experts (one item per
 * active expert) so that all experts of a step are spread over the threads. */
typedef struct qd_matmul_item {
    const qd_weight *w;
    const float *x;
    int64_t n;
    float *y;
    int fixed_order;    /* 1: sum every row in the one order of the GEMV kernels whatever n
                         * (batch-invariant mode); 0: the kernel table picks by n, and the
                         * GEMM of larger n sums in another order (rounding differs) */
} qd_matmul_item;
void qd_cpu_matmul_batch(qd_threadpool *pool, const qd_matmul_item *items, int n_items);
/* qd_cpu_matmul with the item's fixed_order. */
void qd_cpu_matmul_mode(qd_threadpool *pool, const qd_weight *w, const float *x, int64_t n, float *y,
                        int fixed_order);

/* ------------------------------------------------------------------ gdn.c */

/* Geometry of one GDN layer's delta rule. Value head h reads key head h / (hv/hk). */
typedef struct qd_gdn_dims {
    int hk, hv, dk, dv;
} qd_gdn_dims;

/* Inputs for one sequence span of T tokens (all pointers to token 0 of the span):
 *   q   [T][hk][dk] at row stride q_stride   (already L2-normalised and scaled by dk^-0.5)
 *   k   [T][hk][dk] at row stride k_stride   (already L2-normalised)
 *   v   [T][hv][dv] at row stride v_stride
 *   g   [T][hv]      log-decay (<= 0), fp32
 *   beta[T][hv]      in (0,1)
 *   S   [hv][dk][dv] fp32 recurrent state, read as the initial state and overwritten with the final one
 *   o   [T][hv][dv]  output, contiguous rows of hv*dv floats
 */
typedef struct qd_gdn_span {
    const float *q; int64_t q_stride;
    const float *k; int64_t k_stride;
    const float *v; int64_t v_stride;
    const float *g;
    const float *beta;
    float *S;
    float *o;
    int T;
} qd_gdn_span;

/* Token-by-token recurrence (spec 3.3 step 6). */
void qd_cpu_gdn_recurrent(qd_threadpool *pool, qd_gdn_dims d, const qd_gdn_span *s);
/* The recurrence for several independent spans (each with its own state) in one
 * parallel loop; bit-identical to qd_cpu_gdn_recurrent on each. The multi-sequence
 * decode path. */
void qd_cpu_gdn_recurrent_multi(qd_threadpool *pool, qd_gdn_dims d, const qd_gdn_span *spans, int n_spans);
/* Chunked WY form with chunk size 64 (spec 4.1); same results up to rounding. */
void qd_cpu_gdn_chunked(qd_threadpool *pool, qd_gdn_dims d, const qd_gdn_span *s);

/* ------------------------------------------------------------ elementwise.c */

/* RMSNorm over rows of `dim`: y = x * rsqrt(mean(x^2) + eps) * (w_offset + w).
 * Zero-centred norms use w_offset = 1; plain norms 0. In-place allowed (y == x). */
void qd_cpu_rmsnorm(const float *x, int64_t n_rows, int dim, int64_t x_stride, const float *w,
                    float w_offset, float eps, float *y, int64_t y_stride);

/* Gated RMSNorm of the GDN output, per value head: u = rmsnorm(o) * w * silu(z).
 * o, z, u: [T][hv][dv] contiguous; w: [dv]. */
void qd_cpu_gated_rmsnorm(const float *o, const float *z, const float *w, int64_t T, int hv, int dv,
                          float eps, float *u);

/* Causal depthwise conv1d with state, then SiLU, for one span.
 * x: [T][C] at row stride x_stride (the mixed_qkv projection), w: [C][K],
 * state: [C][K-1] (the last K-1 pre-conv inputs, oldest first), updated in place
 * to the last K-1 inputs of [state | x]. y: [T][C] contiguous. */
void qd_cpu_conv1d_silu(const float *x, int64_t T, int C, int64_t x_stride, const float *w, int K,
                        float *state, float *y);

/* Per-head L2 normalisation then scale: x <- x / sqrt(sum(x^2) + eps) * scale.
 * x: [T][heads][dim] at row stride x_stride (in place). */
void qd_cpu_l2norm_heads(float *x, int64_t T, int heads, int dim, int64_t x_stride, float eps, float scale);

/* GDN gates per token and value head: g = -exp(A_log) * softplus(a + dt_bias),
 * beta = sigmoid(b). a, b: [T][hv] at row strides; g, beta: [T][hv] contiguous. */
void qd_cpu_gdn_gates(const float *a, int64_t a_stride, const float *b, int64_t b_stride, int64_t T,
                      int hv, const float *A_log, const float *dt_bias, float *g, float *beta);

/* NeoX (rotate-half) RoPE on the first rot_dim dims of each head, in place.
 * x: [T][heads][head_dim] at row stride x_stride; pos: [T]. */
void qd_cpu_rope_neox(float *x, int64_t T, int heads, int head_dim, int64_t x_stride, int rot_dim,
                      double theta, const int32_t *pos);

/* Causal attention with GQA for one span of T query tokens at positions
 * pos0..pos0+T-1 over a paged cache holding positions 0..pos0+T-1.
 * q: [T][nq][hd] at row stride q_stride. The cache is read through a block table:
 * position p's key is at kc + blocks[p / block_size] * block_stride
 * + (p % block_size) * nkv * hd, as [nkv][hd] (values likewise from vc). A contiguous
 * [ctx][nkv][hd] cache is blocks = {0, 1, 2, ...} with block_stride = block_size*nkv*hd.
 * out: [T][nq][hd] contiguous. Softmax in fp32 with scale. */
typedef struct qd_kv_view {
    const float *k, *v;       /* base of the block pool (layer offset included) */
    const int32_t *blocks;    /* block table */
    int block_size;           /* positions per block */
    int64_t block_stride;     /* floats from one block to the next */
} qd_kv_view;
void qd_cpu_attention(qd_threadpool *pool, const float *q, int64_t q_stride, const qd_kv_view *kv,
                      int T, int pos0, int nq, int nkv, int hd, float scale, float *out);

/* y = silu(g) * u elementwise over n (g, u may be strided rows: see ffn). */
void qd_cpu_silu_mul(const float *g, const float *u, int64_t n, float *y);

static inline float qd_silu(float x) { return x / (1.0f + __builtin_expf(-x)); }
static inline float qd_sigmoid(float x) { return 1.0f / (1.0f + __builtin_expf(-x)); }

#endif
