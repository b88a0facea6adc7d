/* What the wgmma grouped GEMMs of the MoE prefill path share (moe_prefill_wgmma.cu: bf16;
 * moe_prefill_wa16.cu: 4- and 8-bit weights made bf16 in shared memory; moe_prefill_fp8.cu:
 * W8A8 FP8): their work items, the 128-byte swizzle of their operand rows in shared memory,
 * the gathered A rows of a tile, the bf16 k-step and the epilogue from the accumulators. Every
 * kernel: tiles of QD_MOE_WG_BM sorted rows (warpgroup w: rows 64 w ..), 256 threads, one
 * 128-byte row of each operand row a k-step; MODE 0 gate_up (A rows gathered from x by the
 * sorted pairs), MODE 1 down (A = the activation rows). */
#ifndef QD_CUDA_MOE_GROUPED_TILE_CUH
#define QD_CUDA_MOE_GROUPED_TILE_CUH

#include <stdint.h>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_util.h"
#include "backend/cuda/cuda_wgmma.cuh"
#include "backend/cuda/moe_internal.cuh"

/* One item's place: tile t of the plan (expert e, first sorted row row0, rows of it),
 * column block nb. Items are (t, nb) at t * NB + nb. */
struct qd_mg_item {
    int e, row0, rows, nb;
};

__device__ __forceinline__ qd_mg_item qd_mg_item_of(const int2 *tiles, const int32_t *seg, int item, int NB) {
    qd_mg_item it;
    const int2 tl = tiles[item / NB];
    it.e = tl.x;
    it.row0 = tl.y;
    it.rows = min(QD_MOE_WG_BM, seg[tl.x + 1] - tl.y);
    it.nb = item % NB;
    return it;
}

/* Column blocks of the items of a tile with BN weight rows (a tile's items are its NB column
 * blocks), over the rows of one weight matrix, n (gate_up: I, down: H): gate_up takes BN / 2
 * gate rows and the same up rows a block, down BN output rows. */
template <int MODE, int BN> __host__ __device__ __forceinline__ int qd_mg_col_blocks(int n) {
    return MODE == 0 ? (n + BN / 2 - 1) / (BN / 2) : (n + BN - 1) / BN;
}

/* Byte offset of 16-byte chunk c of row r in a 128-byte-swizzled operand (cuda_wgmma.cuh). */
__device__ __forceinline__ uint32_t qd_mg_swz(int r, int c) { return (uint32_t)(r * 128 + ((c ^ (r & 7)) << 4)); }

/* A rows (tid / 8) + 32 q, q < 4, of an item: the element offset of each row's start (x's
 * token for gate_up, the activation row for down), bit q of *ok set for the rows inside
 * the tile (the others are zero-filled). */
template <int MODE>
__device__ __forceinline__ void qd_mg_a_rows(const qd_mg_item &it, const int32_t *sorted, int k, int H, int I, int tid,
                                             uint32_t (&off)[4], uint32_t *ok) {
#pragma unroll
    for (int q = 0; q < 4; q++) {
        const int r = (tid >> 3) + 32 * q;
        const bool in = r < it.rows;
        const int rr = it.row0 + (in ? r : 0);
        off[q] = MODE == 0 ? (uint32_t)(sorted[rr] / k) * (uint32_t)H : (uint32_t)rr * (uint32_t)I;
        *ok |= (uint32_t)in << q;
    }
}

/* The A copies of one k-step (qd_cp_async16, 16 bytes a row at column kc, chunk tid % 8):
 * rows (tid / 8) + 32 q of the operand at sa, zero-filled past the tile (bit q of ok clear)
 * or past K (!kin). */
__device__ __forceinline__ void qd_mg_a_issue(unsigned char *sa, const uint16_t *A, const uint32_t (&off)[4],
                                              uint32_t ok, int kc, bool kin, int tid) {
    const int c = tid & 7;
#pragma unroll
    for (int q = 0; q < 4; q++) {
        const int r = (tid >> 3) + 32 * q;
        const bool v = kin && ((ok >> q) & 1);
        qd_cp_async16(sa + qd_mg_swz(r, c), A + (v ? off[q] + (uint32_t)kc : 0u), v);
    }
}

/* Weight row j of an item with BN weight rows: its row among the stacked matrices' rows,
 * *in whether it lies inside its matrix (else the matrix's row 0). gate_up: the first
 * BN / 2 rows are gate rows i0 .. of expert e (row e 2I + i of [E][2I][H]: matrix 2e), the
 * rest the same up rows (I further: matrix 2e + 1); down: output rows h0 .. of [E][H][I]. */
template <int MODE, int BN>
__device__ __forceinline__ uint32_t qd_mg_w_row(const qd_mg_item &it, int H, int I, int j, bool *in) {
    if (MODE == 0) {
        const int i = it.nb * (BN / 2) + (j & (BN / 2 - 1));
        *in = i < I;
        return (2u * (uint32_t)it.e + (j < BN / 2 ? 0u : 1u)) * (uint32_t)I + (*in ? (uint32_t)i : 0u);
    }
    const int h = it.nb * BN + j;
    *in = h < H;
    return (uint32_t)it.e * (uint32_t)H + (*in ? (uint32_t)h : 0u);
}

/* Weight rows (tid / 8) + 32 q, q < BN / 32, of an item with BN weight rows (qd_mg_w_row):
 * the element offset of each row's start (K elements a row), bit 4 + q of *ok set for the
 * rows inside the matrix. */
template <int MODE, int BN>
__device__ __forceinline__ void qd_mg_w_rows(const qd_mg_item &it, int H, int I, int tid,
                                             uint32_t (&off)[BN / 32], uint32_t *ok) {
    const int K = MODE == 0 ? H : I;
#pragma unroll
    for (int q = 0; q < BN / 32; q++) {
        bool in;
        off[q] = qd_mg_w_row<MODE, BN>(it, H, I, (tid >> 3) + 32 * q, &in) * (uint32_t)K;
        *ok |= (uint32_t)in << (4 + q);
    }
}

/* The loads of a persistent grouped GEMM: the block's items (blockIdx.x, then at a stride of
 * the grid) k-step by k-step, running ahead of the multiplies across items, so an item's
 * first stages land while the one before writes its results. LOADER has start(p, item, tid)
 * and issue(p, stage, kt, tid). One cp.async group a call, empty past the last item, so the
 * callers' wait counts stay fixed. */
template <class LOADER, class CALL>
struct qd_mg_ring {
    LOADER ld;
    int item, kt;

    __device__ __forceinline__ void begin(const CALL &p, int n_items, int NB, int tid) {
        item = blockIdx.x;
        kt = 0;
        if (item < n_items) ld.start(p, qd_mg_item_of(p.tiles, p.seg, item, NB), tid);
    }
    __device__ __forceinline__ void next(const CALL &p, unsigned char *stage, int n_items, int NB, int KT, int tid) {
        if (item < n_items) {
            ld.issue(p, stage, kt, tid);
            if (++kt == KT) {
                kt = 0;
                item += gridDim.x;
                if (item < n_items) ld.start(p, qd_mg_item_of(p.tiles, p.seg, item, NB), tid);
            }
        }
        qd_cp_async_commit();
    }
};

/* Blocks of a persistent grouped GEMM: one an SM, or one an item where there are fewer. */
static inline int qd_mg_grid(int max_items) {
    const int sms = qd_cuda_sm_count();
    return max_items < sms ? max_items : sms;
}

/* One persistent grouped-GEMM launch over at most max_items items, its dynamic shared
 * memory opted in (per device, so on every call). */
template <typename Call>
static qd_status qd_mg_launch(void (*kernel)(Call), const Call &c, int max_items, int threads, int smem,
                              cudaStream_t s) {
    QD_CUDA_TRY(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    kernel<<<qd_mg_grid(max_items), threads, smem, s>>>(c);
    QD_CUDA_CHECK_LAUNCH("moe grouped GEMM");
    return QD_OK;
}

/* One k-step of 64 bf16 columns on a 128 x 256 tile: warpgroup w's 64 A rows at sa (the
 * caller's offset), the 256 weight rows at sb (d0: rows 0-127, d1: 128-255), both in the
 * 128-byte swizzle; four k16 steps into each accumulator in k order. The step's wgmmas run
 * on while the caller goes on: this waits for all but them (those of the step before). */
__device__ __forceinline__ void qd_mg_wgmma_k64(float (&d0)[64], float (&d1)[64], const unsigned char *sa,
                                                const unsigned char *sb) {
    qd_wgmma_fence();
#pragma unroll
    for (int j = 0; j < 4; j++) {
        const uint64_t da = qd_wgmma_desc_sw128(sa + 32 * j);
        qd_wgmma_bf16_n128(d0, da, qd_wgmma_desc_sw128(sb + 32 * j));
        qd_wgmma_bf16_n128(d1, da, qd_wgmma_desc_sw128(sb + 128 * 128 + 32 * j));
    }
    qd_wgmma_commit();
    qd_wgmma_wait1();
}

/* The accumulators are read only after the wait for the wgmmas that write them. */
__device__ __forceinline__ void qd_mg_keep(float (&d0)[64], float (&d1)[64]) {
#pragma unroll
    for (int i = 0; i < 64; i++) {
        qd_wgmma_keep(d0[i]);
        qd_wgmma_keep(d1[i]);
    }
}

/* The epilogue of an item from two accumulators of NCH n8 chunks each (the D layout of
 * cuda_wgmma.cuh): gate_up, d0 the gate columns and d1 the same up columns from column
 * col0 of I: act[row][col0 + c] = silu(gate) * up in bf16; down, d0 output columns from
 * col0 and d1 from col0 + d1_off: out[row][..] fp32. */
template <int MODE, int NCH>
__device__ __forceinline__ void qd_mg_store(const float (&d0)[4 * NCH], const float (&d1)[4 * NCH],
                                            const qd_mg_item &it, int col0, int d1_off, int H, int I,
                                            uint16_t *act_out, float *out) {
    const int tid = threadIdx.x, wg = tid >> 7, warp = (tid >> 5) & 3, lane = tid & 31;
    const int g = lane >> 2, t4 = lane & 3;
#pragma unroll
    for (int half = 0; half < 2; half++) {
        const int r = wg * 64 + warp * 16 + g + 8 * half;
        if (r >= it.rows) continue;
        const size_t grow = (size_t)it.row0 + r;
#pragma unroll
        for (int h = 0; h < NCH; h++) {
            const int c = col0 + 8 * h + 2 * t4;
            const float a0 = d0[4 * h + 2 * half], a1 = d0[4 * h + 2 * half + 1];
            const float b0 = d1[4 * h + 2 * half], b1 = d1[4 * h + 2 * half + 1];
            if (MODE == 0) {
                if (c < I) *(uint32_t *)(act_out + grow * I + c) = qd_moe_swiglu2(a0, a1, b0, b1);
            } else {
                if (c < H) *(float2 *)(out + grow * H + c) = make_float2(a0, a1);
                if (c + d1_off < H) *(float2 *)(out + grow * H + c + d1_off) = make_float2(b0, b1);
            }
        }
    }
}

#endif
