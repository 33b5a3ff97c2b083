/* The float32 NCHW max pool (nn.max_pool2d; codegen/strategy.py: MaxPool2dCall): tv_max_pool2d_f32, any
   window, strides, dilation, padding and ceil mode, in the vectors of tv_vec.h (TV_VLANES floats).

   Per (image, channel) plane, in bands of output rows: each input row a window reads is copied once into a
   small row buffer split into its SW column phases (phase p holds the padded columns p, p + SW, ...; -inf
   where the padding or the ceil-mode overhang is), so that every horizontal tap of a vector of output
   columns is one contiguous load whatever the stride (tap kx: phase kx DW % SW, index + kx DW / SW). The
   row's horizontal maximum (one float per output column) goes into a ring of (KH - 1) DH + 1 rows, and
   each output row is the vertical maximum of the ring rows its window covers: for 3x3 stride 2 each input
   row's horizontal maximum serves two output rows, and nothing of the size of the image is copied.

   NaN propagates as NumPy's maximum does (a NaN anywhere in a window gives NaN) and a window with no input
   element (entirely in padding) gives -inf, as the reference's -inf padding does. Planes (or bands of
   rows, when there are fewer planes than chunks) run as about TV_VPOOL_CHUNKS chunks per thread on the
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

typedef struct {
  const float* x;
  float* y;
  float* buffers;  /* each floats per chunk: the phase-split row (sw * wq), then the ring (span * owv) */
  const int64_t* at;  /* where tap kx starts in the phase-split row */
  int64_t h, w, oh, ow, kh, kw, sh, sw, dh, pt, pl;
  int64_t wq, owv, span, each, bands, units, chunks;
} tv_vpool_job;

/* Input row src (w floats) as sw phases of wq floats: row[p wq + q] = src[q sw + p - pl], -inf outside. */
static void tv_vpool_fill(const float* src, int64_t w, int64_t pl, int64_t sw, int64_t wq, float* row) {
  int64_t q = 0;
  if (sw == 1) {
    for (; q < wq && q < pl; ++q) row[q] = -INFINITY;
    const int64_t end = w + pl < wq ? w + pl : wq;
    if (end > q) memcpy(row + q, src + (q - pl), sizeof(float) * (size_t)(end - q));
    for (q = end > q ? end : q; q < wq; ++q) row[q] = -INFINITY;
    return;
  }
  if (sw == 2) {  /* the interior two vectors at a time, split into even and odd lanes in registers */
    for (; q < wq && 2 * q - pl < 0; ++q) {
      row[q] = -INFINITY;
      row[wq + q] = 2 * q + 1 - pl >= 0 && 2 * q + 1 - pl < w ? src[2 * q + 1 - pl] : -INFINITY;
    }
    for (; q + TV_VLANES <= wq && 2 * q - pl + 2 * TV_VLANES <= w; q += TV_VLANES) {
      const tv_vf lo = TV_VLOAD(src + 2 * q - pl), hi = TV_VLOAD(src + 2 * q - pl + TV_VLANES);
      TV_VSTORE(row + q, __builtin_shuffle(lo, hi, TV_VPOOL_EVEN));
      TV_VSTORE(row + wq + q, __builtin_shuffle(lo, hi, TV_VPOOL_ODD));
    }
  }
  for (; q < wq; ++q)
    for (int64_t p = 0; p < sw; ++p) {
      const int64_t c = q * sw + p - pl;
      row[p * wq + q] = c >= 0 && c < w ? src[c] : -INFINITY;
    }
}

/* out[j] for j in [0, owv): the maximum of the kw taps of the phase-split row (inline: kw = 2, 3 unroll). */
static inline void tv_vpool_hmax(const float* row, const int64_t* at, int64_t kw, int64_t owv, float* out) {
  for (int64_t j = 0; j < owv; j += TV_VLANES) {
    tv_vf acc = TV_VLOAD(row + at[0] + j);
    for (int64_t t = 1; t < kw; ++t) {
      const tv_vf v = TV_VLOAD(row + at[t] + j);
      TV_VPOOL_MAX(acc, v);
    }
    TV_VSTORE(out + j, acc);
  }
}

/* dst[j] for j in [0, ow): the maximum of the n ring rows rows[0..n) (n >= 1; whole vectors, the last one
   overlapping the one before when ow is not a multiple of the lanes; lane by lane when ow is shorter). */
static inline void tv_vpool_vmax(const float* const* rows, int64_t n, int64_t ow, float* dst) {
  if (ow < TV_VLANES) {
    for (int64_t j = 0; j < ow; ++j) {
      float acc = rows[0][j];
      for (int64_t t = 1; t < n; ++t) acc = tv_vpool_max1(acc, rows[t][j]);
      dst[j] = acc;
    }
    return;
  }
  for (int64_t j = 0;; j += TV_VLANES) {
    if (j > ow - TV_VLANES) j = ow - TV_VLANES;
    tv_vf acc = TV_VLOAD(rows[0] + j);
    for (int64_t t = 1; t < n; ++t) {
      const tv_vf v = TV_VLOAD(rows[t] + j);
      TV_VPOOL_MAX(acc, v);
    }
    TV_VSTORE(dst + j, acc);
    if (j == ow - TV_VLANES) break;
  }
}

/* Output rows [oy0, oy1) of one plane, with this chunk's row buffer and ring. */
static void tv_vpool_rows(const tv_vpool_job* j, const float* src, float* dst, int64_t oy0, int64_t oy1,
                          float* row, float* ring) {
  const float* rows[j->kh];
  int64_t begin = 0, end = 0;  /* the input rows [begin, end) whose horizontal maxima the ring holds (the last span) */
  for (int64_t oy = oy0; oy < oy1; ++oy) {
    const int64_t first = oy * j->sh - j->pt;
    const int64_t ky0 = first < 0 ? (-first + j->dh - 1) / j->dh : 0;
    int64_t ky1 = j->h - first > 0 ? (j->h - first + j->dh - 1) / j->dh : 0;
    if (ky1 > j->kh) ky1 = j->kh;
    float* out = dst + oy * j->ow;
    if (ky0 >= ky1) {  /* a window entirely in the padding */
      for (int64_t x = 0; x < j->ow; ++x) out[x] = -INFINITY;
      continue;
    }
    const int64_t last = first + (ky1 - 1) * j->dh;
    const int64_t lo = first + ky0 * j->dh;  /* (above the rows of the window before with dilation at the top) */
    if (lo < begin || lo >= end) begin = end = lo;
    for (int64_t iy = end; iy <= last; ++iy) {
      tv_vpool_fill(src + iy * j->w, j->w, j->pl, j->sw, j->wq, row);
      float* h = ring + iy % j->span * j->owv;
      if (j->kw == 3) tv_vpool_hmax(row, j->at, 3, j->owv, h);
      else if (j->kw == 2) tv_vpool_hmax(row, j->at, 2, j->owv, h);
      else tv_vpool_hmax(row, j->at, j->kw, j->owv, h);
    }
    if (last + 1 > end) end = last + 1;
    for (int64_t ky = ky0; ky < ky1; ++ky) rows[ky - ky0] = ring + (first + ky * j->dh) % j->span * j->owv;
    const int64_t n = ky1 - ky0;
    if (n == 3) tv_vpool_vmax(rows, 3, j->ow, out);
    else if (n == 2) tv_vpool_vmax(rows, 2, j->ow, out);
    else tv_vpool_vmax(rows, n, j->ow, out);
  }
}

static void tv_vpool_chunk(void* arg, int64_t i) {
  const tv_vpool_job* j = (const tv_vpool_job*)arg;
  float* row = j->buffers + i * j->each;
  float* ring = row + j->sw * j->wq;
  const int64_t lo = i * j->units / j->chunks, hi = (i + 1) * j->units / j->chunks;
  for (int64_t u = lo; u < hi; ++u) {
    const int64_t plane = u / j->bands, band = u % j->bands;
    tv_vpool_rows(j, j->x + plane * j->h * j->w, j->y + plane * j->oh * j->ow, band * j->oh / j->bands,
                  (band + 1) * j->oh / j->bands, row, ring);
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
  const int64_t wq = owv + (kw - 1) * dw / sw;
  int64_t at[kw];
  for (int64_t kx = 0; kx < kw; ++kx) at[kx] = kx * dw % sw * wq + kx * dw / sw;
  /* bands of output rows when there are fewer planes than chunks (each band recomputes the rows it shares) */
  const int64_t want = threads > 1 ? (int64_t)TV_VPOOL_CHUNKS * threads : 1;
  int64_t bands = planes >= want ? 1 : (want + planes - 1) / planes;
  if (bands > oh) bands = oh;
  const int64_t units = planes * bands;
  const int64_t span = (kh - 1) * dh + 1;
  tv_vpool_job job = {x, y, NULL, at, h, w, oh, ow, kh, kw, sh, sw, dh, pt, pl, wq, owv, span,
                      (sw * wq + span * owv + 15) / 16 * 16, bands, units, units < want ? units : want};
  job.buffers = (float*)malloc(sizeof(float) * (size_t)(job.chunks * job.each));
  if (job.buffers == NULL) return TV_ERROR_OUT_OF_MEMORY;
  tv_team_run(job.chunks, threads, tv_vpool_chunk, &job);
  free(job.buffers);
  return 0;
}

#endif /* TV_VPOOL_H */
