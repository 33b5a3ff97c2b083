"""The VM on target "c": fused groups become single C kernel calls, fallbacks to NumPy are recorded, the
library travels inside the executable file (as text, never compiled from the file), and results match
NumPy. (Every program of the shared suite runs on target "c" in test_vm_programs.py.)"""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tensorvm as tv
from tensorvm.codegen.build import have_compiler, reset_toolchain
from tensorvm.errors import FormatError, UnsupportedError
from tensorvm.vm import VirtualMachine, load_executable
from tensorvm.vm import bytecode as bc

pytestmark = pytest.mark.skipif(not have_compiler(), reason="no C compiler on this machine")

DENSE_TANH = """
def @main(%x: Tensor[({batch}, 16), float32], %w: Tensor[(24, 16), float32], %b: Tensor[(24), float32]) {{
  tanh(add(nn.dense(%x, %w), %b))
}}
"""

LAYER_NORM = """
def @main(%x: Tensor[(?, 32), float32], %g: Tensor[(32), float32], %b: Tensor[(32), float32]) {
  nn.layer_norm(%x, %g, %b, axis=-1, epsilon=1e-5f)
}
"""

SORTED_SCALED = """
def @main(%x: Tensor[(?), float32]) {
  %0 = sort(%x);
  multiply(%0, 2f)
}
"""


def _kernel_calls(exe) -> dict:
    """Kernel (not shape function) -> number of InvokePacked instructions calling it."""
    stats = exe.stats()
    kinds = {p.name: p.kind for p in exe.primitives}
    return {name: n for name, n in stats["kernel_calls"].items() if kinds[name] == "kernel"}


def _dense_args(batch: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((batch, 16)).astype("float32"), rng.standard_normal((24, 16)).astype("float32"),
            rng.standard_normal(24).astype("float32"))


@pytest.fixture(scope="module")
def dense_exe():
    return tv.vm.compile(tv.parse(DENSE_TANH.format(batch="?")), target="c")


@pytest.mark.parametrize("batch", ["?", "5"])
def test_dense_bias_tanh_is_a_single_c_kernel_call(batch):
    exe = tv.vm.compile(tv.parse(DENSE_TANH.format(batch=batch)), target="c")
    calls = _kernel_calls(exe)
    assert list(calls.values()) == [1], calls
    (name,) = calls
    assert all(op in name for op in ("dense", "add", "tanh"))
    lib = exe.stats()["kernel_library"]
    assert lib["c_kernels"] == [name] and lib["numpy_fallbacks"] == {}
    x, w, b = _dense_args(5)
    out = VirtualMachine(exe).invoke("main", x, w, b).numpy()
    np.testing.assert_allclose(out, np.tanh(x @ w.T + b), rtol=1e-5, atol=1e-5)


def test_layer_norm_is_a_single_c_kernel_call():
    exe = tv.vm.compile(tv.parse(LAYER_NORM), target="c")
    calls = _kernel_calls(exe)
    assert list(calls.values()) == [1] and exe.stats()["kernel_library"]["numpy_fallbacks"] == {}
    rng = np.random.default_rng(1)
    x = rng.standard_normal((7, 32)).astype("float32")
    g, b = rng.standard_normal(32).astype("float32"), rng.standard_normal(32).astype("float32")
    out = VirtualMachine(exe).invoke("main", x, g, b).numpy()
    mean, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
    np.testing.assert_allclose(out, (x - mean) / np.sqrt(var + 1e-5) * g + b, rtol=1e-4, atol=1e-5)


@given(batch=st.integers(0, 40), seed=st.integers(0, 2**16))
@settings(max_examples=25, deadline=None)
def test_one_executable_serves_every_batch_size(dense_exe, batch, seed):
    x, w, b = _dense_args(batch, seed)
    out = VirtualMachine(dense_exe).invoke("main", x, w, b).numpy()
    assert out.shape == (batch, 24)
    np.testing.assert_allclose(out, np.tanh(x @ w.T + b), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("rows", [3, 100, 40000])
def test_dynamic_concatenate_on_both_sides_of_the_parallel_choice(rows):
    """A kernel whose loop is parallel only for enough work runs a serial copy below that; both
    copies must agree with NumPy (gcc 12 had miscompiled this kernel under ``parallel for if(...)``)."""
    mod = tv.parse("""
def @main(%x: Tensor[(?, 2), float32], %twice: bool) -> Tensor[(?, 2), float32] {
  if (%twice) { concatenate((%x, %x), axis=0) } else { %x }
}""")
    vm = VirtualMachine(tv.vm.compile(mod, target="c"))
    x = np.random.default_rng(rows).standard_normal((rows, 2)).astype("float32")
    np.testing.assert_array_equal(vm.invoke("main", x, np.bool_(True)).numpy(), np.concatenate([x, x]))


def test_ops_without_c_code_fall_back_to_numpy_and_are_listed(monkeypatch):
    from tensorvm.op import get_op

    monkeypatch.setattr(get_op("sort"), "library", None)  # (sort's kernel is a library call: take it away)
    exe = tv.vm.compile(tv.parse(SORTED_SCALED), target="c")
    lib = exe.stats()["kernel_library"]
    fallbacks = lib["numpy_fallbacks"]
    sort_kernel = next(name for name in _kernel_calls(exe) if "sort" in name)
    assert sort_kernel in fallbacks and "sort" in fallbacks[sort_kernel]
    assert any("multiply" in name for name in lib["c_kernels"])
    assert "NumPy fallback" in str(exe.stats())
    x = np.array([3, -1, 2, 0.5], "float32")
    for mode in ("bytecode", "compiled"):
        out = VirtualMachine(exe.with_exec_mode(mode)).invoke("main", x).numpy()
        np.testing.assert_array_equal(out, np.sort(x) * 2)


def test_kernel_sources_in_the_listing(dense_exe):
    text = dense_exe.as_text(kernels=True)
    kernel = next(iter(_kernel_calls(dense_exe)))
    assert text.startswith(dense_exe.as_text().rstrip("\n"))
    c_source = dense_exe.kernel_source(kernel)
    # (the kernel, preceded by its dispatch function when it has variants, e.g. BLAS for the product)
    assert c_source.startswith(("int32_t tvk", "/* Variants of tvk")) and "tanhf" in c_source and c_source in text
    shape_source = dense_exe.kernel_source(f"shape_func_{kernel}")  # the C shape function, traced from the logic
    assert shape_source.startswith("/* shape function of") and "int32_t tvs" in shape_source and shape_source in text
    assert "tvk" not in dense_exe.as_text()  # the plain listing stays short


def _sections(data: bytes) -> dict:
    """Section tag -> (payload offset, payload length) of a saved executable."""
    import struct

    pos = 8 + 4 + 4
    for _ in range(2):  # exec mode and target strings
        pos += 4 + struct.unpack_from("<I", data, pos)[0]
    out = {}
    while pos < len(data) - 32:
        tag = data[pos:pos + 4]
        length = struct.unpack_from("<Q", data, pos + 4)[0]
        out[tag] = (pos + 12, length)
        pos += 12 + length
    return out


def test_saved_executable_carries_the_c_source_and_reloads_from_the_cache(dense_exe, tmp_path):
    path = tmp_path / "dense.tvx"
    dense_exe.save(path)
    data = path.read_bytes()
    start, length = _sections(data)[b"CLIB"]
    assert dense_exe.c_library.source.encode() in data[start:start + length]
    loaded = load_executable(path)
    assert loaded.target == "c" and loaded.as_text() == dense_exe.as_text()
    lib = loaded.stats()["kernel_library"]
    # the library the save built is found in the kernel cache and used as is (docs/deploy.md)
    assert lib["origin"] == "kernel cache" and lib["compile_seconds"] == 0, lib
    assert loaded.save_bytes() == data
    x, w, b = _dense_args(3)
    for exe in (loaded, loaded.with_exec_mode("compiled")):
        np.testing.assert_allclose(VirtualMachine(exe).invoke("main", x, w, b).numpy(), np.tanh(x @ w.T + b),
                                   rtol=1e-5, atol=1e-5)


def test_loading_never_compiles_c_taken_from_the_file(dense_exe):
    """A file whose C text was replaced (checksum fixed up) still runs the kernels regenerated from its
    primitive functions; the foreign text is only reported as not matching."""
    data = bytearray(dense_exe.save_bytes())
    start, length = _sections(bytes(data))[b"CLIB"]
    source = dense_exe.c_library.source.encode()
    offset = bytes(data).index(source, start)
    hostile = b"#include <stdlib.h>\n__attribute__((constructor)) static void boom(void) { abort(); }\n"
    hostile = (hostile + b" " * len(source))[:len(source)]
    data[offset:offset + len(source)] = hostile
    body = bytes(data[:-32])
    loaded = load_executable(body + hashlib.sha256(body).digest())
    assert loaded.stats()["kernel_library"]["saved_source_matches"] is False
    assert b"boom" not in loaded.c_library.source.encode()
    x, w, b = _dense_args(4)
    np.testing.assert_allclose(VirtualMachine(loaded).invoke("main", x, w, b).numpy(), np.tanh(x @ w.T + b),
                               rtol=1e-5, atol=1e-5)


def test_clib_section_is_checked(dense_exe, sum_up_python_bytes):
    data = dense_exe.save_bytes()
    start, length = _sections(data)[b"CLIB"]
    body = data[:start + length]  # a second CLIB section after the first
    twice = body + data[start - 12:start + length]
    with pytest.raises(FormatError, match="repeated or out of order"):
        load_executable(twice + hashlib.sha256(twice).digest())
    unknown = body + b"XTRA" + (0).to_bytes(8, "little")
    with pytest.raises(FormatError, match="unknown section"):
        load_executable(unknown + hashlib.sha256(unknown).digest())
    body = sum_up_python_bytes[:-32] + data[start - 12:start + length]  # a C library in a python executable
    with pytest.raises(FormatError, match="CLIB section in an executable for target 'python'"):
        load_executable(body + hashlib.sha256(body).digest())


@pytest.fixture(scope="module")
def sum_up_python_bytes():
    mod = tv.parse("""
def @main(%i: int32) -> int32 {
  if (equal(%i, 0)) { 0 } else { add(@main(subtract(%i, 1)), %i) }
}""")
    return tv.vm.compile(mod, target="python").save_bytes()


def test_version_1_files_still_load(sum_up_python_bytes):
    import struct

    old = bytearray(sum_up_python_bytes[:-32])
    struct.pack_into("<I", old, 8, 1)
    exe = load_executable(bytes(old) + hashlib.sha256(old).digest())
    assert VirtualMachine(exe).invoke("main", 10).numpy() == 55


def test_missing_compiler_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("TENSORVM_CC", "/nonexistent/tensorvm-no-such-cc")
    reset_toolchain()
    try:
        with pytest.raises(UnsupportedError, match='target="python"'):
            tv.vm.compile(tv.parse(LAYER_NORM), target="c")
    finally:
        monkeypatch.undo()
        reset_toolchain()


def test_compiled_exec_mode_on_target_c_is_native_and_as_python_still_shows_python(dense_exe):
    compiled = dense_exe.with_exec_mode("compiled")
    assert compiled.exec_mode == "native"  # (executable.resolve_exec_mode)
    assert compiled.stats()["kernel_library"]["native_source_bytes"]
    source = compiled.as_python()  # (for inspection: generated from the same bytecode)
    kernel = next(iter(_kernel_calls(dense_exe)))
    assert f"# {kernel}" in source
    x, w, b = _dense_args(6)
    np.testing.assert_allclose(VirtualMachine(compiled).invoke("main", x, w, b).numpy(), np.tanh(x @ w.T + b),
                               rtol=1e-5, atol=1e-5)
    fn = compiled.function("main")
    assert sum(isinstance(ins, bc.InvokePacked) for ins in fn.instructions) == 2  # shape function + kernel


def _repeated_read_chain(steps: int) -> str:
    """A fused group where every op reads its input several times (``where(y > 0, y, y * 0.5)``), with
    transposes and reshapes between: inlined whole, its C expression grows as 3^steps."""
    lines, value = [], "%x"
    for k in range(steps):
        lines.append(f"%s{k} = where(greater({value}, 0f), {value}, multiply({value}, 0.5f));")
        value = f"%s{k}"
        if k % 3 == 2:
            lines.append(f"%t{k} = reshape(transpose({value}, axes=[1, 0]), newshape=[6, 4]);")
            lines.append(f"%r{k} = reshape(transpose(reshape(%t{k}, newshape=[4, 6]), axes=[1, 0]), "
                         f"newshape=[4, 6]);")
            value = f"%r{k}"
    return "def @main(%x: Tensor[(4, 6), float32]) {\n  " + "\n  ".join(lines) + f"\n  {value}\n}}"


def test_inlined_expressions_are_bounded_and_keep_the_results(monkeypatch):
    import importlib

    lower = importlib.import_module("tensorvm.codegen.lower")  # (the package exports a function of that name)
    mod = tv.parse(_repeated_read_chain(6))
    x = np.random.default_rng(5).standard_normal((4, 6)).astype(np.float32)
    want = tv.create_executor("debug", mod).evaluate()(x).numpy()
    exe = tv.vm.compile(mod, target="c")
    assert exe.stats()["kernel_library"]["numpy_fallbacks"] == {}
    np.testing.assert_array_equal(VirtualMachine(exe).invoke("main", x).numpy(), want)
    from tensorvm.codegen.c_emit import emit_kernel
    from tensorvm.codegen.fused import lower_primitive

    # The kernels' own C, measured alike with and without the bound (the library's shared headers
    # are not part of the question); the unbounded C is only emitted, not compiled: it is what takes long.
    prims = [exe.primitive_function(info.source) for info in exe.primitives if info.kind == "kernel"]

    def kernel_chars():
        return sum(len(emit_kernel(lower_primitive(fn, f"k{i}").func).source) for i, fn in enumerate(prims))

    bounded = kernel_chars()
    monkeypatch.setattr(lower, "MAX_INLINED_NODES", 10 ** 9)
    unbounded = kernel_chars()
    assert unbounded > 4 * bounded, (unbounded, bounded)


def test_identical_groups_share_one_c_kernel():
    """Layers with the same signature (ops, attrs, dtypes, shapes) but their own weights compile to one
    C kernel called three times; a layer of another shape gets its own. Results match the interpreter."""
    from tensorvm import op
    from tensorvm.ir.expr import Function, Var, const
    from tensorvm.ir.module import IRModule
    from tensorvm.ir.types import Any, TensorType

    rng = np.random.default_rng(11)
    x = Var("x", TensorType((Any(), 16), "float32"))
    y = x
    for width in (16, 16, 16, 8):  # (each layer reads 16 features)
        w = const(rng.standard_normal((width, 16)).astype(np.float32) / 4)
        b = const(rng.standard_normal((width,)).astype(np.float32))
        y = op.nn.relu(op.add(op.nn.dense(y, w), b))
    mod = IRModule.from_expr(Function([x], y))
    exe = tv.vm.compile(mod, target="c")
    library = exe.stats()["kernel_library"]
    assert len(library["c_kernels"]) == 2 and library["numpy_fallbacks"] == {}
    data = rng.standard_normal((3, 16)).astype(np.float32)
    want = tv.create_executor("debug", mod).evaluate()(data).numpy()
    np.testing.assert_allclose(VirtualMachine(exe).invoke("main", data).numpy(), want, rtol=1e-5, atol=1e-5)
