"""Where a narrow product (fewer rows than a vector has lanes) splits over threads: each program built
twice in one process, with ``parallel_work_narrow`` as the host's rule gives it and pinned to
``parallel_work`` (the threshold of every product before the rule), called interleaved; medians.

    .venv/bin/python benchmarks/narrow_split.py --threads 2 --rounds 30

The lone products have their operands hot in one core's cache, the worst case for a split; the
Tree-LSTM (``models/treelstm.py``) reads 1.1 MB of weights per node, more than one core's L2 here.
On a shared machine only the ratios mean anything.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import numpy as np  # noqa: E402
from lone_layers import interleaved_times  # noqa: E402

import tensorvm as tv  # noqa: E402
from tensorvm.codegen import host  # noqa: E402
from tensorvm.vm import VirtualMachine  # noqa: E402

PRODUCTS = [(1, 450, 300), (1, 450, 150), (1, 256, 256), (3, 384, 128), (8, 128, 128), (64, 64, 32)]


def _compiled(mod, narrow: int | None, exec_mode: str = "bytecode"):
    """``mod`` compiled with ``parallel_work_narrow`` pinned to ``narrow`` (None: the host's rule)."""
    rule = host.kernel_rules
    if narrow is not None:
        host.kernel_rules = lambda desc=None: dataclasses.replace(rule(desc), parallel_work_narrow=narrow)
    try:
        return VirtualMachine(tv.vm.compile(mod, target="c", exec_mode=exec_mode))
    finally:
        host.kernel_rules = rule


def _interleaved(calls: dict, rounds: int, repeat: int) -> dict:
    """{name: median us of one call}, ``repeat`` calls per sample (``lone_layers.interleaved_times``)."""
    def repeated(call):
        def run():
            for _ in range(repeat):
                call()
        return run

    times = interleaved_times({key: repeated(call) for key, call in calls.items()}, rounds)
    return {key: statistics.median(values) / repeat for key, values in times.items()}


def products(rounds: int, old: int) -> None:
    rng = np.random.default_rng(0)
    print("| product (m x n x k) | multiply-adds | rule (us) | pinned to parallel_work (us) | rule / pinned |")
    print("| --- | --- | --- | --- | --- |")
    for m, n, k in PRODUCTS:
        mod = tv.parse(f"def @main(%x: Tensor[({m}, {k}), float32], %w: Tensor[({n}, {k}), float32]) "
                       "{ nn.dense(%x, %w) }")
        x, w = rng.standard_normal((m, k)).astype(np.float32), rng.standard_normal((n, k)).astype(np.float32)
        vms = {"rule": _compiled(mod, None), "pinned": _compiled(mod, old)}
        for vm in vms.values():
            np.testing.assert_allclose(vm.invoke("main", x, w).numpy(), x @ w.T, rtol=1e-4, atol=1e-4)
        calls = {key: (lambda vm=vm, x=x, w=w: vm.invoke("main", x, w)) for key, vm in vms.items()}
        t = _interleaved(calls, rounds, 100)
        print(f"| {m} x {n} x {k} | {m * n * k} | {t['rule']:.2f} | {t['pinned']:.2f} | "
              f"{t['rule'] / t['pinned']:.2f} |")


def tree_lstm(rounds: int, old: int) -> None:
    from models import treelstm

    weights = treelstm.make_weights(treelstm.INPUT_SIZE, treelstm.HIDDEN_SIZE)
    trees = treelstm.make_trees(treelstm.NUM_TREES, treelstm.INPUT_SIZE)
    mod, _ = treelstm.build_ir(treelstm.INPUT_SIZE, treelstm.HIDDEN_SIZE, weights)
    names = ["w_iou", "u_iou", "b_iou", "w_f", "u_f", "b_f"]
    values = [treelstm.tree_value(mod, t) for t in trees]
    nodes = sum(treelstm.count_nodes(t) for t in trees)
    vms = {"rule": _compiled(mod, None, "native"), "pinned": _compiled(mod, old, "native")}
    results = {key: vm.invoke("main", values[0], *[weights[n] for n in names]) for key, vm in vms.items()}
    np.testing.assert_array_equal(results["rule"][0].numpy(), results["pinned"][0].numpy())

    def run(vm):
        for value in values:
            vm.invoke("main", value, *[weights[n] for n in names])

    t = _interleaved({key: (lambda vm=vm: run(vm)) for key, vm in vms.items()}, rounds, 1)
    print(f"| Tree-LSTM, per node ({nodes} nodes, native mode) | | {t['rule'] / nodes:.2f} | "
          f"{t['pinned'] / nodes:.2f} | {t['rule'] / t['pinned']:.2f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=30)
    args = parser.parse_args()
    tv.set_num_threads(args.threads)
    rules = host.kernel_rules()
    print(f"threads {args.threads}; parallel_work_narrow {rules.parallel_work_narrow} by the rule "
          f"({rules.why()['parallel_work_narrow'].split(':')[0]}), parallel_work {rules.parallel_work}\n")
    products(args.rounds, rules.parallel_work)
    tree_lstm(max(5, args.rounds // 2), rules.parallel_work)


if __name__ == "__main__":
    main()
