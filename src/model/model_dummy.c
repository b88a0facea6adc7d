/* --load-format dummy: weights drawn at load from config.json alone, in BF16, with
 * scales that keep activations in a sane range. For benchmarks at real shapes. With
 * --quantization fp8|nvfp4|int4 each layer's linear layers are converted into that format
 * as soon as the layer is drawn (model_quant_online.c), so every benchmark runs in a format
 * without a download and a large model never holds more than one layer in bf16. A backend
 * that draws dummies in place (CUDA) gets no host values at all, bf16 or in a format (it
 * quantizes its draw as the host would, NVFP4's global factor from the whole matrix's amax
 * included). The values: base/dummy_values.h. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "base/dummy_values.h"
#include "model/model.h"
#include "model/model_quant.h"

typedef struct {
    void *dst;
    qd_dtype dtype;
    int64_t n;
    float scale;
    uint64_t seed;
} fill_job;

static inline uint64_t splitmix(uint64_t *s) {
    return qd_dummy_mix(*s += 0x9e3779b97f4a7c15ull);
}

static void fill_worker(void *user, int64_t begin, int64_t end, int worker) {
    (void)worker;
    const fill_job *j = user;
    const int64_t lo = begin * QD_DUMMY_BLOCK, hi = end * QD_DUMMY_BLOCK < j->n ? end * QD_DUMMY_BLOCK : j->n;
    for (int64_t i = lo; i < hi; i++) {
        const float v = qd_dummy_value(j->seed, j->scale, i);
        if (j->dtype == QD_DTYPE_F32) ((float *)j->dst)[i] = v;
        else ((uint16_t *)j->dst)[i] = qd_f32_to_bf16(v);
    }
}

static qd_status rand_matrix(qd_model *m, qd_weight *w, int64_t rows, int64_t cols, uint64_t *seed, qd_err *err) {
    if (m->ops->draws_dummy_weights) {
        /* drawn by the backend: no host copy of a 70 GB model */
        *w = (qd_weight){.dtype = QD_DTYPE_BF16, .rows = rows, .cols = cols, .dummy_seed = splitmix(seed),
                         .dummy_scale = sqrtf(3.0f / (float)cols)};
        return QD_OK;
    }
    void *d = qd_model_alloc(m, (size_t)(rows * cols) * qd_dtype_size(m->dummy_dtype));
    if (!d) return qd_seterr(err, QD_ERR_OOM, "out of memory for a %lldx%lld dummy weight", (long long)rows, (long long)cols);
    fill_job j = {d, m->dummy_dtype, rows * cols, sqrtf(3.0f / (float)cols), splitmix(seed)};
    qd_parallel_for(m->pool, (j.n + QD_DUMMY_BLOCK - 1) / QD_DUMMY_BLOCK, 16, fill_worker, &j);
    *w = (qd_weight){.dtype = m->dummy_dtype, .rows = rows, .cols = cols, .data = d, .dummy_seed = j.seed,
                     .dummy_scale = j.scale};
    return QD_OK;
}

static qd_status const_vector(qd_model *m, float **out, int64_t n, float value, qd_err *err) {
    float *v = qd_model_alloc(m, (size_t)n * sizeof(float));
    if (!v) return qd_seterr(err, QD_ERR_OOM, "out of memory");
    for (int64_t i = 0; i < n; i++) v[i] = value;
    *out = v;
    return QD_OK;
}

static qd_status rand_mlp(qd_model *m, qd_mlp_weights *w, int I, uint64_t *seed, qd_err *err) {
    const int H = m->cfg.hidden_size;
    QD_TRY(rand_matrix(m, &w->gate, I, H, seed, err));
    QD_TRY(rand_matrix(m, &w->up, I, H, seed, err));
    QD_TRY(rand_matrix(m, &w->down, H, I, seed, err));
    return QD_OK;
}

/* One decoder layer's weights drawn from the seed (its kind and FFN kind are set). */
static qd_status rand_layer(qd_model *m, qd_layer *ly, uint64_t *seed, qd_err *err) {
    const qd_config *c = &m->cfg;
    const int H = c->hidden_size, hv = c->gdn_hv, hd = c->attn_head_dim;
    QD_TRY(const_vector(m, &ly->input_norm, H, 0.0f, err));
    QD_TRY(const_vector(m, &ly->post_norm, H, 0.0f, err));
    if (ly->kind == QD_LAYER_GDN) {
        qd_gdn_weights *g = &ly->gdn;
        const int conv_dim = qd_config_conv_dim(c);
        QD_TRY(rand_matrix(m, &g->in_qkv, conv_dim, H, seed, err));
        QD_TRY(rand_matrix(m, &g->in_z, qd_config_value_dim(c), H, seed, err));
        QD_TRY(rand_matrix(m, &g->in_b, hv, H, seed, err));
        QD_TRY(rand_matrix(m, &g->in_a, hv, H, seed, err));
        QD_TRY(rand_matrix(m, &g->out, H, qd_config_value_dim(c), seed, err));
        QD_TRY(const_vector(m, &g->conv_w, (int64_t)conv_dim * c->gdn_conv_kernel, 0.25f, err));
        QD_TRY(const_vector(m, &g->A_log, hv, 0.0f, err));
        for (int h = 0; h < hv; h++) g->A_log[h] = logf(1.0f + 15.0f * (float)h / (float)(hv > 1 ? hv - 1 : 1));
        QD_TRY(const_vector(m, &g->dt_bias, hv, 0.0f, err));
        QD_TRY(const_vector(m, &g->norm_w, c->gdn_dv, 1.0f, err));
    } else {
        qd_attn_weights *a = &ly->attn;
        QD_TRY(rand_matrix(m, &a->q, (int64_t)c->attn_nq * hd * (c->attn_output_gate ? 2 : 1), H, seed, err));
        QD_TRY(rand_matrix(m, &a->k, (int64_t)c->attn_nkv * hd, H, seed, err));
        QD_TRY(rand_matrix(m, &a->v, (int64_t)c->attn_nkv * hd, H, seed, err));
        QD_TRY(rand_matrix(m, &a->o, H, (int64_t)c->attn_nq * hd, seed, err));
        QD_TRY(const_vector(m, &a->q_norm, hd, 0.0f, err));
        QD_TRY(const_vector(m, &a->k_norm, hd, 0.0f, err));
    }
    if (ly->ffn_kind == QD_FFN_DENSE) {
        QD_TRY(rand_mlp(m, &ly->mlp, c->intermediate_size, seed, err));
    } else {
        qd_moe_weights *w = &ly->moe;
        QD_TRY(rand_matrix(m, &w->router, c->n_experts, H, seed, err));
        w->experts = qd_model_alloc(m, sizeof(qd_mlp_weights) * (size_t)c->n_experts);
        if (!w->experts) return qd_seterr(err, QD_ERR_OOM, "out of memory for experts");
        memset(w->experts, 0, sizeof(qd_mlp_weights) * (size_t)c->n_experts);
        /* an expert-parallel rank draws only its experts; the others' seeds are skipped so
         * that every expert is drawn the same whichever rank holds it */
        for (int e = 0; e < c->n_experts; e++) {
            if (e >= m->w.expert0 && e < m->w.expert0 + m->w.n_local_experts)
                QD_TRY(rand_mlp(m, &w->experts[e], c->moe_intermediate_size, seed, err));
            else for (int i = 0; i < 3; i++) (void)splitmix(seed);
        }
        w->has_shared = c->shared_expert_intermediate_size > 0;
        if (w->has_shared) {
            QD_TRY(rand_mlp(m, &w->shared, c->shared_expert_intermediate_size, seed, err));
            QD_TRY(rand_matrix(m, &w->shared_gate, 1, H, seed, err));
        }
    }
    return QD_OK;
}

/* A dummy MTP head (config mtp_num_hidden_layers > 0, an unsplit model), drawn after the
 * main layers so that their weights do not depend on it; kept in bf16 (the checkpoints'
 * heads are mostly unquantized). */
static qd_status rand_mtp(qd_model *m, uint64_t *seed, qd_err *err) {
    const qd_config *c = &m->cfg;
    const int H = c->hidden_size;
    qd_mtp_weights *w = qd_model_new_mtp(m, c);
    if (!w) return qd_seterr(err, QD_ERR_OOM, "out of memory for the MTP head");
    QD_TRY(const_vector(m, &w->pre_fc_norm_embedding, H, 0.0f, err));
    QD_TRY(const_vector(m, &w->pre_fc_norm_hidden, H, 0.0f, err));
    QD_TRY(rand_matrix(m, &w->fc, H, 2 * (int64_t)H, seed, err));
    QD_TRY(rand_layer(m, &w->layer, seed, err));
    QD_TRY(const_vector(m, &w->norm, H, 0.0f, err));
    m->w.mtp = w;
    m->mtp_missing[0] = 0;
    return QD_OK;
}

qd_status qd_model_bind_dummy(qd_model *m, uint64_t seed, qd_dtype dtype, int with_mtp, qd_err *err) {
    m->dummy_dtype = dtype; /* values are bf16-representable either way: F32 and BF16 dummies compute alike */
    const qd_config *c = &m->cfg;
    const int H = c->hidden_size;
    uint64_t s = seed;
    QD_TRY(rand_matrix(m, &m->w.embed, c->vocab_size, H, &s, err));
    if (c->tie_word_embeddings) m->w.lm_head = m->w.embed;
    else QD_TRY(rand_matrix(m, &m->w.lm_head, c->vocab_size, H, &s, err));
    QD_TRY(const_vector(m, &m->w.final_norm, H, 0.0f, err));
    for (int L = 0; L < c->n_layers; L++) {
        QD_TRY(rand_layer(m, &m->w.layers[L], &s, err));
        if (m->quantization != QD_QUANTIZATION_NONE) QD_TRY(qd_model_quantize_layer(m, m->quantization, L, err));
    }
    if (c->mtp_layers > 0 && with_mtp) return rand_mtp(m, &s, err);
    snprintf(m->mtp_missing, sizeof m->mtp_missing, "%s",
             c->mtp_layers > 0 ? "the dummy weights of a split model have no MTP head"
                               : "the config has no MTP layer (mtp_num_hidden_layers)");
    return QD_OK;
}
