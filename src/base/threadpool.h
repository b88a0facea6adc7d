/* A fixed pool of worker threads running data-parallel loops.
 * The calling thread takes part as worker 0, so a pool of n threads starts n-1. */
#ifndef QD_BASE_THREADPOOL_H
#define QD_BASE_THREADPOOL_H

#include <stdint.h>

typedef struct qd_threadpool qd_threadpool;

/* fn processes items [begin, end); `worker` is in [0, n_threads). */
typedef void (*qd_parallel_fn)(void *user, int64_t begin, int64_t end, int worker);

/* n_threads <= 0 means all online cores. NULL on failure. */
qd_threadpool *qd_threadpool_create(int n_threads);
void qd_threadpool_free(qd_threadpool *pool);
int qd_threadpool_size(const qd_threadpool *pool);

/* Splits [0, n) into contiguous ranges of at least `grain` items, one range per
 * worker, and returns when all are done. A NULL pool runs everything inline. */
void qd_parallel_for(qd_threadpool *pool, int64_t n, int64_t grain, qd_parallel_fn fn, void *user);

#endif
