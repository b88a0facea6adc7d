/* Binds a model's weights to the tensors of a safetensors checkpoint: the whole model,
 * or one tensor-parallel rank's slices of it (src/parallel/shard.h). A full load is the
 * plan of one rank of one, whose every slice is the whole tensor.
 *
 * Matrices are used as stored (views into the mapping) except Qwen3-Next's
 * group-interleaved in_proj_qkvz / in_proj_ba, whose rows are permuted once here
 * into the logical [q | k | v], z, b, a layout (spec 3.2). A rank's row ranges are
 * views too; its column ranges (out_proj, o_proj, down_proj) and its q/k/v runs are
 * copied, touching only the bytes of its slice. Small vectors (norms, gates, conv taps)
 * are converted to fp32, a rank's entries only. Tensors of the vision tower
 * (model.visual.*) are not used and not rejected; the MTP head (mtp.*) is bound by
 * model_mtp.c, for a whole model or a rank's slices. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "base/log.h"
#include "model/model.h"
#include "model/model_quant.h"
#include "model/model_shard.h"

typedef struct binder {
    qd_model *m;
    const qd_config *c;       /* the checkpoint's config: stored shapes are checked against it */
    const qd_shard_plan *p;   /* the slice of every tensor to bind */
    const char *prefix;       /* "model." or "model.language_model." */
    qd_err *err;
} binder;

static void shape_str(const int64_t *shape, int ndim, char *buf, size_t n) {
    size_t off = 0;
    off += (size_t)snprintf(buf + off, n - off, "[");
    for (int i = 0; i < ndim && off < n; i++)
        off += (size_t)snprintf(buf + off, n - off, "%s%lld", i ? ", " : "", (long long)shape[i]);
    if (off < n) snprintf(buf + off, n - off, "]");
}

static const qd_st_tensor *find_tensor(binder *b, char *name, size_t name_size, const char *fmt, va_list ap) {
    char rel[256];
    vsnprintf(rel, sizeof rel, fmt, ap);
    snprintf(name, name_size, "%s%s", rel[0] == '@' ? "" : b->prefix, rel[0] == '@' ? rel + 1 : rel);
    return qd_st_find(b->m->st, name);
}

/* Looks up a tensor and checks its shape. A name starting with '@' is absolute
 * (no prefix), e.g. "@lm_head.weight". */
static qd_status get_tensor(binder *b, const qd_st_tensor **out, int ndim, const int64_t *shape, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
static qd_status get_tensor(binder *b, const qd_st_tensor **out, int ndim, const int64_t *shape, const char *fmt, ...) {
    char name[300];
    va_list ap;
    va_start(ap, fmt);
    const qd_st_tensor *t = find_tensor(b, name, sizeof name, fmt, ap);
    va_end(ap);
    if (!t) return qd_seterr(b->err, QD_ERR_NOT_FOUND, "missing tensor '%s' in checkpoint", name);
    int ok = t->ndim == ndim;
    for (int i = 0; ok && i < ndim; i++) ok = t->shape[i] == shape[i];
    if (!ok) {
        char want[96], got[96];
        shape_str(shape, ndim, want, sizeof want);
        shape_str(t->shape, t->ndim, got, sizeof got);
        return qd_seterr(b->err, QD_ERR_SHAPE, "tensor '%s' in %s: expected shape %s, got %s", name,
                         qd_st_file_name(b->m->st, t->file_index), want, got);
    }
    *out = t;
    return QD_OK;
}

static qd_status check_matrix_dtype(binder *b, const qd_st_tensor *t) {
    if (t->dtype == QD_DTYPE_F32 || t->dtype == QD_DTYPE_BF16 || t->dtype == QD_DTYPE_F16) return QD_OK;
    return qd_seterr(b->err, QD_ERR_UNSUPPORTED,
                     "tensor '%s' has dtype %s; it is read as F32, BF16 or F16 (a quantized table is not "
                     "supported here)", t->name, qd_dtype_name(t->dtype));
}

/* A linear layer's weight [rows][cols], plain or quantized (model_quant.c): fmt names its
 * ".weight" tensor; the module is that name without the suffix. */
static qd_status get_matrix(binder *b, qd_weight *w, int64_t rows, int64_t cols, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
static qd_status get_matrix(binder *b, qd_weight *w, int64_t rows, int64_t cols, const char *fmt, ...) {
    char rel[256], name[300];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(rel, sizeof rel, fmt, ap);
    va_end(ap);
    snprintf(name, sizeof name, "%s%s", rel[0] == '@' ? "" : b->prefix, rel[0] == '@' ? rel + 1 : rel);
    const size_t n = strlen(name), sfx = strlen(".weight");
    if (n > sfx && !strcmp(name + n - sfx, ".weight")) name[n - sfx] = 0;
    const qd_st_tensor *t = qd_quant_find(b->m, name, ".weight");
    if (t && (t->dtype == QD_DTYPE_F32 || t->dtype == QD_DTYPE_BF16 || t->dtype == QD_DTYPE_F16)) {
        int64_t shape[2] = {rows, cols}; /* a plain weight's shape, reported with its file */
        QD_TRY(get_tensor(b, &t, 2, shape, "%s", rel));
    }
    return qd_quant_load_linear(b->m, &b->c->quant, name, rows, cols, w, b->err);
}

/* The embedding table: a lookup, not a linear layer, so always plain. */
static qd_status get_embedding(binder *b, qd_weight *w, int64_t rows, int64_t cols) {
    const qd_st_tensor *t;
    int64_t shape[2] = {rows, cols};
    QD_TRY(get_tensor(b, &t, 2, shape, "embed_tokens.weight"));
    QD_TRY(check_matrix_dtype(b, t));
    *w = (qd_weight){.dtype = t->dtype, .rows = rows, .cols = cols, .data = t->data};
    return QD_OK;
}

/* Reads rows `runs` (of row_len elements each; NULL: all) of a tensor of any of the
 * accepted shapes into an owned fp32 array. */
static qd_status get_vector_rows(binder *b, float **out, int ndim, const int64_t *shape, int64_t row_len,
                                 const qd_shard_range *runs, int n_runs, const char *fmt, ...)
    __attribute__((format(printf, 8, 9)));
static qd_status get_vector_rows(binder *b, float **out, int ndim, const int64_t *shape, int64_t row_len,
                                 const qd_shard_range *runs, int n_runs, const char *fmt, ...) {
    char rel[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(rel, sizeof rel, fmt, ap);
    va_end(ap);
    const qd_st_tensor *t;
    QD_TRY(get_tensor(b, &t, ndim, shape, "%s", rel));
    if (t->dtype != QD_DTYPE_F32 && t->dtype != QD_DTYPE_BF16 && t->dtype != QD_DTYPE_F16)
        return qd_seterr(b->err, QD_ERR_UNSUPPORTED, "tensor '%s' has dtype %s; expected F32, BF16 or F16",
                         t->name, qd_dtype_name(t->dtype));
    const qd_shard_range whole = {0, t->n_elements / row_len};
    if (!runs) runs = &whole, n_runs = 1;
    int64_t rows = 0;
    for (int i = 0; i < n_runs; i++) rows += runs[i].count;
    float *v = qd_model_alloc(b->m, (size_t)(rows * row_len) * sizeof(float));
    if (!v) return qd_seterr(b->err, QD_ERR_OOM, "out of memory converting '%s'", t->name);
    const size_t esz = qd_dtype_size(t->dtype);
    size_t off = 0;
    for (int i = 0; i < n_runs; i++) {
        qd_convert_to_f32(t->dtype, (const unsigned char *)t->data + (size_t)(runs[i].begin * row_len) * esz, v + off,
                          (size_t)(runs[i].count * row_len));
        off += (size_t)(runs[i].count * row_len);
    }
    *out = v;
    return QD_OK;
}

#define get_vector(b, out, ndim, shape, ...) get_vector_rows(b, out, ndim, shape, 1, NULL, 0, __VA_ARGS__)

/* Rows `runs` of a stored [rows][cols] matrix, in order: a view into the mapping when
 * they are contiguous, else a copy. */
static qd_status get_rows(binder *b, qd_weight *w, int64_t rows, int64_t cols, const qd_shard_range *runs, int n_runs,
                          const char *fmt, ...) __attribute__((format(printf, 7, 8)));
static qd_status get_rows(binder *b, qd_weight *w, int64_t rows, int64_t cols, const qd_shard_range *runs, int n_runs,
                          const char *fmt, ...) {
    char rel[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(rel, sizeof rel, fmt, ap);
    va_end(ap);
    qd_weight whole;
    QD_TRY(get_matrix(b, &whole, rows, cols, "%s", rel));
    const qd_status s = qd_shard_rows_gather(b->m, &whole, runs, n_runs, w, b->err);
    if (s != QD_OK) qd_err_prefix(b->err, "tensor '%s%s': ", b->prefix, rel);
    return s;
}

/* Columns `range` of every row of a stored [rows][cols] matrix (a view when whole). */
static qd_status get_cols(binder *b, qd_weight *w, int64_t rows, int64_t cols, qd_shard_range range, const char *fmt,
                          ...) __attribute__((format(printf, 6, 7)));
static qd_status get_cols(binder *b, qd_weight *w, int64_t rows, int64_t cols, qd_shard_range range, const char *fmt,
                          ...) {
    char rel[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(rel, sizeof rel, fmt, ap);
    va_end(ap);
    qd_weight whole;
    QD_TRY(get_matrix(b, &whole, rows, cols, "%s", rel));
    const qd_status s = qd_shard_cols_copy(b->m, &whole, range, w, b->err);
    if (s != QD_OK) qd_err_prefix(b->err, "tensor '%s%s': ", b->prefix, rel);
    return s;
}

/* Copies selected rows of a loaded matrix into a new owned matrix of the same format (a
 * quantized one with its scales by the stored row index, weight.h). */
static qd_status gather_rows(binder *b, const qd_weight *whole, const qd_shard_range *runs, int n_runs, qd_weight *out) {
    return qd_shard_rows_gather(b->m, whole, runs, n_runs, out, b->err);
}

/* Qwen3-Next: in_proj_qkvz is HK groups of [q_j | k_j | v_{j*r..} | z_{j*r..}] and
 * in_proj_ba is HK groups of [b_{j*r..} | a_{j*r..}] (spec 3.2). A rank reads its key-head
 * groups, and of each group the v, z, b, a rows of its own value heads (all r of them
 * unless the key head is replicated across ranks). */
static qd_status bind_gdn_interleaved(binder *b, int L, qd_gdn_weights *g) {
    const qd_config *c = b->c;
    const qd_shard_plan *p = b->p;
    const int hk = c->gdn_hk, dk = c->gdn_dk, dv = c->gdn_dv, r = c->gdn_hv / c->gdn_hk, H = c->hidden_size;
    const int hk_l = p->local.gdn_hk, vh = p->local.gdn_hv / hk_l; /* value heads read per group */
    const int64_t group = 2 * dk + 2 * r * dv;
    /* quantized in the stored (interleaved) row order: its scale blocks cross key-head
     * groups, so rows are gathered with the scales of their stored index */
    qd_weight qkvz_w, ba_w, *qkvz = &qkvz_w, *ba = &ba_w;
    QD_TRY(get_matrix(b, qkvz, hk * group, H, "layers.%d.linear_attn.in_proj_qkvz.weight", L));
    QD_TRY(get_matrix(b, ba, 2 * c->gdn_hv, H, "layers.%d.linear_attn.in_proj_ba.weight", L));

    qd_shard_range runs[3 * 64] = {{0, 0}};
    if (hk_l > 64) return qd_seterr(b->err, QD_ERR_UNSUPPORTED, "linear_num_key_heads %d > 64", hk_l);
    int n = 0;
    /* group j of the rank is checkpoint group J = hk0 + j; its first value head is the
     * group's value head s = hv0 + j * vh - J * r */
#define GROUP_LOOP(expr)                                                   \
    for (int j = 0; j < hk_l; j++) {                                       \
        const int64_t J = p->gdn_hk0 + j, s = p->gdn_hv0 + (int64_t)j * vh - J * r; \
        (void)s;                                                           \
        runs[n++] = (expr);                                                \
    }
    GROUP_LOOP(((qd_shard_range){J * group, dk}));                                       /* q_J */
    GROUP_LOOP(((qd_shard_range){J * group + dk, dk}));                                  /* k_J */
    GROUP_LOOP(((qd_shard_range){J * group + 2 * dk + s * dv, (int64_t)vh * dv}));       /* v */
    QD_TRY(gather_rows(b, qkvz, runs, n, &g->in_qkv));
    n = 0;
    GROUP_LOOP(((qd_shard_range){J * group + 2 * dk + (r + s) * dv, (int64_t)vh * dv})); /* z */
    QD_TRY(gather_rows(b, qkvz, runs, n, &g->in_z));
    n = 0;
    GROUP_LOOP(((qd_shard_range){J * 2 * r + s, vh}));                                   /* b */
    QD_TRY(gather_rows(b, ba, runs, n, &g->in_b));
    n = 0;
    GROUP_LOOP(((qd_shard_range){J * 2 * r + r + s, vh}));                               /* a */
    QD_TRY(gather_rows(b, ba, runs, n, &g->in_a));
#undef GROUP_LOOP
    return QD_OK;
}

static qd_status bind_gdn(binder *b, int L, qd_gdn_weights *g) {
    const qd_config *c = b->c;
    const qd_shard_plan *p = b->p;
    const int H = c->hidden_size, hv = c->gdn_hv, conv_dim = qd_config_conv_dim(c);
    const int value_dim = qd_config_value_dim(c), K = c->gdn_conv_kernel;
    if (c->arch == QD_ARCH_QWEN3_NEXT) {
        QD_TRY(bind_gdn_interleaved(b, L, g));
    } else {
        QD_TRY(get_rows(b, &g->in_qkv, conv_dim, H, p->gdn_qkv_rows, 3, "layers.%d.linear_attn.in_proj_qkv.weight", L));
        QD_TRY(get_rows(b, &g->in_z, value_dim, H, &p->gdn_z_rows, 1, "layers.%d.linear_attn.in_proj_z.weight", L));
        QD_TRY(get_rows(b, &g->in_b, hv, H, &p->gdn_head_rows, 1, "layers.%d.linear_attn.in_proj_b.weight", L));
        QD_TRY(get_rows(b, &g->in_a, hv, H, &p->gdn_head_rows, 1, "layers.%d.linear_attn.in_proj_a.weight", L));
    }
    int64_t conv_shape[3] = {conv_dim, 1, K};
    QD_TRY(get_vector_rows(b, &g->conv_w, 3, conv_shape, K, p->gdn_qkv_rows, 3, "layers.%d.linear_attn.conv1d.weight",
                           L));
    int64_t s_hv[1] = {hv}, s_dv[1] = {c->gdn_dv};
    QD_TRY(get_vector_rows(b, &g->A_log, 1, s_hv, 1, &p->gdn_head_rows, 1, "layers.%d.linear_attn.A_log", L));
    QD_TRY(get_vector_rows(b, &g->dt_bias, 1, s_hv, 1, &p->gdn_head_rows, 1, "layers.%d.linear_attn.dt_bias", L));
    QD_TRY(get_vector(b, &g->norm_w, 1, s_dv, "layers.%d.linear_attn.norm.weight", L));
    QD_TRY(get_cols(b, &g->out, H, value_dim, p->gdn_z_rows, "layers.%d.linear_attn.out_proj.weight", L));
    return QD_OK;
}

static qd_status bind_attn(binder *b, int L, qd_attn_weights *a) {
    const qd_config *c = b->c;
    const qd_shard_plan *p = b->p;
    const int H = c->hidden_size, hd = c->attn_head_dim;
    const int64_t q_rows = (int64_t)c->attn_nq * hd * (c->attn_output_gate ? 2 : 1), kvd = (int64_t)c->attn_nkv * hd;
    QD_TRY(get_rows(b, &a->q, q_rows, H, &p->attn_q_rows, 1, "layers.%d.self_attn.q_proj.weight", L));
    QD_TRY(get_rows(b, &a->k, kvd, H, &p->attn_kv_rows, 1, "layers.%d.self_attn.k_proj.weight", L));
    QD_TRY(get_rows(b, &a->v, kvd, H, &p->attn_kv_rows, 1, "layers.%d.self_attn.v_proj.weight", L));
    QD_TRY(get_cols(b, &a->o, H, (int64_t)c->attn_nq * hd, p->attn_o_cols, "layers.%d.self_attn.o_proj.weight", L));
    int64_t s_hd[1] = {hd};
    QD_TRY(get_vector(b, &a->q_norm, 1, s_hd, "layers.%d.self_attn.q_norm.weight", L));
    QD_TRY(get_vector(b, &a->k_norm, 1, s_hd, "layers.%d.self_attn.k_norm.weight", L));
    return QD_OK;
}

/* A SwiGLU MLP of width I, rows `rows` of its gate and up (columns of down). */
static qd_status bind_mlp(binder *b, qd_mlp_weights *w, int I, qd_shard_range rows, const char *base) {
    const int H = b->c->hidden_size;
    QD_TRY(get_rows(b, &w->gate, I, H, &rows, 1, "%s.gate_proj.weight", base));
    QD_TRY(get_rows(b, &w->up, I, H, &rows, 1, "%s.up_proj.weight", base));
    QD_TRY(get_cols(b, &w->down, H, I, rows, "%s.down_proj.weight", base));
    return QD_OK;
}

/* Qwen3.5's fused experts (gate_up_proj [E][2I][H], gate rows first; down_proj [E][H][I]),
 * plain or NVFP4 (model_quant_fused.c), as the plan's experts and rows of each: the same
 * canonical weights as the per-expert layout, so slicing and the backends treat both alike. */
static qd_status bind_fused_experts(binder *b, int L, qd_moe_weights *w) {
    const qd_shard_plan *p = b->p;
    const int64_t E = b->c->n_experts, I = b->c->moe_intermediate_size, H = b->c->hidden_size;
    char module[256], gu_name[300], dn_name[300];
    snprintf(module, sizeof module, "%slayers.%d.mlp.experts", b->prefix, L);
    snprintf(gu_name, sizeof gu_name, "%s.gate_up_proj", module);
    snprintf(dn_name, sizeof dn_name, "%s.down_proj", module);
    qd_fused_experts gu, dn;
    QD_TRY(qd_quant_load_fused(b->m, &b->c->quant, module, gu_name, E, 2, I, H, &gu, b->err));
    QD_TRY(qd_quant_load_fused(b->m, &b->c->quant, module, dn_name, E, 1, H, I, &dn, b->err));
    for (int e = p->expert0; e < p->expert0 + p->n_local_experts; e++) {
        const qd_weight gate = qd_fused_expert(&gu, e, 0), up = qd_fused_expert(&gu, e, 1),
                        down = qd_fused_expert(&dn, e, 0);
        qd_mlp_weights *x = &w->experts[e];
        qd_status s = gather_rows(b, &gate, &p->expert_rows, 1, &x->gate);
        if (s == QD_OK) s = gather_rows(b, &up, &p->expert_rows, 1, &x->up);
        if (s != QD_OK) return qd_err_prefix(b->err, "tensor '%s', expert %d", gu_name, e);
        /* a column cut inside an NVFP4 16-column scale block is refused here, by name */
        if (qd_shard_cols_copy(b->m, &down, p->expert_rows, &x->down, b->err) != QD_OK)
            return qd_err_prefix(b->err, "tensor '%s', expert %d", dn_name, e);
    }
    return QD_OK;
}

/* Experts outside the plan's partition stay zero-sized (expert parallel): the forward
 * never reads them. */
static qd_status bind_moe(binder *b, int L, qd_moe_weights *w) {
    const qd_config *c = b->c;
    const qd_shard_plan *p = b->p;
    const int H = c->hidden_size, E = c->n_experts, I = c->moe_intermediate_size;
    QD_TRY(get_matrix(b, &w->router, E, H, "layers.%d.mlp.gate.weight", L));
    w->experts = qd_model_alloc(b->m, sizeof(qd_mlp_weights) * (size_t)E);
    if (!w->experts) return qd_seterr(b->err, QD_ERR_OOM, "out of memory for %d experts", E);
    memset(w->experts, 0, sizeof(qd_mlp_weights) * (size_t)E);
    char name[256];
    snprintf(name, sizeof name, "%slayers.%d.mlp.experts.gate_up_proj", b->prefix, L);
    if (qd_st_find(b->m->st, name)) {
        QD_TRY(bind_fused_experts(b, L, w));
    } else {
        for (int e = p->expert0; e < p->expert0 + p->n_local_experts; e++) {
            char base[96];
            snprintf(base, sizeof base, "layers.%d.mlp.experts.%d", L, e);
            QD_TRY(bind_mlp(b, &w->experts[e], I, p->expert_rows, base));
        }
    }
    w->has_shared = c->shared_expert_intermediate_size > 0;
    if (w->has_shared) {
        char base[96];
        snprintf(base, sizeof base, "layers.%d.mlp.shared_expert", L);
        QD_TRY(bind_mlp(b, &w->shared, c->shared_expert_intermediate_size, p->shared_rows, base));
        QD_TRY(get_matrix(b, &w->shared_gate, 1, H, "layers.%d.mlp.shared_expert_gate.weight", L));
    }
    return QD_OK;
}

/* Layer L's norms, mixer and FFN, named "<prefix>layers.L.*". */
static qd_status bind_layer(binder *b, int L, qd_layer *ly) {
    const qd_config *c = b->c;
    int64_t s_h[1] = {c->hidden_size};
    QD_TRY(get_vector(b, &ly->input_norm, 1, s_h, "layers.%d.input_layernorm.weight", L));
    QD_TRY(get_vector(b, &ly->post_norm, 1, s_h, "layers.%d.post_attention_layernorm.weight", L));
    if (ly->kind == QD_LAYER_GDN) QD_TRY(bind_gdn(b, L, &ly->gdn));
    else QD_TRY(bind_attn(b, L, &ly->attn));
    if (ly->ffn_kind == QD_FFN_MOE) {
        QD_TRY(bind_moe(b, L, &ly->moe));
    } else {
        char base[64];
        snprintf(base, sizeof base, "layers.%d.mlp", L);
        QD_TRY(bind_mlp(b, &ly->mlp, c->intermediate_size, b->p->mlp_rows, base));
    }
    return QD_OK;
}

qd_status qd_model_bind_checkpoint_plan(qd_model *m, const qd_config *c, const qd_shard_plan *p, qd_err *err) {
    binder b = {m, c, p, "model.", err};
    if (qd_st_find(m->st, "model.language_model.embed_tokens.weight")) b.prefix = "model.language_model.";
    const int H = c->hidden_size;
    int64_t s_h[1] = {H};
    m->w.expert0 = p->expert0;
    m->w.n_local_experts = p->n_local_experts;

    QD_TRY(get_embedding(&b, &m->w.embed, c->vocab_size, H));
    QD_TRY(get_vector(&b, &m->w.final_norm, 1, s_h, "norm.weight"));
    if (c->tie_word_embeddings) {
        m->w.lm_head = m->w.embed;
    } else {
        QD_TRY(get_matrix(&b, &m->w.lm_head, c->vocab_size, H, "@lm_head.weight"));
    }
    for (int L = 0; L < c->n_layers; L++) QD_TRY(bind_layer(&b, L, &m->w.layers[L]));
    return QD_OK;
}

qd_status qd_model_bind_layer(qd_model *m, const qd_config *c, const qd_shard_plan *p, const char *prefix, int L,
                              qd_layer *ly, qd_err *err) {
    binder b = {m, c, p, prefix, err};
    return bind_layer(&b, L, ly);
}

qd_status qd_model_bind_matrix(qd_model *m, const char *name, int64_t rows, int64_t cols, qd_weight *w, qd_err *err) {
    binder b = {.m = m, .c = &m->cfg, .prefix = "", .err = err};
    return get_matrix(&b, w, rows, cols, "%s", name);
}

qd_status qd_model_bind_norm(qd_model *m, const char *name, int64_t n, float **out, qd_err *err) {
    binder b = {.m = m, .c = &m->cfg, .prefix = "", .err = err};
    return get_vector(&b, out, 1, &n, "%s", name);
}

qd_status qd_model_bind_checkpoint(qd_model *m, qd_err *err) {
    /* the exclusion list compiled once, before any tensor is read: every module below,
     * the MTP head's too, is checked against it */
    const qd_quant_matcher *mt = NULL;
    QD_TRY(qd_model_quant_matcher(m, &m->cfg.quant, &mt, err));
    qd_shard_plan whole;
    QD_TRY(qd_shard_plan_make(&m->cfg, 1, 0, false, &whole, err));
    QD_TRY(qd_model_bind_checkpoint_plan(m, &m->cfg, &whole, err));
    return qd_model_bind_mtp(m, &m->cfg, &whole, err); /* model_mtp.c */
}
