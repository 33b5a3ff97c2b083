"""The real-model corpus: PyTorch models with seeded random weights, exported to ONNX with dynamic axes,
each run by tensorvm (``tv.frontend.from_onnx``, target "c", one VM executable for every case's shapes),
ONNX Runtime (the same file) and PyTorch eager (the same weights).

A model module describes its model with an ``OnnxModel`` (how to build the PyTorch module, its inputs,
outputs and dynamic axes, the cases and their inputs) and turns it into a ``ModelGroup`` with
``onnx_group``. ``prepare`` (run once, in a PyTorch process) seeds torch, builds the module, saves its
state dict and exports the ONNX file; the PyTorch worker loads the saved state dict, so every runtime
runs the same weights whatever the initialisation does.
"""

from __future__ import annotations

import functools
import hashlib
import warnings
from collections.abc import Callable
from dataclasses import dataclass
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
)

OPSET = 17
#: Seconds one runtime may spend on one corpus model at one thread count (``ModelGroup.budget_s``).
BUDGET_S = 300.0
QUICK_BUDGET_S = 180.0


@dataclass(frozen=True)
class OnnxModel:
    """A PyTorch model of the corpus.

    ``build(torch)`` returns the module (random weights; ``prepare`` seeds torch first); its ``forward``
    takes the inputs in ``inputs`` order and returns the outputs in ``outputs`` order (a tensor or a
    tuple). ``feeds(case)`` returns ``{input name: array}`` for a case; ``example`` names the case
    used for the export. ``dynamic_axes`` is ``torch.onnx.export``'s; ``tvm_shape`` the dims tensorvm's
    import is given (``None`` for a dynamic dim: one executable serves every case)."""

    key: str
    title: str
    build: Callable
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    dynamic_axes: dict
    tvm_shape: dict
    cases: tuple[Case, ...]
    feeds: Callable
    example: str = ""
    unit: str = "inference"
    atol: float = 1e-4
    rtol: float = 1e-3
    reference: str = "ort"
    description: str = ""
    budget_s: float = BUDGET_S
    align: Callable | None = None  # ``ModelGroup.align``
    # The VM exec modes measured ("native": VM functions compiled to C; worth it where the VM's own
    # dispatch is a large share, as in the recurrent loops)
    exec_modes: tuple[str, ...] = ("bytecode",)


@functools.cache
def source_stamp() -> str:
    """A digest of the corpus's model definitions: part of the cached exports' directory name, so an
    edited model is exported again."""
    digest = hashlib.sha1()
    for name in ("corpus.py", "vision.py", "vision_nets.py", "text.py"):
        digest.update((Path(__file__).parent / name).read_bytes())
    return digest.hexdigest()[:10]


def seeded_module(model: OnnxModel, torch, seed: int = 0):
    torch.manual_seed(seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return model.build(torch).eval()


def export(model: OnnxModel, directory: Path) -> None:
    """Writes ``{key}.pt`` (state dict) and ``{key}.onnx`` (dynamic axes) into ``directory``."""
    import torch

    module = seeded_module(model, torch)
    torch.save(module.state_dict(), str(directory / f"{model.key}.pt"))
    example_case = next((c for c in model.cases if c.name == model.example), model.cases[0])
    feeds = model.feeds(example_case)
    args = tuple(torch.from_numpy(feeds[name]) for name in model.inputs)
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        torch.onnx.export(module, args, str(directory / f"{model.key}.onnx"), input_names=list(model.inputs),
                          output_names=list(model.outputs), dynamic_axes=model.dynamic_axes,
                          opset_version=OPSET, dynamo=False)


def torch_module(model: OnnxModel, torch, state_path: Path):
    """The module with the weights ``prepare`` saved."""
    module = seeded_module(model, torch)
    module.load_state_dict(torch.load(str(state_path), weights_only=True))
    return module


def onnx_group(model: OnnxModel, quick: bool = False, cases: tuple[Case, ...] | None = None) -> ModelGroup:
    """The model's ``ModelGroup``: tensorvm (ONNX import, VM, target "c" only: a NumPy run of these
    models says nothing about tensorvm's speed), ONNX Runtime and PyTorch eager."""
    cases = cases or model.cases
    feed_cache: dict = {}

    def feeds(case):
        if case.name not in feed_cache:
            feed_cache[case.name] = model.feeds(case)
        return feed_cache[case.name]

    def tvm_runner(exec_mode):
        return lambda grp, ctx: TensorVMRunner(
            lambda: import_from_onnx(ctx["artifacts"] / f"{model.key}.onnx", shape=model.tvm_shape),
            lambda case, mod: [tuple(feeds(case)[name] for name in model.inputs)],
            compile_twice=ctx.get("compile_twice", True), targets=("c",), exec_mode=exec_mode)

    def torch_runner(grp, ctx):
        return TorchRunner(lambda torch: torch_module(model, torch, ctx["artifacts"] / f"{model.key}.pt"),
                           lambda case, torch: [tuple(torch.from_numpy(feeds(case)[name]) for name in model.inputs)],
                           ctx["threads"])

    def ort_runner(grp, ctx):
        return OrtRunner(ctx["artifacts"] / f"{model.key}.onnx", lambda case: [feeds(case)], ctx["threads"])

    runtimes = tuple(
        RuntimeSpec("tvm" if mode == "bytecode" else f"tvm-{mode}",
                    "tensorvm ONNX import · VM" + ("" if mode == "bytecode" else f" {mode}"), TENSORVM,
                    tvm_runner(mode))
        for mode in model.exec_modes) + (
        RuntimeSpec("ort", "ONNX Runtime", PEER, ort_runner),
        RuntimeSpec("torch", "PyTorch eager", PEER, torch_runner),
    )
    budget = model.budget_s if not quick else min(model.budget_s, QUICK_BUDGET_S)
    return ModelGroup(
        key=model.key, title=model.title, unit=model.unit, cases=cases, runtimes=runtimes,
        reference=model.reference, atol=model.atol, rtol=model.rtol,
        prepare=lambda directory: export(model, directory), artifact_key=f"corpus-{model.key}-{source_stamp()}",
        description=model.description or "ONNX export with dynamic axes; one tensorvm executable for every case",
        budget_s=budget, corpus=True, align=model.align)


def rng(*parts) -> np.random.Generator:
    from .common import rng_for

    return rng_for(*parts)


def images(key: str, batch: int, size: int, seed: int = 0) -> np.ndarray:
    return rng(key, batch, size, seed).standard_normal((batch, 3, size, size)).astype(np.float32)


def token_ids(key: str, batch: int, length: int, vocab: int, seed: int = 0) -> np.ndarray:
    return rng(key, batch, length, seed).integers(0, vocab, size=(batch, length), dtype=np.int64)


def padding_mask(batch: int, length: int) -> np.ndarray:
    """``(batch, length)`` int64 attention mask: row ``b`` keeps its first ``length - 3 b`` tokens (at
    least one), so a batch mixes padded and full rows."""
    mask = np.ones((batch, length), np.int64)
    for b in range(batch):
        mask[b, max(1, length - 3 * b):] = 0
    return mask


def randomize_batch_norms(module, torch, calibrate=None, seed: int = 0) -> None:
    """Random affine weights for every BatchNorm and, with ``calibrate(module)`` (a forward pass on
    sample inputs), running statistics measured on those inputs, as training leaves them. Fresh
    statistics are the identity: with random convolution weights the activations then shrink layer by
    layer until the deep features hardly depend on the input, and a detector's scores tie everywhere
    (NMS and top-k orders become arbitrary)."""
    generator = torch.Generator().manual_seed(seed)
    norms = [layer for layer in module.modules() if isinstance(layer, torch.nn.BatchNorm2d)]
    with torch.no_grad():
        for layer in norms:
            n = layer.num_features
            layer.weight.copy_(0.5 + torch.rand(n, generator=generator))
            layer.bias.copy_(0.1 * torch.randn(n, generator=generator))
            layer.running_mean.copy_(0.1 * torch.randn(n, generator=generator))
            layer.running_var.copy_(0.5 + torch.rand(n, generator=generator))
        if calibrate is not None:
            for layer in norms:
                layer.reset_running_stats()
                layer.momentum = None  # a cumulative average over the calibration batches
            module.train()
            calibrate(module)
            module.eval()
