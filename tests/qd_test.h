/* Minimal test harness: CHECK macros that count, and a summary line ctest can read.
 * A test program returns qd_test_finish(): 0 when every check passed, 1 otherwise,
 * 77 (ctest "skipped") only through qd_test_skip(). */
#ifndef QD_TEST_H
#define QD_TEST_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static int qd_test_passed = 0;
static int qd_test_failed = 0;

/* Rounds of a randomized differential test's outer loop: all of them in a normal build, a
 * quarter (at least one) in a sanitizer build (QD_SANITIZE), where each costs ten times as
 * much and what is sought is a memory error, not a rare mismatch; the Release stage of CI
 * runs every round. */
#ifdef QD_SANITIZED
#define QD_TEST_ROUNDS(n) ((n) / 4 > 0 ? (n) / 4 : 1)
#define QD_TEST_SANITIZED 1
#else
#define QD_TEST_ROUNDS(n) (n)
#define QD_TEST_SANITIZED 0
#endif

#define CHECK(cond)                                                                \
    do {                                                                           \
        if (cond) qd_test_passed++;                                                \
        else {                                                                     \
            qd_test_failed++;                                                      \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
        }                                                                          \
    } while (0)

#define CHECKF(cond, ...)                                                          \
    do {                                                                           \
        if (cond) qd_test_passed++;                                                \
        else {                                                                     \
            qd_test_failed++;                                                      \
            fprintf(stderr, "%s:%d: CHECK failed: %s: ", __FILE__, __LINE__, #cond); \
            fprintf(stderr, __VA_ARGS__);                                          \
            fputc('\n', stderr);                                                   \
        }                                                                          \
    } while (0)

static inline int qd_test_finish(const char *name) {
    printf("%s: %d passed, %d failed\n", name, qd_test_passed, qd_test_failed);
    return qd_test_failed ? 1 : 0;
}

/* Reads a whole file into a NUL-terminated malloc'd buffer; NULL if it cannot be read. */
static inline char *qd_test_read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = n >= 0 ? malloc((size_t)n + 1) : NULL;
    if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        buf = NULL;
    }
    fclose(f);
    if (buf) buf[n] = 0;
    if (len) *len = buf ? (size_t)n : 0;
    return buf;
}

/* max |a[i] - b[i]| (NaN counts as infinitely far). */
static inline double qd_test_max_diff(const float *a, const float *b, size_t n) {
    double e = 0;
    for (size_t i = 0; i < n; i++) {
        const double d = fabs((double)a[i] - b[i]);
        if (!(d <= e)) e = d;
    }
    return e;
}

/* Index of the largest of x[0..n), the lowest among equals. */
static inline int qd_test_argmax(const float *x, int n) {
    int b = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return b;
}

/* The gap between x's largest value and its second largest over [0, n) (n >= 2): a row
 * whose argmax another rounding of the same logits cannot change when the gap is wide. */
static inline float qd_test_top_gap(const float *x, int n) {
    const int a = qd_test_argmax(x, n);
    float second = -INFINITY;
    for (int i = 0; i < n; i++)
        if (i != a && x[i] > second) second = x[i];
    return x[a] - second;
}

static inline int qd_test_skip(const char *name, const char *why) {
    printf("%s: skipped: %s\n", name, why);
    return 77;
}

/* Deterministic xorshift RNG for test inputs; seed from the environment
 * (QD_TEST_SEED) or time, printed so a failure can be replayed. */
typedef struct { uint64_t s; } qd_test_rng;

static inline uint64_t qd_test_next(qd_test_rng *r) {
    uint64_t x = r->s;
    x ^= x << 13; x ^= x >> 7; x ^= x << 17;
    return r->s = x;
}
static inline float qd_test_uniform(qd_test_rng *r) {  /* [-1, 1) */
    return (float)((qd_test_next(r) >> 40) * (1.0 / 16777216.0) * 2.0 - 1.0);
}
static inline float qd_test_normal(qd_test_rng *r) {
    double u1 = ((qd_test_next(r) >> 11) + 1.0) * (1.0 / 9007199254740993.0);
    double u2 = (qd_test_next(r) >> 11) * (1.0 / 9007199254740992.0);
    return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}
static inline qd_test_rng qd_test_rng_from_env(void) {
    const char *e = getenv("QD_TEST_SEED");
    uint64_t seed = e ? strtoull(e, NULL, 0) : (uint64_t)time(NULL);
    if (!seed) seed = 0x9e3779b97f4a7c15ull;
    fprintf(stderr, "QD_TEST_SEED=%llu\n", (unsigned long long)seed);
    qd_test_rng r = {seed * 0x9e3779b97f4a7c15ull | 1};
    return r;
}

#endif
