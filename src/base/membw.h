/* Achievable DRAM bandwidth of this machine, the yardstick for memory-bound decode:
 * `qdelta bench` reports decode weight-streaming GB/s as a fraction of it. */
#ifndef QD_BASE_MEMBW_H
#define QD_BASE_MEMBW_H

#include <stddef.h>

#include "base/threadpool.h"

/* Read bandwidth in GB/s (1e9 bytes/s, counting bytes read): every pool thread sums
 * its contiguous share of a `bytes` buffer with wide loads; best of a few passes.
 * `bytes` should be well above the last-level cache (e.g. 512 MiB). NULL pool =
 * calling thread only. Returns 0 if the buffer cannot be allocated. */
double qd_measure_read_gbps(qd_threadpool *pool, size_t bytes);

/* memcpy bandwidth in GB/s counting bytes read (= bytes written), `bytes` per
 * buffer, split over the pool; best of a few passes. 0 on allocation failure. */
double qd_measure_copy_gbps(qd_threadpool *pool, size_t bytes);

/* Convenience for callers without a pool: creates one of n_threads (<= 0: all
 * cores) and returns qd_measure_read_gbps -- the read bandwidth, which is what a
 * GEMV over weights needs (it reads W and writes almost nothing). */
double qd_measure_memcpy_gbps(size_t bytes, int n_threads);

#endif
