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

from ..errors import ExecutionError, ShapeError, TypeInferenceError, UnsupportedError
from ..ir.types import TensorType
from ..te import expr as E
from ..te import intrin as M
from ..te.expr import cast, const, dtype_kind, select
from ..te.tensor import Tensor, compute, reduce_axis
from ..te.tensor import argmax as te_argmax
from ..te.tensor import argmin as te_argmin
from ..te.tensor import max as te_max
from ..te.tensor import min as te_min
from ..te.tensor import prod as te_prod
from ..te.tensor import sum as te_sum
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
from ._compute import acc_float, broadcast_read, broadcast_shape, output_dtype, product
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
                     doc: str = "", extra_attrs: tuple = (), compute=None, strategy=None):
    """``fn(x, axes, keepdims, attrs)`` computes the reduction of ``x`` over the tuple ``axes``; ``compute`` is
    the op's tensor-expression compute, ``strategy`` its implementation strategy (or None)."""

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
        attrs=REDUCE_ATTRS + extra_attrs, shape_logic=_reduce_logic(needs_identity), compute=compute,
        strategy=strategy, doc=doc or f"Reduce by {name} over the given axes.",
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


# ---- computes ------------------------------------------------------------------------------------


class _Reduction:
    """The axes of a reduction op and index helpers between the input, the kept dims and the output."""

    def __init__(self, op: str, x: Tensor, attrs):
        self.op, self.x = op, x
        self.axes = reduce_axes(op, x.ndim, attrs.axis, attrs.exclude, TypeInferenceError)
        self.keepdims = attrs.keepdims
        self.kept = tuple(d for a, d in enumerate(x.shape) if a not in self.axes)
        self.out_shape = tuple(const(1) if a in self.axes else d for a, d in enumerate(x.shape)) \
            if self.keepdims else self.kept
        self.count = product(x.shape[a] for a in self.axes)

    def raxes(self, tag: str = "r"):
        return [reduce_axis(self.x.shape[a], f"{tag}{a}") for a in self.axes]

    def full_index(self, kept_index, raxes) -> tuple:
        it, rit = iter(kept_index), iter(raxes)
        return tuple(next(rit).var if a in self.axes else next(it) for a in range(self.x.ndim))

    def kept_index(self, out_index) -> tuple:
        if not self.keepdims:
            return tuple(out_index)
        return tuple(i for a, i in enumerate(out_index) if a not in self.axes)

    def nonempty(self) -> list:
        return [(self.x.shape[a] > 0, f"{self.op}: cannot reduce an empty axis {a}; {self.op} has no identity")
                for a in self.axes]

    def reduce(self, make, name: str, requires=()):
        """A compute over the kept dims: ``make(read, raxes)`` with ``read(full_index)`` reading x."""
        raxes = self.raxes()

        def f(*kept):
            return make(self.full_index(kept, raxes), raxes)

        return compute(self.kept, f, name, requires)

    def output(self, kept_tensor: Tensor, fn, name: str):
        return compute(self.out_shape, lambda *i: fn(kept_tensor[self.kept_index(i)]), name)


def _simple_reduction_compute(name: str, reducer, needs_identity: bool = False):
    def compute_fn(attrs, inputs, out_type):
        x = inputs[0]
        red = _Reduction(name, x, attrs)
        dtype = output_dtype(out_type)
        if not red.keepdims:
            return [red.reduce(lambda idx, raxes: reducer(x[idx], raxes), name,
                               red.nonempty() if needs_identity else ())]
        kept = red.reduce(lambda idx, raxes: reducer(x[idx], raxes), f"{name}_kept",
                          red.nonempty() if needs_identity else ())
        return [red.output(kept, lambda v: cast(v, dtype), name)]

    compute_fn.__name__ = name
    return compute_fn


def _mean_of(red: _Reduction, x: Tensor, name: str):
    """The mean over the kept dims: float sums in the float accumulation dtype, integer sums exact."""
    if dtype_kind(x.dtype) == "f":
        acc = acc_float(x.dtype)
        total = red.reduce(lambda idx, raxes: te_sum(cast(x[idx], acc), raxes), f"{name}_sum")
        return total, lambda v: v / cast(red.count, acc)
    if x.dtype in ("int64", "uint64"):  # (their sum can overflow 64 bits: the NumPy kernel sums exactly)
        raise UnsupportedError(f"{name}: no compute for {x.dtype} (an exact sum needs more than 64 bits)")
    acc = "uint64" if dtype_kind(x.dtype) == "u" else "int64"
    total = red.reduce(lambda idx, raxes: te_sum(cast(x[idx], acc), raxes), f"{name}_sum")
    return total, lambda v: E.truncdiv(v, cast(red.count, acc))


def _mean_compute(attrs, inputs, out_type):
    x = inputs[0]
    red = _Reduction("mean", x, attrs)
    total, finish = _mean_of(red, x, "mean")
    return [red.output(total, lambda v: cast(finish(v), x.dtype), "mean")]


def _mean_strategy(attrs, inputs, out_type):
    """float32 over trailing axes (a global average pool): ``tv_mean_f32`` (``MeanCall``); otherwise the
    generated reduction."""
    from ..codegen.strategy import Implementation, MeanCall, index_expr

    (x,) = inputs
    if x.ndim == 0 or {x.dtype, out_type.dtype} != {"float32"}:
        return []
    axes = reduce_axes("mean", x.ndim, attrs.axis, attrs.exclude, TypeInferenceError)
    if not axes or axes != tuple(range(x.ndim - len(axes), x.ndim)):
        return []
    k = x.ndim - len(axes)
    call = MeanCall(index_expr(product(x.shape[:k])), index_expr(product(x.shape[k:])))
    return [Implementation("rows", True, plevel=20, call=call)]


def _logsumexp_compute(attrs, inputs, out_type):
    x = inputs[0]
    red = _Reduction("logsumexp", x, attrs)
    peak = red.reduce(lambda idx, raxes: te_max(x[idx], raxes), "lse_max")
    # All -inf (or an inf) rows are not shifted, as in the NumPy kernel.
    shift = compute(red.kept, lambda *i: select(M.isfinite(peak[i]), peak[i], const(0, x.dtype)), "lse_shift")
    raxes = red.raxes("s")

    def exp_sum(*kept):
        return te_sum(M.exp(x[red.full_index(kept, raxes)] - shift[kept]), raxes)

    summed = compute(red.kept, exp_sum, "lse_sum")
    result = compute(red.kept, lambda *i: M.log(cast(summed[i], x.dtype)) + shift[i], "lse")
    return [red.output(result, lambda v: v, "logsumexp")]


def _arg_reduction_compute(name: str, reducer):
    def compute_fn(attrs, inputs, out_type):
        x = inputs[0]
        red = _Reduction(name, x, attrs)
        raxes = red.raxes()
        index, _ = compute(red.kept, lambda *kept: reducer(x[red.full_index(kept, raxes)], raxes,
                                                          select_last=attrs.select_last_index),
                           f"{name}_pair", red.nonempty())
        return [red.output(index, lambda v: cast(v, output_dtype(out_type)), name)]

    compute_fn.__name__ = name
    return compute_fn


_register_reduce("sum", lambda x, axes, k, a: np.sum(x, axis=axes, keepdims=k, dtype=x.dtype), NUMERIC_DTYPES,
                 compute=_simple_reduction_compute("sum", lambda v, axes: te_sum(v, axes)))
_register_reduce("prod", lambda x, axes, k, a: np.prod(x, axis=axes, keepdims=k, dtype=x.dtype), NUMERIC_DTYPES,
                 compute=_simple_reduction_compute("prod", lambda v, axes: te_prod(v, axes)))
_register_reduce("mean", _mean, NUMERIC_DTYPES, compute=_mean_compute, strategy=_mean_strategy,
                 doc="Arithmetic mean; for integers the quotient is truncated toward zero.")
_register_reduce("max", lambda x, axes, k, a: np.max(x, axis=axes, keepdims=k), ALL_DTYPES, needs_identity=True,
                 compute=_simple_reduction_compute("max", lambda v, axes: te_max(v, axes), needs_identity=True))
_register_reduce("min", lambda x, axes, k, a: np.min(x, axis=axes, keepdims=k), ALL_DTYPES, needs_identity=True,
                 compute=_simple_reduction_compute("min", lambda v, axes: te_min(v, axes), needs_identity=True))
_register_reduce("all", lambda x, axes, k, a: np.all(x, axis=axes, keepdims=k), ("bool",),
                 compute=_simple_reduction_compute("all", lambda v, axes: te_min(v, axes)))
_register_reduce("any", lambda x, axes, k, a: np.any(x, axis=axes, keepdims=k), ("bool",),
                 compute=_simple_reduction_compute("any", lambda v, axes: te_max(v, axes)))
_register_reduce("logsumexp", _logsumexp, FLOAT_DTYPES, doc="log(sum(exp(x))), computed without overflow.",
                 compute=_logsumexp_compute)
for _name, _select_max, _te_reducer in [("argmax", True, te_argmax), ("argmin", False, te_argmin)]:
    _register_reduce(
        _name, _arg_reduce(_select_max), ALL_DTYPES, "int32", needs_identity=True,
        compute=_arg_reduction_compute(_name, _te_reducer),
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


def _moment_compute(name: str, take_sqrt: bool):
    def compute_fn(attrs, inputs, out_type):
        x = inputs[0]
        red = _Reduction(name, x, attrs)
        if len(inputs) == 2:
            given = inputs[1]
            _, requires = broadcast_shape(name, x.shape, given.shape)

            def mean_at(idx):
                return broadcast_read(given, idx, x.shape)
        else:
            total, finish = _mean_of(red, x, f"{name}_mean")
            m = compute(red.kept, lambda *i: cast(finish(total[i]), x.dtype), f"{name}_mean", ())
            requires = ()

            def mean_at(idx):
                return m[tuple(i for a, i in enumerate(idx) if a not in red.axes)]

        raxes = red.raxes("v")

        def squares(*kept):
            idx = red.full_index(kept, raxes)
            deviation = x[idx] - mean_at(idx)
            return te_sum(deviation * deviation, raxes)

        summed = compute(red.kept, squares, f"{name}_sq", requires)
        divisor = cast(E.maximum(red.count - int(attrs.unbiased), 0), x.dtype)

        def finish_value(v):
            value = cast(v, x.dtype) / divisor
            return M.sqrt(value) if take_sqrt else value

        return [red.output(summed, finish_value, name)]

    compute_fn.__name__ = name
    return compute_fn


for _name, _sqrt in [("variance", False), ("std", True)]:
    register_checked(OpDef(
        name=_name, num_inputs=-1, type_rel=_moment_rel(_name), kernel=_moment_kernel(_name, _sqrt),
        pattern=OpPattern.COMM_REDUCE, attrs=MOMENT_ATTRS, shape_logic=_moment_logic,
        compute=_moment_compute(_name, _sqrt),
        doc=f"{_name}(data[, mean]): mean((data - mean)^2){' under a square root' if _sqrt else ''}; "
            "the mean is computed (keepdims) when not given; unbiased divides by N - 1.",
    ))
