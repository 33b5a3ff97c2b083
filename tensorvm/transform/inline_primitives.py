"""InlinePrimitives: put let-bound primitive functions back into call position.

Requires: nothing. ``let %p = fn (..., Primitive=1) {...}; %p(%x)`` (which ``ToANormalForm`` may meet
in hand-written or imported code) becomes ``(fn (..., Primitive=1) {...})(%x)``.

After it, a primitive function literal appears only as the callee of a call (or, rarely, as a
value passed elsewhere), never bound to a variable, so ``LambdaLift`` turns every kernel call into
a direct call of a ``@fused_...`` global.
"""

from __future__ import annotations

from ..ir.expr import Function, Let
from .pass_infra import BodyRewritePass
from .to_anf import TypedMutator, rebuilt_let

__all__ = ["InlinePrimitives"]


class _Inliner(TypedMutator):
    def visit_function(self, fn: Function):
        return fn if fn.is_primitive else super().visit_function(fn)

    def visit_let(self, let: Let):
        chain = []
        expr = let
        while isinstance(expr, Let) and expr not in self.memo:
            value = self.visit(expr.value)
            if isinstance(value, Function) and value.is_primitive:
                self.memo[expr.var] = value  # later uses of the var see the function itself
                chain.append((expr, None, None))
            else:
                chain.append((expr, self.visit(expr.var), value))
            expr = expr.body
        result = self.visit(expr)
        for node, var, value in reversed(chain):
            if var is not None:
                result = rebuilt_let(node, var, value, result)
            self.memo[node] = result
        return result


class InlinePrimitives(BodyRewritePass):
    name = "InlinePrimitives"
    rewriter = _Inliner
