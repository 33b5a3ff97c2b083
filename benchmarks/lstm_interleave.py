"""Runs ``lstm_interleave.c``: can the LSTM's input projection hide under the recurrent product's weight stream?

    .venv/bin/python benchmarks/lstm_interleave.py [--tokens 32 128] [--rounds 15]

Builds the C experiment with this host's vector width and register tile (``host.gemm_params``, the
same macros as the library's packed product; the fused tile has ``mr - 2`` token rows, the registers left
beside four GEMV accumulators) and prints, per sequence length, the floor (T bare ``1 x H . H x 4H``
products), tensorvm's order (the projection as one product, then the steps) and the fused pass, in CPU
time of the thread and wall time, as ratios to the floor measured in the same rounds. One thread; the
outputs of the fused and separate runs are checked against each other. See the C file's comment.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


def build(out: Path, params=None) -> Path:
    """The experiment built into ``out`` for ``params`` (``host.gemm_params()``: this host's instance)."""
    sys.path.insert(0, str(ROOT))
    from tensorvm.codegen import host

    params = params or host.gemm_params()
    exe = out / "lstm_interleave"
    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        raise SystemExit("no C compiler (gcc or cc) on PATH")
    # (the library's language mode: -std=c11 would turn off the contraction of a * b + c into FMAs)
    command = [cc, "-O3", "-march=native", "-std=gnu11", "-fno-math-errno", "-Wall", "-Wextra", "-Werror",
               f"-I{ROOT / 'tensorvm' / 'codegen' / 'lib'}", *host.gemm_defines(params),
               f"-DLI_FB={max(1, params.mr - 2)}", str(HERE / "lstm_interleave.c"), "-o", str(exe), "-lm"]
    subprocess.run(command, check=True)
    return exe


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, nargs="+", default=[32, 128])
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="tv-interleave-") as tmp:
        exe = build(Path(tmp))
        for tokens in args.tokens:
            subprocess.run([str(exe), str(tokens), str(args.rounds)], check=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
