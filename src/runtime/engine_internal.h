/* Engine internals shared by engine.c (threads, queue, API) and scheduler.c (steps).
 *
 * Ownership: the submit queue, the `live` list, cancel flags and the published stats
 * are guarded by `mu`; everything else (waiting deque, running array, slots, the
 * context) belongs to the engine thread alone, so a step runs without the lock. */
#ifndef QD_RUNTIME_ENGINE_INTERNAL_H
#define QD_RUNTIME_ENGINE_INTERNAL_H

#include <pthread.h>

#include "base/threadpool.h"
#include "model/model.h"
#include "runtime/engine.h"
#include "runtime/prefix_cache.h"
#include "runtime/reporter.h"
#include "runtime/spec_accept.h"
#include "runtime/spec_policy.h"
#include "runtime/step_cost.h"

#define QD_SPEC_MAX 4 /* draft tokens per step at most (qd_context_params.speculative_tokens) */
_Static_assert(QD_SPEC_MAX <= QD_SPEC_POLICY_MAX_K, "the policy tracks every draft position");
/* MTP pairs a request may hold pending: the steps between two that run the MTP (the policy's
 * probe interval; such a step runs every request's held pairs) and a verify step's kept
 * positions, so that steps that do not draft run no MTP forward at all; a request that would
 * go past it has every request's pairs run without drafting. */
#define QD_SPEC_PEND_MAX (QD_SPEC_PROBE_EVERY + QD_SPEC_MAX + 4)
/* Logit rows a step gives to prompt logprobs (qd_request_params.prompt_logprobs), over
 * all its spans: each such row is a whole vocabulary row on the host (1 MB at a 248k
 * vocabulary), so a long prompt reports in pieces of at most this many positions. A
 * multiple of QD_INVARIANT_ALIGN, so that batch-invariant pieces fit it. */
#define QD_PROMPT_LP_ROWS 256
_Static_assert(QD_PROMPT_LP_ROWS % QD_INVARIANT_ALIGN == 0, "batch-invariant pieces fit the prompt rows");

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
    /* Its callback asked to stop after stop_after completion tokens (the reporter,
     * under mu); seen like a cancel, it ends the request as STOP with those tokens. */
    int stop_requested, stop_after;
    int stop_seen;
    int step_chunk;           /* tokens scheduled in the current step */
    int snap_branch;          /* prefix cache: where this prompt left the cached path (a snapshot target), 0: none */
    /* Prompt logprobs: the next prompt position to report (from logit row plp_next - 1);
     * n_prompt when none is left (or none was asked for). Kept across preemptions. */
    int plp_next;
    /* Speculative decoding (spec_step.c). Invariant while it holds a slot: the MTP KV
     * covers positions [0, n_computed - n_pend); the pairs of the rest, (target hidden
     * state at position p, token p + 1), wait in pend_h / pend_t and run with the next
     * step's first draft (or when they would overflow). */
    int spec;                 /* speculates: the engine's K > 0 and no grammar constraint */
    int32_t pend_t[QD_SPEC_PEND_MAX]; /* their hidden states: qd_spec_pend_h (by slot) */
    int n_pend;
    int n_draft;              /* drafts in this step's verify span (0: a plain span) */
    int32_t vtok[QD_SPEC_MAX + 1]; /* this step's verify span: the last sampled token, the drafts */
    int mtp_row;              /* scratch of the draft phase: its row in the MTP outputs */
    qd_spec_rng spec_rng;     /* draws of the rejection sampler (seeded from the request's seed) */
    struct qd_request *fork_head;  /* the first of n: the others, waiting to be forked from it */
    struct qd_request *fork_next;  /* next in that list */
    struct qd_request *prev, *next;            /* submit queue or waiting deque */
    struct qd_request *live_prev, *live_next;  /* every request not yet finished, under mu */
} qd_request;

typedef struct qd_req_list {
    qd_request *head, *tail;
    int count;
} qd_req_list;

/* One row prepared before the step's tokens are reported (scheduler.c): a sampled row
 * (pos 0), or the row before prompt position pos, which reports that position's token. */
typedef struct qd_row_prep {
    int span, row, pos;
    qd_status st;
    qd_sample_result res;
    qd_err err;
} qd_row_prep;

/* A constrained greedy row whose grammar mask goes to the forward (scheduler.c). */
typedef struct qd_row_mask {
    int span, row;
} qd_row_mask;

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
    int cancel_pending;       /* under mu: some live request has cancel_requested or stop_requested */
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
    int step_prompt, step_decode; /* the step being built: prompt tokens (prefill chunks), decode rows */
    qd_step_cost cost;        /* forward ms of a step from its prompt tokens and decode rows (max_step_ms) */
    uint64_t bounded_steps;   /* steps whose prompt budget max_step_ms held below max_batch_tokens (stats) */
    qd_span *spans;           /* [max_num_seqs] the step's ragged batch */
    qd_request **span_req;    /* [max_num_seqs] request of each span */
    /* Logit rows a step may have: one per sampling span (max_num_seqs, times K + 1 with
     * speculation: see below), plus QD_PROMPT_LP_ROWS once a request with prompt logprobs
     * came (qd_engine_reserve_prompt_rows grows the row buffers then, once). */
    int base_rows, prompt_rows_reserved;
    int step_plp_left;        /* prompt logprob rows the step being built may still take */
    float *logits;            /* [rows][vocab] the step's logit rows, in span order */
    uint8_t *full;            /* [rows] the row is needed whole (sampler, prompt logprobs), not just its argmax */
    int32_t *greedy_ids;      /* [rows] each row's argmax over the vocabulary bound */
    float *greedy_lps;        /* [rows] its log-softmax */
    /* The host's work on the step's sampled rows (the request's edits, its grammar's mask,
     * its sampler: what a constrained or sampled request costs per token) runs for all of
     * them at once on row_pool, before they are reported in order: each row is one
     * request's, with its own constraint and sampler. */
    qd_threadpool *row_pool;
    qd_row_prep *prep;        /* [max_num_seqs (+ QD_PROMPT_LP_ROWS)] the step's rows prepared that way */
    qd_sample_result *plp_res; /* [QD_PROMPT_LP_ROWS] one span's prompt logprobs, for its event */
    int n_prep;
    /* Constrained greedy rows decided by the forward's argmax under their grammar's mask
     * (qd_forward_args.allow), filled on row_pool before the forward: no logits row
     * leaves the device and no vocabulary-wide host pass runs for them. */
    size_t allow_words;       /* words of one mask: (vocab + 31) / 32 */
    uint32_t *allow;          /* [max_num_seqs][allow_words] the step's masks */
    int32_t *allow_row;       /* [rows like full] each logit row's mask, or -1 */
    qd_row_mask *masks;       /* [max_num_seqs] the step's masked rows, mask k for masks[k] */
    int n_masks;
    uint64_t masked_rows;     /* tokens decided that way since creation (stats) */
    /* Speculative decoding (spec_step.c; all NULL when off). Logit rows: a verify span
     * has one per token, so logits, full, greedy_ids and greedy_lps above hold
     * max_num_seqs * (K + 1) rows. */
    int spec_k;               /* params.speculative_tokens */
    int hidden_size;
    uint8_t *verify;          /* [max_num_seqs] span i is a verify span */
    uint8_t *hid_all;         /* [max_num_seqs] span i (a speculating prefill) wants every row's hidden state */
    float *hidden;            /* [rows][hidden] each logit row's final-normed state */
    float *all_hidden;        /* [max_batch_tokens][hidden] the hid_all spans' rows */
    qd_span *mtp_spans;       /* [max_num_seqs] */
    qd_request **mtp_req;     /* [max_num_seqs] */
    float *mtp_in;            /* [mtp_in_rows][hidden] MTP hidden inputs */
    int mtp_in_rows;          /* max(n (K + 1), min(n PEND_MAX, max_batch_tokens), PEND_MAX): n seqs */
    float *pend_pool;         /* [max_num_seqs][QD_SPEC_PEND_MAX][hidden] the pending pairs' hidden states, by slot */
    float *mtp_hout;          /* [max_num_seqs][hidden] h' of the last draft step */
    int32_t *mtp_ids;         /* [max_num_seqs] the drafts' argmax (qd_mtp_forward_ids) */
    float *probs;             /* [vocab] the target's distribution of one verify row */
    double *resid;            /* [vocab] the rejection sampler's residual */
    double forward_s, mtp_s;  /* seconds in the steps' main forwards and MTP forwards (stats) */
    uint64_t decode_steps;    /* steps without a prompt token, and their share of the two */
    double decode_forward_s, decode_mtp_s;
    double step_s;            /* seconds in whole steps: scheduling, forwards, sampling, reporting (stats) */
    double schedule_s;        /* ... of them choosing the step's spans (admissions, KV blocks, prefix hits) */
    double report_s;          /* ... and sampling, advancing and queuing the events of its rows */
    /* The requests' callbacks run on the reporter's thread. The engine thread lets it
     * lag one step: before a step it waits until the events of the step before the
     * last are delivered (rep_lag_mark: events published until then). */
    qd_reporter *rep;
    uint64_t rep_step_mark, rep_lag_mark;
    double report_wait_s;     /* seconds the engine thread waited for the reporter (stats) */
    double step_t0;           /* when the step in progress began (0: none), so that stats published
                               * inside a step count its time so far beside its forward's */
    uint64_t spec_steps, spec_drafted, spec_accepted, spec_accepted_at[QD_SPEC_MAX];
    /* Whether this step drafts (spec_policy.h; always in batch-invariant mode or with
     * params.speculative_always), the policy's measurements, the counters as they were
     * before this step (its deltas feed the policy) and the steps it kept plain. */
    int spec_draft_step;
    const qd_request *spec_probe; /* a probe step's one drafting request (else NULL) */
    uint64_t spec_probes;         /* probe steps so far: which request probes next */
    int spec_pend_rows;       /* this step's pending pairs run by its draft phase */
    uint64_t spec_mtp_forwards; /* MTP forward calls (drafts, held pairs, prompt catch-up, flushes) */
    qd_spec_policy spec_policy;
    uint64_t spec_steps_prev, spec_accepted_at_prev[QD_SPEC_MAX];
    uint64_t spec_plain_steps;
    /* Another drafter in place of the MTP's argmax (tests: perfect or wrong drafts; set
     * before the first submit). Returns the draft for output position n_generated + j
     * of the request (n_generated tokens reported so far, j = 0.. of this step), or -1
     * for the MTP's. The MTP still runs on it, so its KV is what it would be. */
    int32_t (*draft_override)(void *user, uint64_t request_id, int n_generated, int j);
    void *draft_user;
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

/* Queues ev for r's callback (the reporter delivers it). Engine thread. Fails only for
 * an event with prompt logprobs, when there is no memory for their copy. */
qd_status qd_engine_emit(qd_engine *e, const qd_request *r, const qd_engine_event *ev);
/* Grows the step's row buffers by QD_PROMPT_LP_ROWS rows, the first time a request with
 * prompt logprobs is admitted (a no-op after). Engine thread. */
qd_status qd_engine_reserve_prompt_rows(qd_engine *e, qd_err *err);
/* Ends a request: releases its slot and blocks, queues the finishing event (with a
 * token when `sample` is given), removes it from `live` and frees it. Engine thread,
 * without mu held. */
void qd_engine_finish(qd_engine *e, qd_request *r, qd_finish_reason why, const qd_sample_result *sample,
                      const char *error);
/* One scheduling step: build the batch, forward, sample, report (scheduler.c; its wall
 * time adds to step_s). Returns 1 if it did any work. */
int qd_engine_step(qd_engine *e);

/* scheduler.c pieces spec_step.c reuses */
qd_finish_reason qd_engine_finish_after(const qd_engine *e, const qd_request *r, int32_t tok);
void qd_engine_edit_row(const qd_engine *e, const qd_request *r, float *row);

/* ------------------------------------------ prompt logprobs (scheduler.c, step_rows.c)
 * Logit row p of a prompt (the row after its token p) gives the logprob of token p + 1:
 * rows p in [plp_next - 1, n_prompt - 1) are still to report. Such a request computes
 * its whole prompt (no prefix cache while rows are left), in pieces of at most the
 * step's QD_PROMPT_LP_ROWS rows, whose spans return every row (QD_LOGITS_ALL). */
static inline int qd_req_wants_prompt_rows(const qd_request *r) { return r->plp_next < r->n_prompt; }

/* Whether logit row p of r reports a prompt position. */
static inline int qd_req_is_prompt_row(const qd_request *r, int p) { return p >= r->plp_next - 1 && p < r->n_prompt - 1; }

/* Whether a span of r over positions [c, c + n) holds such a row. */
static inline int qd_req_span_reports_prompt(const qd_request *r, int c, int n) {
    return qd_req_wants_prompt_rows(r) && c + n >= r->plp_next && c < r->n_prompt - 1;
}

/* Logit rows of a span. */
static inline int qd_span_rows(const qd_span *s) {
    return s->logits == QD_LOGITS_ALL ? s->n_tokens : s->logits == QD_LOGITS_LAST ? 1 : 0;
}

/* Whether r samples a token when its known tokens are in (not a prompt-only request). */
static inline int qd_req_samples(const qd_request *r) { return r->params.max_tokens > 0; }

/* ------------------------------------------ the step's rows (step_rows.c) */

/* The sequences waiting to fork from r, queued (at the front, in order) as ordinary
 * requests: r ends without forking them, or found no free slot for them (scheduler.c). */
void qd_engine_release_forks(qd_engine *e, qd_request *r);
/* The step's forward, one call for every mix of requests (see step_rows.c). */
qd_status qd_engine_step_forward(qd_engine *e, int n_spans);
/* After the forward: every row that goes through the sampler or reports a prompt position,
 * prepared at once on the row pool. */
void qd_engine_prepare_rows(qd_engine *e, int n_spans);
/* Span i's prompt positions (prepared from *prep on) in one event; 0 when r ended instead. */
int qd_engine_report_prompt(qd_engine *e, qd_request *r, int i, int *prep);
/* r's next token from logit row `row` (prep: its prepared row, or NULL), appended and
 * reported, with the sequences forked from r at its first token. */
void qd_engine_sample_and_report(qd_engine *e, qd_request *r, int row, const qd_row_prep *prep);

/* ------------------------------------------ speculative decoding (spec_step.c) */

/* Buffers of the speculative path, sized from the engine's params (engine_create). */
qd_status qd_spec_engine_init(qd_engine *e, qd_err *err);
void qd_spec_engine_free(qd_engine *e);
/* Whether r is a speculating decode: one that verifies drafts when its step drafts. */
static inline int qd_spec_decoding(const qd_request *r) { return r->spec && r->phase == QD_SEQ_DECODING; }
/* The hidden states of r's pending pairs (r holds a slot). */
static inline float *qd_spec_pend_h(const qd_engine *e, const qd_request *r) {
    return e->pend_pool + (size_t)r->slot * QD_SPEC_PEND_MAX * (size_t)e->hidden_size;
}
/* A request's own state (submit): the rejection sampler's seed. */
void qd_spec_request_init(qd_engine *e, qd_request *r);
/* r got a slot whose first `start` tokens came from the prefix cache (0: none): the
 * MTP KV in the shared blocks covers them (snapshots are taken where it does). */
void qd_spec_admitted(qd_engine *e, qd_request *r, int start);
/* The drafts length of a decode of r this step, at most `room` tokens of span in all. */
int qd_spec_drafts_for(const qd_engine *e, const qd_request *r, int room);
/* KV blocks a speculating decode of r needs beyond the main span's: private copies of
 * shared blocks its MTP writes into. */
int qd_spec_extra_blocks(const qd_engine *e, const qd_request *r);
/* Before a step is scheduled: whether its speculating decodes draft (e->spec_draft_step),
 * all of them or, on a probe step, one (e->spec_probe). */
void qd_spec_decide_step(qd_engine *e);
/* Whether r drafts at this step (before its room is known: qd_spec_drafts_for). */
int qd_spec_drafting(const qd_engine *e, const qd_request *r);
/* After its tokens are kept: the step's acceptance and, when `drafting` requests drafted,
 * the draft phase's ms, for the policy. */
void qd_spec_observe_step(qd_engine *e, int drafting, double draft_ms);
/* Before the forward: the MTP drafts of every verify span of the step (span tokens
 * pointed at r->vtok). */
qd_status qd_spec_draft(qd_engine *e, int n_spans);
/* After the forward: the MTP over the prompt pairs the hid_all spans made known. */
qd_status qd_spec_catch_up(qd_engine *e, int n_spans);
/* A plain span of a speculating r ended at a sampled token: its last row's hidden state
 * hid and the token join the pending pairs. */
void qd_spec_set_pending(qd_engine *e, qd_request *r, const float *hid, int32_t token);
/* The verify span of r (logit rows from `row`): accept, roll back, report. */
void qd_spec_accept_and_report(qd_engine *e, qd_request *r, int row);
/* Before a snapshot of a finished r: the pending pairs into the MTP KV, so that the
 * snapshot's blocks hold it for every position. Returns 0 when the snapshot must not be
 * taken (the MTP forward failed). */
int qd_spec_flush(qd_engine *e, qd_request *r);

#endif
