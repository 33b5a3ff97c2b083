"""Where an LSTM 256->512 (batch 1) token goes in native mode, against its floor measured two ways.

    .venv/bin/python benchmarks/lstm_breakdown.py [--threads 1 2] [--tokens 128] [--rounds 7]

``benchmarks/floors.py`` takes the floor as the fastest single ``1x512 . 512x2048`` product of a round.
A model call runs T products back to back, so its per-token time compares with the products' typical
time, not their luckiest one. This prints, per thread count (each in its own process), in rounds that
interleave everything:

* the bare packed product (the same kernel and packed weights the model's step calls, bound as a
  constant, called from Python): its fastest call, and the median call of the round;
* a native-mode loop of T bare products (``@loop`` below: the product and a ``tanh`` of a slice to keep
  ``h`` bounded) per token: the floor as the runtime can run it back to back;
* the LSTM in native mode per token (whole calls, fastest of the round), and its native profile split
  into the recurrent product, the input projection, the cell's kernels (one ``nn.lstm_cell`` since
  ``FuseLSTMCell``; two gate kernels before), row copies (``take``, ``split``: none left since), the
  loop's scalar kernels and the C runtime's own work between kernels (dispatch, allocation).

Medians over rounds. The machine may be shared: compare ratios measured in the same rounds.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent

BARE_LOOP = """
def @main(%h: Tensor[(1, {h}), float32], %n: int32, %w: Tensor[({g}, {h}), float32]) -> Tensor[(1, {h}), float32] {{
  @loop(0, %n, %h, %w)
}}

def @loop(%t: int32, %n: int32, %h: Tensor[(1, {h}), float32], %w: Tensor[({g}, {h}), float32])
    -> Tensor[(1, {h}), float32] {{
  if (less(%t, %n)) {{
    %p = nn.dense(%h, %w);
    @loop(add(%t, 1), %n, tanh(strided_slice(%p, begin=[0, 0], end=[1, {h}])), %w)
  }} else {{
    %h
  }}
}}
"""


def classify(name: str, calls: int) -> str:
    """The part of a step a kernel of the LSTM's native profile belongs to (the projection is the product
    called once per call, the recurrent product the one called per token)."""
    if name.startswith("fused_nn_dense"):
        return "projection" if calls == 1 else "product"
    if "sigmoid" in name or "tanh" in name or "lstm_cell" in name:
        return "cell"
    if "take" in name or "split" in name:
        return "copies"
    return "other kernels"


def worker(threads: int, tokens: int, rounds: int) -> dict:
    sys.path.insert(0, str(HERE))
    import numpy as np
    from floors import bound_kernel
    from models import lstm

    import tensorvm as tv

    weights = lstm.make_weights(lstm.INPUT_SIZE, lstm.HIDDEN_SIZE)
    mod, params = lstm.build_ir(lstm.INPUT_SIZE, lstm.HIDDEN_SIZE, weights)
    vm = tv.vm.VirtualMachine(tv.vm.compile(mod, target="c", params=params, exec_mode="native"))
    xs = lstm.make_sequence(lstm.INPUT_SIZE, tokens)
    hidden, gates = lstm.HIDDEN_SIZE, 4 * lstm.HIDDEN_SIZE
    text = (f"def @main(%h: Tensor[(1, {hidden}), float32], %w: Tensor[({gates}, {hidden}), float32]) "
            f"{{ nn.dense(%h, %w) }}")
    kernel, packed = bound_kernel(text, weights["w_hh"])
    h = np.random.default_rng(0).uniform(-1, 1, (1, hidden)).astype("float32")
    out = np.empty((1, gates), "float32")
    kernel(h, packed, out)
    np.testing.assert_allclose(out, h @ weights["w_hh"].T, rtol=1e-4, atol=1e-4)
    loop_mod = tv.parse(BARE_LOOP.format(h=hidden, g=gates))
    loop_vm = tv.vm.VirtualMachine(tv.vm.compile(loop_mod, target="c", params={"w": weights["w_hh"]},
                                                 exec_mode="native"))
    want = h
    for _ in range(3):
        want = np.tanh(want @ weights["w_hh"][:hidden].T)
    np.testing.assert_allclose(loop_vm.invoke("main", h, np.int32(3)).numpy(), want, rtol=1e-4, atol=1e-5)
    n = np.int32(tokens)
    clock = time.perf_counter_ns
    rows: dict = {}

    def add(key, value):
        rows.setdefault(key, []).append(value)

    for _ in range(rounds):
        calls = []
        for _ in range(2 * tokens):
            t = clock()
            kernel(h, packed, out)
            calls.append(clock() - t)
        add("bare product: fastest call", min(calls) / 1e3)
        add("bare product: median call", statistics.median(calls) / 1e3)
        best = min(_timed(lambda: loop_vm.invoke("main", h, n)) for _ in range(5))
        add("native loop of bare products, per token", best / tokens / 1e3)
        best = min(_timed(lambda: vm.invoke("main", xs)) for _ in range(5))
        add("LSTM native, per token", best / tokens / 1e3)
        report = vm.profile("main", xs, warmup=1)
        parts: dict = {}
        for row in report.rows:
            part = classify(row.name, row.calls)
            parts[part] = parts.get(part, 0.0) + row.total_us
        parts["runtime between kernels"] = report.total_us - report.kernel_us
        for key, us in parts.items():
            add(f"LSTM profile: {key}", us / tokens)
        add("LSTM profile: total", report.total_us / tokens)
        loop_report = loop_vm.profile("main", h, n, warmup=1)
        product = sum(r.total_us for r in loop_report.rows if r.name.startswith("fused_nn_dense"))
        add("loop profile: product", product / tokens)
    return {"threads": threads, "tokens": tokens, "us": {k: statistics.median(v) for k, v in rows.items()}}


def _timed(fn) -> int:
    start = time.perf_counter_ns()
    fn()
    return time.perf_counter_ns() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--worker", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker is not None:
        print(json.dumps(worker(args.worker, args.tokens, args.rounds)))
        return 0
    from harness import thread_environment  # (the benchmarks directory: this script's own)

    for threads in args.threads:
        env = thread_environment(threads)
        out = subprocess.run([sys.executable, __file__, "--worker", str(threads), "--tokens", str(args.tokens),
                              "--rounds", str(args.rounds)], env=env, check=True, capture_output=True,
                             text=True).stdout
        result = json.loads(out.strip().splitlines()[-1])
        print(f"== {result['threads']} thread(s), {result['tokens']} tokens (us per token; medians over rounds)")
        for key, us in result["us"].items():
            print(f"   {key:<48} {us:8.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
