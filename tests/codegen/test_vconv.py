"""The direct and depthwise convolutions of ``tv_vconv.h`` (``tv_conv2d_direct_f32``,
``tv_conv2d_depthwise_f32``): any strides, dilation and padding,
every tail of its tiles, each instance the host description can ask for (the 64-byte AVX-512 one is
lowered by gcc to pairs of 256-bit operations on an AVX2 machine), called directly and through the kernels
the code generator builds (dynamic batch). The oracle is the reference op's NumPy kernel in float64."""

from __future__ import annotations

import ctypes
import dataclasses
import os
import platform

import numpy as np
import pytest

from tensorvm import op
from tensorvm.codegen import blas, build, host
from tensorvm.codegen.c_emit import prelude
from tensorvm.codegen.fused import build_fused_module
from tensorvm.codegen.strategy import direct_max_reduction
from tensorvm.ir.expr import Function, Var, const
from tensorvm.ir.types import Any, TensorType
from tensorvm.op.registry import get_op

pytestmark = pytest.mark.skipif(not blas.available(), reason="no host BLAS callable from C (NumPy's OpenBLAS)")

F32 = "float32"
CONV = get_op("nn.conv2d")


@pytest.fixture(autouse=True)
def bridge_mode(monkeypatch):
    monkeypatch.setenv("TENSORVM_BLAS", "c")


def _t(*shape):
    return TensorType(tuple(Any() if d is None else d for d in shape), F32)


def _reference(x, w, attrs):
    return CONV.kernel(CONV.normalize_attrs(attrs), x.astype(np.float64), w.astype(np.float64))


def _close(got, want):
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * max(1.0, float(np.abs(want).max(initial=0))))


_CALLERS = """
int32_t tv_test_direct(int64_t* d, const float* x, const float* weights, const float* bias, float* padded, float* out) {
  return tv_conv2d_direct_f32(d[0], d[1], d[2], d[3], d[4], d[5], d[6], d[7], d[8], d[9], d[10], d[11], d[12], d[13],
                              d[14], x, weights, bias, d[15], d[16], d[17], padded, out);
}
int32_t tv_test_packed(int64_t* d, const float* x, const float* packed, const float* bias, float* out) {
  return tv_conv2d_packed_f32(d[0], d[1], d[2], d[3], d[4], d[5], d[6], d[7], d[8], d[9], d[10], d[11], d[12], d[13],
                              d[14], x, packed, bias, d[15], d[16], out);
}
int32_t tv_test_depthwise(int64_t* d, const float* x, const float* weights, const float* bias, float* out) {
  return tv_conv2d_depthwise_f32(d[0], d[1], d[2], d[3], d[4], d[5], d[6], d[7], d[8], d[9], d[10], d[11], d[12],
                                 d[13], x, weights, bias, d[14], d[15], out);
}
"""


def _instance(isa):
    """The host description of the instance ``isa``: an ISA name, or "avx512-ymm", an AVX-512 host whose
    FMA datapath is 256 bits wide (Zen 4): 32-byte vectors, the packed convolution's tile taller than the
    product's (``gemm_params``: ``conv_mr``, from AVX-512VL's 32 registers)."""
    if isa == "avx2-only":
        return "avx2"
    if isa != "avx512-ymm":
        return isa
    avx512 = host.isa_host("avx512")
    return host.fma_vector_host(dataclasses.replace(avx512, fma_bits=256, flags=("avx512f", "avx512vl")))


def _flags(isa):
    """The compiler flags of the instance ``isa`` beyond the toolchain's: "avx2-only" is the AVX2 instance
    compiled without AVX-512, as on an AVX2 machine (its partial rows stored by split plain moves and loaded
    by VMASKMOVPS, where an AVX-512 machine's 32-byte instance uses AVX-512VL's masks)."""
    if isa != "avx2-only":
        return ()
    if platform.machine().lower() not in ("x86_64", "amd64"):
        pytest.skip("the AVX2 instance without AVX-512 is an x86-64 build")
    return ("-mno-avx512f",)


def _built(isa, callers):
    """The library of the kernels and ``callers`` built for the instance ``isa``, and that instance's
    product parameters (``host.gemm_params``: its lanes, its tile)."""
    flags = _flags(isa)
    host.set_host(_instance(isa))
    try:
        return build.build_library([(prelude() + callers, flags)]), host.gemm_params()
    finally:
        host.set_host(None)


def _entry(library, name, pointers):
    """The test caller ``name`` of ``library``: ``pointers`` pointer arguments, an int32 status."""
    function = getattr(library._cdll, name)
    function.restype = ctypes.c_int32
    function.argtypes = [ctypes.c_void_p] * pointers
    return function


def _library(isa):
    library, params = _built(isa, _CALLERS)
    _DEPTHWISE[isa] = _entry(library, "tv_test_depthwise", 5)
    _PACKED[isa] = _entry(library, "tv_test_packed", 5)
    return library, params.lanes, _entry(library, "tv_test_direct", 6)


_PACKED: dict = {}


_DEPTHWISE: dict = {}


def _padded(c, oh, ow, kh, kw, sh, sw, dh, dw, lanes):
    """As tv_vconv_geometry_of (and Conv2dCall.padded_size): the floats of the padded copy, and GUARD more
    that the kernels must leave alone."""
    hp = (oh - 1) * sh + (kh - 1) * dh + 1
    wq = -(-ow // lanes) * lanes + (kw - 1) * dw // sw
    return np.full(c * hp * sw * wq + GUARD, np.nan, np.float32)  # (NaN: a read of an unwritten float shows)


GUARD = 64

# 1, 2, and more threads than this machine has cores (workers that are not scheduled leave their chunks to
# the caller): the kernels split their tiles in chunks through tv_team_run (tv_team.h)
THREADS = (1, 2, max(5, (os.cpu_count() or 1) + 1))


def _guarded(shape):
    """An output array of ``shape`` (NaN) and the NaN floats just after it (a vector of the widest
    instance), for a test that the kernel wrote none of them."""
    size = int(np.prod(shape))
    buffer = np.full(size + 16, np.nan, np.float32)
    return buffer[:size].reshape(shape), buffer[size:]


def _same_bits(first, key, out, threads):
    """Every thread count gives the bits of the first one (each output is computed by one tile)."""
    if key not in first:
        first[key] = out.copy()
    else:
        np.testing.assert_array_equal(out, first[key], err_msg=f"{threads} threads, case {key}")


# (data shape, out channels, kernel, strides, dilation, padding (top, left, bottom, right))
DIRECT = [
    ((1, 3, 17, 19), 7, (3, 3), (2, 2), (1, 1), (1, 1, 1, 1)),
    ((2, 4, 20, 23), 9, (7, 7), (2, 2), (1, 1), (3, 3, 3, 3)),
    ((1, 4, 13, 13), 6, (3, 3), (1, 1), (2, 2), (2, 2, 2, 2)),
    ((1, 2, 11, 29), 15, (3, 2), (3, 1), (1, 3), (0, 2, 1, 0)),
    ((1, 5, 9, 9), 33, (1, 3), (1, 2), (1, 1), (0, 1, 0, 1)),
    ((1, 2, 6, 9), 1, (3, 3), (1, 1), (1, 1), (1, 1, 1, 1)),
    ((1, 3, 8, 40), 14, (3, 3), (1, 1), (1, 1), (1, 1, 1, 1)),
    ((2, 3, 21, 30), 50, (7, 7), (2, 2), (1, 1), (3, 3, 3, 3)),  # weights past half of L1d: column blocks first
    ((1, 3, 10, 18), 20, (3, 3), (1, 1), (1, 1), (1, 1, 1, 1)),   # 20 channels: blocks of 8 and a 4
]
@pytest.mark.parametrize("isa", ["avx2", "avx512", "portable", "avx512-ymm"])
def test_vector_convolutions_of_every_instance(isa, kernel_threads):
    """Each instance of the host description (16, 8 and 4 lanes; 2-row tiles of 6, 8 or 14 channels) on strides,
    dilation, asymmetric padding and every tail, with each tile epilogue, at 1, 2 and more threads than
    cores; every thread count gives the same bits (each output is one tile's, whichever thread ran it)."""
    _, lanes, direct = _library(isa)
    first: dict = {}
    for threads in THREADS:
        kernel_threads(threads)
        rng = np.random.default_rng(len(isa))
        for case, ((n, c, h, w), o, (kh, kw), (sh, sw), (dh, dw), pad) in enumerate(DIRECT):
            x = rng.standard_normal((n, c, h, w)).astype(np.float32)
            weights = rng.standard_normal((o, c, kh, kw)).astype(np.float32)
            bias = rng.standard_normal(o).astype(np.float32)
            attrs = {"padding": list(pad), "strides": [sh, sw], "dilation": [dh, dw]}
            want = _reference(x, weights, attrs)
            oh, ow = want.shape[2:]
            for has_bias, relu, pool in [(0, 0, 0), (1, 1, 0), (1, 0, 1)]:
                expected = (want + bias[:, None, None] if has_bias else want)
                expected = np.maximum(expected, 0) if relu else expected
                if pool:
                    expected = expected[:, :, :oh // 2 * 2, :ow // 2 * 2]
                    expected = expected.reshape(n, o, oh // 2, 2, ow // 2, 2).max(axis=(3, 5))
                out = np.full(expected.shape, np.nan, np.float32)
                dims = np.array([n, c, h, w, o, oh, ow, kh, kw, sh, sw, dh, dw, pad[0], pad[1], has_bias, relu, pool],
                                np.int64)
                padded = _padded(c, oh, ow, kh, kw, sh, sw, dh, dw, lanes)
                assert direct(dims.ctypes.data, x.ctypes.data, weights.ctypes.data, bias.ctypes.data,
                              padded.ctypes.data, out.ctypes.data) == 0
                _close(out, expected)
                _same_bits(first, (case, has_bias, relu, pool), out, threads)
                assert np.isnan(padded[-GUARD:]).all()


# (data shape, kernel, strides, dilation, padding (top, left, bottom, right)): one filter per channel
DEPTHWISE = [
    ((1, 16, 112, 112), (3, 3), (2, 2), (1, 1), (1, 1, 1, 1)),   # MobileNet's strided layers, even size
    ((2, 5, 13, 11), (3, 3), (2, 2), (1, 1), (1, 1, 1, 1)),      # odd sizes, batch 2, rows a tile's tail
    ((1, 7, 14, 14), (5, 5), (1, 1), (1, 1), (2, 2, 2, 2)),
    ((1, 3, 7, 7), (5, 5), (2, 2), (1, 1), (2, 2, 2, 2)),        # output narrower than a vector
    ((1, 4, 20, 37), (3, 3), (1, 1), (2, 3), (2, 3, 2, 3)),      # dilated
    ((1, 3, 17, 40), (3, 2), (3, 2), (1, 2), (0, 2, 1, 0)),      # stride 3 rows, asymmetric padding
    ((1, 2, 9, 70), (3, 3), (1, 2), (1, 1), (0, 0, 0, 0)),       # no padding, a wide row
    ((1, 2, 5, 3), (3, 3), (2, 2), (1, 1), (4, 5, 1, 0)),        # padding wider than the image
    # unit column stride, 3 wide (the unit tile's 3-tap instance where rows are wider than two vectors)
    ((1, 3, 28, 28), (3, 3), (1, 1), (1, 1), (1, 1, 1, 1)),      # MobileNet's 88-channel layer's planes
    ((2, 3, 11, 45), (1, 3), (1, 1), (1, 1), (0, 1, 0, 1)),      # one kernel row, an odd wide row
    ((1, 2, 19, 40), (3, 3), (1, 1), (2, 1), (2, 1, 2, 1)),      # dilated rows
    # unit strides, 3 x 3, rows wider than two vectors (the tile that loads each input row once)
    ((2, 3, 5, 21), (3, 3), (1, 1), (1, 1), (1, 1, 1, 1)),       # one short tile: its rows past the plane
    ((1, 2, 12, 33), (3, 3), (1, 1), (1, 1), (0, 2, 2, 0)),      # asymmetric padding, a tile and a half
]


@pytest.mark.parametrize("isa", ["avx2", "avx512", "portable"])
def test_depthwise_convolutions_of_every_instance(isa, kernel_threads):
    """The depthwise kernel of each instance (4, 8 and 16 lanes) against NumPy: strides 1-3 (square
    kernels at stride 2 run the split in registers, other strided shapes the phase-split copy), dilation,
    padding wider than the image, odd sizes, batch 2, outputs narrower than a vector, with and without the
    bias and relu, at 1, 2 and more threads than cores (the same bits at every count: each chunk pads its
    planes into its own buffer), nothing written past the output."""
    _library(isa)
    depthwise = _DEPTHWISE[isa]
    first: dict = {}
    for threads in THREADS:
        kernel_threads(threads)
        rng = np.random.default_rng(7 + len(isa))
        for case, ((n, c, h, w), (kh, kw), (sh, sw), (dh, dw), pad) in enumerate(DEPTHWISE):
            x = rng.standard_normal((n, c, h, w)).astype(np.float32)
            weights = rng.standard_normal((c, 1, kh, kw)).astype(np.float32)
            bias = rng.standard_normal(c).astype(np.float32)
            attrs = {"padding": list(pad), "strides": [sh, sw], "dilation": [dh, dw], "groups": c}
            want = _reference(x, weights, attrs)
            oh, ow = want.shape[2:]
            for has_bias, relu in [(0, 0), (1, 1), (1, 0)]:
                expected = want + bias[:, None, None] if has_bias else want
                expected = np.maximum(expected, 0) if relu else expected
                out, guard = _guarded(expected.shape)
                dims = np.array([n, c, h, w, oh, ow, kh, kw, sh, sw, dh, dw, pad[0], pad[1], has_bias, relu], np.int64)
                assert depthwise(dims.ctypes.data, x.ctypes.data, weights.ctypes.data, bias.ctypes.data,
                                 out.ctypes.data) == 0
                _close(out, expected)
                assert np.isnan(guard).all(), "the kernel wrote past its output"
                _same_bits(first, (case, has_bias, relu), out, threads)


def _strided_depthwise_cases(lanes):
    """(data shape, kernel, strides, dilation, padding) of column stride 2: square kernels 3, 5 and 7 at
    stride 2 (each a tile of its own, split in registers) and the rest (1, 4 and non-square kernels, row
    strides 1 and 3, dilation 2: the generic tile), padding 0, 1 and 2 (and wider than the kernel's
    reach), output widths of every tail of a vector and of two (1 .. 2 lanes + 1 columns; an odd image for
    every other), output rows that leave tails of the tiles' 8, 7 and 5 rows, batch 2."""
    cases = []
    for kw in (3, 5, 7):
        for pad in (0, 1, 2):
            for ow in range(1, 2 * lanes + 2):
                w = 2 * (ow - 1) + kw - 2 * pad + (ow % 2)  # (an odd image where ow is odd: the last column unread)
                if w < 1:
                    continue
                sh = (2, 2, 1, 3)[ow % 4]
                h = 2 + (ow * 5) % 17 + (kw - 2 * pad if kw > 2 * pad else 0)
                cases.append(((1 + ow % 2, 2, h, w), (kw - 2 * (ow % 4 == 1 and kw > 3), kw), (sh, 2), (1, 1),
                              (pad, pad, pad + ow % 2, pad)))
    cases += [((2, 3, 11, 23), (3, 1), (2, 2), (1, 1), (1, 0, 1, 0)), ((1, 3, 9, 30), (2, 4), (2, 2), (1, 1), (0, 1, 0, 2)),
              ((1, 3, 13, 37), (3, 3), (2, 2), (1, 2), (1, 2, 1, 2)), ((1, 2, 6, 9), (5, 7), (2, 2), (1, 1), (4, 5, 3, 6)),
              ((1, 2, 5, 6), (3, 3), (2, 2), (1, 1), (4, 4, 4, 4)), ((2, 3, 9, 19), (5, 5), (2, 2), (1, 1), (3, 3, 4, 3)),
              ((1, 2, 23, 40), (7, 7), (2, 2), (1, 1), (3, 4, 3, 2))]
    return cases


@pytest.mark.parametrize("isa", ["avx2", "avx512", "portable"])
def test_strided_depthwise_tiles_of_every_width(isa, kernel_threads):
    """The column stride 2 tiles of the depthwise kernel (one per square kernel 3, 5, 7 at stride 2: each
    input row split into its even and odd columns in registers, in a lane order put back at the store;
    input rows shared by 8, 7 or 5 output rows, zero rows above and below) and the generic tile beside
    them, against NumPy on every output-width tail of each instance (4, 8 and 16
    lanes), odd images, padding 0 to 2 (and wider than the kernel), row strides 1 to 3, batch 1 and 2, with
    the bias and relu or a hard-swish, at 1, 2 and 3 threads (the same bits at each count)."""
    library, params = _built(isa, _ACT_CALLERS)
    depthwise = _entry(library, "tv_test_depthwise_act", 7)
    first: dict = {}
    cases = _strided_depthwise_cases(params.lanes)
    for threads in (1, 2, 3):
        kernel_threads(threads)
        rng = np.random.default_rng(41 + params.lanes)
        for case, ((n, c, h, w), (kh, kw), (sh, sw), (dh, dw), pad) in enumerate(cases):
            x = rng.standard_normal((n, c, h, w)).astype(np.float32)
            weights = rng.standard_normal((c, 1, kh, kw)).astype(np.float32)
            bias = rng.standard_normal(c).astype(np.float32)
            attrs = {"padding": list(pad), "strides": [sh, sw], "dilation": [dh, dw], "groups": c}
            want = _reference(x, weights, attrs) + bias[:, None, None]
            oh, ow = want.shape[2:]
            activation = ACTIVATIONS[1] if case % 2 else (7, 1 / 6, 0.5, 0.0, 1.0)  # (relu; hard-swish)
            expected = _activation(want, *activation)
            out, guard = _guarded(want.shape)
            dims = np.array([n, c, h, w, oh, ow, kh, kw, sh, sw, dh, dw, pad[0], pad[1], 1, activation[0], 0], np.int64)
            floats = np.array(activation[1:], np.float32)
            assert depthwise(dims.ctypes.data, floats.ctypes.data, x.ctypes.data, weights.ctypes.data, bias.ctypes.data,
                             bias.ctypes.data, out.ctypes.data) == 0
            _close(out, expected)
            assert np.isnan(guard).all(), "the kernel wrote past its output"
            _same_bits(first, case, out, threads)


def _blocked_depthwise_cases(lanes):
    """(data shape, kernel, stride, padding) that the channel-blocked tiles take (tv_vdwb_takes: strides 1
    and 2, at stride 1 kernels 5 and 7 wide at any width and 3 wide on rows shorter than a vector, at stride 2
    rows of at most half a vector): output widths of every
    tail of the tiles' 8 pixels and of a vector (1 .. 2 lanes + 3), channels of a partial block (1,
    lanes - 1, lanes + 3) and whole blocks, kernel heights 1 to 7, padding 0 to 3 (asymmetric, wider than
    the kernel's reach), at stride 2 an image with a column and a row past what the taps read, planes of
    fewer pixels than a vector, batch 1 to 3."""
    cases = []
    for stride in (1, 2):
        for kw in (3, 5, 7):
            for ow in range(1, 2 * lanes + 4):
                if (kw == 3 and ow >= lanes) or (stride == 2 and 2 * ow > lanes):
                    continue
                kh = (kw, 1, 3, 7, 5)[ow % 5]
                pad = (ow % 3, (ow + kw) % 4, (ow + 1) % 3, (2 * ow + kw) % 4)  # (top, left, bottom, right)
                extra = (ow + kw) % stride  # (a last column no tap reads)
                w = stride * (ow - 1) + kw - pad[1] - pad[3] + extra
                h = 1 + (ow * 3) % 11 + max(0, kh - 1 - pad[0] - pad[2]) + (stride - 1) * (ow % 2)
                if w < 1:
                    continue
                c = (1, lanes - 1, lanes + 3, 2 * lanes)[ow % 4]
                cases.append(((1 + ow % 3, c, h, w), (kh, kw), stride, pad))
    return cases


@pytest.mark.parametrize("isa", ["avx2", "avx512", "portable"])
def test_channel_blocked_depthwise_tiles(isa, kernel_threads):
    """The depthwise layers (strides 1 and 2) the channel-blocked tiles take (a block of channels transposed
    into pixels of lanes floats, tiles of 8 output pixels, transposed back through the epilogue) against
    NumPy in float64, each instance (4, 8 and 16 lanes): every tail (output widths, channel blocks, planes
    smaller than a vector), with the bias, a residual and each activation (relu, hard-swish, ...), a NaN
    and an inf in the input kept where NumPy keeps them, at 1, 2 and 3 threads (the same bits at each),
    nothing written past the output."""
    library, params = _built(isa, _ACT_CALLERS)
    depthwise = _entry(library, "tv_test_depthwise_act", 7)
    first: dict = {}
    cases = _blocked_depthwise_cases(params.lanes)
    for threads in (1, 2, 3):
        kernel_threads(threads)
        rng = np.random.default_rng(5 + params.lanes)
        for case, ((n, c, h, w), (kh, kw), stride, pad) in enumerate(cases):
            x = rng.standard_normal((n, c, h, w)).astype(np.float32)
            x.reshape(-1)[(case * 7) % x.size] = np.nan
            x.reshape(-1)[(case * 11 + 3) % x.size] = np.inf if case % 2 else -np.inf
            weights = rng.standard_normal((c, 1, kh, kw)).astype(np.float32)
            bias = rng.standard_normal(c).astype(np.float32)
            attrs = {"padding": list(pad), "strides": [stride, stride], "groups": c}
            with np.errstate(invalid="ignore"):
                want = _reference(x, weights, attrs) + bias[:, None, None]
            oh, ow = want.shape[2:]
            activation = ACTIVATIONS[case % len(ACTIVATIONS)]
            has_residual = case % 3 == 0
            residual = rng.standard_normal(want.shape).astype(np.float32)
            with np.errstate(invalid="ignore"):
                expected = _activation(want + (residual if has_residual else 0), *activation)
            out, guard = _guarded(want.shape)
            dims = np.array([n, c, h, w, oh, ow, kh, kw, stride, stride, 1, 1, pad[0], pad[1], 1, activation[0],
                             has_residual],
                            np.int64)
            floats = np.array(activation[1:], np.float32)
            assert depthwise(dims.ctypes.data, floats.ctypes.data, x.ctypes.data, weights.ctypes.data, bias.ctypes.data,
                             residual.ctypes.data, out.ctypes.data) == 0
            for special in (np.isnan, np.isposinf, np.isneginf):
                np.testing.assert_array_equal(special(out), special(expected), err_msg=f"case {case}")
            finite = np.isfinite(expected)
            _close(out[finite], expected[finite])
            assert np.isnan(guard).all(), "the kernel wrote past its output"
            _same_bits(first, case, out, threads)


def test_channel_blocked_depthwise_layers_through_one_dynamic_executable():
    """Two unit-stride depthwise layers the channel-blocked tiles take (5x5 + bias + hard-swish, then 3x3 +
    bias + the block's input as a residual + relu; 21 channels, a partial block; a 9 x 9 image) compiled
    once for target "c" with a dynamic batch, called at batches 1, 2 and 5 against the reference
    interpreter: NaN and inf where it has them (relu keeps a NaN, as np.maximum does), the rest to float
    tolerance."""
    import tensorvm as tv
    from tensorvm.ir.module import IRModule

    rng = np.random.default_rng(11)
    c, size = 21, 9
    x = Var("x", _t(None, c, size, size))

    def layer(v, k):
        w = const(rng.standard_normal((c, 1, k, k)).astype(np.float32) / k)
        b = const(rng.standard_normal((c, 1, 1)).astype(np.float32))
        return op.add(op.nn.conv2d(v, w, padding=[k // 2] * 4, groups=c), b)

    y = layer(x, 5)
    y = op.multiply(y, op.divide(op.clip(op.add(y, const(np.float32(3.0))), a_min=0.0, a_max=6.0),
                                 const(np.float32(6.0))))
    body = op.nn.relu(op.add(layer(y, 3), y))
    mod = IRModule.from_expr(Function([x], body))
    exe = tv.vm.compile(mod, target="c")
    assert exe.c_library.source.count("tv_conv2d_depthwise_act_f32(") >= 3  # (its definition and both layers)
    vm = tv.vm.VirtualMachine(exe)
    reference = tv.create_executor("debug", mod).evaluate()
    for batch in (1, 2, 5):
        data = rng.standard_normal((batch, c, size, size)).astype(np.float32)
        data[0, 3, 4, 4] = np.nan
        data[-1, c - 1, 0, size - 1] = np.inf
        got = np.asarray(vm.invoke("main", data).numpy())
        with np.errstate(invalid="ignore"):
            want = np.asarray(reference(data).numpy())
        assert np.isnan(want).any()
        for special in (np.isnan, np.isposinf, np.isneginf):
            np.testing.assert_array_equal(special(got), special(want), err_msg=f"batch {batch}")
        finite = np.isfinite(want)
        _close(got[finite], want[finite])


# (data shape, out channels, kernel, strides, dilation, padding (top, left, bottom, right))
PACKED = [
    ((1, 64, 14, 14), 64, (3, 3), (1, 1), (1, 1), (1, 1, 1, 1)),   # ResNet's 3x3 layers, small
    ((2, 13, 9, 11), 21, (3, 3), (2, 2), (1, 1), (1, 1, 1, 1)),    # channels not whole blocks, batch 2, odd
    ((1, 9, 7, 7), 40, (5, 3), (1, 2), (2, 1), (2, 0, 3, 1)),      # dilated, asymmetric, rectangular kernel
    ((1, 17, 5, 6), 7, (3, 3), (3, 1), (1, 1), (0, 2, 0, 0)),      # fewer channels than a panel, stride 3
    ((1, 8, 3, 3), 33, (3, 3), (1, 1), (1, 1), (4, 4, 4, 4)),      # padding wider than the image
    ((1, 300, 4, 5), 19, (1, 1), (1, 1), (1, 1), (0, 0, 0, 0)),    # a 1x1 reduction over several L1 runs
    ((2, 131, 5, 4), 40, (3, 2), (1, 1), (1, 1), (1, 0, 1, 1)),    # 3x2 over several runs, the last partial
    ((1, 5, 2, 3), 6, (1, 1), (4, 3), (1, 1), (5, 4, 0, 0)),       # the padding before reaches past every tap
    ((3, 13, 1, 1), 40, (1, 1), (1, 1), (1, 1), (0, 0, 0, 0)),     # one pixel: a product of the batch's rows,
    ((2, 64, 1, 1), 7, (1, 1), (2, 2), (1, 1), (0, 0, 0, 0)),      # ... channels padded or whole blocks
]


@pytest.mark.parametrize("isa", ["avx2", "avx512", "portable"])
def test_packed_convolutions_of_every_instance(isa, kernel_threads):
    """The packed convolution of each instance (panels of 8, 16 and 32 channels, tiles of 6 and 14 pixels)
    against NumPy over the weight packed by ``pack_conv_weight`` for that instance's panel width: channel
    counts that are not whole blocks, out channels that are not whole panels, pixel counts that are not
    whole tiles, strides, dilation, asymmetric padding, batch 2, with and without bias and relu, at 1, 2
    and more threads than cores (the same bits at every count)."""
    from tensorvm.op.nn import pack_conv_weight

    _library(isa)
    function = _PACKED[isa]
    host.set_host(isa)
    nr = host.gemm_params().nr
    host.set_host(None)
    first: dict = {}
    for threads in THREADS:
        kernel_threads(threads)
        rng = np.random.default_rng(11 + len(isa))
        for case, ((n, c, h, w), o, (kh, kw), (sh, sw), (dh, dw), pad) in enumerate(PACKED):
            x = rng.standard_normal((n, c, h, w)).astype(np.float32)
            weights = rng.standard_normal((o, c, kh, kw)).astype(np.float32)
            packed = pack_conv_weight(weights, nr)
            bias = rng.standard_normal(o).astype(np.float32)
            attrs = {"padding": list(pad), "strides": [sh, sw], "dilation": [dh, dw]}
            want = _reference(x, weights, attrs)
            oh, ow = want.shape[2:]
            for has_bias, relu in [(0, 0), (1, 1)]:
                expected = want + bias[:, None, None] if has_bias else want
                expected = np.maximum(expected, 0) if relu else expected
                out = np.full(expected.shape, np.nan, np.float32)
                dims = np.array([n, c, h, w, o, oh, ow, kh, kw, sh, sw, dh, dw, pad[0], pad[1], has_bias, relu], np.int64)
                assert function(dims.ctypes.data, x.ctypes.data, packed.ctypes.data, bias.ctypes.data,
                                out.ctypes.data) == 0
                _close(out, expected)
                _same_bits(first, (case, has_bias, relu), out, threads)


def _pixel_counts(mr):
    """Output images (oh, ow) of every pixel count from 1 to 2 MR + 1 (one row, and several rows when the
    count has a factor: tiles then cross rows), so that the pixels dealt out over ceil(P / MR) tiles make
    every mix of whole tiles (MR), one pixel short (MR - 1) and shorter ones (fewer than MR - 1 pixels in
    all: the rows past them repeat a pixel)."""
    shapes = []
    for pixels in range(1, 2 * mr + 2):
        shapes.append((1, pixels))
        factor = next((f for f in range(2, pixels) if pixels % f == 0), None)
        if factor:
            shapes.append((pixels // factor, factor))
    return shapes


@pytest.mark.parametrize("isa", ["avx2", "avx512", "portable", "avx512-ymm", "avx2-only"])
def test_packed_tiles_of_every_pixel_count(isa, kernel_threads):
    """The packed convolution of each instance (tiles of 6, 8 and 14 pixels) over images of every pixel count
    up to two tiles and one (``_pixel_counts``), stride 1 and 2, with a reduction over several L1 runs
    (29 channels at 3x3: the last block partial) and out channels not whole panels, batch 2, through the
    entry with a residual and hard-swish (the tile's epilogue of a short tile) and the plain one with
    bias and relu, at 1 and 3 threads (the same bits), against NumPy."""
    from tensorvm.op.nn import pack_conv_weight

    _library(isa)
    plain = _PACKED[isa]
    host.set_host(_instance(isa))
    try:
        params = host.gemm_params()
        assert params.conv_mr == (8 if isa == "avx512-ymm" else params.mr)
        with_act = build.build_library([(prelude() + _ACT_CALLERS, _flags(isa))])._cdll.tv_test_packed_act
    finally:
        host.set_host(None)
    with_act.restype = ctypes.c_int32
    with_act.argtypes = [ctypes.c_void_p] * 7
    rng = np.random.default_rng(5 + len(isa))
    c, o, n = 29, params.nr + 3, 2
    weights = rng.standard_normal((o, c, 3, 3)).astype(np.float32)
    packed, bias = pack_conv_weight(weights, params.nr), rng.standard_normal(o).astype(np.float32)
    hard_swish = np.array([1 / 6, 0.5, 0.0, 1.0], np.float32)
    first: dict = {}
    for oh, ow in _pixel_counts(params.conv_mr):
        for stride in (1, 2):
            h, w = (oh - 1) * stride + 1, (ow - 1) * stride + 1
            x = rng.standard_normal((n, c, h, w)).astype(np.float32)
            want = _reference(x, weights, {"padding": [1, 1, 1, 1], "strides": [stride, stride]})
            assert want.shape[2:] == (oh, ow)
            residual = rng.standard_normal(want.shape).astype(np.float32)
            for threads in (1, 3):
                kernel_threads(threads)
                out = np.full(want.shape, np.nan, np.float32)
                dims = np.array([n, c, h, w, o, oh, ow, 3, 3, stride, stride, 1, 1, 1, 1, 1, 1], np.int64)
                assert plain(dims.ctypes.data, x.ctypes.data, packed.ctypes.data, bias.ctypes.data,
                             out.ctypes.data) == 0
                _close(out, np.maximum(want + bias[:, None, None], 0))
                _same_bits(first, (oh, ow, stride, "relu"), out, threads)
                dims[15:] = [1, 7]
                dims = np.append(dims, 1)
                out = np.full(want.shape, np.nan, np.float32)
                assert with_act(dims.ctypes.data, hard_swish.ctypes.data, x.ctypes.data, packed.ctypes.data,
                                bias.ctypes.data, residual.ctypes.data, out.ctypes.data) == 0
                _close(out, _activation(want + bias[:, None, None] + residual, 7, *hard_swish))
                _same_bits(first, (oh, ow, stride, "residual"), out, threads)


def _packed_chunk_tiles(params, c, kernel, stride):
    """As tv_conv2d_packed_act_f32 reckons them: the tiles whose run fills half of L2 (a chunk's share)."""
    window, cblocks = kernel[0] * kernel[1], -(-c // 8)
    least = -(-192 // (window * 8))  # (runs of at least TV_PCONV_RUN_STEPS steps)
    span = min(cblocks, max(least, params.l1_bytes // (window * 8 * params.nr * 4)))
    return params.group_bytes // (params.conv_mr * (span * 8 * stride[0] * stride[1] + params.nr) * 4)


def _packed_group(params, n, c, o, padded, kernel):
    """As tv_conv2d_packed_act_f32 reckons it: the images copied and convolved by one job (their blocked
    copies in half of L2, or as many as the weights outweigh)."""
    image = -(-c // 8) * 8 * padded[0] * padded[1]
    weights = -(-o // params.nr) * params.nr * -(-c // 8) * 8 * kernel[0] * kernel[1]
    return min(n, max(1, params.group_bytes // (4 * image), weights // image))


@pytest.mark.parametrize("isa", ["avx2", "avx512", "portable", "avx512-ymm", "avx2-only"])
def test_packed_batches_share_chunks_across_images(isa, kernel_threads):
    """One job runs the tiles of a group of images: small images (several to a chunk, a chunk's tiles
    ending inside an image), groups of two images and a last one of one, and images larger than a chunk's
    share of L2 (one chunk or more each, a group each), the reduction over several L1 runs (partial sums)
    or one, with the residual of each image and hard-swish and with bias and relu, against NumPy at 1, 2
    and more threads (the same bits at every count)."""
    from tensorvm.op.nn import pack_conv_weight

    host.set_host(_instance(isa))
    try:
        params = host.gemm_params()
        library = build.build_library([(prelude() + _CALLERS + _ACT_CALLERS, _flags(isa))])
    finally:
        host.set_host(None)
    plain, with_act = _entry(library, "tv_test_packed", 5), _entry(library, "tv_test_packed_act", 7)
    hard_swish = np.array([1 / 6, 0.5, 0.0, 1.0], np.float32)
    # (batch, channels, image, kernel, stride, padding): 5 images of 3x3 (many to a chunk), 3 of 4x7 over
    # several runs, 3 images larger than a chunk's tiles (a 1x1 stride 2 layer, one run), and 5 images
    # whose copies fill a third of half of L2 (groups of 2, 2 and 1)
    cases = [(5, 20, (3, 3), (3, 3), (1, 1), 1), (3, 131, (4, 7), (3, 3), (1, 1), 1)]
    side = 2 * int(np.sqrt(params.conv_mr * _packed_chunk_tiles(params, 40, (1, 1), (2, 2)))) + 6
    cases.append((3, 40, (side, side - 1), (1, 1), (2, 2), 0))
    side = int(np.sqrt(params.group_bytes / (2.4 * 4 * 8)))
    cases.append((5, 8, (side - 2, side - 3), (3, 3), (1, 1), 1))
    first: dict = {}
    for case, (n, c, (h, w), (kh, kw), stride, pad) in enumerate(cases):
        rng = np.random.default_rng(case + len(isa))
        o = params.nr + 3
        x = rng.standard_normal((n, c, h, w)).astype(np.float32)
        weights = rng.standard_normal((o, c, kh, kw)).astype(np.float32)
        packed, bias = pack_conv_weight(weights, params.nr), rng.standard_normal(o).astype(np.float32)
        want = _reference(x, weights, {"padding": [pad] * 4, "strides": list(stride)}) + bias[:, None, None]
        oh, ow = want.shape[2:]
        tiles = -(-oh * ow // params.conv_mr)
        group = _packed_group(params, n, c, o, (h + 2 * pad, w + 2 * pad), (kh, kw))
        if case == 2:  # (the premises: an image per chunk and per group; all in one share; groups of 2)
            assert tiles > _packed_chunk_tiles(params, c, (kh, kw), stride) and group == 1
        elif case == 3:
            assert group == 2
        else:
            assert n * tiles <= _packed_chunk_tiles(params, c, (kh, kw), stride) and group == n
        residual = rng.standard_normal(want.shape).astype(np.float32)
        dims = np.array([n, c, h, w, o, oh, ow, kh, kw, *stride, 1, 1, pad, pad, 1, 1], np.int64)
        for threads in THREADS:
            kernel_threads(threads)
            out = np.full(want.shape, np.nan, np.float32)
            assert plain(dims.ctypes.data, x.ctypes.data, packed.ctypes.data, bias.ctypes.data, out.ctypes.data) == 0
            _close(out, np.maximum(want, 0))
            _same_bits(first, (case, "relu"), out, threads)
            out = np.full(want.shape, np.nan, np.float32)
            act = np.append(dims[:16], [7, 1])
            assert with_act(act.ctypes.data, hard_swish.ctypes.data, x.ctypes.data, packed.ctypes.data,
                            bias.ctypes.data, residual.ctypes.data, out.ctypes.data) == 0
            _close(out, _activation(want + residual, 7, *hard_swish))
            _same_bits(first, (case, "residual"), out, threads)


def test_conv_weights_pack_and_unpack():
    """``pack_conv_weight`` / ``unpack_conv_weight`` are inverse, and ``nn.conv2d_packed``'s NumPy kernel is
    the convolution of the unpacked weight (the interpreter's oracle)."""
    from tensorvm.op.nn import CONV_BLOCK, pack_conv_weight, unpack_conv_weight

    rng = np.random.default_rng(3)
    weights = rng.standard_normal((21, 13, 3, 2)).astype(np.float32)
    packed = pack_conv_weight(weights, 16)
    assert packed.shape == (2, -(-13 // CONV_BLOCK) * CONV_BLOCK * 6, 16)
    np.testing.assert_array_equal(unpack_conv_weight(packed, 21, 13, (3, 2)), weights)
    x = rng.standard_normal((2, 13, 9, 8)).astype(np.float32)
    attrs = {"padding": [1, 0, 1, 1], "strides": [2, 1], "dilation": [1, 2]}
    op_def = get_op("nn.conv2d_packed")
    got = op_def.kernel(op_def.normalize_attrs(dict(attrs, channels=21, in_channels=13, kernel_size=[3, 2])), x, packed)
    np.testing.assert_allclose(got, _reference(x, weights, attrs), rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("variants", ["1", "0"])
def test_long_reduction_convolutions_run_packed_over_a_dynamic_batch(variants, monkeypatch):
    """A ResNet block (3x3 convolutions of 48 channels: a reduction longer than the direct kernel takes,
    the weights constants) compiled for the VM: PackWeights makes both ``nn.conv2d_packed``, whose kernel
    runs with bias and relu in its tiles, the second with the residual add before the relu there too
    (``tv_conv2d_packed_act_f32``, the batches being equal); the generated kernel over the
    packed layout (variants off) gives the same. Batch 0, 1, 3 through one executable, against the
    interpreter of the original program."""
    import tensorvm as tv
    from tensorvm.ir.module import IRModule

    monkeypatch.setenv("TENSORVM_KERNEL_VARIANTS", variants)
    c = 48
    assert c * 9 > direct_max_reduction()
    rng = np.random.default_rng(9)
    w1, w2 = (const(rng.standard_normal((c, c, 3, 3)).astype(np.float32) * 0.1) for _ in range(2))
    b1, b2 = (const(rng.standard_normal((c, 1, 1)).astype(np.float32)) for _ in range(2))
    x = Var("x", _t(None, c, 9, 10))
    y = op.nn.relu(op.add(op.nn.conv2d(x, w1, padding=[1, 1, 1, 1]), b1))
    z = op.nn.relu(op.add(op.add(op.nn.conv2d(y, w2, padding=[1, 1, 1, 1]), b2), x))
    mod = IRModule.from_expr(Function([x], z))
    exe = tv.vm.compile(mod, target="c")
    if variants == "1":
        assert exe.stats()["kernel_library"]["variants"].get("packed") == 2
        assert any("tv_conv2d_packed_f32(" in source for source in exe.c_library.sources.values())
        assert any("tv_conv2d_packed_act_f32(" in source for source in exe.c_library.sources.values())
    vm = tv.vm.VirtualMachine(exe)
    reference = tv.create_executor("debug", mod)
    for batch in (0, 1, 3):
        data = rng.standard_normal((batch, c, 9, 10)).astype(np.float32)
        got = vm.invoke("main", data)
        got = np.asarray(got.numpy() if hasattr(got, "numpy") else got)
        _close(got, np.asarray(reference.evaluate()(data).numpy()))


@pytest.mark.parametrize("channels, size, packed", [(400, 5, True), (400, 1, True), (96, 5, True), (96, 16, False),
                                                    (96, 1, True), (13, 1, True), (96, 2, False)])
def test_a_1x1_convolution_is_packed_when_its_reduction_is_long_and_its_image_fills_a_tile(channels, size, packed):
    """PackWeights' rule for 1x1 kernels: at least a tile of output pixels and a reduction longer than the
    direct kernel's bound, or a shorter one whose pixels would leave more than an eighth of the pointwise
    kernel's columns empty (25 pixels in tiles of 8, 16 or 32: 7 empty; 256 fill them), or 1x1 images
    (the batch's rows as one product; 13 channels padded to blocks), but not other images of fewer pixels
    than a tile; the result against the interpreter either way."""
    assert 96 <= direct_max_reduction() < 400 and size * size in (1, 4, 25, 256)
    rng = np.random.default_rng(channels + size)
    w = const(rng.standard_normal((24, channels, 1, 1)).astype(np.float32) * 0.05)
    b = const(rng.standard_normal((24, 1, 1)).astype(np.float32))
    x = Var("x", _t(None, channels, size, size))
    _check_packing(Function([x], op.add(op.nn.conv2d(x, w), b)), packed,
                   rng.standard_normal((2, channels, size, size)).astype(np.float32))


@pytest.mark.parametrize("channels, strides, padding, packed", [(64, (2, 2), 0, True), (16, (2, 1), 0, True),
                                                             (8, (1, 1), 1, True), (20, (2, 2), 0, False)])
def test_a_strided_or_padded_1x1_convolution_is_packed_when_its_channels_fill_blocks(channels, strides, padding,
                                                                                       packed):
    """PackWeights' rule for the 1x1 kernels the pointwise kernel does not take (strides, padding: ResNet's
    downsampling): packed when the input channels fill whole blocks, else the direct kernel; odd image
    sides (a last tile partial), the result against the interpreter either way."""
    rng = np.random.default_rng(channels + strides[1])
    w = const(rng.standard_normal((40, channels, 1, 1)).astype(np.float32) * 0.1)
    b = const(rng.standard_normal((40, 1, 1)).astype(np.float32))
    x = Var("x", _t(None, channels, 15, 13))
    conv = op.nn.conv2d(x, w, strides=strides, padding=(padding, padding))
    _check_packing(Function([x], op.nn.relu(op.add(conv, b))), packed,
                   rng.standard_normal((2, channels, 15, 13)).astype(np.float32))


def test_squeeze_and_excitation_products_run_packed_over_a_dynamic_batch():
    """A squeeze-and-excitation block's two 1x1 convolutions of the pooled 1x1 image (bias and relu, bias
    and hard-sigmoid, then a residual add in the second's epilogue) run as the packed kernel's product of
    the batch's rows: batch 0, 1 and 5 through one executable against the interpreter."""
    import tensorvm as tv
    from tensorvm.ir.module import IRModule

    rng = np.random.default_rng(21)
    w1 = const(rng.standard_normal((20, 36, 1, 1)).astype(np.float32) * 0.2)
    w2 = const(rng.standard_normal((36, 20, 1, 1)).astype(np.float32) * 0.2)
    b1, b2 = (const(rng.standard_normal((n, 1, 1)).astype(np.float32)) for n in (20, 36))
    x = Var("x", _t(None, 36, 1, 1))
    y = op.nn.relu(op.add(op.nn.conv2d(x, w1), b1))
    z = op.add(op.clip(op.add(op.multiply(op.add(op.nn.conv2d(y, w2), b2), const(np.float32(1 / 6))),
                              const(np.float32(0.5))), a_min=0.0, a_max=1.0), x)
    mod = IRModule.from_expr(Function([x], z))
    exe = tv.vm.compile(mod, target="c")
    assert exe.stats()["kernel_library"]["variants"].get("packed") == 2
    vm = tv.vm.VirtualMachine(exe)
    for batch in (0, 1, 5):
        data = rng.standard_normal((batch, 36, 1, 1)).astype(np.float32)
        got = vm.invoke("main", data)
        _close(np.asarray(got.numpy()), np.asarray(tv.create_executor("debug", mod).evaluate()(data).numpy()))


def _check_packing(fn, packed: bool, data) -> None:
    """``fn`` compiled for the VM on target "c": one packed convolution kernel or none as ``packed`` says,
    and its result for ``data`` the interpreter's."""
    import tensorvm as tv
    from tensorvm.ir.module import IRModule

    mod = IRModule.from_expr(fn)
    exe = tv.vm.compile(mod, target="c")
    assert (exe.stats()["kernel_library"]["variants"].get("packed") == 1) == packed
    got = tv.vm.VirtualMachine(exe).invoke("main", data)
    _close(np.asarray(got.numpy() if hasattr(got, "numpy") else got),
           np.asarray(tv.create_executor("debug", mod).evaluate()(data).numpy()))


@pytest.mark.parametrize("channels, width, pool, packed", [(32, 1, False, True), (16, 1, False, True),
                                                          (32, 1, True, False), (20, 1, False, False),
                                                          (32, 2, False, False)])
def test_a_3x3_convolution_with_narrow_rows_is_packed(channels, width, pool, packed):
    """PackWeights' rule for a k x k convolution the direct kernel could take: packed when its output rows
    are narrower than two of the direct kernel's vectors (``width`` vectors wide here, ``lanes`` each),
    unless its input channels do not fill whole blocks of 8 or a 2x2 max pool follows it (the direct
    kernel applies the pool in its tiles); against the interpreter either way. On the AVX2 instance with
    a 32 KB L1d, where the direct kernel takes reductions up to 341 (an AVX-512 host's 14-row tile takes
    146: these channels would be packed for their length there)."""
    host.set_host(host.isa_host("avx2", dataclasses.replace(host.detect_host(), l1d=32 * 1024)))
    try:
        lanes = host.gemm_params().lanes
        side = width * lanes
        assert 9 * channels <= direct_max_reduction()
        rng = np.random.default_rng(channels + side)
        w = const((rng.standard_normal((24, channels, 3, 3)) / np.sqrt(9 * channels)).astype(np.float32))
        b = const(rng.standard_normal(24).astype(np.float32))
        x = Var("x", _t(None, channels, side, side))
        y = op.nn.relu(op.nn.bias_add(op.nn.conv2d(x, w, padding=(1, 1)), b))
        _check_packing(Function([x], op.nn.max_pool2d(y, pool_size=(2, 2), strides=(2, 2)) if pool else y),
                       packed, rng.standard_normal((2, channels, side, side)).astype(np.float32))
    finally:
        host.set_host(None)


def _hardswish(v):
    return v * np.clip(v + 3, 0, 6) / 6


@pytest.mark.parametrize("isa", [None, "avx512"])
@pytest.mark.parametrize("case", ["strided-bias-relu", "strided-hardswish", "dilated-residual", "strided-long",
                                  "unit-long", "depthwise", "depthwise-unit", "grouped"])
def test_convolution_kernels_over_a_dynamic_batch(case, isa):
    """Convolution groups as FuseOps forms them from ONNX (an (O, 1, 1) bias), over a dynamic batch (0, 1,
    3): strided and dilated convolutions with a short reduction run the direct kernel, bias and relu,
    hard-swish, or a residual and relu in its tiles (no loop after the call; with the residual's batch
    dynamic, only when it equals the output's, generated code after the call otherwise); a long reduction
    runs im2col + the product; a depthwise one runs the depthwise kernel (bias and relu in its tiles as
    well), other grouped ones generated code."""
    c, size = 12, 15
    kernel, c, o, attrs = {
        "strided-bias-relu": ((3, 3), c, 10, dict(padding=[1, 1, 1, 1], strides=[2, 2])),
        "strided-hardswish": ((5, 5), 3, 16, dict(padding=[2, 2, 2, 2], strides=[2, 1])),
        "dilated-residual": ((3, 3), c, c, dict(padding=[2, 2, 2, 2], dilation=[2, 2])),
        "strided-long": ((3, 3), 48, 8, dict(padding=[1, 1, 1, 1], strides=[2, 2])),
        "unit-long": ((3, 3), 48, 8, dict(padding=[1, 1, 1, 1])),
        "depthwise": ((3, 3), c, c, dict(padding=[1, 1, 1, 1], strides=[2, 2], groups=c)),
        "depthwise-unit": ((5, 5), c, c, dict(padding=[2, 2, 2, 2], groups=c)),  # (the channel-blocked tiles)
        "grouped": ((3, 3), c, c, dict(padding=[1, 1, 1, 1], groups=3)),
    }[case]
    groups = attrs.get("groups", 1)
    x, w, b = Var("x", _t(None, c, size, size)), Var("w", _t(o, c // groups, *kernel)), Var("b", _t(o, 1, 1))
    y = op.add(op.nn.conv2d(x, w, **attrs), b)
    params = [x, w, b]
    if "hardswish" in case:
        body = op.multiply(y, op.divide(op.clip(op.add(y, const(np.float32(3.0))), a_min=0.0, a_max=6.0),
                                          const(np.float32(6.0))))
    elif "residual" in case:
        r = Var("r", _t(None, o, size, size))
        params.append(r)
        body = op.nn.relu(op.add(y, r))
    else:
        body = op.nn.relu(y)
    host.set_host(isa)
    try:
        _, kernels = build_fused_module({"k": Function(params, body, attrs={"Primitive": 1})})
    finally:
        host.set_host(None)
    k = kernels["k"]
    source = k.source.rsplit("\nint32_t ", 1)[-1]
    assert 48 * 9 > direct_max_reduction() >= 12 * 9  # (the rule, for the detected and the faked host)
    expected = {"strided-long": "blas", "unit-long": "blas", "depthwise": "depthwise", "depthwise-unit": "depthwise",
                "grouped": "generic"}.get(case, "direct")
    assert k.variants[0] == expected
    if expected in ("direct", "depthwise"):
        entry = "_act" if "hardswish" in case or "residual" in case else ""
        assert f"tv_conv2d_{expected}{entry}_f32(" in source
    if case.endswith("bias-relu") or case.startswith("depthwise") or "hardswish" in case:
        assert "for (" not in source.split("/* variant generic */")[0]

    def epilogue(want, arrays, batch, rng):
        if "hardswish" in case:
            return _hardswish(want)
        if "residual" in case:
            arrays.append(rng.standard_normal(want.shape).astype(np.float32))
            return np.maximum(want + arrays[-1], 0)
        return np.maximum(want, 0)

    _check_over_batches(k, len(case), (o, c, size, kernel, attrs), epilogue)


def _check_over_batches(k, seed, geometry, epilogue):
    """Runs the fused kernel ``k`` (data, weights, bias[, extra inputs], out) at batch 0, 1 and 3 against
    NumPy: the convolution plus bias, then ``epilogue(want, arrays, batch, rng)``, which may append
    inputs to ``arrays`` and returns the expected output."""
    o, c, size, kernel, attrs = geometry
    rng = np.random.default_rng(seed)
    weights = rng.standard_normal((o, c // attrs.get("groups", 1), *kernel)).astype(np.float32)
    bias = rng.standard_normal((o, 1, 1)).astype(np.float32)
    for batch in (0, 1, 3):
        data = rng.standard_normal((batch, c, size, size)).astype(np.float32)
        arrays = [data, weights, bias]
        want = epilogue(_reference(data, weights, attrs) + bias, arrays, batch, rng)
        out = np.full(want.shape, np.nan, np.float32)
        k(*arrays, out)
        _close(out, want)


def test_the_direct_kernels_reduction_bound_follows_the_host():
    """A quarter of L1d holds the weights of one block of tile channels (mr of them, from the host rule)."""
    base = host.HostDescription(l1d=32 * 1024)
    assert direct_max_reduction(host.isa_host("avx2", base)) == 8192 // (4 * 6)
    assert direct_max_reduction(host.isa_host("avx512", base)) == 8192 // (4 * 14)
    wide = host.isa_host("avx512", host.HostDescription(l1d=48 * 1024))
    assert direct_max_reduction(wide) == 12288 // (4 * 14)


@pytest.mark.parametrize("channels, packed", [(3, False), (4, False), (8, True)])
def test_few_input_channels_stay_direct_past_the_bound(channels, packed):
    """The packed kernel pads the input channels to blocks of 8: an RGB 7x7 stem (147, just past the bound
    of 146 with 64-byte vectors and 32 KB L1d) would do 8/3 of its work, so the direct kernel keeps it
    (``strategy.direct_takes``); 8 channels waste nothing and are packed. Against the interpreter."""
    import tensorvm as tv
    from tensorvm.codegen.strategy import direct_takes
    from tensorvm.ir.module import IRModule

    desc = host.isa_host("avx512", host.dataclasses.replace(host.detect_host(), l1d=32 * 1024))
    assert direct_max_reduction(desc) == 146
    assert direct_takes(channels, 7, 7, desc) != packed
    assert direct_takes(3, 3, 3, desc) and not direct_takes(64, 3, 3, desc)
    host.set_host(desc)
    try:
        rng = np.random.default_rng(channels)
        w = const(rng.standard_normal((16, channels, 7, 7)).astype(np.float32) * 0.05)
        x = Var("x", _t(None, channels, 20, 20))
        mod = IRModule.from_expr(Function([x], op.nn.relu(op.nn.conv2d(x, w, strides=(2, 2), padding=(3, 3)))))
        exe = tv.vm.compile(mod, target="c")
        assert (exe.stats()["kernel_library"]["variants"].get("packed") == 1) == packed
        data = rng.standard_normal((1, channels, 20, 20)).astype(np.float32)
        got = tv.vm.VirtualMachine(exe).invoke("main", data)
        _close(np.asarray(got.numpy() if hasattr(got, "numpy") else got),
               np.asarray(tv.create_executor("debug", mod).evaluate()(data).numpy()))
    finally:
        host.set_host(None)


def test_stats_name_the_convolution_tiles():
    import tensorvm as tv

    text = ("def @main(%x: Tensor[(1, 8, 16, 16), float32], %w: Tensor[(8, 8, 3, 3), float32]) "
            "{ nn.conv2d(%x, %w, padding=[1, 1, 1, 1]) }")
    exe = tv.vm.compile(tv.parse(text), target="c")
    conv = exe.stats()["product_kernels"]["convolution"]
    params = host.gemm_params()
    assert conv["isa"] == host.host().isa and conv["direct_tile"].startswith(f"{max(params.conv_mr, 4)}x2x{params.lanes}")
    assert conv["packed_tile"] == f"{params.conv_mr}x{params.nr}" and conv["depthwise_tile"].startswith(f"8x{params.lanes} (stride 2")
    assert exe.stats()["kernel_library"]["variants"] == {"direct": 1}  # the variant each kernel can run


def test_direct_convolution_over_dynamic_image_sizes():
    """Batch, height and width all dynamic (the padded copy's size is computed at run time): a strided,
    dilated convolution against NumPy at odd and even sizes, one smaller than the tile."""
    attrs = dict(padding=[2, 1, 1, 2], strides=[2, 3], dilation=[2, 1])
    x, w, b = Var("x", _t(None, 3, None, None)), Var("w", _t(10, 3, 3, 3)), Var("b", _t(10, 1, 1))
    _, kernels = build_fused_module({"k": Function([x, w, b], op.nn.relu(op.add(op.nn.conv2d(x, w, **attrs), b)),
                                                   attrs={"Primitive": 1})})
    k = kernels["k"]
    assert k.variants[0] == "direct"
    rng = np.random.default_rng(5)
    weights = rng.standard_normal((10, 3, 3, 3)).astype(np.float32)
    bias = rng.standard_normal((10, 1, 1)).astype(np.float32)
    for shape in [(1, 3, 5, 4), (2, 3, 23, 40), (3, 3, 16, 17)]:
        data = rng.standard_normal(shape).astype(np.float32)
        want = np.maximum(_reference(data, weights, attrs) + bias, 0)
        out = np.full(want.shape, np.nan, np.float32)
        k(data, weights, bias, out)
        _close(out, want)


def test_convolutions_run_in_team_chunks(kernel_threads):
    """At 2 threads each image of the direct and packed kernels, and each depthwise call, is one job of
    tv_team_run (tv_team.h) whose chunks (about 4 per thread) all run, on the caller or a worker, once;
    the direct kernel's chunks pad the rows of the image they read themselves (no job of its own)."""
    from tensorvm.op.nn import pack_conv_weight

    library, lanes, direct = _library("portable")
    if not build.find_toolchain().openmp:
        pytest.skip("the pool is built with the kernels' threads (OpenMP toolchains)")
    stats = library._cdll.tv_team_stats
    stats.argtypes, stats.restype = [ctypes.c_void_p], ctypes.c_int32

    def jobs_and_chunks():
        out = np.zeros(4, np.int64)
        assert stats(out.ctypes.data) == 0
        return out[0], out[1] + out[2]

    kernel_threads(2)
    rng = np.random.default_rng(3)
    # direct: 2 images of 16 x 32 x 32 outputs, far more tiles than 4 x 2 chunks
    x = rng.standard_normal((2, 8, 32, 32)).astype(np.float32)
    weights = rng.standard_normal((16, 8, 3, 3)).astype(np.float32)
    bias = np.zeros(16, np.float32)
    out = np.full((2, 16, 32, 32), np.nan, np.float32)
    dims = np.array([2, 8, 32, 32, 16, 32, 32, 3, 3, 1, 1, 1, 1, 1, 1, 0, 0, 0], np.int64)
    padded = _padded(8, 32, 32, 3, 3, 1, 1, 1, 1, lanes)
    jobs, chunks = jobs_and_chunks()
    assert direct(dims.ctypes.data, x.ctypes.data, weights.ctypes.data, bias.ctypes.data, padded.ctypes.data,
                  out.ctypes.data) == 0
    _close(out, _reference(x, weights, {"padding": [1, 1, 1, 1]}))
    assert jobs_and_chunks() == (jobs + 2, chunks + 2 * 8)  # (per image: one job, the tiles' 8 chunks)
    # depthwise: 16 planes, one job of 8 chunks
    x = rng.standard_normal((1, 16, 112, 112)).astype(np.float32)
    weights = rng.standard_normal((16, 1, 3, 3)).astype(np.float32)
    out = np.full((1, 16, 56, 56), np.nan, np.float32)
    dims = np.array([1, 16, 112, 112, 56, 56, 3, 3, 2, 2, 1, 1, 1, 1, 0, 0], np.int64)
    jobs, chunks = jobs_and_chunks()
    assert _DEPTHWISE["portable"](dims.ctypes.data, x.ctypes.data, weights.ctypes.data, bias.ctypes.data,
                                  out.ctypes.data) == 0
    _close(out, _reference(x, weights, {"padding": [1, 1, 1, 1], "strides": [2, 2], "groups": 16}))
    assert jobs_and_chunks() == (jobs + 1, chunks + 8)
    # packed: one job per image, several chunks each
    host.set_host("portable")
    nr = host.gemm_params().nr
    host.set_host(None)
    x = rng.standard_normal((2, 64, 14, 14)).astype(np.float32)
    weights = rng.standard_normal((64, 64, 3, 3)).astype(np.float32)
    out = np.full((2, 64, 14, 14), np.nan, np.float32)
    dims = np.array([2, 64, 14, 14, 64, 14, 14, 3, 3, 1, 1, 1, 1, 1, 1, 0, 0], np.int64)
    jobs, chunks = jobs_and_chunks()
    assert _PACKED["portable"](dims.ctypes.data, x.ctypes.data, pack_conv_weight(weights, nr).ctypes.data,
                               bias.ctypes.data, out.ctypes.data) == 0
    _close(out, _reference(x, weights, {"padding": [1, 1, 1, 1]}))
    now_jobs, now_chunks = jobs_and_chunks()
    assert now_jobs == jobs + 2 and now_chunks >= chunks + 2 * 2


_ACT_CALLERS = """
int32_t tv_test_direct_act(int64_t* d, float* f, const float* x, const float* weights, const float* bias,
                           const float* residual, float* padded, float* out) {
  return tv_conv2d_direct_act_f32(d[0], d[1], d[2], d[3], d[4], d[5], d[6], d[7], d[8], d[9], d[10], d[11], d[12],
                                  d[13], d[14], x, weights, bias, d[15], 0, 0, d[16], f[0], f[1], f[2], f[3], residual,
                                  d[17], padded, out);
}
int32_t tv_test_packed_act(int64_t* d, float* f, const float* x, const float* packed, const float* bias,
                           const float* residual, float* out) {
  return tv_conv2d_packed_act_f32(d[0], d[1], d[2], d[3], d[4], d[5], d[6], d[7], d[8], d[9], d[10], d[11], d[12],
                                  d[13], d[14], x, packed, bias, d[15], 0, d[16], f[0], f[1], f[2], f[3], residual,
                                  d[17], out);
}
int32_t tv_test_depthwise_act(int64_t* d, float* f, const float* x, const float* weights, const float* bias,
                              const float* residual, float* out) {
  return tv_conv2d_depthwise_act_f32(d[0], d[1], d[2], d[3], d[4], d[5], d[6], d[7], d[8], d[9], d[10], d[11], d[12],
                                     d[13], x, weights, bias, d[14], 0, d[15], f[0], f[1], f[2], f[3], residual, d[16],
                                     out);
}
"""

# (act bits: 1 clamp below, 2 above, 4 times v; alpha, beta, lo, hi): none, relu, relu6, hard-sigmoid,
# hard-swish, a clamp above only times v
ACTIVATIONS = [(0, 1.0, 0.0, 0.0, 0.0), (1, 1.0, 0.0, 0.0, 0.0), (3, 1.0, 0.0, 0.0, 6.0), (3, 0.2, 0.5, 0.0, 1.0),
               (7, 1 / 6, 0.5, 0.0, 1.0), (6, 0.5, -0.25, 0.0, 0.75)]


def _activation(v, act, alpha, beta, lo, hi):
    if not act:
        return v
    s = v * alpha + beta
    s = np.maximum(s, lo) if act & 1 else s
    s = np.minimum(s, hi) if act & 2 else s
    return v * s if act & 4 else s


@pytest.mark.parametrize("isa", ["avx2", "avx512", "portable"])
def test_convolution_tiles_apply_a_residual_and_an_activation(isa, kernel_threads):
    """The ``*_act_f32`` entries of the direct, packed and depthwise kernels of each instance (4, 8 and 16
    lanes) against NumPy: the bias, a residual of the output's shape and a clamped affine activation
    (relu, relu6, hard-sigmoid, hard-swish, a gated upper clamp) applied in the tiles, on the odd shapes
    of the tests above (every tail of a tile: rows, columns, channels, pixels), batch 2, at 1 and more
    threads than cores (the same bits at each count). A NaN in the input stays NaN, as NumPy keeps it."""
    from tensorvm.op.nn import pack_conv_weight

    library, params = _built(isa, _ACT_CALLERS)
    lanes, nr = params.lanes, params.nr
    functions = {name: _entry(library, f"tv_test_{name}_act", count)
                 for name, count in (("direct", 8), ("packed", 7), ("depthwise", 7))}
    first: dict = {}
    for threads in (1, THREADS[-1]):
        kernel_threads(threads)
        rng = np.random.default_rng(23 + len(isa))
        cases = [("direct", c) for c in DIRECT[:5]] + [("packed", c) for c in PACKED[1:4]] \
            + [("depthwise", (c[0], c[0][1], *c[1:])) for c in DEPTHWISE[1:6] + DEPTHWISE[-3:]]
        for case, (kind, ((n, c, h, w), o, (kh, kw), (sh, sw), (dh, dw), pad)) in enumerate(cases):
            n = 2
            x = rng.standard_normal((n, c, h, w)).astype(np.float32)
            x[0, 0, 0, : min(2, w)] = np.nan  # (a NaN reaches the outputs it feeds, whatever the activation)
            groups = c if kind == "depthwise" else 1
            weights = rng.standard_normal((o, c // groups, kh, kw)).astype(np.float32)
            bias = rng.standard_normal(o).astype(np.float32)
            attrs = {"padding": list(pad), "strides": [sh, sw], "dilation": [dh, dw], "groups": groups}
            want = _reference(x, weights, attrs)
            oh, ow = want.shape[2:]
            for index, activation in enumerate(ACTIVATIONS):
                has_residual = index % 2 == 0 or kind == "packed"
                residual = rng.standard_normal(want.shape).astype(np.float32)
                expected = want + bias[:, None, None] + (residual if has_residual else 0)
                expected = _activation(expected, *activation)
                out = np.full(want.shape, np.nan, np.float32)
                floats = np.array(activation[1:], np.float32)
                if kind == "depthwise":
                    dims = [n, c, h, w, oh, ow, kh, kw, sh, sw, dh, dw, pad[0], pad[1], 1, activation[0], has_residual]
                    arrays = [x, weights, bias, residual, out]
                else:
                    dims = [n, c, h, w, o, oh, ow, kh, kw, sh, sw, dh, dw, pad[0], pad[1], 1, activation[0], has_residual]
                    packed = pack_conv_weight(weights, nr) if kind == "packed" else weights
                    arrays = [x, packed, bias, residual] + ([_padded(c, oh, ow, kh, kw, sh, sw, dh, dw, lanes)]
                                                            if kind == "direct" else []) + [out]
                dims = np.array(dims, np.int64)
                assert functions[kind](dims.ctypes.data, floats.ctypes.data, *(a.ctypes.data for a in arrays)) == 0
                assert np.array_equal(np.isnan(out), np.isnan(expected)), (kind, case, index)
                finite = ~np.isnan(expected)
                _close(out[finite], expected[finite])
                _same_bits(first, (case, index), out, threads)


@pytest.mark.parametrize("case", ["direct-hardswish", "depthwise-hardswish", "depthwise-residual",
                                  "direct-residual-broadcast", "depthwise-residual-dynamic-broadcast"])
def test_mobilenet_groups_run_their_epilogue_in_the_tiles(case):
    """MobileNetV3's groups through the code generator: hard-swish after a strided first layer and after
    a depthwise layer, a depthwise layer's residual, each in the kernel's tiles (its ``_act`` entry, no
    loop after it); a residual whose batch is 1 where the output's is 3 broadcasts, and runs the
    generated epilogue instead (the tiles' path is taken only where the shapes are equal: a batch of 1 in
    the residual's type is refused when the kernel is built, a dynamic one checked per call). Against
    NumPy at batch 0, 1 and 3."""
    kind, epilogue = case.split("-", 1)
    c, size = 6, 13
    kernel, c, o, attrs = {
        "direct": ((3, 3), 3, 10, dict(padding=[1, 1, 1, 1], strides=[2, 2])),
        "depthwise": ((5, 5), c, c, dict(padding=[2, 2, 2, 2], strides=[2, 2], groups=c)),
    }[kind]
    oh = (size + 2 * attrs["padding"][0] - kernel[0]) // attrs["strides"][0] + 1
    groups = attrs.get("groups", 1)
    x, w, b = Var("x", _t(None, c, size, size)), Var("w", _t(o, c // groups, *kernel)), Var("b", _t(o, 1, 1))
    y = op.add(op.nn.conv2d(x, w, **attrs), b)
    params = [x, w, b]
    if epilogue == "hardswish":
        scalar = [const(np.array(v, np.float32)) for v in (1 / 6, 0.5, 0.0, 1.0)]
        body = op.multiply(y, op.minimum(op.maximum(op.add(op.multiply(y, scalar[0]), scalar[1]), scalar[2]),
                                         scalar[3]))
    else:
        r = Var("r", _t(1 if epilogue == "residual-broadcast" else None, o, oh, oh))
        params.append(r)
        body = op.add(y, r)
    _, kernels = build_fused_module({"k": Function(params, body, attrs={"Primitive": 1})})
    k = kernels["k"]
    source = k.source.rsplit("\nint32_t ", 1)[-1]
    assert k.variants[0] == kind
    fused = epilogue != "residual-broadcast"
    assert (f"tv_conv2d_{kind}_act_f32(" in source) == fused
    if epilogue == "hardswish":
        assert "for (" not in source.split("/* variant generic */")[0]

    def expected(want, arrays, batch, rng):
        if epilogue == "hardswish":
            return _hardswish(want)
        arrays.append(rng.standard_normal((1 if "broadcast" in epilogue else batch, o, oh, oh)).astype(np.float32))
        return want + arrays[-1]

    _check_over_batches(k, len(case), (o, c, size, kernel, attrs), expected)
