/* GDN decode: one token for each of many sequences (spec 3.3 step 6, 3.6).
 *
 * Per (sequence b, value head h) with key head j = h / (hv/hk), state S [dk][dv]:
 *   a = exp(g);  m = a S^T k;  d = beta (v - m);  S' = a S + k d^T;  o = S'^T q.
 * Columns of S are independent (column e only meets v[e], d[e], o[e]), so a
 * block owns a tile of 32 columns of one head's state. The work is two small
 * reductions over dk per column, so the kernel is bound by moving the state:
 * 2 * dk * dv * 4 bytes per (b, h). The fast path reads every state element
 * exactly once into registers (16-byte streaming loads, all issued before the
 * first use), and writes it exactly once. */
#include <cuda_runtime.h>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_pdl.cuh"
#include "backend/cuda/cuda_util.h"

#define DEC_NT 256 /* threads per block of the fast path */
#define DEC_BV 32  /* state columns per block: 8 lanes x float4 = one 128-byte line per row */
#define DEC_LPR (DEC_BV / 4)       /* lanes per state row */
#define DEC_RPP (DEC_NT / DEC_LPR) /* rows covered by the block in one pass */

/* The verify spans' token counts, by value: token t exists for sequences b < count[t]
 * (the spans come longest first). */
typedef struct dec_tok_counts {
    int count[QD_GDN_MAX_TOKENS];
} dec_tok_counts;

/* Fast path: block (tile, h, b); thread (rg, cg) holds rows rg, rg+32, ... of
 * the four columns cg*4..cg*4+3 of the tile, DK/32 float4 registers in all.
 * n_tok tokens of sequence b in turn (a verify span): the state stays in the
 * registers between them, is read once and written after each token (to the slot
 * that token's rollback needs); token t's row and output slot are at t * tok_stride
 * + b of rowmap / slot_out. Each token's arithmetic is a one-token launch's, so the
 * states and outputs are those of n_tok launches bit for bit. SPAN false: one token
 * (n_tok 1, tok_stride unused), compiled apart so that the decode kernel keeps its
 * registers (40 at DK = 128, against 64 for spans: more blocks resident at large B). */
template <int DK, bool SPAN>
__global__ void __launch_bounds__(DEC_NT)
gdn_decode_fast(const uint16_t *q, const uint16_t *k, const uint16_t *v, const float *g, const float *beta, float *state,
                const int32_t *__restrict__ slot, const int32_t *__restrict__ slot_out, const int32_t *__restrict__ rowmap,
                uint16_t *__restrict__ o, int hk, int hv, int dv, int n_tok, int tok_stride, dec_tok_counts tc) {
    constexpr int RPT = DK / DEC_RPP; /* rows per thread */
    const int tile = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
    const int j = h / (hv / hk);
    const int tid = threadIdx.x, cg = tid % DEC_LPR, rg = tid / DEC_LPR;
    const int warp = tid / 32, lane = tid % 32;
    __shared__ float ks[DK], qs[DK];
    __shared__ float4 red_m[DEC_NT / 32][DEC_LPR], red_o[DEC_NT / 32][DEC_LPR];

    const int64_t sl = slot ? (int64_t)slot[b] : (int64_t)b;
    /* one token: its row and output slot known before the loads, as they always were */
    const int64_t r1 = SPAN ? 0 : rowmap ? (int64_t)rowmap[b] : (int64_t)b;
    const int64_t so1 = SPAN ? 0 : slot_out ? (int64_t)slot_out[b] : sl;
    const float *S = state + ((size_t)sl * hv + h) * DK * dv + tile * DEC_BV + cg * 4;
    /* The state loads go first: they are the long-latency traffic, and none
     * depends on anything else. Streaming (evict-first) since each line is
     * touched once per step. */
    float4 s[RPT];
#pragma unroll
    for (int p = 0; p < RPT; p++) s[p] = __ldcs((const float4 *)(S + (size_t)(rg + DEC_RPP * p) * dv));
    /* q, k, v and the gates come from the previous kernel (cuda_pdl.cuh: the state was
     * last written a step ago, so its loads above may overlap that kernel's tail); they
     * are read through L2 (ld.cg), never the read-only path, which may hold older bits */
    qd_pdl_wait();
    qd_pdl_trigger();

    const int tokens = SPAN ? n_tok : 1;
    for (int t = 0; t < tokens && (!SPAN || b < tc.count[t]); t++) { /* the same t bound for the whole block */
        const size_t at = (size_t)t * tok_stride + (size_t)b;
        const int64_t r = !SPAN ? r1 : rowmap ? (int64_t)rowmap[at] : (int64_t)b; /* batch row of the token */
        const int64_t so = !SPAN ? so1 : slot_out ? (int64_t)slot_out[at] : sl;
        float *Sout = state + ((size_t)so * hv + h) * DK * dv + tile * DEC_BV + cg * 4;
        /* ks / qs of the previous token were last read before its final barrier */
        for (int i = tid; i < DK; i += DEC_NT) {
            ks[i] = qd_bf2f(__ldcg(k + ((size_t)r * hk + j) * DK + i));
            qs[i] = qd_bf2f(__ldcg(q + ((size_t)r * hk + j) * DK + i));
        }
        const size_t row = (size_t)r * hv + h;
        const float a = expf(__ldcg(g + row));
        const float bt = __ldcg(beta + row);
        const uint2 vb = __ldcg((const uint2 *)(v + row * dv + tile * DEC_BV + cg * 4));
        __syncthreads();

        /* m = a S^T k: partial over this thread's rows, then over the 4 row groups
         * of the warp (lanes 8 apart), then over the warps through shared memory. */
        float4 m = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
        for (int p = 0; p < RPT; p++) {
            const float kk = ks[rg + DEC_RPP * p];
            m.x = fmaf(s[p].x, kk, m.x); m.y = fmaf(s[p].y, kk, m.y);
            m.z = fmaf(s[p].z, kk, m.z); m.w = fmaf(s[p].w, kk, m.w);
        }
#pragma unroll
        for (int off = DEC_LPR; off < 32; off *= 2) {
            m.x += __shfl_xor_sync(0xffffffffu, m.x, off); m.y += __shfl_xor_sync(0xffffffffu, m.y, off);
            m.z += __shfl_xor_sync(0xffffffffu, m.z, off); m.w += __shfl_xor_sync(0xffffffffu, m.w, off);
        }
        if (lane < DEC_LPR) red_m[warp][cg] = m;
        __syncthreads();
        m = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
        for (int w = 0; w < DEC_NT / 32; w++) {
            const float4 rr = red_m[w][cg];
            m.x += rr.x; m.y += rr.y; m.z += rr.z; m.w += rr.w;
        }
        /* d = beta (v - a m); the decay of S is folded into the update below. */
        float4 d;
        d.x = bt * (qd_bf2f((uint16_t)(vb.x & 0xffff)) - a * m.x);
        d.y = bt * (qd_bf2f((uint16_t)(vb.x >> 16)) - a * m.y);
        d.z = bt * (qd_bf2f((uint16_t)(vb.y & 0xffff)) - a * m.z);
        d.w = bt * (qd_bf2f((uint16_t)(vb.y >> 16)) - a * m.w);

        /* S' = a S + k d^T, written back at once (and kept for the next token); o = S'^T q
         * from the new values. */
        float4 oa = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
        for (int p = 0; p < RPT; p++) {
            const int rr = rg + DEC_RPP * p;
            const float kk = ks[rr], qq = qs[rr];
            float4 n;
            n.x = fmaf(kk, d.x, a * s[p].x); n.y = fmaf(kk, d.y, a * s[p].y);
            n.z = fmaf(kk, d.z, a * s[p].z); n.w = fmaf(kk, d.w, a * s[p].w);
            __stcs((float4 *)(Sout + (size_t)rr * dv), n);
            s[p] = n;
            oa.x = fmaf(n.x, qq, oa.x); oa.y = fmaf(n.y, qq, oa.y);
            oa.z = fmaf(n.z, qq, oa.z); oa.w = fmaf(n.w, qq, oa.w);
        }
#pragma unroll
        for (int off = DEC_LPR; off < 32; off *= 2) {
            oa.x += __shfl_xor_sync(0xffffffffu, oa.x, off); oa.y += __shfl_xor_sync(0xffffffffu, oa.y, off);
            oa.z += __shfl_xor_sync(0xffffffffu, oa.z, off); oa.w += __shfl_xor_sync(0xffffffffu, oa.w, off);
        }
        if (lane < DEC_LPR) red_o[warp][cg] = oa;
        __syncthreads();
        if (tid < DEC_LPR) {
            float4 tt = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
            for (int w = 0; w < DEC_NT / 32; w++) {
                const float4 rr = red_o[w][tid];
                tt.x += rr.x; tt.y += rr.y; tt.z += rr.z; tt.w += rr.w;
            }
            uint2 ob;
            ob.x = qd_pack_bf2(tt.x, tt.y);
            ob.y = qd_pack_bf2(tt.z, tt.w);
            *(uint2 *)(o + row * dv + tile * DEC_BV + tid * 4) = ob;
        }
    }
}

/* Any dk, dv: one thread per state column, two passes over the column (the
 * second mostly from L2). Kept simple; shapes of the released models take the
 * fast path. */
__global__ void __launch_bounds__(128)
gdn_decode_generic(const uint16_t *__restrict__ q, const uint16_t *__restrict__ k, const uint16_t *__restrict__ v,
                   const float *__restrict__ g, const float *__restrict__ beta, float *state,
                   const int32_t *__restrict__ slot, const int32_t *__restrict__ slot_out,
                   const int32_t *__restrict__ rowmap, uint16_t *__restrict__ o, int hk, int hv, int dk, int dv) {
    extern __shared__ float sm[]; /* k then q, dk floats each */
    const int h = blockIdx.y, b = blockIdx.z;
    const int64_t r = rowmap ? (int64_t)rowmap[b] : (int64_t)b;
    const int j = h / (hv / hk);
    const int e = blockIdx.x * blockDim.x + threadIdx.x;
    float *ks = sm, *qs = sm + dk;
    for (int i = threadIdx.x; i < dk; i += blockDim.x) {
        ks[i] = qd_bf2f(k[((size_t)r * hk + j) * dk + i]);
        qs[i] = qd_bf2f(q[((size_t)r * hk + j) * dk + i]);
    }
    __syncthreads();
    if (e >= dv) return;
    const int64_t sl = slot ? (int64_t)slot[b] : (int64_t)b, so = slot_out ? (int64_t)slot_out[b] : sl;
    const float *S = state + ((size_t)sl * hv + h) * dk * dv + e;
    float *Sout = state + ((size_t)so * hv + h) * dk * dv + e;
    const size_t row = (size_t)r * hv + h;
    const float a = expf(g[row]);
    float m = 0.f;
    for (int i = 0; i < dk; i++) m = fmaf(S[(size_t)i * dv], ks[i], m);
    const float d = beta[row] * (qd_bf2f(v[row * dv + e]) - a * m);
    float oa = 0.f;
    for (int i = 0; i < dk; i++) {
        const float n = fmaf(ks[i], d, a * S[(size_t)i * dv]);
        Sout[(size_t)i * dv] = n;
        oa = fmaf(n, qs[i], oa);
    }
    o[row * dv + e] = qd_f2bf(oa);
}

extern "C" qd_status qd_cuda_gdn_decode(const qd_cuda_gdn_decode_args *a, void *stream) {
    if (!a || a->n_seq < 0 || a->hk <= 0 || a->hv <= 0 || a->hv % a->hk || a->dk <= 0 || a->dv <= 0)
        return qd_cuda_fail(QD_ERR_INVALID_ARG, "gdn_decode: bad dimensions");
    if (a->n_seq == 0) return QD_OK;
    if (a->n_seq > 65535) return qd_cuda_fail(QD_ERR_INVALID_ARG, "gdn_decode: more than 65535 sequences");
    if (!a->d_q || !a->d_k || !a->d_v || !a->d_g || !a->d_beta || !a->d_state || !a->d_o)
        return qd_cuda_fail(QD_ERR_INVALID_ARG, "gdn_decode: null pointer");
    const int n_tok = a->n_tok > 0 ? a->n_tok : 1;
    if (n_tok > QD_GDN_MAX_TOKENS || (n_tok > 1 && (!a->tok_count || !a->d_row || !a->d_slot_out)))
        return qd_cuda_fail(QD_ERR_INVALID_ARG, "gdn_decode: token spans need their counts, rows and output slots");
    dec_tok_counts tc;
    for (int t = 0; t < QD_GDN_MAX_TOKENS; t++) tc.count[t] = t >= n_tok ? 0 : n_tok == 1 ? a->n_seq : a->tok_count[t];
    for (int t = 0; t < n_tok; t++)
        if (tc.count[t] > a->n_seq || (t > 0 && tc.count[t] > tc.count[t - 1]))
            return qd_cuda_fail(QD_ERR_INVALID_ARG, "gdn_decode: token counts must fall from at most n_seq");
    cudaStream_t st = (cudaStream_t)stream;
    /* The fast path's 16-byte state accesses and 8-byte v/o accesses need
     * aligned bases; cudaMalloc gives 256 bytes, sliced pools may not. */
    const int aligned = ((uintptr_t)a->d_state % 16 == 0) && ((uintptr_t)a->d_v % 8 == 0) &&
                        ((uintptr_t)a->d_o % 8 == 0);
    const int fast = aligned && a->dv % DEC_BV == 0 && (a->dk == 64 || a->dk == 128 || a->dk == 256);
    if (fast) {
        const dim3 grid(a->dv / DEC_BV, a->hv, a->n_seq);
        /* [span][dk 64, 128, 256]: one token, or a verify span's tokens */
        static decltype(&gdn_decode_fast<64, false>) const kernels[2][3] = {
            {gdn_decode_fast<64, false>, gdn_decode_fast<128, false>, gdn_decode_fast<256, false>},
            {gdn_decode_fast<64, true>, gdn_decode_fast<128, true>, gdn_decode_fast<256, true>}};
        return qd_launch_pdl(a->early_state, kernels[n_tok > 1][a->dk == 64 ? 0 : a->dk == 128 ? 1 : 2], grid,
                             dim3(DEC_NT), 0, st, a->d_q, a->d_k, a->d_v, a->d_g, a->d_beta, a->d_state, a->d_slot,
                             a->d_slot_out, a->d_row, a->d_o, a->hk, a->hv, a->dv, n_tok, a->tok_stride, tc);
    }
    const size_t smem = 2 * (size_t)a->dk * sizeof(float);
    if (smem > 48 * 1024) return qd_cuda_fail(QD_ERR_UNSUPPORTED, "gdn_decode: dk too large");
    /* other shapes: a launch per token position, the sequences that have it */
    for (int t = 0; t < n_tok && tc.count[t] > 0; t++) {
        const size_t at = (size_t)t * (size_t)a->tok_stride;
        const int32_t *slot_in = t == 0 ? a->d_slot : a->d_slot_out + at - a->tok_stride; /* the state t - 1 wrote */
        const dim3 grid((a->dv + 127) / 128, a->hv, tc.count[t]);
        gdn_decode_generic<<<grid, 128, smem, st>>>(a->d_q, a->d_k, a->d_v, a->d_g, a->d_beta, a->d_state, slot_in,
                                                    a->d_slot_out ? a->d_slot_out + at : NULL,
                                                    a->d_row ? a->d_row + at : NULL, a->d_o, a->hk, a->hv, a->dk, a->dv);
        QD_CUDA_CHECK_LAUNCH("gdn_decode");
    }
    return QD_OK;
}
