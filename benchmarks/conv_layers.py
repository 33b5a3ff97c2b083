"""ResNet-18's 3x3 convolutions one at a time: each layer (with its bias and relu) compiled by tensorvm for
the VM (target "c": ``nn.conv2d_packed``) against the same lone layer in ONNX Runtime, interleaved in one
process, and the share of the packed kernel's time that its per-call channel-blocked copy of the image
takes (the copy alone, timed in C). On a shared machine only the ratios mean anything; the minimum over
the rounds is the least disturbed call.

    .venv/bin/python benchmarks/conv_layers.py                  # batch 1, 1 thread
    .venv/bin/python benchmarks/conv_layers.py --batch 8 --threads 2 --rounds 40
    .venv/bin/python benchmarks/conv_layers.py --against ../main     # this kernel against another checkout's

``--against`` also calls ``tv_conv2d_packed_f32`` itself, built from this checkout's C library and from
the other checkout's (``tensorvm/codegen/lib`` there), interleaved with the rest, and prints their ratio.

ONNX Runtime adds its own reorders (NCHW to its channel-blocked layout and back) to a lone layer; in the
whole model it keeps the blocked layout between layers, so its lone-layer times slightly overstate its
per-layer cost there.
"""

from __future__ import annotations

import argparse
import ctypes
import time
from pathlib import Path

import numpy as np

# (in channels, image side, out channels, stride): every distinct 3x3 layer of ResNet-18, and its count
LAYERS = [(64, 56, 64, 1, 4), (64, 56, 128, 2, 1), (128, 28, 128, 1, 3), (128, 28, 256, 2, 1),
          (256, 14, 256, 1, 3), (256, 14, 512, 2, 1), (512, 7, 512, 1, 3)]

_CALL = r"""
int32_t tv_bench_packed(const int64_t* d, const float* x, const float* packed, const float* bias, float* out) {
  return tv_conv2d_packed_f32(d[0], d[1], d[2], d[3], d[4], d[5], d[6], 3, 3, d[7], d[7], 1, 1, 1, 1, x, packed,
                              bias, 1, 1, out);
}
"""

# times `reps` calls of the kernel's channel-blocked copy of each image (tv_pconv_block over every block)
_COPY = r"""
#include <time.h>
double tv_bench_block_copy(int64_t n, int64_t c, int64_t h, int64_t w, int64_t oh, int64_t ow, int64_t s,
                           const float* x, int64_t reps) {
  const int64_t cblocks = (c + TV_VCONV_BLOCK - 1) / TV_VCONV_BLOCK, hp = (oh - 1) * s + 3, wp = (ow - 1) * s + 3;
  float* blocked = (float*)malloc(sizeof(float) * (size_t)(cblocks * hp * wp * TV_VCONV_BLOCK));
  if (blocked == NULL) return -1.0;
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  for (int64_t r = 0; r < reps; ++r)
    for (int64_t image = 0; image < n; ++image)
      for (int64_t cb = 0; cb < cblocks; ++cb) tv_pconv_block(x + image * c * h * w, cb, c, h, w, 1, 1, hp, wp, blocked);
  clock_gettime(CLOCK_MONOTONIC, &t1);
  free(blocked);
  return ((double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec)) / (double)reps;
}
"""


def _onnx_layer(c: int, side: int, o: int, stride: int, batch, rng):
    from onnx import TensorProto, helper, numpy_helper

    weight = (rng.standard_normal((o, c, 3, 3)) / np.sqrt(9 * c)).astype(np.float32)
    bias = rng.standard_normal(o).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "W", "B"], ["y"], pads=[1] * 4, strides=[stride] * 2),
         helper.make_node("Relu", ["y"], ["z"])], "layer",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, c, side, side])],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(weight, "W"), numpy_helper.from_array(bias, "B")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model, weight, bias


def library_source(library_dir=None) -> str:
    """The C text of this benchmark's library (the packed kernel, the copy's timer), from the C library
    files of ``library_dir`` (another checkout's ``tensorvm/codegen/lib``) when given. ``c_emit`` caches
    the files by name: the cache is emptied around the switch, else the other checkout's kernel would be
    this one's (and their ratio 1 whatever they are)."""
    from tensorvm.codegen import c_emit

    own = c_emit.LIBRARY_DIR
    if library_dir is not None:
        c_emit.LIBRARY_DIR = Path(library_dir)
        c_emit._library_file.cache_clear()
    try:
        return (c_emit._rule_defines() + c_emit._product_defines()
                + c_emit.library_text(["tv_kernel.h", "tv_gemm.h"]) + _COPY + _CALL)
    finally:
        if library_dir is not None:
            c_emit.LIBRARY_DIR = own
            c_emit._library_file.cache_clear()


def _kernel_call(kernel, dims, x, packed, bias, out):
    return lambda: kernel(dims.ctypes.data, x.ctypes.data, packed.ctypes.data, bias.ctypes.data, out.ctypes.data)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--against", help="another tensorvm checkout whose packed kernel to time beside this one")
    args = parser.parse_args()

    import onnxruntime as ort

    import tensorvm as tv
    from tensorvm.codegen.build import build_library
    from tensorvm.op.nn import pack_conv_weight

    tv.set_num_threads(args.threads)
    here = build_library(library_source())._cdll
    copy = here.tv_bench_block_copy
    copy.argtypes = [ctypes.c_int64] * 7 + [ctypes.c_void_p, ctypes.c_int64]
    copy.restype = ctypes.c_double
    kernels = {}
    if args.against:
        there = build_library(library_source(Path(args.against) / "tensorvm" / "codegen" / "lib"))._cdll
        kernels = {"kernel here": here.tv_bench_packed, "kernel there": there.tv_bench_packed}
        for kernel in kernels.values():
            kernel.argtypes = [ctypes.c_void_p] * 5
    options = ort.SessionOptions()
    options.intra_op_num_threads = args.threads
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")  # (see conv_variants.py)
    rng = np.random.default_rng(0)
    n = args.batch
    print(f"ResNet-18's 3x3 layers, batch {n}, {args.threads} thread(s), {args.rounds} interleaved rounds; "
          "ms per call, min [median]")
    print(f"  {'layer':24s} {'tensorvm':>16s} {'onnxruntime':>16s} {'ratio':>6s} {'copy share':>10s}")
    totals = np.zeros(5)
    for c, side, o, stride, count in LAYERS:
        model, weight, bias = _onnx_layer(c, side, o, stride, n, rng)
        session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
        mod, params = tv.frontend.from_onnx(model)
        exe = tv.vm.compile(mod, target="c", params=params)
        if not exe.stats()["kernel_library"]["variants"].get("packed"):
            print(f"  {c}x{side}x{side} -> {o}: not packed on this host (PackWeights' rule)")
            continue
        vm = tv.vm.VirtualMachine(exe)
        x = rng.standard_normal((n, c, side, side)).astype(np.float32)
        want = session.run(None, {"x": x})[0]
        got = vm.invoke("main", x)
        np.testing.assert_allclose(got.numpy() if hasattr(got, "numpy") else got, want, rtol=1e-4, atol=1e-4)
        calls = {"tensorvm": lambda vm=vm, x=x: vm.invoke("main", x),
                 "onnxruntime": lambda session=session, x=x: session.run(None, {"x": x})}
        if kernels:  # (the layer's weight packed as PackWeights packs it)
            packed, out_side = pack_conv_weight(weight), (side - 1) // stride + 1
            dims = np.array([n, c, side, side, o, out_side, out_side, stride], np.int64)
            out = np.empty((n, o, out_side, out_side), np.float32)
            for name, kernel in kernels.items():
                assert kernel(dims.ctypes.data, x.ctypes.data, packed.ctypes.data, bias.ctypes.data, out.ctypes.data) == 0
                np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-4)
                calls[name] = _kernel_call(kernel, dims, x, packed, bias, out)
        times: dict = {name: [] for name in calls}
        for _ in range(args.rounds):
            for name, call in calls.items():
                start = time.perf_counter()
                call()
                times[name].append(time.perf_counter() - start)
        best = {name: min(v) * 1e3 for name, v in times.items()}
        median = {name: float(np.median(v)) * 1e3 for name, v in times.items()}
        out_side = (side - 1) // stride + 1
        copied = min(copy(n, c, side, side, out_side, out_side, stride, x.ctypes.data, 3) for _ in range(3)) * 1e3
        totals[:3] += count * np.array([best["tensorvm"], best["onnxruntime"], copied])
        line = (f"  {c}x{side}x{side} -> {o}, s{stride} (x{count}) {best['tensorvm']:7.2f} [{median['tensorvm']:6.2f}] "
                f"{best['onnxruntime']:7.2f} [{median['onnxruntime']:6.2f}] {best['tensorvm'] / best['onnxruntime']:6.3f} "
                f"{copied / best['tensorvm']:9.1%}")
        if kernels:
            line += (f"   kernel here / there {best['kernel here'] / best['kernel there']:.3f} "
                     f"[{median['kernel here'] / median['kernel there']:.3f}]")
            totals[3:] += count * np.array([best["kernel here"], best["kernel there"]])
        print(line)
    print(f"  all layers x count: tensorvm {totals[0]:.2f} ms, onnxruntime {totals[1]:.2f} ms, ratio "
          f"{totals[0] / totals[1]:.3f}; the blocked copies {totals[2]:.2f} ms ({totals[2] / totals[0]:.1%})"
          + (f"; kernel here / there {totals[3] / totals[4]:.3f}" if kernels else ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
