"""The operator registry: one ``OpDef`` per operator, holding everything about it in one place.

An op definition states:

* ``attrs``: its attributes, with defaults and converters (``AttrDef``); a call's attributes are
  checked and completed by ``OpDef.normalize_attrs``;
* ``type_rel(arg_types, attrs, consts) -> Type``: the type relation, called once every argument type
  is known (dims may be ``Any``/``SymDim``); ``consts[i]`` is the argument's value when it is a
  ``Constant`` (else ``None``) so that e.g. ``arange`` of constants gets a static type;
* ``shape_func(attrs, args) -> list[tuple[int, ...]]``: the output shapes (one per output, tuples
  flattened) at run time. ``shape_func_data_dependent`` says, per input or for all, whether the
  function receives the input's *shape* (a tuple; a tuple-typed input gives a list of tuples) or the
  input's *data* (a NumPy array). It validates (a broadcast mismatch raises ``ShapeError``);
* ``shape_logic(op, attrs, args, err) -> shape | [shape, ...]``: the shape logic the shape function
  (and, for the ops converted so far, the shape part of the type relation) is derived from, written
  over ``tensorvm.op.shape_logic``'s domain (``args[i]``: a shape, a list of shapes for a tuple input,
  or a ``DataArg`` for an input read by data); ``shape_logic_traceable`` says it traces into C (the
  C shape functions of target c, ``tensorvm.vm.shape_c``); see docs/shape_logic.md;
* ``pattern``: the fusion pattern;
* ``kernel(attrs, *arrays)``: the NumPy reference kernel, returning an array or a tuple of arrays;
* ``compute``: the tensor-expression compute (``compute(attrs, inputs, out_type) -> [te.Tensor]``, helpers
  in ``tensorvm.op._compute``), and ``strategy``: the implementation strategy of the code generator
  (``tensorvm.codegen.strategy``, imported inside the strategy function). Both are given where the op
  is defined, so an op is complete once its module is imported;
* ``library``: for an op a tensor expression cannot state (sorting, scans, data-dependent scatters),
  a ``LibraryKernel``: the hand-written C function (``tensorvm/codegen/lib/*.c``) the op's kernel
  calls on target c;
* ``legalize(attrs, args) -> Expr``: what a call of the op becomes before the VM compiles it (the
  ``Legalize`` pass), for an op better run as several (``unique``: a sort, then one counting pass);
* ``kind``: ``"kernel"`` (an op computed by a kernel: it needs a compute or a library kernel) or
  ``"dialect"`` (an op of the compiler's own dialect, ``memory.*`` and ``vm.*``: lowered by the compiler
  into VM instructions, never a kernel, so it has neither).

``docs/ops.md`` describes how an op is declared; ``tensorvm ops`` reports which parts each op has.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from enum import IntEnum

from ..errors import AttrError, UnsupportedError
from ..ir.attrs import Attrs
from ..ir.expr import Call, Expr, Op

__all__ = [
    "OpPattern", "AttrDef", "REQUIRED", "OpDef", "OP_KINDS", "register_op", "get_op", "op_names", "is_registered",
    "make_call", "LibraryKernel", "snapshot_definitions", "unchanged_since_registered",
]


class OpPattern(IntEnum):
    """Fusion patterns, ordered from most to least fusable (TVM's numbering)."""

    ELEMWISE = 0
    BROADCAST = 1
    INJECTIVE = 2
    COMM_REDUCE = 3
    OUT_ELEMWISE_FUSABLE = 4
    TUPLE = 7
    OPAQUE = 8


OP_KINDS = ("kernel", "dialect")


class _Required:
    def __repr__(self):
        return "REQUIRED"


REQUIRED = _Required()


@dataclass(frozen=True)
class AttrDef:
    """An attribute: its default (``REQUIRED`` if it has none) and a converter that validates it."""

    name: str
    default: object = None
    convert: Callable | None = None
    doc: str = ""


@dataclass(frozen=True)
class LibraryKernel:
    """An op computed on target c by a hand-written C function: ``function`` (a name, or
    ``function(attrs) -> name`` when the attributes choose among several), defined in ``source`` (a file
    of ``tensorvm/codegen/lib``, included in every translation unit whose kernels call it).

    ``arguments(attrs, inputs, outputs) -> (args, requires)`` maps the op to the call: ``inputs`` and
    ``outputs`` are the kernel's buffers (``.shape``: te dims, ``.dtype``); ``args`` lists, in the C
    function's order, buffers (passed as pointers), te expressions or ints (passed as ``int64_t``) and
    tuples of them (passed as a pointer to an ``int64_t`` array, e.g. a shape); ``requires`` lists
    ``(condition, message)`` checked on entry (a ``ShapeError`` when one fails). An output dim the type
    leaves open (``Any``) is bound from the output array, which the op's shape function sized. The C
    function returns 0 or an error code of the kernel ABI (``tv_lib.h``: ``TV_ERROR_INDEX``...), which
    the kernel returns and the caller raises as an ``ExecutionError``."""

    function: str | Callable
    source: str
    arguments: Callable

    def function_name(self, attrs) -> str:
        return self.function(attrs) if callable(self.function) else self.function


@dataclass(eq=False)
class OpDef:
    name: str
    num_inputs: int  # -1: any number of arguments
    type_rel: Callable
    kernel: Callable
    pattern: OpPattern = OpPattern.OPAQUE
    attrs: tuple = ()
    shape_func: Callable | None = None
    shape_func_data_dependent: bool | tuple = False
    shape_logic: Callable | None = None
    shape_logic_traceable: bool = False
    compute: Callable | None = None
    strategy: object = None
    library: LibraryKernel | None = None
    legalize: Callable | None = None
    doc: str = ""
    kind: str = "kernel"  # "kernel" or "dialect" (see the module docstring)
    defined_in: str = ""  # the module that registered the op (set by register_op)
    _attr_cache: dict = field(default_factory=dict, repr=False)

    def __post_init__(self):
        if self.kind not in OP_KINDS:
            raise ValueError(f"op {self.name}: kind must be one of {', '.join(OP_KINDS)}, got {self.kind!r}")
        self.attrs = tuple(self.attrs)
        if self.shape_logic is not None and getattr(self.shape_logic, "traceable", False):
            self.shape_logic_traceable = True
        self._attr_defs = {a.name: a for a in self.attrs}

    @property
    def op(self) -> Op:
        return Op(self.name)

    def input_needs_data(self, index: int) -> bool:
        """Whether the shape function reads input ``index``'s data rather than its shape."""
        dd = self.shape_func_data_dependent
        if isinstance(dd, tuple):
            return bool(dd[index]) if index < len(dd) else bool(dd[-1])
        return bool(dd)

    @property
    def is_data_dependent(self) -> bool:
        dd = self.shape_func_data_dependent
        return any(dd) if isinstance(dd, tuple) else bool(dd)

    def normalize_attrs(self, attrs: Attrs | dict | None) -> Attrs:
        """Check the given attributes against the definition and fill in defaults (cached)."""
        attrs = attrs if isinstance(attrs, Attrs) else Attrs(attrs or {})
        try:
            return self._attr_cache[attrs]
        except (KeyError, TypeError):
            pass
        unknown = [k for k in attrs if k not in self._attr_defs]
        if unknown:
            expected = ", ".join(self._attr_defs) or "none"
            raise AttrError(f"{self.name}: unknown attribute(s) {', '.join(unknown)}; expected: {expected}")
        full = {}
        for adef in self.attrs:
            if adef.name in attrs:
                value = attrs[adef.name]
            elif adef.default is REQUIRED:
                raise AttrError(f"{self.name}: missing required attribute {adef.name!r}")
            else:
                value = adef.default
            if adef.convert is not None and value is not None:
                try:
                    value = adef.convert(value)
                except (TypeError, ValueError) as err:
                    raise AttrError(f"{self.name}: attribute {adef.name}={value!r} is invalid: {err}") from None
            full[adef.name] = value
        result = Attrs(full)
        try:
            self._attr_cache[attrs] = result
        except TypeError:
            pass
        return result


_REGISTRY: dict[str, OpDef] = {}


def register_op(opdef: OpDef) -> OpDef:
    if opdef.name in _REGISTRY:
        raise ValueError(f"op {opdef.name} is already registered")
    if not opdef.defined_in:
        opdef.defined_in = _defining_module()
    _REGISTRY[opdef.name] = opdef
    _AS_REGISTERED[opdef.name] = _field_values(opdef)
    return opdef


_AS_REGISTERED: dict = {}  # op name -> its definition's field values when it was complete


def snapshot_definitions() -> None:
    """Record every op's definition as it is now: called once the package has defined its ops (some
    parts are attached after ``register_op``, e.g. a shape logic); ops registered later are recorded
    when they are registered."""
    for name, opdef in _REGISTRY.items():
        _AS_REGISTERED[name] = _field_values(opdef)


def _field_values(opdef: OpDef) -> tuple:
    return tuple(getattr(opdef, f.name) for f in fields(opdef) if f.name != "_attr_cache")


def unchanged_since_registered(name: str) -> bool:
    """Whether op ``name``'s definition still holds the very objects it was defined with (no field set
    since ``snapshot_definitions`` / its registration; kernels cached on disk trust only such
    definitions, ``codegen.signature``)."""
    registered = _AS_REGISTERED.get(name)
    return registered is not None and all(a is b for a, b in zip(_field_values(_REGISTRY[name]), registered))


def _defining_module() -> str:
    """The op module whose import registers the op (through helpers such as ``define``), else the
    module that called ``register_op`` (an op registered at run time, e.g. by a test)."""
    frame = sys._getframe(2)
    caller = frame.f_globals.get("__name__", "")
    while frame is not None and frame.f_code.co_name != "<module>":
        frame = frame.f_back
    module = frame.f_globals.get("__name__", "") if frame is not None else ""
    return module if module.startswith("tensorvm.") else caller


def get_op(name: str | Op) -> OpDef:
    key = name.name if isinstance(name, Op) else name
    try:
        return _REGISTRY[key]
    except KeyError:
        raise UnsupportedError(f"unknown operator {key!r}") from None


def is_registered(name: str) -> bool:
    return name in _REGISTRY


def op_names() -> list[str]:
    return sorted(_REGISTRY)


def make_call(name: str, *args: Expr, **attrs) -> Call:
    """Build ``name(args, attrs)`` after checking the attributes against the op's definition."""
    opdef = get_op(name)
    if opdef.num_inputs >= 0 and len(args) != opdef.num_inputs:
        raise TypeError(f"{name} takes {opdef.num_inputs} argument(s), got {len(args)}")
    opdef.normalize_attrs(Attrs(attrs))
    return Call(Op(name), tuple(args), Attrs(attrs))
