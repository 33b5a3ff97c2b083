"""Relay's image operators: ``image.resize2d`` and ``dyn.image.resize2d`` (size and roi as tensors),
``image.grid_sample`` and ``image.affine_grid``.

The sampling arithmetic (source coordinates, rounding, interpolation weights) is written once, over a
small math namespace: ``_NP`` evaluates it on NumPy index arrays (the reference kernels), ``_TE`` on
tensor expressions (the computes that target c compiles). Both run in float64.

Source coordinates that only depend on integers are computed as one quotient of integers (e.g.
half_pixel's ``(x + 0.5) * in / out - 0.5`` as ``((2x + 1) * in - out) / (2 * out)``), so the rounding
of nearest-neighbour sampling and the floor of the interpolating methods decide exactly where a
coordinate lies on an integer or a half (TVM adds 1e-5 before its floor for the same purpose).
"""

from __future__ import annotations

import numpy as np

from ..errors import ShapeError, TypeInferenceError
from ..ir.types import Any, TensorType
from ..te import expr as E
from ..te import intrin as M
from ..te.expr import cast, const
from ..te.op_computes import _layout_compute, _layout_reader, _out_dtype, _output_dims
from ._common import expect_tensor
from .registry import REQUIRED, AttrDef, OpPattern
from .transform import (
    concrete,
    define,
    expect_int_tensor,
    fmt_shape,
    int_tuple,
    is_float_dtype,
    is_int_dtype,
    layout_of,
    one_of,
    to_float,
    to_int,
    to_out_dtype,
    unify_dim,
)

__all__ = ["resize_coordinate"]

F64 = "float64"


class _NP:
    """The math of the sampling code on NumPy arrays."""

    where = staticmethod(np.where)
    floor = staticmethod(np.floor)
    ceil = staticmethod(np.ceil)
    rint = staticmethod(np.rint)
    minimum = staticmethod(np.minimum)
    maximum = staticmethod(np.maximum)
    logical_or = staticmethod(np.logical_or)
    logical_and = staticmethod(np.logical_and)

    @staticmethod
    def to_float(v):
        return np.asarray(v, dtype=np.float64)

    @staticmethod
    def to_int(v):
        return np.asarray(v).astype(np.int64)


class _TE:
    """The same math on tensor expressions."""

    where = staticmethod(E.select)
    floor = staticmethod(M.floor)
    ceil = staticmethod(M.ceil)
    rint = staticmethod(M.round)
    minimum = staticmethod(E.minimum)
    maximum = staticmethod(E.maximum)
    logical_or = staticmethod(E.logical_or)
    logical_and = staticmethod(E.logical_and)

    @staticmethod
    def to_float(v):
        return const(float(v), F64) if isinstance(v, (int, float)) else cast(v, F64)

    @staticmethod
    def to_int(v):
        return cast(v, "int64")


def resize_coordinate(m, mode: str, x, in_size, out_size, roi_start=0.0, roi_end=1.0):
    """The source coordinate of output position ``x`` along an axis resized from ``in_size`` to
    ``out_size`` (``x`` and the sizes are integers: ints, index arrays or index expressions)."""
    f = m.to_float
    wide = out_size > 1
    if mode == "half_pixel":
        return f((2 * x + 1) * in_size - out_size) / f(2 * out_size)
    if mode == "pytorch_half_pixel":
        return m.where(wide, f((2 * x + 1) * in_size - out_size) / f(2 * m.maximum(out_size, 1)), 0.0)
    if mode == "align_corners":
        return m.where(wide, f(x * (in_size - 1)) / f(m.maximum(out_size - 1, 1)), 0.0)
    if mode == "asymmetric":
        return f(x * in_size) / f(m.maximum(out_size, 1))
    if mode == "tf_half_pixel_for_nn":
        return f((2 * x + 1) * in_size) / f(2 * m.maximum(out_size, 1))
    if mode == "tf_crop_and_resize":
        span = f(in_size - 1)
        spread = roi_start * span + f(x) * (roi_end - roi_start) * span / f(m.maximum(out_size - 1, 1))
        return m.where(wide, spread, 0.5 * (roi_start + roi_end) * span)
    raise ShapeError(f"image.resize2d: unknown coordinate_transformation_mode {mode!r}")


def _nearest_index(m, rounding: str, c):
    if rounding == "round":  # half to even
        return m.rint(c)
    if rounding == "round_prefer_floor":
        return m.ceil(c - 0.5)
    if rounding == "round_prefer_ceil":
        return m.floor(c + 0.5)
    if rounding == "floor":
        return m.floor(c)
    return m.ceil(c)


def _cubic_weights(t, alpha):
    """Keys' cubic convolution weights of the taps at -1, 0, 1, 2 for the fraction ``t``."""
    t2, t3 = t * t, t * t * t
    return [alpha * (t3 - 2 * t2 + t),
            (alpha + 2) * t3 - (alpha + 3) * t2 + 1,
            -(alpha + 2) * t3 + (2 * alpha + 3) * t2 - alpha * t,
            alpha * (t2 - t3)]


def _lerp(a, b, t):
    return a * (1.0 - t) + b * t


def _clamp(m, i, size):
    return m.minimum(m.maximum(i, 0), size - 1)


def _resize_value(m, attrs, read, cy, cx, in_h, in_w):
    """The resized value (float64; for nearest the raw element) at source coordinates (cy, cx).

    ``read(y, x)`` reads the input at integer positions already clamped into range."""
    method = attrs.method
    if method == "nearest_neighbor":
        rounding = attrs.rounding_method or "round"
        y = _clamp(m, m.to_int(_nearest_index(m, rounding, cy)), in_h)
        x = _clamp(m, m.to_int(_nearest_index(m, rounding, cx)), in_w)
        return read(y, x)
    y0f, x0f = m.floor(cy), m.floor(cx)
    ty, tx = cy - y0f, cx - x0f
    y0, x0 = m.to_int(y0f), m.to_int(x0f)
    if method == "linear":
        def row(dy):
            y = _clamp(m, y0 + dy, in_h)
            return _lerp(m.to_float(read(y, _clamp(m, x0, in_w))), m.to_float(read(y, _clamp(m, x0 + 1, in_w))), tx)

        return _lerp(row(0), row(1), ty)
    wy, wx = _cubic_weights(ty, attrs.cubic_alpha), _cubic_weights(tx, attrs.cubic_alpha)
    if attrs.cubic_exclude:
        wy = _excluded(m, wy, y0, in_h)
        wx = _excluded(m, wx, x0, in_w)
    total = 0.0
    for j in range(4):
        y = _clamp(m, y0 + (j - 1), in_h)
        row = 0.0
        for i in range(4):
            row = row + wx[i] * m.to_float(read(y, _clamp(m, x0 + (i - 1), in_w)))
        total = total + wy[j] * row
    return total


def _excluded(m, weights, base, size):
    """cubic_exclude: taps outside the input get weight 0, the others are renormalized."""
    kept = [m.where(m.logical_or(base + (k - 1) < 0, base + (k - 1) >= size), 0.0, w) for k, w in enumerate(weights)]
    total = kept[0] + kept[1] + kept[2] + kept[3]
    return [w / total for w in kept]


def _finish(m, attrs, value, cy, cx, in_h, in_w, dtype: str, roi):
    """Extrapolation (tf_crop_and_resize) and the conversion to the output dtype (integers round)."""
    if attrs.method != "nearest_neighbor" and is_int_dtype(dtype):
        info = np.iinfo(dtype)
        value = m.minimum(m.maximum(m.rint(value), float(info.min)), float(info.max))
    if attrs.coordinate_transformation_mode == "tf_crop_and_resize":
        outside = m.logical_or(m.logical_or(cy < 0, cy > m.to_float(in_h - 1)),
                               m.logical_or(cx < 0, cx > m.to_float(in_w - 1)))
        value = m.where(outside, m.to_float(attrs.extrapolation_value), m.to_float(value))
    return value


# ---------------------------------------------------------------------------------------------------
# image.resize2d


_METHODS = one_of("nearest_neighbor", "linear", "cubic")
_COORDINATE_MODES = one_of("half_pixel", "align_corners", "asymmetric", "pytorch_half_pixel",
                           "tf_half_pixel_for_nn", "tf_crop_and_resize")
_ROUNDING = one_of("", "round", "round_prefer_floor", "round_prefer_ceil", "floor", "ceil")


def _roi(value) -> tuple:
    items = tuple(to_float(v) for v in value) if isinstance(value, (tuple, list)) else None
    if items is None or len(items) != 4:
        raise ValueError(f"expected 4 numbers (start_h, start_w, end_h, end_w), got {value!r}")
    return items


def _size_pair(value) -> tuple:
    items = int_tuple(0)(value)
    if len(items) != 2:
        raise ValueError(f"expected (height, width), got {value!r}")
    return items


_RESIZE_COMMON = (
    AttrDef("layout", "NCHW", layout_of("NCHW")),
    AttrDef("method", "linear", _METHODS),
    AttrDef("coordinate_transformation_mode", "half_pixel", _COORDINATE_MODES),
    AttrDef("rounding_method", "", _ROUNDING, "nearest_neighbor's rounding; empty: round (half to even)"),
    AttrDef("cubic_alpha", -0.5, to_float),
    AttrDef("cubic_exclude", 0, to_int),
    AttrDef("extrapolation_value", 0.0, to_float),
    AttrDef("out_dtype", "", to_out_dtype),
)


def _resize_out_shape(op, data_shape, layout, size, err):
    if len(data_shape) != 4:
        raise err(f"{op}: data must have rank 4 ({layout}), got shape {fmt_shape(data_shape)}")
    out = list(data_shape)
    for letter, new in zip("HW", size, strict=True):
        axis = layout.index(letter)
        if isinstance(out[axis], int) and isinstance(new, int) and out[axis] == 0 and new > 0:
            raise err(f"{op}: cannot resize the empty {letter} dim of {fmt_shape(data_shape)} to {new}")
        out[axis] = new
    return tuple(out)


def _resize_dtype(op, data: TensorType, attrs) -> str:
    dtype = attrs.out_dtype or data.dtype
    if data.dtype == "bool" or dtype == "bool":
        raise TypeInferenceError(f"{op}: expected numeric data and out_dtype, got {data.dtype} -> {dtype}")
    return dtype


def _resize2d_numpy(attrs, x: np.ndarray, size, roi, dtype: str) -> np.ndarray:
    """The reference kernel: the shared sampling code over index arrays of the output's H and W."""
    layout = attrs.layout
    canonical = x.transpose([layout.index(c) for c in "NCHW"])
    in_h, in_w = canonical.shape[2:]
    out_h, out_w = size
    out = np.zeros(canonical.shape[:2] + (out_h, out_w), dtype=dtype)
    if out.size and (in_h == 0 or in_w == 0):
        raise ShapeError(f"image.resize2d: cannot resize the empty input {x.shape} to {tuple(size)}")
    if out.size:
        mode = attrs.coordinate_transformation_mode
        ys = np.arange(out_h, dtype=np.int64)[:, None]
        xs = np.arange(out_w, dtype=np.int64)[None, :]
        cy = resize_coordinate(_NP, mode, ys, in_h, out_h, roi[0], roi[2])
        cx = resize_coordinate(_NP, mode, xs, in_w, out_w, roi[1], roi[3])
        value = _resize_value(_NP, attrs, lambda y, z: canonical[:, :, y, z], cy, cx, in_h, in_w)
        value = _finish(_NP, attrs, value, cy, cx, in_h, in_w, dtype, roi)
        out[...] = np.asarray(value).astype(dtype)
    return np.ascontiguousarray(out.transpose(["NCHW".index(c) for c in layout]))


def _resize2d_te(attrs, x, out_hw, roi, dtype: str, name: str):
    """The compute: ``out_hw`` and ``roi`` are te expressions (attributes or reads of tensors)."""
    xd, x_read = _layout_reader(x, attrs.layout, "NCHW")
    in_h, in_w = xd["H"], xd["W"]
    out_h, out_w = out_hw
    mode = attrs.coordinate_transformation_mode
    requires = [(E.logical_or(E.logical_and(in_h > 0, in_w > 0), E.eq(out_h * out_w, 0)),
                 f"{name}: cannot resize an empty image to a non-empty one")]

    def f(N, C, H, W):
        cy = resize_coordinate(_TE, mode, H, in_h, out_h, roi[0], roi[2])
        cx = resize_coordinate(_TE, mode, W, in_w, out_w, roi[1], roi[3])
        value = _resize_value(_TE, attrs, lambda y, z: x_read(N=N, C=C, H=y, W=z), cy, cx, in_h, in_w)
        return cast(_finish(_TE, attrs, value, cy, cx, in_h, in_w, dtype, roi), dtype)

    shape = {"N": xd["N"], "C": xd["C"], "H": out_h, "W": out_w}
    return _layout_compute(shape, attrs.layout, f, name.replace(".", "_"), requires)


def _resize2d_rel(types, attrs, consts=None):
    op = "image.resize2d"
    data = expect_tensor(op, types[0], "data")
    shape = _resize_out_shape(op, data.shape, attrs.layout, attrs.size, TypeInferenceError)
    return TensorType(shape, _resize_dtype(op, data, attrs))


def _resize2d_compute(attrs, inputs, out_type):
    roi = [const(v, F64) for v in attrs.roi]
    size = tuple(const(s) for s in attrs.size)
    return [_resize2d_te(attrs, inputs[0], size, roi, _out_dtype(out_type), "image.resize2d")]


define(
    "image.resize2d", 1, _resize2d_rel,
    lambda attrs, x: _resize2d_numpy(attrs, np.asarray(x), attrs.size, attrs.roi,
                                     attrs.out_dtype or np.asarray(x).dtype.name),
    OpPattern.INJECTIVE,
    attrs=(AttrDef("size", REQUIRED, _size_pair), AttrDef("roi", (0.0, 0.0, 0.0, 0.0), _roi)) + _RESIZE_COMMON,
    shape_func=lambda attrs, args: [_resize_out_shape("image.resize2d", concrete(args[0]), attrs.layout,
                                                      attrs.size, ShapeError)],
    compute=_resize2d_compute,
    doc="Resize the H and W dims to ``size`` by nearest_neighbor (with ``rounding_method``), linear or "
        "cubic (Keys, ``cubic_alpha``; ``cubic_exclude`` drops taps outside) sampling at the source "
        "coordinates of ``coordinate_transformation_mode``; ``roi`` (start_h, start_w, end_h, end_w) and "
        "``extrapolation_value`` serve tf_crop_and_resize. Integer results of linear/cubic are rounded.",
)


# ---------------------------------------------------------------------------------------------------
# dyn.image.resize2d(data, size, roi)


def _dyn_size(op, value, err) -> tuple:
    arr = np.asarray(value)
    if arr.shape != (2,) or arr.dtype.kind not in "iu" or (arr < 0).any():
        raise err(f"{op}: size must be 2 non-negative integers (height, width), got {arr.tolist()!r} "
                  f"of {arr.dtype}")
    return tuple(int(v) for v in arr)


def _dyn_roi(op, value, err) -> tuple:
    arr = np.asarray(value)
    if arr.shape != (4,) or arr.dtype.kind != "f":
        raise err(f"{op}: roi must be 4 floats (start_h, start_w, end_h, end_w), got {arr.dtype} of shape {arr.shape}")
    return tuple(float(v) for v in arr)


def _dyn_resize2d_rel(types, attrs, consts=None):
    op = "dyn.image.resize2d"
    data = expect_tensor(op, types[0], "data")
    size_t = expect_int_tensor(op, types[1], "size")
    roi_t = expect_tensor(op, types[2], "roi")
    if size_t.ndim != 1 or not is_float_dtype(roi_t.dtype) or roi_t.ndim != 1:
        raise TypeInferenceError(f"{op}: size must be a 1-D integer tensor and roi a 1-D float tensor, got "
                                 f"{fmt_shape(size_t.shape)} {size_t.dtype} and {fmt_shape(roi_t.shape)} {roi_t.dtype}")
    unify_dim(op, size_t.shape[0], 2, "the length of size and 2 (height, width)", TypeInferenceError)
    unify_dim(op, roi_t.shape[0], 4, "the length of roi and 4", TypeInferenceError)
    if consts is not None and consts[1] is not None:
        size = _dyn_size(op, consts[1], TypeInferenceError)
    else:
        size = (Any(), Any())
    return TensorType(_resize_out_shape(op, data.shape, attrs.layout, size, TypeInferenceError),
                      _resize_dtype(op, data, attrs))


def _dyn_resize2d_kernel(attrs, x, size, roi):
    op = "dyn.image.resize2d"
    x = np.asarray(x)
    size = _dyn_size(op, size, ShapeError)
    _resize_out_shape(op, x.shape, attrs.layout, size, ShapeError)
    return _resize2d_numpy(attrs, x, size, _dyn_roi(op, roi, ShapeError), attrs.out_dtype or x.dtype.name)


def _dyn_resize2d_compute(attrs, inputs, out_type):
    x, _, roi_t = inputs
    dims = _output_dims("dyn.image.resize2d", out_type)
    out_hw = (dims[attrs.layout.index("H")], dims[attrs.layout.index("W")])
    roi = [cast(roi_t[(const(k),)], F64) for k in range(4)]
    return [_resize2d_te(attrs, x, out_hw, roi, _out_dtype(out_type), "dyn.image.resize2d")]


define(
    "dyn.image.resize2d", 3, _dyn_resize2d_rel, _dyn_resize2d_kernel, OpPattern.INJECTIVE,
    attrs=_RESIZE_COMMON,
    shape_func=lambda attrs, args: [_resize_out_shape("dyn.image.resize2d", concrete(args[0]), attrs.layout,
                                                      _dyn_size("dyn.image.resize2d", args[1], ShapeError),
                                                      ShapeError)],
    data_dependent=(False, True, False), compute=_dyn_resize2d_compute,
    doc="image.resize2d with the output (height, width) and the roi given as run-time tensors.",
)
