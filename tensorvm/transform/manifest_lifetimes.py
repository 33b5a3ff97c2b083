"""ManifestLifetimes: free dynamically sized buffers early with ``memory.kill``.

Requires: the output of ``ManifestAlloc`` (ANF, memory dialect), after ``MemoryPlan``.

After it, ``let %_ = memory.kill(%v);`` follows the last use of every variable ``%v`` that holds a
dynamically sized value (a parameter or let-bound variable whose type has an ``Any``/symbolic dim)
or a dynamically sized storage, so the VM drops the register's reference as soon as the value is
dead. The rules:

* a use inside a nested ``if``/``match`` counts at the binding holding it; the kill comes after that
  binding. When the last use is in the block's final ``if``/``match``, the kill moves into each
  branch: after the last use there, or at the branch's start when the branch does not use it;
* a variable returned by the block (its tail) or used after the block is never killed in it;
* a storage counts as used wherever one of the tensors allocated in it (or a view of one) is used,
  and is killed only when none of those tensors escapes the function's kernel-call protocol (see
  ``MemoryPlan``), so even a VM that frees a storage on ``KillRegister`` stays correct. A tensor
  register may be killed while a tuple or closure still holds the tensor: a kill drops only the
  register's reference.

Static buffers are left to ``MemoryPlan``'s arenas.
"""

from __future__ import annotations

from ..ir.expr import Call, Clause, Constant, Expr, Function, If, Match, Op, Var, is_op_call
from ..ir.module import IRModule
from ..ir.types import TensorType, TupleType
from ..op.memory import UNIT_TYPE
from .memory_plan import UseInfo, vars_used
from .pass_infra import Pass
from .to_anf import build_lets, copy_type, flatten_lets, known_type, rebuild_function, typed_var

__all__ = ["ManifestLifetimes"]

_KILL = Op("memory.kill")


def _is_dynamic_type(ty) -> bool:
    if isinstance(ty, TensorType):
        return not ty.is_static
    if isinstance(ty, TupleType):
        return any(_is_dynamic_type(f) for f in ty.fields)
    return False


def _is_dynamic_storage(value: Expr) -> bool:
    return (is_op_call(value, "memory.alloc_storage")
            and (value.attrs.get("size_from_shape") or not isinstance(value.args[0], Constant)))


def _is_call(value: Expr) -> bool:
    return isinstance(value, Call) and not isinstance(value.op, Op)


def _kill(var: Var) -> tuple:
    return typed_var("kill", UNIT_TYPE), Call(_KILL, (var,)).with_type(UNIT_TYPE)


class _Lifetimes:
    def __init__(self, fn: Function):
        self.uses = UseInfo(fn.body)
        # candidate var -> the vars whose use counts as its use
        self.proxies: dict[Var, frozenset] = {}
        for p in fn.params:
            if _is_dynamic_type(known_type(p)):
                self.proxies[p] = frozenset((p,))
        pending = [fn.body]
        while pending:
            bindings, tail = flatten_lets(pending.pop())
            for var, value in bindings:
                self._consider(var, value)
                if isinstance(value, If):
                    pending.extend((value.true_branch, value.false_branch))
                elif isinstance(value, Match):
                    pending.extend(c.rhs for c in value.clauses)
            if isinstance(tail, If):
                pending.extend((tail.true_branch, tail.false_branch))
            elif isinstance(tail, Match):
                pending.extend(c.rhs for c in tail.clauses)

    def _consider(self, var: Var, value: Expr) -> None:
        if _is_dynamic_storage(value):
            tensors = self.uses.storage_users.get(var, [])
            if var not in self.uses.escapes and all(self.uses.contained(t) for t in tensors):
                views = {v for t in tensors for v in self.uses.views(t)}
                self.proxies[var] = frozenset(views | {var})
        elif _is_dynamic_type(known_type(var)):
            self.proxies[var] = frozenset((var,))

    def block(self, expr: Expr, live_after: frozenset, must_kill: frozenset) -> Expr:
        bindings, tail = flatten_lets(expr)
        used = [vars_used(value) for _, value in bindings]
        tail_used = vars_used(tail)
        defined = [var for var, _ in bindings]
        candidates = [v for v in must_kill if v not in live_after]
        candidates += [v for v in defined if v in self.proxies and v not in live_after]

        kill_after: dict[int, list] = {}
        kill_at_start: list = []
        pass_down: list = []
        def_index = {var: k for k, var in enumerate(defined)}
        last_use: dict[Var, int] = {}
        for k, u in enumerate(used):
            for v in u:
                last_use[v] = k
        for v in candidates:
            proxies = self.proxies.get(v, frozenset((v,)))
            if proxies & tail_used:
                if isinstance(tail, (If, Match)):
                    pass_down.append(v)
                continue  # returned by this block
            last = max((last_use[p] for p in proxies if p in last_use), default=None)
            if last is None:
                last = def_index.get(v)
            if last is None:
                kill_at_start.append(v)
            else:
                kill_after.setdefault(last, []).append(v)

        # Vars live after each binding (for the branches of a bound if/match).
        later: set = set(live_after) | tail_used
        live_after_k: list = [frozenset()] * len(bindings)
        for k in range(len(bindings) - 1, -1, -1):
            if isinstance(bindings[k][1], (If, Match)):
                live_after_k[k] = frozenset(later)
            later |= used[k]

        # A call whose result the block returns is a tail call: the VM reuses the frame (dropping its
        # registers), and a kill after it would make it an ordinary call.
        if bindings and tail is bindings[-1][0] and _is_call(bindings[-1][1]):
            kill_after.pop(len(bindings) - 1, None)

        out = [_kill(v) for v in sorted(kill_at_start, key=lambda v: v.name_hint)]
        for k, (var, value) in enumerate(bindings):
            if isinstance(value, (If, Match)):
                value = self.branches(value, live_after_k[k], frozenset())
            out.append((var, value))
            for v in sorted(kill_after.get(k, ()), key=lambda v: v.name_hint):
                out.append(_kill(v))
        if isinstance(tail, (If, Match)):
            tail = self.branches(tail, live_after, frozenset(pass_down))
        return build_lets(out, tail)

    def branches(self, value: Expr, live_after: frozenset, must_kill: frozenset) -> Expr:
        if isinstance(value, If):
            new = If(value.cond, self.block(value.true_branch, live_after, must_kill),
                     self.block(value.false_branch, live_after, must_kill), span=value.span)
        else:
            clauses = tuple(Clause(c.lhs, self.block(c.rhs, live_after, must_kill)) for c in value.clauses)
            new = Match(value.data, clauses, value.complete, span=value.span)
        return copy_type(new, value)


def manifest_lifetimes(fn: Function) -> Function:
    if fn.is_primitive:
        return fn
    if fn.attrs.get("Closure") and isinstance(fn.body, Function):
        return rebuild_function(fn, manifest_lifetimes(fn.body))
    lifetimes = _Lifetimes(fn)
    if not lifetimes.proxies:
        return fn
    params = frozenset(p for p in fn.params if p in lifetimes.proxies)
    return rebuild_function(fn, lifetimes.block(fn.body, frozenset(), params))


class ManifestLifetimes(Pass):
    name = "ManifestLifetimes"

    def transform_module(self, mod: IRModule) -> IRModule:
        return mod.with_functions({gv: manifest_lifetimes(fn) for gv, fn in mod.functions.items()})
