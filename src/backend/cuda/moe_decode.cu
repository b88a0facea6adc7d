/* Decode path of the routed experts: a few tokens, so two GEMV kernels bound
 * by reading the expert weights (3 I H bf16 per active expert).
 *
 *   gate_up: block (8 rows i, pair p). act[q][i] = silu(gate_i . x) * (up_i . x)
 *   down:    block (32 rows h, pair p). out[q][h] = down_h . act[q], then
 *            y[t][h] += sum_j w[t][j] out[t k + j][h] once all k slots are in.
 *
 * Weights are read once per step even when several tokens chose the same
 * expert: the block of the first pair (in pair order) that chose expert e
 * owns e and runs every pair that chose it, up to 4 tokens per pass
 * over the weights; blocks of the other pairs exit at once. A one-token call
 * skips that (its experts are distinct): each pair's block runs its pair, without
 * the owner check's and the pair list's barriers. The grid depends
 * only on n, nothing is read back, nothing allocated: graph-capturable.
 *
 * Two families of the same two kernels, which differ in how the weights arrive:
 *   bf16: each lane streams its pieces into registers (a row's first chunk in
 *     flight before the routing is known where it can be), 4 blocks per SM; a
 *     one-token call's instances (one entry a pass) need 48 registers and run 5,
 *     so each kernel's 576 blocks of a 35B-A3B token are one wave.
 *   quantized (FP8, INT4, NVFP4): the weights land in shared memory by bulk
 *     asynchronous copies (cuda_bulk.cuh), one per row and stage, so the bytes in
 *     flight cost no registers; a warp's rows of one stage (gate_up: 2 rows of up
 *     to 2 KiB, down: 4 of up to 1 KiB, 4-bit formats half) are one wait, up to two
 *     stages in flight. A decoded piece needs more registers than a bf16 one, so in
 *     registers these ran 3 blocks per SM: the 576 blocks of a 35B-A3B layer at
 *     batch 1 took 1.45 waves. Staged and built for one token a pass, 5 blocks
 *     per SM hold them in one wave. Staging bf16 (64 KiB a gate_up block, 2-3 blocks
 *     per SM) was measured slower at every batch (bench/RESULTS.md, session 21).
 *
 * Batch invariance: one dot product is always summed the same way (lane l
 * takes the same 8-element blocks in the same order, then a fixed xor-shuffle
 * tree), whatever pass or group the token lands in, so a token's result is
 * bit-identical for any batch. The k slots of a token are added into y in slot
 * order by whichever down block completes the token's row tile last (a
 * completion counter per (token, row tile), reset by the gate_up kernel), so
 * no atomics touch y and runs repeat exactly.
 *
 * The down kernel is launched as a programmatic dependent of gate_up: its
 * blocks start while gate_up drains and load their down_proj weights (which
 * do not depend on gate_up), then wait (griddepcontrol.wait) for the
 * activations. gate_up waits for its own predecessor before reading the
 * routing and only then lets down launch, so down may read the routing early
 * (cuda_pdl.cuh); gate_up itself may be a programmatic dependent (the fused
 * MoE block launches it right after the router).
 *
 * Shared expert (optional, the fused decode block): block rows after the P
 * pairs run it, one row of blocks per SH_TG tokens (one pass over the weights
 * each, the rows in parallel: a single row would make n / SH_TG passes in
 * sequence and become the tail of the kernel); its down blocks count as one
 * more slot of each (token, row tile), and the block completing a tile adds
 * sigmoid(gate) * shared + the routed sum. Its weights are known before the
 * routing, so its blocks load them before waiting. */
#include "backend/cuda/moe_decode.cuh"

/* The stages of a stream of rows of rb bytes: sb bytes a row a stage, nst stages. */
static void stage_shape(int rb, int max_sb, int max_nst, int *sb, int *nst) {
    *sb = rb < max_sb ? rb : max_sb;
    const int nch = (rb + *sb - 1) / *sb;
    *nst = nch < max_nst ? nch : max_nst;
}

/* 16-byte pieces of a row of cols columns in dtype. */
static int row_pieces(int dtype, int cols) {
    return cols / (dtype == QD_DTYPE_F8_E4M3 ? 16 : dtype == QD_DTYPE_BF16 ? 8 : 32);
}

/* bf16 passes take GU_TG tokens (min(P, GU_TG) of x in shared memory); quantized ones
 * min(n, GU_TG) beside their stages. */
static decode_shape shape_of(int n, int P, int H, int I, int Is, int dtype) {
    decode_shape d = {};
    const int Imax = I > Is ? I : Is;
    if (dtype == QD_DTYPE_BF16) {
        d.tg = P < GU_TG ? P : GU_TG;
        d.gu_smem = (size_t)d.tg * H * 2;
        d.dn_smem = (size_t)d.tg * Imax * 4;
        return d;
    }
    d.tg = n < GU_TG ? n : GU_TG;
    stage_shape(row_pieces(dtype, H) * 16, stage_bytes(GU_SB, dtype), GU_NST, &d.gu_sb, &d.gu_nst);
    stage_shape(row_pieces(dtype, Imax) * 16, stage_bytes(DN_SB, dtype), DN_NST, &d.dn_sb, &d.dn_nst);
    d.gu_smem = (size_t)GU_WARPS * d.gu_nst * 2 * d.gu_sb + (size_t)d.tg * H * 2;
    d.dn_smem = (size_t)DN_WARPS * d.dn_nst * DN_R * d.dn_sb + (size_t)d.tg * Imax * 4;
    return d;
}

/* A view the kernels can read: its scale grid set and its addresses aligned for 16-byte
 * code pieces (qd_cuda_qmats_aligned). */
static int readable(const qd_cuda_qmats *m) { return qd_cuda_qmats_laid_out(m) && qd_cuda_qmats_aligned(m); }

int qd_moe_decode_takes(const qd_cuda_moe_args *a, const qd_moe_shared *sh) {
    const int has_sh = sh && (sh->gate_up || sh->q_gate_up);
    if (!a->q_gate_up != !a->q_down) return 0;
    const int dt = a->q_gate_up ? a->q_gate_up->dtype : QD_DTYPE_BF16;
    /* the largest pass (GU_TG tokens) must fit a block's shared memory */
    const decode_shape d = shape_of(GU_TG, GU_TG, a->H, a->I, has_sh ? sh->I : 0, dt);
    if (d.gu_smem > DECODE_MAX_DYN_SMEM || d.dn_smem > DECODE_MAX_DYN_SMEM) return 0;
    if (!a->q_gate_up) return !has_sh || (sh->gate_up && sh->down && !sh->q_gate_up);
    const int cols = dt == QD_DTYPE_F8_E4M3 ? 16 : 32;
    if (a->q_down->dtype != dt || a->H % cols || a->I % cols || !readable(a->q_gate_up) || !readable(a->q_down))
        return 0;
    if (has_sh && (!sh->q_gate_up || !sh->q_down || sh->q_gate_up->dtype != dt || sh->q_down->dtype != dt ||
                   sh->I % cols || !readable(sh->q_gate_up) || !readable(sh->q_down)))
        return 0;
    return dt == QD_DTYPE_F8_E4M3 || dt == QD_DTYPE_INT4 || dt == QD_DTYPE_NVFP4;
}

qd_status qd_moe_decode(const qd_cuda_moe_args *a, const qd_moe_work *w, const qd_moe_shared *sh, int pdl,
                        cudaStream_t s) {
    if (!qd_moe_decode_takes(a, sh))
        return qd_cuda_fail(QD_ERR_INVALID_ARG, "MoE decode: the routed and shared experts' formats or shapes "
                                                "differ from what the kernels take");
    const int has_sh = sh && (sh->gate_up || sh->q_gate_up);
    const int dt = a->q_gate_up ? a->q_gate_up->dtype : QD_DTYPE_BF16;
    const decode_shape d = shape_of(a->n, a->n * a->k, a->H, a->I, has_sh ? sh->I : 0, dt);
    return a->q_gate_up ? qd_moe_decode_quant(a, w, sh, &d, pdl, s) : qd_moe_decode_bf16(a, w, sh, &d, pdl, s);
}
