"""Long float32 sums on target c stay accurate: the generated reductions and the mean kernel add at most
``lower.SUM_BLOCK`` floats in float lanes before a block's total joins a float64 total. Oracle: NumPy in
float64 (the exact answers of these inputs to float32 precision)."""

from __future__ import annotations

import numpy as np
import pytest

import tensorvm as tv
from tensorvm.codegen.build import have_compiler

pytestmark = pytest.mark.skipif(not have_compiler(), reason="no C compiler")


def _offset_values(n: int, seed: int) -> np.ndarray:
    """1e4 plus noise: a float32 sum of them in 8 or 16 lanes drifts by n / lanes roundings of 1e4 x lanes."""
    return (1e4 + np.random.default_rng(seed).standard_normal(n)).astype(np.float32)


def test_sum_mean_variance_of_four_million_floats():
    mod = tv.parse("def @main(%x: Tensor[(?), float32]) "
                   "{ (sum(%x), mean(%x), variance(%x), std(%x, unbiased=True)) }")
    vm = tv.vm.VirtualMachine(tv.vm.compile(mod, target="c"))
    for n in (4_000_000, 4_097, 1_000):
        x = _offset_values(n, n)
        exact = x.astype(np.float64)
        got = [float(v.numpy()) for v in vm["main"](x)]
        want = [exact.sum(), exact.mean(), exact.var(), exact.std(ddof=1)]
        np.testing.assert_allclose(got, want, rtol=2e-6, err_msg=f"n={n}")


def test_rows_and_the_mean_kernel_over_trailing_axes():
    """axis=[1] of two long rows (the generated reduction), and the mean over trailing axes (the
    ``tv_mean_f32`` kernel a global average pool takes)."""
    mod = tv.parse("def @main(%x: Tensor[(2, ?), float32], %y: Tensor[(1, 2, ?, ?), float32]) "
                   "{ (sum(%x, axis=[1]), variance(%x, axis=[1]), mean(%y, axis=[2, 3])) }")
    vm = tv.vm.VirtualMachine(tv.vm.compile(mod, target="c"))
    x = _offset_values(2 * 1_500_000, 1).reshape(2, -1)
    y = _offset_values(2 * 2000 * 2000, 2).reshape(1, 2, 2000, 2000)
    sums, variances, means = (v.numpy() for v in vm["main"](x, y))
    np.testing.assert_allclose(sums, x.astype(np.float64).sum(1), rtol=2e-6)
    np.testing.assert_allclose(variances, x.astype(np.float64).var(1), rtol=2e-5)
    np.testing.assert_allclose(means, y.astype(np.float64).mean((2, 3)), rtol=2e-6)
