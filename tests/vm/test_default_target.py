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


@pytest.mark.parametrize("chosen", ["python", "c"])
def test_the_environment_variable_chooses(monkeypatch, chosen):
    monkeypatch.setenv("TENSORVM_TARGET", chosen)
    assert build.default_target() == chosen and "TENSORVM_TARGET" in build.default_target_reason()


def test_an_unknown_target_in_the_environment_is_an_error(monkeypatch):
    monkeypatch.setenv("TENSORVM_TARGET", "gpu")
    with pytest.raises(UnsupportedError, match="'c' or 'python', got 'gpu'"):
        tv.vm.compile(tv.parse(SOURCE))
