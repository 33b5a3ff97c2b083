"""The kernel memo (``tensorvm.codegen.signature``): compiling the same fused group again reuses its plan
and C, and every ingredient of the key (an attr, a dtype, a static dim, a constant, the host description,
a variant pin, the BLAS mode, the generator's source stamp) changes it, so nothing stale is ever reused."""

from __future__ import annotations

import numpy as np
import pytest

import tensorvm as tv
from tensorvm import op
from tensorvm.codegen import calibrate, host, signature
from tensorvm.codegen.build import have_compiler
from tensorvm.ir.expr import Function, Var, const
from tensorvm.ir.types import Any, TensorType
from tensorvm.vm.kernel_c import build_c_library

pytestmark = pytest.mark.skipif(not have_compiler(), reason="needs a C compiler")


@pytest.fixture(autouse=True)
def memo(monkeypatch, tmp_path):
    """A fresh memo and kernel cache per test (else hits would depend on earlier tests and runs: a
    library built before is bound from its manifest, ``tests/vm/test_kernel_manifest.py``)."""
    monkeypatch.setenv("TENSORVM_CACHE_DIR", str(tmp_path))
    fresh = signature.PlanMemo()
    monkeypatch.setattr(signature, "PLANS", fresh)
    return fresh


def _prim(alpha=0.1, dtype="float32", cols=4, shift=0.5, table_scale=1.0):
    """``leaky_relu(x * table + shift)``: its attr, dtype, static dim and constants can each be changed."""
    x = Var("x", TensorType((Any(), cols), dtype))
    table = const((np.arange(cols) * table_scale).astype(dtype))
    body = op.nn.leaky_relu(op.add(op.multiply(x, table), const(np.array(shift, dtype))), alpha=alpha)
    return Function([x], body, attrs={"Primitive": 1})


def _reference(x, alpha=0.1, cols=4, shift=0.5, table_scale=1.0):
    y = x * (np.arange(cols) * table_scale).astype(x.dtype) + x.dtype.type(shift)
    return np.where(y > 0, y, y * x.dtype.type(alpha))


def _run(library, x):
    out = np.empty_like(x)
    library.kernels["k"](x, out)
    return out


def _x(dtype="float32", cols=4):
    return np.random.default_rng(0).standard_normal((5, cols)).astype(dtype)


def test_a_second_build_of_the_same_group_reuses_it_and_computes_the_same():
    first = build_c_library({"k": _prim()})
    second = build_c_library({"k": _prim()})  # a new, structurally equal function
    assert (first.reused, second.reused) == (0, 1)
    assert second.source == first.source
    x = _x()
    np.testing.assert_array_equal(_run(second, x), _run(first, x))
    np.testing.assert_allclose(_run(second, x), _reference(x), rtol=1e-6)


@pytest.mark.parametrize("change", [
    {"alpha": 0.2},          # an attr
    {"dtype": "float64"},    # a dtype
    {"cols": 5},             # a static dim
    {"shift": 0.25},         # a scalar constant folded into the code
    {"table_scale": 2.0},    # a tensor constant (passed to the kernel as an input)
])
def test_a_changed_group_misses_and_computes_its_own_function(change):
    build_c_library({"k": _prim()})
    changed = build_c_library({"k": _prim(**change)})
    assert changed.reused == 0
    x = _x(change.get("dtype", "float32"), change.get("cols", 4))
    ref_args = {k: v for k, v in change.items() if k != "dtype"}
    np.testing.assert_allclose(_run(changed, x), _reference(x, **ref_args), rtol=1e-6)


def test_the_same_group_twice_in_one_library_is_one_kernel():
    library = build_c_library({"k": _prim(), "k_again": _prim(), "other": _prim(alpha=0.3)})
    assert library.aliases == {"k_again": "k"}
    assert library.kernels["k_again"] is library.kernels["k"]
    x = _x()
    out = np.empty_like(x)
    library.kernels["other"](x, out)
    np.testing.assert_allclose(out, _reference(x, alpha=0.3), rtol=1e-6)


def _misses_after(monkeypatch, change) -> bool:
    build_c_library({"k": _prim()})
    assert build_c_library({"k": _prim()}).reused == 1
    change()
    library = build_c_library({"k": _prim()})
    x = _x()
    np.testing.assert_allclose(_run(library, x), _reference(x), rtol=1e-6)
    return library.reused == 0


def test_the_host_description_is_part_of_the_key(monkeypatch):
    monkeypatch.setattr(host, "_OVERRIDE", [None])
    current = host.host().isa
    assert _misses_after(monkeypatch, lambda: host.set_host("portable" if current != "portable" else "avx2"))


def test_the_measured_timings_are_in_no_key(monkeypatch):
    """Another process measures the pool a little differently (or not at all, when the machine was busy):
    the key stays, even where the thresholds derived from the timings change (the running pool holds the
    measurement and each library derives them at run time: a first process whose measurement was disturbed
    had built every library a second time for the next)."""
    import dataclasses

    base = dataclasses.replace(host.detect_host(), clock_ghz=3.0, fork_join_ns=2000.0, wake_ns=30000.0)
    monkeypatch.setattr(host, "_OVERRIDE", [base])
    before = signature.codegen_settings()
    host.set_host(dataclasses.replace(base, clock_ghz=3.01, fork_join_ns=2100.0, wake_ns=41000.0))
    assert signature.codegen_settings() == before
    assert host.kernel_rules().team_chunk_elements == host.kernel_rules(base).team_chunk_elements
    assert not _misses_after(monkeypatch, lambda: host.set_host(dataclasses.replace(base, fork_join_ns=500.0)))
    assert host.kernel_rules().team_chunk_elements != host.kernel_rules(base).team_chunk_elements
    assert host.kernel_rules().parallel_work_narrow != host.kernel_rules(base).parallel_work_narrow
    assert not _misses_after(monkeypatch, lambda: host.set_host(host.unmeasured(base)))


def test_a_variant_pin_is_part_of_the_key(monkeypatch):
    monkeypatch.setattr(calibrate, "_PINS", {})
    assert _misses_after(monkeypatch, lambda: calibrate.pin("nn.dense", "own"))


def test_the_variant_switch_and_the_blas_mode_are_part_of_the_key(monkeypatch):
    assert _misses_after(monkeypatch, lambda: monkeypatch.setenv("TENSORVM_KERNEL_VARIANTS", "0"))
    assert _misses_after(monkeypatch, lambda: monkeypatch.setenv("TENSORVM_BLAS", "off"))


def test_the_generator_stamp_is_part_of_the_key(monkeypatch):
    stamp = signature.generator_stamp()
    assert len(stamp) == 64
    assert _misses_after(monkeypatch, lambda: monkeypatch.setattr(signature, "_STAMP", ["an edited generator"]))


def test_the_stamp_covers_the_package_c_files(monkeypatch, tmp_path):
    """The stamp hashes the package's C and Python: a copy with one C file changed has another stamp."""
    import shutil

    package = tmp_path / "tensorvm"
    shutil.copytree(signature._PACKAGE, package, ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    monkeypatch.setattr(signature, "_PACKAGE", package)
    monkeypatch.setattr(signature, "_STAMP", [])
    before = signature.generator_stamp()
    header = package / "codegen" / "lib" / "tv_kernel.h"
    header.write_text(header.read_text() + "\n/* edited */\n")
    monkeypatch.setattr(signature, "_STAMP", [])
    assert signature.generator_stamp() != before


def test_a_recompiled_model_reuses_every_kernel_and_agrees_with_the_interpreter():
    text = """
def @main(%x: Tensor[(?, 3, 8, 8), float32], %w: Tensor[(4, 3, 3, 3), float32]) {
  %0 = nn.conv2d(%x, %w, padding=[1, 1, 1, 1]);
  %1 = nn.relu(%0);
  nn.max_pool2d(%1, pool_size=[2, 2], strides=[2, 2])
}
"""
    rng = np.random.default_rng(1)
    x, w = rng.standard_normal((2, 3, 8, 8)).astype("float32"), rng.standard_normal((4, 3, 3, 3)).astype("float32")
    first = tv.vm.compile(tv.parse(text), target="c")
    second = tv.vm.compile(tv.parse(text), target="c")
    stats = second.stats()["kernel_library"]
    assert stats["kernels_reused"] == len(stats["c_kernels"]) > 0
    out1 = np.asarray(tv.vm.VirtualMachine(first).run(x, w))
    out2 = np.asarray(tv.vm.VirtualMachine(second).run(x, w))
    np.testing.assert_array_equal(out2, out1)
    ref = np.asarray(tv.create_executor("debug", tv.parse(text)).evaluate()(x, w))
    np.testing.assert_allclose(out2, ref, rtol=1e-5, atol=1e-5)


def test_the_memo_is_bounded_least_recently_used_out_first():
    memo = signature.PlanMemo(capacity=2)
    memo.put("a", 1)
    memo.put("b", 2)
    assert memo.get("a") == 1  # (now "b" is the least recently used)
    memo.put("c", 3)
    assert (memo.get("b"), memo.get("a"), memo.get("c"), len(memo)) == (None, 1, 3, 2)


def test_an_op_changed_at_run_time_misses_and_is_not_kept_on_disk(monkeypatch, tmp_path):
    """leaky_relu's compute replaced by relu's: the kernel must follow the new definition, and no library
    manifest is written for a definition the package's source does not describe."""
    from tensorvm.op.registry import get_op

    build_c_library({"k": _prim()})
    manifests = set(tmp_path.glob("kernels-*.json"))
    assert manifests
    monkeypatch.setattr(get_op("nn.leaky_relu"), "compute", get_op("nn.relu").compute)
    changed = build_c_library({"k": _prim()})
    assert changed.reused == 0
    x = _x()
    np.testing.assert_allclose(_run(changed, x), _reference(x, alpha=0.0), rtol=1e-6)
    assert set(tmp_path.glob("kernels-*.json")) == manifests


def test_a_code_generator_constant_is_part_of_the_key(monkeypatch):
    import importlib

    lower = importlib.import_module("tensorvm.codegen.lower")

    assert _misses_after(monkeypatch, lambda: monkeypatch.setattr(lower, "MAX_INLINED_NODES",
                                                                  lower.MAX_INLINED_NODES + 1))
