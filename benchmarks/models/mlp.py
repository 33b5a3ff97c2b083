"""MLP 784-512-512-10 with ReLU (a static model): tensorvm's IR on every tensorvm executor, and peers.

One group per batch size (each batch is its own static program). The IR is ``dense`` + ``bias_add``
+ ``relu`` twice and a final ``dense`` + ``bias_add``; PyTorch runs the same ``nn.Sequential`` and
ONNX Runtime its export.
"""

from __future__ import annotations

import functools

import numpy as np

from .common import Case, ModelGroup, export_static_onnx, rng_for, static_runtimes, uniform

LAYERS = (784, 512, 512, 10)


def make_weights(layers=LAYERS, seed: int = 0) -> dict[str, np.ndarray]:
    rng = rng_for("mlp", *layers, seed)
    weights = {}
    for n, (fan_in, fan_out) in enumerate(zip(layers[:-1], layers[1:]), start=1):
        scale = 1.0 / np.sqrt(fan_in)
        weights[f"w{n}"] = uniform(rng, (fan_out, fan_in), scale)
        weights[f"b{n}"] = uniform(rng, (fan_out,), scale)
    return weights


def make_input(batch: int, features: int = LAYERS[0], seed: int = 0) -> np.ndarray:
    return rng_for("mlp-x", batch, features, seed).standard_normal((batch, features)).astype(np.float32)


def mlp_relay_text(batch: int, layers=LAYERS) -> str:
    params = [f"%x: Tensor[({batch}, {layers[0]}), float32]"]
    body, value = [], "%x"
    last = len(layers) - 1
    for n, (fan_in, fan_out) in enumerate(zip(layers[:-1], layers[1:]), start=1):
        params += [f"%w{n}: Tensor[({fan_out}, {fan_in}), float32]", f"%b{n}: Tensor[({fan_out},), float32]"]
        expr = f"nn.bias_add(nn.dense({value}, %w{n}), %b{n})"
        if n < last:
            expr = f"nn.relu({expr})"
        body.append(f"  %{n} = {expr};")
        value = f"%{n}"
    return (f"def @main({', '.join(params)}) -> Tensor[({batch}, {layers[-1]}), float32] {{\n"
            + "\n".join(body) + f"\n  {value}\n}}\n")


def build_ir(batch: int, weights: dict, layers=LAYERS):
    import tensorvm as tv

    return tv.parse(mlp_relay_text(batch, layers)), dict(weights)


def torch_mlp(torch, weights: dict, layers=LAYERS):
    modules = []
    for n, (fan_in, fan_out) in enumerate(zip(layers[:-1], layers[1:]), start=1):
        linear = torch.nn.Linear(fan_in, fan_out)
        with torch.no_grad():
            linear.weight.copy_(torch.from_numpy(weights[f"w{n}"]))
            linear.bias.copy_(torch.from_numpy(weights[f"b{n}"]))
        modules.append(linear)
        if n < len(layers) - 1:
            modules.append(torch.nn.ReLU())
    return torch.nn.Sequential(*modules).eval()


def group(batch: int) -> ModelGroup:
    weights = functools.cache(lambda: make_weights())
    inputs = functools.cache(lambda: make_input(batch))
    onnx_file = f"mlp_b{batch}.onnx"

    def prepare(directory):
        import torch

        export_static_onnx(torch_mlp(torch, weights()), inputs(), directory / onnx_file, "x")

    return ModelGroup(
        key=f"mlp-b{batch}", title=f"MLP 784-512-512-10, batch {batch}", unit="inference",
        cases=(Case(f"b{batch}", f"batch {batch}", 1),),
        runtimes=static_runtimes(lambda: build_ir(batch, weights()), lambda case: inputs(),
                                 lambda torch: torch_mlp(torch, weights()), onnx_file, "x"),
        reference="torch", atol=1e-4, rtol=1e-3, prepare=prepare, artifact_key=f"mlp-{batch}")
