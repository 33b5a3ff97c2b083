"""LSTM (one layer, batch 1): tensorvm's IR as a recursive loop over a dynamic sequence, and its peers.

The IR (``lstm_relay_text``) takes the whole sequence ``Tensor[(?, 1, input), float32]``. ``@main``
first computes the input projection of every step at once, ``nn.dense(reshape(%xs, (-1, input)),
%w_ih)`` plus the bias, a ``(?, 4H)`` matrix: the input side of the gates does not depend on the
state, so it is one matrix product over all tokens (the weights are read once, not once per token)
instead of a matrix-vector product per step. This is what cuDNN and ONNX Runtime do; the recurrent
product ``h W_hh^T`` is the only part that has to be sequential. ``@main`` then reads the length with
``shape_of`` and calls ``@step``, a global function that recurses over the time index carrying
``(h, c)``, takes row ``t`` of the projection, adds ``nn.dense(%h, %w_hh)``, applies the gates and ends
with a tail call, so one executable serves every sequence length. Gates follow ``torch.nn.LSTM``
(order i, f, g, o; the two biases are added as one, which is the same function).

Peers: PyTorch eager ``nn.LSTM``, an eager ``LSTMCell`` loop, that loop under TorchScript, and ONNX
Runtime on the ONNX export of ``nn.LSTM`` (which tensorvm also imports, as a second tensorvm row; the
importer hoists the projection the same way).
All share one set of weights (``make_weights``); outputs compared are the final ``(h, c)``.
"""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np

from .common import (
    PEER,
    TENSORVM,
    Case,
    ModelGroup,
    OrtRunner,
    RuntimeSpec,
    TensorVMRunner,
    TorchRunner,
    import_from_onnx,
    rng_for,
    uniform,
)

INPUT_SIZE, HIDDEN_SIZE = 256, 512
SEQ_LENGTHS = (32, 128)


def make_weights(input_size: int, hidden_size: int, seed: int = 0) -> dict[str, np.ndarray]:
    """``w_ih (4H, I)``, ``w_hh (4H, H)``, ``b_ih (4H,)``, ``b_hh (4H,)`` uniform in ±1/sqrt(H) like PyTorch."""
    rng = rng_for("lstm", input_size, hidden_size, seed)
    scale = 1.0 / np.sqrt(hidden_size)
    gates = 4 * hidden_size
    return {"w_ih": uniform(rng, (gates, input_size), scale), "w_hh": uniform(rng, (gates, hidden_size), scale),
            "b_ih": uniform(rng, (gates,), scale), "b_hh": uniform(rng, (gates,), scale)}


def make_sequence(input_size: int, length: int, seed: int = 0) -> np.ndarray:
    """A ``(length, 1, input_size)`` float32 input sequence."""
    return rng_for("lstm-x", input_size, length, seed).standard_normal((length, 1, input_size)).astype(np.float32)


def lstm_relay_text(input_size: int, hidden_size: int) -> str:
    """The LSTM in Relay text: ``@main(%xs, weights) -> (h, c)`` over a dynamic-length sequence."""
    i, h, g = input_size, hidden_size, 4 * hidden_size
    weights = (f"%w_ih: Tensor[({g}, {i}), float32], %w_hh: Tensor[({g}, {h}), float32], "
               f"%bias: Tensor[({g},), float32]")
    state = f"(Tensor[(1, {h}), float32], Tensor[(1, {h}), float32])"
    return f"""
def @main(%xs: Tensor[(?, 1, {i}), float32], {weights}) -> {state} {{
  %length = take(shape_of(%xs, dtype="int32"), 0);
  %proj = add(nn.dense(reshape(%xs, newshape=[-1, {i}]), %w_ih), %bias);
  %zeros = zeros(shape=[1, {h}], dtype="float32");
  @step(0, %length, %proj, %zeros, %zeros, %w_hh)
}}

def @step(%t: int32, %length: int32, %proj: Tensor[(?, {g}), float32], %h: Tensor[(1, {h}), float32],
          %c: Tensor[(1, {h}), float32], %w_hh: Tensor[({g}, {h}), float32]) -> {state} {{
  if (less(%t, %length)) {{
    %gates = add(take(%proj, %t, axis=0), nn.dense(%h, %w_hh));
    %parts = split(%gates, indices_or_sections=4, axis=1);
    %c_next = add(multiply(sigmoid(%parts.1), %c), multiply(sigmoid(%parts.0), tanh(%parts.2)));
    %h_next = multiply(sigmoid(%parts.3), tanh(%c_next));
    @step(add(%t, 1), %length, %proj, %h_next, %c_next, %w_hh)
  }} else {{
    (%h, %c)
  }}
}}
"""


def build_ir(input_size: int, hidden_size: int, weights: dict):
    """``(mod, params)`` of the IR LSTM; params bind the weights as constants."""
    import tensorvm as tv

    mod = tv.parse(lstm_relay_text(input_size, hidden_size))
    params = {"w_ih": weights["w_ih"], "w_hh": weights["w_hh"], "bias": weights["b_ih"] + weights["b_hh"]}
    return mod, params


# --- PyTorch ---------------------------------------------------------------------------------------
@functools.cache
def torch_classes():
    """The PyTorch modules (defined on first use so that importing this file does not import torch)."""
    import torch
    from torch import nn

    class FinalState(nn.Module):
        """``nn.LSTM`` returning the final ``(h, c)`` as ``(1, H)`` tensors (what the ONNX export holds)."""

        def __init__(self, lstm: nn.LSTM):
            super().__init__()
            self.lstm = lstm

        def forward(self, xs):
            _, (h, c) = self.lstm(xs)
            return h[0], c[0]

    class CellLoop(nn.Module):
        """An ``LSTMCell`` stepped over the sequence in Python (or in TorchScript, scripted)."""

        def __init__(self, cell: nn.LSTMCell):
            super().__init__()
            self.cell = cell
            self.hidden_size = cell.hidden_size

        def forward(self, xs):
            h = torch.zeros(1, self.hidden_size)
            c = torch.zeros(1, self.hidden_size)
            for t in range(xs.shape[0]):
                h, c = self.cell(xs[t], (h, c))
            return h, c

    return FinalState, CellLoop


def torch_lstm(torch, weights: dict):
    """``nn.LSTM`` (wrapped to return the final state) holding ``weights``."""
    final_state, _ = torch_classes()
    gates, input_size = weights["w_ih"].shape
    lstm = torch.nn.LSTM(input_size, gates // 4)
    with torch.no_grad():
        for name in ("w_ih", "w_hh", "b_ih", "b_hh"):
            getattr(lstm, f"{name.replace('w_', 'weight_').replace('b_', 'bias_')}_l0").copy_(
                torch.from_numpy(weights[name]))
    return final_state(lstm).eval()


def torch_cell_loop(torch, weights: dict, script: bool = False):
    """An ``LSTMCell`` loop holding ``weights``; ``script=True`` compiles it with TorchScript."""
    _, cell_loop = torch_classes()
    gates, input_size = weights["w_ih"].shape
    cell = torch.nn.LSTMCell(input_size, gates // 4)
    with torch.no_grad():
        cell.weight_ih.copy_(torch.from_numpy(weights["w_ih"]))
        cell.weight_hh.copy_(torch.from_numpy(weights["w_hh"]))
        cell.bias_ih.copy_(torch.from_numpy(weights["b_ih"]))
        cell.bias_hh.copy_(torch.from_numpy(weights["b_hh"]))
    module = cell_loop(cell).eval()
    if script:
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            module = torch.jit.script(module)
    return module


def export_onnx(weights: dict, path: Path) -> None:
    """The ONNX export of ``nn.LSTM`` with a dynamic sequence axis (input ``xs``, outputs ``h``, ``c``)."""
    import warnings

    import torch

    module = torch_lstm(torch, weights)
    example = torch.from_numpy(make_sequence(weights["w_ih"].shape[1], 3))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(module, (example,), str(path), input_names=["xs"], output_names=["h", "c"],
                          dynamic_axes={"xs": {0: "seq"}}, opset_version=17, dynamo=False)


# --- the benchmark group ---------------------------------------------------------------------------
def group(input_size: int = INPUT_SIZE, hidden_size: int = HIDDEN_SIZE,
          seq_lengths=SEQ_LENGTHS) -> ModelGroup:
    weights = functools.cache(lambda: make_weights(input_size, hidden_size))
    cases = tuple(Case(f"seq{n}", f"{n} tokens", n, x=n) for n in seq_lengths)
    sequence = functools.cache(lambda n: make_sequence(input_size, n))

    def tvm_args(case, mod):
        return [(sequence(case.units),)]

    def torch_args(case, torch):
        return [(torch.from_numpy(sequence(case.units)),)]

    def ir_runner(exec_mode):  # exec mode "compiled" runs native mode on target c (the row says which ran)
        return lambda grp, ctx: TensorVMRunner(lambda: build_ir(input_size, hidden_size, weights()), tvm_args,
                                               exec_mode=exec_mode)

    def onnx_runner(grp, ctx):
        return TensorVMRunner(lambda: import_from_onnx(ctx["artifacts"] / "lstm.onnx",
                                                       shape={"xs": [None, 1, input_size]}), tvm_args)

    def torch_runner(build):
        return lambda grp, ctx: TorchRunner(build, torch_args, ctx["threads"])

    def ort_runner(grp, ctx):
        return OrtRunner(ctx["artifacts"] / "lstm.onnx", lambda case: [{"xs": sequence(case.units)}],
                         ctx["threads"])

    runtimes = (
        RuntimeSpec("tvm-ir-vm", "tensorvm IR · VM", TENSORVM, ir_runner("bytecode")),
        RuntimeSpec("tvm-ir-vm-compiled", "tensorvm IR · VM compiled", TENSORVM, ir_runner("compiled")),
        RuntimeSpec("tvm-onnx-vm", "tensorvm ONNX import · VM", TENSORVM, onnx_runner),
        RuntimeSpec("torch-lstm", "PyTorch eager nn.LSTM", PEER,
                    torch_runner(lambda torch: torch_lstm(torch, weights()))),
        RuntimeSpec("torch-cell", "PyTorch eager LSTMCell loop", PEER,
                    torch_runner(lambda torch: torch_cell_loop(torch, weights()))),
        RuntimeSpec("torchscript-cell", "TorchScript LSTMCell loop", PEER,
                    torch_runner(lambda torch: torch_cell_loop(torch, weights(), script=True))),
        RuntimeSpec("ort", "ONNX Runtime", PEER, ort_runner),
    )
    return ModelGroup(
        key="lstm", title=f"LSTM (input {input_size}, hidden {hidden_size}, batch 1)", unit="token",
        cases=cases, runtimes=runtimes, reference="torch-lstm", atol=1e-4, rtol=1e-3,
        prepare=lambda directory: export_onnx(weights(), directory / "lstm.onnx"),
        artifact_key=f"lstm-{input_size}-{hidden_size}",
        description="one executable, sequence length dynamic; the IR recurses over the time index")
