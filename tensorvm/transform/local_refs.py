"""LocalRefsToValues: a reference that never leaves the function that creates it becomes plain values.

Requires: nothing (it runs first in the VM's lowering). A function (global or literal) that creates a
reference is put in A-normal form, so that its let chain is its evaluation order; functions without
``ref(...)`` are left untouched.

After it, every reference whose variable is used only as the reference operand of ``ref_read`` /
``ref_write`` in the function body that created it (not captured by a nested function, not passed,
stored, aliased or returned) is gone: ``ref(v)`` and ``ref_write(%r, v)`` bind the reference's current
value to a variable, ``ref_read(%r)`` reads the latest such variable, and ``ref_write`` itself is
``()``. Where an ``if`` or ``match`` writes references created before it, each branch also returns
their values and the code after it reads them from the branch's result. Every other reference is left
as it was (the VM then refuses it with its error); the interpreter needs no such pass.

The references the VM cannot hold (mutable cells shared between closures or across calls) are the
ones left; imperative code inside one function runs on every executor.
"""

from __future__ import annotations

from ..ir.expr import (
    Expr,
    Function,
    If,
    Let,
    Match,
    RefCreate,
    RefRead,
    RefWrite,
    Tuple,
    TupleGetItem,
    Var,
)
from ..ir.module import IRModule
from .pass_infra import Pass
from .to_anf import build_lets, expr_children, flatten_lets, post_order_iter, rebuild_function, to_anf

__all__ = ["LocalRefsToValues"]


def _creates_ref(fn: Function) -> bool:
    return any(isinstance(node, RefCreate) for node in post_order_iter(fn.body))


def _local_refs(body: Expr) -> set:
    """The variables bound to ``ref(...)`` in ``body`` (nested functions apart) whose every use is the
    reference operand of a ``ref_read`` / ``ref_write`` outside any nested function."""
    created, escaped = set(), set()
    stack, seen = [(body, False)], set()
    while stack:
        node, inside = stack.pop()
        if (node, inside) in seen:
            continue
        seen.add((node, inside))
        if isinstance(node, Let) and isinstance(node.value, RefCreate) and not inside:
            created.add(node.var)
        children = expr_children(node)
        if isinstance(node, (RefRead, RefWrite)) and not inside:
            children = children[1:]  # (the reference operand is the one allowed use)
        elif isinstance(node, Let):
            children = children[1:]  # (the bound var is a binding, not a use)
        elif isinstance(node, Function):
            children = [] if node.is_primitive else [node.body]
        for child in children:
            if isinstance(child, Var):
                escaped.add(child)
            else:
                stack.append((child, inside or isinstance(child, Function)))
    return created - escaped


class _Rewriter:
    """Rewrites one function body in A-normal form; ``refs`` are its local references."""

    def __init__(self, refs: set):
        self.refs = refs
        self.count = 0

    def fresh(self, hint: str) -> Var:
        self.count += 1
        return Var(f"{hint}_v{self.count}")

    def block(self, expr: Expr, env: dict) -> tuple[Expr, dict]:
        """``expr`` (a let chain) rewritten, and the references' values at its end."""
        bindings, tail = flatten_lets(expr)
        if isinstance(tail, (If, Match)):  # (bound, so that what it writes reaches the caller's env)
            result = Var("result")
            bindings.append((result, tail))
            tail = result
        env = dict(env)
        out: list = []
        for var, value in bindings:
            self.binding(var, value, env, out)
        return build_lets(out, tail), env

    def binding(self, var: Var, value: Expr, env: dict, out: list) -> None:
        if isinstance(value, RefCreate) and var in self.refs:
            current = self.fresh(var.name_hint)
            out.append((current, value.value))
            env[var] = current
        elif isinstance(value, RefWrite) and value.ref in self.refs:
            current = self.fresh(value.ref.name_hint)
            out.append((current, value.value))
            env[value.ref] = current
            out.append((var, Tuple(())))
        elif isinstance(value, RefRead) and value.ref in self.refs:
            out.append((var, env[value.ref]))
        elif isinstance(value, (If, Match)):
            self.branches(var, value, env, out)
        elif isinstance(value, Function):  # (A-normal form let-binds every function literal)
            out.append((var, _rewritten(value)))
        else:
            out.append((var, value))

    def branches(self, var: Var, value: Expr, env: dict, out: list) -> None:
        """An ``if`` / ``match``: each branch rewritten; the references created before it that some
        branch writes come out of every branch beside its value."""
        arms = [value.true_branch, value.false_branch] if isinstance(value, If) else [c.rhs for c in value.clauses]
        rewritten = [self.block(arm, env) for arm in arms]
        written = [ref for ref in env if any(arm_env[ref] is not env[ref] for _, arm_env in rewritten)]
        if written:
            arms = []
            for arm, arm_env in rewritten:  # (the tuple at the end of the arm's chain, where its values are bound)
                bindings, tail = flatten_lets(arm)
                arms.append(build_lets(bindings, Tuple((tail, *(arm_env[ref] for ref in written)))))
        else:
            arms = [arm for arm, _ in rewritten]
        if isinstance(value, If):
            new = If(value.cond, arms[0], arms[1], span=value.span)
        else:
            new = Match(value.data, tuple(type(c)(c.lhs, arm) for c, arm in zip(value.clauses, arms)),
                        value.complete, span=value.span)
        if not written:
            out.append((var, new))
            return
        joined = Var("joined")
        out.append((joined, new))
        out.append((var, TupleGetItem(joined, 0)))
        for index, ref in enumerate(written, start=1):
            current = self.fresh(ref.name_hint)
            out.append((current, TupleGetItem(joined, index)))
            env[ref] = current


def _function(fn: Function) -> Function:
    """``fn`` with its local references (and those of the functions it contains) turned into values."""
    return _rewritten(to_anf(fn)) if not fn.is_primitive and _creates_ref(fn) else fn


def _rewritten(fn: Function) -> Function:
    """``_function`` of a function already in A-normal form."""
    if fn.is_primitive or not _creates_ref(fn):
        return fn
    body, _ = _Rewriter(_local_refs(fn.body)).block(fn.body, {})
    return rebuild_function(fn, body)


class LocalRefsToValues(Pass):
    name = "LocalRefsToValues"

    def transform_module(self, mod: IRModule) -> IRModule:
        return mod.with_functions({gv: _function(fn) for gv, fn in mod.functions.items()})
