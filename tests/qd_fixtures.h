/* The golden fixtures (tests/fixtures/<model>/, tools/make_fixtures.py and
 * tools/make_gpu_fixtures.py) as the tests walk them: model directories and
 * prompt files in sorted order, token-id files parsed, models loaded. */
#ifndef QD_FIXTURES_H
#define QD_FIXTURES_H

#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "qd_test.h"
#include "qdelta.h"

#define QD_FIXTURES "tests/fixtures"

static inline int qd_fixture_cmp_str(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Whitespace-separated ids in s: up to max into out; returns the count. */
static inline int qd_fixture_parse_ids(const char *s, int32_t *out, int max) {
    int n = 0;
    while (*s && n < max) {
        char *end;
        long v = strtol(s, &end, 10);
        if (end == s) break;
        out[n++] = (int32_t)v;
        s = end;
    }
    return n;
}

/* "tests/fixtures/<name>" for every fixture whose name ends in `suffix` ("" for any) and
 * that holds `marker` (e.g. "config.json"), sorted, strdup'd into dirs (at most max);
 * returns the count (-1: no directory). */
static inline int qd_fixture_dirs_named(const char *suffix, const char *marker, char **dirs, int max) {
    DIR *d = opendir(QD_FIXTURES);
    if (!d) return -1;
    int n = 0;
    struct dirent *e;
    const size_t ls = strlen(suffix);
    while ((e = readdir(d)) && n < max) {
        const size_t len = strlen(e->d_name);
        if (e->d_name[0] == '.' || len < ls || strcmp(e->d_name + len - ls, suffix)) continue;
        char path[1024];
        struct stat st;
        snprintf(path, sizeof path, "%s/%s/%s", QD_FIXTURES, e->d_name, marker);
        if (stat(path, &st) != 0) continue;
        snprintf(path, sizeof path, "%s/%s", QD_FIXTURES, e->d_name);
        dirs[n++] = strdup(path);
    }
    closedir(d);
    qsort(dirs, (size_t)n, sizeof(char *), qd_fixture_cmp_str);
    return n;
}

static inline int qd_fixture_dirs(const char *marker, char **dirs, int max) {
    return qd_fixture_dirs_named("", marker, dirs, max);
}

/* The prompt_<L>.ids file names of a fixture, sorted, strdup'd (at most max). */
static inline int qd_fixture_prompts(const char *dir, char **names, int max) {
    DIR *d = opendir(dir);
    int n = 0;
    struct dirent *e;
    while (d && (e = readdir(d)) && n < max)
        if (!strncmp(e->d_name, "prompt_", 7)) names[n++] = strdup(e->d_name);
    if (d) closedir(d);
    qsort(names, (size_t)n, sizeof(char *), qd_fixture_cmp_str);
    return n;
}

/* Loads the model in dir on a backend with 2 CPU threads (CHECK fails, naming dir and the
 * loader's message, and NULL comes back when it cannot be loaded). */
static inline qd_model *qd_fixture_load(const char *dir, qd_backend_kind backend, int tensor_parallel_size) {
    qd_model_params mp = qd_model_default_params();
    mp.path = dir;
    mp.n_threads = 2;
    mp.backend = backend;
    mp.tensor_parallel_size = tensor_parallel_size;
    qd_model *m = NULL;
    char err[1024];
    const qd_status s = qd_model_load(&mp, &m, err, sizeof err);
    CHECKF(s == QD_OK, "%s: %s", dir, err);
    return s == QD_OK ? m : NULL;
}

#endif
