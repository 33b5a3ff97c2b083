"""Rewriting te expressions: a memoized post-order ``transform`` and ``substitute`` for variables.

Nodes are rebuilt through the builders, so simplifications apply again once variables are replaced
(``floordiv(i * 4, 4)`` with ``i`` known becomes a constant, ``select(True, a, b)`` becomes ``a``).
"""

from __future__ import annotations

from collections.abc import Callable

from .expr import (
    Binary,
    Call,
    Cast,
    PrimExpr,
    Reduce,
    Select,
    TensorRead,
    Unary,
    Var,
    _binary,
    _unary,
    call,
    cast,
    select,
)
from .tensor import children

__all__ = ["transform", "substitute", "rebuild"]


def rebuild(node: PrimExpr, kids: tuple) -> PrimExpr:
    """``node`` with new children ``kids`` (in ``tensor.children`` order), simplified again."""
    if isinstance(node, Binary):
        return _binary(node.op, kids[0], kids[1])
    if isinstance(node, Unary):
        return _unary(node.op, kids[0])
    if isinstance(node, Cast):
        return cast(kids[0], node.dtype)
    if isinstance(node, Call):
        return call(node.name, *kids)
    if isinstance(node, Select):
        return select(*kids)
    if isinstance(node, TensorRead):
        return TensorRead(node.tensor, tuple(kids), node.dtype)
    if isinstance(node, Reduce):
        n = len(node.sources)
        return Reduce(node.combiner, tuple(kids[:n]), node.axes, kids[n] if len(kids) > n else None,
                      node.value_index, node.dtype, node.acc_dtype)
    rebuild_hook = getattr(node, "rebuild", None)  # loop-IR expressions (BufferLoad) know themselves
    if rebuild_hook is not None:
        return rebuild_hook(kids)
    return node


def transform(expr: PrimExpr, fn: Callable[[PrimExpr], PrimExpr | None], memo: dict | None = None) -> PrimExpr:
    """Rebuild ``expr`` bottom-up; ``fn(node)`` (called on each rebuilt node) may return a replacement."""
    memo = {} if memo is None else memo

    def visit(node):
        try:
            return memo[node]
        except KeyError:
            pass
        kids = children(node)
        new_kids = tuple(visit(k) for k in kids)
        rebuilt = node if all(a is b for a, b in zip(new_kids, kids)) else rebuild(node, new_kids)
        replaced = fn(rebuilt)
        result = rebuilt if replaced is None else replaced
        memo[node] = result
        return result

    return visit(expr)


def substitute(expr: PrimExpr, mapping: dict) -> PrimExpr:
    """Replace variables (keys of ``mapping``, by identity) with expressions."""
    if not mapping:
        return expr
    return transform(expr, lambda node: mapping.get(node) if isinstance(node, Var) else None)
