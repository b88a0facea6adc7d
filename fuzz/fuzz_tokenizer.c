/* libFuzzer target for the tokenizer: encode arbitrary bytes with the real
 * Qwen3 tokenizer, decode, stream-decode, and check the round trip.
 *
 * The tokenizer is read once from $QD_TOKENIZER, else from the repository's
 * tests/data/qwen3-tokenizer/tokenizer.json, found through the source directory
 * compiled in (QD_SOURCE_DIR), so the harness works from any working directory.
 * When it cannot be loaded the harness exits non-zero at once: a fuzzer that
 * accepted every input untested would report success while covering nothing.
 *
 * Checked for every input: encode succeeds; every id is in range; decode
 * succeeds and is valid UTF-8; the streaming detokenizer emits only complete
 * UTF-8 and adds up to decode. For valid UTF-8 input additionally
 * NFC(decode(encode(s))) == NFC(s), and decode(encode(s)) == NFC(s) exactly
 * when no added token was matched (an added token splits normalization, so
 * e.g. "<think>" + U+0338 keeps its '>' where NFC of the whole would not).
 * QD_TOKENIZER can point at the other test tokenizers (tests/data/...). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "io/tokenizer.h"

#ifndef QD_SOURCE_DIR
#define QD_SOURCE_DIR "."
#endif

static qd_tokenizer *g_tok;

/* NFC, normalizing around U+11A7 separately (utf8proc 2.8 wrongly composes
 * LV + U+11A7; the tokenizer avoids that the same way). */
static size_t nfc(const unsigned char *s, size_t len, unsigned char **out) {
    for (size_t i = 0; i + 2 < len; i++)
        if (s[i] == 0xE1 && s[i + 1] == 0x86 && s[i + 2] == 0xA7) {
            unsigned char *a, *b;
            size_t na = nfc(s, i, &a), nb = nfc(s + i + 3, len - i - 3, &b);
            *out = malloc(na + nb + 4);
            memcpy(*out, a, na);
            memcpy(*out + na, s + i, 3);
            memcpy(*out + na + 3, b, nb);
            free(a);
            free(b);
            return na + 3 + nb;
        }
    if (len == 0) { *out = calloc(1, 1); return 0; }
    utf8proc_uint8_t *o = NULL;
    utf8proc_ssize_t n = utf8proc_map(s, (utf8proc_ssize_t)len, &o, UTF8PROC_STABLE | UTF8PROC_COMPOSE);
    if (n < 0) abort();
    *out = o;
    return (size_t)n;
}

static void fail(const char *what) {
    fprintf(stderr, "fuzz_tokenizer: %s\n", what);
    abort();
}

/* Called by libFuzzer once before any input. */
int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    const char *p = getenv("QD_TOKENIZER");
    if (!p) p = QD_SOURCE_DIR "/tests/data/qwen3-tokenizer/tokenizer.json";
    qd_err err = {0};
    if (qd_tokenizer_load(p, &g_tok, &err) != QD_OK) {
        fprintf(stderr, "fuzz_tokenizer: cannot load the tokenizer %s: %s\n", p, err.msg);
        exit(1);
    }
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    qd_err err = {0};
    int32_t *ids = NULL;
    size_t n = 0;
    if (qd_tokenizer_encode(g_tok, (const char *)data, size, 0, &ids, &n, &err) != QD_OK) fail(err.msg);
    int any_added = 0, faithful = 1;
    for (size_t i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= qd_tokenizer_vocab_size(g_tok)) fail("id out of range");
        if (qd_tokenizer_is_added(g_tok, ids[i])) {
            /* Like HF, an added token's content goes through the ByteLevel
             * decoder: a non-ASCII one (the flags test tokenizer's "éé")
             * decodes to its Latin-1 byte reading, not to itself. */
            size_t bl;
            const unsigned char *b = qd_tokenizer_token_bytes(g_tok, ids[i], &bl);
            const char *sp = qd_tokenizer_id_to_token(g_tok, ids[i]);
            faithful &= strlen(sp) == bl && memcmp(sp, b, bl) == 0;
            any_added = 1;
        }
    }
    char *dec = NULL;
    size_t dl = 0;
    if (qd_tokenizer_decode(g_tok, ids, n, 0, &dec, &dl, &err) != QD_OK) fail(err.msg);
    if (!qd_utf8_valid((const unsigned char *)dec, dl)) fail("decode is not valid UTF-8");

    /* Streaming, with skip_special chosen by the input so both paths run. */
    int skip = size > 0 && (data[0] & 1);
    char *skipped = NULL;
    size_t sl = 0;
    if (skip && qd_tokenizer_decode(g_tok, ids, n, 1, &skipped, &sl, &err) != QD_OK) fail(err.msg);
    qd_detok d;
    qd_detok_init(&d, g_tok, skip);
    char *acc = malloc(dl + 4);
    size_t o = 0;
    for (size_t i = 0; i <= n; i++) {
        const char *t;
        size_t l;
        qd_status st = i < n ? qd_detok_push(&d, ids[i], &t, &l, &err) : qd_detok_flush(&d, &t, &l, &err);
        if (st != QD_OK) fail(err.msg);
        if (!qd_utf8_valid((const unsigned char *)t, l)) fail("detok chunk is not complete UTF-8");
        if (o + l > dl + 3) fail("detok output longer than decode");
        memcpy(acc + o, t, l);
        o += l;
    }
    qd_detok_free(&d);
    const char *want = skip ? skipped : dec;
    size_t wl = skip ? sl : dl;
    if (o != wl || memcmp(acc, want, o) != 0) fail("streaming decode differs from decode");

    if (faithful && qd_utf8_valid(data, size)) {
        unsigned char *a, *b;
        size_t na = nfc(data, size, &a);
        if (!any_added && (na != dl || memcmp(a, dec, na) != 0)) fail("decode(encode(s)) != NFC(s)");
        size_t nb = nfc((const unsigned char *)dec, dl, &b);
        if (na != nb || memcmp(a, b, na) != 0) fail("NFC(decode(encode(s))) != NFC(s)");
        free(a);
        free(b);
    }
    free(acc);
    free(skipped);
    free(dec);
    free(ids);
    return 0;
}
