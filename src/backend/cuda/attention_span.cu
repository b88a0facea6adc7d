/* The batch-invariant span kernel of the attention layer (attention.cu has the
 * table that runs it; attention.cuh the per-(row, head) steps it shares with the
 * decode kernel). */
#include "backend/cuda/attention.cuh"

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

template <int HDP> static size_t span_smem(void) {
    return (size_t)(SPAN_AR + 2 * DEC_STAGES * ATT_TILE) * (HDP + 8) * 2;
}

template <int HDP> qd_status attn_span_setup(void) {
    QD_CUDA_TRY(cudaFuncSetAttribute(attn_span_kernel<HDP>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     (int)span_smem<HDP>()));
    return QD_OK;
}

template <int HDP>
qd_status attn_launch_span(const qd_cuda_attn_args *a, const attn_params &p, cudaStream_t st) {
    const int G = a->nq / a->nkv;
    const long long pairs = (long long)(p.row_end - p.row0) * G;
    const dim3 grid((unsigned)((pairs + SPAN_AR - 1) / SPAN_AR), (unsigned)a->nkv, (unsigned)p.nsp);
    attn_span_kernel<HDP><<<grid, SPAN_THREADS(HDP), span_smem<HDP>(), st>>>(p);
    QD_CUDA_CHECK_LAUNCH("attn_span_kernel");
    return QD_OK;
}

template qd_status attn_span_setup<32>(void);
template qd_status attn_span_setup<64>(void);
template qd_status attn_span_setup<128>(void);
template qd_status attn_span_setup<256>(void);
template qd_status attn_launch_span<32>(const qd_cuda_attn_args *, const attn_params &, cudaStream_t);
template qd_status attn_launch_span<64>(const qd_cuda_attn_args *, const attn_params &, cudaStream_t);
template qd_status attn_launch_span<128>(const qd_cuda_attn_args *, const attn_params &, cudaStream_t);
template qd_status attn_launch_span<256>(const qd_cuda_attn_args *, const attn_params &, cudaStream_t);
