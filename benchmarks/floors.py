"""The floors the recurrent models are measured against, beside native mode, PyTorch and ONNX Runtime.

    .venv/bin/python benchmarks/floors.py [--threads 1 2] [--rounds 5] [--round-seconds 0.3]

* LSTM 256->512, batch 1 (the suite's ``lstm``): µs per token of native mode (``exec_mode="native"``)
  at 32 and 128 tokens against **the floor**: one bare ``1x512 . 512x2048`` product (the recurrent
  ``h W_hh^T`` every token must do), the fastest of NumPy's BLAS and tensorvm's dense kernel (weights as an
  argument, and bound as a constant: the packed variant) called directly, and ONNX Runtime on the ONNX
  export of the same ``nn.LSTM``. The input projection (``(T x 256) . (256 x 2048)``, one product for
  all tokens) is work the floor leaves out; it is measured the same way and shown beside it.
* Tree-LSTM (the suite's ``treelstm``): µs per node of native mode and PyTorch eager, and a roofline: the
  bytes of weights a node reads (a leaf: ``W_iou``; an inner node: ``W_iou``, ``U_iou``, ``W_f``,
  ``U_f``), the bandwidth of the fastest bare products of an inner node's four weight matrices (the
  same resident weights, called back to back), and the floor per node they imply.

Each thread count runs in its own process (thread variables set before NumPy loads). The runtimes are
timed in interleaved rounds (best of a round's calls, median over rounds): the machine may be shared,
so compare the ratios, which are measured side by side.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def best_in(fn, seconds: float) -> float:
    """The fastest of ``fn``'s calls within about ``seconds`` (at least 3 calls)."""
    best, start, calls = float("inf"), time.perf_counter(), 0
    while calls < 3 or time.perf_counter() - start < seconds:
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
        calls += 1
    return best


def interleaved(runs: dict, rounds: int, seconds: float) -> dict:
    """name -> median over ``rounds`` of the best time in a round; the runtimes alternate within each round."""
    times: dict = {name: [] for name in runs}
    for _ in range(rounds):
        for name, fn in runs.items():
            times[name].append(best_in(fn, seconds))
    return {name: statistics.median(ts) for name, ts in times.items()}


def dense_floor_runs(rows: int, cols: int, prefix: str, batch: int = 1) -> dict:
    """Bare ``batch x cols . cols x rows`` products: NumPy's BLAS and tensorvm's dense kernel, called directly."""
    import numpy as np

    import tensorvm as tv

    rng = np.random.default_rng(0)
    w = rng.standard_normal((rows, cols)).astype("float32")
    wt = np.ascontiguousarray(w.T)
    h = rng.standard_normal((batch, cols)).astype("float32")
    out = np.empty((batch, rows), "float32")
    text = (f"def @main(%h: Tensor[({batch}, {cols}), float32], %w: Tensor[({rows}, {cols}), float32]) "
            f"{{ nn.dense(%h, %w) }}")
    as_argument = tv.vm.compile(tv.parse(text), target="c").kernels[0]
    as_argument(h, w, out)
    np.testing.assert_allclose(out, h @ w.T, rtol=1e-4, atol=1e-4)
    as_constant, packed = bound_kernel(text, w)
    as_constant(h, packed, out)
    np.testing.assert_allclose(out, h @ w.T, rtol=1e-4, atol=1e-4)
    return {f"{prefix} numpy": lambda: np.dot(h, wt, out=out), f"{prefix} tensorvm": lambda: as_argument(h, w, out),
            f"{prefix} tensorvm packed": lambda: as_constant(h, packed, out)}


def bound_kernel(text: str, w):
    """The dense kernel of ``text`` compiled with ``%w`` bound to ``w``, and the (packed) weight constant
    the VM passes it."""
    import tensorvm as tv
    from tensorvm.vm import bytecode as bc

    exe = tv.vm.compile(tv.parse(text), target="c", params={"w": w})
    consts = {ins.dst: exe.constants[ins.const_index] for ins in exe.functions[0].instructions
              if isinstance(ins, bc.LoadConst)}
    call = next(ins for ins in exe.functions[0].instructions if isinstance(ins, bc.InvokePacked))
    return exe.kernels[call.packed_index], consts[call.args[1]]


def lstm_runs(workdir: Path, threads: int) -> tuple[dict, dict]:
    import numpy as np
    import onnxruntime as ort
    from models import lstm

    import tensorvm as tv

    weights = lstm.make_weights(lstm.INPUT_SIZE, lstm.HIDDEN_SIZE)
    mod, params = lstm.build_ir(lstm.INPUT_SIZE, lstm.HIDDEN_SIZE, weights)
    vm = tv.vm.VirtualMachine(tv.vm.compile(mod, target="c", params=params, exec_mode="native"))
    path = workdir / "lstm.onnx"
    lstm.export_onnx(weights, path)
    options = ort.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    runs, tokens = {}, {}
    for n in lstm.SEQ_LENGTHS:
        xs = lstm.make_sequence(lstm.INPUT_SIZE, n)
        h, _ = vm.invoke("main", xs)
        np.testing.assert_allclose(h.numpy(), session.run(None, {"xs": xs})[0].reshape(h.shape), rtol=1e-3, atol=1e-4)
        runs[f"lstm native seq{n}"] = lambda xs=xs: vm.invoke("main", xs)
        runs[f"lstm ort seq{n}"] = lambda xs=xs: session.run(None, {"xs": xs})
        tokens[f"lstm native seq{n}"] = tokens[f"lstm ort seq{n}"] = n
    gates, longest = 4 * lstm.HIDDEN_SIZE, max(lstm.SEQ_LENGTHS)
    floor = dense_floor_runs(gates, lstm.HIDDEN_SIZE, "lstm floor")
    # the input projection of every token, one (T x input) . (input x 4H) product: work the floor leaves out
    projection = dense_floor_runs(gates, lstm.INPUT_SIZE, "lstm projection", batch=longest)
    return ({**runs, **floor, **projection},
            {**tokens, **dict.fromkeys(floor, 1), **dict.fromkeys(projection, longest)})


def treelstm_runs(threads: int) -> tuple[dict, dict, dict]:
    import numpy as np
    import torch
    from models import treelstm as tl

    import tensorvm as tv

    torch.set_num_threads(threads)
    i, h = tl.INPUT_SIZE, tl.HIDDEN_SIZE
    weights, trees = tl.make_weights(i, h), tl.make_trees(tl.NUM_TREES, i)
    nodes = sum(tl.count_nodes(t) for t in trees)
    leaves = (nodes + len(trees)) // 2  # full binary trees: k leaves, k - 1 inner nodes each
    mod, params = tl.build_ir(i, h, weights)
    vm = tv.vm.VirtualMachine(tv.vm.compile(mod, target="c", params=params, exec_mode="native"))
    args = [tl.tree_value(mod, t) for t in trees]
    node = tl.torch_tree_lstm(torch, weights)
    torch_trees = [tl.torch_tree(torch, t) for t in trees]
    for a, t in zip(args, torch_trees):
        with torch.no_grad():
            want = node(t)
        np.testing.assert_allclose(vm.invoke("main", a)[0].numpy(), want[0].numpy(), rtol=1e-3, atol=1e-4)

    def torch_run():
        with torch.no_grad():
            for t in torch_trees:
                node(t)

    # the bare products of an inner node, back to back (the floor's bandwidth)
    mats = {name: weights[name] for name in ("w_iou", "u_iou", "w_f", "u_f")}
    x, hh = np.ones((1, i), "float32"), np.ones((1, h), "float32")
    outs = {name: np.empty((1, m.shape[0]), "float32") for name, m in mats.items()}
    transposed = {name: np.ascontiguousarray(m.T) for name, m in mats.items()}
    kernels = {}
    for name, m in mats.items():
        text = (f"def @main(%v: Tensor[(1, {m.shape[1]}), float32], %w: Tensor[{m.shape}, float32]) "
                f"{{ nn.dense(%v, %w) }}")
        kernels[name] = bound_kernel(text, m)
    inputs = {"w_iou": x, "u_iou": hh, "w_f": x, "u_f": hh}

    def numpy_products():
        for name, m in transposed.items():
            np.dot(inputs[name], m, out=outs[name])

    def tensorvm_products():
        for name, (kernel, packed) in kernels.items():
            kernel(inputs[name], packed, outs[name])

    runs = {"treelstm native": lambda: [vm.invoke("main", a) for a in args], "treelstm torch": torch_run,
            "inner-node products numpy": numpy_products, "inner-node products tensorvm": tensorvm_products}
    units = {"treelstm native": nodes, "treelstm torch": nodes, "inner-node products numpy": 1,
             "inner-node products tensorvm": 1}
    inner_bytes = 4 * sum(m.size for m in mats.values())
    leaf_bytes = 4 * mats["w_iou"].size
    info = {"nodes": nodes, "leaves": leaves, "inner_bytes": inner_bytes, "leaf_bytes": leaf_bytes,
            "bytes_per_node": (leaves * leaf_bytes + (nodes - leaves) * inner_bytes) / nodes}
    return runs, units, info


def worker(threads: int, rounds: int, seconds: float) -> dict:
    sys.path.insert(0, str(HERE))
    with tempfile.TemporaryDirectory() as tmp:
        lstm, lstm_units = lstm_runs(Path(tmp), threads)
        tree, tree_units, info = treelstm_runs(threads)
        units = {**lstm_units, **tree_units}
        times = interleaved({**lstm, **tree}, rounds, seconds)
    from models import lstm

    flops = 2 * 4 * lstm.HIDDEN_SIZE * lstm.INPUT_SIZE  # the projection's, per token
    return {"threads": threads, "us": {k: t / units[k] * 1e6 for k, t in times.items()}, "tree": info,
            "projection_flops": flops}


def report(result: dict) -> None:
    us, info = result["us"], result["tree"]
    print(f"== {result['threads']} thread(s)")
    floor_name = min((k for k in us if k.startswith("lstm floor")), key=us.get)
    floor = us[floor_name]
    for k in sorted(k for k in us if k.startswith("lstm floor")):
        print(f"   {k:<34} {us[k]:8.1f} us")
    print(f"   LSTM floor: {floor:.1f} us per token ({floor_name})")
    projection_name = min((k for k in us if k.startswith("lstm projection")), key=us.get)
    projection = us[projection_name]
    print(f"   the input projection (not in the floor): {projection:.1f} us per token ({projection_name}, "
          f"{result['projection_flops'] / (projection * 1e-6) / 1e9:.1f} GFLOP/s); floor + projection "
          f"{floor + projection:.1f} us = {(floor + projection) / floor:.2f}x the floor")
    for k in sorted(k for k in us if k.startswith("lstm native")):
        ort = us[k.replace("native", "ort")]
        print(f"   {k:<34} {us[k]:8.1f} us/token  {us[k] / floor:5.2f}x the floor  "
              f"{us[k] / (floor + projection):5.2f}x floor + projection  {us[k] / ort:5.2f}x ONNX Runtime "
              f"({ort:.1f} us/token)")
    native, torch = us["treelstm native"], us["treelstm torch"]
    product = min(us["inner-node products numpy"], us["inner-node products tensorvm"])
    bandwidth = info["inner_bytes"] / (product * 1e-6)
    node_floor = info["bytes_per_node"] / bandwidth * 1e6
    print(f"   Tree-LSTM native {native:.1f} us/node, PyTorch eager {torch:.1f} us/node: {native / torch:.3f}x")
    print(f"   roofline: {info['bytes_per_node'] / 1e6:.3f} MB of weights per node on average (inner "
          f"{info['inner_bytes'] / 1e6:.3f} MB, leaf {info['leaf_bytes'] / 1e6:.3f} MB; {info['leaves']} leaves of "
          f"{info['nodes']} nodes); an inner node's bare products {product:.1f} us -> {bandwidth / 1e9:.1f} GB/s; "
          f"floor {node_floor:.1f} us/node, native at {native / node_floor:.2f}x the floor")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--round-seconds", type=float, default=0.3)
    parser.add_argument("--worker", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker is not None:
        print(json.dumps(worker(args.worker, args.rounds, args.round_seconds)))
        return 0
    from harness import thread_environment  # (the benchmarks directory: this script's own)

    for threads in args.threads:
        env = thread_environment(threads)
        out = subprocess.run([sys.executable, __file__, "--worker", str(threads), "--rounds", str(args.rounds),
                              "--round-seconds", str(args.round_seconds)], env=env, check=True,
                             capture_output=True, text=True).stdout
        report(json.loads(out.strip().splitlines()[-1]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
