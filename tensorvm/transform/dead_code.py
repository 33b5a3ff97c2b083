"""DeadCodeElimination: drop ``let`` bindings whose variable is never used and whose value is pure.

Requires: nothing. Primitive functions are left alone.

After it, every remaining ``let %x = v;`` either has ``%x`` used later or a value that may have an
effect: a call of a global, a closure or an expression (it may run forever, fail, or touch a
reference), a reference operation, or a ``match`` (which may fail). Op calls, constructor calls,
tuples, projections, functions, ``if``s of pure parts and atoms are pure (an op that would fail at
run time on a dead value is not run, as in Relay). Removal is iterated backwards through each let
chain, so a chain of dead bindings disappears in one pass.
"""

from __future__ import annotations

from ..ir.expr import (
    Call,
    Constructor,
    Expr,
    Function,
    Let,
    Match,
    Op,
    RefCreate,
    RefRead,
    RefWrite,
)
from .memory_plan import vars_used
from .pass_infra import BodyRewritePass
from .to_anf import TypedMutator, expr_children, post_order_iter, rebuilt_let

__all__ = ["DeadCodeElimination"]


def has_effect(node: Expr) -> bool:
    """Whether ``node`` itself (its operands apart) may have an effect, or read a reference cell."""
    if isinstance(node, (RefCreate, RefRead, RefWrite, Match)):
        return True
    if isinstance(node, Call) and not isinstance(node.op, (Op, Constructor)):
        return True
    return isinstance(node, Call) and isinstance(node.op, Op) and node.op.name.startswith(("memory.", "vm."))


def is_pure(expr: Expr) -> bool:
    """Whether evaluating ``expr`` can have no effect but its value (function bodies not entered)."""
    def children(node):
        return expr_children(node, enter_functions=False)

    return not any(has_effect(node) for node in post_order_iter(expr, children))


class _Eliminator(TypedMutator):
    def visit_function(self, fn: Function):
        return fn if fn.is_primitive else super().visit_function(fn)

    def visit_let(self, let: Let):
        chain = []
        expr = let
        while isinstance(expr, Let) and expr not in self.memo:
            chain.append(expr)
            expr = expr.body
        result = self.visit(expr)
        live = vars_used(result)
        for node in reversed(chain):
            value = self.visit(node.value)
            if node.var not in live and is_pure(value):
                self.memo[node] = result
                continue
            live |= vars_used(value)
            result = rebuilt_let(node, node.var, value, result)
            self.memo[node] = result
        return result


class DeadCodeElimination(BodyRewritePass):
    name = "DeadCodeElimination"
    rewriter = _Eliminator
