/* CUDA kernels for the Gated DeltaNet delta rule (spec 3.3 step 6 and 4.1),
 * with C-callable launchers. Every function returns a qd_status and never
 * aborts; on QD_ERR_BACKEND the CUDA error text is available through
 * qd_cuda_last_error() (cuda_device.h). Pointers named d_* are device memory; `stream` is a
 * cudaStream_t passed as void * so that C callers need no CUDA headers.
 *
 * Dtypes follow the serving engine: q/k/v and o are bf16 (stored as uint16_t
 * bit patterns), g (log-decay), beta and the recurrent state are fp32.
 * State layout matches the CPU backend: [seq][hv][dk][dv] fp32. */
#ifndef QD_CUDA_GDN_H
#define QD_CUDA_GDN_H

#include <stddef.h>
#include <stdint.h>

#include "qdelta.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------- gdn_decode.cu */

/* One token for each of n_seq sequences (spec 3.6):
 *   d_q, d_k [n_seq][hk][dk] bf16 (q L2-normalised and scaled by dk^-0.5, k L2-normalised)
 *   d_v      [n_seq][hv][dv] bf16
 *   d_g, d_beta [n_seq][hv] fp32
 *   d_state  pool of states [slots][hv][dk][dv] fp32; sequence b uses slot
 *            d_slot[b] (d_slot NULL: slot b). Read once; the new state is written to slot
 *            d_slot_out[b] of the same pool (d_slot_out NULL: over the old one), a verify
 *            span's per-token states.
 *   d_o      [n_seq][hv][dv] bf16
 * Any dk, dv >= 1 work; dk in {64, 128, 256} with dv a multiple of 32 take the
 * fast path (state tile held in registers, 16-byte accesses). */
/* Tokens a sequence one decode launch may carry (a verify span: speculative_tokens + 1). */
#define QD_GDN_MAX_TOKENS 8

/* One token of each of n_seq sequences, or with n_tok > 1 a span of up to n_tok tokens
 * of each, fed in turn with the state kept on chip: token t of sequence b exists for
 * b < tok_count[t] (host array, non-increasing: the spans longest first), its row is
 * d_row[t * tok_stride + b] and it writes its state to d_slot_out[t * tok_stride + b];
 * the first reads d_slot[b]. Bit for bit the states and outputs of n_tok one-token
 * launches. */
typedef struct qd_cuda_gdn_decode_args {
    int hk, hv, dk, dv; /* key heads, value heads (value head h reads key head h / (hv/hk)), head dims */
    int n_seq;
    const uint16_t *d_q, *d_k, *d_v;
    const float *d_g, *d_beta;
    float *d_state;
    const int32_t *d_slot;
    const int32_t *d_row; /* [n_seq] row of sequence b in q/k/v/g/beta/o (NULL: row b), for
                           * decode tokens scattered through a mixed batch */
    uint16_t *d_o;
    const int32_t *d_slot_out; /* the tests' positional initialisers leave the rest NULL / 0 */
    int n_tok;                 /* tokens a sequence (0: 1) */
    int tok_stride;            /* of d_row and d_slot_out between token positions */
    const int *tok_count;      /* [n_tok], host */
    /* 1: a programmatic launch (cuda_pdl.cuh) whose state loads may overlap the previous
     * kernel, for callers whose previous kernel writes no state slot this launch reads
     * (0: a plain launch, as for a token after another on the same slot) */
    int early_state;
} qd_cuda_gdn_decode_args;

qd_status qd_cuda_gdn_decode(const qd_cuda_gdn_decode_args *a, void *stream);

/* ---------------------------------------------------------- gdn_decode_inputs.cu */

/* A decode-only step's GDN inputs and delta rule in one launch: what qd_cuda_gdn_inputs (`in`,
 * every span one row: decode_only, no verify spans) and then qd_cuda_gdn_decode (`dec`, one
 * token of each of the n rows, d_row NULL, d_q .. d_beta unused) do, bit for bit, without q, k,
 * v and the gates going through memory. The blocks of a key head run as one cluster. Supported:
 * at most 16 sequences, conv width 4, dk 64, 128 or 256, dv a multiple of 32, (dv / 32) (hv / hk) <= 16. */
struct qd_cuda_gdn_in_args; /* cuda_ops.h */
int qd_cuda_gdn_decode_inputs_supported(const struct qd_cuda_gdn_in_args *in, const qd_cuda_gdn_decode_args *dec);
qd_status qd_cuda_gdn_decode_inputs(const struct qd_cuda_gdn_in_args *in, const qd_cuda_gdn_decode_args *dec,
                                    void *stream);

/* --------------------------------------------------------- gdn_chunked.cu */

/* A varlen batch for the chunked (prefill) kernels, planned once per set of
 * sequence lengths: the chunk table and the scratch that the WY kernel writes for
 * the state walk (per chunk and value head, each piece contiguous and laid out for
 * one bulk copy) live on the device. The walk keeps the state in registers and
 * writes the outputs itself, so no per-chunk state goes through device memory.
 * cu_seqlens_host: n_seq + 1 nondecreasing token offsets starting at 0. */
typedef struct qd_cuda_gdn_plan {
    int hk, hv, dk, dv;
    int n_seq, n_chunks, n_tokens;
    int32_t *d_chunks;   /* [n_chunks][4]: first token, length, sequence, chunk index in the sequence */
    int32_t *d_seqs;     /* [n_seq][4]: first token, first chunk, chunk count, length */
    uint16_t *d_w, *d_u; /* WY factors W and U per chunk and value head (bf16) */
    float *d_gc;         /* per chunk and value head: the decay factors of the chunk's tokens */
    uint16_t *d_vnew;    /* per chunk and value head: the intra-chunk matrix A (bf16) */
    uint16_t *d_h;       /* per chunk and key head: copies of the chunk's K and Q rows (bf16) */
    size_t bytes;        /* device scratch held by the plan */
    int max_chunks, max_seqs; /* the bounds the scratch was sized for */
    int32_t *h_tables;   /* pinned staging of the chunk and sequence tables */
} qd_cuda_gdn_plan;

/* A plan sized for exactly this batch, its tables in place on return (synchronous). */
qd_status qd_cuda_gdn_plan_create(qd_cuda_gdn_plan *p, int hk, int hv, int dk, int dv,
                                  const int32_t *cu_seqlens_host, int n_seq);
/* A plan sized once for every batch of up to max_tokens tokens in up to max_seqs
 * sequences (a context reserves it at creation), then set per batch: set fills the
 * tables and copies them on the stream, with no allocation and no host sync. The
 * staging is reused by the next set, so a set must not be issued before the
 * previous one's copy has run (the forward syncs its stream every step). */
qd_status qd_cuda_gdn_plan_reserve(qd_cuda_gdn_plan *p, int hk, int hv, int dk, int dv, int max_tokens, int max_seqs);
qd_status qd_cuda_gdn_plan_set(qd_cuda_gdn_plan *p, const int32_t *cu_seqlens_host, int n_seq, void *stream);
void qd_cuda_gdn_plan_destroy(qd_cuda_gdn_plan *p);

/* Token-major packed inputs of all sequences (row t of every tensor is token t):
 *   d_q, d_k [n_tokens] rows of hk*dk bf16 at row strides q_stride, k_stride (elements)
 *   d_v      [n_tokens] rows of hv*dv bf16 at row stride v_stride
 *   d_g, d_beta [n_tokens][hv] fp32
 *   d_state0 [slots][hv][dk][dv] fp32 initial states (NULL: zero), sequence s at slot d_slot[s]
 *   d_state1 [slots][hv][dk][dv] fp32 final states (NULL: not written; may equal d_state0)
 *   d_o      [n_tokens][hv][dv] bf16
 * dk and dv must be multiples of 16 and at most 256. */
typedef struct qd_cuda_gdn_chunked_args {
    const uint16_t *d_q, *d_k, *d_v;
    int64_t q_stride, k_stride, v_stride;
    const float *d_g, *d_beta;
    const float *d_state0;
    float *d_state1;
    const int32_t *d_slot; /* [n_seq] state of sequence s at index d_slot[s] of state0/state1 (NULL: s) */
    uint16_t *d_o;
    /* 16-column state tiles per block of the walk: 0 the table's choice (qd_cuda_gdn_walk_tiles);
     * 2, 4 or 8 force one, for tests and benchmarks (every choice gives the same bits) */
    int walk_tiles;
} qd_cuda_gdn_chunked_args;

/* The tiles per walk block the table picks for the plan's current batch. */
int qd_cuda_gdn_walk_tiles(const qd_cuda_gdn_plan *p);

qd_status qd_cuda_gdn_chunked(const qd_cuda_gdn_plan *p, const qd_cuda_gdn_chunked_args *a, void *stream);
/* Benchmarks only: runs the subset of the two kernels named by stage_mask
 * (1 = WY factors, 2 = state walk with the outputs), to time each one. */
qd_status qd_cuda_gdn_chunked_stages(const qd_cuda_gdn_plan *p, const qd_cuda_gdn_chunked_args *a, void *stream,
                                     int stage_mask);

#ifdef __cplusplus
}
#endif

#endif
