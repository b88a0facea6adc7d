/* Tensor- and expert-parallel sharding (docs/parallel.md).
 *
 * A plan says, for one rank of a tensor-parallel group of tp_size ranks, which rows or
 * columns of every weight the rank holds, which slice of the per-sequence state it
 * keeps, and the rank's own config (local head counts and widths, hidden size and
 * vocabulary unchanged). The layer code runs unchanged on a rank's model; the ranks'
 * outputs of out_proj / o_proj / down_proj (and of the MoE block) are partial sums
 * that an all-reduce adds up.
 *
 * Ranges are in the logical weight layout of model-spec 3.2 (rows of in_proj_qkv are
 * [q heads | k heads | v heads]); for Qwen3-Next's interleaved checkpoint tensors the
 * plan also names the contiguous row range of in_proj_qkvz / in_proj_ba a rank reads. */
#ifndef QD_PARALLEL_SHARD_H
#define QD_PARALLEL_SHARD_H

#include <stdbool.h>
#include <stdint.h>

#include "base/err.h"
#include "io/config.h"

/* rows (or columns) [begin, begin + count) */
typedef struct qd_shard_range {
    int64_t begin, count;
} qd_shard_range;

typedef struct qd_shard_plan {
    int tp_size, rank;
    bool expert_parallel;   /* MoE experts partitioned across ranks instead of split inside */
    qd_config local;        /* the rank's config: every head count / width below is local */

    /* Gated DeltaNet: whole key-head groups [gdn_hk0, +local.gdn_hk) with their value heads
     * [gdn_hv0, +local.gdn_hv). When tp_size > linear_num_key_heads (and a multiple of it)
     * each key head is replicated on tp_size / hk ranks, each taking a share of its value
     * heads (local.gdn_hk = 1). The three q, k, v runs are rows of in_proj_qkv, channels of
     * conv1d and of the conv state; z rows are rows of in_proj_z and columns of out_proj;
     * head rows are rows of in_proj_b / in_proj_a, entries of A_log / dt_bias and heads of the
     * recurrent state. norm.weight ([dv]) is whole on every rank. */
    int gdn_hk0, gdn_hv0;
    qd_shard_range gdn_qkv_rows[3];
    qd_shard_range gdn_z_rows;
    qd_shard_range gdn_head_rows;
    qd_shard_range next_qkvz_rows;  /* Qwen3-Next in_proj_qkvz: the rank's key-head groups (with a
                                     * replicated key head: its group, of which the rank reads q, k
                                     * and the v, z rows of its value heads) */
    qd_shard_range next_ba_rows;    /* Qwen3-Next in_proj_ba, likewise */

    /* Attention by KV-head groups: KV heads [attn_kv0, +local.attn_nkv), the query heads
     * that read them [attn_q0, +local.attn_nq). When tp_size > num_key_value_heads (and a
     * multiple of it) each KV head is replicated on tp_size / nkv ranks, each taking a
     * share of its query heads. q_rows covers [q | gate] of each query head; kv_rows
     * are rows of k_proj and v_proj and the heads of the KV cache; o_cols are columns of
     * o_proj. q_norm / k_norm ([head_dim]) are whole. */
    int attn_kv0, attn_q0;
    qd_shard_range attn_q_rows, attn_kv_rows, attn_o_cols;

    /* Dense SwiGLU: rows of gate_proj / up_proj, columns of down_proj. */
    qd_shard_range mlp_rows;

    /* MoE: the router and shared_expert_gate are whole. Experts [expert0, +n_local_experts)
     * with rows expert_rows of each expert's gate / up (columns of down): all experts and a
     * slice of each (tensor parallel), or whole experts of a partition (expert parallel).
     * The shared expert is split like a dense MLP in both modes. */
    int expert0, n_local_experts;
    qd_shard_range expert_rows;
    qd_shard_range shared_rows;

    /* embed_tokens, lm_head, every RMSNorm weight: whole on every rank */
} qd_shard_plan;

/* Plans rank `rank` of tp_size for config c. QD_ERR_INVALID_ARG naming the config field
 * when tp_size does not divide a dimension the split needs (or a bad tp_size / rank). */
qd_status qd_shard_plan_make(const qd_config *c, int tp_size, int rank, bool expert_parallel, qd_shard_plan *out,
                             qd_err *err);

#endif
