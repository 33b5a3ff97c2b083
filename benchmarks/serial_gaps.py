"""A corpus CNN at batch 1 with the kernel library built as before and after three changes of the
2-thread path, interleaved in one process (each variant its own library, each library on its own pool, built
from its own text), beside ONNX Runtime:

* ``TV_TEAM_IDLE_FROM_JOBS`` (``tv_team.h``): an idle worker's spin counted from its last job only, as
  before; without it the spin counts from the caller's last call, serial ones included, so that the
  serial kernels between two splits (MobileNetV3's squeeze-and-excitation blocks: a mean, two 1 x 1
  products, a multiply, 20-60 us) do not put the worker to sleep before the next split;
* ``TV_GEMM_NARROW_ROWS_ONLY`` (``tv_gemm.h``): a product splits from ``parallel_work_narrow`` only when
  it has few rows, as before; without it also when it has few columns (a 1 x 1 image's 1x1
  convolution, a GEMV per image);
* ``TV_VCONV_PAD_SERIAL`` (``tv_vconv.h``): the direct convolution's padded copy of the image on the
  caller alone, as before; without it in chunks of rows on the pool (the stem: 3 x 224 x 224, stride 2).

    .venv/bin/python benchmarks/serial_gaps.py                       # mobilenetv3, 1 and 2 threads
    .venv/bin/python benchmarks/serial_gaps.py --rounds 20 --threads 2

Rounds alternate the order of the variants; each round times ``--calls`` calls of each and keeps their
median; the table gives the median over the rounds and the median of the per-round ratios to "before".
On a shared machine only the ratios mean anything.
"""

from __future__ import annotations

import argparse
import ctypes
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from compile_time import SHAPES, find_onnx  # noqa: E402
from kernel_gap import model_feeds  # noqa: E402

VARIANTS = {"before": ("TV_TEAM_IDLE_FROM_JOBS", "TV_GEMM_NARROW_ROWS_ONLY", "TV_VCONV_PAD_SERIAL"),
            "narrow columns": ("TV_TEAM_IDLE_FROM_JOBS", "TV_VCONV_PAD_SERIAL"), "+ spin from calls": ("TV_VCONV_PAD_SERIAL",),
            "after": ()}


def build_variant(mod, params, defines: tuple):
    """The model's executable with ``defines`` in its library's text (and, through a module constant of
    the code generator, in its kernels' keys: a variant is its own library), on the library's own pool."""
    import tensorvm as tv
    from tensorvm.codegen import c_emit

    rule_defines = c_emit._rule_defines
    c_emit.BENCH_DEFINES = ",".join(defines)
    c_emit._rule_defines = lambda: rule_defines() + "".join(f"#define {d}\n" for d in defines)
    try:
        exe = tv.vm.compile(mod, target="c", params=params)
        exe.kernels  # noqa: B018 - built now, under the defines
    finally:
        c_emit._rule_defines = rule_defines
        del c_emit.BENCH_DEFINES
    ctypes.CDLL(exe.c_library.library_path).tv_team_attach(None)  # (its own pool, built from its own text)
    return tv.vm.VirtualMachine(exe)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", nargs="?", default="mobilenetv3", choices=sorted(SHAPES))
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--calls", type=int, default=20)
    args = parser.parse_args()
    path = find_onnx(args.model, None)
    if path is None:
        print(f"no ONNX export of {args.model}: run benchmarks/run.py --models {args.model} first")
        return 1
    import onnxruntime as ort
    from models.common import import_from_onnx

    import tensorvm as tv

    shape, feeds = model_feeds(args.model, 1, 0)
    mod, params = import_from_onnx(path, shape=shape)
    runners = {name: build_variant(mod, params, defines) for name, defines in VARIANTS.items()}
    inputs = [feeds[p.name_hint] for p in mod["main"].params]
    reference = runners["before"].invoke("main", *inputs).numpy()
    threads = [int(t) for t in args.threads.split(",")]
    sessions = {}
    for count in threads:
        options = ort.SessionOptions()
        options.intra_op_num_threads = count
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")  # (no spinning into our turns)
        sessions[count] = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    for count in threads:
        tv.set_num_threads(count)
        for name, vm in runners.items():
            got = vm.invoke("main", *inputs).numpy()
            assert np.array_equal(got, reference) or np.allclose(got, reference, rtol=1e-4, atol=1e-4), name
    times: dict = {}
    for r in range(args.rounds):
        for count in threads:
            tv.set_num_threads(count)
            order = list(runners) + ["onnxruntime"]
            for name in order if r % 2 == 0 else order[::-1]:
                call = (lambda s=sessions[count]: s.run(None, feeds)) if name == "onnxruntime" else \
                    (lambda vm=runners[name]: vm.invoke("main", *inputs))
                for _ in range(3):
                    call()
                samples = []
                for _ in range(args.calls):
                    start = time.perf_counter()
                    call()
                    samples.append(time.perf_counter() - start)
                times.setdefault((count, name), []).append(float(np.median(samples)) * 1e6)
    print(f"{args.model}, batch 1, {args.rounds} rounds of {args.calls} calls, us per call (median of the rounds' "
          f"medians; in brackets the median of the per-round ratios before / this)")
    names = list(runners) + ["onnxruntime"]
    print(f"{'threads':8s}" + "".join(f"{n:>20s}" for n in names))
    for count in threads:
        before = np.array(times[(count, "before")])
        cells = [f"{np.median(times[(count, n)]):6.0f} ({np.median(before / np.array(times[(count, n)])):5.3f}x)"
                 for n in names]
        print(f"{count:<8d}" + "".join(f"{c:>20s}" for c in cells))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
