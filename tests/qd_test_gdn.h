/* Random inputs of the Gated DeltaNet delta rule shared by its tests (test_gdn,
 * test_cuda_gdn, test_backend_ops): the same draws from the same generator, so a seed
 * replays the same case in each. */
#ifndef QD_TEST_GDN_H
#define QD_TEST_GDN_H

#include "qd_test.h"

/* A random head vector of norm `scale` (q is fed at dk^-0.5, as the layer scales it). */
static inline void qd_test_gdn_unit(qd_test_rng *rng, float *x, int n, float scale) {
    double ss = 0;
    for (int i = 0; i < n; i++) {
        x[i] = qd_test_normal(rng);
        ss += (double)x[i] * x[i];
    }
    const double f = scale / sqrt(ss + 1e-6);
    for (int i = 0; i < n; i++) x[i] = (float)(x[i] * f);
}

/* A log-decay: mostly in [-3, 0), some tiny (almost no decay), some about -20 (the state
 * wiped), which stresses exp(G_i - G_m) over a chunk. */
static inline float qd_test_gdn_log_decay(qd_test_rng *rng) {
    const float u = 0.5f * (qd_test_uniform(rng) + 1.0f); /* [0, 1) */
    if (u < 0.1f) return -20.0f + 5.0f * qd_test_uniform(rng);
    if (u < 0.3f) return -1e-3f * (0.5f * (qd_test_uniform(rng) + 1.0f)) - 1e-7f;
    return -3.0f * (0.5f * (qd_test_uniform(rng) + 1.0f)) - 1e-7f;
}

#endif
