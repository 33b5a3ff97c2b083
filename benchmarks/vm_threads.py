"""VMs in threads: do kernels of two VMs run in parallel? (Kernels are called without the GIL.)

    .venv/bin/python benchmarks/vm_threads.py [--size 512] [--layers 8] [--calls 20] [--threads 2]
        [--mode bytecode|compiled]

A chain of ``--layers`` ``size x size`` dense + relu layers on target "c", one kernel thread (OpenMP and
BLAS set before NumPy loads). Times ``--calls`` calls on one VM in one thread, then the same number of
calls on each of ``--threads`` VMs in as many threads (each its own VM, all on one executable), and
prints the wall times, the cores used (process CPU time / wall time: at most 1 while kernels hold the
GIL) and the speed-up ``threads * one-thread time / wall time`` (ideal: the thread count, on that many
idle cores), then how a pure-Python thread fares beside one VM (its longest stall and its iterations:
a kernel holding the GIL stalls it for the kernel's whole time; this shows even on a busy machine, where
the speed-up cannot). Every result is checked against NumPy.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from pathlib import Path

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import tensorvm as tv  # noqa: E402


def chain_source(size: int, layers: int) -> str:
    body, prev = [], "%x"
    for i in range(layers):
        body.append(f"  %{i} = nn.relu(nn.dense({prev}, %w));")
        prev = f"%{i}"
    return (f"def @main(%x: Tensor[(?, {size}), float32], %w: Tensor[({size}, {size}), float32]) {{\n"
            + "\n".join(body) + f"\n  {prev}\n}}\n")


def reference(x, w, layers):
    for _ in range(layers):
        x = np.maximum(x @ w.T, 0)
    return x


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", type=int, default=512)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--calls", type=int, default=20)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--mode", default="bytecode", choices=("bytecode", "compiled"))
    opts = ap.parse_args()
    exe = tv.vm.compile(tv.parse(chain_source(opts.size, opts.layers)), target="c", exec_mode=opts.mode)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((opts.size, opts.size)).astype("float32")
    w = (rng.standard_normal((opts.size, opts.size)) / np.sqrt(opts.size)).astype("float32")
    want = reference(x, w, opts.layers)

    def work(vm, out):
        for _ in range(opts.calls):
            out.append(np.allclose(vm.invoke("main", x, w).numpy(), want, rtol=1e-3, atol=1e-3))

    vms = [tv.vm.VirtualMachine(exe) for _ in range(opts.threads)]
    for vm in vms:
        work(vm, [])  # warm-up: pools filled, kernels loaded
    ok: list = []
    start, cpu = time.perf_counter(), time.process_time()
    work(vms[0], ok)
    one, one_cpu = time.perf_counter() - start, time.process_time() - cpu
    threads = [threading.Thread(target=work, args=(vm, ok)) for vm in vms]
    start, cpu = time.perf_counter(), time.process_time()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    many, many_cpu = time.perf_counter() - start, time.process_time() - cpu
    print(f"{opts.layers} x dense {opts.size}x{opts.size} + relu, target c, {opts.mode}, 1 kernel thread, "
          f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}")
    print(f"1 VM,  1 thread : {opts.calls} calls in {one * 1e3:.1f} ms (CPU {one_cpu / one:.2f} cores)")
    print(f"{opts.threads} VMs, {opts.threads} threads: {opts.calls} calls each in {many * 1e3:.1f} ms "
          f"(CPU {many_cpu / many:.2f} cores; speed-up {opts.threads * one / many:.2f}x of {opts.threads})")
    stall, count = python_beside(vms[0], x, w, opts.calls)
    print(f"a Python thread beside one VM: longest stall {stall * 1e3:.1f} ms, {count} loop iterations "
          f"(a kernel holding the GIL stalls it for the kernel's whole time)")
    if not all(ok):
        sys.exit(f"wrong results: {ok.count(False)} of {len(ok)}")


def python_beside(vm, x, w, calls: int) -> tuple:
    """The longest stall (seconds) and the iterations of a pure-Python loop on another thread while ``vm``
    runs ``calls`` calls."""
    stop, gaps = [False], [0.0, 0]

    def spin():
        last = time.perf_counter()
        while not stop[0]:
            now = time.perf_counter()
            gaps[0], gaps[1], last = max(gaps[0], now - last), gaps[1] + 1, now

    t = threading.Thread(target=spin)
    t.start()
    for _ in range(calls):
        vm.invoke("main", x, w)
    stop[0] = True
    t.join()
    return gaps[0], gaps[1]


if __name__ == "__main__":
    main()
