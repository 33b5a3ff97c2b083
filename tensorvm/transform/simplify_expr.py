"""SimplifyExpr: remove operations that do nothing, by their types.

Requires: checked types (``InferType``). Primitive functions are left alone.

After it, none of these remain:

* a shape-only op (``reshape``, ``reshape_like``, ``squeeze``, ``expand_dims``, ``nn.batch_flatten``,
  ``transpose`` with the identity permutation) whose static output type equals its input's;
* ``cast``/``cast_like`` to the input's own dtype and ``copy`` (values are immutable);
* a ``reshape`` of a ``reshape``: the outer one applies directly to the inner one's input when its
  output type is static.

An op whose other arguments (``reshape_like``'s, ``cast_like``'s model) are not pure stays: their effects run.
"""

from __future__ import annotations

from ..ir.attrs import Attrs
from ..ir.expr import Call, Function, Op, is_op_call
from ..ir.types import TensorType
from .dead_code import is_pure
from .pass_infra import BodyRewritePass
from .to_anf import TypedMutator, copy_type, known_type

__all__ = ["SimplifyExpr"]

_SHAPE_ONLY = frozenset({"reshape", "reshape_like", "squeeze", "expand_dims", "nn.batch_flatten"})


def _same_static_type(a, b) -> bool:
    return isinstance(a, TensorType) and isinstance(b, TensorType) and a.is_static and a == b


class _Simplifier(TypedMutator):
    def visit_function(self, fn: Function):
        return fn if fn.is_primitive else super().visit_function(fn)

    def visit_call(self, call: Call):
        new = super().visit_call(call)
        if not isinstance(new.op, Op) or not new.args:
            return new
        name = new.op.name
        data = new.args[0]
        if not all(is_pure(a) for a in new.args[1:]):  # (a *_like argument's effects still run)
            return new
        in_ty, out_ty = known_type(data), known_type(call)
        if name in _SHAPE_ONLY and _same_static_type(in_ty, out_ty):
            return data
        if name == "transpose":
            axes = new.attrs.get("axes")
            if axes is not None and list(axes) == list(range(len(axes))) and _same_static_type(in_ty, out_ty):
                return data
        if name in ("cast", "cast_like", "copy") and isinstance(in_ty, TensorType) and in_ty == out_ty:
            return data
        if name == "reshape" and is_op_call(data, "reshape"):
            if isinstance(out_ty, TensorType) and out_ty.is_static:
                inner = data.args[0]
                if _same_static_type(known_type(inner), out_ty):
                    return inner
                return copy_type(Call(new.op, (inner,), Attrs(newshape=list(out_ty.shape)), span=new.span), call)
        return new


class SimplifyExpr(BodyRewritePass):
    name = "SimplifyExpr"
    rewriter = _Simplifier
