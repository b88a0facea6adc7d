/* Prometheus metrics of the server: counters and latency histograms updated from the
 * MHD and engine threads (one mutex; updates are a few adds), rendered as text. */
#ifndef QD_SERVER_METRICS_H
#define QD_SERVER_METRICS_H

#include <pthread.h>
#include <stdint.h>

#include "runtime/engine.h"

#define SRV_HIST_MAX 16
#define SRV_STATUS_MAX 16

typedef struct srv_hist {
    int n_bounds;
    double bounds[SRV_HIST_MAX];
    uint64_t counts[SRV_HIST_MAX + 1]; /* last: +Inf */
    double sum;
    uint64_t n;
} srv_hist;

typedef struct srv_metrics {
    pthread_mutex_t mu;
    int status_codes[SRV_STATUS_MAX];
    uint64_t status_counts[SRV_STATUS_MAX];
    uint64_t prompt_tokens, generated_tokens, cancelled, finished;
    srv_hist ttft, itl, e2e;
} srv_metrics;

void srv_metrics_init(srv_metrics *m);
void srv_metrics_destroy(srv_metrics *m);
void srv_metrics_status(srv_metrics *m, int status);
void srv_metrics_ttft(srv_metrics *m, double seconds);
void srv_metrics_itl(srv_metrics *m, double seconds);
/* A generation finished: tokens and end-to-end latency. */
void srv_metrics_finished(srv_metrics *m, int prompt_tokens, int completion_tokens, double e2e, int cancelled);
/* Renders everything (engine stats included, st may be NULL) into a malloc'd string. */
char *srv_metrics_render(srv_metrics *m, const qd_engine_stats *st, int open_streams);

#endif
