/* The prefill grouped GEMMs of FP8 experts on the FP8 tensor cores (W8A8, sm_90a): the
 * weights as stored (e4m3, 128 x 128 block scales), the activations quantized per token
 * and 128-column block to e4m3 (qd_cuda_fp8_quant_act: amax / 448, the scheme DeepGEMM
 * and the dense FP8 GEMM use), every block's partial sums scaled by the two scales and
 * added in fp32.
 *
 *   x -> xq, xs      per-token 1 x 128 quantization of the layer input
 *   gate_up          act[row][i] = silu(g) * u in bf16, g / u = sum over k-blocks of
 *                    xs * ws * (xq . w) for the row's token
 *   act -> aq, as    the same quantization of act
 *   down             out[row][h] fp32
 * then moe_combine as for bf16 experts. The plan is the wgmma kernel's (128-row tiles).
 *
 * Tile: 128 sorted rows (warpgroup w: rows 64 w ..) x 128 weight rows (gate_up: 64 gate
 * rows and the same 64 up rows; down: 128 output columns), k-steps of 128 e4m3 (one scale
 * block, one 128-byte swizzle row) through a 5-stage cp.async ring that also carries the
 * rows' activation scales. Each k-step's four k32 wgmmas start from zero (the hardware
 * truncates within a k32 group, so partial sums stay one block long) and are promoted into
 * the fp32 accumulators with the row's and the block's scales. Persistent as the bf16
 * kernel: a block per SM over the (tile, column block) items, the ring running ahead
 * across them. Each output is one fixed sequence of block sums, so a token's result does
 * not depend on the batch. */
#include <stdint.h>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_util.h"
#include "backend/cuda/cuda_wgmma.cuh"
#include "backend/cuda/moe_grouped_tile.cuh"
#include "backend/cuda/moe_internal.cuh"

#define F8_BM 128 /* sorted rows a tile (QD_MOE_WG_BM) */
#define F8_BN 128 /* weight rows a tile */
#define F8_BK 128 /* e4m3 columns a k-step: one scale block, 128 bytes */
#define F8_ST 5
#define F8_NT 256
#define F8_A_BYTES (F8_BM * F8_BK)
#define F8_B_BYTES (F8_BN * F8_BK)
#define F8_STAGE_BYTES (F8_A_BYTES + F8_B_BYTES + 1024) /* + the rows' scales, keeping 1024-byte alignment */
#define F8_SMEM (F8_ST * F8_STAGE_BYTES + 1024)

static_assert(F8_BM == QD_MOE_WG_BM, "the plan's tiles are the kernel's");

struct f8_call {
    const uint8_t *A;  /* gate_up: xq [n][H]; down: aq [P][I] by sorted row (e4m3) */
    const float *As;   /* their scales: [ceil(K / 128)][ld_as], token / row at column */
    int ld_as;         /* n (gate_up) or P (down) */
    const uint8_t *W;  /* gate_up: 2E matrices [I][H]; down: E matrices [H][I] (e4m3) */
    const float *Ws;   /* [n_mats][ceil(rows / 128)][ceil(K / 128)] */
    const int32_t *seg, *n_tiles, *sorted;
    const int2 *tiles;
    uint16_t *act_out; /* gate_up: [P][I] bf16 */
    float *out;        /* down: [P][H] fp32 */
    int H, I, k;
};

/* A thread's copies for one k-step of an item: A rows and weight rows (tid / 8) + 32 q,
 * q < 4, at 16-byte chunk tid % 8; threads below 128 also copy row tid's activation scale.
 * Byte offsets in 32 bits (qd_moe_fp8_takes). */
template <int MODE>
struct f8_loader {
    uint32_t a_off[4], b_off[4];
    int s_row; /* the scale column of row tid (token or sorted row), -1 past the tile */
    uint32_t ok;

    __device__ __forceinline__ void start(const f8_call &p, const qd_mg_item &it, int tid) {
        ok = 0;
        qd_mg_a_rows<MODE>(it, p.sorted, p.k, p.H, p.I, tid, a_off, &ok);
        qd_mg_w_rows<MODE, F8_BN>(it, p.H, p.I, tid, b_off, &ok);
        s_row = -1;
        if (tid < F8_BM && tid < it.rows) {
            const int rr = it.row0 + tid;
            s_row = MODE == 0 ? p.sorted[rr] / p.k : rr;
        }
    }

    __device__ __forceinline__ void issue(const f8_call &p, unsigned char *stage, int kt, int tid) const {
        const int K = MODE == 0 ? p.H : p.I;
        const int c = tid & 7, kc = kt * F8_BK + c * 16;
        const bool kin = kc < K; /* K % 16 == 0: a chunk is all in or all out */
        unsigned char *sa = stage, *sb = stage + F8_A_BYTES;
        float *ss = (float *)(stage + F8_A_BYTES + F8_B_BYTES);
#pragma unroll
        for (int q = 0; q < 4; q++) {
            const int r = (tid >> 3) + 32 * q;
            const bool va = kin && ((ok >> q) & 1), vb = kin && ((ok >> (4 + q)) & 1);
            qd_cp_async16(sa + qd_mg_swz(r, c), p.A + (va ? a_off[q] + (uint32_t)kc : 0u), va);
            qd_cp_async16(sb + qd_mg_swz(r, c), p.W + (vb ? b_off[q] + (uint32_t)kc : 0u), vb);
        }
        if (tid < F8_BM)
            qd_cp_async4(ss + tid, p.As + (s_row >= 0 ? (size_t)kt * p.ld_as + s_row : 0), s_row >= 0 ? 4 : 0);
    }
};

__device__ __forceinline__ void f8_keep(float (&d)[32]) {
#pragma unroll
    for (int i = 0; i < 32; i++) qd_wgmma_keep(d[i]);
}

template <int MODE>
__global__ void __launch_bounds__(F8_NT, 1) moe_fp8_gemm(const __grid_constant__ f8_call p) {
    extern __shared__ unsigned char f8_smem_raw[];
    unsigned char *smem = (unsigned char *)(((uintptr_t)f8_smem_raw + 1023) & ~(uintptr_t)1023);
    const int tid = threadIdx.x, wg = tid >> 7, warp = (tid >> 5) & 3, lane = tid & 31;
    const int g = lane >> 2;
    const int K = MODE == 0 ? p.H : p.I;
    const int KT = (K + F8_BK - 1) / F8_BK;
    const int NB = qd_mg_col_blocks<MODE, F8_BN>(MODE == 0 ? p.I : p.H);
    const int n_items = *p.n_tiles * NB;
    const int w_rows = MODE == 0 ? p.I : p.H; /* rows of one weight matrix */
    const int w_sr = (w_rows + 127) / 128;     /* its scale rows */

    qd_mg_ring<f8_loader<MODE>, f8_call> ring;
    ring.begin(p, n_items, NB, tid);
    auto load_next = [&](int st) { ring.next(p, smem + st * F8_STAGE_BYTES, n_items, NB, KT, tid); };
#pragma unroll
    for (int s = 0; s < F8_ST - 1; s++) load_next(s);

    /* gate_up: gate and up columns; down: output columns 0-63 and 64-127 */
    float m0[32], m1[32], p0[32], p1[32];
    int st = 0;
    for (int item = blockIdx.x; item < n_items; item += gridDim.x) {
        const qd_mg_item it = qd_mg_item_of(p.tiles, p.seg, item, NB);
        /* the weight scale rows of the item's two column halves */
        const float *ws0, *ws1;
        if (MODE == 0) {
            const int br = it.nb * (F8_BN / 2) / 128;
            ws0 = p.Ws + ((size_t)(2 * it.e) * w_sr + br) * KT;
            ws1 = p.Ws + ((size_t)(2 * it.e + 1) * w_sr + br) * KT;
        } else {
            ws0 = ws1 = p.Ws + ((size_t)it.e * w_sr + it.nb) * KT;
        }
#pragma unroll
        for (int i = 0; i < 32; i++) m0[i] = m1[i] = 0.0f;
        for (int kt = 0; kt < KT; kt++) {
            const float w0 = ws0[kt], w1 = ws1[kt];
            qd_cp_async_wait<F8_ST - 2>();
            asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); /* cp.async writes, for wgmma's reads */
            __syncthreads(); /* stage st landed for all; every warpgroup is done with the stage before */
            load_next((st + F8_ST - 1) % F8_ST);
            const unsigned char *stage = smem + st * F8_STAGE_BYTES;
            const unsigned char *sa = stage + wg * (64 * 128), *sb = stage + F8_A_BYTES;
            qd_wgmma_fence();
#pragma unroll
            for (int j = 0; j < F8_BK / 32; j++) {
                const uint64_t da = qd_wgmma_desc_sw128(sa + 32 * j);
                qd_wgmma_e4m3_n64(p0, da, qd_wgmma_desc_sw128(sb + 32 * j), j > 0);
                qd_wgmma_e4m3_n64(p1, da, qd_wgmma_desc_sw128(sb + 64 * 128 + 32 * j), j > 0);
            }
            qd_wgmma_commit();
            qd_wgmma_wait0();
            f8_keep(p0);
            f8_keep(p1);
            /* promote: the rows' activation scales times the block's weight scale */
            const float *ss = (const float *)(stage + F8_A_BYTES + F8_B_BYTES);
            const int r0 = wg * 64 + warp * 16 + g;
            const float a0 = ss[r0], a1 = ss[r0 + 8];
            const float s00 = a0 * w0, s01 = a1 * w0, s10 = a0 * w1, s11 = a1 * w1;
#pragma unroll
            for (int h = 0; h < 8; h++) {
                m0[4 * h] = fmaf(p0[4 * h], s00, m0[4 * h]);
                m0[4 * h + 1] = fmaf(p0[4 * h + 1], s00, m0[4 * h + 1]);
                m0[4 * h + 2] = fmaf(p0[4 * h + 2], s01, m0[4 * h + 2]);
                m0[4 * h + 3] = fmaf(p0[4 * h + 3], s01, m0[4 * h + 3]);
                m1[4 * h] = fmaf(p1[4 * h], s10, m1[4 * h]);
                m1[4 * h + 1] = fmaf(p1[4 * h + 1], s10, m1[4 * h + 1]);
                m1[4 * h + 2] = fmaf(p1[4 * h + 2], s11, m1[4 * h + 2]);
                m1[4 * h + 3] = fmaf(p1[4 * h + 3], s11, m1[4 * h + 3]);
            }
            st = (st + 1) % F8_ST;
        }
        qd_mg_store<MODE, 8>(m0, m1, it, MODE == 0 ? it.nb * (F8_BN / 2) : it.nb * F8_BN, 64, p.H, p.I, p.act_out,
                             p.out);
    }
    qd_cp_async_wait<0>();
}

static int fp8_blocks(const qd_cuda_qmats *m) {
    return m && m->dtype == QD_DTYPE_F8_E4M3 && m->block_rows == 128 && m->block_cols == 128 && m->row_bytes == m->cols &&
           m->scales && m->nbc == (m->cols + 127) / 128 && m->scale_rows == (m->rows + 127) / 128;
}

/* Scratch of the W8A8 path inside the call's qd_moe_work: xq and xs in `out` (read by
 * gate_up before down writes `out`), act (bf16), aq and as in `act` (laid out as fp32).
 * Byte offsets from those regions' starts; fits: both regions hold them. */
typedef struct f8_scratch {
    size_t xs, aq, as;
    int fits;
} f8_scratch;

static size_t up256(size_t x) { return (x + 255) & ~(size_t)255; }

static f8_scratch scratch_of(int64_t n, int64_t P, int64_t H, int64_t I) {
    f8_scratch sc;
    sc.xs = up256((size_t)(n * H));
    sc.aq = up256((size_t)(P * I) * 2);
    sc.as = sc.aq + up256((size_t)(P * I));
    sc.fits = sc.xs + (size_t)n * (size_t)((H + 127) / 128) * 4 <= (size_t)(P * H) * 4 &&
              sc.as + (size_t)P * (size_t)((I + 127) / 128) * 4 <= (size_t)(P * I) * 4;
    return sc;
}

int qd_moe_fp8_takes(const qd_cuda_moe_args *a) {
    const qd_cuda_qmats *gu = a->q_gate_up, *dn = a->q_down;
    return qd_moe_wg_takes(a) && scratch_of(a->n, (int64_t)a->n * a->k, a->H, a->I).fits && fp8_blocks(gu) &&
           fp8_blocks(dn) && gu->n_mats == 2 * a->E && dn->n_mats == a->E && gu->rows == a->I && gu->cols == a->H &&
           dn->rows == a->H && dn->cols == a->I && a->H % 16 == 0 && a->I % 16 == 0;
}

qd_status qd_moe_fp8_gemms(const qd_cuda_moe_args *a, const qd_moe_work *w, cudaStream_t s) {
    const int n = a->n, H = a->H, I = a->I, P = n * a->k;
    const f8_scratch sc = scratch_of(n, P, H, I);
    uint8_t *xq = (uint8_t *)w->out, *aq = (uint8_t *)w->act + sc.aq;
    float *xs = (float *)((char *)w->out + sc.xs), *as = (float *)((char *)w->act + sc.as);
    uint16_t *act = (uint16_t *)w->act;
    qd_status st = qd_cuda_fp8_quant_act(a->d_x, H, n, H, QD_FP8_GEMM_BLOCK, n, xq, xs, s);
    if (st) return st;
    const int max_tiles = qd_moe_max_tiles_of((int64_t)P, a->E, QD_MOE_WG_BM);
    f8_call c = {xq, xs, n, a->q_gate_up->data, (const float *)a->q_gate_up->scales, w->seg, w->n_tiles, w->sorted,
                 w->tiles, act, NULL, H, I, a->k};
    st = qd_mg_launch(moe_fp8_gemm<0>, c, max_tiles * qd_mg_col_blocks<0, F8_BN>(I), F8_NT, F8_SMEM, s);
    if (st) return st;
    st = qd_cuda_fp8_quant_act(act, I, P, I, QD_FP8_GEMM_BLOCK, P, aq, as, s);
    if (st) return st;
    c.A = aq;
    c.As = as;
    c.ld_as = P;
    c.W = a->q_down->data;
    c.Ws = (const float *)a->q_down->scales;
    c.act_out = NULL;
    c.out = w->out;
    return qd_mg_launch(moe_fp8_gemm<1>, c, max_tiles * qd_mg_col_blocks<1, F8_BN>(H), F8_NT, F8_SMEM, s);
}
