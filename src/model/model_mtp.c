/* Binds the MTP head (spec 7.2) of a checkpoint: mtp.pre_fc_norm_embedding,
 * mtp.pre_fc_norm_hidden, mtp.fc [H][2H], one full-attention decoder layer
 * mtp.layers.0.* with the family's FFN (MoE with shared expert, per-expert or fused, or
 * dense SwiGLU) and mtp.norm; the embedding and LM head are the main model's.
 *
 * The head is optional: a checkpoint without one (or with only some of its tensors,
 * as some conversions leave) loads as before, and the reason is kept for the error of
 * a context that asks for speculation. Names are the same in both families and sit at
 * the top level (no model. / model.language_model. prefix).
 *
 * A tensor-parallel rank binds its slices of the head's decoder layer by its plan, as of
 * every main layer (its KV heads and query heads, its share of the FFN or of every
 * expert, plain or quantized alike); fc, the norms, the embedding and the LM head are
 * whole on every rank. */
#include <stdio.h>
#include <string.h>

#include "model/model.h"
#include "parallel/shard.h"

/* The reason speculation is refused, from a binding error. */
static qd_status missing(qd_model *m, qd_err *err, const char *why) {
    snprintf(m->mtp_missing, sizeof m->mtp_missing, "the checkpoint's MTP head is unusable: %.200s", why);
    qd_err_clear(err);
    m->w.mtp = NULL;
    return QD_OK;
}

const char *qd_mtp_plan_lacks(const qd_config *c, const qd_shard_plan *p) {
    const qd_ffn_kind ffn = c->n_experts > 0 ? QD_FFN_MOE : QD_FFN_DENSE;
    if (p->tp_size == 1) return NULL;
    bool attn = false, same_ffn = false;
    for (int L = 0; L < c->n_layers; L++) {
        attn |= c->layer_kind[L] == QD_LAYER_ATTN;
        same_ffn |= c->ffn_kind[L] == ffn;
    }
    if (!attn) return "tensor parallel: the main layers have no full attention to shard its attention like";
    if (!same_ffn) return "tensor parallel: the main layers have no FFN of its kind to shard its FFN like";
    return NULL;
}

qd_mtp_weights *qd_model_new_mtp(qd_model *m, const qd_config *c) {
    qd_mtp_weights *w = qd_model_alloc(m, sizeof *w);
    if (!w) return NULL;
    memset(w, 0, sizeof *w);
    w->layer.kind = QD_LAYER_ATTN;
    w->layer.ffn_kind = c->n_experts > 0 ? QD_FFN_MOE : QD_FFN_DENSE;
    w->layer.state_index = m->w.n_attn; /* the extra attention layer of the KV blocks */
    return w;
}

qd_status qd_model_bind_mtp(qd_model *m, const qd_config *c, const struct qd_shard_plan *p, qd_err *err) {
    const int H = c->hidden_size;
    m->w.mtp = NULL;
    if (!m->st || !qd_st_find(m->st, "mtp.fc.weight")) {
        snprintf(m->mtp_missing, sizeof m->mtp_missing, "the checkpoint has no MTP head (no mtp.fc.weight)");
        return QD_OK;
    }
    if (qd_st_find(m->st, "mtp.layers.1.input_layernorm.weight"))
        return missing(m, err, "it has more than one layer (mtp.layers.1.*); one is supported");
    const char *lacks = qd_mtp_plan_lacks(c, p);
    if (lacks) return missing(m, err, lacks);
    qd_mtp_weights *w = qd_model_new_mtp(m, c);
    if (!w) return qd_seterr(err, QD_ERR_OOM, "out of memory for the MTP head");
    qd_status s = qd_model_bind_norm(m, "mtp.pre_fc_norm_embedding.weight", H, &w->pre_fc_norm_embedding, err);
    if (s == QD_OK) s = qd_model_bind_norm(m, "mtp.pre_fc_norm_hidden.weight", H, &w->pre_fc_norm_hidden, err);
    if (s == QD_OK) s = qd_model_bind_matrix(m, "mtp.fc.weight", H, 2 * (int64_t)H, &w->fc, err);
    if (s == QD_OK) s = qd_model_bind_norm(m, "mtp.norm.weight", H, &w->norm, err);
    if (s == QD_OK) s = qd_model_bind_layer(m, c, p, "mtp.", 0, &w->layer, err);
    if (s == QD_ERR_OOM) return s;
    if (s != QD_OK) {
        char why[QD_ERRMSG_SIZE];
        snprintf(why, sizeof why, "%s", err->msg);
        return missing(m, err, why);
    }
    m->w.mtp = w;
    m->mtp_missing[0] = 0;
    return QD_OK;
}
