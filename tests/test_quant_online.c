/* Quantization at load (qd_model_params.quantization, model_quant_online.c):
 *  - online FP8: the BF16 fixture qwen3_5_dense_bf16 quantized at load to FP8 block-128 gives,
 *    module by module, exactly the weights tools/make_quant_fixtures.py's quantizer stored in
 *    quant/fp8_35_dense_f32s (amax / 448 block scales, round to nearest even), and so that
 *    fixture's transformers logits (5e-4 x max|ref|) and greedy continuations;
 *  - dummy weights in a format: --load-format dummy --quantization fp8|nvfp4|int4 gives every
 *    linear layer in the format, within the format's rounding of the BF16 dummy of the same
 *    seed, and finite logits;
 *  - refusals: nvfp4 / int4 of a checkpoint, re-quantizing a quantized checkpoint, and
 *    quantization with tensor parallelism, each with a message naming what is wrong. */
#include <string.h>

#include "base/weight.h"
#include "model/model.h"
#include "model/model_quant.h"
#include "qd_test.h"
#include "qdelta.h"

static qd_model *load(const char *dir, qd_load_format lf, qd_quantization q, int tp, char *err) {
    qd_model_params mp = qd_model_default_params();
    mp.path = dir;
    mp.n_threads = 2;
    mp.load_format = lf;
    mp.quantization = q;
    mp.tensor_parallel_size = tp;
    mp.seed = 7;
    qd_model *m = NULL;
    if (qd_model_load(&mp, &m, err, 1024) != QD_OK) return NULL;
    return m;
}

/* The linear layers of a model, in a fixed order. */
static int linears(qd_model *m, const qd_weight **out, int max) {
    int n = 0;
    for (int L = 0; L < m->cfg.n_layers; L++) {
        const qd_layer *ly = &m->w.layers[L];
        const qd_weight *ws[8];
        int k = 0;
        if (ly->kind == QD_LAYER_GDN) ws[k++] = &ly->gdn.in_qkv, ws[k++] = &ly->gdn.in_z, ws[k++] = &ly->gdn.out;
        else ws[k++] = &ly->attn.q, ws[k++] = &ly->attn.k, ws[k++] = &ly->attn.v, ws[k++] = &ly->attn.o;
        if (ly->ffn_kind == QD_FFN_DENSE) ws[k++] = &ly->mlp.gate, ws[k++] = &ly->mlp.up, ws[k++] = &ly->mlp.down;
        else ws[k++] = &ly->moe.experts[0].gate, ws[k++] = &ly->moe.experts[0].down;
        for (int i = 0; i < k && n < max; i++) out[n++] = ws[i];
    }
    return n;
}

static float *dequant(const qd_weight *w) {
    float *v = malloc(sizeof(float) * (size_t)(w->rows * w->cols));
    qd_weight_dequant_rows(w, 0, w->rows, v);
    return v;
}

static void logits_match(qd_model *m, const char *ref_dir, int L) {
    char path[512];
    snprintf(path, sizeof path, "%s/prompt_%d.ids", ref_dir, L);
    char *txt = qd_test_read_file(path, NULL);
    CHECKF(txt != NULL, "cannot read %s", path);
    if (!txt) return;
    int32_t ids[64];
    int n = 0;
    for (char *s = txt, *e; n < 64; s = e) {
        long v = strtol(s, &e, 10);
        if (e == s) break;
        ids[n++] = (int32_t)v;
    }
    free(txt);
    const int V = qd_model_vocab_size(m);
    qd_context_params cp = qd_context_default_params();
    cp.max_ctx = L + 16;
    cp.max_batch = L;
    qd_context *ctx;
    CHECK(qd_context_create(m, &cp, &ctx) == QD_OK);
    float *lg = malloc(sizeof(float) * (size_t)L * V);
    qd_span sp = {0, ids, L, QD_LOGITS_ALL};
    CHECK(qd_forward(ctx, &sp, 1, lg) == QD_OK);
    snprintf(path, sizeof path, "%s/logits_%d.f32", ref_dir, L);
    size_t len;
    float *ref = (float *)qd_test_read_file(path, &len);
    CHECK(ref && len == sizeof(float) * (size_t)L * V);
    if (ref && len == sizeof(float) * (size_t)L * V) {
        double mx = 0, d = 0;
        for (size_t i = 0; i < (size_t)L * V; i++) mx = fmax(mx, fabs(ref[i])), d = fmax(d, fabs((double)lg[i] - ref[i]));
        printf("  online fp8 vs %s L=%d: max|diff|/max|ref| = %.2e\n", ref_dir, L, d / mx);
        CHECKF(d <= 5e-4 * mx, "online fp8 L=%d: max |diff| %g > 5e-4 x %g", L, d, mx);
    }
    free(ref);
    snprintf(path, sizeof path, "%s/greedy_%d.ids", ref_dir, L);
    txt = qd_test_read_file(path, NULL);
    if (txt) {
        int32_t want[16], got = 0;
        int nw = 0;
        for (char *s = txt, *e; nw < 16; s = e) {
            long v = strtol(s, &e, 10);
            if (e == s) break;
            want[nw++] = (int32_t)v;
        }
        free(txt);
        float *row = lg + (size_t)(L - 1) * V, *step = malloc(sizeof(float) * V);
        int same = nw == 16;
        for (int t = 0; t < nw; t++) {
            got = 0;
            for (int v = 1; v < V; v++)
                if (row[v] > row[got]) got = v;
            same &= got == want[t];
            qd_span d = {0, &got, 1, QD_LOGITS_LAST};
            CHECK(qd_forward(ctx, &d, 1, step) == QD_OK);
            row = step;
        }
        CHECKF(same, "online fp8 L=%d: greedy continuation differs from %s", L, ref_dir);
        free(step);
    }
    free(lg);
    qd_context_free(ctx);
}

static void online_fp8(void) {
    char err[1024] = "";
    qd_model *on = load("tests/fixtures/qwen3_5_dense_bf16", QD_LOAD_AUTO, QD_QUANTIZATION_FP8, 1, err);
    CHECKF(on != NULL, "online fp8: %s", err);
    qd_model *fx = load("tests/fixtures/quant/fp8_35_dense_f32s", QD_LOAD_AUTO, QD_QUANTIZATION_NONE, 1, err);
    CHECKF(fx != NULL, "fixture: %s", err);
    if (!on || !fx) return;
    const qd_weight *a[64], *b[64];
    const int n = linears(on, a, 64);
    CHECK(linears(fx, b, 64) == n && n > 0);
    long differ = 0, total = 0;
    for (int i = 0; i < n; i++) {
        CHECKF(a[i]->dtype == QD_DTYPE_F8_E4M3 && a[i]->scales.block_rows == 128 && a[i]->scales.block_cols == 128,
               "online weight %d is %s", i, qd_dtype_name(a[i]->dtype));
        CHECK(b[i]->dtype == QD_DTYPE_F8_E4M3 && a[i]->rows == b[i]->rows && a[i]->cols == b[i]->cols);
        float *x = dequant(a[i]), *y = dequant(b[i]);
        for (int64_t k = 0; k < a[i]->rows * a[i]->cols; k++) differ += x[k] != y[k];
        total += a[i]->rows * a[i]->cols;
        free(x);
        free(y);
    }
    printf("  online fp8: %ld of %ld weights differ from the fixture's quantizer\n", differ, total);
    CHECKF(differ == 0, "online fp8: %ld of %ld dequantized weights differ from tools/make_quant_fixtures.py's", differ,
           total);
    logits_match(on, "tests/fixtures/quant/fp8_35_dense_f32s", 1);
    logits_match(on, "tests/fixtures/quant/fp8_35_dense_f32s", 33);
    qd_model_free(on);
    qd_model_free(fx);
}

static void dummy_formats(void) {
    static const struct { qd_quantization q; qd_dtype dt; double tol; const char *name; } F[] = {
        {QD_QUANTIZATION_FP8, QD_DTYPE_F8_E4M3, 1.0 / 16, "fp8"},
        {QD_QUANTIZATION_NVFP4, QD_DTYPE_NVFP4, 0.26, "nvfp4"},
        {QD_QUANTIZATION_INT4, QD_DTYPE_INT4, 1.0 / 14 + 1e-6, "int4"}};
    const char *dirs[] = {"tests/fixtures/qwen3_5_dense_bf16", "tests/fixtures/qwen3_next_moe_bf16"};
    for (size_t d = 0; d < 2; d++) {
        char err[1024] = "";
        qd_model *ref = load(dirs[d], QD_LOAD_DUMMY, QD_QUANTIZATION_NONE, 1, err);
        CHECKF(ref != NULL, "%s", err);
        if (!ref) continue;
        for (size_t f = 0; f < 3; f++) {
            qd_model *m = load(dirs[d], QD_LOAD_DUMMY, F[f].q, 1, err);
            CHECKF(m != NULL, "dummy %s: %s", F[f].name, err);
            if (!m) continue;
            const qd_weight *a[64], *b[64];
            const int n = linears(m, a, 64);
            linears(ref, b, 64);
            double worst = 0;
            for (int i = 0; i < n; i++) {
                CHECKF(a[i]->dtype == F[f].dt, "dummy %s: weight %d is %s", F[f].name, i, qd_dtype_name(a[i]->dtype));
                float *x = dequant(a[i]), *y = dequant(b[i]);
                for (int64_t r = 0; r < a[i]->rows; r++) {
                    double amax = 0, e = 0;
                    for (int64_t c = 0; c < a[i]->cols; c++) {
                        amax = fmax(amax, fabs(y[r * a[i]->cols + c]));
                        e = fmax(e, fabs((double)x[r * a[i]->cols + c] - y[r * a[i]->cols + c]));
                    }
                    if (amax > 0) worst = fmax(worst, e / amax);
                }
                free(x);
                free(y);
            }
            printf("  dummy %-5s %s: worst |q - w| / row amax = %.3f (bound %.3f)\n", F[f].name, dirs[d], worst, F[f].tol);
            /* the experts, converted whole by one worker each: the bytes of the by-rows conversion */
            int experts = 0, differ = 0;
            for (int L = 0; L < m->cfg.n_layers; L++) {
                if (m->w.layers[L].ffn_kind == QD_FFN_DENSE) continue;
                for (int e = 0; e < m->cfg.n_experts; e++) {
                    const qd_mlp_weights *qe = &m->w.layers[L].moe.experts[e], *be = &ref->w.layers[L].moe.experts[e];
                    const qd_weight *qs[3] = {&qe->gate, &qe->up, &qe->down}, *bs[3] = {&be->gate, &be->up, &be->down};
                    for (int k = 0; k < 3; k++) {
                        qd_weight want;
                        qd_err qerr;
                        if (qd_quant_to_format(ref, F[f].q, bs[k], &want, &qerr) != QD_OK) {
                            differ++;
                            continue;
                        }
                        experts++;
                        differ += qs[k]->dtype != want.dtype || qs[k]->scales.global != want.scales.global ||
                                  memcmp(qs[k]->data, want.data, qd_weight_data_bytes(&want)) ||
                                  memcmp(qs[k]->scales.data, want.scales.data, qd_weight_scale_bytes(&want));
                    }
                }
            }
            if (d == 1) {
                printf("  dummy %-5s %s: %d expert matrices, %d differ from the by-rows conversion\n", F[f].name,
                       dirs[d], experts, differ);
                CHECKF(experts > 0 && differ == 0, "dummy %s: %d of %d expert matrices differ from the by-rows "
                       "conversion", F[f].name, differ, experts);
            }
            CHECKF(worst > 0 && worst <= F[f].tol, "dummy %s: rounding error %g of the row amax (bound %g)", F[f].name,
                   worst, F[f].tol);
            qd_context *ctx;
            qd_context_params cp = qd_context_default_params();
            cp.max_ctx = 16;
            CHECK(qd_context_create(m, &cp, &ctx) == QD_OK);
            int32_t ids[4] = {1, 2, 3, 4};
            const int V = qd_model_vocab_size(m);
            float *lg = malloc(sizeof(float) * V);
            qd_span sp = {0, ids, 4, QD_LOGITS_LAST};
            CHECK(qd_forward(ctx, &sp, 1, lg) == QD_OK);
            int finite = 1;
            for (int v = 0; v < V; v++) finite &= isfinite(lg[v]);
            CHECKF(finite, "dummy %s: non-finite logits", F[f].name);
            free(lg);
            qd_context_free(ctx);
            qd_model_free(m);
        }
        qd_model_free(ref);
    }
}

static void refused(qd_model *m, const char *err, const char *want, const char *what) {
    CHECKF(m == NULL && strstr(err, want), "%s: '%s' (want '%s')", what, err, want);
    if (m) qd_model_free(m);
    printf("  refused %s: %s\n", what, err);
}

int main(void) {
    online_fp8();
    dummy_formats();
    char err[1024] = "";
    qd_model *m = load("tests/fixtures/qwen3_5_dense_bf16", QD_LOAD_AUTO, QD_QUANTIZATION_NVFP4, 1, err);
    refused(m, err, "fp8 only", "nvfp4 of a checkpoint");
    m = load("tests/fixtures/quant/gptq1_35_dense", QD_LOAD_AUTO, QD_QUANTIZATION_FP8, 1, err);
    refused(m, err, "already quantized", "fp8 of a quantized checkpoint");
    m = load("tests/fixtures/qwen3_5_dense_bf16", QD_LOAD_AUTO, QD_QUANTIZATION_FP8, 2, err);
    refused(m, err, "tensor parallelism", "fp8 with tp=2");
    m = load("tests/fixtures/qwen3_5_dense_bf16", QD_LOAD_AUTO, (qd_quantization)9, 1, err);
    refused(m, err, "not a format", "quantization 9");
    return qd_test_finish("test_quant_online");
}
