"""Relay's nn operators that the core ``nn`` module lacks: ``nn.mirror_pad``, ``dyn.nn.pad`` (pad widths
and value as tensors), ``nn.dilate`` and ``nn.conv1d_transpose``.

``nn.conv1d_transpose`` is the 2-D transposed convolution over a height of 1: its shape logic, kernel
and compute are those of ``nn.conv2d_transpose`` on a view with the H axis inserted before W.
"""

from __future__ import annotations

import numpy as np

from ..errors import AttrError, ShapeError, TypeInferenceError
from ..ir.types import Any, TensorType
from ..te import expr as E
from ..te.expr import cast, const, select
from ..te.tensor import compute
from . import shape_logic as sl
from ._common import INT_DTYPES as _INT_DTYPES
from ._common import expect_tensor
from ._compute import output_dims
from .nn import (
    _conv2d_transpose_compute,
    _conv2d_transpose_kernel,
    _conv2d_transpose_logic,
    _pad_width,
    _positive_int,
)
from .registry import REQUIRED, AttrDef, OpPattern, get_op
from .transform import (
    add_dims,
    define,
    define_shaped,
    expect_int_tensor,
    fmt_shape,
    int_tuple,
    layout_of,
    one_of,
    optional_layout,
    padding_of,
    to_float,
    to_out_dtype,
    unify_dim,
)

__all__: list[str] = []


# ---------------------------------------------------------------------------------------------------
# nn.mirror_pad


@sl.traceable
def _mirror_pad_logic(op, attrs, shapes, err):
    (data,) = shapes
    if len(attrs.pad_width) != len(data):
        raise err(f"{op}: pad_width has {len(attrs.pad_width)} pairs for data of rank {len(data)}")
    # REFLECT does not repeat the edge, so a pad may reach dim - 1; SYMMETRIC repeats it: up to dim
    limit = 1 if attrs.mode == "REFLECT" else 0
    out = []
    for axis, (dim, (before, after)) in enumerate(zip(data, attrs.pad_width, strict=True)):
        if isinstance(dim, (int, sl.Sym)):  # (a known or traced dim)
            sl.require(max(before, after) <= dim - limit, f"{op}: {attrs.mode} padding ({before}, {after}) of dim "
                                                         f"{axis} must be at most {dim - limit} for its size {dim}", err)
        out.append(add_dims(dim, before + after))
    return tuple(out)


def _mirror_index(k, size, mode: str):
    """The source index of position ``k`` (in [-pad, size + pad)) of a mirrored axis."""
    if mode == "REFLECT":
        k = select(k < 0, -k, k)
        return select(k >= size, 2 * (size - 1) - k, k)
    k = select(k < 0, -k - 1, k)
    return select(k >= size, 2 * size - 1 - k, k)


def _mirror_pad_compute(attrs, inputs, out_type):
    x = inputs[0]
    limit = 1 if attrs.mode == "REFLECT" else 0
    requires = [(x.shape[axis] >= max(before, after) + limit,
                 f"nn.mirror_pad: {attrs.mode} padding ({before}, {after}) is too large for dim {axis}")
                for axis, (before, after) in enumerate(attrs.pad_width) if before or after]
    shape = tuple(d + before + after for d, (before, after) in zip(x.shape, attrs.pad_width, strict=True))

    def f(*i):
        return x[tuple(_mirror_index(j - before, d, attrs.mode) if before or after else j
                       for j, d, (before, after) in zip(i, x.shape, attrs.pad_width, strict=True))]

    return [compute(shape, f, "mirror_pad", requires)]


define_shaped(
    "nn.mirror_pad", 1, _mirror_pad_logic,
    lambda attrs, shape, x: np.pad(x, attrs.pad_width, mode=attrs.mode.lower()) if x.ndim else x.copy(),
    OpPattern.INJECTIVE,
    attrs=(AttrDef("pad_width", REQUIRED, _pad_width), AttrDef("mode", "SYMMETRIC", one_of("SYMMETRIC", "REFLECT"))),
    compute=_mirror_pad_compute,
    doc="Pad by mirroring: SYMMETRIC repeats the edge element (pad <= dim), REFLECT does not (pad < dim).",
)


# ---------------------------------------------------------------------------------------------------
# dyn.nn.pad(data, pad_width, pad_value)


def _dyn_pad_widths(op, value, ndim, err) -> tuple:
    arr = np.asarray(value)
    if arr.shape != (ndim, 2) or arr.dtype.kind not in "iu" or (arr < 0).any():
        raise err(f"{op}: pad_width must be ({ndim}, 2) non-negative integers (before, after per dim), got "
                  f"{arr.tolist()!r} of {arr.dtype}")
    return tuple((int(a), int(b)) for a, b in arr)


def _dyn_pad_rel(types, attrs, consts=None):
    op = "dyn.nn.pad"
    data = expect_tensor(op, types[0], "data")
    widths = expect_int_tensor(op, types[1], "pad_width")
    value = expect_tensor(op, types[2], "pad_value")
    if widths.ndim != 2:
        raise TypeInferenceError(f"{op}: pad_width must be 2-D (rank, 2), got {fmt_shape(widths.shape)}")
    unify_dim(op, widths.shape[0], data.ndim, "pad_width's rows and the data's rank", TypeInferenceError)
    unify_dim(op, widths.shape[1], 2, "pad_width's columns and 2 (before, after)", TypeInferenceError)
    if value.ndim != 0 or value.dtype != data.dtype:
        raise TypeInferenceError(f"{op}: pad_value must be a scalar of the data's dtype {data.dtype}, got "
                                 f"{fmt_shape(value.shape)} {value.dtype}")
    if consts is not None and consts[1] is not None:
        pads = _dyn_pad_widths(op, consts[1], data.ndim, TypeInferenceError)
        static = get_op("nn.pad").normalize_attrs({"pad_width": pads, "pad_mode": attrs.pad_mode})
        return get_op("nn.pad").type_rel([data, value], static)
    return TensorType((Any(),) * data.ndim, data.dtype)


def _dyn_pad_static_attrs(attrs, shape, widths, err=ShapeError):
    pads = _dyn_pad_widths("dyn.nn.pad", widths, len(shape), err)
    return get_op("nn.pad").normalize_attrs({"pad_width": pads, "pad_mode": attrs.pad_mode})


@sl.traceable
def _dyn_pad_logic(op, attrs, args, err):
    """Known pad_width: nn.pad's logic. Read in C: a (rank, 2) integer tensor, each width >= 0, the
    mode's condition on a padded dim (reflect: both pads below the dim; edge: a nonempty dim)."""
    shape, widths, value = tuple(args[0]), args[1], tuple(args[2])
    if widths.values is not None:
        return get_op("nn.pad").shape_logic(op, _dyn_pad_static_attrs(attrs, shape, widths.values, err),
                                            [shape, value], err)
    ndim = len(shape)
    if len(widths.shape) != 2 or widths.dtype not in _INT_DTYPES or len(value):
        raise err(f"{op}: expected pad_width ({ndim}, 2) of integers and a scalar pad_value, got "
                  f"{widths.dtype} of shape {fmt_shape(widths.shape)} and {fmt_shape(value)}")
    for got, want in zip(widths.shape, (ndim, 2)):
        sl.require(got == want, f"{op}: pad_width must be ({ndim}, 2), got {fmt_shape(widths.shape)}", err)
    out = []
    for axis, dim in enumerate(shape):
        before, after = widths.item(2 * axis), widths.item(2 * axis + 1)
        sl.require(sl.dim_and(before >= 0, after >= 0), f"{op}: pad_width must be non-negative", err)
        padded = before + after > 0
        if attrs.pad_mode == "reflect":
            sl.require(sl.dim_or(sl.dim_not(padded), sl.dim_max(before, after) < dim),
                       f"{op}: reflect padding of dim {axis} must be smaller than the dim", err)
        if attrs.pad_mode == "edge":
            sl.require(sl.dim_or(sl.dim_not(padded), dim != 0), f"{op}: edge padding of the empty dim {axis}", err)
        out.append(dim + before + after)
    return tuple(out)


def _dyn_pad_kernel(attrs, x, widths, value):
    x = np.asarray(x)
    return get_op("nn.pad").kernel(_dyn_pad_static_attrs(attrs, x.shape, widths), x, value)


def _dyn_pad_compute(attrs, inputs, out_type):
    """The output dims come from the output array; the leading pads are read from pad_width."""
    x, widths, value = inputs
    shape = output_dims("dyn.nn.pad", out_type)
    fill = value[()]
    befores = [cast(widths[(const(axis), const(0))], "int64") for axis in range(x.ndim)]

    def f(*i):
        index, inside = [], []
        for j, d, before in zip(i, x.shape, befores, strict=True):
            k = j - before
            if attrs.pad_mode == "constant":
                inside += [k >= 0, k < d]
                index.append(k)
            elif attrs.pad_mode == "edge":
                index.append(E.minimum(E.maximum(k, 0), d - 1))
            else:
                index.append(_mirror_index(k, d, "REFLECT"))
        return select(E.all_of(*inside), x[tuple(index)], fill) if inside else x[tuple(index)]

    return [compute(shape, f, "dyn_pad")]


define(
    "dyn.nn.pad", 3, _dyn_pad_rel, _dyn_pad_kernel, OpPattern.INJECTIVE,
    attrs=(AttrDef("pad_mode", "constant", one_of("constant", "edge", "reflect")),),
    shape_logic=_dyn_pad_logic, data_dependent=(False, True, False), compute=_dyn_pad_compute,
    doc="nn.pad with pad_width a run-time (rank, 2) integer tensor and pad_value a run-time scalar.",
)


# ---------------------------------------------------------------------------------------------------
# nn.dilate


@sl.traceable
def _dilate_logic(op, attrs, shapes, err):
    (data,) = shapes
    if len(attrs.strides) != len(data):
        raise err(f"{op}: {len(attrs.strides)} strides for data of rank {len(data)}")
    out = []
    for dim, s in zip(data, attrs.strides, strict=True):
        if isinstance(dim, (int, sl.Sym)):
            out.append(sl.dim_select(dim == 0, 0, (dim - 1) * s + 1))
        else:
            out.append(dim if s == 1 else Any())
    return tuple(out)


def _dilate_kernel(attrs, shape, x):
    out = np.full(shape, attrs.dilation_value).astype(x.dtype)
    out[tuple(slice(None, None, s) for s in attrs.strides)] = x
    return out


def _dilate_compute(attrs, inputs, out_type):
    x = inputs[0]
    shape = tuple(E.maximum((d - 1) * s + 1, 0) if s > 1 else d for d, s in zip(x.shape, attrs.strides, strict=True))
    fill = cast(const(attrs.dilation_value, "float64"), x.dtype)

    def f(*i):
        on_grid = [E.eq(E.floormod(j, s), 0) for j, s in zip(i, attrs.strides, strict=True) if s > 1]
        value = x[tuple(E.floordiv(j, s) if s > 1 else j for j, s in zip(i, attrs.strides, strict=True))]
        return select(E.all_of(*on_grid), value, fill) if on_grid else value

    return [compute(shape, f, "dilate")]


define_shaped(
    "nn.dilate", 1, _dilate_logic, _dilate_kernel, OpPattern.INJECTIVE,
    attrs=(AttrDef("strides", REQUIRED, int_tuple(1)), AttrDef("dilation_value", 0.0, to_float)),
    compute=_dilate_compute,
    doc="Insert strides[i] - 1 elements of dilation_value between neighbouring elements of axis i.",
)


# ---------------------------------------------------------------------------------------------------
# nn.conv1d_transpose


def _with_h(layout: str) -> str:
    """A 1-D layout as the 2-D one with a height of 1 (H inserted before W)."""
    w = layout.index("W")
    return layout[:w] + "H" + layout[w:]


_padding2 = padding_of(1, "left, right")


def _one(minimum: int):
    def convert(value):
        items = int_tuple(minimum)(value)
        if len(items) != 1:
            raise ValueError(f"expected one value, got {items}")
        return items

    return convert


def _as_2d_attrs(attrs):
    """The nn.conv2d_transpose attributes of a conv1d_transpose (an AttrError names conv1d_transpose)."""
    try:
        return get_op("nn.conv2d_transpose").normalize_attrs({
            "strides": (1, attrs.strides[0]), "padding": (0, attrs.padding[0], 0, attrs.padding[1]),
            "dilation": (1, attrs.dilation[0]), "groups": attrs.groups, "channels": attrs.channels,
            "kernel_size": None if attrs.kernel_size is None else (1, attrs.kernel_size[0]),
            "output_padding": (0, attrs.output_padding[0]), "data_layout": _with_h(attrs.data_layout),
            "kernel_layout": _with_h(attrs.kernel_layout),
            "out_layout": _with_h(attrs.out_layout) if attrs.out_layout else "", "out_dtype": attrs.out_dtype,
        })
    except AttrError as err:
        raise AttrError(f"nn.conv1d_transpose: {err}") from None


def _insert_h(shape, layout: str):
    w = layout.index("W")
    return tuple(shape[:w]) + (1,) + tuple(shape[w:])


def _drop_h(shape, layout: str):
    h = _with_h(layout).index("H")
    return tuple(shape[:h]) + tuple(shape[h + 1:])


@sl.traceable
def _conv1d_transpose_logic(op, attrs, shapes, err):
    data, weight = shapes
    if len(data) != 3 or len(weight) != 3:
        raise err(f"{op}: data and weight must have rank 3, got {fmt_shape(data)} and {fmt_shape(weight)}")
    attrs2 = _as_2d_attrs(attrs)
    out = _conv2d_transpose_logic(op, attrs2, [_insert_h(data, attrs.data_layout),
                                                _insert_h(weight, attrs.kernel_layout)], err)
    return _drop_h(out, attrs.out_layout or attrs.data_layout)


def _conv1d_transpose_kernel(attrs, shape, x, w):
    out_layout = attrs.out_layout or attrs.data_layout
    out = _conv2d_transpose_kernel(_as_2d_attrs(attrs), _insert_h(shape, out_layout),
                                   x.reshape(_insert_h(x.shape, attrs.data_layout)),
                                   w.reshape(_insert_h(w.shape, attrs.kernel_layout)))
    return out.reshape(shape)


def _height_view(t, layout: str, name: str):
    """``t`` (1-D layout) seen with a height of 1 inserted before W."""
    w = layout.index("W")
    return compute(_insert_h(t.shape, layout), lambda *i: t[i[:w] + i[w + 1:]], name)


def _conv1d_transpose_compute(attrs, inputs, out_type):
    x, w = inputs
    out_layout = attrs.out_layout or attrs.data_layout
    out_4d = TensorType(_insert_h(out_type.shape, out_layout), out_type.dtype)
    (y,) = _conv2d_transpose_compute(_as_2d_attrs(attrs), [_height_view(x, attrs.data_layout, "conv1d_t_data"),
                                                     _height_view(w, attrs.kernel_layout, "conv1d_t_weight")], out_4d)
    h = _with_h(out_layout).index("H")
    return [compute(_drop_h(y.shape, out_layout), lambda *i: y[i[:h] + (const(0),) + i[h:]], "conv1d_transpose")]


define_shaped(
    "nn.conv1d_transpose", 2, _conv1d_transpose_logic, _conv1d_transpose_kernel, OpPattern.OUT_ELEMWISE_FUSABLE,
    attrs=(
        AttrDef("strides", (1,), _one(1)), AttrDef("padding", (0, 0), _padding2, "(left, right); 1 value pads both"),
        AttrDef("dilation", (1,), _one(1)), AttrDef("groups", 1, _positive_int),
        AttrDef("channels", None, _positive_int), AttrDef("kernel_size", None, _one(1)),
        AttrDef("data_layout", "NCW", layout_of("NCW")), AttrDef("kernel_layout", "IOW", layout_of("IOW")),
        AttrDef("out_layout", "", optional_layout("NCW")), AttrDef("output_padding", (0,), _one(0)),
        AttrDef("out_dtype", "", to_out_dtype),
    ),
    dtype_rule=lambda types, attrs: attrs.out_dtype or types[0].dtype,
    check_types=lambda types, attrs: _same_dtype(types),
    compute=_conv1d_transpose_compute,
    doc="1-D transposed convolution; weight (I, O/groups, KW) in IOW (Relay's default); output width "
        "(W - 1) * stride - pad_left - pad_right + dilation * (KW - 1) + output_padding + 1.",
)


def _same_dtype(types):
    if types[0].dtype != types[1].dtype:
        raise TypeInferenceError(f"nn.conv1d_transpose: weight must have the data's dtype {types[0].dtype}, "
                                 f"got {types[1].dtype}")
