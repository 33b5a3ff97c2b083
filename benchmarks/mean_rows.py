"""The global average pools of MobileNetV3-small's squeeze-and-excitation blocks (``mean`` over H x W,
keepdims) one at a time: ``tv_mean_f32`` (the "rows" variant, ``strategy.MeanCall``) against the generated
reduction it replaced (the same program compiled with ``TENSORVM_KERNEL_VARIANTS=0``) and ONNX Runtime's
``GlobalAveragePool``, interleaved in one process. On a shared machine only the ratios mean anything;
the minimum over the rounds is the least disturbed call.

    .venv/bin/python benchmarks/mean_rows.py --batch 8 --rounds 200
    .venv/bin/python benchmarks/mean_rows.py --batch 1 --threads 2
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from lone_layers import interleaved_minimum, ort_options  # noqa: E402

# (channels, side): the inputs of MobileNetV3-small's average pools
POOLS = [(16, 56), (96, 14), (240, 14), (120, 14), (144, 14), (288, 7), (576, 7)]


def _program(c: int, side: int):
    import tensorvm as tv

    return tv.parse(f'''#[version = "0.0.5"]
def @main(%x: Tensor[(?, {c}, {side}, {side}), float32]) {{ mean(%x, axis=[2, 3], keepdims=True) }}''')


def _onnx(c: int, side: int, batch: int):
    from onnx import TensorProto, helper

    graph = helper.make_graph([helper.make_node("GlobalAveragePool", ["x"], ["y"])], "pool",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, c, side, side])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=200)
    args = parser.parse_args()

    import onnxruntime as ort

    import tensorvm as tv

    tv.set_num_threads(args.threads)
    rng = np.random.default_rng(0)
    print(f"MobileNetV3-small's average pools, batch {args.batch}, {args.threads} thread(s), {args.rounds} interleaved "
          f"rounds; us per call, min")
    print(f"  {'pool':12s} {'tv_mean_f32':>11s} {'generated':>9s} {'onnxruntime':>11s}  library / generated")
    totals: dict = {}
    for c, side in POOLS:
        x = rng.standard_normal((args.batch, c, side, side)).astype(np.float32)
        calls = {}
        for name, variants in (("tv_mean_f32", "1"), ("generated", "0")):
            previous = os.environ.get("TENSORVM_KERNEL_VARIANTS")
            os.environ["TENSORVM_KERNEL_VARIANTS"] = variants
            try:
                exe = tv.vm.compile(_program(c, side), target="c")
                source = "".join(exe.kernel_source(p.name) for p in exe.primitives if "shape_func" not in p.name)
                assert ("tv_mean_f32(" in source) == (variants == "1"), name
                vm = tv.vm.VirtualMachine(exe)
                vm.invoke("main", x)
            finally:
                if previous is None:
                    del os.environ["TENSORVM_KERNEL_VARIANTS"]
                else:
                    os.environ["TENSORVM_KERNEL_VARIANTS"] = previous
            np.testing.assert_allclose(vm.invoke("main", x).numpy(), x.mean(axis=(2, 3), keepdims=True), rtol=1e-5,
                                       atol=1e-6)
            calls[name] = lambda vm=vm, x=x: vm.invoke("main", x)
        session = ort.InferenceSession(_onnx(c, side, args.batch).SerializeToString(), ort_options(args.threads),
                                       providers=["CPUExecutionProvider"])
        calls["onnxruntime"] = lambda session=session, x=x: session.run(None, {"x": x})
        best = interleaved_minimum(calls, args.rounds)
        for name, us in best.items():
            totals[name] = totals.get(name, 0.0) + us
        print(f"  {f'{c}x{side}x{side}':12s} {best['tv_mean_f32']:11.1f} {best['generated']:9.1f} {best['onnxruntime']:11.1f}"
              f"  {best['tv_mean_f32'] / best['generated']:.2f}")
    print(f"  all pools: tv_mean_f32 {totals['tv_mean_f32']:.0f} us, generated {totals['generated']:.0f} us, "
          f"onnxruntime {totals['onnxruntime']:.0f} us (these times include a VM call each)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
