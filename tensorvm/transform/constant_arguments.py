"""ConstantArguments: a call that passes a constant for a loop-invariant parameter calls a copy of the
function specialized to that constant.

Requires: nothing (types are re-inferred by the passes after it).

A parameter of a global function is *invariant* when every call the function makes to itself passes
the parameter unchanged (a loop's weights: ``@step(t, ..., %w)`` recurses with ``@step(t + 1, ...,
%w)``). Invariant: after the pass, a direct call that passed tensor constants for invariant parameters
calls ``@<name>_const<k>``, a copy of the function without those parameters whose body uses the
constants instead, and whose calls to itself call the copy; calls passing the same constants (one
object, or equal dtype, shape and values) share one copy. The original function is unchanged, so a
caller from outside (``vm.invoke("step", ...)``) still gets its meaning with any argument.

This lets a recursive loop see its weights: ``main`` with bound parameters starts ``@step`` with
constants, and inside the copy ``FoldConstant`` and ``PackWeights`` (a pre-packed product) can use
them; the unpacked weight is then referenced nowhere, so an executable does not keep it twice. The
pass repeats until no call passes a constant for an invariant parameter, so a constant reaches a callee
of a callee. Polymorphic functions are left alone (a constant would fix what a type parameter leaves
open), and at most ``MAX_COPIES`` copies are made per module.
"""

from __future__ import annotations

from ..ir.expr import Call, Constant, Function, GlobalVar
from ..ir.module import IRModule
from ..ir.structural import structural_equal
from ..ir.types import TensorType
from .pass_infra import Pass
from .to_anf import TypedMutator, copy_type, post_order_iter, rebuild_function

__all__ = ["ConstantArguments", "MAX_COPIES"]

MAX_COPIES = 16


def _invariant_positions(gv: GlobalVar, fn: Function) -> set:
    """Positions of ``fn``'s tensor-annotated parameters that every call of ``gv`` in its body passes
    unchanged."""
    positions = {i for i, p in enumerate(fn.params) if isinstance(p.type_annotation, TensorType)}
    for node in post_order_iter(fn.body):
        if isinstance(node, Call) and node.op == gv:
            positions = {i for i in positions if i < len(node.args) and node.args[i] is fn.params[i]}
    return positions


def _call_without(mutator: TypedMutator, call: Call, target: GlobalVar, dropped: set) -> Call:
    """``call`` sent to ``target`` without the arguments at the ``dropped`` positions (the others visited)."""
    args = tuple(mutator.visit(a) for i, a in enumerate(call.args) if i not in dropped)
    return copy_type(Call(target, args, call.attrs, call.type_args, span=call.span), call)


def _same_constant(a: Constant, b: Constant) -> bool:
    return a is b or structural_equal(a, b)


class _Redirect(TypedMutator):
    """Sends direct calls that pass constants for invariant parameters to specialized copies (made on
    first need, in ``copies``: ``(gv, ((position, constant), ...), copy gv)``)."""

    def __init__(self, mod: IRModule, invariant: dict, copies: list, names: set):
        super().__init__()
        self.mod, self.invariant, self.copies, self.names = mod, invariant, copies, names
        self.made: dict = {}  # copy gv -> Function, for the copies made in this round
        self.redirected = False

    def visit_call(self, call: Call):
        positions = self.invariant.get(call.op) if isinstance(call.op, GlobalVar) else None
        bound = tuple((i, call.args[i]) for i in sorted(positions or ())
                      if i < len(call.args) and isinstance(call.args[i], Constant))
        if not bound:
            return super().visit_call(call)
        target = self._copy_for(call.op, bound)
        if target is None:
            return super().visit_call(call)
        self.redirected = True
        return _call_without(self, call, target, {i for i, _ in bound})

    def _copy_for(self, gv: GlobalVar, bound: tuple) -> GlobalVar | None:
        for original, key, copy in self.copies:
            if original == gv and len(key) == len(bound) and all(
                    i == j and _same_constant(a, b) for (i, a), (j, b) in zip(key, bound)):
                return copy
        if len(self.copies) >= MAX_COPIES:
            return None
        k = 0
        while f"{gv.name}_const{k}" in self.names:
            k += 1
        copy = GlobalVar(f"{gv.name}_const{k}")
        self.names.add(copy.name)
        self.copies.append((gv, bound, copy))
        fn = self.mod[gv.name]
        constants = {fn.params[i]: c for i, c in bound}
        self_calls = _SelfCalls(gv, copy, {i for i, _ in bound})
        self_calls.memo.update(constants)
        params = tuple(p for p in fn.params if p not in constants)
        self.made[copy] = Function(params, self_calls.visit(fn.body), fn.ret_type, fn.type_params, fn.attrs,
                                   span=fn.span)
        return copy


class _SelfCalls(TypedMutator):
    """The body of a copy: the bound parameters are constants (seeded in ``memo``) and calls of the
    original go to the copy without those arguments."""

    def __init__(self, original: GlobalVar, copy: GlobalVar, dropped: set):
        super().__init__()
        self.original, self.copy, self.dropped = original, copy, dropped

    def visit_call(self, call: Call):
        if call.op != self.original:
            return super().visit_call(call)
        return _call_without(self, call, self.copy, self.dropped)


class ConstantArguments(Pass):
    name = "ConstantArguments"

    def transform_module(self, mod: IRModule) -> IRModule:
        copies: list = []
        while True:
            invariant = {}
            for gv, fn in mod.functions.items():
                if isinstance(fn, Function) and not fn.is_primitive and not fn.type_params:
                    positions = _invariant_positions(gv, fn)
                    if positions:
                        invariant[gv] = positions
            if not invariant:
                return mod
            redirect = _Redirect(mod, invariant, copies, {gv.name for gv in mod.functions})
            functions = {}
            for gv, fn in mod.functions.items():
                keep = not isinstance(fn, Function) or fn.is_primitive
                functions[gv] = fn if keep else rebuild_function(fn, redirect.visit(fn.body))
            if not redirect.redirected:
                return mod
            functions.update(redirect.made)
            mod = mod.with_functions(functions)
