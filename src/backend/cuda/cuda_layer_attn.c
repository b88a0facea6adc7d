/* Gated attention on the GPU: q (with its gate), k and v in one projection, norms,
 * RoPE and the paged-cache append in one kernel, attention, o_proj. */
#include "backend/cuda/cuda_attn.h"
#include "backend/cuda/cuda_layers.h"

qd_status qd_cuda_layer_attn(qd_cuda_ctx *g, const qd_cuda_layer *d, int ai, int max_span_rows) {
    const qd_config *c = g->cfg;
    const qd_cuda_step *h = &g->host, *dv = &g->dev;
    const int n = h->n_rows, H = c->hidden_size;
    const int nq = c->attn_nq, nkv = c->attn_nkv, hd = c->attn_head_dim;
    const int qdim = nq * hd, kvd = nkv * hd, q_rows = qdim * (c->attn_output_gate ? 2 : 1);
    /* q (with its gate), k and v of one normed x: one launch at decode sizes */
    const qd_cuda_lin_in in = qd_cuda_norm_in(g, d->input_norm, NULL);
    const qd_cuda_lin_out qkv[3] = {qd_cuda_mat_out(g, &d->q, g->proj, q_rows), qd_cuda_mat_out(g, &d->k, g->proj2, kvd),
                                    qd_cuda_mat_out(g, &d->v, g->proj3, kvd)};
    TRYC(qd_cuda_lin(g, &in, H, n, qkv, 3, 0, g->x));
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
    const qd_cuda_lin_out out = qd_cuda_mat_out(g, &d->o, qd_cuda_block_out(g), H);
    return qd_cuda_lin(g, &oin, qdim, n, &out, 1, !g->reduce, NULL);
}
