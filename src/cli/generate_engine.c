/* cli_generate through the session's engine (generate.h): the speculative path of run and
 * chat. One request per call, the whole prompt each time (the engine's prefix cache finds
 * the earlier turns of a conversation); its events stream text exactly as cli_generate
 * does: detokenized, stop strings matched across tokens (the callback ends the request at
 * the token that completes one), EOS text left out, Ctrl-C honoured at the next token. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "cli/common.h"
#include "cli/generate.h"

typedef struct gen_state {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int done, failed;
    const cli_gen_opts *o;
    FILE *out;
    volatile sig_atomic_t *interrupted;
    cli_gen_result *r;
    size_t text_cap;
    qd_detok dt;
    int have_dt;
    qd_stop_matcher *stop;
    const int32_t *eos;
    int n_eos;
    double t0;
    char error[QD_ERRMSG_SIZE + 64];
} gen_state;

static int append(gen_state *g, const char *t, size_t n) {
    cli_gen_result *r = g->r;
    if (!n) return 0;
    if (r->text_len + n + 1 > g->text_cap) {
        size_t nc = (g->text_cap ? g->text_cap * 2 : 256) + n;
        char *nt = realloc(r->text, nc);
        if (!nt) return -1;
        r->text = nt;
        g->text_cap = nc;
    }
    memcpy(r->text + r->text_len, t, n);
    r->text_len += n;
    r->text[r->text_len] = '\0';
    if (g->out) {
        fwrite(t, 1, n, g->out);
        fflush(g->out);
    }
    return 0;
}

/* One token: record, print, detokenize, match stops. Returns 1 to end the request. */
static int on_token(gen_state *g, const qd_sample_result *res) {
    cli_gen_result *r = g->r;
    if (r->n_ids == 0) r->t_first = qd_clock_seconds() - g->t0;
    r->ids[r->n_ids++] = res->token;
    if (g->o->print_logprobs) {
        fprintf(stderr, "[%d logprob %.4f |", res->token, res->logprob);
        for (int k = 0; k < res->n_top; k++) fprintf(stderr, " %d:%.4f", res->top[k].id, res->top[k].logprob);
        fprintf(stderr, "]\n");
    }
    int is_eos = 0;
    for (int e = 0; e < g->n_eos; e++) is_eos |= g->eos[e] == res->token;
    if (g->have_dt && !is_eos) {
        const char *piece;
        size_t len;
        qd_stop_result sr;
        qd_err err = {0};
        if (qd_detok_push(&g->dt, res->token, &piece, &len, &err) != QD_OK ||
            qd_stop_matcher_push(g->stop, piece, len, &sr, &err) != QD_OK) {
            snprintf(g->error, sizeof g->error, "%s", err.msg);
            return 1;
        }
        if (append(g, sr.text, sr.len)) {
            snprintf(g->error, sizeof g->error, "out of memory for the generated text");
            return 1;
        }
        if (sr.stopped) {
            r->finish = "stop";
            return 1;
        }
    }
    if (g->interrupted && *g->interrupted) {
        r->finish = "interrupted";
        return 1;
    }
    return 0;
}

static int on_event(void *user, const qd_engine_event *ev) {
    gen_state *g = user;
    int ret = ev->has_token ? on_token(g, &ev->sample) : 0;
    if (ev->finish == QD_FINISH_NONE) return ret;
    pthread_mutex_lock(&g->mu);
    if (ev->finish == QD_FINISH_LENGTH) g->r->finish = "length";
    else if (ev->finish == QD_FINISH_EOS) g->r->finish = "eos";
    else if (ev->finish == QD_FINISH_CANCELLED) g->r->finish = "interrupted";
    else if (ev->finish == QD_FINISH_ERROR) {
        g->failed = 1;
        snprintf(g->error, sizeof g->error, "%s", ev->error ? ev->error : "generation failed");
    } else if (g->error[0]) g->failed = 1; /* STOP asked by on_token for an error */
    g->done = 1;
    pthread_cond_signal(&g->cv);
    pthread_mutex_unlock(&g->mu);
    return 0;
}

int cli_generate_engine(cli_session *s, const int32_t *prompt, int n_prompt, const cli_gen_opts *o, FILE *out,
                        volatile sig_atomic_t *interrupted, cli_gen_result *r) {
    memset(r, 0, sizeof *r);
    if (n_prompt < 1) {
        fprintf(stderr, "qdelta: empty prompt\n");
        return -1;
    }
    if (o->max_tokens < 1) { /* nothing to generate: no request */
        r->finish = "length";
        r->ids = malloc(sizeof(int32_t));
        return r->ids ? 0 : -1;
    }
    const int V = qd_model_vocab_size(s->model);
    gen_state g;
    memset(&g, 0, sizeof g);
    pthread_mutex_init(&g.mu, NULL);
    pthread_cond_init(&g.cv, NULL);
    g.o = o;
    g.out = out;
    g.interrupted = interrupted;
    g.r = r;
    g.n_eos = o->ignore_eos ? 0 : qd_model_eos_ids(s->model, &g.eos);
    qd_err err = {0};
    int rc = -1;
    qd_request_params rq = {0};
    rq.sampling = o->sampling;
    if (s->tok && (rq.sampling.vocab_limit == 0 || rq.sampling.vocab_limit > qd_tokenizer_vocab_size(s->tok)))
        rq.sampling.vocab_limit = qd_tokenizer_vocab_size(s->tok) < V ? qd_tokenizer_vocab_size(s->tok) : V;
    if (o->print_logprobs) rq.sampling.n_logprobs = o->print_logprobs;
    rq.max_tokens = o->max_tokens;
    rq.ignore_eos = o->ignore_eos;
    if (n_prompt + rq.max_tokens > s->max_ctx) {
        fprintf(stderr, "qdelta: the conversation needs %d tokens but the context holds %d (use --ctx-size)\n",
                n_prompt + rq.max_tokens, s->max_ctx);
        goto done;
    }
    if (qd_stop_matcher_create(o->stops, o->n_stops, &g.stop, &err) != QD_OK) {
        fprintf(stderr, "qdelta: %s\n", err.msg);
        goto done;
    }
    if (!(r->ids = malloc(sizeof(int32_t) * (size_t)(o->max_tokens + 1)))) goto done;
    if (s->tok) {
        qd_detok_init(&g.dt, s->tok, o->skip_special);
        g.have_dt = 1;
    }
    qd_engine_stats before, after;
    qd_engine_get_stats(s->engine, &before);
    g.t0 = qd_clock_seconds();
    uint64_t id;
    if (qd_engine_submit(s->engine, prompt, n_prompt, &rq, on_event, &g, &id, &err) != QD_OK) {
        fprintf(stderr, "qdelta: %s\n", err.msg);
        goto done;
    }
    pthread_mutex_lock(&g.mu);
    while (!g.done) pthread_cond_wait(&g.cv, &g.mu);
    pthread_mutex_unlock(&g.mu);
    const double t_end = qd_clock_seconds();
    qd_engine_get_stats(s->engine, &after);
    if (g.failed) {
        fprintf(stderr, "qdelta: %s\n", g.error);
        goto done;
    }
    /* the time to the first token is the prefill; the rest is decoding */
    r->t_prefill = r->t_first;
    r->t_decode = t_end - g.t0 - r->t_first;
    r->n_prompt_fed = (int)(after.prefill_tokens_total - before.prefill_tokens_total);
    r->spec_k = s->spec_k;
    r->spec_steps = after.spec_verify_steps - before.spec_verify_steps;
    r->spec_drafted = after.spec_draft_tokens - before.spec_draft_tokens;
    r->spec_accepted = after.spec_accepted_tokens - before.spec_accepted_tokens;
    for (int i = 0; i < 4; i++) r->spec_accepted_at[i] = after.spec_accepted_at[i] - before.spec_accepted_at[i];
    if (g.have_dt && strcmp(r->finish, "stop") != 0) {
        const char *piece;
        size_t len;
        qd_stop_result sr;
        if (qd_detok_flush(&g.dt, &piece, &len, &err) == QD_OK && len &&
            qd_stop_matcher_push(g.stop, piece, len, &sr, &err) == QD_OK)
            append(&g, sr.text, sr.len);
        qd_stop_matcher_flush(g.stop, &sr);
        append(&g, sr.text, sr.len);
    }
    rc = 0;
done:
    if (g.have_dt) qd_detok_free(&g.dt);
    qd_stop_matcher_free(g.stop);
    pthread_cond_destroy(&g.cv);
    pthread_mutex_destroy(&g.mu);
    return rc;
}

void cli_print_spec_line(FILE *f, const cli_gen_result *r) {
    if (!r->spec_k) return;
    const double rate = r->spec_drafted ? 100.0 * (double)r->spec_accepted / (double)r->spec_drafted : 0.0;
    const double mean = r->spec_steps ? (double)(r->spec_accepted + r->spec_steps) / (double)r->spec_steps : 0.0;
    fprintf(f, "speculative: K=%d, %llu of %llu drafts accepted (%.1f%%), mean accepted length %.2f tokens per verify "
               "step (accepted drafts + 1 bonus token), %llu verify steps, accepted at position",
            r->spec_k, (unsigned long long)r->spec_accepted, (unsigned long long)r->spec_drafted, rate, mean,
            (unsigned long long)r->spec_steps);
    for (int i = 0; i < r->spec_k; i++) fprintf(f, " %d:%llu", i, (unsigned long long)r->spec_accepted_at[i]);
    fprintf(f, "\n");
}
