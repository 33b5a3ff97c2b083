"""Recurrent ONNX layers exported from PyTorch: tensorvm (target "c", VM) against ONNX Runtime.

    .venv/bin/python benchmarks/recurrent.py [--threads 1 2] [--rounds 7] [--quick] [--profile]

Models (random weights, exported with dynamic axes, imported with ``tv.frontend.from_onnx``):

* ``gru``: ``nn.GRU(64, 128, num_layers=2, bidirectional=True, batch_first=True)``, dynamic batch and
  sequence axes, shapes (batch, seq) = (3, 40) and (2, 200) through one executable;
* ``lstm``: ``nn.LSTM(256, 512)``, batch 1, dynamic sequence axis, seq 32 and 128.

Each thread count runs in its own subprocess (the thread variables are set before NumPy loads). In it,
tensorvm and ONNX Runtime calls are interleaved, round after round, and the median of each is reported
with the ratio tensorvm / ONNX Runtime (the machine may be shared: medians of interleaved rounds, not
minima of back-to-back runs). Outputs are checked against ONNX Runtime. ``--profile`` prints the VM
profiler's table of one call per shape instead.

The LSTM's rows also give µs per token against **the floor**: one bare ``1x512 . 512x2048`` product (the
recurrent ``h W_hh^T`` every token must do), the fastest of NumPy's BLAS and tensorvm's dense kernel
(``floors.dense_floor_runs``), timed in the same rounds. The runtime column names the exec mode that ran
(exec mode "compiled" on target c is native mode). At 1 thread the same ratios are also given in CPU time of
the process, which a shared machine's time slicing does not inflate (at 2 threads it would count the
pool's spinning workers, so it is not shown there).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HERE = Path(__file__).resolve().parent
THREAD_VARIABLES = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "TENSORVM_NUM_THREADS")
GRU_INPUT, GRU_HIDDEN = 64, 128
LSTM_INPUT, LSTM_HIDDEN = 256, 512
MODELS = {
    "gru": {"shapes": [(3, 40), (2, 200)], "quick": [(3, 40)]},
    "lstm": {"shapes": [(1, 32), (1, 128)], "quick": [(1, 32)]},
}


def export(kind: str, path: Path) -> None:
    """The ONNX export of the PyTorch layer (seeded random weights); outputs: Y and the final state(s)."""
    import torch

    torch.manual_seed(0)
    if kind == "gru":
        module = torch.nn.GRU(GRU_INPUT, GRU_HIDDEN, num_layers=2, bidirectional=True, batch_first=True)
        example = torch.randn(2, 5, GRU_INPUT)
        axes = {"x": {0: "batch", 1: "seq"}, "y": {0: "batch", 1: "seq"}, "h": {1: "batch"}}
        outputs = ["y", "h"]
    else:
        module = torch.nn.LSTM(LSTM_INPUT, LSTM_HIDDEN)
        example = torch.randn(5, 1, LSTM_INPUT)
        axes = {"x": {0: "seq"}, "y": {0: "seq"}}
        outputs = ["y", "hc"]

        class Wrap(torch.nn.Module):
            def __init__(self, lstm):
                super().__init__()
                self.lstm = lstm

            def forward(self, x):
                y, (h, c) = self.lstm(x)
                return y, torch.cat([h, c])

        module = Wrap(module)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(module.eval(), (example,), str(path), input_names=["x"], output_names=outputs,
                          dynamic_axes=axes, opset_version=17, dynamo=False)


def make_input(kind: str, batch: int, seq: int):
    import numpy as np

    rng = np.random.default_rng(batch * 1000 + seq)
    shape = (batch, seq, GRU_INPUT) if kind == "gru" else (seq, batch, LSTM_INPUT)
    return rng.standard_normal(shape).astype(np.float32)


def worker(args) -> None:
    import numpy as np
    import onnx
    import onnxruntime as ort

    import tensorvm as tv

    sys.path.insert(0, str(HERE))
    from floors import dense_floor_runs

    rows = []
    for kind in args.models:
        path = Path(args.artifacts) / f"{kind}.onnx"
        start = time.perf_counter()
        mod, params = tv.frontend.from_onnx(onnx.load(str(path)))
        exe = tv.vm.compile(mod, target="c", params=params or None, exec_mode=args.exec_mode)
        compile_s = time.perf_counter() - start
        ran = exe.exec_mode  # what runs: exec mode "compiled" is native mode on target c
        vm = tv.vm.VirtualMachine(exe)
        options = ort.SessionOptions()
        options.intra_op_num_threads = args.threads
        options.inter_op_num_threads = 1
        session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        for batch, seq in MODELS[kind]["quick" if args.quick else "shapes"]:
            x = make_input(kind, batch, seq)
            expected = session.run(None, {"x": x})
            got = vm.invoke("main", x)
            got = [got] if not isinstance(got, (list, tuple)) else got
            err = max(float(np.max(np.abs(np.asarray(g) - e))) for g, e in zip(got, expected, strict=True))
            if err > 1e-4:
                raise SystemExit(f"{kind} {batch}x{seq}: tensorvm differs from ONNX Runtime by {err:.3g}")
            if args.profile:
                print(f"--- {kind} batch {batch} seq {seq}, {args.threads} thread(s)")
                print(vm.profile("main", x))
                continue
            run_tv = functools.partial(vm.invoke, "main", x)
            run_ort = functools.partial(session.run, None, {"x": x})
            calls = max(1, int(0.05 / max(_time_once(run_ort), 1e-6)))  # about 50 ms of ORT per round
            floors = dense_floor_runs(4 * LSTM_HIDDEN, LSTM_HIDDEN, "floor") if kind == "lstm" else {}
            floor_calls = calls * seq  # about as long as a round of the model
            tv_times, ort_times, floor_times = [], [], {name: [] for name in floors}
            for _ in range(args.rounds):
                tv_times.append(_time_calls(run_tv, calls))
                ort_times.append(_time_calls(run_ort, calls))
                for name, fn in floors.items():
                    floor_times[name].append(_time_calls(fn, floor_calls))
            tv_ms, ort_ms = (statistics.median(t[0] for t in ts) * 1e3 for ts in (tv_times, ort_times))
            row = {"model": kind, "batch": batch, "seq": seq, "threads": args.threads, "runtime": f"VM {ran}",
                   "tensorvm_ms": tv_ms, "ort_ms": ort_ms, "ratio": tv_ms / ort_ms, "max_abs_err": err,
                   "compile_s": compile_s}
            if floors:
                medians = {name: statistics.median(t[0] for t in ts) * 1e6 for name, ts in floor_times.items()}
                best = min(medians, key=medians.get)
                row.update(floor_us=medians[best], floor_kernel=best.removeprefix("floor "))
                if args.threads == 1:  # CPU time: what a loaded machine's time slicing does not inflate
                    row["cpu_us"] = {what: statistics.median(t[1] for t in ts) * 1e6 / units for what, ts, units in
                                     (("tensorvm", tv_times, seq), ("ort", ort_times, seq),
                                      ("floor", floor_times[best], 1))}
            rows.append(row)
    if not args.profile:
        print(json.dumps(rows))


def _time_once(fn) -> float:
    fn()
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def _time_calls(fn, calls: int) -> tuple[float, float]:
    """Seconds per call: wall time, and CPU time of the process (all its threads)."""
    start, cpu = time.perf_counter(), time.process_time()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls, (time.process_time() - cpu) / calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--quick", action="store_true", help="one shape per model")
    parser.add_argument("--profile", action="store_true", help="print the VM profile of one call per shape")
    parser.add_argument("--exec-mode", default="auto", choices=["auto", "bytecode", "compiled", "native"],
                        help="the VM's execution mode (default: tv.vm.compile's, native for these loops)")
    parser.add_argument("--source", default=str(ROOT),
                        help="the checkout whose tensorvm is measured (default: this one; to compare two)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--artifacts", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        args.threads = args.threads[0]
        worker(args)
        return
    with tempfile.TemporaryDirectory(prefix="tv-recurrent-") as tmp:
        for kind in args.models:
            export(kind, Path(tmp) / f"{kind}.onnx")
        rows = []
        for threads in args.threads:
            env = dict(os.environ, PYTHONPATH=args.source + os.pathsep + os.environ.get("PYTHONPATH", ""))
            env.update({name: str(threads) for name in THREAD_VARIABLES})
            command = [sys.executable, __file__, "--worker", "--artifacts", tmp, "--threads", str(threads),
                       "--rounds", str(args.rounds), "--exec-mode", args.exec_mode, "--models", *args.models] + \
                      (["--quick"] if args.quick else []) + (["--profile"] if args.profile else [])
            out = subprocess.run(command, env=env, check=True, capture_output=not args.profile, text=True)
            if not args.profile:
                rows += json.loads(out.stdout.strip().splitlines()[-1])
    if rows:
        print(f"{'model':6} {'batch':>5} {'seq':>5} {'thr':>3} {'tensorvm':>11} {'ms':>9} {'ORT ms':>9} {'ratio':>6} "
              f"{'max err':>8} {'compile s':>9}")
        for r in rows:
            print(f"{r['model']:6} {r['batch']:5} {r['seq']:5} {r['threads']:3} {r['runtime']:>11} "
                  f"{r['tensorvm_ms']:9.3f} {r['ort_ms']:9.3f} {r['ratio']:6.2f} {r['max_abs_err']:8.1e} "
                  f"{r['compile_s']:9.1f}")
        for r in (r for r in rows if "floor_us" in r):
            token = r["tensorvm_ms"] * 1e3 / r["seq"]
            print(f"{r['model']} seq {r['seq']}, {r['threads']} thread(s): {token:.1f} us per token = "
                  f"{token / r['floor_us']:.2f}x the floor ({r['floor_us']:.1f} us, one bare 1x{LSTM_HIDDEN} . "
                  f"{LSTM_HIDDEN}x{4 * LSTM_HIDDEN} product, {r['floor_kernel']}); ONNX Runtime "
                  f"{r['ort_ms'] * 1e3 / r['seq']:.1f} us per token")
            if "cpu_us" in r:
                cpu = r["cpu_us"]
                print(f"    CPU time: {cpu['tensorvm']:.1f} us per token = {cpu['tensorvm'] / cpu['floor']:.2f}x the floor "
                      f"({cpu['floor']:.1f} us), {cpu['tensorvm'] / cpu['ort']:.2f}x ONNX Runtime ({cpu['ort']:.1f} us)")


if __name__ == "__main__":
    main()
