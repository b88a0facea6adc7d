/* The batch-invariant product (cuda_ops.h qd_cuda_matmul_invariant): y[t] (+)= W x[t]
 * with bits that depend on the row x[t] and the weights only, never on n or on
 * where the row sits in the batch.
 *
 * The invariant is the summation rule. K is cut into S chains of L k-steps of 16
 * (the last one shorter), S from the matrix shape alone (qd_cuda_matmul_invariant_chains:
 * rows and cols, never n, never the tile). A chain is one fp32 accumulator, set to
 * zero, then one mma.sync m16n8k16 (bf16 in, fp32 accumulate) per k-step in
 * increasing k; the chains are added in order, ((c0 + c1) + c2) + ..., then y + that
 * when accumulating. S = 1 is the plain chain over all of K. An mma's output element
 * reads only its own row of A, column of B and accumulator, so its bits do not
 * depend on the element's place in the fragment or in the tile, nor on the other
 * rows (zero padding past n, past the weight rows or, within the last k-step, past
 * cols only multiplies zeros into other elements or adds exact zero products). A
 * k-step wholly past a chain's end is never issued: the number of steps must not
 * depend on the tile's k width, and the operands keep their roles on every tile
 * (W is the mma's A, x its B). So tile shapes may follow n (a table,
 * qd_cuda_matmul_invariant_choice), and the tests check that every tile gives the
 * same bits for every S.
 *
 * Why chains: at n = 1 one warp walking all of K for its 16 rows leaves a matrix of
 * 2048 rows with 128 warps, a few KiB in flight per SM, 0.5 TB/s. With S chains the
 * k-groups of a CTA (KW groups of WM x WN warps, each with its own stages) walk
 * chains g, g + KW, ... side by side; at the end of each round of KW chains the
 * groups past the first leave their accumulators in shared memory and the first
 * group adds them, in chain order, to its running total. A tile with KW = 1 walks
 * the chains one after another, a fresh accumulator per chain, the same total; with
 * one chain it runs inv_gemm1, the first version's kernel (faster: no chain
 * arithmetic per step). S > 1 only for matrices of at most 4096 rows and 1024+
 * columns (inv_rule: where it measured faster at n = 1; it costs prefill up to 2x).
 *
 * Tiles: A = a tile of BM weight rows, B = BN rows of x (tokens), each k-group WM x WN
 * warps owning (BM / WM) x (BN / WN) outputs; k-steps of BK through an ST-stage
 * cp.async pipeline into padded shared memory (rows of BK + 8 bf16: ldmatrix
 * conflict-free), the structure of moe_prefill.cu's moe_gemm. The pipeline runs on
 * across chains and rounds (a chain's last stage is followed by the next one's
 * first). A 1-D grid of tile pairs, tokens fastest: the CTAs resident at once share
 * a few weight tiles (each read from HBM about once) and all of x (kept in L2);
 * 2^31 - 1 tiles are enough for any model's rows times thousands of tokens.
 * Nothing is allocated and nothing waits on the host, so calls can be captured in
 * a graph. */
#include <stdint.h>

#include "backend/cuda/cuda_mma.cuh"
#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/cuda_util.h"
#include "backend/cuda/cuda_common.cuh"

struct inv_params {
    const uint16_t *W, *x;
    float *y;
    int64_t rows, cols, ldx, ldy;
    int64_t clen; /* columns of a chain (L k-steps of 16); the last chain ends at cols */
    int n, accumulate;
    int nch;      /* chains */
    int ktc;      /* pipeline steps of BK per chain */
    int nit;      /* pipeline steps in all: rounds x ktc */
    unsigned ntn; /* token tiles */
};

/* A warp's outputs into y (y = or y +=), rows and tokens past the tile's ends skipped.
 * Fragment element (mi, ni, 2 * half + e): weight row g (+ 8), token 2 * (lane % 4) + e;
 * a warp's stores of one element cover 8 consecutive floats of 4 y rows (32-byte sectors). */
template <int MI, int NI, int TM, int TN>
__device__ __forceinline__ void inv_store_tile(const inv_params &p, const float (&out)[MI][NI][4], int wm, int wn,
                                               int lane, int64_t row0, int tok0, int rows_here, int toks_here) {
#pragma unroll
    for (int mi = 0; mi < MI; mi++)
#pragma unroll
        for (int half = 0; half < 2; half++) {
            const int r = wm * TM + mi * 16 + (lane >> 2) + half * 8;
            if (r >= rows_here) continue;
#pragma unroll
            for (int ni = 0; ni < NI; ni++)
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    const int t = wn * TN + ni * 8 + 2 * (lane & 3) + e;
                    if (t >= toks_here) continue;
                    float *yp = p.y + (int64_t)(tok0 + t) * p.ldy + row0 + r;
                    const float a = out[mi][ni][2 * half + e];
                    *yp = p.accumulate ? *yp + a : a;
                }
        }
}

/* Rows past the weights (rows_here) or past n (toks_here) are zero in all `stages` stages,
 * written once before the pipeline and never loaded (the first wait's barrier orders this
 * before any read). tid, nt: the thread and the threads taking part. */
template <int BM, int BN, int LD, int CPR>
__device__ __forceinline__ void inv_zero_tails(uint16_t (*Ws)[BM][LD], uint16_t (*Xs)[BN][LD], int stages,
                                               int rows_here, int toks_here, int tid, int nt) {
    const uint4 zero = make_uint4(0, 0, 0, 0);
    if (rows_here < BM)
        for (int i = tid; i < stages * BM * CPR; i += nt) {
            const int r = (i / CPR) % BM;
            if (r >= rows_here) *(uint4 *)&Ws[i / (BM * CPR)][r][(i % CPR) * 8] = zero;
        }
    if (toks_here < BN)
        for (int i = tid; i < stages * BN * CPR; i += nt) {
            const int r = (i / CPR) % BN;
            if (r >= toks_here) *(uint4 *)&Xs[i / (BN * CPR)][r][(i % CPR) * 8] = zero;
        }
}

/* A thread's 16-byte chunks of one stage (W, x at column k; kin false: zero-filled, not
 * read): tile rows rt, rt + RPP, ... below rows_here / toks_here, column cc of the stage. */
template <int BM, int BN, int LD, int RPP, int WCH, int XCH>
__device__ __forceinline__ void inv_load_stage(uint16_t (&Wst)[BM][LD], uint16_t (&Xst)[BN][LD], const uint16_t *wsrc,
                                               const uint16_t *xsrc, const inv_params &p, int64_t k, bool kin, int rt,
                                               int cc, int rows_here, int toks_here) {
#pragma unroll
    for (int j = 0; j < WCH; j++)
        if (rt + j * RPP < rows_here)
            qd_cp_async16(&Wst[rt + j * RPP][cc], wsrc + (int64_t)j * RPP * p.cols + (kin ? k : 0), kin);
#pragma unroll
    for (int j = 0; j < XCH; j++)
        if (rt + j * RPP < toks_here)
            qd_cp_async16(&Xst[rt + j * RPP][cc], xsrc + (int64_t)j * RPP * p.ldx + (kin ? k : 0), kin);
}

/* A warp's k-steps of 16 over one stage into acc, the steps at columns k0 + kk >= kend
 * not issued (their count must not depend on BK: see the top). */
template <int MI, int NI, int TM, int TN, int BM, int BN, int LD, int BK>
__device__ __forceinline__ void inv_mma_stage(float (&acc)[MI][NI][4], const uint16_t (&Wst)[BM][LD],
                                              const uint16_t (&Xst)[BN][LD], int wm, int wn, int lane, int64_t k0,
                                              int64_t kend) {
#pragma unroll
    for (int kk = 0; kk < BK; kk += 16) {
        if (k0 + kk >= kend) break;
        uint32_t af[MI][4], bf[NI][2];
#pragma unroll
        for (int mi = 0; mi < MI; mi++) qd_ldsm_x4(af[mi], &Wst[wm * TM + mi * 16 + (lane & 15)][kk + (lane >> 4) * 8]);
#pragma unroll
        for (int pr = 0; pr < NI / 2; pr++) {
            uint32_t r[4];
            qd_ldsm_x4(r, &Xst[wn * TN + 16 * pr + (lane & 7) + (lane >> 4) * 8][kk + ((lane >> 3) & 1) * 8]);
            bf[2 * pr][0] = r[0];
            bf[2 * pr][1] = r[1];
            bf[2 * pr + 1][0] = r[2];
            bf[2 * pr + 1][1] = r[3];
        }
#pragma unroll
        for (int mi = 0; mi < MI; mi++)
#pragma unroll
            for (int ni = 0; ni < NI; ni++) qd_mma_bf16(acc[mi][ni], af[mi], bf[ni]);
    }
}

/* One chain (S = 1) on a tile of one k-group: the kernel of the first version, kept
 * as it was because the chained walk below costs it 40-80% at n = 1 (its per-step
 * index arithmetic and division, measured on the H200: 42 us against 23 us at
 * 2048 x 4096, 365 us against 260 us on the 970 MiB lm_head). The same mma
 * sequence per output as inv_gemm with one chain: the same bits. */
template <int BM, int BN, int WM, int WN, int BK, int ST>
__global__ void __launch_bounds__(WM * WN * 32) inv_gemm1(const __grid_constant__ inv_params p) {
    constexpr int NT = WM * WN * 32, TM = BM / WM, TN = BN / WN, MI = TM / 16, NI = TN / 8, LD = BK + 8;
    constexpr int CPR = BK / 8; /* 16-byte chunks per tile row and k-step */
    constexpr int RPP = NT / CPR; /* tile rows one pass of the threads loads */
    constexpr int WCH = BM / RPP, XCH = BN / RPP;
    static_assert(TM % 16 == 0 && TN % 16 == 0 && NT % CPR == 0 && BM % RPP == 0 && BN % RPP == 0, "tile shape");
    extern __shared__ __align__(16) uint16_t inv_smem[];
    uint16_t(*Ws)[BM][LD] = reinterpret_cast<uint16_t(*)[BM][LD]>(inv_smem);
    uint16_t(*Xs)[BN][LD] = reinterpret_cast<uint16_t(*)[BN][LD]>(inv_smem + ST * BM * LD);

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, wm = warp % WM, wn = warp / WM;
    const unsigned tn = blockIdx.x % p.ntn;
    const int64_t row0 = (int64_t)(blockIdx.x / p.ntn) * BM;
    const int tok0 = (int)tn * BN;
    const int rows_here = (int)min((int64_t)BM, p.rows - row0), toks_here = min(BN, p.n - tok0);
    inv_zero_tails<BM, BN, LD, CPR>(Ws, Xs, ST, rows_here, toks_here, tid, NT);

    /* this thread's column chunk and first tile row; its rows j follow RPP apart (addresses
     * computed per load: few registers however many rows a thread loads) */
    const int cc = (tid % CPR) * 8, rt = tid / CPR;
    const uint16_t *wsrc = p.W + (row0 + rt) * p.cols + cc, *xsrc = p.x + (int64_t)(tok0 + rt) * p.ldx + cc;
    const int KT = (int)((p.cols + BK - 1) / BK);
    auto load = [&](int st, int kt) {
        const int64_t k = (int64_t)kt * BK;
        const bool kin = k + cc < p.cols; /* cols % 8 == 0: a chunk is all in or all out (zero-filled) */
        inv_load_stage<BM, BN, LD, RPP, WCH, XCH>(Ws[st], Xs[st], wsrc, xsrc, p, k, kin, rt, cc, rows_here, toks_here);
    };

    float acc[MI][NI][4];
    qd_mma_clear(acc);
    /* a warp whose outputs all lie past the weights or past n only helps load */
    const bool active = wm * TM < rows_here && wn * TN < toks_here;

    qd_cp_async_prologue<ST>(load, KT);
    for (int kt = 0; kt < KT; kt++) {
        qd_cp_async_wait<ST - 2>();
        __syncthreads(); /* stage kt landed for all; stage kt - 1 is free to refill */
        const int nk = kt + ST - 1;
        if (nk < KT) load(nk % ST, nk);
        qd_cp_async_commit();
        if (!active) continue;
        const int st = kt % ST; /* ceil(cols / 16) steps whatever BK is */
        inv_mma_stage<MI, NI, TM, TN, BM, BN, LD, BK>(acc, Ws[st], Xs[st], wm, wn, lane, (int64_t)kt * BK, p.cols);
    }
    qd_cp_async_wait<0>();
    if (!active) return;

    inv_store_tile<MI, NI, TM, TN>(p, acc, wm, wn, lane, row0, tok0, rows_here, toks_here);
}

/* The chained walk: any S, any number of k-groups. */
template <int BM, int BN, int WM, int WN, int KW, int BK, int ST>
__global__ void __launch_bounds__(WM * WN * KW * 32) inv_gemm(const __grid_constant__ inv_params p) {
    constexpr int NG = WM * WN * 32, NT = NG * KW; /* threads of a k-group, of the CTA */
    constexpr int TM = BM / WM, TN = BN / WN, MI = TM / 16, NI = TN / 8, LD = BK + 8, NE = MI * NI * 4;
    constexpr int CPR = BK / 8; /* 16-byte chunks per tile row and k-step */
    constexpr int RPP = NG / CPR; /* tile rows one pass of a group's threads loads */
    constexpr int WCH = BM / RPP, XCH = BN / RPP;
    static_assert(TM % 16 == 0 && TN % 16 == 0 && NG % CPR == 0 && BM % RPP == 0 && BN % RPP == 0, "tile shape");
    extern __shared__ __align__(16) uint16_t inv_smem[];
    /* stage s of k-group g: Ws[s * KW + g], Xs[s * KW + g]; then the groups' partial sums */
    uint16_t(*Ws)[BM][LD] = reinterpret_cast<uint16_t(*)[BM][LD]>(inv_smem);
    uint16_t(*Xs)[BN][LD] = reinterpret_cast<uint16_t(*)[BN][LD]>(inv_smem + ST * KW * BM * LD);
    float *part = reinterpret_cast<float *>(inv_smem + ST * KW * (BM + BN) * LD);

    const int tid = threadIdx.x, lane = tid & 31, g = tid / NG, gt = tid % NG;
    const int wm = (gt >> 5) % WM, wn = (gt >> 5) / WM;
    const unsigned tn = blockIdx.x % p.ntn;
    const int64_t row0 = (int64_t)(blockIdx.x / p.ntn) * BM;
    const int tok0 = (int)tn * BN;
    const int rows_here = (int)min((int64_t)BM, p.rows - row0), toks_here = min(BN, p.n - tok0);
    inv_zero_tails<BM, BN, LD, CPR>(Ws, Xs, ST * KW, rows_here, toks_here, tid, NT);

    /* this thread's column chunk and first tile row within its group; its rows j follow
     * RPP apart (addresses computed per load: few registers however many rows it loads) */
    const int cc = (gt % CPR) * 8, rt = gt / CPR;
    const uint16_t *wsrc = p.W + (row0 + rt) * p.cols + cc, *xsrc = p.x + (int64_t)(tok0 + rt) * p.ldx + cc;
    /* pipeline step it: round it / ktc, this group's chain r * KW + g, its kt-th step of BK */
    auto load = [&](int st, int it) {
        const int r = it / p.ktc, kt = it - r * p.ktc, c = r * KW + g;
        if (c >= p.nch) return;
        const int64_t cb = (int64_t)c * p.clen, ce = min(cb + p.clen, p.cols), k = cb + (int64_t)kt * BK;
        if (k >= ce) return; /* past a short last chain: no mma reads it */
        /* chain ends are multiples of 16 or cols (% 8 == 0): a chunk is all in or all out (zero-filled) */
        const bool kin = k + cc < ce;
        const int s = st * KW + g;
        inv_load_stage<BM, BN, LD, RPP, WCH, XCH>(Ws[s], Xs[s], wsrc, xsrc, p, k, kin, rt, cc, rows_here, toks_here);
    };

    float acc[MI][NI][4], tot[MI][NI][4];
    qd_mma_clear(acc);
    /* a warp whose outputs all lie past the weights or past n only helps load (the
     * same warp place in every group: its partner warps are idle too) */
    const bool active = wm * TM < rows_here && wn * TN < toks_here;

    qd_cp_async_prologue<ST>(load, p.nit);
    for (int it = 0; it < p.nit; it++) {
        qd_cp_async_wait<ST - 2>();
        __syncthreads(); /* stage it landed for all; stage it - 1 is free to refill */
        const int nk = it + ST - 1;
        if (nk < p.nit) load(nk % ST, nk);
        qd_cp_async_commit();
        const int r = it / p.ktc, kt = it - r * p.ktc, c = r * KW + g;
        if (active && c < p.nch) {
            const int s = (it % ST) * KW + g;
            const int64_t cb = (int64_t)c * p.clen, ce = min(cb + p.clen, p.cols); /* the chain's steps */
            inv_mma_stage<MI, NI, TM, TN, BM, BN, LD, BK>(acc, Ws[s], Xs[s], wm, wn, lane, cb + (int64_t)kt * BK, ce);
        }
        {
            if (kt != p.ktc - 1) continue;
            /* the round's chains are done: total = ((total + c[r KW]) + c[r KW + 1]) + ... */
            if constexpr (KW > 1) {
                if (g > 0 && active && c < p.nch) {
                    float *pp = part + (size_t)(g - 1) * NE * NG + gt;
#pragma unroll
                    for (int mi = 0; mi < MI; mi++)
#pragma unroll
                        for (int ni = 0; ni < NI; ni++)
#pragma unroll
                            for (int e = 0; e < 4; e++) pp[((mi * NI + ni) * 4 + e) * NG] = acc[mi][ni][e];
                }
                __syncthreads(); /* the next writes to part come after the next step's barrier */
            }
            if (g == 0 && active) {
                const int more = min(KW, p.nch - r * KW); /* chains of this round */
#pragma unroll
                for (int mi = 0; mi < MI; mi++)
#pragma unroll
                    for (int ni = 0; ni < NI; ni++)
#pragma unroll
                        for (int e = 0; e < 4; e++) {
                            float v = r ? tot[mi][ni][e] + acc[mi][ni][e] : acc[mi][ni][e];
                            for (int q = 1; q < more; q++) v += part[((size_t)(q - 1) * NE + (mi * NI + ni) * 4 + e) * NG + gt];
                            tot[mi][ni][e] = v;
                        }
            }
            qd_mma_clear(acc);
        }
    }
    qd_cp_async_wait<0>();
    if (g != 0 || !active) return;

    inv_store_tile<MI, NI, TM, TN>(p, tot, wm, wn, lane, row0, tok0, rows_here, toks_here);
}

template <int BM, int BN, int WM, int WN, int KW, int BK, int ST>
static qd_status inv_launch(inv_params p, cudaStream_t st) {
    constexpr int smem = ST * KW * (BM + BN) * (BK + 8) * 2 + (KW - 1) * BM * BN * 4;
    static int attr_set = 0;
    if (!attr_set) {
        QD_CUDA_TRY(cudaFuncSetAttribute(inv_gemm<BM, BN, WM, WN, KW, BK, ST>,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
        if constexpr (KW == 1)
            QD_CUDA_TRY(cudaFuncSetAttribute(inv_gemm1<BM, BN, WM, WN, BK, ST>,
                                             cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
        attr_set = 1;
    }
    const int64_t ntn = ((int64_t)p.n + BN - 1) / BN, ntm = (p.rows + BM - 1) / BM;
    if (ntn * ntm > INT32_MAX) return qd_cuda_fail(QD_ERR_UNSUPPORTED, "matmul_invariant: more than 2^31 tiles");
    p.ntn = (unsigned)ntn;
    p.ktc = (int)((p.clen + BK - 1) / BK);
    p.nit = (p.nch + KW - 1) / KW * p.ktc;
    const unsigned grid = (unsigned)(ntn * ntm);
    if constexpr (KW == 1)
        if (p.nch == 1) {
            inv_gemm1<BM, BN, WM, WN, BK, ST><<<grid, WM * WN * 32, smem, st>>>(p);
            QD_CUDA_CHECK_LAUNCH("matmul_invariant");
            return QD_OK;
        }
    inv_gemm<BM, BN, WM, WN, KW, BK, ST><<<grid, WM * WN * KW * 32, smem, st>>>(p);
    QD_CUDA_CHECK_LAUNCH("matmul_invariant");
    return QD_OK;
}

/* The tiles: weight rows x tokens, warps (rows x tokens) of a k-group, k-groups, k-step
 * width, stages. Names: "w<rows>xt<tokens>", then "c<k-groups>" where more than one. */
#define INV_TILES(X)                                                                            \
    X(0, "w16xt16", 16, 16, 1, 1, 1, 64, 8)       /* one warp: a check of the others' bits */   \
    X(1, "w32xt16", 32, 16, 2, 1, 1, 64, 8)       /* decode at S = 1: two warps share x */       \
    X(2, "w32xt32", 32, 32, 2, 1, 1, 64, 6)                                                     \
    X(3, "w32xt32k128", 32, 32, 2, 1, 1, 128, 6)                                                \
    X(4, "w64xt64", 64, 64, 4, 1, 1, 64, 4)                                                     \
    X(5, "w128xt64", 128, 64, 2, 2, 1, 32, 4)                                                   \
    X(6, "w128xt128w4", 128, 128, 2, 2, 1, 32, 4) /* 4 warps of 64 x 64, k-steps of 32 */        \
    X(7, "w128xt128k64", 128, 128, 2, 2, 1, 64, 3) /* the same, k-steps of 64 */                \
    X(8, "w16xt16c4", 16, 16, 1, 1, 4, 64, 6)     /* decode at S > 1: chains side by side */    \
    X(9, "w16xt16c8", 16, 16, 1, 1, 8, 64, 4)                                                   \
    X(10, "w16xt16c16", 16, 16, 1, 1, 16, 32, 4)                                                \
    X(11, "w32xt16c4", 32, 16, 2, 1, 4, 64, 4)                                                  \
    X(12, "w32xt32c4", 32, 32, 2, 1, 4, 64, 4)                                                  \
    X(13, "w16xt32c8", 16, 32, 1, 1, 8, 64, 3)

#define INV_COUNT 14

extern "C" int qd_cuda_matmul_invariant_tiles(void) { return INV_COUNT; }

extern "C" const char *qd_cuda_matmul_invariant_tile_name(int tile) {
    switch (tile) {
#define INV_NAME(id, name, BM, BN, WM, WN, KW, BK, ST) \
    case id: return name;
        INV_TILES(INV_NAME)
#undef INV_NAME
    default: return "?";
    }
}

/* The chains of a shape: S such that ... (rule below), then normalised as the kernel
 * cuts K: L = ceil(ceil(cols / 16) / S) k-steps a chain, ceil(cols / (16 L)) chains. */
static int inv_norm_chains(int64_t cols, int64_t s, int64_t *clen) {
    const int64_t ks = (cols + 15) / 16;
    if (s < 1) s = 1;
    if (s > ks) s = ks;
    const int64_t L = (ks + s - 1) / s;
    if (clen) *clen = L * 16;
    return (int)((ks + L - 1) / L);
}

/* The rule, from the H200 (bench/linear_cuda_bench.c `chains`, bf16 x, n = 1; one
 * chain timed on the chained walk, which is 1.4-1.8x slower than inv_gemm1):
 *   rows 512-2048, cols 2048-5120: S = 8 best (2048 x 4096: S = 1 42 us, 2 27, 4 16,
 *     8 11.9, 16 12.5, 32 15.2; inv_gemm1 at S = 1 about 23 us);
 *   rows 4096: S = 4 (4096 x 4096: 17.2 us, S = 8 18.5; 4096 x 12288: 43.6 against 123);
 *   rows 5120: S = 8 43.7 us at 5120 x 6144, no better than inv_gemm1 (the 27B
 *     out_proj: inv/table 2.51 against 2.37 before); rows >= 8192: S > 1 never
 *     more than 1.3x the chained walk at S = 1, so slower than inv_gemm1;
 *   cols 512 (2048 x 512): 5.3 us at S = 4, 7.3 at S = 1 on the chained walk: no gain
 *     over inv_gemm1.
 * Several chains cost prefill (n = 2048, the 128 x 128 tile keeping a running total
 * beside its accumulators spills): 2048 x 4096 122 us at S = 1, 242 at S = 8;
 * 4096 x 4096 245 against 414 at S = 4. */
static int64_t inv_rule(int64_t rows, int64_t cols) {
    if (cols < 1024 || rows > 4096) return 1;
    return rows > 2048 ? 4 : 8;
}

extern "C" int qd_cuda_matmul_invariant_chains(int64_t rows, int64_t cols) {
    if (rows <= 0 || cols <= 0) return 1;
    return inv_norm_chains(cols, inv_rule(rows, cols), NULL);
}

/* The table on n and the shape (the chains follow the shape), from the H200
 * (bench/linear_cuda_bench.c tiles: every tile on bf16 x, rows x cols 2048 x 4096,
 * 12352 x 2048, 5120 x 17408, 34816 x 5120, 248320 x 2048, n = 1 .. 2048; the pick is
 * the fastest or within 5%). One chain (S = 1):
 *   - n <= 16: w32xt16 everywhere (n = 1: 260 us = 3.9 TB/s on the 970 MiB lm_head);
 *   - n <= 64: narrow token tiles while the rows are few (each CTA re-reads x, not W),
 *     64 x 64 from 8192 rows (12352 rows: 30 us at n = 32, 32 us at n = 64);
 *   - n = 128: 128 x 128 from 8192 rows; n = 512: 128 x 64 below 8192 rows;
 *   - prefill: 128 x 128 with k-steps of 64, the fastest at n = 128 and 2048 on every
 *     shape: 37-47% of cuBLAS's time at n = 2048 (7.0 ms for the lm_head against
 *     3.3 ms; 335 us against 143 us at 12352 x 2048); 8 warps, 256-row tiles and
 *     k-steps of 32 were slower.
 * Several chains (bench/linear_cuda_bench.c chains, n = 1, 8, 32): 16-row tiles of 8
 * k-groups up to 2048 rows (2048 x 4096 at S = 8: 11.9 us at n = 1, 12.6 at 8, 18.3 at
 * 32), 32-row tiles of 4 k-groups at 4096 rows (4096 x 4096 at S = 4: 17.2, 17.7,
 * 21.8 us); above n = 32 the tiles of one k-group, as for one chain. */
extern "C" int qd_cuda_matmul_invariant_choice(int64_t rows, int64_t cols, int n) {
    const int S = qd_cuda_matmul_invariant_chains(rows, cols);
    if (S > 1) { /* rows <= 4096 */
        if (n <= 16) return rows <= 2048 ? 9 : 11;
        if (n <= 32) return rows <= 2048 ? 13 : 12;
    }
    if (n <= 16) return 1;
    if (n <= 32) return rows < 4096 ? 1 : rows < 65536 ? 2 : 4;
    if (n <= 64) return rows < 4096 ? 3 : rows < 8192 ? 2 : 4;
    if (n <= 128) return rows < 4096 ? 2 : rows < 8192 ? 4 : 7;
    if (n <= 512) return rows < 8192 ? 5 : 7;
    return 7;
}

static int inv_al16(const void *p) { return ((uintptr_t)p & 15) == 0; }

extern "C" qd_status qd_cuda_matmul_invariant_chained(int tile, int chains, const uint16_t *d_W, int64_t rows,
                                                      int64_t cols, const uint16_t *d_x, int64_t ldx, int n,
                                                      float *d_y, int64_t ldy, int accumulate, void *stream) {
    if (n < 0 || rows < 0) return qd_cuda_fail(QD_ERR_INVALID_ARG, "matmul_invariant: negative n or rows");
    if (cols <= 0 || cols % 8) return qd_cuda_fail(QD_ERR_UNSUPPORTED, "matmul_invariant: cols must be a positive multiple of 8");
    if (ldx < cols || ldx % 8 || ldy < rows)
        return qd_cuda_fail(QD_ERR_INVALID_ARG, "matmul_invariant: ldx must be >= cols and a multiple of 8, ldy >= rows");
    if (tile < -1 || tile >= INV_COUNT) return qd_cuda_fail(QD_ERR_INVALID_ARG, "matmul_invariant: no such tile");
    if (chains < 0) return qd_cuda_fail(QD_ERR_INVALID_ARG, "matmul_invariant: negative chain count");
    if (n == 0 || rows == 0) return QD_OK;
    if (!d_W || !d_x || !d_y) return qd_cuda_fail(QD_ERR_INVALID_ARG, "matmul_invariant: NULL operand");
    if (!inv_al16(d_W) || !inv_al16(d_x))
        return qd_cuda_fail(QD_ERR_UNSUPPORTED, "matmul_invariant: W and x must be 16-byte aligned");
    if (tile < 0) tile = qd_cuda_matmul_invariant_choice(rows, cols, n);
    inv_params p = {};
    p.W = d_W;
    p.x = d_x;
    p.y = d_y;
    p.rows = rows;
    p.cols = cols;
    p.ldx = ldx;
    p.ldy = ldy;
    p.n = n;
    p.accumulate = accumulate != 0;
    p.nch = inv_norm_chains(cols, chains ? chains : inv_rule(rows, cols), &p.clen);
    const cudaStream_t st = (cudaStream_t)stream;
    switch (tile) {
#define INV_CASE(id, name, BM, BN, WM, WN, KW, BK, ST) \
    case id: return inv_launch<BM, BN, WM, WN, KW, BK, ST>(p, st);
        INV_TILES(INV_CASE)
#undef INV_CASE
    default: return qd_cuda_fail(QD_ERR_INTERNAL, "matmul_invariant: no such tile");
    }
}

extern "C" qd_status qd_cuda_matmul_invariant_tile(int tile, const uint16_t *d_W, int64_t rows, int64_t cols,
                                                   const uint16_t *d_x, int64_t ldx, int n, float *d_y, int64_t ldy,
                                                   int accumulate, void *stream) {
    return qd_cuda_matmul_invariant_chained(tile, 0, d_W, rows, cols, d_x, ldx, n, d_y, ldy, accumulate, stream);
}

extern "C" qd_status qd_cuda_matmul_invariant(const uint16_t *d_W, int64_t rows, int64_t cols, const uint16_t *d_x,
                                              int64_t ldx, int n, float *d_y, int64_t ldy, int accumulate,
                                              void *stream) {
    return qd_cuda_matmul_invariant_chained(-1, 0, d_W, rows, cols, d_x, ldx, n, d_y, ldy, accumulate, stream);
}
