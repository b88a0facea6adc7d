#include "runtime/sampler.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* A candidate for top-k / top-p: the penalised logit and its id. */
typedef struct qd_cand {
    float v;     /* penalised logit: the ranking key */
    int32_t id;
    float w;     /* sampling weight exp((v - max) / temperature) */
} qd_cand;

struct qd_sampler {
    qd_sampling_params p;
    int vocab_size;
    int n;                 /* ids [0, n) are real tokens: vocab_limit or vocab_size */
    uint64_t rng[4];       /* xoshiro256** state */
    int rep_on, freq_on;   /* repetition / presence-or-frequency penalty active */
    /* History, kept only when some penalty is active. `listed` marks ids already in
     * `seen` so the penalties touch each distinct id once, in O(distinct) not O(V). */
    uint8_t *listed;       /* [vocab_size] */
    int32_t *counts;       /* [vocab_size] times generated; only when freq_on */
    int32_t *seen;         /* distinct ids to penalise */
    float *saved;          /* raw logits of `seen`, to restore the caller's row */
    int n_seen, cap_seen;
    qd_cand *cand;         /* [vocab_size] scratch; only when top_k or top_p is on */
};

/* ------------------------------------------------------------------ RNG */

/* splitmix64 spreads a (possibly small, sequential) user seed over the 256-bit
 * xoshiro state, which must not be all zero. */
static uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

static uint64_t rng_next(uint64_t s[4]) {
    uint64_t r = rotl(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return r;
}

/* Uniform in [0, 1) with 53 random bits. */
static double rng_uniform(uint64_t s[4]) { return (double)(rng_next(s) >> 11) * 0x1.0p-53; }

static void rng_seed(uint64_t s[4], uint64_t seed) {
    uint64_t x = seed;
    for (int i = 0; i < 4; i++) s[i] = splitmix64(&x);
}

/* --------------------------------------------------------------- params */

qd_sampling_params qd_sampling_default_params(void) {
    qd_sampling_params p;
    memset(&p, 0, sizeof p);
    p.temperature = 1.0f;
    p.top_k = 0;
    p.top_p = 1.0f;
    p.min_p = 0.0f;
    p.repetition_penalty = 1.0f;
    p.presence_penalty = 0.0f;
    p.frequency_penalty = 0.0f;
    p.seed = 0;
    p.n_logprobs = 0;
    p.vocab_limit = 0;
    return p;
}

qd_status qd_sampling_params_validate(const qd_sampling_params *p, int vocab_size, qd_err *err) {
    if (!p) return qd_seterr(err, QD_ERR_INVALID_ARG, "sampling params: NULL");
    if (vocab_size <= 0)
        return qd_seterr(err, QD_ERR_INVALID_ARG, "sampler: vocab_size must be > 0 (got %d)", vocab_size);
    /* The negated comparisons also reject NaN. */
    if (!(p->temperature >= 0.0f) || isinf(p->temperature))
        return qd_seterr(err, QD_ERR_INVALID_ARG, "sampling params: temperature must be a finite "
                         "value >= 0 (got %g)", (double)p->temperature);
    if (p->top_k < 0)
        return qd_seterr(err, QD_ERR_INVALID_ARG, "sampling params: top_k must be >= 0, 0 = off "
                         "(got %d)", p->top_k);
    if (!(p->top_p > 0.0f && p->top_p <= 1.0f))
        return qd_seterr(err, QD_ERR_INVALID_ARG, "sampling params: top_p must be in (0, 1], 1 = off "
                         "(got %g)", (double)p->top_p);
    if (!(p->min_p >= 0.0f && p->min_p <= 1.0f))
        return qd_seterr(err, QD_ERR_INVALID_ARG, "sampling params: min_p must be in [0, 1], 0 = off "
                         "(got %g)", (double)p->min_p);
    if (!(p->repetition_penalty > 0.0f) || isinf(p->repetition_penalty))
        return qd_seterr(err, QD_ERR_INVALID_ARG, "sampling params: repetition_penalty must be a "
                         "finite value > 0, 1 = off (got %g)", (double)p->repetition_penalty);
    if (!(p->presence_penalty >= -2.0f && p->presence_penalty <= 2.0f))
        return qd_seterr(err, QD_ERR_INVALID_ARG, "sampling params: presence_penalty must be in "
                         "[-2, 2] (got %g)", (double)p->presence_penalty);
    if (!(p->frequency_penalty >= -2.0f && p->frequency_penalty <= 2.0f))
        return qd_seterr(err, QD_ERR_INVALID_ARG, "sampling params: frequency_penalty must be in "
                         "[-2, 2] (got %g)", (double)p->frequency_penalty);
    if (p->n_logprobs < 0 || p->n_logprobs > QD_MAX_LOGPROBS)
        return qd_seterr(err, QD_ERR_INVALID_ARG, "sampling params: n_logprobs must be in [0, %d] "
                         "(got %d)", QD_MAX_LOGPROBS, p->n_logprobs);
    if (p->vocab_limit < 0 || p->vocab_limit > vocab_size)
        return qd_seterr(err, QD_ERR_INVALID_ARG, "sampling params: vocab_limit must be in [0, %d] "
                         "(the logits row length), 0 = whole row (got %d)", vocab_size, p->vocab_limit);
    return QD_OK;
}

/* -------------------------------------------------------------- lifetime */

qd_status qd_sampler_create(const qd_sampling_params *params, int vocab_size, qd_sampler **out,
                            qd_err *err) {
    if (!out) return qd_seterr(err, QD_ERR_INVALID_ARG, "qd_sampler_create: out is NULL");
    *out = NULL;
    QD_TRY(qd_sampling_params_validate(params, vocab_size, err));
    qd_sampler *s = calloc(1, sizeof *s);
    if (!s) return qd_seterr(err, QD_ERR_OOM, "sampler: out of memory");
    s->p = *params;
    s->vocab_size = vocab_size;
    s->n = params->vocab_limit > 0 ? params->vocab_limit : vocab_size;
    s->rep_on = params->repetition_penalty != 1.0f;
    s->freq_on = params->presence_penalty != 0.0f || params->frequency_penalty != 0.0f;
    int ok = 1;
    if (s->rep_on || s->freq_on) ok &= (s->listed = calloc((size_t)vocab_size, 1)) != NULL;
    if (s->freq_on) ok &= (s->counts = calloc((size_t)vocab_size, sizeof *s->counts)) != NULL;
    if (params->top_k > 0 || params->top_p < 1.0f) {
        ok &= (s->cand = malloc((size_t)vocab_size * sizeof *s->cand)) != NULL;
    }
    if (!ok) {
        qd_sampler_free(s);
        return qd_seterr(err, QD_ERR_OOM, "sampler: out of memory for a vocabulary of %d", vocab_size);
    }
    rng_seed(s->rng, params->seed);
    *out = s;
    return QD_OK;
}

void qd_sampler_free(qd_sampler *s) {
    if (!s) return;
    free(s->listed);
    free(s->counts);
    free(s->seen);
    free(s->saved);
    free(s->cand);
    free(s);
}

void qd_sampler_reset(qd_sampler *s) {
    if (!s) return;
    for (int i = 0; i < s->n_seen; i++) {
        s->listed[s->seen[i]] = 0;
        if (s->counts) s->counts[s->seen[i]] = 0;
    }
    s->n_seen = 0;
    rng_seed(s->rng, s->p.seed);
}

const qd_sampling_params *qd_sampler_params(const qd_sampler *s) { return &s->p; }

/* -------------------------------------------------------------- history */

static qd_status note_token(qd_sampler *s, int32_t id, qd_err *err) {
    if (s->listed[id]) return QD_OK;
    if (s->n_seen == s->cap_seen) {
        int cap = s->cap_seen ? s->cap_seen * 2 : 256;
        int32_t *seen = realloc(s->seen, (size_t)cap * sizeof *seen);
        if (!seen) return qd_seterr(err, QD_ERR_OOM, "sampler: out of memory for token history");
        s->seen = seen;
        float *saved = realloc(s->saved, (size_t)cap * sizeof *saved);
        if (!saved) return qd_seterr(err, QD_ERR_OOM, "sampler: out of memory for token history");
        s->saved = saved;
        s->cap_seen = cap;
    }
    s->seen[s->n_seen++] = id;
    s->listed[id] = 1;
    return QD_OK;
}

qd_status qd_sampler_accept_prompt(qd_sampler *s, const int32_t *ids, int n, qd_err *err) {
    if (n < 0 || (n > 0 && !ids))
        return qd_seterr(err, QD_ERR_INVALID_ARG, "qd_sampler_accept_prompt: bad token array "
                         "(n = %d)", n);
    for (int i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= s->vocab_size)
            return qd_seterr(err, QD_ERR_INVALID_ARG, "qd_sampler_accept_prompt: prompt token %d "
                             "has id %d, outside [0, %d)", i, (int)ids[i], s->vocab_size);
    /* Only the repetition penalty looks at the prompt. */
    if (!s->rep_on) return QD_OK;
    for (int i = 0; i < n; i++) QD_TRY(note_token(s, ids[i], err));
    return QD_OK;
}

qd_status qd_sampler_accept(qd_sampler *s, int32_t token, qd_err *err) {
    if (token < 0 || token >= s->vocab_size)
        return qd_seterr(err, QD_ERR_INVALID_ARG, "qd_sampler_accept: token id %d outside [0, %d)",
                         (int)token, s->vocab_size);
    if (!s->rep_on && !s->freq_on) return QD_OK;
    QD_TRY(note_token(s, token, err));
    if (s->counts) s->counts[token]++;
    return QD_OK;
}

/* ------------------------------------------------------------ penalties */

/* Same float operations, in the same order, as vLLM's apply_penalties. */
static float penalise(const qd_sampler *s, int32_t id, float v) {
    if (s->rep_on) {
        float r = s->p.repetition_penalty;
        v = v > 0.0f ? v / r : v * r;
    }
    if (s->counts) {
        int32_t c = s->counts[id];
        v -= s->p.frequency_penalty * (float)c;
        if (c > 0) v -= s->p.presence_penalty;
    }
    return v;
}

void qd_sampler_apply_penalties(const qd_sampler *s, float *logits) {
    for (int i = 0; i < s->n_seen; i++) {
        int32_t id = s->seen[i];
        if (id < s->n) logits[id] = penalise(s, id, logits[id]);
    }
}

/* ------------------------------------------------------------ selection */

/* exp(x) for x <= 0 (every use here is logit - max), relative error < 2.5e-7 and
 * exactly 0 below -87 (so -inf logits get weight 0). Written branch-free, with the
 * selects done on integer bit patterns, so GCC vectorises the O(V) loops using it
 * even under the default -ftrapping-math: libm expf costs ~5-15 ns a call, which for
 * a 250k vocabulary and several passes is milliseconds per token. The result is a pure
 * function of x, so two passes over the same values agree bit for bit. */
static inline float exp_nonpos(float x) {
    const float log2e = 1.44269504089f, ln2_hi = 0.693145751953125f, ln2_lo = 1.428606820e-6f;
    const float shifter = 12582912.0f; /* 1.5 * 2^23: adding it rounds to an integer */
    const uint32_t neg87 = 0xC2AE0000u; /* bits of -87.0f */
    uint32_t xb;
    memcpy(&xb, &x, sizeof xb);
    /* For x <= 87 of either sign, "x > -87" is "bits below those of -87" as unsigned;
     * -inf and NaN compare above, so they get weight 0. */
    uint32_t mask = 0u - (uint32_t)(xb < neg87);
    uint32_t xcb = (xb & mask) | (neg87 & ~mask);
    float xc;
    memcpy(&xc, &xcb, sizeof xc);
    float ks = xc * log2e + shifter;
    float k = ks - shifter;
    float r = (xc - k * ln2_hi) - k * ln2_lo; /* |r| <= ln2 / 2 */
    /* Taylor to r^6: the truncation error r^7/7! is < 1.3e-7 on |r| <= 0.347. */
    float poly = 1.0f + r * (1.0f + r * (0.5f + r * (1.0f / 6 + r * (1.0f / 24 + r * (1.0f / 120 +
                 r * (1.0f / 720))))));
    uint32_t kb, pb;
    memcpy(&kb, &ks, sizeof kb);
    memcpy(&pb, &poly, sizeof pb);
    pb += kb << 23; /* ks's low mantissa bits hold k in two's complement: scale by 2^k */
    pb &= mask;
    float res;
    memcpy(&res, &pb, sizeof res);
    return res;
}

/* w[i - b] = exp((y[i] - m) * inv_t) for i in [b, e), zeroed when below min_p. The
 * min_p test compares bit patterns, which order non-negative floats like their values. */
#define QD_BLOCK 256
static void block_weights(const float *y, int b, int e, float m, float inv_t, float min_p,
                          float *restrict w) {
    uint32_t mpb;
    memcpy(&mpb, &min_p, sizeof mpb);
    for (int i = b; i < e; i++) {
        float v = exp_nonpos((y[i] - m) * inv_t);
        uint32_t vb;
        memcpy(&vb, &v, sizeof vb);
        vb &= 0u - (uint32_t)(vb >= mpb);
        memcpy(&w[i - b], &vb, sizeof vb);
    }
}

/* Sum of a block's weights: float partial sums in 8 lanes so GCC vectorises it; blocks
 * are short so the float rounding stays ~1e-6 relative, and callers add block sums in
 * double. */
static float block_sum(const float *y, int b, int e, float m, float inv_t, float min_p,
                       float *restrict w) {
    block_weights(y, b, e, m, inv_t, min_p, w);
    int n = e - b, i = 0;
    float part[8] = {0};
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++) part[j] += w[i + j];
    float sum = 0.0f;
    for (; i < n; i++) sum += w[i];
    for (int j = 0; j < 8; j++) sum += part[j];
    return sum;
}

/* Strict total order "a ranks above b": higher logit, ties to the lower id, so every
 * selection and sort below is deterministic. */
static int cand_above(const qd_cand *a, const qd_cand *b) {
    return a->v > b->v || (a->v == b->v && a->id < b->id);
}

static int cand_cmp(const void *pa, const void *pb) {
    const qd_cand *a = pa, *b = pb;
    if (cand_above(a, b)) return -1;
    if (cand_above(b, a)) return 1;
    return 0;
}

static void cand_swap(qd_cand *a, qd_cand *b) {
    qd_cand t = *a;
    *a = *b;
    *b = t;
}

/* A bounded min-heap of the best candidates seen: h[0] is the worst one kept, so a
 * new value costs one comparison unless it beats it. Used for the top-n logprobs and
 * for small top_k, where it replaces a selection over the whole vocabulary. */
typedef struct {
    qd_cand *h;
    int n, cap;
} cand_heap;

static void heap_offer(cand_heap *t, qd_cand c) {
    if (t->n < t->cap) {
        int i = t->n++;
        t->h[i] = c;
        while (i > 0 && cand_above(&t->h[(i - 1) / 2], &t->h[i])) {
            cand_swap(&t->h[(i - 1) / 2], &t->h[i]);
            i = (i - 1) / 2;
        }
        return;
    }
    if (!cand_above(&c, &t->h[0])) return;
    t->h[0] = c;
    for (int i = 0;;) {
        int l = 2 * i + 1, r = l + 1, w = i;
        if (l < t->n && cand_above(&t->h[w], &t->h[l])) w = l;
        if (r < t->n && cand_above(&t->h[w], &t->h[r])) w = r;
        if (w == i) return;
        cand_swap(&t->h[i], &t->h[w]);
        i = w;
    }
}

/* Lomuto partition of c[lo..hi) (hi - lo >= 2) around a median-of-three pivot;
 * returns the pivot's final index: c[lo..p) rank above it, c(p..hi) below. */
static size_t partition(qd_cand *c, size_t lo, size_t hi) {
    size_t mid = lo + (hi - lo) / 2, last = hi - 1;
    if (cand_above(&c[mid], &c[lo])) cand_swap(&c[mid], &c[lo]);
    if (cand_above(&c[last], &c[lo])) cand_swap(&c[last], &c[lo]);
    if (cand_above(&c[last], &c[mid])) cand_swap(&c[last], &c[mid]);
    qd_cand pivot = c[mid];
    cand_swap(&c[mid], &c[last]);
    size_t store = lo;
    for (size_t i = lo; i < last; i++)
        if (cand_above(&c[i], &pivot)) cand_swap(&c[i], &c[store++]);
    cand_swap(&c[store], &c[last]);
    return store;
}

/* Rearranges c[0..n) so that c[0..k) holds the k best (in any order), 0 < k < n.
 * Quickselect; after too many rounds (adversarial input) it falls back to a sort so
 * the worst case stays O(n log n). */
static void select_top(qd_cand *c, size_t n, size_t k) {
    size_t lo = 0, hi = n; /* invariant: lo < k < hi */
    for (int rounds = 0; hi - lo > 1; rounds++) {
        if (rounds > 64) {
            qsort(c + lo, hi - lo, sizeof *c, cand_cmp);
            return;
        }
        size_t p = partition(c, lo, hi);
        if (p == k || p + 1 == k) return;
        if (p > k) hi = p;
        else lo = p + 1;
    }
}

/* top_p over c[0..n) with total weight z: returns how many to keep, having moved them
 * to the front. vLLM's rule: a token is kept while the mass ranked strictly above it
 * is < top_p * z. Instead of sorting everything this is a quickselect guided by mass:
 * partition, and if the part above the pivot already reaches the target discard the
 * pivot and below, else keep the upper part and the pivot and continue below. Expected
 * O(n); only the last small segment is sorted. *kept_mass gets the kept weight. */
static size_t select_nucleus(qd_cand *c, size_t n, double z, float top_p, double *kept_mass) {
    const double target = (double)top_p * z;
    double acc = 0.0; /* weight of c[0..lo), all kept */
    size_t lo = 0, hi = n; /* c[hi..n) are dropped */
    for (int rounds = 0; hi - lo > 16 && rounds < 64; rounds++) {
        size_t p = partition(c, lo, hi);
        double above = 0.0;
        for (size_t i = lo; i < p; i++) above += c[i].w;
        if (acc + above >= target) {
            hi = p;
        } else {
            acc += above + c[p].w;
            lo = p + 1;
        }
    }
    qsort(c + lo, hi - lo, sizeof *c, cand_cmp);
    size_t i = lo;
    for (; i < hi && acc < target; i++) acc += c[i].w;
    /* lo == 0 on entry to the walk means nothing is kept yet, and acc = 0 < target, so
     * at least one token always survives. */
    *kept_mass = acc;
    return i;
}

/* Draws one of c[0..n) by weight; `z` is their summed weight. */
static int32_t draw(const qd_cand *c, size_t n, double z, uint64_t rng[4]) {
    double target = rng_uniform(rng) * z, cum = 0.0;
    int32_t last_pos = c[0].id;
    for (size_t i = 0; i < n; i++) {
        if (c[i].w <= 0.0f) continue;
        cum += c[i].w;
        last_pos = c[i].id;
        if (target < cum) return c[i].id;
    }
    return last_pos; /* rounding left target == z: take the last token with weight */
}

/* Adds to mass[j] the block's weight at or above 2^(-2j), for j < QD_LADDER: a coarse
 * cumulative histogram built with compares and adds only, so it vectorises (a true
 * histogram scatters, which costs more than everything else here). */
#define QD_LADDER 12
static void block_ladder(const float *restrict w, int n, double *mass) {
    for (int j = 0; j < QD_LADDER; j++) {
        const uint32_t tb = (uint32_t)(127 - 2 * j) << 23; /* bits of 2^(-2j) */
        float part[8] = {0};
        int i = 0;
        for (; i + 8 <= n; i += 8)
            for (int l = 0; l < 8; l++) {
                uint32_t wb;
                memcpy(&wb, &w[i + l], sizeof wb);
                wb &= 0u - (uint32_t)(wb >= tb); /* bit order = value order for w >= 0 */
                float v;
                memcpy(&v, &wb, sizeof v);
                part[l] += v;
            }
        float sum = 0.0f;
        for (; i < n; i++) sum += w[i] >= 0x1.0p0f / (float)(1u << (2 * j)) ? w[i] : 0.0f;
        for (int l = 0; l < 8; l++) sum += part[l];
        mass[j] += sum;
    }
}

/* top_k up to this size goes through a heap (one comparison per token); larger k
 * through quickselect over all drawable tokens. */
#define QD_TOPK_HEAP 512

/* Steps 3-5 for the top_k / top_p path. y = penalised logits, m = their max.
 *
 * Only plausible survivors are collected into s->cand:
 *  - top_k <= QD_TOPK_HEAP: the k best drawable tokens, through a heap;
 *  - top_p alone: the tokens with weight >= tau = (1 - top_p) * Z / n / 2. Every token
 *    below tau is dropped by the exact rule: the tokens ranked at or below it all
 *    weigh < tau, so together less than (1 - top_p) * Z, leaving >= top_p * Z ranked
 *    strictly above it. (The halving is margin for rounding.) For a peaked
 *    distribution that is a small fraction of the vocabulary.
 * The exact selections then run on the collected tokens only. */
static size_t filtered_cands(qd_sampler *s, const float *y, float m, float inv_t, double *z_out) {
    qd_cand *c = s->cand;
    const float min_p = s->p.min_p, top_p = s->p.top_p;
    const size_t k = (size_t)s->p.top_k;
    const int n = s->n;
    float w[QD_BLOCK];
    double z = 0.0;
    float tau = 0.0f;
    if (k == 0) { /* top_p alone: the bounds need the total weight first */
        double ladder[QD_LADDER] = {0};
        for (int b = 0; b < n; b += QD_BLOCK) {
            int e = n - b < QD_BLOCK ? n : b + QD_BLOCK;
            z += block_sum(y, b, e, m, inv_t, min_p, w);
            block_ladder(w, e - b, ladder);
        }
        tau = (float)((1.0 - (double)top_p) * z / n * 0.5);
        /* The same argument with measured mass: if the weights >= t already hold
         * top_p * Z, every token below t is dropped. 1e-5 of margin covers the float
         * partial sums. */
        const double target = (double)top_p * z * (1.0 + 1e-5);
        for (int j = 0; j < QD_LADDER; j++)
            if (ladder[j] >= target) {
                float t = 0x1.0p0f / (float)(1u << (2 * j));
                if (t > tau) tau = t;
                break;
            }
    }
    cand_heap heap = {c, 0, k > 0 && k <= QD_TOPK_HEAP ? (int)k : 0};
    size_t nc = 0;
    for (int b = 0; b < n; b += QD_BLOCK) {
        int e = n - b < QD_BLOCK ? n : b + QD_BLOCK;
        block_weights(y, b, e, m, inv_t, min_p, w);
        for (int i = b; i < e; i++) {
            float wi = w[i - b];
            /* weight 0 = -inf, underflow or below min_p: never drawable */
            if (wi <= 0.0f || wi < tau) continue;
            qd_cand ci = {y[i], i, wi};
            if (!heap.cap) c[nc++] = ci;
            /* ids rise, so a full heap takes only strictly larger logits: test inline */
            else if (heap.n < heap.cap || y[i] > c[0].v) heap_offer(&heap, ci);
        }
    }
    if (heap.cap) {
        nc = (size_t)heap.n;
    } else if (k > 0 && k < nc) {
        select_top(c, nc, k);
        nc = k;
    }
    /* With top_k the nucleus is over the k survivors' mass; without, z is the mass of
     * every drawable token, including those below tau. */
    if (k > 0) {
        z = 0.0;
        for (size_t i = 0; i < nc; i++) z += c[i].w;
    }
    if (top_p < 1.0f) nc = select_nucleus(c, nc, z, top_p, &z);
    *z_out = z;
    return nc;
}

/* The draw from what filtered_cands keeps: s->cand[0..nc) weighing z in all. */
static int32_t sample_filtered(qd_sampler *s, const float *y, float m, float inv_t) {
    double z;
    const size_t nc = filtered_cands(s, y, m, inv_t, &z);
    return draw(s->cand, nc, z, s->rng);
}

/* Steps 3-5 with at most min_p: no candidate list. Pass 1 sums the weights block by
 * block; pass 2 skips whole blocks using the same block sums (bit-identical, being the
 * same computation) and walks token by token only inside the block holding the draw. */
static int32_t sample_plain(qd_sampler *s, const float *y, float m, float inv_t) {
    const float min_p = s->p.min_p;
    const int n = s->n;
    float w[QD_BLOCK];
    double z = 0.0;
    for (int b = 0; b < n; b += QD_BLOCK) {
        int e = n - b < QD_BLOCK ? n : b + QD_BLOCK;
        z += block_sum(y, b, e, m, inv_t, min_p, w);
    }
    double target = rng_uniform(s->rng) * z, cum = 0.0;
    int32_t last_pos = -1;
    for (int b = 0; b < n; b += QD_BLOCK) {
        int e = n - b < QD_BLOCK ? n : b + QD_BLOCK;
        double bs = block_sum(y, b, e, m, inv_t, min_p, w);
        if (bs <= 0.0) continue;
        if (cum + bs <= target && e < n) {
            cum += bs;
            continue;
        }
        for (int i = b; i < e; i++) {
            if (w[i - b] <= 0.0f) continue;
            cum += w[i - b];
            last_pos = i;
            if (target < cum) return i;
        }
        /* Rounding inside the block fell short of the target: its last token is the
         * right neighbourhood, and the error is ~1e-7 of the block's mass. */
        return last_pos;
    }
    return last_pos;
}

/* --------------------------------------------------------------- sample */

/* Maps a float's bits to a uint32 that orders like the float (-0 just below +0):
 * flip all bits of negatives, the sign bit of the rest. NaNs land above +inf's key or
 * below -inf's, so a min/max over keys finds them too. Integer min/max vectorise. */
#define KEY_PINF 0xFF800000u
#define KEY_NINF 0x007FFFFFu
static inline uint32_t float_key(float x) {
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return u ^ ((0u - (u >> 31)) | 0x80000000u);
}

static inline float key_float(uint32_t k) {
    uint32_t u = k ^ ((k >> 31) ? 0x80000000u : 0xFFFFFFFFu);
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}

/* Max of x[0..n), ties to the lowest index; QD_ERR_INVALID_ARG on NaN or +inf or an
 * all -inf row. One vectorised min/max pass, then an early-exit scan for the index. */
static qd_status row_max(const float *x, int n, float *m, int32_t *arg, qd_err *err) {
    uint32_t kmax = 0, kmin = 0xFFFFFFFFu;
    for (int i = 0; i < n; i++) {
        uint32_t k = float_key(x[i]);
        kmax = k > kmax ? k : kmax;
        kmin = k < kmin ? k : kmin;
    }
    if (kmax > KEY_PINF || kmin < KEY_NINF) {
        for (int i = 0; i < n; i++)
            if (isnan(x[i])) return qd_seterr(err, QD_ERR_INVALID_ARG, "sampler: logits[%d] is NaN", i);
    }
    *m = key_float(kmax);
    int32_t i = 0;
    while (i < n && !(x[i] == *m)) i++;
    *arg = i;
    if (kmax == KEY_PINF)
        return qd_seterr(err, QD_ERR_INVALID_ARG, "sampler: logits[%d] is +inf", (int)i);
    if (kmax == KEY_NINF)
        return qd_seterr(err, QD_ERR_INVALID_ARG, "sampler: every logit in [0, %d) is -inf", n);
    return QD_OK;
}

/* The raw row's report for a chosen token: its logprob and the top-n alternatives (m: the
 * row's max). */
static void raw_report(const qd_sampler *s, const float *logits, float m, int32_t tok, qd_sample_result *out) {
    const int n = s->n;
    qd_cand top[QD_MAX_LOGPROBS];
    cand_heap heap = {top, 0, s->p.n_logprobs < n ? s->p.n_logprobs : n};
    if (heap.cap)
        for (int i = 0; i < n; i++)
            /* ids rise, so a full heap only takes strictly larger logits: test inline */
            if (heap.n < heap.cap || logits[i] > top[0].v) heap_offer(&heap, (qd_cand){logits[i], i, 0.0f});
    float w[QD_BLOCK];
    double sum = 0.0;
    for (int b = 0; b < n; b += QD_BLOCK) {
        int e = n - b < QD_BLOCK ? n : b + QD_BLOCK;
        sum += block_sum(logits, b, e, m, 1.0f, 0.0f, w);
    }
    const double lse = (double)m + log(sum);
    out->token = tok;
    out->logprob = (float)((double)logits[tok] - lse);
    qsort(heap.h, (size_t)heap.n, sizeof heap.h[0], cand_cmp);
    out->n_top = heap.n;
    for (int i = 0; i < heap.n; i++) {
        out->top[i].id = heap.h[i].id;
        out->top[i].logprob = (float)((double)heap.h[i].v - lse);
    }
}

qd_status qd_sampler_report(const qd_sampler *s, const float *logits, int32_t token, qd_sample_result *out,
                            qd_err *err) {
    if (!s || !logits || !out) return qd_seterr(err, QD_ERR_INVALID_ARG, "qd_sampler_report: NULL argument");
    if (token < 0 || token >= s->n)
        return qd_seterr(err, QD_ERR_INVALID_ARG, "qd_sampler_report: token id %d outside [0, %d)", (int)token, s->n);
    float m;
    int32_t arg;
    QD_TRY(row_max(logits, s->n, &m, &arg, err));
    raw_report(s, logits, m, token, out);
    return QD_OK;
}

qd_status qd_sampler_probs(qd_sampler *s, float *logits, float *probs, qd_err *err) {
    if (!s || !logits || !probs) return qd_seterr(err, QD_ERR_INVALID_ARG, "qd_sampler_probs: NULL argument");
    const int n = s->n;
    float m;
    int32_t arg;
    QD_TRY(row_max(logits, n, &m, &arg, err));
    /* step 1 as qd_sampler_sample does it, the raw values kept to restore the row */
    if (s->n_seen > 0) {
        for (int i = 0; i < s->n_seen; i++) {
            int32_t id = s->seen[i];
            if (id < n) {
                s->saved[i] = logits[id];
                logits[id] = penalise(s, id, logits[id]);
            }
        }
        qd_err ignored;
        if (row_max(logits, n, &m, &arg, &ignored) != QD_OK && !(m == INFINITY)) m = -INFINITY;
    }
    memset(probs, 0, sizeof(float) * (size_t)s->vocab_size);
    if (s->p.temperature < QD_SAMPLER_GREEDY_EPS || isinf(m)) {
        probs[arg] = 1.0f; /* the greedy pick is certain */
    } else {
        const float inv_t = 1.0f / s->p.temperature;
        if (s->cand) {
            double z;
            const size_t nc = filtered_cands(s, logits, m, inv_t, &z);
            for (size_t i = 0; i < nc; i++)
                if (s->cand[i].w > 0.0f) probs[s->cand[i].id] = (float)(s->cand[i].w / z);
        } else {
            float w[QD_BLOCK];
            double z = 0.0;
            for (int b = 0; b < n; b += QD_BLOCK) {
                int e = n - b < QD_BLOCK ? n : b + QD_BLOCK;
                z += block_sum(logits, b, e, m, inv_t, s->p.min_p, w);
            }
            for (int b = 0; b < n; b += QD_BLOCK) {
                int e = n - b < QD_BLOCK ? n : b + QD_BLOCK;
                block_weights(logits, b, e, m, inv_t, s->p.min_p, w);
                for (int i = b; i < e; i++) probs[i] = (float)(w[i - b] / z);
            }
        }
    }
    for (int i = 0; i < s->n_seen; i++)
        if (s->seen[i] < n) logits[s->seen[i]] = s->saved[i];
    return QD_OK;
}

qd_status qd_sampler_sample(qd_sampler *s, float *logits, qd_sample_result *out, qd_err *err) {
    if (!s || !logits || !out)
        return qd_seterr(err, QD_ERR_INVALID_ARG, "qd_sampler_sample: NULL argument");
    const int n = s->n;

    /* Step 0: validate, raw max (with argmax for greedy); the raw row's report (its
     * logprobs and top-n) is taken at the end, from the row restored. */
    float m;
    int32_t arg;
    QD_TRY(row_max(logits, n, &m, &arg, err));
    const float m_raw = m;

    /* Step 1: penalties in place, keeping the raw values to restore. */
    if (s->n_seen > 0) {
        for (int i = 0; i < s->n_seen; i++) {
            int32_t id = s->seen[i];
            if (id < n) {
                s->saved[i] = logits[id];
                logits[id] = penalise(s, id, logits[id]);
            }
        }
        /* Finite penalties of finite logits stay non-NaN; an overflow to +-inf is
         * handled below, so only the max and argmax matter here. */
        qd_err ignored;
        if (row_max(logits, n, &m, &arg, &ignored) != QD_OK && !(m == INFINITY)) m = -INFINITY;
    }

    int32_t tok;
    if (s->p.temperature < QD_SAMPLER_GREEDY_EPS || isinf(m)) {
        /* row_max keeps the lowest id among equal maxima. An infinite max can only come
         * from a penalty overflowing float; argmax is the sane answer. */
        tok = arg;
    } else {
        float inv_t = 1.0f / s->p.temperature;
        if (s->cand) tok = sample_filtered(s, logits, m, inv_t);
        else tok = sample_plain(s, logits, m, inv_t);
        if (tok < 0) tok = arg; /* unreachable: the max always has weight 1 */
    }

    for (int i = 0; i < s->n_seen; i++)
        if (s->seen[i] < n) logits[s->seen[i]] = s->saved[i];
    raw_report(s, logits, m_raw, tok, out);
    return QD_OK;
}
