"""The cell math of one recurrent step as one op each: ``nn.lstm_cell`` and ``nn.gru_cell``.

The ONNX importer's LSTM/GRU loops (``frontend/onnx_recurrent.py``) compute a step's pre-activations as
two matrices, the step's row ``x`` of the hoisted input projection and the recurrent product ``r = h R^T``,
both ``(batch, gates * hidden)`` in ONNX's gate order. Written as ``add``, ``split`` and elementwise ops
the rest of the step became a copy of ``x``'s row, a ``split`` into four copies and two gate kernels
(the cell state feeds both the next state and ``h``); as one op it is one kernel that reads ``x`` and
``r`` in place (an injective producer such as ``take`` of the row fuses into it) and writes the new
states. The math runs in float32 for float16 (rounded once, like the NumPy kernels).

* ``nn.lstm_cell(x, r, c)`` -> ``(h', c')``, gates ``i, o, f, g`` (ONNX's ``iofc``; the attribute ``gates``
  names another order, e.g. PyTorch's ``"ifco"``, the order ``FuseLSTMCell`` finds written out)::

      i, o, f = sigmoid(clip(x_k + r_k)),  g = tanh(clip(x_g + r_g))
      c' = f c + i g,  h' = o tanh(c')

* ``nn.gru_cell(x, r, h, rb)`` -> ``h'``, gates ``z, r, n`` (ONNX's ``zrh``, ``linear_before_reset=1``), ``rb``
  the ``(hidden,)`` bias ``Rb_h`` that the reset gate scales with ``r_n``::

      z, s = sigmoid(clip(x_z + r_z)), sigmoid(clip(x_r + r_r)),  n = tanh(clip(x_n + s (r_n + rb)))
      h' = (1 - z) n + z h

``clip`` (attribute, None: none) bounds the pre-activations to ``[-clip, clip]`` as ONNX's ``clip`` does.
Other activations, peepholes, ``input_forget`` and GRU's ``linear_before_reset=0`` stay elementwise ops.
"""

from __future__ import annotations

import numpy as np

from ..errors import ShapeError, TypeInferenceError
from ..ir.types import TensorType, TupleType
from ..te import expr as E
from ..te import intrin as M
from ..te.expr import cast, const
from ..te.tensor import compute
from ._common import expect_tensor
from ._compute import acc_float, require_equal
from .registry import AttrDef, OpPattern
from .shape_logic import traceable
from .tensor import _sigmoid
from .transform import define, is_float_dtype, mul_dims, unify_dim

__all__ = []

_GATES = {"nn.lstm_cell": 4, "nn.gru_cell": 3}


def _clip_bound(value):
    if value is None:
        return None
    value = float(value)
    if not value >= 0:  # (NaN too)
        raise ValueError(f"expected a bound >= 0 or None, got {value}")
    return value


_CLIP = AttrDef("clip", None, _clip_bound, "bound of the pre-activations (None: not clipped)")


def _gate_order(value):
    value = str(value)
    if sorted(value) != sorted("iofc"):
        raise ValueError(f"expected the gates i, o, f, c in some order (ONNX's 'iofc'), got {value!r}")
    return value


_GATE_ORDER = AttrDef("gates", "iofc", _gate_order,
                      "the order of the gate blocks in x and r: i, o, f, c (ONNX's 'iofc'; PyTorch's 'ifco')")


def _lstm_gates(attrs):
    """Gate name -> its block's index in x and r."""
    order = getattr(attrs, "gates", None) or "iofc"
    return {name: order.index(name) for name in "iofc"}


@traceable
def _cell_logic(op, attrs, shapes, err):
    """``x``, ``r``: ``(batch, gates * hidden)``; the state ``(batch, hidden)``; GRU's ``rb`` ``(hidden,)``;
    outputs shaped like the state."""
    x, r, state = shapes[:3]
    for shape, what in ((x, "x"), (r, "r"), (state, "the state")):
        if len(shape) != 2:
            raise err(f"{op}: {what} must be 2-d (batch, units), got rank {len(shape)}")
    gates = mul_dims(state[1], _GATES[op])
    batch = unify_dim(op, x[0], state[0], "the batch dims of x and the state", err)
    batch = unify_dim(op, r[0], batch, "the batch dims of r and the state", err)
    unify_dim(op, x[1], gates, f"x's dim 1 and {_GATES[op]} x the state's dim 1", err)
    unify_dim(op, r[1], gates, f"r's dim 1 and {_GATES[op]} x the state's dim 1", err)
    hidden = state[1]
    for rb in shapes[3:]:
        if len(rb) != 1:
            raise err(f"{op}: rb must be 1-d (hidden,), got rank {len(rb)}")
        hidden = unify_dim(op, rb[0], hidden, "rb's dim 0 and the state's dim 1", err)
    out = (batch, hidden)
    return [out, out] if op == "nn.lstm_cell" else [out]


def _cell_rel(name):
    def rel(types, attrs, consts=None):
        tensors = [expect_tensor(name, t, f"argument {i}") for i, t in enumerate(types)]
        dtypes = {t.dtype for t in tensors}
        if len(dtypes) != 1 or not is_float_dtype(tensors[0].dtype):
            raise TypeInferenceError(f"{name}: x, r, the state (and rb) must have one float dtype, got "
                                     f"{', '.join(t.dtype for t in tensors)}")
        shapes = _cell_logic(name, attrs, [t.shape for t in tensors], TypeInferenceError)
        outs = tuple(TensorType(tuple(s), tensors[0].dtype) for s in shapes)
        return TupleType(outs) if len(outs) > 1 else outs[0]

    return rel


def _np_clip(attrs, v):
    return v if attrs.clip is None else np.clip(v, -attrs.clip, attrs.clip)


def _np_parts(x, r, count):
    acc = acc_float(x.dtype.name)
    x, r = x.astype(acc, copy=False), r.astype(acc, copy=False)
    return np.split(x, count, axis=1), np.split(r, count, axis=1)


def _checked(name, *arrays):
    """The kernel's arrays, after the shape logic's checks (NumPy would broadcast a batch of 1)."""
    _cell_logic(name, None, [a.shape for a in arrays], ShapeError)
    return arrays


def _lstm_kernel(attrs, x, r, c):
    x, r, c = _checked("nn.lstm_cell", x, r, c)
    dtype = x.dtype
    xs, rs = _np_parts(x, r, 4)
    k = _lstm_gates(attrs)
    i, o, f = (_sigmoid(_np_clip(attrs, xs[k[n]] + rs[k[n]])) for n in "iof")
    g = np.tanh(_np_clip(attrs, xs[k["c"]] + rs[k["c"]]))
    c_next = (f * c.astype(g.dtype) + i * g).astype(dtype)  # h reads c' as stored, as the C kernel does
    return (o * np.tanh(c_next.astype(g.dtype))).astype(dtype), c_next


def _gru_kernel(attrs, x, r, h, rb):
    x, r, h, rb = _checked("nn.gru_cell", x, r, h, rb)
    dtype = x.dtype
    xs, rs = _np_parts(x, r, 3)
    z, s = (_sigmoid(_np_clip(attrs, xs[k] + rs[k])) for k in range(2))
    n = np.tanh(_np_clip(attrs, xs[2] + s * (rs[2] + rb.astype(z.dtype))))
    return ((1 - z) * n + z * h.astype(n.dtype)).astype(dtype)


def _cell_compute(name, outputs):
    """The TE compute of a cell. ``outputs(cell, extra)`` builds the outputs with ``cell(fn)``, a tensor
    shaped like the state whose element ``(b, j)`` is ``fn(b, j, pre, state)`` (in the math dtype, stored in
    the data's), ``pre(k, scale=None, bias=None)`` reading gate ``k``'s clipped pre-activation
    ``x + scale * (r + bias)``; ``extra`` are the inputs after the state."""

    def compute_fn(attrs, inputs, out_type):
        x, r, state = inputs[:3]
        dtype, acc = state.dtype, acc_float(state.dtype)
        hidden, count = state.shape[1], _GATES[name]
        requires = []
        for t, what in ((x, "x"), (r, "r")):
            requires += require_equal(name, t.shape[1], hidden * count, f"{what}'s dim 1 and {count} x the hidden dim")
            requires += require_equal(name, t.shape[0], state.shape[0], f"the batch dims of {what} and the state")
        for t in inputs[3:]:
            requires += require_equal(name, t.shape[0], hidden, "rb's dim 0 and the hidden dim")
        built = []

        def clip(v):
            if attrs.clip is None:
                return v
            return E.minimum(E.maximum(v, const(-attrs.clip, acc)), const(attrs.clip, acc))

        def cell(fn):
            def element(b, j):
                def pre(k, scale=None, bias=None):
                    rv = cast(r[b, j + hidden * k], acc)
                    rv = rv if bias is None else rv + bias
                    return clip(cast(x[b, j + hidden * k], acc) + (rv if scale is None else scale * rv))

                return cast(fn(b, j, pre, cast(state[b, j], acc)), dtype)

            built.append(compute(tuple(state.shape), element, f"{name.replace('.', '_')}{len(built)}",
                                 () if built else requires))
            return built[-1]

        return outputs(cell, inputs[3:], attrs)

    return compute_fn


def _lstm_outputs(cell, extra, attrs):
    # h reads c' from its output (a stage of the kernel), so c''s gates are computed once per element.
    k = _lstm_gates(attrs)
    c_next = cell(lambda b, j, pre, c: M.sigmoid(pre(k["f"])) * c + M.sigmoid(pre(k["i"])) * M.tanh(pre(k["c"])))
    h = cell(lambda b, j, pre, c: M.sigmoid(pre(k["o"])) * M.tanh(cast(c_next[b, j], c.dtype)))
    return [h, c_next]


def _gru_outputs(cell, extra, attrs):
    (rb,) = extra

    def h_next(b, j, pre, h):
        z = M.sigmoid(pre(0))
        return (const(1, z.dtype) - z) * M.tanh(pre(2, M.sigmoid(pre(1)), cast(rb[j], h.dtype))) + z * h

    return [cell(h_next)]


define(
    "nn.lstm_cell", 3, _cell_rel("nn.lstm_cell"), _lstm_kernel, OpPattern.INJECTIVE,
    attrs=(_CLIP, _GATE_ORDER),
    shape_logic=_cell_logic, compute=_cell_compute("nn.lstm_cell", _lstm_outputs),
    doc="One LSTM step's cell math: (h', c') from the input projection's row x, the recurrent product r "
        "(both (batch, 4 hidden), gates iofc unless the attribute gates says otherwise) and the cell state c.",
)

define(
    "nn.gru_cell", 4, _cell_rel("nn.gru_cell"), _gru_kernel, OpPattern.INJECTIVE, attrs=(_CLIP,),
    shape_logic=_cell_logic, compute=_cell_compute("nn.gru_cell", _gru_outputs),
    doc="One GRU step's cell math (linear_before_reset=1): h' from the input projection's row x, the "
        "recurrent product r (both (batch, 3 hidden), gates zrh), h and the (hidden,) bias Rb_h.",
)
