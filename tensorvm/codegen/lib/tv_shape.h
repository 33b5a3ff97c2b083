/* tensorvm's C shape functions: the primitives they call (see tensorvm/op/shape_logic.py).

   A shape function of a fused primitive (tensorvm/vm/shape_c.py) has the signature
     int32_t f(const int64_t* const* shapes, const void* const* data, int64_t* const* out)
   shapes[i]: the dims of flat input i; data[i]: its data (NULL for an input read by shape only);
   out[j]: the dims of flat output j, written by the function. It returns 0, or
   TV_SHAPE_ERROR_BASE + k for the k-th entry of its message table (a failed check of an op's shape
   logic). Dims are int64_t; // and % follow Python (floor division), as the shape logic does. */
#ifndef TV_SHAPE_H
#define TV_SHAPE_H

#include <math.h>
#include "tv_lib.h"

#define TV_SHAPE_ERROR_BASE 2000

/* Floor division and modulo (Python's). A zero divisor gives 0: every logic checks it first. */
__attribute__((unused)) static inline int64_t tv_shape_floordiv(int64_t a, int64_t b) {
  if (b == 0) return 0;
  if (b == -1) return (int64_t)(0 - (uint64_t)a); /* INT64_MIN / -1 wraps instead of trapping */
  const int64_t q = a / b;
  return (a % b != 0 && ((a < 0) != (b < 0))) ? q - 1 : q;
}
__attribute__((unused)) static inline int64_t tv_shape_floormod(int64_t a, int64_t b) {
  if (b == 0 || b == -1) return 0;
  const int64_t r = a % b;
  return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r;
}
/* Dims add, subtract and multiply in int64 with overflow noted in *overflow (the shape function then fails:
   shape_c.py), never wrapped: a pad of 2 x (2^63 - 1) around 3 floats had wrapped to a dim of 1 and run. */
__attribute__((unused)) static inline int64_t tv_shape_add(int64_t a, int64_t b, int* overflow) {
  int64_t r;
  if (__builtin_add_overflow(a, b, &r)) *overflow = 1;
  return r;
}
__attribute__((unused)) static inline int64_t tv_shape_sub(int64_t a, int64_t b, int* overflow) {
  int64_t r;
  if (__builtin_sub_overflow(a, b, &r)) *overflow = 1;
  return r;
}
__attribute__((unused)) static inline int64_t tv_shape_mul(int64_t a, int64_t b, int* overflow) {
  int64_t r;
  if (__builtin_mul_overflow(a, b, &r)) *overflow = 1;
  return r;
}
__attribute__((unused)) static inline int64_t tv_shape_min(int64_t a, int64_t b) { return a < b ? a : b; }
__attribute__((unused)) static inline int64_t tv_shape_max(int64_t a, int64_t b) { return a > b ? a : b; }

/* The number of nonzero elements of n values of a dtype (NaN is nonzero), for argwhere's rows. */
__attribute__((unused)) static int64_t tv_shape_count_nonzero(const void* p, int64_t n, int64_t dtype) {
  int64_t count = 0;
  switch (dtype) {
#define TV_SHAPE_COUNT_CASE(CODE, T, S, F)                                                          \
  case CODE: {                                                                                      \
    const T* x = (const T*)p;                                                                       \
    for (int64_t i = 0; i < n; i++) count += x[i] != 0;                                             \
    break;                                                                                          \
  }
    TV_LIB_DTYPES(TV_SHAPE_COUNT_CASE)
#undef TV_SHAPE_COUNT_CASE
    default: return -1;
  }
  return count;
}

/* The number of distinct rows in the first column of n sparse indices (row-major (n, ndim), an integer
   dtype), for sparse_fill_empty_rows' empty rows; -1 when ndim < 1 or the column is not ascending within
   [0, rows). One pass. */
__attribute__((unused)) static int64_t tv_shape_count_row_starts(const void* indices, int64_t n, int64_t ndim,
                                                                  int64_t dtype, int64_t rows) {
  if (ndim < 1) return -1;
  int64_t count = 0, prev = -1;
  for (int64_t i = 0; i < n; i++) {
    const int64_t row = tv_lib_load_int(indices, i * ndim, dtype);
    if (row < prev || row < 0 || row >= rows) return -1;
    count += row != prev;
    prev = row;
  }
  return count;
}

/* The number of runs of equal values (NaNs equal each other) of the n values of data read in order
   (positions of an integer dtype), for sorted_unique; -1 when order holds a position outside [0, n)
   or does not sort data ascending (NaN last, as tv_lib_less). One pass: the sort is argsort's. */
__attribute__((unused)) static int64_t tv_shape_count_sorted_runs(const void* data, int64_t dtype, const void* order,
                                                                  int64_t order_dtype, int64_t n) {
  int64_t count = 0, prev = 0;
  for (int64_t i = 0; i < n; i++) {
    const int64_t at = tv_lib_load_int(order, i, order_dtype);
    if (at < 0 || at >= n) return -1;
    if (i == 0) {
      count = 1;
    } else {
      switch (dtype) {
#define TV_SHAPE_RUNS_CASE(CODE, T, S, F)                                                           \
  case CODE: {                                                                                      \
    const T a = ((const T*)data)[prev], b = ((const T*)data)[at];                                   \
    if (tv_lib_less_##S(b, a)) return -1;                                                           \
    count += !(a == b || (tv_lib_isnan_##S(a) && tv_lib_isnan_##S(b)));                            \
    break;                                                                                          \
  }
        TV_LIB_DTYPES(TV_SHAPE_RUNS_CASE)
#undef TV_SHAPE_RUNS_CASE
        default: return -1;
      }
    }
    prev = at;
  }
  return count;
}

/* arange's length max(0, ceil((stop - start) / step)) over doubles (the caller checked step != 0
   and finiteness); integer arguments use floor division instead, exactly. */
__attribute__((unused)) static inline int64_t tv_shape_arange_length_f(double start, double stop, double step) {
  const double n = ceil((stop - start) / step);
  return n > 0 ? (int64_t)n : 0;
}
/* round(x) to the nearest integer, ties to even (Python's round; the default rounding mode). */
__attribute__((unused)) static inline int64_t tv_shape_round(double x) { return (int64_t)nearbyint(x); }
__attribute__((unused)) static inline double tv_shape_double(int64_t x) { return (double)x; }
/* floor(x) of a double already checked to be finite and within int64 (Python's math.floor). */
__attribute__((unused)) static inline int64_t tv_shape_floor(double x) { return (int64_t)floor(x); }
__attribute__((unused)) static inline int64_t tv_shape_isfinite(double x) { return isfinite(x) ? 1 : 0; }

#endif
