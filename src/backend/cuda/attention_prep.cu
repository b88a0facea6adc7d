/* Gated attention, step 1 (spec 5.2): per query row, the zero-centred RMSNorm of
 * q and k per head, partial NeoX RoPE at the row's position, q pre-scaled by
 * hd^-0.5 and stored bf16 for the attention kernels, k and v stored bf16 into
 * the paged cache through the block table. The gate half of q_proj is left in
 * d_qg, where the attention epilogue reads it.
 *
 * Block (row r, group of PREP_WARPS heads); one warp per head, heads 0..nq-1
 * are query heads, nq..nq+nkv-1 key heads (whose warp also copies the value
 * head). Arithmetic follows qd_cpu_rmsnorm / qd_cpu_rope_neox operation for
 * operation (only the order of the sum of squares differs). */
#include <cuda_runtime.h>
#include <math.h>

#include "backend/cuda/cuda_attn.h"
#include "backend/cuda/cuda_pdl.cuh"
#include "backend/cuda/cuda_util.h"
#include "backend/cuda/cuda_common.cuh"

#define PREP_WARPS 4
#define PREP_MAX_HD 256

struct prep_params {
    int nq, nkv, hd, rope_dim, gated;
    float theta, eps, q_scale;
    const float *qg, *k, *v, *q_norm, *k_norm;
    const int32_t *row_slot, *row_pos, *block_tables;
    int max_blocks_per_seq, block_size;
    long long block_stride;
    uint16_t *kcache, *vcache, *q_out;
};

__global__ void __launch_bounds__(PREP_WARPS * 32) attn_prep_kernel(prep_params p) {
    __shared__ float buf[PREP_WARPS][PREP_MAX_HD];
    __shared__ float cs[PREP_MAX_HD / 2], sn[PREP_MAX_HD / 2];
    qd_pdl_wait(); /* q, k, v come from the previous kernel (cuda_pdl.cuh) */
    qd_pdl_trigger();
    const int r = blockIdx.x, w = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int hd = p.hd, half = p.rope_dim / 2;
    const int pos = p.row_pos[r];

    /* cos/sin of this row's angles, shared by all heads of the block. As on the
     * CPU (and in HF): inv_freq in double rounded to fp32, the angle in fp32. */
    if (threadIdx.x < half) {
        const float inv_freq =
            (float)(1.0 / pow((double)p.theta, (double)(2 * threadIdx.x) / (double)p.rope_dim));
        const float ang = (float)pos * inv_freq;
        cs[threadIdx.x] = cosf(ang);
        sn[threadIdx.x] = sinf(ang);
    }
    __syncthreads();

    const int hh = blockIdx.y * PREP_WARPS + w;
    if (hh >= p.nq + p.nkv) return;
    const bool is_q = hh < p.nq;
    const int j = hh - p.nq; /* kv head when !is_q */
    const float *src = is_q ? p.qg + ((long long)r * p.nq + hh) * (long long)(p.gated ? 2 * hd : hd)
                            : p.k + ((long long)r * p.nkv + j) * hd;
    const float *wn = is_q ? p.q_norm : p.k_norm;
    float *x = buf[w];

    float ss = 0.f;
    for (int d = lane; d < hd; d += 32) {
        const float t = src[d];
        x[d] = t;
        ss += t * t;
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    const float inv = 1.0f / sqrtf(ss / (float)hd + p.eps);
    for (int d = lane; d < hd; d += 32) x[d] = x[d] * inv * (1.0f + wn[d]);
    __syncwarp();

    uint16_t *dst;
    long long cache_off = 0;
    if (is_q) {
        dst = p.q_out + ((long long)r * p.nq + hh) * hd;
    } else {
        const int slot = p.row_slot[r];
        const long long blk = p.block_tables[(long long)slot * p.max_blocks_per_seq + pos / p.block_size];
        cache_off = blk * p.block_stride + ((long long)(pos % p.block_size) * p.nkv + j) * hd;
        dst = p.kcache + cache_off;
    }
    const float scale = is_q ? p.q_scale : 1.0f;
    for (int d = lane; d < hd; d += 32) {
        float y = x[d];
        if (d < half) {
            y = x[d] * cs[d] - x[d + half] * sn[d];
        } else if (d < 2 * half) {
            const int i = d - half;
            y = x[d] * cs[i] + x[i] * sn[i];
        }
        dst[d] = qd_f2bf(y * scale);
    }
    if (!is_q) {
        const float *vs = p.v + ((long long)r * p.nkv + j) * hd;
        uint16_t *vd = p.vcache + cache_off;
        for (int d = lane; d < hd; d += 32) vd[d] = qd_f2bf(vs[d]);
    }
}

extern "C" qd_status qd_cuda_attn_prep(const qd_cuda_attn_args *a, void *stream) {
    if (!a) return qd_cuda_fail(QD_ERR_INVALID_ARG, "qd_cuda_attn_prep: no arguments");
    if (a->n_rows <= 0) return QD_OK;
    if (a->nq <= 0 || a->nkv <= 0 || a->nq % a->nkv || a->hd <= 0 || a->hd > PREP_MAX_HD || a->hd % 8 ||
        a->rope_dim < 0 || a->rope_dim % 2 || a->rope_dim > a->hd || a->block_size <= 0 ||
        a->max_blocks_per_seq <= 0)
        return qd_cuda_fail(QD_ERR_INVALID_ARG, "qd_cuda_attn_prep: bad shape");
    if (!a->d_qg || !a->d_k || !a->d_v || !a->d_q_norm || !a->d_k_norm || !a->d_row_slot || !a->d_row_pos ||
        !a->d_block_tables || !a->d_kcache || !a->d_vcache || !a->d_q)
        return qd_cuda_fail(QD_ERR_INVALID_ARG, "qd_cuda_attn_prep: null pointer");
    prep_params p;
    p.nq = a->nq; p.nkv = a->nkv; p.hd = a->hd; p.rope_dim = a->rope_dim; p.gated = a->gated != 0;
    p.theta = a->rope_theta; p.eps = a->eps; p.q_scale = 1.0f / sqrtf((float)a->hd);
    p.qg = a->d_qg; p.k = a->d_k; p.v = a->d_v; p.q_norm = a->d_q_norm; p.k_norm = a->d_k_norm;
    p.row_slot = a->d_row_slot; p.row_pos = a->d_row_pos; p.block_tables = a->d_block_tables;
    p.max_blocks_per_seq = a->max_blocks_per_seq; p.block_size = a->block_size;
    p.block_stride = (long long)a->block_stride;
    p.kcache = a->d_kcache; p.vcache = a->d_vcache; p.q_out = a->d_q;
    const dim3 grid((unsigned)a->n_rows, (unsigned)((a->nq + a->nkv + PREP_WARPS - 1) / PREP_WARPS));
    if (grid.y > 65535u) return qd_cuda_fail(QD_ERR_INVALID_ARG, "qd_cuda_attn_prep: too many heads");
    return qd_launch_pdl(1, attn_prep_kernel, grid, dim3(PREP_WARPS * 32), 0, (cudaStream_t)stream, p);
}
