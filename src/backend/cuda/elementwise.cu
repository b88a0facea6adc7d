/* The model's small ops on the GPU (cuda_ops.h): each is memory-bound, so each is
 * one pass over its rows with fp32 arithmetic, bf16 where the next consumer is a
 * tensor-core matmul. Reductions use a fixed tree, so results do not depend on
 * which other rows share the batch. */
#include <math.h>

#include <cooperative_groups.h>

#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/cuda_util.h"
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_pdl.cuh"

namespace cg = cooperative_groups;

static int grid_for(int64_t n, int threads) {
    int64_t g = (n + threads - 1) / threads;
    return (int)(g > 65535 * 16 ? 65535 * 16 : (g < 1 ? 1 : g));
}

/* Sum over a block of NT threads; every thread gets the total. */
template <int NT> __device__ __forceinline__ float block_sum(float v, float *red) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    __syncthreads(); /* red may still be read from a previous call */
    if (lane == 0) red[warp] = v;
    __syncthreads();
    float t = 0.f;
#pragma unroll
    for (int w = 0; w < NT / 32; w++) t += red[w];
    return t;
}

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float silu(float x) { return x / (1.f + expf(-x)); }

/* ------------------------------------------------------------ conversions */

__global__ void f32_to_bf16_kernel(const float *__restrict__ x, uint16_t *__restrict__ y, int64_t n) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        y[i] = qd_f2bf(x[i]);
}

extern "C" qd_status qd_cuda_f32_to_bf16(const float *d_x, uint16_t *d_y, int64_t n, void *stream) {
    if (n <= 0) return QD_OK;
    f32_to_bf16_kernel<<<grid_for(n, 256), 256, 0, (cudaStream_t)stream>>>(d_x, d_y, n);
    QD_CUDA_CHECK_LAUNCH("f32_to_bf16");
    return QD_OK;
}

/* -------------------------------------------------------------- embedding */

__global__ void embed_kernel(const uint16_t *__restrict__ table, const int32_t *__restrict__ tokens, int H,
                             float *__restrict__ h) {
    const int r = blockIdx.x;
    const uint16_t *src = table + (size_t)tokens[r] * H;
    for (int i = threadIdx.x; i < H; i += blockDim.x) h[(size_t)r * H + i] = qd_bf2f(src[i]);
}

extern "C" qd_status qd_cuda_embed(const uint16_t *d_embed, const int32_t *d_tokens, int n, int H, float *d_h,
                                   void *stream) {
    if (n <= 0) return QD_OK;
    embed_kernel<<<n, 256, 0, (cudaStream_t)stream>>>(d_embed, d_tokens, H, d_h);
    QD_CUDA_CHECK_LAUNCH("embed");
    return QD_OK;
}

/* ---------------------------------------------------- residual + RMSNorm */

#define NORM_NT 256 /* linear_input.cuh QD_LIN_NORM_NT emulates its sums */

/* Normed value t of row i, column c: bf16 into x, and where asked fp32 into xf or the two
 * bf16 parts of what bf16 leaves (t - hi and what is left of it are exact in fp32; three
 * bf16 parts carry 24 bits) into xr. */
__device__ __forceinline__ void rmsnorm_put(float t, int i, int c, int H, uint16_t *__restrict__ x,
                                            float *__restrict__ xf, uint16_t *__restrict__ xr) {
    const uint16_t hi = qd_f2bf(t);
    x[(size_t)i * H + c] = hi;
    if (xf) xf[(size_t)i * H + c] = t;
    if (xr) {
        const float r1 = t - __uint_as_float((uint32_t)hi << 16);
        const uint16_t mid = qd_f2bf(r1);
        xr[(size_t)i * 2 * H + c] = mid;
        xr[(size_t)i * 2 * H + H + c] = qd_f2bf(r1 - __uint_as_float((uint32_t)mid << 16));
    }
}

/* Thread t owns columns t, t + NORM_NT, ... of a row and sums their squares in that order
 * (linear_input.cuh emulates exactly these sums). V > 0: a row of at most V NORM_NT columns,
 * held in registers: the norm weights load before the wait for the previous kernel, a
 * thread's loads of h and y are all in flight at once, and the second pass reuses the
 * values instead of reading them back (a one-row call is one block, so its latency is the
 * kernel's: H100 RESULTS session 44). V = 0: any width, a loop over the row twice. */
template <int V>
__global__ void __launch_bounds__(NORM_NT)
add_rmsnorm_kernel(float *__restrict__ h, const float *__restrict__ y, const float *__restrict__ w, float eps, int H,
                   const int32_t *__restrict__ rows, uint16_t *__restrict__ x, float *__restrict__ xf,
                   uint16_t *__restrict__ xr) {
    __shared__ float red[NORM_NT / 32];
    constexpr int R = V > 0 ? V : 1;
    float wv[R], v[R];
    if (V > 0)
#pragma unroll
        for (int j = 0; j < V; j++) {
            const int c = threadIdx.x + j * NORM_NT;
            wv[j] = c < H ? 1.f + __ldg(w + c) : 0.f;
        }
    qd_pdl_wait(); /* everything it reads but w comes from earlier kernels */
    qd_pdl_trigger();
    const int i = blockIdx.x;
    const int r = rows ? __ldcg(rows + i) : i;
    float *hr = h + (size_t)r * H;
    const float *yr = y ? y + (size_t)r * H : NULL;
    float ss = 0.f;
    if (V > 0) {
#pragma unroll
        for (int j = 0; j < V; j++) { /* activations through L2 (cuda_pdl.cuh) */
            const int c = threadIdx.x + j * NORM_NT;
            v[j] = c < H ? __ldcg(hr + c) : 0.f;
        }
        if (yr)
#pragma unroll
            for (int j = 0; j < V; j++) {
                const int c = threadIdx.x + j * NORM_NT;
                if (c < H) v[j] += __ldcg(yr + c);
            }
#pragma unroll
        for (int j = 0; j < V; j++)
            if (threadIdx.x + j * NORM_NT < H) ss = fmaf(v[j], v[j], ss); /* explicit: linear_input.cuh's sums */
        if (yr)
#pragma unroll
            for (int j = 0; j < V; j++) {
                const int c = threadIdx.x + j * NORM_NT;
                if (c < H) hr[c] = v[j];
            }
    } else {
        for (int c = threadIdx.x; c < H; c += NORM_NT) {
            float t = __ldcg(hr + c);
            if (yr) {
                t += __ldcg(yr + c);
                hr[c] = t;
            }
            ss = fmaf(t, t, ss);
        }
    }
    const float inv = rsqrtf(block_sum<NORM_NT>(ss, red) / (float)H + eps);
    if (V > 0) {
#pragma unroll
        for (int j = 0; j < V; j++) {
            const int c = threadIdx.x + j * NORM_NT;
            if (c < H) rmsnorm_put(v[j] * inv * wv[j], i, c, H, x, xf, xr);
        }
    } else {
        for (int c = threadIdx.x; c < H; c += NORM_NT)
            rmsnorm_put(__ldcg(hr + c) * inv * (1.f + w[c]), i, c, H, x, xf, xr);
    }
}

/* The instance for a row of H columns: the fewest registers that hold it, else the loop. */
static void (*add_rmsnorm_for(int H))(float *, const float *, const float *, float, int, const int32_t *, uint16_t *,
                                      float *, uint16_t *) {
    if (H <= 8 * NORM_NT) return add_rmsnorm_kernel<8>;
    if (H <= 16 * NORM_NT) return add_rmsnorm_kernel<16>;
    if (H <= 24 * NORM_NT) return add_rmsnorm_kernel<24>;
    return add_rmsnorm_kernel<0>;
}

extern "C" qd_status qd_cuda_add_rmsnorm(float *d_h, const float *d_y, const float *d_w, float eps, int n, int H,
                                         const int32_t *d_rows, uint16_t *d_x, float *d_xf, void *stream) {
    if (n <= 0) return QD_OK;
    return qd_launch_pdl(1, add_rmsnorm_for(H), dim3(n), dim3(NORM_NT), 0, (cudaStream_t)stream, d_h, d_y, d_w, eps,
                         H, d_rows, d_x, d_xf, (uint16_t *)NULL);
}

extern "C" qd_status qd_cuda_add_rmsnorm_split(float *d_h, const float *d_y, const float *d_w, float eps, int n, int H,
                                               uint16_t *d_x, uint16_t *d_xr, void *stream) {
    if (n <= 0) return QD_OK;
    return qd_launch_pdl(1, add_rmsnorm_for(H), dim3(n), dim3(NORM_NT), 0, (cudaStream_t)stream, d_h, d_y, d_w, eps,
                         H, (const int32_t *)NULL, d_x, (float *)NULL, d_xr);
}

/* --------------------------------------------------------- gated RMSNorm */

/* Warp per (row, head): lane l owns elements l, l + 32, ... and sums their squares in that
 * order (linear_input.cuh takes the same sums). V > 0: a head of at most 32 V elements held
 * in registers (the norm weights load before the wait for the previous kernel, o and z are
 * in flight at once, o is read once); V = 0: any width, a loop. */
template <int V>
__global__ void gated_rmsnorm_kernel(const uint16_t *__restrict__ o, const float *__restrict__ z, int64_t zs,
                                     const float *__restrict__ w, float eps, int n, int hv, int dv,
                                     uint16_t *__restrict__ u) {
    const int64_t wid = (blockIdx.x * (int64_t)blockDim.x + threadIdx.x) / 32;
    const int lane = threadIdx.x % 32;
    constexpr int R = V > 0 ? V : 1;
    float wv[R], ov[R], zv[R];
#pragma unroll
    for (int j = 0; j < V; j++) wv[j] = lane + 32 * j < dv ? __ldg(w + lane + 32 * j) : 0.f;
    qd_pdl_wait();
    qd_pdl_trigger();
    if (wid >= (int64_t)n * hv) return;
    const int r = (int)(wid / hv), h = (int)(wid % hv);
    const uint16_t *oh = o + ((size_t)r * hv + h) * dv; /* activations through L2 (cuda_pdl.cuh) */
    const float *zh = z + (size_t)r * zs + (size_t)h * dv;
    uint16_t *uh = u + ((size_t)r * hv + h) * dv;
    float ss = 0.f;
    if (V > 0) {
#pragma unroll
        for (int j = 0; j < V; j++) {
            const int e = lane + 32 * j;
            ov[j] = e < dv ? qd_bf2f(__ldcg(oh + e)) : 0.f;
            zv[j] = e < dv ? __ldcg(zh + e) : 0.f;
        }
#pragma unroll
        for (int j = 0; j < V; j++)
            if (lane + 32 * j < dv) ss = fmaf(ov[j], ov[j], ss);
        const float inv = 1.f / sqrtf(warp_sum(ss) / (float)dv + eps);
#pragma unroll
        for (int j = 0; j < V; j++)
            if (lane + 32 * j < dv) uh[lane + 32 * j] = qd_f2bf(ov[j] * inv * wv[j] * silu(zv[j]));
    } else {
        for (int e = lane; e < dv; e += 32) {
            const float x = qd_bf2f(__ldcg(oh + e));
            ss = fmaf(x, x, ss);
        }
        const float inv = 1.f / sqrtf(warp_sum(ss) / (float)dv + eps);
        for (int e = lane; e < dv; e += 32)
            uh[e] = qd_f2bf(qd_bf2f(__ldcg(oh + e)) * inv * w[e] * silu(__ldcg(zh + e)));
    }
}

extern "C" qd_status qd_cuda_gated_rmsnorm(const uint16_t *d_o, const float *d_z, int64_t z_stride, const float *d_w,
                                           float eps, int n, int hv, int dv, uint16_t *d_u, void *stream) {
    if (n <= 0) return QD_OK;
    const int64_t warps = (int64_t)n * hv;
    return qd_launch_pdl(1, dv <= 128 ? gated_rmsnorm_kernel<4> : gated_rmsnorm_kernel<0>,
                         dim3((unsigned)((warps * 32 + 255) / 256)), dim3(256), 0, (cudaStream_t)stream, d_o, d_z,
                         z_stride, d_w, eps, n, hv, dv, d_u);
}

/* -------------------------------------------------------------------- add */

__global__ void add_f32_kernel(float *__restrict__ y, int64_t ldy, const float *__restrict__ x, int64_t ldx,
                               int64_t cols, int n) {
    const int64_t N = (int64_t)n * cols;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < N; i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t t = i / cols, c = i - t * cols;
        y[t * ldy + c] += x[t * ldx + c];
    }
}

extern "C" qd_status qd_cuda_add_f32(float *d_y, int64_t ldy, const float *d_x, int64_t ldx, int64_t cols, int n,
                                     void *stream) {
    if (n <= 0 || cols <= 0) return QD_OK;
    add_f32_kernel<<<grid_for((int64_t)n * cols, 256), 256, 0, (cudaStream_t)stream>>>(d_y, ldy, d_x, ldx, cols, n);
    QD_CUDA_CHECK_LAUNCH("add_f32");
    return QD_OK;
}

/* ----------------------------------------------------------------- SwiGLU */

__global__ void silu_mul_kernel(const float *__restrict__ gu, int n, int I, uint16_t *__restrict__ out) {
    qd_pdl_wait();
    qd_pdl_trigger();
    const int64_t N = (int64_t)n * I;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < N; i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t r = i / I, c = i % I;
        out[i] = qd_f2bf(silu(__ldcg(gu + r * 2 * I + c)) * __ldcg(gu + r * 2 * I + I + c)); /* through L2 */
    }
}

extern "C" qd_status qd_cuda_silu_mul(const float *d_gu, int n, int I, uint16_t *d_out, void *stream) {
    if (n <= 0) return QD_OK;
    return qd_launch_pdl(1, silu_mul_kernel, dim3(grid_for((int64_t)n * I, 256)), dim3(256), 0, (cudaStream_t)stream,
                         d_gu, n, I, d_out);
}

__global__ void sigmoid_scale_kernel(float *__restrict__ y, const float *__restrict__ ys, const float *__restrict__ sg,
                                     int64_t sgs, int n, int H) {
    const int64_t N = (int64_t)n * H;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < N; i += (int64_t)gridDim.x * blockDim.x)
        y[i] = fmaf(qd_sigmoidf(sg[(i / H) * sgs]), ys[i], y[i]); /* as moe_combine folds it in */
}

extern "C" qd_status qd_cuda_sigmoid_scale(float *d_y, const float *d_ys, const float *d_sg, int64_t sg_stride, int n,
                                           int H, void *stream) {
    if (n <= 0) return QD_OK;
    sigmoid_scale_kernel<<<grid_for((int64_t)n * H, 256), 256, 0, (cudaStream_t)stream>>>(d_y, d_ys, d_sg, sg_stride,
                                                                                         n, H);
    QD_CUDA_CHECK_LAUNCH("sigmoid_scale");
    return QD_OK;
}

/* ----------------------------------------------------------------- argmax */

#define ARGMAX_NT 1024
#define ARGMAX_CLUSTER 8 /* blocks a row: a cluster, whose shared memories meet */
#define ARGMAX_NONE 0x7fffffff

__device__ __forceinline__ bool argmax_allowed(const uint32_t *allow, int i) {
    return !allow || (allow[i >> 5] >> (i & 31)) & 1u;
}

/* (v, i) replaces (best, besti) where it is larger, or as large at a lower id. */
__device__ __forceinline__ void argmax_take(float v, int i, float &best, int &besti) {
    if (v > best || (v == best && i < besti)) {
        best = v;
        besti = i;
    }
}

/* A cluster of ARGMAX_CLUSTER blocks per row over ids [0, limit) (those its allow mask
 * keeps, when the row has one: allow_row[row] >= 0): the first maximum, then (if asked)
 * its log-softmax, -log(sum exp(x - max)), from a second pass over the row (in L2 by
 * then). Block rank q takes the q-th of ARGMAX_CLUSTER equal slices of the ids: one
 * block a row read 1 MB of logits through one multiprocessor (15 us of a 35B-A3B decode
 * step on an H100). The ranks' maxima and sums meet through the cluster's shared memory
 * in rank order, so a row's result does not depend on the other rows. A masked row with
 * no allowed logit above -inf gets id -1 and logprob -inf; an unmasked row keeps id 0
 * there (its logprob is NaN, as the host sampler's all -inf error). */
__global__ void __cluster_dims__(ARGMAX_CLUSTER, 1, 1) __launch_bounds__(ARGMAX_NT)
argmax_kernel(const float *__restrict__ logits, int V, int limit, const uint32_t *__restrict__ allow_masks,
              const int32_t *__restrict__ allow_row, int32_t *ids, float *logprob) {
    __shared__ float bv[ARGMAX_NT / 32];
    __shared__ int bi[ARGMAX_NT / 32];
    __shared__ float red[ARGMAX_NT / 32];
    __shared__ float rank_max, rank_sum; /* this rank's, read by the others */
    __shared__ int rank_id;
    cg::cluster_group cluster = cg::this_cluster();
    const int q = (int)cluster.block_rank(), r = blockIdx.y;
    const float *row = logits + (size_t)r * V;
    /* NULL for an unmasked row: the block takes the same branch for every id */
    const uint32_t *allow = allow_row && allow_row[r] >= 0
                                ? allow_masks + (size_t)allow_row[r] * (((size_t)V + 31) / 32)
                                : NULL;
    const int slice = (limit + ARGMAX_CLUSTER - 1) / ARGMAX_CLUSTER, i0 = q * slice;
    const int i1 = min(limit, i0 + slice);
    float best = -INFINITY;
    int besti = ARGMAX_NONE;
    for (int i = i0 + (int)threadIdx.x; i < i1; i += ARGMAX_NT) {
        const float x = row[i];
        /* i increases: the first maximum stays */
        if (x > best && argmax_allowed(allow, i)) { best = x; besti = i; }
    }
    for (int o = 16; o > 0; o >>= 1)
        argmax_take(__shfl_xor_sync(0xffffffffu, best, o), __shfl_xor_sync(0xffffffffu, besti, o), best, besti);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    if (lane == 0) { bv[warp] = best; bi[warp] = besti; }
    __syncthreads();
    best = bv[0];
    besti = bi[0];
    for (int w = 1; w < ARGMAX_NT / 32; w++) argmax_take(bv[w], bi[w], best, besti);
    if (threadIdx.x == 0) { rank_max = best; rank_id = besti; }
    cluster.sync();
    best = -INFINITY;
    besti = ARGMAX_NONE;
    for (int k = 0; k < ARGMAX_CLUSTER; k++)
        argmax_take(*cluster.map_shared_rank(&rank_max, k), *cluster.map_shared_rank(&rank_id, k), best, besti);
    /* every thread of the cluster sees the same best and besti: uniform branches */
    const bool none = allow && besti == ARGMAX_NONE;
    float sum = 0.f;
    if (logprob && !none) {
        for (int i = i0 + (int)threadIdx.x; i < i1; i += ARGMAX_NT)
            if (argmax_allowed(allow, i)) sum += expf(row[i] - best);
        sum = block_sum<ARGMAX_NT>(sum, red);
    }
    if (threadIdx.x == 0) rank_sum = sum;
    cluster.sync(); /* the ranks' sums are in; and every rank has read the maxima */
    if (q == 0 && threadIdx.x == 0) {
        ids[r] = none ? -1 : besti == ARGMAX_NONE ? 0 : besti;
        if (logprob) {
            float total = 0.f;
            for (int k = 0; k < ARGMAX_CLUSTER; k++) total += *cluster.map_shared_rank(&rank_sum, k);
            logprob[r] = none ? -INFINITY : -logf(total);
        }
    }
    cluster.sync(); /* rank 0 has read the sums before any rank's shared memory goes */
}

extern "C" qd_status qd_cuda_argmax(const float *d_logits, int n, int V, int limit, const uint32_t *d_allow,
                                    const int32_t *d_allow_row, int32_t *d_ids, float *d_logprob, void *stream) {
    if (n <= 0) return QD_OK;
    if (n > 65535) return qd_cuda_fail(QD_ERR_INVALID_ARG, "argmax: more than 65535 rows in one call");
    if (limit <= 0 || limit > V) limit = V;
    argmax_kernel<<<dim3(ARGMAX_CLUSTER, (unsigned)n), ARGMAX_NT, 0, (cudaStream_t)stream>>>(
        d_logits, V, limit, d_allow, d_allow_row, d_ids, d_logprob);
    QD_CUDA_CHECK_LAUNCH("argmax");
    return QD_OK;
}
