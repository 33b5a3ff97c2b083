"""Products of few rows (1 to 8) through the packed product, this checkout's kernel against another's.

    .venv/bin/python benchmarks/product_rows.py --against ../main
    .venv/bin/python benchmarks/product_rows.py --against ../main --shapes 384x128 2048x512 --march haswell

Both builds are the same C entry point (``tv_vgemm_product``, one thread) compiled from each checkout's
``tensorvm/codegen/lib`` with this host's instance (``host.gemm_params``) and the library's flags, linked
into one program (``product_rows.c``) that alternates them round by round; it prints medians and minima
per row count, and the largest difference between the two outputs. ``--march`` builds both for another
x86 target (``haswell``: AVX2's 16 registers) to see a rule that depends on the register file. Shapes are
``NxK`` (the weight's columns and reduction): the GRU's recurrent 384x128 stays in L2, the MLP's 512x784
and the LSTM's 2048x512 come from L3.
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

_ENTRY = """#include <stddef.h>
#include <stdint.h>
static inline int tv_gemm_parallel_rows(double work, int64_t rows) { (void)work, (void)rows; return 0; }
static inline int tv_omp_max_threads(void) { return 1; }
static inline void tv_team_run(int64_t chunks, int threads, void (*fn)(void*, int64_t), void* arg) {
  (void)threads;
  for (int64_t i = 0; i < chunks; ++i) fn(arg, i);
}
static inline int64_t tv_team_mirror(int64_t i, int64_t chunks, int64_t threads) {
  (void)threads;
  return chunks - 1 - i;
}
#include "tv_vgemm.h"
int32_t NAME(int64_t m, int64_t n, int64_t k, const float* x, const float* w, float* out) {
  return tv_vgemm_product(m, n, k, x, w, NULL, out);
}
"""


def build(out: Path, against: Path, march: str) -> Path:
    """The program linking this checkout's product and ``against``'s, built in ``out``."""
    sys.path.insert(0, str(ROOT))
    from tensorvm.codegen import host

    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        raise SystemExit("no C compiler (gcc or cc) on PATH")
    params = host.gemm_params()
    flags = ["-O3", f"-march={march}", "-std=gnu11", "-fwrapv", "-fno-math-errno", "-fno-trapping-math",
             "-Wall", "-Wextra", *host.gemm_defines(params)]
    entry = out / "entry.c"
    entry.write_text(_ENTRY)
    objects = []
    for name, checkout in (("product_this", ROOT), ("product_other", against)):
        obj = out / f"{name}.o"
        subprocess.run([cc, *flags, f"-DNAME={name}", f"-I{checkout / 'tensorvm' / 'codegen' / 'lib'}", "-c",
                        str(entry), "-o", str(obj)], check=True)
        objects.append(str(obj))
    width = out / "width.c"
    width.write_text(f"#include <stdint.h>\nint32_t panel_width(void) {{ return {params.nr}; }}\n")
    exe = out / "product_rows"
    subprocess.run([cc, *flags, str(HERE / "product_rows.c"), str(width), *objects, "-o", str(exe)], check=True)
    return exe


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--against", type=Path, required=True, help="another checkout (its tensorvm/codegen/lib)")
    parser.add_argument("--shapes", nargs="+", default=["384x128", "512x784", "2048x512"])
    parser.add_argument("--rounds", type=int, default=100)
    parser.add_argument("--march", default="native")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="tv-rows-") as tmp:
        exe = build(Path(tmp), args.against.resolve(), args.march)
        for shape in args.shapes:
            n, k = (int(v) for v in shape.split("x"))
            inner = max(1, 2_000_000 // (n * k))  # (about a millisecond of calls per round)
            subprocess.run([str(exe), str(n), str(k), str(args.rounds), str(inner)], check=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
