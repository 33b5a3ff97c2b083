"""The small CNN (benchmarks/models/cnn.py, batch 1) whole on tensorvm's VM, built from this checkout's C
kernel library and from another checkout's (``--against``: its ``tensorvm/codegen/lib``, with this
checkout's Python), beside ONNX Runtime, all interleaved in one process at each thread count. On a shared
machine only the ratios mean anything; medians and minima over the rounds are printed, and the medians
over the "quiet" bursts of rounds only: those in which other processes used less than a tenth of a core
(/proc/stat's busy time less this process's), where 2 threads had two cores.

    .venv/bin/python benchmarks/cnn_against.py --against ../main --threads 1,2 --rounds 2000
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np


def _busy_seconds() -> float:
    """Seconds every core of the machine has been busy (/proc/stat: all but idle and iowait)."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (sum(fields) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")


def _bridge(lib_dir: Path) -> tuple[str, str]:
    """(PRELUDE, BLAS_BRIDGE) of c_emit.py made from the C library in ``lib_dir`` (as c_emit makes its own)."""
    from tensorvm.codegen import c_emit

    prelude = (c_emit.PRELUDE.split("\n", 1)[0] + "\n"
               + (lib_dir / "tv_kernel.h").read_text().replace(c_emit._VEC_INCLUDE, (lib_dir / "tv_vec.h").read_text(), 1))
    bridge = "\n" + (lib_dir / "tv_gemm.h").read_text().replace(c_emit._KERNEL_INCLUDE, "", 1)
    for name in c_emit._VECTOR_INCLUDES:
        bridge = bridge.replace(f'#include "{name}"\n', (lib_dir / name).read_text(), 1)
    return prelude, bridge


def _vm(mod, params, lib_dir: Path | None):
    """The VM executable of the model, its kernels built from the C library in ``lib_dir`` (None: this one)."""
    import tensorvm as tv
    from tensorvm.codegen import c_emit

    own = c_emit.PRELUDE, c_emit.BLAS_BRIDGE
    if lib_dir is not None:
        c_emit.PRELUDE, c_emit.BLAS_BRIDGE = _bridge(lib_dir)
    try:
        return tv.vm.compile(mod, target="c", params=params)
    finally:
        c_emit.PRELUDE, c_emit.BLAS_BRIDGE = own


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--against", help="another tensorvm checkout whose C kernel library to time beside this one's")
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--rounds", type=int, default=1000)
    args = parser.parse_args()

    import onnxruntime as ort
    import torch

    import tensorvm as tv

    sys.path.insert(0, str(Path(__file__).parent))
    from models import cnn
    from models.common import export_static_onnx

    weights, x = cnn.make_weights(), cnn.make_input()
    mod, params = cnn.build_ir(weights)
    exes = {"here": _vm(mod, params, None)}
    if args.against:
        exes["there"] = _vm(mod, params, Path(args.against) / "tensorvm" / "codegen" / "lib")
    onnx_path = Path("/tmp") / f"cnn_against_{id(exes)}.onnx"
    export_static_onnx(cnn.torch_cnn(torch, weights), x, onnx_path, "x")
    want = cnn.torch_cnn(torch, weights)(torch.from_numpy(x)).detach().numpy()
    print(f"The small CNN, batch 1, {args.rounds} interleaved rounds; us per inference, median (min)")
    for threads in [int(t) for t in args.threads.split(",")]:
        tv.set_num_threads(threads)
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        session = ort.InferenceSession(str(onnx_path), options, providers=["CPUExecutionProvider"])
        calls = {"onnxruntime": lambda s=session: s.run(None, {"x": x})}
        for where, exe in exes.items():
            vm = tv.vm.VirtualMachine(exe)
            got = vm.invoke("main", x)
            np.testing.assert_allclose(np.asarray(got.numpy() if hasattr(got, "numpy") else got), want,
                                       rtol=1e-3, atol=1e-4)
            calls[f"tensorvm {where}"] = lambda vm=vm: vm.invoke("main", x)
        times: dict = {name: [] for name in calls}
        quiet: dict = {name: [] for name in calls}
        names = list(calls)
        for burst in range(0, args.rounds, 50):
            before, own = _busy_seconds(), os.times()
            start_burst = time.perf_counter()
            got: dict = {name: [] for name in calls}
            for round_ in range(burst, min(burst + 50, args.rounds)):
                for name in names[round_ % len(names):] + names[:round_ % len(names)]:
                    start = time.perf_counter()
                    calls[name]()
                    got[name].append((time.perf_counter() - start) * 1e6)
            now = os.times()
            others = _busy_seconds() - before - (now.user - own.user + now.system - own.system)
            for name, v in got.items():
                times[name] += v
                if others < 0.1 * (time.perf_counter() - start_burst):
                    quiet[name] += v
        med = {name: float(np.median(v)) for name, v in times.items()}
        line = f"  {threads} thread(s): " + ", ".join(f"{name} {med[name]:.1f} ({min(v):.1f})" for name, v in times.items())
        line += f"; here / ort {med['tensorvm here'] / med['onnxruntime']:.3f}"
        if args.against:
            line += f", here / there {med['tensorvm here'] / med['tensorvm there']:.3f}"
        print(line)
        if quiet["onnxruntime"]:
            q = {name: float(np.median(v)) for name, v in quiet.items()}
            line = f"    quiet ({len(quiet['onnxruntime'])} rounds): " + ", ".join(f"{name} {q[name]:.1f}" for name in q)
            line += f"; here / ort {q['tensorvm here'] / q['onnxruntime']:.3f}"
            if args.against:
                line += f", here / there {q['tensorvm here'] / q['tensorvm there']:.3f}"
            print(line)
    onnx_path.unlink()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
