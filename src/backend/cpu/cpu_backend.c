/* The CPU backend's model and context (cpu_backend.h): the weights are used as bound;
 * the context's state, KV contents, snapshot slots and scratch are host allocations made
 * at creation. Its operations are plain copies. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu_backend.h"
#include "base/arena.h"
#include "base/membw.h"

static qd_status cpu_model_create(const qd_backend_model_desc *d, void **out, qd_err *err) {
    qd_cpu_model *m = calloc(1, sizeof *m);
    if (!m) return qd_seterr(err, QD_ERR_OOM, "out of memory");
    m->cfg = d->cfg;
    m->w = d->w;
    m->pool = d->pool;
    *out = m;
    return QD_OK;
}

static void cpu_model_free(void *bm) { free(bm); }

static size_t max_sz(size_t a, size_t b) { return a > b ? a : b; }

/* Lays out (or, with base == NULL, measures) the scratch buffers for B tokens. */
static size_t plan_scratch(const qd_config *c, size_t B, unsigned char *base, qd_cpu_scratch *s) {
    const size_t H = (size_t)c->hidden_size, conv_dim = (size_t)qd_config_conv_dim(c);
    const size_t value_dim = (size_t)qd_config_value_dim(c), hv = (size_t)c->gdn_hv;
    const size_t qd = (size_t)c->attn_nq * (size_t)c->attn_head_dim, kvd = (size_t)c->attn_nkv * (size_t)c->attn_head_dim;
    const size_t q_rows = qd * (c->attn_output_gate ? 2 : 1);
    const size_t k_top = (size_t)(c->n_experts > 0 ? c->n_experts_per_tok : 0);
    size_t ffn = max_sz((size_t)c->intermediate_size, (size_t)c->shared_expert_intermediate_size);
    ffn = max_sz(ffn, k_top * (size_t)c->moe_intermediate_size);
    size_t off = 0;
#define CARVE(field, type, count)                                        \
    do {                                                                 \
        size_t bytes_ = ((count) * sizeof(type) + 63) / 64 * 64;         \
        if (base) s->field = (type *)(base + off);                       \
        off += bytes_;                                                   \
    } while (0)
    CARVE(h, float, B * H);
    CARVE(x, float, B * H);
    CARVE(y, float, B * H);
    CARVE(proj, float, B * max_sz(conv_dim, q_rows));
    CARVE(proj2, float, B * max_sz(value_dim, kvd));
    CARVE(proj3, float, B * max_sz(hv, kvd));
    CARVE(proj4, float, B * hv);
    CARVE(conv_out, float, B * conv_dim);
    CARVE(g, float, B * hv + B);
    CARVE(beta, float, B * hv);
    CARVE(o, float, B * max_sz(value_dim, qd));
    CARVE(u, float, B * max_sz(value_dim, qd));
    CARVE(gate, float, B * qd);
    CARVE(ffn_a, float, B * ffn);
    CARVE(ffn_b, float, B * ffn);
    CARVE(ffn_c, float, B * ffn);
    CARVE(moe_x, float, B * k_top * H);
    CARVE(moe_y, float, B * k_top * H);
    CARVE(router, float, B * (size_t)c->n_experts + 2 * (size_t)c->n_experts + 2);
    CARVE(moe_prob, float, (size_t)c->n_experts + 1);
    CARVE(moe_sel, int32_t, B * k_top);
    CARVE(moe_w, float, B * k_top);
    CARVE(moe_order, int32_t, B * k_top);
    CARVE(pos, int32_t, B);
    CARVE(mtp_cat, float, B * 2 * H);
#undef CARVE
    return off;
}

static void cpu_ctx_free(void *bc) {
    qd_cpu_ctx *c = bc;
    if (!c) return;
    qd_aligned_free(c->row_logits);
    qd_aligned_free(c->conv);
    qd_aligned_free(c->ssm);
    qd_aligned_free(c->kv_k);
    qd_aligned_free(c->kv_v);
    qd_aligned_free(c->snap_pool);
    qd_aligned_free(c->verify_conv);
    qd_aligned_free(c->verify_ssm);
    qd_aligned_free(c->scratch_block);
    free(c->gdn_spans);
    free(c);
}

static qd_status cpu_ctx_create(void *bm, const qd_backend_ctx_desc *d, void **out, qd_err *err) {
    const qd_cpu_model *m = bm;
    const qd_config *cfg = m->cfg;
    const qd_context_params *p = &d->params;
    qd_cpu_ctx *c = calloc(1, sizeof *c);
    if (!c) return qd_seterr(err, QD_ERR_OOM, "out of memory for a context");
    c->m = m;
    c->d = *d;
    c->err = d->err;
    c->conv_floats = qd_state_conv_floats(cfg, m->w->n_gdn);
    c->ssm_floats = qd_state_ssm_floats(cfg, m->w->n_gdn);
    const size_t seqs = (size_t)p->max_seqs, kv_bytes = (size_t)d->n_kv_blocks * d->kv_block_elems * sizeof(float);
    const size_t snap_bytes = (size_t)p->n_snap_slots * (c->conv_floats + c->ssm_floats) * sizeof(float);
    c->scratch_block = qd_aligned_alloc(plan_scratch(cfg, (size_t)p->max_batch, NULL, &c->s));
    c->row_logits = qd_aligned_alloc((size_t)cfg->vocab_size * sizeof(float));
    c->gdn_spans = calloc(seqs, sizeof(qd_gdn_span));
    c->conv = qd_aligned_calloc(seqs * c->conv_floats * sizeof(float) + 64);
    c->ssm = qd_aligned_calloc(seqs * c->ssm_floats * sizeof(float) + 64);
    if (kv_bytes) {
        c->kv_k = qd_aligned_alloc(kv_bytes);
        c->kv_v = qd_aligned_alloc(kv_bytes);
    }
    if (p->speculative_tokens > 0) {
        c->verify_states = p->speculative_tokens + 1;
        c->verify_conv = qd_aligned_alloc(seqs * (size_t)c->verify_states * c->conv_floats * sizeof(float) + 64);
        c->verify_ssm = qd_aligned_alloc(seqs * (size_t)c->verify_states * c->ssm_floats * sizeof(float) + 64);
    }
    /* untouched pages of the slots cost address space only, until a slot is written */
    if (snap_bytes) c->snap_pool = qd_aligned_alloc(snap_bytes);
    if (!c->scratch_block || !c->row_logits || !c->gdn_spans || !c->conv || !c->ssm ||
        (kv_bytes && (!c->kv_k || !c->kv_v)) || (snap_bytes && !c->snap_pool) ||
        (c->verify_states && (!c->verify_conv || !c->verify_ssm))) {
        const size_t state_bytes = (c->conv_floats + c->ssm_floats) * sizeof(float);
        cpu_ctx_free(c);
        return qd_seterr(err, QD_ERR_OOM,
                         "out of memory creating a context (max_seqs %d, max_ctx %d, max_batch %d, KV cache %zu bytes "
                         "in %d blocks of %d tokens, n_snap_slots %d of %zu bytes each)",
                         p->max_seqs, p->max_ctx, p->max_batch, 2 * kv_bytes, d->n_kv_blocks, p->kv_block_size,
                         p->n_snap_slots, state_bytes);
    }
    plan_scratch(cfg, (size_t)p->max_batch, c->scratch_block, &c->s);
    *out = c;
    return QD_OK;
}

static qd_status cpu_forward(void *bc, const qd_step *st, const qd_logit_out *out) {
    qd_cpu_ctx *c = bc;
    return qd_cpu_forward_ranks(&c, 1, st, out);
}

/* ------------------------------------------------------------ state copies */

static qd_status cpu_verify_keep(void *bc, int seq, int index) {
    qd_cpu_ctx *c = bc;
    if (index < 0 || index >= c->verify_states)
        return qd_seterr(c->err, QD_ERR_INVALID_ARG, "verify state %d outside [0, %d)", index, c->verify_states);
    memcpy(qd_cpu_seq_conv(c, seq), qd_cpu_verify_conv(c, seq, index), c->conv_floats * sizeof(float));
    memcpy(qd_cpu_seq_ssm(c, seq), qd_cpu_verify_ssm(c, seq, index), c->ssm_floats * sizeof(float));
    return QD_OK;
}

static size_t cpu_state_bytes(void *bc) {
    const qd_cpu_ctx *c = bc;
    return (c->conv_floats + c->ssm_floats) * sizeof(float);
}

/* The payload [conv | ssm] of a sequence slot to or from a flat buffer. */
static void seq_to(const qd_cpu_ctx *c, int seq, float *dst) {
    memcpy(dst, qd_cpu_seq_conv(c, seq), c->conv_floats * sizeof(float));
    memcpy(dst + c->conv_floats, qd_cpu_seq_ssm(c, seq), c->ssm_floats * sizeof(float));
}

static void seq_from(qd_cpu_ctx *c, int seq, const float *src) {
    if (src) {
        memcpy(qd_cpu_seq_conv(c, seq), src, c->conv_floats * sizeof(float));
        memcpy(qd_cpu_seq_ssm(c, seq), src + c->conv_floats, c->ssm_floats * sizeof(float));
    } else {
        memset(qd_cpu_seq_conv(c, seq), 0, c->conv_floats * sizeof(float));
        memset(qd_cpu_seq_ssm(c, seq), 0, c->ssm_floats * sizeof(float));
    }
}

static qd_status cpu_state_read(void *bc, int seq, void *dst) {
    seq_to(bc, seq, dst);
    return QD_OK;
}

static qd_status cpu_state_write(void *bc, int seq, const void *src) {
    seq_from(bc, seq, src);
    return QD_OK;
}

static qd_status cpu_state_copy(void *bc, int src, int dst) {
    qd_cpu_ctx *c = bc;
    memcpy(qd_cpu_seq_conv(c, dst), qd_cpu_seq_conv(c, src), c->conv_floats * sizeof(float));
    memcpy(qd_cpu_seq_ssm(c, dst), qd_cpu_seq_ssm(c, src), c->ssm_floats * sizeof(float));
    return QD_OK;
}

static qd_status cpu_kv_copy_block(void *bc, int32_t dst, int32_t src) {
    qd_cpu_ctx *c = bc;
    const size_t n = c->d.kv_block_elems;
    memcpy(c->kv_k + (size_t)dst * n, c->kv_k + (size_t)src * n, n * sizeof(float));
    memcpy(c->kv_v + (size_t)dst * n, c->kv_v + (size_t)src * n, n * sizeof(float));
    return QD_OK;
}

static float *slot_at(const qd_cpu_ctx *c, int slot) {
    return c->snap_pool + (size_t)slot * (c->conv_floats + c->ssm_floats);
}

static qd_status cpu_snap_save(void *bc, int seq, int slot) {
    seq_to(bc, seq, slot_at(bc, slot));
    return QD_OK;
}

static qd_status cpu_snap_load(void *bc, int seq, int slot) {
    seq_from(bc, seq, slot_at(bc, slot));
    return QD_OK;
}

static qd_status cpu_snap_read(void *bc, int slot, void *dst) {
    memcpy(dst, slot_at(bc, slot), cpu_state_bytes(bc));
    return QD_OK;
}

static qd_status cpu_copy_gbps(size_t bytes, int n_threads, double *gbps, qd_err *err) {
    *gbps = qd_measure_memcpy_gbps(bytes, n_threads);
    if (*gbps <= 0) return qd_seterr(err, QD_ERR_OOM, "no memory for a %zu-byte bandwidth probe", bytes);
    return QD_OK;
}

static qd_status cpu_device_info(qd_device_info *out, qd_err *err) {
    memset(out, 0, sizeof *out);
    snprintf(out->name, sizeof out->name, "host memory");
    out->commits_lazily = 1;
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f) return qd_seterr(err, QD_ERR_IO, "cannot read /proc/meminfo");
    char line[256];
    unsigned long long kb;
    while (fgets(line, sizeof line, f)) {
        if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1) out->free_bytes = (size_t)kb * 1024;
        else if (sscanf(line, "MemTotal: %llu kB", &kb) == 1) out->total_bytes = (size_t)kb * 1024;
    }
    fclose(f);
    return QD_OK;
}

const qd_backend_ops qd_cpu_ops = {
    .name = "CPU",
    .quantized_weights = true, /* matmul_quant.c */
    .counts_experts = true,
    .kv_elem_bytes = 4,
    .copy_gbps = cpu_copy_gbps,
    .device_info = cpu_device_info,
    .model_create = cpu_model_create,
    .model_free = cpu_model_free,
    .ctx_create = cpu_ctx_create,
    .ctx_free = cpu_ctx_free,
    .forward = cpu_forward,
    .mtp_forward = qd_cpu_mtp_forward,
    .verify_keep = cpu_verify_keep,
    .state_bytes = cpu_state_bytes,
    .state_read = cpu_state_read,
    .state_write = cpu_state_write,
    .state_copy = cpu_state_copy,
    .kv_copy_block = cpu_kv_copy_block,
    .snap_save = cpu_snap_save,
    .snap_load = cpu_snap_load,
    .snap_read = cpu_snap_read,
};

const qd_backend_ops *qd_backend_cpu(qd_err *err) {
    (void)err;
    return &qd_cpu_ops;
}
