"""The prelude's inline float32 functions that loops vectorize (``tv_exp_nonpositive_f32``, softmax's
exp), called from C on NumPy arrays and checked against float64 math.

(An inline rational erf was tried for GELU: within 7 ulp, and once clamped to [-1, 1] and exact at
+-inf only 10% faster than libmvec's erff (0.53 vs 0.59 ns per element); not worth the accuracy.)"""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

from tensorvm.codegen import build
from tensorvm.codegen.c_emit import prelude

_CALLER = """
int32_t tv_test_exp(int64_t n, const float* x, float* y) {
  for (int64_t i = 0; i < n; ++i) y[i] = tv_exp_nonpositive_f32(x[i]);
  return 0;
}
"""


@pytest.fixture(scope="module")
def library():
    return build.build_library([(prelude() + _CALLER, ())])


def _apply(library, name, x):
    function = getattr(library._cdll, name)
    function.restype = ctypes.c_int32
    function.argtypes = [ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p]
    x = np.ascontiguousarray(x, np.float32)
    y = np.empty_like(x)
    function(x.size, x.ctypes.data, y.ctypes.data)
    return y


def _ulps(got, want):
    """|got - want| in units of the last place of want rounded to float32 (want: float64)."""
    spacing = np.spacing(np.abs(want).astype(np.float32)).astype(np.float64)
    return np.abs(got.astype(np.float64) - want) / spacing


def test_exp_of_nonpositive_values_is_within_one_and_a_bit_ulp(library):
    x = np.concatenate([np.linspace(-87.0, 0.0, 1_000_003, dtype=np.float32),
                        np.float32(-87.0) * np.random.default_rng(2).random(100_000, dtype=np.float32),
                        np.array([0.0, -0.0, -1e-30, -1e-45], np.float32)])
    assert float(_ulps(_apply(library, "tv_test_exp", x), np.exp(x.astype(np.float64))).max()) <= 1.05
    special = _apply(library, "tv_test_exp", np.array([-87.01, -100.0, -np.inf, np.nan], np.float32))
    assert special[0] == 0.0 and special[1] == 0.0 and special[2] == 0.0 and np.isnan(special[3])


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16"])
@pytest.mark.parametrize("exponent", [2.0, 3.0, 2.5])
def test_constant_square_and_cube_match_numpy(dtype, exponent):
    """x ** 2 and x ** 3 with a constant exponent are emitted as products (tv_pow2/3: libmvec's vector
    powf was 10x slower, GPT-2's tanh GELU); other exponents still call pow. Special values as NumPy."""
    from tensorvm import te
    from tensorvm.codegen.lower import lower
    from tensorvm.codegen.module import build_module

    n = te.var("n")
    x = te.placeholder((n,), dtype, "x")
    name = f"pow_{dtype}_{str(exponent).replace('.', '_')}"
    module = build_module([lower(name, [x], [te.compute((n,), lambda i: te.power(x[i], exponent), "y")])])
    helper = f"tv_pow{int(exponent)}_" if exponent in (2.0, 3.0) else "pow"
    assert helper in module.kernel_source(name)
    rng = np.random.default_rng(3)
    finite = {"float16": 30.0, "float32": 1e12, "float64": 1e100}[dtype]
    values = np.concatenate([rng.standard_normal(1001) * 3, rng.uniform(-finite, finite, 200),
                             [0.0, -0.0, np.inf, -np.inf, np.nan, 1e-30, -1e-30]]).astype(dtype)
    if exponent == 2.5:
        values = np.abs(values)
    out = np.empty_like(values)
    module[name](values, out)
    with np.errstate(all="ignore"):
        want = np.power(values.astype(np.float64), exponent).astype(dtype)
    np.testing.assert_array_equal(np.isnan(out), np.isnan(want))
    np.testing.assert_array_equal(np.signbit(out), np.signbit(want))
    ok = ~np.isnan(want)
    np.testing.assert_allclose(out[ok].astype(np.float64), want[ok].astype(np.float64),
                               rtol=4 * np.finfo(dtype).eps, atol=0)
