"""The C dispatch's calibration of a product between the on-the-fly register tiles and the host BLAS
(``tv_gemm.h``: ``tv_gemm_choice``; ``calibrate.attach_library`` / ``collect_library``): the first product
of a shape class times both on the real operands and keeps the faster, ``exe.stats()`` says which variant
and why, the choice is cached per host, and a pin wins. No timing is asserted; every result is checked
against NumPy whichever variant ran."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

import tensorvm as tv
from tensorvm.codegen import blas, calibrate
from tensorvm.codegen.build import have_compiler
from tensorvm.errors import AttrError, FormatError

pytestmark = pytest.mark.skipif(not have_compiler() or blas.mode() != "c",
                                reason="the C dispatch's choice needs a C compiler and the host BLAS from C")

PROGRAM = """
def @main(%a: Tensor[(?, 48, 64), float32], %b: Tensor[(?, 40, 64), float32]) {
  nn.batch_matmul(%a, %b, transpose_b=True)
}
"""


@pytest.fixture
def fresh(tmp_path, monkeypatch):
    monkeypatch.setenv("TENSORVM_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("TENSORVM_VARIANT", raising=False)
    calibrate.reset()
    yield tmp_path
    calibrate.reset()


def _run(exe, batch=3, seed=0):
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((batch, 48, 64)).astype(np.float32)
    b = rng.standard_normal((batch, 40, 64)).astype(np.float32)
    got = tv.vm.VirtualMachine(exe).run(a, b).numpy()
    np.testing.assert_allclose(got, a.astype(np.float64) @ b.transpose(0, 2, 1).astype(np.float64),
                               rtol=1e-4, atol=1e-4)


def _gemm_choices(exe):
    return [c for c in exe.stats()["product_kernels"]["calibrated"] if c["op"] == calibrate.GEMM_OP]


def test_first_product_of_a_class_is_calibrated_then_cached(fresh):
    exe = tv.vm.compile(tv.parse(PROGRAM), target="c")
    _run(exe)  # the calibrating call computes the right result too
    _run(exe, seed=1)
    found = _gemm_choices(exe)
    cls = calibrate.shape_class(48, 40, 64)  # (the C side classifies by the same rule)
    assert [(c["shape_class"], c["why"]) for c in found] == [(cls, "calibrated")]
    assert found[0]["variant"] in calibrate.GEMM_VARIANTS
    # a new process on this host: the cached choice is handed to the library, nothing calibrates
    calibrate.reset()
    calibrate.attach_library(ctypes.CDLL(exe.c_library.library_path))
    _run(exe, seed=2)
    again = _gemm_choices(exe)
    assert [(c["shape_class"], c["variant"], c["why"]) for c in again] == [(cls, found[0]["variant"], "cached")]


@pytest.mark.parametrize("variant", calibrate.GEMM_VARIANTS)
def test_a_pin_wins_for_every_class(fresh, variant):
    calibrate.pin(calibrate.GEMM_OP, variant)
    exe = tv.vm.compile(tv.parse(PROGRAM), target="c")
    _run(exe)
    found = _gemm_choices(exe)
    assert [(c["shape_class"], c["variant"], c["why"]) for c in found] == [("*", variant, "pinned")]


def test_a_pin_naming_no_product_variant_is_an_error(fresh, monkeypatch):
    monkeypatch.setenv("TENSORVM_VARIANT", "gemm=fast")
    with pytest.raises((AttrError, FormatError), match="pinned for gemm is not one of"):
        tv.vm.compile(tv.parse(PROGRAM), target="c")
