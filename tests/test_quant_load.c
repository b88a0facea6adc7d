/* Quantized checkpoints on the CPU reference backend (fixtures: tools/make_quant_fixtures.py,
 * tests/fixtures/quant/<name>):
 *  - golden: for every format, the logits of every position of one prefill are within
 *    5e-4 x max|ref| of transformers fp32 run on the exactly dequantized weights, and the
 *    16-token greedy continuation is identical;
 *  - decoder: the stored tensors of a sample of modules (dequant.json / dequant.f32), loaded
 *    by the format parsers into the canonical layouts and dequantized by
 *    qd_weight_dequant_rows, are the values the reference used (to a float rounding);
 *  - refusals: unknown methods and layouts (and, for compressed-tensors int4 and AutoRound, every
 *    config field and tensor the format adds), configs that disagree with the tensors, and a
 *    tensor-parallel split that cuts a scale block fail with a message naming the
 *    quant_method, field, module or tensor;
 *  - fused NVFP4 experts (nvfp4mo_35_moe_fused): also split by tensor and expert parallel,
 *    under SGLang's scale names, and refused, naming the tensor, where a scale is missing,
 *    of the wrong shape or dtype, damaged, or beside a plain tensor. */
#include <jansson.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/weight.h"
#include "io/config.h"
#include "io/safetensors.h"
#include "model/model.h"
#include "model/model_quant.h"
#include "qd_fixtures.h"
#include "qd_test.h"
#include "qdelta.h"

#define QFX "tests/fixtures/quant"

static qd_model *load_split(const char *dir, int tp, int expert_parallel, char *err, size_t err_size) {
    qd_model_params mp = qd_model_default_params();
    mp.path = dir;
    mp.n_threads = 2;
    mp.backend = QD_BACKEND_CPU;
    mp.tensor_parallel_size = tp;
    mp.expert_parallel = expert_parallel;
    qd_model *m = NULL;
    if (qd_model_load(&mp, &m, err, err_size) != QD_OK) return NULL;
    return m;
}

static qd_model *load(const char *dir, int tp, char *err, size_t err_size) {
    return load_split(dir, tp, 0, err, err_size);
}

static void golden_case(qd_model *m, const char *dir, int L) {
    char path[1024];
    snprintf(path, sizeof path, "%s/prompt_%d.ids", dir, L);
    char *txt = qd_test_read_file(path, NULL);
    CHECKF(txt != NULL, "cannot read %s", path);
    if (!txt) return;
    int32_t ids[64];
    CHECKF(qd_fixture_parse_ids(txt, ids, 64) == L, "%s: expected %d ids", path, L);
    free(txt);
    const int V = qd_model_vocab_size(m);
    qd_context_params cp = qd_context_default_params();
    cp.max_ctx = L + 16;
    cp.max_batch = L;
    qd_context *ctx;
    CHECK(qd_context_create(m, &cp, &ctx) == QD_OK);
    float *logits = malloc(sizeof(float) * (size_t)L * V), *step = malloc(sizeof(float) * V);
    qd_span span = {0, ids, L, QD_LOGITS_ALL};
    CHECKF(qd_forward(ctx, &span, 1, logits) == QD_OK, "%s: forward: %s", dir, qd_context_errmsg(ctx));
    snprintf(path, sizeof path, "%s/logits_%d.f32", dir, L);
    size_t len;
    float *ref = (float *)qd_test_read_file(path, &len);
    CHECKF(ref && len == sizeof(float) * (size_t)L * V, "%s: missing or of the wrong size", path);
    if (ref && len == sizeof(float) * (size_t)L * V) {
        double mx = 0, e = 0;
        for (size_t i = 0; i < (size_t)L * V; i++) mx = fmax(mx, fabs(ref[i]));
        for (size_t i = 0; i < (size_t)L * V; i++) e = fmax(e, fabs((double)logits[i] - ref[i]));
        printf("  %-22s L=%-3d max|diff|/max|ref| = %.2e\n", dir + strlen(QFX) + 1, L, e / mx);
        CHECKF(mx > 0 && e <= 5e-4 * mx, "%s: logits differ: max |diff| %g vs 5e-4 x max|ref| = %g", path, e, 5e-4 * mx);
    }
    free(ref);
    snprintf(path, sizeof path, "%s/greedy_%d.ids", dir, L);
    txt = qd_test_read_file(path, NULL);
    CHECKF(txt != NULL, "cannot read %s", path);
    if (txt) {
        int32_t want[64], got[64];
        const int n = qd_fixture_parse_ids(txt, want, 64);
        free(txt);
        CHECKF(n == 16, "%s: %d ids", path, n);
        const float *row = logits + (size_t)(L - 1) * V;
        int same = 1;
        for (int t = 0; t < n; t++) {
            int best = 0;
            for (int v = 1; v < V; v++)
                if (row[v] > row[best]) best = v;
            got[t] = best;
            same &= got[t] == want[t];
            if (t + 1 == n) break;
            qd_span d = {0, &got[t], 1, QD_LOGITS_LAST};
            CHECK(qd_forward(ctx, &d, 1, step) == QD_OK);
            row = step;
        }
        CHECKF(same, "%s: greedy continuation differs", path);
    }
    free(step);
    free(logits);
    qd_context_free(ctx);
}

/* The module of a dequant.json entry as the loader reads it: a linear module, or part
 * `part` of expert `expert` of a fused expert tensor (entries with "expert"). */
static qd_status entry_weight(qd_model *m, const json_t *e, const char *name, int64_t rows, int64_t cols, qd_weight *w,
                              qd_err *err) {
    const json_t *expert = json_object_get(e, "expert");
    if (!expert) return qd_quant_load_linear(m, &m->cfg.quant, name, rows, cols, w, err);
    const int parts = (int)json_integer_value(json_object_get(e, "parts"));
    char module[512];
    snprintf(module, sizeof module, "%.*s", (int)(strrchr(name, '.') - name), name); /* ".../mlp.experts" */
    qd_fused_experts f;
    QD_TRY(qd_quant_load_fused(m, &m->cfg.quant, module, name, json_integer_value(json_object_get(e, "experts")),
                               parts, rows, cols, &f, err));
    *w = qd_fused_expert(&f, json_integer_value(expert), (int)json_integer_value(json_object_get(e, "part")));
    return QD_OK;
}

/* The decoder check: qdelta's parser + dequantization of the stored tensors against the
 * weights the reference ran with. */
static void decoder_check(const char *dir) {
    char path[1024];
    snprintf(path, sizeof path, "%s/dequant.json", dir);
    json_error_t je;
    json_t *list = json_load_file(path, 0, &je);
    CHECKF(json_is_array(list) && json_array_size(list) > 0, "%s: %s", path, je.text);
    if (!json_is_array(list)) return;
    snprintf(path, sizeof path, "%s/dequant.f32", dir);
    size_t len;
    float *ref = (float *)qd_test_read_file(path, &len);
    CHECKF(ref != NULL, "cannot read %s", path);
    qd_model *m = calloc(1, sizeof *m);
    qd_err err;
    qd_err_clear(&err);
    CHECKF(qd_config_load(dir, &m->cfg, &err) == QD_OK, "%s: %s", dir, err.msg);
    CHECKF(qd_st_open_dir(dir, &m->st, &err) == QD_OK, "%s: %s", dir, err.msg);
    size_t off = 0, i;
    json_t *e;
    int modules = 0;
    json_array_foreach(list, i, e) {
        const char *name = json_string_value(json_object_get(e, "name"));
        const int64_t rows = json_integer_value(json_object_get(e, "rows")), cols = json_integer_value(json_object_get(e, "cols"));
        const json_t *checked = json_object_get(e, "checked_rows");
        const size_t n_checked = json_array_size(checked);
        CHECKF(name && rows > 0 && cols > 0 && n_checked > 0, "%s: dequant.json entry %zu is malformed", dir, i);
        if (!ref || off + n_checked * (size_t)cols * sizeof(float) > len) {
            CHECKF(0, "%s: dequant.f32 is shorter than dequant.json says", dir);
            break;
        }
        qd_weight w;
        const qd_status s = entry_weight(m, e, name, rows, cols, &w, &err);
        CHECKF(s == QD_OK, "%s: %s: %s", dir, name, err.msg);
        if (s == QD_OK) {
            CHECKF(qd_weight_quantized(&w), "%s: %s was loaded as plain %s", dir, name, qd_dtype_name(w.dtype));
            float *got = malloc(sizeof(float) * (size_t)cols);
            double worst = 0;
            for (size_t k = 0; k < n_checked; k++) {
                const int64_t r = json_integer_value(json_array_get(checked, k));
                qd_weight_dequant_rows(&w, r, 1, got);
                const float *want = ref + off / sizeof(float) + k * (size_t)cols;
                for (int64_t c = 0; c < cols; c++) {
                    const double tol = 1e-6 * fabs(want[c]); /* 1/divisor folded into a multiplier: an ulp */
                    const double d = fabs((double)got[c] - want[c]);
                    if (d > tol && d > worst) worst = d;
                }
            }
            CHECKF(worst == 0, "%s: %s%s dequantizes differently from the reference (worst |diff| %g)", dir, name,
                   json_object_get(e, "expert") ? " (an expert's part)" : "", worst);
            free(got);
            modules++;
        }
        off += n_checked * (size_t)cols * sizeof(float);
    }
    CHECKF(ref && off == len, "%s: dequant.f32 has %zu bytes, dequant.json describes %zu", dir, len, off);
    printf("  %-22s decoder check: %d modules\n", dir + strlen(QFX) + 1, modules);
    free(ref);
    json_decref(list);
    qd_model_free(m);
}

/* ------------------------------------------------------------------ refusals */

static char tmp_root[] = "/tmp/qd_quant_XXXXXX";

/* A copy of fixture `src` in a fresh directory with config.json edited by `edit`. */
static const char *variant(const char *src, const char *tag, void (*edit)(json_t *cfg)) {
    static char dir[256];
    snprintf(dir, sizeof dir, "%s/%s", tmp_root, tag);
    mkdir(dir, 0700);
    const char *files[] = {"model.safetensors", "generation_config.json", "hf_quant_config.json"};
    char a[600], b[600];
    for (size_t i = 0; i < sizeof files / sizeof *files; i++) {
        snprintf(a, sizeof a, "%s/%s", src, files[i]);
        snprintf(b, sizeof b, "%s/%s", dir, files[i]);
        if (access(a, R_OK) != 0) continue;
        if (a[0] != '/') {
            char cwd[512], abs_path[1200];
            if (!getcwd(cwd, sizeof cwd)) continue;
            snprintf(abs_path, sizeof abs_path, "%s/%s", cwd, a);
            CHECK(symlink(abs_path, b) == 0);
        } else {
            CHECK(symlink(a, b) == 0);
        }
    }
    snprintf(a, sizeof a, "%s/config.json", src);
    json_error_t je;
    json_t *cfg = json_load_file(a, 0, &je);
    CHECK(cfg != NULL);
    edit(cfg);
    snprintf(b, sizeof b, "%s/config.json", dir);
    CHECK(json_dump_file(cfg, b, JSON_INDENT(1)) == 0);
    json_decref(cfg);
    return dir;
}

static void refused(const char *dir, const char *what, const char *want1, const char *want2) {
    char err[1024] = "";
    qd_model *m = load(dir, 1, err, sizeof err);
    CHECKF(m == NULL, "%s: loaded, expected a refusal", what);
    if (m) qd_model_free(m);
    CHECKF(strstr(err, want1) && (!want2 || strstr(err, want2)), "%s: message '%s' does not name '%s'%s%s", what, err,
           want1, want2 ? " and " : "", want2 ? want2 : "");
    printf("  refused %-34s %s\n", what, err);
}

static json_t *qc(json_t *cfg) { return json_object_get(cfg, "quantization_config"); }
static void set_method(json_t *cfg, const char *m) { json_object_set_new(qc(cfg), "quant_method", json_string(m)); }
static void ed_bnb(json_t *c) { set_method(c, "bitsandbytes"); }
static void ed_hqq(json_t *c) { set_method(c, "hqq"); }
static void ed_e5m2(json_t *c) { json_object_set_new(qc(c), "fmt", json_string("e5m2")); }
static void ed_no_qc(json_t *c) { json_object_del(c, "quantization_config"); }
static void ed_block64(json_t *c) { json_object_set_new(qc(c), "weight_block_size", json_pack("[ii]", 64, 128)); }
static void ed_exclude_q(json_t *c) {
    json_array_append_new(json_object_get(qc(c), "modules_to_not_convert"), json_string("mlp.down_proj"));
}
static void ed_unexclude(json_t *c) {
    json_object_set_new(qc(c), "modules_to_not_convert", json_pack("[s]", "lm_head"));
}
static void ed_gptq8(json_t *c) { json_object_set_new(qc(c), "bits", json_integer(8)); }
static void ed_gptq_fmt(json_t *c) { json_object_set_new(qc(c), "checkpoint_format", json_string("marlin")); }
static void ed_awq_gemv(json_t *c) { json_object_set_new(qc(c), "version", json_string("gemv")); }
static void ed_awq_as_gptq(json_t *c) { set_method(c, "gptq"); json_object_set_new(qc(c), "sym", json_false()); }
static void ed_ct_pack(json_t *c) { json_object_set_new(qc(c), "format", json_string("pack-quantized")); }
static void ed_plain_fp8(json_t *c) {
    json_object_set_new(c, "quantization_config",
                        json_pack("{s:s, s:[ii], s:[s]}", "quant_method", "fp8", "weight_block_size", 128, 128,
                                  "modules_to_not_convert", "lm_head"));
}
static void ed_nothing(json_t *c) { (void)c; }

/* An edit of a model.safetensors: its header (a JSON object; offsets are relative to the
 * data area, so entries may be renamed, reshaped, retyped or dropped freely) and its data. */
typedef void (*st_edit)(json_t *hdr, unsigned char *data, void *ctx);

/* A copy of fixture `src` in a fresh directory whose model.safetensors (written, not linked)
 * is the original edited by `edit`. */
static const char *rewritten(const char *src, const char *tag, st_edit edit, void *ctx) {
    const char *dir = variant(src, tag, ed_nothing);
    char a[600], b[600];
    snprintf(a, sizeof a, "%s/model.safetensors", src);
    snprintf(b, sizeof b, "%s/model.safetensors", dir);
    size_t len = 0;
    unsigned char *bytes = (unsigned char *)qd_test_read_file(a, &len);
    CHECK(bytes && len > 8 && unlink(b) == 0);
    if (!bytes || len <= 8) return dir;
    uint64_t hl;
    memcpy(&hl, bytes, 8);
    json_error_t je;
    json_t *hdr = json_loadb((const char *)bytes + 8, (size_t)hl, 0, &je);
    CHECK(hdr != NULL);
    edit(hdr, bytes + 8 + hl, ctx);
    char *text = json_dumps(hdr, JSON_COMPACT);
    const uint64_t n = text ? strlen(text) : 0;
    FILE *f = fopen(b, "wb");
    CHECK(f && text && fwrite(&n, 8, 1, f) == 1 && fwrite(text, 1, n, f) == n &&
          fwrite(bytes + 8 + hl, 1, len - 8 - hl, f) == len - 8 - hl);
    if (f) fclose(f);
    free(text);
    json_decref(hdr);
    free(bytes);
    return dir;
}

typedef struct nan_edit {
    int64_t at;
    uint8_t code;
    char *name;  /* out: the tensor edited */
    size_t size;
} nan_edit;

/* byte `at` of the first F8_E4M3 tensor set to `code` */
static void ed_first_e4m3(json_t *hdr, unsigned char *data, void *ctx) {
    nan_edit *x = ctx;
    const char *key;
    json_t *t;
    json_object_foreach(hdr, key, t) {
        const char *dt = json_string_value(json_object_get(t, "dtype"));
        if (!dt || strcmp(dt, "F8_E4M3")) continue;
        data[json_integer_value(json_array_get(json_object_get(t, "data_offsets"), 0)) + x->at] = x->code;
        snprintf(x->name, x->size, "%s", key);
        return;
    }
    CHECKF(0, "no F8_E4M3 tensor to damage");
}

/* A copy of fixture `src` whose first F8_E4M3 tensor has byte `at` set to `code`; that
 * tensor's name into `name`. */
static const char *damaged(const char *src, const char *tag, int64_t at, uint8_t code, char *name, size_t size) {
    nan_edit x = {at, code, name, size};
    return rewritten(src, tag, ed_first_e4m3, &x);
}

static void refusals(void) {
    const char *fp8 = QFX "/fp8_35_dense_bf16s", *gptq = QFX "/gptq1_35_dense", *awq = QFX "/awq_35_dense",
               *ct = QFX "/ctfp8_35_dense";
    refused(variant(fp8, "bnb", ed_bnb), "bitsandbytes", "quant_method 'bitsandbytes'", NULL);
    refused(variant(fp8, "hqq", ed_hqq), "hqq", "quant_method 'hqq'", NULL);
    refused(variant(fp8, "e5m2", ed_e5m2), "fp8 fmt e5m2", "fmt 'e5m2'", NULL);
    refused(variant(fp8, "noqc", ed_no_qc), "quantized tensors, no config", "no quantization_config", ".weight'");
    refused(variant(fp8, "block64", ed_block64), "scale grid of another block size", "weight_scale_inv'", "shape");
    refused(variant(fp8, "excl", ed_exclude_q), "config excludes a quantized module", "mlp.down_proj.weight'",
            "not converted");
    refused(variant(fp8, "unexcl", ed_unexclude), "plain module not excluded", "stored unquantized", "linear_attn.in_proj_");
    refused(variant(gptq, "gptq8", ed_gptq8), "gptq 8-bit", "bits 8", NULL);
    refused(variant(gptq, "gptqfmt", ed_gptq_fmt), "gptq checkpoint_format", "checkpoint_format 'marlin'", NULL);
    refused(variant(awq, "gemv", ed_awq_gemv), "awq gemv packing", "awq version 'gemv'", NULL);
    refused(variant(awq, "awqgptq", ed_awq_as_gptq), "awq tensors read as gptq", ".qweight'", "shape");
    refused(variant(ct, "ctpack", ed_ct_pack), "pack-quantized float weights", "weights type 'float'",
            "pack-quantized weights must be integers");
    refused(variant("tests/fixtures/qwen3_5_dense_bf16", "plainfp8", ed_plain_fp8), "plain checkpoint, fp8 config",
            "stored unquantized", "fp8");
    /* an e4m3 NaN code in a weight (a damaged file): refused, naming the tensor */
    char nan_tensor[256] = "";
    const char *nan_dir = damaged(fp8, "nan", 77, 0xff, nan_tensor, sizeof nan_tensor);
    refused(nan_dir, "an e4m3 NaN code in a weight", nan_tensor, "element 77 is an e4m3 NaN code");
    /* a split whose column cut falls inside a 128-wide scale block (o_proj: 128 columns in two) */
    char err[1024] = "";
    qd_model *m = load(variant(fp8, "tp2", ed_nothing), 2, err, sizeof err);
    CHECKF(m == NULL && strstr(err, "tensor '") && strstr(err, "cuts its 128-column scale blocks"),
           "tp=2 over FP8 block-128 with 64-column halves: '%s'", err);
    printf("  refused %-34s %s\n", "tp split inside a block", err);
    if (m) qd_model_free(m);
    /* an FP8 e5m2 tensor is refused by the safetensors reader, naming it */
    const char hdr[] = "{\"w\":{\"dtype\":\"F8_E5M2\",\"shape\":[2,2],\"data_offsets\":[0,4]}}";
    unsigned char buf[8 + sizeof hdr + 4] = {0};
    const uint64_t n = sizeof hdr - 1;
    memcpy(buf, &n, 8);
    memcpy(buf + 8, hdr, n);
    qd_safetensors *st = NULL;
    qd_err e;
    qd_err_clear(&e);
    CHECK(qd_st_open_memory(buf, 8 + n + 4, "e5m2.safetensors", &st, &e) != QD_OK);
    CHECKF(strstr(e.msg, "'w'") && strstr(e.msg, "F8_E5M2"), "e5m2 tensor: '%s'", e.msg);
    if (st) qd_st_close(st);
}

/* ------------------------------------------------------------------ compressed-tensors int4 */

#define CTI_SYM QFX "/ctint4_35_dense"   /* symmetric, group 32, actorder group */
#define CTI_ASYM QFX "/ctint4_next_moe"  /* zero points, group 64 */

static json_t *ct_weights(json_t *c) {
    json_t *groups = json_object_get(qc(c), "config_groups");
    return json_object_get(json_object_iter_value(json_object_iter(groups)), "weights");
}
static void ed_cti_bits8(json_t *c) { json_object_set_new(ct_weights(c), "num_bits", json_integer(8)); }
static void ed_cti_tensor(json_t *c) { json_object_set_new(ct_weights(c), "strategy", json_string("tensor")); }
static void ed_cti_group5(json_t *c) { json_object_set_new(ct_weights(c), "group_size", json_integer(5)); }
static void ed_cti_order(json_t *c) { json_object_set_new(ct_weights(c), "actorder", json_string("dynamic")); }
static void ed_cti_sym(json_t *c) { json_object_set_new(ct_weights(c), "symmetric", json_true()); }
static void ed_cti_asym(json_t *c) { json_object_set_new(ct_weights(c), "symmetric", json_false()); }
static void ed_cti_w4a8(json_t *c) {
    json_t *groups = json_object_get(qc(c), "config_groups");
    json_object_set_new(json_object_iter_value(json_object_iter(groups)), "input_activations",
                        json_pack("{s:i, s:s, s:s, s:b}", "num_bits", 8, "type", "int", "strategy", "token", "dynamic", 1));
}

/* The first tensor whose name ends in ctx's suffix: dropped, retyped, or its first int64 raised by one. */
typedef struct suffix_edit {
    const char *suffix, *action;
    char name[256]; /* out: the tensor edited */
} suffix_edit;

static void ed_suffix(json_t *hdr, unsigned char *data, void *ctx) {
    suffix_edit *x = ctx;
    const char *key;
    json_t *t;
    json_object_foreach(hdr, key, t) {
        const size_t n = strlen(key), k = strlen(x->suffix);
        if (n < k || strcmp(key + n - k, x->suffix)) continue;
        snprintf(x->name, sizeof x->name, "%s", key);
        if (!strcmp(x->action, "drop")) {
            json_object_del(hdr, key);
        } else if (!strcmp(x->action, "u8")) {
            json_object_set_new(t, "dtype", json_string("U8"));
            json_t *shape = json_object_get(t, "shape");
            json_array_set_new(shape, 1, json_integer(4 * json_integer_value(json_array_get(shape, 1))));
        } else { /* "bump" */
            int64_t v;
            unsigned char *p = data + json_integer_value(json_array_get(json_object_get(t, "data_offsets"), 0));
            memcpy(&v, p, 8);
            v++;
            memcpy(p, &v, 8);
        }
        return;
    }
    CHECKF(0, "no tensor ending in '%s' to edit", x->suffix);
}

static void ed_cti_regex(json_t *c) {
    json_array_append_new(json_object_get(qc(c), "ignore"), json_string("re:.*mlp\\.gate_p+++++++++++++++roj"));
}

static void ct_int4_refusals(void) {
    refused(variant(CTI_SYM, "ctire", ed_cti_regex), "a pattern of stacked repetitions", "gate_p++",
            "stacked repetitions");
    refused(variant(CTI_SYM, "cti8", ed_cti_bits8), "pack-quantized int8 weights", "num_bits 8", "4-bit");
    refused(variant(CTI_SYM, "ctit", ed_cti_tensor), "pack-quantized tensor strategy", "strategy 'tensor'", NULL);
    refused(variant(CTI_SYM, "ctig", ed_cti_group5), "pack-quantized odd group", "group_size 5", NULL);
    refused(variant(CTI_SYM, "ctio", ed_cti_order), "pack-quantized actorder dynamic", "actorder 'dynamic'", NULL);
    refused(variant(CTI_SYM, "ctia", ed_cti_w4a8), "pack-quantized W4A8", "input_activations", "W4A8");
    refused(variant(CTI_SYM, "ctiz", ed_cti_asym), "asymmetric config, no zero points", "missing tensor",
            ".weight_zero_point'");
    refused(variant(CTI_ASYM, "ctis", ed_cti_sym), "symmetric config, zero points", ".weight_zero_point'",
            "says symmetric");
    suffix_edit x = {.suffix = ".weight_g_idx", .action = "drop"};
    refused(rewritten(CTI_SYM, "ctinog", ed_suffix, &x), "actorder group, no g_idx", "missing tensor",
            ".weight_g_idx' (actorder group)");
    suffix_edit y = {.suffix = ".weight_packed", .action = "u8"};
    refused(rewritten(CTI_SYM, "ctiu8", ed_suffix, &y), "int4 codes as U8", y.name, "dtype U8");
    suffix_edit z = {.suffix = ".weight_shape", .action = "bump"};
    refused(rewritten(CTI_ASYM, "ctishape", ed_suffix, &z), "weight_shape of another size", z.name, "the model needs");
}

/* ------------------------------------------------------------------ GPTQModel's dynamic rules */

#define GPTQ_SYM QFX "/gptq1_35_dense"

static void ed_dyn_negative(json_t *c) { /* modules_to_not_convert said as negative rules instead */
    json_object_del(qc(c), "modules_to_not_convert");
    json_object_set_new(qc(c), "dynamic", json_pack("{s:{}, s:{}}", "-:.*in_proj_[ab]$", "-:lm_head$"));
}
static void ed_dyn_same(json_t *c) {
    json_object_set_new(qc(c), "dynamic", json_pack("{s:{s:i, s:i}}", "+:.*mlp\\..*", "bits", 4, "group_size", 32));
}
static void ed_dyn_bits(json_t *c) {
    json_object_set_new(qc(c), "dynamic", json_pack("{s:{s:i}}", "+:.*down_proj", "bits", 8));
}
static void ed_dyn_quantized(json_t *c) { /* a negative rule over modules the file stores quantized */
    json_object_set_new(qc(c), "dynamic", json_pack("{s:{}}", "-:.*mlp\\.down_proj"));
}

static void gptq_dynamic(void) {
    const char *dirs[2] = {variant(GPTQ_SYM, "dynneg", ed_dyn_negative), NULL};
    char kept[256];
    snprintf(kept, sizeof kept, "%s", dirs[0]);
    dirs[0] = kept;
    dirs[1] = variant(GPTQ_SYM, "dynsame", ed_dyn_same);
    for (int i = 0; i < 2; i++) {
        char err[1024] = "";
        qd_model *m = load(dirs[i], 1, err, sizeof err);
        CHECKF(m != NULL, "gptq dynamic variant %d: %s", i, err);
        if (!m) continue;
        printf("  gptq dynamic rules (%s):\n", i ? "a rule restating the scheme" : "negative rules for the exclusions");
        golden_case(m, GPTQ_SYM, 33);
        qd_model_free(m);
    }
    refused(variant(GPTQ_SYM, "dynbits", ed_dyn_bits), "gptq dynamic 8-bit rule", "'+:.*down_proj'",
            "scheme of their own");
    refused(variant(GPTQ_SYM, "dynq", ed_dyn_quantized), "gptq dynamic negative over int4", "mlp.down_proj.qweight'",
            "not converted");
}

/* ------------------------------------------------------------------ AutoRound */

#define AR_GPTQ QFX "/ar_next_gptq"  /* auto_round:auto_gptq, extra_config leaves routers and shared experts */

static void ed_ar_set(json_t *c, const char *k, json_t *v) { json_object_set_new(qc(c), k, v); }
static void ed_ar_pack(json_t *c) { ed_ar_set(c, "packing_format", json_string("auto_round")); }
static void ed_ar_nvfp(json_t *c) { ed_ar_set(c, "data_type", json_string("nv_fp")); }
static void ed_ar_bits2(json_t *c) { ed_ar_set(c, "bits", json_integer(2)); }
static void ed_ar_noblock(json_t *c) { json_object_del(qc(c), "block_name_to_quantize"); }
static void ed_ar_noblocks(json_t *c) { ed_ar_set(c, "block_name_to_quantize", json_array()); }
static void ed_ar_mixed(json_t *c) {
    json_object_set_new(json_object_get(qc(c), "extra_config"), "model.layers.1.mlp.down_proj",
                        json_pack("{s:i, s:s}", "bits", 8, "data_type", "int"));
}
static void ed_ar_16(json_t *c) {
    json_object_set_new(json_object_get(qc(c), "extra_config"), "model.layers.1.mlp.down_proj",
                        json_pack("{s:i, s:s}", "bits", 16, "data_type", "fp"));
}

static void autoround_refusals(void) {
    refused(variant(AR_GPTQ, "arpack", ed_ar_pack), "auto-round bare packing", "packing_format 'auto_round'", NULL);
    refused(variant(AR_GPTQ, "arnvfp", ed_ar_nvfp), "auto-round nv_fp data", "data_type 'nv_fp'", NULL);
    refused(variant(AR_GPTQ, "arbits", ed_ar_bits2), "auto-round 2 bits", "bits 2", NULL);
    refused(variant(AR_GPTQ, "armixed", ed_ar_mixed), "auto-round 8-bit module", "model.layers.1.mlp.down_proj",
            "scheme of its own");
    refused(variant(AR_GPTQ, "ar16", ed_ar_16), "auto-round 16-bit module stored int4", "mlp.down_proj.qweight'",
            "not converted");
    refused(variant(AR_GPTQ, "arempty", ed_ar_noblocks), "auto-round with an empty block list",
            "block_name_to_quantize names no block", NULL);
}

/* Without block_name_to_quantize AutoRound's loader quantizes the decoder layers (the text
 * model's and the composite spelling's): lm_head and the rest stay as stored, and both
 * fixtures load as with their block names. */
static void autoround_default_blocks(void) {
    static const char *src[2] = {AR_GPTQ, QFX "/ar_35moe_awq"};
    for (int i = 0; i < 2; i++) {
        char err[1024] = "", dir[256];
        snprintf(dir, sizeof dir, "%s", variant(src[i], i ? "arnoblock35" : "arnoblock", ed_ar_noblock));
        qd_model *m = load(dir, 1, err, sizeof err);
        CHECKF(m != NULL, "%s without block_name_to_quantize: %s", src[i], err);
        if (!m) continue;
        printf("  %s without block_name_to_quantize:\n", src[i]);
        golden_case(m, src[i], 33);
        qd_model_free(m);
    }
}

/* ------------------------------------------------------------------ fused NVFP4 experts */

#define FUSED_FX QFX "/nvfp4mo_35_moe_fused"
#define L0_EXPERTS "model.language_model.layers.0.mlp.experts"

static json_t *entry(json_t *hdr, const char *name) {
    json_t *t = json_object_get(hdr, name);
    CHECKF(t != NULL, "no tensor '%s' in the fixture", name);
    return t ? t : json_object();
}

static void ed_global_shape(json_t *h, unsigned char *d, void *c) {
    (void)d, (void)c;
    json_object_set_new(entry(h, L0_EXPERTS ".gate_up_proj_weight_scale_2"), "shape", json_pack("[ii]", 2, 8));
}
static void ed_no_block(json_t *h, unsigned char *d, void *c) {
    (void)d, (void)c;
    json_object_del(h, L0_EXPERTS ".gate_up_proj_weight_scale");
}
static void ed_no_global(json_t *h, unsigned char *d, void *c) {
    (void)d, (void)c;
    json_object_del(h, L0_EXPERTS ".down_proj_weight_scale_2");
}
static void ed_block_dtype(json_t *h, unsigned char *d, void *c) {
    (void)d, (void)c;
    json_object_set_new(entry(h, L0_EXPERTS ".gate_up_proj_weight_scale"), "dtype", json_string("U8"));
}
static void ed_fp8_fused(json_t *h, unsigned char *d, void *c) {
    (void)d, (void)c;
    json_object_set_new(entry(h, L0_EXPERTS ".gate_up_proj"), "dtype", json_string("F8_E4M3"));
}
static int64_t data_offset(json_t *h, const char *name) {
    return json_integer_value(json_array_get(json_object_get(entry(h, name), "data_offsets"), 0));
}
/* the up global of expert 1 (element 3 of [E, 2]) set to 0 */
static void ed_zero_global(json_t *h, unsigned char *d, void *c) {
    (void)c;
    const float zero = 0.0f;
    memcpy(d + data_offset(h, L0_EXPERTS ".gate_up_proj_weight_scale_2") + 3 * sizeof(float), &zero, sizeof zero);
}
static void ed_nan_block(json_t *h, unsigned char *d, void *c) {
    (void)c;
    d[data_offset(h, L0_EXPERTS ".down_proj_weight_scale") + 5] = 0x7f;
}
/* an empty tensor beside another (empty tensors own no bytes, so none overlaps) */
static void add_empty(json_t *h, const char *name) {
    json_object_set_new(h, name, json_pack("{s:s, s:[i], s:[ii]}", "dtype", "F32", "shape", 0, "data_offsets", 0, 0));
}
static void ed_both_namings(json_t *h, unsigned char *d, void *c) {
    (void)d, (void)c;
    add_empty(h, L0_EXPERTS ".gate_up_proj_scale_2");
}
static void ed_plain_with_scale(json_t *h, unsigned char *d, void *c) {
    (void)d, (void)c;
    add_empty(h, L0_EXPERTS ".gate_up_proj_weight_scale_2");
}
/* every scale under SGLang PR 18965's names: _scale, _scale_2, .input_scale */
static void ed_sglang_names(json_t *h, unsigned char *d, void *c) {
    (void)d, (void)c;
    static const char *const from[] = {"_weight_scale_2", "_weight_scale", "_input_scale"},
                             *const to[] = {"_scale_2", "_scale", ".input_scale"};
    json_t *out = json_object();
    const char *key;
    json_t *t;
    int renamed = 0;
    json_object_foreach(h, key, t) {
        char name[512];
        snprintf(name, sizeof name, "%s", key);
        for (int i = 0; i < 3; i++) {
            char *at = strstr(name, from[i]);
            if (at && !strcmp(at, from[i])) {
                snprintf(at, sizeof name - (size_t)(at - name), "%s", to[i]);
                renamed++;
                break;
            }
        }
        json_object_set(out, name, t);
    }
    CHECKF(renamed == 4 * 6, "renamed %d scales, expected 24 (4 layers x 2 tensors x 3)", renamed);
    json_object_clear(h);
    json_object_update(h, out);
    json_decref(out);
}
static void ed_exclude_experts(json_t *c) {
    json_array_append_new(json_object_get(qc(c), "exclude_modules"), json_string("*mlp.experts"));
}

static void fused_refusals(void) {
    refused(rewritten(FUSED_FX, "f_gshape", ed_global_shape, NULL), "fused global of another shape",
            "gate_up_proj_weight_scale_2' has shape [2, 8]", "[E, 2] (gate, up)");
    refused(rewritten(FUSED_FX, "f_noblock", ed_no_block, NULL), "fused block scale missing",
            "block scale '" L0_EXPERTS ".gate_up_proj_weight_scale' (or", "is missing");
    refused(rewritten(FUSED_FX, "f_noglobal", ed_no_global, NULL), "fused global missing",
            "global scale '" L0_EXPERTS ".down_proj_weight_scale_2' (or", "is missing");
    refused(rewritten(FUSED_FX, "f_bdtype", ed_block_dtype, NULL), "fused block scale of dtype U8",
            L0_EXPERTS ".gate_up_proj_weight_scale' has dtype U8", "F8_E4M3");
    refused(rewritten(FUSED_FX, "f_zero", ed_zero_global, NULL), "fused global of 0",
            L0_EXPERTS ".gate_up_proj_weight_scale_2': element 3 is 0", "must be positive");
    refused(rewritten(FUSED_FX, "f_nan", ed_nan_block, NULL), "fused block scale with a NaN code",
            L0_EXPERTS ".down_proj_weight_scale': element 5 is an e4m3 NaN code", NULL);
    refused(rewritten(FUSED_FX, "f_both", ed_both_namings, NULL), "fused global under two names",
            L0_EXPERTS ".gate_up_proj_weight_scale_2' and '" L0_EXPERTS ".gate_up_proj_scale_2'", "both present");
    refused(rewritten(FUSED_FX, "f_fp8", ed_fp8_fused, NULL), "fused FP8 experts (no published layout)",
            L0_EXPERTS ".gate_up_proj' has dtype F8_E4M3", "ModelOpt NVFP4");
    refused(rewritten("tests/fixtures/qwen3_5_moe_fused_bf16", "f_plain", ed_plain_with_scale, NULL),
            "plain fused experts with a scale beside",
            L0_EXPERTS ".gate_up_proj_weight_scale_2' is a quantization scale",
            "'" L0_EXPERTS ".gate_up_proj' is stored as plain BF16");
    const char *excl = variant(FUSED_FX, "f_excl", ed_exclude_experts);
    char path[600];
    snprintf(path, sizeof path, "%s/hf_quant_config.json", excl);
    CHECK(unlink(path) == 0); /* config.json's quantization_config, edited, is then the scheme */
    refused(excl, "config excludes the quantized experts", L0_EXPERTS ".gate_up_proj' is quantized",
            "module '" L0_EXPERTS "' as not converted");
    /* tp = 4 cuts down_proj's 32 columns into 8: inside its 16-column scale blocks */
    char err[1024] = "";
    qd_model *m = load(FUSED_FX, 4, err, sizeof err);
    CHECKF(m == NULL && strstr(err, "tensor '" L0_EXPERTS ".down_proj', expert 0") &&
               strstr(err, "cuts its 16-column scale blocks"),
           "tp=4 over fused NVFP4 experts with 8-column down_proj slices: '%s'", err);
    printf("  refused %-34s %s\n", "fused tp split inside a block", err);
    if (m) qd_model_free(m);
}

/* The fused fixture loaded under SGLang's scale names, and split by tensor (tp = 2: every
 * expert's 32 rows in halves, down_proj's columns at 16) and by expert (tp = 2 expert
 * parallel: four whole experts a rank): the same logits and greedy continuation. */
static void fused_variants(void) {
    char err[1024] = "";
    qd_model *m = load(rewritten(FUSED_FX, "f_sglang", ed_sglang_names, NULL), 1, err, sizeof err);
    CHECKF(m != NULL, "fused experts under SGLang's scale names: %s", err);
    if (m) {
        printf("  SGLang scale names (_scale, _scale_2, .input_scale):\n");
        golden_case(m, FUSED_FX, 33);
        qd_model_free(m);
    }
    for (int ep = 0; ep < 2; ep++) {
        m = load_split(FUSED_FX, 2, ep, err, sizeof err);
        CHECKF(m != NULL, "%s tp=2%s: %s", FUSED_FX, ep ? " expert parallel" : "", err);
        if (!m) continue;
        printf("  tp=2%s:\n", ep ? " expert parallel" : "");
        golden_case(m, FUSED_FX, 1);
        golden_case(m, FUSED_FX, 33);
        qd_model_free(m);
    }
}

int main(void) {
    static const char *const names[] = {"fp8_next_moe", "fp8_35_dense_bf16s", "fp8_35_moe_f16s", "ctfp8_35_dense",
                                        "nvfp4mo_next_moe", "nvfp4ct_35_dense", "nvfp4mo_35_moe_fused",
                                        "gptq1_35_dense", "gptq2_next_moe", "gptqc_35_moe", "awq_35_dense",
                                        "ctint4_35_dense", "ctint4_next_moe", "ctint4c_35_moe", "llmc_next_asym16",
                                        "llmc_35moe_sym_ch", "ar_next_gptq", "ar_35moe_awq"};
    for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
        char dir[512], err[1024] = "";
        snprintf(dir, sizeof dir, "%s/%s", QFX, names[i]);
        qd_model *m = load(dir, 1, err, sizeof err);
        CHECKF(m != NULL, "%s: load failed: %s", dir, err);
        if (m) {
            golden_case(m, dir, 1);
            golden_case(m, dir, 33);
            qd_model_free(m);
        }
        decoder_check(dir);
    }
    /* tensor parallel over per-channel FP8 (any column cut keeps the row's scale) and over
     * NVFP4 / GPTQ where the cuts fall on group boundaries or inside a whole-row group */
    static const char *const tp_ok[] = {"ctfp8_35_dense", "gptqc_35_moe", "ctint4c_35_moe"};
    for (size_t i = 0; i < sizeof tp_ok / sizeof *tp_ok; i++) {
        char dir[512], err[1024] = "";
        snprintf(dir, sizeof dir, "%s/%s", QFX, tp_ok[i]);
        qd_model *m = load(dir, 2, err, sizeof err);
        CHECKF(m != NULL, "%s tp=2: %s", dir, err);
        if (m) {
            printf("  tp=2:\n");
            golden_case(m, dir, 33);
            qd_model_free(m);
        }
    }
    CHECK(mkdtemp(tmp_root) != NULL);
    fused_variants();
    refusals();
    ct_int4_refusals();
    autoround_refusals();
    autoround_default_blocks();
    gptq_dynamic();
    fused_refusals();
    return qd_test_finish("test_quant_load");
}
