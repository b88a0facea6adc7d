#include "base/threadpool.h"

#include <pthread.h>
#include <stdlib.h>
#include <unistd.h>

struct qd_threadpool {
    int n_threads;
    pthread_t *threads;
    pthread_mutex_t mu;
    pthread_cond_t work_cv;  /* workers wait for a new generation */
    pthread_cond_t done_cv;  /* the caller waits for pending == 0 */
    uint64_t generation;
    int pending;
    int stop;
    /* the current loop */
    qd_parallel_fn fn;
    void *user;
    int64_t n;
    int n_parts;
};

static void run_part(qd_threadpool *p, int part) {
    if (part >= p->n_parts) return;
    int64_t begin = p->n * part / p->n_parts;
    int64_t end = p->n * (part + 1) / p->n_parts;
    if (begin < end) p->fn(p->user, begin, end, part);
}

typedef struct { qd_threadpool *pool; int index; } worker_arg;

static void *worker_main(void *arg) {
    worker_arg *wa = arg;
    qd_threadpool *p = wa->pool;
    int index = wa->index;
    free(wa);
    uint64_t seen = 0;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (!p->stop && p->generation == seen) pthread_cond_wait(&p->work_cv, &p->mu);
        if (p->stop) break;
        seen = p->generation;
        pthread_mutex_unlock(&p->mu);
        run_part(p, index);
        pthread_mutex_lock(&p->mu);
        if (--p->pending == 0) pthread_cond_signal(&p->done_cv);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

qd_threadpool *qd_threadpool_create(int n_threads) {
    if (n_threads <= 0) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        n_threads = n > 0 ? (int)n : 1;
    }
    qd_threadpool *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    p->n_threads = n_threads;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->work_cv, NULL);
    pthread_cond_init(&p->done_cv, NULL);
    p->threads = calloc((size_t)n_threads, sizeof(pthread_t));
    if (!p->threads) { free(p); return NULL; }
    for (int i = 1; i < n_threads; i++) {
        worker_arg *wa = malloc(sizeof *wa);
        if (!wa) { p->n_threads = i; qd_threadpool_free(p); return NULL; }
        wa->pool = p;
        wa->index = i;
        if (pthread_create(&p->threads[i], NULL, worker_main, wa) != 0) {
            free(wa);
            p->n_threads = i;
            qd_threadpool_free(p);
            return NULL;
        }
    }
    return p;
}

void qd_threadpool_free(qd_threadpool *p) {
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    p->stop = 1;
    pthread_cond_broadcast(&p->work_cv);
    pthread_mutex_unlock(&p->mu);
    for (int i = 1; i < p->n_threads; i++) pthread_join(p->threads[i], NULL);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->work_cv);
    pthread_cond_destroy(&p->done_cv);
    free(p->threads);
    free(p);
}

int qd_threadpool_size(const qd_threadpool *p) { return p ? p->n_threads : 1; }

void qd_parallel_for(qd_threadpool *p, int64_t n, int64_t grain, qd_parallel_fn fn, void *user) {
    if (n <= 0) return;
    if (grain < 1) grain = 1;
    int64_t max_parts = (n + grain - 1) / grain;
    int parts = p ? p->n_threads : 1;
    if (parts > max_parts) parts = (int)max_parts;
    if (parts <= 1) {
        fn(user, 0, n, 0);
        return;
    }
    pthread_mutex_lock(&p->mu);
    p->fn = fn;
    p->user = user;
    p->n = n;
    p->n_parts = parts;
    p->pending = p->n_threads - 1;
    p->generation++;
    pthread_cond_broadcast(&p->work_cv);
    pthread_mutex_unlock(&p->mu);
    run_part(p, 0);
    pthread_mutex_lock(&p->mu);
    while (p->pending > 0) pthread_cond_wait(&p->done_cv, &p->mu);
    pthread_mutex_unlock(&p->mu);
}
