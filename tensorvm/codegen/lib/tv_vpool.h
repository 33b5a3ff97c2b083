/* The float32 NCHW max pool (nn.max_pool2d; codegen/strategy.py: MaxPool2dCall): tv_max_pool2d_f32, any
   window, strides, dilation, padding and ceil mode, in the vectors of tv_vec.h (TV_VLANES floats).

   Per (image, channel) plane, in bands of output rows: each input row a window reads is copied once into a
   small buffer padded with -inf (the padding and the ceil-mode overhang) and, at column stride SW > 1, split
   into its SW column phases (phase p holds the padded columns p, p + SW, ...; stride 2 in registers, even
   and odd lanes), so that every horizontal tap of a vector of output columns is one contiguous load (tap
   kx: phase kx DW % SW, index + kx DW / SW). The row's horizontal maximum (one float per output column)
   goes into a ring of (KH - 1) DH + 1 rows, and each output row is the vertical maximum of the ring rows
   its window covers: for 3x3 stride 2 each input row's horizontal maximum serves two output rows, and
   nothing of the size of the image is copied.

   NaN propagates as NumPy's maximum does (a NaN anywhere in a window gives NaN): the copy notes the rows
   with a NaN, whose maxima take the exact rule (TV_VPOOL_MAX, two comparisons per tap), the others one
   comparison. A window with no input element (entirely in padding) gives -inf, as the reference's -inf
   padding does. Planes (or bands of rows, when there are fewer planes than chunks) run as about
   TV_VPOOL_CHUNKS chunks per thread on the
   thread team (tv_team_run); each output is computed the same way on any thread. Included by tv_gemm.h
   (after tv_gemm_parallel and tv_team_run), in every shared library's prelude. */
#ifndef TV_VPOOL_H
#define TV_VPOOL_H
#ifndef TV_ERROR_OUT_OF_MEMORY
#define TV_ERROR_OUT_OF_MEMORY 1003 /* (as tv_lib.h and c_emit.ERROR_OUT_OF_MEMORY) */
#endif

/* acc = max(acc, v) with NumPy's NaN rule: v where v > acc or v is NaN; a NaN acc stays (both comparisons
   fail). A macro: a vector wider than the target's must not be passed by value (tv_vec.h). */
#define TV_VPOOL_MAX(acc, v) ((acc) = TV_VSELECT(((v) > (acc)) | ((v) != (v)), (v), (acc)))
static inline float tv_vpool_max1(float acc, float v) { return v > acc || v != v ? v : acc; }

typedef int32_t tv_vpool_vi __attribute__((vector_size(TV_VEC_BYTES)));
#if TV_VLANES == 4
#define TV_VPOOL_EVEN ((tv_vpool_vi){0, 2, 4, 6})
#define TV_VPOOL_ODD ((tv_vpool_vi){1, 3, 5, 7})
#elif TV_VLANES == 8
#define TV_VPOOL_EVEN ((tv_vpool_vi){0, 2, 4, 6, 8, 10, 12, 14})
#define TV_VPOOL_ODD ((tv_vpool_vi){1, 3, 5, 7, 9, 11, 13, 15})
#else
#define TV_VPOOL_EVEN ((tv_vpool_vi){0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30})
#define TV_VPOOL_ODD ((tv_vpool_vi){1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31})
#endif
#define TV_VPOOL_CHUNKS 4
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
   *bad gathers NaN lanes (v != v) of what was read. */
static inline void tv_vpool_fill(const float* src, int64_t w, int64_t pl, int64_t sw, int64_t wq, float* row,
                                 tv_vmask* bad) {
  const int64_t ps = wq + TV_VLANES;
  const tv_vf low = TV_VSPLAT(-INFINITY);
  if (sw == 1) {
    for (int64_t q = 0; q < pl && q < wq; q += TV_VLANES) TV_VSTORE(row + q, low);  /* (the copy overwrites past pl) */
    const int64_t copied = w < wq - pl ? w : wq - pl;
    int64_t c = 0;
    for (; c + TV_VLANES <= copied; c += TV_VLANES) {
      const tv_vf v = TV_VLOAD(src + c);
      *bad |= (tv_vmask)(v != v);
      TV_VSTORE(row + pl + c, v);
    }
    if (c < copied && copied >= TV_VLANES) {
      const tv_vf v = TV_VLOAD(src + copied - TV_VLANES);
      *bad |= (tv_vmask)(v != v);
      TV_VSTORE(row + pl + copied - TV_VLANES, v);
    } else
      for (; c < copied; ++c) {
        row[pl + c] = src[c];
        (*bad)[0] |= -(src[c] != src[c]);
      }
    for (int64_t q = pl + (copied > 0 ? copied : 0); q < wq; q += TV_VLANES) TV_VSTORE(row + q, low);
    return;
  }
  int64_t q = 0;
  if (sw == 2) {
    for (; q < wq && 2 * q - pl < 0; ++q) {  /* the left padding */
      const int64_t c = 2 * q + 1 - pl;
      row[q] = -INFINITY;
      row[ps + q] = c >= 0 && c < w ? src[c] : -INFINITY;
      if (c >= 0 && c < w) (*bad)[0] |= -(src[c] != src[c]);
    }
    const int64_t left = q;
    for (; q + TV_VLANES <= wq && 2 * q - pl + 2 * TV_VLANES <= w; q += TV_VLANES) {
      const tv_vf lo = TV_VLOAD(src + 2 * q - pl), hi = TV_VLOAD(src + 2 * q - pl + TV_VLANES);
      *bad |= (tv_vmask)(lo != lo) | (tv_vmask)(hi != hi);
      TV_VSTORE(row + q, __builtin_shuffle(lo, hi, TV_VPOOL_EVEN));
      TV_VSTORE(row + ps + q, __builtin_shuffle(lo, hi, TV_VPOOL_ODD));
    }
    const int64_t last = (w + pl - 2 * TV_VLANES) / 2;  /* (the last pair inside the row, when there is one) */
    if (w + pl >= 2 * TV_VLANES && last >= left && last <= q && last + TV_VLANES > q && last + TV_VLANES <= wq) {
      const tv_vf lo = TV_VLOAD(src + 2 * last - pl), hi = TV_VLOAD(src + 2 * last - pl + TV_VLANES);
      *bad |= (tv_vmask)(lo != lo) | (tv_vmask)(hi != hi);
      TV_VSTORE(row + last, __builtin_shuffle(lo, hi, TV_VPOOL_EVEN));
      TV_VSTORE(row + ps + last, __builtin_shuffle(lo, hi, TV_VPOOL_ODD));
      q = last + TV_VLANES;
    }
  }
  for (; q < wq && q * sw - pl < w; ++q)  /* the rest of the row element by element (any stride) */
    for (int64_t p = 0; p < sw; ++p) {
      const int64_t c = q * sw + p - pl;
      const float v = c >= 0 && c < w ? src[c] : -INFINITY;
      row[p * ps + q] = v;
      (*bad)[0] |= -(v != v);
    }
  for (int64_t p = 0; p < sw; ++p)  /* the right padding */
    for (int64_t r = q; r < wq; r += TV_VLANES) TV_VSTORE(row + p * ps + r, low);
}

/* out[j] for j in [0, owv): the maximum of the kw taps of the phase-split row (inline: kw = 2, 3 unroll);
   with exact, NumPy's NaN rule (TV_VPOOL_MAX), else one comparison per tap (no NaN in the rows). */
static inline void tv_vpool_hmax(const float* row, const int64_t* at, int64_t kw, int64_t owv, int exact,
                                 float* out) {
  for (int64_t j = 0; j < owv; j += TV_VLANES) {
    tv_vf acc = TV_VLOAD(row + at[0] + j);
    for (int64_t t = 1; t < kw; ++t) {
      const tv_vf v = TV_VLOAD(row + at[t] + j);
      if (exact) TV_VPOOL_MAX(acc, v);
      else acc = TV_VSELECT(v > acc, v, acc);
    }
    TV_VSTORE(out + j, acc);
  }
}

/* dst[j] for j in [0, ow): the maximum of the n rows of maxima rows[0..n) (n >= 1; the last vector's lanes
   past ow not stored). */
static inline void tv_vpool_vmax(const float* const* rows, int64_t n, int64_t ow, int exact, float* dst) {
  for (int64_t j = 0; j < ow; j += TV_VLANES) {
    tv_vf acc = TV_VLOAD(rows[0] + j);
    for (int64_t t = 1; t < n; ++t) {
      const tv_vf v = TV_VLOAD(rows[t] + j);
      if (exact) TV_VPOOL_MAX(acc, v);
      else acc = TV_VSELECT(v > acc, v, acc);
    }
    if (j + TV_VLANES <= ow) TV_VSTORE(dst + j, acc);
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
  const float* rows[j->kh];
  const int64_t stride = j->sw * (j->wq + TV_VLANES);
  for (int64_t b0 = oy0; b0 < oy1; b0 += j->block) {
    const int64_t b1 = b0 + j->block < oy1 ? b0 + j->block : oy1;
    const int64_t top = b0 * j->sh - j->pt, bottom = (b1 - 1) * j->sh - j->pt + (j->kh - 1) * j->dh;
    const int64_t ilo = top > 0 ? top : 0, ihi = bottom < j->h - 1 ? bottom : j->h - 1;
    tv_vmask bad = (tv_vmask)(TV_VSPLAT(0.0f) != TV_VSPLAT(0.0f));
    for (int64_t iy = ilo; iy <= ihi; ++iy)
      tv_vpool_fill(src + iy * j->w, j->w, j->pl, j->sw, j->wq, split + (iy - ilo) * stride, &bad);
    int exact = 0;
    for (int i = 0; i < TV_VLANES; ++i) exact |= bad[i] != 0;
    for (int64_t iy = ilo; iy <= ihi; ++iy) {
      const float* row = split + (iy - ilo) * stride;
      float* out = maxima + (iy - ilo) * j->owv;
      if (exact) tv_vpool_hmax(row, j->at, j->kw, j->owv, 1, out);
      else if (j->kw == 3) tv_vpool_hmax(row, j->at, 3, j->owv, 0, out);
      else if (j->kw == 2) tv_vpool_hmax(row, j->at, 2, j->owv, 0, out);
      else tv_vpool_hmax(row, j->at, j->kw, j->owv, 0, out);
    }
    for (int64_t oy = b0; oy < b1; ++oy) {
      const int64_t first = oy * j->sh - j->pt;
      const int64_t ky0 = first < 0 ? (-first + j->dh - 1) / j->dh : 0;
      int64_t ky1 = j->h - first > 0 ? (j->h - first + j->dh - 1) / j->dh : 0;
      if (ky1 > j->kh) ky1 = j->kh;
      float* out = dst + oy * j->ow;
      if (ky0 >= ky1) {  /* a window entirely in the padding */
        for (int64_t x = 0; x < j->ow; ++x) out[x] = -INFINITY;
        continue;
      }
      for (int64_t ky = ky0; ky < ky1; ++ky) rows[ky - ky0] = maxima + (first + ky * j->dh - ilo) * j->owv;
      const int64_t n = ky1 - ky0;
      if (exact) tv_vpool_vmax(rows, n, j->ow, 1, out);
      else if (n == 3) tv_vpool_vmax(rows, 3, j->ow, 0, out);
      else if (n == 2) tv_vpool_vmax(rows, 2, j->ow, 0, out);
      else tv_vpool_vmax(rows, n, j->ow, 0, out);
    }
  }
}

static void tv_vpool_chunk(void* arg, int64_t i) {
  const tv_vpool_job* j = (const tv_vpool_job*)arg;
  float* split = j->buffers + i * j->each;
  float* maxima = split + j->rows * j->sw * (j->wq + TV_VLANES);
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
  const int64_t owv = (ow + TV_VLANES - 1) / TV_VLANES * TV_VLANES;
  /* phases of wq floats: the output vectors plus the taps' reach, a whole number of vectors */
  const int64_t wq = (owv + (kw - 1) * dw / sw + TV_VLANES - 1) / TV_VLANES * TV_VLANES;
  int64_t at[kw];
  for (int64_t kx = 0; kx < kw; ++kx) at[kx] = kx * dw % sw * (wq + TV_VLANES) + kx * dw / sw;
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
                      (rows * (sw * (wq + TV_VLANES) + owv) + 15) / 16 * 16, bands, units, units < want ? units : want};
  job.buffers = (float*)malloc(sizeof(float) * (size_t)(job.chunks * job.each));
  if (job.buffers == NULL) return TV_ERROR_OUT_OF_MEMORY;
  tv_team_run(job.chunks, threads, tv_vpool_chunk, &job);
  free(job.buffers);
  return 0;
}

#endif /* TV_VPOOL_H */
