/* Stop strings over streamed text (OpenAI semantics): generation ends at the first
 * stop string; the text before it is emitted, the stop string and anything after it
 * are not.
 *
 * Text arrives in pieces (one detokenized token at a time), and a stop string may
 * span several pieces, so the matcher holds back the longest tail of the pending text
 * that is a proper prefix of some stop string: those bytes may still turn out to be
 * the start of a stop string. It also holds back an incomplete UTF-8 sequence at the
 * end (a byte-level BPE token can end inside a character), so every emitted chunk is
 * whole characters when the input is valid UTF-8. Matching is bytewise, which is
 * exact for UTF-8 because a valid UTF-8 string can only match at character
 * boundaries.
 *
 * "First" stop string = the one that completes first in the text (smallest end
 * offset); among those ending at the same byte, the one starting earliest. This
 * makes the result independent of how the text is split into pieces.
 *
 *     qd_stop_matcher *m; qd_stop_result r;
 *     qd_stop_matcher_create(stops, n, &m, err);
 *     for each piece: qd_stop_matcher_push(m, piece, len, &r, err);
 *                     write(r.text, r.len); if (r.stopped) break;
 *     at the end without a stop: qd_stop_matcher_flush(m, &r); write(r.text, r.len);
 */
#ifndef QD_RUNTIME_STOP_H
#define QD_RUNTIME_STOP_H

#include <stddef.h>

#include "base/err.h"

#define QD_STOP_MAX_STRINGS 32
#define QD_STOP_MAX_LEN 1024 /* bytes per stop string */

typedef struct qd_stop_matcher qd_stop_matcher;

typedef struct qd_stop_result {
    const char *text;  /* bytes safe to emit now; valid until the next call on the matcher */
    size_t len;
    int stopped;       /* 1: a stop string completed; `text` is everything before it */
    int stop_index;    /* which stop string (index into the list given to create); -1 if none */
} qd_stop_result;

/* Copies the stop strings (NUL-terminated, non-empty, at most QD_STOP_MAX_LEN bytes,
 * at most QD_STOP_MAX_STRINGS of them). n_stops = 0 is allowed: then the matcher only
 * holds back incomplete UTF-8. */
qd_status qd_stop_matcher_create(const char *const *stops, int n_stops, qd_stop_matcher **out,
                                 qd_err *err);
void qd_stop_matcher_free(qd_stop_matcher *m);
/* Back to the freshly created state (same stop strings), pending text dropped. */
void qd_stop_matcher_reset(qd_stop_matcher *m);

/* Appends a piece of text (len bytes, may contain NUL) and reports what can be emitted.
 * After a stop, further pushes emit nothing and report the same stop again. */
qd_status qd_stop_matcher_push(qd_stop_matcher *m, const char *piece, size_t len,
                               qd_stop_result *out, qd_err *err);

/* End of generation without a stop: emits everything still held back (including an
 * incomplete UTF-8 tail, as is). After a stop it emits nothing. */
void qd_stop_matcher_flush(qd_stop_matcher *m, qd_stop_result *out);

/* Number of bytes currently held back. */
size_t qd_stop_matcher_pending(const qd_stop_matcher *m);

#endif
