#include "cli/common.h"

#include <sys/stat.h>

#include "io/safetensors.h"
#include "io/tokenizer.h"

#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

const char *cli_value(int argc, char **argv, int *i) {
    if (*i + 1 >= argc) {
        fprintf(stderr, "qdelta: option %s needs a value\n", argv[*i]);
        return NULL;
    }
    return argv[++*i];
}

int cli_int(const char *opt, const char *v, long min, long max, long *out) {
    char *end;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (errno || end == v || *end || x < min || x > max) {
        fprintf(stderr, "qdelta: %s expects an integer in [%ld, %ld], got '%s'\n", opt, min, max, v);
        return -1;
    }
    *out = x;
    return 0;
}

int cli_double(const char *opt, const char *v, double *out) {
    char *end;
    errno = 0;
    double x = strtod(v, &end);
    if (errno || end == v || *end) {
        fprintf(stderr, "qdelta: %s expects a number, got '%s'\n", opt, v);
        return -1;
    }
    *out = x;
    return 0;
}

int cli_parse_model_opt(cli_model_opts *o, int argc, char **argv, int *i) {
    const char *a = argv[*i];
    if (!strcmp(a, "-m") || !strcmp(a, "--model")) {
        const char *v = cli_value(argc, argv, i);
        if (!v) return -1;
        o->model_dir = v;
        return 1;
    }
    if (!strcmp(a, "--load-format")) {
        const char *v = cli_value(argc, argv, i);
        if (!v) return -1;
        if (!strcmp(v, "dummy")) o->load_format = QD_LOAD_DUMMY;
        else if (!strcmp(v, "dummy-f32")) o->load_format = QD_LOAD_DUMMY_F32;
        else if (!strcmp(v, "auto") || !strcmp(v, "safetensors")) o->load_format = QD_LOAD_AUTO;
        else {
            fprintf(stderr, "qdelta: --load-format expects auto, dummy or dummy-f32, got '%s'\n", v);
            return -1;
        }
        return 1;
    }
    if (!strcmp(a, "--quantization")) {
        const char *v = cli_value(argc, argv, i);
        if (!v) return -1;
        if (!strcmp(v, "fp8")) o->quantization = QD_QUANTIZATION_FP8;
        else if (!strcmp(v, "nvfp4")) o->quantization = QD_QUANTIZATION_NVFP4;
        else if (!strcmp(v, "int4")) o->quantization = QD_QUANTIZATION_INT4;
        else if (!strcmp(v, "none")) o->quantization = QD_QUANTIZATION_NONE;
        else {
            fprintf(stderr, "qdelta: --quantization expects fp8, nvfp4, int4 or none, got '%s'\n", v);
            return -1;
        }
        return 1;
    }
    if (!strcmp(a, "--backend")) {
        const char *v = cli_value(argc, argv, i);
        if (!v) return -1;
        if (qd_backend_parse(v, &o->backend) != QD_OK) {
            fprintf(stderr, "qdelta: --backend expects cpu or cuda, got '%s'\n", v);
            return -1;
        }
        return 1;
    }
    if (!strcmp(a, "-t") || !strcmp(a, "--threads")) {
        const char *v = cli_value(argc, argv, i);
        long n;
        if (!v || cli_int(a, v, 0, 1024, &n)) return -1;
        o->threads = (int)n;
        return 1;
    }
    if (!strcmp(a, "--tensor-parallel-size") || !strcmp(a, "-tp")) {
        const char *v = cli_value(argc, argv, i);
        long n;
        if (!v || cli_int(a, v, 1, 8, &n)) return -1;
        o->tensor_parallel_size = (int)n;
        return 1;
    }
    if (!strcmp(a, "--expert-parallel")) {
        o->expert_parallel = true;
        return 1;
    }
    if (!strcmp(a, "--revision")) {
        if (!(o->revision = cli_value(argc, argv, i))) return -1;
        return 1;
    }
    if (!strcmp(a, "-q") || !strcmp(a, "--quiet")) {
        o->quiet = true;
        return 1;
    }
    return 0;
}

/* The fraction callback of qd_model_load: after the shards are read (below), what is
 * left is binding (and, on a GPU, uploading) the weights; the bar's line is cleared at 1. */
static void progress_bar(float f, void *user) {
    (void)user;
    if (!isatty(STDERR_FILENO)) return;
    if (f >= 1.0f) fputs("\r\033[K", stderr);
    else fputs("\rloading weights...", stderr);
    fflush(stderr);
}

static void fmt_bytes(double b, char *buf, size_t n) {
    if (b >= 1e9) snprintf(buf, n, "%.2f GB", b / 1e9);
    else if (b >= 1e6) snprintf(buf, n, "%.1f MB", b / 1e6);
    else snprintf(buf, n, "%.0f kB", b / 1e3);
}

typedef struct read_progress {
    double t0, last;
    bool tty;
} read_progress;

/* Reading the shards: a bar redrawn at most 10 times a second on a terminal, else one
 * line per shard (logs of a service or CI). Rate and ETA from the bytes read so far. */
static void read_progress_cb(const qd_st_progress *p, void *user) {
    read_progress *r = user;
    const double now = qd_clock_seconds(), dt = now - r->t0;
    const bool end = p->shard_finished && p->shard == p->n_shards;
    if (r->tty && !end && now - r->last < 0.1) return;
    if (!r->tty && !p->shard_finished) return;
    r->last = now;
    const double rate = dt > 0 ? (double)p->bytes_done / dt : 0;
    const double eta = rate > 0 ? (double)(p->bytes_total - p->bytes_done) / rate : 0;
    char done[32], total[32], rt[32];
    fmt_bytes((double)p->bytes_done, done, sizeof done);
    fmt_bytes((double)p->bytes_total, total, sizeof total);
    fmt_bytes(rate, rt, sizeof rt);
    const double f = p->bytes_total ? (double)p->bytes_done / (double)p->bytes_total : 1.0;
    if (r->tty) {
        const int w = 30, n = (int)(f * w + 0.5);
        fprintf(stderr, "\rloading [%.*s%*s] %3d%%  %s / %s  shard %d/%d  %s/s  ETA %.0f s\033[K", n,
                "##############################", w - n, "", (int)(f * 100 + 0.5), done, total, p->shard, p->n_shards, rt, eta);
        if (end) fputc('\n', stderr);
    } else {
        fprintf(stderr, "loading: shard %d/%d read, %s of %s (%d%%), %s/s, ETA %.0f s\n", p->shard, p->n_shards, done,
                total, (int)(f * 100 + 0.5), rt, eta);
    }
    fflush(stderr);
}

/* MemAvailable in bytes (0 when unknown). */
static uint64_t mem_available(void) {
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f) return 0;
    char line[256];
    unsigned long long kb = 0;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1) break;
    fclose(f);
    return (uint64_t)kb * 1024;
}

/* Reads the checkpoint's shards up front with a progress display, when the load is long
 * enough to want one (several shards, or 1 GB and more). The library's own mapping then
 * finds the pages resident. Skipped when the files do not fit in the memory available
 * (they would be read twice); a checkpoint that cannot be opened is left to
 * qd_model_load, which names the problem. */
static void read_shards(const cli_model_opts *o) {
    qd_safetensors *st = NULL;
    qd_err err;
    qd_err_clear(&err);
    if (qd_st_open_dir(o->model_dir, &st, &err) != QD_OK) return;
    const uint64_t total = qd_st_total_bytes(st);
    const int n = qd_st_file_count(st);
    if (n > 1 || total >= 1000000000ull) {
        const uint64_t avail = mem_available();
        if (avail && total > avail / 10 * 8) {
            char t[32];
            fmt_bytes((double)total, t, sizeof t);
            fprintf(stderr, "loading: %d shards, %s (more than the memory available: read as the weights are used)\n", n, t);
        } else {
            read_progress r = {.t0 = qd_clock_seconds(), .tty = isatty(STDERR_FILENO)};
            if (qd_st_prefetch(st, 0, read_progress_cb, &r, &err) == QD_OK && !r.tty) {
                char t[32];
                fmt_bytes((double)total, t, sizeof t);
                fprintf(stderr, "loading: %d shard%s, %s read in %.1f s\n", n, n == 1 ? "" : "s", t, qd_clock_seconds() - r.t0);
            }
        }
    }
    qd_st_close(st);
}

qd_model *cli_load_model(const cli_model_opts *o) {
    if (!o->model_dir) {
        fprintf(stderr, "qdelta: no model given (use -m DIR)\n");
        return NULL;
    }
    if (!o->quiet && o->load_format == QD_LOAD_AUTO) read_shards(o);
    qd_model_params mp = qd_model_default_params();
    mp.path = o->model_dir;
    mp.load_format = o->load_format;
    mp.backend = o->backend;
    mp.n_threads = o->threads;
    mp.tensor_parallel_size = o->tensor_parallel_size;
    mp.expert_parallel = o->expert_parallel;
    mp.quantization = o->quantization;
    if (!o->quiet) mp.progress = progress_bar;
    qd_model *m;
    char err[1024];
    qd_status s = qd_model_load(&mp, &m, err, sizeof err);
    if (s != QD_OK) {
        fprintf(stderr, "qdelta: cannot load model from %s: %s (%s)\n", o->model_dir, err, qd_status_name(s));
        return NULL;
    }
    return m;
}

int cli_parse_ids(const char *text, const char *what, int32_t **ids, int *n) {
    int cap = 64, cnt = 0;
    int32_t *v = malloc(sizeof(int32_t) * cap);
    if (!v) return -1;
    const char *p = text;
    for (;;) {
        while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r' || *p == ',') p++;
        if (!*p) break;
        char *end;
        errno = 0;
        long long x = strtoll(p, &end, 10);
        if (end == p || errno || x < 0 || x > INT32_MAX ||
            (*end && *end != ' ' && *end != '\t' && *end != '\n' && *end != '\r' && *end != ',')) {
            int len = 0;
            while (p[len] && p[len] != ' ' && p[len] != '\n' && len < 20) len++;
            fprintf(stderr, "qdelta: %s: '%.*s' is not a token id (expected non-negative integers)\n", what, len, p);
            free(v);
            return -1;
        }
        if (cnt == cap) {
            cap *= 2;
            int32_t *nv = realloc(v, sizeof(int32_t) * cap);
            if (!nv) { free(v); return -1; }
            v = nv;
        }
        v[cnt++] = (int32_t)x;
        p = end;
    }
    *ids = v;
    *n = cnt;
    return 0;
}

char *cli_read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "qdelta: cannot open %s: %s\n", path, strerror(errno));
        return NULL;
    }
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap + 1);
    while (buf) {
        size_t r = fread(buf + n, 1, cap - n, f);
        n += r;
        if (n < cap) break;
        cap *= 2;
        char *nb = realloc(buf, cap + 1);
        if (!nb) { free(buf); buf = NULL; break; }
        buf = nb;
    }
    int bad = ferror(f);
    fclose(f);
    if (!buf || bad) {
        fprintf(stderr, "qdelta: cannot read %s\n", path);
        free(buf);
        return NULL;
    }
    buf[n] = '\0';
    if (len) *len = n;
    return buf;
}

#ifndef QD_DEFAULT_MODEL_DIR
#define QD_DEFAULT_MODEL_DIR "models/qdelta-tiny"
#endif
#ifndef QD_INSTALL_MODEL_DIR
#define QD_INSTALL_MODEL_DIR "/usr/local/share/qdelta/models/qdelta-tiny"
#endif

static bool is_dir(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

static bool has_config(const char *dir) {
    char path[4200];
    struct stat st;
    snprintf(path, sizeof path, "%s/config.json", dir);
    return stat(path, &st) == 0;
}

/* The directory of the running executable (from /proc/self/exe, so a moved or
 * installed binary finds what lies beside it); false when unknown. */
static bool exe_dir(char *out, size_t n) {
    ssize_t len = readlink("/proc/self/exe", out, n - 1);
    if (len <= 0 || (size_t)len >= n - 1) return false;
    out[len] = '\0';
    char *slash = strrchr(out, '/');
    if (!slash) return false;
    *slash = '\0';
    return true;
}

void cli_hf_hub_cache(char *out, size_t n) {
    const char *v;
    if ((v = getenv("HF_HUB_CACHE")) && *v) snprintf(out, n, "%s", v);
    else if ((v = getenv("HUGGINGFACE_HUB_CACHE")) && *v) snprintf(out, n, "%s", v); /* older name */
    else if ((v = getenv("HF_HOME")) && *v) snprintf(out, n, "%s/hub", v);
    else if ((v = getenv("XDG_CACHE_HOME")) && *v) snprintf(out, n, "%s/huggingface/hub", v);
    else snprintf(out, n, "%s/.cache/huggingface/hub", (v = getenv("HOME")) && *v ? v : "");
}

/* ORG/NAME as the hub spells repository ids: two non-empty parts of [A-Za-z0-9._-],
 * neither starting with '.' (so ./x and ../x stay paths). */
static bool is_repo_id(const char *s) {
    const char *slash = strchr(s, '/');
    if (!slash || slash == s || !slash[1] || strchr(slash + 1, '/')) return false;
    if (s[0] == '.' || slash[1] == '.') return false;
    for (const char *p = s; *p; p++)
        if (p != slash && !((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') ||
                            *p == '.' || *p == '_' || *p == '-'))
            return false;
    return true;
}

/* A revision as a file name under refs/ or snapshots/: no "..", no leading '/'. */
static bool safe_revision(const char *r) {
    return r[0] && r[0] != '/' && !strstr(r, "..") && strlen(r) < 256;
}

/* The snapshot of repo id NAME at REV in the hub cache, laid out as huggingface_hub
 * writes it: models--ORG--NAME/refs/REV holds a commit hash, snapshots/HASH/ the files
 * (symlinks into blobs/); REV may also be a commit hash itself. */
static bool hf_resolve(cli_model_opts *o, const char *name) {
    const char *rev = o->revision ? o->revision : "main";
    char hub[2048], repo[3072], path[3400];
    cli_hf_hub_cache(hub, sizeof hub);
    int k = snprintf(repo, sizeof repo, "%s/models--", hub);
    for (const char *p = name; *p && k < (int)sizeof repo - 3; p++) {
        if (*p == '/') { repo[k++] = '-'; repo[k++] = '-'; }
        else repo[k++] = *p;
    }
    repo[k] = '\0';
    if (!safe_revision(rev)) {
        fprintf(stderr, "qdelta: --revision '%s' is not a branch, tag or commit name\n", rev);
        return false;
    }
    snprintf(path, sizeof path, "%s/snapshots/%s", repo, rev);
    if (!is_dir(path)) {
        char ref[3400];
        snprintf(ref, sizeof ref, "%s/refs/%s", repo, rev);
        FILE *f = fopen(ref, "r");
        char hash[128] = "";
        if (f) {
            if (!fgets(hash, sizeof hash, f)) hash[0] = '\0';
            fclose(f);
            hash[strcspn(hash, " \t\r\n")] = '\0';
        }
        if (!f || !hash[0] || !safe_revision(hash)) {
            fprintf(stderr,
                    "qdelta: model '%s' is not a directory, and revision '%s' of it is not in the Hugging Face cache "
                    "%s (no %s%s)\n"
                    "  The cache is HF_HUB_CACHE, else HF_HOME/hub, else ~/.cache/huggingface/hub. This build downloads "
                    "nothing: fetch it first (e.g. `huggingface-cli download %s%s%s`) or pass its directory.\n",
                    name, rev, hub, ref, f ? " holding a commit hash" : "", name, o->revision ? " --revision " : "",
                    o->revision ? o->revision : "");
            return false;
        }
        snprintf(path, sizeof path, "%s/snapshots/%s", repo, hash);
        if (!is_dir(path)) {
            fprintf(stderr, "qdelta: model '%s': %s names commit %s, but the cache has no %s (an interrupted download?)\n",
                    name, ref, hash, path);
            return false;
        }
    }
    snprintf(o->resolved, sizeof o->resolved, "%s", path);
    o->model_dir = o->resolved;
    o->model_name = name;
    return true;
}

bool cli_default_model(cli_model_opts *o) {
    if (o->model_dir) {
        if (is_dir(o->model_dir) || !is_repo_id(o->model_dir)) {
            if (o->revision) {
                fprintf(stderr, "qdelta: --revision applies to a model name in the Hugging Face cache, "
                                "and '%s' is a directory\n", o->model_dir);
                return false;
            }
            return true; /* a path: used as it is (a missing one fails at load, naming it) */
        }
        return hf_resolve(o, o->model_dir);
    }
    /* the default model: installed (PREFIX/bin/qdelta -> PREFIX/share/qdelta/models), a
     * build tree inside the source tree (build/qdelta -> models/), then the install
     * prefix and the source tree this binary was compiled from */
    char dir[4096], installed[4200] = "", build[4200] = "";
    if (exe_dir(dir, sizeof dir)) {
        snprintf(installed, sizeof installed, "%s/../share/qdelta/models/qdelta-tiny", dir);
        snprintf(build, sizeof build, "%s/../models/qdelta-tiny", dir);
    }
    const char *cand[4] = {installed, build, QD_INSTALL_MODEL_DIR, QD_DEFAULT_MODEL_DIR};
    for (int i = 0; i < 4; i++) {
        if (!cand[i][0] || !has_config(cand[i])) continue;
        /* without the "..": it names the model in messages and the served model id */
        if (!realpath(cand[i], o->resolved)) snprintf(o->resolved, sizeof o->resolved, "%s", cand[i]);
        o->model_dir = o->resolved;
        return true;
    }
    fprintf(stderr, "qdelta: no model given (-m DIR or -m ORG/NAME) and the embedded default model is in none of:");
    for (int i = 0; i < 4; i++)
        if (cand[i][0]) fprintf(stderr, " %s", cand[i]);
    fprintf(stderr, "\n");
    return false;
}

int cli_load_tokenizer(const char *dir, qd_tokenizer **out) {
    qd_err err;
    qd_err_clear(&err);
    if (qd_tokenizer_load_dir(dir, out, &err) != QD_OK) {
        fprintf(stderr, "qdelta: tokenizer of %s: %s\n", dir, err.msg);
        return -1;
    }
    return 0;
}

int cli_tokenize(const qd_tokenizer *tok, const char *text, size_t len, int32_t **ids, int *n) {
    qd_err err;
    qd_err_clear(&err);
    size_t cnt = 0;
    *ids = NULL;
    if (qd_tokenizer_encode(tok, text, len, 0, ids, &cnt, &err) != QD_OK) {
        fprintf(stderr, "qdelta: tokenize: %s\n", err.msg);
        return -1;
    }
    if (cnt > INT32_MAX) { free(*ids); *ids = NULL; fprintf(stderr, "qdelta: text too long\n"); return -1; }
    *n = (int)cnt;
    return 0;
}
