/* The arithmetic of the GDN inputs (conv1d + SiLU, the per-head L2 norms, the gates), shared by the
 * kernel that writes them out (gdn_inputs.cu) and the one-token decode kernel that makes them
 * itself (gdn_decode_inputs.cu): one copy of each expression, so the two give the same bits. The
 * sums and products are explicit fmaf or rounded one by one (__fadd_rn, __fmul_rn), which the
 * compiler never contracts: it may otherwise fuse a product into a sum in one kernel only. */
#ifndef QD_GDN_INPUTS_CUH
#define QD_GDN_INPUTS_CUH

#include <math.h>
#include <stdint.h>

#define GI_MAX_DK 256 /* a head's conv outputs: dk / 32 registers per lane */

__device__ __forceinline__ float gi_silu(float x) { return x / __fadd_rn(1.f, expf(-x)); }
__device__ __forceinline__ float gi_sigmoid(float x) { return 1.f / __fadd_rn(1.f, expf(-x)); }

/* A window's output from its inputs in[0..K-1] (tap order) and wt(j), tap j's weight: the
 * sum in tap order, SiLU, and with shift the state moved on by one input. */
template <int KMAX, typename Wt>
__device__ __forceinline__ float gi_conv_out(const float (&in)[KMAX], int K, Wt wt, float *st, bool shift) {
    float acc = 0.f;
#pragma unroll
    for (int j = 0; j < KMAX; j++)
        if (j < K) acc = fmaf(wt(j), in[j], acc);
    if (shift)
#pragma unroll
        for (int j = 0; j + 1 < KMAX; j++)
            if (j + 1 < K) st[j] = in[j + 1];
    return gi_silu(acc);
}

/* silu(conv) of channel c at position t of a span starting at row0: the window
 * reaches back K-1 inputs, into the state where the span has not supplied them.
 * KT: K at compile time (0: K at run time, at most 17), so that the window's loads
 * are all in flight at once. shift: the span is this one row (t = 0) and this thread
 * its channel's only reader, so it moves the state on by one input itself. */
template <int KT>
__device__ __forceinline__ float gi_conv(const float *x, int64_t xs, const float *__restrict__ w,
                                         float *st, int Kr, int row0, int t, int c, bool shift) {
    constexpr int KMAX = KT > 0 ? KT : 17;
    const int K = KT > 0 ? KT : Kr;
    float in[KMAX];
#pragma unroll
    for (int j = 0; j < KMAX; j++) {
        const int src = t - (K - 1) + j; /* position within the span; < 0 reads the state */
        in[j] = j >= K ? 0.f : src >= 0 ? __ldcg(x + (size_t)(row0 + src) * xs + c) : __ldcg(st + (K - 1) + src);
    }
    return gi_conv_out<KMAX>(in, K, [&](int j) { return w[(size_t)c * K + j]; }, st, shift);
}

/* The weights and the state part of channel c's window at position t (KT > 0 only): loaded
 * before the wait for the projection, since neither comes from the kernel before this one
 * (the conv state is written only by this layer's kernels of earlier steps). */
template <int KT> struct gi_window {
    float w[KT > 0 ? KT : 1], s[KT > 0 ? KT : 1];
};

template <int KT>
__device__ __forceinline__ void gi_window_load(gi_window<KT> &win, const float *__restrict__ w, const float *st,
                                               int t, int c) {
#pragma unroll
    for (int j = 0; j < KT; j++) {
        const int src = t - (KT - 1) + j;
        win.w[j] = w[(size_t)c * KT + j];
        win.s[j] = src < 0 ? __ldcg(st + (KT - 1) + src) : 0.f;
    }
}

/* gi_conv with the window's weights and state already loaded */
template <int KT>
__device__ __forceinline__ float gi_conv_win(const gi_window<KT> &win, const float *x, int64_t xs, float *st,
                                             int row0, int t, int c, bool shift) {
    float in[KT > 0 ? KT : 1];
#pragma unroll
    for (int j = 0; j < KT; j++) {
        const int src = t - (KT - 1) + j;
        in[j] = src >= 0 ? __ldcg(x + (size_t)(row0 + src) * xs + c) : win.s[j];
    }
    return gi_conv_out<(KT > 0 ? KT : 1)>(in, KT, [&](int j) { return win.w[j]; }, st, shift);
}

/* A head's L2-norm scale from each lane's sum of squares of its values (summed with
 * gi_sq_acc in value order): the warp's sum, then 1 / sqrt(sum + 1e-6), times dk^-0.5 for q. */
__device__ __forceinline__ float gi_sq_acc(float ss, float v) { return fmaf(v, v, ss); }

__device__ __forceinline__ float gi_head_scale(float ss, bool is_q, int dk) {
    for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    const float inv = 1.f / sqrtf(__fadd_rn(ss, 1e-6f));
    /* 1 / sqrt(dk) correctly rounded at run time and when folded at compile time (rsqrtf is not),
     * as dk is a constant in one caller */
    return is_q ? __fmul_rn(inv, 1.f / sqrtf((float)dk)) : inv;
}

/* g = -exp(A_log) * softplus(a + dt_bias) (softplus as torch, threshold 20), beta = sigmoid(b).
 * Not inlined: its library calls (expf, log1pf) are then compiled on their own, to the same code
 * in both kernels' files, where inlined into different code the compiler may fuse their steps
 * differently. */
static __device__ __noinline__ void gi_gates(float a, float b, float A_log, float dt_bias, float *g, float *beta) {
    const float xa = __fadd_rn(a, dt_bias);
    const float spl = xa > 20.f ? xa : log1pf(expf(xa));
    *g = __fmul_rn(-expf(A_log), spl);
    *beta = gi_sigmoid(b);
}

#endif
