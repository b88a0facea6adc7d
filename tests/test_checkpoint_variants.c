/* Metamorphic checkpoint tests: every layout transformers can produce for the same
 * weights must give the same logits. Each variant is derived at test time from a golden
 * fixture (tests/fixtures/<name>): the tensors are read with the project's safetensors
 * reader and written back with a small writer below (8-byte little-endian header length,
 * JSON header with data_offsets, data area), config.json is edited with jansson, and the
 * library's logits over prompt_65.ids for the variant are compared with those of the
 * original fixture (or, for dtype variants, of an F32 copy of the same rounded weights).
 * Negative variants must fail to load with a message naming the culprit. */
#include <jansson.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "base/dtype.h"
#include "io/safetensors.h"
#include "qd_test.h"
#include "qdelta.h"

#define FX "tests/fixtures/"
#define PROMPT "prompt_65.ids"
#define MAX_IDS 256

/* ------------------------------------------------------------ tensors in memory */

typedef struct tn {
    char *name;
    qd_dtype dtype;
    int ndim;
    int64_t shape[QD_ST_MAX_DIMS];
    int64_t n;           /* elements */
    unsigned char *data; /* owned */
} tn;

typedef struct ckpt {
    tn *t;
    int n, cap;
} ckpt;

static size_t tn_bytes(const tn *t) { return (size_t)t->n * qd_dtype_size(t->dtype); }

static tn *ck_add(ckpt *c, const char *name, qd_dtype dt, int ndim, const int64_t *shape, const void *data) {
    if (c->n == c->cap) {
        c->cap = c->cap ? 2 * c->cap : 64;
        c->t = realloc(c->t, sizeof *c->t * (size_t)c->cap);
    }
    tn *t = &c->t[c->n++];
    memset(t, 0, sizeof *t);
    t->name = strdup(name);
    t->dtype = dt;
    t->ndim = ndim;
    t->n = 1;
    for (int i = 0; i < ndim; i++) t->n *= (t->shape[i] = shape[i]);
    t->data = calloc(1, tn_bytes(t) + 1);
    if (data) memcpy(t->data, data, tn_bytes(t));
    return t;
}

static tn *ck_find(ckpt *c, const char *name) {
    for (int i = 0; i < c->n; i++)
        if (strcmp(c->t[i].name, name) == 0) return &c->t[i];
    return NULL;
}

static void ck_remove(ckpt *c, const char *name) {
    tn *t = ck_find(c, name);
    if (!t) return;
    free(t->name);
    free(t->data);
    *t = c->t[--c->n];
}

static void ck_free(ckpt *c) {
    for (int i = 0; i < c->n; i++) {
        free(c->t[i].name);
        free(c->t[i].data);
    }
    free(c->t);
    memset(c, 0, sizeof *c);
}

static int ck_read(const char *dir, ckpt *c) {
    qd_safetensors *st;
    qd_err err;
    qd_err_clear(&err);
    memset(c, 0, sizeof *c);
    if (qd_st_open_dir(dir, &st, &err) != QD_OK) {
        fprintf(stderr, "%s: %s\n", dir, err.msg);
        return -1;
    }
    for (int i = 0; i < qd_st_count(st); i++) {
        const qd_st_tensor *s = qd_st_at(st, i);
        ck_add(c, s->name, s->dtype, s->ndim, s->shape, s->data);
    }
    qd_st_close(st);
    return 0;
}

/* Renames every tensor whose name starts with `from` (except `keep`-prefixed ones). */
static void ck_reprefix(ckpt *c, const char *from, const char *to, const char *keep) {
    for (int i = 0; i < c->n; i++) {
        const char *nm = c->t[i].name;
        if (strncmp(nm, from, strlen(from)) != 0 || (keep && strncmp(nm, keep, strlen(keep)) == 0)) continue;
        char buf[512];
        snprintf(buf, sizeof buf, "%s%s", to, nm + strlen(from));
        free(c->t[i].name);
        c->t[i].name = strdup(buf);
    }
}

/* ------------------------------------------------------------ safetensors writer */

typedef struct wopts {
    int shards;      /* >1: model-0000i-of-0000N.safetensors + index */
    int reverse;     /* write the tensors in reverse order */
    int metadata;    /* add a __metadata__ object */
    int no_pad;      /* header not padded to 8 bytes (pre-0.3 safetensors writers) */
} wopts;

static void write_file(const char *path, tn **list, int n, const wopts *o) {
    json_t *h = json_object();
    if (o->metadata)
        json_object_set_new(h, "__metadata__", json_pack("{s:s,s:s}", "format", "pt", "written_by", "qdelta tests"));
    size_t off = 0;
    for (int i = 0; i < n; i++) {
        json_t *e = json_object(), *sh = json_array();
        json_object_set_new(e, "dtype", json_string(qd_dtype_name(list[i]->dtype)));
        for (int d = 0; d < list[i]->ndim; d++) json_array_append_new(sh, json_integer(list[i]->shape[d]));
        json_object_set_new(e, "shape", sh);
        size_t end = off + tn_bytes(list[i]);
        json_object_set_new(e, "data_offsets", json_pack("[I,I]", (json_int_t)off, (json_int_t)end));
        off = end;
        json_object_set_new(h, list[i]->name, e);
    }
    char *txt = json_dumps(h, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(h);
    size_t hl = strlen(txt);
    size_t padded = o->no_pad ? (hl % 8 ? hl : hl + 1) : (hl + 7) / 8 * 8; /* no_pad: odd offset */
    FILE *f = fopen(path, "wb");
    unsigned char len8[8];
    for (int i = 0; i < 8; i++) len8[i] = (unsigned char)((uint64_t)padded >> (8 * i));
    fwrite(len8, 1, 8, f);
    fwrite(txt, 1, hl, f);
    for (size_t i = hl; i < padded; i++) fputc(' ', f);
    for (int i = 0; i < n; i++) fwrite(list[i]->data, 1, tn_bytes(list[i]), f);
    fclose(f);
    free(txt);
}

static void write_ckpt(const char *dir, ckpt *c, const wopts *o) {
    tn **list = malloc(sizeof *list * (size_t)c->n);
    for (int i = 0; i < c->n; i++) list[i] = &c->t[o->reverse ? c->n - 1 - i : i];
    int ns = o->shards > 1 ? o->shards : 1;
    char path[600], fname[64];
    if (ns == 1) {
        snprintf(path, sizeof path, "%s/model.safetensors", dir);
        write_file(path, list, c->n, o);
        free(list);
        return;
    }
    json_t *wm = json_object();
    size_t total = 0;
    for (int s = 0; s < ns; s++) {
        int a = c->n * s / ns, b = c->n * (s + 1) / ns;
        snprintf(fname, sizeof fname, "model-%05d-of-%05d.safetensors", s + 1, ns);
        snprintf(path, sizeof path, "%s/%s", dir, fname);
        write_file(path, list + a, b - a, o);
        for (int i = a; i < b; i++) {
            json_object_set_new(wm, list[i]->name, json_string(fname));
            total += tn_bytes(list[i]);
        }
    }
    json_t *idx = json_pack("{s:{s:I},s:o}", "metadata", "total_size", (json_int_t)total, "weight_map", wm);
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    json_dump_file(idx, path, JSON_INDENT(2));
    json_decref(idx);
    free(list);
}

/* ------------------------------------------------------------ running the library */

static char tmp_root[256];
static int n_dirs = 0;

static int read_ids(const char *fixture, int32_t *ids) {
    char p[512];
    snprintf(p, sizeof p, FX "%s/" PROMPT, fixture);
    char *s = qd_test_read_file(p, NULL);
    int n = 0;
    for (char *q = s, *e; q && n < MAX_IDS; q = e) {
        long v = strtol(q, &e, 10);
        if (e == q) break;
        ids[n++] = (int32_t)v;
    }
    free(s);
    return n;
}

/* Loads dir and returns malloc'd logits [n][V] (NULL on failure; err holds why). */
static float *run_logits(const char *dir, const int32_t *ids, int n, char *err, size_t errsz, qd_model **keep) {
    qd_model_params mp = qd_model_default_params();
    mp.path = dir;
    mp.n_threads = 2;
    qd_model *m;
    err[0] = 0;
    if (qd_model_load(&mp, &m, err, errsz) != QD_OK) return NULL;
    const int V = qd_model_vocab_size(m);
    qd_context_params cp = qd_context_default_params();
    cp.max_seqs = 1;
    cp.max_ctx = n;
    cp.max_batch = n;
    qd_context *ctx = NULL;
    float *out = malloc(sizeof(float) * (size_t)n * (size_t)V);
    qd_span sp = {0, ids, n, QD_LOGITS_ALL};
    if (qd_context_create(m, &cp, &ctx) != QD_OK || qd_forward(ctx, &sp, 1, out) != QD_OK) {
        snprintf(err, errsz, "forward: %s", ctx ? qd_context_errmsg(ctx) : qd_model_errmsg(m));
        free(out);
        out = NULL;
    }
    qd_context_free(ctx);
    if (keep && out) *keep = m;
    else qd_model_free(m);
    return out;
}

#define VOCAB 320

typedef struct base { char fixture[64]; int32_t ids[MAX_IDS]; int n; float *logits; } base;
static base bases[16];
static int n_bases = 0;

static base *get_base(const char *fixture) {
    for (int i = 0; i < n_bases; i++)
        if (!strcmp(bases[i].fixture, fixture)) return &bases[i];
    base *b = &bases[n_bases++];
    snprintf(b->fixture, sizeof b->fixture, "%s", fixture);
    b->n = read_ids(fixture, b->ids);
    char dir[512], err[1024];
    snprintf(dir, sizeof dir, FX "%s", fixture);
    b->logits = run_logits(dir, b->ids, b->n, err, sizeof err, NULL);
    CHECKF(b->logits != NULL && b->n == 65, "%s: baseline failed (%d ids): %s", fixture, b->n, err);
    return b;
}

/* max |a-b| / max |a|, printed as one line per variant. */
static double compare(const char *label, const float *ref, const float *got, size_t n, double tol) {
    double mx = 0, d = 0;
    for (size_t i = 0; i < n; i++) {
        mx = fmax(mx, fabs(ref[i]));
        double e = fabs((double)ref[i] - got[i]);
        if (!(e <= d)) d = e;
    }
    printf("  %-58s max|diff| %.3g (rel %.3g)\n", label, d, mx > 0 ? d / mx : d);
    CHECKF(d <= tol * mx, "%s: logits differ by %g (tolerance %g x max|ref| %g)", label, d, tol, mx);
    return d;
}

/* ------------------------------------------------------------ building variants */

typedef void (*ck_fn)(ckpt *c);
typedef void (*cfg_fn)(json_t *root);

static void copy_file(const char *from, const char *to) {
    size_t len;
    char *b = qd_test_read_file(from, &len);
    if (!b) return;
    FILE *f = fopen(to, "wb");
    fwrite(b, 1, len, f);
    fclose(f);
    free(b);
}

/* A fresh directory holding the fixture transformed by ckf/cfg and written with o. */
static void make_variant(const char *fixture, ck_fn ckf, cfg_fn cfg, const wopts *o, char *dir, size_t dn) {
    snprintf(dir, dn, "%s/v%03d", tmp_root, n_dirs++);
    mkdir(dir, 0755);
    char src[512], dst[600];
    snprintf(src, sizeof src, FX "%s", fixture);
    ckpt c;
    CHECKF(ck_read(src, &c) == 0, "%s: cannot read", src);
    if (ckf) ckf(&c);
    write_ckpt(dir, &c, o);
    ck_free(&c);
    snprintf(src, sizeof src, FX "%s/config.json", fixture);
    json_error_t je;
    json_t *root = json_load_file(src, JSON_PRESERVE_ORDER, &je);
    CHECKF(root != NULL, "%s: %s", src, je.text);
    if (cfg) cfg(root);
    snprintf(dst, sizeof dst, "%s/config.json", dir);
    json_dump_file(root, dst, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    json_decref(root);
    snprintf(src, sizeof src, FX "%s/generation_config.json", fixture);
    snprintf(dst, sizeof dst, "%s/generation_config.json", dir);
    copy_file(src, dst);
}

static const wopts W1 = {0};

/* Exact variant: same logits as the fixture (within 1e-6 relative). */
static void same(const char *fixture, const char *name, ck_fn ckf, cfg_fn cfg, const wopts *o) {
    base *b = get_base(fixture);
    if (!b->logits) return;
    char dir[300], err[1024], label[160];
    make_variant(fixture, ckf, cfg, o ? o : &W1, dir, sizeof dir);
    snprintf(label, sizeof label, "%s: %s", fixture, name);
    float *got = run_logits(dir, b->ids, b->n, err, sizeof err, NULL);
    CHECKF(got != NULL, "%s: load/forward failed: %s", label, err);
    if (got) compare(label, b->logits, got, (size_t)b->n * VOCAB, 1e-6);
    free(got);
}

/* Pair variant: `test` storage vs an F32 `ref` holding the same values. The rounding
 * must have changed the logits (else the variant tested nothing), and when the matrices
 * were re-stored in 16 bits the model's weight bytes must be half the F32 copy's. */
static void pair(const char *fixture, const char *name, ck_fn ref, ck_fn test, int matrices_16bit, double tol) {
    base *b = get_base(fixture);
    char d1[300], d2[300], e1[1024], e2[1024], label[160];
    make_variant(fixture, ref, NULL, &W1, d1, sizeof d1);
    make_variant(fixture, test, NULL, &W1, d2, sizeof d2);
    snprintf(label, sizeof label, "%s: %s", fixture, name);
    qd_model *mr = NULL, *mg = NULL;
    float *r = run_logits(d1, b->ids, b->n, e1, sizeof e1, &mr);
    float *g = run_logits(d2, b->ids, b->n, e2, sizeof e2, &mg);
    CHECKF(r && g, "%s: failed: ref %s / variant %s", label, e1, e2);
    if (r && g) {
        int64_t br = qd_model_weight_bytes(mr), bg = qd_model_weight_bytes(mg);
        CHECKF(matrices_16bit ? 2 * bg == br : bg == br, "%s: weight bytes %lld vs F32 copy %lld", label,
               (long long)bg, (long long)br);
        int moved = 0;
        for (size_t i = 0; b->logits && i < (size_t)b->n * VOCAB; i++) moved |= r[i] != b->logits[i];
        CHECKF(moved, "%s: rounding the weights did not change the logits", label);
        compare(label, r, g, (size_t)b->n * VOCAB, tol);
    }
    qd_model_free(mr);
    qd_model_free(mg);
    free(r);
    free(g);
}

/* Negative variant: loading must fail with a message containing `expect`. */
typedef void (*dir_fn)(const char *dir);
static void fails(const char *fixture, const char *name, ck_fn ckf, cfg_fn cfg, const wopts *o, dir_fn post,
                  const char *expect) {
    base *b = get_base(fixture);
    char dir[300], err[1024], label[160];
    make_variant(fixture, ckf, cfg, o ? o : &W1, dir, sizeof dir);
    if (post) post(dir);
    snprintf(label, sizeof label, "%s: %s", fixture, name);
    float *got = run_logits(dir, b->ids, b->n, err, sizeof err, NULL);
    CHECKF(got == NULL, "%s: expected a load failure", label);
    CHECKF(strstr(err, expect) != NULL, "%s: message does not name '%s': %s", label, expect, err);
    printf("  %-58s fails: %s\n", label, err);
    free(got);
}

/* The CLI form outside reviewers run (qdelta logits -m DIR --ids FILE -o OUT.f32) on a variant. */
static void cli_same(const char *fixture, const char *name, ck_fn ckf, cfg_fn cfg, const wopts *o) {
    const char *bin = getenv("QDELTA_BIN");
    base *b = get_base(fixture);
    if (!bin || !b->logits) {
        printf("  %s: CLI check skipped (QDELTA_BIN unset)\n", fixture);
        return;
    }
    char dir[300], cmd[1200], out[400], label[160];
    make_variant(fixture, ckf, cfg, o, dir, sizeof dir);
    snprintf(out, sizeof out, "%s/cli.f32", dir);
    snprintf(cmd, sizeof cmd, "%s logits -m %s --ids " FX "%s/" PROMPT " -o %s -t 2 >/dev/null", bin, dir, fixture,
             out);
    int st = system(cmd);
    size_t len = 0, want = sizeof(float) * (size_t)b->n * VOCAB;
    float *got = (float *)qd_test_read_file(out, &len);
    snprintf(label, sizeof label, "%s: CLI, %s", fixture, name);
    CHECKF(st == 0 && got && len == want, "%s: exit status %d, %zu bytes of logits", label, st, len);
    if (st == 0 && got && len == want) compare(label, b->logits, got, (size_t)b->n * VOCAB, 1e-6);
    free(got);
}

/* ------------------------------------------------------------ tensor transforms */

static void add_strays(ckpt *c) {
    int64_t s2[2] = {96, 32}, s1[1] = {64}, s3[2] = {64, 128};
    ck_add(c, "model.visual.blocks.0.attn.qkv.weight", QD_DTYPE_F32, 2, s2, NULL);
    ck_add(c, "mtp.layers.0.input_layernorm.weight", QD_DTYPE_F32, 1, s1, NULL);
    if (!ck_find(c, "mtp.fc.weight")) ck_add(c, "mtp.fc.weight", QD_DTYPE_BF16, 2, s3, NULL);
}

static void add_lm_head(ckpt *c) {  /* tied model that ships lm_head anyway */
    tn *e = ck_find(c, "model.embed_tokens.weight");
    if (!e) e = ck_find(c, "model.language_model.embed_tokens.weight");
    CHECK(e != NULL && !ck_find(c, "lm_head.weight"));
    if (e) ck_add(c, "lm_head.weight", e->dtype, e->ndim, e->shape, e->data);
}

static void to_flat_names(ckpt *c) { ck_reprefix(c, "model.language_model.", "model.", NULL); }
static void to_composite_names(ckpt *c) { ck_reprefix(c, "model.", "model.language_model.", "model.visual."); }

/* experts.gate_up_proj [E][2I][H] + down_proj [E][H][I] <-> experts.N.{gate,up,down}_proj.weight */
static void unfuse_experts(ckpt *c) {
    for (int i = 0; i < c->n; i++) {
        const char *nm = c->t[i].name, *suf = "mlp.experts.gate_up_proj";
        size_t L = strlen(nm), S = strlen(suf);
        if (L < S || strcmp(nm + L - S, suf) != 0) continue;
        char pre[400], nb[512];
        snprintf(pre, sizeof pre, "%.*s", (int)(L - strlen("gate_up_proj")), nm);
        snprintf(nb, sizeof nb, "%sdown_proj", pre);
        tn gu = c->t[i], *dnp = ck_find(c, nb);
        if (!dnp) continue;
        tn dn = *dnp;
        const int64_t E = gu.shape[0], I = gu.shape[1] / 2, H = gu.shape[2];
        size_t es = qd_dtype_size(gu.dtype), m = (size_t)(I * H) * es;
        for (int64_t e = 0; e < E; e++) {
            int64_t sIH[2] = {I, H}, sHI[2] = {H, I};
            snprintf(nb, sizeof nb, "%s%lld.gate_proj.weight", pre, (long long)e);
            ck_add(c, nb, gu.dtype, 2, sIH, gu.data + (size_t)e * 2 * m);
            snprintf(nb, sizeof nb, "%s%lld.up_proj.weight", pre, (long long)e);
            ck_add(c, nb, gu.dtype, 2, sIH, gu.data + (size_t)e * 2 * m + m);
            snprintf(nb, sizeof nb, "%s%lld.down_proj.weight", pre, (long long)e);
            ck_add(c, nb, dn.dtype, 2, sHI, dn.data + (size_t)e * m);
        }
        char a[512], d[512];
        snprintf(a, sizeof a, "%sgate_up_proj", pre);
        snprintf(d, sizeof d, "%sdown_proj", pre);
        ck_remove(c, a);
        ck_remove(c, d);
        i = -1;  /* the array moved; rescan */
    }
}

static void fuse_experts_n(ckpt *c, int drop_last) {
    for (int i = 0; i < c->n; i++) {
        const char *nm = c->t[i].name, *suf = "mlp.experts.0.gate_proj.weight";
        size_t L = strlen(nm), S = strlen(suf);
        if (L < S || strcmp(nm + L - S, suf) != 0) continue;
        char pre[400], nb[512];
        snprintf(pre, sizeof pre, "%.*s", (int)(L - strlen("0.gate_proj.weight")), nm);
        int E = 0;
        for (;; E++) {
            snprintf(nb, sizeof nb, "%s%d.gate_proj.weight", pre, E);
            if (!ck_find(c, nb)) break;
        }
        const tn *g0 = &c->t[i];
        const int64_t I = g0->shape[0], H = g0->shape[1];
        qd_dtype dt = g0->dtype;
        size_t m = (size_t)(I * H) * qd_dtype_size(dt);
        int En = E - drop_last;
        unsigned char *gu = malloc(2 * m * (size_t)E), *dn = malloc(m * (size_t)E);
        for (int e = 0; e < E; e++) {
            const char *parts[3] = {"gate_proj", "up_proj", "down_proj"};
            for (int p = 0; p < 3; p++) {
                snprintf(nb, sizeof nb, "%s%d.%s.weight", pre, e, parts[p]);
                tn *t = ck_find(c, nb);
                unsigned char *dst = p < 2 ? gu + (size_t)e * 2 * m + (size_t)p * m : dn + (size_t)e * m;
                memcpy(dst, t->data, m);
                ck_remove(c, nb);
            }
        }
        int64_t sgu[3] = {En, 2 * I, H}, sdn[3] = {En, H, I};
        snprintf(nb, sizeof nb, "%sgate_up_proj", pre);
        ck_add(c, nb, dt, 3, sgu, gu);
        snprintf(nb, sizeof nb, "%sdown_proj", pre);
        ck_add(c, nb, dt, 3, sdn, dn);
        free(gu);
        free(dn);
        i = -1;
    }
}
static void fuse_experts(ckpt *c) { fuse_experts_n(c, 0); }
static void fuse_experts_short(ckpt *c) {  /* fused tensors holding E-1 experts */
    unfuse_experts(c);
    fuse_experts_n(c, 1);
}

/* dtype transforms. "small" = vectors (norms, A_log, dt_bias) and conv taps. */
enum { SEL_ALL, SEL_MATRICES, SEL_SMALL };
static int selected(const tn *t, int sel) {
    int small = t->ndim == 1 || strstr(t->name, "conv1d") != NULL;
    return sel == SEL_ALL || (sel == SEL_SMALL) == small;
}

static void recast(ckpt *c, int sel, qd_dtype to, int keep_f32) {
    for (int i = 0; i < c->n; i++) {
        tn *t = &c->t[i];
        if (t->dtype != QD_DTYPE_F32 || !selected(t, sel)) continue;
        float *f = (float *)t->data;
        uint16_t *h = malloc(sizeof *h * (size_t)t->n);
        for (int64_t k = 0; k < t->n; k++) h[k] = to == QD_DTYPE_BF16 ? qd_f32_to_bf16(f[k]) : qd_f32_to_f16(f[k]);
        if (keep_f32) {
            for (int64_t k = 0; k < t->n; k++) f[k] = to == QD_DTYPE_BF16 ? qd_bf16_to_f32(h[k]) : qd_f16_to_f32(h[k]);
            free(h);
        } else {
            free(t->data);
            t->data = (unsigned char *)h;
            t->dtype = to;
        }
    }
}
static void all_bf16_ref(ckpt *c) { recast(c, SEL_ALL, QD_DTYPE_BF16, 1); }
static void all_bf16(ckpt *c) { recast(c, SEL_ALL, QD_DTYPE_BF16, 0); }
static void all_f16_ref(ckpt *c) { recast(c, SEL_ALL, QD_DTYPE_F16, 1); }
static void all_f16(ckpt *c) { recast(c, SEL_ALL, QD_DTYPE_F16, 0); }
static void mat_bf16_ref(ckpt *c) { recast(c, SEL_MATRICES, QD_DTYPE_BF16, 1); }
static void mat_bf16(ckpt *c) { recast(c, SEL_MATRICES, QD_DTYPE_BF16, 0); }
static void small_f16_ref(ckpt *c) { recast(c, SEL_SMALL, QD_DTYPE_F16, 1); }
static void small_f16(ckpt *c) { recast(c, SEL_SMALL, QD_DTYPE_F16, 0); }
static void mixed16(ckpt *c, int keep_f32) {
    recast(c, SEL_MATRICES, QD_DTYPE_F16, keep_f32);
    recast(c, SEL_SMALL, QD_DTYPE_BF16, keep_f32);
}
static void mat_f16_small_bf16_ref(ckpt *c) { mixed16(c, 1); }
static void mat_f16_small_bf16(ckpt *c) { mixed16(c, 0); }

/* ------------------------------------------------------------ config transforms */

static json_t *textc(json_t *root) {
    json_t *t = json_object_get(root, "text_config");
    return json_is_object(t) ? t : root;
}

static void cfg_extra_keys(json_t *r) {
    json_object_set_new(r, "some_future_field", json_pack("{s:[i,i],s:n}", "x", 1, 2, "y"));
    json_object_set_new(textc(r), "quantization_hint", json_string("none"));
    json_t *rp = json_object_get(textc(r), "rope_parameters");
    if (json_is_object(rp)) json_object_set_new(rp, "unused_rope_key", json_real(1.5));
}

static void cfg_dtype_key(json_t *r) {  /* transformers 5 writes "dtype", 4.x "torch_dtype" */
    json_t *objs[2] = {r, textc(r)};
    for (int i = 0; i < (objs[0] == objs[1] ? 1 : 2); i++) {
        json_t *v = json_object_get(objs[i], "torch_dtype");
        if (v) {
            json_object_set(objs[i], "dtype", v);
            json_object_del(objs[i], "torch_dtype");
        }
    }
}

static void cfg_layer_types_derived(json_t *r) {  /* drop layer_types: derive from the interval */
    json_object_del(textc(r), "layer_types");
    json_object_del(r, "layer_types");
    if (!json_object_get(textc(r), "full_attention_interval"))
        json_object_set_new(textc(r), "full_attention_interval", json_integer(4));
}

static void cfg_layer_types_explicit(json_t *r) {  /* write layer_types from the interval */
    json_t *t = textc(r);
    json_int_t n = json_integer_value(json_object_get(t, "num_hidden_layers"));
    json_t *iv = json_object_get(t, "full_attention_interval");
    json_int_t k = iv ? json_integer_value(iv) : 4;
    json_t *a = json_array();
    for (json_int_t i = 0; i < n; i++)
        json_array_append_new(a, json_string((i + 1) % k ? "linear_attention" : "full_attention"));
    json_object_set_new(t, "layer_types", a);
    json_object_del(t, "full_attention_interval");
}

/* rope_parameters {rope_theta, partial_rotary_factor} <-> top-level fields. */
static void cfg_rope_toplevel(json_t *r) {
    json_t *t = textc(r), *rp = json_object_get(t, "rope_parameters");
    if (!json_is_object(rp)) return;
    json_object_set(t, "rope_theta", json_object_get(rp, "rope_theta"));
    json_object_set(t, "partial_rotary_factor", json_object_get(rp, "partial_rotary_factor"));
    json_object_del(t, "rope_parameters");
}

static void cfg_rope_object(json_t *r) {
    json_t *t = textc(r);
    json_t *th = json_object_get(t, "rope_theta"), *pf = json_object_get(t, "partial_rotary_factor");
    if (!th || !pf) return;
    json_object_set_new(t, "rope_parameters", json_pack("{s:s,s:O,s:O}", "rope_type", "default", "rope_theta", th,
                                                        "partial_rotary_factor", pf));
    json_object_del(t, "rope_theta");
    json_object_del(t, "partial_rotary_factor");
    json_object_del(t, "rope_scaling");
}

/* What transformers 5 save_pretrained writes for qwen3_next (MANIFEST hf_save_pretrained_probe):
 * explicit layer_types, rope_theta inside rope_parameters, partial_rotary_factor at the top,
 * "dtype", no rope_scaling / full_attention_interval. */
static void cfg_hf5_next(json_t *r) {
    cfg_layer_types_explicit(r);
    cfg_dtype_key(r);
    json_object_set_new(r, "rope_parameters",
                        json_pack("{s:s,s:O}", "rope_type", "default", "rope_theta", json_object_get(r, "rope_theta")));
    json_object_del(r, "rope_theta");
    json_object_del(r, "rope_scaling");
}

/* rope_parameters renamed rope_scaling (transformers 5 reads it as an alias), top-level theta removed */
static void cfg_rope_scaling_alias(json_t *r) {
    cfg_rope_object(r);
    json_t *t = textc(r), *rp = json_incref(json_object_get(t, "rope_parameters"));
    json_object_del(t, "rope_parameters");
    json_object_set_new(t, "rope_scaling", rp);
}

static void cfg_no_tie(json_t *r) {  /* untied models: transformers' default is false */
    json_object_del(textc(r), "tie_word_embeddings");
    json_object_del(r, "tie_word_embeddings");
}

static void cfg_tie_top_only(json_t *r) { json_object_del(textc(r), "tie_word_embeddings"); }
static void cfg_tie_text_only(json_t *r) { json_object_del(r, "tie_word_embeddings"); }

static void cfg_eos_int(json_t *r) { json_object_set_new(textc(r), "eos_token_id", json_integer(7)); }
static void cfg_eos_list(json_t *r) { json_object_set_new(textc(r), "eos_token_id", json_pack("[i,i]", 7, 9)); }
static void cfg_eos_null(json_t *r) { json_object_set_new(textc(r), "eos_token_id", json_null()); }
static void cfg_eos_top(json_t *r) {  /* composite: eos only at the top level */
    json_object_del(textc(r), "eos_token_id");
    json_object_set_new(r, "eos_token_id", json_integer(7));
}

/* composite qwen3_5 / qwen3_5_moe -> flat text export (what the *ForCausalLM class saves). */
static void cfg_flatten(json_t *r) {
    json_t *t = json_incref(json_object_get(r, "text_config"));
    const char *mt = json_string_value(json_object_get(r, "model_type"));
    int moe = mt && strstr(mt, "moe");
    json_object_clear(r);
    json_object_update(r, t);
    json_decref(t);
    json_object_set_new(r, "architectures",
                        json_pack("[s]", moe ? "Qwen3_5MoeForCausalLM" : "Qwen3_5ForCausalLM"));
}
static void cfg_flatten_composite_name(json_t *r) {  /* flat, but model_type kept as qwen3_5[_moe] */
    const char *mt = json_string_value(json_object_get(r, "model_type"));
    char keep[32];
    snprintf(keep, sizeof keep, "%s", mt ? mt : "");
    cfg_flatten(r);
    json_object_set_new(r, "model_type", json_string(keep));
}
static void cfg_no_text_model_type(json_t *r) { json_object_del(textc(r), "model_type"); }

static void cfg_vocab_plus1(json_t *r) { json_object_set_new(textc(r), "vocab_size", json_integer(VOCAB + 1)); }
static void cfg_no_head_dim(json_t *r) { json_object_del(textc(r), "head_dim"); }

static void ck_flat_per_expert(ckpt *c) {  /* = Qwen3_5MoeForCausalLM.save_pretrained */
    to_flat_names(c);
    unfuse_experts(c);
}
static void ck_strays_lm_head(ckpt *c) {
    add_strays(c);
    add_lm_head(c);
}

/* ------------------------------------------------------------ negative directory edits */

static void rm_shard2(const char *dir) {
    char p[400];
    snprintf(p, sizeof p, "%s/model-00002-of-00003.safetensors", dir);
    CHECK(unlink(p) == 0);
}

static void index_ghost(const char *dir) {  /* index promises a tensor its shard lacks */
    char p[400];
    snprintf(p, sizeof p, "%s/model.safetensors.index.json", dir);
    json_t *idx = json_load_file(p, 0, NULL);
    json_object_set_new(json_object_get(idx, "weight_map"), "model.layers.0.ghost.weight",
                        json_string("model-00001-of-00003.safetensors"));
    json_dump_file(idx, p, JSON_INDENT(2));
    json_decref(idx);
}

/* ------------------------------------------------------------ main */

static void eos_case(const char *fixture, const char *name, cfg_fn cfg, int n_want, const int32_t *want) {
    base *b = get_base(fixture);
    char dir[300], err[1024];
    make_variant(fixture, NULL, cfg, &W1, dir, sizeof dir);
    qd_model *m = NULL;
    float *got = run_logits(dir, b->ids, b->n, err, sizeof err, &m);
    char label[160];
    snprintf(label, sizeof label, "%s: %s", fixture, name);
    CHECKF(got && m, "%s: %s", label, err);
    if (!got || !m) return;
    const int32_t *ids;
    int n = qd_model_eos_ids(m, &ids);
    int ok = n == n_want;
    for (int i = 0; ok && i < n; i++) ok = ids[i] == want[i];
    CHECKF(ok, "%s: eos ids: got %d of them", label, n);
    if (b->logits) compare(label, b->logits, got, (size_t)b->n * VOCAB, 1e-6);
    free(got);
    qd_model_free(m);
}

int main(void) {
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    struct stat sb;
    if (stat(FX "qwen3_5_dense_f32/config.json", &sb) != 0)
        return qd_test_skip("test_checkpoint_variants", "no tests/fixtures (run from the repository root)");
    snprintf(tmp_root, sizeof tmp_root, "/tmp/qd_variants_XXXXXX");
    if (!mkdtemp(tmp_root)) return qd_test_skip("test_checkpoint_variants", "mkdtemp failed");

    const char *all_f32[] = {"qwen3_next_moe_f32", "qwen3_5_dense_f32", "qwen3_5_moe_fused_f32",
                             "qwen3_next_dense_flat_norenorm_f32"};
    const wopts shard3 = {.shards = 3}, rev = {.reverse = 1}, meta = {.metadata = 1};
    const wopts shard3_rev_meta = {.shards = 3, .reverse = 1, .metadata = 1}, nopad = {.no_pad = 1};

    printf("exact variants (max |diff| must be <= 1e-6 x max|logit|):\n");
    for (int i = 0; i < 4; i++) {
        const char *f = all_f32[i];
        same(f, "rewritten as one file", NULL, NULL, &W1);
        same(f, "3 shards + index", NULL, NULL, &shard3);
        same(f, "reverse tensor order", NULL, NULL, &rev);
        same(f, "__metadata__", NULL, NULL, &meta);
        same(f, "3 shards, reversed, __metadata__", NULL, NULL, &shard3_rev_meta);
        same(f, "header not 8-byte padded (odd data offset)", NULL, NULL, &nopad);
        same(f, "stray visual/mtp tensors", add_strays, NULL, &W1);
        same(f, "unknown extra config keys", NULL, cfg_extra_keys, &W1);
        same(f, "dtype instead of torch_dtype", NULL, cfg_dtype_key, &W1);
        same(f, "layer_types derived from full_attention_interval", NULL, cfg_layer_types_derived, &W1);
        same(f, "layer_types explicit", NULL, cfg_layer_types_explicit, &W1);
        same(f, "rope_theta/partial_rotary_factor at top level", NULL, cfg_rope_toplevel, &W1);
        same(f, "rope_parameters object", NULL, cfg_rope_object, &W1);
        same(f, "rope_scaling object as rope_parameters alias", NULL, cfg_rope_scaling_alias, &W1);
    }
    /* sharded fixture merged into one file (the index must go too: write_ckpt(1) omits it) */
    same("qwen3_next_dense_flat_norenorm_bf16", "merged into one file", NULL, NULL, &W1);
    same("qwen3_5_moe_fused_bf16", "3 shards + index", NULL, NULL, &shard3);

    /* Qwen3.5 composite <-> flat: config and tensor-name prefix independently */
    const char *q35[] = {"qwen3_5_dense_f32", "qwen3_5_moe_fused_f32", "qwen3_5_dense_bf16"};
    for (int i = 0; i < 3; i++) {
        same(q35[i], "flat qwen3_5_text config + model.* names", to_flat_names, cfg_flatten, &W1);
        same(q35[i], "flat config + model.language_model.* names", NULL, cfg_flatten, &W1);
        same(q35[i], "composite config + model.* names", to_flat_names, NULL, &W1);
        same(q35[i], "flat config named qwen3_5[_moe]", to_flat_names, cfg_flatten_composite_name, &W1);
        same(q35[i], "text_config without model_type", NULL, cfg_no_text_model_type, &W1);
    }
    same("qwen3_5_dense_f32", "tie_word_embeddings at top level only", NULL, cfg_tie_top_only, &W1);
    same("qwen3_5_dense_f32", "tie_word_embeddings in text_config only", NULL, cfg_tie_text_only, &W1);
    same("qwen3_5_dense_f32", "tied + explicit lm_head.weight + strays", ck_strays_lm_head, NULL, &W1);
    same("qwen3_next_moe_f32", "untied, tie_word_embeddings absent", NULL, cfg_no_tie, &W1);
    same("qwen3_5_moe_fused_f32", "untied, tie_word_embeddings absent", NULL, cfg_no_tie, &W1);
    same("qwen3_next_dense_flat_norenorm_f32", "tied + explicit lm_head.weight", add_lm_head, NULL, &shard3);
    same("qwen3_next_moe_f32", "flat names rewritten as model.language_model.*", to_composite_names, NULL, &W1);
    same("qwen3_next_moe_f32", "transformers-5 save_pretrained config", NULL, cfg_hf5_next, &W1);
    same("qwen3_next_dense_flat_norenorm_f32", "transformers-5 save_pretrained config", NULL, cfg_hf5_next,
         &shard3);

    /* MoE expert layouts */
    same("qwen3_5_moe_fused_f32", "fused experts -> per-expert", unfuse_experts, NULL, &W1);
    same("qwen3_5_moe_fused_bf16", "fused experts -> per-expert", unfuse_experts, NULL, &shard3);
    same("qwen3_5_moe_fused_f32", "HF ForCausalLM save (flat, model.*, per-expert)", ck_flat_per_expert,
         cfg_flatten, &W1);
    same("qwen3_next_moe_f32", "per-expert -> fused experts", fuse_experts, NULL, &W1);
    same("qwen3_next_dense_flat_norenorm_bf16", "per-expert -> fused experts", fuse_experts, NULL, &rev);

    cli_same("qwen3_5_moe_fused_f32", "HF ForCausalLM save, 3 shards", ck_flat_per_expert, cfg_flatten, &shard3);
    cli_same("qwen3_next_moe_f32", "transformers-5 config, fused experts", fuse_experts, cfg_hf5_next, &rev);

    /* eos_token_id forms: the logits stay, the stop ids follow the config */
    const int32_t e7[1] = {7}, e79[2] = {7, 9};
    eos_case("qwen3_next_moe_f32", "eos_token_id int", cfg_eos_int, 1, e7);
    eos_case("qwen3_next_moe_f32", "eos_token_id list", cfg_eos_list, 2, e79);
    eos_case("qwen3_next_moe_f32", "eos_token_id null", cfg_eos_null, 0, NULL);
    eos_case("qwen3_5_dense_f32", "eos_token_id list in text_config", cfg_eos_list, 2, e79);
    eos_case("qwen3_5_dense_f32", "eos_token_id at the top level only", cfg_eos_top, 1, e7);

    printf("dtype variants (vs an F32 copy of the same rounded weights, <= 1e-5 relative):\n");
    const char *dt_fx[] = {"qwen3_next_moe_f32", "qwen3_5_dense_f32", "qwen3_5_moe_fused_f32"};
    for (int i = 0; i < 3; i++) {
        pair(dt_fx[i], "all tensors BF16", all_bf16_ref, all_bf16, 1, 1e-5);
        pair(dt_fx[i], "all tensors F16", all_f16_ref, all_f16, 1, 1e-5);
        pair(dt_fx[i], "matrices BF16, vectors/conv F32", mat_bf16_ref, mat_bf16, 1, 1e-5);
        pair(dt_fx[i], "matrices F32, vectors/conv F16", small_f16_ref, small_f16, 0, 1e-5);
        pair(dt_fx[i], "matrices F16, vectors/conv BF16", mat_f16_small_bf16_ref, mat_f16_small_bf16, 1, 1e-5);
    }

    printf("negative variants (must fail naming the culprit):\n");
    fails("qwen3_next_moe_f32", "shard listed in index but missing", NULL, NULL, &shard3, rm_shard2,
          "model-00002-of-00003.safetensors");
    fails("qwen3_5_dense_f32", "index names a tensor absent from its shard", NULL, NULL, &shard3, index_ghost,
          "model.layers.0.ghost.weight");
    fails("qwen3_5_moe_fused_f32", "fused experts with E-1 experts", fuse_experts_short, NULL, &W1, NULL,
          "gate_up_proj");
    fails("qwen3_next_moe_f32", "per-expert -> fused with E-1 experts", fuse_experts_short, NULL, &W1, NULL,
          "gate_up_proj");
    fails("qwen3_next_moe_f32", "vocab_size > embedding rows", NULL, cfg_vocab_plus1, &W1, NULL,
          "embed_tokens.weight");
    fails("qwen3_5_dense_f32", "vocab_size > embedding rows", NULL, cfg_vocab_plus1, &W1, NULL,
          "embed_tokens.weight");
    fails("qwen3_5_dense_f32", "tied model, tie_word_embeddings absent", NULL, cfg_no_tie, &W1, NULL,
          "lm_head.weight");
    /* transformers' default head_dim is 256 (not hidden/heads), so q_proj no longer fits */
    fails("qwen3_next_moe_f32", "head_dim absent (default 256)", NULL, cfg_no_head_dim, &W1, NULL,
          "q_proj.weight' in");
    fails("qwen3_5_dense_f32", "head_dim absent (default 256)", NULL, cfg_no_head_dim, &W1, NULL,
          "expected shape [2048, 64]");

    for (int i = 0; i < n_bases; i++) free(bases[i].logits);
    char rm[300];
    snprintf(rm, sizeof rm, "rm -rf '%s'", tmp_root);  /* our own mkdtemp directory */
    CHECK(system(rm) == 0);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double secs = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
    printf("%d variant directories, %.1f s\n", n_dirs, secs);
    return qd_test_finish("test_checkpoint_variants");
}
