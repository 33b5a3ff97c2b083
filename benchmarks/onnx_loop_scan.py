"""An ONNX ``Loop`` whose body emits a scan output every iteration, against ONNX Runtime: the cost of
collecting T slices (``frontend/onnx_control.py``: a list of slices stacked once after the loop).

    .venv/bin/python benchmarks/onnx_loop_scan.py [--steps 100 1000 4000] [--width 256] [--rounds 7]

One executable (native mode, target c, ``M`` a run-time input) serves every T. Times are the best call of
each round, median over rounds, the two runtimes alternating within a round; outputs are checked against
ONNX Runtime first. Before the list, the scan output grew by a ``concatenate`` per iteration: quadratic.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np


def loop_model(width: int):
    from onnx import TensorProto, helper

    vi = helper.make_tensor_value_info
    f = TensorProto.FLOAT
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"]), helper.make_node("Add", ["h_in", "step"], ["h_out"]),
         helper.make_node("Relu", ["h_out"], ["slice"])], "body",
        [vi("i", TensorProto.INT64, []), vi("cond_in", TensorProto.BOOL, []), vi("h_in", f, [1, width])],
        [vi("cond_out", TensorProto.BOOL, []), vi("h_out", f, [1, width]), vi("slice", f, [1, width])])
    graph = helper.make_graph([helper.make_node("Loop", ["M", "", "h0"], ["h", "slices"], body=body)], "loop",
                              [vi("M", TensorProto.INT64, []), vi("h0", f, [1, width]), vi("step", f, [1, width])],
                              [vi("h", f, [1, width]), vi("slices", f, ["T", 1, width])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def best(fn, calls: int = 3) -> float:
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> int:
    import onnxruntime as ort

    import tensorvm as tv

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, nargs="+", default=[100, 1000, 4000])
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    model = loop_model(args.width)
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    mod, params = tv.frontend.from_onnx(model)
    tv.set_num_threads(1)
    vm = tv.vm.VirtualMachine(tv.vm.compile(mod, target="c", params=params, exec_mode="native"))
    rng = np.random.default_rng(0)
    h0 = rng.standard_normal((1, args.width)).astype(np.float32)
    step = (rng.standard_normal((1, args.width)) / 100).astype(np.float32)
    print(f"ONNX Loop, one (1, {args.width}) scan slice per iteration; 1 thread; best of 3 calls, median of "
          f"{args.rounds} rounds")
    for steps in args.steps:
        m = np.array(steps, np.int64)
        want = session.run(None, {"M": m, "h0": h0, "step": step})
        got = vm.invoke("main", m, h0, step)
        for g, w in zip(got, want, strict=True):
            np.testing.assert_allclose(g.numpy(), w, rtol=1e-4, atol=1e-5)
        ours, theirs = [], []
        for _ in range(args.rounds):
            ours.append(best(lambda m=m: vm.invoke("main", m, h0, step)))
            theirs.append(best(lambda m=m: session.run(None, {"M": m, "h0": h0, "step": step})))
        a, b = statistics.median(ours), statistics.median(theirs)
        print(f"  T={steps:5d}: tensorvm {a * 1e3:8.3f} ms  ONNX Runtime {b * 1e3:8.3f} ms  ratio {a / b:5.2f}x  "
              f"({a / steps * 1e6:.2f} us per iteration)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
