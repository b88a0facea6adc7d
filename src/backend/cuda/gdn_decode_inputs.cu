/* One-token GDN decode that makes its own inputs (cuda_gdn.h, qd_cuda_gdn_decode_inputs): the
 * conv1d + SiLU of the projection, the L2 norms of q and k and the gates of gdn_inputs.cu, then
 * the delta rule of gdn_decode.cu, in one launch. At one token a sequence the inputs kernel is
 * a few memory latencies long with almost no bytes; here that work runs inside the decode
 * kernel, and q, k, v and the gates never go through memory.
 *
 * The decode grid is (state tile, value head, sequence). The blocks of one key head (its
 * value heads' tiles: dv / 32 x hv / hk blocks) form a cluster. Each block makes the conv
 * outputs of a share of the key head's 2 dk q and k channels and the 32 v channels of its own
 * tile, so every conv state channel has exactly one writer; after a cluster barrier each block
 * reads the whole q and k head from the others' shared memory, and normalises them itself.
 * Every value is computed by the expressions gdn_inputs.cu and gdn_decode.cu use
 * (gdn_inputs.cuh, gdn_decode.cuh), rounded to bf16 where those kernels store bf16, so the
 * outputs and both states are theirs bit for bit. */
#include <cooperative_groups.h>
#include <stdint.h>

#include "backend/cuda/cuda_gdn.h"
#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/cuda_pdl.cuh"
#include "backend/cuda/cuda_util.h"
#include "backend/cuda/gdn_decode.cuh"
#include "backend/cuda/gdn_inputs.cuh"

namespace cgrp = cooperative_groups;

#define GDI_K 4          /* conv width of the released models */
#define GDI_QK_MAX 128   /* q / k channels a block makes at most: threads 0..127 */
#define GDI_V0 128       /* the block's 32 v channels: threads 128..159 */
#define GDI_MAX_CLUSTER 16
/* sequences a launch: past 16 the two kernels are faster (35B-A3B decode at 64 sequences, 2,289 against
 * 2,331 tok/s on an H100, bench/RESULTS.md session 45), where the state traffic outweighs a launch */
#define GDI_MAX_SEQS 16

typedef struct gdi_params {
    const float *x; /* [n] projection rows at stride xs: the q | k | v conv inputs first */
    int64_t xs;
    const float *a, *b; /* [n] rows of hv at stride abs_: the gates' inputs */
    int64_t abs_;
    const float *w;                 /* [C][GDI_K] conv weights, C = 2 hk dk + hv dv */
    const float *A_log, *dt_bias;   /* [hv] */
    float *conv;                    /* [slots][C][GDI_K - 1] conv state pool */
    const int32_t *spans, *row_span; /* the step's one-row spans: conv slot of row b */
    float *state;                   /* [slots][hv][dk][dv] delta-rule state pool */
    const int32_t *slot, *slot_out; /* [n] the state slot read and written (NULL: b; in place) */
    uint16_t *o;                    /* [n][hv][dv] bf16 */
    int hk, hv, dv;
    int per; /* q / k channels a block makes: ceil(2 dk / cluster size) */
} gdi_params;

template <int DK>
__global__ void __launch_bounds__(DEC_NT) gdn_decode_inputs_kernel(const __grid_constant__ gdi_params p) {
    constexpr int RPT = DK / DEC_RPP;
    const int tile = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
    const int R = p.hv / p.hk, j = h / R;
    const int tid = threadIdx.x, cg = tid % DEC_LPR, rg = tid / DEC_LPR, warp = tid / 32, lane = tid % 32;
    const int key_dim = p.hk * DK, C = 2 * key_dim + p.hv * p.dv;
    cgrp::cluster_group cluster = cgrp::this_cluster();
    const int rank = (int)cluster.block_rank();
    __shared__ float part[GDI_QK_MAX]; /* this block's share of the head's q | k conv outputs */
    __shared__ float ks[DK], qs[DK], vs[DEC_BV];
    __shared__ float gate[2]; /* exp(g), beta */
    __shared__ float4 red_m[DEC_NT / 32][DEC_LPR], red_o[DEC_NT / 32][DEC_LPR];

    /* Before the wait only what no kernel of this step writes (cuda_pdl.cuh): the state tile,
     * the conv weights, the conv state (written by this layer a step ago) and the step's maps. */
    const int64_t sl = p.slot ? (int64_t)p.slot[b] : (int64_t)b;
    const int64_t so = p.slot_out ? (int64_t)p.slot_out[b] : sl;
    const float *S = p.state + ((size_t)sl * p.hv + h) * DK * p.dv + tile * DEC_BV + cg * 4;
    float4 s[RPT];
#pragma unroll
    for (int q = 0; q < RPT; q++) s[q] = __ldcs((const float4 *)(S + (size_t)(rg + DEC_RPP * q) * p.dv));
    float *cst = p.conv + (size_t)__ldcg(p.spans + 4 * __ldcg(p.row_span + b) + 3) * C * (GDI_K - 1);
    int c = -1; /* this thread's conv channel */
    const int i_qk = rank * p.per + tid;
    if (tid < p.per && i_qk < 2 * DK) c = i_qk < DK ? j * DK + i_qk : key_dim + j * DK + (i_qk - DK);
    else if (tid >= GDI_V0 && tid < GDI_V0 + DEC_BV) c = 2 * key_dim + h * p.dv + tile * DEC_BV + (tid - GDI_V0);
    gi_window<GDI_K> win;
    if (c >= 0) gi_window_load<GDI_K>(win, p.w, cst + (size_t)c * (GDI_K - 1), 0, c);
    const bool gates = tid == DEC_NT - 1;
    const float A_log = gates ? p.A_log[h] : 0.f, dt_bias = gates ? p.dt_bias[h] : 0.f;
    qd_pdl_wait(); /* the projection comes from the previous kernel */
    qd_pdl_trigger();

    if (c >= 0) { /* the one-row span of row b: position 0, the conv state moved on by its only writer */
        const float u = gi_conv_win<GDI_K>(win, p.x, p.xs, cst + (size_t)c * (GDI_K - 1), b, 0, c, true);
        if (tid < GDI_QK_MAX) part[tid] = u;
        else vs[tid - GDI_V0] = qd_bf2f(qd_f2bf(u));
    }
    if (gates) {
        float g, bt;
        gi_gates(__ldcg(p.a + (size_t)b * p.abs_ + h), __ldcg(p.b + (size_t)b * p.abs_ + h), A_log, dt_bias, &g,
                 &bt);
        gate[0] = expf(g);
        gate[1] = bt;
    }
    cluster.sync(); /* every block's share of q and k is in its shared memory */
    if (warp < 2) { /* warp 0 the q head, warp 1 the k head: gdn_inputs' lanes, sums and rounding */
        float val[DK / 32];
        float ss = 0.f;
#pragma unroll
        for (int m = 0; m < DK / 32; m++) {
            const int i = warp * DK + lane + 32 * m;
            val[m] = *cluster.map_shared_rank(part + i % p.per, i / p.per);
            ss = gi_sq_acc(ss, val[m]);
        }
        const float sc = gi_head_scale(ss, warp == 0, DK);
        float *dst = warp == 0 ? qs : ks;
#pragma unroll
        for (int m = 0; m < DK / 32; m++) dst[lane + 32 * m] = qd_bf2f(qd_f2bf(val[m] * sc));
    }
    /* this block has read the others' shares; it waits for theirs of its own before it exits */
    asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory");
    __syncthreads();
    float *Sout = p.state + ((size_t)so * p.hv + h) * DK * p.dv + tile * DEC_BV + cg * 4;
    dec_token<DK>(s, ks, qs, gate[0], gate[1], make_float4(vs[cg * 4], vs[cg * 4 + 1], vs[cg * 4 + 2], vs[cg * 4 + 3]),
                  Sout, p.dv, p.o + ((size_t)b * p.hv + h) * p.dv + tile * DEC_BV, red_m, red_o);
    asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory");
}

/* blocks of a key head's cluster, or 0 where the shapes are not this kernel's */
static int cluster_size(const qd_cuda_gdn_in_args *in, const qd_cuda_gdn_decode_args *dec) {
    if (!in || !dec || in->K != GDI_K || !in->decode_only || in->n_ver != 0 || in->n < 1 || in->n > GDI_MAX_SEQS ||
        dec->n_seq != in->n || dec->n_tok > 1 || dec->d_row)
        return 0;
    if (in->hk != dec->hk || in->hv != dec->hv || in->dk != dec->dk || in->dv != dec->dv || dec->hk < 1 ||
        dec->hv % dec->hk || dec->dv % DEC_BV || (dec->dk != 64 && dec->dk != 128 && dec->dk != 256))
        return 0;
    const int cs = dec->dv / DEC_BV * (dec->hv / dec->hk);
    if (cs > GDI_MAX_CLUSTER || (2 * dec->dk + cs - 1) / cs > GDI_QK_MAX) return 0;
    if ((uintptr_t)dec->d_state % 16 || (uintptr_t)dec->d_o % 8) return 0;
    return cs;
}

extern "C" int qd_cuda_gdn_decode_inputs_supported(const qd_cuda_gdn_in_args *in,
                                                   const qd_cuda_gdn_decode_args *dec) {
    return cluster_size(in, dec) > 0;
}

template <int DK>
static qd_status launch(const gdi_params &p, dim3 grid, dim3 cluster, cudaStream_t st) {
    if (cluster.x * cluster.y > 8) { /* past the portable size: asked for once */
        static int allowed = -1;
        if (allowed < 0)
            allowed = cudaFuncSetAttribute(gdn_decode_inputs_kernel<DK>,
                                           cudaFuncAttributeNonPortableClusterSizeAllowed, 1) == cudaSuccess;
        if (!allowed) {
            (void)cudaGetLastError();
            return qd_cuda_fail(QD_ERR_UNSUPPORTED, "gdn_decode_inputs: clusters of more than 8 blocks refused");
        }
    }
    return qd_launch_pdl_cluster(1, gdn_decode_inputs_kernel<DK>, grid, dim3(DEC_NT), cluster, 0, st, p);
}

extern "C" qd_status qd_cuda_gdn_decode_inputs(const qd_cuda_gdn_in_args *in, const qd_cuda_gdn_decode_args *dec,
                                               void *stream) {
    const int cs = cluster_size(in, dec);
    if (!cs)
        return qd_cuda_fail(QD_ERR_INVALID_ARG,
                            "gdn_decode_inputs: shapes outside qd_cuda_gdn_decode_inputs_supported");
    if (!in->d_x || !in->d_a || !in->d_b || !in->d_w || !in->d_A_log || !in->d_dt_bias || !in->d_state ||
        !in->d_spans || !in->d_row_span || !dec->d_state || !dec->d_o)
        return qd_cuda_fail(QD_ERR_INVALID_ARG, "gdn_decode_inputs: null pointer");
    gdi_params p = {};
    p.x = in->d_x; p.xs = in->x_stride; p.a = in->d_a; p.b = in->d_b; p.abs_ = in->ab_stride;
    p.w = in->d_w; p.A_log = in->d_A_log; p.dt_bias = in->d_dt_bias; p.conv = in->d_state;
    p.spans = in->d_spans; p.row_span = in->d_row_span;
    p.state = dec->d_state; p.slot = dec->d_slot; p.slot_out = dec->d_slot_out; p.o = dec->d_o;
    p.hk = dec->hk; p.hv = dec->hv; p.dv = dec->dv; p.per = (2 * dec->dk + cs - 1) / cs;
    const int T = dec->dv / DEC_BV, R = dec->hv / dec->hk;
    const dim3 grid((unsigned)T, (unsigned)dec->hv, (unsigned)dec->n_seq), cluster((unsigned)T, (unsigned)R, 1);
    cudaStream_t st = (cudaStream_t)stream;
    return dec->dk == 64 ? launch<64>(p, grid, cluster, st)
           : dec->dk == 128 ? launch<128>(p, grid, cluster, st)
                            : launch<256>(p, grid, cluster, st);
}
