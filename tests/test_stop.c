/* Stop-string matcher: splits across pieces, several stop strings, overlaps, UTF-8,
 * no false positives, flushing; and random splittings against a brute-force reference. */
#include <string.h>

#include "qd_test.h"
#include "runtime/stop.h"

typedef struct {
    char text[4096];
    size_t len;
    int stopped, stop_index;
    int bad_utf8_chunk; /* an emitted chunk ended inside a UTF-8 character */
} run_result;

static int ends_mid_utf8(const char *s, size_t n) {
    /* walk back over continuation bytes to the lead byte and compare lengths */
    size_t back = 0;
    while (back < n && back < 4 && ((unsigned char)s[n - 1 - back] & 0xC0) == 0x80) back++;
    if (back == n) return back > 0;
    unsigned char lead = (unsigned char)s[n - 1 - back];
    size_t need = lead < 0x80 ? 1 : (lead & 0xE0) == 0xC0 ? 2 : (lead & 0xF0) == 0xE0 ? 3 : 4;
    return need != back + 1;
}

/* Feeds `pieces` (NULL-terminated) and flushes at the end unless stopped. */
static run_result run(const char *const *stops, int n_stops, const char *const *pieces) {
    run_result r;
    memset(&r, 0, sizeof r);
    r.stop_index = -1;
    qd_err err = {0};
    qd_stop_matcher *m;
    if (qd_stop_matcher_create(stops, n_stops, &m, &err) != QD_OK) {
        CHECKF(0, "create: %s", err.msg);
        return r;
    }
    qd_stop_result o;
    for (int i = 0; pieces[i] && !r.stopped; i++) {
        CHECK(qd_stop_matcher_push(m, pieces[i], strlen(pieces[i]), &o, &err) == QD_OK);
        memcpy(r.text + r.len, o.text, o.len);
        r.len += o.len;
        if (o.len && ends_mid_utf8(o.text, o.len)) r.bad_utf8_chunk = 1;
        r.stopped = o.stopped;
        r.stop_index = o.stop_index;
    }
    if (!r.stopped) {
        qd_stop_matcher_flush(m, &o);
        memcpy(r.text + r.len, o.text, o.len);
        r.len += o.len;
    }
    r.text[r.len] = 0;
    qd_stop_matcher_free(m);
    return r;
}

#define P(...) ((const char *const[]){__VA_ARGS__, NULL})

static void expect(const char *what, run_result r, const char *text, int stopped, int index) {
    CHECKF(strcmp(r.text, text) == 0 && r.stopped == stopped && r.stop_index == index,
           "%s: got '%s' stopped %d index %d, want '%s' %d %d", what, r.text, r.stopped,
           r.stop_index, text, stopped, index);
}

static void test_basic(void) {
    const char *const one[] = {"STOP"};
    expect("no stop", run(one, 1, P("Hello", " world")), "Hello world", 0, -1);
    expect("whole", run(one, 1, P("abcSTOPdef")), "abc", 1, 0);
    expect("split 2", run(one, 1, P("abcST", "OPdef")), "abc", 1, 0);
    expect("split 3", run(one, 1, P("abcS", "TO", "Pdef")), "abc", 1, 0);
    expect("split 4", run(one, 1, P("S", "T", "O", "P")), "", 1, 0);
    expect("at start", run(one, 1, P("STOP", "more")), "", 1, 0);
    /* false starts are released */
    expect("false start", run(one, 1, P("ST", "OX", "STO")), "STOXSTO", 0, -1);
    expect("false start 2", run(one, 1, P("SS", "TOP")), "S", 1, 0);
    expect("case matters", run(one, 1, P("stop", "Stop")), "stopStop", 0, -1);
    expect("later piece ignored", run(one, 1, P("aSTOPb", "c")), "a", 1, 0);
    /* nothing stops when there are no stop strings */
    expect("no stops", run(NULL, 0, P("a", "bc")), "abc", 0, -1);
}

static void test_hold_back(void) {
    const char *const stops[] = {"</end>"};
    qd_err err = {0};
    qd_stop_matcher *m;
    CHECK(qd_stop_matcher_create(stops, 1, &m, &err) == QD_OK);
    qd_stop_result o;
    CHECK(qd_stop_matcher_push(m, "text </e", 8, &o, &err) == QD_OK);
    CHECK(o.len == 5 && memcmp(o.text, "text ", 5) == 0 && !o.stopped);
    CHECK(qd_stop_matcher_pending(m) == 3);
    CHECK(qd_stop_matcher_push(m, "nd", 2, &o, &err) == QD_OK);
    CHECK(o.len == 0 && !o.stopped && qd_stop_matcher_pending(m) == 5);
    CHECK(qd_stop_matcher_push(m, "x", 1, &o, &err) == QD_OK); /* "</endx": not a stop */
    CHECK(o.len == 6 && memcmp(o.text, "</endx", 6) == 0);
    CHECK(qd_stop_matcher_push(m, "<", 1, &o, &err) == QD_OK);
    CHECK(o.len == 0 && qd_stop_matcher_pending(m) == 1);
    qd_stop_matcher_flush(m, &o); /* end of generation: the held '<' comes out */
    CHECK(o.len == 1 && o.text[0] == '<' && !o.stopped);
    qd_stop_matcher_reset(m);
    CHECK(qd_stop_matcher_push(m, "a</end>b", 8, &o, &err) == QD_OK);
    CHECK(o.len == 1 && o.text[0] == 'a' && o.stopped && o.stop_index == 0);
    /* after a stop: nothing more, the stop is still reported */
    CHECK(qd_stop_matcher_push(m, "zzz", 3, &o, &err) == QD_OK);
    CHECK(o.len == 0 && o.stopped && o.stop_index == 0);
    qd_stop_matcher_flush(m, &o);
    CHECK(o.len == 0);
    qd_stop_matcher_free(m);
}

static void test_multiple(void) {
    const char *const stops[] = {"\n\n", "User:", "###"};
    expect("second", run(stops, 3, P("Answer.", "\nUs", "er: hi")), "Answer.\n", 1, 1);
    expect("first", run(stops, 3, P("Answer.\n", "\nUser:")), "Answer.", 1, 0);
    expect("third", run(stops, 3, P("a#", "#", "#b")), "a", 1, 2);
    /* two stops in one piece: the one that completes first wins */
    expect("earliest", run(stops, 3, P("x###User:")), "x", 1, 2);
    /* overlapping candidates: "abcabd" inside "abcabcabd" after a false start */
    const char *const ov[] = {"abcabd"};
    expect("overlap", run(ov, 1, P("abcab", "cabd!")), "abc", 1, 0);
    expect("overlap bytes", run(ov, 1, P("a", "b", "c", "a", "b", "c", "a", "b", "d")), "abc", 1, 0);
    /* a stop that is a prefix/suffix of another */
    const char *const nest[] = {"abc", "b"};
    expect("shorter completes first", run(nest, 2, P("xa", "bc")), "xa", 1, 1);
    const char *const nest2[] = {"xyz", "yz"};
    /* both end at the same byte: the earlier start (longer) wins */
    expect("same end", run(nest2, 2, P("0x", "yz")), "0", 1, 0);
    const char *const hold2[] = {"aab", "ac"};
    expect("two prefixes held", run(hold2, 2, P("xa", "a", "c")), "xa", 1, 1);
}

static void test_utf8(void) {
    /* "日本語" = E6 97 A5 E6 9C AC E8 AA 9E; stop "本語" split mid-character */
    const char *const stops[] = {"\xe6\x9c\xac\xe8\xaa\x9e"};
    run_result r = run(stops, 1, P("\xe6\x97", "\xa5\xe6", "\x9c\xac\xe8", "\xaa", "\x9e!"));
    expect("utf8 stop", r, "\xe6\x97\xa5", 1, 0);
    CHECK(!r.bad_utf8_chunk);
    /* a multibyte character split over tokens is not emitted half-way */
    r = run(NULL, 0, P("caf\xc3", "\xa9 ", "\xf0\x9f", "\x98", "\x80", "!"));
    CHECK(strcmp(r.text, "caf\xc3\xa9 \xf0\x9f\x98\x80!") == 0 && !r.bad_utf8_chunk);
    /* a false start sharing a lead byte: "日" vs stop "本" (same first byte E6) */
    const char *const hon[] = {"\xe6\x9c\xac"};
    r = run(hon, 1, P("\xe6", "\x97\xa5", "x"));
    expect("utf8 false start", r, "\xe6\x97\xa5x", 0, -1);
    CHECK(!r.bad_utf8_chunk);
    /* invalid bytes are not held forever */
    qd_err err = {0};
    qd_stop_matcher *m;
    CHECK(qd_stop_matcher_create(NULL, 0, &m, &err) == QD_OK);
    qd_stop_result o;
    CHECK(qd_stop_matcher_push(m, "a\x80\xbf", 3, &o, &err) == QD_OK && o.len == 3);
    CHECK(qd_stop_matcher_push(m, "b\xe2\x82", 3, &o, &err) == QD_OK && o.len == 1);
    qd_stop_matcher_flush(m, &o); /* an unfinished character at the very end comes out as is */
    CHECK(o.len == 2);
    qd_stop_matcher_free(m);
}

static void test_bad_args(void) {
    qd_err err = {0};
    qd_stop_matcher *m = (qd_stop_matcher *)1;
    const char *const empty[] = {"ok", ""};
    CHECK(qd_stop_matcher_create(empty, 2, &m, &err) == QD_ERR_INVALID_ARG && m == NULL &&
          strstr(err.msg, "stop string 1 is empty"));
    const char *many[QD_STOP_MAX_STRINGS + 1];
    for (int i = 0; i <= QD_STOP_MAX_STRINGS; i++) many[i] = "x";
    CHECK(qd_stop_matcher_create(many, QD_STOP_MAX_STRINGS + 1, &m, &err) == QD_ERR_INVALID_ARG &&
          strstr(err.msg, "at most"));
    static char longs[QD_STOP_MAX_LEN + 2];
    memset(longs, 'a', QD_STOP_MAX_LEN + 1);
    const char *const lp[] = {longs};
    CHECK(qd_stop_matcher_create(lp, 1, &m, &err) == QD_ERR_INVALID_ARG && strstr(err.msg, "bytes"));
}

/* Random texts over a small alphabet (so stop strings occur by chance), random stop
 * sets and random splittings: the output must equal the brute-force answer (earliest
 * end, then earliest start) and never depend on the splitting. */
static void test_random(qd_test_rng *rng) {
    const char alpha[] = "ab\xc3\xa9"; /* 'a', 'b' and the two bytes of 'é' */
    for (int iter = 0; iter < 3000; iter++) {
        char text[200];
        int tl = 0, n_chars = 1 + (int)(qd_test_next(rng) % 60);
        for (int i = 0; i < n_chars; i++) {
            int c = (int)(qd_test_next(rng) % 3);
            if (c == 2) { text[tl++] = alpha[2]; text[tl++] = alpha[3]; }
            else text[tl++] = alpha[c];
        }
        text[tl] = 0;
        char stop_buf[4][16];
        const char *stops[4];
        int ns = (int)(qd_test_next(rng) % 4);
        for (int s = 0; s < ns; s++) {
            int l = 0, nc = 1 + (int)(qd_test_next(rng) % 5);
            for (int i = 0; i < nc; i++) {
                int c = (int)(qd_test_next(rng) % 3);
                if (c == 2) { stop_buf[s][l++] = alpha[2]; stop_buf[s][l++] = alpha[3]; }
                else stop_buf[s][l++] = alpha[c];
            }
            stop_buf[s][l] = 0;
            stops[s] = stop_buf[s];
        }
        /* brute force */
        size_t best_end = (size_t)-1, best_start = 0;
        int best = -1;
        for (int s = 0; s < ns; s++) {
            const char *h = strstr(text, stops[s]);
            if (!h) continue;
            size_t st = (size_t)(h - text), en = st + strlen(stops[s]);
            if (en < best_end || (en == best_end && st < best_start)) {
                best_end = en; best_start = st; best = s;
            }
        }
        char want[200];
        size_t wl = best >= 0 ? best_start : (size_t)tl;
        memcpy(want, text, wl);
        want[wl] = 0;
        /* random split into pieces (splitting inside characters too) */
        char piece_buf[200][8];
        const char *pieces[201];
        int np = 0;
        for (int pos = 0; pos < tl;) {
            int l = 1 + (int)(qd_test_next(rng) % 7);
            if (l > tl - pos) l = tl - pos;
            memcpy(piece_buf[np], text + pos, (size_t)l);
            piece_buf[np][l] = 0;
            pieces[np] = piece_buf[np];
            np++;
            pos += l;
        }
        pieces[np] = NULL;
        run_result r = run(stops, ns, pieces);
        int ok = strcmp(r.text, want) == 0 && r.stopped == (best >= 0) && r.stop_index == best &&
                 !r.bad_utf8_chunk;
        CHECKF(ok, "text '%s', %d stops, got '%s' (%d) want '%s' (%d)", text, ns, r.text,
               r.stop_index, want, best);
        if (!ok) break;
    }
}

int main(void) {
    qd_test_rng rng = qd_test_rng_from_env();
    test_basic();
    test_hold_back();
    test_multiple();
    test_utf8();
    test_bad_args();
    test_random(&rng);
    return qd_test_finish("test_stop");
}
