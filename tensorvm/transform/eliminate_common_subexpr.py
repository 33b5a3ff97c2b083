"""EliminateCommonSubexpr: each repeated op call is computed once.

Requires: nothing (the VM pipeline runs it after constant folding, before fusion). Primitive functions
are left alone.

After it, within a scope no two op calls have the same op, attributes and arguments: a later one is
replaced by the first (by the variable a ``let`` bound the first to, if any; a variable that
becomes an alias of another is read as that one), and so are repeated projections ``%t.i`` of the
same tuple and tuples of the same fields (the operand of a ``concatenate``). Arguments are the same when they are the same node, or
constants equal in dtype, shape and value (up to ``SMALL_CONSTANT`` elements; small constants are
merged too). Scopes: a ``let`` binds its first call for the rest of its chain; the branches of an
``if``, the clauses of a ``match`` and the bodies of functions see what their enclosing scope has
seen, and what they add stays inside them, so a value computed in one branch is never used from
another branch (where its op might fail) or outside. (A function body visited before an equal call
outside it keeps its own call: the order of the walk decides, never correctness.) Only ``Op`` calls are merged (they are pure);
calls of functions, closures, constructors and the memory/VM dialect are left as they are.

ONNX exports repeat small computations per layer (the shape a reshape gets, attention-mask
arithmetic); this leaves one of each.
"""

from __future__ import annotations

from ..ir.expr import Call, Clause, Constant, Function, If, Let, Match, Op, Tuple, TupleGetItem, Var
from .pass_infra import BodyRewritePass
from .to_anf import TypedMutator, expr_children, post_order_iter, rebuild_function, rebuilt_let

__all__ = ["EliminateCommonSubexpr", "SMALL_CONSTANT"]

SMALL_CONSTANT = 1024  # constants with at most this many elements are compared (and merged) by value


class _Scopes:
    """A stack of {key: expression}; lookups see every level, additions go to the innermost."""

    def __init__(self):
        self.levels = [{}]

    def get(self, key):
        for level in reversed(self.levels):
            found = level.get(key)
            if found is not None:
                return found
        return None

    def add(self, key, expr):
        self.levels[-1][key] = expr

    def push(self):
        self.levels.append({})

    def pop(self):
        self.levels.pop()


def _shared_nodes(body) -> set:
    """The ids of the nodes of ``body`` used more than once (functions entered)."""
    seen, shared = set(), set()
    for node in post_order_iter(body):
        for child in expr_children(node):
            (shared if id(child) in seen else seen).add(id(child))
    return shared


class _Eliminator(TypedMutator):
    def __init__(self):
        super().__init__()
        self.scopes = _Scopes()
        self.constants: dict = {}
        self.aliases: dict = {}  # a let variable whose value became another variable -> that variable
        self.shared: set | None = None  # ids of the nodes with more than one use

    # -- keys --
    def key_of(self, expr):
        if isinstance(expr, Constant) and expr.data.size <= SMALL_CONSTANT:
            return ("const", expr.data.dtype.str, expr.data.shape, expr.data.tobytes())
        return id(expr)

    def call_key(self, call: Call):
        if not isinstance(call.op, Op) or call.op.name.startswith(("memory.", "vm.")):
            return None
        try:
            return ("call", call.op.name, call.attrs, tuple(self.key_of(a) for a in call.args),
                    tuple(call.type_args or ()))
        except TypeError:  # an unhashable attribute value: leave the call alone
            return None

    def visit(self, expr):
        if self.shared is None:  # (the body's root: a fresh rewriter per function body)
            self.shared = _shared_nodes(expr)
        return super().visit(expr)

    def first(self, key, expr, original):
        """The expression already seen under ``key`` in scope, else ``expr`` (now the one seen). A node with
        several uses is never read as a ``let`` variable: it is rewritten once (memoized), and its other uses
        may lie outside that variable's scope."""
        found = self.scopes.get(key)
        if found is not None:
            if isinstance(found, Var) and id(original) in self.shared:
                return expr
            return found
        self.scopes.add(key, expr)
        return expr

    # -- nodes --
    def visit_constant(self, c: Constant):
        key = self.key_of(c)
        if isinstance(key, int):
            return c
        return self.constants.setdefault(key, c)

    def visit_call(self, call: Call):
        new = super().visit_call(call)
        key = self.call_key(new) if isinstance(new, Call) else None
        return new if key is None else self.first(key, new, call)

    def visit_tuple(self, t: Tuple):
        new = super().visit_tuple(t)
        if not isinstance(new, Tuple):
            return new
        return self.first(("tuple", tuple(self.key_of(f) for f in new.fields)), new, t)

    def visit_tuple_getitem(self, t: TupleGetItem):
        new = super().visit_tuple_getitem(t)
        if not isinstance(new, TupleGetItem):
            return new
        return self.first(("item", id(new.tuple_value), new.index), new, t)

    def visit_let(self, let: Let):
        # Iterative over the chain; the chain is one scope, bound calls map to their variables.
        self.scopes.push()
        try:
            chain, expr = [], let
            while isinstance(expr, Let) and expr not in self.memo:
                value = self.visit(expr.value)
                key = self.call_key(value) if isinstance(value, Call) else None
                if key is not None and self.scopes.levels[-1].get(key) is value:
                    self.scopes.add(key, expr.var)  # later equal calls read the variable
                elif isinstance(value, Var) and value is not expr.value:
                    self.aliases[expr.var] = value  # (the binding is dead now; DeadCodeElimination drops it)
                chain.append((expr, value))
                expr = expr.body
            result = self.visit(expr)
        finally:
            self.scopes.pop()
        for node, value in reversed(chain):
            result = rebuilt_let(node, node.var, value, result)
            self.memo[node] = result
        return result

    def _scoped(self, expr):
        self.scopes.push()
        try:
            return self.visit(expr)
        finally:
            self.scopes.pop()

    def visit_if(self, e: If):
        cond = self.visit(e.cond)
        then, other = self._scoped(e.true_branch), self._scoped(e.false_branch)
        if cond is e.cond and then is e.true_branch and other is e.false_branch:
            return e
        return If(cond, then, other, span=e.span)

    def visit_match(self, m: Match):
        data = self.visit(m.data)
        clauses = tuple(Clause(c.lhs, self._scoped(c.rhs)) for c in m.clauses)
        if data is m.data and all(a.rhs is b.rhs for a, b in zip(clauses, m.clauses)):
            return m
        return Match(data, clauses, m.complete, span=m.span)

    def visit_function(self, fn: Function):
        if fn.is_primitive:
            return fn
        body = self._scoped(fn.body)
        return fn if body is fn.body else rebuild_function(fn, body)

    def visit_var(self, v: Var):
        return self.aliases.get(v, v)


class EliminateCommonSubexpr(BodyRewritePass):
    name = "EliminateCommonSubexpr"
    rewriter = _Eliminator
