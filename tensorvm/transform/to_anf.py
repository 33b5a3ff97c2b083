"""ToANormalForm: bind every non-atomic sub-expression to a ``let``, each shared node exactly once.

Requires: nothing (types are carried over when present). Primitive functions are left untouched,
and a primitive function in call position stays there (``@fused(...)`` after lambda lifting).

After it, the body of every non-primitive function (nested ones included) is a chain of
``let %v = <value>;`` ending in an atom (a var, global, constant, constructor or op) or an ``If`` /
``Match`` whose branches are again such chains. A value is an ``If``/``Match``, a ``Function``, or a
node whose operands are atoms: a call, tuple, projection or reference operation. A node shared by
several uses (a DAG edge of graph form) is bound once, in the innermost scope (function body,
``if`` branch, ``match`` arm) that contains all its uses, so it is computed at most once and never
hoisted out of a branch that alone needs it.

This module also holds small helpers shared by the VM lowering passes (iterative traversal, let
chain flattening, type-preserving rebuilding).
"""

from __future__ import annotations

from ..ir.expr import (
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
    RefCreate,
    RefRead,
    RefWrite,
    Tuple,
    TupleGetItem,
    Var,
)
from ..ir.functor import ExprMutator
from ..ir.module import IRModule
from .pass_infra import Pass

__all__ = ["ToANormalForm", "to_anf"]

ATOMIC_TYPES = (Var, GlobalVar, Constant, Op, Constructor)


# --- shared helpers ----------------------------------------------------------------------------
def copy_type(new: Expr, old: Expr) -> Expr:
    """Give ``new`` the checked type of ``old`` (when known and ``new`` has none); return ``new``."""
    if new is not old and getattr(new, "_checked_type", None) is None:
        ty = getattr(old, "_checked_type", None)
        if ty is not None:
            new.with_type(ty)
    return new


def rebuilt_let(node: Let, var: Var, value: Expr, body: Expr) -> Expr:
    """``node`` itself when ``var``, ``value`` and ``body`` are its own parts, else a ``Let`` of them with
    ``node``'s span and type (how a pass rebuilds a let chain from the inside out)."""
    if var is node.var and value is node.value and body is node.body:
        return node
    return copy_type(Let(var, value, body, span=node.span), node)


def known_type(expr: Expr):
    """The checked type of ``expr`` or, for an annotated var, its annotation; ``None`` if unknown."""
    ty = getattr(expr, "_checked_type", None)
    if ty is None and isinstance(expr, Var):
        ty = expr.type_annotation
    return ty


def is_atomic(expr: Expr) -> bool:
    return isinstance(expr, ATOMIC_TYPES) or (isinstance(expr, Function) and expr.is_primitive)


def primitive_children(expr: Expr, with_let_vars: bool = False) -> list:
    """Direct sub-expressions inside a primitive function's body: call arguments (the callee is an op),
    tuple fields, projected tuples, let values and bodies (and the let's variable if asked)."""
    if isinstance(expr, Call):
        return list(expr.args)
    if isinstance(expr, Tuple):
        return list(expr.fields)
    if isinstance(expr, TupleGetItem):
        return [expr.tuple_value]
    if isinstance(expr, Let):
        return [expr.var, expr.value, expr.body] if with_let_vars else [expr.value, expr.body]
    return []


def expr_children(expr: Expr, enter_functions: bool = True) -> list:
    """Direct sub-expressions (bound vars included); primitive function bodies are never entered."""
    if isinstance(expr, Call):
        return [expr.op, *expr.args]
    if isinstance(expr, Tuple):
        return list(expr.fields)
    if isinstance(expr, TupleGetItem):
        return [expr.tuple_value]
    if isinstance(expr, Let):
        return [expr.var, expr.value, expr.body]
    if isinstance(expr, If):
        return [expr.cond, expr.true_branch, expr.false_branch]
    if isinstance(expr, Match):
        return [expr.data, *(c.rhs for c in expr.clauses)]
    if isinstance(expr, Function):
        if expr.is_primitive or not enter_functions:
            return []
        return [*expr.params, expr.body]
    if isinstance(expr, RefCreate):
        return [expr.value]
    if isinstance(expr, RefRead):
        return [expr.ref]
    if isinstance(expr, RefWrite):
        return [expr.ref, expr.value]
    return []


def post_order_iter(root: Expr, children=expr_children) -> list:
    """Every node reachable from ``root`` once, children first, without recursion."""
    order, seen = [], set()
    stack = [(root, False)]
    while stack:
        node, expanded = stack.pop()
        if expanded:
            order.append(node)
            continue
        if node in seen:
            continue
        seen.add(node)
        stack.append((node, True))
        for child in reversed(children(node)):
            if child not in seen:
                stack.append((child, False))
    return order


def flatten_lets(expr: Expr) -> tuple[list, Expr]:
    """``let a = x; let b = y; t`` -> ``([(a, x), (b, y)], t)``."""
    bindings = []
    while isinstance(expr, Let):
        bindings.append((expr.var, expr.value))
        expr = expr.body
    return bindings, expr


def build_lets(bindings, tail: Expr) -> Expr:
    """The inverse of ``flatten_lets`` (types of the lets are those of the tail)."""
    result = tail
    ty = known_type(tail)
    for var, value in reversed(bindings):
        result = Let(var, value, result)
        if ty is not None:
            result.with_type(ty)
    return result


def typed_var(name: str, ty) -> Var:
    """A fresh var whose checked type is already known (so later passes need no re-inference)."""
    var = Var(name)
    if ty is not None:
        var.with_type(ty)
    return var


class TypedMutator(ExprMutator):
    """An ``ExprMutator`` whose rebuilt nodes keep the checked type of the node they replace."""

    def visit(self, expr: Expr):
        new = super().visit(expr)
        return copy_type(new, expr)


def rebuild_function(fn: Function, body: Expr, **changes) -> Function:
    """``fn`` with a new body (and optionally other fields), keeping its checked type."""
    new = Function(
        changes.get("params", fn.params), body, changes.get("ret_type", fn.ret_type),
        changes.get("type_params", fn.type_params), changes.get("attrs", fn.attrs), span=fn.span,
    )
    return copy_type(new, fn)


# --- scopes ------------------------------------------------------------------------------------
class _Scope:
    __slots__ = ("parent", "depth", "bindings")

    def __init__(self, parent: _Scope | None):
        self.parent = parent
        self.depth = 0 if parent is None else parent.depth + 1
        self.bindings: list = []


def _lca(a: _Scope | None, b: _Scope) -> _Scope:
    if a is None:
        return b
    while a.depth > b.depth:
        a = a.parent
    while b.depth > a.depth:
        b = b.parent
    while a is not b:
        a, b = a.parent, b.parent
    return a


class _ANFConverter:
    """Converts one function body (nested non-primitive functions included)."""

    def __init__(self):
        self.scope: dict[Expr, _Scope] = {}
        self.child_scopes: dict[Expr, list[_Scope]] = {}
        self.uses: dict[Expr, int] = {}
        self.memo: dict[Expr, Expr] = {}
        self.counter = 0

    # Scope of each node = the innermost scope containing all of its uses.
    def assign_scopes(self, body: Expr, root: _Scope) -> None:
        order = post_order_iter(body)
        for node in order:
            for child in expr_children(node):
                self.uses[child] = self.uses.get(child, 0) + 1
        self.scope[body] = root
        for node in reversed(order):
            s = self.scope[node]
            if isinstance(node, If):
                branches = [_Scope(s), _Scope(s)]
                self.child_scopes[node] = branches
                pairs = [(node.cond, s), (node.true_branch, branches[0]), (node.false_branch, branches[1])]
            elif isinstance(node, Match):
                arms = [_Scope(s) for _ in node.clauses]
                self.child_scopes[node] = arms
                pairs = [(node.data, s)] + [(c.rhs, a) for c, a in zip(node.clauses, arms)]
            elif isinstance(node, Function) and not node.is_primitive:
                inner = _Scope(s)
                self.child_scopes[node] = [inner]
                pairs = [(p, inner) for p in node.params] + [(node.body, inner)]
            else:
                pairs = [(c, s) for c in expr_children(node)]
            for child, cs in pairs:
                self.scope[child] = _lca(self.scope.get(child), cs)

    def fresh(self, like: Expr) -> Var:
        self.counter += 1
        return copy_type(Var(f"x{self.counter}"), like)

    # Block of a scope: its bindings then ``root`` (inline when it is an If/Match of this scope).
    def block(self, root: Expr, scope: _Scope) -> Expr:
        # Nodes of enclosing scopes met on the way are appended to those scopes' (open) blocks.
        scope.bindings = []
        tail = self.tail(root, scope)
        return build_lets(scope.bindings, tail)

    def tail(self, root: Expr, scope: _Scope) -> Expr:
        # Unshared lets and a final If/Match of this scope stay inline; anything else is an atom.
        while isinstance(root, Let) and self.inline_here(root, scope):
            self.bind_let(root, scope)
            root = root.body
        if isinstance(root, (If, Match)) and self.inline_here(root, scope):
            return self.value(root)
        return self.atom(root)

    def inline_here(self, node: Expr, scope: _Scope) -> bool:
        return self.scope.get(node) is scope and self.uses.get(node, 0) <= 1 and node not in self.memo

    def bind_let(self, let: Let, scope: _Scope) -> None:
        value = let.value
        # A value shared with other uses is bound once elsewhere; alias it.
        converted = self.atom(value) if self.uses.get(value, 0) > 1 else self.value(value)
        scope.bindings.append((let.var, converted))

    def atom(self, node: Expr) -> Expr:
        if is_atomic(node):
            return node
        try:
            return self.memo[node]
        except KeyError:
            pass
        if isinstance(node, Let):
            # A let chain used as a value: its bindings go to its own scope.
            scope = self.scope[node]
            expr = node
            while isinstance(expr, Let) and expr not in self.memo:
                self.bind_let(expr, scope)
                expr = expr.body
            result = self.atom(expr)
            self.memo[node] = result
            return result
        value = self.value(node)
        var = self.fresh(node)
        self.scope[node].bindings.append((var, value))
        self.memo[node] = var
        return var

    def value(self, node: Expr) -> Expr:
        """``node`` rebuilt with atomic operands (sub-blocks for branches and function bodies)."""
        if is_atomic(node):
            return node
        if isinstance(node, Call):
            new = Call(self.atom(node.op), tuple(self.atom(a) for a in node.args), node.attrs, node.type_args,
                       span=node.span)
        elif isinstance(node, Tuple):
            new = Tuple(tuple(self.atom(f) for f in node.fields), span=node.span)
        elif isinstance(node, TupleGetItem):
            new = TupleGetItem(self.atom(node.tuple_value), node.index, span=node.span)
        elif isinstance(node, If):
            cond = self.atom(node.cond)
            t_scope, f_scope = self.child_scopes[node]
            new = If(cond, self.block(node.true_branch, t_scope), self.block(node.false_branch, f_scope),
                     span=node.span)
        elif isinstance(node, Match):
            data = self.atom(node.data)
            clauses = tuple(Clause(c.lhs, self.block(c.rhs, arm))
                            for c, arm in zip(node.clauses, self.child_scopes[node]))
            new = Match(data, clauses, node.complete, span=node.span)
        elif isinstance(node, Function):
            (inner,) = self.child_scopes[node]
            new = rebuild_function(node, self.block(node.body, inner))
        elif isinstance(node, RefCreate):
            new = RefCreate(self.atom(node.value), span=node.span)
        elif isinstance(node, RefRead):
            new = RefRead(self.atom(node.ref), span=node.span)
        elif isinstance(node, RefWrite):
            new = RefWrite(self.atom(node.ref), self.atom(node.value), span=node.span)
        elif isinstance(node, Let):
            return self.atom(node)
        else:  # pragma: no cover - every node kind is listed above
            raise TypeError(f"ToANormalForm: unexpected node {type(node).__name__}")
        return copy_type(new, node)


def to_anf(expr: Expr) -> Expr:
    """The A-normal form of an expression (a function keeps its params; its body is converted)."""
    if isinstance(expr, Function):
        if expr.is_primitive:
            return expr
        if expr.attrs.get("Closure") and isinstance(expr.body, Function):  # (a lifted closure keeps its form:
            return rebuild_function(expr, to_anf(expr.body))                 # fn (captured) { fn (...) })
        converter = _ANFConverter()
        root = _Scope(None)
        converter.assign_scopes(expr.body, root)
        return rebuild_function(expr, converter.block(expr.body, root))
    converter = _ANFConverter()
    root = _Scope(None)
    converter.assign_scopes(expr, root)
    return converter.block(expr, root)


class ToANormalForm(Pass):
    name = "ToANormalForm"

    def transform_module(self, mod: IRModule) -> IRModule:
        return mod.with_functions({gv: to_anf(fn) for gv, fn in mod.functions.items()})
