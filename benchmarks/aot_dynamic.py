"""The Tree-LSTM as a standalone C library (``tv.aot.build(..., dynamic=True)``) against the VM's native
exec mode called from Python, on the suite's model and trees, in one run.

    .venv/bin/python benchmarks/aot_dynamic.py [--rounds 5] [--trees 16]

Both run the same native C (docs/aot_dynamic.md, docs/native_mode.md) on one thread with the weights
bound as constants. The C side is ``benchmarks/aot_dynamic_bench.c`` linked with the library at ``-O2``
plus the host flags tensorvm's kernels use: it builds the trees once with the library's constructors and
times rounds of ``@main`` over every tree. The Python side is ``VirtualMachine(exe).invoke`` over the
same trees as ``ADT`` values (which includes the VM's argument conversion of each tree). The two take
turns, round by round; each reports its fastest round, per node. The first tree's ``h`` is compared
first. Prints the compile time and size of the library too.

``--constants`` compares the two ways of holding the constants, on the suite's LSTM 256->512 (6.3 MB of
weights): ``constants="embed"`` (in the C, as bytes) against ``constants="blob"`` (a params blob loaded at
run time): the C's size, the blob's, and ``cc -O2 -c`` time and object size, fastest of ``--rounds``
alternating compiles (``--constants`` alone skips the Tree-LSTM timing).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import numpy as np  # noqa: E402

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from models import lstm, treelstm  # noqa: E402

import tensorvm as tv  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--trees", type=int, default=treelstm.NUM_TREES)
    parser.add_argument("--constants", action="store_true", help="only the LSTM's embed vs blob compile (see above)")
    args = parser.parse_args()
    if args.constants:
        return constants_compile(args.rounds)
    from tensorvm.codegen.build import find_toolchain

    isize, hsize = treelstm.INPUT_SIZE, treelstm.HIDDEN_SIZE
    weights = treelstm.make_weights(isize, hsize)
    mod = tv.parse(treelstm.treelstm_relay_text(isize, hsize))
    trees = treelstm.make_trees(args.trees, isize)
    nodes = sum(treelstm.count_nodes(t) for t in trees)

    start = time.perf_counter()
    library = tv.aot.build(mod, name="tree", params=weights, dynamic=True)
    generate = time.perf_counter() - start
    work = Path(tempfile.mkdtemp(prefix="aotdyn_bench_"))
    layout = library.write_sources(work)
    lines = [f"{len(trees)} {isize}"]
    for t in trees:
        treelstm.tree_lines(t, lines)
    (work / "trees.txt").write_text("\n".join(lines) + "\n")
    host = [f for f in find_toolchain().flags if f.startswith(("-march", "-mtune"))]
    exe = work / "bench"
    start = time.perf_counter()
    subprocess.run(["cc", "-std=c11", "-O2", *library.c_flags, *host, f"-I{work / 'include'}", f"-I{HERE.parent / 'tests' / 'aot'}",
                    str(HERE / "aot_dynamic_bench.c"),
                    *map(str, layout["sources"]), "-o", str(exe), "-lm", "-lpthread"], check=True)
    compile_seconds = time.perf_counter() - start
    print(f"library: {len(library.sources['tree.c']) / 1e6:.2f} MB of C ({library.constants_size / 1e6:.2f} MB of "
          f"constants), generated in {generate:.1f} s, compiled with the bench in {compile_seconds:.1f} s "
          f"(cc -O2 {' '.join((*library.c_flags, *host))}); {exe.stat().st_size / 1e6:.2f} MB executable")

    vm = tv.vm.VirtualMachine(tv.vm.compile(mod, target="c", params=weights, exec_mode="native"))
    values = [treelstm.tree_value(mod, t) for t in trees]
    first = subprocess.run([str(exe), str(work / "trees.txt"), "1"], capture_output=True, text=True, check=True)
    c_h = np.array([float(v) for v in first.stdout.splitlines()[0].split()[1:]], np.float32)
    vm_h = vm.invoke("main", values[0])[0].numpy().reshape(-1)
    np.testing.assert_allclose(c_h, vm_h, rtol=1e-4, atol=1e-5)
    c_best, vm_best = [], []
    for _ in range(args.rounds):
        out = subprocess.run([str(exe), str(work / "trees.txt"), "3"], capture_output=True, text=True, check=True)
        c_best.append(float(out.stdout.split("best_round_us")[1]))
        start = time.perf_counter()
        for v in values:
            vm.invoke("main", v)
        vm_best.append((time.perf_counter() - start) * 1e6)
    c_node, vm_node = min(c_best) / nodes, min(vm_best) / nodes
    print(f"Tree-LSTM {isize}->{hsize}, {len(trees)} trees, {nodes} nodes, 1 thread, fastest of {args.rounds} "
          f"interleaved rounds:")
    print(f"  standalone C library, called from C:     {c_node:8.2f} us/node")
    print(f"  VM native mode, VirtualMachine.invoke:    {vm_node:8.2f} us/node   ({vm_node / c_node:.2f}x the C library)")


def constants_compile(rounds: int):
    from tensorvm.codegen.build import find_toolchain

    isize, hsize = lstm.INPUT_SIZE, lstm.HIDDEN_SIZE
    w = lstm.make_weights(isize, hsize)
    params = {"w_ih": w["w_ih"], "w_hh": w["w_hh"], "bias": w["b_ih"] + w["b_hh"]}
    mod = tv.parse(lstm.lstm_relay_text(isize, hsize))
    host = [f for f in find_toolchain().flags if f.startswith(("-march", "-mtune"))]
    work = Path(tempfile.mkdtemp(prefix="aotdyn_constants_"))
    builds = {}
    for mode in ("embed", "blob"):
        start = time.perf_counter()
        library = tv.aot.build(mod, name=f"lstm_{mode}", params=params, dynamic=True, constants=mode)
        generate = time.perf_counter() - start
        layout = library.write_sources(work / mode)
        builds[mode] = (library, layout, generate, [])
    flags = ["-std=c11", "-O2", *tv.aot.dynamic.C_FLAGS, *host]
    for _ in range(rounds):
        for mode, (_library, layout, _, times) in builds.items():
            start = time.perf_counter()
            subprocess.run(["cc", *flags, f"-I{layout['include_dirs'][0]}", "-c", str(layout["sources"][0]), "-o",
                            str(work / f"{mode}.o")], check=True)
            times.append(time.perf_counter() - start)
    print(f"LSTM {isize}->{hsize} standalone library, cc {' '.join(flags)} -c, fastest of {rounds} alternating "
          f"compiles:")
    for mode, (library, _layout, generate, times) in builds.items():
        blob = f", blob {len(library.blob) / 1e6:.2f} MB" if library.blob is not None else ""
        c_size = len(library.sources[f"lstm_{mode}.c"])
        print(f"  constants={mode:5s}: {c_size / 1e6:6.2f} MB of C{blob}, generated in {generate:.1f} s, "
              f"compiled in {min(times):5.1f} s, object {(work / f'{mode}.o').stat().st_size / 1e6:.2f} MB")


if __name__ == "__main__":
    main()
