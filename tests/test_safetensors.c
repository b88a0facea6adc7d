/* safetensors reader: valid single files, sharded directories with and without an
 * index, and every malformed-input case the reader must reject with a status and a
 * message naming the file and the tensor. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* nftw, mkdtemp */
#endif
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "io/safetensors.h"
#include "qd_test.h"

static char g_root[256];

/* A file image: 8-byte little-endian header length, header, data. */
static unsigned char *make_image(const char *header, const void *data, size_t dlen, size_t *len) {
    size_t hl = strlen(header);
    *len = 8 + hl + dlen;
    unsigned char *b = malloc(*len);
    for (int i = 0; i < 8; i++) b[i] = (unsigned char)((uint64_t)hl >> (8 * i));
    memcpy(b + 8, header, hl);
    if (dlen) memcpy(b + 8 + hl, data, dlen);
    return b;
}

static void write_bytes(const char *path, const void *b, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f) { perror(path); exit(1); }
    if (n) fwrite(b, 1, n, f);
    fclose(f);
}

static void write_st(const char *path, const char *header, const void *data, size_t dlen) {
    size_t len;
    unsigned char *b = make_image(header, data, dlen, &len);
    write_bytes(path, b, len);
    free(b);
}

static char *mkdir_in_root(const char *name) {
    static char buf[8][512];
    static int k;
    char *p = buf[k++ % 8];
    snprintf(p, 512, "%s/%s", g_root, name);
    mkdir(p, 0700);
    return p;
}

static const char *path_in(const char *dir, const char *name) {
    static char buf[4][512];
    static int k;
    char *p = buf[k++ % 4];
    snprintf(p, 512, "%s/%s", dir, name);
    return p;
}

/* Opens an in-memory image and expects failure with `status` and every `needles`
 * substring in the message. */
#define EXPECT_MEM_FAIL(header, data, dlen, status, ...)                                            \
    do {                                                                                            \
        size_t len_;                                                                                \
        unsigned char *img_ = make_image(header, data, dlen, &len_);                                \
        qd_safetensors *st_ = (qd_safetensors *)1;                                                  \
        qd_err e_ = {0};                                                                            \
        qd_status s_ = qd_st_open_memory(img_, len_, "mem.safetensors", &st_, &e_);                  \
        CHECKF(s_ == (status), "got %s: %s", qd_status_name(s_), e_.msg);                            \
        CHECK(st_ == NULL);                                                                         \
        const char *nd_[] = {"mem.safetensors", __VA_ARGS__};                                       \
        for (size_t i_ = 0; i_ < sizeof nd_ / sizeof nd_[0]; i_++)                                  \
            CHECKF(strstr(e_.msg, nd_[i_]) != NULL, "'%s' not in message: %s", nd_[i_], e_.msg);  \
        free(img_);                                                                                 \
    } while (0)

static void check_msg(qd_status s, qd_status want, const qd_err *e, const char *n1, const char *n2) {
    CHECKF(s == want, "got %s want %s: %s", qd_status_name(s), qd_status_name(want), e->msg);
    if (n1) CHECKF(strstr(e->msg, n1) != NULL, "'%s' not in message: %s", n1, e->msg);
    if (n2) CHECKF(strstr(e->msg, n2) != NULL, "'%s' not in message: %s", n2, e->msg);
}

static void test_valid_single(void) {
    float a[6] = {0, 1, 2, 3, 4, 5};
    uint16_t b[4] = {0x3f80, 0x4000, 0x4040, 0x4080}; /* bf16 1 2 3 4 */
    unsigned char data[32];
    memcpy(data, a, 24);
    memcpy(data + 24, b, 8);
    const char *ok = "{\"__metadata__\":{\"format\":\"pt\"},"
                     "\"w.b\":{\"dtype\":\"BF16\",\"shape\":[4],\"data_offsets\":[24,32]},"
                     "\"w.a\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]},"
                     "\"empty\":{\"dtype\":\"I64\",\"shape\":[0,5],\"data_offsets\":[24,24]}   ";
    char full[1024];
    snprintf(full, sizeof full, "%s}", ok); /* trailing spaces before '}' like real padding */
    char *dir = mkdir_in_root("single");
    write_st(path_in(dir, "model.safetensors"), full, data, sizeof data);

    qd_err e = {0};
    qd_safetensors *st = NULL;
    qd_status s = qd_st_open_dir(dir, &st, &e);
    CHECKF(s == QD_OK, "%s", e.msg);
    if (s != QD_OK) return;
    CHECK(qd_st_count(st) == 3);
    /* qd_st_at order is by data offset within a file */
    CHECK(strcmp(qd_st_at(st, 0)->name, "w.a") == 0);
    CHECK(qd_st_at(st, 3) == NULL && qd_st_at(st, -1) == NULL);
    const qd_st_tensor *ta = qd_st_find(st, "w.a");
    CHECK(ta && ta->dtype == QD_DTYPE_F32 && ta->ndim == 2 && ta->shape[0] == 2 && ta->shape[1] == 3);
    CHECK(ta && ta->n_elements == 6 && ta->n_bytes == 24);
    if (ta) {
        float got[6];
        memcpy(got, ta->data, 24);
        CHECK(got[0] == 0 && got[5] == 5);
        CHECK(strstr(qd_st_file_name(st, ta->file_index), "model.safetensors") != NULL);
    }
    const qd_st_tensor *tb = qd_st_find(st, "w.b");
    CHECK(tb && tb->dtype == QD_DTYPE_BF16 && tb->ndim == 1 && tb->n_elements == 4);
    if (tb) {
        uint16_t h;
        memcpy(&h, (const char *)tb->data + 6, 2);
        CHECK(qd_bf16_to_f32(h) == 4.0f);
    }
    const qd_st_tensor *te = qd_st_find(st, "empty");
    CHECK(te && te->n_elements == 0 && te->n_bytes == 0);
    CHECK(qd_st_find(st, "missing") == NULL);
    CHECK(qd_st_find(st, "__metadata__") == NULL);
    qd_st_close(st);

    /* the same file through qd_st_open_file */
    s = qd_st_open_file(path_in(dir, "model.safetensors"), &st, &e);
    CHECKF(s == QD_OK, "%s", e.msg);
    if (s == QD_OK) {
        CHECK(qd_st_count(st) == 3);
        qd_st_close(st);
    }
}

/* A tensor of a wider dtype after one of an odd byte count starts at an address its element
 * size does not divide (the format pads only its header): it is read from an aligned copy
 * with the stored values; an aligned one stays in the mapping. */
static void test_misaligned(void) {
    unsigned char data[3 + 8 + 12];
    const uint8_t codes[3] = {1, 2, 3};
    const uint16_t b[4] = {0x3f80, 0x4000, 0x4040, 0x4080}; /* bf16 1 2 3 4 */
    const float f[3] = {0.5f, -2.0f, 8.0f};
    memcpy(data, codes, 3);
    memcpy(data + 3, b, 8);
    memcpy(data + 11, f, 12);
    /* header padded to a multiple of 8, as writers do: data offset 0 is 8-aligned */
    char header[256];
    int hl = snprintf(header, sizeof header,
                      "{\"c\":{\"dtype\":\"U8\",\"shape\":[3],\"data_offsets\":[0,3]},"
                      "\"b\":{\"dtype\":\"BF16\",\"shape\":[4],\"data_offsets\":[3,11]},"
                      "\"f\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[11,23]}}");
    while ((hl + 8) % 8) header[hl++] = ' ';
    header[hl] = 0;
    char *dir = mkdir_in_root("misaligned");
    write_st(path_in(dir, "model.safetensors"), header, data, sizeof data);
    qd_err e = {0};
    qd_safetensors *st = NULL;
    CHECKF(qd_st_open_dir(dir, &st, &e) == QD_OK, "%s", e.msg);
    if (!st) return;
    const qd_st_tensor *tc = qd_st_find(st, "c"), *tb = qd_st_find(st, "b"), *tf = qd_st_find(st, "f");
    CHECK(tc && tb && tf);
    if (tc && tb && tf) {
        CHECK(tc->copy == NULL && ((const uint8_t *)tc->data)[2] == 3);
        CHECKF(tb->copy != NULL && (uintptr_t)tb->data % 2 == 0, "BF16 at an odd offset: copy %p, data %p", tb->copy,
               tb->data);
        CHECK(qd_bf16_to_f32(((const uint16_t *)tb->data)[3]) == 4.0f);
        CHECK(tf->copy != NULL && (uintptr_t)tf->data % 4 == 0 && ((const float *)tf->data)[1] == -2.0f);
    }
    qd_st_close(st);
}

static void test_many_tensors(void) {
    /* 3000 tensors: exercises the hash table and the overlap sort. */
    enum { N = 3000 };
    size_t cap = (size_t)N * 80 + 16, n = 0;
    char *h = malloc(cap);
    n += (size_t)snprintf(h + n, cap - n, "{");
    for (int i = 0; i < N; i++)
        n += (size_t)snprintf(h + n, cap - n, "%s\"layer.%d.w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[%d,%d]}",
                              i ? "," : "", N - 1 - i, 4 * i, 4 * i + 4);
    snprintf(h + n, cap - n, "}");
    float *d = calloc(N, 4);
    for (int i = 0; i < N; i++) d[i] = (float)(N - 1 - i);
    size_t len;
    unsigned char *img = make_image(h, d, N * 4, &len);
    qd_safetensors *st;
    qd_err e = {0};
    qd_status s = qd_st_open_memory(img, len, "many", &st, &e);
    CHECKF(s == QD_OK, "%s", e.msg);
    if (s == QD_OK) {
        CHECK(qd_st_count(st) == N);
        int bad = 0;
        for (int i = 0; i < N; i++) {
            char name[32];
            snprintf(name, sizeof name, "layer.%d.w", i);
            const qd_st_tensor *t = qd_st_find(st, name);
            float v;
            if (!t) { bad++; continue; }
            memcpy(&v, t->data, 4);
            bad += v != (float)i;
        }
        CHECK(bad == 0);
        qd_st_close(st);
    }
    free(img);
    free(d);
    free(h);
}

static void test_sharded(void) {
    char *dir = mkdir_in_root("sharded");
    float d[4] = {1, 2, 3, 4};
    write_st(path_in(dir, "model-00001-of-00002.safetensors"),
             "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
             "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,16]}}", d, 16);
    write_st(path_in(dir, "model-00002-of-00002.safetensors"),
             "{\"c\":{\"dtype\":\"F16\",\"shape\":[2,2],\"data_offsets\":[0,8]}}", d, 8);
    /* A stray file the index does not list must not be opened. */
    write_bytes(path_in(dir, "stray.safetensors"), "junk", 4);
    const char *idx = "{\"metadata\":{\"total_size\":24},\"weight_map\":{"
                      "\"a\":\"model-00001-of-00002.safetensors\",\"b\":\"model-00001-of-00002.safetensors\","
                      "\"c\":\"model-00002-of-00002.safetensors\"}}";
    write_bytes(path_in(dir, "model.safetensors.index.json"), idx, strlen(idx));
    qd_safetensors *st;
    qd_err e = {0};
    qd_status s = qd_st_open_dir(dir, &st, &e);
    CHECKF(s == QD_OK, "%s", e.msg);
    if (s != QD_OK) return;
    CHECK(qd_st_count(st) == 3);
    const qd_st_tensor *a = qd_st_find(st, "a"), *c = qd_st_find(st, "c");
    CHECK(a && c && a->file_index != c->file_index);
    if (c) {
        CHECK(strstr(qd_st_file_name(st, c->file_index), "model-00002-of-00002") != NULL);
        CHECK(c->dtype == QD_DTYPE_F16 && c->ndim == 2);
        float v;
        memcpy(&v, c->data, 4);
        CHECK(v == 1.0f);
    }
    qd_st_close(st);

    /* Without an index: every *.safetensors, sorted. */
    char *dir2 = mkdir_in_root("noindex");
    write_st(path_in(dir2, "b.safetensors"), "{\"y\":{\"dtype\":\"I32\",\"shape\":[1],\"data_offsets\":[0,4]}}", d, 4);
    write_st(path_in(dir2, "a.safetensors"), "{\"x\":{\"dtype\":\"I32\",\"shape\":[1],\"data_offsets\":[0,4]}}", d, 4);
    write_bytes(path_in(dir2, "notes.txt"), "hi", 2);
    s = qd_st_open_dir(dir2, &st, &e);
    CHECKF(s == QD_OK, "%s", e.msg);
    if (s == QD_OK) {
        CHECK(qd_st_count(st) == 2);
        CHECK(strcmp(qd_st_at(st, 0)->name, "x") == 0 && qd_st_at(st, 0)->file_index == 0);
        CHECK(strstr(qd_st_file_name(st, 1), "b.safetensors") != NULL);
        qd_st_close(st);
    }
}

static void test_bad_headers(void) {
    unsigned char z[64] = {0};
    EXPECT_MEM_FAIL("{\"t\": ", NULL, 0, QD_ERR_FORMAT, "invalid JSON");
    EXPECT_MEM_FAIL("[1,2]", NULL, 0, QD_ERR_FORMAT, "object");
    EXPECT_MEM_FAIL("{\"wq\":{\"dtype\":\"F64\",\"shape\":[1],\"data_offsets\":[0,8]}}", z, 8, QD_ERR_UNSUPPORTED, "wq",
                    "F64");
    EXPECT_MEM_FAIL("{\"wq\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", z, 8, QD_ERR_FORMAT, "wq");
    EXPECT_MEM_FAIL("{\"wq\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", z, 4, QD_ERR_FORMAT, "wq");
    EXPECT_MEM_FAIL("{\"wq\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,0]}}", z, 8, QD_ERR_FORMAT, "wq");
    EXPECT_MEM_FAIL("{\"wq\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[-8,0]}}", z, 8, QD_ERR_FORMAT, "wq");
    EXPECT_MEM_FAIL("{\"wq\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0]}}", z, 8, QD_ERR_FORMAT, "wq");
    EXPECT_MEM_FAIL("{\"wq\":{\"dtype\":\"F32\",\"shape\":[-2],\"data_offsets\":[0,8]}}", z, 8, QD_ERR_FORMAT, "wq");
    EXPECT_MEM_FAIL("{\"wq\":{\"dtype\":\"F32\",\"shape\":[2.0],\"data_offsets\":[0,8]}}", z, 8, QD_ERR_FORMAT, "wq");
    EXPECT_MEM_FAIL("{\"wq\":{\"dtype\":\"F32\",\"shape\":\"2\",\"data_offsets\":[0,8]}}", z, 8, QD_ERR_FORMAT, "wq");
    EXPECT_MEM_FAIL("{\"wq\":{\"dtype\":\"F32\",\"data_offsets\":[0,8]}}", z, 8, QD_ERR_FORMAT, "wq");
    EXPECT_MEM_FAIL("{\"wq\":{\"shape\":[2],\"data_offsets\":[0,8]}}", z, 8, QD_ERR_FORMAT, "wq");
    EXPECT_MEM_FAIL("{\"wq\":[1]}", z, 8, QD_ERR_FORMAT, "wq");
    EXPECT_MEM_FAIL("{\"wq\":{\"dtype\":\"U8\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,1]}}", z, 8,
                    QD_ERR_UNSUPPORTED, "wq");
    EXPECT_MEM_FAIL("{\"wq\":{\"dtype\":\"U8\",\"shape\":[4294967296,4294967296,4],\"data_offsets\":[0,0]}}", z, 8,
                    QD_ERR_FORMAT, "wq", "overflow");
    EXPECT_MEM_FAIL("{\"wq\":{\"dtype\":\"I64\",\"shape\":[2305843009213693952],\"data_offsets\":[0,0]}}", z, 8,
                    QD_ERR_FORMAT, "wq");
    EXPECT_MEM_FAIL("{\"wq\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                    "\"wk\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}", z, 16, QD_ERR_FORMAT, "wq", "wk");
    EXPECT_MEM_FAIL("{\"wq\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                    "\"wq\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,16]}}", z, 16, QD_ERR_FORMAT, "wq");
    EXPECT_MEM_FAIL("{\"__metadata__\":{\"format\":1}}", NULL, 0, QD_ERR_FORMAT, "__metadata__", "format");
    EXPECT_MEM_FAIL("{\"__metadata__\":[]}", NULL, 0, QD_ERR_FORMAT, "__metadata__");

    /* length field problems, on in-memory images */
    unsigned char img[16] = {0};
    qd_safetensors *st = (qd_safetensors *)1;
    qd_err e = {0};
    check_msg(qd_st_open_memory(img, 5, "tiny.st", &st, &e), QD_ERR_FORMAT, &e, "tiny.st", "8-byte");
    CHECK(st == NULL);
    img[5] = 1; /* 2^40 */
    check_msg(qd_st_open_memory(img, 16, "huge.st", &st, &e), QD_ERR_FORMAT, &e, "huge.st", "exceeds");
    memset(img, 0, sizeof img);
    img[0] = 100; /* 100 > 16 - 8 */
    check_msg(qd_st_open_memory(img, 16, "beyond.st", &st, &e), QD_ERR_FORMAT, &e, "beyond.st", "exceeds");
    /* > 100 MB but inside the buffer: an anonymous mapping costs no memory */
    size_t big = 101u * 1000u * 1000u + 64;
    unsigned char *m = mmap(NULL, big, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m != MAP_FAILED) {
        uint64_t hl = 101u * 1000u * 1000u;
        for (int i = 0; i < 8; i++) m[i] = (unsigned char)(hl >> (8 * i));
        check_msg(qd_st_open_memory(m, big, "absurd.st", &st, &e), QD_ERR_FORMAT, &e, "absurd.st", "absurd");
        munmap(m, big);
    }
    /* an empty header object is a valid file with no tensors */
    size_t len;
    unsigned char *ok = make_image("{}", NULL, 0, &len);
    CHECK(qd_st_open_memory(ok, len, "empty", &st, &e) == QD_OK && qd_st_count(st) == 0);
    qd_st_close(st);
    free(ok);
}

static void test_bad_files(void) {
    char *dir = mkdir_in_root("badfiles");
    qd_safetensors *st;
    qd_err e = {0};
    const char *p = path_in(dir, "trunc.safetensors");
    write_bytes(p, "\x10\0\0", 3);
    check_msg(qd_st_open_file(p, &st, &e), QD_ERR_FORMAT, &e, "trunc.safetensors", NULL);
    p = path_in(dir, "trunc2.safetensors");
    write_bytes(p, "\x40\0\0\0\0\0\0\0{\"a\":1}", 15); /* header says 64, file has 7 */
    check_msg(qd_st_open_file(p, &st, &e), QD_ERR_FORMAT, &e, "trunc2.safetensors", NULL);
    p = path_in(dir, "dtype.safetensors");
    write_st(p, "{\"model.x\":{\"dtype\":\"BOOL\",\"shape\":[1],\"data_offsets\":[0,1]}}", "\0", 1);
    check_msg(qd_st_open_file(p, &st, &e), QD_ERR_UNSUPPORTED, &e, "dtype.safetensors", "model.x");
    check_msg(qd_st_open_file(path_in(dir, "nope.safetensors"), &st, &e), QD_ERR_NOT_FOUND, &e, "nope.safetensors",
              NULL);
    /* a directory without a single safetensors file: the error names the directory */
    char *empty = mkdir_in_root("emptydir");
    check_msg(qd_st_open_dir(empty, &st, &e), QD_ERR_NOT_FOUND, &e, "emptydir", NULL);
    /* directory scan: a bad file among good ones names the bad one */
    char *mixed = mkdir_in_root("mixed");
    write_st(path_in(mixed, "a.safetensors"), "{}", NULL, 0);
    write_st(path_in(mixed, "b.safetensors"), "{\"t\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", NULL, 0);
    check_msg(qd_st_open_dir(mixed, &st, &e), QD_ERR_FORMAT, &e, "b.safetensors", "'t'");
}

static void write_index(const char *dir, const char *wm) {
    char buf[1024];
    snprintf(buf, sizeof buf, "{\"weight_map\":%s}", wm);
    write_bytes(path_in(dir, "model.safetensors.index.json"), buf, strlen(buf));
}

static void test_bad_index(void) {
    float d[2] = {1, 2};
    qd_safetensors *st;
    qd_err e = {0};
    char *dir = mkdir_in_root("idx_missing_file");
    write_st(path_in(dir, "s1.safetensors"), "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", d, 4);
    write_index(dir, "{\"a\":\"s1.safetensors\",\"b\":\"s2.safetensors\"}");
    check_msg(qd_st_open_dir(dir, &st, &e), QD_ERR_NOT_FOUND, &e, "s2.safetensors", "model.safetensors.index.json");

    dir = mkdir_in_root("idx_missing_tensor");
    write_st(path_in(dir, "s1.safetensors"), "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", d, 4);
    write_index(dir, "{\"a\":\"s1.safetensors\",\"model.ghost\":\"s1.safetensors\"}");
    check_msg(qd_st_open_dir(dir, &st, &e), QD_ERR_NOT_FOUND, &e, "model.ghost", "s1.safetensors");

    dir = mkdir_in_root("idx_wrong_shard");
    write_st(path_in(dir, "s1.safetensors"), "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", d, 4);
    write_st(path_in(dir, "s2.safetensors"), "{\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", d, 4);
    write_index(dir, "{\"a\":\"s2.safetensors\",\"b\":\"s2.safetensors\",\"x\":\"s1.safetensors\"}");
    check_msg(qd_st_open_dir(dir, &st, &e), QD_ERR_NOT_FOUND, &e, "'a'", "s2.safetensors");

    dir = mkdir_in_root("idx_dup");
    write_st(path_in(dir, "s1.safetensors"), "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", d, 4);
    write_st(path_in(dir, "s2.safetensors"), "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", d, 4);
    write_index(dir, "{\"a\":\"s1.safetensors\",\"b\":\"s2.safetensors\"}");
    e.msg[0] = 0;
    qd_status s = qd_st_open_dir(dir, &st, &e);
    check_msg(s, QD_ERR_FORMAT, &e, "s1.safetensors", "s2.safetensors");
    CHECK(strstr(e.msg, "'a'") != NULL);

    dir = mkdir_in_root("idx_escape");
    write_index(dir, "{\"a\":\"../single/model.safetensors\"}");
    check_msg(qd_st_open_dir(dir, &st, &e), QD_ERR_FORMAT, &e, "'a'", "index.json");
    write_index(dir, "[]");
    check_msg(qd_st_open_dir(dir, &st, &e), QD_ERR_FORMAT, &e, "weight_map", "index.json");
    write_index(dir, "{}");
    check_msg(qd_st_open_dir(dir, &st, &e), QD_ERR_NOT_FOUND, &e, "weight_map", "index.json");
    write_bytes(path_in(dir, "model.safetensors.index.json"), "{oops", 5);
    check_msg(qd_st_open_dir(dir, &st, &e), QD_ERR_FORMAT, &e, "index.json", "JSON");

    /* a bad shard named in the index: message names the shard and the tensor */
    dir = mkdir_in_root("idx_bad_shard");
    write_st(path_in(dir, "s1.safetensors"), "{\"layer.w\":{\"dtype\":\"F32\",\"shape\":[9],\"data_offsets\":[0,4]}}", d, 4);
    write_index(dir, "{\"layer.w\":\"s1.safetensors\"}");
    check_msg(qd_st_open_dir(dir, &st, &e), QD_ERR_FORMAT, &e, "s1.safetensors", "layer.w");
}

static int rm_cb(const char *p, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb; (void)flag; (void)ftw;
    return remove(p);
}

int main(void) {
    snprintf(g_root, sizeof g_root, "%s/qd_st_XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    if (!mkdtemp(g_root)) { perror("mkdtemp"); return 1; }
    test_valid_single();
    test_misaligned();
    test_many_tensors();
    test_sharded();
    test_bad_headers();
    test_bad_files();
    test_bad_index();
    nftw(g_root, rm_cb, 16, FTW_DEPTH | FTW_PHYS);
    return qd_test_finish("test_safetensors");
}
