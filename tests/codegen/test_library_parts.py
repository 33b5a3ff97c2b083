"""The kernel library's parts (``c_emit.LIBRARY_PARTS``): the products and convolutions are compiled once
per host into objects of the kernel cache (``build.SharedUnit``) that every library calling them links.
What is checked: kernels call the part's object (its body is not in their unit) and compute what NumPy
does; a second library reuses the object without compiling it; a changed object on disk is compiled
again, not linked; a part's unit compiles warning-clean on its own."""

from __future__ import annotations

import dataclasses
import re
import subprocess

import numpy as np
import pytest

from tensorvm import op
from tensorvm.codegen import blas, build, c_emit, module
from tensorvm.codegen.fused import build_fused_module
from tensorvm.ir.expr import Function, Var
from tensorvm.ir.types import Any, TensorType
from tensorvm.op.registry import get_op

pytestmark = pytest.mark.skipif(not blas.available(), reason="no host BLAS callable from C (NumPy's OpenBLAS)")

CONV = get_op("nn.conv2d")


@pytest.fixture
def fresh_cache(tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    monkeypatch.setenv("TENSORVM_CACHE_DIR", str(cache))
    monkeypatch.setenv("TENSORVM_BLAS", "c")
    return cache


def _conv_kernel(channels: int, kernel: int):
    """A conv + bias + relu primitive of a dynamic batch (the direct convolution's part)."""
    x = Var("x", TensorType((Any(), 3, 12, 13), "float32"))
    w = Var("w", TensorType((channels, 3, kernel, kernel), "float32"))
    b = Var("b", TensorType((channels, 1, 1), "float32"))
    body = op.nn.relu(op.add(op.nn.conv2d(x, w, padding=[1, 1, 1, 1]), b))
    module, kernels = build_fused_module({"k": Function([x, w, b], body, attrs={"Primitive": 1})})
    return module, kernels["k"]


def _check(kernel, channels: int, size: int, batch: int = 2):
    rng = np.random.default_rng(channels)
    x = rng.standard_normal((batch, 3, 12, 13)).astype(np.float32)
    w = rng.standard_normal((channels, 3, size, size)).astype(np.float32)
    b = rng.standard_normal((channels, 1, 1)).astype(np.float32)
    attrs = CONV.normalize_attrs({"padding": [1, 1, 1, 1]})
    want = np.maximum(CONV.kernel(attrs, x.astype(np.float64), w.astype(np.float64)) + b, 0)
    got = np.empty(want.shape, np.float32)
    kernel(x, w, b, got)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * float(np.abs(want).max()))


def _objects(cache):
    return sorted(cache.glob("tvo_*.o"))


def test_kernels_call_the_part_object_and_compute_the_convolution(fresh_cache):
    module, kernel = _conv_kernel(8, 3)
    assert c_emit.library_parts([kernel]) == ["direct"]
    _check(module["k"], 8, 3)
    objects = _objects(fresh_cache)
    assert len(objects) == 1 and build.verified_library(objects[0])
    units = sorted(fresh_cache.glob("tv_*_[0-9].c"))
    kernel_units = [u.read_text() for u in units if "int32_t k(" in u.read_text() and "Python.h" not in u.read_text()]
    assert len(kernel_units) == 1
    # the unit of the kernels calls the part's symbol and holds no body of the part's entry point
    assert "#define tv_conv2d_direct_act_f32 tvl_conv2d_direct_act_f32" in kernel_units[0]
    nm = subprocess.run(["nm", str(objects[0])], capture_output=True, text=True)
    if nm.returncode == 0:
        assert "tvl_conv2d_direct_act_f32" in nm.stdout


def test_a_second_library_links_the_cached_part_without_compiling_it(fresh_cache):
    module, _ = _conv_kernel(8, 3)
    _check(module["k"], 8, 3)
    (obj,) = _objects(fresh_cache)
    built = obj.stat().st_mtime_ns
    other, _ = _conv_kernel(16, 5)  # another kernel, another library: the same part
    _check(other["k"], 16, 5)
    assert _objects(fresh_cache) == [obj] and obj.stat().st_mtime_ns == built


def test_a_changed_part_object_is_compiled_again_not_linked(fresh_cache):
    module, _ = _conv_kernel(8, 3)
    _check(module["k"], 8, 3)
    (obj,) = _objects(fresh_cache)
    data = bytearray(obj.read_bytes())
    data[len(data) // 2] ^= 0xFF
    obj.write_bytes(bytes(data))
    assert not build.verified_library(obj)
    other, _ = _conv_kernel(12, 3)
    _check(other["k"], 12, 3)
    assert build.verified_library(obj)


@pytest.mark.parametrize("part", sorted(c_emit.LIBRARY_PARTS))
def test_each_part_compiles_warning_clean_and_exports_its_entry_points(part, tmp_path):
    toolchain = build.find_toolchain()
    source = tmp_path / f"{part}.c"
    source.write_text(c_emit.library_part(part))
    flags = [f for f in toolchain.flags if f != "-shared"] + list(c_emit.LIBRARY_PART_FLAGS.get(part, ()))
    done = subprocess.run([toolchain.compiler, *flags, "-Wall", "-Werror", "-c", str(source), "-o",
                           str(tmp_path / f"{part}.o")], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    nm = subprocess.run(["nm", str(tmp_path / f"{part}.o")], capture_output=True, text=True)
    if nm.returncode == 0:
        defined = {line.split()[-1] for line in nm.stdout.splitlines() if " T " in line}
        assert {"tvl_" + name[3:] for name in c_emit.LIBRARY_PARTS[part]} <= defined


def test_a_toolchain_without_aliases_builds_the_library_as_one_unit(fresh_cache, monkeypatch):
    """Where hidden aliases do not link (Mach-O, for one; the toolchain probe says), no part object is
    made: the kernels' unit compiles the entry points itself, as before the parts, and computes the same."""
    assert build.find_toolchain().aliases  # (this machine's gcc on ELF)
    plain = dataclasses.replace(build.find_toolchain(), aliases=False)
    monkeypatch.setattr(module, "find_toolchain", lambda: plain)
    built, _ = _conv_kernel(8, 3)
    _check(built["k"], 8, 3)
    assert _objects(fresh_cache) == []


def _one_pixel_pointwise():
    """A 1x1 convolution of 1 x 1 images (the pointwise kernel's product-of-vectors case) with a dynamic batch."""
    x = Var("x", TensorType((Any(), 24, 1, 1), "float32"))
    w = Var("w", TensorType((10, 24, 1, 1), "float32"))
    module, kernels = build_fused_module({"k": Function([x, w], op.nn.conv2d(x, w), attrs={"Primitive": 1})})
    return module, kernels["k"]


def test_the_pointwise_part_links_the_products_part_for_its_one_pixel_case(fresh_cache):
    """The pointwise part's one pixel per image is a product (tv_gemm_f32): its object calls the products
    part's symbol instead of holding a second copy of the register tiles, and a library calling the pointwise
    part links both."""
    module, kernel = _one_pixel_pointwise()
    assert c_emit.library_parts([kernel]) == ["pointwise", "products"]
    rng = np.random.default_rng(5)
    w = rng.standard_normal((10, 24, 1, 1)).astype(np.float32)
    for batch in (1, 3):
        x = rng.standard_normal((batch, 24, 1, 1)).astype(np.float32)
        want = np.einsum("oc,nchw->nohw", w[:, :, 0, 0].astype(np.float64), x.astype(np.float64))
        got = np.full(want.shape, np.nan, np.float32)
        module["k"](x, w, got)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    assert len(_objects(fresh_cache)) == 2
    pointwise = build._shared_object_path(c_emit.library_part("pointwise"), (), build.find_toolchain(), fresh_cache)
    nm = subprocess.run(["nm", str(pointwise)], capture_output=True, text=True)
    if nm.returncode == 0:
        symbols = {line.split()[-1]: line.split()[-2] for line in nm.stdout.splitlines()}
        assert symbols.get("tvl_gemm_f32") == "U"
        assert not [name for name in symbols if name.startswith("tv_vgemm_tile")]


def test_a_cold_build_starts_the_parts_first_in_the_tables_order(fresh_cache, monkeypatch):
    """The parts' compiles (most of a cold build) start before the kernels' own units, the longest first as
    ``LIBRARY_PARTS`` lists them; with one worker the order is the order of the compiles."""
    monkeypatch.setenv("TENSORVM_COMPILE_JOBS", "1")
    started = []
    run = build._run_compiler

    def record(command, src_path):
        started.append(src_path.name)
        return run(command, src_path)

    monkeypatch.setattr(build, "_run_compiler", record)
    module, _ = _one_pixel_pointwise()
    toolchain = build.find_toolchain()
    parts = [build._shared_object_path(c_emit.library_part(p), (), toolchain, fresh_cache).with_suffix(".c").name
             for p in ("pointwise", "products")]
    assert list(c_emit.LIBRARY_PARTS)[:2] == ["pointwise", "products"]
    # (the units of the library: the parts' objects and the kernels' numbered units; not the pool's library,
    # the host probes or the link before and after them)
    units = [name for name in started if name.startswith("tvo_") or re.fullmatch(r"tv_[0-9a-f]+_\d+\.c", name)]
    assert units[:2] == parts and len(units) > 2
