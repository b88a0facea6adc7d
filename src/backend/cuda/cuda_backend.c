/* The CUDA backend's table (backend.h): weights uploaded at model creation
 * (cuda_model.c), contexts planned in one device block (cuda_context.c), the forward and
 * the MTP head's (cuda_forward.c). */
#include <string.h>

#include "backend/cuda/cuda_model.h"

static qd_status cuda_copy_gbps(size_t bytes, int n_threads, double *gbps, qd_err *err) {
    (void)n_threads;
    qd_status s = qd_cuda_copy_gbps(bytes, gbps);
    if (s != QD_OK) return qd_seterr(err, s, "measuring the device's copy bandwidth: %s", qd_cuda_last_error());
    return QD_OK;
}

static qd_status cuda_device_info(qd_device_info *out, qd_err *err) {
    memset(out, 0, sizeof *out);
    int sms = 0;
    qd_status s = qd_cuda_device_info(out->name, sizeof out->name, &sms);
    if (s == QD_OK) s = qd_cuda_mem_info(&out->free_bytes, &out->total_bytes);
    if (s != QD_OK) return qd_seterr(err, s, "querying the CUDA device: %s", qd_cuda_last_error());
    return QD_OK;
}

/* A context with its argmax's allow masks (cuda_allow.c), which are kept apart from the
 * context's planned block (cuda_context.c) for now. */
static qd_status cuda_ctx_create(void *bm, const qd_backend_ctx_desc *d, void **out, qd_err *err) {
    QD_TRY(qd_cuda_ctx_create(bm, d, out, err));
    qd_status s = qd_cuda_allow_create(*out, err);
    if (s != QD_OK) {
        qd_cuda_ctx_free(*out);
        *out = NULL;
    }
    return s;
}

static void cuda_ctx_free(void *bc) {
    if (bc) qd_cuda_allow_free(bc);
    qd_cuda_ctx_free(bc);
}

const qd_backend_ops qd_cuda_ops = {
    .name = "CUDA",
    .kv_elem_bytes = 2,
    .copies_weights = true,
    .draws_dummy_weights = true,
    .quantized_weights = true, /* cuda_quant.h: weights kept in their format on the device */
    .counts_experts = true,    /* qd_cuda_moe_mark */
    .copy_gbps = cuda_copy_gbps,
    .device_info = cuda_device_info,
    .model_create = qd_cuda_model_create,
    .model_free = qd_cuda_model_free,
    .ctx_create = cuda_ctx_create,
    .ctx_free = cuda_ctx_free,
    .forward = qd_cuda_forward,
    .state_bytes = qd_cuda_state_bytes,
    .state_read = qd_cuda_state_read,
    .state_write = qd_cuda_state_write,
    .state_copy = qd_cuda_state_copy,
    .kv_copy_block = qd_cuda_kv_copy_block,
    .snap_save = qd_cuda_snap_save,
    .snap_load = qd_cuda_snap_load,
    .snap_read = qd_cuda_snap_read,
    .verify_keep = qd_cuda_verify_keep,  /* per-token GDN states of verify spans in the state pool */
    .mtp_forward = qd_cuda_mtp_forward,
};

const qd_backend_ops *qd_backend_cuda(qd_err *err) {
    if (qd_cuda_device_count() == 0) {
        qd_seterr(err, QD_ERR_BACKEND, "--backend cuda: no CUDA device found (no GPU or no driver)");
        return NULL;
    }
    return &qd_cuda_ops;
}
