"""Generated elementwise kernels with dynamic (``?``) dims: does gcc vectorize their inner loops, and how fast
are they, with and without the loop optimizations of ``tensorvm.codegen.hoist`` (invariant checks hoisted
out of inner loops, broadcast reads unswitched into affine copies).

    .venv/bin/python benchmarks/elementwise_dynamic.py             # vectorization report + timings
    .venv/bin/python benchmarks/elementwise_dynamic.py --quick     # fewer repetitions

Kernels (every dim a ``?`` symbol, as an ONNX model with dynamic axes gives them):

* ``gate``: ``sigmoid(a + b) * c`` with NumPy broadcasting between three operands (a GRU/LSTM gate);
* ``take_scale``: ``data[idx[i], j] * w[j] + bias[j]`` with the fast index check (an embedding or a
  recurrent loop reading its row, then a scale);
* ``layer_norm``: over a 384-wide row, a dynamic number of rows, with broadcast gamma and beta.

"vectorized" counts gcc's ``-fopt-info-vec-optimized`` reports of loops inside each kernel against the
kernel's ``omp simd`` loops. "before" is the same lowering with ``hoist.optimize_loops`` replaced by the
identity. Times are medians of individually timed calls from Python (a call costs ~1 us on its own).
"""

from __future__ import annotations

import argparse
import importlib
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tensorvm import te  # noqa: E402
from tensorvm.codegen.build import find_toolchain  # noqa: E402
from tensorvm.codegen.c_emit import emit_kernel, emit_library  # noqa: E402
from tensorvm.codegen.module import build_module  # noqa: E402
from tensorvm.op._compute import broadcast_read, broadcast_shape  # noqa: E402

lower_module = importlib.import_module("tensorvm.codegen.lower")


def gate_kernel():
    n, m, p, q, r, s = (te.var(x) for x in "nmpqrs")
    a, b, c = (te.placeholder(shape, "float32", name) for shape, name in (((n, m), "a"), ((p, q), "b"), ((r, s), "c")))
    shape, requires = broadcast_shape("gate", a.shape, b.shape, c.shape)
    out = te.compute(shape, lambda i, j: te.sigmoid(broadcast_read(a, (i, j), shape) + broadcast_read(b, (i, j), shape))
                     * broadcast_read(c, (i, j), shape), "gate", requires)
    return "gate", [a, b, c], [out]


def take_kernel():
    n, d, k = te.var("n"), te.var("d"), te.var("k")
    data, idx = te.placeholder((n, d), "float32", "data"), te.placeholder((k,), "int64", "idx")
    w, bias = te.placeholder((d,), "float32", "w"), te.placeholder((d,), "float32", "bias")
    out = te.compute((k, d), lambda i, j: data[te.index_check(idx[i], n), j] * w[j] + bias[j], "take_scale")
    return "take_scale", [data, idx, w, bias], [out]


def layer_norm_kernel(width=384):
    rows, h = te.var("rows"), te.var("h")
    x = te.placeholder((rows, width), "float32", "x")
    gamma, beta = te.placeholder((h,), "float32", "gamma"), te.placeholder((h,), "float32", "beta")
    k1, k2 = te.reduce_axis(width, "k1"), te.reduce_axis(width, "k2")
    total = te.compute((rows,), lambda i: te.sum(x[i, k1], axis=k1), "total")
    mean = te.compute((rows,), lambda i: total[i] / float(width), "mean")
    sq = te.compute((rows,), lambda i: te.sum((x[i, k2] - mean[i]) * (x[i, k2] - mean[i]), axis=k2), "sq")
    var = te.compute((rows,), lambda i: sq[i] / float(width), "var")
    out = te.compute((rows, width), lambda i, j: (x[i, j] - mean[i]) / te.sqrt(var[i] + 1e-5)
                     * gamma[te.select(te.eq(h, 1), 0, j)] + beta[te.select(te.eq(h, 1), 0, j)], "layer_norm",
                     [(te.logical_or(te.eq(h, 1), te.eq(h, width)), "gamma must broadcast")])
    return "layer_norm", [x, gamma, beta], [out]


KERNELS = [gate_kernel, take_kernel, layer_norm_kernel]


def _cases(rng):
    f = np.float32

    def r(*shape):
        return rng.standard_normal(shape).astype(f)

    return {
        "gate": [("(1,384)x3, GRU step", (r(1, 384), r(1, 384), r(1, 384))),
                 ("(64,384)x3", (r(64, 384), r(64, 384), r(64, 384))),
                 ("(64,384)+(1,384)*(64,1)", (r(64, 384), r(1, 384), r(64, 1)))],
        "take_scale": [("64 rows of (1000,384)", (r(1000, 384), rng.integers(-1000, 1000, 64), r(384), r(384))),
                       ("1 row of (1000,384)", (r(1000, 384), rng.integers(0, 1000, 1), r(384), r(384)))],
        "layer_norm": [("(128,384)", (r(128, 384), r(384), r(384))), ("(8,384)", (r(8, 384), r(384), r(384)))],
    }


def lower_all(optimize: bool):
    saved = lower_module.optimize_loops
    if not optimize:
        lower_module.optimize_loops = lambda stmt: stmt
    try:
        return [lower_module.lower(name, inputs, outputs) for name, inputs, outputs in (k() for k in KERNELS)]
    finally:
        lower_module.optimize_loops = saved


def vectorization_report(funcs) -> dict:
    """{kernel: (omp simd loops, loops gcc reports vectorized)} from ``-fopt-info-vec-optimized``."""
    toolchain = find_toolchain()
    emitted = [emit_kernel(f) for f in funcs]
    source = emit_library(emitted)
    flags = [f for f in toolchain.flags if f != "-shared"]
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "kernels.c"
        path.write_text(source)
        proc = subprocess.run([toolchain.compiler, *flags, "-c", "-fopt-info-vec-optimized", str(path),
                               "-o", str(Path(tmp) / "kernels.o")], capture_output=True, text=True, check=True)
    lines = source.splitlines()
    starts = sorted((next(i for i, line in enumerate(lines, 1) if re.match(rf"\w+ {k.name}\(", line)), k.name)
                    for k in emitted)
    vectorized = [int(m.group(1)) for m in re.finditer(r"kernels\.c:(\d+):\d+: optimized: loop vectorized",
                                                       proc.stdout + proc.stderr)]
    report = {}
    for (start, name), nxt in zip(starts, [s for s, _ in starts[1:]] + [len(lines) + 1]):
        body = lines[start - 1:nxt - 1]
        simd = sum("#pragma omp simd" in line for line in body)
        report[name] = (simd, len({v for v in vectorized if start <= v < nxt}))
    return report


def median_us(fn, repeats: int) -> float:
    for _ in range(min(repeats, 20)):
        fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return float(np.median(times)) * 1e6


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    repeats = 100 if args.quick else 1000
    before, after = lower_all(False), lower_all(True)
    print("gcc -fopt-info-vec: omp simd loops vectorized per kernel (before -> after)")
    rb, ra = vectorization_report(before), vectorization_report(after)
    for name in ra:
        print(f"  {name:12s} {rb[name][1]}/{rb[name][0]} -> {ra[name][1]}/{ra[name][0]}")
    mod_b, mod_a = build_module(before), build_module(after)
    print("\nmedian call time, us (before -> after), checked equal")
    for name, cases in _cases(np.random.default_rng(0)).items():
        for label, inputs in cases:
            outs = []
            for mod in (mod_b, mod_a):
                out = _output_for(name, inputs)
                mod[name](*inputs, out)
                outs.append(out)
            np.testing.assert_allclose(outs[0], outs[1], rtol=1e-5, atol=1e-5)
            tb = median_us(lambda k=mod_b[name], o=outs[0], x=inputs: k(*x, o), repeats)
            ta = median_us(lambda k=mod_a[name], o=outs[1], x=inputs: k(*x, o), repeats)
            print(f"  {name:12s} {label:28s} {tb:8.1f} -> {ta:8.1f}  ({tb / ta:.1f}x)")


def _output_for(name, inputs):
    if name == "gate":
        return np.empty(np.broadcast_shapes(*(x.shape for x in inputs)), "float32")
    if name == "take_scale":
        return np.empty((len(inputs[1]), inputs[0].shape[1]), "float32")
    return np.empty_like(inputs[0])


if __name__ == "__main__":
    main()
