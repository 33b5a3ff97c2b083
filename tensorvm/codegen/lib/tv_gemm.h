/* tensorvm's matrix products and convolutions for generated kernels: the BLAS bridge (tv_set_blas,
   tv_gemm_<dtype>, tv_gemm_strided_<dtype>), im2col convolution (tv_conv2d_<dtype>) and, when the
   translation unit defines TV_PACKED_KERNELS, the register-tiled products (tv_gemm_packed_f32, the
   on-the-fly packing of tv_gemm_f32: tv_vgemm.h, vector extensions instantiated for the host) and the
   direct convolution (tv_conv2d_direct_f32: tv_vconv.h, the same vectors). Shared libraries only (the host hands over its BLAS):
   c_emit.prelude() puts this file's text after tv_kernel.h's in each generated translation unit. */
#ifndef TV_GEMM_H
#define TV_GEMM_H

#include "tv_kernel.h"
#include <time.h>

/* ---- BLAS from C (shared libraries only; see tensorvm/codegen/strategy.py) ----
   The host hands over its CBLAS entry points (64-bit integers, as NumPy's OpenBLAS) with tv_set_blas.
   tv_gemm_<dtype> computes a batch of products C = op(A) op(B) on the kernels' threads (tv_team.h), each
   thread one single-threaded BLAS call on its share (batch entries, column or row blocks), so BLAS's
   own thread pool never competes with the kernels' for the cores. Without BLAS, plain loops run. */
typedef void (*tv_sgemm_fn)(int, int, int, int64_t, int64_t, int64_t, float, const float*, int64_t,
                            const float*, int64_t, float, float*, int64_t);
typedef void (*tv_dgemm_fn)(int, int, int, int64_t, int64_t, int64_t, double, const double*, int64_t,
                            const double*, int64_t, double, double*, int64_t);
typedef void (*tv_sgemv_fn)(int, int, int64_t, int64_t, float, const float*, int64_t, const float*, int64_t,
                            float, float*, int64_t);
typedef void (*tv_dgemv_fn)(int, int, int64_t, int64_t, double, const double*, int64_t, const double*, int64_t,
                            double, double*, int64_t);
typedef int (*tv_blas_get_threads_fn)(void);
typedef void (*tv_blas_set_threads_fn)(int);
__attribute__((weak, visibility("hidden"))) tv_sgemm_fn tv_blas_gemm_f32;
__attribute__((weak, visibility("hidden"))) tv_dgemm_fn tv_blas_gemm_f64;
__attribute__((weak, visibility("hidden"))) tv_sgemv_fn tv_blas_gemv_f32;
__attribute__((weak, visibility("hidden"))) tv_dgemv_fn tv_blas_gemv_f64;
__attribute__((weak, visibility("hidden"))) tv_blas_get_threads_fn tv_blas_get_threads;
__attribute__((weak, visibility("hidden"))) tv_blas_set_threads_fn tv_blas_set_threads;

__attribute__((weak)) int32_t tv_set_blas(void* sgemm, void* dgemm, void* sgemv, void* dgemv, void* get_threads,
                                          void* set_threads) {
  tv_blas_gemm_f32 = (tv_sgemm_fn)sgemm; tv_blas_gemm_f64 = (tv_dgemm_fn)dgemm;
  tv_blas_gemv_f32 = (tv_sgemv_fn)sgemv; tv_blas_gemv_f64 = (tv_dgemv_fn)dgemv;
  tv_blas_get_threads = (tv_blas_get_threads_fn)get_threads;
  tv_blas_set_threads = (tv_blas_set_threads_fn)set_threads;
  return 0;
}

#include "tv_clock.h"

#ifdef _OPENMP
#include "tv_team.h"
static inline int tv_omp_max_threads(void) { return tv_threads(); }
static inline int tv_omp_in_parallel(void) { return omp_in_parallel(); }
static inline int tv_omp_thread(void) { return omp_get_thread_num(); }
static inline int tv_omp_team(void) { return omp_get_num_threads(); }
#else
static inline int tv_omp_max_threads(void) { return 1; }
static inline int tv_omp_in_parallel(void) { return 0; }
static inline int tv_omp_thread(void) { return 0; }
static inline int tv_omp_team(void) { return 1; }
typedef void (*tv_team_fn)(void* ctx, int64_t chunk);
static inline void tv_team_run(int64_t chunks, int threads, tv_team_fn fn, void* ctx) {
  (void)threads;
  for (int64_t i = 0; i < chunks; ++i) fn(ctx, i);
}
static inline int64_t tv_team_mirror(int64_t i, int64_t chunks, int64_t threads) {
  (void)threads;
  return chunks - 1 - i;  /* (one thread: its home range is the whole job) */
}
static inline int64_t tv_team_narrow_work(int64_t built) { return built; }
static inline int64_t tv_team_wide_work(int64_t built) { return built; }
static inline int64_t tv_team_chunk_elements(int64_t built) { return built; }
#endif

/* The chunks of a generated parallel loop (c_emit.py: its outlined body runs through tv_team_run) of
   `iterations` iterations of about `work` elements each: TV_TEAM_LOOP_CHUNKS per thread, so that a thread
   whose core is busy leaves little to the others; fewer when a chunk would hold fewer than
   tv_team_chunk_elements (host.py: team_chunk_elements, from the split cost the running pool measured;
   TV_TEAM_CHUNK_ELEMENTS, the rule for an unmeasured host, without one); one on one thread; none for no
   iteration. */
#ifndef TV_TEAM_CHUNK_ELEMENTS
#define TV_TEAM_CHUNK_ELEMENTS 4096
#endif
#define TV_TEAM_LOOP_CHUNKS 4
static inline int tv_team_threads(void) { return tv_omp_max_threads(); }  /* (the budget, tv_set_num_threads) */
static inline int64_t tv_team_chunks(int64_t iterations, int64_t work, int threads) {
  if (iterations <= 1 || threads <= 1) return iterations < 1 ? 0 : 1;
  const double total = (double)iterations * (double)(work > 1 ? work : 1);
  double chunks = (double)TV_TEAM_LOOP_CHUNKS * threads;
  const double least = (double)tv_team_chunk_elements(TV_TEAM_CHUNK_ELEMENTS);
  if (chunks > total / least) chunks = total / least;
  if (chunks > (double)iterations) chunks = (double)iterations;
  return chunks < 1 ? 1 : (int64_t)chunks;
}

/* The row-wise library functions of the kernels of a shared library (tv_kernel.h's tv_softmax_f32 and
   tv_mean_f32 are their static AOT forms): the rows in chunks on the pool, from TV_PARALLEL_ELEMENTS
   elements. rows_fn computes rows [first, end) of n floats; flag is its one option (the softmax's log).
   The kernels, emitted after this file, call the team forms through the macros. */
typedef void (*tv_rows_fn)(int64_t first, int64_t end, int64_t n, const float* x, float* y, int64_t flag);
typedef struct { tv_rows_fn rows_fn; int64_t rows, n, flag, chunks; const float* x; float* y; } tv_rows_job;
static void tv_rows_chunk(void* ctx, int64_t i) {
  const tv_rows_job* j = (const tv_rows_job*)ctx;
  j->rows_fn(i * j->rows / j->chunks, (i + 1) * j->rows / j->chunks, j->n, j->x, j->y, j->flag);
}
static int32_t tv_rows_team_f32(tv_rows_fn rows_fn, int64_t rows, int64_t n, const float* x, float* y,
                                int64_t flag) {
  const int threads = rows * n >= TV_PARALLEL_ELEMENTS ? tv_team_threads() : 1;
  tv_rows_job job = {rows_fn, rows, n, flag, tv_team_chunks(rows, n, threads), x, y};
  tv_team_run(job.chunks, threads, tv_rows_chunk, &job);
  return 0;
}
__attribute__((unused)) static int32_t tv_softmax_team_f32(int64_t rows, int64_t n, const float* x, float* y,
                                                           int64_t log_softmax) {
  return tv_rows_team_f32(tv_softmax_rows_f32, rows, n, x, y, log_softmax);
}
#define tv_softmax_f32 tv_softmax_team_f32
static void tv_mean_rows_any_f32(int64_t first, int64_t end, int64_t n, const float* x, float* y, int64_t flag) {
  (void)flag;
  tv_mean_rows_f32(first, end, n, x, y);
}
__attribute__((unused)) static int32_t tv_mean_team_f32(int64_t rows, int64_t n, const float* x, float* y) {
  return tv_rows_team_f32(tv_mean_rows_any_f32, rows, n, x, y, 0);
}
#define tv_mean_f32 tv_mean_team_f32

/* One operand of a batched product of outer x inner entries: entry i starts at
   (i / inner) * outer_step + (i % inner) * inner_step elements; its rows (its columns when transposed)
   are ld apart. */
typedef struct { int64_t outer_step, inner_step, ld, transposed; } tv_gemm_view;
static inline int64_t tv_gemm_entry(tv_gemm_view v, int64_t i, int64_t inner) {
  return inner == 1 ? i * v.outer_step : i / inner * v.outer_step + i % inner * v.inner_step;
}
/* The view of a rows x cols matrix with these strides, for BLAS: one stride must be 1 (the other is
   then the leading dimension, at least the extent it skips); a single row or column takes either.
   Returns 0 when the strides fit neither. */
static inline int tv_gemm_layout(int64_t rows, int64_t cols, int64_t outer_step, int64_t inner_step,
                                 int64_t row, int64_t col, tv_gemm_view* v) {
  v->outer_step = outer_step, v->inner_step = inner_step;
  if (col == 1 || cols <= 1) {
    v->transposed = 0, v->ld = rows > 1 ? row : (cols > 1 ? cols : 1);
    return rows <= 1 || row >= cols;
  }
  if (row == 1 || rows <= 1) {
    v->transposed = 1, v->ld = cols > 1 ? col : (rows > 1 ? rows : 1);
    return cols <= 1 || col >= rows;
  }
  return 0;
}

/* Below this many multiply-adds a product runs on the calling thread only (host.py: parallel_work
   derives it from the host's vector width; this default is its value for AVX2), or below tv_team_wide_work's
   (the same rule over the split cost the running pool measured). */
#ifndef TV_GEMM_PARALLEL_WORK
#define TV_GEMM_PARALLEL_WORK 262144.0
#endif
static inline int tv_gemm_parallel(double work) {
  return work >= (double)tv_team_wide_work((int64_t)TV_GEMM_PARALLEL_WORK) && !tv_omp_in_parallel()
         && tv_omp_max_threads() > 1;
}
/* A product of fewer rows than a vector has lanes streams its weights (memory-bound): it splits from
   tv_team_narrow_work (host.py: parallel_work_narrow, from the split cost the running pool measured;
   TV_GEMM_PARALLEL_WORK_NARROW, the rule for an unmeasured host, without one), as
   each thread then reads its part of the weights from its own core's cache. tv_gemm_run passes its
   narrower side (rows or columns): a product of one column (a 1 x 1 image's 1x1 convolution, the
   squeeze-and-excitation layers) reads each weight for one multiply-add, as one row does. */
#ifndef TV_GEMM_PARALLEL_WORK_NARROW
#define TV_GEMM_PARALLEL_WORK_NARROW TV_GEMM_PARALLEL_WORK
#endif
static inline int tv_gemm_parallel_rows(double work, int64_t rows) {
  const double least = rows < TV_VLANES ? (double)tv_team_narrow_work((int64_t)TV_GEMM_PARALLEL_WORK_NARROW)
                                        : (double)tv_team_wide_work((int64_t)TV_GEMM_PARALLEL_WORK);
  return work >= least && !tv_omp_in_parallel() && tv_omp_max_threads() > 1;
}

/* A product whose B fits in L2 runs on the packed product's register tiles, B packed on the fly
   (defined with the tiles below; 0: not taken, BLAS then). */
static int tv_gemm_onthefly_f32(float alpha, int64_t m, int64_t n, int64_t k, const float* a, int64_t lda,
                                int64_t ta, const float* b, int64_t ldb, int64_t tb, float* c, int64_t ldc);
static inline int tv_gemm_tiles_fit_f32(int64_t n, int64_t k, int64_t ta);
static inline int tv_gemm_tiles_fit_f64(int64_t n, int64_t k, int64_t ta) { (void)n, (void)k, (void)ta; return 0; }

/* The variant a product whose B fits the on-the-fly tiles runs, per shape class (calibrate.py's classes:
   rows 1 / <= 16 / <= 128 / more, x B's floats within L1d / L2 / L3 / beyond, TV_L1D.. from host.py):
   TV_GEMM_RULE (0: not chosen yet, the rule: the tiles), TV_GEMM_TILES or TV_GEMM_BLAS. A class not
   chosen yet is calibrated on its first product when tv_gemm_calibration is set: each variant runs twice
   on the real operands (every run computes the same C) and the faster stays. Python pins a variant or
   loads a cached choice with tv_gemm_set_choice and reads the table with tv_gemm_choices. */
#define TV_GEMM_RULE 0
#define TV_GEMM_TILES 1
#define TV_GEMM_BLAS 2
#define TV_GEMM_CLASSES 16
#ifndef TV_L1D
#define TV_L1D 32768
#endif
#ifndef TV_L2
#define TV_L2 524288
#endif
#ifndef TV_L3
#define TV_L3 33554432
#endif
__attribute__((weak, visibility("hidden"))) int32_t tv_gemm_choice[TV_GEMM_CLASSES];
__attribute__((weak, visibility("hidden"))) int64_t tv_gemm_calibration_ns[TV_GEMM_CLASSES][2];
__attribute__((weak, visibility("hidden"))) int32_t tv_gemm_calibration = 1;
__attribute__((weak)) int32_t tv_gemm_set_choice(int32_t cls, int32_t variant, int32_t calibrate) {
  if (cls >= 0 && cls < TV_GEMM_CLASSES) __atomic_store_n(&tv_gemm_choice[cls], variant, __ATOMIC_RELAXED);
  __atomic_store_n(&tv_gemm_calibration, calibrate, __ATOMIC_RELAXED);
  return 0;
}
__attribute__((weak)) int32_t tv_gemm_choices(int32_t* variants, int64_t* nanoseconds) {
  for (int c = 0; c < TV_GEMM_CLASSES; ++c) {
    variants[c] = __atomic_load_n(&tv_gemm_choice[c], __ATOMIC_RELAXED);
    nanoseconds[2 * c] = tv_gemm_calibration_ns[c][0], nanoseconds[2 * c + 1] = tv_gemm_calibration_ns[c][1];
  }
  return TV_GEMM_CLASSES;
}
static inline int tv_gemm_class(int64_t m, int64_t n, int64_t k) {
  const int rows = m <= 1 ? 0 : m <= 16 ? 1 : m <= 128 ? 2 : 3;
  const double bytes = 4.0 * (double)n * (double)k;
  const int fits = bytes <= TV_L1D ? 0 : bytes <= TV_L2 ? 1 : bytes <= TV_L3 ? 2 : 3;
  return rows * 4 + fits;
}
static inline int tv_gemm_onthefly_f64(double alpha, int64_t m, int64_t n, int64_t k, const double* a, int64_t lda,
                                       int64_t ta, const double* b, int64_t ldb, int64_t tb, double* c, int64_t ldc) {
  (void)alpha, (void)m, (void)n, (void)k, (void)a, (void)lda, (void)ta, (void)b, (void)ldb, (void)tb, (void)c, (void)ldc;
  return 0;
}

#define TV_GEMM(T, S)                                                                                \
  /* c (m x n, row stride ldc) = alpha op(a) op(b); op(a) is m x k, op(b) is k x n. */               \
  static void tv_gemm_block_##S(T alpha, int64_t m, int64_t n, int64_t k, const T* a, int64_t lda,   \
                                int64_t ta, const T* b, int64_t ldb, int64_t tb, T* c, int64_t ldc,  \
                                int variant) {                                                     \
    if (m <= 0 || n <= 0) return;                                                                  \
    /* one column (a 1x1 convolution of a 1x1 image: squeeze-and-excitation): a GEMV, not panels of   \
       which all columns but one are padding */                                                    \
    if (n == 1 && m > 1 && tv_blas_gemv_##S != NULL) {                                            \
      tv_blas_gemv_##S(101, ta ? 112 : 111, ta ? k : m, ta ? m : k, alpha, a, lda, b, tb ? 1 : ldb, (T)0, c, ldc); \
      return;                                                                                      \
    }                                                                                              \
    if (m > 1 && variant != TV_GEMM_BLAS && tv_gemm_onthefly_##S(alpha, m, n, k, a, lda, ta, b, ldb, tb, c, ldc)) \
      return;                                                                                      \
    if (tv_blas_gemm_##S != NULL) {                                                               \
      if (m == 1 && !ta && tv_blas_gemv_##S != NULL) {                                            \
        if (tb) tv_blas_gemv_##S(101, 111, n, k, alpha, b, ldb, a, 1, (T)0, c, 1);                \
        else tv_blas_gemv_##S(101, 112, k, n, alpha, b, ldb, a, 1, (T)0, c, 1);                   \
      } else {                                                                                     \
        tv_blas_gemm_##S(101, ta ? 112 : 111, tb ? 112 : 111, m, n, k, alpha, a, lda, b, ldb, (T)0, c, ldc); \
      }                                                                                            \
      return;                                                                                      \
    }                                                                                              \
    for (int64_t i = 0; i < m; ++i)                                                                \
      for (int64_t j = 0; j < n; ++j) {                                                            \
        T acc = 0;                                                                                 \
        for (int64_t p = 0; p < k; ++p)                                                            \
          acc += (ta ? a[p * lda + i] : a[i * lda + p]) * (tb ? b[j * ldb + p] : b[p * ldb + j]);  \
        c[i * ldc + j] = alpha * acc;                                                              \
      }                                                                                            \
  }                                                                                                \
  /* For t of nt shares: its batch entries (by_entries), else its columns or its rows. */           \
  static void tv_gemm_share_##S(int t, int nt, int by_entries, T alpha, int64_t batch, int64_t inner, \
                                int64_t m, int64_t n, int64_t k, const T* a, tv_gemm_view av, const T* b, \
                                tv_gemm_view bv, T* c, tv_gemm_view cv, int variant) {             \
    const int64_t lda = av.ld, ta = av.transposed, ldb = bv.ld, tb = bv.transposed, ldc = cv.ld;    \
    if (nt == 1 || by_entries) {                                                                   \
      const int64_t b0 = t * batch / nt, b1 = (t + 1) * batch / nt;                                \
      for (int64_t i = b0; i < b1; ++i)                                                            \
        tv_gemm_block_##S(alpha, m, n, k, a + tv_gemm_entry(av, i, inner), lda, ta, b + tv_gemm_entry(bv, i, inner), \
                          ldb, tb, c + tv_gemm_entry(cv, i, inner), ldc, variant);                 \
    } else if (m == 1 || n >= 32 * nt) {                                                           \
      const int64_t per = ((n + nt - 1) / nt + 15) / 16 * 16;                                      \
      const int64_t n0 = t * per < n ? t * per : n, n1 = n0 + per < n ? n0 + per : n;              \
      for (int64_t i = 0; i < batch; ++i)                                                          \
        tv_gemm_block_##S(alpha, m, n1 - n0, k, a + tv_gemm_entry(av, i, inner), lda, ta,          \
                          b + tv_gemm_entry(bv, i, inner) + (tb ? n0 * ldb : n0), ldb, tb,         \
                          c + tv_gemm_entry(cv, i, inner) + n0, ldc, variant);                     \
    } else {                                                                                       \
      const int64_t per = (m + nt - 1) / nt;                                                       \
      const int64_t m0 = t * per < m ? t * per : m, m1 = m0 + per < m ? m0 + per : m;              \
      for (int64_t i = 0; i < batch; ++i)                                                          \
        tv_gemm_block_##S(alpha, m1 - m0, n, k, a + tv_gemm_entry(av, i, inner) + (ta ? m0 : m0 * lda), lda, ta, \
                          b + tv_gemm_entry(bv, i, inner), ldb, tb, c + tv_gemm_entry(cv, i, inner) + m0 * ldc, ldc, \
                          variant);                                                                \
    }                                                                                              \
  }                                                                                                \
  typedef struct {                                                                                 \
    T alpha; int64_t batch, inner, m, n, k, chunks; int by_entries; const T* a; tv_gemm_view av;    \
    const T* b; tv_gemm_view bv; T* c; tv_gemm_view cv; int variant;                                \
  } tv_gemm_job_##S;                                                                               \
  static void tv_gemm_chunk_##S(void* arg, int64_t i) {                                            \
    const tv_gemm_job_##S* j = (const tv_gemm_job_##S*)arg;                                        \
    tv_gemm_share_##S((int)i, (int)j->chunks, j->by_entries, j->alpha, j->batch, j->inner, j->m, j->n, j->k, \
                      j->a, j->av, j->b, j->bv, j->c, j->cv, j->variant);                          \
  }                                                                                                \
  static void tv_gemm_split_##S(int threads, int variant, T alpha, int64_t batch, int64_t inner, int64_t m, \
                                int64_t n, int64_t k, const T* a, tv_gemm_view av, const T* b,       \
                                tv_gemm_view bv, T* c, tv_gemm_view cv) {                          \
    if (threads > 1) { /* the caller runs the shares of workers not started (tv_team_run) */      \
      /* A batch of TV_TEAM_LOOP_CHUNKS entries per thread or more, or of a multiple of the threads \
         (the heads of an attention times its batch), goes by whole entries in up to                 \
         TV_TEAM_LOOP_CHUNKS shares per thread: a worker that starts late leaves the caller a few    \
         entries, not half of the batch. Else one share of the columns or of the rows per thread. */ \
      const int by_entries = batch >= TV_TEAM_LOOP_CHUNKS * threads || (batch >= threads && batch % threads == 0); \
      const int64_t most = (int64_t)TV_TEAM_LOOP_CHUNKS * threads;                                  \
      const int64_t chunks = by_entries ? (batch < most ? batch : most) : threads;                  \
      tv_gemm_job_##S job = {alpha, batch, inner, m, n, k, chunks, by_entries, a, av, b, bv, c, cv, variant}; \
      tv_team_run(chunks, threads, tv_gemm_chunk_##S, &job);                                       \
    } else {                                                                                       \
      tv_gemm_share_##S(0, 1, 1, alpha, batch, inner, m, n, k, a, av, b, bv, c, cv, variant);      \
    }                                                                                              \
  }                                                                                                \
  static int32_t tv_gemm_run_##S(T alpha, int64_t batch, int64_t inner, int64_t m, int64_t n, int64_t k, \
                                 const T* a, tv_gemm_view av, const T* b, tv_gemm_view bv, T* c,   \
                                 tv_gemm_view cv) {                                                \
    if (batch <= 0 || m <= 0 || n <= 0) return 0;                                                  \
    if (k <= 0) {                                                                                  \
      for (int64_t i = 0; i < batch; ++i)                                                          \
        for (int64_t r = 0; r < m; ++r)                                                            \
          for (int64_t j = 0; j < n; ++j) c[tv_gemm_entry(cv, i, inner) + r * cv.ld + j] = 0;      \
      return 0;                                                                                    \
    }                                                                                              \
    const int most = tv_omp_max_threads();                                                         \
    const int64_t narrow = n < m ? n : m; /* (the narrower side: see tv_gemm_parallel_rows) */     \
    const int threads = tv_gemm_parallel_rows((double)batch * m * n * k, narrow) ? most : 1;       \
    /* BLAS single-threaded while the kernels may run in parallel: its spinning workers would take \
       the cores the kernels' threads need (its setting is restored after the call). */            \
    const int blas_threads = most > 1 && tv_blas_get_threads && tv_blas_set_threads ? tv_blas_get_threads() : 1; \
    if (blas_threads != 1) tv_blas_set_threads(1);                                                 \
    /* Tiles or BLAS, when both can run it: the class's choice (see tv_gemm_choice), calibrated now    \
       on a first product of a class not chosen yet. */                                            \
    const int contest = m > 1 && n > 1 && tv_blas_gemm_##S != NULL && !tv_omp_in_parallel()          \
                        && tv_gemm_tiles_fit_##S(n, k, av.transposed);                              \
    const int cls = contest ? tv_gemm_class(m, n, k) : 0;                                          \
    const int variant = contest ? __atomic_load_n(&tv_gemm_choice[cls], __ATOMIC_RELAXED) : TV_GEMM_RULE; \
    if (contest && variant == TV_GEMM_RULE && __atomic_load_n(&tv_gemm_calibration, __ATOMIC_RELAXED)) { \
      int64_t best[2] = {INT64_MAX, INT64_MAX};                                                    \
      for (int v = 0; v < 2; ++v)                                                                  \
        for (int run = 0; run < 2; ++run) { /* (the first run also warms the caches) */            \
          const int64_t start = tv_now_ns();                                                  \
          tv_gemm_split_##S(threads, v + 1, alpha, batch, inner, m, n, k, a, av, b, bv, c, cv);    \
          const int64_t took = tv_now_ns() - start;                                           \
          best[v] = took < best[v] ? took : best[v];                                               \
        }                                                                                          \
      tv_gemm_calibration_ns[cls][0] = best[0], tv_gemm_calibration_ns[cls][1] = best[1];          \
      __atomic_store_n(&tv_gemm_choice[cls], best[0] <= best[1] ? TV_GEMM_TILES : TV_GEMM_BLAS, __ATOMIC_RELAXED); \
    } else {                                                                                       \
      tv_gemm_split_##S(threads, variant, alpha, batch, inner, m, n, k, a, av, b, bv, c, cv);      \
    }                                                                                              \
    if (blas_threads != 1) tv_blas_set_threads(blas_threads);                                      \
    return 0;                                                                                      \
  }                                                                                                \
  /* Contiguous operands: A and B entries a_step and b_step apart (0: shared by the batch); C = alpha A B. */ \
  __attribute__((unused)) static int32_t tv_gemm_##S(int64_t batch, int64_t m, int64_t n, int64_t k, \
      const T* a, int64_t a_step, int64_t ta, const T* b, int64_t b_step, int64_t tb, T* c, T alpha) { \
    const tv_gemm_view av = {a_step, 0, ta ? m : k, ta}, bv = {b_step, 0, tb ? k : n, tb}, cv = {m * n, 0, n, 0}; \
    return tv_gemm_run_##S(alpha, batch, 1, m, n, k, a, av, b, bv, c, cv);                         \
  }                                                                                                \
  /* Strided operands (transposes read in place): the batch is outer x inner entries; each operand  \
     gives its outer and inner entry steps and its row and column strides (one of them 1); C = alpha A B. */ \
  __attribute__((unused)) static int32_t tv_gemm_strided_##S(int64_t outer, int64_t inner, int64_t m, int64_t n, \
      int64_t k, const T* a, int64_t a_outer, int64_t a_inner, int64_t a_row, int64_t a_col,        \
      const T* b, int64_t b_outer, int64_t b_inner, int64_t b_row, int64_t b_col,                   \
      T* c, int64_t c_outer, int64_t c_inner, int64_t c_row, int64_t c_col, T alpha) {              \
    tv_gemm_view av, bv, cv;                                                                       \
    if (!tv_gemm_layout(m, k, a_outer, a_inner, a_row, a_col, &av)                                 \
        || !tv_gemm_layout(k, n, b_outer, b_inner, b_row, b_col, &bv)                              \
        || !tv_gemm_layout(m, n, c_outer, c_inner, c_row, c_col, &cv) || cv.transposed) return 1004; \
    return tv_gemm_run_##S(alpha, outer * inner, inner, m, n, k, a, av, b, bv, c, cv);             \
  }
TV_GEMM(float, f32) TV_GEMM(double, f64)

/* Convolution (NCHW data, OIHW weights) as products: per image, the input patches are unfolded into
   col (C*KH*KW rows of OH*OW; im2col), then out = weights (O x C*KH*KW) . col. direct: a 1x1 kernel
   with unit strides and no padding, whose patches are the image itself. */
#define TV_CONV2D(T, S)                                                                              \
  /* The rows of col of chunk i (one row per channel and kernel tap: oh * ow elements). */          \
  typedef struct {                                                                                 \
    const T* x; T* col;                                                                            \
    int64_t h, w, oh, ow, kh, kw, sh, sw, dh, dw, pt, pl, rows, chunks;                            \
  } tv_im2col_job_##S;                                                                             \
  static void tv_im2col_chunk_##S(void* ctx, int64_t chunk) {                                      \
    const tv_im2col_job_##S* job = (const tv_im2col_job_##S*)ctx;                                  \
    const T* x = job->x;                                                                           \
    T* col = job->col;                                                                             \
    const int64_t h = job->h, w = job->w, oh = job->oh, ow = job->ow, kh = job->kh, kw = job->kw;   \
    const int64_t sh = job->sh, sw = job->sw, dh = job->dh, dw = job->dw, pt = job->pt, pl = job->pl; \
    const int64_t first = chunk * job->rows / job->chunks, last = (chunk + 1) * job->rows / job->chunks; \
    for (int64_t r = first; r < last; ++r) {                                                       \
      const int64_t ci = r / (kh * kw), ki = (r / kw) % kh, kj = r % kw;                          \
      const T* src = x + ci * h * w;                                                               \
      const int64_t x0 = kj * dw - pl;                                                             \
      const int64_t lo = sw == 1 ? (x0 < 0 ? (-x0 < ow ? -x0 : ow) : 0) : 0;                       \
      const int64_t hi = sw == 1 ? (w - x0 < lo ? lo : (w - x0 < ow ? w - x0 : ow)) : 0;            \
      for (int64_t y = 0; y < oh; ++y) {                                                           \
        T* d = col + (r * oh + y) * ow;                                                            \
        const int64_t iy = y * sh + ki * dh - pt;                                                  \
        if (iy < 0 || iy >= h) { for (int64_t j = 0; j < ow; ++j) d[j] = 0; continue; }           \
        const T* row = src + iy * w;                                                               \
        if (sw == 1) {                                                                             \
          for (int64_t j = 0; j < lo; ++j) d[j] = 0;                                               \
          for (int64_t j = lo; j < hi; ++j) d[j] = row[j + x0];                                    \
          for (int64_t j = hi; j < ow; ++j) d[j] = 0;                                              \
        } else {                                                                                   \
          for (int64_t j = 0; j < ow; ++j) {                                                       \
            const int64_t ix = j * sw + x0;                                                        \
            d[j] = ix >= 0 && ix < w ? row[ix] : (T)0;                                             \
          }                                                                                        \
        }                                                                                          \
      }                                                                                            \
    }                                                                                              \
  }                                                                                                \
  /* col = the patches of image x, its rows in chunks on the pool from TV_PARALLEL_ELEMENTS elements. */ \
  static void tv_im2col_##S(const T* x, int64_t c, int64_t h, int64_t w, int64_t oh, int64_t ow,     \
                            int64_t kh, int64_t kw, int64_t sh, int64_t sw, int64_t dh, int64_t dw,  \
                            int64_t pt, int64_t pl, T* col) {                                        \
    const int64_t rows = c * kh * kw;                                                              \
    const int threads = rows * oh * ow >= TV_PARALLEL_ELEMENTS ? tv_team_threads() : 1;            \
    tv_im2col_job_##S job = {x, col, h, w, oh, ow, kh, kw, sh, sw, dh, dw, pt, pl, rows,            \
                             tv_team_chunks(rows, oh * ow, threads)};                              \
    tv_team_run(job.chunks, threads, tv_im2col_chunk_##S, &job);                                   \
  }                                                                                                \
  __attribute__((unused)) static int32_t tv_conv2d_##S(int64_t n, int64_t c, int64_t h, int64_t w, \
      int64_t o, int64_t oh, int64_t ow, int64_t kh, int64_t kw, int64_t sh, int64_t sw, int64_t dh, \
      int64_t dw, int64_t pt, int64_t pl, int64_t direct, const T* x, const T* weights, T* col, T* out) { \
    for (int64_t b = 0; b < n; ++b) {                                                              \
      const T* patches = x + b * c * h * w;                                                        \
      if (!direct) {                                                                               \
        tv_im2col_##S(patches, c, h, w, oh, ow, kh, kw, sh, sw, dh, dw, pt, pl, col);              \
        patches = col;                                                                             \
      }                                                                                            \
      tv_gemm_##S(1, o, oh * ow, c * kh * kw, weights, 0, 0, patches, 0, 0, out + b * o * oh * ow, (T)1); \
    }                                                                                              \
    return 0;                                                                                      \
  }
TV_CONV2D(float, f32) TV_CONV2D(double, f64)

/* The max pool (its own row buffers and vectors; no products): in every unit, as the softmax. */
#include "tv_vpool.h"

/* The register-tiled products and the direct convolution below are most of the cost of
   compiling a small library (0.7 s of a 0.9 s build of one softmax kernel): a translation unit has them only
   when one of its kernels multiplies matrices or convolves (c_emit.emit_library then has prelude() define
   TV_PACKED_KERNELS); otherwise the on-the-fly product is a stub that is never called. */
#ifdef TV_PACKED_KERNELS
/* ---- products with pre-packed weights (nn.dense_packed; tensorvm/transform/pack_weights.py) ----
   The register-tiled product is written once with vector extensions in tv_vgemm.h, for the vector width,
   register tile and cache blocks that tensorvm/codegen/host.py derives from the host (c_emit.prelude()
   defines them before this text). tv_gemm_packed_f32 is its entry point for generated kernels: lanes is
   the panel width the weight was packed with (another than this build's runs plain loops). */
#include "tv_vgemm.h"
__attribute__((unused)) static int32_t tv_gemm_packed_f32(int64_t m, int64_t n, int64_t k, int64_t lanes,
                                                          const float* x, const float* packed, float* out) {
  return tv_vgemm_packed_any_f32(m, n, k, lanes, x, packed, out);
}

/* B (op(B): k x n) packed on the fly into panels scaled by alpha, as nn.dense_packed's weights are at
   compile time, then the register tiles over A read in place: no copy of A and no pass zeroing C, both
   of which BLAS makes. Taken when B has at most TV_VGEMM_ONTHEFLY floats (it stays in L2), A is not
   transposed and the target has FMA (without, BLAS's kernels beat the portable tiles): attention's
   products (Q K^T with k = 64, P V with n = 64) were 4% and 9% faster than OpenBLAS at BERT-small's 256
   tokens on AVX2. */
#if defined(__FMA__) || defined(__ARM_FEATURE_FMA)
static inline int tv_gemm_tiles_fit_f32(int64_t n, int64_t k, int64_t ta) {
  return !ta && k * ((n + TV_VGEMM_NR - 1) / TV_VGEMM_NR * TV_VGEMM_NR) <= TV_VGEMM_ONTHEFLY;
}
static int tv_gemm_onthefly_f32(float alpha, int64_t m, int64_t n, int64_t k, const float* a, int64_t lda,
                                int64_t ta, const float* b, int64_t ldb, int64_t tb, float* c, int64_t ldc) {
  const int64_t nr = TV_VGEMM_NR, panels = (n + nr - 1) / nr;
  if (ta || k * panels * nr > TV_VGEMM_ONTHEFLY) return 0;
  float* packed = (float*)malloc(sizeof(float) * (size_t)(panels * nr * k));
  if (packed == NULL) return 0;
  for (int64_t p = 0; p < panels; ++p) {
    float* panel = packed + p * k * nr;
    const int64_t cols = n - p * nr < nr ? n - p * nr : nr;
    if (tb) {  /* column j of op(B) is row j of b */
      for (int64_t j = 0; j < cols; ++j) {
        const float* row = b + (p * nr + j) * ldb;
        for (int64_t t = 0; t < k; ++t) panel[t * nr + j] = alpha * row[t];
      }
    } else {
      for (int64_t t = 0; t < k; ++t) {
        const float* row = b + t * ldb + p * nr;
        for (int64_t j = 0; j < cols; ++j) panel[t * nr + j] = alpha * row[j];
      }
    }
    for (int64_t j = cols; j < nr; ++j)
      for (int64_t t = 0; t < k; ++t) panel[t * nr + j] = 0.0f;
  }
  /* Every row under each panel (not tv_vgemm_block's row blocks, made for weights from DRAM: with this
     small B they made Q K^T at 256 rows 5% slower). */
  for (int64_t p = 0; p < panels; ++p) {
    const int64_t cols = n - p * nr < nr ? n - p * nr : nr;
    for (int64_t i = 0; i < m; i += TV_VGEMM_MR) {
      const int rows = m - i < TV_VGEMM_MR ? (int)(m - i) : TV_VGEMM_MR;
      tv_vgemm_rows(rows, a + i * lda, lda, packed + p * k * nr, k, c + i * ldc + p * nr, ldc, cols, 0, 0);
    }
  }
  free(packed);
  return 1;
}
#else
static inline int tv_gemm_tiles_fit_f32(int64_t n, int64_t k, int64_t ta) { (void)n, (void)k, (void)ta; return 0; }
static int tv_gemm_onthefly_f32(float alpha, int64_t m, int64_t n, int64_t k, const float* a, int64_t lda,
                                int64_t ta, const float* b, int64_t ldb, int64_t tb, float* c, int64_t ldc) {
  (void)alpha, (void)m, (void)n, (void)k, (void)a, (void)lda, (void)ta, (void)b, (void)ldb, (void)tb, (void)c, (void)ldc;
  return 0;
}
#endif

#include "tv_vconv.h"
#include "tv_vpointwise.h"
#else
static inline int tv_gemm_tiles_fit_f32(int64_t n, int64_t k, int64_t ta) { (void)n, (void)k, (void)ta; return 0; }
static int tv_gemm_onthefly_f32(float alpha, int64_t m, int64_t n, int64_t k, const float* a, int64_t lda,
                                int64_t ta, const float* b, int64_t ldb, int64_t tb, float* c, int64_t ldc) {
  (void)alpha, (void)m, (void)n, (void)k, (void)a, (void)lda, (void)ta, (void)b, (void)ldb, (void)tb, (void)c, (void)ldc;
  return 0;  /* (no kernel of this translation unit multiplies matrices) */
}
#endif /* TV_PACKED_KERNELS */

#endif /* TV_GEMM_H */
