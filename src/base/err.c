#include "base/err.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

const char *qd_status_name(qd_status s) {
    switch (s) {
    case QD_OK: return "QD_OK";
    case QD_ERR_INVALID_ARG: return "QD_ERR_INVALID_ARG";
    case QD_ERR_IO: return "QD_ERR_IO";
    case QD_ERR_FORMAT: return "QD_ERR_FORMAT";
    case QD_ERR_UNSUPPORTED: return "QD_ERR_UNSUPPORTED";
    case QD_ERR_NOT_FOUND: return "QD_ERR_NOT_FOUND";
    case QD_ERR_SHAPE: return "QD_ERR_SHAPE";
    case QD_ERR_OOM: return "QD_ERR_OOM";
    case QD_ERR_CAPACITY: return "QD_ERR_CAPACITY";
    case QD_ERR_BACKEND: return "QD_ERR_BACKEND";
    case QD_ERR_INTERNAL: return "QD_ERR_INTERNAL";
    }
    return "QD_ERR_UNKNOWN";
}

qd_status qd_seterr(qd_err *err, qd_status status, const char *fmt, ...) {
    if (!err) return status;
    err->status = status;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->msg, sizeof err->msg, fmt, ap);
    va_end(ap);
    return status;
}

qd_status qd_err_prefix(qd_err *err, const char *fmt, ...) {
    if (!err) return QD_ERR_INTERNAL;
    char prefix[QD_ERRMSG_SIZE];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    char old[QD_ERRMSG_SIZE];
    memcpy(old, err->msg, sizeof old);
    /* truncation of a long message is acceptable: it stays NUL-terminated */
    size_t n = strlen(prefix);
    if (n > sizeof err->msg - 3) n = sizeof err->msg - 3;
    memcpy(err->msg, prefix, n);
    memcpy(err->msg + n, ": ", 2);
    size_t room = sizeof err->msg - n - 3;
    size_t m = strnlen(old, room);
    memcpy(err->msg + n + 2, old, m);
    err->msg[n + 2 + m] = '\0';
    return err->status;
}

void qd_err_clear(qd_err *err) {
    if (!err) return;
    err->status = QD_OK;
    err->msg[0] = '\0';
}
