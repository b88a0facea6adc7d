/* safetensors checkpoints, memory-mapped: one file or a set of shards listed in
 * model.safetensors.index.json. Headers are fully validated before any tensor is
 * exposed: sane header length, valid JSON, known dtypes, byte size = shape x dtype,
 * offsets inside the data area, no two tensors overlapping. */
#ifndef QD_IO_SAFETENSORS_H
#define QD_IO_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "base/dtype.h"
#include "base/err.h"

#define QD_ST_MAX_DIMS 8

typedef struct qd_st_tensor {
    char *name;
    qd_dtype dtype;
    int ndim;
    int64_t shape[QD_ST_MAX_DIMS];
    int64_t n_elements;
    const void *data;      /* inside the mapping, or `copy` */
    size_t n_bytes;
    void *copy;            /* an aligned heap copy of a tensor the file stores at an address its
                            * element size does not divide (the format does not promise one), or NULL */
    int file_index;        /* which shard */
} qd_st_tensor;

typedef struct qd_safetensors qd_safetensors;

/* Opens DIR: model.safetensors.index.json if present, else every *.safetensors in DIR
 * (normally the single model.safetensors). */
qd_status qd_st_open_dir(const char *dir, qd_safetensors **out, qd_err *err);
/* Opens one file. */
qd_status qd_st_open_file(const char *path, qd_safetensors **out, qd_err *err);
/* Parses a header from memory (the whole file image: 8-byte length, JSON, data).
 * Used by the fuzzer and by tests; `buf` must outlive the handle. */
qd_status qd_st_open_memory(const void *buf, size_t len, const char *what, qd_safetensors **out, qd_err *err);
void qd_st_close(qd_safetensors *st);

int qd_st_count(const qd_safetensors *st);
const qd_st_tensor *qd_st_at(const qd_safetensors *st, int i);
/* NULL when absent. */
const qd_st_tensor *qd_st_find(const qd_safetensors *st, const char *name);
/* The file a tensor came from (for messages). */
const char *qd_st_file_name(const qd_safetensors *st, int file_index);

/* Where qd_st_prefetch is, after each chunk it read: bytes of all shards and of the
 * shards done, the shard being read (1-based), and whether this call ended it. */
typedef struct qd_st_progress {
    uint64_t bytes_done, bytes_total;
    int shard, n_shards;
    int shard_finished;
} qd_st_progress;
typedef void (*qd_st_progress_fn)(const qd_st_progress *p, void *user);

int qd_st_file_count(const qd_safetensors *st);
/* Bytes of all the files (shards) mapped. */
uint64_t qd_st_total_bytes(const qd_safetensors *st);
/* Reads every mapped shard once, in order, so that its pages are resident (in the page
 * cache, for this and any later mapping of the files), calling fn (if non-NULL) after
 * each chunk of `chunk` bytes (0: 64 MiB) and at the end of each shard. Loading a
 * multi-gigabyte checkpoint is this reading; doing it up front lets a caller show it.
 * The library prints nothing itself. */
qd_status qd_st_prefetch(const qd_safetensors *st, size_t chunk, qd_st_progress_fn fn, void *user, qd_err *err);

#endif
