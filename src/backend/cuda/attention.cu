/* Gated attention, step 2 (spec 5.2): causal GQA attention of every query row
 * over its sequence's paged bf16 KV cache, softmax in fp32, output gate,
 * bf16 output. Three kernels, all on the tensor cores (mma.sync m16n8k16, bf16
 * operands, fp32 accumulation), chosen by the table in qd_cuda_attn (here, with
 * the decode and combine kernels; prefill in attention_prefill.cu, span in
 * attention_span.cu, what they share in attention.cuh):
 *
 *   prefill  flash-attention style: a block owns 64 consecutive query rows of
 *            one span and one query head (16 rows per warp) and walks the keys
 *            0..last row's position in tiles of 64 with an online softmax; the
 *            diagonal tiles are masked causally.
 *   decode   split-K (flash-decoding) for spans of at most ATT_DEC_ROWS rows: a
 *            block owns one row, the (up to 16) query heads of one kv head as
 *            the 16 rows of the mma, and one slice of the context; the 4 warps
 *            take interleaved 16-key pieces of each 64-key tile and are merged
 *            at the end. Slices of one row are combined by a second kernel
 *            (partials in d_work) unless a single slice covers the context.
 *   span     batch-invariant mode only, spans of more than
 *            QD_CUDA_ATTN_INV_SPAN_ROWS rows: the decode kernel's arithmetic
 *            with (row, head) pairs of many rows as the mma's A rows (below).
 *
 * Table: a batch whose spans all have at most ATT_DEC_ROWS rows runs the decode
 * kernels only; a single longer span runs the prefill kernel only; a batch with
 * several spans, one of them longer, runs both, each skipping the other's spans.
 *
 * Batch-invariant mode (args.invariant): every row runs the decode kernels'
 * arithmetic, whatever its span, with a slice plan that depends on max_ctx
 * alone (invariant_plan), so that a row's bits depend only on its query and
 * its keys: not on the batch, its span or where its prompt was cut. Rows of
 * spans longer than QD_CUDA_ATTN_INV_SPAN_ROWS go through the span kernel,
 * which runs that same per-(row, head) instruction sequence with (row, head)
 * pairs of many rows as the A rows of one mma, sharing each K/V tile among
 * 32 pairs instead of one row's heads; the others through the decode kernel.
 * Large batches go through in groups of rows, one (decode, span, combine)
 * launch set each, so that the split-K scratch stays bounded. The combine
 * sums a row's slices in one fixed order in both modes (no float atomics),
 * so results never vary from run to run.
 *
 * Every grid depends only on host-side shapes; the decode grids only on n_rows
 * and max_ctx, so a decode step can be captured in a CUDA graph. Blocks whose
 * slice or tile lies past a row's length exit at once. Limits beyond the
 * header's: max_ctx < 2^24, d_work 16-byte aligned (cudaMalloc is).
 *
 * Queries arrive pre-scaled by hd^-0.5 (attention_prep.cu); scores are moved to
 * base 2 (times log2 e) so that the softmax uses exp2. Head dims that are not
 * a power of two run in the next larger instantiation with zero-filled padding. */
#include "backend/cuda/attention.cuh"
#include "backend/cuda/cuda_pdl.cuh"

/* Block (row, kv head x group of 16 query heads, context slice). K/V tiles go
 * through a DEC_STAGES-deep cp.async ring (two tiles in flight while one is
 * computed: a block alone must keep enough bytes in flight to approach the
 * memory bandwidth); warp w takes keys 16w..16w+15 of each tile. */
template <int HDP>
__global__ void __launch_bounds__(ATT_THREADS) attn_decode_kernel(attn_params p, int mixed) {
    constexpr int LDS = HDP + 8;
    constexpr int NT = HDP / 8;
    extern __shared__ __align__(16) uint16_t smem[];
    uint16_t *sQ = smem, *sK = sQ + 16 * LDS, *sV = sK + DEC_STAGES * ATT_TILE * LDS;
    const int r = p.row0 + blockIdx.x, sl = blockIdx.z;
    const int G = p.nq / p.nkv, hg = (G + 15) / 16;
    const int kvh = blockIdx.y / hg, h0 = kvh * G + (blockIdx.y % hg) * 16;
    const int nh = min(16, kvh * G + G - h0);
    /* the step's row map (copied in before its first kernel) before the wait: its reads
     * are then off the chain that starts with q */
    const int n_keys = p.row_pos[r] + 1;
    const int32_t *bt = p.block_tables + (long long)p.row_slot[r] * p.mbps;
    qd_pdl_wait(); /* q and this step's keys and values come from the previous kernel */
    qd_pdl_trigger();

    if (mixed && !row_in_short_span(p.spans, p.n_spans, p.short_rows, r)) return;
    const int k0 = sl * p.split_len;
    if (k0 >= n_keys) return;
    /* the last slice takes any remainder, should a position exceed max_ctx */
    const int k1 = sl == p.nsp - 1 ? n_keys : min(k0 + p.split_len, n_keys);
    const int n_kt = (k1 - k0 + ATT_TILE - 1) / ATT_TILE;
    const int w = threadIdx.x / 32;

    load_rows<HDP, 16>(sQ, p.q + ((long long)r * p.nq + h0) * p.hd, p.hd, nh, p.hd);
    /* key tile t into ring buffer b */
    auto load = [&](int b, int t) {
        load_kv_tile<HDP, true>(sK + b * ATT_TILE * LDS, sV + b * ATT_TILE * LDS, p.kc, p.vc, bt, k0 + t * ATT_TILE,
                                k1, kvh, p);
    };
    qd_cp_async_prologue<DEC_STAGES>(load, n_kt);

    float o[NT][4];
#pragma unroll
    for (int n = 0; n < NT; n++) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
    float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.f, l1 = 0.f;

    for (int t = 0; t < n_kt; t++) {
        qd_cp_async_wait<DEC_STAGES - 2>();
        __syncthreads(); /* tile t visible; every warp is done with tile t-1, whose buffer is refilled now */
        {
            const int tn = t + DEC_STAGES - 1, bn = tn % DEC_STAGES;
            if (tn < n_kt) load(bn, tn);
            qd_cp_async_commit();
        }
        const int buf = t % DEC_STAGES;
        const int kb = k0 + t * ATT_TILE + w * 16; /* first key of this warp's piece */
        if (kb < k1)
            piece_step<HDP, 1>(sQ, sK + (buf * ATT_TILE + w * 16) * LDS, sV + (buf * ATT_TILE + w * 16) * LDS, kb,
                               k1, k1, 0, o, m0, m1, l0, l1);
    }
    qd_cp_async_wait<0>(); /* only empty groups can remain; drained before the buffers are reused */
    __syncthreads();

    /* Merge the 4 warps. Q's buffer holds the statistics, the K ring the accumulators. */
    float *stat = reinterpret_cast<float *>(sQ);
    float *wm = stat, *wl = stat + 64, *wf = stat + 128, *rowm = stat + 192, *rowl = stat + 208;
    warp_state_store<HDP, 1>(wm, wl, reinterpret_cast<float *>(sK) + w * 16 * HDP, w, 0, o, m0, m1, l0, l1);
    __syncthreads();
    if (threadIdx.x < 64) merge_weights(wm, wl, wf, rowm, rowl, threadIdx.x / 16, threadIdx.x % 16);
    __syncthreads();
    const float *acc = reinterpret_cast<const float *>(sK);
    /* element (head i, dimension d) = threadIdx.x, + ATT_THREADS, ... */
    for (qd_walk e(threadIdx.x, p.hd); e.t < nh; e.next(ATT_THREADS, p.hd))
        merge_store<HDP>(p, wf, acc, rowm, rowl, e.t, e.c, r, h0 + e.t, sl);
}

/* Block (row, query head): merges the row's slices, normalises, gates. The
 * slices' vectors are summed by ng = COMB_THREADS / (hd/4) groups of threads,
 * each reading float4s, so that many loads are in flight even for one row;
 * group j takes slices j, j+ng, ... in order and the groups' sums are added
 * in group order: one fixed summation order for a given (hd, slice count),
 * whatever the batch and the run. */
#define COMB_THREADS 256
__global__ void __launch_bounds__(COMB_THREADS) attn_combine_kernel(attn_params p, int mixed) {
    extern __shared__ float wts[]; /* [nsp rounded up to 4] slice weights */
    __shared__ __align__(16) float part[COMB_THREADS * 4]; /* [ng][hd] group sums (ng * hd <= 4 * COMB_THREADS) */
    __shared__ float red[2][COMB_THREADS / 32];
    qd_pdl_wait(); /* the slices come from the decode kernel */
    qd_pdl_trigger();
    const int r = p.row0 + blockIdx.x, h = blockIdx.y, hd = p.hd;
    if (mixed && !row_in_short_span(p.spans, p.n_spans, p.short_rows, r)) return;
    const int n_keys = p.row_pos[r] + 1;
    const int ns = min((n_keys + p.split_len - 1) / p.split_len, p.nsp);
    const long long base = ((long long)blockIdx.x * p.nq + h) * p.nsp;
    const float *wo = p.work + base * hd;
    const float *wml = p.work + (long long)p.work_rows * p.nq * p.nsp * hd + 2 * base;
    const int lane = threadIdx.x % 32, wid = threadIdx.x / 32;
    float M = -INFINITY;
    for (int i = threadIdx.x; i < ns; i += COMB_THREADS) M = fmaxf(M, wml[2 * i]);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) M = fmaxf(M, __shfl_xor_sync(0xffffffffu, M, o));
    if (lane == 0) red[0][wid] = M;
    __syncthreads();
    M = red[0][0];
#pragma unroll
    for (int x = 1; x < COMB_THREADS / 32; x++) M = fmaxf(M, red[0][x]);
    float L = 0.f;
    for (int i = threadIdx.x; i < ns; i += COMB_THREADS) {
        const float f = exp2f(wml[2 * i] - M);
        wts[i] = f;
        L += wml[2 * i + 1] * f;
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) L += __shfl_xor_sync(0xffffffffu, L, o);
    if (lane == 0) red[1][wid] = L;
    __syncthreads();
    L = 0.f;
#pragma unroll
    for (int x = 0; x < COMB_THREADS / 32; x++) L += red[1][x];

    const int tpv = hd / 4, ng = COMB_THREADS / tpv; /* threads per vector, vector groups */
    const int grp = threadIdx.x / tpv, c = threadIdx.x % tpv;
    if (grp < ng) {
        float4 a = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll 4
        for (int i = grp; i < ns; i += ng) {
            const float4 x = *(const float4 *)(wo + (long long)i * hd + 4 * c);
            const float f = wts[i];
            a.x += f * x.x;
            a.y += f * x.y;
            a.z += f * x.z;
            a.w += f * x.w;
        }
        *(float4 *)(part + grp * hd + 4 * c) = a;
    }
    __syncthreads();
    const float inv = 1.0f / L;
    const long long rh = (long long)r * p.nq + h;
    for (int d = threadIdx.x; d < hd; d += COMB_THREADS) {
        float acc = part[d];
        for (int x = 1; x < ng; x++) acc += part[x * hd + d];
        float v = acc * inv;
        if (p.gated) v *= sigmoidf_(p.qg[rh * 2 * hd + hd + d]);
        p.out[rh * hd + d] = qd_f2bf(v);
    }
}

/* ------------------------------------------------------------- launchers */

/* The decode table: context slices per row so that rows x slices is about
 * ATT_SPLIT_TARGET, slices of at least ATT_MIN_SPLIT keys (a multiple of the
 * tile). Depends on n_rows and max_ctx only. One slice covers any length. */
static void split_plan(int n_rows, int max_ctx, int *split_len, int *nsp) {
    if (max_ctx < 1) max_ctx = 1;
    int cap = (max_ctx + ATT_MIN_SPLIT - 1) / ATT_MIN_SPLIT;
    if (cap > ATT_MAX_SPLITS) cap = ATT_MAX_SPLITS;
    int want = (ATT_SPLIT_TARGET + n_rows - 1) / (n_rows > 0 ? n_rows : 1);
    int n = want < cap ? want : cap;
    if (n <= 1) {
        *split_len = 1 << 30;
        *nsp = 1;
        return;
    }
    int len = (max_ctx + n - 1) / n;
    len = (len + ATT_TILE - 1) / ATT_TILE * ATT_TILE;
    *split_len = len;
    *nsp = (max_ctx + len - 1) / len;
    if (*nsp <= 1) {
        *split_len = 1 << 30;
        *nsp = 1;
    }
}

/* The invariant mode's table, a function of max_ctx alone: at most
 * ATT_INV_SLICES slices of max(ATT_MIN_SPLIT, max_ctx / ATT_INV_SLICES rounded
 * up to the tile) keys. Slice k of every row is then keys [k len, (k+1) len)
 * of its sequence, so its partial, and the combine over the row's slices,
 * depend only on the row's query and keys. Sixteen slices: a single decode
 * row still spreads over 16 x nkv blocks, while a prefill row of a long
 * prompt pays the per-block overhead (query load, pipeline fill, warp merge,
 * partial store) and the partials' traffic for 16 slices at most; slices of
 * at least 2 tiles keep that overhead below the keys' own cost at short
 * contexts. The same plan as split_plan's for 32 rows at 4k context. */
static void invariant_plan(int max_ctx, int *split_len, int *nsp) {
    if (max_ctx < 1) max_ctx = 1;
    int len = (max_ctx + ATT_INV_SLICES - 1) / ATT_INV_SLICES;
    len = (len + ATT_TILE - 1) / ATT_TILE * ATT_TILE;
    if (len < ATT_MIN_SPLIT) len = ATT_MIN_SPLIT;
    *split_len = len;
    *nsp = (max_ctx + len - 1) / len;
    if (*nsp <= 1) {
        *split_len = 1 << 30;
        *nsp = 1;
    }
}

/* Invariant mode: rows per (decode, combine) launch pair, so that the scratch
 * holds at most ATT_INV_PAIRS (row, slice) partials; every row in one launch
 * when a single slice is written directly. Rows are independent, so the
 * grouping never changes a result. */
static int invariant_group_rows(int nsp) { return nsp > 1 ? ATT_INV_PAIRS / nsp : 1 << 30; }

extern "C" size_t qd_cuda_attn_work_bytes(int max_rows, int nq, int hd, int max_ctx, int invariant) {
    size_t best = 0;
    if (invariant) {
        int len, n;
        invariant_plan(max_ctx, &len, &n);
        const int R = invariant_group_rows(n);
        if (n > 1 && max_rows > 0) best = (size_t)(max_rows < R ? max_rows : R) * n;
    } else {
        for (int r = 1; r <= max_rows && r <= ATT_SPLIT_TARGET; r++) {
            int len, n;
            split_plan(r, max_ctx, &len, &n);
            if (n > 1 && (size_t)r * n > best) best = (size_t)r * n;
        }
    }
    return best * (size_t)(nq > 0 ? nq : 0) * (size_t)((hd > 0 ? hd : 0) + 2) * sizeof(float);
}

template <int HDP> static size_t decode_smem(void) {
    return (size_t)(16 + 2 * DEC_STAGES * ATT_TILE) * (HDP + 8) * 2;
}

/* Combine of rows p.row0 .. p.row0 + rows - 1 (mixed: short spans' rows only). */
static qd_status launch_combine(const attn_params &p, int rows, int mixed, cudaStream_t st) {
    if (p.nsp <= 1) return QD_OK;
    return qd_launch_pdl(1, attn_combine_kernel, dim3((unsigned)rows, (unsigned)p.nq), dim3(COMB_THREADS),
                         (size_t)((p.nsp + 3) / 4 * 4) * sizeof(float), st, p, mixed);
}

/* Decode of rows p.row0 .. p.row0 + rows - 1, then their combine unless skip_combine. */
template <int HDP>
static qd_status launch_decode(const qd_cuda_attn_args *a, const attn_params &p, int rows, int mixed,
                               int skip_combine, cudaStream_t st) {
    const size_t sm = decode_smem<HDP>();
    const int G = a->nq / a->nkv;
    const dim3 grid((unsigned)rows, (unsigned)(a->nkv * ((G + 15) / 16)), (unsigned)p.nsp);
    const qd_status s = qd_launch_pdl(1, attn_decode_kernel<HDP>, grid, dim3(ATT_THREADS), sm, st, p, mixed);
    if (s) return s;
    return skip_combine ? QD_OK : launch_combine(p, rows, mixed, st);
}

template <int HDP>
static qd_status run_attn(const qd_cuda_attn_args *a, attn_params &p, cudaStream_t st) {
    QD_CUDA_TRY(cudaFuncSetAttribute(attn_decode_kernel<HDP>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     (int)decode_smem<HDP>()));
    if (a->invariant) {
        /* Rows of spans longer than QD_CUDA_ATTN_INV_SPAN_ROWS through the span
         * kernel, the others through the decode kernel (the same bits either
         * way), in groups of rows that fit the scratch; one combine per group. */
        const int span = a->max_span_rows > QD_CUDA_ATTN_INV_SPAN_ROWS;
        if (span) {
            const qd_status s = attn_span_setup<HDP>();
            if (s != QD_OK) return s;
        }
        const int R = invariant_group_rows(p.nsp);
        p.work_rows = a->n_rows < R ? a->n_rows : R;
        p.short_rows = QD_CUDA_ATTN_INV_SPAN_ROWS;
        for (int r0 = 0; r0 < a->n_rows; r0 += R) {
            const int rows = a->n_rows - r0 < R ? a->n_rows - r0 : R;
            p.row0 = r0;
            p.row_end = r0 + rows;
            qd_status s = QD_OK;
            if (!span) {
                s = launch_decode<HDP>(a, p, rows, 0, 0, st);
            } else {
                if (a->n_spans > 1) s = launch_decode<HDP>(a, p, rows, 1, 1, st);
                if (s == QD_OK) s = attn_launch_span<HDP>(a, p, st);
                if (s == QD_OK) s = launch_combine(p, rows, 0, st);
            }
            if (s != QD_OK) return s;
        }
        return QD_OK;
    }
    p.short_rows = ATT_DEC_ROWS;
    if (a->max_span_rows <= ATT_DEC_ROWS) return launch_decode<HDP>(a, p, a->n_rows, 0, 0, st);
    /* A single span is all prefill, whatever its actual length; several spans
     * may mix: short ones go to the decode kernels, which skip the long ones. */
    const int mixed = a->n_spans > 1;
    qd_status s = attn_launch_prefill<HDP>(a, p, mixed, st);
    if (s != QD_OK || !mixed) return s;
    return launch_decode<HDP>(a, p, a->n_rows, 1, 0, st);
}

extern "C" qd_status qd_cuda_attn(const qd_cuda_attn_args *a, void *stream) {
    if (!a) return qd_cuda_fail(QD_ERR_INVALID_ARG, "qd_cuda_attn: no arguments");
    if (a->n_rows <= 0) return QD_OK;
    if (a->nq <= 0 || a->nkv <= 0 || a->nq % a->nkv || a->hd <= 0 || a->hd > 256 || a->hd % 8 ||
        a->block_size <= 0 || a->max_blocks_per_seq <= 0 || a->block_stride % 8 || a->n_spans <= 0 ||
        a->n_spans > 65535 || a->max_span_rows <= 0 || a->max_ctx <= 0 ||
        a->max_ctx >= (1 << 24) /* exact float block index, load_kv_tile */)
        return qd_cuda_fail(QD_ERR_INVALID_ARG, "qd_cuda_attn: bad shape");
    if (!a->d_qg || !a->d_row_slot || !a->d_row_pos || !a->d_spans || !a->d_block_tables || !a->d_kcache ||
        !a->d_vcache || !a->d_q || !a->d_out)
        return qd_cuda_fail(QD_ERR_INVALID_ARG, "qd_cuda_attn: null pointer");
    /* 16-byte cp.async of cache and query rows, 4-byte output pairs, 8-byte gate pairs */
    if (((uintptr_t)a->d_kcache | (uintptr_t)a->d_vcache | (uintptr_t)a->d_q) % 16 || (uintptr_t)a->d_out % 4 ||
        (uintptr_t)a->d_qg % 8)
        return qd_cuda_fail(QD_ERR_INVALID_ARG, "qd_cuda_attn: misaligned buffer");
    attn_params p;
    p.n_rows = a->n_rows; p.nq = a->nq; p.nkv = a->nkv; p.hd = a->hd; p.gated = a->gated != 0;
    p.n_spans = a->n_spans; p.qg = a->d_qg; p.row_slot = a->d_row_slot; p.row_pos = a->d_row_pos;
    p.spans = a->d_spans; p.block_tables = a->d_block_tables; p.mbps = a->max_blocks_per_seq;
    p.bs = a->block_size; p.inv_bs = 1.0f / (float)a->block_size; p.stride = (long long)a->block_stride; p.kc = a->d_kcache; p.vc = a->d_vcache;
    p.q = a->d_q; p.out = a->d_out; p.work = a->d_work;
    p.row0 = 0;
    p.row_end = a->n_rows;
    p.work_rows = a->n_rows;
    p.short_rows = ATT_DEC_ROWS;
    if (a->invariant)
        invariant_plan(a->max_ctx, &p.split_len, &p.nsp);
    else
        split_plan(a->n_rows, a->max_ctx, &p.split_len, &p.nsp);
    const int G = a->nq / a->nkv;
    if ((long long)a->nkv * ((G + 15) / 16) > 65535 || p.nsp > 65535 || (a->max_span_rows + ATT_TILE - 1) / ATT_TILE > 65535 ||
        ((long long)a->n_rows * G + SPAN_AR - 1) / SPAN_AR > 0x7fffffffLL /* span grid */)
        return qd_cuda_fail(QD_ERR_INVALID_ARG, "qd_cuda_attn: grid too large");
    if (p.nsp > 1 && (!a->d_work || (uintptr_t)a->d_work % 16))
        return qd_cuda_fail(QD_ERR_INVALID_ARG, "qd_cuda_attn: d_work missing or not 16-byte aligned");
    const cudaStream_t st = (cudaStream_t)stream;
    if (a->hd <= 32) return run_attn<32>(a, p, st);
    if (a->hd <= 64) return run_attn<64>(a, p, st);
    if (a->hd <= 128) return run_attn<128>(a, p, st);
    return run_attn<256>(a, p, st);
}
