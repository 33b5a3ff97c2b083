"""Tensors of tensor expressions: placeholders (inputs), computes (an expression per output element)
and reductions over reduce axes.

    n = te.var("n")
    x = te.placeholder((n, 768), "float32", "x")
    k = te.reduce_axis(768, "k")
    row_sum = te.compute((n,), lambda i: te.sum(x[i, k], axis=k), "row_sum")
    y = te.compute((n, 768), lambda i, j: x[i, j] / row_sum[i], "y")

A compute may also state ``requires``: (condition, message) pairs over the dims that must hold at run
time (a broadcast whose dims are only known then, equal reduction lengths...); the generated kernel
checks them on entry and the caller gets a ``ShapeError`` with the message.
"""

from __future__ import annotations

import builtins
import inspect
from dataclasses import dataclass

from ..errors import ShapeError, TypeInferenceError
from .expr import (
    INDEX_DTYPE,
    Binary,
    Call,
    Cast,
    Const,
    IterVar,
    PrimExpr,
    Reduce,
    Select,
    TensorRead,
    Unary,
    as_expr,
    cast,
    const,
    dtype_kind,
    max_value,
    min_value,
    select,
    var,
)

__all__ = [
    "Tensor", "PlaceholderOp", "ComputeOp", "placeholder", "compute", "reduce_axis", "sum", "prod", "max", "min",
    "argmax", "argmin", "walk", "contains_reduce",
]


@dataclass(frozen=True, eq=False)
class PlaceholderOp:
    name: str


@dataclass(frozen=True, eq=False)
class ComputeOp:
    """``bodies[i]`` gives output ``i`` at the point ``axes``; all bodies are reductions or none is."""

    name: str
    axes: tuple
    bodies: tuple
    requires: tuple = ()

    @property
    def is_reduction(self) -> bool:
        return isinstance(self.bodies[0], Reduce)


@dataclass(frozen=True, eq=False)
class Tensor:
    """A tensor of a te graph: output ``value_index`` of ``op``. Indexing it builds a ``TensorRead``."""

    op: object
    value_index: int
    shape: tuple
    dtype: str
    name: str

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def __getitem__(self, indices) -> TensorRead:
        if not isinstance(indices, tuple):
            indices = (indices,)
        if len(indices) != len(self.shape):
            raise TypeInferenceError(f"te: {self.name} has rank {len(self.shape)}, indexed with {len(indices)} "
                                     f"indices")
        return TensorRead(self, tuple(_as_index(i, self.name) for i in indices), self.dtype)

    def __repr__(self):
        return f"Tensor({self.name}, shape={list(self.shape)}, {self.dtype})"


def _as_index(value, name: str) -> PrimExpr:
    expr = as_expr(value, INDEX_DTYPE)
    if dtype_kind(expr.dtype) not in "iu":
        raise TypeInferenceError(f"te: an index of {name} must be an integer, got {expr.dtype}")
    return cast(expr, INDEX_DTYPE)


def _as_shape(shape) -> tuple:
    if isinstance(shape, (int, PrimExpr)):
        shape = (shape,)
    dims = tuple(_as_index(d, "a shape") for d in shape)
    for d in dims:
        if isinstance(d, Const) and d.value < 0:
            raise TypeInferenceError(f"te: a dimension must be >= 0, got {d.value}")
    return dims


def placeholder(shape, dtype: str = "float32", name: str = "placeholder") -> Tensor:
    """An input tensor; dims are ints or ``te.var`` symbols."""
    return Tensor(PlaceholderOp(name), 0, _as_shape(shape), const(0, dtype).dtype, name)


def compute(shape, fcompute, name: str = "compute", requires=()):
    """A tensor whose element at index ``(i, j, ...)`` is ``fcompute(i, j, ...)``.

    ``fcompute`` may return a tuple (several outputs of one shape, as for arg-reductions); the result is
    then a tuple of tensors. ``requires`` lists (condition, message) run-time shape checks.
    """
    shape = _as_shape(shape)
    names = _axis_names(fcompute, len(shape))
    axes = tuple(IterVar(var(n), d, "spatial") for n, d in zip(names, shape))
    result = fcompute(*(a.var for a in axes))
    bodies = tuple(result) if isinstance(result, (tuple, list)) else (result,)
    bodies = tuple(as_expr(b) for b in bodies)
    _check_bodies(name, bodies)
    op = ComputeOp(name, axes, bodies, _checked_requires(requires))
    tensors = tuple(Tensor(op, i, shape, b.dtype, name if len(bodies) == 1 else f"{name}.{i}")
                    for i, b in enumerate(bodies))
    return tensors if isinstance(result, (tuple, list)) else tensors[0]


def _axis_names(fcompute, rank: int) -> list[str]:
    try:
        params = list(inspect.signature(fcompute).parameters.values())
    except (TypeError, ValueError):
        params = []
    if len(params) == rank and all(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) for p in params):
        return [p.name for p in params]
    return [f"i{k}" for k in range(rank)]


def _checked_requires(requires) -> tuple:
    out = []
    for cond, message in requires:
        cond = as_expr(cond)
        if cond.dtype != "bool":
            raise TypeInferenceError(f"te: a requirement must be a bool expression, got {cond.dtype}")
        if isinstance(cond, Const):
            if not cond.value:
                raise ShapeError(message)
            continue
        out.append((cond, message))
    return tuple(out)


def _check_bodies(name: str, bodies: tuple):
    reductions = [isinstance(b, Reduce) for b in bodies]
    if any(reductions) and not all(reductions):
        raise TypeInferenceError(f"te: compute {name} mixes reductions and plain values in its outputs")
    for body in bodies:
        inner = body.sources + ((body.condition,) if body.condition is not None else ()) \
            if isinstance(body, Reduce) else (body,)
        if builtins.any(contains_reduce(e) for e in inner):
            raise TypeInferenceError(
                f"te: compute {name} uses a reduction inside an expression; a reduction must be the whole "
                f"body of its compute (put the rest in a second compute that reads it)")


def walk(expr: PrimExpr):
    """Every node of ``expr`` (pre-order; shared sub-expressions once)."""
    seen, stack = set(), [expr]
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        yield node
        stack.extend(reversed(children(node)))


def children(node) -> tuple:
    if isinstance(node, Binary):
        return (node.a, node.b)
    if isinstance(node, (Unary,)):
        return (node.a,)
    if isinstance(node, Cast):
        return (node.value,)
    if isinstance(node, Call):
        return node.args
    if isinstance(node, Select):
        return (node.cond, node.true_value, node.false_value)
    if isinstance(node, TensorRead):
        return node.indices
    if isinstance(node, Reduce):
        return node.sources + ((node.condition,) if node.condition is not None else ())
    hook = getattr(node, "children", None)  # loop-IR expressions (BufferLoad) list their own
    return hook() if callable(hook) else ()


def contains_reduce(expr: PrimExpr) -> bool:
    return builtins.any(isinstance(n, Reduce) for n in walk(expr))


# ---- reductions -----------------------------------------------------------------------------------


def reduce_axis(extent, name: str = "k") -> IterVar:
    """An axis to reduce over, ``0 <= k < extent``."""
    return IterVar(var(name), _as_index(extent, "a reduce axis"), "reduce")


def _axes(axis) -> tuple:
    axes = tuple(axis) if isinstance(axis, (list, tuple)) else (axis,)
    for a in axes:
        if not isinstance(a, IterVar) or a.kind != "reduce":
            raise TypeInferenceError(f"te: reduce over te.reduce_axis(...) axes, got {a!r}")
    return axes


def _condition(where) -> PrimExpr | None:
    if where is None:
        return None
    cond = as_expr(where)
    if cond.dtype != "bool":
        raise TypeInferenceError(f"te: a reduction's where= must be bool, got {cond.dtype}")
    return None if isinstance(cond, Const) and cond.value else cond


def reduction_identity(combiner: str, dtype: str) -> Const:
    """The value a ``combiner`` reduction starts from (what it gives over no elements)."""
    if combiner == "sum":
        return const(0, dtype)
    if combiner == "prod":
        return const(1, dtype)
    if combiner == "max":
        return const(min_value(dtype), dtype)
    if combiner == "min":
        return const(max_value(dtype), dtype)
    raise TypeInferenceError(f"te: unknown reduction {combiner}")


def _simple_reduce(combiner: str, expr, axis, where, acc_dtype: str = ""):
    """A ``combiner`` reduction of ``expr`` over ``axis``; over no axes, the element itself (where
    ``where`` holds, else the identity): a plain value, not a Reduce, which the lowering needs an axis for."""
    expr, axes, cond = as_expr(expr), _axes(axis), _condition(where)
    if not axes:
        return expr if cond is None else select(cond, expr, reduction_identity(combiner, expr.dtype))
    return Reduce(combiner, (expr,), axes, cond, 0, expr.dtype, acc_dtype or expr.dtype)


def sum(expr, axis, where=None) -> Reduce:  # noqa: A001 - te.sum mirrors TVM's name
    """Sum over ``axis``; float16 accumulates in float32 (like NumPy), integers wrap in their dtype."""
    expr = as_expr(expr)
    if expr.dtype == "bool":
        raise TypeInferenceError("te: sum of bool values; cast them first")
    return _simple_reduce("sum", expr, axis, where, "float32" if expr.dtype == "float16" else "")


def prod(expr, axis, where=None) -> Reduce:
    expr = as_expr(expr)
    if expr.dtype == "bool":
        raise TypeInferenceError("te: prod of bool values; cast them first")
    return _simple_reduce("prod", expr, axis, where)


def max(expr, axis, where=None) -> Reduce:  # noqa: A001
    """Maximum over ``axis`` (NaN propagates); the identity is the dtype's lowest value."""
    return _simple_reduce("max", expr, axis, where)


def min(expr, axis, where=None) -> Reduce:  # noqa: A001
    return _simple_reduce("min", expr, axis, where)


def _arg_reduce(combiner: str, value, axis, index, select_last: bool):
    value = as_expr(value)
    axes = _axes(axis)
    if index is None:  # the row-major position within the reduced axes
        index = const(0)
        for a in axes:
            index = index * a.extent + a.var
    index = cast(as_expr(index), INDEX_DTYPE)
    name = combiner + ("_last" if select_last else "")
    sources = (index, value)
    if not axes:  # (over no axes: the element and its index, plain values as in _simple_reduce)
        return sources
    return tuple(Reduce(name, sources, axes, None, i, s.dtype, s.dtype) for i, s in enumerate(sources))


def argmax(value, axis, index=None, select_last: bool = False):
    """(index, value) of the maximum over ``axis``: a pair of reductions for a two-output compute.

    ``index`` defaults to the row-major position within the reduced axes. Ties go to the first index
    (the last with ``select_last``); a NaN wins like in NumPy.
    """
    return _arg_reduce("argmax", value, axis, index, select_last)


def argmin(value, axis, index=None, select_last: bool = False):
    return _arg_reduce("argmin", value, axis, index, select_last)
