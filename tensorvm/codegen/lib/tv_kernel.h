/* tensorvm's kernel prelude: the helpers every generated kernel may call (the kernel ABI is described in
   tensorvm/codegen/c_emit.py). c_emit.prelude() puts this file's text at the top of each generated
   translation unit (so the kernel cache keys on it); the AOT flow makes its functions static. Besides the
   integer and float helpers NumPy's semantics need, it holds the float32 softmax that nn.softmax and
   nn.log_softmax call (tensorvm/codegen/strategy.py), which every translation unit, AOT's too, may use. */
#ifndef TV_KERNEL_H
#define TV_KERNEL_H

#include <stdint.h>
#include <stdbool.h>
#include <stdlib.h>
#include <math.h>
#include <string.h>
#include "tv_vec.h"

/* Marks a kernel holding a select between two loads. GCC 12.2 at -O3 with AVX2 vectorizes such a select
   wrongly after loop if-conversion (a concatenate of a tensor with itself had one element 0); where the
   toolchain probe saw that (tensorvm/codegen/build.py), these kernels are built without it. */
#if defined(TV_NO_LOOP_IF_CONVERSION) && defined(__GNUC__) && !defined(__clang__)
#define TV_SELECT_OF_LOADS __attribute__((optimize("no-tree-loop-if-convert")))
#else
#define TV_SELECT_OF_LOADS
#endif

#ifdef TV_VECTOR_MATH
/* glibc's libmvec has vector versions of these (same results within a few ulp); declaring them
   lets the vectorizer call them from vector loops without -ffast-math. Enabled after a probe. */
#define TV_SIMD __attribute__((simd("notinbranch")))
float expf(float) TV_SIMD; float logf(float) TV_SIMD; float log2f(float) TV_SIMD; float log10f(float) TV_SIMD;
float sinf(float) TV_SIMD; float cosf(float) TV_SIMD; float tanf(float) TV_SIMD; float tanhf(float) TV_SIMD;
float erff(float) TV_SIMD; float powf(float, float) TV_SIMD;
double exp(double) TV_SIMD; double log(double) TV_SIMD; double log2(double) TV_SIMD; double log10(double) TV_SIMD;
double sin(double) TV_SIMD; double cos(double) TV_SIMD; double tan(double) TV_SIMD; double tanh(double) TV_SIMD;
double erf(double) TV_SIMD; double pow(double, double) TV_SIMD;
#endif

/* Exported once per library (weak: a library may be linked from several translation units). */
#ifdef _OPENMP
#include <omp.h>
/* The thread budget, read by every parallel region (0: OpenMP's default). omp_set_num_threads alone would
   set it for the calling thread only, and kernels run on whichever thread calls them. */
__attribute__((weak, visibility("hidden"))) int32_t tv_num_threads;
__attribute__((weak)) int32_t tv_set_num_threads(int32_t n) {
  tv_num_threads = n > 0 ? n : omp_get_num_procs();
  omp_set_num_threads(tv_num_threads);
  return 0;
}
static inline int tv_threads(void) { return tv_num_threads > 0 ? tv_num_threads : omp_get_max_threads(); }
__attribute__((weak)) int32_t tv_get_num_threads(void) { return tv_threads(); }
#else
__attribute__((weak)) int32_t tv_set_num_threads(int32_t n) { (void)n; return 1; }
__attribute__((weak)) int32_t tv_get_num_threads(void) { return 1; }
#endif

static inline void tv_fail(int32_t* err, int32_t code) { __atomic_store_n(err, code, __ATOMIC_RELAXED); }

#define TV_INT_COMMON(T, S, U, BITS)                                                                 \
  static inline T tv_min_##S(T a, T b) { return a < b ? a : b; }                                   \
  static inline T tv_max_##S(T a, T b) { return a > b ? a : b; }                                   \
  static inline T tv_shl_##S(T a, T b) { return (uint64_t)b < BITS ? (T)((U)a << b) : (T)0; }      \
  static inline T tv_upow_##S(U base, uint64_t e) {                                                \
    U result = 1;                                                                                  \
    while (e) { if (e & 1) result = (U)(result * base); base = (U)(base * base); e >>= 1; }        \
    return (T)result;                                                                              \
  }
#define TV_SIGNED(T, S, U, BITS)                                                                     \
  TV_INT_COMMON(T, S, U, BITS)                                                                     \
  static inline T tv_ipow_##S(T a, T b, int32_t* err) {                                            \
    if (b < 0) {                                                                                   \
      if (a == 0) { tv_fail(err, 1001); return 0; }                                                \
      return a == 1 ? (T)1 : (a == (T)-1 ? ((b & 1) ? (T)-1 : (T)1) : (T)0);                      \
    }                                                                                              \
    return tv_upow_##S((U)a, (uint64_t)b);                                                         \
  }                                                                                                \
  static inline T tv_shr_##S(T a, T b) { return (uint64_t)b < BITS ? (T)(a >> b) : (a < 0 ? (T)-1 : (T)0); } \
  static inline T tv_truncdiv_##S(T a, T b, int32_t* err) {                                        \
    if (b == 0) { tv_fail(err, 1001); return 0; }                                                  \
    if (b == -1) return (T)(0 - (U)a);                                                             \
    return (T)(a / b);                                                                             \
  }                                                                                                \
  static inline T tv_truncmod_##S(T a, T b, int32_t* err) {                                        \
    if (b == 0) { tv_fail(err, 1001); return 0; }                                                  \
    if (b == -1) return 0;                                                                         \
    return (T)(a % b);                                                                             \
  }                                                                                                \
  static inline T tv_floordiv_##S(T a, T b, int32_t* err) {                                        \
    if (b == 0) { tv_fail(err, 1001); return 0; }                                                  \
    if (b == -1) return (T)(0 - (U)a);                                                             \
    T q = (T)(a / b);                                                                              \
    return ((a % b) != 0 && ((a < 0) != (b < 0))) ? (T)(q - 1) : q;                                \
  }                                                                                                \
  static inline T tv_floormod_##S(T a, T b, int32_t* err) {                                        \
    if (b == 0) { tv_fail(err, 1001); return 0; }                                                  \
    if (b == -1) return 0;                                                                         \
    T r = (T)(a % b);                                                                              \
    return (r != 0 && ((r < 0) != (b < 0))) ? (T)(r + b) : r;                                      \
  }                                                                                                \
  static inline T tv_abs_##S(T a) { return a < 0 ? (T)(0 - (U)a) : a; }
#define TV_UNSIGNED(T, S, BITS)                                                                      \
  TV_INT_COMMON(T, S, T, BITS)                                                                     \
  static inline T tv_ipow_##S(T a, T b, int32_t* err) { (void)err; return tv_upow_##S(a, (uint64_t)b); } \
  static inline T tv_shr_##S(T a, T b) { return (uint64_t)b < BITS ? (T)(a >> b) : (T)0; }         \
  static inline T tv_truncdiv_##S(T a, T b, int32_t* err) {                                        \
    if (b == 0) { tv_fail(err, 1001); return 0; } return (T)(a / b); }                             \
  static inline T tv_truncmod_##S(T a, T b, int32_t* err) {                                        \
    if (b == 0) { tv_fail(err, 1001); return 0; } return (T)(a % b); }                             \
  static inline T tv_floordiv_##S(T a, T b, int32_t* err) { return tv_truncdiv_##S(a, b, err); }   \
  static inline T tv_floormod_##S(T a, T b, int32_t* err) { return tv_truncmod_##S(a, b, err); }
TV_SIGNED(int8_t, i8, uint8_t, 8) TV_SIGNED(int16_t, i16, uint16_t, 16)
TV_SIGNED(int32_t, i32, uint32_t, 32) TV_SIGNED(int64_t, i64, uint64_t, 64)
TV_UNSIGNED(uint8_t, u8, 8) TV_UNSIGNED(uint16_t, u16, 16) TV_UNSIGNED(uint32_t, u32, 32)
TV_UNSIGNED(uint64_t, u64, 64)
static inline int64_t tv_index_check(int64_t i, int64_t n, int32_t* err) {
  if (i < -n || i >= n) { tv_fail(err, 1002); return 0; }
  return i < 0 ? i + n : i;
}
static inline bool tv_min_b(bool a, bool b) { return a && b; }
static inline bool tv_max_b(bool a, bool b) { return a || b; }

/* A float to a 32- or 64-bit unsigned integer as NumPy's cast gives it here: a negative value wraps through int64
   (-300.0 -> 2^32 - 300), as the narrower integers do. A bare C conversion of a value outside the unsigned range
   is undefined, and gcc's scalar and vector code for it disagreed. (NaN, infinities and values beyond 64 bits stay
   unspecified, as in NumPy: docs/ops.md.) */
static inline uint32_t tv_f2u32(double x) { return (uint32_t)(int64_t)x; }
static inline uint64_t tv_f2u64(double x) { return x < 0 ? (uint64_t)(int64_t)x : (uint64_t)x; }

/* NumPy's divmod for floats: the quotient is floored, the remainder has the divisor's sign. */
#define TV_FLOAT(T, S, F)                                                                            \
  static inline T tv_min_##S(T a, T b) { return (a < b || a != a) ? a : b; }                       \
  static inline T tv_max_##S(T a, T b) { return (a > b || a != a) ? a : b; }                       \
  static inline T tv_floormod_##S(T a, T b) {                                                      \
    T m = fmod##F(a, b);                                                                           \
    if (!b) return m;                                                                              \
    if (m) { if ((b < 0) != (m < 0)) m += b; } else { m = copysign##F((T)0, b); }                  \
    return m;                                                                                      \
  }                                                                                                \
  static inline T tv_floordiv_##S(T a, T b) {                                                      \
    if (!b) return a / b;                                                                          \
    T m = fmod##F(a, b), div = (a - m) / b, q;                                                     \
    if (m && ((b < 0) != (m < 0))) div -= (T)1;                                                    \
    if (div) { q = floor##F(div); if (div - q > (T)0.5) q += (T)1; }                               \
    else { q = copysign##F((T)0, a / b); }                                                         \
    return q;                                                                                      \
  }                                                                                                \
  static inline T tv_sigmoid_##S(T x) { /* branch-free so that vector loops stay vector loops */    \
    T e = exp##F(-fabs##F(x)), r = (T)1 / ((T)1 + e);                                              \
    return x >= 0 ? r : e * r;                                                                     \
  }                                                                                                \
  static inline T tv_sign_##S(T x) { return x > 0 ? (T)1 : (x < 0 ? (T)-1 : (x == 0 ? (T)0 : x)); }  \
  /* x ** 2 and x ** 3 (a constant exponent, GPT-2's tanh GELU): products, which vectorize inline;     \
     libmvec's vector powf took 15 ns per element here. Within 1.5 ulp of pow; the same inf, nan and  \
     signed zeros. */                                                                              \
  static inline T tv_pow2_##S(T x) { return x * x; }                                               \
  static inline T tv_pow3_##S(T x) { return x * x * x; }
TV_FLOAT(float, f32, f) TV_FLOAT(double, f64, )

/* exp(x) for x <= 0 (or NaN), as softmax needs it after subtracting the row's maximum: Cody-Waite
   reduction x = k ln2 + r, e^r by Cephes' degree-5 polynomial, 2^k added to the exponent bits; within
   1.01 ulp of exp on [-87, 0]. Below -87 it returns 0 (exp would be under 1.7e-38, and 2^k must stay a
   normal number), so a masked score of -inf gets exactly 0. No call, so the loop vectorizes inline:
   0.30 ns per element against 0.46 for libmvec's expf. */
static inline float tv_exp_nonpositive_f32(float x) {
  const float clamped = x < -87.0f ? -87.0f : x;  /* (NaN passes) */
  const float shifted = fmaf(clamped, 1.44269504088896341f, 12582912.0f);  /* 1.5 * 2^23 + round(x / ln2) */
  const float k = shifted - 12582912.0f;
  float r = fmaf(k, -0.693359375f, clamped);
  r = fmaf(k, 2.12194440e-4f, r);
  float p = 1.9875691500e-4f;
  p = fmaf(p, r, 1.3981999507e-3f);
  p = fmaf(p, r, 8.3334519073e-3f);
  p = fmaf(p, r, 4.1665795894e-2f);
  p = fmaf(p, r, 1.6666665459e-1f);
  p = fmaf(p, r, 5.0000001201e-1f);
  p = fmaf(p, r * r, r) + 1.0f;
  int32_t k_bits, p_bits;
  memcpy(&k_bits, &shifted, sizeof k_bits);  /* the low mantissa bits hold k */
  memcpy(&p_bits, &p, sizeof p_bits);
  p_bits += (int32_t)((uint32_t)k_bits << 23);
  memcpy(&p, &p_bits, sizeof p);
  return x < -87.0f ? 0.0f : p;
}

#ifndef TV_PARALLEL_ELEMENTS
#define TV_PARALLEL_ELEMENTS 65536
#endif

/* softmax (or log_softmax) over the last axis of a rows x n float32 array, written once over the host's
   vector (tv_vec.h: TV_VLANES floats; 16 on AVX-512, where gcc's auto-vectorizer would keep 256 bits),
   each pass a vector loop and a scalar tail. Per row: one pass for the maximum, one computing exp and its
   sum together (log_softmax: the sum only), one scaling by 1 / sum (log_softmax: subtracting the maximum,
   then log(sum)). A NaN in a row makes the row NaN, as in the generated kernel. Rows run in parallel from
   TV_PARALLEL_ELEMENTS elements (host.py: kernel_rules, as generated loops): on OpenMP here (the static
   AOT form); shared libraries redirect the name to tv_softmax_team_f32 (beside the products), whose rows run on
   tensorvm's pool like the generated loops. tv_softmax_rows_f32 does rows [first, end). */
static inline void tv_softmax_rows_f32(int64_t first, int64_t end, int64_t n, const float* restrict x,
                                       float* restrict y, int64_t log_softmax) {
  const int64_t whole = n / TV_VLANES * TV_VLANES;
  for (int64_t i = first; i < end; ++i) {
    const float* restrict row = x + i * n;
    float* restrict result = y + i * n;
    tv_vf peaks = TV_VSPLAT(-INFINITY);
    tv_vmask nans = {0};
    for (int64_t j = 0; j < whole; j += TV_VLANES) {
      const tv_vf v = TV_VLOAD(row + j);
      peaks = TV_VSELECT(v > peaks, v, peaks);
      nans |= v != v;
    }
    float peak = -INFINITY;
    int32_t nan = 0;
    for (int l = 0; l < TV_VLANES; ++l) { peak = peaks[l] > peak ? peaks[l] : peak; nan |= nans[l]; }
    for (int64_t j = whole; j < n; ++j) { const float v = row[j]; peak = v > peak ? v : peak; nan |= (int32_t)(v != v); }
    if (nan) peak = NAN;
    const tv_vf peak_v = TV_VSPLAT(peak);
    tv_vf totals = TV_VSPLAT(0.0f);
    if (log_softmax) {
      for (int64_t j = 0; j < whole; j += TV_VLANES) {
        tv_vf e = TV_VLOAD(row + j) - peak_v;
        tv_vexp_nonpositive_f32(&e);
        totals += e;
      }
      float total = tv_vsum(&totals);
      for (int64_t j = whole; j < n; ++j) total += tv_exp_nonpositive_f32(row[j] - peak);
      const float log_total = logf(total);
      const tv_vf log_total_v = TV_VSPLAT(log_total);
      /* (x - peak) first: rounding peak + log_total would cost precision */
      for (int64_t j = 0; j < whole; j += TV_VLANES) TV_VSTORE(result + j, (TV_VLOAD(row + j) - peak_v) - log_total_v);
      for (int64_t j = whole; j < n; ++j) result[j] = (row[j] - peak) - log_total;
    } else {
      for (int64_t j = 0; j < whole; j += TV_VLANES) {
        tv_vf e = TV_VLOAD(row + j) - peak_v;
        tv_vexp_nonpositive_f32(&e);
        TV_VSTORE(result + j, e);
        totals += e;
      }
      float total = tv_vsum(&totals);
      for (int64_t j = whole; j < n; ++j) {
        const float e = tv_exp_nonpositive_f32(row[j] - peak);
        result[j] = e;
        total += e;
      }
      const float scale = 1.0f / total;
      const tv_vf scale_v = TV_VSPLAT(scale);
      for (int64_t j = 0; j < whole; j += TV_VLANES) TV_VSTORE(result + j, TV_VLOAD(result + j) * scale_v);
      for (int64_t j = whole; j < n; ++j) result[j] *= scale;
    }
  }
}
__attribute__((unused)) static int32_t tv_softmax_f32(int64_t rows, int64_t n, const float* restrict x,
                                                      float* restrict y, int64_t log_softmax) {
  #pragma omp parallel for schedule(static) num_threads(tv_threads()) if(rows * n >= TV_PARALLEL_ELEMENTS)
  for (int64_t i = 0; i < rows; ++i) tv_softmax_rows_f32(i, i + 1, n, x, y, log_softmax);
  return 0;
}

/* The mean of each row of a rows x n float32 array (a mean over the trailing axes: a global average pool,
   squeeze-and-excitation's): four vector accumulators, then the lanes and a scalar tail, divided by n. The
   generated reduction ran one short vector loop per image row (14 floats of a 14 x 14 plane) and had been
   3-5x ONNX Runtime's GlobalAveragePool. rows [first, end); threads as tv_softmax_f32 (shared libraries:
   tv_mean_team_f32). n = 0 gives NaN, as NumPy's mean of nothing. */
/* A float sum adds at most TV_SUM_BLOCK floats in float lanes before the block's total joins a double: the
   generated reductions' rule (lower.py: SUM_BLOCK), which keeps a long row's mean from drifting by n / lanes
   roundings (a mean of 4e6 floats of 1e4 had been off by 1e-3). */
#define TV_SUM_BLOCK 4096
static inline void tv_mean_rows_f32(int64_t first, int64_t end, int64_t n, const float* restrict x,
                                    float* restrict y) {
  for (int64_t i = first; i < end; ++i) {
    const float* restrict row = x + i * n;
    double total = 0.0;
    int64_t j = 0;
    while (j + 4 * TV_VLANES <= n) {
      const int64_t stop = n - j > TV_SUM_BLOCK ? j + TV_SUM_BLOCK : n;
      tv_vf a0 = TV_VSPLAT(0.0f), a1 = a0, a2 = a0, a3 = a0;
      for (; j + 4 * TV_VLANES <= stop; j += 4 * TV_VLANES) {
        a0 += TV_VLOAD(row + j);
        a1 += TV_VLOAD(row + j + TV_VLANES);
        a2 += TV_VLOAD(row + j + 2 * TV_VLANES);
        a3 += TV_VLOAD(row + j + 3 * TV_VLANES);
      }
      a0 += a1 + (a2 + a3);
      total += (double)tv_vsum(&a0);
    }
    tv_vf last = TV_VSPLAT(0.0f);  /* (fewer than 4 vectors and a scalar tail left) */
    for (; j + TV_VLANES <= n; j += TV_VLANES) last += TV_VLOAD(row + j);
    float tail = tv_vsum(&last);
    for (; j < n; ++j) tail += row[j];
    y[i] = (float)((total + (double)tail) / (double)n);
  }
}
__attribute__((unused)) static int32_t tv_mean_f32(int64_t rows, int64_t n, const float* restrict x,
                                                   float* restrict y) {
  #pragma omp parallel for schedule(static) num_threads(tv_threads()) if(rows * n >= TV_PARALLEL_ELEMENTS)
  for (int64_t i = 0; i < rows; ++i) tv_mean_rows_f32(i, i + 1, n, x, y);
  return 0;
}

#endif /* TV_KERNEL_H */
