/* The bf16 family of the MoE decode kernels (moe_decode.cu): each lane streams its
 * weight pieces into registers, a row's first chunk in flight before the routing is
 * known where it can be (the shared expert). TG: entries a pass at most (1 for a
 * one-token call, whose experts each have one pair; else GU_TG / DN_TG). The one-entry
 * gate_up needs 48 registers and runs 5 blocks an SM: the 576 blocks of a 35B-A3B token
 * (8 experts and the shared one, 64 blocks each) in one wave of 660; the one-entry down
 * streams a row one piece a lane a chunk (dn_bf16_pieces) and runs 5 blocks an SM too. */
#include "backend/cuda/moe_decode.cuh"

template <int TG> constexpr int bf16_min_blocks() { return TG == 1 ? 5 : 4; }
static_assert(GU_TG == DN_TG, "one instance serves both kernels");

/* Weights are streamed once per step (qd_ld_stream16, cuda_common.cuh). */
__device__ __forceinline__ uint4 ld_weights(const uint4 *p) { return qd_ld_stream16(p); }

template <int TG>
__global__ void __launch_bounds__(GU_NT, bf16_min_blocks<TG>())
moe_gate_up_bf16(const uint16_t *__restrict__ x, const int32_t *sel, const uint16_t *__restrict__ gate_up,
                 float *__restrict__ act, int32_t *__restrict__ counters, int n_ctr, int P, int H, int I, int E,
                 int k, const uint16_t *__restrict__ sh_gate_up, int Is, float *__restrict__ sh_act) {
    extern __shared__ uint4 xs[]; /* [TG][H / 8] the pass's token rows, bf16 */
    __shared__ int list[QD_MOE_DECODE_MAX_PAIRS];
    __shared__ int wcnt[GU_WARPS];
    const int p = blockIdx.y, tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int i = blockIdx.x * GU_WARPS + warp; /* I, Is % 8 == 0: a block's warps all have rows or none */
    const bool shared = p >= P;                 /* the block rows after the pairs (only with sh_gate_up) */
    const int rows = shared ? Is : I;
    const int H8 = H >> 3;
    const int nch = (H8 + 32 * GU_U - 1) / (32 * GU_U);
    const uint4 *wg = NULL, *wu = NULL;
    bool ok = false;
    uint4 g[GU_U], u[GU_U];
#pragma unroll
    for (int uu = 0; uu < GU_U; uu++) g[uu] = u[uu] = make_uint4(0, 0, 0, 0);
    /* The first chunk of weights before anything else: the long-latency traffic.
     * The shared expert's are known before the routing, so before the wait. */
    if (shared && blockIdx.x * GU_WARPS < Is) {
        ok = true;
        wg = (const uint4 *)(sh_gate_up + (size_t)i * H);
        wu = wg + (size_t)Is * H8;
#pragma unroll
        for (int uu = 0; uu < GU_U; uu++) {
            const int b = uu * 32 + lane;
            if (b < H8) {
                g[uu] = ld_weights(wg + b);
                u[uu] = ld_weights(wu + b);
            }
        }
    }
    gate_up_begin(counters, n_ctr, p, k, shared);
    if (blockIdx.x * GU_WARPS >= rows) return; /* the grid covers the wider of I and Is */
    int m;
    if (shared) {
        m = group_tokens<TG>(P / k, p - P, list);
    } else {
        const int e = __ldcg(sel + p);
        if (not_owner<TG>(sel, p, e)) return;
        ok = e >= 0 && e < E; /* an id out of range gives zeros */
        wg = (const uint4 *)(gate_up + ((size_t)(ok ? e : 0) * 2 * I + i) * H);
        wu = wg + (size_t)I * H8;
#pragma unroll
        for (int uu = 0; uu < GU_U; uu++) {
            const int b = uu * 32 + lane;
            const bool in = ok && b < H8;
            g[uu] = in ? ld_weights(wg + b) : make_uint4(0, 0, 0, 0);
            u[uu] = in ? ld_weights(wu + b) : make_uint4(0, 0, 0, 0);
        }
        m = pairs_of_block<TG>(sel, p, P, e, list, wcnt);
    }
    const pass_entries<TG> pe(list, shared, p, k);
    float *const ap = shared ? sh_act : act; /* [entry][rows] */
    for (int g0 = 0; g0 < m; g0 += TG) {
        const int gs = min(TG, m - g0);
        if (g0) __syncthreads(); /* the previous pass is done with xs */
        load_pass_x(xs, x, pe, g0, gs, H8);
        float ag[TG], au[TG];
#pragma unroll
        for (int tt = 0; tt < TG; tt++) ag[tt] = au[tt] = 0.0f;
        for (int c = 0; c < nch; c++) {
            if (c || g0) {
#pragma unroll
                for (int uu = 0; uu < GU_U; uu++) {
                    const int b = (c * GU_U + uu) * 32 + lane;
                    const bool in = ok && b < H8;
                    g[uu] = in ? ld_weights(wg + b) : make_uint4(0, 0, 0, 0);
                    u[uu] = in ? ld_weights(wu + b) : make_uint4(0, 0, 0, 0);
                }
            }
#pragma unroll
            for (int uu = 0; uu < GU_U; uu++) {
                const int b = (c * GU_U + uu) * 32 + lane;
                if (b >= H8) continue;
                float gf[8], uf[8];
                bf16x8(g[uu], gf);
                bf16x8(u[uu], uf);
#pragma unroll
                for (int tt = 0; tt < TG; tt++) {
                    if (tt < gs) {
                        float xf[8];
                        bf16x8(xs[tt * H8 + b], xf);
#pragma unroll
                        for (int q = 0; q < 8; q++) {
                            ag[tt] = fmaf(gf[q], xf[q], ag[tt]);
                            au[tt] = fmaf(uf[q], xf[q], au[tt]);
                        }
                    }
                }
            }
        }
        store_act(ag, au, gs, pe, g0, ap, rows, i);
    }
}

/* The one-entry down instance streams a row in chunks of one piece a lane (two chunks at
 * I = 512, the first before the wait), so that its weights in flight fit 5 blocks an SM
 * too; a lane's pieces and their order are the same either way. */
template <int TG> __host__ __device__ constexpr int dn_bf16_pieces() { return TG == 1 ? 1 : DN_U; }

template <int TG>
__global__ void __launch_bounds__(DN_NT, bf16_min_blocks<TG>())
moe_down_bf16(const int32_t *sel, const uint16_t *__restrict__ down, const float *act, float *out, int P, int I,
              int E, const uint16_t *__restrict__ sh_down, int Is, const float *sh_act, float *sh_out,
              const __grid_constant__ dn_combine cb) {
    constexpr int U = dn_bf16_pieces<TG>();
    extern __shared__ float4 as4[]; /* [TG][max(I, Is) / 4] the pass's activations */
    __shared__ int list[QD_MOE_DECODE_MAX_PAIRS];
    __shared__ int wcnt[DN_WARPS];
    __shared__ int last[TG];
    const int p = blockIdx.y, tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const bool shared = p >= P; /* only with sh_down */
    const int H = cb.H, k = cb.k;
    int e = 0;
    if (!shared) {
        e = __ldcg(sel + p);
        if (not_owner<TG>(sel, p, e)) return;
    }
    const bool ok = shared || (e >= 0 && e < E);
    const int Ir = shared ? Is : I;
    const int I4 = Ir >> 2, I8 = Ir >> 3; /* pieces per row */
    const int h0 = blockIdx.x * QD_MOE_DN_ROWS + warp * DN_R;
    const uint8_t *wd = shared ? (const uint8_t *)(sh_down + (size_t)h0 * Is)
                               : (const uint8_t *)(down + ((size_t)(ok ? e : 0) * H + h0) * I);
    const int64_t rstride = (int64_t)Ir * 2;
    const int nch = (I8 + 32 * U - 1) / (32 * U);
    uint4 w[DN_R][U];
#pragma unroll
    for (int r = 0; r < DN_R; r++)
#pragma unroll
        for (int uu = 0; uu < U; uu++) {
            const int b = uu * 32 + lane;
            const bool in = ok && h0 + r < H && b < I8;
            w[r][uu] = in ? ld_weights((const uint4 *)(wd + r * rstride) + b) : make_uint4(0, 0, 0, 0);
        }
    const int m = shared ? group_tokens<TG>(P / k, p - P, list) : pairs_of_block<TG>(sel, p, P, e, list, wcnt);
    /* From here on the activations of gate_up are needed (and the counters it reset). The
     * next layer's first product may launch now: it only loads weights before its own wait. */
    qd_pdl_wait();
    qd_pdl_trigger();
    const pass_entries<TG> pe(list, shared, p, k);
    const float *const ap = shared ? sh_act : act;
    float *const op = shared ? sh_out : out;
    for (int g0 = 0; g0 < m; g0 += TG) {
        const int gs = min(TG, m - g0);
        if (g0) __syncthreads();
        load_pass_act(as4, ap, pe, g0, gs, Ir);
        float acc[DN_R][TG];
#pragma unroll
        for (int r = 0; r < DN_R; r++)
#pragma unroll
            for (int tt = 0; tt < TG; tt++) acc[r][tt] = 0.0f;
        for (int c = 0; c < nch; c++) {
            if (c || g0) {
#pragma unroll
                for (int r = 0; r < DN_R; r++)
#pragma unroll
                    for (int uu = 0; uu < U; uu++) {
                        const int b = (c * U + uu) * 32 + lane;
                        const bool in = ok && h0 + r < H && b < I8;
                        w[r][uu] = in ? ld_weights((const uint4 *)(wd + r * rstride) + b) : make_uint4(0, 0, 0, 0);
                    }
            }
#pragma unroll
            for (int uu = 0; uu < U; uu++) {
                const int b = (c * U + uu) * 32 + lane;
                if (b >= I8) continue;
#pragma unroll
                for (int tt = 0; tt < TG; tt++) {
                    if (tt < gs) {
                        const float4 a0 = as4[tt * I4 + 2 * b], a1 = as4[tt * I4 + 2 * b + 1];
                        const float af[8] = {a0.x, a0.y, a0.z, a0.w, a1.x, a1.y, a1.z, a1.w};
#pragma unroll
                        for (int r = 0; r < DN_R; r++) {
                            float wf[8];
                            bf16x8(w[r][uu], wf);
#pragma unroll
                            for (int q = 0; q < 8; q++) acc[r][tt] = fmaf(wf[q], af[q], acc[r][tt]);
                        }
                    }
                }
            }
        }
        finish_down_pass(acc, gs, pe, g0, op, h0, last, cb);
    }
}

template <int TG>
static qd_status launch_bf16(const qd_cuda_moe_args *a, const qd_moe_work *w, const qd_moe_shared *sh,
                             const decode_shape *d, int pdl, cudaStream_t s) {
    const decode_call c = decode_call_of(a, w, sh);
    QD_CUDA_TRY(set_smem(moe_gate_up_bf16<TG>, d->gu_smem, 0));
    QD_CUDA_TRY(set_smem(moe_down_bf16<TG>, d->dn_smem, 0));
    qd_status st = qd_launch_pdl(pdl, moe_gate_up_bf16<TG>, c.grid_gu, dim3(GU_NT), d->gu_smem, s, a->d_x, a->d_sel,
                                 a->d_gate_up, w->act, w->counters, c.n_ctr, c.P, a->H, a->I, a->E, a->k,
                                 c.has_sh ? sh->gate_up : (const uint16_t *)NULL, c.Is,
                                 c.has_sh ? sh->act : (float *)NULL);
    if (st) return st;
    return qd_launch_pdl(1, moe_down_bf16<TG>, c.grid_dn, dim3(DN_NT), d->dn_smem, s, a->d_sel, a->d_down,
                         (const float *)w->act, w->out, c.P, a->I, a->E, c.has_sh ? sh->down : (const uint16_t *)NULL,
                         c.Is, c.has_sh ? (const float *)sh->act : (const float *)NULL,
                         c.has_sh ? sh->out : (float *)NULL, c.cb);
}

/* One token: each routed expert has its one pair and the shared expert its one token. */
qd_status qd_moe_decode_bf16(const qd_cuda_moe_args *a, const qd_moe_work *w, const qd_moe_shared *sh,
                             const decode_shape *d, int pdl, cudaStream_t s) {
    return a->n == 1 ? launch_bf16<1>(a, w, sh, d, pdl, s) : launch_bf16<GU_TG>(a, w, sh, d, pdl, s);
}
