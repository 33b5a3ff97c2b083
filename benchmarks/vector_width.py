"""One corpus model built for two vector widths in one process: with 64-byte vectors and 32 registers
(``avx512``) and with 32-byte vectors and 16 registers (``avx2``), both compiled with the same
``-march=native`` flags, called interleaved with ONNX Runtime (its pool not spinning between calls);
then each build's kernels, best of several profiled rounds, side by side, matched by (first input shape,
output shape) as ``kernel_gap.py`` matches them.

    .venv/bin/python benchmarks/vector_width.py resnet18 --batch 1 --rounds 30
    .venv/bin/python benchmarks/vector_width.py distilbert --batch 1 --tokens 128 --threads 2

On a double-pumped AVX-512 machine (Zen 4) the question is which kernels gain from the wider vectors; on
an Intel server with two 512-bit FMA units most should. On a shared machine only the ratios mean
anything. ``--variants`` takes other ``$TENSORVM_HOST`` values (ISA names or JSON), comma-separated with
``;`` between JSON objects: ``'{"isa": "avx512", "fma_bits": 512};{"isa": "avx512", "fma_bits": 256}'`` is
the default before and after the FMA-width rule on a Zen 4 (64-byte vectors with thresholds for 32
multiply-adds per cycle, against 32-byte vectors with thresholds for 16).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from compile_time import SHAPES, find_onnx  # noqa: E402
from kernel_gap import model_feeds, tensorvm_kernels  # noqa: E402
from models.text import ENCODERS  # noqa: E402


def _describe(value: str):
    import json

    from tensorvm.codegen import host as hostmod

    if value.startswith("{"):
        import dataclasses

        fields = json.loads(value)
        base = hostmod.host()
        if "isa" in fields:
            base = hostmod.isa_host(fields["isa"], base)
        desc = dataclasses.replace(base, **fields)
        # (a datapath width without vectors: the vectors follow it by the rule, as with $TENSORVM_HOST)
        return hostmod.fma_vector_host(desc) if "fma_bits" in fields and "vector_bytes" not in fields else desc
    return hostmod.isa_host(value, hostmod.host())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", nargs="?", default="resnet18", choices=sorted(SHAPES) + sorted(ENCODERS))
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--rows", type=int, default=20)
    parser.add_argument("--variants", default="avx512,avx2")
    parser.add_argument("--onnx-dir")
    args = parser.parse_args()
    path = find_onnx(args.model, args.onnx_dir)
    if path is None:
        print(f"no ONNX export of {args.model}: run benchmarks/run.py --models {args.model} first")
        return 1

    import numpy as np
    import onnxruntime as ort
    from models.common import import_from_onnx

    import tensorvm as tv
    from tensorvm.codegen import host as hostmod

    tv.set_num_threads(args.threads)
    shape, feeds = model_feeds(args.model, args.batch, args.tokens)
    variants = [v for v in (args.variants.split(";") if "{" in args.variants else args.variants.split(",")) if v]
    vms, inputs = {}, None
    for value in variants:
        hostmod.set_host(_describe(value))
        mod, params = import_from_onnx(path, shape=shape)
        inputs = [feeds[p.name_hint] for p in mod["main"].params]
        vms[value] = tv.vm.VirtualMachine(tv.vm.compile(mod, target="c", params=params))
        vms[value].invoke("main", *inputs)  # (builds, calibrates: not timed)
        print(f"{value}: {hostmod.width_why(hostmod.host())}; macs_per_cycle "
              f"{hostmod.kernel_rules(hostmod.host()).macs_per_cycle}")
    hostmod.set_host(None)
    options = ort.SessionOptions()
    options.intra_op_num_threads = args.threads
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    want = session.run(None, feeds)[0]
    for value, vm in vms.items():
        got = vm.invoke("main", *inputs)
        got = got[0] if isinstance(got, (list, tuple)) else got
        got = got.numpy() if hasattr(got, "numpy") else np.asarray(got)
        error = float(np.abs(got - want).max() / max(1.0, float(np.abs(want).max())))
        if error > 1e-3:
            raise SystemExit(f"{value}: relative error {error} against ONNX Runtime")

    runs = {f"tensorvm {v}": (lambda vm=vm: vm.invoke("main", *inputs)) for v, vm in vms.items()}
    runs["onnxruntime"] = lambda: session.run(None, feeds)
    times = defaultdict(list)
    for _ in range(args.rounds):
        for name, run in runs.items():
            start = time.perf_counter()
            run()
            times[name].append(time.perf_counter() - start)
    peer = statistics.median(times["onnxruntime"])
    print(f"{args.model}, batch {args.batch}{f' x {args.tokens} tokens' if args.model in ENCODERS else ''}, "
          f"{args.threads} thread(s), median of {args.rounds} interleaved rounds:")
    for name, took in times.items():
        t = statistics.median(took)
        print(f"  {name:28s} {t * 1e3:9.2f} ms   {peer / t:5.2f}x ONNX Runtime")

    # Kernel by kernel: each build's best over the rounds, grouped by (first input, output) shape.
    per = {}
    for value, vm in vms.items():
        groups: dict = defaultdict(lambda: [0.0, []])
        for name, (calls, us, key) in tensorvm_kernels(vm, inputs, max(3, args.rounds // 4)).items():
            group = groups[key if key is not None else ("vm", name)]
            group[0] += us
            group[1].append(name.replace("fused_nn_", "").replace("fused_", ""))
        per[value] = groups
    first, second = variants[0], variants[1] if len(variants) > 1 else variants[0]
    keys = set(per[first]) | set(per[second])
    rows = sorted(keys, key=lambda k: -abs(per[first].get(k, [0.0])[0] - per[second].get(k, [0.0])[0]))
    print(f"{'kernels (same input and output shapes)':52s} {first[:10]:>10s} {second[:10]:>10s} {'ratio':>6s}  shapes")
    total = [0.0, 0.0]
    for key in keys:
        total[0] += per[first].get(key, [0.0])[0]
        total[1] += per[second].get(key, [0.0])[0]
    for key in rows[:args.rows]:
        a, b = per[first].get(key, [0.0, []]), per[second].get(key, [0.0, []])
        names = "+".join(a[1] or b[1])
        shapes = f"{key[0]} -> {key[1]}" if key[0] != "vm" else ""
        print(f"{names[:52]:52s} {a[0]:10.0f} {b[0]:10.0f} {a[0] / b[0] if b[0] else float('nan'):6.2f}  {shapes}")
    print(f"{'all kernels (us)':52s} {total[0]:10.0f} {total[1]:10.0f} {total[0] / total[1]:6.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
