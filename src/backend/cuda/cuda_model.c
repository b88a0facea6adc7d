/* Device weights of a model: planned in one pass (sizes), checked against the
 * GPU's free memory with a clear message, then allocated as one block and filled
 * in a second pass.
 *
 * Formats: the linear projections stay in their checkpoint format (bf16, or a quantized
 * layout of base/weight.h: no bf16 copy), their BF16 / F16 scales widened to F32 (exact).
 * A MoE layer's experts stay quantized when the decode kernels take their layout
 * (qd_moe_decode_takes: one vectorised layout for every expert); otherwise, and for the
 * embedding, lm_head and routers (which the kernels read as bf16), a quantized tensor is
 * dequantized to bf16 on the host and the log names it. F32 / F16 tensors are rounded to
 * bf16 on the host; dummy weights, bf16 or quantized to FP8 / INT4, are drawn on the device
 * (dummy_fill.cu) with the bytes the CPU backend draws and converts. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_model.h"
#include "base/log.h"

typedef struct planner {
    qd_cuda_carve cv;    /* cv.base NULL while measuring */
    uint16_t *staging;   /* pinned staging for converted tensors: staging_elems bf16, or half as many floats */
    size_t staging_elems;
    size_t fmt_bytes[QD_DTYPE_COUNT]; /* device bytes by format (scales counted with their weight) */
    int n_widened;       /* quantized tensors uploaded as bf16 */
    qd_err *err;
} planner;

static void *take(planner *p, size_t bytes) { return qd_cuda_take(&p->cv, bytes); }

static qd_status cuda_err(qd_err *err, qd_status s, const char *what) {
    return qd_seterr(err, s, "%s: %s", what, qd_cuda_last_error());
}

static qd_status h2d(planner *p, void *dst, const void *src, size_t bytes) {
    qd_status s = qd_cuda_memcpy_h2d(dst, src, bytes);
    return s ? cuda_err(p->err, s, "uploading weights") : QD_OK;
}

/* A quantized dummy held as bf16 (a layout the kernels do not take): drawn in its format in
 * scratch, then dequantized, so it has the values the CPU backend multiplies. */
static qd_status put_drawn_widened(planner *p, uint16_t *dst, const qd_weight *w) {
    qd_weight d = *w;
    const size_t db = qd_weight_data_bytes(&d), sb = qd_weight_scale_bytes(&d), gb = (db + sb + 3) / 4 * 4;
    void *tmp = NULL;
    qd_status s = qd_cuda_malloc(&tmp, gb + sizeof(float));
    if (s) return cuda_err(p->err, s, "scratch for a dummy weight");
    d.data = tmp;
    d.scales.data = (uint8_t *)tmp + db;
    float *d_global = (float *)((uint8_t *)tmp + gb);
    s = qd_cuda_fill_dummy_quant(&d, tmp, (void *)d.scales.data, d_global, NULL);
    if (!s && d.dtype == QD_DTYPE_NVFP4) s = qd_cuda_memcpy_d2h(&d.scales.global, d_global, sizeof(float));
    if (!s) s = qd_cuda_dequant_bf16(&d, dst, NULL);
    if (!s) s = qd_cuda_sync();
    qd_cuda_free(tmp);
    return s ? cuda_err(p->err, s, "drawing a dummy quantized weight") : QD_OK;
}

/* Writes w (rows x cols, any stored format) as bf16 at dst. */
static qd_status put_bf16(planner *p, uint16_t *dst, const qd_weight *w) {
    const int64_t n = w->rows * w->cols;
    qd_status s;
    if (!w->data && qd_weight_quantized(w)) return put_drawn_widened(p, dst, w);
    if (!w->data) {
        if ((s = qd_cuda_fill_dummy_bf16(dst, n, w->dummy_scale, w->dummy_seed, NULL)))
            return cuda_err(p->err, s, "generating dummy weights");
        return QD_OK;
    }
    if (w->dtype == QD_DTYPE_BF16) return h2d(p, dst, w->data, (size_t)n * 2);
    float tmp[1024];
    if (qd_weight_quantized(w)) { /* exactly dequantized, a row span at a time */
        const int64_t C = w->cols;
        int64_t filled = 0;
        for (int64_t r = 0; r < w->rows; r++)
            for (int64_t c0 = 0; c0 < C; c0 += 1024) {
                const int64_t k = C - c0 < 1024 ? C - c0 : 1024;
                if (filled + k > (int64_t)p->staging_elems) {
                    QD_TRY(h2d(p, dst, p->staging, (size_t)filled * 2));
                    dst += filled;
                    filled = 0;
                }
                qd_weight_dequant_span(w, r, c0, k, tmp);
                for (int64_t t = 0; t < k; t++) p->staging[filled + t] = qd_f32_to_bf16(tmp[t]);
                filled += k;
            }
        return filled ? h2d(p, dst, p->staging, (size_t)filled * 2) : QD_OK;
    }
    const size_t esz = qd_dtype_size(w->dtype);
    for (int64_t i0 = 0; i0 < n; i0 += (int64_t)p->staging_elems) {
        const int64_t m = n - i0 < (int64_t)p->staging_elems ? n - i0 : (int64_t)p->staging_elems;
        for (int64_t j = 0; j < m; j += 1024) {
            const int64_t k = m - j < 1024 ? m - j : 1024;
            qd_convert_to_f32(w->dtype, (const unsigned char *)w->data + (size_t)(i0 + j) * esz, tmp, (size_t)k);
            for (int64_t t = 0; t < k; t++) p->staging[j + t] = qd_f32_to_bf16(tmp[t]);
        }
        QD_TRY(h2d(p, dst + i0, p->staging, (size_t)m * 2));
    }
    return QD_OK;
}

/* ---- quantized layouts on the device ---- */

static int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
static int64_t q_row_bytes(const qd_weight *w) { return w->dtype == QD_DTYPE_F8_E4M3 ? w->cols : w->cols / 2; }
/* scale elements of w in the device layout (NVFP4: [rows][cols / 16]) */
static int64_t q_scale_elems(const qd_weight *w) {
    const qd_weight_scales *s = &w->scales;
    if (w->dtype == QD_DTYPE_NVFP4) return w->rows * (w->cols / 16);
    return ceil_div(w->rows, s->block_rows) * ceil_div(w->cols, s->block_cols);
}
static size_t q_scale_esize(const qd_weight *w) { return w->dtype == QD_DTYPE_NVFP4 ? 1 : 4; }

/* Whether b continues the quantized part that a began (rows_before rows so far): one layout,
 * and no scale block straddling the two. NVFP4: one global factor (a drawn dummy's is known
 * only once drawn, so it keeps a part of its own). */
static int q_joinable(const qd_weight *a, int64_t rows_before, const qd_weight *b) {
    const qd_weight_scales *x = &a->scales, *y = &b->scales;
    if (!qd_weight_quantized(a) || a->dtype != b->dtype || a->cols != b->cols || x->g_idx || y->g_idx ||
        !x->zeros != !y->zeros || x->block_cols != y->block_cols || x->block_rows != y->block_rows)
        return 0;
    if (a->dtype == QD_DTYPE_NVFP4)
        return x->global == y->global && !qd_weight_backend_drawn(a) && !qd_weight_backend_drawn(b);
    return rows_before % x->block_rows == 0;
}

/* Widens n scales of w starting at element i0 (stored dtype) to F32 at dst. */
static qd_status put_scales_f32(planner *p, float *dst, const qd_weight *w, int64_t n) {
    float *st = (float *)p->staging;
    const int64_t cap = (int64_t)p->staging_elems / 2;
    const size_t esz = qd_dtype_size(w->scales.dtype);
    for (int64_t i0 = 0; i0 < n; i0 += cap) {
        const int64_t m = n - i0 < cap ? n - i0 : cap;
        qd_convert_to_f32(w->scales.dtype, (const unsigned char *)w->scales.data + (size_t)i0 * esz, st, (size_t)m);
        QD_TRY(h2d(p, dst + i0, st, (size_t)m * 4));
    }
    return QD_OK;
}

/* One quantized matrix w in its device places: values at data, scales (the device layout:
 * F32, or NVFP4's e4m3) at scales, zero points at zeros (NULL: none), NVFP4's global factor
 * at d_global (NULL: kept on the host only). A dummy the backend draws is drawn there, its
 * global factor computed at d_global; any other weight is uploaded. */
static qd_status put_quant_mat(planner *p, const qd_weight *w, uint8_t *data, void *scales, uint8_t *zeros,
                               float *d_global) {
    const int64_t db = w->rows * q_row_bytes(w), sn = q_scale_elems(w);
    if (qd_weight_backend_drawn(w)) { /* values and scales drawn in place (no zeros) */
        const qd_status s = qd_cuda_fill_dummy_quant(w, data, scales, d_global, NULL);
        return s ? cuda_err(p->err, s, "drawing dummy weights") : QD_OK;
    }
    QD_TRY(h2d(p, data, w->data, (size_t)db));
    if (q_scale_esize(w) == 4) QD_TRY(put_scales_f32(p, (float *)scales, w, sn));
    else QD_TRY(h2d(p, scales, w->scales.data, (size_t)sn));
    if (zeros) QD_TRY(h2d(p, zeros, w->scales.zeros, (size_t)sn));
    if (d_global) QD_TRY(h2d(p, d_global, &w->scales.global, sizeof(float)));
    return QD_OK;
}

/* A drawn NVFP4 matrix's global factor, computed on the device at d_global, into *global. */
static qd_status drawn_global(planner *p, const qd_weight *w, const float *d_global, float *global) {
    if (!qd_weight_backend_drawn(w) || w->dtype != QD_DTYPE_NVFP4) return QD_OK;
    const qd_status s = qd_cuda_memcpy_d2h(global, d_global, sizeof(float));
    return s ? cuda_err(p->err, s, "reading a drawn global factor") : QD_OK;
}

/* The parts srcs[0..n) (joinable, quantized) as one device matrix m. */
static qd_status put_quant(planner *p, qd_cuda_mat *m, const qd_weight *const *srcs, int n) {
    const qd_weight *w0 = srcs[0];
    int64_t rows = 0, data_b = 0, scale_n = 0;
    for (int i = 0; i < n; i++) {
        if ((!srcs[i]->data || !srcs[i]->scales.data) && !qd_weight_backend_drawn(srcs[i]))
            return qd_seterr(p->err, QD_ERR_INVALID_ARG, "a quantized weight without its values or scales");
        rows += srcs[i]->rows;
        data_b += srcs[i]->rows * q_row_bytes(srcs[i]);
        scale_n += q_scale_elems(srcs[i]);
    }
    const size_t esz = q_scale_esize(w0);
    uint8_t *data = take(p, (size_t)data_b);
    void *scales = take(p, (size_t)scale_n * esz);
    uint8_t *zeros = w0->scales.zeros ? take(p, (size_t)scale_n) : NULL;
    int32_t *g_idx = w0->scales.g_idx ? take(p, (size_t)w0->cols * 4) : NULL;
    /* a drawn NVFP4 dummy's global factor, computed on the device (q_joinable: alone in its part) */
    float *d_global = w0->dtype == QD_DTYPE_NVFP4 && qd_weight_backend_drawn(w0) ? take(p, sizeof(float)) : NULL;
    p->fmt_bytes[w0->dtype] += (size_t)data_b + (size_t)scale_n * (esz + (zeros ? 1 : 0)) + (g_idx ? (size_t)w0->cols * 4 : 0);
    *m = (qd_cuda_mat){.rows = rows, .cols = w0->cols};
    m->q = (qd_weight){.dtype = w0->dtype, .rows = rows, .cols = w0->cols, .data = data};
    m->q.scales = (qd_weight_scales){.dtype = w0->dtype == QD_DTYPE_NVFP4 ? QD_DTYPE_F8_E4M3 : QD_DTYPE_F32,
                                     .data = scales, .block_rows = w0->scales.block_rows,
                                     .block_cols = w0->scales.block_cols, .global = w0->scales.global,
                                     .zeros = zeros, .g_idx = g_idx};
    if (!p->cv.base) {
        m->q.data = (const void *)1; /* measuring: marks the matrix quantized */
        return QD_OK;
    }
    for (int i = 0; i < n; i++) {
        const qd_weight *w = srcs[i];
        const int64_t db = w->rows * q_row_bytes(w), sn = q_scale_elems(w);
        QD_TRY(put_quant_mat(p, w, data, scales, zeros, d_global));
        QD_TRY(drawn_global(p, w, d_global, &m->q.scales.global));
        data += db;
        scales = (unsigned char *)scales + (size_t)sn * esz;
        if (zeros) zeros += sn;
    }
    if (g_idx) QD_TRY(h2d(p, g_idx, w0->scales.g_idx, (size_t)w0->cols * 4));
    return QD_OK;
}

/* srcs stacked by rows into out, as few parts as their formats allow. */
static qd_status stack(planner *p, qd_cuda_stack *out, const qd_weight *const *srcs, int n) {
    memset(out, 0, sizeof *out);
    int64_t row = 0;
    for (int i = 0; i < n;) {
        int j = i + 1;
        int64_t rows = srcs[i]->rows;
        const int quant = qd_weight_quantized(srcs[i]);
        if (quant)
            while (j < n && q_joinable(srcs[i], rows, srcs[j])) rows += srcs[j++]->rows;
        else
            while (j < n && !qd_weight_quantized(srcs[j])) rows += srcs[j++]->rows;
        if (out->n == QD_CUDA_MAX_PARTS)
            return qd_seterr(p->err, QD_ERR_UNSUPPORTED, "a stacked projection of more than %d formats",
                             QD_CUDA_MAX_PARTS);
        qd_cuda_mat *m = &out->part[out->n];
        out->row0[out->n++] = row;
        if (quant) {
            QD_TRY(put_quant(p, m, srcs + i, j - i));
        } else {
            uint16_t *d = take(p, (size_t)(rows * srcs[i]->cols) * 2);
            p->fmt_bytes[QD_DTYPE_BF16] += (size_t)(rows * srcs[i]->cols) * 2;
            *m = (qd_cuda_mat){.bf16 = d, .rows = rows, .cols = srcs[i]->cols};
            if (p->cv.base)
                for (int k = i; k < j; k++) {
                    QD_TRY(put_bf16(p, d, srcs[k]));
                    d += srcs[k]->rows * srcs[k]->cols;
                }
        }
        row += rows;
        i = j;
    }
    return QD_OK;
}

static qd_status one(planner *p, qd_cuda_mat *out, const qd_weight *w) {
    qd_cuda_stack st;
    QD_TRY(stack(p, &st, &w, 1));
    *out = st.part[0];
    return QD_OK;
}

/* A matrix the kernels read as bf16 whatever its format (embedding, lm_head, routers): the
 * parts stacked, then zero rows up to pad_rows. */
static qd_status bf16_only(planner *p, uint16_t **out, const qd_weight *const *parts, int n_parts, int64_t pad_rows) {
    int64_t rows = 0;
    for (int i = 0; i < n_parts; i++) {
        rows += parts[i]->rows;
        if (qd_weight_quantized(parts[i])) p->n_widened += !p->cv.base;
    }
    const int64_t cols = parts[0]->cols, all = rows > pad_rows ? rows : pad_rows;
    uint16_t *d = take(p, (size_t)(all * cols) * 2);
    p->fmt_bytes[QD_DTYPE_BF16] += (size_t)(all * cols) * 2;
    *out = d;
    if (!p->cv.base) return QD_OK;
    for (int i = 0; i < n_parts; i++) {
        QD_TRY(put_bf16(p, d, parts[i]));
        d += parts[i]->rows * parts[i]->cols;
    }
    return all > rows ? qd_cuda_memset(d, 0, (size_t)((all - rows) * cols) * 2) : QD_OK;
}

static qd_status vec(planner *p, float **out, const float *src, int64_t n) {
    float *d = take(p, (size_t)n * sizeof(float));
    p->fmt_bytes[QD_DTYPE_F32] += (size_t)n * sizeof(float);
    *out = d;
    if (!p->cv.base) return QD_OK;
    return h2d(p, d, src, (size_t)n * sizeof(float));
}

/* The kernels' view of matrices [first, first + count) of one uploaded quantized matrix
 * stacked from `count` equal parts. */
static qd_cuda_qmats qmats_of_stack(const qd_cuda_mat *m, int count, const float *globals) {
    qd_cuda_qmats q;
    memset(&q, 0, sizeof q);
    qd_weight one_mat = m->q;
    one_mat.rows = m->rows / count;
    if (!qd_cuda_qmats_of(&one_mat, &q)) return (qd_cuda_qmats){0};
    q.n_mats = count;
    q.globals = globals;
    return q;
}

/* Whether gate and up are NVFP4 of one layout but may differ in their global factors (every
 * NVFP4 checkpoint's, and drawn dummies': q_joinable keeps them apart). */
static int nvfp4_pairable(const qd_weight *g, const qd_weight *u) {
    return g->dtype == QD_DTYPE_NVFP4 && u->dtype == QD_DTYPE_NVFP4 && g->rows == u->rows && g->cols == u->cols &&
           qd_cuda_qlayout_vectorised(g) && qd_cuda_qlayout_vectorised(u) && !q_joinable(g, g->rows, u) &&
           (g->data || qd_weight_backend_drawn(g)) && (u->data || qd_weight_backend_drawn(u));
}

/* Gate and up (nvfp4_pairable) as two parts of one allocation, their global factors in a
 * device array beside it: q views both as one stack of two matrices, as the routed experts
 * are viewed, so that the MoE block's decode kernels take the shared expert. */
static qd_status nvfp4_pair(planner *p, qd_cuda_stack *out, qd_cuda_qmats *q, const qd_weight *const *gu) {
    const int64_t rows = gu[0]->rows, cols = gu[0]->cols, db = rows * q_row_bytes(gu[0]), sn = q_scale_elems(gu[0]);
    uint8_t *data = take(p, (size_t)(2 * db));
    uint8_t *scales = take(p, (size_t)(2 * sn));
    float *globals = take(p, 2 * sizeof(float));
    p->fmt_bytes[QD_DTYPE_NVFP4] += (size_t)(2 * (db + sn)) + 2 * sizeof(float);
    memset(out, 0, sizeof *out);
    out->n = 2;
    for (int i = 0; i < 2; i++) {
        qd_cuda_mat *m = &out->part[i];
        out->row0[i] = i * rows;
        *m = (qd_cuda_mat){.rows = rows, .cols = cols};
        m->q = (qd_weight){.dtype = QD_DTYPE_NVFP4, .rows = rows, .cols = cols,
                           .data = p->cv.base ? (const void *)(data + i * db) : (const void *)1};
        m->q.scales = (qd_weight_scales){.dtype = QD_DTYPE_F8_E4M3, .data = scales + i * sn, .block_rows = 1,
                                         .block_cols = 16, .global = gu[i]->scales.global};
        if (!p->cv.base) continue;
        QD_TRY(put_quant_mat(p, gu[i], data + i * db, scales + i * sn, NULL, globals + i));
        QD_TRY(drawn_global(p, gu[i], globals + i, &m->q.scales.global));
    }
    qd_weight both = out->part[0].q;
    both.rows = rows;
    if (!qd_cuda_qmats_of(&both, q)) return qd_seterr(p->err, QD_ERR_INTERNAL, "an NVFP4 pair the kernels do not view");
    q->n_mats = 2;
    q->globals = globals;
    return QD_OK;
}

static qd_status mlp(planner *p, const qd_mlp_weights *w, qd_cuda_layer *d) {
    const qd_weight *gu[2] = {&w->gate, &w->up};
    memset(&d->sh_q_gate_up, 0, sizeof d->sh_q_gate_up);
    memset(&d->sh_q_down, 0, sizeof d->sh_q_down);
    const int pair = nvfp4_pairable(gu[0], gu[1]);
    if (pair) QD_TRY(nvfp4_pair(p, &d->gate_up, &d->sh_q_gate_up, gu));
    else QD_TRY(stack(p, &d->gate_up, gu, 2));
    QD_TRY(one(p, &d->down, &w->down));
    const int joined = d->gate_up.n == 1 && qd_cuda_mat_quantized(&d->gate_up.part[0]);
    if ((joined || pair) && qd_cuda_mat_quantized(&d->down) && d->gate_up.part[0].q.dtype == d->down.q.dtype &&
        w->gate.rows % w->gate.scales.block_rows == 0 &&
        w->gate.rows % (w->gate.dtype == QD_DTYPE_F8_E4M3 ? 16 : 32) == 0) { /* the decode kernels' pieces */
        if (joined) d->sh_q_gate_up = qmats_of_stack(&d->gate_up.part[0], 2, NULL);
        d->sh_q_down = qmats_of_stack(&d->down, 1, NULL);
    }
    if (!d->sh_q_gate_up.n_mats || !d->sh_q_down.n_mats) d->sh_q_gate_up.n_mats = d->sh_q_down.n_mats = 0;
    return QD_OK;
}

/* w as the device holds it: BF16 / F16 scales widened to F32. */
static qd_weight widened(const qd_weight *w) {
    qd_weight d = *w;
    if (d.dtype != QD_DTYPE_NVFP4 && (d.scales.dtype == QD_DTYPE_BF16 || d.scales.dtype == QD_DTYPE_F16))
        d.scales.dtype = QD_DTYPE_F32;
    return d;
}

/* Whether the experts [e0, e0 + E) stay quantized: one vectorised layout for all of them
 * (the decode kernels' condition), gate and up in one block-row-aligned stack. */
static int experts_quantizable(const qd_moe_weights *w, int e0, int E, int H, int Ie) {
    const qd_weight g0w = widened(&w->experts[e0].gate), *g0 = &g0w;
    if (!qd_weight_quantized(g0) || !qd_cuda_qlayout_vectorised(g0)) return 0;
    const int cols = g0->dtype == QD_DTYPE_F8_E4M3 ? 16 : 32;
    if (H % cols || Ie % cols) return 0;
    for (int e = e0; e < e0 + E; e++) {
        const qd_mlp_weights *x = &w->experts[e];
        const qd_weight *m[3] = {&x->gate, &x->up, &x->down};
        for (int i = 0; i < 3; i++) {
            const qd_weight mw = widened(m[i]);
            if (m[i]->dtype != g0->dtype || (!m[i]->data && !qd_weight_backend_drawn(m[i])) ||
                !qd_cuda_qlayout_vectorised(&mw) ||
                !m[i]->scales.zeros != !g0->scales.zeros)
                return 0;
            if (i < 2 && (m[i]->scales.block_cols != g0->scales.block_cols ||
                          m[i]->scales.block_rows != g0->scales.block_rows))
                return 0;
        }
        if (x->down.scales.block_rows != w->experts[e0].down.scales.block_rows ||
            x->down.scales.block_cols != w->experts[e0].down.scales.block_cols)
            return 0;
    }
    return 1;
}

/* Quantized experts: 2E matrices gate, up, ... and E down matrices, each with its own scales
 * (so a block may be partial at the end of each), NVFP4 with per-matrix globals. */
static qd_status experts_q(planner *p, qd_cuda_layer *d, const qd_moe_weights *w, int e0, int E) {
    const qd_weight *g0 = &w->experts[e0].gate, *d0 = &w->experts[e0].down;
    qd_cuda_qmats *gu = &d->q_experts_gate_up, *dn = &d->q_experts_down;
    const int fp4 = g0->dtype == QD_DTYPE_NVFP4;
    const size_t esz = q_scale_esize(g0);
    const int64_t gsn = q_scale_elems(g0), dsn = q_scale_elems(d0);
    const int64_t gdb = g0->rows * q_row_bytes(g0), ddb = d0->rows * q_row_bytes(d0);
    qd_cuda_qmats v;
    const qd_weight gw = widened(g0), dw = widened(d0);
    qd_cuda_qmats_of(&gw, &v); /* the layout fields; pointers set below */
    *gu = v;
    gu->n_mats = 2 * E;
    qd_cuda_qmats_of(&dw, &v);
    *dn = v;
    dn->n_mats = E;
    gu->data = take(p, (size_t)(2 * E * gdb));
    gu->scales = take(p, (size_t)(2 * E * gsn) * esz);
    gu->zeros = g0->scales.zeros ? take(p, (size_t)(2 * E * gsn)) : NULL;
    dn->data = take(p, (size_t)(E * ddb));
    dn->scales = take(p, (size_t)(E * dsn) * esz);
    dn->zeros = d0->scales.zeros ? take(p, (size_t)(E * dsn)) : NULL;
    float *globals = fp4 ? take(p, (size_t)(3 * E) * sizeof(float)) : NULL;
    gu->globals = globals;
    dn->globals = globals ? globals + 2 * E : NULL;
    p->fmt_bytes[g0->dtype] += (size_t)(2 * E * (gdb + gsn * (int64_t)esz + (gu->zeros ? gsn : 0))) +
                               (size_t)(E * (ddb + dsn * (int64_t)esz + (dn->zeros ? dsn : 0))) +
                               (fp4 ? (size_t)(3 * E) * 4 : 0);
    if (!p->cv.base) return QD_OK;
    qd_status s = QD_OK;
    if (fp4) { /* the stored global factors; a drawn dummy's is computed on the device below */
        float *glob_host = calloc((size_t)(3 * E), sizeof(float));
        if (!glob_host) return qd_seterr(p->err, QD_ERR_OOM, "out of memory");
        for (int e = 0; e < E; e++) {
            const qd_mlp_weights *x = &w->experts[e0 + e];
            glob_host[2 * e] = x->gate.scales.global;
            glob_host[2 * e + 1] = x->up.scales.global;
            glob_host[2 * E + e] = x->down.scales.global;
        }
        s = h2d(p, globals, glob_host, (size_t)(3 * E) * sizeof(float));
        free(glob_host);
    }
    QD_TRY(s);
    for (int e = 0; e < E; e++) {
        const qd_mlp_weights *x = &w->experts[e0 + e];
        const qd_weight *m[3] = {&x->gate, &x->up, &x->down};
        for (int i = 0; i < 3; i++) {
            const int gate_up = i < 2;
            const int64_t mat = gate_up ? 2 * e + i : e, db = gate_up ? gdb : ddb, sn = gate_up ? gsn : dsn;
            const qd_cuda_qmats *q = gate_up ? gu : dn;
            /* the stored global factors went up together above; a drawn one is computed in place */
            float *d_global = fp4 && qd_weight_backend_drawn(m[i]) ? globals + (gate_up ? mat : 2 * E + e) : NULL;
            uint8_t *scales = (uint8_t *)q->scales + (size_t)(mat * sn) * esz;
            QD_TRY(put_quant_mat(p, m[i], (uint8_t *)q->data + mat * db, scales,
                                 q->zeros ? (uint8_t *)q->zeros + mat * sn : NULL, d_global));
        }
    }
    return QD_OK;
}

/* One decoder layer's weights (a main layer or the MTP head's). */
static qd_status place_layer(const qd_config *c, const qd_weights *m, const qd_layer *ly, qd_cuda_layer *d,
                             qd_cuda_model *cm, planner *p) {
    const int H = c->hidden_size, hv = c->gdn_hv, hd = c->attn_head_dim;
    QD_TRY(vec(p, &d->input_norm, ly->input_norm, H));
    QD_TRY(vec(p, &d->post_norm, ly->post_norm, H));
    if (ly->kind == QD_LAYER_GDN) {
        const qd_gdn_weights *g = &ly->gdn;
        const qd_weight *in[4] = {&g->in_qkv, &g->in_z, &g->in_b, &g->in_a};
        QD_TRY(stack(p, &d->gdn_in, in, 4));
        QD_TRY(vec(p, &d->conv_w, g->conv_w, (int64_t)qd_config_conv_dim(c) * c->gdn_conv_kernel));
        QD_TRY(vec(p, &d->A_log, g->A_log, hv));
        QD_TRY(vec(p, &d->dt_bias, g->dt_bias, hv));
        QD_TRY(vec(p, &d->gdn_norm, g->norm_w, c->gdn_dv));
        QD_TRY(one(p, &d->gdn_out, &g->out));
    } else {
        const qd_attn_weights *a = &ly->attn;
        QD_TRY(one(p, &d->q, &a->q));
        QD_TRY(one(p, &d->k, &a->k));
        QD_TRY(one(p, &d->v, &a->v));
        QD_TRY(one(p, &d->o, &a->o));
        QD_TRY(vec(p, &d->q_norm, a->q_norm, hd));
        QD_TRY(vec(p, &d->k_norm, a->k_norm, hd));
    }
    if (ly->ffn_kind == QD_FFN_DENSE) {
        d->I = c->intermediate_size;
        QD_TRY(mlp(p, &ly->mlp, d));
    } else {
        const qd_moe_weights *w = &ly->moe;
        const qd_weight *rg[2] = {&w->router, &w->shared_gate};
        d->has_shared_gate = w->has_shared;
        /* rows padded to the logits stride: the split router's cuBLAS products take whole
         * 8-row pieces (cuda_layer_ffn.c) */
        QD_TRY(bf16_only(p, &d->router, rg, w->has_shared ? 2 : 1, QD_CUDA_ROUTER_LD(c->n_experts)));
        const int E = m->n_local_experts, e0 = m->expert0, Ie = c->moe_intermediate_size;
        d->experts_gate_up = d->experts_down = NULL;
        memset(&d->q_experts_gate_up, 0, sizeof d->q_experts_gate_up);
        memset(&d->q_experts_down, 0, sizeof d->q_experts_down);
        if (E > 0 && experts_quantizable(w, e0, E, H, Ie)) {
            QD_TRY(experts_q(p, d, w, e0, E));
            cm->quantized_experts = 1;
        } else {
            /* experts stacked [E][2 Ie][H] and [E][H][Ie]: all, or an expert-parallel rank's */
            d->experts_gate_up = take(p, (size_t)E * 2 * Ie * H * 2);
            d->experts_down = take(p, (size_t)E * H * Ie * 2);
            p->fmt_bytes[QD_DTYPE_BF16] += (size_t)E * 3 * Ie * H * 2;
            if (E > 0 && qd_weight_quantized(&w->experts[e0].gate)) p->n_widened += !p->cv.base;
            if (p->cv.base)
                for (int e = 0; e < E; e++) {
                    const qd_mlp_weights *x = &w->experts[e0 + e];
                    QD_TRY(put_bf16(p, d->experts_gate_up + (size_t)e * 2 * Ie * H, &x->gate));
                    QD_TRY(put_bf16(p, d->experts_gate_up + (size_t)e * 2 * Ie * H + (size_t)Ie * H, &x->up));
                    QD_TRY(put_bf16(p, d->experts_down + (size_t)e * H * Ie, &x->down));
                }
        }
        if (w->has_shared) {
            d->I = c->shared_expert_intermediate_size;
            QD_TRY(mlp(p, &w->shared, d));
        }
    }
    /* the prefill products' dequantization scratch: the largest quantized dense matrix */
    const qd_cuda_mat *mats[6] = {&d->gdn_out, &d->q, &d->k, &d->v, &d->o, &d->down};
    for (int i = 0; i < 6; i++)
        if (qd_cuda_mat_quantized(mats[i]) && mats[i]->rows * mats[i]->cols > cm->max_dequant_elems)
            cm->max_dequant_elems = mats[i]->rows * mats[i]->cols;
    const qd_cuda_stack *sts[2] = {&d->gdn_in, &d->gate_up};
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < sts[i]->n; j++) {
            const qd_cuda_mat *x = &sts[i]->part[j];
            if (qd_cuda_mat_quantized(x) && x->rows * x->cols > cm->max_dequant_elems)
                cm->max_dequant_elems = x->rows * x->cols;
        }
    return QD_OK;
}

/* Both passes: with p->cv.base NULL only the offsets advance. */
static qd_status place(const qd_config *c, const qd_weights *m, qd_cuda_model *cm, planner *p) {
    const int H = c->hidden_size;
    const qd_weight *emb = &m->embed, *lmh = &m->lm_head;
    QD_TRY(bf16_only(p, &cm->embed, &emb, 1, 0));
    if (c->tie_word_embeddings) cm->lm_head = cm->embed;
    else QD_TRY(bf16_only(p, &cm->lm_head, &lmh, 1, 0));
    QD_TRY(vec(p, &cm->final_norm, m->final_norm, H));
    cm->max_dequant_elems = 0;
    cm->quantized_experts = 0;
    for (int L = 0; L < c->n_layers; L++) QD_TRY(place_layer(c, m, &m->layers[L], &cm->layers[L], cm, p));
    if (m->mtp && cm->mtp) {
        const qd_mtp_weights *w = m->mtp;
        qd_cuda_mtp *d = cm->mtp;
        QD_TRY(vec(p, &d->pre_fc_norm_embedding, w->pre_fc_norm_embedding, H));
        QD_TRY(vec(p, &d->pre_fc_norm_hidden, w->pre_fc_norm_hidden, H));
        QD_TRY(one(p, &d->fc, &w->fc));
        QD_TRY(place_layer(c, m, &w->layer, &d->layer, cm, p));
        d->ffn_kind = w->layer.ffn_kind;
        QD_TRY(vec(p, &d->norm, w->norm, H));
        if (qd_cuda_mat_quantized(&d->fc) && d->fc.rows * d->fc.cols > cm->max_dequant_elems)
            cm->max_dequant_elems = d->fc.rows * d->fc.cols;
    }
    return QD_OK;
}


static qd_status upload(const qd_backend_model_desc *d, qd_cuda_model *cm, qd_err *err) {
    const qd_weights *w = d->w;
    cm->cfg = d->cfg;
    cm->w = w;
    cm->expert0 = w->expert0;
    cm->n_experts_local = w->n_local_experts;
    cm->layers = calloc((size_t)d->cfg->n_layers, sizeof(qd_cuda_layer));
    cm->mtp = w->mtp ? calloc(1, sizeof *cm->mtp) : NULL;
    if (!cm->layers || (w->mtp && !cm->mtp)) return qd_seterr(err, QD_ERR_OOM, "out of memory");
    int sms = 0;
    qd_status s = qd_cuda_device_info(cm->device_name, sizeof cm->device_name, &sms);
    if (s) return cuda_err(err, s, "querying the CUDA device");
    planner p = {.err = err};
    QD_TRY(place(d->cfg, w, cm, &p));
    const int n_widened = p.n_widened;
    size_t free_b = 0, total_b = 0;
    if ((s = qd_cuda_mem_info(&free_b, &total_b))) return cuda_err(err, s, "querying device memory");
    if (p.cv.off > free_b)
        return qd_seterr(err, QD_ERR_OOM,
                         "the model's weights need %.2f GiB of device memory, but %s has %.2f GiB free of "
                         "%.2f GiB", (double)p.cv.off / (1 << 30), cm->device_name, (double)free_b / (1 << 30),
                         (double)total_b / (1 << 30));
    if ((s = qd_cuda_malloc(&cm->arena, p.cv.off))) return cuda_err(err, s, "allocating device memory for the weights");
    cm->bytes = p.cv.off;
    planner q = {.cv = {cm->arena, 0}, .err = err, .staging_elems = 1 << 22};
    if ((s = qd_cuda_malloc_host((void **)&q.staging, q.staging_elems * 2))) return cuda_err(err, s, "pinned staging");
    s = place(d->cfg, w, cm, &q);
    qd_cuda_free_host(q.staging);
    QD_TRY(s);
    if ((s = qd_cuda_sync())) return cuda_err(err, s, "uploading weights");
    char by_fmt[256] = "";
    size_t len = 0;
    for (int t = 0; t < QD_DTYPE_COUNT; t++)
        if (q.fmt_bytes[t] && len < sizeof by_fmt)
            len += (size_t)snprintf(by_fmt + len, sizeof by_fmt - len, "%s%s %.2f GiB", len ? ", " : "",
                                    qd_dtype_name((qd_dtype)t), (double)q.fmt_bytes[t] / (1 << 30));
    QD_LOGI("CUDA: %.2f GiB of weights on %s (%s)", (double)cm->bytes / (1 << 30), cm->device_name, by_fmt);
    if (n_widened)
        QD_LOGI("CUDA: %d quantized tensors (embedding, lm_head, routers, or experts in a layout the MoE kernels "
                "do not take) are held as bf16", n_widened);
    return QD_OK;
}

qd_status qd_cuda_model_create(const qd_backend_model_desc *d, void **out, qd_err *err) {
    qd_cuda_model *cm = calloc(1, sizeof *cm);
    if (!cm) return qd_seterr(err, QD_ERR_OOM, "out of memory");
    cm->device = d->device;
    qd_status s = upload(d, cm, err);
    if (s != QD_OK) {
        qd_cuda_model_free(cm);
        return s;
    }
    *out = cm;
    return QD_OK;
}

void qd_cuda_model_free(void *bm) {
    qd_cuda_model *cm = bm;
    if (!cm) return;
    qd_cuda_free(cm->arena);
    free(cm->layers);
    free(cm->mtp);
    free(cm);
}

/* The prefill products' scratch needs: the largest quantized dense matrix that does not
 * take the FP8 GEMM (it is dequantized to bf16 for cuBLAS) and the scratch of the largest
 * call of those that do (their activations are quantized to e4m3 instead). */
void qd_cuda_model_prefill_extents(const qd_cuda_model *cm, int64_t B, int64_t *dequant_elems,
                                   size_t *fp8_act_bytes) {
    *dequant_elems = 0;
    *fp8_act_bytes = 0;
    for (int L = 0; L <= cm->cfg->n_layers; L++) {
        if (L == cm->cfg->n_layers && !cm->mtp) break;
        const qd_cuda_layer *d = L < cm->cfg->n_layers ? &cm->layers[L] : &cm->mtp->layer;
        const qd_cuda_mat *mats[7 + 2 * QD_CUDA_MAX_PARTS];
        int n = 0;
        if (L == cm->cfg->n_layers) mats[n++] = &cm->mtp->fc;
        const qd_cuda_mat *ones[6] = {&d->gdn_out, &d->q, &d->k, &d->v, &d->o, &d->down};
        for (int i = 0; i < 6; i++) mats[n++] = ones[i];
        for (int j = 0; j < d->gdn_in.n; j++) mats[n++] = &d->gdn_in.part[j];
        for (int j = 0; j < d->gate_up.n; j++) mats[n++] = &d->gate_up.part[j];
        for (int i = 0; i < n; i++) {
            const qd_cuda_mat *m = mats[i];
            if (!qd_cuda_mat_quantized(m)) continue;
            if (qd_cuda_fp8_gemm_mode(&m->q)) {
                const size_t bytes = qd_cuda_fp8_act_bytes(B, m->rows, m->cols);
                if (bytes > *fp8_act_bytes) *fp8_act_bytes = bytes;
            } else if (m->rows * m->cols > *dequant_elems) {
                *dequant_elems = m->rows * m->cols;
            }
        }
    }
}
