/* The quantized family of the MoE decode kernels (moe_decode.cu): FP8, INT4 and NVFP4
 * experts whose weights land in shared memory by bulk asynchronous copies. */
#include "backend/cuda/cuda_bulk.cuh"
#include "backend/cuda/moe_decode.cuh"

/* A warp's weight stream: rows 0 .. nrows - 1 (of R) of rb bytes each, row r at
 * src + r gap, cut into chunks of sb bytes, through nst (1 or 2) shared stages of R x sb
 * bytes (stage s, row r at buf + (s R + r) sb) with one mbarrier each. Use j of the
 * stream is chunk c = j % nch of pass j / nch; the callers pass both, so that no use
 * costs a division. With nch <= nst every chunk stays resident and later passes read
 * them again without a copy. Lane 0 issues; rows past nrows are not copied (their
 * products are not used). Rows that follow each other in memory (gap == rb: the down
 * kernel's) in one chunk land with one copy, at stride rb in the stage: a copy's issue
 * costs the warp dozens of instructions. */
static_assert(GU_NST <= 2 && DN_NST <= 2, "wstream's stage and parity of a use are its low bits");
template <int R> struct wstream {
    const uint8_t *src;
    int64_t gap;
    int nrows;
    uint8_t *buf;
    uint64_t *bar;
    int rb, sb, nch, nst;
    __device__ bool resident() const { return nch <= nst; }
    __device__ bool one_copy() const { return nch == 1 && gap == rb; }
    /* 16-byte pieces from one row of a stage to the next */
    __device__ int row_pieces() const { return (one_copy() ? rb : sb) >> 4; }
    __device__ void init() {
        if ((threadIdx.x & 31) == 0) {
            for (int s = 0; s < nst; s++) qd_mbar_init(bar + s, 1);
            qd_mbar_fence_init();
        }
        __syncwarp();
    }
    __device__ void issue(int j, int c, uint64_t policy) {
        if ((threadIdx.x & 31) != 0) return;
        const int s = j & (nst - 1);
        if (one_copy()) { /* the stream's only use: no stage to hand back */
            qd_mbar_expect(bar + s, (unsigned)(nrows * rb));
            if (nrows) qd_bulk_load(buf + (size_t)s * R * sb, src, (unsigned)(nrows * rb), bar + s, policy);
            return;
        }
        const unsigned bytes = (unsigned)min(sb, rb - c * sb);
        if (j >= nst) qd_fence_proxy_async(); /* the warp's reads of the stage's last use come first */
        qd_mbar_expect(bar + s, (unsigned)nrows * bytes);
#pragma unroll
        for (int r = 0; r < R; r++)
            if (r < nrows)
                qd_bulk_load(buf + (size_t)(s * R + r) * sb, src + r * gap + (size_t)c * sb, bytes, bar + s, policy);
    }
    /* The first uses of the stream (pass 0). */
    __device__ void start(uint64_t policy) {
        for (int j = 0; j < min(nst, nch); j++) issue(j, j, policy);
    }
    /* Row r of use j (chunk c) once it has landed. */
    __device__ const uint4 *wait(int j, int c) {
        const int s = resident() ? c : j & (nst - 1);
        qd_mbar_wait(bar + s, resident() ? 0u : (unsigned)((j >> (nst - 1)) & 1));
        return (const uint4 *)(buf + (size_t)s * R * sb);
    }
    /* After the warp has read use j (chunk c): refill its stage with use j + nst when the
     * stream has it (not resident: nch > nst, so its chunk wraps at most once). */
    __device__ void done(int j, int c, int uses, uint64_t policy) {
        if (resident() || j + nst >= uses) return;
        __syncwarp();
        const int cn = c + nst;
        issue(j + nst, cn >= nch ? cn - nch : cn, policy);
    }
};

/* Blocks per SM each instance is built for: with one token a pass (batch 1, the
 * latency case) few accumulators, so 5 blocks: the whole grid of a 35B-A3B layer in
 * one wave; with 4 tokens a pass 3 (gate_up) and 4 (down), as registers allow. */
template <int TG> constexpr int gu_min_blocks() { return TG == 1 ? 5 : 3; }
template <int TG> constexpr int dn_min_blocks() { return TG == 1 ? 5 : 4; }

/* TG: tokens a pass at most (1 or GU_TG); tg: the call's, min(n, TG) */
template <class WF, int TG>
__global__ void __launch_bounds__(GU_NT, gu_min_blocks<TG>())
moe_gate_up_quant(const __grid_constant__ qd_moe_qw qw, const uint16_t *__restrict__ x, const int32_t *sel,
                  float *__restrict__ act, int32_t *__restrict__ counters, int n_ctr, int P, int H, int I, int E,
                  int k, int Is, float *__restrict__ sh_act, int tg, int sb, int nst) {
    /* [GU_WARPS][nst][2][sb] each warp's weight stages (gate row, up row), then
     * [tg][H / 8] the pass's token rows, bf16, in load_pass_x's order for PC (no expert
     * of a token's own choosing comes twice, so passes of min(n, TG) are rarely cut short) */
    extern __shared__ __align__(128) uint8_t gsm[];
    __shared__ uint64_t bars[GU_WARPS][GU_NST];
    __shared__ int list[QD_MOE_DECODE_MAX_PAIRS];
    __shared__ int wcnt[GU_WARPS];
    const int p = blockIdx.y, tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int i = blockIdx.x * GU_WARPS + warp; /* I, Is % 8 == 0: a block's warps all have rows or none */
    const bool shared = p >= P;                 /* the block rows after the pairs (with a shared expert) */
    const int rows = shared ? Is : I;
    constexpr int U = stage_bytes(GU_SB, WF::DTYPE) / 16 / 32; /* pieces a lane takes from a full stage */
    constexpr int PC = WF::COLS / 8;        /* x's 16-byte pieces (8 bf16) per weight piece */
    constexpr int SUBC = WF::COLS / WF::NSUB;
    const int H8 = H >> 3, NP = H / WF::COLS; /* H % WF::COLS == 0 for the quantized layouts (moe.cu) */
    const int PPS = sb >> 4;                  /* pieces of a row in one stage */
    wstream<2> ws;
    ws.src = NULL; /* set with the rows, once known */
    ws.gap = 0;
    ws.nrows = 0;
    ws.buf = gsm + (size_t)warp * nst * 2 * sb;
    ws.bar = bars[warp];
    ws.rb = NP * 16;
    ws.sb = sb;
    ws.nch = (ws.rb + sb - 1) / sb;
    ws.nst = nst;
    ws.init();
    const uint64_t policy = qd_l2_evict_first();
    qf_row rg = {}, ru = {};
    bool ok = false;
    /* The weights before anything else: the long-latency traffic. The shared
     * expert's are known before the routing, so before the wait. */
    if (shared && blockIdx.x * GU_WARPS < Is) {
        ok = true;
        rg = qf_row_of(qw.sh_gate_up, 0, i);
        ru = qf_row_of(qw.sh_gate_up, 1, i);
        ws.src = rg.q;
        ws.gap = ru.q - rg.q;
        ws.nrows = 2;
        ws.start(policy);
    }
    gate_up_begin(counters, n_ctr, p, k, shared);
    if (blockIdx.x * GU_WARPS >= rows) return; /* the grid covers the wider of I and Is */
    int m;
    if (shared) {
        m = group_tokens<TG>(P / k, p - P, list);
    } else {
        const int e = __ldcg(sel + p);
        if (not_owner<TG>(sel, p, e)) return;
        ok = e >= 0 && e < E; /* an id out of range gives zeros */
        if (ok) {
            rg = qf_row_of(qw.gate_up, 2 * e, i);
            ru = qf_row_of(qw.gate_up, 2 * e + 1, i);
            ws.src = rg.q;
            ws.gap = ru.q - rg.q;
            ws.nrows = 2;
            ws.start(policy);
        }
        m = pairs_of_block<TG>(sel, p, P, e, list, wcnt);
    }
    /* One token (TG == 1, n = 1): one pass of one entry. Knowing it, ptxas fits this
     * instance's main loop in registers (with group_tokens' count it spills). */
    if (TG == 1) m = tg = 1;
    const pass_entries<TG> pe(list, shared, p, k);
    float *const ap = shared ? sh_act : act; /* [entry][rows] */
    uint4 *xs = (uint4 *)(gsm + (size_t)GU_WARPS * nst * 2 * sb);
    const int uses = (TG == 1 ? m : (m + tg - 1) / tg) * ws.nch;
    for (int g0 = 0, j0 = 0; g0 < m; g0 += tg, j0 += ws.nch) {
        const int gs = min(tg, m - g0);
        if (g0) __syncthreads(); /* the previous pass is done with xs */
        load_pass_x<PC>(xs, x, pe, g0, gs, H8);
        float ag[TG], au[TG];
#pragma unroll
        for (int tt = 0; tt < TG; tt++) ag[tt] = au[tt] = 0.0f;
        for (int c = 0; ok && c < ws.nch; c++) {
            const int j = j0 + c;
            /* the chunk's scales are read while its weights land */
            float sg[U][WF::NSUB], su[U][WF::NSUB];
            int zg[U], zu[U];
#pragma unroll
            for (int uu = 0; uu < U; uu++) {
                const int b = c * PPS + uu * 32 + lane, c0 = b * WF::COLS;
                const bool in = uu * 32 + lane < PPS && b < NP;
                zg[uu] = in ? WF::zero(rg, c0) : 0;
                zu[uu] = in ? WF::zero(ru, c0) : 0;
#pragma unroll
                for (int s = 0; s < WF::NSUB; s++) {
                    sg[uu][s] = in ? WF::scale(rg, c0, s) * WF::post(rg) : 0.0f;
                    su[uu][s] = in ? WF::scale(ru, c0, s) * WF::post(ru) : 0.0f;
                }
            }
            const uint4 *wgs = ws.wait(j, c), *wus = wgs + PPS;
#pragma unroll
            for (int uu = 0; uu < U; uu++) {
                const int bl = uu * 32 + lane, b = c * PPS + bl;
                if (bl >= PPS || b >= NP) continue;
                const uint4 gv = wgs[bl], uv = wus[bl];
                /* partial sums per scale block, then the scale */
#pragma unroll
                for (int s = 0; s < WF::NSUB; s++) {
                    float dg[TG], du[TG];
#pragma unroll
                    for (int tt = 0; tt < TG; tt++) dg[tt] = du[tt] = 0.0f;
#pragma unroll
                    for (int q8 = s * (SUBC / 8); q8 < (s + 1) * (SUBC / 8); q8++) {
                        float gf[8], uf[8];
                        WF::decode8(gv, q8, zg[uu], gf);
                        WF::decode8(uv, q8, zu[uu], uf);
#pragma unroll
                        for (int tt = 0; tt < TG; tt++) {
                            if (tt < gs) {
                                float xf[8];
                                bf16x8(xs[tt * H8 + q8 * NP + b], xf);
#pragma unroll
                                for (int q = 0; q < 8; q++) {
                                    dg[tt] = fmaf(gf[q], xf[q], dg[tt]);
                                    du[tt] = fmaf(uf[q], xf[q], du[tt]);
                                }
                            }
                        }
                    }
#pragma unroll
                    for (int tt = 0; tt < TG; tt++) {
                        ag[tt] = fmaf(sg[uu][s], dg[tt], ag[tt]);
                        au[tt] = fmaf(su[uu][s], du[tt], au[tt]);
                    }
                }
            }
            ws.done(j, c, uses, policy);
        }
        store_act(ag, au, gs, pe, g0, ap, rows, i);
    }
}

template <class WF, int TG>
__global__ void __launch_bounds__(DN_NT, dn_min_blocks<TG>())
moe_down_quant(const __grid_constant__ qd_moe_qw qw, const int32_t *sel, const float *act, float *out, int P, int I,
               int E, int Is, const float *sh_act, float *sh_out, const __grid_constant__ dn_combine cb, int tg,
               int sb, int nst) {
    /* [DN_WARPS][nst][DN_R][sb] each warp's weight stages, then [tg][max(I, Is) / 4]
     * the pass's activations in load_pass_act's order for AF */
    extern __shared__ __align__(128) uint8_t dsm[];
    __shared__ uint64_t bars[DN_WARPS][DN_NST];
    __shared__ int list[QD_MOE_DECODE_MAX_PAIRS];
    __shared__ int wcnt[DN_WARPS];
    __shared__ int last[DN_TG];
    const int p = blockIdx.y, tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const bool shared = p >= P; /* only with the shared expert */
    const int H = cb.H, k = cb.k;
    int e = 0;
    if (!shared) {
        e = __ldcg(sel + p);
        if (not_owner<TG>(sel, p, e)) return;
    }
    const bool ok = shared || (e >= 0 && e < E);
    constexpr int U = stage_bytes(DN_SB, WF::DTYPE) / 16 / 32; /* pieces a lane takes from a full stage */
    constexpr int SUBC = WF::COLS / WF::NSUB;
    const int Ir = shared ? Is : I;
    constexpr int AF = WF::COLS / 4;            /* float4 of activations per weight piece */
    const int I4 = Ir >> 2, NP = Ir / WF::COLS; /* pieces per row */
    const int PPS = sb >> 4;
    const int h0 = blockIdx.x * QD_MOE_DN_ROWS + warp * DN_R;
    const qd_cuda_qmats &qm = shared ? qw.sh_down : qw.down;
    const int64_t qmat = shared ? 0 : (ok ? e : 0);
    const uint8_t *wd = qm.data + (qmat * qm.rows + h0) * qm.row_bytes;
    wstream<DN_R> ws;
    ws.buf = dsm + (size_t)warp * nst * DN_R * sb;
    ws.bar = bars[warp];
    ws.rb = NP * 16;
    ws.sb = sb;
    ws.nch = (ws.rb + sb - 1) / sb;
    ws.nst = nst;
    ws.src = wd;
    ws.gap = qm.row_bytes; /* == rb: a warp's rows follow each other */
    ws.nrows = ok ? max(0, min(DN_R, H - h0)) : 0;
    ws.init();
    const uint64_t policy = qd_l2_evict_first();
    ws.start(policy);
    const int m = shared ? group_tokens<TG>(P / k, p - P, list) : pairs_of_block<TG>(sel, p, P, e, list, wcnt);
    /* From here on the activations of gate_up are needed (and the counters it reset). Unlike
     * moe_down_bf16 this kernel does not let the next launch start early: on an H100 that cost
     * FP8 decode 1.4% where it gave bf16 2.5% (bench/RESULTS.md, session 48). */
    qd_pdl_wait();
    const pass_entries<TG> pe(list, shared, p, k);
    const float *const ap = shared ? sh_act : act;
    float *const op = shared ? sh_out : out;
    float4 *as4 = (float4 *)(dsm + (size_t)DN_WARPS * nst * DN_R * sb);
    const int uses = (TG == 1 ? m : (m + tg - 1) / tg) * ws.nch;
    for (int g0 = 0, j0 = 0; g0 < m; g0 += tg, j0 += ws.nch) {
        const int gs = min(tg, m - g0);
        if (g0) __syncthreads();
        load_pass_act<AF>(as4, ap, pe, g0, gs, Ir);
        float acc[DN_R][TG];
#pragma unroll
        for (int r = 0; r < DN_R; r++)
#pragma unroll
            for (int tt = 0; tt < TG; tt++) acc[r][tt] = 0.0f;
        for (int c = 0; ok && c < ws.nch; c++) {
            const int j = j0 + c;
            const uint4 *wsm = ws.wait(j, c);
            const int RS = ws.row_pieces();
#pragma unroll
            for (int uu = 0; uu < U; uu++) {
                const int bl = uu * 32 + lane, b = c * PPS + bl;
                if (bl >= PPS || b >= NP) continue;
                const int c0 = b * WF::COLS;
#pragma unroll
                for (int r = 0; r < DN_R; r++) { /* partial sums per scale block, then the scale */
                    const qf_row row = qf_row_of(qm, qmat, h0 + r < H ? h0 + r : 0);
                    const int z = WF::zero(row, c0);
                    const uint4 wv = wsm[r * RS + bl];
#pragma unroll
                    for (int s = 0; s < WF::NSUB; s++) {
                        float d[TG];
#pragma unroll
                        for (int tt = 0; tt < TG; tt++) d[tt] = 0.0f;
#pragma unroll
                        for (int q8 = s * (SUBC / 8); q8 < (s + 1) * (SUBC / 8); q8++) {
                            float wf[8];
                            WF::decode8(wv, q8, z, wf);
#pragma unroll
                            for (int tt = 0; tt < TG; tt++) {
                                if (tt < gs) {
                                    const float4 a0 = as4[tt * I4 + (2 * q8) * NP + b];
                                    const float4 a1 = as4[tt * I4 + (2 * q8 + 1) * NP + b];
                                    const float af[8] = {a0.x, a0.y, a0.z, a0.w, a1.x, a1.y, a1.z, a1.w};
#pragma unroll
                                    for (int q = 0; q < 8; q++) d[tt] = fmaf(wf[q], af[q], d[tt]);
                                }
                            }
                        }
                        const float sc = WF::scale(row, c0, s) * WF::post(row);
#pragma unroll
                        for (int tt = 0; tt < TG; tt++) acc[r][tt] = fmaf(sc, d[tt], acc[r][tt]);
                    }
                }
            }
            ws.done(j, c, uses, policy);
        }
        finish_down_pass(acc, gs, pe, g0, op, h0, last, cb);
    }
}

template <class WF, int TG>
static qd_status launch_quant(const qd_cuda_moe_args *a, const qd_moe_work *w, const qd_moe_shared *sh,
                              const qd_moe_qw &qw, const decode_shape *d, int pdl, cudaStream_t s) {
    const decode_call c = decode_call_of(a, w, sh);
    QD_CUDA_TRY(set_smem(moe_gate_up_quant<WF, TG>, d->gu_smem, 1));
    QD_CUDA_TRY(set_smem(moe_down_quant<WF, TG>, d->dn_smem, 1));
    qd_status st = qd_launch_pdl(pdl, moe_gate_up_quant<WF, TG>, c.grid_gu, dim3(GU_NT), d->gu_smem, s, qw, a->d_x,
                                 a->d_sel, w->act, w->counters, c.n_ctr, c.P, a->H, a->I, a->E, a->k, c.Is,
                                 c.has_sh ? sh->act : (float *)NULL, d->tg, d->gu_sb, d->gu_nst);
    if (st) return st;
    return qd_launch_pdl(1, moe_down_quant<WF, TG>, c.grid_dn, dim3(DN_NT), d->dn_smem, s, qw, a->d_sel,
                         (const float *)w->act, w->out, c.P, a->I, a->E, c.Is,
                         c.has_sh ? (const float *)sh->act : (const float *)NULL, c.has_sh ? sh->out : (float *)NULL,
                         c.cb, d->tg, d->dn_sb, d->dn_nst);
}

/* The instance for the call's pass size. */
template <class WF>
static qd_status launch_format(const qd_cuda_moe_args *a, const qd_moe_work *w, const qd_moe_shared *sh,
                               const qd_moe_qw &qw, const decode_shape *d, int pdl, cudaStream_t s) {
    return d->tg == 1 ? launch_quant<WF, 1>(a, w, sh, qw, d, pdl, s) : launch_quant<WF, GU_TG>(a, w, sh, qw, d, pdl, s);
}

qd_status qd_moe_decode_quant(const qd_cuda_moe_args *a, const qd_moe_work *w, const qd_moe_shared *sh,
                              const decode_shape *d, int pdl, cudaStream_t s) {
    qd_moe_qw qw = {};
    qw.gate_up = *a->q_gate_up;
    qw.down = *a->q_down;
    if (sh && sh->q_gate_up) {
        qw.sh_gate_up = *sh->q_gate_up;
        qw.sh_down = *sh->q_down;
    }
    switch (a->q_gate_up->dtype) {
    case QD_DTYPE_F8_E4M3: return launch_format<qf_f8>(a, w, sh, qw, d, pdl, s);
    case QD_DTYPE_INT4: return launch_format<qf_int4>(a, w, sh, qw, d, pdl, s);
    default: return launch_format<qf_nvfp4>(a, w, sh, qw, d, pdl, s);
    }
}
