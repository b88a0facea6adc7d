/* Per-rank checkpoint loading (src/parallel/shard_load.c): a rank's model read straight
 * from the fixture checkpoints must equal, byte for byte, the rank model cut from the fully
 * loaded model (qd_shard_model_slice, checked against the checkpoint and the unsplit
 * forward by test_tp_cpu), for every fixture and every TP / EP size its heads allow
 * (TP=1, 2, 4 and EP=2, 4; the gpu_* fixtures' single key head is replicated at TP=2).
 * Every matrix (dtype, shape, bytes), every fp32 vector of the rank's length, and the
 * expert partition are compared. Row slices must stay views into the checkpoint mapping
 * (no host copy of what a rank reads as stored). */
#include <string.h>

#include "model/model.h"
#include "model/model_shard.h"
#include "qd_fixtures.h"
#include "qd_test.h"

static int weight_eq(const qd_weight *a, const qd_weight *b) {
    if (a->dtype != b->dtype || a->rows != b->rows || a->cols != b->cols) return 0;
    if (a->rows * a->cols == 0) return 1;
    return a->data && b->data &&
           !memcmp(a->data, b->data, (size_t)(a->rows * a->cols) * qd_dtype_size(a->dtype));
}

static int vec_eq(const float *a, const float *b, int64_t n) {
    return n == 0 || (a && b && !memcmp(a, b, (size_t)n * sizeof(float)));
}

static int mlp_eq(const qd_mlp_weights *a, const qd_mlp_weights *b) {
    return weight_eq(&a->gate, &b->gate) && weight_eq(&a->up, &b->up) && weight_eq(&a->down, &b->down);
}

/* Is w's data inside the checkpoint's mapping (some tensor's bytes)? */
static int in_mapping(const qd_model *full, const qd_weight *w) {
    const unsigned char *p = w->data;
    for (int i = 0; i < qd_st_count(full->st); i++) {
        const qd_st_tensor *t = qd_st_at(full->st, i);
        const unsigned char *b = t->data;
        if (p >= b && p + (size_t)(w->rows * w->cols) * qd_dtype_size(w->dtype) <= b + t->n_bytes) return 1;
    }
    return 0;
}

static void compare(const qd_model *full, const qd_model *a, const qd_model *b, const char *what) {
    const qd_config *c = &a->cfg;
    CHECKF(!memcmp(&a->cfg, &b->cfg, sizeof a->cfg), "%s: local configs differ", what);
    CHECKF(a->w.expert0 == b->w.expert0 && a->w.n_local_experts == b->w.n_local_experts, "%s: expert partition", what);
    CHECKF(weight_eq(&a->w.embed, &b->w.embed) && weight_eq(&a->w.lm_head, &b->w.lm_head), "%s: embedding / LM head", what);
    CHECKF(vec_eq(a->w.final_norm, b->w.final_norm, c->hidden_size), "%s: final norm", what);
    const int64_t conv = (int64_t)qd_config_conv_dim(c) * c->gdn_conv_kernel;
    int bad = 0, views = 1;
    for (int L = 0; L < c->n_layers; L++) {
        const qd_layer *x = &a->w.layers[L], *y = &b->w.layers[L];
        int ok = vec_eq(x->input_norm, y->input_norm, c->hidden_size) &&
                 vec_eq(x->post_norm, y->post_norm, c->hidden_size);
        if (x->kind == QD_LAYER_GDN) {
            const qd_gdn_weights *g = &x->gdn, *h = &y->gdn;
            ok &= weight_eq(&g->in_qkv, &h->in_qkv) && weight_eq(&g->in_z, &h->in_z) &&
                  weight_eq(&g->in_b, &h->in_b) && weight_eq(&g->in_a, &h->in_a) && weight_eq(&g->out, &h->out);
            ok &= vec_eq(g->conv_w, h->conv_w, conv) && vec_eq(g->A_log, h->A_log, c->gdn_hv) &&
                  vec_eq(g->dt_bias, h->dt_bias, c->gdn_hv) && vec_eq(g->norm_w, h->norm_w, c->gdn_dv);
            if (full->cfg.arch != QD_ARCH_QWEN3_NEXT) views &= in_mapping(full, &h->in_z) && in_mapping(full, &h->in_b);
        } else {
            const qd_attn_weights *p = &x->attn, *q = &y->attn;
            ok &= weight_eq(&p->q, &q->q) && weight_eq(&p->k, &q->k) && weight_eq(&p->v, &q->v) &&
                  weight_eq(&p->o, &q->o);
            ok &= vec_eq(p->q_norm, q->q_norm, c->attn_head_dim) && vec_eq(p->k_norm, q->k_norm, c->attn_head_dim);
            views &= in_mapping(full, &q->q) && in_mapping(full, &q->k) && in_mapping(full, &q->v);
        }
        if (x->ffn_kind == QD_FFN_DENSE) {
            ok &= mlp_eq(&x->mlp, &y->mlp);
            views &= in_mapping(full, &y->mlp.gate) && in_mapping(full, &y->mlp.up);
        } else {
            const qd_moe_weights *p = &x->moe, *q = &y->moe;
            ok &= weight_eq(&p->router, &q->router) && p->has_shared == q->has_shared;
            for (int e = 0; e < c->n_experts; e++) {
                ok &= mlp_eq(&p->experts[e], &q->experts[e]);
                const int local = e >= b->w.expert0 && e < b->w.expert0 + b->w.n_local_experts;
                ok &= local == (q->experts[e].gate.rows > 0);
                if (local) views &= in_mapping(full, &q->experts[e].gate) && in_mapping(full, &q->experts[e].up);
            }
            if (p->has_shared) ok &= mlp_eq(&p->shared, &q->shared) && weight_eq(&p->shared_gate, &q->shared_gate);
        }
        if (!ok && !bad++) fprintf(stderr, "%s: layer %d differs\n", what, L);
    }
    CHECKF(!bad, "%s: %d layers differ between the sliced and the loaded rank model", what, bad);
    CHECKF(views, "%s: a row slice of the loaded rank model is not a view into the checkpoint", what);
}

static const int k_modes[][2] = {{1, 0}, {2, 0}, {4, 0}, {2, 1}, {4, 1}};

static void check_fixture(const char *dir) {
    qd_model_params mp = qd_model_default_params();
    mp.path = dir;
    mp.n_threads = 1;
    qd_model *full = NULL;
    char msg[1024];
    qd_status s = qd_model_load(&mp, &full, msg, sizeof msg);
    CHECKF(s == QD_OK, "%s: %s", dir, msg);
    if (s != QD_OK) return;
    const char *name = dir + strlen(QD_FIXTURES) + 1;
    int n_moe = 0;
    for (int L = 0; L < full->cfg.n_layers; L++) n_moe += full->cfg.ffn_kind[L] == QD_FFN_MOE;
    for (int i = 0; i < 5; i++) {
        const int tp = k_modes[i][0];
        const bool ep = k_modes[i][1];
        if (ep && !n_moe) continue;
        char what[160];
        snprintf(what, sizeof what, "%s %s=%d", name, ep ? "EP" : "TP", tp);
        int ranks = 0;
        for (int r = 0; r < tp; r++) {
            qd_shard_plan p;
            qd_err err;
            qd_err_clear(&err);
            if (qd_shard_plan_make(&full->cfg, tp, r, ep, &p, &err) != QD_OK) break;
            qd_model *cut = NULL, *read = NULL;
            s = qd_shard_model_slice(full, &p, &cut, &err);
            CHECKF(s == QD_OK, "%s rank %d: slice: %s", what, r, err.msg);
            s = qd_shard_model_load(full, &p, 0, QD_DTYPE_BF16, &read, &err);
            CHECKF(s == QD_OK, "%s rank %d: load: %s", what, r, err.msg);
            if (cut && read) {
                char rw[192];
                snprintf(rw, sizeof rw, "%s rank %d", what, r);
                compare(full, cut, read, rw);
                CHECKF(read->weight_bytes > 0, "%s: weight bytes", rw);
                ranks++;
            }
            qd_shard_model_free(read);
            qd_shard_model_free(cut);
        }
        printf("  %-44s %s\n", what, ranks == tp ? "loaded == sliced" : ranks ? "FAILED" : "no split");
    }
    qd_model_free(full);
}

int main(void) {
    char *dirs[64];
    int n = qd_fixture_dirs("config.json", dirs, 64);
    CHECKF(n >= 11, "expected at least 11 fixture checkpoints, found %d (run from the repository root)", n);
    for (int i = 0; i < n; i++) {
        printf("%s\n", dirs[i]);
        check_fixture(dirs[i]);
        free(dirs[i]);
    }
    return qd_test_finish("test_shard_load");
}
