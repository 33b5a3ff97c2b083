"""ONNX ``LSTM``, ``GRU`` and ``RNN`` as IR loops: the input projection once, then a recursive step.

A recurrent layer's cost has two parts: the input projection ``X W^T`` (independent across time
steps) and the recurrent product ``h R^T`` (sequential). Like cuDNN and ONNX Runtime, the converter
computes the first for the whole sequence at once, before the loop, as one ``nn.dense`` of the
``(seq, batch, input)`` sequence (the dense treats all leading dims as rows: one matrix product of
``seq*batch`` rows) with both biases folded in; per direction::

    %proj = add(nn.dense(%X, W[d]), Wb[d] + Rb[d])          // (seq, batch, gates*hidden)
    @lstm(0, seq, %proj, h0, c0, [zeros (seq, batch, hidden)], R[d], ...)

    def @lstm(%t, %length, %proj: (?, B, 4H), %h: (B, H), %c: (B, H), [%acc: (?, B, H)], ...) {
      if (%t < %length) {
        <gates = take(%proj, %t, mode="clip") + nn.dense(%h, R[d]); the cell's elementwise math>;
        @lstm(%t + 1, %length, %proj, %h_next, %c_next, [scatter_nd(%acc, [%t], %h_next)], ...)  // tail call
      } else { (%h, %c, [%acc]) }
    }

Per step the VM runs the recurrent product, one fused kernel for the gates (reading the step's row
of ``%proj``) and the write of ``Y``'s row. With the default activations (LSTM without peepholes and
``input_forget``; GRU with ``linear_before_reset=1``) the cell math is one op, ``nn.lstm_cell`` / ``nn.gru_cell`` (``op/recurrent.py``), into
which the ``take`` of the row fuses: one kernel reading the row and the product in place, where the
elementwise form was a copy of the row (added in the product's epilogue), a ``split`` into four copies and
two gate kernels (``c'`` feeds both states). Other layers keep the elementwise ops below. Two details keep that gate kernel a vector loop (it was
20-40x slower without them): the row is taken with ``mode="clip"`` (``t < length`` there, so the
clip never moves it; a checked index is tested per element in C), and a dynamic batch is one
symbol ``B`` (``SymDim``) in the step's types: with an unrelated ``?`` per operand every read is a
broadcast select. Kernels check on entry that dims named alike agree.

The sequence dim stays dynamic, so one executable serves every length. A weight that is a
constant appears in the step function as a constant; any other value the step reads (weights given
as graph inputs, ``sequence_lens``) is passed along as a parameter.

* **Directions.** ``reverse`` runs the same forward loop over the time-reversed projection and
  reverses its ``Y`` back; ``bidirectional`` runs one loop per direction and stacks the results.
* **sequence_lens.** States stop updating and ``Y`` rows are zero past each batch entry's length
  (a ``where`` on ``t < lens``). A reverse direction reverses each sequence within its own length: a
  ``take`` with the permutation ``t -> lens - 1 - t`` (identity past the length) before the loop,
  and the same permutation (it is its own inverse) on ``Y`` after it.
* **Y.** The loop carries a ``(seq, batch, hidden)`` buffer (zeros, made from the direction's own
  ``proj`` dims so that the two directions' buffers are not merged into one value) and each step
  writes its row ``t`` with ``scatter_nd``, a functional update. The loop owns the buffer (the
  caller's fresh value, handed from step to step), so ManifestAlloc runs that update in place
  (``transform/update_in_place.py``): one row copied per step, where growing ``Y`` by a
  ``concatenate`` per step copied O(T^2) rows (6-8 us of a ~58 us step at T=200, batch 2, hidden
  128, plus a new shape every step). ``Y`` is still built only when the ONNX graph reads that output
  (``BuildContext.outputs_used``); ``Y_h`` / ``Y_c`` are the final states. Running both directions of
  a bidirectional layer in one loop (``nn.batch_matmul`` of the stacked states) was measured slower
  at the sizes of issue 18: the batched product with constant weights is not packed (50 us against
  2 x 6.5 us for the packed ``nn.dense``).
* **GRU.** ``linear_before_reset=0`` needs ``(r * h) R_h^T`` after the reset gate: the loop does two
  products (``h R_zr^T``, then that one); with ``linear_before_reset=1`` it does one, and ``Rb_h``
  stays inside the loop (it is scaled by ``r``).
* Peepholes (``P``), ``clip``, ``input_forget``, ``layout=1`` and every activation of the ONNX spec
  (with ``activation_alpha`` / ``activation_beta``, read like the reference op ``nn.lstm`` reads
  them: consumed in order by the functions that take them) are supported.

**Fallback.** When the number of directions (``W``'s first dim) or ``hidden_size`` is not known at
import time, the layer stays one opaque op (``nn.lstm`` / ``nn.gru`` / ``nn.rnn``: NumPy kernels, and
on target c one call of the C library function ``tv_recurrent``) whose shape function handles any
shape.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import TypeInferenceError, UnsupportedError
from ..ir.expr import Call, Constant, Function, Var
from ..ir.types import Any, SymDim, TensorType, TupleType
from ..op.onnx_ops import activation_parameters
from .onnx_context import DimOf, generalize
from .onnx_elementwise import softplus_1
from .onnx_shape import reversed_within

__all__ = ["RecurrentLayer", "convert_recurrent", "ACTIVATIONS"]

# The activation functions of the ONNX spec (their parameters: op/onnx_ops.py's activation_parameters).
ACTIVATIONS = ("sigmoid", "tanh", "relu", "softsign", "softplus", "affine", "leakyrelu", "thresholdedrelu",
               "scaledtanh", "hardsigmoid", "elu")
_DEFAULT_ACTIVATIONS = {"lstm": ("sigmoid", "tanh", "tanh"), "gru": ("sigmoid", "tanh"), "rnn": ("tanh",)}
_GATES = {"lstm": 4, "gru": 3, "rnn": 1}
# The activations (with ONNX's default alpha, beta) of the cell ops nn.lstm_cell / nn.gru_cell (op/recurrent.py).
_CELL_ACTIVATIONS = (("sigmoid", 1.0, 0.0), ("tanh", 1.0, 0.0), ("tanh", 1.0, 0.0))


@dataclass(frozen=True)
class RecurrentLayer:
    """The attributes of one ONNX recurrent node, checked. ``activations[d]`` lists the direction's
    activation functions as ``(name, alpha, beta)``."""

    kind: str  # "lstm" | "gru" | "rnn"
    hidden_size: int
    num_directions: int
    reverse_only: bool  # direction="reverse"
    layout: int
    clip: float | None
    activations: tuple
    input_forget: bool = False
    linear_before_reset: bool = False

    @property
    def gates(self) -> int:
        return _GATES[self.kind]

    def is_reverse(self, direction: int) -> bool:
        return self.reverse_only or direction == 1


def layer_activations(kind: str, names, alphas, betas, num_directions: int) -> tuple:
    """Per direction, ``(name, alpha, beta)`` of each activation: the reference op's reading (a list of
    one direction's functions, their parameters included, serves both directions; alpha/beta are consumed
    in order by the functions that take them)."""
    per_direction = len(_DEFAULT_ACTIVATIONS[kind])
    names = [str(n).lower() for n in names] or list(_DEFAULT_ACTIVATIONS[kind]) * num_directions
    shared = len(names) == per_direction and num_directions == 2
    if not shared and len(names) != per_direction * num_directions:
        counts = f"{per_direction}" + (f" or {2 * per_direction}" if num_directions == 2 else "")
        raise TypeInferenceError(f"{kind.upper()} with {num_directions} direction(s) takes {counts} activations, "
                                 f"got {len(names)}: {names}")
    for name in names:
        if name not in ACTIVATIONS:
            raise UnsupportedError(f"{kind.upper()}: unknown activation {name!r}; supported: "
                                   f"{', '.join(sorted(ACTIVATIONS))}")
    out = activation_parameters(names, alphas or (), betas or ())
    if shared:
        out = out * 2
    return tuple(tuple(out[d * per_direction:(d + 1) * per_direction]) for d in range(num_directions))


# ---- building blocks ---------------------------------------------------------------------------------


def _scalar(ctx, value, dtype):
    return ctx.constant(np.array(value, dtype=dtype))


def _activation(ctx, spec, x):
    name, alpha, beta = spec
    dtype = ctx.dtype(x)

    def s(v):
        return _scalar(ctx, v, dtype)

    if name == "sigmoid":
        return ctx.call("sigmoid", x)
    if name == "tanh":
        return ctx.call("tanh", x)
    if name == "relu":
        return ctx.call("nn.relu", x)
    if name == "affine":
        return ctx.call("add", ctx.call("multiply", x, s(alpha)), s(beta))
    if name == "leakyrelu":
        return ctx.call("where", ctx.call("greater_equal", x, s(0)), x, ctx.call("multiply", x, s(alpha)))
    if name == "thresholdedrelu":
        return ctx.call("where", ctx.call("greater", x, s(alpha)), x, s(0))
    if name == "scaledtanh":
        return ctx.call("multiply", s(alpha), ctx.call("tanh", ctx.call("multiply", x, s(beta))))
    if name == "hardsigmoid":
        return ctx.call("clip", ctx.call("add", ctx.call("multiply", x, s(alpha)), s(beta)), a_min=0.0, a_max=1.0)
    if name == "elu":
        negative = ctx.call("multiply", s(alpha), ctx.call("subtract", ctx.call("exp", x), s(1)))
        return ctx.call("where", ctx.call("greater_equal", x, s(0)), x, negative)
    if name == "softsign":
        return ctx.call("divide", x, ctx.call("add", s(1), ctx.call("abs", x)))
    if name == "softplus":
        return softplus_1(ctx, x)  # (the Softplus op's form, whose exp never overflows)
    raise UnsupportedError(f"unknown activation {name!r}")  # layer_activations checked the names


def _clip(ctx, layer, x):
    if layer.clip is None:
        return x
    return ctx.call("clip", x, a_min=-float(layer.clip), a_max=float(layer.clip))


def _parts(ctx, x, count, axis=-1):
    """``x`` split into ``count`` equal parts along ``axis`` (folded when ``x`` is constant)."""
    if count == 1:
        return [x]
    pieces = ctx.call("split", x, indices_or_sections=count, axis=axis % ctx.ndim(x))
    return [ctx.get_item(pieces, i) for i in range(count)]


def _take(ctx, x, index):
    return ctx.call("take", x, ctx.constant(np.array(index, np.int64)), axis=0)


def _add(ctx, x, y):
    return x if y is None else ctx.call("add", x, y)


# ---- the per-step cell math ----------------------------------------------------------------------------


def _lstm_step(ctx, layer, acts, x_t, states, weights):
    h, c = states
    f_act, g_act, h_act = acts
    recurrent = ctx.call("nn.dense", h, weights["R"])
    if acts == _CELL_ACTIVATIONS and weights.get("P") is None and not layer.input_forget:
        cell = ctx.call("nn.lstm_cell", x_t, recurrent, c, clip=layer.clip)
        return [ctx.get_item(cell, 0), ctx.get_item(cell, 1)]
    gates = ctx.call("add", x_t, recurrent)
    i, o, f, cell = _parts(ctx, gates, 4)
    peep = weights.get("P")
    if peep is not None:
        p_i, p_o, p_f = _parts(ctx, peep, 3)
        i = ctx.call("add", i, ctx.call("multiply", p_i, c))
        f = ctx.call("add", f, ctx.call("multiply", p_f, c))
    i = _activation(ctx, f_act, _clip(ctx, layer, i))
    if layer.input_forget:  # coupled gates, as the reference op does: f = 1 - i
        f = ctx.call("subtract", _scalar(ctx, 1, ctx.dtype(i)), i)
    else:
        f = _activation(ctx, f_act, _clip(ctx, layer, f))
    cell = _activation(ctx, g_act, _clip(ctx, layer, cell))
    c_next = ctx.call("add", ctx.call("multiply", f, c), ctx.call("multiply", i, cell))
    if peep is not None:
        o = ctx.call("add", o, ctx.call("multiply", p_o, c_next))
    o = _activation(ctx, f_act, _clip(ctx, layer, o))
    return [ctx.call("multiply", o, _activation(ctx, h_act, c_next)), c_next]


def _gru_step(ctx, layer, acts, x_t, states, weights):
    (h,) = states
    f_act, g_act = acts
    if layer.linear_before_reset and acts == _CELL_ACTIVATIONS[:2]:
        rb = weights.get("Rb_h")
        if rb is None:
            rb = ctx.constant(np.zeros(layer.hidden_size, ctx.dtype(h)))
        return [ctx.call("nn.gru_cell", x_t, ctx.call("nn.dense", h, weights["R"]), h, rb, clip=layer.clip)]
    x_z, x_r, x_h = _parts(ctx, x_t, 3)
    if layer.linear_before_reset:
        r_z, r_r, r_h = _parts(ctx, ctx.call("nn.dense", h, weights["R"]), 3)
    else:
        r_z, r_r = _parts(ctx, ctx.call("nn.dense", h, weights["R_zr"]), 2)
    z = _activation(ctx, f_act, _clip(ctx, layer, ctx.call("add", x_z, r_z)))
    r = _activation(ctx, f_act, _clip(ctx, layer, ctx.call("add", x_r, r_r)))
    if layer.linear_before_reset:
        recurrent = ctx.call("multiply", r, _add(ctx, r_h, weights.get("Rb_h")))
    else:
        recurrent = ctx.call("nn.dense", ctx.call("multiply", r, h), weights["R_h"])
    candidate = _activation(ctx, g_act, _clip(ctx, layer, ctx.call("add", x_h, recurrent)))
    one = _scalar(ctx, 1, ctx.dtype(z))
    return [ctx.call("add", ctx.call("multiply", ctx.call("subtract", one, z), candidate), ctx.call("multiply", z, h))]


def _rnn_step(ctx, layer, acts, x_t, states, weights):
    (h,) = states
    pre = ctx.call("add", x_t, ctx.call("nn.dense", h, weights["R"]))
    return [_activation(ctx, acts[0], _clip(ctx, layer, pre))]


_STEPS = {"lstm": _lstm_step, "gru": _gru_step, "rnn": _rnn_step}


# ---- the loop ------------------------------------------------------------------------------------------


def _build_loop(ctx, name, layer, acts, proj, states0, state_type, weights, lens, y0):
    """Add the recursive step function; return (final states, Y of shape (seq, batch, hidden) or None).
    ``y0`` is a fresh ``(seq, batch, hidden)`` buffer whose every row the loop writes, or None when
    ``Y`` is not built.

    A dynamic batch dim of ``state_type`` is named in the step's types by one symbol, so that
    its kernels know their operands' batch dims are equal (with unrelated ``?`` dims each operand is
    read through a broadcast select, which kept the fused gate kernel from vectorizing: 20x slower
    measured). Kernels check on entry that dims named alike agree, so a malformed ``initial_h`` is
    still a clear error."""
    want_y = y0 is not None
    importer = ctx.importer
    gv = importer.fresh_global(name)
    scalar_i64 = TensorType((), "int64")
    t = Var("t", scalar_i64)
    length = Var("length", scalar_i64)
    proj_type = generalize(ctx.type_of(proj))
    if not isinstance(state_type.shape[0], int):
        batch = SymDim(f"{gv.name}_batch")
        state_type = TensorType((batch,) + tuple(state_type.shape[1:]), state_type.dtype)
        proj_type = TensorType((Any(), batch) + tuple(proj_type.shape[2:]), proj_type.dtype)
    proj_param = Var("proj", proj_type)
    states = [Var(n, state_type) for n in ("h", "c")[:len(states0)]]
    acc_type = TensorType((Any(),) + tuple(state_type.shape), state_type.dtype)
    acc = Var("acc", acc_type) if want_y else None
    # Constants are used in place; other values the step reads come in as parameters.
    inner, passed, outer = {}, [], []
    for key, value in list(weights.items()) + [("lens", lens)]:
        if value is None:
            continue
        if isinstance(value, Constant):
            inner[key] = value
        else:
            param = Var(key, generalize(ctx.type_of(value)))
            inner[key] = param
            passed.append(param)
            outer.append(value)

    ret_type = TupleType((state_type,) * len(states) + ((acc_type,) if want_y else ()))
    # t < length here, so "clip" never moves the index; unlike "fast" (an index check per element in C,
    # which kept the fused gate kernel from vectorizing: 14x slower) it is loop-invariant arithmetic.
    x_t = ctx.call("take", proj_param, t, axis=0, mode="clip")
    new_states = _STEPS[layer.kind](ctx, layer, acts, x_t, states, inner)
    piece = new_states[0]
    if lens is not None:  # past a batch entry's length its states stay and its Y rows are zero
        active = ctx.call("expand_dims", ctx.call("less", t, inner["lens"]), axis=1)
        new_states = [ctx.call("where", active, n, s) for n, s in zip(new_states, states, strict=True)]
        piece = ctx.call("where", active, new_states[0], _scalar(ctx, 0, state_type.dtype))
    carried = list(new_states)
    if want_y:  # row t of Y written by a functional update that runs in place (see the module docstring)
        index = ctx.call("expand_dims", t, axis=0)
        carried.append(ctx.call("scatter_nd", acc, index, piece))
    next_t = ctx.call("add", t, ctx.constant(np.array(1, np.int64)))
    recurse = Call(gv, (next_t, length, proj_param) + tuple(carried) + tuple(passed))
    recurse.with_type(ret_type)
    done = ctx.tuple(list(states) + ([acc] if want_y else []))
    body = ctx.if_(ctx.call("less", t, length), recurse, done)
    params = (t, length, proj_param) + tuple(states) + ((acc,) if want_y else ()) + tuple(passed)
    importer.globals[gv] = Function(params, body, ret_type)

    start = (ctx.constant(np.array(0, np.int64)), ctx.dim_value(proj, 0), proj) + tuple(states0)
    if want_y:
        start += (y0,)
    call = Call(gv, start + tuple(outer))
    call.with_type(ret_type)
    finals = [ctx.get_item(call, k) for k in range(len(states))]
    return finals, (ctx.get_item(call, len(states)) if want_y else None)


# ---- the layer -----------------------------------------------------------------------------------------


def _rows(ctx, x, start, stop):
    return ctx.call("strided_slice", x, begin=[start], end=[stop], axes=[0])


def _reversal_index(ctx, x, lens):
    """``(seq, batch)`` flat row indices into ``(seq*batch, ...)`` rows: row ``t`` of batch entry ``b`` is
    ``lens[b] - 1 - t`` while ``t < lens[b]``, else ``t`` (reversal within each sequence's length).
    A length above ``seq`` counts as ``seq`` (as it does for the forward direction's mask)."""
    seq = ctx.dim_value(x, 0)
    steps = ctx.call("expand_dims", ctx.indices(seq), axis=1)
    index = reversed_within(ctx, steps, ctx.call("expand_dims", ctx.call("minimum", lens, seq), axis=0))
    batch = ctx.dim_value(x, 1)
    return ctx.call("add", ctx.call("multiply", index, batch), ctx.indices(batch))


def _reverse_time(ctx, x, flat_index):
    """``x`` (seq, batch, n) reversed in time: whole sequences, or within each length (``flat_index``)."""
    if flat_index is None:
        return ctx.call("reverse", x, axis=0)
    rows = ctx.call("reshape", x, newshape=(-1, ctx.shape(x)[-1]))
    return ctx.call("take", rows, flat_index, axis=0)


def _zeros(ctx, x, lead, hidden, dtype):
    """Zeros of shape ``(*lead, batch, hidden)``, ``batch`` being ``x``'s dim 1."""
    batch = ctx.shape(x)[1]
    if isinstance(batch, int):
        return ctx.constant(np.zeros(tuple(lead) + (batch, hidden), dtype))
    shape = ctx.shape_vector(list(lead) + [DimOf(x, 1, batch), hidden])
    return ctx.call("dyn.zeros", shape, dtype=dtype)


def _fresh_rows(ctx, proj, hidden):
    """Zeros of shape ``(seq, batch, hidden)``, the loop's ``Y`` before it writes row after row. Built
    from the direction's own ``proj`` dims, so the two directions' buffers stay two values (common
    subexpression elimination would merge equal ``dyn.zeros`` calls, and a shared buffer cannot be
    updated in place)."""
    dims = [d if isinstance(d, int) else DimOf(proj, axis, d) for axis, d in enumerate(ctx.shape(proj)[:2])]
    if all(isinstance(d, int) for d in dims):
        return ctx.call("zeros", shape=tuple(dims) + (hidden,), dtype=ctx.dtype(proj))
    return ctx.call("dyn.zeros", ctx.shape_vector(dims + [hidden]), dtype=ctx.dtype(proj))


def _stack(ctx, parts, axis):
    parts = [ctx.call("expand_dims", p, axis=axis) for p in parts]
    return parts[0] if len(parts) == 1 else ctx.call("concatenate", ctx.tuple(parts), axis=axis)


def _direction_weights(ctx, layer, W, R, B, P, d):
    """(projection weight, projection bias or None, the step's weights) of direction ``d``."""
    hidden, gates = layer.hidden_size, layer.gates
    w, r = _take(ctx, W, d), _take(ctx, R, d)
    w_bias = r_bias = None
    if B is not None:
        w_bias, r_bias = _parts(ctx, _take(ctx, B, d), 2)
    step = {"R": r}
    if layer.kind == "lstm" and P is not None:
        step["P"] = _take(ctx, P, d)
    if layer.kind != "gru":
        return w, (None if B is None else ctx.call("add", w_bias, r_bias)), step
    if layer.linear_before_reset:
        # Rb_h is scaled by the reset gate inside the loop; Rb_z and Rb_r fold into the projection.
        proj_bias = None
        if B is not None:
            keep = np.concatenate([np.ones(2 * hidden), np.zeros(hidden)]).astype(ctx.dtype(B))
            proj_bias = ctx.call("add", w_bias, ctx.call("multiply", r_bias, ctx.constant(keep)))
            step["Rb_h"] = _rows(ctx, r_bias, 2 * hidden, 3 * hidden)
        return w, proj_bias, step
    step = {"R_zr": _rows(ctx, r, 0, 2 * hidden), "R_h": _rows(ctx, r, 2 * hidden, gates * hidden)}
    return w, (None if B is None else ctx.call("add", w_bias, r_bias)), step


def convert_recurrent(ctx, kind, X, W, R, B=None, sequence_lens=None, initial_h=None, initial_c=None, P=None, *,
                      hidden_size=None, direction="forward", activations=None, activation_alpha=None,
                      activation_beta=None, clip=None, layout=0, input_forget=0, linear_before_reset=0):
    """The outputs ``[Y, Y_h(, Y_c)]`` of an ONNX LSTM/GRU/RNN node as IR, or None when the layer must
    stay an opaque op (see the module docstring). ``Y`` is None when the model does not read it."""
    for value, what in ((X, "X"), (W, "W"), (R, "R")):
        if ctx.ndim(value) != 3:
            raise TypeInferenceError(f"{kind.upper()}: {what} must be 3-d, got {ctx.tensor_type(value)!r}")
    if direction not in ("forward", "reverse", "bidirectional"):
        raise TypeInferenceError(f"{kind.upper()}: direction must be forward, reverse or bidirectional, "
                                 f"got {direction!r}")
    num_directions = ctx.shape(W)[0]
    if hidden_size is None:
        hidden_size = ctx.shape(R)[2]
    if not isinstance(num_directions, int) or not isinstance(hidden_size, int):
        return None
    expected = 2 if direction == "bidirectional" else 1
    if num_directions != expected:
        raise TypeInferenceError(f"{kind.upper()}: W has {num_directions} direction(s) but direction="
                                 f"{direction!r} needs {expected}")
    layer = RecurrentLayer(
        kind=kind, hidden_size=int(hidden_size), num_directions=num_directions,
        reverse_only=direction == "reverse", layout=int(layout), clip=None if clip is None else float(clip),
        activations=layer_activations(kind, activations or (), activation_alpha, activation_beta, num_directions),
        input_forget=bool(input_forget), linear_before_reset=bool(linear_before_reset))
    used = ctx.outputs_used(kind.upper(), [X, W, R, B, sequence_lens, initial_h, initial_c, P])
    want_y = used is None or bool(used[0])

    dtype = ctx.dtype(X)
    swap = (1, 0, 2)
    if layer.layout:
        X = ctx.call("transpose", X, axes=swap)
        initial_h = None if initial_h is None else ctx.call("transpose", initial_h, axes=swap)
        initial_c = None if initial_c is None else ctx.call("transpose", initial_c, axes=swap)
    hidden = layer.hidden_size
    batch = ctx.shape(X)[1]
    lens = None if sequence_lens is None else ctx.call("reshape", ctx.cast(sequence_lens, "int64"), newshape=(-1,))
    flat_index = None
    if lens is not None and (layer.reverse_only or num_directions == 2):
        flat_index = _reversal_index(ctx, X, lens)

    ys, finals = [], []
    for d in range(num_directions):
        w, proj_bias, step_weights = _direction_weights(ctx, layer, W, R, B, P, d)
        proj = _add(ctx, ctx.call("nn.dense", X, w), proj_bias)
        reverse = layer.is_reverse(d)
        if reverse:
            proj = _reverse_time(ctx, proj, flat_index)
        states0 = []
        for init in (initial_h, initial_c)[:2 if kind == "lstm" else 1]:
            states0.append(_zeros(ctx, X, (), hidden, dtype) if init is None else _take(ctx, init, d))
        state_type = TensorType((batch if isinstance(batch, int) else Any(), hidden), dtype)
        label = f"{kind}{'_reverse' if reverse else ''}"
        last, y = _build_loop(ctx, label, layer, layer.activations[d], proj, states0, state_type, step_weights,
                              lens, _fresh_rows(ctx, proj, hidden) if want_y else None)
        if y is not None and reverse:
            y = _reverse_time(ctx, y, flat_index)
        ys.append(y)
        finals.append(last)

    y = _stack(ctx, ys, 1) if want_y else None
    outs = [_stack(ctx, [f[k] for f in finals], 0) for k in range(len(finals[0]))]
    if layer.layout:
        y = None if y is None else ctx.call("transpose", y, axes=(2, 0, 1, 3))
        outs = [ctx.call("transpose", o, axes=swap) for o in outs]
    return [y] + outs
