/* The forward pass on the GPU: the same ragged batch as the CPU backend, one
 * path for every batch shape. Rows are reordered internally so that prefill spans
 * (more than one token) come first and decode spans (one token) last: the chunked
 * GDN kernel then sees its tokens packed, the decode kernel its sequences packed,
 * and a sequence's result never depends on which kernel its neighbours took.
 * A step made only of decode spans, each wanting its last logits, is replayed from
 * a CUDA graph captured the first time that batch size is seen. */
#include <string.h>

#include "backend/cuda/cuda_layers.h"
#include "backend/cuda/cuda_moe.h"

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

/* A split rank's block output: all-reduced over the ranks, then added to h. */
static qd_status block_reduce(qd_cuda_ctx *g) {
    if (!g->reduce) return QD_OK;
    const int n = g->host.n_rows, H = g->cfg->hidden_size;
    TRYC(g->reduce(g->reduce_user, g->y, n, g->stream));
    return qd_cuda_add_f32(g->h, H, g->y, H, H, n, g->stream);
}

/* Logits of logit rows [r0, r0 + nr) (the final norm of just those rows) into g->logits. */
static qd_status logit_rows(qd_cuda_ctx *g, int r0, int nr) {
    const int V = g->cfg->vocab_size, H = g->cfg->hidden_size;
    const qd_cuda_lin_in in = qd_cuda_norm_in(g, g->cm->final_norm, g->dev.logit_rows + r0);
    const qd_cuda_lin_out out = {.W = g->cm->lm_head, .rows = V, .y = g->logits, .ldy = V};
    return qd_cuda_lin(g, &in, H, nr, &out, 1, 0, g->x);
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
        if (ly->kind == QD_LAYER_GDN) TRYC(qd_cuda_layer_gdn(g, d, ly->state_index));
        else TRYC(qd_cuda_layer_attn(g, d, ly->state_index, max_span_rows));
        TRYC(block_reduce(g));
        if (ly->ffn_kind == QD_FFN_MOE) {
            TRYC(qd_cuda_layer_moe(g, d, L));
        } else {
            const qd_cuda_lin_in in = qd_cuda_norm_in(g, d->post_norm, NULL);
            TRYC(qd_cuda_layer_mlp(g, &in, &d->gate_up, &d->down, d->I, qd_cuda_block_out(g), !g->reduce));
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
 * argmax (and log-softmax; under their allow masks for the masked rows, which are
 * uploaded here, after the layers and outside any graph) into the pinned buffers, and
 * the logits rows asked for to the caller, as few copies as there are runs of
 * consecutive wanted rows. */
static qd_status take_rows(qd_cuda_ctx *g, const qd_logit_out *out, int r0, int nr) {
    const int V = g->cfg->vocab_size;
    qd_status s;
    if (out->ids) {
        const uint32_t *d_allow;
        const int32_t *d_allow_row;
        if ((s = qd_cuda_allow_upload(g, out, r0, nr, &d_allow, &d_allow_row)) ||
            (s = qd_cuda_argmax(g->logits, nr, V, out->vocab_limit, d_allow, d_allow_row, g->ids,
                                out->logprobs ? g->lp : NULL, g->stream)) ||
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
    /* a step that counts its routing marks runs eagerly (the graphs do not mark) */
    g->count_experts = st->experts_touched && g->experts_touched;
    if (g->count_experts &&
        (s = qd_cuda_memset_async(g->experts_touched, 0, (size_t)c->n_layers * c->n_experts, g->stream)))
        return backend_error(g, s);
    const int graphable = !g->count_experts && !g->d.params.eager && !st->no_graph && h->n_pre_spans == 0 && (n_logit_rows == n_spans || g->never_logits) &&
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
    if (g->count_experts &&
        (s = qd_cuda_memcpy_d2h_async(st->experts_touched, g->experts_touched, (size_t)c->n_layers * c->n_experts,
                                      g->stream)))
        return backend_error(g, s);
    if ((s = qd_cuda_stream_sync(g->stream))) return backend_error(g, s);
    g->count_experts = 0;
    if (out->ids) memcpy(out->ids, g->ids_host, (size_t)n_logit_rows * 4);
    if (out->ids && out->logprobs) memcpy(out->logprobs, g->lp_host, (size_t)n_logit_rows * 4);
    return QD_OK;
}
