"""The packed convolution (``nn.conv2d_packed``) against the paths it replaced, on a corpus CNN in one
process: the model compiled twice, once as ``PackWeights`` packs it and once with its convolution rule
switched off (long reductions then run im2col + the product or the direct kernel, as before), both
called interleaved with ONNX Runtime (its thread pool not spinning between calls). On a shared machine
only these ratios mean anything.

    .venv/bin/python benchmarks/conv_variants.py                    # resnet18, 1 thread
    .venv/bin/python benchmarks/conv_variants.py mobilenetv3 --threads 2 --rounds 40

The ONNX files are the corpus's exports in the benchmark cache (``benchmarks/run.py`` makes them), as in
``compile_time.py``.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from compile_time import SHAPES, find_onnx  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", nargs="?", default="resnet18", choices=sorted(SHAPES))
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--onnx-dir")
    args = parser.parse_args()
    path = find_onnx(args.model, args.onnx_dir)
    if path is None:
        print(f"no ONNX export of {args.model}: run benchmarks/run.py --models {args.model} first")
        return 1

    import onnxruntime as ort
    from models.common import import_from_onnx

    import tensorvm as tv
    from tensorvm.transform import pack_weights

    tv.set_num_threads(args.threads)
    shape = SHAPES[args.model]
    dims = [1 if d is None else d for d in shape["images"]]
    x = np.random.default_rng(0).standard_normal(dims).astype(np.float32)

    def build():
        mod, params = import_from_onnx(path, shape=shape)
        exe = tv.vm.compile(mod, target="c", params=params)
        return exe, tv.vm.VirtualMachine(exe)

    packed_exe, packed = build()
    rule = pack_weights._takes_packed
    pack_weights._takes_packed = lambda *_: False
    try:
        _, before = build()
    finally:
        pack_weights._takes_packed = rule
    options = ort.SessionOptions()
    options.intra_op_num_threads = args.threads
    # (its idle workers would otherwise spin after each call, on the cores the next call runs on: at 2
    # threads whichever variant ran right after ONNX Runtime measured 2-3x slower)
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    calls = {"without": lambda: before.invoke("main", x), "packed": lambda: packed.invoke("main", x),
             "onnxruntime": lambda: session.run(None, {"images": x})}
    times: dict = {name: [] for name in calls}
    for call in calls.values():
        call()
    for _ in range(args.rounds):
        for name, call in calls.items():
            start = time.perf_counter()
            call()
            times[name].append(time.perf_counter() - start)
    median = {name: float(np.median(v)) * 1e3 for name, v in times.items()}
    print(f"{args.model}, {args.threads} thread(s), {args.rounds} interleaved rounds; packed convolutions: "
          f"{packed_exe.stats()['kernel_library']['variants'].get('packed', 0)} kernels")
    for name, ms in median.items():
        print(f"  {name:12s} {ms:9.2f} ms")
    print(f"  packed / without {median['packed'] / median['without']:.3f}, packed / onnxruntime "
          f"{median['packed'] / median['onnxruntime']:.3f}, without / onnxruntime "
          f"{median['without'] / median['onnxruntime']:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
