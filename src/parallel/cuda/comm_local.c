/* The single-device all-reduce (comm.h): every rank on one GPU, each on its own stream.
 *
 * Rank r, in one call:
 *   1. publishes its buffer and records `ready[r]` on its stream; barrier;
 *   2. waits on every other rank's `ready`, then sums all buffers in rank order into its
 *      own scratch `tmp[r]` and records `done[r]`; barrier;
 *   3. waits on every other rank's `done` (nobody reads its buffer any more) and copies
 *      tmp[r] into its buffer.
 * The barriers only make sure an event is recorded before anyone waits on it (a wait on
 * an event not yet recorded would not wait); the device work stays asynchronous. An event
 * is recorded again only after the barrier that follows every wait on its previous record.
 * The barrier can be broken (qd_comm_break), so that a rank that failed does not leave the others
 * waiting. */
#include <pthread.h>
#include <stdlib.h>

#include "backend/cuda/cuda_gdn.h"
#include "backend/cuda/cuda_device.h"
#include "parallel/cuda/comm.h"
#include "parallel/cuda/tp_cuda_rt.h"

typedef struct local_comm {
    int device;
    size_t max_count;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int arrived;
    unsigned phase;
    bool broken;
    const float *bufs[8];
    float *tmp[8];        /* [size][max_count] on the device, one block */
    void *ready[8], *done[8];
} local_comm;

/* false when the barrier is broken (now or while waiting) */
static bool barrier(local_comm *c, int size) {
    pthread_mutex_lock(&c->mu);
    const unsigned phase = c->phase;
    bool ok = !c->broken;
    if (ok && ++c->arrived == size) {
        c->arrived = 0;
        c->phase++;
        pthread_cond_broadcast(&c->cv);
    } else {
        while (ok && c->phase == phase) {
            pthread_cond_wait(&c->cv, &c->mu);
            ok = !c->broken;
        }
    }
    pthread_mutex_unlock(&c->mu);
    return ok;
}

static qd_status broken(void) {
    return qd_tp_fail(QD_ERR_BACKEND, "tensor-parallel all-reduce cancelled: another rank failed");
}

static qd_status local_all_reduce(qd_comm_group *g, int r, float *d_buf, size_t count, void *stream) {
    local_comm *c = g->impl;
    const int n = g->size;
    if (count > c->max_count) return qd_tp_fail(QD_ERR_INTERNAL, "tensor-parallel all-reduce larger than planned");
    c->bufs[r] = d_buf;
    QD_TRY(qd_tp_event_record(c->ready[r], stream, false));
    if (!barrier(c, n)) return broken();
    for (int s = 0; s < n; s++)
        if (s != r) QD_TRY(qd_tp_stream_wait(stream, c->ready[s]));
    QD_TRY(qd_tp_sum_ranks(c->tmp[r], c->bufs, n, count, stream));
    QD_TRY(qd_tp_event_record(c->done[r], stream, false));
    if (!barrier(c, n)) return broken();
    for (int s = 0; s < n; s++)
        if (s != r) QD_TRY(qd_tp_stream_wait(stream, c->done[s]));
    return qd_cuda_memcpy_d2d(d_buf, c->tmp[r], count * sizeof(float), stream);
}

static void local_break(qd_comm_group *g) {
    local_comm *c = g->impl;
    pthread_mutex_lock(&c->mu);
    c->broken = true;
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
}

static void local_destroy(qd_comm_group *g) {
    local_comm *c = g->impl;
    if (c) {
        for (int r = 0; r < g->size; r++) {
            qd_tp_event_destroy(c->ready[r]);
            qd_tp_event_destroy(c->done[r]);
        }
        qd_cuda_free(c->tmp[0]);
        pthread_mutex_destroy(&c->mu);
        pthread_cond_destroy(&c->cv);
        free(c);
    }
    free(g);
}

static const qd_comm_ops k_local_ops = {local_all_reduce, local_break, local_destroy};

qd_status qd_comm_local_create(int size, int device, size_t max_count, qd_comm_group **out, qd_err *err) {
    *out = NULL;
    if (size < 1 || size > 8) return qd_seterr(err, QD_ERR_INVALID_ARG, "one-device all-reduce: 1 to 8 ranks, not %d", size);
    qd_comm_group *g = calloc(1, sizeof *g);
    local_comm *c = calloc(1, sizeof *c);
    if (!g || !c) {
        free(g);
        free(c);
        return qd_seterr(err, QD_ERR_OOM, "out of memory");
    }
    *g = (qd_comm_group){&k_local_ops, size, false, "one device", c};
    c->device = device;
    c->max_count = max_count;
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->cv, NULL);
    const size_t stride = (max_count + 63) / 64 * 64; /* 256-byte aligned scratch per rank */
    void *block = NULL;
    qd_status s = qd_tp_set_device(device);
    if (s == QD_OK) s = qd_cuda_malloc(&block, stride * (size_t)size * sizeof(float));
    for (int r = 0; s == QD_OK && r < size; r++) {
        c->tmp[r] = (float *)block + (size_t)r * stride;
        if ((s = qd_tp_event_create(&c->ready[r], false)) == QD_OK) s = qd_tp_event_create(&c->done[r], false);
    }
    if (s != QD_OK) {
        if (!c->tmp[0]) qd_cuda_free(block);
        local_destroy(g);
        return qd_seterr(err, s, "one-device all-reduce on GPU %d: %s", device, qd_cuda_last_error());
    }
    *out = g;
    return QD_OK;
}
