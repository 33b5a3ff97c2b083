"""A specialized body's preset registers (``vm/specialize.py``) keep the values the shape slice computed for
as long as they are preset, whatever bytes the memory planner lets tensors share: issue 16, defects 1 and 6.

The two programs put shape-determined tensors in storages whose bytes later tensors reuse (A: the body's
``nn.dense(%w, %w)`` takes the bytes of ``%d``; B: two tensors of the slice share bytes). Oracles: the
debug interpreter and NumPy, on every call (generic, specializing, specialized; new shapes and old ones in
turns), with every earlier result kept and re-checked after the later calls."""

from __future__ import annotations

import numpy as np
import pytest

import tensorvm as tv
from tensorvm.vm import VirtualMachine
from tensorvm.vm import bytecode as bc

SHARED_WITH_BODY = """
def @main(%x: Tensor[(?, 2), float32], %w: Tensor[(2, 2), float32]) -> Tensor[(?, 2), float32] {
  %d = cast(shape_of(%x, dtype="int64"), dtype="float32");
  %e = nn.dense(expand_dims(%d, axis=0), %w);
  %t = nn.dense(%w, %w);
  add(%x, sum(add(%t, %e), axis=[0]))
}"""

SHARED_IN_SLICE = """
def @main(%x: Tensor[(?, 2), float32]) -> Tensor[(?, 1), float32] {
  %W = expand_dims(cast(shape_of(%x, dtype="int64"), dtype="float32"), axis=0);
  %e = nn.dense(%x, %W);
  add(%e, sum(cast(shape_of(%e, dtype="int64"), dtype="float32")))
}"""

RNG = np.random.default_rng(16)
W = RNG.standard_normal((2, 2)).astype("float32")


def _args(name: str, rows: int) -> tuple:
    x = RNG.standard_normal((rows, 2)).astype("float32")
    return (x, W) if name == "body" else (x,)


def _numpy(name: str, args: tuple) -> np.ndarray:
    """What each program computes, written with NumPy."""
    x = args[0]
    d = np.array(x.shape, "float32")
    if name == "body":
        w = args[1]
        return x + (w @ w.T + (d[None, :] @ w.T)).sum(axis=0)
    e = x @ d[None, :].T
    return e + np.float32(sum(e.shape))


PROGRAMS = {"body": SHARED_WITH_BODY, "slice": SHARED_IN_SLICE}
ROWS = (3, 3, 3, 3, 5, 5, 5, 3, 5, 7, 3, 7, 7)  # >= 4 calls of a shape, new shapes, old ones again


def _executable(text: str, target: str, mode: str, saved: bool):
    exe = tv.vm.compile(tv.transform.InferType()(tv.parse(text)), target=target, exec_mode=mode)
    return tv.vm.load_executable(exe.save_bytes()) if saved else exe


def _check_calls(vm, name: str, mod) -> None:
    interpreter = tv.create_executor("debug", mod).evaluate()
    kept = []
    for i, rows in enumerate(ROWS):
        args = _args(name, rows)
        want = _numpy(name, args)
        np.testing.assert_allclose(interpreter(*args).numpy(), want, rtol=1e-5, atol=1e-5)  # the oracles agree
        got = vm["main"](*args).numpy()
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5, err_msg=f"call {i} (rows {rows})")
        kept.append((got, want.copy()))
        for j, (old, old_want) in enumerate(kept):
            np.testing.assert_allclose(old, old_want, rtol=1e-5, atol=1e-5,
                                       err_msg=f"the result of call {j} changed after call {i}")


@pytest.mark.parametrize("saved", [False, True], ids=["fresh", "saved"])
# (on target "c" exec mode "compiled" is native mode, which does not specialize: docs/native_mode.md)
@pytest.mark.parametrize(("target", "mode"), [("python", "bytecode"), ("python", "compiled"), ("c", "bytecode")])
@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_preset_values_are_not_overwritten_by_tensors_sharing_their_bytes(name, target, mode, saved):
    text = PROGRAMS[name]
    vm = VirtualMachine(_executable(text, target, mode, saved))
    _check_calls(vm, name, tv.transform.InferType()(tv.parse(text)))
    info = vm._function("main")
    assert info.shape_slice is not None and len(info.specialized) == 3  # the fix keeps the specialization


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_preset_tensors_have_memory_of_their_own(name):
    """Every tensor a specialized body gets preset shares no byte with another preset tensor, nor with a
    tensor the body makes or returns."""
    vm = VirtualMachine(tv.vm.compile(tv.transform.InferType()(tv.parse(PROGRAMS[name]))))
    args = _args(name, 4)
    vm["main"](*args)
    vm["main"](*args)
    info = vm._function("main")
    (body,) = info.specialized.values()
    presets = {reg: body.tail[reg - len(info.params)] for reg in info.shape_slice.preset}
    code = vm.exe.functions[info.index].instructions
    arrays = {reg: v for reg, v in presets.items() if isinstance(v, np.ndarray) and v.size}
    computed = {r for pc in info.shape_slice.slice_pcs if isinstance(code[pc], bc.InvokePacked)
                for r in code[pc].outputs if r in arrays}  # (shapes kept as tuples aside)
    assert computed  # the shape-determined tensors of these programs

    views = {reg: {reg} for reg in computed}  # a computed tensor and its reshapes
    for ins in code:
        if isinstance(ins, bc.ReshapeTensor):
            for group in views.values():
                if ins.tensor in group:
                    group.add(ins.dst)
    for reg in computed:
        for other, value in arrays.items():
            if other not in views[reg]:
                assert not np.shares_memory(arrays[reg], value), f"presets ${reg} and ${other} share bytes"
    result = vm["main"](*args).numpy()
    assert not any(np.shares_memory(result, arrays[r]) for r in computed)


@pytest.mark.parametrize("how", ["option", "environment"])
def test_specialization_can_be_switched_off(how, monkeypatch):
    """``VirtualMachine(exe, specialize=False)`` or ``TENSORVM_SPECIALIZE=0``: every call runs the generic
    code (no slice, no arena), with the same answers."""
    if how == "environment":
        monkeypatch.setenv("TENSORVM_SPECIALIZE", "0")
    exe = tv.vm.compile(tv.transform.InferType()(tv.parse(SHARED_WITH_BODY)))
    vm = VirtualMachine(exe, specialize=False) if how == "option" else VirtualMachine(exe)
    _check_calls(vm, "body", tv.transform.InferType()(tv.parse(SHARED_WITH_BODY)))
    info = vm._function("main")
    assert info.shape_slice is None and not info.specialized
    assert vm.exec_stats()["calls"]["specialized"] == 0
    monkeypatch.setenv("TENSORVM_SPECIALIZE", "1")
    assert VirtualMachine(exe)._function("main").shape_slice is not None


@pytest.mark.parametrize("target", ["python"])  # (on target "c", exec mode "compiled" is native mode)
def test_compiled_mode_runs_generated_code_for_specialized_bodies(target, monkeypatch):
    """Defect 6: in compiled exec mode, a specialized body runs as generated code, not in the dispatch loop.
    Proof independent of the VM's own counters: the dispatch loop (``_run``) is entered once per new
    specialization (the slice) and never for a call."""
    vm = VirtualMachine(_executable(SHARED_WITH_BODY, target, "compiled", saved=False))
    loop_runs = []
    original = VirtualMachine._run
    monkeypatch.setattr(VirtualMachine, "_run", lambda self, info, args: (loop_runs.append(info), original(
        self, info, args))[1])
    _check_calls(vm, "body", tv.transform.InferType()(tv.parse(SHARED_WITH_BODY)))
    info = vm._function("main")
    assert len(loop_runs) == len(info.specialized) == 3  # one slice per specialized shape, nothing else
    stats = vm.exec_stats()
    assert stats["exec_mode"] == "compiled"
    assert stats["calls"] == {"generic": 3, "specialized": len(ROWS) - 3}  # a shape's first call is generic
    assert stats["specialized_runs_in"] == "compiled code"
    bytecode = VirtualMachine(_executable(SHARED_WITH_BODY, target, "bytecode", saved=False))
    for _ in range(3):
        bytecode["main"](*_args("body", 3))
    assert bytecode.exec_stats()["specialized_runs_in"] == "dispatch loop"
    assert bytecode.exec_stats()["calls"] == {"generic": 1, "specialized": 2}


def test_the_compiled_body_reports_errors_at_their_instruction(monkeypatch):
    """A kernel failing inside a compiled specialized body is located like any compiled-mode error."""
    vm = VirtualMachine(_executable(SHARED_WITH_BODY, "python", "compiled", saved=False))
    args = _args("body", 3)
    for _ in range(3):
        vm["main"](*args)
    assert vm.exec_stats()["calls"]["specialized"] == 2
    kernels = vm._compiled["plain"][0].__globals__
    last = [ins for ins in vm.exe.functions[0].instructions if isinstance(ins, bc.InvokePacked)][-1]
    name = f"K{last.packed_index}"  # the kernel computing the result: part of the body

    def boom(*_):
        raise ZeroDivisionError("kernel failed")

    monkeypatch.setitem(kernels, name, boom)
    with pytest.raises(Exception, match="main") as caught:
        vm["main"](*args)
    assert "kernel failed" in str(caught.value)



def test_no_specialization_when_a_kernel_writes_into_something_it_did_not_allocate():
    """Kernels write into allocated tensors (what the compiler emits). In hand-made bytecode a kernel may
    write into a view of a shape-determined tensor (here $7 of $6): that would write into a preset value,
    so such a function runs generically."""
    from tensorvm.ir.types import TensorType
    from tensorvm.vm.specialize import shape_slice

    def function(output: int):
        code = (bc.LoadConst(0, 1), bc.ShapeOf(0, 2), bc.LoadConsti(64, 3), bc.AllocStorage(3, 64, "int64", 4),
                bc.LoadConsti(0, 5), bc.AllocTensor(4, 5, (2,), "int64", 6), bc.InvokePacked(0, 2, 1, (2, 6)),
                bc.ReshapeTensor(6, 1, 7), bc.InvokePacked(1, 2, 1, (0, output)),
                bc.AllocStorage(3, 64, "int64", 8), bc.AllocTensor(8, 5, (2,), "int64", 9),
                bc.InvokePacked(2, 3, 1, (6, 7, 9)), bc.Ret(9))
        return bc.VMFunction("main", ("x",), code, 10, (TensorType((3, 2), "float32"),))

    assert shape_slice(function(7)) is None
    plan = shape_slice(function(6))  # $6 written by two kernels: not shape-determined, an arena tensor
    assert 6 not in plan.slice_pcs and 6 not in plan.body_skip  # its first kernel runs on every call
