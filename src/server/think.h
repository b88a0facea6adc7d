/* Reasoning split: the text a thinking model generates between <think> and </think>
 * is reasoning_content, the rest is content. Text arrives in pieces and a tag may be
 * cut between pieces, so bytes that could still be the start of the awaited tag are
 * held back until a later piece (or the end) decides. */
#ifndef QD_SERVER_THINK_H
#define QD_SERVER_THINK_H

#include <stddef.h>

/* Growable byte buffer (server/util.c). */
typedef struct srv_buf {
    char *p;
    size_t n, cap;
} srv_buf;
int srv_buf_append(srv_buf *b, const char *s, size_t n); /* 0 or -1 (OOM) */
void srv_buf_free(srv_buf *b);

typedef void (*srv_think_emit)(void *user, int reasoning, const char *text, size_t len);

typedef struct srv_think {
    int enabled;   /* 0: everything is content, no tags looked for */
    int in_think;  /* inside a thinking block (start at 1 when the prompt opened it) */
    int saw_tag;   /* some tag was seen or the prompt opened one */
    srv_buf hold;  /* held-back bytes */
} srv_think;

/* Feeds a piece; emits what is decided. final = 1 at the end: nothing is held back. */
void srv_think_push(srv_think *t, const char *s, size_t n, int final, srv_think_emit emit, void *user);
void srv_think_free(srv_think *t);

#endif
