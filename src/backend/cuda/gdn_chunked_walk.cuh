/* GDN chunked prefill, kernel 2 of 2: the sequential walk over the chunks of
 * each sequence, fused with the outputs. One block per (sequence, value head,
 * NW x 16 state columns); warp w owns 16 columns of the state, transposed:
 * S^T (16 x dk, fp32) lives in its mma accumulators for the whole sequence.
 * Per chunk, with H = bf16(S) the state entering the chunk:
 *   P^T  = H^T W^T                       (16 x 64)
 *   Vn^T = U^T - P^T                     corrected values
 *   O^T  = (H^T Q^T) diag(e^G) + Vn^T A^T
 *   S^T  = e^{G_last} S^T + (Vn^T diag(e^{G_last-G_i})) K
 * All products are mma.sync m16n8k16 whose A operand is S^T or Vn^T straight
 * from the accumulators (see cuda_mma.cuh), so the state never leaves
 * registers and no barrier sits inside a step. Warp 0 streams the chunks in
 * with six bulk copies per chunk (K, Q, W, A, U panels, gate vector: each one
 * contiguous, pre-swizzled piece of the wy kernel's scratch) into an NS-stage
 * ring, one mbarrier per stage. (Copying K and Q row by row from the caller's
 * tensors took ~130 small bulk copies per chunk and ran 3x slower on the
 * H200; cp.async rows were in between.) */
#ifndef QD_CUDA_GDN_CHUNKED_WALK_CUH
#define QD_CUDA_GDN_CHUNKED_WALK_CUH

#include "backend/cuda/gdn_chunked_wy.cuh"

#define QD_SMEM_MAX 232448 /* dynamic shared memory a block may have on sm_90 (227 KiB) */

template <int DK, int NW> struct walk_cfg {
    static constexpr int KSTR = DK * 2;            /* bytes per K/Q/W row (swizzled, not padded) */
    static constexpr int KQ = QD_CH * KSTR;        /* K or Q tile */
    static constexpr int WB = QD_CH * DK * 2;      /* W tile */
    static constexpr int AB = QD_CH * QD_CH * 2;   /* A tile */
    static constexpr int UB = NW * QD_CH * 16 * 2; /* U panels of the block's columns */
    static constexpr int GB = QD_GV * 4;           /* gate vector */
    static constexpr int STAGE = 2 * KQ + WB + AB + UB + GB;
    static constexpr int OST = NW * QD_CH * 16 * 2; /* per-warp output staging (64 x 16 bf16) */
    static constexpr int FIXED = OST + 64;          /* + mbarriers */
    static constexpr int NS0 = (QD_SMEM_MAX - FIXED) / STAGE;
    static constexpr int NS = NS0 > 3 ? 3 : NS0; /* stages of the ring */
    static constexpr int SMEM = NS * STAGE + FIXED;
    static_assert(NS >= 1, "walk stage does not fit in shared memory");
};

template <int DK, int NW>
__global__ void __launch_bounds__(NW * 32, 1)
gdn_walk_kernel(const int32_t *__restrict__ seqs, const uint16_t *__restrict__ KQg, const uint16_t *__restrict__ Wg,
                const uint16_t *__restrict__ Ug, const uint16_t *__restrict__ Ag, const float *__restrict__ gate,
                const float *state0, float *state1 /* may alias state0 */, const int32_t *__restrict__ slot,
                uint16_t *__restrict__ o, int hk, int hv, int dk, int dv) {
    using C = walk_cfg<DK, NW>;
    constexpr int KSTR = C::KSTR;
    extern __shared__ __align__(128) unsigned char smem[];
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, gq = lane >> 2, tq = lane & 3;
    const int mi = lane >> 3, rr = lane & 7;
    const int h = blockIdx.y, seq = blockIdx.z, j = h / (hv / hk);
    const int npanel = dv / 16, panel0 = blockIdx.x * NW;
    const int nwv = min(NW, npanel - panel0); /* warps of this block that own columns */
    const bool active = warp < nwv;
    const int64_t tok0 = seqs[4 * seq];
    const int c0 = seqs[4 * seq + 1], nc = seqs[4 * seq + 2], len = seqs[4 * seq + 3];
    const uint32_t sbase = qd_smem_u32(smem);
    const uint32_t bar0 = sbase + C::NS * C::STAGE + C::OST;
    const uint32_t ost = sbase + C::NS * C::STAGE + warp * (QD_CH * 32);

    if (tid == 0)
        for (int s = 0; s < C::NS; s++) qd_mbar_init(bar0 + 8 * s, 1);
    qd_fence_async_smem();
    __syncthreads();

    /* Warp 0: stage chunk c of this sequence into ring slot st. */
    auto issue = [&](int c, int st) {
        const size_t ch = (size_t)(c0 + c) * hv + h, kq = ((size_t)(c0 + c) * hk + j) * 2;
        const uint32_t base = sbase + st * C::STAGE, bar = bar0 + 8 * st;
        if (lane == 0) qd_mbar_expect_tx(bar, 2 * C::KQ + C::WB + C::AB + (uint32_t)nwv * (QD_CH * 32) + C::GB);
        __syncwarp();
        if (lane == 0) qd_bulk_g2s(base, KQg + kq * QD_CH * DK, C::KQ, bar);
        if (lane == 1) qd_bulk_g2s(base + C::KQ, KQg + (kq + 1) * QD_CH * DK, C::KQ, bar);
        if (lane == 2) qd_bulk_g2s(base + 2 * C::KQ, Wg + ch * QD_CH * DK, C::WB, bar);
        if (lane == 3) qd_bulk_g2s(base + 2 * C::KQ + C::WB, Ag + ch * QD_CH * QD_CH, C::AB, bar);
        if (lane == 4)
            qd_bulk_g2s(base + 2 * C::KQ + C::WB + C::AB, Ug + (ch * npanel + panel0) * (QD_CH * 16),
                        (uint32_t)nwv * (QD_CH * 32), bar);
        if (lane == 5) qd_bulk_g2s(base + 2 * C::KQ + C::WB + C::AB + C::UB, gate + ch * QD_GV, C::GB, bar);
    };
    if (warp == 0)
        for (int c = 0; c < C::NS && c < nc; c++) issue(c, c);

    /* S^T of this warp: s[jn] is the 16 x 8 tile of columns (dk) 8 jn.., rows
     * (dv) = this warp's 16 columns of S. */
    const int dcol = (panel0 + warp) * 16 + gq; /* state column of rows gq; +8 for rows gq + 8 */
    const int64_t sl = slot ? (int64_t)slot[seq] : (int64_t)seq;
    const size_t sb = ((size_t)sl * hv + h) * dk * dv;
    float s[DK / 8][4];
#pragma unroll
    for (int jn = 0; jn < DK / 8; jn++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const int kr = 8 * jn + 2 * tq + (e & 1);
            s[jn][e] = active && state0 && kr < dk ? state0[sb + (size_t)kr * dv + dcol + 8 * (e >> 1)] : 0.f;
        }

    for (int c = 0; c < nc; c++) {
        const int st = c % C::NS;
        if (active) {
            const int64_t t0 = tok0 + (int64_t)c * QD_CH;
            const int n = min(QD_CH, len - c * QD_CH);
            const uint32_t kb = sbase + st * C::STAGE, qb = kb + C::KQ, wb = qb + C::KQ, ab = wb + C::WB;
            const uint32_t ub = ab + C::AB + warp * (QD_CH * 32);
            const float *gv = (const float *)(smem + st * C::STAGE + 2 * C::KQ + C::WB + C::AB + C::UB);
            qd_mbar_wait(bar0 + 8 * st, (uint32_t)(c / C::NS) & 1);

            /* P^T = H^T W^T and the first half of O^T, H^T Q^T (K = dk). */
            float pacc[8][4], oacc[8][4];
#pragma unroll
            for (int a = 0; a < 8; a++)
#pragma unroll
                for (int e = 0; e < 4; e++) pacc[a][e] = oacc[a][e] = 0.f;
            /* lane addresses: rows 8 (mi >> 1) + rr of a 16-row group, piece mi & 1 */
            const int pl = 8 * (mi >> 1) + rr, cl = mi & 1;
#pragma unroll
            for (int kk = 0; kk < DK / 16; kk++) {
                uint32_t a[4];
                a[0] = qd_bf2_pack(s[2 * kk][0], s[2 * kk][1]);
                a[1] = qd_bf2_pack(s[2 * kk][2], s[2 * kk][3]);
                a[2] = qd_bf2_pack(s[2 * kk + 1][0], s[2 * kk + 1][1]);
                a[3] = qd_bf2_pack(s[2 * kk + 1][2], s[2 * kk + 1][3]);
#pragma unroll
                for (int jp = 0; jp < 4; jp++) {
                    uint32_t b0, b1, b2, b3;
                    qd_ldsm4(wb + (16 * jp + pl) * (DK * 2) + (((2 * kk + cl) ^ rr) << 4), b0, b1, b2, b3);
                    qd_mma16816(pacc[2 * jp], a, b0, b1);
                    qd_mma16816(pacc[2 * jp + 1], a, b2, b3);
                    qd_ldsm4(qb + (16 * jp + pl) * KSTR + (((2 * kk + cl) ^ rr) << 4), b0, b1, b2, b3);
                    qd_mma16816(oacc[2 * jp], a, b0, b1);
                    qd_mma16816(oacc[2 * jp + 1], a, b2, b3);
                }
            }

            /* Vn^T = U^T - P^T; vn = bf16(Vn^T), vd = bf16(Vn^T decayed to the
             * chunk end), both as A operands over the chunk's positions. */
            uint32_t vn[4][4], vd[4][4];
#pragma unroll
            for (int jp = 0; jp < 4; jp++) {
                uint32_t u[4];
                qd_ldsm4t(ub + (16 * jp + pl) * 32 + ((cl ^ (rr >> 2)) << 4), u[0], u[1], u[2], u[3]);
#pragma unroll
                for (int hh = 0; hh < 2; hh++) {
                    const int jt = 2 * jp + hh, p = 8 * jt + 2 * tq;
                    const float v0 = qd_bf2_lo(u[2 * hh]) - pacc[jt][0], v1 = qd_bf2_hi(u[2 * hh]) - pacc[jt][1];
                    const float v2 = qd_bf2_lo(u[2 * hh + 1]) - pacc[jt][2];
                    const float v3 = qd_bf2_hi(u[2 * hh + 1]) - pacc[jt][3];
                    const float2 dc = *(const float2 *)(gv + p), eg = *(const float2 *)(gv + 64 + p);
                    oacc[jt][0] *= eg.x;
                    oacc[jt][1] *= eg.y;
                    oacc[jt][2] *= eg.x;
                    oacc[jt][3] *= eg.y;
                    vn[jp][2 * hh] = qd_bf2_pack(v0, v1);
                    vn[jp][2 * hh + 1] = qd_bf2_pack(v2, v3);
                    vd[jp][2 * hh] = qd_bf2_pack(v0 * dc.x, v1 * dc.y);
                    vd[jp][2 * hh + 1] = qd_bf2_pack(v2 * dc.x, v3 * dc.y);
                }
            }

            /* S^T = e^{G_last} S^T + vd K (K = positions): on the critical path, so first. */
            const float egl = gv[128];
#pragma unroll
            for (int jn = 0; jn < DK / 8; jn++)
#pragma unroll
                for (int e = 0; e < 4; e++) s[jn][e] *= egl;
            /* transposed K loads: rows 8 (mi & 1) + rr of 16 positions, piece mi >> 1 */
            const int kr = 8 * (mi & 1) + rr, kc = mi >> 1;
#pragma unroll
            for (int jq = 0; jq < DK / 16; jq++)
#pragma unroll
                for (int kk = 0; kk < 4; kk++) {
                    uint32_t b0, b1, b2, b3;
                    qd_ldsm4t(kb + (16 * kk + kr) * KSTR + (((2 * jq + kc) ^ rr) << 4), b0, b1, b2, b3);
                    qd_mma16816(s[2 * jq], vd[kk], b0, b1);
                    qd_mma16816(s[2 * jq + 1], vd[kk], b2, b3);
                }

            /* O^T += vn A^T, causal: position block kk feeds output rows >= 16 kk. */
#pragma unroll
            for (int qq = 0; qq < 4; qq++)
#pragma unroll
                for (int kk = 0; kk < 4; kk++) {
                    if (kk <= qq) {
                        uint32_t b0, b1, b2, b3;
                        qd_ldsm4(ab + (16 * qq + pl) * 128 + (((2 * kk + cl) ^ rr) << 4), b0, b1, b2, b3);
                        qd_mma16816(oacc[2 * qq], vn[kk], b0, b1);
                        qd_mma16816(oacc[2 * qq + 1], vn[kk], b2, b3);
                    }
                }

            /* O^T -> O: transposed into this warp's staging tile (64 positions x
             * 16 columns, halves swizzled like U), then 16-byte rows out. */
#pragma unroll
            for (int qq = 0; qq < 4; qq++)
                qd_stsm4t(ost + (16 * qq + pl) * 32 + ((cl ^ (rr >> 2)) << 4),
                          qd_bf2_pack(oacc[2 * qq][0], oacc[2 * qq][1]), qd_bf2_pack(oacc[2 * qq][2], oacc[2 * qq][3]),
                          qd_bf2_pack(oacc[2 * qq + 1][0], oacc[2 * qq + 1][1]),
                          qd_bf2_pack(oacc[2 * qq + 1][2], oacc[2 * qq + 1][3]));
            __syncwarp();
            const unsigned char *os = smem + C::NS * C::STAGE + warp * (QD_CH * 32);
#pragma unroll
            for (int it = 0; it < 4; it++) {
                const int idx = it * 32 + lane, p = idx >> 1, hf = idx & 1;
                if (p < n) {
                    const uint4 val = *(const uint4 *)(os + p * 32 + ((hf ^ ((p >> 2) & 1)) << 4));
                    *(uint4 *)(o + ((t0 + p) * hv + h) * dv + (panel0 + warp) * 16 + hf * 8) = val;
                }
            }
            __syncwarp();
        }
        __syncthreads(); /* ring slot st is free again */
        if (warp == 0 && c + C::NS < nc) issue(c + C::NS, st);
    }

    if (active && state1) {
#pragma unroll
        for (int jn = 0; jn < DK / 8; jn++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int kr = 8 * jn + 2 * tq + (e & 1);
                if (kr < dk) state1[sb + (size_t)kr * dv + dcol + 8 * (e >> 1)] = s[jn][e];
            }
    }
}

#endif
