/* Tensor and expert parallelism checked without GPUs (src/parallel). Every fixture model,
 * and two dummy models whose heads divide by 4, run as in-process groups (each rank's
 * weights sliced from the loaded model, the all-reduce an in-memory sum in rank order)
 * through one ragged batch that prefills two sequences (65 tokens, all logits: the
 * chunked GDN path; 13 tokens: the recurrent one), then greedy decode steps of both.
 *
 * TP=1 through the group must equal qd_forward bit for bit. TP=2, TP=4 and expert
 * parallel groups change only the order of fp32 sums: their logits must stay within
 * TOL x max|ref| of TP=1 with identical greedy tokens, and every rank's GDN conv and
 * recurrent state and KV cache must match the slice of TP=1's state that its heads name.
 * The weights a rank holds are compared with the checkpoint rows and columns the plan
 * names (for Qwen3-Next, the interleaved in_proj_qkvz / in_proj_ba ranges). Plans for
 * tp sizes that do not divide a dimension must fail with a message naming it.
 *
 * TOL: the first GDN layer's state comes out bit-identical, the next ones within ~5e-7;
 * the per-head RMSNorms (gated GDN norm, q/k norms) rescale heads whose raw vectors are
 * small, so the reordering shows as 1e-6 .. 1.5e-5 x max|ref| in the KV cache and the
 * logits of these random fixtures (worst: the f32 Qwen3-Next dense fixture, 1.5e-5 with
 * EP=2). A wrong slice or a missing partial sum shows as 1e-2 and up. */
#include <stdarg.h>
#include <string.h>
#include <unistd.h>

#include "model/model.h"
#include "backend/cpu/cpu_backend.h"
#include "model/split_group.h"
#include "qd_fixtures.h"
#include "qd_test.h"

#define FIXTURES QD_FIXTURES
#define N_DECODE 6
#define TOL 5e-5
#define MAX_PROMPT 96

typedef struct workload {
    int32_t p0[MAX_PROMPT], p1[MAX_PROMPT];
    int n0, n1;
} workload;

typedef struct run_out {
    float *logits;  /* every row the workload asks for, in order */
    size_t n_floats;
    int32_t tok[2][N_DECODE + 1];
} run_out;

typedef qd_status (*forward_fn)(void *h, const qd_span *spans, int n_spans, float *logits);
static qd_status fwd_plain(void *h, const qd_span *s, int n, float *l) { return qd_forward(h, s, n, l); }
static qd_status fwd_tp(void *h, const qd_span *s, int n, float *l) { return qd_tp_forward_cpu(h, s, n, l); }

static int32_t argmax(const float *row, int V) {
    int best = 0;
    for (int v = 1; v < V; v++)
        if (row[v] > row[best]) best = v;
    return best;
}

static int run_workload(forward_fn f, void *h, const workload *w, int V, run_out *o) {
    const size_t rows = (size_t)w->n0 + 1 + 2 * N_DECODE;
    o->n_floats = rows * (size_t)V;
    o->logits = malloc(o->n_floats * sizeof(float));
    float *out = o->logits;
    qd_span pre[2] = {{0, w->p0, w->n0, QD_LOGITS_ALL}, {1, w->p1, w->n1, QD_LOGITS_LAST}};
    if (!out || f(h, pre, 2, out) != QD_OK) return 0;
    o->tok[0][0] = argmax(out + (size_t)(w->n0 - 1) * V, V);
    o->tok[1][0] = argmax(out + (size_t)w->n0 * V, V);
    out += (size_t)(w->n0 + 1) * V;
    for (int t = 0; t < N_DECODE; t++, out += 2 * V) {
        qd_span d[2] = {{0, &o->tok[0][t], 1, QD_LOGITS_LAST}, {1, &o->tok[1][t], 1, QD_LOGITS_LAST}};
        if (f(h, d, 2, out) != QD_OK) return 0;
        o->tok[0][t + 1] = argmax(out, V);
        o->tok[1][t + 1] = argmax(out + V, V);
    }
    return 1;
}

typedef struct err_acc {
    double diff, ref;
} err_acc;

static void acc(err_acc *e, float got, float want) {
    double d = fabs((double)got - want);
    e->diff = d > e->diff || d != d ? d : e->diff;  /* a NaN sticks */
    e->ref = fmax(e->ref, fabs(want));
}
static double rel(const err_acc *e) { return e->ref > 0 ? e->diff / e->ref : e->diff; }
static int within(const err_acc *e, double tol) { return e->diff <= tol * e->ref; }

/* ------------------------------------------------------------- state slices */

/* Each rank's state against TP=1's, with the slice found from the head semantics (not
 * from the plan): rank r keeps key heads [r*hk/tp, ...), their value heads, and the KV
 * heads its first query head reads (GQA: query head h reads KV head h / (nq / nkv)). */
static void check_state(const qd_context *ref, const qd_tp_cpu *g, double tol, const char *what) {
    const qd_model *m = ref->model;
    const qd_config *c = &m->cfg;
    const int tp = g->tp_size, K1 = c->gdn_conv_kernel - 1, dk = c->gdn_dk, dv = c->gdn_dv, hd = c->attn_head_dim;
    const qd_cpu_ctx *refc = ref->bc;
    for (int r = 0; r < tp; r++) {
        const qd_cpu_ctx *rc = g->ctxs[r];
        const qd_config *lc = rc->m->cfg;
        /* with more ranks than key heads, rank r keeps key head r / (tp / hk) whole */
        const int hk_l = !m->w.n_gdn ? 0 : c->gdn_hk >= tp ? c->gdn_hk / tp : 1, hv_l = m->w.n_gdn ? c->gdn_hv / tp : 0;
        const int hk0 = !m->w.n_gdn ? 0 : c->gdn_hk >= tp ? r * hk_l : r / (tp / c->gdn_hk), hv0 = r * hv_l;
        const int nq_l = c->attn_nq / tp, kv0 = m->w.n_attn ? r * nq_l / (c->attn_nq / c->attn_nkv) : 0;
        const int nkv_l = c->attn_nkv >= tp ? c->attn_nkv / tp : 1;
        CHECKF(!m->w.n_gdn || (lc->gdn_hk == hk_l && lc->gdn_hv == hv_l && g->plans[r].gdn_hk0 == hk0),
               "%s rank %d: GDN heads", what, r);
        CHECKF(!m->w.n_attn || (lc->attn_nkv == nkv_l && lc->attn_nq == nq_l && g->plans[r].attn_kv0 == kv0),
               "%s rank %d: attention heads", what, r);
        const int64_t run_begin[3] = {(int64_t)hk0 * dk, (int64_t)(c->gdn_hk + hk0) * dk,
                                      2LL * c->gdn_hk * dk + (int64_t)hv0 * dv};
        const int64_t run_count[3] = {(int64_t)hk_l * dk, (int64_t)hk_l * dk, (int64_t)hv_l * dv};
        const int conv_dim = qd_config_conv_dim(c), lconv = qd_config_conv_dim(lc);
        const size_t S = (size_t)dk * dv;
        err_acc conv = {0, 0}, ssm = {0, 0}, kv = {0, 0};
        for (int seq = 0; seq < 2; seq++) {
            const qd_seq_blocks *a = &ref->seqs[seq], *b = &g->ctx->seqs[seq];
            const float *a_conv = qd_cpu_seq_conv(refc, seq), *b_conv = qd_cpu_seq_conv(rc, seq);
            const float *a_ssm = qd_cpu_seq_ssm(refc, seq), *b_ssm = qd_cpu_seq_ssm(rc, seq);
            CHECKF(a->length == b->length, "%s rank %d seq %d: length %d vs %d", what, r, seq, b->length, a->length);
            for (int i = 0; i < m->w.n_gdn; i++) {
                int64_t lch = 0;
                for (int run = 0; run < 3; run++)
                    for (int64_t ch = run_begin[run]; ch < run_begin[run] + run_count[run]; ch++, lch++)
                        for (int t = 0; t < K1; t++)
                            acc(&conv, b_conv[((size_t)i * lconv + lch) * K1 + t],
                                a_conv[((size_t)i * conv_dim + ch) * K1 + t]);
                for (int h = 0; h < hv_l; h++)
                    for (size_t e = 0; e < S; e++)
                        acc(&ssm, b_ssm[((size_t)i * hv_l + h) * S + e], a_ssm[((size_t)i * c->gdn_hv + hv0 + h) * S + e]);
            }
            for (int ai = 0; ai < m->w.n_attn; ai++)
                for (int p = 0; p < a->length; p++) {
                    size_t ob = qd_cpu_kv_offset(rc, b->blocks, ai, p, nkv_l * hd);
                    size_t oa = qd_cpu_kv_offset(refc, a->blocks, ai, p, c->attn_nkv * hd);
                    for (int j = 0; j < nkv_l * hd; j++) {
                        acc(&kv, rc->kv_k[ob + j], refc->kv_k[oa + (size_t)kv0 * hd + j]);
                        acc(&kv, rc->kv_v[ob + j], refc->kv_v[oa + (size_t)kv0 * hd + j]);
                    }
                }
        }
        printf("    rank %d state: conv %.1e, recurrent %.1e, KV %.1e (x max|ref|)\n", r, rel(&conv), rel(&ssm), rel(&kv));
        CHECKF(within(&conv, tol) && within(&ssm, tol) && within(&kv, tol),
               "%s rank %d: state differs from TP=1's slice (conv %g, recurrent %g, KV %g > %g)", what, r, rel(&conv),
               rel(&ssm), rel(&kv), tol);
    }
}

/* ---------------------------------------------------- weights vs checkpoint */

static const qd_st_tensor *ckpt(const qd_model *m, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static const qd_st_tensor *ckpt(const qd_model *m, const char *fmt, ...) {
    char rel_name[160], name[200];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(rel_name, sizeof rel_name, fmt, ap);
    va_end(ap);
    snprintf(name, sizeof name, "model.%s", rel_name);
    const qd_st_tensor *t = qd_st_find(m->st, name);
    if (t) return t;
    snprintf(name, sizeof name, "model.language_model.%s", rel_name);
    return qd_st_find(m->st, name);
}

/* cols elements of row `row` of w equal those of tensor row trow from column tcol0 */
static int row_eq(const qd_weight *w, int64_t row, const qd_st_tensor *t, int64_t trow, int64_t tcol0) {
    if (!t || w->dtype != t->dtype) return 0;
    const size_t esz = qd_dtype_size(w->dtype);
    return !memcmp((const unsigned char *)w->data + (size_t)(row * w->cols) * esz,
                   (const unsigned char *)t->data + (size_t)(trow * t->shape[1] + tcol0) * esz, (size_t)w->cols * esz);
}

/* w is rows [t0, t0 + n) of t, or (cols_eq) columns [c0, c0 + w->cols) of every row */
static int rows_eq(const qd_weight *w, int64_t n, const qd_st_tensor *t, int64_t t0) {
    int ok = t && w->rows == n && t0 + n <= t->shape[0] && w->cols == t->shape[1];
    for (int64_t i = 0; i < n; i++) ok &= row_eq(w, i, t, t0 + i, 0);
    return ok;
}
static int cols_eq(const qd_weight *w, const qd_st_tensor *t, int64_t c0) {
    int ok = t && w->rows == t->shape[0] && c0 + w->cols <= t->shape[1];
    for (int64_t i = 0; i < w->rows; i++) ok &= row_eq(w, i, t, i, c0);
    return ok;
}

static int gdn_in_ok(const qd_model *m, const qd_shard_plan *p, const qd_gdn_weights *w, int L) {
    const qd_config *c = &m->cfg;
    const int tp = p->tp_size, dk = c->gdn_dk, dv = c->gdn_dv, rr = c->gdn_hv / c->gdn_hk;
    const int hk_l = c->gdn_hk >= tp ? c->gdn_hk / tp : 1;
    const int hk0 = c->gdn_hk >= tp ? p->rank * hk_l : p->rank / (tp / c->gdn_hk);
    const int hv_l = c->gdn_hv / tp, hv0 = p->rank * hv_l, vh = hv_l / hk_l; /* value heads per group */
    int ok = w->in_qkv.rows == 2LL * hk_l * dk + (int64_t)hv_l * dv && w->in_z.rows == (int64_t)hv_l * dv &&
             w->in_b.rows == hv_l && w->in_a.rows == hv_l;
    if (c->arch == QD_ARCH_QWEN3_NEXT) {
        /* the plan's contiguous checkpoint range, de-interleaved here group by group */
        const qd_st_tensor *qkvz = ckpt(m, "layers.%d.linear_attn.in_proj_qkvz.weight", L);
        const qd_st_tensor *ba = ckpt(m, "layers.%d.linear_attn.in_proj_ba.weight", L);
        const int64_t group = 2 * dk + 2 * rr * dv;
        ok &= p->next_qkvz_rows.begin == hk0 * group && p->next_qkvz_rows.count == hk_l * group;
        ok &= p->next_ba_rows.begin == (int64_t)hk0 * 2 * rr && p->next_ba_rows.count == (int64_t)hk_l * 2 * rr;
        for (int j = 0; j < hk_l; j++) {
            const int64_t base = p->next_qkvz_rows.begin + j * group, bb = p->next_ba_rows.begin + (int64_t)j * 2 * rr;
            /* the group's first value head this rank keeps: all rr unless the key head is replicated */
            const int64_t s0 = hv0 + (int64_t)j * vh - (int64_t)(hk0 + j) * rr;
            for (int e = 0; e < dk; e++) {
                ok &= row_eq(&w->in_qkv, (int64_t)j * dk + e, qkvz, base + e, 0);
                ok &= row_eq(&w->in_qkv, (int64_t)(hk_l + j) * dk + e, qkvz, base + dk + e, 0);
            }
            for (int e = 0; e < vh * dv; e++) {
                ok &= row_eq(&w->in_qkv, 2LL * hk_l * dk + (int64_t)j * vh * dv + e, qkvz, base + 2 * dk + s0 * dv + e, 0);
                ok &= row_eq(&w->in_z, (int64_t)j * vh * dv + e, qkvz, base + 2 * dk + (rr + s0) * dv + e, 0);
            }
            for (int i = 0; i < vh; i++) {
                ok &= row_eq(&w->in_b, (int64_t)j * vh + i, ba, bb + s0 + i, 0);
                ok &= row_eq(&w->in_a, (int64_t)j * vh + i, ba, bb + rr + s0 + i, 0);
            }
        }
        return ok;
    }
    const qd_st_tensor *qkv = ckpt(m, "layers.%d.linear_attn.in_proj_qkv.weight", L);
    for (int64_t i = 0; i < (int64_t)hk_l * dk; i++) {
        ok &= row_eq(&w->in_qkv, i, qkv, (int64_t)hk0 * dk + i, 0);
        ok &= row_eq(&w->in_qkv, (int64_t)hk_l * dk + i, qkv, (int64_t)(c->gdn_hk + hk0) * dk + i, 0);
    }
    for (int64_t i = 0; i < (int64_t)hv_l * dv; i++)
        ok &= row_eq(&w->in_qkv, 2LL * hk_l * dk + i, qkv, 2LL * c->gdn_hk * dk + (int64_t)hv0 * dv + i, 0);
    ok &= rows_eq(&w->in_z, (int64_t)hv_l * dv, ckpt(m, "layers.%d.linear_attn.in_proj_z.weight", L), (int64_t)hv0 * dv);
    ok &= rows_eq(&w->in_b, hv_l, ckpt(m, "layers.%d.linear_attn.in_proj_b.weight", L), hv0);
    ok &= rows_eq(&w->in_a, hv_l, ckpt(m, "layers.%d.linear_attn.in_proj_a.weight", L), hv0);
    return ok;
}

static void check_weights(const qd_model *m, const qd_tp_cpu *g, const char *what) {
    const qd_config *c = &m->cfg;
    const int tp = g->tp_size, hd = c->attn_head_dim, qf = c->attn_output_gate ? 2 : 1;
    for (int r = 0; r < tp; r++) {
        const qd_shard_plan *p = &g->plans[r];
        int ok = 1;
        for (int L = 0; L < c->n_layers; L++) {
            const qd_layer *ly = &g->models[r]->w.layers[L];
            if (ly->kind == QD_LAYER_GDN) {
                ok &= gdn_in_ok(m, p, &ly->gdn, L);
                ok &= cols_eq(&ly->gdn.out, ckpt(m, "layers.%d.linear_attn.out_proj.weight", L),
                              (int64_t)r * (c->gdn_hv / tp) * c->gdn_dv);
            } else {
                const int nq_l = c->attn_nq / tp, q0 = r * nq_l, kv0 = q0 / (c->attn_nq / c->attn_nkv);
                ok &= rows_eq(&ly->attn.q, (int64_t)nq_l * hd * qf, ckpt(m, "layers.%d.self_attn.q_proj.weight", L),
                              (int64_t)q0 * hd * qf);
                const int64_t kv_rows = (int64_t)(c->attn_nkv >= tp ? c->attn_nkv / tp : 1) * hd;
                ok &= rows_eq(&ly->attn.k, kv_rows, ckpt(m, "layers.%d.self_attn.k_proj.weight", L), (int64_t)kv0 * hd);
                ok &= rows_eq(&ly->attn.v, kv_rows, ckpt(m, "layers.%d.self_attn.v_proj.weight", L), (int64_t)kv0 * hd);
                ok &= cols_eq(&ly->attn.o, ckpt(m, "layers.%d.self_attn.o_proj.weight", L), (int64_t)q0 * hd);
            }
            const qd_mlp_weights *mw = NULL;
            const char *which = "";
            int64_t I_l = 0;
            if (ly->ffn_kind == QD_FFN_DENSE) {
                mw = &ly->mlp;
                I_l = c->intermediate_size / tp;
            } else if (ly->moe.has_shared) {
                mw = &ly->moe.shared;
                which = "shared_expert.";
                I_l = c->shared_expert_intermediate_size / tp;
            }
            if (mw) {
                ok &= rows_eq(&mw->gate, I_l, ckpt(m, "layers.%d.mlp.%sgate_proj.weight", L, which), r * I_l);
                ok &= rows_eq(&mw->up, I_l, ckpt(m, "layers.%d.mlp.%sup_proj.weight", L, which), r * I_l);
                ok &= cols_eq(&mw->down, ckpt(m, "layers.%d.mlp.%sdown_proj.weight", L, which), r * I_l) &&
                      mw->down.cols == I_l;
            }
        }
        CHECKF(ok, "%s rank %d: weights differ from the checkpoint slices the plan names", what, r);
    }
}

/* ----------------------------------------------------------------- groups */

static int has_moe(const qd_config *c) {
    for (int L = 0; L < c->n_layers; L++)
        if (c->ffn_kind[L] == QD_FFN_MOE) return 1;
    return 0;
}

static void check_group(qd_model *m, const char *name, const workload *w, const qd_context_params *cp,
                        const qd_context *ref, const run_out *want, int tp, bool ep) {
    char what[160];
    snprintf(what, sizeof what, "%s %s=%d", name, ep ? "EP" : "TP", tp);
    qd_err err;
    qd_err_clear(&err);
    qd_tp_cpu *g = NULL;
    qd_status s = qd_tp_cpu_create(m, tp, ep, cp, &g, &err);
    CHECKF(s == QD_OK, "%s: %s", what, err.msg);
    if (s != QD_OK) return;
    const int V = m->cfg.vocab_size;
    run_out got = {0};
    int ran = run_workload(fwd_tp, g, w, V, &got);
    CHECKF(ran, "%s: forward failed: %s", what, g->err.msg);
    if (ran) {
        err_acc e = {0, 0};
        for (size_t i = 0; i < got.n_floats; i++) acc(&e, got.logits[i], want->logits[i]);
        int same = !memcmp(got.tok, want->tok, sizeof got.tok);
        printf("  %-44s logits max|diff|/max|ref| = %.2e, greedy %s\n", what, rel(&e), same ? "same" : "DIFFERENT");
        if (tp == 1)
            CHECKF(!memcmp(got.logits, want->logits, got.n_floats * sizeof(float)), "%s: not bit-identical to qd_forward",
                   what);
        CHECKF(within(&e, TOL), "%s: logits differ by %g x max|ref| (> %g)", what, rel(&e), TOL);
        CHECKF(same, "%s: greedy continuation differs", what);
        check_state(ref, g, tp == 1 ? 0.0 : TOL, what);
        if (m->st) check_weights(m, g, what);
    }
    free(got.logits);
    qd_tp_cpu_free(g);
}

/* TP=1 reference with qd_forward, then each group in `modes` ({tp, ep} pairs). */
static void check_model(qd_model *m, const char *name, const workload *w, const int (*modes)[2], int n_modes) {
    qd_context_params cp = qd_context_default_params();
    cp.max_seqs = 2;
    cp.max_ctx = 128;
    cp.max_batch = MAX_PROMPT;
    qd_context *ref;
    CHECK(qd_context_create(m, &cp, &ref) == QD_OK);
    run_out want = {0};
    int ran = run_workload(fwd_plain, ref, w, m->cfg.vocab_size, &want);
    CHECKF(ran, "%s: reference forward failed: %s", name, qd_context_errmsg(ref));
    for (int i = 0; ran && i < n_modes; i++) {
        if (modes[i][1] && !has_moe(&m->cfg)) continue;
        qd_shard_plan p;
        qd_err perr;
        if (qd_shard_plan_make(&m->cfg, modes[i][0], 0, modes[i][1], &p, &perr) != QD_OK) {
            printf("  %s: no %s=%d split: %s\n", name, modes[i][1] ? "EP" : "TP", modes[i][0], perr.msg);
            continue;
        }
        check_group(m, name, w, &cp, ref, &want, modes[i][0], modes[i][1]);
    }
    free(want.logits);
    qd_context_free(ref);
}

/* ---------------------------------------------------------------- negatives */

static void expect_plan_error(const qd_config *c, int tp, bool ep, const char *field) {
    qd_shard_plan p;
    qd_err err;
    qd_err_clear(&err);
    qd_status s = QD_OK;
    for (int r = 0; r < (tp > 0 ? tp : 1) && s == QD_OK; r++) s = qd_shard_plan_make(c, tp, r, ep, &p, &err);
    printf("  tp=%d%s: %s\n", tp, ep ? " (EP)" : "", s == QD_OK ? "accepted" : err.msg);
    if (field)
        CHECKF(s == QD_ERR_INVALID_ARG && strstr(err.msg, field), "tp=%d: expected an error naming %s, got '%s'", tp, field,
               err.msg);
    else CHECKF(s == QD_OK, "tp=%d: expected a plan, got '%s'", tp, err.msg);
}

static void check_negatives(qd_model *m) {
    const qd_config *c0 = &m->cfg;  /* a Qwen3.5-MoE fixture: hk 2, hv 4, nq 4 / nkv 2, experts 8 x 32, shared 48 */
    expect_plan_error(c0, 4, false, NULL);  /* each key head on two ranks, one value head each */
    expect_plan_error(c0, 8, false, "linear_num_key_heads");  /* 8 ranks, 4 value heads */
    expect_plan_error(c0, 3, false, "linear_num_key_heads");
    expect_plan_error(c0, 0, false, "tensor parallel size 0");
    qd_shard_plan p;
    qd_err err;
    CHECK(qd_shard_plan_make(c0, 2, 2, false, &p, &err) == QD_ERR_INVALID_ARG && strstr(err.msg, "rank 2"));
    qd_config c = *c0;
    c.gdn_hk = 4, c.gdn_hv = 8, c.attn_nq = 6, c.attn_nkv = 3;
    expect_plan_error(&c, 2, false, "num_key_value_heads");
    c = *c0;
    c.gdn_hk = 8, c.gdn_hv = 8, c.attn_nq = 4, c.attn_nkv = 2;
    expect_plan_error(&c, 8, false, "num_attention_heads");
    c = *c0;
    c.moe_intermediate_size = 33;
    expect_plan_error(&c, 2, false, "moe_intermediate_size");
    expect_plan_error(&c, 2, true, NULL);  /* expert parallel keeps experts whole */
    c = *c0;
    c.n_experts = 9;
    expect_plan_error(&c, 2, true, "num_experts");
    c = *c0;
    c.shared_expert_intermediate_size = 47;
    expect_plan_error(&c, 2, false, "shared_expert_intermediate_size");
    c = *c0;
    c.intermediate_size = 97;  /* no dense layer: the field does not constrain */
    expect_plan_error(&c, 2, false, NULL);
    c.ffn_kind[1] = QD_FFN_DENSE;
    expect_plan_error(&c, 2, false, "intermediate_size");
    /* the group passes the plan's message on */
    qd_tp_cpu *g = NULL;
    qd_err_clear(&err);
    CHECK(qd_tp_cpu_create(m, 3, false, NULL, &g, &err) == QD_ERR_INVALID_ARG && !g &&
          strstr(err.msg, "linear_num_key_heads"));
    /* a bad batch is refused by rank 0 with qd_forward's message, and changes nothing */
    CHECK(qd_tp_cpu_create(m, 2, false, NULL, &g, &err) == QD_OK);
    if (g) {
        int32_t bad = m->cfg.vocab_size;
        qd_span sp = {0, &bad, 1, QD_LOGITS_LAST};
        float row[1024];
        CHECK(qd_tp_forward_cpu(g, &sp, 1, row) == QD_ERR_INVALID_ARG && strstr(g->err.msg, "out of range"));
        for (int r = 0; r < 2; r++)
            CHECK(qd_seq_length(g->ctx, 0) == 0 && qd_kv_free_blocks(g->ctx) == qd_kv_total_blocks(g->ctx));
        qd_tp_cpu_free(g);
    }
}

/* ------------------------------------------------------------------ models */

static int read_ids(const char *dir, const char *file, int32_t *out, int max) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, file);
    char *txt = qd_test_read_file(path, NULL);
    if (!txt) return 0;
    const int n = qd_fixture_parse_ids(txt, out, max);
    free(txt);
    return n;
}

static qd_model *load(const char *dir, qd_load_format fmt) {
    qd_model_params mp = qd_model_default_params();
    mp.path = dir;
    mp.n_threads = 2;
    mp.load_format = fmt;
    qd_model *m = NULL;
    char err[1024];
    qd_status s = qd_model_load(&mp, &m, err, sizeof err);
    CHECKF(s == QD_OK, "%s: load failed: %s", dir, err);
    return m;
}

static const int k_fixture_modes[][2] = {{1, 0}, {2, 0}, {2, 1}, {4, 0}, {4, 1}};
static const int k_dummy_modes[][2] = {{1, 0}, {2, 0}, {4, 0}, {2, 1}, {4, 1}};

static void check_fixture(const char *dir) {
    workload w;
    w.n0 = read_ids(dir, "prompt_65.ids", w.p0, MAX_PROMPT);
    w.n1 = read_ids(dir, "prompt_64.ids", w.p1, 13); /* present in both fixture sets */
    CHECKF(w.n0 == 65 && w.n1 == 13, "%s: prompts", dir);
    qd_model *m = load(dir, QD_LOAD_AUTO);
    if (!m || w.n0 != 65 || w.n1 != 13) {
        qd_model_free(m);
        return;
    }
    check_model(m, dir + strlen(FIXTURES) + 1, &w, k_fixture_modes, 5);
    if (!strcmp(dir, FIXTURES "/qwen3_5_moe_fused_f32")) check_negatives(m);
    qd_model_free(m);
}

/* A Qwen3-Next shaped dummy (GDN + attention, dense and MoE FFN with a shared expert)
 * whose heads divide by 4; nkv = 2 makes TP=4 replicate each KV head on two ranks. */
static void check_dummy(int hk, int hv, int nq, int nkv) {
    char dir[] = "/tmp/qd_tp_cpu_XXXXXX", path[64], name[96];
    CHECK(mkdtemp(dir) != NULL);
    snprintf(path, sizeof path, "%s/config.json", dir);
    FILE *f = fopen(path, "w");
    CHECK(f != NULL);
    if (!f) return;
    fprintf(f,
            "{\"model_type\": \"qwen3_next\", \"hidden_size\": 64, \"num_hidden_layers\": 4, \"vocab_size\": 320,"
            " \"rms_norm_eps\": 1e-6, \"tie_word_embeddings\": false, \"full_attention_interval\": 4,"
            " \"linear_num_key_heads\": %d, \"linear_num_value_heads\": %d, \"linear_key_head_dim\": 16,"
            " \"linear_value_head_dim\": 16, \"linear_conv_kernel_dim\": 4,"
            " \"num_attention_heads\": %d, \"num_key_value_heads\": %d, \"head_dim\": 32,"
            " \"partial_rotary_factor\": 0.25, \"rope_theta\": 1000000.0, \"max_position_embeddings\": 1024,"
            " \"intermediate_size\": 128, \"num_experts\": 8, \"num_experts_per_tok\": 2, \"moe_intermediate_size\": 32,"
            " \"shared_expert_intermediate_size\": 48, \"norm_topk_prob\": true, \"decoder_sparse_step\": 1,"
            " \"mlp_only_layers\": [1]}\n",
            hk, hv, nq, nkv);
    fclose(f);
    qd_model *m = load(dir, QD_LOAD_DUMMY_F32);
    unlink(path);
    rmdir(dir);
    if (!m) return;
    workload w;
    qd_test_rng rng = {0x7e57ull * 0x9e3779b97f4a7c15ull | 1};  /* fixed: greedy ties would make it flaky */
    w.n0 = 65, w.n1 = 13;
    for (int i = 0; i < w.n0; i++) w.p0[i] = (int32_t)(qd_test_next(&rng) % 320);
    for (int i = 0; i < w.n1; i++) w.p1[i] = (int32_t)(qd_test_next(&rng) % 320);
    snprintf(name, sizeof name, "dummy hk%d hv%d nq%d nkv%d", hk, hv, nq, nkv);
    check_model(m, name, &w, k_dummy_modes, 5);
    qd_model_free(m);
}

int main(void) {
    char *dirs[64];
    int n = qd_fixture_dirs("prompt_65.ids", dirs, 64);
    CHECKF(n >= 0, "no %s directory (run from the repository root)", FIXTURES);
    if (n < 0) n = 0;
    CHECKF(n >= 6, "expected at least 6 fixture models, found %d", n);
    for (int i = 0; i < n; i++) {
        printf("%s\n", dirs[i]);
        check_fixture(dirs[i]);
        free(dirs[i]);
    }
    printf("dummy models\n");
    check_dummy(4, 8, 8, 4);
    check_dummy(4, 12, 8, 2);
    return qd_test_finish("test_tp_cpu");
}
