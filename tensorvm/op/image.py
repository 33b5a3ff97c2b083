"""Relay's resampling operators: ``image.resize1d``/``resize2d``/``resize3d`` and ``dyn.image.resize2d``
(size and roi as tensors), ``nn.upsampling``/``nn.upsampling3d`` and their ``dyn.nn`` forms (scales as tensors),
``image.crop_and_resize``, ``image.grid_sample`` and ``image.affine_grid``.

The sampling arithmetic is shared with ONNX's ``image.resize`` (op/onnx_ops.py) in ``_resample.py``;
each op's NumPy kernel and compute evaluate the same code on NumPy arrays and on tensor expressions.
"""

from __future__ import annotations

import itertools
import math

import numpy as np

from ..errors import ExecutionError, ShapeError, TypeInferenceError
from ..ir.types import Any, TensorType
from ..te import expr as E
from ..te import intrin as M
from ..te.expr import cast, const
from ..te.tensor import compute
from ._common import INT_DTYPES, expect_tensor
from ._compute import layout_compute, layout_reader, output_dims, output_dtype, product
from ._resample import F64, NP, TE, Spec, clamp, cubic_weights, finish, resize_coordinate, sample
from .registry import REQUIRED, AttrDef, OpPattern
from .shape_logic import DataArg, Leaf, Sym, c_expr, dim_or, is_sym, require, round_half_even, traceable
from .transform import (
    define,
    define_shaped,
    expect_int_tensor,
    fmt_shape,
    int_tuple,
    is_float_dtype,
    is_int_dtype,
    layout_of,
    one_of,
    to_bool,
    to_float,
    to_int,
    to_out_dtype,
    unify_dim,
)

__all__ = ["resize_numpy", "resize_te"]

def _resize_spec(attrs) -> Spec:
    return Spec(attrs.method, attrs.coordinate_transformation_mode, attrs.rounding_method, attrs.cubic_alpha,
                 attrs.cubic_exclude, attrs.extrapolation_value)


def resize_numpy(spec: Spec, x: np.ndarray, layout: str, out_sizes, roi, dtype: str) -> np.ndarray:
    """The reference kernel: the shared sampling code over index arrays of the output's spatial axes.
    ``layout`` has the letters N, C and the spatial ones (in canonical order ``spatial``)."""
    spatial = "DHW"[3 - (x.ndim - 2):]
    canonical = "NC" + spatial
    xc = x.transpose([layout.index(c) for c in canonical])
    in_sizes = xc.shape[2:]
    out = np.zeros(xc.shape[:2] + tuple(out_sizes), dtype=dtype)
    if out.size and 0 in in_sizes:
        raise ShapeError(f"resize: cannot resize the empty input {x.shape} to {tuple(out_sizes)}")
    if out.size:
        d = len(spatial)
        coords = []
        for k, (n_in, n_out) in enumerate(zip(in_sizes, out_sizes)):
            index = np.arange(n_out, dtype=np.int64).reshape((1,) * k + (n_out,) + (1,) * (d - k - 1))
            coords.append(resize_coordinate(NP, spec.mode, index, n_in, n_out, roi[k], roi[k + d]))
        value = sample(NP, spec, lambda *p: xc[(slice(None), slice(None)) + p], coords, in_sizes)
        out[...] = np.asarray(finish(NP, spec, value, coords, in_sizes, dtype)).astype(dtype)
    return np.ascontiguousarray(out.transpose([canonical.index(c) for c in layout]))


def resize_te(spec: Spec, x, layout: str, out_sizes, roi, dtype: str, name: str):
    """The compute: ``out_sizes`` and ``roi`` are te expressions (attributes or reads of tensors)."""
    spatial = "DHW"[3 - (x.ndim - 2):]
    xd, x_read = layout_reader(x, layout, "NC" + spatial)
    in_sizes = [xd[c] for c in spatial]
    d = len(spatial)
    nonempty = E.all_of(*(n > 0 for n in in_sizes))
    requires = [(E.logical_or(nonempty, E.eq(product(out_sizes), 0)),
                 f"{name}: cannot resize an empty input to a non-empty output")]

    def f(**index):
        coords = [resize_coordinate(TE, spec.mode, index[c], n_in, n_out, roi[k], roi[k + d])
                  for k, (c, n_in, n_out) in enumerate(zip(spatial, in_sizes, out_sizes))]
        value = sample(TE, spec, lambda *p: x_read(N=index["N"], C=index["C"], **dict(zip(spatial, p))), coords,
                        in_sizes)
        return cast(finish(TE, spec, value, coords, in_sizes, dtype), dtype)

    shape = {"N": xd["N"], "C": xd["C"], **dict(zip(spatial, out_sizes))}
    return layout_compute(shape, layout, f, name.replace(".", "_"), requires)


# ---------------------------------------------------------------------------------------------------
# image.resize2d


_METHODS = one_of("nearest_neighbor", "linear", "cubic")
_COORDINATE_MODES = one_of("half_pixel", "align_corners", "asymmetric", "pytorch_half_pixel",
                           "tf_half_pixel_for_nn", "tf_crop_and_resize")
_ROUNDING = one_of("", "round", "round_prefer_floor", "round_prefer_ceil", "floor", "ceil")


_SPATIAL = {1: "W", 2: "HW", 3: "DHW"}
_CANONICAL = {1: "NCW", 2: "NCHW", 3: "NCDHW"}


def _roi_of(d: int):
    def convert(value) -> tuple:
        items = tuple(to_float(v) for v in value) if isinstance(value, (tuple, list)) else None
        if items is None or len(items) != 2 * d:
            raise ValueError(f"expected {2 * d} numbers (the starts of {', '.join(_SPATIAL[d])}, then their ends), "
                             f"got {value!r}")
        return items

    return convert


def _sizes_of(d: int):
    def convert(value) -> tuple:
        items = int_tuple(0)(value)
        if len(items) != d:
            raise ValueError(f"expected the {d} output sizes of {', '.join(_SPATIAL[d])}, got {value!r}")
        return items

    return convert


def _resize_common(canonical: str) -> tuple:
    return (
        AttrDef("layout", canonical, layout_of(canonical)),
        AttrDef("method", "linear", _METHODS),
        AttrDef("coordinate_transformation_mode", "half_pixel", _COORDINATE_MODES),
        AttrDef("rounding_method", "", _ROUNDING, "nearest_neighbor's rounding (round: half to even); empty: "
                                                  "round for align_corners, else floor"),
        AttrDef("cubic_alpha", -0.5, to_float),
        AttrDef("cubic_exclude", 0, to_int),
        AttrDef("extrapolation_value", 0.0, to_float),
        AttrDef("out_dtype", "", to_out_dtype),
    )


def _resize_out_shape(op, data_shape, layout, size, err):
    if len(data_shape) != len(layout):
        raise err(f"{op}: data must have rank {len(layout)} ({layout}), got shape {fmt_shape(data_shape)}")
    out = list(data_shape)
    axes = [layout.index(letter) for letter in _SPATIAL[len(layout) - 2]]
    for axis, new in zip(axes, size, strict=True):
        out[axis] = new
    # An empty dim has nothing to sample from, unless the output is empty too (then nothing is sampled).
    # Over typed dims the output counts as non-empty unless every dim is known.
    known = all(isinstance(d, (int, Sym)) for d in out)
    empty_out = math.prod(out, start=1) == 0 if known else False
    for letter, axis, new in zip(_SPATIAL[len(layout) - 2], axes, size, strict=True):
        dim = data_shape[axis]
        if isinstance(dim, (int, Sym)) and isinstance(new, (int, Sym)):  # (a known or traced dim and size)
            require(dim_or(dim_or(new <= 0, dim != 0), empty_out),
                    f"{op}: cannot resize the empty {letter} dim of {fmt_shape(data_shape)} to {new}", err)
    return tuple(out)


def _resize_dtype(op, data: TensorType, attrs) -> str:
    dtype = attrs.out_dtype or data.dtype
    if data.dtype == "bool" or dtype == "bool":
        raise TypeInferenceError(f"{op}: expected numeric data and out_dtype, got {data.dtype} -> {dtype}")
    return dtype


def _define_resize(d: int):
    name = f"image.resize{d}d"
    spatial = _SPATIAL[d]

    def rel(types, attrs, consts=None):
        data = expect_tensor(name, types[0], "data")
        shape = _resize_out_shape(name, data.shape, attrs.layout, attrs.size, TypeInferenceError)
        return TensorType(shape, _resize_dtype(name, data, attrs))

    def compute_fn(attrs, inputs, out_type):
        roi = [const(v, F64) for v in attrs.roi]
        size = tuple(const(n) for n in attrs.size)
        return [resize_te(_resize_spec(attrs), inputs[0], attrs.layout, size, roi, output_dtype(out_type), name)]

    define(
        name, 1, rel,
        lambda attrs, x: resize_numpy(_resize_spec(attrs), np.asarray(x), attrs.layout, attrs.size, attrs.roi,
                                      attrs.out_dtype or np.asarray(x).dtype.name),
        OpPattern.INJECTIVE,
        attrs=(AttrDef("size", REQUIRED, _sizes_of(d)), AttrDef("roi", (0.0,) * (2 * d), _roi_of(d)))
        + _resize_common(_CANONICAL[d]),
        shape_logic=traceable(lambda op, attrs, shapes, err: _resize_out_shape(op, shapes[0], attrs.layout,
                                                                               attrs.size, err)),
        compute=compute_fn,
        doc=f"Resize the {', '.join(spatial)} dims to ``size`` by nearest_neighbor (with ``rounding_method``), "
            f"linear or cubic (Keys, ``cubic_alpha``; ``cubic_exclude`` drops taps outside) sampling at the "
            f"source coordinates of ``coordinate_transformation_mode``; ``roi`` (the starts, then the ends) and "
            f"``extrapolation_value`` serve tf_crop_and_resize. Integer results of linear/cubic are rounded.",
    )


for _d in (1, 2, 3):
    _define_resize(_d)


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
    return resize_numpy(_resize_spec(attrs), x, attrs.layout, size, _dyn_roi(op, roi, ShapeError),
                        attrs.out_dtype or x.dtype.name)


def _dyn_resize2d_compute(attrs, inputs, out_type):
    x, _, roi_t = inputs
    dims = output_dims("dyn.image.resize2d", out_type)
    out_hw = (dims[attrs.layout.index("H")], dims[attrs.layout.index("W")])
    roi = [cast(roi_t[(const(k),)], F64) for k in range(4)]
    return [resize_te(_resize_spec(attrs), x, attrs.layout, out_hw, roi, output_dtype(out_type), "dyn.image.resize2d")]


@traceable
def _dyn_resize2d_logic(op, attrs, args, err):
    """Known size as _dyn_size checks it; read in C: 2 integers (the length checked first), each >= 0. The
    roi must hold the 4 values the kernel reads."""
    shape, size_arg, roi = tuple(args[0]), args[1], tuple(args[2])
    if size_arg.values is not None:
        size = _dyn_size(op, size_arg.values, err)
    else:
        if len(size_arg.shape) != 1 or size_arg.dtype not in INT_DTYPES:
            raise err(f"{op}: size must be 2 non-negative integers (height, width), got {size_arg.dtype} of shape "
                      f"{fmt_shape(size_arg.shape)}")
        require(size_arg.shape[0] == 2, f"{op}: size must be 2 non-negative integers (height, width)", err)
        size = (size_arg.item(0), size_arg.item(1))
        for n in size:
            require(n >= 0, f"{op}: size must be 2 non-negative integers (height, width)", err)
    if len(roi) != 1:
        raise err(f"{op}: roi must be 4 floats (start_h, start_w, end_h, end_w), got shape {fmt_shape(roi)}")
    require(roi[0] == 4, f"{op}: roi must be 4 floats (start_h, start_w, end_h, end_w), got shape {fmt_shape(roi)}",
            err)
    return _resize_out_shape(op, shape, attrs.layout, size, err)


define(
    "dyn.image.resize2d", 3, _dyn_resize2d_rel, _dyn_resize2d_kernel, OpPattern.INJECTIVE,
    attrs=_resize_common("NCHW"),
    shape_logic=_dyn_resize2d_logic,
    data_dependent=(False, True, False), compute=_dyn_resize2d_compute,
    doc="image.resize2d with the output (height, width) and the roi given as run-time tensors.",
)


# ---------------------------------------------------------------------------------------------------
# nn.upsampling, nn.upsampling3d and their dyn forms (scales as run-time scalars): a resize to
# round(dim * scale) (half to even, like Relay's shape rule) with no roi.


def _positive_float(value) -> float:
    value = to_float(value)
    if not value > 0:
        raise ValueError(f"expected a positive scale, got {value}")
    return value


def _scaled_dim(op, dim, scale, err):
    """round(dim * scale) in float64, half to even; a product beyond int64 is an error (it cannot be a dim)."""
    if isinstance(dim, (int, Sym)):  # (a known or traced dim)
        product = dim * scale
        require(product < 2.0 ** 63, f"{op}: the scaled dim {dim} x {scale} is too large", err)
        return round_half_even(product)
    return dim if scale == 1.0 else Any()


def _upsampling_shape(op, shape, layout, scales, err):
    spatial = "DHW"[3 - len(scales):]
    if len(shape) != len(layout):
        raise err(f"{op}: data must have rank {len(layout)} ({layout}), got shape {fmt_shape(shape)}")
    out = list(shape)
    for letter, scale in zip(spatial, scales, strict=True):
        out[layout.index(letter)] = _scaled_dim(op, shape[layout.index(letter)], scale, err)
    return tuple(out)


def _upsampling_spec(attrs) -> Spec:
    if "align_corners" in attrs:
        return Spec(attrs.method, "align_corners" if attrs.align_corners else "asymmetric")
    return Spec(attrs.method, attrs.coordinate_transformation_mode)


def _numeric_data(op, data: TensorType) -> TensorType:
    if data.dtype == "bool":
        raise TypeInferenceError(f"{op}: expected numeric data, got bool")
    return data


def _te_scaled(dim, scale):
    return cast(M.round(cast(dim, F64) * scale), "int64")


_UP_SCALES = {"nn.upsampling": ("scale_h", "scale_w"), "nn.upsampling3d": ("scale_d", "scale_h", "scale_w")}
_UP_ATTRS = {
    "nn.upsampling": (AttrDef("layout", "NCHW", layout_of("NCHW")),
                      AttrDef("method", "nearest_neighbor", one_of("nearest_neighbor", "bilinear", "bicubic")),
                      AttrDef("align_corners", False, to_bool)),
    "nn.upsampling3d": (AttrDef("layout", "NCDHW", layout_of("NCDHW")),
                        AttrDef("method", "nearest_neighbor", one_of("nearest_neighbor", "trilinear")),
                        AttrDef("coordinate_transformation_mode", "half_pixel",
                                one_of("half_pixel", "align_corners", "asymmetric"))),
}


def _define_upsampling(name: str):
    scale_names = _UP_SCALES[name]
    spatial = "DHW"[3 - len(scale_names):]

    def scales_of(attrs):
        return tuple(attrs[s] for s in scale_names)

    def rel(types, attrs, consts=None):
        data = _numeric_data(name, expect_tensor(name, types[0], "data"))
        return TensorType(_upsampling_shape(name, data.shape, attrs.layout, scales_of(attrs), TypeInferenceError),
                          data.dtype)

    def kernel(attrs, x):
        x = np.asarray(x)
        out = _upsampling_shape(name, x.shape, attrs.layout, scales_of(attrs), ShapeError)
        sizes = [out[attrs.layout.index(c)] for c in spatial]
        return resize_numpy(_upsampling_spec(attrs), x, attrs.layout, sizes, (0.0,) * 6, x.dtype.name)

    def compute_fn(attrs, inputs, out_type):
        x = inputs[0]
        sizes = [_te_scaled(x.shape[attrs.layout.index(c)], s) for c, s in zip(spatial, scales_of(attrs))]
        roi = [const(0.0, F64)] * 6
        return [resize_te(_upsampling_spec(attrs), x, attrs.layout, sizes, roi, x.dtype, name)]

    define(
        name, 1, rel, kernel, OpPattern.INJECTIVE,
        attrs=tuple(AttrDef(s, 1.0, _positive_float) for s in scale_names) + _UP_ATTRS[name],
        shape_logic=traceable(lambda op, attrs, shapes, err: _upsampling_shape(op, shapes[0], attrs.layout,
                                                                               scales_of(attrs), err)),
        compute=compute_fn,
        doc=f"Upsample the {', '.join(spatial)} dims by {', '.join(scale_names)} (to round(dim * scale)): "
            f"{spatial.lower()}-resize with asymmetric or align_corners coordinates.",
    )

    dyn_name = "dyn." + name

    def dyn_scales(values, err):
        out = []
        for s, value in zip(scale_names, values, strict=True):
            arr = np.asarray(value)
            if arr.ndim != 0 or arr.dtype.kind not in "iuf" or not float(arr) > 0:
                raise err(f"{dyn_name}: {s} must be a positive numeric scalar, got {arr.tolist()!r} of {arr.dtype}")
            out.append(float(arr))
        return tuple(out)

    def dyn_rel(types, attrs, consts=None):
        data = _numeric_data(dyn_name, expect_tensor(dyn_name, types[0], "data"))
        for s, ty in zip(scale_names, types[1:], strict=True):
            t = expect_tensor(dyn_name, ty, s)
            if t.ndim != 0 or t.dtype == "bool":
                raise TypeInferenceError(f"{dyn_name}: {s} must be a numeric scalar, got {fmt_shape(t.shape)} "
                                         f"{t.dtype}")
        if consts is not None and all(c is not None for c in consts[1:]):
            scales = dyn_scales(consts[1:], TypeInferenceError)
            return TensorType(_upsampling_shape(dyn_name, data.shape, attrs.layout, scales, TypeInferenceError),
                              data.dtype)
        unknown = (Any(),) * len(scale_names)
        shape = _upsampling_shape(dyn_name, data.shape, attrs.layout, (1.0,) * len(scale_names), TypeInferenceError)
        shape = list(shape)
        for c, d in zip(spatial, unknown):
            shape[attrs.layout.index(c)] = d
        return TensorType(tuple(shape), data.dtype)

    @traceable
    def dyn_logic(op, attrs, args, err):
        """Known scales as dyn_scales checks them; read in C: numeric scalars as doubles, each checked > 0
        (NaN fails), then the static op's rounding of the float64 products."""
        data = args[1:]
        if all(a.values is not None for a in data):
            return _upsampling_shape(op, tuple(args[0]), attrs.layout, dyn_scales([a.values for a in data], err),
                                     err)
        scales = []
        for s, a in zip(scale_names, data, strict=True):
            if len(a.shape) or a.dtype == "bool":
                raise err(f"{op}: {s} must be a positive numeric scalar, got {a.dtype} of shape {a.shape}")
            value = a.item(0)
            value = float(value) if not is_sym(value) else value if value.is_float else \
                Leaf(f"((double){c_expr(value)})", True)  # (Python multiplies by float(scale))
            require(value > 0, f"{op}: {s} must be a positive numeric scalar", err)
            scales.append(value)
        return _upsampling_shape(op, tuple(args[0]), attrs.layout, tuple(scales), err)

    def dyn_kernel(attrs, x, *scales):
        x = np.asarray(x)
        out = dyn_logic(dyn_name, attrs, [x.shape, *(DataArg.of_array(v) for v in scales)], ShapeError)
        sizes = [out[attrs.layout.index(c)] for c in spatial]
        return resize_numpy(_upsampling_spec(attrs), x, attrs.layout, sizes, (0.0,) * 6, x.dtype.name)

    def dyn_compute(attrs, inputs, out_type):
        x = inputs[0]
        dims = output_dims(dyn_name, out_type)
        sizes = [dims[attrs.layout.index(c)] for c in spatial]
        roi = [const(0.0, F64)] * 6
        return [resize_te(_upsampling_spec(attrs), x, attrs.layout, sizes, roi, x.dtype, dyn_name)]

    define(
        dyn_name, 1 + len(scale_names), dyn_rel, dyn_kernel, OpPattern.INJECTIVE, attrs=_UP_ATTRS[name],
        shape_logic=dyn_logic, data_dependent=(False,) + (True,) * len(scale_names), compute=dyn_compute,
        doc=f"{name} with {', '.join(scale_names)} given as run-time scalars.",
    )


_define_upsampling("nn.upsampling")
_define_upsampling("nn.upsampling3d")


# ---------------------------------------------------------------------------------------------------
# image.affine_grid, image.grid_sample (PyTorch's semantics, as Relay's)


def _affine_grid_rel(types, attrs, consts=None):
    op = "image.affine_grid"
    theta = expect_tensor(op, types[0], "data")
    if theta.ndim != 3 or not is_float_dtype(theta.dtype):
        raise TypeInferenceError(f"{op}: data must be a float tensor (batch, 2, 3), got {fmt_shape(theta.shape)} "
                                 f"{theta.dtype}")
    unify_dim(op, theta.shape[1], 2, "data dim 1 and 2", TypeInferenceError)
    unify_dim(op, theta.shape[2], 3, "data dim 2 and 3", TypeInferenceError)
    return TensorType((theta.shape[0], 2) + tuple(attrs.target_shape), theta.dtype)


def _linspace_point(m, i, size):
    """Position ``i`` of ``size`` points evenly spread over [-1, 1] (a single point sits at -1)."""
    return -1.0 + m.to_float(2 * i) / m.to_float(m.maximum(size - 1, 1))


def _affine_value(m, row, read_theta, i, j, height, width):
    x, y = _linspace_point(m, j, width), _linspace_point(m, i, height)
    return read_theta(row, 0) * x + read_theta(row, 1) * y + read_theta(row, 2)


def _affine_grid_kernel(attrs, theta):
    theta = np.asarray(theta)
    if theta.ndim != 3 or theta.shape[1:] != (2, 3):
        raise ShapeError(f"image.affine_grid: data must have shape (batch, 2, 3), got {theta.shape}")
    height, width = attrs.target_shape
    i = np.arange(height).reshape(1, 1, -1, 1)
    j = np.arange(width).reshape(1, 1, 1, -1)
    acc = theta.astype(np.float64)
    rows = np.arange(2).reshape(1, 2, 1, 1)
    value = _affine_value(NP, rows, lambda r, k: acc[:, :, k].reshape(-1, 2, 1, 1), i, j, height, width)
    return np.broadcast_to(value, (theta.shape[0], 2, height, width)).astype(theta.dtype)


def _affine_grid_compute(attrs, inputs, out_type):
    theta = inputs[0]
    height, width = (const(d) for d in attrs.target_shape)

    def f(n, r, i, j):
        value = _affine_value(TE, r, lambda row, k: cast(theta[(n, row, const(k))], F64), i, j, height, width)
        return cast(value, theta.dtype)

    return [compute((theta.shape[0], const(2), height, width), f, "affine_grid")]


define(
    "image.affine_grid", 1, _affine_grid_rel, _affine_grid_kernel, OpPattern.INJECTIVE,
    attrs=(AttrDef("target_shape", REQUIRED, _sizes_of(2)),),
    shape_logic=traceable(lambda op, attrs, shapes, err: (shapes[0][0], 2) + tuple(attrs.target_shape)),
    compute=_affine_grid_compute,
    doc="The sampling grid (batch, 2, H, W) of the affine maps data (batch, 2, 3) over target_shape (H, W): "
        "grid[n, :, i, j] = data[n] @ (x_j, y_i, 1) with x, y evenly spread over [-1, 1].",
)


def _reflect(m, c, twice_low: float, twice_high, size_ok):
    """Reflect ``c`` into [twice_low / 2, twice_high / 2] (mirror images repeat with period 2 * span)."""
    low = twice_low / 2
    span = (twice_high - twice_low) / 2
    safe = m.where(size_ok, span, 1.0)
    a = m.abs(c - low)
    extra, flips = m.fmod(a, safe), m.floor(a / safe)
    even = m.eq(m.fmod(flips, 2.0), 0.0)
    return m.where(size_ok, m.where(even, extra + low, span - extra + low), 0.0)


def _padded_coordinate(m, c, size, padding: str, align: bool):
    """A source coordinate moved inside by the padding mode (zeros leaves it)."""
    if padding == "zeros":
        return c
    top = m.to_float(size - 1)
    if padding == "reflection":
        if align:
            c = _reflect(m, c, 0.0, 2.0 * top, size > 1)
        else:
            c = _reflect(m, c, -1.0, 2.0 * m.to_float(size) - 1.0, size > 0)
    return m.minimum(m.maximum(c, 0.0), top)


def _grid_sample_value(m, attrs, read, coords, sizes):
    """The sample at the unnormalized source coordinates: ``read(positions)`` reads clamped positions."""
    padding, align = attrs.padding_mode, attrs.align_corners

    def tap(positions):
        """The value at integer positions: 0 outside the input (only the zeros padding leaves any)."""
        inside = None
        for p, n in zip(positions, sizes):
            ok = m.logical_and(p >= 0, p < n)
            inside = ok if inside is None else m.logical_and(inside, ok)
        value = m.to_float(read([clamp(m, p, n) for p, n in zip(positions, sizes)]))
        return m.where(inside, value, 0.0)

    if attrs.method == "bicubic":
        # PyTorch's order: the coordinate keeps its place, each of the 4 x 4 taps is padded
        axes = []
        for c, n in zip(coords, sizes):
            base_f = m.floor(c)
            weights = cubic_weights(c - base_f, -0.75)
            taps = []
            for k in range(4):
                p = base_f + (k - 1)
                if padding != "zeros":
                    p = _padded_coordinate(m, p, n, padding, align)
                taps.append(m.to_int(p))
            axes.append((taps, weights))
        total = 0.0
        for j in range(4):
            row = 0.0
            for i in range(4):
                row = row + axes[1][1][i] * tap([axes[0][0][j], axes[1][0][i]])
            total = total + axes[0][1][j] * row
        return total
    coords = [_padded_coordinate(m, c, n, padding, align) for c, n in zip(coords, sizes)]
    if attrs.method == "nearest":
        return tap([m.to_int(m.rint(c)) for c in coords])
    bases = [m.floor(c) for c in coords]
    fractions = [c - b for c, b in zip(coords, bases)]
    bases = [m.to_int(b) for b in bases]
    total = 0.0
    for corner in itertools.product((0, 1), repeat=len(coords)):
        weight = 1.0
        for bit, t in zip(corner, fractions):
            weight = weight * (t if bit else 1.0 - t)
        total = total + weight * tap([b + bit for b, bit in zip(bases, corner)])
    return total


def _unnormalized(m, g, size, align: bool):
    if align:
        return (g + 1.0) * m.to_float(size - 1) / 2.0
    return ((g + 1.0) * m.to_float(size) - 1.0) / 2.0


@traceable
def _grid_sample_logic(op, attrs, shapes, err):
    data, grid = shapes
    d = len(attrs.layout) - 2
    if len(data) != d + 2 or len(grid) != d + 2:
        raise err(f"{op}: data and grid must have rank {d + 2} for layout {attrs.layout}, got {fmt_shape(data)} "
                  f"and {fmt_shape(grid)}")
    if d == 3 and attrs.method == "bicubic":
        raise err(f"{op}: bicubic sampling is 2-D only (layout NCHW)")
    batch = unify_dim(op, data[0], grid[0], "the batch dims of data and grid", err)
    unify_dim(op, grid[1], d, f"grid dim 1 and {d} (the coordinates)", err)
    return (batch, data[1]) + tuple(grid[2:])


def _grid_sample_kernel(attrs, shape, x, grid):
    if shape[0] * shape[1] and 0 in x.shape[2:] and np.prod(shape[2:]):
        raise ShapeError(f"image.grid_sample: cannot sample the empty input {x.shape}")
    out = np.zeros(shape, x.dtype)
    if out.size == 0:
        return out
    d = x.ndim - 2
    sizes = x.shape[2:]
    g = grid.astype(np.float64)[:, :, None]  # (N, d, 1, spatial...) against data (N, C, ...)
    coords = [_unnormalized(NP, g[:, d - 1 - k], n, attrs.align_corners) for k, n in enumerate(sizes)]
    batch = np.arange(x.shape[0]).reshape((-1,) + (1,) * (d + 1))
    channel = np.arange(x.shape[1]).reshape((1, -1) + (1,) * d)
    value = _grid_sample_value(NP, attrs, lambda p: x[(batch, channel) + tuple(p)], coords, sizes)
    out[...] = np.asarray(value).astype(x.dtype)
    return out


def _grid_sample_compute(attrs, inputs, out_type):
    x, grid = inputs
    d = x.ndim - 2
    sizes = x.shape[2:]
    requires = [(E.logical_or(E.all_of(*(n > 0 for n in sizes)), E.eq(product(grid.shape[2:]), 0)),
                 "image.grid_sample: cannot sample an empty input")]

    def f(n, c, *out):
        coords = [_unnormalized(TE, cast(grid[(n, const(d - 1 - k)) + out], F64), size, attrs.align_corners)
                  for k, size in enumerate(sizes)]
        value = _grid_sample_value(TE, attrs, lambda p: x[(n, c) + tuple(p)], coords, sizes)
        return cast(value, x.dtype)

    return [compute((grid.shape[0], x.shape[1]) + tuple(grid.shape[2:]), f, "grid_sample", requires)]


def _check_grid_sample_types(types, attrs):
    if not is_float_dtype(types[0].dtype) or types[1].dtype != types[0].dtype:
        raise TypeInferenceError(f"image.grid_sample: data and grid must share one float dtype, got {types[0].dtype} "
                                 f"and {types[1].dtype}")


define_shaped(
    "image.grid_sample", 2, _grid_sample_logic, _grid_sample_kernel, OpPattern.INJECTIVE,
    attrs=(AttrDef("method", "bilinear", one_of("nearest", "bilinear", "bicubic")),
           AttrDef("layout", "NCHW", one_of("NCHW", "NCDHW")),
           AttrDef("padding_mode", "zeros", one_of("zeros", "border", "reflection")),
           AttrDef("align_corners", True, to_bool)),
    check_types=_check_grid_sample_types, compute=_grid_sample_compute,
    doc="Sample data (N, C, [D,] H, W) at grid (N, 2 or 3, ...) of normalized (x, y[, z]) in [-1, 1] "
        "(-1 and 1 the corner pixels' centres with align_corners, else their outer edges), by nearest "
        "(half to even), bilinear/trilinear or bicubic (2-D, a = -0.75) sampling; outside the input the "
        "padding_mode gives zeros, the border value or the reflection.",
)


# ---------------------------------------------------------------------------------------------------
# image.crop_and_resize(data, boxes, box_indices): tf_crop_and_resize sampling with each box as the roi


@traceable
def _crop_logic(op, attrs, shapes, err):
    data, boxes, indices = shapes
    if len(data) != 4 or len(boxes) != 2 or len(indices) != 1:
        raise err(f"{op}: expected data of rank 4, boxes (num_boxes, 4) and box_indices (num_boxes,), got "
                  f"{fmt_shape(data)}, {fmt_shape(boxes)} and {fmt_shape(indices)}")
    unify_dim(op, boxes[1], 4, "boxes dim 1 and 4 (y1, x1, y2, x2)", err)
    count = unify_dim(op, boxes[0], indices[0], "the numbers of boxes and box_indices", err)
    out = {"N": count, "C": data[attrs.layout.index("C")], "H": attrs.crop_size[0], "W": attrs.crop_size[1]}
    return tuple(out[c] for c in attrs.layout)


def _crop_spec(attrs) -> Spec:
    # TVM rounds a box's nearest coordinate with round (half to even)
    return Spec(attrs.method.replace("bilinear", "linear"), "tf_crop_and_resize", "round",
                extrapolation_value=attrs.extrapolation_value)


def _crop_kernel(attrs, shape, x, boxes, indices):
    dtype = attrs.out_dtype or x.dtype.name
    xc = x.transpose([attrs.layout.index(c) for c in "NCHW"])
    out = np.zeros((boxes.shape[0], xc.shape[1]) + tuple(attrs.crop_size), dtype)
    bad = (indices < 0) | (indices >= xc.shape[0])
    if bad.any():
        raise ExecutionError(f"image.crop_and_resize: box index {indices[bad][0]} is out of range for a batch of "
                             f"{xc.shape[0]}")
    if out.size:
        (h, w), (oh, ow) = xc.shape[2:], attrs.crop_size
        b = boxes.astype(np.float64).reshape(-1, 4, 1, 1, 1)
        cy = resize_coordinate(NP, "tf_crop_and_resize", np.arange(oh).reshape(1, 1, -1, 1), h, oh, b[:, 0], b[:, 2])
        cx = resize_coordinate(NP, "tf_crop_and_resize", np.arange(ow).reshape(1, 1, 1, -1), w, ow, b[:, 1], b[:, 3])
        n = indices.astype(np.int64).reshape(-1, 1, 1, 1)
        c = np.arange(xc.shape[1]).reshape(1, -1, 1, 1)
        spec = _crop_spec(attrs)
        value = sample(NP, spec, lambda y, z: xc[n, c, y, z], [cy, cx], (h, w))
        out[...] = np.asarray(finish(NP, spec, value, [cy, cx], (h, w), dtype)).astype(dtype)
    return np.ascontiguousarray(out.transpose(["NCHW".index(c) for c in attrs.layout]))


def _crop_compute(attrs, inputs, out_type):
    x, boxes, indices = inputs
    xd, x_read = layout_reader(x, attrs.layout, "NCHW")
    (h, w), (oh, ow) = (xd["H"], xd["W"]), (const(attrs.crop_size[0]), const(attrs.crop_size[1]))
    spec, dtype = _crop_spec(attrs), output_dtype(out_type)

    def f(N, C, H, W):
        n = E.index_check(cast(indices[(N,)], "int64"), xd["N"])
        box = [cast(boxes[(N, const(k))], F64) for k in range(4)]
        cy = resize_coordinate(TE, "tf_crop_and_resize", H, h, oh, box[0], box[2])
        cx = resize_coordinate(TE, "tf_crop_and_resize", W, w, ow, box[1], box[3])
        value = sample(TE, spec, lambda y, z: x_read(N=n, C=C, H=y, W=z), [cy, cx], (h, w))
        return cast(finish(TE, spec, value, [cy, cx], (h, w), dtype), dtype)

    requires = [(E.logical_or(E.logical_and(h > 0, w > 0), E.eq(boxes.shape[0] * oh * ow, 0)),
                 "image.crop_and_resize: cannot crop an empty image")]
    shape = {"N": boxes.shape[0], "C": xd["C"], "H": oh, "W": ow}
    return [layout_compute(shape, attrs.layout, f, "crop_and_resize", requires)]


def _check_crop_types(types, attrs):
    if not is_float_dtype(types[1].dtype) or not is_int_dtype(types[2].dtype) or types[0].dtype == "bool":
        raise TypeInferenceError(f"image.crop_and_resize: expected numeric data, float boxes and integer box_indices, "
                                 f"got {types[0].dtype}, {types[1].dtype} and {types[2].dtype}")


define_shaped(
    "image.crop_and_resize", 3, _crop_logic, _crop_kernel, OpPattern.INJECTIVE,
    attrs=(AttrDef("crop_size", REQUIRED, _sizes_of(2)), AttrDef("layout", "NCHW", layout_of("NCHW")),
           AttrDef("method", "bilinear", one_of("bilinear", "nearest_neighbor")),
           AttrDef("extrapolation_value", 0.0, to_float), AttrDef("out_dtype", "", to_out_dtype)),
    dtype_rule=lambda types, attrs: attrs.out_dtype or types[0].dtype, check_types=_check_crop_types,
    compute=_crop_compute,
    doc="For each box (y1, x1, y2, x2, normalized) of boxes and its image box_indices[i], the crop resized "
        "to crop_size (bilinear or nearest), extrapolation_value outside the image.",
)
