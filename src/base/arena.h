/* Arena: bump allocation from one block planned up front; freed all at once.
 * Used for scratch buffers sized at context creation so the hot path never mallocs. */
#ifndef QD_BASE_ARENA_H
#define QD_BASE_ARENA_H

#include <stddef.h>

typedef struct qd_arena {
    unsigned char *base;
    size_t size;
    size_t used;
    size_t high_water;
} qd_arena;

/* Allocates the arena's block (64-byte aligned). Returns 0 on success, -1 on OOM. */
int qd_arena_init(qd_arena *a, size_t size);
void qd_arena_free(qd_arena *a);
/* 64-byte aligned; NULL when the arena is exhausted. */
void *qd_arena_alloc(qd_arena *a, size_t bytes);
/* Same but zero-filled. */
void *qd_arena_calloc(qd_arena *a, size_t bytes);
size_t qd_arena_mark(const qd_arena *a);
void qd_arena_reset_to(qd_arena *a, size_t mark);

/* 64-byte aligned heap allocation helpers (NULL on failure). */
void *qd_aligned_alloc(size_t bytes);
void *qd_aligned_calloc(size_t bytes);
void qd_aligned_free(void *p);

#endif
