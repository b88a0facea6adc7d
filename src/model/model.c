/* Model lifetime: load (config, weights, thread pool), accessors, accounting. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/arena.h"
#include "base/log.h"
#include "model/model.h"
#include "model/model_quant.h"

qd_model_params qd_model_default_params(void) {
    qd_model_params p;
    memset(&p, 0, sizeof p);
    p.load_format = QD_LOAD_AUTO;
    p.backend = QD_BACKEND_CPU;
    p.seed = 0x5eed;
    return p;
}

void *qd_model_own(qd_model *m, void *p) {
    if (!p) return NULL;
    if (m->n_owned == m->cap_owned) {
        int cap = m->cap_owned ? m->cap_owned * 2 : 256;
        void **n = realloc(m->owned, sizeof(void *) * (size_t)cap);
        if (!n) {
            qd_aligned_free(p);
            return NULL;
        }
        m->owned = n;
        m->cap_owned = cap;
    }
    m->owned[m->n_owned++] = p;
    return p;
}

void *qd_model_alloc(qd_model *m, size_t bytes) { return qd_model_own(m, qd_aligned_alloc(bytes)); }

static int64_t weight_bytes(const qd_weight *w) {
    return (int64_t)(qd_weight_data_bytes(w) + qd_weight_scale_bytes(w));
}
static int64_t mlp_bytes(const qd_mlp_weights *w) {
    return weight_bytes(&w->gate) + weight_bytes(&w->up) + weight_bytes(&w->down);
}

void qd_model_account(qd_model *m) {
    const qd_config *c = &m->cfg;
    int64_t total = 0, active = 0, params = 0;
    m->expert_bytes = 0;
    m->n_moe_layers = 0;
    const int64_t H = c->hidden_size;
#define ADD_W(w, is_active)                                                   \
    do {                                                                      \
        int64_t b_ = weight_bytes(w);                                         \
        total += b_;                                                          \
        params += (w)->rows * (w)->cols;                                      \
        if (is_active) active += b_;                                          \
    } while (0)
    ADD_W(&m->w.embed, 0);
    if (!c->tie_word_embeddings) ADD_W(&m->w.lm_head, 1);
    else active += weight_bytes(&m->w.lm_head);
    params += H;
    for (int L = 0; L < c->n_layers; L++) {
        const qd_layer *ly = &m->w.layers[L];
        params += 2 * H;
        if (ly->kind == QD_LAYER_GDN) {
            const qd_gdn_weights *g = &ly->gdn;
            ADD_W(&g->in_qkv, 1); ADD_W(&g->in_z, 1); ADD_W(&g->in_b, 1); ADD_W(&g->in_a, 1); ADD_W(&g->out, 1);
            params += (int64_t)qd_config_conv_dim(c) * c->gdn_conv_kernel + 2 * c->gdn_hv + c->gdn_dv;
        } else {
            const qd_attn_weights *a = &ly->attn;
            ADD_W(&a->q, 1); ADD_W(&a->k, 1); ADD_W(&a->v, 1); ADD_W(&a->o, 1);
            params += 2 * c->attn_head_dim;
        }
        if (ly->ffn_kind == QD_FFN_DENSE) {
            ADD_W(&ly->mlp.gate, 1); ADD_W(&ly->mlp.up, 1); ADD_W(&ly->mlp.down, 1);
        } else {
            const qd_moe_weights *w = &ly->moe;
            ADD_W(&w->router, 1);
            for (int e = 0; e < c->n_experts; e++) {
                ADD_W(&w->experts[e].gate, 0); ADD_W(&w->experts[e].up, 0); ADD_W(&w->experts[e].down, 0);
            }
            if (m->w.n_local_experts > 0) {
                m->expert_bytes = mlp_bytes(&w->experts[m->w.expert0]);
                active += m->expert_bytes * c->n_experts_per_tok;
            }
            m->n_moe_layers++;
            if (w->has_shared) {
                ADD_W(&w->shared.gate, 1); ADD_W(&w->shared.up, 1); ADD_W(&w->shared.down, 1);
                ADD_W(&w->shared_gate, 1);
            }
        }
    }
#undef ADD_W
    m->n_params = params;
    m->weight_bytes = total;
    m->active_weight_bytes = active;
    snprintf(m->describe, sizeof m->describe,
             "%s: %d layers (%d GDN, %d attention), hidden %d, GDN heads %d/%d (dk %d, dv %d), "
             "attention heads %d/%d (head_dim %d, rope %d), %s, vocab %d, %.3f B params",
             c->model_type, c->n_layers, m->w.n_gdn, m->w.n_attn, c->hidden_size, c->gdn_hk, c->gdn_hv, c->gdn_dk,
             c->gdn_dv, c->attn_nq, c->attn_nkv, c->attn_head_dim, c->rope_dim,
             c->n_experts > 0 ? "MoE" : "dense FFN", c->vocab_size, (double)params / 1e9);
}

qd_status qd_model_init_layers(qd_model *m, qd_err *err) {
    const qd_config *c = &m->cfg;
    m->w.layers = qd_model_alloc(m, sizeof(qd_layer) * (size_t)c->n_layers);
    if (!m->w.layers) return qd_seterr(err, QD_ERR_OOM, "out of memory for %d layers", c->n_layers);
    memset(m->w.layers, 0, sizeof(qd_layer) * (size_t)c->n_layers);
    for (int L = 0; L < c->n_layers; L++) {
        qd_layer *ly = &m->w.layers[L];
        ly->kind = c->layer_kind[L];
        ly->ffn_kind = c->ffn_kind[L];
        ly->state_index = ly->kind == QD_LAYER_GDN ? m->w.n_gdn++ : m->w.n_attn++;
    }
    m->w.expert0 = 0;
    m->w.n_local_experts = c->n_experts;
    if (c->gdn_conv_kernel < 1 || c->gdn_conv_kernel > 16)
        return qd_seterr(err, QD_ERR_UNSUPPORTED, "linear_conv_kernel_dim %d: supported range is 1..16",
                         c->gdn_conv_kernel);
    return QD_OK;
}

qd_status qd_model_load(const qd_model_params *params, qd_model **out, char *errbuf, size_t err_size) {
    *out = NULL;
    qd_err err;
    qd_err_clear(&err);
    qd_status s = QD_OK;
    qd_model *m = NULL;
    if (!params || !params->path) {
        s = qd_seterr(&err, QD_ERR_INVALID_ARG, "no model directory given");
        goto fail;
    }
    const qd_backend_ops *ops = qd_backend_find(params->backend, params->tensor_parallel_size > 1, &err);
    if (!ops) {
        s = err.status;
        goto fail;
    }
    m = calloc(1, sizeof *m);
    if (!m) {
        s = qd_seterr(&err, QD_ERR_OOM, "out of memory");
        goto fail;
    }
    if ((s = qd_config_load(params->path, &m->cfg, &err)) != QD_OK) goto fail;
    if ((s = qd_generation_config_load(params->path, &m->gen, &err)) != QD_OK) goto fail;
    {
        const int *src = m->gen.n_eos ? m->gen.eos_token_ids : m->cfg.eos_token_ids;
        m->n_eos = m->gen.n_eos ? m->gen.n_eos : m->cfg.n_eos;
        for (int i = 0; i < m->n_eos; i++) m->eos_ids[i] = src[i];
    }
    m->backend = params->backend;
    m->ops = ops;
    if ((s = qd_model_init_layers(m, &err)) != QD_OK) goto fail;
    m->pool = qd_threadpool_create(params->n_threads);
    if (!m->pool) {
        s = qd_seterr(&err, QD_ERR_OOM, "could not start the thread pool");
        goto fail;
    }
    if (params->progress) params->progress(0.0f, params->progress_user);
    const bool dummy = params->load_format == QD_LOAD_DUMMY || params->load_format == QD_LOAD_DUMMY_F32;
    if (params->quantization != QD_QUANTIZATION_NONE) {
        if ((unsigned)params->quantization > QD_QUANTIZATION_INT4) {
            s = qd_seterr(&err, QD_ERR_INVALID_ARG, "quantization %d is not a format", (int)params->quantization);
            goto fail;
        }
        if (!dummy && params->quantization != QD_QUANTIZATION_FP8) {
            s = qd_seterr(&err, QD_ERR_UNSUPPORTED, "--quantization %s: a checkpoint is quantized at load to fp8 only "
                          "(nvfp4 and int4 are for --load-format dummy)",
                          params->quantization == QD_QUANTIZATION_NVFP4 ? "nvfp4" : "int4");
            goto fail;
        }
        if (params->tensor_parallel_size > 1) {
            s = qd_seterr(&err, QD_ERR_UNSUPPORTED, "--quantization with tensor parallelism is not supported yet "
                          "(quantized checkpoints split)");
            goto fail;
        }
        m->quantization = params->quantization;
    }
    if (params->tensor_parallel_size > 1) { /* the ranks read their slices: no weights here */
        if (!dummy && (s = qd_st_open_dir(params->path, &m->st, &err)) != QD_OK) goto fail;
        if ((s = qd_model_backend_create(m, params, &err)) != QD_OK) goto fail;
        if (params->progress) params->progress(1.0f, params->progress_user);
        *out = m;
        return QD_OK;
    }
    if (dummy) {
        s = qd_model_bind_dummy(m, params->seed, params->load_format == QD_LOAD_DUMMY ? QD_DTYPE_BF16 : QD_DTYPE_F32, 1,
                                &err);
    } else {
        if ((s = qd_st_open_dir(params->path, &m->st, &err)) != QD_OK) goto fail;
        s = qd_model_bind_checkpoint(m, &err);
    }
    /* dummy weights were converted layer by layer as they were drawn */
    if (s == QD_OK && !dummy && m->quantization != QD_QUANTIZATION_NONE) s = qd_model_quantize(m, m->quantization, &err);
    if (s != QD_OK) goto fail;
    qd_model_account(m);
    if ((s = qd_model_backend_create(m, params, &err)) != QD_OK) goto fail;
    if (params->progress) params->progress(1.0f, params->progress_user);
    *out = m;
    return QD_OK;
fail:
    if (errbuf && err_size) snprintf(errbuf, err_size, "%s", err.msg);
    qd_model_free(m);
    return s;
}

void qd_model_free(qd_model *m) {
    if (!m) return;
    qd_model_backend_free(m);
    for (int i = 0; i < m->n_owned; i++) qd_aligned_free(m->owned[i]);
    free(m->owned);
    qd_st_close(m->st);
    qd_quant_matcher_free(m->quant_match_owned);
    qd_threadpool_free(m->pool);
    free(m);
}

const char *qd_model_errmsg(const qd_model *m) { return m ? m->err.msg : "no model"; }
int qd_model_vocab_size(const qd_model *m) { return m->cfg.vocab_size; }
int qd_model_n_layers(const qd_model *m) { return m->cfg.n_layers; }
const char *qd_model_type(const qd_model *m) {
    static const char *names[] = {"qwen3_next", "qwen3_5", "qwen3_5_moe"};
    return names[m->cfg.arch];
}
int64_t qd_model_n_params(const qd_model *m) { return m->n_params; }
int64_t qd_model_weight_bytes(const qd_model *m) { return m->weight_bytes; }
int64_t qd_model_active_weight_bytes(const qd_model *m) { return m->active_weight_bytes; }
int64_t qd_model_expert_bytes(const qd_model *m) { return m->expert_bytes; }
int qd_model_moe_layers(const qd_model *m) { return m->n_moe_layers; }
int qd_model_experts(const qd_model *m) { return m->cfg.n_experts; }
int qd_model_experts_per_token(const qd_model *m) { return m->cfg.n_experts > 0 ? m->cfg.n_experts_per_tok : 0; }
int64_t qd_model_state_bytes(const qd_model *m) {
    const qd_config *c = &m->cfg;
    return (int64_t)m->w.n_gdn * 4 *
           ((int64_t)qd_config_conv_dim(c) * (c->gdn_conv_kernel - 1) + (int64_t)c->gdn_hv * c->gdn_dk * c->gdn_dv);
}
int64_t qd_model_kv_bytes_per_token(const qd_model *m) {
    const qd_config *c = &m->cfg;
    return (int64_t)m->w.n_attn * 2 * c->attn_nkv * c->attn_head_dim * m->ops->kv_elem_bytes;
}
int qd_model_eos_ids(const qd_model *m, const int32_t **ids) {
    *ids = m->eos_ids;
    return m->n_eos;
}
qd_generation_defaults qd_model_generation_defaults(const qd_model *m) {
    qd_generation_defaults d = {m->gen.do_sample, m->gen.temperature, m->gen.top_p, m->gen.repetition_penalty,
                                m->gen.top_k};
    return d;
}
const char *qd_model_describe(const qd_model *m) { return m->describe; }
