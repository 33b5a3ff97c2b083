"""A small CNN on 32x32 RGB images, batch 1 (a static model): tensorvm's IR and the peers.

conv3x3(3->16) relu maxpool2, conv3x3(16->32) relu maxpool2, conv3x3(32->64) relu, global average
pool, dense 64->10. NCHW data, OIHW weights, padding 1 (as ``torch.nn.Conv2d(..., padding=1)``).
"""

from __future__ import annotations

import functools

import numpy as np

from .common import Case, ModelGroup, export_static_onnx, rng_for, static_runtimes, uniform

CHANNELS = (3, 16, 32, 64)
IMAGE = 32
CLASSES = 10


def make_weights(channels=CHANNELS, classes: int = CLASSES, seed: int = 0) -> dict[str, np.ndarray]:
    rng = rng_for("cnn", *channels, classes, seed)
    weights = {}
    for n, (cin, cout) in enumerate(zip(channels[:-1], channels[1:]), start=1):
        scale = 1.0 / np.sqrt(cin * 9)
        weights[f"conv{n}_w"] = uniform(rng, (cout, cin, 3, 3), scale)
        weights[f"conv{n}_b"] = uniform(rng, (cout,), scale)
    scale = 1.0 / np.sqrt(channels[-1])
    weights["fc_w"] = uniform(rng, (classes, channels[-1]), scale)
    weights["fc_b"] = uniform(rng, (classes,), scale)
    return weights


def make_input(batch: int = 1, image: int = IMAGE, channels: int = CHANNELS[0], seed: int = 0) -> np.ndarray:
    return rng_for("cnn-x", batch, image, seed).standard_normal((batch, channels, image, image)).astype(np.float32)


def cnn_relay_text(batch: int = 1, image: int = IMAGE, channels=CHANNELS, classes: int = CLASSES) -> str:
    params = [f"%x: Tensor[({batch}, {channels[0]}, {image}, {image}), float32]"]
    body, value = [], "%x"
    convs = len(channels) - 1
    for n, (cin, cout) in enumerate(zip(channels[:-1], channels[1:]), start=1):
        params += [f"%conv{n}_w: Tensor[({cout}, {cin}, 3, 3), float32]", f"%conv{n}_b: Tensor[({cout},), float32]"]
        conv = (f"nn.conv2d({value}, %conv{n}_w, padding=[1, 1, 1, 1], channels={cout}, "
                f"kernel_size=[3, 3])")
        expr = f"nn.relu(nn.bias_add({conv}, %conv{n}_b, axis=1))"
        if n < convs:
            expr = f"nn.max_pool2d({expr}, pool_size=[2, 2], strides=[2, 2])"
        body.append(f"  %{n} = {expr};")
        value = f"%{n}"
    params += [f"%fc_w: Tensor[({classes}, {channels[-1]}), float32]", f"%fc_b: Tensor[({classes},), float32]"]
    body.append(f"  %pooled = nn.batch_flatten(nn.global_avg_pool2d({value}));")
    return (f"def @main({', '.join(params)}) -> Tensor[({batch}, {classes}), float32] {{\n"
            + "\n".join(body) + "\n  nn.bias_add(nn.dense(%pooled, %fc_w), %fc_b)\n}\n")


def build_ir(weights: dict, batch: int = 1, image: int = IMAGE):
    import tensorvm as tv

    return tv.parse(cnn_relay_text(batch, image)), dict(weights)


def torch_cnn(torch, weights: dict, channels=CHANNELS, classes: int = CLASSES):
    nn = torch.nn
    layers = []
    convs = len(channels) - 1
    for n, (cin, cout) in enumerate(zip(channels[:-1], channels[1:]), start=1):
        conv = nn.Conv2d(cin, cout, 3, padding=1)
        with torch.no_grad():
            conv.weight.copy_(torch.from_numpy(weights[f"conv{n}_w"]))
            conv.bias.copy_(torch.from_numpy(weights[f"conv{n}_b"]))
        layers += [conv, nn.ReLU()]
        if n < convs:
            layers.append(nn.MaxPool2d(2, 2))
    fc = nn.Linear(channels[-1], classes)
    with torch.no_grad():
        fc.weight.copy_(torch.from_numpy(weights["fc_w"]))
        fc.bias.copy_(torch.from_numpy(weights["fc_b"]))
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), fc]
    return nn.Sequential(*layers).eval()


def group() -> ModelGroup:
    weights = functools.cache(lambda: make_weights())
    inputs = functools.cache(lambda: make_input())

    def prepare(directory):
        import torch

        export_static_onnx(torch_cnn(torch, weights()), inputs(), directory / "cnn.onnx", "x")

    return ModelGroup(
        key="cnn", title=f"small CNN (3 conv + dense, {IMAGE}x{IMAGE} RGB, batch 1)", unit="inference",
        cases=(Case("b1", "batch 1", 1),),
        runtimes=static_runtimes(lambda: build_ir(weights()), lambda case: inputs(),
                                 lambda torch: torch_cnn(torch, weights()), "cnn.onnx", "x"),
        reference="torch", atol=1e-4, rtol=1e-3, prepare=prepare, artifact_key="cnn")
