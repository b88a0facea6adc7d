/* Error values: a status plus a message naming what went wrong.
 * Internal functions take a `qd_err *` and return the status they set. */
#ifndef QD_BASE_ERR_H
#define QD_BASE_ERR_H

#include "qdelta.h"

#define QD_ERRMSG_SIZE 1024

typedef struct qd_err {
    qd_status status;
    char msg[QD_ERRMSG_SIZE];
} qd_err;

/* Sets err (if non-NULL) and returns `status`. */
qd_status qd_seterr(qd_err *err, qd_status status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Prepends "context: " to an existing message, keeps the status; returns it. */
qd_status qd_err_prefix(qd_err *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void qd_err_clear(qd_err *err);

#define QD_TRY(expr)                          \
    do {                                      \
        qd_status qd_try_s_ = (expr);         \
        if (qd_try_s_ != QD_OK) return qd_try_s_; \
    } while (0)

#endif
