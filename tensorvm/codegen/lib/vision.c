/* Object detection and sparse rows: the library functions of the ops in tensorvm/op/vision.py (see
   tv_lib.h). Boxes, scores and features of any float dtype are read as double through their dtype code;
   a float attribute arrives as the int64 holding its IEEE-754 bits (tv_vision_double). */
#include <math.h>

#include "tv_lib.h"

/* Element i of a float (or integer) array of any dtype, as double, and the store back. */
static double tv_vision_load(const void* p, int64_t i, int64_t dtype) {
  switch (dtype) {
#define TV_VISION_LOAD_CASE(CODE, T, S, F) case CODE: return (double)((const T*)p)[i];
    TV_LIB_DTYPES(TV_VISION_LOAD_CASE)
#undef TV_VISION_LOAD_CASE
    default: return 0.0;
  }
}
static void tv_vision_store(void* p, int64_t i, double value, int64_t dtype) {
  switch (dtype) {
#define TV_VISION_STORE_CASE(CODE, T, S, F) case CODE: ((T*)p)[i] = (T)value; break;
    TV_LIB_DTYPES(TV_VISION_STORE_CASE)
#undef TV_VISION_STORE_CASE
    default: break;
  }
}
static bool tv_vision_known_dtype(int64_t dtype) { return tv_lib_itemsize(dtype) > 0; }

/* The double whose IEEE-754 bits are `bits` (how a float attribute is passed). */
static double tv_vision_double(int64_t bits) {
  double d;
  memcpy(&d, &bits, sizeof d);
  return d;
}

/* A box's intersection over union; corners (x1, y1, x2, y2) in either order along each axis. */
static double tv_vision_iou(const double* a, const double* b) {
  const double al = a[0] < a[2] ? a[0] : a[2], ar = a[0] < a[2] ? a[2] : a[0];
  const double at = a[1] < a[3] ? a[1] : a[3], ab = a[1] < a[3] ? a[3] : a[1];
  const double bl = b[0] < b[2] ? b[0] : b[2], br = b[0] < b[2] ? b[2] : b[0];
  const double bt = b[1] < b[3] ? b[1] : b[3], bb = b[1] < b[3] ? b[3] : b[1];
  const double w = (ar < br ? ar : br) - (al > bl ? al : bl);
  const double h = (ab < bb ? ab : bb) - (at > bt ? at : bt);
  const double inter = (w > 0 ? w : 0) * (h > 0 ? h : 0);
  const double u = (ar - al) * (ab - at) + (br - bl) * (bb - bt) - inter;
  return u > 0 ? inter / u : 0.0;
}

/* A candidate: its score and position; sorted by descending score, then ascending position (a stable
   descending sort), NaN last. */
typedef struct { double score; int64_t at; } tv_vision_scored;
static int tv_vision_by_score(const void* pa, const void* pb) {
  const tv_vision_scored* a = (const tv_vision_scored*)pa;
  const tv_vision_scored* b = (const tv_vision_scored*)pb;
  const bool na = a->score != a->score, nb = b->score != b->score;
  if (na != nb) return na ? 1 : -1;
  if (!na && a->score != b->score) return a->score > b->score ? -1 : 1;
  return (a->at > b->at) - (a->at < b->at);
}
/* Sorts candidates by tv_vision_by_score; one pass first, as they often come sorted (from a topk). */
static void tv_vision_sort_scored(tv_vision_scored* order, int64_t n) {
  int64_t j = 1;
  while (j < n && tv_vision_by_score(&order[j - 1], &order[j]) < 0) j++;
  if (j < n) qsort(order, (size_t)n, sizeof(tv_vision_scored), tv_vision_by_score);
}

/* Whether the box (x1, y1, x2, y2) overlaps one of n kept boxes with IoU > limit: tv_vision_iou(kept,
   box) with the kept boxes' corners ordered once and stored as columns (left, top, right, bottom), in
   the same arithmetic, so the loop vectorizes; blocks of 32 stop early at the first overlap. */
static bool tv_vision_overlaps(const double* restrict left, const double* restrict top,
                               const double* restrict right, const double* restrict bottom, int64_t n,
                               const double* box, double limit) {
  const double bl = box[0] < box[2] ? box[0] : box[2], br = box[0] < box[2] ? box[2] : box[0];
  const double bt = box[1] < box[3] ? box[1] : box[3], bb = box[1] < box[3] ? box[3] : box[1];
  for (int64_t start = 0; start < n; start += 32) {
    const int64_t end = start + 32 < n ? start + 32 : n;
    int hit = 0;
    for (int64_t k = start; k < end; k++) {
      const double al = left[k], ar = right[k], at = top[k], ab = bottom[k];
      const double w = (ar < br ? ar : br) - (al > bl ? al : bl);
      const double h = (ab < bb ? ab : bb) - (at > bt ? at : bt);
      const double inter = (w > 0 ? w : 0) * (h > 0 ? h : 0);
      const double u = (ar - al) * (ab - at) + (br - bl) * (bb - bt) - inter;
      hit |= (u > 0 ? inter / u : 0.0) > limit;
    }
    if (hit) return true;
  }
  return false;
}

/* ---- get_valid_counts -------------------------------------------------------------------------- */

/* Moves the boxes (rows of data (batch, anchors, elems)) whose score exceeds the threshold and whose
   class id (when id_index >= 0) is not negative to the top of out, in order; their positions go to
   out_indices, the rest of out and out_indices is -1; valid_count counts them. */
__attribute__((unused)) static int32_t tv_get_valid_counts(const void* data, int64_t dtype, int64_t batch,
                                                           int64_t anchors, int64_t elems, const void* threshold,
                                                           int64_t threshold_dtype, int64_t id_index,
                                                           int64_t score_index, int32_t* valid_count, void* out,
                                                           int32_t* out_indices) {
  if (!tv_vision_known_dtype(dtype) || !tv_vision_known_dtype(threshold_dtype)) return TV_ERROR_DTYPE;
  if (score_index < 0 || score_index >= elems || id_index >= elems) return TV_ERROR_INDEX;
  const double limit = tv_vision_load(threshold, 0, threshold_dtype);
  for (int64_t b = 0; b < batch; b++) {
    int64_t count = 0;
    for (int64_t j = 0; j < anchors; j++) {
      const int64_t row = (b * anchors + j) * elems;
      const bool valid = tv_vision_load(data, row + score_index, dtype) > limit &&
                         (id_index < 0 || tv_vision_load(data, row + id_index, dtype) >= 0);
      if (!valid) continue;
      const int64_t dst = (b * anchors + count) * elems;
      for (int64_t k = 0; k < elems; k++) tv_vision_store(out, dst + k, tv_vision_load(data, row + k, dtype), dtype);
      out_indices[b * anchors + count] = (int32_t)j;
      count++;
    }
    for (int64_t j = count; j < anchors; j++) {
      for (int64_t k = 0; k < elems; k++) tv_vision_store(out, (b * anchors + j) * elems + k, -1.0, dtype);
      out_indices[b * anchors + j] = -1;
    }
    valid_count[b] = (int32_t)count;
  }
  return 0;
}

/* ---- non_max_suppression (Relay) --------------------------------------------------------------- */

/* Per batch: the first valid_count boxes sorted by descending score (stably), the best top_k of them
   (top_k > 0), then greedily kept in that order unless max_output_size (>= 0) boxes are kept already or
   a kept box of the same class (any class: force_suppress or id_index < 0) overlaps it with
   IoU >= iou_threshold. Writes either box_indices (the kept boxes' `indices` entries, at the top, -1
   after) and counts, or out: the sorted rows with the suppressed ones -1 (kept rows at the top when
   invalid_to_bottom). */
static int32_t tv_vision_nms(const void* data, int64_t dtype, int64_t batch, int64_t anchors, int64_t elems,
                             const void* valid_count, int64_t count_dtype, const void* indices,
                             int64_t indices_dtype, const void* max_output, int64_t max_dtype,
                             const void* iou_threshold, int64_t iou_dtype, int64_t force_suppress, int64_t top_k,
                             int64_t coord_start, int64_t score_index, int64_t id_index, int64_t invalid_to_bottom,
                             int32_t* box_indices, int32_t* counts, void* out) {
  if (!tv_vision_known_dtype(dtype) || !tv_vision_known_dtype(count_dtype) || !tv_vision_known_dtype(indices_dtype) ||
      !tv_vision_known_dtype(max_dtype) || !tv_vision_known_dtype(iou_dtype))
    return TV_ERROR_DTYPE;
  if (score_index < 0 || score_index >= elems || id_index >= elems || coord_start < 0 || coord_start + 4 > elems)
    return TV_ERROR_INDEX;
  const int64_t max_out = tv_lib_load_int(max_output, 0, max_dtype);
  const double threshold = tv_vision_load(iou_threshold, 0, iou_dtype);
  tv_vision_scored* order = (tv_vision_scored*)malloc(sizeof(tv_vision_scored) * (size_t)(anchors ? anchors : 1));
  double* boxes = (double*)malloc(sizeof(double) * 4 * (size_t)(anchors ? anchors : 1));
  bool* kept = (bool*)malloc(sizeof(bool) * (size_t)(anchors ? anchors : 1));
  int32_t rc = 0;
  if (order == NULL || boxes == NULL || kept == NULL) rc = TV_ERROR_OUT_OF_MEMORY;
  for (int64_t b = 0; b < batch && rc == 0; b++) {
    int64_t n = tv_lib_load_int(valid_count, b, count_dtype);
    n = n < 0 ? 0 : (n > anchors ? anchors : n);
    for (int64_t j = 0; j < n; j++) {
      order[j].score = tv_vision_load(data, (b * anchors + j) * elems + score_index, dtype);
      order[j].at = j;
    }
    tv_vision_sort_scored(order, n);
    const int64_t nkeep = top_k > 0 && top_k < n ? top_k : n;
    int64_t num_kept = 0;
    for (int64_t j = 0; j < nkeep; j++) {
      const int64_t row = (b * anchors + order[j].at) * elems;
      for (int64_t k = 0; k < 4; k++) boxes[4 * j + k] = tv_vision_load(data, row + coord_start + k, dtype);
      kept[j] = max_out < 0 || num_kept < max_out;
      const double id = id_index >= 0 ? tv_vision_load(data, row + id_index, dtype) : 0.0;
      for (int64_t k = 0; k < j && kept[j]; k++) {
        if (!kept[k]) continue;
        const bool same_class = force_suppress || id_index < 0 ||
                                tv_vision_load(data, (b * anchors + order[k].at) * elems + id_index, dtype) == id;
        if (same_class && tv_vision_iou(boxes + 4 * k, boxes + 4 * j) >= threshold) kept[j] = false;
      }
      num_kept += kept[j];
    }
    if (box_indices != NULL) {
      int64_t at = 0;
      for (int64_t j = 0; j < nkeep; j++) {
        if (!kept[j]) continue;
        const int64_t index = tv_lib_load_int(indices, b * anchors + order[j].at, indices_dtype);
        box_indices[b * anchors + at++] = (int32_t)index;
      }
      for (; at < anchors; at++) box_indices[b * anchors + at] = -1;
      counts[b] = (int32_t)num_kept;
    } else {
      int64_t at = 0;
      for (int64_t j = 0; j < nkeep; j++) {
        if (!kept[j] && invalid_to_bottom) continue;
        const int64_t dst = (b * anchors + at++) * elems, src = (b * anchors + order[j].at) * elems;
        for (int64_t k = 0; k < elems; k++)
          tv_vision_store(out, dst + k, kept[j] ? tv_vision_load(data, src + k, dtype) : -1.0, dtype);
      }
      for (; at < anchors; at++)
        for (int64_t k = 0; k < elems; k++) tv_vision_store(out, (b * anchors + at) * elems + k, -1.0, dtype);
    }
  }
  free(order);
  free(boxes);
  free(kept);
  return rc;
}

__attribute__((unused)) static int32_t tv_nms_indices(const void* data, int64_t dtype, int64_t batch, int64_t anchors,
                                                      int64_t elems, const void* valid_count, int64_t count_dtype,
                                                      const void* indices, int64_t indices_dtype,
                                                      const void* max_output, int64_t max_dtype,
                                                      const void* iou_threshold, int64_t iou_dtype,
                                                      int64_t force_suppress, int64_t top_k, int64_t coord_start,
                                                      int64_t score_index, int64_t id_index, int32_t* box_indices,
                                                      int32_t* counts) {
  return tv_vision_nms(data, dtype, batch, anchors, elems, valid_count, count_dtype, indices, indices_dtype,
                       max_output, max_dtype, iou_threshold, iou_dtype, force_suppress, top_k, coord_start,
                       score_index, id_index, 0, box_indices, counts, NULL);
}

__attribute__((unused)) static int32_t tv_nms_boxes(const void* data, int64_t dtype, int64_t batch, int64_t anchors,
                                                    int64_t elems, const void* valid_count, int64_t count_dtype,
                                                    const void* indices, int64_t indices_dtype,
                                                    const void* max_output, int64_t max_dtype,
                                                    const void* iou_threshold, int64_t iou_dtype,
                                                    int64_t force_suppress, int64_t top_k, int64_t coord_start,
                                                    int64_t score_index, int64_t id_index, int64_t invalid_to_bottom,
                                                    void* out) {
  return tv_vision_nms(data, dtype, batch, anchors, elems, valid_count, count_dtype, indices, indices_dtype,
                       max_output, max_dtype, iou_threshold, iou_dtype, force_suppress, top_k, coord_start,
                       score_index, id_index, invalid_to_bottom, NULL, NULL, out);
}

/* ---- all_class_non_max_suppression -------------------------------------------------------------- */

/* Per batch and class: the boxes (batch, boxes, 4) whose score (batch, classes, boxes) exceeds
   score_threshold, by descending score (stably), each kept unless max_per_class (>= 0) are kept already
   or a kept one overlaps it with IoU > iou_threshold. ONNX format (scores_out NULL): rows (batch, class,
   box) in that order, then zero rows, and counts[0] their number. TensorFlow format: per batch, rows
   (class, box) and their scores by descending score (stably), then zeros, and counts[batch]. */
static int32_t tv_vision_all_class_nms(const void* boxes, int64_t dtype, const void* scores, int64_t scores_dtype,
                                       int64_t batch, int64_t classes, int64_t num_boxes, const void* max_output,
                                       int64_t max_dtype, const void* iou_threshold, int64_t iou_dtype,
                                       const void* score_threshold, int64_t score_dtype, int64_t* indices,
                                       void* scores_out, int64_t* counts) {
  if (!tv_vision_known_dtype(dtype) || !tv_vision_known_dtype(scores_dtype) || !tv_vision_known_dtype(max_dtype) ||
      !tv_vision_known_dtype(iou_dtype) || !tv_vision_known_dtype(score_dtype))
    return TV_ERROR_DTYPE;
  const int64_t max_out = tv_lib_load_int(max_output, 0, max_dtype);
  const double iou_limit = tv_vision_load(iou_threshold, 0, iou_dtype);
  const double score_limit = tv_vision_load(score_threshold, 0, score_dtype);
  const bool tf = scores_out != NULL;
  const int64_t per_batch = classes * num_boxes, width = tf ? 2 : 3;
  const size_t room = (size_t)(per_batch > num_boxes ? per_batch : num_boxes) + 1;
  tv_vision_scored* order = (tv_vision_scored*)malloc(sizeof(tv_vision_scored) * room);
  tv_vision_scored* chosen = (tv_vision_scored*)malloc(sizeof(tv_vision_scored) * room);
  double* kept_boxes = (double*)malloc(sizeof(double) * 4 * room);
  if (order == NULL || chosen == NULL || kept_boxes == NULL) {
    free(order);
    free(chosen);
    free(kept_boxes);
    return TV_ERROR_OUT_OF_MEMORY;
  }
  double *left = kept_boxes, *top = left + room, *right = top + room, *bottom = right + room;
  int64_t total = 0;
  for (int64_t b = 0; b < batch; b++) {
    int64_t in_batch = 0;
    for (int64_t c = 0; c < classes; c++) {
      int64_t n = 0;
      for (int64_t i = 0; i < num_boxes; i++) {
        const double s = tv_vision_load(scores, (b * classes + c) * num_boxes + i, scores_dtype);
        if (s > score_limit) {
          order[n].score = s;
          order[n++].at = i;
        }
      }
      tv_vision_sort_scored(order, n);
      int64_t kept = 0;
      for (int64_t j = 0; j < n && (max_out < 0 || kept < max_out); j++) {
        double box[4];
        for (int64_t k = 0; k < 4; k++) box[k] = tv_vision_load(boxes, (b * num_boxes + order[j].at) * 4 + k, dtype);
        if (tv_vision_overlaps(left, top, right, bottom, kept, box, iou_limit)) continue;
        left[kept] = box[0] < box[2] ? box[0] : box[2];
        right[kept] = box[0] < box[2] ? box[2] : box[0];
        top[kept] = box[1] < box[3] ? box[1] : box[3];
        bottom[kept] = box[1] < box[3] ? box[3] : box[1];
        kept++;
        if (tf) {  /* (at: the place in class-major order, a stable tie-break for the sort by score) */
          chosen[in_batch].score = order[j].score;
          chosen[in_batch++].at = c * num_boxes + order[j].at;
        } else {
          int64_t* row = indices + 3 * total++;
          row[0] = b;
          row[1] = c;
          row[2] = order[j].at;
        }
      }
    }
    if (tf) {
      tv_vision_sort_scored(chosen, in_batch);
      for (int64_t j = 0; j < per_batch; j++) {
        int64_t* row = indices + (b * per_batch + j) * 2;
        row[0] = j < in_batch ? chosen[j].at / num_boxes : 0;
        row[1] = j < in_batch ? chosen[j].at % num_boxes : 0;
        tv_vision_store(scores_out, b * per_batch + j, j < in_batch ? chosen[j].score : 0.0, scores_dtype);
      }
      counts[b] = in_batch;
    }
  }
  if (!tf) {
    memset(indices + 3 * total, 0, sizeof(int64_t) * (size_t)(width * (batch * per_batch - total)));
    counts[0] = total;
  }
  free(order);
  free(chosen);
  free(kept_boxes);
  return 0;
}

__attribute__((unused)) static int32_t tv_all_class_nms_onnx(const void* boxes, int64_t dtype, const void* scores,
                                                             int64_t scores_dtype, int64_t batch, int64_t classes,
                                                             int64_t num_boxes, const void* max_output,
                                                             int64_t max_dtype, const void* iou_threshold,
                                                             int64_t iou_dtype, const void* score_threshold,
                                                             int64_t score_dtype, int64_t* indices, int64_t* count) {
  return tv_vision_all_class_nms(boxes, dtype, scores, scores_dtype, batch, classes, num_boxes, max_output, max_dtype,
                                 iou_threshold, iou_dtype, score_threshold, score_dtype, indices, NULL, count);
}

__attribute__((unused)) static int32_t tv_all_class_nms_tf(const void* boxes, int64_t dtype, const void* scores,
                                                           int64_t scores_dtype, int64_t batch, int64_t classes,
                                                           int64_t num_boxes, const void* max_output,
                                                           int64_t max_dtype, const void* iou_threshold,
                                                           int64_t iou_dtype, const void* score_threshold,
                                                           int64_t score_dtype, int64_t* indices, void* scores_out,
                                                           int64_t* counts) {
  return tv_vision_all_class_nms(boxes, dtype, scores, scores_dtype, batch, classes, num_boxes, max_output, max_dtype,
                                 iou_threshold, iou_dtype, score_threshold, score_dtype, indices, scores_out, counts);
}

/* ---- roi_align ---------------------------------------------------------------------------------- */

/* One bilinear sample: the four corners' offsets in a channel's (H, W) plane and their weights (all 0
   outside [-1, size]). The taps of a region are computed once and used for every channel. */
typedef struct { int64_t at[4]; double w[4]; } tv_vision_tap;

static tv_vision_tap tv_vision_bilinear_tap(int64_t height, int64_t width, int64_t pixel_stride, double y, double x) {
  tv_vision_tap tap = {{0, 0, 0, 0}, {0, 0, 0, 0}};
  if (y < -1.0 || y > (double)height || x < -1.0 || x > (double)width) return tap;
  y = y > 0 ? y : 0;
  x = x > 0 ? x : 0;
  int64_t y0 = (int64_t)y, x0 = (int64_t)x, y1 = y0 + 1, x1 = x0 + 1;
  if (y0 >= height - 1) {
    y0 = y1 = height - 1;
    y = (double)y0;
  }
  if (x0 >= width - 1) {
    x0 = x1 = width - 1;
    x = (double)x0;
  }
  const double ly = y - (double)y0, lx = x - (double)x0, hy = 1 - ly, hx = 1 - lx;
  const int64_t ys[4] = {y0, y0, y1, y1}, xs[4] = {x0, x1, x0, x1};
  const double ws[4] = {hy * hx, hy * lx, ly * hx, ly * lx};
  for (int k = 0; k < 4; k++) {
    tap.at[k] = (ys[k] * width + xs[k]) * pixel_stride;
    tap.w[k] = ws[k];
  }
  return tap;
}

/* Per channel and bin, the bin's `samples` taps reduced: average (mode 0), maximum of the interpolated
   values (1), maximum of the weighted corners (2). */
#define TV_VISION_FLOATS(X) TV_LIB_FLOAT16(X) X(TV_DTYPE_FLOAT32, float, f32, 1) X(TV_DTYPE_FLOAT64, double, f64, 1)
#define TV_VISION_ROI_POOL(CODE, T, S, F)                                                           \
  static void tv_vision_roi_pool_##S(const T* data, int64_t channel_stride, int64_t channels,        \
                                     const tv_vision_tap* taps, int64_t bins, int64_t samples,      \
                                     int64_t mode, T* out, int64_t out_channel_stride,              \
                                     int64_t out_bin_stride) {                                      \
    for (int64_t c = 0; c < channels; c++) {                                                        \
      const T* plane = data + c * channel_stride;                                                   \
      for (int64_t bin = 0; bin < bins; bin++) {                                                    \
        const tv_vision_tap* tap = taps + bin * samples;                                            \
        double acc = 0.0;                                                                           \
        for (int64_t s = 0; s < samples; s++, tap++) {                                              \
          double v;                                                                                 \
          if (mode == 2) {                                                                          \
            v = tap->w[0] * (double)plane[tap->at[0]];                                              \
            for (int k = 1; k < 4; k++) {                                                           \
              const double corner = tap->w[k] * (double)plane[tap->at[k]];                          \
              v = corner > v || corner != corner ? corner : v; /* (NaN wins, as np.maximum) */      \
            }                                                                                       \
          } else {                                                                                  \
            v = tap->w[0] * (double)plane[tap->at[0]] + tap->w[1] * (double)plane[tap->at[1]] +     \
                tap->w[2] * (double)plane[tap->at[2]] + tap->w[3] * (double)plane[tap->at[3]];      \
          }                                                                                         \
          acc = mode == 0 ? acc + v : (s == 0 || v > acc || v != v ? v : acc);                      \
        }                                                                                           \
        out[c * out_channel_stride + bin * out_bin_stride] = (T)(mode == 0 ? acc / (double)samples : acc); \
      }                                                                                             \
    }                                                                                               \
  }
TV_VISION_FLOATS(TV_VISION_ROI_POOL)
#undef TV_VISION_ROI_POOL

/* One roi_align call's arguments (tv_roi_align below) and its regions in chunks on the kernels' threads. */
typedef struct {
  const void *data, *rois, *batches;
  void* out;
  int32_t* rc;
  int64_t dtype, nhwc, batch, channels, height, width, rois_dtype, roi_stride, roi_first, batches_dtype,
      batch_stride, pooled_h, pooled_w, min_size, sample_ratio, mode, pixel_stride, channel_stride, bins,
      num_rois, chunks;
  double scale, offset;
} tv_vision_roi_job;

/* Region r of the job: 0, or the error code. */
static int32_t tv_vision_roi_align_region(const tv_vision_roi_job* j, int64_t r) {
  const double batch_value = tv_vision_load(j->batches, r * j->batch_stride, j->batches_dtype);
  const int64_t n = (int64_t)batch_value;
  if (!(batch_value >= 0) || n >= j->batch) {
    return TV_ERROR_INDEX;
  }
  const int64_t at = r * j->roi_stride + j->roi_first;
  const double x1 = tv_vision_load(j->rois, at, j->rois_dtype) * j->scale - j->offset;
  const double y1 = tv_vision_load(j->rois, at + 1, j->rois_dtype) * j->scale - j->offset;
  double rw = tv_vision_load(j->rois, at + 2, j->rois_dtype) * j->scale - j->offset - x1;
  double rh = tv_vision_load(j->rois, at + 3, j->rois_dtype) * j->scale - j->offset - y1;
  if (!isfinite(x1) || !isfinite(y1) || !isfinite(rw) || !isfinite(rh)) { /* (no sample count to take) */
    return TV_ERROR_INDEX;
  }
  if (j->min_size) {
    rw = rw > 1.0 ? rw : 1.0;
    rh = rh > 1.0 ? rh : 1.0;
  }
  const double bin_h = rh / (double)j->pooled_h, bin_w = rw / (double)j->pooled_w;
  int64_t sy = j->sample_ratio > 0 ? j->sample_ratio : (int64_t)ceil(bin_h);
  int64_t sx = j->sample_ratio > 0 ? j->sample_ratio : (int64_t)ceil(bin_w);
  sy = sy > 0 ? sy : 1;
  sx = sx > 0 ? sx : 1;
  tv_vision_tap* taps = (tv_vision_tap*)malloc(sizeof(tv_vision_tap) * (size_t)(j->bins * sy * sx));
  if (taps == NULL) {
    return TV_ERROR_OUT_OF_MEMORY;
  }
  tv_vision_tap* tap = taps;
  for (int64_t ph = 0; ph < j->pooled_h; ph++)
    for (int64_t pw = 0; pw < j->pooled_w; pw++)
      for (int64_t iy = 0; iy < sy; iy++)
        for (int64_t ix = 0; ix < sx; ix++)
          *tap++ = tv_vision_bilinear_tap(j->height, j->width, j->pixel_stride,
                                          y1 + ((double)ph + ((double)iy + 0.5) / (double)sy) * bin_h,
                                          x1 + ((double)pw + ((double)ix + 0.5) / (double)sx) * bin_w);
  const int64_t image = n * j->channels * j->height * j->width, out_at = r * j->channels * j->bins;
  switch (j->dtype) {
#define TV_VISION_POOL_CASE(CODE, T, S, F)                                                          \
  case CODE:                                                                                        \
    tv_vision_roi_pool_##S((const T*)j->data + image, j->channel_stride, j->channels, taps, j->bins, sy * sx, \
                           j->mode, (T*)j->out + out_at, j->nhwc ? 1 : j->bins, j->nhwc ? j->channels : 1); \
    break;
    TV_VISION_FLOATS(TV_VISION_POOL_CASE)
#undef TV_VISION_POOL_CASE
    default: break;
  }
  free(taps);
  return 0;
}

static void tv_vision_roi_align_chunk(void* ctx, int64_t chunk) {
  const tv_vision_roi_job* j = (const tv_vision_roi_job*)ctx;
  for (int64_t r = chunk * j->num_rois / j->chunks; r < (chunk + 1) * j->num_rois / j->chunks; r++) {
    const int32_t rc = tv_vision_roi_align_region(j, r);
    if (rc) __atomic_store_n(j->rc, rc, __ATOMIC_RELAXED);
  }
}

/* Each region r (rois[r * roi_stride + roi_first ...]: x1, y1, x2, y2, scaled by spatial_scale, minus
   offset; of batch batches[r * batch_stride]) split into pooled_h x pooled_w bins of sample_ratio^2
   samples (> 0; else ceil(bin size) per axis); each output the average of the bin's samples (mode 0),
   their maximum (1), or the maximum of their weighted corners (2, ONNX's max). min_size: a region
   smaller than 1 is taken as 1. data (N, C, H, W), or (N, H, W, C) when nhwc; out (R, C, PH, PW), or
   (R, PH, PW, C). A batch index outside the data or a coordinate that is not finite: TV_ERROR_INDEX. */
__attribute__((unused)) static int32_t tv_roi_align(const void* data, int64_t dtype, int64_t nhwc, int64_t batch,
                                                    int64_t channels, int64_t height, int64_t width, const void* rois,
                                                    int64_t rois_dtype, int64_t num_rois, int64_t roi_stride,
                                                    int64_t roi_first, const void* batches, int64_t batches_dtype,
                                                    int64_t batch_stride, int64_t pooled_h, int64_t pooled_w,
                                                    int64_t spatial_scale_bits, int64_t offset_bits, int64_t min_size,
                                                    int64_t sample_ratio, int64_t mode, void* out) {
  switch (dtype) {
#define TV_VISION_FLOAT_CASE(CODE, T, S, F) case CODE:
    TV_VISION_FLOATS(TV_VISION_FLOAT_CASE)
#undef TV_VISION_FLOAT_CASE
    break;
    default: return TV_ERROR_DTYPE;
  }
  if (!tv_vision_known_dtype(rois_dtype) || !tv_vision_known_dtype(batches_dtype)) return TV_ERROR_DTYPE;
  const double scale = tv_vision_double(spatial_scale_bits), offset = tv_vision_double(offset_bits);
  const int64_t pixel_stride = nhwc ? channels : 1, channel_stride = nhwc ? 1 : height * width;
  const int64_t bins = pooled_h * pooled_w;
  const int threads = num_rois > 1 && num_rois * channels * bins > 4096 ? tv_lib_threads() : 1;
  int32_t rc = 0;
  tv_vision_roi_job job = {data, rois, batches, out, &rc, dtype, nhwc, batch, channels, height, width, rois_dtype,
                           roi_stride, roi_first, batches_dtype, batch_stride, pooled_h, pooled_w, min_size,
                           sample_ratio, mode, pixel_stride, channel_stride, bins, num_rois,
                           tv_lib_chunks(num_rois, channels * bins, threads), scale, offset};
  tv_lib_run(job.chunks, threads, tv_vision_roi_align_chunk, &job);
  return rc;
}

/* ---- sparse_fill_empty_rows --------------------------------------------------------------------- */

/* The sparse entries (indices (n, ndim), first column ascending in [0, rows)) with an entry
   (row, 0, ..., 0) = default_value inserted for each row that has none, in row order; empty_rows[row]
   tells which. The output has `total` entries (n plus the empty rows: TV_ERROR_SIZE otherwise). */
__attribute__((unused)) static int32_t tv_sparse_fill_empty_rows(const void* indices, int64_t indices_dtype,
                                                                 int64_t n, int64_t ndim, const void* values,
                                                                 int64_t values_dtype, const void* default_value,
                                                                 int64_t rows, int64_t total, void* new_indices,
                                                                 void* new_values, bool* empty_rows) {
  const int64_t itemsize = tv_lib_itemsize(values_dtype);
  if (!tv_vision_known_dtype(indices_dtype) || itemsize == 0) return TV_ERROR_DTYPE;
  int64_t previous = 0;
  for (int64_t i = 0; i < n; i++) {
    const int64_t row = tv_lib_load_int(indices, i * ndim, indices_dtype);
    if (row < previous || row >= rows) return TV_ERROR_INDEX;
    previous = row;
  }
  int64_t out = 0, i = 0;
  for (int64_t row = 0; row < rows; row++) {
    empty_rows[row] = i >= n || tv_lib_load_int(indices, i * ndim, indices_dtype) != row;
    if (empty_rows[row]) {
      if (out >= total) return TV_ERROR_SIZE;
      for (int64_t k = 0; k < ndim; k++) tv_lib_store_int(new_indices, out * ndim + k, k ? 0 : row, indices_dtype);
      memcpy((char*)new_values + out * itemsize, default_value, (size_t)itemsize);
      out++;
    }
    for (; i < n && tv_lib_load_int(indices, i * ndim, indices_dtype) == row; i++, out++) {
      if (out >= total) return TV_ERROR_SIZE;
      for (int64_t k = 0; k < ndim; k++)
        tv_lib_store_int(new_indices, out * ndim + k, tv_lib_load_int(indices, i * ndim + k, indices_dtype),
                         indices_dtype);
      memcpy((char*)new_values + out * itemsize, (const char*)values + i * itemsize, (size_t)itemsize);
    }
  }
  return out == total ? 0 : TV_ERROR_SIZE;
}
