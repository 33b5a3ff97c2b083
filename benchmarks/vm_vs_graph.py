"""The VM measured against the graph executor on static models, as the Relay VM paper evaluates it.

    .venv/bin/python benchmarks/vm_vs_graph.py [--quick] [--target python|c|both]

For each model (an MLP, a small CNN, a BERT-like encoder at a fixed sequence length, and a tiny MLP
whose time is mostly dispatch; Relay text with random weights bound as params), on the same target:

* latency: seconds per call of ``VirtualMachine.benchmark`` and ``GraphModule.benchmark`` (the
  median over ``repeat`` interleaved batches of ``number`` calls), and their ratio (VM / graph);
* peak memory: the VM allocator's peak live bytes during one call against the graph's planned
  storage for the same tensors (the workspace plus the output storages; inputs and params are
  held by both and left out), and their ratio (VM / graph);
* the static planner's workspace bytes for every algorithm (and USMP's own placement, without
  gap filling), beside the lower bound (the most bytes live at one step) and the sum of all
  intermediates (no reuse).

The outputs of both executors are compared first; a mismatch stops the run. Where the VM cannot
use a target yet, the graph executor's numbers are still printed (VM columns "n/a"). BLAS runs on one
thread (unless the environment says otherwise) so that the numbers are stable on a shared machine.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

# One BLAS thread: multithreaded BLAS on a busy machine makes timings swing by 10-100x.
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import tensorvm as tv  # noqa: E402
import tensorvm.graph as tg  # noqa: E402
from tensorvm.transform.memory_planner import lower_static, plan_memory, static_lifetimes  # noqa: E402

ALGORITHMS = ("greedy_by_size", "greedy_by_conflicts", "hill_climb", "linear_scan", "no_reuse")


# --- models ---------------------------------------------------------------------------------------
def mlp(batch=32, sizes=(784, 512, 256, 10)):
    params, lines, x = {}, [], "%x"
    rng = np.random.default_rng(0)
    for i, (n_in, n_out) in enumerate(zip(sizes, sizes[1:])):
        params[f"w{i}"] = (rng.standard_normal((n_out, n_in)) / np.sqrt(n_in)).astype("float32")
        params[f"b{i}"] = rng.standard_normal(n_out).astype("float32") * 0.1
        lines.append(f"  %d{i} = nn.bias_add(nn.dense({x}, %w{i}), %b{i});")
        x = f"%d{i}"
        if i < len(sizes) - 2:
            lines.append(f"  %r{i} = nn.relu({x});")
            x = f"%r{i}"
    sig = ", ".join(f"%w{i}: Tensor[({o}, {n}), float32], %b{i}: Tensor[({o}), float32]"
                    for i, (n, o) in enumerate(zip(sizes, sizes[1:])))
    text = (f"def @main(%x: Tensor[({batch}, {sizes[0]}), float32], {sig}) {{\n" + "\n".join(lines)
            + f"\n  nn.softmax({x})\n}}")
    return tv.parse(text), params, {"x": rng.standard_normal((batch, sizes[0])).astype("float32")}


def small_cnn(batch=4):
    rng = np.random.default_rng(1)
    params = {"c1": rng.standard_normal((16, 3, 3, 3)).astype("float32") * 0.2,
              "c2": rng.standard_normal((32, 16, 3, 3)).astype("float32") * 0.1,
              "fc": rng.standard_normal((10, 32 * 8 * 8)).astype("float32") * 0.02,
              "fb": rng.standard_normal(10).astype("float32") * 0.1}
    text = f"""
def @main(%x: Tensor[({batch}, 3, 32, 32), float32], %c1: Tensor[(16, 3, 3, 3), float32],
          %c2: Tensor[(32, 16, 3, 3), float32], %fc: Tensor[(10, 2048), float32], %fb: Tensor[(10), float32]) {{
  %0 = nn.relu(nn.conv2d(%x, %c1, padding=[1, 1], channels=16, kernel_size=[3, 3]));
  %1 = nn.max_pool2d(%0, pool_size=[2, 2], strides=[2, 2]);
  %2 = nn.relu(nn.conv2d(%1, %c2, padding=[1, 1], channels=32, kernel_size=[3, 3]));
  %3 = nn.max_pool2d(%2, pool_size=[2, 2], strides=[2, 2]);
  %4 = nn.batch_flatten(%3);
  nn.softmax(nn.bias_add(nn.dense(%4, %fc), %fb))
}}"""
    return tv.parse(text), params, {"x": rng.standard_normal((batch, 3, 32, 32)).astype("float32")}


def bert_encoder(seq=64, hidden=128, heads=4, ffn=512, layers=2):
    rng = np.random.default_rng(2)
    head_dim = hidden // heads
    params, sig, lines = {}, [], []

    def weight(name, shape, scale):
        params[name] = (rng.standard_normal(shape) * scale).astype("float32")
        sig.append(f"%{name}: Tensor[({', '.join(map(str, shape))}{',' if len(shape) == 1 else ''}), float32]")
        return f"%{name}"

    def split_heads(value, out):
        lines.append(f"  %{out} = transpose(reshape({value}, newshape=[{seq}, {heads}, {head_dim}]), axes=[1, 0, 2]);")

    x = "%x"
    for i in range(layers):
        s = 1 / np.sqrt(hidden)
        for proj in ("q", "k", "v"):
            w, b = weight(f"w{proj}{i}", (hidden, hidden), s), weight(f"b{proj}{i}", (hidden,), 0.02)
            lines.append(f"  %{proj}{i} = nn.bias_add(nn.dense({x}, {w}), {b});")
            split_heads(f"%{proj}{i}", f"{proj}h{i}")
        lines.append(f"  %s{i} = nn.softmax(multiply(nn.batch_matmul(%qh{i}, %kh{i}), {1 / np.sqrt(head_dim):.6f}f));")
        lines.append(f"  %vt{i} = transpose(%vh{i}, axes=[0, 2, 1]);")
        lines.append(f"  %ctx{i} = reshape(transpose(nn.batch_matmul(%s{i}, %vt{i}), axes=[1, 0, 2]), "
                     f"newshape=[{seq}, {hidden}]);")
        wo, bo = weight(f"wo{i}", (hidden, hidden), s), weight(f"bo{i}", (hidden,), 0.02)
        g1, be1 = weight(f"g1_{i}", (hidden,), 1.0), weight(f"be1_{i}", (hidden,), 0.1)
        lines.append(f"  %a{i} = nn.layer_norm(add({x}, nn.bias_add(nn.dense(%ctx{i}, {wo}), {bo})), {g1}, {be1});")
        w1, b1 = weight(f"w1_{i}", (ffn, hidden), s), weight(f"b1_{i}", (ffn,), 0.02)
        w2, b2 = weight(f"w2_{i}", (hidden, ffn), 1 / np.sqrt(ffn)), weight(f"b2_{i}", (hidden,), 0.02)
        lines.append(f"  %f{i} = nn.gelu(nn.bias_add(nn.dense(%a{i}, {w1}), {b1}));")
        g2, be2 = weight(f"g2_{i}", (hidden,), 1.0), weight(f"be2_{i}", (hidden,), 0.1)
        lines.append(f"  %o{i} = nn.layer_norm(add(%a{i}, nn.bias_add(nn.dense(%f{i}, {w2}), {b2})), {g2}, {be2});")
        x = f"%o{i}"
    text = (f"def @main(%x: Tensor[({seq}, {hidden}), float32], {', '.join(sig)}) {{\n" + "\n".join(lines)
            + f"\n  {x}\n}}")
    return tv.parse(text), params, {"x": rng.standard_normal((seq, hidden)).astype("float32")}


MODELS = {"mlp": mlp, "small_cnn": small_cnn, "bert_encoder(seq=64)": bert_encoder,
          # dispatch-bound: the kernels are tiny, so this shows the executors' own overhead
          "mlp_tiny(batch=1)": lambda: mlp(batch=1, sizes=(64, 32, 16, 10))}


# --- measurement ----------------------------------------------------------------------------------
def measure(name, make, target, number, repeat):
    mod, params, inputs = make()
    factory = tg.build(mod, target=target, params=params)
    graph = tg.GraphModule(factory)
    graph.set_input(**inputs)
    graph.run()
    graph_out = graph.get_output(0).numpy().copy()
    plan = factory.memory_plan
    graph_bytes = plan.total_bytes + plan.external_bytes.get("output", 0)

    vm_time = vm_bytes = None
    graph_time = graph.benchmark(number=number, repeat=repeat).median  # replaced below when the VM runs too
    try:
        exe = tv.vm.compile(mod, target=target, params=params)
    except tv.UnsupportedError as err:
        print(f"[{target}] {name}: VM skipped ({err})")
    else:
        vm = tv.vm.VirtualMachine(exe)
        args = [inputs["x"]]
        vm_out = np.asarray(vm.invoke("main", *args).numpy())
        np.testing.assert_allclose(vm_out, graph_out, rtol=1e-4, atol=1e-5, err_msg=f"{name}: VM and graph disagree")
        graph_times, vm_times = [], []
        for r in range(repeat):  # interleaved batches, alternating who goes first: drift hits both alike
            pair = [(graph_times, lambda: graph.benchmark(number=number, repeat=1)),
                    (vm_times, lambda: vm.benchmark("main", *args, number=number, repeat=1))]
            for times, bench in (pair if r % 2 == 0 else pair[::-1]):
                times.append(bench().median)
        graph_time, vm_time = float(np.median(graph_times)), float(np.median(vm_times))
        vm.reset_memory_stats()
        vm.invoke("main", *args)
        vm_bytes = vm.memory_stats()["peak_bytes"]
    lifetimes = static_lifetimes(lower_static(mod, params))
    plans = {a: plan_memory(lifetimes, a) for a in ALGORITHMS}
    usmp = {a: plan_memory(lifetimes, a, fill_gaps=False).total_bytes for a in ("greedy_by_size", "greedy_by_conflicts")}
    return {"model": name, "target": target, "nodes": graph.num_nodes, "graph_s": graph_time, "vm_s": vm_time,
            "graph_bytes": graph_bytes, "vm_bytes": vm_bytes, "plans": plans, "usmp": usmp,
            "lower_bound": plans["no_reuse"].lower_bound_bytes, "sum": plans["no_reuse"].unplanned_bytes}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer repetitions")
    parser.add_argument("--target", default="both", choices=("python", "c", "both"))
    args = parser.parse_args(argv)
    number, repeat = (5, 3) if args.quick else (20, 5)
    targets = ("python", "c") if args.target == "both" else (args.target,)
    rows = []
    for target in targets:
        for name, make in MODELS.items():
            rows.append(measure(name, make, target, number, repeat))
    print("\nLatency and peak memory, VM / graph executor (same target; median of "
          f"{repeat} x {number} calls)")
    print(f"{'model':<22} {'target':<7} {'graph us':>10} {'VM us':>10} {'latency':>8} "
          f"{'graph KiB':>10} {'VM KiB':>10} {'memory':>7}")
    for r in rows:
        if r["vm_s"] is None:
            vm_cells = f"{'n/a':>10} {'n/a':>8} {r['graph_bytes'] / 1024:>10.1f} {'n/a':>10} {'n/a':>7}"
        else:
            vm_cells = (f"{r['vm_s'] * 1e6:>10.1f} {r['vm_s'] / r['graph_s']:>7.2f}x {r['graph_bytes'] / 1024:>10.1f} "
                        f"{r['vm_bytes'] / 1024:>10.1f} {r['vm_bytes'] / max(r['graph_bytes'], 1):>6.2f}x")
        print(f"{r['model']:<22} {r['target']:<7} {r['graph_s'] * 1e6:>10.1f} " + vm_cells)
    print("\nStatic planner: workspace bytes per algorithm (64-byte alignment)")
    header = ["model", "sum", "lower bound", *ALGORITHMS[:-1], "usmp size", "usmp conflicts"]
    print("  ".join(f"{h:>20}" if i else f"{h:<22}" for i, h in enumerate(header)))
    seen = set()
    for r in rows:
        if r["model"] in seen:
            continue
        seen.add(r["model"])
        cells = [r["sum"], r["lower_bound"], *(r["plans"][a].total_bytes for a in ALGORITHMS[:-1]),
                 r["usmp"]["greedy_by_size"], r["usmp"]["greedy_by_conflicts"]]
        print(f"{r['model']:<22}" + "".join(f"  {c:>20,}" for c in cells))
    return 0


if __name__ == "__main__":
    sys.exit(main())
