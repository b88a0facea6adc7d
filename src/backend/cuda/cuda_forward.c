/* The forward pass on the GPU: the same ragged batch as the CPU backend, one
 * path for every batch shape. Rows are reordered internally so that prefill spans
 * (more than one token) come first and decode spans (one token) last: the chunked
 * GDN kernel then sees its tokens packed, the decode kernel its sequences packed,
 * and a sequence's result never depends on which kernel its neighbours took.
 * A step made only of decode spans, each wanting its last logits, is replayed from
 * a CUDA graph captured the first time that batch size is seen. */
#include <string.h>

#include "backend/cuda/cuda_attn.h"
#include "backend/cuda/cuda_linear.h"
#include "backend/cuda/cuda_model.h"
#include "backend/cuda/cuda_moe.h"

#define TRYC(call)                                  \
    do {                                            \
        qd_status s_ = (call);                      \
        if (s_ != QD_OK) return s_;                 \
    } while (0)

/* Builds the step's metadata on the host (internal row order) and returns the
 * number of bytes of the metadata block to copy. */
static size_t build_step(qd_cuda_ctx *g, const qd_step *st) {
    const qd_span *spans = st->spans;
    const qd_span_rt *rt = st->rt;
    const int n_spans = st->n_spans;
    qd_cuda_step *h = &g->host;
    const int mb = g->d.max_blocks_per_seq > 0 ? g->d.max_blocks_per_seq : 1;
    int order[2][n_spans > 0 ? n_spans : 1], n_pre = 0, n_dec = 0;
    for (int i = 0; i < n_spans; i++) {
        if (rt[i].T > 1) order[0][n_pre++] = i;
        else order[1][n_dec++] = i;
    }
    int row = 0, j = 0;
    int first_row[n_spans > 0 ? n_spans : 1];
    h->cu_seqlens[0] = 0;
    for (int pass = 0; pass < 2; pass++) {
        for (int q = 0; q < (pass ? n_dec : n_pre); q++, j++) {
            const int i = order[pass][q];
            const int T = rt[i].T, seq = rt[i].seq;
            first_row[i] = row;
            int32_t *sp = h->spans + 4 * j, *ap = h->attn_spans + 4 * j;
            sp[0] = ap[0] = row;
            sp[1] = ap[1] = T;
            sp[2] = ap[2] = rt[i].pos0;
            sp[3] = seq;
            ap[3] = j;
            for (int t = 0; t < T; t++) {
                h->tokens[row + t] = spans[i].tokens[t];
                h->row_span[row + t] = j;
                h->row_pos[row + t] = rt[i].pos0 + t;
            }
            if (pass == 0) {
                h->pre_slots[q] = seq;
                h->cu_seqlens[q + 1] = row + T;
            } else {
                h->dec_slots[q] = seq;
            }
            const int nb = g->d.n_kv_blocks > 0 ? st->seqs[seq].n_blocks : 0;
            if (nb > 0) memcpy(h->tables + (size_t)j * mb, st->seqs[seq].blocks, (size_t)nb * 4);
            row += T;
        }
    }
    int lr = 0;
    for (int i = 0; i < n_spans; i++) {
        if (spans[i].logits == QD_LOGITS_NONE) continue;
        const int first = spans[i].logits == QD_LOGITS_ALL ? 0 : rt[i].T - 1;
        for (int t = first; t < rt[i].T; t++) h->logit_rows[lr++] = first_row[i] + t;
    }
    h->n_rows = row;
    h->n_spans = n_spans;
    h->n_pre_spans = n_pre;
    h->n_pre_rows = h->cu_seqlens[n_pre];
    h->n_dec = n_dec;
    h->n_logit = lr;
    return (size_t)((unsigned char *)(h->tables + (size_t)n_spans * mb) - (unsigned char *)g->meta_host);
}

/* ------------------------------------------------------------------ layers */

/* Every projection of the forward: the kernel table's pick (qd_cuda_linear), or in
 * batch-invariant mode the one path that sums each row in the same order for every n. */
static qd_status lin(qd_cuda_ctx *g, const qd_cuda_lin_in *in, int64_t cols, int n, const qd_cuda_lin_out *out,
                     int n_out, int accumulate, uint16_t *scratch) {
    return qd_cuda_linear_path(g->invariant ? QD_LIN_PATH_INVARIANT : QD_LIN_PATH_TABLE, g->blas, in, cols, n, out,
                               n_out, accumulate, scratch, g->stream);
}

/* The residual h is complete at every layer boundary: each block's output
 * projection adds into it (qd_cuda_linear with accumulate, the MoE combine), and
 * each norm is folded into the projection that reads it (the kernel table of
 * qd_cuda_linear fuses it at decode sizes and materialises it into g->x above). */
static qd_cuda_lin_in norm_in(const qd_cuda_ctx *g, const float *w, const int32_t *rows) {
    qd_cuda_lin_in in = {0};
    in.kind = QD_LIN_RMSNORM;
    in.h = g->h;
    in.rows = rows;
    in.w = w;
    in.eps = g->cfg->rms_norm_eps;
    return in;
}

/* Where a block's output projection writes. Unsplit: straight into the residual h
 * (accumulating). On a tensor/expert-parallel rank the output is a partial sum, so it
 * goes to y (overwritten), is all-reduced over the ranks and only then joins h
 * (block_reduce); every rank's h stays the same. */
static float *block_out(const qd_cuda_ctx *g) { return g->reduce ? g->y : g->h; }

static qd_status block_reduce(qd_cuda_ctx *g) {
    if (!g->reduce) return QD_OK;
    const int n = g->host.n_rows, H = g->cfg->hidden_size;
    TRYC(g->reduce(g->reduce_user, g->y, n, g->stream));
    return qd_cuda_add_f32(g->h, H, g->y, H, H, n, g->stream);
}

static qd_status gdn_layer(qd_cuda_ctx *g, const qd_cuda_layer *d, int gi) {
    const qd_config *c = g->cfg;
    const qd_cuda_step *h = &g->host, *dv = &g->dev;
    const int n = h->n_rows, H = c->hidden_size;
    const int hk = c->gdn_hk, hv = c->gdn_hv, dk = c->gdn_dk, dvh = c->gdn_dv, K = c->gdn_conv_kernel;
    const int conv_dim = qd_config_conv_dim(c), value_dim = qd_config_value_dim(c), key_dim = hk * dk;
    const int W = conv_dim + value_dim + 2 * hv;
    const size_t S = (size_t)g->d.params.max_seqs;
    float *conv_state = g->conv + (size_t)gi * S * g->conv_slot;
    float *ssm = g->ssm + (size_t)gi * S * g->ssm_slot;

    const qd_cuda_lin_in in = norm_in(g, d->input_norm, NULL);
    const qd_cuda_lin_out proj = {d->gdn_in, W, g->proj, W};
    TRYC(lin(g, &in, H, n, &proj, 1, 0, g->x));
    /* proj rows: in_qkv (conv inputs) | in_z | in_b | in_a */
    const qd_cuda_gdn_in_args ia = {
        .n = n, .hk = hk, .hv = hv, .dk = dk, .dv = dvh, .K = K, .n_spans = h->n_spans,
        .d_x = g->proj, .x_stride = W,
        .d_a = g->proj + conv_dim + value_dim + hv, .d_b = g->proj + conv_dim + value_dim, .ab_stride = W,
        .d_w = d->conv_w, .d_A_log = d->A_log, .d_dt_bias = d->dt_bias, .d_state = conv_state,
        .d_spans = dv->spans, .d_row_span = dv->row_span,
        .d_q = g->q, .d_k = g->k, .d_v = g->v, .d_g = g->g, .d_beta = g->beta,
        .decode_only = h->n_pre_spans == 0,
    };
    TRYC(qd_cuda_gdn_inputs(&ia, g->stream));
    if (h->n_pre_spans > 0 && qd_cuda_gdn_chunked_supported(c)) {
        const qd_cuda_gdn_chunked_args a = {
            .d_q = g->q, .d_k = g->k, .d_v = g->v, .q_stride = key_dim, .k_stride = key_dim, .v_stride = value_dim,
            .d_g = g->g, .d_beta = g->beta, .d_state0 = ssm, .d_state1 = ssm, .d_slot = dv->pre_slots, .d_o = g->o,
        };
        TRYC(qd_cuda_gdn_chunked(&g->plan, &a, g->stream));
    } else {
        for (int q = 0; q < h->n_pre_spans; q++)
            for (int r = h->cu_seqlens[q]; r < h->cu_seqlens[q + 1]; r++) {
                const qd_cuda_gdn_decode_args a = {
                    .hk = hk, .hv = hv, .dk = dk, .dv = dvh, .n_seq = 1,
                    .d_q = g->q + (size_t)r * key_dim, .d_k = g->k + (size_t)r * key_dim,
                    .d_v = g->v + (size_t)r * value_dim, .d_g = g->g + (size_t)r * hv, .d_beta = g->beta + (size_t)r * hv,
                    .d_state = ssm, .d_slot = dv->pre_slots + q, .d_o = g->o + (size_t)r * value_dim,
                };
                TRYC(qd_cuda_gdn_decode(&a, g->stream));
            }
    }
    if (h->n_dec > 0) {
        const size_t r0 = (size_t)h->n_pre_rows;
        const qd_cuda_gdn_decode_args a = {
            .hk = hk, .hv = hv, .dk = dk, .dv = dvh, .n_seq = h->n_dec,
            .d_q = g->q + r0 * key_dim, .d_k = g->k + r0 * key_dim, .d_v = g->v + r0 * value_dim,
            .d_g = g->g + r0 * hv, .d_beta = g->beta + r0 * hv, .d_state = ssm, .d_slot = dv->dec_slots,
            .d_o = g->o + r0 * value_dim,
        };
        TRYC(qd_cuda_gdn_decode(&a, g->stream));
    }
    /* out_proj of the gated norm of o (gate z = in_z), into the residual */
    qd_cuda_lin_in gin = {0};
    gin.kind = QD_LIN_GATED;
    gin.o = g->o;
    gin.z = g->proj + conv_dim;
    gin.ldz = W;
    gin.dv = dvh;
    gin.w = d->gdn_norm;
    gin.eps = c->rms_norm_eps;
    const qd_cuda_lin_out out = {d->gdn_out, H, block_out(g), H};
    return lin(g, &gin, value_dim, n, &out, 1, !g->reduce, g->u);
}

static qd_status attn_layer(qd_cuda_ctx *g, const qd_cuda_layer *d, int ai, int max_span_rows) {
    const qd_config *c = g->cfg;
    const qd_cuda_step *h = &g->host, *dv = &g->dev;
    const int n = h->n_rows, H = c->hidden_size;
    const int nq = c->attn_nq, nkv = c->attn_nkv, hd = c->attn_head_dim;
    const int qdim = nq * hd, kvd = nkv * hd, q_rows = qdim * (c->attn_output_gate ? 2 : 1);
    /* q (with its gate), k and v of one normed x: one launch at decode sizes */
    const qd_cuda_lin_in in = norm_in(g, d->input_norm, NULL);
    const qd_cuda_lin_out qkv[3] = {{d->q, q_rows, g->proj, q_rows}, {d->k, kvd, g->proj2, kvd},
                                    {d->v, kvd, g->proj3, kvd}};
    TRYC(lin(g, &in, H, n, qkv, 3, 0, g->x));
    const size_t layer_off = (size_t)ai * g->d.params.kv_block_size * kvd;
    qd_cuda_attn_args a = {
        .n_rows = n, .nq = nq, .nkv = nkv, .hd = hd, .rope_dim = c->rope_dim, .rope_theta = (float)c->rope_theta,
        .eps = c->rms_norm_eps, .gated = c->attn_output_gate,
        .d_qg = g->proj, .d_k = g->proj2, .d_v = g->proj3, .d_q_norm = d->q_norm, .d_k_norm = d->k_norm,
        .d_row_slot = dv->row_span, .d_row_pos = dv->row_pos, .d_spans = dv->attn_spans, .n_spans = h->n_spans,
        .max_span_rows = max_span_rows, .max_ctx = g->d.params.max_ctx,
        .d_block_tables = dv->tables, .max_blocks_per_seq = g->d.max_blocks_per_seq,
        .block_size = g->d.params.kv_block_size, .block_stride = (int64_t)g->d.kv_block_elems,
        .d_kcache = g->kv_k + layer_off, .d_vcache = g->kv_v + layer_off,
        .d_q = g->q, .d_out = g->o, .d_work = g->attn_work, .invariant = g->invariant,
    };
    TRYC(qd_cuda_attn_prep(&a, g->stream));
    TRYC(qd_cuda_attn(&a, g->stream));
    qd_cuda_lin_in oin = {0};
    oin.kind = QD_LIN_BF16;
    oin.x = g->o;
    oin.ldx = qdim;
    const qd_cuda_lin_out out = {d->o, H, block_out(g), H};
    return lin(g, &oin, qdim, n, &out, 1, !g->reduce, NULL);
}

/* SwiGLU MLP of width I on the input `in` (of H columns): y (+)= down(silu(gate) * up). */
static qd_status mlp(qd_cuda_ctx *g, const qd_cuda_lin_in *in, const uint16_t *gate_up, const uint16_t *down, int I,
                     float *y, int accumulate) {
    const int n = g->host.n_rows, H = g->cfg->hidden_size;
    const qd_cuda_lin_out gu = {gate_up, 2 * (int64_t)I, g->ffn, 2 * (int64_t)I};
    TRYC(lin(g, in, H, n, &gu, 1, 0, g->x));
    qd_cuda_lin_in act = {0};
    act.kind = QD_LIN_SILU;
    act.gu = g->ffn;
    const qd_cuda_lin_out dn = {down, H, y, H};
    return lin(g, &act, I, n, &dn, 1, accumulate, g->act);
}

static qd_status moe_layer(qd_cuda_ctx *g, const qd_cuda_layer *d) {
    const qd_config *c = g->cfg;
    const int n = g->host.n_rows, H = c->hidden_size, E = c->n_experts, k = c->n_experts_per_tok;
    const int Ie = c->moe_intermediate_size;
    /* kernel table: batches of up to QD_MOE_BLOCK_MAX_TOKENS of an unsplit model run the
     * whole block in three launches (measured faster there, cuda_moe.h); it adds into h
     * itself, so a split model takes the general path */
    if (!g->reduce && !g->invariant && qd_cuda_moe_block_preferred(n, H, Ie, d->has_shared_gate ? d->I : 0, E, k)) {
        const qd_cuda_moe_block_args a = {
            .n = n, .H = H, .I = Ie, .E = E, .k = k, .renorm = c->norm_topk_prob,
            .d_h = g->h, .d_norm = d->post_norm, .eps = c->rms_norm_eps, .d_router = d->router,
            .d_gate_up = d->experts_gate_up, .d_down = d->experts_down,
            .d_sh_gate_up = d->has_shared_gate ? d->gate_up : NULL, .d_sh_down = d->down, .I_s = d->I,
            .d_x = g->x, .d_logits = g->router, .d_sel = g->sel, .d_w = g->selw, .d_route_cnt = g->route_cnt,
            .d_sh_act = g->ffn, .d_sh_out = g->ys, .d_work = g->moe_work,
        };
        return qd_cuda_moe_block(&a, g->stream);
    }
    float *dst = block_out(g); /* the shared expert and the experts add into it */
    if (g->reduce) TRYC(qd_cuda_memset_async(dst, 0, (size_t)n * H * 4, g->stream));
    /* router logits and the shared expert's gate logit in one product: [n][E + 1] */
    const int Er = E + (d->has_shared_gate ? 1 : 0);
    /* fp32 input: a bf16-rounded x would flip near-tied expert choices (discrete changes) */
    TRYC(qd_cuda_add_rmsnorm(g->h, NULL, d->post_norm, c->rms_norm_eps, n, H, NULL, g->x, g->xf, g->stream));
    TRYC(qd_cuda_matmul_xf32(d->router, Er, H, g->xf, H, n, g->router, E + 1, g->stream));
    if (d->has_shared_gate) {
        qd_cuda_lin_in x = {0};
        x.kind = QD_LIN_BF16;
        x.x = g->x;
        x.ldx = H;
        TRYC(mlp(g, &x, d->gate_up, d->down, d->I, g->ys, 0));
        TRYC(qd_cuda_sigmoid_scale(dst, g->ys, g->router + E, E + 1, n, H, g->stream));
    }
    TRYC(qd_cuda_moe_route(g->router, E + 1, n, E, k, c->norm_topk_prob, g->sel, g->selw, g->stream));
    const qd_cuda_model *cm = g->cm;
    if (cm->n_experts_local < E) /* expert parallel: this rank's pairs only */
        TRYC(qd_cuda_moe_localize(g->sel, n * k, cm->expert0, cm->n_experts_local, g->stream));
    const qd_cuda_moe_args a = {
        .n = n, .H = H, .I = Ie, .E = cm->n_experts_local, .k = k, .d_x = g->x, .d_sel = g->sel, .d_w = g->selw,
        .d_gate_up = d->experts_gate_up, .d_down = d->experts_down, .d_y = dst, .d_work = g->moe_work,
        .cublas = qd_cuda_blas_handle(g->blas), .invariant = g->invariant,
    };
    return qd_cuda_moe_experts(&a, g->stream);
}

/* Logits of logit rows [r0, r0 + nr) (the final norm of just those rows) into g->logits. */
static qd_status logit_rows(qd_cuda_ctx *g, int r0, int nr) {
    const int V = g->cfg->vocab_size, H = g->cfg->hidden_size;
    const qd_cuda_lin_in in = norm_in(g, g->cm->final_norm, g->dev.logit_rows + r0);
    const qd_cuda_lin_out out = {g->cm->lm_head, V, g->logits, V};
    return lin(g, &in, H, nr, &out, 1, 0, g->x);
}

/* Everything from the embedding to the logits of the first logit chunk, all on the
 * stream with no host synchronisation except inside the MoE prefill path. The argmax
 * is left out (launched after it, see take_rows), so that a captured graph does not
 * depend on which outputs or vocabulary bound a step asks for. */
static qd_status run_layers(qd_cuda_ctx *g, int max_span_rows, int n_logit_first) {
    const qd_config *c = g->cfg;
    const qd_cuda_model *cm = g->cm;
    const int n = g->host.n_rows, H = c->hidden_size;
    TRYC(qd_cuda_embed(cm->embed, g->dev.tokens, n, H, g->h, g->stream));
    for (int L = 0; L < c->n_layers; L++) {
        const qd_layer *ly = &cm->w->layers[L];
        const qd_cuda_layer *d = &cm->layers[L];
        if (ly->kind == QD_LAYER_GDN) TRYC(gdn_layer(g, d, ly->state_index));
        else TRYC(attn_layer(g, d, ly->state_index, max_span_rows));
        TRYC(block_reduce(g));
        if (ly->ffn_kind == QD_FFN_MOE) {
            TRYC(moe_layer(g, d));
        } else {
            const qd_cuda_lin_in in = norm_in(g, d->post_norm, NULL);
            TRYC(mlp(g, &in, d->gate_up, d->down, d->I, block_out(g), !g->reduce));
        }
        TRYC(block_reduce(g));
    }
    if (n_logit_first > 0) TRYC(logit_rows(g, 0, n_logit_first));
    return QD_OK;
}

static qd_status backend_error(qd_cuda_ctx *g, qd_status s) {
    return qd_seterr(g->err, s, "CUDA forward: %s", qd_cuda_last_error());
}

/* Points the chunk plan (reserved at context creation) at this step's prefill spans. */
static qd_status update_plan(qd_cuda_ctx *g) {
    const qd_config *c = g->cfg;
    const qd_cuda_step *h = &g->host;
    if (h->n_pre_spans == 0 || g->n_gdn == 0 || !qd_cuda_gdn_chunked_supported(c)) return QD_OK;
    return qd_cuda_gdn_plan_set(&g->plan, h->cu_seqlens, h->n_pre_spans, g->stream);
}

/* Queues the outputs of logit rows [r0, r0 + nr), whose logits are in g->logits: the
 * argmax (and log-softmax) into the pinned buffers, and the logits rows asked for to
 * the caller, as few copies as there are runs of consecutive wanted rows. */
static qd_status take_rows(qd_cuda_ctx *g, const qd_logit_out *out, int r0, int nr) {
    const int V = g->cfg->vocab_size;
    qd_status s;
    if (out->ids) {
        if ((s = qd_cuda_argmax(g->logits, nr, V, out->vocab_limit, g->ids, out->logprobs ? g->lp : NULL, g->stream)) ||
            (s = qd_cuda_memcpy_d2h_async(g->ids_host + r0, g->ids, (size_t)nr * 4, g->stream)))
            return s;
        if (out->logprobs && (s = qd_cuda_memcpy_d2h_async(g->lp_host + r0, g->lp, (size_t)nr * 4, g->stream)))
            return s;
    }
    if (!out->logits) return QD_OK;
    for (int a = 0; a < nr;) {
        if (out->full && !out->full[r0 + a]) {
            a++;
            continue;
        }
        int b = a + 1;
        while (b < nr && (!out->full || out->full[r0 + b])) b++;
        if ((s = qd_cuda_memcpy_d2h_async(out->logits + (size_t)(r0 + a) * V, g->logits + (size_t)a * V,
                                          (size_t)(b - a) * V * 4, g->stream)))
            return s;
        a = b;
    }
    return QD_OK;
}

qd_status qd_cuda_forward(void *bc, const qd_step *st, const qd_logit_out *out) {
    qd_cuda_ctx *g = bc;
    const qd_config *c = g->cfg;
    const int n_spans = st->n_spans, n_logit_rows = st->n_logit_rows;
    qd_status s;
    /* KV copy-on-write copies (kv_copy_block) were queued on the stream already */
    const size_t meta = build_step(g, st);
    const qd_cuda_step *h = &g->host;
    int max_span_rows = 1;
    for (int i = 0; i < n_spans; i++) max_span_rows = st->rt[i].T > max_span_rows ? st->rt[i].T : max_span_rows;
    if ((s = qd_cuda_memcpy_h2d_async(g->meta_dev, g->meta_host, meta, g->stream))) return backend_error(g, s);
    if ((s = update_plan(g))) return backend_error(g, s);

    const int LC = qd_cuda_logit_chunk(g);
    const int first = n_logit_rows < LC ? n_logit_rows : LC;
    /* graph: decode-only steps whose every span wants its last logits, within the MoE
     * decode path's bound (no host sync inside) */
    const int graphable = !g->d.params.eager && !st->no_graph && h->n_pre_spans == 0 && (n_logit_rows == n_spans || g->never_logits) &&
                          n_spans <= LC &&
                          (c->n_experts == 0 || n_spans <= qd_cuda_moe_graph_max_tokens());
    if (graphable) {
        void **exec = &g->graphs[n_spans];
        if (!*exec) {
            if ((s = qd_cuda_graph_begin(g->stream))) return backend_error(g, s);
            qd_status rs = run_layers(g, max_span_rows, first);
            void *e = NULL;
            s = qd_cuda_graph_end(g->stream, &e);
            if (rs) {
                qd_cuda_graph_destroy(e);
                return backend_error(g, rs);
            }
            if (s) return backend_error(g, s);
            *exec = e;
        }
        if ((s = qd_cuda_graph_launch(*exec, g->stream))) return backend_error(g, s);
    } else if ((s = run_layers(g, max_span_rows, first))) {
        return backend_error(g, s);
    }
    /* the outputs of each chunk of logit rows, the first one computed above */
    for (int r0 = 0; r0 < n_logit_rows; r0 += LC) {
        const int nr = n_logit_rows - r0 < LC ? n_logit_rows - r0 : LC;
        if (r0 > 0 && (s = logit_rows(g, r0, nr))) return backend_error(g, s);
        if ((s = take_rows(g, out, r0, nr))) return backend_error(g, s);
        if (r0 + nr < n_logit_rows && (s = qd_cuda_stream_sync(g->stream))) return backend_error(g, s);
    }
    if ((s = qd_cuda_stream_sync(g->stream))) return backend_error(g, s);
    if (out->ids) memcpy(out->ids, g->ids_host, (size_t)n_logit_rows * 4);
    if (out->ids && out->logprobs) memcpy(out->logprobs, g->lp_host, (size_t)n_logit_rows * 4);
    return QD_OK;
}
