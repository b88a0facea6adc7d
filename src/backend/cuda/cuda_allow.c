/* The allow masks of masked logit rows (qd_logit_out.allow) on their way to the argmax,
 * which runs after the layers (and after a graph replay: take_rows in cuda_forward.c),
 * so the masks never enter a captured graph. Only the masked rows' masks travel, packed
 * per chunk of logit rows: a constrained row costs a 31 KiB upload on a 248k vocabulary
 * where its logits row would be a 1 MiB download.
 *
 * Layout of the staging block and of its device copy, identical so that one copy moves
 * a chunk: [rows] int32 (each logit row's slot among the packed masks, or -1), rounded
 * up to 16 bytes, then [rows][words] uint32 masks.
 *
 * The room is taken at context creation (cuda_backend.c), after the context's one
 * planned block, so that a forward never allocates. */
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_model.h"

struct qd_cuda_allow {
    int rows;          /* logit rows per chunk */
    size_t words;      /* words of one mask */
    size_t index_bytes;
    unsigned char *host; /* pinned staging */
    void *dev;
};

void qd_cuda_allow_free(qd_cuda_ctx *g) {
    struct qd_cuda_allow *a = g->allow;
    if (!a) return;
    qd_cuda_free(a->dev);
    qd_cuda_free_host(a->host);
    free(a);
    g->allow = NULL;
}

qd_status qd_cuda_allow_create(qd_cuda_ctx *g, qd_err *err) {
    struct qd_cuda_allow *a = calloc(1, sizeof *a);
    if (!a) return qd_seterr(err, QD_ERR_OOM, "out of memory");
    g->allow = a;
    a->rows = qd_cuda_logit_chunk(g);
    a->words = qd_allow_words(g->cfg->vocab_size);
    a->index_bytes = ((size_t)a->rows * 4 + 15) / 16 * 16;
    const size_t bytes = a->index_bytes + (size_t)a->rows * a->words * 4;
    qd_status s;
    if ((s = qd_cuda_malloc(&a->dev, bytes)) || (s = qd_cuda_malloc_host((void **)&a->host, bytes))) {
        qd_seterr(err, s, "the argmax's allow masks (%.1f MiB of device and pinned host memory for %d rows of %d ids): %s",
                  (double)bytes / (1 << 20), a->rows, g->cfg->vocab_size, qd_cuda_last_error());
        qd_cuda_allow_free(g);
        return s;
    }
    return QD_OK;
}

qd_status qd_cuda_allow_upload(qd_cuda_ctx *g, const qd_logit_out *out, int r0, int nr, const uint32_t **d_masks,
                               const int32_t **d_rows) {
    *d_masks = NULL;
    *d_rows = NULL;
    if (!out->allow_row) return QD_OK;
    struct qd_cuda_allow *a = g->allow;
    if (nr > a->rows) return QD_ERR_INTERNAL; /* unreachable: a chunk has at most qd_cuda_logit_chunk rows */
    const int V = g->cfg->vocab_size;
    int32_t *slot = (int32_t *)a->host;
    uint32_t *masks = (uint32_t *)(a->host + a->index_bytes);
    int k = 0;
    for (int j = 0; j < nr; j++) {
        const uint32_t *m = qd_logit_allow(out, r0 + j, V);
        slot[j] = m ? k : -1;
        if (m) memcpy(masks + (size_t)k++ * a->words, m, a->words * 4);
    }
    if (k == 0) return QD_OK;
    QD_TRY(qd_cuda_memcpy_h2d_async(a->dev, a->host, a->index_bytes + (size_t)k * a->words * 4, g->stream));
    *d_rows = (const int32_t *)a->dev;
    *d_masks = (const uint32_t *)((unsigned char *)a->dev + a->index_bytes);
    return QD_OK;
}
