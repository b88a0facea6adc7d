/* safetensors reader: mmap each file read-only, validate its header completely, and
 * expose the tensors through one name -> tensor hash table across all shards.
 *
 * File layout: u64 little-endian header length N, N bytes of JSON, then the data area.
 * The JSON maps tensor name -> {dtype, shape, data_offsets:[begin,end]} (offsets
 * relative to the data area), plus an optional "__metadata__" object of strings.
 * Every field comes from an untrusted file, so every value is checked before use and
 * every message names the file and, where there is one, the tensor. */
#include "io/safetensors.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "io/json_util.h"

/* Real headers are a few MB at most (50k tensors x ~100 bytes); anything far larger
 * is a corrupt length field, and parsing it would only waste memory. */
#define ST_MAX_HEADER (100u * 1000u * 1000u)
#define ST_MAX_INDEX_BYTES (256u * 1024u * 1024u)
#define ST_INDEX_NAME "model.safetensors.index.json"

typedef struct st_file {
    char *name;              /* path (or caller's label for memory images) */
    void *map;               /* mmap base; NULL for memory images */
    size_t map_len;
} st_file;

struct qd_safetensors {
    st_file *files;
    int n_files;
    qd_st_tensor *tensors;
    int n_tensors, cap_tensors;
    int32_t *table;          /* open addressing: tensor index or -1 */
    size_t table_mask;
};

/* --------------------------------------------------------------- helpers */

static uint64_t hash_name(const char *s) {
    uint64_t h = 1469598103934665603ull;   /* FNV-1a: simple, good enough for names */
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

static qd_status add_file(qd_safetensors *st, const char *name, int *index, qd_err *err) {
    st_file *f = realloc(st->files, sizeof *f * (size_t)(st->n_files + 1));
    if (!f) return qd_seterr(err, QD_ERR_OOM, "%s: out of memory", name);
    st->files = f;
    f[st->n_files] = (st_file){.name = strdup(name)};
    if (!f[st->n_files].name) return qd_seterr(err, QD_ERR_OOM, "%s: out of memory", name);
    *index = st->n_files++;
    return QD_OK;
}

static int cmp_offset(const void *a, const void *b) {
    const qd_st_tensor *x = a, *y = b;
    const char *px = x->data, *py = y->data;
    if (px != py) return px < py ? -1 : 1;
    return x->n_bytes < y->n_bytes ? -1 : x->n_bytes > y->n_bytes;
}

static qd_status parse_shape(const json_t *shape, qd_st_tensor *t, const char *file, qd_err *err) {
    if (!json_is_array(shape))
        return qd_seterr(err, QD_ERR_FORMAT, "%s: tensor '%s': \"shape\" must be an array, got %s", file, t->name,
                         shape ? qd_json_type_name(shape) : "nothing");
    size_t nd = json_array_size(shape);
    if (nd > QD_ST_MAX_DIMS)
        return qd_seterr(err, QD_ERR_UNSUPPORTED, "%s: tensor '%s': %zu dimensions, at most %d supported", file,
                         t->name, nd, QD_ST_MAX_DIMS);
    int64_t n = 1;
    bool overflow = false;
    for (size_t i = 0; i < nd; i++) {
        const json_t *d = json_array_get(shape, i);
        if (!json_is_integer(d))
            return qd_seterr(err, QD_ERR_FORMAT, "%s: tensor '%s': shape[%zu] must be an integer, got %s", file,
                             t->name, i, qd_json_type_name(d));
        json_int_t v = json_integer_value(d);
        if (v < 0)
            return qd_seterr(err, QD_ERR_FORMAT, "%s: tensor '%s': shape[%zu] = %lld is negative", file, t->name, i,
                             (long long)v);
        t->shape[i] = v;
        /* Keep multiplying after an overflow is impossible to detect later, so note it
         * (a later zero dimension would make the product legitimately 0). */
        if (v != 0 && n > INT64_MAX / v) overflow = true;
        else n *= v;
    }
    bool has_zero = false;
    for (size_t i = 0; i < nd; i++) has_zero |= t->shape[i] == 0;
    if (has_zero) n = 0;
    else if (overflow)
        return qd_seterr(err, QD_ERR_FORMAT, "%s: tensor '%s': element count overflows", file, t->name);
    t->ndim = (int)nd;
    t->n_elements = n;
    return QD_OK;
}

/* Validates one tensor entry; `data`/`data_len` is the file's data area. */
static qd_status parse_entry(const char *name, const json_t *v, const unsigned char *data, size_t data_len,
                             const char *file, qd_st_tensor *t, qd_err *err) {
    if (!json_is_object(v))
        return qd_seterr(err, QD_ERR_FORMAT, "%s: tensor '%s': entry must be an object, got %s", file, name,
                         qd_json_type_name(v));
    const json_t *jd = json_object_get(v, "dtype");
    if (!json_is_string(jd))
        return qd_seterr(err, QD_ERR_FORMAT, "%s: tensor '%s': \"dtype\" must be a string", file, name);
    int dt = qd_dtype_parse(json_string_value(jd));
    if (dt < 0)
        return qd_seterr(err, QD_ERR_UNSUPPORTED, "%s: tensor '%s': unsupported dtype '%.40s'", file, name,
                         json_string_value(jd));
    t->dtype = (qd_dtype)dt;
    QD_TRY(parse_shape(json_object_get(v, "shape"), t, file, err));

    const json_t *off = json_object_get(v, "data_offsets");
    if (!json_is_array(off) || json_array_size(off) != 2 || !json_is_integer(json_array_get(off, 0)) ||
        !json_is_integer(json_array_get(off, 1)))
        return qd_seterr(err, QD_ERR_FORMAT, "%s: tensor '%s': \"data_offsets\" must be [begin, end] integers",
                         file, name);
    json_int_t b = json_integer_value(json_array_get(off, 0)), e = json_integer_value(json_array_get(off, 1));
    if (b < 0 || e < b)
        return qd_seterr(err, QD_ERR_FORMAT, "%s: tensor '%s': bad data_offsets [%lld, %lld]", file, name,
                         (long long)b, (long long)e);
    if ((unsigned long long)e > data_len)
        return qd_seterr(err, QD_ERR_FORMAT, "%s: tensor '%s': data_offsets [%lld, %lld] beyond the %zu-byte data area",
                         file, name, (long long)b, (long long)e, data_len);
    size_t esz = qd_dtype_size(t->dtype);
    if ((uint64_t)t->n_elements > SIZE_MAX / esz || (uint64_t)t->n_elements * esz != (uint64_t)(e - b))
        return qd_seterr(err, QD_ERR_FORMAT,
                         "%s: tensor '%s': %lld bytes stored but shape x %s needs %lld elements x %zu bytes", file,
                         name, (long long)(e - b), qd_dtype_name(t->dtype), (long long)t->n_elements, esz);
    t->n_bytes = (size_t)(e - b);
    t->data = data + b;
    return QD_OK;
}

static qd_status check_metadata(const json_t *md, const char *file, qd_err *err) {
    if (!json_is_object(md))
        return qd_seterr(err, QD_ERR_FORMAT, "%s: \"__metadata__\" must be an object, got %s", file,
                         qd_json_type_name(md));
    const char *k;
    const json_t *v;
    json_object_foreach((json_t *)md, k, v) {
        if (!json_is_string(v))
            return qd_seterr(err, QD_ERR_FORMAT, "%s: \"__metadata__\" value '%.100s' must be a string, got %s", file, k,
                             qd_json_type_name(v));
    }
    return QD_OK;
}

/* Parses the image of one file (header + data) and appends its tensors, sorted by
 * offset (the order a loader reads them in), to st->tensors. */
static qd_status parse_image(qd_safetensors *st, int file_index, const unsigned char *buf, size_t len, qd_err *err) {
    const char *file = st->files[file_index].name;
    if (len < 8) return qd_seterr(err, QD_ERR_FORMAT, "%s: %zu bytes, shorter than the 8-byte header length", file, len);
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = hlen << 8 | buf[i];
    if (hlen > len - 8)
        return qd_seterr(err, QD_ERR_FORMAT, "%s: header length %llu exceeds the file size %zu", file,
                         (unsigned long long)hlen, len);
    if (hlen > ST_MAX_HEADER)
        return qd_seterr(err, QD_ERR_FORMAT, "%s: header length %llu is absurd (limit %u)", file,
                         (unsigned long long)hlen, ST_MAX_HEADER);
    json_t *root;
    QD_TRY(qd_json_parse((const char *)buf + 8, (size_t)hlen, file, &root, err));
    if (!json_is_object(root)) {
        qd_seterr(err, QD_ERR_FORMAT, "%s: header must be a JSON object, got %s", file, qd_json_type_name(root));
        json_decref(root);
        return QD_ERR_FORMAT;
    }
    const unsigned char *data = buf + 8 + hlen;
    size_t data_len = len - 8 - (size_t)hlen;
    size_t n = json_object_size(root);
    if ((size_t)st->n_tensors + n > (size_t)INT32_MAX / 2) {
        json_decref(root);
        return qd_seterr(err, QD_ERR_UNSUPPORTED, "%s: too many tensors", file);
    }
    if (st->n_tensors + (int)n > st->cap_tensors) {
        int cap = st->cap_tensors * 2 > st->n_tensors + (int)n ? st->cap_tensors * 2 : st->n_tensors + (int)n;
        qd_st_tensor *nt = realloc(st->tensors, sizeof *nt * (size_t)cap);
        if (!nt) {
            json_decref(root);
            return qd_seterr(err, QD_ERR_OOM, "%s: out of memory for %zu tensors", file, n);
        }
        st->tensors = nt;
        st->cap_tensors = cap;
    }
    int first = st->n_tensors;
    qd_status s = QD_OK;
    const char *key;
    json_t *val;
    json_object_foreach(root, key, val) {
        if (strcmp(key, "__metadata__") == 0) {
            if ((s = check_metadata(val, file, err)) != QD_OK) break;
            continue;
        }
        qd_st_tensor *t = &st->tensors[st->n_tensors];
        memset(t, 0, sizeof *t);
        t->file_index = file_index;
        t->name = strdup(key);
        if (!t->name) { s = qd_seterr(err, QD_ERR_OOM, "%s: out of memory", file); break; }
        st->n_tensors++; /* counted now so qd_st_close frees the name on any error below */
        if ((s = parse_entry(key, val, data, data_len, file, t, err)) != QD_OK) break;
    }
    json_decref(root);
    if (s != QD_OK) return s;

    /* Overlap check: sorted by start, every non-empty tensor must begin at or after
     * the end of the previous non-empty one. Empty tensors own no bytes. */
    int cnt = st->n_tensors - first;
    if (cnt == 0) return QD_OK;  /* st->tensors may still be NULL */
    qd_st_tensor *ts = st->tensors + first;
    qsort(ts, (size_t)cnt, sizeof *ts, cmp_offset);
    const qd_st_tensor *prev = NULL;
    for (int i = 0; i < cnt; i++) {
        if (ts[i].n_bytes == 0) continue;
        if (prev && (const char *)ts[i].data < (const char *)prev->data + prev->n_bytes)
            return qd_seterr(err, QD_ERR_FORMAT, "%s: tensors '%s' and '%s' overlap in the data area", file,
                             prev->name, ts[i].name);
        prev = &ts[i];
    }
    /* The format aligns only its header: a tensor after one of an odd byte count (an FP8
     * scale vector, a packed 4-bit weight) can start at any address. Such a tensor of a
     * wider dtype is read from an aligned copy, so every reader may load whole elements. */
    for (int i = 0; i < cnt; i++) {
        const size_t es = qd_dtype_size(ts[i].dtype);
        if (ts[i].n_bytes == 0 || es <= 1 || (uintptr_t)ts[i].data % es == 0) continue;
        ts[i].copy = malloc(ts[i].n_bytes);
        if (!ts[i].copy)
            return qd_seterr(err, QD_ERR_OOM, "%s: out of memory for an aligned copy of tensor '%s' (%zu bytes)", file,
                             ts[i].name, ts[i].n_bytes);
        memcpy(ts[i].copy, ts[i].data, ts[i].n_bytes);
        ts[i].data = ts[i].copy;
    }
    return QD_OK;
}

/* Builds the name table; a name seen twice (only possible across shards, since the
 * JSON parser rejects duplicate keys within a file) is an error naming both files. */
static qd_status build_table(qd_safetensors *st, qd_err *err) {
    size_t cap = 16;
    while (cap < (size_t)st->n_tensors * 2) cap <<= 1;
    st->table = malloc(sizeof *st->table * cap);
    if (!st->table) return qd_seterr(err, QD_ERR_OOM, "out of memory for the tensor table");
    memset(st->table, 0xff, sizeof *st->table * cap);
    st->table_mask = cap - 1;
    for (int i = 0; i < st->n_tensors; i++) {
        size_t h = (size_t)hash_name(st->tensors[i].name) & st->table_mask;
        while (st->table[h] >= 0) {
            const qd_st_tensor *o = &st->tensors[st->table[h]];
            if (strcmp(o->name, st->tensors[i].name) == 0)
                return qd_seterr(err, QD_ERR_FORMAT, "tensor '%s' appears in both %s and %s", o->name,
                                 st->files[o->file_index].name, st->files[st->tensors[i].file_index].name);
            h = (h + 1) & st->table_mask;
        }
        st->table[h] = i;
    }
    return QD_OK;
}

static qd_safetensors *st_new(qd_err *err) {
    qd_safetensors *st = calloc(1, sizeof *st);
    if (!st) qd_seterr(err, QD_ERR_OOM, "out of memory");
    return st;
}

static qd_status map_file(qd_safetensors *st, const char *path, qd_err *err) {
    int fi = 0;
    QD_TRY(add_file(st, path, &fi, err));
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return qd_seterr(err, errno == ENOENT ? QD_ERR_NOT_FOUND : QD_ERR_IO, "%s: cannot open: %s", path,
                         strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        close(fd);
        return qd_seterr(err, QD_ERR_IO, "%s: not a regular file", path);
    }
    size_t len = (size_t)sb.st_size;
    if (len < 8) {
        close(fd);
        return qd_seterr(err, QD_ERR_FORMAT, "%s: %zu bytes, shorter than the 8-byte header length", path, len);
    }
    void *m = mmap(NULL, len, PROT_READ, MAP_PRIVATE, fd, 0);
    int e = errno;
    close(fd); /* the mapping keeps the file alive */
    if (m == MAP_FAILED) return qd_seterr(err, QD_ERR_IO, "%s: mmap failed: %s", path, strerror(e));
    st->files[fi].map = m;
    st->files[fi].map_len = len;
    return parse_image(st, fi, m, len, err);
}

/* ------------------------------------------------------------------ API */

void qd_st_close(qd_safetensors *st) {
    if (!st) return;
    for (int i = 0; i < st->n_tensors; i++) {
        free(st->tensors[i].name);
        free(st->tensors[i].copy);
    }
    for (int i = 0; i < st->n_files; i++) {
        if (st->files[i].map) munmap(st->files[i].map, st->files[i].map_len);
        free(st->files[i].name);
    }
    free(st->files);
    free(st->tensors);
    free(st->table);
    free(st);
}

static qd_status finish(qd_safetensors *st, qd_status s, qd_safetensors **out, qd_err *err) {
    if (s == QD_OK) s = build_table(st, err);
    if (s != QD_OK) {
        qd_st_close(st);
        return s;
    }
    *out = st;
    return QD_OK;
}

qd_status qd_st_open_memory(const void *buf, size_t len, const char *what, qd_safetensors **out, qd_err *err) {
    *out = NULL;
    if (!what) what = "<memory>";
    if (!buf && len) return qd_seterr(err, QD_ERR_INVALID_ARG, "%s: NULL buffer", what);
    qd_safetensors *st = st_new(err);
    if (!st) return QD_ERR_OOM;
    int fi = 0;
    qd_status s = add_file(st, what, &fi, err);
    if (s == QD_OK) s = parse_image(st, fi, buf, len, err);
    return finish(st, s, out, err);
}

qd_status qd_st_open_file(const char *path, qd_safetensors **out, qd_err *err) {
    *out = NULL;
    qd_safetensors *st = st_new(err);
    if (!st) return QD_ERR_OOM;
    return finish(st, map_file(st, path, err), out, err);
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static char *join_path(const char *dir, const char *name) {
    size_t n = strlen(dir) + strlen(name) + 2;
    char *p = malloc(n);
    if (p) snprintf(p, n, "%s/%s", dir, name);
    return p;
}

/* Shard names come from a file; refuse ones that would escape the directory. */
static bool safe_shard_name(const char *s) {
    if (!*s || s[0] == '/') return false;
    for (const char *p = s; *p;) {
        const char *q = strchr(p, '/');
        size_t n = q ? (size_t)(q - p) : strlen(p);
        if (n == 2 && p[0] == '.' && p[1] == '.') return false;
        p += n + (q ? 1 : 0);
    }
    return true;
}

static qd_status open_index(qd_safetensors *st, const char *dir, const char *index_path, qd_err *err) {
    char *text;
    size_t len;
    QD_TRY(qd_read_file(index_path, ST_MAX_INDEX_BYTES, &text, &len, err));
    json_t *root;
    qd_status s = qd_json_parse(text, len, index_path, &root, err);
    free(text);
    if (s != QD_OK) return s;
    const json_t *wm = json_is_object(root) ? json_object_get(root, "weight_map") : NULL;
    const char **names = NULL;  /* distinct shard names, borrowed from `root` */
    size_t n_names = 0;
    if (!json_is_object(wm)) {
        s = qd_seterr(err, QD_ERR_FORMAT, "%s: \"weight_map\" must be an object", index_path);
        goto done;
    }
    if (json_object_size(wm) == 0) {
        s = qd_seterr(err, QD_ERR_NOT_FOUND, "%s: \"weight_map\" lists no tensors", index_path);
        goto done;
    }
    names = malloc(sizeof *names * json_object_size(wm));
    if (!names) { s = qd_seterr(err, QD_ERR_OOM, "%s: out of memory", index_path); goto done; }
    const char *tname;
    const json_t *fv;
    json_object_foreach((json_t *)wm, tname, fv) {
        if (!json_is_string(fv) || !safe_shard_name(json_string_value(fv))) {
            s = qd_seterr(err, QD_ERR_FORMAT, "%s: tensor '%s': shard must be a file name inside the directory",
                          index_path, tname);
            goto done;
        }
        names[n_names++] = json_string_value(fv);
    }
    /* Open every shard once, in name order. */
    qsort(names, n_names, sizeof *names, cmp_str);
    for (size_t i = 0; i < n_names; i++) {
        if (i && strcmp(names[i], names[i - 1]) == 0) continue;
        char *p = join_path(dir, names[i]);
        if (!p) { s = qd_seterr(err, QD_ERR_OOM, "out of memory"); goto done; }
        s = map_file(st, p, err);
        free(p);
        if (s != QD_OK) {
            qd_err_prefix(err, "%s lists shard %s", index_path, names[i]);
            goto done;
        }
    }
    if ((s = build_table(st, err)) != QD_OK) goto done;
    /* Every tensor the index promises must be in the shard it names. */
    json_object_foreach((json_t *)wm, tname, fv) {
        const qd_st_tensor *t = qd_st_find(st, tname);
        const char *want = json_string_value(fv);
        if (!t) {
            s = qd_seterr(err, QD_ERR_NOT_FOUND, "%s: tensor '%s' is listed in shard %s but missing from it", index_path,
                          tname, want);
            goto done;
        }
        const char *got = st->files[t->file_index].name;
        size_t gl = strlen(got), wl = strlen(want);
        if (gl < wl || strcmp(got + gl - wl, want) != 0 || (gl > wl && got[gl - wl - 1] != '/')) {
            s = qd_seterr(err, QD_ERR_NOT_FOUND, "%s: tensor '%s' is listed in shard %s but found in %s", index_path,
                          tname, want, got);
            goto done;
        }
    }
done:
    free(names);
    json_decref(root);
    return s;
}

static bool has_suffix(const char *s, const char *suf) {
    size_t n = strlen(s), m = strlen(suf);
    return n >= m && strcmp(s + n - m, suf) == 0;
}

static qd_status open_all_in_dir(qd_safetensors *st, const char *dir, qd_err *err) {
    DIR *d = opendir(dir);
    if (!d) return qd_seterr(err, errno == ENOENT ? QD_ERR_NOT_FOUND : QD_ERR_IO, "%s: cannot open directory: %s", dir,
                             strerror(errno));
    char **names = NULL;
    size_t n = 0, cap = 0;
    qd_status s = QD_OK;
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        if (!has_suffix(de->d_name, ".safetensors") || de->d_name[0] == '.') continue;
        if (n == cap) {
            cap = cap ? cap * 2 : 8;
            char **nn = realloc(names, sizeof *nn * cap);
            if (!nn) { s = qd_seterr(err, QD_ERR_OOM, "out of memory"); break; }
            names = nn;
        }
        if (!(names[n] = strdup(de->d_name))) { s = qd_seterr(err, QD_ERR_OOM, "out of memory"); break; }
        n++;
    }
    closedir(d);
    if (s == QD_OK && n == 0)
        s = qd_seterr(err, QD_ERR_NOT_FOUND, "%s: no *.safetensors files and no %s", dir, ST_INDEX_NAME);
    if (s == QD_OK) qsort(names, n, sizeof *names, cmp_str);
    for (size_t i = 0; s == QD_OK && i < n; i++) {
        char *p = join_path(dir, names[i]);
        if (!p) { s = qd_seterr(err, QD_ERR_OOM, "out of memory"); break; }
        s = map_file(st, p, err);
        free(p);
    }
    for (size_t i = 0; i < n; i++) free(names[i]);
    free(names);
    return s;
}

qd_status qd_st_open_dir(const char *dir, qd_safetensors **out, qd_err *err) {
    *out = NULL;
    qd_safetensors *st = st_new(err);
    if (!st) return QD_ERR_OOM;
    char *index_path = join_path(dir, ST_INDEX_NAME);
    if (!index_path) { qd_st_close(st); return qd_seterr(err, QD_ERR_OOM, "out of memory"); }
    qd_status s;
    if (access(index_path, F_OK) == 0) {
        s = open_index(st, dir, index_path, err);
        free(index_path);
        if (s != QD_OK) { qd_st_close(st); return s; }
        *out = st;  /* the table was built while checking the index */
        return QD_OK;
    }
    free(index_path);
    return finish(st, open_all_in_dir(st, dir, err), out, err);
}

int qd_st_count(const qd_safetensors *st) { return st ? st->n_tensors : 0; }

const qd_st_tensor *qd_st_at(const qd_safetensors *st, int i) {
    return st && i >= 0 && i < st->n_tensors ? &st->tensors[i] : NULL;
}

const qd_st_tensor *qd_st_find(const qd_safetensors *st, const char *name) {
    if (!st || !st->table || !name) return NULL;
    size_t h = (size_t)hash_name(name) & st->table_mask;
    for (; st->table[h] >= 0; h = (h + 1) & st->table_mask)
        if (strcmp(st->tensors[st->table[h]].name, name) == 0) return &st->tensors[st->table[h]];
    return NULL;
}

const char *qd_st_file_name(const qd_safetensors *st, int file_index) {
    return st && file_index >= 0 && file_index < st->n_files ? st->files[file_index].name : "?";
}

int qd_st_file_count(const qd_safetensors *st) { return st ? st->n_files : 0; }

uint64_t qd_st_total_bytes(const qd_safetensors *st) {
    uint64_t n = 0;
    for (int i = 0; st && i < st->n_files; i++) n += st->files[i].map_len;
    return n;
}

qd_status qd_st_prefetch(const qd_safetensors *st, size_t chunk, qd_st_progress_fn fn, void *user, qd_err *err) {
    if (!st) return qd_seterr(err, QD_ERR_INVALID_ARG, "qd_st_prefetch: no checkpoint");
    if (chunk == 0) chunk = (size_t)64 << 20;
    const size_t page = (size_t)sysconf(_SC_PAGESIZE);
    qd_st_progress p = {.bytes_total = qd_st_total_bytes(st), .n_shards = st->n_files};
    for (int i = 0; i < st->n_files; i++) {
        const st_file *f = &st->files[i];
        p.shard = i + 1;
        p.shard_finished = 0;
        if (!f->map) { /* a memory image: nothing to read */
            p.bytes_done += f->map_len;
            p.shard_finished = 1;
            if (fn) fn(&p, user);
            continue;
        }
        /* read ahead in order while this runs; the weights are read in any order later */
        madvise(f->map, f->map_len, MADV_SEQUENTIAL);
        const volatile unsigned char *b = f->map;
        for (size_t off = 0; off < f->map_len;) {
            const size_t end = off + chunk < f->map_len ? off + chunk : f->map_len;
            unsigned char sink = 0;
            for (size_t q = off; q < end; q += page) sink ^= b[q]; /* one byte a page faults it in */
            (void)sink;
            p.bytes_done += end - off;
            off = end;
            p.shard_finished = off == f->map_len;
            if (fn) fn(&p, user);
        }
        madvise(f->map, f->map_len, MADV_NORMAL);
    }
    return QD_OK;
}
