/* Routed experts of a MoE block: argument checks, the scratch layout and the
 * choice of path by batch size.
 *
 *   tokens n                          path                        host sync
 *   n * k <= 1024, and n <= 64          decode: GEMV kernels        none
 *   (bf16 experts the wgmma kernel
 *   takes and INT4 ones W4A16 takes:
 *   n < 40; NVFP4 ones W4A16 takes:
 *   n < 48; FP8 experts the W8A8
 *   kernels take: n < 17)
 *   otherwise, or batch-invariant       prefill: sorted pairs,      none
 *                                       grouped GEMMs (by the table
 *                                       in moe_prefill.cu), combine
 * (each path sums a token's products in one order whatever n; the two orders differ,
 * so batch-invariant mode keeps to the second)
 *
 * Neither path reads anything back or allocates, so both can be captured in
 * a CUDA graph; args->cublas is not used.
 *
 * Requirements beyond cuda_moe.h, checked here: H and I multiples of 8 and
 * d_x, d_gate_up, d_down, d_y, d_work 16-byte aligned (16-byte vector
 * accesses to whole rows), E <= 1024. */
#include <stdint.h>

#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/cuda_util.h"
#include "backend/cuda/moe_internal.cuh"

static size_t align_up(size_t x) { return (x + 255) & ~(size_t)255; }

size_t qd_moe_layout(int n, int H, int I, int E, int k, char *base, qd_moe_work *w) {
    const size_t P = (size_t)n * k;
    size_t off = 0;
#define QD_MOE_SEG(field, type, count)                                  \
    do {                                                                \
        if (w) w->field = (type *)(base + off);                         \
        off += align_up(sizeof(type) * (size_t)(count));                \
    } while (0)
    QD_MOE_SEG(act, float, P * I);
    QD_MOE_SEG(out, float, P * H);
    QD_MOE_SEG(counters, int32_t, (size_t)n * ((H + QD_MOE_DN_ROWS - 1) / QD_MOE_DN_ROWS));
    QD_MOE_SEG(seg, int32_t, E + 1);
    QD_MOE_SEG(n_tiles, int32_t, 1);
    QD_MOE_SEG(tiles, int2, qd_moe_max_tiles((int64_t)P, E));
    QD_MOE_SEG(sorted, int32_t, P);
    QD_MOE_SEG(pos, int32_t, P);
#undef QD_MOE_SEG
    return off;
}

extern "C" size_t qd_cuda_moe_work_bytes(int n_max, int H, int I, int E, int k) {
    if (n_max < 1 || H < 1 || I < 1 || E < 1 || k < 1) return 0;
    return qd_moe_layout(n_max, H, I, E, k, NULL, NULL);
}

extern "C" int qd_cuda_moe_graph_max_tokens(void) { return QD_MOE_GRAPH_MAX_TOKENS; }

static int misaligned(const void *p) { return ((uintptr_t)p & 15) != 0; }

extern "C" size_t qd_cuda_moe_dequant_bytes(int H, int I, int E) {
    return (size_t)E * 3 * (size_t)I * (size_t)H * 2;
}

/* Whether WA16 takes the experts at n_max: the table (moe_prefill.cu) dequantizes no experts
 * that WA16 takes, whatever n and the mode (W8A8, where it takes them, first), and WA16's only
 * bounds that depend on n (32-bit offsets) hold for fewer tokens when they hold for more.
 * Experts it does not take dequantize at some n (every n of the prefill path but W8A8's). */
extern "C" int qd_cuda_moe_dequant_needed(const qd_cuda_moe_args *a) {
    qd_cuda_moe_args t = *a;
    t.prefill_kernel = 0;
    return a->q_gate_up && !qd_moe_wa16_takes(&t);
}

/* The decode kernels' last batch for these experts: where the grouped GEMMs on the tensor
 * cores overtake them (moe_internal.cuh), for the layouts those take. */
static int decode_max_tokens(const qd_cuda_moe_args *a) {
    if (!a->q_gate_up) return qd_moe_wg_takes(a) ? QD_MOE_GROUPED_MIN_TOKENS - 1 : QD_MOE_GRAPH_MAX_TOKENS;
    if (qd_moe_fp8_takes(a)) return QD_MOE_W8A8_MIN_TOKENS - 1;
    if (!qd_moe_wa16_takes(a)) return QD_MOE_GRAPH_MAX_TOKENS;
    if (a->q_gate_up->dtype == QD_DTYPE_INT4) return QD_MOE_GROUPED_MIN_TOKENS - 1;
    if (a->q_gate_up->dtype == QD_DTYPE_NVFP4) return QD_MOE_NVFP4_WA16_MIN_TOKENS - 1;
    return QD_MOE_GRAPH_MAX_TOKENS; /* FP8 that only W8A16 takes: its crossing is not measured */
}

extern "C" int qd_cuda_moe_decode_path(const qd_cuda_moe_args *a) {
    return !a->invariant && a->n >= 1 && (int64_t)a->n * a->k <= QD_MOE_DECODE_MAX_PAIRS &&
           qd_moe_decode_takes(a, NULL) && a->n <= decode_max_tokens(a);
}

extern "C" qd_status qd_cuda_moe_experts(const qd_cuda_moe_args *a, void *stream) {
    if (!a) return qd_cuda_fail(QD_ERR_INVALID_ARG, "qd_cuda_moe_experts: NULL args");
    /* k may exceed E: an expert-parallel rank holds E / tp experts, and the pairs routed to
     * the others carry id -1 */
    if (a->n < 0 || a->H < 8 || a->I < 8 || a->H % 8 || a->I % 8 || a->E < 1 || a->E > QD_MOE_MAX_EXPERTS ||
        a->k < 1 || a->k > 32)
        return qd_cuda_fail(QD_ERR_INVALID_ARG,
                            "qd_cuda_moe_experts: need H, I multiples of 8, 1 <= E <= 1024, 1 <= k <= 32");
    if (a->n == 0) return QD_OK;
    const int quant = a->q_gate_up != NULL;
    if (!a->d_x || !a->d_sel || !a->d_w || (!quant && (!a->d_gate_up || !a->d_down)) || !a->d_y || !a->d_work)
        return qd_cuda_fail(QD_ERR_INVALID_ARG, "qd_cuda_moe_experts: NULL pointer");
    if (misaligned(a->d_x) || misaligned(a->d_gate_up) || misaligned(a->d_down) || misaligned(a->d_y) ||
        misaligned(a->d_work) || misaligned(a->d_dequant))
        return qd_cuda_fail(QD_ERR_INVALID_ARG, "qd_cuda_moe_experts: pointers must be 16-byte aligned");
    if (quant && !qd_moe_decode_takes(a, NULL))
        return qd_cuda_fail(QD_ERR_INVALID_ARG, "qd_cuda_moe_experts: quantized experts outside the kernels' layouts "
                                                "or alignment (codes 16 bytes, scales 4)");
    qd_moe_work w;
    qd_moe_layout(a->n, a->H, a->I, a->E, a->k, (char *)a->d_work, &w);
    cudaStream_t s = (cudaStream_t)stream;
    if (a->d_sh_y && (!a->d_sh_gate || a->sh_gate_ld < 1 || misaligned(a->d_sh_y)))
        return qd_cuda_fail(QD_ERR_INVALID_ARG, "qd_cuda_moe_experts: a shared expert needs its gate logits (stride "
                                                ">= 1) and a 16-byte aligned output");
    if (qd_cuda_moe_decode_path(a)) {
        if (a->d_sh_y) { /* the decode kernels add only the routed experts */
            const qd_status st = qd_cuda_sigmoid_scale(a->d_y, a->d_sh_y, a->d_sh_gate, a->sh_gate_ld, a->n, a->H, s);
            if (st) return st;
        }
        return qd_moe_decode(a, &w, NULL, 0, s);
    }
    if (!quant) return qd_moe_prefill(a, &w, s);
    /* quantized experts: W8A8 or WA16 on the stored weights where the table (moe_prefill.cu)
     * takes it */
    const int kernel = qd_moe_prefill_kernel(a);
    if (kernel == QD_MOE_PREFILL_W8A8 || kernel == QD_MOE_PREFILL_WA16) return qd_moe_prefill_quant(a, &w, kernel, s);
    if (a->prefill_kernel == QD_MOE_PREFILL_W8A8)
        return qd_cuda_fail(QD_ERR_INVALID_ARG, "qd_cuda_moe_experts: the W8A8 kernels take 128 x 128 block-scaled FP8 "
                                                "experts outside batch-invariant mode only");
    if (a->prefill_kernel == QD_MOE_PREFILL_WA16)
        return qd_cuda_fail(QD_ERR_INVALID_ARG, "qd_cuda_moe_experts: the WA16 kernels take INT4 (f32 group scales of "
                                                "32k columns), NVFP4 and FP8 (f32 scales, block columns a multiple of "
                                                "16) experts with H, I multiples of 32 (NVFP4: 64; FP8: 16) and "
                                                "aligned codes");
    /* prefill of quantized experts the fused kernels do not take: every expert to bf16 (1.6 GB
     * a layer at the 35B-A3B's size, written and read), then the bf16 grouped GEMMs */
    if (!a->d_dequant) return qd_cuda_fail(QD_ERR_INVALID_ARG, "qd_cuda_moe_experts: no dequantization scratch");
    if (a->q_gate_up->n_mats != 2 * a->E || a->q_down->n_mats != a->E || a->q_gate_up->rows != a->I ||
        a->q_gate_up->cols != a->H || a->q_down->rows != a->H || a->q_down->cols != a->I)
        return qd_cuda_fail(QD_ERR_INVALID_ARG, "qd_cuda_moe_experts: quantized expert shapes differ from the call's");
    uint16_t *gu = a->d_dequant, *dn = a->d_dequant + (size_t)a->E * 2 * a->I * a->H;
    qd_status st = qd_cuda_qmats_dequant_bf16(a->q_gate_up, gu, stream);
    if (!st) st = qd_cuda_qmats_dequant_bf16(a->q_down, dn, stream);
    if (st) return st;
    qd_cuda_moe_args b = *a;
    b.d_gate_up = gu;
    b.d_down = dn;
    b.q_gate_up = b.q_down = NULL;
    return qd_moe_prefill(&b, &w, s);
}
