/* The prefill grouped GEMMs of 4-bit experts (INT4 with group scales, NVFP4) on the bf16
 * wgmma (W4A16, sm_90a): the weights are read as stored and made bf16 in shared memory a
 * k-step at a time (Marlin's approach), rather than every expert of the layer dequantized
 * into a bf16 copy first (1.6 GB written and read a layer at the 35B-A3B's size). The same
 * job, inputs and outputs as moe_wg_gemm (moe_prefill_wgmma.cu) on that copy.
 *
 * Bits: a weight is made bf16 as dequant_vec (gemv_quant.cu) makes the copy: the format's
 * decode_word (cuda_qformat.cuh), times the block scale, times the matrix factor (NVFP4's
 * global), in fp32 and in that order, rounded by qd_pack_bf2. The tile, the k-steps and the
 * wgmmas are moe_wg_gemm's (qd_mg_wgmma_k64, zeros past K), so each output is the same
 * chain of k16 products of the same bf16 numbers as the copy's wgmma kernel gives, and so
 * the same as its mma.sync kernels (moe_prefill.cu): the copy's bits at every n.
 *
 * Tile: 128 sorted rows (warpgroup w: rows 64 w ..) x 256 weight rows (gate_up: 128 gate
 * rows and the same 128 up rows; down: 256 output columns), k-steps of 64 columns through a
 * 4-stage cp.async ring of 28 KiB a stage:
 *   A       16 KiB  128 rows x 64 bf16, 128-byte swizzle (the bf16 kernel's)
 *   codes    8 KiB  256 weight rows x 32 bytes, unswizzled
 *   scales   2 KiB  [row][half]: INT4 the f32 scale of each 32-column half's group; NVFP4
 *                   [row][0] the 32-bit word of the row's four e4m3 scales of the 64 columns
 *   zeros    2 KiB  INT4 with zero points: [row][half] the aligned 32-bit word holding the
 *                   group's zero byte (the converter picks the byte, below)
 * and two bf16 weight operands of 32 KiB (256 rows x 64 columns, the 128-byte swizzle),
 * written in turn: step kt's while step kt - 1's wgmmas run.
 *
 * Step kt (stage st, operand b = kt % 2):
 *   wait for the thread's copies of stage st; barrier 1: stage st landed for all, and every
 *     warpgroup has waited for the wgmmas of step kt - 2 (its wait at step kt - 1), so
 *     stage (st + 2) % 4 and operand b, which they read, are free;
 *   copies of step kt + 2 into stage (st + 2) % 4;
 *   convert stage st's codes into operand b (generic stores), fence.proxy.async (those
 *     stores and the thread's landed cp.async writes of A, for the async proxy's reads);
 *   barrier 2: operand b written and fenced by all;
 *   the wgmmas on A of stage st and operand b, then wait for those of step kt - 1.
 * Persistent as the bf16 kernel: one block per SM over the (tile, column block) items at a
 * stride of the grid, the ring running ahead across items. */
#include <stdint.h>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_qformat.cuh"
#include "backend/cuda/cuda_util.h"
#include "backend/cuda/cuda_wgmma.cuh"
#include "backend/cuda/moe_grouped_tile.cuh"
#include "backend/cuda/moe_internal.cuh"

#define W4_BM 128 /* sorted rows a tile (QD_MOE_WG_BM) */
#define W4_BN 256 /* weight rows a tile */
#define W4_BK 64  /* columns a k-step: 32 bytes of codes a weight row, 128 bytes of bf16 */
#define W4_ST 4
#define W4_NT 256
#define W4_A_BYTES (W4_BM * W4_BK * 2)
#define W4_Q_BYTES (W4_BN * W4_BK / 2)
#define W4_S_BYTES (W4_BN * 2 * 4)
#define W4_Z_BYTES (W4_BN * 2 * 4)
#define W4_STAGE_BYTES (W4_A_BYTES + W4_Q_BYTES + W4_S_BYTES + W4_Z_BYTES)
#define W4_B_BYTES (W4_BN * W4_BK * 2)
/* 4 x 28 KiB + 2 x 32 KiB + the 1024-byte alignment of the swizzle atoms: 177 KiB */
#define W4_SMEM (W4_ST * W4_STAGE_BYTES + 2 * W4_B_BYTES + 1024)

static_assert(W4_BM == QD_MOE_WG_BM, "the plan's tiles are the kernel's");
static_assert(W4_BN == 256 && W4_BK == 64, "qd_mg_wgmma_k64's step");
static_assert(W4_STAGE_BYTES % 1024 == 0, "stages keep the swizzle atoms' alignment");
static_assert(W4_SMEM <= 227 * 1024, "a block's shared memory on sm_90");

struct w4_call {
    const uint16_t *A;   /* gate_up: x [n][H]; down: act [P][I] by sorted row */
    qd_cuda_qmats W;     /* gate_up: 2E matrices [I][H]; down: E matrices [H][I] (qd_moe_w4_takes) */
    const int32_t *seg, *n_tiles, *sorted;
    const int2 *tiles;
    uint16_t *act_out;   /* gate_up: [P][I] bf16 */
    float *out;          /* down: [P][H] fp32 */
    int H, I, k;
};

/* The copies a thread issues for one k-step of an item: A rows (tid / 8) + 32 q, q < 4, at
 * 16-byte chunk tid % 8 (the bf16 kernel's), and of weight rows (tid / 2) + 128 q, q < 2, the
 * codes of 32-column half h = tid % 2 (16 bytes), with that half's scale (INT4) and zero word
 * (INT4 with zero points), or with h = 0 the row's scale word of the 64 columns (NVFP4).
 * Offsets in 32 bits (qd_moe_w4_takes); one bit a row for rows past the tile or the matrix,
 * whose copies are zero-filled. */
template <class F, int MODE>
struct w4_loader {
    uint32_t a_off[4]; /* A elements */
    uint32_t w_off[2]; /* code bytes of the weight rows' starts */
    uint32_t s_off[2]; /* their first scale (and zero point): row * nbc */
    uint32_t ok;       /* bit q: A row q; bit 4 + q: weight row q */

    __device__ __forceinline__ void start(const w4_call &p, const qd_mg_item &it, int tid) {
        const int K = MODE == 0 ? p.H : p.I;
        ok = 0;
        qd_mg_a_rows<MODE>(it, p.sorted, p.k, p.H, p.I, tid, a_off, &ok);
#pragma unroll
        for (int q = 0; q < 2; q++) {
            bool in;
            const uint32_t row = qd_mg_w_row<MODE, W4_BN>(it, p.H, p.I, (tid >> 1) + 128 * q, &in);
            w_off[q] = row * (uint32_t)(K / 2);
            s_off[q] = row * (uint32_t)p.W.nbc;
            ok |= (uint32_t)in << (4 + q);
        }
    }

    __device__ __forceinline__ void issue(const w4_call &p, unsigned char *stage, int kt, int tid) const {
        const int K = MODE == 0 ? p.H : p.I;
        const int kc = kt * W4_BK + (tid & 7) * 8;
        qd_mg_a_issue(stage, p.A, a_off, ok, kc, kc < K, tid); /* K % 8 == 0: a chunk is all in or all out */
        unsigned char *sq = stage + W4_A_BYTES;
        uint32_t *ss = (uint32_t *)(sq + W4_Q_BYTES), *sz = ss + 2 * W4_BN;
        const int h = tid & 1, kh = kt * W4_BK + 32 * h;
        const bool hin = kh < K; /* K % 32 == 0: a half is all in or all out */
        /* INT4: the half's group (group columns a multiple of 32, or one group a row) */
        const uint32_t grp =
            F::DTYPE == QD_DTYPE_INT4 ? (uint32_t)qf_blk_of(kh, (int)p.W.block_cols, p.W.col_shift) : 0u;
#pragma unroll
        for (int q = 0; q < 2; q++) {
            const int j = (tid >> 1) + 128 * q;
            const bool row_in = (ok >> (4 + q)) & 1, v = hin && row_in;
            qd_cp_async16(sq + j * 32 + 16 * h, p.W.data + (v ? w_off[q] + (uint32_t)(kh / 2) : 0u), v);
            if (F::DTYPE == QD_DTYPE_INT4) {
                const uint32_t si = s_off[q] + grp;
                qd_cp_async4(ss + 2 * j + h, (const float *)p.W.scales + (v ? si : 0u), v ? 4 : 0);
                /* the aligned word holding zero point si: inside the array, whose size, rows * nbc
                 * a matrix with rows % 32 == 0, is a multiple of 4 */
                if (p.W.zeros) qd_cp_async4(sz + 2 * j + h, p.W.zeros + (v ? si & ~3u : 0u), v ? 4 : 0);
            } else if (h == 0) { /* K % 64 == 0: the word of scales kt * 4 .. kt * 4 + 3 is aligned */
                qd_cp_async4(ss + 2 * j, (const uint8_t *)p.W.scales + (row_in ? s_off[q] + 4u * (uint32_t)kt : 0u),
                             row_in ? 4 : 0);
            }
        }
    }
};

/* What the converting thread needs of an item: its weight rows (tid / 8) + 32 q, q < 8, inside
 * the matrix (bit q), each row's first zero point's byte place in its word ((row * nbc) % 4,
 * bits 2q..2q+1) and the matrix factors of the gate (or down) rows and the up rows. */
struct w4_rows {
    uint32_t in, zb;
    float g0, g1;
};

template <class F, int MODE>
__device__ __forceinline__ w4_rows w4_rows_of(const w4_call &p, const qd_mg_item &it, int tid) {
    w4_rows r;
    r.in = r.zb = 0;
#pragma unroll
    for (int q = 0; q < 8; q++) {
        bool in;
        const uint32_t row = qd_mg_w_row<MODE, W4_BN>(it, p.H, p.I, (tid >> 3) + 32 * q, &in);
        r.in |= (uint32_t)in << q;
        r.zb |= ((row * (uint32_t)p.W.nbc) & 3u) << (2 * q); /* the low bits survive the 32-bit product */
    }
    /* F::post: a constant 1 for INT4 (dequant_vec's product by it is then no product) */
    r.g0 = F::DTYPE == QD_DTYPE_NVFP4 ? qf_post_of(p.W, MODE == 0 ? 2 * it.e : it.e) : 1.0f;
    r.g1 = MODE == 0 && F::DTYPE == QD_DTYPE_NVFP4 ? qf_post_of(p.W, 2 * it.e + 1) : r.g0;
    return r;
}

/* Step kt's weight operand: thread tid makes 16-byte chunk c = tid % 8 (columns 8c .. 8c + 7,
 * the codes' 32-bit word c) of weight rows (tid / 8) + 32 q, q < 8, bf16 as dequant_vec does,
 * zeros past K or the matrix. */
template <class F, int MODE>
__device__ __forceinline__ void w4_convert(const w4_call &p, const unsigned char *stage, unsigned char *sb,
                                           const w4_rows &rw, int kt, int tid) {
    const int K = MODE == 0 ? p.H : p.I;
    const int c = tid & 7, kc = kt * W4_BK + 8 * c;
    const bool kin = kc < K;
    const unsigned char *sq = stage + W4_A_BYTES;
    const uint32_t *ss = (const uint32_t *)(sq + W4_Q_BYTES), *sz = ss + 2 * W4_BN;
    /* row r's chunk c in the swizzle: rows 32 apart share r % 8, so one offset and a stride */
    unsigned char *sbc = sb + qd_mg_swz(tid >> 3, c);
    /* INT4 with zero points: the chunk's group, whose low bits place its zero byte */
    const uint32_t zg = F::DTYPE == QD_DTYPE_INT4 && p.W.zeros
                            ? (uint32_t)qf_blk_of(kt * W4_BK + 32 * (c >> 2), (int)p.W.block_cols, p.W.col_shift)
                            : 0u;
#pragma unroll
    for (int q = 0; q < 8; q++) {
        const int r = (tid >> 3) + 32 * q;
        /* made whatever the row (its stage bytes are zero-filled or stale), then kept or not */
        const uint32_t u = *(const uint32_t *)(sq + r * 32 + 4 * c);
        float s;
        int z = 8; /* INT4 without zero points (qf_int4::zero) */
        if (F::DTYPE == QD_DTYPE_INT4) {
            s = __uint_as_float(ss[2 * r + (c >> 2)]);
            if (p.W.zeros) z = (int)((sz[2 * r + (c >> 2)] >> (8 * (((rw.zb >> (2 * q)) + zg) & 3u))) & 0xffu);
        } else {
            s = qf_e4m3(ss[2 * r] >> (8 * (c >> 1))); /* 16-column block c / 2 of the 64 */
        }
        const float g = MODE == 0 && q >= 4 ? rw.g1 : rw.g0;
        float v[8];
        F::decode_word(u, z, v);
#pragma unroll
        for (int e = 0; e < 8; e++) v[e] = v[e] * s * g;
        uint4 o = make_uint4(qd_pack_bf2(v[0], v[1]), qd_pack_bf2(v[2], v[3]), qd_pack_bf2(v[4], v[5]),
                             qd_pack_bf2(v[6], v[7]));
        if (!kin || !((rw.in >> q) & 1)) o = make_uint4(0u, 0u, 0u, 0u);
        *(uint4 *)(sbc + q * 32 * 128) = o;
    }
}

template <class F, int MODE>
__global__ void __launch_bounds__(W4_NT, 1) moe_w4_gemm(const __grid_constant__ w4_call p) {
    extern __shared__ unsigned char w4_smem_raw[];
    /* aligned by an offset from the shared array, so that the converter's loads and stores
     * stay shared-memory accesses (a pointer rebuilt from an integer is a generic one) */
    unsigned char *smem = w4_smem_raw + ((1024u - ((unsigned)__cvta_generic_to_shared(w4_smem_raw) & 1023u)) & 1023u);
    unsigned char *sbw = smem + W4_ST * W4_STAGE_BYTES; /* the two bf16 weight operands */
    const int tid = threadIdx.x, wg = tid >> 7;
    const int K = MODE == 0 ? p.H : p.I;
    const int KT = (K + W4_BK - 1) / W4_BK;
    const int NB = qd_mg_col_blocks<MODE, W4_BN>(MODE == 0 ? p.I : p.H);
    const int n_items = *p.n_tiles * NB;

    /* the loader runs AHEAD k-steps ahead of the multiplies, over the same items */
    constexpr int AHEAD = W4_ST - 2;
    qd_mg_ring<w4_loader<F, MODE>, w4_call> ring;
    ring.begin(p, n_items, NB, tid);
    auto load_next = [&](int st) { ring.next(p, smem + st * W4_STAGE_BYTES, n_items, NB, KT, tid); };
#pragma unroll
    for (int s = 0; s < AHEAD; s++) load_next(s);

    float d0[64], d1[64]; /* gate_up: gate, up columns; down: output columns 0-127, 128-255 */
    int st = 0, b = 0;
    for (int item = blockIdx.x; item < n_items; item += gridDim.x) {
        const qd_mg_item it = qd_mg_item_of(p.tiles, p.seg, item, NB);
        const w4_rows rw = w4_rows_of<F, MODE>(p, it, tid);
#pragma unroll
        for (int i = 0; i < 64; i++) d0[i] = d1[i] = 0.0f;
        for (int kt = 0; kt < KT; kt++) {
            qd_cp_async_wait<AHEAD - 1>();
            /* stage st landed for all; every warpgroup has waited for the wgmmas of two steps
             * back, so their stage, (st + AHEAD) % W4_ST, and their operand, b, are free */
            __syncthreads();
            load_next((st + AHEAD) % W4_ST);
            const unsigned char *stage = smem + st * W4_STAGE_BYTES;
            unsigned char *sb = sbw + b * W4_B_BYTES;
            w4_convert<F, MODE>(p, stage, sb, rw, kt, tid);
            /* the operand's stores and this thread's cp.async writes of stage st (landed at
             * the wait above), for wgmma's reads */
            asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
            __syncthreads(); /* operand b written by all */
            qd_mg_wgmma_k64(d0, d1, stage + wg * (64 * 128), sb);
            st = (st + 1) % W4_ST;
            b ^= 1;
        }
        qd_wgmma_wait0();
        qd_mg_keep(d0, d1);
        /* the next item's first stages are already in flight */
        qd_mg_store<MODE, 16>(d0, d1, it, MODE == 0 ? it.nb * (W4_BN / 2) : it.nb * W4_BN, 128, p.H, p.I, p.act_out,
                              p.out);
    }
    qd_cp_async_wait<0>();
}

/* Whether m is n_mats matrices [rows][cols] in a layout the kernel reads: INT4 with one f32
 * scale a row and group (groups of 32k columns or one a row; the device's INT4 scales are
 * f32, cuda_quant.h), zero points 4-byte aligned or none; NVFP4 (16-column e4m3 blocks) with
 * cols % 64 == 0, so that a k-step's four scales are one aligned word; 16-byte aligned codes. */
static int w4_mats(const qd_cuda_qmats *m, int n_mats, int64_t rows, int64_t cols) {
    if (!m || !m->data || !m->scales || m->n_mats != n_mats || m->rows != rows || m->cols != cols ||
        m->row_bytes != cols / 2 || m->block_rows != 1 || !qd_cuda_qmats_laid_out(m) || ((uintptr_t)m->data & 15) ||
        ((uintptr_t)m->scales & 3) || ((uintptr_t)m->zeros & 3))
        return 0;
    if (m->dtype == QD_DTYPE_INT4) return cols % 32 == 0 && (m->block_cols % 32 == 0 || m->col_shift == 31);
    return m->dtype == QD_DTYPE_NVFP4 && cols % 64 == 0 && m->block_cols == 16 && !m->zeros;
}

int qd_moe_w4_takes(const qd_cuda_moe_args *a) {
    const qd_cuda_qmats *gu = a->q_gate_up, *dn = a->q_down;
    /* 32-bit offsets: the bf16 kernel's bounds (the codes and scales are fewer bytes and
     * elements than the bf16 copy has elements) */
    return gu && dn && gu->dtype == dn->dtype && qd_moe_wg_takes(a) && w4_mats(gu, 2 * a->E, a->I, a->H) &&
           w4_mats(dn, a->E, a->H, a->I);
}

template <class F>
static qd_status w4_gemms(const qd_cuda_moe_args *a, const qd_moe_work *w, cudaStream_t s) {
    const int max_tiles = qd_moe_max_tiles_of((int64_t)a->n * a->k, a->E, QD_MOE_WG_BM);
    w4_call c = {a->d_x, *a->q_gate_up, w->seg, w->n_tiles, w->sorted, w->tiles,
                 (uint16_t *)w->act, NULL, a->H, a->I, a->k};
    const int gu_items = max_tiles * qd_mg_col_blocks<0, W4_BN>(a->I);
    const qd_status st = qd_mg_launch(moe_w4_gemm<F, 0>, c, gu_items, W4_NT, W4_SMEM, s);
    if (st) return st;
    c.A = (const uint16_t *)w->act;
    c.W = *a->q_down;
    c.act_out = NULL;
    c.out = w->out;
    const int dn_items = max_tiles * qd_mg_col_blocks<1, W4_BN>(a->H);
    return qd_mg_launch(moe_w4_gemm<F, 1>, c, dn_items, W4_NT, W4_SMEM, s);
}

qd_status qd_moe_w4_gemms(const qd_cuda_moe_args *a, const qd_moe_work *w, cudaStream_t s) {
    if (!qd_moe_w4_takes(a))
        return qd_cuda_fail(QD_ERR_INVALID_ARG, "moe W4A16: the experts' layout or the call's sizes are not the "
                                                "kernel's");
    return a->q_gate_up->dtype == QD_DTYPE_INT4 ? w4_gemms<qf_int4>(a, w, s) : w4_gemms<qf_nvfp4>(a, w, s);
}
