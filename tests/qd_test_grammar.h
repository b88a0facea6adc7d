/* Helpers of the grammar tests: the fixed-seed xorshift their random walks replay (each
 * test keeps its own seed, so a walk is the same run to run) and a bit of a token mask. */
#ifndef QD_TEST_GRAMMAR_H
#define QD_TEST_GRAMMAR_H

#include <stdint.h>

/* The next value of the xorshift state s, reduced to [0, n). */
static inline unsigned qd_test_xorshift(uint64_t *s, unsigned n) {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return (unsigned)(*s % n);
}

/* Whether token i is allowed by the mask m (bit i % 32 of word i / 32). */
static inline int qd_test_mask_bit(const uint32_t *m, int i) { return (m[i >> 5] >> (i & 31)) & 1; }

#endif
