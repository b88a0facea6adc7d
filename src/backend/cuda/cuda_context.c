/* Device side of a context: the state pool, the paged KV cache, the scratch of one
 * forward and the step metadata buffers, planned together so that a context that
 * does not fit fails at creation with the sizes named, never in the middle of a
 * forward. Also the state copies behind snapshots, forks and copy-on-write. */
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_attn.h"
#include "backend/cuda/cuda_model.h"
#include "backend/cuda/cuda_moe.h"
#include "base/log.h"

static size_t max_sz(size_t a, size_t b) { return a > b ? a : b; }

/* Logit rows computed per lm_head pass: bounds the [rows][V] fp32 scratch. */
#define QD_CUDA_LOGIT_CHUNK 256


int qd_cuda_logit_chunk(const qd_cuda_ctx *g) {
    return g->d.params.max_batch < QD_CUDA_LOGIT_CHUNK ? g->d.params.max_batch : QD_CUDA_LOGIT_CHUNK;
}

/* Whether some layer's quantized experts (the MTP head's included) may be dequantized into
 * moe_dq on a prefill step of up to B rows: those the fused prefill kernels do not take at
 * every such step (qd_cuda_moe_dequant_needed). */
static int experts_dequantize(const qd_cuda_ctx *g, int B, int inv) {
    const qd_config *c = g->cfg;
    const qd_cuda_model *cm = g->cm;
    for (int L = 0; L <= c->n_layers; L++) {
        const qd_cuda_layer *d = L < c->n_layers ? &cm->layers[L] : cm->mtp ? &cm->mtp->layer : NULL;
        if (!d || d->q_experts_gate_up.n_mats == 0) continue;
        const qd_cuda_moe_args a = {.n = B, .H = c->hidden_size, .I = c->moe_intermediate_size,
                                    .E = cm->n_experts_local, .k = c->n_experts_per_tok, .invariant = inv,
                                    .q_gate_up = &d->q_experts_gate_up, .q_down = &d->q_experts_down};
        if (qd_cuda_moe_dequant_needed(&a)) return 1;
    }
    return 0;
}

/* Lays out every device buffer of the context (base NULL: measure only). */
static void plan_device(qd_cuda_ctx *g, qd_cuda_carve *cv) {
    const qd_config *c = g->cfg;
    const int n_gdn = g->n_gdn, n_attn = g->cm->w->n_attn;
    const size_t B = (size_t)g->d.params.max_batch, S = (size_t)g->d.params.max_seqs;
    const size_t H = (size_t)c->hidden_size, hv = (size_t)c->gdn_hv;
    const size_t conv_dim = (size_t)qd_config_conv_dim(c), value_dim = (size_t)qd_config_value_dim(c);
    const size_t key_dim = (size_t)c->gdn_hk * c->gdn_dk;
    const size_t qdim = (size_t)c->attn_nq * c->attn_head_dim, kvd = (size_t)c->attn_nkv * c->attn_head_dim;
    const size_t q_rows = qdim * (c->attn_output_gate ? 2 : 1);
    const size_t gdn_in = conv_dim + value_dim + 2 * hv;
    size_t I = (size_t)c->intermediate_size;
    if (c->n_experts > 0) I = max_sz(I, (size_t)c->shared_expert_intermediate_size);
    const size_t E = (size_t)c->n_experts, k = (size_t)(c->n_experts > 0 ? c->n_experts_per_tok : 0);
    const size_t LC = (size_t)qd_cuda_logit_chunk(g);

    g->conv_slot = conv_dim * (size_t)(c->gdn_conv_kernel - 1);
    g->ssm_slot = hv * (size_t)c->gdn_dk * c->gdn_dv;
    g->verify_states = g->d.params.speculative_tokens > 0 ? g->d.params.speculative_tokens + 1 : 0;
    g->pool_slots = (int)S * (1 + g->verify_states);
    const size_t P = (size_t)g->pool_slots;
    g->conv = qd_cuda_take(cv, (size_t)n_gdn * P * g->conv_slot * 4);
    g->ssm = qd_cuda_take(cv, (size_t)n_gdn * P * g->ssm_slot * 4);
    g->snap = qd_cuda_take(cv, (size_t)g->d.params.n_snap_slots * qd_cuda_state_bytes(g));
    const size_t kv_bytes = (size_t)g->d.n_kv_blocks * g->d.kv_block_elems * 2;
    g->kv_k = qd_cuda_take(cv, kv_bytes);
    g->kv_v = qd_cuda_take(cv, kv_bytes);
    g->h = qd_cuda_take(cv, B * H * 4);
    g->y = qd_cuda_take(cv, B * H * 4);
    g->ys = qd_cuda_take(cv, B * H * 4);
    g->x = qd_cuda_take(cv, B * H * 2);
    g->xf = qd_cuda_take(cv, E > 0 ? B * H * 4 : 0);
    g->proj = qd_cuda_take(cv, B * max_sz(gdn_in, q_rows) * 4);
    g->proj2 = qd_cuda_take(cv, B * kvd * 4);
    g->proj3 = qd_cuda_take(cv, B * kvd * 4);
    g->q = qd_cuda_take(cv, B * max_sz(key_dim, qdim) * 2);
    g->k = qd_cuda_take(cv, B * key_dim * 2);
    g->v = qd_cuda_take(cv, B * value_dim * 2);
    g->g = qd_cuda_take(cv, B * hv * 4);
    g->beta = qd_cuda_take(cv, B * hv * 4);
    g->o = qd_cuda_take(cv, B * max_sz(value_dim, qdim) * 2);
    g->u = qd_cuda_take(cv, B * max_sz(value_dim, qdim) * 2);
    g->ffn = qd_cuda_take(cv, B * 2 * I * 4);
    g->act = qd_cuda_take(cv, B * I * 2);
    g->router = qd_cuda_take(cv, B * (size_t)QD_CUDA_ROUTER_LD(E) * 4);
    g->sel = qd_cuda_take(cv, B * (k ? k : 1) * 4);
    g->route_cnt = qd_cuda_take(cv, B * 4);
    g->selw = qd_cuda_take(cv, B * (k ? k : 1) * 4);
    g->logits = qd_cuda_take(cv, LC * (size_t)c->vocab_size * 4);
    g->ids = qd_cuda_take(cv, B * 4);
    g->lp = qd_cuda_take(cv, B * 4);
    if (n_attn > 0)
        g->attn_work = qd_cuda_take(cv, qd_cuda_attn_work_bytes((int)B, c->attn_nq, c->attn_head_dim,
                                                                g->d.params.max_ctx, g->d.params.batch_invariant));
    if (E > 0)
        g->moe_work = qd_cuda_take(cv, qd_cuda_moe_work_bytes((int)B, (int)H, c->moe_intermediate_size, (int)E, (int)k));
    g->meta_dev = qd_cuda_take(cv, g->meta_bytes);
    g->mtp_cat = g->d.params.mtp ? qd_cuda_take(cv, B * 2 * H * 2) : NULL;
    g->experts_touched = E > 0 ? qd_cuda_take(cv, (size_t)c->n_layers * E) : NULL;
    /* quantized weights: bf16 copies for the products the quantized GEMV and MoE decode
     * kernels do not cover (prefill sizes; every product in batch-invariant mode) */
    const int inv = g->d.params.batch_invariant;
    const qd_cuda_model *cm = g->cm;
    int64_t dq_elems;
    size_t fp8_bytes;
    qd_cuda_model_prefill_extents(cm, (int64_t)B, &dq_elems, &fp8_bytes);
    g->wdq = NULL;
    g->fp8_act = NULL;
    g->fp8_act_bytes = 0;
    if (inv && cm->max_dequant_elems > 0) {
        g->wdq = qd_cuda_take(cv, (size_t)cm->max_dequant_elems * 2);
    } else if (B > QD_CUDA_QGEMV_MAX_N) {
        if (dq_elems > 0) g->wdq = qd_cuda_take(cv, (size_t)dq_elems * 2);
        if (fp8_bytes > 0) {
            g->fp8_act_bytes = fp8_bytes;
            g->fp8_act = qd_cuda_take(cv, g->fp8_act_bytes);
        }
    }
    g->moe_dq = NULL;
    if (cm->quantized_experts && (B > (size_t)qd_cuda_moe_graph_max_tokens() || B * k > 1024 || inv) &&
        experts_dequantize(g, (int)B, inv))
        g->moe_dq = qd_cuda_take(cv, qd_cuda_moe_dequant_bytes((int)H, c->moe_intermediate_size, cm->n_experts_local));
}

/* The step metadata layout, identical on host and device (see qd_cuda_step). */
static size_t plan_meta(const qd_cuda_ctx *g, unsigned char *base, qd_cuda_step *st) {
    const size_t B = (size_t)g->d.params.max_batch, S = (size_t)g->d.params.max_seqs;
    size_t off = 0;
#define META(field, count)                                       \
    do {                                                         \
        if (base) st->field = (int32_t *)(base + off);           \
        off += ((count) * 4 + 15) / 16 * 16;                     \
    } while (0)
    META(tokens, B);
    META(row_span, B);
    META(row_pos, B);
    META(spans, 4 * S);
    META(attn_spans, 4 * S);
    META(dec_slots, S);
    META(logit_rows, B);
    META(pre_slots, S);
    META(cu_seqlens, S + 1);
    META(ver, 4 * S);
    META(ver_rows, QD_CUDA_MAX_VERIFY * S);
    META(ver_in, QD_CUDA_MAX_VERIFY * S);
    META(ver_out, QD_CUDA_MAX_VERIFY * S);
    META(caller_row, B);
    META(all_rows, B);
    META(tables, S * (size_t)(g->d.max_blocks_per_seq > 0 ? g->d.max_blocks_per_seq : 1)); /* last: copied in part */
#undef META
    return off;
}

static qd_status create(qd_cuda_ctx *g, qd_err *err);

static qd_status fail(qd_err *err, qd_status s, const char *what) {
    return qd_seterr(err, s, "%s: %s", what, qd_cuda_last_error());
}

qd_status qd_cuda_ctx_create(void *bm, const qd_backend_ctx_desc *d, void **out, qd_err *err) {
    const qd_cuda_model *cm = bm;
    qd_cuda_ctx *g = calloc(1, sizeof *g);
    if (!g) return qd_seterr(err, QD_ERR_OOM, "out of memory");
    g->cm = cm;
    g->cfg = cm->cfg;
    g->d = *d;
    g->err = d->err;
    g->n_gdn = cm->w->n_gdn;
    g->reduce = d->reduce;
    g->reduce_user = d->reduce_user;
    g->never_logits = d->never_logits;
    qd_status s = create(g, err);
    if (s != QD_OK) {
        qd_cuda_ctx_free(g);
        return s;
    }
    *out = g;
    return QD_OK;
}

static qd_status create(qd_cuda_ctx *g, qd_err *err) {
    qd_status s;
    g->meta_bytes = plan_meta(g, NULL, NULL);
    qd_cuda_carve cv = {0};
    plan_device(g, &cv);
    size_t free_b = 0, total_b = 0;
    if ((s = qd_cuda_mem_info(&free_b, &total_b))) return fail(err, s, "querying device memory");
    const qd_cuda_ctx probe = *g;
    const size_t state_b = (size_t)g->n_gdn * probe.pool_slots * (probe.conv_slot + probe.ssm_slot) * 4;
    const size_t kv_b = 2 * (size_t)g->d.n_kv_blocks * g->d.kv_block_elems * 2;
    const size_t snap_b = (size_t)g->d.params.n_snap_slots * qd_cuda_state_bytes(g);
    if (cv.off + (64u << 20) > free_b)
        return qd_seterr(err, QD_ERR_OOM,
                         "the context needs %.2f GiB of device memory (GDN state %.2f GiB for %d sequences and "
                         "%d verify states each, KV cache "
                         "%.2f GiB in %d blocks of %d tokens, prefix-cache snapshots %.2f GiB in %d slots, scratch "
                         "%.2f GiB for %d tokens per step) but %.2f GiB are free: lower max_seqs, n_kv_blocks, "
                         "max_ctx, max_batch or the prefix cache's device memory",
                         (double)cv.off / (1 << 30), (double)state_b / (1 << 30), g->d.params.max_seqs,
                         probe.verify_states, (double)kv_b / (1 << 30), g->d.n_kv_blocks, g->d.params.kv_block_size, (double)snap_b / (1 << 30),
                         g->d.params.n_snap_slots, (double)(cv.off - state_b - kv_b - snap_b) / (1 << 30),
                         g->d.params.max_batch, (double)free_b / (1 << 30));
    void *block = NULL;
    if ((s = qd_cuda_malloc(&block, cv.off))) return fail(err, s, "allocating the context's device memory");
    qd_cuda_carve real = {block, 0};
    plan_device(g, &real);
    g->bytes = cv.off;
    /* the block starts with the state: remember it for freeing */
    if ((s = qd_cuda_malloc_host(&g->meta_host, g->meta_bytes))) {
        qd_cuda_free(block);
        g->conv = NULL;
        return fail(err, s, "pinned metadata");
    }
    plan_meta(g, g->meta_host, &g->host);
    plan_meta(g, g->meta_dev, &g->dev);
    if ((s = qd_cuda_malloc_host((void **)&g->ids_host, (size_t)g->d.params.max_batch * 4)) ||
        (s = qd_cuda_malloc_host((void **)&g->lp_host, (size_t)g->d.params.max_batch * 4)) ||
        (s = qd_cuda_stream_create(&g->stream)) || (s = qd_cuda_blas_create(&g->blas, g->stream)))
        return fail(err, s, "pinned output buffers, the CUDA stream and cuBLAS");
    g->invariant = g->d.params.batch_invariant != 0;
    g->n_graph_kinds = g->verify_states > 1 ? g->verify_states + 1 : 2;
    g->graphs = calloc((size_t)g->n_graph_kinds * ((size_t)g->d.params.max_seqs + 1), sizeof(void *));
    g->ver_T = calloc((size_t)g->d.params.max_seqs, sizeof(int32_t));
    if (!g->graphs || !g->ver_T) return qd_seterr(err, QD_ERR_OOM, "out of memory");
    if (g->verify_states > QD_CUDA_MAX_VERIFY)
        return qd_seterr(err, QD_ERR_UNSUPPORTED, "the CUDA backend verifies at most %d speculative tokens, not %d",
                         QD_CUDA_MAX_VERIFY - 1, g->d.params.speculative_tokens);
    /* the chunked GDN prefill's scratch for any step, so that a forward never allocates */
    const qd_config *c = g->cfg;
    if (g->n_gdn > 0 && qd_cuda_gdn_chunked_supported(c) &&
        (s = qd_cuda_gdn_plan_reserve(&g->plan, c->gdn_hk, c->gdn_hv, c->gdn_dk, c->gdn_dv, g->d.params.max_batch,
                                      g->d.params.max_seqs)))
        return fail(err, s, "reserving the GDN prefill scratch");
    /* fresh sequences start from zero state; the router counters start (and stay) zero */
    if ((s = qd_cuda_memset_async(g->conv, 0, state_b, g->stream)) ||
        (s = qd_cuda_memset_async(g->route_cnt, 0, (size_t)g->d.params.max_batch * 4, g->stream)) ||
        (s = qd_cuda_stream_sync(g->stream)))
        return fail(err, s, "clearing the state pool");
    QD_LOGI("CUDA context: %.2f GiB (state %.2f GiB, KV %.2f GiB, GDN prefill scratch %.2f GiB, %d snapshot slots "
            "%.2f GiB)",
            (double)cv.off / (1 << 30), (double)state_b / (1 << 30), (double)kv_b / (1 << 30),
            (double)g->plan.bytes / (1 << 30), g->d.params.n_snap_slots, (double)snap_b / (1 << 30));
    return QD_OK;
}

void qd_cuda_ctx_free(void *bc) {
    qd_cuda_ctx *g = bc;
    if (!g) return;
    if (g->graphs)
        for (size_t i = 0; i < (size_t)g->n_graph_kinds * ((size_t)g->d.params.max_seqs + 1); i++)
            qd_cuda_graph_destroy(g->graphs[i]);
    free(g->graphs);
    free(g->ver_T);
    qd_cuda_gdn_plan_destroy(&g->plan);
    qd_cuda_blas_destroy(g->blas);
    qd_cuda_stream_destroy(g->stream);
    qd_cuda_free(g->conv); /* the first buffer of the context's one device block */
    qd_cuda_free_host(g->meta_host);
    qd_cuda_free_host(g->ids_host);
    qd_cuda_free_host(g->lp_host);
    free(g);
}

/* --------------------------------------------------------- state copies */

/* The payload layout is sequence-major ([n_gdn][...] per sequence); the pool is
 * layer-major, so one sequence's state is n_gdn pieces at a layer pitch: 2-D copies. */
size_t qd_cuda_state_bytes(void *bc) {
    const qd_cuda_ctx *g = bc;
    return (size_t)g->n_gdn * (g->conv_slot + g->ssm_slot) * sizeof(float);
}

qd_status qd_cuda_state_read(void *bc, int seq, void *dst) {
    qd_cuda_ctx *g = bc;
    float *conv = dst, *ssm = conv + (size_t)g->n_gdn * g->conv_slot;
    const size_t S = (size_t)g->pool_slots, n = (size_t)g->n_gdn; /* the pool's layer pitch in slots */
    qd_status s;
    if (n == 0) return QD_OK;
    if ((s = qd_cuda_memcpy2d(conv, g->conv_slot * 4, g->conv + (size_t)seq * g->conv_slot, S * g->conv_slot * 4,
                              g->conv_slot * 4, n, g->stream)) ||
        (s = qd_cuda_memcpy2d(ssm, g->ssm_slot * 4, g->ssm + (size_t)seq * g->ssm_slot, S * g->ssm_slot * 4,
                              g->ssm_slot * 4, n, g->stream)) ||
        (s = qd_cuda_stream_sync(g->stream)))
        return qd_seterr(g->err, s, "reading sequence %d's state from the device: %s", seq, qd_cuda_last_error());
    return QD_OK;
}

qd_status qd_cuda_state_write(void *bc, int seq, const void *src) {
    qd_cuda_ctx *g = bc;
    const float *conv = src, *ssm = conv ? conv + (size_t)g->n_gdn * g->conv_slot : NULL;
    const size_t S = (size_t)g->pool_slots, n = (size_t)g->n_gdn; /* the pool's layer pitch in slots */
    qd_status s = QD_OK;
    if (n == 0) return QD_OK;
    for (size_t l = 0; l < n && !s; l++)
        if (!conv || !ssm) {
            s = qd_cuda_memset_async(g->conv + (l * S + (size_t)seq) * g->conv_slot, 0, g->conv_slot * 4, g->stream);
            if (!s)
                s = qd_cuda_memset_async(g->ssm + (l * S + (size_t)seq) * g->ssm_slot, 0, g->ssm_slot * 4, g->stream);
        }
    if (!s && conv && ssm)
        s = qd_cuda_memcpy2d(g->conv + (size_t)seq * g->conv_slot, S * g->conv_slot * 4, conv, g->conv_slot * 4,
                             g->conv_slot * 4, n, g->stream);
    if (!s && conv && ssm)
        s = qd_cuda_memcpy2d(g->ssm + (size_t)seq * g->ssm_slot, S * g->ssm_slot * 4, ssm, g->ssm_slot * 4,
                             g->ssm_slot * 4, n, g->stream);
    if (!s) s = qd_cuda_stream_sync(g->stream);
    if (s) return qd_seterr(g->err, s, "writing sequence %d's state to the device: %s", seq, qd_cuda_last_error());
    return QD_OK;
}

qd_status qd_cuda_state_copy(void *bc, int src, int dst) {
    qd_cuda_ctx *g = bc;
    const size_t S = (size_t)g->pool_slots, n = (size_t)g->n_gdn; /* the pool's layer pitch in slots */
    qd_status s = QD_OK;
    if (n == 0) return QD_OK;
    if ((s = qd_cuda_memcpy2d(g->conv + (size_t)dst * g->conv_slot, S * g->conv_slot * 4,
                              g->conv + (size_t)src * g->conv_slot, S * g->conv_slot * 4, g->conv_slot * 4, n,
                              g->stream)) ||
        (s = qd_cuda_memcpy2d(g->ssm + (size_t)dst * g->ssm_slot, S * g->ssm_slot * 4, g->ssm + (size_t)src * g->ssm_slot,
                              S * g->ssm_slot * 4, g->ssm_slot * 4, n, g->stream)) ||
        (s = qd_cuda_stream_sync(g->stream)))
        return qd_seterr(g->err, s, "copying sequence %d's state to %d: %s", src, dst, qd_cuda_last_error());
    return QD_OK;
}

qd_status qd_cuda_kv_copy_block(void *bc, int32_t dst, int32_t src) {
    qd_cuda_ctx *g = bc;
    const size_t bf = g->d.kv_block_elems;
    qd_status s;
    if ((s = qd_cuda_memcpy_d2d(g->kv_k + (size_t)dst * bf, g->kv_k + (size_t)src * bf, bf * 2, g->stream)) ||
        (s = qd_cuda_memcpy_d2d(g->kv_v + (size_t)dst * bf, g->kv_v + (size_t)src * bf, bf * 2, g->stream)))
        return qd_seterr(g->err, s, "copying KV block %d: %s", src, qd_cuda_last_error());
    return QD_OK;
}

/* The state after token `index` of seq's last verify span becomes its state: copied from
 * the verify slots (the last token's is the sequence's own slot already). Queued, like
 * the forwards around it. */
qd_status qd_cuda_verify_keep(void *bc, int seq, int index) {
    qd_cuda_ctx *g = bc;
    const int T = seq >= 0 && seq < g->d.params.max_seqs ? g->ver_T[seq] : 0;
    if (T == 0) return qd_seterr(g->err, QD_ERR_INVALID_ARG, "sequence %d has no verify span to keep from", seq);
    if (index < 0 || index >= T)
        return qd_seterr(g->err, QD_ERR_INVALID_ARG, "verify state %d outside [0, %d)", index, T);
    const size_t P = (size_t)g->pool_slots, n = (size_t)g->n_gdn;
    if (index == T - 1 || n == 0) return QD_OK;
    const size_t from = (size_t)g->d.params.max_seqs + (size_t)seq * g->verify_states + (size_t)index;
    qd_status s;
    if ((s = qd_cuda_memcpy2d(g->conv + (size_t)seq * g->conv_slot, P * g->conv_slot * 4, g->conv + from * g->conv_slot,
                              P * g->conv_slot * 4, g->conv_slot * 4, n, g->stream)) ||
        (s = qd_cuda_memcpy2d(g->ssm + (size_t)seq * g->ssm_slot, P * g->ssm_slot * 4, g->ssm + from * g->ssm_slot,
                              P * g->ssm_slot * 4, g->ssm_slot * 4, n, g->stream)))
        return qd_seterr(g->err, s, "keeping verify state %d of sequence %d: %s", index, seq, qd_cuda_last_error());
    return QD_OK;
}

/* ------------------------------------------------------ snapshot slots */

/* A slot is contiguous (all layers' conv, then all layers' ssm, the host snapshot
 * layout); the pool is layer-major, so each half is n_gdn pieces at the pool's layer
 * pitch: one 2-D copy each way. No synchronisation: the stream orders these copies
 * with the forwards around them. */
static qd_status snap_copy(qd_cuda_ctx *g, int seq, int slot, int to_slot) {
    const size_t S = (size_t)g->pool_slots, n = (size_t)g->n_gdn; /* the pool's layer pitch in slots */
    if (n == 0) return QD_OK;
    float *sc = g->snap + (size_t)slot * n * (g->conv_slot + g->ssm_slot), *ss = sc + n * g->conv_slot;
    float *pc = g->conv + (size_t)seq * g->conv_slot, *ps = g->ssm + (size_t)seq * g->ssm_slot;
    const size_t cw = g->conv_slot * 4, sw = g->ssm_slot * 4;
    qd_status s;
    if (to_slot)
        s = qd_cuda_memcpy2d(sc, cw, pc, S * cw, cw, n, g->stream);
    else
        s = qd_cuda_memcpy2d(pc, S * cw, sc, cw, cw, n, g->stream);
    if (!s) s = to_slot ? qd_cuda_memcpy2d(ss, sw, ps, S * sw, sw, n, g->stream)
                        : qd_cuda_memcpy2d(ps, S * sw, ss, sw, sw, n, g->stream);
    if (s)
        return qd_seterr(g->err, s, "%s snapshot slot %d %s sequence %d: %s", to_slot ? "filling" : "restoring",
                         slot, to_slot ? "from" : "into", seq, qd_cuda_last_error());
    return QD_OK;
}

qd_status qd_cuda_snap_save(void *bc, int seq, int slot) { return snap_copy(bc, seq, slot, 1); }

qd_status qd_cuda_snap_load(void *bc, int seq, int slot) { return snap_copy(bc, seq, slot, 0); }

qd_status qd_cuda_snap_read(void *bc, int slot, void *dst) {
    qd_cuda_ctx *g = bc;
    const size_t bytes = qd_cuda_state_bytes(g);
    qd_status s;
    if (bytes == 0) return QD_OK;
    if ((s = qd_cuda_memcpy_d2h_async(dst, (unsigned char *)g->snap + (size_t)slot * bytes, bytes, g->stream)) ||
        (s = qd_cuda_stream_sync(g->stream)))
        return qd_seterr(g->err, s, "copying snapshot slot %d to the host: %s", slot, qd_cuda_last_error());
    return QD_OK;
}
