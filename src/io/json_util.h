/* Small helpers shared by the JSON-reading loaders (config.json, safetensors index). */
#ifndef QD_IO_JSON_UTIL_H
#define QD_IO_JSON_UTIL_H

#include <stddef.h>

#include <jansson.h>

#include "base/err.h"

/* Reads a whole file into a NUL-terminated heap buffer (caller frees). Files larger
 * than max_bytes are rejected: the JSON files we read are small, and a cap keeps a
 * wrong path (a multi-GB shard) from being slurped into memory. */
qd_status qd_read_file(const char *path, size_t max_bytes, char **out, size_t *out_len, qd_err *err);

/* Parses JSON text with duplicate keys rejected (a duplicated key would make the
 * meaning of a file ambiguous). On failure sets QD_ERR_FORMAT naming `what` and the
 * line/column jansson reports. The caller json_decref()s the result. */
qd_status qd_json_parse(const char *text, size_t len, const char *what, json_t **out, qd_err *err);

/* A short English name for a JSON value's type, for "expected X, got Y" messages. */
const char *qd_json_type_name(const json_t *v);

#endif
