/* The float32 NCHW max pool (nn.max_pool2d; codegen/strategy.py: MaxPool2dCall): tv_max_pool2d_f32, any
   window, strides, dilation, padding and ceil mode, in GCC vectors of the host's width up to 32 bytes
   (tv_vpf below: TV_VPLANES floats).

   Per (image, channel) plane, in bands of output rows, TV_VPOOL_BLOCK_ROWS input rows at a time, in three
   passes over the block:
   1. each input row the block's windows read is copied into a small buffer padded with -inf (the padding
      and the ceil-mode overhang) and split into its SW column phases (phase p holds the padded columns p,
      p + SW, ...; at stride 2 two vectors split into even and odd lanes in registers), so that each
      horizontal tap of a vector of output columns is one contiguous load (tap kx: phase kx DW % SW, index
      + kx DW / SW) -- no padded copy of the whole image;
   2. each row's horizontal window maximum (one float per output column);
   3. each output row as the vertical maximum of the rows its window covers: for 3x3 stride 2 each input
      row's horizontal maximum serves two output rows (6 maxima per output where the window has 8).
   Whole passes, not one row through all three: a load that overlaps a just-stored vector at another
   alignment waits for the store (no store forwarding); row by row that made the kernel slower than the
   generated one.

   NaN propagates as NumPy's maximum does (a NaN anywhere in a window gives NaN): the copy notes whether the
   block has a NaN; then its maxima take the exact rule (TV_VPOOL_MAX: two comparisons a tap), else the max
   instruction. A window with no input element (entirely in padding) gives -inf, as the reference's -inf
   padding does. Planes (or bands of rows, when there are fewer planes than chunks) run as about
   TV_VPOOL_CHUNKS chunks per thread on the thread team (tv_team_run); each output is computed the same way
   on any thread. Included by tv_gemm.h (after tv_gemm_parallel and tv_team_run), before its
   TV_PACKED_KERNELS part: in every shared library's prelude. */
#ifndef TV_VPOOL_H
#define TV_VPOOL_H
#ifndef TV_ERROR_OUT_OF_MEMORY
#define TV_ERROR_OUT_OF_MEMORY 1003 /* (as tv_lib.h and c_emit.ERROR_OUT_OF_MEMORY) */
#endif

/* The pool's vectors: the host's (tv_vec.h) up to 32 bytes. On the development machine (AMD EPYC, AVX-512
   run as two 256-bit halves) 64-byte vectors took 1.2x the time of 32-byte ones on ResNet's pool (56 output
   columns: 3.5 vectors of 16 lanes, the 16-lane even/odd split of two vectors one two-source permute). */
#if TV_VEC_BYTES > 32
#define TV_VPOOL_BYTES 32
#else
#define TV_VPOOL_BYTES TV_VEC_BYTES
#endif
#define TV_VPLANES (TV_VPOOL_BYTES / 4)
typedef float tv_vpf __attribute__((vector_size(TV_VPOOL_BYTES)));
typedef float tv_vpfu __attribute__((vector_size(TV_VPOOL_BYTES), aligned(4), may_alias));
typedef int32_t tv_vpm __attribute__((vector_size(TV_VPOOL_BYTES)));
#define TV_VPLOAD(p) (*(const tv_vpfu*)(p))
#define TV_VPSTORE(p, v) (*(tv_vpfu*)(p) = (v))
#if TV_VPLANES == 4
#define TV_VPSPLAT(s) ((tv_vpf){TV_VSPLAT4(s)})
#else
#define TV_VPSPLAT(s) ((tv_vpf){TV_VSPLAT4(s), TV_VSPLAT4(s)})
#endif
#define TV_VPSELECT(mask, a, b) ((tv_vpf)(((tv_vpm)(a) & (mask)) | ((tv_vpm)(b) & ~(mask))))

/* acc = max(acc, v) with NumPy's NaN rule: v where v > acc or v is NaN; a NaN acc stays (both comparisons
   fail). A macro: a vector wider than the target's must not be passed by value (tv_vec.h). */
#define TV_VPOOL_MAX(acc, v) ((acc) = TV_VPSELECT(((v) > (acc)) | ((v) != (v)), (v), (acc)))
static inline float tv_vpool_max1(float acc, float v) { return v > acc || v != v ? v : acc; }
/* acc = max(acc, v) where neither is NaN: v > acc ? v : acc, which is the x86 max instruction (gcc makes a
   comparison and a blend of TV_VPSELECT's form: two dependent instructions a tap) where the width is native. */
#if TV_VPOOL_BYTES == 32 && defined(__AVX__)
#define TV_VPOOL_FMAX(acc, v) ((acc) = __builtin_ia32_maxps256((v), (acc)))
#elif TV_VPOOL_BYTES == 16 && defined(__SSE__)
#define TV_VPOOL_FMAX(acc, v) ((acc) = __builtin_ia32_maxps((v), (acc)))
#else
#define TV_VPOOL_FMAX(acc, v) ((acc) = TV_VPSELECT((v) > (acc), (v), (acc)))
#endif
/* bad |= the lanes where a or b is NaN: one unordered comparison for two vectors (a != a in gcc's form is an
   AVX-512 mask register, then turned back into a vector: two more instructions a vector of the copy). */
#if TV_VPOOL_BYTES == 32 && defined(__AVX__)
#define TV_VPOOL_NANS(bad, a, b) ((bad) |= (tv_vpm)__builtin_ia32_cmpps256((a), (b), 3))
#elif TV_VPOOL_BYTES == 16 && defined(__SSE__)
#define TV_VPOOL_NANS(bad, a, b) ((bad) |= (tv_vpm)__builtin_ia32_cmpunordps((a), (b)))
#else
#define TV_VPOOL_NANS(bad, a, b) ((bad) |= (tv_vpm)((a) != (a)) | (tv_vpm)((b) != (b)))
#endif

typedef int32_t tv_vpool_vi __attribute__((vector_size(TV_VPOOL_BYTES)));
#if TV_VPLANES == 4
#define TV_VPOOL_EVEN ((tv_vpool_vi){0, 2, 4, 6})
#define TV_VPOOL_ODD ((tv_vpool_vi){1, 3, 5, 7})
#else
#define TV_VPOOL_EVEN ((tv_vpool_vi){0, 2, 4, 6, 8, 10, 12, 14})
#define TV_VPOOL_ODD ((tv_vpool_vi){1, 3, 5, 7, 9, 11, 13, 15})
#endif
#define TV_VPOOL_CHUNKS 4
/* The row functions are always inlined where they are called with a constant kw, stride or row count (the
   unrolled taps): in a translation unit as large as a kernel library's prelude gcc's unit-growth limit
   may leave them calls. Definitions start with "static" (the AOT flow's text rules, aot/build.py). */
#define TV_VPOOL_BLOCK_ROWS 17

typedef struct {
  const float* x;
  float* y;
  float* buffers;  /* each floats per chunk: rows phase-split rows (sw (wq + lanes) each), rows x owv maxima */
  const int64_t* at;  /* where tap kx starts in a phase-split row */
  int64_t h, w, oh, ow, kh, kw, sh, sw, dh, pt, pl;
  int64_t wq, owv, block, rows, each, bands, units, chunks;
} tv_vpool_job;

/* Input row src (w floats) padded with -inf, split into sw phases of wq floats (a whole number of vectors)
   ps = wq + lanes apart: row[p ps + q] = src[q sw + p - pl] where that is inside the row, else -inf. The
   interior vector by vector (at stride 2 pairs of vectors split into even and odd lanes in registers), the
   last vector overlapping the one before, the rest (the padding) -inf vectors, whose lanes past wq land in
   the room between phases.
   *bad gathers the NaN lanes (v != v) of the vectors read, *scalar_bad whether a float read alone is NaN (a
   lane of a vector updated alone costs an insert). */
static inline __attribute__((always_inline)) void tv_vpool_fill(const float* src, int64_t w, int64_t pl,
    int64_t sw, int64_t wq, float* row, tv_vpm* bad, int* scalar_bad) {
  const int64_t ps = wq + TV_VPLANES;
  const tv_vpf low = TV_VPSPLAT(-INFINITY);
  if (sw == 1) {
    /* (the copy overwrites what these stores put past pl) */
    for (int64_t q = 0; q < pl && q < wq; q += TV_VPLANES) TV_VPSTORE(row + q, low);
    const int64_t copied = w < wq - pl ? w : wq - pl;
    int64_t c = 0;
    for (; c + TV_VPLANES <= copied; c += TV_VPLANES) {
      const tv_vpf v = TV_VPLOAD(src + c);
      TV_VPOOL_NANS(*bad, v, v);
      TV_VPSTORE(row + pl + c, v);
    }
    if (c < copied && copied >= TV_VPLANES) {
      const tv_vpf v = TV_VPLOAD(src + copied - TV_VPLANES);
      TV_VPOOL_NANS(*bad, v, v);
      TV_VPSTORE(row + pl + copied - TV_VPLANES, v);
    } else
      for (; c < copied; ++c) {
        row[pl + c] = src[c];
        *scalar_bad |= src[c] != src[c];
      }
    for (int64_t q = pl + (copied > 0 ? copied : 0); q < wq; q += TV_VPLANES) TV_VPSTORE(row + q, low);
    return;
  }
  int64_t q = 0;
  if (sw == 2) {
    for (; q < wq && 2 * q - pl < 0; ++q) {  /* the left padding */
      const int64_t c = 2 * q + 1 - pl;
      row[q] = -INFINITY;
      row[ps + q] = c >= 0 && c < w ? src[c] : -INFINITY;
      if (c >= 0 && c < w) *scalar_bad |= src[c] != src[c];
    }
    const int64_t left = q;
    for (; q + TV_VPLANES <= wq && 2 * q - pl + 2 * TV_VPLANES <= w; q += TV_VPLANES) {
      const tv_vpf lo = TV_VPLOAD(src + 2 * q - pl), hi = TV_VPLOAD(src + 2 * q - pl + TV_VPLANES);
      TV_VPOOL_NANS(*bad, lo, hi);
      TV_VPSTORE(row + q, __builtin_shuffle(lo, hi, TV_VPOOL_EVEN));
      TV_VPSTORE(row + ps + q, __builtin_shuffle(lo, hi, TV_VPOOL_ODD));
    }
    const int64_t last = (w + pl - 2 * TV_VPLANES) / 2;  /* (the last pair inside the row, when there is one) */
    if (w + pl >= 2 * TV_VPLANES && last >= left && last <= q && last + TV_VPLANES > q && last + TV_VPLANES <= wq) {
      const tv_vpf lo = TV_VPLOAD(src + 2 * last - pl), hi = TV_VPLOAD(src + 2 * last - pl + TV_VPLANES);
      TV_VPOOL_NANS(*bad, lo, hi);
      TV_VPSTORE(row + last, __builtin_shuffle(lo, hi, TV_VPOOL_EVEN));
      TV_VPSTORE(row + ps + last, __builtin_shuffle(lo, hi, TV_VPOOL_ODD));
      q = last + TV_VPLANES;
    }
  }
  for (; q < wq && q * sw - pl < w; ++q)  /* the rest of the row element by element (any stride) */
    for (int64_t p = 0; p < sw; ++p) {
      const int64_t c = q * sw + p - pl;
      const float v = c >= 0 && c < w ? src[c] : -INFINITY;
      row[p * ps + q] = v;
      *scalar_bad |= v != v;
    }
  for (int64_t p = 0; p < sw; ++p)  /* the right padding */
    for (int64_t r = q; r < wq; r += TV_VPLANES) TV_VPSTORE(row + p * ps + r, low);
}

/* out[j] for j in [0, owv): the maximum of the kw taps of the phase-split row (inline: kw = 2, 3 unroll);
   with exact, NumPy's NaN rule (TV_VPOOL_MAX), else one comparison per tap (no NaN in the rows). */
static inline __attribute__((always_inline)) void tv_vpool_hmax(const float* row, const int64_t* at,
    int64_t kw, int64_t owv, int exact, float* out) {
  for (int64_t j = 0; j < owv; j += TV_VPLANES) {
    tv_vpf acc = TV_VPLOAD(row + at[0] + j);
    for (int64_t t = 1; t < kw; ++t) {
      const tv_vpf v = TV_VPLOAD(row + at[t] + j);
      if (exact) TV_VPOOL_MAX(acc, v);
      else TV_VPOOL_FMAX(acc, v);
    }
    TV_VPSTORE(out + j, acc);
  }
}

/* dst[j] for j in [0, ow): the maximum of the n rows of maxima rows[0..n) (n >= 1; the last vector's lanes
   past ow not stored). */
static inline __attribute__((always_inline)) void tv_vpool_vmax(const float* const* rows, int64_t n,
    int64_t ow, int exact, float* dst) {
  for (int64_t j = 0; j < ow; j += TV_VPLANES) {
    tv_vpf acc = TV_VPLOAD(rows[0] + j);
    for (int64_t t = 1; t < n; ++t) {
      const tv_vpf v = TV_VPLOAD(rows[t] + j);
      if (exact) TV_VPOOL_MAX(acc, v);
      else TV_VPOOL_FMAX(acc, v);
    }
    if (j + TV_VPLANES <= ow) TV_VPSTORE(dst + j, acc);
    else
      for (int64_t l = 0; l < ow - j; ++l) dst[j + l] = acc[l];
  }
}

/* Output rows [oy0, oy1) of one plane, j->block output rows at a time, each block in three passes over the
   input rows it reads: their phase-split copies, their horizontal maxima, the output rows' vertical maxima.
   (Each pass reads what the pass before stored well before: a load right after a store it overlaps at
   another alignment waits for the store to complete, which made one row at a time through all three
   slower than the generated kernel.) */
static void tv_vpool_rows(const tv_vpool_job* j, const float* src, float* dst, int64_t oy0, int64_t oy1,
                          float* split, float* maxima) {
  /* (the job's fields in locals: a store through the may_alias vector type could change *j for all gcc
     knows, so it reloaded every field after each store and unrolled nothing: 1.8x the time) */
  const int64_t h = j->h, w = j->w, ow = j->ow, kh = j->kh, kw = j->kw, sh = j->sh, sw = j->sw, dh = j->dh;
  const int64_t pt = j->pt, pl = j->pl, wq = j->wq, owv = j->owv, block = j->block;
  int64_t at[kw];
  for (int64_t t = 0; t < kw; ++t) at[t] = j->at[t];
  const float* rows[kh];
  const int64_t stride = sw * (wq + TV_VPLANES);
  for (int64_t b0 = oy0; b0 < oy1; b0 += block) {
    const int64_t b1 = b0 + block < oy1 ? b0 + block : oy1;
    const int64_t top = b0 * sh - pt, bottom = (b1 - 1) * sh - pt + (kh - 1) * dh;
    const int64_t ilo = top > 0 ? top : 0, ihi = bottom < h - 1 ? bottom : h - 1;
    tv_vpm bad = (tv_vpm)(TV_VPSPLAT(0.0f) != TV_VPSPLAT(0.0f));
    int exact = 0;
    if (sw == 2)
      for (int64_t iy = ilo; iy <= ihi; ++iy)
        tv_vpool_fill(src + iy * w, w, pl, 2, wq, split + (iy - ilo) * stride, &bad, &exact);
    else
      for (int64_t iy = ilo; iy <= ihi; ++iy)
        tv_vpool_fill(src + iy * w, w, pl, sw, wq, split + (iy - ilo) * stride, &bad, &exact);
    for (int i = 0; i < TV_VPLANES; ++i) exact |= bad[i] != 0;
    for (int64_t iy = ilo; iy <= ihi; ++iy) {
      const float* row = split + (iy - ilo) * stride;
      float* out = maxima + (iy - ilo) * owv;
      if (exact) tv_vpool_hmax(row, at, kw, owv, 1, out);
      else if (kw == 3) tv_vpool_hmax(row, at, 3, owv, 0, out);
      else if (kw == 2) tv_vpool_hmax(row, at, 2, owv, 0, out);
      else tv_vpool_hmax(row, at, kw, owv, 0, out);
    }
    for (int64_t oy = b0; oy < b1; ++oy) {
      const int64_t first = oy * sh - pt;
      const int64_t ky0 = first < 0 ? (-first + dh - 1) / dh : 0;
      int64_t ky1 = h - first > 0 ? (h - first + dh - 1) / dh : 0;
      if (ky1 > kh) ky1 = kh;
      float* out = dst + oy * ow;
      if (ky0 >= ky1) {  /* a window entirely in the padding */
        for (int64_t x = 0; x < ow; ++x) out[x] = -INFINITY;
        continue;
      }
      for (int64_t ky = ky0; ky < ky1; ++ky) rows[ky - ky0] = maxima + (first + ky * dh - ilo) * owv;
      const int64_t n = ky1 - ky0;
      if (exact) tv_vpool_vmax(rows, n, ow, 1, out);
      else if (n == 3) tv_vpool_vmax(rows, 3, ow, 0, out);
      else if (n == 2) tv_vpool_vmax(rows, 2, ow, 0, out);
      else tv_vpool_vmax(rows, n, ow, 0, out);
    }
  }
}

static void tv_vpool_chunk(void* arg, int64_t i) {
  const tv_vpool_job* j = (const tv_vpool_job*)arg;
  float* split = j->buffers + i * j->each;
  float* maxima = split + j->rows * j->sw * (j->wq + TV_VPLANES);
  const int64_t lo = i * j->units / j->chunks, hi = (i + 1) * j->units / j->chunks;
  for (int64_t u = lo; u < hi; ++u) {
    const int64_t plane = u / j->bands, band = u % j->bands;
    tv_vpool_rows(j, j->x + plane * j->h * j->w, j->y + plane * j->oh * j->ow, band * j->oh / j->bands,
                  (band + 1) * j->oh / j->bands, split, maxima);
  }
}

/* y (n x c x oh x ow) = the max pool of x (n x c x h x w): window kh x kw, strides sh, sw, dilation dh, dw,
   padding pt (top) and pl (left); oh and ow as the op's shape gives them (the bottom and right padding, and
   ceil mode, are in them). Returns TV_ERROR_OUT_OF_MEMORY when the row buffers cannot be allocated. */
__attribute__((unused)) static int32_t tv_max_pool2d_f32(int64_t n, int64_t c, int64_t h, int64_t w, int64_t oh,
    int64_t ow, int64_t kh, int64_t kw, int64_t sh, int64_t sw, int64_t dh, int64_t dw, int64_t pt, int64_t pl,
    const float* x, float* y) {
  if (n <= 0 || c <= 0 || oh <= 0 || ow <= 0) return 0;
  if (h <= 0 || w <= 0) {  /* (no input element: every window is padding) */
    for (int64_t i = 0; i < n * c * oh * ow; ++i) y[i] = -INFINITY;
    return 0;
  }
  const int64_t planes = n * c;
  const int threads = tv_gemm_parallel((double)planes * oh * ow * kh * kw) ? tv_omp_max_threads() : 1;
  const int64_t owv = (ow + TV_VPLANES - 1) / TV_VPLANES * TV_VPLANES;
  /* phases of wq floats: the output vectors plus the taps' reach, a whole number of vectors */
  const int64_t wq = (owv + (kw - 1) * dw / sw + TV_VPLANES - 1) / TV_VPLANES * TV_VPLANES;
  int64_t at[kw];
  for (int64_t kx = 0; kx < kw; ++kx) at[kx] = kx * dw % sw * (wq + TV_VPLANES) + kx * dw / sw;
  /* bands of output rows when there are fewer planes than chunks (each band recomputes the rows it shares) */
  const int64_t want = threads > 1 ? (int64_t)TV_VPOOL_CHUNKS * threads : 1;
  int64_t bands = planes >= want ? 1 : (want + planes - 1) / planes;
  if (bands > oh) bands = oh;
  const int64_t units = planes * bands;
  /* blocks of output rows reading about TV_VPOOL_BLOCK_ROWS input rows (the rows a block shares with the
     next are read twice: 1 in 16 for 3x3 stride 2) */
  const int64_t span = (kh - 1) * dh + 1;
  const int64_t block = span >= TV_VPOOL_BLOCK_ROWS ? 1 : (TV_VPOOL_BLOCK_ROWS - span) / sh + 1;
  const int64_t rows = (block - 1) * sh + span;
  tv_vpool_job job = {x, y, NULL, at, h, w, oh, ow, kh, kw, sh, sw, dh, pt, pl, wq, owv, block, rows,
                      (rows * (sw * (wq + TV_VPLANES) + owv) + 15) / 16 * 16, bands, units,
                      units < want ? units : want};
  job.buffers = (float*)malloc(sizeof(float) * (size_t)(job.chunks * job.each));
  if (job.buffers == NULL) return TV_ERROR_OUT_OF_MEMORY;
  tv_team_run(job.chunks, threads, tv_vpool_chunk, &job);
  free(job.buffers);
  return 0;
}

#endif /* TV_VPOOL_H */
