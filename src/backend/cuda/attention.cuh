/* Internal to the attention kernels (attention.cu: the table, decode and combine;
 * attention_prefill.cu: the flash-style prefill kernel; attention_span.cu: the
 * batch-invariant span kernel): their limits, the parameter block, the device
 * helpers they share and the per-(row, head) steps of the split-K kernels, whose
 * one definition is what makes the decode and span kernels give the same bits.
 * See attention.cu for the algorithm in words. */
#ifndef QD_CUDA_ATTENTION_CUH
#define QD_CUDA_ATTENTION_CUH

#include <cuda_runtime.h>
#include <math.h>

#include "backend/cuda/cuda_attn.h"
#include "backend/cuda/cuda_mma.cuh"
#include "backend/cuda/cuda_util.h"
#include "backend/cuda/cuda_common.cuh"

#define ATT_DEC_ROWS 16     /* spans of at most this many rows use the split-K decode kernel */
#define ATT_TILE 64         /* query rows of a prefill block; keys of a kv tile */
#define ATT_THREADS 128     /* 4 warps */
#define ATT_SPLIT_TARGET 512 /* (row, slice) pairs the decode grid aims for: a few waves of blocks */
#define ATT_MIN_SPLIT 128   /* shortest context slice of a decode block */
#define ATT_MAX_SPLITS 4096 /* slices of one row: bounds the combine kernel's shared weights (16 KB) */
#define ATT_INV_SLICES 16   /* invariant mode: at most this many context slices per row */
#define ATT_INV_PAIRS 2048  /* invariant mode: (row, slice) pairs of scratch per launch pair */
#define ATT_LOG2E 1.4426950408889634f

struct attn_params {
    int n_rows, nq, nkv, hd, gated, n_spans;
    const float *qg;
    const int32_t *row_slot, *row_pos, *spans, *block_tables;
    int mbps, bs;
    float inv_bs; /* 1 / bs, for the block index of a key */
    long long stride;
    const uint16_t *kc, *vc, *q;
    uint16_t *out;
    float *work;
    int split_len, nsp; /* decode: context slice length and slice count */
    int row0;           /* decode/combine/span: first row of this launch (blockIdx.x counts from it) */
    int row_end;        /* span: one past the last row of this launch */
    int work_rows;      /* rows the split-K scratch is laid out for (row r at r - row0) */
    int short_rows;     /* mixed batches: spans of at most this many rows are the decode kernels' */
};

/* ------------------------------------------------------------------ helpers */

__device__ __forceinline__ float sigmoidf_(float x) { return 1.0f / (1.0f + expf(-x)); }

/* ROWS rows of HDP bf16 from global (row i at src + i * row_stride) into shared
 * memory with row stride HDP + 8; rows >= n_valid and columns >= hd are zeroed. */
template <int HDP, int ROWS>
__device__ __forceinline__ void load_rows(uint16_t *dst, const uint16_t *src, long long row_stride, int n_valid,
                                          int hd) {
    constexpr int CPR = HDP / 8; /* 16-byte chunks per row */
    for (int c = threadIdx.x; c < ROWS * CPR; c += ATT_THREADS) {
        const int i = c / CPR, col = (c % CPR) * 8;
        const bool ok = i < n_valid && col < hd;
        qd_cp_async16(dst + i * (HDP + 8) + col, ok ? src + i * row_stride + col : src, ok);
    }
}

/* Keys key0 .. key0+63 of kv head kvh through the block table into a shared
 * tile [64][HDP + 8] (and the values into a second tile when dv is not null);
 * keys >= key_end and columns >= hd are zero-filled without being read. A
 * thread keeps one 16-byte column of rows RSTEP apart. The block-table reads
 * all go out before the first copy (cp.async is a compiler memory barrier, so
 * interleaving them would serialise one table latency per row); the block
 * index is a float reciprocal product corrected by one (keys < 2^24). Data
 * movement only: the thread count THREADS changes no result. */
template <int HDP, bool WITH_V, int THREADS = ATT_THREADS>
__device__ __forceinline__ void load_kv_tile(uint16_t *dk, uint16_t *dv, const uint16_t *ck, const uint16_t *cv,
                                             const int32_t *bt, int key0, int key_end, int kvh,
                                             const attn_params &p) {
    constexpr int CPR = HDP / 8;
    constexpr int RSTEP = THREADS / CPR;
    constexpr int NR = ATT_TILE / RSTEP;
    const int col = (threadIdx.x % CPR) * 8, row0 = threadIdx.x / CPR;
    const bool col_ok = col < p.hd;
    int blk[NR], off[NR];
#pragma unroll
    for (int i = 0; i < NR; i++) {
        const int key = key0 + row0 + i * RSTEP;
        int b = __float2int_rz((float)key * p.inv_bs);
        int o = key - b * p.bs;
        if (o >= p.bs) { b++; o -= p.bs; }
        if (o < 0) { b--; o += p.bs; }
        const bool ok = col_ok && key < key_end;
        blk[i] = ok ? __ldg(bt + b) : -1;
        off[i] = (o * p.nkv + kvh) * p.hd + col;
    }
#pragma unroll
    for (int i = 0; i < NR; i++) {
        const bool ok = blk[i] >= 0;
        const long long g = (long long)blk[i] * p.stride + off[i];
        const int d = (row0 + i * RSTEP) * (HDP + 8) + col;
        qd_cp_async16(dk + d, ok ? ck + g : ck, ok);
        if (WITH_V) qd_cp_async16(dv + d, ok ? cv + g : cv, ok);
    }
}

/* In a batch that mixes long and short spans, whether row r belongs to a short
 * span of at most short_rows rows (owned by the decode kernels) rather than a
 * long one (prefill or span kernel). Block-wide: every thread must call it. */
static __device__ bool row_in_short_span(const int32_t *spans, int n_spans, int short_rows, int r) {
    __shared__ int flag;
    if (threadIdx.x == 0) flag = 0;
    __syncthreads();
    for (int i = threadIdx.x; i < n_spans; i += blockDim.x) {
        const int row0 = spans[4 * i], cnt = spans[4 * i + 1];
        if (r >= row0 && r < row0 + cnt && cnt <= short_rows) flag = 1;
    }
    __syncthreads();
    return flag != 0;
}

/* Online-softmax update of one warp's 16 rows with scores s[NS][4] (base 2,
 * masked entries -inf): new row maxima m0/m1 (rows g, g+8), running sums l0/l1
 * (this thread's columns only), scores replaced by probabilities, and the
 * factors by which the caller must rescale its output accumulator. */
template <int NS>
__device__ __forceinline__ void softmax_update(float (&s)[NS][4], float &m0, float &m1, float &l0, float &l1,
                                               float &al0, float &al1) {
    float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
    for (int n = 0; n < NS; n++) {
        mx0 = fmaxf(mx0, fmaxf(s[n][0], s[n][1]));
        mx1 = fmaxf(mx1, fmaxf(s[n][2], s[n][3]));
    }
#pragma unroll
    for (int o = 1; o <= 2; o <<= 1) {
        mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, o));
        mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, o));
    }
    const float mn0 = fmaxf(m0, mx0), mn1 = fmaxf(m1, mx1);
    /* a row with no visible key yet keeps max -inf: subtract 0 so that exp2 gives 0, not NaN */
    const float mu0 = mn0 == -INFINITY ? 0.f : mn0, mu1 = mn1 == -INFINITY ? 0.f : mn1;
    al0 = exp2f(m0 - mu0);
    al1 = exp2f(m1 - mu1);
    m0 = mn0;
    m1 = mn1;
    float rs0 = 0.f, rs1 = 0.f;
#pragma unroll
    for (int n = 0; n < NS; n++) {
        s[n][0] = exp2f(s[n][0] - mu0);
        s[n][1] = exp2f(s[n][1] - mu0);
        s[n][2] = exp2f(s[n][2] - mu1);
        s[n][3] = exp2f(s[n][3] - mu1);
        rs0 += s[n][0] + s[n][1];
        rs1 += s[n][2] + s[n][3];
    }
    l0 = l0 * al0 + rs0;
    l1 = l1 * al1 + rs1;
}

/* Probabilities of n-tiles 2k, 2k+1 (C layout) as the A fragment of key step k. */
__device__ __forceinline__ void p_to_a(uint32_t (&a)[4], const float (&s0)[4], const float (&s1)[4]) {
    a[0] = qd_pack_bf2(s0[0], s0[1]);
    a[1] = qd_pack_bf2(s0[2], s0[3]);
    a[2] = qd_pack_bf2(s1[0], s1[1]);
    a[3] = qd_pack_bf2(s1[2], s1[3]);
}

/* --------------------------------------------------------------- decode */

/* The per-(row, head) arithmetic of the split-K kernels, shared by the decode
 * and the span kernel so that a (row, head) runs one instruction sequence in
 * both. An mma output element depends only on its A row, its B column and its
 * accumulator, so which (row, head) pairs fill the other 15 A rows never
 * matters; every function below is per A row as well. */

/* One warp's step over the 16-key piece kb..kb+15 (K, V: its rows in shared
 * memory) for the 16 A rows at sQa: scores, keys >= lim0 (row g) / lim1 (row
 * g + 8) masked, online softmax, o = o * alpha + P V for output columns part
 * dh of DS (o holds those columns only; the scores and the softmax are
 * computed whole by each part, the same bits). A piece entirely at or past a
 * row's limit leaves that row's state bitwise unchanged: its maximum stays
 * (fmaxf with -inf), alpha is exp2(0) = 1 when the maximum is finite and
 * multiplies zeros when it is -inf, its probabilities are exact zeros. */
template <int HDP, int DS>
__device__ __forceinline__ void piece_step(const uint16_t *sQa, const uint16_t *K, const uint16_t *V, int kb,
                                           int lim0, int lim1, int dh, float (&o)[HDP / 8 / DS][4], float &m0,
                                           float &m1, float &l0, float &l1) {
    constexpr int LDS = HDP + 8;
    const int lane = threadIdx.x % 32, tq = lane % 4;
    float s[2][4];
#pragma unroll
    for (int n = 0; n < 2; n++) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.f;
#pragma unroll
    for (int kk = 0; kk < HDP / 16; kk++) {
        uint32_t a[4], b[4];
        qd_ldsm_x4(a, sQa + (lane % 16) * LDS + kk * 16 + (lane / 16) * 8);
        qd_ldsm_x4(b, K + ((lane % 8) + (lane / 16) * 8) * LDS + kk * 16 + ((lane / 8) % 2) * 8);
        qd_mma_bf16(s[0], a, b[0], b[1]);
        qd_mma_bf16(s[1], a, b[2], b[3]);
    }
#pragma unroll
    for (int n = 0; n < 2; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            float v = s[n][e] * ATT_LOG2E;
            if (kb + n * 8 + 2 * tq + (e & 1) >= ((e >> 1) ? lim1 : lim0)) v = -INFINITY;
            s[n][e] = v;
        }
    float al0, al1;
    softmax_update<2>(s, m0, m1, l0, l1, al0, al1);
    uint32_t pa[4];
    p_to_a(pa, s[0], s[1]);
    const uint16_t *Vd = V + dh * (HDP / DS);
#pragma unroll
    for (int dp = 0; dp < HDP / 16 / DS; dp++) {
        uint32_t b[4];
        qd_ldsm_x4_t(b, Vd + ((lane % 8) + ((lane / 8) % 2) * 8) * LDS + dp * 16 + (lane / 16) * 8);
#pragma unroll
        for (int u = 0; u < 2; u++) {
            o[2 * dp + u][0] *= al0;
            o[2 * dp + u][1] *= al0;
            o[2 * dp + u][2] *= al1;
            o[2 * dp + u][3] *= al1;
        }
        qd_mma_bf16(o[2 * dp], pa, b[0], b[1]);
        qd_mma_bf16(o[2 * dp + 1], pa, b[2], b[3]);
    }
}

/* Merge, step 1: warp x of a group of 4 (pieces x of every tile) stores its
 * row statistics (wm, wl at [x * 16 + row]; part 0 of DS only, the parts'
 * are equal) and its accumulator's columns of part dh (wo: [16][HDP]). */
template <int HDP, int DS>
__device__ __forceinline__ void warp_state_store(float *wm, float *wl, float *wo, int x, int dh,
                                                 const float (&o)[HDP / 8 / DS][4], float m0, float m1, float l0,
                                                 float l1) {
    const int lane = threadIdx.x % 32, g = lane / 4, tq = lane % 4;
#pragma unroll
    for (int s = 1; s <= 2; s <<= 1) {
        l0 += __shfl_xor_sync(0xffffffffu, l0, s);
        l1 += __shfl_xor_sync(0xffffffffu, l1, s);
    }
    if (tq == 0 && dh == 0) {
        wm[x * 16 + g] = m0;
        wm[x * 16 + g + 8] = m1;
        wl[x * 16 + g] = l0;
        wl[x * 16 + g + 8] = l1;
    }
#pragma unroll
    for (int n = 0; n < HDP / 8 / DS; n++) {
        const int d = dh * (HDP / DS) + n * 8 + 2 * tq;
        *(float2 *)(wo + g * HDP + d) = make_float2(o[n][0], o[n][1]);
        *(float2 *)(wo + (g + 8) * HDP + d) = make_float2(o[n][2], o[n][3]);
    }
}

/* Merge, step 2, one thread per (warp ww, row i): warp ww's weight for row i
 * from the common maximum; the thread of warp 0 also sums the row's l in warp
 * order. Warp 0 saw the slice's first key, so M is finite for a row that has
 * a key in the slice (the others' results are never stored). */
__device__ __forceinline__ void merge_weights(const float *wm, const float *wl, float *wf, float *rowm, float *rowl,
                                              int ww, int i) {
    float M = -INFINITY;
#pragma unroll
    for (int x = 0; x < 4; x++) M = fmaxf(M, wm[x * 16 + i]);
    const float mw = wm[ww * 16 + i];
    wf[ww * 16 + i] = mw == -INFINITY ? 0.f : exp2f(mw - M);
    if (ww == 0) {
        float L = 0.f;
#pragma unroll
        for (int x = 0; x < 4; x++)
            if (wm[x * 16 + i] != -INFINITY) L += wl[x * 16 + i] * exp2f(wm[x * 16 + i] - M);
        rowm[i] = M;
        rowl[i] = L;
    }
}

/* Merge, step 3: element d of row i (acc: the 4 warps' [16][HDP] accumulators
 * in warp order), then either the output (one slice) or the slice's partial. */
template <int HDP>
__device__ __forceinline__ void merge_store(const attn_params &p, const float *wf, const float *acc,
                                            const float *rowm, const float *rowl, int i, int d, int r, int h,
                                            int sl) {
    float v = 0.f;
#pragma unroll
    for (int x = 0; x < 4; x++) v += wf[x * 16 + i] * acc[(x * 16 + i) * HDP + d];
    const int hd = p.hd;
    const long long rh = (long long)r * p.nq + h;
    if (p.nsp == 1) {
        v /= rowl[i];
        if (p.gated) v *= sigmoidf_(p.qg[rh * 2 * hd + hd + d]);
        p.out[rh * hd + d] = qd_f2bf(v);
    } else {
        float *pwo = p.work, *pml = p.work + (long long)p.work_rows * p.nq * p.nsp * hd;
        const long long e = ((long long)(r - p.row0) * p.nq + h) * p.nsp + sl;
        pwo[e * hd + d] = v;
        if (d == 0) {
            pml[2 * e] = rowm[i];
            pml[2 * e + 1] = rowl[i];
        }
    }
}

/* K/V tiles in flight per split-K block (decode and span kernels). */
#define DEC_STAGES 3
/* The span kernel: groups of 16 (row, head) pairs per block, output-column parts. */
#define SPAN_NG 2
#define SPAN_AR (16 * SPAN_NG)
#define SPAN_DS(HDP) ((HDP) >= 256 ? 2 : 1)
#define SPAN_THREADS(HDP) (ATT_THREADS * SPAN_NG * SPAN_DS(HDP))

/* Launchers of the kernels in the other files (instantiated for HDP = 32, 64, 128, 256). */
template <int HDP>
qd_status attn_launch_prefill(const qd_cuda_attn_args *a, const attn_params &p, int skip_short, cudaStream_t st);
/* The span kernel's shared-memory size, set once per call of qd_cuda_attn. */
template <int HDP> qd_status attn_span_setup(void);
/* Span kernel over the long spans' rows among p.row0 .. p.row_end - 1. */
template <int HDP> qd_status attn_launch_span(const qd_cuda_attn_args *a, const attn_params &p, cudaStream_t st);

#endif
