#include "io/json_util.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

qd_status qd_read_file(const char *path, size_t max_bytes, char **out, size_t *out_len, qd_err *err) {
    *out = NULL;
    *out_len = 0;
    FILE *f = fopen(path, "rb");
    if (!f) return qd_seterr(err, errno == ENOENT ? QD_ERR_NOT_FOUND : QD_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fileno(f), &sb) != 0 || !S_ISREG(sb.st_mode)) {
        fclose(f);
        return qd_seterr(err, QD_ERR_IO, "%s: not a regular file", path);
    }
    if ((unsigned long long)sb.st_size > max_bytes) {
        fclose(f);
        return qd_seterr(err, QD_ERR_FORMAT, "%s: file is %lld bytes, more than the %zu allowed", path,
                         (long long)sb.st_size, max_bytes);
    }
    size_t n = (size_t)sb.st_size;
    char *buf = malloc(n + 1);
    if (!buf) {
        fclose(f);
        return qd_seterr(err, QD_ERR_OOM, "%s: cannot allocate %zu bytes", path, n + 1);
    }
    size_t got = n ? fread(buf, 1, n, f) : 0;
    int bad = ferror(f);
    fclose(f);
    if (bad || got != n) {
        free(buf);
        return qd_seterr(err, QD_ERR_IO, "%s: read error", path);
    }
    buf[n] = '\0';
    *out = buf;
    *out_len = n;
    return QD_OK;
}

qd_status qd_json_parse(const char *text, size_t len, const char *what, json_t **out, qd_err *err) {
    json_error_t jerr;
    *out = json_loadb(text, len, JSON_REJECT_DUPLICATES, &jerr);
    if (!*out)
        return qd_seterr(err, QD_ERR_FORMAT, "%s: invalid JSON at line %d, column %d: %s", what, jerr.line,
                         jerr.column, jerr.text);
    return QD_OK;
}

const char *qd_json_type_name(const json_t *v) {
    switch (json_typeof(v)) {
    case JSON_OBJECT: return "an object";
    case JSON_ARRAY: return "an array";
    case JSON_STRING: return "a string";
    case JSON_INTEGER: return "an integer";
    case JSON_REAL: return "a real number";
    case JSON_TRUE:
    case JSON_FALSE: return "a boolean";
    case JSON_NULL: return "null";
    }
    return "an unknown value";
}
