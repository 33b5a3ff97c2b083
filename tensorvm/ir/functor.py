"""Visitors and mutators over expressions.

Both memoize by node identity, so a shared sub-expression (a DAG edge) is visited once and a
mutator keeps it shared. Let chains are walked iteratively, so long programs in A-normal form do
not exhaust Python's stack.
"""

from __future__ import annotations

import sys
import threading

from ..runtime.stack import start_thread
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

__all__ = ["ExprVisitor", "ExprMutator", "ExprFunctor", "call_with_fresh_stack"]

# Deep graph-form programs (thousands of chained calls) recurse once per node. Rather than one huge
# stack, a visit continues in a fresh thread every ``_SEGMENT`` nested visits, so each thread's
# depth stays bounded whatever the depth of the program.
if sys.getrecursionlimit() < 20000:
    sys.setrecursionlimit(20000)
_SEGMENT = 2000
_SEGMENT_STACK_BYTES = 256 << 20
_depth = threading.local()


def call_with_fresh_stack(fn, *args):
    """Run ``fn(*args)`` in a new thread with a large stack and return its result (or raise its error)."""
    result: list = []
    error: list = []

    def run():
        try:
            result.append(fn(*args))
        except BaseException as err:  # noqa: BLE001 - re-raised in the caller's thread
            error.append(err)

    thread = start_thread(run, _SEGMENT_STACK_BYTES, "tensorvm-deep-visit")  # (stack size set under a lock)
    thread.join()
    if error:
        raise error[0]
    return result[0]


class ExprFunctor:
    """Dispatch ``visit(expr)`` to ``visit_<node>`` with a per-instance memo."""

    def __init__(self):
        self.memo: dict[Expr, object] = {}

    def visit(self, expr: Expr):
        try:
            return self.memo[expr]
        except KeyError:
            pass
        depth = getattr(_depth, "value", 0)
        if depth >= _SEGMENT:
            return call_with_fresh_stack(self._visit_in_new_segment, expr)
        _depth.value = depth + 1
        try:
            result = self._dispatch[type(expr)](self, expr)
        finally:
            _depth.value = depth
        self.memo[expr] = result
        return result

    def _visit_in_new_segment(self, expr: Expr):
        _depth.value = 0
        # The base visit, not an override: a subclass's wrapper around visit already ran for this node.
        return ExprFunctor.visit(self, expr)

    _dispatch: dict = {}

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        cls._dispatch = {
            node: getattr(cls, "visit_" + name)
            for node, name in _NODE_NAMES.items()
        }


_NODE_NAMES = {
    Var: "var", GlobalVar: "global_var", Op: "op", Constant: "constant", Call: "call", Tuple: "tuple",
    TupleGetItem: "tuple_getitem", Let: "let", If: "if", Function: "function", Constructor: "constructor",
    Match: "match", RefCreate: "ref_create", RefRead: "ref_read", RefWrite: "ref_write",
}


class ExprVisitor(ExprFunctor):
    """Visits every sub-expression once; override ``visit_*`` and call ``super()`` to keep walking."""

    def visit_var(self, v: Var):
        return None

    def visit_global_var(self, gv: GlobalVar):
        return None

    def visit_op(self, op: Op):
        return None

    def visit_constant(self, c: Constant):
        return None

    def visit_constructor(self, c: Constructor):
        return None

    def visit_call(self, call: Call):
        self.visit(call.op)
        for a in call.args:
            self.visit(a)

    def visit_tuple(self, t: Tuple):
        for f in t.fields:
            self.visit(f)

    def visit_tuple_getitem(self, t: TupleGetItem):
        self.visit(t.tuple_value)

    def visit_let(self, let: Let):
        # Iterative over the chain of lets.
        expr = let
        while isinstance(expr, Let):
            self.memo[expr] = None
            self.visit(expr.var)
            self.visit(expr.value)
            expr = expr.body
        self.visit(expr)

    def visit_if(self, e: If):
        self.visit(e.cond)
        self.visit(e.true_branch)
        self.visit(e.false_branch)

    def visit_function(self, fn: Function):
        for p in fn.params:
            self.visit(p)
        self.visit(fn.body)

    def visit_match(self, m: Match):
        self.visit(m.data)
        for clause in m.clauses:
            self.visit_pattern(clause.lhs)
            self.visit(clause.rhs)

    def visit_pattern(self, p: Pattern):
        if isinstance(p, PatternVar):
            self.visit(p.var)
        elif isinstance(p, (PatternConstructor, PatternTuple)):
            for sub in p.patterns:
                self.visit_pattern(sub)

    def visit_ref_create(self, r: RefCreate):
        self.visit(r.value)

    def visit_ref_read(self, r: RefRead):
        self.visit(r.ref)

    def visit_ref_write(self, r: RefWrite):
        self.visit(r.ref)
        self.visit(r.value)


class ExprMutator(ExprFunctor):
    """Rebuilds an expression bottom-up; returns the same node when nothing below it changed.

    "Unchanged" is ``==``: identity for every node except the name-equal ``Op``/``GlobalVar``/``Constructor``.
    """

    def visit_var(self, v: Var):
        return v

    def visit_global_var(self, gv: GlobalVar):
        return gv

    def visit_op(self, op: Op):
        return op

    def visit_constant(self, c: Constant):
        return c

    def visit_constructor(self, c: Constructor):
        return c

    def visit_call(self, call: Call):
        op = self.visit(call.op)
        args = tuple(self.visit(a) for a in call.args)
        if op == call.op and all(a == b for a, b in zip(args, call.args)):
            return call
        return Call(op, args, call.attrs, call.type_args, span=call.span)

    def visit_tuple(self, t: Tuple):
        fields = tuple(self.visit(f) for f in t.fields)
        if all(a == b for a, b in zip(fields, t.fields)):
            return t
        return Tuple(fields, span=t.span)

    def visit_tuple_getitem(self, t: TupleGetItem):
        value = self.visit(t.tuple_value)
        return t if value == t.tuple_value else TupleGetItem(value, t.index, span=t.span)

    def visit_let(self, let: Let):
        chain = []
        expr = let
        while isinstance(expr, Let) and expr not in self.memo:
            chain.append((expr, self.visit(expr.var), self.visit(expr.value)))
            expr = expr.body
        result = self.visit(expr)
        for node, var, value in reversed(chain):
            if var == node.var and value == node.value and result == node.body:
                result = node
            else:
                result = Let(var, value, result, span=node.span)
            self.memo[node] = result
        return result

    def visit_if(self, e: If):
        cond, t, f = self.visit(e.cond), self.visit(e.true_branch), self.visit(e.false_branch)
        if cond == e.cond and t == e.true_branch and f == e.false_branch:
            return e
        return If(cond, t, f, span=e.span)

    def visit_function(self, fn: Function):
        params = tuple(self.visit(p) for p in fn.params)
        body = self.visit(fn.body)
        if body == fn.body and all(a == b for a, b in zip(params, fn.params)):
            return fn
        return Function(params, body, fn.ret_type, fn.type_params, fn.attrs, span=fn.span)

    def visit_match(self, m: Match):
        data = self.visit(m.data)
        clauses = tuple(Clause(self.visit_pattern(c.lhs), self.visit(c.rhs)) for c in m.clauses)
        if data == m.data and all(a.lhs == b.lhs and a.rhs == b.rhs for a, b in zip(clauses, m.clauses)):
            return m
        return Match(data, clauses, m.complete, span=m.span)

    def visit_pattern(self, p: Pattern) -> Pattern:
        if isinstance(p, PatternVar):
            var = self.visit(p.var)
            return p if var == p.var else PatternVar(var)
        if isinstance(p, PatternConstructor):
            subs = tuple(self.visit_pattern(s) for s in p.patterns)
            return p if all(a == b for a, b in zip(subs, p.patterns)) else PatternConstructor(p.constructor, subs)
        if isinstance(p, PatternTuple):
            subs = tuple(self.visit_pattern(s) for s in p.patterns)
            return p if all(a == b for a, b in zip(subs, p.patterns)) else PatternTuple(subs)
        assert isinstance(p, PatternWildcard)
        return p

    def visit_ref_create(self, r: RefCreate):
        v = self.visit(r.value)
        return r if v == r.value else RefCreate(v, span=r.span)

    def visit_ref_read(self, r: RefRead):
        v = self.visit(r.ref)
        return r if v == r.ref else RefRead(v, span=r.span)

    def visit_ref_write(self, r: RefWrite):
        ref, v = self.visit(r.ref), self.visit(r.value)
        return r if ref == r.ref and v == r.value else RefWrite(ref, v, span=r.span)
