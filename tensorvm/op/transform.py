"""Data-movement operators: the reshape family, transpose, concatenate/split/stack, slicing, gathers and
scatters, broadcasting, tiling and shape queries.

Each op's output-shape logic is written once, over dims that may be ``Any``/``SymDim``. The type relation
calls it with ``TypeInferenceError`` as the error for a static conflict; the shape function (and the
kernel, to validate its inputs) calls it with concrete ints and ``ShapeError``. Compile-time and run-time
shapes therefore cannot drift apart.

The first part of the module holds the attribute converters and dim arithmetic that ``nn.py`` shares.
"""

from __future__ import annotations

import builtins
from collections import Counter
from types import SimpleNamespace

import numpy as np

from .. import te
from ..errors import AttrError, ExecutionError, ShapeError, TypeInferenceError, UnsupportedError
from ..ir.types import Any, SymDim, TensorType, TupleType, normalize_dtype
from ..te import expr as E
from ..te.expr import INDEX_DTYPE, Const, PrimExpr, cast, const, eq, ne, select
from ..te.tensor import Tensor, compute
from ._common import DYN_SHAPE_ATTR, INT_DTYPES, expect_tensor, logic_shape_func
from ._compute import (
    axis_of,
    broadcast_to_shape,
    output_dims,
    output_dtype,
    product,
    require_equal,
    reshape_to,
    same,
    unary_compute,
    unravel,
)
from ._library import dtype_code, same_dims
from .registry import REQUIRED, AttrDef, LibraryKernel, OpDef, OpPattern, get_op, register_op
from .shape_logic import (
    Sym,
    binary,
    const_int,
    dim_and,
    dim_max,
    dim_min,
    dim_not,
    dim_or,
    dim_select,
    is_sym,
    require,
    slice_length,
    supported,
    traceable,
    untraceable,
)

__all__ = ["RESHAPE_ONLY_OPS", "transpose_axes"]

# Ops that only reinterpret the shape of their input (zero-copy); a fused group made only of these
# can become a VM ``reshape_tensor`` instead of a kernel call (TVM's ``relay.reshape_only``).
RESHAPE_ONLY_OPS = frozenset({
    "reshape", "dyn.reshape", "squeeze", "expand_dims", "nn.batch_flatten", "reshape_like", "reverse_reshape",
    "contrib_reverse_reshape",
})

INT32_MAX = 2**31 - 1


# ---------------------------------------------------------------------------------------------------
# Attribute converters (raise TypeError/ValueError; ``OpDef.normalize_attrs`` turns that into AttrError).
# Every converter is idempotent: normalizing already-normalized attributes changes nothing.


def to_int(value) -> int:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"expected an integer, got {value!r}")
    return int(value)


def to_bool(value) -> bool:
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, (int, np.integer)) and value in (0, 1):
        return bool(value)
    raise TypeError(f"expected a boolean, got {value!r}")


def to_float(value) -> float:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise TypeError(f"expected a number, got {value!r}")
    return float(value)


def to_dtype(value) -> str:
    return normalize_dtype(value)


def to_int_dtype(value) -> str:
    dtype = normalize_dtype(value)
    if not np.issubdtype(np.dtype(dtype), np.integer):
        raise ValueError(f"expected an integer dtype, got {dtype}")
    return dtype


def to_out_dtype(value) -> str:
    """An output dtype where ``""`` means "the same as the input"."""
    return "" if value == "" else normalize_dtype(value)


def one_of(*choices):
    def convert(value):
        if value not in choices:
            raise ValueError(f"expected one of {', '.join(map(repr, choices))}, got {value!r}")
        return value

    return convert


def int_tuple(minimum: int | None = None, nonempty: bool = False):
    """A tuple of ints; a single int ``v`` becomes ``(v,)``."""

    def convert(value):
        if isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_)):
            value = (value,)
        if not isinstance(value, (tuple, list)):
            raise TypeError(f"expected a tuple of integers, got {value!r}")
        items = tuple(to_int(v) for v in value)
        if nonempty and not items:
            raise ValueError("expected at least one value")
        if minimum is not None and any(v < minimum for v in items):
            raise ValueError(f"every value must be >= {minimum}, got {items}")
        return items

    return convert


def int_ntuple(n: int, minimum: int = 1):
    """An ``n``-tuple of ints (one per spatial dim); one value ``v`` means ``(v,) * n``."""
    as_tuple = int_tuple(minimum)

    def convert(value):
        items = as_tuple(value)
        if len(items) == 1:
            items = items * n
        if len(items) != n:
            raise ValueError(f"expected 1 or {n} values, got {len(items)}")
        return items

    return convert


def int_pair(minimum: int = 1):
    """A 2-tuple of ints for (height, width); one value ``v`` means ``(v, v)``."""
    return int_ntuple(2, minimum)


def padding_of(dims: int, sides: str = ""):
    """Padding of ``dims`` spatial dims as (begins..., ends...): 1 value pads every side, ``dims`` values pad both
    sides of each dim, ``2 * dims`` values are taken as they are (``sides`` names their order in the message)."""
    counts = sorted({1, dims, 2 * dims})
    expected = ", ".join(map(str, counts[:-1])) + f" or {counts[-1]}"

    def convert(value):
        items = int_tuple(0)(value)
        if len(items) == 1:
            return items * (2 * dims)
        if len(items) == dims:
            return items * 2
        if len(items) == 2 * dims:
            return items
        raise ValueError(f"expected {expected} padding values{f' ({sides})' if sides else ''}, got {len(items)}")

    return convert


# 2-D padding as (top, left, bottom, right): 1 value pads all sides, 2 mean (vertical, horizontal)
padding4 = padding_of(2)


def layout_of(canonical: str):
    """A data layout: any ordering of the letters of ``canonical`` (e.g. NHWC for NCHW)."""

    def convert(value):
        if not isinstance(value, str) or sorted(value) != sorted(canonical):
            raise ValueError(f"expected a layout made of the letters {canonical} (e.g. {canonical}), got {value!r}")
        return value

    return convert


def optional_layout(canonical: str):
    """An output layout where ``""`` means "the same as the input layout"."""
    convert = layout_of(canonical)
    return lambda value: "" if value == "" else convert(value)


# ---------------------------------------------------------------------------------------------------
# Dim arithmetic over int | Any | SymDim.


def unify_dim(op: str, a, b, what: str, err=TypeInferenceError):
    """Two dims that must be equal: a static conflict raises ``err``; returns the most precise of them
    (a symbolic pair records the check)."""
    if is_sym(a) or is_sym(b):
        require(a == b, f"{op}: {what} must match, got {a} and {b}", err)
        return b if isinstance(b, int) else a
    if isinstance(a, int) and isinstance(b, int):
        if a != b:
            raise err(f"{op}: {what} must match, got {a} and {b}")
        return a
    if isinstance(a, int):
        return a
    if isinstance(b, int):
        return b
    return a if isinstance(a, SymDim) else b


def mul_dims(a, b):
    if is_sym(a) or is_sym(b):
        return binary("*", a, b)
    if isinstance(a, int) and isinstance(b, int):
        return a * b
    if a == 1 or b == 0:
        return b
    if b == 1 or a == 0:
        return a
    return Any()


def add_dims(a, b):
    if is_sym(a) or is_sym(b):
        return binary("+", a, b)
    if isinstance(a, int) and isinstance(b, int):
        return a + b
    if a == 0:
        return b
    if b == 0:
        return a
    return Any()


class _Product:
    """A product of dims: an int coefficient times named symbols; ``unknown`` if an ``Any`` is involved.
    ``traced`` is the product as a symbolic C expression when a dim is one (``shape_logic.Sym``)."""

    def __init__(self, dims):
        self.coef, self.symbols, self.unknown = 1, Counter(), False
        dims = list(dims)
        self.traced = None
        if any(is_sym(d) for d in dims):
            self.traced = 1
            for d in dims:
                self.traced = binary("*", self.traced, d)
            return
        for d in dims:
            if isinstance(d, int):
                self.coef *= d
            elif isinstance(d, SymDim):
                self.symbols[d.name] += 1
            else:
                self.unknown = True

    @property
    def static(self) -> bool:
        return self.traced is None and not self.unknown and not self.symbols

    def as_dim(self):
        if self.traced is not None:
            return self.traced
        if self.coef == 0:
            return 0
        if self.static:
            return self.coef
        if not self.unknown and self.coef == 1 and sum(self.symbols.values()) == 1:
            return SymDim(next(iter(self.symbols)))
        return Any()

    def __str__(self):
        return " * ".join([str(self.coef)] + [f"{k}^{v}" if v > 1 else k for k, v in self.symbols.items()])


def prod_dims(dims):
    return _Product(dims).as_dim()


def _divide_products(op: str, num: _Product, den: _Product, err, what: str):
    """``num / den`` as a dim, e.g. to infer a reshape's -1; a static non-divisible case raises ``err``."""
    if num.traced is not None or den.traced is not None:
        n, d = num.as_dim(), den.as_dim()
        require(d != 0, f"{op}: cannot infer {what}: the other dimensions have zero elements", err)
        require(n % d == 0, f"{op}: cannot infer {what}: {n} elements are not divisible by {d}", err)
        return n // d
    if num.coef == 0 and not num.unknown:
        if den.coef == 0 and den.static:
            raise err(f"{op}: cannot infer {what}: the other dimensions have zero elements")
        return 0
    if num.unknown or den.unknown or any(num.symbols[k] < v for k, v in den.symbols.items()):
        return Any()
    if den.coef == 0:
        raise err(f"{op}: cannot infer {what}: the other dimensions have zero elements")
    remaining = num.symbols - den.symbols
    if num.coef % den.coef:
        if not remaining:
            raise err(f"{op}: cannot infer {what}: {num} elements are not divisible by {den}")
        return Any()
    quotient = num.coef // den.coef
    if not remaining:
        return quotient
    if quotient == 1 and sum(remaining.values()) == 1:
        return SymDim(next(iter(remaining)))
    return Any()


def same_size(op: str, in_shape, out_shape, err):
    """Check that a reshape keeps the number of elements whenever that can be decided statically."""
    a, b = _Product(in_shape), _Product(out_shape)
    if a.traced is not None or b.traced is not None:
        require(a.as_dim() == b.as_dim(), f"{op}: cannot reshape {fmt_shape(in_shape)} to {fmt_shape(out_shape)}", err)
        return
    # Only a fully static pair is a certain conflict (a symbolic dim might be 0 at run time).
    if a.static and b.static and a.coef != b.coef:
        raise err(f"{op}: cannot reshape {fmt_shape(in_shape)} ({a} elements) to {fmt_shape(out_shape)} ({b} elements)")


def norm_axis(op: str, axis: int, ndim: int, err=TypeInferenceError, what: str = "axis") -> int:
    if not -ndim <= axis < ndim:
        raise err(f"{op}: {what} {axis} is out of range for a tensor of rank {ndim}")
    return axis % ndim


def fmt_shape(shape) -> str:
    return "(" + ", ".join(map(str, shape)) + ("," if len(shape) == 1 else "") + ")"


def concrete(shape) -> tuple:
    """A run-time shape (a tuple, list or int64 array) as a tuple of Python ints."""
    return tuple(int(d) for d in shape)


def is_int_dtype(dtype: str) -> bool:
    return dtype.startswith(("int", "uint"))


def is_float_dtype(dtype: str) -> bool:
    return dtype.startswith("float")


def expect_int_tensor(op: str, ty, what: str) -> TensorType:
    t = expect_tensor(op, ty, what)
    if not is_int_dtype(t.dtype):
        raise TypeInferenceError(f"{op}: {what} must have an integer dtype, got {t.dtype}")
    return t


def expect_same_dtype(op: str, a: TensorType, b: TensorType, what: str):
    if a.dtype != b.dtype:
        raise TypeInferenceError(f"{op}: {what} must have the data's dtype {a.dtype}, got {b.dtype}")


def define(name: str, num_inputs: int, type_rel, kernel, pattern: OpPattern, attrs=(), shape_func=None,
           data_dependent=False, doc: str = "", compute=None, strategy=None, library=None,
           shape_logic=None) -> OpDef:
    """Register an op whose type relation, shape function and kernel always see normalized attributes.
    Given a ``shape_logic`` (``OpDef.shape_logic``) and no ``shape_func``, the shape function is derived
    from the logic."""
    opdef = OpDef(name=name, num_inputs=num_inputs, type_rel=type_rel, kernel=kernel, pattern=pattern,
                  attrs=attrs, shape_func=shape_func, shape_func_data_dependent=data_dependent, doc=doc,
                  compute=compute, strategy=strategy, library=library, shape_logic=shape_logic)
    if shape_func is None and shape_logic is not None:
        shape_func = logic_shape_func(opdef)
    required = [a.name for a in opdef.attrs if a.default is REQUIRED]

    def norm(attrs):
        attrs = opdef.normalize_attrs(attrs)
        for key in required:  # the registry does not convert None, so reject it here
            if attrs[key] is None:
                raise AttrError(f"{name}: attribute {key!r} is required, got None")
        return attrs

    def arity(args, error):
        if num_inputs >= 0 and len(args) != num_inputs:
            raise error(f"{name}: expected {num_inputs} argument(s), got {len(args)}")

    def checked_type_rel(types, attrs, consts=None):
        arity(types, TypeInferenceError)
        return type_rel(types, norm(attrs), consts)

    def checked_kernel(attrs, *args):
        arity(args, ExecutionError)
        return kernel(norm(attrs), *args)

    opdef.type_rel, opdef.kernel = checked_type_rel, checked_kernel
    if shape_func is not None:
        opdef.shape_func = lambda attrs, args: shape_func(norm(attrs), args)
    return register_op(opdef)


def define_shaped(name: str, num_inputs: int, logic, kernel, pattern: OpPattern, attrs=(), dtype_rule=None,
                  check_types=None, doc: str = "", compute=None, strategy=None, library=None,
                  traceable: bool = False) -> OpDef:
    """Register a one-output op from its shape logic ``logic(op, attrs, shapes, err) -> shape``.

    ``traceable``: the logic checks symbolic dims only through ``shape_logic``'s helpers, so it traces
    into a C shape function (``OpDef.shape_logic_traceable``; checked by tests/ops/test_shape_logic.py);
    a logic decorated with ``shape_logic.traceable`` says so itself.

    ``dtype_rule(types, attrs)`` gives the output dtype (default: the first input's);
    ``check_types(types, attrs)`` checks dtypes; the kernel is called with validated inputs.
    """

    def type_rel(types, attrs, consts=None):
        tensors = [expect_tensor(name, t, f"argument {i}") for i, t in enumerate(types)]
        if check_types is not None:
            check_types(tensors, attrs)
        shape = logic(name, attrs, [t.shape for t in tensors], TypeInferenceError)
        dtype = dtype_rule(tensors, attrs) if dtype_rule else tensors[0].dtype
        return TensorType(tuple(shape), dtype)

    def shape_func(attrs, shapes):
        return [tuple(int(d) for d in logic(name, attrs, [concrete(s) for s in shapes], ShapeError))]

    def checked_kernel(attrs, *arrays):
        arrays = [np.asarray(a) for a in arrays]
        out_shape = tuple(logic(name, attrs, [a.shape for a in arrays], ShapeError))
        out = np.asarray(kernel(attrs, out_shape, *arrays))
        return out

    opdef = define(name, num_inputs, type_rel, checked_kernel, pattern, attrs, shape_func, doc=doc, compute=compute,
                   strategy=strategy, library=library)
    opdef.shape_logic, opdef.shape_logic_traceable = logic, traceable or getattr(logic, "traceable", False)
    return opdef


# ---------------------------------------------------------------------------------------------------
# reshape family


def reshape_dims(op: str, in_shape, newshape, allowzero: bool, err):
    """Relay's ``reshape`` with special values: 0 copies a dim, -1 infers one, -2 copies all remaining,
    -3 merges two consecutive dims, -4 splits one dim into the next two values (one may be -1)."""
    ndim = len(in_shape)
    out, infer_at, src, i = [], None, 0, 0

    def source(count: int = 1):
        if src + count > ndim:
            raise err(f"{op}: newshape {fmt_shape(newshape)} refers to more dimensions than the input's "
                      f"{fmt_shape(in_shape)} has")
        return in_shape[src:src + count]

    while i < len(newshape):
        value = newshape[i]
        if value > 0 or (value == 0 and allowzero):
            out.append(value)
            src += 1
        elif value == 0:
            out.append(source()[0])
            src += 1
        elif value == -1:
            if infer_at is not None:
                raise err(f"{op}: newshape {fmt_shape(newshape)} has more than one -1")
            infer_at = len(out)
            out.append(1)
            src += 1
        elif value == -2:
            out.extend(in_shape[src:])
            src = ndim
        elif value == -3:
            first, second = source(2)
            out.append(mul_dims(first, second))
            src += 2
        elif value == -4:
            if i + 2 >= len(newshape):
                raise err(f"{op}: -4 in newshape {fmt_shape(newshape)} must be followed by two values")
            (dim,) = source()
            d0, d1 = newshape[i + 1], newshape[i + 2]
            if d0 == -1 and d1 == -1 or min(d0, d1) < -1 or 0 in (d0, d1):
                raise err(f"{op}: -4 must be followed by two positive values (at most one -1), got {d0}, {d1}")
            if d0 == -1:
                d0 = _divide_products(op, _Product([dim]), _Product([d1]), err, "the -1 after -4")
            elif d1 == -1:
                d1 = _divide_products(op, _Product([dim]), _Product([d0]), err, "the -1 after -4")
            elif isinstance(dim, int) or is_sym(dim):
                require(dim == d0 * d1, f"{op}: -4 splits dimension {dim} into {d0} x {d1}, which does not multiply "
                                        f"to it", err)
            out.extend([d0, d1])
            src += 1
            i += 2
        else:
            raise err(f"{op}: invalid value {value} in newshape {fmt_shape(newshape)}")
        i += 1
    if infer_at is not None:
        rest = _Product(out[:infer_at] + out[infer_at + 1:])
        out[infer_at] = _divide_products(op, _Product(in_shape), rest, err, "the -1 dimension")
    same_size(op, in_shape, out, err)
    return tuple(out)


@traceable
def _reshape_logic(op, attrs, shapes, err):
    return reshape_dims(op, shapes[0], attrs.newshape, attrs.allowzero, err)


def _te_reshape_dims(op: str, in_shape: tuple, newshape: tuple, allowzero: bool):
    """Relay's reshape dims (0, -1, -2, -3, -4) over te dims, with run-time requirements."""
    out, requires, infer_at, src, i = [], [], None, 0, 0
    while i < len(newshape):
        value = newshape[i]
        if value > 0 or (value == 0 and allowzero):
            out.append(const(value))
            src += 1
        elif value == 0:
            out.append(in_shape[src])
            src += 1
        elif value == -1:
            infer_at = len(out)
            out.append(None)
            src += 1
        elif value == -2:
            out.extend(in_shape[src:])
            src = len(in_shape)
        elif value == -3:
            out.append(in_shape[src] * in_shape[src + 1])
            src += 2
        elif value == -4:
            dim, d0, d1 = in_shape[src], newshape[i + 1], newshape[i + 2]
            if d0 == -1:
                d0 = E.floordiv(dim, d1)
                requires.append((eq(E.floormod(dim, d1), 0), f"{op}: dim {dim!r} is not divisible by {d1}"))
            elif d1 == -1:
                d1 = E.floordiv(dim, d0)
                requires.append((eq(E.floormod(dim, d0), 0), f"{op}: dim {dim!r} is not divisible by {d0}"))
            out.extend([const(d0) if isinstance(d0, int) else d0, const(d1) if isinstance(d1, int) else d1])
            src += 1
            i += 2
        else:
            raise TypeInferenceError(f"{op}: invalid value {value} in newshape {newshape}")
        i += 1
    if infer_at is not None:
        rest = product(d for k, d in enumerate(out) if k != infer_at)
        total = product(in_shape)
        requires.append((ne(rest, 0), f"{op}: cannot infer the -1 dimension: the other dims have no elements"))
        out[infer_at] = E.floordiv(total, E.maximum(rest, 1))
    return tuple(out), requires


def _reshape_compute(attrs, inputs, out_type):
    x = inputs[0]
    shape, requires = _te_reshape_dims("reshape", x.shape, attrs.newshape, attrs.allowzero)
    return [reshape_to("reshape", x, shape, requires)]


define_shaped(
    "reshape", 1, _reshape_logic, lambda attrs, shape, x: x.reshape(shape), OpPattern.INJECTIVE,
    attrs=(AttrDef("newshape", REQUIRED, int_tuple(-4)), AttrDef("allowzero", False, to_bool)),
    doc="Reshape to ``newshape`` (with Relay's special values 0, -1, -2, -3, -4).",
    compute=_reshape_compute,
)


def _dyn_newshape_values(op: str, values, err) -> tuple:
    values = np.asarray(values)
    if values.ndim != 1 or not np.issubdtype(values.dtype, np.integer):
        raise err(f"{op}: newshape must be a 1-D integer tensor, got shape {values.shape} of {values.dtype}")
    return tuple(int(v) for v in values)


def _dyn_reshape_dims(op: str, in_shape, values, allowzero: bool, err) -> tuple:
    """reshape's dims for a newshape known only at run time: its length is the output's rank (Relay's
    typing of dyn.reshape), so -2, -3 and -4 may appear only where they keep that rank."""
    out = reshape_dims(op, in_shape, values, allowzero, err)
    if len(out) != len(values):
        raise err(f"{op}: newshape {fmt_shape(values)} gives rank {len(out)} for data {fmt_shape(in_shape)}, but "
                  f"dyn.reshape's rank is the length of newshape ({len(values)}); use reshape for -2/-3/-4 that "
                  f"change the rank")
    return out


def _dyn_reshape_rel(types, attrs, consts=None):
    op = "dyn.reshape"
    data = expect_tensor(op, types[0], "data")
    newshape = expect_int_tensor(op, types[1], "newshape")
    if newshape.ndim != 1:
        raise TypeInferenceError(f"{op}: newshape must be 1-D, got rank {newshape.ndim}")
    if consts and consts[1] is not None:
        values = _dyn_newshape_values(op, consts[1], TypeInferenceError)
        return TensorType(_dyn_reshape_dims(op, data.shape, values, attrs.allowzero, TypeInferenceError), data.dtype)
    (length,) = newshape.shape
    if not isinstance(length, int):
        raise TypeInferenceError(f"{op}: the length of newshape must be static to know the output rank, got {length}")
    return TensorType((Any(),) * length, data.dtype)


def _dyn_reshape_shape(attrs, args):
    values = _dyn_newshape_values("dyn.reshape", args[1], ShapeError)
    return [_dyn_reshape_dims("dyn.reshape", concrete(args[0]), values, attrs.allowzero, ShapeError)]


@traceable
def _dyn_reshape_logic(op, attrs, args, err):
    """dyn.reshape's dims: ``reshape_dims`` once the values are known; traced, the common values (> 0,
    0 and one -1) become C selects, and -2/-3/-4 read from data are left to the host (``supported``)."""
    shape, newshape = args
    if newshape.values is not None:
        values = _dyn_newshape_values(op, newshape.values, err)
        return _dyn_reshape_dims(op, tuple(shape), values, attrs.allowzero, err)
    if len(newshape.shape) != 1 or not is_int_dtype(newshape.dtype):
        raise err(f"{op}: newshape must be a 1-D integer tensor, got shape {newshape.shape} of {newshape.dtype}")
    values = newshape.int_values()
    ndim, text = len(shape), f"newshape of {op}"
    out, minus_ones = [], 0
    for i, v in enumerate(values):
        supported(v >= -1, f"{op}: -2, -3 and -4 in a newshape read at run time are left to the host")
        if attrs.allowzero:
            copied = 0
        elif i < ndim:
            copied = shape[i]
        else:
            require(v != 0, f"{op}: a 0 in {text} at position {i} refers to a dimension the input lacks", err)
            copied = 0
        out.append(dim_select(v == 0, copied, v))
        minus_ones = minus_ones + dim_select(v == -1, 1, 0)
    require(minus_ones <= 1, f"{op}: {text} has more than one -1", err)
    total = prod_dims(shape)
    known = prod_dims([dim_select(v == -1, 1, d) for v, d in zip(values, out, strict=True)])
    has_minus = minus_ones == 1
    require(dim_or(dim_not(has_minus), known != 0),
            f"{op}: cannot infer the -1 dimension: the other dimensions have zero elements", err)
    require(dim_or(dim_not(has_minus), total % known == 0),
            f"{op}: cannot infer the -1 dimension: {total} elements are not divisible by {known}", err)
    out = [dim_select(v == -1, total // known, d) for v, d in zip(values, out, strict=True)]
    require(total == prod_dims(out), f"{op}: cannot reshape {fmt_shape(shape)} to {text}", err)
    return tuple(out)


def _dyn_reshape_kernel(attrs, data, newshape):
    (shape,) = _dyn_reshape_shape(attrs, [data.shape, newshape])
    return np.asarray(data).reshape(shape)


def _dyn_reshape_compute(name: str):
    """The compute of a dyn reshape-like op: its output dims come from the output array."""
    def compute_fn(attrs, inputs, out_type):
        return [reshape_to(name, inputs[0], output_dims(name, out_type))]

    return compute_fn


define(
    "dyn.reshape", 2, _dyn_reshape_rel, _dyn_reshape_kernel, OpPattern.INJECTIVE,
    attrs=(AttrDef("allowzero", False, to_bool),), shape_logic=_dyn_reshape_logic, data_dependent=(False, True),
    doc="Reshape to a shape given as a run-time 1-D integer tensor (reshape's special values 0, -1, -2, -3, -4; "
        "the output's rank is the length of newshape).",
    compute=_dyn_reshape_compute("dyn.reshape"),
)


@traceable
def _reshape_like_logic(op, attrs, shapes, err):
    data, like = shapes
    lhs_end = len(data) if attrs.lhs_end is None else attrs.lhs_end
    rhs_end = len(like) if attrs.rhs_end is None else attrs.rhs_end
    lb, le = _slice_bounds(op, attrs.lhs_begin, lhs_end, len(data), err, "lhs")
    rb, re = _slice_bounds(op, attrs.rhs_begin, rhs_end, len(like), err, "rhs")
    out = tuple(data[:lb]) + tuple(like[rb:re]) + tuple(data[le:])
    same_size(op, data, out, err)
    return out


def _slice_bounds(op, begin, end, ndim, err, side):
    b = begin + ndim if begin < 0 else begin
    e = end + ndim if end < 0 else end
    if not 0 <= b <= e <= ndim:
        raise err(f"{op}: {side}_begin={begin}, {side}_end={end} is not a valid range of dims for rank {ndim}")
    return b, e


def _reshape_like_compute(attrs, inputs, out_type):
    x, like = inputs
    lhs_end = x.ndim if attrs.lhs_end is None else attrs.lhs_end
    rhs_end = like.ndim if attrs.rhs_end is None else attrs.rhs_end
    lb, le = attrs.lhs_begin % (x.ndim + 1), lhs_end % (x.ndim + 1) if lhs_end < 0 else lhs_end
    rb, re_ = attrs.rhs_begin % (like.ndim + 1), rhs_end % (like.ndim + 1) if rhs_end < 0 else rhs_end
    shape = tuple(x.shape[:lb]) + tuple(like.shape[rb:re_]) + tuple(x.shape[le:])
    return [reshape_to("reshape_like", x, shape)]


define_shaped(
    "reshape_like", 2, _reshape_like_logic, lambda attrs, shape, x, like: x.reshape(shape), OpPattern.INJECTIVE,
    attrs=(AttrDef("lhs_begin", 0, to_int), AttrDef("lhs_end", None, to_int),
           AttrDef("rhs_begin", 0, to_int), AttrDef("rhs_end", None, to_int)),
    doc="Reshape ``data`` to (part of) the shape of ``shape_like``.",
    compute=_reshape_like_compute,
)


# ---------------------------------------------------------------------------------------------------
# transpose, expand_dims, squeeze


def transpose_axes(op, attrs, ndim, err):
    """The permutation a transpose's (normalized) ``attrs`` ask for over ``ndim`` dims; ``err`` if it is none."""
    if attrs.axes is None:
        return tuple(range(ndim - 1, -1, -1))
    axes = tuple(norm_axis(op, a, ndim, err) for a in attrs.axes)
    if sorted(axes) != list(range(ndim)):
        raise err(f"{op}: axes {attrs.axes} are not a permutation of the {ndim} dims")
    return axes


@traceable
def _transpose_logic(op, attrs, shapes, err):
    (shape,) = shapes
    return tuple(shape[a] for a in transpose_axes(op, attrs, len(shape), err))


def _transpose_compute(attrs, inputs, out_type):
    x = inputs[0]
    axes = tuple(range(x.ndim - 1, -1, -1)) if attrs.axes is None else \
        tuple(axis_of("transpose", a, x.ndim) for a in attrs.axes)
    if sorted(axes) != list(range(x.ndim)):
        raise TypeInferenceError(f"transpose: axes {attrs.axes} are not a permutation of {x.ndim} dims")
    shape = tuple(x.shape[a] for a in axes)

    def f(*i):
        index = [None] * x.ndim
        for out_axis, in_axis in enumerate(axes):
            index[in_axis] = i[out_axis]
        return x[tuple(index)]

    return [compute(shape, f, "transpose")]


define_shaped(
    "transpose", 1, _transpose_logic,
    lambda attrs, shape, x: np.transpose(x, transpose_axes("transpose", attrs, x.ndim, ShapeError)),
    OpPattern.INJECTIVE, attrs=(AttrDef("axes", None, int_tuple()),),
    doc="Permute the dims (reverse them when ``axes`` is None).",
    compute=_transpose_compute,
)


@traceable
def _expand_dims_logic(op, attrs, shapes, err):
    (shape,) = shapes
    ndim = len(shape)
    if not -ndim - 1 <= attrs.axis <= ndim:
        raise err(f"{op}: axis {attrs.axis} is out of range [{-ndim - 1}, {ndim}] for rank {ndim}")
    axis = attrs.axis % (ndim + 1)
    return tuple(shape[:axis]) + (1,) * attrs.num_newaxis + tuple(shape[axis:])


def _expand_dims_compute(attrs, inputs, out_type):
    x = inputs[0]
    axis = attrs.axis % (x.ndim + 1)
    n = attrs.num_newaxis
    shape = tuple(x.shape[:axis]) + (const(1),) * n + tuple(x.shape[axis:])
    return [compute(shape, lambda *i: x[tuple(i[:axis]) + tuple(i[axis + n:])], "expand_dims")]


define_shaped(
    "expand_dims", 1, _expand_dims_logic, lambda attrs, shape, x: x.reshape(shape), OpPattern.BROADCAST,
    attrs=(AttrDef("axis", REQUIRED, to_int), AttrDef("num_newaxis", 1, lambda v: _nonneg(to_int(v)))),
    doc="Insert ``num_newaxis`` dims of size 1 at ``axis``.",
    compute=_expand_dims_compute,
)


def _nonneg(value: int) -> int:
    if value < 0:
        raise ValueError(f"expected a value >= 0, got {value}")
    return value


def _positive(value: int) -> int:
    if value < 1:
        raise ValueError(f"expected a value >= 1, got {value}")
    return value


@traceable
def _squeeze_logic(op, attrs, shapes, err):
    (shape,) = shapes
    if attrs.axis is None:
        if not all(isinstance(d, int) for d in shape):
            raise err(f"{op}: with axis=None every dim must be static to know which are 1, got "
                      f"{fmt_shape(shape)}; give the axes explicitly")
        return tuple(d for d in shape if d != 1)
    axes = {norm_axis(op, a, len(shape), err) for a in attrs.axis}
    if len(axes) != len(attrs.axis):  # (as NumPy; dyn.squeeze's output rank is its number of axes)
        raise err(f"{op}: an axis is repeated in {attrs.axis}")
    for a in sorted(axes):
        unify_dim(op, shape[a], 1, f"squeezed dim {a}", err)
    return tuple(d for i, d in enumerate(shape) if i not in axes)


def _squeeze_compute(attrs, inputs, out_type):
    x = inputs[0]
    if attrs.axis is None:
        dropped = {a for a, d in enumerate(x.shape) if isinstance(d, Const) and d.value == 1}
        if not all(isinstance(d, Const) for d in x.shape):
            raise TypeInferenceError("squeeze: with axis=None every dim must be static")
    else:
        dropped = {axis_of("squeeze", a, x.ndim) for a in attrs.axis}
    requires = [(eq(x.shape[a], 1), f"squeeze: dim {a} must be 1") for a in sorted(dropped)]
    shape = tuple(d for a, d in enumerate(x.shape) if a not in dropped)

    def f(*i):
        it = iter(i)
        return x[tuple(const(0) if a in dropped else next(it) for a in range(x.ndim))]

    return [compute(shape, f, "squeeze", requires)]


define_shaped(
    "squeeze", 1, _squeeze_logic, lambda attrs, shape, x: x.reshape(shape), OpPattern.INJECTIVE,
    attrs=(AttrDef("axis", None, int_tuple()),),
    doc="Remove dims of size 1 (the listed ``axis``, or all of them when None).",
    compute=_squeeze_compute,
)


# ---------------------------------------------------------------------------------------------------
# concatenate, stack, split


def _tuple_fields(op: str, ty, what: str = "data") -> list[TensorType]:
    if not isinstance(ty, TupleType):
        raise TypeInferenceError(f"{op}: expected a tuple of tensors as {what}, got {ty}")
    if not ty.fields:
        raise TypeInferenceError(f"{op}: expected a non-empty tuple of tensors")
    fields = [expect_tensor(op, f, f"{what} field {i}") for i, f in enumerate(ty.fields)]
    for i, f in enumerate(fields[1:], 1):
        if f.dtype != fields[0].dtype:
            raise TypeInferenceError(f"{op}: all tensors must have one dtype, field 0 is {fields[0].dtype} "
                                     f"but field {i} is {f.dtype}")
    return fields


def _concat_logic(op, axis, shapes, err):
    if not shapes:
        raise err(f"{op}: expected at least one tensor")
    ndim = len(shapes[0])
    for i, s in enumerate(shapes):
        if len(s) != ndim:
            raise err(f"{op}: all tensors must have rank {ndim}, field {i} has shape {fmt_shape(s)}")
    if ndim == 0:
        raise err(f"{op}: cannot concatenate scalars")
    axis = norm_axis(op, axis, ndim, err)
    out = list(shapes[0])
    for i, s in enumerate(shapes[1:], 1):
        for d in range(ndim):
            if d == axis:
                out[d] = add_dims(out[d], s[d])
            else:
                out[d] = unify_dim(op, out[d], s[d], f"dim {d} of field 0 and field {i}", err)
    return tuple(out)


def _concat_rel(types, attrs, consts=None):
    fields = _tuple_fields("concatenate", types[0])
    shape = _concat_logic("concatenate", attrs.axis, [f.shape for f in fields], TypeInferenceError)
    return TensorType(shape, fields[0].dtype)


def _concat_kernel(attrs, arrays):
    arrays = [np.asarray(a) for a in arrays]
    _concat_logic("concatenate", attrs.axis, [a.shape for a in arrays], ShapeError)
    return np.concatenate(arrays, axis=attrs.axis)


def _along_axis_select(tensors, offsets, axis: int, i: tuple, position):
    """Read the piece of a concatenation that covers ``position`` along ``axis`` (lazy selects)."""
    def read(t, offset):
        index = list(i)
        index[axis] = position - offset
        return t[tuple(index)]

    value = read(tensors[-1], offsets[-1])
    for t, offset in zip(reversed(tensors[:-1]), reversed(offsets[:-1])):
        value = select(position < offset + t.shape[axis], read(t, offset), value)
    return value


def _concatenate_compute(attrs, inputs, out_type):
    tensors = list(inputs[0])
    axis = axis_of("concatenate", attrs.axis, tensors[0].ndim)
    requires, offsets, offset = [], [], const(0)
    for k, t in enumerate(tensors):
        offsets.append(offset)
        offset = offset + t.shape[axis]
        for d in range(t.ndim):
            if d != axis:
                requires += require_equal("concatenate", tensors[0].shape[d], t.shape[d],
                                           f"dim {d} of field 0 and field {k}")
    shape = tuple(offset if d == axis else tensors[0].shape[d] for d in range(tensors[0].ndim))
    return [compute(shape, lambda *i: _along_axis_select(tensors, offsets, axis, i, i[axis]), "concatenate",
                    requires)]


define(
    "concatenate", 1, _concat_rel, _concat_kernel, OpPattern.INJECTIVE, attrs=(AttrDef("axis", 0, to_int),),
    shape_logic=traceable(lambda op, attrs, args, err: _concat_logic(op, attrs.axis, args[0], err)),
    doc="Join a tuple of tensors along ``axis``.",
    compute=_concatenate_compute,
)


def _stack_logic(op, axis, shapes, err):
    if not shapes:
        raise err(f"{op}: expected at least one tensor")
    ndim = len(shapes[0])
    out = list(shapes[0])
    for i, s in enumerate(shapes[1:], 1):
        if len(s) != ndim:
            raise err(f"{op}: all tensors must have rank {ndim}, field {i} has shape {fmt_shape(s)}")
        out = [unify_dim(op, a, b, f"dim {d} of field 0 and field {i}", err) for d, (a, b) in enumerate(zip(out, s, strict=False))]
    if not -ndim - 1 <= axis <= ndim:
        raise err(f"{op}: axis {axis} is out of range [{-ndim - 1}, {ndim}] for rank {ndim}")
    axis %= ndim + 1
    return tuple(out[:axis]) + (len(shapes),) + tuple(out[axis:])


def _stack_rel(types, attrs, consts=None):
    fields = _tuple_fields("stack", types[0])
    return TensorType(_stack_logic("stack", attrs.axis, [f.shape for f in fields], TypeInferenceError),
                      fields[0].dtype)


def _stack_kernel(attrs, arrays):
    arrays = [np.asarray(a) for a in arrays]
    _stack_logic("stack", attrs.axis, [a.shape for a in arrays], ShapeError)
    return np.stack(arrays, axis=attrs.axis)


def _stack_compute(attrs, inputs, out_type):
    tensors = list(inputs[0])
    ndim = tensors[0].ndim
    axis = attrs.axis % (ndim + 1)
    requires = []
    for k, t in enumerate(tensors[1:], 1):
        for d in range(ndim):
            requires += require_equal("stack", tensors[0].shape[d], t.shape[d], f"dim {d} of field 0 and field {k}")
    shape = tuple(tensors[0].shape[:axis]) + (const(len(tensors)),) + tuple(tensors[0].shape[axis:])

    def f(*i):
        inner = tuple(i[:axis]) + tuple(i[axis + 1:])
        value = tensors[-1][inner]
        for k in range(len(tensors) - 2, -1, -1):
            value = select(eq(i[axis], k), tensors[k][inner], value)
        return value

    return [compute(shape, f, "stack", requires)]


define(
    "stack", 1, _stack_rel, _stack_kernel, OpPattern.INJECTIVE, attrs=(AttrDef("axis", 0, to_int),),
    shape_logic=traceable(lambda op, attrs, args, err: _stack_logic(op, attrs.axis, args[0], err)),
    doc="Stack a tuple of equally shaped tensors along a new ``axis``.",
    compute=_stack_compute,
)


def _sections_or_indices(value):
    if isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_)):
        return _positive(int(value))
    items = int_tuple(0)(value)
    if any(b < a for a, b in zip(items, items[1:], strict=False)):
        raise ValueError(f"split indices must be non-decreasing, got {items}")
    return items


def _split_logic(op, attrs, shape, err) -> list[tuple]:
    if isinstance(shape, list):  # (as the op's shape logic: the list of its inputs' shapes)
        (shape,) = shape
    ndim = len(shape)
    if ndim == 0:
        raise err(f"{op}: cannot split a scalar")
    axis = norm_axis(op, attrs.axis, ndim, err)
    dim = shape[axis]
    spec = attrs.indices_or_sections
    known = isinstance(dim, (int, Sym))  # an int, or a traced dim: the checks apply
    if isinstance(spec, int):
        if known:
            require(dim % spec == 0, f"{op}: dimension {axis} of size {dim} is not divisible into {spec} sections", err)
            sizes = [dim // spec] * spec
        else:
            sizes = [Any()] * spec
    else:
        if known and spec:
            require(spec[-1] <= dim, f"{op}: split index {spec[-1]} is beyond dimension {axis} of size {dim}", err)
        bounds = (0,) + spec
        sizes = [b - a for a, b in zip(bounds, bounds[1:], strict=False)]
        sizes.append(dim - bounds[-1] if known else (dim if bounds[-1] == 0 else Any()))
    return [tuple(shape[:axis]) + (s,) + tuple(shape[axis + 1:]) for s in sizes]


def _split_rel(types, attrs, consts=None):
    data = expect_tensor("split", types[0], "data")
    return TupleType(tuple(TensorType(s, data.dtype) for s in _split_logic("split", attrs, data.shape,
                                                                           TypeInferenceError)))


def _split_kernel(attrs, data):
    data = np.asarray(data)
    shapes = _split_logic("split", attrs, data.shape, ShapeError)
    axis = attrs.axis % data.ndim
    starts = np.cumsum([0] + [s[axis] for s in shapes])
    return tuple(data[(slice(None),) * axis + (slice(a, b),)] for a, b in zip(starts, starts[1:], strict=False))


def _split_compute(attrs, inputs, out_type):
    x = inputs[0]
    axis = axis_of("split", attrs.axis, x.ndim)
    dim = x.shape[axis]
    spec = attrs.indices_or_sections
    requires = []
    if isinstance(spec, int):
        size = E.floordiv(dim, spec)
        requires.append((eq(E.floormod(dim, spec), 0), f"split: dim {axis} is not divisible into {spec} sections"))
        starts = [size * k for k in range(spec)]
        sizes = [size] * spec
    else:
        bounds = (0,) + tuple(spec)
        if spec:
            requires.append((dim >= spec[-1], f"split: split index {spec[-1]} is beyond dim {axis}"))
        starts = [const(b) for b in bounds]
        sizes = [const(b - a) for a, b in zip(bounds, bounds[1:])] + [dim - bounds[-1]]
    outputs = []
    for k, (start, size) in enumerate(zip(starts, sizes)):
        shape = tuple(size if d == axis else x.shape[d] for d in range(x.ndim))

        def f(*i, start=start):
            index = list(i)
            index[axis] = i[axis] + start
            return x[tuple(index)]

        outputs.append(compute(shape, f, f"split{k}", requires if k == 0 else ()))
    return outputs


define(
    "split", 1, _split_rel, _split_kernel, OpPattern.INJECTIVE,
    attrs=(AttrDef("indices_or_sections", REQUIRED, _sections_or_indices), AttrDef("axis", 0, to_int)),
    shape_logic=traceable(_split_logic),
    doc="Split into a tuple: ``indices_or_sections`` is a number of equal sections or the split indices.",
    compute=_split_compute,
)


# ---------------------------------------------------------------------------------------------------
# take, gather, gather_nd, scatter_elements, scatter_nd


@traceable
def _take_logic(op, attrs, shapes, err):
    data, indices = shapes
    if attrs.axis is None:
        return tuple(indices)
    axis = norm_axis(op, attrs.axis, len(data), err)
    batch_dims = attrs.batch_dims + len(indices) if attrs.batch_dims < 0 else attrs.batch_dims
    if not 0 <= batch_dims <= min(axis, len(indices)):
        raise err(f"{op}: batch_dims={attrs.batch_dims} must be in [0, min(axis={axis}, "
                  f"indices rank={len(indices)})]")
    batch = [unify_dim(op, data[i], indices[i], f"batch dim {i} of data and indices", err)
             for i in range(batch_dims)]
    return tuple(batch) + tuple(data[batch_dims:axis]) + tuple(indices[batch_dims:]) + tuple(data[axis + 1:])


def _normalize_indices(op: str, indices: np.ndarray, size: int, mode: str) -> np.ndarray:
    """Map indices into [0, size) by ``mode``: clip, wrap (modulo) or fast (must be in [-size, size))."""
    indices = np.asarray(indices).astype(np.int64)
    if indices.size and size == 0:
        raise ExecutionError(f"{op}: cannot take from a dimension of size 0")
    if mode == "clip":
        return np.clip(indices, 0, size - 1)
    if mode == "wrap":
        return np.mod(indices, size)
    bad = (indices < -size) | (indices >= size)
    if bad.any():
        raise ExecutionError(f"{op}: index {indices[bad].flat[0]} is out of range for a dimension of size {size}")
    return np.where(indices < 0, indices + size, indices)


def _take_kernel(attrs, out_shape, data, indices):
    if attrs.axis is None:
        flat = data.reshape(-1)
        return flat[_normalize_indices("take", indices, flat.size, attrs.mode)]
    axis = attrs.axis % data.ndim
    idx = _normalize_indices("take", indices, data.shape[axis], attrs.mode)
    batch_dims = attrs.batch_dims + indices.ndim if attrs.batch_dims < 0 else attrs.batch_dims
    if batch_dims == 0:
        return np.take(data, idx, axis=axis)
    out = np.empty(out_shape, dtype=data.dtype)
    batch = int(np.prod(data.shape[:batch_dims]))
    data_b = data.reshape((batch,) + data.shape[batch_dims:])
    idx_b = idx.reshape((batch,) + idx.shape[batch_dims:])
    out_b = out.reshape((batch,) + out_shape[batch_dims:])
    for b in range(batch):  # one vectorized take per batch element
        out_b[b] = np.take(data_b[b], idx_b[b], axis=axis - batch_dims)
    return out


def _check_indices_dtype(op: str, position: int):
    def check(types, attrs):
        expect_int_tensor(op, types[position], "indices")

    return check


def _normalize_index(op: str, value: PrimExpr, size: PrimExpr, mode: str) -> PrimExpr:
    value = cast(value, INDEX_DTYPE)
    if mode == "clip":
        return E.minimum(E.maximum(value, 0), size - 1)
    if mode == "wrap":
        return E.floormod(value, size)
    return E.index_check(value, size)


def _nonempty_source(op: str, size, indices: Tensor) -> list:
    cond = E.logical_or(size > 0, eq(product(indices.shape), 0))
    return [] if isinstance(cond, Const) and cond.value else [(cond, f"{op}: cannot take from a dimension of size 0")]


def _take_compute(attrs, inputs, out_type):
    data, indices = inputs
    mode = attrs.mode
    if attrs.axis is None:
        size = product(data.shape)
        requires = _nonempty_source("take", size, indices)
        return [compute(indices.shape, lambda *i: data[tuple(unravel(
            _normalize_index("take", indices[i], size, mode), data.shape))], "take", requires)]
    axis = axis_of("take", attrs.axis, data.ndim)
    b = attrs.batch_dims + indices.ndim if attrs.batch_dims < 0 else attrs.batch_dims
    size = data.shape[axis]
    requires = _nonempty_source("take", size, indices)
    for d in range(b):
        requires += require_equal("take", data.shape[d], indices.shape[d], f"batch dim {d} of data and indices")
    shape = tuple(data.shape[:axis]) + tuple(indices.shape[b:]) + tuple(data.shape[axis + 1:])
    n_ind = indices.ndim - b

    def f(*i):
        batch, pre = i[:b], i[b:axis]
        ind = i[axis:axis + n_ind]
        post = i[axis + n_ind:]
        position = _normalize_index("take", indices[tuple(batch) + tuple(ind)], size, mode)
        return data[tuple(batch) + tuple(pre) + (position,) + tuple(post)]

    return [compute(shape, f, "take", requires)]


define_shaped(
    "take", 2, _take_logic, _take_kernel, OpPattern.INJECTIVE,
    attrs=(AttrDef("axis", None, to_int), AttrDef("batch_dims", 0, to_int),
           AttrDef("mode", "clip", one_of("clip", "wrap", "fast"))),
    check_types=_check_indices_dtype("take", 1),
    doc="Take elements along ``axis`` (the flattened data when None) at ``indices``.",
    compute=_take_compute,
)


@traceable
def _gather_logic(op, attrs, shapes, err):
    data, indices = shapes
    if len(data) != len(indices):
        raise err(f"{op}: indices must have the data's rank {len(data)}, got shape {fmt_shape(indices)}")
    axis = norm_axis(op, attrs.axis, len(data), err)
    for d, (a, b) in enumerate(zip(data, indices, strict=False)):
        if d != axis and isinstance(a, (int, Sym)) and isinstance(b, (int, Sym)):  # (known or traced dims)
            require(b <= a, f"{op}: indices dim {d} ({b}) exceeds the data's ({a})", err)
    return tuple(indices)


def _gather_kernel(attrs, out_shape, data, indices):
    axis = attrs.axis % data.ndim
    grid = list(np.ogrid[tuple(slice(0, n) for n in indices.shape)]) if indices.ndim else []
    grid[axis] = _normalize_indices("gather", indices, data.shape[axis], "fast")
    return data[tuple(grid)]


def _gather_compute(attrs, inputs, out_type):
    data, indices = inputs
    axis = axis_of("gather", attrs.axis, data.ndim)
    requires = _nonempty_source("gather", data.shape[axis], indices)
    for d in range(data.ndim):
        if d != axis and not same(indices.shape[d], data.shape[d]):
            requires.append((indices.shape[d] <= data.shape[d], f"gather: indices dim {d} exceeds the data's"))

    def f(*i):
        index = list(i)
        index[axis] = E.index_check(cast(indices[i], INDEX_DTYPE), data.shape[axis])
        return data[tuple(index)]

    return [compute(indices.shape, f, "gather", requires)]


define_shaped(
    "gather", 2, _gather_logic, _gather_kernel, OpPattern.INJECTIVE, attrs=(AttrDef("axis", REQUIRED, to_int),),
    check_types=_check_indices_dtype("gather", 1),
    doc="out[i][j] = data[indices[i][j]][j] along ``axis`` (indices in [-n, n)).",
    compute=_gather_compute,
)


def _index_depth(op, attrs, indices, err):
    if attrs.index_rank is not None:
        if indices and isinstance(indices[0], (int, Sym)):
            require(indices[0] == attrs.index_rank, f"{op}: index_rank={attrs.index_rank} but indices have "
                                                    f"{indices[0]} rows", err)
        return attrs.index_rank
    if not indices or not isinstance(indices[0], int):
        raise err(f"{op}: the first dim of indices (the index depth) must be static, got shape {fmt_shape(indices)}; "
                  f"set index_rank")
    return indices[0]


@traceable
def _gather_nd_logic(op, attrs, shapes, err):
    data, indices = shapes
    depth = _index_depth(op, attrs, indices, err)
    if depth < 1:
        raise err(f"{op}: the index depth (first dim of indices) must be >= 1, got {depth}")
    b = attrs.batch_dims
    if depth + b > len(data) or b + 1 > len(indices):
        raise err(f"{op}: index depth {depth} with batch_dims={b} does not fit data of rank {len(data)} "
                  f"and indices of rank {len(indices)}")
    batch = [unify_dim(op, data[i], indices[i + 1], f"batch dim {i} of data and indices", err) for i in range(b)]
    return tuple(batch) + tuple(indices[1 + b:]) + tuple(data[b + depth:])


def _gather_nd_kernel(attrs, out_shape, data, indices):
    b = attrs.batch_dims
    depth = indices.shape[0]
    rest = indices.shape[1:]
    grid = [np.arange(n).reshape((1,) * i + (n,) + (1,) * (len(rest) - i - 1)) for i, n in enumerate(rest[:b])]
    idx = [_normalize_indices("gather_nd", indices[k], data.shape[b + k], "fast") for k in range(depth)]
    return data[tuple(grid + idx)]


def _gather_nd_compute(attrs, inputs, out_type):
    data, indices = inputs
    b = attrs.batch_dims
    depth_dim = indices.shape[0]
    if not isinstance(depth_dim, Const):
        raise UnsupportedError("gather_nd: the index depth (first dim of indices) must be static")
    depth = depth_dim.value
    rest = tuple(indices.shape[1:])
    shape = rest + tuple(data.shape[b + depth:])
    requires = []
    for d in range(b):
        requires += require_equal("gather_nd", data.shape[d], rest[d], f"batch dim {d} of data and indices")

    def f(*i):
        r, t = i[:len(rest)], i[len(rest):]
        index = list(r[:b])
        for k in range(depth):
            index.append(E.index_check(cast(indices[(const(k),) + tuple(r)], INDEX_DTYPE), data.shape[b + k]))
        return data[tuple(index) + tuple(t)]

    return [compute(shape, f, "gather_nd", requires)]


define_shaped(
    "gather_nd", 2, _gather_nd_logic, _gather_nd_kernel, OpPattern.INJECTIVE,
    attrs=(AttrDef("batch_dims", 0, lambda v: _nonneg(to_int(v))), AttrDef("index_rank", None, to_int)),
    check_types=_check_indices_dtype("gather_nd", 1),
    doc="Gather slices: indices has shape (M, Y...), the output (Y..., data.shape[batch_dims + M:]).",
    compute=_gather_nd_compute,
)


@traceable
def _scatter_elements_logic(op, attrs, shapes, err):
    data, indices, updates = shapes
    if not len(data) == len(indices) == len(updates):
        raise err(f"{op}: data, indices and updates must have one rank, got {fmt_shape(data)}, {fmt_shape(indices)}, "
                  f"{fmt_shape(updates)}")
    axis = norm_axis(op, attrs.axis, len(data), err)
    for d, (i, u) in enumerate(zip(indices, updates, strict=False)):
        unify_dim(op, i, u, f"dim {d} of indices and updates", err)
        if d != axis and isinstance(i, (int, Sym)) and isinstance(data[d], (int, Sym)):
            require(i <= data[d], f"{op}: indices dim {d} ({i}) exceeds the data's ({data[d]})", err)
    return tuple(data)


_UFUNC_AT = {"add": np.add, "mul": np.multiply, "min": np.minimum, "max": np.maximum}


def _scatter(op: str, out: np.ndarray, index: tuple, updates: np.ndarray, reduction: str) -> np.ndarray:
    """Scatter ``updates`` into ``out[index]`` (unbuffered, so repeated indices all apply)."""
    if reduction == "update":
        out[index] = updates
    elif reduction == "mean":
        total = out.astype(np.float64)
        count = np.ones(out.shape)
        np.add.at(total, index, updates)
        np.add.at(count, index, 1)
        out[...] = (total / count).astype(out.dtype)
    else:
        _UFUNC_AT[reduction].at(out, index, updates)
    return out


def _scatter_elements_kernel(attrs, out_shape, data, indices, updates):
    axis = attrs.axis % data.ndim
    grid = list(np.ogrid[tuple(slice(0, n) for n in indices.shape)])
    grid[axis] = _normalize_indices("scatter_elements", indices, data.shape[axis], "fast")
    return _scatter("scatter_elements", data.copy(), tuple(grid), updates.astype(data.dtype), attrs.reduction)


SCATTER_REDUCTIONS = ("update", "add", "mul", "mean", "min", "max")  # (codegen/lib/algorithm.c: TV_SCATTER_*)


def _scatter_elements_arguments(attrs, inputs, outputs):
    (data, indices, updates), (out,) = inputs, outputs
    rank, axis = len(data.shape), attrs.axis % len(data.shape)
    requires = same_dims("scatter_elements", out.shape, data.shape, "the output's")
    requires += same_dims("scatter_elements", updates.shape, indices.shape, "updates'")
    requires += same_dims("scatter_elements", [d for a, d in enumerate(indices.shape) if a != axis],
                          [d for a, d in enumerate(data.shape) if a != axis], "indices'", at_most=True)
    return [data, indices, dtype_code(indices.dtype), updates, out, dtype_code(data.dtype), rank,
            tuple(data.shape) + tuple(indices.shape), axis, SCATTER_REDUCTIONS.index(attrs.reduction)], requires


def _scatter_nd_arguments(attrs, inputs, outputs):
    (data, indices, updates), (out,) = inputs, outputs
    depth = indices.shape[0].value  # (static: the type relation requires it)
    requires = same_dims("scatter_nd", out.shape, data.shape, "the output's")
    requires += same_dims("scatter_nd", updates.shape, tuple(indices.shape[1:]) + tuple(data.shape[depth:]),
                          "updates'")
    return [data, indices, dtype_code(indices.dtype), updates, out, dtype_code(data.dtype), product(data.shape), depth,
            product(indices.shape[1:]), product(data.shape[depth:]), tuple(data.shape[:depth]),
            SCATTER_REDUCTIONS.index(attrs.mode)], requires


def _check_scatter_types(op: str):
    def check(types, attrs):
        expect_int_tensor(op, types[1], "indices")
        expect_same_dtype(op, types[0], types[2], "updates")

    return check


define_shaped(
    "scatter_elements", 3, _scatter_elements_logic, _scatter_elements_kernel, OpPattern.OPAQUE,
    attrs=(AttrDef("axis", 0, to_int), AttrDef("reduction", "update", one_of(*SCATTER_REDUCTIONS))),
    check_types=_check_scatter_types("scatter_elements"),
    library=LibraryKernel("tv_scatter_elements", "algorithm.c", _scatter_elements_arguments),
    doc="A copy of data with updates[p] written (or reduced) at p with its ``axis`` entry replaced by "
        "indices[p]. ``mean`` averages the data value with every update that lands on it.",
)


@traceable
def _scatter_nd_logic(op, attrs, shapes, err):
    data, indices, updates = shapes
    if not indices or not isinstance(indices[0], int):
        raise err(f"{op}: the first dim of indices (the index depth) must be static, got {fmt_shape(indices)}")
    depth = indices[0]
    if depth > len(data):
        raise err(f"{op}: index depth {depth} exceeds the data's rank {len(data)}")
    expected = tuple(indices[1:]) + tuple(data[depth:])
    if len(updates) != len(expected):
        raise err(f"{op}: updates must have shape {fmt_shape(expected)} (indices.shape[1:] + data.shape[M:]), "
                  f"got {fmt_shape(updates)}")
    for d, (a, b) in enumerate(zip(updates, expected, strict=False)):
        unify_dim(op, a, b, f"updates dim {d} and the expected {fmt_shape(expected)}", err)
    return tuple(data)


def _scatter_nd_kernel(attrs, out_shape, data, indices, updates):
    index = tuple(_normalize_indices("scatter_nd", indices[k], data.shape[k], "fast")
                  for k in range(indices.shape[0]))
    return _scatter("scatter_nd", data.copy(), index, updates.astype(data.dtype), attrs.mode)


define_shaped(
    "scatter_nd", 3, _scatter_nd_logic, _scatter_nd_kernel, OpPattern.OPAQUE,
    attrs=(AttrDef("mode", "update", one_of("update", "add", "mul", "min", "max")),),
    check_types=_check_scatter_types("scatter_nd"),
    library=LibraryKernel("tv_scatter_nd", "algorithm.c", _scatter_nd_arguments),
    doc="A copy of data with updates scattered at indices of shape (M, Y...) (``mode`` update or reduce).",
)


# ---------------------------------------------------------------------------------------------------
# strided_slice


_UNKNOWN = "unknown"  # an end that depends on an unknown dim


def _slice_spec(op, attrs_begin, attrs_end, attrs_strides, attrs_axes, slice_mode, shape, err):
    """Per sliced axis: (axis, begin, end, stride) as Python slice values (end None = to the end)."""
    ndim = len(shape)
    strides = attrs_strides if attrs_strides is not None else ()
    if attrs_axes is None:
        count = max(len(attrs_begin), len(attrs_end), len(strides))
        if count > ndim:
            raise err(f"{op}: {count} sliced axes for a tensor of rank {ndim}")
        axes = tuple(range(count))
    else:
        axes = tuple(norm_axis(op, a, ndim, err) for a in attrs_axes)
        if len(set(axes)) != len(axes):
            raise err(f"{op}: repeated axes {attrs_axes}")
        if max(len(attrs_begin), len(attrs_end), len(strides)) > len(axes):
            raise err(f"{op}: begin/end/strides have more values than the {len(axes)} axes {attrs_axes}")
    spec = []
    for i, axis in enumerate(axes):
        stride = strides[i] if i < len(strides) else 1
        begin = attrs_begin[i] if i < len(attrs_begin) else None
        end = attrs_end[i] if i < len(attrs_end) else None
        if slice_mode == "size":
            stride, size = 1, end  # strides are ignored in size mode, like Relay
            begin = 0 if begin is None else begin
            run_time = is_sym(begin) or is_sym(size)
            if not run_time and (size is None or size < 0):
                end = None
            elif not run_time and begin >= 0:
                end = begin + size
            elif not run_time and isinstance(shape[axis], int):
                begin = max(begin + shape[axis], 0)
                end = begin + size
            elif run_time or is_sym(shape[axis]):
                begin, end = _sized_slice(begin, size, shape[axis])
            else:
                end = _UNKNOWN
        require(stride != 0, f"{op}: stride 0 on axis {axis}", err)
        spec.append((axis, begin, end, stride))
    return spec


def _sized_slice(begin, size, dim):
    """Size mode's (begin, end) over a run-time begin or size or a traced dim: a negative begin counts from
    the end, a negative size runs to the end; begin is clamped to the dim and size to it, so that their
    sum cannot overflow int64 (the clamped slice is the same)."""
    begin = dim_min(dim_select(begin < 0, dim_max(begin + dim, 0), begin), dim)
    if size is None:
        return begin, None
    return begin, dim_select(size < 0, dim, begin + dim_min(size, dim))


def _slice_dims(shape, spec):
    out = list(shape)
    for axis, begin, end, stride in spec:
        dim = shape[axis]
        if isinstance(dim, (int, Sym)) and end is not _UNKNOWN:  # (a known or traced dim)
            out[axis] = slice_length(begin, end, stride, dim)
        elif stride == 1 and begin in (0, None) and (end is None or (end is not _UNKNOWN and end >= INT32_MAX)):
            out[axis] = dim  # the whole axis: a symbolic dim flows through
        else:
            out[axis] = Any()
    return tuple(out)


def _slice_index(spec, ndim):
    index = [slice(None)] * ndim
    for axis, begin, end, stride in spec:
        index[axis] = slice(begin, end, stride)
    return tuple(index)


@traceable
def _strided_slice_logic(op, attrs, shapes, err):
    (shape,) = shapes
    spec = _slice_spec(op, attrs.begin, attrs.end, attrs.strides, attrs.axes, attrs.slice_mode, shape, err)
    return _slice_dims(shape, spec)


def _strided_slice_kernel(attrs, out_shape, data):
    spec = _slice_spec("strided_slice", attrs.begin, attrs.end, attrs.strides, attrs.axes, attrs.slice_mode,
                       data.shape, ShapeError)
    return data[_slice_index(spec, data.ndim)]


def _nonzero_strides(value):
    items = int_tuple()(value)
    if 0 in items:
        raise ValueError(f"strides must be nonzero, got {items}")
    return items


_SLICE_MODE = AttrDef("slice_mode", "end", one_of("end", "size"))


def _slice_axis(dim: PrimExpr, begin, end, stride: int):
    """Python slice semantics over a te dim: (start, length) of ``slice(begin, end, stride)``."""
    def clamp_start(v, low, high):
        if isinstance(v, int) and v < 0:
            return E.maximum(dim + v, low)
        return E.minimum(v, high)

    if stride > 0:
        start = const(0) if begin is None else clamp_start(begin, 0, dim)
        stop = dim if end is None else clamp_start(end, 0, dim)
        length = E.maximum(E.floordiv(stop - start + (stride - 1), stride), 0)
    else:
        start = dim - 1 if begin is None else clamp_start(begin, -1, dim - 1)
        stop = const(-1) if end is None else clamp_start(end, -1, dim - 1)
        length = E.maximum(E.floordiv(start - stop + (-stride - 1), -stride), 0)
    return start, length


def _strided_slice_compute(attrs, inputs, out_type):
    x = inputs[0]
    ndim = x.ndim
    strides = attrs.strides or ()
    axes = tuple(range(max(len(attrs.begin), len(attrs.end), len(strides)))) if attrs.axes is None else \
        tuple(axis_of("strided_slice", a, ndim) for a in attrs.axes)
    starts, steps, shape = [const(0)] * ndim, [1] * ndim, list(x.shape)
    for k, axis in enumerate(axes):
        stride = strides[k] if k < len(strides) else 1
        begin = attrs.begin[k] if k < len(attrs.begin) else None
        end = attrs.end[k] if k < len(attrs.end) else None
        if attrs.slice_mode == "size":
            stride, size = 1, end
            begin = 0 if begin is None else begin
            if size is None or size < 0:
                end = None
            elif begin >= 0:
                end = begin + size
            else:
                begin = E.maximum(x.shape[axis] + begin, 0)
                end = begin + size
        start, length = _slice_axis(x.shape[axis], begin, end, stride)
        starts[axis], steps[axis], shape[axis] = start, stride, length
    return [compute(tuple(shape), lambda *i: x[tuple(s + j * st for s, j, st in zip(starts, i, steps))],
                    "strided_slice")]


define_shaped(
    "strided_slice", 1, _strided_slice_logic, _strided_slice_kernel, OpPattern.INJECTIVE,
    attrs=(AttrDef("begin", REQUIRED, int_tuple()), AttrDef("end", REQUIRED, int_tuple()),
           AttrDef("strides", None, _nonzero_strides), AttrDef("axes", None, int_tuple()), _SLICE_MODE),
    doc="Slice with begin/end/strides (negative values count from the end, out-of-range ones are clamped); "
        "in ``size`` mode ``end`` holds sizes (-1: to the end) and strides are ignored.",
    compute=_strided_slice_compute,
)


def _dyn_slice_values(op, arrays, err):
    values = []
    for name, arr in zip(("begin", "end", "strides"), arrays, strict=False):
        arr = np.asarray(arr)
        if arr.ndim != 1 or not np.issubdtype(arr.dtype, np.integer):
            raise err(f"{op}: {name} must be a 1-D integer tensor, got shape {arr.shape} of {arr.dtype}")
        values.append(tuple(int(v) for v in arr))
    if 0 in values[2]:
        raise err(f"{op}: strides must be nonzero, got {values[2]}")
    return values


def _dyn_strided_slice_rel(types, attrs, consts=None):
    op = "dyn.strided_slice"
    data = expect_tensor(op, types[0], "data")
    lengths = []
    for name, ty in zip(("begin", "end", "strides"), types[1:], strict=False):
        t = expect_int_tensor(op, ty, name)
        if t.ndim != 1:
            raise TypeInferenceError(f"{op}: {name} must be 1-D, got rank {t.ndim}")
        lengths.append(t.shape[0])
    consts = consts or [None] * 4
    if all(c is not None for c in consts[1:4]):
        begin, end, strides = _dyn_slice_values(op, consts[1:4], TypeInferenceError)
        spec = _slice_spec(op, begin, end, strides, attrs.axes, attrs.slice_mode, data.shape, TypeInferenceError)
        return TensorType(_slice_dims(data.shape, spec), data.dtype)
    if attrs.axes is not None:
        if any(isinstance(n, int) and n > len(attrs.axes) for n in lengths):
            raise TypeInferenceError(f"{op}: begin/end/strides have more values than the {len(attrs.axes)} axes "
                                     f"{attrs.axes}")
        spec = _slice_spec(op, (), (), (), attrs.axes, attrs.slice_mode, data.shape, TypeInferenceError)
        sliced = {axis for axis, *_ in spec}
        return TensorType(tuple(Any() if i in sliced else d for i, d in enumerate(data.shape)), data.dtype)
    if not all(isinstance(n, int) for n in lengths):
        return TensorType((Any(),) * data.ndim, data.dtype)
    count = max(lengths)
    if count > data.ndim:
        raise TypeInferenceError(f"{op}: {count} sliced axes for a tensor of rank {data.ndim}")
    return TensorType((Any(),) * count + data.shape[count:], data.dtype)


@traceable
def _dyn_strided_slice_logic(op, attrs, args, err):
    """begin/end/strides known, or read in C (static lengths: they decide the sliced axes), each stride
    checked nonzero; a sliced dim is slice_length's select over its stride's sign."""
    shape, arrays = tuple(args[0]), args[1:4]
    if all(a.values is not None for a in arrays):
        begin, end, strides = _dyn_slice_values(op, [a.values for a in arrays], err)
    else:
        for name, a in zip(("begin", "end", "strides"), arrays, strict=True):
            if len(a.shape) != 1 or a.dtype not in INT_DTYPES:
                raise err(f"{op}: {name} must be a 1-D integer tensor, got shape {a.shape} of {a.dtype}")
        begin, end, strides = (a.int_values() for a in arrays)
        for s in strides:
            require(s != 0, f"{op}: strides must be nonzero", err)
    return _slice_dims(shape, _slice_spec(op, begin, end, strides, attrs.axes, attrs.slice_mode, shape, err))


def _dyn_strided_slice_spec(attrs, shape, arrays):
    op = "dyn.strided_slice"
    begin, end, strides = _dyn_slice_values(op, arrays, ShapeError)
    return _slice_spec(op, begin, end, strides, attrs.axes, attrs.slice_mode, shape, ShapeError)


def _dyn_strided_slice_kernel(attrs, data, begin, end, strides):
    data = np.asarray(data)
    return data[_slice_index(_dyn_strided_slice_spec(attrs, data.shape, (begin, end, strides)), data.ndim)]


def _dyn_strided_slice_compute(attrs, inputs, out_type):
    """The output dims come from the output array; only the start of each sliced axis (and its stride)
    is computed here, from the begin/strides tensors, with Python's slice rules."""
    x, begin, _, strides = inputs
    shape = output_dims("dyn.strided_slice", out_type)
    # (begin's length says which axes are sliced, strides' what steps: with either known only at run time the
    # NumPy kernel runs the op; a compute that took every axis and unit steps had sliced the wrong elements)
    if not isinstance(begin.shape[0], Const) or (attrs.slice_mode != "size" and not isinstance(strides.shape[0], Const)):
        raise UnsupportedError("dyn.strided_slice: no compute for begin or strides of a length known only at run time")
    count = begin.shape[0].value
    axes = range(count) if attrs.axes is None else [a + x.ndim if a < 0 else a for a in attrs.axes[:count]]
    starts, steps = [const(0)] * x.ndim, [const(1)] * x.ndim
    for position, axis in enumerate(axes):
        dim = x.shape[axis]
        b = cast(begin[const(position)], INDEX_DTYPE)
        if attrs.slice_mode == "size":
            starts[axis] = E.minimum(select(b < 0, E.maximum(b + dim, 0), b), dim)
            continue
        has_stride = isinstance(strides.shape[0], Const) and position < strides.shape[0].value
        step = cast(strides[const(position)], INDEX_DTYPE) if has_stride else const(1)
        forward = select(b < 0, E.maximum(b + dim, 0), E.minimum(b, dim))
        backward = select(b < 0, E.maximum(b + dim, -1), E.minimum(b, dim - 1))
        starts[axis], steps[axis] = select(step > 0, forward, backward), step
    return [compute(shape, lambda *i: x[tuple(s + j * st for s, j, st in zip(starts, i, steps))],
                    "dyn_strided_slice")]


define(
    "dyn.strided_slice", 4, _dyn_strided_slice_rel, _dyn_strided_slice_kernel, OpPattern.INJECTIVE,
    attrs=(_SLICE_MODE, AttrDef("axes", None, int_tuple())),
    shape_logic=_dyn_strided_slice_logic, data_dependent=(False, True, True, True),
    doc="strided_slice with begin/end/strides given as run-time 1-D integer tensors (Python's slice rules: "
        "out-of-range values are clamped, as ONNX Slice wants); they slice ``axes`` when given, else the "
        "first len(begin) axes.",
    compute=_dyn_strided_slice_compute,
)


# ---------------------------------------------------------------------------------------------------
# broadcast_to, broadcast_to_like, tile, repeat, reverse


def broadcast_into(op: str, shape, target, err):
    """Check that ``shape`` broadcasts to exactly ``target`` (NumPy's ``broadcast_to`` rule)."""
    if len(shape) > len(target):
        raise err(f"{op}: cannot broadcast {fmt_shape(shape)} to the lower-rank {fmt_shape(target)}")
    out = list(target)
    for i in range(1, len(shape) + 1):
        d, t = shape[-i], target[-i]
        if is_sym(d) or is_sym(t):
            require(dim_or(d == 1, d == t), f"{op}: cannot broadcast {fmt_shape(shape)} to {fmt_shape(target)} "
                                                 f"(dim {-i}: {d} vs {t})", err)
            continue
        if d == 1:
            continue
        if isinstance(d, int) and isinstance(t, int):
            if d != t:
                raise err(f"{op}: cannot broadcast {fmt_shape(shape)} to {fmt_shape(target)} (dim {-i}: {d} vs {t})")
        elif not isinstance(t, int) and isinstance(d, int):
            out[-i] = d  # the target dim must then equal d
    return tuple(out)


def _broadcast_to_compute(attrs, inputs, out_type):
    return [broadcast_to_shape("broadcast_to", inputs[0], tuple(const(d) for d in attrs.shape))]


define_shaped(
    "broadcast_to", 1, lambda op, attrs, shapes, err: broadcast_into(op, shapes[0], attrs.shape, err),
    lambda attrs, shape, x: np.broadcast_to(x, shape).copy(), OpPattern.BROADCAST,
    attrs=(AttrDef("shape", REQUIRED, int_tuple(0)),), doc="Broadcast to ``shape``.",
    compute=_broadcast_to_compute, traceable=True,
)


def _broadcast_to_like_compute(attrs, inputs, out_type):
    return [broadcast_to_shape("broadcast_to_like", inputs[0], inputs[1].shape)]


define_shaped(
    "broadcast_to_like", 2, lambda op, attrs, shapes, err: broadcast_into(op, shapes[0], shapes[1], err),
    lambda attrs, shape, x, like: np.broadcast_to(x, shape).copy(), OpPattern.BROADCAST,
    doc="Broadcast ``data`` to the shape of ``broadcast_type``.",
    compute=_broadcast_to_like_compute, traceable=True,
)


def _dyn_shape_values(op, arr, err):
    arr = np.asarray(arr)
    if arr.ndim != 1 or not np.issubdtype(arr.dtype, np.integer) or (arr < 0).any():
        raise err(f"{op}: shape must be a 1-D tensor of non-negative integers, got {arr!r}")
    return tuple(int(v) for v in arr)


def _dyn_broadcast_to_rel(types, attrs, consts=None):
    op = "dyn.broadcast_to"
    data = expect_tensor(op, types[0], "data")
    shape_t = expect_int_tensor(op, types[1], "shape")
    if consts and consts[1] is not None:
        target = _dyn_shape_values(op, consts[1], TypeInferenceError)
        return TensorType(broadcast_into(op, data.shape, target, TypeInferenceError), data.dtype)
    if shape_t.ndim != 1 or not isinstance(shape_t.shape[0], int):
        raise TypeInferenceError(f"{op}: shape must be a 1-D tensor of static length, got {fmt_shape(shape_t.shape)}")
    return TensorType(broadcast_into(op, data.shape, (Any(),) * shape_t.shape[0], TypeInferenceError),
                      data.dtype)


def _dyn_broadcast_to_shape(attrs, args):
    target = _dyn_shape_values("dyn.broadcast_to", args[1], ShapeError)
    return [broadcast_into("dyn.broadcast_to", concrete(args[0]), target, ShapeError)]


@traceable
def _dyn_broadcast_to_logic(op, attrs, args, err):
    shape, target = args
    if target.values is not None:
        return broadcast_into(op, tuple(shape), _dyn_shape_values(op, target.values, err), err)
    if len(target.shape) != 1 or not is_int_dtype(target.dtype):
        raise err(f"{op}: shape must be a 1-D tensor of non-negative integers, got {target.dtype} {target.shape}")
    values = target.int_values()
    for v in values:
        require(v >= 0, f"{op}: shape must be a 1-D tensor of non-negative integers", err)
    return broadcast_into(op, tuple(shape), values, err)


def _dyn_broadcast_to_compute(attrs, inputs, out_type):
    return [broadcast_to_shape("dyn.broadcast_to", inputs[0], output_dims("dyn.broadcast_to", out_type))]


define(
    "dyn.broadcast_to", 2, _dyn_broadcast_to_rel,
    lambda attrs, x, shape: np.broadcast_to(x, _dyn_broadcast_to_shape(attrs, [np.shape(x), shape])[0]).copy(),
    OpPattern.BROADCAST, attrs=(DYN_SHAPE_ATTR,), shape_logic=_dyn_broadcast_to_logic, data_dependent=(False, True),
    doc="Broadcast to a shape given as a run-time 1-D integer tensor.",
    compute=_dyn_broadcast_to_compute,
)


@traceable
def _tile_logic(op, attrs, shapes, err):
    (shape,) = shapes
    reps = attrs.reps
    ndim = max(len(shape), len(reps))
    shape = (1,) * (ndim - len(shape)) + tuple(shape)
    reps = (1,) * (ndim - len(reps)) + reps
    return tuple(mul_dims(d, r) for d, r in zip(shape, reps, strict=False))


def _tile_compute(attrs, inputs, out_type):
    x = inputs[0]
    reps = tuple(attrs.reps)
    ndim = builtins.max(x.ndim, len(reps))
    dims = (const(1),) * (ndim - x.ndim) + tuple(x.shape)
    reps = (1,) * (ndim - len(reps)) + reps
    shape = tuple(d * r for d, r in zip(dims, reps))

    def f(*i):
        index = [E.floormod(j, d) if r != 1 else j for j, d, r in zip(i, dims, reps)]
        return x[tuple(index[ndim - x.ndim:])]

    return [compute(shape, f, "tile")]


define_shaped(
    "tile", 1, _tile_logic, lambda attrs, shape, x: np.tile(x, attrs.reps), OpPattern.INJECTIVE,
    attrs=(AttrDef("reps", REQUIRED, int_tuple(0)),), doc="Repeat the whole tensor ``reps`` times per dim.",
    compute=_tile_compute,
)


@traceable
def _repeat_logic(op, attrs, shapes, err):
    (shape,) = shapes
    axis = norm_axis(op, attrs.axis, len(shape), err)
    return tuple(shape[:axis]) + (mul_dims(shape[axis], attrs.repeats),) + tuple(shape[axis + 1:])


def _repeat_compute(attrs, inputs, out_type):
    x = inputs[0]
    axis = axis_of("repeat", attrs.axis, x.ndim)
    shape = tuple(d * attrs.repeats if a == axis else d for a, d in enumerate(x.shape))
    return [compute(shape, lambda *i: x[tuple(E.floordiv(j, attrs.repeats) if a == axis else j
                                             for a, j in enumerate(i))], "repeat")]


define_shaped(
    "repeat", 1, _repeat_logic, lambda attrs, shape, x: np.repeat(x, attrs.repeats, axis=attrs.axis),
    OpPattern.BROADCAST,
    attrs=(AttrDef("repeats", REQUIRED, lambda v: _positive(to_int(v))), AttrDef("axis", REQUIRED, to_int)),
    doc="Repeat each element ``repeats`` times along ``axis``.",
    compute=_repeat_compute,
)


@traceable
def _reverse_logic(op, attrs, shapes, err):
    norm_axis(op, attrs.axis, len(shapes[0]), err)
    return tuple(shapes[0])


def _reverse_compute(attrs, inputs, out_type):
    x = inputs[0]
    axis = axis_of("reverse", attrs.axis, x.ndim)
    return [compute(x.shape, lambda *i: x[tuple(x.shape[a] - 1 - j if a == axis else j for a, j in enumerate(i))],
                    "reverse")]


define_shaped(
    "reverse", 1, _reverse_logic, lambda attrs, shape, x: np.flip(x, axis=attrs.axis), OpPattern.INJECTIVE,
    attrs=(AttrDef("axis", REQUIRED, to_int),), doc="Reverse the order of elements along ``axis``.",
    compute=_reverse_compute,
)


# ---------------------------------------------------------------------------------------------------
# shape queries, copy


def _shape_of_compute(attrs, inputs, out_type):
    """The input's dims (te expressions: symbols bound from the array at run time) as a 1-D tensor."""
    x = inputs[0]

    def f(i):
        value = te.const(0, attrs.dtype)
        for axis in range(x.ndim - 1, -1, -1):
            value = te.select(te.eq(i, axis), te.cast(x.shape[axis], attrs.dtype), value)
        return value

    return [te.compute((x.ndim,), f, "shape_of")]


def _ndarray_size_compute(attrs, inputs, out_type):
    x = inputs[0]
    size = te.const(1)
    for d in x.shape:
        size = size * d
    return [te.compute((), lambda: te.cast(size, attrs.dtype), "ndarray_size")]


define_shaped(
    "shape_of", 1, lambda op, attrs, shapes, err: (len(shapes[0]),),
    lambda attrs, shape, x: np.array(x.shape, dtype=attrs.dtype), OpPattern.OPAQUE,
    attrs=(AttrDef("dtype", "int32", to_int_dtype),), dtype_rule=lambda types, attrs: attrs.dtype,
    doc="The shape of a tensor as a 1-D tensor (only the input's shape is read).", compute=_shape_of_compute,
    traceable=True,
)

define_shaped(
    "ndarray_size", 1, lambda op, attrs, shapes, err: (),
    lambda attrs, shape, x: np.array(x.size, dtype=attrs.dtype), OpPattern.OPAQUE,
    attrs=(AttrDef("dtype", "int32", to_int_dtype),), dtype_rule=lambda types, attrs: attrs.dtype,
    doc="The number of elements of a tensor as a scalar.", compute=_ndarray_size_compute,
    traceable=True,
)

define_shaped(
    "copy", 1, lambda op, attrs, shapes, err: tuple(shapes[0]), lambda attrs, shape, x: x.copy(),
    OpPattern.ELEMWISE, doc="A copy of the tensor.",
    compute=unary_compute("copy", lambda x, a: x), traceable=True,
)


# ---------------------------------------------------------------------------------------------------
# one_hot, sequence_mask


@traceable
def _one_hot_logic(op, attrs, shapes, err):
    indices, on_value, off_value = shapes
    if len(on_value) or len(off_value):
        raise err(f"{op}: on_value and off_value must be scalars, got shapes {fmt_shape(on_value)} and "
                  f"{fmt_shape(off_value)}")
    ndim = len(indices)
    if not -ndim - 1 <= attrs.axis <= ndim:
        raise err(f"{op}: axis {attrs.axis} is out of range [{-ndim - 1}, {ndim}] for indices of rank {ndim}")
    axis = attrs.axis % (ndim + 1)
    return tuple(indices[:axis]) + (attrs.depth,) + tuple(indices[axis:])


def _one_hot_kernel(attrs, out_shape, indices, on_value, off_value):
    dtype = attrs.dtype or on_value.dtype
    axis = attrs.axis % (indices.ndim + 1)
    positions = np.arange(attrs.depth).reshape((-1,) + (1,) * (indices.ndim - axis))
    hot = np.expand_dims(indices, axis) == positions
    return np.where(hot, on_value.astype(dtype), off_value.astype(dtype))


def _check_one_hot(types, attrs):
    expect_int_tensor("one_hot", types[0], "indices")
    if types[1].dtype != types[2].dtype:
        raise TypeInferenceError(f"one_hot: on_value and off_value must have one dtype, got {types[1].dtype} "
                                 f"and {types[2].dtype}")


def _one_hot_compute(attrs, inputs, out_type):
    indices, on_value, off_value = inputs
    dtype = output_dtype(out_type)
    axis = attrs.axis % (indices.ndim + 1)
    shape = tuple(indices.shape[:axis]) + (const(attrs.depth),) + tuple(indices.shape[axis:])

    def f(*i):
        position = i[axis]
        hot = eq(cast(indices[tuple(i[:axis]) + tuple(i[axis + 1:])], INDEX_DTYPE), position)
        return select(hot, cast(on_value[()], dtype), cast(off_value[()], dtype))

    return [compute(shape, f, "one_hot")]


define_shaped(
    "one_hot", 3, _one_hot_logic, _one_hot_kernel, OpPattern.OUT_ELEMWISE_FUSABLE,
    attrs=(AttrDef("depth", REQUIRED, lambda v: _nonneg(to_int(v))), AttrDef("axis", -1, to_int),
           AttrDef("dtype", "", to_out_dtype)),
    dtype_rule=lambda types, attrs: attrs.dtype or types[1].dtype, check_types=_check_one_hot,
    doc="on_value where indices == position along the new ``axis`` (of size ``depth``), else off_value; "
        "``dtype`` defaults to on_value's.",
    compute=_one_hot_compute,
)


@traceable
def _sequence_mask_logic(op, attrs, shapes, err):
    data, valid_length = shapes
    if len(data) < 2:
        raise err(f"{op}: data must have rank >= 2, got {fmt_shape(data)}")
    if len(valid_length) != 1:
        raise err(f"{op}: valid_length must be 1-D, got {fmt_shape(valid_length)}")
    unify_dim(op, data[1 - attrs.axis], valid_length[0], "the batch dim of data and valid_length", err)
    return tuple(data)


def _check_valid_length(types, attrs):
    """valid_length: integers, or floats as Relay allows (a step is kept where it is below the length)."""
    t = expect_tensor("sequence_mask", types[1], "valid_length")
    if np.dtype(t.dtype).kind not in "iuf":
        raise TypeInferenceError(f"sequence_mask: valid_length must be of an integer or float dtype, got {t.dtype}")


def _sequence_mask_kernel(attrs, out_shape, data, valid_length):
    floats = valid_length.dtype.kind == "f"
    steps = np.arange(data.shape[attrs.axis], dtype=valid_length.dtype if floats else np.int64)
    lengths = valid_length if floats else valid_length.astype(np.int64)
    mask = steps[:, None] < lengths[None, :] if attrs.axis == 0 else lengths[:, None] > steps[None, :]
    mask = mask.reshape(mask.shape + (1,) * (data.ndim - 2))
    return np.where(mask, data, np.asarray(attrs.mask_value).astype(data.dtype))


def _sequence_mask_compute(attrs, inputs, out_type):
    data, valid_length = inputs
    time_axis, batch_axis = (0, 1) if attrs.axis == 0 else (1, 0)
    masked = const(attrs.mask_value, data.dtype)
    requires = require_equal("sequence_mask", data.shape[batch_axis], valid_length.shape[0],
                              "the batch dim of data and valid_length")

    floats = np.dtype(valid_length.dtype).kind == "f"

    def f(*i):
        if floats:  # (the step compared as a float: a length of 2.5 keeps steps 0, 1 and 2)
            keep = cast(i[time_axis], valid_length.dtype) < valid_length[i[batch_axis]]
        else:
            keep = i[time_axis] < cast(valid_length[i[batch_axis]], INDEX_DTYPE)
        return select(keep, data[i], masked)

    return [compute(data.shape, f, "sequence_mask", requires)]


define_shaped(
    "sequence_mask", 2, _sequence_mask_logic, _sequence_mask_kernel, OpPattern.INJECTIVE,
    attrs=(AttrDef("mask_value", 0.0, to_float), AttrDef("axis", 0, one_of(0, 1))),
    check_types=_check_valid_length,
    doc="Set data[t, b, ...] (axis=0) or data[b, t, ...] (axis=1) to mask_value where t >= valid_length[b] "
        "(valid_length of integers or floats).",
    compute=_sequence_mask_compute,
)


# ---------------------------------------------------------------------------------------------------
# dyn.tile, dyn.expand_dims, dyn.squeeze, dyn.one_hot: an attribute of the static op given instead as a
# run-time tensor (Relay's dyn namespace). The static op's shape logic does the work once the values are
# known: at type inference when the tensor is a constant (exact type), else in the data-dependent shape
# function and the kernel. Without the values the type keeps only the rank, when that is knowable.


def _define_dyn(name: str, static: str, num_data: int, value_attrs: tuple, logic, kernel, rank,
                attrs=(), dtype_rule=None, check_types=None, doc: str = "", compute=None, traced=None):
    """``value_attrs``: per run-time input after the ``num_data`` data inputs, ``(attr name, converter)``
    where the converter turns the input's array into the static op's attribute value (or raises).

    ``traced(op, attrs, shapes, values, err)``: the logic for values read in C (``DataArg`` loads, checked
    as the converters check them), which makes the op's shape logic traceable; known values (run time,
    constants) go through the converters and the static op's logic."""
    def merged(attrs, values, err):
        items = dict(attrs)
        for (key, convert), value in zip(value_attrs, values, strict=True):
            try:
                items[key] = convert(np.asarray(value))
            except (TypeError, ValueError) as exc:
                raise err(f"{name}: bad {key} tensor {np.asarray(value).tolist()!r}: {exc}") from None
        try:
            return get_op(static).normalize_attrs(items)
        except AttrError as exc:
            raise err(f"{name}: {exc}") from None

    def type_rel(types, attrs, consts=None):
        tensors = [expect_tensor(name, t, f"argument {i}") for i, t in enumerate(types)]
        for (key, _), t in zip(value_attrs, tensors[num_data:], strict=True):
            expect_int_tensor(name, t, key)
        if check_types is not None:
            check_types(tensors[:num_data], attrs)
        dtype = dtype_rule(tensors, attrs) if dtype_rule else tensors[0].dtype
        values = list(consts[num_data:]) if consts is not None else [None] * len(value_attrs)
        if all(v is not None for v in values):
            full = merged(attrs, values, TypeInferenceError)
            return TensorType(tuple(logic(name, full, [t.shape for t in tensors[:num_data]], TypeInferenceError)),
                              dtype)
        return TensorType((Any(),) * rank(name, tensors, attrs), dtype)

    def shape_func(attrs, args):
        full = merged(attrs, args[num_data:], ShapeError)
        return [tuple(int(d) for d in logic(name, full, [concrete(s) for s in args[:num_data]], ShapeError))]

    def shape_logic(op, attrs, args, err):
        shapes, values = [tuple(s) for s in args[:num_data]], args[num_data:]
        if all(v.values is not None for v in values):
            return tuple(logic(op, merged(attrs, [v.values for v in values], err), shapes, err))
        return traced(op, attrs, shapes, values, err)

    def checked_kernel(attrs, *arrays):
        arrays = [np.asarray(a) for a in arrays]
        full = merged(attrs, arrays[num_data:], ShapeError)
        out_shape = tuple(logic(name, full, [a.shape for a in arrays[:num_data]], ShapeError))
        return np.asarray(kernel(full, out_shape, *arrays[:num_data]))

    return define(name, num_data + len(value_attrs), type_rel, checked_kernel, OpPattern.OPAQUE,
                  attrs=attrs, shape_func=None if traced else shape_func,
                  data_dependent=(False,) * num_data + (True,) * len(value_attrs), doc=doc, compute=compute,
                  shape_logic=traceable(shape_logic) if traced else None)


def _int_scalar(arr: np.ndarray) -> int:
    if arr.ndim != 0 or arr.dtype.kind not in "iu":
        raise ValueError(f"expected an integer scalar, got {arr.dtype} of shape {arr.shape}")
    return int(arr)


def _int_vector(arr: np.ndarray) -> tuple:
    if arr.ndim != 1 or arr.dtype.kind not in "iu":
        raise ValueError(f"expected a 1-D integer tensor, got {arr.dtype} of shape {arr.shape}")
    return tuple(int(v) for v in arr)


def _static_length(name: str, ty: TensorType, what: str) -> int:
    if ty.ndim != 1 or not isinstance(ty.shape[0], int):
        raise TypeInferenceError(f"{name}: {what} must be a 1-D tensor of static length to know the output "
                                 f"rank, got {fmt_shape(ty.shape)}")
    return ty.shape[0]


def _expect_scalar_tensor(name: str, ty: TensorType, what: str) -> None:
    if ty.ndim != 0:
        raise TypeInferenceError(f"{name}: {what} must be a scalar, got shape {fmt_shape(ty.shape)}")


def _dyn_tile_rank(name, tensors, attrs):
    return max(tensors[0].ndim, _static_length(name, tensors[1], "reps"))


def _dyn_expand_dims_rank(name, tensors, attrs):
    _expect_scalar_tensor(name, tensors[1], "axis")
    return tensors[0].ndim + attrs.num_newaxis


def _dyn_squeeze_rank(name, tensors, attrs):
    length = _static_length(name, tensors[1], "axis")
    if length > tensors[0].ndim:
        raise TypeInferenceError(f"{name}: {length} axes to squeeze from a tensor of rank {tensors[0].ndim}")
    return tensors[0].ndim - length


def _dyn_one_hot_rank(name, tensors, attrs):
    _expect_scalar_tensor(name, tensors[3], "depth")
    ndim = tensors[0].ndim
    if not -ndim - 1 <= attrs.axis <= ndim:  # (static: found in typing, not in the C shape function)
        raise TypeInferenceError(f"{name}: axis {attrs.axis} is out of range [{-ndim - 1}, {ndim}] for indices of "
                                 f"rank {ndim}")
    return ndim + 1


def _read_ints(op: str, data, what: str, rank: int, err) -> list:
    """The values of integer ``data`` of ``rank`` 0 or 1 (a static length) read in C, each checked >= 0
    (what the converters of ``_define_dyn`` check on known values)."""
    if len(data.shape) != rank or data.dtype not in INT_DTYPES:
        raise err(f"{op}: bad {what} tensor: expected a {rank}-D integer tensor, got {data.dtype} of shape "
                  f"{fmt_shape(data.shape)}")
    n = data.shape[0] if rank else 1
    if not const_int(n):
        untraceable(f"reads {what} of a length that is not static (it decides the output rank)")
    values = [data.item(i) for i in range(n)]
    for v in values:
        require(v >= 0, f"{op}: bad {what} tensor: expected values >= 0, got {v}", err)
    return values


def _tile_traced(op, attrs, shapes, values, err):
    return _tile_logic(op, SimpleNamespace(reps=tuple(_read_ints(op, values[0], "reps", 1, err))), shapes, err)


def _expand_dims_traced(op, attrs, shapes, values, err):
    """The run-time axis, checked in range, picks where the new 1s go: each output dim selects the input
    dim before them, a 1, or the input dim after them."""
    (shape,), axis, n = shapes, values[0], attrs.num_newaxis
    ndim = len(shape)
    if axis.shape != () or axis.dtype not in INT_DTYPES:
        raise err(f"{op}: bad axis tensor: expected an integer scalar, got {axis.dtype} of shape "
                  f"{fmt_shape(axis.shape)}")
    a = axis.item(0)
    require(dim_and(a >= -ndim - 1, a <= ndim), f"{op}: axis {a} is out of range [{-ndim - 1}, {ndim}] for rank "
                                                f"{ndim}", err)
    pos = dim_select(a < 0, a + (ndim + 1), a)
    return tuple(dim_select(pos > i, shape[i] if i < ndim else 1,
                            dim_select(pos + n > i, 1, shape[i - n] if i >= n else 1)) for i in range(ndim + n))


def _squeeze_traced(op, attrs, shapes, values, err):
    """The run-time axes (a static number), checked in range, distinct and naming dims of 1; output dim j
    selects the j-th input dim no axis names."""
    (shape,), axes = shapes, values[0]
    ndim = len(shape)
    if len(axes.shape) != 1 or axes.dtype not in INT_DTYPES:
        raise err(f"{op}: bad axis tensor: expected a 1-D integer tensor, got {axes.dtype} of shape "
                  f"{fmt_shape(axes.shape)}")
    if not const_int(axes.shape[0]):
        untraceable("reads axes of a length that is not static (it decides the output rank)")
    read = [axes.item(j) for j in range(axes.shape[0])]
    for a in read:
        require(dim_and(a >= -ndim, a < ndim), f"{op}: axis {a} is out of range for a tensor of rank {ndim}", err)
    norm = [dim_select(a < 0, a + ndim, a) for a in read]
    for j, a in enumerate(norm):
        for b in norm[j + 1:]:
            require(a != b, f"{op}: axis {read[j]} is repeated in the axes", err)
    before, out = 0, [0] * (ndim - len(norm))
    for t, d in enumerate(shape):
        named = False
        for a in norm:
            named = dim_or(named, a == t)
        require(dim_or(dim_not(named), d == 1), f"{op}: squeezed dim {t} must be 1, got {d}", err)
        for j in range(len(out)):
            out[j] = dim_select(dim_and(dim_not(named), before == j), d, out[j])
        before = before + dim_select(named, 0, 1)
    return tuple(out)


def _one_hot_traced(op, attrs, shapes, values, err):
    (depth,) = _read_ints(op, values[0], "depth", 0, err)
    return _one_hot_logic(op, SimpleNamespace(axis=attrs.axis, depth=depth), shapes, err)


# Their computes read the output dims from the output array (the shape function gave them), so the
# run-time attribute is needed only where it picks the element: one_hot's depth is the output dim.


def _dyn_tile_compute(attrs, inputs, out_type):
    from ._compute import output_dims as _output_dims

    x = inputs[0]
    shape = _output_dims("dyn.tile", out_type)
    offset = len(shape) - x.ndim
    return [te.compute(shape, lambda *i: x[tuple(te.floormod(i[a + offset], d) for a, d in enumerate(x.shape))],
                       "dyn_tile")]


def _dyn_one_hot_compute(attrs, inputs, out_type):
    from ._compute import output_dims as _output_dims

    indices, on_value, off_value, _ = inputs
    shape = _output_dims("dyn.one_hot", out_type)
    axis = attrs.axis % (indices.ndim + 1)

    def f(*i):
        hot = te.eq(te.cast(indices[tuple(i[:axis]) + tuple(i[axis + 1:])], te.INDEX_DTYPE), i[axis])
        return te.select(hot, te.cast(on_value[()], out_type.dtype), te.cast(off_value[()], out_type.dtype))

    return [te.compute(shape, f, "dyn_one_hot")]


_define_dyn("dyn.tile", "tile", 1, (("reps", lambda a: int_tuple(0)(_int_vector(a))),), _tile_logic,
            lambda attrs, shape, x: np.tile(x, attrs.reps), _dyn_tile_rank,
            doc="tile(data, reps) with ``reps`` a run-time 1-D integer tensor.", compute=_dyn_tile_compute,
            traced=_tile_traced)
_define_dyn("dyn.expand_dims", "expand_dims", 1, (("axis", _int_scalar),), _expand_dims_logic,
            lambda attrs, shape, x: x.reshape(shape), _dyn_expand_dims_rank,
            attrs=(AttrDef("num_newaxis", 1, lambda v: _nonneg(to_int(v))),),
            doc="expand_dims(data, axis) with ``axis`` a run-time integer scalar.",
            compute=_dyn_reshape_compute("dyn.expand_dims"), traced=_expand_dims_traced)
_define_dyn("dyn.squeeze", "squeeze", 1, (("axis", _int_vector),), _squeeze_logic,
            lambda attrs, shape, x: x.reshape(shape), _dyn_squeeze_rank,
            doc="squeeze(data, axis) with ``axis`` a run-time 1-D integer tensor of the axes to remove.",
            compute=_dyn_reshape_compute("dyn.squeeze"), traced=_squeeze_traced)
_define_dyn("dyn.one_hot", "one_hot", 3, (("depth", lambda a: _nonneg(_int_scalar(a))),), _one_hot_logic,
            _one_hot_kernel, _dyn_one_hot_rank,
            attrs=(AttrDef("axis", -1, to_int), AttrDef("dtype", "", to_out_dtype)),
            dtype_rule=lambda types, attrs: attrs.dtype or types[1].dtype, check_types=_check_one_hot,
            doc="one_hot(indices, on_value, off_value, depth) with ``depth`` a run-time integer scalar.",
            compute=_dyn_one_hot_compute, traced=_one_hot_traced)
