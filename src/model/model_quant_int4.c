/* GPTQ, AWQ and compressed-tensors int4 -> INT4 (weight.h: [N][K/2] nibbles, element 2j low;
 * F32 scales and U8 zeros [N][groups]; g_idx for act-order). Each published layout is packed
 * eight nibbles per int32, the first two transposed ([K, N]-major), so every module is
 * repacked once:
 *  - GPTQ: qweight [K/8, N], nibble i of word (k/8, n) is element k = 8 (k/8) + i (low bits
 *    first); qzeros [G, N/8] packed along N the same way; scales [G, N]; g_idx [K] when
 *    desc_act. checkpoint_format gptq (v1) stores z - 1 (mod 16), gptq_v2 stores z.
 *  - AWQ (GEMM): qweight [K, N/8] packed along N in the nibble order [0, 2, 4, 6, 1, 3, 5, 7]
 *    (nibble i holds column 8 j + order[i]); qzeros [G, N/8] alike; scales [G, N]; exact z.
 *  - compressed-tensors pack-quantized: weight_packed [N, ceil(K/8)] packed along K (column k
 *    of row n at nibble k % 8 of word k / 8), each nibble the signed value q in [-8, 8) plus 8;
 *    weight_scale [N, G]; weight_zero_point [ceil(N/8), G] packed along N the same way (the
 *    signed zero plus 8; asymmetric only); weight_g_idx [K] (actorder group); weight_shape
 *    [N, K]. w = (q - zero) s, which is (nibble - zero nibble) s.
 * G = ceil(K / group) (1 for group -1). Zeros that are all 8 are dropped (symmetric). */
#include <stdio.h>
#include <string.h>

#include "model/model_quant.h"

static const int AWQ_ORDER[8] = {0, 2, 4, 6, 1, 3, 5, 7};

/* nibble holding column c (of 8) of an AWQ word */
static int awq_nibble(int c) {
    for (int i = 0; i < 8; i++)
        if (AWQ_ORDER[i] == c) return i;
    return 0;
}

static qd_status need(const qd_st_tensor *t, const char *module, const char *suffix, qd_dtype dtype, qd_err *err) {
    if (!t) return qd_seterr(err, QD_ERR_NOT_FOUND, "missing tensor '%s%s' of the int4 module '%s'", module, suffix, module);
    if (dtype != QD_DTYPE_COUNT && t->dtype != dtype)
        return qd_seterr(err, QD_ERR_UNSUPPORTED, "tensor '%s' has dtype %s; expected %s", t->name, qd_dtype_name(t->dtype),
                         qd_dtype_name(dtype));
    return QD_OK;
}

/* An act-order g_idx [K] (each column's group, in [0, ceil(K / g))) as owned int32; NULL where
 * it is the plain k / g order, which needs none. */
static qd_status read_g_idx(qd_model *m, const qd_st_tensor *gi, int64_t K, int64_t g, int32_t **out, qd_err *err) {
    const int64_t G = (K + g - 1) / g;
    int64_t s_gi[1] = {K};
    QD_TRY(qd_quant_check_shape(gi, 1, s_gi, err));
    int32_t *gidx = qd_model_alloc(m, (size_t)K * sizeof(int32_t));
    if (!gidx) return qd_seterr(err, QD_ERR_OOM, "out of memory for '%s'", gi->name);
    bool trivial = true;
    for (int64_t k = 0; k < K; k++) {
        const int32_t v = ((const int32_t *)gi->data)[k];
        if (v < 0 || v >= G)
            return qd_seterr(err, QD_ERR_FORMAT, "tensor '%s': g_idx[%lld] = %d is not a group in [0, %lld)", gi->name,
                             (long long)k, v, (long long)G);
        gidx[k] = v;
        trivial &= v == k / g;
    }
    *out = trivial ? NULL : gidx;
    return QD_OK;
}

qd_status qd_quant_load_int4(qd_model *m, const qd_quant_config *q, const char *module, int64_t rows, int64_t cols,
                             qd_weight *out, qd_err *err) {
    const bool awq = q->method == QD_QUANT_AWQ;
    const int64_t N = rows, K = cols, g = q->group_size == -1 ? K : q->group_size, G = (K + g - 1) / g;
    const qd_st_tensor *qw = qd_quant_find(m, module, ".qweight"), *qz = qd_quant_find(m, module, ".qzeros"),
                       *sc = qd_quant_find(m, module, ".scales"), *gi = qd_quant_find(m, module, ".g_idx");
    QD_TRY(need(qw, module, ".qweight", QD_DTYPE_I32, err));
    QD_TRY(need(sc, module, ".scales", QD_DTYPE_COUNT, err));
    if (K % 8 || N % 8)
        return qd_seterr(err, QD_ERR_SHAPE, "tensor '%s': int4 modules need in and out features divisible by 8, got "
                         "[%lld, %lld]", qw->name, (long long)N, (long long)K);
    int64_t s_qw[2] = {awq ? K : K / 8, awq ? N / 8 : N}, s_sc[2] = {G, N}, s_qz[2] = {G, N / 8};
    QD_TRY(qd_quant_check_shape(qw, 2, s_qw, err));
    QD_TRY(qd_quant_check_shape(sc, 2, s_sc, err));
    if (qz) {
        QD_TRY(need(qz, module, ".qzeros", QD_DTYPE_I32, err));
        QD_TRY(qd_quant_check_shape(qz, 2, s_qz, err));
    } else if (awq || !q->sym) {
        return qd_seterr(err, QD_ERR_NOT_FOUND, "missing tensor '%s.qzeros' (asymmetric int4)", module);
    }
    if (gi && awq) return qd_seterr(err, QD_ERR_FORMAT, "tensor '%s': AWQ has no act-order g_idx", gi->name);
    if (q->desc_act && !gi)
        return qd_seterr(err, QD_ERR_NOT_FOUND, "missing tensor '%s.g_idx' (gptq desc_act is true)", module);
    float *scf;
    QD_TRY(qd_quant_f32(m, sc, &scf, err));
    uint8_t *data = qd_model_alloc(m, (size_t)(N * K / 2));
    float *scales = qd_model_alloc(m, (size_t)(N * G) * sizeof(float));
    uint8_t *zeros = qd_model_alloc(m, (size_t)(N * G));
    if (!data || !scales || !zeros) return qd_seterr(err, QD_ERR_OOM, "out of memory repacking '%s'", qw->name);
    memset(data, 0, (size_t)(N * K / 2));
    const int32_t *w32 = qw->data;
    for (int64_t k = 0; k < K; k++)
        for (int64_t n = 0; n < N; n++) {
            const uint32_t word = awq ? (uint32_t)w32[k * (N / 8) + n / 8] : (uint32_t)w32[(k / 8) * N + n];
            const int nib = awq ? awq_nibble((int)(n % 8)) : (int)(k % 8);
            const uint8_t v = (uint8_t)((word >> (4 * nib)) & 15);
            data[(n * K + k) / 2] |= (uint8_t)(k % 2 ? v << 4 : v);
        }
    bool all_eight = true;
    const int32_t *z32 = qz ? qz->data : NULL;
    for (int64_t gr = 0; gr < G; gr++)
        for (int64_t n = 0; n < N; n++) {
            scales[n * G + gr] = scf[gr * N + n];
            int z = 8;
            if (z32) {
                const uint32_t word = (uint32_t)z32[gr * (N / 8) + n / 8];
                z = (int)((word >> (4 * (awq ? awq_nibble((int)(n % 8)) : (int)(n % 8)))) & 15);
                if (!awq && q->gptq_version == 1) z = (z + 1) & 15;
            }
            zeros[n * G + gr] = (uint8_t)z;
            all_eight &= z == 8;
        }
    int32_t *gidx = NULL;
    if (gi) {
        QD_TRY(need(gi, module, ".g_idx", QD_DTYPE_I32, err));
        QD_TRY(read_g_idx(m, gi, K, g, &gidx, err));
    }
    *out = (qd_weight){.dtype = QD_DTYPE_INT4, .rows = N, .cols = K, .data = data,
                       .scales = {.dtype = QD_DTYPE_F32, .data = scales, .block_rows = 1, .block_cols = g,
                                  .global = 1, .zeros = all_eight ? NULL : zeros, .g_idx = gidx}};
    return QD_OK;
}

qd_status qd_quant_load_ct_int4(qd_model *m, const qd_quant_config *q, const char *module, int64_t rows, int64_t cols,
                                qd_weight *out, qd_err *err) {
    const int64_t N = rows, K = cols, g = q->group_size == -1 ? K : q->group_size, G = (K + g - 1) / g;
    const qd_st_tensor *wp = qd_quant_find(m, module, ".weight_packed"),
                       *sc = qd_quant_find(m, module, ".weight_scale"), *zp = qd_quant_find(m, module, ".weight_zero_point"),
                       *gi = qd_quant_find(m, module, ".weight_g_idx"), *ws = qd_quant_find(m, module, ".weight_shape");
    QD_TRY(need(wp, module, ".weight_packed", QD_DTYPE_I32, err));
    QD_TRY(need(sc, module, ".weight_scale", QD_DTYPE_COUNT, err));
    if (K % 8 || N % 8)
        return qd_seterr(err, QD_ERR_SHAPE, "tensor '%s': int4 modules need in and out features divisible by 8, got "
                         "[%lld, %lld]", wp->name, (long long)N, (long long)K);
    if (ws) { /* the unpacked shape, where the checkpoint records it */
        if ((ws->dtype != QD_DTYPE_I64 && ws->dtype != QD_DTYPE_I32) || ws->ndim != 1 || ws->shape[0] != 2)
            return qd_seterr(err, QD_ERR_FORMAT, "tensor '%s' must hold two integers (rows, columns)", ws->name);
        const int64_t r = ws->dtype == QD_DTYPE_I64 ? ((const int64_t *)ws->data)[0] : ((const int32_t *)ws->data)[0],
                      c = ws->dtype == QD_DTYPE_I64 ? ((const int64_t *)ws->data)[1] : ((const int32_t *)ws->data)[1];
        if (r != N || c != K)
            return qd_seterr(err, QD_ERR_SHAPE, "tensor '%s' says [%lld, %lld]; the model needs [%lld, %lld]",
                             ws->name, (long long)r, (long long)c, (long long)N, (long long)K);
    }
    int64_t s_wp[2] = {N, K / 8}, s_sc[2] = {N, G}, s_zp[2] = {N / 8, G};
    QD_TRY(qd_quant_check_shape(wp, 2, s_wp, err));
    QD_TRY(qd_quant_check_shape(sc, 2, s_sc, err));
    if (zp) {
        if (q->sym)
            return qd_seterr(err, QD_ERR_FORMAT, "tensor '%s' is a zero point, but the %s config says symmetric",
                             zp->name, q->method_name);
        QD_TRY(need(zp, module, ".weight_zero_point", QD_DTYPE_I32, err));
        QD_TRY(qd_quant_check_shape(zp, 2, s_zp, err));
    } else if (!q->sym) {
        return qd_seterr(err, QD_ERR_NOT_FOUND, "missing tensor '%s.weight_zero_point' (asymmetric int4)", module);
    }
    if (q->desc_act && !gi)
        return qd_seterr(err, QD_ERR_NOT_FOUND, "missing tensor '%s.weight_g_idx' (actorder group)", module);
    float *scf;
    QD_TRY(qd_quant_f32(m, sc, &scf, err));
    /* packed along K, low nibble first: on a little-endian host the words' bytes already are
     * the canonical [N][K/2], so the weight is a view of the file, like a plain one */
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    const uint8_t *data = wp->data;
#else
    uint8_t *data = qd_model_alloc(m, (size_t)(N * K / 2));
    if (!data) return qd_seterr(err, QD_ERR_OOM, "out of memory repacking '%s'", wp->name);
    const uint32_t *w32 = wp->data;
    for (int64_t i = 0; i < N * K / 8; i++)
        for (int b = 0; b < 4; b++) data[4 * i + b] = (uint8_t)(w32[i] >> (8 * b));
#endif
    uint8_t *zeros = zp ? qd_model_alloc(m, (size_t)(N * G)) : NULL;
    if (zp && !zeros) return qd_seterr(err, QD_ERR_OOM, "out of memory for the zero points of '%s'", wp->name);
    bool all_eight = true;
    if (zp) {
        const uint32_t *z32 = zp->data;
        for (int64_t n = 0; n < N; n++)
            for (int64_t gr = 0; gr < G; gr++) {
                const uint8_t z = (uint8_t)((z32[(n / 8) * G + gr] >> (4 * (n % 8))) & 15);
                zeros[n * G + gr] = z;
                all_eight &= z == 8;
            }
    }
    int32_t *gidx = NULL;
    if (gi) {
        QD_TRY(need(gi, module, ".weight_g_idx", QD_DTYPE_I32, err));
        QD_TRY(read_g_idx(m, gi, K, g, &gidx, err));
    }
    *out = (qd_weight){.dtype = QD_DTYPE_INT4, .rows = N, .cols = K, .data = data,
                       .scales = {.dtype = QD_DTYPE_F32, .data = scf, .block_rows = 1, .block_cols = g, .global = 1,
                                  .zeros = all_eight ? NULL : zeros, .g_idx = gidx}};
    return QD_OK;
}
