#include "server/think.h"

#include <string.h>

void srv_think_push(srv_think *t, const char *s, size_t n, int final, srv_think_emit emit, void *user) {
    if (!t->enabled) {
        if (n) emit(user, 0, s, n);
        return;
    }
    if (srv_buf_append(&t->hold, s, n) || !t->hold.p) return;
    for (;;) {
        const char *tag = t->in_think ? "</think>" : "<think>";
        const size_t tl = strlen(tag);
        char *hit = memmem(t->hold.p, t->hold.n, tag, tl);
        if (hit) {
            size_t pre = (size_t)(hit - t->hold.p);
            if (pre) emit(user, t->in_think, t->hold.p, pre);
            t->hold.n -= pre + tl;
            memmove(t->hold.p, hit + tl, t->hold.n);
            t->in_think = !t->in_think;
            t->saw_tag = 1;
            continue;
        }
        /* keep the longest tail that is a proper prefix of the tag */
        size_t keep = 0;
        if (!final)
            for (size_t k = tl - 1 < t->hold.n ? tl - 1 : t->hold.n; k > 0; k--)
                if (!memcmp(t->hold.p + t->hold.n - k, tag, k)) {
                    keep = k;
                    break;
                }
        if (t->hold.n - keep) emit(user, t->in_think, t->hold.p, t->hold.n - keep);
        memmove(t->hold.p, t->hold.p + t->hold.n - keep, keep);
        t->hold.n = keep;
        return;
    }
}

void srv_think_free(srv_think *t) { srv_buf_free(&t->hold); }
