"""EtaExpand: wrap constructors and operators used as values in functions.

Requires: nothing (run ``InferType`` afterwards; the new parameters are typed by inference).

After it, a ``Constructor`` or an ``Op`` appears only as the callee of a call:
``@map(Some, %l)`` becomes ``@map(fn (%a) { Some(%a) }, %l)`` and ``@map(negative, %l)`` becomes
``@map(fn (%a) { negative(%a) }, %l)``, so the VM only has to know how to call them (a closure is
then an ordinary lifted function). A nullary constructor used as a value (``Nil``) is a value, not
a function, and stays as it is.
"""

from __future__ import annotations

from ..errors import UnsupportedError
from ..ir.expr import Call, Constructor, Expr, Function, Op, Var
from ..op.registry import get_op
from .pass_infra import BodyRewritePass
from .to_anf import TypedMutator

__all__ = ["EtaExpand"]


def _expand(callee: Expr, arity: int) -> Function:
    params = tuple(Var(f"eta{i}") for i in range(arity))
    return Function(params, Call(callee, params))


class _Expander(TypedMutator):
    def visit(self, expr):
        # (not memoized: a constructor or op node is shared by all its uses, which may be at different types,
        # so each use gets a function of its own)
        if isinstance(expr, Constructor):
            return self.visit_constructor(expr)
        if isinstance(expr, Op):
            return self.visit_op(expr)
        return super().visit(expr)

    def visit_call(self, call: Call):
        op = call.op if isinstance(call.op, (Constructor, Op)) else self.visit(call.op)
        args = tuple(self.visit(a) for a in call.args)
        if op is call.op and all(a is b for a, b in zip(args, call.args)):
            return call
        return Call(op, args, call.attrs, call.type_args, span=call.span)

    def visit_function(self, fn: Function):
        return fn if fn.is_primitive else super().visit_function(fn)

    def visit_constructor(self, c: Constructor):
        return _expand(c, len(c.inputs)) if c.inputs else c

    def visit_op(self, op: Op):
        arity = get_op(op).num_inputs
        if arity < 0:
            raise UnsupportedError(f"the variadic op {op.name} cannot be used as a value; wrap it in a function")
        return _expand(op, arity)


class EtaExpand(BodyRewritePass):
    name = "EtaExpand"
    rewriter = _Expander
