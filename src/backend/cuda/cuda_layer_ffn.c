/* The feed-forward blocks on the GPU: the dense SwiGLU MLP and the MoE block with its
 * shared expert. */
#include "backend/cuda/cuda_layers.h"
#include "backend/cuda/cuda_moe.h"

qd_status qd_cuda_layer_mlp(qd_cuda_ctx *g, const qd_cuda_lin_in *in, const qd_cuda_stack *gate_up,
                            const qd_cuda_mat *down, int I, float *y, int accumulate) {
    const int n = g->host.n_rows, H = g->cfg->hidden_size;
    qd_cuda_lin_out gu[QD_CUDA_MAX_PARTS];
    const int n_gu = qd_cuda_stack_outs(g, gate_up, g->ffn, 2 * (int64_t)I, gu);
    TRYC(qd_cuda_lin(g, in, H, n, gu, n_gu, 0, g->x));
    qd_cuda_lin_in act = {0};
    act.kind = QD_LIN_SILU;
    act.gu = g->ffn;
    const qd_cuda_lin_out dn = qd_cuda_mat_out(g, down, y, H);
    return qd_cuda_lin(g, &act, I, n, &dn, 1, accumulate, g->act);
}

/* The experts' and shared expert's formats the fused block takes: bf16 throughout, or the
 * routed experts quantized with a shared expert (if any) in their format as one stack. */
static int block_formats(const qd_cuda_layer *d) {
    const int q = d->q_experts_gate_up.n_mats > 0;
    if (!d->has_shared_gate) return 1;
    if (!q) return d->gate_up.n == 1 && d->gate_up.part[0].bf16 && d->down.bf16;
    return d->sh_q_gate_up.n_mats == 2 && d->sh_q_gate_up.dtype == d->q_experts_gate_up.dtype;
}

/* The routing marks of layer L, after the routing wrote g->sel. */
static qd_status mark_experts(qd_cuda_ctx *g, int L, int n) {
    if (!g->count_experts) return QD_OK;
    const int E = g->cfg->n_experts;
    return qd_cuda_moe_mark(g->sel, n * g->cfg->n_experts_per_tok, E, g->experts_touched + (size_t)L * E, g->stream);
}

qd_status qd_cuda_layer_moe(qd_cuda_ctx *g, const qd_cuda_layer *d, int L) {
    const qd_config *c = g->cfg;
    const int n = g->host.n_rows, H = c->hidden_size, E = c->n_experts, k = c->n_experts_per_tok;
    const int Ie = c->moe_intermediate_size;
    /* kernel table: batches of up to QD_MOE_BLOCK_MAX_TOKENS of an unsplit model run the
     * whole block in three launches (measured faster there, cuda_moe.h); it adds into h
     * itself, so a split model takes the general path */
    const int quant = d->q_experts_gate_up.n_mats > 0;
    if (!g->reduce && !g->invariant && block_formats(d) &&
        qd_cuda_moe_block_preferred(n, H, Ie, d->has_shared_gate ? d->I : 0, E, k)) {
        const int q_sh = quant && d->has_shared_gate;
        const qd_cuda_moe_block_args a = {
            .n = n, .H = H, .I = Ie, .E = E, .k = k, .renorm = c->norm_topk_prob,
            .d_h = g->h, .d_norm = d->post_norm, .eps = c->rms_norm_eps, .d_router = d->router,
            .d_gate_up = d->experts_gate_up, .d_down = d->experts_down,
            .d_sh_gate_up = d->has_shared_gate && !quant ? d->gate_up.part[0].bf16 : NULL,
            .d_sh_down = d->has_shared_gate && !quant ? d->down.bf16 : NULL, .I_s = d->I,
            .q_gate_up = quant ? &d->q_experts_gate_up : NULL, .q_down = quant ? &d->q_experts_down : NULL,
            .q_sh_gate_up = q_sh ? &d->sh_q_gate_up : NULL, .q_sh_down = q_sh ? &d->sh_q_down : NULL,
            .d_x = g->x, .d_logits = g->router, .d_sel = g->sel, .d_w = g->selw, .d_route_cnt = g->route_cnt,
            .d_sh_act = g->ffn, .d_sh_out = g->ys, .d_work = g->moe_work,
        };
        TRYC(qd_cuda_moe_block(&a, g->stream));
        return mark_experts(g, L, n);
    }
    float *dst = qd_cuda_block_out(g); /* the shared expert and the experts add into it */
    if (g->reduce) TRYC(qd_cuda_memset_async(dst, 0, (size_t)n * H * 4, g->stream));
    /* router logits and the shared expert's gate logit in one product: [n][ldr] */
    const int Er = E + (d->has_shared_gate ? 1 : 0), ldr = QD_CUDA_ROUTER_LD(E);
    /* fp32 input: a bf16-rounded x would flip near-tied expert choices (discrete changes).
     * kernel table: prefill sizes outside batch-invariant mode take the row as three bf16
     * parts (in xf's room) through the tensor cores, else matmul_xf32's fp32 kernels, whose
     * bits do not depend on n */
    if (!g->invariant && n >= QD_CUDA_ROUTER_SPLIT_MIN_N) {
        uint16_t *xr = (uint16_t *)g->xf; /* [n][2 H] bf16: the size of xf's [n][H] fp32 */
        TRYC(qd_cuda_add_rmsnorm_split(g->h, NULL, d->post_norm, c->rms_norm_eps, n, H, g->x, xr, g->stream));
        /* all ldr rows, the weights' zero rows after Er included (QD_CUDA_ROUTER_LD) */
        TRYC(qd_cuda_matmul_split3(g->blas, d->router, ldr, H, g->x, H, xr, 2 * (int64_t)H, n, g->router, ldr));
    } else {
        TRYC(qd_cuda_add_rmsnorm(g->h, NULL, d->post_norm, c->rms_norm_eps, n, H, NULL, g->x, g->xf, g->stream));
        TRYC(qd_cuda_matmul_xf32(d->router, Er, H, g->xf, H, n, g->router, ldr, g->stream));
    }
    if (d->has_shared_gate) {
        qd_cuda_lin_in x = {0};
        x.kind = QD_LIN_BF16;
        x.x = g->x;
        x.ldx = H;
        TRYC(qd_cuda_layer_mlp(g, &x, &d->gate_up, &d->down, d->I, g->ys, 0));
    }
    TRYC(qd_cuda_moe_route(g->router, ldr, n, E, k, c->norm_topk_prob, g->sel, g->selw, g->stream));
    TRYC(mark_experts(g, L, n));
    const qd_cuda_model *cm = g->cm;
    if (cm->n_experts_local < E) /* expert parallel: this rank's pairs only */
        TRYC(qd_cuda_moe_localize(g->sel, n * k, cm->expert0, cm->n_experts_local, g->stream));
    const qd_cuda_moe_args a = {
        .n = n, .H = H, .I = Ie, .E = cm->n_experts_local, .k = k, .d_x = g->x, .d_sel = g->sel, .d_w = g->selw,
        .d_gate_up = d->experts_gate_up, .d_down = d->experts_down, .d_y = dst, .d_work = g->moe_work,
        .cublas = qd_cuda_blas_handle(g->blas), .invariant = g->invariant,
        .q_gate_up = quant ? &d->q_experts_gate_up : NULL, .q_down = quant ? &d->q_experts_down : NULL,
        .d_dequant = g->moe_dq,
        /* the shared expert goes in with the routed ones (its sigmoid-gated output first) */
        .d_sh_y = d->has_shared_gate ? g->ys : NULL, .d_sh_gate = d->has_shared_gate ? g->router + E : NULL,
        .sh_gate_ld = ldr,
    };
    return qd_cuda_moe_experts(&a, g->stream);
}
