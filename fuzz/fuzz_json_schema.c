/* libFuzzer: arbitrary bytes as a JSON Schema for the constrained-decoding compiler
 * (runtime/grammar/json_schema.h). Compiling must not crash, hang or leak; a refusal
 * must carry a message; an accepted schema must give a finished grammar whose
 * matcher can be driven byte by byte (bytes picked from what it says comes next)
 * without crashing, and whose start state is alive. */
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/grammar/json_schema.h"
#include "runtime/grammar/matcher.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    json_t *schema = json_loadb((const char *)data, size, JSON_DECODE_ANY, NULL);
    if (!schema) return 0;
    qd_grammar *g = NULL;
    qd_err err = {0};
    if (qd_json_schema_grammar(schema, &g, &err) != QD_OK) {
        if (g || err.msg[0] == '\0') abort();
        json_decref(schema);
        return 0;
    }
    if (!g || !g->finished) abort();
    qd_mstate a, b;
    qd_mstate_init(&a);
    qd_mstate_init(&b);
    qd_match_start(g, &a);
    if (!qd_mstate_alive(&a) && !a.oom) abort();
    /* walk: the k-th allowed byte, k from the input, for a bounded number of steps */
    for (size_t step = 0; step < 64 && a.n > 0; step++) {
        uint8_t bits[32];
        qd_match_next_bytes(g, &a, bits);
        int n = 0;
        for (int c = 0; c < 256; c++) n += (bits[c >> 3] >> (c & 7)) & 1;
        if (n == 0) abort(); /* a live stack always stands at a non-empty class */
        int k = (int)(data[step % size] % (unsigned)n), c = 0;
        for (;; c++)
            if (((bits[c >> 3] >> (c & 7)) & 1) && k-- == 0) break;
        qd_match_byte(g, &a, (unsigned char)c, &b);
        (void)qd_match_dist(g, &b);
        qd_mstate t = a;
        a = b;
        b = t;
    }
    qd_mstate_free(&a);
    qd_mstate_free(&b);
    qd_grammar_free(g);
    json_decref(schema);
    return 0;
}
