/* Sharding plans: which slice of every weight and state a rank holds (shard.h).
 * Only the layer kinds the model has constrain tp_size: a Qwen3.5-MoE config carries an
 * unused intermediate_size, which need not divide. */
#include <string.h>

#include "parallel/shard.h"

static qd_shard_range rg(int64_t begin, int64_t count) { return (qd_shard_range){begin, count}; }

static qd_status need_div(qd_err *err, int tp, int value, const char *field, const char *why) {
    if (value % tp == 0) return QD_OK;
    return qd_seterr(err, QD_ERR_INVALID_ARG, "tensor parallel size %d does not divide %s = %d (%s)", tp, field, value,
                     why);
}

static qd_status plan_gdn(const qd_config *c, qd_shard_plan *p, qd_err *err) {
    const int tp = p->tp_size, dk = c->gdn_dk, dv = c->gdn_dv, hk = c->gdn_hk, r = c->gdn_hv / c->gdn_hk;
    qd_config *l = &p->local;
    if (hk % tp == 0) {
        l->gdn_hk = hk / tp;
        p->gdn_hk0 = p->rank * l->gdn_hk;
    } else if (tp % hk == 0 && c->gdn_hv % tp == 0) {
        /* more ranks than key heads: each key head (its q and k channels) lives on tp / hk
         * ranks, which split its value heads; value head j reads key head j / r, so rank
         * rank's value heads all read key head rank / (tp / hk) */
        l->gdn_hk = 1;
        p->gdn_hk0 = p->rank / (tp / hk);
    } else {
        return qd_seterr(err, QD_ERR_INVALID_ARG,
                         "tensor parallel size %d and linear_num_key_heads = %d, linear_num_value_heads = %d: "
                         "tp must divide the key heads (each rank keeps whole key-head groups), or be a multiple "
                         "of them dividing the value heads (each key head replicated on a whole number of ranks)",
                         tp, hk, c->gdn_hv);
    }
    l->gdn_hv = c->gdn_hv / tp;
    p->gdn_hv0 = p->rank * l->gdn_hv;
    const int64_t key_dim = (int64_t)hk * dk;
    p->gdn_qkv_rows[0] = rg((int64_t)p->gdn_hk0 * dk, (int64_t)l->gdn_hk * dk);
    p->gdn_qkv_rows[1] = rg(key_dim + (int64_t)p->gdn_hk0 * dk, (int64_t)l->gdn_hk * dk);
    p->gdn_qkv_rows[2] = rg(2 * key_dim + (int64_t)p->gdn_hv0 * dv, (int64_t)l->gdn_hv * dv);
    p->gdn_z_rows = rg((int64_t)p->gdn_hv0 * dv, (int64_t)l->gdn_hv * dv);
    p->gdn_head_rows = rg(p->gdn_hv0, l->gdn_hv);
    /* interleaved checkpoints store key-head group j as one block of rows (spec 3.2), so a
     * rank's groups are one contiguous range there */
    const int64_t group = 2 * (int64_t)dk + 2 * (int64_t)r * dv;
    p->next_qkvz_rows = rg(p->gdn_hk0 * group, l->gdn_hk * group);
    p->next_ba_rows = rg((int64_t)p->gdn_hk0 * 2 * r, (int64_t)l->gdn_hk * 2 * r);
    return QD_OK;
}

static qd_status plan_attn(const qd_config *c, qd_shard_plan *p, qd_err *err) {
    const int tp = p->tp_size, nq = c->attn_nq, nkv = c->attn_nkv, hd = c->attn_head_dim;
    qd_config *l = &p->local;
    if (nkv % tp == 0) {
        l->attn_nkv = nkv / tp;
        p->attn_kv0 = p->rank * l->attn_nkv;
    } else if (tp % nkv == 0) {
        /* more ranks than KV heads: each KV head lives on tp / nkv ranks, which split its
         * query heads (the released models have 2 to 4 KV heads) */
        l->attn_nkv = 1;
        p->attn_kv0 = p->rank / (tp / nkv);
    } else {
        return qd_seterr(err, QD_ERR_INVALID_ARG,
                         "tensor parallel size %d and num_key_value_heads = %d: one must divide the other "
                         "(KV-head groups are split across ranks, or each KV head is replicated on a whole "
                         "number of ranks)", tp, nkv);
    }
    QD_TRY(need_div(err, tp, nq, "num_attention_heads", "each rank takes the query heads of its KV heads"));
    l->attn_nq = nq / tp;
    p->attn_q0 = p->rank * l->attn_nq;
    /* the query heads [q0, q0 + nq_l) read exactly the KV heads [kv0, kv0 + nkv_l): GQA
     * maps query head h to KV head h / (nq / nkv) */
    const int qf = c->attn_output_gate ? 2 : 1;
    p->attn_q_rows = rg((int64_t)p->attn_q0 * hd * qf, (int64_t)l->attn_nq * hd * qf);
    p->attn_kv_rows = rg((int64_t)p->attn_kv0 * hd, (int64_t)l->attn_nkv * hd);
    p->attn_o_cols = rg((int64_t)p->attn_q0 * hd, (int64_t)l->attn_nq * hd);
    return QD_OK;
}

static qd_status plan_moe(const qd_config *c, qd_shard_plan *p, qd_err *err) {
    const int tp = p->tp_size;
    qd_config *l = &p->local;
    if (p->expert_parallel) {
        QD_TRY(need_div(err, tp, c->n_experts, "num_experts",
                        "expert parallel: each rank holds num_experts / tp whole experts"));
        p->n_local_experts = c->n_experts / tp;
        p->expert0 = p->rank * p->n_local_experts;
        p->expert_rows = rg(0, c->moe_intermediate_size);
    } else {
        QD_TRY(need_div(err, tp, c->moe_intermediate_size, "moe_intermediate_size",
                        "tensor parallel MoE splits every expert's width"));
        l->moe_intermediate_size = c->moe_intermediate_size / tp;
        p->n_local_experts = c->n_experts;
        p->expert_rows = rg((int64_t)p->rank * l->moe_intermediate_size, l->moe_intermediate_size);
    }
    if (c->shared_expert_intermediate_size > 0) {
        QD_TRY(need_div(err, tp, c->shared_expert_intermediate_size, "shared_expert_intermediate_size",
                        "the shared expert is split like a dense MLP"));
        l->shared_expert_intermediate_size = c->shared_expert_intermediate_size / tp;
        p->shared_rows = rg((int64_t)p->rank * l->shared_expert_intermediate_size, l->shared_expert_intermediate_size);
    }
    return QD_OK;
}

qd_status qd_shard_plan_make(const qd_config *c, int tp_size, int rank, bool expert_parallel, qd_shard_plan *out,
                             qd_err *err) {
    memset(out, 0, sizeof *out);
    if (tp_size < 1) return qd_seterr(err, QD_ERR_INVALID_ARG, "tensor parallel size %d must be at least 1", tp_size);
    if (rank < 0 || rank >= tp_size)
        return qd_seterr(err, QD_ERR_INVALID_ARG, "rank %d out of range [0, %d)", rank, tp_size);
    out->tp_size = tp_size;
    out->rank = rank;
    out->expert_parallel = expert_parallel;
    out->local = *c;
    bool gdn = false, attn = false, dense = false, moe = false;
    for (int L = 0; L < c->n_layers; L++) {
        gdn |= c->layer_kind[L] == QD_LAYER_GDN;
        attn |= c->layer_kind[L] == QD_LAYER_ATTN;
        dense |= c->ffn_kind[L] == QD_FFN_DENSE;
        moe |= c->ffn_kind[L] == QD_FFN_MOE;
    }
    if (gdn) QD_TRY(plan_gdn(c, out, err));
    if (attn) QD_TRY(plan_attn(c, out, err));
    if (dense) {
        QD_TRY(need_div(err, tp_size, c->intermediate_size, "intermediate_size", "dense MLPs split their width"));
        out->local.intermediate_size = c->intermediate_size / tp_size;
        out->mlp_rows = rg((int64_t)rank * out->local.intermediate_size, out->local.intermediate_size);
    } else {
        out->local.intermediate_size = 0;  /* no dense layer: the field is unused */
    }
    if (moe) QD_TRY(plan_moe(c, out, err));
    return QD_OK;
}
