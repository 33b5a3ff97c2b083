"""AOT against the graph executor and the VM on the static benchmark models, in one run.

    .venv/bin/python benchmarks/aot.py [--quick] [--models mlp,small_cnn]

The models are the static ones of ``benchmarks/vm_vs_graph.py`` (an MLP, a small CNN, a BERT-like
encoder at a fixed sequence length; random weights bound as params). All three executors use C
kernels from ``tensorvm.codegen`` (target "c") on one thread. For each model it prints:

* latency: median seconds per call of the AOT model called from a C program (no Python at all) and
  from Python (``AOTRunner.benchmark``: one ctypes call on pre-bound buffers), ``GraphModule.benchmark`` and ``VirtualMachine.benchmark``,
  taking turns round by round, after checking that all three agree (a batch-1 MLP is added, where
  the per-call overhead of the executors matters);
* code size: text/data/bss of the compiled object files (model + kernels, parameters, the shim), from
  binutils ``size`` at ``-O2``;
* memory: AOT's workspace for every planner algorithm (64-byte alignment, like the graph plan) beside
  the graph executor's plan and the sum of all intermediates (no reuse), and AOT's workspace at its
  default 16-byte alignment.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import numpy as np  # noqa: E402

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from vm_vs_graph import MODELS as GRAPH_MODELS  # noqa: E402
from vm_vs_graph import mlp  # noqa: E402

# The static benchmark models, plus a batch-1 MLP where the executors' per-call overhead shows.
MODELS = {**GRAPH_MODELS, "mlp(batch=1)": lambda: mlp(batch=1)}

import tensorvm as tv  # noqa: E402
import tensorvm.aot as aot  # noqa: E402
import tensorvm.graph as tg  # noqa: E402

ALGORITHMS = ("greedy_by_size", "greedy_by_conflicts", "hill_climb", "linear_scan", "no_reuse")


def measure(name, make, number, repeat) -> dict:
    mod, params, inputs = make()
    x = inputs["x"]
    module = aot.build(mod, name="bench", params=params)
    runner = module.load()
    aot_out = runner(x)

    factory = tg.build(mod, target="c", params=params)
    graph = tg.GraphModule(factory)
    graph.set_input(**inputs)
    graph.run()
    graph_out = graph.get_output(0).numpy()
    np.testing.assert_allclose(aot_out, graph_out, rtol=1e-4, atol=1e-5, err_msg=f"{name}: AOT and graph disagree")

    try:
        vm = tv.vm.VirtualMachine(tv.vm.compile(mod, target="c", params=params))
        vm_out = np.asarray(vm.invoke("main", x).numpy())
        np.testing.assert_allclose(aot_out, vm_out, rtol=1e-4, atol=1e-5, err_msg=f"{name}: AOT and VM disagree")
    except tv.UnsupportedError as err:
        print(f"{name}: VM skipped ({err})")
        vm = None

    times = _interleaved(runner, graph, vm, x, number, repeat)
    times["native"] = native_latency(module, x, number, repeat)

    workspaces = {a: aot.build(mod, name="bench", params=params, planner=a, alignment=64).workspace_size
                  for a in ALGORITHMS}
    plan = factory.memory_plan
    return {"model": name, "times": times, "objects": aot.object_sizes(module),
            "library_bytes": Path(runner.library_path).stat().st_size, "workspaces": workspaces,
            "workspace_16": module.workspace_size, "graph_plan": plan.total_bytes, "graph_algorithm": plan.algorithm,
            "sum": module.memory_plan.unplanned_bytes, "constants": module.constants_size, "io": module.io_size,
            "kernels": len(module.kernels)}


def _interleaved(runner, graph, vm, x, number, repeat) -> dict:
    """Per executor, the median and the best of ``repeat`` rounds of ``number`` calls (seconds per
    call), the executors taking turns every round (so drifts of a shared machine hit them alike)."""
    samples = {"aot": [], "graph": [], "vm": []}
    for _ in range(repeat):
        samples["aot"].append(runner.benchmark(x, number=number, repeat=1)["median"])
        samples["graph"].append(graph.benchmark(number=number, repeat=1).median)
        if vm is not None:
            samples["vm"].append(vm.benchmark("main", x, number=number, repeat=1).median)
    return {k: ((float(np.median(v)), float(np.min(v))) if v else (None, None)) for k, v in samples.items()}


_NATIVE_MAIN = r"""
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include "%HEADER%"
static _Alignas(64) uint8_t in0[%IN_SIZE%];
static _Alignas(64) uint8_t out0[%OUT_SIZE%];
int main(int argc, char** argv) {
  FILE* f = fopen(argv[1], "rb");
  if (f == NULL || fread(in0, 1, sizeof(in0), f) != sizeof(in0)) return 2;
  fclose(f);
  int rounds = atoi(argv[2]), number = atoi(argv[3]);
  struct %PREFIX%_inputs inputs = {.%INPUT% = in0};
  struct %PREFIX%_outputs outputs = {.output = out0};
  if (%PREFIX%_run(&inputs, &outputs) != 0) return 3;
  for (int r = 0; r < rounds; ++r) {
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    for (int i = 0; i < number; ++i) {
      if (%PREFIX%_run(&inputs, &outputs) != 0) return 3;
    }
    clock_gettime(CLOCK_MONOTONIC, &b);
    printf("%.9f\n", ((b.tv_sec - a.tv_sec) + (b.tv_nsec - a.tv_nsec) * 1e-9) / number);
  }
  return 0;
}
"""


def native_latency(module, x, number, repeat):
    """Median and best seconds per run of the model called from a C program (no Python at all),
    compiled with the same flags as the runner's library."""
    from tensorvm.codegen.build import find_toolchain

    if len(module.inputs) != 1 or len(module.outputs) != 1:
        return None, None
    toolchain = find_toolchain()
    flags = [f for f in toolchain.flags if f not in ("-shared", "-fPIC")]
    with tempfile.TemporaryDirectory(prefix="tensorvm-aot-bench-") as tmp:
        layout = module.write_sources(tmp)
        main = (_NATIVE_MAIN.replace("%HEADER%", module.header_name).replace("%PREFIX%", module.prefix)
                .replace("%INPUT%", module.inputs[0].name).replace("%IN_SIZE%", str(module.inputs[0].size_bytes))
                .replace("%OUT_SIZE%", str(module.outputs[0].size_bytes)))
        (Path(tmp) / "main.c").write_text(main)
        exe, data = Path(tmp) / "bench", Path(tmp) / "x.bin"
        data.write_bytes(np.ascontiguousarray(x).tobytes())
        subprocess.run([toolchain.compiler, *flags, *[f"-I{d}" for d in layout["include_dirs"]], str(Path(tmp) / "main.c"),
                        *map(str, layout["sources"]), "-o", str(exe), "-lm"], check=True, capture_output=True)
        out = subprocess.run([str(exe), str(data), str(repeat), str(number)], check=True, capture_output=True,
                             text=True).stdout
    times = [float(v) for v in out.split()]
    return float(np.median(times)), float(np.min(times))


def _us(seconds):
    return "n/a" if seconds is None else f"{seconds * 1e6:.1f}"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer repetitions")
    parser.add_argument("--models", default=",".join(MODELS), help="comma-separated subset of " + ", ".join(MODELS))
    args = parser.parse_args(argv)
    number, repeat = (5, 3) if args.quick else (20, 15)
    chosen = [m.strip() for m in args.models.split(",") if m.strip()]
    unknown = [m for m in chosen if m not in MODELS]
    if unknown:
        parser.error(f"unknown model(s) {unknown}; choose from {list(MODELS)}")
    rows = [measure(name, MODELS[name], number, repeat) for name in chosen]

    print(f"\nLatency in us per call, median (best) of {repeat} interleaved rounds of {number} calls "
          f"(target c, 1 thread)")
    print(f"{'model':<22} {'AOT from C':>18} {'AOT via Python':>18} {'graph':>18} {'VM':>18} {'graph/AOT':>10} "
          f"{'VM/AOT':>8}")
    for r in rows:
        t = r["times"]
        cells = [f"{_us(t[k][0])} ({_us(t[k][1])})" for k in ("native", "aot", "graph", "vm")]
        vm_ratio = "n/a" if t["vm"][0] is None else f"{t['vm'][0] / t['aot'][0]:.2f}x"
        print(f"{r['model']:<22} " + " ".join(f"{c:>18}" for c in cells)
              + f" {t['graph'][0] / t['aot'][0]:>9.2f}x {vm_ratio:>8}")
    print("(AOT from C: a C program calling tvmgen_<name>_run in a loop; the other columns are called from "
          "Python; the ratios use AOT via Python)")

    print("\nCompiled AOT objects (-O2; bytes of text / data / bss; the shared library loaded by the runner)")
    for r in rows:
        parts = []
        for fname, s in r["objects"].items():
            if s["text"] is None:
                parts.append(f"{fname}: {s['file_bytes']:,} file bytes")
            else:
                parts.append(f"{fname}: {s['text']:,} / {s['data']:,} / {s['bss']:,}")
        print(f"{r['model']:<22} " + "; ".join(parts) + f"; .so {r['library_bytes']:,}")
        print(f"{'':<22} {r['kernels']} kernels, constants {r['constants']:,} bytes, I/O {r['io']:,} bytes")

    print("\nWorkspace bytes: AOT per planner (64-byte alignment) beside the graph plan and the sum of intermediates")
    header = ["model", "sum", "graph plan", *ALGORITHMS, "AOT default (16 B)"]
    print(f"{header[0]:<22}" + "".join(f"{h:>20}" for h in header[1:]))
    for r in rows:
        cells = [r["sum"], r["graph_plan"], *(r["workspaces"][a] for a in ALGORITHMS), r["workspace_16"]]
        print(f"{r['model']:<22}" + "".join(f"{c:>20,}" for c in cells))
    print("(the sum of intermediates is at AOT's 16-byte alignment; the graph plan uses "
          f"{rows[0]['graph_algorithm'] if rows else '?'} at 64 bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
