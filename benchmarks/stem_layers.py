"""The corpus CNNs' first layers (the stems: three input channels, a stride-2 kernel) one at a time: the direct
convolution kernel each runs (``tv_conv2d_direct_act_f32``, bias and the layer's relu or hard-swish in its
tiles) called directly, against the same lone layer in ONNX Runtime, interleaved in one process. On a
shared machine only the ratios mean anything; the minimum over the rounds is the least disturbed call.

    .venv/bin/python benchmarks/stem_layers.py                    # batch 1, 1 thread
    .venv/bin/python benchmarks/stem_layers.py --batch 8 --threads 2 --rounds 20
    .venv/bin/python benchmarks/stem_layers.py --against ../main  # this kernel against another checkout's

``--against`` builds the same calls from the other checkout's C library (``tensorvm/codegen/lib`` there)
and times them beside this one's (the ratio "here / there"). ONNX Runtime's lone layer includes its
reorders to and from its channel-blocked layout (in the whole model it keeps that layout between layers).

``--cold N`` rotates each call over N copies of the input (and tensorvm's over N outputs), so that they
come from L3 as in a whole model (where the layer had measured 1.3-1.5x its time with them hot in L2):

    .venv/bin/python benchmarks/stem_layers.py --cold 6 --against ../main
"""

from __future__ import annotations

import numpy as np

# (name, in channels, image side, out channels, kernel, hard-swish (else relu)); stride 2, padding kernel // 2
STEMS = [("MobileNetV3", 3, 224, 16, 3, True), ("ResNet-18", 3, 224, 64, 7, False),
         ("SSDlite320 (V3-large)", 3, 320, 16, 3, True)]

_CALLS = r"""
int32_t tv_bench_stem(const int64_t* d, const float* f, const float* x, const float* w, const float* b,
                      float* padded, float* out) {
  return tv_conv2d_direct_act_f32(d[0], d[1], d[2], d[3], d[4], d[5], d[6], d[7], d[7], 2, 2, 1, 1, d[7] / 2,
                                  d[7] / 2, x, w, b, 1, d[8], 0, d[8] ? 0 : 7, f[0], f[1], f[2], f[3], b, 0, padded,
                                  out);
}
"""


def padded_floats(c: int, out_side: int, k: int, lanes: int) -> int:
    """Floats of the direct kernel's padded copy of one image at stride 2 (``tv_vconv_geometry_of``)."""
    wq = -(-out_side // lanes) * lanes + (k - 1) // 2
    return c * ((out_side - 1) * 2 + k) * 2 * wq


def _rotating(calls: list):
    """One call that runs ``calls`` in turn."""
    turn = [0]

    def call():
        calls[turn[0]]()
        turn[0] = (turn[0] + 1) % len(calls)
    return call


def _peer_rotation(model, options, xs: list):
    """ONNX Runtime's session of ``model`` run on each of ``xs`` in turn."""
    import onnxruntime as ort

    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return _rotating([lambda xi=xi: session.run(None, {"x": xi}) for xi in xs])


def main() -> int:
    import sys

    import lone_layers as lone

    cold = 1
    if "--cold" in sys.argv:  # (its own option: lone.prepare parses the shared ones)
        at = sys.argv.index("--cold")
        cold = int(sys.argv[at + 1])
        del sys.argv[at:at + 2]
    args, libraries, options = lone.prepare(__doc__.split("\n\n")[0], 20, _CALLS, {"tv_bench_stem": 7})

    from tensorvm.codegen.host import gemm_params

    rng = np.random.default_rng(0)
    n, lanes = args.batch, gemm_params().lanes
    lone.table_header("The corpus CNNs' stems" + (f", {cold} inputs and outputs in turn" if cold > 1 else ""), 36, args)
    for name, c, side, o, k, swish in STEMS:
        model, weight, bias = lone.onnx_conv_layer(c, side, o, k, 2, 1, "HardSwish" if swish else "Relu", n, rng)
        x = rng.standard_normal((n, c, side, side)).astype(np.float32)
        want, calls = lone.peer_call(model, options, x)
        xs = [x] + [x.copy() for _ in range(cold - 1)]
        if cold > 1:
            calls["onnxruntime"] = _peer_rotation(model, options, xs)
        out_side = want.shape[2]
        for where, lib in libraries.items():
            padded = np.empty(padded_floats(c, out_side, k, lanes), np.float32)
            dims = np.array([n, c, side, side, o, out_side, out_side, k, 0 if swish else 1], np.int64)
            each = []
            for xi in xs:
                out = np.empty(want.shape, np.float32)
                each.append(lone.checked_call(lib.tv_bench_stem, (dims, lone.HARD_SWISH, xi, weight, bias, padded, out),
                                              out, want))
            calls[f"tensorvm {where}"] = _rotating(each)
        best = lone.interleaved_minimum(calls, args.rounds)
        label = f"{name}: {c}x{side}x{side} -> {o}, {k}x{k} s2"
        print(lone.ratio_line(label, 36, best, bool(args.against)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
