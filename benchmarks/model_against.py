"""A corpus CNN (or the suite's small CNN) at batch 1 built twice in one process, once with this checkout's kernel library and once with
another checkout's (``--against``: its ``tensorvm/codegen/lib`` text, the same code generator), each
library on its own pool, timed interleaved at each thread count beside ONNX Runtime (not spinning).

    .venv/bin/python benchmarks/model_against.py --against ../main                     # mobilenetv3, 1 and 2 threads
    .venv/bin/python benchmarks/model_against.py resnet18 --against ../main --rounds 20
    .venv/bin/python benchmarks/model_against.py cnn --against ../main --calls 200   # the suite's small CNN

Rounds alternate the order of the runtimes; each round times ``--calls`` calls of each and keeps their
median; the table gives the median over the rounds, the median of the per-round ratios here / there, and
each runtime's gain from 1 to 2 threads. On a shared machine only the ratios mean anything. The two
builds' outputs are checked equal (to float tolerance) before timing. The encoders (``distilbert``,
``roberta``, ``t5-encoder``) take ``--tokens`` per row; a model with several outputs is checked on its first.

Read ratios within a few percent with care: two identical libraries (the same text but for a comment)
measured 1.06x, second-built over first-built, on the small CNN at 1 thread (16 rounds of 200 calls,
twice), and 0.99-1.01x on the corpus CNNs; the order the two are built in is not alternated.
"""

from __future__ import annotations

import argparse
import ctypes
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from compile_time import SHAPES, find_onnx  # noqa: E402
from kernel_gap import ENCODERS, model_feeds  # noqa: E402


def library_text(lib_dir: Path) -> tuple[str, str]:
    """(PRELUDE, BLAS_BRIDGE) made from the headers in ``lib_dir`` as ``c_emit`` makes its own."""
    from tensorvm.codegen import c_emit

    vec = (lib_dir / "tv_vec.h").read_text()
    prelude = c_emit.PRELUDE.split("\n", 1)[0] + "\n" + (lib_dir / "tv_kernel.h").read_text().replace(
        c_emit._VEC_INCLUDE, vec, 1)
    bridge = "\n" + (lib_dir / "tv_gemm.h").read_text().replace(c_emit._KERNEL_INCLUDE, "", 1)
    for name in c_emit._VECTOR_INCLUDES:
        bridge = bridge.replace(f'#include "{name}"\n', (lib_dir / name).read_text(), 1)
    return prelude, bridge


def build(mod, params, lib_dir: Path | None):
    """The model's executable with the library of ``lib_dir`` (None: this checkout's), on its own pool."""
    import tensorvm as tv
    from tensorvm.codegen import c_emit

    saved = c_emit.PRELUDE, c_emit.BLAS_BRIDGE
    if lib_dir is not None:
        c_emit.PRELUDE, c_emit.BLAS_BRIDGE = library_text(lib_dir)
    try:
        exe = tv.vm.compile(mod, target="c", params=params)
        exe.kernels  # noqa: B018 - built now, with this text
    finally:
        c_emit.PRELUDE, c_emit.BLAS_BRIDGE = saved
    ctypes.CDLL(exe.c_library.library_path).tv_team_attach(None)  # (its own pool, built from its own text)
    return tv.vm.VirtualMachine(exe), exe.c_library.library_path


def small_cnn(directory: Path) -> tuple:
    """The suite's small CNN (benchmarks/models/cnn.py): its IR, params, feeds and ONNX export in ``directory``."""
    import torch
    from models import cnn
    from models.common import export_static_onnx

    weights, x = cnn.make_weights(), cnn.make_input()
    mod, params = cnn.build_ir(weights)
    path = directory / "cnn.onnx"
    export_static_onnx(cnn.torch_cnn(torch, weights), x, path, "x")
    return mod, params, {"x": x}, path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", nargs="?", default="mobilenetv3", choices=sorted(SHAPES) + sorted(ENCODERS) + ["cnn"])
    parser.add_argument("--tokens", type=int, default=64, help="tokens per row (the encoders)")
    parser.add_argument("--against", required=True, help="another tensorvm checkout")
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--calls", type=int, default=20)
    args = parser.parse_args()
    import onnxruntime as ort

    import tensorvm as tv

    if args.model == "cnn":
        mod, params, feeds, path = small_cnn(Path(tempfile.mkdtemp(prefix="tv-against-")))
    else:
        path = find_onnx(args.model, None)
        if path is None:
            print(f"no ONNX export of {args.model}: run benchmarks/run.py --models {args.model} first")
            return 1
        from models.common import import_from_onnx

        shape, feeds = model_feeds(args.model, 1, args.tokens)
        mod, params = import_from_onnx(path, shape=shape)
    (there, there_path), (here, here_path) = (build(mod, params, Path(args.against) / "tensorvm" / "codegen" / "lib"),
                                              build(mod, params, None))
    if there_path == here_path:
        print(f"the two checkouts' libraries are the same ({here_path})")
        return 1
    runners = {"there": there, "here": here}
    inputs = [feeds[p.name_hint] for p in mod["main"].params if p.name_hint not in params]
    threads = [int(t) for t in args.threads.split(",")]
    sessions = {}
    for count in threads:
        options = ort.SessionOptions()
        options.intra_op_num_threads = count
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")  # (no spinning into our turns)
        sessions[count] = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    reference = sessions[threads[0]].run(None, feeds)[0]
    for count in threads:
        tv.set_num_threads(count)
        for name, vm in runners.items():
            got = vm.invoke("main", *inputs)
            got = (got[0] if isinstance(got, tuple) else got).numpy()
            assert np.allclose(got, reference, rtol=1e-3, atol=1e-3), name
    times: dict = {}
    names = list(runners) + ["onnxruntime"]
    for r in range(args.rounds):
        for count in threads:
            tv.set_num_threads(count)
            for name in names if r % 2 == 0 else names[::-1]:
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
          f"medians); here / there: median of the per-round ratios")
    print(f"{'threads':8s}" + "".join(f"{n:>12s}" for n in names) + f"{'here/there':>12s}{'here/ORT':>10s}")
    for count in threads:
        ratio = np.median(np.array(times[(count, "here")]) / np.array(times[(count, "there")]))
        peer = np.median(np.array(times[(count, "here")]) / np.array(times[(count, "onnxruntime")]))
        print(f"{count:<8d}" + "".join(f"{np.median(times[(count, n)]):12.0f}" for n in names)
              + f"{ratio:12.3f}{peer:10.2f}")
    if len(threads) > 1:
        lo, hi = threads[0], threads[-1]
        print(f"gain from {lo} to {hi} threads: " + ", ".join(
            f"{n} {np.median(times[(lo, n)]) / np.median(times[(hi, n)]):.2f}x" for n in names))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
