/* Device weights of a model: planned in one pass (sizes), checked against the
 * GPU's free memory with a clear message, then allocated as one block and filled
 * in a second pass. BF16 checkpoint tensors are copied as stored; F32/F16 ones are
 * rounded to bf16 on the host; dummy weights are drawn on the device with the same
 * values the CPU backend draws. */
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_model.h"
#include "base/log.h"

typedef struct planner {
    qd_cuda_carve cv;    /* cv.base NULL while measuring */
    uint16_t *staging;   /* pinned bf16 staging for converted tensors */
    size_t staging_elems;
    qd_err *err;
} planner;

static void *take(planner *p, size_t bytes) { return qd_cuda_take(&p->cv, bytes); }

static qd_status cuda_err(qd_err *err, qd_status s, const char *what) {
    return qd_seterr(err, s, "%s: %s", what, qd_cuda_last_error());
}

/* Writes w (rows x cols, any stored dtype) as bf16 at dst. */
static qd_status put_matrix(planner *p, uint16_t *dst, const qd_weight *w) {
    const int64_t n = w->rows * w->cols;
    qd_status s;
    if (!w->data) {
        if ((s = qd_cuda_fill_dummy_bf16(dst, n, w->dummy_scale, w->dummy_seed, NULL)))
            return cuda_err(p->err, s, "generating dummy weights");
        return QD_OK;
    }
    if (w->dtype == QD_DTYPE_BF16) {
        if ((s = qd_cuda_memcpy_h2d(dst, w->data, (size_t)n * 2))) return cuda_err(p->err, s, "uploading weights");
        return QD_OK;
    }
    const size_t esz = qd_dtype_size(w->dtype);
    float tmp[1024];
    for (int64_t i0 = 0; i0 < n; i0 += (int64_t)p->staging_elems) {
        const int64_t m = n - i0 < (int64_t)p->staging_elems ? n - i0 : (int64_t)p->staging_elems;
        for (int64_t j = 0; j < m; j += 1024) {
            const int64_t k = m - j < 1024 ? m - j : 1024;
            qd_convert_to_f32(w->dtype, (const unsigned char *)w->data + (size_t)(i0 + j) * esz, tmp, (size_t)k);
            for (int64_t t = 0; t < k; t++) p->staging[j + t] = qd_f32_to_bf16(tmp[t]);
        }
        if ((s = qd_cuda_memcpy_h2d(dst + i0, p->staging, (size_t)m * 2))) return cuda_err(p->err, s, "uploading weights");
    }
    return QD_OK;
}

/* A matrix of `rows` x cols made of the given weights stacked by rows. */
static qd_status matrix(planner *p, uint16_t **out, const qd_weight *const *parts, int n_parts) {
    int64_t rows = 0;
    for (int i = 0; i < n_parts; i++) rows += parts[i]->rows;
    uint16_t *d = take(p, (size_t)(rows * parts[0]->cols) * 2);
    *out = d;
    if (!p->cv.base) return QD_OK;
    for (int i = 0; i < n_parts; i++) {
        QD_TRY(put_matrix(p, d, parts[i]));
        d += parts[i]->rows * parts[i]->cols;
    }
    return QD_OK;
}

static qd_status one(planner *p, uint16_t **out, const qd_weight *w) { return matrix(p, out, &w, 1); }

static qd_status vec(planner *p, float **out, const float *src, int64_t n) {
    float *d = take(p, (size_t)n * sizeof(float));
    *out = d;
    if (!p->cv.base) return QD_OK;
    qd_status s = qd_cuda_memcpy_h2d(d, src, (size_t)n * sizeof(float));
    return s ? cuda_err(p->err, s, "uploading a vector") : QD_OK;
}

static qd_status mlp(planner *p, const qd_mlp_weights *w, uint16_t **gate_up, uint16_t **down) {
    const qd_weight *gu[2] = {&w->gate, &w->up};
    QD_TRY(matrix(p, gate_up, gu, 2));
    return one(p, down, &w->down);
}

/* Both passes: with p->cv.base NULL only the offsets advance. */
static qd_status place(const qd_config *c, const qd_weights *m, qd_cuda_model *cm, planner *p) {
    const int H = c->hidden_size, hv = c->gdn_hv, hd = c->attn_head_dim;
    QD_TRY(one(p, &cm->embed, &m->embed));
    if (c->tie_word_embeddings) cm->lm_head = cm->embed;
    else QD_TRY(one(p, &cm->lm_head, &m->lm_head));
    QD_TRY(vec(p, &cm->final_norm, m->final_norm, H));
    for (int L = 0; L < c->n_layers; L++) {
        const qd_layer *ly = &m->layers[L];
        qd_cuda_layer *d = &cm->layers[L];
        QD_TRY(vec(p, &d->input_norm, ly->input_norm, H));
        QD_TRY(vec(p, &d->post_norm, ly->post_norm, H));
        if (ly->kind == QD_LAYER_GDN) {
            const qd_gdn_weights *g = &ly->gdn;
            const qd_weight *in[4] = {&g->in_qkv, &g->in_z, &g->in_b, &g->in_a};
            QD_TRY(matrix(p, &d->gdn_in, in, 4));
            QD_TRY(vec(p, &d->conv_w, g->conv_w, (int64_t)qd_config_conv_dim(c) * c->gdn_conv_kernel));
            QD_TRY(vec(p, &d->A_log, g->A_log, hv));
            QD_TRY(vec(p, &d->dt_bias, g->dt_bias, hv));
            QD_TRY(vec(p, &d->gdn_norm, g->norm_w, c->gdn_dv));
            QD_TRY(one(p, &d->gdn_out, &g->out));
        } else {
            const qd_attn_weights *a = &ly->attn;
            QD_TRY(one(p, &d->q, &a->q));
            QD_TRY(one(p, &d->k, &a->k));
            QD_TRY(one(p, &d->v, &a->v));
            QD_TRY(one(p, &d->o, &a->o));
            QD_TRY(vec(p, &d->q_norm, a->q_norm, hd));
            QD_TRY(vec(p, &d->k_norm, a->k_norm, hd));
        }
        if (ly->ffn_kind == QD_FFN_DENSE) {
            d->I = c->intermediate_size;
            QD_TRY(mlp(p, &ly->mlp, &d->gate_up, &d->down));
        } else {
            const qd_moe_weights *w = &ly->moe;
            const qd_weight *rg[2] = {&w->router, &w->shared_gate};
            d->has_shared_gate = w->has_shared;
            QD_TRY(matrix(p, &d->router, rg, w->has_shared ? 2 : 1));
            const int E = m->n_local_experts, e0 = m->expert0, Ie = c->moe_intermediate_size;
            /* experts stacked [E][2 Ie][H] and [E][H][Ie]: all, or an expert-parallel rank's */
            d->experts_gate_up = take(p, (size_t)E * 2 * Ie * H * 2);
            d->experts_down = take(p, (size_t)E * H * Ie * 2);
            if (p->cv.base)
                for (int e = 0; e < E; e++) {
                    const qd_mlp_weights *x = &w->experts[e0 + e];
                    QD_TRY(put_matrix(p, d->experts_gate_up + (size_t)e * 2 * Ie * H, &x->gate));
                    QD_TRY(put_matrix(p, d->experts_gate_up + (size_t)e * 2 * Ie * H + (size_t)Ie * H, &x->up));
                    QD_TRY(put_matrix(p, d->experts_down + (size_t)e * H * Ie, &x->down));
                }
            if (w->has_shared) {
                d->I = c->shared_expert_intermediate_size;
                QD_TRY(mlp(p, &w->shared, &d->gate_up, &d->down));
            }
        }
    }
    return QD_OK;
}

static qd_status upload(const qd_backend_model_desc *d, qd_cuda_model *cm, qd_err *err) {
    const qd_weights *w = d->w;
    cm->cfg = d->cfg;
    cm->w = w;
    cm->expert0 = w->expert0;
    cm->n_experts_local = w->n_local_experts;
    cm->layers = calloc((size_t)d->cfg->n_layers, sizeof(qd_cuda_layer));
    if (!cm->layers) return qd_seterr(err, QD_ERR_OOM, "out of memory");
    int sms = 0;
    qd_status s = qd_cuda_device_info(cm->device_name, sizeof cm->device_name, &sms);
    if (s) return cuda_err(err, s, "querying the CUDA device");
    planner p = {.err = err};
    QD_TRY(place(d->cfg, w, cm, &p));
    size_t free_b = 0, total_b = 0;
    if ((s = qd_cuda_mem_info(&free_b, &total_b))) return cuda_err(err, s, "querying device memory");
    if (p.cv.off > free_b)
        return qd_seterr(err, QD_ERR_OOM,
                         "the model's weights need %.2f GiB of device memory as bf16, but %s has %.2f GiB free of "
                         "%.2f GiB", (double)p.cv.off / (1 << 30), cm->device_name, (double)free_b / (1 << 30),
                         (double)total_b / (1 << 30));
    if ((s = qd_cuda_malloc(&cm->arena, p.cv.off))) return cuda_err(err, s, "allocating device memory for the weights");
    cm->bytes = p.cv.off;
    planner q = {.cv = {cm->arena, 0}, .err = err, .staging_elems = 1 << 22};
    if ((s = qd_cuda_malloc_host((void **)&q.staging, q.staging_elems * 2))) return cuda_err(err, s, "pinned staging");
    s = place(d->cfg, w, cm, &q);
    qd_cuda_free_host(q.staging);
    QD_TRY(s);
    if ((s = qd_cuda_sync())) return cuda_err(err, s, "uploading weights");
    QD_LOGI("CUDA: %.2f GiB of weights on %s", (double)cm->bytes / (1 << 30), cm->device_name);
    return QD_OK;
}

qd_status qd_cuda_model_create(const qd_backend_model_desc *d, void **out, qd_err *err) {
    qd_cuda_model *cm = calloc(1, sizeof *cm);
    if (!cm) return qd_seterr(err, QD_ERR_OOM, "out of memory");
    cm->device = d->device;
    qd_status s = upload(d, cm, err);
    if (s != QD_OK) {
        qd_cuda_model_free(cm);
        return s;
    }
    *out = cm;
    return QD_OK;
}

void qd_cuda_model_free(void *bm) {
    qd_cuda_model *cm = bm;
    if (!cm) return;
    qd_cuda_free(cm->arena);
    free(cm->layers);
    free(cm);
}
