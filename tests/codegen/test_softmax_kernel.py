"""``tv_softmax_f32``: float32 softmax / log_softmax over the last axis as one library function (the
"rows" variant, ``strategy.SoftmaxCall``). Its inline exp is tested in ``test_inline_math.py``.

The oracle is NumPy in float64. Each case checks from the kernel's source whether the library function
is what ran, so the generated kernel cannot stand in for it unnoticed.
"""

from __future__ import annotations

import numpy as np
import pytest

import tensorvm as tv
from tensorvm import aot


def _reference(x, axis, log):
    x = x.astype(np.float64)
    peak = x.max(axis=axis, keepdims=True)
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        shifted = x - peak
        total = np.exp(shifted).sum(axis=axis, keepdims=True)
        return shifted - np.log(total) if log else np.exp(shifted) / total


def _program(op, shape, axis, dtype="float32"):
    dims = ", ".join("?" if d is None else str(d) for d in shape)
    return tv.parse(f'''#[version = "0.0.5"]
def @main(%x: Tensor[({dims}), {dtype}]) {{ {op}(%x, axis={axis}) }}''')


def _compile(mod):
    exe = tv.vm.compile(mod, target="c")
    source = "".join(exe.kernel_source(p.name) for p in exe.primitives if "shape_func" not in p.name)
    return tv.vm.VirtualMachine(exe), source


def _check(got, x, axis, log):
    want = _reference(x, axis, log)
    # float32 rounding of x - max, amplified by exp: a few 1e-6 relative; log_softmax near 0 is absolute
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6 if log else 1e-37)


@pytest.mark.parametrize("op", ["nn.softmax", "nn.log_softmax"])
@pytest.mark.parametrize("shape, axis, concrete", [
    ((1, 4, None, 128), -1, (1, 4, 37, 128)),   # attention scores with a dynamic sequence
    ((2, None), -1, (2, 1000)),                 # dynamic last axis
    ((3, 5), 1, (3, 5)),
    ((7,), 0, (7,)),                            # a single row
    ((6, 1), -1, (6, 1)),                       # rows of one element: all ones (zeros for log)
    ((None, 64), 1, (1100, 64)),                # from 65536 elements the rows run in parallel
])
def test_last_axis_float32_runs_the_library_function(op, shape, axis, concrete, kernel_threads):
    vm, source = _compile(_program(op, shape, axis))
    assert "tv_softmax_f32(" in source
    x = (np.random.default_rng(0).standard_normal(concrete) * 8).astype(np.float32)
    for threads in (1, 2):
        kernel_threads(threads)
        _check(vm.invoke("main", x).numpy(), x, axis, "log" in op)


@pytest.mark.parametrize("op", ["nn.softmax", "nn.log_softmax"])
def test_other_axes_and_float64_keep_the_generated_kernel(op):
    for shape, axis, dtype in (((2, 3, 4), 1, "float32"), ((5, 6), 0, "float32"), ((5, 6), -1, "float64")):
        vm, source = _compile(_program(op, shape, axis, dtype))
        assert "tv_softmax_f32(" not in source
        x = np.random.default_rng(1).standard_normal(shape).astype(dtype)
        _check(vm.invoke("main", x).numpy(), x, axis, "log" in op)


def test_masked_and_special_values():
    """-inf (a masked score) gives exactly 0 (log: -inf); a NaN makes its row NaN; +inf with finite
    values is NaN (inf - inf), as in NumPy; scores far below the maximum underflow to 0."""
    rows = np.array([
        [0.5, -np.inf, 2.0, -np.inf],
        [1.0, np.nan, 0.0, 3.0],
        [np.inf, 1.0, 2.0, 0.0],
        [-np.inf, -np.inf, -np.inf, -np.inf],
        [0.0, -90.0, -200.0, -86.9],
        [1e30, -1e30, 1e30, 0.0],
    ], np.float32)
    for op in ("nn.softmax", "nn.log_softmax"):
        vm, source = _compile(_program(op, (None, 4), -1))
        assert "tv_softmax_f32(" in source
        got = vm.invoke("main", rows).numpy()
        want = _reference(rows, -1, "log" in op)
        np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
        finite = ~np.isnan(want)
        np.testing.assert_allclose(got[finite], want[finite].astype(np.float32), rtol=1e-5, atol=1e-37)
        if op == "nn.softmax":
            assert got[0, 1] == 0.0 and got[0, 3] == 0.0 and got[4, 1] == 0.0 and got[4, 2] == 0.0


def test_empty_rows_and_empty_axis():
    vm, _ = _compile(_program("nn.softmax", (None, None), -1))
    for shape in ((0, 5), (3, 0)):
        assert vm.invoke("main", np.ones(shape, np.float32)).numpy().shape == shape


def test_aot_model_has_the_library_function_without_openmp():
    """The AOT flow's translation unit has the prelude (pragmas optional), so the portable call is kept."""
    mod = _program("nn.softmax", (8, 300), -1)
    module = aot.build(mod, name="sm")
    model_c = "".join(module.sources.values())
    assert model_c.count("tv_softmax_f32(") >= 2  # its definition (the prelude) and a kernel's call
    x = np.random.default_rng(3).standard_normal((8, 300)).astype(np.float32) * 5
    _check(np.asarray(module.load()(x)), x, -1, False)
