/* Products of few rows (m = 1..8) through the packed product (tv_vgemm.h), two builds of it side by side:
   "this" and "other" are the same entry point compiled from two checkouts' headers (product_rows.py
   links them under these names). Rounds alternate the two, each round times `inner` calls; the
   medians and minima of the rounds are printed, with the largest difference between their outputs.

   usage: product_rows N K ROUNDS INNER */
#define _POSIX_C_SOURCE 200112L /* clock_gettime */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

int32_t product_this(int64_t m, int64_t n, int64_t k, const float* x, const float* w, float* out);
int32_t product_other(int64_t m, int64_t n, int64_t k, const float* x, const float* w, float* out);
int32_t panel_width(void);

static double now_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return 1e9 * (double)t.tv_sec + (double)t.tv_nsec;
}
static int by_value(const void* a, const void* b) {
  const double x = *(const double*)a, y = *(const double*)b;
  return (x > y) - (x < y);
}

int main(int argc, char** argv) {
  if (argc != 5) {
    fprintf(stderr, "usage: %s N K ROUNDS INNER\n", argv[0]);
    return 2;
  }
  const int64_t n = atoll(argv[1]), k = atoll(argv[2]), nr = panel_width();
  const int rounds = atoi(argv[3]), inner = atoi(argv[4]);
  const int64_t panels = (n + nr - 1) / nr;
  float* w = aligned_alloc(64, (size_t)(panels * k * nr) * sizeof(float) + 64);
  float* x = aligned_alloc(64, (size_t)(8 * k) * sizeof(float) + 64);
  float* out[2] = {aligned_alloc(64, (size_t)(8 * n) * sizeof(float) + 64),
                   aligned_alloc(64, (size_t)(8 * n) * sizeof(float) + 64)};
  double* times[2] = {malloc((size_t)rounds * sizeof(double)), malloc((size_t)rounds * sizeof(double))};
  for (int64_t i = 0; i < panels * k * nr; ++i) w[i] = (float)((i * 7919) % 13) / 13.0f - 0.5f;
  for (int64_t i = 0; i < 8 * k; ++i) x[i] = (float)((i * 104729) % 17) / 17.0f - 0.5f;
  for (int m = 1; m <= 8; ++m) {
    for (int r = 0; r < rounds; ++r)
      for (int v = 0; v < 2; ++v) {
        const int which = (r & 1) ? 1 - v : v; /* (each build goes first in every other round) */
        const double start = now_ns();
        for (int q = 0; q < inner; ++q) (which ? product_other : product_this)(m, n, k, x, w, out[which]);
        times[which][r] = (now_ns() - start) / inner;
      }
    double diff = 0;
    for (int64_t i = 0; i < m * n; ++i) {
      const double d = out[0][i] > out[1][i] ? out[0][i] - out[1][i] : out[1][i] - out[0][i];
      if (d > diff) diff = d;
    }
    qsort(times[0], (size_t)rounds, sizeof(double), by_value);
    qsort(times[1], (size_t)rounds, sizeof(double), by_value);
    printf("%d x %lld . %lld x %lld: this %.2f us (min %.2f), other %.2f us (min %.2f): this / other %.3f;"
           " max |difference| %.1e\n", m, (long long)k, (long long)k, (long long)n, times[0][rounds / 2] / 1e3,
           times[0][0] / 1e3, times[1][rounds / 2] / 1e3, times[1][0] / 1e3, times[0][rounds / 2] / times[1][rounds / 2], diff);
  }
  return 0;
}
