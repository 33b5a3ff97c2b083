"""Generated C kernels against NumPy, side by side, at 1 thread and at one thread per core.

    .venv/bin/python benchmarks/kernels.py            # both thread counts, ~1-2 minutes
    .venv/bin/python benchmarks/kernels.py --quick    # fewer sizes and repetitions
    .venv/bin/python benchmarks/kernels.py --json out.json

Sections:

1. Fused C kernel against NumPy op by op, at BERT sizes (seq x 768, FFN 3072, 12 heads): an elementwise
   chain (residual add, scale, bias), bias + GELU (tanh form), attention softmax and layer norm.
2. Dense: the generated ``nn.dense`` kernel against BLAS (``x @ w.T`` through NumPy) at several sizes,
   in GFLOP/s, with this machine's BLAS peak (a 2048^3 matmul) for scale.
   Each size also runs the *dispatched* kernel (``tensorvm.codegen.strategy``: BLAS from
   ``rules().blas_min_flops`` multiply-adds and ``rules().blas_min_rows`` rows, else C) and names the variant it chose,
   so the threshold can be checked against the two columns it chooses between.
3. Generic against specialized: the same kernels compiled with ``?`` dims (dims passed at run time) and
   with static shapes (dims are constants in the C code); a fully dynamic dense (every dim ``?``) as the
   generic kernel and as its vector-friendly variant (N a multiple of 8, K of 16); a softmax and a
   layer norm over a named hidden dim ``h``, generic and with the static variant ``specialize(h=[768])``
   chosen at run time by the kernel's dispatch function.
4. Compile time of the benchmark's library: cold (empty cache) and cached.
5. Call overhead of a tiny generated kernel from Python, against ``np.add(..., out=)``, and the cost of
   dispatching: a kernel with C variants (its dispatch function) against the same kernel without, and the
   Python dispatcher of a kernel with a BLAS variant on its C path and on its BLAS path.
6. With several threads: a generated layer norm interleaved with a 128x768x768 BLAS product, BLAS on its
   own threads against BLAS on the calling thread only (what the dispatcher does when kernels are
   parallel), to show how the two thread pools interact.

Each thread count runs in its own process with ``OMP_NUM_THREADS``/``OPENBLAS_NUM_THREADS``/
``TENSORVM_NUM_THREADS`` set before NumPy loads, so thread pools never compete across settings. Times are
medians of individually timed calls, C and NumPy interleaved round by round.
"""

from __future__ import annotations

import argparse
import contextlib
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
    from tensorvm.codegen import strategy
    from tensorvm.codegen.fused import build_fused_module
    from tensorvm.ir.expr import Function, Var, const
    from tensorvm.ir.types import Any, SymDim, TensorType

    rng = np.random.default_rng(0)
    seqs = (128,) if quick else (128, 384)
    dense_sizes = [(1, 768, 768), (8, 256, 256), (128, 768, 768)] if quick else \
        [(1, 768, 768), (4, 768, 768), (8, 768, 768), (16, 64, 64), (8, 256, 256), (32, 768, 768), (64, 64, 64),
         (128, 768, 768), (128, 768, 3072), (512, 1024, 1024)]
    dyn_sizes = [(8, 256, 256), (64, 128, 128)] if quick else [(4, 256, 256), (8, 256, 256), (16, 512, 512),
                                                              (64, 128, 128), (128, 768, 768)]
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
    # 3. fully dynamic dense (generic and its vector variant), named hidden dim (generic and static)
    xf, wf = Var("x", TensorType((Any(), Any()))), Var("w", TensorType((Any(), Any())))
    prims["dense_fulldyn"] = fn([xf, wf], op.nn.dense(xf, wf))
    h = SymDim("h")
    xh, gh, bh = Var("x", TensorType((Any(), h))), Var("g", TensorType((h,))), Var("b", TensorType((h,)))
    prims["layer_norm_h"] = fn([xh, gh, bh], op.nn.layer_norm(xh, gh, bh))
    sh = Var("s", TensorType((Any(), h)))
    prims["softmax_h"] = fn([sh], op.nn.softmax(sh, axis=-1))
    generic_only = {"dense_fulldyn", "layer_norm_h", "softmax_h", "tiny_dense"}
    xt, wt = Var("x", TensorType((Any(), Any()))), Var("w", TensorType((Any(), Any())))
    prims["tiny_dense"] = fn([xt, wt], op.nn.dense(xt, wt))

    # 4. compile time: cold in an empty cache, then cached
    with tempfile.TemporaryDirectory() as cache:
        os.environ["TENSORVM_CACHE_DIR"] = cache
        start = time.perf_counter()
        with strategy.specialize(h=[768]):
            module, kernels = build_fused_module(prims)
        cold = time.perf_counter() - start
        start = time.perf_counter()
        with strategy.specialize(h=[768]):
            module2, kernels = build_fused_module(prims)
        cached = time.perf_counter() - start
        _, generic = build_fused_module({k: prims[k] for k in generic_only}, strategies=False)
        compile_report = {"kernels": len(prims), "c_lines": module.source.count("\n"),
                          "cold_s": cold, "compiler_s": module.build_info.compile_seconds,
                          "cached_s": cached, "cache_hit": module2.build_info.cached,
                          "flags": " ".join(module.build_info.flags)}

    def c_of(kernel):
        """The generated C kernel itself (behind a BLAS dispatcher, if any)."""
        return kernel.kernel if isinstance(kernel, strategy.DispatchKernel) else kernel

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

    def blas_as_dispatched(x, w, out):
        with strategy.blas_single_thread() if build_mod.kernel_threads() > 1 else contextlib.nullcontext():
            np.matmul(x, w.T, out=out)

    def per_call(f, reps=overhead_reps * 2):
        f()
        best = math.inf
        for _ in range(3):
            start = time.perf_counter()
            for _ in range(reps):
                f()
            best = min(best, (time.perf_counter() - start) / reps)
        return best

    xs, ws, outs = (np.ones(s, "float32") for s in ((2, 16), (8, 16), (2, 8)))
    with_variants, without = kernels["tiny_dense"], generic["tiny_dense"]
    xb, wb, outb = (np.ones(s, "float32") for s in ((64, 64), (64, 64), (64, 64)))
    dispatch = {
        "c_without_variants_us": per_call(lambda: without(xs, ws, outs)) * 1e6,
        "c_with_dispatch_function_us": per_call(lambda: with_variants.kernel(xs, ws, outs)) * 1e6,
        "python_dispatcher_c_path_us": per_call(lambda: with_variants(xs, ws, outs)) * 1e6,
        "blas_direct_64_us": per_call(lambda: blas_as_dispatched(xb, wb, outb), 500) * 1e6,
        "python_dispatcher_blas_path_64_us": per_call(lambda: with_variants(xb, wb, outb), 500) * 1e6,
        "chosen_small": with_variants.select_variant(xs, ws, outs),
        "chosen_64": with_variants.select_variant(xb, wb, outb),
    }

    # BLAS on its own threads runs last (phase B): its worker threads keep spinning after each call and
    # would slow down the OpenMP kernels measured after it. Until then BLAS runs as the dispatcher runs it.
    blas_own_threads = []
    for m, k, n in dense_sizes:
        xd = rng.standard_normal((m, k)).astype("float32")
        wd = rng.standard_normal((n, k)).astype("float32") * 0.05
        out = np.empty((m, n), "float32")
        name = f"dense_{m}x{k}x{n}"
        kernels[f"{name}_dyn"](xd, wd, out)
        check(out, xd @ wd.T, name)
        dispatched = kernels[f"{name}_dyn"]
        c_dyn, c_static = c_of(dispatched), c_of(kernels[f"{name}_static"])
        t = timed({"c_dyn": lambda c=c_dyn, xd=xd, wd=wd, out=out: c(xd, wd, out),
                   "c_static": lambda c=c_static, xd=xd, wd=wd, out=out: c(xd, wd, out),
                   "dispatched": lambda d=dispatched, xd=xd, wd=wd, out=out: d(xd, wd, out)})
        flops = 2 * m * k * n
        case = {"section": "dense", "name": f"{m}x{k}x{n}", **t, "chosen": dispatched.select_variant(xd, wd, out),
                "gflops_c": flops / t["c_dyn"] / 1e9, "gflops_dispatched": flops / t["dispatched"] / 1e9}
        cases.append(case)
        blas_own_threads.append((case, flops, lambda xd=xd, wd=wd, out=out: np.matmul(xd, wd.T, out=out)))
    variant_kernel = kernels["dense_fulldyn"]
    for m, k, n in dyn_sizes:
        xd = rng.standard_normal((m, k)).astype("float32")
        wd = rng.standard_normal((n, k)).astype("float32") * 0.05
        out = np.empty((m, n), "float32")
        variant_kernel.kernel(xd, wd, out)
        check(out, xd @ wd.T, f"dense_fulldyn {m}x{k}x{n}")
        t = timed({"c_dyn": lambda xd=xd, wd=wd, out=out: generic["dense_fulldyn"](xd, wd, out),
                   "c_static": lambda xd=xd, wd=wd, out=out: variant_kernel.kernel(xd, wd, out)})
        case = {"section": "variant", "name": f"dense all-? {m}x{k}x{n}: generic vs "
                f"{variant_kernel.kernel.select_variant(xd, wd, out)}", **t, "gflops_c": 2 * m * k * n / t["c_static"] / 1e9}
        cases.append(case)
        blas_own_threads.append((case, 2 * m * k * n, lambda xd=xd, wd=wd, out=out: np.matmul(xd, wd.T, out=out)))
    for label, rows in (("layer_norm", 128), ("softmax", 128 * 12)):
        x = rng.standard_normal((rows, 768)).astype("float32")
        g, b = rng.standard_normal(768).astype("float32"), rng.standard_normal(768).astype("float32")
        out = np.empty_like(x)
        args = (x, g, b, out) if label == "layer_norm" else (x, out)
        special, plain = kernels[f"{label}_h"], generic[f"{label}_h"]
        special(*args)
        expected = out.copy()
        plain(*args)
        check(out, expected, f"{label}_h")
        t = timed({"c_dyn": lambda k=plain, a=args: k(*a), "c_static": lambda k=special, a=args: k(*a)})
        cases.append({"section": "variant", "name": f"{label} {rows}x768 over h: generic vs "
                      f"{special.select_variant(*args)}", **t})
    xc = rng.standard_normal((1, 64, 56, 56)).astype("float32")
    wc = rng.standard_normal((64, 64, 3, 3)).astype("float32") * 0.05
    outc = np.empty((1, 64, 56, 56), "float32")
    t = timed({"c_dyn": lambda: kernels["conv_dyn"](xc, wc, outc), "c_static": lambda: kernels["conv_static"](xc, wc, outc)})
    cases.append({"section": "generic", "name": "conv2d 1x64x56x56, 3x3", **t,
                  "gflops_c": 2 * 64 * 64 * 9 * 56 * 56 / t["c_dyn"] / 1e9})
    pools = {}
    if build_mod.kernel_threads() > 1:
        xl = rng.standard_normal((128, 768)).astype("float32")
        gl, bl = np.ones(768, "float32"), np.zeros(768, "float32")
        outl, wl, dl = np.empty_like(xl), rng.standard_normal((768, 768)).astype("float32"), np.empty((128, 768), "float32")
        layer_norm = kernels["layer_norm_128_dyn"]

        def single_thread_blas():
            with strategy.blas_single_thread():
                np.matmul(xl, wl.T, out=dl)

        pools["layer_norm_alone"] = timed({"layer_norm": lambda: layer_norm(xl, gl, bl, outl)})["layer_norm"] * 1e6
        for label, blas_call in (("calling thread", single_thread_blas),
                                 ("own threads", lambda: np.matmul(xl, wl.T, out=dl))):  # last: it lingers
            t = timed({"layer_norm": lambda: layer_norm(xl, gl, bl, outl), "blas": blas_call})
            pools[label] = {k: v * 1e6 for k, v in t.items()}
    # phase B: BLAS on its own threads
    blas_peak_n = 1024 if quick else 2048
    a = rng.standard_normal((blas_peak_n, blas_peak_n)).astype("float32")
    peak_t = timed({"blas": lambda: a @ a})["blas"]
    blas_peak = 2 * blas_peak_n ** 3 / peak_t / 1e9
    for case, flops, blas_call in blas_own_threads:
        case["numpy"] = timed({"blas": blas_call})["blas"]
        case["gflops_blas"] = flops / case["numpy"] / 1e9
    return {"threads": os.environ.get("TENSORVM_NUM_THREADS"), "blas_peak_gflops": blas_peak, "pools": pools,
            "call_overhead_us": {"c_kernel": c_overhead * 1e6, "np_add": np_overhead * 1e6},
            "dispatch": dispatch, "blas_min_flops": strategy.rules().blas_min_flops, "blas_min_rows": strategy.rules().blas_min_rows,
            "blas_thread_factor": strategy.rules().blas_thread_factor,
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
    lines += ["", "## Dispatch overhead (us per call, best of 3 loops)", ""]
    for threads, run in runs.items():
        d = run["dispatch"]
        lines.append(f"- {threads} thread(s): dense 2x16x8 without variants {d['c_without_variants_us']:.2f}, "
                     f"with its C dispatch function ({d['chosen_small']}) {d['c_with_dispatch_function_us']:.2f}, "
                     f"through the Python dispatcher (C path) {d['python_dispatcher_c_path_us']:.2f}; 64x64x64: "
                     f"np.matmul(out=) as the dispatcher calls it {d['blas_direct_64_us']:.2f}, dispatcher ({d['chosen_64']}) "
                     f"{d['python_dispatcher_blas_path_64_us']:.2f}")
    for threads, run in runs.items():
        if run.get("pools"):
            p = run["pools"]
            lines += ["", f"## Thread pools ({threads} threads): a 128x768 layer norm next to a 128x768x768 BLAS product",
                      "", f"- layer norm alone: {p['layer_norm_alone']:.0f} us",
                      f"- BLAS on its own threads: layer norm {p['own threads']['layer_norm']:.0f} us, BLAS "
                      f"{p['own threads']['blas']:.0f} us",
                      f"- BLAS on the calling thread: layer norm {p['calling thread']['layer_norm']:.0f} us, BLAS "
                      f"{p['calling thread']['blas']:.0f} us"]
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
    lines += ["", f"Dispatch rule (static K, N): BLAS from {first['blas_min_flops']:,} multiply-adds (x{first['blas_thread_factor']} "
              f"per extra kernel thread) and {first['blas_min_rows']} rows; with parallel kernels BLAS runs on the "
              "calling thread only. "
              "*dispatched*: the kernel with its BLAS variant, as the VM would call it.", "",
              "| M x K x N | threads | C generic us | C static us | BLAS us | dispatched us (variant) | C GFLOP/s | "
              "BLAS GFLOP/s | C / peak | BLAS / peak |", "|---|---|---|---|---|---|---|---|---|---|"]
    for threads, run in runs.items():
        peak = run["blas_peak_gflops"]
        for case in run["cases"]:
            if case["section"] == "dense":
                lines.append(f"| {case['name']} | {threads} | {_us(case['c_dyn'])} | {_us(case['c_static'])} | "
                             f"{_us(case['numpy'])} | {_us(case['dispatched'])} ({case['chosen']}) | "
                             f"{case['gflops_c']:.1f} | {case['gflops_blas']:.1f} | {case['gflops_c'] / peak:.0%} | "
                             f"{case['gflops_blas'] / peak:.0%} |")
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
