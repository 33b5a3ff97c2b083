"""Generated C kernels against NumPy, side by side, at 1 thread and at one thread per core.

    .venv/bin/python benchmarks/kernels.py            # both thread counts, ~1-2 minutes
    .venv/bin/python benchmarks/kernels.py --quick    # fewer sizes and repetitions
    .venv/bin/python benchmarks/kernels.py --json out.json

Sections:

1. Fused C kernel against NumPy op by op, at BERT sizes (seq x 768, FFN 3072, 12 heads): an elementwise
   chain (residual add, scale, bias), bias + GELU (tanh form), attention softmax and layer norm.
2. Dense: the generated ``nn.dense`` kernel against BLAS (``x @ w.T`` through NumPy) at several sizes,
   in GFLOP/s, with this machine's BLAS peak (a 2048^3 matmul) for scale.
3. Generic against specialized: the same kernels compiled with ``?`` dims (dims passed at run time) and
   with static shapes (dims are constants in the C code).
4. Compile time of the benchmark's library: cold (empty cache) and cached.
5. Call overhead of a tiny generated kernel from Python, against ``np.add(..., out=)``.

Each thread count runs in its own process with ``OMP_NUM_THREADS``/``OPENBLAS_NUM_THREADS``/
``TENSORVM_NUM_THREADS`` set before NumPy loads, so thread pools never compete across settings. Times are
medians of individually timed calls, C and NumPy interleaved round by round.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
THREAD_VARIABLES = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "TENSORVM_NUM_THREADS")


# ---- worker: runs in a process with a fixed thread count ------------------------------------------


def _worker(quick: bool) -> dict:
    sys.path.insert(0, str(ROOT))
    import numpy as np

    from tensorvm import op
    from tensorvm.codegen import build as build_mod
    from tensorvm.codegen.fused import build_fused_module
    from tensorvm.ir.expr import Function, Var, const
    from tensorvm.ir.types import Any, TensorType

    rng = np.random.default_rng(0)
    seqs = (128,) if quick else (128, 384)
    dense_sizes = [(1, 768, 768), (128, 768, 768)] if quick else \
        [(1, 768, 768), (32, 768, 768), (128, 768, 768), (128, 768, 3072), (512, 1024, 1024)]
    reps = 20 if quick else 60

    def fn(params, body):
        return Function(params, body, attrs={"Primitive": 1})

    def tensor(*shape, dynamic=True):
        return TensorType(tuple(Any() if dynamic and i == 0 else d for i, d in enumerate(shape)))

    prims, cases = {}, []

    # 1. fused vs op by op
    for seq in seqs:
        for dynamic in (True, False):
            tag = f"{seq}_{'dyn' if dynamic else 'static'}"
            x, y, b = Var("x", tensor(seq, 768, dynamic=dynamic)), Var("y", tensor(seq, 768, dynamic=dynamic)), \
                Var("b", TensorType((768,)))
            prims[f"chain_{tag}"] = fn([x, y, b], op.add(op.multiply(op.add(x, y), const(0.5)), b))
            h, hb = Var("h", tensor(seq, 3072, dynamic=dynamic)), Var("hb", TensorType((3072,)))
            prims[f"gelu_{tag}"] = fn([h, hb], op.nn.gelu(op.add(h, hb), approximate="tanh"))
            s = Var("s", TensorType((Any() if dynamic else 12, seq, seq)))
            prims[f"softmax_{tag}"] = fn([s], op.nn.softmax(s, axis=-1))
            g, beta = Var("g", TensorType((768,))), Var("beta", TensorType((768,)))
            prims[f"layer_norm_{tag}"] = fn([x, g, beta], op.nn.layer_norm(x, g, beta))
    # 2./3. dense, generic and specialized
    for m, k, n in dense_sizes:
        for dynamic in (True, False):
            xd = Var("x", TensorType((Any() if dynamic else m, k)))
            wd = Var("w", TensorType((n, k)))
            prims[f"dense_{m}x{k}x{n}_{'dyn' if dynamic else 'static'}"] = fn([xd, wd], op.nn.dense(xd, wd))
    for dynamic in (True, False):
        xc = Var("x", TensorType((1, 64, Any() if dynamic else 56, Any() if dynamic else 56)))
        wc = Var("w", TensorType((64, 64, 3, 3)))
        prims[f"conv_{'dyn' if dynamic else 'static'}"] = fn([xc, wc], op.nn.conv2d(xc, wc, padding=[1, 1]))

    xa, ya = Var("a", TensorType((Any(), 4))), Var("b", TensorType((Any(), 4)))
    prims["tiny_add"] = fn([xa, ya], op.add(xa, ya))

    # 4. compile time: cold in an empty cache, then cached
    with tempfile.TemporaryDirectory() as cache:
        os.environ["TENSORVM_CACHE_DIR"] = cache
        start = time.perf_counter()
        module, kernels = build_fused_module(prims)
        cold = time.perf_counter() - start
        start = time.perf_counter()
        module2, kernels = build_fused_module(prims)
        cached = time.perf_counter() - start
        compile_report = {"kernels": len(prims), "c_lines": module.source.count("\n"),
                          "cold_s": cold, "compiler_s": module.build_info.compile_seconds,
                          "cached_s": cached, "cache_hit": module2.build_info.cached,
                          "flags": " ".join(module.build_info.flags)}

    def timed(calls: dict) -> dict:
        """Median seconds per call of each callable, interleaved round by round."""
        samples = {name: [] for name in calls}
        for f in calls.values():
            f()
        for _ in range(reps):
            for name, f in calls.items():
                start = time.perf_counter()
                f()
                samples[name].append(time.perf_counter() - start)
        return {name: float(np.median(v)) for name, v in samples.items()}

    def check(got, expected, what, tol=2e-3):
        err = float(np.max(np.abs(got - expected))) if got.size else 0.0
        if not err <= tol * max(1.0, float(np.max(np.abs(expected)))):
            raise AssertionError(f"{what}: max error {err}")

    def fused_section(seq: int):
        x = rng.standard_normal((seq, 768)).astype("float32")
        y = rng.standard_normal((seq, 768)).astype("float32")
        b = rng.standard_normal(768).astype("float32")
        h = rng.standard_normal((seq, 3072)).astype("float32")
        hb = rng.standard_normal(3072).astype("float32")
        s = rng.standard_normal((12, seq, seq)).astype("float32")
        g = rng.standard_normal(768).astype("float32")
        out768, out3072, outs = np.empty_like(x), np.empty_like(h), np.empty_like(s)

        def np_chain():
            return (x + y) * np.float32(0.5) + b

        def np_gelu():
            v = h + hb
            return np.float32(0.5) * v * (np.float32(1) + np.tanh(np.float32(math.sqrt(2 / math.pi))
                                                                  * (v + np.float32(0.044715) * v * v * v)))

        def np_softmax():
            e = np.exp(s - s.max(-1, keepdims=True))
            return e / e.sum(-1, keepdims=True)

        def np_layer_norm():
            mean = x.mean(-1, keepdims=True)
            centered = x - mean
            return centered / np.sqrt((centered * centered).mean(-1, keepdims=True) + np.float32(1e-5)) * g + b

        groups = {
            "chain (x+y)*0.5+b": (lambda t: kernels[f"chain_{seq}_{t}"](x, y, b, out768), np_chain, out768),
            "bias+gelu (tanh)": (lambda t: kernels[f"gelu_{seq}_{t}"](h, hb, out3072), np_gelu, out3072),
            "softmax 12 heads": (lambda t: kernels[f"softmax_{seq}_{t}"](s, outs), np_softmax, outs),
            "layer_norm": (lambda t: kernels[f"layer_norm_{seq}_{t}"](x, g, b, out768), np_layer_norm, out768),
        }
        for label, (c_call, np_call, out) in groups.items():
            c_call("dyn")
            check(out, np_call(), f"{label} seq {seq}")
            t = timed({"c_dyn": lambda c=c_call: c("dyn"), "c_static": lambda c=c_call: c("static"),
                       "numpy": np_call})
            cases.append({"section": "fused", "name": f"{label} [{seq}]", **t})

    for seq in seqs:
        fused_section(seq)

    # call overhead: a 4-element add, against np.add with out=
    small = [np.ones((1, 4), "float32") for _ in range(3)]
    overhead_reps = 2000
    tiny = kernels["tiny_add"]
    start = time.perf_counter()
    for _ in range(overhead_reps):
        tiny(*small)
    c_overhead = (time.perf_counter() - start) / overhead_reps
    start = time.perf_counter()
    for _ in range(overhead_reps):
        np.add(small[0], small[1], out=small[2])
    np_overhead = (time.perf_counter() - start) / overhead_reps

    blas_peak_n = 1024 if quick else 2048
    a = rng.standard_normal((blas_peak_n, blas_peak_n)).astype("float32")
    peak_t = timed({"blas": lambda: a @ a})["blas"]
    blas_peak = 2 * blas_peak_n ** 3 / peak_t / 1e9
    for m, k, n in dense_sizes:
        xd = rng.standard_normal((m, k)).astype("float32")
        wd = rng.standard_normal((n, k)).astype("float32") * 0.05
        out = np.empty((m, n), "float32")
        name = f"dense_{m}x{k}x{n}"
        kernels[f"{name}_dyn"](xd, wd, out)
        check(out, xd @ wd.T, name)
        t = timed({"c_dyn": lambda nm=name, xd=xd, wd=wd, out=out: kernels[f"{nm}_dyn"](xd, wd, out),
                   "c_static": lambda nm=name, xd=xd, wd=wd, out=out: kernels[f"{nm}_static"](xd, wd, out),
                   "numpy": lambda xd=xd, wd=wd: xd @ wd.T})
        flops = 2 * m * k * n
        cases.append({"section": "dense", "name": f"{m}x{k}x{n}", **t,
                      "gflops_c": flops / t["c_dyn"] / 1e9, "gflops_blas": flops / t["numpy"] / 1e9})
    xc = rng.standard_normal((1, 64, 56, 56)).astype("float32")
    wc = rng.standard_normal((64, 64, 3, 3)).astype("float32") * 0.05
    outc = np.empty((1, 64, 56, 56), "float32")
    t = timed({"c_dyn": lambda: kernels["conv_dyn"](xc, wc, outc), "c_static": lambda: kernels["conv_static"](xc, wc, outc)})
    cases.append({"section": "generic", "name": "conv2d 1x64x56x56, 3x3", **t,
                  "gflops_c": 2 * 64 * 64 * 9 * 56 * 56 / t["c_dyn"] / 1e9})
    return {"threads": os.environ.get("TENSORVM_NUM_THREADS"), "blas_peak_gflops": blas_peak,
            "call_overhead_us": {"c_kernel": c_overhead * 1e6, "np_add": np_overhead * 1e6},
            "compile": compile_report, "cases": cases, "build_stats": {
                k: v for k, v in build_mod.build_stats().items() if k != "history"}}


# ---- orchestrator -----------------------------------------------------------------------------------


def _run_worker(threads: int, quick: bool) -> dict:
    env = dict(os.environ)
    for name in THREAD_VARIABLES:
        env[name] = str(threads)
    command = [sys.executable, __file__, "--worker"] + (["--quick"] if quick else [])
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=1800)
    if result.returncode != 0:
        raise SystemExit(f"worker with {threads} thread(s) failed:\n{result.stderr}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def _us(seconds: float) -> str:
    return f"{seconds * 1e6:,.0f}"


def _report(runs: dict) -> str:
    lines = []
    first = next(iter(runs.values()))
    c = first["compile"]
    lines += ["## Compile time of the benchmark library", "",
              f"{c['kernels']} kernels, {c['c_lines']:,} lines of C: cold build {c['cold_s']:.2f} s "
              f"(compiler {c['compiler_s']:.2f} s), cached {c['cached_s'] * 1e3:.0f} ms "
              f"(cache hit: {c['cache_hit']}). Flags: `{c['flags']}`", ""]
    lines += ["## Call overhead (a 4-element add, us per call)", ""]
    for threads, run in runs.items():
        o = run["call_overhead_us"]
        lines.append(f"- {threads} thread(s): generated kernel {o['c_kernel']:.2f} us, np.add(out=) {o['np_add']:.2f} us")
    lines += ["", "## Fused C kernel vs NumPy op by op (median us per call)", "",
              "| kernel | threads | C generic | C static | NumPy | speedup |", "|---|---|---|---|---|---|"]
    for threads, run in runs.items():
        for case in run["cases"]:
            if case["section"] == "fused":
                lines.append(f"| {case['name']} | {threads} | {_us(case['c_dyn'])} | {_us(case['c_static'])} | "
                             f"{_us(case['numpy'])} | {case['numpy'] / case['c_dyn']:.1f}x |")
    lines += ["", "## Dense: generated C vs BLAS through NumPy", ""]
    for threads, run in runs.items():
        lines.append(f"BLAS peak ({threads} thread(s), 2048^3 or 1024^3 matmul): "
                     f"{run['blas_peak_gflops']:.1f} GFLOP/s")
    lines += ["", "| M x K x N | threads | C generic us | C static us | BLAS us | C GFLOP/s | BLAS GFLOP/s | "
              "C / peak |", "|---|---|---|---|---|---|---|---|"]
    for threads, run in runs.items():
        for case in run["cases"]:
            if case["section"] == "dense":
                lines.append(f"| {case['name']} | {threads} | {_us(case['c_dyn'])} | {_us(case['c_static'])} | "
                             f"{_us(case['numpy'])} | {case['gflops_c']:.1f} | {case['gflops_blas']:.1f} | "
                             f"{case['gflops_c'] / run['blas_peak_gflops']:.0%} |")
    lines += ["", "## Generic (? dims) vs specialized (static) kernels (median us per call)", "",
              "| kernel | threads | generic | specialized | generic / specialized |", "|---|---|---|---|---|"]
    for threads, run in runs.items():
        for case in run["cases"]:
            lines.append(f"| {case['section']}: {case['name']} | {threads} | {_us(case['c_dyn'])} | "
                         f"{_us(case['c_static'])} | {case['c_dyn'] / case['c_static']:.2f} |")
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--threads", default="1,max", help="thread counts, e.g. 1,2 (max: one per core)")
    parser.add_argument("--json", help="also write the raw results here")
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(_worker(args.quick)))
        return
    counts = [os.cpu_count() or 1 if t == "max" else int(t) for t in args.threads.split(",")]
    runs = {}
    for threads in dict.fromkeys(counts):
        runs[threads] = _run_worker(threads, args.quick)
    print(_report(runs))
    if args.json:
        Path(args.json).write_text(json.dumps(runs, indent=1))


if __name__ == "__main__":
    main()
