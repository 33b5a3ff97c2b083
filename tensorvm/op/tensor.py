"""Elementwise and broadcasting math, comparisons, logic and bitwise ops, ``where``, ``clip`` and casts.

Dtype rules follow Relay: a binary op's arguments share one dtype (there is no implicit
promotion); comparisons give ``bool``; transcendental functions take float tensors; logical ops
take ``bool``; bitwise ops take integers or ``bool``; shifts take integers. Integer ``divide`` and
``mod`` truncate toward zero (C, like TVM), ``floor_divide``/``floor_mod`` round toward negative
infinity; an integer division by zero is an ``ExecutionError`` (in C it would trap). Every kernel
returns its result in the relation's dtype (NumPy would otherwise upcast, e.g. ``exp`` of float16).
"""

from __future__ import annotations

import math

import numpy as np

from ..errors import AttrError, ExecutionError, TypeInferenceError
from ..ir.types import TensorType
from ..te import expr as E
from ..te import intrin as M
from ..te.expr import PrimExpr, cast, const, dtype_kind, eq, ne, select
from ..te.tensor import compute
from ._common import (
    ALL_DTYPES,
    FLOAT_DTYPES,
    INT_DTYPES,
    NUMERIC_DTYPES,
    broadcast_rel_checked,
    broadcast_shape_func_for,
    broadcast_shapes,
    broadcast_type_shapes,
    check_kernel_dtype,
    elemwise_rel,
    erf,
    expect_same_dtype,
    expect_tensor,
    identity_shape_func,
    register_checked,
    to_dtype,
    to_float,
)
from ._compute import broadcast_read, broadcast_shape, float_math, kernel_name, output_dtype, unary_compute
from ._library import product
from .registry import REQUIRED, AttrDef, LibraryKernel, OpDef, OpPattern

BOOL = ("bool",)
INT_OR_BOOL = ("bool",) + INT_DTYPES


def _binary_compute(name: str, fn):
    """The compute of a broadcasting binary op whose output element is ``fn(a, b)`` (te expressions)."""

    def compute_fn(attrs, inputs, out_type):
        a, b = inputs
        shape, requires = broadcast_shape(name, a.shape, b.shape)
        dtype = output_dtype(out_type)
        return [compute(shape, lambda *i: cast(fn(broadcast_read(a, i, shape), broadcast_read(b, i, shape)), dtype),
                        kernel_name(name), requires)]

    compute_fn.__name__ = kernel_name(name)
    return compute_fn


def _binary(name: str, fn, allowed: tuple = NUMERIC_DTYPES, out_dtype: str | None = None, doc: str = "", *,
            element):
    """Register a broadcasting binary op computing ``fn(a, b)`` (NumPy semantics unless ``fn`` says otherwise);
    its compute's output element is ``element(a, b)`` over te expressions."""

    def kernel(attrs, a, b):
        check_kernel_dtype(name, (a, b), allowed)
        out_shape = broadcast_shapes(name, a.shape, b.shape)  # a clear ShapeError instead of NumPy's
        with np.errstate(all="ignore"):
            result = fn(a, b, out_shape)
        return np.asarray(result, dtype=out_dtype or a.dtype)

    register_checked(OpDef(
        name=name, num_inputs=2, type_rel=broadcast_rel_checked(name, allowed, out_dtype), kernel=kernel,
        pattern=OpPattern.BROADCAST, shape_func=broadcast_shape_func_for(name),
        compute=_binary_compute(name, element), doc=doc or f"Elementwise {name} with NumPy broadcasting.",
    ))


def _unary(name: str, fn, allowed: tuple = NUMERIC_DTYPES, out_dtype: str | None = None, doc: str = "", *,
           element):
    """Register an elementwise op computing ``fn(x)``; its compute's output element is ``element(x, attrs)``."""

    def kernel(attrs, x):
        check_kernel_dtype(name, (x,), allowed)
        with np.errstate(all="ignore"):
            result = fn(x)
        return np.asarray(result, dtype=out_dtype or x.dtype)

    register_checked(OpDef(
        name=name, num_inputs=1, type_rel=elemwise_rel(name, allowed, out_dtype), kernel=kernel,
        pattern=OpPattern.ELEMWISE, shape_func=identity_shape_func, compute=unary_compute(name, element),
        doc=doc or f"Elementwise {name}.",
    ))


def _ignore_shape(fn):
    """Adapt a plain NumPy ufunc ``fn(a, b)`` to the ``fn(a, b, out_shape)`` form ``_binary`` calls."""
    return lambda a, b, out_shape: fn(a, b)


# ---- integer division family ----------------------------------------------------------------------


def _check_no_zero_divisor(name: str, b: np.ndarray, out_shape: tuple):
    # An empty result divides nothing, so a zero divisor is harmless there.
    if math.prod(out_shape) and np.any(b == 0):
        raise ExecutionError(f"{name}: integer division by zero")


def _division(name: str, float_fn, int_fn):
    def fn(a, b, out_shape):
        if a.dtype.kind == "f":
            return float_fn(a, b)
        _check_no_zero_divisor(name, b, out_shape)
        return int_fn(a, b)

    return fn


def _trunc_divide_int(a, b):
    # a - fmod(a, b) is an exact multiple of b and cannot overflow, so floor division is exact.
    return np.floor_divide(a - np.fmod(a, b), b)


def _power(a, b, out_shape):
    if a.dtype.kind == "f":
        return np.power(a, b)
    negative = b < 0
    if not np.any(negative):
        return np.power(a, b)
    # Integer a ** -n is 1 / a ** n truncated toward zero: only |a| == 1 survives.
    if math.prod(out_shape) and np.any(negative & (a == 0)):
        raise ExecutionError("power: integer zero raised to a negative power (division by zero)")
    positive_part = np.power(a, np.where(negative, 0, b).astype(b.dtype))
    odd = (b % 2) != 0
    negative_part = np.where(a == 1, 1, np.where(a == -1, np.where(odd, -1, 1), 0)).astype(a.dtype)
    return np.where(negative, negative_part, positive_part)


# ---- binary arithmetic ----------------------------------------------------------------------------


def _te_divide(a, b):
    return E.true_divide(a, b) if dtype_kind(a.dtype) == "f" else E.truncdiv(a, b)


_binary("add", _ignore_shape(np.add), element=lambda a, b: a + b)
_binary("subtract", _ignore_shape(np.subtract), element=lambda a, b: a - b)
_binary("multiply", _ignore_shape(np.multiply), element=lambda a, b: a * b)
_binary("divide", _division("divide", np.true_divide, _trunc_divide_int), element=_te_divide,
        doc="Elementwise division; integers truncate toward zero (C semantics).")
_binary("floor_divide", _division("floor_divide", np.floor_divide, np.floor_divide), element=E.floordiv,
        doc="Elementwise division rounded toward negative infinity.")
_binary("mod", _division("mod", np.fmod, np.fmod), element=E.truncmod,
        doc="Truncated remainder (C fmod / %): the result has the sign of the dividend.")
_binary("floor_mod", _division("floor_mod", np.mod, np.mod), element=E.floormod,
        doc="Floored remainder: the result has the sign of the divisor.")
_binary("power", _power, element=E.power,
        doc="Elementwise power; an integer base to a negative power truncates toward zero like 1 / a**n.")
_binary("maximum", _ignore_shape(np.maximum), ALL_DTYPES, element=E.maximum)
_binary("minimum", _ignore_shape(np.minimum), ALL_DTYPES, element=E.minimum)

# ---- comparisons, logic, bits ---------------------------------------------------------------------

for _name, _fn, _element in [("equal", np.equal, eq), ("not_equal", np.not_equal, ne),
                             ("less", np.less, lambda a, b: a < b),
                             ("less_equal", np.less_equal, lambda a, b: a <= b),
                             ("greater", np.greater, lambda a, b: a > b),
                             ("greater_equal", np.greater_equal, lambda a, b: a >= b)]:
    _binary(_name, _ignore_shape(_fn), ALL_DTYPES, "bool", doc=f"Elementwise {_name}; the result is bool.",
            element=_element)

_binary("logical_and", _ignore_shape(np.logical_and), BOOL, element=E.logical_and)
_binary("logical_or", _ignore_shape(np.logical_or), BOOL, element=E.logical_or)
_binary("logical_xor", _ignore_shape(np.logical_xor), BOOL, element=E.logical_xor)
_binary("bitwise_and", _ignore_shape(np.bitwise_and), INT_OR_BOOL, element=E.bitwise_and)
_binary("bitwise_or", _ignore_shape(np.bitwise_or), INT_OR_BOOL, element=E.bitwise_or)
_binary("bitwise_xor", _ignore_shape(np.bitwise_xor), INT_OR_BOOL, element=E.bitwise_xor)
_binary("left_shift", _ignore_shape(np.left_shift), INT_DTYPES, element=E.left_shift,
        doc="Elementwise a << b (wrapping); a shift count outside [0, bits) gives 0.")
_binary("right_shift", _ignore_shape(np.right_shift), INT_DTYPES, element=E.right_shift,
        doc="Elementwise arithmetic a >> b; a shift count outside [0, bits) gives 0 or -1.")

# ---- unary ----------------------------------------------------------------------------------------


def _sigmoid(x):
    # exp(-|x|) never overflows; both branches are exact rewrites of 1 / (1 + exp(-x)).
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1 / (1 + e), e / (1 + e))


def _integer_identity(fn):
    """Rounding functions leave integers alone (NumPy would turn them into float64)."""
    return lambda x: x.copy() if x.dtype.kind in "iub" else fn(x)


_unary("negative", np.negative, element=lambda x, a: -x)
_unary("abs", np.abs, element=lambda x, a: M.abs(x))
_unary("sign", np.sign, element=lambda x, a: M.sign(x))
_unary("floor", _integer_identity(np.floor), element=lambda x, a: M.floor(x))
_unary("ceil", _integer_identity(np.ceil), element=lambda x, a: M.ceil(x))
_unary("round", _integer_identity(np.round), doc="Round half to even (like NumPy and IEEE rint).",
       element=lambda x, a: M.round(x))
_unary("trunc", _integer_identity(np.trunc), element=lambda x, a: M.trunc(x))
for _name, _fn, _element in [("exp", np.exp, M.exp), ("log", np.log, M.log), ("log2", np.log2, M.log2),
                             ("log10", np.log10, M.log10), ("log1p", np.log1p, M.log1p), ("sqrt", np.sqrt, M.sqrt),
                             ("rsqrt", lambda x: 1 / np.sqrt(x), M.rsqrt), ("tanh", np.tanh, M.tanh),
                             ("sigmoid", _sigmoid, M.sigmoid), ("sin", np.sin, M.sin), ("cos", np.cos, M.cos),
                             ("tan", np.tan, M.tan), ("asin", np.arcsin, M.asin), ("acos", np.arccos, M.acos),
                             ("atan", np.arctan, M.atan), ("sinh", np.sinh, M.sinh), ("cosh", np.cosh, M.cosh),
                             ("asinh", np.arcsinh, M.asinh), ("acosh", np.arccosh, M.acosh),
                             ("atanh", np.arctanh, M.atanh)]:
    _unary(_name, _fn, FLOAT_DTYPES, element=lambda x, a, f=_element: f(x))
_unary("erf", erf, FLOAT_DTYPES, element=float_math(lambda x, a: M.erf(x)))
_unary("isnan", np.isnan, NUMERIC_DTYPES, "bool", element=lambda x, a: M.isnan(x))
_unary("isinf", np.isinf, NUMERIC_DTYPES, "bool", element=lambda x, a: M.isinf(x))
_unary("isfinite", np.isfinite, NUMERIC_DTYPES, "bool", element=lambda x, a: M.isfinite(x))
_unary("logical_not", np.logical_not, BOOL, element=lambda x, a: E.logical_not(x))
_unary("bitwise_not", np.invert, INT_OR_BOOL, element=lambda x, a: E.bitwise_not(x))

# ---- where ----------------------------------------------------------------------------------------


def _where_rel(types, attrs, consts=None):
    roles = ("condition", "x", "y")
    cond, x, y = (expect_tensor("where", t, role) for t, role in zip(types, roles, strict=True))
    dtype = expect_same_dtype("where", [x, y])
    return TensorType(broadcast_type_shapes("where", cond.shape, x.shape, y.shape), dtype)


def _where_kernel(attrs, cond, x, y):
    check_kernel_dtype("where", (x, y))
    broadcast_shapes("where", cond.shape, x.shape, y.shape)
    return np.asarray(np.where(cond.astype(bool, copy=False), x, y), dtype=x.dtype)


def _where_compute(attrs, inputs, out_type):
    c, x, y = inputs
    shape, requires = broadcast_shape("where", c.shape, x.shape, y.shape)

    def f(*i):
        cond = broadcast_read(c, i, shape)
        cond = cond if cond.dtype == "bool" else cast(cond, "bool")
        return select(cond, broadcast_read(x, i, shape), broadcast_read(y, i, shape))

    return [compute(shape, f, "where", requires)]


register_checked(OpDef(
    name="where", num_inputs=3, type_rel=_where_rel, kernel=_where_kernel, pattern=OpPattern.BROADCAST,
    shape_func=broadcast_shape_func_for("where"), compute=_where_compute,
    doc="where(condition, x, y): x where condition is nonzero, else y; all three broadcast.",
))

# ---- clip -----------------------------------------------------------------------------------------


def _check_clip_bounds(attrs):
    if attrs.a_min > attrs.a_max:
        raise AttrError(f"clip: a_min ({attrs.a_min}) must not exceed a_max ({attrs.a_max})")


def _clip_rel(types, attrs, consts=None):
    _check_clip_bounds(attrs)
    return elemwise_rel("clip", NUMERIC_DTYPES)(types, attrs, consts)


def _bound_in_dtype(bound: float, dtype: np.dtype):
    """The bound as a value of ``dtype``: integers truncate it (as a C cast would) and saturate."""
    if dtype.kind == "f":
        with np.errstate(over="ignore"):
            return np.asarray(bound).astype(dtype)
    info = np.iinfo(dtype)
    if bound <= info.min:
        return dtype.type(info.min)
    if bound >= info.max:
        return dtype.type(info.max)
    return dtype.type(math.trunc(bound))


def _clip_kernel(attrs, x):
    check_kernel_dtype("clip", (x,), NUMERIC_DTYPES)
    _check_clip_bounds(attrs)
    lo, hi = _bound_in_dtype(attrs.a_min, x.dtype), _bound_in_dtype(attrs.a_max, x.dtype)
    return np.asarray(np.clip(x, lo, hi), dtype=x.dtype)


def _te_bound(value: float, dtype: str) -> PrimExpr:
    """A clip bound as a value of ``dtype``: integers truncate it and saturate (like the NumPy kernel)."""
    if dtype_kind(dtype) == "f":
        return const(value, dtype)
    lo, hi = E.min_value(dtype), E.max_value(dtype)
    return const(lo if value <= lo else hi if value >= hi else math.trunc(value), dtype)


def _clip_compute(attrs, inputs, out_type):
    x = inputs[0]
    if attrs.a_min > attrs.a_max:
        raise TypeInferenceError(f"clip: a_min ({attrs.a_min}) must not exceed a_max ({attrs.a_max})")
    lo, hi = _te_bound(attrs.a_min, x.dtype), _te_bound(attrs.a_max, x.dtype)
    return [compute(x.shape, lambda *i: E.minimum(E.maximum(x[i], lo), hi), "clip")]


register_checked(OpDef(
    name="clip", num_inputs=1, type_rel=_clip_rel, kernel=_clip_kernel, pattern=OpPattern.ELEMWISE,
    compute=_clip_compute,
    attrs=(AttrDef("a_min", REQUIRED, to_float, "lower bound"), AttrDef("a_max", REQUIRED, to_float, "upper bound")),
    shape_func=identity_shape_func,
    doc="Clamp every element into [a_min, a_max]; for integers the bounds truncate, and saturate at the "
        "dtype's range.",
))

# ---- casts ----------------------------------------------------------------------------------------


def _cast_kernel(attrs, x):
    with np.errstate(all="ignore"):  # float -> int of NaN/inf is undefined in C too; do not warn
        return x.astype(attrs.dtype)


def _cast_like_kernel(attrs, x, like):
    with np.errstate(all="ignore"):
        return x.astype(like.dtype)


def _cast_like_rel(types, attrs, consts=None):
    data = expect_tensor("cast_like", types[0], "data")
    like = expect_tensor("cast_like", types[1], "dtype_like")
    return TensorType(data.shape, like.dtype)


register_checked(OpDef(
    name="cast", num_inputs=1, compute=unary_compute("cast", lambda x, a: x),  # (the compute's final cast)
    type_rel=lambda types, attrs, consts=None: TensorType(expect_tensor("cast", types[0]).shape, attrs.dtype),
    kernel=_cast_kernel, pattern=OpPattern.ELEMWISE, attrs=(AttrDef("dtype", REQUIRED, to_dtype),),
    shape_func=identity_shape_func,
    doc="Convert to another dtype: a float to an integer truncates, and a finite one within int64 wraps to a narrower "
        "or unsigned type as NumPy's cast does (-300.0 to uint32 is 2^32 - 300); NaN, infinities and larger values "
        "give an unspecified integer, as in NumPy and C.",
))


def _reinterpret_rel(types, attrs, consts=None):
    data = expect_tensor("reinterpret", types[0])
    source, target = np.dtype(data.dtype), np.dtype(attrs.dtype)
    if source.itemsize != target.itemsize:
        raise TypeInferenceError(f"reinterpret: {data.dtype} ({8 * source.itemsize} bits) as {attrs.dtype} "
                                 f"({8 * target.itemsize} bits): the widths must be equal")
    if target == np.bool_ and source != np.bool_:
        raise TypeInferenceError(f"reinterpret: {data.dtype} as bool (a byte other than 0 or 1 is no bool)")
    return TensorType(data.shape, attrs.dtype)


def _reinterpret_arguments(attrs, inputs, outputs):
    (data,), (out,) = inputs, outputs
    return [data, product(data.shape) * np.dtype(data.dtype).itemsize, out], []


register_checked(OpDef(
    name="reinterpret", num_inputs=1, type_rel=_reinterpret_rel,
    kernel=lambda attrs, x: (x if x.flags.c_contiguous else x.copy()).view(attrs.dtype), pattern=OpPattern.OPAQUE,
    attrs=(AttrDef("dtype", REQUIRED, to_dtype),), shape_func=identity_shape_func,
    library=LibraryKernel("tv_reinterpret", "algorithm.c", _reinterpret_arguments),
    doc="The same bits read as another dtype of the same width (little endian), as Relay's reinterpret "
        "and ONNX's BitCast; no conversion.",
))


def _cast_like_compute(attrs, inputs, out_type):
    x = inputs[0]
    dtype = output_dtype(out_type)
    return [compute(x.shape, lambda *i: cast(x[i], dtype), "cast_like")]


register_checked(OpDef(
    name="cast_like", num_inputs=2, type_rel=_cast_like_rel, kernel=_cast_like_kernel,
    pattern=OpPattern.ELEMWISE, shape_func=identity_shape_func, compute=_cast_like_compute,
    doc="cast_like(data, dtype_like): cast data to the dtype of dtype_like.",
))
