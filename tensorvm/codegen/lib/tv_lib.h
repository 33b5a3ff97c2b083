/* tensorvm's C library functions: the common part (dtype codes, error codes, typed loads and stores).

   A library function computes an op a tensor expression cannot state (see LibraryKernel in
   tensorvm/op/registry.py). It is called from a generated kernel, returns 0 or an error code of the
   kernel ABI (tensorvm/codegen/c_emit.py: ERROR_*), and takes arrays as pointers with their dtype as a
   TV_DTYPE_* code where one function serves several dtypes. Every definition is static: the code
   generator includes the library's text in each translation unit whose kernels call it. */
#ifndef TV_LIB_H
#define TV_LIB_H

#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* An OpenMP directive, where the compiler runs with OpenMP; else nothing (tv_lib_run's static AOT form). */
#ifdef _OPENMP
#define TV_LIB_OMP(directive) _Pragma(#directive)
#else
#define TV_LIB_OMP(directive)
#endif

/* A library function's parallel loop: fn(ctx, i) for every chunk i in [0, chunks), each chunk a
   contiguous run of iterations (tv_lib_chunks of them: a few per thread). In a shared library, whose
   prelude holds tv_gemm.h, on tensorvm's pool (tv_team_run), the one every other kernel loop runs on;
   in the static AOT model, which has no pool (tensorvm/aot/build.py), an OpenMP loop over the chunks
   where compiled with OpenMP, else serially. */
typedef void (*tv_lib_chunk_fn)(void* ctx, int64_t chunk);
/* The thread budget of the prelude (tv_set_num_threads) where the unit has threads, else 1 (also in a
   unit without the prelude: the C shape functions' includes this file through tv_shape.h). */
static inline int tv_lib_threads(void) {
#if defined(_OPENMP) && defined(TV_KERNEL_H)
  return tv_threads();
#else
  return 1;
#endif
}
#ifdef TV_GEMM_H
static inline int64_t tv_lib_chunks(int64_t iterations, int64_t work, int threads) {
  return tv_team_chunks(iterations, work, threads);
}
static inline void tv_lib_run(int64_t chunks, int threads, tv_lib_chunk_fn fn, void* ctx) {
  tv_team_run(chunks, threads, fn, ctx);
}
#else
static inline int64_t tv_lib_chunks(int64_t iterations, int64_t work, int threads) {
  (void)work;
  if (iterations <= 1 || threads <= 1) return iterations < 1 ? 0 : 1;
  return iterations < 4 * (int64_t)threads ? iterations : 4 * (int64_t)threads;
}
static inline void tv_lib_run(int64_t chunks, int threads, tv_lib_chunk_fn fn, void* ctx) {
  (void)threads; /* (without OpenMP) */
  /* the static AOT model's only parallel region of a library file */
  TV_LIB_OMP(omp parallel for schedule(dynamic) num_threads(threads) if(threads > 1 && chunks > 1))
  for (int64_t i = 0; i < chunks; i++) fn(ctx, i);
}
#endif

/* The dtype codes (tensorvm/op/library.py: DTYPE_CODES, in this order). */
enum {
  TV_DTYPE_BOOL, TV_DTYPE_INT8, TV_DTYPE_INT16, TV_DTYPE_INT32, TV_DTYPE_INT64, TV_DTYPE_UINT8,
  TV_DTYPE_UINT16, TV_DTYPE_UINT32, TV_DTYPE_UINT64, TV_DTYPE_FLOAT16, TV_DTYPE_FLOAT32, TV_DTYPE_FLOAT64
};

/* The kernel ABI's run-time error codes (c_emit.RUNTIME_ERRORS). */
#define TV_ERROR_INDEX 1002         /* an index is out of range */
#define TV_ERROR_OUT_OF_MEMORY 1003 /* a temporary could not be allocated */
#define TV_ERROR_SIZE 1005          /* an output's size does not match what the data gives */
#define TV_ERROR_DTYPE 1006         /* a dtype code the function does not handle */

/* X(code, C type, suffix, is_float) for every dtype (TV_LIB_NUMBERS: all but bool); two copies, so
   that a macro expanded from one list can expand the other (a macro is not expanded again inside its
   own expansion). float16 only where the compiler has _Float16 (elsewhere a function given it returns
   TV_ERROR_DTYPE). */
#ifdef __FLT16_MAX__
#define TV_LIB_FLOAT16(X) X(TV_DTYPE_FLOAT16, _Float16, f16, 1)
#define TV_LIB_FLOAT16_INNER(X) X(TV_DTYPE_FLOAT16, _Float16, f16, 1)
#else
#define TV_LIB_FLOAT16(X)
#define TV_LIB_FLOAT16_INNER(X)
#endif
#define TV_LIB_NUMBERS(X)                                                                           \
  X(TV_DTYPE_INT8, int8_t, i8, 0) X(TV_DTYPE_INT16, int16_t, i16, 0)                                 \
  X(TV_DTYPE_INT32, int32_t, i32, 0) X(TV_DTYPE_INT64, int64_t, i64, 0)                             \
  X(TV_DTYPE_UINT8, uint8_t, u8, 0) X(TV_DTYPE_UINT16, uint16_t, u16, 0)                            \
  X(TV_DTYPE_UINT32, uint32_t, u32, 0) X(TV_DTYPE_UINT64, uint64_t, u64, 0)                         \
  TV_LIB_FLOAT16(X) X(TV_DTYPE_FLOAT32, float, f32, 1) X(TV_DTYPE_FLOAT64, double, f64, 1)
#define TV_LIB_DTYPES(X) X(TV_DTYPE_BOOL, bool, b, 0) TV_LIB_NUMBERS(X)
#define TV_LIB_DTYPES_INNER(X)                                                                      \
  X(TV_DTYPE_BOOL, bool, b, 0) X(TV_DTYPE_INT8, int8_t, i8, 0) X(TV_DTYPE_INT16, int16_t, i16, 0)     \
  X(TV_DTYPE_INT32, int32_t, i32, 0) X(TV_DTYPE_INT64, int64_t, i64, 0)                             \
  X(TV_DTYPE_UINT8, uint8_t, u8, 0) X(TV_DTYPE_UINT16, uint16_t, u16, 0)                            \
  X(TV_DTYPE_UINT32, uint32_t, u32, 0) X(TV_DTYPE_UINT64, uint64_t, u64, 0)                         \
  TV_LIB_FLOAT16_INNER(X) X(TV_DTYPE_FLOAT32, float, f32, 1) X(TV_DTYPE_FLOAT64, double, f64, 1)

__attribute__((unused)) static int64_t tv_lib_itemsize(int64_t dtype) {
  switch (dtype) {
#define TV_LIB_SIZE_CASE(CODE, T, S, F) case CODE: return (int64_t)sizeof(T);
    TV_LIB_DTYPES(TV_LIB_SIZE_CASE)
#undef TV_LIB_SIZE_CASE
    default: return 0;
  }
}

/* Element i of an integer array of any dtype, as int64 (indices), and the store back. */
__attribute__((unused)) static int64_t tv_lib_load_int(const void* p, int64_t i, int64_t dtype) {
  switch (dtype) {
#define TV_LIB_LOAD_INT_CASE(CODE, T, S, F) case CODE: return (int64_t)((const T*)p)[i];
    TV_LIB_DTYPES(TV_LIB_LOAD_INT_CASE)
#undef TV_LIB_LOAD_INT_CASE
    default: return 0;
  }
}
__attribute__((unused)) static void tv_lib_store_int(void* p, int64_t i, int64_t value, int64_t dtype) {
  switch (dtype) {
#define TV_LIB_STORE_INT_CASE(CODE, T, S, F) case CODE: ((T*)p)[i] = (T)value; break;
    TV_LIB_DTYPES(TV_LIB_STORE_INT_CASE)
#undef TV_LIB_STORE_INT_CASE
    default: break;
  }
}

/* NaN tests and the sort order: NaN is larger than every number (NumPy's order). */
#define TV_LIB_ORDER(CODE, T, S, F)                                                                 \
  static inline bool tv_lib_isnan_##S(T x) { return F ? x != x : false; }                          \
  static inline bool tv_lib_less_##S(T a, T b) {                                                    \
    return a < b || (tv_lib_isnan_##S(b) && !tv_lib_isnan_##S(a));                                  \
  }
TV_LIB_DTYPES(TV_LIB_ORDER)
#undef TV_LIB_ORDER

#endif
