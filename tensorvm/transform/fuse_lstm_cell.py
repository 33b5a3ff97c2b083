"""FuseLSTMCell: an LSTM step's cell math written out as ops becomes one ``nn.lstm_cell``.

Requires: checked types (``InferType``). Primitive functions are left alone.

A model that writes the cell as PyTorch documents it (``benchmarks/models/lstm.py``)::

    %parts = split(%gates, indices_or_sections=4, axis=1);     %gates = add(%x, %r), (B, 4H)
    %c' = add(multiply(sigmoid(%parts.f), %c), multiply(sigmoid(%parts.i), tanh(%parts.g)));
    %h' = multiply(sigmoid(%parts.o), tanh(%c'))

compiles to a ``split`` copy, two gate kernels and, when ``%x`` is a row taken from the input
projection, a copy of the row: per step, four kernels and their dispatch besides the recurrent product.
As ``nn.lstm_cell(%x, %r, %c, gates=...)`` (the gate blocks in the order the ``split`` items were used)
it is one kernel that reads the row and the product in place. Both ``multiply`` and ``add`` may have their
operands either way round; the four gates must be four different items of one 4-way split of the last
axis of a ``(B, 4H)`` sum whose operands are ``(B, 4H)`` (or, with ``B`` 1, ``(4H,)``: a taken row), and
``%c``, ``%c'`` and ``%h'`` all ``(B, H)`` of the same float dtype. Anything else is left as written.
Every use of ``%c'`` and ``%h'`` reads the cell's outputs; the cell computes the same expression in
the same order (``c'`` rounded to the dtype before ``h'`` reads it, as the separate kernels do).
"""

from __future__ import annotations

from ..ir.analysis import post_order
from ..ir.expr import TupleGetItem, is_op_call
from ..ir.types import TensorType, TupleType
from ..op.registry import make_call
from .pass_infra import BodyRewritePass
from .to_anf import TypedMutator, known_type

__all__ = ["FuseLSTMCell"]

_GATE_LETTERS = {"i": "i", "f": "f", "g": "c", "o": "o"}  # PyTorch's names -> nn.lstm_cell's (ONNX's)


def _pairs(expr, name: str):
    """The operands of a binary ``name`` call both ways round (none if ``expr`` is not one)."""
    if is_op_call(expr, name) and len(expr.args) == 2:
        a, b = expr.args
        return ((a, b), (b, a))
    return ()


def _gate(expr, fn: str):
    """``fn(TupleGetItem(split, k))`` -> ``(split, k)``, else None."""
    if is_op_call(expr, fn) and isinstance(expr.args[0], TupleGetItem):
        item = expr.args[0]
        return item.tuple_value, item.index
    return None


def _tensor(expr):
    ty = known_type(expr)
    return ty if isinstance(ty, TensorType) else None


def _match_c(expr):
    """``c' = f c + i g`` -> ``(split, {gate: index}, c)``, else None."""
    for fc, ig in _pairs(expr, "add"):
        for sig_f, c in _pairs(fc, "multiply"):
            f = _gate(sig_f, "sigmoid")
            if f is None:
                continue
            for sig_i, tanh_g in _pairs(ig, "multiply"):
                i, g = _gate(sig_i, "sigmoid"), _gate(tanh_g, "tanh")
                if i is not None and g is not None and f[0] is i[0] is g[0]:
                    return f[0], {"f": f[1], "i": i[1], "g": g[1]}, c
    return None


def _operand(expr, gates: TensorType):
    """``expr`` as a ``(B, 4H)`` operand of the cell: itself, a ``(4H,)`` row expanded when ``B`` is 1."""
    ty = _tensor(expr)
    if ty is None or ty.dtype != gates.dtype:
        return None
    if ty == gates:
        return expr
    if len(ty.shape) == 1 and ty.shape[0] == gates.shape[1] and gates.shape[0] == 1:
        return make_call("expand_dims", expr, axis=0, num_newaxis=1)
    return None


def _match(h_next):
    """``h' = o tanh(c')`` -> ``(c', x, r, c, gate order)``, else None."""
    for sig_o, tanh_c in _pairs(h_next, "multiply"):
        o = _gate(sig_o, "sigmoid")
        if o is None or not is_op_call(tanh_c, "tanh"):
            continue
        c_next = tanh_c.args[0]
        found = _match_c(c_next)
        if found is None or found[0] is not o[0]:
            continue
        split, index, c = found
        index["o"] = o[1]
        if sorted(index.values()) != [0, 1, 2, 3] or not is_op_call(split, "split"):
            continue
        sections, axis = split.attrs.get("indices_or_sections"), split.attrs.get("axis")
        gates = _tensor(split.args[0])
        if sections != 4 or gates is None or len(gates.shape) != 2 or axis not in (1, -1):
            continue
        state = _tensor(h_next)
        if state is None or not gates.dtype.startswith("float") or len(state.shape) != 2:
            continue
        if _tensor(c) != state or _tensor(c_next) != state or gates.shape[0] != state.shape[0]:
            continue
        if not isinstance(gates.shape[1], int) or not isinstance(state.shape[1], int) \
                or gates.shape[1] != 4 * state.shape[1]:
            continue
        x = r = None
        for a, b in _pairs(split.args[0], "add"):
            x, r = _operand(a, gates), _operand(b, gates)
            if x is not None and r is not None:
                break
        if x is None or r is None:
            continue
        order = [""] * 4
        for name, k in index.items():
            order[k] = _GATE_LETTERS[name]
        return c_next, x, r, c, "".join(order)
    return None


class _Fuser(TypedMutator):
    def __init__(self, matches: dict):
        super().__init__()
        self.matches = matches  # id(h') or id(c') -> (match, output index)
        self.cells: dict = {}  # id(h') -> the cell call

    def visit_function(self, fn):
        return fn if fn.is_primitive else super().visit_function(fn)

    def visit(self, expr):
        hit = self.matches.get(id(expr))
        if hit is None:
            return super().visit(expr)
        (h_next, (c_next, x, r, c, order)), index = hit
        cell = self.cells.get(id(h_next))
        if cell is None:
            cell = make_call("nn.lstm_cell", self.visit(x), self.visit(r), self.visit(c), gates=order)
            state = known_type(h_next)
            cell.with_type(TupleType((state, state)))
            self.cells[id(h_next)] = cell
        item = TupleGetItem(cell, index)
        item.with_type(known_type(expr))
        return item


class _Rewriter:
    """Finds the cells of a body (on its original nodes), then rewrites it."""

    def visit(self, body):
        matches = {}
        for node in post_order(body):
            if not is_op_call(node, "multiply"):
                continue
            found = _match(node)
            if found is not None and id(found[0]) not in matches:
                matches[id(node)] = ((node, found), 0)
                matches[id(found[0])] = ((node, found), 1)
        return _Fuser(matches).visit(body) if matches else body


class FuseLSTMCell(BodyRewritePass):
    name = "FuseLSTMCell"
    rewriter = _Rewriter
