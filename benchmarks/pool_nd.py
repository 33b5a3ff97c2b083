"""``nn.pool_nd`` (the ONNX importer's N-d pool) against ``nn.max_pool2d`` on a 2-d max pool.

    .venv/bin/python benchmarks/pool_nd.py

1x64x112x112 float32, 3x3 window, stride 2, without and with 1 padding: both ops' generated C kernels,
interleaved rounds of 20 calls, best and median round per call (the machine may be shared). The two
outputs must be equal.
"""

from __future__ import annotations

import time

import numpy as np

from tensorvm.codegen.fused import build_fused_module
from tensorvm.ir.attrs import Attrs
from tensorvm.ir.expr import Call, Function, Op, Var
from tensorvm.ir.types import TensorType

SHAPE = (1, 64, 112, 112)


def _primitive(op: str, attrs: dict) -> Function:
    x = Var("x", TensorType(SHAPE, "float32"))
    return Function([x], Call(Op(op), (x,), Attrs(attrs)), attrs={"Primitive": 1})


def main():
    prims, outs = {}, {}
    for pad in (0, 1):
        prims[f"max_pool2d_pad{pad}"] = _primitive("nn.max_pool2d", {"pool_size": (3, 3), "strides": (2, 2),
                                                                     "padding": (pad,) * 4})
        prims[f"pool_nd_pad{pad}"] = _primitive("nn.pool_nd", {"kernel_shape": (3, 3), "strides": (2, 2),
                                                               "pads": (pad,) * 4})
        size = (SHAPE[2] + 2 * pad - 3) // 2 + 1
        outs[f"max_pool2d_pad{pad}"] = outs[f"pool_nd_pad{pad}"] = (1, 64, size, size)
    _, kernels = build_fused_module(prims)
    x = np.random.default_rng(0).standard_normal(SHAPE).astype("float32")
    results = {name: np.empty(outs[name], "float32") for name in prims}
    times = {name: [] for name in prims}
    for name in prims:
        for _ in range(10):
            kernels[name](x, results[name])
    for _ in range(15):
        for name in prims:
            start = time.perf_counter()
            for _ in range(20):
                kernels[name](x, results[name])
            times[name].append((time.perf_counter() - start) / 20)
    for name in prims:
        print(f"{name:18s} best {min(times[name]) * 1e6:9.1f} us   median {np.median(times[name]) * 1e6:9.1f} us")
    for pad in (0, 1):
        assert np.array_equal(results[f"max_pool2d_pad{pad}"], results[f"pool_nd_pad{pad}"])


if __name__ == "__main__":
    main()
