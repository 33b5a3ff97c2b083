"""The direct convolution's tall tiles (``tv_vconv_tall*``, ``tv_vconv.h``: every direct convolution without
a pool) on layers with few input channels, the RGB stems' and odd ones: 1 to 5 channels, kernels 1x1 to
7x7, strides 1-3, dilation 2, odd image sizes and asymmetric padding, batch 1 and 3, every channel, row
and column tail, each fused epilogue (bias, relu, hard-swish, clip, a residual), NaN and inf
in the input, at 1, 2 and 3 threads (the same bits at each), for both tile shapes (8 x 3 with 32 vector
registers, 6 x 2 with 16) and each vector width. Oracle: the reference op's NumPy kernel in float64 with
NumPy's maximum/minimum (NaN kept), and end to end the interpreter (``create_executor("debug")``)."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

import tensorvm as tv
from tensorvm import op
from tensorvm.codegen import blas, build, host
from tensorvm.codegen.c_emit import prelude
from tensorvm.ir.expr import Function, Var, const
from tensorvm.ir.module import IRModule
from tensorvm.ir.types import TensorType
from tensorvm.op.registry import get_op

pytestmark = [pytest.mark.skipif(not blas.available(), reason="no host BLAS callable from C (NumPy's OpenBLAS)"),
              pytest.mark.filterwarnings("ignore::RuntimeWarning")]  # (NumPy on NaN and inf)

CONV = get_op("nn.conv2d")

_CALLER = """
int32_t tv_test_direct_act(int64_t* d, const float* f, const float* x, const float* weights, const float* bias,
                           const float* residual, float* padded, float* out) {
  return tv_conv2d_direct_act_f32(d[0], d[1], d[2], d[3], d[4], d[5], d[6], d[7], d[8], d[9], d[10], d[11], d[12],
                                  d[13], d[14], x, weights, bias, d[15], d[16], 0, d[17], f[0], f[1], f[2], f[3],
                                  residual, d[18], padded, out);
}
"""

# (data shape, out channels, kernel, strides, dilation, padding (top, left, bottom, right))
CASES = [
    ((1, 3, 33, 35), 16, (3, 3), (2, 2), (1, 1), (1, 1, 1, 1)),   # a MobileNet stem, odd size
    ((3, 3, 29, 31), 64, (7, 7), (2, 2), (1, 1), (3, 3, 3, 3)),   # a ResNet stem, batch 3
    ((1, 1, 17, 19), 7, (5, 5), (1, 1), (1, 1), (2, 2, 2, 2)),    # one channel, unit stride
    ((3, 2, 13, 41), 17, (3, 3), (3, 3), (1, 1), (0, 1, 2, 1)),   # stride 3, asymmetric padding
    ((1, 3, 19, 23), 9, (3, 3), (1, 1), (2, 2), (2, 2, 2, 2)),    # dilation 2
    ((1, 4, 11, 9), 3, (1, 1), (1, 1), (1, 1), (0, 0, 0, 0)),     # 1x1, fewer channels than a tile
    ((1, 2, 9, 27), 12, (2, 4), (2, 3), (1, 2), (1, 0, 0, 3)),    # rectangular kernel, mixed strides
    ((3, 5, 15, 15), 10, (3, 3), (2, 2), (1, 1), (1, 1, 1, 1)),   # 5 channels
    ((1, 3, 8, 5), 1, (7, 7), (1, 2), (1, 1), (3, 3, 3, 3)),      # output narrower than a vector
    # column stride 2: the rows split straight from the image (tv_vconv_split2), each border
    ((1, 2, 7, 16), 5, (3, 3), (2, 2), (1, 1), (0, 0, 0, 0)),
    ((1, 3, 9, 17), 4, (5, 5), (2, 2), (1, 1), (2, 2, 2, 2)),
    ((1, 1, 6, 33), 6, (3, 3), (2, 2), (1, 1), (4, 5, 1, 0)),
    ((2, 3, 10, 31), 8, (3, 3), (2, 2), (2, 2), (1, 3, 1, 1)),
]

HARD_SWISH = (7, 1 / 6, 0.5, 0.0, 1.0)   # (TV_ACT_LO | HI | GATE, alpha, beta, lo, hi)
CLIP = (3, 1.0, 0.0, -0.5, 0.5)
# (bias, relu, activation, residual)
EPILOGUES = [(0, 0, None, 0), (1, 1, None, 0), (1, 0, HARD_SWISH, 0), (1, 0, CLIP, 1), (0, 0, HARD_SWISH, 1)]


def _library(shape, isa):
    """The kernels built for instance ``isa`` with the tall tile ``shape`` ("native": the host's choice,
    "16": the 6 x 2 tile of 16 vector registers), the test caller and the instance's lanes."""
    defines = "" if shape == "native" else "#define TV_VCONV_TALL_ROWS 2\n#define TV_VCONV_TALL_OC 6\n"
    host.set_host(isa)
    try:
        library, lanes = build.build_library([(defines + prelude() + _CALLER, ())]), host.gemm_params().lanes
    finally:
        host.set_host(None)
    entry = library._cdll.tv_test_direct_act
    entry.restype, entry.argtypes = ctypes.c_int32, [ctypes.c_void_p] * 8
    return library, entry, lanes


def _expected(x, w, b, r, attrs, bias, relu, act):
    v = CONV.kernel(CONV.normalize_attrs(attrs), x.astype(np.float64), w.astype(np.float64))
    if bias:
        v = v + b[:, None, None]
    if relu:
        v = np.maximum(v, 0)
    if r is not None:
        v = v + r
    if act is not None:
        _, alpha, beta, lo, hi = act
        s = np.minimum(np.maximum(v * alpha + beta, lo), hi)
        v = v * s if act[0] & 4 else s
    return v


def _padded(c, oh, ow, kh, kw, sh, sw, dh, dw, lanes):
    hp = (oh - 1) * sh + (kh - 1) * dh + 1
    wq = -(-ow // lanes) * lanes + (kw - 1) * dw // sw
    return np.full(c * hp * sw * wq + 64, np.nan, np.float32)


@pytest.mark.parametrize("shape, isa", [("native", None), ("16", None), ("native", "avx512"), ("native", "portable")])
def test_tall_tiles_against_the_reference(shape, isa, kernel_threads):
    _, entry, lanes = _library(shape, isa)
    first: dict = {}
    for threads in (1, 2, 3):
        kernel_threads(threads)
        rng = np.random.default_rng(7)
        for case, ((n, c, h, w), o, (kh, kw), (sh, sw), (dh, dw), pad) in enumerate(CASES):
            x = rng.standard_normal((n, c, h, w)).astype(np.float32)
            flat = x.reshape(-1)
            flat[flat.size // 5] = np.nan
            flat[flat.size // 2] = np.inf
            flat[flat.size * 4 // 5] = -np.inf
            weights = rng.standard_normal((o, c, kh, kw)).astype(np.float32)
            b = rng.standard_normal(o).astype(np.float32)
            attrs = {"padding": list(pad), "strides": [sh, sw], "dilation": [dh, dw]}
            for e, (bias, relu, act, res) in enumerate(EPILOGUES):
                plain = _expected(x, weights, b, None, attrs, 0, 0, None)
                r = rng.standard_normal(plain.shape).astype(np.float32) if res else None
                want = _expected(x, weights, b, r, attrs, bias, relu, act)
                oh, ow = want.shape[2:]
                size = int(np.prod(want.shape))
                buffer = np.full(size + 16, np.nan, np.float32)
                out = buffer[:size].reshape(want.shape)
                dims = np.array([n, c, h, w, o, oh, ow, kh, kw, sh, sw, dh, dw, pad[0], pad[1], bias, relu,
                                 act[0] if act else 0, res], np.int64)
                f = np.array(act[1:] if act else (1, 0, 0, 0), np.float32)
                padded = _padded(c, oh, ow, kh, kw, sh, sw, dh, dw, lanes)
                residual = r if r is not None else b
                assert entry(dims.ctypes.data, f.ctypes.data, x.ctypes.data, weights.ctypes.data, b.ctypes.data,
                             residual.ctypes.data, padded.ctypes.data, out.ctypes.data) == 0
                assert np.isnan(buffer[size:]).all() and np.isnan(padded[-64:]).all()
                np.testing.assert_array_equal(np.isnan(out), np.isnan(want), err_msg=f"case {case} epilogue {e}")
                np.testing.assert_array_equal(np.isposinf(out), np.isposinf(want))
                np.testing.assert_array_equal(np.isneginf(out), np.isneginf(want))
                finite = np.isfinite(want)
                scale = max(1.0, float(np.abs(want[finite]).max(initial=0)))
                np.testing.assert_allclose(out[finite], want[finite], rtol=1e-4, atol=1e-4 * scale)
                key = (case, e)
                if key not in first:
                    first[key] = out.copy()
                else:
                    np.testing.assert_array_equal(out, first[key], err_msg=f"{threads} threads, case {case}")


def _hardswish(v):
    return op.multiply(v, op.divide(op.clip(op.add(v, const(np.float32(3))), a_min=0.0, a_max=6.0),
                                    const(np.float32(6))))


@pytest.mark.parametrize("stem", ["mobilenet", "resnet"])
@pytest.mark.parametrize("batch", [1, 3])
def test_stems_against_the_interpreter(stem, batch, monkeypatch):
    """A stem (3 -> 16 3x3 stride 2 + bias + hard-swish, 3 -> 64 7x7 stride 2 + bias + relu) compiled for
    target c runs tv_conv2d_direct_act_f32 (its epilogue in the tiles) and matches the interpreter, a NaN
    in the input included."""
    monkeypatch.setenv("TENSORVM_BLAS", "c")
    rng = np.random.default_rng(batch)
    k, o = (3, 16) if stem == "mobilenet" else (7, 64)
    shape = (batch, 3, 45, 38)
    w = (rng.standard_normal((o, 3, k, k)) / k).astype(np.float32)
    b = const(rng.standard_normal((o, 1, 1)).astype(np.float32))
    x = Var("x", TensorType(shape, "float32"))
    y = op.add(op.nn.conv2d(x, const(w), padding=[k // 2] * 4, strides=[2, 2]), b)
    body = _hardswish(y) if stem == "mobilenet" else op.nn.relu(y)
    mod = IRModule.from_expr(Function([x], body))
    exe = tv.vm.compile(mod, target="c")
    assert "tv_conv2d_direct_act_f32(" in exe.c_library.source
    data = rng.standard_normal(shape).astype(np.float32)
    data[0, 1, 20, 17] = np.nan
    got = tv.vm.VirtualMachine(exe).invoke("main", data)
    got = np.asarray(got.numpy() if hasattr(got, "numpy") else got)
    want = tv.create_executor("debug", mod).evaluate()(data)
    want = np.asarray(want.numpy() if hasattr(want, "numpy") else want)
    assert np.isnan(want).any()
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * max(1.0, float(np.nanmax(np.abs(want)))), equal_nan=True)
