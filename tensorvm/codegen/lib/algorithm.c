/* Sorting, scans, searching, scatters and argwhere: the library functions of the ops in
   tensorvm/op/algorithm.py and the scatters of tensorvm/op/transform.py (see tv_lib.h). Arrays are
   row-major; an op along an axis sees its data as (outer, n, inner), the axis in the middle. */
#include "tv_lib.h"

/* ---- stable sorting ---------------------------------------------------------------------------- */

/* Sorts each line of data (outer, n, inner) and writes its first k elements into values (outer, k,
   inner) and/or their positions along the axis into indices (of dtype index_dtype); either may be
   NULL. A line is ordered as (key, position) pairs: by key in either direction, equal keys by
   position (a stable sort's order, and a strict total order: any algorithm gives the same result).
   A full line is sorted by insertion-sorted runs of 16, then a bottom-up merge sort (the pairs keep
   the keys next to their positions: no indirect reads); a small k selects in one pass; a k of at most
   half the line partitions first (quickselect) and sorts only the k best. */
#ifndef TV_LIB_PARALLEL_WORK /* lines of this many elements in all are sorted in parallel (host.py: kernel_rules) */
#define TV_LIB_PARALLEL_WORK (1 << 15)
#endif
#define TV_LIB_SELECT_MAX 64 /* topk with k up to this (and n >= 16 k) selects in one pass instead */
#define TV_LIB_SORT(CODE, T, S, F)                                                                  \
  typedef struct { T key; int64_t at; } tv_lib_pair_##S;                                            \
  static inline bool tv_lib_before_##S(T a, T b, bool ascending) {                                  \
    return ascending ? tv_lib_less_##S(a, b) : tv_lib_less_##S(b, a);                               \
  }                                                                                                 \
  static inline bool tv_lib_pair_before_##S(const tv_lib_pair_##S* a, const tv_lib_pair_##S* b,     \
                                            bool ascending) {                                       \
    return tv_lib_before_##S(a->key, b->key, ascending) ||                                          \
           (a->at < b->at && !tv_lib_before_##S(b->key, a->key, ascending));                        \
  }                                                                                                 \
  static tv_lib_pair_##S* tv_lib_sort_line_##S(tv_lib_pair_##S* line, tv_lib_pair_##S* tmp, int64_t n, \
                                               bool ascending) {                                    \
    for (int64_t lo = 0; lo < n; lo += 16) {                                                        \
      const int64_t hi = lo + 16 < n ? lo + 16 : n;                                                 \
      for (int64_t i = lo + 1; i < hi; i++) {                                                       \
        const tv_lib_pair_##S p = line[i];                                                          \
        int64_t j = i;                                                                              \
        for (; j > lo && tv_lib_pair_before_##S(&p, &line[j - 1], ascending); j--) line[j] = line[j - 1]; \
        line[j] = p;                                                                                \
      }                                                                                             \
    }                                                                                               \
    for (int64_t width = 16; width < n; width *= 2) {                                               \
      for (int64_t lo = 0; lo < n; lo += 2 * width) {                                               \
        const int64_t mid = lo + width < n ? lo + width : n;                                        \
        const int64_t hi = lo + 2 * width < n ? lo + 2 * width : n;                                 \
        int64_t a = lo, b = mid, k = lo;                                                            \
        while (a < mid && b < hi) /* the right run goes first only when strictly before */         \
          tmp[k++] = tv_lib_pair_before_##S(&line[b], &line[a], ascending) ? line[b++] : line[a++]; \
        while (a < mid) tmp[k++] = line[a++];                                                       \
        while (b < hi) tmp[k++] = line[b++];                                                        \
      }                                                                                             \
      tv_lib_pair_##S* swap = line;                                                                 \
      line = tmp;                                                                                   \
      tmp = swap;                                                                                   \
    }                                                                                               \
    return line;                                                                                    \
  }                                                                                                 \
  /* Moves the k first pairs of the line (in the pair order) to its front, in any order: quickselect \
     with a median-of-three pivot. False after more rounds than a fair split needs by far (then the  \
     line is sorted in full instead: no quadratic case). */                                         \
  static bool tv_lib_partition_##S(tv_lib_pair_##S* line, int64_t n, int64_t k, bool ascending) {   \
    int64_t lo = 0, hi = n, rounds = 16;                                                            \
    for (int64_t m = n; m > 1; m /= 2) rounds += 2;                                                 \
    while (hi - lo > 1) {                                                                           \
      if (rounds-- == 0) return false;                                                              \
      tv_lib_pair_##S* a = &line[lo];                                                               \
      tv_lib_pair_##S* b = &line[lo + (hi - lo) / 2];                                               \
      tv_lib_pair_##S* c = &line[hi - 1];                                                           \
      tv_lib_pair_##S* median = tv_lib_pair_before_##S(a, b, ascending)                             \
          ? (tv_lib_pair_before_##S(b, c, ascending) ? b : (tv_lib_pair_before_##S(a, c, ascending) ? c : a)) \
          : (tv_lib_pair_before_##S(a, c, ascending) ? a : (tv_lib_pair_before_##S(b, c, ascending) ? c : b)); \
      const tv_lib_pair_##S pivot = *median;                                                        \
      *median = line[hi - 1];                                                                       \
      int64_t at = lo;                                                                              \
      for (int64_t j = lo; j < hi - 1; j++) {                                                       \
        if (tv_lib_pair_before_##S(&line[j], &pivot, ascending)) {                                  \
          const tv_lib_pair_##S t = line[j];                                                        \
          line[j] = line[at];                                                                       \
          line[at++] = t;                                                                           \
        }                                                                                           \
      }                                                                                             \
      line[hi - 1] = line[at];                                                                      \
      line[at] = pivot; /* in its final place: [lo, at) before it, (at, hi) after */                \
      if (at == k - 1 || at == k) return true;                                                      \
      if (at > k) hi = at;                                                                          \
      else lo = at + 1;                                                                             \
    }                                                                                               \
    return true;                                                                                    \
  }                                                                                                 \
  /* The first k of a line in sorted order, for a small k: one pass keeping the best k in order (an  \
     element equal to one kept goes after it, so the earlier position wins, as in a stable sort). */ \
  static void tv_lib_select_##S(const T* data, int64_t step, int64_t n, int64_t k, bool ascending,  \
                                tv_lib_pair_##S* best) {                                            \
    int64_t kept = 0;                                                                               \
    for (int64_t j = 0; j < n; j++) {                                                               \
      const T v = data[j * step];                                                                   \
      if (kept == k && !tv_lib_before_##S(v, best[k - 1].key, ascending)) continue;                \
      int64_t pos = kept < k ? kept++ : k - 1;                                                      \
      for (; pos > 0 && tv_lib_before_##S(v, best[pos - 1].key, ascending); pos--) best[pos] = best[pos - 1]; \
      best[pos].key = v;                                                                            \
      best[pos].at = j;                                                                             \
    }                                                                                               \
  }                                                                                                 \
  /* The lines of chunk i (of tv_lib_topk_##S's job), with one buffer of pairs. */                  \
  typedef struct {                                                                                  \
    const T* data; T* values; void* indices; int32_t* rc;                                           \
    int64_t n, inner, k, index_dtype, lines, chunks; bool select, ascending;                        \
  } tv_lib_topk_job_##S;                                                                            \
  static void tv_lib_topk_chunk_##S(void* ctx, int64_t chunk) {                                     \
    const tv_lib_topk_job_##S* job = (const tv_lib_topk_job_##S*)ctx;                               \
    const T* data = job->data;                                                                      \
    const int64_t n = job->n, inner = job->inner, k = job->k;                                       \
    const bool ascending = job->ascending;                                                          \
    tv_lib_pair_##S* pairs = (tv_lib_pair_##S*)malloc(sizeof(tv_lib_pair_##S) * (size_t)(job->select ? k : 2 * n)); \
    if (pairs == NULL) {                                                                            \
      __atomic_store_n(job->rc, TV_ERROR_OUT_OF_MEMORY, __ATOMIC_RELAXED);                          \
      return;                                                                                       \
    }                                                                                               \
    const int64_t first = chunk * job->lines / job->chunks, last = (chunk + 1) * job->lines / job->chunks; \
    for (int64_t line = first; line < last; line++) {                                               \
      const int64_t o = line / inner, i = line % inner;                                             \
      const tv_lib_pair_##S* sorted = pairs;                                                        \
      if (job->select) {                                                                            \
        tv_lib_select_##S(data + o * n * inner + i, inner, n, k, ascending, pairs);                 \
      } else {                                                                                      \
        for (int64_t j = 0; j < n; j++) {                                                           \
          pairs[j].key = data[(o * n + j) * inner + i];                                             \
          pairs[j].at = j;                                                                          \
        }                                                                                           \
        int64_t m = n; /* the pairs to sort: the k best after a partition, else all */              \
        if (2 * k <= n && tv_lib_partition_##S(pairs, n, k, ascending)) {                           \
          m = k;                                                                                    \
        } else if (2 * k <= n) { /* (the partition gave up: the line again, in position order) */   \
          for (int64_t j = 0; j < n; j++) {                                                         \
            pairs[j].key = data[(o * n + j) * inner + i];                                           \
            pairs[j].at = j;                                                                        \
          }                                                                                         \
        }                                                                                           \
        sorted = tv_lib_sort_line_##S(pairs, pairs + n, m, ascending);                              \
      }                                                                                             \
      for (int64_t j = 0; j < k; j++) {                                                             \
        const int64_t at = (o * k + j) * inner + i;                                                 \
        if (job->values != NULL) job->values[at] = sorted[j].key;                                   \
        if (job->indices != NULL) tv_lib_store_int(job->indices, at, sorted[j].at, job->index_dtype); \
      }                                                                                             \
    }                                                                                               \
    free(pairs);                                                                                    \
  }                                                                                                 \
  /* The lines in chunks, in parallel from TV_LIB_PARALLEL_WORK elements (tv_lib_run). */           \
  static int32_t tv_lib_topk_##S(const T* data, int64_t outer, int64_t n, int64_t inner, int64_t k, \
                                 bool ascending, T* values, void* indices, int64_t index_dtype) {   \
    const int64_t lines = outer * inner;                                                            \
    const int threads = lines > 1 && lines * n >= TV_LIB_PARALLEL_WORK ? tv_lib_threads() : 1;      \
    int32_t rc = 0;                                                                                 \
    tv_lib_topk_job_##S job = {data, values, indices, &rc, n, inner, k, index_dtype, lines,         \
                               tv_lib_chunks(lines, n, threads), k <= TV_LIB_SELECT_MAX && k * 16 <= n, ascending}; \
    tv_lib_run(job.chunks, threads, tv_lib_topk_chunk_##S, &job);                                   \
    return rc;                                                                                      \
  }
TV_LIB_DTYPES(TV_LIB_SORT)
#undef TV_LIB_SORT

static int32_t tv_lib_topk(const void* data, int64_t dtype, int64_t outer, int64_t n, int64_t inner, int64_t k,
                           int64_t ascending, void* values, void* indices, int64_t index_dtype) {
  if (k < 0 || k > n) return TV_ERROR_SIZE;
  if (outer == 0 || inner == 0 || k == 0) return 0;
  switch (dtype) {
#define TV_LIB_TOPK_CASE(CODE, T, S, F)                                                            \
  case CODE: return tv_lib_topk_##S((const T*)data, outer, n, inner, k, ascending != 0, (T*)values, indices, index_dtype);
    TV_LIB_DTYPES(TV_LIB_TOPK_CASE)
#undef TV_LIB_TOPK_CASE
    default: return TV_ERROR_DTYPE;
  }
}

__attribute__((unused)) static int32_t tv_sort(const void* data, int64_t dtype, int64_t outer, int64_t n,
                                               int64_t inner, int64_t k, int64_t ascending, void* values) {
  return tv_lib_topk(data, dtype, outer, n, inner, k, ascending, values, NULL, 0);
}

__attribute__((unused)) static int32_t tv_argsort(const void* data, int64_t dtype, int64_t outer, int64_t n,
                                                  int64_t inner, int64_t k, int64_t ascending, void* indices,
                                                  int64_t index_dtype) {
  return tv_lib_topk(data, dtype, outer, n, inner, k, ascending, NULL, indices, index_dtype);
}

__attribute__((unused)) static int32_t tv_topk(const void* data, int64_t dtype, int64_t outer, int64_t n,
                                               int64_t inner, int64_t k, int64_t ascending, void* values,
                                               void* indices, int64_t index_dtype) {
  return tv_lib_topk(data, dtype, outer, n, inner, k, ascending, values, indices, index_dtype);
}

/* ---- running sums and products ------------------------------------------------------------------ */

/* Element i of an array of any dtype, converted to T (as NumPy's astype). */
#define TV_LIB_LOAD_AS(CODE, T, S, F)                                                               \
  static inline T tv_lib_load_as_##S(const void* p, int64_t i, int64_t dtype) {                     \
    T r = (T)0;                                                                                     \
    switch (dtype) {                                                                                \
      TV_LIB_DTYPES_INNER(TV_LIB_LOAD_AS_CASE)                                                      \
      default: break;                                                                               \
    }                                                                                               \
    return r;                                                                                       \
  }
#define TV_LIB_LOAD_AS_CASE(CODE, T, S, F) case CODE: r = ((const T*)p)[i]; break;
TV_LIB_DTYPES(TV_LIB_LOAD_AS)
#undef TV_LIB_LOAD_AS_CASE
#undef TV_LIB_LOAD_AS

/* y = the running sum (product) of x along the axis, in y's type; exclusive: each element left out. */
#define TV_LIB_SCAN(CODE, T, S, F)                                                                  \
  static void tv_lib_scan_##S(const void* x, int64_t x_dtype, T* y, int64_t outer, int64_t n,       \
                              int64_t inner, bool product, bool exclusive) {                        \
    for (int64_t o = 0; o < outer; o++) {                                                           \
      for (int64_t i = 0; i < inner; i++) {                                                         \
        T acc = product ? (T)1 : (T)0;                                                              \
        for (int64_t j = 0; j < n; j++) {                                                           \
          const int64_t at = (o * n + j) * inner + i;                                               \
          const T v = tv_lib_load_as_##S(x, at, x_dtype);                                           \
          if (exclusive) y[at] = acc;                                                               \
          acc = product ? (T)(acc * v) : (T)(acc + v);                                              \
          if (!exclusive) y[at] = acc;                                                              \
        }                                                                                           \
      }                                                                                             \
    }                                                                                               \
  }
TV_LIB_NUMBERS(TV_LIB_SCAN) /* (no bool: a scan accumulates in a number type) */
#undef TV_LIB_SCAN

__attribute__((unused)) static int32_t tv_scan(const void* x, int64_t x_dtype, void* y, int64_t y_dtype,
                                               int64_t outer, int64_t n, int64_t inner, int64_t product,
                                               int64_t exclusive) {
  switch (y_dtype) {
#define TV_LIB_SCAN_CASE(CODE, T, S, F)                                                            \
  case CODE: tv_lib_scan_##S(x, x_dtype, (T*)y, outer, n, inner, product != 0, exclusive != 0); return 0;
    TV_LIB_NUMBERS(TV_LIB_SCAN_CASE)
#undef TV_LIB_SCAN_CASE
    default: return TV_ERROR_DTYPE;
  }
}

/* ---- searchsorted ------------------------------------------------------------------------------- */

/* For each of the m values of row r, the insertion index into the sorted row r of n elements (rows
   seq_step elements apart: 0 for one sequence shared by every row). */
#define TV_LIB_SEARCH(CODE, T, S, F)                                                                \
  static void tv_lib_search_##S(const T* seq, const T* values, int64_t rows, int64_t n, int64_t m,  \
                                int64_t seq_step, bool right, void* out, int64_t out_dtype) {       \
    for (int64_t r = 0; r < rows; r++) {                                                            \
      const T* row = seq + r * seq_step;                                                            \
      for (int64_t j = 0; j < m; j++) {                                                             \
        const T v = values[r * m + j];                                                              \
        int64_t lo = 0, hi = n;                                                                     \
        while (lo < hi) {                                                                           \
          const int64_t mid = lo + (hi - lo) / 2;                                                   \
          if (right ? !tv_lib_less_##S(v, row[mid]) : tv_lib_less_##S(row[mid], v)) lo = mid + 1;   \
          else hi = mid;                                                                            \
        }                                                                                           \
        tv_lib_store_int(out, r * m + j, lo, out_dtype);                                            \
      }                                                                                             \
    }                                                                                               \
  }
TV_LIB_DTYPES(TV_LIB_SEARCH)
#undef TV_LIB_SEARCH

__attribute__((unused)) static int32_t tv_searchsorted(const void* seq, const void* values, int64_t dtype,
                                                       int64_t rows, int64_t n, int64_t m, int64_t seq_step,
                                                       int64_t right, void* out, int64_t out_dtype) {
  switch (dtype) {
#define TV_LIB_SEARCH_CASE(CODE, T, S, F)                                                          \
  case CODE: tv_lib_search_##S((const T*)seq, (const T*)values, rows, n, m, seq_step, right != 0, out, out_dtype); \
    return 0;
    TV_LIB_DTYPES(TV_LIB_SEARCH_CASE)
#undef TV_LIB_SEARCH_CASE
    default: return TV_ERROR_DTYPE;
  }
}

/* ---- scatters ----------------------------------------------------------------------------------- */

/* The reductions of a scatter (the order of op/transform.py's scatter modes). */
enum { TV_SCATTER_UPDATE, TV_SCATTER_ADD, TV_SCATTER_MUL, TV_SCATTER_MEAN, TV_SCATTER_MIN, TV_SCATTER_MAX };

/* out[at] = out[at] (reduction) u; min and max propagate NaN, as NumPy's minimum and maximum. */
#define TV_LIB_APPLY(CODE, T, S, F)                                                                 \
  static inline void tv_lib_apply_##S(T* out, int64_t at, T u, int64_t reduction) {                 \
    const T a = out[at];                                                                            \
    switch (reduction) {                                                                            \
      case TV_SCATTER_ADD: out[at] = (T)(a + u); break;                                             \
      case TV_SCATTER_MUL: out[at] = (T)(a * u); break;                                             \
      case TV_SCATTER_MIN: out[at] = (a < u || tv_lib_isnan_##S(a)) ? a : u; break;                 \
      case TV_SCATTER_MAX: out[at] = (a > u || tv_lib_isnan_##S(a)) ? a : u; break;                 \
      default: out[at] = u; break;                                                                  \
    }                                                                                               \
  }
TV_LIB_NUMBERS(TV_LIB_APPLY)
#undef TV_LIB_APPLY
static inline void tv_lib_apply_b(bool* out, int64_t at, bool u, int64_t reduction) { /* NumPy's bool ufuncs */
  const bool a = out[at];
  switch (reduction) {
    case TV_SCATTER_ADD: case TV_SCATTER_MAX: out[at] = a || u; break;
    case TV_SCATTER_MUL: case TV_SCATTER_MIN: out[at] = a && u; break;
    default: out[at] = u; break;
  }
}

/* Applies updates[p] at target[p] (positions in out), p < count, in order; mean: out becomes the
   average of each element with every update landing on it, computed in double. */
static int32_t tv_lib_scatter_apply(void* out, int64_t dtype, int64_t size, const void* updates,
                                    const int64_t* target, int64_t count, int64_t inner, int64_t reduction) {
  if (reduction == TV_SCATTER_MEAN) {
    double* total = (double*)malloc(sizeof(double) * (size_t)(size > 0 ? size : 1));
    int64_t* hits = (int64_t*)calloc((size_t)(size > 0 ? size : 1), sizeof(int64_t));
    if (total == NULL || hits == NULL) {
      free(total);
      free(hits);
      return TV_ERROR_OUT_OF_MEMORY;
    }
    switch (dtype) {
#define TV_LIB_MEAN_CASE(CODE, T, S, F)                                                            \
  case CODE:                                                                                       \
    for (int64_t e = 0; e < size; e++) { total[e] = (double)((T*)out)[e]; hits[e] = 1; }           \
    for (int64_t p = 0; p < count; p++)                                                            \
      for (int64_t t = 0; t < inner; t++) {                                                        \
        total[target[p] + t] += (double)((const T*)updates)[p * inner + t];                        \
        hits[target[p] + t]++;                                                                     \
      }                                                                                            \
    for (int64_t e = 0; e < size; e++) ((T*)out)[e] = (T)(total[e] / (double)hits[e]);             \
    break;
      TV_LIB_DTYPES(TV_LIB_MEAN_CASE)
#undef TV_LIB_MEAN_CASE
      default: break;
    }
    free(total);
    free(hits);
    return 0;
  }
  switch (dtype) {
#define TV_LIB_APPLY_CASE(CODE, T, S, F)                                                           \
  case CODE:                                                                                       \
    for (int64_t p = 0; p < count; p++)                                                            \
      for (int64_t t = 0; t < inner; t++)                                                          \
        tv_lib_apply_##S((T*)out, target[p] + t, ((const T*)updates)[p * inner + t], reduction);   \
    return 0;
    TV_LIB_DTYPES(TV_LIB_APPLY_CASE)
#undef TV_LIB_APPLY_CASE
    default: return TV_ERROR_DTYPE;
  }
}

/* An index in [-n, n) as a position in [0, n), or -1. */
static inline int64_t tv_lib_wrap_index(int64_t index, int64_t n) {
  if (index < -n || index >= n) return -1;
  return index < 0 ? index + n : index;
}

/* out = data, then updates[p] applied at p with its axis coordinate replaced by indices[p]; dims holds
   data's rank dims, then the rank dims of indices (and updates). Every index is checked before any
   update is applied. */
__attribute__((unused)) static int32_t tv_scatter_elements(const void* data, const void* indices,
                                                           int64_t index_dtype, const void* updates, void* out,
                                                           int64_t dtype, int64_t rank, const int64_t* dims,
                                                           int64_t axis, int64_t reduction) {
  const int64_t size_of = tv_lib_itemsize(dtype);
  if (size_of == 0) return TV_ERROR_DTYPE;
  int64_t size = 1, count = 1;
  for (int64_t d = 0; d < rank; d++) {
    size *= dims[d];
    count *= dims[rank + d];
  }
  memcpy(out, data, (size_t)(size * size_of));
  if (count == 0) return 0;
  int64_t* target = (int64_t*)malloc(sizeof(int64_t) * (size_t)count);
  int64_t* coord = (int64_t*)calloc((size_t)rank, sizeof(int64_t));
  if (target == NULL || coord == NULL) {
    free(target);
    free(coord);
    return TV_ERROR_OUT_OF_MEMORY;
  }
  int32_t rc = 0;
  for (int64_t p = 0; p < count && rc == 0; p++) {
    int64_t at = 0;
    for (int64_t d = 0; d < rank; d++) {
      int64_t c = coord[d];
      if (d == axis) {
        c = tv_lib_wrap_index(tv_lib_load_int(indices, p, index_dtype), dims[d]);
        if (c < 0) rc = TV_ERROR_INDEX;
      }
      at = at * dims[d] + c;
    }
    target[p] = at;
    for (int64_t d = rank - 1; d >= 0; d--) { /* the next position in indices, row-major */
      if (++coord[d] < dims[rank + d]) break;
      coord[d] = 0;
    }
  }
  if (rc == 0) rc = tv_lib_scatter_apply(out, dtype, size, updates, target, count, 1, reduction);
  free(target);
  free(coord);
  return rc;
}

/* out = data, then the slice updates[y] (inner elements) applied at data[indices[0, y], ...,
   indices[depth - 1, y]] for each of the count positions y; dims holds data's first depth dims. */
__attribute__((unused)) static int32_t tv_scatter_nd(const void* data, const void* indices, int64_t index_dtype,
                                                     const void* updates, void* out, int64_t dtype, int64_t size,
                                                     int64_t depth, int64_t count, int64_t inner,
                                                     const int64_t* dims, int64_t reduction) {
  const int64_t size_of = tv_lib_itemsize(dtype);
  if (size_of == 0) return TV_ERROR_DTYPE;
  /* out == data: the update runs in place (ManifestAlloc, transform/update_in_place.py); data is then
     not read at all, only out's entries at the indices are written. */
  if (out != data) memcpy(out, data, (size_t)(size * size_of));
  if (count == 0 || inner == 0) return 0;
  int64_t* target = (int64_t*)malloc(sizeof(int64_t) * (size_t)count);
  if (target == NULL) return TV_ERROR_OUT_OF_MEMORY;
  for (int64_t y = 0; y < count; y++) {
    int64_t at = 0;
    for (int64_t d = 0; d < depth; d++) {
      const int64_t c = tv_lib_wrap_index(tv_lib_load_int(indices, d * count + y, index_dtype), dims[d]);
      if (c < 0) {
        free(target);
        return TV_ERROR_INDEX;
      }
      at = at * dims[d] + c;
    }
    target[y] = at * inner;
  }
  const int32_t rc = tv_lib_scatter_apply(out, dtype, size, updates, target, count, inner, reduction);
  free(target);
  return rc;
}

/* ---- argwhere ----------------------------------------------------------------------------------- */

/* The coordinates of the nonzero elements of cond (rank dims), row-major, into out (count, rank);
   count must be the number of nonzero elements (the op's shape function counted them). */
__attribute__((unused)) static int32_t tv_argwhere(const void* cond, int64_t dtype, int64_t rank,
                                                   const int64_t* dims, int64_t count, int32_t* out) {
  int64_t size = 1;
  for (int64_t d = 0; d < rank; d++) size *= dims[d];
  int64_t found = 0;
  for (int64_t e = 0; e < size; e++) {
    bool nonzero = false;
    switch (dtype) {
#define TV_LIB_NONZERO_CASE(CODE, T, S, F) case CODE: nonzero = ((const T*)cond)[e] != (T)0; break;
      TV_LIB_DTYPES(TV_LIB_NONZERO_CASE)
#undef TV_LIB_NONZERO_CASE
      default: return TV_ERROR_DTYPE;
    }
    if (!nonzero) continue;
    if (found == count) return TV_ERROR_SIZE;
    int64_t rest = e;
    for (int64_t d = rank - 1; d >= 0; d--) {
      out[found * rank + d] = (int32_t)(rest % dims[d]);
      rest /= dims[d];
    }
    found++;
  }
  return found == count ? 0 : TV_ERROR_SIZE;
}

/* ---- reinterpret: the same bytes as another dtype of the same width ------------------------------- */

__attribute__((unused)) static int32_t tv_reinterpret(const void* in, int64_t bytes, void* out) {
  if (bytes > 0) memcpy(out, in, (size_t)bytes);
  return 0;
}

/* ---- unique, given the sorted order ------------------------------------------------------------- */

/* Groups the n elements of data by value along their stable ascending order (argsort's, checked here:
   a position out of range or an order that is not ascending is an error); equal values, NaN with NaN,
   form one group. Writes count (the number of groups, which the op's shape function counted) of:
   values, first (the first position of each group), counts (NULL: not wanted) and, per element, inverse
   (its group); groups ordered by value, or by first appearance when by_appearance. */
#define TV_LIB_GROUPS(CODE, T, S, F)                                                                \
  static int32_t tv_lib_groups_##S(const T* data, const void* order, int64_t order_dtype, int64_t n, \
                                   int64_t count, int64_t* first, int64_t* sizes, int32_t* inverse) { \
    int64_t g = -1, previous = 0;                                                                   \
    for (int64_t i = 0; i < n; i++) {                                                               \
      const int64_t p = tv_lib_load_int(order, i, order_dtype);                                     \
      if (p < 0 || p >= n) return TV_ERROR_INDEX;                                                   \
      if (i > 0 && tv_lib_less_##S(data[p], data[previous])) return TV_ERROR_INDEX;                 \
      if (i == 0 || tv_lib_less_##S(data[previous], data[p])) {                                     \
        if (++g >= count) return TV_ERROR_SIZE;                                                     \
        first[g] = p;                                                                               \
        sizes[g] = 0;                                                                               \
      }                                                                                             \
      sizes[g]++;                                                                                   \
      inverse[p] = (int32_t)g;                                                                      \
      previous = p;                                                                                 \
    }                                                                                               \
    return g + 1 == count ? 0 : TV_ERROR_SIZE;                                                      \
  }
TV_LIB_DTYPES(TV_LIB_GROUPS)
#undef TV_LIB_GROUPS

static int32_t tv_lib_unique(const void* data, int64_t dtype, const void* order, int64_t order_dtype, int64_t n,
                             int64_t count, int64_t by_appearance, void* values, int32_t* first, int32_t* inverse,
                             int32_t* counts) {
  const int64_t size = tv_lib_itemsize(dtype);
  if (size == 0) return TV_ERROR_DTYPE;
  int64_t* work = (int64_t*)malloc(sizeof(int64_t) * (size_t)(3 * count + 1));
  if (work == NULL) return TV_ERROR_OUT_OF_MEMORY;
  int64_t *group_first = work, *sizes = work + count, *rank = work + 2 * count;
  int32_t rc = TV_ERROR_DTYPE;
  switch (dtype) {
#define TV_LIB_GROUPS_CASE(CODE, T, S, F)                                                          \
  case CODE: rc = tv_lib_groups_##S((const T*)data, order, order_dtype, n, count, group_first, sizes, inverse); break;
    TV_LIB_DTYPES(TV_LIB_GROUPS_CASE)
#undef TV_LIB_GROUPS_CASE
    default: break;
  }
  if (rc == 0) {
    for (int64_t g = 0; g < count; g++) rank[g] = g;
    if (by_appearance) { /* number the groups as their first elements come, one pass over the data */
      int64_t next = 0;
      for (int64_t g = 0; g < count; g++) rank[g] = -1;
      for (int64_t p = 0; p < n; p++)
        if (rank[inverse[p]] < 0) rank[inverse[p]] = next++;
      for (int64_t p = 0; p < n; p++) inverse[p] = (int32_t)rank[inverse[p]];
    }
    for (int64_t g = 0; g < count; g++) {
      const int64_t r = rank[g];
      memcpy((char*)values + r * size, (const char*)data + group_first[g] * size, (size_t)size);
      first[r] = (int32_t)group_first[g];
      if (counts != NULL) counts[r] = (int32_t)sizes[g];
    }
  }
  free(work);
  return rc;
}

__attribute__((unused)) static int32_t tv_unique(const void* data, int64_t dtype, const void* order,
                                                 int64_t order_dtype, int64_t n, int64_t count,
                                                 int64_t by_appearance, void* values, int32_t* first,
                                                 int32_t* inverse) {
  return tv_lib_unique(data, dtype, order, order_dtype, n, count, by_appearance, values, first, inverse, NULL);
}

__attribute__((unused)) static int32_t tv_unique_counts(const void* data, int64_t dtype, const void* order,
                                                        int64_t order_dtype, int64_t n, int64_t count,
                                                        int64_t by_appearance, void* values, int32_t* first,
                                                        int32_t* inverse, int32_t* counts) {
  return tv_lib_unique(data, dtype, order, order_dtype, n, count, by_appearance, values, first, inverse, counts);
}
