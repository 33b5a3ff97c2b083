"""Small analyses over expressions: free and bound variables, global references, post-order."""

from __future__ import annotations

from .expr import Expr, Function, GlobalVar, Let, Match, PatternConstructor, PatternTuple, PatternVar, Var
from .functor import ExprVisitor

__all__ = ["free_vars", "bound_vars", "all_vars", "called_globals", "post_order", "pattern_vars"]


def pattern_vars(pattern) -> list[Var]:
    if isinstance(pattern, PatternVar):
        return [pattern.var]
    if isinstance(pattern, (PatternConstructor, PatternTuple)):
        return [v for p in pattern.patterns for v in pattern_vars(p)]
    return []


class _VarCollector(ExprVisitor):
    def __init__(self):
        super().__init__()
        self.bound: dict[Var, None] = {}
        self.used: dict[Var, None] = {}

    def visit_var(self, v: Var):
        self.used[v] = None

    def visit_function(self, fn: Function):
        for p in fn.params:
            self.bound[p] = None
        self.visit(fn.body)

    def visit_let(self, let: Let):
        expr = let
        while isinstance(expr, Let):
            self.memo[expr] = None
            self.bound[expr.var] = None
            self.visit(expr.value)
            expr = expr.body
        self.visit(expr)

    def visit_match(self, m: Match):
        self.visit(m.data)
        for clause in m.clauses:
            for v in pattern_vars(clause.lhs):
                self.bound[v] = None
            self.visit(clause.rhs)


def free_vars(expr: Expr) -> list[Var]:
    """Variables used in ``expr`` but bound outside it, in order of first use."""
    c = _VarCollector()
    c.visit(expr)
    return [v for v in c.used if v not in c.bound]


def bound_vars(expr: Expr) -> list[Var]:
    c = _VarCollector()
    c.visit(expr)
    return list(c.bound)


def all_vars(expr: Expr) -> list[Var]:
    c = _VarCollector()
    c.visit(expr)
    return list({**c.bound, **c.used})


class _GlobalCollector(ExprVisitor):
    def __init__(self):
        super().__init__()
        self.found: dict[GlobalVar, None] = {}

    def visit_global_var(self, gv: GlobalVar):
        self.found[gv] = None


def called_globals(expr: Expr) -> list[GlobalVar]:
    """Global variables referenced anywhere in ``expr`` (called or used as values)."""
    c = _GlobalCollector()
    c.visit(expr)
    return list(c.found)


class _PostOrder(ExprVisitor):
    def __init__(self):
        super().__init__()
        self.order: list[Expr] = []

    def visit(self, expr):
        if expr in self.memo:
            return None
        super().visit(expr)
        self.order.append(expr)
        return None


def post_order(expr: Expr) -> list[Expr]:
    """Every sub-expression once, children before parents (let chains are flattened)."""
    p = _PostOrder()
    p.visit(expr)
    return p.order
