#include "cli/common.h"

#include <sys/stat.h>

#include "io/tokenizer.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

double cli_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

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
    if (!strcmp(a, "-q") || !strcmp(a, "--quiet")) {
        o->quiet = true;
        return 1;
    }
    return 0;
}

static void progress_bar(float f, void *user) {
    (void)user;
    if (!isatty(STDERR_FILENO)) return;
    int w = 30, n = (int)(f * w + 0.5f);
    fprintf(stderr, "\rloading [%.*s%*s] %3d%%", n, "##############################", w - n, "", (int)(f * 100 + 0.5f));
    if (f >= 1.0f) fputs("\r\033[K", stderr);
    fflush(stderr);
}

qd_model *cli_load_model(const cli_model_opts *o) {
    if (!o->model_dir) {
        fprintf(stderr, "qdelta: no model given (use -m DIR)\n");
        return NULL;
    }
    qd_model_params mp = qd_model_default_params();
    mp.path = o->model_dir;
    mp.load_format = o->load_format;
    mp.backend = o->backend;
    mp.n_threads = o->threads;
    mp.tensor_parallel_size = o->tensor_parallel_size;
    mp.expert_parallel = o->expert_parallel;
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

bool cli_default_model(cli_model_opts *o) {
    if (o->model_dir) return true;
    struct stat st;
    char path[4096];
    snprintf(path, sizeof path, "%s/config.json", QD_DEFAULT_MODEL_DIR);
    if (stat(path, &st) != 0) {
        fprintf(stderr, "qdelta: no model given (-m DIR) and the embedded default model is not at %s\n",
                QD_DEFAULT_MODEL_DIR);
        return false;
    }
    o->model_dir = QD_DEFAULT_MODEL_DIR;
    return true;
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
