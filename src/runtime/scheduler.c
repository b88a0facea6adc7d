/* The engine's step: which tokens of which requests go into this step's one ragged
 * batch, snapshots, preemption and the end of a request, and the step itself (its
 * forward, sampling and events are step_rows.c's). Engine thread only (see engine.c for
 * the algorithm in words and the memory plan). */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/clock.h"
#include "runtime/engine_internal.h"
#include "runtime/grammar/constraint.h"

void qd_req_list_push_back(qd_req_list *l, qd_request *r) {
    r->next = NULL;
    r->prev = l->tail;
    if (l->tail) l->tail->next = r;
    else l->head = r;
    l->tail = r;
    l->count++;
}

void qd_req_list_push_front(qd_req_list *l, qd_request *r) {
    r->prev = NULL;
    r->next = l->head;
    if (l->head) l->head->prev = r;
    else l->tail = r;
    l->head = r;
    l->count++;
}

void qd_req_list_remove(qd_req_list *l, qd_request *r) {
    if (r->prev) r->prev->next = r->next;
    else l->head = r->next;
    if (r->next) r->next->prev = r->prev;
    else l->tail = r->prev;
    r->prev = r->next = NULL;
    l->count--;
}

/* ------------------------------------------------ batch-invariant mode
 * A prompt token's result may not depend on how its prompt was cut into pieces over
 * the steps. Every op of the forward is computed row by row in one order in this mode
 * (qd_context_params.batch_invariant) except the GDN delta rule, whose chunked form
 * groups a piece's tokens in chunks of QD_INVARIANT_ALIGN from the piece's first
 * token while a one-token piece takes the recurrence. So here:
 *   - a prompt piece starts at a multiple of the alignment (0, the end of the previous
 *     piece, or a cached prefix) and ends at one, or at the end of the prompt;
 *   - it never leaves exactly one prompt token for the next piece (that token would
 *     take the recurrence, where the whole prompt's last chunk takes the chunked form);
 *   - tokens past the prompt (generated ones fed again after a preemption) go one per
 *     step, as they were when decoded;
 *   - snapshots are taken, and prefixes restored, only at such boundaries inside the
 *     prompt: a state that went through decode steps is not the one a prefill of the
 *     same tokens gives, so a finished request's state is not cached. */
static int invariant(const qd_engine *e) { return e->params.batch_invariant; }

/* The largest permitted end, at most `end`, of r's next piece starting at c; c when
 * none is (the request waits for a step with more room). */
static int invariant_end(const qd_request *r, int c, int end) {
    const int L = r->n_prompt, A = QD_INVARIANT_ALIGN;
    if (c >= L) return end > c ? c + 1 : c;
    if (end >= L) return L;
    int e = end / A * A;
    if (L - e == 1) e -= A;
    return e > c ? e : c;
}

/* The boundary where a snapshot wanted at prompt position x is taken. */
static int invariant_snap_pos(const qd_request *r, int x) {
    const int L = r->n_prompt;
    if (x > L - 2) x = L - 2;
    return x < 0 ? 0 : x / QD_INVARIANT_ALIGN * QD_INVARIANT_ALIGN;
}

/* The snapshot interval: a multiple of the alignment. */
static int snapshot_interval(const qd_engine *e) {
    const int iv = e->params.prefix_snapshot_interval, A = QD_INVARIANT_ALIGN;
    return invariant(e) && iv > 0 ? (iv + A - 1) / A * A : iv;
}

/* The prefix cache's model identity: one base model per engine for now; a LoRA
 * adapter would get its own key so that snapshots never cross adapters. */
#define PREFIX_KEY_BASE 0

/* Stores r's state (tokens[0..n_computed), the GDN state of its slot and the KV
 * blocks covering them) in the prefix cache. Nothing happens when it is already
 * cached, when the slot does not hold exactly those tokens, or on a failed copy: the
 * cache is optional. */
static void take_snapshot(qd_engine *e, qd_request *r) {
    if (!e->pc || r->slot < 0 || r->n_computed < 1) return;
    if (invariant(e) && (r->n_computed % QD_INVARIANT_ALIGN || r->n_computed > r->n_prompt - 2)) return;
    /* the MTP KV of every position goes into the cached blocks with the rest */
    if (r->spec && r->n_pend > 0 && !qd_spec_flush(e, r)) return;
    qd_prefix_cache_store(e->pc, PREFIX_KEY_BASE, r->tokens, r->n_computed, r->slot);
}

/* The request's own snapshot position (see qd_request_params.snapshot_at), 0: none. */
static int snapshot_at(const qd_request *r) {
    const int a = r->params.snapshot_at;
    return a >= 1 && a < r->n_prompt ? a : 0;
}

/* The next prompt position after n_computed where a snapshot is wanted (the chunk
 * is cut there), INT_MAX for none. */
static int next_snapshot_target(const qd_engine *e, const qd_request *r) {
    if (!e->pc || r->n_computed >= r->n_prompt - 1) return INT_MAX;
    const int c = r->n_computed, iv = snapshot_interval(e);
    /* one short of the end: a repeat of this prompt still has a token to compute */
    int want[4] = {r->n_prompt - 1, r->snap_branch, snapshot_at(r), iv > 0 ? (c / iv + 1) * iv : 0};
    int t = INT_MAX;
    for (int i = 0; i < 4; i++) {
        const int x = invariant(e) ? invariant_snap_pos(r, want[i]) : want[i];
        if (x > c && x < t) t = x;
    }
    return t;
}

/* After a prefill chunk: does it end where next_snapshot_target wanted a snapshot? */
static int at_snapshot_target(const qd_engine *e, const qd_request *r) {
    const int c = r->n_computed, iv = snapshot_interval(e);
    if (iv > 0 && c % iv == 0) return 1;
    const int want[3] = {r->n_prompt - 1, r->snap_branch, snapshot_at(r)};
    for (int i = 0; i < 3; i++)
        if (want[i] > 0 && c == (invariant(e) ? invariant_snap_pos(r, want[i]) : want[i])) return 1;
    return 0;
}

/* Takes r out of the running array (keeping admission order) and gives its slot and
 * KV blocks back. */
static void release_slot(qd_engine *e, qd_request *r) {
    if (r->slot < 0) return;
    for (int i = 0; i < e->n_running; i++) {
        if (e->running[i] != r) continue;
        memmove(&e->running[i], &e->running[i + 1], sizeof(qd_request *) * (size_t)(e->n_running - i - 1));
        e->n_running--;
        break;
    }
    qd_seq_reset(e->ctx, r->slot); /* zero GDN state, blocks back to the pool */
    e->free_slots[e->n_free_slots++] = r->slot;
    r->slot = -1;
    r->n_computed = 0;
    r->n_pend = 0; /* the MTP KV went with the blocks */
}

/* Recompute-style preemption: the request loses its slot and blocks but keeps every
 * token it knows (prompt and generated, already reported), and goes to the front of
 * the queue; readmitted, it prefills all of them again and continues sampling with
 * its sampler untouched, so nothing is reported twice and seeded runs do not change. */
static void preempt(qd_engine *e, qd_request *r) {
    release_slot(e, r);
    r->phase = QD_SEQ_WAITING;
    qd_req_list_push_front(&e->waiting, r);
    qd_engine_queued_add(e, 1);
    e->preemptions++;
}

void qd_engine_release_forks(qd_engine *e, qd_request *r) {
    while (r->fork_head) {
        qd_request *c = r->fork_head;
        r->fork_head = c->fork_next;
        c->fork_next = NULL;
        c->phase = QD_SEQ_WAITING;
        qd_req_list_push_front(&e->waiting, c); /* still counted in n_queued */
    }
}

void qd_engine_finish(qd_engine *e, qd_request *r, qd_finish_reason why, const qd_sample_result *sample,
                      const char *error) {
    /* a finished generation's state is the start of the next turn of a conversation */
    if (r->slot >= 0 && (why == QD_FINISH_EOS || why == QD_FINISH_LENGTH || why == QD_FINISH_STOP))
        take_snapshot(e, r);
    int was_queued = 0;
    if (r->slot >= 0) release_slot(e, r);
    else if (r->phase == QD_SEQ_WAITING) {
        qd_req_list_remove(&e->waiting, r);
        was_queued = 1;
    } else if (r->phase == QD_SEQ_FORK_WAIT) {
        was_queued = 1; /* only its first sequence finishes it this way: it is out of that list already */
    }
    /* sequences still waiting to fork from this one go on as ordinary requests */
    qd_engine_release_forks(e, r);
    r->phase = why == QD_FINISH_CANCELLED ? QD_SEQ_CANCELLED : QD_SEQ_FINISHED;
    qd_engine_event ev = {
        .request_id = r->id,
        .has_token = sample != NULL,
        .finish = why,
        .error = error,
        .prompt_tokens = r->n_prompt,
        .completion_tokens = r->n_tokens - r->n_prompt,
    };
    if (sample) ev.sample = *sample;
    /* gone from `live` (and counted) before its callback runs, so that a callback
     * reading the stats sees it finished and a late cancel of its id is ignored */
    pthread_mutex_lock(&e->mu);
    if (r->live_prev) r->live_prev->live_next = r->live_next;
    else e->live = r->live_next;
    if (r->live_next) r->live_next->live_prev = r->live_prev;
    e->finished++;
    if (was_queued) --e->n_queued;
    qd_engine_publish_stats(e);
    pthread_mutex_unlock(&e->mu);
    qd_engine_emit(e, r, &ev);
    qd_sampler_free(r->sampler);
    qd_constraint_free(r->params.constraint);
    free(r->tokens);
    free(r);
}

static int min_i(int a, int b) { return a < b ? a : b; }

/* Tokens of r that fit in the blocks it holds plus `free_blocks` more. */
static int tokens_fitting(const qd_engine *e, const qd_request *r, int want, int free_blocks) {
    const qd_context *ctx = e->ctx;
    if (qd_kv_total_blocks(ctx) == 0) return want;
    const int bs = ctx->kv.block_size;
    const qd_seq_blocks *q = &ctx->seqs[r->slot];
    /* a partly filled last block shared with the prefix cache is copied before the
     * first write, and the copy takes one of the free blocks */
    if (q->length % bs != 0 && qd_kv_blocks_needed(ctx, r->slot, 1) > 0) {
        if (free_blocks < 1) return 0;
        free_blocks--;
    }
    int room = (q->n_blocks + free_blocks) * bs - q->length;
    return room < 0 ? 0 : min_i(want, room);
}

/* Blocks not yet promised to a span of this step (qd_forward takes them all at once). */
static int avail_blocks(const qd_engine *e) { return qd_kv_free_blocks(e->ctx) - e->step_reserved; }

/* A span of `chunk` tokens of r; n_draft > 0 makes it a verify span of the last sampled
 * token and n_draft drafts (drafted just before the forward: qd_spec_draft). */
static void add_span(qd_engine *e, int *n_spans, qd_request *r, int chunk, int n_draft) {
    const int target = next_snapshot_target(e, r);
    if (!n_draft && target != INT_MAX && r->n_computed + chunk > target) chunk = target - r->n_computed;
    if (r->phase == QD_SEQ_PREFILLING) {
        e->prefill_total += (uint64_t)chunk;
        e->step_prompt += chunk;
    } else {
        e->step_decode += chunk;
    }
    e->step_reserved += qd_kv_blocks_needed(e->ctx, r->slot, chunk);
    if (qd_spec_decoding(r)) e->step_reserved += qd_spec_extra_blocks(e, r);
    r->step_chunk = chunk;
    r->n_draft = n_draft;
    const int last = r->n_computed + chunk >= r->n_tokens;
    const int prompt_rows = !n_draft && qd_req_span_reports_prompt(r, r->n_computed, chunk);
    if (prompt_rows) e->step_plp_left -= chunk;
    const qd_logits_mode mode = n_draft || prompt_rows ? QD_LOGITS_ALL
                                : last && qd_req_samples(r)  ? QD_LOGITS_LAST
                                                      : QD_LOGITS_NONE;
    e->spans[*n_spans] = (qd_span){r->slot, r->tokens + r->n_computed, chunk, mode};
    e->span_req[*n_spans] = r;
    if (e->spec_k) {
        e->verify[*n_spans] = (uint8_t)(n_draft > 0);
        /* a speculating request's prompt (or recomputed) rows feed the MTP */
        e->hid_all[*n_spans] = (uint8_t)(r->spec && r->phase == QD_SEQ_PREFILLING);
    }
    (*n_spans)++;
}

/* Running requests first, oldest first: each gets its remaining tokens (one when
 * decoding) within the step's token budget, a prefill chunk also within the step's
 * prompt budget (max_step_ms). When the pool cannot hold them, a prefill chunk shrinks
 * to what fits; otherwise the newest running request is preempted, which may be this
 * one (then it waits at the front of the queue). */
static int schedule_running(qd_engine *e, int *budget, int *prompt_budget) {
    int n_spans = 0;
    for (int i = 0; i < e->n_running && *budget > 0; i++) {
        qd_request *r = e->running[i];
        const int c = r->n_computed;
        const int prefill = r->phase == QD_SEQ_PREFILLING;
        int chunk = min_i(r->n_tokens - c, prefill ? min_i(*budget, *prompt_budget) : *budget);
        if (qd_req_wants_prompt_rows(r)) chunk = min_i(chunk, e->step_plp_left);
        if (chunk == 0) continue; /* a prompt waits for the next step's prompt budget */
        /* a speculating decode: the last sampled token and its drafts (one by one through
         * the GDN recurrence, so batch-invariant mode needs no alignment for it) */
        const int spec_decode = qd_spec_decoding(r);
        int n_draft = spec_decode ? qd_spec_drafts_for(e, r, *budget) : 0;
        if (spec_decode) chunk = 1 + n_draft;
        else if (invariant(e) && (chunk = invariant_end(r, c, c + chunk) - c) == 0) continue;
        int self_preempted = 0;
        while (qd_kv_blocks_needed(e->ctx, r->slot, chunk) + (spec_decode ? qd_spec_extra_blocks(e, r) : 0) >
               avail_blocks(e)) {
            /* drafts are the first to go when blocks are short */
            if (n_draft > 0) {
                n_draft = 0;
                chunk = 1;
                continue;
            }
            /* cached prefixes give way before any running request does, also those that
             * free no block: the shortfall may be a block the cache shares with r (its next
             * token or its MTP KV would copy it), which evicting un-shares */
            if (e->pc && qd_prefix_cache_evict_one(e->pc)) continue;
            int fit = tokens_fitting(e, r, chunk, avail_blocks(e));
            if (invariant(e)) fit = invariant_end(r, c, c + fit) - c;
            if (fit >= 1 && !spec_decode) { /* a speculating decode is one token already: its MTP blocks are the shortfall */
                chunk = fit;
                continue;
            }
            qd_request *victim = e->running[e->n_running - 1];
            preempt(e, victim);
            if (victim == r) {
                self_preempted = 1;
                break;
            }
        }
        if (self_preempted) break; /* r was the newest: nothing after it is running */
        add_span(e, &n_spans, r, chunk, n_draft);
        *budget -= r->step_chunk;
        if (prefill) *prompt_budget -= r->step_chunk;
    }
    return n_spans;
}

/* Admission from the front of the queue, in order (no overtaking, so a long prompt
 * is not starved by short ones): a request needs a free slot and blocks for its first
 * chunk, beyond one block held back for each running request, so that admitting it
 * does not immediately force a preemption of a running decode. */
static int schedule_admissions(qd_engine *e, int n_spans, int *budget, int *prompt_budget) {
    while (min_i(*budget, *prompt_budget) > 0 && e->waiting.head && e->n_free_slots > 0) {
        qd_request *r = e->waiting.head;
        qd_prefix_hit hit = {0};
        int start, chunk;
        const int plp = qd_req_wants_prompt_rows(r);
        if (plp) {
            qd_err err = {0};
            if (qd_engine_reserve_prompt_rows(e, &err) != QD_OK) {
                snprintf(e->errbuf, sizeof e->errbuf, "request %llu: %s", (unsigned long long)r->id, err.msg);
                qd_engine_finish(e, r, QD_FINISH_ERROR, NULL, e->errbuf);
                continue;
            }
            if (e->step_plp_left == 0) return n_spans;
        }
        for (;;) {
            /* at most n_tokens - 1 from the cache: the last known token is always
             * computed, which gives the logits for the next one */
            /* (batch-invariant: only prompt boundaries are cached; at most n_prompt - 2) */
            const int most = invariant(e) ? min_i(r->n_tokens - 1, r->n_prompt - 2) : r->n_tokens - 1;
            if (e->pc && most >= 1 && !plp) qd_prefix_cache_lookup(e->pc, PREFIX_KEY_BASE, r->tokens, most, &hit);
            start = hit.n_tokens;
            chunk = min_i(r->n_tokens - start, min_i(*budget, *prompt_budget));
            if (plp) chunk = min_i(chunk, e->step_plp_left);
            if (invariant(e) && (chunk = invariant_end(r, start, start + chunk) - start) == 0) return n_spans;
            if (qd_kv_total_blocks(e->ctx) == 0) break;
            const int bs = e->ctx->kv.block_size, part = start % bs;
            const int free_b = avail_blocks(e) - e->n_running;
            /* blocks taken: the new ones past the hit plus a copy of a shared partial block */
            const int need = qd_kv_blocks_for(e->ctx, start + chunk) - qd_kv_blocks_for(e->ctx, start) + (part != 0);
            if (need <= free_b) break;
            /* evict only when that can make room (else the request just waits and the
             * cache stays); evicting may drop the hit itself: look it up again */
            if (e->pc && free_b + qd_prefix_cache_reclaimable_blocks(e->pc) >= need && qd_prefix_cache_evict_one(e->pc))
                continue;
            int fit = free_b < 1 ? 0 : part ? (bs - part) + (free_b - 1) * bs : free_b * bs;
            /* a lone request may take the whole pool (submit checked that it fits) */
            if (e->n_running > 0 || fit < 1) return n_spans;
            chunk = min_i(chunk, fit);
            if (invariant(e) && (chunk = invariant_end(r, start, start + chunk) - start) == 0) return n_spans;
            break;
        }
        qd_req_list_remove(&e->waiting, r);
        qd_engine_queued_add(e, -1); /* before its first token can be reported */
        r->slot = e->free_slots[--e->n_free_slots];
        r->n_computed = 0;
        r->snap_branch = 0;
        r->phase = QD_SEQ_PREFILLING;
        e->running[e->n_running++] = r;
        if (!r->admitted_once) {
            r->admitted_once = 1;
            e->prompt_total += (uint64_t)r->n_prompt;
        }
        if (e->pc) {
            if (start > 0 && qd_prefix_cache_restore(e->pc, &hit, r->slot) != QD_OK) {
                snprintf(e->errbuf, sizeof e->errbuf, "request %llu: restoring a cached prefix failed: %s",
                         (unsigned long long)r->id, qd_context_errmsg(e->ctx));
                qd_engine_finish(e, r, QD_FINISH_ERROR, NULL, e->errbuf);
                continue;
            }
            r->n_computed = start;
            if (e->spec_k) qd_spec_admitted(e, r, start);
            /* the cached path goes on past the last snapshot: snapshot where this prompt
             * leaves it, so the next prompt sharing that much hits there */
            if (hit.n_matched > start) r->snap_branch = hit.n_matched;
            qd_prefix_cache_count_query(e->pc, r->n_tokens, start);
        }
        if (e->spec_k && !e->pc) qd_spec_admitted(e, r, 0);
        add_span(e, &n_spans, r, chunk, 0);
        *budget -= r->step_chunk;
        *prompt_budget -= r->step_chunk;
    }
    return n_spans;
}

/* The prompt tokens this step may take: all of the token budget, or with max_step_ms
 * and decodes to run, what the cost model says keeps the forward within it (at least
 * QD_STEP_MIN_PROMPT, so prompts always advance). */
static int step_prompt_budget(const qd_engine *e, int budget) {
    if (!(e->params.max_step_ms > 0)) return budget;
    int decode_rows = 0;
    for (int i = 0; i < e->n_running; i++)
        if (e->running[i]->phase == QD_SEQ_DECODING)
            decode_rows += 1 + (qd_spec_drafting(e, e->running[i]) ? e->spec_k : 0);
    const int p = decode_rows > 0 ? qd_step_cost_prefill_budget(&e->cost, decode_rows, e->params.max_step_ms) : -1;
    return p < 0 ? budget : min_i(budget, p > QD_STEP_MIN_PROMPT ? p : QD_STEP_MIN_PROMPT);
}

static int engine_step(qd_engine *e) {
    qd_spec_decide_step(e);
    int budget = e->params.max_batch_tokens, pbudget = step_prompt_budget(e, budget);
    if (pbudget < budget) e->bounded_steps++;
    e->step_reserved = 0;
    e->step_prompt = e->step_decode = 0;
    e->step_plp_left = QD_PROMPT_LP_ROWS;
    const double ts = qd_clock_seconds();
    int n_spans = schedule_running(e, &budget, &pbudget);
    n_spans = schedule_admissions(e, n_spans, &budget, &pbudget);
    e->schedule_s += qd_clock_seconds() - ts;
    if (n_spans == 0) {
        /* only reachable if the queue head can never fit; fail it rather than spin */
        if (e->n_running == 0 && e->waiting.head) {
            snprintf(e->errbuf, sizeof e->errbuf, "request %llu cannot be scheduled: %d KV blocks free",
                     (unsigned long long)e->waiting.head->id, qd_kv_free_blocks(e->ctx));
            qd_engine_finish(e, e->waiting.head, QD_FINISH_ERROR, NULL, e->errbuf);
            return 1;
        }
        return 0;
    }
    e->steps++;
    int drafting = 0; /* counted now: a request may be gone once its tokens are reported */
    for (int i = 0; i < n_spans; i++) drafting += e->span_req[i]->n_draft > 0;
    const double t0 = qd_clock_seconds();
    qd_status st = e->spec_k ? qd_spec_draft(e, n_spans) : QD_OK;
    const double t1 = qd_clock_seconds();
    if (st == QD_OK) st = qd_engine_step_forward(e, n_spans);
    const double t2 = qd_clock_seconds();
    /* the MTP over the prompt rows, before any snapshot of them is taken below */
    if (st == QD_OK && e->spec_k) st = qd_spec_catch_up(e, n_spans);
    const double mtp = (t1 - t0) + (qd_clock_seconds() - t2);
    e->forward_s += t2 - t1;
    e->mtp_s += mtp;
    if (e->step_prompt == 0) {
        e->decode_steps++;
        e->decode_forward_s += t2 - t1;
        e->decode_mtp_s += mtp;
    }
    /* a step with prompt logprob rows also computes (and on a GPU copies out) a whole logits row per
     * token: not what the model predicts for ordinary prompt tokens */
    if (st == QD_OK && e->step_plp_left == QD_PROMPT_LP_ROWS)
        qd_step_cost_add(&e->cost, e->step_prompt, e->step_decode, 1e3 * (t2 - t1));
    if (st != QD_OK) {
        snprintf(e->errbuf, sizeof e->errbuf, "forward pass failed (%s): %s", qd_status_name(st),
                 qd_context_errmsg(e->ctx));
        for (int i = 0; i < n_spans; i++) qd_engine_finish(e, e->span_req[i], QD_FINISH_ERROR, NULL, e->errbuf);
        return 1;
    }
    const double tr = qd_clock_seconds();
    qd_engine_prepare_rows(e, n_spans);
    /* advance first, then report: a callback may cancel any request, but cancellation
     * only takes effect at the next boundary, so the span list stays valid here */
    int row = 0, prep = 0;
    for (int i = 0; i < n_spans; i++) {
        qd_request *r = e->span_req[i];
        if (r->n_draft > 0) { /* advances r itself, by the tokens it keeps */
            qd_spec_accept_and_report(e, r, row);
            row += e->spans[i].n_tokens;
            continue;
        }
        const int rows = qd_span_rows(&e->spans[i]);
        const int last_row = row + rows - 1;
        row += rows;
        if (e->spans[i].logits == QD_LOGITS_ALL && !qd_engine_report_prompt(e, r, i, &prep)) continue;
        r->n_computed += r->step_chunk;
        /* a cut chunk ended on a snapshot target (see add_span) */
        if (e->pc && r->phase == QD_SEQ_PREFILLING && r->n_computed < r->n_prompt && at_snapshot_target(e, r))
            take_snapshot(e, r);
        if (r->n_computed < r->n_tokens) continue;
        if (!qd_req_samples(r)) { /* prompt logprobs only: done once the prompt is in */
            qd_engine_finish(e, r, QD_FINISH_LENGTH, NULL, NULL);
            continue;
        }
        while (prep < e->n_prep && e->prep[prep].span < i) prep++; /* of spans that ended early */
        const qd_row_prep *pp = prep < e->n_prep && e->prep[prep].span == i ? &e->prep[prep++] : NULL;
        qd_engine_sample_and_report(e, r, last_row, pp);
    }
    qd_spec_observe_step(e, drafting, 1e3 * (t1 - t0));
    e->report_s += qd_clock_seconds() - tr;
    return 1;
}

int qd_engine_step(qd_engine *e) {
    e->step_t0 = qd_clock_seconds();
    const int r = engine_step(e);
    e->step_s += qd_clock_seconds() - e->step_t0;
    e->step_t0 = 0;
    return r;
}
