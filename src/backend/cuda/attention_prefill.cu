/* The flash-style prefill kernel of the attention layer (attention.cu has the
 * table that runs it and the algorithm in words). */
#include "backend/cuda/attention.cuh"

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

template <int HDP> static size_t prefill_smem(void) { return (size_t)3 * ATT_TILE * (HDP + 8) * 2; }

template <int HDP>
qd_status attn_launch_prefill(const qd_cuda_attn_args *a, const attn_params &p, int skip_short,
                                cudaStream_t st) {
    const size_t sm = prefill_smem<HDP>();
    QD_CUDA_TRY(cudaFuncSetAttribute(attn_prefill_kernel<HDP>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sm));
    const dim3 grid((unsigned)a->nq, (unsigned)((a->max_span_rows + ATT_TILE - 1) / ATT_TILE), (unsigned)a->n_spans);
    attn_prefill_kernel<HDP><<<grid, ATT_THREADS, sm, st>>>(p, skip_short);
    QD_CUDA_CHECK_LAUNCH("attn_prefill_kernel");
    return QD_OK;
}

template qd_status attn_launch_prefill<32>(const qd_cuda_attn_args *, const attn_params &, int, cudaStream_t);
template qd_status attn_launch_prefill<64>(const qd_cuda_attn_args *, const attn_params &, int, cudaStream_t);
template qd_status attn_launch_prefill<128>(const qd_cuda_attn_args *, const attn_params &, int, cudaStream_t);
template qd_status attn_launch_prefill<256>(const qd_cuda_attn_args *, const attn_params &, int, cudaStream_t);
