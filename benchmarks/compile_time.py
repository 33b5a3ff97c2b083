"""Compile time of the corpus's CNNs for target "c": cold (an empty kernel cache, in a fresh process),
cached in a new process (the kernel libraries on disk; lowering runs again) and cached in the same
process (a fresh ONNX import compiled again: the kernel memo of ``tensorvm.codegen.signature`` skips
lowering and C emission), with where the time goes (VM lowering, kernel lowering, C compiler).
``--wrappers`` compares the call cost of a kernel's Python wrapper built at -O1 (what ``codegen.module``
uses) and -O3, interleaved in one process. ``--native`` does the same for the native exec mode's program
(``codegen.module.NATIVE_FLAGS``) on the corpus's GRU: its C compiler time and its latency per call at
-O1 and -O3, each cold in a fresh kernel cache, the calls interleaved.

    .venv/bin/python benchmarks/compile_time.py                     # resnet18 mobilenetv3 ssdlite gru
    .venv/bin/python benchmarks/compile_time.py mobilenetv3 --rounds 3
    .venv/bin/python benchmarks/compile_time.py gru                 # the BiGRU in native exec mode
    .venv/bin/python benchmarks/compile_time.py --wrappers
    .venv/bin/python benchmarks/compile_time.py --native

The ONNX files are the corpus's exports in the benchmark cache (``benchmarks/run.py`` makes them:
``$TENSORVM_BENCH_CACHE``, default ``~/.cache/tensorvm-bench``), or ``--onnx-dir`` with ``<key>.onnx``.
Timings depend on the load of the machine: compare columns measured in the same run.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHAPES = {"resnet18": {"images": [None, 3, 224, 224]}, "mobilenetv3": {"images": [None, 3, 224, 224]},
          "ssdlite": {"images": [1, 3, 320, 320]}, "gru": {"x": [None, None, 64]}}
EXEC_MODES = {"gru": "native"}  # (the corpus measures the BiGRU in native mode too; its program is the big unit)


def find_onnx(key: str, onnx_dir: str | None) -> Path | None:
    if onnx_dir:
        path = Path(onnx_dir) / f"{key}.onnx"
        return path if path.exists() else None
    cache = Path(os.environ.get("TENSORVM_BENCH_CACHE") or Path.home() / ".cache" / "tensorvm-bench")
    found = sorted(cache.glob(f"corpus-{key}-*/{key}.onnx"), key=lambda p: p.stat().st_mtime)
    return found[-1] if found else None


_PREIMPORTED = ("tensorvm.transform.vm_pipeline", "tensorvm.vm.codegen", "tensorvm.codegen.fused",
                "tensorvm.codegen.strategy", "tensorvm.vm.kernel_c", "tensorvm.vm.shape_c", "tensorvm.vm.fastcall")


def _children_cpu() -> float:
    """CPU seconds of this process's finished children (the compiler runs): robust to the machine's load."""
    import resource

    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def child(key: str, path: str, twice: bool) -> dict:
    """One process: import, compile (and, with ``twice``, import and compile again)."""
    import importlib

    import onnx

    import tensorvm as tv
    import tensorvm.frontend  # noqa: F401
    from tensorvm.codegen.build import build_stats, find_toolchain

    for name in _PREIMPORTED:  # (importing is not compiling; without .pyc files it costs ~1 s here)
        importlib.import_module(name)
    start = time.perf_counter()
    find_toolchain()  # (probed once per cache directory: part of a cold start)
    result = {"probe_s": time.perf_counter() - start}
    for label in ("first", "second") if twice else ("first",):
        mod, params = tv.frontend.from_onnx(onnx.load(path), shape=SHAPES[key])
        before = build_stats()["compile_seconds"]
        cpu_before = _children_cpu()
        start = time.perf_counter()
        exe = tv.vm.compile(mod, target="c", params=params, exec_mode=EXEC_MODES.get(key, "bytecode"))
        total = time.perf_counter() - start
        library = exe.stats()["kernel_library"]
        result[label] = {"compile_s": total, "kernel_lowering_s": library["lower_seconds"],
                         "c_compiler_s": build_stats()["compile_seconds"] - before,
                         "c_compiler_cpu_s": _children_cpu() - cpu_before,
                         "kernels": len(library["c_kernels"]), "reused": library.get("kernels_reused", 0),
                         "c_bytes": library["source_bytes"], "portable": library.get("portable_build", "")}
        del exe, mod, params
    return result


def run_child(key: str, path: Path, cache: str, twice: bool, tree: Path = ROOT) -> dict:
    done = subprocess.run([sys.executable, __file__, "--child", key, str(path)] + (["--twice"] if twice else []),
                          capture_output=True, text=True, env={**os.environ, "TENSORVM_CACHE_DIR": cache,
                                                               "PYTHONPATH": str(tree)})
    if done.returncode != 0:
        raise SystemExit(f"{key}: the measuring process failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def wrappers(rounds: int = 7, calls: int = 100_000) -> None:
    import numpy as np

    from tensorvm import te
    from tensorvm.codegen import module
    from tensorvm.codegen.lower import lower

    n = te.var("n")
    x = te.placeholder((n,), "float32", "x")
    func = lower("wrapper_cost", [x], [te.compute((n,), lambda i: x[i] * 2.0 + 1.0, "y")])
    kernels, saved = {}, module._WRAPPER_FLAGS
    try:
        for flags in (("-O1",), ("-O3",)):
            module._WRAPPER_FLAGS = flags
            kernels[flags[0]] = module.build_module([func])["wrapper_cost"]
    finally:
        module._WRAPPER_FLAGS = saved
    a, out = np.ones(4, "float32"), np.empty(4, "float32")
    times = {k: [] for k in kernels}
    for _ in range(rounds):
        for k, kernel in kernels.items():
            entry = kernel.entry
            start = time.perf_counter()
            for _ in range(calls):
                entry(a, out)
            times[k].append((time.perf_counter() - start) / calls * 1e9)
    for k, values in times.items():
        print(f"wrapper built {k}: {sorted(values)[len(values) // 2]:.0f} ns per call (median of {rounds} rounds)")


def native(onnx_dir: str | None, rounds: int = 7, calls: int = 20) -> None:
    import numpy as np
    import onnx

    import tensorvm as tv
    import tensorvm.frontend  # noqa: F401
    from tensorvm.codegen import build, module

    path = find_onnx("gru", onnx_dir)
    if path is None:
        raise SystemExit("gru: no ONNX export found (run benchmarks/run.py --models gru once, or give --onnx-dir)")
    x = np.random.default_rng(0).standard_normal((3, 40, 64)).astype("float32")
    vms, saved, outputs = {}, module.NATIVE_FLAGS, {}
    try:
        for flags in (("-O1",), ("-O3",)):
            module.NATIVE_FLAGS = flags
            with tempfile.TemporaryDirectory(prefix="tensorvm-native-flags-") as cache:
                os.environ["TENSORVM_CACHE_DIR"] = cache
                mod, params = tv.frontend.from_onnx(onnx.load(str(path)), shape={"x": [None, None, 64]})
                before = build.build_stats()["compile_seconds"]
                exe = tv.vm.compile(mod, target="c", params=params, exec_mode="native")
                seconds = build.build_stats()["compile_seconds"] - before
            vm = tv.vm.VirtualMachine(exe)
            outputs[flags[0]] = vm.invoke("main", x)
            vms[flags[0]] = vm
            print(f"native program at {flags[0]}: C compiler {seconds:.2f} s (cold)")
    finally:
        module.NATIVE_FLAGS = saved
        os.environ.pop("TENSORVM_CACHE_DIR", None)
    first, second = (np.asarray(o[0].numpy() if hasattr(o[0], "numpy") else o[0]) for o in outputs.values())
    assert np.allclose(first, second, atol=1e-5), "the two builds disagree"
    times = {k: [] for k in vms}
    for _ in range(rounds):
        for k, vm in vms.items():
            start = time.perf_counter()
            for _ in range(calls):
                vm.invoke("main", x)
            times[k].append((time.perf_counter() - start) / calls * 1e3)
    for k, values in times.items():
        print(f"native program built {k}: {sorted(values)[len(values) // 2]:.3f} ms per call, GRU batch 3 x 40 steps "
              f"(median of {rounds} interleaved rounds)")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("models", nargs="*", default=list(SHAPES))
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--onnx-dir")
    parser.add_argument("--wrappers", action="store_true")
    parser.add_argument("--native", action="store_true")
    parser.add_argument("--tree", type=Path, default=ROOT, help="the tensorvm checkout to measure (default: this one)")
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    parser.add_argument("--twice", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(*args.child, args.twice)))
        return
    if args.wrappers:
        wrappers()
        return
    if args.native:
        native(args.onnx_dir)
        return
    try:
        load = os.getloadavg()[0]
    except OSError:
        load = float("nan")
    print(f"{args.tree}: load average {load:.2f} on {os.cpu_count()} cores")
    print("| model | round | cold (s) | of which C compiler (s) | C compiler CPU (s) | cached, new process (s) "
          "| cached, same process (s) | kernels | C (KB) |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for key in args.models:
        path = find_onnx(key, args.onnx_dir)
        if path is None:
            print(f"| {key} | — | no ONNX export found (run benchmarks/run.py once, or give --onnx-dir) |||||")
            continue
        for r in range(args.rounds):
            with tempfile.TemporaryDirectory(prefix="tensorvm-compile-time-") as cache:
                cold = run_child(key, path, cache, False, args.tree)["first"]
                warm = run_child(key, path, cache, True, args.tree)
            print(f"| {key} | {r} | {cold['compile_s']:.2f} | {cold['c_compiler_s']:.2f} | {cold['c_compiler_cpu_s']:.2f} "
                  f"| {warm['first']['compile_s']:.2f} | {warm['second']['compile_s']:.2f} "
                  f"| {cold['kernels']} ({warm['second']['reused']} reused) | {cold['c_bytes'] // 1000} |", flush=True)


if __name__ == "__main__":
    main()
