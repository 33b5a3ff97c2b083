/* A monotonic clock in nanoseconds (the pool's spin and its fork-join measurement, the calibration of
   tv_gemm_choice). */
#ifndef TV_CLOCK_H
#define TV_CLOCK_H

#include <stdint.h>
#include <time.h>

static inline int64_t tv_now_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

#endif /* TV_CLOCK_H */
