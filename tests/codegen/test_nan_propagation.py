"""NaN and +-inf through the fused epilogues of the C kernels (relu, clip, relu6, hard-swish, GELU, the
direct convolution's 2x2 max pool) and through the generated elementwise ops and reductions: target "c"
gives what the reference interpreter gives, which follows NumPy (np.maximum / np.minimum / np.max keep a
NaN: relu(NaN) is NaN, not 0). Each program names the C function that must compute it, checked in the
kernel's generated body, so a test covers the path it names."""

from __future__ import annotations

import re

import numpy as np
import pytest

import tensorvm as tv
from tensorvm import op
from tensorvm.codegen import blas
from tensorvm.codegen.strategy import direct_max_reduction
from tensorvm.ir.expr import Function, Var, const
from tensorvm.ir.module import IRModule
from tensorvm.ir.types import TensorType

pytestmark = [pytest.mark.skipif(not blas.available(), reason="no host BLAS callable from C (NumPy's OpenBLAS)"),
              pytest.mark.filterwarnings("ignore::RuntimeWarning")]  # (the interpreter's NumPy on inf and NaN)

F32 = "float32"


@pytest.fixture(autouse=True)
def bridge_mode(monkeypatch):
    monkeypatch.setenv("TENSORVM_BLAS", "c")


def _f32(v):
    return const(np.float32(v))


def _library_calls(exe) -> set:
    """The tv_*_f32 functions the kernels' own bodies call (not the prelude's definitions)."""
    found = set()
    for body in re.findall(r"\nint32_t tvk\d+_\w+\([^)]*\) \{\n(.*?)\n\}\n", exe.c_library.source, re.S):
        found.update(re.findall(r"\b(tv_\w+_f32)\(", body))
    return found


def _specials(shape, rng, spots=((0, 0), (1, 1), (2, 2))):
    """A standard normal array with a NaN, +inf and -inf at three (flat, spread) places."""
    data = rng.standard_normal(shape).astype(np.float32)
    flat = data.reshape(-1)
    for (value, (num, den)) in zip((np.nan, np.inf, -np.inf), ((1, 7), (3, 7), (5, 7))):
        flat[flat.size * num // den + 3] = value
    return data


def _check(body, params, args, kernel, rtol=1e-4):
    """Compile Function(params, body) for target c, check that a kernel calls ``kernel`` (None: no
    library call needed), run it and compare with the interpreter: same NaN and inf positions, the rest
    to float tolerance. Returns the C result."""
    mod = IRModule.from_expr(Function(params, body))
    exe = tv.vm.compile(mod, target="c")
    if kernel is not None:
        assert kernel in _library_calls(exe), (kernel, _library_calls(exe))
    got = tv.vm.VirtualMachine(exe).invoke("main", *args)
    got = np.asarray(got.numpy() if hasattr(got, "numpy") else got)
    want = tv.create_executor("debug", mod).evaluate()(*args)
    want = np.asarray(want.numpy() if hasattr(want, "numpy") else want)
    assert got.shape == want.shape and got.dtype == want.dtype
    assert np.isnan(want).any(), "the program must carry a NaN to the output"
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_array_equal(np.isposinf(got), np.isposinf(want))
    np.testing.assert_array_equal(np.isneginf(got), np.isneginf(want))
    scale = max(1.0, float(np.abs(want[np.isfinite(want)]).max(initial=0)))
    np.testing.assert_allclose(got, want, rtol=rtol, atol=rtol * scale, equal_nan=True)
    return got


def _relu(v):
    return op.nn.relu(v)


def _relu6(v):
    return op.clip(v, a_min=0.0, a_max=6.0)


def _hardswish(v):
    return op.multiply(v, op.divide(op.clip(op.add(v, _f32(3)), a_min=0.0, a_max=6.0), _f32(6)))


def _clip(v):
    return op.clip(v, a_min=-0.5, a_max=0.5)


# ---- the convolution kernels of tv_vconv.h / tv_vpointwise.h -------------------------------------------

@pytest.mark.parametrize("where", ["input", "weight"])
@pytest.mark.parametrize("width", [32, 21])  # (whole tiles; a partial last column block)
def test_direct_convolution_bias_relu(where, width):
    rng = np.random.default_rng(1)
    c, o = 3, 16
    assert c * 9 <= direct_max_reduction()
    w = rng.standard_normal((o, c, 3, 3)).astype(np.float32)
    if where == "weight":
        w[5, 1, 1, 2] = np.nan
        w[9, 0, 2, 0] = np.inf
    x = Var("x", TensorType((1, c, 16, width), F32))
    b = const(rng.standard_normal((o,)).astype(np.float32))
    body = _relu(op.nn.bias_add(op.nn.conv2d(x, const(w), padding=[1, 1, 1, 1]), b))
    data = _specials((1, c, 16, width), rng) if where == "input" else rng.standard_normal((1, c, 16, width)).astype(F32)
    _check(body, [x], [data], "tv_conv2d_direct_f32")


@pytest.mark.parametrize("relu", [True, False])
@pytest.mark.parametrize("width", [32, 22])
def test_direct_convolution_relu_2x2_max_pool(relu, width):
    """The pool epilogue: one NaN input pixel makes a 3x3 patch of NaN outputs, so some pooling windows
    hold a NaN in one row or one column only (in the vector tile's rows, its lane pairs, and the scalar
    path of a partial column block)."""
    rng = np.random.default_rng(2)
    c, o = 3, 16
    x = Var("x", TensorType((1, c, 16, width), F32))
    w = const(rng.standard_normal((o, c, 3, 3)).astype(np.float32))
    b = const(rng.standard_normal((o,)).astype(np.float32))
    v = op.nn.bias_add(op.nn.conv2d(x, w, padding=[1, 1, 1, 1]), b)
    body = op.nn.max_pool2d(_relu(v) if relu else v, pool_size=[2, 2], strides=[2, 2])
    data = rng.standard_normal((1, c, 16, width)).astype(np.float32)
    for y, x0, value in ((3, 4, np.nan), (8, 9, np.nan), (12, width - 3, np.nan), (5, 17, np.inf), (10, 1, -np.inf)):
        data[0, 0, y, x0] = value
    _check(body, [x], [data], "tv_conv2d_direct_f32")


@pytest.mark.parametrize("act, kernel", [(_relu, "tv_conv2d_depthwise_f32"), (_relu6, "tv_conv2d_depthwise_act_f32"),
                                         (_hardswish, "tv_conv2d_depthwise_act_f32")])
@pytest.mark.parametrize("strides, k, h, w", [(1, 3, 20, 36), (2, 3, 20, 36), (1, 5, 14, 14), (1, 3, 14, 13), (1, 7, 7, 7)])
def test_depthwise_convolution_activations(act, kernel, strides, k, h, w):
    """Column tiles (3x3 at 20 x 36), and the channel-blocked tiles at unit stride (5x5 at 14 x 14, 3x3
    at 14 x 13, 7x7 at 7 x 7; 29 channels: a partial channel block)."""
    rng = np.random.default_rng(3)
    c = 32 if k == 3 and h == 20 else 29
    x = Var("x", TensorType((1, c, h, w), F32))
    wt = const(rng.standard_normal((c, 1, k, k)).astype(np.float32))
    b = const(rng.standard_normal((c,)).astype(np.float32))
    conv = op.nn.conv2d(x, wt, padding=[k // 2] * 4, strides=[strides, strides], groups=c)
    body = act(op.nn.bias_add(conv, b))
    _check(body, [x], [_specials((1, c, h, w), rng)], kernel)


@pytest.mark.parametrize("act", [_relu, _relu6])
@pytest.mark.parametrize("pixels, weight, kernel", [
    ((16, 24), "constant", "tv_conv2d_pointwise_act_f32"),  # the register tiles
    ((1, 1), "parameter", "tv_conv2d_pointwise_act_f32"),  # one pixel: GEMV + scalar epilogue
    ((1, 1), "constant", "tv_conv2d_packed"),  # one pixel, packed weight: one product of the batch's rows
])
def test_pointwise_convolution(act, pixels, weight, kernel):
    rng = np.random.default_rng(4)
    c, o, n = 48, 40, 2 if pixels != (1, 1) else 32  # (a batch of 1x1 images long enough for the library call)
    assert c <= min(64, direct_max_reduction())
    x = Var("x", TensorType((n, c, *pixels), F32))
    weights = rng.standard_normal((o, c, 1, 1)).astype(np.float32)
    w = const(weights) if weight == "constant" else Var("w", TensorType((o, c, 1, 1), F32))
    b = const(rng.standard_normal((o,)).astype(np.float32))
    body = act(op.nn.bias_add(op.nn.conv2d(x, w), b))
    data = _specials((n, c, *pixels), rng) if pixels != (1, 1) else rng.standard_normal((n, c, 1, 1)).astype(F32)
    if pixels == (1, 1):
        data[0, 7, 0, 0], data[1, 3, 0, 0], data[5, 0, 0, 0] = np.nan, np.inf, -np.inf
    if kernel == "tv_conv2d_packed":  # (its entry with relu alone, or with the activation's epilogue)
        _check(body, [x], [data], "tv_conv2d_packed_f32" if act is _relu else "tv_conv2d_packed_act_f32")
    elif weight == "constant":
        _check(body, [x], [data], kernel)
    else:
        _check(body, [x, w], [data, weights], kernel)


@pytest.mark.parametrize("act, kernel", [(_relu, "tv_conv2d_packed_f32"), (_clip, "tv_conv2d_packed_act_f32")])
def test_packed_convolution(act, kernel):
    rng = np.random.default_rng(5)
    c, o = 256, 32
    assert c * 9 > direct_max_reduction()
    x = Var("x", TensorType((1, c, 10, 12), F32))
    w = const((rng.standard_normal((o, c, 3, 3)) * 0.05).astype(np.float32))
    b = const(rng.standard_normal((o, 1, 1)).astype(np.float32))
    body = act(op.add(op.nn.conv2d(x, w, padding=[1, 1, 1, 1]), b))
    _check(body, [x], [_specials((1, c, 10, 12), rng)], kernel)


# ---- the packed product's epilogue (tv_vgemm.h) and the generated second pass -------------------------

@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("act", ["relu", "clip", "gelu", "gelu_tanh"])
def test_dense_activations(act, fused, monkeypatch):
    from tensorvm.codegen import strategy

    monkeypatch.setattr(strategy, "PRODUCT_EPILOGUE", fused)
    rng = np.random.default_rng(6)
    m, k, n = 37, 64, 48
    x = Var("x", TensorType((m, k), F32))
    w = const((rng.standard_normal((n, k)) * 0.2).astype(np.float32))
    b = const(rng.standard_normal((n,)).astype(np.float32))
    v = op.add(op.nn.dense(x, w), b)
    body = {"relu": lambda: _relu(v), "clip": lambda: _clip(v), "gelu": lambda: op.nn.gelu(v),
            "gelu_tanh": lambda: op.nn.gelu(v, approximate="tanh")}[act]()
    data = rng.standard_normal((m, k)).astype(np.float32)
    data[3, 5], data[10, 0], data[20, 63] = np.nan, np.inf, -np.inf
    _check(body, [x], [data], "tv_gemm_packed_epi_f32" if fused else "tv_gemm_packed_f32")


# ---- generated elementwise ops, reductions, softmax -----------------------------------------------------

@pytest.mark.parametrize("name", ["relu", "clip", "maximum", "minimum", "maximum_const", "minimum_const"])
def test_elementwise(name):
    rng = np.random.default_rng(7)
    x, y = Var("x", TensorType((5, 67), F32)), Var("y", TensorType((5, 67), F32))
    body = {"relu": lambda: _relu(x), "clip": lambda: _clip(x), "maximum": lambda: op.maximum(x, y),
            "minimum": lambda: op.minimum(y, x), "maximum_const": lambda: op.maximum(_f32(0), x),
            "minimum_const": lambda: op.minimum(x, _f32(0.25))}[name]()
    a, b2 = _specials((5, 67), rng), _specials((5, 67), rng)
    b2[1, 1], b2[2, 2] = np.nan, np.nan  # (NaN in either operand)
    _check(body, [x, y], [a, b2], None)


@pytest.mark.parametrize("reduce", ["max", "min"])
@pytest.mark.parametrize("axis", [None, 1, 0])
def test_reductions(reduce, axis):
    rng = np.random.default_rng(8)
    x = Var("x", TensorType((6, 131), F32))
    body = getattr(op, reduce)(x, axis=axis) if axis is not None else getattr(op, reduce)(x)
    data = rng.standard_normal((6, 131)).astype(np.float32)
    data[1, 100], data[2, 0], data[4, 130] = np.nan, np.inf, -np.inf
    data[5, :] = -np.inf
    _check(body, [x], [data], None)


@pytest.mark.parametrize("log", [False, True])
def test_softmax_with_a_nan_row(log):
    rng = np.random.default_rng(9)
    x = Var("x", TensorType((5, 100), F32))
    body = (op.nn.log_softmax if log else op.nn.softmax)(x)
    data = rng.standard_normal((5, 100)).astype(np.float32)
    data[1, 57], data[3, 99], data[4, 0] = np.nan, np.inf, -np.inf
    _check(body, [x], [data], "tv_softmax_f32")
