/* The backends this build has, by kind. Each table is defined in its backend's folder;
 * one that was not compiled in answers NULL with the reason (absent_cuda.c). */
#include "backend/backend.h"

const qd_backend_ops *qd_backend_find(qd_backend_kind kind, bool split, qd_err *err) {
    switch (kind) {
    case QD_BACKEND_CPU: return split ? qd_backend_split_cpu(err) : qd_backend_cpu(err);
    case QD_BACKEND_CUDA: return split ? qd_backend_split_cuda(err) : qd_backend_cuda(err);
    }
    qd_seterr(err, QD_ERR_INVALID_ARG, "unknown backend %d", (int)kind);
    return NULL;
}
