"""Checking user values against parameter types and converting them to run-time values.

Shared by the interpreter and the VM (which must not import the interpreter to run a deployed
executable, docs/deploy.md): ``convert_argument`` checks kinds, dtypes, ranks, static and symbolic dims,
tuples, functions, references and ADT values (their constructors and, recursively, their fields against
the ADT's definition in the module); ``type_str``/``describe_value`` word the errors.
"""

from __future__ import annotations

import sys
from functools import partial
from typing import TYPE_CHECKING

import numpy as np

from ..errors import ExecutionError, ShapeError
from ..ir.types import (
    DTYPES,
    Any,
    FuncType,
    GlobalTypeVar,
    IncompleteType,
    RefType,
    SymDim,
    TensorType,
    TupleType,
    TypeCall,
    TypeVar,
)
from .object import ADT, Closure, RefValue

if TYPE_CHECKING:
    from ..ir.module import IRModule  # (any object with ``type_definitions`` will do)

__all__ = ["convert_argument", "rebuild", "Node", "result_checker", "substitute_type", "type_str", "describe_value"]


def _interpreter_types() -> tuple:
    """``(FunctionValue, Constructor)``: the interpreter's function values and IR constructors, which are
    values too; ``None`` for one whose module is not imported (then no such value exists, so it is not
    imported for the check)."""
    interpreter, expr = sys.modules.get("tensorvm.interpreter"), sys.modules.get("tensorvm.ir.expr")
    return getattr(interpreter, "FunctionValue", None), getattr(expr, "Constructor", None)


def _callable_types() -> tuple:
    return tuple(t for t in _interpreter_types() if t is not None)


def convert_argument(value, ty, where: str, mod: IRModule | None = None, symbols: dict | None = None):
    """Convert one user value to a run-time value, checking it against type ``ty`` (``None``: unchecked).

    Raises ``ExecutionError`` for a wrong kind or dtype and ``ShapeError`` for a wrong rank or dim;
    the message names ``where``, what was expected and what came. Tuples and ADT values are walked by
    ``rebuild``, fields first to last (the order of a recursive walk, so the same symbolic dim binds where
    it is met first).
    """
    symbols = {} if symbols is None else symbols

    def step(item):
        value, ty, where = item
        converted = _convert_one(value, ty, where, mod)
        return _convert_tensor(value, ty, where, symbols) if converted is _TENSOR else converted

    return rebuild((value, ty, where), step)


def result_checker(ty, where: str):
    """A function raising ``ShapeError`` when a result does not have the static rank and dims of ``ty`` (a
    tensor type, or a tuple of them, as far as its fields are tensors), or None when ``ty`` fixes none.
    Gradual typing lets a ``?`` dim meet a declared static one (``-> Tensor[(3), float32]`` on a body of
    type ``Tensor[(?), float32]``): type inference then says 3, and only the value at run time can tell."""
    if isinstance(ty, TensorType):
        static = tuple((axis, d) for axis, d in enumerate(ty.shape) if isinstance(d, int))
        if not static:  # (a rank cannot differ: it has no unknown)
            return None
        rank = len(ty.shape)

        def check(value):
            shape = getattr(value, "shape", None)
            if shape is None or len(shape) != rank or any(shape[axis] != d for axis, d in static):
                raise ShapeError(f"{where} is {describe_value(value)}, but its type is {type_str(ty)} (a dim unknown "
                                 f"until run time met a declared static one, and differs from it)")
        return check
    if isinstance(ty, TupleType):
        fields = [result_checker(t, f"{where}.{i}") for i, t in enumerate(ty.fields)]
        if not any(fields):
            return None

        def check_fields(value):
            items = value.fields if isinstance(value, ADT) else value
            if isinstance(items, (tuple, list)) and len(items) == len(fields):
                for check, item in zip(fields, items, strict=True):
                    if check is not None:
                        check(item)
        return check_fields
    return None


class Node:
    """A container ``rebuild`` met: the items of its fields (each given to the step in turn) and how to build
    it from their results (``build(fields)``, a list)."""

    __slots__ = ("items", "build")

    def __init__(self, items, build):
        self.items, self.build = items, build


_BUILD = object()  # (a finishing step of ``rebuild``)


def rebuild(root, step):
    """``step(root)``, where a ``Node`` answer is built from ``step`` of each of its items, and so on down:
    bottom-up with a stack of its own, the items of a node first to last. A list of a million elements is
    as deep as a value gets in a program that runs in constant stack (tuples and ADT values nest without
    bound), so Python's recursion limit must not decide whether it converts."""
    answer = step(root)
    if not isinstance(answer, Node):  # (a leaf: what most calls convert, a tensor)
        return answer
    result: list = [None]
    work: list = []  # (item, the list its result goes in, at), or (_BUILD, node, fields, into, at)

    def expand(node: Node, into: list, at: int) -> None:
        fields = [None] * len(node.items)
        work.append((_BUILD, node, fields, into, at))
        work.extend((node.items[i], fields, i) for i in range(len(node.items) - 1, -1, -1))

    expand(answer, result, 0)
    while work:
        entry = work.pop()
        if entry[0] is _BUILD:
            _, node, fields, into, at = entry
            into[at] = node.build(fields)
            continue
        item, into, at = entry
        answer = step(item)
        if isinstance(answer, Node):
            expand(answer, into, at)
        else:
            into[at] = answer
    return result[0]


_TENSOR = object()  # (_convert_one's answer for a tensor: converted with the walk's symbols)


def _convert_one(value, ty, where, mod):
    """One step of ``convert_argument``: a leaf value converted, ``_TENSOR``, or a container's ``Node``."""
    expr = sys.modules.get("tensorvm.ir.expr")  # (without it loaded, no value is an IR call)
    if expr is not None and isinstance(value, expr.Call) and isinstance(value.op, expr.Constructor) and not value.args:
        value = value.op.value()  # ``Nil()`` built in Python is the value Nil
    if ty is None or isinstance(ty, (TypeVar, IncompleteType)):
        return _convert_untyped(value, where)
    if isinstance(ty, TensorType):
        return _TENSOR
    if isinstance(ty, TupleType):
        if isinstance(value, ADT) or not isinstance(value, (tuple, list)):
            raise ExecutionError(f"{where} expects a tuple {type_str(ty)}, got {describe_value(value)}")
        if len(value) != len(ty.fields):
            raise ExecutionError(f"{where} expects a tuple of {len(ty.fields)} field(s), got {len(value)}")
        return Node([(v, t, _Path(where, f".{i}")) for i, (v, t) in enumerate(zip(value, ty.fields, strict=True))],
                    tuple)
    if isinstance(ty, (TypeCall, GlobalTypeVar)):
        return _convert_adt(value, ty, where, mod)
    if isinstance(ty, FuncType):
        if not isinstance(value, (_interpreter_types()[0] or Closure, Closure)):
            raise ExecutionError(f"{where} expects a function {type_str(ty)}, got {describe_value(value)}")
        return value
    if isinstance(ty, RefType):
        if not isinstance(value, RefValue):
            raise ExecutionError(f"{where} expects a reference, got {describe_value(value)}")
        # the cell itself (the program shares it with the caller), its content converted in place
        return Node([(value.value, ty.value, _Path(where, ".value"))], partial(_refill, value))
    return _convert_untyped(value, where)


def _refill(cell: RefValue, fields: list) -> RefValue:
    cell.value = fields[0]
    return cell


class _Path:
    """Where a value sits inside an argument (``parameter %xs.Cons[1].Cons[0]``), rendered only
    for an error message; runs of one step (a long list's tail) are shown once with a count."""

    __slots__ = ("parent", "segment")

    def __init__(self, parent, segment: str):
        self.parent, self.segment = parent, segment

    def __str__(self) -> str:
        segments, node = [], self
        while isinstance(node, _Path):
            segments.append(node.segment)
            node = node.parent
        segments.reverse()
        parts, i = [str(node)], 0
        while i < len(segments):
            j = i
            while j < len(segments) and segments[j] == segments[i]:
                j += 1
            parts.append(segments[i] if j - i == 1 else f"{segments[i]}*{j - i}")
            i = j
        return "".join(parts)


_NUMPY_DTYPES = {name: np.dtype(name) for name in DTYPES}


def _to_array(value, where: str):
    """A NumPy array from an NDArray, array, NumPy scalar, Python number/bool or nested list.

    A Python tuple is not a tensor (it is the value of a tuple-typed parameter)."""
    if isinstance(value, np.ndarray):
        return value, True
    if isinstance(value, np.generic):
        return np.asarray(value), True
    numpy_method = getattr(value, "numpy", None)
    if callable(numpy_method) and not isinstance(value, (ADT, tuple, list)):
        return np.asarray(numpy_method()), True
    if isinstance(value, (bool, int, float, list)):
        try:
            arr = np.asarray(value)
        except (ValueError, TypeError, OverflowError) as err:
            raise ExecutionError(f"{where}: cannot make a tensor from {value!r:.80}: {err}") from None
        if arr.dtype == object:
            raise ExecutionError(f"{where}: cannot make a tensor from {value!r:.80} (ragged, mixed or huge values)")
        return arr, False
    raise ExecutionError(f"{where} expects a tensor, got {describe_value(value)}")


def _convert_tensor(value, ty: TensorType, where: str, symbols: dict) -> np.ndarray:
    arr, from_numpy = _to_array(value, where)
    if arr.dtype != _NUMPY_DTYPES[ty.dtype]:
        if from_numpy:
            raise ExecutionError(f"{where} expects {type_str(ty)}, got {describe_value(arr)} (dtype {arr.dtype.name})")
        arr = _cast_python_value(arr, value, ty, where)
    if arr.ndim != len(ty.shape):
        raise ShapeError(f"{where} expects {type_str(ty)} of rank {len(ty.shape)}, got {describe_value(arr)} "
                         f"of rank {arr.ndim}")
    for axis, (dim, actual) in enumerate(zip(ty.shape, arr.shape, strict=True)):
        if isinstance(dim, int) and dim != actual:
            raise ShapeError(f"{where} expects {type_str(ty)}, got {describe_value(arr)} "
                             f"(dimension {axis}: expected {dim}, got {actual})")
        if isinstance(dim, SymDim):
            bound = symbols.get(dim.name)
            if bound is None:
                symbols[dim.name] = (actual, where)
            elif bound[0] != actual:
                raise ShapeError(f"{where} expects {type_str(ty)}, got {describe_value(arr)}: dimension {axis} "
                                 f"is {dim.name} = {actual}, but {bound[1]} has {dim.name} = {bound[0]}")
    return arr


_KIND_ORDER = {"b": 0, "u": 1, "i": 1, "f": 2}


def _cast_python_value(arr: np.ndarray, value, ty: TensorType, where: str) -> np.ndarray:
    """Python numbers/lists take the parameter's dtype when that keeps their values (floats may round)."""
    source, target = arr.dtype.kind, np.dtype(ty.dtype).kind
    compatible = source == target or (source in "iu" and target in "iuf") or arr.size == 0
    if not compatible:
        raise ExecutionError(f"{where} expects {type_str(ty)}, got {value!r:.80} ({_kind_name(source)} values)")
    cast = arr.astype(ty.dtype)
    if source in "iu" and not np.array_equal(cast.astype(arr.dtype), arr):
        raise ExecutionError(f"{where} expects {type_str(ty)}, got {value!r:.80}: values do not fit {ty.dtype}")
    return cast


def _kind_name(kind: str) -> str:
    return {"b": "boolean", "i": "integer", "u": "integer", "f": "floating-point"}.get(kind, kind)


def _convert_untyped(value, where: str):
    """A value for an unannotated parameter: Python numbers default to float32/int32 (a tuple's or ADT
    value's fields: a ``Node`` of items of no type, which ``convert_argument`` walks)."""
    if isinstance(value, (*_callable_types(), Closure, RefValue)):
        return value
    if isinstance(value, ADT):
        tag, constructor = value.tag, value.constructor
        return Node([(f, None, where) for f in value.fields], lambda fields: ADT(tag, tuple(fields), constructor))
    if isinstance(value, tuple):
        return Node([(f, None, _Path(where, f".{i}")) for i, f in enumerate(value)], tuple)
    arr, from_numpy = _to_array(value, where)
    if not from_numpy:
        if arr.dtype == np.float64:
            arr = arr.astype("float32")
        elif arr.dtype == np.int64:
            arr = arr.astype("int32")
    return arr


def _convert_adt(value, ty, where: str, mod: IRModule | None):
    header = ty.func if isinstance(ty, TypeCall) else ty
    type_args = ty.args if isinstance(ty, TypeCall) else ()
    if not isinstance(value, ADT):
        raise ExecutionError(f"{where} expects a value of type {type_str(ty)}, got {describe_value(value)}")
    tdef = mod.type_definitions.get(header) if mod is not None else None
    if tdef is None:  # the type is unknown here: convert the fields without checking them
        return _convert_untyped(value, where)
    if value.constructor is not None:
        ctor = next((c for c in tdef.constructors if c.name == value.constructor), None)
        if ctor is None:
            raise ExecutionError(f"{where} expects a value of type {header.name}, got a {value.constructor} value "
                                 f"(constructors of {header.name}: {', '.join(c.name for c in tdef.constructors)})")
        if ctor.tag != value.tag:
            raise ExecutionError(f"{where}: {value.constructor} value has tag {value.tag}, expected {ctor.tag}")
    else:
        ctor = next((c for c in tdef.constructors if c.tag == value.tag), None)
        if ctor is None:
            raise ExecutionError(f"{where}: tag {value.tag} is not a constructor of {header.name}")
    if len(value.fields) != len(ctor.inputs):
        raise ExecutionError(f"{where}: constructor {ctor.name} takes {len(ctor.inputs)} field(s), "
                             f"got {len(value.fields)}")
    mapping = dict(zip(tdef.type_vars, type_args, strict=False))
    tag, name = ctor.tag, ctor.name
    return Node([(f, substitute_type(t, mapping), _Path(where, f".{name}[{i}]"))
                 for i, (f, t) in enumerate(zip(value.fields, ctor.inputs, strict=True))],
                lambda fields: ADT(tag, tuple(fields), constructor=name))


def substitute_type(ty, mapping: dict):
    """``ty`` with the type variables in ``mapping`` replaced."""
    if not mapping:
        return ty
    if isinstance(ty, TypeVar):
        return mapping.get(ty, ty)
    if isinstance(ty, TupleType):
        return TupleType(tuple(substitute_type(f, mapping) for f in ty.fields))
    if isinstance(ty, TypeCall):
        return TypeCall(ty.func, tuple(substitute_type(a, mapping) for a in ty.args))
    if isinstance(ty, FuncType):
        return FuncType(tuple(substitute_type(a, mapping) for a in ty.arg_types),
                        substitute_type(ty.ret_type, mapping), ty.type_params, ty.type_constraints)
    if isinstance(ty, RefType):
        return RefType(substitute_type(ty.value, mapping))
    return ty


# --- descriptions for error messages ---------------------------------------------------------------
def type_str(ty) -> str:
    if isinstance(ty, TensorType):
        # Relay's spelling: rank 1 is ``(3)``, a scalar is its dtype.
        if not ty.shape:
            return ty.dtype
        dims = ", ".join("?" if isinstance(d, Any) else str(d) for d in ty.shape)
        return f"Tensor[({dims}), {ty.dtype}]"
    if isinstance(ty, TupleType):
        return "(" + ", ".join(type_str(f) for f in ty.fields) + ("," if len(ty.fields) == 1 else "") + ")"
    if isinstance(ty, TypeCall):
        return f"{ty.func.name}[" + ", ".join(type_str(a) for a in ty.args) + "]"
    if isinstance(ty, (GlobalTypeVar, TypeVar)):
        return ty.name
    try:
        return repr(ty)
    except Exception:  # the printer may be unavailable
        return type(ty).__name__


def describe_value(value) -> str:
    """A short description of a run-time value for error messages."""
    if isinstance(value, np.ndarray):
        dims = ", ".join(str(d) for d in value.shape)
        return f"Tensor[({dims}), {value.dtype.name}]"
    if isinstance(value, tuple):
        return "a tuple (" + ", ".join(describe_value(v) for v in value[:4]) + (", ..." if len(value) > 4 else "") + ")"
    if isinstance(value, ADT):
        return f"an ADT value {value.constructor or 'tag ' + str(value.tag)}"
    function_value, constructor = _interpreter_types()
    if function_value is not None and isinstance(value, function_value):
        return "a function" + (f" @{value.name}" if value.name else " (closure)")
    if constructor is not None and isinstance(value, constructor):
        return f"the constructor {value.name}"
    if isinstance(value, RefValue):
        return "a reference"
    numpy_method = getattr(value, "numpy", None)
    if callable(numpy_method):
        return describe_value(np.asarray(numpy_method()))
    return f"a Python {type(value).__name__} ({value!r:.60})"
