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
#include "backend/cuda/gdn_decode.cuh"

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

        dec_token<DK>(s, ks, qs, a, bt,
                      make_float4(qd_bf2f((uint16_t)(vb.x & 0xffff)), qd_bf2f((uint16_t)(vb.x >> 16)),
                                  qd_bf2f((uint16_t)(vb.y & 0xffff)), qd_bf2f((uint16_t)(vb.y >> 16))),
                      Sout, dv, o + row * dv + tile * DEC_BV, red_m, red_o);
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
