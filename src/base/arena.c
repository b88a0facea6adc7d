#include "base/arena.h"

#include <stdlib.h>
#include <string.h>

#define QD_ALIGN 64

void *qd_aligned_alloc(size_t bytes) {
    if (bytes == 0) bytes = QD_ALIGN;
    void *p = NULL;
    if (posix_memalign(&p, QD_ALIGN, (bytes + QD_ALIGN - 1) / QD_ALIGN * QD_ALIGN) != 0) return NULL;
    return p;
}

void *qd_aligned_calloc(size_t bytes) {
    void *p = qd_aligned_alloc(bytes);
    if (p) memset(p, 0, bytes);
    return p;
}

void qd_aligned_free(void *p) { free(p); }

int qd_arena_init(qd_arena *a, size_t size) {
    memset(a, 0, sizeof *a);
    a->base = qd_aligned_alloc(size);
    if (!a->base) return -1;
    a->size = size;
    return 0;
}

void qd_arena_free(qd_arena *a) {
    qd_aligned_free(a->base);
    memset(a, 0, sizeof *a);
}

void *qd_arena_alloc(qd_arena *a, size_t bytes) {
    size_t start = (a->used + QD_ALIGN - 1) / QD_ALIGN * QD_ALIGN;
    if (start > a->size || bytes > a->size - start) return NULL;
    a->used = start + bytes;
    if (a->used > a->high_water) a->high_water = a->used;
    return a->base + start;
}

void *qd_arena_calloc(qd_arena *a, size_t bytes) {
    void *p = qd_arena_alloc(a, bytes);
    if (p) memset(p, 0, bytes);
    return p;
}

size_t qd_arena_mark(const qd_arena *a) { return a->used; }
void qd_arena_reset_to(qd_arena *a, size_t mark) { a->used = mark; }
