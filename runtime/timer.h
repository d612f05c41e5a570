/* runtime/timer.h — wall time for throughput (DESIGN 6).
 *
 * timer_seconds() reads the monotonic clock: seconds since an arbitrary fixed point, as a
 * double. Only differences mean anything; the clock never jumps with the time of day.
 */
#ifndef FATHOM_RUNTIME_TIMER_H
#define FATHOM_RUNTIME_TIMER_H

double timer_seconds(void);

#endif
