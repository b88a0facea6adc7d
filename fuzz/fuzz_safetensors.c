/* libFuzzer: arbitrary bytes as a safetensors file image. The reader must reject or
 * accept without crashing, leaking, or reading outside the buffer; on acceptance every
 * tensor must lie inside the buffer (or, stored misaligned for its dtype, be read from its
 * aligned copy) and be findable by name.
 *
 * Each input is tried twice: as a raw image, and as "JSON header, NUL, data" with a
 * correct length prefix added. A random 8-byte prefix almost never matches the JSON
 * that follows, so the second form is what lets the fuzzer reach the per-tensor
 * checks (dtype, shape, offsets, overlap). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "io/safetensors.h"

static void try_image(const uint8_t *buf, size_t size) {
    qd_safetensors *st = NULL;
    qd_err err = {0};
    if (qd_st_open_memory(buf, size, "fuzz", &st, &err) == QD_OK) {
        for (int i = 0; i < qd_st_count(st); i++) {
            const qd_st_tensor *t = qd_st_at(st, i);
            const uint8_t *p = t->data;
            const size_t es = qd_dtype_size(t->dtype);
            if (t->copy ? p != t->copy || (es > 1 && (uintptr_t)p % es) : p < buf || p + t->n_bytes > buf + size)
                abort();
            if ((size_t)t->n_elements * es != t->n_bytes) abort();
            if (qd_st_find(st, t->name) != t) abort();
            volatile uint8_t sink = 0;
            if (t->n_bytes) sink ^= p[0] ^ p[t->n_bytes - 1]; /* touch both ends */
            (void)sink;
        }
        qd_st_close(st);
    } else if (st != NULL || err.msg[0] == '\0' || !strstr(err.msg, "fuzz")) {
        abort(); /* a failure must leave no handle and a message naming the file */
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    /* Private copies, exactly sized, so ASan flags any read past the end. */
    uint8_t *buf = malloc(size ? size : 1);
    if (!buf) return 0;
    if (size) memcpy(buf, data, size);
    try_image(buf, size);
    free(buf);

    const uint8_t *nul = size ? memchr(data, 0, size) : NULL;
    size_t hlen = nul ? (size_t)(nul - data) : size;
    size_t dlen = nul ? size - hlen - 1 : 0;
    uint8_t *img = malloc(8 + hlen + dlen);
    if (!img) return 0;
    for (int i = 0; i < 8; i++) img[i] = (uint8_t)((uint64_t)hlen >> (8 * i));
    if (hlen) memcpy(img + 8, data, hlen);
    if (dlen) memcpy(img + 8 + hlen, nul + 1, dlen);
    try_image(img, 8 + hlen + dlen);
    free(img);
    return 0;
}
