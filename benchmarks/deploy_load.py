"""Loading a saved target-"c" executable in a fresh interpreter: the prebuilt library (docs/deploy.md)
against rebuilding the kernels through the compiler (the same file without its ``KABI`` section: the
loader parses the primitive functions and regenerates the C, a kernel-cache hit), measured in the same
run, in alternating fresh processes.

    .venv/bin/python benchmarks/deploy_load.py [--rounds 7]

Per program: tensorvm modules imported by ``import tensorvm`` + ``load_executable`` + ``VirtualMachine`` +
the first ``run``, and the wall time of that sequence (median over the rounds; the ratio is the number to
compare across machines: timings on a loaded machine are noisy).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

import numpy as np  # noqa: E402
from tvx_edit import join, split  # noqa: E402

import tensorvm as tv  # noqa: E402

PROGRAMS = {
    "dynamic-batch MLP": ("""
def @main(%x: Tensor[(?, 64), float32], %w1: Tensor[(128, 64), float32], %w2: Tensor[(10, 128), float32]) {
  nn.dense(nn.relu(nn.dense(%x, %w1)), %w2)
}
""", lambda: [np.ones((8, 64), "float32"), np.ones((128, 64), "float32"), np.ones((10, 128), "float32")]),
    "recursive loop (growing shape)": ("""
def @loop(%i: int32, %n: int32, %x: Tensor[(?, 4), float32]) -> Tensor[(?, 4), float32] {
  if (less(%i, %n)) { @loop(add(%i, 1), %n, concatenate((tanh(%x), %x), axis=0)) } else { %x }
}
def @main(%x: Tensor[(?, 4), float32], %n: int32) { @loop(0, %n, %x) }
""", lambda: [np.ones((2, 4), "float32"), np.int32(5)]),
}

_CHILD = """
import json, sys, time
import numpy as np
args = [np.load(p) for p in sys.argv[2:]]
start = time.perf_counter()
import tensorvm as tv
exe = tv.vm.load_executable(sys.argv[1])
tv.vm.VirtualMachine(exe).run(*args)
seconds = time.perf_counter() - start
print(json.dumps({"seconds": seconds, "modules": sum(m.startswith("tensorvm") for m in sys.modules),
                  "origin": exe.c_library.origin}))
"""


def _child(path: Path, arg_files: list) -> dict:
    out = subprocess.run([sys.executable, "-c", _CHILD, str(path), *arg_files], capture_output=True, text=True,
                         check=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    return json.loads(out.stdout.splitlines()[-1])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    rounds = parser.parse_args().rounds
    print(f"load+first run in a fresh interpreter, median of {rounds} alternating rounds")
    with tempfile.TemporaryDirectory() as tmp:
        for name, (text, make_args) in PROGRAMS.items():
            data = tv.vm.compile(tv.parse(text), target="c").save_bytes()
            header, sections = split(data)
            prebuilt, rebuilt = Path(tmp, "prebuilt.tvx"), Path(tmp, "rebuilt.tvx")
            prebuilt.write_bytes(data)
            rebuilt.write_bytes(join(header, [(t, p) for t, p in sections if t != b"KABI"]))
            arg_files = []
            for i, a in enumerate(make_args()):
                arg_files.append(str(Path(tmp, f"arg{i}.npy")))
                np.save(arg_files[-1], a)
            runs = {"prebuilt": [], "rebuilt": []}
            for _ in range(rounds):
                runs["prebuilt"].append(_child(prebuilt, arg_files))
                runs["rebuilt"].append(_child(rebuilt, arg_files))
            medians = {k: statistics.median(r["seconds"] for r in v) for k, v in runs.items()}
            print(f"{name}:")
            for kind, results in runs.items():
                print(f"  {kind:8s} ({results[0]['origin']}): {medians[kind] * 1e3:7.1f} ms, "
                      f"{results[0]['modules']} tensorvm modules")
            print(f"  ratio rebuilt / prebuilt: {medians['rebuilt'] / medians['prebuilt']:.2f}x")


if __name__ == "__main__":
    main()
