/* base/: arena, thread pool, dtype conversions, error messages. */
#include <stdatomic.h>
#include <string.h>

#include "base/arena.h"
#include "base/dtype.h"
#include "base/err.h"
#include "base/threadpool.h"
#include "qd_test.h"

static void test_arena(void) {
    qd_arena a;
    CHECK(qd_arena_init(&a, 1000) == 0);
    void *p1 = qd_arena_alloc(&a, 10);
    void *p2 = qd_arena_alloc(&a, 100);
    CHECK(p1 && p2 && ((uintptr_t)p1 % 64) == 0 && ((uintptr_t)p2 % 64) == 0);
    CHECK((char *)p2 >= (char *)p1 + 10);
    size_t mark = qd_arena_mark(&a);
    CHECK(qd_arena_alloc(&a, 2000) == NULL); /* exhausted: NULL, not a crash */
    CHECK(qd_arena_mark(&a) == mark);       /* a failed allocation takes nothing */
    unsigned char *z = qd_arena_calloc(&a, 64);
    int zero = 1;
    for (int i = 0; i < 64; i++) zero &= z[i] == 0;
    CHECK(zero);
    qd_arena_reset_to(&a, mark);
    CHECK(qd_arena_alloc(&a, 64) == (void *)z);
    CHECK(a.high_water >= mark + 64);
    qd_arena_free(&a);
    void *q = qd_aligned_calloc(3);
    CHECK(q && ((uintptr_t)q % 64) == 0);
    qd_aligned_free(q);
}

typedef struct {
    atomic_int *hits;
    atomic_int calls;
    int max_worker;
} pf_ctx;

static void pf_body(void *user, int64_t begin, int64_t end, int worker) {
    pf_ctx *c = user;
    atomic_fetch_add(&c->calls, 1);
    if (worker > c->max_worker) c->max_worker = worker;
    for (int64_t i = begin; i < end; i++) atomic_fetch_add(&c->hits[i], 1);
}

static void test_threadpool(void) {
    const int sizes[] = {1, 2, 3, 7, 64, 1000};
    for (int threads = 0; threads <= 4; threads++) {
        qd_threadpool *pool = threads ? qd_threadpool_create(threads) : NULL;
        CHECK(!threads || pool);
        for (int si = 0; si < 6; si++) {
            for (int grain = 1; grain <= 16; grain *= 4) {
                int n = sizes[si];
                atomic_int *hits = calloc((size_t)n, sizeof(atomic_int));
                pf_ctx c = {hits, 0, 0};
                qd_parallel_for(pool, n, grain, pf_body, &c);
                int once = 1;
                for (int i = 0; i < n; i++) once &= atomic_load(&hits[i]) == 1;
                CHECKF(once, "threads %d n %d grain %d: every index exactly once", threads, n, grain);
                CHECK(c.max_worker < qd_threadpool_size(pool));
                free(hits);
            }
        }
        /* many back-to-back loops: no lost wake-ups */
        atomic_int *hits = calloc(8, sizeof(atomic_int));
        pf_ctx c = {hits, 0, 0};
        for (int r = 0; r < 2000; r++) qd_parallel_for(pool, 8, 1, pf_body, &c);
        int ok = 1;
        for (int i = 0; i < 8; i++) ok &= atomic_load(&hits[i]) == 2000;
        CHECK(ok);
        free(hits);
        qd_threadpool_free(pool);
    }
}

static void test_dtype(void) {
    /* bf16: exact for bf16-representable values, round to nearest even otherwise */
    CHECK(qd_bf16_to_f32(qd_f32_to_bf16(1.0f)) == 1.0f);
    CHECK(qd_bf16_to_f32(qd_f32_to_bf16(-2.5f)) == -2.5f);
    CHECK(qd_f32_to_bf16(1.0f + 1.0f / 256) == 0x3f80);        /* tie -> even (down) */
    CHECK(qd_f32_to_bf16(1.0f + 3.0f / 256) == 0x3f82);        /* tie -> even (up) */
    CHECK(isnan(qd_bf16_to_f32(qd_f32_to_bf16(NAN))));
    CHECK(isinf(qd_bf16_to_f32(qd_f32_to_bf16(INFINITY))));
    /* f16 */
    const float f16_vals[] = {0.0f, 1.0f, -1.5f, 65504.0f, 6.103515625e-05f, 5.9604645e-08f, 0.333251953125f};
    for (int i = 0; i < 7; i++)
        CHECKF(qd_f16_to_f32(qd_f32_to_f16(f16_vals[i])) == f16_vals[i], "f16 round trip of %g", f16_vals[i]);
    CHECK(qd_f32_to_f16(1e6f) == 0x7c00);
    CHECK(qd_f16_to_f32(0x3c00) == 1.0f && qd_f16_to_f32(0xc000) == -2.0f);
    /* f8 e4m3fn: 0x38 = 1.0, 0x7e = 448 (max), 0x7f = NaN, 0x01 = 2^-9 */
    CHECK(qd_f8e4m3_to_f32(0x38) == 1.0f);
    CHECK(qd_f8e4m3_to_f32(0x7e) == 448.0f);
    CHECK(qd_f8e4m3_to_f32(0xbe) == -1.75f); /* 1 0111 110: -(1 + 6/8) * 2^(7-7) */
    CHECK(isnan(qd_f8e4m3_to_f32(0x7f)));
    CHECK(qd_f8e4m3_to_f32(0x01) == ldexpf(1.0f, -9));
    /* every code against the format's definition: (-1)^s 2^(e-7) (1 + m/8), subnormals m 2^-9 */
    int f8_bad = 0;
    for (int v = 0; v < 256; v++) {
        const int e = (v >> 3) & 15, m = v & 7;
        const float mag = e ? ldexpf(1.0f + (float)m / 8.0f, e - 7) : ldexpf((float)m, -9);
        const float want = (v & 0x80) ? -mag : mag, got = qd_f8e4m3_to_f32((uint8_t)v);
        if (e == 15 && m == 7) f8_bad += !isnan(got);
        else f8_bad += memcmp(&got, &want, 4) != 0; /* -0.0 included */
    }
    CHECKF(f8_bad == 0, "e4m3 decode: %d of 256 codes differ from the definition", f8_bad);
    /* the NaN-code scan: each of the 256 codes alone at every offset of a 1..40-byte buffer of
     * finite codes (the word loop and the tail), and a clean buffer */
    uint8_t buf[40];
    int scan_bad = 0;
    for (int len = 1; len <= 40; len++)
        for (int v = 0; v < 256; v++)
            for (int at = 0; at < len; at++) {
                for (int i = 0; i < len; i++) buf[i] = (uint8_t)((i * 37 + len) % 256) & 0xf7; /* never NaN */
                buf[at] = (uint8_t)v;
                const int64_t want = (v & 0x7f) == 0x7f ? at : -1;
                scan_bad += qd_e4m3_first_nan(buf, len) != want;
            }
    CHECKF(scan_bad == 0, "e4m3 NaN scan: %d wrong answers", scan_bad);
    CHECK(qd_dtype_parse("BF16") == QD_DTYPE_BF16 && qd_dtype_parse("F8_E4M3") == QD_DTYPE_F8_E4M3);
    CHECK(qd_dtype_parse("Q4_K") == -1);
    uint16_t src[3] = {0x3f80, 0x4000, 0xbf80};
    float dst[3];
    qd_convert_to_f32(QD_DTYPE_BF16, src, dst, 3);
    CHECK(dst[0] == 1.0f && dst[1] == 2.0f && dst[2] == -1.0f);
}

static void test_err(void) {
    qd_err e;
    qd_err_clear(&e);
    CHECK(qd_seterr(&e, QD_ERR_SHAPE, "tensor '%s' bad", "w") == QD_ERR_SHAPE);
    CHECK(qd_err_prefix(&e, "loading %s", "dir") == QD_ERR_SHAPE);
    CHECK(!strcmp(e.msg, "loading dir: tensor 'w' bad"));
    char longp[2000];
    memset(longp, 'x', sizeof longp - 1);
    longp[sizeof longp - 1] = 0;
    qd_err_prefix(&e, "%s", longp); /* over-long: truncated, still terminated */
    CHECK(strlen(e.msg) < sizeof e.msg);
    CHECK(qd_seterr(NULL, QD_ERR_IO, "ignored") == QD_ERR_IO);
    CHECK(!strcmp(qd_status_name(QD_ERR_CAPACITY), "QD_ERR_CAPACITY"));
}

int main(void) {
    test_arena();
    test_threadpool();
    test_dtype();
    test_err();
    return qd_test_finish("test_base");
}
