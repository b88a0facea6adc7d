/* Greedy speculative decoding with the MTP head (spec_decode.h).
 *
 * Invariant at the top of a step: the sequence holds L tokens, `next` (the target's
 * argmax after them) is not fed yet, hid = the target's final-normed hidden state at
 * L - 1, and the MTP KV is valid up to the positions whose pairs are queued in
 * (pend_h, pend_t): the kept positions of the last step, run together with the first
 * draft. */
#include "runtime/spec_decode.h"

#include <stdlib.h>
#include <string.h>

#include "runtime/spec_accept.h"

static int argmax(const float *x, int n) {
    int b = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return b;
}

qd_status qd_spec_generate_greedy(const qd_spec_greedy_args *a, int32_t *out, qd_spec_stats *stats) {
    if (!a || !a->model || !a->ctx || !a->prompt || a->n_prompt < 1 || a->n_new < 0 || !out || !stats || a->k < 1 ||
        a->k > 4)
        return QD_ERR_INVALID_ARG;
    const qd_model *m = a->model;
    qd_context *ctx = a->ctx;
    const int seq = a->seq, n_prompt = a->n_prompt, n_new = a->n_new, k = a->k;
    const int32_t *prompt = a->prompt, *forced = a->forced_drafts;
    memset(stats, 0, sizeof *stats);
    const int V = qd_model_vocab_size(m), H = qd_model_hidden_size(m);
    const size_t rows = (size_t)(n_prompt > k + 1 ? n_prompt : k + 1);
    float *hidden = malloc(sizeof(float) * rows * H);      /* [rows][H] target hidden states */
    float *logits = malloc(sizeof(float) * rows * V);      /* [rows][V] */
    float *pend_h = malloc(sizeof(float) * (k + 1) * (size_t)H); /* [k+1][H] MTP hidden inputs */
    float *hp = malloc(sizeof(float) * (size_t)H);          /* h' of the last draft step */
    qd_status st = QD_OK;
    if (!hidden || !logits || !pend_h || !hp) {
        st = QD_ERR_OOM;
        goto done;
    }
    /* prefill: every row's hidden state (the MTP's inputs), the last row's logits */
    qd_span pre = {.seq = seq, .tokens = prompt, .n_tokens = n_prompt, .logits = QD_LOGITS_ALL};
    const qd_forward_args pa = {.spans = &pre, .n_spans = 1, .logits = logits, .hidden = hidden};
    if ((st = qd_forward_ex(ctx, &pa)) != QD_OK) goto done;
    int32_t next = argmax(logits + (size_t)(n_prompt - 1) * V, V);
    int n_out = 0;
    out[n_out++] = next;
    /* queued MTP pairs: (h_p, token_{p+1}) for p in [0, n_prompt - 1), then (h_{L-1}, next) */
    int32_t pend_t[5]; /* [k + 1] */
    int n_pend = 0;
    {
        qd_span cat = {.seq = seq, .tokens = prompt + 1, .n_tokens = n_prompt - 1, .logits = QD_LOGITS_NONE};
        if (n_prompt > 1 && (st = qd_mtp_forward(ctx, &cat, 1, hidden, NULL, NULL)) != QD_OK) goto done;
        memcpy(pend_h, hidden + (size_t)(n_prompt - 1) * H, sizeof(float) * H);
        pend_t[n_pend++] = next;
    }
    while (n_out < n_new) {
        /* drafts: the queued pairs (the last of them yields draft 0), then h' fed back */
        int32_t span[5] = {next};
        qd_span ms = {.seq = seq, .tokens = pend_t, .n_tokens = n_pend, .logits = QD_LOGITS_LAST};
        if ((st = qd_mtp_forward(ctx, &ms, 1, pend_h, logits, hp)) != QD_OK) goto done;
        const int mtp_base = qd_mtp_length(ctx, seq) - 1; /* the position of (h_{L-1}, next) */
        span[1] = forced && n_out < n_new ? forced[n_out] : argmax(logits, V);
        for (int j = 1; j < k; j++) {
            qd_span d = {.seq = seq, .tokens = &span[j], .n_tokens = 1, .logits = QD_LOGITS_LAST};
            if ((st = qd_mtp_forward(ctx, &d, 1, hp, logits, hp)) != QD_OK) goto done;
            span[j + 1] = forced && n_out + j < n_new ? forced[n_out + j] : argmax(logits, V);
        }
        /* verify [next, d_0 .. d_{k-1}] */
        qd_span vs = {.seq = seq, .tokens = span, .n_tokens = k + 1, .logits = QD_LOGITS_ALL};
        const uint8_t verify = 1;
        const qd_forward_args va = {.spans = &vs, .n_spans = 1, .verify = &verify, .logits = logits, .hidden = hidden};
        if ((st = qd_forward_ex(ctx, &va)) != QD_OK) goto done;
        int32_t target[5], kept[5];
        for (int i = 0; i <= k; i++) target[i] = argmax(logits + (size_t)i * V, V);
        const int n_kept = qd_spec_accept_greedy(span + 1, k, target, kept); /* drafts kept + the bonus */
        stats->steps++;
        stats->drafted += k;
        stats->accepted += n_kept - 1;
        for (int i = 0; i < n_kept - 1; i++) stats->accepted_at[i]++;
        /* the sequence keeps next and the kept drafts; the bonus is the new `next` */
        if ((st = qd_seq_accept(ctx, seq, n_kept)) != QD_OK) goto done;
        /* MTP positions past (h_{L-1}, next) were computed from h', not the target's */
        if ((st = qd_mtp_truncate(ctx, seq, mtp_base + 1)) != QD_OK) goto done;
        for (int i = 0; i < n_kept && n_out < n_new; i++) out[n_out++] = kept[i];
        next = kept[n_kept - 1];
        /* queue the kept positions' pairs (h of verify row i, the token after it) */
        memcpy(pend_h, hidden, sizeof(float) * (size_t)n_kept * H);
        for (int i = 0; i < n_kept; i++) pend_t[i] = kept[i];
        n_pend = n_kept;
    }
done:
    free(hidden);
    free(logits);
    free(pend_h);
    free(hp);
    return st;
}
