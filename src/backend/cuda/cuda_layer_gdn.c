/* The Gated DeltaNet layer on the GPU: one projection of in_qkv | in_z | in_b | in_a,
 * conv + L2 norms + gates in one kernel, the delta rule (chunked tensor-core kernel for
 * prefill spans, the decode kernel for one-token spans and, one launch for all their
 * tokens, for verify spans, whose per-token states the rollback of a rejected draft
 * needs), gated norm + out_proj. A step of one-token spans only runs the inputs and the
 * delta rule as one kernel. */
#include "backend/cuda/cuda_layers.h"

_Static_assert(QD_CUDA_MAX_VERIFY <= QD_GDN_MAX_TOKENS, "a verify span fits one GDN decode launch");

/* out_proj of the gated norm of o (gate z = in_z), into the residual */
static qd_status gdn_out(qd_cuda_ctx *g, const qd_cuda_layer *d) {
    const qd_config *c = g->cfg;
    const int n = g->host.n_rows, H = c->hidden_size, dvh = c->gdn_dv;
    const int conv_dim = qd_config_conv_dim(c), value_dim = qd_config_value_dim(c);
    const int W = conv_dim + value_dim + 2 * c->gdn_hv;
    qd_cuda_lin_in gin = {0};
    gin.kind = QD_LIN_GATED;
    gin.o = g->o;
    gin.z = g->proj + conv_dim;
    gin.ldz = W;
    gin.dv = dvh;
    gin.w = d->gdn_norm;
    gin.eps = c->rms_norm_eps;
    const qd_cuda_lin_out out = qd_cuda_mat_out(g, &d->gdn_out, qd_cuda_block_out(g), H);
    return qd_cuda_lin(g, &gin, value_dim, n, &out, 1, !g->reduce, g->u);
}

qd_status qd_cuda_layer_gdn(qd_cuda_ctx *g, const qd_cuda_layer *d, int gi) {
    const qd_config *c = g->cfg;
    const qd_cuda_step *h = &g->host, *dv = &g->dev;
    const int n = h->n_rows, H = c->hidden_size;
    const int hk = c->gdn_hk, hv = c->gdn_hv, dk = c->gdn_dk, dvh = c->gdn_dv, K = c->gdn_conv_kernel;
    const int conv_dim = qd_config_conv_dim(c), value_dim = qd_config_value_dim(c), key_dim = hk * dk;
    const int W = conv_dim + value_dim + 2 * hv;
    const size_t S = (size_t)g->pool_slots;
    float *conv_state = g->conv + (size_t)gi * S * g->conv_slot;
    float *ssm = g->ssm + (size_t)gi * S * g->ssm_slot;

    const qd_cuda_lin_in in = qd_cuda_norm_in(g, d->input_norm, NULL);
    qd_cuda_lin_out proj[QD_CUDA_MAX_PARTS];
    const int n_proj = qd_cuda_stack_outs(g, &d->gdn_in, g->proj, W, proj);
    TRYC(qd_cuda_lin(g, &in, H, n, proj, n_proj, 0, g->x));
    /* proj rows: in_qkv (conv inputs) | in_z | in_b | in_a */
    const qd_cuda_gdn_in_args ia = {
        .n = n, .hk = hk, .hv = hv, .dk = dk, .dv = dvh, .K = K, .n_spans = h->n_spans,
        .d_x = g->proj, .x_stride = W,
        .d_a = g->proj + conv_dim + value_dim + hv, .d_b = g->proj + conv_dim + value_dim, .ab_stride = W,
        .d_w = d->conv_w, .d_A_log = d->A_log, .d_dt_bias = d->dt_bias, .d_state = conv_state,
        .d_spans = dv->spans, .d_row_span = dv->row_span,
        .d_q = g->q, .d_k = g->k, .d_v = g->v, .d_g = g->g, .d_beta = g->beta,
        .decode_only = h->n_pre_spans == 0 && h->n_ver == 0,
        .n_ver = h->n_ver, .d_ver = dv->ver,
    };
    /* a decode-only step: the delta rule makes its inputs itself (one launch, not two) */
    const qd_cuda_gdn_decode_args dec = {
        .hk = hk, .hv = hv, .dk = dk, .dv = dvh, .n_seq = h->n_dec, .d_state = ssm, .d_slot = dv->dec_slots,
        .d_o = g->o, .early_state = 1,
    };
    if (h->n_dec == n && qd_cuda_gdn_decode_inputs_supported(&ia, &dec)) {
        TRYC(qd_cuda_gdn_decode_inputs(&ia, &dec, g->stream));
        return gdn_out(g, d);
    }
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
    /* verify spans: one launch, each span's tokens in turn from the sequence's own slot,
     * the state after each token into its verify slot, after the last into its own */
    if (h->n_ver > 0) {
        int n_tok = 0;
        while (n_tok < QD_CUDA_MAX_VERIFY && h->ver_count[n_tok] > 0) n_tok++;
        const qd_cuda_gdn_decode_args a = {
            .hk = hk, .hv = hv, .dk = dk, .dv = dvh, .n_seq = h->ver_count[0],
            .d_q = g->q, .d_k = g->k, .d_v = g->v, .d_g = g->g, .d_beta = g->beta, .d_state = ssm,
            .d_slot = dv->ver_in, .d_row = dv->ver_rows, .d_o = g->o, .d_slot_out = dv->ver_out,
            .n_tok = n_tok, .tok_stride = g->d.params.max_seqs, .tok_count = h->ver_count, .early_state = 1,
        };
        TRYC(qd_cuda_gdn_decode(&a, g->stream));
    }
    if (h->n_dec > 0) {
        const size_t r0 = (size_t)(h->n_pre_rows + h->n_ver_rows);
        const qd_cuda_gdn_decode_args a = {
            .hk = hk, .hv = hv, .dk = dk, .dv = dvh, .n_seq = h->n_dec,
            .d_q = g->q + r0 * key_dim, .d_k = g->k + r0 * key_dim, .d_v = g->v + r0 * value_dim,
            .d_g = g->g + r0 * hv, .d_beta = g->beta + r0 * hv, .d_state = ssm, .d_slot = dv->dec_slots,
            .d_o = g->o + r0 * value_dim, .early_state = 1,
        };
        TRYC(qd_cuda_gdn_decode(&a, g->stream));
    }
    return gdn_out(g, d);
}
