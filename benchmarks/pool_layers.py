"""float32 NCHW max pools one at a time: the vector kernel (``tv_max_pool2d_f32``, ``tv_vpool.h``; nn.max_pool2d's
``vector_pool`` strategy) against the generated kernel of the op's TE compute (the same group built with
``TENSORVM_KERNEL_VARIANTS=0``: a -inf padded copy, then the window maximum) and ONNX Runtime's MaxPool on
the same input, at 1 and 2 threads, interleaved in one process (each round in another order); the median
and the least of the rounds per call, in microseconds. The three outputs must be equal (NaN-free input).

    .venv/bin/python benchmarks/pool_layers.py                       # 40 rounds, threads 1 and 2
    .venv/bin/python benchmarks/pool_layers.py --rounds 100 --threads 1

Cases: ResNet-18's pool (64 x 112 x 112, 3x3 stride 2 padding 1) at batch 1, 3 and 8; VGG's 2x2 stride 2
(128 x 112 x 112); a 3x3 stride 1 padding 1 pool (Inception's, 192 x 28 x 28); GoogLeNet's 3x3 stride 2
ceil-mode pool (64 x 112 x 112).
"""

from __future__ import annotations

import argparse
import functools
import os
import random
import time

import numpy as np

# (label, (n, c, h, w), kernel, stride, padding, ceil_mode)
CASES = [
    ("resnet18 b1 3x3 s2 p1", (1, 64, 112, 112), 3, 2, 1, False),
    ("resnet18 b3 3x3 s2 p1", (3, 64, 112, 112), 3, 2, 1, False),
    ("resnet18 b8 3x3 s2 p1", (8, 64, 112, 112), 3, 2, 1, False),
    ("vgg 128x112 2x2 s2", (1, 128, 112, 112), 2, 2, 0, False),
    ("192x28 3x3 s1 p1", (1, 192, 28, 28), 3, 1, 1, False),
    ("googlenet 3x3 s2 ceil", (1, 64, 112, 112), 3, 2, 0, True),
]


def _kernel(shape, k, s, p, ceil_mode, variants: bool):
    from tensorvm import op
    from tensorvm.codegen.fused import build_fused_module
    from tensorvm.ir.expr import Function, Var
    from tensorvm.ir.types import TensorType

    previous = os.environ.get("TENSORVM_KERNEL_VARIANTS")
    os.environ["TENSORVM_KERNEL_VARIANTS"] = "1" if variants else "0"
    try:
        x = Var("x", TensorType(shape, "float32"))
        body = op.nn.max_pool2d(x, pool_size=(k, k), strides=(s, s), padding=(p, p), ceil_mode=ceil_mode)
        _, kernels = build_fused_module({"pool": Function([x], body, attrs={"Primitive": 1})})
    finally:
        if previous is None:
            del os.environ["TENSORVM_KERNEL_VARIANTS"]
        else:
            os.environ["TENSORVM_KERNEL_VARIANTS"] = previous
    kernel = kernels["pool"]
    assert ("vector_pool" in kernel.variants) == variants, kernel.variants
    return kernel


def _onnx(shape, k, s, p, ceil_mode, threads):
    import onnxruntime as ort
    from onnx import TensorProto, helper

    node = helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[k, k], strides=[s, s], pads=[p] * 4,
                            ceil_mode=int(ceil_mode))
    graph = helper.make_graph([node], "pool", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    args = parser.parse_args()

    from tensorvm.codegen import build

    rng = np.random.default_rng(0)
    print(f"{'case':24} {'thr':>3}  {'vector_pool':>17}  {'generated':>17}  {'onnxruntime':>17}  "
          f"{'gen/vec':>7} {'ort/vec':>7}   (median / min us)")
    for label, shape, k, s, p, ceil_mode in CASES:
        x = rng.standard_normal(shape).astype(np.float32)
        vector, generic = _kernel(shape, k, s, p, ceil_mode, True), _kernel(shape, k, s, p, ceil_mode, False)
        sessions = {t: _onnx(shape, k, s, p, ceil_mode, t) for t in args.threads}
        want = sessions[args.threads[0]].run(None, {"x": x})[0]
        out_v, out_g = np.empty(want.shape, np.float32), np.empty(want.shape, np.float32)
        vector(x, out_v)
        generic(x, out_g)
        assert np.array_equal(out_v, want) and np.array_equal(out_g, want), label
        for threads in args.threads:
            build.set_num_threads(threads)
            session = sessions[threads]
            calls = {"vector_pool": functools.partial(vector, x, out_v),
                     "generated": functools.partial(generic, x, out_g),
                     "onnxruntime": functools.partial(session.run, None, {"x": x})}
            times: dict = {name: [] for name in calls}
            for name in calls:  # (warm up: the workers, the caches)
                for _ in range(3):
                    calls[name]()
            order = list(calls)
            for _ in range(args.rounds):
                random.shuffle(order)
                for name in order:
                    start = time.perf_counter()
                    calls[name]()
                    times[name].append((time.perf_counter() - start) * 1e6)
            med = {name: float(np.median(t)) for name, t in times.items()}
            low = {name: float(np.min(t)) for name, t in times.items()}
            cells = "  ".join(f"{med[n]:8.0f} /{low[n]:7.0f}" for n in calls)
            print(f"{label:24} {threads:>3}  {cells}  {med['generated'] / med['vector_pool']:7.2f} "
                  f"{med['onnxruntime'] / med['vector_pool']:7.2f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
