/* Gated DeltaNet layer (spec 3.3): projections, causal conv + SiLU, L2 norm, gates,
 * delta rule (recurrent for short spans, chunked for long ones), gated RMSNorm,
 * output projection. Each span carries its own conv and recurrent state; the short spans
 * of many sequences (multi-sequence decode) share one recurrent call. */
#include <math.h>
#include <string.h>

#include "backend/cpu/cpu_backend.h"

/* Delta-rule implementation by span length: the recurrence wins for a few tokens
 * (decode, short verify windows); the chunked WY form wins for prefill. */
typedef void (*gdn_kernel)(qd_threadpool *, qd_gdn_dims, const qd_gdn_span *);
static const struct { int max_T; gdn_kernel fn; } k_gdn_table[] = {
    {15, qd_cpu_gdn_recurrent},
    {1 << 30, qd_cpu_gdn_chunked},
};

/* Batch-invariant mode: only one-token spans (decode) take the recurrence. A prompt
 * piece then always runs the chunked form from its first token, and since the engine
 * starts pieces at multiples of the chunk (QD_INVARIANT_ALIGN), each chunk holds the
 * same tokens however the prompt was cut. */
static gdn_kernel pick_gdn_kernel(int T, int invariant) {
    if (invariant) return T == 1 ? qd_cpu_gdn_recurrent : qd_cpu_gdn_chunked;
    for (size_t i = 0; i < sizeof k_gdn_table / sizeof k_gdn_table[0]; i++)
        if (T <= k_gdn_table[i].max_T) return k_gdn_table[i].fn;
    return qd_cpu_gdn_chunked;
}

qd_status qd_cpu_layer_gdn(qd_cpu_ctx *ctx, const qd_layer *L, const qd_step *st, const float *x, float *y) {
    const qd_config *c = ctx->m->cfg;
    const qd_gdn_weights *w = &L->gdn;
    const qd_span_rt *spans = st->rt;
    const int n_spans = st->n_spans, n_rows = st->n_rows;
    qd_cpu_scratch *s = &ctx->s;
    const int hk = c->gdn_hk, hv = c->gdn_hv, dk = c->gdn_dk, dv = c->gdn_dv, K = c->gdn_conv_kernel;
    const int key_dim = hk * dk, conv_dim = qd_config_conv_dim(c), value_dim = qd_config_value_dim(c);

    qd_cpu_ctx_matmul(ctx, &w->in_qkv, x, n_rows, s->proj);  /* [n][conv_dim] */
    qd_cpu_ctx_matmul(ctx, &w->in_z, x, n_rows, s->proj2);   /* [n][value_dim] */
    qd_cpu_ctx_matmul(ctx, &w->in_b, x, n_rows, s->proj3);   /* [n][hv] */
    qd_cpu_ctx_matmul(ctx, &w->in_a, x, n_rows, s->proj4);   /* [n][hv] */

    const size_t conv_state = (size_t)conv_dim * (K - 1);
    const size_t ssm_state = (size_t)hv * dk * dv;
    for (int i = 0; i < n_spans; i++) {
        float *cs = qd_cpu_seq_conv(ctx, spans[i].seq) + L->state_index * conv_state;
        const size_t r0 = (size_t)spans[i].row0;
        if (!st->verify || !st->verify[i]) {
            qd_cpu_conv1d_silu(s->proj + r0 * conv_dim, spans[i].T, conv_dim, conv_dim, w->conv_w, K, cs,
                               s->conv_out + r0 * conv_dim);
            continue;
        }
        /* a verify span: token by token, keeping the conv state after each */
        for (int t = 0; t < spans[i].T; t++) {
            qd_cpu_conv1d_silu(s->proj + (r0 + t) * conv_dim, 1, conv_dim, conv_dim, w->conv_w, K, cs,
                               s->conv_out + (r0 + t) * conv_dim);
            memcpy(qd_cpu_verify_conv(ctx, spans[i].seq, t) + L->state_index * conv_state, cs,
                   conv_state * sizeof(float));
        }
    }
    qd_cpu_l2norm_heads(s->conv_out, n_rows, hk, dk, conv_dim, 1e-6f, 1.0f / sqrtf((float)dk));
    qd_cpu_l2norm_heads(s->conv_out + key_dim, n_rows, hk, dk, conv_dim, 1e-6f, 1.0f);
    qd_cpu_gdn_gates(s->proj4, hv, s->proj3, hv, n_rows, hv, w->A_log, w->dt_bias, s->g, s->beta);

    /* spans the table gives to the recurrence (decodes, short chunks) are gathered and
     * run in one multi-span call; long spans run one by one (each is parallel inside) */
    const qd_gdn_dims dims = {hk, hv, dk, dv};
    int n_multi = 0;
    for (int i = 0; i < n_spans; i++) {
        const size_t r0 = (size_t)spans[i].row0;
        const float *base = s->conv_out + r0 * conv_dim;
        qd_gdn_span sp = {
            .q = base, .q_stride = conv_dim,
            .k = base + key_dim, .k_stride = conv_dim,
            .v = base + 2 * key_dim, .v_stride = conv_dim,
            .g = s->g + r0 * hv, .beta = s->beta + r0 * hv,
            .S = qd_cpu_seq_ssm(ctx, spans[i].seq) + L->state_index * ssm_state,
            .o = s->o + r0 * value_dim,
            .T = spans[i].T,
        };
        if (st->verify && st->verify[i]) { /* one token at a time, keeping the state after each */
            for (int t = 0; t < spans[i].T; t++) {
                qd_gdn_span one = sp;
                one.q += t * conv_dim, one.k += t * conv_dim, one.v += t * conv_dim;
                one.g += (size_t)t * hv, one.beta += (size_t)t * hv, one.o += (size_t)t * value_dim;
                one.T = 1;
                qd_cpu_gdn_recurrent(ctx->m->pool, dims, &one);
                memcpy(qd_cpu_verify_ssm(ctx, spans[i].seq, t) + L->state_index * ssm_state, sp.S,
                       ssm_state * sizeof(float));
            }
            continue;
        }
        gdn_kernel fn = pick_gdn_kernel(spans[i].T, ctx->d.params.batch_invariant);
        if (fn == qd_cpu_gdn_recurrent) ctx->gdn_spans[n_multi++] = sp;
        else fn(ctx->m->pool, dims, &sp);
    }
    if (n_multi == 1) qd_cpu_gdn_recurrent(ctx->m->pool, dims, &ctx->gdn_spans[0]);
    else if (n_multi > 1) qd_cpu_gdn_recurrent_multi(ctx->m->pool, dims, ctx->gdn_spans, n_multi);
    qd_cpu_gated_rmsnorm(s->o, s->proj2, w->norm_w, n_rows, hv, dv, c->rms_norm_eps, s->u);
    qd_cpu_ctx_matmul(ctx, &w->out, s->u, n_rows, y);
    return QD_OK;
}
