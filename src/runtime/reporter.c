/* The engine's reporting thread (reporter.h).
 *
 * Three buffers of events: `fill` (the engine thread's, no lock), `ready` (published,
 * under mu) and `work` (the reporting thread's, being delivered). Publishing moves
 * fill's events to ready (a swap when ready is empty); the reporting thread swaps
 * ready with its emptied work buffer and delivers without the lock. */
#include "runtime/reporter.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "base/clock.h"
#include "base/log.h"

#define REP_INITIAL 256 /* events a buffer holds before it first grows */

typedef struct rep_entry {
    qd_engine_callback cb;
    void *user;
    qd_engine_event ev; /* ev.error, ev.prompt_lp: copies owned by the entry, or NULL */
} rep_entry;

typedef struct rep_buf {
    rep_entry *v;
    size_t n, cap;
} rep_buf;

/* A request whose callback asked to stop, until its finishing event is delivered. */
typedef struct rep_stop {
    uint64_t id;
    int delivered; /* completion tokens delivered when it asked */
} rep_stop;

struct qd_reporter {
    pthread_mutex_t mu;
    pthread_cond_t work_cv; /* the reporting thread: something published, or quit */
    pthread_cond_t done_cv; /* the engine thread: ready taken, or more delivered */
    pthread_t thread;
    int thread_started;
    rep_buf fill;           /* engine thread only */
    uint64_t published;     /* written under mu by the engine thread (which may read it without) */
    rep_buf ready;          /* under mu */
    /* Events delivered, counted one by one as each callback returns (the reporting
     * thread stores, the engine thread reads), and the count the engine thread waits for
     * (0: none). A batch taken at once may hold two steps' events; counting at its end
     * would hold the engine behind a callback of the step it is allowed to run beside. */
    _Atomic uint64_t delivered;
    _Atomic uint64_t want;
    double callback_s;      /* under mu */
    int quit;               /* under mu */
    rep_buf work;           /* reporting thread only, and its stops: */
    rep_stop *stops;
    int n_stops, cap_stops;
    qd_reporter_stop_fn stop;
    void *owner;
};

static int buf_init(rep_buf *b) {
    b->v = malloc(REP_INITIAL * sizeof *b->v);
    b->n = 0;
    b->cap = b->v ? REP_INITIAL : 0;
    return b->v != NULL;
}

static int buf_reserve(rep_buf *b, size_t need) {
    if (need <= b->cap) return 1;
    size_t cap = b->cap ? b->cap : REP_INITIAL;
    while (cap < need) cap *= 2;
    rep_entry *v = realloc(b->v, cap * sizeof *v);
    if (!v) return 0;
    b->v = v;
    b->cap = cap;
    return 1;
}

static void buf_swap(rep_buf *a, rep_buf *b) {
    rep_buf t = *a;
    *a = *b;
    *b = t;
}

static void free_entries(rep_buf *b) {
    for (size_t i = 0; i < b->n; i++) {
        free((char *)b->v[i].ev.error);
        free((qd_sample_result *)b->v[i].ev.prompt_lp);
    }
    b->n = 0;
}

static int find_stop(const qd_reporter *rp, uint64_t id) {
    for (int i = 0; i < rp->n_stops; i++)
        if (rp->stops[i].id == id) return i;
    return -1;
}

static void add_stop(qd_reporter *rp, uint64_t id, int delivered) {
    if (rp->n_stops == rp->cap_stops) {
        const int cap = rp->cap_stops ? 2 * rp->cap_stops : 16;
        rep_stop *s = realloc(rp->stops, (size_t)cap * sizeof *s);
        if (!s) {
            /* the engine still ends the request at its next boundary; only the
             * tokens it made meanwhile reach the callback */
            QD_LOGW("out of memory recording that request %llu stopped", (unsigned long long)id);
            return;
        }
        rp->stops = s;
        rp->cap_stops = cap;
    }
    rp->stops[rp->n_stops++] = (rep_stop){.id = id, .delivered = delivered};
}

static void deliver(qd_reporter *rp, const rep_entry *en) {
    qd_engine_event ev = en->ev;
    const int k = rp->n_stops > 0 ? find_stop(rp, ev.request_id) : -1;
    if (k >= 0) {
        if (ev.finish == QD_FINISH_NONE) return; /* made after the callback asked to stop */
        /* its end, whatever the engine ended it with: the STOP it asked for */
        const int delivered = rp->stops[k].delivered;
        memset(&ev.sample, 0, sizeof ev.sample);
        ev.has_token = 0;
        ev.prompt_lp = NULL;
        ev.n_prompt_lp = 0;
        ev.finish = QD_FINISH_STOP;
        ev.error = NULL;
        ev.completion_tokens = delivered;
        rp->stops[k] = rp->stops[--rp->n_stops];
    }
    if (en->cb(en->user, &ev) != 0 && ev.finish == QD_FINISH_NONE) {
        add_stop(rp, ev.request_id, ev.completion_tokens);
        rp->stop(rp->owner, ev.request_id, ev.completion_tokens);
    }
}

static void *reporter_main(void *arg) {
    qd_reporter *rp = arg;
    pthread_mutex_lock(&rp->mu);
    for (;;) {
        while (rp->ready.n == 0 && !rp->quit) pthread_cond_wait(&rp->work_cv, &rp->mu);
        if (rp->ready.n == 0) break; /* quit, and everything delivered */
        buf_swap(&rp->ready, &rp->work);
        pthread_cond_broadcast(&rp->done_cv); /* a publisher waiting for room may go on */
        pthread_mutex_unlock(&rp->mu);
        const double t0 = qd_clock_seconds();
        uint64_t done = atomic_load(&rp->delivered);
        for (size_t i = 0; i < rp->work.n; i++) {
            deliver(rp, &rp->work.v[i]);
            if (i + 1 == rp->work.n) { /* the batch's time counts before its last event does,
                                        * so a wait for that event sees it in callback_s */
                const double t1 = qd_clock_seconds();
                pthread_mutex_lock(&rp->mu);
                rp->callback_s += t1 - t0;
                pthread_mutex_unlock(&rp->mu);
            }
            /* Sequentially consistent with the waiter's store of `want` and load of
             * `delivered` (qd_reporter_wait): one of the two sees the other's store. */
            atomic_store(&rp->delivered, ++done);
            const uint64_t w = atomic_load(&rp->want);
            if (w && done >= w) {
                pthread_mutex_lock(&rp->mu);
                pthread_cond_broadcast(&rp->done_cv);
                pthread_mutex_unlock(&rp->mu);
            }
        }
        free_entries(&rp->work);
        pthread_mutex_lock(&rp->mu);
        pthread_cond_broadcast(&rp->done_cv);
    }
    pthread_mutex_unlock(&rp->mu);
    return NULL;
}

static void destroy(qd_reporter *rp) {
    free_entries(&rp->fill);
    free_entries(&rp->ready);
    free(rp->fill.v);
    free(rp->ready.v);
    free(rp->work.v);
    free(rp->stops);
    pthread_cond_destroy(&rp->work_cv);
    pthread_cond_destroy(&rp->done_cv);
    pthread_mutex_destroy(&rp->mu);
    free(rp);
}

qd_status qd_reporter_create(qd_reporter_stop_fn stop, void *owner, qd_reporter **out, qd_err *err) {
    *out = NULL;
    qd_reporter *rp = calloc(1, sizeof *rp);
    if (!rp) return qd_seterr(err, QD_ERR_OOM, "out of memory for the engine's reporter");
    atomic_init(&rp->delivered, 0);
    atomic_init(&rp->want, 0);
    pthread_mutex_init(&rp->mu, NULL);
    pthread_cond_init(&rp->work_cv, NULL);
    pthread_cond_init(&rp->done_cv, NULL);
    rp->stop = stop;
    rp->owner = owner;
    if (!buf_init(&rp->fill) || !buf_init(&rp->ready) || !buf_init(&rp->work)) {
        destroy(rp);
        return qd_seterr(err, QD_ERR_OOM, "out of memory for the engine's event queues");
    }
    if (pthread_create(&rp->thread, NULL, reporter_main, rp) != 0) {
        destroy(rp);
        return qd_seterr(err, QD_ERR_INTERNAL, "could not start the engine's reporting thread");
    }
    rp->thread_started = 1;
    *out = rp;
    return QD_OK;
}

void qd_reporter_free(qd_reporter *rp) {
    if (!rp) return;
    qd_reporter_publish(rp);
    pthread_mutex_lock(&rp->mu);
    rp->quit = 1;
    pthread_cond_signal(&rp->work_cv);
    pthread_mutex_unlock(&rp->mu);
    if (rp->thread_started) pthread_join(rp->thread, NULL);
    destroy(rp);
}

uint64_t qd_reporter_publish(qd_reporter *rp) {
    if (rp->fill.n == 0) return rp->published;
    pthread_mutex_lock(&rp->mu);
    const size_t n = rp->fill.n;
    /* append to what the reporting thread has not taken yet; when that cannot grow,
     * wait until it is taken and hand over the whole buffer instead */
    while (rp->ready.n > 0 && !buf_reserve(&rp->ready, rp->ready.n + n)) pthread_cond_wait(&rp->done_cv, &rp->mu);
    if (rp->ready.n == 0) {
        buf_swap(&rp->ready, &rp->fill);
    } else {
        memcpy(rp->ready.v + rp->ready.n, rp->fill.v, n * sizeof *rp->fill.v);
        rp->ready.n += n;
        rp->fill.n = 0;
    }
    rp->published += n;
    pthread_cond_signal(&rp->work_cv);
    pthread_mutex_unlock(&rp->mu);
    return rp->published;
}

qd_status qd_reporter_push(qd_reporter *rp, qd_engine_callback cb, void *user, const qd_engine_event *ev) {
    qd_sample_result *lp = NULL;
    if (ev->n_prompt_lp > 0) {
        if (!(lp = malloc(sizeof *lp * (size_t)ev->n_prompt_lp))) return QD_ERR_OOM;
        memcpy(lp, ev->prompt_lp, sizeof *lp * (size_t)ev->n_prompt_lp);
    }
    if (rp->fill.n == rp->fill.cap && !buf_reserve(&rp->fill, rp->fill.n + 1)) qd_reporter_publish(rp);
    rep_entry *en = &rp->fill.v[rp->fill.n++];
    en->cb = cb;
    en->user = user;
    en->ev = *ev;
    en->ev.prompt_lp = lp;
    /* the engine's message buffer is reused; without memory for a copy the callback
     * gets NULL, i.e. an error without its message */
    if (ev->error) en->ev.error = strdup(ev->error);
    return QD_OK;
}

double qd_reporter_wait(qd_reporter *rp, uint64_t upto) {
    pthread_mutex_lock(&rp->mu);
    double waited = 0;
    if (atomic_load(&rp->delivered) < upto) {
        const double t0 = qd_clock_seconds();
        atomic_store(&rp->want, upto);
        while (atomic_load(&rp->delivered) < upto) pthread_cond_wait(&rp->done_cv, &rp->mu);
        atomic_store(&rp->want, 0);
        waited = qd_clock_seconds() - t0;
    }
    pthread_mutex_unlock(&rp->mu);
    return waited;
}

double qd_reporter_callback_seconds(qd_reporter *rp) {
    pthread_mutex_lock(&rp->mu);
    const double s = rp->callback_s;
    pthread_mutex_unlock(&rp->mu);
    return s;
}
