"""Making inner loops vectorizable: loop-invariant hoisting and loop unswitching on the loop IR.

Two shapes of generated code keep gcc from vectorizing an elementwise loop:

* a check whose operands do not change along the loop, evaluated on every element: a gather's
  ``index_check(indices[i], n)`` inside the loop over the trailing data axis (a call that may set the
  error flag, so gcc cannot move it). ``hoist`` binds each maximal loop-invariant expression holding a
  call or a select to a variable before the loop (``let``), so the check runs once per row;
* a broadcast read on a dynamic dim, ``x[select(d == 1, 0, j)]``: the address is not affine in ``j``.
  The condition is invariant, so the loop is *unswitched*: ``if (d == 1) {loop with x[0]} else {loop
  with x[j]}``. Both copies have affine (or invariant) addresses. Every combination is generated for up
  to ``MAX_UNSWITCH`` conditions (at most four copies of the loop); with more, one fast copy (every
  condition false: no dim broadcasts) and the general loop. The choice is made per execution of the
  loop (one predictable branch per row), which needs no knowledge of which condition belongs to which
  dim and also covers conditions on hoisted values (``where`` with a row-broadcast mask).

Versioning over conditions rather than strides (``x[j * s]``, ``s = d != 1``) because a run-time stride
still leaves gcc a gather (or its own versioning, only at -O3), while a specialised copy is plain
contiguous code at any optimisation level.

Safety: an expression is hoisted only from positions the loop body evaluates unconditionally (not
from a select's branches, the right side of ``&&``/``||``, an ``if`` or a nested loop), and only if it
reads no buffer the loop writes. When the hoisted values read memory or call a function and the loop
may run zero times, the hoisted code runs under ``if (extent > 0)``, so nothing is read or checked that
the original loop would not have read or checked.
"""

from __future__ import annotations

from ..te.expr import Binary, Call, Const, PrimExpr, Select, Var, const, logical_not, logical_or, var
from ..te.rewrite import rebuild
from ..te.tensor import children, walk
from .loop_ir import (
    VECTORIZED,
    Allocate,
    Buffer,
    BufferLoad,
    CallExtern,
    Dispatch,
    DispatchCase,
    Evaluate,
    For,
    IfThenElse,
    LetStmt,
    Seq,
    Store,
    walk_stmts,
)

__all__ = ["optimize_loops", "MAX_UNSWITCH"]

MAX_UNSWITCH = 2  # conditions unswitched in every combination (2**2 copies of an innermost loop at most)
_MAX_VERSIONED = 8  # beyond this many conditions a loop is left alone


def optimize_loops(stmt):
    """``stmt`` with loop-invariant expressions hoisted and innermost vector loops unswitched."""
    return _Optimizer().stmt(stmt)


class _Optimizer:
    def __init__(self):
        self.count = 0

    def fresh(self, dtype: str) -> Var:
        self.count += 1
        return var(f"inv{self.count}", dtype)

    def stmt(self, s):
        if isinstance(s, Seq):
            return Seq(tuple(self.stmt(x) for x in s.stmts))
        if isinstance(s, LetStmt):
            return LetStmt(s.var, s.value, self.stmt(s.body))
        if isinstance(s, IfThenElse):
            return IfThenElse(s.condition, self.stmt(s.then_case),
                              None if s.else_case is None else self.stmt(s.else_case))
        if isinstance(s, Allocate):
            return Allocate(s.buffer, self.stmt(s.body))
        if isinstance(s, Dispatch):
            return Dispatch(tuple(DispatchCase(c.name, c.condition, self.stmt(c.body)) for c in s.cases),
                            self.stmt(s.default), s.default_name)
        if isinstance(s, For):
            return self.hoist(_with_body(s, self.stmt(s.body)))
        return s

    # ---- hoisting --------------------------------------------------------------------------------

    def hoist(self, loop: For):
        inner = _defined(loop.body) | {loop.loop_var}
        written = _written(loop.body)

        def invariant(e) -> bool:
            return not any((isinstance(n, Var) and n in inner) or (isinstance(n, BufferLoad) and n.buffer in written)
                           for n in walk(e))

        found: list = []

        def visit(e):
            if isinstance(e, (Var, Const)):
                return
            if invariant(e):
                if _worth_hoisting(e) and e not in found:
                    found.append(e)
                return
            if isinstance(e, Select):
                visit(e.cond)  # (the branches are evaluated lazily)
            elif isinstance(e, Binary) and e.op in ("and", "or"):
                visit(e.a)
            else:
                for k in children(e):
                    visit(k)

        for e in _unconditional_exprs(loop.body):
            visit(e)
        if not found:
            return self.unswitch(loop)
        mapping = {e: self.fresh(e.dtype) for e in found}
        result = self.unswitch(_with_body(loop, _map_exprs(loop.body, lambda e: _replace(e, mapping))))
        for e, v in reversed(list(mapping.items())):
            result = LetStmt(v, e, result)
        risky = any(_may_fail(n) for e in found for n in walk(e))
        if risky and not (isinstance(loop.extent, Const) and loop.extent.value > 0):
            result = IfThenElse(loop.extent > 0, result)
        return result

    # ---- unswitching -----------------------------------------------------------------------------

    def unswitch(self, loop: For):
        if loop.kind != VECTORIZED or any(isinstance(x, For) for x in walk_stmts(loop.body)):
            return loop
        inner = _defined(loop.body) | {loop.loop_var}
        conds = _invariant_conditions(loop.body, inner)
        if not conds or len(conds) > _MAX_VERSIONED:
            return loop
        if len(conds) > MAX_UNSWITCH:  # one fast copy (no condition holds) and the general loop
            fast = _with_body(loop, _assume(loop.body, dict.fromkeys(conds, False)))
            none = logical_not(_any(conds))
            return IfThenElse(none, fast, self.renamed(loop))
        return self.split(loop, inner)

    def split(self, loop: For, inner: set):
        conds = _invariant_conditions(loop.body, inner)
        if not conds:
            return loop
        c = conds[0]
        then = self.split(_with_body(loop, _assume(loop.body, {c: True})), inner)
        other = self.split(_with_body(loop, _assume(loop.body, {c: False})), inner)
        return IfThenElse(c, self.renamed(then), other)

    def renamed(self, s):
        """``s`` with fresh variables for its ``let`` bindings (a copy beside the original)."""
        lets = [x.var for x in walk_stmts(s) if isinstance(x, LetStmt)]
        if not lets:
            return s
        mapping = {v: self.fresh(v.dtype) for v in lets}

        def go(x):
            if isinstance(x, LetStmt):
                return LetStmt(mapping[x.var], x.value, go(x.body))
            if isinstance(x, Seq):
                return Seq(tuple(go(y) for y in x.stmts))
            if isinstance(x, For):
                return For(x.loop_var, x.extent, go(x.body), x.kind, x.parallel_if, x.reductions)
            if isinstance(x, IfThenElse):
                return IfThenElse(x.condition, go(x.then_case), None if x.else_case is None else go(x.else_case))
            if isinstance(x, Allocate):
                return Allocate(x.buffer, go(x.body))
            return x

        return _map_exprs(go(s), lambda e: _replace(e, mapping))


def _worth_hoisting(e) -> bool:
    """A check or a choice (gcc cannot move a call that may set the error flag, and a select on an
    index keeps the address from being affine); plain invariant loads and arithmetic gcc moves itself."""
    return any(isinstance(n, (Call, Select)) for n in walk(e))


_DIVISIONS = ("div", "floordiv", "floormod", "truncdiv", "truncmod")


def _may_fail(n) -> bool:
    """A node whose evaluation reads memory or may fail (a check, a division by a run-time value)."""
    return isinstance(n, (BufferLoad, Call)) or (isinstance(n, Binary) and n.op in _DIVISIONS
                                                 and not isinstance(n.b, Const))


def _invariant_conditions(body, inner: set) -> list:
    """The distinct select conditions in ``body`` that read only variables defined outside the loop."""
    conds: list = []
    for e in _all_exprs(body):
        for n in walk(e):
            if isinstance(n, Select) and n.cond not in conds and not isinstance(n.cond, Const) and all(
                    not _may_fail(m) and not (isinstance(m, Var) and m in inner) for m in walk(n.cond)):
                conds.append(n.cond)
    return conds


def _assume(body, known: dict):
    """``body`` with the conditions ``known`` replaced by their values (selects fold away)."""
    mapping = {c: const(value) for c, value in known.items()}
    return _map_exprs(body, lambda e: _replace(e, mapping))


def _any(conds) -> PrimExpr:
    result = conds[0]
    for c in conds[1:]:
        result = logical_or(result, c)
    return result


def _with_body(loop: For, body) -> For:
    return For(loop.loop_var, loop.extent, body, loop.kind, loop.parallel_if, loop.reductions)


def _replace(e, mapping: dict):
    """``e`` with every occurrence of a key of ``mapping`` (outermost first) replaced by its value."""
    memo: dict = {}

    def go(n):
        if n in mapping:
            return mapping[n]
        try:
            return memo[n]
        except KeyError:
            pass
        kids = children(n)
        new = tuple(go(k) for k in kids)
        result = n if all(a is b for a, b in zip(new, kids)) else rebuild(n, new)
        memo[n] = result
        return result

    return go(e)


def _defined(s) -> set:
    """The loop and let variables bound inside ``s``."""
    return {x.loop_var if isinstance(x, For) else x.var for x in walk_stmts(s) if isinstance(x, (For, LetStmt))}


def _written(s) -> set:
    """The buffers ``s`` may write (stores, library calls) or allocates."""
    out = set()
    for x in walk_stmts(s):
        if isinstance(x, Store):
            out.add(x.buffer)
        elif isinstance(x, Allocate):
            out.add(x.buffer)
        elif isinstance(x, CallExtern):
            out.update(a for a in x.args if isinstance(a, Buffer))
    return out


def _unconditional_exprs(s):
    """The expressions every execution of ``s`` evaluates (not under an ``if`` or inside a nested loop;
    a nested loop's extent is evaluated)."""
    if isinstance(s, Seq):
        for x in s.stmts:
            yield from _unconditional_exprs(x)
    elif isinstance(s, LetStmt):
        yield s.value
        yield from _unconditional_exprs(s.body)
    elif isinstance(s, Store):
        yield s.index
        yield s.value
    elif isinstance(s, Evaluate):
        yield s.value
    elif isinstance(s, Allocate):
        yield from _unconditional_exprs(s.body)
    elif isinstance(s, IfThenElse):
        yield s.condition
    elif isinstance(s, For):
        yield s.extent


def _all_exprs(s):
    for x in walk_stmts(s):
        if isinstance(x, For):
            yield x.extent
        elif isinstance(x, LetStmt):
            yield x.value
        elif isinstance(x, Store):
            yield x.index
            yield x.value
        elif isinstance(x, IfThenElse):
            yield x.condition
        elif isinstance(x, Evaluate):
            yield x.value


def _map_exprs(s, fn):
    from .lower import map_stmt  # (lower imports this module)

    return map_stmt(s, lambda e: None if e is None else fn(e), {})

