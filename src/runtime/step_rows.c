/* The step's rows: the forward over the step's spans (each logit row as its argmax, or
 * whole where the sampler or a prompt logprob needs it), the host's work on the rows
 * (edits, grammar masks, samplers, prompt logprobs) on the row pool, and the events that
 * report them. Engine thread only; scheduler.c builds the spans and runs the step. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "runtime/engine_internal.h"
#include "runtime/grammar/constraint.h"

/* After a sampled token: the finish reason it causes, if any. */
qd_finish_reason qd_engine_finish_after(const qd_engine *e, const qd_request *r, int32_t tok) {
    const int generated = r->n_tokens - r->n_prompt; /* tok included */
    if (generated > r->params.min_tokens) {
        if (!r->params.ignore_eos)
            for (int i = 0; i < e->n_eos; i++)
                if (tok == e->eos[i]) return QD_FINISH_EOS;
        for (int i = 0; i < r->params.n_stop_token_ids; i++)
            if (tok == r->params.stop_token_ids[i]) return QD_FINISH_EOS;
    }
    if (r->n_tokens - r->n_prompt >= r->params.max_tokens || r->n_tokens >= e->params.max_model_len)
        return QD_FINISH_LENGTH;
    return QD_FINISH_NONE;
}

/* min_tokens not reached yet: the EOS ids (unless ignore_eos makes them ordinary
 * tokens, as in vLLM) and the stop token ids are masked out of the next token's row. */
static int masks_eos(const qd_request *r) { return !r->params.ignore_eos; }

static int needs_eos_mask(const qd_engine *e, const qd_request *r) {
    return r->n_tokens - r->n_prompt < r->params.min_tokens &&
           ((masks_eos(r) && e->n_eos > 0) || r->params.n_stop_token_ids > 0);
}

/* The request's own edits of its logits row before the sampler: logit_bias, then the
 * min_tokens mask (which wins: a bias cannot bring EOS back early). */
void qd_engine_edit_row(const qd_engine *e, const qd_request *r, float *row) {
    for (int i = 0; i < r->params.n_logit_bias; i++) row[r->params.logit_bias[i].id] += r->params.logit_bias[i].bias;
    if (!needs_eos_mask(e, r)) return;
    if (masks_eos(r))
        for (int i = 0; i < e->n_eos; i++) row[e->eos[i]] = -INFINITY;
    for (int i = 0; i < r->params.n_stop_token_ids; i++) row[r->params.stop_token_ids[i]] = -INFINITY;
}

/* Greedy with no penalty and no alternatives to report: the sampler would pick the
 * row's argmax and report its raw log-softmax, both of which the forward computes. */
static int greedy_params(const qd_sampling_params *p) {
    return p->temperature < QD_SAMPLER_GREEDY_EPS && p->repetition_penalty == 1.0f && p->presence_penalty == 0.0f &&
           p->frequency_penalty == 0.0f && p->n_logprobs == 0;
}

/* A request whose next token is the argmax of its raw logits over its vocabulary
 * bound: greedy_params, and no edit or mask of the row first. */
static int greedy_only(const qd_engine *e, const qd_request *r) {
    if (r->params.constraint || r->params.n_logit_bias > 0 || needs_eos_mask(e, r)) return 0; /* the row is edited or masked first */
    return greedy_params(qd_sampler_params(r->sampler));
}

/* A constrained request whose next token is the argmax of its logits under its
 * grammar's mask, which the forward takes where the logits are (the mask depends only
 * on the tokens kept so far, so it is filled before the forward): greedy_params, no
 * other edit of the row, one logit row (never a verify span), and no sequences waiting
 * to fork from it (they sample that row with their own samplers). */
static int greedy_masked(const qd_engine *e, const qd_request *r, const qd_span *s) {
    if (!r->params.constraint || r->params.n_logit_bias > 0 || needs_eos_mask(e, r)) return 0;
    if (r->n_draft > 0 || s->logits != QD_LOGITS_LAST || r->fork_head) return 0;
    return greedy_params(qd_sampler_params(r->sampler));
}

/* Tokens r may still generate, this one included: the budget its grammar plans with. */
static int remaining_tokens(const qd_request *r) { return r->params.max_tokens - (r->n_tokens - r->n_prompt); }

static void fill_masks_fn(void *user, int64_t begin, int64_t end, int worker) {
    (void)worker;
    qd_engine *e = user;
    for (int64_t k = begin; k < end; k++) {
        const qd_row_mask *m = &e->masks[k];
        const qd_request *r = e->span_req[m->span];
        qd_err err = {0};
        /* a mask that cannot be made here (out of memory) sends the row the host path,
         * whose mask fails the same way and ends the request with the reason */
        if (qd_constraint_fill_allow(r->params.constraint, remaining_tokens(r), e->vocab,
                                     e->allow + (size_t)k * e->allow_words, &err) == QD_OK)
            e->allow_row[m->row] = (int32_t)k;
        else e->full[m->row] = 1;
    }
}

/* The masks of the step's greedy_masked rows, at once on the row pool (a mask is a
 * cached copy or a walk of the token trie: 0.01-1 ms). */
static void fill_masks(qd_engine *e) {
    if (e->n_masks > 1) qd_parallel_for(e->row_pool, e->n_masks, 1, fill_masks_fn, e);
    else if (e->n_masks == 1) fill_masks_fn(e, 0, 1, 0);
    for (int k = 0; k < e->n_masks; k++) e->masked_rows += e->allow_row[e->masks[k].row] >= 0;
}

/* The step's forward, one call for every mix of requests: each logit row comes back
 * as its argmax and log-softmax (under its grammar's mask for a greedy_masked row), and
 * the rows of requests that need the sampler (e->full) also as whole logits rows. On a
 * GPU only those rows leave the device, so greedy traffic, constrained or not, costs no
 * vocabulary-wide copy or CPU pass per token. The argmax bound is the first greedy
 * row's vocab_limit; a greedy request with another bound (the server gives all of them
 * the tokenizer's) is sampled from its row instead, with the same result. */
qd_status qd_engine_step_forward(qd_engine *e, int n_spans) {
    int limit = 0, row = 0, any_hid = 0, any_spec = 0;
    e->n_masks = 0;
    for (int i = 0; i < n_spans; i++) {
        const qd_request *r = e->span_req[i];
        if (e->spec_k) {
            any_hid |= e->hid_all[i];
            any_spec |= r->spec;
        }
        const int rows = qd_span_rows(&e->spans[i]);
        if (rows == 0) continue;
        const int l = qd_sampler_params(r->sampler)->vocab_limit;
        const int bound = l > 0 ? l : e->vocab;
        const int masked = greedy_masked(e, r, &e->spans[i]);
        int full = !masked && !greedy_only(e, r);
        if (!full && limit == 0) limit = bound;
        else if (!full && bound != limit) full = 1;
        /* a verify span has a logit row per token; greedy_only holds for all of them
         * (min_tokens can only stop masking later in the span, never start). A prompt
         * span's rows that report positions are wanted whole, its last row (when the
         * span ends the prompt and the request samples) as any sampled row. */
        const int prompt_span = r->n_draft == 0 && e->spans[i].logits == QD_LOGITS_ALL;
        const int sampled_last = !prompt_span || (r->n_computed + rows >= r->n_tokens && qd_req_samples(r));
        for (int t = 0; t < rows; t++) {
            const int sampled = !prompt_span || (t == rows - 1 && sampled_last);
            e->allow_row[row] = -1;
            e->full[row++] = (uint8_t)(sampled ? full : qd_req_is_prompt_row(r, r->n_computed + t));
        }
        if (masked && !full) e->masks[e->n_masks++] = (qd_row_mask){.span = i, .row = row - 1};
    }
    fill_masks(e);
    const qd_forward_args a = {
        .spans = e->spans,
        .n_spans = n_spans,
        .verify = e->verify,
        .vocab_limit = limit,
        .full = e->full,
        .logits = e->logits,
        .ids = e->greedy_ids,
        .logprobs = e->greedy_lps,
        .hidden = any_spec ? e->hidden : NULL,
        .hidden_all = any_hid ? e->hid_all : NULL,
        .all_hidden = any_hid ? e->all_hidden : NULL,
        .allow = e->allow,
        .n_allow = e->n_masks,
        .allow_row = e->n_masks > 0 ? e->allow_row : NULL,
    };
    return qd_forward_ex(e->ctx, &a);
}

/* Appends r's sampled token, reports it and finishes r if the token ends it. */
static void report_token(qd_engine *e, qd_request *r, const qd_sample_result *res) {
    qd_err err = {0};
    if (qd_sampler_accept(r->sampler, res->token, &err) != QD_OK) {
        snprintf(e->errbuf, sizeof e->errbuf, "request %llu: sampling failed: %s", (unsigned long long)r->id, err.msg);
        qd_engine_finish(e, r, QD_FINISH_ERROR, NULL, e->errbuf);
        return;
    }
    r->tokens[r->n_tokens++] = res->token;
    e->generated_total++;
    qd_finish_reason why = qd_engine_finish_after(e, r, res->token);
    if (why != QD_FINISH_NONE) {
        qd_engine_finish(e, r, why, res, NULL);
        return;
    }
    r->phase = QD_SEQ_DECODING;
    qd_engine_event ev = {
        .request_id = r->id,
        .has_token = 1,
        .sample = *res,
        .finish = QD_FINISH_NONE,
        .prompt_tokens = r->n_prompt,
        .completion_tokens = r->n_tokens - r->n_prompt,
    };
    qd_engine_emit(e, r, &ev);
}

/* r has its prompt's logits: each sequence waiting to fork from it takes a free slot,
 * becomes a copy of r's sequence (GDN state copied, KV blocks shared) and is running,
 * with nothing to prefill. Those that find no slot are queued as ordinary requests;
 * one cancelled meanwhile ends here. Returns the forked ones, in submission order. */
static int fork_waiting(qd_engine *e, qd_request *r, qd_request **forked) {
    int n = 0;
    qd_request *rest = NULL, **tail = &rest;
    while (r->fork_head) {
        qd_request *c = r->fork_head;
        r->fork_head = c->fork_next;
        c->fork_next = NULL;
        if (c->cancel_seen) {
            qd_engine_finish(e, c, QD_FINISH_CANCELLED, NULL, NULL);
            continue;
        }
        if (e->n_free_slots > 0) {
            c->slot = e->free_slots[--e->n_free_slots];
            if (qd_seq_fork(e->ctx, r->slot, c->slot) == QD_OK) {
                c->n_computed = r->n_computed;
                c->plp_next = c->n_prompt; /* r reported the prompt's positions: they are the same */
                c->phase = QD_SEQ_DECODING;
                c->admitted_once = 1;
                e->prompt_total += (uint64_t)c->n_prompt; /* counted, never computed: prefill_total is r's alone */
                e->running[e->n_running++] = c;
                qd_engine_queued_add(e, -1);
                forked[n++] = c;
                continue;
            }
            qd_seq_reset(e->ctx, c->slot);
            e->free_slots[e->n_free_slots++] = c->slot;
            c->slot = -1;
        }
        *tail = c;
        tail = &c->fork_next;
    }
    r->fork_head = rest;
    qd_engine_release_forks(e, r);
    /* the list was built newest first: report in submission order */
    for (int i = 0; i < n / 2; i++) {
        qd_request *t = forked[i];
        forked[i] = forked[n - 1 - i];
        forked[n - 1 - i] = t;
    }
    return n;
}

/* The host's work on r's logits row before its token is kept: its edits (logit_bias,
 * min_tokens), a constrained request's mask (when it has its row: not greedy_masked),
 * then the sampler on what is left. Touches only r's constraint, r's sampler and the row. */
static qd_status sample_row(qd_engine *e, qd_request *r, int row, qd_sample_result *res, qd_err *err) {
    float *lr = e->logits + (size_t)row * e->vocab;
    qd_constraint *con = r->params.constraint;
    qd_engine_edit_row(e, r, lr);
    qd_status st = con ? qd_constraint_mask_logits(con, lr, e->vocab, remaining_tokens(r), err) : QD_OK;
    if (st == QD_OK) st = qd_sampler_sample(r->sampler, lr, res, err);
    return st;
}

static void prepare_rows_fn(void *user, int64_t begin, int64_t end, int worker) {
    (void)worker;
    qd_engine *e = user;
    for (int64_t i = begin; i < end; i++) {
        qd_row_prep *p = &e->prep[i];
        qd_request *r = e->span_req[p->span];
        qd_err_clear(&p->err);
        p->res = (qd_sample_result){0};
        if (p->pos > 0) /* the raw row's report of the prompt's own token */
            p->st = qd_sampler_report(r->sampler, e->logits + (size_t)p->row * e->vocab, r->tokens[p->pos], &p->res,
                                      &p->err);
        else p->st = sample_row(e, r, p->row, &p->res, &p->err);
    }
}

/* Every row of the step that goes through sample_row (a sampled row wanted in full;
 * verify spans decide on their own) or reports a prompt position, prepared at once on
 * the row pool; a span's prompt rows come before its sampled row. */
void qd_engine_prepare_rows(qd_engine *e, int n_spans) {
    e->n_prep = 0;
    int row = 0;
    for (int i = 0; i < n_spans; i++) {
        const qd_request *r = e->span_req[i];
        const int rows = qd_span_rows(&e->spans[i]);
        if (r->n_draft > 0 || rows == 0) {
            row += rows;
            continue;
        }
        for (int t = 0; t < rows - 1; t++, row++)
            if (e->full[row]) e->prep[e->n_prep++] = (qd_row_prep){.span = i, .row = row, .pos = r->n_computed + t + 1};
        /* the last row: a sampled one, or one more prompt position */
        const int p = r->n_computed + rows - 1;
        const int pos = e->spans[i].logits == QD_LOGITS_ALL && qd_req_is_prompt_row(r, p) ? p + 1 : 0;
        if (e->full[row]) e->prep[e->n_prep++] = (qd_row_prep){.span = i, .row = row, .pos = pos};
        row++;
    }
    /* one row costs 0.05-1 ms (a 248k-entry row's mask and sampler pass): worth a thread each */
    if (e->n_prep > 1) qd_parallel_for(e->row_pool, e->n_prep, 1, prepare_rows_fn, e);
    else if (e->n_prep == 1) prepare_rows_fn(e, 0, 1, 0);
}

/* The next token of r from logit row `row` (prepared by qd_engine_prepare_rows when it goes
 * through the sampler, else the forward's argmax), appended and reported; the same for
 * the sequences forked from r at its first token, from the same row (their parameters
 * are r's but the seed, so the row's edits are the same). */
void qd_engine_sample_and_report(qd_engine *e, qd_request *r, int row, const qd_row_prep *prep) {
    /* a speculating request's pending MTP pair: this row's hidden state and the token */
    const float *spec_h = r->spec ? e->hidden + (size_t)row * e->hidden_size : NULL;
    qd_err err = {0};
    qd_request *forked[QD_MAX_FORKS];
    const int n_forked = r->fork_head ? fork_waiting(e, r, forked) : 0;
    qd_sample_result res = {.token = e->greedy_ids[row], .logprob = e->greedy_lps[row]};
    qd_status st;
    float *lr = e->logits + (size_t)row * e->vocab;
    qd_constraint *con = r->params.constraint;
    if (e->full[row] && prep) {
        st = prep->st;
        res = prep->res;
        if (st != QD_OK) err = prep->err;
    } else if (e->full[row]) {
        st = sample_row(e, r, row, &res, &err);
    }
    /* NaN, +inf or all -inf in the row: the sampler refuses those, so does this path */
    else if (isnan(res.logprob))
        st = qd_seterr(&err, QD_ERR_INVALID_ARG, "the logits row is not finite (argmax %d)", res.token);
    /* a greedy_masked row whose grammar allows no id with a logit above -inf */
    else if (res.token < 0)
        st = qd_seterr(&err, QD_ERR_INVALID_ARG, "the grammar allows no token with a finite logit");
    else st = QD_OK;
    if (st == QD_OK && con) st = qd_constraint_accept(con, res.token, &err);
    for (int i = 0; i < n_forked && st == QD_OK; i++) {
        qd_sample_result fr = res;
        qd_err ferr = {0};
        if (e->full[row] && qd_sampler_sample(forked[i]->sampler, lr, &fr, &ferr) != QD_OK) {
            snprintf(e->errbuf, sizeof e->errbuf, "request %llu: sampling failed: %s", (unsigned long long)forked[i]->id,
                     ferr.msg);
            qd_engine_finish(e, forked[i], QD_FINISH_ERROR, NULL, e->errbuf);
            continue;
        }
        /* the row was masked by r's grammar in the state every fork shares before its
         * first token; each fork's own copy then advances by the token it kept */
        qd_constraint *fc = forked[i]->params.constraint;
        if (fc && qd_constraint_accept(fc, fr.token, &ferr) != QD_OK) {
            snprintf(e->errbuf, sizeof e->errbuf, "request %llu: constraint: %s", (unsigned long long)forked[i]->id,
                     ferr.msg);
            qd_engine_finish(e, forked[i], QD_FINISH_ERROR, NULL, e->errbuf);
            continue;
        }
        if (spec_h && forked[i]->spec) qd_spec_set_pending(e, forked[i], spec_h, fr.token);
        report_token(e, forked[i], &fr);
    }
    if (st != QD_OK) {
        snprintf(e->errbuf, sizeof e->errbuf, "request %llu: sampling failed: %s", (unsigned long long)r->id, err.msg);
        for (int i = 0; i < n_forked; i++) qd_engine_finish(e, forked[i], QD_FINISH_ERROR, NULL, e->errbuf);
        qd_engine_finish(e, r, QD_FINISH_ERROR, NULL, e->errbuf);
        return;
    }
    if (spec_h) qd_spec_set_pending(e, r, spec_h, res.token);
    report_token(e, r, &res);
}

/* The prompt positions of span i's rows (prepared from *prep on, which moves past them)
 * in one event, before anything else of the span. Returns 0 when r ended instead: a
 * row's report failed (a non-finite row), or there was no memory for the event. */
int qd_engine_report_prompt(qd_engine *e, qd_request *r, int i, int *prep) {
    int n = 0, at = 0;
    qd_status st = QD_OK;
    const char *why = NULL;
    while (*prep < e->n_prep && e->prep[*prep].span < i) (*prep)++; /* of spans that ended early */
    for (; *prep < e->n_prep && e->prep[*prep].span == i && e->prep[*prep].pos > 0; (*prep)++) {
        const qd_row_prep *p = &e->prep[*prep];
        if (n == 0) at = p->pos;
        if (st == QD_OK && (st = p->st) != QD_OK) why = p->err.msg;
        e->plp_res[n++] = p->res;
    }
    if (n == 0) return 1;
    const qd_engine_event ev = {
        .request_id = r->id,
        .prompt_tokens = r->n_prompt,
        .prompt_lp = e->plp_res,
        .prompt_lp_at = at,
        .n_prompt_lp = n,
    };
    if (st == QD_OK && qd_engine_emit(e, r, &ev) != QD_OK) {
        st = QD_ERR_OOM;
        why = "out of memory for the event";
    }
    if (st != QD_OK) {
        snprintf(e->errbuf, sizeof e->errbuf, "request %llu: prompt logprobs at position %d: %s",
                 (unsigned long long)r->id, at, why);
        qd_engine_finish(e, r, QD_FINISH_ERROR, NULL, e->errbuf);
        return 0;
    }
    r->plp_next = at + n;
    return 1;
}

