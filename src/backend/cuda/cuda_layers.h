/* The CUDA backend's layers (cuda_layer_*.c), each over the packed rows of the step
 * that build_step laid out in g->host / g->dev, and what they share: the projection
 * through the kernel table, the norm folded into it, and where a block's output goes. */
#ifndef QD_CUDA_LAYERS_H
#define QD_CUDA_LAYERS_H

#include "backend/cuda/cuda_linear.h"
#include "backend/cuda/cuda_model.h"

#define TRYC(call)                                  \
    do {                                            \
        qd_status s_ = (call);                      \
        if (s_ != QD_OK) return s_;                 \
    } while (0)

/* Every projection of the forward: the kernel table's pick (qd_cuda_linear), or in
 * batch-invariant mode the one path that sums each row in the same order for every n. */
static inline qd_status qd_cuda_lin(qd_cuda_ctx *g, const qd_cuda_lin_in *in, int64_t cols, int n,
                                    const qd_cuda_lin_out *out, int n_out, int accumulate, uint16_t *scratch) {
    return qd_cuda_linear_path(g->invariant ? QD_LIN_PATH_INVARIANT : QD_LIN_PATH_TABLE, g->blas, in, cols, n, out,
                               n_out, accumulate, scratch, g->stream);
}

/* The product of one device matrix into y (its rows at stride ldy). */
static inline qd_cuda_lin_out qd_cuda_mat_out(const qd_cuda_ctx *g, const qd_cuda_mat *m, float *y, int64_t ldy) {
    qd_cuda_lin_out o = {.W = m->bf16, .rows = m->rows, .y = y, .ldy = ldy,
                         .qw = qd_cuda_mat_quantized(m) ? &m->q : NULL, .dequant = g->wdq,
                         .fp8_act = g->fp8_act, .fp8_act_bytes = g->fp8_act_bytes};
    return o;
}

/* The products of a stack's parts, part j into columns row0[j].. of y; returns their count. */
static inline int qd_cuda_stack_outs(const qd_cuda_ctx *g, const qd_cuda_stack *st, float *y, int64_t ldy,
                                     qd_cuda_lin_out out[QD_CUDA_MAX_PARTS]) {
    for (int j = 0; j < st->n; j++) out[j] = qd_cuda_mat_out(g, &st->part[j], y + st->row0[j], ldy);
    return st->n;
}

/* The residual h is complete at every layer boundary: each block's output
 * projection adds into it (qd_cuda_linear with accumulate, the MoE combine), and
 * each norm is folded into the projection that reads it (the kernel table of
 * qd_cuda_linear fuses it at decode sizes and materialises it into g->x above). */
static inline qd_cuda_lin_in qd_cuda_norm_in(const qd_cuda_ctx *g, const float *w, const int32_t *rows) {
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
 * goes to y (overwritten), is all-reduced over the ranks and only then joins h (the
 * forward's block_reduce); every rank's h stays the same. */
static inline float *qd_cuda_block_out(const qd_cuda_ctx *g) { return g->reduce ? g->y : g->h; }

/* The mixers: GDN layer gi (its index among GDN layers), attention layer ai. */
qd_status qd_cuda_layer_gdn(qd_cuda_ctx *g, const qd_cuda_layer *d, int gi);
qd_status qd_cuda_layer_attn(qd_cuda_ctx *g, const qd_cuda_layer *d, int ai, int max_span_rows);
/* SwiGLU MLP of width I on the input `in` (of H columns): y (+)= down(silu(gate) * up). */
qd_status qd_cuda_layer_mlp(qd_cuda_ctx *g, const qd_cuda_lin_in *in, const qd_cuda_stack *gate_up,
                            const qd_cuda_mat *down, int I, float *y, int accumulate);
/* The MoE block with its shared expert, from the residual h. */
/* L: the model layer (its row of the routing marks when the step counts them) */
qd_status qd_cuda_layer_moe(qd_cuda_ctx *g, const qd_cuda_layer *d, int L);

#endif
