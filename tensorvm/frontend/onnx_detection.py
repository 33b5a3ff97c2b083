"""Converters of ONNX ops whose output shape depends on the data: NonZero, NonMaxSuppression, TopK,
Unique, Compress; and RoiAlign."""

from __future__ import annotations

import numpy as np

from ..errors import TypeInferenceError
from .onnx_context import check_unrolled, converter


@converter("NonZero", 9)
def non_zero_9(ctx, X):
    if ctx.ndim(X) == 0:
        X = ctx.call("expand_dims", X, axis=0)
    coords = ctx.call("argwhere", X)  # (count, rank) int32
    return ctx.cast(ctx.call("transpose", coords, axes=(1, 0)), "int64")


@converter("NonMaxSuppression", 10)
def non_max_suppression_10(ctx, boxes, scores, max_output_boxes_per_class=None, iou_threshold=None,
                           score_threshold=None, *, center_point_box=0):
    # Relay's all-class NMS (its padded rows and count), sliced to the count.
    dtype = ctx.dtype(boxes)
    if center_point_box:  # (x_center, y_center, width, height) -> corners
        center = ctx.call("strided_slice", boxes, begin=(0,), end=(2,), axes=(2,))
        half = ctx.call("multiply", ctx.call("strided_slice", boxes, begin=(2,), end=(4,), axes=(2,)),
                        ctx.constant(np.array(0.5, dtype)))
        boxes = ctx.call("concatenate", ctx.tuple([ctx.call("subtract", center, half), ctx.call("add", center, half)]),
                         axis=2)
    zero = ctx.constant(np.array(0, np.int64))
    # A negative ONNX limit selects nothing, as 0 does (for the Relay op a negative limit means no limit).
    max_out = ctx.call("maximum", ctx.cast(max_output_boxes_per_class, "int64"), zero) \
        if max_output_boxes_per_class is not None else zero
    iou = iou_threshold if iou_threshold is not None else ctx.constant(np.array(0.0, "float32"))
    # (no score_threshold: -inf, so that only a score of -inf or NaN is never selected)
    score = score_threshold if score_threshold is not None else ctx.constant(np.array(-np.inf, "float32"))
    found = ctx.call("vision.all_class_non_max_suppression", boxes, scores, max_out, iou, score, output_format="onnx")
    one = ctx.constant(np.array([1], np.int64))
    return ctx.call("dyn.strided_slice", ctx.get_item(found, 0), ctx.constant(np.array([0], np.int64)),
                    ctx.get_item(found, 1), one, axes=(0,))


def _topk(ctx, X, k, axis, largest, sorted_):
    # Relay's topk takes k < 1 for the whole axis; ONNX's K = 0 selects nothing, so the results are sliced to
    # K where it may be 0.
    k_value = ctx.scalar_value(k) if not isinstance(k, int) else k
    if k_value is not None:
        out = ctx.call("topk", X, k=int(k_value), axis=axis, ret_type="both", is_ascend=not largest, dtype="int64")
        results = [ctx.get_item(out, 0), ctx.get_item(out, 1)]
        if int(k_value) == 0:
            results = [ctx.call("strided_slice", r, begin=(0,), end=(0,), axes=(axis,)) for r in results]
        return results
    k_scalar = ctx.cast(k, "int64")
    if ctx.ndim(k_scalar):
        k_scalar = ctx.call("reshape", k_scalar, newshape=())
    out = ctx.call("topk", X, k_scalar, axis=axis, ret_type="both", is_ascend=not largest, dtype="int64")
    k_end = ctx.call("reshape", k_scalar, newshape=(1,))
    zero, one = ctx.constant(np.array([0], np.int64)), ctx.constant(np.array([1], np.int64))
    return [ctx.call("dyn.strided_slice", ctx.get_item(out, i), zero, k_end, one, axes=(axis,)) for i in range(2)]


@converter("TopK", 1)
def top_k_1(ctx, X, *, axis=-1, k):
    return _topk(ctx, X, k, axis, True, True)


@converter("TopK", 10)
def top_k_10(ctx, X, K, *, axis=-1):
    return _topk(ctx, X, K, axis, True, True)


@converter("TopK", 11)
def top_k_11(ctx, X, K, *, axis=-1, largest=1, sorted=1):  # noqa: A002 - the ONNX attribute's name
    return _topk(ctx, X, K, axis, bool(largest), bool(sorted))


@converter("Unique", 11)
def unique_11(ctx, X, *, axis=None, sorted=1):  # noqa: A002
    if axis is None or (ctx.ndim(X) == 1 and axis in (0, -1)):
        # Unique elements: the core op over the flattened input (its indices are int32, ONNX's int64).
        flat = X if ctx.ndim(X) == 1 else ctx.call("reshape", X, newshape=(-1,))
        out = ctx.call("unique", flat, is_sorted=bool(sorted), return_counts=True)
        values, *rest = (ctx.get_item(out, i) for i in range(4))
        return [values] + [ctx.cast(r, "int64") for r in rest]
    if not -ctx.ndim(X) <= axis < ctx.ndim(X):
        raise TypeInferenceError(f"Unique: axis {axis} is out of range for rank {ctx.ndim(X)}")
    return _unique_slices(ctx, X, axis % ctx.ndim(X), bool(sorted))


def _unique_slices(ctx, X, axis, is_sorted):
    """Unique slices along ``axis`` as core ops: each slice (a row of ``rows``) gets as key the number of
    slices lexicographically smaller than it, so equal slices share a key and the keys order the slices
    as np.unique(axis=...) does; ``unique`` of the keys then gives the first occurrences, inverse indices
    and counts. The pairwise comparison costs O(n^2 m) for n slices of m elements (ONNX Unique with an
    axis runs on small tensors; the common form, without axis, is ``unique`` itself)."""
    ndim = ctx.ndim(X)
    perm = (axis,) + tuple(a for a in range(ndim) if a != axis)
    moved = X if axis == 0 else ctx.call("transpose", X, axes=perm)
    rows = ctx.call("reshape", moved, newshape=(0, -1))
    a, b = ctx.call("expand_dims", rows, axis=1), ctx.call("expand_dims", rows, axis=0)  # (n, 1, m), (1, n, m)
    differ = ctx.call("not_equal", a, b)
    # The first differing element of each pair decides its order.
    before = ctx.call("cumsum", ctx.cast(differ, "int32"), axis=2, exclusive=True)
    first = ctx.call("logical_and", differ, ctx.call("equal", before, ctx.constant(np.array(0, np.int32))))
    less = ctx.call("any", ctx.call("logical_and", first, ctx.call("less", a, b)), axis=2)  # less[i, j]: row i < row j
    key = ctx.call("sum", ctx.cast(less, "int64"), axis=0)  # rows smaller than each row
    out = ctx.call("unique", key, is_sorted=is_sorted, return_counts=True)
    _, first_index, inverse, counts = (ctx.get_item(out, i) for i in range(4))
    y = ctx.call("take", moved, first_index, axis=0)
    if axis:
        y = ctx.call("transpose", y, axes=tuple(int(i) for i in np.argsort(perm)))
    return [y] + [ctx.cast(v, "int64") for v in (first_index, inverse, counts)]


@converter("Compress", 9)
def compress_9(ctx, input, condition, *, axis=None):  # noqa: A002
    x = input
    if axis is None:
        x = ctx.call("reshape", x, newshape=(-1,))
        axis = 0
    cond = ctx.cast(condition, "bool")
    positions = ctx.call("reshape", ctx.call("argwhere", cond), newshape=(-1,))
    return ctx.call("take", x, positions, axis=axis, mode="fast")


@converter("RoiAlign", 10)
def roi_align_10(ctx, X, rois, batch_indices, *, mode="avg", output_height=1, output_width=1, sampling_ratio=0,
                 spatial_scale=1.0):
    return ctx.call("vision.onnx_roi_align", X, rois, batch_indices, mode=mode, output_height=output_height,
                    output_width=output_width, sampling_ratio=sampling_ratio, spatial_scale=float(spatial_scale),
                    coordinate_transformation_mode="output_half_pixel")


@converter("RoiAlign", 16)
def roi_align_16(ctx, X, rois, batch_indices, *, coordinate_transformation_mode="half_pixel", mode="avg",
                 output_height=1, output_width=1, sampling_ratio=0, spatial_scale=1.0):
    return ctx.call("vision.onnx_roi_align", X, rois, batch_indices, mode=mode, output_height=output_height,
                    output_width=output_width, sampling_ratio=sampling_ratio, spatial_scale=float(spatial_scale),
                    coordinate_transformation_mode=coordinate_transformation_mode)


@converter("MaxRoiPool", 1)
def max_roi_pool_1(ctx, X, rois, *, pooled_shape, spatial_scale=1.0):
    """Fast R-CNN's RoI pooling as ONNX Runtime computes it: a RoI's corners scaled and rounded half away
    from zero, its size at least 1, bin (i, j) spanning rows floor(i h / PH) .. ceil((i + 1) h / PH) past its
    top (clipped to the image), likewise columns; the maximum over the bin, 0 for an empty bin. Computed as a
    masked maximum over the columns, then over the rows (each a fused reduction)."""
    if ctx.ndim(X) != 4 or ctx.ndim(rois) != 2:
        raise TypeInferenceError(f"MaxRoiPool: X must be (N, C, H, W) and rois (R, 5), got {ctx.shape(X)} and "
                                 f"{ctx.shape(rois)}")
    pooled_h, pooled_w = (int(v) for v in pooled_shape)
    f, i64 = ctx.dtype(X), "int64"

    def col(k):  # (R,) column k of the rois
        return ctx.call("take", rois, ctx.constant(np.array(k, np.int64)), axis=1)

    def rounded(v):  # scaled, rounded half away from zero, as C's round
        v = ctx.call("multiply", v, ctx.constant(np.array(spatial_scale, f)))
        return ctx.call("multiply", ctx.call("sign", v),
                        ctx.call("floor", ctx.call("add", ctx.call("abs", v), ctx.constant(np.array(0.5, f)))))

    one = ctx.constant(np.array(1, f))
    batch = ctx.cast(col(0), i64)
    x1, y1, x2, y2 = (rounded(col(k)) for k in (1, 2, 3, 4))
    images = ctx.call("take", X, batch, axis=0, mode="fast")  # (R, C, H, W)

    def bins(start, end, pooled, size):
        """(R, pooled, size): whether position p of the axis is in bin i of each RoI."""
        extent = ctx.call("maximum", ctx.call("add", ctx.call("subtract", end, start), one), one)
        step = ctx.call("expand_dims", ctx.call("divide", extent, ctx.constant(np.array(pooled, f))), axis=1)
        index = ctx.constant(np.arange(pooled, dtype=f).reshape(1, pooled))
        lo = ctx.call("add", ctx.call("floor", ctx.call("multiply", index, step)), ctx.call("expand_dims", start, axis=1))
        hi = ctx.call("add", ctx.call("ceil", ctx.call("multiply", ctx.call("add", index, one), step)),
                      ctx.call("expand_dims", start, axis=1))
        lo = ctx.call("clip", lo, a_min=0.0, a_max=float(size))
        hi = ctx.call("clip", hi, a_min=0.0, a_max=float(size))
        where = ctx.constant(np.arange(size, dtype=f).reshape(1, 1, size))
        return ctx.call("logical_and", ctx.call("greater_equal", where, ctx.call("expand_dims", lo, axis=2)),
                        ctx.call("less", where, ctx.call("expand_dims", hi, axis=2)))

    height, width = ctx.shape(X)[2], ctx.shape(X)[3]
    if not isinstance(height, int) or not isinstance(width, int):
        raise TypeInferenceError("MaxRoiPool: the feature map's height and width must be static")
    check_unrolled("MaxRoiPool", max(height, width, pooled_h, pooled_w), "the feature map's or the pooled size")
    rows, cols = bins(y1, y2, pooled_h, height), bins(x1, x2, pooled_w, width)  # (R, PH, H), (R, PW, W)
    lowest = ctx.constant(np.array(-np.inf, f))
    # over the columns: (R, C, H, 1, W) against (R, 1, 1, PW, W) -> (R, C, H, PW)
    in_cols = ctx.call("reshape", cols, newshape=(0, 1, 1, pooled_w, width))
    by_cols = ctx.call("max", ctx.call("where", in_cols, ctx.call("expand_dims", images, axis=3), lowest), axis=(4,))
    # over the rows: (R, C, 1, H, PW) against (R, 1, PH, H, 1) -> (R, C, PH, PW)
    in_rows = ctx.call("reshape", rows, newshape=(0, 1, pooled_h, height, 1))
    pooled = ctx.call("max", ctx.call("where", in_rows, ctx.call("expand_dims", by_cols, axis=2), lowest), axis=(3,))
    row_any = ctx.call("expand_dims", ctx.call("any", rows, axis=(2,)), axis=2)  # (R, PH, 1)
    col_any = ctx.call("expand_dims", ctx.call("any", cols, axis=(2,)), axis=1)  # (R, 1, PW)
    filled = ctx.call("expand_dims", ctx.call("logical_and", row_any, col_any), axis=1)  # (R, 1, PH, PW)
    return ctx.call("where", filled, pooled, ctx.constant(np.array(0, f)))
