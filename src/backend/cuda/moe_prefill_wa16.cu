/* The prefill grouped GEMMs of quantized experts on the bf16 wgmma with the weights made bf16
 * in shared memory (W4A16: INT4 with group scales, NVFP4; W8A16: FP8 e4m3 with f32 block
 * scales of any block shape; sm_90a): the weights are read as stored and converted a k-step
 * at a time (Marlin's approach), rather than every expert of the layer dequantized into a
 * bf16 copy first (1.6 GB written and read a layer at the 35B-A3B's size). The same job,
 * inputs and outputs as moe_wg_gemm (moe_prefill_wgmma.cu) on that copy.
 *
 * Bits: a weight is made bf16 as dequant_vec (gemv_quant.cu) makes the copy: the format's
 * decode (cuda_qformat.cuh: decode_word, FP8 decode_words), times the block scale, times the
 * matrix factor (NVFP4's global; 1 for the others, a product dequant_vec does not make
 * either), in fp32 and in that order, rounded by qd_pack_bf2. The tile, the k-steps and the
 * wgmmas are moe_wg_gemm's (qd_mg_wgmma_k64, zeros past K), so each output is the same
 * chain of k16 products of the same bf16 numbers as the copy's wgmma kernel gives, and so
 * the same as its mma.sync kernels (moe_prefill.cu): the copy's bits at every n.
 *
 * Tile: 128 sorted rows (warpgroup w: rows 64 w ..) x 256 weight rows (gate_up: 128 gate
 * rows and the same 128 up rows; down: 256 output columns), k-steps of 64 columns through a
 * 4-stage cp.async ring (wa_lay), a stage:
 *   A       16 KiB  128 rows x 64 bf16, 128-byte swizzle (the bf16 kernel's)
 *   codes    8 KiB  4-bit: 256 weight rows x 32 bytes, unswizzled
 *           16 KiB  FP8: 256 weight rows x 64 bytes, unswizzled
 *   scales   2 KiB  INT4: [row][half] the f32 scale of each 32-column half's group; NVFP4:
 *                   [row][0] the 32-bit word of the row's four e4m3 scales of the 64 columns
 *            4 KiB  FP8: [row][piece] the f32 block scale of each 16-column piece (a piece
 *                   lies in one block: block columns a multiple of 16, or one block a row)
 *   zeros    2 KiB  INT4 with zero points: [row][half] the aligned 32-bit word holding the
 *                   group's zero byte (the converter picks the byte, below); none for FP8
 * and two bf16 weight operands of 32 KiB (256 rows x 64 columns, the 128-byte swizzle),
 * written in turn: step kt's while step kt - 1's wgmmas run. 4-bit: 4 x 28 + 2 x 32 + 1 (the
 * alignment) = 177 KiB of the 227; FP8: 4 x 36 + 2 x 32 + 1 = 209 KiB.
 *
 * Step kt (stage st, operand b = kt % 2):
 *   wait for the thread's copies of stage st; barrier 1: stage st landed for all, and every
 *     warpgroup has waited for the wgmmas of step kt - 2 (its wait at step kt - 1), so
 *     stage (st + 2) % 4 and operand b, which they read, are free;
 *   copies of step kt + 2 into stage (st + 2) % 4 (a thread: 4 A rows' 16 bytes; 4-bit: one
 *     16-byte half of each of two weight rows' codes, with its scale and zero word; FP8: one
 *     16-byte piece of each of four weight rows' codes and the piece's scale of each);
 *   convert stage st's codes into operand b (a thread: 8 of the 256 x 8 16-byte chunks;
 *     generic stores), fence.proxy.async (those stores and the thread's landed cp.async
 *     writes of A, for the async proxy's reads);
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

#define WA_BM 128 /* sorted rows a tile (QD_MOE_WG_BM) */
#define WA_BN 256 /* weight rows a tile */
#define WA_BK 64  /* columns a k-step: 32 bytes of 4-bit codes or 64 of e4m3 a weight row, 128 bytes of bf16 */
#define WA_ST 4
#define WA_NT 256
#define WA_A_BYTES (WA_BM * WA_BK * 2)
#define WA_B_BYTES (WA_BN * WA_BK * 2)

/* A stage's parts after A for format F (the header's table). */
template <class F>
struct wa_lay {
    static constexpr bool F8 = F::DTYPE == QD_DTYPE_F8_E4M3;
    static constexpr int ROW_Q = F8 ? WA_BK : WA_BK / 2;      /* code bytes of a weight row */
    static constexpr int ROW_S = F8 ? WA_BK / 16 : 2;         /* 32-bit scale slots of a weight row */
    static constexpr int Q_BYTES = WA_BN * ROW_Q;
    static constexpr int S_BYTES = WA_BN * ROW_S * 4;
    static constexpr int Z_BYTES = F8 ? 0 : WA_BN * 2 * 4;
    static constexpr int STAGE_BYTES = WA_A_BYTES + Q_BYTES + S_BYTES + Z_BYTES;
    /* the stages, two bf16 operands and the 1024-byte alignment of the swizzle atoms:
     * 4-bit 4 x 28 + 2 x 32 + 1 = 177 KiB, FP8 4 x 36 + 2 x 32 + 1 = 209 KiB */
    static constexpr int SMEM = WA_ST * STAGE_BYTES + 2 * WA_B_BYTES + 1024;
    static_assert(STAGE_BYTES % 1024 == 0, "stages keep the swizzle atoms' alignment");
    static_assert(SMEM <= 227 * 1024, "a block's shared memory on sm_90");
};

static_assert(WA_BM == QD_MOE_WG_BM, "the plan's tiles are the kernel's");
static_assert(WA_BN == 256 && WA_BK == 64, "qd_mg_wgmma_k64's step");
static_assert(WA_NT == WA_BN, "the 4-bit loader: a 16-byte half of each of two weight rows' codes a thread");
static_assert(WA_NT * 4 * 16 == WA_BN * WA_BK, "the FP8 loader: a 16-byte piece of four weight rows' codes a thread");

struct wa_call {
    const uint16_t *A;   /* gate_up: x [n][H]; down: act [P][I] by sorted row */
    qd_cuda_qmats W;     /* gate_up: 2E matrices [I][H]; down: E matrices [H][I] (qd_moe_wa16_takes) */
    const int32_t *seg, *n_tiles, *sorted;
    const int2 *tiles;
    uint16_t *act_out;   /* gate_up: [P][I] bf16 */
    float *out;          /* down: [P][H] fp32 */
    int H, I, k;
};

/* The copies a thread issues for one k-step of an item with 4-bit weights: A rows (tid / 8)
 * + 32 q, q < 4, at 16-byte chunk tid % 8 (the bf16 kernel's), and of weight rows (tid / 2)
 * + 128 q, q < 2, the codes of 32-column half h = tid % 2 (16 bytes), with that half's scale
 * (INT4) and zero word (INT4 with zero points), or with h = 0 the row's scale word of the 64
 * columns (NVFP4). Offsets in 32 bits (qd_moe_wa16_takes); one bit a row for rows past the
 * tile or the matrix, whose copies are zero-filled. */
template <class F, int MODE>
struct wa_loader_4b {
    uint32_t a_off[4]; /* A elements */
    uint32_t w_off[2]; /* code bytes of the weight rows' starts */
    uint32_t s_off[2]; /* their first scale (and zero point): row * nbc */
    uint32_t ok;       /* bit q: A row q; bit 4 + q: weight row q */

    __device__ __forceinline__ void start(const wa_call &p, const qd_mg_item &it, int tid) {
        const int K = MODE == 0 ? p.H : p.I;
        ok = 0;
        qd_mg_a_rows<MODE>(it, p.sorted, p.k, p.H, p.I, tid, a_off, &ok);
#pragma unroll
        for (int q = 0; q < 2; q++) {
            bool in;
            const uint32_t row = qd_mg_w_row<MODE, WA_BN>(it, p.H, p.I, (tid >> 1) + 128 * q, &in);
            w_off[q] = row * (uint32_t)(K / 2);
            s_off[q] = row * (uint32_t)p.W.nbc;
            ok |= (uint32_t)in << (4 + q);
        }
    }

    __device__ __forceinline__ void issue(const wa_call &p, unsigned char *stage, int kt, int tid) const {
        const int K = MODE == 0 ? p.H : p.I;
        const int kc = kt * WA_BK + (tid & 7) * 8;
        qd_mg_a_issue(stage, p.A, a_off, ok, kc, kc < K, tid); /* K % 8 == 0: a chunk is all in or all out */
        unsigned char *sq = stage + WA_A_BYTES;
        uint32_t *ss = (uint32_t *)(sq + wa_lay<F>::Q_BYTES), *sz = ss + 2 * WA_BN;
        const int h = tid & 1, kh = kt * WA_BK + 32 * h;
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

/* ... with FP8 weights: the A rows as above, and of weight rows (tid / 4) + 64 q, q < 4, the
 * codes of 16-column piece c = tid % 4 (16 bytes: a warp's copies land on 512 consecutive
 * bytes) with the piece's f32 block scale (a piece lies in one block; the piece's block is
 * one for the four rows, found once a step). Rows past the tile or the matrix, and pieces
 * past K (K % 16 == 0), are zero-filled. */
template <int MODE>
struct wa_loader_f8 {
    uint32_t a_off[4]; /* A elements */
    uint32_t w_off[4]; /* code bytes of the weight rows' starts */
    uint32_t s_off[4]; /* their scale rows' first scales: (mat * scale_rows + row's block) * nbc */
    uint32_t ok;       /* bit q: A row q; bit 4 + q: weight row q */

    __device__ __forceinline__ void start(const wa_call &p, const qd_mg_item &it, int tid) {
        const int K = MODE == 0 ? p.H : p.I;
        ok = 0;
        qd_mg_a_rows<MODE>(it, p.sorted, p.k, p.H, p.I, tid, a_off, &ok);
#pragma unroll
        for (int q = 0; q < 4; q++) {
            const int j = (tid >> 2) + 64 * q;
            bool in;
            const uint32_t row = qd_mg_w_row<MODE, WA_BN>(it, p.H, p.I, j, &in);
            /* the row's matrix (gate_up: 2e for the gate rows j < 128, q < 2; 2e + 1 for the
             * up rows) and its row there */
            const uint32_t mat = MODE == 0 ? 2u * (uint32_t)it.e + (uint32_t)(q >> 1) : (uint32_t)it.e;
            const uint32_t r = row - mat * (uint32_t)(MODE == 0 ? p.I : p.H);
            const uint32_t rb = p.W.row_shift >= 0 ? r >> p.W.row_shift : r / (uint32_t)p.W.block_rows;
            w_off[q] = row * (uint32_t)K;
            s_off[q] = (mat * (uint32_t)p.W.scale_rows + rb) * (uint32_t)p.W.nbc;
            ok |= (uint32_t)in << (4 + q);
        }
    }

    __device__ __forceinline__ void issue(const wa_call &p, unsigned char *stage, int kt, int tid) const {
        const int K = MODE == 0 ? p.H : p.I;
        const int ka = kt * WA_BK + (tid & 7) * 8;
        qd_mg_a_issue(stage, p.A, a_off, ok, ka, ka < K, tid); /* K % 8 == 0: a chunk is all in or all out */
        unsigned char *sq = stage + WA_A_BYTES;
        uint32_t *ss = (uint32_t *)(sq + wa_lay<qf_f8>::Q_BYTES);
        const int c = tid & 3, kc = kt * WA_BK + 16 * c;
        const bool kin = kc < K;
        const uint32_t blk = (uint32_t)qf_blk_of(kc, (int)p.W.block_cols, p.W.col_shift);
#pragma unroll
        for (int q = 0; q < 4; q++) {
            const int j = (tid >> 2) + 64 * q;
            const bool v = kin && ((ok >> (4 + q)) & 1);
            qd_cp_async16(sq + j * WA_BK + 16 * c, p.W.data + (v ? w_off[q] + (uint32_t)kc : 0u), v);
            qd_cp_async4(ss + 4 * j + c, (const float *)p.W.scales + (v ? s_off[q] + blk : 0u), v ? 4 : 0);
        }
    }
};

template <class F, int MODE, bool F8 = wa_lay<F>::F8>
struct wa_loader_of {
    typedef wa_loader_4b<F, MODE> type;
};
template <class F, int MODE>
struct wa_loader_of<F, MODE, true> {
    typedef wa_loader_f8<MODE> type;
};

/* What the converting thread needs of an item: its weight rows (tid / 8) + 32 q, q < 8, inside
 * the matrix (bit q), each row's first zero point's byte place in its word ((row * nbc) % 4,
 * bits 2q..2q+1) and the matrix factors of the gate (or down) rows and the up rows. */
struct wa_rows {
    uint32_t in, zb;
    float g0, g1;
};

template <class F, int MODE>
__device__ __forceinline__ wa_rows wa_rows_of(const wa_call &p, const qd_mg_item &it, int tid) {
    wa_rows r;
    r.in = r.zb = 0;
#pragma unroll
    for (int q = 0; q < 8; q++) {
        bool in;
        const uint32_t row = qd_mg_w_row<MODE, WA_BN>(it, p.H, p.I, (tid >> 3) + 32 * q, &in);
        r.in |= (uint32_t)in << q;
        r.zb |= ((row * (uint32_t)p.W.nbc) & 3u) << (2 * q); /* the low bits survive the 32-bit product */
    }
    /* F::post: a constant 1 for INT4 and FP8 (dequant_vec's product by it is then no product) */
    r.g0 = F::DTYPE == QD_DTYPE_NVFP4 ? qf_post_of(p.W, MODE == 0 ? 2 * it.e : it.e) : 1.0f;
    r.g1 = MODE == 0 && F::DTYPE == QD_DTYPE_NVFP4 ? qf_post_of(p.W, 2 * it.e + 1) : r.g0;
    return r;
}

/* Step kt's weight operand: thread tid makes 16-byte chunk c = tid % 8 (columns 8c .. 8c + 7:
 * 4-bit the codes' 32-bit word c, FP8 words 2c and 2c + 1) of weight rows (tid / 8) + 32 q,
 * q < 8 (gate_up: q < 4 gate rows, q >= 4 up rows), bf16 as dequant_vec does, zeros past K or
 * the matrix. */
template <class F, int MODE>
__device__ __forceinline__ void wa_convert(const wa_call &p, const unsigned char *stage, unsigned char *sb,
                                           const wa_rows &rw, int kt, int tid) {
    typedef wa_lay<F> L;
    const int K = MODE == 0 ? p.H : p.I;
    const int c = tid & 7, kc = kt * WA_BK + 8 * c;
    const bool kin = kc < K;
    const unsigned char *sq = stage + WA_A_BYTES;
    const uint32_t *ss = (const uint32_t *)(sq + L::Q_BYTES), *sz = ss + 2 * WA_BN;
    /* row r's chunk c in the swizzle: rows 32 apart share r % 8, so one offset and a stride */
    unsigned char *sbc = sb + qd_mg_swz(tid >> 3, c);
    /* INT4 with zero points: the chunk's group, whose low bits place its zero byte */
    const uint32_t zg = F::DTYPE == QD_DTYPE_INT4 && p.W.zeros
                            ? (uint32_t)qf_blk_of(kt * WA_BK + 32 * (c >> 2), (int)p.W.block_cols, p.W.col_shift)
                            : 0u;
#pragma unroll
    for (int q = 0; q < 8; q++) {
        const int r = (tid >> 3) + 32 * q;
        /* made whatever the row (its stage bytes are zero-filled or stale), then kept or not */
        float s, v[8];
        if constexpr (L::F8) {
            const uint2 u = *(const uint2 *)(sq + r * WA_BK + 8 * c);
            s = __uint_as_float(ss[4 * r + (c >> 1)]); /* the block scale of 16-column piece c / 2 */
            qf_f8::decode_words(u.x, u.y, v);
        } else {
            const uint32_t u = *(const uint32_t *)(sq + r * 32 + 4 * c);
            int z = 8; /* INT4 without zero points (qf_int4::zero) */
            if (F::DTYPE == QD_DTYPE_INT4) {
                s = __uint_as_float(ss[2 * r + (c >> 2)]);
                if (p.W.zeros) z = (int)((sz[2 * r + (c >> 2)] >> (8 * (((rw.zb >> (2 * q)) + zg) & 3u))) & 0xffu);
            } else {
                s = qf_e4m3(ss[2 * r] >> (8 * (c >> 1))); /* 16-column block c / 2 of the 64 */
            }
            F::decode_word(u, z, v);
        }
        const float g = MODE == 0 && q >= 4 ? rw.g1 : rw.g0;
#pragma unroll
        for (int e = 0; e < 8; e++) v[e] = v[e] * s * g;
        uint4 o = make_uint4(qd_pack_bf2(v[0], v[1]), qd_pack_bf2(v[2], v[3]), qd_pack_bf2(v[4], v[5]),
                             qd_pack_bf2(v[6], v[7]));
        if (!kin || !((rw.in >> q) & 1)) o = make_uint4(0u, 0u, 0u, 0u);
        *(uint4 *)(sbc + q * 32 * 128) = o;
    }
}

template <class F, int MODE>
__global__ void __launch_bounds__(WA_NT, 1) moe_wa16_gemm(const __grid_constant__ wa_call p) {
    typedef wa_lay<F> L;
    extern __shared__ unsigned char wa_smem_raw[];
    /* aligned by an offset from the shared array, so that the converter's loads and stores
     * stay shared-memory accesses (a pointer rebuilt from an integer is a generic one) */
    unsigned char *smem = wa_smem_raw + ((1024u - ((unsigned)__cvta_generic_to_shared(wa_smem_raw) & 1023u)) & 1023u);
    unsigned char *sbw = smem + WA_ST * L::STAGE_BYTES; /* the two bf16 weight operands */
    const int tid = threadIdx.x, wg = tid >> 7;
    const int K = MODE == 0 ? p.H : p.I;
    const int KT = (K + WA_BK - 1) / WA_BK;
    const int NB = qd_mg_col_blocks<MODE, WA_BN>(MODE == 0 ? p.I : p.H);
    const int n_items = *p.n_tiles * NB;

    /* the loader runs AHEAD k-steps ahead of the multiplies, over the same items */
    constexpr int AHEAD = WA_ST - 2;
    qd_mg_ring<typename wa_loader_of<F, MODE>::type, wa_call> ring;
    ring.begin(p, n_items, NB, tid);
    auto load_next = [&](int st) { ring.next(p, smem + st * L::STAGE_BYTES, n_items, NB, KT, tid); };
#pragma unroll
    for (int s = 0; s < AHEAD; s++) load_next(s);

    float d0[64], d1[64]; /* gate_up: gate, up columns; down: output columns 0-127, 128-255 */
    int st = 0, b = 0;
    for (int item = blockIdx.x; item < n_items; item += gridDim.x) {
        const qd_mg_item it = qd_mg_item_of(p.tiles, p.seg, item, NB);
        const wa_rows rw = wa_rows_of<F, MODE>(p, it, tid);
#pragma unroll
        for (int i = 0; i < 64; i++) d0[i] = d1[i] = 0.0f;
        for (int kt = 0; kt < KT; kt++) {
            qd_cp_async_wait<AHEAD - 1>();
            /* stage st landed for all; every warpgroup has waited for the wgmmas of two steps
             * back, so their stage, (st + AHEAD) % WA_ST, and their operand, b, are free */
            __syncthreads();
            load_next((st + AHEAD) % WA_ST);
            const unsigned char *stage = smem + st * L::STAGE_BYTES;
            unsigned char *sb = sbw + b * WA_B_BYTES;
            wa_convert<F, MODE>(p, stage, sb, rw, kt, tid);
            /* the operand's stores and this thread's cp.async writes of stage st (landed at
             * the wait above), for wgmma's reads */
            asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
            __syncthreads(); /* operand b written by all */
            qd_mg_wgmma_k64(d0, d1, stage + wg * (64 * 128), sb);
            st = (st + 1) % WA_ST;
            b ^= 1;
        }
        qd_wgmma_wait0();
        qd_mg_keep(d0, d1);
        /* the next item's first stages are already in flight */
        qd_mg_store<MODE, 16>(d0, d1, it, MODE == 0 ? it.nb * (WA_BN / 2) : it.nb * WA_BN, 128, p.H, p.I, p.act_out,
                              p.out);
    }
    qd_cp_async_wait<0>();
}

/* Whether m is n_mats matrices [rows][cols] in a layout the kernel reads (16-byte aligned
 * codes, 4-byte aligned scales and zero points):
 *   INT4 with one f32 scale a row and group (groups of 32k columns or one a row; the
 *     device's INT4 scales are f32, cuda_quant.h), zero points or none, cols % 32 == 0;
 *   NVFP4 (16-column e4m3 blocks) with cols % 64 == 0, so that a k-step's four scales are
 *     one aligned word;
 *   F8_E4M3 with f32 scales of any block rows and block columns a multiple of 16 (or one
 *     block a row), cols % 16 == 0: qd_cuda_qlayout_vectorised's FP8 layouts, per-channel
 *     and 128 x 128 blocks among them. */
static int wa_mats(const qd_cuda_qmats *m, int n_mats, int64_t rows, int64_t cols) {
    if (!m || !m->data || !m->scales || m->n_mats != n_mats || m->rows != rows || m->cols != cols ||
        !qd_cuda_qmats_laid_out(m) || !qd_cuda_qmats_aligned(m))
        return 0;
    if (m->dtype == QD_DTYPE_F8_E4M3) /* the row's block found in 32 bits */
        return m->row_bytes == cols && cols % 16 == 0 && (m->block_cols % 16 == 0 || m->col_shift == 31) &&
               m->block_rows <= INT32_MAX && !m->zeros;
    if (m->row_bytes != cols / 2 || m->block_rows != 1) return 0;
    if (m->dtype == QD_DTYPE_INT4) return cols % 32 == 0 && (m->block_cols % 32 == 0 || m->col_shift == 31);
    return m->dtype == QD_DTYPE_NVFP4 && cols % 64 == 0 && m->block_cols == 16 && !m->zeros;
}

int qd_moe_wa16_takes(const qd_cuda_moe_args *a) {
    const qd_cuda_qmats *gu = a->q_gate_up, *dn = a->q_down;
    /* 32-bit offsets: the bf16 kernel's bounds (the codes and scales are no more bytes and
     * elements than the bf16 copy has elements) */
    return gu && dn && gu->dtype == dn->dtype && qd_moe_wg_takes(a) && wa_mats(gu, 2 * a->E, a->I, a->H) &&
           wa_mats(dn, a->E, a->H, a->I);
}

template <class F>
static qd_status wa_gemms(const qd_cuda_moe_args *a, const qd_moe_work *w, cudaStream_t s) {
    const int max_tiles = qd_moe_max_tiles_of((int64_t)a->n * a->k, a->E, QD_MOE_WG_BM);
    wa_call c = {a->d_x, *a->q_gate_up, w->seg, w->n_tiles, w->sorted, w->tiles,
                 (uint16_t *)w->act, NULL, a->H, a->I, a->k};
    const int gu_items = max_tiles * qd_mg_col_blocks<0, WA_BN>(a->I);
    const qd_status st = qd_mg_launch(moe_wa16_gemm<F, 0>, c, gu_items, WA_NT, wa_lay<F>::SMEM, s);
    if (st) return st;
    c.A = (const uint16_t *)w->act;
    c.W = *a->q_down;
    c.act_out = NULL;
    c.out = w->out;
    const int dn_items = max_tiles * qd_mg_col_blocks<1, WA_BN>(a->H);
    return qd_mg_launch(moe_wa16_gemm<F, 1>, c, dn_items, WA_NT, wa_lay<F>::SMEM, s);
}

qd_status qd_moe_wa16_gemms(const qd_cuda_moe_args *a, const qd_moe_work *w, cudaStream_t s) {
    if (!qd_moe_wa16_takes(a))
        return qd_cuda_fail(QD_ERR_INVALID_ARG, "moe W4A16 / W8A16: the experts' layout or the call's sizes are not "
                                                "the kernel's");
    switch (a->q_gate_up->dtype) {
    case QD_DTYPE_INT4: return wa_gemms<qf_int4>(a, w, s);
    case QD_DTYPE_NVFP4: return wa_gemms<qf_nvfp4>(a, w, s);
    default: return wa_gemms<qf_f8>(a, w, s);
    }
}
