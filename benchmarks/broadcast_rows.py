"""The squeeze-and-excitation multiplies of MobileNetV3-small, ``(N, C, H, W) * (N, C, 1, 1)``, one at a time:
the generated kernel with its trailing axes collapsed into one vector loop over ``H*W`` ("flat",
``lower._collapse_rows``) against the same kernel with a vector loop per row of ``W`` ("rows": the lowering
with the collapse switched off), and ONNX Runtime's ``Mul``, interleaved in one process (each round in
another order). Two levels: the bare kernels called on preallocated arrays, and the whole program through
the VM (which allocates the output). Medians (and minima) of the rounds, us per call. With ``--model``:
MobileNetV3-small itself compiled both ways, profiled in alternating rounds (``vm.profile``), the time of
its standalone multiply kernels and of all kernels (medians over the rounds). On a shared machine only
the ratios mean anything.

    .venv/bin/python benchmarks/broadcast_rows.py --batch 8 --rounds 300
    .venv/bin/python benchmarks/broadcast_rows.py --batch 1 --threads 2
    .venv/bin/python benchmarks/broadcast_rows.py --model --batch 8 --rounds 15
"""

from __future__ import annotations

import argparse
import statistics
import sys
from contextlib import contextmanager
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from lone_layers import interleaved_times, ort_options  # noqa: E402

# (channels, side): the squeeze-and-excitation blocks of MobileNetV3-small (224 x 224 input)
LAYERS = [(16, 56), (96, 14), (240, 14), (120, 14), (144, 14), (288, 7), (576, 7)]


@contextmanager
def _rows_only():
    """The lowering as it was: no trailing axes collapsed."""
    import importlib

    from tensorvm.codegen import signature

    lower = importlib.import_module("tensorvm.codegen.lower")  # (the package exports the function lower)
    saved, stamp = lower._collapse_rows, signature.generator_stamp()
    lower._collapse_rows = lambda *args: None
    signature._STAMP[0] = stamp + ":rows"  # (kernel keys of their own: not the memo's nor the cache's flat ones)
    try:
        yield
    finally:
        lower._collapse_rows = saved
        signature._STAMP[0] = stamp


def _kernel(name: str, batch: int, c: int, side: int):
    from tensorvm import te
    from tensorvm.codegen.lower import lower

    x = te.placeholder((batch, c, side, side), "float32", "x")
    s = te.placeholder((batch, c, 1, 1), "float32", "s")
    out = te.compute(x.shape, lambda n, k, h, w: x[n, k, h, w] * s[n, k, 0, 0], "se")
    return lower(name, [x, s], [out])


def _program(c: int, side: int):
    import tensorvm as tv

    return tv.parse(f'''#[version = "0.0.5"]
def @main(%x: Tensor[(?, {c}, {side}, {side}), float32], %s: Tensor[(?, {c}, 1, 1), float32]) {{
  multiply(%x, %s)
}}''')


def _onnx(c: int, side: int, batch: int):
    from onnx import TensorProto, helper

    graph = helper.make_graph([helper.make_node("Mul", ["x", "s"], ["y"])], "se",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, c, side, side]),
                               helper.make_tensor_value_info("s", TensorProto.FLOAT, [batch, c, 1, 1])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _interleaved(calls: dict, rounds: int) -> dict:
    """{name: (median, min) us of ``rounds`` interleaved calls} (``lone_layers.interleaved_times``)."""
    return {name: (statistics.median(v), min(v)) for name, v in interleaved_times(calls, rounds).items()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=300)
    parser.add_argument("--model", action="store_true", help="MobileNetV3-small's kernels instead of lone layers")
    args = parser.parse_args()
    if args.model:
        return _model(args)

    import onnxruntime as ort

    import tensorvm as tv
    from tensorvm.codegen.module import build_module

    tv.set_num_threads(args.threads)
    rng = np.random.default_rng(0)
    with _rows_only():
        old_funcs = [_kernel(f"rows_{c}_{side}", args.batch, c, side) for c, side in LAYERS]
    new_funcs = [_kernel(f"flat_{c}_{side}", args.batch, c, side) for c, side in LAYERS]
    for func, (c, side) in zip(new_funcs, LAYERS):  # the collapsed loop (static batch: every layer)
        assert f"for h_w in [0, {side * side}) vectorized" in str(func) or args.batch * c < 64, str(func)
    module = build_module(old_funcs + new_funcs)
    print(f"MobileNetV3-small's squeeze-excite multiplies, batch {args.batch}, {args.threads} thread(s), {args.rounds} "
          f"interleaved rounds; us per call, median (min)")
    print(f"  {'layer':10s} | {'kernel rows':>14s} {'kernel flat':>14s} {'flat/rows':>9s} | {'VM rows':>14s} "
          f"{'VM flat':>14s} {'onnxruntime':>14s}")
    totals: dict = {}
    for c, side in LAYERS:
        x = rng.standard_normal((args.batch, c, side, side)).astype(np.float32)
        s = rng.standard_normal((args.batch, c, 1, 1)).astype(np.float32)
        want = x * s
        calls, sources = {}, {}
        for kind in ("rows", "flat"):
            out = np.empty_like(x)
            fn = module[f"{kind}_{c}_{side}"]
            fn(x, s, out)
            np.testing.assert_array_equal(out, want)
            calls[f"kernel {kind}"] = lambda fn=fn, out=out, x=x, s=s: fn(x, s, out)
        for kind in ("rows", "flat"):
            if kind == "rows":
                with _rows_only():
                    exe = tv.vm.compile(_program(c, side), target="c")
            else:
                exe = tv.vm.compile(_program(c, side), target="c")
            sources[kind] = "".join(exe.kernel_source(p.name) for p in exe.primitives if "shape_func" not in p.name)
            vm = tv.vm.VirtualMachine(exe)
            np.testing.assert_array_equal(vm.invoke("main", x, s).numpy(), want)
            calls[f"VM {kind}"] = lambda vm=vm, x=x, s=s: vm.invoke("main", x, s)
        # (the program's batch is dynamic, as in the imported model: with fewer than MIN_PARALLEL_ROWS
        # channels the rows stay rows, and both VM columns run the same kernel)
        same = " same kernel" if sources["rows"] == sources["flat"] else ""
        session = ort.InferenceSession(_onnx(c, side, args.batch).SerializeToString(), ort_options(args.threads),
                                       providers=["CPUExecutionProvider"])
        calls["onnxruntime"] = lambda session=session, x=x, s=s: session.run(None, {"x": x, "s": s})
        result = _interleaved(calls, args.rounds)
        for name, (median, _) in result.items():
            totals[name] = totals.get(name, 0.0) + median

        def cell(name, result=result):
            return f"{result[name][0]:7.1f} ({result[name][1]:5.1f})"

        ratio = result["kernel flat"][0] / result["kernel rows"][0]
        print(f"  {f'{c}x{side}x{side}':10s} | {cell('kernel rows')} {cell('kernel flat')} {ratio:9.2f} | "
              f"{cell('VM rows')} {cell('VM flat')} {cell('onnxruntime')}{same}")
    print(f"  all layers (sum of medians): kernel rows {totals['kernel rows']:.0f} us, kernel flat "
          f"{totals['kernel flat']:.0f} us; VM rows {totals['VM rows']:.0f} us, VM flat {totals['VM flat']:.0f} us, "
          f"onnxruntime {totals['onnxruntime']:.0f} us")
    return 0


def _model(args) -> int:
    from compile_time import find_onnx
    from kernel_gap import model_feeds
    from models.common import import_from_onnx

    import tensorvm as tv

    path = find_onnx("mobilenetv3", None)
    if path is None:
        print("no ONNX export of mobilenetv3: run benchmarks/run.py --models mobilenetv3 first")
        return 1
    tv.set_num_threads(args.threads)
    shape, feeds = model_feeds("mobilenetv3", args.batch, 64)
    vms, outputs = {}, {}
    for kind in ("rows", "flat"):
        mod, params = import_from_onnx(path, shape=shape)
        if kind == "rows":
            with _rows_only():
                exe = tv.vm.compile(mod, target="c", params=params)
        else:
            exe = tv.vm.compile(mod, target="c", params=params)
        vms[kind] = tv.vm.VirtualMachine(exe)
        inputs = [feeds[p.name_hint] for p in mod["main"].params]
        outputs[kind] = vms[kind].invoke("main", *inputs).numpy()
    np.testing.assert_allclose(outputs["flat"], outputs["rows"], rtol=1e-5, atol=1e-5)
    times: dict = {(kind, what): [] for kind in vms for what in ("multiply", "all")}
    for round_ in range(args.rounds):
        for kind in ("rows", "flat") if round_ % 2 == 0 else ("flat", "rows"):
            rows = [r for r in vms[kind].profile("main", *inputs, warmup=1).rows if r.kind == "kernel"]
            times[(kind, "multiply")].append(sum(r.total_us for r in rows if r.name.startswith("fused_multiply")))
            times[(kind, "all")].append(sum(r.total_us for r in rows))
    med = {key: statistics.median(v) for key, v in times.items()}
    print(f"MobileNetV3-small, batch {args.batch}, {args.threads} thread(s), {args.rounds} alternating profiled "
          f"rounds; us, median")
    for what in ("multiply", "all"):
        label = "standalone multiply kernels" if what == "multiply" else "all kernels"
        print(f"  {label:28s} rows {med[('rows', what)]:9.0f}  flat {med[('flat', what)]:9.0f}  "
              f"flat/rows {med[('flat', what)] / med[('rows', what)]:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
