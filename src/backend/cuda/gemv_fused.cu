/* The GEMV of decode-sized products (n <= 8 rows of x) with its input made in the
 * kernel (cuda_linear.h).
 *
 * A product this small is bound by reading W once. Each block first builds the n
 * rows of x in shared memory from the layer's inputs (an RMSNorm of the residual,
 * the GDN gated norm, or SwiGLU; plain bf16 x is read in place), then its warps
 * stream weight rows: a group of G warps per row (each warp every G-th run of
 * 32 * FG_U 16-byte pieces, FG_U per lane in flight), one sum per row of x. The
 * grid is one wave (blocks resident at once), each group taking rows at a grid
 * stride, so the prologue is paid once per block, not once per row tile. G is
 * chosen per matrix (fg_pick_group) so that the rows divide evenly over the
 * groups of the wave: with a warp per row, a matrix of 5120 rows over 4224 warps
 * would leave the wave idle for most of its second round. Up to three matrices
 * that share x (attention q, k, v) are one launch: their rows are concatenated.
 *
 * Launched as a programmatic dependent (cuda_pdl.cuh): each warp loads the first
 * piece of its first weight row, then waits for the previous kernel.
 *
 * A row's dot product is summed the same way whatever n is (each lane takes its
 * pieces in order, then a fixed shuffle tree, then the G warps in order; G
 * depends on the matrix and the SM count only), and x is built per row
 * independently of n, so within this kernel a token's outputs do not depend on
 * what else is in the batch. The table (qd_cuda_linear_choice) picks the kernel
 * by n as well as by shape, and where it switches to the plain GEMV, or to cuBLAS
 * above n = 8, the summation order may change. */
#include <math.h>
#include <stdint.h>

#include "backend/cuda/cuda_linear.h"
#include "backend/cuda/linear_input.cuh"
#include "backend/cuda/cuda_quant.h"
#include "backend/cuda/cuda_pdl.cuh"
#include "backend/cuda/cuda_util.h"
#include "backend/cuda/cuda_common.cuh"

#define FG_WARPS 16
#define FG_NT (FG_WARPS * 32)
#define FG_U 4                    /* 16-byte weight loads per lane in flight: 2 KiB per warp */
#define FG_MAX_N 8                /* above this, cuBLAS tiles beat the GEMV */
#define FG_SMEM_MAX (100 * 1024)  /* x in shared memory: two blocks still fit an SM */
struct fg_params {
    int kind, n_out, accumulate, dv;
    int G;        /* warps per row: 1, 2, 4, 8 or 16 */
    int x_global; /* plain x read in place (too large for shared memory) */
    int64_t cols, ldx, ldz;
    const uint16_t *x;
    const float *h;
    const int32_t *rows;
    const float *w;
    float eps;
    const uint16_t *o;
    const float *z;
    const float *gu;
    const uint16_t *W[QD_LIN_MAX_OUT];
    int64_t end[QD_LIN_MAX_OUT]; /* cumulative row counts of the products */
    float *y[QD_LIN_MAX_OUT];
    int64_t ldy[QD_LIN_MAX_OUT];
};

__device__ __forceinline__ float fg_warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* Named barrier of the count threads (whole warps) of one row group; ids from 1
 * (0 is __syncthreads). */
__device__ __forceinline__ void fg_bar(int id, int count) {
    asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(count) : "memory");
}

/* The product that concatenated row r belongs to. */
__device__ __forceinline__ int fg_seg(const fg_params &p, int64_t r) {
    int s = 0;
    while (s + 1 < p.n_out && r >= p.end[s]) s++;
    return s;
}

template <int N>
__global__ void __launch_bounds__(FG_NT, 2) gemv_fused_kernel(const __grid_constant__ fg_params p) {
    extern __shared__ uint4 xs[]; /* [N][cols / 8] when x is built here */
    __shared__ float part[FG_WARPS][N]; /* the G warps' sums of a row */
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int G = p.G, gsh = __ffs(G) - 1; /* G: a power of two */
    const int gpb = FG_WARPS >> gsh, grp = warp >> gsh, sub = warp & (G - 1);
    const int C8 = (int)(p.cols / 8); /* cols < 2^31 (checked by the launcher) */
    const int64_t total = p.end[p.n_out - 1], stride = (int64_t)gridDim.x * gpb;
    const int cfirst = 32 * FG_U * sub, cstep = 32 * FG_U * G;
    int64_t row = (int64_t)blockIdx.x * gpb + grp;
    const uint4 zero = make_uint4(0, 0, 0, 0);
    /* Weights only before the wait: no kernel writes them. wv holds the piece
     * in flight, first the first piece of this warp's share of its first row. */
    uint4 wv[FG_U];
#pragma unroll
    for (int u = 0; u < FG_U; u++) wv[u] = zero;
    if (row < total) {
        const int s = fg_seg(p, row);
        const uint4 *w = (const uint4 *)(p.W[s] + (row - (s ? p.end[s - 1] : 0)) * p.cols);
#pragma unroll
        for (int u = 0; u < FG_U; u++) {
            const int idx = cfirst + 32 * u + lane;
            if (idx < C8) wv[u] = __ldcs(w + idx);
        }
    }
    qd_pdl_wait();
    qd_pdl_trigger();
    /* Activations from here on, read through L2 (ld.cg) since the previous kernel
     * may have run beside this one; x_global (too large for shared memory) is only
     * used by plain launches and read through the read-only cache as before. */
    if (!p.x_global) {
        qd_cuda_lin_in in = {};
        in.kind = p.kind; in.x = p.x; in.ldx = p.ldx; in.h = p.h; in.rows = p.rows; in.w = p.w; in.eps = p.eps;
        in.o = p.o; in.z = p.z; in.ldz = p.ldz; in.dv = p.dv; in.gu = p.gu;
        qd_lin_build_x<FG_NT>(in, p.cols, N, xs);
    }
    __syncthreads();
    const uint4 *xg = p.x_global ? (const uint4 *)p.x : NULL;
    const int64_t xst = p.x_global ? p.ldx / 8 : C8;
    bool first = true;
    for (; row < total; row += stride) {
        const int s = fg_seg(p, row);
        const int64_t lr = row - (s ? p.end[s - 1] : 0);
        const uint4 *w = (const uint4 *)(p.W[s] + lr * p.cols);
        float acc[N];
#pragma unroll
        for (int t = 0; t < N; t++) acc[t] = 0.f;
        for (int c0 = cfirst; c0 < C8; c0 += cstep) {
            if (!first) {
#pragma unroll
                for (int u = 0; u < FG_U; u++) {
                    const int idx = c0 + 32 * u + lane;
                    wv[u] = idx < C8 ? __ldcs(w + idx) : zero;
                }
            }
            first = false;
#pragma unroll
            for (int u = 0; u < FG_U; u++) {
                const int idx = c0 + 32 * u + lane;
                if (idx < C8) {
                    float wf[8];
                    qd_bf16x8_f32(wv[u], wf);
#pragma unroll
                    for (int t = 0; t < N; t++) {
                        float xf[8];
                        qd_bf16x8_f32(xg ? __ldg(xg + t * xst + idx) : xs[t * xst + idx], xf);
#pragma unroll
                        for (int i = 0; i < 8; i++) acc[t] = fmaf(wf[i], xf[i], acc[t]);
                    }
                }
            }
        }
#pragma unroll
        for (int t = 0; t < N; t++) acc[t] = fg_warp_sum(acc[t]);
        if (G > 1) { /* the group's first warp adds the others' sums in order */
            if (lane == 0)
#pragma unroll
                for (int t = 0; t < N; t++) part[warp][t] = acc[t];
            fg_bar(1 + grp, 32 * G);
            if (sub == 0)
                for (int q = 1; q < G; q++)
#pragma unroll
                    for (int t = 0; t < N; t++) acc[t] += part[warp + q][t];
            fg_bar(1 + grp, 32 * G); /* part is reused by the next row */
        }
        if (sub == 0 && lane == 0)
#pragma unroll
            for (int t = 0; t < N; t++) {
                float *yp = p.y[s] + t * p.ldy[s] + lr;
                *yp = p.accumulate ? __ldcg(yp) + acc[t] : acc[t];
            }
    }
}

/* Warps per row for a matrix of `rows` rows of C8 16-byte pieces, on a wave of two
 * blocks per SM (what the launch bounds give; a fixed assumption, so that G, and
 * with it the summation order, does not depend on n): the G whose row groups take
 * the rows in the most even rounds while filling the wave, the smallest G unless a
 * larger one is clearly better. A warp keeps at least one run of 32 * FG_U pieces
 * per row. */
static int fg_pick_group(int64_t rows, int64_t C8) {
    const double wave = 2.0 * qd_cuda_sm_count();
    int best = 1;
    double best_e = -1.0;
    for (int G = 1; G <= FG_WARPS; G *= 2) {
        if (G > 1 && C8 < (int64_t)32 * FG_U * G) break;
        const int64_t gpb = FG_WARPS / G, tiles = (rows + gpb - 1) / gpb;
        const double blocks = tiles < wave ? (double)tiles : wave, R = (double)rows / (blocks * (double)gpb);
        const double e = R / ceil(R) * blocks / wave;
        if (e > best_e * 1.02) {
            best_e = e;
            best = G;
        }
    }
    return best;
}

/* One wave: as many blocks as fit at once (at most max_per_sm per SM), fewer when
 * there are fewer row groups. */
template <int N>
static qd_status fg_launch(fg_params p, size_t smem, int max_per_sm, cudaStream_t st) {
    static int smem_set = 0;
    if (!smem_set) {
        QD_CUDA_TRY(cudaFuncSetAttribute(gemv_fused_kernel<N>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         FG_SMEM_MAX));
        smem_set = 1;
    }
    int occ = 0;
    QD_CUDA_TRY(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, gemv_fused_kernel<N>, FG_NT, smem));
    occ = occ < 1 ? 1 : occ > max_per_sm ? max_per_sm : occ;
    const int64_t total = p.end[p.n_out - 1];
    p.G = fg_pick_group(total, p.cols / 8);
    const int64_t gpb = FG_WARPS / p.G, tiles = (total + gpb - 1) / gpb, wave = (int64_t)occ * qd_cuda_sm_count();
    const unsigned blocks = (unsigned)(tiles < wave ? tiles : wave);
    /* a programmatic dependent only when every activation goes through L2 (not x_global) */
    return qd_launch_pdl(!p.x_global, gemv_fused_kernel<N>, dim3(blocks), dim3(FG_NT), smem, st, p);
}

static qd_status fg_dispatch(const fg_params &p, int n, cudaStream_t st) {
    const size_t smem = p.x_global ? 0 : (size_t)n * (size_t)p.cols * 2;
    /* two blocks per SM (the launch bounds): the gated prologue reads ~6 bytes per
     * element of x from L2, two blocks per SM keep that below a tenth of the weight
     * traffic, and fg_pick_group assumes that wave */
    const int per_sm = 2;
    switch (n) {
    case 1: return fg_launch<1>(p, smem, per_sm, st);
    case 2: return fg_launch<2>(p, smem, per_sm, st);
    case 3: return fg_launch<3>(p, smem, per_sm, st);
    case 4: return fg_launch<4>(p, smem, per_sm, st);
    case 5: return fg_launch<5>(p, smem, per_sm, st);
    case 6: return fg_launch<6>(p, smem, per_sm, st);
    case 7: return fg_launch<7>(p, smem, per_sm, st);
    case 8: return fg_launch<8>(p, smem, per_sm, st);
    default: return qd_cuda_fail(QD_ERR_INTERNAL, "gemv: n out of range");
    }
}

/* Materialises x into scratch with the unfused kernels (the plain path). */
static qd_status fg_materialise(const qd_cuda_lin_in *in, int64_t cols, int n, uint16_t *scratch, void *stream) {
    switch (in->kind) {
    case QD_LIN_RMSNORM:
        return qd_cuda_add_rmsnorm((float *)in->h, NULL, in->w, in->eps, n, (int)cols, in->rows, scratch, NULL,
                                   stream);
    case QD_LIN_GATED:
        return qd_cuda_gated_rmsnorm(in->o, in->z, in->ldz, in->w, in->eps, n, (int)(cols / in->dv), in->dv, scratch,
                                     stream);
    case QD_LIN_SILU: return qd_cuda_silu_mul(in->gu, n, (int)cols, scratch, stream);
    default: return qd_cuda_fail(QD_ERR_INVALID_ARG, "linear: unknown input kind");
    }
}

/* Whether the fused kernel can take the call at all: n <= 8, cols % 8 == 0, 16-byte
 * aligned operands, and x built in shared memory within FG_SMEM_MAX (plain bf16 x
 * too large for it is read in place). Its limits, not the table's preference. */
static int fg_fusable(const qd_cuda_lin_in *in, int64_t cols, int n, const qd_cuda_lin_out *out, int n_out) {
    if (n < 1 || n > FG_MAX_N || cols % 8) return 0;
    for (int j = 0; j < n_out; j++)
        if (!qd_lin_al16(out[j].W) || out[j].rows < 0) return 0;
    const int small = (size_t)n * (size_t)cols * 2 <= FG_SMEM_MAX;
    return qd_lin_buildable(in, cols) && (small || in->kind == QD_LIN_BF16);
}

/* The table's preference among shapes the fused kernel takes: fused up to a weight
 * size that depends on the input kind, n and the number of products. Measured on
 * the H200 with bench/linear_cuda_bench.c (CUDA-graph replays over weights rotated
 * beyond L2, fused time / plain time; bench/RESULTS.md):
 *   n = 1 (session 11), against the one-row GEMV of gemm.cu:
 *   - the fused kernel streams W more slowly than the plain GEMV; what it saves is
 *     the norm / activation kernel, and for q, k, v two GEMV launches, ~2-4 us each;
 *   - RMSNORM: fused 0.54 (8 MiB) to 0.96 (161 MiB), lost at 340 MiB (27B gate_up,
 *     1.18), even on the lm_heads (600+ MiB, 0.98-1.02);
 *   - GATED 0.70 at 8 MiB, 0.89-1.0 at 16-32 MiB, 1.06-1.25 at 48-60 MiB;
 *   - BF16 0.56-0.64 at 4 MiB, 0.91-0.99 at 16 MiB, 1.0-1.28 at 24-60 MiB;
 *   - SILU 0.60-0.99 at 2 MiB, 1.09+ at 96 MiB.
 *   n = 2..8 (session 18), against the tensor-core GEMV of gemm.cu, whose time
 *   hardly grows with n (the fused kernel's grows about linearly):
 *   - n = 2: RMSNORM fused 0.49-0.94 up to 161 MiB (q, k, v 0.66), 1.19 at 340 MiB,
 *     0.94-0.98 on the lm_heads; GATED lost from 8 MiB (1.14); BF16 0.67 at 4 MiB,
 *     1.16 at 16 MiB; SILU 0.53 at 2 MiB, 1.1 at 96 MiB;
 *   - n = 4: lost from 8 MiB for every kind (1.28-1.6; q, k, v 1.01 at 36 MiB);
 *     won at 2-4 MiB (0.65-0.9);
 *   - n = 8: lost everywhere but the 2 MiB SILU product (0.93).
 * n = 3 takes the rules of n = 4, n = 5..7 those of n = 8. */
static int fg_prefer_fused(const qd_cuda_lin_in *in, int n, int n_out, int64_t wbytes) {
    (void)n_out;
    const int64_t MiB = (int64_t)1 << 20;
    int64_t limit;
    if (n <= 2) {
        switch (in->kind) {
        case QD_LIN_RMSNORM:
            if (n == 2 && wbytes >= 512 * MiB) return 1; /* the lm_heads */
            limit = 256 * MiB;
            break;
        case QD_LIN_GATED: limit = n == 1 ? 32 * MiB : 0; break;
        case QD_LIN_SILU: limit = (n == 1 ? 16 : 8) * MiB; break;
        default: limit = (n == 1 ? 16 : 4) * MiB; break;
        }
    } else if (n <= 4) {
        limit = in->kind == QD_LIN_GATED ? 0 : 4 * MiB;
    } else {
        limit = in->kind == QD_LIN_SILU ? 4 * MiB : 0;
    }
    return wbytes <= limit;
}

static int fg_valid(const qd_cuda_lin_in *in, int64_t cols, const qd_cuda_lin_out *out, int n_out) {
    return in && out && n_out >= 1 && n_out <= QD_LIN_MAX_OUT && cols > 0 && cols <= INT32_MAX &&
           in->kind >= QD_LIN_BF16 && in->kind <= QD_LIN_SILU;
}

/* A quantized product of n > QD_CUDA_QGEMV_MAX_N rows that runs W8A8 on the FP8 GEMM
 * (not on the invariant path, whose one summation order is the bf16 product's). */
static int fg_fp8_gemm(const qd_cuda_lin_out *o, int path, int n) {
    return o->qw && path != QD_LIN_PATH_INVARIANT && n > QD_CUDA_QGEMV_MAX_N && o->fp8_act &&
           qd_cuda_fp8_gemm_mode(o->qw) && o->fp8_act_bytes >= qd_cuda_fp8_act_bytes(n, o->rows, o->qw->cols);
}

static int fg_any_quantized(const qd_cuda_lin_out *out, int n_out) {
    for (int j = 0; j < n_out; j++)
        if (out[j].qw) return 1;
    return 0;
}

extern "C" int qd_cuda_linear_choice(const qd_cuda_lin_in *in, int64_t cols, int n, const qd_cuda_lin_out *out,
                                     int n_out) {
    if (!fg_valid(in, cols, out, n_out) || fg_any_quantized(out, n_out) || !fg_fusable(in, cols, n, out, n_out))
        return QD_LIN_PATH_PLAIN;
    int64_t wbytes = 0;
    for (int j = 0; j < n_out; j++) wbytes += out[j].rows * cols * 2;
    return fg_prefer_fused(in, n, n_out, wbytes) ? QD_LIN_PATH_FUSED : QD_LIN_PATH_PLAIN;
}

/* Kernel table (qd_cuda_linear_choice):
 *   fused GEMV: shapes fg_fusable takes that fg_prefer_fused prefers
 *   otherwise (plain): x materialised into scratch by the elementwise kernels, then
 *       the plain GEMV (n <= 8) or cuBLAS (beta = 1 when accumulating)
 *   quantized weights (plain only): the quantized GEMV (n <= 16; all the call's products in
 *       one tensor-core launch where qd_cuda_qgemv_multi takes them, bf16 parts included,
 *       its blocks building x where it fits in their shared memory: no norm launch),
 *       else the FP8 GEMM (W8A8, FP8 weights of its layouts), else cuBLAS on the weight
 *       dequantized to bf16
 * and by name only, INVARIANT: x materialised as for plain, then the batch-invariant
 *       product of gemm_invariant.cu */
extern "C" qd_status qd_cuda_linear_path(int path, qd_cuda_blas *b, const qd_cuda_lin_in *in, int64_t cols, int n,
                                         const qd_cuda_lin_out *out, int n_out, int accumulate, uint16_t *scratch,
                                         void *stream) {
    if (n <= 0) return QD_OK;
    if (!fg_valid(in, cols, out, n_out) || path < QD_LIN_PATH_TABLE || path > QD_LIN_PATH_INVARIANT)
        return qd_cuda_fail(QD_ERR_INVALID_ARG, "linear: bad arguments");
    /* quantized weights: x materialised, then the quantized GEMV, or (prefill sizes, the
     * invariant path) the bf16 products on the weight dequantized into out[j].dequant */
    const int quant = fg_any_quantized(out, n_out);
    const int dequant = quant && (path == QD_LIN_PATH_INVARIANT || n > QD_CUDA_QGEMV_MAX_N);
    if (quant) {
        if (path == QD_LIN_PATH_FUSED)
            return qd_cuda_fail(QD_ERR_UNSUPPORTED, "linear: quantized weights take the plain path only");
        for (int j = 0; j < n_out; j++)
            if (out[j].qw && (out[j].qw->cols != cols || out[j].qw->rows != out[j].rows))
                return qd_cuda_fail(QD_ERR_INVALID_ARG, "linear: a quantized product's weight shape differs from "
                                                        "the call's");
            else if (out[j].qw && dequant && !out[j].dequant && !fg_fp8_gemm(&out[j], path, n))
                return qd_cuda_fail(QD_ERR_INVALID_ARG, "linear: a quantized product above the GEMV's rows needs "
                                                        "dequantization scratch");
        if (path != QD_LIN_PATH_INVARIANT) path = QD_LIN_PATH_PLAIN;
    }
    if (path == QD_LIN_PATH_TABLE) path = qd_cuda_linear_choice(in, cols, n, out, n_out);
    else if (path == QD_LIN_PATH_FUSED && !fg_fusable(in, cols, n, out, n_out))
        return qd_cuda_fail(QD_ERR_UNSUPPORTED, "linear: shape outside the fused GEMV");
    if (path == QD_LIN_PATH_INVARIANT) { /* refused before x is materialised */
        if (cols % 8) return qd_cuda_fail(QD_ERR_UNSUPPORTED, "linear: the invariant product needs cols % 8 == 0");
        for (int j = 0; j < n_out; j++)
            if (!qd_lin_al16(out[j].qw ? out[j].dequant : out[j].W))
                return qd_cuda_fail(QD_ERR_UNSUPPORTED, "linear: the invariant product needs aligned W");
        if (in->kind == QD_LIN_BF16 && (!qd_lin_al16(in->x) || in->ldx % 8))
            return qd_cuda_fail(QD_ERR_UNSUPPORTED, "linear: the invariant product needs aligned x, ldx % 8 == 0");
    }
    if (path == QD_LIN_PATH_FUSED) {
        fg_params p = {};
        p.kind = in->kind;
        p.n_out = n_out;
        p.accumulate = accumulate;
        p.dv = in->dv;
        p.cols = cols;
        p.ldx = in->ldx;
        p.ldz = in->ldz;
        p.x = in->x;
        p.h = in->h;
        p.rows = in->rows;
        p.w = in->w;
        p.eps = in->eps;
        p.o = in->o;
        p.z = in->z;
        p.gu = in->gu;
        int64_t end = 0;
        for (int j = 0; j < n_out; j++) {
            end += out[j].rows;
            p.W[j] = out[j].W;
            p.end[j] = end;
            p.y[j] = out[j].y;
            p.ldy[j] = out[j].ldy;
        }
        if (end == 0) return QD_OK;
        p.x_global = in->kind == QD_LIN_BF16 && (size_t)n * (size_t)cols * 2 > FG_SMEM_MAX;
        return fg_dispatch(p, n, (cudaStream_t)stream);
    }
    qd_cuda_qgemv_out qo[QD_LIN_MAX_OUT];
    for (int j = 0; j < n_out; j++)
        qo[j] = (qd_cuda_qgemv_out){.qw = out[j].qw, .W = out[j].qw ? NULL : out[j].W, .rows = out[j].rows,
                                    .y = out[j].y, .ldy = out[j].ldy};
    /* the call's products in one launch of the tensor-core GEMV where it takes them all
     * (the bf16 parts of a stack beside the quantized ones included), x built by its
     * blocks where it fits there */
    const int qgemv = quant && !dequant && path != QD_LIN_PATH_INVARIANT;
    if (qgemv && in->kind != QD_LIN_BF16 && qd_cuda_qgemv_multi_in_takes(qo, n_out, cols, in, n))
        return qd_cuda_qgemv_multi_in(qo, n_out, cols, in, n, accumulate, stream);
    const uint16_t *x = in->x;
    int64_t ldx = in->ldx;
    if (in->kind != QD_LIN_BF16) {
        if (!scratch) return qd_cuda_fail(QD_ERR_INVALID_ARG, "linear: no scratch to materialise x");
        qd_status s = fg_materialise(in, cols, n, scratch, stream);
        if (s) return s;
        x = scratch;
        ldx = cols;
    }
    if (qgemv && qd_cuda_qgemv_multi_takes(qo, n_out, cols, x, ldx))
        return qd_cuda_qgemv_multi(qo, n_out, cols, x, ldx, n, accumulate, stream);
    for (int j = 0; j < n_out; j++) {
        const uint16_t *W = out[j].W;
        if (out[j].qw && !dequant) {
            qd_status s = qd_cuda_qgemv(out[j].qw, x, ldx, n, out[j].y, out[j].ldy, accumulate, stream);
            if (s) return s;
            continue;
        }
        if (fg_fp8_gemm(&out[j], path, n)) {
            qd_status s = qd_cuda_fp8_gemm(b, out[j].qw, x, ldx, n, out[j].y, out[j].ldy, accumulate, out[j].fp8_act,
                                           out[j].fp8_act_bytes, stream);
            if (s) return s;
            continue;
        }
        if (out[j].qw) { /* cuBLAS runs on the handle's stream: the same one (qd_cuda_blas_create) */
            qd_status s = qd_cuda_dequant_bf16(out[j].qw, out[j].dequant, stream);
            if (s) return s;
            W = out[j].dequant;
        }
        qd_status s;
        if (path == QD_LIN_PATH_INVARIANT)
            s = qd_cuda_matmul_invariant(W, out[j].rows, cols, x, ldx, n, out[j].y, out[j].ldy, accumulate, stream);
        else
            s = accumulate ? qd_cuda_matmul_acc(b, W, out[j].rows, cols, x, ldx, n, out[j].y, out[j].ldy)
                           : qd_cuda_matmul(b, W, out[j].rows, cols, x, ldx, n, out[j].y, out[j].ldy, 0);
        if (s) return s;
    }
    return QD_OK;
}

extern "C" qd_status qd_cuda_linear(qd_cuda_blas *b, const qd_cuda_lin_in *in, int64_t cols, int n,
                                    const qd_cuda_lin_out *out, int n_out, int accumulate, uint16_t *scratch,
                                    void *stream) {
    return qd_cuda_linear_path(QD_LIN_PATH_TABLE, b, in, cols, n, out, n_out, accumulate, scratch, stream);
}
