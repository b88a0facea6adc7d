/* CUDA kernels of the gated full-attention layer (spec 5.2), C-callable.
 * Activations arrive as fp32 projection outputs (cuBLAS GEMMs with fp32 output);
 * the KV cache is paged and bf16; the result is the bf16 input of o_proj.
 *
 * The batch is ragged: n_rows query rows, row r belongs to the sequence in slot
 * d_row_slot[r] at position d_row_pos[r]. Every row's key/value is appended to the
 * cache first (qd_cuda_attn_prep), then each row attends causally to positions
 * 0..d_row_pos[r] of its own sequence (qd_cuda_attn). All per-step data is read from
 * device memory so that a decode step can be captured in a CUDA graph: the grid of
 * a launch depends only on n_rows and on max_ctx, never on the lengths.
 *
 * KV cache layout (one layer's view; several layers share a block, as on the CPU):
 *   key of position p of slot s, kv head j, dim d at
 *     d_kcache[blocks[s][p / block_size] * block_stride + ((p % block_size) * nkv + j) * hd + d]
 *   where blocks = d_block_tables + s * max_blocks_per_seq. Values likewise in d_vcache. */
#ifndef QD_CUDA_ATTN_H
#define QD_CUDA_ATTN_H

#include <stdint.h>

#include "qdelta.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct qd_cuda_attn_args {
    int n_rows;                  /* query rows in the batch */
    int nq, nkv, hd;             /* query heads, kv heads (nq % nkv == 0), head dim (<= 256, multiple of 8) */
    int rope_dim;                /* rotated leading dims per head (even, <= hd); NeoX rotate-half */
    float rope_theta;            /* inv_freq[i] = (float)(1 / pow(theta, 2i / rope_dim)) computed in double */
    float eps;                   /* q/k RMSNorm epsilon */
    int gated;                   /* q_proj rows per head are [q (hd) | gate (hd)]; output *= sigmoid(gate) */
    /* projections, fp32 */
    const float *d_qg;           /* [n_rows][nq][(gated ? 2 : 1) * hd] */
    const float *d_k, *d_v;      /* [n_rows][nkv * hd] */
    const float *d_q_norm;       /* [hd] zero-centred: y = x * rsqrt(mean(x^2) + eps) * (1 + w) */
    const float *d_k_norm;       /* [hd] */
    /* ragged batch */
    const int32_t *d_row_slot;   /* [n_rows] sequence slot of each row */
    const int32_t *d_row_pos;    /* [n_rows] position of each row in its sequence */
    /* Spans: the rows of one sequence in this batch are consecutive with consecutive
     * positions. d_spans[i] = {first row, row count, position of the first row, slot}.
     * Prefill kernels may tile queries by span; decode kernels may ignore this. */
    const int32_t *d_spans;      /* [n_spans][4] */
    int n_spans;
    int max_span_rows;           /* host-known upper bound of the spans' row counts (tiling) */
    int max_ctx;                 /* upper bound of any position + 1 (fixed per context: graph-safe) */
    /* paged cache (this layer) */
    const int32_t *d_block_tables; /* [max_seqs][max_blocks_per_seq] */
    int max_blocks_per_seq;
    int block_size;
    int64_t block_stride;        /* elements from one block to the next */
    uint16_t *d_kcache, *d_vcache; /* bf16 */
    /* outputs and scratch */
    uint16_t *d_q;               /* [n_rows][nq][hd] bf16 scratch: normed, rotated, pre-scaled queries */
    uint16_t *d_out;             /* [n_rows][nq * hd] bf16: attention output (times sigmoid(gate)) */
    float *d_work;               /* scratch of qd_cuda_attn_work_bytes() bytes (split-K partials) */
    int invariant;               /* 1 = batch-invariant: a row's output bits depend only on its query and
                                  * its sequence's keys (and max_ctx), not on the batch, its span or where
                                  * its prompt was cut: every row runs the split-K decode kernel's
                                  * arithmetic with a slice plan from max_ctx alone (rows of spans longer
                                  * than QD_CUDA_ATTN_INV_SPAN_ROWS in the span kernel, which shares K/V
                                  * tiles among rows and gives the same bits) */
} qd_cuda_attn_args;

/* Invariant mode: spans of more rows than this take the span kernel, shorter
 * ones the decode kernel; both give the same bits (tests/test_cuda_attn.c). */
#define QD_CUDA_ATTN_INV_SPAN_ROWS 16

/* Scratch bytes qd_cuda_attn needs for up to max_rows rows at contexts up to
 * max_ctx, in the mode given by invariant (the args' field of that name); the
 * invariant mode's is bounded whatever max_rows (large batches run in groups). */
size_t qd_cuda_attn_work_bytes(int max_rows, int nq, int hd, int max_ctx, int invariant);

/* q/k RMSNorm, partial RoPE, q to bf16 (scaled by hd^-0.5) into d_q, k/v to bf16 into the cache. */
qd_status qd_cuda_attn_prep(const qd_cuda_attn_args *a, void *stream);
/* Causal GQA attention of every row over its sequence's cache, softmax in fp32,
 * output gate applied; writes d_out. Chooses the kernel (decode split-K or
 * flash-style tensor-core prefill) from the shapes by a table. */
qd_status qd_cuda_attn(const qd_cuda_attn_args *a, void *stream);

#ifdef __cplusplus
}
#endif

#endif
