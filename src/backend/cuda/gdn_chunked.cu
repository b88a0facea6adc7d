/* GDN chunked prefill (spec 4.1), chunk C = 64, WY form on the tensor cores
 * (wmma bf16 x bf16 -> fp32), varlen batches through a chunk table.
 *
 * Three kernels, following the decomposition of spec 4.1/4.2:
 *   wy    per (chunk, value head), all in parallel:
 *           L = strict_tril(beta_i (k_i.k_m) e^{G_i-G_m}),  T = (I+L)^-1,
 *           W = T diag(beta e^G) K,  U = T diag(beta) V        (stored bf16)
 *   state per (sequence, value head, tile of dv columns), a sequential walk
 *         over the chunks carrying S (dk x tile) in fp32 tensor-core accumulators:
 *           H_c = S (stored bf16),  Vnew = U - W S,
 *           S  <- e^{G_last} S + K^T diag(e^{G_last-G_m}) Vnew
 *   out   per (chunk, value head), all in parallel:
 *           O = diag(e^G) Q H_c + (tril_incl(Q K^T) o e^{G_i-G_m}) Vnew
 * Only the state kernel is sequential in time, and it does the least work per
 * chunk (two dk x 64 x tile products), which keeps the critical path short.
 *
 * Operand precision is bf16 (inputs, T, W, U, H_c, Vnew) with fp32 accumulation;
 * the carried state, G and all exponentials stay fp32. exp(G_i - G_m) is only
 * evaluated for m <= i, where it cannot overflow (spec 4.1 note). */
#include <cuda_runtime.h>
#include <mma.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_util.h"
#include "backend/cuda/gdn_common.cuh"

using namespace nvcuda;

#define CH 64            /* chunk length */
#define PADB 8           /* bf16 row padding: keeps wmma's 16-byte ldm rule, spreads banks */
#define PADF 4           /* fp32 row padding */
#define MAXD 256         /* largest dk, dv */

typedef wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> frag_a;
typedef wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::col_major> frag_at;
typedef wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::row_major> frag_b;
typedef wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::col_major> frag_bt;
typedef wmma::fragment<wmma::accumulator, 16, 16, 16, float> frag_c;

/* Shared-memory carving: every piece starts on a 128-byte boundary (wmma
 * needs 32-byte aligned tile pointers). */
__host__ __device__ static inline size_t carve_up(size_t n) { return (n + 127) & ~(size_t)127; }

#define BFP(p) reinterpret_cast<const __nv_bfloat16 *>(p)

/* Starts copying rows [0, 64) x `cols` bf16 of a strided global matrix into
 * shared rows of ld elements, zero-filling rows >= n; the caller commits and
 * waits. cp.async puts every row in flight at once without staging through
 * registers, so other loads and setup work overlap it. */
__device__ static inline void async_rows(uint16_t *dst, int ld, const uint16_t *src, int64_t src_stride, int n,
                                         int cols, int tid, int nthreads) {
    const int per_row = cols / 8;
    for (int idx = tid; idx < CH * per_row; idx += nthreads) {
        const int r = idx / per_row, c = (idx % per_row) * 8;
        const bool ok = r < n;
        qd_cp_async16(dst + r * ld + c, src + (int64_t)(ok ? r : 0) * src_stride + c, ok);
    }
}

/* Warp-cooperative store of one 16x16 fp32 accumulator tile as bf16 rows
 * r < n of a global matrix (row stride in elements), through a per-warp
 * 16 x (16+PADF) fp32 staging tile. */
__device__ static inline void store_tile_bf16(const frag_c &acc, float *stage, uint16_t *dst, int64_t stride,
                                              int row0, int n, int lane) {
    wmma::store_matrix_sync(stage, acc, 16 + PADF, wmma::mem_row_major);
    __syncwarp();
    const int r = lane / 2, c = (lane % 2) * 8;
    if (row0 + r < n) {
        const float *s = stage + r * (16 + PADF) + c;
        uint4 out;
        out.x = qd_pack_bf2(s[0], s[1]);
        out.y = qd_pack_bf2(s[2], s[3]);
        out.z = qd_pack_bf2(s[4], s[5]);
        out.w = qd_pack_bf2(s[6], s[7]);
        *(uint4 *)(dst + (int64_t)(row0 + r) * stride + c) = out;
    }
    __syncwarp();
}

/* Inclusive cumsum of the chunk's log-decays by warp 0 (g = 0 past the end,
 * so G stays at G_{n-1} there); also stages beta (0 past the end). */
__device__ static inline void chunk_cumsum(const float *g, const float *beta, int64_t t0, int n, int hv, int h,
                                           float *Gs, float *Bs, int lane) {
    float a = lane < n ? g[(t0 + lane) * hv + h] : 0.f;
    float b = lane + 32 < n ? g[(t0 + lane + 32) * hv + h] : 0.f;
#pragma unroll
    for (int off = 1; off < 32; off *= 2) {
        const float ua = __shfl_up_sync(0xffffffffu, a, off), ub = __shfl_up_sync(0xffffffffu, b, off);
        if (lane >= off) { a += ua; b += ub; }
    }
    b += __shfl_sync(0xffffffffu, a, 31);
    Gs[lane] = a;
    Gs[lane + 32] = b;
    if (Bs) {
        Bs[lane] = lane < n ? beta[(t0 + lane) * hv + h] : 0.f;
        Bs[lane + 32] = lane + 32 < n ? beta[(t0 + lane + 32) * hv + h] : 0.f;
    }
}

/* Lower-triangular 16x16 tiles (incl. diagonal) of A B^T for 64 x d row
 * blocks A, B in shared memory (bf16, ld elements), into fp32 out (ld CH+PADF).
 * Tiles strictly above the diagonal are left unwritten. */
__device__ static inline void tril_abt(const uint16_t *A, const uint16_t *B, int ld, int d, float *out, int warp,
                                       int nwarps) {
    /* Only the 10 tiles on or below the diagonal, dealt out evenly: t -> (ti, tj)
     * in the order (0,0) (1,0) (1,1) (2,0) (2,1) (2,2) (3,0) ... */
    for (int t = warp; t < 10; t += nwarps) {
        const int ti = t < 1 ? 0 : t < 3 ? 1 : t < 6 ? 2 : 3;
        const int tj = t - ti * (ti + 1) / 2;
        frag_c acc;
        wmma::fill_fragment(acc, 0.f);
        for (int kk = 0; kk < d; kk += 16) {
            frag_a fa;
            frag_bt fb; /* B^T: element (p, m) = B[m][p], i.e. B row-major read as column-major */
            wmma::load_matrix_sync(fa, BFP(A + ti * 16 * ld + kk), ld);
            wmma::load_matrix_sync(fb, BFP(B + tj * 16 * ld + kk), ld);
            wmma::mma_sync(acc, fa, fb, acc);
        }
        wmma::store_matrix_sync(out + ti * 16 * (CH + PADF) + tj * 16, acc, CH + PADF, wmma::mem_row_major);
    }
}

/* ------------------------------------------------------------------ wy */

#define WY_NT 128

struct wy_smem {
    size_t kb, vb, af, tf, xs, tw, tu, stage, gs, bs, es, total;
};
__host__ __device__ static inline wy_smem wy_layout(int dk, int dv) {
    wy_smem s;
    size_t o = 0;
    s.kb = o; o += carve_up((size_t)CH * (dk + PADB) * 2);
    s.vb = o; o += carve_up((size_t)CH * (dv + PADB) * 2);
    s.af = o; o += carve_up((size_t)CH * (CH + PADF) * 4);
    s.tf = o; o += carve_up((size_t)CH * (CH + 1) * 4);
    s.xs = o; o += carve_up(3 * 16 * 17 * 4);
    s.tw = o; o += carve_up((size_t)CH * (CH + PADB) * 2);
    s.tu = o; o += carve_up((size_t)CH * (CH + PADB) * 2);
    s.stage = o; o += carve_up((size_t)(WY_NT / 32) * 16 * (16 + PADF) * 4);
    s.gs = o; o += carve_up(CH * 4);
    s.bs = o; o += carve_up(CH * 4);
    s.es = o; o += carve_up(CH * 4);
    s.total = o;
    return s;
}

__global__ void __launch_bounds__(WY_NT)
gdn_wy_kernel(const int32_t *__restrict__ chunks, const uint16_t *__restrict__ k, int64_t k_stride,
              const uint16_t *__restrict__ v, int64_t v_stride, const float *__restrict__ g,
              const float *__restrict__ beta, uint16_t *__restrict__ W, uint16_t *__restrict__ U,
              float *__restrict__ gc, int hk, int hv, int dk, int dv) {
    extern __shared__ __align__(128) unsigned char smem[];
    const wy_smem L = wy_layout(dk, dv);
    uint16_t *Kb = (uint16_t *)(smem + L.kb), *Vb = (uint16_t *)(smem + L.vb);
    float *Af = (float *)(smem + L.af), *Tf = (float *)(smem + L.tf), *Xs = (float *)(smem + L.xs);
    uint16_t *Tw = (uint16_t *)(smem + L.tw), *Tu = (uint16_t *)(smem + L.tu);
    float *Gs = (float *)(smem + L.gs), *Bs = (float *)(smem + L.bs), *Es = (float *)(smem + L.es);
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    float *stage = (float *)(smem + L.stage) + warp * 16 * (16 + PADF);
    const int h = blockIdx.y, j = h / (hv / hk);
    const int64_t t0 = chunks[4 * blockIdx.x];
    const int n = chunks[4 * blockIdx.x + 1];
    const int ldk = dk + PADB, ldv = dv + PADB;

    async_rows(Kb, ldk, k + t0 * k_stride + (int64_t)j * dk, k_stride, n, dk, tid, WY_NT);
    async_rows(Vb, ldv, v + t0 * v_stride + (int64_t)h * dv, v_stride, n, dv, tid, WY_NT);
    qd_cp_async_commit();
    if (warp == 0) {
        chunk_cumsum(g, beta, t0, n, hv, h, Gs, Bs, lane);
        if (lane < n) gc[(t0 + lane) * hv + h] = Gs[lane];
        if (lane + 32 < n) gc[(t0 + lane + 32) * hv + h] = Gs[lane + 32];
        /* column factor of W: beta_m e^{G_m} */
        Es[lane] = Bs[lane] * __expf(Gs[lane]);
        Es[lane + 32] = Bs[lane + 32] * __expf(Gs[lane + 32]);
    }
    qd_cp_async_wait<0>();
    __syncthreads();

    tril_abt(Kb, Kb, ldk, dk, Af, warp, WY_NT / 32);
    __syncthreads();
    /* L[i][p] = beta_i (k_i.k_p) e^{G_i-G_p} for p < i, 0 elsewhere (the
     * unwritten upper tiles are overwritten here). */
    for (int idx = tid; idx < CH * CH; idx += WY_NT) {
        const int i = idx / CH, p = idx % CH;
        float *a = Af + i * (CH + PADF) + p;
        *a = p < i ? Bs[i] * *a * __expf(Gs[i] - Gs[p]) : 0.f;
    }
    __syncthreads();
    /* T = (I+L)^-1 by 16x16 blocks, in fp32. The diagonal blocks are solved
     * first, one column per thread (forward substitution reading only the
     * thread's own earlier entries, so no barrier inside). Then the
     * off-diagonal blocks, one block diagonal at a time:
     *   T_IJ = -T_II sum_{P=J}^{I-1} L_IP T_PJ,
     * which only needs blocks nearer the diagonal. A single column solve
     * over all 64 rows was ~2000 dependent steps per thread on 64 threads
     * (a fifth of the kernel's time on the H200); this is ~120 steps plus
     * six small parallel products. */
    if (tid < CH) {
        const int m = tid, b0 = (m / 16) * 16;
        for (int i = 0; i < b0; i++) Tf[i * (CH + 1) + m] = 0.f;
        for (int i = b0; i < b0 + 16; i++) {
            const float *li = Af + i * (CH + PADF);
            float acc = 0.f;
            for (int p = b0; p < i; p++) acc = fmaf(li[p], Tf[p * (CH + 1) + m], acc);
            Tf[i * (CH + 1) + m] = i < m ? 0.f : (i == m ? 1.f : -acc);
        }
    }
    __syncthreads();
    for (int d = 1; d < 4; d++) {
        const int npairs = 4 - d; /* blocks (J + d, J) */
        for (int idx = tid; idx < npairs * 256; idx += WY_NT) {
            const int J = idx / 256, I = J + d, r = (idx % 256) / 16, c = idx % 16;
            const float *li = Af + (I * 16 + r) * (CH + PADF);
            float acc = 0.f;
            for (int p = J * 16; p < I * 16; p++) acc = fmaf(li[p], Tf[p * (CH + 1) + J * 16 + c], acc);
            Xs[J * 16 * 17 + r * 17 + c] = acc;
        }
        __syncthreads();
        for (int idx = tid; idx < npairs * 256; idx += WY_NT) {
            const int J = idx / 256, I = J + d, r = (idx % 256) / 16, c = idx % 16;
            const float *ti = Tf + (I * 16 + r) * (CH + 1) + I * 16;
            float acc = 0.f;
#pragma unroll
            for (int q = 0; q < 16; q++) acc = fmaf(ti[q], Xs[J * 16 * 17 + q * 17 + c], acc);
            Tf[(I * 16 + r) * (CH + 1) + J * 16 + c] = -acc;
        }
        __syncthreads();
    }
    /* Fold the column scalings into two bf16 copies of T, so K and V are used
     * as loaded: W = (T diag(beta e^G)) K,  U = (T diag(beta)) V. */
    for (int idx = tid; idx < CH * CH; idx += WY_NT) {
        const int i = idx / CH, m = idx % CH;
        const float t = Tf[i * (CH + 1) + m];
        Tw[i * (CH + PADB) + m] = qd_f2bf(t * Es[m]);
        Tu[i * (CH + PADB) + m] = qd_f2bf(t * Bs[m]);
    }
    __syncthreads();

    const int nk = dk / 16, nv = dv / 16, ntiles = 4 * (nk + nv);
    for (int t = warp; t < ntiles; t += WY_NT / 32) {
        const int isw = t < 4 * nk;
        const int tt = isw ? t : t - 4 * nk;
        const int ncol = isw ? nk : nv;
        const int ti = tt / ncol, tc = tt % ncol;
        const uint16_t *Tm = isw ? Tw : Tu;
        const uint16_t *X = isw ? Kb : Vb;
        const int ldx = isw ? ldk : ldv;
        frag_c acc;
        wmma::fill_fragment(acc, 0.f);
#pragma unroll
        for (int kk = 0; kk < CH; kk += 16) {
            frag_a fa;
            frag_b fb;
            wmma::load_matrix_sync(fa, BFP(Tm + ti * 16 * (CH + PADB) + kk), CH + PADB);
            wmma::load_matrix_sync(fb, BFP(X + kk * ldx + tc * 16), ldx);
            wmma::mma_sync(acc, fa, fb, acc);
        }
        uint16_t *dst = isw ? W + (t0 * hv + h) * dk + tc * 16 : U + (t0 * hv + h) * dv + tc * 16;
        store_tile_bf16(acc, stage, dst, (int64_t)hv * (isw ? dk : dv), ti * 16, n, lane);
    }
}

/* ---------------------------------------------------------------- state */

#define ST_NT 256
/* ST_BV: dv columns per block (32, or 16 when dv is not a multiple of 32);
 * ST_MAXF: state tiles per warp at most. */
#define ST_MAXF ((MAXD / 16) * (ST_BV / 16) / (ST_NT / 32))

struct st_smem {
    size_t wb, kb, ub, sf, sb, vf, vd, gs, total;
};
template <int ST_BV> __host__ __device__ static inline st_smem st_layout(int dk) {
    st_smem s;
    size_t o = 0;
    s.wb = o; o += 2 * carve_up((size_t)CH * (dk + PADB) * 2);
    s.kb = o; o += 2 * carve_up((size_t)CH * (dk + PADB) * 2);
    s.ub = o; o += 2 * carve_up((size_t)CH * (ST_BV + PADB) * 2);
    s.sf = o; o += carve_up((size_t)dk * (ST_BV + PADF) * 4);
    s.sb = o; o += carve_up((size_t)dk * (ST_BV + PADB) * 2);
    s.vf = o; o += carve_up((size_t)CH * (ST_BV + PADF) * 4);
    s.vd = o; o += carve_up((size_t)CH * (ST_BV + PADB) * 2);
    s.gs = o; o += carve_up(CH * 4);
    s.total = o;
    return s;
}

template <int ST_BV>
__global__ void __launch_bounds__(ST_NT)
gdn_state_kernel(const int32_t *__restrict__ seqs, const uint16_t *__restrict__ k, int64_t k_stride,
                 const uint16_t *__restrict__ W, const uint16_t *__restrict__ U, const float *__restrict__ gc,
                 const float *state0, float *state1 /* may alias state0 */, const int32_t *__restrict__ slot,
                 uint16_t *__restrict__ H,
                 uint16_t *__restrict__ vnew, int hk, int hv, int dk, int dv) {
    extern __shared__ __align__(128) unsigned char smem[];
    const st_smem L = st_layout<ST_BV>(dk);
    const int tid = threadIdx.x, warp = tid / 32;
    const int tile = blockIdx.x, h = blockIdx.y, seq = blockIdx.z, j = h / (hv / hk);
    /* Chunk c of this sequence starts at token tok0 + 64 c; computing that
     * here instead of reading the chunk table keeps a dependent global load
     * off the per-chunk critical path. */
    const int64_t tok0 = seqs[4 * seq];
    const int c0 = seqs[4 * seq + 1], nc = seqs[4 * seq + 2], len = seqs[4 * seq + 3];
    const int ldk = dk + PADB, ldsf = ST_BV + PADF, ldsb = ST_BV + PADB;
    const size_t wbytes = carve_up((size_t)CH * ldk * 2), ubytes = carve_up((size_t)CH * ldsb * 2);
    float *Sf = (float *)(smem + L.sf), *Vf = (float *)(smem + L.vf), *Gs = (float *)(smem + L.gs);
    uint16_t *Sb = (uint16_t *)(smem + L.sb), *Vd = (uint16_t *)(smem + L.vd);
    const int ntiles = (dk / 16) * (ST_BV / 16);
    const int col0 = tile * ST_BV;
    const int64_t sl = slot ? (int64_t)slot[seq] : (int64_t)seq;
    const size_t sbase = ((size_t)sl * hv + h) * dk * dv + col0; /* this block's tile of the state */

    /* Stage chunk c's W, K rows (dk wide) and U tile into buffer b. */
    auto issue = [&](int c, int b) {
        const int64_t t0 = tok0 + (int64_t)c * CH;
        const int n = min(CH, len - c * CH);
        uint16_t *wb = (uint16_t *)(smem + L.wb + b * wbytes), *kb = (uint16_t *)(smem + L.kb + b * wbytes);
        uint16_t *ub = (uint16_t *)(smem + L.ub + b * ubytes);
        const int per_row = dk / 8;
        for (int idx = tid; idx < CH * per_row; idx += ST_NT) {
            const int r = idx / per_row, c8 = (idx % per_row) * 8;
            const bool ok = r < n;
            const int64_t t = t0 + (ok ? r : 0);
            qd_cp_async16(wb + r * ldk + c8, W + (t * hv + h) * dk + c8, ok);
            qd_cp_async16(kb + r * ldk + c8, k + t * k_stride + (int64_t)j * dk + c8, ok);
        }
        for (int idx = tid; idx < CH * (ST_BV / 8); idx += ST_NT) {
            const int r = idx / (ST_BV / 8), c8 = (idx % (ST_BV / 8)) * 8;
            const bool ok = r < n;
            const int64_t t = t0 + (ok ? r : 0);
            qd_cp_async16(ub + r * ldsb + c8, U + (t * hv + h) * dv + col0 + c8, ok);
        }
        qd_cp_async_commit();
    };
    /* G of chunk c for row tid (the last row repeated past the end), loaded a
     * chunk ahead so its latency hides behind the previous chunk's work. */
    auto load_g = [&](int c) -> float {
        if (tid >= CH || c >= nc) return 0.f;
        const int n = min(CH, len - c * CH);
        return gc[(tok0 + (int64_t)c * CH + (tid < n ? tid : n - 1)) * hv + h];
    };

    if (nc > 0) issue(0, 0);
    float gnext = load_g(0);
    /* Initial state tile into the accumulators (through Sf). */
    for (int idx = tid; idx < dk * ST_BV; idx += ST_NT) {
        const int r = idx / ST_BV, c = idx % ST_BV;
        Sf[r * ldsf + c] = state0 ? state0[sbase + (size_t)r * dv + c] : 0.f;
    }
    __syncthreads();
    frag_c S[ST_MAXF];
#pragma unroll
    for (int f = 0; f < ST_MAXF; f++) {
        const int t = warp + f * (ST_NT / 32);
        if (t < ntiles) {
            const int ti = t / (ST_BV / 16), tc = t % (ST_BV / 16);
            wmma::load_matrix_sync(S[f], Sf + ti * 16 * ldsf + tc * 16, ldsf, wmma::mem_row_major);
        }
    }

    for (int c = 0; c < nc; c++) {
        const int b = c & 1;
        const int cid = c0 + c;
        const int64_t t0 = tok0 + (int64_t)c * CH;
        const int n = min(CH, len - c * CH);
        if (tid < CH) Gs[tid] = gnext;
        gnext = load_g(c + 1);
        if (c + 1 < nc) {
            issue(c + 1, b ^ 1); /* overlaps with this chunk's work */
            qd_cp_async_wait<1>();
        } else {
            qd_cp_async_wait<0>();
        }
        const uint16_t *wb = (const uint16_t *)(smem + L.wb + b * wbytes);
        const uint16_t *kb = (const uint16_t *)(smem + L.kb + b * wbytes);
        const uint16_t *ub = (const uint16_t *)(smem + L.ub + b * ubytes);

        /* 1. S -> Sf (fp32) */
#pragma unroll
        for (int f = 0; f < ST_MAXF; f++) {
            const int t = warp + f * (ST_NT / 32);
            if (t < ntiles) {
                const int ti = t / (ST_BV / 16), tc = t % (ST_BV / 16);
                wmma::store_matrix_sync(Sf + ti * 16 * ldsf + tc * 16, S[f], ldsf, wmma::mem_row_major);
            }
        }
        __syncthreads();
        /* 2. bf16 copy for the products, and H_c for the output kernel. */
        uint16_t *Hc = H + ((size_t)cid * hv + h) * dk * dv + col0;
        for (int idx = tid; idx < dk * (ST_BV / 8); idx += ST_NT) {
            const int r = idx / (ST_BV / 8), c8 = (idx % (ST_BV / 8)) * 8;
            const float *s = Sf + r * ldsf + c8;
            uint4 p;
            p.x = qd_pack_bf2(s[0], s[1]); p.y = qd_pack_bf2(s[2], s[3]);
            p.z = qd_pack_bf2(s[4], s[5]); p.w = qd_pack_bf2(s[6], s[7]);
            *(uint4 *)(Sb + r * ldsb + c8) = p;
            *(uint4 *)(Hc + (size_t)r * dv + c8) = p;
        }
        __syncthreads();
        /* 3. W S (64 x tile) into Vf. */
        for (int t = warp; t < 4 * (ST_BV / 16); t += ST_NT / 32) {
            const int ti = t / (ST_BV / 16), tc = t % (ST_BV / 16);
            frag_c acc;
            wmma::fill_fragment(acc, 0.f);
            for (int kk = 0; kk < dk; kk += 16) {
                frag_a fa;
                frag_b fb;
                wmma::load_matrix_sync(fa, BFP(wb + ti * 16 * ldk + kk), ldk);
                wmma::load_matrix_sync(fb, BFP(Sb + kk * ldsb + tc * 16), ldsb);
                wmma::mma_sync(acc, fa, fb, acc);
            }
            wmma::store_matrix_sync(Vf + ti * 16 * ldsf + tc * 16, acc, ldsf, wmma::mem_row_major);
        }
        __syncthreads();
        /* 4. Vnew = U - W S (to global), and its decayed copy for the update. */
        const float gl = Gs[n - 1];
        for (int idx = tid; idx < CH * (ST_BV / 2); idx += ST_NT) {
            const int r = idx / (ST_BV / 2), c2 = (idx % (ST_BV / 2)) * 2;
            float x0 = 0.f, x1 = 0.f;
            if (r < n) {
                const uint32_t u2 = *(const uint32_t *)(ub + r * ldsb + c2);
                x0 = qd_bf2f((uint16_t)(u2 & 0xffff)) - Vf[r * ldsf + c2];
                x1 = qd_bf2f((uint16_t)(u2 >> 16)) - Vf[r * ldsf + c2 + 1];
                *(uint32_t *)(vnew + ((t0 + r) * hv + h) * dv + col0 + c2) = qd_pack_bf2(x0, x1);
                const float e = __expf(gl - Gs[r]);
                x0 *= e;
                x1 *= e;
            }
            *(uint32_t *)(Vd + r * ldsb + c2) = qd_pack_bf2(x0, x1);
        }
        __syncthreads();
        /* 5. S = e^{G_last} S + K^T Vd. */
        const float el = __expf(gl);
#pragma unroll
        for (int f = 0; f < ST_MAXF; f++) {
            const int t = warp + f * (ST_NT / 32);
            if (t < ntiles) {
                const int ti = t / (ST_BV / 16), tc = t % (ST_BV / 16);
                for (int e = 0; e < S[f].num_elements; e++) S[f].x[e] *= el;
#pragma unroll
                for (int kk = 0; kk < CH; kk += 16) {
                    frag_at fa; /* K^T: element (i, m) = K[m][i] */
                    frag_b fb;
                    wmma::load_matrix_sync(fa, BFP(kb + kk * ldk + ti * 16), ldk);
                    wmma::load_matrix_sync(fb, BFP(Vd + kk * ldsb + tc * 16), ldsb);
                    wmma::mma_sync(S[f], fa, fb, S[f]);
                }
            }
        }
        __syncthreads(); /* buffer b is refilled by the next iteration's issue */
    }

    if (state1) {
#pragma unroll
        for (int f = 0; f < ST_MAXF; f++) {
            const int t = warp + f * (ST_NT / 32);
            if (t < ntiles) {
                const int ti = t / (ST_BV / 16), tc = t % (ST_BV / 16);
                wmma::store_matrix_sync(Sf + ti * 16 * ldsf + tc * 16, S[f], ldsf, wmma::mem_row_major);
            }
        }
        __syncthreads();
        for (int idx = tid; idx < dk * ST_BV; idx += ST_NT) {
            const int r = idx / ST_BV, c = idx % ST_BV;
            state1[sbase + (size_t)r * dv + c] = Sf[r * ldsf + c];
        }
    }
}

/* ------------------------------------------------------------------ out */

#define OUT_NT 256
#define OUT_MAXF ((CH / 16) * (MAXD / 16) / (OUT_NT / 32)) /* output tiles per warp at most */

struct out_smem {
    size_t qb, hb, kb, qkf, vb, ab, stage, gs, eg, total;
};
/* H_c (dk x dv) reuses the room of K and Q K^T, which are dead once the
 * intra-chunk matrix is built: 87 KiB at dk = dv = 128, two blocks per SM.
 * (Splitting dv over two blocks with every buffer separate ran slower: the
 * Q K^T work doubles.) */
__host__ __device__ static inline out_smem out_layout(int dk, int dv) {
    out_smem s;
    size_t o = 0;
    s.qb = o; o += carve_up((size_t)CH * (dk + PADB) * 2);
    const size_t hbytes = carve_up((size_t)dk * (dv + PADB) * 2);
    const size_t kbytes = carve_up((size_t)CH * (dk + PADB) * 2), qkbytes = carve_up((size_t)CH * (CH + PADF) * 4);
    s.hb = o;
    s.kb = o;
    s.qkf = o + kbytes;
    o += hbytes > kbytes + qkbytes ? hbytes : kbytes + qkbytes;
    s.vb = o; o += carve_up((size_t)CH * (dv + PADB) * 2);
    s.ab = o; o += carve_up((size_t)CH * (CH + PADB) * 2);
    s.stage = o; o += carve_up((size_t)(OUT_NT / 32) * 16 * (16 + PADF) * 4);
    s.gs = o; o += carve_up(CH * 4);
    s.eg = o; o += carve_up(CH * 4);
    s.total = o;
    return s;
}

__global__ void __launch_bounds__(OUT_NT)
gdn_out_kernel(const int32_t *__restrict__ chunks, const uint16_t *__restrict__ q, int64_t q_stride,
               const uint16_t *__restrict__ k, int64_t k_stride, const float *__restrict__ gc,
               const uint16_t *__restrict__ H, const uint16_t *__restrict__ vnew, uint16_t *__restrict__ o, int hk,
               int hv, int dk, int dv) {
    extern __shared__ __align__(128) unsigned char smem[];
    const out_smem L = out_layout(dk, dv);
    uint16_t *Qb = (uint16_t *)(smem + L.qb), *Hb = (uint16_t *)(smem + L.hb), *Kb = (uint16_t *)(smem + L.kb);
    uint16_t *Vb = (uint16_t *)(smem + L.vb), *Ab = (uint16_t *)(smem + L.ab);
    float *QKf = (float *)(smem + L.qkf), *Gs = (float *)(smem + L.gs), *Eg = (float *)(smem + L.eg);
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    float *stage = (float *)(smem + L.stage) + warp * 16 * (16 + PADF);
    const int cid = blockIdx.x, h = blockIdx.y, j = h / (hv / hk);
    const int64_t t0 = chunks[4 * cid];
    const int n = chunks[4 * cid + 1];
    const int ldk = dk + PADB, ldv = dv + PADB;

    /* Q, K (first group) and Vnew (second) are in flight together; H_c
     * follows once its room is free. */
    async_rows(Qb, ldk, q + t0 * q_stride + (int64_t)j * dk, q_stride, n, dk, tid, OUT_NT);
    async_rows(Kb, ldk, k + t0 * k_stride + (int64_t)j * dk, k_stride, n, dk, tid, OUT_NT);
    qd_cp_async_commit();
    async_rows(Vb, ldv, vnew + (t0 * hv + h) * dv, (int64_t)hv * dv, n, dv, tid, OUT_NT);
    qd_cp_async_commit();
    /* G past the end is 0 (its rows of Q are zero; this keeps e^G finite). */
    if (tid < CH) {
        const float gi = tid < n ? gc[(t0 + tid) * hv + h] : 0.f;
        Gs[tid] = gi;
        Eg[tid] = __expf(gi);
    }
    qd_cp_async_wait<1>();
    __syncthreads();
    tril_abt(Qb, Kb, ldk, dk, QKf, warp, OUT_NT / 32);
    __syncthreads();
    /* A[i][m] = (q_i.k_m) e^{G_i-G_m} for m <= i < n; Q rows scaled by e^{G_i}. */
    for (int idx = tid; idx < CH * CH; idx += OUT_NT) {
        const int i = idx / CH, m = idx % CH;
        const float a = (m <= i && i < n) ? QKf[i * (CH + PADF) + m] * __expf(Gs[i] - Gs[m]) : 0.f;
        Ab[i * (CH + PADB) + m] = qd_f2bf(a);
    }
    for (int idx = tid; idx < CH * (dk / 2); idx += OUT_NT) {
        const int i = idx / (dk / 2), c2 = (idx % (dk / 2)) * 2;
        uint32_t *p = (uint32_t *)(Qb + i * ldk + c2);
        const uint32_t x = *p;
        const float e = Eg[i];
        *p = qd_pack_bf2(qd_bf2f((uint16_t)(x & 0xffff)) * e, qd_bf2f((uint16_t)(x >> 16)) * e);
    }
    __syncthreads(); /* K and Q K^T are dead from here: H_c takes their room */
    {
        const uint16_t *Hg = H + ((size_t)cid * hv + h) * dk * dv;
        const int pv = dv / 8;
        for (int idx = tid; idx < dk * pv; idx += OUT_NT) {
            const int r = idx / pv, c8 = (idx % pv) * 8;
            qd_cp_async16(Hb + r * ldv + c8, Hg + (size_t)r * dv + c8, true);
        }
        qd_cp_async_commit();
    }
    qd_cp_async_wait<0>();
    __syncthreads();

    const int nv = dv / 16, ntiles = 4 * nv;
#pragma unroll
    for (int f = 0; f < OUT_MAXF; f++) {
        const int t = warp + f * (OUT_NT / 32);
        if (t < ntiles) {
            const int ti = t / nv, tc = t % nv;
            frag_c acc;
            wmma::fill_fragment(acc, 0.f);
            for (int kk = 0; kk < dk; kk += 16) {
                frag_a fa;
                frag_b fb;
                wmma::load_matrix_sync(fa, BFP(Qb + ti * 16 * ldk + kk), ldk);
                wmma::load_matrix_sync(fb, BFP(Hb + kk * ldv + tc * 16), ldv);
                wmma::mma_sync(acc, fa, fb, acc);
            }
#pragma unroll
            for (int kk = 0; kk < CH; kk += 16) {
                frag_a fa;
                frag_b fb;
                wmma::load_matrix_sync(fa, BFP(Ab + ti * 16 * (CH + PADB) + kk), CH + PADB);
                wmma::load_matrix_sync(fb, BFP(Vb + kk * ldv + tc * 16), ldv);
                wmma::mma_sync(acc, fa, fb, acc);
            }
            store_tile_bf16(acc, stage, o + (t0 * hv + h) * dv + tc * 16, (int64_t)hv * dv, ti * 16, n, lane);
        }
    }
}

/* ----------------------------------------------------------------- host */

extern "C" void qd_cuda_gdn_plan_destroy(qd_cuda_gdn_plan *p) {
    if (!p) return;
    qd_cuda_free(p->d_chunks);
    qd_cuda_free(p->d_seqs);
    qd_cuda_free(p->d_w);
    qd_cuda_free(p->d_u);
    qd_cuda_free(p->d_gc);
    qd_cuda_free(p->d_vnew);
    qd_cuda_free(p->d_h);
    memset(p, 0, sizeof *p);
}

extern "C" qd_status qd_cuda_gdn_plan_create(qd_cuda_gdn_plan *p, int hk, int hv, int dk, int dv,
                                             const int32_t *cu_seqlens_host, int n_seq) {
    memset(p, 0, sizeof *p);
    if (hk <= 0 || hv <= 0 || hv % hk || dk <= 0 || dv <= 0 || dk % 16 || dv % 16 || dk > MAXD || dv > MAXD ||
        n_seq <= 0 || n_seq > 65535 || !cu_seqlens_host || cu_seqlens_host[0] != 0)
        return qd_cuda_fail(QD_ERR_INVALID_ARG, "gdn_plan: bad dimensions or cu_seqlens");
    int64_t nch = 0;
    for (int s = 0; s < n_seq; s++) {
        const int64_t len = (int64_t)cu_seqlens_host[s + 1] - cu_seqlens_host[s];
        if (len < 0) return qd_cuda_fail(QD_ERR_INVALID_ARG, "gdn_plan: cu_seqlens decreases");
        nch += (len + CH - 1) / CH;
    }
    if (nch > 0x7fffffff) return qd_cuda_fail(QD_ERR_INVALID_ARG, "gdn_plan: too many chunks");
    p->hk = hk; p->hv = hv; p->dk = dk; p->dv = dv;
    p->n_seq = n_seq;
    p->n_chunks = (int)nch;
    p->n_tokens = cu_seqlens_host[n_seq];
    int32_t *ch = (int32_t *)malloc(sizeof(int32_t) * 4 * (size_t)(nch ? nch : 1));
    int32_t *sq = (int32_t *)malloc(sizeof(int32_t) * 4 * (size_t)n_seq);
    if (!ch || !sq) {
        free(ch);
        free(sq);
        return qd_cuda_fail(QD_ERR_OOM, "gdn_plan: host allocation");
    }
    int c = 0;
    for (int s = 0; s < n_seq; s++) {
        const int a = cu_seqlens_host[s], z = cu_seqlens_host[s + 1];
        sq[4 * s] = a;
        sq[4 * s + 1] = c;
        sq[4 * s + 3] = z - a;
        for (int t = a; t < z; t += CH, c++) {
            ch[4 * c] = t;
            ch[4 * c + 1] = z - t < CH ? z - t : CH;
            ch[4 * c + 2] = s;
            ch[4 * c + 3] = c - sq[4 * s + 1];
        }
        sq[4 * s + 2] = c - sq[4 * s + 1];
    }
    const size_t T = (size_t)p->n_tokens, NC = (size_t)p->n_chunks;
    qd_status st;
    if ((st = qd_cuda_malloc((void **)&p->d_chunks, 16 * (NC ? NC : 1))) ||
        (st = qd_cuda_malloc((void **)&p->d_seqs, 16 * (size_t)n_seq)) ||
        (st = qd_cuda_malloc((void **)&p->d_w, 2 * T * hv * dk)) ||
        (st = qd_cuda_malloc((void **)&p->d_u, 2 * T * hv * dv)) ||
        (st = qd_cuda_malloc((void **)&p->d_gc, 4 * T * hv)) ||
        (st = qd_cuda_malloc((void **)&p->d_vnew, 2 * T * hv * dv)) ||
        (st = qd_cuda_malloc((void **)&p->d_h, 2 * NC * hv * dk * dv)) ||
        (st = qd_cuda_memcpy_h2d(p->d_chunks, ch, 16 * NC)) ||
        (st = qd_cuda_memcpy_h2d(p->d_seqs, sq, 16 * (size_t)n_seq))) {
        free(ch);
        free(sq);
        qd_cuda_gdn_plan_destroy(p);
        return st;
    }
    free(ch);
    free(sq);
    p->bytes = 16 * NC + 16 * (size_t)n_seq + T * hv * (2 * dk + 4 * dv + 4) + 2 * NC * hv * dk * dv;
    return QD_OK;
}

/* Opt a kernel into more than 48 KiB of dynamic shared memory. */
template <typename K> static qd_status set_smem(K kernel, size_t bytes) {
    return qd_cuda_status(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes),
                          "cudaFuncSetAttribute(max dynamic shared memory)");
}

/* State tiles of 16 dv columns, blocks of 8 warps: at one sequence (32 heads)
 * that is 256 blocks, two per SM, 16 warps per SM. The walk is latency-bound
 * (ncu on the H200: 12.5% occupancy and L2 at 26% with 32-column tiles), so
 * more resident warps win over fewer L2 re-reads of W and K: 16-column tiles
 * ran the walk in 0.46 ms at 1x8192 against 0.50 ms for 32-column tiles, and
 * 0.77 ms for 32-column tiles of 4 warps. So 16-column tiles are the one variant. */
static int aligned16(const void *p) { return ((uintptr_t)p & 15) == 0; }

extern "C" qd_status qd_cuda_gdn_chunked_stages(const qd_cuda_gdn_plan *p, const qd_cuda_gdn_chunked_args *a,
                                                void *stream, int mask) {
    if (!p || !a || !p->d_chunks) return qd_cuda_fail(QD_ERR_INVALID_ARG, "gdn_chunked: no plan");
    if (!a->d_q || !a->d_k || !a->d_v || !a->d_g || !a->d_beta || !a->d_o)
        return qd_cuda_fail(QD_ERR_INVALID_ARG, "gdn_chunked: null pointer");
    const int hk = p->hk, hv = p->hv, dk = p->dk, dv = p->dv;
    /* Rows are moved in 16-byte pieces: strides and bases must allow that. */
    if (a->q_stride % 8 || a->k_stride % 8 || a->v_stride % 8 || a->q_stride < (int64_t)hk * dk ||
        a->k_stride < (int64_t)hk * dk || a->v_stride < (int64_t)hv * dv || !aligned16(a->d_q) ||
        !aligned16(a->d_k) || !aligned16(a->d_v) || !aligned16(a->d_o))
        return qd_cuda_fail(QD_ERR_INVALID_ARG, "gdn_chunked: strides must be >= the rows, multiples of 8, "
                                                "and bases 16-byte aligned");
    if (p->n_chunks == 0 && !a->d_state1) return QD_OK;
    cudaStream_t st = (cudaStream_t)stream;
    const wy_smem lw = wy_layout(dk, dv);
    const out_smem lo = out_layout(dk, dv);
    qd_status s;
    if (p->n_chunks > 0 && (mask & 1)) {
        if ((s = set_smem(gdn_wy_kernel, lw.total))) return s;
        gdn_wy_kernel<<<dim3(p->n_chunks, hv), WY_NT, lw.total, st>>>(
            p->d_chunks, a->d_k, a->k_stride, a->d_v, a->v_stride, a->d_g, a->d_beta, p->d_w, p->d_u, p->d_gc, hk,
            hv, dk, dv);
        QD_CUDA_CHECK_LAUNCH("gdn_wy_kernel");
    }
    if (!(mask & 2)) {
        /* state walk skipped (benchmark breakdown) */
    } else {
        const size_t sm = st_layout<16>(dk).total;
        if ((s = set_smem(gdn_state_kernel<16>, sm))) return s;
        gdn_state_kernel<16><<<dim3(dv / 16, hv, p->n_seq), ST_NT, sm, st>>>(
            p->d_seqs, a->d_k, a->k_stride, p->d_w, p->d_u, p->d_gc, a->d_state0, a->d_state1, a->d_slot, p->d_h,
            p->d_vnew, hk, hv, dk, dv);
    }
    QD_CUDA_CHECK_LAUNCH("gdn_state_kernel");
    if (p->n_chunks > 0 && (mask & 4)) {
        if ((s = set_smem(gdn_out_kernel, lo.total))) return s;
        gdn_out_kernel<<<dim3(p->n_chunks, hv), OUT_NT, lo.total, st>>>(
            p->d_chunks, a->d_q, a->q_stride, a->d_k, a->k_stride, p->d_gc, p->d_h, p->d_vnew, a->d_o, hk, hv, dk,
            dv);
        QD_CUDA_CHECK_LAUNCH("gdn_out_kernel");
    }
    return QD_OK;
}

extern "C" qd_status qd_cuda_gdn_chunked(const qd_cuda_gdn_plan *p, const qd_cuda_gdn_chunked_args *a,
                                         void *stream) {
    return qd_cuda_gdn_chunked_stages(p, a, stream, 7);
}
