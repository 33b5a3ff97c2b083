"""The bytecode VM's decoded form (docs/vm.md): one table of handlers (``vm/decoded.py``), each naming the
bytecode opcode it runs; the dispatch loop has a branch per handler; decoded code is shown by
``VirtualMachine.disassemble``. Results are checked against the interpreter."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import numpy as np
import pytest

import tensorvm as tv
from tensorvm.errors import ExecutionError, UnsupportedError
from tensorvm.vm import VirtualMachine
from tensorvm.vm import bytecode as bc
from tensorvm.vm import decoded as D
from tensorvm.vm.executable import Executable
from tensorvm.vm.vm import VirtualMachine as _VM

ROOT = Path(__file__).resolve().parents[2]

PROGRAMS = {
    "dynamic": ("""
def @main(%x: Tensor[(?, 6), float32], %w: Tensor[(5, 6), float32]) { nn.relu(nn.dense(%x, %w)) }
""", lambda: (np.arange(18, dtype="float32").reshape(3, 6) / 9, np.ones((5, 6), "float32"))),
    "static": ("""
def @main(%x: Tensor[(2, 8), float32], %w: Tensor[(4, 8), float32]) { nn.softmax(nn.dense(tanh(%x), %w)) }
""", lambda: (np.linspace(-1, 1, 16, dtype="float32").reshape(2, 8), np.ones((4, 8), "float32"))),
    "loop": ("""
def @loop(%i: int32, %acc: int32) -> int32 {
  if (equal(%i, 0)) { %acc } else { @loop(subtract(%i, 1), add(%acc, %i)) }
}
def @main(%n: int32) -> int32 { @loop(%n, 0) }
""", lambda: (np.int32(20),)),
    "adt": ("""
def @main(%x: float32, %y: float32) {
  let %xs = Cons(%x, Cons(%y, Nil));
  let %ys = @map(fn (%v: float32) -> float32 { multiply(%v, 2f) }, %xs);
  (@foldl(fn (%a: float32, %v: float32) -> float32 { add(%a, %v) }, 0f, %ys), %x)
}
""", lambda: (np.float32(1.5), np.float32(-2.0))),
    "reshape": ("""
def @main(%x: Tensor[(?, 4), float32]) { reshape(add(%x, %x), newshape=[-1]) }
""", lambda: (np.arange(12, dtype="float32").reshape(3, 4),)),
}


def test_the_table_names_every_handler_once_and_numbers_it_as_the_module_does():
    names = [f.name for f in D.FORMS]
    assert len(set(names)) == len(names)
    for number, form in enumerate(D.FORMS):
        assert getattr(D, form.name) == number, form.name
    opcodes = {op.name for op in bc.Opcode}
    assert set(D.by_opcode()) == opcodes  # every bytecode opcode has a handler, and no handler runs anything else
    for form in D.FORMS:
        assert set(form.opcodes) <= opcodes and 1 <= len(form.opcodes) <= 2


def test_the_dispatch_loop_has_a_labelled_branch_per_handler():
    source = inspect.getsource(_VM._run)
    for form in D.FORMS:
        label = re.compile(rf"#[^\n]*\b{form.name}\b")
        assert label.search(source), f"no branch labelled {form.name} in the dispatch loop"
    tested = re.findall(r"op == (\d+):  #([^\n]*)", source)
    assert len(tested) > 20
    for number, comment in tested:  # a branch testing a number is labelled with that handler's name
        assert re.search(rf"\b{D.FORMS[int(number)].name}\b", comment), (number, comment)


def test_the_docs_hold_the_table():
    assert D.markdown_table() in (ROOT / "docs" / "vm.md").read_text()


@pytest.mark.parametrize("target", ["python", "c"])
@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_decoded_programs_are_well_formed_and_match_the_interpreter(name, target):
    if target == "c":
        from tensorvm.codegen.build import have_compiler

        if not have_compiler():
            pytest.skip("no C compiler on this machine")
    text, args = PROGRAMS[name]
    mod = tv.parse(text)
    vm = VirtualMachine(tv.vm.compile(mod, target=target))
    want = tv.create_executor("debug", mod).evaluate()(*args())
    for _ in range(3):  # the third call runs the body specialized to the shapes (decoded again)
        got = vm.run(*args())
        for g, w in zip(got if isinstance(got, tuple) else (got,), want if isinstance(want, tuple) else (want,)):
            np.testing.assert_allclose(np.asarray(g.numpy() if hasattr(g, "numpy") else g),
                                       np.asarray(w.numpy() if hasattr(w, "numpy") else w), rtol=1e-5, atol=1e-6)
    for info in vm._funcs:
        D.check(info.code)
        assert len(info.pcs) == len(info.code)
        for body in info.specialized.values():
            D.check(body.code)


def test_disassemble_names_handler_operands_and_bytecode():
    text, _ = PROGRAMS["dynamic"]
    exe = tv.vm.compile(tv.parse(text))
    vm = VirtualMachine(exe)
    lines = vm.disassemble("main").splitlines()
    assert len(lines) == len(vm._funcs[0].code)
    fn = exe.function("main")
    for line, ins, pc in zip(lines, vm._funcs[0].code, vm._funcs[0].pcs):
        assert line.split()[1] == D.FORMS[ins[0]].name
        assert line.endswith(f"pc {pc}: {fn.instructions[pc]}")
    assert any("kernel=fused_nn_dense_nn_relu(kernel)" in line or "(kernel)" in line for line in lines)
    with pytest.raises(UnsupportedError, match="as_python"):
        VirtualMachine(exe.with_exec_mode("compiled")).disassemble("main")
    with pytest.raises(ExecutionError, match="no function"):
        vm.disassemble("nope")


def test_check_rejects_a_malformed_decoded_instruction():
    D.check(((D.MOVE, 1, 0), (D.RET, 1)))
    with pytest.raises(ValueError, match="MOVE takes 2 operands"):
        D.check(((D.MOVE, 1),))
    with pytest.raises(ValueError, match="names no handler"):
        D.check(((len(D.FORMS), 1),))


def test_device_copy_decodes_to_a_move_with_the_same_value():
    fn = bc.VMFunction("main", ("x",), (bc.DeviceCopy(0, 0, 0, 1), bc.Ret(1)), 2)
    vm = VirtualMachine(Executable([fn], kernel_overrides=[]))
    assert [D.FORMS[i[0]].name for i in vm._funcs[0].code] == ["MOVE", "RET"]
    x = np.arange(4, dtype="float32")
    np.testing.assert_array_equal(vm.run(x).numpy(), x)
