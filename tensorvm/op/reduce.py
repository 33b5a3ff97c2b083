"""Reductions: sum, mean, max, min, prod, all, any, logsumexp, argmax, argmin, variance, std.

Every reduction takes Relay's attrs ``axis`` (None: all axes; an int or a list), ``keepdims``
(reduced axes stay as size 1) and ``exclude`` (reduce every axis *not* listed). Kernels keep the
input dtype (NumPy would accumulate int32 in int64); ``argmax``/``argmin`` give int32 indices, and
over several axes the index is the row-major position within the reduced axes. Reducing an empty
axis is fine where the reduction has an identity (sum 0, prod 1, all True, any False, logsumexp
-inf, float mean NaN) and a ``ShapeError`` where it has none (max, min, argmax, argmin).
"""

from __future__ import annotations

import math

import numpy as np

from ..errors import ExecutionError, ShapeError, TypeInferenceError
from ..ir.types import TensorType
from ._common import (
    ALL_DTYPES,
    FLOAT_DTYPES,
    NUMERIC_DTYPES,
    check_kernel_dtype,
    expect_dtype,
    expect_tensor,
    reduce_axes,
    reduced_shape,
    register_checked,
    to_axes,
    to_bool,
)
from .registry import AttrDef, OpDef, OpPattern
from .shape_logic import Sym, dim_or, require, traceable

REDUCE_ATTRS = (
    AttrDef("axis", None, to_axes, "axes to reduce (None: all)"),
    AttrDef("keepdims", False, to_bool, "keep reduced axes with size 1"),
    AttrDef("exclude", False, to_bool, "reduce the axes not listed in axis"),
)


def _reduce_logic(needs_identity: bool):
    """The shape logic of a reduction (``needs_identity``: an empty reduced axis is an error)."""

    @traceable
    def logic(op, attrs, shapes, err):
        shape = tuple(shapes[0])
        axes = reduce_axes(op, len(shape), attrs.axis, attrs.exclude, err)
        if needs_identity:
            for i in axes:
                require(shape[i] != 0, f"{op}: cannot reduce an empty axis of shape {shape}; {op} has no identity",
                        err)
        return reduced_shape(shape, axes, attrs.keepdims)

    return logic


def _reduced_type(name: str, data: TensorType, attrs, needs_identity: bool, dtype: str) -> TensorType:
    return TensorType(_reduce_logic(needs_identity)(name, attrs, [data.shape], TypeInferenceError), dtype)


def _kernel_axes(name: str, x: np.ndarray, attrs) -> tuple:
    return reduce_axes(name, x.ndim, attrs.axis, attrs.exclude, ShapeError)


def _register_reduce(name: str, fn, allowed: tuple, out_dtype: str | None = None, needs_identity: bool = False,
                     doc: str = "", extra_attrs: tuple = ()):
    """``fn(x, axes, keepdims, attrs)`` computes the reduction of ``x`` over the tuple ``axes``."""

    def rel(types, attrs, consts=None):
        data = expect_tensor(name, types[0], "data")
        expect_dtype(name, data, allowed, "data")
        return _reduced_type(name, data, attrs, needs_identity, out_dtype or data.dtype)

    def kernel(attrs, x):
        check_kernel_dtype(name, (x,), allowed)
        axes = _kernel_axes(name, x, attrs)
        if needs_identity and any(x.shape[i] == 0 for i in axes):
            raise ShapeError(f"{name}: cannot reduce an empty axis of shape {x.shape}; {name} has no identity")
        with np.errstate(all="ignore"):
            result = fn(x, axes, attrs.keepdims, attrs)
        return np.asarray(result, dtype=out_dtype or x.dtype)

    register_checked(OpDef(
        name=name, num_inputs=1, type_rel=rel, kernel=kernel, pattern=OpPattern.COMM_REDUCE,
        attrs=REDUCE_ATTRS + extra_attrs, shape_logic=_reduce_logic(needs_identity),
        doc=doc or f"Reduce by {name} over the given axes.",
    ))


def _mean(x, axes, keepdims, attrs):
    count = math.prod(x.shape[i] for i in axes)
    if x.dtype.kind == "f":
        # sum / count rather than np.mean: an empty axis gives NaN without a Python warning.
        accumulate = "float32" if x.dtype == np.float16 else x.dtype
        return np.sum(x, axis=axes, keepdims=keepdims, dtype=accumulate) / np.asarray(count, accumulate)
    # Exact integer sum, then the quotient truncated toward zero (as integer division in C).
    # 64-bit sums could overflow even int64, so they add Python ints.
    accumulate = object if x.dtype.itemsize == 8 else "int64"
    total = np.asarray(np.sum(x, axis=axes, keepdims=keepdims, dtype=accumulate))
    if count == 0:
        if total.size == 0:
            return total
        raise ExecutionError(f"mean: cannot average an empty axis of shape {x.shape} in integer dtype {x.dtype}")
    sign = np.where(total < 0, -1, 1).astype(total.dtype)  # object stays object: no int64 overflow
    return (np.abs(total) // count) * sign


def _logsumexp(x, axes, keepdims, attrs):
    if x.dtype == np.float16:  # float16 exp/log lose several ulps; compute in float32 and round once
        x = x.astype(np.float32)
    shift = np.max(x, axis=axes, keepdims=True, initial=-np.inf)
    shift = np.where(np.isfinite(shift), shift, 0).astype(x.dtype)  # all -inf or inf rows: no shift
    total = np.sum(np.exp(x - shift), axis=axes, keepdims=True)
    result = np.log(total) + shift
    return result if keepdims else np.squeeze(result, axis=axes)


def _arg_reduce(select_max: bool):
    def fn(x, axes, keepdims, attrs):
        kept = [i for i in range(x.ndim) if i not in axes]
        # Move the reduced axes last and flatten them: the index is row-major within them.
        reduced_size = math.prod(x.shape[i] for i in axes)
        flat = np.transpose(x, kept + list(axes)).reshape([x.shape[i] for i in kept] + [reduced_size])
        if attrs.select_last_index:
            flat = flat[..., ::-1]
        index = np.argmax(flat, axis=-1) if select_max else np.argmin(flat, axis=-1)
        if attrs.select_last_index:
            index = flat.shape[-1] - 1 - index
        return np.reshape(index, reduced_shape(x.shape, axes, keepdims))

    return fn


_register_reduce("sum", lambda x, axes, k, a: np.sum(x, axis=axes, keepdims=k, dtype=x.dtype), NUMERIC_DTYPES)
_register_reduce("prod", lambda x, axes, k, a: np.prod(x, axis=axes, keepdims=k, dtype=x.dtype), NUMERIC_DTYPES)
_register_reduce("mean", _mean, NUMERIC_DTYPES,
                 doc="Arithmetic mean; for integers the quotient is truncated toward zero.")
_register_reduce("max", lambda x, axes, k, a: np.max(x, axis=axes, keepdims=k), ALL_DTYPES, needs_identity=True)
_register_reduce("min", lambda x, axes, k, a: np.min(x, axis=axes, keepdims=k), ALL_DTYPES, needs_identity=True)
_register_reduce("all", lambda x, axes, k, a: np.all(x, axis=axes, keepdims=k), ("bool",))
_register_reduce("any", lambda x, axes, k, a: np.any(x, axis=axes, keepdims=k), ("bool",))
_register_reduce("logsumexp", _logsumexp, FLOAT_DTYPES, doc="log(sum(exp(x))), computed without overflow.")
for _name, _select_max in [("argmax", True), ("argmin", False)]:
    _register_reduce(
        _name, _arg_reduce(_select_max), ALL_DTYPES, "int32", needs_identity=True,
        extra_attrs=(AttrDef("select_last_index", False, to_bool, "on ties, return the last index"),),
        doc=f"Index (int32) of the {_name[3:]}imum; several axes index them in row-major order.",
    )

# ---- variance and std: (data) or (data, mean) --------------------------------------------------------

MOMENT_ATTRS = REDUCE_ATTRS + (AttrDef("unbiased", False, to_bool, "divide by N - 1 instead of N"),)


def _moment_rel(name: str):
    def rel(types, attrs, consts=None):
        if len(types) not in (1, 2):
            raise TypeInferenceError(f"{name}: expected 1 or 2 arguments (data[, mean]), got {len(types)}")
        data = expect_tensor(name, types[0], "data")
        expect_dtype(name, data, FLOAT_DTYPES, "data")
        if len(types) == 2:
            mean = expect_tensor(name, types[1], "mean")
            if mean.dtype != data.dtype:
                raise TypeInferenceError(f"{name}: mean must have dtype {data.dtype} like data, got {mean.dtype}")
        return TensorType(_moment_logic(name, attrs, [t.shape for t in types], TypeInferenceError), data.dtype)

    return rel


def _check_mean_shape(name: str, data_shape: tuple, mean_shape: tuple, error: type):
    """The mean must broadcast to the data's shape without growing it (unknown dims pass)."""
    message = f"{name}: mean of shape {tuple(mean_shape)} does not broadcast to data of shape {tuple(data_shape)}"
    require(len(mean_shape) <= len(data_shape), message, error)
    # zip pairs trailing dims; the mean may have fewer of them
    for m, d in zip(reversed(mean_shape), reversed(data_shape), strict=False):
        if isinstance(m, (int, Sym)) and isinstance(d, (int, Sym)):
            require(dim_or(m == 1, m == d), message, error)


@traceable
def _moment_logic(op, attrs, shapes, err):
    if len(shapes) not in (1, 2):
        raise err(f"{op}: expected 1 or 2 arguments (data[, mean]), got {len(shapes)}")
    shape = tuple(shapes[0])
    if len(shapes) == 2:
        _check_mean_shape(op, shape, tuple(shapes[1]), err)
    axes = reduce_axes(op, len(shape), attrs.axis, attrs.exclude, err)
    return reduced_shape(shape, axes, attrs.keepdims)


def _moment_kernel(name: str, take_sqrt: bool):
    def kernel(attrs, x, mean=None):
        check_kernel_dtype(name, (x,) if mean is None else (x, mean), FLOAT_DTYPES)
        axes = _kernel_axes(name, x, attrs)
        if mean is not None:
            _check_mean_shape(name, x.shape, mean.shape, ShapeError)
        count = math.prod(x.shape[i] for i in axes)
        with np.errstate(all="ignore"):
            if mean is None:
                mean = np.asarray(_mean(x, axes, True, attrs), dtype=x.dtype)
            deviation = x - mean
            total = np.sum(deviation * deviation, axis=axes, keepdims=attrs.keepdims, dtype=x.dtype)
            # N - 1 for N = 0 would flip the sign of 0 / N; 0 / 0 = NaN like NumPy's var.
            divisor = max(count - int(attrs.unbiased), 0)
            result = total / np.asarray(divisor, dtype=x.dtype)
            if take_sqrt:
                result = np.sqrt(result)
        return np.asarray(result, dtype=x.dtype)

    return kernel


for _name, _sqrt in [("variance", False), ("std", True)]:
    register_checked(OpDef(
        name=_name, num_inputs=-1, type_rel=_moment_rel(_name), kernel=_moment_kernel(_name, _sqrt),
        pattern=OpPattern.COMM_REDUCE, attrs=MOMENT_ATTRS, shape_logic=_moment_logic,
        doc=f"{_name}(data[, mean]): mean((data - mean)^2){' under a square root' if _sqrt else ''}; "
            "the mean is computed (keepdims) when not given; unbiased divides by N - 1.",
    ))
