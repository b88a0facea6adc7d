/* The serving engine: one thread running continuous-batching steps over one context.
 *
 * Step algorithm (scheduler.c), repeated while there is work:
 *   1. At the boundary, under the lock: move newly submitted requests to the back of
 *      the waiting deque and note cancel flags. Without the lock: finish cancelled
 *      requests (CANCELLED event; slot and KV blocks back to the pools).
 *   2. Running requests, oldest first, each get the tokens they have not fed yet (one
 *      for a decode, the rest of the prompt for a prefill) within max_batch_tokens; with
 *      max_step_ms and decodes in the step, prompt tokens also within what the measured
 *      cost model (step_cost.h) says keeps the step's forward within it.
 *      A prefill chunk shrinks to the KV blocks that are free; a decode that finds no
 *      free block preempts the newest running request (which may be itself): that one
 *      gives back slot and blocks and goes to the front of the queue, to recompute
 *      its prompt and generated tokens when readmitted (nothing is reported twice).
 *   3. Waiting requests are admitted in order while a state slot is free, tokens are
 *      left in the budget and the pool has blocks for their first chunk (keeping one
 *      block per running request in reserve); the chunk is the whole prompt or what
 *      the budget leaves.
 *   4. One forward over all these spans (decodes and prefill chunks mixed); spans
 *      that end at the last known token ask for their last logits row, and the prompt
 *      chunks of requests that report their prompt's logprobs for every row (at most
 *      QD_PROMPT_LP_ROWS such rows a step). It returns
 *      every such row's argmax and log-softmax, and the whole row only for requests
 *      that need the sampler (qd_forward_mixed; greedy requests without penalties or
 *      alternatives to report need just the argmax, and on a GPU their rows stay there).
 *   5. Each such row gives the request its token (the argmax, or a draw by the
 *      request's own sampler); the token is appended and reported; EOS, max_tokens or
 *      max_model_len finish the request on that same event; a callback returning
 *      nonzero finishes it with STOP (one more event).
 * When there is nothing to do the thread sleeps on a condition variable.
 *
 * Memory plan (all at creation; a step allocates nothing): one context with
 * max_num_seqs sequences (the GDN state slots: conv + recurrent state of every GDN
 * layer, fp32), a KV pool of n_kv_blocks blocks of kv_block_size tokens shared by all
 * of them (default: enough for every slot at max_model_len), the forward's scratch
 * for max_batch_tokens rows, a logits buffer of max_num_seqs rows (with an argmax,
 * a log-softmax and a wants-the-row flag per row), the step's bookkeeping arrays
 * (spans, running list, free slots) of max_num_seqs entries, and, with the prefix
 * cache on, prefix_cache_bytes of GDN snapshot slots in the context (GPU memory on a
 * GPU; the host tier allocates per snapshot as it fills). Per
 * request, submit allocates its token array (prompt + max_tokens) and its sampler. The
 * first request with prompt logprobs grows the logit row buffers by QD_PROMPT_LP_ROWS
 * whole rows, once; an event with prompt logprobs carries a copy of them. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/clock.h"
#include "runtime/engine_internal.h"
#include "runtime/grammar/constraint.h"

qd_engine_params qd_engine_default_params(void) {
    qd_engine_params p = {
        .max_num_seqs = 8,
        .max_model_len = 4096,
        .max_batch_tokens = 512,
        .kv_block_size = 16,
        .n_kv_blocks = 0,
        .max_waiting = 1024,
        .prefix_cache_bytes = 0,
        .prefix_snapshot_interval = 512,
        .prefix_cache_host_bytes = 0,
    };
    return p;
}

/* Published under mu at each boundary, and when a request finishes (so that a client
 * holding its finishing event sees counters that include its request), so that
 * qd_engine_get_stats never touches the engine thread's state. Caller holds mu. */
void qd_engine_publish_stats(qd_engine *e) {
    qd_engine_stats *s = &e->stats;
    s->running = e->n_running;
    s->waiting = e->n_queued; /* == waiting.count + incoming.count here */
    s->slots_total = e->params.max_num_seqs;
    s->slots_used = s->slots_total - e->n_free_slots;
    s->kv_blocks_total = qd_kv_total_blocks(e->ctx);
    s->kv_blocks_used = s->kv_blocks_total - qd_kv_free_blocks(e->ctx);
    s->requests_finished = e->finished;
    s->prompt_tokens_total = e->prompt_total;
    s->generated_tokens_total = e->generated_total;
    s->preemptions = e->preemptions;
    s->steps = e->steps;
    s->prefill_tokens_total = e->prefill_total;
    s->masked_rows_total = e->masked_rows;
    s->spec_verify_steps = e->spec_steps;
    s->spec_plain_steps = e->spec_plain_steps;
    s->spec_mtp_forwards = e->spec_mtp_forwards;
    s->forward_seconds = e->forward_s;
    s->mtp_seconds = e->mtp_s;
    s->decode_steps = e->decode_steps;
    s->decode_forward_seconds = e->decode_forward_s;
    s->decode_mtp_seconds = e->decode_mtp_s;
    s->schedule_seconds = e->schedule_s;
    s->report_seconds = e->report_s;
    s->report_wait_seconds = e->report_wait_s;
    if (e->rep) s->callback_seconds = qd_reporter_callback_seconds(e->rep);
    s->step_seconds = e->step_s + (e->step_t0 > 0 ? qd_clock_seconds() - e->step_t0 : 0.0);
    s->step_cost_ready = e->cost.ready;
    s->bounded_steps = e->bounded_steps;
    for (int i = 0; i < 3; i++) s->step_cost_ms[i] = e->cost.ready ? e->cost.coef[i] : 0.0;
    s->spec_draft_tokens = e->spec_drafted;
    s->spec_accepted_tokens = e->spec_accepted;
    for (int i = 0; i < QD_SPEC_MAX; i++) s->spec_accepted_at[i] = e->spec_accepted_at[i];
    if (e->pc) {
        qd_prefix_cache_stats ps;
        qd_prefix_cache_get_stats(e->pc, &ps);
        s->prefix_hit_tokens = ps.hit_tokens;
        s->prefix_query_tokens = ps.query_tokens;
        s->prefix_evictions = ps.evictions;
        s->prefix_spills = ps.spills;
        s->prefix_host_restores = ps.host_restores;
        s->prefix_snapshots = ps.snapshots;
        s->prefix_device_snapshots = ps.device_snapshots;
        s->prefix_host_snapshots = ps.host_snapshots;
        s->prefix_blocks = ps.blocks;
        s->prefix_bytes = ps.bytes;
        s->prefix_device_bytes = ps.device_bytes;
        s->prefix_host_bytes = ps.host_bytes;
    }
}

void qd_engine_queued_add(qd_engine *e, int delta) {
    pthread_mutex_lock(&e->mu);
    e->n_queued += delta;
    e->stats.waiting = e->n_queued;
    pthread_mutex_unlock(&e->mu);
}

qd_status qd_engine_emit(qd_engine *e, const qd_request *r, const qd_engine_event *ev) {
    return r->cb ? qd_reporter_push(e->rep, r->cb, r->user, ev) : QD_OK;
}

/* Each buffer grows on its own: one that could not keeps its old size and contents, and
 * the next admission tries again for what is left. */
static int grow(void **p, size_t bytes) {
    void *q = realloc(*p, bytes);
    if (q) *p = q;
    return q != NULL;
}

qd_status qd_engine_reserve_prompt_rows(qd_engine *e, qd_err *err) {
    if (e->prompt_rows_reserved) return QD_OK;
    const size_t rows = (size_t)e->base_rows + QD_PROMPT_LP_ROWS, V = (size_t)e->vocab;
    const size_t preps = (size_t)e->params.max_num_seqs + QD_PROMPT_LP_ROWS;
    int ok = grow((void **)&e->logits, rows * V * sizeof(float)) && grow((void **)&e->full, rows) &&
             grow((void **)&e->greedy_ids, rows * sizeof *e->greedy_ids) &&
             grow((void **)&e->greedy_lps, rows * sizeof *e->greedy_lps) &&
             grow((void **)&e->allow_row, rows * sizeof *e->allow_row) &&
             grow((void **)&e->prep, preps * sizeof *e->prep) &&
             grow((void **)&e->plp_res, QD_PROMPT_LP_ROWS * sizeof *e->plp_res);
    if (ok && e->hidden) ok = grow((void **)&e->hidden, rows * (size_t)e->hidden_size * sizeof(float));
    if (!ok)
        return qd_seterr(err, QD_ERR_OOM, "out of memory for %d prompt logprob rows of %d logits", QD_PROMPT_LP_ROWS,
                         e->vocab);
    e->prompt_rows_reserved = 1;
    return QD_OK;
}

/* The reporter's thread: request_id's callback asked to stop after `delivered`
 * tokens. Ended at the next boundary like a cancel (unless it ended meanwhile). */
static void stop_request(void *owner, uint64_t request_id, int delivered) {
    qd_engine *e = owner;
    pthread_mutex_lock(&e->mu);
    for (qd_request *r = e->live; r; r = r->live_next) {
        if (r->id != request_id) continue;
        if (!r->stop_requested) {
            r->stop_requested = 1;
            r->stop_after = delivered;
            e->cancel_pending = 1;
            pthread_cond_signal(&e->cv);
        }
        break;
    }
    pthread_mutex_unlock(&e->mu);
}

/* Ends r as its callback asked: with the tokens it was given. The engine may have made
 * more since (the state keeps them, as after a rejected draft); they are not reported. */
static void finish_stopped(qd_engine *e, qd_request *r) {
    if (r->n_tokens > r->n_prompt + r->stop_after) r->n_tokens = r->n_prompt + r->stop_after;
    qd_engine_finish(e, r, QD_FINISH_STOP, NULL, NULL);
}

/* Finishes every request whose cancel or stop was seen at this boundary. */
static void process_cancels(qd_engine *e) {
    for (int i = 0; i < e->n_running;) {
        qd_request *r = e->running[i];
        if (r->stop_seen) finish_stopped(e, r); /* shifts running[] */
        else if (r->cancel_seen) qd_engine_finish(e, r, QD_FINISH_CANCELLED, NULL, NULL);
        else i++;
    }
    for (qd_request *r = e->waiting.head, *nx; r; r = nx) {
        nx = r->next;
        if (r->stop_seen) finish_stopped(e, r);
        else if (r->cancel_seen) qd_engine_finish(e, r, QD_FINISH_CANCELLED, NULL, NULL);
    }
}

/* Hands the events queued so far to the reporter; at a step's end (`step`), also moves
 * the lag mark on. */
static void publish_events(qd_engine *e, int step) {
    const uint64_t n = qd_reporter_publish(e->rep);
    if (step) {
        e->rep_lag_mark = e->rep_step_mark;
        e->rep_step_mark = n;
    }
}

static int has_work(const qd_engine *e) {
    return e->stop || e->incoming.head || e->cancel_pending || e->n_running > 0 || e->waiting.head;
}

static void *engine_main(void *arg) {
    qd_engine *e = arg;
    for (;;) {
        /* reporting overlaps the next step's forward, and no more: a callback that
         * takes long (or parks, as the tests' do) holds the engine one step later */
        e->report_wait_s += qd_reporter_wait(e->rep, e->rep_lag_mark);
        pthread_mutex_lock(&e->mu);
        qd_engine_publish_stats(e);
        if (!has_work(e)) {
            /* idle: every event delivered before sleeping, so that requests submitted
             * while a callback runs all find the engine where that callback left it */
            pthread_mutex_unlock(&e->mu);
            e->report_wait_s += qd_reporter_wait(e->rep, qd_reporter_publish(e->rep));
            pthread_mutex_lock(&e->mu);
            qd_engine_publish_stats(e);
            while (!has_work(e)) pthread_cond_wait(&e->cv, &e->mu);
        }
        while (e->incoming.head) {
            qd_request *r = e->incoming.head;
            qd_req_list_remove(&e->incoming, r);
            qd_req_list_push_back(&e->waiting, r);
        }
        int cancels = e->cancel_pending;
        if (cancels)
            for (qd_request *r = e->live; r; r = r->live_next) {
                r->cancel_seen = r->cancel_requested;
                r->stop_seen = r->stop_requested;
            }
        e->cancel_pending = 0;
        const int stop = e->stop;
        pthread_mutex_unlock(&e->mu);
        if (stop) break;
        if (cancels) {
            process_cancels(e);
            publish_events(e, 0);
        }
        qd_engine_step(e);
        publish_events(e, 1);
        /* now too, not only at the next boundary, which may wait for the reporter */
        pthread_mutex_lock(&e->mu);
        qd_engine_publish_stats(e);
        pthread_mutex_unlock(&e->mu);
    }
    /* shutdown: everything still known gets its finishing event (qd_engine_free then
     * waits for the reporter to deliver them) */
    while (e->n_running > 0) qd_engine_finish(e, e->running[0], QD_FINISH_CANCELLED, NULL, NULL);
    while (e->waiting.head) qd_engine_finish(e, e->waiting.head, QD_FINISH_CANCELLED, NULL, NULL);
    publish_events(e, 0);
    pthread_mutex_lock(&e->mu);
    qd_engine_publish_stats(e);
    pthread_mutex_unlock(&e->mu);
    return NULL;
}

static void engine_destroy(qd_engine *e) {
    qd_reporter_free(e->rep); /* delivers what is queued: its callbacks may cancel through e->mu */
    qd_prefix_cache_free(e->pc); /* before the context: it drops references to its KV blocks */
    qd_context_free(e->ctx);
    free(e->running);
    free(e->free_slots);
    free(e->spans);
    free(e->span_req);
    free(e->logits);
    free(e->full);
    free(e->prep);
    free(e->plp_res);
    free(e->allow);
    free(e->allow_row);
    free(e->masks);
    qd_threadpool_free(e->row_pool);
    free(e->greedy_ids);
    free(e->greedy_lps);
    qd_spec_engine_free(e);
    pthread_cond_destroy(&e->cv);
    pthread_mutex_destroy(&e->mu);
    free(e);
}

/* Snapshot slots planned with the context for the prefix cache's device tier: as
 * many snapshots as its budget holds. On the CPU backend their pages are committed
 * only when used; on a GPU they are device memory taken at creation. The cap only
 * keeps the slot tables of a huge budget for a tiny model reasonable. */
static int prefix_device_slots(const qd_model *m, const qd_engine_params *p) {
    if (p->prefix_cache_bytes == 0) return 0;
    const size_t slot = (size_t)qd_model_state_bytes(m);
    const size_t n = p->prefix_cache_bytes / (slot > 0 ? slot : 1);
    return n > (1u << 20) ? 1 << 20 : (int)n;
}

qd_status qd_engine_create(qd_model *model, const qd_engine_params *params, qd_engine **out, qd_err *err) {
    if (!out) return qd_seterr(err, QD_ERR_INVALID_ARG, "qd_engine_create: out is NULL");
    *out = NULL;
    if (!model) return qd_seterr(err, QD_ERR_INVALID_ARG, "qd_engine_create: model is NULL");
    qd_engine_params p = params ? *params : qd_engine_default_params();
    if (p.kv_block_size == 0) p.kv_block_size = 16;
    if (p.max_num_seqs < 1 || p.max_model_len < 1 || p.max_batch_tokens < 1 || p.kv_block_size < 1 ||
        p.n_kv_blocks < 0 || p.max_waiting < 1 || p.prefix_snapshot_interval < 0)
        return qd_seterr(err, QD_ERR_INVALID_ARG,
                         "engine params out of range: max_num_seqs %d, max_model_len %d, max_batch_tokens %d, "
                         "kv_block_size %d, max_waiting %d must be >= 1 and n_kv_blocks %d, "
                         "prefix_snapshot_interval %d >= 0",
                         p.max_num_seqs, p.max_model_len, p.max_batch_tokens, p.kv_block_size, p.max_waiting,
                         p.n_kv_blocks, p.prefix_snapshot_interval);
    if (p.speculative_tokens < 0 || p.speculative_tokens > QD_SPEC_MAX)
        return qd_seterr(err, QD_ERR_INVALID_ARG, "speculative_tokens %d is not in 0..%d (0: off)", p.speculative_tokens,
                         QD_SPEC_MAX);
    if (p.speculative_draft_vocab < 0 || p.speculative_draft_vocab > qd_model_vocab_size(model))
        return qd_seterr(err, QD_ERR_INVALID_ARG,
                         "speculative_draft_vocab %d is not in 0..%d (the model's vocabulary; 0: all of it)",
                         p.speculative_draft_vocab, qd_model_vocab_size(model));
    if (!(p.max_step_ms >= 0) || !isfinite(p.max_step_ms))
        return qd_seterr(err, QD_ERR_INVALID_ARG, "max_step_ms %g is not a finite number >= 0 (0: off)", p.max_step_ms);
    if (p.batch_invariant && p.max_batch_tokens < 2 * QD_INVARIANT_ALIGN)
        return qd_seterr(err, QD_ERR_INVALID_ARG,
                         "batch-invariant mode needs max_batch_tokens >= %d (prompts are cut at multiples of %d), "
                         "got %d", 2 * QD_INVARIANT_ALIGN, QD_INVARIANT_ALIGN, p.max_batch_tokens);
    qd_engine *e = calloc(1, sizeof *e);
    if (!e) return qd_seterr(err, QD_ERR_OOM, "out of memory for an engine");
    pthread_mutex_init(&e->mu, NULL);
    pthread_cond_init(&e->cv, NULL);
    e->model = model;
    e->params = p;
    e->vocab = qd_model_vocab_size(model);
    e->n_eos = qd_model_eos_ids(model, &e->eos);
    e->next_id = 1;
    qd_context_params cp = qd_context_default_params();
    cp.max_seqs = p.max_num_seqs;
    cp.max_ctx = p.max_model_len;
    cp.max_batch = p.max_batch_tokens;
    cp.kv_block_size = p.kv_block_size;
    cp.n_kv_blocks = p.n_kv_blocks;
    cp.n_snap_slots = prefix_device_slots(model, &p);
    cp.batch_invariant = p.batch_invariant;
    cp.mtp = p.speculative_tokens > 0; /* refused, saying why, without an MTP head or forward */
    cp.speculative_tokens = p.speculative_tokens;
    qd_status st = qd_context_create(model, &cp, &e->ctx);
    if (st != QD_OK) {
        qd_seterr(err, st, "engine context: %s", qd_model_errmsg(model));
        engine_destroy(e);
        return st;
    }
    if (p.prefix_cache_bytes > 0) {
        qd_prefix_cache_params pp = {
            .device_bytes = p.prefix_cache_bytes,
            .host_bytes = p.prefix_cache_host_bytes,
            /* keys and values of every attention layer, in the pool's own precision */
            .block_bytes = (size_t)qd_model_kv_bytes_per_token(model) * (size_t)e->ctx->kv.block_size,
        };
        st = qd_prefix_cache_create(e->ctx, &pp, &e->pc, err);
        if (st != QD_OK) {
            engine_destroy(e);
            return st;
        }
    }
    const size_t n = (size_t)p.max_num_seqs;
    const size_t rows = n * (size_t)(p.speculative_tokens + 1); /* a verify span: a logit row per token */
    e->base_rows = (int)rows;
    e->running = calloc(n, sizeof *e->running);
    e->free_slots = calloc(n, sizeof *e->free_slots);
    e->spans = calloc(n, sizeof *e->spans);
    e->span_req = calloc(n, sizeof *e->span_req);
    e->logits = malloc(rows * (size_t)e->vocab * sizeof(float));
    e->full = calloc(rows, 1);
    e->greedy_ids = calloc(rows, sizeof *e->greedy_ids);
    e->greedy_lps = calloc(rows, sizeof *e->greedy_lps);
    e->prep = calloc(n, sizeof *e->prep);
    e->allow_words = ((size_t)e->vocab + 31) / 32;
    e->allow = malloc(n * e->allow_words * sizeof *e->allow);
    e->allow_row = malloc(rows * sizeof *e->allow_row);
    e->masks = calloc(n, sizeof *e->masks);
    /* up to 8 threads for the rows' host work: a batch of constrained or sampled requests
     * costs a mask and a vocabulary-wide pass each per token; NULL (one core) runs inline */
    const long cores = sysconf(_SC_NPROCESSORS_ONLN);
    if (cores > 1) e->row_pool = qd_threadpool_create(cores < 8 ? (int)cores : 8);
    if (!e->running || !e->free_slots || !e->spans || !e->span_req || !e->logits || !e->full || !e->greedy_ids ||
        !e->greedy_lps || !e->prep || !e->allow || !e->allow_row || !e->masks) {
        engine_destroy(e);
        return qd_seterr(err, QD_ERR_OOM, "out of memory for the engine's step buffers (%d sequences)", p.max_num_seqs);
    }
    if ((st = qd_spec_engine_init(e, err)) != QD_OK) {
        engine_destroy(e);
        return st;
    }
    if ((st = qd_reporter_create(stop_request, e, &e->rep, err)) != QD_OK) {
        engine_destroy(e);
        return st;
    }
    /* slot 0 on top of the stack, so single-request runs always use the same slot */
    for (int i = 0; i < p.max_num_seqs; i++) e->free_slots[i] = p.max_num_seqs - 1 - i;
    e->n_free_slots = p.max_num_seqs;
    qd_engine_publish_stats(e);
    if (pthread_create(&e->thread, NULL, engine_main, e) != 0) {
        engine_destroy(e);
        return qd_seterr(err, QD_ERR_INTERNAL, "could not start the engine thread");
    }
    e->thread_started = 1;
    *out = e;
    return QD_OK;
}

void qd_engine_free(qd_engine *e) {
    if (!e) return;
    if (e->thread_started) {
        pthread_mutex_lock(&e->mu);
        e->stop = 1;
        pthread_cond_signal(&e->cv);
        pthread_mutex_unlock(&e->mu);
        pthread_join(e->thread, NULL);
    }
    engine_destroy(e);
}

static qd_status validate_submit(qd_engine *e, const int32_t *prompt, int n_prompt, const qd_request_params *rp,
                                 qd_err *err) {
    if (!prompt || n_prompt < 1) return qd_seterr(err, QD_ERR_INVALID_ARG, "empty prompt (%d tokens)", n_prompt);
    if (!rp) return qd_seterr(err, QD_ERR_INVALID_ARG, "request params are NULL");
    if (rp->max_tokens < (rp->prompt_logprobs ? 0 : 1))
        return qd_seterr(err, QD_ERR_INVALID_ARG, "max_tokens must be at least %d (got %d)%s",
                         rp->prompt_logprobs ? 0 : 1, rp->max_tokens,
                         rp->prompt_logprobs ? "" : "; 0 needs prompt_logprobs");
    const int lim = rp->sampling.vocab_limit;
    if (rp->prompt_logprobs && lim > 0)
        for (int i = 0; i < n_prompt; i++)
            if (prompt[i] >= lim)
                return qd_seterr(err, QD_ERR_INVALID_ARG,
                                 "prompt token id %d at position %d is past the vocabulary limit %d, so it has no "
                                 "logprob to report",
                                 prompt[i], i, lim);
    for (int i = 0; i < n_prompt; i++)
        if (prompt[i] < 0 || prompt[i] >= e->vocab)
            return qd_seterr(err, QD_ERR_INVALID_ARG, "prompt token id %d at position %d is out of range [0, %d)",
                             prompt[i], i, e->vocab);
    if (rp->min_tokens < 0 || rp->min_tokens > rp->max_tokens)
        return qd_seterr(err, QD_ERR_INVALID_ARG, "min_tokens %d is not in [0, max_tokens %d]", rp->min_tokens,
                         rp->max_tokens);
    if (rp->n_stop_token_ids < 0 || rp->n_stop_token_ids > QD_MAX_STOP_TOKEN_IDS)
        return qd_seterr(err, QD_ERR_INVALID_ARG, "%d stop token ids (at most %d)", rp->n_stop_token_ids,
                         QD_MAX_STOP_TOKEN_IDS);
    for (int i = 0; i < rp->n_stop_token_ids; i++)
        if (rp->stop_token_ids[i] < 0 || rp->stop_token_ids[i] >= e->vocab)
            return qd_seterr(err, QD_ERR_INVALID_ARG, "stop token id %d is out of range [0, %d)", rp->stop_token_ids[i],
                             e->vocab);
    if (rp->n_logit_bias < 0 || rp->n_logit_bias > QD_MAX_LOGIT_BIAS)
        return qd_seterr(err, QD_ERR_INVALID_ARG, "%d logit_bias entries (at most %d)", rp->n_logit_bias,
                         QD_MAX_LOGIT_BIAS);
    for (int i = 0; i < rp->n_logit_bias; i++) {
        const qd_logit_bias *b = &rp->logit_bias[i];
        if (b->id < 0 || b->id >= e->vocab)
            return qd_seterr(err, QD_ERR_INVALID_ARG, "logit_bias token id %d is out of range [0, %d)", b->id, e->vocab);
        if (!(b->bias >= -100.0f && b->bias <= 100.0f))
            return qd_seterr(err, QD_ERR_INVALID_ARG, "logit_bias of token %d is %g, not in [-100, 100]", b->id,
                             (double)b->bias);
    }
    if ((int64_t)n_prompt + rp->max_tokens > e->params.max_model_len)
        return qd_seterr(err, QD_ERR_CAPACITY, "prompt of %d tokens + max_tokens %d exceeds max_model_len %d", n_prompt,
                         rp->max_tokens, e->params.max_model_len);
    /* a request must fit the pool on its own, or preemption could never make room */
    int need = qd_kv_blocks_for(e->ctx, n_prompt + rp->max_tokens), total = qd_kv_total_blocks(e->ctx);
    if (need > total)
        return qd_seterr(err, QD_ERR_CAPACITY,
                         "prompt of %d tokens + max_tokens %d needs %d KV blocks but the pool has %d", n_prompt,
                         rp->max_tokens, need, total);
    return QD_OK;
}

/* A request not yet queued: its tokens (the prompt) and its sampler. */
static qd_status new_request(qd_engine *e, const int32_t *prompt, int n_prompt, const qd_request_params *params,
                             qd_engine_callback cb, void *user, qd_request **out, qd_err *err) {
    qd_request *r = calloc(1, sizeof *r);
    if (!r) return qd_seterr(err, QD_ERR_OOM, "out of memory for a request");
    r->tokens = malloc(sizeof(int32_t) * ((size_t)n_prompt + (size_t)params->max_tokens));
    if (!r->tokens) {
        free(r);
        return qd_seterr(err, QD_ERR_OOM, "out of memory for a request of %d + %d tokens", n_prompt, params->max_tokens);
    }
    qd_status st = qd_sampler_create(&params->sampling, e->vocab, &r->sampler, err);
    if (st == QD_OK) st = qd_sampler_accept_prompt(r->sampler, prompt, n_prompt, err);
    if (st != QD_OK) {
        qd_err_prefix(err, "sampling params");
        qd_sampler_free(r->sampler);
        free(r->tokens);
        free(r);
        return st;
    }
    r->params = *params;
    qd_spec_request_init(e, r);
    memcpy(r->tokens, prompt, sizeof(int32_t) * (size_t)n_prompt);
    r->n_prompt = r->n_tokens = n_prompt;
    r->plp_next = params->prompt_logprobs ? 1 : n_prompt;
    r->slot = -1;
    r->cb = cb;
    r->user = user;
    r->phase = QD_SEQ_WAITING;
    *out = r;
    return QD_OK;
}

static void free_request(qd_request *r) {
    qd_sampler_free(r->sampler);
    free(r->tokens);
    free(r);
}

qd_status qd_engine_submit_n(qd_engine *e, const int32_t *prompt, int n_prompt, const qd_request_params *params, int n,
                             qd_engine_callback cb, void *const *users, uint64_t *request_ids, qd_err *err) {
    if (!e) return qd_seterr(err, QD_ERR_INVALID_ARG, "qd_engine_submit: engine is NULL");
    if (n < 1 || n > QD_MAX_FORKS)
        return qd_seterr(err, QD_ERR_INVALID_ARG, "n = %d sequences per prompt is not in [1, %d]", n, QD_MAX_FORKS);
    QD_TRY(validate_submit(e, prompt, n_prompt, params, err));
    qd_request *rs[QD_MAX_FORKS];
    qd_status st = QD_OK;
    int made = 0;
    for (; made < n; made++) {
        qd_request_params p = *params;
        p.sampling.seed = params->sampling.seed + (uint64_t)made; /* sequence i draws with seed + i */
        /* a grammar's state is one sequence's: sequence i > 0 gets its own copy (the
         * caller's goes to the first) */
        if (made > 0 && params->constraint &&
            (st = qd_constraint_clone(params->constraint, &p.constraint, err)) != QD_OK)
            break;
        if ((st = new_request(e, prompt, n_prompt, &p, cb, users ? users[made] : NULL, &rs[made], err)) != QD_OK) {
            if (made > 0) qd_constraint_free(p.constraint); /* the failed request freed itself, not its copy */
            break;
        }
    }
    if (st == QD_OK) {
        /* the first is an ordinary request; the others wait for its prefill, then fork */
        for (int i = 1; i < n; i++) {
            rs[i]->phase = QD_SEQ_FORK_WAIT;
            rs[i]->fork_next = rs[0]->fork_head;
            rs[0]->fork_head = rs[i];
        }
        pthread_mutex_lock(&e->mu);
        if (e->stop) st = qd_seterr(err, QD_ERR_INVALID_ARG, "the engine is shutting down");
        else if (e->n_queued + n > e->params.max_waiting)
            st = qd_seterr(err, QD_ERR_CAPACITY, "request queue full (%d waiting, max_waiting %d, %d more asked)",
                           e->n_queued, e->params.max_waiting, n);
        if (st == QD_OK) {
            for (int i = 0; i < n; i++) {
                qd_request *r = rs[i];
                r->id = e->next_id++;
                /* written before the engine thread can see r: its callback may run before we return */
                if (request_ids) request_ids[i] = r->id;
                r->live_next = e->live;
                if (e->live) e->live->live_prev = r;
                e->live = r;
            }
            qd_req_list_push_back(&e->incoming, rs[0]);
            e->n_queued += n; /* the waiting forks count as queued until they get a slot */
            e->stats.waiting = e->n_queued;
            pthread_cond_signal(&e->cv);
        }
        pthread_mutex_unlock(&e->mu);
    }
    if (st != QD_OK)
        for (int i = 0; i < made; i++) {
            if (i > 0) qd_constraint_free(rs[i]->params.constraint);
            free_request(rs[i]);
        }
    return st;
}

qd_status qd_engine_submit(qd_engine *e, const int32_t *prompt, int n_prompt, const qd_request_params *params,
                           qd_engine_callback cb, void *user, uint64_t *request_id, qd_err *err) {
    return qd_engine_submit_n(e, prompt, n_prompt, params, 1, cb, &user, request_id, err);
}

void qd_engine_cancel(qd_engine *e, uint64_t request_id) {
    if (!e) return;
    pthread_mutex_lock(&e->mu);
    for (qd_request *r = e->live; r; r = r->live_next) {
        if (r->id != request_id) continue;
        r->cancel_requested = 1;
        e->cancel_pending = 1;
        pthread_cond_signal(&e->cv);
        break;
    }
    pthread_mutex_unlock(&e->mu);
}

void qd_engine_get_stats(qd_engine *e, qd_engine_stats *out) {
    if (!e || !out) return;
    pthread_mutex_lock(&e->mu);
    *out = e->stats;
    pthread_mutex_unlock(&e->mu);
}
