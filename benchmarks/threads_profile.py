"""A corpus model at 1 and 2 threads beside ONNX Runtime (its pool not spinning between calls), optionally
with busy background processes, and the VM profiler's per-kernel time at 1 and 2 threads side by side.

    .venv/bin/python benchmarks/threads_profile.py mobilenetv3 [--rounds 20] [--load 1] [--profile]
    .venv/bin/python benchmarks/threads_profile.py bert-small --tokens 128
    .venv/bin/python benchmarks/threads_profile.py distilbert --batch 4 --tokens 64 --profile

Batch 1 (the CNNs: static 224x224 input; ``bert-small``: the suite's export, ``--tokens`` tokens); the
corpus's encoders (distilbert, roberta, t5-encoder) take ``--batch`` rows of ``--tokens`` tokens and the
corpus's padding mask. The two
runtimes are timed interleaved (rounds of two calls, the order alternating); medians in microseconds
and the ratio tensorvm / ONNX Runtime. ``--profile`` prints the kernels whose time changes most between
1 and 2 threads (medians of 5 profiles): a kernel much slower at 2 threads waits for a thread. The ONNX
files are the benchmark cache's (``benchmarks/run.py`` makes them). No assertion on time.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from compile_time import SHAPES, find_onnx  # noqa: E402
from harness import background_load  # noqa: E402
from kernel_gap import model_feeds  # noqa: E402
from models.text import ENCODERS  # noqa: E402


def _model(key: str, tokens: int, batch: int):
    from models.common import import_from_onnx

    if key == "bert-small":
        from models import bert

        cache = Path.home() / ".cache" / "tensorvm-bench"
        found = sorted(cache.glob("bert-small-*/bert-small.onnx"), key=lambda p: p.stat().st_mtime)
        if not found:
            raise SystemExit("no bert-small export: run benchmarks/run.py --models bert-small first")
        mod, params = import_from_onnx(found[-1])
        return found[-1], mod, params, {"input_ids": bert.make_input_ids(tokens)}
    path = find_onnx(key, None)
    if path is None:
        raise SystemExit(f"no ONNX export of {key}: run benchmarks/run.py --models {key} first")
    if key in ENCODERS:
        shape, feeds = model_feeds(key, batch, tokens)
        mod, params = import_from_onnx(path, shape=shape)
        return path, mod, params, feeds
    dims = [1 if d is None else d for d in SHAPES[key]["images"]]
    mod, params = import_from_onnx(path, shape=SHAPES[key])
    return path, mod, params, {"images": np.random.default_rng(0).standard_normal(dims).astype(np.float32)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", choices=sorted(SHAPES) + ["bert-small"] + sorted(ENCODERS))
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--batch", type=int, default=1, help="rows of tokens (the corpus's encoders)")
    parser.add_argument("--load", type=int, default=0, help="busy background processes while timing")
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args()

    import onnxruntime as ort

    import tensorvm as tv

    path, mod, params, feeds = _model(args.model, args.tokens, args.batch)
    vm = tv.vm.VirtualMachine(tv.vm.compile(mod, target="c", params=params))
    inputs = [feeds[p.name_hint] for p in mod["main"].params]
    sessions = {}
    for threads in (1, 2):
        options = ort.SessionOptions()
        options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        sessions[threads] = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    with background_load(args.load):
        for threads in (1, 2):
            tv.set_num_threads(threads)
            calls = {"tensorvm": lambda: vm.invoke("main", *inputs),
                     "onnxruntime": lambda threads=threads: sessions[threads].run(None, feeds)}
            for call in calls.values():
                for _ in range(3):
                    call()
            samples: dict = {key: [] for key in calls}
            for r in range(args.rounds):
                for key in (list(calls) if r % 2 == 0 else list(calls)[::-1]):
                    start = time.perf_counter()
                    calls[key]()
                    calls[key]()
                    samples[key].append((time.perf_counter() - start) / 2 * 1e6)
            tvm_us, ort_us = (statistics.median(samples[k]) for k in calls)
            print(f"{args.model} threads={threads} load={args.load}: tensorvm {tvm_us:.0f} us, "
                  f"ONNX Runtime {ort_us:.0f} us, ratio {tvm_us / ort_us:.2f}", flush=True)
    if args.profile:
        totals = {}
        for threads in (1, 2):
            tv.set_num_threads(threads)
            reports = [vm.profile("main", *inputs) for _ in range(5)]
            rows: dict = {}
            for report in reports:
                for row in report.rows:
                    rows.setdefault(row.name, []).append(row.total_us)
            totals[threads] = {name: statistics.median(values) for name, values in rows.items()}
        names = sorted(totals[1], key=lambda n: -abs(totals[2].get(n, 0.0) - totals[1][n]))
        print("| kernel | 1 thread us | 2 threads us | 2 / 1 |\n| --- | --- | --- | --- |")
        for name in names[:25]:
            one, two = totals[1][name], totals[2].get(name, float("nan"))
            print(f"| {name} | {one:.1f} | {two:.1f} | {two / one if one else float('nan'):.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
