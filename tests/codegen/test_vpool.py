"""The float32 NCHW max pool of ``tv_vpool.h`` (``tv_max_pool2d_f32``, nn.max_pool2d's ``vector_pool``
strategy): windows 1 to 5, strides 1 to 3, dilation, padding (also wider than the window, where whole windows
are padding), ceil mode, batch > 1, widths odd, shorter than a vector and a vector long, every instance the
host description can ask for (4, 8, 16 lanes), at 1, 2 and more threads than cores. NaN propagates as
NumPy's maximum (a NaN in a window gives NaN) and -inf stays -inf. The oracle is the reference op's NumPy
kernel (``_pool2d``: a -inf padded copy, np.maximum over the taps) and the debug interpreter: results must be
equal, NaN positions included."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest
import test_vconv as vconv
from test_vconv import THREADS, _built, _t

import tensorvm as tv
from tensorvm import op
from tensorvm.codegen.fused import build_fused_module
from tensorvm.ir.expr import Function, Var
from tensorvm.op.registry import get_op

bridge_mode = vconv.bridge_mode  # (test_vconv's fixture; kernel_threads: tests/conftest.py)
POOL = get_op("nn.max_pool2d")

_CALLER = """
int32_t tv_test_pool(int64_t* d, const float* x, float* out) {
  return tv_max_pool2d_f32(d[0], d[1], d[2], d[3], d[4], d[5], d[6], d[7], d[8], d[9], d[10], d[11], d[12], d[13],
                           x, out);
}
"""

# (n, c, h, w), pool_size, strides, dilation, padding (top, left, bottom, right), ceil_mode
CASES = [
    ((1, 8, 112, 112), (3, 3), (2, 2), (1, 1), (1, 1, 1, 1), False),  # ResNet's
    ((3, 5, 17, 23), (3, 3), (2, 2), (1, 1), (1, 1, 1, 1), True),
    ((2, 3, 8, 8), (2, 2), (2, 2), (1, 1), (0, 0, 0, 0), False),
    ((2, 3, 9, 9), (2, 2), (2, 2), (1, 1), (0, 0, 0, 0), True),  # a last window past the input
    ((1, 4, 13, 37), (1, 1), (1, 1), (1, 1), (0, 0, 0, 0), False),
    ((1, 4, 13, 37), (1, 1), (2, 3), (1, 1), (0, 0, 0, 0), False),
    ((2, 2, 11, 19), (5, 5), (1, 1), (1, 1), (2, 2, 2, 2), False),
    ((2, 2, 11, 19), (5, 3), (3, 3), (1, 1), (2, 1, 0, 1), True),
    ((1, 3, 16, 33), (3, 5), (1, 2), (2, 2), (1, 2, 3, 0), False),  # dilation, asymmetric padding
    ((1, 2, 9, 10), (2, 3), (3, 2), (2, 1), (0, 1, 1, 0), True),
    ((2, 3, 5, 3), (3, 3), (1, 1), (1, 1), (1, 1, 1, 1), False),  # narrower than a vector
    ((1, 3, 4, 4), (2, 2), (1, 1), (1, 1), (3, 3, 3, 3), False),  # whole windows in the padding
    ((1, 2, 3, 2), (3, 3), (2, 2), (1, 1), (2, 2, 2, 2), True),
    ((1, 1, 1, 1), (1, 1), (1, 1), (1, 1), (0, 0, 0, 0), False),
    ((1, 1, 1, 1), (3, 3), (2, 2), (1, 1), (1, 1, 1, 1), False),
    ((2, 3, 10, 64), (3, 3), (2, 2), (1, 1), (1, 1, 1, 1), False),  # output 32 wide: whole vectors
    ((2, 3, 10, 66), (3, 3), (2, 2), (1, 1), (0, 1, 0, 1), False),
    ((1, 2, 7, 100), (4, 4), (3, 3), (1, 1), (1, 2, 1, 2), True),
    ((1, 2, 7, 41), (3, 2), (2, 3), (1, 2), (1, 0, 1, 1), False),
]


def _attrs(kernel, strides, dilation, padding, ceil_mode):
    return POOL.normalize_attrs({"pool_size": kernel, "strides": strides, "dilation": dilation, "padding": padding,
                                 "ceil_mode": ceil_mode})


def _input(rng, shape, specials=True):
    x = rng.standard_normal(shape).astype(np.float32)
    if specials:  # NaN, -inf and +inf at a few places, and a plane of -inf
        flat = x.reshape(-1)
        for index, value in zip(rng.choice(flat.size, size=min(flat.size, 6), replace=False),
                                [np.nan, -np.inf, np.inf, np.nan, -np.inf, -0.0]):
            flat[index] = value
        x[-1, -1] = -np.inf
    return x


def _same(got, want, key):
    assert got.shape == want.shape, key
    assert np.array_equal(np.isnan(got), np.isnan(want)), key
    assert np.array_equal(got, want, equal_nan=True), key


@pytest.mark.parametrize("isa", ["avx2", "avx512", "portable"])
def test_pool_of_every_instance(isa, kernel_threads):
    """Each case against the reference kernel at 1, 2 and more threads than cores; nothing past the output
    written."""
    library, _ = _built(isa, _CALLER)
    function = library._cdll.tv_test_pool
    function.restype = ctypes.c_int32
    function.argtypes = [ctypes.c_void_p] * 3
    for threads in THREADS:
        kernel_threads(threads)
        rng = np.random.default_rng(7)
        for case, (shape, kernel, strides, dilation, padding, ceil_mode) in enumerate(CASES):
            attrs = _attrs(kernel, strides, dilation, padding, ceil_mode)
            x = _input(rng, shape, specials=case % 2 == 0)
            want = POOL.kernel(attrs, x)
            n, c, oh, ow = want.shape
            out = np.full(want.size + 16, 7.0, np.float32)  # (16 floats past the output stay)
            dims = np.array([n, c, *shape[2:], oh, ow, *kernel, *strides, *dilation, *padding[:2]], np.int64)
            assert function(dims.ctypes.data, x.ctypes.data, out.ctypes.data) == 0
            assert (out[want.size:] == 7.0).all(), (isa, threads, case)
            _same(out[:want.size].reshape(want.shape), want, (isa, threads, case))


def test_nan_reaches_exactly_its_windows():
    """A NaN anywhere in a window (first tap, last tap, the middle) gives NaN, and only there; -inf
    everywhere gives -inf."""
    attrs = _attrs((3, 3), (2, 2), (1, 1), (1, 1, 1, 1), False)
    _, kernels = build_fused_module({"k": _pool_group(attrs, (None, 2, None, None))})
    k = kernels["k"]
    for position in [(0, 0), (0, 1), (1, 2), (2, 2), (4, 3), (6, 6), (3, 5)]:
        x = np.zeros((1, 2, 7, 7), np.float32)
        x[0, 1][position] = np.nan
        out = np.empty((1, 2, 4, 4), np.float32)
        k(x, out)
        _same(out, POOL.kernel(attrs, x), position)
        assert np.isnan(out).any() and not np.isnan(out[0, 0]).any()
    x = np.full((2, 2, 9, 16), -np.inf, np.float32)
    out = np.empty((2, 2, 5, 8), np.float32)
    k(x, out)
    assert (out == -np.inf).all()


def _pool_group(attrs, shape, relu=False):
    x = Var("x", _t(*shape))
    body = op.nn.max_pool2d(x, **{f: getattr(attrs, f) for f in ("pool_size", "strides", "dilation", "padding",
                                                                 "ceil_mode")})
    return Function([x], op.nn.relu(body) if relu else body, attrs={"Primitive": 1})


@pytest.mark.parametrize("relu", [False, True])
def test_pool_groups_call_the_kernel(relu, kernel_threads):
    """A pool's group (dynamic batch, height and width; with a relu after it, applied in place) runs
    ``tv_max_pool2d_f32`` and equals the reference at several shapes and 1 and 2 threads."""
    attrs = _attrs((3, 3), (2, 2), (1, 1), (1, 1, 1, 1), True)
    _, kernels = build_fused_module({"k": _pool_group(attrs, (None, 3, None, None), relu)})
    k = kernels["k"]
    assert k.variants[0] == "vector_pool"
    assert "tv_max_pool2d_f32(" in k.source
    rng = np.random.default_rng(3)
    for threads in (1, 2):
        kernel_threads(threads)
        for shape in [(1, 3, 112, 112), (2, 3, 5, 9), (3, 3, 1, 1), (0, 3, 4, 4), (1, 3, 2, 40)]:
            x = _input(rng, shape, specials=shape[0] > 0)
            want = POOL.kernel(attrs, x)
            if relu:
                want = np.where(np.isnan(want), want, np.maximum(want, 0))
            out = np.full(want.shape, 5.0, np.float32)
            k(x, out)
            _same(out, want, (threads, shape))


def test_other_dtypes_and_layouts_stay_generated():
    x = Var("x", tv.ir.types.TensorType((1, 2, 8, 8), "float64"))
    _, kernels = build_fused_module({"k": Function([x], op.nn.max_pool2d(x, pool_size=(2, 2)),
                                                    attrs={"Primitive": 1})})
    assert "vector_pool" not in kernels["k"].variants
    y = Var("y", _t(1, 8, 8, 2))
    _, kernels = build_fused_module({"k": Function([y], op.nn.max_pool2d(y, pool_size=(2, 2), layout="NHWC"),
                                                    attrs={"Primitive": 1})})
    assert "vector_pool" not in kernels["k"].variants


@pytest.mark.parametrize("threads", [1, 2])
def test_vm_with_dynamic_dims_matches_the_interpreter(threads, kernel_threads):
    """Through the VM (``Any`` batch, height and width) for several pools of one module, against the debug
    interpreter; ``exe.stats()`` names the vector_pool variant."""
    kernel_threads(threads)
    text = ("def @main(%x: Tensor[(?, 4, ?, ?), float32]) {\n"
            "  %0 = nn.max_pool2d(%x, pool_size=[3, 3], strides=[2, 2], padding=[1, 1]);\n"
            "  %1 = nn.max_pool2d(%x, pool_size=[2, 2], strides=[1, 1], dilation=[2, 2], ceil_mode=True);\n"
            "  %2 = nn.max_pool2d(%x, pool_size=[5, 5], strides=[3, 3], padding=[2, 2, 1, 1], ceil_mode=True);\n"
            "  (%0, %1, %2)\n}")
    mod = tv.parse(text)
    exe = tv.vm.compile(mod, target="c")
    assert exe.stats()["kernel_library"]["variants"] == {"vector_pool": 3}
    vm = tv.vm.VirtualMachine(exe)
    debug = tv.create_executor("debug", mod)
    rng = np.random.default_rng(threads)
    for shape in [(1, 4, 112, 112), (2, 4, 9, 5), (3, 4, 4, 4), (1, 4, 31, 17)]:
        x = _input(rng, shape)
        got = vm.invoke("main", x)
        want = debug.evaluate()(x)
        for g, w in zip(got, want):
            _same(g.numpy(), w.numpy(), shape)


def test_a_pool_fused_into_a_convolution_stays_in_its_tiles():
    """A 2x2 stride-2 pool after a direct convolution (and its bias and relu) is still the convolution's tile
    epilogue: the convolution anchors the group, not the pool."""
    x, w, b = Var("x", _t(None, 3, 16, 16)), Var("w", _t(8, 3, 3, 3)), Var("b", _t(8))
    body = op.nn.max_pool2d(op.nn.relu(op.nn.bias_add(op.nn.conv2d(x, w, padding=(1, 1)), b)), pool_size=(2, 2),
                            strides=(2, 2))
    _, kernels = build_fused_module({"k": Function([x, w, b], body, attrs={"Primitive": 1})})
    k = kernels["k"]
    assert k.variants[0] == "direct" and "tv_max_pool2d_f32(" not in k.source
    rng = np.random.default_rng(0)
    xs = rng.standard_normal((2, 3, 16, 16)).astype(np.float32)
    ws = rng.standard_normal((8, 3, 3, 3)).astype(np.float32)
    bs = rng.standard_normal(8).astype(np.float32)
    conv = get_op("nn.conv2d")
    y = conv.kernel(conv.normalize_attrs({"padding": (1, 1)}), xs.astype(np.float64), ws.astype(np.float64))
    want = POOL.kernel(_attrs((2, 2), (2, 2), (1, 1), (0, 0, 0, 0), False), np.maximum(y + bs[:, None, None], 0))
    out = np.empty((2, 8, 8, 8), np.float32)
    k(xs, ws, bs, out)
    np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-4)
