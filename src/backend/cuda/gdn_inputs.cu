/* The inputs of the GDN delta rule from the layer's projection, in one pass per
 * row (cuda_ops.h, qd_cuda_gdn_inputs): causal conv1d + SiLU over the ragged
 * batch with per-slot state, the per-head L2 norm of q and k, bf16 q/k/v, and
 * the gates. One launch instead of a conv kernel writing an fp32 intermediate
 * and a prep kernel reading it back: at one token per sequence both are a few
 * microseconds of latency and almost no bytes.
 *
 * Blocks (row, part): the parts of a row (GI_PARTS, more for a few rows) split its
 * q and k heads (a warp per head, whose lanes keep the head's conv outputs in
 * registers for the norm), its v channels and its gates, so that a decode step
 * still spreads over several SMs. Each conv output is summed over the window in tap order, as the
 * CPU does. */
#include <math.h>

#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/cuda_pdl.cuh"
#include "backend/cuda/cuda_util.h"
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/gdn_inputs.cuh"

#define GI_PARTS 8       /* blocks per row */
#define GI_PARTS_FEW 32  /* ... at most GI_FEW_ROWS rows */
#define GI_FEW_ROWS 16
#define GI_NT 256

template <int KT, bool PRE>
__global__ void __launch_bounds__(GI_NT)
gdn_inputs_kernel(int hk, int hv, int dk, int dv, int K, const float *x, int64_t xs, const float *a,
                  const float *b, int64_t abs_, const float *__restrict__ w,
                  const float *__restrict__ A_log, const float *__restrict__ dt_bias, float *state,
                  const int32_t *spans, const int32_t *row_span, uint16_t *__restrict__ q,
                  uint16_t *__restrict__ k, uint16_t *__restrict__ v, float *__restrict__ g,
                  float *__restrict__ beta, int shift) {
    const int r = blockIdx.x, part = blockIdx.y, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int key_dim = hk * dk, value_dim = hv * dv, C = 2 * key_dim + value_dim;
    /* The step's row map (copied in before its first kernel) before the wait: its two
     * dependent reads are then off the chain that starts with the projection. */
    const int32_t *sp = spans + 4 * __ldcg(row_span + r);
    const int row0 = __ldcg(sp), t = r - row0;
    float *st = state + (size_t)__ldcg(sp + 3) * C * (K - 1);
    const int parts = gridDim.y, tid = part * GI_NT + threadIdx.x, nthreads = parts * GI_NT;
    /* PRE (decode-sized batches, KT > 0): the windows of this thread's first q / k head and
     * first v channel (at those sizes its only ones) load before the wait; larger batches keep
     * the registers for occupancy */
    const int hh0 = part * (GI_NT / 32) + warp;
    gi_window<KT> qk[PRE ? GI_MAX_DK / 32 : 1], vw;
    if (PRE) {
        if (hh0 < 2 * hk)
#pragma unroll
            for (int m = 0; m < GI_MAX_DK / 32; m++)
                if (lane + 32 * m < dk) {
                    const int c = hh0 * dk + lane + 32 * m;
                    gi_window_load<KT>(qk[m], w, st + (size_t)c * (K - 1), t, c);
                }
        if (tid < value_dim) {
            const int c = 2 * key_dim + tid;
            gi_window_load<KT>(vw, w, st + (size_t)c * (K - 1), t, c);
        }
    }
    qd_pdl_wait(); /* the projection comes from the previous kernel */
    qd_pdl_trigger();
    /* activations and state through L2 (ld.cg): the previous kernel may have run beside this one */
    for (int hh = hh0; hh < 2 * hk; hh += parts * (GI_NT / 32)) {
        float val[GI_MAX_DK / 32];
        float ss = 0.f;
#pragma unroll
        for (int m = 0; m < GI_MAX_DK / 32; m++) {
            const int i = lane + 32 * m;
            val[m] = 0.f;
            if (i < dk) {
                const int c = hh * dk + i; /* q heads then k heads */
                float *sc = st + (size_t)c * (K - 1);
                val[m] = PRE && hh == hh0 ? gi_conv_win<KT>(qk[PRE ? m : 0], x, xs, sc, row0, t, c, shift)
                                      : gi_conv<KT>(x, xs, w, sc, K, row0, t, c, shift);
                ss = gi_sq_acc(ss, val[m]);
            }
        }
        const float sc = gi_head_scale(ss, hh < hk, dk);
        uint16_t *dst = hh < hk ? q + (size_t)r * key_dim + (size_t)hh * dk : k + (size_t)r * key_dim + (size_t)(hh - hk) * dk;
#pragma unroll
        for (int m = 0; m < GI_MAX_DK / 32; m++)
            if (lane + 32 * m < dk) dst[lane + 32 * m] = qd_f2bf(val[m] * sc);
    }
    for (int i = tid; i < value_dim; i += nthreads) {
        const int c = 2 * key_dim + i;
        float *sc = st + (size_t)c * (K - 1);
        v[(size_t)r * value_dim + i] = qd_f2bf(PRE && i == tid ? gi_conv_win<KT>(vw, x, xs, sc, row0, t, c, shift)
                                                               : gi_conv<KT>(x, xs, w, sc, K, row0, t, c, shift));
    }
    for (int h = tid; h < hv; h += nthreads) {
        gi_gates(__ldcg(a + (size_t)r * abs_ + h), __ldcg(b + (size_t)r * abs_ + h), A_log[h], dt_bias[h],
                 g + (size_t)r * hv + h, beta + (size_t)r * hv + h);
    }
}

/* Spans of several rows: after the outputs, each (span, channel) keeps the last
 * K-1 inputs of [state | x]. */
__global__ void gdn_conv_state_kernel(int n_spans, int C, int K, const float *__restrict__ x, int64_t xs,
                                      float *__restrict__ state, const int32_t *__restrict__ spans) {
    const int64_t idx = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (idx >= (int64_t)n_spans * C) return;
    const int s = (int)(idx / C), c = (int)(idx % C);
    const int row0 = spans[4 * s], T = spans[4 * s + 1], slot = spans[4 * s + 3];
    float *st = state + ((size_t)slot * C + c) * (K - 1);
    float keep[16];
    for (int j = 0; j < K - 1; j++) {
        const int src = T - (K - 1) + j;
        keep[j] = src >= 0 ? x[(size_t)(row0 + src) * xs + c] : st[(K - 1) + src];
    }
    for (int j = 0; j < K - 1; j++) st[j] = keep[j];
}

/* Verify spans (ver[4 s] = first row, rows T, main slot, first verify slot): the conv state
 * after each token t < T - 1, the last K-1 inputs of [state | x[0..t]], into verify slot
 * ver[4 s + 3] + t (the state after the last token is the main slot's, written next). */
__global__ void gdn_conv_verify_kernel(int n_ver, int C, int K, const float *__restrict__ x, int64_t xs,
                                       float *__restrict__ state, const int32_t *__restrict__ ver) {
    const int64_t idx = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (idx >= (int64_t)n_ver * C) return;
    const int s = (int)(idx / C), c = (int)(idx % C);
    const int row0 = ver[4 * s], T = ver[4 * s + 1], slot = ver[4 * s + 2], vslot = ver[4 * s + 3];
    const float *st = state + ((size_t)slot * C + c) * (K - 1);
    for (int t = 0; t + 1 < T; t++) {
        float *out = state + ((size_t)(vslot + t) * C + c) * (K - 1);
        for (int j = 0; j < K - 1; j++) {
            const int src = t + 1 - (K - 1) + j;
            out[j] = src >= 0 ? x[(size_t)(row0 + src) * xs + c] : st[(K - 1) + src];
        }
    }
}

extern "C" qd_status qd_cuda_gdn_inputs(const qd_cuda_gdn_in_args *a, void *stream) {
    if (a->K < 1 || a->K > 17) return qd_cuda_fail(QD_ERR_UNSUPPORTED, "gdn_inputs: conv kernel size must be 1..17");
    if (a->dk < 1 || a->dk > GI_MAX_DK || a->hk < 1 || a->hv < 1 || a->dv < 1)
        return qd_cuda_fail(QD_ERR_UNSUPPORTED, "gdn_inputs: key head dim must be 1..256");
    if (a->n <= 0) return QD_OK;
    cudaStream_t st = (cudaStream_t)stream;
    /* a decode-sized batch spreads each row over more blocks: there the kernel is a few
     * memory latencies long, and more SMs issue them at once */
    const dim3 grid((unsigned)a->n, a->n <= GI_FEW_ROWS ? GI_PARTS_FEW : GI_PARTS);
    qd_status s = qd_launch_pdl(1,
                                a->K != 4                ? gdn_inputs_kernel<0, false>
                                : a->n <= GI_FEW_ROWS ? gdn_inputs_kernel<4, true>
                                                         : gdn_inputs_kernel<4, false>,
                                grid, dim3(GI_NT), 0, st,
                                a->hk, a->hv, a->dk, a->dv, a->K, a->d_x, a->x_stride, a->d_a, a->d_b, a->ab_stride,
                                a->d_w, a->d_A_log, a->d_dt_bias, a->d_state, a->d_spans, a->d_row_span, a->d_q,
                                a->d_k, a->d_v, a->d_g, a->d_beta, a->decode_only ? 1 : 0);
    if (s) return s;
    if (a->K > 1 && a->n_ver > 0) {
        const int C = 2 * a->hk * a->dk + a->hv * a->dv;
        const int64_t n3 = (int64_t)a->n_ver * C;
        gdn_conv_verify_kernel<<<(unsigned)((n3 + 255) / 256), 256, 0, st>>>(a->n_ver, C, a->K, a->d_x, a->x_stride,
                                                                            a->d_state, a->d_ver);
        QD_CUDA_CHECK_LAUNCH("gdn_conv_verify");
    }
    if (a->K > 1 && !a->decode_only) {
        const int C = 2 * a->hk * a->dk + a->hv * a->dv;
        const int64_t n2 = (int64_t)a->n_spans * C;
        gdn_conv_state_kernel<<<(unsigned)((n2 + 255) / 256), 256, 0, st>>>(a->n_spans, C, a->K, a->d_x, a->x_stride,
                                                                           a->d_state, a->d_spans);
        QD_CUDA_CHECK_LAUNCH("gdn_conv_state");
    }
    return QD_OK;
}
