"""StackSharedProducts: products of a few rows that read the same constant weight read it once.

Requires: checked types (``InferType``); constants folded and merged (``FoldConstant``,
``EliminateCommonSubexpr``: equal weights are one node). Primitive functions, and functions written with
``let`` (whose evaluation order the rewrite would have to respect), are left alone.

A product of a few rows is bound by reading its weight: a Tree-LSTM node applies ``U_f`` to each child's
state, two ``(1, H) . (H, H)`` products that each read the whole weight, and each pays a kernel call and a
fork-join. After the pass, within one scope (a function body, an ``if`` branch, a ``match`` arm: a product
is never moved into a branch that would not run it), no two ``nn.dense(a_i, W)`` with the same constant
``W``, attributes and dtype, static 2-D inputs of at most ``MAX_ROWS`` rows together, where neither input
depends on the other product and the part of the later one's input not yet evaluated where the first one
is has no effect (it is computed there: ``_moves_an_effect``), remain apart: they became one ``nn.dense(concatenate(a_1, a_2, ...), W)``
whose rows ``split`` hands back to each use: the same products, up to the rounding of a kernel that may
sum a tile of several rows in another order than a one-row kernel.
"""

from __future__ import annotations

from ..ir.expr import Constant, Function, If, Let, Match, Tuple, TupleGetItem, is_op_call
from ..ir.functor import ExprMutator
from ..ir.types import TensorType
from ..op.registry import make_call
from .dead_code import has_effect, is_pure
from .pass_infra import BodyRewritePass
from .to_anf import expr_children, known_type, post_order_iter

__all__ = ["StackSharedProducts", "MAX_ROWS"]

# Rows of one stacked product at most: few enough that the product stays bound by its weight's stream (a
# register tile holds at least 6 rows on every host described), so stacking only removes weight reads.
MAX_ROWS = 16


def _rows(call) -> int | None:
    ty = known_type(call.args[0])
    if not isinstance(ty, TensorType) or ty.ndim != 2 or not all(isinstance(d, int) for d in ty.shape):
        return None
    return ty.shape[0]


def _in_scope(node) -> list:
    """``expr_children`` that are evaluated whenever ``node`` is: an ``if``'s condition and a ``match``'s
    data, not their branches and arms; nothing inside a function."""
    if isinstance(node, If):
        return [node.cond]
    if isinstance(node, Match):
        return [node.data]
    if isinstance(node, Function):
        return []
    return expr_children(node)


def _scope_nodes(root) -> list:
    """The nodes evaluated whenever ``root`` is: reachable without entering a branch, arm or function."""
    return post_order_iter(root, children=_in_scope)


def _scopes(body) -> list:
    """Every scope root of ``body``: itself, and each branch and arm below it (functions apart)."""
    roots = []
    for node in post_order_iter(body):
        if isinstance(node, If):
            roots.extend((node.true_branch, node.false_branch))
        elif isinstance(node, Match):
            roots.extend(c.rhs for c in node.clauses)
    return [body, *roots]


def _moves_an_effect(product, first, order: dict) -> bool:
    """Whether stacking ``product`` with the earlier ``first`` would move an effect: the part of its input
    evaluated after ``first`` is computed where ``first`` was (a shared call evaluated before stays put)."""
    for node in _scope_nodes(product.args[0]):
        if order.get(id(node), -1) > order[id(first)]:
            if has_effect(node) or isinstance(node, If) and not (is_pure(node.true_branch) and
                                                                  is_pure(node.false_branch)):
                return True
    return False


def _groups(body) -> list:
    """Lists of products to stack (each of two or more), scope by scope."""
    taken, groups = set(), []
    for root in _scopes(body):
        candidates = {}
        order = {id(node): i for i, node in enumerate(_scope_nodes(root))}
        for node in _scope_nodes(root):
            if id(node) in taken or not is_op_call(node, "nn.dense") or not isinstance(node.args[1], Constant):
                continue
            rows = _rows(node)
            if rows is None or rows > MAX_ROWS // 2:
                continue
            key = (id(node.args[1]), tuple(sorted(node.attrs.items())), known_type(node.args[0]).dtype,
                   known_type(node.args[0]).shape[1])
            candidates.setdefault(key, []).append(node)
        for products in candidates.values():
            group, rows = [], 0
            for product in products:
                inputs = {id(n) for n in post_order_iter(product.args[0])}
                independent = all(id(other) not in inputs and id(product) not in
                                  {id(n) for n in post_order_iter(other.args[0])} for other in group)
                movable = not group or not _moves_an_effect(product, group[0], order)
                if independent and movable and rows + _rows(product) <= MAX_ROWS:
                    group.append(product)
                    rows += _rows(product)
            if len(group) >= 2:
                groups.append(group)
                taken.update(id(p) for p in group)
    return groups


class _Stacker(ExprMutator):
    def __init__(self, replaced: dict):
        super().__init__()
        self.replaced = replaced  # id(product) -> (group, index)
        self.stacked: dict = {}  # id(group's first product) -> the split rows

    def visit_function(self, fn):
        return fn  # (nested functions: their own body is rewritten as a global or not at all)

    def visit_call(self, call):
        hit = self.replaced.get(id(call))
        if hit is None:
            return super().visit_call(call)
        group, index = hit
        parts = self.stacked.get(id(group[0]))
        if parts is None:
            inputs = [self.visit(p.args[0]) for p in group]
            product = make_call("nn.dense", make_call("concatenate", Tuple(tuple(inputs)), axis=0), group[0].args[1],
                                **dict(group[0].attrs.items()))
            bounds, total = [], 0
            for p in group[:-1]:
                total += _rows(p)
                bounds.append(total)
            parts = make_call("split", product, indices_or_sections=tuple(bounds), axis=0)
            self.stacked[id(group[0])] = parts
        return TupleGetItem(parts, index)


class _Rewriter:
    def visit(self, body):
        if any(isinstance(node, Let) for node in post_order_iter(body)):
            return body
        groups = _groups(body)
        if not groups:
            return body
        replaced = {id(p): (group, i) for group in groups for i, p in enumerate(group)}
        return _Stacker(replaced).visit(body)


class StackSharedProducts(BodyRewritePass):
    name = "StackSharedProducts"
    rewriter = _Rewriter

