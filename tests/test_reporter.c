/* The engine's reporting thread (src/runtime/reporter.h) on its own:
 *   - several thousand events of interleaved requests, pushed past the buffers' first
 *     size without publishing (the engine's buffer grows) and published in uneven
 *     pieces while the thread is still delivering (appended to what it has not taken):
 *     every event delivered once, in push order;
 *   - an error message is copied at push (the engine reuses its buffer);
 *   - a callback that asks to stop: the stop hook hears it once with the tokens
 *     delivered, that request's later token events are dropped, and its finishing event
 *     (ended by length here, as if the engine had gone on) arrives as STOP without a
 *     token, counting the tokens delivered;
 *   - qd_reporter_wait returns once the given count is delivered; qd_reporter_free
 *     delivers what was pushed but not published;
 *   - two events published at once (one batch for the thread) whose second callback
 *     parks: a wait for the first returns while the second is still in its callback (the
 *     engine runs one step beside a slow callback, not two behind). */
#include <errno.h>
#include <time.h>
#include <pthread.h>
#include <string.h>
#include <unistd.h>

#include "qd_test.h"
#include "runtime/reporter.h"

#define N_IDS 12
#define TOKENS 400 /* per request: N_IDS x (TOKENS + 1) events, past the buffers' 256 */
#define STOP_ID 5
#define STOP_AT 17
#define ERROR_ID 9

typedef struct seen {
    int tokens;          /* token events delivered */
    int bad_order;       /* a token event whose completion_tokens is not tokens + 1 */
    int finishes, after_finish;
    qd_engine_event last; /* the finishing event */
    char error[128];
} seen;

static seen g_seen[N_IDS + 1];
static int g_order_breaks; /* events out of push order across requests */
static uint64_t g_last_seq;
static int g_stop_calls, g_stop_delivered;
static uint64_t g_stop_id;

/* push order rides in the sample's first alternative: a sequence number */
static int on_event(void *user, const qd_engine_event *ev) {
    (void)user;
    seen *s = &g_seen[ev->request_id];
    const uint64_t seq = (uint64_t)ev->sample.top[0].id;
    if (ev->has_token) {
        if (seq <= g_last_seq && g_last_seq != 0) g_order_breaks++;
        g_last_seq = seq;
    }
    if (s->finishes) s->after_finish++;
    if (ev->has_token) {
        if (ev->completion_tokens != s->tokens + 1) s->bad_order++;
        s->tokens++;
    }
    if (ev->finish != QD_FINISH_NONE) {
        s->finishes++;
        s->last = *ev;
        snprintf(s->error, sizeof s->error, "%s", ev->error ? ev->error : "");
    }
    if (ev->request_id == 1 && s->tokens == 1) usleep(20000); /* the engine publishes meanwhile */
    return ev->request_id == STOP_ID && ev->has_token && s->tokens == STOP_AT;
}

/* The parking test's callback: request 101's parks until released. */
static pthread_mutex_t g_park_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_park_cv = PTHREAD_COND_INITIALIZER;
static int g_parked, g_release, g_waited;

static int on_park(void *user, const qd_engine_event *ev) {
    (void)user;
    if (ev->request_id != 101) return 0;
    pthread_mutex_lock(&g_park_mu);
    g_parked = 1;
    pthread_cond_broadcast(&g_park_cv);
    while (!g_release) pthread_cond_wait(&g_park_cv, &g_park_mu);
    pthread_mutex_unlock(&g_park_mu);
    return 0;
}

static void *wait_first(void *arg) {
    qd_reporter_wait(arg, 1);
    pthread_mutex_lock(&g_park_mu);
    g_waited = 1;
    pthread_cond_broadcast(&g_park_cv);
    pthread_mutex_unlock(&g_park_mu);
    return NULL;
}

static void no_stop(void *owner, uint64_t id, int delivered) {
    (void)owner;
    (void)id;
    (void)delivered;
}

static void test_wait_beside_parked(void) {
    qd_reporter *rp = NULL;
    qd_err err = {0};
    CHECKF(qd_reporter_create(no_stop, NULL, &rp, &err) == QD_OK, "create: %s", err.msg);
    if (!rp) return;
    for (uint64_t id = 100; id <= 101; id++) {
        const qd_engine_event ev = {.request_id = id, .completion_tokens = 1, .has_token = 1};
        qd_reporter_push(rp, on_park, NULL, &ev);
    }
    qd_reporter_publish(rp); /* both in one piece: the thread takes them together */
    pthread_mutex_lock(&g_park_mu);
    while (!g_parked) pthread_cond_wait(&g_park_cv, &g_park_mu);
    pthread_mutex_unlock(&g_park_mu);
    pthread_t th;
    const int started = pthread_create(&th, NULL, wait_first, rp) == 0;
    CHECK(started);
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += 10;
    pthread_mutex_lock(&g_park_mu);
    int rc = 0;
    while (started && !g_waited && rc != ETIMEDOUT) rc = pthread_cond_timedwait(&g_park_cv, &g_park_mu, &until);
    const int waited = g_waited;
    g_release = 1; /* the second callback returns either way, so that the waiter ends */
    pthread_cond_broadcast(&g_park_cv);
    pthread_mutex_unlock(&g_park_mu);
    CHECKF(waited, "a wait for the first of two events taken together did not return while the second's callback "
                   "was parked");
    if (started) pthread_join(th, NULL);
    qd_reporter_free(rp);
}

static void on_stop(void *owner, uint64_t id, int delivered) {
    (void)owner;
    g_stop_calls++;
    g_stop_id = id;
    g_stop_delivered = delivered;
}

int main(void) {
    qd_reporter *rp = NULL;
    qd_err err = {0};
    CHECKF(qd_reporter_create(on_stop, NULL, &rp, &err) == QD_OK, "create: %s", err.msg);
    if (!rp) return qd_test_finish("test_reporter");

    char errbuf[64];
    uint64_t seq = 0, pushed = 0, published = 0;
    int since_publish = 0;
    for (int t = 1; t <= TOKENS + 1; t++) {
        for (uint64_t id = 1; id <= N_IDS; id++) {
            qd_engine_event ev = {.request_id = id, .prompt_tokens = 3, .completion_tokens = t};
            if (t <= TOKENS) {
                ev.has_token = 1;
                ev.sample.token = (int32_t)(t * 100 + (int)id);
                ev.sample.top[0].id = (int32_t)++seq;
                ev.finish = t == TOKENS ? QD_FINISH_LENGTH : QD_FINISH_NONE;
            } else if (id == ERROR_ID) {
                /* one more event for this request: an error, its message in a buffer
                 * overwritten right after the push */
                ev.completion_tokens = TOKENS;
                ev.finish = QD_FINISH_ERROR;
                snprintf(errbuf, sizeof errbuf, "forward failed on request %d", ERROR_ID);
                ev.error = errbuf;
            } else {
                continue;
            }
            if (id == ERROR_ID && t == TOKENS) ev.finish = QD_FINISH_NONE; /* it ends with the error */
            qd_reporter_push(rp, on_event, NULL, &ev);
            if (ev.error) memset(errbuf, 'x', sizeof errbuf - 1);
            pushed++;
            /* the first 600 events in one piece (the engine's buffer grows), then pieces
             * of 1 to 97 while the thread delivers */
            if (pushed > 600 && ++since_publish >= (int)(pushed % 97) + 1) {
                published = qd_reporter_publish(rp);
                since_publish = 0;
            }
        }
    }
    /* the rest stays unpublished until free; wait for what was published */
    qd_reporter_wait(rp, published);
    int delivered_before_free = 0;
    for (int id = 1; id <= N_IDS; id++) delivered_before_free += g_seen[id].tokens + g_seen[id].finishes;
    CHECKF(published > 0 && delivered_before_free > 0, "nothing delivered before free (%llu published)",
           (unsigned long long)published);
    CHECKF(qd_reporter_callback_seconds(rp) > 0.015, "callback seconds %.4f (one callback slept 20 ms)",
           qd_reporter_callback_seconds(rp));
    qd_reporter_free(rp);

    CHECKF(g_order_breaks == 0, "%d token events out of push order", g_order_breaks);
    for (int id = 1; id <= N_IDS; id++) {
        const seen *s = &g_seen[id];
        CHECKF(s->finishes == 1 && s->after_finish == 0 && s->bad_order == 0,
               "request %d: %d finishing events, %d after, %d out of order", id, s->finishes, s->after_finish,
               s->bad_order);
        if (id == STOP_ID) {
            CHECKF(s->tokens == STOP_AT, "stopped request: %d tokens delivered, want %d", s->tokens, STOP_AT);
            CHECKF(s->last.finish == QD_FINISH_STOP && !s->last.has_token && s->last.completion_tokens == STOP_AT &&
                       s->last.prompt_tokens == 3,
                   "stopped request's end: finish %d, token %d, %d completion tokens", (int)s->last.finish,
                   s->last.has_token, s->last.completion_tokens);
        } else if (id == ERROR_ID) {
            CHECKF(s->tokens == TOKENS && s->last.finish == QD_FINISH_ERROR &&
                       strcmp(s->error, "forward failed on request 9") == 0,
                   "error request: %d tokens, finish %d, message '%s'", s->tokens, (int)s->last.finish, s->error);
        } else {
            CHECKF(s->tokens == TOKENS && s->last.finish == QD_FINISH_LENGTH && s->last.has_token &&
                       s->last.sample.token == TOKENS * 100 + id,
                   "request %d: %d tokens, finish %d", id, s->tokens, (int)s->last.finish);
        }
    }
    CHECKF(g_stop_calls == 1 && g_stop_id == STOP_ID && g_stop_delivered == STOP_AT,
           "stop hook: %d calls, id %llu after %d tokens", g_stop_calls, (unsigned long long)g_stop_id,
           g_stop_delivered);
    test_wait_beside_parked();
    return qd_test_finish("test_reporter");
}
