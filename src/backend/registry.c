/* The backends this build has, by kind. Each table is defined in its backend's folder;
 * one that was not compiled in answers NULL with the reason (absent_cuda.c). */
#include <string.h>

#include "backend/backend.h"

const qd_backend_ops *qd_backend_find(qd_backend_kind kind, bool split, qd_err *err) {
    switch (kind) {
    case QD_BACKEND_CPU: return split ? qd_backend_split_cpu(err) : qd_backend_cpu(err);
    case QD_BACKEND_CUDA: return split ? qd_backend_split_cuda(err) : qd_backend_cuda(err);
    }
    qd_seterr(err, QD_ERR_INVALID_ARG, "unknown backend %d", (int)kind);
    return NULL;
}

static const char *const backend_names[] = {[QD_BACKEND_CPU] = "cpu", [QD_BACKEND_CUDA] = "cuda"};

const char *qd_backend_name(qd_backend_kind kind) {
    return (unsigned)kind < sizeof backend_names / sizeof backend_names[0] ? backend_names[kind] : NULL;
}

qd_status qd_backend_parse(const char *name, qd_backend_kind *kind) {
    for (unsigned k = 0; name && k < sizeof backend_names / sizeof backend_names[0]; k++)
        if (backend_names[k] && !strcmp(name, backend_names[k])) {
            *kind = (qd_backend_kind)k;
            return QD_OK;
        }
    return QD_ERR_INVALID_ARG;
}
