"""Object detection and sparse rows: Relay's ``vision.get_valid_counts``, ``vision.non_max_suppression``,
``vision.all_class_non_max_suppression``, ``vision.roi_align`` and ``sparse_fill_empty_rows``; ONNX's
RoiAlign as ``vision.onnx_roi_align`` (ONNX's NonMaxSuppression lowers onto the all-class NMS).

Sorting and greedy selection have no tensor expression: each op names a C function of
``tensorvm/codegen/lib/vision.c`` (``LibraryKernel``) and has a NumPy reference kernel. The NMS ops
return Relay's fixed-size outputs (padded) plus counts; only ``sparse_fill_empty_rows`` has an output size
that depends on the data (its shape function counts the rows present, one pass over the first column).

Boxes are corners ``(x1, y1, x2, y2)`` (or ``(y1, x1, y2, x2)``: the IoU is the same), each pair in
either order. Scores sort descending and stably (ties keep the earlier box first; NaN last).
"""

from __future__ import annotations

import math
import struct

import numpy as np

from ..errors import ShapeError, TypeInferenceError
from ..ir.types import Any, TensorType, TupleType
from ..te.expr import eq
from ._common import (
    FLOAT_DTYPES,
    INT_DTYPES,
    expect_dtype,
    expect_tensor,
    one_of,
    register_checked,
    to_bool,
    to_float,
    to_int,
    to_int_tuple,
)
from ._library import dtype_code, product, same_dims
from .registry import AttrDef, LibraryKernel, OpDef, OpPattern
from .shape_logic import const_int, count_row_starts, is_sym, require, traceable
from .transform import define, fmt_shape, mul_dims

_SOURCE = "vision.c"


def _float_bits(value: float) -> int:
    """A float attribute as the C function receives it: the int64 holding its IEEE-754 bits."""
    return struct.unpack("<q", struct.pack("<d", float(value)))[0]


def _single(op: str, ty, what: str, dtypes: tuple) -> TensorType:
    """A one-element argument (0-d, or 1-d of length 1) of one of ``dtypes``."""
    ty = expect_tensor(op, ty, what)
    expect_dtype(op, ty, dtypes, what)
    if ty.ndim > 1 or ty.ndim == 1 and isinstance(ty.shape[0], int) and ty.shape[0] != 1:
        raise TypeInferenceError(f"{op}: {what} must be a scalar or a 1-element tensor, got {fmt_shape(ty.shape)}")
    return ty


def _one_value(op: str, buffers, names) -> list:
    """Entry checks that each of ``buffers`` (named ``names``) holds one value (what the C function reads)."""
    return [(eq(product(b.shape), 1), f"{op}: {what} must hold one value") for b, what in zip(buffers, names, strict=True)]


def _value(op: str, arr, what: str, kind=float):
    arr = np.asarray(arr)
    if arr.size != 1:
        raise ShapeError(f"{op}: {what} must hold one value, got shape {arr.shape}")
    return kind(arr.reshape(-1)[0])


def _check_index(op: str, attrs, names, elems, error):
    """The attributes ``names`` (element positions; negative: none, except for the ones required) fit
    rows of ``elems`` elements (a dim of any kind: a typed unknown one passes)."""
    for name, span, required in names:
        value = attrs[name]
        if required and value < 0:
            raise error(f"{op}: {name}={value} does not fit boxes of {elems} elements")
        if const_int(elems) or is_sym(elems):
            require(value + span <= elems, f"{op}: {name}={value} does not fit boxes of {elems} elements", error)


def _dims_match(pairs, message: str, error) -> None:
    """Each ``(got, want)`` pair of dims is equal: checked when both are known or one is symbolic (a typed
    unknown dim passes; the shape function checks it at run time)."""
    for got, want in pairs:
        if is_sym(got) or is_sym(want) or (const_int(got) and const_int(want)):
            require(got == want, message, error)


def _one_element(op: str, shape, what: str, error) -> None:
    """A scalar or a 1-element vector (what ``_value`` and the C functions read)."""
    if len(shape) > 1:
        raise error(f"{op}: {what} must be a scalar or a 1-element tensor, got {fmt_shape(shape)}")
    _dims_match(zip(shape, (1,)), f"{op}: {what} must hold one value, got shape {fmt_shape(shape)}", error)


def _expect_rank(op: str, ty, rank: int, what: str, dtypes: tuple) -> TensorType:
    ty = expect_tensor(op, ty, what)
    expect_dtype(op, ty, dtypes, what)
    if ty.ndim != rank:
        raise TypeInferenceError(f"{op}: {what} must have rank {rank}, got {fmt_shape(ty.shape)}")
    return ty


def _iou(a, b) -> float:
    """Intersection over union of two corner boxes (each pair of corners in either order)."""
    al, ar, at, ab = min(a[0], a[2]), max(a[0], a[2]), min(a[1], a[3]), max(a[1], a[3])
    bl, br, bt, bb = min(b[0], b[2]), max(b[0], b[2]), min(b[1], b[3]), max(b[1], b[3])
    inter = max(0.0, min(ar, br) - max(al, bl)) * max(0.0, min(ab, bb) - max(at, bt))
    union = (ar - al) * (ab - at) + (br - bl) * (bb - bt) - inter
    return inter / union if union > 0 else 0.0


def _by_score(scores) -> np.ndarray:
    """Positions by descending score, stably, NaN last."""
    return np.argsort(-np.asarray(scores, np.float64), kind="stable")  # (NumPy sorts NaN last)


# ---- get_valid_counts -----------------------------------------------------------------------------

_GVC = "vision.get_valid_counts"
_GVC_INDICES = (("score_index", 1, True), ("id_index", 1, False))


@traceable
def _get_valid_counts_logic(op, attrs, args, err) -> list:
    data, threshold = args
    if len(data) != 3:
        raise err(f"{op}: data must have rank 3, got {fmt_shape(data)}")
    _check_index(op, attrs, _GVC_INDICES, data[2], err)
    _one_element(op, threshold, "score_threshold", err)
    return [data[:1], tuple(data), data[:2]]


def _get_valid_counts_rel(types, attrs, consts=None):
    data = _expect_rank(_GVC, types[0], 3, "data", FLOAT_DTYPES)
    threshold = _single(_GVC, types[1], "score_threshold", FLOAT_DTYPES + INT_DTYPES)
    counts, out, indices = _get_valid_counts_logic(_GVC, attrs, [data.shape, threshold.shape], TypeInferenceError)
    return TupleType([TensorType(counts, "int32"), TensorType(out, data.dtype), TensorType(indices, "int32")])


def _get_valid_counts_kernel(attrs, data, score_threshold):
    _get_valid_counts_logic(_GVC, attrs, [data.shape, np.shape(score_threshold)], ShapeError)
    limit = _value(_GVC, score_threshold, "score_threshold")
    batch, anchors, _ = data.shape
    counts = np.zeros(batch, "int32")
    out, out_indices = np.full_like(data, -1), np.full((batch, anchors), -1, "int32")
    for b in range(batch):
        valid = data[b, :, attrs.score_index].astype(np.float64) > limit  # (in double, as the C function)
        if attrs.id_index >= 0:
            valid &= data[b, :, attrs.id_index] >= 0
        (positions,) = np.nonzero(valid)
        counts[b] = len(positions)
        out[b, :len(positions)] = data[b, positions]
        out_indices[b, :len(positions)] = positions
    return counts, out, out_indices


def _get_valid_counts_arguments(attrs, inputs, outputs):
    (data, threshold), (counts, out, out_indices) = inputs, outputs
    batch, anchors, elems = data.shape
    requires = _one_value(_GVC, [threshold], ["score_threshold"])
    return [data, dtype_code(data.dtype), batch, anchors, elems, threshold, dtype_code(threshold.dtype),
            attrs.id_index, attrs.score_index, counts, out, out_indices], requires


register_checked(OpDef(
    name=_GVC, num_inputs=2, type_rel=_get_valid_counts_rel, kernel=_get_valid_counts_kernel,
    pattern=OpPattern.OPAQUE,
    attrs=(AttrDef("id_index", 0, to_int, "the class id's position in a box row (-1: none)"),
           AttrDef("score_index", 1, to_int, "the score's position in a box row")),
    shape_logic=_get_valid_counts_logic,
    library=LibraryKernel("tv_get_valid_counts", _SOURCE, _get_valid_counts_arguments),
    doc="get_valid_counts(data (B, A, E), score_threshold): (valid_count (B,) int32, out, out_indices (B, A) "
        "int32): per batch the boxes whose score exceeds the threshold and whose class id (id_index >= 0) is not "
        "negative, moved to the top in order with their positions; the rest of out and out_indices is -1.",
))

# ---- non_max_suppression (Relay) ------------------------------------------------------------------

_NMS = "vision.non_max_suppression"
_NMS_INDICES = (("coord_start", 4, True), ("score_index", 1, True), ("id_index", 1, False))


def _nms_rel(types, attrs, consts=None):
    data = _expect_rank(_NMS, types[0], 3, "data", FLOAT_DTYPES)
    _expect_rank(_NMS, types[1], 1, "valid_count", INT_DTYPES)
    # (without return_indices, indices is not read: any tensor, as in Relay)
    if attrs.return_indices:
        _expect_rank(_NMS, types[2], 2, "indices", INT_DTYPES)
    _single(_NMS, types[3], "max_output_size", INT_DTYPES)
    _single(_NMS, types[4], "iou_threshold", FLOAT_DTYPES)
    shapes = _nms_logic(_NMS, attrs, [t.shape for t in types], TypeInferenceError)
    if attrs.return_indices:
        return TupleType([TensorType(s, "int32") for s in shapes])
    return TensorType(shapes[0], data.dtype)


@traceable
def _nms_logic(op, attrs, args, err) -> list:
    """Relay's fixed-size outputs: (B, A) kept indices padded with -1 and (B, 1) counts, or the (B, A, E)
    rows; what the suppression keeps changes their contents, not their shapes."""
    data, valid_count, indices = (tuple(a) for a in args[:3])
    message = (f"{op}: expected data (B, A, E), valid_count (B,), indices (B, A), got {fmt_shape(data)}, "
               f"{fmt_shape(valid_count)}, {fmt_shape(indices)}")
    if len(data) != 3 or len(valid_count) != 1 or attrs.return_indices and len(indices) != 2:
        raise err(message)
    _dims_match(zip(valid_count + (indices if attrs.return_indices else ()), data[:1] + data[:2]), message, err)
    _check_index(op, attrs, _NMS_INDICES, data[2], err)
    _one_element(op, args[3], "max_output_size", err)
    _one_element(op, args[4], "iou_threshold", err)
    return [data[:2], (data[0], 1)] if attrs.return_indices else [data]


def _nms_kernel(attrs, data, valid_count, indices, max_output_size, iou_threshold):
    _nms_logic(_NMS, attrs, [np.shape(a) for a in (data, valid_count, indices, max_output_size, iou_threshold)],
               ShapeError)
    max_out = _value(_NMS, max_output_size, "max_output_size", int)
    threshold = _value(_NMS, iou_threshold, "iou_threshold")
    batch, anchors, _ = data.shape
    rows, coords = data.astype(np.float64), slice(attrs.coord_start, attrs.coord_start + 4)
    box_indices, counts = np.full((batch, anchors), -1, "int32"), np.zeros((batch, 1), "int32")
    out = np.full_like(data, -1)
    for b in range(batch):
        n = min(max(int(valid_count[b]), 0), anchors)
        order = _by_score(rows[b, :n, attrs.score_index])
        if attrs.top_k > 0:
            order = order[:attrs.top_k]
        kept = []
        for slot, j in enumerate(order):
            same = [k for k in kept if attrs.force_suppress or attrs.id_index < 0
                    or rows[b, k, attrs.id_index] == rows[b, j, attrs.id_index]]
            keep = (max_out < 0 or len(kept) < max_out) and all(
                _iou(rows[b, k, coords], rows[b, j, coords]) < threshold for k in same)
            kept += [j] if keep else []
            if keep and not attrs.return_indices:  # (a suppressed row stays -1)
                out[b, len(kept) - 1 if attrs.invalid_to_bottom else slot] = data[b, j]
        if attrs.return_indices:
            box_indices[b, :len(kept)] = indices[b, kept]
            counts[b, 0] = len(kept)
    return (box_indices, counts) if attrs.return_indices else out


def _nms_arguments(attrs, inputs, outputs):
    data, valid_count, indices, max_out, iou = inputs
    batch, anchors, elems = data.shape
    requires = same_dims(_NMS, valid_count.shape, (batch,), "valid_count's")
    if attrs.return_indices:
        requires += same_dims(_NMS, indices.shape, (batch, anchors), "indices'")
    requires += _one_value(_NMS, [max_out, iou], ["max_output_size", "iou_threshold"])
    args = [data, dtype_code(data.dtype), batch, anchors, elems, valid_count, dtype_code(valid_count.dtype), indices,
            dtype_code(indices.dtype), max_out, dtype_code(max_out.dtype), iou, dtype_code(iou.dtype),
            attrs.force_suppress, attrs.top_k, attrs.coord_start, attrs.score_index, attrs.id_index]
    if attrs.return_indices:
        return args + list(outputs), requires
    return args + [attrs.invalid_to_bottom, outputs[0]], requires


register_checked(OpDef(
    name=_NMS, num_inputs=5, type_rel=_nms_rel, kernel=_nms_kernel, pattern=OpPattern.OPAQUE,
    attrs=(AttrDef("force_suppress", False, to_bool, "suppress across classes"),
           AttrDef("top_k", -1, to_int, "keep the best top_k boxes before the suppression (<= 0: all)"),
           AttrDef("coord_start", 2, to_int), AttrDef("score_index", 1, to_int),
           AttrDef("id_index", 0, to_int, "the class id's position (-1: one class)"),
           AttrDef("return_indices", True, to_bool), AttrDef("invalid_to_bottom", False, to_bool)),
    shape_logic=_nms_logic,
    library=LibraryKernel(lambda attrs: "tv_nms_indices" if attrs.return_indices else "tv_nms_boxes", _SOURCE,
                          _nms_arguments),
    doc="non_max_suppression(data (B, A, E), valid_count (B,), indices (B, A), max_output_size, iou_threshold): "
        "per batch the first valid_count boxes by descending score, the best top_k (> 0) of them, each kept "
        "unless max_output_size (>= 0) are kept already or a kept box of its class overlaps it with "
        "IoU >= iou_threshold. return_indices: (the kept boxes' ``indices`` entries at the top, -1 after; "
        "(B, 1) counts), int32; else the sorted rows with suppressed ones -1 (invalid_to_bottom: kept rows "
        "first).",
))

# ---- all_class_non_max_suppression ----------------------------------------------------------------

_ACNMS = "vision.all_class_non_max_suppression"


def _all_class_nms_rel(types, attrs, consts=None):
    _expect_rank(_ACNMS, types[0], 3, "boxes", FLOAT_DTYPES)
    scores = _expect_rank(_ACNMS, types[1], 3, "scores", FLOAT_DTYPES)
    _single(_ACNMS, types[2], "max_output_boxes_per_class", INT_DTYPES)
    _single(_ACNMS, types[3], "iou_threshold", FLOAT_DTYPES)
    _single(_ACNMS, types[4], "score_threshold", FLOAT_DTYPES)
    shapes = _all_class_nms_logic(_ACNMS, attrs, [t.shape for t in types], TypeInferenceError)
    dtypes = ("int64", "int64") if attrs.output_format == "onnx" else ("int64", scores.dtype, "int64")
    return TupleType([TensorType(s, d) for s, d in zip(shapes, dtypes, strict=True)])


@traceable
def _all_class_nms_logic(op, attrs, args, err) -> list:
    """Outputs padded to every (batch, class, box) triple (onnx) or every (class, box) pair per batch
    (tensorflow), with counts: what the suppression selects changes their contents, not their shapes."""
    boxes, scores = tuple(args[0]), tuple(args[1])
    message = f"{op}: expected boxes (B, N, 4) and scores (B, C, N), got {fmt_shape(boxes)} and {fmt_shape(scores)}"
    if len(boxes) != 3 or len(scores) != 3:
        raise err(message)
    batch, num_boxes, four = boxes
    _dims_match([(four, 4)], message, err)
    _dims_match([(scores[0], batch), (scores[2], num_boxes)],
                f"{op}: scores {fmt_shape(scores)} do not match boxes {fmt_shape(boxes)}", err)
    for shape, what in zip(args[2:], ("max_output_boxes_per_class", "iou_threshold", "score_threshold")):
        _one_element(op, shape, what, err)
    per_batch = mul_dims(scores[1], num_boxes)
    if attrs.output_format == "onnx":
        return [(mul_dims(batch, per_batch), 3), (1,)]
    return [(batch, per_batch, 2), (batch, per_batch), (batch,)]


def _all_class_nms_kernel(attrs, boxes, scores, max_output, iou_threshold, score_threshold):
    _all_class_nms_logic(_ACNMS, attrs, [np.shape(a) for a in (boxes, scores, max_output, iou_threshold,
                                                                score_threshold)], ShapeError)
    max_out = _value(_ACNMS, max_output, "max_output_boxes_per_class", int)
    iou_limit = _value(_ACNMS, iou_threshold, "iou_threshold")
    score_limit = _value(_ACNMS, score_threshold, "score_threshold")
    batch, classes, num_boxes = scores.shape
    boxes = boxes.astype(np.float64)  # (the IoU in double, as the C function)
    selected = [[] for _ in range(batch)]  # per batch: (score, class, box) in class order
    for b, c in np.ndindex(batch, classes):
        s = scores[b, c].astype(np.float64)
        kept = []
        for i in _by_score(s):
            if not s[i] > score_limit or 0 <= max_out <= len(kept):
                continue
            if all(_iou(boxes[b, k], boxes[b, i]) <= iou_limit for k in kept):
                kept.append(i)
        selected[b] += [(s[i], c, i) for i in kept]
    if attrs.output_format == "onnx":
        rows = [(b, c, i) for b in range(batch) for _, c, i in selected[b]]
        indices = np.zeros((batch * classes * num_boxes, 3), np.int64)
        indices[:len(rows)] = np.array(rows, np.int64).reshape(-1, 3)
        return indices, np.array([len(rows)], np.int64)
    per_batch = classes * num_boxes
    indices, out_scores = np.zeros((batch, per_batch, 2), np.int64), np.zeros((batch, per_batch), scores.dtype)
    counts = np.zeros(batch, np.int64)
    for b, chosen in enumerate(selected):
        chosen = [chosen[k] for k in _by_score([s for s, _, _ in chosen])]
        counts[b] = len(chosen)
        indices[b, :len(chosen)] = np.array([(c, i) for _, c, i in chosen], np.int64).reshape(-1, 2)
        out_scores[b, :len(chosen)] = [s for s, _, _ in chosen]
    return indices, out_scores, counts


def _all_class_nms_arguments(attrs, inputs, outputs):
    boxes, scores, max_out, iou, score_threshold = inputs
    batch, num_boxes, four = boxes.shape
    requires = same_dims(_ACNMS, (scores.shape[0], scores.shape[2], four), (batch, num_boxes, 4),
                         "scores' (batch, box) and boxes' last")
    requires += _one_value(_ACNMS, inputs[2:], ["max_output_boxes_per_class", "iou_threshold", "score_threshold"])
    args = [boxes, dtype_code(boxes.dtype), scores, dtype_code(scores.dtype), batch, scores.shape[1], num_boxes,
            max_out, dtype_code(max_out.dtype), iou, dtype_code(iou.dtype), score_threshold,
            dtype_code(score_threshold.dtype)]
    return args + list(outputs), requires


register_checked(OpDef(
    name=_ACNMS, num_inputs=5, type_rel=_all_class_nms_rel, kernel=_all_class_nms_kernel, pattern=OpPattern.OPAQUE,
    attrs=(AttrDef("output_format", "onnx", one_of("onnx", "tensorflow")),),
    shape_logic=_all_class_nms_logic,
    library=LibraryKernel(lambda attrs: "tv_all_class_nms_onnx" if attrs.output_format == "onnx"
                          else "tv_all_class_nms_tf", _SOURCE, _all_class_nms_arguments),
    doc="all_class_non_max_suppression(boxes (B, N, 4), scores (B, C, N), max_output_boxes_per_class, "
        "iou_threshold, score_threshold): per batch and class, the boxes scoring above score_threshold by "
        "descending score, each kept unless max_output_boxes_per_class (>= 0) are kept already or a kept one "
        "overlaps it with IoU > iou_threshold. onnx: (rows (batch, class, box) int64 in that order then zero "
        "rows, (1,) count); tensorflow: per batch (rows (class, box) by descending score, their scores, "
        "(B,) counts), zero-padded.",
))

# ---- roi_align ------------------------------------------------------------------------------------


def _bilinear(feature, y, x):
    """Bilinear samples of a (C, H, W) map at points (y, x) (arrays of one shape); 0 outside."""
    c, h, w = feature.shape
    valid = (y >= -1.0) & (y <= h) & (x >= -1.0) & (x <= w)
    y = np.clip(y, 0, None)
    x = np.clip(x, 0, None)
    y0 = np.minimum(np.floor(y).astype(np.int64), h - 1)
    x0 = np.minimum(np.floor(x).astype(np.int64), w - 1)
    y1 = np.minimum(y0 + 1, h - 1)
    x1 = np.minimum(x0 + 1, w - 1)
    y = np.where(y0 >= h - 1, y0.astype(y.dtype), y)
    x = np.where(x0 >= w - 1, x0.astype(x.dtype), x)
    ly, lx = y - y0, x - x0
    hy, hx = 1 - ly, 1 - lx
    parts = [(hy * hx, y0, x0), (hy * lx, y0, x1), (ly * hx, y1, x0), (ly * lx, y1, x1)]
    return [np.where(valid, wgt, 0.0)[None] * feature[:, yy, xx] for wgt, yy, xx in parts]


def _roi_align_reference(x, corners, batch_indices, pooled, scale, offset, min_size, ratio, mode):
    """ROI align of NCHW ``x`` over regions ``corners`` (R, 4: x1, y1, x2, y2) of batches
    ``batch_indices``: mode ``avg``, ``max`` (of the interpolated samples) or ``corner_max`` (ONNX's: of
    the weighted corners)."""
    oh, ow = pooled
    out = np.zeros((len(corners), x.shape[1], oh, ow), dtype=np.float64)
    for r, box in enumerate(np.asarray(corners, np.float64)):
        if not 0 <= batch_indices[r] < x.shape[0]:
            raise ShapeError(f"roi_align: region {r}'s batch index {batch_indices[r]} is outside [0, {x.shape[0]})")
        if not np.isfinite(box * scale).all():
            raise ShapeError(f"roi_align: region {r}'s coordinates must be finite, got {box.tolist()}")
        x1, y1, x2, y2 = box * scale - offset
        rw, rh = (max(x2 - x1, 1.0), max(y2 - y1, 1.0)) if min_size else (x2 - x1, y2 - y1)
        bin_h, bin_w = rh / oh, rw / ow
        sy = max(ratio if ratio > 0 else int(math.ceil(bin_h)), 1)
        sx = max(ratio if ratio > 0 else int(math.ceil(bin_w)), 1)
        ys = y1 + (np.arange(oh)[:, None] + (np.arange(sy)[None, :] + 0.5) / sy) * bin_h  # (OH, SY)
        xs = x1 + (np.arange(ow)[:, None] + (np.arange(sx)[None, :] + 0.5) / sx) * bin_w  # (OW, SX)
        yy = np.broadcast_to(ys[:, None, :, None], (oh, ow, sy, sx))
        xx = np.broadcast_to(xs[None, :, None, :], (oh, ow, sy, sx))
        parts = _bilinear(x[int(batch_indices[r])].astype(np.float64), yy, xx)
        if mode == "avg":
            out[r] = sum(parts).mean(axis=(-1, -2))
        else:
            samples = sum(parts) if mode == "max" else np.maximum.reduce(parts)
            out[r] = samples.max(axis=(-1, -2))
    return out.astype(x.dtype)


def _roi_align_call(data, rois, batches, batch_stride, roi_first, nhwc, pooled, scale, offset, min_size, ratio,
                    mode, out):
    """The arguments of ``tv_roi_align``."""
    n, c, h, w = (data.shape[0], data.shape[3], data.shape[1], data.shape[2]) if nhwc else data.shape
    return [data, dtype_code(data.dtype), nhwc, n, c, h, w, rois, dtype_code(rois.dtype), rois.shape[0],
            rois.shape[1], roi_first, batches, dtype_code(batches.dtype), batch_stride, pooled[0], pooled[1],
            _float_bits(scale), _float_bits(offset), min_size, ratio, ("avg", "max", "corner_max").index(mode), out]


_ROI = "vision.roi_align"


def _pair(value) -> tuple:
    return to_int_tuple(value) * (1 if isinstance(value, (list, tuple)) else 2)


@traceable
def _roi_align_logic(op, attrs, args, error):
    data, rois = args
    message = f"{op}: expected data of rank 4 and rois (R, 5), got {fmt_shape(data)} and {fmt_shape(rois)}"
    if len(data) != 4 or len(rois) != 2:
        raise error(message)
    _dims_match([(rois[1], 5)], message, error)
    if len(attrs.pooled_size) != 2 or min(attrs.pooled_size) < 1:
        raise error(f"{_ROI}: pooled_size must be two positive ints, got {attrs.pooled_size}")
    channels = data[1] if attrs.layout == "NCHW" else data[3]
    ph, pw = attrs.pooled_size
    return (rois[0], channels, ph, pw) if attrs.layout == "NCHW" else (rois[0], ph, pw, channels)


def _roi_align_rel(types, attrs, consts=None):
    data = _expect_rank(_ROI, types[0], 4, "data", FLOAT_DTYPES)
    rois = _expect_rank(_ROI, types[1], 2, "rois", FLOAT_DTYPES)
    return TensorType(_roi_align_logic(_ROI, attrs, [data.shape, rois.shape], TypeInferenceError), data.dtype)


def _roi_align_kernel(attrs, data, rois):
    _roi_align_logic(_ROI, attrs, [data.shape, rois.shape], ShapeError)
    nchw = data if attrs.layout == "NCHW" else data.transpose(0, 3, 1, 2)
    batch_indices = np.asarray(rois[:, 0], np.float64)
    out = _roi_align_reference(nchw, rois[:, 1:], np.where(batch_indices >= 0, batch_indices, -1).astype(np.int64),
                               attrs.pooled_size, attrs.spatial_scale, 0.0, True, attrs.sample_ratio, attrs.mode)
    return out if attrs.layout == "NCHW" else out.transpose(0, 2, 3, 1)


def _roi_align_arguments(attrs, inputs, outputs):
    data, rois = inputs
    requires = same_dims(_ROI, rois.shape[1:], (5,), "rois'")
    return _roi_align_call(data, rois, rois, 5, 1, attrs.layout == "NHWC", attrs.pooled_size, attrs.spatial_scale,
                           0.0, True, attrs.sample_ratio, attrs.mode, outputs[0]), requires


register_checked(OpDef(
    name=_ROI, num_inputs=2, type_rel=_roi_align_rel, kernel=_roi_align_kernel, pattern=OpPattern.OPAQUE,
    attrs=(AttrDef("pooled_size", (1, 1), _pair, "(height, width) of each output region (an int: both)"),
           AttrDef("spatial_scale", 1.0, to_float), AttrDef("sample_ratio", -1, to_int, "samples per bin and axis "
                                                                                        "(<= 0: ceil(bin size))"),
           AttrDef("layout", "NCHW", one_of("NCHW", "NHWC")), AttrDef("mode", "avg", one_of("avg", "max"))),
    shape_logic=_roi_align_logic,
    library=LibraryKernel("tv_roi_align", _SOURCE, _roi_align_arguments),
    doc="roi_align(data, rois (R, 5): batch index, x1, y1, x2, y2): per region (scaled by spatial_scale, at "
        "least 1 x 1) and output bin of pooled_size, the average (or max) of bilinear samples (0 outside); "
        "output (R, C, PH, PW), or (R, PH, PW, C) for layout NHWC.",
))

# ---- onnx_roi_align -------------------------------------------------------------------------------


def _onnx_roi_align_kernel(attrs, x, rois, batch_indices):
    _onnx_roi_align_logic("vision.onnx_roi_align", attrs, [np.shape(a) for a in (x, rois, batch_indices)], ShapeError)
    offset = 0.5 if attrs.coordinate_transformation_mode == "half_pixel" else 0.0
    return _roi_align_reference(x, rois, np.asarray(batch_indices).astype(np.int64),
                                (attrs.output_height, attrs.output_width), attrs.spatial_scale, offset,
                                attrs.coordinate_transformation_mode == "output_half_pixel", attrs.sampling_ratio,
                                "avg" if attrs.mode == "avg" else "corner_max")


@traceable
def _onnx_roi_align_logic(op, attrs, shapes, err):
    x, rois, idx = shapes
    message = (f"{op}: expected X (N, C, H, W), rois (R, 4), batch_indices (R,), got {fmt_shape(x)}, "
               f"{fmt_shape(rois)}, {fmt_shape(idx)}")
    if len(x) != 4 or len(rois) != 2 or len(idx) != 1:
        raise err(message)
    _dims_match([(rois[1], 4), (idx[0], rois[0])], message, err)
    if attrs.output_height < 1 or attrs.output_width < 1:
        raise err(f"{op}: output_height and output_width must be positive, got {attrs.output_height} and "
                  f"{attrs.output_width}")
    return (rois[0], x[1], attrs.output_height, attrs.output_width)


def _onnx_roi_align_arguments(attrs, inputs, outputs):
    data, rois, batch_indices = inputs
    requires = same_dims("vision.onnx_roi_align", (rois.shape[1], batch_indices.shape[0]), (4, rois.shape[0]),
                         "rois' and batch_indices'")
    offset = 0.5 if attrs.coordinate_transformation_mode == "half_pixel" else 0.0
    return _roi_align_call(data, rois, batch_indices, 1, 0, False, (attrs.output_height, attrs.output_width),
                           attrs.spatial_scale, offset, attrs.coordinate_transformation_mode == "output_half_pixel",
                           attrs.sampling_ratio, "avg" if attrs.mode == "avg" else "corner_max",
                           outputs[0]), requires


define(
    "vision.onnx_roi_align", 3,
    lambda types, attrs, consts=None: TensorType(_onnx_roi_align_logic(
        "vision.onnx_roi_align", attrs, [expect_tensor("vision.onnx_roi_align", t, "argument").shape for t in types],
        TypeInferenceError), types[0].dtype),
    _onnx_roi_align_kernel, OpPattern.OPAQUE,
    attrs=(AttrDef("mode", "avg", one_of("avg", "max")), AttrDef("output_height", 1, to_int),
           AttrDef("output_width", 1, to_int), AttrDef("sampling_ratio", 0, to_int),
           AttrDef("spatial_scale", 1.0, to_float),
           AttrDef("coordinate_transformation_mode", "half_pixel", one_of("half_pixel", "output_half_pixel"))),
    shape_logic=_onnx_roi_align_logic,
    library=LibraryKernel("tv_roi_align", _SOURCE, _onnx_roi_align_arguments),
    doc="ONNX RoiAlign(X, rois (R, 4), batch_indices): average (or max of the weighted corners) of bilinear "
        "samples per output bin of each region; half_pixel shifts the region by -0.5, output_half_pixel makes it "
        "at least 1 x 1.",
)

# ---- sparse_fill_empty_rows -----------------------------------------------------------------------

_SFER = "sparse_fill_empty_rows"


def _sparse_fill_rel(types, attrs, consts=None):
    indices = _expect_rank(_SFER, types[0], 2, "sparse_indices", INT_DTYPES)
    values = _expect_rank(_SFER, types[1], 1, "sparse_values", FLOAT_DTYPES + INT_DTYPES + ("bool",))
    dense_shape = _expect_rank(_SFER, types[2], 1, "dense_shape", INT_DTYPES)
    _single(_SFER, types[3], "default_value", (values.dtype,))
    ndim = indices.shape[1]
    if isinstance(ndim, int) and isinstance(dense_shape.shape[0], int) and ndim != dense_shape.shape[0]:
        raise TypeInferenceError(f"{_SFER}: dense_shape must have one entry per index column ({ndim}), got "
                                 f"{fmt_shape(dense_shape.shape)}")
    shape_const = consts[2] if consts and len(consts) > 2 else None
    rows = int(np.asarray(shape_const).reshape(-1)[0]) if shape_const is not None and np.size(shape_const) else Any()
    return TupleType([TensorType((Any(), ndim), indices.dtype), TensorType((Any(),), values.dtype),
                      TensorType((rows,), "bool")])


def _sparse_rows(indices, dense_shape, error) -> tuple[int, np.ndarray]:
    """The dense row count and the first column, checked (ascending, within the rows)."""
    indices, dense_shape = np.asarray(indices), np.asarray(dense_shape)
    if indices.ndim != 2 or dense_shape.shape != (indices.shape[1],) or indices.shape[1] < 1:
        raise error(f"{_SFER}: expected sparse_indices (N, ndim >= 1) and dense_shape (ndim,), got "
                    f"{fmt_shape(indices.shape)} and {fmt_shape(dense_shape.shape)}")
    rows, first = int(dense_shape[0]), indices[:, 0].astype(np.int64)
    if rows < 0:
        raise error(f"{_SFER}: dense_shape[0] must not be negative, got {rows}")
    if len(first) and (np.any(np.diff(first) < 0) or first[0] < 0 or first[-1] >= rows):
        raise error(f"{_SFER}: the rows of sparse_indices (its first column) must be ascending and in [0, {rows})")
    return rows, first


@traceable
def _sparse_fill_logic(op, attrs, args, err) -> list:
    """The entries plus one per empty row: the distinct rows present are counted in one pass over the
    sorted first column (``count_row_starts``, which also checks it), no fill."""
    indices, values, dense_shape, default = args
    message = (f"{op}: expected sparse_indices (N, ndim >= 1), sparse_values (N,) and dense_shape (ndim,), got "
               f"{fmt_shape(indices.shape)}, {fmt_shape(values)} and {fmt_shape(dense_shape.shape)}")
    if len(indices.shape) != 2 or len(values) != 1 or len(dense_shape.shape) != 1:
        raise err(message)
    n, ndim = indices.shape
    require(ndim >= 1, message, err)
    _dims_match([(values[0], n), (dense_shape.shape[0], ndim)], message, err)
    _one_element(op, default, "default_value", err)
    rows = dense_shape.item(0)
    if rows is None:  # (type inference of data it does not know)
        return [(Any(), ndim), (Any(),), (Any(),)]
    require(rows >= 0, f"{op}: dense_shape[0] must not be negative, got {rows}", err)
    present = count_row_starts(indices, rows)
    require(present >= 0, f"{op}: the rows of sparse_indices (its first column) must be ascending and in "
                          f"[0, {rows})", err)
    total = n + rows - present
    return [(total, ndim), (total,), (rows,)]


def _sparse_fill_kernel(attrs, indices, values, dense_shape, default_value):
    rows, first = _sparse_rows(indices, dense_shape, ShapeError)
    if values.shape != first.shape:
        raise ShapeError(f"{_SFER}: sparse_values must have shape ({len(first)},), got {fmt_shape(values.shape)}")
    empty = np.ones(rows, bool)
    empty[first] = False
    new_indices, new_values = [], []
    for row in range(rows):
        if empty[row]:
            new_indices.append([row] + [0] * (indices.shape[1] - 1))
            new_values.append(_value(_SFER, default_value, "default_value", lambda v: v))
        (at,) = np.nonzero(first == row)
        new_indices += indices[at].tolist()
        new_values += values[at].tolist()
    return (np.array(new_indices, indices.dtype).reshape(-1, indices.shape[1]), np.array(new_values, values.dtype),
            empty)


def _sparse_fill_arguments(attrs, inputs, outputs):
    indices, values, dense_shape, default_value = inputs
    new_indices, new_values, empty = outputs
    n, ndim = indices.shape
    requires = same_dims(_SFER, values.shape, (n,), "sparse_values'")
    requires += same_dims(_SFER, dense_shape.shape, (ndim,), "dense_shape's")
    requires += same_dims(_SFER, new_values.shape, new_indices.shape[:1], "new values'")
    requires += _one_value(_SFER, [default_value], ["default_value"])
    return [indices, dtype_code(indices.dtype), n, ndim, values, dtype_code(values.dtype), default_value,
            empty.shape[0], new_indices.shape[0], new_indices, new_values, empty], requires


register_checked(OpDef(
    name=_SFER, num_inputs=4, type_rel=_sparse_fill_rel, kernel=_sparse_fill_kernel, pattern=OpPattern.OPAQUE,
    shape_logic=_sparse_fill_logic, shape_func_data_dependent=(True, False, True, False),
    library=LibraryKernel("tv_sparse_fill_empty_rows", _SOURCE, _sparse_fill_arguments),
    doc="sparse_fill_empty_rows(sparse_indices (N, ndim), sparse_values (N,), dense_shape (ndim,), default_value): "
        "(new_sparse_indices, new_sparse_values, empty_row_indicator (dense_shape[0],) bool): the entries (rows, "
        "the first index column, ascending) with an entry (row, 0, ...) = default_value inserted for each empty "
        "row, in row order.",
))
