"""Types of the IR.

A tensor dimension is an ``int`` (static), ``Any()`` (unknown until run time, ``?`` in text) or a
``SymDim`` (a named symbolic dimension such as ``n``: unknown, but equal wherever the same name
appears in one signature). A scalar is a rank-0 tensor. Types compare by value, except ``TypeVar``
and ``IncompleteType`` which are identities (two type parameters both named ``A`` differ).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

__all__ = [
    "Any", "SymDim", "Dim", "Type", "TensorType", "TupleType", "FuncType", "TypeVar", "GlobalTypeVar",
    "TypeCall", "TypeData", "IncompleteType", "RefType", "scalar_type", "is_static_dim", "is_static_shape",
    "normalize_dtype", "component_types", "nested_types", "DTYPES",
]

# Canonical dtype names; aliases accepted by ``normalize_dtype``.
DTYPES = (
    "bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
    "float16", "float32", "float64",
)
_DTYPE_ALIASES = {"uint1": "bool", "float": "float32", "int": "int32", "double": "float64", "half": "float16"}


def normalize_dtype(dtype) -> str:
    """Map a dtype name, NumPy dtype or alias to tensorvm's canonical name; raise on anything else."""
    if isinstance(dtype, str):
        name = _DTYPE_ALIASES.get(dtype, dtype)
    else:
        name = np.dtype(dtype).name
    if name not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; expected one of {', '.join(DTYPES)}")
    return name


@dataclass(frozen=True, slots=True)
class Any:
    """A dimension unknown until run time (``?`` in text)."""

    def __repr__(self) -> str:
        return "?"


@dataclass(frozen=True, slots=True)
class SymDim:
    """A named symbolic dimension: unknown at compile time, equal wherever the name recurs."""

    name: str

    def __repr__(self) -> str:
        return self.name


Dim = int | Any | SymDim


def is_static_dim(dim: Dim) -> bool:
    return isinstance(dim, int)


def is_static_shape(shape) -> bool:
    return all(isinstance(d, int) for d in shape)


class Type:
    """Base class of all types."""

    __slots__ = ()


@dataclass(frozen=True, slots=True)
class TensorType(Type):
    shape: tuple
    dtype: str = "float32"

    def __post_init__(self):
        shape = tuple(d if isinstance(d, (Any, SymDim)) else _as_dim(d) for d in self.shape)
        object.__setattr__(self, "shape", shape)
        object.__setattr__(self, "dtype", normalize_dtype(self.dtype))

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def is_static(self) -> bool:
        return is_static_shape(self.shape)

    def __repr__(self) -> str:
        from .printer import type_to_str

        return type_to_str(self)


def _as_dim(d) -> int:
    if isinstance(d, (bool, np.bool_)) or not isinstance(d, (int, np.integer)):
        raise TypeError(f"a dimension must be an int, Any() or SymDim, got {d!r}")
    if d < 0:
        raise ValueError(f"a static dimension must be >= 0, got {d}")
    return int(d)


def scalar_type(dtype: str) -> TensorType:
    return TensorType((), dtype)


@dataclass(frozen=True, slots=True)
class TupleType(Type):
    fields: tuple = ()

    def __post_init__(self):
        object.__setattr__(self, "fields", tuple(self.fields))

    def __repr__(self) -> str:
        from .printer import type_to_str

        return type_to_str(self)


@dataclass(frozen=True, slots=True, eq=False)
class TypeVar(Type):
    """A type parameter (``A`` in ``def @id[A](%x: A) -> A``). Compared by identity."""

    name: str
    kind: str = "Type"

    def __repr__(self) -> str:
        return self.name


@dataclass(frozen=True, slots=True)
class GlobalTypeVar(Type):
    """The name of an ADT (``List``); compared by name."""

    name: str

    def __repr__(self) -> str:
        return self.name


@dataclass(frozen=True, slots=True)
class TypeCall(Type):
    """An ADT applied to type arguments: ``List[float32]``."""

    func: GlobalTypeVar
    args: tuple = ()

    def __post_init__(self):
        object.__setattr__(self, "args", tuple(self.args))

    def __repr__(self) -> str:
        from .printer import type_to_str

        return type_to_str(self)


@dataclass(frozen=True, slots=True)
class FuncType(Type):
    arg_types: tuple
    ret_type: Type
    type_params: tuple = ()
    type_constraints: tuple = ()

    def __post_init__(self):
        object.__setattr__(self, "arg_types", tuple(self.arg_types))
        object.__setattr__(self, "type_params", tuple(self.type_params))
        object.__setattr__(self, "type_constraints", tuple(self.type_constraints))

    def __repr__(self) -> str:
        from .printer import type_to_str

        return type_to_str(self)


@dataclass(frozen=True, slots=True)
class RefType(Type):
    """A mutable reference cell holding a value of ``value`` type."""

    value: Type


@dataclass(frozen=True, slots=True, eq=False)
class IncompleteType(Type):
    """A type not yet known; type inference replaces it. Compared by identity."""

    hint: str = ""

    def __repr__(self) -> str:
        return "_"


def component_types(ty) -> tuple:
    """The types ``ty`` is made of, one level down: a tuple's fields, an ADT's type arguments, a function's
    argument and result types, a reference's value type; none for the others."""
    if isinstance(ty, TupleType):
        return ty.fields
    if isinstance(ty, TypeCall):
        return ty.args
    if isinstance(ty, FuncType):
        return (*ty.arg_types, ty.ret_type)
    if isinstance(ty, RefType):
        return (ty.value,)
    return ()


def nested_types(ty):
    """``ty`` and every type it is made of, at any depth (``component_types`` walked with a stack of its own)."""
    pending = [ty]
    while pending:
        part = pending.pop()
        yield part
        pending.extend(reversed(component_types(part)))


@dataclass(frozen=True, slots=True, eq=False)
class TypeData:
    """An ADT definition: ``type List[A] { Cons(A, List[A]), Nil }``.

    ``constructors`` are ``tensorvm.ir.Constructor`` nodes whose ``tag`` is their index here.
    """

    header: GlobalTypeVar
    type_vars: tuple = ()
    constructors: tuple = field(default=())

    def __post_init__(self):
        object.__setattr__(self, "type_vars", tuple(self.type_vars))
        object.__setattr__(self, "constructors", tuple(self.constructors))
