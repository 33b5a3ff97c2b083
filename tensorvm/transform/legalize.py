"""Legalize: calls of ops that declare a ``legalize`` (``OpDef.legalize``) become what it returns.

An op whose work is better split into several kernels says so in its declaration, e.g. ``unique`` ->
``sorted_unique(x, argsort(x))`` (the sort once, then a shape function that counts the groups in one
pass and a kernel that fills them). Types are inferred again afterwards; primitive functions are left
alone.
"""

from __future__ import annotations

from ..ir.expr import Call, Op
from ..op.registry import get_op, is_registered
from .pass_infra import BodyRewritePass
from .to_anf import TypedMutator

__all__ = ["Legalize"]


class _Legalizer(TypedMutator):
    def visit_function(self, fn):
        return fn if fn.is_primitive else super().visit_function(fn)

    def visit_call(self, call: Call):
        new = super().visit_call(call)
        if not isinstance(new.op, Op) or not is_registered(new.op.name):
            return new
        opdef = get_op(new.op.name)
        if opdef.legalize is None:
            return new
        return opdef.legalize(opdef.normalize_attrs(new.attrs), new.args)


class Legalize(BodyRewritePass):
    name = "Legalize"
    rewriter = _Legalizer
