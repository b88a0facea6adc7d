/* Causal GQA attention over a paged per-sequence KV cache (CPU reference). */
#include <math.h>
#include <stdlib.h>

#include "backend/cpu/cpu_ops.h"

typedef struct {
    const float *q; int64_t q_stride;
    qd_kv_view kv;
    int T, pos0, nq, nkv, hd;
    float scale;
    float *out;
} attn_job;

/* Key (or value) head kvh of position p, through the block table. */
static inline const float *kv_row(const attn_job *j, const float *base, int p, int kvh) {
    const qd_kv_view *kv = &j->kv;
    return base + (int64_t)kv->blocks[p / kv->block_size] * kv->block_stride +
           ((int64_t)(p % kv->block_size) * j->nkv + kvh) * j->hd;
}

/* One (token, query head) pair per item: scores over positions 0..pos, softmax, weighted V sum. */
static void attn_worker(void *user, int64_t begin, int64_t end, int worker) {
    const attn_job *j = user;
    const int group = j->nq / j->nkv;
    const int ctx = j->pos0 + j->T;
    float *scores = malloc(sizeof(float) * (size_t)ctx);
    for (int64_t it = begin; it < end; it++) {
        int t = (int)(it / j->nq), n = (int)(it % j->nq);
        int kvh = n / group;
        int npos = j->pos0 + t + 1;
        const float *qv = j->q + t * j->q_stride + (int64_t)n * j->hd;
        float *o = j->out + ((int64_t)t * j->nq + n) * j->hd;
        if (!scores) { /* allocation failed: fall back to two passes without a score buffer */
            float mx = -INFINITY;
            for (int p = 0; p < npos; p++) {
                const float *kv = kv_row(j, j->kv.k, p, kvh);
                float s = 0.0f;
                for (int e = 0; e < j->hd; e++) s += qv[e] * kv[e];
                s *= j->scale;
                if (s > mx) mx = s;
            }
            float sum = 0.0f;
            for (int e = 0; e < j->hd; e++) o[e] = 0.0f;
            for (int p = 0; p < npos; p++) {
                const float *kv = kv_row(j, j->kv.k, p, kvh);
                const float *vv = kv_row(j, j->kv.v, p, kvh);
                float s = 0.0f;
                for (int e = 0; e < j->hd; e++) s += qv[e] * kv[e];
                float w = expf(s * j->scale - mx);
                sum += w;
                for (int e = 0; e < j->hd; e++) o[e] += w * vv[e];
            }
            for (int e = 0; e < j->hd; e++) o[e] /= sum;
            continue;
        }
        float mx = -INFINITY;
        for (int p = 0; p < npos; p++) {
            const float *kv = kv_row(j, j->kv.k, p, kvh);
            float s = 0.0f;
#pragma omp simd reduction(+ : s)
            for (int e = 0; e < j->hd; e++) s += qv[e] * kv[e];
            s *= j->scale;
            scores[p] = s;
            if (s > mx) mx = s;
        }
        float sum = 0.0f;
        for (int p = 0; p < npos; p++) {
            scores[p] = expf(scores[p] - mx);
            sum += scores[p];
        }
        float inv = 1.0f / sum;
        for (int e = 0; e < j->hd; e++) o[e] = 0.0f;
        for (int p = 0; p < npos; p++) {
            const float *vv = kv_row(j, j->kv.v, p, kvh);
            float w = scores[p] * inv;
            for (int e = 0; e < j->hd; e++) o[e] += w * vv[e];
        }
    }
    free(scores);
}

void qd_cpu_attention(qd_threadpool *pool, const float *q, int64_t q_stride, const qd_kv_view *kv,
                      int T, int pos0, int nq, int nkv, int hd, float scale, float *out) {
    attn_job j = {q, q_stride, *kv, T, pos0, nq, nkv, hd, scale, out};
    qd_parallel_for(pool, (int64_t)T * nq, 1, attn_worker, &j);
}
