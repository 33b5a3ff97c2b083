"""The pointwise (1x1) convolution of ``tv_vpointwise.h`` (``tv_conv2d_pointwise_act_f32``): the register
tile over the image's rows in place with its epilogue (bias, relu, residual, clamped affine activation)
in registers, every tail (channels past the tile's rows, pixels past a vector, images narrower than a
tile, one pixel per image), each instance the host description can ask for (the 64-byte one lowered by
gcc on an AVX2 machine), at 1 and more threads; and the routing of the code generator's 1x1 layers to it.
The oracle is NumPy in float64."""

from __future__ import annotations

import numpy as np
import pytest
import test_vconv as vconv
from test_vconv import ACTIVATIONS, THREADS, _activation, _built, _close, _entry, _same_bits, _t

from tensorvm import op
from tensorvm.codegen.fused import build_fused_module
from tensorvm.codegen.strategy import direct_max_reduction
from tensorvm.ir.expr import Function, Var, const

bridge_mode = vconv.bridge_mode  # (test_vconv's fixture; kernel_threads: tests/conftest.py)

_CALLER = """
int32_t tv_test_pointwise(int64_t* d, float* f, const float* x, const float* weights, const float* bias,
                          const float* residual, float* out) {
  return tv_conv2d_pointwise_act_f32(d[0], d[1], d[2], d[3], x, weights, bias, d[4], d[5], d[6], f[0], f[1], f[2],
                                     f[3], residual, d[7], out);
}
"""

# (batch, in channels, pixels, out channels): every split of the channels into tiles of MR and 4 (and a
# repeated last channel), pixels a whole number of tiles, one past, fewer than a tile (copied into rows of
# a tile), one (products of vectors), MobileNetV3's 7 x 7 and 14 x 14; a reduction of 1, one that is no
# multiple of the unrolling or of a vector
CASES = [(1, 16, 64, 72), (2, 5, 49, 13), (3, 24, 196, 40), (2, 7, 33, 1), (1, 1, 17, 9), (2, 3, 5, 6),
         (2, 96, 1, 23), (3, 13, 1, 5), (1, 40, 7, 30), (2, 11, 100, 4)]


@pytest.mark.parametrize("isa", ["avx2", "avx512", "portable"])
def test_pointwise_tiles_of_every_instance(isa, kernel_threads):
    """Each case and activation (with and without a bias, a residual, relu) against NumPy at 1 and more
    threads than cores, the same bits at each count; nothing past the output written; a NaN in the input
    reaches exactly the outputs it feeds."""
    library, _ = _built(isa, _CALLER)
    function = _entry(library, "tv_test_pointwise", 7)
    first: dict = {}
    for threads in (1, THREADS[-1]):
        kernel_threads(threads)
        rng = np.random.default_rng(41 + len(isa))
        for case, (n, c, p, o) in enumerate(CASES):
            x = rng.standard_normal((n, c, p)).astype(np.float32)
            x[-1, 0, 0] = np.nan
            weights = rng.standard_normal((o, c)).astype(np.float32)
            bias = rng.standard_normal(o).astype(np.float32)
            product = np.einsum("oc,ncp->nop", weights.astype(np.float64), x.astype(np.float64))
            for index, activation in enumerate([*ACTIVATIONS, "relu"]):
                relu = activation == "relu"
                act = (0, 1.0, 0.0, 0.0, 0.0) if relu else activation
                has_bias, has_residual = index % 3 != 1, not relu and index % 2 == 0
                residual = rng.standard_normal(product.shape).astype(np.float32)
                expected = product + (bias[:, None] if has_bias else 0) + (residual if has_residual else 0)
                # (relu keeps a NaN, as np.maximum and the direct kernel's TV_VRELU, tv_vconv.h)
                expected = np.maximum(expected, 0) if relu else _activation(expected, *act)
                out = np.full(n * o * p + 16, -7.0, np.float32)  # (16 floats past the output stay)
                dims = np.array([n, c, p, o, has_bias, relu, act[0], has_residual], np.int64)
                floats = np.array(act[1:], np.float32)
                assert function(dims.ctypes.data, floats.ctypes.data, x.ctypes.data, weights.ctypes.data,
                                bias.ctypes.data, residual.ctypes.data, out.ctypes.data) == 0
                assert (out[n * o * p:] == -7.0).all(), (case, index)
                got = out[: n * o * p].reshape(n, o, p)
                nan = np.isnan(expected)
                assert np.array_equal(np.isnan(got), nan), (case, index)
                _close(got[~nan], expected[~nan])
                _same_bits(first, (case, index), got, threads)


def _pointwise_group(c, o, size, epilogue):
    """A primitive function: a 1x1 convolution of a (dynamic batch) x c x size x size image with its bias
    and ``epilogue`` (relu, hard-swish or a residual)."""
    x, w, b = Var("x", _t(None, c, size, size)), Var("w", _t(o, c, 1, 1)), Var("b", _t(o, 1, 1))
    y = op.add(op.nn.conv2d(x, w), b)
    params = [x, w, b]
    if epilogue == "relu":
        body = op.nn.relu(y)
    elif epilogue == "hardswish":
        scalar = [const(np.array(v, np.float32)) for v in (1 / 6, 0.5, 0.0, 1.0)]
        body = op.multiply(y, op.minimum(op.maximum(op.add(op.multiply(y, scalar[0]), scalar[1]), scalar[2]),
                                         scalar[3]))
    else:
        params.append(Var("r", _t(None, o, size, size)))
        body = op.add(y, params[-1])
    return Function(params, body, attrs={"Primitive": 1})


@pytest.mark.parametrize("epilogue", ["relu", "hardswish", "residual"])
@pytest.mark.parametrize("c, size", [(16, 7), (24, 1), (20, 3)])
def test_pointwise_groups_run_their_epilogue_in_the_tiles(epilogue, c, size):
    """A 1x1 layer's group (bias + relu, hard-swish, a residual) through the code generator: the pointwise
    kernel's call and no loop after it, against NumPy at batch 0, 1 and 3."""
    o = 10
    _, kernels = build_fused_module({"k": _pointwise_group(c, o, size, epilogue)})
    k = kernels["k"]
    assert k.variants[0] == "pointwise"
    source = k.source.rsplit("\nint32_t ", 1)[-1]
    assert "tv_conv2d_pointwise_act_f32(" in source
    assert "for (" not in source.split("/* variant generic */")[0]
    rng = np.random.default_rng(c + size)
    w = rng.standard_normal((o, c, 1, 1)).astype(np.float32)
    b = rng.standard_normal((o, 1, 1)).astype(np.float32)
    for batch in (0, 1, 3):
        x = rng.standard_normal((batch, c, size, size)).astype(np.float32)
        want = np.einsum("oc,nchw->nohw", w[:, :, 0, 0].astype(np.float64), x.astype(np.float64)) + b
        arrays = [x, w, b]
        if epilogue == "relu":
            want = np.maximum(want, 0)
        elif epilogue == "hardswish":
            want = want * np.clip(want / 6 + 0.5, 0, 1)
        else:
            arrays.append(rng.standard_normal(want.shape).astype(np.float32))
            want = want + arrays[-1]
        out = np.full(want.shape, np.nan, np.float32)
        k(*arrays, out)
        _close(out, want)


def test_stats_name_the_pointwise_tile():
    import tensorvm as tv
    from tensorvm.codegen import host

    text = ("def @main(%x: Tensor[(1, 8, 16, 16), float32], %w: Tensor[(24, 8, 1, 1), float32]) "
            "{ nn.conv2d(%x, %w) }")
    exe = tv.vm.compile(tv.parse(text), target="c")
    params = host.gemm_params()
    assert exe.stats()["product_kernels"]["convolution"]["pointwise_tile"].startswith(f"{max(params.mr, 4)}x{params.nr}")
    assert exe.stats()["kernel_library"]["variants"] == {"pointwise": 1}


def test_pointwise_routing_follows_the_reduction_bound():
    """Longer reductions than ``direct_max_reduction`` (packed at compile time when their weight is
    constant) and strided or padded 1x1 layers keep the product."""
    bound = direct_max_reduction()
    for c, attrs, pointwise in [(bound, {}, True), (bound + 1, {}, False), (bound, {"strides": [2, 2]}, False),
                                (bound, {"padding": [1, 1, 1, 1]}, False)]:
        x, w = Var("x", _t(1, c, 8, 8)), Var("w", _t(4, c, 1, 1))
        _, kernels = build_fused_module({"k": Function([x, w], op.nn.conv2d(x, w, **attrs),
                                                       attrs={"Primitive": 1})})
        assert (kernels["k"].variants[0] == "pointwise") == pointwise, (c, attrs, kernels["k"].variants)
