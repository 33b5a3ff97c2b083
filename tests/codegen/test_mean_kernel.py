"""``tv_mean_f32``: a float32 ``mean`` over trailing axes (a global average pool, squeeze-and-excitation's)
as one library function (the "rows" variant, ``strategy.MeanCall``), against the reference interpreter
(NumPy) through one dynamic executable. Each case checks from the kernel's source whether the library
function is what ran, so the generated reduction cannot stand in for it unnoticed."""

from __future__ import annotations

import numpy as np
import pytest

import tensorvm as tv
from tensorvm import aot


def _program(shape, axis, keepdims, dtype="float32", exclude=False):
    dims = ", ".join("?" if d is None else str(d) for d in shape)
    return tv.parse(f'''#[version = "0.0.5"]
def @main(%x: Tensor[({dims}), {dtype}]) {{ mean(%x, axis={axis}, keepdims={keepdims}, exclude={exclude}) }}''')


def _compile(mod):
    exe = tv.vm.compile(mod, target="c")
    source = "".join(exe.kernel_source(p.name) for p in exe.primitives if "shape_func" not in p.name)
    return tv.vm.VirtualMachine(exe), source


def _compare(got, want):
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_array_equal(np.isposinf(got), np.isposinf(want))
    np.testing.assert_array_equal(np.isneginf(got), np.isneginf(want))
    finite = np.isfinite(want)
    np.testing.assert_allclose(got[finite], want[finite], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("shape, axis, keepdims, batches", [
    ((None, 13, 7, 7), [2, 3], True, (1, 3, 8)),     # squeeze-and-excitation's pool: 49 floats a row
    ((None, 6, 14, 14), [-2, -1], False, (2, 1)),     # 196 a row, dims dropped
    ((None, 5, 3), [2], True, (4,)),                  # rows shorter than a vector
    ((None, 3, 11, 37), [1, 2, 3], False, (1, 2)),    # all but the batch: 1221 a row (every tail)
    ((None, 40, 64, 64), [2, 3], True, (1, 2)),       # from 65536 elements the rows run in parallel
    ((None, 4, 5), None, False, (3,)),                # everything: one row
])
def test_trailing_axes_float32_run_the_library_function(shape, axis, keepdims, batches, kernel_threads):
    mod = _program(shape, axis, keepdims)
    vm, source = _compile(mod)
    assert "tv_mean_f32(" in source
    reference = tv.create_executor("debug", mod).evaluate()
    rng = np.random.default_rng(len(shape))
    for threads in (1, 2):
        kernel_threads(threads)
        for batch in batches:  # (several batch sizes through the one dynamic executable)
            x = (rng.standard_normal((batch, *shape[1:])) * 4 + 1).astype(np.float32)
            flat = x.reshape(-1)
            flat[flat.size // 3] = np.nan
            flat[flat.size // 2 + 1] = np.inf
            flat[-1] = -np.inf
            got = vm.invoke("main", x).numpy()
            with np.errstate(invalid="ignore"):
                want = reference(x).numpy()
            assert got.shape == want.shape and got.dtype == want.dtype
            assert np.isnan(want).any()
            _compare(got, want)


def test_other_axes_and_dtypes_keep_the_generated_reduction():
    for shape, axis, keepdims, dtype, exclude in (((2, 3, 4), [1], True, "float32", False),
                                                  ((2, 3, 4), [0, 2], False, "float32", False),
                                                  ((2, 3, 4), [0], False, "float32", True),  # (1, 2): trailing
                                                  ((5, 6), [1], False, "float64", False)):
        mod = _program(shape, axis, keepdims, dtype, exclude)
        vm, source = _compile(mod)
        assert ("tv_mean_f32(" in source) == (exclude and dtype == "float32")
        x = np.random.default_rng(1).standard_normal(shape).astype(dtype)
        _compare(vm.invoke("main", x).numpy(), tv.create_executor("debug", mod).evaluate()(x).numpy())


def test_empty_rows_and_empty_axes():
    """No rows: an empty result; rows of nothing: NaN, as NumPy's mean of nothing."""
    vm, source = _compile(_program((None, None, 3), [1, 2], False))
    assert "tv_mean_f32(" in source
    assert vm.invoke("main", np.ones((0, 4, 3), np.float32)).numpy().shape == (0,)
    assert np.isnan(vm.invoke("main", np.ones((2, 0, 3), np.float32)).numpy()).all()


def test_aot_model_has_the_library_function():
    """The AOT flow's translation unit has the prelude, so the portable call is kept."""
    mod = _program((8, 24, 9, 9), [2, 3], True)
    module = aot.build(mod, name="gap")
    model_c = "".join(module.sources.values())
    assert model_c.count("tv_mean_f32(") >= 2  # its definition (the prelude) and a kernel's call
    x = np.random.default_rng(3).standard_normal((8, 24, 9, 9)).astype(np.float32)
    np.testing.assert_allclose(np.asarray(module.load()(x)), x.mean(axis=(2, 3), keepdims=True), rtol=1e-5, atol=1e-6)


def test_a_mean_inside_a_fused_group_calls_the_library_only_where_the_rest_is_elementwise_over_it():
    """A fused group of a mean and ops over its result of the same shape (a scale) calls the library
    function; a group where the rest broadcasts the mean back over its input (a layer norm's x - mean(x))
    keeps the generated loop nest. Against NumPy."""
    from tensorvm import op
    from tensorvm.codegen.fused import build_fused_module
    from tensorvm.ir.expr import Function, Var, const
    from tensorvm.ir.types import Any, TensorType

    x = Var("x", TensorType((Any(), 8, 5, 5), "float32"))
    pooled = op.mean(x, axis=[2, 3], keepdims=True)
    scaled = Function([x], op.multiply(pooled, const(np.float32(3.0))), attrs={"Primitive": 1})
    centred = Function([x], op.subtract(x, pooled), attrs={"Primitive": 1})
    _, kernels = build_fused_module({"scaled": scaled, "centred": centred})
    data = np.random.default_rng(4).standard_normal((3, 8, 5, 5)).astype(np.float32)
    for name, called, want in (("scaled", True, 3 * data.mean(axis=(2, 3), keepdims=True)),
                               ("centred", False, data - data.mean(axis=(2, 3), keepdims=True))):
        k = kernels[name]
        assert ("tv_mean_f32(" in k.source.rsplit("\nint32_t ", 1)[-1]) == called, name
        out = np.full(want.shape, np.nan, np.float32)
        k(data, out)
        np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-6)
