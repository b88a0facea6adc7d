/* The rank threads of a split model (src/parallel/tp_workers.c): a task reaches every
 * rank's own thread (the same thread every time, the one its init ran on); concurrent
 * runs have every rank inside the task at once (a rendezvous that a serial run could not
 * pass), sequential runs go in rank order; the first failing rank and its status come
 * back; tasks from several caller threads are served one at a time. */
#include <pthread.h>
#include <string.h>
#include <time.h>

#include "parallel/tp_workers.h"
#include "qd_test.h"

#define N 4

typedef struct shared {
    pthread_t owner[N];
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int inside, order[N], n_order, fail_rank, runs;
    bool rendezvous_ok;
} shared;

static qd_status init(void *arg, int r) {
    shared *s = arg;
    s->owner[r] = pthread_self();
    return QD_OK;
}

/* Waits (up to 5 s) until every rank is inside: only concurrent threads get through. */
static qd_status rendezvous(void *arg, int r) {
    shared *s = arg;
    if (!pthread_equal(s->owner[r], pthread_self())) return QD_ERR_INTERNAL;
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += 5;
    pthread_mutex_lock(&s->mu);
    s->inside++;
    pthread_cond_broadcast(&s->cv);
    int rc = 0;
    while (s->inside < N && rc == 0) rc = pthread_cond_timedwait(&s->cv, &s->mu, &until);
    if (s->inside < N) s->rendezvous_ok = false;
    pthread_mutex_unlock(&s->mu);
    return QD_OK;
}

static qd_status record_order(void *arg, int r) {
    shared *s = arg;
    pthread_mutex_lock(&s->mu);
    if (s->n_order < N) s->order[s->n_order] = r;
    s->n_order++;
    s->runs++;
    pthread_mutex_unlock(&s->mu);
    return r == s->fail_rank ? QD_ERR_BACKEND : r == s->fail_rank + 1 ? QD_ERR_CAPACITY : QD_OK;
}

typedef struct caller {
    qd_tp_workers *w;
    shared *s;
} caller;

static void *call_many(void *p) {
    caller *c = p;
    int bad;
    for (int i = 0; i < 50; i++) (void)qd_tp_workers_run(c->w, record_order, c->s, i % 2, &bad);
    return NULL;
}

int main(void) {
    shared s;
    memset(&s, 0, sizeof s);
    pthread_mutex_init(&s.mu, NULL);
    pthread_cond_init(&s.cv, NULL);
    s.fail_rank = -5;
    qd_tp_workers *w = NULL;
    int bad = 0;
    CHECK(qd_tp_workers_start(N, init, &s, &w, &bad) == QD_OK && w && bad == -1);
    if (!w) return qd_test_finish("test_tp_workers");
    s.rendezvous_ok = true;
    CHECK(qd_tp_workers_run(w, rendezvous, &s, false, &bad) == QD_OK && bad == -1);
    CHECKF(s.rendezvous_ok && s.inside == N, "concurrent run: %d of %d ranks met", s.inside, N);
    s.n_order = 0;
    CHECK(qd_tp_workers_run(w, record_order, &s, true, &bad) == QD_OK);
    CHECKF(s.n_order == N && s.order[0] == 0 && s.order[1] == 1 && s.order[2] == 2 && s.order[3] == 3,
           "sequential order %d %d %d %d", s.order[0], s.order[1], s.order[2], s.order[3]);
    s.fail_rank = 1;
    s.n_order = 0;
    CHECK(qd_tp_workers_run(w, record_order, &s, false, &bad) == QD_ERR_BACKEND && bad == 1 && s.n_order == N);
    s.fail_rank = -5;
    /* two caller threads at once: every run still reaches every rank exactly once */
    s.runs = 0;
    s.n_order = 0;
    pthread_t th[2];
    caller c = {w, &s};
    for (int i = 0; i < 2; i++) pthread_create(&th[i], NULL, call_many, &c);
    for (int i = 0; i < 2; i++) pthread_join(th[i], NULL);
    CHECKF(s.runs == 2 * 50 * N, "%d task runs, expected %d", s.runs, 2 * 50 * N);
    qd_tp_workers_stop(w);
    /* an init that fails stops the threads and names the rank */
    s.fail_rank = 2;
    w = NULL;
    CHECK(qd_tp_workers_start(N, record_order, &s, &w, &bad) == QD_ERR_BACKEND && !w && bad == 2);
    return qd_test_finish("test_tp_workers");
}
