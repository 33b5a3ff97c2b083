"""update_in_place: a recursive loop's buffer filled by ``scatter_nd`` is updated in place only when the
loop owns it; every program is compared with the interpreter (and the lowered-code evaluator), so an
update run in place where someone still reads the old buffer shows up as a wrong value."""

from __future__ import annotations

import numpy as np
import pytest
from lowered_eval import LoweredEvaluator, assert_same, interpret, parse

import tensorvm as tv
from tensorvm.errors import FormatError
from tensorvm.ir.analysis import post_order
from tensorvm.ir.expr import Call, GlobalVar
from tensorvm.transform.pass_infra import Sequential
from tensorvm.transform.update_in_place import in_place_updates
from tensorvm.transform.vm_pipeline import vm_passes
from tensorvm.vm import bytecode as bc

FILL = """
def @fill(%t: int64, %n: int64, %x: Tensor[(?, 3), float32], %acc: Tensor[(?, 3), float32]) -> Tensor[(?, 3), float32] {
  if (less(%t, %n)) {
    let %row = multiply(take(%x, %t, axis=0, mode="clip"), 2f);
    let %next = scatter_nd(%acc, expand_dims(%t, axis=0), %row);
    @fill(add(%t, 1i64), %n, %x, %next)
  } else {
    %acc
  }
}
"""

# The loop owns a fresh buffer: updated in place.
OWNED = FILL + """
def @main(%x: Tensor[(?, 3), float32]) -> Tensor[(?, 3), float32] {
  let %n = take(shape_of(%x, dtype="int64"), 0i64);
  @fill(0i64, %n, %x, dyn.zeros(shape_of(%x, dtype="int64"), dtype="float32"))
}
"""

# The caller reads its buffer after the loop: the update must copy.
READ_AFTER = FILL + """
def @main(%x: Tensor[(?, 3), float32]) -> (Tensor[(?, 3), float32], Tensor[(?, 3), float32]) {
  let %n = take(shape_of(%x, dtype="int64"), 0i64);
  let %buf = dyn.zeros(shape_of(%x, dtype="int64"), dtype="float32");
  (@fill(0i64, %n, %x, %buf), %buf)
}
"""

# One buffer given to two loops: the update must copy.
TWICE = FILL + """
def @main(%x: Tensor[(?, 3), float32]) -> Tensor[(?, 3), float32] {
  let %n = take(shape_of(%x, dtype="int64"), 0i64);
  let %buf = dyn.zeros(shape_of(%x, dtype="int64"), dtype="float32");
  add(@fill(0i64, %n, %x, %buf), @fill(0i64, %n, %x, %buf))
}
"""

# The step reads its old buffer after the next step returns (same path): the update must copy.
OLD_READ_IN_STEP = """
def @fill(%t: int64, %n: int64, %x: Tensor[(?, 3), float32], %acc: Tensor[(?, 3), float32]) -> Tensor[(?, 3), float32] {
  if (less(%t, %n)) {
    let %next = scatter_nd(%acc, expand_dims(%t, axis=0), take(%x, %t, axis=0, mode="clip"));
    let %rest = @fill(add(%t, 1i64), %n, %x, %next);
    add(%rest, %acc)
  } else {
    %acc
  }
}
def @main(%x: Tensor[(?, 3), float32]) -> Tensor[(?, 3), float32] {
  let %n = take(shape_of(%x, dtype="int64"), 0i64);
  @fill(0i64, %n, %x, dyn.zeros(shape_of(%x, dtype="int64"), dtype="float32"))
}
"""

# The initial buffer is a constant (static shapes fold the zeros): never written.
CONSTANT_START = FILL + """
def @main(%x: Tensor[(4, 3), float32]) -> Tensor[(?, 3), float32] {
  @fill(0i64, 4i64, %x, zeros(shape=[4, 3], dtype="float32"))
}
"""

CASES = {"owned": (OWNED, True), "read_after": (READ_AFTER, False), "twice": (TWICE, False),
         "old_read_in_step": (OLD_READ_IN_STEP, False), "constant_start": (CONSTANT_START, False)}


def _lowered_until_manifest_alloc(mod):
    passes = []
    for p in vm_passes():
        if p.name == "ManifestAlloc":
            break
        passes.append(p)
    return Sequential(passes)(mod)


def _loop_writes_in_place(exe) -> bool:
    """Whether the loop ``main`` calls (``@fill``, or its copy specialized to constant arguments) has a
    kernel whose output is one of its inputs."""
    main = next(f for f in exe.functions if f.name == "main")
    (loop,) = {ins.func_index for ins in main.instructions if isinstance(ins, bc.Invoke)}
    return any(isinstance(ins, bc.InvokePacked) and set(ins.outputs) & set(ins.inputs)
               for ins in exe.functions[loop].instructions)


def _x(rows: int) -> np.ndarray:
    return np.arange(rows * 3, dtype="float32").reshape(rows, 3) - 4.5


@pytest.mark.parametrize("case", sorted(CASES))
def test_proven_only_when_the_loop_owns_the_buffer(case):
    text, expected = CASES[case]
    lowered = _lowered_until_manifest_alloc(parse(text))
    called = {node.op.name for node in post_order(lowered["main"].body) if isinstance(node, Call)
              and isinstance(node.op, GlobalVar) and not lowered[node.op].is_primitive}
    proven = in_place_updates(lowered)
    assert bool(set().union(*(proven.get(GlobalVar(name), ()) for name in called))) is expected


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("target", ["python", "c"])
def test_results_match_the_interpreter(case, target):
    text, in_place = CASES[case]
    mod = parse(text)
    exe = tv.vm.compile(mod, target=target)
    vm = tv.vm.VirtualMachine(exe)
    for rows in ([4] if case == "constant_start" else [0, 1, 5]):
        x = _x(rows)
        expected = interpret(mod, x)
        assert_same(vm.invoke("main", x), expected)
        assert_same(vm.invoke("main", x), expected)  # a second call: no state left from the first
    assert _loop_writes_in_place(exe) is in_place


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_lowered_module_is_valid(case):
    """The lowered-code evaluator (garbage-filled storage, kills enforced, no output aliasing an input
    but for an in-place update) agrees with the interpreter."""
    text, _ = CASES[case]
    mod = parse(text)
    lowered = Sequential(vm_passes())(mod)
    x = _x(4)
    assert_same(LoweredEvaluator(lowered).run("main", x), interpret(mod, x))


def test_a_users_array_given_to_the_loop_is_never_written():
    exe = tv.vm.compile(parse(OWNED), target="c")
    vm = tv.vm.VirtualMachine(exe)
    x, acc = _x(3), np.full((3, 3), 7.0, "float32")
    kept = acc.copy()
    out = vm.invoke("fill", np.array(0, "int64"), np.array(3, "int64"), x, acc)
    np.testing.assert_array_equal(acc, kept)
    np.testing.assert_array_equal(out.numpy(), 2 * x)
    vm.set_input("fill", np.array(0, "int64"), np.array(2, "int64"), x, acc)  # kept inputs are not written either
    vm.invoke_stateful("fill")
    vm.invoke_stateful("fill")
    np.testing.assert_array_equal(acc, kept)
    np.testing.assert_array_equal(vm.get_outputs()[0].numpy()[2], kept[2])


def test_owned_parameters_and_the_file_rules():
    exe = tv.vm.compile(parse(OWNED), target="python")
    names = [f.name for f in exe.functions]
    owned = dict(zip(names, bc.owned_parameters(exe.functions), strict=True))
    assert owned["fill"] == frozenset({3}) and owned["main"] == frozenset()
    exe.verify(from_file=True)
    # main passing its own parameter (the user's array) as the owned argument: main would own it too
    main = next(f for f in exe.functions if f.name == "main")
    call = next(i for i, ins in enumerate(main.instructions) if isinstance(ins, bc.Invoke))
    ins = main.instructions[call]
    tampered = list(main.instructions)
    tampered[call] = bc.Invoke(ins.func_index, ins.args[:3] + (ins.args[2],), ins.dst)
    with pytest.raises(FormatError, match="passed once"):
        bc.verify_owned_arguments([f if f is not main else _with_code(main, tampered) for f in exe.functions])


def _with_code(fn, instructions):
    import dataclasses

    return dataclasses.replace(fn, instructions=tuple(instructions))
