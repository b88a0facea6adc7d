/* The engine's reporting thread: it runs the requests' callbacks (where a server
 * detokenizes, matches stop strings and queues its output) while the engine thread
 * goes on to the next step, so that a step's forward does not wait for the last
 * step's reporting.
 *
 * The engine thread pushes events as it makes them and publishes them at a step's
 * end; the reporting thread delivers them in that order, each request's in its own
 * order. A callback that returns nonzero (stop) cannot end its request at once any
 * more: the engine may already be running the next step with it. The reporter then
 * drops that request's later token events, turns its finishing event (whatever the
 * engine ends it with) into STOP without a token, with completion_tokens counting the
 * tokens delivered, and tells the engine through `stop` so that it ends the request
 * at its next step boundary. */
#ifndef QD_RUNTIME_REPORTER_H
#define QD_RUNTIME_REPORTER_H

#include <stdint.h>

#include "base/err.h"
#include "runtime/engine.h"

typedef struct qd_reporter qd_reporter;

/* Called on the reporting thread when request_id's callback asked to stop after
 * `delivered` completion tokens; must not wait for the engine thread. */
typedef void (*qd_reporter_stop_fn)(void *owner, uint64_t request_id, int delivered);

/* Starts the reporting thread. */
qd_status qd_reporter_create(qd_reporter_stop_fn stop, void *owner, qd_reporter **out, qd_err *err);
/* Delivers everything published, then stops the thread and frees. Events pushed but
 * not published are published first. */
void qd_reporter_free(qd_reporter *rp);

/* Engine thread: queues cb(user, ev) (ev->error and ev->prompt_lp are copied). When the
 * queue cannot grow it waits for the reporting thread to take what is queued; fails
 * (QD_ERR_OOM, nothing queued) only when there is no memory for the prompt_lp copy. */
qd_status qd_reporter_push(qd_reporter *rp, qd_engine_callback cb, void *user, const qd_engine_event *ev);
/* Engine thread: hands the pushed events to the reporting thread; returns how many
 * have been published since creation. */
uint64_t qd_reporter_publish(qd_reporter *rp);
/* Waits until the first `upto` published events are delivered (their callbacks
 * returned); returns the seconds it waited. Not from inside a callback. */
double qd_reporter_wait(qd_reporter *rp, uint64_t upto);
/* Wall seconds spent in callbacks so far (thread-safe): every batch the reporting thread
 * took at once counts when its last event is delivered, so after qd_reporter_wait(rp, n)
 * for every published event n it holds all of their callbacks' time. */
double qd_reporter_callback_seconds(qd_reporter *rp);

#endif
