/* The prefill grouped GEMMs of the routed experts on Hopper's warpgroup MMA (wgmma,
 * sm_90a), for batches with many (token, slot) pairs per expert. The same job, inputs
 * and outputs as moe_gemm (moe_prefill.cu): gate_up writes bf16 silu(gate) * up per
 * sorted row, down the fp32 product per sorted row; the plan's tiles are 128 rows here.
 *
 * Tile: 128 sorted rows (warpgroup w takes rows 64 w .. 64 w + 63) x 256 weight rows
 * (gate_up: 128 gate rows and the same 128 up rows, so silu(gate) * up forms in the
 * registers that hold both; down: 256 output columns), k-steps of 64 bf16 (one 128-byte
 * swizzle row) through a 4-stage cp.async ring of 48 KiB a stage. Every thread loads
 * (A rows are gathered by the sorted pair list, which the bulk-tensor engine cannot do)
 * and both warpgroups multiply, m64 n128 k16 wgmmas from shared memory.
 *
 * Persistent: one block per SM walks the (tile, column block) items at a stride of the
 * grid, and the ring runs ahead across items, so an item's first stages land while the
 * one before writes its results. Items past the planned tile count are skipped on the
 * device, so the grid is fixed and the path stays graph-capturable.
 *
 * Sums: each output is one chain of k16 products in k order with fp32 accumulation,
 * zero-filled past K, as in moe_gemm; the tensor cores add a k16 step the same way under
 * mma.sync and wgmma, so the two kernels give the same bits (test_cuda_moe checks it),
 * which keeps the prefill path batch-invariant whichever kernel the table picks. */
#include <stdint.h>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_util.h"
#include "backend/cuda/cuda_wgmma.cuh"
#include "backend/cuda/moe_grouped_tile.cuh"
#include "backend/cuda/moe_internal.cuh"

#define WG_BM 128 /* sorted rows a tile (QD_MOE_WG_BM) */
#define WG_BN 256 /* weight rows a tile */
#define WG_BK 64  /* bf16 columns a k-step: 128 bytes */
#define WG_ST 4
#define WG_NT 256
#define WG_A_BYTES (WG_BM * WG_BK * 2)
#define WG_B_BYTES (WG_BN * WG_BK * 2)
#define WG_STAGE_BYTES (WG_A_BYTES + WG_B_BYTES)
#define WG_SMEM (WG_ST * WG_STAGE_BYTES + 1024) /* + the 1024-byte alignment of the swizzle atoms */

static_assert(WG_BM == QD_MOE_WG_BM, "the plan's tiles are the kernel's");
static_assert(WG_BN == 256 && WG_BK == 64, "qd_mg_wgmma_k64's step");

struct wg_call {
    const uint16_t *A; /* gate_up: x [n][H]; down: act [P][I] by sorted row */
    const uint16_t *W; /* gate_up [E][2I][H], down [E][H][I] */
    const int32_t *seg, *n_tiles, *sorted;
    const int2 *tiles;
    uint16_t *act_out; /* gate_up: [P][I] bf16 */
    float *out;        /* down: [P][H] fp32 */
    int H, I, k;
};

/* The copies a thread issues for one k-step of an item: A rows (tid / 8) + 32 q, q < 4, and
 * weight rows (tid / 8) + 32 q, q < 8, each at the thread's 16-byte column chunk tid % 8.
 * Element offsets (the launcher checks that every operand has fewer than 2^32 elements) and
 * one bit a row for rows past the tile's end, which are zero-filled. */
template <int MODE>
struct wg_loader {
    uint32_t a_off[4], b_off[8];
    uint32_t ok; /* bit q: A row q; bit 4 + q: weight row q */

    __device__ __forceinline__ void start(const wg_call &p, const qd_mg_item &it, int tid) {
        ok = 0;
        qd_mg_a_rows<MODE>(it, p.sorted, p.k, p.H, p.I, tid, a_off, &ok);
        qd_mg_w_rows<MODE, WG_BN>(it, p.H, p.I, tid, b_off, &ok);
    }

    __device__ __forceinline__ void issue(const wg_call &p, unsigned char *stage, int kt, int tid) const {
        const int K = MODE == 0 ? p.H : p.I;
        const int c = tid & 7, kc = kt * WG_BK + c * 8;
        const bool kin = kc < K; /* K % 8 == 0: a chunk is all in or all out */
        unsigned char *sb = stage + WG_A_BYTES;
        qd_mg_a_issue(stage, p.A, a_off, ok, kc, kin, tid);
#pragma unroll
        for (int q = 0; q < 8; q++) {
            const int r = (tid >> 3) + 32 * q;
            const bool v = kin && ((ok >> (4 + q)) & 1);
            qd_cp_async16(sb + qd_mg_swz(r, c), p.W + (v ? b_off[q] + (uint32_t)kc : 0u), v);
        }
    }
};

/* The loads run WG_ST - 2 k-steps ahead, and a step's wgmmas run on while the next step's
 * are issued (a wait for all but the last group): H200, 35B-A3B experts, against waiting
 * for every step's wgmmas with the loads a step further ahead, 1.00-1.02x below 2,048
 * tokens and 1.06-1.11x from there (RESULTS session 24). */
template <int MODE>
__global__ void __launch_bounds__(WG_NT, 1) moe_wg_gemm(const __grid_constant__ wg_call p) {
    extern __shared__ unsigned char wg_smem_raw[];
    unsigned char *smem = (unsigned char *)(((uintptr_t)wg_smem_raw + 1023) & ~(uintptr_t)1023);
    const int tid = threadIdx.x, wg = tid >> 7;
    const int K = MODE == 0 ? p.H : p.I;
    const int KT = (K + WG_BK - 1) / WG_BK;
    const int NB = qd_mg_col_blocks<MODE, WG_BN>(MODE == 0 ? p.I : p.H);
    const int n_items = *p.n_tiles * NB;

    /* the loader runs AHEAD k-steps ahead of the multiplies, over the same items */
    constexpr int AHEAD = WG_ST - 2;
    qd_mg_ring<wg_loader<MODE>, wg_call> ring;
    ring.begin(p, n_items, NB, tid);
    auto load_next = [&](int st) { ring.next(p, smem + st * WG_STAGE_BYTES, n_items, NB, KT, tid); };
#pragma unroll
    for (int s = 0; s < AHEAD; s++) load_next(s);

    float d0[64], d1[64]; /* gate_up: gate, up columns; down: output columns 0-127, 128-255 */
    int st = 0;
    for (int item = blockIdx.x; item < n_items; item += gridDim.x) {
        const qd_mg_item it = qd_mg_item_of(p.tiles, p.seg, item, NB);
#pragma unroll
        for (int i = 0; i < 64; i++) d0[i] = d1[i] = 0.0f;
        for (int kt = 0; kt < KT; kt++) {
            qd_cp_async_wait<AHEAD - 1>();
            asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); /* cp.async writes, for wgmma's reads */
            /* stage st landed for all; every warpgroup has waited for the wgmmas of two steps
             * back, so their stage, (st + AHEAD) % WG_ST, is free to refill */
            __syncthreads();
            load_next((st + AHEAD) % WG_ST);
            const unsigned char *stage = smem + st * WG_STAGE_BYTES;
            qd_mg_wgmma_k64(d0, d1, stage + wg * (64 * 128), stage + WG_A_BYTES);
            st = (st + 1) % WG_ST;
        }
        qd_wgmma_wait0();
        qd_mg_keep(d0, d1);
        /* the next item's first stages are already in flight */
        qd_mg_store<MODE, 16>(d0, d1, it, MODE == 0 ? it.nb * (WG_BN / 2) : it.nb * WG_BN, 128, p.H, p.I, p.act_out,
                              p.out);
    }
    qd_cp_async_wait<0>();
}

int qd_moe_wg_takes(const qd_cuda_moe_args *a) {
    /* element offsets in 32 bits: the weights, x and the per-pair activations */
    const uint64_t P = (uint64_t)a->n * (uint64_t)a->k;
    return (uint64_t)a->E * 2u * (uint64_t)a->I * (uint64_t)a->H < ((uint64_t)1 << 32) &&
           (uint64_t)a->n * (uint64_t)a->H < ((uint64_t)1 << 32) && P * (uint64_t)a->I < ((uint64_t)1 << 32);
}

qd_status qd_moe_wg_gemms(const qd_cuda_moe_args *a, const qd_moe_work *w, cudaStream_t s) {
    const int max_tiles = qd_moe_max_tiles_of((int64_t)a->n * a->k, a->E, QD_MOE_WG_BM);
    wg_call c = {a->d_x, a->d_gate_up, w->seg, w->n_tiles, w->sorted, w->tiles, (uint16_t *)w->act, NULL,
                 a->H, a->I, a->k};
    const int gu_items = max_tiles * qd_mg_col_blocks<0, WG_BN>(a->I);
    const qd_status st = qd_mg_launch(moe_wg_gemm<0>, c, gu_items, WG_NT, WG_SMEM, s);
    if (st) return st;
    c.A = (const uint16_t *)w->act;
    c.W = a->d_down;
    c.act_out = NULL;
    c.out = w->out;
    const int dn_items = max_tiles * qd_mg_col_blocks<1, WG_BN>(a->H);
    return qd_mg_launch(moe_wg_gemm<1>, c, dn_items, WG_NT, WG_SMEM, s);
}
