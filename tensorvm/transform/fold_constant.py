"""FoldConstant: evaluate constant sub-expressions at compile time with the ops' reference kernels.

Requires: nothing, though ``shape_of`` of a statically shaped value folds only when types are known
(run after ``InferType``). Primitive functions are left alone.

After it:

* an op call whose arguments are all constants (or tuples of constants) is a ``Constant`` (a tuple
  of them for a tuple result), unless its result would be large: more than 1 MiB and more than its
  inputs (so ``zeros((4096, 4096))`` or a big ``arange`` stays a cheap run-time computation
  instead of bloating the executable); a kernel that fails (e.g. a division by zero) is left for
  run time to report;
* ``shape_of(e)`` with a static type for a pure ``e`` (``dead_code.is_pure``) is its constant shape;
* ``%t.i`` of a tuple literal whose other fields are pure is its field; ``if`` on a constant condition is the chosen branch
  (bound to a variable annotated with the ``if``'s type when that type is closed and not a tensor: a
  branch such as ``None`` does not say its type arguments, which the other branch had fixed);
  ``let %x = <constant or tuple of constants>;`` is inlined into its uses.

The memory dialect (``memory.*``, ``vm.*``) is never folded.
"""

from __future__ import annotations

import numpy as np

from ..ir.expr import Call, Constant, Expr, Function, If, Let, Op, Tuple, TupleGetItem, Var
from ..ir.module import IRModule
from ..ir.types import FuncType, IncompleteType, RefType, TensorType, TupleType, TypeCall, TypeVar
from ..op.registry import get_op
from .dead_code import is_pure
from .pass_infra import Pass
from .to_anf import TypedMutator, copy_type, known_type, rebuild_function, rebuilt_let

__all__ = ["FoldConstant", "fold_constant"]

MAX_FOLDED_BYTES = 1 << 20
_NEVER_FOLD_PREFIXES = ("memory.", "vm.")


def _const(array) -> Constant:
    array = np.asarray(array)
    return Constant(array).with_type(TensorType(array.shape, array.dtype.name))


def _value_of(expr: Expr):
    """The NumPy value of a constant (a tuple of values for a tuple of constants), else None."""
    if isinstance(expr, Constant):
        return expr.data
    if isinstance(expr, Tuple):
        values = [_value_of(f) for f in expr.fields]
        return None if any(v is None for v in values) else tuple(values)
    return None


def _nbytes(value) -> int:
    if isinstance(value, tuple):
        return sum(_nbytes(v) for v in value)
    return int(np.asarray(value).nbytes)


def _to_expr(value, ty) -> Expr | None:
    """A constant (tuple) expression for a kernel result, or None if it disagrees with the type."""
    if isinstance(value, tuple):
        fields = getattr(ty, "fields", None)
        if fields is not None and len(fields) != len(value):
            return None
        parts = [_to_expr(v, fields[i] if fields is not None else None) for i, v in enumerate(value)]
        return None if any(p is None for p in parts) else Tuple(tuple(parts))
    array = np.asarray(value)
    if isinstance(ty, TensorType):
        if ty.dtype != array.dtype.name or ty.ndim != array.ndim or any(
                isinstance(d, int) and d != s for d, s in zip(ty.shape, array.shape)):
            return None
    return _const(array)


class _Folder(TypedMutator):
    def visit_function(self, fn: Function):
        return fn if fn.is_primitive else super().visit_function(fn)

    def visit_call(self, call: Call):
        new = super().visit_call(call)
        if not isinstance(new.op, Op) or new.op.name.startswith(_NEVER_FOLD_PREFIXES):
            return new
        if new.op.name == "shape_of":
            ty = known_type(new.args[0])
            if isinstance(ty, TensorType) and ty.is_static and is_pure(new.args[0]):  # (an effect still runs)
                dtype = get_op("shape_of").normalize_attrs(new.attrs).dtype
                return _const(np.array(ty.shape, dtype=dtype))
        values = [_value_of(a) for a in new.args]
        if any(v is None for v in values):
            return new
        opdef = get_op(new.op)
        try:
            result = opdef.kernel(opdef.normalize_attrs(new.attrs), *values)
        except Exception:  # noqa: BLE001 - the error is reported when the program runs
            return new
        size = _nbytes(result)
        if size > MAX_FOLDED_BYTES and size > sum(_nbytes(v) for v in values):
            return new
        folded = _to_expr(result, known_type(call))
        return new if folded is None else copy_type(folded, call)

    def visit_tuple_getitem(self, t: TupleGetItem):
        value = self.visit(t.tuple_value)
        if (isinstance(value, Tuple) and 0 <= t.index < len(value.fields)
                and all(is_pure(f) for i, f in enumerate(value.fields) if i != t.index)):  # (effects still run)
            return value.fields[t.index]
        return t if value is t.tuple_value else TupleGetItem(value, t.index, span=t.span)

    def visit_if(self, e: If):
        cond = self.visit(e.cond)
        if isinstance(cond, Constant) and cond.data.ndim == 0:
            branch = self.visit(e.true_branch if bool(cond.data) else e.false_branch)
            ty = known_type(e)
            if ty is None or isinstance(ty, TensorType) or not _closed(ty):
                return branch
            var = Var("folded_if", ty).with_type(ty)  # keeps the type arguments the other branch fixed
            return Let(var, branch, var, span=e.span).with_type(ty)
        return super().visit_if(e)

    def visit_let(self, let: Let):
        chain = []
        expr = let
        while isinstance(expr, Let) and expr not in self.memo:
            value = self.visit(expr.value)
            if _value_of(value) is not None:
                self.memo[expr.var] = value  # inline the constant into every use
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


def _closed(ty) -> bool:
    """Whether ``ty`` has no type variable or unknown part (so it can annotate a variable)."""
    if isinstance(ty, (TypeVar, IncompleteType)):
        return False
    if isinstance(ty, TupleType):
        return all(_closed(f) for f in ty.fields)
    if isinstance(ty, TypeCall):
        return all(_closed(a) for a in ty.args)
    if isinstance(ty, FuncType):
        return not ty.type_params and all(_closed(a) for a in ty.arg_types) and _closed(ty.ret_type)
    if isinstance(ty, RefType):
        return _closed(ty.value)
    return True


def fold_constant(expr: Expr) -> Expr:
    if isinstance(expr, Function):
        if expr.is_primitive:
            return expr
        body = _Folder().visit(expr.body)
        return expr if body is expr.body else rebuild_function(expr, body)
    return _Folder().visit(expr)


class FoldConstant(Pass):
    name = "FoldConstant"

    def transform_module(self, mod: IRModule) -> IRModule:
        return mod.with_functions({gv: fold_constant(fn) for gv, fn in mod.functions.items()})
