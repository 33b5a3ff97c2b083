"""MobileNetV3-small's pointwise (1x1) layers one at a time, bias and activation included, interleaved in one
process: the pointwise kernel (``tv_conv2d_pointwise_act_f32``, ``tv_vpointwise.h``: the epilogue in its
tiles), the product it replaced (``tv_conv2d_f32``: ``tv_gemm`` over the image, then a second pass for
the bias and activation, here a plain C loop), the packed convolution (``tv_conv2d_packed_act_f32`` over
the weight packed as ``PackWeights`` packs it: where reductions longer than ``direct_max_reduction``
go), and the same lone layer in ONNX Runtime. On a shared machine only the ratios mean anything; the
minimum over the rounds is the least disturbed call.

    .venv/bin/python benchmarks/pointwise_layers.py                    # batch 1, 1 thread
    .venv/bin/python benchmarks/pointwise_layers.py --batch 8 --threads 2 --rounds 60

ONNX Runtime adds its own reorders to a lone layer (see ``depthwise_layers.py``); ``kernel_gap.py``
compares the whole model's kernels.
"""

from __future__ import annotations

import ctypes

import numpy as np

# (in channels, image side, out channels, activation): MobileNetV3-small's 1x1 layers, its squeeze-and-
# excitation layers at 1 x 1 last; 576 -> 96 has a reduction longer than direct_max_reduction on AVX2
LAYERS = [(16, 56, 72, "Relu"), (72, 28, 24, "Identity"), (24, 28, 88, "Relu"), (88, 28, 24, "Identity"),
          (24, 28, 96, "HardSwish"), (96, 14, 40, "Identity"), (40, 14, 240, "HardSwish"), (240, 14, 40, "Identity"),
          (120, 14, 48, "Identity"), (144, 14, 48, "Identity"), (48, 14, 288, "HardSwish"),
          (288, 7, 96, "Identity"), (96, 7, 576, "HardSwish"), (576, 7, 96, "Identity"),
          (576, 1, 144, "Relu"), (144, 1, 576, "HardSigmoid")]
# (act bits of tv_vec.h, alpha, beta, lo, hi; relu as the kernels' relu flag)
ACTS = {"Relu": (0, 1.0, 0.0, 0.0, 0.0), "Identity": (0, 1.0, 0.0, 0.0, 0.0), "HardSwish": (7, 1 / 6, 0.5, 0.0, 1.0),
        "HardSigmoid": (3, 0.2, 0.5, 0.0, 1.0)}

_CALLS = r"""
int32_t tv_bench_pointwise(const int64_t* d, const float* f, const float* x, const float* w, const float* b, float* out) {
  return tv_conv2d_pointwise_act_f32(d[0], d[1], d[2] * d[2], d[3], x, w, b, 1, d[4], d[5], f[0], f[1], f[2], f[3],
                                     b, 0, out);
}
int32_t tv_bench_product(const int64_t* d, const float* f, const float* x, const float* w, const float* b, float* out) {
  float col[1];
  const int32_t status = tv_conv2d_f32(d[0], d[1], d[2], d[2], d[3], d[2], d[2], 1, 1, 1, 1, 1, 1, 0, 0, 1, x, w, col,
                                       out);
  const int64_t p = d[2] * d[2];
  for (int64_t r = 0; r < d[0] * d[3]; ++r) {  /* the second pass: bias, then relu or the activation */
    float* o = out + r * p;
    const float bias = b[r % d[3]];
    for (int64_t j = 0; j < p; ++j) {
      const float v = o[j] + bias;
      float s = v * f[0] + f[1];
      s = s < f[2] ? f[2] : s;
      s = s > f[3] ? f[3] : s;
      o[j] = d[4] ? (v > 0.0f ? v : 0.0f) : d[5] == 7 ? v * s : d[5] == 3 ? s : v;
    }
  }
  return status;
}
int32_t tv_bench_packed(const int64_t* d, const float* f, const float* x, const float* packed, const float* b,
                        float* out) {
  return tv_conv2d_packed_act_f32(d[0], d[1], d[2], d[2], d[3], d[2], d[2], 1, 1, 1, 1, 1, 1, 0, 0, x, packed, b, 1,
                                  d[4], d[5], f[0], f[1], f[2], f[3], b, 0, out);
}
"""
KERNELS = ("pointwise", "product", "packed")


def main() -> int:
    from lone_layers import interleaved_minimum, layer_arguments, onnx_conv_layer, ort_options
    from lone_layers import libraries as built

    args = layer_arguments(__doc__.split("\n\n")[0], 40, "pointwise kernel")

    import onnxruntime as ort

    import tensorvm as tv
    from tensorvm.codegen.host import gemm_params
    from tensorvm.op.nn import pack_conv_weight

    tv.set_num_threads(args.threads)
    libraries = built(_CALLS, args.against)
    for lib in libraries.values():
        for kernel in KERNELS:
            getattr(lib, f"tv_bench_{kernel}").argtypes = [ctypes.c_void_p] * 6
    options = ort_options(args.threads)
    rng = np.random.default_rng(0)
    n, nr = args.batch, gemm_params().nr
    print(f"MobileNetV3-small's 1x1 layers, batch {n}, {args.threads} thread(s), {args.rounds} interleaved rounds; "
          "us per call, min; ratios to ONNX Runtime")
    print(f"  {'layer':28s} {'onnxruntime':>11s} " + " ".join(f"{k:>9s}" for k in KERNELS)
          + ("  pointwise here / there" if args.against else ""))
    totals: dict = {}
    for c, side, o, activation in LAYERS:
        model, weight, bias = onnx_conv_layer(c, side, o, 1, 1, 1, activation, n, rng)
        session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
        x = rng.standard_normal((n, c, side, side)).astype(np.float32)
        want = session.run(None, {"x": x})[0]
        act = ACTS[activation]
        dims = np.array([n, c, side, o, activation == "Relu", act[0]], np.int64)
        floats = np.array(act[1:], np.float32)
        calls = {"onnxruntime": lambda session=session, x=x: session.run(None, {"x": x})}
        for where, lib in libraries.items():
            for kernel in KERNELS if where == "here" else ("pointwise",):
                out = np.empty(want.shape, np.float32)
                w = pack_conv_weight(weight, nr) if kernel == "packed" else weight
                args_ = (dims, floats, x, w, bias, out)
                function = getattr(lib, f"tv_bench_{kernel}")
                pointers = [a.ctypes.data for a in args_]
                assert function(*pointers) == 0
                np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-4)
                # (the arrays ride along: the pointers alone would outlive them)
                calls[f"{kernel} {where}"] = lambda function=function, pointers=pointers, keep=args_: function(*pointers)
        best = interleaved_minimum(calls, args.rounds)
        for name, us in best.items():
            totals[name] = totals.get(name, 0.0) + us
        label = f"{c}x{side}x{side} -> {o} {activation}"
        line = f"  {label:28s} {best['onnxruntime']:11.1f} " + " ".join(
            f"{best[k + ' here'] / best['onnxruntime']:9.2f}" for k in KERNELS)
        if args.against:
            line += f"  {best['pointwise here'] / best['pointwise there']:.3f}"
        print(line)
    print(f"  all layers: onnxruntime {totals['onnxruntime']:.0f} us; " + ", ".join(
        f"{k} {totals[k + ' here']:.0f} us ({totals[k + ' here'] / totals['onnxruntime']:.2f})" for k in KERNELS))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
