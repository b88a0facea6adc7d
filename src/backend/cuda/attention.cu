/* Gated attention, step 2 (spec 5.2): causal GQA attention of every query row
 * over its sequence's paged bf16 KV cache, softmax in fp32, output gate,
 * bf16 output. Three kernels, all on the tensor cores (mma.sync m16n8k16, bf16
 * operands, fp32 accumulation), chosen by the table in qd_cuda_attn:
 *
 *   prefill  flash-attention style: a block owns 64 consecutive query rows of
 *            one span and one query head (16 rows per warp) and walks the keys
 *            0..last row's position in tiles of 64 with an online softmax; the
 *            diagonal tiles are masked causally.
 *   decode   split-K (flash-decoding) for spans of at most ATT_DEC_ROWS rows: a
 *            block owns one row, the (up to 16) query heads of one kv head as
 *            the 16 rows of the mma, and one slice of the context; the 4 warps
 *            take interleaved 16-key pieces of each 64-key tile and are merged
 *            at the end. Slices of one row are combined by a second kernel
 *            (partials in d_work) unless a single slice covers the context.
 *   span     batch-invariant mode only, spans of more than
 *            QD_CUDA_ATTN_INV_SPAN_ROWS rows: the decode kernel's arithmetic
 *            with (row, head) pairs of many rows as the mma's A rows (below).
 *
 * Table: a batch whose spans all have at most ATT_DEC_ROWS rows runs the decode
 * kernels only; a single longer span runs the prefill kernel only; a batch with
 * several spans, one of them longer, runs both, each skipping the other's spans.
 *
 * Batch-invariant mode (args.invariant): every row runs the decode kernels'
 * arithmetic, whatever its span, with a slice plan that depends on max_ctx
 * alone (invariant_plan), so that a row's bits depend only on its query and
 * its keys: not on the batch, its span or where its prompt was cut. Rows of
 * spans longer than QD_CUDA_ATTN_INV_SPAN_ROWS go through the span kernel,
 * which runs that same per-(row, head) instruction sequence with (row, head)
 * pairs of many rows as the A rows of one mma, sharing each K/V tile among
 * 32 pairs instead of one row's heads; the others through the decode kernel.
 * Large batches go through in groups of rows, one (decode, span, combine)
 * launch set each, so that the split-K scratch stays bounded. The combine
 * sums a row's slices in one fixed order in both modes (no float atomics),
 * so results never vary from run to run.
 *
 * Every grid depends only on host-side shapes; the decode grids only on n_rows
 * and max_ctx, so a decode step can be captured in a CUDA graph. Blocks whose
 * slice or tile lies past a row's length exit at once. Limits beyond the
 * header's: max_ctx < 2^24, d_work 16-byte aligned (cudaMalloc is).
 *
 * Queries arrive pre-scaled by hd^-0.5 (attention_prep.cu); scores are moved to
 * base 2 (times log2 e) so that the softmax uses exp2. Head dims that are not
 * a power of two run in the next larger instantiation with zero-filled padding. */
#include <cuda_runtime.h>
#include <math.h>

#include "backend/cuda/cuda_attn.h"
#include "backend/cuda/cuda_mma.cuh"
#include "backend/cuda/cuda_util.h"
#include "backend/cuda/gdn_common.cuh"

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
__device__ bool row_in_short_span(const int32_t *spans, int n_spans, int short_rows, int r) {
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

/* -------------------------------------------------------------- prefill */

/* Block (query head, tile from the end, span). Shared: Q, K, V tiles of 64 rows.
 * K of tile j+1 is fetched while P V of tile j is computed, V of tile j while
 * the scores of tile j are (one buffer each, two barriers per tile). */
template <int HDP>
__global__ void __launch_bounds__(ATT_THREADS, 2) attn_prefill_kernel(attn_params p, int skip_short) {
    constexpr int LDS = HDP + 8;
    constexpr int NT = HDP / 8;
    extern __shared__ __align__(16) uint16_t smem[];
    uint16_t *sQ = smem, *sK = sQ + ATT_TILE * LDS, *sV = sK + ATT_TILE * LDS;

    const int h = blockIdx.x, tile = gridDim.y - 1 - blockIdx.y, si = blockIdx.z;
    const int row0 = p.spans[4 * si], cnt = p.spans[4 * si + 1], pos0 = p.spans[4 * si + 2];
    const int slot = p.spans[4 * si + 3];
    if (skip_short && cnt <= ATT_DEC_ROWS) return;
    if (tile * ATT_TILE >= cnt) return;
    const int kvh = h / (p.nq / p.nkv);
    const int nrow = min(ATT_TILE, cnt - tile * ATT_TILE);
    const int q_first = pos0 + tile * ATT_TILE; /* position of the tile's first row */
    const int n_keys = q_first + nrow;
    const int n_kt = (n_keys + ATT_TILE - 1) / ATT_TILE;
    const int first_row = row0 + tile * ATT_TILE;
    const int32_t *bt = p.block_tables + (long long)slot * p.mbps;
    const int w = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, tq = lane % 4;

    load_rows<HDP, ATT_TILE>(sQ, p.q + ((long long)first_row * p.nq + h) * p.hd, (long long)p.nq * p.hd, nrow,
                             p.hd);
    load_kv_tile<HDP, false>(sK, nullptr, p.kc, nullptr, bt, 0, n_keys, kvh, p);
    qd_cp_async_commit();

    float o[NT][4];
#pragma unroll
    for (int n = 0; n < NT; n++) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
    float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.f, l1 = 0.f;
    const int wpos = q_first + w * 16; /* position of the warp's first row */
    const int qp0 = wpos + g;          /* positions of this thread's rows: qp0, qp0 + 8 */

    for (int j = 0; j < n_kt; j++) {
        const int kbase = j * ATT_TILE;
        qd_cp_async_wait<0>();
        __syncthreads(); /* K_j visible; every warp is done with V_{j-1} */
        load_kv_tile<HDP, false>(sV, nullptr, p.vc, nullptr, bt, kbase, n_keys, kvh, p);
        qd_cp_async_commit();
        /* warps whose rows all precede the tile skip it (fully masked) */
        const bool active = kbase <= wpos + 15;
        uint32_t pa[4][4];
        if (active) {
            float s[8][4];
#pragma unroll
            for (int n = 0; n < 8; n++) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.f;
#pragma unroll
            for (int kk = 0; kk < HDP / 16; kk++) {
                uint32_t a[4];
                qd_ldsm_x4(a, sQ + (w * 16 + (lane % 16)) * LDS + kk * 16 + (lane / 16) * 8);
#pragma unroll
                for (int np = 0; np < 4; np++) {
                    uint32_t b[4];
                    qd_ldsm_x4(b, sK + (np * 16 + (lane % 8) + (lane / 16) * 8) * LDS + kk * 16 + ((lane / 8) % 2) * 8);
                    qd_mma_bf16(s[2 * np], a, b[0], b[1]);
                    qd_mma_bf16(s[2 * np + 1], a, b[2], b[3]);
                }
            }
            const bool diag = kbase + ATT_TILE - 1 > wpos;
#pragma unroll
            for (int n = 0; n < 8; n++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    float v = s[n][e] * ATT_LOG2E;
                    if (diag && kbase + n * 8 + 2 * tq + (e & 1) > qp0 + (e >> 1) * 8) v = -INFINITY;
                    s[n][e] = v;
                }
            float al0, al1;
            softmax_update<8>(s, m0, m1, l0, l1, al0, al1);
#pragma unroll
            for (int n = 0; n < NT; n++) {
                o[n][0] *= al0;
                o[n][1] *= al0;
                o[n][2] *= al1;
                o[n][3] *= al1;
            }
#pragma unroll
            for (int k = 0; k < 4; k++) p_to_a(pa[k], s[2 * k], s[2 * k + 1]);
        }
        qd_cp_async_wait<0>();
        __syncthreads(); /* V_j visible; every warp is done with K_j */
        if (j + 1 < n_kt) load_kv_tile<HDP, false>(sK, nullptr, p.kc, nullptr, bt, kbase + ATT_TILE, n_keys, kvh, p);
        qd_cp_async_commit();
        if (active) {
#pragma unroll
            for (int k = 0; k < 4; k++)
#pragma unroll
                for (int dp = 0; dp < HDP / 16; dp++) {
                    uint32_t b[4];
                    qd_ldsm_x4_t(b, sV + (k * 16 + (lane % 8) + ((lane / 8) % 2) * 8) * LDS + dp * 16 + (lane / 16) * 8);
                    qd_mma_bf16(o[2 * dp], pa[k], b[0], b[1]);
                    qd_mma_bf16(o[2 * dp + 1], pa[k], b[2], b[3]);
                }
        }
    }

#pragma unroll
    for (int s = 1; s <= 2; s <<= 1) {
        l0 += __shfl_xor_sync(0xffffffffu, l0, s);
        l1 += __shfl_xor_sync(0xffffffffu, l1, s);
    }
#pragma unroll
    for (int hf = 0; hf < 2; hf++) {
        const int qi = w * 16 + g + hf * 8;
        if (qi >= nrow) continue;
        const long long row = first_row + qi;
        const float inv = 1.0f / (hf ? l1 : l0);
        const float *gp = p.qg + (row * p.nq + h) * 2LL * p.hd + p.hd;
        uint16_t *op = p.out + (row * p.nq + h) * p.hd;
#pragma unroll
        for (int n = 0; n < NT; n++) {
            const int d = n * 8 + 2 * tq;
            if (d < p.hd) {
                float v0 = o[n][2 * hf] * inv, v1 = o[n][2 * hf + 1] * inv;
                if (p.gated) {
                    const float2 gv = *(const float2 *)(gp + d);
                    v0 *= sigmoidf_(gv.x);
                    v1 *= sigmoidf_(gv.y);
                }
                *(uint32_t *)(op + d) = qd_pack_bf2(v0, v1);
            }
        }
    }
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

/* Block (row, kv head x group of 16 query heads, context slice). K/V tiles go
 * through a DEC_STAGES-deep cp.async ring (two tiles in flight while one is
 * computed: a block alone must keep enough bytes in flight to approach the
 * memory bandwidth); warp w takes keys 16w..16w+15 of each tile. */
#define DEC_STAGES 3
template <int HDP>
__global__ void __launch_bounds__(ATT_THREADS) attn_decode_kernel(attn_params p, int mixed) {
    constexpr int LDS = HDP + 8;
    constexpr int NT = HDP / 8;
    extern __shared__ __align__(16) uint16_t smem[];
    uint16_t *sQ = smem, *sK = sQ + 16 * LDS, *sV = sK + DEC_STAGES * ATT_TILE * LDS;

    const int r = p.row0 + blockIdx.x, sl = blockIdx.z;
    const int G = p.nq / p.nkv, hg = (G + 15) / 16;
    const int kvh = blockIdx.y / hg, h0 = kvh * G + (blockIdx.y % hg) * 16;
    const int nh = min(16, kvh * G + G - h0);
    if (mixed && !row_in_short_span(p.spans, p.n_spans, p.short_rows, r)) return;
    const int n_keys = p.row_pos[r] + 1;
    const int k0 = sl * p.split_len;
    if (k0 >= n_keys) return;
    /* the last slice takes any remainder, should a position exceed max_ctx */
    const int k1 = sl == p.nsp - 1 ? n_keys : min(k0 + p.split_len, n_keys);
    const int n_kt = (k1 - k0 + ATT_TILE - 1) / ATT_TILE;
    const int32_t *bt = p.block_tables + (long long)p.row_slot[r] * p.mbps;
    const int w = threadIdx.x / 32;

    load_rows<HDP, 16>(sQ, p.q + ((long long)r * p.nq + h0) * p.hd, p.hd, nh, p.hd);
#pragma unroll
    for (int st = 0; st < DEC_STAGES - 1; st++) {
        if (st < n_kt)
            load_kv_tile<HDP, true>(sK + st * ATT_TILE * LDS, sV + st * ATT_TILE * LDS, p.kc, p.vc, bt,
                                    k0 + st * ATT_TILE, k1, kvh, p);
        qd_cp_async_commit(); /* one group per tile, empty or not, so that the wait count is fixed */
    }

    float o[NT][4];
#pragma unroll
    for (int n = 0; n < NT; n++) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
    float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.f, l1 = 0.f;

    for (int t = 0; t < n_kt; t++) {
        qd_cp_async_wait<DEC_STAGES - 2>();
        __syncthreads(); /* tile t visible; every warp is done with tile t-1, whose buffer is refilled now */
        {
            const int tn = t + DEC_STAGES - 1, bn = tn % DEC_STAGES;
            if (tn < n_kt)
                load_kv_tile<HDP, true>(sK + bn * ATT_TILE * LDS, sV + bn * ATT_TILE * LDS, p.kc, p.vc, bt,
                                        k0 + tn * ATT_TILE, k1, kvh, p);
            qd_cp_async_commit();
        }
        const int buf = t % DEC_STAGES;
        const int kb = k0 + t * ATT_TILE + w * 16; /* first key of this warp's piece */
        if (kb < k1)
            piece_step<HDP, 1>(sQ, sK + (buf * ATT_TILE + w * 16) * LDS, sV + (buf * ATT_TILE + w * 16) * LDS, kb,
                               k1, k1, 0, o, m0, m1, l0, l1);
    }
    qd_cp_async_wait<0>(); /* only empty groups can remain; drained before the buffers are reused */
    __syncthreads();

    /* Merge the 4 warps. Q's buffer holds the statistics, the K ring the accumulators. */
    float *stat = reinterpret_cast<float *>(sQ);
    float *wm = stat, *wl = stat + 64, *wf = stat + 128, *rowm = stat + 192, *rowl = stat + 208;
    warp_state_store<HDP, 1>(wm, wl, reinterpret_cast<float *>(sK) + w * 16 * HDP, w, 0, o, m0, m1, l0, l1);
    __syncthreads();
    if (threadIdx.x < 64) merge_weights(wm, wl, wf, rowm, rowl, threadIdx.x / 16, threadIdx.x % 16);
    __syncthreads();
    const float *acc = reinterpret_cast<const float *>(sK);
    for (int idx = threadIdx.x; idx < nh * p.hd; idx += ATT_THREADS) {
        const int i = idx / p.hd, d = idx - i * p.hd;
        merge_store<HDP>(p, wf, acc, rowm, rowl, i, d, r, h0 + i, sl);
    }
}

/* --------------------------------------------------------------- span (invariant mode) */

/* Batch-invariant mode, rows of long spans: the decode kernel's per-(row,
 * head) arithmetic (same slices from max_ctx, same 64-key tiles from the
 * slice start, warp x of a group of 4 on keys 16x..16x+15 of each tile, same
 * masking, merge and partials) with the 16 A rows of an mma being 16 (row,
 * head) pairs of one kv head (rows of the span x its query heads) instead of
 * the query heads of one row, so that SPAN_NG x 16 pairs share each K/V tile
 * rather than one row's heads alone.
 *
 * Block (32 consecutive (row, head) pairs of this launch's rows in row-major
 * order over the kv head's G query heads, kv head, slice); warps: group of
 * 16 pairs, piece of the tile (4), part of the output columns (SPAN_DS: two
 * at hd 256, so that a thread's accumulator fits 128 registers and 16 warps
 * share an SM: 10% faster on the H200 than 8 warps of 210 registers). The block's rows may belong to several
 * spans (sequences): each run of rows of one long span goes through the
 * slice's tiles in turn, with the other rows' keys masked (limit 0), which
 * leaves their state bitwise unchanged (piece_step); a warp skips a piece
 * where none of its rows has a key, as the decode kernel skips pieces past
 * the row's end. Rows of short spans (the decode kernels') and rows with no
 * key in the slice store nothing, as the decode kernel's blocks exit. */
#define SPAN_NG 2
#define SPAN_AR (16 * SPAN_NG)
#define SPAN_DS(HDP) ((HDP) >= 256 ? 2 : 1)
#define SPAN_THREADS(HDP) (ATT_THREADS * SPAN_NG * SPAN_DS(HDP))
template <int HDP>
__global__ void __launch_bounds__(SPAN_THREADS(HDP), HDP >= 256 ? 1 : 2) attn_span_kernel(attn_params p) {
    constexpr int LDS = HDP + 8;
    constexpr int DS = SPAN_DS(HDP);
    constexpr int NT = HDP / 8 / DS;
    constexpr int CPR = HDP / 8;
    constexpr int THREADS = SPAN_THREADS(HDP);
    extern __shared__ __align__(16) uint16_t smem[];
    uint16_t *sQ = smem, *sK = sQ + SPAN_AR * LDS, *sV = sK + DEC_STAGES * ATT_TILE * LDS;
    __shared__ int rpos[SPAN_AR], rslot[SPAN_AR]; /* per row of the block: position (-1: not ours), slot */

    const int G = p.nq / p.nkv, kvh = blockIdx.y, sl = blockIdx.z;
    const long long F0 = (long long)blockIdx.x * SPAN_AR; /* first (row, head) pair, row-major from row0 */
    const int rlo = p.row0 + (int)(F0 / G);
    const int rhi = min(p.row0 + (int)((F0 + SPAN_AR - 1) / G), p.row_end - 1);
    const int nrow = rhi - rlo + 1; /* <= SPAN_AR */
    const int k0 = sl * p.split_len;

    for (int i = threadIdx.x; i < SPAN_AR; i += THREADS) rpos[i] = -1;
    __syncthreads();
    for (int i = threadIdx.x; i < p.n_spans; i += THREADS) {
        const int s0 = p.spans[4 * i], cnt = p.spans[4 * i + 1];
        if (cnt <= p.short_rows) continue;
        const int lo = max(s0, rlo), hi = min(s0 + cnt - 1, rhi);
        for (int r = lo; r <= hi; r++) {
            rpos[r - rlo] = p.spans[4 * i + 2] + (r - s0);
            rslot[r - rlo] = p.spans[4 * i + 3];
        }
    }
    __syncthreads();
    bool any = false;
    for (int i = 0; i < nrow; i++) any = any || rpos[i] >= k0; /* a row with a key in the slice */
    if (!any) return;

    /* the pairs' queries; pairs of rows not ours (or past the launch) zero */
    for (int c = threadIdx.x; c < SPAN_AR * CPR; c += THREADS) {
        const int f = c / CPR, col = (c % CPR) * 8;
        const long long F = F0 + f;
        const int r = p.row0 + (int)(F / G), hh = (int)(F % G);
        const bool ok = r <= rhi && rpos[r - rlo] >= 0 && col < p.hd;
        qd_cp_async16(sQ + f * LDS + col, ok ? p.q + ((long long)r * p.nq + kvh * G + hh) * p.hd + col : p.q, ok);
    }
    qd_cp_async_commit();

    const int wid = threadIdx.x / 32, grp = wid / (4 * DS), w = wid % 4, dh = (wid / 4) % DS;
    const int lane = threadIdx.x % 32, g = lane / 4;
    /* this thread's A rows grp*16 + g (+ 8): their rows relative to rlo (nrow and above: past the launch) */
    const int i0 = (int)((F0 + grp * 16 + g) / G) + p.row0 - rlo;
    const int i1 = (int)((F0 + grp * 16 + g + 8) / G) + p.row0 - rlo;
    const uint16_t *sQa = sQ + grp * 16 * LDS;

    float o[NT][4];
#pragma unroll
    for (int n = 0; n < NT; n++) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
    float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.f, l1 = 0.f;

    for (int ia = 0; ia < nrow;) {
        if (rpos[ia] < 0) {
            ia++;
            continue;
        }
        int ib = ia; /* the run: rows ia..ib of one sequence, consecutive positions */
        while (ib + 1 < nrow && rpos[ib + 1] == rpos[ib] + 1 && rslot[ib + 1] == rslot[ia]) ib++;
        const int nk = rpos[ib] + 1; /* keys of the run's last row */
        if (nk > k0) {
            /* per row, the decode kernel's slice end; 0 (every key masked) for rows outside the run */
            const int lim0 = i0 >= ia && i0 <= ib
                                 ? (sl == p.nsp - 1 ? rpos[i0] + 1 : min(k0 + p.split_len, rpos[i0] + 1))
                                 : 0;
            const int lim1 = i1 >= ia && i1 <= ib
                                 ? (sl == p.nsp - 1 ? rpos[i1] + 1 : min(k0 + p.split_len, rpos[i1] + 1))
                                 : 0;
            const int k1 = sl == p.nsp - 1 ? nk : min(k0 + p.split_len, nk);
            const int n_kt = (k1 - k0 + ATT_TILE - 1) / ATT_TILE;
            const int32_t *bt = p.block_tables + (long long)rslot[ia] * p.mbps;
#pragma unroll
            for (int st = 0; st < DEC_STAGES - 1; st++) {
                if (st < n_kt)
                    load_kv_tile<HDP, true, THREADS>(sK + st * ATT_TILE * LDS, sV + st * ATT_TILE * LDS, p.kc,
                                                          p.vc, bt, k0 + st * ATT_TILE, k1, kvh, p);
                qd_cp_async_commit();
            }
            for (int t = 0; t < n_kt; t++) {
                qd_cp_async_wait<DEC_STAGES - 2>();
                __syncthreads();
                {
                    const int tn = t + DEC_STAGES - 1, bn = tn % DEC_STAGES;
                    if (tn < n_kt)
                        load_kv_tile<HDP, true, THREADS>(sK + bn * ATT_TILE * LDS, sV + bn * ATT_TILE * LDS,
                                                              p.kc, p.vc, bt, k0 + tn * ATT_TILE, k1, kvh, p);
                    qd_cp_async_commit();
                }
                const int buf = t % DEC_STAGES;
                const int kb = k0 + t * ATT_TILE + w * 16;
                if (kb < k1 && __any_sync(0xffffffffu, kb < lim0 || kb < lim1))
                    piece_step<HDP, DS>(sQa, sK + (buf * ATT_TILE + w * 16) * LDS,
                                        sV + (buf * ATT_TILE + w * 16) * LDS, kb, lim0, lim1, dh, o, m0, m1, l0, l1);
            }
            qd_cp_async_wait<0>();
            __syncthreads(); /* the ring is free for the next run */
        }
        ia = ib + 1;
    }
    qd_cp_async_wait<0>(); /* the queries' group, had no run any tile */
    __syncthreads();

    /* Merge each group's 4 warps as the decode kernel does: statistics in Q's
     * buffer (224 floats a group), accumulators in the K/V ring. */
    float *stat = reinterpret_cast<float *>(sQ) + grp * 224;
    warp_state_store<HDP, DS>(stat, stat + 64, reinterpret_cast<float *>(sK) + (grp * 4 + w) * 16 * HDP, w, dh, o, m0,
                              m1, l0, l1);
    __syncthreads();
    if (threadIdx.x < 64 * SPAN_NG) {
        float *st = reinterpret_cast<float *>(sQ) + (threadIdx.x / 64) * 224;
        merge_weights(st, st + 64, st + 128, st + 192, st + 208, (threadIdx.x % 64) / 16, threadIdx.x % 16);
    }
    __syncthreads();
    for (int idx = threadIdx.x; idx < SPAN_AR * p.hd; idx += THREADS) {
        const int f = idx / p.hd, d = idx - f * p.hd;
        const long long F = F0 + f;
        const int r = p.row0 + (int)(F / G);
        if (r > rhi || rpos[r - rlo] < k0) continue; /* not ours, or no key in the slice */
        const float *st = reinterpret_cast<const float *>(sQ) + (f / 16) * 224;
        merge_store<HDP>(p, st + 128, reinterpret_cast<const float *>(sK) + (f / 16) * 64 * HDP, st + 192, st + 208,
                         f % 16, d, r, kvh * G + (int)(F % G), sl);
    }
}

/* Block (row, query head): merges the row's slices, normalises, gates. The
 * slices' vectors are summed by ng = COMB_THREADS / (hd/4) groups of threads,
 * each reading float4s, so that many loads are in flight even for one row;
 * group j takes slices j, j+ng, ... in order and the groups' sums are added
 * in group order: one fixed summation order for a given (hd, slice count),
 * whatever the batch and the run. */
#define COMB_THREADS 256
__global__ void __launch_bounds__(COMB_THREADS) attn_combine_kernel(attn_params p, int mixed) {
    extern __shared__ float wts[]; /* [nsp rounded up to 4] slice weights */
    __shared__ __align__(16) float part[COMB_THREADS * 4]; /* [ng][hd] group sums (ng * hd <= 4 * COMB_THREADS) */
    __shared__ float red[2][COMB_THREADS / 32];
    const int r = p.row0 + blockIdx.x, h = blockIdx.y, hd = p.hd;
    if (mixed && !row_in_short_span(p.spans, p.n_spans, p.short_rows, r)) return;
    const int n_keys = p.row_pos[r] + 1;
    const int ns = min((n_keys + p.split_len - 1) / p.split_len, p.nsp);
    const long long base = ((long long)blockIdx.x * p.nq + h) * p.nsp;
    const float *wo = p.work + base * hd;
    const float *wml = p.work + (long long)p.work_rows * p.nq * p.nsp * hd + 2 * base;
    const int lane = threadIdx.x % 32, wid = threadIdx.x / 32;
    float M = -INFINITY;
    for (int i = threadIdx.x; i < ns; i += COMB_THREADS) M = fmaxf(M, wml[2 * i]);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) M = fmaxf(M, __shfl_xor_sync(0xffffffffu, M, o));
    if (lane == 0) red[0][wid] = M;
    __syncthreads();
    M = red[0][0];
#pragma unroll
    for (int x = 1; x < COMB_THREADS / 32; x++) M = fmaxf(M, red[0][x]);
    float L = 0.f;
    for (int i = threadIdx.x; i < ns; i += COMB_THREADS) {
        const float f = exp2f(wml[2 * i] - M);
        wts[i] = f;
        L += wml[2 * i + 1] * f;
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) L += __shfl_xor_sync(0xffffffffu, L, o);
    if (lane == 0) red[1][wid] = L;
    __syncthreads();
    L = 0.f;
#pragma unroll
    for (int x = 0; x < COMB_THREADS / 32; x++) L += red[1][x];

    const int tpv = hd / 4, ng = COMB_THREADS / tpv; /* threads per vector, vector groups */
    const int grp = threadIdx.x / tpv, c = threadIdx.x % tpv;
    if (grp < ng) {
        float4 a = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll 4
        for (int i = grp; i < ns; i += ng) {
            const float4 x = *(const float4 *)(wo + (long long)i * hd + 4 * c);
            const float f = wts[i];
            a.x += f * x.x;
            a.y += f * x.y;
            a.z += f * x.z;
            a.w += f * x.w;
        }
        *(float4 *)(part + grp * hd + 4 * c) = a;
    }
    __syncthreads();
    const float inv = 1.0f / L;
    const long long rh = (long long)r * p.nq + h;
    for (int d = threadIdx.x; d < hd; d += COMB_THREADS) {
        float acc = part[d];
        for (int x = 1; x < ng; x++) acc += part[x * hd + d];
        float v = acc * inv;
        if (p.gated) v *= sigmoidf_(p.qg[rh * 2 * hd + hd + d]);
        p.out[rh * hd + d] = qd_f2bf(v);
    }
}

/* ------------------------------------------------------------- launchers */

/* The decode table: context slices per row so that rows x slices is about
 * ATT_SPLIT_TARGET, slices of at least ATT_MIN_SPLIT keys (a multiple of the
 * tile). Depends on n_rows and max_ctx only. One slice covers any length. */
static void split_plan(int n_rows, int max_ctx, int *split_len, int *nsp) {
    if (max_ctx < 1) max_ctx = 1;
    int cap = (max_ctx + ATT_MIN_SPLIT - 1) / ATT_MIN_SPLIT;
    if (cap > ATT_MAX_SPLITS) cap = ATT_MAX_SPLITS;
    int want = (ATT_SPLIT_TARGET + n_rows - 1) / (n_rows > 0 ? n_rows : 1);
    int n = want < cap ? want : cap;
    if (n <= 1) {
        *split_len = 1 << 30;
        *nsp = 1;
        return;
    }
    int len = (max_ctx + n - 1) / n;
    len = (len + ATT_TILE - 1) / ATT_TILE * ATT_TILE;
    *split_len = len;
    *nsp = (max_ctx + len - 1) / len;
    if (*nsp <= 1) {
        *split_len = 1 << 30;
        *nsp = 1;
    }
}

/* The invariant mode's table, a function of max_ctx alone: at most
 * ATT_INV_SLICES slices of max(ATT_MIN_SPLIT, max_ctx / ATT_INV_SLICES rounded
 * up to the tile) keys. Slice k of every row is then keys [k len, (k+1) len)
 * of its sequence, so its partial, and the combine over the row's slices,
 * depend only on the row's query and keys. Sixteen slices: a single decode
 * row still spreads over 16 x nkv blocks, while a prefill row of a long
 * prompt pays the per-block overhead (query load, pipeline fill, warp merge,
 * partial store) and the partials' traffic for 16 slices at most; slices of
 * at least 2 tiles keep that overhead below the keys' own cost at short
 * contexts. The same plan as split_plan's for 32 rows at 4k context. */
static void invariant_plan(int max_ctx, int *split_len, int *nsp) {
    if (max_ctx < 1) max_ctx = 1;
    int len = (max_ctx + ATT_INV_SLICES - 1) / ATT_INV_SLICES;
    len = (len + ATT_TILE - 1) / ATT_TILE * ATT_TILE;
    if (len < ATT_MIN_SPLIT) len = ATT_MIN_SPLIT;
    *split_len = len;
    *nsp = (max_ctx + len - 1) / len;
    if (*nsp <= 1) {
        *split_len = 1 << 30;
        *nsp = 1;
    }
}

/* Invariant mode: rows per (decode, combine) launch pair, so that the scratch
 * holds at most ATT_INV_PAIRS (row, slice) partials; every row in one launch
 * when a single slice is written directly. Rows are independent, so the
 * grouping never changes a result. */
static int invariant_group_rows(int nsp) { return nsp > 1 ? ATT_INV_PAIRS / nsp : 1 << 30; }

extern "C" size_t qd_cuda_attn_work_bytes(int max_rows, int nq, int hd, int max_ctx, int invariant) {
    size_t best = 0;
    if (invariant) {
        int len, n;
        invariant_plan(max_ctx, &len, &n);
        const int R = invariant_group_rows(n);
        if (n > 1 && max_rows > 0) best = (size_t)(max_rows < R ? max_rows : R) * n;
    } else {
        for (int r = 1; r <= max_rows && r <= ATT_SPLIT_TARGET; r++) {
            int len, n;
            split_plan(r, max_ctx, &len, &n);
            if (n > 1 && (size_t)r * n > best) best = (size_t)r * n;
        }
    }
    return best * (size_t)(nq > 0 ? nq : 0) * (size_t)((hd > 0 ? hd : 0) + 2) * sizeof(float);
}

template <int HDP> static size_t prefill_smem(void) { return (size_t)3 * ATT_TILE * (HDP + 8) * 2; }
template <int HDP> static size_t decode_smem(void) {
    return (size_t)(16 + 2 * DEC_STAGES * ATT_TILE) * (HDP + 8) * 2;
}
template <int HDP> static size_t span_smem(void) {
    return (size_t)(SPAN_AR + 2 * DEC_STAGES * ATT_TILE) * (HDP + 8) * 2;
}

template <int HDP>
static qd_status launch_prefill(const qd_cuda_attn_args *a, const attn_params &p, int skip_short,
                                cudaStream_t st) {
    const size_t sm = prefill_smem<HDP>();
    QD_CUDA_TRY(cudaFuncSetAttribute(attn_prefill_kernel<HDP>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sm));
    const dim3 grid((unsigned)a->nq, (unsigned)((a->max_span_rows + ATT_TILE - 1) / ATT_TILE), (unsigned)a->n_spans);
    attn_prefill_kernel<HDP><<<grid, ATT_THREADS, sm, st>>>(p, skip_short);
    QD_CUDA_CHECK_LAUNCH("attn_prefill_kernel");
    return QD_OK;
}

/* Combine of rows p.row0 .. p.row0 + rows - 1 (mixed: short spans' rows only). */
static qd_status launch_combine(const attn_params &p, int rows, int mixed, cudaStream_t st) {
    if (p.nsp <= 1) return QD_OK;
    attn_combine_kernel<<<dim3((unsigned)rows, (unsigned)p.nq), COMB_THREADS,
                          (size_t)((p.nsp + 3) / 4 * 4) * sizeof(float), st>>>(p, mixed);
    QD_CUDA_CHECK_LAUNCH("attn_combine_kernel");
    return QD_OK;
}

/* Decode of rows p.row0 .. p.row0 + rows - 1, then their combine unless skip_combine. */
template <int HDP>
static qd_status launch_decode(const qd_cuda_attn_args *a, const attn_params &p, int rows, int mixed,
                               int skip_combine, cudaStream_t st) {
    const size_t sm = decode_smem<HDP>();
    const int G = a->nq / a->nkv;
    const dim3 grid((unsigned)rows, (unsigned)(a->nkv * ((G + 15) / 16)), (unsigned)p.nsp);
    attn_decode_kernel<HDP><<<grid, ATT_THREADS, sm, st>>>(p, mixed);
    QD_CUDA_CHECK_LAUNCH("attn_decode_kernel");
    return skip_combine ? QD_OK : launch_combine(p, rows, mixed, st);
}

/* Span kernel over the long spans' rows among p.row0 .. p.row_end - 1. */
template <int HDP>
static qd_status launch_span(const qd_cuda_attn_args *a, const attn_params &p, cudaStream_t st) {
    const int G = a->nq / a->nkv;
    const long long pairs = (long long)(p.row_end - p.row0) * G;
    const dim3 grid((unsigned)((pairs + SPAN_AR - 1) / SPAN_AR), (unsigned)a->nkv, (unsigned)p.nsp);
    attn_span_kernel<HDP><<<grid, SPAN_THREADS(HDP), span_smem<HDP>(), st>>>(p);
    QD_CUDA_CHECK_LAUNCH("attn_span_kernel");
    return QD_OK;
}

template <int HDP>
static qd_status run_attn(const qd_cuda_attn_args *a, attn_params &p, cudaStream_t st) {
    QD_CUDA_TRY(cudaFuncSetAttribute(attn_decode_kernel<HDP>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     (int)decode_smem<HDP>()));
    if (a->invariant) {
        /* Rows of spans longer than QD_CUDA_ATTN_INV_SPAN_ROWS through the span
         * kernel, the others through the decode kernel (the same bits either
         * way), in groups of rows that fit the scratch; one combine per group. */
        const int span = a->max_span_rows > QD_CUDA_ATTN_INV_SPAN_ROWS;
        if (span)
            QD_CUDA_TRY(cudaFuncSetAttribute(attn_span_kernel<HDP>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             (int)span_smem<HDP>()));
        const int R = invariant_group_rows(p.nsp);
        p.work_rows = a->n_rows < R ? a->n_rows : R;
        p.short_rows = QD_CUDA_ATTN_INV_SPAN_ROWS;
        for (int r0 = 0; r0 < a->n_rows; r0 += R) {
            const int rows = a->n_rows - r0 < R ? a->n_rows - r0 : R;
            p.row0 = r0;
            p.row_end = r0 + rows;
            qd_status s = QD_OK;
            if (!span) {
                s = launch_decode<HDP>(a, p, rows, 0, 0, st);
            } else {
                if (a->n_spans > 1) s = launch_decode<HDP>(a, p, rows, 1, 1, st);
                if (s == QD_OK) s = launch_span<HDP>(a, p, st);
                if (s == QD_OK) s = launch_combine(p, rows, 0, st);
            }
            if (s != QD_OK) return s;
        }
        return QD_OK;
    }
    p.short_rows = ATT_DEC_ROWS;
    if (a->max_span_rows <= ATT_DEC_ROWS) return launch_decode<HDP>(a, p, a->n_rows, 0, 0, st);
    /* A single span is all prefill, whatever its actual length; several spans
     * may mix: short ones go to the decode kernels, which skip the long ones. */
    const int mixed = a->n_spans > 1;
    qd_status s = launch_prefill<HDP>(a, p, mixed, st);
    if (s != QD_OK || !mixed) return s;
    return launch_decode<HDP>(a, p, a->n_rows, 1, 0, st);
}

extern "C" qd_status qd_cuda_attn(const qd_cuda_attn_args *a, void *stream) {
    if (!a) return qd_cuda_fail(QD_ERR_INVALID_ARG, "qd_cuda_attn: no arguments");
    if (a->n_rows <= 0) return QD_OK;
    if (a->nq <= 0 || a->nkv <= 0 || a->nq % a->nkv || a->hd <= 0 || a->hd > 256 || a->hd % 8 ||
        a->block_size <= 0 || a->max_blocks_per_seq <= 0 || a->block_stride % 8 || a->n_spans <= 0 ||
        a->n_spans > 65535 || a->max_span_rows <= 0 || a->max_ctx <= 0 ||
        a->max_ctx >= (1 << 24) /* exact float block index, load_kv_tile */)
        return qd_cuda_fail(QD_ERR_INVALID_ARG, "qd_cuda_attn: bad shape");
    if (!a->d_qg || !a->d_row_slot || !a->d_row_pos || !a->d_spans || !a->d_block_tables || !a->d_kcache ||
        !a->d_vcache || !a->d_q || !a->d_out)
        return qd_cuda_fail(QD_ERR_INVALID_ARG, "qd_cuda_attn: null pointer");
    /* 16-byte cp.async of cache and query rows, 4-byte output pairs, 8-byte gate pairs */
    if (((uintptr_t)a->d_kcache | (uintptr_t)a->d_vcache | (uintptr_t)a->d_q) % 16 || (uintptr_t)a->d_out % 4 ||
        (uintptr_t)a->d_qg % 8)
        return qd_cuda_fail(QD_ERR_INVALID_ARG, "qd_cuda_attn: misaligned buffer");
    attn_params p;
    p.n_rows = a->n_rows; p.nq = a->nq; p.nkv = a->nkv; p.hd = a->hd; p.gated = a->gated != 0;
    p.n_spans = a->n_spans; p.qg = a->d_qg; p.row_slot = a->d_row_slot; p.row_pos = a->d_row_pos;
    p.spans = a->d_spans; p.block_tables = a->d_block_tables; p.mbps = a->max_blocks_per_seq;
    p.bs = a->block_size; p.inv_bs = 1.0f / (float)a->block_size; p.stride = (long long)a->block_stride; p.kc = a->d_kcache; p.vc = a->d_vcache;
    p.q = a->d_q; p.out = a->d_out; p.work = a->d_work;
    p.row0 = 0;
    p.row_end = a->n_rows;
    p.work_rows = a->n_rows;
    p.short_rows = ATT_DEC_ROWS;
    if (a->invariant)
        invariant_plan(a->max_ctx, &p.split_len, &p.nsp);
    else
        split_plan(a->n_rows, a->max_ctx, &p.split_len, &p.nsp);
    const int G = a->nq / a->nkv;
    if ((long long)a->nkv * ((G + 15) / 16) > 65535 || p.nsp > 65535 || (a->max_span_rows + ATT_TILE - 1) / ATT_TILE > 65535 ||
        ((long long)a->n_rows * G + SPAN_AR - 1) / SPAN_AR > 0x7fffffffLL /* span grid */)
        return qd_cuda_fail(QD_ERR_INVALID_ARG, "qd_cuda_attn: grid too large");
    if (p.nsp > 1 && (!a->d_work || (uintptr_t)a->d_work % 16))
        return qd_cuda_fail(QD_ERR_INVALID_ARG, "qd_cuda_attn: d_work missing or not 16-byte aligned");
    const cudaStream_t st = (cudaStream_t)stream;
    if (a->hd <= 32) return run_attn<32>(a, p, st);
    if (a->hd <= 64) return run_attn<64>(a, p, st);
    if (a->hd <= 128) return run_attn<128>(a, p, st);
    return run_attn<256>(a, p, st);
}
