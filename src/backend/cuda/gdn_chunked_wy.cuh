/* GDN chunked prefill, kernel 1 of 2: the parallel part of spec 4.1. One
 * block of 4 warps per (chunk, key head); K K^T and Q K^T are formed once and
 * shared by the value heads of the group (GQA), then for each value head h:
 *   G = cumsum(g), L = strict_tril(beta_i (k_i.k_m) e^{G_i-G_m}), T = (I+L)^-1,
 *   W = T diag(beta e^G) K,  U = T diag(beta) V,  A = tril_incl(Q K^T) o e^{G_i-G_m}
 * and the gate vector (below), plus a copy of the chunk's K and Q. W, U, A
 * are bf16 (tensor-core operands, as in FLA); T is solved in fp32.
 * Everything the sequential walk needs per chunk is
 * written in one contiguous, pre-swizzled piece, so the walk loads each with
 * a single bulk copy and reads it with conflict-free ldmatrix. */
#ifndef QD_CUDA_GDN_CHUNKED_WY_CUH
#define QD_CUDA_GDN_CHUNKED_WY_CUH

#include "backend/cuda/cuda_mma.cuh"
#include "qdelta.h"
#include "backend/cuda/cuda_common.cuh"

#define QD_CH 64  /* chunk length */
/* batch-invariant mode starts prompt pieces on chunk boundaries */
static_assert(QD_CH == QD_INVARIANT_ALIGN, "the invariant alignment must be the GDN chunk");
#define QD_GV 144 /* floats per gate vector */

/* Scratch written here, one piece per (chunk, value head) at index c * hv + h:
 *   W    [64][dkp] bf16 (dkp = dk rounded up to 64/128/256, zero columns past
 *        dk); the 16-byte piece p of row i is stored at position p ^ (i & 7)
 *   A    [64][64] bf16, same swizzle; only 16x16 blocks on or below the
 *        diagonal are written (the walk never reads the others)
 *   U    [dv/16 panels][64][16] bf16; the two 16-byte halves of row i are
 *        swapped when (i >> 2) & 1
 *   gate [QD_GV] fp32: [0,64) e^{G_last-G_i} (0 past the chunk end),
 *        [64,128) e^{G_i}, [128] e^{G_last}, then zeros
 * and per (chunk, key head), at index (c * hk + j) * 2 + {0, 1}:
 *   KQ   K and Q of the chunk, [64][dkp] bf16 each, swizzled like W (the walk
 *        loads each with one bulk copy; row by row it was 3x slower)
 * Rows past the end of a short chunk, and columns past dk, come out zero. */

#define WY_NT 128
#define WY_LS 68 /* fp32 row stride of L and T */

struct wy_smem {
    size_t ks, qs, vs, ls, ts, xs, gs, bs, es, graw, braw, total;
};
/* 91 KiB at dk = dv = 128: two blocks per SM. (Letting T take Q's room for a
 * third block made the compiler spill at 168 registers and ran 8% slower.) */
__host__ __device__ static inline wy_smem wy_layout(int dkp, int dv, int r) {
    wy_smem s;
    size_t o = 0;
    s.ks = o; o += (size_t)QD_CH * (dkp + 8) * 2;
    s.qs = o; o += (size_t)QD_CH * (dkp + 8) * 2;
    s.vs = o; o += (size_t)QD_CH * (dv + 8) * 2;
    s.ls = o; o += (size_t)QD_CH * WY_LS * 4;
    s.ts = o; o += (size_t)QD_CH * WY_LS * 4;
    s.xs = o; o += (size_t)(WY_NT / 32) * 16 * 17 * 4;
    s.gs = o; o += QD_CH * 4;
    s.bs = o; o += QD_CH * 4;
    s.es = o; o += QD_CH * 4;
    s.graw = o; o += (size_t)r * QD_CH * 4;
    s.braw = o; o += (size_t)r * QD_CH * 4;
    s.total = o;
    return s;
}

/* cp.async of rows [0, 64) x colsp bf16 into shared rows of dst_stride bytes;
 * rows >= n and columns >= cols are zero-filled. */
__device__ static inline void wy_rows(unsigned char *dst, int dst_stride, const uint16_t *src, int64_t src_stride,
                                      int n, int cols, int colsp, int tid) {
    const int per = colsp / 8;
    for (int idx = tid; idx < QD_CH * per; idx += WY_NT) {
        const int r = idx / per, c = (idx % per) * 8;
        const bool ok = r < n && c < cols;
        qd_cp_async16(dst + r * dst_stride + c * 2, src + (int64_t)(ok ? r : 0) * src_stride + (ok ? c : 0), ok);
    }
}

/* The A fragments of row block rb of T diag(d) (T: the chunk's triangular solve in Ts, d:
 * a diagonal, 64 floats) for the k-blocks kk <= rb, the only ones a lower-triangular T has. */
__device__ static inline void wy_tdiag_frags(uint32_t (&ta)[4][4], const float *Ts, const float *d, int rb, int gq,
                                             int tq) {
#pragma unroll
    for (int kk = 0; kk < 4; kk++) {
        if (kk <= rb) {
            const float *t0r = Ts + (16 * rb + gq) * WY_LS + 16 * kk + 2 * tq, *t1r = t0r + 8 * WY_LS;
            const float *ds = d + 16 * kk + 2 * tq;
            ta[kk][0] = qd_bf2_pack(t0r[0] * ds[0], t0r[1] * ds[1]);
            ta[kk][1] = qd_bf2_pack(t1r[0] * ds[0], t1r[1] * ds[1]);
            ta[kk][2] = qd_bf2_pack(t0r[8] * ds[8], t0r[9] * ds[9]);
            ta[kk][3] = qd_bf2_pack(t1r[8] * ds[8], t1r[9] * ds[9]);
        }
    }
}

/* acc += (row block rb of T diag(d)) B for 16 columns (two n8 halves) of the chunk's B
 * rows at shared address b (row m at m * stride bytes; col16: the 16-column group's byte
 * offset), k-blocks kk <= rb only: B is read by transposed ldmatrix. */
__device__ static inline void wy_tdiag_mma(float (&acc)[2][4], const uint32_t (&ta)[4][4], uint32_t b,
                                           int stride, int col16, int rb, int mi, int rr) {
#pragma unroll
    for (int kk = 0; kk < 4; kk++) {
        if (kk <= rb) {
            uint32_t b0, b1, b2, b3;
            qd_ldsm4t(b + (16 * kk + 8 * (mi & 1) + rr) * stride + col16, b0, b1, b2, b3);
            qd_mma16816(acc[0], ta[kk], b0, b1);
            qd_mma16816(acc[1], ta[kk], b2, b3);
        }
    }
}

template <int DKP>
__global__ void __launch_bounds__(WY_NT, 2)
gdn_wy_kernel(const int32_t *__restrict__ chunks, const uint16_t *__restrict__ q, int64_t q_stride,
              const uint16_t *__restrict__ k, int64_t k_stride, const uint16_t *__restrict__ v, int64_t v_stride,
              const float *__restrict__ g, const float *__restrict__ beta, uint16_t *__restrict__ Wg,
              uint16_t *__restrict__ Ug, uint16_t *__restrict__ Ag, float *__restrict__ gate,
              uint16_t *__restrict__ KQg, int hk, int hv, int dk, int dv) {
    extern __shared__ __align__(128) unsigned char smem[];
    constexpr int KSTR = (DKP + 8) * 2; /* bytes per K/Q row: the 16-byte shift per row spreads ldmatrix banks */
    const int r = hv / hk;
    const wy_smem L = wy_layout(DKP, dv, r);
    const int tid = threadIdx.x, w = tid >> 5, lane = tid & 31, gq = lane >> 2, tq = lane & 3;
    const int mi = lane >> 3, rr = lane & 7; /* ldmatrix: matrix and row this lane addresses */
    const int wq = 3 - w;                    /* Q K^T row block of this warp (balances the triangles) */
    const int cid = blockIdx.x, j = blockIdx.y;
    const int64_t t0 = chunks[4 * cid];
    const int n = chunks[4 * cid + 1];
    const int VSTR = (dv + 8) * 2, npanel = dv / 16;
    unsigned char *Ks = smem + L.ks, *Qs = smem + L.qs, *Vs = smem + L.vs;
    const uint32_t ks = qd_smem_u32(Ks), qs = qd_smem_u32(Qs), vs = qd_smem_u32(Vs);
    float *Ls = (float *)(smem + L.ls), *Ts = (float *)(smem + L.ts);
    float *Xs = (float *)(smem + L.xs) + w * 16 * 17;
    float *Gs = (float *)(smem + L.gs), *Bs = (float *)(smem + L.bs), *Es = (float *)(smem + L.es);
    float *graw = (float *)(smem + L.graw), *braw = (float *)(smem + L.braw);

    wy_rows(Ks, KSTR, k + t0 * k_stride + (int64_t)j * dk, k_stride, n, dk, DKP, tid);
    wy_rows(Qs, KSTR, q + t0 * q_stride + (int64_t)j * dk, q_stride, n, dk, DKP, tid);
    qd_cp_async_commit();
    wy_rows(Vs, VSTR, v + t0 * v_stride + (int64_t)j * r * dv, v_stride, n, dv, dv, tid);
    qd_cp_async_commit();
    /* g, beta of the group's value heads (0 past the chunk end: G stays at G_last there). */
    for (int idx = tid; idx < QD_CH * r; idx += WY_NT) {
        const int p = idx / r, vv = idx % r;
        const bool ok = p < n;
        graw[vv * QD_CH + p] = ok ? g[(t0 + p) * hv + j * r + vv] : 0.f;
        braw[vv * QD_CH + p] = ok ? beta[(t0 + p) * hv + j * r + vv] : 0.f;
    }
    qd_cp_async_wait<1>();
    __syncthreads();
    { /* the walk's copy of K and Q (see KQ above) */
        unsigned char *dst = (unsigned char *)(KQg + ((size_t)cid * hk + j) * 2 * QD_CH * DKP);
        for (int idx = tid; idx < 2 * QD_CH * (DKP / 8); idx += WY_NT) {
            const int wq2 = idx / (QD_CH * (DKP / 8)), rem = idx % (QD_CH * (DKP / 8));
            const int i = rem / (DKP / 8), pc = rem % (DKP / 8);
            *(uint4 *)(dst + wq2 * (QD_CH * DKP * 2) + i * (DKP * 2) + ((pc ^ (i & 7)) << 4)) =
                *(const uint4 *)((wq2 ? Qs : Ks) + i * KSTR + pc * 16);
        }
    }

    /* K K^T row block w and Q K^T row block wq (16 x 16(w+1) and 16 x 16(wq+1)
     * lower blocks), kept in registers for all value heads. */
    float kkf[8][4], qkf[8][4];
#pragma unroll
    for (int a = 0; a < 8; a++)
#pragma unroll
        for (int e = 0; e < 4; e++) kkf[a][e] = qkf[a][e] = 0.f;
#pragma unroll
    for (int kk = 0; kk < DKP / 16; kk++) {
        uint32_t ak[4], aq[4];
        qd_ldsm4(ks + (16 * w + 8 * (mi & 1) + rr) * KSTR + (2 * kk + (mi >> 1)) * 16, ak[0], ak[1], ak[2], ak[3]);
        qd_ldsm4(qs + (16 * wq + 8 * (mi & 1) + rr) * KSTR + (2 * kk + (mi >> 1)) * 16, aq[0], aq[1], aq[2], aq[3]);
#pragma unroll
        for (int jp = 0; jp < 4; jp++) {
            if (jp <= w || jp <= wq) {
                uint32_t b0, b1, b2, b3; /* B[d][m] = K[m][d]: rows m of K */
                qd_ldsm4(ks + (16 * jp + 8 * (mi >> 1) + rr) * KSTR + (2 * kk + (mi & 1)) * 16, b0, b1, b2, b3);
                if (jp <= w) {
                    qd_mma16816(kkf[2 * jp], ak, b0, b1);
                    qd_mma16816(kkf[2 * jp + 1], ak, b2, b3);
                }
                if (jp <= wq) {
                    qd_mma16816(qkf[2 * jp], aq, b0, b1);
                    qd_mma16816(qkf[2 * jp + 1], aq, b2, b3);
                }
            }
        }
    }

    for (int vv = 0; vv < r; vv++) {
        const int h = j * r + vv;
        const size_t ch = (size_t)cid * hv + h;
        if (w == 0) {
            /* G = inclusive cumsum of g; gate vector for the walk. */
            float ga = graw[vv * QD_CH + lane], gb = graw[vv * QD_CH + lane + 32];
#pragma unroll
            for (int off = 1; off < 32; off *= 2) {
                const float ua = __shfl_up_sync(0xffffffffu, ga, off), ub = __shfl_up_sync(0xffffffffu, gb, off);
                if (lane >= off) {
                    ga += ua;
                    gb += ub;
                }
            }
            gb += __shfl_sync(0xffffffffu, ga, 31);
            const float gl = __shfl_sync(0xffffffffu, gb, 31); /* = G_{n-1}: g is 0 past the end */
            const float ba = braw[vv * QD_CH + lane], bb = braw[vv * QD_CH + lane + 32];
            Gs[lane] = ga;
            Gs[lane + 32] = gb;
            Bs[lane] = ba;
            Bs[lane + 32] = bb;
            const float ea = __expf(ga), eb = __expf(gb);
            Es[lane] = ba * ea;
            Es[lane + 32] = bb * eb;
            float *gv = gate + ch * QD_GV;
            gv[lane] = lane < n ? __expf(gl - ga) : 0.f;
            gv[lane + 32] = lane + 32 < n ? __expf(gl - gb) : 0.f;
            gv[64 + lane] = ea;
            gv[96 + lane] = eb;
            if (lane < 16) gv[128 + lane] = lane == 0 ? __expf(gl) : 0.f;
        }
        __syncthreads();

        /* L (row block w, fp32 to shared) and A (row block wq, bf16 to global).
         * e^{G_i-G_m} is only taken for m <= i, where it cannot overflow. */
        {
            const int i0 = 16 * w + gq, i1 = i0 + 8;
            const float gi0 = Gs[i0], gi1 = Gs[i1], bi0 = Bs[i0], bi1 = Bs[i1];
#pragma unroll
            for (int jt = 0; jt < 8; jt++) {
                if (jt < 2 * (w + 1)) {
                    const int m = 8 * jt + 2 * tq;
                    const float gm0 = Gs[m], gm1 = Gs[m + 1];
                    float2 l0, l1;
                    l0.x = m < i0 ? bi0 * kkf[jt][0] * __expf(gi0 - gm0) : 0.f;
                    l0.y = m + 1 < i0 ? bi0 * kkf[jt][1] * __expf(gi0 - gm1) : 0.f;
                    l1.x = m < i1 ? bi1 * kkf[jt][2] * __expf(gi1 - gm0) : 0.f;
                    l1.y = m + 1 < i1 ? bi1 * kkf[jt][3] * __expf(gi1 - gm1) : 0.f;
                    *(float2 *)(Ls + i0 * WY_LS + m) = l0;
                    *(float2 *)(Ls + i1 * WY_LS + m) = l1;
                }
            }
        }
        {
            const int i0 = 16 * wq + gq, i1 = i0 + 8;
            const float gi0 = Gs[i0], gi1 = Gs[i1];
            unsigned char *ab = (unsigned char *)(Ag + ch * QD_CH * QD_CH);
#pragma unroll
            for (int jt = 0; jt < 8; jt++) {
                if (jt < 2 * (wq + 1)) {
                    const int m = 8 * jt + 2 * tq;
                    const float gm0 = Gs[m], gm1 = Gs[m + 1];
                    const float a00 = m <= i0 && i0 < n ? qkf[jt][0] * __expf(gi0 - gm0) : 0.f;
                    const float a01 = m + 1 <= i0 && i0 < n ? qkf[jt][1] * __expf(gi0 - gm1) : 0.f;
                    const float a10 = m <= i1 && i1 < n ? qkf[jt][2] * __expf(gi1 - gm0) : 0.f;
                    const float a11 = m + 1 <= i1 && i1 < n ? qkf[jt][3] * __expf(gi1 - gm1) : 0.f;
                    const int sw = ((jt ^ gq) << 4) + 4 * tq; /* i0 & 7 == i1 & 7 == gq */
                    *(uint32_t *)(ab + i0 * 128 + sw) = qd_bf2_pack(a00, a01);
                    *(uint32_t *)(ab + i1 * 128 + sw) = qd_bf2_pack(a10, a11);
                }
            }
        }
        __syncthreads();

        /* T = (I+L)^-1 in 16x16 blocks, fp32. Diagonal blocks by forward
         * substitution (lane m of warp w owns column m of T_ww), then
         * T_IJ = -T_II sum_{J<=P<I} L_IP T_PJ by distance I-J = 1, 2, 3. */
        {
            const int m = lane & 15;
            const float *lrow = Ls + 16 * w * WY_LS + 16 * w;
            float tc[16];
#pragma unroll
            for (int i = 0; i < 16; i++) {
                float acc = 0.f;
#pragma unroll
                for (int p = 0; p < i; p++) acc = fmaf(lrow[i * WY_LS + p], tc[p], acc);
                tc[i] = i == m ? 1.f : (i < m ? 0.f : -acc);
            }
            if (lane < 16) {
#pragma unroll
                for (int i = 0; i < 16; i++) Ts[(16 * w + i) * WY_LS + 16 * w + m] = tc[i];
            }
        }
        __syncthreads();
        if (w >= 1) { /* T_{w,w-1}: row lane/2, 8 columns */
            const int I = w, J = w - 1, ro = lane >> 1, c0 = (lane & 1) * 8;
            float x[8];
#pragma unroll
            for (int c = 0; c < 8; c++) x[c] = 0.f;
#pragma unroll
            for (int p = 0; p < 16; p++) {
                const float l = Ls[(16 * I + ro) * WY_LS + 16 * J + p];
                const float *tr = Ts + (16 * J + p) * WY_LS + 16 * J + c0;
#pragma unroll
                for (int c = 0; c < 8; c++) x[c] = fmaf(l, tr[c], x[c]);
            }
#pragma unroll
            for (int c = 0; c < 8; c++) Xs[ro * 17 + c0 + c] = x[c];
            __syncwarp();
            float y[8];
#pragma unroll
            for (int c = 0; c < 8; c++) y[c] = 0.f;
#pragma unroll
            for (int p = 0; p < 16; p++) {
                const float tv = Ts[(16 * I + ro) * WY_LS + 16 * I + p];
#pragma unroll
                for (int c = 0; c < 8; c++) y[c] = fmaf(tv, Xs[p * 17 + c0 + c], y[c]);
            }
#pragma unroll
            for (int c = 0; c < 8; c++) Ts[(16 * I + ro) * WY_LS + 16 * J + c0 + c] = -y[c];
        }
        __syncthreads();
        { /* T_20 (warps 0, 1) and T_31 (warps 2, 3), 8 columns per warp, 4 per lane */
            const int I = 2 + (w >> 1), J = I - 2, ro = lane >> 1, cx = 4 * (lane & 1), cc = 8 * (w & 1) + cx;
            float x[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
            for (int p = 0; p < 32; p++) {
                const float l = Ls[(16 * I + ro) * WY_LS + 16 * J + p];
                const float *tr = Ts + (16 * J + p) * WY_LS + 16 * J + cc;
#pragma unroll
                for (int c = 0; c < 4; c++) x[c] = fmaf(l, tr[c], x[c]);
            }
#pragma unroll
            for (int c = 0; c < 4; c++) Xs[ro * 17 + cx + c] = x[c];
            __syncwarp();
            float y[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
            for (int p = 0; p < 16; p++) {
                const float tv = Ts[(16 * I + ro) * WY_LS + 16 * I + p];
#pragma unroll
                for (int c = 0; c < 4; c++) y[c] = fmaf(tv, Xs[p * 17 + cx + c], y[c]);
            }
#pragma unroll
            for (int c = 0; c < 4; c++) Ts[(16 * I + ro) * WY_LS + 16 * J + cc + c] = -y[c];
        }
        __syncthreads();
        { /* T_30: 4 columns per warp, 2 per lane */
            const int ro = lane >> 1, cx = 2 * (lane & 1), cc = 4 * w + cx;
            float x[2] = {0.f, 0.f};
#pragma unroll
            for (int p = 0; p < 48; p++) {
                const float l = Ls[(48 + ro) * WY_LS + p];
                x[0] = fmaf(l, Ts[p * WY_LS + cc], x[0]);
                x[1] = fmaf(l, Ts[p * WY_LS + cc + 1], x[1]);
            }
            Xs[ro * 17 + cx] = x[0];
            Xs[ro * 17 + cx + 1] = x[1];
            __syncwarp();
            float y[2] = {0.f, 0.f};
#pragma unroll
            for (int p = 0; p < 16; p++) {
                const float tv = Ts[(48 + ro) * WY_LS + 48 + p];
                y[0] = fmaf(tv, Xs[p * 17 + cx], y[0]);
                y[1] = fmaf(tv, Xs[p * 17 + cx + 1], y[1]);
            }
            Ts[(48 + ro) * WY_LS + cc] = -y[0];
            Ts[(48 + ro) * WY_LS + cc + 1] = -y[1];
        }
        qd_cp_async_wait<0>(); /* V of this value head */
        __syncthreads();

        /* W row block w = (T diag(beta e^G))_w K and U row block wq =
         * (T diag(beta))_wq V: T is lower triangular, so only k-blocks <= the
         * row block contribute; the pairing w / 3-w gives every warp 5 of them. */
        {
            uint32_t ta[4][4];
            wy_tdiag_frags(ta, Ts, Es, w, gq, tq);
            unsigned char *wb = (unsigned char *)(Wg + ch * QD_CH * DKP);
            const int i0 = 16 * w + gq;
#pragma unroll
            for (int jq = 0; jq < DKP / 16; jq++) {
                float acc[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
                wy_tdiag_mma(acc, ta, ks, KSTR, (2 * jq + (mi >> 1)) * 16, w, mi, rr); /* B[m][d] = K[m][d] */
#pragma unroll
                for (int hh = 0; hh < 2; hh++) {
                    const int sw = (((2 * jq + hh) ^ gq) << 4) + 4 * tq;
                    *(uint32_t *)(wb + i0 * (DKP * 2) + sw) = qd_bf2_pack(acc[hh][0], acc[hh][1]);
                    *(uint32_t *)(wb + (i0 + 8) * (DKP * 2) + sw) = qd_bf2_pack(acc[hh][2], acc[hh][3]);
                }
            }
        }
        {
            uint32_t ta[4][4];
            wy_tdiag_frags(ta, Ts, Bs, wq, gq, tq);
            unsigned char *ub = (unsigned char *)(Ug + ch * QD_CH * dv);
            const int i0 = 16 * wq + gq, hs = (gq >> 2) & 1; /* (i >> 2) & 1 for rows i0 and i0 + 8 */
            for (int jq = 0; jq < npanel; jq++) {
                float acc[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
                wy_tdiag_mma(acc, ta, vs, VSTR, (2 * jq + (mi >> 1)) * 16, wq, mi, rr);
                unsigned char *panel = ub + jq * (QD_CH * 32);
#pragma unroll
                for (int hh = 0; hh < 2; hh++) {
                    const int sw = ((hh ^ hs) << 4) + 4 * tq;
                    *(uint32_t *)(panel + i0 * 32 + sw) = qd_bf2_pack(acc[hh][0], acc[hh][1]);
                    *(uint32_t *)(panel + (i0 + 8) * 32 + sw) = qd_bf2_pack(acc[hh][2], acc[hh][3]);
                }
            }
        }
        if (vv + 1 < r) {
            __syncthreads(); /* everyone is done with V, L, T and G of this head */
            wy_rows(Vs, VSTR, v + t0 * v_stride + (int64_t)(h + 1) * dv, v_stride, n, dv, dv, tid);
            qd_cp_async_commit();
        }
    }
}

#endif
