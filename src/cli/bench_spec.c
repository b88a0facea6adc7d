/* qdelta bench --speculative-tokens K: decode tok/s through the serving engine with and
 * without speculative decoding, for B concurrent greedy requests, and the acceptance by
 * draft position. Both runs generate the same tokens (greedy), which is checked. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "cli/bench_spec.h"
#include "cli/common.h"
#include "runtime/engine.h"

typedef struct bench_req {
    pthread_mutex_t *mu;
    pthread_cond_t *cv;
    int *n_done;
    int32_t *out;     /* [max_tokens] */
    double *t_tok;    /* [max_tokens] when each token arrived */
    int n;
    double t_first;
    int failed;
} bench_req;

static int on_event(void *user, const qd_engine_event *ev) {
    bench_req *r = user;
    if (ev->has_token) {
        const double now = qd_clock_seconds();
        if (r->n == 0) r->t_first = now;
        r->t_tok[r->n] = now;
        r->out[r->n++] = ev->sample.token;
    }
    if (ev->finish != QD_FINISH_NONE) {
        pthread_mutex_lock(r->mu);
        r->failed = ev->finish != QD_FINISH_LENGTH && ev->finish != QD_FINISH_EOS;
        ++*r->n_done;
        pthread_cond_signal(r->cv);
        pthread_mutex_unlock(r->mu);
    }
    return 0;
}

int cli_bench_engine_run(qd_model *m, const cli_bench_spec *b, int k, const int32_t *prompts, int32_t *outs,
                         qd_constraint **cons, int *n_out, double *tok_s, double *tok_s_full, qd_engine_stats *st) {
    qd_engine_params ep = qd_engine_default_params();
    ep.max_num_seqs = b->batch;
    ep.max_model_len = b->context + b->n_decode + 1;
    ep.max_batch_tokens = b->context * b->batch < 4096 ? b->context * b->batch : 4096;
    if (ep.max_batch_tokens < b->batch * (k + 1)) ep.max_batch_tokens = b->batch * (k + 1);
    ep.speculative_tokens = k;
    ep.speculative_draft_vocab = k > 0 ? b->draft_vocab : 0;
    ep.speculative_always = b->always;
    qd_engine *e = NULL;
    qd_err err = {0};
    if (qd_engine_create(m, &ep, &e, &err) != QD_OK) {
        fprintf(stderr, "qdelta bench: --speculative-tokens %d: %s\n", k, err.msg);
        return -1;
    }
    pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
    pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
    int n_done = 0, rc = 0;
    bench_req *rs = calloc((size_t)b->batch, sizeof *rs);
    double *times = malloc(sizeof(double) * (size_t)b->batch * (size_t)b->n_decode);
    if (!rs || !times) {
        fprintf(stderr, "qdelta bench: out of memory\n");
        free(rs);
        free(times);
        qd_engine_free(e);
        return -1;
    }
    for (int i = 0; i < b->batch; i++) {
        rs[i] = (bench_req){.mu = &mu, .cv = &cv, .n_done = &n_done, .out = outs + (size_t)i * b->n_decode,
                            .t_tok = times + (size_t)i * b->n_decode};
        qd_request_params rq = {0};
        rq.sampling = qd_sampling_default_params();
        rq.sampling.temperature = 0.0f;
        rq.max_tokens = b->n_decode;
        /* unconstrained: every token counts; constrained: it ends as served, at EOS once
         * the output is complete (the constraint closes it before max_tokens) */
        rq.ignore_eos = !cons;
        rq.constraint = cons ? cons[i] : NULL;
        uint64_t id;
        if (qd_engine_submit(e, prompts + (size_t)i * b->context, b->context, &rq, on_event, &rs[i], &id, &err) != QD_OK) {
            fprintf(stderr, "qdelta bench: %s\n", err.msg);
            pthread_mutex_lock(&mu);
            n_done++;
            rs[i].failed = 1;
            pthread_mutex_unlock(&mu);
        } else if (cons) cons[i] = NULL; /* the engine owns it now */
    }
    pthread_mutex_lock(&mu);
    while (n_done < b->batch) pthread_cond_wait(&cv, &mu);
    pthread_mutex_unlock(&mu);
    const double t_end = qd_clock_seconds();
    double t_first = 0;
    long tokens = 0;
    for (int i = 0; i < b->batch; i++) {
        if (rs[i].failed) rc = -1;
        if (rs[i].t_first > t_first) t_first = rs[i].t_first;
        tokens += rs[i].n - 1;
        if (n_out) n_out[i] = rs[i].n;
    }
    /* from the moment every request decodes (the last first token) to the end */
    *tok_s = t_end > t_first ? (double)tokens / (t_end - t_first) : 0;
    /* only while every request decodes (to the first request's last token): requests that
     * end early (a constrained output complete before max_tokens) leave the later steps
     * fewer rows, which the whole-run rate counts against them */
    if (tok_s_full) {
        double t_last = t_end;
        for (int i = 0; i < b->batch; i++)
            if (rs[i].n > 0 && rs[i].t_tok[rs[i].n - 1] < t_last) t_last = rs[i].t_tok[rs[i].n - 1];
        long in_window = 0;
        for (int i = 0; i < b->batch; i++)
            for (int j = 1; j < rs[i].n; j++) in_window += rs[i].t_tok[j] > t_first && rs[i].t_tok[j] <= t_last;
        *tok_s_full = t_last > t_first ? (double)in_window / (t_last - t_first) : 0;
    }
    qd_engine_get_stats(e, st);
    qd_engine_free(e);
    free(rs);
    free(times);
    if (rc) fprintf(stderr, "qdelta bench: an engine bench request failed\n");
    return rc;
}

void cli_bench_prompts(const cli_bench_spec *b, int vocab, int32_t *prompts) {
    for (int i = 0; i < b->batch; i++) { /* a prompt of its own per request, as the decode bench */
        uint64_t s = 0x9e3779b97f4a7c15ull * (uint64_t)(i + 1);
        for (int t = 0; t < b->context; t++) {
            s = s * 6364136223846793005ull + 1442695040888963407ull;
            prompts[(size_t)i * b->context + t] = (int32_t)((s >> 33) % (uint64_t)vocab);
        }
    }
}

double cli_bench_step_bytes(qd_model *m, int batch, double state_passes, double mean_ctx, double pairs) {
    const int moe_layers = qd_model_moe_layers(m), k_tok = moe_layers > 0 ? qd_model_experts_per_token(m) : 0;
    const double per_seq = (double)batch * (state_passes * (double)qd_model_state_bytes(m) +
                                            mean_ctx * (double)qd_model_kv_bytes_per_token(m));
    const double one_tok = (double)qd_model_active_weight_bytes(m) + per_seq;
    return pairs >= 0 ? one_tok + (pairs - (double)moe_layers * k_tok) * (double)qd_model_expert_bytes(m) : one_tok;
}

double cli_bench_verify_bytes(qd_model *m, qd_context *ctx, const cli_bench_spec *b, double mean_ctx, qd_span *spans,
                              int32_t *next) {
    const int span = b->k + 1, V = qd_model_vocab_size(m), moe_layers = qd_model_moe_layers(m);
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)b->batch * (size_t)span);
    double pairs = -1;
    if (ids && moe_layers > 0 && qd_context_count_experts(ctx, 1) == QD_OK) {
        uint64_t s = 0x2545f4914f6cdd1dull;
        for (int i = 0; i < b->batch * span; i++) {
            s = s * 6364136223846793005ull + 1442695040888963407ull;
            ids[i] = (int32_t)((s >> 33) % (uint64_t)V);
        }
        for (int i = 0; i < b->batch; i++) spans[i] = (qd_span){i, ids + (size_t)i * span, span, QD_LOGITS_LAST};
        int64_t p = 0;
        if (qd_forward_greedy(ctx, spans, b->batch, next) == QD_OK && qd_context_routed_experts(ctx, &p) == QD_OK)
            pairs = (double)p;
        qd_context_count_experts(ctx, 0);
    }
    free(ids);
    return cli_bench_step_bytes(m, b->batch, 1.0 + span, mean_ctx, pairs);
}

int cli_bench_spec_run(qd_model *m, const cli_bench_spec *b) {
    const int V = qd_model_vocab_size(m);
    int32_t *prompts = malloc(sizeof(int32_t) * (size_t)b->batch * (size_t)b->context);
    int32_t *plain = malloc(sizeof(int32_t) * (size_t)b->batch * (size_t)b->n_decode);
    int32_t *spec = malloc(sizeof(int32_t) * (size_t)b->batch * (size_t)b->n_decode);
    int rc = -1;
    if (!prompts || !plain || !spec) goto done;
    cli_bench_prompts(b, V, prompts);
    double t_plain, t_spec;
    qd_engine_stats s0, s1;
    if (cli_bench_engine_run(m, b, 0, prompts, plain, NULL, NULL, &t_plain, NULL, &s0) ||
        cli_bench_engine_run(m, b, b->k, prompts, spec, NULL, NULL, &t_spec, NULL, &s1))
        goto done;
    const int same = !memcmp(plain, spec, sizeof(int32_t) * (size_t)b->batch * (size_t)b->n_decode);
    const double rate = s1.spec_draft_tokens ? 100.0 * (double)s1.spec_accepted_tokens / (double)s1.spec_draft_tokens : 0;
    const double mean =
        s1.spec_verify_steps ? (double)(s1.spec_accepted_tokens + s1.spec_verify_steps) / (double)s1.spec_verify_steps : 0;
    printf("engine decode batch %d, %d tokens after %d-token prompts: %.1f tok/s without speculation, %.1f tok/s with "
           "K=%d (x%.2f); greedy outputs %s\n",
           b->batch, b->n_decode, b->context, t_plain, t_spec, b->k, t_plain > 0 ? t_spec / t_plain : 0,
           same ? "identical" : "DIFFER");
    printf("  speculative: %.1f%% of %llu drafts accepted, mean accepted length %.2f tokens per verify step (accepted "
           "drafts + 1 bonus), accepted at position",
           rate, (unsigned long long)s1.spec_draft_tokens, mean);
    for (int i = 0; i < b->k; i++) printf(" %d:%llu", i, (unsigned long long)s1.spec_accepted_at[i]);
    /* per step, prefill steps included (a few of many): where a speculative step's time goes */
    const double ms0 = 1e3 / (double)(s0.steps ? s0.steps : 1), ms1 = 1e3 / (double)(s1.steps ? s1.steps : 1);
    printf("\n  per engine step: plain forward %.3f ms; speculative forward (verify) %.3f ms, MTP drafts %.3f ms",
           s0.forward_seconds * ms0, s1.forward_seconds * ms1, s1.mtp_seconds * ms1);
    /* per decode step (no prompt token): the verify step and its drafts against a plain one */
    const double d0 = 1e3 / (double)(s0.decode_steps ? s0.decode_steps : 1);
    const double d1 = 1e3 / (double)(s1.decode_steps ? s1.decode_steps : 1);
    printf("\n  per decode step (%llu / %llu of them): plain forward %.3f ms; speculative forward %.3f ms, MTP %.3f ms",
           (unsigned long long)s0.decode_steps, (unsigned long long)s1.decode_steps, s0.decode_forward_seconds * d0,
           s1.decode_forward_seconds * d1, s1.decode_mtp_seconds * d1);
    printf("\n  drafting: %s; %llu of %llu steps kept plain by the policy; %llu MTP forwards",
           b->always ? "every step" : "by the policy", (unsigned long long)s1.spec_plain_steps,
           (unsigned long long)s1.steps, (unsigned long long)s1.spec_mtp_forwards);
    /* a verify step against what its bytes cost (with --speculative-always every decode step
     * verifies; by the policy the figure mixes in plain steps) */
    const double roof_ms = b->verify_gb > 0 && b->copy_gbps > 0 ? 1e3 * b->verify_gb / b->copy_gbps : 0;
    const double v_ms = s1.decode_forward_seconds * d1, mtp_ms = s1.decode_mtp_seconds * d1;
    if (roof_ms > 0)
        printf("\n  verify roofline: %.3f GB a step over %.0f GB/s = %.3f ms; the verify forward takes %.2fx it, "
               "with its drafts %.2fx", b->verify_gb, b->copy_gbps, roof_ms, v_ms / roof_ms, (v_ms + mtp_ms) / roof_ms);
    printf("\nRESULT spec_decode B=%d ctx=%d K=%d tok_s_plain=%.2f tok_s_spec=%.2f accept_pct=%.2f mean_len=%.3f same=%d "
           "fwd_ms_plain=%.3f fwd_ms_spec=%.3f mtp_ms_spec=%.3f "
           "dec_ms_plain=%.3f dec_ms_spec=%.3f dec_mtp_ms_spec=%.3f draft_vocab=%d always=%d plain_steps=%llu "
           "steps=%llu mtp_forwards=%llu verify_GB=%.4f verify_roof_ms=%.4f verify_x_roof=%.3f spec_x_roof=%.3f\n",
           b->batch, b->context, b->k, t_plain, t_spec, rate, mean, same, s0.forward_seconds * ms0,
           s1.forward_seconds * ms1, s1.mtp_seconds * ms1, s0.decode_forward_seconds * d0,
           s1.decode_forward_seconds * d1, s1.decode_mtp_seconds * d1, b->draft_vocab, b->always,
           (unsigned long long)s1.spec_plain_steps, (unsigned long long)s1.steps,
           (unsigned long long)s1.spec_mtp_forwards, b->verify_gb, roof_ms, roof_ms > 0 ? v_ms / roof_ms : 0.0,
           roof_ms > 0 ? (v_ms + mtp_ms) / roof_ms : 0.0);
    rc = same ? 0 : -1;
    if (!same) fprintf(stderr, "qdelta bench: speculative greedy output differs from plain greedy\n");
done:
    free(prompts);
    free(plain);
    free(spec);
    return rc;
}
