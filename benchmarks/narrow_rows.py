"""Products of few rows over a large packed weight (GPT-2's LM head at batch 1 and 2, the MLP's layers at
batch 1), this revision's packed product beside a baseline revision's (its ``tensorvm/codegen/lib`` read
from git) and ONNX Runtime (a MatMul with a constant weight), called interleaved in one process; plus the
time of streaming the LM head's 25.7 MB once (a plain vector sum: the memory bandwidth floor).

    .venv/bin/python benchmarks/narrow_rows.py --threads 1 --rounds 30
    .venv/bin/python benchmarks/narrow_rows.py --threads 2 --baseline main

Medians and minima in microseconds; on a shared machine only the ratios mean much. ONNX Runtime runs
with its workers' spinning off (they would hold a core after each of its runs, in this process).
"""

from __future__ import annotations

import argparse
import ctypes
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHAPES = [("lm-head", m, 50257, 128) for m in (1, 2, 3, 8)] + [
    ("mlp 784-512", 1, 512, 784), ("mlp 512-512", 1, 512, 512), ("mlp 784-512", 2, 512, 784),
    ("mlp 784-512", 64, 512, 784)]

STREAM = r"""
#include <stdint.h>
typedef float tv_stream_vf __attribute__((vector_size(32), aligned(4)));
float tv_stream_sum(const float* a, int64_t n) {  /* reads a once: four independent sums */
  tv_stream_vf s0 = {0}, s1 = {0}, s2 = {0}, s3 = {0};
  for (int64_t i = 0; i + 32 <= n; i += 32) {
    s0 += *(const tv_stream_vf*)(a + i), s1 += *(const tv_stream_vf*)(a + i + 8);
    s2 += *(const tv_stream_vf*)(a + i + 16), s3 += *(const tv_stream_vf*)(a + i + 24);
  }
  const tv_stream_vf s = s0 + s1 + s2 + s3;
  return s[0] + s[7];
}
"""


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--baseline", default="main", help="a git revision ('' : none)")
    args = parser.parse_args()
    for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "TENSORVM_NUM_THREADS"):
        os.environ[name] = str(args.threads)
    sys.path.insert(0, str(ROOT))
    import numpy as np

    from tensorvm.codegen import c_emit
    from tensorvm.codegen import host as hostmod
    from tensorvm.codegen.build import build_library

    params = hostmod.gemm_params(hostmod.host())

    def entry(lib):
        fn = lib.function("tv_vgemm_call", 3, 0)
        fn.argtypes = [ctypes.c_int64] * 3 + [ctypes.c_void_p] * 3
        fn.restype = ctypes.c_int32
        return fn

    variants = {"this": entry(hostmod.vgemm_library(params))}
    if args.baseline:
        own = c_emit._library_file

        def from_git(name):
            return subprocess.run(["git", "show", f"{args.baseline}:tensorvm/codegen/lib/{name}"], cwd=ROOT,
                                  check=True, capture_output=True, text=True).stdout
        c_emit._library_file = from_git
        try:
            variants[args.baseline] = entry(hostmod.vgemm_library(params))
        finally:
            c_emit._library_file = own
    stream = build_library(STREAM).function("tv_stream_sum", 2, 0)
    stream.argtypes, stream.restype = [ctypes.c_void_p, ctypes.c_int64], ctypes.c_float

    import onnxruntime as ort
    from lone_layers import onnx_matmul, ort_options

    def ort_run(w, x):
        # (ort_options: its workers do not spin; they would take a core for tens of ms after each run,
        # while this process's other variants run: in one process that took the second core from
        # tensorvm's pool)
        options = ort_options(args.threads)
        options.inter_op_num_threads = 1
        session = ort.InferenceSession(onnx_matmul(w).SerializeToString(), options, providers=["CPUExecutionProvider"])
        return lambda: session.run(None, {"x": x})

    rng = np.random.default_rng(0)
    print(f"{args.threads} thread(s); {params}")
    print("| product (m x n x k) | " + " | ".join(list(variants) + ["onnxruntime"]) + " | this / baseline |")
    print("| --- | " + " | ".join("---" for _ in range(len(variants) + 2)) + " |")
    streamed = np.ones(-(-50257 // params.nr) * params.nr * 128, np.float32)
    rows = []
    for label, m, n, k in SHAPES:
        x = rng.standard_normal((m, k)).astype(np.float32)
        w = rng.standard_normal((n, k)).astype(np.float32)
        packed = hostmod.pack_panels(w, params.nr)
        want = x.astype(np.float64) @ w.T.astype(np.float64)
        calls = {}
        out = np.empty((m, n), np.float32)  # (one for every variant: the same addresses, the same cache sets)
        for name, fn in variants.items():
            fn(m, n, k, x.ctypes.data, packed.ctypes.data, out.ctypes.data)
            error = float(np.abs(out - want).max() / max(1.0, np.abs(want).max()))
            if error > 1e-4:
                raise SystemExit(f"{name} at {label} m={m}: relative error {error}")
            calls[name] = (lambda fn=fn, m=m, n=n, k=k, x=x, packed=packed, out=out:
                           fn(m, n, k, x.ctypes.data, packed.ctypes.data, out.ctypes.data))
        calls["onnxruntime"] = ort_run(w, x)
        rows.append((f"{label} {m}x{n}x{k}", calls))
    rows.append(("stream 25.7 MB (sum)", {"this": lambda: stream(streamed.ctypes.data, streamed.size)}))
    for label, calls in rows:
        repeat = max(1, int(2e-3 / max(1e-6, _once(calls["this"]))))
        times = {name: [] for name in calls}
        # ONNX Runtime first in every round (its own copy of the weight passes through the caches), then
        # the variants in an order reversed every round: each follows each other as often
        ours = [name for name in calls if name != "onnxruntime"]
        for r in range(args.rounds):
            for name in [n for n in calls if n == "onnxruntime"] + (ours if r % 2 == 0 else ours[::-1]):
                call = calls[name]
                start = time.perf_counter()
                for _ in range(repeat):
                    call()
                times[name].append((time.perf_counter() - start) / repeat)
        cells = [f"{statistics.median(times[n]) * 1e6:.1f} (min {min(times[n]) * 1e6:.1f})" for n in calls]
        ratio = (f"{statistics.median(times['this']) / statistics.median(times[args.baseline]):.2f}"
                 if args.baseline in times else "")
        print(f"| {label} | " + " | ".join(cells) + f" | {ratio} |")


def _once(call) -> float:
    call()
    start = time.perf_counter()
    call()
    return time.perf_counter() - start


if __name__ == "__main__":
    main()
