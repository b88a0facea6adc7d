/* GDN chunked prefill (spec 4.1): chunk C = 64, WY form on the tensor cores
 * (bf16 x bf16 -> fp32 mma.sync), varlen batches through a chunk table.
 *
 * Two kernels:
 *   wy   (gdn_chunked_wy.cuh)   per (chunk, key head), all in parallel: the
 *        WY factors W, U of every value head, the intra-chunk attention
 *        A = tril_incl(Q K^T) o e^{G_i-G_m} and the chunk's decay factors;
 *   walk (gdn_chunked_walk.cuh) per (sequence, value head, group of 16-column
 *        state tiles): the sequential pass over the chunks, carrying S in
 *        registers, writing the outputs O = diag(e^G) Q S + A (U - W S) as it
 *        goes, and the final state.
 * Only the walk is sequential in time. Fusing the outputs into it means the
 * per-chunk states and corrected values never go through device memory.
 *
 * Operand precision is bf16 (inputs, W, U, A, the state entering a chunk and
 * the corrected values, as in FLA) with fp32 accumulation; T = (I+L)^-1, the
 * carried state, G and all exponentials stay fp32. */
#include <cuda_runtime.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_util.h"
#include "backend/cuda/gdn_chunked_walk.cuh"
#include "backend/cuda/gdn_chunked_wy.cuh"

#define MAXD 256 /* largest dk, dv */

/* Width of the W scratch rows and of the kernels' dk loops: dk rounded up to
 * 64, 128 or 256 (zero columns in between cost nothing but tensor work). */
static int dk_padded(int dk) { return dk <= 64 ? 64 : dk <= 128 ? 128 : 256; }

extern "C" void qd_cuda_gdn_plan_destroy(qd_cuda_gdn_plan *p) {
    if (!p) return;
    qd_cuda_free(p->d_chunks);
    qd_cuda_free(p->d_seqs);
    qd_cuda_free(p->d_w);
    qd_cuda_free(p->d_u);
    qd_cuda_free(p->d_gc);
    qd_cuda_free(p->d_vnew);
    qd_cuda_free(p->d_h);
    qd_cuda_free_host(p->h_tables);
    memset(p, 0, sizeof *p);
}

/* The plan's scratch (layouts in gdn_chunked_wy.cuh) for up to max_chunks chunks:
 * per (chunk, value head) d_w holds W, d_u the U panels, d_gc the gate vectors and
 * d_vnew the intra-chunk matrices A; per (chunk, key head) d_h holds the copies of
 * K and Q. (The field names are those of the earlier three-kernel version: outputs
 * are now written by the walk, so per-chunk states and corrected values are never
 * stored.) Every piece is indexed by chunk, so scratch for more chunks than a batch
 * has serves it unchanged. The chunk and sequence tables are staged in pinned
 * memory so that setting a batch is one asynchronous copy. */
static qd_status plan_alloc(qd_cuda_gdn_plan *p, int hk, int hv, int dk, int dv, int64_t max_chunks, int max_seqs) {
    memset(p, 0, sizeof *p);
    if (hk <= 0 || hv <= 0 || hv % hk || hk > 65535 || dk <= 0 || dv <= 0 || dk % 16 || dv % 16 || dk > MAXD ||
        dv > MAXD || max_seqs <= 0 || max_seqs > 65535 || max_chunks < 0 || max_chunks > 0x7fffffff)
        return qd_cuda_fail(QD_ERR_INVALID_ARG, "gdn_plan: bad dimensions");
    p->hk = hk; p->hv = hv; p->dk = dk; p->dv = dv;
    p->max_chunks = (int)max_chunks;
    p->max_seqs = max_seqs;
    const size_t NCH = (size_t)max_chunks * hv; /* pieces of scratch */
    const size_t wb = NCH * QD_CH * dk_padded(dk) * 2, ub = NCH * QD_CH * dv * 2, gb = NCH * QD_GV * 4,
                 ab = NCH * QD_CH * QD_CH * 2, kqb = (size_t)max_chunks * hk * 2 * QD_CH * dk_padded(dk) * 2;
    const size_t cb = 16 * (size_t)(max_chunks ? max_chunks : 1), sb = 16 * (size_t)max_seqs;
    qd_status st;
    if ((st = qd_cuda_malloc((void **)&p->d_chunks, cb)) || (st = qd_cuda_malloc((void **)&p->d_seqs, sb)) ||
        (NCH && (st = qd_cuda_malloc((void **)&p->d_w, wb))) || (NCH && (st = qd_cuda_malloc((void **)&p->d_u, ub))) ||
        (NCH && (st = qd_cuda_malloc((void **)&p->d_gc, gb))) ||
        (NCH && (st = qd_cuda_malloc((void **)&p->d_vnew, ab))) ||
        (NCH && (st = qd_cuda_malloc((void **)&p->d_h, kqb))) ||
        (st = qd_cuda_malloc_host((void **)&p->h_tables, cb + sb))) {
        qd_cuda_gdn_plan_destroy(p);
        return st;
    }
    p->bytes = cb + sb + wb + ub + gb + ab + kqb;
    return QD_OK;
}

/* Chunks of n_seq sequences given by cu_seqlens (-1: not a valid batch). */
static int64_t count_chunks(const int32_t *cu, int n_seq) {
    if (!cu || n_seq <= 0 || cu[0] != 0) return -1;
    int64_t nch = 0;
    for (int s = 0; s < n_seq; s++) {
        const int64_t len = (int64_t)cu[s + 1] - cu[s];
        if (len < 0) return -1;
        nch += (len + QD_CH - 1) / QD_CH;
    }
    return nch;
}

extern "C" qd_status qd_cuda_gdn_plan_reserve(qd_cuda_gdn_plan *p, int hk, int hv, int dk, int dv, int max_tokens,
                                              int max_seqs) {
    if (max_tokens < 1 || max_seqs < 1) {
        memset(p, 0, sizeof *p);
        return qd_cuda_fail(QD_ERR_INVALID_ARG, "gdn_plan: bad bounds");
    }
    /* each sequence's chunks: ceil(len / 64) <= (len + 63) / 64, over at most
     * min(max_seqs, max_tokens) sequences of max_tokens tokens in all */
    const int64_t ns = max_seqs < max_tokens ? max_seqs : max_tokens;
    return plan_alloc(p, hk, hv, dk, dv, ((int64_t)max_tokens + 63 * ns + QD_CH - 1) / QD_CH, max_seqs);
}

extern "C" qd_status qd_cuda_gdn_plan_set(qd_cuda_gdn_plan *p, const int32_t *cu_seqlens_host, int n_seq,
                                          void *stream) {
    if (!p || !p->h_tables) return qd_cuda_fail(QD_ERR_INVALID_ARG, "gdn_plan: not reserved");
    const int64_t nch = count_chunks(cu_seqlens_host, n_seq);
    if (nch < 0) return qd_cuda_fail(QD_ERR_INVALID_ARG, "gdn_plan: bad cu_seqlens");
    if (nch > p->max_chunks || n_seq > p->max_seqs)
        return qd_cuda_fail(QD_ERR_INVALID_ARG, "gdn_plan: batch beyond the reserved chunks or sequences");
    int32_t *ch = p->h_tables, *sq = p->h_tables + 4 * (size_t)(p->max_chunks ? p->max_chunks : 1);
    int c = 0;
    for (int s = 0; s < n_seq; s++) {
        const int a = cu_seqlens_host[s], z = cu_seqlens_host[s + 1];
        sq[4 * s] = a;
        sq[4 * s + 1] = c;
        sq[4 * s + 3] = z - a;
        for (int t = a; t < z; t += QD_CH, c++) {
            ch[4 * c] = t;
            ch[4 * c + 1] = z - t < QD_CH ? z - t : QD_CH;
            ch[4 * c + 2] = s;
            ch[4 * c + 3] = c - sq[4 * s + 1];
        }
        sq[4 * s + 2] = c - sq[4 * s + 1];
    }
    p->n_seq = n_seq;
    p->n_chunks = (int)nch;
    p->n_tokens = cu_seqlens_host[n_seq];
    qd_status st;
    if ((nch && (st = qd_cuda_memcpy_h2d_async(p->d_chunks, ch, 16 * (size_t)nch, stream))) ||
        (st = qd_cuda_memcpy_h2d_async(p->d_seqs, sq, 16 * (size_t)n_seq, stream)))
        return st;
    return QD_OK;
}

extern "C" qd_status qd_cuda_gdn_plan_create(qd_cuda_gdn_plan *p, int hk, int hv, int dk, int dv,
                                             const int32_t *cu_seqlens_host, int n_seq) {
    const int64_t nch = count_chunks(cu_seqlens_host, n_seq);
    if (nch < 0 || n_seq > 65535) {
        memset(p, 0, sizeof *p);
        return qd_cuda_fail(QD_ERR_INVALID_ARG, "gdn_plan: bad dimensions or cu_seqlens");
    }
    qd_status st = plan_alloc(p, hk, hv, dk, dv, nch, n_seq);
    if (!st) st = qd_cuda_gdn_plan_set(p, cu_seqlens_host, n_seq, NULL);
    if (!st) st = qd_cuda_sync(); /* the tables are in place when this returns, as callers expect */
    if (st) qd_cuda_gdn_plan_destroy(p);
    return st;
}

/* Opt a kernel into more than 48 KiB of dynamic shared memory. */
template <typename K> static qd_status set_smem(K kernel, size_t bytes) {
    return qd_cuda_status(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes),
                          "cudaFuncSetAttribute(max dynamic shared memory)");
}

template <int DKP>
static qd_status launch_wy(const qd_cuda_gdn_plan *p, const qd_cuda_gdn_chunked_args *a, cudaStream_t st) {
    const size_t sm = wy_layout(DKP, p->dv, p->hv / p->hk).total;
    if (sm > QD_SMEM_MAX) return qd_cuda_fail(QD_ERR_INVALID_ARG, "gdn_chunked: too many value heads per key head");
    qd_status s;
    if ((s = set_smem(gdn_wy_kernel<DKP>, sm))) return s;
    gdn_wy_kernel<DKP><<<dim3(p->n_chunks, p->hk), WY_NT, sm, st>>>(
        p->d_chunks, a->d_q, a->q_stride, a->d_k, a->k_stride, a->d_v, a->v_stride, a->d_g, a->d_beta, p->d_w,
        p->d_u, p->d_vnew, p->d_gc, p->d_h, p->hk, p->hv, p->dk, p->dv);
    QD_CUDA_CHECK_LAUNCH("gdn_wy_kernel");
    return QD_OK;
}

template <int DKP, int NW>
static qd_status launch_walk(const qd_cuda_gdn_plan *p, const qd_cuda_gdn_chunked_args *a, cudaStream_t st) {
    using C = walk_cfg<DKP, NW>;
    qd_status s;
    if ((s = set_smem(gdn_walk_kernel<DKP, NW>, C::SMEM))) return s;
    const int npanel = p->dv / 16;
    gdn_walk_kernel<DKP, NW><<<dim3((npanel + NW - 1) / NW, p->hv, p->n_seq), NW * 32, C::SMEM, st>>>(
        p->d_seqs, p->d_h, p->d_w, p->d_u, p->d_vnew, p->d_gc, a->d_state0, a->d_state1, a->d_slot, a->d_o, p->hk,
        p->hv, p->dk, p->dv);
    QD_CUDA_CHECK_LAUNCH("gdn_walk_kernel");
    return QD_OK;
}

/* 16-column state tiles (one warp each) per walk block, by how many tiles there are
 * in all. A walk block holds one SM (its stage ring takes the shared memory), and
 * its time is the sequence's chunk count times one step, nearly the same for 2 to 8
 * warps. So while the tiles fit one wave of 2-warp blocks, 2 (most SMs busy); past
 * that, wider blocks mean fewer waves. H200, HK=16 HV=32 d=128, walk ms by warps
 * 2 / 4 / 8: 1x32768 0.913 / 0.958 / 1.485, 8x4096 0.951 / 0.510 / 0.403. The
 * choice changes no result bit: a tile's arithmetic is the same in every block shape. */
extern "C" int qd_cuda_gdn_walk_tiles(const qd_cuda_gdn_plan *p) {
    const int sms = qd_cuda_sm_count();
    const long tiles = (long)p->n_seq * p->hv * (p->dv / 16);
    if (tiles <= 2L * sms) return 2;
    if (tiles <= 4L * sms) return 4;
    return 8;
}

template <int DKP>
static qd_status launch_walk_nw(const qd_cuda_gdn_plan *p, const qd_cuda_gdn_chunked_args *a, cudaStream_t st) {
    switch (a->walk_tiles ? a->walk_tiles : qd_cuda_gdn_walk_tiles(p)) {
    case 2: return launch_walk<DKP, 2>(p, a, st);
    case 4: return launch_walk<DKP, 4>(p, a, st);
    default: return launch_walk<DKP, 8>(p, a, st);
    }
}

static int aligned16(const void *p) { return ((uintptr_t)p & 15) == 0; }

/* stage_mask: 1 = wy, 2 = walk (which also writes the outputs); 4 names the
 * old separate output pass and is now part of 2. */
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
    if (a->walk_tiles && a->walk_tiles != 2 && a->walk_tiles != 4 && a->walk_tiles != 8)
        return qd_cuda_fail(QD_ERR_INVALID_ARG, "gdn_chunked: walk_tiles must be 0, 2, 4 or 8");
    if (p->n_chunks == 0 && !a->d_state1) return QD_OK;
    cudaStream_t st = (cudaStream_t)stream;
    const int dkp = dk_padded(dk);
    qd_status s;
    if (p->n_chunks > 0 && (mask & 1)) {
        s = dkp == 64 ? launch_wy<64>(p, a, st) : dkp == 128 ? launch_wy<128>(p, a, st) : launch_wy<256>(p, a, st);
        if (s) return s;
    }
    if (mask & 2) {
        s = dkp == 64    ? launch_walk_nw<64>(p, a, st)
            : dkp == 128 ? launch_walk_nw<128>(p, a, st)
                         : launch_walk_nw<256>(p, a, st);
        if (s) return s;
    }
    return QD_OK;
}

extern "C" qd_status qd_cuda_gdn_chunked(const qd_cuda_gdn_plan *p, const qd_cuda_gdn_chunked_args *a,
                                         void *stream) {
    return qd_cuda_gdn_chunked_stages(p, a, stream, 7);
}
