"""MobileNetV3-small's depthwise layers (and its first layer, 3 -> 16 at stride 2) one at a time: the kernel
each runs (``tv_conv2d_depthwise_act_f32``, ``tv_conv2d_direct_act_f32``; bias and the layer's relu or
hard-swish in its tiles) called directly, against the same lone layer in ONNX Runtime, interleaved in one
process. On a shared machine only the ratios mean anything; the minimum over the rounds is the least
disturbed call.

    .venv/bin/python benchmarks/depthwise_layers.py                    # batch 1, 1 thread
    .venv/bin/python benchmarks/depthwise_layers.py --batch 8 --threads 2 --rounds 60
    .venv/bin/python benchmarks/depthwise_layers.py --against ../main   # these kernels against another checkout's

``--against`` builds the same calls from the other checkout's C library (``tensorvm/codegen/lib`` there)
and times them beside this one's (the ratio "here / there"). ONNX Runtime adds its own reorders (NCHW to
its channel-blocked layout and back) to a lone layer; in the whole model it keeps the blocked layout
between layers, so its lone-layer times overstate its per-layer cost there (``kernel_gap.py`` compares
the whole model's kernels).
"""

from __future__ import annotations

import numpy as np

# (channels, image side, kernel, stride, hard-swish (else relu)): MobileNetV3-small's depthwise layers
LAYERS = [(16, 112, 3, 2, False), (72, 56, 3, 2, False), (88, 28, 3, 1, False), (96, 28, 5, 2, True),
          (240, 14, 5, 1, True), (120, 14, 5, 1, True), (144, 14, 5, 1, True), (288, 14, 5, 2, True),
          (576, 7, 5, 1, True)]
STEM = (3, 224, 16)  # (in channels, image side, out channels): 3x3, stride 2, hard-swish

_CALLS = r"""
int32_t tv_bench_depthwise(const int64_t* d, const float* f, const float* x, const float* w, const float* b,
                           float* out) {
  return tv_conv2d_depthwise_act_f32(d[0], d[1], d[2], d[3], d[4], d[5], d[6], d[6], d[7], d[7], 1, 1, d[8], d[8], x,
                                     w, b, 1, d[9] == 1, d[9] == 1 ? 0 : 7, f[0], f[1], f[2], f[3], b, 0, out);
}
int32_t tv_bench_direct(const int64_t* d, const float* f, const float* x, const float* w, const float* b,
                        float* padded, float* out) {
  return tv_conv2d_direct_act_f32(d[0], d[1], d[2], d[3], d[4], d[5], d[6], 3, 3, 2, 2, 1, 1, 1, 1, x, w, b, 1, 0, 0,
                                  7, f[0], f[1], f[2], f[3], b, 0, padded, out);
}
"""


def main() -> int:
    import lone_layers as lone

    args, libraries, options = lone.prepare(__doc__.split("\n\n")[0], 40, _CALLS, {"tv_bench_depthwise": 6, "tv_bench_direct": 7})

    from tensorvm.codegen.host import gemm_params

    rng = np.random.default_rng(0)
    n, lanes = args.batch, gemm_params().lanes
    lone.table_header("MobileNetV3-small's depthwise layers and stem", 30, args)
    totals: dict = {}
    cases = [(*STEM, 3, 2, True, True)] + [(c, side, c, k, stride, swish, False) for c, side, k, stride, swish in LAYERS]
    for c, side, o, k, stride, swish, stem in cases:
        model, weight, bias = lone.onnx_conv_layer(c, side, o, k, stride, 1 if stem else c, "HardSwish" if swish else "Relu",
                                              n, rng)
        x = rng.standard_normal((n, c, side, side)).astype(np.float32)
        want, calls = lone.peer_call(model, options, x)
        out_side = want.shape[2]
        for name, lib in libraries.items():
            out = np.empty(want.shape, np.float32)
            if stem:
                wq = -(-out_side // lanes) * lanes + 1  # (tv_vconv_geometry_of: 3x3, stride 2)
                padded = np.empty(c * (2 * out_side + 1) * 2 * wq, np.float32)
                dims = np.array([n, c, side, side, o, out_side, out_side], np.int64)
                args_ = (dims, lone.HARD_SWISH, x, weight, bias, padded, out)
                kernel = lib.tv_bench_direct
            else:
                dims = np.array([n, c, side, side, out_side, out_side, k, stride, k // 2, 0 if swish else 1], np.int64)
                args_ = (dims, lone.HARD_SWISH, x, weight, bias, out)
                kernel = lib.tv_bench_depthwise
            calls[f"tensorvm {name}"] = lone.checked_call(kernel, args_, out, want)
        best = lone.interleaved_minimum(calls, args.rounds)
        for name, us in best.items():
            totals[name] = totals.get(name, 0.0) + us
        label = f"{c}x{side}x{side} -> {o}, {k}x{k} s{stride}" + (" (stem)" if stem else "")
        print(lone.ratio_line(label, 30, best, bool(args.against)))
    line = (f"  all layers: tensorvm {totals['tensorvm here']:.0f} us, onnxruntime {totals['onnxruntime']:.0f} us, "
            f"ratio {totals['tensorvm here'] / totals['onnxruntime']:.3f}")
    if args.against:
        line += f"; here / there {totals['tensorvm here'] / totals['tensorvm there']:.3f}"
    print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
