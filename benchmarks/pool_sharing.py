"""Two models in one process: on the process's one pool, or each library on its own pool (as before).

    .venv/bin/python benchmarks/pool_sharing.py [--models mlp-b32,attention-b1] [--threads 2]
        [--calls 50] [--rounds 6] [--load 0]

Both models (``threads_under_load.py``'s ONNX builders: ``mlp-b1``, ``mlp-b32``, ``attention-b1``,
``bert-small``, ``mobilenetv3``, ``resnet18``) are compiled for target "c" into two libraries, then
called alternately (A, B, A, B, ...: an application serving two models). Rounds alternate between
the two ways the libraries run their parallel loops, in the same process: ``shared``, every library
attached to the process pool (``codegen/pool.py``, what tensorvm does), and ``own``, each library detached
(``tv_team_attach(NULL)``: its own workers, which spin after its call while the other library's run, as
every library did before one pool per process). The table gives the median ms per pair of calls and
the ratio shared / own. ``--load N`` adds N busy background processes. Outputs are checked against the
first call's. Nothing here asserts a time: it is a measurement, not a test.
"""

from __future__ import annotations

import argparse
import ctypes
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from threads_under_load import _onnx_file, _start_load, _stop_load  # noqa: E402

import tensorvm as tv  # noqa: E402
from tensorvm.codegen import pool  # noqa: E402
from tensorvm.runtime.library import load_cdll  # noqa: E402


def _model(name: str, directory: Path):
    import onnx

    path, inputs = _onnx_file(name, directory)
    mod, params = tv.frontend.from_onnx(onnx.load(str(path)))
    exe = tv.vm.compile(mod, target="c", params=params)
    vm = tv.vm.VirtualMachine(exe)
    args = [inputs[p.name_hint] for p in mod["main"].params]
    attach = load_cdll(exe.c_library.library_path).tv_team_attach
    attach.restype, attach.argtypes = ctypes.c_int32, [ctypes.c_void_p]
    return (lambda: np.asarray(vm.invoke("main", *args).numpy())), attach


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="mlp-b32,attention-b1", help="two comma-separated models")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--calls", type=int, default=50, help="pairs of calls per round")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--load", type=int, default=0, help="busy background processes")
    args = parser.parse_args(argv)
    names = args.models.split(",")
    if len(names) != 2:
        raise SystemExit(f"--models: expected two models, got {args.models!r}")
    tv.set_num_threads(args.threads)
    table = pool.pool_table()
    if not table:
        raise SystemExit("no process pool here (a compiler with OpenMP is needed)")
    with tempfile.TemporaryDirectory() as tmp:
        models = [_model(name, Path(tmp)) for name in names]
        expected = [run() for run, _ in models]
        samples: dict = {"shared": [], "own": []}
        load = _start_load(args.load)
        try:
            for r in range(args.rounds):
                for mode in (("shared", "own") if r % 2 == 0 else ("own", "shared")):
                    for _, attach in models:
                        attach(table if mode == "shared" else None)
                    for run, _ in models:  # (warm-up: the own pools start their workers)
                        run()
                    start = time.perf_counter()
                    for _ in range(args.calls):
                        for run, _ in models:
                            run()
                    samples[mode].append((time.perf_counter() - start) * 1e3 / args.calls)
        finally:
            _stop_load(load)
            for _, attach in models:
                attach(table)
        for (run, _), want in zip(models, expected):
            np.testing.assert_allclose(run(), want, rtol=1e-5, atol=1e-6)
    shared, own = (statistics.median(samples[m]) for m in ("shared", "own"))
    print("| models | threads | load | shared pool ms per pair | own pools ms per pair | shared / own |")
    print("| --- | --- | --- | --- | --- | --- |")
    print(f"| {' + '.join(names)} | {args.threads} | {args.load} | {shared:.3f} | {own:.3f} | {shared / own:.2f} |")


if __name__ == "__main__":
    main()
