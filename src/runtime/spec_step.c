/* The engine's speculative decoding (engine_internal.h, "speculative decoding"): each
 * decode step of a speculating request is a verify span of K + 1 tokens (its last
 * sampled token and K drafts of the checkpoint's MTP head) inside the step's one ragged
 * forward, beside prefill chunks and other requests' decodes.
 *
 * One step, for the speculating decodes of the batch:
 *   1. drafts (qd_spec_draft, before the forward): one MTP forward over every request's
 *      pending pairs (the kept positions of its last step: target hidden state at p,
 *      token p + 1), whose last row gives draft 0 and h'; then K - 1 MTP forwards of one
 *      row per request, h' fed back (spec 7.2);
 *   2. the main forward verifies [last token, drafts] with a logit row and a hidden state
 *      per token; prefill chunks of speculating requests also hand back every row's hidden
 *      state, and the MTP runs over their prompt pairs right after (qd_spec_catch_up);
 *   3. accept (qd_spec_accept_and_report): row by row, the request's own sampler decides
 *      the token at that row exactly as plain decoding would (logit_bias and min_tokens
 *      edits, penalties over the tokens kept so far, temperature, top-k/p, min-p). Greedy:
 *      the row's token is kept and the next row considered while it equals the draft.
 *      Sampled: the draft d (the MTP's argmax, so the draft distribution q is 1 at d) is
 *      kept with probability p(d), else the token is drawn from p without d
 *      (spec_accept.h), p being the distribution the sampler would draw from at that row;
 *      the last row, reached when every draft was kept, is an ordinary sample. So each
 *      output token is distributed as plain sampling gives it;
 *   4. EOS, stop token ids and max_tokens cut the kept run there; the sequence keeps the
 *      tokens fed up to the last emitted one (qd_seq_accept rolls the GDN state and the
 *      KV back), the MTP KV drops the draft positions (qd_mtp_truncate), and the kept
 *      positions' pairs become the pending ones. The tokens are reported one by one; a
 *      callback asking to stop (a stop string) ends the request at that token.
 *
 * Grammar-constrained requests do not speculate (r->spec = 0): their mask would have to
 * advance over each draft and back again on rejection; they take plain decode spans. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/engine_internal.h"

static int min_i(int a, int b) { return a < b ? a : b; }

qd_status qd_spec_engine_init(qd_engine *e, qd_err *err) {
    const int K = e->params.speculative_tokens;
    e->spec_k = K;
    if (!K) return QD_OK;
    const size_t n = (size_t)e->params.max_num_seqs, H = (size_t)qd_model_hidden_size(e->model);
    const size_t V = (size_t)e->vocab, rows = n * (size_t)(K + 1);
    e->hidden_size = (int)H;
    e->verify = calloc(n, 1);
    e->hid_all = calloc(n, 1);
    e->hidden = malloc(sizeof(float) * rows * H);
    e->all_hidden = malloc(sizeof(float) * (size_t)e->params.max_batch_tokens * H);
    e->mtp_spans = calloc(n, sizeof *e->mtp_spans);
    e->mtp_req = calloc(n, sizeof *e->mtp_req);
    /* a step that drafts after plain ones runs every sequence's held pairs (up to
     * QD_SPEC_PEND_MAX each) as one MTP forward where the step token budget allows, not
     * one forward per sequence */
    size_t held = n * QD_SPEC_PEND_MAX;
    if (held > (size_t)e->params.max_batch_tokens) held = (size_t)e->params.max_batch_tokens;
    if (held < QD_SPEC_PEND_MAX) held = QD_SPEC_PEND_MAX;
    e->mtp_in_rows = (int)(rows > held ? rows : held);
    e->mtp_in = malloc(sizeof(float) * (size_t)e->mtp_in_rows * H);
    e->pend_pool = malloc(sizeof(float) * n * QD_SPEC_PEND_MAX * H);
    e->mtp_hout = malloc(sizeof(float) * rows * H);
    e->mtp_ids = malloc(sizeof(int32_t) * n);
    e->probs = malloc(sizeof(float) * V);
    e->resid = malloc(sizeof(double) * V);
    if (!e->verify || !e->hid_all || !e->hidden || !e->all_hidden || !e->mtp_spans || !e->mtp_req || !e->mtp_in ||
        !e->pend_pool || !e->mtp_hout || !e->mtp_ids || !e->probs || !e->resid)
        return qd_seterr(err, QD_ERR_OOM, "out of memory for the speculative decoding buffers (%d sequences, %d drafts)",
                         e->params.max_num_seqs, K);
    return QD_OK;
}

void qd_spec_engine_free(qd_engine *e) {
    free(e->verify);
    free(e->hid_all);
    free(e->hidden);
    free(e->all_hidden);
    free(e->mtp_spans);
    free(e->mtp_req);
    free(e->mtp_in);
    free(e->pend_pool);
    free(e->mtp_hout);
    free(e->mtp_ids);
    free(e->probs);
    free(e->resid);
}

void qd_spec_request_init(qd_engine *e, qd_request *r) {
    r->spec = e->spec_k > 0 && !r->params.constraint;
    /* the accept draws are the request's own: seeded runs repeat */
    if (r->spec) qd_spec_rng_seed(&r->spec_rng, r->params.sampling.seed ^ 0x9e3779b97f4a7c15ull);
}

void qd_spec_admitted(qd_engine *e, qd_request *r, int start) {
    r->n_pend = 0;
    if (!r->spec || r->slot < 0) return;
    /* The cached blocks hold the MTP KV of [0, start) too: a snapshot is taken only where
     * it was written (a prompt chunk's pairs run before its snapshot, a finished request's
     * pending pairs are flushed first). Two approximations cost draft quality, never
     * output: the pair at start - 1 was made with the snapshot owner's token at `start`,
     * and a request that did not speculate (a constrained one) wrote no MTP KV. */
    qd_mtp_adopt(e->ctx, r->slot, start); /* start is the slot's length: cannot fail */
}

int qd_spec_drafting(const qd_engine *e, const qd_request *r) {
    return qd_spec_decoding(r) && e->spec_draft_step && (!e->spec_probe || e->spec_probe == r);
}

int qd_spec_drafts_for(const qd_engine *e, const qd_request *r, int room) {
    if (!qd_spec_drafting(e, r)) return 0;
    int k = e->spec_k;
    /* a verify step yields up to k + 1 tokens: within max_tokens, and its k + 1 positions
     * within the context */
    k = min_i(k, r->params.max_tokens - (r->n_tokens - r->n_prompt) - 1);
    k = min_i(k, e->params.max_model_len - r->n_tokens);
    k = min_i(k, room - 1);
    return k < 0 ? 0 : k;
}

int qd_spec_extra_blocks(const qd_engine *e, const qd_request *r) {
    if (!r->spec || r->slot < 0 || r->n_pend == 0) return 0;
    /* the pending pairs' MTP KV lands in [n_computed - n_pend, n_computed), whose blocks
     * may be shared (a fork, a cached prefix); counted even when the main span's copy of
     * a shared partial block is the same block: an upper bound */
    return qd_kv_shared_in(e->ctx, r->slot, r->n_computed - r->n_pend, r->n_computed);
}

static int vocab_bound(const qd_engine *e, const qd_request *r) {
    const int l = qd_sampler_params(r->sampler)->vocab_limit;
    return l > 0 ? l : e->vocab;
}

/* Draft j of r this step: the MTP's argmax `id`, or the override's. */
static int32_t pick_draft(const qd_engine *e, const qd_request *r, int32_t id, int j) {
    if (e->draft_override) {
        const int32_t d = e->draft_override(e->draft_user, r->id, r->n_tokens - r->n_prompt, j);
        if (d >= 0 && d < e->vocab) return d;
    }
    return id;
}

/* The argmax bound of the drafts of e->mtp_req[s0, s1): their requests' vocabulary bound
 * when they share one, else the whole vocabulary (a draft only decides what is tried,
 * never what is output: one past a request's bound is rejected like any other), and
 * never past the engine's draft vocabulary (params.speculative_draft_vocab). */
static int draft_bound(const qd_engine *e, int s0, int s1) {
    int b = s1 > s0 ? vocab_bound(e, e->mtp_req[s0]) : e->vocab;
    for (int j = s0 + 1; j < s1; j++)
        if (vocab_bound(e, e->mtp_req[j]) != b) b = e->vocab;
    const int d = e->params.speculative_draft_vocab;
    return d > 0 && d < b ? d : b;
}

/* One MTP forward over spans [first, n) with hidden inputs `in` (their rows packed in span
 * order), cut into calls of at most max_batch_tokens rows. The logit rows' argmax goes to
 * e->mtp_ids from row lrow0 on (no vocabulary row leaves the device), their h' to
 * e->mtp_hout, in span order. */
static qd_status run_mtp_from(qd_engine *e, int first, int n, const float *in, int lrow0) {
    const int H = e->hidden_size, cap = e->params.max_batch_tokens, limit = draft_bound(e, first, n);
    int s0 = first, row0 = 0;
    while (s0 < n) {
        int s1 = s0, rows = 0, lrows = 0;
        while (s1 < n && (s1 == s0 || rows + e->mtp_spans[s1].n_tokens <= cap)) {
            rows += e->mtp_spans[s1].n_tokens;
            lrows += e->mtp_spans[s1].logits != QD_LOGITS_NONE;
            s1++;
        }
        e->spec_mtp_forwards++;
        QD_TRY(qd_mtp_forward_ids(e->ctx, e->mtp_spans + s0, s1 - s0, in + (size_t)row0 * H, limit,
                                  lrows ? e->mtp_ids + lrow0 : NULL, lrows ? e->mtp_hout + (size_t)lrow0 * H : NULL));
        s0 = s1;
        row0 += rows;
        lrow0 += lrows;
    }
    return QD_OK;
}

static qd_status run_mtp(qd_engine *e, int n, const float *in) { return run_mtp_from(e, 0, n, in, 0); }

qd_status qd_spec_draft(qd_engine *e, int n_spans) {
    const int H = e->hidden_size;
    int n = 0, rows = 0, first = 0, lrows = 0, lfirst = 0;
    /* phase 1: where the step runs the MTP at all (a request drafts, or a plain decode's
     * pairs would overflow with this step's), the pending pairs of every speculating
     * decode in that one forward, so that the requests' held pairs stay in step and a
     * step that does not draft runs no MTP forward until they fill again */
    int mtp_step = 0;
    for (int i = 0; i < n_spans; i++) {
        const qd_request *r = e->span_req[i];
        mtp_step |= qd_spec_decoding(r) && (r->n_draft || r->n_pend >= QD_SPEC_PEND_MAX - 1);
    }
    e->spec_pend_rows = 0;
    for (int i = 0; mtp_step && i < n_spans; i++) {
        qd_request *r = e->span_req[i];
        if (!qd_spec_decoding(r) || (!r->n_draft && r->n_pend == 0)) continue;
        if (r->n_pend == 0)
            return qd_seterr(&e->ctx->err, QD_ERR_INTERNAL, "request %llu: a verify span without a pending MTP pair",
                             (unsigned long long)r->id);
        if (qd_mtp_length(e->ctx, r->slot) + r->n_pend != r->n_computed)
            return qd_seterr(&e->ctx->err, QD_ERR_INTERNAL,
                             "request %llu: MTP KV of %d positions + %d pending pairs, but %d tokens computed",
                             (unsigned long long)r->id, qd_mtp_length(e->ctx, r->slot), r->n_pend, r->n_computed);
        /* the pairs held over plain steps can outgrow mtp_in: run what it holds first */
        if (rows + r->n_pend > e->mtp_in_rows) {
            QD_TRY(run_mtp_from(e, first, n, e->mtp_in, lfirst));
            e->spec_pend_rows += rows;
            first = n;
            lfirst = lrows;
            rows = 0;
        }
        e->mtp_spans[n] = (qd_span){r->slot, r->pend_t, r->n_pend, r->n_draft ? QD_LOGITS_LAST : QD_LOGITS_NONE};
        e->mtp_req[n++] = r;
        lrows += r->n_draft > 0;
        memcpy(e->mtp_in + (size_t)rows * H, qd_spec_pend_h(e, r), sizeof(float) * (size_t)r->n_pend * H);
        rows += r->n_pend;
        r->n_pend = 0;
    }
    e->spec_pend_rows += rows;
    if (n == 0) return QD_OK;
    if (n > first) QD_TRY(run_mtp_from(e, first, n, e->mtp_in, lfirst));
    int lr = 0, max_draft = 0;
    for (int j = 0; j < n; j++) {
        qd_request *r = e->mtp_req[j];
        if (!r->n_draft) continue;
        r->vtok[0] = r->tokens[r->n_computed];
        r->vtok[1] = pick_draft(e, r, e->mtp_ids[lr], 0);
        r->mtp_row = lr++;
        if (r->n_draft > max_draft) max_draft = r->n_draft;
    }
    /* phases 2..K: (h', the previous draft) gives the next draft */
    for (int d = 1; d < max_draft; d++) {
        int m = 0;
        for (int j = 0; j < n; j++) {
            qd_request *r = e->mtp_req[j];
            if (r->n_draft <= d) continue;
            memcpy(e->mtp_in + (size_t)m * H, e->mtp_hout + (size_t)r->mtp_row * H, sizeof(float) * (size_t)H);
            e->mtp_spans[m] = (qd_span){r->slot, &r->vtok[d], 1, QD_LOGITS_LAST};
            e->mtp_req[m++] = r; /* the list shrinks in place, order kept */
        }
        n = m;
        QD_TRY(run_mtp(e, n, e->mtp_in));
        for (int j = 0; j < n; j++) {
            qd_request *r = e->mtp_req[j];
            r->vtok[d + 1] = pick_draft(e, r, e->mtp_ids[j], d);
            r->mtp_row = j;
        }
    }
    for (int i = 0; i < n_spans; i++)
        if (e->span_req[i]->n_draft > 0) e->spans[i].tokens = e->span_req[i]->vtok;
    return QD_OK;
}

qd_status qd_spec_catch_up(qd_engine *e, int n_spans) {
    const int H = e->hidden_size;
    int off = 0, rows = 0, n = 0;
    for (int i = 0; i < n_spans; i++) {
        if (!e->hid_all[i]) continue;
        qd_request *r = e->span_req[i];
        const int c = r->n_computed, T = e->spans[i].n_tokens;
        /* pairs (h_p, token p + 1) whose next token is known: all but the last known
         * token's, which waits for the token sampled after it (qd_spec_set_pending) */
        const int np = min_i(c + T, r->n_tokens - 1) - c;
        if (np > 0 && qd_mtp_length(e->ctx, r->slot) == c) {
            /* the spans' rows packed for one MTP forward over all of them (np <= T: the
             * rows only move down) */
            float *ah = e->all_hidden;
            if (rows != off) memmove(ah + (size_t)rows * H, ah + (size_t)off * H, sizeof(float) * (size_t)np * H);
            e->mtp_spans[n++] = (qd_span){r->slot, r->tokens + c + 1, np, QD_LOGITS_NONE};
            rows += np;
        }
        off += T;
    }
    if (n == 0) return QD_OK;
    e->spec_mtp_forwards++;
    return qd_mtp_forward(e->ctx, e->mtp_spans, n, e->all_hidden, NULL, NULL);
}

void qd_spec_set_pending(qd_engine *e, qd_request *r, const float *hid, int32_t token) {
    /* room by the draft phase's rule (a plain decode's pairs run before they fill) */
    memcpy(qd_spec_pend_h(e, r) + (size_t)r->n_pend * (size_t)e->hidden_size, hid, sizeof(float) * (size_t)e->hidden_size);
    r->pend_t[r->n_pend++] = token;
}

int qd_spec_flush(qd_engine *e, qd_request *r) {
    if (r->slot < 0 || qd_mtp_length(e->ctx, r->slot) + r->n_pend != r->n_computed) return 0;
    e->mtp_spans[0] = (qd_span){r->slot, r->pend_t, r->n_pend, QD_LOGITS_NONE};
    e->spec_mtp_forwards++;
    if (qd_mtp_forward(e->ctx, e->mtp_spans, 1, qd_spec_pend_h(e, r), NULL, NULL) != QD_OK) return 0;
    r->n_pend = 0;
    return 1;
}

/* The token of verify row `rw` of r as plain decoding would pick it, given the tokens
 * kept before it (already accepted into r's sampler and tokens): draft is the MTP's
 * token at this row, or -1 at the last row. */
static qd_status row_token(qd_engine *e, qd_request *r, int rw, int32_t draft, qd_sample_result *o, qd_err *err) {
    if (!e->full[rw]) { /* greedy on the raw logits: the forward's argmax */
        *o = (qd_sample_result){.token = e->greedy_ids[rw], .logprob = e->greedy_lps[rw]};
        if (isnan(o->logprob))
            return qd_seterr(err, QD_ERR_INVALID_ARG, "the logits row is not finite (argmax %d)", o->token);
        return QD_OK;
    }
    float *lr = e->logits + (size_t)rw * e->vocab;
    qd_engine_edit_row(e, r, lr);
    if (draft < 0 || qd_sampler_params(r->sampler)->temperature < QD_SAMPLER_GREEDY_EPS)
        return qd_sampler_sample(r->sampler, lr, o, err);
    QD_TRY(qd_sampler_probs(r->sampler, lr, e->probs, err));
    int32_t t;
    qd_spec_accept_greedy_draft(e->probs, draft, e->vocab, &r->spec_rng, e->resid, &t);
    return qd_sampler_report(r->sampler, lr, t, o, err);
}

void qd_spec_accept_and_report(qd_engine *e, qd_request *r, int row) {
    const int k = r->n_draft, L = r->n_computed, H = e->hidden_size;
    qd_sample_result res[QD_SPEC_MAX + 1];
    qd_err err = {0};
    qd_status st = QD_OK;
    qd_finish_reason why = QD_FINISH_NONE;
    const int base = r->n_tokens; /* L + 1: the last sampled token is known, not yet reported again */
    int n_out = 0, accepted = 0;
    for (int i = 0; i <= k; i++) {
        const int32_t draft = i < k ? r->vtok[i + 1] : -1;
        if ((st = row_token(e, r, row + i, draft, &res[n_out], &err)) != QD_OK) break;
        const int32_t t = res[n_out].token;
        if ((st = qd_sampler_accept(r->sampler, t, &err)) != QD_OK) break;
        r->tokens[r->n_tokens++] = t; /* the next row's edits (min_tokens) see it */
        n_out++;
        const int kept = t == draft;
        if (kept) {
            accepted++;
            e->spec_accepted_at[i]++;
        }
        why = qd_engine_finish_after(e, r, t);
        if (why != QD_FINISH_NONE || !kept) break;
    }
    e->spec_steps++;
    e->spec_drafted += (uint64_t)k;
    e->spec_accepted += (uint64_t)accepted;
    /* the sequence keeps the last sampled token and the kept drafts before the last
     * emitted token; the MTP KV past L came from h', not the target's states */
    if (st == QD_OK && (st = qd_seq_accept(e->ctx, r->slot, n_out)) == QD_OK) st = qd_mtp_truncate(e->ctx, r->slot, L);
    if (st != QD_OK) {
        snprintf(e->errbuf, sizeof e->errbuf, "request %llu: speculative accept failed: %s", (unsigned long long)r->id,
                 err.msg[0] ? err.msg : qd_context_errmsg(e->ctx));
        qd_engine_finish(e, r, QD_FINISH_ERROR, NULL, e->errbuf);
        return;
    }
    r->n_computed = L + n_out;
    memcpy(qd_spec_pend_h(e, r), e->hidden + (size_t)row * H, sizeof(float) * (size_t)n_out * H);
    memcpy(r->pend_t, r->tokens + base, sizeof(int32_t) * (size_t)n_out);
    r->n_pend = n_out;
    /* reported one by one (a callback asking to stop ends the request at its token:
     * the reporter drops the rest) */
    r->n_tokens = base;
    for (int j = 0; j < n_out; j++) {
        r->n_tokens++;
        e->generated_total++;
        if (j == n_out - 1 && why != QD_FINISH_NONE) {
            qd_engine_finish(e, r, why, &res[j], NULL);
            return;
        }
        qd_engine_event ev = {
            .request_id = r->id,
            .has_token = 1,
            .sample = res[j],
            .finish = QD_FINISH_NONE,
            .prompt_tokens = r->n_prompt,
            .completion_tokens = r->n_tokens - r->n_prompt,
        };
        qd_engine_emit(e, r, &ev);
    }
}

/* Whether this step's speculating decodes draft (spec_policy.h): always in batch-invariant
 * mode (a request's tokens may not depend on what runs beside it, and a sampled one's
 * draws do depend on whether it drafts) and with speculative_always. */
void qd_spec_decide_step(qd_engine *e) {
    e->spec_draft_step = 1;
    e->spec_probe = NULL;
    if (!e->spec_k || e->params.batch_invariant || e->params.speculative_always) return;
    int requests = 0;
    for (int i = 0; i < e->n_running; i++) requests += qd_spec_decoding(e->running[i]);
    if (requests == 0) return;
    const qd_spec_choice d = qd_spec_policy_decide(&e->spec_policy, &e->cost, requests, e->spec_k);
    e->spec_draft_step = d != QD_SPEC_PLAIN;
    if (d == QD_SPEC_PLAIN) e->spec_plain_steps++;
    if (d != QD_SPEC_PROBE) return;
    /* the speculating decodes take the probes in turn */
    int pick = (int)(e->spec_probes++ % (uint64_t)requests);
    for (int i = 0; i < e->n_running; i++) {
        const qd_request *r = e->running[i];
        if (qd_spec_decoding(r) && pick-- == 0) {
            e->spec_probe = r;
            break;
        }
    }
}

/* The step's speculation outcome for the policy: the verify spans' drafts kept (from the
 * counters' growth in this step) and, when `drafting` requests drafted, what that cost. */
void qd_spec_observe_step(qd_engine *e, int drafting, double draft_ms) {
    if (!e->spec_k) return;
    int kept[QD_SPEC_MAX];
    for (int i = 0; i < QD_SPEC_MAX; i++) {
        kept[i] = (int)(e->spec_accepted_at[i] - e->spec_accepted_at_prev[i]);
        e->spec_accepted_at_prev[i] = e->spec_accepted_at[i];
    }
    /* a draft phase that also ran pairs held over plain steps costs more than drafting at
     * every step does: the cost of drafting is measured where it drafted the step before */
    const int steady = e->spec_pend_rows <= drafting * (e->spec_k + 1);
    qd_spec_policy_observe(&e->spec_policy, (int)(e->spec_steps - e->spec_steps_prev), kept, e->spec_k,
                           steady ? drafting : 0, draft_ms);
    e->spec_steps_prev = e->spec_steps;
}
