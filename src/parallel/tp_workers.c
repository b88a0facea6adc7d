/* Rank threads (tp_workers.h). A task is published under the mutex with a generation
 * number; each rank thread runs it when the generation moves (or, sequentially, when
 * its turn comes) and counts itself done. */
#include <pthread.h>
#include <stdlib.h>

#include "parallel/tp_workers.h"

struct qd_tp_workers {
    int n, started;
    pthread_t *threads;
    pthread_mutex_t mu;
    pthread_cond_t go, done;
    pthread_mutex_t call_mu;  /* one run at a time */
    unsigned gen;             /* bumped for every task */
    int turn;                 /* sequential: the rank whose turn it is; -1: all at once */
    int n_done;
    bool quit;
    qd_tp_task task;
    void *arg;
    qd_status *status;        /* [n] */
    struct start_arg *arg_store; /* [n] */
};

typedef struct start_arg {
    qd_tp_workers *w;
    int rank;
} start_arg;

static void *thread_main(void *p) {
    start_arg *sa = p;
    qd_tp_workers *w = sa->w;
    const int rank = sa->rank;
    unsigned seen = 0;
    pthread_mutex_lock(&w->mu);
    for (;;) {
        while (!w->quit && (w->gen == seen || (w->turn >= 0 && w->turn != rank))) pthread_cond_wait(&w->go, &w->mu);
        if (w->quit) break;
        seen = w->gen;
        qd_tp_task task = w->task;
        void *arg = w->arg;
        pthread_mutex_unlock(&w->mu);
        const qd_status s = task(arg, rank);
        pthread_mutex_lock(&w->mu);
        w->status[rank] = s;
        w->n_done++;
        if (w->turn >= 0) { /* sequential: the next rank's turn */
            w->turn++;
            pthread_cond_broadcast(&w->go);
        }
        pthread_cond_broadcast(&w->done);
    }
    pthread_mutex_unlock(&w->mu);
    return NULL;
}

static qd_status run_locked(qd_tp_workers *w, qd_tp_task task, void *arg, bool sequential, int *failed_rank) {
    pthread_mutex_lock(&w->mu);
    w->task = task;
    w->arg = arg;
    w->n_done = 0;
    w->turn = sequential ? 0 : -1;
    w->gen++;
    pthread_cond_broadcast(&w->go);
    while (w->n_done < w->started) pthread_cond_wait(&w->done, &w->mu);
    w->turn = -1;
    pthread_mutex_unlock(&w->mu);
    *failed_rank = -1;
    for (int r = 0; r < w->started; r++)
        if (w->status[r] != QD_OK) {
            *failed_rank = r;
            return w->status[r];
        }
    return QD_OK;
}

qd_status qd_tp_workers_run(qd_tp_workers *w, qd_tp_task task, void *arg, bool sequential, int *failed_rank) {
    pthread_mutex_lock(&w->call_mu);
    const qd_status s = run_locked(w, task, arg, sequential, failed_rank);
    pthread_mutex_unlock(&w->call_mu);
    return s;
}

void qd_tp_workers_stop(qd_tp_workers *w) {
    if (!w) return;
    pthread_mutex_lock(&w->mu);
    w->quit = true;
    pthread_cond_broadcast(&w->go);
    pthread_mutex_unlock(&w->mu);
    for (int r = 0; r < w->started; r++) pthread_join(w->threads[r], NULL);
    pthread_mutex_destroy(&w->mu);
    pthread_mutex_destroy(&w->call_mu);
    pthread_cond_destroy(&w->go);
    pthread_cond_destroy(&w->done);
    free(w->threads);
    free(w->status);
    free(w->arg_store);
    free(w);
}

qd_status qd_tp_workers_start(int n, qd_tp_task init, void *arg, qd_tp_workers **out, int *failed_rank) {
    *out = NULL;
    *failed_rank = -1;
    qd_tp_workers *w = calloc(1, sizeof *w);
    if (!w) return QD_ERR_OOM;
    w->n = n;
    w->turn = -1;
    w->threads = calloc((size_t)n, sizeof *w->threads);
    w->status = calloc((size_t)n, sizeof *w->status);
    w->arg_store = calloc((size_t)n, sizeof *w->arg_store);
    pthread_mutex_init(&w->mu, NULL);
    pthread_mutex_init(&w->call_mu, NULL);
    pthread_cond_init(&w->go, NULL);
    pthread_cond_init(&w->done, NULL);
    if (!w->threads || !w->status || !w->arg_store) {
        qd_tp_workers_stop(w);
        return QD_ERR_OOM;
    }
    for (int r = 0; r < n; r++) {
        w->arg_store[r] = (start_arg){w, r};
        if (pthread_create(&w->threads[r], NULL, thread_main, &w->arg_store[r]) != 0) {
            qd_tp_workers_stop(w);
            return QD_ERR_INTERNAL;
        }
        w->started++;
    }
    if (init) {
        const qd_status s = qd_tp_workers_run(w, init, arg, false, failed_rank);
        if (s != QD_OK) {
            qd_tp_workers_stop(w);
            return s;
        }
    }
    *out = w;
    return QD_OK;
}
