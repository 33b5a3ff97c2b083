"""LambdaLift: lift every nested function to a global (closure conversion).

Requires: A-normal form is not required, but checked types are (lifted functions get annotated
parameters). Run after ``FuseOps``/``ToANormalForm``.

After it, no function literal remains inside a global:

* a primitive function becomes a global ``@fused_<op>_<op>...`` (``Primitive=1``), shared by all
  structurally identical primitives of the module (same parameter types, ops, attributes and inline
  constants); a call ``(fn (..., Primitive=1) {...})(args)`` becomes ``@fused_...(args)``;
* a function without free variables becomes a global; the let-bound variable naming it is replaced
  by the global, so calls through it become direct calls (``@f(args)``);
* a function with free variables ``%a, %b`` becomes a global with attr ``Closure=1`` of the form
  ``fn (%a, %b) { fn (params) { body } }`` and its use site becomes the closure allocation
  ``@lifted(%a, %b)``. A recursive let-bound function (``let %f = fn (...) { ... %f(...) ... }``)
  refers to itself inside the lifted body through ``let %f = @lifted(%a, %b);`` (or directly through
  the global when nothing is captured).
"""

from __future__ import annotations

from ..errors import TypeInferenceError
from ..ir.analysis import free_vars
from ..ir.attrs import Attrs
from ..ir.expr import Call, Constant, Expr, Function, GlobalVar, Let, Op, Tuple, TupleGetItem, Var
from ..ir.module import IRModule
from ..ir.types import FuncType, TypeVar, nested_types
from ..op.registry import get_op
from .pass_infra import Pass
from .to_anf import TypedMutator, copy_type, known_type, post_order_iter, primitive_children

__all__ = ["LambdaLift"]

_MAX_NAME = 80


def primitive_key(fn: Function) -> tuple:
    """A hashable key equal for structurally identical primitive functions."""
    index: dict[Expr, int] = {p: i for i, p in enumerate(fn.params)}
    keys = []

    def children(expr):
        return primitive_children(expr, with_let_vars=True)

    for node in post_order_iter(fn.body, children):
        if node in index:
            continue
        if isinstance(node, Call) and isinstance(node.op, Op):
            attrs = get_op(node.op).normalize_attrs(node.attrs)
            key = ("call", node.op.name, attrs, tuple(index[a] for a in node.args))
        elif isinstance(node, Call):
            key = ("callexpr", id(node))  # not expected in a primitive: never shared
        elif isinstance(node, Tuple):
            key = ("tuple", tuple(index[f] for f in node.fields))
        elif isinstance(node, TupleGetItem):
            key = ("get", node.index, index[node.tuple_value])
        elif isinstance(node, Constant):
            key = ("const", node.data.dtype.name, node.data.shape, node.data.tobytes())
        elif isinstance(node, Let):
            key = ("let", index[node.var], index[node.value], index[node.body])
        elif isinstance(node, Var):
            key = ("var",)
        else:
            key = ("other", id(node))
        index[node] = len(index)
        keys.append(key)
    param_types = tuple(known_type(p) for p in fn.params)
    ret_type = fn.ret_type or known_type(fn.body)
    return param_types, ret_type, tuple(keys), index[fn.body], fn.attrs


def _primitive_name(fn: Function) -> str:
    names = []

    def children(expr):
        return primitive_children(expr)

    for node in post_order_iter(fn.body, children):
        if isinstance(node, Call) and isinstance(node.op, Op):
            names.append(node.op.name.replace(".", "_"))
    return ("fused_" + "_".join(names))[:_MAX_NAME] if names else "fused"


def _type_vars(types) -> list:
    """The type parameters the types name, in order of appearance."""
    found: list = []
    for ty in types:
        for part in nested_types(ty):
            if isinstance(part, TypeVar) and part not in found:
                found.append(part)
    return found


def _type(expr: Expr):
    ty = known_type(expr)
    if ty is None:
        raise TypeInferenceError(f"LambdaLift needs checked types; {expr!r} has none (run InferType first)")
    return ty


class _Lifter:
    """Module-wide state: the lifted globals and their names."""

    def __init__(self, mod: IRModule):
        self.mod = mod
        self.names = {gv.name for gv in mod.functions}
        self.lifted: dict[GlobalVar, Function] = {}
        self.primitives: dict[tuple, GlobalVar] = {}

    def fresh_global(self, base: str) -> GlobalVar:
        name, n = base, 0
        while name in self.names:
            n += 1
            name = f"{base}_{n}"
        self.names.add(name)
        return GlobalVar(name)

    def lift_primitive(self, fn: Function) -> GlobalVar:
        key = primitive_key(fn)
        gv = self.primitives.get(key)
        if gv is None:
            gv = self.fresh_global(_primitive_name(fn))
            self.primitives[key] = gv
            self.lifted[gv] = fn
        return copy_type(GlobalVar(gv.name), fn)


class _LiftMutator(TypedMutator):
    def __init__(self, lifter: _Lifter, owner: str):
        super().__init__()
        self.lifter, self.owner = lifter, owner

    def visit_call(self, call: Call):
        if isinstance(call.op, Function) and call.op.is_primitive:
            gv = self.lifter.lift_primitive(call.op)
            return Call(gv, tuple(self.visit(a) for a in call.args), call.attrs, call.type_args, span=call.span)
        return super().visit_call(call)

    def visit_function(self, fn: Function):
        if fn.is_primitive:
            return self.lifter.lift_primitive(fn)
        return self.lift_closure(fn, None)

    def visit_let(self, let: Let):
        chain = []
        expr = let
        while isinstance(expr, Let) and expr not in self.memo:
            value = expr.value
            if isinstance(value, Function) and not value.is_primitive:
                use = self.lift_closure(value, expr.var)
                # A function without captures is the global itself: drop the binding.
                chain.append((expr, None if isinstance(use, GlobalVar) else expr.var, use))
            else:
                chain.append((expr, self.visit(expr.var), self.visit(value)))
            expr = expr.body
        result = self.visit(expr)
        for node, var, value in reversed(chain):
            if var is not None:
                result = copy_type(Let(var, value, result, span=node.span), node)
            self.memo[node] = result
        return result

    def lift_closure(self, fn: Function, rec_var: Var | None) -> Expr:
        name_var = rec_var
        free = free_vars(fn)
        if rec_var is not None and rec_var not in free:
            rec_var = None  # bound by a let but not recursive
        captured = [v for v in free if v is not rec_var and not isinstance(self.memo.get(v), GlobalVar)]
        hint = name_var.name_hint if name_var is not None else "lambda"
        gv = self.lifter.fresh_global(f"{self.owner}_{hint}")
        fn_type = _type(fn) if getattr(fn, "_checked_type", None) is not None else None
        if name_var is not None and not captured:
            # Every use of the let-bound name (recursive or later) is the global itself.
            self.memo[name_var] = copy_type(GlobalVar(gv.name), name_var)
        body = self.visit(fn.body)
        # Fresh, annotated binders for the lifted function.
        renaming: dict[Var, Expr] = {}
        params = []
        for p in fn.params:
            ty = p.type_annotation or _type(p)
            new_p = Var(p.name_hint, ty).with_type(ty)
            renaming[p] = new_p
            params.append(new_p)
        captured_params = []
        for v in captured:
            ty = _type(v)
            new_v = Var(v.name_hint, ty).with_type(ty)
            renaming[v] = new_v
            captured_params.append(new_v)
        ret_type = fn.ret_type or (fn_type.ret_type if isinstance(fn_type, FuncType) else None) or _type(fn.body)
        inner_type = FuncType(tuple(p.type_annotation for p in params), ret_type, fn.type_params)
        self_var = None
        if rec_var is not None and captured:
            self_var = Var(rec_var.name_hint).with_type(inner_type)
            renaming[rec_var] = self_var
        body = _substitute(body, renaming)
        if self_var is not None:
            self_call = Call(GlobalVar(gv.name), tuple(captured_params)).with_type(inner_type)
            body = Let(self_var, self_call, body).with_type(ret_type)
        # the enclosing global's type parameters the closure's types name are the lifted global's own
        outer = tuple(t for t in _type_vars([*(p.type_annotation for p in (*captured_params, *params)), ret_type])
                      if t not in fn.type_params)
        if not captured:
            inner_type = FuncType(inner_type.arg_types, ret_type, outer + tuple(fn.type_params))
            inner = Function(tuple(params), body, ret_type, inner_type.type_params, fn.attrs, span=fn.span)
            self.lifter.lifted[gv] = inner.with_type(inner_type)
            return copy_type(GlobalVar(gv.name), fn).with_type(inner_type)
        inner = Function(tuple(params), body, ret_type, fn.type_params, fn.attrs, span=fn.span).with_type(inner_type)
        wrapper_type = FuncType(tuple(p.type_annotation for p in captured_params), inner_type, outer)
        wrapper = Function(tuple(captured_params), inner, inner_type, outer, Attrs({"Closure": 1})).with_type(
            wrapper_type)
        self.lifter.lifted[gv] = wrapper
        return Call(GlobalVar(gv.name).with_type(wrapper_type), tuple(captured)).with_type(inner_type)


class _Substitute(TypedMutator):
    def __init__(self, mapping: dict):
        super().__init__()
        self.memo.update(mapping)

    def visit_function(self, fn: Function):
        return fn if fn.is_primitive else super().visit_function(fn)


def _substitute(expr: Expr, mapping: dict) -> Expr:
    return _Substitute(mapping).visit(expr) if mapping else expr


class LambdaLift(Pass):
    name = "LambdaLift"

    def transform_module(self, mod: IRModule) -> IRModule:
        lifter = _Lifter(mod)
        functions = {}
        for gv, fn in mod.functions.items():
            if fn.is_primitive:
                functions[gv] = fn
                continue
            target = fn.body if fn.attrs.get("Closure") and isinstance(fn.body, Function) else fn
            mutator = _LiftMutator(lifter, gv.name)
            body = mutator.visit(target.body)
            new_target = target if body is target.body else copy_type(
                Function(target.params, body, target.ret_type, target.type_params, target.attrs, span=target.span),
                target)
            if target is not fn:
                new_target = copy_type(Function(fn.params, new_target, fn.ret_type, fn.type_params, fn.attrs,
                                                span=fn.span), fn)
            functions[gv] = new_target
        functions.update(lifter.lifted)
        return mod.with_functions(functions)
