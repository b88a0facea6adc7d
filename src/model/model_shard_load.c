/* A rank's model read straight from the checkpoint (shard.h): the full model is never
 * loaded. Row slices stay views into the mapping, so the pages a rank touches are those
 * of its own rows (and, for column slices, its columns of every row). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/arena.h"
#include "model/model_quant.h"
#include "model/model_shard.h"
/* The buffers a rank model owns (column slices, gathered runs, fp32 vectors, expert
 * tables) are freed and every layer keeps only its kinds and state index, so no pointer
 * to them survives. */
void qd_shard_model_drop_host(qd_model *m) {
    for (int i = m->n_owned_layout; i < m->n_owned; i++) qd_aligned_free(m->owned[i]);
    m->n_owned = m->n_owned_layout;
    for (int L = 0; L < m->cfg.n_layers; L++) {
        qd_layer *ly = &m->w.layers[L];
        const qd_layer keep = {.kind = ly->kind, .ffn_kind = ly->ffn_kind, .state_index = ly->state_index};
        *ly = keep;
    }
    m->w.final_norm = NULL;
    m->w.mtp = NULL; /* it lived in the freed buffers */
}

qd_status qd_shard_model_load(qd_model *top, const qd_shard_plan *p, uint64_t seed, qd_dtype dummy_dtype,
                              qd_model **out, qd_err *err) {
    *out = NULL;
    qd_model *m = calloc(1, sizeof *m);
    if (!m) return qd_seterr(err, QD_ERR_OOM, "out of memory for a rank model");
    m->cfg = p->local;
    m->backend = top->backend;
    m->ops = top->ops;    /* what the rank's backend does with dummy weights; no backend model */
    m->gen = top->gen;
    memcpy(m->eos_ids, top->eos_ids, sizeof m->eos_ids);
    m->n_eos = top->n_eos;
    m->pool = top->pool;  /* borrowed */
    m->st = top->st;      /* borrowed: every rank reads the one mapping */
    qd_status s = qd_model_init_layers(m, err);
    if (s == QD_OK) {
        m->w.expert0 = p->expert0;
        m->w.n_local_experts = p->n_local_experts;
        m->n_owned_layout = m->n_owned;
        if (m->st) {
            /* every rank checks its modules against top's matcher, compiled once a load */
            const qd_quant_matcher *mt = NULL;
            s = qd_model_quant_matcher(top, &top->cfg.quant, &mt, err);
            m->quant_match = mt;
            if (s == QD_OK) s = qd_model_bind_checkpoint_plan(m, &top->cfg, p, err);
            /* the head's layer by the same plan (model_mtp.c); a head it cannot use leaves
             * the reason in m->mtp_missing, as on an unsplit model */
            if (s == QD_OK) s = qd_model_bind_mtp(m, &top->cfg, p, err);
        } else {
            s = qd_model_bind_dummy(m, seed, dummy_dtype, 0, err);
        }
        if (s == QD_OK) qd_model_account(m);
    }
    if (s != QD_OK) {
        qd_shard_model_free(m);
        return s;
    }
    snprintf(m->describe, sizeof m->describe, "%s: rank %d of %d%s", top->cfg.model_type, p->rank, p->tp_size,
             p->expert_parallel ? " (expert parallel)" : "");
    *out = m;
    return QD_OK;
}
