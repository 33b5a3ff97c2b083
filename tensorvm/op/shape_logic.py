"""The symbolic domain shape logic is written over, so that one logic serves three uses.

An op's shape logic (``OpDef.shape_logic``, ``logic(op, attrs, shapes, err) -> shape | [shape, ...]``)
computes its output shape(s) from its inputs' shapes (and, for a data-dependent op, from the inputs'
data, see ``DataArg``). It is run over three kinds of dims:

* Python ints: the run-time shape function (``err`` is ``ShapeError``);
* typed dims (ints, ``Any``, ``SymDim``): type inference (``err`` is ``TypeInferenceError``);
* symbolic C expressions (``Sym``): the C shape function of a fused primitive
  (``tensorvm.vm.shape_c``), where a dim is an expression over the primitive's input shapes and data.

The helpers below (``require``, ``dim_select``, ``dim_min``...) and the dim helpers of ``_common`` and
``transform`` (``broadcast_dim``, ``unify_dim``, ``prod_dims``...) dispatch on the kind of their
operands, so the int and typed behaviour is what it always was and a ``Sym`` builds an expression. A
check on symbolic dims is a ``require(cond, message, err)``: over ints it raises at once, over ``Sym``
it is recorded in the active trace and becomes a C test returning an error code. A ``Sym`` used where
Python needs a plain value (``if``, ``int()``, an index, a ``range``) raises ``ShapeLogicTraceError``
naming the op: a logic that cannot be traced is found, never miscompiled.

C semantics: dims are ``int64_t``; ``//`` and ``%`` are Python's floor division and modulo
(``tv_shape_floordiv``/``tv_shape_floormod`` in ``codegen/lib/tv_shape.h``); ``+``, ``-`` and ``*``
note an overflow, which fails the shape function (``tv_shape_add``...: Python's ints do not wrap, so
neither may C's dims); values loaded from float data are ``double``.
"""

from __future__ import annotations

import math
import operator
import threading
from dataclasses import dataclass

import numpy as np

from ..errors import UnsupportedError
from ._library import DTYPE_CODES

__all__ = [
    "Sym", "Leaf", "Bin", "Not", "Select", "CCall", "ShapeLogicTraceError", "is_sym", "require", "dim_select",
    "dim_min", "dim_max", "supported", "dim_and", "dim_or", "dim_not", "Trace", "tracing", "current_trace",
    "c_expr", "DataArg", "count_nonzero", "count_sorted_runs", "const_int", "traceable", "binary", "untraceable", "is_finite", "floor_int", "as_double", "ceil_length", "slice_length", "round_half_even",
]


class ShapeLogicTraceError(UnsupportedError):
    """A shape logic cannot be traced into C (it branches on a symbolic dim, or produces ``Any``)."""


# ---- the trace ------------------------------------------------------------------------------------


class Trace:
    """What tracing one op's logic records: the op's name and its ``(condition, message, kind)`` checks
    (kind "error": a failed ``require``; "defer": outside what the trace covers, see ``supported``)."""

    def __init__(self, op: str):
        self.op = op
        self.requires: list = []


_LOCAL = threading.local()  # the active traces, per thread (executables may be built concurrently)


def _traces() -> list:
    traces = getattr(_LOCAL, "traces", None)
    if traces is None:
        traces = _LOCAL.traces = []
    return traces


class tracing:
    """``with tracing(op) as trace:`` runs a logic over ``Sym`` dims, collecting its requires."""

    def __init__(self, op: str):
        self.trace = Trace(op)

    def __enter__(self) -> Trace:
        _traces().append(self.trace)
        return self.trace

    def __exit__(self, *exc):
        _traces().pop()
        return False


def current_trace() -> Trace | None:
    traces = _traces()
    return traces[-1] if traces else None


def untraceable(what: str):
    """Raise ``ShapeLogicTraceError``: the logic being traced ``what`` (a case its C form cannot cover)."""
    trace = current_trace()
    op = trace.op if trace is not None else "shape logic"
    raise ShapeLogicTraceError(f"{op}: its shape logic {what}; write the check with shape_logic.require/dim_select "
                               f"so that it can be traced into C")


# ---- symbolic expressions -------------------------------------------------------------------------


def is_sym(value) -> bool:
    return isinstance(value, Sym)


class Sym:
    """A symbolic int64 (or double) C expression. Arithmetic and comparisons build new expressions
    (folding constants); truth testing raises ``ShapeLogicTraceError``."""

    __slots__ = ()
    __hash__ = object.__hash__
    is_float = False

    def __bool__(self):
        untraceable(f"tests the symbolic value {self} in a Python condition")

    def __index__(self):
        untraceable(f"uses the symbolic value {self} as a Python int")

    __int__ = __index__

    def __float__(self):
        untraceable(f"uses the symbolic value {self} as a Python float")

    def __add__(self, other):
        return binary("+", self, other)

    def __radd__(self, other):
        return binary("+", other, self)

    def __sub__(self, other):
        return binary("-", self, other)

    def __rsub__(self, other):
        return binary("-", other, self)

    def __mul__(self, other):
        return binary("*", self, other)

    def __rmul__(self, other):
        return binary("*", other, self)

    def __floordiv__(self, other):
        return binary("//", self, other)

    def __rfloordiv__(self, other):
        return binary("//", other, self)

    def __mod__(self, other):
        return binary("%", self, other)

    def __rmod__(self, other):
        return binary("%", other, self)

    def __truediv__(self, other):
        return binary("/", self, other)

    def __rtruediv__(self, other):
        return binary("/", other, self)

    def __neg__(self):
        return binary("-", 0, self)

    def __eq__(self, other):
        return binary("==", self, other)

    def __ne__(self, other):
        return binary("!=", self, other)

    def __lt__(self, other):
        return binary("<", self, other)

    def __le__(self, other):
        return binary("<=", self, other)

    def __gt__(self, other):
        return binary(">", self, other)

    def __ge__(self, other):
        return binary(">=", self, other)

    def __and__(self, other):
        return dim_and(self, other)

    __rand__ = __and__

    def __or__(self, other):
        return dim_or(self, other)

    __ror__ = __or__

    def __invert__(self):
        return dim_not(self)

    def __repr__(self):
        return c_expr(self)

    __str__ = __repr__


@dataclass(frozen=True, eq=False, repr=False)
class Leaf(Sym):
    """A named C value: an input's dim (``s0[1]``), a loaded datum, a local of the generated function."""

    text: str
    is_float: bool = False


@dataclass(frozen=True, eq=False, repr=False)
class Bin(Sym):
    op: str
    a: object
    b: object

    @property
    def is_float(self) -> bool:
        return self.op in _ARITH and (_is_float(self.a) or _is_float(self.b))


@dataclass(frozen=True, eq=False, repr=False)
class Not(Sym):
    a: object


@dataclass(frozen=True, eq=False, repr=False)
class Select(Sym):
    cond: object
    a: object
    b: object

    @property
    def is_float(self) -> bool:
        return _is_float(self.a) or _is_float(self.b)


@dataclass(frozen=True, eq=False, repr=False)
class CCall(Sym):
    """A call of a named C primitive of ``tv_shape.h`` (a counting pass over data, a float rounding)."""

    fn: str
    args: tuple
    is_float: bool = False


def _is_float(value) -> bool:
    return isinstance(value, float) or (isinstance(value, Sym) and value.is_float)


_ARITH = {"+", "-", "*", "//", "%", "/", "min", "max"}
_PY = {
    "+": operator.add, "-": operator.sub, "*": operator.mul, "//": operator.floordiv, "%": operator.mod,
    "/": operator.truediv, "min": min, "max": max, "==": operator.eq, "!=": operator.ne, "<": operator.lt,
    "<=": operator.le, ">": operator.gt, ">=": operator.ge,
}


def _is_const(value, k) -> bool:
    return not isinstance(value, Sym) and not isinstance(value, bool) and value == k


def binary(op: str, a, b):
    """``a op b``: a Python value when both operands are, else a folded ``Sym``."""
    if not isinstance(a, Sym) and not isinstance(b, Sym):
        return _PY[op](a, b)
    if op == "+":
        if _is_const(a, 0):
            return b
        if _is_const(b, 0):
            return a
    elif op == "-":
        if _is_const(b, 0):
            return a
        if a is b:
            return 0
    elif op == "*":
        if _is_const(a, 1):
            return b
        if _is_const(b, 1):
            return a
    elif op == "//":
        if _is_const(b, 1):
            return a
    elif op in ("min", "max", "==", "<=", ">=") and a is b:
        return a if op in ("min", "max") else True
    elif op in ("!=", "<", ">") and a is b:
        return False
    return Bin(op, a, b)


def dim_min(a, b):
    return binary("min", a, b)


def dim_max(a, b):
    return binary("max", a, b)


def dim_and(a, b):
    if not isinstance(a, Sym) and not isinstance(b, Sym):
        return bool(a) and bool(b)
    if isinstance(a, bool) or not isinstance(a, Sym):
        return b if a else False
    if not isinstance(b, Sym):
        return a if b else False
    return Bin("&&", a, b)


def dim_or(a, b):
    if not isinstance(a, Sym) and not isinstance(b, Sym):
        return bool(a) or bool(b)
    if not isinstance(a, Sym):
        return True if a else b
    if not isinstance(b, Sym):
        return True if b else a
    return Bin("||", a, b)


def dim_not(a):
    if not isinstance(a, Sym):
        return not a
    return Not(a)


def dim_select(cond, a, b):
    """``a if cond else b``; a symbolic condition gives a C conditional expression."""
    if not isinstance(cond, Sym):
        return a if cond else b
    if a is b:
        return a
    return Select(cond, a, b)


def supported(cond, message: str) -> None:
    """A condition outside of which a traced logic does not apply (e.g. dyn.reshape's -2/-3/-4 read from
    data): the C shape function then returns its "defer" code and the host runs the Python shape function
    for that call (a native caller reports it as unsupported). Plain values must hold."""
    if not isinstance(cond, Sym):
        if not cond:
            untraceable(f"needs the host for this case: {message}")
        return
    trace = current_trace()
    if trace is None:  # pragma: no cover - Syms only exist while tracing
        raise ShapeLogicTraceError(f"a symbolic check outside of a trace: {message}")
    trace.requires.append((cond, message, "defer"))


def require(cond, message: str, err) -> None:
    """Check ``cond``: a plain value raises ``err(message)`` when false; a symbolic one is recorded in
    the active trace (the C shape function returns an error code for it)."""
    if not isinstance(cond, Sym):
        if not cond:
            raise err(message)
        return
    trace = current_trace()
    if trace is None:  # pragma: no cover - Syms only exist while tracing
        raise ShapeLogicTraceError(f"a symbolic check outside of a trace: {message}")
    trace.requires.append((cond, message, "error"))


def const_int(value) -> bool:
    """Whether ``value`` is a plain int (a known dim), as opposed to a typed or symbolic one."""
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


_C_TYPES = {"bool": "bool", "int8": "int8_t", "int16": "int16_t", "int32": "int32_t", "int64": "int64_t",
            "uint8": "uint8_t", "uint16": "uint16_t", "uint32": "uint32_t", "uint64": "uint64_t",
            "float16": "_Float16", "float32": "float", "float64": "double"}


# ---- data-dependent logics ------------------------------------------------------------------------


class DataArg:
    """A data input of a data-dependent logic, over any of the three domains.

    ``shape``: its dims; ``dtype``; ``values``: a NumPy array when the data is known (run time, or a
    ``Constant`` in type inference), else None; ``pointer``: the C expression of its data pointer
    while tracing into C (else None). ``item(i)`` is element ``i`` (flat index) as a Python number, a
    ``Sym`` load, or None when unknown (type inference of a non-constant)."""

    def __init__(self, shape, dtype: str, values=None, pointer: str | None = None):
        self.shape = tuple(shape)
        self.dtype = dtype
        self.values = values
        self.pointer = pointer

    @classmethod
    def of_array(cls, array) -> DataArg:
        array = np.asarray(array)
        return cls(array.shape, array.dtype.name, array)

    @property
    def known(self) -> bool:
        return self.values is not None or self.pointer is not None

    @property
    def is_float(self) -> bool:
        return self.dtype.startswith("float")

    def item(self, index=0):
        if self.values is not None:
            if isinstance(index, Sym):
                untraceable("reads constant data at a symbolic index")
            value = self.values.reshape(-1)[index]
            return float(value) if self.is_float else (bool(value) if self.dtype == "bool" else int(value))
        if self.pointer is None:
            return None
        if self.dtype == "uint64":  # (values beyond int64 would wrap in the int64 the C code computes in)
            untraceable("reads uint64 data")
        index_text = c_expr(index)
        return Leaf(f"(({'double' if self.is_float else 'int64_t'})((const {_C_TYPES[self.dtype]}*){self.pointer})"
                    f"[{index_text}])", self.is_float)

    def int_values(self) -> tuple:
        """The elements of 1-D integer data of a static length (numbers, or ``Sym`` loads)."""
        if self.values is not None:
            return tuple(int(v) for v in self.values.reshape(-1))
        if len(self.shape) != 1 or not isinstance(self.shape[0], int) or self.pointer is None:
            untraceable(f"reads the values of data of shape {self.shape} (a static length is needed)")
        return tuple(self.item(i) for i in range(self.shape[0]))

    def size(self):
        out = 1
        for d in self.shape:
            out = binary("*", out, d)
        return out


def _data_call(fn: str, data: DataArg, numpy_fn):
    if data.values is not None:
        return int(numpy_fn(data.values))
    if data.pointer is None:
        return None
    return CCall(fn, (Leaf(data.pointer), data.size(), DTYPE_CODES.index(data.dtype)))


def count_nonzero(data: DataArg):
    """The number of nonzero elements of ``data`` (one pass in C: ``tv_shape_count_nonzero``); None
    when the data is unknown (type inference of a non-constant)."""
    return _data_call("tv_shape_count_nonzero", data, np.count_nonzero)


def count_sorted_runs(data: DataArg, order: DataArg):
    """The number of runs of equal values (NaNs equal) of 1-D ``data`` read in ``order``, in one pass
    (``tv_shape_count_sorted_runs``); a negative count when ``order`` holds a position outside the data
    or does not sort it ascending (NaN last). Only traced: the Python logic counts with NumPy."""
    if data.pointer is None or order.pointer is None:
        untraceable("counts sorted runs of data it cannot read")
    return CCall("tv_shape_count_sorted_runs", (Leaf(data.pointer), DTYPE_CODES.index(data.dtype), Leaf(order.pointer),
                                                DTYPE_CODES.index(order.dtype), data.shape[0]))


def count_row_starts(indices: DataArg, rows):
    """The number of distinct rows in the first column of 2-D integer ``indices`` (N, ndim), in one pass
    (``tv_shape_count_row_starts``); -1 when ndim < 1 or the column is not ascending within [0, rows)
    (``rows`` a number or a ``Sym``); None when the data is unknown (type inference of a non-constant)."""
    if indices.values is not None:
        values = np.asarray(indices.values)
        if values.ndim != 2 or values.shape[1] < 1:
            return -1
        first = values[:, 0].astype(np.int64)
        count = int(np.count_nonzero(np.diff(first))) + 1 if len(first) else 0
        if len(first) and (np.any(np.diff(first) < 0) or first[0] < 0):
            return -1
        return dim_select(binary("<", first[-1], rows), count, -1) if len(first) else count
    if indices.pointer is None:
        return None
    n, ndim = indices.shape
    return CCall("tv_shape_count_row_starts", (Leaf(indices.pointer), n, ndim, DTYPE_CODES.index(indices.dtype),
                                                rows))


def slice_length(begin, end, stride, dim):
    """``len(range(*slice(begin, end, stride).indices(dim)))`` (Python's clamping, exactly) for ``begin`` and
    ``end`` ints, None or symbolic, a nonzero ``stride`` and a ``dim`` that may be symbolic. A symbolic
    stride selects between both signs' clamping; no sum can overflow int64 (ONNX's INT64_MAX ends)."""
    if not any(isinstance(v, Sym) for v in (begin, end, stride, dim)):
        return len(range(*slice(begin, end, stride).indices(dim)))

    def length(forward: bool):
        lo, hi = (0, dim) if forward else (-1, dim - 1)

        def clamp(value, default):
            if value is None:
                return default
            return dim_select(value < 0, dim_max(value + dim, lo), dim_min(value, hi))

        if forward:  # ceil((e - b) / stride) = (e - b - 1) // stride + 1 when e > b
            b, e = clamp(begin, 0), clamp(end, hi)
            return dim_select(e > b, (e - b - 1) // stride + 1, 0)
        # from begin (default: the last) down to end (default: before the first)
        b, e = clamp(begin, hi), clamp(end, lo)
        return dim_select(b > e, (e - b + 1) // stride + 1, 0)

    if not isinstance(stride, Sym):
        return length(stride > 0)
    return dim_select(stride > 0, length(True), length(False))


def round_half_even(value):
    """``round(value)`` (to the nearest int, ties to even) of a float, or of a symbolic double."""
    if isinstance(value, Sym):
        return CCall("tv_shape_round", (value,))
    return int(round(value))


def as_double(value):
    """``float(value)`` of an int dim or datum, or of a symbolic one (so ``/`` divides as floats in C too)."""
    if isinstance(value, Sym):
        return value if value.is_float else CCall("tv_shape_double", (value,), is_float=True)
    return float(value)


def floor_int(value):
    """``math.floor(value)`` of a float, or of a symbolic double (the caller bounds it to int64 first)."""
    if isinstance(value, Sym):
        return CCall("tv_shape_floor", (value,))
    return math.floor(value)


def is_finite(value):
    """``math.isfinite`` over a number or a symbolic double."""
    if isinstance(value, Sym):
        return CCall("tv_shape_isfinite", (value,))
    return math.isfinite(value)


def ceil_length(start, stop, step):
    """``max(0, ceil((stop - start) / step))`` over doubles (arange's length for float arguments)."""
    if any(isinstance(v, Sym) for v in (start, stop, step)):
        return CCall("tv_shape_arange_length_f", (start, stop, step))
    return max(0, math.ceil((float(stop) - float(start)) / float(step)))


# ---- C text ---------------------------------------------------------------------------------------

_C_BINARY = {"+", "-", "*", "/", "==", "!=", "<", "<=", ">", ">=", "&&", "||"}
_C_FUNCTIONS = {"//": "tv_shape_floordiv", "%": "tv_shape_floormod", "min": "tv_shape_min", "max": "tv_shape_max"}
# Integer +, -, * in C: through tv_shape.h's checked forms, which set the shape function's local
# OVERFLOW_FLAG instead of wrapping (the function fails once its dims are computed: vm/shape_c.py).
_C_CHECKED = {"+": "tv_shape_add", "-": "tv_shape_sub", "*": "tv_shape_mul"}
OVERFLOW_FLAG = "tv_overflow"


def _c_const(value) -> str:
    if isinstance(value, (bool, np.bool_)):
        return "1" if value else "0"
    if isinstance(value, (int, np.integer)):
        value = int(value)
        if value == -(2 ** 63):
            return "INT64_MIN"
        return f"INT64_C({value})"
    if isinstance(value, (float, np.floating)):
        value = float(value)
        if math.isnan(value):
            return "(0.0 / 0.0)"
        if math.isinf(value):
            return "HUGE_VAL" if value > 0 else "(-HUGE_VAL)"
        return repr(value)
    raise ShapeLogicTraceError(f"cannot write {value!r} ({type(value).__name__}) as a C value")


def c_expr(value) -> str:
    """The C text of a dim, condition or value."""
    if not isinstance(value, Sym):
        return _c_const(value)
    if isinstance(value, Leaf):
        return value.text
    if isinstance(value, Not):
        return f"(!{c_expr(value.a)})"
    if isinstance(value, Select):
        return f"({c_expr(value.cond)} ? {c_expr(value.a)} : {c_expr(value.b)})"
    if isinstance(value, CCall):
        return f"{value.fn}({', '.join(c_expr(a) for a in value.args)})"
    if isinstance(value, Bin):
        a, b = c_expr(value.a), c_expr(value.b)
        if value.op in _C_FUNCTIONS:
            if value.is_float:
                if value.op in ("min", "max"):
                    return f"f{value.op}((double){a}, (double){b})"
                untraceable(f"uses {value.op} on float values")
            return f"{_C_FUNCTIONS[value.op]}({a}, {b})"
        if value.op == "/" and not value.is_float:
            untraceable("divides ints with / (use //)")
        if value.op == "/":
            return f"((double){a} / (double){b})"
        if value.op in _C_CHECKED and not value.is_float:  # (int64 arithmetic that notes an overflow)
            return f"{_C_CHECKED[value.op]}({a}, {b}, &{OVERFLOW_FLAG})"
        return f"({a} {value.op} {b})"
    raise ShapeLogicTraceError(f"unknown symbolic node {type(value).__name__}")


def traceable(logic):
    """Declare a shape logic traceable into C: it checks dims only through this module's helpers (no
    Python branch on a dim that may be symbolic, no ``isinstance(dim, int)`` test that skips a check).
    The op's ``shape_logic_traceable`` follows, and tests/ops/test_shape_logic.py then compares its C
    shape function with its Python one and its kernel."""
    logic.traceable = True
    return logic
