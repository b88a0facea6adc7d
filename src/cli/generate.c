#include "cli/generate.h"

#include <stdlib.h>
#include <string.h>

#include "cli/common.h"

cli_gen_opts cli_gen_default_opts(void) {
    cli_gen_opts o;
    memset(&o, 0, sizeof o);
    o.sampling = qd_sampling_default_params();
    o.max_tokens = 256;
    o.skip_special = true;
    return o;
}

void cli_apply_generation_defaults(cli_gen_opts *o, const qd_model *m) {
    if (o->temperature_set) return;
    qd_generation_defaults d = qd_model_generation_defaults(m);
    o->sampling.temperature = d.do_sample ? d.temperature : 0.0f;
    if (o->sampling.repetition_penalty == 1.0f) o->sampling.repetition_penalty = d.repetition_penalty;
    if (d.do_sample) {
        if (o->sampling.top_p == 1.0f) o->sampling.top_p = d.top_p;
        if (o->sampling.top_k == 0) o->sampling.top_k = d.top_k;
    }
}

int cli_session_open(cli_session *s, qd_model *m, qd_tokenizer *tok, int max_ctx, int max_batch) {
    return cli_session_open_spec(s, m, tok, max_ctx, max_batch, NULL);
}

int cli_session_open_spec(cli_session *s, qd_model *m, qd_tokenizer *tok, int max_ctx, int max_batch,
                          const cli_gen_opts *spec) {
    const int k = spec ? spec->speculative_tokens : 0;
    memset(s, 0, sizeof *s);
    s->model = m;
    s->tok = tok;
    s->max_ctx = max_ctx;
    s->max_batch = max_batch;
    qd_context_params cp = qd_context_default_params();
    cp.max_seqs = 1;
    cp.max_ctx = max_ctx;
    cp.max_batch = max_batch;
    if (k > 0) {
        qd_engine_params ep = qd_engine_default_params();
        ep.max_num_seqs = 1;
        ep.max_model_len = max_ctx;
        ep.max_batch_tokens = max_batch > k + 1 ? max_batch : k + 1;
        ep.speculative_tokens = k;
        ep.speculative_draft_vocab = spec->speculative_draft_vocab;
        ep.speculative_always = spec->speculative_always;
        /* a few snapshots and the blocks of one context: the next turn of a chat hits */
        ep.prefix_cache_bytes = (size_t)qd_model_state_bytes(m) * 4 + (size_t)qd_model_kv_bytes_per_token(m) * (size_t)max_ctx * 2;
        ep.prefix_snapshot_interval = 0;
        qd_err err = {0};
        if (qd_engine_create(m, &ep, &s->engine, &err) != QD_OK) {
            fprintf(stderr, "qdelta: --speculative-tokens %d: %s\n", k, err.msg);
            return -1;
        }
        s->spec_k = k;
        return 0;
    }
    if (qd_context_create(m, &cp, &s->ctx) != QD_OK) {
        fprintf(stderr, "qdelta: %s\n", qd_model_errmsg(m));
        return -1;
    }
    s->fed = malloc(sizeof(int32_t) * (size_t)max_ctx);
    s->logits = malloc(sizeof(float) * (size_t)qd_model_vocab_size(m));
    if (!s->fed || !s->logits) {
        fprintf(stderr, "qdelta: out of memory\n");
        cli_session_close(s);
        return -1;
    }
    return 0;
}

void cli_session_close(cli_session *s) {
    qd_engine_free(s->engine);
    qd_context_free(s->ctx);
    free(s->fed);
    free(s->logits);
    memset(s, 0, sizeof *s);
}

void cli_gen_result_free(cli_gen_result *r) {
    free(r->ids);
    free(r->text);
    memset(r, 0, sizeof *r);
}

/* Feeds tokens to sequence 0 in chunks of max_batch; logits of the last one. */
static int feed(cli_session *s, const int32_t *ids, int n) {
    if (s->n_fed + n > s->max_ctx) {
        fprintf(stderr, "qdelta: the conversation needs %d tokens but the context holds %d (use --ctx-size)\n",
                s->n_fed + n, s->max_ctx);
        return -1;
    }
    for (int off = 0; off < n; off += s->max_batch) {
        int k = n - off < s->max_batch ? n - off : s->max_batch;
        qd_span span = {0, ids + off, k, off + k == n ? QD_LOGITS_LAST : QD_LOGITS_NONE};
        if (qd_forward(s->ctx, &span, 1, s->logits) != QD_OK) {
            fprintf(stderr, "qdelta: %s\n", qd_context_errmsg(s->ctx));
            return -1;
        }
        memcpy(s->fed + s->n_fed, ids + off, sizeof(int32_t) * (size_t)k);
        s->n_fed += k;
    }
    return 0;
}

static int append_text(cli_gen_result *r, size_t *cap, const char *t, size_t n, FILE *out) {
    if (!n) return 0;
    if (r->text_len + n + 1 > *cap) {
        size_t nc = (*cap ? *cap * 2 : 256) + n;
        char *nt = realloc(r->text, nc);
        if (!nt) return -1;
        r->text = nt;
        *cap = nc;
    }
    memcpy(r->text + r->text_len, t, n);
    r->text_len += n;
    r->text[r->text_len] = '\0';
    if (out) {
        fwrite(t, 1, n, out);
        fflush(out);
    }
    return 0;
}

int cli_generate(cli_session *s, const int32_t *prompt, int n_prompt, const cli_gen_opts *o, FILE *out,
                 volatile sig_atomic_t *interrupted, cli_gen_result *r) {
    if (s->engine) return cli_generate_engine(s, prompt, n_prompt, o, out, interrupted, r);
    memset(r, 0, sizeof *r);
    qd_err err;
    qd_err_clear(&err);
    const int V = qd_model_vocab_size(s->model);
    qd_sampling_params sp = o->sampling;
    if (s->tok && (sp.vocab_limit == 0 || sp.vocab_limit > qd_tokenizer_vocab_size(s->tok)))
        sp.vocab_limit = qd_tokenizer_vocab_size(s->tok) < V ? qd_tokenizer_vocab_size(s->tok) : V;
    if (o->print_logprobs) sp.n_logprobs = o->print_logprobs;
    qd_sampler *smp = NULL;
    qd_stop_matcher *stop = NULL;
    qd_detok dt;
    int have_dt = 0, rc = -1;
    size_t text_cap = 0;
    if (qd_sampler_create(&sp, V, &smp, &err) != QD_OK || qd_stop_matcher_create(o->stops, o->n_stops, &stop, &err) != QD_OK) {
        fprintf(stderr, "qdelta: %s\n", err.msg);
        goto done;
    }
    if (n_prompt < 1) {
        fprintf(stderr, "qdelta: empty prompt\n");
        goto done;
    }
    r->ids = malloc(sizeof(int32_t) * (size_t)(o->max_tokens + 1));
    if (!r->ids) goto done;
    if (s->tok) {
        qd_detok_init(&dt, s->tok, o->skip_special);
        have_dt = 1;
    }

    /* reuse the tokens the sequence already holds when the prompt extends them; the
     * recurrent state cannot be rewound, so anything else starts over */
    int common = 0;
    while (common < s->n_fed && common < n_prompt && s->fed[common] == prompt[common]) common++;
    if (common < s->n_fed || common == n_prompt) {
        qd_seq_reset(s->ctx, 0);
        s->n_fed = 0;
        common = 0;
    }
    double t0 = qd_clock_seconds();
    if (feed(s, prompt + common, n_prompt - common)) goto done;
    r->n_prompt_fed = n_prompt - common;
    r->t_prefill = qd_clock_seconds() - t0;
    if (qd_sampler_accept_prompt(smp, prompt, n_prompt, &err) != QD_OK) {
        fprintf(stderr, "qdelta: %s\n", err.msg);
        goto done;
    }
    const int32_t *eos;
    int n_eos = o->ignore_eos ? 0 : qd_model_eos_ids(s->model, &eos);
    r->finish = "length";
    double t_dec0 = qd_clock_seconds();
    for (int t = 0; t < o->max_tokens; t++) {
        if (interrupted && *interrupted) { r->finish = "interrupted"; break; }
        qd_sample_result res;
        if (qd_sampler_sample(smp, s->logits, &res, &err) != QD_OK) {
            fprintf(stderr, "qdelta: %s\n", err.msg);
            goto done;
        }
        if (t == 0) { r->t_first = qd_clock_seconds() - t0; t_dec0 = qd_clock_seconds(); }
        r->ids[r->n_ids++] = res.token;
        if (o->print_logprobs) {
            fprintf(stderr, "[%d logprob %.4f |", res.token, res.logprob);
            for (int k = 0; k < res.n_top; k++) fprintf(stderr, " %d:%.4f", res.top[k].id, res.top[k].logprob);
            fprintf(stderr, "]\n");
        }
        int is_eos = 0;
        for (int e = 0; e < n_eos; e++) is_eos |= eos[e] == res.token;
        if (have_dt && !is_eos) {
            const char *piece;
            size_t len;
            if (qd_detok_push(&dt, res.token, &piece, &len, &err) != QD_OK) { fprintf(stderr, "qdelta: %s\n", err.msg); goto done; }
            qd_stop_result sr;
            if (qd_stop_matcher_push(stop, piece, len, &sr, &err) != QD_OK) { fprintf(stderr, "qdelta: %s\n", err.msg); goto done; }
            if (append_text(r, &text_cap, sr.text, sr.len, out)) goto done;
            if (sr.stopped) { r->finish = "stop"; break; }
        }
        if (is_eos) { r->finish = "eos"; break; }
        if (t + 1 == o->max_tokens) break;
        if (qd_sampler_accept(smp, res.token, &err) != QD_OK) { fprintf(stderr, "qdelta: %s\n", err.msg); goto done; }
        if (feed(s, &res.token, 1)) goto done;
    }
    if (have_dt && strcmp(r->finish, "stop") != 0) {
        const char *piece;
        size_t len;
        qd_stop_result sr;
        if (qd_detok_flush(&dt, &piece, &len, &err) == QD_OK && len &&
            qd_stop_matcher_push(stop, piece, len, &sr, &err) == QD_OK)
            append_text(r, &text_cap, sr.text, sr.len, out);
        if (strcmp(r->finish, "stop") != 0) {
            qd_stop_matcher_flush(stop, &sr);
            append_text(r, &text_cap, sr.text, sr.len, out);
        }
    }
    r->t_decode = qd_clock_seconds() - t_dec0;
    rc = 0;
done:
    if (have_dt) qd_detok_free(&dt);
    qd_sampler_free(smp);
    qd_stop_matcher_free(stop);
    return rc;
}

static int parse_float(const char *opt, const char *v, float *out) {
    double d;
    if (cli_double(opt, v, &d)) return -1;
    *out = (float)d;
    return 0;
}

int cli_parse_gen_opt(cli_gen_opts *o, int argc, char **argv, int *i) {
    const char *a = argv[*i];
    const char *v;
    long n;
    if (!strcmp(a, "--temperature") || !strcmp(a, "--temp")) {
        if (!(v = cli_value(argc, argv, i)) || parse_float(a, v, &o->sampling.temperature)) return -1;
        o->temperature_set = true;
    } else if (!strcmp(a, "--top-k")) {
        if (!(v = cli_value(argc, argv, i)) || cli_int(a, v, 0, 1 << 30, &n)) return -1;
        o->sampling.top_k = (int)n;
    } else if (!strcmp(a, "--top-p")) {
        if (!(v = cli_value(argc, argv, i)) || parse_float(a, v, &o->sampling.top_p)) return -1;
    } else if (!strcmp(a, "--min-p")) {
        if (!(v = cli_value(argc, argv, i)) || parse_float(a, v, &o->sampling.min_p)) return -1;
    } else if (!strcmp(a, "--repetition-penalty")) {
        if (!(v = cli_value(argc, argv, i)) || parse_float(a, v, &o->sampling.repetition_penalty)) return -1;
    } else if (!strcmp(a, "--presence-penalty")) {
        if (!(v = cli_value(argc, argv, i)) || parse_float(a, v, &o->sampling.presence_penalty)) return -1;
    } else if (!strcmp(a, "--frequency-penalty")) {
        if (!(v = cli_value(argc, argv, i)) || parse_float(a, v, &o->sampling.frequency_penalty)) return -1;
    } else if (!strcmp(a, "--seed")) {
        if (!(v = cli_value(argc, argv, i))) return -1;
        char *end;
        unsigned long long x = strtoull(v, &end, 10);
        if (end == v || *end) { fprintf(stderr, "qdelta: --seed expects a non-negative integer, got '%s'\n", v); return -1; }
        o->sampling.seed = x;
    } else if (!strcmp(a, "-n") || !strcmp(a, "--max-tokens")) {
        if (!(v = cli_value(argc, argv, i)) || cli_int(a, v, 0, 1 << 24, &n)) return -1;
        o->max_tokens = (int)n;
    } else if (!strcmp(a, "--stop")) {
        if (!(v = cli_value(argc, argv, i))) return -1;
        if (o->n_stops == QD_STOP_MAX_STRINGS) { fprintf(stderr, "qdelta: at most %d --stop strings\n", QD_STOP_MAX_STRINGS); return -1; }
        o->stops[o->n_stops++] = v;
    } else if (!strcmp(a, "--ignore-eos")) {
        o->ignore_eos = true;
    } else if (!strcmp(a, "--speculative-tokens")) {
        if (!(v = cli_value(argc, argv, i)) || cli_int(a, v, 0, 4, &n)) return -1;
        o->speculative_tokens = (int)n;
    } else if (!strcmp(a, "--speculative-draft-vocab")) {
        if (!(v = cli_value(argc, argv, i)) || cli_int(a, v, 0, 1 << 30, &n)) return -1;
        o->speculative_draft_vocab = (int)n;
    } else if (!strcmp(a, "--speculative-always")) {
        o->speculative_always = 1;
    } else if (!strcmp(a, "--logprobs")) {
        if (!(v = cli_value(argc, argv, i)) || cli_int(a, v, 0, QD_MAX_LOGPROBS, &n)) return -1;
        o->print_logprobs = (int)n;
    } else {
        return 0;
    }
    return 1;
}

void cli_print_gen_opts_help(FILE *f) {
    fprintf(f, "sampling:\n"
               "  -n, --max-tokens N        tokens to generate\n"
               "  --temperature T           0 = greedy\n"
               "  --top-k K  --top-p P  --min-p P\n"
               "  --repetition-penalty R  --presence-penalty P  --frequency-penalty F\n"
               "  --seed S                  same seed, same output\n"
               "  --stop STR                stop string (repeatable; matched across tokens)\n"
               "  --ignore-eos              do not stop at end-of-sequence tokens\n"
               "  --logprobs N              print each token's logprob and N alternatives to stderr\n"
               "  --speculative-tokens K    speculative decoding with the checkpoint's MTP head: K = 1..4\n"
               "                            drafts verified per step (0 = off, the default); the output is\n"
               "                            plain decoding's (greedy: the same tokens); prints a\n"
               "                            'speculative:' line with the acceptance on stderr\n"
               "  --speculative-draft-vocab N  draft among token ids [0, N) only (0 = all, the default):\n"
               "                            the MTP head reads N rows of the LM head instead of all;\n"
               "                            the output is unchanged\n"
               "  --speculative-always      draft at every step; by default a step drafts only while\n"
               "                            the measured costs and acceptance say it is faster\n");
}
