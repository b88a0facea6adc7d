/* The MoE block of a decode-sized batch in three launches (cuda_moe.h,
 * qd_cuda_moe_block): a router kernel that normalises the residual, computes
 * the router and shared-gate logits and routes each token; then the decode
 * expert kernels (moe_decode.cu) with the shared expert in extra block rows,
 * whose combine adds everything into the residual. Unfused this was nine
 * launches (norm, router, shared gate_up, SwiGLU, shared down, sigmoid scale,
 * route, gate_up, down), each a few microseconds of latency at one token.
 *
 * Router kernel: block (row tile of 8 logits, token t). Each block normalises
 * token t's residual into shared memory (8 KiB at H = 2048, from L2) exactly as
 * the unfused norm kernel does (same 256-thread sum), so the logits are the
 * unfused ones bit for bit; the blocks of column 0 also store x in bf16 for the
 * expert kernels. A per-token counter finds the last block of the token, which
 * routes it with one warp (moe_route.cuh) and resets the counter. */
#include <stdint.h>

#include "backend/cuda/cuda_pdl.cuh"
#include "backend/cuda/cuda_util.h"
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/moe_internal.cuh"
#include "backend/cuda/moe_route.cuh"
#include "backend/cuda/router_dot.cuh"

#define RD_NT 256
#define RD_WARPS (RD_NT / 32) /* logits per block: a warp each */
#define RD_MAX_H 12288        /* x in shared memory as fp32: at most 48 KiB */
#define RD_PRE 8              /* router pieces a lane loads before the wait: H <= 2048 whole */
#define RD_HOLD 8             /* residual values a thread keeps between its sum and its norm: H <= 2048 */

template <int V>
__global__ void __launch_bounds__(RD_NT)
moe_router_decode(const float *h, const float *__restrict__ nw, float eps, int H,
                  const uint16_t *__restrict__ Wr, int Er, float *logits, int ldl, uint16_t *__restrict__ x, int E,
                  int k, int renorm, int32_t *__restrict__ sel, float *__restrict__ selw, int32_t *cnt) {
    extern __shared__ float xf[]; /* [H] token t's normed residual */
    __shared__ float red[RD_WARPS];
    __shared__ int is_last;
    const int t = blockIdx.y, tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int row = blockIdx.x * RD_WARPS + warp;
    const uint16_t *wr = Wr + (size_t)(row < Er ? row : 0) * H;
    /* this warp's router row, RD_PRE pieces a lane (all of it up to H = 2048): weights, so
     * loaded before the wait, and all in flight at once (at one token this kernel is a few
     * memory latencies long, not a stream of bytes) */
    uint4 wp[RD_PRE];
#pragma unroll
    for (int i = 0; i < RD_PRE; i++) {
        const int c = lane * 8 + 256 * i;
        wp[i] = row < Er && c < H ? __ldg((const uint4 *)(wr + c)) : make_uint4(0, 0, 0, 0);
    }
    /* the norm's weights of the values a thread holds below: weights too */
    float nv[RD_HOLD];
#pragma unroll
    for (int i = 0; i < RD_HOLD; i++) {
        const int c = tid + i * RD_NT;
        nv[i] = c < H ? nw[c] : 0.f;
    }
    qd_pdl_wait();
    qd_pdl_trigger();
    const float *hr = h + (size_t)t * H;
    /* the residual through L2 (the previous kernel may have run beside this one), its first
     * RD_HOLD values a thread kept for the norm below: one round trip to L2, not two */
    float hv[RD_HOLD];
    float ss = 0.f;
#pragma unroll
    for (int i = 0; i < RD_HOLD; i++) {
        const int c = tid + i * RD_NT;
        hv[i] = c < H ? __ldcg(hr + c) : 0.f;
        if (c < H) ss += hv[i] * hv[i];
    }
    for (int c = tid + RD_HOLD * RD_NT; c < H; c += RD_NT) {
        const float v = __ldcg(hr + c);
        ss += v * v;
    }
    for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    if (lane == 0) red[warp] = ss;
    __syncthreads();
    float tot = 0.f;
#pragma unroll
    for (int w = 0; w < RD_WARPS; w++) tot += red[w];
    const float inv = rsqrtf(tot / (float)H + eps);
#pragma unroll
    for (int i = 0; i < RD_HOLD; i++) {
        const int c = tid + i * RD_NT;
        if (c < H) {
            const float v = hv[i] * inv * (1.f + nv[i]);
            xf[c] = v;
            if (blockIdx.x == 0) x[(size_t)t * H + c] = qd_f2bf(v);
        }
    }
    for (int c = tid + RD_HOLD * RD_NT; c < H; c += RD_NT) {
        const float v = __ldcg(hr + c) * inv * (1.f + nw[c]);
        xf[c] = v;
        if (blockIdx.x == 0) x[(size_t)t * H + c] = qd_f2bf(v);
    }
    __syncthreads();
    if (row < Er) { /* in router_dot.cuh's order, as every other router product */
        float acc = 0.f;
#pragma unroll
        for (int i = 0; i < RD_PRE; i++) {
            const int c = lane * 8 + 256 * i;
            if (c < H) acc = qd_router_dot8(wp[i], *(const float4 *)(xf + c), *(const float4 *)(xf + c + 4), acc);
        }
        for (int c = lane * 8 + 256 * RD_PRE; c < H; c += 256)
            acc = qd_router_dot8(__ldg((const uint4 *)(wr + c)), *(const float4 *)(xf + c), *(const float4 *)(xf + c + 4),
                                 acc);
        acc = qd_router_warp_sum(acc);
        if (lane == 0) logits[(size_t)t * ldl + row] = acc;
    }
    /* publish the logits; the token's last block routes it (qd_count_in: after the barrier) */
    __syncthreads();
    if (tid == 0) is_last = qd_count_in(&cnt[t]) == (int)gridDim.x - 1;
    __syncthreads();
    if (!is_last) return;
    if (warp == 0)
        qd_moe_route_warp<V>(logits + (size_t)t * ldl, E, k, renorm, sel + (size_t)t * k, selw + (size_t)t * k);
    if (tid == 0) cnt[t] = 0; /* every block of the token has counted: ready for the next layer */
}

extern "C" int qd_cuda_moe_block_supported(int n, int H, int I, int I_s, int E, int k) {
    return n >= 1 && n <= QD_MOE_GRAPH_MAX_TOKENS && (int64_t)n * k <= QD_MOE_DECODE_MAX_PAIRS && H >= 8 &&
           H % 8 == 0 && H <= RD_MAX_H && I >= 8 && I % 8 == 0 && I_s >= 0 && I_s % 8 == 0 && k >= 1 && k <= 32 &&
           k <= E && E <= QD_MOE_MAX_EXPERTS;
}

extern "C" int qd_cuda_moe_block_preferred(int n, int H, int I, int I_s, int E, int k) {
    return n <= QD_MOE_BLOCK_MAX_TOKENS && qd_cuda_moe_block_supported(n, H, I, I_s, E, k);
}

static int misaligned(const void *p) { return ((uintptr_t)p & 15) != 0; }

extern "C" qd_status qd_cuda_moe_block(const qd_cuda_moe_block_args *a, void *stream) {
    if (!a) return qd_cuda_fail(QD_ERR_INVALID_ARG, "qd_cuda_moe_block: NULL args");
    const int has_sh = a->d_sh_gate_up != NULL || a->q_sh_gate_up != NULL;
    if (!qd_cuda_moe_block_supported(a->n, a->H, a->I, has_sh ? a->I_s : 0, a->E, a->k) || (has_sh && a->I_s < 8))
        return qd_cuda_fail(QD_ERR_INVALID_ARG, "qd_cuda_moe_block: shape outside qd_cuda_moe_block_supported");
    const int quant = a->q_gate_up != NULL;
    if (!a->d_h || !a->d_norm || !a->d_router || (!quant && (!a->d_gate_up || !a->d_down)) || !a->d_x ||
        !a->d_logits || !a->d_sel || !a->d_w || !a->d_route_cnt || !a->d_work ||
        (has_sh && ((!a->q_sh_gate_up && !a->d_sh_down) || !a->d_sh_act || !a->d_sh_out)))
        return qd_cuda_fail(QD_ERR_INVALID_ARG, "qd_cuda_moe_block: NULL pointer");
    if (misaligned(a->d_h) || misaligned(a->d_x) || misaligned(a->d_router) || misaligned(a->d_gate_up) ||
        misaligned(a->d_down) || misaligned(a->d_work) ||
        (has_sh && (misaligned(a->d_sh_gate_up) || misaligned(a->d_sh_down) || misaligned(a->d_sh_act) ||
                    misaligned(a->d_sh_out))))
        return qd_cuda_fail(QD_ERR_INVALID_ARG, "qd_cuda_moe_block: pointers must be 16-byte aligned");
    qd_cuda_moe_args ea = {}; /* members named one by one: C++ warns of the rest in a designated list */
    ea.n = a->n; ea.H = a->H; ea.I = a->I; ea.E = a->E; ea.k = a->k;
    ea.d_x = a->d_x; ea.d_sel = a->d_sel; ea.d_w = a->d_w; ea.d_gate_up = a->d_gate_up; ea.d_down = a->d_down;
    ea.d_y = a->d_h; ea.d_work = a->d_work; ea.q_gate_up = a->q_gate_up; ea.q_down = a->q_down;
    qd_moe_shared sh = {};
    sh.gate_up = a->d_sh_gate_up; sh.down = a->d_sh_down; sh.q_gate_up = a->q_sh_gate_up; sh.q_down = a->q_sh_down;
    sh.I = a->I_s; sh.act = a->d_sh_act; sh.out = a->d_sh_out; sh.gate = a->d_logits + a->E; sh.gate_ld = a->E + 1;
    if (!qd_moe_decode_takes(&ea, has_sh ? &sh : NULL))
        return qd_cuda_fail(QD_ERR_INVALID_ARG, "qd_cuda_moe_block: the experts' formats or shapes are outside "
                                                "the decode kernels");
    qd_moe_work w;
    qd_moe_layout(a->n, a->H, a->I, a->E, a->k, (char *)a->d_work, &w);
    cudaStream_t s = (cudaStream_t)stream;
    const int Er = a->E + has_sh, ldl = a->E + 1;
    const dim3 grid((unsigned)((Er + RD_WARPS - 1) / RD_WARPS), (unsigned)a->n);
    const size_t smem = (size_t)a->H * 4;
    qd_status st;
#define QD_RD_LAUNCH(V)                                                                                         \
    st = qd_launch_pdl(1, moe_router_decode<V>, grid, dim3(RD_NT), smem, s, (const float *)a->d_h, a->d_norm,   \
                       a->eps, a->H, a->d_router, Er, a->d_logits, ldl, a->d_x, a->E, a->k, a->renorm, a->d_sel, \
                       a->d_w, a->d_route_cnt)
    if (a->E <= 32) QD_RD_LAUNCH(1);
    else if (a->E <= 64) QD_RD_LAUNCH(2);
    else if (a->E <= 128) QD_RD_LAUNCH(4);
    else if (a->E <= 256) QD_RD_LAUNCH(8);
    else if (a->E <= 512) QD_RD_LAUNCH(16);
    else QD_RD_LAUNCH(32);
#undef QD_RD_LAUNCH
    if (st) return st;
    return qd_moe_decode(&ea, &w, has_sh ? &sh : NULL, 1, s);
}
