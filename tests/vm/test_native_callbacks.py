"""Native mode runs every program the bytecode VM runs: primitives without a C function (a NumPy kernel,
a Python shape function, the cases a C shape function leaves to Python) are called back in Python from
the C (docs/native_mode.md, "Python callbacks"). Oracle: the interpreter, and the bytecode VM's errors."""

from __future__ import annotations

import numpy as np
import pytest

import tensorvm as tv
from tensorvm.codegen.build import have_compiler
from tensorvm.errors import ExecutionError, ShapeError, UnsupportedError
from tensorvm.op.registry import get_op
from tensorvm.vm import VirtualMachine, load_executable
from tensorvm.vm import bytecode as bc
from tensorvm.vm.executable import Executable

pytestmark = pytest.mark.skipif(not have_compiler(), reason="native mode compiles C (no C compiler here)")

# sin (its TE compute removed below: a NumPy kernel), then dyn.reshape, whose C shape function leaves a
# newshape with -3 (read at run time) to its Python shape function
PROGRAM = """
def @main(%x: Tensor[(?, 3), float32], %s: Tensor[(1), int64]) {
  %0 = sin(%x);
  %1 = add(%0, 1f);
  dyn.reshape(%1, %s)
}"""


@pytest.fixture
def no_c_sin(monkeypatch):
    """``sin`` without a tensor-expression compute: its fused group becomes a NumPy kernel."""
    monkeypatch.setattr(get_op("sin"), "compute", None)


def _compile(mode: str, text: str = PROGRAM):
    return tv.vm.compile(tv.parse(text), target="c", exec_mode=mode)


def _oracle(x, s, text: str = PROGRAM):
    return tv.create_executor("debug", tv.parse(text)).evaluate()(x, s).numpy()


CALLS = [(4, [12]), (4, [-3]), (6, [-1]), (5, [-3]), (4, [-3])]  # new shapes, deferred cases, repeats


def _check_calls(vm):
    rng = np.random.default_rng(7)
    for n, s in CALLS:
        x, s = rng.standard_normal((n, 3)).astype("float32"), np.array(s, "int64")
        np.testing.assert_allclose(vm.run(x, s).numpy(), _oracle(x, s), rtol=1e-6, atol=1e-6)


def test_numpy_kernel_and_deferred_shape_function_run_natively(no_c_sin):
    exe = _compile("native")
    callbacks = exe.stats()["kernel_library"]["native_python_callbacks"]
    assert any("fused_sin" in why and "no C function" in why for why in callbacks.values()), callbacks
    assert any("reshape" in why and "leaves some cases" in why for why in callbacks.values()), callbacks
    vm = VirtualMachine(exe)
    _check_calls(vm)
    stats = vm.exec_stats()
    assert stats["exec_mode"] == "native" and stats["calls"]["generic"] == len(CALLS)
    # one sin call per run, and one Python shape function call per run with -3 in the newshape
    assert stats["python_callbacks"] == len(CALLS) + sum(-3 in s for _, s in CALLS)


def test_after_save_and_load(no_c_sin):
    loaded = load_executable(_compile("native").save_bytes())
    assert loaded.exec_mode == "native"
    _check_calls(VirtualMachine(loaded))


def test_python_shape_function_runs_natively(monkeypatch):
    """An op whose shape logic does not trace keeps a Python shape function: called back from the C."""
    monkeypatch.setattr(get_op("dyn.reshape"), "shape_logic_traceable", False)
    exe = _compile("native")
    callbacks = exe.stats()["kernel_library"]["native_python_callbacks"]
    assert any("a Python shape function" in why for why in callbacks.values()), callbacks
    _check_calls(VirtualMachine(exe))


def _errors(x, s):
    out = []
    for mode in ("bytecode", "native"):
        with pytest.raises(Exception) as info:
            VirtualMachine(_compile(mode)).run(x, s)
        out.append(info.value)
    return out


def test_an_exception_of_a_python_kernel_is_the_bytecode_vm_s(monkeypatch):
    def sin(attrs, x):
        if (x < 0).any():
            raise ValueError("negative input to this sin")
        return np.sin(x)

    monkeypatch.setattr(get_op("sin"), "compute", None)
    monkeypatch.setattr(get_op("sin"), "kernel", sin)
    expected, got = _errors(-np.ones((2, 3), "float32"), np.array([6], "int64"))
    assert type(got) is type(expected) is ExecutionError
    assert str(got) == str(expected)
    assert "negative input to this sin" in str(got) and "in VM function 'main'" in str(got)
    assert isinstance(got.__cause__, ValueError)
    vm = VirtualMachine(_compile("native"))  # (the runtime is usable after the error)
    x = np.ones((2, 3), "float32")
    np.testing.assert_allclose(vm.run(x, np.array([6], "int64")).numpy(), _oracle(x, np.array([6], "int64")),
                               rtol=1e-6)


@pytest.mark.parametrize("newshape", [[5], [-2]])
def test_a_shape_function_error_is_the_bytecode_vm_s(no_c_sin, newshape):
    """A C shape function's failure runs the Python one, which raises the bytecode VM's precise error."""
    expected, got = _errors(np.ones((4, 3), "float32"), np.array(newshape, "int64"))
    assert type(got) is type(expected) is ShapeError
    assert str(got) == str(expected)


def test_the_standalone_aot_library_refuses_a_program_needing_python(no_c_sin):
    from tensorvm.aot.dynamic import build_dynamic

    with pytest.raises(UnsupportedError, match=r"without Python.*fused_sin.*no C function"):
        build_dynamic(tv.parse(PROGRAM), name="needs_python")


def test_integer_registers_that_also_hold_values_are_boxed():
    """LoadConsti/GetTag into a register also read as a value (a copy, a return): a 0-d int64 tensor,
    compared and used like the bytecode VM's Python int."""
    x = np.arange(3, dtype="int32")
    copied = bc.VMFunction("main", ("x",), (bc.LoadConsti(3, 1), bc.DeviceCopy(1, 0, 0, 2), bc.Ret(0)), 3)
    # $3 is the integer 7 when c == 7, else c; then compared with 7
    mixed = bc.VMFunction("main", ("x", "c"), (
        bc.LoadConsti(7, 2),
        bc.If(1, 2, 3, 1),        # 1: c == 7 ?
        bc.Move(1, 3),            # 2: (no) $3 = c
        bc.Goto(2),
        bc.Move(2, 3),            # 4: (yes) $3 = 7 (an integer into a value register)
        bc.If(3, 2, 1, 2),        # 5: $3 == 7 ?
        bc.Ret(0),                # 6: (yes) x
        bc.Ret(1),                # 7: (no) c
    ), 4)
    for fn, args in ((copied, (x,)), (mixed, (x, np.array(7, "int32"))), (mixed, (x, np.array(2, "int32")))):
        want = VirtualMachine(Executable([fn], exec_mode="bytecode", target="c")).run(*args)
        got = VirtualMachine(Executable([fn], exec_mode="native", target="c")).run(*args)
        np.testing.assert_array_equal(got.numpy(), want.numpy())


def test_profile_counts_callbacks_as_the_bytecode_vm_counts_their_calls(no_c_sin):
    exe = _compile("native")
    x, s = np.ones((4, 3), "float32"), np.array([-3], "int64")
    report = VirtualMachine(exe).profile("main", x, s)
    reference = VirtualMachine(exe.with_exec_mode("bytecode")).profile("main", x, s)

    def calls(r):
        return {row.name: row.calls for row in r.rows if row.kind == "kernel"}
    assert calls(report) == calls(reference)
    assert any("sin" in name for name in calls(report)), calls(report)
    np.testing.assert_allclose(report.result.numpy(), _oracle(x, s), rtol=1e-6)
