"""A convolution whose output rows are narrower than a vector (``_conv2d_strategy``, ``op/nn.py``): the
generated kernel vectorizes along the output row, so a 1 x 1 image's 1x1 convolution (MobileNetV3's
squeeze-and-excitation products) would be one scalar chain of FMAs per output. Its work counts
ceil(lanes / output width) times against ``gemm_min_work``, so such layers call the library (the
pointwise kernel) from a few thousand multiply-adds. Oracles: the reference interpreter and NumPy
(float64); NaN propagated as NumPy does."""

from __future__ import annotations

import numpy as np
import pytest

import tensorvm as tv
from tensorvm.codegen.build import have_compiler
from tensorvm.codegen.strategy import direct_max_reduction, gemm_min_work, rules

pytestmark = pytest.mark.skipif(not have_compiler(), reason="needs a C compiler")


def _layer(c: int, o: int, side: int, act: str) -> str:
    body = "nn.bias_add(nn.conv2d(%x, %w), %b)"
    body = {"relu": f"nn.relu({body})", "none": body}[act]
    return (f"def @main(%x: Tensor[(1, {c}, {side}, {side}), float32], %w: Tensor[({o}, {c}, 1, 1), float32], "
            f"%b: Tensor[({o}), float32]) {{ {body} }}")


def _variants(exe) -> dict:
    return exe.stats()["kernel_library"]["variants"]


@pytest.mark.parametrize("c, o, act", [(240, 64, "relu"), (64, 240, "none"), (120, 32, "relu")])
def test_one_pixel_products_below_the_threshold_call_the_library(threads, c, o, act):
    """MobileNetV3's squeeze-and-excitation sizes under ``gemm_min_work`` (15 K multiply-adds and fewer)
    call a library kernel, equal to the interpreter and NumPy at 1, 2 and 3 threads (the same bits:
    they are below every split threshold), a NaN in the input giving NaN outputs where NumPy has them."""
    lanes = rules().vector_width
    assert c * o < gemm_min_work() <= c * o * lanes  # (the case the rule is about)
    mod = tv.parse(_layer(c, o, 1, act))
    rng = np.random.default_rng(c + o)
    x = rng.standard_normal((1, c, 1, 1)).astype(np.float32)
    x[0, 3, 0, 0] = np.nan
    w = (rng.standard_normal((o, c, 1, 1)) / np.sqrt(c)).astype(np.float32)
    b = rng.standard_normal(o).astype(np.float32)
    exe = tv.vm.compile(mod, target="c")
    # the pointwise kernel up to its L1 bound, the library product past it (240 channels on an AVX-512 host
    # with a 32 KB L1d and the 14-row tile)
    assert _variants(exe) == {"pointwise" if c <= direct_max_reduction() else "blas": 1}
    with np.errstate(invalid="ignore"):
        want = np.einsum("oc,c->o", w[:, :, 0, 0].astype(np.float64), x[0, :, 0, 0].astype(np.float64)) + b
        if act == "relu":
            want = np.where(np.isnan(want), want, np.maximum(want, 0))
        reference = tv.create_executor("debug", mod).evaluate()(x, w, b).numpy()
    assert np.isnan(want).all() and np.isnan(reference).all()
    x[0, 3, 0, 0] = 1.5  # (and finite: to float tolerance)
    with np.errstate(invalid="ignore"):
        want = np.einsum("oc,c->o", w[:, :, 0, 0].astype(np.float64), x[0, :, 0, 0].astype(np.float64)) + b
        want = np.maximum(want, 0) if act == "relu" else want
        reference = tv.create_executor("debug", mod).evaluate()(x, w, b).numpy()
    vm = tv.vm.VirtualMachine(exe)
    first = None
    for count in (1, 2, 3):
        threads(count)
        x[0, 3, 0, 0] = np.nan
        got_nan = vm.run(x, w, b).numpy()
        assert np.isnan(got_nan).all(), f"{count} threads: NaN not propagated"
        x[0, 3, 0, 0] = 1.5
        got = vm.run(x, w, b).numpy()
        np.testing.assert_allclose(got.reshape(-1), want, rtol=1e-5, atol=1e-5, err_msg=f"{count} threads")
        np.testing.assert_allclose(got, reference, rtol=1e-5, atol=1e-5)
        if first is None:
            first = got
        assert np.array_equal(got, first), f"{count} threads: other bits than at 1 thread"


def test_the_rule_counts_the_rows_lanes():
    """A product too small even counted per lane stays generated code; a wide image of the same work stays
    generated code too (its rows fill the vectors), and both still match the interpreter."""
    lanes = rules().vector_width
    tiny_c, tiny_o = 4, 4  # 16 multiply-adds x lanes: far under the threshold
    assert tiny_c * tiny_o * lanes < gemm_min_work()
    side = 8  # rows of a whole vector at 8 lanes (at 4 or 16 lanes: counted ceil(lanes / 8) times)
    c = max(1, gemm_min_work() // (side * side * 16) // 2)  # half the threshold with 16 outputs
    cases = [(tiny_c, tiny_o, 1, {"generic": 1}), (c, 16, side, None)]
    for c_, o_, side_, variants in cases:
        mod = tv.parse(_layer(c_, o_, side_, "relu"))
        exe = tv.vm.compile(mod, target="c")
        work = c_ * o_ * side_ * side_ * -(-lanes // side_)
        if variants is not None:
            assert _variants(exe) in ({}, variants)
        else:
            assert ("pointwise" in _variants(exe)) == (work >= gemm_min_work())
        rng = np.random.default_rng(c_)
        x = rng.standard_normal((1, c_, side_, side_)).astype(np.float32)
        w = rng.standard_normal((o_, c_, 1, 1)).astype(np.float32)
        b = rng.standard_normal(o_).astype(np.float32)
        got = tv.vm.VirtualMachine(exe).run(x, w, b).numpy()
        want = tv.create_executor("debug", mod).evaluate()(x, w, b).numpy()
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
