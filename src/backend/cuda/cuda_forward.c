/* The forward pass on the GPU (and the MTP head's): the same ragged batch as the CPU
 * backend, one path for every batch shape. Rows are reordered internally so that prefill spans
 * (more than one token) come first and decode spans (one token) last: the chunked
 * GDN kernel then sees its tokens packed, the decode kernel its sequences packed,
 * and a sequence's result never depends on which kernel its neighbours took.
 * A step whose launches follow from its shape alone (step_graph: decode steps, uniform
 * verify steps, the MTP head's one-token steps) is replayed from a CUDA graph captured the
 * first time that shape is seen. */
#include <string.h>

#include "backend/cuda/cuda_layers.h"
#include "backend/cuda/cuda_moe.h"
#include "backend/cuda/cuda_timeline.h"

/* The row groups of a step, in internal row order. */
enum { GROUP_PREFILL, GROUP_VERIFY, GROUP_DECODE };

static int span_group(const qd_step *st, int i) {
    if (st->rt[i].T == 1) return GROUP_DECODE;
    return st->verify && st->verify[i] ? GROUP_VERIFY : GROUP_PREFILL;
}

/* A verify span's GDN bookkeeping (qd_cuda_step ver*): its conv entry and, for each of its
 * tokens, the row and the state slots the decode kernel reads and writes. */
static void add_verify(qd_cuda_ctx *g, int q, int row0, int T, int seq, int main_forward) {
    qd_cuda_step *h = &g->host;
    const int S = g->d.params.max_seqs, vslot = S + seq * g->verify_states;
    int32_t *v = h->ver + 4 * q;
    v[0] = row0;
    v[1] = T;
    v[2] = seq;
    v[3] = vslot;
    for (int t = 0; t < T; t++) {
        const size_t at = (size_t)t * S + (size_t)q; /* the spans are longest first: q < ver_count[t] */
        h->ver_rows[at] = row0 + t;
        h->ver_in[at] = t == 0 ? seq : vslot + t - 1;
        h->ver_out[at] = t == T - 1 ? seq : vslot + t;
        h->ver_count[t]++;
    }
    if (main_forward) g->ver_T[seq] = T;
}

/* Builds the step's metadata on the host (internal row order: prefill spans, verify spans
 * longest first, decode spans) and returns the number of bytes of the metadata block to
 * copy. hidden_all: the spans whose every row's hidden state is handed back, or NULL.
 * main_forward: a forward of the main model (its spans' sequences get new states, so their
 * last verify span is forgotten unless this is one), not of the MTP head. */
static size_t build_step(qd_cuda_ctx *g, const qd_step *st, const uint8_t *hidden_all, int main_forward) {
    const qd_span *spans = st->spans;
    const qd_span_rt *rt = st->rt;
    const int n_spans = st->n_spans;
    qd_cuda_step *h = &g->host;
    const int mb = g->d.max_blocks_per_seq > 0 ? g->d.max_blocks_per_seq : 1;
    int order[3][n_spans > 0 ? n_spans : 1], count[3] = {0, 0, 0};
    for (int i = 0; i < n_spans; i++) {
        const int grp = span_group(st, i);
        order[grp][count[grp]++] = i;
    }
    /* verify spans longest first (insertion sort: a handful) */
    for (int a = 1; a < count[GROUP_VERIFY]; a++)
        for (int b = a; b > 0 && rt[order[GROUP_VERIFY][b]].T > rt[order[GROUP_VERIFY][b - 1]].T; b--) {
            const int t = order[GROUP_VERIFY][b];
            order[GROUP_VERIFY][b] = order[GROUP_VERIFY][b - 1];
            order[GROUP_VERIFY][b - 1] = t;
        }
    memset(h->ver_count, 0, sizeof h->ver_count);
    int row = 0, j = 0, n_ver_rows = 0;
    int first_row[n_spans > 0 ? n_spans : 1];
    h->cu_seqlens[0] = 0;
    for (int grp = 0; grp < 3; grp++) {
        for (int q = 0; q < count[grp]; q++, j++) {
            const int i = order[grp][q];
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
                h->caller_row[row + t] = rt[i].row0 + t;
            }
            if (main_forward && seq >= 0 && seq < g->d.params.max_seqs) g->ver_T[seq] = 0;
            if (grp == GROUP_PREFILL) {
                h->pre_slots[q] = seq;
                h->cu_seqlens[q + 1] = row + T;
            } else if (grp == GROUP_VERIFY) {
                add_verify(g, q, row, T, seq, main_forward);
                n_ver_rows += T;
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
    int na = 0;
    for (int i = 0; hidden_all && i < n_spans; i++)
        if (hidden_all[i])
            for (int t = 0; t < rt[i].T; t++) h->all_rows[na++] = first_row[i] + t;
    h->n_hidden_all = na;
    h->n_rows = row;
    h->n_spans = n_spans;
    h->n_pre_spans = count[GROUP_PREFILL];
    h->n_pre_rows = h->cu_seqlens[count[GROUP_PREFILL]];
    h->n_ver = count[GROUP_VERIFY];
    h->n_ver_rows = n_ver_rows;
    h->n_dec = count[GROUP_DECODE];
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

/* Logits of logit rows [r0, r0 + nr) (the norm, final or the MTP's, of just those rows)
 * into g->logits. */
static qd_status logit_rows(qd_cuda_ctx *g, const float *norm, int r0, int nr, int vocab_rows) {
    const int V = g->cfg->vocab_size, H = g->cfg->hidden_size;
    const qd_cuda_lin_in in = qd_cuda_norm_in(g, norm, g->dev.logit_rows + r0);
    const qd_cuda_lin_out out = {.W = g->cm->lm_head, .rows = vocab_rows, .y = g->logits, .ldy = V};
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
    if (n_logit_first > 0) TRYC(logit_rows(g, cm->final_norm, 0, n_logit_first, c->vocab_size));
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

/* The hidden states handed back (qd_logit_out.hidden, .hidden_all): rows of h after `norm`
 * (the final norm, or the MTP's), computed in fp32 into g->ys and copied to the caller. */
static qd_status hidden_out(qd_cuda_ctx *g, const float *norm, const qd_logit_out *out) {
    const qd_cuda_step *h = &g->host, *dv = &g->dev;
    const int H = g->cfg->hidden_size;
    const float eps = g->cfg->rms_norm_eps;
    if (out->hidden && h->n_logit > 0) {
        TRYC(qd_cuda_add_rmsnorm(g->h, NULL, norm, eps, h->n_logit, H, dv->logit_rows, g->x, g->ys, g->stream));
        TRYC(qd_cuda_memcpy_d2h_async(out->hidden, g->ys, (size_t)h->n_logit * H * 4, g->stream));
    }
    if (out->hidden_all && h->n_hidden_all > 0) {
        TRYC(qd_cuda_add_rmsnorm(g->h, NULL, norm, eps, h->n_hidden_all, H, dv->all_rows, g->x, g->ys, g->stream));
        TRYC(qd_cuda_memcpy_d2h_async(out->all_hidden, g->ys, (size_t)h->n_hidden_all * H * 4, g->stream));
    }
    return QD_OK;
}

/* After the layers: the hidden states and the outputs of each chunk of logit rows (the
 * first chunk's logits computed already; each chunk's logits over the LM head's first
 * vocab_rows rows), then the wait for them. */
static qd_status finish_outputs(qd_cuda_ctx *g, const float *norm, const qd_step *st, const qd_logit_out *out,
                                int vocab_rows) {
    const int n_logit_rows = st->n_logit_rows, LC = qd_cuda_logit_chunk(g);
    TRYC(hidden_out(g, norm, out));
    for (int r0 = 0; r0 < n_logit_rows; r0 += LC) {
        const int nr = n_logit_rows - r0 < LC ? n_logit_rows - r0 : LC;
        if (r0 > 0) TRYC(logit_rows(g, norm, r0, nr, vocab_rows));
        TRYC(take_rows(g, out, r0, nr));
        if (r0 + nr < n_logit_rows) TRYC(qd_cuda_stream_sync(g->stream));
    }
    return QD_OK;
}

enum { GRAPH_DECODE, GRAPH_MTP }; /* graph kinds; a uniform verify step of T tokens is kind T */

/* Where the graph of this step's shape is kept, or NULL when the step runs eagerly. The
 * host decides nothing inside a graph, so a shape qualifies when every launch of the step
 * follows from (kind, n_spans): no prefill span (its chunk plan), every row wanting its
 * logits (a split rank other than the first wants none) within the first logits chunk,
 * within the MoE decode path's token bound (no host sync inside), and spans that are all
 * one token (decode, and the MTP head's draft steps) or all verify spans of one length T
 * (their per-token GDN launches). A step that counts its routing marks runs eagerly (the
 * graphs do not mark). */
static void **step_graph(qd_cuda_ctx *g, const qd_step *st, int mtp) {
    const qd_cuda_step *h = &g->host;
    const int n = h->n_rows, n_spans = st->n_spans;
    if (g->count_experts || g->d.params.eager || st->no_graph || h->n_pre_spans > 0 || n_spans < 1) return NULL;
    if (!(st->n_logit_rows == n || g->never_logits) || n > qd_cuda_logit_chunk(g)) return NULL;
    if (g->cfg->n_experts > 0 && n > qd_cuda_moe_graph_max_tokens()) return NULL;
    int kind;
    if (h->n_ver == 0 && n == n_spans) {
        kind = mtp ? GRAPH_MTP : GRAPH_DECODE;
    } else {
        const int T = n / n_spans;
        if (mtp || g->reduce || h->n_ver != n_spans || T * n_spans != n || T > g->verify_states) return NULL;
        for (int t = 0; t < T; t++)
            if (h->ver_count[t] != n_spans) return NULL; /* spans of different lengths */
        kind = T;
    }
    return &g->graphs[(size_t)kind * ((size_t)g->d.params.max_seqs + 1) + (size_t)n_spans];
}

/* Runs body(g, arg) on the stream: replayed from *exec when there is one, else captured
 * into it first; exec NULL: eagerly. */
static qd_status run_graphed(qd_cuda_ctx *g, void **exec, qd_status (*body)(qd_cuda_ctx *, const void *),
                             const void *arg) {
    if (!exec) return body(g, arg);
    if (!*exec) {
        TRYC(qd_cuda_graph_begin(g->stream));
        const qd_status rs = body(g, arg);
        void *e = NULL;
        const qd_status s = qd_cuda_graph_end(g->stream, &e);
        if (rs) {
            qd_cuda_graph_destroy(e);
            return rs;
        }
        TRYC(s);
        *exec = e;
    }
    return qd_cuda_graph_launch(*exec, g->stream);
}

typedef struct layers_arg {
    int max_span_rows, n_logit_first;
} layers_arg;

static qd_status main_body(qd_cuda_ctx *g, const void *arg) {
    const layers_arg *a = arg;
    return run_layers(g, a->max_span_rows, a->n_logit_first);
}

qd_status qd_cuda_forward(void *bc, const qd_step *st, const qd_logit_out *out) {
    qd_cuda_ctx *g = bc;
    qd_cuda_timeline_forward(g->stream);
    const qd_config *c = g->cfg;
    const int n_spans = st->n_spans, n_logit_rows = st->n_logit_rows;
    qd_status s;
    for (int i = 0; st->verify && i < n_spans; i++)
        if (st->verify[i] && st->rt[i].T > 1 && st->rt[i].T > g->verify_states)
            return qd_seterr(g->err, QD_ERR_INVALID_ARG,
                             "verify span %d of %d tokens: the context keeps the states of at most %d (params."
                             "speculative_tokens + 1)",
                             i, st->rt[i].T, g->verify_states);
    /* KV copy-on-write copies (kv_copy_block) were queued on the stream already */
    const size_t meta = build_step(g, st, out->hidden_all, 1);
    int max_span_rows = 1;
    for (int i = 0; i < n_spans; i++) max_span_rows = st->rt[i].T > max_span_rows ? st->rt[i].T : max_span_rows;
    if ((s = qd_cuda_memcpy_h2d_async(g->meta_dev, g->meta_host, meta, g->stream))) return backend_error(g, s);
    if ((s = update_plan(g))) return backend_error(g, s);

    const int LC = qd_cuda_logit_chunk(g);
    const layers_arg la = {max_span_rows, n_logit_rows < LC ? n_logit_rows : LC};
    g->count_experts = st->experts_touched && g->experts_touched;
    if (g->count_experts &&
        (s = qd_cuda_memset_async(g->experts_touched, 0, (size_t)c->n_layers * c->n_experts, g->stream)))
        return backend_error(g, s);
    if ((s = run_graphed(g, step_graph(g, st, 0), main_body, &la))) return backend_error(g, s);
    if ((s = finish_outputs(g, g->cm->final_norm, st, out, c->vocab_size))) return backend_error(g, s);
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

/* ---------------------------------------------------------------- the MTP head */

/* spec 7.2, as the CPU backend's: h = fc([PreFcNormEmb(embed(token)) | PreFcNormHid(hidden)]),
 * the head's decoder layer over its own KV (attention layer n_attn of the blocks), then the
 * MTP norm and the shared LM head over the first n_logit_first logit rows. The hidden
 * inputs are in g->ys as the caller's [n_rows][H] in span order (uploaded before, outside
 * any graph), normed through the internal row -> caller row map. */
typedef struct mtp_arg {
    const qd_cuda_mtp *m;
    int max_span_rows, n_logit_first;
    int vocab_rows; /* LM head rows computed: the argmax bound when no logits row is asked for */
} mtp_arg;

static qd_status mtp_layers(qd_cuda_ctx *g, const void *arg) {
    const mtp_arg *a = arg;
    const qd_cuda_mtp *m = a->m;
    const qd_config *c = g->cfg;
    const qd_cuda_step *h = &g->host, *dv = &g->dev;
    const int n = h->n_rows, H = c->hidden_size;
    const float eps = c->rms_norm_eps;
    TRYC(qd_cuda_embed(g->cm->embed, dv->tokens, n, H, g->h, g->stream));
    TRYC(qd_cuda_add_rmsnorm(g->h, NULL, m->pre_fc_norm_embedding, eps, n, H, NULL, g->x, NULL, g->stream));
    TRYC(qd_cuda_memcpy2d(g->mtp_cat, (size_t)4 * H, g->x, (size_t)2 * H, (size_t)2 * H, (size_t)n, g->stream));
    TRYC(qd_cuda_add_rmsnorm(g->ys, NULL, m->pre_fc_norm_hidden, eps, n, H, dv->caller_row, g->x, NULL, g->stream));
    TRYC(qd_cuda_memcpy2d(g->mtp_cat + H, (size_t)4 * H, g->x, (size_t)2 * H, (size_t)2 * H, (size_t)n, g->stream));
    qd_cuda_lin_in in = {0};
    in.kind = QD_LIN_BF16;
    in.x = g->mtp_cat;
    in.ldx = 2 * H;
    const qd_cuda_lin_out fc = qd_cuda_mat_out(g, &m->fc, g->h, H);
    TRYC(qd_cuda_lin(g, &in, 2 * H, n, &fc, 1, 0, NULL)); /* fc is whole on every rank of a split model */
    TRYC(qd_cuda_layer_attn(g, &m->layer, g->cm->w->n_attn, a->max_span_rows));
    TRYC(block_reduce(g));
    if (m->ffn_kind == QD_FFN_MOE) {
        TRYC(qd_cuda_layer_moe(g, &m->layer, 0));
    } else {
        const qd_cuda_lin_in fin = qd_cuda_norm_in(g, m->layer.post_norm, NULL);
        TRYC(qd_cuda_layer_mlp(g, &fin, &m->layer.gate_up, &m->layer.down, m->layer.I, qd_cuda_block_out(g),
                               !g->reduce));
    }
    TRYC(block_reduce(g));
    return a->n_logit_first > 0 ? logit_rows(g, m->norm, 0, a->n_logit_first, a->vocab_rows) : QD_OK;
}

qd_status qd_cuda_mtp_forward(void *bc, const qd_step *st, const float *hidden, const qd_logit_out *out) {
    qd_cuda_ctx *g = bc;
    const qd_config *c = g->cfg;
    const qd_cuda_mtp *m = g->cm->mtp;
    if (!m) return qd_seterr(g->err, QD_ERR_UNSUPPORTED, "the model has no MTP head on the device");
    const size_t need = (size_t)(g->cm->w->n_attn + 1) * g->d.params.kv_block_size * c->attn_nkv * c->attn_head_dim;
    if (!g->mtp_cat || g->d.kv_block_elems < need)
        return qd_seterr(g->err, QD_ERR_UNSUPPORTED, "the context was created without the MTP layer's KV (params.mtp)");
    if (st->n_rows > 0 && !hidden) return qd_seterr(g->err, QD_ERR_INVALID_ARG, "MTP forward: no hidden states");
    int max_span_rows = 1;
    for (int i = 0; i < st->n_spans; i++) max_span_rows = st->rt[i].T > max_span_rows ? st->rt[i].T : max_span_rows;
    const size_t meta = build_step(g, st, out->hidden_all, 0);
    const int n_logit_rows = st->n_logit_rows, LC = qd_cuda_logit_chunk(g);
    qd_status s;
    g->count_experts = 0;
    /* drafts (ids, no logits row) bounded below the vocabulary need only the LM head's
     * first vocab_limit rows: the MTP graphs are captured for one such bound, recaptured
     * when it changes (an engine keeps one) */
    const int vocab_rows = !out->logits && out->vocab_limit > 0 && out->vocab_limit < c->vocab_size
                               ? out->vocab_limit
                               : c->vocab_size;
    if (vocab_rows != g->mtp_graph_rows) {
        for (int i = 0; i <= g->d.params.max_seqs; i++) {
            void **e = &g->graphs[(size_t)GRAPH_MTP * ((size_t)g->d.params.max_seqs + 1) + (size_t)i];
            qd_cuda_graph_destroy(*e);
            *e = NULL;
        }
        g->mtp_graph_rows = vocab_rows;
    }
    const mtp_arg ma = {m, max_span_rows, n_logit_rows < LC ? n_logit_rows : LC, vocab_rows};
    if ((s = qd_cuda_memcpy_h2d_async(g->meta_dev, g->meta_host, meta, g->stream)) ||
        (s = qd_cuda_memcpy_h2d_async(g->ys, hidden, (size_t)st->n_rows * c->hidden_size * 4, g->stream)) ||
        (s = run_graphed(g, step_graph(g, st, 1), mtp_layers, &ma)) ||
        (s = finish_outputs(g, m->norm, st, out, vocab_rows)) || (s = qd_cuda_stream_sync(g->stream)))
        return backend_error(g, s);
    if (out->ids) memcpy(out->ids, g->ids_host, (size_t)n_logit_rows * 4);
    if (out->ids && out->logprobs) memcpy(out->logprobs, g->lp_host, (size_t)n_logit_rows * 4);
    return QD_OK;
}
