"""Helpers shared by op definitions: broadcasting of typed dims and of run-time shapes, dtype checks,
attribute converters, reduction axes, and registration with attribute normalization."""

from __future__ import annotations

import math

import numpy as np

from ..errors import ExecutionError, ShapeError, TypeInferenceError
from ..ir.types import Any, SymDim, TensorType, TupleType, Type, normalize_dtype
from .registry import AttrDef, OpDef, register_op
from .shape_logic import DataArg, const_int, dim_or, dim_select, is_sym, require, traceable

__all__ = [
    "broadcast_dim", "broadcast_type_shapes", "broadcast_shapes", "expect_tensor", "expect_same_dtype",
    "normalize_axis", "unary_rel", "broadcast_rel", "compare_rel", "identity_shape_func",
    "broadcast_shape_func",
    # dtype classes and checks
    "FLOAT_DTYPES", "SIGNED_INT_DTYPES", "UNSIGNED_INT_DTYPES", "INT_DTYPES", "NUMERIC_DTYPES",
    "ALL_DTYPES", "expect_dtype", "check_kernel_dtype", "type_str",
    # attribute converters (idempotent: normalizing normalized attrs changes nothing)
    "to_bool", "to_int", "to_float", "to_dtype", "to_int_dtype", "to_int_tuple", "to_axes", "to_shape",
    "one_of",
    # axes, reductions, registration
    "normalize_axes", "reduce_axes", "reduced_shape", "expect_scalar", "elemwise_rel",
    "broadcast_rel_checked", "register_checked", "tuple_fields",
    # shape logics
    "broadcast_logic", "identity_logic", "logic_shape_func",
]

FLOAT_DTYPES = ("float16", "float32", "float64")
SIGNED_INT_DTYPES = ("int8", "int16", "int32", "int64")
UNSIGNED_INT_DTYPES = ("uint8", "uint16", "uint32", "uint64")
INT_DTYPES = SIGNED_INT_DTYPES + UNSIGNED_INT_DTYPES
NUMERIC_DTYPES = INT_DTYPES + FLOAT_DTYPES
ALL_DTYPES = ("bool",) + NUMERIC_DTYPES

# Readable names of dtype classes, for error messages.
_DTYPE_CLASS_NAMES = {
    FLOAT_DTYPES: "a float dtype",
    INT_DTYPES: "an integer dtype",
    NUMERIC_DTYPES: "a numeric (non-bool) dtype",
    ("bool",): "bool",
    ("bool",) + INT_DTYPES: "an integer or bool dtype",
    ALL_DTYPES: "any dtype",
}


def type_str(ty) -> str:
    """Render a type for an error message; falls back to a plain rendering if the printer fails."""
    try:
        return repr(ty)
    except Exception:  # the message must come out even while the printer is broken
        if isinstance(ty, TensorType):
            return f"Tensor[{tuple(ty.shape)}, {ty.dtype}]"
        if isinstance(ty, TupleType):
            return "(" + ", ".join(type_str(f) for f in ty.fields) + ")"
        return type(ty).__name__


def expect_tensor(op: str, ty: Type, what: str = "argument") -> TensorType:
    if not isinstance(ty, TensorType):
        raise TypeInferenceError(f"{op}: expected a tensor {what}, got {type_str(ty)}")
    return ty


def expect_same_dtype(op: str, types: list[TensorType]) -> str:
    dtypes = {t.dtype for t in types}
    if len(dtypes) > 1:
        raise TypeInferenceError(f"{op}: arguments must have one dtype, got {', '.join(t.dtype for t in types)}")
    return types[0].dtype


def expect_dtype(op: str, ty: TensorType, allowed: tuple, what: str = "argument") -> str:
    """Check a tensor's dtype against a class of dtypes (``FLOAT_DTYPES`` etc.)."""
    if ty.dtype not in allowed:
        expected = _DTYPE_CLASS_NAMES.get(allowed, "one of " + ", ".join(allowed))
        raise TypeInferenceError(f"{op}: {what} must have {expected}, got {ty.dtype}")
    return ty.dtype


def expect_scalar(op: str, ty: Type, what: str) -> TensorType:
    ty = expect_tensor(op, ty, what)
    if ty.ndim != 0:
        raise TypeInferenceError(f"{op}: {what} must be a scalar (rank-0 tensor), got {type_str(ty)}")
    return ty


def check_kernel_dtype(op: str, arrays, allowed: tuple | None = None, same: bool = True):
    """Kernel-side guard: arrays that would make NumPy promote silently are an ``ExecutionError``."""
    if same and len({a.dtype for a in arrays}) > 1:
        raise ExecutionError(f"{op}: operands must have one dtype, got {', '.join(a.dtype.name for a in arrays)}")
    if allowed is not None:
        for a in arrays:
            if a.dtype.name not in allowed:
                expected = _DTYPE_CLASS_NAMES.get(allowed, "one of " + ", ".join(allowed))
                raise ExecutionError(f"{op}: operand must have {expected}, got {a.dtype.name}")


def normalize_axis(op: str, axis: int, ndim: int, error: type = TypeInferenceError) -> int:
    if not -ndim <= axis < max(ndim, 1):
        raise error(f"{op}: axis {axis} is out of range for rank {ndim}")
    return axis % ndim if ndim else 0


def normalize_axes(op: str, axes, ndim: int, error: type = TypeInferenceError) -> tuple:
    """Map (possibly negative) axes to ``0..ndim-1``; out-of-range or repeated axes raise ``error``."""
    out = []
    for axis in axes:
        if not -ndim <= axis < ndim:
            raise error(f"{op}: axis {axis} is out of range for rank {ndim}")
        axis %= ndim
        if axis in out:
            raise error(f"{op}: axis {axis} is given more than once in {tuple(axes)}")
        out.append(axis)
    return tuple(out)


def reduce_axes(op: str, ndim: int, axis, exclude: bool, error: type = TypeInferenceError) -> tuple:
    """The sorted axes a reduction removes (Relay: ``axis=None`` means all; ``exclude`` complements)."""
    if axis is None:
        return tuple(range(ndim))
    axes = normalize_axes(op, axis, ndim, error)
    if exclude:
        return tuple(i for i in range(ndim) if i not in axes)
    return tuple(sorted(axes))


def reduced_shape(shape: tuple, axes: tuple, keepdims: bool) -> tuple:
    if keepdims:
        return tuple(1 if i in axes else d for i, d in enumerate(shape))
    return tuple(d for i, d in enumerate(shape) if i not in axes)


# ---- attribute converters -------------------------------------------------------------------------


def to_bool(value) -> bool:
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, (int, np.integer)) and value in (0, 1):
        return bool(value)
    raise TypeError(f"expected a bool, got {value!r}")


def to_int(value) -> int:
    if isinstance(value, (bool, np.bool_)):
        raise TypeError(f"expected an int, got the bool {value!r}")
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)) and float(value).is_integer():
        return int(value)
    raise TypeError(f"expected an int, got {value!r}")


def to_float(value) -> float:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise TypeError(f"expected a number, got {value!r}")
    value = float(value)
    if math.isnan(value):
        raise ValueError("NaN is not allowed")
    return value


def to_dtype(value) -> str:
    return normalize_dtype(value)


def to_int_dtype(value) -> str:
    dtype = normalize_dtype(value)
    if dtype not in INT_DTYPES:
        raise ValueError(f"expected an integer dtype, got {dtype}")
    return dtype


def to_int_tuple(value) -> tuple:
    """An int or a sequence of ints, as a tuple of ints."""
    if isinstance(value, (list, tuple)):
        return tuple(to_int(v) for v in value)
    return (to_int(value),)


to_axes = to_int_tuple


def to_shape(value) -> tuple:
    shape = to_int_tuple(value)
    if any(d < 0 for d in shape):
        raise ValueError(f"dimensions must be >= 0, got {shape}")
    return shape


def one_of(*choices):
    def convert(value):
        if value not in choices:
            raise ValueError(f"expected one of {', '.join(map(repr, choices))}")
        return value

    return convert


# ---- broadcasting ---------------------------------------------------------------------------------


def broadcast_dim(op: str, a, b):
    """Broadcast two typed dims. ``Any`` against a static ``k != 1`` optimistically gives ``k``
    (the shape function checks it at run time); two different symbols give ``Any``. Symbolic dims
    (``shape_logic.Sym``, while tracing a C shape function) must be equal or 1; the check is recorded."""
    if is_sym(a) or is_sym(b):
        require(dim_or(dim_or(a == b, a == 1), b == 1), f"{op}: cannot broadcast dimensions {a} and {b}",
                ShapeError)
        return dim_select(a == 1, b, a)
    if a == b:
        return a
    if a == 1:
        return b
    if b == 1:
        return a
    if isinstance(a, int) and isinstance(b, int):
        raise TypeInferenceError(f"{op}: cannot broadcast dimensions {a} and {b}")
    if isinstance(a, int):
        return a
    if isinstance(b, int):
        return b
    if isinstance(a, SymDim) and isinstance(b, Any):
        return Any()
    if isinstance(b, SymDim) and isinstance(a, Any):
        return Any()
    return Any()


def broadcast_type_shapes(op: str, *shapes: tuple) -> tuple:
    ndim = max((len(s) for s in shapes), default=0)
    out = [1] * ndim
    for shape in shapes:
        padded = (1,) * (ndim - len(shape)) + tuple(shape)
        out = [broadcast_dim(op, x, y) for x, y in zip(out, padded, strict=True)]
    return tuple(out)


def broadcast_shapes(op: str, *shapes: tuple) -> tuple:
    """Broadcast concrete run-time shapes; a mismatch is a ``ShapeError`` naming both shapes."""
    ndim = max((len(s) for s in shapes), default=0)
    out = [1] * ndim
    for shape in shapes:
        padded = (1,) * (ndim - len(shape)) + tuple(shape)
        for i, (x, y) in enumerate(zip(out, padded, strict=True)):
            if x == y or y == 1:
                continue
            if x == 1:
                out[i] = y
            else:
                raise ShapeError(
                    f"{op}: cannot broadcast shapes {' and '.join(str(tuple(s)) for s in shapes)} "
                    f"(dimension {i - ndim}: {x} vs {y})"
                )
    return tuple(out)


@traceable
def broadcast_logic(op: str, attrs, shapes, err) -> tuple:
    """The shape logic of the broadcasting ops: run-time ints give ``broadcast_shapes``' exact checks and
    messages, typed dims ``broadcast_type_shapes``' optimistic typing, symbolic dims recorded checks."""
    if err is ShapeError and all(const_int(d) for s in shapes for d in s):
        return broadcast_shapes(op, *shapes)
    return broadcast_type_shapes(op, *shapes)


@traceable
def identity_logic(op: str, attrs, shapes, err) -> tuple:
    """The shape logic of an elementwise op: the (first) input's shape."""
    return tuple(shapes[0])


def _logic_args(opdef: OpDef, args) -> list:
    return [DataArg.of_array(a) if opdef.input_needs_data(i) else _as_shape(a) for i, a in enumerate(args)]


def logic_shape_func(opdef: OpDef, logic=None):
    """The run-time shape function derived from a shape logic: ints in, ``ShapeError`` on a failed check."""
    logic, name = logic or opdef.shape_logic, opdef.name

    def shape_func(attrs, args):
        result = logic(name, attrs, _logic_args(opdef, args), ShapeError)
        return list(result) if isinstance(result, list) else [result]

    return shape_func


def unary_rel(types, attrs, consts=None):
    return types[0]


def broadcast_rel_for(op: str, out_dtype: str | None = None):
    def rel(types, attrs, consts=None):
        ts = [expect_tensor(op, t) for t in types]
        dtype = expect_same_dtype(op, ts)
        return TensorType(broadcast_logic(op, attrs, [t.shape for t in ts], TypeInferenceError), out_dtype or dtype)

    return rel


def broadcast_rel(op: str):
    return broadcast_rel_for(op)


def compare_rel(op: str):
    return broadcast_rel_for(op, "bool")


def broadcast_rel_checked(op: str, allowed: tuple = ALL_DTYPES, out_dtype: str | None = None):
    """A broadcast relation whose arguments share one dtype drawn from ``allowed``."""

    def rel(types, attrs, consts=None):
        ts = [expect_tensor(op, t, f"argument {i}") for i, t in enumerate(types)]
        dtype = expect_same_dtype(op, ts)
        expect_dtype(op, ts[0], allowed, "the arguments")
        return TensorType(broadcast_logic(op, attrs, [t.shape for t in ts], TypeInferenceError), out_dtype or dtype)

    return rel


def elemwise_rel(op: str, allowed: tuple = ALL_DTYPES, out_dtype: str | None = None):
    """The relation of a one-input elementwise op: same shape, dtype from ``allowed``."""

    def rel(types, attrs, consts=None):
        ty = expect_tensor(op, types[0])
        expect_dtype(op, ty, allowed, "the argument")
        return TensorType(ty.shape, out_dtype or ty.dtype)

    return rel


def identity_shape_func(attrs, args):
    return [identity_logic("", attrs, args, ShapeError)]


identity_shape_func.logic = identity_logic  # register_checked makes it the op's shape logic


def broadcast_shape_func_for(op: str):
    def shape_func(attrs, args):
        return [broadcast_logic(op, attrs, args, ShapeError)]

    shape_func.logic = broadcast_logic
    return shape_func


broadcast_shape_func = broadcast_shape_func_for


def tuple_fields(ty: Type) -> list[Type]:
    return list(ty.fields) if isinstance(ty, TupleType) else [ty]


# ---- registration ---------------------------------------------------------------------------------


def _as_shape(value):
    """A run-time shape as a tuple of Python ints (it may come as an int64 array or NumPy ints); a
    tuple-typed input's list of shapes stays a list."""
    if isinstance(value, np.ndarray):
        return tuple(int(d) for d in value.reshape(-1))
    if isinstance(value, (list, tuple)) and value and all(isinstance(d, (int, np.integer)) for d in value):
        return tuple(int(d) for d in value)
    if isinstance(value, list):
        return [_as_shape(v) for v in value]
    return value


def register_checked(opdef: OpDef) -> OpDef:
    """Register ``opdef`` so that its type relation, shape function and kernel always see normalized
    attributes (defaults filled, values converted), whoever calls them and with whatever attrs.

    The arity of a variadic op is the relation's business; a fixed arity is checked here so that
    a wrong call gives a ``TypeInferenceError``/``ShapeError``/``ExecutionError`` rather than a
    ``TypeError`` from deep inside."""
    if opdef.shape_logic is None and getattr(opdef.shape_func, "logic", None) is not None:
        opdef.shape_logic = opdef.shape_func.logic
        opdef.shape_logic_traceable = getattr(opdef.shape_logic, "traceable", False)
    if opdef.shape_func is None and opdef.shape_logic is not None:
        opdef.shape_func = logic_shape_func(opdef)
    rel, shape_func, kernel = opdef.type_rel, opdef.shape_func, opdef.kernel
    name, arity = opdef.name, opdef.num_inputs

    def check_arity(args, error):
        if arity >= 0 and len(args) != arity:
            raise error(f"{name}: expected {arity} argument(s), got {len(args)}")

    def checked_rel(types, attrs, consts=None):
        check_arity(types, TypeInferenceError)
        return rel(list(types), opdef.normalize_attrs(attrs), consts)

    def checked_shape_func(attrs, args):
        check_arity(args, ShapeError)
        args = [arg if opdef.input_needs_data(i) else _as_shape(arg) for i, arg in enumerate(args)]
        return [tuple(int(d) for d in shape) for shape in shape_func(opdef.normalize_attrs(attrs), args)]

    def checked_kernel(attrs, *arrays):
        check_arity(arrays, ExecutionError)
        # Tuple-typed inputs stay Python tuples; anything array-like becomes an ndarray.
        arrays = (a if isinstance(a, tuple) else np.asarray(a) for a in arrays)
        return kernel(opdef.normalize_attrs(attrs), *arrays)

    opdef.type_rel = checked_rel
    opdef.shape_func = checked_shape_func if shape_func is not None else None
    opdef.kernel = checked_kernel
    return register_op(opdef)


# ---- special functions --------------------------------------------------------------------------

# Eight Taylor terms reach 1e-9 relative accuracy for |x| < 0.5.
_ERF_TAYLOR = [2 / math.sqrt(math.pi) * (-1) ** n / (math.factorial(n) * (2 * n + 1)) for n in range(8)]
# Chebyshev fit of erfc (Numerical Recipes' erfcc): fractional error below 1.2e-7 for every x >= 0.
_ERFC_POLY = [-1.26551223, 1.00002368, 0.37409196, 0.09678418, -0.18628806, 0.27886807, -1.13520398,
              1.48851587, -0.82215223, 0.17087277]
_erf_exact = np.frompyfunc(math.erf, 1, 1)


def erf(x: np.ndarray) -> np.ndarray:
    """Vectorized erf in ``x``'s dtype: exact (``math.erf``) for float64, within ~1e-7 relative otherwise.

    Near 0 a Taylor series keeps the relative error small; elsewhere ``1 - erfc`` with a Chebyshev erfc.
    """
    x = np.asarray(x)
    if x.dtype == np.float64:
        return np.asarray(_erf_exact(x), dtype=np.float64)
    z = x.astype(np.float64)
    a = np.abs(z)
    z2 = z * z
    series = np.full_like(z, _ERF_TAYLOR[-1])
    for coef in reversed(_ERF_TAYLOR[:-1]):
        series *= z2
        series += coef
    series *= z
    t = 1.0 / (1.0 + 0.5 * a)
    poly = np.full_like(z, _ERFC_POLY[-1])
    for coef in reversed(_ERFC_POLY[:-1]):
        poly *= t
        poly += coef
    with np.errstate(over="ignore", under="ignore", invalid="ignore"):
        poly -= z2
        tail = np.sign(z) * (1.0 - t * np.exp(poly))
    return np.asarray(np.where(a < 0.5, series, tail), dtype=x.dtype)


def _shape_from_the_argument(value):
    raise ValueError(f"the shape is the run-time argument; only shape=None (as TVM prints it) is accepted, got {value!r}")


# The dyn ops' ``shape`` attribute, which TVM's printer writes as None (the shape is an argument)
DYN_SHAPE_ATTR = AttrDef("shape", None, _shape_from_the_argument, "None: the shape is the argument")
