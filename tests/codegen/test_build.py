"""Building shared libraries: the on-disk cache, compiler errors, parallel translation units, threads."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import numpy as np
import pytest

from tensorvm import te
from tensorvm.codegen import build
from tensorvm.codegen.build import CompilerError, build_library, build_stats, find_toolchain, set_num_threads
from tensorvm.codegen.lower import lower
from tensorvm.codegen.module import build_module
from tensorvm.errors import ExecutionError, ShapeError, UnsupportedError


def _scale_kernel(name: str, factor: float):
    n = te.var("n")
    x = te.placeholder((n,), "float32", "x")
    return lower(name, [x], [te.compute((n,), lambda i: x[i] * factor + 1.0, "y")])


@pytest.fixture
def fresh_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TENSORVM_CACHE_DIR", str(tmp_path))
    return tmp_path


def test_second_build_is_a_cache_hit(fresh_cache):
    before = build_stats()["cache_hits"]
    first = build_module([_scale_kernel("scale_a", 3.0)])
    assert not first.build_info.cached and first.build_info.compile_seconds > 0
    assert first.build_info.path.startswith(str(fresh_cache))
    second = build_module([_scale_kernel("scale_a", 3.0)])
    assert second.build_info.cached and second.build_info.compile_seconds == 0
    assert second.build_info.path == first.build_info.path
    assert build_stats()["cache_hits"] == before + 1
    out = np.empty(3, "float32")
    second["scale_a"](np.array([1, 2, 3], "float32"), out)
    np.testing.assert_array_equal(out, [4, 7, 10])


def test_a_different_source_is_a_different_library(fresh_cache):
    a = build_module([_scale_kernel("scale_b", 2.0)])
    b = build_module([_scale_kernel("scale_b", 5.0)])
    assert a.build_info.path != b.build_info.path


def test_parallel_translation_units_link_into_one_library(fresh_cache):
    funcs = [_scale_kernel(f"unit_{k}", float(k)) for k in range(4)]
    module = build_module(funcs, jobs=2)
    assert not module.build_info.cached and len(list(fresh_cache.glob("*.so"))) == 1
    for k in range(4):
        out = np.empty(2, "float32")
        module[f"unit_{k}"](np.array([1, 2], "float32"), out)
        np.testing.assert_array_equal(out, [k + 1, 2 * k + 1])


def test_translation_units_are_bounded_in_size_and_balanced(fresh_cache, monkeypatch):
    from tensorvm.codegen import module as module_code
    from tensorvm.codegen.c_emit import emit_kernel

    funcs = [_scale_kernel(f"bounded_{k}", float(k)) for k in range(7)]
    emitted = [emit_kernel(f) for f in funcs]
    size = max(len(k.source) for k in emitted)
    monkeypatch.setattr(module_code, "_UNIT_BYTES", 2 * size)
    groups = module_code.split_units(emitted, workers=1)
    assert len(groups) == 4  # 7 kernels, at most 2 a unit
    assert all(sum(len(k.source) for k in g) <= 2 * size for g in groups)
    assert sorted(k.name for g in groups for k in g) == sorted(f.name for f in funcs)
    # (a kernel over the bound is a unit of its own, never dropped)
    monkeypatch.setattr(module_code, "_UNIT_BYTES", size // 2)
    assert [len(g) for g in module_code.split_units(emitted, workers=1)] == [1] * 7
    module = build_module(funcs)  # seven units, compiled by the pool and linked into one library
    assert len(list(fresh_cache.glob("tv_*_6.c"))) == 1 and len(list(fresh_cache.glob("*.so"))) == 1
    for k in range(7):
        out = np.empty(2, "float32")
        module[f"bounded_{k}"](np.array([1, 2], "float32"), out)
        np.testing.assert_array_equal(out, [k + 1, 2 * k + 1])


def test_missing_compiler_suggests_target_python(monkeypatch, fresh_cache):
    monkeypatch.setenv("TENSORVM_CC", "/nonexistent/tensorvm-cc")
    build.reset_toolchain()
    try:
        with pytest.raises(CompilerError, match='no C compiler found.*target="python"'):
            build_library("int tv_probe(void) { return 0; }\n")
        assert issubclass(CompilerError, UnsupportedError)
    finally:
        monkeypatch.delenv("TENSORVM_CC")
        build.reset_toolchain()


def test_failing_compiler_shows_its_output(fresh_cache):
    with pytest.raises(CompilerError, match=r'(?s)target="python".*error'):
        build_library("this is not C;\n")


def _process_state(pid: int) -> str | None:
    """The state letter of process ``pid`` (``Z``: a zombie, dead), or None once it is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads process states from /proc (Linux)")
def test_a_compiler_past_the_timeout_is_killed_with_its_children(fresh_cache, tmp_path, monkeypatch):
    # A fake compiler that starts a child (as the driver starts cc1), records the child's pid and hangs.
    child_pid = tmp_path / "child.pid"
    fake = tmp_path / "slow-cc"
    fake.write_text(f"#!/bin/sh\nsleep 300 &\necho $! > {child_pid}\nsleep 300\n")
    fake.chmod(0o755)
    toolchain = dataclasses.replace(find_toolchain(), compiler=str(fake))
    monkeypatch.setenv("TENSORVM_COMPILE_TIMEOUT", "1")
    start = time.monotonic()
    with pytest.raises(CompilerError, match="more than 1 s.*killed with its whole process group"):
        build_library("int tv_timeout_probe(void) { return 1; }\n", toolchain)
    assert time.monotonic() - start < 60
    pid = int(child_pid.read_text())
    deadline = time.monotonic() + 10
    while _process_state(pid) not in (None, "Z") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _process_state(pid) in (None, "Z"), f"the compiler's child {pid} still runs"


def test_compile_timeout_setting(monkeypatch):
    monkeypatch.setenv("TENSORVM_COMPILE_TIMEOUT", "2.5")
    assert build.compile_timeout() == 2.5
    for bad in ("", "soon", "-1"):
        monkeypatch.setenv("TENSORVM_COMPILE_TIMEOUT", bad)
        assert build.compile_timeout() == 600.0


def test_toolchain_flags():
    toolchain = find_toolchain()
    assert {"-O3", "-fPIC", "-fwrapv"} <= set(toolchain.flags)
    assert ("-fopenmp" in toolchain.flags) == toolchain.openmp


def test_thread_count_does_not_change_results():
    funcs = [_scale_kernel("threads_k", 2.0)]
    module = build_module(funcs)
    x = np.arange(100_000, dtype="float32")
    results = []
    for threads in (1, None):
        set_num_threads(threads)
        out = np.empty_like(x)
        module["threads_k"](x, out)
        results.append(out)
    np.testing.assert_array_equal(results[0], results[1])
    np.testing.assert_array_equal(results[0], x * 2 + 1)
    with pytest.raises(ValueError, match="positive"):
        set_num_threads(0)


def test_duplicate_kernel_names_are_rejected():
    with pytest.raises(ValueError, match="unique"):
        build_module([_scale_kernel("same", 1.0), _scale_kernel("same", 2.0)])


def test_without_python_headers_kernels_are_called_through_ctypes(fresh_cache):
    plain = dataclasses.replace(find_toolchain(), python_include="")
    module = build_module([_scale_kernel("ctypes_path", 2.0)], toolchain=plain)
    kernel = module["ctypes_path"]
    assert kernel.entry == kernel._call_through_ctypes
    out = np.empty(3, "float32")
    kernel(np.array([1, 2, 3], "float32"), out)
    np.testing.assert_array_equal(out, [3, 5, 7])
    with pytest.raises(ExecutionError, match="dtype float32"):
        kernel(np.zeros(3, "float64"), out)


def test_only_the_kernels_asked_for_get_python_wrappers(fresh_cache):
    """``wrappers`` names the kernels that get a CPython wrapper; the others are called through ctypes, with
    the same results and checks; none asked for builds no wrapper module at all."""
    funcs = [_scale_kernel("wrapped", 2.0), _scale_kernel("plain", 3.0)]
    module = build_module(funcs, wrappers={"wrapped"})
    wrapped, plain = module["wrapped"], module["plain"]
    assert wrapped.entry != wrapped._call_through_ctypes and plain.entry == plain._call_through_ctypes
    for kernel, factor in ((wrapped, 2.0), (plain, 3.0)):
        out = np.empty(3, "float32")
        kernel(np.array([1, 2, 3], "float32"), out)
        np.testing.assert_array_equal(out, np.array([1, 2, 3]) * factor + 1)
        with pytest.raises(ShapeError, match="out0 dim 0"):
            kernel(np.zeros(3, "float32"), np.empty(4, "float32"))
    none = build_module([_scale_kernel("unwrapped", 4.0)], wrappers=set())
    assert none.library._python_module is None
    assert none["unwrapped"].entry == none["unwrapped"]._call_through_ctypes


def test_rejected_calls_are_explained(fresh_cache):
    kernel = build_module([_scale_kernel("explained", 2.0)])["explained"]
    assert kernel.entry != kernel._call_through_ctypes  # the C wrapper (Python headers are here)
    with pytest.raises(ExecutionError, match="C-contiguous"):
        kernel(np.zeros((3, 2), "float32")[:, 0], np.empty(3, "float32"))
    with pytest.raises(ShapeError, match="rank 1"):
        kernel(np.zeros((3, 1), "float32"), np.empty(3, "float32"))
    with pytest.raises(ShapeError, match="out0 dim 0"):
        kernel(np.zeros(3, "float32"), np.empty(4, "float32"))


def test_unusable_cache_directory(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("TENSORVM_CACHE_DIR", str(blocker / "cache"))
    with pytest.raises(CompilerError, match="TENSORVM_CACHE_DIR"):
        build_library("int tv_probe(void) { return 0; }\n")



CONCATENATES = [  # (program, argument shapes per call)
    ("def @main(%x: Tensor[(3, 2), float32]) { concatenate((%x, %x), axis=0) }", [[(3, 2)]]),
    ("def @main(%a: Tensor[(?, 2), float32], %b: Tensor[(?, 2), float32]) { concatenate((%a, %b, %a), axis=0) }",
     [[(1, 2), (2, 2)], [(3, 2), (5, 2)], [(4, 2), (1, 2)]]),
]


@pytest.mark.parametrize("text, calls", CONCATENATES)
def test_a_select_between_loads_of_one_array_is_built_right(text, calls):
    """GCC 12.2 at -O3 with AVX2 vectorized these concatenate kernels wrongly (the toolchain probe turns
    loop if-conversion off where its kernel comes out wrong); checked against NumPy."""
    import tensorvm as tv

    if not build.have_compiler():
        pytest.skip("no C compiler on this machine")
    mod = tv.transform.InferType()(tv.parse(text))
    vm = tv.vm.VirtualMachine(tv.vm.compile(mod, target="c"))
    rng = np.random.default_rng(0)
    for shapes in calls:
        args = [rng.standard_normal(shape).astype("float32") for shape in shapes]
        parts = [args[0], args[0]] if len(args) == 1 else [args[0], args[1], args[0]]
        np.testing.assert_array_equal(vm["main"](*args).numpy(), np.concatenate(parts))


FAKE_HOST_FLAG = "-mtensorvm-fake-host-flag"  # a "host" flag this compiler does not know


def _toolchain_with_failing_host_flag(monkeypatch):
    """The real toolchain plus a host flag that makes every compile fail (as -march=native does with an
    assembler that lacks the host's instructions)."""
    monkeypatch.setattr(build, "HOST_FLAGS", build.HOST_FLAGS + (FAKE_HOST_FLAG,))
    real = find_toolchain()
    return dataclasses.replace(real, flags=real.flags + (FAKE_HOST_FLAG,))


def test_a_build_that_fails_with_the_host_flags_is_built_portable_and_says_so(fresh_cache, monkeypatch):
    toolchain = _toolchain_with_failing_host_flag(monkeypatch)
    first = build_module([_scale_kernel("portable_a", 3.0)], toolchain=toolchain)
    info = first.build_info
    assert FAKE_HOST_FLAG in info.portable and not info.cached
    assert not set(info.flags) & set(build.HOST_FLAGS)
    out = np.empty(3, "float32")
    first["portable_a"](np.array([1, 2, 3], "float32"), out)
    np.testing.assert_array_equal(out, [4, 7, 10])
    # Next time the failure is known: the portable library is a cache hit, the host flags are not retried.
    again = build_module([_scale_kernel("portable_a", 3.0)], toolchain=toolchain)
    assert again.build_info.cached and again.build_info.path == info.path and again.build_info.portable


def test_a_normal_build_is_not_portable(fresh_cache):
    info = build_module([_scale_kernel("native_a", 2.0)]).build_info
    assert info.portable == "" and info.flags == find_toolchain().flags


def test_code_that_fails_without_the_host_flags_too_is_still_an_error(fresh_cache, monkeypatch):
    toolchain = _toolchain_with_failing_host_flag(monkeypatch)
    with pytest.raises(CompilerError, match=r"(?s)portable build without the host flags failed too"):
        build_library("this is not C;\n", toolchain)


def test_the_executable_reports_a_portable_build(fresh_cache, monkeypatch):
    import tensorvm as tv

    monkeypatch.setattr(build, "_TOOLCHAIN", _toolchain_with_failing_host_flag(monkeypatch))
    text = "def @main(%x: Tensor[(?, 4), float32]) { nn.relu(add(%x, 1f)) }"
    exe = tv.vm.compile(tv.parse(text), target="c")
    assert FAKE_HOST_FLAG in exe.stats()["kernel_library"]["portable_build"]
    x = np.random.default_rng(0).standard_normal((3, 4)).astype("float32")
    np.testing.assert_array_equal(np.asarray(tv.vm.VirtualMachine(exe).run(x)), np.maximum(x + 1, 0))
