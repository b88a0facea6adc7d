/* qdelta serve: the OpenAI-compatible HTTP server over the continuous-batching engine.
 * Loads the model, tokenizer and chat template, starts the engine and the HTTP
 * daemon, then waits for SIGINT/SIGTERM and shuts down gracefully (stop accepting,
 * cancel what is running, let the streams end, free everything, exit 0). */
#include <limits.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/commands.h"
#include "cli/common.h"
#include "server/server.h"

static void usage(FILE *f) {
    fprintf(f, "usage: qdelta serve [-m DIR|ORG/NAME] [options]\n"
               "  OpenAI-compatible server: POST /v1/chat/completions, POST /v1/completions,\n"
               "  GET /v1/models, GET /health, GET /metrics. Without -m it serves the embedded\n"
               "  default model. SIGINT/SIGTERM shut it down gracefully.\n"
               "  --host ADDR               address to listen on (default 127.0.0.1)\n"
               "  --port N                  port (default 8000; 0 = any free port, printed)\n"
               "  --api-key KEY             require 'Authorization: Bearer KEY' on /v1/*\n"
               "  --api-key-file FILE       the same, the key read from FILE's first line\n"
               "                            (keeps the key out of the process list)\n"
               "  --served-model-name NAME  the model id of the API (GET /v1/models). A request's\n"
               "                            \"model\" must be this id or be left out; any other name\n"
               "                            gets 404. Default: the ORG/NAME given to -m, else the\n"
               "                            directory's name (qdelta-tiny for the default model)\n"
               "  --chat-template FILE      Jinja chat template overriding the checkpoint's\n"
               "  --max-num-seqs N          sequences running at once (default 16)\n"
               "  --max-model-len N         prompt + completion tokens (default: the model's\n"
               "                            max_position_embeddings, capped at 4096)\n"
               "  --max-batch-tokens N      tokens per engine step (default 512)\n"
               "  --max-step-ms MS          with decodes running, a step takes only the prompt tokens\n"
               "                            that keep its forward within MS by the engine's measured\n"
               "                            step cost (at least 128), so decode latency stays bounded\n"
               "                            while prompts advance (0 = off, the default: every step\n"
               "                            fills --max-batch-tokens); /metrics has the cost model\n"
               "  --kv-block-size N         tokens per KV block (default: the engine's)\n"
               "  --max-waiting N           queued requests before 503 (default 256)\n"
               "  --prefix-cache-memory B   bytes for the prefix cache (GDN state snapshots and\n"
               "                            the KV blocks they keep). On by default, with a budget\n"
               "                            from the memory left after the model and the KV cache\n"
               "                            (the banner prints it); its outputs are those without\n"
               "                            it. With --backend cuda the snapshots are GPU memory\n"
               "  --no-prefix-cache         turn the prefix cache off (same as --prefix-cache-memory 0)\n"
               "  --prefix-cache-host-memory B  host memory for snapshots moved out of a full\n"
               "                            prefix cache (restored from there); 0 = none (default)\n"
               "  --prefix-snapshot-interval N  also snapshot every N prompt tokens (default 512)\n"
               "  --batch-invariant         a request's tokens do not depend on what runs beside\n"
               "                            it (bit-identical logits alone or batched; slower;\n"
               "                            needs --max-batch-tokens >= 128; docs/batch-invariance.md)\n"
               "  --speculative-tokens K    speculative decoding with the checkpoint's MTP head: K = 1..4\n"
               "                            drafts verified per decode step (0 = off, the default); the\n"
               "                            output is plain decoding's; /metrics counts the drafts kept.\n"
               "                            Requests with response_format / tool_choice do not speculate\n"
               "  --speculative-draft-vocab N  draft among token ids [0, N) only (0 = all, the default):\n"
               "                            cheaper drafts (N rows of the LM head), output unchanged\n"
               "  --speculative-always      draft at every step; by default a step drafts only while\n"
               "                            the measured costs and acceptance say it is faster (a busy\n"
               "                            batch's verify rows can cost more than the drafts gain)\n"
               "  --http-threads N          HTTP polling threads (default 1)\n"
               "  --max-body-bytes N        request body limit (default 4 MiB)\n"
               CLI_MODEL_OPTS_HELP);
}

/* max_position_embeddings from config.json (0 when unreadable). */
static int model_max_len(const char *dir) {
    char path[4096];
    snprintf(path, sizeof path, "%s/config.json", dir);
    json_t *j = json_load_file(path, 0, NULL);
    json_t *v = j ? json_object_get(j, "max_position_embeddings") : NULL;
    int n = json_is_integer(v) ? (int)json_integer_value(v) : 0;
    json_decref(j);
    return n;
}

static const char *base_name(const char *dir) {
    size_t n = strlen(dir);
    while (n > 1 && dir[n - 1] == '/') n--;
    size_t b = n;
    while (b > 0 && dir[b - 1] != '/') b--;
    static char name[256];
    snprintf(name, sizeof name, "%.*s", (int)(n - b), dir + b);
    return name;
}

static int parse_int_opt(int argc, char **argv, int *i, long min, long max, int *out) {
    const char *v = cli_value(argc, argv, i);
    long n;
    if (!v || cli_int(argv[*i - 1], v, min, max, &n)) return -1;
    *out = (int)n;
    return 0;
}

/* MemAvailable of /proc/meminfo in bytes (0 when unreadable). */
/* The engine's context as planned for these parameters: a GDN state per sequence and
 * the KV pool (by default enough for every sequence at max_model_len). */
static size_t planned_bytes(const qd_model *m, const qd_engine_params *p) {
    const size_t block = p->kv_block_size > 0 ? (size_t)p->kv_block_size : 16;
    const size_t blocks = p->n_kv_blocks > 0 ? (size_t)p->n_kv_blocks
                                             : (size_t)p->max_num_seqs * (((size_t)p->max_model_len + block - 1) / block);
    return (size_t)qd_model_state_bytes(m) * (size_t)p->max_num_seqs +
           blocks * block * (size_t)qd_model_kv_bytes_per_token(m);
}

static size_t kv_pool_bytes(const qd_model *m, const qd_engine_params *p) {
    return planned_bytes(m, p) - (size_t)qd_model_state_bytes(m) * (size_t)p->max_num_seqs;
}

/* The prefix cache's budget when none was given: a share of the memory left once the
 * model is loaded and the context is planned. The cache is exact (outputs are those
 * without it), so the only cost is memory; half of what is left on a GPU (its slots are
 * taken at start), a quarter of the host's available memory on the CPU (pages are
 * committed only as snapshots are taken), each capped, and 0 when nothing is left. */
static size_t auto_prefix_budget(const qd_model *m, const cli_model_opts *mo, const qd_engine_params *p) {
    const size_t planned = planned_bytes(m, p);
    qd_device_info di;
    if (qd_backend_device_info(mo->backend, &di, NULL, 0) != QD_OK) return 0;
    /* slots taken at start (device memory): half of what is left beside the plan, less the
     * forward's scratch and library workspaces (a few percent); committed as written (host
     * pages): a quarter */
    const size_t reserve = di.commits_lazily ? 0 : di.total_bytes / 16;
    const size_t cap = di.commits_lazily ? (size_t)4 << 30 : (size_t)32 << 30, share = di.commits_lazily ? 4 : 2;
    const size_t left = di.free_bytes > planned + reserve ? di.free_bytes - planned - reserve : 0;
    size_t b = left / share;
    return b > cap ? cap : b;
}

static void human(size_t bytes, char *buf, size_t n) {
    if (bytes >= ((size_t)1 << 30)) snprintf(buf, n, "%.1f GiB", (double)bytes / (1 << 30));
    else if (bytes >= ((size_t)1 << 20)) snprintf(buf, n, "%.1f MiB", (double)bytes / (1 << 20));
    else snprintf(buf, n, "%.1f KiB", (double)bytes / 1024);
}

/* One block on stderr once the server is ready: where, what, on what, in how much memory. */
static void print_banner(const srv_server *s, const cli_model_opts *mo, bool prefix_auto) {
    const srv_config *c = &s->cfg;
    const qd_engine_params *p = &c->engine;
    char w[32], st[32], kv[32], pc[32];
    human((size_t)qd_model_weight_bytes(s->model), w, sizeof w);
    human((size_t)qd_model_state_bytes(s->model) * (size_t)p->max_num_seqs, st, sizeof st);
    human(kv_pool_bytes(s->model, p), kv, sizeof kv);
    human(p->prefix_cache_bytes, pc, sizeof pc);
    char backend[64], device[256] = "";
    qd_device_info di;
    const int threads = mo->threads > 0 ? mo->threads : (int)sysconf(_SC_NPROCESSORS_ONLN);
    snprintf(backend, sizeof backend, "%s, %d threads", qd_backend_name(mo->backend), threads);
    if (qd_backend_device_info(mo->backend, &di, NULL, 0) == QD_OK) {
        char fr[32], tot[32];
        human(di.free_bytes, fr, sizeof fr);
        human(di.total_bytes, tot, sizeof tot);
        snprintf(device, sizeof device, "  device     %s, %s free of %s\n", di.name, fr, tot);
    }
    char spec[96] = "";
    if (p->speculative_tokens && p->speculative_draft_vocab)
        snprintf(spec, sizeof spec, ", speculative decoding K=%d (MTP head, drafts among the first %d ids)",
                 p->speculative_tokens, p->speculative_draft_vocab);
    else if (p->speculative_tokens)
        snprintf(spec, sizeof spec, ", speculative decoding K=%d (MTP head)", p->speculative_tokens);
    char prefix[160];
    if (p->prefix_cache_bytes == 0) snprintf(prefix, sizeof prefix, "off");
    else snprintf(prefix, sizeof prefix, "on, %s%s%s", pc, prefix_auto ? " (from the memory left; --no-prefix-cache turns it off)" : "",
                  p->prefix_cache_host_bytes ? " + host tier" : "");
    fprintf(stderr,
            "qdelta serve: ready on http://%s:%d\n"
            "  model      \"%s\" (%s, %s)\n"
            "  backend    %s%s%s%s\n"
            "%s"
            "  memory     weights %s, GDN state %s (%d seqs), KV cache %s (%d tokens each)\n"
            "  prefix cache %s\n",
            c->host, c->port, c->model_name, qd_model_type(s->model), mo->model_dir, backend,
            c->api_key ? ", API key required" : "", p->batch_invariant ? ", batch-invariant" : "", spec, device, w, st,
            p->max_num_seqs, kv, p->max_model_len, prefix);
}

int qd_cmd_serve(int argc, char **argv) {
    cli_model_opts mo = {0};
    srv_server s;
    memset(&s, 0, sizeof s);
    srv_config *c = &s.cfg;
    c->host = "127.0.0.1";
    c->port = 8000;
    char *api_key_buf = NULL; /* from --api-key-file */
    c->http_threads = 1;
    c->max_connections = 4096;
    int max_body = 4 << 20;
    bool prefix_auto = true; /* no --prefix-cache-memory / --no-prefix-cache: a budget from memory left */
    c->engine = qd_engine_default_params();
    c->engine.max_num_seqs = 16;
    c->engine.max_model_len = 0;
    c->engine.max_batch_tokens = 512;
    c->engine.max_waiting = 256;
    for (int i = 1; i < argc; i++) {
        int r = cli_parse_model_opt(&mo, argc, argv, &i);
        if (r < 0) { free(api_key_buf); return 2; }
        if (r > 0) continue;
        const char *a = argv[i];
        int bad = 0;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) { usage(stdout); free(api_key_buf); return 0; }
        else if (!strcmp(a, "--host")) bad = !(c->host = cli_value(argc, argv, &i));
        else if (!strcmp(a, "--port")) bad = parse_int_opt(argc, argv, &i, 0, 65535, &c->port);
        else if (!strcmp(a, "--api-key")) bad = !(c->api_key = cli_value(argc, argv, &i));
        else if (!strcmp(a, "--api-key-file")) {
            const char *path = cli_value(argc, argv, &i);
            free(api_key_buf);
            api_key_buf = path ? cli_read_file(path, NULL) : NULL;
            if (api_key_buf) api_key_buf[strcspn(api_key_buf, "\r\n")] = '\0';
            bad = !api_key_buf || !api_key_buf[0];
            if (api_key_buf && !api_key_buf[0]) fprintf(stderr, "qdelta serve: %s holds no API key\n", path);
            c->api_key = api_key_buf;
        }
        else if (!strcmp(a, "--served-model-name")) bad = !(c->model_name = cli_value(argc, argv, &i));
        else if (!strcmp(a, "--chat-template")) bad = !(c->chat_template = cli_value(argc, argv, &i));
        else if (!strcmp(a, "--max-num-seqs")) bad = parse_int_opt(argc, argv, &i, 1, 65536, &c->engine.max_num_seqs);
        else if (!strcmp(a, "--max-model-len")) bad = parse_int_opt(argc, argv, &i, 2, 1 << 24, &c->engine.max_model_len);
        else if (!strcmp(a, "--max-batch-tokens")) bad = parse_int_opt(argc, argv, &i, 1, 1 << 20, &c->engine.max_batch_tokens);
        else if (!strcmp(a, "--max-step-ms")) {
            int ms = 0;
            bad = parse_int_opt(argc, argv, &i, 0, 60000, &ms);
            c->engine.max_step_ms = ms;
        } else if (!strcmp(a, "--kv-block-size")) bad = parse_int_opt(argc, argv, &i, 1, 4096, &c->engine.kv_block_size);
        else if (!strcmp(a, "--max-waiting")) bad = parse_int_opt(argc, argv, &i, 0, 1 << 20, &c->engine.max_waiting);
        else if (!strcmp(a, "--prefix-cache-memory")) {
            const char *v = cli_value(argc, argv, &i);
            long n;
            bad = !v || cli_int(a, v, 0, LONG_MAX, &n);
            if (!bad) c->engine.prefix_cache_bytes = (size_t)n;
            prefix_auto = false;
        }
        else if (!strcmp(a, "--no-prefix-cache")) {
            c->engine.prefix_cache_bytes = 0;
            prefix_auto = false;
        }
        else if (!strcmp(a, "--prefix-cache-host-memory")) {
            const char *v = cli_value(argc, argv, &i);
            long n;
            bad = !v || cli_int(a, v, 0, LONG_MAX, &n);
            if (!bad) c->engine.prefix_cache_host_bytes = (size_t)n;
        }
        else if (!strcmp(a, "--batch-invariant")) c->engine.batch_invariant = 1;
        else if (!strcmp(a, "--speculative-tokens"))
            bad = parse_int_opt(argc, argv, &i, 0, 4, &c->engine.speculative_tokens);
        else if (!strcmp(a, "--speculative-draft-vocab"))
            bad = parse_int_opt(argc, argv, &i, 0, 1 << 30, &c->engine.speculative_draft_vocab);
        else if (!strcmp(a, "--speculative-always")) c->engine.speculative_always = 1;
        else if (!strcmp(a, "--prefix-snapshot-interval"))
            bad = parse_int_opt(argc, argv, &i, 0, 1 << 24, &c->engine.prefix_snapshot_interval);
        else if (!strcmp(a, "--http-threads")) bad = parse_int_opt(argc, argv, &i, 1, 256, &c->http_threads);
        else if (!strcmp(a, "--max-body-bytes")) bad = parse_int_opt(argc, argv, &i, 1024, 1 << 30, &max_body);
        else { fprintf(stderr, "qdelta serve: unknown option '%s'\n", a); usage(stderr); free(api_key_buf); return 2; }
        if (bad) { free(api_key_buf); return 2; }
    }
    c->max_body = (size_t)max_body;
    if (!cli_default_model(&mo)) { free(api_key_buf); return 2; }
    c->model_dir = mo.model_dir;
    if (!c->model_name) c->model_name = mo.model_name ? mo.model_name : base_name(mo.model_dir);
    if (!c->engine.max_model_len) {
        int m = model_max_len(mo.model_dir);
        c->engine.max_model_len = m > 0 && m < 4096 ? m : 4096;
    }

    /* SIGINT/SIGTERM are taken by sigwait below; block them before any thread starts
     * so that no engine or HTTP thread receives them. A closed client socket must not
     * kill the process. */
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    signal(SIGPIPE, SIG_IGN);

    int rc = 1;
    qd_err err;
    qd_err_clear(&err);
    pthread_rwlock_init(&s.engine_lock, NULL);
    srv_metrics_init(&s.metrics);
    s.created = (long)time(NULL);
    s.model = cli_load_model(&mo);
    if (!s.model) goto done;
    if (cli_load_tokenizer(mo.model_dir, &s.tok)) goto done;
    if (c->chat_template) {
        size_t len;
        char *src = cli_read_file(c->chat_template, &len);
        if (!src) goto done;
        qd_status st = qd_chat_template_compile(src, len, &s.tpl, &err);
        free(src);
        if (st != QD_OK) { fprintf(stderr, "qdelta serve: %s: %s\n", c->chat_template, err.msg); goto done; }
    } else if (qd_chat_template_load_dir(mo.model_dir, &s.tpl, &err) != QD_OK) {
        fprintf(stderr, "qdelta serve: chat template of %s: %s\n", mo.model_dir, err.msg);
        goto done;
    }
    srv_bind_model(&s);
    if (prefix_auto) c->engine.prefix_cache_bytes = auto_prefix_budget(s.model, &mo, &c->engine);
    for (;;) {
        if (qd_engine_create(s.model, &c->engine, &s.engine, &err) == QD_OK) break;
        /* the automatic budget is an estimate: a GPU context that does not fit with it
         * is tried again with a smaller one, then without the cache */
        if (!prefix_auto || c->engine.prefix_cache_bytes == 0) {
            fprintf(stderr, "qdelta serve: engine: %s\n", err.msg);
            goto done;
        }
        c->engine.prefix_cache_bytes = c->engine.prefix_cache_bytes >= ((size_t)64 << 20) ? c->engine.prefix_cache_bytes / 2 : 0;
        qd_err_clear(&err);
    }
    if (srv_start(&s)) goto done;
    print_banner(&s, &mo, prefix_auto);
    /* tests and scripts read the port from this line when they pass --port 0 */
    printf("listening on http://%s:%d\n", c->host, c->port);
    fflush(stdout);
    int sig = 0;
    sigwait(&sigs, &sig);
    fprintf(stderr, "qdelta serve: %s, shutting down\n", sig == SIGINT ? "SIGINT" : "SIGTERM");
    rc = 0;
done:
    srv_stop(&s);
    if (s.engine) qd_engine_free(s.engine); /* only when start failed; srv_stop already freed it */
    qd_chat_template_free(s.tpl);
    qd_tokenizer_free(s.tok);
    qd_model_free(s.model);
    srv_metrics_destroy(&s.metrics);
    pthread_rwlock_destroy(&s.engine_lock);
    free(api_key_buf);
    return rc;
}
