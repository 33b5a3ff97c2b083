/* tensorvm's matrix products and convolutions for generated kernels: the BLAS bridge (tv_set_blas,
   tv_gemm_<dtype>, tv_gemm_strided_<dtype>), im2col convolution (tv_conv2d_<dtype>) and, when the
   translation unit defines TV_PACKED_KERNELS, the register-tiled products (tv_gemm_packed_f32, the
   on-the-fly packing of tv_gemm_f32: tv_vgemm.h, vector extensions instantiated for the host) and the
   direct convolution (tv_conv2d_direct_f32, in AVX2 where the compiler targets it and in plain C
   otherwise). Shared libraries only (the host hands over its BLAS):
   c_emit.prelude() puts this file's text after tv_kernel.h's in each generated translation unit. */
#ifndef TV_GEMM_H
#define TV_GEMM_H

#include "tv_kernel.h"

/* ---- BLAS from C (shared libraries only; see tensorvm/codegen/strategy.py) ----
   The host hands over its CBLAS entry points (64-bit integers, as NumPy's OpenBLAS) with tv_set_blas.
   tv_gemm_<dtype> computes a batch of products C = op(A) op(B) on the kernels' OpenMP threads, each
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

#ifdef _OPENMP
static inline int tv_omp_max_threads(void) { return tv_threads(); }
static inline int tv_omp_in_parallel(void) { return omp_in_parallel(); }
static inline int tv_omp_thread(void) { return omp_get_thread_num(); }
static inline int tv_omp_team(void) { return omp_get_num_threads(); }
#else
static inline int tv_omp_max_threads(void) { return 1; }
static inline int tv_omp_in_parallel(void) { return 0; }
static inline int tv_omp_thread(void) { return 0; }
static inline int tv_omp_team(void) { return 1; }
#endif

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

/* Below this many multiply-adds a product runs on the calling thread only. */
#define TV_GEMM_PARALLEL_WORK 262144.0

/* A product whose B fits in L2 runs on the packed product's register tiles, B packed on the fly
   (defined with the tiles below; 0: not taken, BLAS then). */
static int tv_gemm_onthefly_f32(float alpha, int64_t m, int64_t n, int64_t k, const float* a, int64_t lda,
                                int64_t ta, const float* b, int64_t ldb, int64_t tb, float* c, int64_t ldc);
static inline int tv_gemm_onthefly_f64(double alpha, int64_t m, int64_t n, int64_t k, const double* a, int64_t lda,
                                       int64_t ta, const double* b, int64_t ldb, int64_t tb, double* c, int64_t ldc) {
  (void)alpha, (void)m, (void)n, (void)k, (void)a, (void)lda, (void)ta, (void)b, (void)ldb, (void)tb, (void)c, (void)ldc;
  return 0;
}

#define TV_GEMM(T, S)                                                                                \
  /* c (m x n, row stride ldc) = alpha op(a) op(b); op(a) is m x k, op(b) is k x n. */               \
  static void tv_gemm_block_##S(T alpha, int64_t m, int64_t n, int64_t k, const T* a, int64_t lda,   \
                                int64_t ta, const T* b, int64_t ldb, int64_t tb, T* c, int64_t ldc) { \
    if (m <= 0 || n <= 0) return;                                                                  \
    if (m > 1 && tv_gemm_onthefly_##S(alpha, m, n, k, a, lda, ta, b, ldb, tb, c, ldc)) return;       \
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
  /* For t of nt threads: its share of the batch, of the columns or of the rows. */                \
  static void tv_gemm_share_##S(int t, int nt, T alpha, int64_t batch, int64_t inner, int64_t m, int64_t n, \
                                int64_t k, const T* a, tv_gemm_view av, const T* b, tv_gemm_view bv, \
                                T* c, tv_gemm_view cv) {                                           \
    const int64_t lda = av.ld, ta = av.transposed, ldb = bv.ld, tb = bv.transposed, ldc = cv.ld;    \
    if (nt == 1 || batch >= 4 * nt || (batch >= nt && batch % nt == 0)) {                          \
      const int64_t per = (batch + nt - 1) / nt, b0 = t * per, b1 = b0 + per < batch ? b0 + per : batch; \
      for (int64_t i = b0; i < b1; ++i)                                                            \
        tv_gemm_block_##S(alpha, m, n, k, a + tv_gemm_entry(av, i, inner), lda, ta, b + tv_gemm_entry(bv, i, inner), \
                          ldb, tb, c + tv_gemm_entry(cv, i, inner), ldc);                          \
    } else if (m == 1 || n >= 32 * nt) {                                                           \
      const int64_t per = ((n + nt - 1) / nt + 15) / 16 * 16;                                      \
      const int64_t n0 = t * per < n ? t * per : n, n1 = n0 + per < n ? n0 + per : n;              \
      for (int64_t i = 0; i < batch; ++i)                                                          \
        tv_gemm_block_##S(alpha, m, n1 - n0, k, a + tv_gemm_entry(av, i, inner), lda, ta,          \
                          b + tv_gemm_entry(bv, i, inner) + (tb ? n0 * ldb : n0), ldb, tb,         \
                          c + tv_gemm_entry(cv, i, inner) + n0, ldc);                              \
    } else {                                                                                       \
      const int64_t per = (m + nt - 1) / nt;                                                       \
      const int64_t m0 = t * per < m ? t * per : m, m1 = m0 + per < m ? m0 + per : m;              \
      for (int64_t i = 0; i < batch; ++i)                                                          \
        tv_gemm_block_##S(alpha, m1 - m0, n, k, a + tv_gemm_entry(av, i, inner) + (ta ? m0 : m0 * lda), lda, ta, \
                          b + tv_gemm_entry(bv, i, inner), ldb, tb, c + tv_gemm_entry(cv, i, inner) + m0 * ldc, ldc); \
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
    const int threads = (double)batch * m * n * k >= TV_GEMM_PARALLEL_WORK && !tv_omp_in_parallel() ? most : 1; \
    /* BLAS single-threaded while the kernels may run in parallel: its spinning workers would take \
       the cores the kernels' threads need (its setting is restored after the call). */            \
    const int blas_threads = most > 1 && tv_blas_get_threads && tv_blas_set_threads ? tv_blas_get_threads() : 1; \
    if (blas_threads != 1) tv_blas_set_threads(1);                                                 \
    if (threads > 1) {                                                                             \
      _Pragma("omp parallel num_threads(threads)")                                                 \
      tv_gemm_share_##S(tv_omp_thread(), tv_omp_team(), alpha, batch, inner, m, n, k, a, av, b, bv, c, cv); \
    } else {                                                                                       \
      tv_gemm_share_##S(0, 1, alpha, batch, inner, m, n, k, a, av, b, bv, c, cv);                  \
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
  static void tv_im2col_##S(const T* x, int64_t c, int64_t h, int64_t w, int64_t oh, int64_t ow,     \
                            int64_t kh, int64_t kw, int64_t sh, int64_t sw, int64_t dh, int64_t dw,  \
                            int64_t pt, int64_t pl, T* col) {                                        \
    const int64_t rows = c * kh * kw;                                                              \
    _Pragma("omp parallel for schedule(static) num_threads(tv_threads()) if(rows * oh * ow >= 65536)") \
    for (int64_t r = 0; r < rows; ++r) {                                                           \
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

/* The register-tiled products and the direct convolution below (with immintrin.h) are most of the cost of
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
      tv_vgemm_rows(rows, a + i * lda, lda, packed + p * k * nr, k, c + i * ldc + p * nr, ldc, cols, 0);
    }
  }
  free(packed);
  return 1;
}
#else
static int tv_gemm_onthefly_f32(float alpha, int64_t m, int64_t n, int64_t k, const float* a, int64_t lda,
                                int64_t ta, const float* b, int64_t ldb, int64_t tb, float* c, int64_t ldc) {
  (void)alpha, (void)m, (void)n, (void)k, (void)a, (void)lda, (void)ta, (void)b, (void)ldb, (void)tb, (void)c, (void)ldc;
  return 0;
}
#endif

/* The direct convolution's tiles name their accumulators per output channel with these. */
#define TV_ROWS2(F) F(0) F(1)
#define TV_ROWS3(F) TV_ROWS2(F) F(2)
#define TV_ROWS4(F) TV_ROWS3(F) F(3)
#define TV_ROWS5(F) TV_ROWS4(F) F(4)
#define TV_ROWS6(F) TV_ROWS5(F) F(5)
#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#endif

/* Direct float32 convolution, unit strides and dilation (NCHW data, OIHW weights): the image is copied
   once into a zero-padded buffer (C x HP x WP, WP = OW rounded up to 8 plus KW - 1, so every tile reads
   whole vectors without border tests), then each tile of 6 output channels x 2 rows x 8 columns keeps
   its 12 accumulators in registers over (c, ky, kx): 2 input vectors and 6 weight broadcasts feed 12
   FMAs (12 independent chains cover the FMA latency). Tails: a missing channel or row repeats the last
   one and is not stored; a partial column block goes through a small buffer. Small convolutions spend
   more in im2col and in a product with a short reduction than in the arithmetic; this reads each input
   once per tile instead.
   The tile's epilogue runs on the registers before the store, so that a CNN layer is one pass over its
   output: a per-channel ``bias`` (when ``has_bias``) starts the accumulators, ``relu`` clamps them at 0,
   and ``pool`` stores the 2x2 stride-2 maximum of each tile (1 row x 4 columns; the output is then
   C x OH/2 x OW/2, an odd last row or column dropped as max_pool2d does without ceil mode). Max pooling
   commutes with the bias and the clamp, so their order does not matter. */
static void tv_conv_pad_f32(const float* x, int64_t c, int64_t h, int64_t w, int64_t pt, int64_t pl,
                            int64_t hp, int64_t wp, float* padded) {
  /* rows of the image are copied whole, the border is cleared around them */
  const int64_t left = pl < wp ? pl : wp, cols = w < wp - left ? w : wp - left;
  for (int64_t ci = 0; ci < c; ++ci)
    for (int64_t y = 0; y < hp; ++y) {
      float* d = padded + (ci * hp + y) * wp;
      const int64_t iy = y - pt;
      if (iy < 0 || iy >= h || cols <= 0) { memset(d, 0, (size_t)wp * sizeof(float)); continue; }
      memset(d, 0, (size_t)left * sizeof(float));
      memcpy(d + left, x + (ci * h + iy) * w, (size_t)cols * sizeof(float));
      memset(d + left + cols, 0, (size_t)(wp - left - cols) * sizeof(float));
    }
}

typedef struct { const float* bias; int relu, pool; } tv_conv_epilogue;
#if defined(__AVX2__) && defined(__FMA__)
#define TV_CONV_ACC(i) __m256 a##i##0 = _mm256_set1_ps(start[i]), a##i##1 = a##i##0;
#define TV_CONV_FMA(i) { const __m256 wv = _mm256_broadcast_ss(wt[i] + t + kx);                           \
                         a##i##0 = _mm256_fmadd_ps(wv, v0, a##i##0); a##i##1 = _mm256_fmadd_ps(wv, v1, a##i##1); }
#define TV_CONV_RELU(i) a##i##0 = _mm256_max_ps(a##i##0, zero); a##i##1 = _mm256_max_ps(a##i##1, zero);
#define TV_CONV_STORE(i) _mm256_storeu_ps(tile[i][0], a##i##0); _mm256_storeu_ps(tile[i][1], a##i##1);
#define TV_CONV_STORE_OUT(i) _mm256_storeu_ps(out + ((o0 + i) * oh + y0) * ow + x0, a##i##0);       \
                             _mm256_storeu_ps(out + ((o0 + i) * oh + y0 + 1) * ow + x0, a##i##1);
/* rows max, then each even lane takes the max with its odd neighbour; the even lanes are gathered into
   the low half */
#define TV_CONV_STORE_POOL(i) { __m256 m = _mm256_max_ps(a##i##0, a##i##1);                                 \
                                m = _mm256_max_ps(m, _mm256_permute_ps(m, 0xB1));                           \
                                _mm_storeu_ps(out + ((o0 + i) * ph + y0 / 2) * pw + x0 / 2,                 \
                                              _mm256_castps256_ps128(_mm256_permutevar8x32_ps(m, evens))); }
#endif
/* The direct convolution's tile, one function per channel block (TV_CONV_TILE(6) and TV_CONV_TILE(4)):
   the accumulators are named registers written out per channel with the TV_ROWS<n> macros, so the block
   size must be a constant. TV_CONV_TILE_SUM(OC) fills tile (or, for a whole tile with AVX2, stores it
   straight to the output and returns). */
#if defined(__AVX2__) && defined(__FMA__)
#define TV_CONV_TILE_SUM(OC)                                                                         \
  TV_ROWS##OC(TV_CONV_ACC)                                                                           \
  for (int64_t ci = 0; ci < c; ++ci)                                                                 \
    for (int64_t ky = 0; ky < kh; ++ky) {                                                            \
      const float* r0 = padded + (ci * hp + y0 + ky) * wp + x0;                                      \
      const float* r1 = padded + (ci * hp + y1 + ky) * wp + x0;                                      \
      const int64_t t = (ci * kh + ky) * kw;                                                         \
      _Pragma("GCC unroll 3")                                                                        \
      for (int64_t kx = 0; kx < kw; ++kx) {                                                          \
        const __m256 v0 = _mm256_loadu_ps(r0 + kx), v1 = _mm256_loadu_ps(r1 + kx);                   \
        TV_ROWS##OC(TV_CONV_FMA)                                                                     \
      }                                                                                              \
    }                                                                                                \
  if (epi.relu) {                                                                                    \
    const __m256 zero = _mm256_setzero_ps();                                                         \
    TV_ROWS##OC(TV_CONV_RELU)                                                                        \
  }                                                                                                  \
  if (o0 + OC <= o && y0 + 1 < oh && x0 + 8 <= ow) {  /* a whole tile: straight to the output */     \
    if (epi.pool) {                                                                                  \
      const __m256i evens = _mm256_setr_epi32(0, 2, 4, 6, 0, 2, 4, 6);                               \
      TV_ROWS##OC(TV_CONV_STORE_POOL)                                                                \
    } else {                                                                                         \
      TV_ROWS##OC(TV_CONV_STORE_OUT)                                                                 \
    }                                                                                                \
    return;                                                                                          \
  }                                                                                                  \
  TV_ROWS##OC(TV_CONV_STORE)
#else
#define TV_CONV_TILE_SUM(OC)                                                                         \
  for (int i = 0; i < OC; ++i) for (int r = 0; r < 2; ++r) for (int j = 0; j < 8; ++j) tile[i][r][j] = start[i]; \
  for (int64_t ci = 0; ci < c; ++ci)                                                                 \
    for (int64_t ky = 0; ky < kh; ++ky)                                                              \
      for (int64_t kx = 0; kx < kw; ++kx)                                                            \
        for (int i = 0; i < OC; ++i) {                                                               \
          const float wv = wt[i][(ci * kh + ky) * kw + kx];                                          \
          for (int r = 0; r < 2; ++r) {                                                              \
            const float* row = padded + (ci * hp + (r ? y1 : y0) + ky) * wp + x0 + kx;               \
            for (int j = 0; j < 8; ++j) tile[i][r][j] += wv * row[j];                                \
          }                                                                                          \
        }                                                                                            \
  if (epi.relu)                                                                                      \
    for (int i = 0; i < OC; ++i) for (int r = 0; r < 2; ++r) for (int j = 0; j < 8; ++j)             \
      tile[i][r][j] = tile[i][r][j] > 0.0f ? tile[i][r][j] : 0.0f;
#endif
#define TV_CONV_TILE(OC)                                                                             \
  static void tv_conv_tile##OC##_f32(const float* padded, int64_t c, int64_t hp, int64_t wp,         \
                                     const float* weights, int64_t kh, int64_t kw, int64_t o,        \
                                     int64_t oh, int64_t ow, int64_t o0, int64_t y0, int64_t x0,     \
                                     tv_conv_epilogue epi, float* out) {                             \
    const int64_t taps = c * kh * kw;                                                                \
    const float* wt[OC];                                                                             \
    float start[OC];                                                                                 \
    for (int i = 0; i < OC; ++i) {  /* a channel past the end repeats the last one, not stored */    \
      const int64_t oc = o0 + i < o ? o0 + i : o - 1;                                                \
      wt[i] = weights + oc * taps;                                                                   \
      start[i] = epi.bias ? epi.bias[oc] : 0.0f;                                                     \
    }                                                                                                \
    const int64_t y1 = y0 + 1 < oh ? y0 + 1 : y0;                                                    \
    const int64_t ph = oh / 2, pw = ow / 2;                                                          \
    float tile[OC][2][8];                                                                            \
    TV_CONV_TILE_SUM(OC)                                                                             \
    const int64_t cols = ow - x0 < 8 ? ow - x0 : 8;                                                  \
    for (int i = 0; i < OC && o0 + i < o; ++i) {                                                     \
      if (epi.pool) {  /* (the driver visits only whole row pairs) */                                \
        float* d = out + ((o0 + i) * ph + y0 / 2) * pw + x0 / 2;                                     \
        for (int64_t j = 0; j < cols / 2; ++j) {                                                     \
          const float a = tile[i][0][2 * j] > tile[i][0][2 * j + 1] ? tile[i][0][2 * j] : tile[i][0][2 * j + 1]; \
          const float b = tile[i][1][2 * j] > tile[i][1][2 * j + 1] ? tile[i][1][2 * j] : tile[i][1][2 * j + 1]; \
          d[j] = a > b ? a : b;                                                                      \
        }                                                                                            \
        continue;                                                                                    \
      }                                                                                              \
      for (int r = 0; r < 2 && y0 + r < oh; ++r) {                                                   \
        float* d = out + ((o0 + i) * oh + y0 + r) * ow + x0;                                         \
        for (int64_t j = 0; j < cols; ++j) d[j] = tile[i][r][j];                                     \
      }                                                                                              \
    }                                                                                                \
  }
TV_CONV_TILE(6) TV_CONV_TILE(4)
/* Output channels go in blocks of 6, and of 4 where that wastes fewer duplicate channels (32 = 4 x 6 + 2
   x 4 rather than 6 x 6 with 4 duplicates). */
static void tv_conv_blocks(int64_t o, int64_t* sixes, int64_t* fours) {
  const int64_t q = o / 6, r = o % 6;
  *sixes = q; *fours = 0;
  if (r == 3 || r == 4) *fours = 1;
  else if (r == 5) *sixes = q + 1;
  else if (r != 0) { *sixes = q > 0 ? q - 1 : 0; *fours = q > 0 ? 2 : 1; }
}

/* ``bias`` is read only when ``has_bias`` (callers without one pass any float pointer). */
__attribute__((unused)) static int32_t tv_conv2d_direct_f32(int64_t n, int64_t c, int64_t h, int64_t w,
    int64_t o, int64_t oh, int64_t ow, int64_t kh, int64_t kw, int64_t pt, int64_t pl,
    const float* x, const float* weights, const float* bias, int64_t has_bias, int64_t relu, int64_t pool,
    float* padded, float* out) {
  const int64_t hp = oh + kh - 1, wp = (ow + 7) / 8 * 8 + kw - 1;
  const tv_conv_epilogue epi = {has_bias ? bias : NULL, relu != 0, pool != 0};
  int64_t sixes, fours;
  tv_conv_blocks(o, &sixes, &fours);
  const int64_t yblocks = pool ? oh / 2 : (oh + 1) / 2, xblocks = (ow + 7) / 8;
  const int64_t tiles = (sixes + fours) * yblocks * xblocks;
  const int64_t image_out = pool ? o * (oh / 2) * (ow / 2) : o * oh * ow;
  const int parallel = (double)o * oh * ow * c * kh * kw >= TV_GEMM_PARALLEL_WORK && !tv_omp_in_parallel();
  (void)parallel;  /* (read by the OpenMP pragma only) */
  for (int64_t b = 0; b < n; ++b) {
    tv_conv_pad_f32(x + b * c * h * w, c, h, w, pt, pl, hp, wp, padded);
    float* image = out + b * image_out;
    /* channel blocks vary fastest: neighbouring tiles read the same input rows (kept in L1), and each
       thread's share of the static schedule has every channel block (blocks of 6 and 4 differ in work) */
    const int64_t oblocks = sixes + fours;
    _Pragma("omp parallel for schedule(static) num_threads(tv_threads()) if(parallel)")
    for (int64_t t = 0; t < tiles; ++t) {
      const int64_t ob = t % oblocks, xb = (t / oblocks) % xblocks, yb = t / (oblocks * xblocks);
      if (ob < sixes)
        tv_conv_tile6_f32(padded, c, hp, wp, weights, kh, kw, o, oh, ow, ob * 6, yb * 2, xb * 8, epi, image);
      else
        tv_conv_tile4_f32(padded, c, hp, wp, weights, kh, kw, o, oh, ow, sixes * 6 + (ob - sixes) * 4, yb * 2,
                          xb * 8, epi, image);
    }
  }
  return 0;
}
#else
static int tv_gemm_onthefly_f32(float alpha, int64_t m, int64_t n, int64_t k, const float* a, int64_t lda,
                                int64_t ta, const float* b, int64_t ldb, int64_t tb, float* c, int64_t ldc) {
  (void)alpha, (void)m, (void)n, (void)k, (void)a, (void)lda, (void)ta, (void)b, (void)ldb, (void)tb, (void)c, (void)ldc;
  return 0;  /* (no kernel of this translation unit multiplies matrices) */
}
#endif /* TV_PACKED_KERNELS */

#endif /* TV_GEMM_H */
