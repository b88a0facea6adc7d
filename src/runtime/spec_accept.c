/* Speculative decoding's accept step (spec_accept.h). */
#include "runtime/spec_accept.h"

#include <math.h>
#include <stddef.h>

static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

void qd_spec_rng_seed(qd_spec_rng *r, uint64_t seed) {
    uint64_t x = seed;
    for (int i = 0; i < 4; i++) { /* splitmix64 */
        uint64_t z = (x += 0x9e3779b97f4a7c15ull);
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
        r->s[i] = z ^ (z >> 31);
    }
}

double qd_spec_rng_uniform(qd_spec_rng *r) {
    uint64_t *s = r->s;
    const uint64_t out = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return (double)(out >> 11) * 0x1.0p-53;
}

int qd_spec_accept_greedy(const int32_t *draft, int k, const int32_t *target, int32_t *out) {
    int a = 0;
    while (a < k && draft[a] == target[a]) {
        out[a] = draft[a];
        a++;
    }
    out[a] = target[a];
    return a + 1;
}

void qd_spec_probs(const float *logits, int n, float temperature, float *probs) {
    double mx = -INFINITY, z = 0;
    for (int i = 0; i < n; i++) mx = fmax(mx, (double)logits[i]);
    for (int i = 0; i < n; i++) z += exp(((double)logits[i] - mx) / temperature);
    for (int i = 0; i < n; i++) probs[i] = (float)(exp(((double)logits[i] - mx) / temperature) / z);
}

/* A draw from weights w [n] (not normalised, summing to z > 0). */
static int32_t draw(const double *w, int n, double z, qd_spec_rng *rng) {
    const double target = qd_spec_rng_uniform(rng) * z;
    double cum = 0;
    int last = 0;
    for (int i = 0; i < n; i++) {
        if (w[i] <= 0) continue;
        last = i;
        cum += w[i];
        if (target < cum) return i;
    }
    return last; /* rounding: the last token with weight */
}

int qd_spec_accept_one(const float *pi, const float *qi, int32_t d, int n, qd_spec_rng *rng, double *resid,
                       int32_t *out) {
    /* keep with probability min(1, p/q): u < p/q, i.e. u * q < p */
    if (qi[d] > 0 && qd_spec_rng_uniform(rng) * qi[d] < pi[d]) {
        *out = d;
        return 1;
    }
    double z = 0;
    for (int v = 0; v < n; v++) z += resid[v] = fmax(0.0, (double)pi[v] - qi[v]);
    if (!(z > 0)) { /* p == q up to rounding: the residual is empty, draw from p */
        for (int v = 0; v < n; v++) z += resid[v] = pi[v];
    }
    *out = draw(resid, n, z, rng);
    return 0;
}

int qd_spec_accept_greedy_draft(const float *pi, int32_t d, int n, qd_spec_rng *rng, double *resid, int32_t *out) {
    /* q = 1 at d: keep with probability p(d); the residual max(0, p - q) is p without d */
    if (qd_spec_rng_uniform(rng) < pi[d]) {
        *out = d;
        return 1;
    }
    double z = 0;
    for (int v = 0; v < n; v++) z += resid[v] = v == d ? 0.0 : (double)pi[v];
    if (!(z > 0)) { /* p(d) == 1 up to rounding */
        *out = d;
        return 1;
    }
    *out = draw(resid, n, z, rng);
    return 0;
}

int qd_spec_accept_sampled(const float *p, const float *q, const int32_t *draft, int k, int n, qd_spec_rng *rng,
                           double *resid, int32_t *out) {
    for (int i = 0; i < k; i++)
        if (!qd_spec_accept_one(p + (size_t)i * n, q + (size_t)i * n, draft[i], n, rng, resid, &out[i])) return i + 1;
    const float *pk = p + (size_t)k * n;
    double z = 0;
    for (int v = 0; v < n; v++) z += resid[v] = pk[v];
    out[k] = draw(resid, n, z, rng);
    return k + 1;
}
