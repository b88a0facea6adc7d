/* Dense SwiGLU MLP: down(silu(gate x) * up x). */
#include "backend/cpu/cpu_backend.h"

qd_status qd_cpu_layer_mlp(qd_cpu_ctx *ctx, const qd_mlp_weights *w, int n_rows, const float *x, float *y) {
    qd_cpu_scratch *s = &ctx->s;
    const int64_t I = w->gate.rows;
    qd_cpu_ctx_matmul(ctx, &w->gate, x, n_rows, s->ffn_a);
    qd_cpu_ctx_matmul(ctx, &w->up, x, n_rows, s->ffn_b);
    qd_cpu_silu_mul(s->ffn_a, s->ffn_b, n_rows * I, s->ffn_a);
    qd_cpu_ctx_matmul(ctx, &w->down, s->ffn_a, n_rows, y);
    return QD_OK;
}
