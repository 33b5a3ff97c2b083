"""Every program of the shared suite on the VM: both targets (NumPy kernels, and C kernels when a C compiler
is present), both exec modes, with and without a save/load round trip, compared with the interpreter and
with the program's independent NumPy answer."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from programs import PROGRAMS, check_result  # noqa: E402

import tensorvm as tv  # noqa: E402
from tensorvm.codegen.build import have_compiler  # noqa: E402
from tensorvm.errors import UnsupportedError  # noqa: E402
from tensorvm.interpreter import Interpreter  # noqa: E402
from tensorvm.runtime.ndarray import NDArray  # noqa: E402
from tensorvm.runtime.object import ADT  # noqa: E402
from tensorvm.vm import VirtualMachine, load_executable  # noqa: E402

_COMPILED: dict = {}



#: Programs that give wrong answers on target "c" for a reason outside the VM.
C_KNOWN_FAILURES: dict = {
    # (empty: gcc 12 had miscompiled the dynamic concatenate of if_branches_differ_in_shape under
    # ``omp parallel for ... if(cond)``; kernels now choose between a parallel and a serial loop in C,
    # and test_target_c.py checks that kernel at sizes on both sides of the choice)
}


def _executable(program, target: str, mode: str, round_trip: bool):
    """One compile per program and target; the other exec mode shares its kernels."""
    key = (program.name, target, mode, round_trip)
    if key not in _COMPILED:
        if round_trip:
            _COMPILED[key] = load_executable(_executable(program, target, mode, False).save_bytes())
        elif mode != "bytecode":
            _COMPILED[key] = _executable(program, target, "bytecode", False).with_exec_mode(mode)
        else:
            _COMPILED[key] = tv.vm.compile(program.parse(), target=target, exec_mode=mode)
    return _COMPILED[key]


def assert_same_value(vm_value, reference, path="result", rtol=1e-5, atol=1e-6):
    """The VM's user value equals the interpreter's: same structure, dtypes, shapes and values."""
    if isinstance(reference, tuple):
        assert isinstance(vm_value, tuple) and len(vm_value) == len(reference), f"{path}: {vm_value!r}"
        for i, (a, b) in enumerate(zip(vm_value, reference)):
            assert_same_value(a, b, f"{path}.{i}", rtol, atol)
    elif isinstance(reference, ADT):
        assert isinstance(vm_value, ADT), f"{path}: expected an ADT, got {type(vm_value).__name__}"
        assert (vm_value.tag, vm_value.constructor) == (reference.tag, reference.constructor), path
        assert len(vm_value.fields) == len(reference.fields), path
        for i, (a, b) in enumerate(zip(vm_value.fields, reference.fields)):
            assert_same_value(a, b, f"{path}.{reference.constructor}[{i}]", rtol, atol)
    elif isinstance(reference, (np.ndarray, np.generic, NDArray)):
        assert isinstance(vm_value, NDArray), f"{path}: expected an NDArray, got {type(vm_value).__name__}"
        got, want = vm_value.numpy(), np.asarray(reference)
        assert got.dtype == want.dtype and got.shape == want.shape, f"{path}: {got.dtype}{got.shape} vs " \
                                                                    f"{want.dtype}{want.shape}"
        if want.dtype.kind == "f":
            np.testing.assert_allclose(got, want, rtol=rtol, atol=atol, err_msg=path)
        else:
            np.testing.assert_array_equal(got, want, err_msg=path)
    else:  # closures: only check that one came back
        assert not isinstance(vm_value, (NDArray, tuple, ADT)), f"{path}: {vm_value!r} vs {reference!r}"


#: Programs the native exec mode refuses when compiled (``UnsupportedError``), and why; the test asserts the
#: refusal, so a program leaves this list when native mode learns what it needs.
NATIVE_REFUSED: dict = {}


_NO_CC = pytest.mark.skipif(not have_compiler(), reason="no C compiler")
#: (target, exec mode) pairs: native mode compiles the VM functions to C, so it exists for target "c" only,
#: where exec mode "compiled" is native mode (executable.resolve_exec_mode: not run twice here).
TARGET_MODES = [pytest.param("python", mode, id=f"python-{mode}") for mode in ("bytecode", "compiled")] + \
    [pytest.param("c", mode, id=f"c-{mode}", marks=_NO_CC) for mode in ("bytecode", "native")]


@pytest.mark.parametrize("round_trip", [False, True], ids=["memory", "saved"])
@pytest.mark.parametrize(("target", "mode"), TARGET_MODES)
@pytest.mark.parametrize("program", PROGRAMS, ids=[p.name for p in PROGRAMS])
def test_program_on_vm(program, target, mode, round_trip, request):
    if mode == "native" and program.name in NATIVE_REFUSED:
        with pytest.raises(UnsupportedError, match=NATIVE_REFUSED[program.name]):
            _executable(program, target, mode, round_trip).kernels  # noqa: B018
        return
    if target == "c" and program.name in C_KNOWN_FAILURES:
        request.applymarker(pytest.mark.xfail(reason=C_KNOWN_FAILURES[program.name], strict=False))
    mod = program.parse()
    exe = _executable(program, target, mode, round_trip)
    vm = VirtualMachine(exe)
    assert vm.exec_stats()["exec_mode"] == mode
    args = program.args_fn()
    if program.error:
        kind, fragment = program.error
        with pytest.raises(kind) as info:
            vm.invoke(program.entry, *args)
        if fragment:
            assert re.search(fragment, str(info.value)), str(info.value)
        assert "pc" in str(info.value)  # the VM location is in the message
        return
    result = vm.invoke(program.entry, *args)
    reference = Interpreter(mod).run(program.entry, *args)
    assert_same_value(result, reference, rtol=program.rtol, atol=program.atol)
    if program.expected_fn is not None:
        check_result(result, program.expected_fn(*args), mod, program.rtol, program.atol)
    # the same VM runs again (pooled memory reused) with the same answer
    assert_same_value(vm.invoke(program.entry, *args), reference, rtol=program.rtol, atol=program.atol)
