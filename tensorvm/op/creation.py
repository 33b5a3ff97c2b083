"""Tensor creation: zeros, ones, full (static ``shape`` attribute), their ``dyn.`` forms (shape given as a
run-time 1-D integer tensor), the ``*_like`` family, and arange.

``arange(start, stop, step, dtype)`` takes three scalar tensors, so its length
``max(0, ceil((stop - start) / step))`` is known only from their values: its shape function is
data-dependent, and its type is static only when all three arguments are constants. The length
is computed exactly for integer arguments and in double precision otherwise, by one helper that
the relation, the shape function and the kernel share, so the three always agree.
"""

from __future__ import annotations

import math

import numpy as np

from .. import te
from ..errors import ShapeError, TypeInferenceError
from ..ir.types import Any, TensorType
from ..te.expr import cast, const
from ..te.tensor import Tensor, compute
from ._common import (
    DYN_SHAPE_ATTR,
    INT_DTYPES,
    NUMERIC_DTYPES,
    check_kernel_dtype,
    expect_dtype,
    expect_scalar,
    expect_tensor,
    identity_shape_func,
    register_checked,
    to_dtype,
    to_shape,
    type_str,
)
from ._compute import output_dtype
from .registry import REQUIRED, AttrDef, OpDef, OpPattern
from .shape_logic import DataArg, ceil_length, dim_max, is_finite, require, traceable

# ---- zeros, ones, full ----------------------------------------------------------------------------


def _fill_compute(name: str, value):
    """The compute of ``name``: ``value`` over the ``shape`` attribute, or over the first input's shape."""

    def compute_fn(attrs, inputs, out_type):
        dtype = output_dtype(out_type)
        shape = tuple(attrs.shape) if not inputs else inputs[0].shape
        return [compute(shape, lambda *i: const(value, dtype), name)]

    compute_fn.__name__ = name
    return compute_fn


def _scalar_requirement(op: str, t: Tensor) -> list:
    if t.ndim != 0:
        raise ShapeError(f"{op}: fill_value must be a scalar, got rank {t.ndim}")
    return []


def _constant_fill(name: str, value):
    def rel(types, attrs, consts=None):
        return TensorType(attrs.shape, attrs.dtype)

    def kernel(attrs):
        return np.full(attrs.shape, value, dtype=attrs.dtype)

    register_checked(OpDef(
        name=name, num_inputs=0, type_rel=rel, kernel=kernel, pattern=OpPattern.ELEMWISE,
        attrs=(AttrDef("shape", REQUIRED, to_shape), AttrDef("dtype", "float32", to_dtype)),
        shape_logic=_static_shape_logic, compute=_fill_compute(name, value),
        doc=f"A tensor of the given shape filled with {value}.",
    ))


@traceable
def _static_shape_logic(op, attrs, args, err):
    return tuple(attrs.shape)


_constant_fill("zeros", 0)
_constant_fill("ones", 1)


def _full_rel(types, attrs, consts=None):
    fill = expect_scalar("full", types[0], "fill_value")
    return TensorType(attrs.shape, attrs.dtype or fill.dtype)


def _full_kernel(attrs, fill_value):
    _expect_scalar_value("full", fill_value, "fill_value")
    with np.errstate(all="ignore"):
        return np.full(attrs.shape, fill_value, dtype=attrs.dtype or fill_value.dtype)


def _full_compute(attrs, inputs, out_type):
    fill = inputs[0]
    dtype = output_dtype(out_type)
    return [compute(tuple(attrs.shape), lambda *i: cast(fill[()], dtype), "full", _scalar_requirement("full", fill))]


register_checked(OpDef(
    name="full", num_inputs=1, type_rel=_full_rel, kernel=_full_kernel, pattern=OpPattern.ELEMWISE,
    compute=_full_compute,
    attrs=(AttrDef("shape", REQUIRED, to_shape), AttrDef("dtype", None, to_dtype, "default: fill_value's")),
    shape_logic=_static_shape_logic,
    doc="full(fill_value, shape, dtype): a tensor filled with the scalar fill_value (cast to dtype).",
))

# ---- dyn.zeros, dyn.ones, dyn.full: the shape is a run-time tensor ---------------------------------
# Relay turns zeros(shape_expr) into dyn.zeros when the shape is not a constant. The output's rank is
# the (static) length of the shape tensor; its dims are known only from the tensor's values, so the
# shape function is data-dependent (and the type is exact when the shape is a constant).


def _shape_tensor_type(op: str, ty, consts, index: int) -> tuple:
    shape_t = expect_tensor(op, ty, "shape")
    expect_dtype(op, shape_t, INT_DTYPES, "shape")
    if shape_t.ndim != 1 or not isinstance(shape_t.shape[0], int):
        raise TypeInferenceError(f"{op}: shape must be a 1-D tensor of static length (the output's rank), "
                                 f"got {type_str(shape_t)}")
    if consts is not None and len(consts) > index and consts[index] is not None:
        return _shape_values(op, consts[index], TypeInferenceError)
    return (Any(),) * shape_t.shape[0]


@traceable
def _shape_values_logic(op, attrs, args, err) -> tuple:
    """The output shape held by the (last) data argument: its values, each >= 0."""
    arg = args[-1]
    if arg.values is not None:
        return _shape_values(op, arg.values, err)
    if len(arg.shape) != 1 or arg.dtype not in INT_DTYPES:
        raise err(f"{op}: shape must be a 1-D integer tensor, got {arg.dtype} of shape {arg.shape}")
    values = arg.int_values()
    for v in values:
        require(v >= 0, f"{op}: shape values must be >= 0", err)
    return values


def _shape_values(op: str, value, error: type) -> tuple:
    arr = np.asarray(value)
    if arr.ndim != 1 or arr.dtype.kind not in "iu":
        raise error(f"{op}: shape must be a 1-D integer tensor, got {arr.dtype} of shape {arr.shape}")
    if (arr < 0).any():
        raise error(f"{op}: shape values must be >= 0, got {arr.tolist()}")
    return tuple(int(v) for v in arr)


def _dyn_fill_compute(name: str, fill):
    """The compute of a dyn.* fill: the output dims come from the output array (the shape function gave
    them); ``fill(inputs, dtype)`` is the value."""
    def compute_fn(attrs, inputs, out_type):
        from ._compute import output_dims as _output_dims

        return [te.compute(_output_dims(name, out_type), lambda *i: fill(inputs, out_type.dtype), name)]

    return compute_fn


def _dyn_constant_fill(name: str, value):
    def rel(types, attrs, consts=None):
        return TensorType(_shape_tensor_type(name, types[0], consts, 0), attrs.dtype)

    def kernel(attrs, shape):
        return np.full(_shape_values(name, shape, ShapeError), value, dtype=attrs.dtype)

    register_checked(OpDef(
        name=name, num_inputs=1, type_rel=rel, kernel=kernel, pattern=OpPattern.OPAQUE,
        attrs=(AttrDef("dtype", "float32", to_dtype), DYN_SHAPE_ATTR),
        shape_logic=_shape_values_logic, shape_func_data_dependent=True,
        doc=f"{name}(shape): a tensor of the shape held by the 1-D integer tensor ``shape``, filled with {value}.",
        compute=_dyn_fill_compute(name, lambda inputs, dtype: te.const(value, dtype)),
    ))


_dyn_constant_fill("dyn.zeros", 0)
_dyn_constant_fill("dyn.ones", 1)


def _dyn_full_rel(types, attrs, consts=None):
    fill = expect_scalar("dyn.full", types[0], "fill_value")
    return TensorType(_shape_tensor_type("dyn.full", types[1], consts, 1), attrs.dtype or fill.dtype)


def _dyn_full_kernel(attrs, fill_value, shape):
    _expect_scalar_value("dyn.full", fill_value, "fill_value")
    with np.errstate(all="ignore"):
        return np.full(_shape_values("dyn.full", shape, ShapeError), fill_value,
                       dtype=attrs.dtype or fill_value.dtype)


register_checked(OpDef(
    name="dyn.full", num_inputs=2, type_rel=_dyn_full_rel, kernel=_dyn_full_kernel, pattern=OpPattern.OPAQUE,
    attrs=(AttrDef("dtype", None, to_dtype, "default: fill_value's"), DYN_SHAPE_ATTR),
    shape_logic=_shape_values_logic, shape_func_data_dependent=(False, True),
    doc="dyn.full(fill_value, shape): a tensor of the run-time shape filled with the scalar fill_value.",
    compute=_dyn_fill_compute("dyn.full", lambda inputs, dtype: te.cast(inputs[0][()], dtype)),
))

# ---- zeros_like, ones_like, full_like -------------------------------------------------------------


def _like(name: str, value):
    register_checked(OpDef(
        name=name, num_inputs=1, type_rel=lambda types, attrs, consts=None: expect_tensor(name, types[0], "data"),
        kernel=lambda attrs, data: np.full(data.shape, value, dtype=data.dtype), pattern=OpPattern.ELEMWISE,
        shape_func=identity_shape_func, compute=_fill_compute(name, value),
        doc=f"A tensor like data filled with {value}.",
    ))


_like("zeros_like", 0)
_like("ones_like", 1)


def _full_like_rel(types, attrs, consts=None):
    data = expect_tensor("full_like", types[0], "data")
    expect_scalar("full_like", types[1], "fill_value")
    return data


def _full_like_kernel(attrs, data, fill_value):
    _expect_scalar_value("full_like", fill_value, "fill_value")
    with np.errstate(all="ignore"):
        return np.full(data.shape, fill_value, dtype=data.dtype)


def _full_like_compute(attrs, inputs, out_type):
    data, fill = inputs
    return [compute(data.shape, lambda *i: cast(fill[()], data.dtype), "full_like",
                    _scalar_requirement("full_like", fill))]


register_checked(OpDef(
    name="full_like", num_inputs=2, type_rel=_full_like_rel, kernel=_full_like_kernel,
    pattern=OpPattern.ELEMWISE, shape_func=identity_shape_func, compute=_full_like_compute,
    doc="full_like(data, fill_value): data's shape and dtype, filled with the scalar fill_value.",
))


def _expect_scalar_value(op: str, value: np.ndarray, what: str):
    if value.ndim != 0:
        raise ShapeError(f"{op}: {what} must be a scalar, got an array of shape {value.shape}")


# ---- arange ---------------------------------------------------------------------------------------

ARANGE_ARGS = ("start", "stop", "step")


def arange_length(start, stop, step, error: type = ShapeError) -> int:
    """``max(0, ceil((stop - start) / step))``; exact for integers. ``error`` reports a zero or
    non-finite step and non-finite bounds."""
    values = [np.asarray(v) for v in (start, stop, step)]
    for name, value in zip(ARANGE_ARGS, values, strict=True):
        if value.ndim != 0:
            raise error(f"arange: {name} must be a scalar, got an array of shape {value.shape}")
    if all(v.dtype.kind in "iu" for v in values):
        start, stop, step = (int(v) for v in values)
        if step == 0:
            raise error("arange: step must not be zero")
        return max(0, -((start - stop) // step))  # ceil((stop - start) / step) without rounding
    start, stop, step = (float(v) for v in values)
    if step == 0:
        raise error("arange: step must not be zero")
    if not all(math.isfinite(v) for v in (start, stop, step)):
        raise error(f"arange: start, stop and step must be finite, got {start}, {stop}, {step}")
    return max(0, math.ceil((stop - start) / step))


def to_numeric_dtype(value) -> str:
    dtype = to_dtype(value)
    if dtype not in NUMERIC_DTYPES:
        raise ValueError(f"expected a numeric dtype, got {dtype}")
    return dtype


@traceable
def _arange_logic(op, attrs, args, err):
    """arange's length from the values of start, stop and step: known (run time, constants), unknown
    (type inference: ``Any``) or loaded in C; floor division for integers, a float ceil otherwise."""
    for arg, name in zip(args, ARANGE_ARGS, strict=True):
        if len(arg.shape) != 0:
            raise err(f"arange: {name} must be a scalar, got an array of shape {arg.shape}")
    if all(arg.values is not None for arg in args):
        return (arange_length(*(arg.values for arg in args), error=err),)
    start, stop, step = (arg.item() for arg in args)
    if start is None or stop is None or step is None:
        return (Any(),)
    require(step != 0, "arange: step must not be zero", err)
    if all(arg.dtype in INT_DTYPES for arg in args):
        return (dim_max(0, 0 - (start - stop) // step),)  # ceil((stop - start) / step) without rounding
    for value in (start, stop, step):
        require(is_finite(value), "arange: start, stop and step must be finite", err)
    return (ceil_length(start, stop, step),)


def _arange_rel(types, attrs, consts=None):
    for ty, name in zip(types, ARANGE_ARGS, strict=True):
        expect_dtype("arange", expect_scalar("arange", ty, name), NUMERIC_DTYPES, name)
    args = [DataArg.of_array(c) if c is not None else DataArg(t.shape, t.dtype)
            for t, c in zip(types, list(consts or [None] * 3)[:3], strict=True)]
    return TensorType(_arange_logic("arange", attrs, args, TypeInferenceError), attrs.dtype)


def _arange_kernel(attrs, start, stop, step):
    check_kernel_dtype("arange", (start, stop, step), NUMERIC_DTYPES, same=False)
    length = arange_length(start, stop, step)
    if all(v.dtype.kind in "iu" for v in (start, stop, step)):
        # Every value lies between start and stop, so int64 holds it exactly unless they do not.
        int64 = np.iinfo(np.int64)
        exact = np.int64 if all(int64.min <= int(v) <= int64.max for v in (start, stop)) else object
        values = int(start) + np.arange(length, dtype=exact) * int(step)
        return np.asarray(values.astype(np.float64) if exact is object and attrs.dtype.startswith("float")
                          else values).astype(attrs.dtype)
    with np.errstate(all="ignore"):
        return (float(start) + np.arange(length, dtype=np.float64) * float(step)).astype(attrs.dtype)


def _arange_compute(attrs, inputs, out_type):
    """start + i * step, with the length from the output array (the shape function computed it and
    rejected a zero step): exact in int64 for integer arguments, in float64 otherwise, like the kernel."""
    from ._compute import output_dims as _output_dims

    start, _, step = inputs
    requires = []
    if all(te.expr.dtype_kind(t.dtype) in "iu" for t in inputs):
        acc = "int64"
        for t, name in zip(inputs[:2], ARANGE_ARGS, strict=False):
            if t.dtype == "uint64":  # the kernel's exact (object) path; int64 covers the rest
                requires.append((t[()] <= te.const(np.iinfo(np.int64).max, "uint64"),
                                 f"arange: a uint64 {name} beyond the int64 range is not supported in compiled code"))
    else:
        acc = "float64"
    first, delta = te.cast(start[()], acc), te.cast(step[()], acc)
    return [te.compute(_output_dims("arange", out_type), lambda i: te.cast(first + te.cast(i, acc) * delta,
                                                                          attrs.dtype), "arange", requires)]


register_checked(OpDef(
    name="arange", num_inputs=3, type_rel=_arange_rel, kernel=_arange_kernel, pattern=OpPattern.OPAQUE,
    attrs=(AttrDef("dtype", "float32", to_numeric_dtype),),
    shape_logic=_arange_logic, shape_func_data_dependent=True,
    doc="arange(start, stop, step): start + i * step for i < ceil((stop - start) / step), in dtype.",
    compute=_arange_compute,
))
