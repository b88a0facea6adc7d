/* Tokenizer throughput: encode and decode MB/s on a text file, single thread.
 * Not part of the CMake build; build from the repository root with
 *
 *   gcc -O2 -march=native -std=c11 -D_GNU_SOURCE -Isrc -Iinclude bench/tokenizer_bench.c \
 *       src/io/tokenizer*.c src/base/err.c -ljansson -lpcre2-8 -lutf8proc -lpthread -o build/tokenizer_bench
 *   build/tokenizer_bench TOKENIZER_JSON TEXT [IDS_BIN]
 *
 * IDS_BIN (int32 little-endian, written by bench/tokenizer_bench.py) is the HF
 * encoding of the whole text; when given, the ids must match exactly. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "io/tokenizer.h"

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static char *slurp(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)n + 1);
    if (b && fread(b, 1, (size_t)n, f) != (size_t)n) { free(b); b = NULL; }
    fclose(f);
    if (b) b[n] = 0;
    *len = (size_t)n;
    return b;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s TOKENIZER_JSON TEXT [IDS_BIN]\n", argv[0]);
        return 2;
    }
    qd_err err = {0};
    qd_tokenizer *tok;
    double t0 = now();
    if (qd_tokenizer_load(argv[1], &tok, &err) != QD_OK) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    printf("load: %.3f s\n", now() - t0);
    size_t len;
    char *text = slurp(argv[2], &len);
    if (!text) { fprintf(stderr, "cannot read %s\n", argv[2]); return 1; }
    double mb = (double)len / 1e6;

    /* Whole text in one call; best of 3 (the first also warms the word cache,
     * which HF has too). */
    int32_t *ids = NULL;
    size_t n = 0;
    double best = 1e30;
    for (int r = 0; r < 3; r++) {
        free(ids);
        t0 = now();
        if (qd_tokenizer_encode(tok, text, len, 0, &ids, &n, &err) != QD_OK) { fprintf(stderr, "%s\n", err.msg); return 1; }
        double t = now() - t0;
        if (t < best) best = t;
        if (r == 0) printf("encode whole (cold cache): %.2f MB/s\n", mb / t);
    }
    printf("encode whole: %.1f MB in %.3f s = %.2f MB/s, %zu tokens\n", mb, best, mb / best, n);

    /* Line by line (one call per line, as a server would see short requests). */
    t0 = now();
    size_t n_lines = 0, n_line_ids = 0;
    qd_token_buf buf = {0};
    for (size_t i = 0; i < len;) {
        const char *nl = memchr(text + i, '\n', len - i);
        size_t e = nl ? (size_t)(nl - text) + 1 : len;
        buf.n = 0;
        qd_tokenizer_encode_append(tok, text + i, e - i, 0, &buf, &err);
        n_line_ids += buf.n;
        n_lines++;
        i = e;
    }
    double tl = now() - t0;
    printf("encode by line: %zu lines, %.2f MB/s, %zu tokens\n", n_lines, mb / tl, n_line_ids);
    free(buf.ids);

    if (argc > 3) {
        size_t bl;
        char *ref = slurp(argv[3], &bl);
        size_t rn = ref ? bl / 4 : 0;
        int same = ref && rn == n && memcmp(ref, ids, n * 4) == 0;
        size_t first = 0;
        while (ref && first < n && first < rn && ((int32_t *)ref)[first] == ids[first]) first++;
        printf("ids vs HF: %s (%zu vs %zu tokens, first difference at %zu)\n", same ? "identical" : "DIFFERENT", n, rn,
               same ? n : first);
        free(ref);
    }

    best = 1e30;
    char *out = NULL;
    size_t ol = 0;
    for (int r = 0; r < 3; r++) {
        free(out);
        t0 = now();
        qd_tokenizer_decode(tok, ids, n, 0, &out, &ol, &err);
        double t = now() - t0;
        if (t < best) best = t;
    }
    printf("decode: %.2f MB/s (%zu bytes out)\n", (double)ol / 1e6 / best, ol);
    qd_detok d;
    qd_detok_init(&d, tok, 0);
    t0 = now();
    size_t sl = 0;
    for (size_t i = 0; i < n; i++) {
        const char *s;
        size_t l;
        qd_detok_push(&d, ids[i], &s, &l, &err);
        sl += l;
    }
    double ts = now() - t0;
    printf("streaming decode: %.2f MB/s (%.0f ns/token)\n", (double)sl / 1e6 / ts, 1e9 * ts / (double)n);
    qd_detok_free(&d);
    free(out);
    free(ids);
    free(text);
    qd_tokenizer_free(tok);
    return 0;
}
