/* Logging to stderr with levels. The level is set once by the program (CLI flag). */
#ifndef QD_BASE_LOG_H
#define QD_BASE_LOG_H

typedef enum { QD_LOG_ERROR = 0, QD_LOG_WARN = 1, QD_LOG_INFO = 2, QD_LOG_DEBUG = 3 } qd_log_level;

void qd_log_set_level(qd_log_level level);
qd_log_level qd_log_get_level(void);
void qd_log(qd_log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define QD_LOGE(...) qd_log(QD_LOG_ERROR, __VA_ARGS__)
#define QD_LOGW(...) qd_log(QD_LOG_WARN, __VA_ARGS__)
#define QD_LOGI(...) qd_log(QD_LOG_INFO, __VA_ARGS__)
#define QD_LOGD(...) qd_log(QD_LOG_DEBUG, __VA_ARGS__)

#endif
