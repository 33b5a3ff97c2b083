"""Type inference for a whole module: after ``InferType``, every expression has a ``checked_type``.

Guarantees afterwards: every expression node, every ``Var`` (parameters, let binders, pattern
variables) and every global's ``Function`` has ``checked_type`` set to a fully resolved type (no
``IncompleteType`` left). Nodes are annotated in place through ``expr.with_type``; the returned
module holds the same function nodes. Nothing is annotated unless the whole module type-checks.

How it works (a constraint solver in the style of Relay's):

* Every global first gets a ``FuncType`` from its annotations, with a fresh ``IncompleteType``
  wherever an annotation is missing, so recursion and mutual recursion need no special order.
  Bodies are then walked once (callees before callers), producing types that may still contain
  ``IncompleteType``s. A union-find (``IncompleteType`` -> its binding) joins them.
* Work that needs a type that is not known yet becomes a *constraint* that waits on one unbound
  ``IncompleteType`` and wakes up when it is bound: an operator's type relation (run once every
  argument type is fully known), a tuple projection, a check of an actual type against a declared
  one, a join of ``if``/``match`` branches, the instantiation of a polymorphic function whose type
  is still being inferred. Waking is incremental, so the solver stays at a fixpoint in linear-ish
  time. Constraints left stuck at the end (typically a recursive call whose result type is only
  fixed by its own base case) are *defaulted* one at a time in creation order: the unknown side
  takes the known side's type. A type still unknown then, with no constraint waiting on anything,
  is one nothing in the program constrains (``fn () { Nil }``: the element type of ``List[_]``; the
  parameter of a closure never called): it becomes ``()`` (see ``may_default_unconstrained``). Anything
  else still unknown is an error ("cannot infer the type of %x").
* Polymorphic functions (``def @id[A](%x: A) -> A``) and ADT constructors (the constructor of
  ``type List[A] { Cons(A, List[A]), Nil }`` has type ``fn [A](A, List[A]) -> List[A]``) are
  instantiated with fresh ``IncompleteType``s at every use. A nullary constructor used as a value
  (``Nil``) is the ADT value itself, of type ``List[_]``. Unannotated functions are not
  generalized: an unannotated parameter takes the type of the first argument it meets, and later
  call sites are only checked against it (so annotate a function called at different shapes).
* A global's symbolic dims are its own: each call binds them from its arguments
  (``instantiate_dims``), so they never show in a caller's types unless the caller passed its own.
* ``GlobalVar``, ``Op`` and ``Constructor`` nodes are shared by all their uses, so they are typed
  per use but annotated with their generic type (a global's or constructor's ``FuncType``; for an
  ``Op``, the function type of its last call).

How two types meet (dims are ``int``, ``Any`` (``?``) or a named ``SymDim``):

* *Declared vs actual* (an argument against its parameter, a body against the return annotation,
  a let value against the binder's annotation): ranks and dtypes must match exactly; per dim,
  equal is fine, ``Any`` on either side is fine and the declared type wins (a ``(3, 2)`` argument
  passed to a ``(?, 2)`` parameter keeps its own type and does not change the parameter), a
  ``SymDim`` against an int or another symbol is fine (optimistic; checked at run time), two
  different static ints are an error: ``... dimension 0 conflicts: 2 does not match 1``.
* *Join* (the branches of an ``if``, the arms of a ``match``): ranks and dtypes must match; dims
  that differ in any way (two different ints, ``Any`` vs an int, two symbols) generalize to
  ``Any``, so ``if (%c) { (3,) } else { (4,) }`` has type ``Tensor[(?), float32]``.
* *Unify* (everything else: a type relation's result against an earlier binding, a pattern
  against its scrutinee, function types, references): like declared vs actual but symmetric.
  An ``IncompleteType`` is bound once; a type that is already known is never rewritten, later
  meetings only check compatibility.
* Operator dims are decided by the operator's type relation (broadcasting of ``Any``/``SymDim``
  lives in ``tensorvm.op._common``); it receives fully resolved argument types, the normalized
  attrs and the values of ``Constant`` arguments.

A variable is usable only inside the scope that binds it (its function, its ``let``'s body, its ``match`` arm,
a recursive ``let``-bound function's own body): a use elsewhere is the error of a free variable.

An ``if`` condition must be a rank-0 ``bool`` tensor. Errors are ``TypeInferenceError``s that name
the place (``<string>:3:14:`` when the node has a span, and the global being checked), a short
printed form of the expression, and the types involved.
"""

from __future__ import annotations

import sys
import types
from collections import deque
from contextlib import contextmanager
from dataclasses import dataclass

from ..errors import AttrError, TensorVMError, TypeInferenceError, UnsupportedError
from ..ir.analysis import pattern_vars
from ..ir.expr import (
    Call,
    Constant,
    Constructor,
    Expr,
    Function,
    GlobalVar,
    If,
    Let,
    Match,
    Op,
    PatternConstructor,
    PatternTuple,
    PatternVar,
    PatternWildcard,
    RefCreate,
    RefRead,
    RefWrite,
    Tuple,
    TupleGetItem,
    Var,
)
from ..ir.functor import ExprFunctor
from ..ir.module import IRModule
from ..ir.types import (
    Any,
    FuncType,
    GlobalTypeVar,
    IncompleteType,
    RefType,
    SymDim,
    TensorType,
    TupleType,
    Type,
    TypeCall,
    TypeVar,
    component_types,
    nested_types,
)
from .pass_infra import Pass

__all__ = ["InferType", "infer_type", "infer_expr"]

_BOOL_SCALAR = TensorType((), "bool")
_UNIT = TupleType(())  # what a type nothing constrains becomes (see may_default_unconstrained)

# A let chain can build a tuple type one level deeper per let (``let %t = (%t, x);``). Every pass
# after this one walks types recursively, so a tuple type may nest at most this deep (as in the text).
MAX_TYPE_NESTING = 500


# --------------------------------------------------------------------------------------------------
# Printing for error messages
# --------------------------------------------------------------------------------------------------
def _type_str(ty) -> str:
    """A type in the text format's syntax (IncompleteType prints as ``_``)."""
    try:  # the printer's spelling when it is available; messages never depend on it working
        from ..ir.printer import type_to_str

        return type_to_str(ty)
    except Exception:  # noqa: BLE001
        pass
    if isinstance(ty, TensorType):
        if not ty.shape:
            return ty.dtype
        return f"Tensor[({', '.join(str(d) for d in ty.shape)}), {ty.dtype}]"
    if isinstance(ty, TupleType):
        inner = ", ".join(_type_str(f) for f in ty.fields)
        return f"({inner},)" if len(ty.fields) == 1 else f"({inner})"
    if isinstance(ty, FuncType):
        params = f"[{', '.join(p.name for p in ty.type_params)}]" if ty.type_params else ""
        return f"fn {params}({', '.join(_type_str(a) for a in ty.arg_types)}) -> {_type_str(ty.ret_type)}"
    if isinstance(ty, TypeCall):
        if not ty.args:
            return ty.func.name
        return f"{ty.func.name}[{', '.join(_type_str(a) for a in ty.args)}]"
    if isinstance(ty, (GlobalTypeVar, TypeVar)):
        return ty.name
    if isinstance(ty, RefType):
        return f"ref({_type_str(ty.value)})"
    if isinstance(ty, IncompleteType):
        return "_"
    return repr(ty)


_MAX_DESCRIPTION = 80


def _describe(expr, depth: int = 0) -> str:
    """A short one-line printed form of ``expr``: the node and its immediate operands."""
    text = _describe_node(expr, depth)
    return text if len(text) <= _MAX_DESCRIPTION else text[: _MAX_DESCRIPTION - 3] + "..."


def _describe_node(expr, depth: int) -> str:
    if isinstance(expr, Var):
        return f"%{expr.name_hint}"
    if isinstance(expr, GlobalVar):
        return f"@{expr.name}"
    if isinstance(expr, (Op, Constructor)):
        return expr.name
    if isinstance(expr, Constant):
        if expr.data.ndim == 0:
            try:
                from ..ir.printer import scalar_to_str

                return scalar_to_str(expr.data.item(), expr.data.dtype.name)
            except Exception:  # noqa: BLE001
                return f"{expr.data.item()!r} ({expr.data.dtype.name})"
        return f"constant of shape {expr.data.shape} ({expr.data.dtype.name})"
    if depth > 1:
        return "..."
    if isinstance(expr, Call):
        return f"{_describe_node(expr.op, 2)}({', '.join(_describe_node(a, depth + 1) for a in expr.args)})"
    if isinstance(expr, Tuple):
        return f"({', '.join(_describe_node(f, depth + 1) for f in expr.fields)}{',' if len(expr.fields) == 1 else ''})"
    if isinstance(expr, TupleGetItem):
        return f"{_describe_node(expr.tuple_value, depth + 1)}.{expr.index}"
    if isinstance(expr, Let):
        return f"let {_describe_node(expr.var, depth + 1)} = {_describe_node(expr.value, depth + 1)}; ..."
    if isinstance(expr, If):
        return f"if ({_describe_node(expr.cond, depth + 1)}) {{...}} else {{...}}"
    if isinstance(expr, Function):
        return f"fn ({', '.join(_describe_node(p, depth + 1) for p in expr.params)}) {{...}}"
    if isinstance(expr, Match):
        return f"match ({_describe_node(expr.data, depth + 1)}) {{...}}"
    if isinstance(expr, RefCreate):
        return f"ref({_describe_node(expr.value, depth + 1)})"
    if isinstance(expr, RefRead):
        return f"ref_read({_describe_node(expr.ref, depth + 1)})"
    if isinstance(expr, RefWrite):
        return f"ref_write({_describe_node(expr.ref, depth + 1)}, {_describe_node(expr.value, depth + 1)})"
    return type(expr).__name__



def _memoized(memo: dict | None, ty, compute):
    """``compute(ty, memo)``, once per type object when ``memo`` ({id: (type, result)}) is given."""
    if memo is None:
        return compute(ty, memo)
    hit = memo.get(id(ty))
    if hit is None:
        hit = memo[id(ty)] = (ty, compute(ty, memo))  # (holding ty keeps its id unique)
    return hit[1]


class _Mismatch(Exception):
    """Two types that cannot meet; converted to a ``TypeInferenceError`` by whoever knows the context."""

    def __init__(self, detail: str):
        super().__init__(detail)
        self.detail = detail


@dataclass(frozen=True, slots=True)
class _Ctx:
    """Where a type comparison happens, formatted only when it fails.

    ``what`` may contain ``{expr}``, replaced by the short printed form of ``node``. ``kind`` is
    ``expect`` (first type declared, second actual), ``join`` or ``unify``.
    """

    node: object
    what: str
    global_name: str | None
    kind: str = "expect"
    subject: object = None  # the expression ``{expr}`` names, when not ``node``

    def prefix(self) -> str:
        span = getattr(self.node, "span", None)
        where = f"{span}: " if span is not None else ""
        return where + (f"in @{self.global_name}: " if self.global_name else "")

    def message(self, text: str) -> str:
        if "{expr}" in self.what:
            what = self.what.replace("{expr}", _describe(self.subject if self.subject is not None else self.node))
        else:
            what = self.what
        return f"{self.prefix()}{what}{text}"

    def error(self, first, second, detail: str) -> TypeInferenceError:
        a, b = _type_str(first), _type_str(second)
        if self.kind == "expect":
            text = f": expected {a}, got {b}"
        elif self.kind == "join":
            text = f" have incompatible types {a} and {b}"
        else:
            text = f": {a} does not match {b}"
        if detail:
            text += f"; {detail}"
        return TypeInferenceError(self.message(text))

    def fail(self, text: str) -> TypeInferenceError:
        return TypeInferenceError(self.message(text))


# --------------------------------------------------------------------------------------------------
# Constraints waiting for unknown types
# --------------------------------------------------------------------------------------------------
class _Constraint:
    """Something to do once a type is known. ``blocking_root`` names the unbound IncompleteType it
    waits on (``None``: ready); ``solve`` does the work; ``default`` breaks a deadlock (or returns
    False when it cannot)."""

    __slots__ = ("done",)

    def __init__(self):
        self.done = False

    def blocking_root(self, solver: _Solver):  # pragma: no cover - abstract
        raise NotImplementedError

    def solve(self, solver: _Solver) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def default(self, solver: _Solver) -> bool:
        return False


class _OpRelation(_Constraint):
    """``out = type_rel(args)`` once every argument type is fully known."""

    __slots__ = ("inferencer", "call", "opdef", "attrs", "arg_types", "out")

    def __init__(self, inferencer, call, opdef, attrs, arg_types, out):
        super().__init__()
        self.inferencer, self.call, self.opdef, self.attrs = inferencer, call, opdef, attrs
        self.arg_types, self.out = arg_types, out

    def blocking_root(self, solver):
        for ty in self.arg_types:
            root = solver.first_root(ty)
            if root is not None:
                return root
        return None

    def solve(self, solver):
        result = self.inferencer.run_type_relation(self.call, self.opdef, self.attrs, self.arg_types)
        ctx = _Ctx(self.call, "the result of {expr}", self.inferencer.global_name_of(self.call), "unify")
        solver.unify(self.out, result, ctx)


class _Projection(_Constraint):
    """``out = tuple_type.fields[index]`` once the tuple's type is known."""

    __slots__ = ("inferencer", "node", "tuple_type", "out")

    def __init__(self, inferencer, node, tuple_type, out):
        super().__init__()
        self.inferencer, self.node, self.tuple_type, self.out = inferencer, node, tuple_type, out

    def blocking_root(self, solver):
        ty = solver.find(self.tuple_type)
        return ty if isinstance(ty, IncompleteType) else None

    def solve(self, solver):
        field = self.inferencer.project(self.node, solver.find(self.tuple_type))
        ctx = _Ctx(self.node, "{expr}", self.inferencer.global_name_of(self.node), "unify")
        solver.unify(self.out, field, ctx)


class _Assign(_Constraint):
    """Check an actual type against a declared one once the actual type is known."""

    __slots__ = ("expected", "actual", "ctx")

    def __init__(self, expected, actual, ctx):
        super().__init__()
        self.expected, self.actual, self.ctx = expected, actual, ctx

    def blocking_root(self, solver):
        ty = solver.find(self.actual)
        return ty if isinstance(ty, IncompleteType) else None

    def solve(self, solver):
        solver.assign(self.expected, self.actual, self.ctx)

    def default(self, solver):
        solver.unify(self.actual, self.expected, self.ctx)
        return True


class _Join(_Constraint):
    """``out = join(left, right)`` once neither side is an unbound IncompleteType."""

    __slots__ = ("left", "right", "out", "ctx")

    def __init__(self, left, right, out, ctx):
        super().__init__()
        self.left, self.right, self.out, self.ctx = left, right, out, ctx

    def blocking_root(self, solver):
        for side in (self.left, self.right):
            ty = solver.find(side)
            if isinstance(ty, IncompleteType):
                return ty
        return None

    def solve(self, solver):
        joined = solver.join(self.left, self.right, self.ctx)
        solver.unify(self.out, joined, self.ctx)

    def default(self, solver):
        solver.unify(self.left, self.right, self.ctx)
        solver.unify(self.out, self.left, self.ctx)
        return True


class _Instantiate(_Constraint):
    """``fresh = subst(pending)``: a polymorphic function's type part that was unknown when it was
    instantiated; substituted once fully known (defaulted: used monomorphically)."""

    __slots__ = ("pending", "fresh", "mapping", "ctx")

    def __init__(self, pending, fresh, mapping, ctx):
        super().__init__()
        self.pending, self.fresh, self.mapping, self.ctx = pending, fresh, mapping, ctx

    def blocking_root(self, solver):
        return solver.first_root(self.pending)

    def solve(self, solver):
        solver.unify(self.fresh, _substitute(solver.resolve(self.pending), self.mapping), self.ctx)

    def default(self, solver):
        solver.unify(self.fresh, self.pending, self.ctx)
        return True


def _rebuild(ty, leaf):
    """``ty`` with ``leaf`` applied to every part that is not a tuple, function, ADT application or reference."""
    if isinstance(ty, TupleType):
        return TupleType(tuple(_rebuild(f, leaf) for f in ty.fields))
    if isinstance(ty, FuncType):
        return FuncType(tuple(_rebuild(a, leaf) for a in ty.arg_types), _rebuild(ty.ret_type, leaf), ty.type_params,
                        ty.type_constraints)
    if isinstance(ty, TypeCall):
        return TypeCall(ty.func, tuple(_rebuild(a, leaf) for a in ty.args))
    if isinstance(ty, RefType):
        return RefType(_rebuild(ty.value, leaf))
    return leaf(ty)


def _substitute(ty, mapping: dict):
    """Replace type variables (by identity) in a resolved type."""
    if not mapping:
        return ty
    return _rebuild(ty, lambda part: mapping.get(part, part) if isinstance(part, TypeVar) else part)


def _sym_dims_met(declared, actual, met: dict) -> None:
    """Add to ``met[sym]`` every dim of ``actual`` that stands where ``declared`` has the symbol ``sym``
    (both resolved; parts of different structure, or not known yet, are skipped)."""
    pending = [(declared, actual)]
    while pending:
        d, a = pending.pop()
        if isinstance(d, TensorType):
            if isinstance(a, TensorType) and len(a.shape) == len(d.shape):
                for dd, ad in zip(d.shape, a.shape, strict=True):
                    if isinstance(dd, SymDim):
                        met.setdefault(dd, []).append(ad)
            continue
        parts_d, parts_a = component_types(d), component_types(a)
        if type(d) is type(a) and len(parts_d) == len(parts_a):
            pending.extend(zip(parts_d, parts_a, strict=True))


def _substitute_dims(ty, mapping: dict):
    """``ty`` (resolved) with its symbolic dims replaced through ``mapping`` (``?`` for a symbol it lacks)."""
    def leaf(part):
        if isinstance(part, TensorType) and any(isinstance(d, SymDim) for d in part.shape):
            return TensorType(tuple(mapping.get(d, Any()) if isinstance(d, SymDim) else d for d in part.shape),
                              part.dtype)
        return part

    return _rebuild(ty, leaf)


def _adt_parts(ty):
    """``(GlobalTypeVar, args)`` for an ADT type (``List[A]`` or a bare ``Tree``), else None."""
    if isinstance(ty, TypeCall):
        return ty.func, ty.args
    if isinstance(ty, GlobalTypeVar):
        return ty, ()
    return None


def _kind_name(ty) -> str:
    if isinstance(ty, TensorType):
        return "a tensor"
    if isinstance(ty, TupleType):
        return "a tuple"
    if isinstance(ty, FuncType):
        return "a function"
    if isinstance(ty, (TypeCall, GlobalTypeVar)):
        return "an ADT"
    if isinstance(ty, TypeVar):
        return f"type parameter {ty.name}"
    if isinstance(ty, RefType):
        return "a reference"
    return type(ty).__name__


def _check_tensor(expected: TensorType, actual: TensorType) -> None:
    """Raise ``_Mismatch`` unless the two tensor types can describe the same value."""
    if len(expected.shape) != len(actual.shape):
        raise _Mismatch(f"rank {len(actual.shape)} does not match {len(expected.shape)}")
    if expected.dtype != actual.dtype:
        raise _Mismatch(f"dtype {actual.dtype} does not match {expected.dtype}")
    for index, (e, a) in enumerate(zip(expected.shape, actual.shape, strict=True)):
        if isinstance(e, int) and isinstance(a, int) and e != a:
            raise _Mismatch(f"dimension {index} conflicts: {a} does not match {e}")


def _join_dim(a, b):
    return a if a == b else Any()


# --------------------------------------------------------------------------------------------------
# The solver: union-find over IncompleteTypes plus the constraint queue
# --------------------------------------------------------------------------------------------------
class _Solver:
    def __init__(self):
        self.binding: dict[IncompleteType, Type] = {}
        self.watchers: dict[IncompleteType, list[_Constraint]] = {}
        self.worklist: deque[_Constraint] = deque()
        self.draining = False
        self.defaultable: list[_Constraint] = []
        self.next_default = 0

    # --- lookup ----------------------------------------------------------------------------------
    def find(self, ty):
        """The representative of ``ty``: an unbound IncompleteType or a non-Incomplete type."""
        if not isinstance(ty, IncompleteType):
            return ty
        binding = self.binding
        path = []
        while isinstance(ty, IncompleteType):
            nxt = binding.get(ty)
            if nxt is None:
                break
            path.append(ty)
            ty = nxt
        for node in path[:-1]:
            binding[node] = ty
        return ty

    def resolve(self, ty, memo: dict | None = None):
        """``ty`` with every bound IncompleteType replaced, recursively. Types share sub-types (a let
        chain building tuples of tuples makes each type contain the previous one): with ``memo``
        ({id: (type, result)}, kept across calls) each shared sub-type is resolved once, not once per use."""
        return _memoized(memo, ty, self._resolve)

    def _resolve(self, ty, memo):
        ty = self.find(ty)
        if isinstance(ty, TensorType | IncompleteType | TypeVar | GlobalTypeVar):
            return ty
        if isinstance(ty, TupleType):
            fields = tuple(self.resolve(f, memo) for f in ty.fields)
            return ty if all(a is b for a, b in zip(fields, ty.fields, strict=True)) else TupleType(fields)
        if isinstance(ty, FuncType):
            args = tuple(self.resolve(a, memo) for a in ty.arg_types)
            ret = self.resolve(ty.ret_type, memo)
            if ret is ty.ret_type and all(a is b for a, b in zip(args, ty.arg_types, strict=True)):
                return ty
            return FuncType(args, ret, ty.type_params, ty.type_constraints)
        if isinstance(ty, TypeCall):
            args = tuple(self.resolve(a, memo) for a in ty.args)
            return ty if all(a is b for a, b in zip(args, ty.args, strict=True)) else TypeCall(ty.func, args)
        if isinstance(ty, RefType):
            value = self.resolve(ty.value, memo)
            return ty if value is ty.value else RefType(value)
        return ty

    def first_root(self, ty, memo: dict | None = None):
        """The first unbound IncompleteType inside ``ty``, or None when ``ty`` is fully known (``memo``:
        as for ``resolve``)."""
        return _memoized(memo, ty, self._first_root)

    def _first_root(self, ty, memo):
        ty = self.find(ty)
        if isinstance(ty, IncompleteType):
            return ty
        if isinstance(ty, TensorType | TypeVar | GlobalTypeVar):
            return None
        if isinstance(ty, TupleType):
            children = ty.fields
        elif isinstance(ty, FuncType):
            children = (*ty.arg_types, ty.ret_type)
        elif isinstance(ty, TypeCall):
            children = ty.args
        elif isinstance(ty, RefType):
            children = (ty.value,)
        else:
            return None
        for child in children:
            root = self.first_root(child, memo)
            if root is not None:
                return root
        return None

    def _occurs(self, root, ty) -> bool:
        ty = self.find(ty)
        if ty is root:
            return True
        if isinstance(ty, TupleType):
            return any(self._occurs(root, f) for f in ty.fields)
        if isinstance(ty, FuncType):
            return any(self._occurs(root, a) for a in ty.arg_types) or self._occurs(root, ty.ret_type)
        if isinstance(ty, TypeCall):
            return any(self._occurs(root, a) for a in ty.args)
        if isinstance(ty, RefType):
            return self._occurs(root, ty.value)
        return False

    # --- binding and the queue -------------------------------------------------------------------
    def bind(self, root: IncompleteType, ty) -> None:
        if ty is root:
            return
        if not isinstance(ty, IncompleteType | TensorType) and self._occurs(root, ty):
            raise _Mismatch(f"a type cannot contain itself ({_type_str(self.resolve(ty))})")
        self.binding[root] = ty
        waiting = self.watchers.pop(root, None)
        if waiting:
            self.worklist.extend(waiting)
            self.drain()

    def add(self, constraint: _Constraint, defaultable: bool = False) -> None:
        if defaultable:
            self.defaultable.append(constraint)
        self.worklist.append(constraint)
        self.drain()

    def drain(self) -> None:
        if self.draining:
            return
        self.draining = True
        try:
            worklist = self.worklist
            while worklist:
                constraint = worklist.popleft()
                if constraint.done:
                    continue
                root = constraint.blocking_root(self)
                if root is None:
                    constraint.done = True
                    constraint.solve(self)
                else:
                    self.watchers.setdefault(root, []).append(constraint)
        finally:
            self.draining = False

    def run_defaults(self) -> None:
        """Break deadlocks: default the oldest stuck constraint, propagate, repeat."""
        while self.next_default < len(self.defaultable):
            constraint = self.defaultable[self.next_default]
            self.next_default += 1
            if constraint.done:
                continue
            constraint.done = True
            if constraint.default(self):
                self.drain()

    # --- meeting types ---------------------------------------------------------------------------
    def unify(self, a, b, ctx: _Ctx) -> None:
        try:
            self._unify(a, b)
        except _Mismatch as mismatch:
            raise ctx.error(self.resolve(a), self.resolve(b), mismatch.detail) from None

    def _unify(self, a, b) -> None:
        a, b = self.find(a), self.find(b)
        if a is b:
            return
        if isinstance(a, IncompleteType):
            self.bind(a, b)
            return
        if isinstance(b, IncompleteType):
            self.bind(b, a)
            return
        if isinstance(a, TensorType) and isinstance(b, TensorType):
            if a != b:
                _check_tensor(a, b)
            return
        if isinstance(a, TupleType) and isinstance(b, TupleType):
            if len(a.fields) != len(b.fields):
                raise _Mismatch(f"a tuple of {len(b.fields)} fields does not match one of {len(a.fields)}")
            for x, y in zip(a.fields, b.fields, strict=True):
                self._unify(x, y)
            return
        if isinstance(a, FuncType) and isinstance(b, FuncType):
            a, b = self._monomorphic_pair(a, b)
            if len(a.arg_types) != len(b.arg_types):
                raise _Mismatch(f"a function of {len(b.arg_types)} parameters does not match one of "
                                f"{len(a.arg_types)}")
            for x, y in zip(a.arg_types, b.arg_types, strict=True):
                self._unify(x, y)
            self._unify(a.ret_type, b.ret_type)
            return
        pa, pb = _adt_parts(a), _adt_parts(b)
        if pa is not None and pb is not None:
            if pa[0] != pb[0]:
                raise _Mismatch(f"type {pb[0].name} does not match {pa[0].name}")
            if len(pa[1]) != len(pb[1]):
                raise _Mismatch(f"{pa[0].name} applied to {len(pb[1])} type arguments does not match "
                                f"{len(pa[1])}")
            for x, y in zip(pa[1], pb[1], strict=True):
                self._unify(x, y)
            return
        if isinstance(a, RefType) and isinstance(b, RefType):
            self._unify(a.value, b.value)
            return
        raise _Mismatch(f"{_kind_name(b)} does not match {_kind_name(a)}")

    def _monomorphic_pair(self, a: FuncType, b: FuncType):
        """Two function types to compare without type parameters: a polymorphic one meeting a
        monomorphic one is instantiated; two polymorphic ones are compared up to renaming."""
        if not a.type_params and not b.type_params:
            return a, b
        if a.type_params and b.type_params:
            if len(a.type_params) != len(b.type_params):
                raise _Mismatch(f"a function with {len(b.type_params)} type parameters does not match one with "
                                f"{len(a.type_params)}")
            renamed = _substitute(self.resolve(b), dict(zip(b.type_params, a.type_params, strict=True)))
            return (FuncType(a.arg_types, a.ret_type), FuncType(renamed.arg_types, renamed.ret_type))
        if a.type_params:
            return self.instantiate(a, None)[0], b
        return a, self.instantiate(b, None)[0]

    def instantiate(self, fty: FuncType, ctx: _Ctx | None):
        """``fty`` with its type parameters replaced by fresh IncompleteTypes; returns (type, fresh)."""
        fresh = tuple(IncompleteType(p.name) for p in fty.type_params)
        mapping = dict(zip(fty.type_params, fresh, strict=True))
        resolved = self.resolve(fty)
        pending: dict[IncompleteType, IncompleteType] = {}

        def subst(ty):
            if isinstance(ty, IncompleteType):
                # Still being inferred (a polymorphic function without a return annotation).
                if ty not in pending:
                    pending[ty] = IncompleteType(ty.hint)
                return pending[ty]
            if isinstance(ty, TypeVar):
                return mapping.get(ty, ty)
            if isinstance(ty, TensorType | GlobalTypeVar):
                return ty
            if isinstance(ty, TupleType):
                return TupleType(tuple(subst(f) for f in ty.fields))
            if isinstance(ty, FuncType):
                return FuncType(tuple(subst(a) for a in ty.arg_types), subst(ty.ret_type), ty.type_params)
            if isinstance(ty, TypeCall):
                return TypeCall(ty.func, tuple(subst(a) for a in ty.args))
            if isinstance(ty, RefType):
                return RefType(subst(ty.value))
            return ty

        result = FuncType(tuple(subst(a) for a in resolved.arg_types), subst(resolved.ret_type))
        for old, new in pending.items():
            inst_ctx = ctx or _Ctx(None, "instantiating a polymorphic function", None, "unify")
            self.add(_Instantiate(old, new, mapping, inst_ctx), defaultable=True)
        return result, fresh

    def assign(self, expected, actual, ctx: _Ctx) -> None:
        """Check ``actual`` against the declared ``expected`` (the declared side wins on ``Any``)."""
        try:
            self._assign(expected, actual, ctx)
        except _Mismatch as mismatch:
            raise ctx.error(self.resolve(expected), self.resolve(actual), mismatch.detail) from None

    def _assign(self, expected, actual, ctx) -> None:
        e, a = self.find(expected), self.find(actual)
        if e is a:
            return
        if isinstance(a, IncompleteType):
            if isinstance(e, IncompleteType):
                self.bind(e, a)
            else:
                # Wait for the actual type so it keeps its own (possibly more precise) dims.
                self.add(_Assign(e, a, ctx), defaultable=True)
            return
        if isinstance(e, IncompleteType):
            self.bind(e, a)
            return
        if isinstance(e, TensorType) and isinstance(a, TensorType):
            if e != a:
                _check_tensor(e, a)
            return
        if isinstance(e, TupleType) and isinstance(a, TupleType):
            if len(e.fields) != len(a.fields):
                raise _Mismatch(f"a tuple of {len(a.fields)} fields does not match one of {len(e.fields)}")
            for x, y in zip(e.fields, a.fields, strict=True):
                self._assign(x, y, ctx)
            return
        pe, pa = _adt_parts(e), _adt_parts(a)
        if pe is not None and pa is not None and pe[0] == pa[0] and len(pe[1]) == len(pa[1]):
            for x, y in zip(pe[1], pa[1], strict=True):
                self._assign(x, y, ctx)
            return
        if isinstance(e, FuncType) and isinstance(a, FuncType) and e.type_params and not a.type_params:
            # (a polymorphic function may be used where a monomorphic one is declared, not the reverse: the
            # callee would call it at every type)
            raise _Mismatch(f"a function of one type does not match the polymorphic function type declared: it must "
                            f"take every type of its {len(e.type_params)} type parameter(s)")
        self._unify(e, a)

    def join(self, a, b, ctx: _Ctx):
        """The type of a value that is either ``a`` or ``b`` (if branches, match arms)."""
        try:
            return self._join(a, b, ctx)
        except _Mismatch as mismatch:
            raise ctx.error(self.resolve(a), self.resolve(b), mismatch.detail) from None

    def _join(self, a, b, ctx):
        a, b = self.find(a), self.find(b)
        if a is b:
            return a
        a_open, b_open = isinstance(a, IncompleteType), isinstance(b, IncompleteType)
        if a_open and b_open:
            self.bind(a, b)
            return b
        if a_open or b_open:
            out = IncompleteType("join")
            self.add(_Join(a, b, out, ctx), defaultable=True)
            return out
        if isinstance(a, TensorType) and isinstance(b, TensorType):
            if a == b:
                return a
            if len(a.shape) != len(b.shape):
                raise _Mismatch(f"rank {len(b.shape)} does not match {len(a.shape)}")
            if a.dtype != b.dtype:
                raise _Mismatch(f"dtype {b.dtype} does not match {a.dtype}")
            return TensorType(tuple(_join_dim(x, y) for x, y in zip(a.shape, b.shape, strict=True)), a.dtype)
        if isinstance(a, TupleType) and isinstance(b, TupleType):
            if len(a.fields) != len(b.fields):
                raise _Mismatch(f"a tuple of {len(b.fields)} fields does not match one of {len(a.fields)}")
            return TupleType(tuple(self._join(x, y, ctx) for x, y in zip(a.fields, b.fields, strict=True)))
        pa, pb = _adt_parts(a), _adt_parts(b)
        if pa is not None and pb is not None and pa[0] == pb[0] and len(pa[1]) == len(pb[1]) and pa[1]:
            return TypeCall(pa[0], tuple(self._join(x, y, ctx) for x, y in zip(pa[1], pb[1], strict=True)))
        self._unify(a, b)
        return a


# --------------------------------------------------------------------------------------------------
# The expression walk
# --------------------------------------------------------------------------------------------------
_DATAFLOW_KINDS = frozenset({Call, Tuple, TupleGetItem})


def _dataflow_children(node) -> tuple:
    if type(node) is Call:
        return (node.op, *node.args)
    if type(node) is Tuple:
        return node.fields
    return (node.tuple_value,)


def _children(node) -> tuple:
    """The sub-expressions of ``node`` (pattern variables excluded)."""
    kind = type(node)
    if kind in _DATAFLOW_KINDS:
        return _dataflow_children(node)
    if kind is Let:
        return (node.value, node.body)
    if kind is If:
        return (node.cond, node.true_branch, node.false_branch)
    if kind is Function:
        return (node.body,)
    if kind is Match:
        return (node.data, *(clause.rhs for clause in node.clauses))
    if kind is RefCreate:
        return (node.value,)
    if kind is RefRead:
        return (node.ref,)
    if kind is RefWrite:
        return (node.ref, node.value)
    return ()


def _referenced_globals(expr) -> list[GlobalVar]:
    """Globals referenced anywhere in ``expr``, in order of first appearance (iterative walk)."""
    found: dict[GlobalVar, None] = {}
    seen: set[int] = set()
    stack = [expr]
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if type(node) is GlobalVar:
            found.setdefault(node, None)
            continue
        stack.extend(reversed(_children(node)))
    return list(found)


class _Inferencer(ExprFunctor):
    """Walks expressions once, producing type terms and constraints; ``finish`` resolves them."""

    def __init__(self, mod: IRModule, allow_free_vars: bool = False):
        super().__init__()
        self.mod = mod
        self.allow_free_vars = allow_free_vars
        self.tuple_depths: dict[int, tuple] = {}  # id(TupleType built here) -> (the type, its nesting)
        self.solver = _Solver()
        self.env: dict[Var, Type] = {}            # every bound variable -> its type term
        self.var_owner: dict[Var, str | None] = {}
        self.in_scope: dict[Var, int] = {}        # a variable -> how many of the scopes now open bind it
        self.owner: dict[Expr, str | None] = {}   # expression -> global it belongs to (for messages)
        self.global_types: dict[GlobalVar, FuncType] = {}
        self.shared: list[tuple[Expr, Type]] = []  # GlobalVar/Op/Constructor uses (not memoized)
        self.constructor_types: dict[Constructor, FuncType] = {}
        self.current: str | None = None

    # --- entry points ----------------------------------------------------------------------------
    def declare_globals(self, gvs) -> None:
        """Give these globals a FuncType from their annotations (IncompleteType where missing)."""
        for gv in gvs:
            fn = self.mod.functions[gv]
            if not isinstance(fn, Function):
                raise TypeInferenceError(f"global @{gv.name} must be a Function, got {type(fn).__name__}")
            self.current = gv.name
            params = tuple(self.bind_param(p) for p in fn.params)
            ret = self.annotation(fn.ret_type) if fn.ret_type is not None else None
            fty = FuncType(params, ret if ret is not None else IncompleteType(f"@{gv.name}.ret"), fn.type_params)
            self.global_types[gv] = fty
            self.memo[fn] = fty
            self.owner[fn] = gv.name
        self.current = None

    def check_global(self, gv: GlobalVar) -> None:
        fn = self.mod.functions[gv]
        self.current = gv.name
        fty = self.global_types[gv]
        with self.scope(fn.params):  # (bound when the globals were declared)
            body_type = self.visit(fn.body)
        if fn.ret_type is not None:
            self.solver.assign(fty.ret_type, body_type,
                               _Ctx(fn.body, f"the body of @{gv.name} against its return annotation", gv.name))
        else:
            self.solver.unify(fty.ret_type, body_type, _Ctx(fn.body, f"the body of @{gv.name}", gv.name, "unify"))
        self.shared.append((gv, fty))
        self.current = None

    def globals_in_dependency_order(self, roots) -> list[GlobalVar]:
        """Callees before callers (post-order DFS over references), each global once."""
        keys = {gv: gv for gv in self.mod.functions}  # the module's own GlobalVar objects
        order, seen = [], set()
        for root in roots:
            if root in seen or root not in self.mod.functions:
                continue
            root = keys[root]
            seen.add(root)
            stack = [(root, iter(_referenced_globals(self.mod.functions[root].body)))]
            while stack:
                gv, children = stack[-1]
                child = next(children, None)
                if child is None:
                    stack.pop()
                    order.append(gv)
                elif child not in seen and child in keys:
                    child = keys[child]
                    seen.add(child)
                    stack.append((child, iter(_referenced_globals(self.mod.functions[child].body))))
        return order

    def finish(self) -> None:
        """Default stuck constraints, check everything is known, then annotate every node."""
        solver = self.solver
        solver.run_defaults()
        may_default = self.may_default_unconstrained()
        resolved: list[tuple[Expr, Type]] = []
        resolve_memo: dict = {}
        root_memo: dict = {}

        def known(ty):
            full = solver.resolve(ty, resolve_memo)
            while may_default and (root := solver.first_root(full, root_memo)) is not None:
                solver.bind(root, _UNIT)
                resolve_memo.clear()  # their answers are stale once a root is bound
                root_memo.clear()
                full = solver.resolve(ty, resolve_memo)
            return full

        for var, ty in self.env.items():
            full = known(ty)
            if solver.first_root(full, root_memo) is not None:
                owner = self.var_owner.get(var)
                where = f"{var.span}: " if var.span is not None else ""
                known_part = "" if isinstance(full, IncompleteType) else f" (only {_type_str(full)} is known)"
                raise TypeInferenceError(
                    f"{where}{f'in @{owner}: ' if owner else ''}cannot infer the type of %{var.name_hint}"
                    f"{known_part}; add a type annotation")
            resolved.append((var, full))
        for expr, ty in self.memo.items():
            if isinstance(expr, Var):
                continue
            full = known(ty)
            if solver.first_root(full, root_memo) is not None:
                ctx = _Ctx(expr, "cannot infer the type of {expr}", self.owner.get(expr))
                known_part = "" if isinstance(full, IncompleteType) else f" (only {_type_str(full)} is known)"
                raise ctx.fail(f"{known_part}; add a type annotation")
            resolved.append((expr, full))
        for node, ty in self.shared:
            full = known(ty)
            if solver.first_root(full, root_memo) is not None:
                raise TypeInferenceError(f"cannot infer the type of {_describe(node)} ({_type_str(full)})")
            resolved.append((node, full))
        for node, ty in resolved:
            node.with_type(ty)

    def may_default_unconstrained(self) -> bool:
        """Whether an unknown type left after solving may become ``()``: then it is one nothing in the
        program constrains (the element type of a ``Nil`` never consed onto, the parameter of a
        closure never called). Sound because no value of such a type is made or inspected by the
        program (every value an op, constant, constructor or tuple makes has a type derived from known
        ones); a value coming from outside is checked against ``()`` at the boundary. Not while a
        constraint still waits (an op or a projection on an unknown type) or a global has a parameter
        of which nothing at all is known (``def @f(%x) { %x }``: nothing says what a caller passes):
        the unknown type is then an error."""
        solver = self.solver
        if any(not c.done for waiting in solver.watchers.values() for c in waiting):
            return False
        return not any(isinstance(solver.find(p), IncompleteType)
                       for fty in self.global_types.values() for p in fty.arg_types)

    # --- helpers ---------------------------------------------------------------------------------
    def global_name_of(self, expr) -> str | None:
        return self.owner.get(expr, self.current)

    def ctx(self, node, what: str, kind: str = "expect") -> _Ctx:
        return _Ctx(node, what, self.current, kind)

    def error(self, node, text: str) -> TypeInferenceError:
        return _Ctx(node, "", self.current).fail(text)

    def annotation(self, ty):
        """Validate a type annotation (ADT names and arities); ``None`` when there is none."""
        if ty is None or isinstance(ty, IncompleteType):
            return None
        if not isinstance(ty, Type):
            raise TypeInferenceError(f"expected a type annotation, got {ty!r}")
        return self._check_annotation(ty)

    def _check_annotation(self, ty):
        if isinstance(ty, TensorType | TypeVar):
            return ty
        if isinstance(ty, IncompleteType):
            return IncompleteType(ty.hint)  # a written "_": a fresh unknown, never shared
        if isinstance(ty, TupleType):
            return TupleType(tuple(self._check_annotation(f) for f in ty.fields))
        if isinstance(ty, FuncType):
            return FuncType(tuple(self._check_annotation(a) for a in ty.arg_types),
                            self._check_annotation(ty.ret_type), ty.type_params, ty.type_constraints)
        if isinstance(ty, RefType):
            return RefType(self._check_annotation(ty.value))
        parts = _adt_parts(ty)
        if parts is not None:
            header, args = parts
            tdef = self.mod.type_definitions.get(header)
            if tdef is None:
                known = ", ".join(g.name for g in self.mod.type_definitions) or "none"
                raise TypeInferenceError(f"{f'in @{self.current}: ' if self.current else ''}unknown type "
                                         f"{header.name} (the module defines: {known})")
            if len(args) != len(tdef.type_vars):
                raise TypeInferenceError(f"type {header.name} takes {len(tdef.type_vars)} type argument(s), "
                                         f"got {len(args)} in {_type_str(ty)}")
            if not args:
                return ty
            return TypeCall(header, tuple(self._check_annotation(a) for a in args))
        raise TypeInferenceError(f"unsupported type annotation {ty!r}")

    def bind_param(self, param) -> Type:
        if not isinstance(param, Var):
            raise TypeInferenceError(f"a function parameter must be a Var, got {type(param).__name__}")
        ty = self.annotation(param.type_annotation)
        if ty is None:
            ty = IncompleteType(param.name_hint)
        self.bind_var(param, ty)
        return ty

    def bind_var(self, var: Var, ty) -> None:
        self.env[var] = ty
        self.var_owner[var] = self.current

    @contextmanager
    def scope(self, variables):
        """``variables`` in scope (usable) while the block runs."""
        for var in variables:
            self.in_scope[var] = self.in_scope.get(var, 0) + 1
        try:
            yield
        finally:
            for var in variables:
                self.in_scope[var] -= 1

    def constructor_type(self, ctor: Constructor) -> FuncType:
        fty = self.constructor_types.get(ctor)
        if fty is not None:
            return fty
        tdef = self.mod.type_definitions.get(ctor.belong_to)
        if tdef is None:
            raise self.error(ctor, f"constructor {ctor.name} belongs to type {ctor.belong_to.name}, which the "
                                   "module does not define")
        canonical = next((c for c in tdef.constructors if c.name == ctor.name), None)
        if canonical is None:
            raise self.error(ctor, f"type {ctor.belong_to.name} has no constructor {ctor.name}")
        ret = TypeCall(tdef.header, tdef.type_vars) if tdef.type_vars else tdef.header
        fty = FuncType(canonical.inputs, ret, tdef.type_vars)
        self.constructor_types[ctor] = fty
        return fty

    # --- visiting --------------------------------------------------------------------------------
    def visit(self, expr):
        kind = type(expr)
        if kind is Var:  # (every use: a variable node may be used both in and out of its binder's scope)
            if not self.in_scope.get(expr) and (expr in self.env or not self.allow_free_vars):
                raise self.error(expr, f"variable %{expr.name_hint} is used but not bound here (a free variable, "
                                       f"or one used outside the scope that binds it)")
            return self.visit_var(expr)
        if kind is GlobalVar or kind is Op or kind is Constructor:
            # Instantiated per use, and GlobalVars with one name hash alike: never memoized.
            return self._dispatch[kind](self, expr)
        try:
            return self.memo[expr]
        except KeyError:
            pass
        except TypeError:
            raise TypeInferenceError(f"expected an IR expression, got {kind.__name__}") from None
        if kind in _DATAFLOW_KINDS:
            self._visit_dataflow(expr)
            return self.memo[expr]
        return self._visit_node(expr)

    def _visit_node(self, expr):
        handler = self._dispatch.get(type(expr))
        if handler is None:
            raise TypeInferenceError(f"expected an IR expression, got {type(expr).__name__}")
        result = handler(self, expr)
        self.memo[expr] = result
        if self.current is not None:
            self.owner[expr] = self.current
        return result

    def _visit_dataflow(self, root) -> None:
        """Visit a graph of calls/tuples/projections children-first without deep Python recursion
        (graph-form programs nest thousands of calls); other nodes are visited as they are met."""
        memo = self.memo
        order, seen = [], set()
        stack = [(root, False)]
        while stack:
            node, expanded = stack.pop()
            if expanded:
                order.append(node)
                continue
            if id(node) in seen or node in memo:
                continue
            seen.add(id(node))
            stack.append((node, True))
            for child in reversed(_dataflow_children(node)):
                if type(child) in _DATAFLOW_KINDS and id(child) not in seen and child not in memo:
                    stack.append((child, False))
        for node in order:
            self._visit_node(node)

    def visit_var(self, var: Var):
        ty = self.env.get(var)
        if ty is None:
            if not self.allow_free_vars:
                raise self.error(var, f"variable %{var.name_hint} is used but not bound here (a free variable)")
            ty = self.annotation(var.type_annotation)
            if ty is None:
                ty = IncompleteType(var.name_hint)
            self.bind_var(var, ty)
            self.in_scope[var] = 1  # (a free variable is in scope everywhere)
        return ty

    def visit_global_var(self, gv: GlobalVar):
        fty = self.global_types.get(gv)
        if fty is None:
            known = ", ".join("@" + g.name for g in self.mod.functions) or "none"
            raise self.error(gv, f"unknown global @{gv.name} (the module defines: {known})")
        self.shared.append((gv, fty))
        return fty

    def visit_op(self, op: Op):
        raise self.error(op, f"operator {op.name} is used as a value; operators can only be called")

    def visit_constant(self, const: Constant):
        return TensorType(const.data.shape, const.data.dtype.name)

    def visit_constructor(self, ctor: Constructor):
        fty = self.constructor_type(ctor)
        self.shared.append((ctor, fty))
        if not fty.arg_types:
            # A nullary constructor used as a value is the ADT value itself (``Nil``), as in the
            # interpreter; its node (shared by every use) keeps the constructor's function type.
            return self.solver.instantiate(fty, None)[0].ret_type
        return fty

    def visit_tuple(self, tup: Tuple):
        fields = tuple(self.visit(f) for f in tup.fields)
        depth = 1 + max((self.tuple_depths.get(id(self.solver.find(f)), (None, 0))[1] for f in fields), default=0)
        if depth > MAX_TYPE_NESTING:
            raise self.error(tup, f"this tuple's type nests {depth} tuples deep; expected at most {MAX_TYPE_NESTING} "
                                  f"(a let chain wrapping a tuple in a tuple at each step?)")
        ty = TupleType(fields)
        self.tuple_depths[id(ty)] = (ty, depth)
        return ty

    def visit_tuple_getitem(self, node: TupleGetItem):
        tuple_type = self.solver.find(self.visit(node.tuple_value))
        if isinstance(tuple_type, IncompleteType):
            out = IncompleteType("proj")
            self.solver.add(_Projection(self, node, tuple_type, out))
            return out
        return self.project(node, tuple_type)

    def project(self, node: TupleGetItem, tuple_type):
        if isinstance(node.index, bool) or not isinstance(node.index, int):
            raise self.error(node, f"a tuple index must be an int, got {node.index!r}")
        if not isinstance(tuple_type, TupleType):
            raise self.error(node, f"cannot take field {node.index} of {_describe(node.tuple_value)}: it has type "
                                   f"{_type_str(self.solver.resolve(tuple_type))}, not a tuple")
        if not 0 <= node.index < len(tuple_type.fields):
            raise self.error(node, f"tuple index {node.index} is out of range in {_describe(node)}: the tuple "
                                   f"has {len(tuple_type.fields)} field(s), type "
                                   f"{_type_str(self.solver.resolve(tuple_type))}")
        return tuple_type.fields[node.index]

    def visit_let(self, let: Let):
        chain = []
        expr = let
        while isinstance(expr, Let) and expr not in self.memo:
            var = expr.var
            if not isinstance(var, Var):
                raise self.error(expr, f"a let must bind a Var, got {type(var).__name__}")
            annotated = self.annotation(var.type_annotation)
            recursive = annotated is None and isinstance(expr.value, Function)
            if annotated is not None:
                self.bind_var(var, annotated)
            elif recursive:
                # A let-bound function may call itself: its name is in scope in its own body.
                self.bind_var(var, IncompleteType(var.name_hint))
            if recursive:
                with self.scope((var,)):
                    value_type = self.visit(expr.value)
            else:
                value_type = self.visit(expr.value)
            if annotated is not None:
                self.solver.assign(annotated, value_type,
                                   self.ctx(expr.value, f"the value bound to %{var.name_hint}"))
            elif recursive:
                self.solver.unify(self.env[var], value_type,
                                  self.ctx(expr.value, f"the function bound to %{var.name_hint}", "unify"))
            else:
                self.bind_var(var, value_type)
            chain.append(expr)
            self.in_scope[var] = self.in_scope.get(var, 0) + 1
            expr = expr.body
        try:
            body_type = self.visit(expr)
        finally:
            for node in chain:
                self.in_scope[node.var] -= 1
        for node in chain:
            self.memo[node] = body_type
            self.owner[node] = self.current
        return body_type

    def visit_if(self, node: If):
        cond_type = self.visit(node.cond)
        self.check_condition(node, cond_type)
        then_type = self.visit(node.true_branch)
        else_type = self.visit(node.false_branch)
        return self.solver.join(then_type, else_type, self.ctx(node, "the branches of {expr}", "join"))

    def check_condition(self, node: If, cond_type) -> None:
        # Deferred while the condition's type is unknown (e.g. a pending type relation), so that a
        # rank-1 comparison is reported as a bad condition rather than as a failed relation.
        ctx = _Ctx(node.cond if node.cond.span is not None else node,
                   "the condition of {expr} must be a rank-0 bool tensor", self.current, subject=node)
        self.solver.assign(_BOOL_SCALAR, cond_type, ctx)

    def visit_function(self, fn: Function):
        params = tuple(self.bind_param(p) for p in fn.params)
        ret = self.annotation(fn.ret_type)
        with self.scope(fn.params):
            body_type = self.visit(fn.body)
        if ret is None:
            ret = body_type
        else:
            self.solver.assign(ret, body_type, _Ctx(fn.body, "the body of {expr} against its return annotation",
                                                    self.current, subject=fn))
        return FuncType(params, ret, fn.type_params)

    def visit_call(self, call: Call):
        if isinstance(call.op, Op):
            return self.visit_op_call(call)
        if isinstance(call.op, Constructor):
            callee_type = self.constructor_type(call.op)
            self.shared.append((call.op, callee_type))
        else:
            callee_type = self.visit(call.op)
        arg_types = [self.visit(a) for a in call.args]
        solver = self.solver
        found = solver.find(callee_type)
        if isinstance(found, IncompleteType):
            ret = IncompleteType("ret")
            solver.unify(found, FuncType(tuple(arg_types), ret), self.ctx(call, "the callee of {expr}", "unify"))
            return ret
        if not isinstance(found, FuncType):
            raise self.error(call, f"cannot call {_describe(call.op)} in {_describe(call)}: it has type "
                                   f"{_type_str(solver.resolve(found))}, not a function type")
        fty = found
        if fty.type_params:
            fty, fresh = solver.instantiate(fty, self.ctx(call, "the polymorphic callee of {expr}", "unify"))
            if call.type_args:
                if len(call.type_args) != len(fresh):
                    raise self.error(call, f"{_describe(call.op)} takes {len(fresh)} type argument(s), got "
                                           f"{len(call.type_args)}")
                for var, given in zip(fresh, call.type_args, strict=True):
                    solver.unify(var, self.annotation(given), self.ctx(call, "a type argument of {expr}", "unify"))
        if len(fty.arg_types) != len(arg_types):
            noun = "constructor " if isinstance(call.op, Constructor) else ""
            raise self.error(call, f"{noun}{_describe(call.op)} takes {len(fty.arg_types)} argument(s), got "
                                   f"{len(arg_types)} in {_describe(call)}")
        if isinstance(call.op, GlobalVar):
            fty = self.instantiate_dims(call, fty, arg_types)
        for index, (param_type, arg_type, arg) in enumerate(zip(fty.arg_types, arg_types, call.args, strict=True)):
            node = arg if getattr(arg, "span", None) is not None else call
            solver.assign(param_type, arg_type,
                          _Ctx(node, f"argument {index + 1} of {{expr}}", self.current, subject=call))
        return fty.ret_type

    def instantiate_dims(self, call: Call, fty: FuncType, arg_types) -> FuncType:
        """The callee's type at this call, its symbolic dims bound by the arguments.

        A global's symbols are its own (``n`` in ``def @g(%x: Tensor[(n, 3), float32])`` says only that
        every ``n`` of one call is the same size), so each call binds them afresh: a symbol takes the
        static size an argument has there (two different sizes are an error), else the caller's symbol
        when every argument has that same one, else ``?``; a symbol no parameter fixes is ``?``.
        ``@g(%a, %a) + @g(%c, %c)`` with ``%a: (4, 3)`` and ``%c: (1, 3)`` is a (4, 3) plus a (1, 3).
        """
        solver = self.solver
        resolved = solver.resolve(fty)
        if not any(isinstance(d, SymDim) for part in nested_types(resolved) if isinstance(part, TensorType)
                   for d in part.shape):
            return fty
        met: dict[SymDim, list] = {}
        for declared, arg_type in zip(resolved.arg_types, arg_types, strict=True):
            _sym_dims_met(declared, solver.resolve(arg_type), met)
        mapping = {}
        for sym, dims in met.items():
            sizes = sorted({d for d in dims if isinstance(d, int)})
            if len(sizes) > 1:
                raise self.error(call, f"dimension {sym.name} of {_describe(call.op)} is {sizes[0]} in one argument "
                                       f"and {sizes[1]} in another in {_describe(call)}")
            if sizes:
                mapping[sym] = sizes[0]
            elif all(d == dims[0] for d in dims) and isinstance(dims[0], SymDim):
                mapping[sym] = dims[0]
        return _substitute_dims(resolved, mapping)

    def visit_op_call(self, call: Call):
        from ..op import get_op

        name = call.op.name
        try:
            opdef = get_op(name)
        except UnsupportedError:
            raise self.error(call, f"unknown operator {name} in {_describe(call)}") from None
        arg_types = [self.visit(a) for a in call.args]
        if opdef.num_inputs >= 0 and len(arg_types) != opdef.num_inputs:
            raise self.error(call, f"operator {name} takes {opdef.num_inputs} argument(s), got {len(arg_types)} "
                                   f"in {_describe(call)}")
        try:
            attrs = opdef.normalize_attrs(call.attrs)
        except AttrError as err:
            raise self.error(call, f"bad attributes in {_describe(call)}: {err}") from None
        solver = self.solver
        if all(solver.first_root(t) is None for t in arg_types):
            result = self.run_type_relation(call, opdef, attrs, arg_types)
        else:
            result = IncompleteType(name)
            solver.add(_OpRelation(self, call, opdef, attrs, arg_types, result))
        self.shared.append((call.op, FuncType(tuple(arg_types), result)))
        return result

    def run_type_relation(self, call: Call, opdef, attrs, arg_types) -> Type:
        """Apply the op's type relation to fully known argument types."""
        ctx = _Ctx(call, "{expr}", self.global_name_of(call))
        types = [self.solver.resolve(t) for t in arg_types]
        consts = [a.data if isinstance(a, Constant) else None for a in call.args]
        try:
            result = opdef.type_rel(types, attrs, consts)
        except TypeInferenceError as err:
            raise ctx.fail(f": {err}") from None
        except (TensorVMError, ValueError, TypeError, IndexError, KeyError, ZeroDivisionError) as err:
            args = ", ".join(_type_str(t) for t in types)
            raise ctx.fail(f": the type relation of {opdef.name} failed on ({args}): {type(err).__name__}: {err}"
                           ) from err
        if not isinstance(result, Type):
            raise ctx.fail(f": the type relation of {opdef.name} returned {result!r}, not a type")
        return result

    def visit_match(self, match: Match):
        data_type = self.visit(match.data)
        if not match.clauses:
            raise self.error(match, f"{_describe(match)} has no clauses")
        result = None
        for clause in match.clauses:
            self.bind_pattern(clause.lhs, data_type, match)
            with self.scope(pattern_vars(clause.lhs)):
                rhs_type = self.visit(clause.rhs)
            if result is None:
                result = rhs_type
            else:
                result = self.solver.join(result, rhs_type, self.ctx(match, "the clauses of {expr}", "join"))
        if match.complete:
            self.check_exhaustive(match)
        return result

    def check_exhaustive(self, match: Match) -> None:
        """A ``match`` (as in Relay) must cover every value of its scrutinee's type; ``match?`` may fail at run
        time. (A match too wide to analyse within ``MAX_UNMATCHED_CASES`` partial cases is not refused.)"""
        from ..ir.analysis import unmatched_cases
        from ..ir.printer import pattern_to_str

        cases = unmatched_cases(match, self.mod)
        if cases:
            shown = ", ".join(pattern_to_str(p) for p in cases[:4]) + (", ..." if len(cases) > 4 else "")
            raise self.error(match, f"{_describe(match)} is not exhaustive: no clause matches {shown} (write "
                                    f"match? for a match that may fail at run time)")

    def bind_pattern(self, pattern, ty, match: Match) -> None:
        solver = self.solver
        if isinstance(pattern, PatternWildcard):
            return
        if isinstance(pattern, PatternVar):
            var = pattern.var
            annotated = self.annotation(var.type_annotation)
            if annotated is not None:
                solver.assign(annotated, ty, self.ctx(match, f"pattern variable %{var.name_hint} in {{expr}}"))
                self.bind_var(var, annotated)
            else:
                self.bind_var(var, ty)
            return
        if isinstance(pattern, PatternConstructor):
            ctor = pattern.constructor
            fty, _ = solver.instantiate(self.constructor_type(ctor), None)
            solver.unify(fty.ret_type, ty, self.ctx(match, f"pattern {ctor.name}(...) against the value matched in "
                                                           "{expr}", "unify"))
            if len(pattern.patterns) != len(fty.arg_types):
                raise self.error(match, f"pattern {ctor.name} in {_describe(match)} has {len(pattern.patterns)} "
                                        f"sub-pattern(s) but constructor {ctor.name} takes {len(fty.arg_types)}")
            for sub, field_type in zip(pattern.patterns, fty.arg_types, strict=True):
                self.bind_pattern(sub, field_type, match)
            return
        if isinstance(pattern, PatternTuple):
            found = solver.find(ty)
            if isinstance(found, TupleType):
                if len(found.fields) != len(pattern.patterns):
                    raise self.error(match, f"a tuple pattern of {len(pattern.patterns)} field(s) in "
                                            f"{_describe(match)} cannot match {_type_str(solver.resolve(found))}")
                fields = found.fields
            else:
                fields = tuple(IncompleteType("field") for _ in pattern.patterns)
                solver.unify(TupleType(fields), ty, self.ctx(match, "a tuple pattern in {expr}", "unify"))
            for sub, field_type in zip(pattern.patterns, fields, strict=True):
                self.bind_pattern(sub, field_type, match)
            return
        raise self.error(match, f"expected a pattern, got {type(pattern).__name__}")

    def visit_ref_create(self, node: RefCreate):
        return RefType(self.visit(node.value))

    def visit_ref_read(self, node: RefRead):
        ref_type = self.solver.find(self.visit(node.ref))
        if isinstance(ref_type, RefType):
            return ref_type.value
        value = IncompleteType("ref_value")
        self.solver.unify(RefType(value), ref_type, self.ctx(node, "the reference read by {expr}", "unify"))
        return value

    def visit_ref_write(self, node: RefWrite):
        ref_type = self.solver.find(self.visit(node.ref))
        value_type = self.visit(node.value)
        if isinstance(ref_type, RefType):
            self.solver.assign(ref_type.value, value_type, self.ctx(node, "the value written by {expr}"))
        else:
            self.solver.unify(RefType(value_type), ref_type, self.ctx(node, "the reference written by {expr}",
                                                                      "unify"))
        return TupleType(())


# --------------------------------------------------------------------------------------------------
# Public API
# --------------------------------------------------------------------------------------------------
class InferType(Pass):
    """Infer and record the type of every expression of every global; raises ``TypeInferenceError``."""

    name = "InferType"
    opt_level = 0

    def transform_module(self, mod: IRModule) -> IRModule:
        if not isinstance(mod, IRModule):
            raise TypeInferenceError(f"InferType expects an IRModule, got {type(mod).__name__}")
        inferencer = _Inferencer(mod)
        order = inferencer.globals_in_dependency_order(list(mod.functions))
        inferencer.declare_globals(order)
        for gv in order:
            inferencer.check_global(gv)
        inferencer.finish()
        return mod.with_functions(dict(mod.functions))


def infer_type(mod: IRModule) -> IRModule:
    """Type-check ``mod``; returns a new module whose nodes all carry ``checked_type``."""
    return InferType()(mod)


def infer_expr(expr: Expr, mod: IRModule | None = None) -> Type:
    """The type of ``expr`` (free variables allowed: their annotation or an inferred type), in the
    context of ``mod``'s globals and ADTs; annotates ``expr``'s nodes and the globals it uses."""
    if not isinstance(expr, Expr):
        raise TypeInferenceError(f"infer_expr expects an IR expression, got {type(expr).__name__}")
    mod = mod if mod is not None else IRModule()
    inferencer = _Inferencer(mod, allow_free_vars=True)
    order = inferencer.globals_in_dependency_order(_referenced_globals(expr))
    inferencer.declare_globals(order)
    for gv in order:
        inferencer.check_global(gv)
    result = inferencer.visit(expr)
    inferencer.finish()
    return inferencer.solver.resolve(result)



class _CallableModule(types.ModuleType):
    """Importing this module makes ``tensorvm.transform.infer_type`` name the module, shadowing the
    function of the same name; calling the module runs the function, so both spellings work."""

    def __call__(self, mod: IRModule) -> IRModule:
        return infer_type(mod)


sys.modules[__name__].__class__ = _CallableModule
