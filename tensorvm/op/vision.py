"""Object-detection ops: ONNX's NonMaxSuppression and RoiAlign."""

from __future__ import annotations

import math

import numpy as np

from ..errors import ShapeError, TypeInferenceError
from ..ir.types import Any, TensorType
from ._common import expect_tensor
from .registry import AttrDef, OpPattern
from .transform import concrete, define, fmt_shape, one_of, to_bool, to_float, to_int

_FLOATS = ("float16", "float32", "float64")


# ---------------------------------------------------------------------------------------------------
# vision.non_max_suppression (ONNX semantics), vision.roi_align


def _scalar(arr, default, kind=float):
    arr = np.asarray(arr)
    return kind(arr.reshape(-1)[0]) if arr.size else default


def _nms_select(attrs, boxes, scores, max_out, iou_threshold, score_threshold):
    boxes, scores = np.asarray(boxes, dtype=np.float64), np.asarray(scores, dtype=np.float64)
    if boxes.ndim != 3 or boxes.shape[2] != 4 or scores.ndim != 3 or scores.shape[0] != boxes.shape[0] \
            or scores.shape[2] != boxes.shape[1]:
        raise ShapeError(f"vision.non_max_suppression: boxes must be (N, B, 4) and scores (N, C, B), got "
                         f"{boxes.shape} and {scores.shape}")
    max_out = _scalar(max_out, 0, int)
    iou_threshold = _scalar(iou_threshold, 0.0)
    score_threshold = _scalar(score_threshold, None)
    if attrs.center_point_box:
        cx, cy, w, h = np.moveaxis(boxes, 2, 0)
        x1, x2, y1, y2 = cx - w / 2, cx + w / 2, cy - h / 2, cy + h / 2
    else:
        y1, x1, y2, x2 = np.moveaxis(boxes, 2, 0)
        y1, y2 = np.minimum(y1, y2), np.maximum(y1, y2)
        x1, x2 = np.minimum(x1, x2), np.maximum(x1, x2)
    area = (x2 - x1) * (y2 - y1)
    selected = []
    if max_out <= 0:
        return np.zeros((0, 3), np.int64)
    for n in range(boxes.shape[0]):
        for c in range(scores.shape[1]):
            s = scores[n, c]
            candidates = np.argsort(-s, kind="stable")
            if score_threshold is not None:
                candidates = candidates[s[candidates] > score_threshold]
            kept = []
            for b in candidates:
                if len(kept) >= max_out:
                    break
                ok = True
                for k in kept:
                    ix = max(0.0, min(x2[n, b], x2[n, k]) - max(x1[n, b], x1[n, k]))
                    iy = max(0.0, min(y2[n, b], y2[n, k]) - max(y1[n, b], y1[n, k]))
                    inter = ix * iy
                    union = area[n, b] + area[n, k] - inter
                    if union > 0 and inter / union > iou_threshold:
                        ok = False
                        break
                if ok:
                    kept.append(b)
            selected.extend((n, c, b) for b in kept)
    return np.array(selected, dtype=np.int64).reshape(-1, 3)


def _nms_rel(types, attrs, consts=None):
    boxes = expect_tensor("vision.non_max_suppression", types[0], "boxes")
    if boxes.dtype not in _FLOATS:
        raise TypeInferenceError(f"vision.non_max_suppression: boxes must be float, got {boxes.dtype}")
    return TensorType((Any(), 3), "int64")


define(
    "vision.non_max_suppression", 5, _nms_rel, _nms_select, OpPattern.OPAQUE,
    attrs=(AttrDef("center_point_box", False, to_bool),),
    shape_func=lambda attrs, args: [_nms_select(attrs, *args).shape], data_dependent=True,
    doc="ONNX NonMaxSuppression(boxes, scores, max_output_boxes_per_class, iou_threshold, score_threshold): "
        "(selected, 3) rows of (batch, class, box); empty 1-d tensors stand for omitted inputs.",
)


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


def _roi_align_kernel(attrs, x, rois, batch_indices):
    x, rois = np.asarray(x), np.asarray(rois, dtype=np.float64)
    batch_indices = np.asarray(batch_indices).astype(np.int64)
    n, c, h, w = x.shape
    oh, ow = attrs.output_height, attrs.output_width
    out = np.zeros((rois.shape[0], c, oh, ow), dtype=np.float64)
    offset = 0.5 if attrs.coordinate_transformation_mode == "half_pixel" else 0.0
    for r in range(rois.shape[0]):
        x1, y1, x2, y2 = rois[r] * attrs.spatial_scale - offset
        rw, rh = x2 - x1, y2 - y1
        if attrs.coordinate_transformation_mode == "output_half_pixel":
            rw, rh = max(rw, 1.0), max(rh, 1.0)
        bin_h, bin_w = rh / oh, rw / ow
        sy = attrs.sampling_ratio if attrs.sampling_ratio > 0 else int(math.ceil(rh / oh))
        sx = attrs.sampling_ratio if attrs.sampling_ratio > 0 else int(math.ceil(rw / ow))
        sy, sx = max(sy, 1), max(sx, 1)
        iy = (np.arange(sy) + 0.5) / sy
        ix = (np.arange(sx) + 0.5) / sx
        ys = y1 + (np.arange(oh)[:, None] + iy[None, :]) * bin_h  # (OH, SY)
        xs = x1 + (np.arange(ow)[:, None] + ix[None, :]) * bin_w  # (OW, SX)
        yy = np.broadcast_to(ys[:, None, :, None], (oh, ow, sy, sx))
        xx = np.broadcast_to(xs[None, :, None, :], (oh, ow, sy, sx))
        parts = _bilinear(x[batch_indices[r]].astype(np.float64), yy, xx)
        if attrs.mode == "avg":
            out[r] = sum(parts).mean(axis=(-1, -2))
        else:
            out[r] = np.max(np.maximum.reduce(parts), axis=(-1, -2))
    return out.astype(x.dtype)


def _roi_align_logic(op, attrs, shapes, err):
    x, rois, idx = shapes
    if len(x) != 4 or len(rois) != 2 or len(idx) != 1:
        raise err(f"{op}: expected X (N, C, H, W), rois (R, 4), batch_indices (R,), got {fmt_shape(x)}, "
                  f"{fmt_shape(rois)}, {fmt_shape(idx)}")
    return (rois[0], x[1], attrs.output_height, attrs.output_width)


define(
    "vision.roi_align", 3,
    lambda types, attrs, consts=None: TensorType(_roi_align_logic(
        "vision.roi_align", attrs, [expect_tensor("vision.roi_align", t, "argument").shape for t in types],
        TypeInferenceError), types[0].dtype),
    _roi_align_kernel, OpPattern.OPAQUE,
    attrs=(AttrDef("mode", "avg", one_of("avg", "max")), AttrDef("output_height", 1, to_int),
           AttrDef("output_width", 1, to_int), AttrDef("sampling_ratio", 0, to_int),
           AttrDef("spatial_scale", 1.0, to_float),
           AttrDef("coordinate_transformation_mode", "half_pixel", one_of("half_pixel", "output_half_pixel"))),
    shape_func=lambda attrs, args: [_roi_align_logic("vision.roi_align", attrs, [concrete(a) for a in args],
                                                     ShapeError)],
    doc="ONNX RoiAlign: average (or max) of bilinear samples per output bin of each region.",
)
