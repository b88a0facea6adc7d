/* One host thread per tensor-parallel rank (docs/parallel.md): each thread owns its
 * rank's GPU (the init callback selects it once) and runs the tasks the group hands to
 * every rank, all ranks at once or one after another. */
#ifndef QD_PARALLEL_TP_WORKERS_H
#define QD_PARALLEL_TP_WORKERS_H

#include <stdbool.h>

#include "qdelta.h"

typedef struct qd_tp_workers qd_tp_workers;

/* A task run on rank `rank`'s thread; its status is collected per rank. */
typedef qd_status (*qd_tp_task)(void *arg, int rank);

/* Starts n threads; each first runs init(arg, rank) (may be NULL) and reports its status.
 * On failure every started thread is stopped, *out is NULL and *failed_rank names the
 * rank whose init failed (-1: a thread could not be started). */
qd_status qd_tp_workers_start(int n, qd_tp_task init, void *arg, qd_tp_workers **out, int *failed_rank);
void qd_tp_workers_stop(qd_tp_workers *w);

/* Runs task(arg, r) on every rank's thread and waits for all of them: concurrently, or
 * rank after rank when sequential. Returns the first failing rank's status (QD_OK when
 * none failed) with that rank in *failed_rank (-1 when none). Calls from several host
 * threads are served one at a time. */
qd_status qd_tp_workers_run(qd_tp_workers *w, qd_tp_task task, void *arg, bool sequential, int *failed_rank);

#endif
