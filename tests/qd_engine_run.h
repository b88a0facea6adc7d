/* One engine request's events collected for a test: its tokens and logprobs as they come
 * (up to QD_RUN_MAX_OUT), how it finished and why, and a wait for the finish. The engine
 * thread calls qd_run_on_event; the test thread waits in qd_run_wait. */
#ifndef QD_ENGINE_RUN_H
#define QD_ENGINE_RUN_H

#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "runtime/engine.h"

#define QD_RUN_MAX_OUT 64

typedef struct qd_run {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int32_t toks[QD_RUN_MAX_OUT];
    float lps[QD_RUN_MAX_OUT];
    int n, done;
    qd_finish_reason finish;
    char error[512];
} qd_run;

static inline int qd_run_on_event(void *user, const qd_engine_event *ev) {
    qd_run *r = user;
    pthread_mutex_lock(&r->mu);
    if (ev->has_token && r->n < QD_RUN_MAX_OUT) {
        r->toks[r->n] = ev->sample.token;
        r->lps[r->n++] = ev->sample.logprob;
    }
    if (ev->finish != QD_FINISH_NONE) {
        r->finish = ev->finish;
        if (ev->error) snprintf(r->error, sizeof r->error, "%s", ev->error);
        r->done = 1;
        pthread_cond_signal(&r->cv);
    }
    pthread_mutex_unlock(&r->mu);
    return 0;
}

static inline void qd_run_init(qd_run *r) {
    memset(r, 0, sizeof *r);
    pthread_mutex_init(&r->mu, NULL);
    pthread_cond_init(&r->cv, NULL);
}

/* Waits for the finish event, then releases the run's lock and condition. */
static inline void qd_run_wait(qd_run *r) {
    pthread_mutex_lock(&r->mu);
    while (!r->done) pthread_cond_wait(&r->cv, &r->mu);
    pthread_mutex_unlock(&r->mu);
    pthread_mutex_destroy(&r->mu);
    pthread_cond_destroy(&r->cv);
}

#endif
