"""The small CNN's three convolutions (benchmarks/models/cnn.py: 3x3, padding 1, bias and relu; the first two
with the fused 2x2 max pool) one at a time: the direct kernel (``tv_conv2d_direct_act_f32``) called directly,
against the same lone layer in ONNX Runtime (Conv, Relu, MaxPool), interleaved in one process. On a shared
machine only the ratios mean anything; medians and minima over the rounds are printed.

    .venv/bin/python benchmarks/cnn_layers.py --threads 2 --rounds 400
    .venv/bin/python benchmarks/cnn_layers.py --threads 2 --against ../main   # against another checkout

``--gap US`` sleeps that long before each call (a busy wait of the caller would keep the pool's workers
spinning; a sleep lets them go to sleep as between two inferences), so the first fork-join of the call
pays for waking a worker, as the first layer of an inference does.
"""

from __future__ import annotations

import numpy as np

# (in channels, image side, out channels, pool)
LAYERS = [(3, 32, 16, True), (16, 16, 32, True), (32, 8, 64, False)]

_CALLS = r"""
int32_t tv_bench_cnn(const int64_t* d, const float* x, const float* w, const float* b, float* padded, float* out) {
  return tv_conv2d_direct_act_f32(d[0], d[1], d[2], d[2], d[3], d[2], d[2], 3, 3, 1, 1, 1, 1, 1, 1, x, w, b, 1, 1,
                                  d[4], 0, 1.0f, 0.0f, 0.0f, 0.0f, b, 0, padded, out);
}
"""


def _onnx_layer(c: int, side: int, o: int, pool: bool, batch: int, weight, bias):
    from onnx import TensorProto, helper, numpy_helper

    nodes = [helper.make_node("Conv", ["x", "W", "B"], ["y"], pads=[1] * 4),
             helper.make_node("Relu", ["y"], ["r" if pool else "z"])]
    if pool:
        nodes.append(helper.make_node("MaxPool", ["r"], ["z"], kernel_shape=[2, 2], strides=[2, 2]))
    graph = helper.make_graph(
        nodes, "layer", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, c, side, side])],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(weight, "W"), numpy_helper.from_array(bias, "B")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def main() -> int:
    import sys
    import time

    import lone_layers as lone

    gap = 0.0
    if "--gap" in sys.argv:  # (its own option: lone.prepare parses the shared ones)
        at = sys.argv.index("--gap")
        gap = float(sys.argv[at + 1]) * 1e-6
        del sys.argv[at:at + 2]
    args, libraries, options = lone.prepare(__doc__.split("\n\n")[0], 200, _CALLS, {"tv_bench_cnn": 6})

    from tensorvm.codegen.host import gemm_params

    rng = np.random.default_rng(0)
    n, lanes = args.batch, gemm_params().lanes
    print(f"The small CNN's convolutions, batch {n}, {args.threads} thread(s), {args.rounds} interleaved rounds"
          + (f", {gap * 1e6:.0f} us asleep before each call" if gap else "") + "; us per call, median (min)")
    names = ["tensorvm here", "onnxruntime"] + (["tensorvm there"] if args.against else [])
    print(f"  {'layer':24s}" + "".join(f" {name:>20s}" for name in names)
          + "  here/ort" + ("  here/there" if args.against else ""))
    for c, side, o, pool in LAYERS:
        weight = (rng.standard_normal((o, c, 3, 3)) / np.sqrt(9 * c)).astype(np.float32)
        bias = rng.standard_normal(o).astype(np.float32)
        x = rng.standard_normal((n, c, side, side)).astype(np.float32)
        want, calls = lone.peer_call(_onnx_layer(c, side, o, pool, n, weight, bias), options, x)
        wq = -(-side // lanes) * lanes + 2  # (tv_vconv_geometry_of at stride 1, 3x3)
        for where, lib in libraries.items():
            padded = np.empty(c * (side + 2) * wq, np.float32)
            out = np.empty(want.shape, np.float32)
            dims = np.array([n, c, side, o, int(pool)], np.int64)
            calls[f"tensorvm {where}"] = lone.checked_call(lib.tv_bench_cnn, (dims, x, weight, bias, padded, out),
                                                           out, want)
        times = lone.interleaved_times(calls, args.rounds, before=(lambda: time.sleep(gap)) if gap else None)
        med = {name: float(np.median(v)) for name, v in times.items()}
        low = {name: min(v) for name, v in times.items()}
        label = f"{c}x{side}x{side} -> {o}" + (" pool" if pool else "")
        line = f"  {label:24s}" + "".join(f" {med[name]:11.1f} ({low[name]:6.1f})" for name in names)
        line += f"  {med['tensorvm here'] / med['onnxruntime']:8.2f}"
        if args.against:
            line += f"  {med['tensorvm here'] / med['tensorvm there']:10.3f}"
        print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
