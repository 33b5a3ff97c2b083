"""Scalar expressions of tensor expressions (te): constants, variables, arithmetic, intrinsics, selects,
casts, tensor reads and reductions.

Nodes are frozen dataclasses compared *structurally* (``==`` and ``hash`` look at the fields, and the
hash is cached), except ``Var`` which is an identity: two ``var("n")`` are different variables. Python
operators build expressions (``a + 1``, ``a < b``, ``-a``); ``==``/``!=`` are kept for structural
equality, so equality *expressions* are built with ``eq(a, b)`` / ``ne(a, b)``. An expression has no
truth value (``if expr:`` raises) so that a forgotten ``if_then_else`` cannot pass silently.

Every node has a dtype. Index arithmetic is ``int64`` (``INDEX_DTYPE``); a Python number next to an
expression takes the expression's dtype; two integer dtypes promote to the wider one; any other mix is
an error (cast explicitly). Builders fold constants and apply the identities that are exact in the
dtype (``x + 0`` for integers, ``x * 1`` for all, ``select(True, a, b)``...), so static index math
stays readable and static shapes become plain numbers.

Invariant used by the code generator: a ``Var`` stands for a loop counter or a dimension, so its value
is never negative.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from ..errors import TypeInferenceError
from ..ir.types import normalize_dtype

__all__ = [
    "INDEX_DTYPE", "PrimExpr", "Const", "Var", "Binary", "Unary", "Call", "Select", "Cast", "TensorRead",
    "Reduce", "IterVar", "const", "as_expr", "var", "eq", "ne", "logical_and", "logical_or", "logical_not",
    "logical_xor", "bitwise_and", "bitwise_or", "bitwise_xor", "bitwise_not", "left_shift", "right_shift",
    "floordiv", "floormod", "truncdiv", "truncmod", "true_divide", "minimum", "maximum", "power", "select",
    "if_then_else", "cast", "call", "all_of", "any_of", "product", "is_const", "const_value", "dtype_kind", "max_value",
    "min_value", "INTRINSICS", "index_check",
]

INDEX_DTYPE = "int64"

# Binary operators: name -> C-like symbol (used by repr); comparison and logic results are bool.
ARITH_OPS = ("add", "sub", "mul", "div", "floordiv", "floormod", "truncdiv", "truncmod", "min", "max", "pow")
COMPARE_OPS = ("eq", "ne", "lt", "le", "gt", "ge")
LOGIC_OPS = ("and", "or", "xor")
BIT_OPS = ("bitand", "bitor", "bitxor", "shl", "shr")
_SYMBOLS = {"add": "+", "sub": "-", "mul": "*", "div": "/", "eq": "==", "ne": "!=", "lt": "<", "le": "<=",
            "gt": ">", "ge": ">=", "and": "&&", "or": "||", "xor": "^^", "bitand": "&", "bitor": "|",
            "bitxor": "^", "shl": "<<", "shr": ">>"}


def dtype_kind(dtype: str) -> str:
    """'f' float, 'i' signed int, 'u' unsigned int, 'b' bool."""
    return np.dtype(dtype).kind


def max_value(dtype: str):
    kind = dtype_kind(dtype)
    if kind == "f":
        return math.inf
    if kind == "b":
        return True
    return int(np.iinfo(dtype).max)


def min_value(dtype: str):
    kind = dtype_kind(dtype)
    if kind == "f":
        return -math.inf
    if kind == "b":
        return False
    return int(np.iinfo(dtype).min)


# ---- nodes ----------------------------------------------------------------------------------------


class PrimExpr:
    """Base class of scalar expressions; Python operators build new expressions."""

    dtype: str

    def __bool__(self):
        raise TypeError("a te expression has no truth value; build conditions with te.if_then_else, "
                        "te.all_of or te.any_of")

    def __add__(self, other):
        return _binary("add", self, other)

    def __radd__(self, other):
        return _binary("add", other, self)

    def __sub__(self, other):
        return _binary("sub", self, other)

    def __rsub__(self, other):
        return _binary("sub", other, self)

    def __mul__(self, other):
        return _binary("mul", self, other)

    def __rmul__(self, other):
        return _binary("mul", other, self)

    def __truediv__(self, other):
        return true_divide(self, other)

    def __rtruediv__(self, other):
        return true_divide(other, self)

    def __floordiv__(self, other):
        return floordiv(self, other)

    def __rfloordiv__(self, other):
        return floordiv(other, self)

    def __mod__(self, other):
        return floormod(self, other)

    def __rmod__(self, other):
        return floormod(other, self)

    def __neg__(self):
        return _unary("neg", self)

    def __lt__(self, other):
        return _binary("lt", self, other)

    def __le__(self, other):
        return _binary("le", self, other)

    def __gt__(self, other):
        return _binary("gt", self, other)

    def __ge__(self, other):
        return _binary("ge", self, other)

    def __and__(self, other):
        return _logic_or_bits("and", "bitand", self, other)

    def __rand__(self, other):
        return _logic_or_bits("and", "bitand", other, self)

    def __or__(self, other):
        return _logic_or_bits("or", "bitor", self, other)

    def __ror__(self, other):
        return _logic_or_bits("or", "bitor", other, self)

    def __invert__(self):
        return bitwise_not(self)

    def astype(self, dtype: str) -> PrimExpr:
        return cast(self, dtype)


def _node(cls):
    """A frozen dataclass compared structurally, with a cached hash (expression trees get deep)."""
    cls = dataclass(frozen=True, repr=False)(cls)
    generated_hash, generated_eq = cls.__hash__, cls.__eq__

    def __hash__(self):
        cached = self.__dict__.get("_hash")
        if cached is None:
            cached = generated_hash(self)
            object.__setattr__(self, "_hash", cached)
        return cached

    def __eq__(self, other):
        if self is other:
            return True
        if other.__class__ is not self.__class__ or hash(self) != hash(other):
            return False
        return generated_eq(self, other)

    cls.__hash__, cls.__eq__ = __hash__, __eq__
    return cls


@_node
class Const(PrimExpr):
    value: object  # int, float or bool, already representable in dtype
    dtype: str

    def __repr__(self):
        return repr(self.value) if self.dtype in (INDEX_DTYPE, "float32", "bool") else f"{self.value!r}:{self.dtype}"


@dataclass(frozen=True, eq=False, repr=False)
class Var(PrimExpr):
    """A named scalar variable (a loop counter or a dimension); compared by identity."""

    name: str
    dtype: str = INDEX_DTYPE

    def __repr__(self):
        return self.name


@_node
class Binary(PrimExpr):
    op: str
    a: PrimExpr
    b: PrimExpr
    dtype: str

    def __repr__(self):
        if self.op in _SYMBOLS:
            return f"({self.a!r} {_SYMBOLS[self.op]} {self.b!r})"
        return f"{self.op}({self.a!r}, {self.b!r})"


@_node
class Unary(PrimExpr):
    op: str  # neg, not, bitnot
    a: PrimExpr
    dtype: str

    def __repr__(self):
        return f"{ {'neg': '-', 'not': '!', 'bitnot': '~'}[self.op]}{self.a!r}"


@_node
class Call(PrimExpr):
    """An intrinsic function (``exp``, ``erf``, ``isnan``...; see ``INTRINSICS``)."""

    name: str
    args: tuple
    dtype: str

    def __repr__(self):
        return f"{self.name}({', '.join(map(repr, self.args))})"


@_node
class Select(PrimExpr):
    """``cond ? true_value : false_value``; only the chosen branch is evaluated (safe for guarded reads)."""

    cond: PrimExpr
    true_value: PrimExpr
    false_value: PrimExpr
    dtype: str

    def __repr__(self):
        return f"select({self.cond!r}, {self.true_value!r}, {self.false_value!r})"


@_node
class Cast(PrimExpr):
    value: PrimExpr
    dtype: str

    def __repr__(self):
        return f"{self.dtype}({self.value!r})"


@_node
class TensorRead(PrimExpr):
    """``tensor[indices]`` for a te ``Tensor`` (compared by identity)."""

    tensor: object
    indices: tuple
    dtype: str

    def __repr__(self):
        return f"{self.tensor.name}[{', '.join(map(repr, self.indices))}]"


@_node
class IterVar:
    """A loop axis: its variable and extent; ``kind`` is "spatial" (an output axis) or "reduce"."""

    var: Var
    extent: PrimExpr
    kind: str = "spatial"

    def __repr__(self):
        return f"{self.var.name}:{self.kind}[{self.extent!r}]"


@_node
class Reduce(PrimExpr):
    """A reduction over ``axes``; only allowed at the top of a compute body.

    ``combiner`` is sum, prod, max, min, argmax, argmin, argmax_last or argmin_last (``_last``: ties go to
    the last index). Arg-reductions carry two sources ``(index, value)`` and give the index for
    ``value_index`` 0 and the value for 1. ``condition`` (optional) skips elements where it is false.
    ``acc_dtype`` is the dtype the accumulation happens in (float16 sums accumulate in float32).
    """

    combiner: str
    sources: tuple
    axes: tuple
    condition: PrimExpr | None
    value_index: int
    dtype: str
    acc_dtype: str = field(default="")

    def __repr__(self):
        cond = f", where={self.condition!r}" if self.condition is not None else ""
        return f"{self.combiner}[{self.value_index}]({', '.join(map(repr, self.sources))}, axes={list(self.axes)}{cond})"


# ---- constants and conversion ---------------------------------------------------------------------


def _check_dtype(dtype) -> str:
    try:
        return normalize_dtype(dtype)
    except ValueError as err:
        raise TypeInferenceError(f"te: {err}") from None


def const(value, dtype: str | None = None) -> Const:
    """A constant; without dtype, bools are bool, ints int64 (index) and floats float32."""
    if isinstance(value, Const):
        return value if dtype is None else cast(value, dtype)
    if isinstance(value, np.generic):
        dtype = dtype or value.dtype.name
        value = value.item()
    if dtype is None:
        dtype = "bool" if isinstance(value, bool) else INDEX_DTYPE if isinstance(value, int) else "float32"
    dtype = _check_dtype(dtype)
    return Const(_representable(value, dtype), dtype)


def _representable(value, dtype: str):
    """The Python value ``value`` takes in ``dtype`` (float32 rounding, integer wrap-around)."""
    kind = dtype_kind(dtype)
    if kind == "b":
        return bool(value)
    if kind == "f":
        with np.errstate(all="ignore"):
            return float(np.asarray(value, dtype="float64").astype(dtype))
    if isinstance(value, float):
        if not value.is_integer():
            raise TypeInferenceError(f"te: the non-integral value {value} cannot be a {dtype} constant")
    bits = np.dtype(dtype).itemsize * 8
    wrapped = int(value) & ((1 << bits) - 1)
    if kind == "i" and wrapped >= 1 << (bits - 1):
        wrapped -= 1 << bits
    return wrapped


def as_expr(value, dtype: str | None = None) -> PrimExpr:
    """A Python number or expression as an expression (of ``dtype`` for a number, when given)."""
    if isinstance(value, PrimExpr):
        return value
    if isinstance(value, IterVar):
        return value.var
    if isinstance(value, (bool, int, float, np.generic)):
        if dtype is not None and isinstance(value, float) and dtype_kind(dtype) in "iu" \
                and not float(value).is_integer():
            raise TypeInferenceError(f"te: the non-integral value {value} cannot meet a {dtype} expression")
        return const(value, dtype)
    raise TypeInferenceError(f"te: expected an expression or a number, got {type(value).__name__} {value!r}")


def var(name: str, dtype: str = INDEX_DTYPE) -> Var:
    """A symbolic (non-negative) dimension or index variable."""
    return Var(name, _check_dtype(dtype))


def is_const(expr, value=None) -> bool:
    return isinstance(expr, Const) and (value is None or expr.value == value)


def const_value(expr):
    return expr.value if isinstance(expr, Const) else None


def _coerce(a, b, what: str) -> tuple[PrimExpr, PrimExpr]:
    """Bring two operands to one dtype (see the module docstring for the rules)."""
    if not isinstance(a, PrimExpr) and not isinstance(b, PrimExpr):
        a = as_expr(a)
    if not isinstance(a, PrimExpr):
        return as_expr(a, b.dtype), b
    if not isinstance(b, PrimExpr):
        return a, as_expr(b, a.dtype)
    if a.dtype == b.dtype:
        return a, b
    ka, kb = dtype_kind(a.dtype), dtype_kind(b.dtype)
    if ka in "iu" and kb in "iu":
        wider = np.promote_types(a.dtype, b.dtype).name
        if dtype_kind(wider) in "iu":
            return cast(a, wider), cast(b, wider)
    raise TypeInferenceError(f"te: {what} of {a.dtype} and {b.dtype}; cast one operand explicitly")


# ---- constant folding -----------------------------------------------------------------------------


def _np(c: Const):
    return np.asarray(c.value, dtype=c.dtype)


def _fold_binary(op: str, a: Const, b: Const, dtype: str) -> Const | None:
    x, y = _np(a), _np(b)
    kind = dtype_kind(a.dtype)
    with np.errstate(all="ignore"):
        if op in ("floordiv", "floormod", "truncdiv", "truncmod") and kind in "iu" and y == 0:
            return None  # keep the run-time error
        if op == "pow" and kind in "iu":
            return None  # integer powers have special cases; the kernel helper handles them
        result = {
            "add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.true_divide,
            "floordiv": np.floor_divide, "floormod": np.remainder, "min": np.minimum, "max": np.maximum,
            "pow": np.power, "eq": np.equal, "ne": np.not_equal, "lt": np.less, "le": np.less_equal,
            "gt": np.greater, "ge": np.greater_equal, "and": np.logical_and, "or": np.logical_or,
            "xor": np.logical_xor, "bitand": np.bitwise_and, "bitor": np.bitwise_or, "bitxor": np.bitwise_xor,
            "truncmod": np.fmod,
        }.get(op)
        if op == "truncdiv":
            value = (x - np.fmod(x, y)) // y if kind in "iu" else np.trunc(x / y)
        elif op in ("shl", "shr"):
            return None
        elif result is None:
            return None
        else:
            value = result(x, y)
    return Const(_representable(np.asarray(value).astype(dtype).item(), dtype), dtype)


# ---- builders -------------------------------------------------------------------------------------


def _binary(op: str, a, b) -> PrimExpr:
    a, b = _coerce(a, b, op)
    kind = dtype_kind(a.dtype)
    if op in ("and", "or", "xor") and (a.dtype != "bool"):
        raise TypeInferenceError(f"te: logical {op} needs bool operands, got {a.dtype}")
    if op == "div" and kind != "f":
        raise TypeInferenceError(f"te: true division of {a.dtype} values; use floordiv or truncdiv for integers")
    dtype = "bool" if op in COMPARE_OPS or op in LOGIC_OPS else a.dtype
    if isinstance(a, Const) and isinstance(b, Const):
        folded = _fold_binary(op, a, b, dtype)
        if folded is not None:
            return folded
    simplified = _simplify(op, a, b, kind)
    if simplified is not None:
        return simplified
    return Binary(op, a, b, dtype)


def _simplify(op: str, a: PrimExpr, b: PrimExpr, kind: str) -> PrimExpr | None:
    """Identities exact in the dtype; ``None`` when nothing applies."""
    integer = kind in "iu"
    if op == "add" and integer:
        if is_const(a, 0):
            return b
        if is_const(b, 0):
            return a
        if isinstance(a, Const):  # constants to the right
            return _binary("add", b, a)
        if isinstance(b, Const) and isinstance(a, Binary) and a.op == "add" and isinstance(a.b, Const):
            return _binary("add", a.a, _binary("add", a.b, b))
    if op == "sub":
        if is_const(b, 0):
            return a
        if integer and a == b:
            return Const(0, a.dtype)
        if integer and isinstance(b, Const) and kind == "i":
            return _binary("add", a, Const(_representable(-b.value, b.dtype), b.dtype))
    if op == "mul":
        if is_const(b, 1):
            return a
        if is_const(a, 1):
            return b
        if integer and (is_const(a, 0) or is_const(b, 0)):
            return Const(0, a.dtype)
        if isinstance(a, Const) and integer:
            return _binary("mul", b, a)
        if integer and isinstance(b, Const) and isinstance(a, Binary) and a.op == "mul" and isinstance(a.b, Const):
            return _binary("mul", a.a, _binary("mul", a.b, b))
    if op == "div" and is_const(b, 1):
        return a
    if op in ("floordiv", "truncdiv") and integer:
        if is_const(b, 1):
            return a
        if isinstance(b, Const) and b.value > 0 and isinstance(a, Binary) and a.op == "mul" \
                and isinstance(a.b, Const) and a.b.value % b.value == 0:
            return _binary("mul", a.a, a.b.value // b.value)
    if op in ("floormod", "truncmod") and integer:
        if is_const(b, 1):
            return Const(0, a.dtype)
        if isinstance(b, Const) and b.value > 0 and isinstance(a, Binary) and a.op == "mul" \
                and isinstance(a.b, Const) and a.b.value % b.value == 0:
            return Const(0, a.dtype)
    if op in ("min", "max") and a == b:
        return a
    if op in ("eq", "le", "ge") and integer and a == b:
        return Const(True, "bool")
    if op in ("ne", "lt", "gt") and integer and a == b:
        return Const(False, "bool")
    if op == "and":
        for x, y in ((a, b), (b, a)):
            if is_const(x, True):
                return y
            if is_const(x, False):
                return Const(False, "bool")
    if op == "or":
        for x, y in ((a, b), (b, a)):
            if is_const(x, False):
                return y
            if is_const(x, True):
                return Const(True, "bool")
    return None


def _unary(op: str, a) -> PrimExpr:
    a = as_expr(a)
    if op == "not" and a.dtype != "bool":
        raise TypeInferenceError(f"te: logical not needs a bool operand, got {a.dtype}")
    if op == "neg" and a.dtype == "bool":
        raise TypeInferenceError("te: cannot negate a bool; use logical_not")
    if isinstance(a, Const):
        with np.errstate(all="ignore"):
            value = {"neg": np.negative, "not": np.logical_not, "bitnot": np.invert}[op](_np(a))
        return Const(_representable(np.asarray(value).astype(a.dtype).item(), a.dtype), a.dtype)
    if isinstance(a, Unary) and a.op == op and op in ("not", "bitnot"):
        return a.a
    return Unary(op, a, a.dtype)


def _logic_or_bits(logic_op: str, bit_op: str, a, b) -> PrimExpr:
    a, b = _coerce(a, b, bit_op)
    return _binary(logic_op if a.dtype == "bool" else bit_op, a, b)


def eq(a, b) -> PrimExpr:
    return _binary("eq", a, b)


def ne(a, b) -> PrimExpr:
    return _binary("ne", a, b)


def logical_and(a, b) -> PrimExpr:
    return _binary("and", a, b)


def logical_or(a, b) -> PrimExpr:
    return _binary("or", a, b)


def logical_xor(a, b) -> PrimExpr:
    return _binary("xor", a, b)


def logical_not(a) -> PrimExpr:
    return _unary("not", a)


def all_of(*conds) -> PrimExpr:
    result = Const(True, "bool")
    for c in conds:
        result = logical_and(result, c)
    return result


def any_of(*conds) -> PrimExpr:
    result = Const(False, "bool")
    for c in conds:
        result = logical_or(result, c)
    return result


def product(dims) -> PrimExpr:
    """The product of ``dims`` (ints or expressions; 1 for none), folded where they are constants."""
    total = const(1)
    for d in dims:
        total = total * d
    return total


def _integer_binary(op: str, a, b) -> PrimExpr:
    a, b = _coerce(a, b, op)
    if dtype_kind(a.dtype) not in "iub":
        raise TypeInferenceError(f"te: {op} needs integer operands, got {a.dtype}")
    return _binary(op, a, b)


def bitwise_and(a, b) -> PrimExpr:
    return _logic_or_bits("and", "bitand", a, b)


def bitwise_or(a, b) -> PrimExpr:
    return _logic_or_bits("or", "bitor", a, b)


def bitwise_xor(a, b) -> PrimExpr:
    return _logic_or_bits("xor", "bitxor", a, b)


def bitwise_not(a) -> PrimExpr:
    a = as_expr(a)
    if a.dtype == "bool":
        return logical_not(a)
    if dtype_kind(a.dtype) not in "iu":
        raise TypeInferenceError(f"te: bitwise not needs an integer or bool operand, got {a.dtype}")
    return _unary("bitnot", a)


def left_shift(a, b) -> PrimExpr:
    """``a << b``; a count outside [0, bits) gives 0 (NumPy's rule)."""
    return _integer_binary("shl", a, b)


def right_shift(a, b) -> PrimExpr:
    """Arithmetic ``a >> b``; a count outside [0, bits) gives 0 or -1 (NumPy's rule)."""
    return _integer_binary("shr", a, b)


def floordiv(a, b) -> PrimExpr:
    """Division rounded toward negative infinity (NumPy's ``//`` for integers and floats)."""
    return _binary("floordiv", a, b)


def floormod(a, b) -> PrimExpr:
    """The remainder with the sign of the divisor (NumPy's ``%``)."""
    return _binary("floormod", a, b)


def truncdiv(a, b) -> PrimExpr:
    """Division rounded toward zero (C's ``/``)."""
    return _binary("truncdiv", a, b)


def truncmod(a, b) -> PrimExpr:
    """The remainder with the sign of the dividend (C's ``%``, ``fmod`` for floats)."""
    return _binary("truncmod", a, b)


def true_divide(a, b) -> PrimExpr:
    return _binary("div", a, b)


def minimum(a, b) -> PrimExpr:
    """Elementwise minimum; for floats a NaN operand gives NaN (like NumPy)."""
    return _binary("min", a, b)


def maximum(a, b) -> PrimExpr:
    """Elementwise maximum; for floats a NaN operand gives NaN (like NumPy)."""
    return _binary("max", a, b)


def power(a, b) -> PrimExpr:
    """``a ** b``; an integer base to a negative power truncates toward zero (like 1 / a**n)."""
    return _binary("pow", a, b)


def select(cond, true_value, false_value) -> PrimExpr:
    """``cond ? true_value : false_value``; only the chosen branch is evaluated."""
    cond = as_expr(cond)
    if cond.dtype != "bool":
        raise TypeInferenceError(f"te: a select condition must be bool, got {cond.dtype}")
    t, f = _coerce(true_value, false_value, "select")
    if isinstance(cond, Const):
        return t if cond.value else f
    if t == f:
        return t
    if isinstance(cond, Unary) and cond.op == "not":
        return Select(cond.a, f, t, t.dtype)
    return Select(cond, t, f, t.dtype)


if_then_else = select


def cast(value, dtype: str) -> PrimExpr:
    """Convert with C rules (float to int truncates; to bool tests for nonzero)."""
    dtype = _check_dtype(dtype)
    value = as_expr(value, dtype if not isinstance(value, PrimExpr) else None)
    if value.dtype == dtype:
        return value
    if isinstance(value, Const):
        with np.errstate(all="ignore"):
            converted = np.asarray(value.value, dtype=value.dtype).astype(dtype).item()
        return Const(_representable(converted, dtype), dtype)
    if isinstance(value, Cast) and _widens(value.value.dtype, value.dtype) and dtype == value.value.dtype:
        return value.value  # a lossless round trip
    return Cast(value, dtype)


def _widens(src: str, dst: str) -> bool:
    return np.can_cast(src, dst, "safe")


# ---- intrinsics ------------------------------------------------------------------------------------


def _np_sigmoid(x):
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1 / (1 + e), e / (1 + e))


# name -> (number of args, allowed dtype kinds, result dtype ("" = the argument's), NumPy fold function)
INTRINSICS = {
    "exp": (1, "f", "", np.exp), "log": (1, "f", "", np.log), "log2": (1, "f", "", np.log2),
    "log10": (1, "f", "", np.log10), "log1p": (1, "f", "", np.log1p), "sqrt": (1, "f", "", np.sqrt), "rsqrt": (1, "f", "", lambda x: 1 / np.sqrt(x)),
    "tanh": (1, "f", "", np.tanh), "sigmoid": (1, "f", "", _np_sigmoid),
    "erf": (1, "f", "", np.vectorize(math.erf)), "sin": (1, "f", "", np.sin), "cos": (1, "f", "", np.cos),
    "tan": (1, "f", "", np.tan), "asin": (1, "f", "", np.arcsin), "acos": (1, "f", "", np.arccos),
    "atan": (1, "f", "", np.arctan), "sinh": (1, "f", "", np.sinh), "cosh": (1, "f", "", np.cosh),
    "asinh": (1, "f", "", np.arcsinh), "acosh": (1, "f", "", np.arccosh), "atanh": (1, "f", "", np.arctanh),
    "floor": (1, "f", "", np.floor), "ceil": (1, "f", "", np.ceil),
    "round": (1, "f", "", np.rint), "trunc": (1, "f", "", np.trunc),
    "abs": (1, "fiu", "", np.abs), "sign": (1, "fiu", "", np.sign),
    "isnan": (1, "fiu", "bool", np.isnan), "isinf": (1, "fiu", "bool", np.isinf),
    "isfinite": (1, "fiu", "bool", np.isfinite),
}


def index_check(index, extent) -> PrimExpr:
    """``index`` (in ``[-extent, extent)``) mapped into ``[0, extent)``; out of range is a run-time error."""
    index, extent = cast(as_expr(index, INDEX_DTYPE), INDEX_DTYPE), cast(as_expr(extent, INDEX_DTYPE), INDEX_DTYPE)
    if isinstance(index, Const) and isinstance(extent, Const) and -extent.value <= index.value < extent.value:
        return Const(index.value % extent.value, INDEX_DTYPE)
    return Call("index_check", (index, extent), INDEX_DTYPE)


def call(name: str, *args) -> PrimExpr:
    """An intrinsic function call (see ``INTRINSICS``); constant arguments are folded."""
    if name == "index_check":
        return index_check(*args)
    if name not in INTRINSICS:
        raise TypeInferenceError(f"te: unknown intrinsic {name!r}; expected one of {', '.join(INTRINSICS)}")
    arity, kinds, out_dtype, fold = INTRINSICS[name]
    args = tuple(as_expr(a) for a in args)
    if len(args) != arity:
        raise TypeInferenceError(f"te: {name} takes {arity} argument(s), got {len(args)}")
    dtype = args[0].dtype
    if dtype_kind(dtype) not in kinds:
        raise TypeInferenceError(f"te: {name} is not defined for {dtype}")
    result_dtype = out_dtype or dtype
    if all(isinstance(a, Const) for a in args):
        with np.errstate(all="ignore"):
            value = np.asarray(fold(*(_np(a) for a in args))).astype(result_dtype).item()
        return Const(_representable(value, result_dtype), result_dtype)
    return Call(name, args, result_dtype)
