"""The default target: "c" when a C compiler is found, "python" (with the reason) when none is, or what
``$TENSORVM_TARGET`` says; ``tv.vm.compile`` and ``create_executor`` use it when given no target."""

from __future__ import annotations

import numpy as np
import pytest

import tensorvm as tv
from tensorvm.codegen import build
from tensorvm.errors import UnsupportedError

SOURCE = "def @main(%x: Tensor[(?, 3), float32]) { multiply(add(%x, 1f), %x) }"


@pytest.fixture
def no_compiler(monkeypatch):
    def missing():
        raise build.CompilerError("codegen: no C compiler found (looked for 'nocc')")

    monkeypatch.delenv("TENSORVM_TARGET", raising=False)
    monkeypatch.setattr(build, "find_toolchain", missing)


def test_without_a_compiler_the_default_is_python_and_says_why(no_compiler):
    assert build.default_target() == "python"
    assert "no usable C compiler" in build.default_target_reason() and "nocc" in build.default_target_reason()
    assert tv.vm.compile(tv.parse(SOURCE)).target == "python"
    assert tv.create_executor("vm", tv.parse(SOURCE)).target == "python"
    assert tv.graph.build(tv.parse(SOURCE.replace("?", "2"))).lib.target == "python"


@pytest.mark.skipif(not build.have_compiler(), reason="no C compiler")
def test_with_a_compiler_the_default_is_c(monkeypatch):
    monkeypatch.delenv("TENSORVM_TARGET", raising=False)
    assert build.default_target() == "c"
    assert build.find_toolchain().compiler in build.default_target_reason()
    mod = tv.parse(SOURCE)
    exe = tv.vm.compile(mod)
    assert exe.target == "c" and exe.stats()["kernel_library"]["c_kernels"]
    x = np.arange(6, dtype="float32").reshape(2, 3)
    np.testing.assert_allclose(tv.vm.VirtualMachine(exe).invoke("main", x).numpy(), (x + 1) * x)
    static = tv.parse(SOURCE.replace("?", "2"))  # (the graph executor needs static shapes)
    for kind, program in (("vm", mod), ("graph", static)):
        executor = tv.create_executor(kind, program)
        assert executor.target == "c"
        np.testing.assert_allclose(executor.evaluate()(x).numpy(), (x + 1) * x)
    assert tv.graph.build(static).lib.target == "c"  # (it had defaulted to "python" alone)


@pytest.mark.parametrize("chosen", ["python", "c"])
def test_the_environment_variable_chooses(monkeypatch, chosen):
    monkeypatch.setenv("TENSORVM_TARGET", chosen)
    assert build.default_target() == chosen and "TENSORVM_TARGET" in build.default_target_reason()
    if chosen == "python" or build.have_compiler():
        assert tv.graph.build(tv.parse(SOURCE.replace("?", "2"))).lib.target == chosen


def test_an_unknown_target_in_the_environment_is_an_error(monkeypatch):
    monkeypatch.setenv("TENSORVM_TARGET", "gpu")
    with pytest.raises(UnsupportedError, match="'c' or 'python', got 'gpu'"):
        tv.vm.compile(tv.parse(SOURCE))


LOOP = """
def @count(%i: int32, %acc: Tensor[(?, 3), float32]) -> Tensor[(?, 3), float32] {
  if (equal(%i, 0)) { %acc } else { @count(subtract(%i, 1), add(multiply(%acc, 0.5f), 1f)) }
}
def @main(%x: Tensor[(?, 3), float32], %n: int32) { @count(%n, %x) }
"""
MATCH = """
def @main(%x: Tensor[(?, 3), float32]) {
  let %o = Some(%x);
  match (%o) { Some(%y) => add(%y, 1f), None => %x }
}
"""


@pytest.mark.skipif(not build.have_compiler(), reason="no C compiler")
@pytest.mark.parametrize("source, args, mode", [(SOURCE, (), "bytecode"), (LOOP, (np.int32(5),), "native"),
                                                (MATCH, (), "native")])
def test_the_default_exec_mode_is_native_for_control_flow_on_target_c(source, args, mode):
    """``exec_mode="auto"``: native mode for a program with calls or branches (a recursive loop, a match), the
    bytecode loop for a straight-line one, bytecode on target python; explicit modes kept as asked; the
    results the interpreter's either way, also after saving and loading (the file records the mode)."""
    mod = tv.parse(source)
    x = np.arange(6, dtype="float32").reshape(2, 3)
    want = tv.create_executor("debug", mod).evaluate()(x, *args).numpy()
    exe = tv.vm.compile(mod, target="c")
    assert exe.exec_mode == mode == tv.vm.auto_exec_mode(exe)
    assert tv.vm.compile(mod, target="python").exec_mode == "bytecode"
    assert tv.vm.compile(mod, target="c", exec_mode="bytecode").exec_mode == "bytecode"
    assert tv.vm.compile(mod, target="c", exec_mode="native").exec_mode == "native"
    np.testing.assert_allclose(tv.vm.VirtualMachine(exe).invoke("main", x, *args).numpy(), want, rtol=1e-6)


@pytest.mark.skipif(not build.have_compiler(), reason="no C compiler")
def test_an_auto_exec_mode_executable_saves_and_loads_in_its_mode(tmp_path):
    mod = tv.parse(LOOP)
    exe = tv.vm.compile(mod, target="c")
    path = tmp_path / "loop.tvx"
    exe.save(str(path))
    loaded = tv.vm.load_executable(str(path))
    assert loaded.exec_mode == "native"
    x = np.ones((4, 3), "float32")
    want = tv.create_executor("debug", mod).evaluate()(x, np.int32(7)).numpy()
    np.testing.assert_allclose(tv.vm.VirtualMachine(loaded).invoke("main", x, np.int32(7)).numpy(), want, rtol=1e-6)


def test_an_unknown_exec_mode_is_an_error():
    with pytest.raises(UnsupportedError, match="unknown exec_mode 'fast'; expected one of"):
        tv.vm.compile(tv.parse(SOURCE), exec_mode="fast")


@pytest.mark.skipif(not build.have_compiler(), reason="no C compiler")
def test_auto_keeps_bytecode_for_a_program_native_mode_refuses(monkeypatch):
    """A program with control flow that native mode refuses (docs/native_mode.md, "Refused") runs in the
    bytecode loop under ``exec_mode="auto"`` instead of failing to compile: a tensor of rank 17 (read from
    the types), and any refusal of the emitter (here a stand-in for one)."""
    from tensorvm.vm import native_emit

    for first in ("1", "?"):  # (static: the emitter refuses; dynamic: native mode would refuse the call)
        dims = ", ".join([first] + ["1"] * 16)
        mod = tv.parse(f"def @main(%x: Tensor[({dims}), float32], %c: bool) {{ if (%c) {{ add(%x, 1f) }} else {{ %x }} }}")
        exe = tv.vm.compile(mod, target="c")
        assert exe.exec_mode == "bytecode"
        x = np.full((1,) * 17, 2, "float32")
        np.testing.assert_array_equal(tv.vm.VirtualMachine(exe).invoke("main", x, np.bool_(True)).numpy(), x + 1)
        # asked for by name, native mode refuses it when it compiles, a dynamic dim or not
        with pytest.raises(UnsupportedError, match="native mode: a tensor of rank 17 > 16"):
            tv.vm.compile(mod, target="c", exec_mode="native")

    def refuse(exe):
        raise UnsupportedError("native mode: refused for the test")

    monkeypatch.setattr(native_emit, "check_program", refuse)
    loop = tv.parse(LOOP)
    exe = tv.vm.compile(loop, target="c")
    assert exe.exec_mode == "bytecode"
    x = np.ones((2, 3), "float32")
    want = tv.create_executor("debug", loop).evaluate()(x, np.int32(3)).numpy()
    np.testing.assert_allclose(tv.vm.VirtualMachine(exe).invoke("main", x, np.int32(3)).numpy(), want, rtol=1e-6)
