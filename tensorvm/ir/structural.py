"""Structural equality and hashing of IR nodes, modulo the names of bound variables.

Two programs are structurally equal when they match node by node and their bound variables
(function parameters, let variables, pattern variables, type parameters) correspond by binding
position (alpha-equivalence). Free variables must be the very same objects unless
``map_free_vars=True``, in which case they are paired on first sight. Constants compare by dtype,
shape and values (NaN equals NaN, ``-0.0`` differs from ``0.0``); attributes by value and Python
kind (``1``, ``1.0`` and ``True`` differ); any two ``IncompleteType`` placeholders are alike.
Spans and checked types are ignored, and a shared
sub-expression (a DAG) equals the same expression written out twice.

``structural_hash`` agrees with equality (equal values hash alike) and is stable across processes.
Both walks use explicit stacks, so long let chains and deep graph-form programs do not exhaust
Python's recursion limit.
"""

from __future__ import annotations

import hashlib
from functools import lru_cache

import numpy as np

from .attrs import Attrs
from .expr import (
    Call,
    Clause,
    Constant,
    Constructor,
    Expr,
    Function,
    GlobalVar,
    If,
    Let,
    Match,
    Op,
    Pattern,
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
from .module import IRModule
from .types import (
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
    TypeData,
    TypeVar,
)

__all__ = ["structural_equal", "structural_hash", "assert_structural_equal"]


# --------------------------------------------------------------------------------------------
# Equality
# --------------------------------------------------------------------------------------------

class _Mismatch(Exception):
    def __init__(self, path, lhs, rhs, reason: str):
        super().__init__(reason)
        self.path, self.lhs, self.rhs, self.reason = path, lhs, rhs, reason


def _path_str(path) -> str:
    """Paths are linked tuples ``(parent, label)`` so that building one costs nothing."""
    labels = []
    while path is not None:
        path, label = path
        labels.append(label)
    text = ""
    for label in reversed(labels):
        text += label if label.startswith("[") or not text else "." + label
    return text or "<root>"


def _constants_equal(a: np.ndarray, b: np.ndarray) -> bool:
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if a.tobytes() == b.tobytes():
        return True
    if a.dtype.kind != "f":
        return False
    # Different bytes may still be equal floats only through NaN payloads and signs.
    if not np.array_equal(a, b, equal_nan=True):
        return False
    numbers = ~np.isnan(a)
    return bool(np.array_equal(np.signbit(a[numbers]), np.signbit(b[numbers])))


def _attr_values_equal(x, y) -> bool:
    if type(x) is not type(y):
        return False
    if isinstance(x, tuple):
        return len(x) == len(y) and all(_attr_values_equal(p, q) for p, q in zip(x, y, strict=True))
    if isinstance(x, float):
        return x == y or (x != x and y != y)
    if isinstance(x, Type):
        return structural_equal(x, y)
    return bool(x == y)


class _EqualChecker:
    """Compares two structures, pairing bound variables as it meets their binding sites."""

    def __init__(self, map_free_vars: bool):
        self.map_free_vars = map_free_vars
        self.var_lr: dict[Var, Var] = {}
        self.var_rl: dict[Var, Var] = {}
        self.tvar_lr: dict = {}
        self.tvar_rl: dict = {}
        self.done: set[tuple[int, int]] = set()

    def fail(self, path, lhs, rhs, reason: str):
        raise _Mismatch(path, lhs, rhs, reason)

    # --- variables --------------------------------------------------------------------------
    def bind_var(self, a: Var, b: Var, path) -> None:
        self.check_type(a.type_annotation, b.type_annotation, (path, "type_annotation"))
        self.var_lr[a] = b
        self.var_rl[b] = a

    def check_var_use(self, a: Var, b: Var, path) -> None:
        if a in self.var_lr:
            if self.var_lr[a] is not b:
                self.fail(path, a, b, "variables bound at different places")
            return
        if b in self.var_rl:
            self.fail(path, a, b, "a free variable on the left meets a bound variable on the right")
        if self.map_free_vars:
            self.bind_var(a, b, path)
        elif a is not b:
            self.fail(path, a, b, "different free variables (pass map_free_vars=True to pair them)")

    def bind_type_var(self, a, b, path) -> None:
        if type(a) is not type(b) or getattr(a, "kind", None) != getattr(b, "kind", None):
            self.fail(path, a, b, "type parameters of different kinds")
        self.tvar_lr[a] = b
        self.tvar_rl[b] = a

    # --- types (small trees: plain recursion) ---------------------------------------------------
    def check_type(self, a, b, path) -> None:
        if a is None or b is None:
            if a is not b:
                self.fail(path, a, b, "a type on one side only")
            return
        if type(a) is not type(b):
            self.fail(path, a, b, f"{type(a).__name__} vs {type(b).__name__}")
        if isinstance(a, TensorType):
            if a.dtype != b.dtype:
                self.fail(path, a, b, f"dtype {a.dtype} vs {b.dtype}")
            if len(a.shape) != len(b.shape):
                self.fail(path, a, b, f"rank {len(a.shape)} vs {len(b.shape)}")
            for i, (da, db) in enumerate(zip(a.shape, b.shape, strict=True)):
                if type(da) is not type(db) or da != db:
                    self.fail((path, f"shape[{i}]"), da, db, f"dimension {da!r} vs {db!r}")
        elif isinstance(a, TupleType):
            self.check_type_list(a.fields, b.fields, path, "fields")
        elif isinstance(a, FuncType):
            if len(a.type_params) != len(b.type_params):
                self.fail(path, a, b, "different numbers of type parameters")
            for i, (pa, pb) in enumerate(zip(a.type_params, b.type_params, strict=True)):
                self.bind_type_var(pa, pb, (path, f"type_params[{i}]"))
            self.check_type_list(a.arg_types, b.arg_types, path, "arg_types")
            self.check_type(a.ret_type, b.ret_type, (path, "ret_type"))
            self.check_type_list(a.type_constraints, b.type_constraints, path, "type_constraints")
        elif isinstance(a, IncompleteType):
            return  # a placeholder with no content (``_`` in text): any two are alike
        elif isinstance(a, TypeVar):
            if a in self.tvar_lr:
                if self.tvar_lr[a] is not b:
                    self.fail(path, a, b, "type variables bound at different places")
            elif b in self.tvar_rl:
                self.fail(path, a, b, "a free type variable on the left meets a bound one on the right")
            elif self.map_free_vars:
                self.bind_type_var(a, b, path)
            elif a is not b:
                self.fail(path, a, b, "different free type variables")
        elif isinstance(a, GlobalTypeVar):
            if a.name != b.name:
                self.fail(path, a, b, f"type {a.name} vs {b.name}")
        elif isinstance(a, TypeCall):
            self.check_type(a.func, b.func, (path, "func"))
            self.check_type_list(a.args, b.args, path, "args")
        elif isinstance(a, RefType):
            self.check_type(a.value, b.value, (path, "value"))
        elif a != b:
            self.fail(path, a, b, "types differ")

    def check_type_list(self, xs, ys, path, label: str) -> None:
        if len(xs) != len(ys):
            self.fail((path, label), xs, ys, f"{len(xs)} vs {len(ys)} {label}")
        for i, (x, y) in enumerate(zip(xs, ys, strict=True)):
            self.check_type(x, y, (path, f"{label}[{i}]"))

    def check_type_data(self, a: TypeData, b: TypeData, path) -> None:
        if a.header.name != b.header.name:
            self.fail(path, a.header, b.header, f"type {a.header.name} vs {b.header.name}")
        if len(a.type_vars) != len(b.type_vars):
            self.fail(path, a.header, b.header, "different numbers of type parameters")
        for i, (x, y) in enumerate(zip(a.type_vars, b.type_vars, strict=True)):
            self.bind_type_var(x, y, (path, f"type_vars[{i}]"))
        if len(a.constructors) != len(b.constructors):
            self.fail(path, a.header, b.header, f"{len(a.constructors)} vs {len(b.constructors)} constructors")
        for i, (ca, cb) in enumerate(zip(a.constructors, b.constructors, strict=True)):
            cpath = (path, f"constructors[{i}]")
            if ca.name != cb.name or ca.tag != cb.tag:
                self.fail(cpath, ca, cb, f"constructor {ca.name} (tag {ca.tag}) vs {cb.name} (tag {cb.tag})")
            self.check_type_list(ca.inputs, cb.inputs, cpath, "inputs")

    # --- attributes -------------------------------------------------------------------------
    def check_attrs(self, a, b, path) -> None:
        a = a if isinstance(a, Attrs) else Attrs(a or {})
        b = b if isinstance(b, Attrs) else Attrs(b or {})
        if set(a) != set(b):
            self.fail(path, dict(a), dict(b), f"attribute names {sorted(a)} vs {sorted(b)}")
        for key in a:
            if not _attr_values_equal(a[key], b[key]):
                self.fail((path, key), a[key], b[key], f"attribute {key}={a[key]!r} vs {b[key]!r}")

    # --- patterns (small trees: plain recursion) --------------------------------------------
    def check_pattern(self, a: Pattern, b: Pattern, path) -> None:
        if type(a) is not type(b):
            self.fail(path, a, b, f"{type(a).__name__} vs {type(b).__name__}")
        if isinstance(a, PatternVar):
            self.bind_var(a.var, b.var, (path, "var"))
        elif isinstance(a, PatternConstructor):
            if a.constructor != b.constructor:
                self.fail(path, a, b, f"constructor {a.constructor.name} vs {b.constructor.name}")
            self.check_pattern_list(a.patterns, b.patterns, path)
        elif isinstance(a, PatternTuple):
            self.check_pattern_list(a.patterns, b.patterns, path)
        elif not isinstance(a, PatternWildcard):
            self.fail(path, a, b, f"unknown pattern kind {type(a).__name__}")

    def check_pattern_list(self, xs, ys, path) -> None:
        if len(xs) != len(ys):
            self.fail(path, xs, ys, f"{len(xs)} vs {len(ys)} sub-patterns")
        for i, (x, y) in enumerate(zip(xs, ys, strict=True)):
            self.check_pattern(x, y, (path, f"patterns[{i}]"))

    # --- expressions (explicit stack) ---------------------------------------------------------
    def check_expr(self, root_a: Expr, root_b: Expr, root_path) -> None:
        stack = [(root_a, root_b, root_path)]
        while stack:
            a, b, path = stack.pop()
            if type(a) is not type(b):
                self.fail(path, a, b, f"{type(a).__name__} vs {type(b).__name__}")
            key = (id(a), id(b))
            if key in self.done:
                continue
            self.done.add(key)
            children = self.check_node(a, b, path)
            # Reversed so that the left-most child is compared first (binders precede uses).
            stack.extend(reversed(children))

    def check_node(self, a: Expr, b: Expr, path) -> list:
        """Compare the node's own fields; return the pairs of children still to compare."""
        if isinstance(a, Var):
            self.check_var_use(a, b, path)
            return []
        if isinstance(a, (GlobalVar, Op)):
            if a.name != b.name:
                self.fail(path, a, b, f"{a.name} vs {b.name}")
            return []
        if isinstance(a, Constant):
            if not _constants_equal(a.data, b.data):
                self.fail(path, a, b, "constants differ (dtype, shape or values)")
            return []
        if isinstance(a, Constructor):
            if a != b:
                self.fail(path, a, b, f"constructor {a.name} vs {b.name}")
            return []
        if isinstance(a, Call):
            if len(a.args) != len(b.args):
                self.fail(path, a, b, f"{len(a.args)} vs {len(b.args)} arguments")
            self.check_attrs(a.attrs, b.attrs, (path, "attrs"))
            self.check_type_list(a.type_args, b.type_args, path, "type_args")
            return [(a.op, b.op, (path, "op"))] + [
                (x, y, (path, f"args[{i}]")) for i, (x, y) in enumerate(zip(a.args, b.args, strict=True))]
        if isinstance(a, Tuple):
            if len(a.fields) != len(b.fields):
                self.fail(path, a, b, f"tuples of {len(a.fields)} vs {len(b.fields)} fields")
            return [(x, y, (path, f"fields[{i}]")) for i, (x, y) in enumerate(zip(a.fields, b.fields, strict=True))]
        if isinstance(a, TupleGetItem):
            if a.index != b.index:
                self.fail(path, a, b, f"projection .{a.index} vs .{b.index}")
            return [(a.tuple_value, b.tuple_value, (path, "tuple_value"))]
        if isinstance(a, Let):
            self.bind_var(a.var, b.var, (path, "var"))
            return [(a.value, b.value, (path, "value")), (a.body, b.body, (path, "body"))]
        if isinstance(a, If):
            return [(a.cond, b.cond, (path, "cond")), (a.true_branch, b.true_branch, (path, "true_branch")),
                    (a.false_branch, b.false_branch, (path, "false_branch"))]
        if isinstance(a, Function):
            if len(a.params) != len(b.params):
                self.fail(path, a, b, f"functions of {len(a.params)} vs {len(b.params)} parameters")
            if len(a.type_params) != len(b.type_params):
                self.fail(path, a, b, "different numbers of type parameters")
            for i, (x, y) in enumerate(zip(a.type_params, b.type_params, strict=True)):
                self.bind_type_var(x, y, (path, f"type_params[{i}]"))
            for i, (x, y) in enumerate(zip(a.params, b.params, strict=True)):
                self.bind_var(x, y, (path, f"params[{i}]"))
            self.check_type(a.ret_type, b.ret_type, (path, "ret_type"))
            self.check_attrs(a.attrs, b.attrs, (path, "attrs"))
            return [(a.body, b.body, (path, "body"))]
        if isinstance(a, Match):
            if a.complete != b.complete:
                self.fail(path, a, b, "match vs match? (completeness differs)")
            if len(a.clauses) != len(b.clauses):
                self.fail(path, a, b, f"{len(a.clauses)} vs {len(b.clauses)} clauses")
            children = [(a.data, b.data, (path, "data"))]
            for i, (ca, cb) in enumerate(zip(a.clauses, b.clauses, strict=True)):
                self.check_pattern(ca.lhs, cb.lhs, (path, f"clauses[{i}].lhs"))
                children.append((ca.rhs, cb.rhs, (path, f"clauses[{i}].rhs")))
            return children
        if isinstance(a, RefCreate):
            return [(a.value, b.value, (path, "value"))]
        if isinstance(a, RefRead):
            return [(a.ref, b.ref, (path, "ref"))]
        if isinstance(a, RefWrite):
            return [(a.ref, b.ref, (path, "ref")), (a.value, b.value, (path, "value"))]
        self.fail(path, a, b, f"unknown expression kind {type(a).__name__}")
        return []

    # --- modules ----------------------------------------------------------------------------
    def check_module(self, a: IRModule, b: IRModule) -> None:
        types_a = {g.name: t for g, t in a.type_definitions.items()}
        types_b = {g.name: t for g, t in b.type_definitions.items()}
        if set(types_a) != set(types_b):
            self.fail(None, sorted(types_a), sorted(types_b), "the modules define different types")
        for name, tdef in types_a.items():
            self.check_type_data(tdef, types_b[name], (None, f"type {name}"))
        funcs_a = {g.name: f for g, f in a.functions.items()}
        funcs_b = {g.name: f for g, f in b.functions.items()}
        if set(funcs_a) != set(funcs_b):
            only_a = sorted(set(funcs_a) - set(funcs_b))
            only_b = sorted(set(funcs_b) - set(funcs_a))
            self.fail(None, only_a, only_b, f"global functions only on the left: {only_a}, only on the right: {only_b}")
        for name, fn in funcs_a.items():
            self.check_expr(fn, funcs_b[name], (None, f"@{name}"))

    def check_any(self, a, b) -> None:
        root = None
        if isinstance(a, IRModule) and isinstance(b, IRModule):
            self.check_module(a, b)
        elif isinstance(a, Expr) and isinstance(b, Expr):
            self.check_expr(a, b, root)
        elif isinstance(a, (Type, type(None))) and isinstance(b, (Type, type(None))):
            self.check_type(a, b, root)
        elif isinstance(a, TypeData) and isinstance(b, TypeData):
            self.check_type_data(a, b, root)
        elif isinstance(a, Pattern) and isinstance(b, Pattern):
            self.check_pattern(a, b, root)
        elif isinstance(a, Clause) and isinstance(b, Clause):
            self.check_pattern(a.lhs, b.lhs, (root, "lhs"))
            self.check_expr(a.rhs, b.rhs, (root, "rhs"))
        elif isinstance(a, Attrs | dict) and isinstance(b, Attrs | dict):
            self.check_attrs(a, b, root)
        elif isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
            if len(a) != len(b):
                self.fail(root, a, b, f"sequences of {len(a)} vs {len(b)} items")
            for i, (x, y) in enumerate(zip(a, b, strict=True)):
                try:
                    self.check_any(x, y)
                except _Mismatch as err:
                    err.path = _prefix_path((root, f"[{i}]"), err.path)
                    raise
        else:
            self.fail(root, a, b, f"cannot compare {type(a).__name__} with {type(b).__name__}")


def _prefix_path(prefix, path):
    labels = []
    while path is not None:
        path, label = path
        labels.append(label)
    for label in reversed(labels):
        prefix = (prefix, label)
    return prefix


def structural_equal(a, b, map_free_vars: bool = False) -> bool:
    """Whether ``a`` and ``b`` (expressions, types, patterns, modules, attrs) are alpha-equivalent."""
    try:
        _EqualChecker(map_free_vars).check_any(a, b)
    except _Mismatch:
        return False
    return True


def _show(node, limit: int = 30) -> str:
    from .printer import expr_to_str, type_to_str

    try:
        if isinstance(node, Expr):
            text = expr_to_str(node)
        elif isinstance(node, Type):
            text = type_to_str(node)
        elif isinstance(node, IRModule):
            text = str(node)
        else:
            text = repr(node)
    except Exception as err:  # printing is a courtesy here; never hide the mismatch behind it
        text = f"<{type(node).__name__}: cannot print ({err})>"
    lines = text.splitlines() or [""]
    if len(lines) > limit:
        lines = lines[:limit] + [f"... ({len(lines) - limit} more lines)"]
    return "\n    ".join(lines)


def assert_structural_equal(a, b, map_free_vars: bool = False) -> None:
    """Raise ``AssertionError`` naming the path of the first difference and both sides there."""
    try:
        _EqualChecker(map_free_vars).check_any(a, b)
    except _Mismatch as err:
        raise AssertionError(
            f"structural mismatch at {_path_str(err.path)}: {err.reason}\n"
            f"  lhs: {_show(err.lhs)}\n  rhs: {_show(err.rhs)}") from None


# --------------------------------------------------------------------------------------------
# Hashing
# --------------------------------------------------------------------------------------------

@lru_cache(maxsize=4096)
def _str_hash(text: str) -> int:
    # Python's str hash is salted per process; a digest keeps structural hashes reproducible.
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little")


def _canon(part):
    if isinstance(part, str):
        return _str_hash(part)
    if isinstance(part, tuple):
        return tuple(_canon(p) for p in part)
    if part is None:
        return 0x5EED  # hash(None) is address-based before Python 3.12
    return part  # ints, bools and floats hash the same in every process


def _h(parts: tuple) -> int:
    """Python's tuple hash over canonical parts: strings go through a digest, never str's salted hash."""
    return hash(_canon(parts))


def _value_hash(value) -> int:
    if isinstance(value, bool):
        return _h(("bool", int(value)))
    if isinstance(value, int):
        return _h(("int", value))
    if isinstance(value, float):
        return _h(("float", 0 if value != value else value))
    if isinstance(value, str):
        return _h(("str", _str_hash(value)))
    if value is None:
        return 0x5EED
    if isinstance(value, tuple):
        return _h(("tuple",) + tuple(_value_hash(v) for v in value))
    if isinstance(value, Type):
        return _Hasher().type_hash(value)
    return _str_hash(repr(value))


def _attrs_hash(attrs) -> int:
    return hash(tuple(sorted((_str_hash(k), _value_hash(v)) for k, v in attrs.items())))


def _constant_hash(data: np.ndarray) -> int:
    if data.dtype.kind == "f" and np.isnan(data).any():
        data = np.where(np.isnan(data), np.array(np.nan, data.dtype), data)
    digest = hashlib.blake2b(np.ascontiguousarray(data).tobytes(), digest_size=8).digest()
    return _h(("Constant", _str_hash(data.dtype.name), data.shape, int.from_bytes(digest, "little")))


class _Hasher:
    """Hashes bound variables by where they are bound (kind and position), never by name or identity.

    That keeps every node's hash independent of its context, so a shared node can be hashed once
    and still agree with an unshared copy of it.
    """

    def __init__(self):
        self.var_site: dict[Var, tuple] = {}
        self.tvar_site: dict = {}
        self.memo: dict[int, int] = {}  # by id: every node stays alive, reachable from the root
        self.pattern_hashes: dict[int, tuple] = {}

    def type_hash(self, ty) -> int:
        if ty is None:
            return 0x70E
        if isinstance(ty, TensorType):
            dims = tuple(d if isinstance(d, int) else (-1 if isinstance(d, Any) else _str_hash(d.name))
                         for d in ty.shape)
            return _h(("Tensor", dims, _str_hash(ty.dtype)))
        if isinstance(ty, TupleType):
            return _h(("TupleType",) + tuple(self.type_hash(f) for f in ty.fields))
        if isinstance(ty, FuncType):
            for i, tp in enumerate(ty.type_params):
                self.tvar_site.setdefault(tp, ("fntype", i))
            return _h(("FuncType", len(ty.type_params), tuple(self.type_hash(a) for a in ty.arg_types),
                         self.type_hash(ty.ret_type), tuple(self.type_hash(c) for c in ty.type_constraints)))
        if isinstance(ty, TypeVar):
            return _h(("TypeVar", _str_hash(ty.kind), self.tvar_site.get(ty, "free")))
        if isinstance(ty, IncompleteType):
            return _h(("IncompleteType",))
        if isinstance(ty, GlobalTypeVar):
            return _h(("GlobalTypeVar", _str_hash(ty.name)))
        if isinstance(ty, TypeCall):
            return _h(("TypeCall", self.type_hash(ty.func), tuple(self.type_hash(a) for a in ty.args)))
        if isinstance(ty, RefType):
            return _h(("RefType", self.type_hash(ty.value)))
        if isinstance(ty, SymDim):
            return _h(("SymDim", _str_hash(ty.name)))
        return _str_hash(repr(ty))

    def pattern_hash(self, pattern: Pattern, counter: list) -> int:
        if isinstance(pattern, PatternVar):
            self.var_site.setdefault(pattern.var, ("pattern", counter[0]))
            counter[0] += 1
            return _h(("PVar", self.type_hash(pattern.var.type_annotation)))
        if isinstance(pattern, PatternConstructor):
            c = pattern.constructor
            return _h(("PCtor", _str_hash(c.name), c.tag) +
                        tuple(self.pattern_hash(p, counter) for p in pattern.patterns))
        if isinstance(pattern, PatternTuple):
            return _h(("PTuple",) + tuple(self.pattern_hash(p, counter) for p in pattern.patterns))
        return _h(("PWildcard",))

    def type_data_hash(self, tdef: TypeData) -> int:
        for i, tv in enumerate(tdef.type_vars):
            self.tvar_site.setdefault(tv, ("typedata", i))
        ctors = tuple((_str_hash(c.name), c.tag, tuple(self.type_hash(t) for t in c.inputs))
                      for c in tdef.constructors)
        return _h(("TypeData", _str_hash(tdef.header.name), len(tdef.type_vars), ctors))

    @staticmethod
    def children(e: Expr) -> tuple:
        if isinstance(e, Call):
            return (e.op, *e.args)
        if isinstance(e, Tuple):
            return e.fields
        if isinstance(e, TupleGetItem):
            return (e.tuple_value,)
        if isinstance(e, Let):
            return (e.value, e.body)
        if isinstance(e, If):
            return (e.cond, e.true_branch, e.false_branch)
        if isinstance(e, Function):
            return (e.body,)
        if isinstance(e, Match):
            return (e.data, *(c.rhs for c in e.clauses))
        if isinstance(e, RefCreate):
            return (e.value,)
        if isinstance(e, RefRead):
            return (e.ref,)
        if isinstance(e, RefWrite):
            return (e.ref, e.value)
        return ()

    def enter(self, e: Expr) -> None:
        """Record the binding sites a node introduces before its children are hashed."""
        if isinstance(e, Function):
            for i, tp in enumerate(e.type_params):
                self.tvar_site.setdefault(tp, ("fn", i))
            for i, p in enumerate(e.params):
                self.var_site.setdefault(p, ("param", i))
        elif isinstance(e, Let):
            self.var_site.setdefault(e.var, ("let",))
        elif isinstance(e, Match):
            self.pattern_hashes[id(e)] = tuple(self.pattern_hash(c.lhs, [0]) for c in e.clauses)

    def leave(self, e: Expr) -> int:
        h = [self.memo[id(c)] for c in self.children(e)]
        if isinstance(e, Var):
            site = self.var_site.get(e)
            if site is None:  # free: paired by position with the other side's free variable
                return _h(("FreeVar", self.type_hash(e.type_annotation)))
            return _h(("Var", site))
        if isinstance(e, GlobalVar):
            return _h(("GlobalVar", _str_hash(e.name)))
        if isinstance(e, Op):
            return _h(("Op", _str_hash(e.name)))
        if isinstance(e, Constant):
            return _constant_hash(e.data)
        if isinstance(e, Constructor):
            return _h(("Constructor", _str_hash(e.name), _str_hash(e.belong_to.name), e.tag))
        if isinstance(e, Call):
            return _h(("Call", *h, _attrs_hash(e.attrs), tuple(self.type_hash(t) for t in e.type_args)))
        if isinstance(e, Tuple):
            return _h(("Tuple", *h))
        if isinstance(e, TupleGetItem):
            return _h(("TupleGetItem", e.index, *h))
        if isinstance(e, Let):
            return _h(("Let", self.type_hash(e.var.type_annotation), *h))
        if isinstance(e, If):
            return _h(("If", *h))
        if isinstance(e, Function):
            return _h(("Function", len(e.type_params), tuple(self.type_hash(p.type_annotation) for p in e.params),
                         self.type_hash(e.ret_type), _attrs_hash(e.attrs), *h))
        if isinstance(e, Match):
            return _h(("Match", e.complete, self.pattern_hashes.pop(id(e)), *h))
        return _h((type(e).__name__, *h))

    def expr_hash(self, root: Expr) -> int:
        stack = [(root, False)]
        while stack:
            e, ready = stack.pop()
            if id(e) in self.memo:
                continue
            if ready:
                self.memo[id(e)] = self.leave(e)
                continue
            self.enter(e)
            stack.append((e, True))
            stack.extend((c, False) for c in reversed(self.children(e)) if id(c) not in self.memo)
        return self.memo[id(root)]


def structural_hash(node) -> int:
    """A hash that agrees with ``structural_equal`` (also with ``map_free_vars=True``)."""
    hasher = _Hasher()
    if isinstance(node, IRModule):
        types = sorted((g.name, hasher.type_data_hash(t)) for g, t in node.type_definitions.items())
        funcs = sorted((g.name, hasher.expr_hash(f)) for g, f in node.functions.items())
        return _h(("IRModule", tuple((_str_hash(n), h) for n, h in types),
                     tuple((_str_hash(n), h) for n, h in funcs)))
    if isinstance(node, Expr):
        return hasher.expr_hash(node)
    if isinstance(node, Type) or node is None:
        return hasher.type_hash(node)
    if isinstance(node, TypeData):
        return hasher.type_data_hash(node)
    if isinstance(node, Pattern):
        return hasher.pattern_hash(node, [0])
    if isinstance(node, Clause):
        return _h(("Clause", hasher.pattern_hash(node.lhs, [0]), hasher.expr_hash(node.rhs)))
    if isinstance(node, Attrs | dict):
        return _attrs_hash(node)
    if isinstance(node, (list, tuple)):
        return _h(("seq",) + tuple(structural_hash(x) for x in node))
    raise TypeError(f"structural_hash expects an expression, type, pattern, module or attrs, got {type(node).__name__}")
