"""FuseLSTMCell: an LSTM step's cell math written out as ops (PyTorch's gate order, the form of
benchmarks/models/lstm.py) becomes one ``nn.lstm_cell``; near misses stay as written. Results are checked
against the reference interpreter on the unrewritten program, and, on target c, against the same program
compiled without the pass (bit for bit when written in the cell's order, f c + i g: the C compiler may
contract either product of the sum into an FMA, so operands the other way round may differ by an ulp)."""

from __future__ import annotations

import numpy as np
import pytest

import tensorvm as tv
from tensorvm.codegen.build import have_compiler
from tensorvm.ir.analysis import post_order
from tensorvm.ir.expr import Call, Op
from tensorvm.transform.fuse_lstm_cell import FuseLSTMCell
from tensorvm.transform.infer_type import InferType

I, H = 5, 3
G = 4 * H

# The step's cell, PyTorch's order (i, f, g, o = parts 0..3), as benchmarks/models/lstm.py writes it.
TORCH = """
    %c_next = add(multiply(sigmoid(%parts.1), %c), multiply(sigmoid(%parts.0), tanh(%parts.2)));
    %h_next = multiply(sigmoid(%parts.3), tanh(%c_next));"""
# operands the other way round, and the gates in another order (i, f, g, o = parts 3, 0, 1, 2)
SWAPPED = """
    %c_next = add(multiply(tanh(%parts.1), sigmoid(%parts.3)), multiply(%c, sigmoid(%parts.0)));
    %h_next = multiply(tanh(%c_next), sigmoid(%parts.2));"""
# near misses: one part read twice (no gate 3), and a sigmoid where the cell has tanh
TWICE = """
    %c_next = add(multiply(sigmoid(%parts.1), %c), multiply(sigmoid(%parts.0), tanh(%parts.2)));
    %h_next = multiply(sigmoid(%parts.1), tanh(%c_next));"""
NOT_TANH = """
    %c_next = add(multiply(sigmoid(%parts.1), %c), multiply(sigmoid(%parts.0), sigmoid(%parts.2)));
    %h_next = multiply(sigmoid(%parts.3), tanh(%c_next));"""


def lstm_text(cell: str, batch: int = 1, row: bool = True) -> str:
    """A recursive LSTM over a dynamic sequence: ``row`` takes the step's (4H,) row of the hoisted projection
    (a (B, 4H) slice otherwise)."""
    gates_in = "take(%proj, %t, axis=0)" if row else f"reshape(take(%proj, %t, axis=0), newshape=[{batch}, {G}])"
    proj_shape = f"(?, {G})" if row else f"(?, {batch * G})"
    state = f"(Tensor[({batch}, {H}), float32], Tensor[({batch}, {H}), float32])"
    return f"""
def @main(%xs: Tensor[(?, {batch}, {I}), float32], %w_ih: Tensor[({G}, {I}), float32],
          %w_hh: Tensor[({G}, {H}), float32]) -> {state} {{
  %length = take(shape_of(%xs, dtype="int32"), 0);
  %proj = reshape(nn.dense(reshape(%xs, newshape=[-1, {I}]), %w_ih), newshape=[-1, {batch * G}]);
  %zeros = zeros(shape=[{batch}, {H}], dtype="float32");
  @step(0, %length, reshape(%proj, newshape=[-1, {batch * G}]), %zeros, %zeros, %w_hh)
}}

def @step(%t: int32, %length: int32, %proj: Tensor[{proj_shape}, float32], %h: Tensor[({batch}, {H}), float32],
          %c: Tensor[({batch}, {H}), float32], %w_hh: Tensor[({G}, {H}), float32]) -> {state} {{
  if (less(%t, %length)) {{
    %gates = add({gates_in}, nn.dense(%h, %w_hh));
    %parts = split(%gates, indices_or_sections=4, axis=1);{cell}
    @step(add(%t, 1), %length, %proj, %h_next, %c_next, %w_hh)
  }} else {{
    (%h, %c)
  }}
}}
"""


def cells(mod) -> list:
    return [n for fn in mod.functions.values() for n in post_order(fn.body)
            if isinstance(n, Call) and isinstance(n.op, Op) and n.op.name == "nn.lstm_cell"]


def inputs(batch: int, length: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    return (rng.uniform(-2, 2, (length, batch, I)).astype("float32"),
            rng.uniform(-1, 1, (G, I)).astype("float32"), rng.uniform(-1, 1, (G, H)).astype("float32"))


def reference(text: str, args):
    return [np.asarray(v.numpy()) for v in tv.create_executor("debug", tv.parse(text)).evaluate()(*args)]


CASES = [(TORCH, 1, True, "ifco"), (SWAPPED, 1, True, "fcoi"), (TORCH, 2, False, "ifco"),
         (TWICE, 1, True, None), (NOT_TANH, 1, True, None)]


@pytest.mark.parametrize("cell, batch, row, order", CASES)
def test_the_pass_fuses_the_cell_or_leaves_it(cell, batch, row, order):
    text = lstm_text(cell, batch, row)
    after = FuseLSTMCell()(InferType()(tv.parse(text)))
    found = cells(after)
    assert [c.attrs.get("gates") for c in found] == ([order] if order else [])
    after = InferType()(after)  # the rewritten program type-checks; the python target runs it
    args = inputs(batch, 4)
    want = reference(text, args)
    vm = tv.vm.VirtualMachine(tv.vm.compile(after, target="python"))
    for g, w in zip(vm.invoke("main", *args), want, strict=True):
        np.testing.assert_allclose(g.numpy(), w, rtol=1e-5, atol=1e-6)


def compiled(text: str, fuse: bool, mode: str):
    original = FuseLSTMCell.transform_module
    if not fuse:
        FuseLSTMCell.transform_module = lambda self, mod: mod
    try:
        exe = tv.vm.compile(tv.parse(text), target="c", exec_mode="native")
    finally:
        FuseLSTMCell.transform_module = original
    return exe, tv.vm.VirtualMachine(exe.with_exec_mode(mode))


@pytest.mark.skipif(not have_compiler(), reason="target c compiles C (no C compiler here)")
@pytest.mark.parametrize("cell, batch, row, order", CASES[:3])
@pytest.mark.parametrize("mode", ["bytecode", "native"])
def test_compiled_against_the_interpreter_and_the_unfused_program(cell, batch, row, order, mode):
    text = lstm_text(cell, batch, row)
    exe, fused = compiled(text, True, mode)
    assert any("lstm_cell" in name for name in [k.name for k in exe.primitives])
    assert not any("split" in name or "sigmoid" in name for name in [k.name for k in exe.primitives])
    loaded = tv.vm.VirtualMachine(tv.vm.load_executable(exe.save_bytes()).with_exec_mode(mode))
    _, unfused = compiled(text, False, mode)
    for length in (0, 1, 7):
        args = inputs(batch, length, seed=length)
        want = reference(text, args)
        got = [v.numpy() for v in fused.invoke("main", *args)]
        for g, again in zip(got, loaded.invoke("main", *args), strict=True):  # saved and loaded
            np.testing.assert_array_equal(g, again.numpy())
        for g, w, u in zip(got, want, unfused.invoke("main", *args), strict=True):
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)
            if cell is TORCH:
                np.testing.assert_array_equal(g, u.numpy())
            else:
                np.testing.assert_allclose(g, u.numpy(), rtol=1e-6, atol=1e-7)


@pytest.mark.skipif(not have_compiler(), reason="target c compiles C (no C compiler here)")
def test_nan_and_infinities_propagate_as_the_written_out_cell():
    text = lstm_text(TORCH)
    xs, w_ih, w_hh = inputs(1, 3)
    xs[0, 0, 1] = np.nan
    xs[1, 0, 2] = np.inf
    xs[2, 0, 3] = -np.inf
    want = reference(text, (xs, w_ih, w_hh))
    _, fused = compiled(text, True, "native")
    _, unfused = compiled(text, False, "native")
    for g, w, u in zip(fused.invoke("main", xs, w_ih, w_hh), want, unfused.invoke("main", xs, w_ih, w_hh),
                       strict=True):
        np.testing.assert_array_equal(np.isnan(g.numpy()), np.isnan(w))
        np.testing.assert_array_equal(g.numpy(), u.numpy())
