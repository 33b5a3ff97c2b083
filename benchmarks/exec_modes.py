"""A corpus model on three VMs of one process, interleaved: the bytecode VM (its straight-line ``main`` run as
a body specialized to the shapes, with its placed arena), native mode without its arena
(``specialize=False``) and native mode (docs/native_mode.md, "Arena"). Rounds of calls rotate the order;
each VM's round median, and the median over the rounds of its ratio to the bytecode VM's. Outputs are
checked against the bytecode VM's first. On a shared machine only the ratios mean anything.

    .venv/bin/python benchmarks/exec_modes.py mobilenetv3 [--threads 1] [--batch 1] [--calls 40] [--rounds 21]
    .venv/bin/python benchmarks/exec_modes.py distilbert --batch 4 --tokens 64 --calls 5

The CNNs take ``--batch`` images; the encoders (distilbert, roberta, t5-encoder) ``--batch`` rows of
``--tokens`` tokens with the corpus's padding mask. The ONNX files are the benchmark cache's
(``benchmarks/run.py`` makes them). No assertion on time.
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

from compile_time import SHAPES  # noqa: E402
from kernel_gap import corpus_model  # noqa: E402
from models.common import flatten_outputs  # noqa: E402
from models.text import ENCODERS  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", choices=sorted(SHAPES) + sorted(ENCODERS))
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--tokens", type=int, default=64, help="tokens per row (the encoders)")
    parser.add_argument("--calls", type=int, default=40, help="calls per VM per round")
    parser.add_argument("--rounds", type=int, default=21)
    args = parser.parse_args()
    loaded = corpus_model(args.model, args.batch, args.tokens, args.threads)
    if loaded is None:
        return 1
    _, mod, params, feeds = loaded

    import tensorvm as tv

    inputs = [feeds[p.name_hint] for p in mod["main"].params]
    native = tv.vm.compile(mod, target="c", params=params, exec_mode="native")
    vms = {"bytecode": tv.vm.VirtualMachine(tv.vm.compile(mod, target="c", params=params, exec_mode="bytecode")),
           "native, no arena": tv.vm.VirtualMachine(native, specialize=False),
           "native": tv.vm.VirtualMachine(native)}
    reference = flatten_outputs(vms["bytecode"].invoke("main", *inputs))
    for name, vm in vms.items():
        for _ in range(3):
            got = flatten_outputs(vm.invoke("main", *inputs))
        for a, b in zip(got, reference, strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4, err_msg=name)
    medians: dict = {name: [] for name in vms}
    names = list(vms)
    for r in range(args.rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            vm, times = vms[name], []
            for _ in range(args.calls):
                start = time.perf_counter()
                vm.invoke("main", *inputs)
                times.append(time.perf_counter() - start)
            medians[name].append(statistics.median(times))
    print(f"{args.model}, batch {args.batch}, {args.threads} thread(s), {args.rounds} rounds of {args.calls} calls")
    for name, values in medians.items():
        ratio = statistics.median(v / b for v, b in zip(values, medians["bytecode"]))
        print(f"  {name:18s} median {1e6 * statistics.median(values):10.1f} us  min {1e6 * min(values):10.1f} us  "
              f"/ bytecode {ratio:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
