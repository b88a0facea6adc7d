#include "base/log.h"

#include <stdarg.h>
#include <stdio.h>

static qd_log_level g_level = QD_LOG_WARN;

void qd_log_set_level(qd_log_level level) { g_level = level; }
qd_log_level qd_log_get_level(void) { return g_level; }

void qd_log(qd_log_level level, const char *fmt, ...) {
    if (level > g_level) return;
    static const char *names[] = {"error", "warn", "info", "debug"};
    fprintf(stderr, "qdelta %s: ", names[level]);
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
}
