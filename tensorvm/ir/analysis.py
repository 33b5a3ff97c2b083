"""Small analyses over expressions: free and bound variables, global references, post-order."""

from __future__ import annotations

from .expr import (
    Expr,
    Function,
    GlobalVar,
    Let,
    Match,
    PatternConstructor,
    PatternTuple,
    PatternVar,
    PatternWildcard,
    Var,
)
from .functor import ExprVisitor

__all__ = ["free_vars", "bound_vars", "all_vars", "called_globals", "post_order", "pattern_vars", "unmatched_cases"]

MAX_UNMATCHED_CASES = 4096  # (pattern spaces kept at once: a match of wide tuples could otherwise explode)


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


def unmatched_cases(match: Match, mod) -> list | None:
    """Patterns (constructors, tuples and wildcards) together covering every value that no clause of ``match``
    matches: ``[]`` when the clauses are exhaustive, None when finding out would keep more than
    ``MAX_UNMATCHED_CASES`` partial cases. ``mod`` gives the constructors of each ADT (its
    ``type_definitions``). Each clause is taken away from what is left: a wildcard meeting a constructor pattern
    splits into every constructor of that type, and a product (a constructor's fields, a tuple) minus another is
    the union, over each field, of that field's difference beside the other fields unchanged."""
    left = [PatternWildcard()]
    for clause in match.clauses:
        remaining = []
        for space in left:
            remaining.extend(_subtract(space, clause.lhs, mod))
            if len(remaining) > MAX_UNMATCHED_CASES:
                return None
        left = remaining
        if not left:
            break
    return left


def _subtract(space, pattern, mod) -> list:
    """The parts of ``space`` (a pattern of constructors, tuples and wildcards) that ``pattern`` does not match."""
    if isinstance(pattern, (PatternWildcard, PatternVar)):
        return []
    if isinstance(space, PatternWildcard):
        if isinstance(pattern, PatternConstructor):
            tdef = mod.type_definitions.get(pattern.constructor.belong_to)
            ctors = tdef.constructors if tdef is not None else (pattern.constructor,)
            split = [PatternConstructor(c, (PatternWildcard(),) * len(c.inputs)) for c in ctors]
        else:
            split = [PatternTuple((PatternWildcard(),) * len(pattern.patterns))]
        return [part for s in split for part in _subtract(s, pattern, mod)]
    same_kind = (isinstance(space, PatternConstructor) and isinstance(pattern, PatternConstructor)
                 and space.constructor.name == pattern.constructor.name
                 and space.constructor.belong_to == pattern.constructor.belong_to) or (
        isinstance(space, PatternTuple) and isinstance(pattern, PatternTuple))
    if not same_kind or len(space.patterns) != len(pattern.patterns):
        return [space]
    left = []
    for i, (field_space, field_pattern) in enumerate(zip(space.patterns, pattern.patterns, strict=True)):
        for part in _subtract(field_space, field_pattern, mod):
            fields = (*space.patterns[:i], part, *space.patterns[i + 1:])
            left.append(PatternConstructor(space.constructor, fields) if isinstance(space, PatternConstructor)
                        else PatternTuple(fields))
    return left
