"""Which functional updates ``ManifestAlloc`` may run in place: a buffer a loop fills step by step.

``scatter_nd(data, indices, updates)`` is a copy of ``data`` with some entries replaced. A recursive
loop that fills a buffer one row per step (ONNX LSTM/GRU/RNN's ``Y``, ``frontend/onnx_recurrent.py``)
would copy the whole buffer every step: quadratic in the number of steps. The update may instead write
into ``data``'s own memory when no one can read ``data``'s old value afterwards and no one else holds
that memory. ``in_place_updates`` proves that for the loop pattern below and returns the proven calls;
ManifestAlloc then passes ``data`` as the kernel's output and binds the result to it (a kernel with
``out == data`` writes only the updated entries: ``codegen/lib/algorithm.c``, ``tv_scatter_nd``).
Every other update keeps its fresh output, so the IR stays functional: results never change afterwards.

The pattern (on the lowered module ManifestAlloc receives: A-normal form, primitives lifted):

* a call ``let %v = @prim(%p, ...)`` where ``@prim``'s body is one ``scatter_nd`` of its parameters
  (``data`` the first) and ``%p`` is parameter ``k`` of the function ``@f`` holding the call;
* ``%v`` is used exactly once in ``@f``: as argument ``k`` of a direct call of ``@f`` itself (the
  loop's next step; ownership passes on);
* ``%p`` is used at most once on any path through ``@f`` (uses in different branches of an
  ``if``/``match`` are on different paths, e.g. ``else { (%h, %p) }`` returning the full buffer), and
  never inside a nested function;
* ``@f`` is used only as the callee of direct calls; each call from ``@f`` passes as argument ``k``
  such a ``%v``, and each call from another function passes a variable bound there to a kernel's
  result (a buffer ManifestAlloc allocates for that call: not a constant, parameter, view, shape or
  tuple) that has no other use in that function.

Then on every path the buffer has one owner at a time: the caller's fresh buffer goes to the first
step, each step updates its parameter (its only use on that path) and hands it to the next. When any
condition fails for a parameter, none of its updates is run in place.
"""

from __future__ import annotations

from collections import Counter

from ..ir.expr import (
    Call,
    Expr,
    Function,
    GlobalVar,
    If,
    Let,
    Match,
    RefCreate,
    RefRead,
    RefWrite,
    Tuple,
    TupleGetItem,
    Var,
    is_op_call,
)
from ..ir.module import IRModule
from ..ir.types import TensorType
from .to_anf import flatten_lets

__all__ = ["in_place_updates", "UPDATE_OPS"]

#: Ops whose kernel, given ``out`` equal to its first input, writes only the updated entries.
UPDATE_OPS = frozenset({"scatter_nd"})


def _children(node) -> list:
    """The sub-expressions of ``node`` (a function's body too: a use there counts)."""
    if isinstance(node, Function):
        return [node.body]
    if isinstance(node, Call):
        return [node.op, *node.args]
    if isinstance(node, Let):
        return [node.value, node.body]
    if isinstance(node, If):
        return [node.cond, node.true_branch, node.false_branch]
    if isinstance(node, Match):
        return [node.data, *[c.rhs for c in node.clauses]]
    if isinstance(node, Tuple):
        return list(node.fields)
    if isinstance(node, TupleGetItem):
        return [node.tuple_value]
    if isinstance(node, RefCreate):
        return [node.value]
    if isinstance(node, RefRead):
        return [node.ref]
    if isinstance(node, RefWrite):
        return [node.ref, node.value]
    return []


def _occurrences(expr: Expr, into_functions: bool = True):
    """Every node of ``expr`` once per occurrence (a variable used twice is yielded twice); nested
    functions' nodes only when ``into_functions``."""
    stack = [expr]
    while stack:
        node = stack.pop()
        yield node
        if into_functions or not isinstance(node, Function):
            stack.extend(_children(node))


def _count_uses(expr: Expr) -> Counter:
    """How often each variable and global occurs in ``expr``."""
    return Counter(node for node in _occurrences(expr) if isinstance(node, (Var, GlobalVar)))


def _path_uses(expr: Expr, var: Var) -> int:
    """The most uses of ``var`` on one path through ``expr`` (the branches of an if/match are separate
    paths); a use inside a nested function counts as two (a closure may run any number of times)."""
    if isinstance(expr, Let):
        bindings, tail = flatten_lets(expr)
        return sum(_path_uses(value, var) for _, value in bindings) + _path_uses(tail, var)
    if isinstance(expr, If):
        return _path_uses(expr.cond, var) + max(_path_uses(expr.true_branch, var),
                                                _path_uses(expr.false_branch, var))
    if isinstance(expr, Match):
        return _path_uses(expr.data, var) + max((_path_uses(c.rhs, var) for c in expr.clauses), default=0)
    if isinstance(expr, Function):
        return 2 * _count_uses(expr.body)[var]
    if expr is var:
        return 1
    return sum(_path_uses(child, var) for child in _children(expr))


def _bindings(expr: Expr):
    """Every ``(var, value)`` let binding of a block, its branches' included (not nested functions')."""
    bindings, tail = flatten_lets(expr)
    for var, value in bindings:
        yield var, value
        yield from _branch_bindings(value)
    yield from _branch_bindings(tail)


def _branch_bindings(expr: Expr):
    if isinstance(expr, If):
        yield from _bindings(expr.true_branch)
        yield from _bindings(expr.false_branch)
    elif isinstance(expr, Match):
        for clause in expr.clauses:
            yield from _bindings(clause.rhs)


def _primitive(mod: IRModule, callee) -> Function | None:
    fn = mod.functions.get(callee) if isinstance(callee, GlobalVar) else None
    return fn if fn is not None and fn.is_primitive else None


def _is_update(mod: IRModule, value: Expr) -> bool:
    """``value`` calls a primitive whose body is one update op of its parameters, data first."""
    fn = _primitive(mod, value.op) if isinstance(value, Call) else None
    body = fn.body if fn is not None else None
    return (is_op_call(body, *UPDATE_OPS)
            and tuple(body.args) == tuple(fn.params))


def _is_fresh_buffer(mod: IRModule, value: Expr) -> bool:
    """``value`` calls a primitive for which ManifestAlloc allocates one new tensor (not a view made by
    a reshape-only primitive, not the VM's ShapeOf, not a tuple)."""
    fn = _primitive(mod, value.op) if isinstance(value, Call) else None
    if fn is None or fn.attrs.get("reshape_only") or not isinstance(fn.ret_type, TensorType):
        return False
    body = fn.body
    return not is_op_call(body, "shape_of")


def _direct_calls(expr: Expr, callee: GlobalVar) -> list:
    """The calls of ``callee`` in ``expr`` outside nested functions (a closure may run any number of
    times, so a call there never counts as one owner's)."""
    return [node for node in _occurrences(expr, into_functions=False)
            if isinstance(node, Call) and isinstance(node.op, GlobalVar) and node.op == callee]


def in_place_updates(mod: IRModule) -> dict:
    """Per function (``GlobalVar``), the let-bound variables (``%v`` above) whose update ManifestAlloc
    may run in place there. (Per function: two functions may share variable objects, e.g. a loop and
    its copy specialized to constant arguments, and the proof holds for one function's call sites.)"""
    functions = {gv: fn for gv, fn in mod.functions.items() if not fn.is_primitive}
    uses = {gv: _count_uses(fn.body) for gv, fn in functions.items()}
    proven = {}
    for gv, fn in functions.items():
        if gv.name == "main":  # (its parameters are the caller's arrays)
            continue
        by_param: dict = {}  # parameter index -> the results of updates of that parameter
        for var, value in _bindings(fn.body):
            if _is_update(mod, value) and value.args[0] in fn.params:
                by_param.setdefault(fn.params.index(value.args[0]), []).append(var)
        for k, results in by_param.items():
            if _owned(mod, gv, fn, k, results, functions, uses):
                proven[gv] = proven.get(gv, frozenset()) | frozenset(results)
    return proven


def _owned(mod: IRModule, gv: GlobalVar, fn: Function, k: int, results: list, functions: dict, uses: dict) -> bool:
    """The conditions of the module docstring for parameter ``k`` of ``@f`` and its updates ``results``."""
    if _path_uses(fn.body, fn.params[k]) > 1:
        return False
    own_calls = _direct_calls(fn.body, gv)
    passed = [call.args[k] if len(call.args) > k else None for call in own_calls]
    if any(arg not in results for arg in passed) or any(uses[gv][v] != 1 or v not in passed for v in results):
        return False
    direct = len(own_calls)
    for other, other_fn in functions.items():
        calls = _direct_calls(other_fn.body, gv) if other != gv else []
        if not calls:
            continue
        direct += len(calls)
        bound = dict(_bindings(other_fn.body))
        for call in calls:
            arg = call.args[k] if len(call.args) > k else None
            if not (isinstance(arg, Var) and arg in bound and _is_fresh_buffer(mod, bound[arg])
                    and uses[other][arg] == 1):
                return False
    return direct == sum(counts[gv] for counts in uses.values())  # @f is never used as a value
