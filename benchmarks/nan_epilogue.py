"""The NaN-propagating relu and 2x2 pool epilogues of tv_vconv.h / tv_vpointwise.h against the ones they
replaced (relu as ``v > 0`` mask: NaN became 0; pool max as ``a > b ? a : b``: a NaN could be dropped):
both versions of the kernel text built into two libraries in one process, the layers called through
ctypes, old and new interleaved, median of the repeats.

    PYTHONPATH=. python benchmarks/nan_epilogue.py [--repeats 15] [--threads 1]
"""

from __future__ import annotations

import argparse
import ctypes
import statistics
import time

import numpy as np

from tensorvm.codegen import build
from tensorvm.codegen.c_emit import prelude

NEW_RELU = "#define TV_VRELU(v) (v) = (tv_vf)((tv_vi)(v) & ~((v) <= (tv_vf){0}))"
OLD_RELU = "#define TV_VRELU(v) (v) = (tv_vf)((tv_vi)(v) & ((v) > (tv_vf){0}))"
NEW_MAX = ("#define TV_VMAX(a, b) ((tv_vf)(((tv_vi)(a) & (((a) > (b)) | ((a) != (a)))) | "
           "((tv_vi)(b) & ~(((a) > (b)) | ((a) != (a))))))")
OLD_MAX = "#define TV_VMAX(a, b) ((tv_vf)(((tv_vi)(a) & ((a) > (b))) | ((tv_vi)(b) & ~((a) > (b)))))"

CALLERS = """
int32_t bench_direct(int64_t* d, const float* x, const float* w, const float* b, float* padded, float* out) {
  return tv_conv2d_direct_f32(d[0], d[1], d[2], d[3], d[4], d[5], d[6], 3, 3, 1, 1, 1, 1, 1, 1, x, w, b, 1, 1, d[7],
                              padded, out);
}
int32_t bench_depthwise(int64_t* d, const float* x, const float* w, const float* b, float* out) {
  return tv_conv2d_depthwise_f32(d[0], d[1], d[2], d[3], d[2], d[3], 3, 3, 1, 1, 1, 1, 1, 1, x, w, b, 1, 1, out);
}
int32_t bench_pointwise(int64_t* d, const float* x, const float* w, const float* b, float* out) {
  return tv_conv2d_pointwise_act_f32(d[0], d[1], d[2], d[3], x, w, b, 1, 1, 0, 1.0f, 0.0f, 0.0f, 0.0f, b, 0, out);
}
"""


def _library(text):
    lib = build.build_library([(text + CALLERS, ())])._cdll
    for name in ("bench_direct", "bench_depthwise", "bench_pointwise"):
        getattr(lib, name).restype = ctypes.c_int32
    return lib


def _p(a):
    return a.ctypes.data_as(ctypes.c_void_p)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    build.set_num_threads(args.threads)
    new_text = prelude()
    assert NEW_RELU in new_text and NEW_MAX in new_text, "the kernel text changed: update the benchmark"
    libs = {"old": _library(new_text.replace(NEW_RELU, OLD_RELU).replace(NEW_MAX, OLD_MAX)),
            "new": _library(new_text)}
    rng = np.random.default_rng(0)
    lanes = 16  # (enough padding floats for any instance)
    cases = []
    for pool in (0, 1):  # direct 3 -> 32, 3x3, 112x112, bias + relu (+ 2x2 pool)
        c, o, h = 3, 32, 112
        x, w, b = (rng.standard_normal(s).astype(np.float32) for s in ((1, c, h, h), (o, c, 3, 3), (o,)))
        padded = np.zeros(c * (h + 2) * (-(-h // lanes) * lanes + 2) + 64, np.float32)
        out = np.zeros((1, o, h // (1 + pool), h // (1 + pool)), np.float32)
        d = np.array([1, c, h, h, o, h, h, pool], np.int64)
        cases.append((f"direct 3->32 3x3 112x112 relu{' +pool' if pool else ''}", "bench_direct",
                      (d, x, w, b, padded, out)))
    c, h = 64, 56  # depthwise 3x3 64 channels 56x56, bias + relu
    x, w, b = (rng.standard_normal(s).astype(np.float32) for s in ((1, c, h, h), (c, 1, 3, 3), (c,)))
    cases.append(("depthwise 64ch 3x3 56x56 relu", "bench_depthwise",
                  (np.array([1, c, h, h], np.int64), x, w, b, np.zeros((1, c, h, h), np.float32))))
    c, o, p = 64, 64, 56 * 56  # pointwise 64 -> 64 over 56x56, bias + relu
    x, w, b = (rng.standard_normal(s).astype(np.float32) for s in ((1, c, p), (o, c), (o,)))
    cases.append(("pointwise 64->64 56x56 relu", "bench_pointwise",
                  (np.array([1, c, p, o], np.int64), x, w, b, np.zeros((1, o, p), np.float32))))
    print(f"threads={args.threads} repeats={args.repeats} (median ms; old, new interleaved)")
    for label, fn, arrays in cases:
        times = {"old": [], "new": []}
        results = {}
        for _ in range(args.repeats):
            for key in ("old", "new"):
                call = getattr(libs[key], fn)
                for _ in range(2):  # (the first call of a round warms the caches; the second is timed)
                    start = time.perf_counter()
                    assert call(*map(_p, arrays)) == 0
                    elapsed = time.perf_counter() - start
                times[key].append(elapsed)
                results[key] = arrays[-1].copy()
        np.testing.assert_array_equal(results["old"], results["new"])  # (no NaN in these inputs: same bits)
        old, new = (statistics.median(times[k]) * 1e3 for k in ("old", "new"))
        print(f"{label:40s} old {old:8.3f}  new {new:8.3f}  new/old {new / old:5.3f}")


if __name__ == "__main__":
    main()
