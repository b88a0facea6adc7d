#ifndef QD_BASE_CLOCK_H
#define QD_BASE_CLOCK_H

/* Seconds on the monotonic clock (an arbitrary origin): for intervals, never dates. */
double qd_clock_seconds(void);

#endif
