"""Expressions of the IR: frozen dataclasses compared by identity.

Two nodes are ``==`` only if they are the same object (so they can key dictionaries cheaply and a
shared sub-expression is a DAG edge, printed once as ``%N = ...``). Structural (alpha-)equality is
``tensorvm.ir.structural_equal``. ``checked_type`` is filled by type inference; it and ``span`` are
not part of a node's structure.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .attrs import Attrs
from .types import GlobalTypeVar, TensorType, Type, normalize_dtype

__all__ = [
    "Span", "Expr", "Var", "GlobalVar", "Op", "Constant", "Call", "Tuple", "TupleGetItem", "Let", "If",
    "Function", "Constructor", "Match", "Clause", "Pattern", "PatternWildcard", "PatternVar",
    "PatternConstructor", "PatternTuple", "RefCreate", "RefRead", "RefWrite", "const", "op_name", "is_op_call",
]


@dataclass(frozen=True, slots=True)
class Span:
    line: int
    column: int
    source_name: str = "<string>"

    def __str__(self) -> str:
        return f"{self.source_name}:{self.line}:{self.column}"


_NODE = dict(frozen=True, eq=False, slots=True, repr=False)


class Expr:
    """Base class of expressions. ``checked_type`` is set by ``InferType``."""

    __slots__ = ()

    @property
    def checked_type(self) -> Type:
        ty = getattr(self, "_checked_type", None)
        if ty is None:
            raise ValueError(f"{type(self).__name__} has no checked_type; run tensorvm.transform.InferType first")
        return ty

    def with_type(self, ty: Type):
        """Record the inferred type (used by type inference; not part of the structure)."""
        object.__setattr__(self, "_checked_type", ty)
        return self

    def __repr__(self) -> str:
        try:
            from .printer import expr_to_str

            return expr_to_str(self)
        except Exception:  # noqa: BLE001 - a repr must never fail
            return f"<{type(self).__name__} at {id(self):#x}>"

    # Building a call with Python syntax: ``f(x, y)`` for any callable expression.
    def __call__(self, *args, **attrs) -> Call:
        return Call(self, tuple(args), Attrs(attrs))


@dataclass(**_NODE)
class Var(Expr):
    """A local variable (``%x``). Identity matters: two ``Var("x")`` are different variables."""

    name_hint: str
    type_annotation: Type | None = None
    span: Span | None = field(default=None, compare=False)
    _checked_type: Type | None = field(default=None, compare=False, repr=False)


@dataclass(**_NODE)
class GlobalVar(Expr):
    """The name of a global function (``@f``). Two GlobalVars with one name are the same global."""

    name: str
    span: Span | None = field(default=None, compare=False)
    _checked_type: Type | None = field(default=None, compare=False, repr=False)

    def __eq__(self, other):
        return isinstance(other, GlobalVar) and other.name == self.name

    def __hash__(self):
        return hash(("GlobalVar", self.name))


@dataclass(**_NODE)
class Op(Expr):
    """A primitive operator by name (``add``, ``nn.conv2d``); its definition is in ``tensorvm.op``."""

    name: str
    span: Span | None = field(default=None, compare=False)
    _checked_type: Type | None = field(default=None, compare=False, repr=False)

    def __eq__(self, other):
        return isinstance(other, Op) and other.name == self.name

    def __hash__(self):
        return hash(("Op", self.name))


@dataclass(**_NODE)
class Constant(Expr):
    """A tensor literal. ``data`` is a NumPy array (a 0-d array for scalars), never mutated."""

    data: np.ndarray
    span: Span | None = field(default=None, compare=False)
    _checked_type: Type | None = field(default=None, compare=False, repr=False)

    def __post_init__(self):
        data = np.asarray(self.data)
        if data.dtype.name not in ("bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32",
                                   "uint64", "float16", "float32", "float64"):
            raise TypeError(f"constant of unsupported dtype {data.dtype}")
        # np.ascontiguousarray would turn a 0-d array into 1-d; copy keeps the rank.
        data = data if data.flags.c_contiguous and not data.flags.writeable else data.copy(order="C")
        data.setflags(write=False)
        object.__setattr__(self, "data", data)

    @property
    def type(self) -> TensorType:
        return TensorType(self.data.shape, self.data.dtype.name)


def const(value, dtype=None) -> Constant:
    """A constant from a Python number, list or array (Python floats default to float32, ints to int32)."""
    if dtype is not None:
        return Constant(np.asarray(value, dtype=normalize_dtype(dtype)))
    arr = np.asarray(value)
    if arr.dtype == np.float64 and not isinstance(value, np.ndarray):
        arr = arr.astype("float32")
    elif arr.dtype == np.int64 and not isinstance(value, np.ndarray):
        arr = arr.astype("int32")
    return Constant(arr)


@dataclass(**_NODE)
class Call(Expr):
    """A call of an ``Op``, a global, a closure (any expression) or a ``Constructor``."""

    op: Expr
    args: tuple = ()
    attrs: Attrs = field(default_factory=Attrs)
    type_args: tuple = ()
    span: Span | None = field(default=None, compare=False)
    _checked_type: Type | None = field(default=None, compare=False, repr=False)

    def __post_init__(self):
        object.__setattr__(self, "args", tuple(self.args))
        object.__setattr__(self, "type_args", tuple(self.type_args))
        if not isinstance(self.attrs, Attrs):
            object.__setattr__(self, "attrs", Attrs(self.attrs or {}))


def op_name(expr) -> str | None:
    """The op's name when ``expr`` is a call of an ``Op``; None for anything else (a call of a global, a
    closure or a constructor, or not a call)."""
    return expr.op.name if isinstance(expr, Call) and isinstance(expr.op, Op) else None


def is_op_call(expr, *names: str) -> bool:
    """Whether ``expr`` is a call of one of the ops ``names`` (of any op when none is given)."""
    name = op_name(expr)
    return name is not None and (not names or name in names)


@dataclass(**_NODE)
class Tuple(Expr):
    fields: tuple = ()
    span: Span | None = field(default=None, compare=False)
    _checked_type: Type | None = field(default=None, compare=False, repr=False)

    def __post_init__(self):
        object.__setattr__(self, "fields", tuple(self.fields))


@dataclass(**_NODE)
class TupleGetItem(Expr):
    tuple_value: Expr
    index: int
    span: Span | None = field(default=None, compare=False)
    _checked_type: Type | None = field(default=None, compare=False, repr=False)


@dataclass(**_NODE)
class Let(Expr):
    var: Var
    value: Expr
    body: Expr
    span: Span | None = field(default=None, compare=False)
    _checked_type: Type | None = field(default=None, compare=False, repr=False)


@dataclass(**_NODE)
class If(Expr):
    cond: Expr
    true_branch: Expr
    false_branch: Expr
    span: Span | None = field(default=None, compare=False)
    _checked_type: Type | None = field(default=None, compare=False, repr=False)


@dataclass(**_NODE)
class Function(Expr):
    """``fn [type_params] (params) -> ret_type { body }``; attrs such as ``Primitive=1``."""

    params: tuple
    body: Expr
    ret_type: Type | None = None
    type_params: tuple = ()
    attrs: Attrs = field(default_factory=Attrs)
    span: Span | None = field(default=None, compare=False)
    _checked_type: Type | None = field(default=None, compare=False, repr=False)

    def __post_init__(self):
        object.__setattr__(self, "params", tuple(self.params))
        object.__setattr__(self, "type_params", tuple(self.type_params))
        if not isinstance(self.attrs, Attrs):
            object.__setattr__(self, "attrs", Attrs(self.attrs or {}))

    @property
    def is_primitive(self) -> bool:
        return bool(self.attrs.get("Primitive", 0))


@dataclass(**_NODE)
class Constructor(Expr):
    """A constructor of an ADT (``Cons``). ``inputs`` are the field types; ``tag`` its index."""

    name: str
    inputs: tuple
    belong_to: GlobalTypeVar
    tag: int = 0
    span: Span | None = field(default=None, compare=False)
    _checked_type: Type | None = field(default=None, compare=False, repr=False)

    def __post_init__(self):
        object.__setattr__(self, "inputs", tuple(self.inputs))

    def __eq__(self, other):
        return (isinstance(other, Constructor) and other.name == self.name
                and other.belong_to == self.belong_to and other.tag == self.tag)

    def __hash__(self):
        return hash(("Constructor", self.name, self.belong_to.name, self.tag))

    def __call__(self, *args, **attrs):
        """With expression arguments (or none), build a ``Call``; with run-time values, an ``ADT`` value.

        ``Nil()`` is therefore an IR call; executors accept it as the value ``Nil`` too, and
        ``ctor.value()`` builds the value explicitly.
        """
        if all(isinstance(a, Expr) for a in args):
            return Call(self, tuple(args), Attrs(attrs))
        return self.value(*args)

    def value(self, *fields):
        """The run-time ADT value ``Ctor(fields...)``, usable as an argument to any executor."""
        from ..runtime.object import ADT  # lazy: ADT values belong to the runtime

        if len(fields) != len(self.inputs):
            raise TypeError(f"constructor {self.name} takes {len(self.inputs)} fields, got {len(fields)}")
        return ADT(self.tag, tuple(fields), constructor=self.name)


class Pattern:
    __slots__ = ()


@dataclass(**_NODE)
class PatternWildcard(Pattern):
    span: Span | None = field(default=None, compare=False)


@dataclass(**_NODE)
class PatternVar(Pattern):
    var: Var
    span: Span | None = field(default=None, compare=False)


@dataclass(**_NODE)
class PatternConstructor(Pattern):
    constructor: Constructor
    patterns: tuple = ()
    span: Span | None = field(default=None, compare=False)

    def __post_init__(self):
        object.__setattr__(self, "patterns", tuple(self.patterns))


@dataclass(**_NODE)
class PatternTuple(Pattern):
    patterns: tuple = ()
    span: Span | None = field(default=None, compare=False)

    def __post_init__(self):
        object.__setattr__(self, "patterns", tuple(self.patterns))


@dataclass(**_NODE)
class Clause:
    lhs: Pattern
    rhs: Expr


@dataclass(**_NODE)
class Match(Expr):
    """``match (data) { clauses }``; ``complete=False`` is ``match?`` (no exhaustiveness promise)."""

    data: Expr
    clauses: tuple
    complete: bool = True
    span: Span | None = field(default=None, compare=False)
    _checked_type: Type | None = field(default=None, compare=False, repr=False)

    def __post_init__(self):
        object.__setattr__(self, "clauses", tuple(self.clauses))


@dataclass(**_NODE)
class RefCreate(Expr):
    value: Expr
    span: Span | None = field(default=None, compare=False)
    _checked_type: Type | None = field(default=None, compare=False, repr=False)


@dataclass(**_NODE)
class RefRead(Expr):
    ref: Expr
    span: Span | None = field(default=None, compare=False)
    _checked_type: Type | None = field(default=None, compare=False, repr=False)


@dataclass(**_NODE)
class RefWrite(Expr):
    ref: Expr
    value: Expr
    span: Span | None = field(default=None, compare=False)
    _checked_type: Type | None = field(default=None, compare=False, repr=False)
