#include "runtime/stop.h"

#include <stdlib.h>
#include <string.h>

struct qd_stop_matcher {
    int n_stops;
    char *stops[QD_STOP_MAX_STRINGS];
    size_t lens[QD_STOP_MAX_STRINGS];
    /* buf[0..emitted) was handed out by the last call and is dropped at the next one
     * (the caller's pointer must stay valid until then); buf[emitted..len) is held. */
    char *buf;
    size_t len, cap, emitted;
    int stopped, stop_index;
};

qd_status qd_stop_matcher_create(const char *const *stops, int n_stops, qd_stop_matcher **out,
                                 qd_err *err) {
    if (!out) return qd_seterr(err, QD_ERR_INVALID_ARG, "qd_stop_matcher_create: out is NULL");
    *out = NULL;
    if (n_stops < 0 || n_stops > QD_STOP_MAX_STRINGS)
        return qd_seterr(err, QD_ERR_INVALID_ARG, "stop strings: at most %d allowed (got %d)",
                         QD_STOP_MAX_STRINGS, n_stops);
    if (n_stops > 0 && !stops)
        return qd_seterr(err, QD_ERR_INVALID_ARG, "stop strings: list is NULL");
    for (int i = 0; i < n_stops; i++) {
        if (!stops[i]) return qd_seterr(err, QD_ERR_INVALID_ARG, "stop string %d is NULL", i);
        size_t l = strlen(stops[i]);
        /* An empty stop string would match before any text: surely a caller bug. */
        if (l == 0) return qd_seterr(err, QD_ERR_INVALID_ARG, "stop string %d is empty", i);
        if (l > QD_STOP_MAX_LEN)
            return qd_seterr(err, QD_ERR_INVALID_ARG, "stop string %d is %zu bytes, more than "
                             "the limit of %d", i, l, QD_STOP_MAX_LEN);
    }
    qd_stop_matcher *m = calloc(1, sizeof *m);
    if (!m) return qd_seterr(err, QD_ERR_OOM, "stop matcher: out of memory");
    for (int i = 0; i < n_stops; i++) {
        m->lens[i] = strlen(stops[i]);
        m->stops[i] = malloc(m->lens[i] + 1);
        if (!m->stops[i]) {
            qd_stop_matcher_free(m);
            return qd_seterr(err, QD_ERR_OOM, "stop matcher: out of memory");
        }
        memcpy(m->stops[i], stops[i], m->lens[i] + 1);
        m->n_stops = i + 1;
    }
    m->stop_index = -1;
    *out = m;
    return QD_OK;
}

void qd_stop_matcher_free(qd_stop_matcher *m) {
    if (!m) return;
    for (int i = 0; i < m->n_stops; i++) free(m->stops[i]);
    free(m->buf);
    free(m);
}

void qd_stop_matcher_reset(qd_stop_matcher *m) {
    if (!m) return;
    m->len = m->emitted = 0;
    m->stopped = 0;
    m->stop_index = -1;
}

size_t qd_stop_matcher_pending(const qd_stop_matcher *m) { return m->len - m->emitted; }

/* Drops what the previous call emitted, moving the held tail to the front. */
static void drop_emitted(qd_stop_matcher *m) {
    if (m->emitted == 0) return;
    memmove(m->buf, m->buf + m->emitted, m->len - m->emitted);
    m->len -= m->emitted;
    m->emitted = 0;
}

/* Length of an incomplete but so-far-valid UTF-8 sequence at the end of s[0..n), else 0.
 * Invalid bytes are not held: waiting would never make them valid. */
static size_t utf8_incomplete_tail(const unsigned char *s, size_t n) {
    for (size_t back = 1; back <= 3 && back <= n; back++) {
        unsigned char c = s[n - back];
        if ((c & 0xC0) == 0x80) continue; /* continuation byte: keep looking for the lead */
        size_t need = (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 1;
        return need > back ? back : 0;
    }
    return 0;
}

static void set_result(qd_stop_matcher *m, size_t n_emit, qd_stop_result *out) {
    m->emitted = n_emit;
    if (out) {
        out->text = m->buf ? m->buf : "";
        out->len = n_emit;
        out->stopped = m->stopped;
        out->stop_index = m->stop_index;
    }
}

qd_status qd_stop_matcher_push(qd_stop_matcher *m, const char *piece, size_t len,
                               qd_stop_result *out, qd_err *err) {
    if (!m) return qd_seterr(err, QD_ERR_INVALID_ARG, "qd_stop_matcher_push: matcher is NULL");
    if (len > 0 && !piece) return qd_seterr(err, QD_ERR_INVALID_ARG, "qd_stop_matcher_push: piece is NULL");
    if (m->stopped) {
        m->len = m->emitted = 0;
        set_result(m, 0, out);
        return QD_OK;
    }
    drop_emitted(m);
    size_t old_len = m->len;
    if (m->len + len > m->cap) {
        size_t cap = m->cap ? m->cap : 256;
        while (cap < m->len + len) cap *= 2;
        char *b = realloc(m->buf, cap);
        if (!b) return qd_seterr(err, QD_ERR_OOM, "stop matcher: out of memory for %zu bytes", cap);
        m->buf = b;
        m->cap = cap;
    }
    if (len) memcpy(m->buf + m->len, piece, len);
    m->len += len;

    /* The held text before this piece contains no complete stop string (it was checked
     * when it arrived), so a match must end inside the new piece: search from the
     * first start that could reach it. */
    size_t best_end = (size_t)-1, best_start = 0;
    int best = -1;
    for (int i = 0; i < m->n_stops; i++) {
        size_t l = m->lens[i];
        if (l > m->len) continue;
        size_t from = old_len + 1 > l ? old_len + 1 - l : 0;
        const char *hit = memmem(m->buf + from, m->len - from, m->stops[i], l);
        if (!hit) continue;
        size_t start = (size_t)(hit - m->buf), end = start + l;
        if (end < best_end || (end == best_end && start < best_start)) {
            best_end = end;
            best_start = start;
            best = i;
        }
    }
    if (best >= 0) {
        m->stopped = 1;
        m->stop_index = best;
        m->len = best_start; /* the stop string and what follows are discarded */
        set_result(m, best_start, out);
        return QD_OK;
    }

    /* Hold the longest tail that is a proper prefix of some stop string. */
    size_t hold = 0;
    for (int i = 0; i < m->n_stops; i++) {
        size_t l = m->lens[i];
        size_t h = l - 1 < m->len ? l - 1 : m->len;
        for (; h > hold; h--)
            if (memcmp(m->buf + m->len - h, m->stops[i], h) == 0) break;
        if (h > hold) hold = h;
    }
    size_t emit = m->len - hold;
    emit -= utf8_incomplete_tail((const unsigned char *)m->buf, emit);
    set_result(m, emit, out);
    return QD_OK;
}

void qd_stop_matcher_flush(qd_stop_matcher *m, qd_stop_result *out) {
    if (!m) return;
    if (m->stopped) {
        m->len = m->emitted = 0;
        set_result(m, 0, out);
        return;
    }
    drop_emitted(m);
    set_result(m, m->len, out);
}
