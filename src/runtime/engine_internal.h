/* Engine internals shared by engine.c (threads, queue, API) and scheduler.c (steps).
 *
 * Ownership: the submit queue, the `live` list, cancel flags and the published stats
 * are guarded by `mu`; everything else (waiting deque, running array, slots, the
 * context) belongs to the engine thread alone, so a step runs without the lock. */
#ifndef QD_RUNTIME_ENGINE_INTERNAL_H
#define QD_RUNTIME_ENGINE_INTERNAL_H

#include <pthread.h>

#include "model/model.h"
#include "runtime/engine.h"
#include "runtime/prefix_cache.h"

typedef enum qd_seq_phase {
    QD_SEQ_WAITING = 0,  /* queued; holds no slot and no blocks */
    QD_SEQ_PREFILLING,   /* has a slot; some of its known tokens are not in the context yet */
    QD_SEQ_DECODING,     /* has a slot; feeds back one sampled token per step */
    QD_SEQ_FORK_WAIT,    /* one of n sequences of a prompt (qd_engine_submit_n) waiting for the
                            first one's prefill, to be forked from it; holds no slot */
    QD_SEQ_FINISHED,
    QD_SEQ_CANCELLED
} qd_seq_phase;

typedef struct qd_request {
    uint64_t id;
    qd_seq_phase phase;
    /* Every token the request knows: prompt, then generated tokens. Prefill and decode
     * are one thing: feed tokens[n_computed .. n_tokens) and, once all are in, sample
     * one more. A preempted request restarts from n_computed = 0 and recomputes. */
    int32_t *tokens;          /* [n_prompt + max_tokens] */
    int n_prompt, n_tokens;
    int n_computed;           /* tokens held in its context slot */
    int slot;                 /* context sequence while running, else -1 */
    int admitted_once;        /* prompt tokens counted in the stats */
    qd_request_params params;
    qd_sampler *sampler;
    qd_engine_callback cb;
    void *user;
    int cancel_requested;     /* set by qd_engine_cancel, under mu */
    int cancel_seen;          /* copied from cancel_requested at a step boundary (engine thread) */
    int step_chunk;           /* tokens scheduled in the current step */
    int snap_branch;          /* prefix cache: where this prompt left the cached path (a snapshot target), 0: none */
    struct qd_request *fork_head;  /* the first of n: the others, waiting to be forked from it */
    struct qd_request *fork_next;  /* next in that list */
    struct qd_request *prev, *next;            /* submit queue or waiting deque */
    struct qd_request *live_prev, *live_next;  /* every request not yet finished, under mu */
} qd_request;

typedef struct qd_req_list {
    qd_request *head, *tail;
    int count;
} qd_req_list;

struct qd_engine {
    qd_model *model;
    qd_context *ctx;
    qd_engine_params params;
    int vocab;
    const int32_t *eos;
    int n_eos;

    pthread_mutex_t mu;
    pthread_cond_t cv;        /* work arrived, a cancel, or stop */
    pthread_t thread;
    int thread_started;
    int stop;                 /* under mu */
    int cancel_pending;       /* under mu: some live request has cancel_requested */
    qd_req_list incoming;     /* under mu: submitted, not yet seen by the engine thread */
    qd_request *live;         /* under mu */
    uint64_t next_id;         /* under mu */
    /* Under mu: accepted requests that hold no slot (incoming + the waiting deque,
     * preempted ones included), i.e. what submit's queue bound counts. The engine
     * thread changes it in the same moment it admits, preempts or finishes a queued
     * request (qd_engine_queued_add), so it is exact at every instant, not only at
     * step boundaries: a request admitted in a step is no longer counted when its
     * first token is reported. Also published as stats.waiting. */
    int n_queued;
    qd_engine_stats stats;    /* under mu */

    /* engine thread only, sized at creation */
    qd_req_list waiting;      /* preempted requests go to the front, new ones to the back */
    qd_request **running;     /* [max_num_seqs] in admission order (oldest first) */
    int n_running;
    int *free_slots;          /* [max_num_seqs] stack of free context sequences */
    int n_free_slots;
    int step_reserved;        /* KV blocks promised to spans of the step being built */
    qd_span *spans;           /* [max_num_seqs] the step's ragged batch */
    qd_request **span_req;    /* [max_num_seqs] request of each span */
    float *logits;            /* [max_num_seqs][vocab] one row per span that samples */
    uint8_t *full;            /* [max_num_seqs] a row's request needs its logits (sampler), not just the argmax */
    int32_t *greedy_ids;      /* [max_num_seqs] each row's argmax over the vocabulary bound */
    float *greedy_lps;        /* [max_num_seqs] its log-softmax */
    uint64_t preemptions, steps, finished, prompt_total, generated_total, prefill_total;
    qd_prefix_cache *pc;      /* NULL when off */
    char errbuf[QD_ERRMSG_SIZE + 128]; /* the message of an ERROR event, valid during its callback */
};

/* Engine thread: n_queued += delta under mu (admission -1, preemption +1). */
void qd_engine_queued_add(qd_engine *e, int delta);
/* Copies the engine thread's counters into the published stats. Caller holds mu. */
void qd_engine_publish_stats(qd_engine *e);

/* deque helpers (scheduler.c) */
void qd_req_list_push_back(qd_req_list *l, qd_request *r);
void qd_req_list_push_front(qd_req_list *l, qd_request *r);
void qd_req_list_remove(qd_req_list *l, qd_request *r);

/* Ends a request: releases its slot and blocks, sends the finishing event (with a
 * token when `sample` is given), removes it from `live` and frees it. Engine thread,
 * without mu held. */
void qd_engine_finish(qd_engine *e, qd_request *r, qd_finish_reason why, const qd_sample_result *sample,
                      const char *error);
/* One scheduling step: build the batch, forward, sample, report (scheduler.c).
 * Returns 1 if it did any work. */
int qd_engine_step(qd_engine *e);

#endif
