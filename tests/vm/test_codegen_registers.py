"""Register lifetimes in the emitted bytecode: no instruction reads a register that a ``KillRegister`` has
emptied on some path to it.

Regression for the fields of a tuple returned by a data-dependent op (unique, topk with a run-time k):
``ManifestLifetimes`` kills the field tensors right after the tuple is built (the tuple still holds
them), and the code generator used to compile ``%t.0`` and tuple kernel arguments as reads of those
killed field registers.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from programs import PROGRAMS  # noqa: E402

import tensorvm as tv  # noqa: E402
from tensorvm.codegen.build import have_compiler  # noqa: E402
from tensorvm.vm import VirtualMachine  # noqa: E402
from tensorvm.vm import bytecode as bc  # noqa: E402

MODES = ["bytecode", "compiled"]


def reads_after_kill(fn: bc.VMFunction) -> list[tuple[int, str, int]]:
    """``(pc, instruction, register)`` for every read of a register killed on some path to ``pc``.

    A forward data-flow pass; the code generator emits forward jumps only."""
    code = fn.instructions
    killed_at: dict[int, frozenset] = {0: frozenset()}
    bad = []
    for pc, ins in enumerate(code):
        if pc not in killed_at:
            continue  # unreachable
        killed = killed_at[pc]
        bad += [(pc, str(ins), reg) for reg in ins.reads() if reg in killed]
        if isinstance(ins, bc.KillRegister):
            killed = killed | {ins.dst}
        else:
            killed = killed - set(ins.writes())
        if isinstance(ins, bc.If):
            successors = [pc + ins.true_offset, pc + ins.false_offset]
        elif isinstance(ins, bc.Goto):
            successors = [pc + ins.pc_offset]
        elif isinstance(ins, (bc.Ret, bc.Fatal)):
            successors = []
        else:
            successors = [pc + 1]
        for nxt in successors:
            assert nxt > pc, f"{fn.name}: backward jump at pc {pc}"
            killed_at[nxt] = killed_at.get(nxt, frozenset()) | killed
    return bad


def test_the_checker_finds_a_read_of_a_killed_register():
    fn = bc.VMFunction("f", ("x",), (bc.Move(0, 1), bc.KillRegister(0), bc.Move(1, 2), bc.Move(0, 3),
                                     bc.Ret(3)), 4, (None,), None)
    assert reads_after_kill(fn) == [(3, "move $3 $0", 0)]
    branchy = bc.VMFunction("g", ("c",), (
        bc.LoadConsti(1, 1),
        bc.If(0, 1, 1, 3),
        bc.KillRegister(0),  # only on the true path
        bc.Goto(2),
        bc.LoadConsti(0, 2),
        bc.Ret(0),  # reached by both paths: the read is flagged
    ), 3, (None,), None)
    assert [pc for pc, _, _ in reads_after_kill(branchy)] == [5]


@pytest.mark.parametrize("program", PROGRAMS, ids=[p.name for p in PROGRAMS])
def test_no_program_reads_a_killed_register(program):
    exe = tv.vm.compile(tv.parse(program.text))
    for fn in exe.functions:
        assert reads_after_kill(fn) == [], f"{program.name}: @{fn.name}\n{exe.as_text()}"


def _topk_largest(x, k):
    order = np.argsort(-x, kind="stable")[:k]
    return x[order], order.astype("int32")


# (text, args, NumPy answer)
DATA_DEPENDENT_TUPLES = {
    "unique_field_feeds_add": (
        "def @main(%x: Tensor[(?), int32]) { %u = unique(%x); add(%u.0, 1) }",
        (np.array([3, 1, 3, 2], "int32"),),
        lambda x: np.unique(x) + 1),
    "topk_field_feeds_transpose": (
        "def @main(%x: Tensor[(?, 4), float32]) { %0 = topk(%x, k=2, axis=-1); transpose(%0.0, axes=[1, 0]) }",
        (np.array([[1, 5, 2, 4], [9, 0, 7, 8], [3, 3, 6, 1]], "float32"),),
        lambda x: -np.sort(-x, axis=-1)[:, :2].T),
    "topk_runtime_k_both_fields": (
        'def @main(%x: Tensor[(?), float32], %k: int32) { %t = topk(%x, %k); add(%t.0, cast(%t.1, dtype="float32")) }',
        (np.array([1, 5, 2, 4, 0.5], "float32"), np.int32(3)),
        lambda x, k: (lambda v, i: v + i.astype("float32"))(*_topk_largest(x, int(k)))),
    "fields_used_in_both_branches_and_after": (
        """def @main(%x: Tensor[(?), int32], %c: bool) {
  %u = unique(%x);
  %r = if (%c) { add(%u.0, 1) } else { multiply(%u.0, 2) };
  (%r, add(%u.0, 10))
}""",
        (np.array([4, 4, 2, 9, 2], "int32"), np.bool_(False)),
        lambda x, c: (np.unique(x) + 1 if c else np.unique(x) * 2, np.unique(x) + 10)),
    "field_of_a_nested_tuple": (
        "def @main(%x: Tensor[(?), int32]) { %u = unique(%x); %t = (%u, %x); add(%t.0.0, %t.0.0) }",
        (np.array([7, 7, 1], "int32"),),
        lambda x: np.unique(x) * 2),
}


# target "c": the ONNX LSTM failed there with "argument p0_0 must be a NumPy array, got NoneType"
TARGETS = ["python", pytest.param("c", marks=pytest.mark.skipif(not have_compiler(), reason="no C compiler"))]


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", sorted(DATA_DEPENDENT_TUPLES))
def test_fields_of_a_data_dependent_tuple(name, mode, target):
    text, args, oracle = DATA_DEPENDENT_TUPLES[name]
    exe = tv.vm.compile(tv.parse(text), exec_mode=mode, target=target)
    for fn in exe.functions:
        assert reads_after_kill(fn) == [], exe.as_text()
    variants = [args]
    if name == "fields_used_in_both_branches_and_after":
        variants.append((args[0], np.bool_(True)))
    for variant in variants:
        got = VirtualMachine(exe).invoke("main", *variant)
        want = oracle(*variant)
        got, want = (got, want) if isinstance(want, tuple) else ((got,), (want,))
        assert len(got) == len(want)
        for g, w in zip(got, want, strict=True):
            np.testing.assert_allclose(g.numpy(), w, rtol=1e-6)
            assert g.numpy().dtype == np.asarray(w).dtype
